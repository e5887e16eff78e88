/* trainer: the training consumer of dflash-drafter (worker_loop.h) and the offline evaluation of
 * its checkpoints (`dflash-drafter eval`).
 *
 * Start-up (trainer_new):
 *   1. the target's config.json (hf_config) and its frozen embed_tokens / lm_head. They come from
 *      target_model_load with one captured layer (layer 0): the cheapest correct way that reuses
 *      the checked loader (every dtype, sharded files, tied embeddings), at the price of one
 *      decoder layer of memory;
 *   2. the drafter config (dflash_config_default): draft layers, block size, mask token id
 *      (default vocab_size - 1: a random or test target has no tokenizer to say which rows are
 *      unused; real Qwen3 checkpoints have spare rows past the tokenizer, e.g. 151669, give it
 *      with --mask-token-id), target_layer_ids = the ids the target captures (--capture-layers,
 *      or DFlash's rule for the slot's n_layers features, as dflash-target computes them). The
 *      count must equal the slot layout's n_layers and the ids must fit the target
 *      (dflash_config_check_target): a mismatch is refused naming both values;
 *   3. the model, planned once for the slot's token budget and min(anchors * max_seqs, budget)
 *      blocks;
 *   4. exact resume from the newest checkpoint under --checkpoint-dir (or --resume DIR), else a
 *      weights-only warm start (--init-weights DIR), else fresh weights from the init seed.
 *      A run restarted with the same flags therefore resumes. An exact resume keeps the
 *      checkpoint's step of world x accumulate slots: with another number of drafters (alone,
 *      or --group-size N) each trains that total / N (step_rescale.h), else it is refused;
 *      the checkpoints record the drafters that took the last step (tc.world).
 * layout(): the slot layout with the target layer ids the model reads; the loop gives a slot
 *   written for another layout back unread before consume() (worker_session_check_layout).
 * consume(): views the staged slot (dflash_view_from_slot; a cuda slot's small arrays are read
 *   to the host first), runs dflash_train_step with the batch identity (epoch, bucket, index) as
 *   the anchor seed, writes a metrics record (metrics.h: JSONL, TensorBoard, progress line) and
 *   reports the optimizer step that includes the batch: with --accumulate N (tc.accumulate) a
 *   step trains N slots, and a batch of a step still open reports the step to come (no
 *   checkpoint holds it before that step is taken). unacked(), finish() and save_refused() close
 *   an open step first with the batches it has (the run's end), so that the final checkpoint
 *   holds every batch acked. Every checkpoint_every steps, once
 *   the loop has that step's batch acked (settled()), it saves a checkpoint (dflash_ckpt_save:
 *   temporary name + rename, last K kept); committed() then returns that step and the loop
 *   tells the broker. finish() saves the final checkpoint; when the run ends before its step
 *   limit (--max-steps or the schedule's end) for another reason than a stop signal (the broker
 *   has no batch left: every batch of the target's planned epochs is trained, or a drain;
 *   --max-batches; an error), it
 *   says so at WARN: the step reached of the limit, the learning rate still in force, and how
 *   to continue.
 *   save_refused() (the broker refused to take us back: exit 4 or 6) saves the final checkpoint
 *   too, reported to no broker; the loop does not call it when a live process of our run
 *   replaced us (worker_session_save_refused).
 *   A run that ends having trained no step while every batch it got was skipped (no weighted
 *   position: the data's loss masks) says so, and finish() returns DFLASH_ENODATA (exit 8).
 * Divergence: the first step whose loss or gradient norm is NaN or infinite stops the run (an
 *   error naming the step and what to do): from then on consume(), settled() and finish()
 *   return DFLASH_ENONFINITE (exit 7), so no checkpoint is written after the last finite step
 *   and no commit is reported for the batches trained since. A checkpoint reads the queued
 *   steps' metrics before writing (on cuda they come back a step late).
 *   idle() (the loop waits for a batch) writes the last step's metrics and flushes them.
 *   resume_step() is the step the model started from: the loop tells the broker (resume_from)
 *   before the first claim, so batches trained after the last checkpoint are trained again.
 *   unacked() hands over the trained batches whose acks no broker took (a stop while none
 *   answers): the checkpoint that follows records them, and resumed_unacked() gives those of
 *   the checkpoint resumed from, which the loop acks at their steps (no batch trained twice).
 * In a data-parallel group (group_worker.h, the consumer's group hooks) consume() runs
 *   dflash_train_step_dp with the group's communicator instead (synchronous; the gradients are
 *   averaged over the ranks), sync_state() copies rank 0's state, and only rank 0 writes
 *   checkpoints.
 * Checkpoints are written synchronously on the loop's thread (seconds for small drafters; the
 * loop's heartbeat thread keeps the broker from expiring us meanwhile).
 * Threads: the daemon's main thread only.
 */
#ifndef DFLASH_TRAINER_H
#define DFLASH_TRAINER_H

#include "dflash_train.h"
#include "worker_loop.h"

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct trainer_opts {
    const char *model_dir; /* target checkpoint (config.json + safetensors) */
    pool_backend backend;  /* host: cpu ops; cuda: cuda ops on device */
    int device;
    int threads;               /* cpu backend threads (0: all) */
    const slot_layout *layout; /* what the target's slots hold */
    int draft_layers;          /* drafter decoder layers */
    int block_size;
    int mask_token_id;      /* < 0: vocab_size - 1 */
    const int *capture_ids; /* the target's captured layer ids; NULL: DFlash's rule */
    int n_capture_ids;
    dflash_train_cfg train;     /* anchors, lr, schedule, clip, AdamW, anchor seed */
    uint64_t init_seed;         /* fresh weights */
    int tune_matmuls;           /* cuda: candidates timed per matmul shape at start-up (0: none) */
    const char *checkpoint_dir; /* ROOT of step-* checkpoints; NULL/"" = none */
    int64_t checkpoint_every;   /* steps; 0 = only the final one */
    int keep_last;
    const char *resume;       /* explicit checkpoint to resume from; NULL/"" = latest in root */
    const char *init_weights; /* warm start; NULL/"" = none */
    const char *metrics_dir;  /* NULL/"" = no files */
    bool progress;            /* progress line on stderr */
    bool group;               /* the daemon joins a data-parallel group (--group) */
    int group_size;           /* its --group-size (0: not known before the group forms): a
                               * resume keeps the checkpoint's step of world x accumulate slots
                               * over these ranks, or is refused (step_rescale.h) */
    int64_t max_steps;        /* stop at this optimizer step; 0 = at the schedule's end
                                 (train.total_steps, or the resumed checkpoint's), with no
                                 schedule until drained */
    const volatile sig_atomic_t *stop; /* the daemon's stop flag (NULL: none): finish() tells a
                                          stop signal from the broker running out of batches */
} trainer_opts;

/* Builds the training consumer (see top). NULL with the reason in err: unreadable target,
 * drafter/target mismatch (both values named), bad checkpoint, a fresh run's schedule that
 * trainer_schedule_check refuses, out of memory. */
worker_consumer *trainer_new(const trainer_opts *o, char *err, size_t errlen);

/* A schedule the run can finish and resume: a --max-steps past a --total-steps above 0 would
 * train its last steps at the floor learning rate, and the resume of such a run is refused, so
 * it must not start either (dflash-drafter's check of its options; trainer_new for a fresh
 * run). tc: lr, min_lr_ratio, total_steps; total_src and max_src say where the two values came
 * from ("--total-steps 10", config_source). 0 or DFLASH_ECONFIG with the reason in err. */
int trainer_schedule_check(const dflash_train_cfg *tc, int64_t max_steps, const char *total_src,
                           const char *max_src, char *err, size_t errlen);

/* The captured layers' count n_feat (the slot's n_layers) against n_capture_ids ids given by
 * hand (0: none, DFlash's rule applies): equal, and in [1, DFLASH_MAX_FEAT]. capture_src and
 * layers_src say where the values came from (config_source). dflash-drafter's check of its
 * options and trainer_drafter_config. 0, DFLASH_EMISMATCH or DFLASH_ECONFIG with the reason. */
int trainer_features_check(int n_capture_ids, int n_feat, const char *capture_src,
                           const char *layers_src, char *err, size_t errlen);

/* Drafter config for a target (step 2 above), shared by training and `eval --init-only`.
 * n_feat is the slot's n_layers. 0 or DFLASH_ECONFIG / DFLASH_EMISMATCH with the reason. */
int trainer_drafter_config(const char *model_dir, int draft_layers, int block_size,
                           int mask_token_id, int n_feat, const int *capture_ids, int n_capture_ids,
                           dflash_config *out, char *err, size_t errlen);

typedef struct trainer_eval_opts {
    const char *checkpoint; /* step dir, or a root (its newest step-*); NULL/"" = untrained */
    const char *model_dir;  /* the target */
    const char *data;       /* comma-separated shards of held-out greedy continuations */
    int threads;
    int64_t eval_seqs; /* the first N sequences; 0 = all */
    /* the untrained drafter (checkpoint NULL): same meaning as in trainer_opts */
    int draft_layers, block_size, mask_token_id, n_feat;
    const int *capture_ids;
    int n_capture_ids;
    uint64_t init_seed;
    volatile sig_atomic_t *stop; /* the process's stop flag (NULL: none): see trainer_eval */
    double progress_s; /* seconds between progress lines on stderr when it is not a terminal
                          (one is rewritten every 0.2 s); 0: none */
} trainer_eval_opts;

typedef struct trainer_eval_result {
    double tau;             /* mean over responses of each one's mean(a + 1) (dflash.md 4.1,
                               z-lab's benchmark); 0 when no cycle was walked */
    double tau_pooled;      /* mean(a + 1) over all cycles pooled (long responses weigh more) */
    long responses;         /* response spans with at least one cycle */
    long cycles, sequences; /* draft cycles walked; sequences that had at least one */
    long skipped;           /* sequences without a cycle (no loss-masked token before the end) */
    long total;             /* sequences to evaluate (--eval-seqs, or all) */
    int block_size;
    double seconds;
} trainer_eval_result;

/* Offline tau (dflash.md 4.2, trajectory method) of a checkpoint, or of the untrained seeded
 * drafter, on held-out shards: the target runs in-process on the cpu backend over each sequence
 * for the drafter's layer ids, the drafter replays the greedy trajectory of each reply (a
 * maximal span of loss_mask 1, dflash_eval.h). A progress line (sequences and tokens done, the
 * phase of the sequence in hand, tau so far, the ETA by tokens) comes every progress_s, also
 * inside one long sequence: it is asked for after each target layer and each chunk of drafted
 * blocks. 0 or a negative code with the reason in err; DFLASH_EINVAL when no sequence gives a
 * draft cycle (tau is undefined); DFLASH_EMISMATCH for a checkpoint of another target, or a
 * shard made for another vocabulary (shard_check_vocab); DFLASH_ESHUTDOWN once *stop is set
 * (the load, a layer or a chunk of blocks ends first): out then holds what the sequences done
 * before it gave (sequences + skipped of total; cycles 0 when none), which is partial. */
int trainer_eval(const trainer_eval_opts *o, trainer_eval_result *out, char *err, size_t errlen);

#endif
