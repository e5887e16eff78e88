/* itest_target_errors: the target loop's and the target's leave's error paths, in this process
 * against the real dflash-queue (the daemons' own tests cannot make them happen).
 *
 *   1. A producer that fails (its fill returns DFLASH_EIO on the second batch; the first
 *      batch's slot header names the pool's incarnation as its producer) ends
 *      target_loop_run with that code, promptly, with one batch counted: the daemon exits 1
 *      saying which batch failed, rather than going on with a slot left FILLING at the broker
 *      for ever (a watchdog sets the stop flag after WATCHDOG_MS, so a loop that ignores the
 *      failure returns 0 instead and the test fails rather than hangs); it leaves the broker
 *      first, as a stop does: the broker then holds no slot of it and no batch in flight
 *      (defect: its pool stayed granted, from freed memory, until the broker expired it).
 *   2. target_leave waiting for a copy in progress (a raw drafter holds a lease) returns the
 *      request's error as soon as the broker stops answering (SIGKILL), within a request
 *      timeout, instead of asking again until the lease-timeout bound.
 *   3. target_leave waiting for a copy that hangs (the drafter heartbeats, never releases)
 *      gives up at the broker's lease timeout, DFLASH_EAGAIN, instead of waiting as long as
 *      the drafter lives; a lease timeout raised live after the target's hello is the bound.
 *   4. The broker restarted (SIGKILL, then on its journal) while the target fills a batch: the
 *      SlotReady gets Error STALE, and the loop registers again and goes on (--max-batches 2
 *      reached), instead of ending with DFLASH_ESTALE (the daemon exiting 1 at a broker
 *      restart).
 *
 * Usage: itest_target_errors QUEUE. Exit 0 pass, 1 fail. */
#include "check.h"
#include "harness.h"
#include "heartbeat.h"
#include "slot.h"
#include "target_leave.h"
#include "target_loop.h"

#include <pthread.h>
#include <signal.h>

#define WATCHDOG_MS 20000
#define POOL_INC 0x1eaf

/* ---- 1. a failing producer */

typedef struct failing {
    target_producer *inner; /* the synthetic producer */
    int calls;
    uint64_t producer, header_producer; /* the loop's id for the first fill, and its header's */
} failing;

static int failing_fill(void *ctx, const slot_work_unit *wu, void *slot, const slot_layout *l,
                        void *stream, uint64_t producer, uint32_t *n_seqs)
{
    failing *f = ctx;
    if (++f->calls == 2) return DFLASH_EIO;
    int n = f->inner->fill(f->inner->ctx, wu, slot, l, stream, producer, n_seqs);
    slot_header h;
    char err[256];
    f->producer = producer;
    if (n > 0 && slot_header_check(slot, l, &h, err, sizeof err) == 0)
        f->header_producer = h.producer;
    return n;
}

static volatile sig_atomic_t stop_flag;
static void *watchdog(void *arg)
{
    (void)arg;
    for (uint64_t end = h_now_ms() + WATCHDOG_MS; !stop_flag && h_now_ms() < end;)
        h_sleep_ms(20);
    stop_flag = 1;
    return NULL;
}

static void producer_failure(const char *queue_bin)
{
    char dir[64], ep[128];
    h_tempdir(dir, sizeof dir);
    h_queue_endpoint(dir, ep, sizeof ep);
    const char *more[] = {"--log-level=warn", NULL};
    pid_t q = h_start_small_queue(queue_bin, dir, more);
    CHECK(q > 0);
    if (q <= 0) return;

    target_loop_config cfg = {.endpoint = ep, .name = "t", .backend = POOL_HOST, .n_slots = 2,
                              .n_buckets = 2, .bucket_upper = {64, 256},
                              .bucket_share = {0.5, 0.5}, .bucket_batches = {4, 4},
                              .epochs = 1, .timeout_ms = 1000};
    CHECK_EQ_INT(slot_layout_compute(H_SMALL_LAYOUT, SLOT_DTYPE_F32, &cfg.layout), 0);
    failing f = {.inner = target_synthetic_new(&cfg, 1000, 0)};
    CHECK(f.inner != NULL);
    if (!f.inner) return;
    target_producer prod = {.name = "failing", .ctx = &f, .fill = failing_fill};
    pthread_t th;
    stop_flag = 0;
    CHECK_EQ_INT(pthread_create(&th, NULL, watchdog, NULL), 0);
    target_stats st = {0};
    uint64_t t0 = h_now_ms();
    int rc = target_loop_run(&cfg, &prod, &stop_flag, &st);
    uint64_t took = h_now_ms() - t0;
    stop_flag = 1;
    pthread_join(th, NULL);
    printf("failing producer: target_loop_run %d (%s) after %llu ms, %llu batches, %d fills\n",
           rc, err_str(rc), (unsigned long long)took, (unsigned long long)st.batches, f.calls);
    CHECK_EQ_INT(rc, DFLASH_EIO);
    CHECK(took < WATCHDOG_MS);
    CHECK_EQ_INT(st.batches, 1);
    CHECK_EQ_INT(f.calls, 2); /* nothing filled after the failure */
    /* the slot header names the pool (its incarnation; it was 0 in every slot) */
    CHECK(f.producer != 0);
    CHECK(f.header_producer == f.producer);
    /* it left the broker before freeing the pool: nothing more is granted from it, its ready
     * batch is back to to-do at once (not when the broker expires the target) */
    int crc = 0;
    client *c = h_client(ep, WIRE_ROLE_CTL, "check", 20, &crc);
    CHECK_EQ_INT(crc, 0);
    wire_status s = {0};
    if (c) CHECK_EQ_INT(client_status(c, &s), 0);
    printf("failing producer: the broker then has %u slots, %u peers, %llu batches in flight\n",
           s.slot_count, s.peers, (unsigned long long)s.batches_inflight);
    CHECK_EQ_INT(s.slot_count, 0);
    CHECK_EQ_INT(s.batches_inflight, 0);
    client_destroy(&c);
    target_producer_destroy(&f.inner);
    h_kill(q, SIGKILL);
    if (!check_failed) h_rmdir(dir);
}

/* ---- 2 and 3: a leave waiting for a copy in progress */

typedef struct leaver {
    client *c;
    int rc;
    volatile int done;
} leaver;

static void *leave_thread(void *arg)
{
    leaver *l = arg;
    l->rc = target_leave(l->c, POOL_INC);
    l->done = 1;
    return NULL;
}

static bool pool_gone(const wire_status *s) { return s->slot_count == 0; }

typedef struct leave_run {
    char dir[64], ep[128];
    pid_t q;
    client *t, *d, *c; /* the target, the drafter holding a lease, a ctl */
    uint64_t leave_ms;  /* when the leave began */
    wire_grant g;
    leaver l;
    pthread_t th;
} leave_run;

/* A broker with lease timeout lease_ms; a raw target with a pool of 2 slots, one published;
 * a raw drafter that claims it and keeps the lease (its copy "in progress"); the lease timeout
 * set to raised_ms live (dflash-ctl set) when it is not 0, after the target's hello;
 * target_leave in a thread, until the broker took it (the pool gone) and it waits for the copy.
 * false when the set-up failed (checked). */
static bool leave_start(leave_run *r, const char *queue_bin, int lease_ms, int raised_ms)
{
    h_tempdir(r->dir, sizeof r->dir);
    h_queue_endpoint(r->dir, r->ep, sizeof r->ep);
    char lease[64];
    snprintf(lease, sizeof lease, "--lease-timeout-ms=%d", lease_ms);
    const char *extra[] = {"--min-ready=0", "--max-depth=2", lease, "--heartbeat-ms=1000",
                           "--liveness=60", "--stats-interval-ms=0", "--log-level=warn", NULL};
    r->q = h_start_queue(queue_bin, r->dir, extra);
    CHECK(r->q > 0);
    if (r->q <= 0) return false;
    int rc;
    r->t = h_client(r->ep, WIRE_ROLE_TARGET, "t", 10, &rc);
    CHECK_EQ_INT(rc, 0);
    wire_pool pool;
    h_pool(&pool, POOL_INC, 2, 1, 4, 1);
    CHECK_EQ_INT(client_register_pool(r->t, &pool), 0);
    wire_work_unit wu;
    CHECK_EQ_INT(rc = client_request_work(r->t, POOL_INC, &wu), 0);
    if (rc) return false;
    wire_slot_ready sr = {POOL_INC, wu.slot, wu.unit, 64, 1};
    CHECK_EQ_INT(client_slot_ready(r->t, &sr), 0);
    r->d = h_client(r->ep, WIRE_ROLE_DRAFTER, "d", 10, &rc);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(rc = client_claim(r->d, &r->g), 0);
    if (rc) return false;
    r->c = h_client(r->ep, WIRE_ROLE_CTL, "check", 10, &rc);
    if (raised_ms) {
        static wire_settings set, applied;
        set.n = 1;
        snprintf(set.kv[0].key, WIRE_MAX_KEY, "lease_timeout_ms");
        snprintf(set.kv[0].value, WIRE_MAX_VALUE, "%d", raised_ms);
        CHECK_EQ_INT(client_set(r->c, &set, &applied), 0);
    }
    r->l = (leaver){.c = r->t};
    r->leave_ms = h_now_ms();
    CHECK_EQ_INT(pthread_create(&r->th, NULL, leave_thread, &r->l), 0);
    wire_status s = {0};
    CHECK(h_status_until(r->c, &s, pool_gone, 10000)); /* the leave was taken */
    CHECK(!r->l.done);                                 /* and waits for the copy */
    return true;
}

static void leave_end(leave_run *r)
{
    client_destroy(&r->c);
    client_destroy(&r->d);
    client_destroy(&r->t);
    h_kill(r->q, SIGKILL);
    if (!check_failed) h_rmdir(r->dir);
}

/* 2: the broker SIGKILLed while the leave waits: it returns the request's error (DFLASH_ETIMEOUT)
 * within a request timeout (1 s), not at the lease bound (BROKER_GONE_LEASE_MS). */
#define BROKER_GONE_LEASE_MS 20000
static void broker_gone_during_leave(const char *queue_bin)
{
    leave_run r = {0};
    if (!leave_start(&r, queue_bin, BROKER_GONE_LEASE_MS, 0)) return;
    h_kill(r.q, SIGKILL);
    uint64_t t0 = h_now_ms();
    while (!r.l.done && h_now_ms() < t0 + BROKER_GONE_LEASE_MS / 2) h_sleep_ms(10);
    CHECK(r.l.done);
    if (!r.l.done) { /* still asking: the process exits with the thread in it */
        fprintf(stderr, "the leave still runs %d ms after the kill\n", BROKER_GONE_LEASE_MS / 2);
        return;
    }
    pthread_join(r.th, NULL);
    uint64_t took = h_now_ms() - t0;
    printf("leave with the broker gone: %d (%s) %llu ms after the kill\n", r.l.rc,
           err_str(r.l.rc), (unsigned long long)took);
    CHECK_EQ_INT(r.l.rc, DFLASH_ETIMEOUT);
    CHECK(took < BROKER_GONE_LEASE_MS / 2);
    leave_end(&r);
}

/* 3: a copy that hangs (its drafter alive, heartbeating, never releasing): the leave gives up at
 * the broker's lease timeout (HUNG_LEASE_MS) with DFLASH_EAGAIN, and the target exits (its WARN
 * says so); with the timeout raised live to raised_ms after the target's hello, at that (defect:
 * at the hello's, freeing the memory under a lease the broker still held valid). A releaser
 * thread gives the lease back after HUNG_RELEASE_MS, so a leave that never gives up returns 0
 * then instead of hanging the test. */
#define HUNG_LEASE_MS 1500
#define HUNG_RELEASE_MS 15000
typedef struct releaser {
    leave_run *r;
    volatile int stop;
} releaser;
static void *release_late(void *arg)
{
    releaser *x = arg;
    for (uint64_t end = h_now_ms() + HUNG_RELEASE_MS; !x->stop && h_now_ms() < end;)
        h_sleep_ms(20);
    if (!x->stop) (void)client_release(x->r->d, x->r->g.lease_id);
    return NULL;
}

static void hung_copy_during_leave(const char *queue_bin, int raised_ms)
{
    leave_run r = {0};
    uint64_t t0 = h_now_ms();
    if (!leave_start(&r, queue_bin, HUNG_LEASE_MS, raised_ms)) return;
    heartbeat *hb = heartbeat_start(r.d, 0, "the holder"); /* its lease stays */
    releaser x = {.r = &r};
    pthread_t rt;
    CHECK_EQ_INT(pthread_create(&rt, NULL, release_late, &x), 0);
    pthread_join(r.th, NULL);
    uint64_t took = h_now_ms() - t0;
    x.stop = 1;
    pthread_join(rt, NULL);
    heartbeat_stop(&hb);
    uint64_t waited = h_now_ms() - r.leave_ms;
    printf("leave with a hung copy (lease timeout %d ms, raised to %d): %d (%s) after %llu ms, "
           "%llu of them leaving\n", HUNG_LEASE_MS, raised_ms, r.l.rc, err_str(r.l.rc),
           (unsigned long long)took, (unsigned long long)waited);
    CHECK_EQ_INT(r.l.rc, DFLASH_EAGAIN);
    CHECK(took < HUNG_RELEASE_MS);
    if (raised_ms) CHECK(waited >= (uint64_t)raised_ms);
    leave_end(&r);
}

/* ---- 4. the broker restarted while a batch is being filled */

typedef struct restarting {
    target_producer *inner;
    const char *queue_bin, *dir;
    const char *const *extra;
    pid_t *q;
    int calls;
} restarting;

/* The first fill restarts the broker (SIGKILL, then a new one on the same journal) before it
 * fills: the SlotReady that follows reaches a broker that does not know the target. */
static int restarting_fill(void *ctx, const slot_work_unit *wu, void *slot, const slot_layout *l,
                           void *stream, uint64_t producer, uint32_t *n_seqs)
{
    restarting *x = ctx;
    if (++x->calls == 1) {
        h_kill(*x->q, SIGKILL);
        *x->q = h_start_queue(x->queue_bin, x->dir, x->extra);
    }
    return x->inner->fill(x->inner->ctx, wu, slot, l, stream, producer, n_seqs);
}

static void broker_restart_during_fill(const char *queue_bin)
{
    char dir[64], ep[128], journal[128];
    h_tempdir(dir, sizeof dir);
    h_queue_endpoint(dir, ep, sizeof ep);
    snprintf(journal, sizeof journal, "--journal=%s/queue.journal", dir);
    const char *extra[] = {journal, "--min-ready=1", "--max-depth=2", "--heartbeat-ms=1000",
                           "--stats-interval-ms=0", "--log-level=warn", NULL};
    pid_t q = h_start_queue(queue_bin, dir, extra);
    CHECK(q > 0);
    if (q <= 0) return;
    target_loop_config cfg = {.endpoint = ep, .name = "t", .backend = POOL_HOST, .n_slots = 2,
                              .n_buckets = 2, .bucket_upper = {64, 256},
                              .bucket_share = {0.5, 0.5}, .bucket_batches = {4, 4},
                              .epochs = 1, .timeout_ms = 1000, .max_batches = 2};
    CHECK_EQ_INT(slot_layout_compute(H_SMALL_LAYOUT, SLOT_DTYPE_F32, &cfg.layout), 0);
    restarting x = {.inner = target_synthetic_new(&cfg, 1000, 0), .queue_bin = queue_bin,
                    .dir = dir, .extra = extra, .q = &q};
    CHECK(x.inner != NULL);
    if (!x.inner) return;
    target_producer prod = {.name = "restarting", .ctx = &x, .fill = restarting_fill};
    pthread_t th;
    stop_flag = 0;
    CHECK_EQ_INT(pthread_create(&th, NULL, watchdog, NULL), 0);
    target_stats st = {0};
    int rc = target_loop_run(&cfg, &prod, &stop_flag, &st);
    bool stopped = stop_flag; /* by the watchdog */
    stop_flag = 1;
    pthread_join(th, NULL);
    printf("broker restarted during a fill: target_loop_run %d (%s), %llu batches, %llu "
           "registrations, %d fills%s\n", rc, err_str(rc), (unsigned long long)st.batches,
           (unsigned long long)st.registrations, x.calls, stopped ? ", stopped by the watchdog" : "");
    CHECK_EQ_INT(rc, 0);
    CHECK(!stopped);
    CHECK_EQ_INT(st.registrations, 2); /* registered again with the new broker */
    CHECK_EQ_INT(st.batches, 2);
    target_producer_destroy(&x.inner);
    if (q > 0) h_kill(q, SIGKILL);
    if (!check_failed) h_rmdir(dir);
}

int main(int argc, char **argv)
{
    if (argc < 2) return 2;
    producer_failure(argv[1]);
    broker_gone_during_leave(argv[1]);
    hung_copy_during_leave(argv[1], 0);
    hung_copy_during_leave(argv[1], 4000);
    broker_restart_during_fill(argv[1]);
    CHECK_DONE();
}
