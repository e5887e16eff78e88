/* test_target_loop: what dflash-target's loop (target_loop.h) does with each answer the broker may
 * give its work request, against the scripted fake broker (fake_broker.h: a hello, the pool
 * registered, a work unit for slot 1 per request, OK to a SlotReady, PoolLeft to a leave unless
 * a case answers the work requests with an Error or not at all). The loop runs in a thread over
 * a host pool and the synthetic producer; each case waits for what the fake counted, never for
 * a fixed time.
 *   - an Error the loop has no rule for (INVAL here): said ("work request failed: ..."), asked
 *     again, and once the broker hands out work the loop fills it as before (--max-batches
 *     reached, exit 0), neither ending the target nor registering again;
 *   - SHUTDOWN (the broker drains): the loop ends at once with 0 ("the broker is draining:
 *     done"), after one work request, without a leave;
 *   - FULL and AGAIN (max_depth, nothing to do now): asked again after a back-off, counted as
 *     waiting for a free slot, not said as a failure;
 *   - STALE (the broker forgot our pool): hello and the pool registered again, then work;
 *   - no answer (the broker silent): asked again, the timeouts not counted as waiting for a
 *     free slot (they are the broker's, not the pipeline's).
 * And the registration before it: unanswered or STALE, tried again (hello first); refused for
 * the plan or buckets (MISMATCH, RANGE), DFLASH_ECONFIG at once (exit 2), for another reason
 * that code (exit 1); a hello refused for our --name, DFLASH_EEXISTS and name_in_use (exit 4). */
#include "check.h"
#include "err.h"
#include "fake_broker.h"
#include "log.h"
#include "monotime.h"
#include "slot.h"
#include "target_loop.h"
#include "test_files.h"
#include "wire.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WAIT_S 20.0 /* the bound of every wait for the fake's counts (a loaded machine) */

typedef struct run {
    target_loop_config cfg;
    target_producer *prod;
    volatile sig_atomic_t stop;
    volatile int done;
    int rc;
    target_stats st;
    pthread_t th;
    test_capture cap;
} run;

static void *loop_thread(void *arg)
{
    run *r = arg;
    r->rc = target_loop_run(&r->cfg, r->prod, &r->stop, &r->st);
    r->done = 1;
    return NULL;
}

/* Starts the loop against the fake (its stderr captured): a host pool of 2 slots, one bucket,
 * max_batches batches (0: until drained or stopped), request timeout timeout_ms. */
static void run_start(run *r, int64_t max_batches, int64_t timeout_ms)
{
    memset(r, 0, sizeof *r);
    r->cfg = (target_loop_config){.endpoint = fb.endpoint, .name = "tl", .backend = POOL_HOST,
                                  .n_slots = 2, .n_buckets = 1, .bucket_upper = {64},
                                  .bucket_share = {1.0}, .bucket_batches = {100}, .epochs = 1,
                                  .timeout_ms = timeout_ms, .max_batches = max_batches};
    CHECK_EQ_INT(slot_layout_compute(256, 4, 8, 2, SLOT_DTYPE_F32, &r->cfg.layout), 0);
    r->prod = target_synthetic_new(&r->cfg, 1000, 0);
    CHECK(r->prod != NULL);
    if (!r->prod) exit(1);
    r->cap = test_capture_begin();
    pthread_create(&r->th, NULL, loop_thread, r);
}

/* Stops the loop (if it still runs), joins it; returns its log (free it). */
static char *run_end(run *r)
{
    r->stop = 1;
    pthread_join(r->th, NULL);
    char *log = test_capture_end(&r->cap);
    target_producer_destroy(&r->prod);
    if (check_failed && log) fputs(log, stderr);
    return log ? log : calloc(1, 1);
}

/* Waits until the fake has n requests of type t, or the loop ended; whether it has. */
static bool wait_requests(const run *r, wire_type t, int n)
{
    double t0 = monotime_s();
    while (fake_count_type(t) < n && !r->done && monotime_s() - t0 < WAIT_S)
        monotime_sleep_ms(2);
    return fake_count_type(t) >= n;
}

/* Waits until the loop returned (bounded); whether it has. */
static bool wait_done(const run *r)
{
    double t0 = monotime_s();
    while (!r->done && monotime_s() - t0 < WAIT_S) monotime_sleep_ms(2);
    return r->done;
}

/* The counts of the fake now, to compare with after a case. */
static int work_requests0, hellos0, registers0, readies0, leaves0;
static void counts_mark(void)
{
    work_requests0 = fake_count_type(WIRE_WORK_REQUEST);
    registers0 = fake_count_type(WIRE_POOL_REGISTER);
    hellos0 = fake_count_type(WIRE_HELLO);
    readies0 = fake_count_type(WIRE_SLOT_READY);
    leaves0 = fake_count_type(WIRE_POOL_LEAVE);
}

/* The fake's answers plain again: the loop trains its batches and ends with 0, n of them. Its
 * log (free it). */
static char *run_finish_plain(run *r, int64_t n)
{
    fake_reset();
    CHECK(wait_done(r));
    char *log = run_end(r);
    CHECK_EQ_INT(r->rc, 0);
    CHECK_EQ_INT(r->st.batches, n);
    return log;
}

/* An Error with no rule of its own: said, asked again; work that comes after it is done. */
static void test_unexpected_error(void)
{
    fake_reset();
    counts_mark();
    fake_answer_error((wire_error){.code = DFLASH_EINVAL, .message = "no such thing"},
                      WIRE_WORK_REQUEST);
    run r;
    run_start(&r, 3, 5000);
    /* three refusals in a row: the loop is still there, asking */
    CHECK(wait_requests(&r, WIRE_WORK_REQUEST, work_requests0 + 3));
    CHECK(!r.done);
    char *log = run_finish_plain(&r, 3); /* --max-batches reached, not given up before */
    CHECK_EQ_INT(fake_count_type(WIRE_SLOT_READY) - readies0, 3);
    CHECK_EQ_INT(r.st.registrations, 1); /* an unknown error is not a lost registration */
    CHECK_EQ_INT(fake_count_type(WIRE_HELLO) - hellos0, 1);
    CHECK(strstr(log, "work request failed: ") != NULL);
    CHECK(strstr(log, err_str(DFLASH_EINVAL)) != NULL && strstr(log, "no such thing") != NULL);
    CHECK(strstr(log, "draining") == NULL);
    free(log);
}

/* SHUTDOWN: the broker drains and has nothing for us: done, at once, exit 0. */
static void test_shutdown(void)
{
    fake_reset();
    counts_mark();
    fake_answer_error((wire_error){.code = DFLASH_ESHUTDOWN, .message = "draining"},
                      WIRE_WORK_REQUEST);
    run r;
    run_start(&r, 0, 5000);
    bool ended = wait_done(&r); /* never stopped by the test before this */
    char *log = run_end(&r);
    CHECK(ended);
    CHECK_EQ_INT(r.rc, 0);
    CHECK_EQ_INT(fake_count_type(WIRE_WORK_REQUEST) - work_requests0, 1); /* not asked again */
    CHECK_EQ_INT(fake_count_type(WIRE_POOL_LEAVE) - leaves0, 0); /* nothing to leave */
    CHECK_EQ_INT(r.st.batches, 0);
    CHECK(strstr(log, "the broker is draining: done") != NULL);
    CHECK(strstr(log, "work request failed") == NULL);
    free(log);
}

/* FULL and AGAIN: waiting for a free slot (counted), asked again, not said as a failure. */
static void test_full_again(int code)
{
    fake_reset();
    counts_mark();
    fake_answer_error((wire_error){.code = code, .message = "wait"}, WIRE_WORK_REQUEST);
    run r;
    run_start(&r, 2, 5000);
    CHECK(wait_requests(&r, WIRE_WORK_REQUEST, work_requests0 + 4));
    CHECK(!r.done);
    char *log = run_finish_plain(&r, 2);
    CHECK_EQ_INT(r.st.registrations, 1);
    CHECK(r.st.wait_slot_s > 0);
    CHECK(strstr(log, "work request failed") == NULL);
    if (check_failed) fprintf(stderr, "(the case of %s)\n", err_str(code));
    free(log);
}

/* STALE: the broker does not know our pool: registered again (hello and pool), then work. */
static void test_stale(void)
{
    fake_reset();
    counts_mark();
    fake_answer_error((wire_error){.code = DFLASH_ESTALE, .message = "unknown pool"},
                      WIRE_WORK_REQUEST);
    run r;
    run_start(&r, 2, 5000);
    CHECK(wait_requests(&r, WIRE_HELLO, hellos0 + 2)); /* the first hello and one again */
    CHECK(!r.done);
    char *log = run_finish_plain(&r, 2);
    CHECK(r.st.registrations >= 2);
    CHECK(strstr(log, "registering again") != NULL);
    CHECK(strstr(log, "work request failed") == NULL);
    free(log);
}

/* A silent broker: the work request asked again after each timeout; the timeouts are not
 * waiting for a free slot. */
static void test_silent(void)
{
    fake_reset();
    counts_mark();
    fake_silence(WIRE_WORK_REQUEST);
    run r;
    run_start(&r, 2, 300);
    CHECK(wait_requests(&r, WIRE_WORK_REQUEST, work_requests0 + 3)); /* two timed out */
    CHECK(!r.done);
    char *log = run_finish_plain(&r, 2);
    CHECK(r.st.wait_slot_s < 0.3); /* two timeouts of 0.3 s would be 0.6 s */
    CHECK(strstr(log, "work request failed") == NULL);
    free(log);
}

/* The pool's registration unanswered (silent) or answered STALE (the broker restarted between
 * our hello and it): hello and registration again, then work; not the end of the target. */
static void test_register_again(bool silent)
{
    fake_reset();
    counts_mark();
    if (silent)
        fake_silence(WIRE_POOL_REGISTER);
    else
        fake_answer_error((wire_error){.code = DFLASH_ESTALE, .message = "unknown peer: send hello"},
                          WIRE_POOL_REGISTER);
    run r;
    run_start(&r, 2, 300);
    CHECK(wait_requests(&r, WIRE_POOL_REGISTER, registers0 + 2)); /* one failed, asked again */
    CHECK(!r.done);
    char *log = run_finish_plain(&r, 2);
    CHECK_EQ_INT(r.st.registrations, 1);
    CHECK(fake_count_type(WIRE_HELLO) - hellos0 >= 2); /* each try starts with a hello */
    if (check_failed) fprintf(stderr, "(the case of a registration %s)\n",
                              silent ? "unanswered" : "answered STALE");
    free(log);
}

/* A registration refused for good ends the loop at once, after one try: for the run's plan or
 * buckets (MISMATCH, RANGE) with DFLASH_ECONFIG (the daemon's exit 2: our flags or data), for
 * anything else with the broker's code (exit 1); a hello refused because a live target has our
 * --name with DFLASH_EEXISTS and name_in_use (exit 4). */
static void test_refused(wire_type what, int code, int want_rc, const char *said)
{
    fake_reset();
    counts_mark();
    fake_answer_error((wire_error){.code = code, .message = "refused here"}, what);
    int tries0 = fake_count_type(what);
    run r;
    run_start(&r, 0, 5000);
    bool ended = wait_done(&r); /* by itself */
    char *log = run_end(&r);
    CHECK(ended);
    CHECK_EQ_INT(r.rc, want_rc);
    CHECK_EQ_INT(fake_count_type(what) - tries0, 1);
    CHECK_EQ_INT(fake_count_type(WIRE_WORK_REQUEST) - work_requests0, 0);
    CHECK_EQ_INT(r.st.registrations, 0);
    CHECK(r.st.name_in_use == (code == DFLASH_EEXISTS));
    CHECK(strstr(log, said) != NULL && strstr(log, "refused here") != NULL);
    if (check_failed) fprintf(stderr, "(the case of %s refused with %s)\n", wire_type_name(what),
                              err_str(code));
    free(log);
}

int main(void)
{
    log_init("test_target_loop", LOG_INFO);
    fake_start();
    test_unexpected_error();
    test_shutdown();
    test_full_again(DFLASH_EFULL);
    test_full_again(DFLASH_EAGAIN);
    test_stale();
    test_silent();
    test_register_again(true);
    test_register_again(false);
    test_refused(WIRE_POOL_REGISTER, DFLASH_EMISMATCH, DFLASH_ECONFIG, "the broker refused our pool");
    test_refused(WIRE_POOL_REGISTER, DFLASH_ERANGE, DFLASH_ECONFIG, "the broker refused our pool");
    test_refused(WIRE_POOL_REGISTER, DFLASH_EINVAL, DFLASH_EINVAL, "the broker refused our pool");
    test_refused(WIRE_HELLO, DFLASH_EEXISTS, DFLASH_EEXISTS, "the broker refused our hello");
    fake_stop();
    CHECK_DONE();
}
