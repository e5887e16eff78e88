/* test_broker_caps: the broker's peer table and its replies waiting for the journal are bounded
 * (the security audit's finding: a flood of hellos from new routing ids, or a peer pipelining
 * requests while an fsync is pending, grew the broker's memory without bound).
 *
 * What a user would notice if it broke: a broker reachable by one misbehaving or hostile client
 * grows until the machine swaps or the OOM killer takes it, and training stops.
 *   - Peer table (broker_dispatch without sockets, --max-peers 2): two peers register; a third
 *     hello from a new routing id is answered AGAIN, saying the table is full and naming
 *     --max-peers, and warned about once however many come (not once per hello); a ctl's hello
 *     and status need no entry and are answered; a restart of a registered name (a new
 *     incarnation from a new routing id) still replaces it at the cap; once a peer leaves, a
 *     new one registers. A hello under a live trainer's name that replaces nothing (another
 *     run: held) may take one entry over the cap, no more.
 *   - Deferred replies (a real broker on ipc:// in a thread, its journal's fdatasync held, raw
 *     DEALER sockets): a drafter sends a commit (its Ok waits for the fsync) and 20 heartbeats
 *     without waiting; once the fsync is let go it gets its 8 newest replies, in order, and
 *     nothing else (a client sends one request at a time: the older ones are answers it gave
 *     up on); with --max-peers 2 at most 16 replies wait in all: of 20 JournalSyncs from 20
 *     routing ids without a hello, the 4 oldest get no reply, the 16 newest their Ok.
 *   - Both are counted in status (hellos_refused_full, replies_dropped: defect, they were in
 *     the log only), so `dflash-ctl status` shows an operator what the caps refused. */
#include "check.h"
#include "broker_stub.h"
#include "broker_thread.h"
#include "err.h"
#include "held_sync.h"
#include "monotime.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <zmq.h>

/* --- the peer table ------------------------------------------------------------------------- */

static void max_two_peers(queue_config *cfg) { cfg->max_peers = 2; }

static int hello(const char *rid, wire_role role, uint64_t inc, const char *name)
{
    stub_init(WIRE_HELLO, role, inc);
    snprintf(stub_req.u.hello.name, sizeof stub_req.u.hello.name, "%s", name);
    return stub_send(rid);
}

/* A solo trainer's hello (it names its run) from routing id rid: drafter "d1". */
static int trainer_hello(const char *rid, uint64_t inc, uint64_t run)
{
    stub_init(WIRE_HELLO, WIRE_ROLE_DRAFTER, inc);
    snprintf(stub_req.u.hello.name, sizeof stub_req.u.hello.name, "d1");
    stub_req.u.hello.run_id = run;
    return stub_send(rid);
}

static void three_refused(void)
{
    CHECK_EQ_INT(hello("d3", WIRE_ROLE_DRAFTER, 33, "d3"), DFLASH_EAGAIN);
    CHECK_EQ_INT(hello("d4", WIRE_ROLE_DRAFTER, 34, "d4"), DFLASH_EAGAIN);
    CHECK_EQ_INT(hello("t5", WIRE_ROLE_TARGET, 35, "t5"), DFLASH_EAGAIN);
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

static void peer_table(void)
{
    stub_broker_new(max_two_peers);
    log_init("test", LOG_WARN); /* the cap's warning is what we look for */
    CHECK_EQ_INT(hello("t", WIRE_ROLE_TARGET, 11, "t"), 0);
    CHECK_EQ_INT(hello("d1", WIRE_ROLE_DRAFTER, 21, "d1"), 0);
    CHECK_EQ_INT(hello("d2", WIRE_ROLE_DRAFTER, 22, "d2"), DFLASH_EAGAIN);
    CHECK(strstr(stub_rep.u.error.message, "peer table is full") != NULL);
    CHECK(strstr(stub_rep.u.error.message, "--max-peers 2") != NULL);
    /* more refusals within the warning interval: counted, not each warned */
    static char said[8192];
    stub_capture_log(three_refused, said, sizeof said);
    CHECK_EQ_INT(count(said, "peer table is full"), 0);
    /* ctl sessions keep no entry: still answered, and the table still holds two; status counts
     * the four hellos refused (the log said one) */
    CHECK_EQ_INT(hello("ctl-c-99", WIRE_ROLE_CTL, 99, "ctl"), 0);
    wire_status s = stub_status();
    CHECK_EQ_INT(s.peers, 2);
    CHECK_EQ_INT(s.hellos_refused_full, 4);
    CHECK_EQ_INT(s.replies_dropped, 0);
    CHECK_EQ_INT(s.key_refusals, 0);
    /* a restart of d1 (new incarnation, new routing id) takes its place at the cap */
    CHECK_EQ_INT(hello("d1b", WIRE_ROLE_DRAFTER, 23, "d1"), 0);
    stub_init(WIRE_CLAIM, WIRE_ROLE_DRAFTER, 21);
    CHECK_EQ_INT(stub_send("d1"), DFLASH_ESTALE);
    /* the target leaves: its entry goes, a new peer registers */
    stub_pool("t", 11, 111, 4);
    stub_init(WIRE_POOL_LEAVE, WIRE_ROLE_TARGET, 11);
    stub_req.u.pool_incarnation = 111;
    CHECK_EQ_INT(stub_send("t"), 0);
    CHECK_EQ_INT(hello("d2", WIRE_ROLE_DRAFTER, 22, "d2"), 0);
    stub_broker_free();

    /* at the cap, drafters of other runs under a live trainer's name: the first is let through
     * (held: it may be the trainer's restart), its entry one over the cap; no more after it */
    stub_broker_new(max_two_peers);
    CHECK_EQ_INT(hello("t", WIRE_ROLE_TARGET, 11, "t"), 0);
    CHECK_EQ_INT(trainer_hello("d1", 21, 0xaaa), 0);
    CHECK_EQ_INT(trainer_hello("d1x", 24, 0xbbb), DFLASH_EAGAIN);
    CHECK(strstr(stub_rep.u.error.message, "peer table is full") == NULL);
    CHECK_EQ_INT(trainer_hello("d1y", 25, 0xccc), DFLASH_EAGAIN);
    CHECK(strstr(stub_rep.u.error.message, "peer table is full") != NULL);
    CHECK_EQ_INT(stub_status().hellos_refused_full, 1); /* d1y's: d1x's hold is no refusal */
    stub_broker_free();
}

static void first_refusal_warned(void)
{
    stub_broker_new(max_two_peers);
    log_init("test", LOG_WARN);
    CHECK_EQ_INT(hello("t", WIRE_ROLE_TARGET, 11, "t"), 0);
    CHECK_EQ_INT(hello("d1", WIRE_ROLE_DRAFTER, 21, "d1"), 0);
    three_refused();
    stub_broker_free();
}

/* --- deferred replies ----------------------------------------------------------------------- */

static void send_msg(void *sock, wire_type t, uint64_t inc, uint64_t rid)
{
    wire_msg m;
    wire_msg_init(&m, t, WIRE_ROLE_DRAFTER, inc, rid);
    if (t == WIRE_HELLO) snprintf(m.u.hello.name, sizeof m.u.hello.name, "a");
    if (t == WIRE_CHECKPOINT_COMMITTED) m.u.step = 4;
    if (t == WIRE_HEARTBEAT) m.u.sent_ms = 1;
    broker_thread_send(sock, &m);
}

enum { N_PIPELINED = 20, N_SYNCERS = 20, MALFORMED_ID = 500 };

static void deferred_replies(void)
{
    char dir[] = "/tmp/dflash-caps-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    queue_config cfg;
    broker_thread_config(&cfg, dir, "error");
    cfg.liveness = 60;
    cfg.max_peers = 2; /* 16 deferred replies in all */
    broker_thread bt;
    int err = 0;
    held_sync_release(false);
    CHECK(broker_thread_start(&bt, &cfg, held_sync, NULL, &err));
    if (!bt.b) return;
    void *zctx = zmq_ctx_new();
    void *a = broker_thread_dealer(zctx, cfg.endpoint, "drafter-a-1");
    void *c = broker_thread_dealer(zctx, cfg.endpoint, "ctl-c-2");
    wire_msg r;
    send_msg(a, WIRE_HELLO, 0xa1, 1);
    CHECK_EQ_INT(broker_thread_recv(a, 5000, &r), 0);
    CHECK_EQ_INT(r.type, WIRE_HELLO);

    /* a commit whose fsync is held, then heartbeats without waiting, and last a malformed
     * request (a reply type), whose count in status tells that the broker has read them all */
    held_sync_hold();
    int synced = held_sync_entered();
    send_msg(a, WIRE_CHECKPOINT_COMMITTED, 0xa1, 10);
    for (int i = 0; i < N_PIPELINED; i++) send_msg(a, WIRE_HEARTBEAT, 0xa1, 100 + (uint64_t)i);
    send_msg(a, WIRE_OK, 0xa1, MALFORMED_ID);
    CHECK(held_sync_wait_entered(synced + 1));
    uint64_t t_end = monotime_ms() + 10000;
    for (;;) {
        send_msg(c, WIRE_STATUS_REQUEST, 0xc2, 1);
        CHECK_EQ_INT(broker_thread_recv(c, 5000, &r), 0);
        if (r.type != WIRE_STATUS_REPLY || r.u.status.malformed >= 1) break;
        if (monotime_ms() > t_end) break;
    }
    CHECK_EQ_INT(r.u.status.malformed, 1);
    /* of its 22 replies waiting (the commit's, 20 heartbeats', the malformed one's) the 14
     * oldest were dropped, which status counts */
    CHECK_EQ_INT(r.u.status.replies_dropped, 14);
    CHECK_EQ_INT(r.u.status.hellos_refused_full, 0);
    CHECK_EQ_INT(broker_thread_recv(a, 50, &r), -1); /* all held back */
    held_sync_release(false);
    /* the 8 newest, in order: heartbeats 113..119, then the malformed request's Error */
    for (int i = N_PIPELINED - 7; i < N_PIPELINED; i++) {
        CHECK_EQ_INT(broker_thread_recv(a, 5000, &r), 0);
        CHECK_EQ_INT(r.type, WIRE_HEARTBEAT);
        CHECK_EQ_INT(r.request_id, 100 + (uint64_t)i);
    }
    CHECK_EQ_INT(broker_thread_recv(a, 5000, &r), 0);
    CHECK_EQ_INT(r.type, WIRE_ERROR);
    CHECK_EQ_INT(r.request_id, MALFORMED_ID);
    CHECK_EQ_INT(broker_thread_recv(a, 200, &r), -1);
    /* the session goes on: the next request is answered at once */
    send_msg(a, WIRE_HEARTBEAT, 0xa1, 11);
    CHECK_EQ_INT(broker_thread_recv(a, 5000, &r), 0);
    CHECK_EQ_INT(r.request_id, 11);

    /* JournalSyncs from routing ids without a hello, one after another (each followed on its
     * socket by a status request, answered at once: its sync was read before) */
    held_sync_hold();
    synced = held_sync_entered();
    void *x[N_SYNCERS];
    for (int i = 0; i < N_SYNCERS; i++) {
        char id[32];
        snprintf(id, sizeof id, "drafter-x-%d", i);
        x[i] = broker_thread_dealer(zctx, cfg.endpoint, id);
        send_msg(x[i], WIRE_JOURNAL_SYNC, 0x100 + (uint64_t)i, 40);
        send_msg(x[i], WIRE_STATUS_REQUEST, 0x100 + (uint64_t)i, 41);
        CHECK_EQ_INT(broker_thread_recv(x[i], 5000, &r), 0);
        CHECK_EQ_INT(r.request_id, 41);
    }
    CHECK(held_sync_wait_entered(synced + 1));
    held_sync_release(false);
    int dropped = 4; /* 20 - 16: the oldest of all */
    for (int i = dropped; i < N_SYNCERS; i++) {
        CHECK_EQ_INT(broker_thread_recv(x[i], 5000, &r), 0);
        CHECK_EQ_INT(r.type, WIRE_OK);
        CHECK_EQ_INT(r.request_id, 40);
    }
    for (int i = 0; i < dropped; i++) CHECK_EQ_INT(broker_thread_recv(x[i], 100, &r), -1);
    send_msg(c, WIRE_STATUS_REQUEST, 0xc2, 2);
    CHECK_EQ_INT(broker_thread_recv(c, 5000, &r), 0);
    CHECK_EQ_INT(r.u.status.replies_dropped, 14 + dropped);
    for (int i = 0; i < N_SYNCERS; i++) zmq_close(x[i]);
    zmq_close(a);
    zmq_close(c);
    zmq_ctx_term(zctx);
    broker_thread_stop(&bt);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK_EQ_INT(system(cmd), 0);
}

int main(void)
{
    static char said[8192];
    stub_capture_log(first_refusal_warned, said, sizeof said);
    CHECK_EQ_INT(count(said, "peer table is full"), 1);
    if (count(said, "peer table is full") != 1) fprintf(stderr, "log: %s\n", said);
    peer_table();
    deferred_replies();
    CHECK_DONE();
}
