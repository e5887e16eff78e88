/* metrics: the drafter's training metrics writer. One record per optimizer step goes to
 *   (a) <dir>/metrics.jsonl, one JSON object per line (cJSON), appended across restarts;
 *   (b) <dir>/events.out.tfevents.<unix time>.<host>, a TensorBoard event file: TFRecord frames
 *       (u64 length, masked CRC32C of the length, a packed tensorboard.Event, masked CRC32C of
 *       the data) whose first record carries file_version "brain.Event:2"
 *       (proto/tensorboard.proto);
 *   (c) a one-line progress line on a terminal (step, loss, acc, tau, lr, tok/s, ETA), rewritten
 *       in place with '\r' on a tty, one plain line every few seconds otherwise.
 *
 * Cost model (why it may sit next to a GPU hot loop): metrics arrive as plain host numbers, the
 * caller has already copied them off the device asynchronously (DESIGN.md section 6: read a step
 * later). A record is formatted into a buffer per file (record_file.h) on the calling thread,
 * written when it passes 64 KiB, at most once per flush interval (default 1 s) or when
 * metrics_flush() is called (dflash-drafter: whenever it waits for a batch) so a stalled run's
 * last records reach the disk. A full disk never leaves a record cut in two: the records wait
 * in memory (up to 16 MiB a file) and are written once it takes them again.
 * The only fsync is metrics_sync's (dflash-drafter: before each checkpoint, so that the records
 * of every checkpointed step outlive what the checkpoint outlives). A record costs a few
 * microseconds; nothing here waits on the device.
 *
 * A metrics writer is owned by one thread (the drafter's training loop); it is not thread-safe.
 * Tags in the event file: train/loss, train/accuracy, train/acceptance_length, train/lr,
 * train/grad_norm, perf/tokens_per_s, perf/samples_per_s, train/pos_acc/NN (block offset NN),
 * and each extra scalar under its own name. See docs/metrics.md.
 */
#ifndef DFLASH_METRICS_H
#define DFLASH_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct metrics metrics;

/* A free-form named scalar, e.g. {"train/loss_unweighted", 3.2}. The name is borrowed. */
typedef struct metrics_scalar {
    const char *name;
    double value;
} metrics_scalar;

/* One optimizer step. Arrays are borrowed for the duration of the call. Non-finite values are
 * written as null in JSON and as NaN/inf in the event file. */
typedef struct metrics_step {
    int64_t step;
    double loss;              /* the weighted training loss that was minimised */
    double accuracy;          /* top-1 accuracy over all predicted block positions */
    const double *pos_acc;    /* [n_pos] accuracy per block offset (offset 0 = the anchor) */
    int n_pos;                /* block size, 0 when not measured */
    int pos_first;            /* first offset reported (1 leaves out the anchor, which is given,
                                 not predicted); earlier entries are null in JSON, absent in TB */
    double acceptance_length; /* tau of the training blocks (mean leading run + 1) */
    double lr;
    double grad_norm; /* before clipping */
    double tokens_per_s;
    double samples_per_s;
    const metrics_scalar *extra; /* [n_extra] further scalars */
    int n_extra;
} metrics_step;

typedef struct metrics_opts {
    const char *dir;           /* output directory, created when missing; NULL: no files */
    bool jsonl;                /* write metrics.jsonl */
    bool tensorboard;          /* write the event file */
    bool progress;             /* print the progress line */
    FILE *progress_out;        /* NULL: stderr */
    int64_t total_steps;       /* for the progress fraction and ETA; 0 = unknown */
    double flush_interval_s;   /* 0: flush every record; < 0: default 1 s */
    double progress_interval_s; /* <= 0: 0.2 s on a tty, 10 s otherwise */
} metrics_opts;

/* Defaults: no dir, all three outputs on, stderr, 1 s flush, automatic progress interval. */
metrics_opts metrics_opts_default(void);

/* Creates dir (with parents) and opens the enabled files. Returns the writer, or NULL after
 * logging why (unwritable directory, out of memory). Call from the owning thread. */
metrics *metrics_new(const metrics_opts *opts);

/* Writes one step record to every enabled output. Returns 0, DFLASH_EINVAL (NULL record or
 * n_pos/n_extra negative) or DFLASH_EIO (a write failed; the writer stays usable and the error
 * is logged once). Cheap: buffered, see the header comment. */
int metrics_write(metrics *m, const metrics_step *s);

/* Writes a lone scalar at a step (e.g. an evaluation's tau) to the JSONL and event files as
 * {"step":..., "<name>": value}. Returns 0, DFLASH_EINVAL or DFLASH_EIO. */
int metrics_write_scalar(metrics *m, int64_t step, const char *name, double value);

/* Pushes buffered records to the kernel (no fsync). Returns 0 or DFLASH_EIO. */
int metrics_flush(metrics *m);
/* metrics_flush, then fsync of both files: every record written so far survives a crash of the
 * process or of the machine. For the moment before a checkpoint is published (a resumed run
 * then finds the records of every step its checkpoint holds). Returns 0 or DFLASH_EIO. */
int metrics_sync(metrics *m);

/* Paths of the files being written; NULL when that output is off. Borrowed. */
const char *metrics_jsonl_path(const metrics *m);
const char *metrics_event_path(const metrics *m);

/* Flushes, ends the progress line, closes the files, frees, sets *m to NULL. Accepts NULL. */
void metrics_destroy(metrics **m);

/* The TFRecord mask of a crc32c (crc.h): ((crc >> 15) | (crc << 17)) + 0xa282ead8. */
uint32_t metrics_crc_mask(uint32_t crc);

#endif
