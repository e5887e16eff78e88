/* test_step_rescale: the slots each drafter trains a step when a run resumes with another number
 * of drafters (step_rescale.h).
 *
 * What a user would notice if it broke:
 *   - `scripts/train --drafters 2 --accumulate 32` resumed with --drafters 1 trained 16 slots a
 *     step, and a solo run of 32 resumed with --drafters 2 trained 64: the batch of a step (and
 *     with it the recipe, whose schedule counts steps) changed without a word. The step now
 *     keeps its slots (an info line says so);
 *   - a step the new drafters cannot share evenly (4 slots over 3) started silently with another
 *     step; then (for a day) it was refused, which left a group that lost a GPU no way back but
 *     a new run from its weights (its moments and schedule lost): it becomes the nearest step
 *     they can share, with a warning naming both sizes and the numbers of drafters that keep it;
 *   - a group step past 64 slots started and was refused later by the broker: the share is
 *     capped at 64 / ranks, said;
 *   - a checkpoint that does not record its drafters (written before the record) changed
 *     behaviour: it keeps its per-rank value, as before, with a warning in a group (its step may
 *     have been another);
 *   - a group of unknown size (no --group-size) changed the step silently: it warns.
 */
#include "check.h"
#include "err.h"
#include "step_rescale.h"

#include <string.h>

static step_rescale decide(int ckpt_world, int ckpt_acc, int new_world, bool group, char *msg,
                           size_t len) {
    step_rescale r = {.accumulate = -1, .world = -1};
    step_rescale_decide("/ck/step-9", ckpt_world, ckpt_acc, new_world, group, &r, msg, len);
    return r;
}

int main(void) {
    char m[3072];

    /* a group of 2 x 16 resumed alone: one drafter trains the 32 */
    step_rescale r = decide(2, 16, 1, false, m, sizeof m);
    CHECK_EQ_INT(r.kind, STEP_RESCALE_ADAPT);
    CHECK_EQ_INT(r.accumulate, 32);
    CHECK_EQ_INT(r.world, 1);
    CHECK(strstr(m, "/ck/step-9") && strstr(m, "stays 32 slots, now 1 drafter x 32"));

    /* a solo run of 32 resumed by a group of 2 (and of 4): 16 (8) each */
    r = decide(1, 32, 2, true, m, sizeof m);
    CHECK(r.kind == STEP_RESCALE_ADAPT && r.accumulate == 16 && r.world == 2);
    CHECK(strstr(m, "stays 32 slots, now 2 drafters x 16"));
    r = decide(2, 16, 4, true, m, sizeof m);
    CHECK(r.kind == STEP_RESCALE_ADAPT && r.accumulate == 8 && r.world == 4);

    /* the same drafters: the checkpoint's value, nothing said */
    r = decide(2, 2, 2, true, m, sizeof m);
    CHECK(r.kind == STEP_RESCALE_KEEP && r.accumulate == 2 && r.world == 2 && m[0] == 0);
    r = decide(1, 7, 1, false, m, sizeof m);
    CHECK(r.kind == STEP_RESCALE_KEEP && r.accumulate == 7 && r.world == 1 && m[0] == 0);

    /* 4 slots over 3 drafters: the nearest share, 1 each (3 a step), said with the sizes that
     * keep 4 and the new run from the weights */
    r = decide(2, 2, 3, true, m, sizeof m);
    CHECK(r.kind == STEP_RESCALE_CHANGE && r.accumulate == 1 && r.world == 3);
    CHECK(strstr(m, "resuming /ck/step-9 with 3 drafters: its step of 4 slots (2 drafters x 2) "
                    "becomes 3 slots, 1 a drafter") &&
          strstr(m, "3 drafters cannot share it evenly; with 1, 2 or 4 drafters it would stay 4") &&
          strstr(m, "--init-weights /ck/step-9 and another --checkpoint-dir"));
    /* a group of 3 x 1 that lost a GPU (its checkpoints record 3): 2 each on the 2 left;
     * 12 over 5: 2 each, naming the six sizes that keep 12; one slot over 2: 1 each */
    r = decide(3, 1, 2, true, m, sizeof m);
    CHECK(r.kind == STEP_RESCALE_CHANGE && r.accumulate == 2 && strstr(m, "becomes 4 slots"));
    r = decide(3, 4, 5, true, m, sizeof m);
    CHECK(r.accumulate == 2 && strstr(m, "with 1, 2, 3, 4, 6 or 12 drafters it would stay 12"));
    r = decide(1, 1, 2, true, m, sizeof m);
    CHECK(r.kind == STEP_RESCALE_CHANGE && r.accumulate == 1 && strstr(m, "with 1 drafter it"));
    /* one slot over 3: the nearest share rounds to 0, and a drafter trains at least 1 */
    r = decide(1, 1, 3, true, m, sizeof m);
    CHECK(r.kind == STEP_RESCALE_CHANGE && r.accumulate == 1 && strstr(m, "becomes 3 slots"));
    /* 63 over 2: 32 each, a step of exactly 64 (the cap allows it): the reason said is the
     * uneven share, not the cap */
    r = decide(1, 63, 2, true, m, sizeof m);
    CHECK(r.kind == STEP_RESCALE_CHANGE && r.accumulate == 32 && strstr(m, "becomes 64 slots") &&
          strstr(m, "2 drafters cannot share it evenly") && !strstr(m, "at most 64"));

    /* a group step holds at most 64 slots: a solo run of 128 goes to a group of 2 at 32 each
     * (said: alone it keeps 128), one of 64 to 8 drafters at 8 each */
    r = decide(1, 128, 2, true, m, sizeof m);
    CHECK(r.kind == STEP_RESCALE_CHANGE && r.accumulate == 32);
    CHECK(strstr(m, "its step of 128 slots (1 drafter x 128) becomes 64 slots, 32 a drafter") &&
          strstr(m, "at most 64") && strstr(m, "alone it would stay 128"));
    r = decide(1, 64, 8, true, m, sizeof m);
    CHECK(r.kind == STEP_RESCALE_ADAPT && r.accumulate == 8);
    /* --group-size 1: a group still, 64 at most; alone, 100 */
    r = decide(1, 100, 1, true, m, sizeof m);
    CHECK(r.kind == STEP_RESCALE_CHANGE && r.accumulate == 64);
    r = decide(1, 100, 1, false, m, sizeof m);
    CHECK(r.kind == STEP_RESCALE_KEEP && r.accumulate == 100);
    /* alone, at most --accumulate's 4096 */
    r = decide(64, 4096, 1, false, m, sizeof m);
    CHECK(r.kind == STEP_RESCALE_CHANGE && r.accumulate == 4096 && strstr(m, "at most 4096"));

    /* a checkpoint written before the record: its per-rank value, as before; alone nothing
     * said, in a group a warning (within the group's cap) */
    r = decide(0, 16, 1, false, m, sizeof m);
    CHECK(r.kind == STEP_RESCALE_KEEP && r.accumulate == 16 && r.world == 1 && m[0] == 0);
    r = decide(0, 16, 2, true, m, sizeof m);
    CHECK(r.kind == STEP_RESCALE_CHANGE && r.accumulate == 16 && r.world == 2);
    CHECK(strstr(m, "does not record how many drafters") && strstr(m, "a step is 32 slots"));
    r = decide(0, 40, 2, true, m, sizeof m);
    CHECK(r.accumulate == 32 && strstr(m, "not its 40: a group step holds at most 64"));

    /* a group without --group-size: per-rank value kept (within the cap), a warning naming the
     * size to give */
    r = decide(2, 8, 0, true, m, sizeof m);
    CHECK(r.kind == STEP_RESCALE_CHANGE && r.accumulate == 8 && r.world == 2);
    CHECK(strstr(m, "without --group-size") && strstr(m, "follows the group's size") &&
          strstr(m, "16 slots (2 drafters x 8)") && strstr(m, "--group-size 2"));
    r = decide(0, 8, 0, true, m, sizeof m);
    CHECK(r.kind == STEP_RESCALE_CHANGE && r.accumulate == 8 && r.world == 0);
    CHECK(strstr(m, "does not record") && strstr(m, "that times the group's size"));
    r = decide(1, 65, 0, true, m, sizeof m);
    CHECK(r.accumulate == 64 && strstr(m, "not its 65"));
    CHECK_DONE();
}
