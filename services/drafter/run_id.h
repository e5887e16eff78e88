/* run_id: the identity of a training run, which the drafter gives the broker with its resume
 * (ResumeFrom.run_id) so the broker tells a restart of the run (it replaces its predecessor at
 * once) from another run (refused: one broker serves one model; docs/protocol.md).
 *
 * A run is its checkpoint root: the id is a random non-zero 64-bit number kept in ROOT/run-id
 * (16 hex digits and a newline), written atomically at the first start with that
 * --checkpoint-dir and read at every later one, so a restarted process (a container's new pid,
 * the same volume) is the same run. A --resume or --init-weights from another directory into a
 * new root is a new run. Without a checkpoint root the id is the process's own (a restart starts
 * over anyway). The caller holds the root's lock (dflash_ckpt_lock_root): nobody else writes it.
 * Thread: the caller's (start-up).
 */
#ifndef DFLASH_DRAFTER_RUN_ID_H
#define DFLASH_DRAFTER_RUN_ID_H

#include <stddef.h>
#include <stdint.h>

/* The run id of checkpoint root `root` into *id: read from ROOT/run-id, created there when
 * missing. 0, DFLASH_EFORMAT when the file is not an id (err says to remove it: the run then
 * gets a new one), or DFLASH_EIO (err names the file and why). */
int run_id_load_or_create(const char *root, uint64_t *id, char *err, size_t errlen);

#endif
