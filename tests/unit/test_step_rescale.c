/* test_step_rescale: the slots each drafter trains a step when a run resumes with another number
 * of drafters (step_rescale.h).
 *
 * What a user would notice if it broke:
 *   - `scripts/train --drafters 2 --accumulate 32` resumed with --drafters 1 trained 16 slots a
 *     step, and a solo run of 32 resumed with --drafters 2 trained 64: the batch of a step (and
 *     with it the recipe, whose schedule counts steps) changed without a word. The step now
 *     keeps its slots (an info line says so);
 *   - a step the new drafters cannot share evenly (4 slots over 3) started anyway with another
 *     step: it is refused, naming the numbers of drafters that share it and the new run from
 *     its weights;
 *   - a group step past 64 slots started and was refused later by the broker;
 *   - a checkpoint that does not record its drafters (written before the record) changed
 *     behaviour: it keeps its per-rank value, as before;
 *   - a group of unknown size (no --group-size) changed the step silently: it warns.
 */
#include "check.h"
#include "err.h"
#include "step_rescale.h"

#include <string.h>

static step_rescale decide(int ckpt_world, int ckpt_acc, int new_world, bool group, int want_rc,
                           char *msg, size_t len) {
    step_rescale r = {.accumulate = -1, .world = -1};
    CHECK_EQ_INT(
        step_rescale_decide("/ck/step-9", ckpt_world, ckpt_acc, new_world, group, &r, msg, len),
        want_rc);
    return r;
}

int main(void) {
    char m[1400];

    /* a group of 2 x 16 resumed alone: one drafter trains the 32 */
    step_rescale r = decide(2, 16, 1, false, 0, m, sizeof m);
    CHECK_EQ_INT(r.kind, STEP_RESCALE_ADAPT);
    CHECK_EQ_INT(r.accumulate, 32);
    CHECK_EQ_INT(r.world, 1);
    CHECK(strstr(m, "/ck/step-9") && strstr(m, "stays 32 slots, now 1 drafter x 32"));

    /* a solo run of 32 resumed by a group of 2 (and of 4): 16 (8) each */
    r = decide(1, 32, 2, true, 0, m, sizeof m);
    CHECK(r.kind == STEP_RESCALE_ADAPT && r.accumulate == 16 && r.world == 2);
    CHECK(strstr(m, "stays 32 slots, now 2 drafters x 16"));
    r = decide(2, 16, 4, true, 0, m, sizeof m);
    CHECK(r.kind == STEP_RESCALE_ADAPT && r.accumulate == 8 && r.world == 4);

    /* the same drafters: the checkpoint's value, nothing said */
    r = decide(2, 2, 2, true, 0, m, sizeof m);
    CHECK(r.kind == STEP_RESCALE_KEEP && r.accumulate == 2 && r.world == 2 && m[0] == 0);
    r = decide(1, 7, 1, false, 0, m, sizeof m);
    CHECK(r.kind == STEP_RESCALE_KEEP && r.accumulate == 7 && r.world == 1 && m[0] == 0);

    /* 4 slots over 3 drafters: refused, naming 1, 2 or 4 and the new run from the weights */
    decide(2, 2, 3, true, DFLASH_ECONFIG, m, sizeof m);
    CHECK(strstr(m, "cannot resume /ck/step-9 with 3 drafters") &&
          strstr(m, "4 slots (2 drafters x 2)") && strstr(m, "with 1, 2 or 4 drafters") &&
          strstr(m, "--init-weights /ck/step-9 and another --checkpoint-dir"));
    /* one slot a step cannot be shared at all; 12 lists its six sizes */
    decide(1, 1, 2, true, DFLASH_ECONFIG, m, sizeof m);
    CHECK(strstr(m, "with 1 drafter (") != NULL);
    decide(3, 4, 5, true, DFLASH_ECONFIG, m, sizeof m);
    CHECK(strstr(m, "with 1, 2, 3, 4, 6 or 12 drafters") != NULL);

    /* a group step holds at most 64 slots: a solo run of 128 cannot go to a group (it can
     * resume alone), one of 64 can */
    decide(1, 128, 2, true, DFLASH_ECONFIG, m, sizeof m);
    CHECK(strstr(m, "128 slots (1 drafter x 128)") && strstr(m, "at most 64") &&
          strstr(m, "resume it alone"));
    r = decide(1, 64, 8, true, 0, m, sizeof m);
    CHECK(r.kind == STEP_RESCALE_ADAPT && r.accumulate == 8);
    decide(1, 65, 0, true, DFLASH_ECONFIG, m, sizeof m); /* unknown size: the per-rank 65 */
    CHECK(strstr(m, "at most 64") != NULL);
    decide(0, 40, 2, true, DFLASH_ECONFIG, m, sizeof m); /* old checkpoint: 2 x 40 */
    CHECK(strstr(m, "at most 64") != NULL);
    /* --group-size 1: a group still, 64 at most */
    decide(1, 100, 1, true, DFLASH_ECONFIG, m, sizeof m);
    r = decide(1, 100, 1, false, 0, m, sizeof m);
    CHECK(r.kind == STEP_RESCALE_KEEP && r.accumulate == 100);

    /* a checkpoint written before the record: its per-rank value, as before */
    r = decide(0, 16, 1, false, 0, m, sizeof m);
    CHECK(r.kind == STEP_RESCALE_KEEP && r.accumulate == 16 && r.world == 1 && m[0] == 0);
    r = decide(0, 16, 2, true, 0, m, sizeof m);
    CHECK(r.kind == STEP_RESCALE_KEEP && r.accumulate == 16 && r.world == 2);

    /* a group without --group-size: per-rank value kept, a warning naming the size to give */
    r = decide(2, 8, 0, true, 0, m, sizeof m);
    CHECK(r.kind == STEP_RESCALE_FOLLOW && r.accumulate == 8 && r.world == 2);
    CHECK(strstr(m, "without --group-size") && strstr(m, "follows the group's size") &&
          strstr(m, "16 slots (2 drafters x 8)") && strstr(m, "--group-size 2"));
    r = decide(0, 8, 0, true, 0, m, sizeof m);
    CHECK(r.kind == STEP_RESCALE_FOLLOW && r.accumulate == 8 && r.world == 0);
    CHECK(strstr(m, "does not record") != NULL);
    CHECK_DONE();
}
