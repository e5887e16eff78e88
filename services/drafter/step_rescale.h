/* step_rescale: how many slots each rank trains a step when a run resumes with another number of
 * drafters, so that its optimizer step (the batch of the training recipe, which the learning-rate
 * schedule counts in steps) stays the size it was.
 *
 * A checkpoint records the per-rank slots a step (training state "accumulate") and the ranks that
 * took its last step ("world", 1 for a drafter alone; dflash_ckpt.h): its step is T = world x
 * accumulate slots. A resume whose ranks are known before it trains (1 alone, --group-size N in a
 * --group) trains T / N slots on each, when N divides T; otherwise it is refused, naming the
 * group sizes that divide T and the alternative (a new run from the weights). A --group without
 * --group-size does not know its size before it forms: each rank keeps the checkpoint's per-rank
 * value, and the step's slots follow the group's size (a warning says so). A checkpoint written
 * before the record has no world: its per-rank value is kept, as it always was. A group step
 * holds at most WIRE_MAX_WORLD slots (ranks x accumulate).
 * Pure: no I/O, no logging (the caller logs the line it gets). Caller: the trainer's resume.
 */
#ifndef DFLASH_DRAFTER_STEP_RESCALE_H
#define DFLASH_DRAFTER_STEP_RESCALE_H

#include <stdbool.h>
#include <stddef.h>

typedef enum step_rescale_kind {
    STEP_RESCALE_KEEP,   /* the checkpoint's per-rank value: the same ranks, or a checkpoint
                            without its world (written before the record); no line */
    STEP_RESCALE_ADAPT,  /* the step's T slots shared by other ranks: an info line */
    STEP_RESCALE_FOLLOW, /* a group of unknown size: per-rank value kept, a warning */
} step_rescale_kind;

typedef struct step_rescale {
    step_rescale_kind kind;
    int accumulate; /* slots each rank trains a step from now on (>= 1) */
    int world;      /* ranks expected to take the steps: the new ones when known, else the
                       checkpoint's (0: unknown) */
} step_rescale;

/* The resume of checkpoint dir (named in the lines) whose last step ckpt_world ranks took (0:
 * not recorded) with ckpt_accumulate slots each (>= 1), by new_world ranks (1 alone, the
 * --group-size of a group; 0: a group of unknown size); group: the resume joins a --group.
 * 0 with *out set and the line to log in msg ("" for KEEP), or DFLASH_ECONFIG with the refusal
 * (what the step holds, why it cannot be, what to do) in msg. */
int step_rescale_decide(const char *dir, int ckpt_world, int ckpt_accumulate, int new_world,
                        bool group, step_rescale *out, char *msg, size_t len);

#endif
