/* dflash_ckpt: drafter checkpoints that SGLang and vLLM load as a DFlash drafter, with the
 * training state beside them (reference/dflash.md section 2).
 *
 * A checkpoint is a directory ROOT/step-NNNNNNNNN holding
 *   config.json               dflash.md 2.1: architectures ["DFlashDraftModel"], model_type qwen3,
 *                             block_size, num_target_layers, dflash_config {mask_token_id,
 *                             target_layer_ids}, the Qwen3 fields with this drafter's values
 *   dflash.py                 the drafter as a transformers model (nn/dflash_hf.py), which
 *                             config.json's auto_map names: AutoModel.from_pretrained(DIR,
 *                             trust_remote_code=True) loads the checkpoint
 *   model.safetensors         the trainable tensors under the names of 2.2 (no "model." prefix),
 *                             bf16 by default (fp32 on request); no embed_tokens / lm_head
 *   model.safetensors.index.json  the Hugging Face index: weight_map maps every tensor of
 *                             model.safetensors to it, metadata.total_size their data bytes.
 *                             vLLM and SGLang glob *.safetensors and, when an index is there,
 *                             keep only the files it names: without it they would read the
 *                             training state too (vLLM then fails on the master.* names). Our
 *                             loaders open model.safetensors by name and do not need it: a
 *                             checkpoint written before it existed loads as before
 *   training_state.safetensors  fp32 master weights ("master.NAME"), AdamW moments ("exp_avg.NAME",
 *                             "exp_avg_sq.NAME") and, in its metadata, the step, the anchor seed
 *                             and every schedule / optimizer setting ("format":
 *                             "dflash-training-state-1"), among them "accumulate" (the slots each
 *                             drafter trained a step) and "world" (how many drafters a step is
 *                             for: a group's --group-size, else the ranks that took the last
 *                             step, 1 alone; absent in a
 *                             checkpoint written before it: unknown, tc->world 0; the step is
 *                             world x accumulate slots); and "unacked_batches" when the model
 *                             holds trained batches whose acks the broker has not taken (a stop
 *                             while no broker answered): "E/B/I@S,..." (epoch, bucket, index, the
 *                             step that trained it), which the drafter resumed from the checkpoint
 *                             acks. Absent: none (also every checkpoint written before it existed)
 * Both safetensors files carry, in their __metadata__, the marker "dflash.checksums": "crc32c"
 * and "crc32c.NAME": 8 lowercase hex digits, the CRC-32C of tensor NAME's data bytes, for every
 * tensor (safetensors.h; docs/formats.md); other
 * loaders ignore these strings. dflash_ckpt_load_weights checks every tensor of model.safetensors
 * and dflash_ckpt_resume every tensor of training_state.safetensors before using any: a mismatch
 * is DFLASH_ECORRUPT naming the file and the tensor. dflash_ckpt_resume checks model.safetensors
 * too, which it does not load, and writes a missing or damaged one again from the masters
 * (and its index with it).
 * Checkpoints written before the checksums load unverified (an info line says so).
 * dflash_ckpt_train_settings reads only metadata. Failure kinds: a file that cannot be read is
 * DFLASH_EIO (DFLASH_ENOTFOUND when missing), never DFLASH_EFORMAT / DFLASH_ECORRUPT, which mean
 * its bytes are wrong (safetensors_open).
 * It is written into ROOT/.tmp-step-N-PID, every file fsync'd, then renamed to its final name and
 * ROOT fsync'd: a reader sees a complete checkpoint or none. Afterwards only the newest
 * keep_last step-* directories holding a training state are kept (and none older). A root has one writer (dflash_ckpt_lock_root).
 *
 * Two ways back, kept separate:
 *   dflash_ckpt_resume       exact resume: master weights, moments, step, seed and schedule, so
 *                            the next step is the one the uninterrupted run would have taken;
 *   dflash_ckpt_load_weights warm start: weights only (from model.safetensors, any float dtype);
 *                            moments zero, step 0, the caller's schedule.
 * Threads: the model's thread (it reads and writes the model's backend memory). Blocking file
 * I/O: the drafter daemon calls these from its checkpoint worker, not its loop.
 */
#ifndef DFLASH_NN_DFLASH_CKPT_H
#define DFLASH_NN_DFLASH_CKPT_H

#include "dflash_model.h"
#include "dflash_train.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A batch the checkpoint's model has trained whose ack the broker may not have taken: its
 * identity and the optimizer step that trained it (1 .. the checkpoint's step). */
typedef struct dflash_ckpt_unacked {
    uint32_t epoch, bucket;
    uint64_t index;
    long step;
} dflash_ckpt_unacked;

#define DFLASH_CKPT_MAX_UNACKED 64 /* a data-parallel group step's batches: ranks x micro-steps */

typedef struct dflash_ckpt_opts {
    int keep_last;    /* step-* directories kept under root (>= 1; 0 means 3) */
    bool weights_f32; /* model.safetensors in fp32 instead of bf16 */
    /* trained batches whose acks the broker has not taken (NULL, 0: none; at most
     * DFLASH_CKPT_MAX_UNACKED): recorded as the training state's "unacked_batches" */
    const dflash_ckpt_unacked *unacked;
    int n_unacked;
} dflash_ckpt_opts;

/* About how many bytes one checkpoint of m takes on disk: the weights (bf16, or fp32 with
 * weights_f32) and the training state's fp32 masters and Adam moments (the small files are
 * not counted). */
uint64_t dflash_ckpt_bytes(const dflash_model *m, bool weights_f32);

/* When err, a dflash_ckpt_save message, says the disk or quota is full (the system's text for
 * ENOSPC or EDQUOT in it): writes into out (len bytes) what a save needs and what to do, e.g.
 * "a save needs room for --keep-last + 1 = 4 checkpoints (0.7 MiB each: the new one is written
 * before the oldest is removed): free space, or lower --keep-last", and returns true; else
 * false and out is untouched. keep_last as dflash_ckpt_opts (0 means 3). */
bool dflash_ckpt_space_hint(const char *err, int keep_last, uint64_t ckpt_bytes, char *out,
                            size_t len);

/* Makes sure checkpoints can be written under root before any training: creates root when
 * missing (not its parents) and writes and removes a probe file in it. 0, or DFLASH_EIO with
 * the path and the system's reason in err (a missing parent, not a directory, read-only,
 * permission denied). */
int dflash_ckpt_check_root(const char *root, char *err, size_t errlen);

/* Makes this process the only writer of root: an exclusive flock on root/.lock (created when
 * missing; the kernel drops it when the process dies, SIGKILL included), our pid written in it.
 * Two drafters saving into one root would replace each other's step-N and delete each other's
 * through the retention. *fd receives the lock's descriptor (close it to let go). 0,
 * DFLASH_EEXISTS when another live process holds it (its pid named in err), or DFLASH_EIO. */
int dflash_ckpt_lock_root(const char *root, int *fd, char *err, size_t errlen);

/* Writes ROOT/step-<m->step> (see top), opts->unacked recorded in it. path (may be NULL)
 * receives the final directory. Returns 0 or a negative code with a message in err
 * (DFLASH_EINVAL: more than DFLASH_CKPT_MAX_UNACKED unacked batches, or one whose step is not
 * in 1 .. m->step). */
int dflash_ckpt_save(const dflash_model *m, const dflash_train_cfg *tc, const char *root,
                     const dflash_ckpt_opts *opts, char *path, size_t pathlen, char *err,
                     size_t errlen);

/* Reads DIR/config.json into *c. Returns 0, DFLASH_ENOTFOUND / DFLASH_EIO, DFLASH_EFORMAT (bad
 * JSON or a missing field) or DFLASH_ECONFIG, with file and field named in err. */
int dflash_ckpt_load_config(const char *dir, dflash_config *c, char *err, size_t errlen);

/* Checks that the checkpoint's config equals the model's: any architectural difference, or
 * another rope_theta or rms_norm_eps (taken from the target), is DFLASH_EMISMATCH naming the
 * field and both values. */
int dflash_ckpt_check_config(const dflash_config *model, const dflash_config *ckpt, char *err,
                             size_t errlen);

/* Warm start from DIR/model.safetensors: weights only; moments zeroed, m->step = 0. Every
 * tensor's checksum is checked first: DFLASH_ECORRUPT naming the file and the tensor;
 * DFLASH_EFORMAT for a damaged header, DFLASH_ENOTFOUND / DFLASH_EIO for a file missing or
 * unreadable (the system's reason in err); DFLASH_ENONFINITE naming a tensor that holds a NaN
 * or an infinity. */
int dflash_ckpt_load_weights(dflash_model *m, const char *dir, char *err, size_t errlen);

/* Exact resume from DIR: fp32 masters, moments, m->step, and tc's seed, schedule and optimizer
 * settings (tc may be NULL to keep the caller's). Every tensor of training_state.safetensors is
 * checked against its checksum first: DFLASH_ECORRUPT naming the file and the tensor
 * (DFLASH_EFORMAT: a damaged header; DFLASH_EIO: unreadable; DFLASH_ENOTFOUND: missing, which a
 * save never leaves: err says the directory is not a whole checkpoint). Then model.safetensors
 * (the exported weights, which the resume does not read): a file missing or damaged is written
 * again from the masters, as the save writes it (its index too), with a warning, when repair
 * is true (DIR is under the caller's locked root: a root has one writer); else it is only
 * warned about (a checkpoint of another run's directory, or a read-only archive, is not ours to
 * write). The index is not checked (a checkpoint written before it has none). One that
 * cannot be read, or is not a regular file, is DFLASH_EIO and left alone; one that cannot be
 * written again refuses the resume (its code, the file named). A tensor holding a NaN or an
 * infinity: DFLASH_ENONFINITE naming it. Nothing reaches the model before all this passed. */
int dflash_ckpt_resume(dflash_model *m, dflash_train_cfg *tc, const char *dir, bool repair,
                       char *err, size_t errlen);

/* The step and the training settings (seed, anchors, schedule, optimizer) of the checkpoint in
 * DIR, from its training state's metadata, without a model: what an exact resume would restore.
 * 0, or a negative code with a message in err (the kinds of dflash_ckpt_resume). */
int dflash_ckpt_train_settings(const char *dir, dflash_train_cfg *tc, long *step, char *err,
                               size_t errlen);

/* The trained batches the checkpoint in DIR records as not acked (opts->unacked of its save),
 * at most max into out, their count in *n: 0 for a checkpoint that records none, or was written
 * before the record existed. 0, or a negative code with a message in err: the kinds of
 * dflash_ckpt_train_settings, and DFLASH_EFORMAT for a malformed record (also more than max
 * batches, or a step outside 1 .. the checkpoint's). Reads only metadata. */
int dflash_ckpt_unacked_batches(const char *dir, dflash_ckpt_unacked *out, int max, int *n,
                                char *err, size_t errlen);

/* The newest complete checkpoint under root into path: the newest step-N holding a training
 * state, or whose training state cannot be looked at (permissions, an I/O error), so that the
 * resume names that failure instead of taking an older one. 0, or DFLASH_ENOTFOUND when none. */
int dflash_ckpt_latest(const char *root, char *path, size_t pathlen);

/* Cleans up after saves whose writer died (SIGKILL, power loss) under root: removes
 * ".tmp-step-*" directories (an unfinished save), and renames a ".old-step-N-*" back to step-N
 * where step-N is missing (the writer stopped between moving the old checkpoint aside and
 * publishing the new one), else removes it, and removes a file writer's NAME.tmp.PID inside a
 * step-N (a resume stopped while writing model.safetensors or its index again). Returns how
 * many it handled. Call at start-up, holding root's lock (dflash_ckpt_lock_root) and before
 * dflash_ckpt_latest: no other live process writes root then, so every leftover is a dead
 * writer's, whatever process now has the PID in its name (after a reboot, or in another
 * container's PID namespace). */
int dflash_ckpt_recover(const char *root);

/* Renames every step-N under root with N > step to superseded-step-N (superseded-step-N.2, ...
 * when taken): the model was just replaced by one at step (a data-parallel group's rank 0's), so
 * those checkpoints belong to a history the model no longer has; left as they are, the next
 * restart would resume from them and the retention, which keeps the newest names, would delete
 * the new ones. Nothing is deleted. Returns how many were moved, or DFLASH_EIO with the name and
 * the system's reason in err. Hold root's lock. */
int dflash_ckpt_set_aside_after(const char *root, long step, char *err, size_t errlen);

#endif
