/* test_policy: the broker's bucket policy as a user of dflash-queue sees it: the drafter is not
 * served below min_ready, work goes where the reservoir lacks, max_depth stops the target, the
 * consumed length mix follows the dataset mix, settings change live, a dead drafter's slot is
 * redelivered and a poison batch quarantined, a restarted target's batches return to to-do, a
 * batch a late ack recorded trained is not granted again from the slot that holds it anew, a
 * group step is reserved whole exactly when that many claims keep min_ready, and an aborted
 * step's batch is served again first. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "err.h"
#include "policy.h"

#define POOL 1
#define INC 0x1111u
#define TOK 1000u

typedef struct {
    batch_id requeued[64];
    int n_requeued;
    batch_id quarantined[8];
    uint32_t q_slot[8];
    int n_quarantined;
} events;

static void on_requeue(void *ctx, const batch_id *b)
{
    events *e = ctx;
    if (e->n_requeued < 64) e->requeued[e->n_requeued] = *b;
    e->n_requeued++;
}

static void on_quarantine(void *ctx, const batch_id *b, uint32_t pool_id, uint64_t inc,
                          uint32_t slot)
{
    events *e = ctx;
    (void)pool_id, (void)inc;
    if (e->n_quarantined < 8) {
        e->quarantined[e->n_quarantined] = *b;
        e->q_slot[e->n_quarantined] = slot;
    }
    e->n_quarantined++;
}

static events ev;
static uint32_t next_index[POLICY_MAX_BUCKETS];

static policy *make(uint32_t n_buckets, const double *shares, uint32_t min_ready,
                    uint32_t max_depth)
{
    policy_params prm;
    policy_params_default(&prm);
    prm.n_buckets = n_buckets;
    prm.min_ready = min_ready;
    prm.max_depth = max_depth;
    prm.lease_timeout_ms = 100;
    prm.max_redeliveries = 2;
    prm.mix_window = 100;
    memset(&ev, 0, sizeof ev);
    memset(next_index, 0, sizeof next_index);
    policy_sink sink = {&ev, on_requeue, on_quarantine, NULL};
    policy *p = policy_new(&prm, &sink);
    if (p && shares) policy_set_shares(p, n_buckets, shares);
    if (p) policy_pool_add(p, POOL, INC, 256, 1 << 20);
    return p;
}

/* The target produces one batch of bucket into the slot the broker suggested. */
static int produce(policy *p, uint32_t bucket)
{
    batch_id b = {0, bucket, next_index[bucket]++};
    uint32_t slot;
    int rc = policy_work_start(p, POOL, &b, &slot);
    if (rc) return rc;
    return policy_slot_ready(p, POOL, INC, slot, &b, TOK);
}

static void test_reservoir(void)
{
    policy *p = make(2, NULL, 10, 90);
    policy_grant g;
    for (int i = 0; i < 9; i++) CHECK_EQ_INT(produce(p, (uint32_t)i % 2), 0);
    CHECK_EQ_INT(policy_claim(p, 1, 0, &g), DFLASH_EAGAIN); /* 9 < min_ready */
    CHECK_EQ_INT(produce(p, 0), 0);
    CHECK_EQ_INT(policy_claim(p, 1, 0, &g), 0);              /* 10 ready: served */
    CHECK_EQ_INT(policy_claim(p, 1, 0, &g), DFLASH_EAGAIN); /* 9 again */
    policy_set_flush(p, true);                               /* epoch end: serve the rest */
    CHECK_EQ_INT(policy_claim(p, 1, 0, &g), 0);
    policy_set_flush(p, false);
    CHECK_EQ_INT(policy_set_mode(p, POLICY_DRAINING), 0);
    uint32_t bucket;
    CHECK_EQ_INT(policy_next_bucket(p, POOL, 3, &bucket), DFLASH_ESTATE); /* no new work */
    int served = 0;
    while (policy_claim(p, 1, 0, &g) == 0) served++;
    CHECK_EQ_INT(served, 8);
    CHECK(!policy_drained(p)); /* 10 leases still held */
    CHECK_EQ_INT(policy_set_mode(p, POLICY_PAUSED), 0);
    CHECK_EQ_INT(policy_claim(p, 1, 0, &g), DFLASH_ESTATE);
    policy_destroy(&p);
    CHECK(p == NULL);
    policy_destroy(&p); /* NULL is fine */
}

static void test_deficit(void)
{
    const double shares[4] = {0.5, 0.25, 0.125, 0.125};
    policy *p = make(4, shares, 8, 90);
    uint32_t counts[4] = {0};
    for (int i = 0; i < 8; i++) {
        uint32_t b;
        CHECK_EQ_INT(policy_next_bucket(p, POOL, 0xf, &b), 0);
        batch_id id = {0, b, next_index[b]++};
        uint32_t slot;
        CHECK_EQ_INT(policy_work_start(p, POOL, &id, &slot), 0);
        counts[b]++;
    }
    /* Filling counts as soon-ready: the 8 work units follow the shares exactly. */
    CHECK_EQ_INT(counts[0], 4);
    CHECK_EQ_INT(counts[1], 2);
    CHECK_EQ_INT(counts[2], 1);
    CHECK_EQ_INT(counts[3], 1);
    policy_stats st;
    policy_get_stats(p, &st);
    CHECK_EQ_INT(st.filling, 8);
    CHECK_NEAR(st.bucket[0].deficit, 0.0, 1e-9);
    /* Bucket 0 has no to-do left: the next-largest deficit among the available ones wins. */
    uint32_t b;
    CHECK_EQ_INT(policy_next_bucket(p, POOL, 0x4, &b), 0);
    CHECK_EQ_INT(b, 2);
    CHECK_EQ_INT(policy_next_bucket(p, POOL, 0, &b), DFLASH_ENOTFOUND);
    CHECK_EQ_INT(policy_next_bucket(p, 99, 0xf, &b), DFLASH_ESTALE);
    policy_destroy(&p);

    /* The long bucket is slow, the short one fast: a drained reservoir is refilled where it
     * lacks, not in arrival order. */
    const double two[2] = {0.5, 0.5};
    p = make(2, two, 10, 90);
    for (int i = 0; i < 5; i++) CHECK_EQ_INT(produce(p, 0), 0); /* 5 short ready, 0 long */
    CHECK_EQ_INT(policy_next_bucket(p, POOL, 3, &b), 0);
    CHECK_EQ_INT(b, 1);
    policy_destroy(&p);
}

static void test_max_depth(void)
{
    policy *p = make(1, NULL, 0, 5);
    uint32_t b;
    for (int i = 0; i < 5; i++) {
        CHECK_EQ_INT(policy_next_bucket(p, POOL, 1, &b), 0);
        CHECK_EQ_INT(produce(p, b), 0);
    }
    CHECK_EQ_INT(policy_next_bucket(p, POOL, 1, &b), DFLASH_EFULL);
    policy_grant g;
    CHECK_EQ_INT(policy_claim(p, 7, 0, &g), 0);
    /* Leased still counts: the target must wait until the drafter releases. */
    CHECK_EQ_INT(policy_next_bucket(p, POOL, 1, &b), DFLASH_EFULL);
    policy_slot_ref where;
    CHECK_EQ_INT(policy_release(p, g.lease_id, &where), 0);
    CHECK_EQ_INT(where.pool_id, POOL);
    CHECK_EQ_INT(where.incarnation, INC);
    CHECK_EQ_INT(where.slot, g.where.slot);
    CHECK_EQ_INT(policy_next_bucket(p, POOL, 1, &b), 0);
    /* Live: lower the cap below the current depth, then raise it. */
    CHECK_EQ_INT(policy_set_max_depth(p, 3), 0);
    CHECK_EQ_INT(policy_next_bucket(p, POOL, 1, &b), DFLASH_EFULL);
    CHECK_EQ_INT(policy_set_max_depth(p, 90), 0);
    CHECK_EQ_INT(policy_next_bucket(p, POOL, 1, &b), 0);
    CHECK_EQ_INT(policy_set_max_depth(p, 0), DFLASH_EINVAL);
    policy_destroy(&p);

    /* A pool with no free slot is full too, whatever max_depth says. */
    policy_params prm;
    policy_params_default(&prm);
    prm.n_buckets = 1;
    prm.min_ready = 0;
    p = policy_new(&prm, NULL);
    CHECK_EQ_INT(policy_pool_add(p, 2, 9, 1, 64), 0);
    batch_id id = {0, 0, 0};
    uint32_t slot;
    CHECK_EQ_INT(policy_work_start(p, 2, &id, &slot), 0);
    CHECK_EQ_INT(policy_next_bucket(p, 2, 1, &b), DFLASH_EFULL);
    CHECK_EQ_INT(policy_work_start(p, 2, &id, &slot), DFLASH_EFULL);
    policy_destroy(&p);
}

/* Two targets' pools: a batch ready in either is granted, each from its own pool (defect
 * guarded: a policy serving one pool alone deadlocks the other target once its slots are full,
 * which no test with one pool sees). */
static void test_two_pools(void)
{
    enum { POOL2 = POOL + 1, INC2 = 0x55 };
    policy *p = make(1, NULL, 0, 8);
    CHECK_EQ_INT(policy_pool_add(p, POOL2, INC2, 4, 1 << 20), 0);
    batch_id second = {0, 0, 1000};
    uint32_t slot;
    CHECK_EQ_INT(policy_work_start(p, POOL2, &second, &slot), 0);
    CHECK_EQ_INT(policy_slot_ready(p, POOL2, INC2, slot, &second, TOK), 0);
    CHECK_EQ_INT(produce(p, 0), 0);
    int from[2] = {0, 0};
    for (int i = 0; i < 2; i++) {
        policy_grant g;
        CHECK_EQ_INT(policy_claim(p, 7, 0, &g), 0);
        if (g.where.pool_id == POOL2) {
            CHECK_EQ_INT(g.where.incarnation, INC2);
            CHECK_EQ_INT(g.where.batch.index, 1000);
        }
        from[g.where.pool_id == POOL2]++;
    }
    CHECK(from[0] == 1 && from[1] == 1);
    policy_destroy(&p);
}

static void test_choice(void)
{
    const double shares[2] = {0.7, 0.3};
    policy *p = make(2, shares, 0, 200);
    for (int i = 0; i < 10; i++) CHECK_EQ_INT(produce(p, 1), 0); /* long ones arrive first */
    for (int i = 0; i < 10; i++) CHECK_EQ_INT(produce(p, 0), 0);
    uint32_t served[2] = {0};
    uint32_t last_index[2] = {0};
    bool in_order = true;
    for (int i = 0; i < 10; i++) {
        policy_grant g;
        CHECK_EQ_INT(policy_claim(p, 1, 0, &g), 0);
        uint32_t b = g.where.batch.bucket;
        if (served[b] && g.where.batch.index != last_index[b] + 1) in_order = false;
        last_index[b] = g.where.batch.index;
        served[b]++;
        CHECK_EQ_INT(g.deliveries, 1);
    }
    /* FIFO would have served 10 long batches; the policy follows the 70/30 mix. */
    CHECK_EQ_INT(served[0], 7);
    CHECK_EQ_INT(served[1], 3);
    CHECK(in_order); /* oldest slot of a bucket first */
    policy_stats st;
    policy_get_stats(p, &st);
    CHECK_NEAR(st.mix_tv, 0.0, 1e-9);
    CHECK_EQ_INT(st.bucket[0].consumed_tokens, 7 * TOK);
    CHECK_EQ_INT(st.bucket[1].produced_batches, 10);
    CHECK_EQ_INT(st.claims, 10);
    policy_destroy(&p);
}

static void test_starved_bucket_no_burst(void)
{
    /* The long bucket had nothing ready for 50 claims (its to-do ran out at an epoch end). When
     * it is back, it catches up, but a bounded amount: the short bucket is not shut out. */
    policy_params prm;
    policy_params_default(&prm);
    prm.n_buckets = 2;
    prm.min_ready = 0;
    prm.mix_window = 16; /* lag clamp: 16/8 + 2 = 4 claims */
    policy *p = policy_new(&prm, NULL);
    policy_pool_add(p, POOL, INC, 256, 64);
    memset(next_index, 0, sizeof next_index);
    policy_grant g;
    for (int i = 0; i < 50; i++) {
        produce(p, 0);
        CHECK_EQ_INT(policy_claim(p, 1, 0, &g), 0);
    }
    for (int i = 0; i < 20; i++) {
        produce(p, 0);
        produce(p, 1);
    }
    uint32_t served[2] = {0};
    for (int i = 0; i < 20; i++) {
        CHECK_EQ_INT(policy_claim(p, 1, 0, &g), 0);
        served[g.where.batch.bucket]++;
    }
    CHECK(served[1] >= 8);  /* it catches up... */
    CHECK(served[0] >= 4);  /* ...without a 20-claim burst */
    policy_destroy(&p);
}

static void test_live_min_ready(void)
{
    policy *p = make(1, NULL, 10, 90);
    for (int i = 0; i < 20; i++) CHECK_EQ_INT(produce(p, 0), 0);
    policy_grant g;
    CHECK_EQ_INT(policy_claim(p, 1, 0, &g), 0);
    CHECK_EQ_INT(policy_set_min_ready(p, 30), 0); /* dflash-ctl set min_ready=30 */
    CHECK_EQ_INT(policy_claim(p, 1, 0, &g), DFLASH_EAGAIN);
    for (int i = 0; i < 11; i++) CHECK_EQ_INT(produce(p, 0), 0);
    CHECK_EQ_INT(policy_claim(p, 1, 0, &g), 0); /* 30 ready now */
    CHECK_EQ_INT(policy_claim(p, 1, 0, &g), DFLASH_EAGAIN);
    CHECK_EQ_INT(policy_set_min_ready(p, 0), 0);
    CHECK_EQ_INT(policy_claim(p, 1, 0, &g), 0);
    policy_stats st;
    policy_get_stats(p, &st);
    CHECK_EQ_INT(st.min_ready, 0);
    CHECK_EQ_INT(st.ready, 28);
    CHECK_EQ_INT(st.leased, 3);
    policy_destroy(&p);
}

static void test_lease_expiry(void)
{
    policy *p = make(1, NULL, 0, 90);
    CHECK_EQ_INT(produce(p, 0), 0);
    CHECK_EQ_INT(produce(p, 0), 0);
    policy_grant g, g2;
    CHECK_EQ_INT(policy_claim(p, 42, 1000, &g), 0);
    CHECK_EQ_INT(g.deadline_ms, 1100);
    CHECK_EQ_INT(policy_next_deadline(p), 1100);
    CHECK_EQ_INT(policy_tick(p, 1099), 0);
    policy_stats st;
    policy_get_stats(p, &st);
    CHECK_EQ_INT(st.leased, 1);
    CHECK_EQ_INT(policy_heartbeat(p, 42, 1050), 0); /* the worker is alive: +100 ms */
    CHECK_EQ_INT(policy_tick(p, 1149), 0);
    policy_get_stats(p, &st);
    CHECK_EQ_INT(st.leased, 1);
    CHECK_EQ_INT(policy_tick(p, 1150), 0); /* heartbeats stopped: expired */
    policy_get_stats(p, &st);
    CHECK_EQ_INT(st.leased, 0);
    CHECK_EQ_INT(st.ready, 2);
    CHECK_EQ_INT(st.lease_expiries, 1);
    CHECK_EQ_INT(policy_next_deadline(p), UINT64_MAX);
    /* The redelivered batch is served first, and the dead worker's release is stale. */
    CHECK_EQ_INT(policy_claim(p, 43, 2000, &g2), 0);
    CHECK(g2.where.batch.index == g.where.batch.index);
    CHECK_EQ_INT(g2.deliveries, 2);
    CHECK(g2.lease_id != g.lease_id);
    CHECK_EQ_INT(policy_release(p, g.lease_id, NULL), DFLASH_ESTALE);
    CHECK_EQ_INT(policy_release(p, g2.lease_id, NULL), 0);
    policy_get_stats(p, &st);
    CHECK_EQ_INT(st.stale_releases, 1);
    CHECK_EQ_INT(st.bucket[0].consumed_batches, 1); /* a redelivery is not consumed twice */

    /* A dead worker (socket gone) loses its leases at once; another worker's stay. */
    CHECK_EQ_INT(policy_claim(p, 50, 3000, &g), 0);
    CHECK_EQ_INT(produce(p, 0), 0);
    CHECK_EQ_INT(policy_claim(p, 51, 3000, &g2), 0);
    CHECK_EQ_INT(policy_drop_worker(p, 50), 0);
    policy_get_stats(p, &st);
    CHECK_EQ_INT(st.leased, 1);
    CHECK_EQ_INT(st.ready, 1);
    CHECK_EQ_INT(policy_release(p, g2.lease_id, NULL), 0);
    /* Live lease timeout: new grants get the new deadline. */
    CHECK_EQ_INT(policy_set_lease_timeout(p, 5000), 0);
    CHECK_EQ_INT(policy_claim(p, 52, 4000, &g), 0);
    CHECK_EQ_INT(g.deadline_ms, 9000);
    policy_destroy(&p);
}

static void test_quarantine(void)
{
    policy *p = make(1, NULL, 0, 90); /* max_redeliveries 2 */
    CHECK_EQ_INT(produce(p, 0), 0);
    policy_grant g;
    uint64_t now = 0;
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(policy_claim(p, 1, now, &g), 0);
        CHECK_EQ_INT(g.deliveries, (uint32_t)i + 1);
        now += 100;
        CHECK_EQ_INT(policy_tick(p, now), 0);
    }
    /* Third expiry: redelivered 3 > 2 times -> quarantined, slot FREE, the broker is told. */
    CHECK_EQ_INT(ev.n_quarantined, 1);
    CHECK_EQ_INT(ev.quarantined[0].index, 0);
    CHECK_EQ_INT(ev.q_slot[0], g.where.slot);
    slot_state s;
    CHECK_EQ_INT(policy_slot_get(p, POOL, g.where.slot, &s, NULL), 0);
    CHECK_EQ_INT(s, SLOT_FREE);
    policy_stats st;
    policy_get_stats(p, &st);
    CHECK_EQ_INT(st.quarantined, 1);
    CHECK_EQ_INT(st.ready, 0);
    CHECK_EQ_INT(policy_claim(p, 1, now, &g), DFLASH_EAGAIN);
    policy_destroy(&p);
}

static void test_incarnation_drop(void)
{
    policy *p = make(2, NULL, 0, 90);
    batch_id filling = {0, 1, 77};
    uint32_t slot;
    CHECK_EQ_INT(policy_work_start(p, POOL, &filling, &slot), 0);
    CHECK(policy_is_filling(p, POOL, &filling));
    CHECK_EQ_INT(produce(p, 0), 0); /* (0,0,0) ready */
    CHECK_EQ_INT(produce(p, 0), 0); /* (0,0,1) ready */
    policy_grant g;
    CHECK_EQ_INT(policy_claim(p, 5, 0, &g), 0); /* (0,0,0) leased */
    CHECK_EQ_INT(policy_worker_leases(p, 5), 1);
    CHECK_EQ_INT(policy_worker_leases(p, 6), 0);
    /* The target restarts with a new incarnation and registers again. */
    CHECK_EQ_INT(policy_pool_add(p, POOL, INC, 256, 1 << 20), DFLASH_EEXISTS);
    CHECK_EQ_INT(policy_pool_add(p, POOL, 0x2222, 256, 1 << 20), 0);
    CHECK_EQ_INT(policy_pool_incarnation(p, POOL), 0x2222);
    /* The filling and the ready batch go back to to-do at once... */
    CHECK_EQ_INT(ev.n_requeued, 2);
    bool saw_filling = false, saw_ready = false;
    for (int i = 0; i < ev.n_requeued && i < 64; i++) {
        if (ev.requeued[i].index == 77) saw_filling = true;
        if (ev.requeued[i].bucket == 0 && ev.requeued[i].index == 1) saw_ready = true;
    }
    CHECK(saw_filling && saw_ready);
    policy_stats st;
    policy_get_stats(p, &st);
    CHECK_EQ_INT(st.ready + st.filling + st.leased, 0);
    CHECK_EQ_INT(st.detached_leases, 1);
    CHECK_EQ_INT(policy_detached_leases(p, POOL, INC), 1); /* the old incarnation's */
    CHECK_EQ_INT(policy_detached_leases(p, POOL, 0x2222), 0);
    CHECK_EQ_INT(policy_worker_leases(p, 5), 1); /* still its worker's (a stop waits for it) */
    /* ...the old incarnation's messages are stale... */
    batch_id late = {0, 0, 9};
    CHECK_EQ_INT(policy_slot_ready(p, POOL, INC, 3, &late, TOK), DFLASH_ESTALE);
    /* ...and the leased one: its worker may have copied it; a release ends it, no requeue. */
    policy_slot_ref where;
    CHECK_EQ_INT(policy_release(p, g.lease_id, &where), 0);
    CHECK_EQ_INT(where.incarnation, INC);
    CHECK_EQ_INT(ev.n_requeued, 2);
    CHECK_EQ_INT(policy_detached_leases(p, POOL, INC), 0);
    CHECK_EQ_INT(policy_worker_leases(p, 5), 0);
    /* A detached lease whose worker never releases requeues its batch on expiry. */
    batch_id nb = {0, 0, 5};
    CHECK_EQ_INT(policy_work_start(p, POOL, &nb, &slot), 0);
    CHECK_EQ_INT(policy_slot_ready(p, POOL, 0x2222, slot, &nb, TOK), 0);
    CHECK_EQ_INT(policy_claim(p, 6, 0, &g), 0);
    CHECK_EQ_INT(policy_pool_drop(p, POOL), 0);
    CHECK_EQ_INT(policy_pool_drop(p, POOL), DFLASH_ENOTFOUND);
    CHECK_EQ_INT(ev.n_requeued, 2);
    CHECK_EQ_INT(policy_next_deadline(p), 100);
    /* Its worker's heartbeats keep it, as they keep any lease of that worker (it may still be
     * copying the batch: an expiry would produce it again while the copy is trained). */
    CHECK_EQ_INT(policy_heartbeat(p, 6, 60), 0);
    CHECK_EQ_INT(policy_next_deadline(p), 160);
    CHECK_EQ_INT(policy_tick(p, 100), 0);
    CHECK_EQ_INT(ev.n_requeued, 2);
    CHECK_EQ_INT(policy_detached_leases(p, POOL, 0x2222), 1);
    CHECK_EQ_INT(policy_tick(p, 160), 0);
    CHECK_EQ_INT(ev.n_requeued, 3);
    CHECK(ev.requeued[2].index == g.where.batch.index);
    /* A detached lease whose worker is gone (its socket closed) ends at once, as its other
     * leases do: its batch goes back to to-do without waiting for the lease timeout. */
    CHECK_EQ_INT(policy_pool_add(p, POOL, 0x3333, 256, 1 << 20), 0);
    batch_id nc = {0, 0, 6};
    CHECK_EQ_INT(policy_work_start(p, POOL, &nc, &slot), 0);
    CHECK_EQ_INT(policy_slot_ready(p, POOL, 0x3333, slot, &nc, TOK), 0);
    CHECK_EQ_INT(policy_claim(p, 7, 200, &g), 0);
    CHECK_EQ_INT(policy_pool_drop(p, POOL), 0);
    CHECK_EQ_INT(policy_worker_leases(p, 7), 1);
    CHECK_EQ_INT(policy_drop_worker(p, 7), 0);
    CHECK_EQ_INT(ev.n_requeued, 4);
    CHECK(ev.requeued[3].index == 6);
    CHECK_EQ_INT(policy_worker_leases(p, 7), 0);
    CHECK_EQ_INT(policy_next_deadline(p), UINT64_MAX);
    policy_destroy(&p);
}

static void test_other_slot(void)
{
    /* The target may fill a different free slot than suggested: the books follow it. */
    policy *p = make(1, NULL, 0, 90);
    batch_id a = {0, 0, 0}, b = {0, 0, 1};
    uint32_t sa, sb;
    CHECK_EQ_INT(policy_work_start(p, POOL, &a, &sa), 0);
    CHECK_EQ_INT(policy_work_start(p, POOL, &b, &sb), 0);
    CHECK(sa != sb);
    /* b lands in a's slot, then a lands in b's slot. */
    CHECK_EQ_INT(policy_slot_ready(p, POOL, INC, sa, &b, TOK), 0);
    CHECK(policy_is_filling(p, POOL, &a));
    CHECK_EQ_INT(policy_slot_ready(p, POOL, INC, sb, &a, TOK), 0);
    /* A FREE slot used directly. */
    batch_id c = {0, 0, 2};
    uint32_t sc;
    CHECK_EQ_INT(policy_work_start(p, POOL, &c, &sc), 0);
    CHECK_EQ_INT(policy_slot_ready(p, POOL, INC, 200, &c, TOK), 0);
    slot_state s;
    CHECK_EQ_INT(policy_slot_get(p, POOL, sc, &s, NULL), 0);
    CHECK_EQ_INT(s, SLOT_FREE);
    policy_stats st;
    policy_get_stats(p, &st);
    CHECK_EQ_INT(st.ready, 3);
    CHECK_EQ_INT(st.filling, 0);
    /* Rewriting a ready slot is a protocol error; a slot out of range too. */
    CHECK_EQ_INT(policy_slot_ready(p, POOL, INC, 200, &c, TOK), DFLASH_ESTATE);
    CHECK_EQ_INT(policy_slot_ready(p, POOL, INC, 256, &c, TOK), DFLASH_ERANGE);
    batch_id bad = {0, 5, 0};
    CHECK_EQ_INT(policy_slot_ready(p, POOL, INC, 10, &bad, TOK), DFLASH_ERANGE);
    policy_destroy(&p);
}

/* A batch recorded trained by a late ack while a slot holds it again (handed out anew after a
 * broker restart): its READY slot is not granted, its FILLING slot is not counted as filling;
 * both go FREE, and a leased one is left to its drafter. */
static void test_batch_trained(void)
{
    policy *p = make(1, NULL, 0, 90);
    batch_id a = {0, 0, 0}, b = {0, 0, 1}, c = {0, 0, 2};
    uint32_t sa, sb, sc;
    CHECK_EQ_INT(policy_work_start(p, POOL, &a, &sa), 0);
    CHECK_EQ_INT(policy_slot_ready(p, POOL, INC, sa, &a, TOK), 0);
    CHECK_EQ_INT(policy_work_start(p, POOL, &b, &sb), 0);
    policy_slot_ref where;
    CHECK_EQ_INT(policy_batch_trained(p, &a, &where), 0);
    CHECK(where.slot == sa && where.pool_id == POOL && where.batch.index == 0);
    CHECK_EQ_INT(policy_batch_trained(p, &b, NULL), 0);
    slot_state st;
    CHECK_EQ_INT(policy_slot_get(p, POOL, sa, &st, NULL), 0);
    CHECK_EQ_INT(st, SLOT_FREE);
    CHECK_EQ_INT(policy_slot_get(p, POOL, sb, &st, NULL), 0);
    CHECK_EQ_INT(st, SLOT_FREE);
    policy_stats ps;
    policy_get_stats(p, &ps);
    CHECK_EQ_INT(ps.ready, 0);
    CHECK_EQ_INT(ps.filling, 0);
    policy_grant g;
    CHECK_EQ_INT(policy_claim(p, 7, 0, &g), DFLASH_EAGAIN); /* a is not granted */
    CHECK_EQ_INT(policy_batch_trained(p, &a, NULL), DFLASH_ENOTFOUND);
    /* leased: its drafter may be copying it */
    CHECK_EQ_INT(policy_work_start(p, POOL, &c, &sc), 0);
    CHECK_EQ_INT(policy_slot_ready(p, POOL, INC, sc, &c, TOK), 0);
    CHECK_EQ_INT(policy_claim(p, 7, 0, &g), 0);
    CHECK_EQ_INT(policy_batch_trained(p, &c, NULL), DFLASH_ENOTFOUND);
    CHECK_EQ_INT(policy_release(p, g.lease_id, NULL), 0);
    CHECK_EQ_INT(ev.n_requeued, 0);
    policy_destroy(&p);
}

/* A lease whose batch a late ack recorded trained (policy_lease_trained): whichever way it ends
 * (expiry, the worker's drop, a revoke, a release) its slot goes FREE, never READY again: the
 * trained batch is not granted again, and no failed delivery is counted (no quarantine, no
 * requeue). Another lease is untouched. */
static void test_lease_trained(void)
{
    policy *p = make(1, NULL, 0, 90);
    for (int i = 0; i < 5; i++) CHECK_EQ_INT(produce(p, 0), 0);
    policy_grant g[5], info;
    for (int i = 0; i < 5; i++) CHECK_EQ_INT(policy_claim(p, 60 + (uint64_t)i, 1000, &g[i]), 0);
    batch_id none = {0, 0, 99};
    CHECK_EQ_INT(policy_lease_trained(p, &none, &info), DFLASH_ENOTFOUND);
    for (int i = 0; i < 4; i++) { /* all but the last */
        CHECK_EQ_INT(policy_lease_trained(p, &g[i].where.batch, &info), 0);
        CHECK(info.lease_id == g[i].lease_id && info.worker_id == 60 + (uint64_t)i &&
              info.where.slot == g[i].where.slot);
    }
    CHECK_EQ_INT(policy_tick(p, 1000 + 100), 0); /* every lease expires */
    policy_stats st;
    policy_get_stats(p, &st);
    CHECK_EQ_INT(st.lease_expiries, 5);
    CHECK_EQ_INT(st.ready, 1); /* only the unmarked lease's batch */
    CHECK_EQ_INT(st.quarantined, 0);
    policy_grant again;
    CHECK_EQ_INT(policy_claim(p, 70, 2000, &again), 0);
    CHECK(again.where.batch.index == g[4].where.batch.index);
    /* the drop of a worker, a revoke, a release */
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(produce(p, 0), 0);
    policy_grant h[3];
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(policy_claim(p, 80 + (uint64_t)i, 3000, &h[i]), 0);
        CHECK_EQ_INT(policy_lease_trained(p, &h[i].where.batch, NULL), 0);
    }
    CHECK_EQ_INT(policy_drop_worker(p, 80), 0);
    CHECK_EQ_INT(policy_lease_revoke(p, h[1].lease_id), 0);
    CHECK_EQ_INT(policy_release(p, h[2].lease_id, NULL), 0);
    policy_get_stats(p, &st);
    CHECK_EQ_INT(st.ready, 0);
    CHECK_EQ_INT(st.leased, 1); /* worker 70's */
    CHECK_EQ_INT(ev.n_requeued + ev.n_quarantined, 0);
    CHECK_EQ_INT(policy_claim(p, 90, 4000, &again), DFLASH_EAGAIN);
    /* a slot freed so is filled again as any other, and its new lease ends as usual */
    CHECK_EQ_INT(produce(p, 0), 0);
    CHECK_EQ_INT(policy_claim(p, 91, 5000, &again), 0);
    CHECK_EQ_INT(policy_tick(p, 5000 + 100), 0);
    policy_get_stats(p, &st);
    CHECK_EQ_INT(st.ready, 2); /* it and worker 70's, both expired */
    policy_destroy(&p);
}

/* A group step is reserved whole only when policy_claimable says that many claims will succeed
 * (broker_groups.c): it must be exactly the claims that keep min_ready, so a step that fits is
 * never refused and one that does not is never half reserved. */
static void test_claimable(void)
{
    policy *p = make(1, NULL, 5, 90);
    for (int i = 0; i < 4; i++) CHECK_EQ_INT(produce(p, 0), 0);
    CHECK_EQ_INT(policy_claimable(p), 0); /* 4 ready < min_ready */
    CHECK_EQ_INT(produce(p, 0), 0);
    CHECK_EQ_INT(policy_claimable(p), 1); /* 5 ready: one claim, then 4 */
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(produce(p, 0), 0);
    uint32_t n = policy_claimable(p);
    CHECK_EQ_INT(n, 4); /* 8 ready: claims at 8, 7, 6 and 5 */
    policy_grant g;
    uint32_t served = 0;
    while (policy_claim(p, 1, 0, &g) == 0) served++;
    CHECK_EQ_INT(served, n);
    CHECK_EQ_INT(policy_claimable(p), 0);
    policy_set_flush(p, true); /* epoch end: every ready slot may go */
    CHECK_EQ_INT(policy_claimable(p), 4);
    CHECK_EQ_INT(policy_set_mode(p, POLICY_PAUSED), 0);
    CHECK_EQ_INT(policy_claimable(p), 0);
    policy_destroy(&p);
}

/* An aborted group step gives its leases back (policy_lease_revoke): the batch is READY again at
 * the head of its bucket's FIFO (the oldest batch, served next, before batches that became ready
 * later), its deliveries unchanged (the step's abort is no failed delivery) and its tokens not
 * counted twice in the mix; the revoked holder's release is stale. */
static void test_revoke(void)
{
    policy *p = make(1, NULL, 0, 90);
    for (int i = 0; i < 2; i++) CHECK_EQ_INT(produce(p, 0), 0);
    policy_grant g[2], again;
    for (int i = 0; i < 2; i++) CHECK_EQ_INT(policy_claim(p, 1, 0, &g[i]), 0);
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(produce(p, 0), 0); /* indices 2, 3, 4 ready */
    CHECK_EQ_INT(policy_lease_revoke(p, g[1].lease_id), 0);
    CHECK_EQ_INT(policy_lease_revoke(p, g[1].lease_id), DFLASH_ESTALE);
    CHECK_EQ_INT(policy_release(p, g[1].lease_id, NULL), DFLASH_ESTALE);
    policy_stats st;
    policy_get_stats(p, &st);
    CHECK_EQ_INT(st.ready, 4);
    CHECK_EQ_INT(st.leased, 1);
    CHECK_EQ_INT(policy_claim(p, 2, 0, &again), 0);
    CHECK_EQ_INT(again.where.batch.index, g[1].where.batch.index); /* not index 2 */
    CHECK_EQ_INT(again.deliveries, 1);
    CHECK_EQ_INT(policy_claim(p, 2, 0, &again), 0);
    CHECK_EQ_INT(again.where.batch.index, 2); /* then the FIFO as before */
    policy_get_stats(p, &st);
    CHECK_EQ_INT(st.claims, 4);
    CHECK_EQ_INT(st.bucket[0].consumed_batches, 3); /* the regrant is not consumed again */
    CHECK_EQ_INT(st.lease_expiries, 0);
    CHECK_EQ_INT(ev.n_requeued + ev.n_quarantined, 0);
    policy_destroy(&p);
}

static void test_restart_fence(void)
{
    /* A re-registered pool's busy slots are fenced: never handed out for filling, no SLOT_READY,
     * until a tick at or after the fence deadline frees them. */
    policy *p = make(1, NULL, 0, 90);
    CHECK_EQ_INT(policy_pool_drop(p, POOL), 0);
    CHECK_EQ_INT(policy_pool_add(p, POOL, INC, 2, 1 << 20), 0);
    CHECK_EQ_INT(policy_slot_fence(p, POOL, 0, 1000), 0);
    CHECK_EQ_INT(policy_slot_fence(p, POOL, 0, 1000), DFLASH_ESTATE);
    CHECK_EQ_INT(policy_slot_fence(p, POOL, 2, 1000), DFLASH_ERANGE);
    CHECK_EQ_INT(policy_slot_fence(p, POOL + 1, 0, 1000), DFLASH_ENOTFOUND);
    batch_id a = {0, 0, 0}, b = {0, 0, 1};
    uint32_t sa, sb;
    CHECK_EQ_INT(policy_work_start(p, POOL, &a, &sa), 0);
    CHECK_EQ_INT(sa, 1); /* the unfenced slot */
    uint32_t bucket;
    CHECK_EQ_INT(policy_next_bucket(p, POOL, 1, &bucket), DFLASH_EFULL);
    CHECK_EQ_INT(policy_work_start(p, POOL, &b, &sb), DFLASH_EFULL);
    CHECK_EQ_INT(policy_slot_ready(p, POOL, INC, 0, &b, TOK), DFLASH_ESTATE);
    policy_stats st;
    policy_get_stats(p, &st);
    CHECK_EQ_INT(st.fenced, 1);
    CHECK_EQ_INT(st.filling, 1);
    policy_tick(p, 999);
    CHECK_EQ_INT(policy_work_start(p, POOL, &b, &sb), DFLASH_EFULL);
    policy_tick(p, 1000);
    slot_state s;
    CHECK_EQ_INT(policy_slot_get(p, POOL, 0, &s, NULL), 0);
    CHECK_EQ_INT(s, SLOT_FREE);
    CHECK_EQ_INT(policy_work_start(p, POOL, &b, &sb), 0);
    CHECK_EQ_INT(sb, 0);
    /* dropping a pool with a fenced slot leaves nothing behind */
    CHECK_EQ_INT(policy_slot_ready(p, POOL, INC, sb, &b, TOK), 0);
    CHECK_EQ_INT(policy_pool_add(p, POOL, INC + 1, 4, 1 << 20), 0);
    CHECK_EQ_INT(policy_slot_fence(p, POOL, 3, 50), 0);
    CHECK_EQ_INT(policy_pool_drop(p, POOL), 0);
    policy_get_stats(p, &st);
    CHECK_EQ_INT(st.fenced, 0);
    CHECK_EQ_INT(st.ready + st.filling + st.leased, 0);
    policy_destroy(&p);
}

static void test_tv(void)
{
    const double a[2] = {1, 0}, b[2] = {0, 1}, c[2] = {3, 1}, d[2] = {1, 1};
    CHECK_NEAR(policy_tv_distance(2, a, b), 1.0, 1e-12);
    CHECK_NEAR(policy_tv_distance(2, a, a), 0.0, 1e-12);
    CHECK_NEAR(policy_tv_distance(2, c, d), 0.25, 1e-12);
    CHECK_NEAR(policy_tv_distance(2, a, (const double[]){0, 0}), 0.0, 1e-12);
    const double e[4] = {0.4, 0.3, 0.2, 0.1}, f[4] = {1, 1, 1, 1};
    CHECK_NEAR(policy_tv_distance(4, e, f), 0.5 * (0.15 + 0.05 + 0.05 + 0.15), 1e-12);

    /* The reported metric covers only the last mix_window claims. */
    policy_params prm;
    policy_params_default(&prm);
    prm.n_buckets = 2;
    prm.min_ready = 0;
    prm.mix_window = 4;
    policy *p = policy_new(&prm, NULL);
    policy_pool_add(p, POOL, INC, 64, 64);
    memset(next_index, 0, sizeof next_index);
    policy_grant g;
    for (int i = 0; i < 4; i++) {
        produce(p, 0);
        CHECK_EQ_INT(policy_claim(p, 1, 0, &g), 0);
    }
    policy_stats st;
    policy_get_stats(p, &st);
    CHECK_NEAR(st.mix_tv, 0.5, 1e-12); /* all short vs 50/50 */
    CHECK_EQ_INT(st.window_claims, 4);
    for (int i = 0; i < 2; i++) {
        produce(p, 1);
        CHECK_EQ_INT(policy_claim(p, 1, 0, &g), 0);
    }
    policy_get_stats(p, &st);
    CHECK_NEAR(st.mix_tv, 0.0, 1e-12); /* window = 2 short + 2 long */
    CHECK_NEAR(st.bucket[1].window_share, 0.5, 1e-12);
    policy_destroy(&p);

    /* Bad parameters are refused. */
    prm.mix_window = 0;
    CHECK(policy_new(&prm, NULL) == NULL);
    prm.mix_window = 4;
    prm.n_buckets = 0;
    CHECK(policy_new(&prm, NULL) == NULL);
    prm.n_buckets = 2;
    p = policy_new(&prm, NULL);
    CHECK_EQ_INT(policy_set_shares(p, 2, (const double[]){0, 0}), DFLASH_EINVAL);
    CHECK_EQ_INT(policy_set_shares(p, 3, (const double[]){1, 1, 1}), DFLASH_EINVAL);
    CHECK_EQ_INT(policy_set_shares(p, 2, (const double[]){-1, 2}), DFLASH_EINVAL);
    CHECK_EQ_INT(policy_pool_add(p, 1, 1, 0, 64), DFLASH_EINVAL);
    policy_destroy(&p);
}

int main(void)
{
    test_reservoir();
    test_deficit();
    test_max_depth();
    test_choice();
    test_two_pools();
    test_starved_bucket_no_burst();
    test_live_min_ready();
    test_lease_expiry();
    test_quarantine();
    test_incarnation_drop();
    test_other_slot();
    test_batch_trained();
    test_lease_trained();
    test_restart_fence();
    test_claimable();
    test_revoke();
    test_tv();
    CHECK_DONE();
}
