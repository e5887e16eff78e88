/* worker_session: see worker_session.h for what a session owns and who calls it.
 *
 * Start-up order (importer, staging, client, heartbeat) and its reverse in destroy: the
 * heartbeat thread (heartbeat.h, with its watchdog) uses the client, so it is joined before the
 * client goes. A failed step of
 * new() undoes the earlier ones through destroy, which accepts a half-built session.
 * The progress window keeps a snapshot of the loop's stats (`last`) and when it was taken.
 */
#include "worker_session.h"

#include "broker_silence.h"
#include "err.h"
#include "heartbeat.h"
#include "log.h"
#include "monotime.h"
#include "pool.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct worker_session {
    const worker_loop_config *cfg;
    worker_stats *st; /* the loop's, borrowed */
    pool_importer *imp;
    void *staging;
    client *client;
    heartbeat *hb;
    worker_stats last; /* progress window: the stats when it started ... */
    double last_t;     /* ... and when */
    int64_t copy_fail_run; /* slot copies failed since the last that succeeded */
    volatile sig_atomic_t *stop; /* the daemon's, borrowed */
    bool broker_lost;            /* a request after the stop went unanswered */
    char refusal[WIRE_MAX_TEXT]; /* the broker's words when it refused us for good; "" none */
    uint64_t refusal_run;        /* the run whose live process replaced us (0: none said) */
    /* periodic commit reports (worker_session_commit_due / _noted) */
    double commit_retry_at;   /* monotime_s before which no report is sent (after a failure) */
    double commit_warned_at;  /* when a failed report was last said (0: not since the last ok) */
    uint64_t commit_failures; /* reports failed since the last that succeeded */
    /* the durability barrier (worker_session_offer_barrier) */
    worker_consumer *barrier_cons; /* given the barrier; taken back at destroy */
    bool barrier_unsupported;      /* the broker predates JournalSync: said once, not asked */
    double barrier_warned_at;      /* when a failed barrier was last said (0: never) */
};

#define SAY_AGAIN_S 60.0 /* a repeated failure is said at most once a minute */

static bool has_curve_keys(const worker_loop_config *cfg)
{
    return (cfg->curve_server_key && *cfg->curve_server_key) || (cfg->curve_key && *cfg->curve_key);
}

/* The client with the config's timeout and CURVE keys. 0 or a negative code, logged
 * (DFLASH_ECONFIG: the key files cannot be used). */
static int open_client(worker_session *s)
{
    const worker_loop_config *cfg = s->cfg;
    s->client = client_new(cfg->endpoint, WIRE_ROLE_DRAFTER, cfg->name);
    if (!s->client) {
        LOG_ERROR("cannot create a client for %s", cfg->endpoint);
        return DFLASH_EZMQ;
    }
    client_set_timeout(s->client, (int)cfg->timeout_ms);
    if (!has_curve_keys(cfg)) return 0;
    if (client_set_curve_files(s->client, cfg->curve_server_key, cfg->curve_key) == 0) return 0;
    LOG_ERROR("CURVE keys: %s", client_last_error(s->client));
    return DFLASH_ECONFIG; /* the operator's key files: bad configuration, exit 2 */
}

/* The importer, the staging buffer and the client. 0 or a negative code, logged. */
static int open_parts(worker_session *s)
{
    const worker_loop_config *cfg = s->cfg;
    int err = 0;
    s->imp = pool_importer_new(cfg->backend, cfg->device, &err);
    if (!s->imp) {
        LOG_ERROR("cannot create the %s pool importer on device %d: %s",
                  pool_backend_name(cfg->backend), cfg->device, err_str(err));
        return err < 0 ? err : DFLASH_ENOMEM;
    }
    s->staging = pool_staging_alloc(cfg->backend, cfg->device, cfg->layout.slot_bytes);
    if (!s->staging) {
        LOG_ERROR("cannot allocate a %zu-byte staging buffer", cfg->layout.slot_bytes);
        return DFLASH_ENOMEM;
    }
    return open_client(s);
}

worker_session *worker_session_new(const worker_loop_config *cfg, worker_stats *st,
                                   volatile sig_atomic_t *stop, int *err)
{
    worker_session *s = calloc(1, sizeof *s);
    if (!s) {
        LOG_ERROR("cannot allocate the drafter's session");
        *err = DFLASH_ENOMEM;
        return NULL;
    }
    s->cfg = cfg;
    s->st = st;
    s->stop = stop;
    *err = open_parts(s);
    if (*err) {
        worker_session_destroy(&s);
        return NULL;
    }
    s->hb = heartbeat_start(s->client, cfg->stall_exit_s, "the drafter's loop");
    s->last = *st;
    s->last_t = monotime_s();
    return s;
}

void worker_session_destroy(worker_session **sp)
{
    if (!sp || !*sp) return;
    worker_session *s = *sp;
    if (s->barrier_cons) s->barrier_cons->set_barrier(s->barrier_cons->ctx, NULL, NULL);
    heartbeat_stop(&s->hb);
    client_destroy(&s->client);
    pool_staging_free(s->cfg->backend, s->cfg->device, &s->staging);
    pool_importer_destroy(&s->imp);
    free(s);
    *sp = NULL;
}

client *worker_session_client(const worker_session *s)
{
    return s->client;
}

int worker_session_hello(worker_session *s, const wire_unit *held, uint32_t n_held,
                         const char *note)
{
    heartbeat_alive(s->hb); /* waiting for a broker (retried hellos) is no hang */
    int rc = client_hello(s->client, held, n_held);
    if (rc == DFLASH_EEXISTS || rc == DFLASH_EDENIED) worker_session_note_refusal(s);
    if (rc < 0) return rc;
    s->st->registrations++;
    LOG_INFO("registered with broker %016llx%s",
             (unsigned long long)client_broker_incarnation(s->client), note);
    return 0;
}

int worker_session_await_broker(const worker_session *s, double since)
{
    const worker_loop_config *cfg = s->cfg;
    if (cfg->broker_wait_ms > 0 && (monotime_s() - since) * 1000 > cfg->broker_wait_ms) {
        broker_silence_give_up(cfg->endpoint, monotime_s() - since, (long long)cfg->broker_wait_ms,
                               (long long)cfg->timeout_ms, client_last_answered(s->client),
                               client_last_error(s->client));
        return DFLASH_EPEER;
    }
    monotime_sleep_ms(100);
    return 0;
}

/* Where the grant's slot is, as the importer names it. */
static pool_slot_ref grant_slot_ref(const wire_grant *g)
{
    pool_slot_ref ref = {.backend = g->backend == WIRE_BACKEND_CUDA ? POOL_CUDA : POOL_HOST,
                         .incarnation = g->pool_incarnation, .slot = g->slot, .offset = g->offset,
                         .bytes = g->size, .device = g->device};
    snprintf(ref.shm_name, sizeof ref.shm_name, "%s", g->shm_name);
    snprintf(ref.pool_name, sizeof ref.pool_name, "%s", g->pool_name);
    snprintf(ref.gpu_bus_id, sizeof ref.gpu_bus_id, "%s", g->gpu_bus_id);
    memcpy(ref.mem_handle, g->mem_handle, POOL_HANDLE_BYTES);
    memcpy(ref.event_handle, g->event_handle, POOL_HANDLE_BYTES);
    return ref;
}

/* The bytes of the slot that g's batch uses: never more than the slot or the grant holds. */
static uint64_t grant_used_bytes(const slot_layout *l, const wire_grant *g)
{
    uint64_t bytes = g->n_tokens <= l->token_budget ? slot_used_bytes(l, g->n_tokens)
                                                    : l->slot_bytes;
    if (bytes > g->size) bytes = g->size;
    if (bytes > l->slot_bytes) bytes = l->slot_bytes;
    return bytes;
}

int worker_session_copy(worker_session *s, const wire_grant *g, double *secs)
{
    pool_slot_ref ref = grant_slot_ref(g);
    uint64_t bytes = grant_used_bytes(&s->cfg->layout, g);
    double t0 = monotime_s();
    int rc = pool_importer_attach_slot(s->imp, &ref);
    if (rc == 0)
        rc = pool_copy_start(s->imp, ref.incarnation, ref.slot, ref.offset, bytes, s->staging);
    if (rc == 0) rc = pool_copy_wait(s->imp);
    if (rc < 0) {
        /* the exporter is gone (shm removed) or the grant is bad */
        pool_importer_forget(s->imp, ref.incarnation);
        s->copy_fail_run++;
        s->st->copy_failures++;
        return rc;
    }
    s->copy_fail_run = 0;
    double dt = monotime_s() - t0;
    s->st->copy_s += dt;
    s->st->bytes_copied += bytes;
    if (secs) *secs = dt;
    worker_session_close_stale_pools(s);
    return 0;
}

int worker_session_check_layout(worker_session *s, const worker_consumer *cons,
                                const wire_grant *g)
{
    const slot_layout *want = cons->layout ? cons->layout(cons->ctx) : &s->cfg->layout;
    slot_header h;
    if (pool_staging_read(s->cfg->backend, &h, s->staging, sizeof h) < 0)
        return 0; /* the consumer reads it again, and says what fails */
    char why[400] = "";
    if (slot_header_check(&h, want, NULL, why, sizeof why) != DFLASH_EMISMATCH) return 0;
    LOG_ERROR("slot %u of pool %s (%016llx), batch (%u, %u, %llu), was written for another slot "
              "layout than this drafter reads: %s. The target and this drafter disagree (another "
              "model, or other --layers, --capture-layers, --token-budget or --max-seqs): "
              "restart the target with the run's model and options, or this drafter "
              "with the target's. The slot goes back unread (the batch is not at fault: back to "
              "to-do, not counted against it)", g->slot, g->pool_name,
              (unsigned long long)g->pool_incarnation, g->unit.epoch, g->unit.bucket,
              (unsigned long long)g->unit.index, why);
    return DFLASH_ECONFIG;
}

void worker_session_alive(worker_session *s) { heartbeat_alive(s->hb); }

void worker_session_close_stale_pools(worker_session *s)
{
    pool_importer_close_stale(s->imp, POOL_IMPORT_IDLE_MS);
}

bool worker_session_copy_hopeless(const worker_session *s, int last_rc)
{
    int64_t limit = s->cfg->max_copy_failures;
    if (limit > 0 && last_rc == DFLASH_EPEER) return true; /* no peer access: pool_reach said so */
    if (limit <= 0 || s->copy_fail_run < limit) return false;
    LOG_ERROR("no slot could be copied in %lld grants in a row (the last: %s); this drafter "
              "cannot map the target's slots: it must run on the target's host in its IPC "
              "namespace (deploy/docker-compose.yml joins the namespaces service's) and, on the "
              "cuda backend, on a GPU that can reach the target's (the same device or peer "
              "access). Giving up (--max-copy-failures %lld)",
              (long long)s->copy_fail_run, err_str(last_rc), (long long)limit);
    return true;
}

int worker_session_consume(worker_session *s, worker_consumer *cons, const wire_grant *g,
                           uint64_t *step)
{
    worker_batch b = {
        .staged = s->staging,
        .copy_stream = pool_importer_stream(s->imp),
        .wu = {.epoch = g->unit.epoch, .bucket = g->unit.bucket, .batch = g->unit.index},
        .n_tokens = g->n_tokens,
        .n_seqs = g->n_seqs,
        .pool_incarnation = g->pool_incarnation};
    double t0 = monotime_s();
    int rc = cons->consume(cons->ctx, &b, step);
    s->st->consume_s += monotime_s() - t0;
    return rc;
}

void worker_session_heard(worker_session *s, int rc)
{
    if (rc != DFLASH_ETIMEOUT || !*s->stop || s->broker_lost) return;
    s->broker_lost = true;
    heartbeat_quiet(s->hb);
    LOG_WARN("stopping, and the broker does not answer (%s): no more requests to it; the final "
             "checkpoint goes first", client_last_error(s->client));
}

bool worker_session_broker_lost(const worker_session *s)
{
    return s->broker_lost;
}

void worker_session_note_refusal(worker_session *s)
{
    snprintf(s->refusal, sizeof s->refusal, "%s", client_last_error(s->client));
    s->refusal_run = client_last_error_replaced_by_run(s->client);
}

bool worker_session_key_refused(const worker_session *s, const char *what)
{
    if (!client_last_error_other_key(s->client)) return false;
    LOG_ERROR("the broker refused our %s for good: our --name '%s' or our run is a live "
              "drafter's registered with another CURVE key (the broker's words: %s). Give this "
              "drafter its own --name, start a restart of a run with the key the run registered "
              "with, or wait until that drafter leaves or is expired", what, s->cfg->name,
              client_last_error(s->client));
    return true;
}

/* Whether the refusal says a live process of run run_id (non-zero) replaced us: the broker's
 * Error carries that run's id in its own field (replaced_by_run) when it refuses our hello for
 * that reason, or because a live drafter of another CURVE key trains our run (the same danger
 * to our --checkpoint-dir), and in no other refusal (a name in use, another model's trainer, a
 * group's). A
 * broker older than the field says it in its text only ("... replaced this process as a restart
 * of its run %016x"), which is read then. */
static bool refusal_names_run(const worker_session *s, uint64_t run_id)
{
    if (!run_id) return false;
    if (s->refusal_run) return s->refusal_run == run_id;
    char said[64];
    snprintf(said, sizeof said, "as a restart of its run %016" PRIx64, run_id);
    return strstr(s->refusal, said) != NULL;
}

int worker_session_save_refused(worker_session *s, worker_consumer *cons, const char *unacked)
{
    if (!cons->save_refused) return 0;
    uint64_t run = cons->run_id ? cons->run_id(cons->ctx) : 0;
    if (refusal_names_run(s, run)) {
        /* Our run id is our --checkpoint-dir's (run_id.h), so the live process that replaced
         * us at its resume got that directory (shared by two hosts, whose .lock did not keep it
         * out) or a copy of its run-id: we cannot tell which. In the first case it resumed from
         * our newest checkpoint and writes the directory now; a final checkpoint of ours there
         * would race its saves and its retention, and the newest step in it, which the next
         * restart resumes from, could be ours: a history the broker rewound at its resume (our
         * batches past that checkpoint went back to to-do). So we write nothing. */
        LOG_WARN("a live process of our run %016" PRIx64 " replaced us (or trains it under "
                 "another CURVE key) and may write our --checkpoint-dir: no final checkpoint is "
                 "written there (what this process trained past its newest checkpoint is lost; "
                 "the run goes on in that process)",
                 run);
        return 0;
    }
    if (unacked)
        LOG_WARN("%s goes into the final checkpoint, though the broker never took it as trained: "
                 "the checkpoint records it, and a drafter resumed from it acks it", unacked);
    return cons->save_refused(cons->ctx);
}

void worker_session_resumed_acked(const worker_session *s, const wire_unit *u, uint64_t step,
                                  int rc)
{
    if (rc == 0)
        LOG_INFO("batch (%u, %u, %llu) of the checkpoint we resumed from, trained at step %llu "
                 "without an ack before the stop: acked now", u->epoch, u->bucket,
                 (unsigned long long)u->index, (unsigned long long)step);
    else
        LOG_INFO("batch (%u, %u, %llu) of the checkpoint we resumed from, trained at step %llu "
                 "without an ack before the stop: the broker has it already (%s)", u->epoch,
                 u->bucket, (unsigned long long)u->index, (unsigned long long)step,
                 client_last_error(s->client));
}

int worker_session_commit(worker_session *s, uint64_t cs, int attempts)
{
    int rc = DFLASH_ETIMEOUT;
    for (int a = 0; a < attempts && rc == DFLASH_ETIMEOUT && !s->broker_lost; a++) {
        rc = client_checkpoint_committed(s->client, cs);
        worker_session_heard(s, rc);
    }
    return rc;
}

int worker_session_commit_final(worker_session *s, uint64_t cs)
{
    int rc = worker_session_commit(s, cs, 3);
    if (rc == 0)
        LOG_INFO("reported the final checkpoint (step %llu) as committed",
                 (unsigned long long)cs);
    return rc;
}

bool worker_session_commit_due(const worker_session *s)
{
    return monotime_s() >= s->commit_retry_at;
}

void worker_session_commit_noted(worker_session *s, uint64_t cs, int rc)
{
    double now = monotime_s();
    if (rc == 0) {
        if (s->commit_failures)
            LOG_INFO("the broker took the commit report of checkpoint step %llu, after %llu "
                     "refused or unanswered", (unsigned long long)cs,
                     (unsigned long long)s->commit_failures);
        s->commit_failures = 0;
        s->commit_warned_at = 0;
        s->commit_retry_at = 0;
        return;
    }
    s->commit_failures++;
    s->commit_retry_at = now + WORKER_COMMIT_RETRY_MS / 1000.0;
    if (s->commit_warned_at && now - s->commit_warned_at < SAY_AGAIN_S) return;
    s->commit_warned_at = now;
    LOG_WARN("the broker did not take the commit report of checkpoint step %llu: %s (%s); %llu "
             "report(s) failed since the last it took. The checkpoint is on disk; the broker's "
             "ledger keeps its batches as trained, not committed, until a report is taken. "
             "Reported again every %d s; said again in a minute if it still fails",
             (unsigned long long)cs, err_str(rc), client_last_error(s->client),
             (unsigned long long)s->commit_failures, WORKER_COMMIT_RETRY_MS / 1000);
}

/* The barrier given to the consumer (worker_session_offer_barrier): JournalSync, up to 3 tries
 * while the broker times out. 0 when the broker says our acks are durable, else the code (the
 * consumer writes its checkpoint anyway). */
static int barrier(void *arg, uint64_t step)
{
    worker_session *s = arg;
    if (!client_broker_incarnation(s->client)) return 0; /* never registered: nothing acked */
    if (s->barrier_unsupported) return DFLASH_EPROTO;
    int rc = DFLASH_ETIMEOUT;
    for (int a = 0; a < 3 && rc == DFLASH_ETIMEOUT && !s->broker_lost; a++) {
        rc = client_journal_sync(s->client);
        worker_session_heard(s, rc);
    }
    /* A broker that restarted since our hello answers for its own journal, not for the acks
     * its predecessor may have lost with its host's power (a crash of its process alone loses
     * none: they were written): said, not taken as durable; the loop registers again next. */
    if (rc == 0 && client_broker_restarted(s->client)) {
        LOG_WARN("checkpoint of step %llu: the broker restarted since our hello: its journal sync "
                 "does not vouch for the acks we sent the broker before it (lost if its host "
                 "lost power, then trained again); writing the checkpoint anyway",
                 (unsigned long long)step);
        return DFLASH_ESTALE;
    }
    if (rc == 0) {
        LOG_DEBUG("the broker's journal holds our acks durably: checkpoint of step %llu next",
                  (unsigned long long)step);
        return 0;
    }
    if (rc == DFLASH_EPROTO) {
        s->barrier_unsupported = true;
        LOG_WARN("the broker does not know JournalSync (%s): it is older than this drafter. "
                 "Checkpoints are written without its durability barrier; durability then rests "
                 "on the commit report, as before: a power loss of the broker's host between a "
                 "checkpoint and its commit report can have batches of that checkpoint trained "
                 "again", client_last_error(s->client));
        return rc;
    }
    double now = monotime_s();
    if (!s->barrier_warned_at || now - s->barrier_warned_at >= SAY_AGAIN_S) {
        s->barrier_warned_at = now;
        LOG_WARN("checkpoint of step %llu: the broker could not make our acks durable first: "
                 "%s (%s); writing it anyway (its durability then rests on the commit report: "
                 "a power loss of the broker's host before that can have batches of it trained "
                 "again)", (unsigned long long)step,
                 s->broker_lost ? "no broker answers since the stop" : err_str(rc),
                 client_last_error(s->client));
    }
    return rc;
}

void worker_session_offer_barrier(worker_session *s, worker_consumer *cons)
{
    if (!cons->set_barrier) return;
    cons->set_barrier(cons->ctx, barrier, s);
    s->barrier_cons = cons;
}

/* a - b for the counters of worker_stats (the timings and percentiles stay 0). */
static worker_stats stats_growth(const worker_stats *a, const worker_stats *b)
{
    return (worker_stats){.batches = a->batches - b->batches,
                          .tokens = a->tokens - b->tokens,
                          .bytes_copied = a->bytes_copied - b->bytes_copied,
                          .stale_releases = a->stale_releases - b->stale_releases,
                          .copy_failures = a->copy_failures - b->copy_failures,
                          .copy_s = a->copy_s - b->copy_s,
                          .consume_s = a->consume_s - b->consume_s,
                          .wait_grant_s = a->wait_grant_s - b->wait_grant_s,
                          .registrations = a->registrations - b->registrations};
}

bool worker_session_progress_due(worker_session *s, worker_stats *d, double *dt_s)
{
    double now = monotime_s(), dt = now - s->last_t;
    if (s->cfg->progress_ms <= 0 || dt * 1000 < s->cfg->progress_ms || dt <= 0) return false;
    *d = stats_growth(s->st, &s->last);
    *dt_s = dt;
    s->last = *s->st;
    s->last_t = now;
    return true;
}
