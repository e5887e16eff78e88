/* test_broker_sync_liveness: a drafter whose JournalSync waits on the broker's fsync for longer
 * than the liveness window is not expired meanwhile (its client is held by the request and
 * cannot beat), and is expired as always once it is answered and then goes silent.
 *
 * A real broker (broker_thread.h: heartbeat 100 ms, liveness 3, a 300 ms window) with its
 * journal's fdatasync held by the test (held_sync.h). Drafter A sends JournalSync and sends
 * nothing more while the sync is held for 8 windows; drafter B beats and asks the status.
 * A's next request that needs its hello is answered (not "stale"), and once A is silent the
 * peer count drops and the same request is "stale".
 *
 * What a user would notice if it broke: with a --timeout-ms past the liveness window, a drafter
 * waiting on a slow disk before its checkpoint was expired, its batches handed to others, and
 * its next request answered "stale" (it registered again, its held batches trained twice).
 * Expiries are waited for (polled up to a deadline), never timed. */
#include "broker_thread.h"
#include "check.h"
#include "err.h"
#include "held_sync.h"
#include "test_files.h"
#include "log.h"
#include "wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static broker_thread bt;

static void send_drafter(void *sock, wire_type t, uint64_t inc, uint64_t rid)
{
    wire_msg m;
    wire_msg_init(&m, t, WIRE_ROLE_DRAFTER, inc, rid);
    if (t == WIRE_HELLO)
        snprintf(m.u.hello.name, sizeof m.u.hello.name, "d%llx", (unsigned long long)inc);
    if (t == WIRE_HEARTBEAT) m.u.sent_ms = 1;
    if (t == WIRE_CHECKPOINT_COMMITTED) m.u.step = rid; /* a step per request */
    broker_thread_send(sock, &m);
}

/* The request rid on sock answered with type t. */
static void expect(void *sock, uint64_t rid, wire_type t, wire_msg *r)
{
    CHECK_EQ_INT(broker_thread_recv(sock, 5000, r), 0);
    CHECK_EQ_INT(r->request_id, rid);
    CHECK_EQ_INT(r->type, t);
}

/* The broker's peer count, asked by B (which is heard by it). */
static uint32_t peers(void *b, uint64_t rid)
{
    wire_msg r;
    send_drafter(b, WIRE_STATUS_REQUEST, 0xb2, rid);
    expect(b, rid, WIRE_STATUS_REPLY, &r);
    return r.type == WIRE_STATUS_REPLY ? r.u.status.peers : 0;
}

int main(void)
{
    log_init("test", LOG_WARN);
    char dir[] = "/tmp/dflash-syncalive-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    queue_config cfg;
    broker_thread_config(&cfg, dir, "error");
    cfg.heartbeat_ms = 100;
    cfg.liveness = 3;
    int err = 0;
    CHECK(broker_thread_start(&bt, &cfg, held_sync, NULL, &err));
    if (!bt.b) CHECK_DONE();
    held_sync_release(false);

    void *zctx = zmq_ctx_new();
    void *a = broker_thread_dealer(zctx, cfg.endpoint, "drafter-a-1");
    void *b = broker_thread_dealer(zctx, cfg.endpoint, "drafter-b-2");
    wire_msg r;
    send_drafter(a, WIRE_HELLO, 0xa1, 1);
    expect(a, 1, WIRE_HELLO, &r);
    send_drafter(b, WIRE_HELLO, 0xb2, 1);
    expect(b, 1, WIRE_HELLO, &r);
    CHECK_EQ_INT(peers(b, 2), 2);

    /* A's JournalSync waits on a held fsync for 8 windows; B keeps beating */
    held_sync_hold();
    int synced = held_sync_entered();
    send_drafter(a, WIRE_JOURNAL_SYNC, 0xa1, 10);
    CHECK(held_sync_wait_entered(synced + 1));
    uint64_t rid = 100;
    for (int i = 0; i < 48; i++) {
        usleep(50 * 1000);
        send_drafter(b, WIRE_HEARTBEAT, 0xb2, rid);
        expect(b, rid++, WIRE_HEARTBEAT, &r);
    }
    printf("peers after 2.4 s of A waiting on the fsync: %u (2: A is not expired)\n",
           peers(b, rid++));

    /* answered, A is still registered: a request that needs its hello is not stale */
    held_sync_release(false);
    expect(a, 10, WIRE_OK, &r);
    send_drafter(a, WIRE_CHECKPOINT_COMMITTED, 0xa1, 11);
    expect(a, 11, WIRE_OK, &r);

    /* silent now, A is expired as always (B beats on) */
    uint32_t n = 2;
    for (int i = 0; i < 200 && n == 2; i++) {
        usleep(50 * 1000);
        n = peers(b, rid++);
    }
    CHECK(n < 2);
    send_drafter(a, WIRE_CHECKPOINT_COMMITTED, 0xa1, 12);
    CHECK_EQ_INT(broker_thread_recv(a, 5000, &r), 0);
    CHECK_EQ_INT(r.type, WIRE_ERROR);
    CHECK_EQ_INT(r.u.error.code, DFLASH_ESTALE);

    zmq_close(a);
    zmq_close(b);
    zmq_ctx_term(zctx);
    broker_thread_stop(&bt);
    CHECK_EQ_INT(test_rmtree(dir), 0);
    CHECK_DONE();
}
