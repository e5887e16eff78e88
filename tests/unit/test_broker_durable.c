/* test_broker_durable: the broker's loop never waits for the disk, and a reply that promises
 * durability is not sent before its journal record is on disk.
 *
 * A real broker (sockets on ipc:// in a temp dir, journal in the same dir) runs its libuv loop on
 * a second thread; its journal's fdatasync is replaced by a hook that blocks until the test lets
 * it go. Two drafters talk to it over raw DEALER sockets. Drafter A sends CheckpointCommitted and
 * then a Heartbeat without waiting; while the commit's fsync is held, drafter B's Heartbeat is
 * answered (the loop is not blocked) and A has no reply. Once the fsync is let go, A gets the
 * commit's Ok and then its Heartbeat echo, in that order. Finally a failing fsync turns the next
 * commit's reply into Error IO instead of a false Ok, and the broker's status names the failure
 * (journal_error), empty while the journal is healthy. While the disk stays full the broker's
 * retries of a rewrite from memory fail too; once syncs succeed again the journal heals
 * (journal_error empty, commits answered Ok), and a broker restarted on it replays the commits
 * made after the failure. `dflash-ctl pause` (a steering record, steering.h) is answered like a
 * commit: Ok only once durable, Error IO when the journal failed (the resume sent then is in
 * force, and is in the journal once it is healed). JournalSync, a drafter's durability barrier
 * (no hello needed), makes the writer fdatasync and is answered Ok only after it, Error IO once
 * the journal failed. A GroupJoin that creates its group (a REWIND record) is answered Error IO
 * when the record fails (so is a second member's join while it is being written), and the
 * group's next joins AGAIN until the journal heals; a broker stopped while its journal fails
 * rewrites it from memory at the stop: one started on it then has the commit made during the
 * failure. */
#include "broker.h"
#include "broker_thread.h"
#include "check.h"
#include "config.h"
#include "err.h"
#include "log.h"
#include "policy.h"
#include "wire.h"
#include "held_sync.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>
#include <zmq.h>

static broker_thread bt;

static void send_as(void *sock, wire_role role, wire_type t, uint64_t inc, uint64_t rid,
                    uint64_t step)
{
    wire_msg m;
    wire_msg_init(&m, t, role, inc, rid);
    if (t == WIRE_HELLO) snprintf(m.u.hello.name, sizeof m.u.hello.name, "d%llx",
                                  (unsigned long long)inc);
    if (t == WIRE_CHECKPOINT_COMMITTED) m.u.step = step;
    if (t == WIRE_HEARTBEAT) m.u.sent_ms = 1;
    broker_thread_send(sock, &m);
}

static void send_msg(void *sock, wire_type t, uint64_t inc, uint64_t rid, uint64_t step)
{
    send_as(sock, WIRE_ROLE_DRAFTER, t, inc, rid, step);
}

/* The broker's journal_error, asked as peer s (request id rid). */
static void journal_error_of(void *s, uint64_t rid, char *out, size_t len)
{
    wire_msg r;
    send_msg(s, WIRE_STATUS_REQUEST, 0xb2, rid, 0);
    CHECK_EQ_INT(broker_thread_recv(s, 5000, &r), 0);
    CHECK_EQ_INT(r.type, WIRE_STATUS_REPLY);
    snprintf(out, len, "%s", r.type == WIRE_STATUS_REPLY ? r.u.status.journal_error : "?");
}

int main(void)
{
    log_init("test", LOG_WARN);
    char dir[] = "/tmp/dflash-durable-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    queue_config cfg;
    broker_thread_config(&cfg, dir, "warn");
    cfg.heartbeat_ms = 1000;
    cfg.liveness = 60;
    cfg.journal_retry_ms = 50;
    int err = 0;
    CHECK(broker_thread_start(&bt, &cfg, held_sync, NULL, &err));
    if (!bt.b) CHECK_DONE();

    void *zctx = zmq_ctx_new();
    void *a = broker_thread_dealer(zctx, cfg.endpoint, "drafter-a-1");
    void *b = broker_thread_dealer(zctx, cfg.endpoint, "drafter-b-2");
    void *c = broker_thread_dealer(zctx, cfg.endpoint, "ctl-c-3");
    wire_msg r;
    send_msg(a, WIRE_HELLO, 0xa1, 1, 0);
    CHECK_EQ_INT(broker_thread_recv(a, 5000, &r), 0);
    CHECK_EQ_INT(r.type, WIRE_HELLO);
    send_msg(b, WIRE_HELLO, 0xb2, 1, 0);
    CHECK_EQ_INT(broker_thread_recv(b, 5000, &r), 0);
    CHECK_EQ_INT(r.type, WIRE_HELLO);

    /* a healthy journal: no journal_error */
    send_msg(b, WIRE_STATUS_REQUEST, 0xb2, 19, 0);
    CHECK_EQ_INT(broker_thread_recv(b, 5000, &r), 0);
    CHECK_EQ_INT(r.type, WIRE_STATUS_REPLY);
    CHECK_EQ_INT(r.u.status.journal_error[0], 0);

    /* A: commit, then a heartbeat, pipelined; the commit's fsync is held */
    send_msg(a, WIRE_CHECKPOINT_COMMITTED, 0xa1, 10, 4);
    send_msg(a, WIRE_HEARTBEAT, 0xa1, 11, 0);
    CHECK(held_sync_wait_entered(1));
    /* the loop still serves B while the fsync is held */
    send_msg(b, WIRE_HEARTBEAT, 0xb2, 20, 0);
    CHECK_EQ_INT(broker_thread_recv(b, 5000, &r), 0);
    CHECK_EQ_INT(r.type, WIRE_HEARTBEAT);
    CHECK_EQ_INT(r.request_id, 20);
    /* B's answer left after A's commit was handled: A's reply must still be held back */
    CHECK_EQ_INT(broker_thread_recv(a, 100, &r), -1);

    /* the record is durable: A gets the commit's Ok, then its heartbeat, in order */
    held_sync_release(false);
    CHECK_EQ_INT(broker_thread_recv(a, 5000, &r), 0);
    CHECK_EQ_INT(r.type, WIRE_OK);
    CHECK_EQ_INT(r.request_id, 10);
    CHECK_EQ_INT(broker_thread_recv(a, 5000, &r), 0);
    CHECK_EQ_INT(r.type, WIRE_HEARTBEAT);
    CHECK_EQ_INT(r.request_id, 11);

    /* `dflash-ctl pause` is answered once its record is durable (a restart stays paused) */
    held_sync_hold();
    int synced = held_sync_entered();
    send_as(c, WIRE_ROLE_CTL, WIRE_PAUSE, 0xc3, 30, 0);
    CHECK(held_sync_wait_entered(synced + 1));
    CHECK_EQ_INT(broker_thread_recv(c, 100, &r), -1);
    held_sync_release(false);
    CHECK_EQ_INT(broker_thread_recv(c, 5000, &r), 0);
    CHECK_EQ_INT(r.type, WIRE_OK);
    CHECK_EQ_INT(r.request_id, 30);

    /* JournalSync (a drafter's durability barrier before a checkpoint), sent without a hello:
     * the writer fdatasyncs for it though no record of its own asks to be synced, and the Ok
     * comes only after that sync */
    held_sync_hold();
    synced = held_sync_entered();
    void *d = broker_thread_dealer(zctx, cfg.endpoint, "drafter-d-4");
    send_msg(d, WIRE_JOURNAL_SYNC, 0xd4, 40, 0);
    CHECK(held_sync_wait_entered(synced + 1));
    CHECK_EQ_INT(broker_thread_recv(d, 100, &r), -1);
    held_sync_release(false);
    CHECK_EQ_INT(broker_thread_recv(d, 5000, &r), 0);
    CHECK_EQ_INT(r.type, WIRE_OK);
    CHECK_EQ_INT(r.request_id, 40);

    /* a commit whose fsync fails is answered Error IO, not Ok */
    held_sync_release(true);
    send_msg(a, WIRE_CHECKPOINT_COMMITTED, 0xa1, 12, 8);
    CHECK_EQ_INT(broker_thread_recv(a, 5000, &r), 0);
    CHECK_EQ_INT(r.type, WIRE_ERROR);
    CHECK_EQ_INT(r.request_id, 12);
    CHECK_EQ_INT(r.u.error.code, DFLASH_EIO);
    /* later commits fail at once (the journal is broken), and the broker keeps serving */
    send_msg(a, WIRE_CHECKPOINT_COMMITTED, 0xa1, 13, 9);
    CHECK_EQ_INT(broker_thread_recv(a, 5000, &r), 0);
    CHECK_EQ_INT(r.type, WIRE_ERROR);
    CHECK_EQ_INT(r.u.error.code, DFLASH_EIO);
    send_msg(b, WIRE_HEARTBEAT, 0xb2, 21, 0);
    CHECK_EQ_INT(broker_thread_recv(b, 5000, &r), 0);
    CHECK_EQ_INT(r.request_id, 21);
    /* so is a JournalSync: its records cannot be made durable */
    send_msg(d, WIRE_JOURNAL_SYNC, 0xd4, 41, 0);
    CHECK_EQ_INT(broker_thread_recv(d, 5000, &r), 0);
    CHECK_EQ_INT(r.type, WIRE_ERROR);
    CHECK_EQ_INT(r.request_id, 41);
    CHECK_EQ_INT(r.u.error.code, DFLASH_EIO);
    /* a resume takes effect but its record cannot be written: Error IO, not a false Ok */
    send_as(c, WIRE_ROLE_CTL, WIRE_RESUME, 0xc3, 31, 0);
    CHECK_EQ_INT(broker_thread_recv(c, 5000, &r), 0);
    CHECK_EQ_INT(r.type, WIRE_ERROR);
    CHECK_EQ_INT(r.u.error.code, DFLASH_EIO);
    /* and says so in its status (journal_error: the reason), where it used to look healthy;
     * before the failure the field is empty (checked on a status taken first, below) */
    send_msg(b, WIRE_STATUS_REQUEST, 0xb2, 22, 0);
    CHECK_EQ_INT(broker_thread_recv(b, 5000, &r), 0);
    CHECK_EQ_INT(r.type, WIRE_STATUS_REPLY);
    printf("status after the failed fsync: journal_error \"%s\"\n", r.u.status.journal_error);
    CHECK(strstr(r.u.status.journal_error, "queue.journal") &&
          strstr(r.u.status.journal_error, "fdatasync failed"));

    /* the broker retries a rewrite from memory; with the disk still full those fail */
    CHECK(held_sync_wait_entered(held_sync_entered() + 2));
    char jerr[WIRE_MAX_TEXT];
    journal_error_of(b, 23, jerr, sizeof jerr);
    CHECK(jerr[0] != 0);
    /* space returns: the next retry heals the journal, and status says so */
    held_sync_release(false);
    for (int i = 0; i < 100 && jerr[0]; i++) {
        usleep(50 * 1000);
        journal_error_of(b, 24 + (uint64_t)i, jerr, sizeof jerr);
    }
    CHECK_EQ_INT(jerr[0], 0);
    /* records are durable again: a commit is answered Ok */
    send_msg(a, WIRE_CHECKPOINT_COMMITTED, 0xa1, 14, 10);
    CHECK_EQ_INT(broker_thread_recv(a, 5000, &r), 0);
    CHECK_EQ_INT(r.type, WIRE_OK);
    CHECK_EQ_INT(r.request_id, 14);

    zmq_close(a);
    zmq_close(b);
    zmq_close(c);
    zmq_close(d);
    zmq_ctx_term(zctx);
    broker_thread_stop(&bt);

    /* a broker restarted on the journal replays the state made during and after the failure */
    cfg.endpoint[0] = cfg.pub_endpoint[0] = '\0';
    uv_loop_t loop;
    uv_loop_init(&loop);
    broker *again = broker_new(&loop, &cfg, &err);
    CHECK(again != NULL);
    if (again) {
        static wire_status st;
        broker_status(again, &st);
        CHECK_EQ_INT(st.committed_step, 10);
        CHECK_EQ_INT(st.journal_error[0], 0);
        CHECK_EQ_INT(st.state, POLICY_RUNNING); /* the resume, healed into the journal */
    }
    broker_destroy(&again);
    uv_run(&loop, UV_RUN_DEFAULT);

    /* The journal fails again, with no retry of the rewrite before the stop */
    broker_thread_config(&cfg, dir, "warn");
    cfg.heartbeat_ms = 1000;
    cfg.liveness = 60;
    cfg.journal_retry_ms = 3600000;
    CHECK(broker_thread_start(&bt, &cfg, held_sync, NULL, &err));
    if (!bt.b) CHECK_DONE();
    zctx = zmq_ctx_new();
    void *e = broker_thread_dealer(zctx, cfg.endpoint, "drafter-e-5");
    send_msg(e, WIRE_HELLO, 0xe5, 50, 0);
    CHECK_EQ_INT(broker_thread_recv(e, 5000, &r), 0);
    CHECK_EQ_INT(r.type, WIRE_HELLO);
    void *f = broker_thread_dealer(zctx, cfg.endpoint, "drafter-f-6");
    send_msg(f, WIRE_HELLO, 0xf6, 60, 0);
    CHECK_EQ_INT(broker_thread_recv(f, 5000, &r), 0);
    CHECK_EQ_INT(r.type, WIRE_HELLO);
    /* a join that creates its group rewinds to its step (a REWIND record, fsynced): while its
     * fsync is held, neither it nor a second member's join is answered; when it fails, both
     * get Error IO, as ResumeFrom does (they were answered with views) */
    held_sync_hold();
    synced = held_sync_entered();
    wire_msg m, mf;
    wire_msg_init(&m, WIRE_GROUP_JOIN, WIRE_ROLE_DRAFTER, 0xe5, 51);
    snprintf(m.u.join.group, sizeof m.u.join.group, "g");
    m.u.join.step = 10;
    broker_thread_send(e, &m);
    CHECK(held_sync_wait_entered(synced + 1));
    mf = m;
    mf.incarnation = 0xf6;
    mf.request_id = 61;
    broker_thread_send(f, &mf);
    CHECK_EQ_INT(broker_thread_recv(e, 100, &r), -1);
    CHECK_EQ_INT(broker_thread_recv(f, 100, &r), -1);
    held_sync_release(true);
    CHECK_EQ_INT(broker_thread_recv(e, 5000, &r), 0);
    CHECK_EQ_INT(r.type, WIRE_ERROR);
    CHECK_EQ_INT(r.request_id, 51);
    CHECK_EQ_INT(r.type == WIRE_ERROR ? r.u.error.code : 0, DFLASH_EIO);
    CHECK_EQ_INT(broker_thread_recv(f, 5000, &r), 0);
    CHECK_EQ_INT(r.request_id, 61);
    CHECK_EQ_INT(r.type == WIRE_ERROR ? r.u.error.code : 0, DFLASH_EIO);
    /* the group exists in memory: the drafter's next join, as a second member's, waits for the
     * journal to heal (it got a view, and the group trained on the rewind in memory only) */
    m.request_id = 53;
    broker_thread_send(e, &m);
    CHECK_EQ_INT(broker_thread_recv(e, 5000, &r), 0);
    CHECK_EQ_INT(r.type == WIRE_ERROR ? r.u.error.code : 0, DFLASH_EAGAIN);
    CHECK(r.type == WIRE_ERROR && strstr(r.u.error.message, "not on disk"));
    /* a commit made while it fails is in memory only */
    send_msg(e, WIRE_CHECKPOINT_COMMITTED, 0xe5, 52, 11);
    CHECK_EQ_INT(broker_thread_recv(e, 5000, &r), 0);
    CHECK_EQ_INT(r.type == WIRE_ERROR ? r.u.error.code : 0, DFLASH_EIO);
    /* the disk takes writes again; the stop rewrites the journal from memory (a stop lost the
     * commit: committed_step 10 below) */
    held_sync_release(false);
    zmq_close(e);
    zmq_close(f);
    zmq_ctx_term(zctx);
    broker_thread_stop(&bt);
    cfg.endpoint[0] = cfg.pub_endpoint[0] = '\0';
    again = broker_new(&loop, &cfg, &err);
    CHECK(again != NULL);
    if (again) {
        static wire_status st;
        broker_status(again, &st);
        CHECK_EQ_INT(st.committed_step, 11);
        CHECK_EQ_INT(st.journal_error[0], 0);
    }
    broker_destroy(&again);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK_EQ_INT(system(cmd), 0);
    CHECK_DONE();
}
