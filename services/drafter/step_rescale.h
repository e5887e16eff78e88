/* step_rescale: how many slots each rank trains a step when a run resumes with another number of
 * drafters, so that its optimizer step (the batch of the training recipe, which the learning-rate
 * schedule counts in steps) stays the size it was, or says how and why it changes.
 *
 * A checkpoint records the per-rank slots a step (training state "accumulate") and the drafters a
 * step is for ("world": a group's --group-size, else the ranks of its last step, 1 alone;
 * dflash_ckpt.h): its step is T = world x accumulate slots. A resume whose ranks are known before
 * it trains (1 alone, --group-size N in a --group) trains T / N slots on each when N divides T
 * (an info line). Otherwise the step changes, with a warning that says from what to what and why:
 * T / N rounded to the nearest whole number (at least 1) when N does not divide T, naming the
 * numbers of drafters that would keep it; at most 64 / N in a group (a group step holds at most
 * WIRE_MAX_WORLD slots); at most 4096 (the flag's range). Rescaling never stops a run: its
 * weights, moments and schedule go on. A --group without --group-size does not know its size
 * before it forms: each rank keeps the checkpoint's per-rank value and the step's slots follow
 * the group's size (a warning). A checkpoint written before the record has no world: its
 * per-rank value is kept, as it always was, with a warning when more than one drafter resumes it
 * (its step may have been another).
 * Pure: no I/O, no logging (the caller logs the line it gets). Callers: the trainer's resume,
 * `dflash-drafter show --drafters` (show.h), which the launchers ask.
 */
#ifndef DFLASH_DRAFTER_STEP_RESCALE_H
#define DFLASH_DRAFTER_STEP_RESCALE_H

#include <stdbool.h>
#include <stddef.h>

typedef enum step_rescale_kind {
    STEP_RESCALE_KEEP,   /* the checkpoint's per-rank value, the step unchanged (the same ranks,
                            or one drafter resuming a checkpoint without its world); no line */
    STEP_RESCALE_ADAPT,  /* the step's T slots shared evenly by other ranks: an info line */
    STEP_RESCALE_CHANGE, /* the step changes or may change (uneven share, the group cap, an
                            unknown size or world): a warning */
} step_rescale_kind;

typedef struct step_rescale {
    step_rescale_kind kind;
    int accumulate; /* slots each rank trains a step from now on (1 .. 4096) */
    int world;      /* ranks expected to take the steps: the new ones when known, else the
                       checkpoint's (0: unknown) */
} step_rescale;

/* The resume of checkpoint dir (named in the line) whose steps are for ckpt_world ranks (0: not
 * recorded) with ckpt_accumulate slots each (>= 1), by new_world ranks (1 alone, the --group-size
 * of a group, 1 .. WIRE_MAX_WORLD; 0: a group of unknown size); group: the resume joins a
 * --group. Fills *out and the line to log into msg ("" for KEEP). */
void step_rescale_decide(const char *dir, int ckpt_world, int ckpt_accumulate, int new_world,
                         bool group, step_rescale *out, char *msg, size_t len);

#endif
