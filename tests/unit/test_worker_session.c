/* test_worker_session: the drafter's session (worker_session.h) without a broker: the session's
 * client connects lazily, so a session can be made with no broker at its endpoint.
 *   - when a drafter gives up copying slots (worker_session_copy_hopeless): a failed copy of the
 *     usual kinds counts towards --max-copy-failures, the limit-th failure in a row ends it (not
 *     one later), a copy that succeeds in between starts the count again; DFLASH_EPEER (the
 *     pool's GPU has no peer access from ours: pool_reach, found before mapping) ends it at the
 *     first grant, since no later grant of that pool could be copied; --max-copy-failures 0
 *     still means retry for ever;
 *   - the copy of a granted slot (a host pool made in this process, used through its pointers)
 *     and the layout check after it (worker_session_check_layout): a slot written for our layout
 *     or the consumer's layout() passes; one written for another layout is the target's
 *     misconfiguration (DFLASH_ECONFIG: given back unread, exit 2); a torn header (its crc
 *     fails) passes, because it is the batch's fault: the consumer refuses that batch, which
 *     then counts against it (quarantine), instead of the drafter exiting. */
#include "check.h"
#include "err.h"
#include "log.h"
#include "pool.h"
#include "slot.h"
#include "worker_session.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

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

/* A grant of slot `slot` of pool p, as the broker would send it, for a batch of n_tokens. */
static wire_grant grant_of(const pool *p, uint32_t slot, uint32_t n_tokens)
{
    const pool_desc *d = pool_descriptor(p);
    wire_grant g = {.lease_id = 1 + slot, .pool_incarnation = d->incarnation, .slot = slot,
                    .offset = pool_slot_offset(p, slot), .size = d->slot_bytes,
                    .unit = {.epoch = 0, .bucket = 0, .index = slot}, .n_tokens = n_tokens,
                    .n_seqs = 1, .backend = WIRE_BACKEND_HOST, .device = -1};
    snprintf(g.shm_name, sizeof g.shm_name, "%s", d->shm_name);
    snprintf(g.pool_name, sizeof g.pool_name, "%s", d->name);
    return g;
}

/* A grant no exporter backs: its shm object does not exist, so the copy fails. */
static wire_grant grant_of_nothing(void)
{
    wire_grant g = {.lease_id = 99, .pool_incarnation = 0x5eed, .size = 4096, .n_tokens = 1,
                    .n_seqs = 1, .backend = WIRE_BACKEND_HOST, .device = -1};
    snprintf(g.shm_name, sizeof g.shm_name, "/dflash.gone.1.0000000000005eed");
    snprintf(g.pool_name, sizeof g.pool_name, "gone");
    return g;
}

static void test_hopeless(void)
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
}

/* --max-copy-failures 2 with real copies: the second failure in a row ends it, a success in
 * between starts the count again. */
static void test_copy_failures_in_a_row(void)
{
    worker_loop_config lc;
    worker_stats st = {0};
    worker_session *s = session(&lc, &st, 2);
    int err = 0;
    pool *p = pool_new(&(pool_config){.backend = POOL_HOST, .name = "wsess", .n_slots = 2,
                                      .slot_bytes = lc.layout.slot_bytes},
                       &err);
    CHECK(p != NULL);
    if (!s || !p) goto out;
    slot_header_write(pool_slot_ptr(p, 0), &lc.layout, &(slot_work_unit){0, 0, 0}, 1, 4, 1);
    wire_grant bad = grant_of_nothing(), good = grant_of(p, 0, 4);

    int rc = worker_session_copy(s, &bad, NULL);
    CHECK(rc < 0);
    CHECK(!worker_session_copy_hopeless(s, rc)); /* 1 of 2 */
    double secs = -1;
    CHECK_EQ_INT(worker_session_copy(s, &good, &secs), 0); /* the count starts again */
    CHECK(secs >= 0);
    CHECK_EQ_INT(st.bytes_copied, slot_used_bytes(&lc.layout, 4)); /* the batch's bytes only */
    uint64_t before = st.bytes_copied;
    good.size = 256; /* a grant of fewer bytes than the batch's: never more than it holds */
    CHECK_EQ_INT(worker_session_copy(s, &good, NULL), 0);
    CHECK_EQ_INT(st.bytes_copied - before, 256);
    rc = worker_session_copy(s, &bad, NULL);
    CHECK(rc < 0);
    CHECK(!worker_session_copy_hopeless(s, rc)); /* 1 of 2 again, not 2 */
    rc = worker_session_copy(s, &bad, NULL);
    CHECK(rc < 0);
    CHECK(worker_session_copy_hopeless(s, rc)); /* 2 of 2 in a row: give up now */
out:
    pool_destroy(&p);
    worker_session_destroy(&s);
}

static const slot_layout *other_layout_of(void *ctx) { return ctx; }

/* The header check after a copy: our layout, the consumer's, another one, a torn header. */
static void test_check_layout(void)
{
    worker_loop_config lc;
    worker_stats st = {0};
    worker_session *s = session(&lc, &st, 0);
    slot_layout wide; /* another --hidden: another model */
    CHECK_EQ_INT(slot_layout_compute(16, 2, 16, 1, SLOT_DTYPE_F32, &wide), 0);
    int err = 0;
    pool *p = pool_new(&(pool_config){.backend = POOL_HOST, .name = "wsess", .n_slots = 3,
                                      .slot_bytes = wide.slot_bytes},
                       &err);
    CHECK(p != NULL);
    if (!s || !p) goto out;
    slot_header_write(pool_slot_ptr(p, 0), &lc.layout, &(slot_work_unit){0, 0, 0}, 1, 4, 1);
    slot_header_write(pool_slot_ptr(p, 1), &wide, &(slot_work_unit){0, 0, 1}, 1, 4, 1);
    slot_header_write(pool_slot_ptr(p, 2), &lc.layout, &(slot_work_unit){0, 0, 2}, 1, 4, 1);
    ((slot_header *)pool_slot_ptr(p, 2))->n_tokens ^= 1; /* torn: its crc no longer holds */

    worker_consumer plain = {0}, wide_reader = {.ctx = &wide, .layout = other_layout_of};
    wire_grant g = grant_of(p, 0, 4);
    CHECK_EQ_INT(worker_session_copy(s, &g, NULL), 0);
    CHECK_EQ_INT(worker_session_check_layout(s, &plain, &g), 0);
    CHECK_EQ_INT(worker_session_check_layout(s, &wide_reader, &g), DFLASH_ECONFIG);

    g = grant_of(p, 1, 4);
    CHECK_EQ_INT(worker_session_copy(s, &g, NULL), 0);
    CHECK_EQ_INT(worker_session_check_layout(s, &plain, &g), DFLASH_ECONFIG);
    CHECK_EQ_INT(worker_session_check_layout(s, &wide_reader, &g), 0);

    g = grant_of(p, 2, 4);
    CHECK_EQ_INT(worker_session_copy(s, &g, NULL), 0);
    CHECK_EQ_INT(worker_session_check_layout(s, &plain, &g), 0); /* the batch's fault */
out:
    pool_destroy(&p);
    worker_session_destroy(&s);
}

int main(void)
{
    log_init("test_worker_session", LOG_ERROR);
    test_hopeless();
    test_copy_failures_in_a_row();
    test_check_layout();
    CHECK_DONE();
}
