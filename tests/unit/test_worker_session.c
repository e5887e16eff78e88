/* test_worker_session: when a drafter gives up copying slots (worker_session_copy_hopeless).
 * A failed copy of the usual kinds counts towards --max-copy-failures; DFLASH_EPEER (the pool's
 * GPU has no peer access from ours: pool_reach, found before mapping) ends it at the first
 * grant, since no later grant of that pool could be copied; --max-copy-failures 0 still means
 * retry for ever. No broker is needed: the session's client connects lazily. */
#include "check.h"
#include "err.h"
#include "slot.h"
#include "worker_session.h"

#include <signal.h>

static volatile sig_atomic_t stop;

static worker_session *session(worker_loop_config *lc, worker_stats *st, int64_t limit)
{
    *lc = (worker_loop_config){.endpoint = "tcp://127.0.0.1:9", .name = "hopeless",
                               .backend = POOL_HOST, .timeout_ms = 100,
                               .max_copy_failures = limit};
    CHECK_EQ_INT(slot_layout_compute(16, 2, 8, 1, SLOT_DTYPE_F32, &lc->layout), 0);
    int err = 0;
    worker_session *s = worker_session_new(lc, st, &stop, &err);
    CHECK(s != NULL);
    return s;
}

int main(void)
{
    worker_loop_config lc;
    worker_stats st = {0};
    worker_session *s = session(&lc, &st, 60);
    if (s) {
        CHECK(!worker_session_copy_hopeless(s, DFLASH_ECUDA)); /* 0 of 60 failures so far */
        CHECK(!worker_session_copy_hopeless(s, DFLASH_ENOTFOUND));
        CHECK(worker_session_copy_hopeless(s, DFLASH_EPEER)); /* no peer access: at once */
        worker_session_destroy(&s);
        CHECK(s == NULL);
    }
    s = session(&lc, &st, 0); /* --max-copy-failures 0: retry for ever, even then */
    if (s) {
        CHECK(!worker_session_copy_hopeless(s, DFLASH_EPEER));
        worker_session_destroy(&s);
    }
    CHECK_DONE();
}
