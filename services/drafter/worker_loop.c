/* worker_loop: see worker_loop.h for the loop, its states and the consumer interface.
 *
 * Held batch: between a successful release and the ack, the batch lives only in this process
 * (`held`, with the step that trained it). If the broker restarts in that window, hello carries
 * it so the broker's ledger can accept the late ack instead of handing the batch out again. An
 * ack that no broker answered keeps the batch held: it is acked again before the next claim
 * (and at the end), never dropped while the model holds it. An ack answered ESTALE without a
 * broker restart means the broker expired us (silent past its liveness window: a network blip,
 * a paused process) and gave the batch back to to-do: we say hello again, holding it, and ack
 * it once more (the ledger takes that as a late ack) instead of letting it be trained twice.
 * A release answered ESTALE without a broker restart means our lease ended (it expired, or the
 * broker expired us and our leases with us) and the slot's batch is handed out again, or that
 * the batch was trained meanwhile (the late ack of the drafter it was handed to before): the copy
 * is dropped. A hello holding it could not take the slot back, so it would be trained twice.
 * A stop signal ends the loop with finish(): the ack of a held batch, the final checkpoint, the
 * commit report, in that order (a checkpoint holding an unacked batch would have it trained
 * twice if we died before the ack). A broker that answers gets them all; one that does not
 * answer a request after the stop is lost for good (worker_session_heard): the batch goes
 * unacked into the final checkpoint at once, and no more requests delay the checkpoint (a
 * supervisor's grace period is short). The checkpoint records it (the consumer's unacked(),
 * note_unacked): a drafter resumed from it gets it back (resumed_unacked()) and, once the
 * broker took its resume (ResumeFrom: nothing trained at or before the checkpoint's step is
 * rewound), acks it at its step before it claims anything (take_resumed makes it the held
 * batch, ack_held acks it as a late ack), so the broker records it trained instead of handing it
 * out again; EXISTS then means our ack before the stop had landed (its reply was lost), or, if
 * the broker had handed it out again meanwhile, that it is trained twice (the broker says so).
 * A hello the broker refuses for good (do_register: EXISTS or DENIED, wherever it was sent) ends
 * the loop at the top of its next iteration, before a stop is looked at, through end_refused():
 * no finish(), no more requests; the final checkpoint, unreported, where it is safe
 * (worker_session_save_refused), a held batch in it unacked.
 * Every hello's answer goes to broker_heard: one the broker held (AGAIN: another model's trainer
 * may be a dying process) is an answer, not silence, wherever the loop sent it.
 * The importer, the staging buffer, the client and its heartbeat thread (so a long consume()
 * does not get us expired) are the session's (worker_session.h), shared with the group loop. */
#include "worker_loop.h"
#include "group_worker.h"
#include "monotime.h"
#include "broker_silence.h"
#include "client.h"
#include "err.h"
#include "log.h"
#include "synthetic.h"
#include "worker_session.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef enum { WL_REGISTER = 0, WL_CLAIMING, WL_DONE } wl_state;

#define LAT_RING 4096

typedef struct worker_loop {
    const worker_loop_config *cfg;
    worker_consumer *cons;
    worker_session *s;
    client *client; /* the session's */
    wl_state state;
    worker_stats st;
    bool holding;
    wire_unit held;
    uint64_t held_step;   /* the step that trained it (once consumed) */
    uint32_t held_tokens; /* its tokens, counted when acked */
    int held_acks_lost;   /* acks of it whose reply never came (the broker may have one) */
    bool held_resumed;    /* it is one of the checkpoint's unacked batches (trained before us) */
    worker_unacked resumed[WORKER_MAX_UNACKED]; /* the checkpoint's unacked batches (consumer's */
    uint32_t n_resumed, next_resumed;           /* resumed_unacked()), the next one to ack */
    bool resume_taken;    /* the broker took our ResumeFrom: the checkpoint's batches may be acked */
    uint64_t committed_reported;
    double lat[LAT_RING]; /* grant-to-copy-done seconds, last LAT_RING batches */
    uint64_t n_lat;
    bool resume_told; /* cons->resume_step went to the broker (once per process) */
    double copy_backoff_ms; /* pause after a failed copy; doubles up to 1 s, 1 after a success */
    broker_silence silence; /* the broker quiet since we registered (broker_silence.h) */
    double hold_said_s;     /* when "the broker holds our hello" was last said */
} worker_loop;

static void set_state(worker_loop *w, wl_state to)
{
    static const bool legal[3][3] = {
        /* to:       REGISTER CLAIMING DONE */
        [WL_REGISTER] = {true, true, true},
        [WL_CLAIMING] = {true, true, true},
        [WL_DONE] = {false, false, true},
    };
    assert(legal[w->state][to]);
    w->state = to;
}

/* Every request's result, for the log lines about a silent broker (broker_silence.h) and the
 * session's "lost after a stop" (worker_session_heard). */
static void broker_heard(worker_loop *w, int rc)
{
    broker_silence_note(&w->silence, rc, w->st.registrations > 0, client_last_error(w->client));
    worker_session_heard(w->s, rc);
}

/* hello with the held batch (and, once our resume was taken, our run: Hello.run_id). 0,
 * DFLASH_EAGAIN (transient, or held while another model's trainer may be a dying process) or a
 * fatal code: EXISTS, our --name or our run is another live process's (stats.name_in_use, exit
 * 4); DENIED, another model's trainer came in while the broker had forgotten us
 * (stats.other_model, exit 6), or, the Error saying so (worker_session_key_refused), our --name
 * or our run is a live drafter's of another CURVE key (stats.name_in_use, exit 4; defect: exit
 * 6, which sent the operator looking for another model). Its answer goes to broker_heard: only
 * a timeout is silence. */
static int do_register(worker_loop *w)
{
    int rc = worker_session_hello(w->s, w->holding ? &w->held : NULL, w->holding ? 1 : 0,
                                  w->holding ? " (holding one batch)" : "");
    broker_heard(w, rc);
    if (rc == DFLASH_ETIMEOUT || rc == DFLASH_ESTALE) return DFLASH_EAGAIN;
    if (rc == DFLASH_EAGAIN) { /* answered: held while another model's trainer may be dying */
        double now = monotime_s();
        if (now - w->hold_said_s >= 10.0) {
            LOG_INFO("the broker holds our hello: %s", client_last_error(w->client));
            w->hold_said_s = now;
        }
        return rc;
    }
    if (rc < 0)
        LOG_ERROR("the broker refused our hello: %s (%s)", err_str(rc),
                  client_last_error(w->client));
    if (rc == DFLASH_EEXISTS ||
        (rc == DFLASH_EDENIED && worker_session_key_refused(w->s, "hello")))
        w->st.name_in_use = true;
    else if (rc == DFLASH_EDENIED)
        w->st.other_model = true;
    return rc;
}

/* The broker refused our hello for good (EXISTS or DENIED above): the loop ends. */
static bool refused_for_good(const worker_loop *w)
{
    return w->st.name_in_use || w->st.other_model;
}

/* Retries call while it times out or the broker restarted (re-registering in between), up to
 * a few attempts or *stop. */
#define RETRY_CALL(w, stop, rc, call)                                                              \
    do {                                                                                           \
        for (int attempt_ = 0; attempt_ < 50 && !*(stop); attempt_++) {                            \
            rc = (call);                                                                           \
            broker_heard((w), rc);                                                                 \
            if (rc == DFLASH_ETIMEOUT) continue;                                                   \
            if (rc == DFLASH_ESTALE && client_broker_restarted((w)->client)) {                     \
                while (!*(stop) && do_register(w) == DFLASH_EAGAIN) monotime_sleep_ms(100);        \
                if (refused_for_good(w)) break;                                                    \
                continue;                                                                          \
            }                                                                                      \
            break;                                                                                 \
        }                                                                                          \
    } while (0)

/* After the first hello: tells the broker the checkpoint step the consumer resumed from, and
 * its run, so batches trained after it return to to-do before we claim anything. While the
 * broker answers AGAIN (a live drafter trains another model there, maybe a dying one it has not
 * expired yet) we ask again, saying why every 10 s, and claim nothing; the broker bounds that
 * wait, then answers EXISTS: another model trains there (stats.other_model, exit 6). DENIED
 * saying so (worker_session_key_refused): our run is a live drafter's of another CURVE key
 * (stats.name_in_use, exit 4; it exited 1). 0, a
 * fatal code, or DFLASH_ESHUTDOWN when a stop signal came before the broker took it (the loop
 * then ends without finish(): this process trained nothing, and must report no commit). */
static int tell_resume(worker_loop *w, volatile sig_atomic_t *stop)
{
    w->resume_told = true;
    int64_t s = w->cons->resume_step ? w->cons->resume_step(w->cons->ctx) : -1;
    if (s < 0) return 0;
    uint64_t run_id = w->cons->run_id ? w->cons->run_id(w->cons->ctx) : 0;
    int rc = DFLASH_ESHUTDOWN;
    for (uint64_t said_ms = 0; !*stop;) {
        RETRY_CALL(w, stop, rc, client_resume_from(w->client, (uint64_t)s, run_id));
        if (rc != DFLASH_EAGAIN) break;
        uint64_t now = monotime_ms();
        if (!said_ms || now - said_ms >= 10000) {
            LOG_WARN("the broker holds our resume: %s", client_last_error(w->client));
            said_ms = now;
        }
        worker_session_alive(w->s);
        monotime_sleep_ms(200);
    }
    if (rc < 0 && *stop) return DFLASH_ESHUTDOWN; /* nothing trained, nothing to report */
    if (rc < 0) {
        LOG_ERROR("the broker refused resume_from(%lld): %s (%s)", (long long)s, err_str(rc),
                  client_last_error(w->client));
        if (rc == DFLASH_EEXISTS) w->st.other_model = true;
        else if (rc == DFLASH_EDENIED && worker_session_key_refused(w->s, "resume"))
            w->st.name_in_use = true;
        return rc;
    }
    LOG_INFO("told the broker we resume from step %lld: batches trained after it are redone",
             (long long)s);
    w->resume_taken = true;
    /* a broker that forgets us (restart, expiry) learns from our next hello that we train it */
    client_set_trainer_run(w->client, run_id);
    return 0;
}

/* The held batch's identity, as the consumer hooks name batches. */
static worker_unacked held_unacked(const worker_loop *w)
{
    return (worker_unacked){{w->held.epoch, w->held.bucket, w->held.index}, w->held_step};
}

/* Once the broker took our resume, and nothing else is held: the next of the checkpoint's unacked
 * batches becomes the held batch, to be acked at its step by ack_held. true when one was taken. */
static bool take_resumed(worker_loop *w)
{
    if (w->holding || !w->resume_taken || w->next_resumed >= w->n_resumed) return false;
    const worker_unacked *r = &w->resumed[w->next_resumed++];
    w->holding = true;
    w->held = (wire_unit){.epoch = r->wu.epoch, .bucket = r->wu.bucket, .index = r->wu.batch};
    w->held_step = r->step;
    w->held_tokens = 0;
    w->held_acks_lost = 0;
    w->held_resumed = true;
    return true;
}

/* Tells the consumer, before its final checkpoint, which trained batches the model holds whose
 * acks the broker has not taken: the held one and the checkpoint's not acked yet. */
static void note_unacked(worker_loop *w)
{
    if (!w->cons->unacked) return;
    worker_unacked b[WORKER_MAX_UNACKED + 1];
    uint32_t n = 0;
    if (w->holding && w->held_step) b[n++] = held_unacked(w);
    for (uint32_t i = w->next_resumed; i < w->n_resumed; i++) b[n++] = w->resumed[i];
    w->cons->unacked(w->cons->ctx, b, n);
}

/* Acks the held (trained) batch at its step; a retry after a lost reply (timeout) may find an
 * earlier ack recorded: EEXISTS then means "done", not "trained twice". An ack answered ESTALE
 * (never recorded) re-registers, the hello holding the batch, and is sent again: always after a
 * broker restart, once when the same broker had forgotten us (it expired us while we trained).
 * Returns 0 when the broker has the ack, DFLASH_ETIMEOUT when no broker answered (the batch
 * stays held, to be acked again), or the broker's refusal (logged; the batch is let go); when
 * the broker refused the hello for good, the ack's code with the batch still held. A batch of
 * the checkpoint we resumed from (held_resumed) answered EXISTS is done too: our ack before the
 * stop had landed (or it was trained again since, which the broker logs). After
 * a stop signal the attempts go on while the broker answers, and end at the first one it does
 * not (worker_session_broker_lost), or at a hello again that no broker took (no answer, or held
 * AGAIN): DFLASH_ETIMEOUT, the final checkpoint will hold this batch. */
static int ack_held(worker_loop *w, volatile sig_atomic_t *stop)
{
    const wire_unit *u = &w->held;
    int rc = DFLASH_ETIMEOUT;
    bool forgotten = false; /* re-registered because this broker no longer knew us */
    bool unheard = false;   /* stopped before a broker took our hello again: kept */
    for (int attempt = 0; attempt < 50 && !worker_session_broker_lost(w->s); attempt++) {
        rc = client_ack(w->client, u, w->held_step);
        broker_heard(w, rc);
        if (rc == DFLASH_ETIMEOUT) {
            w->held_acks_lost++;
            continue;
        }
        bool restarted = rc == DFLASH_ESTALE && client_broker_restarted(w->client);
        bool forgotten_now = rc == DFLASH_ESTALE && !restarted && !forgotten;
        if (!restarted && !forgotten_now) break;
        if (forgotten_now) {
            LOG_WARN("ack of batch (%u, %u, %llu): the broker no longer knows us (%s), it "
                     "expired us while we trained: registering again, holding the batch, to ack "
                     "it late", u->epoch, u->bucket, (unsigned long long)u->index,
                     client_last_error(w->client));
            forgotten = true;
        }
        int hrc = DFLASH_EAGAIN;
        if (*stop) /* one hello: a broker that answers it takes the ack next */
            hrc = do_register(w);
        else
            while (!*stop && (hrc = do_register(w)) == DFLASH_EAGAIN) monotime_sleep_ms(100);
        if (refused_for_good(w)) return rc; /* still held: into the final checkpoint, unacked */
        /* stopped while the hello found no broker or was held (AGAIN): the ack was never
         * recorded, and the batch stays held, into the final checkpoint unacked (defect: when
         * the same broker had forgotten us, the batch was let go, so the checkpoint did not
         * record it and the broker, which gave it back to to-do, had it trained twice) */
        if (hrc == DFLASH_EAGAIN) {
            unheard = true;
            break;
        }
        if (*stop && hrc != 0) break;
    }
    if (rc == DFLASH_ETIMEOUT || unheard ||
        (rc == DFLASH_ESTALE && client_broker_restarted(w->client))) {
        LOG_WARN("ack of batch (%u, %u, %llu): %s (%s); still held, acked again when the "
                 "broker answers", u->epoch, u->bucket, (unsigned long long)u->index,
                 err_str(rc), client_last_error(w->client));
        return DFLASH_ETIMEOUT;
    }
    if (w->held_resumed && (rc == 0 || rc == DFLASH_EEXISTS)) {
        worker_session_resumed_acked(w->s, u, w->held_step, rc);
        w->holding = w->held_resumed = false;
        return 0; /* trained by the process before us: not counted as ours */
    }
    if (rc == DFLASH_EEXISTS && w->held_acks_lost > 0) {
        LOG_INFO("batch (%u, %u, %llu): our earlier ack was recorded before its reply was lost",
                 u->epoch, u->bucket, (unsigned long long)u->index);
        rc = 0;
    } else if (rc == DFLASH_EEXISTS) {
        LOG_ERROR("batch (%u, %u, %llu) was already trained: the broker refused a second ack",
                  u->epoch, u->bucket, (unsigned long long)u->index);
    } else if (rc < 0) {
        LOG_WARN("ack of batch (%u, %u, %llu): %s (%s)", u->epoch, u->bucket,
                 (unsigned long long)u->index, err_str(rc), client_last_error(w->client));
    }
    if (rc == 0) {
        LOG_DEBUG("acked batch (%u, %u, %llu)", u->epoch, u->bucket, (unsigned long long)u->index);
        w->st.batches++;
        w->st.tokens += w->held_tokens;
    }
    w->holding = w->held_resumed = false;
    return rc;
}

/* The broker refused our hello for good (refused_for_good): the loop ends (main.c: exit 4 or 6)
 * with no more requests. The model keeps what it trained: the final checkpoint, reported to no
 * broker, where that is safe (worker_session_save_refused), a held batch in it unacked.
 * Returns the refusal's code (a failed checkpoint is logged; the exit code stays the refusal's). */
static int end_refused(worker_loop *w)
{
    char held[80];
    snprintf(held, sizeof held, "batch (%u, %u, %llu)", w->held.epoch, w->held.bucket,
             (unsigned long long)w->held.index);
    note_unacked(w);
    worker_session_save_refused(w->s, w->cons, w->holding ? held : NULL);
    return w->st.other_model ? DFLASH_EDENIED : DFLASH_EEXISTS;
}

/* Nothing held: the consumer's settled() (a periodic checkpoint, after the broker's durability
 * barrier: worker_session_offer_barrier), then the commit report of the newest checkpoint if it
 * is new, unless one failed within WORKER_COMMIT_RETRY_MS (worker_session_commit_due). 0 or the
 * consumer's fatal code. */
static int settle(worker_loop *w, volatile sig_atomic_t *stop)
{
    if (w->cons->settled) {
        int rc = w->cons->settled(w->cons->ctx);
        if (rc < 0) return rc;
    }
    if (!w->cons->committed) return 0;
    uint64_t cs = w->cons->committed(w->cons->ctx);
    if (cs > w->committed_reported && worker_session_commit_due(w->s)) {
        int crc = DFLASH_ETIMEOUT;
        LOG_DEBUG("reporting checkpoint step %llu as committed", (unsigned long long)cs);
        RETRY_CALL(w, stop, crc, client_checkpoint_committed(w->client, cs));
        worker_session_commit_noted(w->s, cs, crc); /* a failure: said, and backed off */
        if (crc == 0) w->committed_reported = cs;
    }
    return 0;
}

/* The loop ended without a fatal error: the ack of a held batch (and of the checkpoint's unacked
 * batches not acked yet, once our resume was taken), the consumer's finish() (final checkpoint,
 * recording what is still not acked: note_unacked), then one last commit report. The acks go
 * first, as before settle(). After a stop signal, a broker lost (no answer since the stop) gets
 * none of them: the checkpoint comes at once. */
static int finish(worker_loop *w, volatile sig_atomic_t *stop)
{
    int ack = 0;
    while (ack != DFLASH_ETIMEOUT && client_broker_incarnation(w->client) &&
           (w->holding || take_resumed(w))) {
        wire_unit u = w->held;
        ack = worker_session_broker_lost(w->s) ? DFLASH_ETIMEOUT : ack_held(w, stop);
        if (refused_for_good(w)) return end_refused(w); /* the ack's hello, after a stop */
        if (ack == DFLASH_ETIMEOUT)
            LOG_WARN("batch (%u, %u, %llu) goes into the final checkpoint but is not acked: the "
                     "checkpoint records it, and the drafter resumed from it acks it", u.epoch,
                     u.bucket, (unsigned long long)u.index);
    }
    note_unacked(w);
    if (w->cons->finish) {
        int rc = w->cons->finish(w->cons->ctx);
        if (rc < 0) return rc;
    }
    /* no broker: no commit report either */
    if (ack == DFLASH_ETIMEOUT || worker_session_broker_lost(w->s)) return 0;
    if (!w->cons->committed || !client_broker_incarnation(w->client)) return 0;
    uint64_t cs = w->cons->committed(w->cons->ctx);
    if (cs == 0 || cs < w->committed_reported) return 0;
    int rc = worker_session_commit_final(w->s, cs);
    if (rc == 0) {
        w->committed_reported = cs;
    } else {
        LOG_WARN("could not report the final checkpoint (step %llu): %s; the broker will rewind "
                 "to the last commit it knows when we resume", (unsigned long long)cs,
                 err_str(rc));
    }
    return 0;
}

/* Copies, releases, consumes and acks one granted batch. 0 or a fatal code (DFLASH_ECONFIG: the
 * slot was written for another layout, given back unread). */
static int handle_grant(worker_loop *w, const wire_grant *g, volatile sig_atomic_t *stop)
{
    double copy_s = 0;
    int rc = worker_session_copy(w->s, g, &copy_s);
    if (rc < 0) {
        /* The exporter is gone (shm removed) or the grant is bad: give the slot back unread, so
         * the broker returns the batch to to-do instead of counting it as ours until we exit.
         * Then wait a little: the next grant may name the same unreadable pool. */
        LOG_WARN("cannot copy slot %u of pool %016llx: %s; giving it back unread", g->slot,
                 (unsigned long long)g->pool_incarnation, err_str(rc));
        int rrc = 0;
        RETRY_CALL(w, stop, rrc, client_release_unread(w->client, g->lease_id));
        (void)rrc;
        if (worker_session_copy_hopeless(w->s, rc)) return DFLASH_EPEER;
        monotime_sleep_ms(w->copy_backoff_ms);
        w->copy_backoff_ms = w->copy_backoff_ms < 1000 ? w->copy_backoff_ms * 2 : 1000;
        return 0;
    }
    w->copy_backoff_ms = 1;
    w->lat[w->n_lat++ % LAT_RING] = copy_s;
    if ((rc = worker_session_check_layout(w->s, w->cons, g)) < 0) {
        /* the target's misconfiguration, not the batch's: it must not count against it */
        int rrc = 0;
        RETRY_CALL(w, stop, rrc, client_release_unread(w->client, g->lease_id));
        (void)rrc;
        return rc;
    }

    rc = DFLASH_ESHUTDOWN; /* stays so when a stop signal prevents the release */
    RETRY_CALL(w, stop, rc, client_release(w->client, g->lease_id));
    if (rc == DFLASH_ESTALE) {
        w->st.stale_releases++;
        LOG_WARN("release of lease %llu on slot %u refused (%s): the lease expired and batch "
                 "(%u, %u, %llu) was redelivered, or it was trained meanwhile; dropping our copy",
                 (unsigned long long)g->lease_id, g->slot, client_last_error(w->client),
                 g->unit.epoch, g->unit.bucket, (unsigned long long)g->unit.index);
        return 0;
    }
    if (rc < 0) {
        /* Without a confirmed release the lease may still expire and the batch be redelivered:
         * training on this copy too could train it twice. Drop it; the batch comes back. */
        if (!*stop)
            LOG_WARN("release of lease %llu: %s; dropping our copy",
                     (unsigned long long)g->lease_id, err_str(rc));
        return 0;
    }
    w->holding = true;
    w->held = g->unit;
    w->held_step = 0;
    w->held_tokens = g->n_tokens;
    w->held_acks_lost = 0;
    w->held_resumed = false;
    LOG_DEBUG("training batch (%u, %u, %llu)", g->unit.epoch, g->unit.bucket,
              (unsigned long long)g->unit.index);

    uint64_t step = 0;
    rc = worker_session_consume(w->s, w->cons, g, &step);
    if (rc < 0) {
        w->holding = false; /* not trained: the broker hands it out again once we are gone */
        return rc;
    }
    LOG_DEBUG("consumed batch (%u, %u, %llu) step %llu", g->unit.epoch, g->unit.bucket,
              (unsigned long long)g->unit.index, (unsigned long long)step);
    w->held_step = step;
    ack_held(w, stop);
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The pct-th percentile of n >= 1 sorted values by nearest rank, v[ceil(pct n / 100) - 1]: a
 * higher percentile is never below a lower one, however few the values. */
static double nearest_rank(const double *v, uint64_t n, unsigned pct)
{
    return v[(pct * n + 99) / 100 - 1];
}

/* p50 and p99 of the last `n` grant-to-copy-done latencies, in ms (0 when none). */
static void latency_pcts(const worker_loop *w, uint64_t n, double *p50, double *p99)
{
    *p50 = *p99 = 0;
    if (n > w->n_lat) n = w->n_lat;
    if (n > LAT_RING) n = LAT_RING;
    if (!n) return;
    double *v = malloc(n * sizeof *v);
    if (!v) return;
    for (uint64_t i = 0; i < n; i++) v[i] = w->lat[(w->n_lat - 1 - i) % LAT_RING];
    qsort(v, n, sizeof *v, cmp_double);
    *p50 = nearest_rank(v, n, 50) * 1e3;
    *p99 = nearest_rank(v, n, 99) * 1e3;
    free(v);
}

/* A progress line every cfg->progress_ms: batches, tokens/s, copy rate and latency, time waiting
 * for a grant. */
static void progress(worker_loop *w)
{
    worker_stats d;
    double dt, p50, p99;
    if (!worker_session_progress_due(w->s, &d, &dt)) return;
    latency_pcts(w, d.batches, &p50, &p99);
    char silent[64];
    broker_silence_suffix(&w->silence, silent, sizeof silent);
    LOG_INFO("batches %llu (+%llu), %.0f tokens/s, copy %.2f GB/s, grant to copy done p50 %.2f "
             "ms p99 %.2f ms, waiting for a grant %.0f%%%s",
             (unsigned long long)w->st.batches, (unsigned long long)d.batches,
             (double)d.tokens / dt, d.copy_s > 0 ? (double)d.bytes_copied / d.copy_s / 1e9 : 0.0,
             p50, p99, 100.0 * d.wait_grant_s / dt, silent);
}

int worker_loop_run(const worker_loop_config *cfg, worker_consumer *cons,
                    volatile sig_atomic_t *stop, worker_stats *stats)
{
    if (cfg->group && cfg->group[0]) return group_worker_run(cfg, cons, stop, stats);
    worker_loop w = {.cfg = cfg, .cons = cons, .state = WL_REGISTER, .copy_backoff_ms = 1};
    int rc = 0;
    double start = monotime_s();
    w.s = worker_session_new(cfg, &w.st, stop, &rc);
    if (!w.s) goto out;
    w.client = worker_session_client(w.s);
    worker_session_offer_barrier(w.s, cons);
    if (cons->resumed_unacked)
        w.n_resumed = cons->resumed_unacked(cons->ctx, w.resumed, WORKER_MAX_UNACKED);

    double backoff = 1, unreachable_since = monotime_s();
    while (w.state != WL_DONE) {
        worker_session_alive(w.s);
        if (refused_for_good(&w)) { /* by a hello, here or while retrying a call or an ack */
            rc = end_refused(&w);
            goto out_session;
        }
        if (*stop) {
            set_state(&w, WL_DONE);
            break;
        }
        progress(&w);
        if (w.state == WL_REGISTER) {
            rc = do_register(&w);
            if (rc == 0 && !w.resume_told) {
                rc = tell_resume(&w, stop);
                if (rc == DFLASH_ESHUTDOWN) { /* stopped before the broker took it */
                    rc = 0;
                    goto out_session;
                }
                if (rc < 0) goto out_session;
            }
            if (rc == 0) {
                set_state(&w, WL_CLAIMING);
                continue;
            }
            if (refused_for_good(&w)) continue; /* ends at the top */
            if (rc != DFLASH_EAGAIN) goto out_session;
            /* --broker-wait-ms covers the start-up only: a broker lost later is waited for */
            if (w.st.registrations) {
                monotime_sleep_ms(100);
                rc = 0;
            } else if ((rc = worker_session_await_broker(w.s, unreachable_since)) < 0) {
                goto out_session;
            }
            continue;
        }
        if ((cfg->max_batches > 0 && (int64_t)w.st.batches >= cfg->max_batches) ||
            (cons->done && cons->done(cons->ctx))) {
            set_state(&w, WL_DONE);
            break;
        }
        take_resumed(&w); /* the checkpoint's unacked batches are acked before any claim */
        if (w.holding) { /* an earlier ack no broker answered: ack it before claiming more */
            double t0 = monotime_s();
            if (ack_held(&w, stop) == DFLASH_ETIMEOUT) {
                monotime_sleep_ms(backoff);
                backoff = backoff < 20 ? backoff * 2 : 20;
                w.st.wait_grant_s += monotime_s() - t0;
            }
            continue;
        }
        if ((rc = settle(&w, stop)) < 0) goto out_session;
        if (refused_for_good(&w)) continue; /* the commit report's hello */
        wire_grant g;
        double t0 = monotime_s();
        rc = client_claim(w.client, &g);
        broker_heard(&w, rc);
        if (rc == 0) {
            backoff = 1;
            unreachable_since = monotime_s();
            rc = handle_grant(&w, &g, stop);
            if (rc == DFLASH_ECORRUPT || rc == DFLASH_EMISMATCH || rc == DFLASH_ECONFIG ||
                rc == DFLASH_EPEER) {
                /* a bad batch, a slot of another layout (the target's configuration), refused
                 * before use, or slots we cannot map (--max-copy-failures, no peer access):
                 * keep what the model has trained (defect: the last one lost the steps since
                 * the last periodic checkpoint) */
                if (finish(&w, stop) < 0)
                    LOG_ERROR("the final checkpoint before this exit failed too");
                goto out_session;
            }
            if (rc < 0) goto out_session;
        } else if (rc == DFLASH_EAGAIN || rc == DFLASH_ETIMEOUT) {
            if (cons->idle) cons->idle(cons->ctx);
            worker_session_close_stale_pools(w.s);
            monotime_sleep_ms(backoff);
            backoff = backoff < 20 ? backoff * 2 : 20;
            if (rc == DFLASH_EAGAIN) w.st.wait_grant_s += monotime_s() - t0; /* not the broker's */
            rc = 0;
        } else if (rc == DFLASH_ESHUTDOWN && cfg->exit_when_drained) {
            LOG_INFO("the broker has nothing more for us (%s): done", client_last_error(w.client));
            set_state(&w, WL_DONE);
            rc = 0;
        } else if (rc == DFLASH_ESHUTDOWN) {
            monotime_sleep_ms(100);
            w.st.wait_grant_s += monotime_s() - t0;
            rc = 0;
        } else if (rc == DFLASH_EEXISTS) { /* our --name is a live trainer's: exit 4 */
            LOG_ERROR("the broker refused our claim: %s", client_last_error(w.client));
            w.st.name_in_use = true;
            goto out_session;
        } else if (rc == DFLASH_ESTALE) {
            LOG_WARN("the broker does not know us (it restarted, expired us, or another "
                     "drafter with our --name replaced us): registering again");
            unreachable_since = monotime_s();
            set_state(&w, WL_REGISTER);
            rc = 0;
        } else {
            LOG_WARN("claim failed: %s (%s)", err_str(rc), client_last_error(w.client));
            monotime_sleep_ms(100);
            rc = 0;
        }
    }
    if (rc == 0) rc = finish(&w, stop);
out_session:
    worker_session_destroy(&w.s);
out:
    w.st.elapsed_s = monotime_s() - start;
    latency_pcts(&w, LAT_RING, &w.st.copy_p50_ms, &w.st.copy_p99_ms);
    if (stats) *stats = w.st;
    return rc;
}

/* ---------------------------------------------------------------- the --verify consumer */

typedef struct verify_ctx {
    pool_backend backend;
    slot_layout layout;
    uint32_t upper[WORKER_MAX_BUCKETS], n_buckets, vocab;
    void *host; /* cuda: host copy of the staged slot */
    uint64_t last_step, bytes_checked;
    double period_s, next_s; /* pacing; period 0 = none */
} verify_ctx;

static int verify_consume(void *vctx, const worker_batch *b, uint64_t *step)
{
    verify_ctx *v = vctx;
    if (v->period_s > 0) { /* a slower trainer: never more than a second behind schedule */
        double now = monotime_s();
        if (v->next_s < now - 1.0) v->next_s = now;
        if (v->next_s > now) monotime_sleep_ms((v->next_s - now) * 1000);
        v->next_s += v->period_s;
    }
    const void *img = b->staged;
    size_t used = b->n_tokens <= v->layout.token_budget ? slot_used_bytes(&v->layout, b->n_tokens)
                                                       : v->layout.slot_bytes;
    if (v->backend == POOL_CUDA) {
        int rc = pool_staging_read(POOL_CUDA, v->host, b->staged, used);
        if (rc < 0) return rc;
        img = v->host;
    }
    synthetic_params sp = synthetic_bucket_params(v->upper, v->n_buckets, b->wu.bucket, v->vocab,
                                                  v->layout.token_budget);
    synthetic_report r;
    char msg[320];
    int rc = synthetic_verify(img, &v->layout, &b->wu, &sp, &r, msg, sizeof msg);
    if (rc < 0) {
        LOG_ERROR("VERIFY FAILED for batch (%u, %u, %llu) from pool %016llx: %s (%llu bad bytes "
                  "of %llu): %s", b->wu.epoch, b->wu.bucket, (unsigned long long)b->wu.batch,
                  (unsigned long long)b->pool_incarnation, err_str(rc),
                  (unsigned long long)r.bad_bytes, (unsigned long long)r.bytes_checked, msg);
        return rc;
    }
    v->bytes_checked += r.bytes_checked;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t ms = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
    *step = ms > v->last_step ? ms : v->last_step + 1;
    v->last_step = *step;
    return 0;
}

static uint64_t verify_committed(void *vctx)
{
    return ((verify_ctx *)vctx)->last_step; /* nothing to checkpoint: every ack is durable */
}

static void verify_destroy(void *vctx)
{
    verify_ctx *v = vctx;
    free(v->host);
    free(v);
}

worker_consumer *worker_verify_new(const worker_loop_config *cfg, const uint32_t *bucket_upper,
                                   uint32_t n_buckets, uint32_t vocab_size, double rate)
{
    if (n_buckets == 0 || n_buckets > WORKER_MAX_BUCKETS) return NULL;
    worker_consumer *c = calloc(1, sizeof *c);
    verify_ctx *v = calloc(1, sizeof *v);
    if (!c || !v) goto fail;
    v->backend = cfg->backend;
    v->layout = cfg->layout;
    memcpy(v->upper, bucket_upper, n_buckets * sizeof *bucket_upper);
    v->n_buckets = n_buckets;
    v->vocab = vocab_size;
    v->period_s = rate > 0 ? 1.0 / rate : 0;
    if (cfg->backend == POOL_CUDA) {
        v->host = malloc(cfg->layout.slot_bytes);
        if (!v->host) goto fail;
    }
    *c = (worker_consumer){.name = "verify", .ctx = v, .consume = verify_consume,
                           .committed = verify_committed, .destroy = verify_destroy};
    return c;
fail:
    free(v);
    free(c);
    return NULL;
}

void worker_consumer_destroy(worker_consumer **cons)
{
    if (!cons || !*cons) return;
    if ((*cons)->destroy) (*cons)->destroy((*cons)->ctx);
    free(*cons);
    *cons = NULL;
}
