/* broker_stub: a broker driven in-process by a unit test (header-only, static; include once, after
 * check.h): requests go straight to broker_dispatch (no sockets), the journal is in memory, and
 * the libuv loop runs only when the test runs it (uv_run on stub_loop: the broker's cron).
 *   stub_broker_new(tweak)  the config's defaults, journal none, min_ready 0, errors-only logs,
 *                           then tweak(cfg) (may be NULL); the broker is stub_b
 *   stub_init(t, role, inc) starts stub_req; stub_send(rid) sends it from routing id rid and
 *                           unpacks the reply into stub_rep: 0 or the error code it carries
 *   stub_status()           a ctl's status request
 *   stub_pool(rid, inc, pool_inc, n_slots) a target registers a host pool of one 512-token
 *                           bucket; stub_make_ready(rid, inc, pool_inc, n) makes n batches ready
 *   stub_broker_free()      destroys broker and loop
 *   stub_capture_log(fn, out, cap) runs fn with stderr (the broker's log lines) captured into
 *                           out (at most cap - 1 bytes, NUL-terminated) */
#ifndef DFLASH_TEST_BROKER_STUB_H
#define DFLASH_TEST_BROKER_STUB_H

#include "broker.h"
#include "config.h"
#include "log.h"
#include "wire.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

static broker *stub_b;
static uv_loop_t stub_loop;
static uint8_t stub_buf[WIRE_MAX_MSG], stub_out[WIRE_MAX_MSG];
static wire_msg stub_req, stub_rep;
static uint64_t stub_next_rid = 1;

static __attribute__((unused)) void stub_broker_new(void (*tweak)(queue_config *cfg))
{
    log_init("test", LOG_ERROR);
    queue_config cfg;
    char *argv[] = {"test", NULL};
    CHECK_EQ_INT(config_load(broker_config_table(), &cfg, 1, argv, NULL, 0, NULL), 0);
    snprintf(cfg.journal, sizeof cfg.journal, "none");
    cfg.min_ready = 0;
    snprintf(cfg.log_level, sizeof cfg.log_level, "error");
    if (tweak) tweak(&cfg);
    uv_loop_init(&stub_loop);
    stub_b = broker_new(&stub_loop, &cfg, NULL);
    CHECK(stub_b != NULL);
}

static __attribute__((unused)) void stub_broker_free(void)
{
    broker_destroy(&stub_b);
    uv_loop_close(&stub_loop);
    wire_msg_clear(&stub_rep);
}

static __attribute__((unused)) void stub_init(wire_type t, wire_role role, uint64_t inc)
{
    wire_msg_init(&stub_req, t, role, inc, 0);
}

static __attribute__((unused)) int stub_send(const char *rid)
{
    stub_req.request_id = stub_next_rid++;
    int n = wire_pack(&stub_req, stub_buf, sizeof stub_buf);
    CHECK(n > 0);
    int r = broker_dispatch(stub_b, (const uint8_t *)rid, strlen(rid), stub_buf, (size_t)n,
                            stub_out, sizeof stub_out);
    CHECK(r > 0);
    wire_msg_clear(&stub_rep);
    CHECK_EQ_INT(wire_unpack(stub_out, (size_t)r, &stub_rep, NULL, 0), 0);
    CHECK_EQ_INT(stub_rep.request_id, stub_req.request_id);
    return stub_rep.type == WIRE_ERROR ? stub_rep.u.error.code : 0;
}

/* A drafter's group step request (StepClaim, StepDone, StepAbort...: type t) of group "g". */
/* stub_req as a group step request t of group "g" (a caller may set more fields, then send). */
static __attribute__((unused)) void stub_group_step_begin(uint64_t inc, wire_type t,
                                                          uint64_t epoch, uint64_t step)
{
    stub_init(t, WIRE_ROLE_DRAFTER, inc);
    snprintf(stub_req.u.gstep.group, sizeof stub_req.u.gstep.group, "g");
    stub_req.u.gstep.epoch = epoch;
    stub_req.u.gstep.step = step;
}

static __attribute__((unused)) int stub_group_step(const char *rid, uint64_t inc, wire_type t,
                                                   uint64_t epoch, uint64_t step)
{
    stub_group_step_begin(inc, t, epoch, step);
    return stub_send(rid);
}

/* A drafter peer of the stub broker: its routing id, name and incarnation. */
typedef struct stub_drafter {
    const char *rid, *name;
    uint64_t inc;
} stub_drafter;

/* d's Claim; the grant (may be NULL) on 0. */
static __attribute__((unused)) int stub_claim(const stub_drafter *d, wire_grant *g)
{
    stub_init(WIRE_CLAIM, WIRE_ROLE_DRAFTER, d->inc);
    int rc = stub_send(d->rid);
    if (!rc && g) *g = stub_rep.u.grant;
    return rc;
}

/* d's SlotRelease of lease. */
static __attribute__((unused)) int stub_release(const stub_drafter *d, uint64_t lease)
{
    stub_init(WIRE_SLOT_RELEASE, WIRE_ROLE_DRAFTER, d->inc);
    stub_req.u.lease_id = lease;
    return stub_send(d->rid);
}

/* stub_req as d's GroupJoin of group "g" reporting model step `step` and the failed epoch (0:
 * none); a caller may set more fields, then stub_group_join_send. */
static __attribute__((unused)) void stub_group_join_begin(const stub_drafter *d, uint64_t step,
                                                          uint64_t failed)
{
    stub_init(WIRE_GROUP_JOIN, WIRE_ROLE_DRAFTER, d->inc);
    snprintf(stub_req.u.join.group, sizeof stub_req.u.join.group, "g");
    stub_req.u.join.step = step;
    stub_req.u.join.failed_epoch = failed;
}

/* Sends the join stub_group_join_begin made (a caller may set more fields between): the view
 * (may be NULL) on 0. */
static __attribute__((unused)) int stub_group_join_send(const stub_drafter *d, wire_group_view *v)
{
    int rc = stub_send(d->rid);
    if (!rc && v) *v = stub_rep.u.view;
    return rc;
}

/* That join sent as it is: the view (may be NULL) on 0. */
static __attribute__((unused)) int stub_group_join(const stub_drafter *d, uint64_t step,
                                                   uint64_t failed, wire_group_view *v)
{
    stub_group_join_begin(d, step, failed);
    return stub_group_join_send(d, v);
}

/* d (rank 0) posts group "g"'s rendezvous id for epoch: WIRE_GROUP_ID_BYTES bytes of fill. */
static __attribute__((unused)) int stub_group_set_id(const stub_drafter *d, uint64_t epoch,
                                                     uint8_t fill)
{
    stub_init(WIRE_GROUP_SET_ID, WIRE_ROLE_DRAFTER, d->inc);
    snprintf(stub_req.u.set_id.group, sizeof stub_req.u.set_id.group, "g");
    stub_req.u.set_id.epoch = epoch;
    stub_req.u.set_id.id_len = WIRE_GROUP_ID_BYTES;
    memset(stub_req.u.set_id.id, fill, WIRE_GROUP_ID_BYTES);
    return stub_send(d->rid);
}

/* d's Ack of unit u at step. */
static __attribute__((unused)) int stub_ack(const stub_drafter *d, wire_unit u, uint64_t step)
{
    stub_init(WIRE_ACK, WIRE_ROLE_DRAFTER, d->inc);
    stub_req.u.ack.unit = u;
    stub_req.u.ack.step = step;
    return stub_send(d->rid);
}

static __attribute__((unused)) wire_status stub_status(void)
{
    stub_init(WIRE_STATUS_REQUEST, WIRE_ROLE_CTL, 99);
    CHECK_EQ_INT(stub_send("ctl-c-99"), 0);
    return stub_rep.u.status;
}

/* A PoolRegister request of a host pool with one bucket (<= 512 tokens, 1000 batches, one
 * epoch), to adjust before stub_send. */
static __attribute__((unused)) wire_pool *stub_pool_request(uint64_t inc, uint64_t pool_inc,
                                                            uint32_t n_slots)
{
    stub_init(WIRE_POOL_REGISTER, WIRE_ROLE_TARGET, inc);
    wire_pool *p = &stub_req.u.pool;
    p->pool_incarnation = pool_inc;
    p->backend = WIRE_BACKEND_HOST;
    snprintf(p->shm_name, sizeof p->shm_name, "/dflash-test-stub");
    p->slot_count = n_slots;
    p->slot_size = 4096;
    p->layout_version = 1;
    p->token_budget = 1024;
    p->n_buckets = 1;
    p->bucket_upper[0] = 512;
    p->bucket_share[0] = 1;
    p->bucket_batches[0] = 1000;
    p->epochs = 1;
    return p;
}

static __attribute__((unused)) void stub_pool(const char *rid, uint64_t inc, uint64_t pool_inc,
                                              uint32_t n_slots)
{
    stub_pool_request(inc, pool_inc, n_slots);
    CHECK_EQ_INT(stub_send(rid), 0);
}

static __attribute__((unused)) void stub_make_ready(const char *rid, uint64_t inc,
                                                    uint64_t pool_inc, int n)
{
    for (int i = 0; i < n; i++) {
        stub_init(WIRE_WORK_REQUEST, WIRE_ROLE_TARGET, inc);
        stub_req.u.pool_incarnation = pool_inc;
        CHECK_EQ_INT(stub_send(rid), 0);
        wire_work_unit wu = stub_rep.u.work;
        stub_init(WIRE_SLOT_READY, WIRE_ROLE_TARGET, inc);
        stub_req.u.ready = (wire_slot_ready){pool_inc, wu.slot, wu.unit, 100, 2};
        CHECK_EQ_INT(stub_send(rid), 0);
    }
}

static __attribute__((unused)) void stub_capture_log(void (*fn)(void), char *out, size_t cap)
{
    fflush(stderr);
    FILE *tmp = tmpfile();
    int saved = dup(2);
    CHECK(tmp && saved >= 0);
    if (!tmp || saved < 0) return;
    dup2(fileno(tmp), 2);
    fn();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(tmp);
    size_t n = fread(out, 1, cap - 1, tmp);
    out[n] = 0;
    fclose(tmp);
}

#endif
