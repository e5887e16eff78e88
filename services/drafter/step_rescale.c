/* step_rescale: the per-rank slots of a resumed run's step (see step_rescale.h). */
#include "step_rescale.h"

#include "err.h"
#include "wire.h" /* WIRE_MAX_WORLD: the slots of a group step */

#include <assert.h>
#include <stdio.h>

static const char *plural(long n) {
    return n == 1 ? "" : "s";
}

/* "1, 2 or 4": the numbers of drafters that share total slots evenly (total <= WIRE_MAX_WORLD
 * here: a larger step is refused in a group before, and one drafter always shares it). */
static void divisors_text(long total, char *buf, size_t len) {
    int d[WIRE_MAX_WORLD], n = 0;
    for (long k = 1; k <= total && n < WIRE_MAX_WORLD; k++)
        if (total % k == 0) d[n++] = (int)k;
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < n && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%d",
                               i == 0       ? ""
                               : i == n - 1 ? " or "
                                            : ", ",
                               d[i]);
}

/* "4 slots (2 drafters x 2)": a step of world x accumulate slots */
static void step_text(int world, int accumulate, char *buf, size_t len) {
    long total = (long)world * accumulate;
    snprintf(buf, len, "%ld slot%s (%d drafter%s x %d)", total, plural(total), world, plural(world),
             accumulate);
}

int step_rescale_decide(const char *dir, int ckpt_world, int ckpt_accumulate, int new_world,
                        bool group, step_rescale *out, char *msg, size_t len) {
    assert(ckpt_world >= 0 && ckpt_accumulate >= 1 && new_world >= 0);
    assert(group || new_world == 1);
    msg[0] = 0;
    *out = (step_rescale){.kind = STEP_RESCALE_KEEP,
                          .accumulate = ckpt_accumulate,
                          .world = new_world ? new_world : ckpt_world};
    char was[96];
    if (ckpt_world) step_text(ckpt_world, ckpt_accumulate, was, sizeof was);
    if (ckpt_world && new_world && ckpt_world != new_world) {
        long total = (long)ckpt_world * ckpt_accumulate;
        if (group && total > WIRE_MAX_WORLD) {
            snprintf(msg, len,
                     "cannot resume %s in a group: its step is %s and a group step holds at most "
                     "%d slots (ranks x --accumulate); resume it alone, or start the group from "
                     "its weights (--init-weights %s and another --checkpoint-dir)",
                     dir, was, WIRE_MAX_WORLD, dir);
            return DFLASH_ECONFIG;
        }
        if (total % new_world) {
            char fits[WIRE_MAX_WORLD * 4];
            divisors_text(total, fits, sizeof fits);
            snprintf(msg, len,
                     "cannot resume %s with %d drafter%s: its step is %s, which %d drafter%s "
                     "cannot share evenly (each trains as many of its slots); resume it with %s "
                     "drafter%s (--group-size; scripts/train --drafters), or start a new run from "
                     "its weights with the step you want (--init-weights %s and another "
                     "--checkpoint-dir)",
                     dir, new_world, plural(new_world), was, new_world, plural(new_world), fits,
                     total == 1 ? "" : "s", dir);
            return DFLASH_ECONFIG;
        }
        out->kind = STEP_RESCALE_ADAPT;
        out->accumulate = (int)(total / new_world);
        snprintf(msg, len,
                 "resuming %s with %d drafter%s: its step stays %ld slot%s, now %d drafter%s x "
                 "%d (it was %d x %d)",
                 dir, new_world, plural(new_world), total, plural(total), new_world,
                 plural(new_world), out->accumulate, ckpt_world, ckpt_accumulate);
        return 0;
    }
    long slots = (long)(new_world ? new_world : 1) * ckpt_accumulate;
    if (group && slots > WIRE_MAX_WORLD) {
        snprintf(msg, len,
                 "cannot resume %s in a group: each drafter would train its checkpoint's %d slots "
                 "a step%s and a group step holds at most %d slots (ranks x --accumulate); resume "
                 "it alone, or start the group from its weights (--init-weights %s and another "
                 "--checkpoint-dir)",
                 dir, ckpt_accumulate, new_world > 1 ? ", as many on each rank" : "",
                 WIRE_MAX_WORLD, dir);
        return DFLASH_ECONFIG;
    }
    if (group && !new_world) {
        out->kind = STEP_RESCALE_FOLLOW;
        if (ckpt_world)
            snprintf(msg, len,
                     "resuming %s in a --group without --group-size: each drafter trains the "
                     "checkpoint's %d slot%s a step, so the step's slot count now follows the "
                     "group's size (the checkpoint's step: %s); give --group-size %d to keep it",
                     dir, ckpt_accumulate, plural(ckpt_accumulate), was, ckpt_world);
        else
            snprintf(msg, len,
                     "resuming %s in a --group without --group-size: each drafter trains the "
                     "checkpoint's %d slot%s a step, so the step's slot count now follows the "
                     "group's size (the checkpoint does not record how many drafters took its "
                     "steps)",
                     dir, ckpt_accumulate, plural(ckpt_accumulate));
    }
    return 0;
}
