/* group_worker: see group_worker.h for the loop and its states.
 *
 * Pending step (rank 0 only): between a trained step and the answer to its StepDone, the step's
 * units (StepGrant.units, all ranks', of every micro-step: step_units) live only here. If the broker restarts in that window, the
 * hello carries them (the new broker adopts them from its journal instead of handing them out
 * again) and plain Acks at the step record them, as a solo drafter's late ack would. A StepDone
 * the same broker answers STALE is never acked late: the step was resolved without us, by the
 * model the group goes on from (group.h). A surviving rank's model decided it (ABORT: it lacks
 * the update, and we will be synced to it), or, when the broker expired every rank while we
 * trained (a paused node, a network blip; a group of one included), the step is orphaned and
 * the join that creates the group again decides it by the model step it reports: ours when we
 * come back first. A StepDone no broker answered keeps the step pending: it is sent again
 * before the next claim (and at the end); a GroupJoin answered by the same broker resolves it
 * instead (by our model step).
 * A stop: finish() sends the pending StepDone, writes the final checkpoint (rank 0), reports it
 * and leaves the group, in that order, while the broker answers; one that does not answer a
 * request after the stop is lost for good (worker_session_heard) and gets no more requests, so
 * the checkpoint is not held back by retries (the step goes into it without a StepDone). The
 * checkpoint then records the step's units as trained and unacked (the consumer's unacked(),
 * note_unacked). A drafter resumed from it (resumed_unacked(): `resumed`) resolves them at its
 * first GroupView (resolve_resumed), by the model the group goes on from, rank 0's at the
 * view's step: when that model is ours (we are rank 0; the join that created the group rewound
 * the ledger to our step, which keeps them) and at or past their step, it holds them, and they
 * are acked at their step as plain Acks; otherwise they are let go (the broker trains them
 * again): another member's model at that step may come from a group re-created from an older
 * model without them, and a batch trained twice is the safe side of one never trained. Nothing
 * is claimed before they are resolved.
 * Our drafter's shape (the consumer's shape(): the layout the state sync compares) goes with
 * every join (client_set_drafter_shape): a broker that knows the field refuses a joiner of
 * another shape than the group's (Error MISMATCH) before the group re-forms for it, and we end
 * (ECONFIG: exit 2). An older broker takes us in, and the state sync turns us away instead
 * (joining(): EMISMATCH there; the others re-form without us).
 * A refusal for good (our hello answered EXISTS, our join refused: `refused`) ends the loop
 * through end_refused() instead, with no more requests: the final checkpoint (rank 0), reported
 * to no broker (worker_session_save_refused), a pending step in it without a StepDone.
 * The importer, the staging buffer, the client and its heartbeat thread are the session's
 * (worker_session.h), shared with the solo loop.
 *
 * A collective that waits (comm_watch, the communicator's watch: collective.h): once a wait on
 * peers has lasted WAIT_SAY_S it is logged (what, for which rank, since when, the timeout), and
 * again every WAIT_SAY_EVERY_S; and about every second the broker is asked whether our epoch
 * still stands, by the GroupJoin a member polls with (our model step, no failed epoch: for a
 * member it changes nothing but what the broker knows of our model, the same step the join
 * after a failed wait would report). Another epoch in the view, another id, Error AGAIN (the
 * group re-forms, or we wait for a boundary) or STALE (the broker forgot us) end the wait: the
 * epoch is over, and we re-form at once instead of after --comm-timeout-s. No answer (the broker
 * is down: the request waits its timeout) keeps the wait, bounded by --comm-timeout-s as ever.
 * With shm the collective itself also sees a peer process that has ended (collective.h).
 * A communicator that cannot open for our own setup (dp_comm_open's DFLASH_ECONFIG: NCCL refuses
 * two ranks on one GPU, or our --device cannot be set) would fail the same way after every
 * re-form, for ever: the rank ends instead (config_fault), through finish(), which writes the
 * final checkpoint (rank 0 of the last group, or solo) and leaves the group, so the others
 * re-form without it at once; the loop returns DFLASH_ECONFIG (exit 2). A rank on a GPU of its
 * own sees only its peers give up, and re-forms without them.
 *
 * Progress lines (progress()): in STEPPING the group's (epoch, rank, world, step, rates);
 * outside it (REGISTER, JOINING) the rank trains nothing, and the line says so, with what it
 * waits for (`waiting`, set where the loop learns it: set_state, set_waiting) and since when
 * (it last left STEPPING, or started).
 */
#include "group_worker.h"

#include "client.h"
#include "collective.h"
#include "err.h"
#include "log.h"
#include "monotime.h"
#include "worker_session.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define WAIT_SAY_S 5.0        /* a collective's wait is logged once it lasts this long */
#define WAIT_SAY_EVERY_S 10.0 /* and again this often while it lasts */
#define OPEN_RETRY_FIRST_MS 100 /* after a communicator that failed to open: the first wait */
#define OPEN_RETRY_MAX_MS 5000  /* doubling up to this while it keeps failing */

typedef enum { GW_REGISTER = 0, GW_JOINING, GW_STEPPING, GW_DONE } gw_state;

typedef struct gw {
    const worker_loop_config *cfg;
    worker_consumer *cons;
    volatile sig_atomic_t *stop;
    worker_session *s;
    client *cl; /* the session's */
    gw_state state;
    worker_stats st;
    dp_comm *comm;
    uint64_t epoch, failed_epoch;
    int gone_rank; /* with failed_epoch: the rank whose process the collective saw end, or -1 */
    uint8_t id[DP_COMM_ID_BYTES]; /* the epoch's rendezvous id: the view's, or the one we posted */
    double wait_say_at, wait_last; /* comm_watch: when the wait is logged next; its last call */
    int rank, world;
    bool pending; /* rank 0: a trained step whose StepDone was not answered */
    uint64_t pending_step;
    uint32_t n_pending;
    wire_unit pending_units[WIRE_MAX_WORLD];
    uint64_t committed_reported;
    uint64_t wait_said_ms; /* when a join's wait was last logged */
    bool refused_step;     /* rank 0: a StepDone this broker answered STALE, no GroupJoin since */
    bool refused;          /* the broker refused our hello or join for good: the loop ends */
    bool config_fault; /* the communicator refused our setup (ECONFIG): finish, then exit 2 */
    int open_retry_ms; /* the wait before joining again after a failed open (0: none failed) */
    worker_unacked resumed[WORKER_MAX_UNACKED]; /* the checkpoint's unacked batches */
    uint32_t n_resumed, next_resumed;           /* (consumer's resumed_unacked()), next one */
    /* Outside STEPPING the rank trains nothing: what it waits for (set_waiting), since when. */
    char waiting[WIRE_MAX_TEXT + 64];
    double waiting_since;
    double size_wait_since; /* full_group: when this epoch began to wait for --group-size */
    char shape_text[WIRE_MAX_SHAPE_TEXT]; /* our drafter's shape in words (consumer's shape()) */
    /* Gradient accumulation: a step of `accumulate` micro-steps (the consumer's accumulate());
     * `micro` of the open step are trained, their units (every rank's) in step_units. */
    uint32_t accumulate, micro, n_step_units;
    wire_unit step_units[WIRE_MAX_WORLD];
} gw;

static void set_state(gw *g, gw_state to)
{
    static const bool legal[4][4] = {
        /* to:         REGISTER JOINING STEPPING DONE */
        [GW_REGISTER] = {true, true, false, true},
        [GW_JOINING] = {true, true, true, true},
        [GW_STEPPING] = {true, true, true, true},
        [GW_DONE] = {false, false, false, true},
    };
    assert(legal[g->state][to]);
    if (g->state == GW_STEPPING && to != GW_STEPPING) g->waiting_since = monotime_s();
    if (to == GW_REGISTER) {
        snprintf(g->waiting, sizeof g->waiting, "for the broker to take our hello");
        /* an epoch number is one broker's (and one instance of the group's): a failed one
         * named to the broker we say hello to next ended its healthy epoch of the same number,
         * or dropped a live member of it for our gone rank (defect) */
        g->failed_epoch = 0;
        g->gone_rank = -1;
    } else if (to == GW_JOINING && g->state != GW_JOINING) {
        snprintf(g->waiting, sizeof g->waiting, "for the broker's answer to our join of group %s",
                 g->cfg->group);
    }
    g->state = to;
}

/* What the rank waits for while it trains nothing (REGISTER, JOINING): the progress line's. */
static void set_waiting(gw *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_waiting(gw *g, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->waiting, sizeof g->waiting, fmt, ap);
    va_end(ap);
}

/* Leaves the epoch's communicator (if any) and trains alone until the next one. An open step
 * (some of its micro-steps trained) is abandoned with it: the consumer drops it (set_group
 * NULL), the broker aborts it, its batches are trained again. */
static void close_comm(gw *g)
{
    g->micro = g->n_step_units = 0;
    if (!g->comm) return;
    dp_comm_close(&g->comm);
    g->cons->set_group(g->cons->ctx, NULL, 0, 1);
}

/* The epoch is over for us: close the communicator and join again, naming it (and why the
 * collective broke, when it did). */
static void reform(gw *g, const char *why)
{
    const char *cause = g->comm ? dp_comm_error(g->comm) : "";
    g->gone_rank = g->comm ? dp_comm_gone_rank(g->comm) : -1;
    LOG_WARN("group %s epoch %llu: %s%s%s; re-forming", g->cfg->group,
             (unsigned long long)g->epoch, why, cause[0] ? ": " : "", cause);
    close_comm(g);
    g->failed_epoch = g->epoch;
    set_state(g, GW_JOINING);
    set_waiting(g, "for the broker's view of group %s after epoch %llu broke", g->cfg->group,
                (unsigned long long)g->epoch);
}

/* Every request's result: a timeout after the stop marks the broker lost (worker_session.h). */
static void heard(gw *g, int rc)
{
    worker_session_heard(g->s, rc);
}

static bool broker_lost(const gw *g)
{
    return worker_session_broker_lost(g->s);
}

/* Acks *u at step: up to 20 tries while no broker answers (fewer once it is lost after a stop).
 * The last answer's code. */
static int ack_at(gw *g, const wire_unit *u, uint64_t step)
{
    int rc = DFLASH_ETIMEOUT;
    for (int a = 0; a < 20 && rc == DFLASH_ETIMEOUT && !broker_lost(g); a++) {
        rc = client_ack(g->cl, u, step);
        heard(g, rc);
    }
    return rc;
}

/* hello (rank 0: with a pending step's units), then the late acks of that step. 0,
 * DFLASH_EAGAIN (try again), DFLASH_EEXISTS (another live drafter has our name, or a live
 * process of our run replaced us) or DFLASH_EDENIED saying so (worker_session_key_refused: a
 * live drafter of another CURVE key has our name): refused for good, the loop ends through
 * end_refused, exit 4 (defect: such a DENIED was retried until that drafter was gone). */
static int do_register(gw *g)
{
    char note[WIRE_MAX_NAME + 16];
    snprintf(note, sizeof note, " for group %s", g->cfg->group);
    int rc = worker_session_hello(g->s, g->pending ? g->pending_units : NULL,
                                  g->pending ? g->n_pending : 0, note);
    heard(g, rc);
    if (rc == DFLASH_EEXISTS ||
        (rc == DFLASH_EDENIED && worker_session_key_refused(g->s, "hello"))) { /* for good */
        LOG_ERROR("the broker refused our hello: %s", client_last_error(g->cl));
        g->st.name_in_use = true;
        g->refused = true;
        return rc;
    }
    if (rc < 0) {
        set_waiting(g, "for the broker to take our hello (%s)",
                    rc == DFLASH_ETIMEOUT ? "no answer" : client_last_error(g->cl));
        return DFLASH_EAGAIN;
    }
    if (g->pending) {
        uint32_t refused = 0;
        for (uint32_t i = 0; i < g->n_pending; i++) {
            int arc = ack_at(g, &g->pending_units[i], g->pending_step);
            if (arc == DFLASH_ERANGE) { /* outside this ledger's plan: it can never take it */
                if (!refused++)
                    LOG_WARN("step %llu (whose StepDone the broker did not take): the ack of "
                             "(%u, %u, %llu) is refused for good (%s): this broker's ledger "
                             "does not hold that batch (a new or lost journal?); let go",
                             (unsigned long long)g->pending_step, g->pending_units[i].epoch,
                             g->pending_units[i].bucket,
                             (unsigned long long)g->pending_units[i].index,
                             client_last_error(g->cl));
                continue;
            }
            if (arc && arc != DFLASH_EEXISTS) return DFLASH_EAGAIN;
        }
        LOG_INFO("step %llu (whose StepDone the broker did not take): %u units acked, %u the "
                 "broker's ledger does not hold", (unsigned long long)g->pending_step,
                 g->n_pending - refused, refused);
        g->pending = false;
    }
    return 0;
}

/* The run ends (its last step, or a stop) after this broker answered our StepDone STALE and
 * before we joined again: the step may be orphaned (the broker expired every rank while we
 * trained it) and only a GroupJoin reporting our model step resolves it; unresolved, the broker
 * gives its batches back after --group-hold-ms, though our final checkpoint has them. One join
 * (registering again first when the broker forgot us; the goodbye follows in finish()). */
static void report_refused_step(gw *g)
{
    if (!g->refused_step) return;
    wire_group_view v;
    uint64_t ms = g->cons->model_step(g->cons->ctx);
    int rc = DFLASH_ETIMEOUT;
    for (int a = 0; a < 20 && rc != 0 && rc != DFLASH_ESHUTDOWN && !broker_lost(g); a++) {
        rc = client_group_join(g->cl, g->cfg->group, ms, 0, -1, 0, &v);
        heard(g, rc);
        if (rc == DFLASH_ESTALE && do_register(g) < 0) break;
        if (rc != 0 && rc != DFLASH_ESHUTDOWN) monotime_sleep_ms(50);
    }
    if (rc == DFLASH_ESHUTDOWN) { /* nothing left and no step of ours in flight: resolved */
        g->refused_step = false;
        LOG_INFO("group %s: the broker holds no step of ours to resolve (%s)", g->cfg->group,
                 client_last_error(g->cl));
    } else if (rc == 0) {
        g->refused_step = false;
        LOG_INFO("group %s: joined once more before the end, at model step %llu, so the broker "
                 "can resolve the step it did not take as done", g->cfg->group,
                 (unsigned long long)ms);
    } else {
        LOG_WARN("group %s: could not join once more before the end (%s: %s): if the broker "
                 "orphaned our last step, its batches go back to to-do after --group-hold-ms "
                 "although the final checkpoint has them", g->cfg->group, err_str(rc),
                 client_last_error(g->cl));
    }
}

/* The checkpoint's unacked batches, at a GroupView v (see the top: acked when our model is the
 * group's, rank 0, and v's step is at or past theirs, else let go: a model the group was
 * re-created from elsewhere may have reached that step without them). true once none is left;
 * false when an ack found no broker (they are tried again at the next view) or a broker that
 * does not know us (state REGISTER). */
static bool resolve_resumed(gw *g, const wire_group_view *v)
{
    while (g->next_resumed < g->n_resumed) {
        const worker_unacked *b = &g->resumed[g->next_resumed];
        wire_unit u = {.epoch = b->wu.epoch, .bucket = b->wu.bucket, .index = b->wu.batch};
        if (v->rank != 0 || v->step < b->step) {
            LOG_WARN("batch (%u, %u, %llu) of the checkpoint we resumed from, trained at step %llu "
                     "without an ack before the stop, is not known to be in the model group %s "
                     "goes on from (rank 0's, at step %llu%s): the broker trains it again",
                     u.epoch, u.bucket, (unsigned long long)u.index, (unsigned long long)b->step,
                     g->cfg->group, (unsigned long long)v->step,
                     v->rank != 0 ? ", another member's model" : "");
            g->next_resumed++;
            continue;
        }
        int rc = ack_at(g, &u, b->step);
        if (rc == DFLASH_ETIMEOUT) return false;
        if (rc == DFLASH_ESTALE) {
            set_state(g, GW_REGISTER);
            return false;
        }
        if (rc == 0 || rc == DFLASH_EEXISTS)
            worker_session_resumed_acked(g->s, &u, b->step, rc);
        else
            LOG_WARN("ack of batch (%u, %u, %llu) of the checkpoint we resumed from: %s (%s)",
                     u.epoch, u.bucket, (unsigned long long)u.index, err_str(rc),
                     client_last_error(g->cl));
        g->next_resumed++;
    }
    return true;
}

/* The trained batches our model holds whose acks no broker took, for the consumer's final
 * checkpoint: a pending step's units (rank 0) and the checkpoint's not resolved yet. */
static void note_unacked(gw *g)
{
    worker_consumer *k = g->cons;
    if (!k->unacked) return;
    worker_unacked b[2 * WORKER_MAX_UNACKED];
    uint32_t n = 0;
    for (uint32_t i = 0; g->pending && i < g->n_pending; i++) {
        const wire_unit *u = &g->pending_units[i];
        b[n++] = (worker_unacked){{u->epoch, u->bucket, u->index}, g->pending_step};
    }
    for (uint32_t i = g->next_resumed; i < g->n_resumed; i++) b[n++] = g->resumed[i];
    k->unacked(k->ctx, b, n);
}

/* A collective's wait has lasted WAIT_SAY_S (then every WAIT_SAY_EVERY_S): one line saying
 * what it waits for, since when, and when it gives up. */
static void say_waiting(gw *g, const dp_comm_wait *w)
{
    if (w->waited_s < g->wait_last) g->wait_say_at = WAIT_SAY_S; /* a new wait */
    g->wait_last = w->waited_s;
    if (w->waited_s < g->wait_say_at) return;
    g->wait_say_at = w->waited_s + WAIT_SAY_EVERY_S;
    char whom[64] = "the other ranks", since[16] = "?";
    if (w->peer >= 0 && w->peer_pid > 0)
        snprintf(whom, sizeof whom, "rank %d (pid %d)", w->peer, w->peer_pid);
    else if (w->peer >= 0)
        snprintf(whom, sizeof whom, "rank %d", w->peer);
    time_t t0 = time(NULL) - (time_t)w->waited_s;
    struct tm tm;
    if (gmtime_r(&t0, &tm)) strftime(since, sizeof since, "%H:%M:%SZ", &tm);
    LOG_INFO("group %s epoch %llu rank %d of %d: step %llu: waiting for %s in the collective "
             "(%s) since %s, %.0f s; the group breaks at %.0f s (--comm-timeout-s)",
             g->cfg->group, (unsigned long long)g->epoch, g->rank, g->world,
             (unsigned long long)g->cons->model_step(g->cons->ctx), whom, w->what, since,
             w->waited_s, w->timeout_s);
}

/* Whether the broker has ended our epoch (see the top of this file); its words in why. Not
 * asked once the loop is done (a closing communicator's wait): the join would take us back
 * into the group we may have left. */
static bool epoch_over(gw *g, char *why, size_t len)
{
    if (g->state == GW_DONE || broker_lost(g)) return false;
    wire_group_view v;
    uint64_t ms = g->cons->model_step(g->cons->ctx);
    int rc = client_group_join(g->cl, g->cfg->group, ms, 0, -1, 0, &v);
    heard(g, rc);
    if (rc == 0 && v.epoch == g->epoch && v.id_len == DP_COMM_ID_BYTES &&
        memcmp(v.id, g->id, DP_COMM_ID_BYTES) == 0)
        return false; /* our epoch stands: the peers are slow, not gone */
    if (rc == 0)
        snprintf(why, len, "the broker has moved group %s on to epoch %llu (rank %u of %u)",
                 g->cfg->group, (unsigned long long)v.epoch, v.rank, v.world);
    else if (rc == DFLASH_EAGAIN || rc == DFLASH_ESTALE)
        snprintf(why, len, "the broker has ended epoch %llu of group %s: %s",
                 (unsigned long long)g->epoch, g->cfg->group, client_last_error(g->cl));
    else
        return false; /* no answer, or one that says nothing of the epoch: wait on */
    return true;
}

/* The communicator's watch (collective.h): called from inside a collective that has waited
 * DP_COMM_WATCH_S, about every DP_COMM_WATCH_S while it waits. Main thread. */
static bool comm_watch(void *ctx, const dp_comm_wait *w, char *why, size_t len)
{
    gw *g = ctx;
    say_waiting(g, w);
    return epoch_over(g, why, len);
}

/* --group-size: an epoch of fewer ranks does not start (its rank 0 posts no id) while the wait
 * lasts, and the ranks poll the view: a member joining meanwhile forms a new epoch at once (a
 * FORMING group re-forms for a joiner, group.h), so every step is the full group's, from the
 * first (a group started by its first rank alone trained steps of one batch a micro-step until
 * the others came). After --group-wait-s rank 0 goes on with the ranks it has, said once. An
 * epoch whose id is posted has started (its rank 0 decided): the others take it as it is. True
 * to go on with the view. */
static bool full_group(gw *g, const wire_group_view *v)
{
    const worker_loop_config *c = g->cfg;
    if (!c->group_size || v->world >= c->group_size || v->id_len) {
        g->size_wait_since = 0;
        return true;
    }
    double now = monotime_s();
    if (!g->size_wait_since) {
        g->size_wait_since = now;
        LOG_INFO("group %s epoch %llu: %u of its %u ranks (--group-size) have joined: waiting up "
                 "to %.0f s (--group-wait-s) for the others before training", c->group,
                 (unsigned long long)v->epoch, v->world, c->group_size, c->group_wait_s);
    }
    double waited = now - g->size_wait_since;
    if (waited >= c->group_wait_s) {
        LOG_WARN("group %s epoch %llu: %u of its %u ranks (--group-size) after %.0f s "
                 "(--group-wait-s): going on with them, %u batches a step instead of %u",
                 c->group, (unsigned long long)v->epoch, v->world, c->group_size, waited,
                 v->world * g->accumulate, c->group_size * g->accumulate);
        g->size_wait_since = 0;
        return true;
    }
    set_waiting(g, "for group %s's %u ranks (%u joined, --group-size; %.0f s more at most)",
                c->group, c->group_size, v->world, c->group_wait_s - waited);
    monotime_sleep_ms(50);
    return false;
}

/* Sleeps ms, in short slices, returning early at a stop. joining() waits so after a
 * communicator that failed to open at once (no GPU memory for NCCL's staging, /dev/shm full):
 * it fails again at once, and without a wait the rank joined, re-formed and logged it
 * thousands of times a second (test_worker_session's fake broker showed it). */
static void wait_unless_stopped(gw *g, int ms)
{
    for (int waited = 0; waited < ms && !*g->stop; waited += 50) monotime_sleep_ms(50);
}

/* The broker's SHUTDOWN to a join or a claim under --exit-when-drained: the data's end (or the
 * plan's, or a drain) and nothing of our group in flight, so the loop ends. */
static void nothing_left(gw *g)
{
    LOG_INFO("the broker has nothing more for us (%s): done", client_last_error(g->cl));
    set_state(g, GW_DONE);
}

/* One JOINING iteration: poll the view; rank 0 posts the id; open and sync. 0 or fatal. */
static int joining(gw *g)
{
    const worker_loop_config *c = g->cfg;
    worker_consumer *k = g->cons;
    close_comm(g);
    if (k->done && k->done(k->ctx)) {
        report_refused_step(g);
        set_state(g, GW_DONE);
        return 0;
    }
    wire_group_view v;
    uint64_t ms = k->model_step(k->ctx);
    int rc = client_group_join(g->cl, c->group, ms, g->failed_epoch, g->gone_rank,
                               c->group_size, &v);
    heard(g, rc);
    uint64_t committed = rc == DFLASH_EAGAIN ? client_last_error_committed_step(g->cl) : 0;
    if (committed && k->done_at && k->done_at(k->ctx, committed)) {
        /* held for a member resuming from the group's newest checkpoint, which is at our step
         * limit: that member's run ended there (or will), and we have nothing to add (defect:
         * we waited the broker's hold out, created the group at our step, were refused the
         * rewind and exited 1, the run finished all the same) */
        LOG_INFO("group %s: its newest committed checkpoint is at step %llu, where our run "
                 "stops (--max-steps, or the schedule's end): nothing to train; done",
                 c->group, (unsigned long long)committed);
        set_state(g, GW_DONE);
        return 0;
    }
    if (rc == DFLASH_EAGAIN || rc == DFLASH_ETIMEOUT) {
        if (rc == DFLASH_EAGAIN) /* the broker's reason names the group */
            set_waiting(g, "to join group %s (the broker: %s)", c->group, client_last_error(g->cl));
        else
            set_waiting(g, "for the broker's answer to our join of group %s", c->group);
        uint64_t now = monotime_ms();
        if (rc == DFLASH_EAGAIN && now - g->wait_said_ms >= 10000) { /* the broker's reason */
            LOG_INFO("joining: %s", client_last_error(g->cl)); /* it names the group */
            g->wait_said_ms = now;
        }
        monotime_sleep_ms(20);
        return 0;
    }
    if (rc == DFLASH_ESHUTDOWN && c->exit_when_drained) {
        /* we state --exit-when-drained in the join (client_set_group_ends_when_drained): the
         * broker has nothing left and no step of our group in flight; without the answer a
         * rank whose partner left at the data's end waited --group-wait-s for another */
        nothing_left(g);
        return 0;
    }
    if (rc == DFLASH_ESHUTDOWN) { /* not asked for: as a claim's without --exit-when-drained */
        set_waiting(g, "for work: the broker has nothing to hand out (%s)",
                    client_last_error(g->cl));
        monotime_sleep_ms(100);
        return 0;
    }
    if (rc == DFLASH_ESTALE) {
        set_state(g, GW_REGISTER);
        return 0;
    }
    /* The refusal says what differs (Error.mismatch). A broker older than the field says
     * nothing: one that predates accumulation in groups refuses only a shape (it ignores our
     * accumulate), so nothing stated is a shape refusal. (Brokers built between the two, never
     * released, refused an accumulate without the field: we then give the shape advice after
     * their words, which name --accumulate; exit 2 all the same.) */
    if (rc == DFLASH_EMISMATCH &&
        client_last_error_mismatch(g->cl) == WIRE_MISMATCH_ACCUMULATE) {
        LOG_ERROR("the broker refused to let us join group %s: %s; every rank needs the group's "
                  "--accumulate (ours: %u)", c->group, client_last_error(g->cl), g->accumulate);
        worker_session_note_refusal(g->s);
        g->refused = true;
        return DFLASH_ECONFIG; /* the flags: exit 2 */
    }
    if (rc == DFLASH_EMISMATCH) { /* our shape is not the group's: the group did not re-form */
        const char *why = client_last_error(g->cl);
        bool named = g->shape_text[0] && strstr(why, g->shape_text); /* the broker's words */
        LOG_ERROR("the broker refused to let us join group %s: %s%s%s%s; every rank needs the "
                  "group's drafter and collective: start this one with its rank 0's model "
                  "flags (--draft-layers, --block-size, --capture-layers, the target) or "
                  "checkpoint, and its --comm",
                  c->group, why, named ? "" : " (ours: ", named ? "" : g->shape_text,
                  named ? "" : ")");
        worker_session_note_refusal(g->s);
        g->refused = true;
        return DFLASH_ECONFIG; /* the flags: exit 2 */
    }
    if (rc == DFLASH_EFULL || rc == DFLASH_EEXISTS || rc == DFLASH_EDENIED ||
        rc == DFLASH_ESTATE || /* the ledger cannot go back to our step */
        rc == DFLASH_EPROTO) { /* PROTO: a broker from before groups existed */
        LOG_ERROR("the broker refused to let us join group %s: %s (%s)", c->group, err_str(rc),
                  client_last_error(g->cl));
        /* DENIED to a drafter's join: a solo trainer of another model trains there (exit 6) */
        if (rc == DFLASH_EDENIED) g->st.other_model = true;
        worker_session_note_refusal(g->s);
        g->refused = true;
        return rc;
    }
    if (rc < 0) {
        LOG_WARN("group join: %s (%s)", err_str(rc), client_last_error(g->cl));
        set_waiting(g, "for the broker to take our join of group %s (%s)", c->group,
                    client_last_error(g->cl));
        monotime_sleep_ms(100);
        return 0;
    }
    g->pending = false; /* the broker resolved a step in flight by the model step we reported */
    g->refused_step = false;
    g->failed_epoch = 0; /* reported: the view is of the epoch after it (or one past it) */
    g->gone_rank = -1;
    if (!resolve_resumed(g, &v)) return 0; /* before anything is trained: join again */
    if (!full_group(g, &v)) return 0;        /* fewer ranks than --group-size: join again */
    uint8_t id[DP_COMM_ID_BYTES];
    memset(id, 0, sizeof id);
    char err[600] = "";
    dp_comm_kind kind = (dp_comm_kind)c->comm_kind;
    if (v.rank == 0 && v.id_len == 0) {
        if ((rc = dp_comm_make_id(kind, id, err, sizeof err)) < 0) {
            LOG_ERROR("cannot make a %s rendezvous id: %s (%s)", dp_comm_kind_name(kind), err,
                      err_str(rc));
            return rc;
        }
        rc = client_group_set_id(g->cl, c->group, v.epoch, id, DP_COMM_ID_BYTES);
        if (rc < 0) { /* the epoch moved on, or a lost reply: ask again */
            if (rc == DFLASH_ESTALE && client_broker_restarted(g->cl)) set_state(g, GW_REGISTER);
            return 0;
        }
    } else if (v.id_len == 0) {
        set_waiting(g, "for group %s epoch %llu to start: rank 0 has not posted its id (we are rank "
                    "%u of %u)", c->group, (unsigned long long)v.epoch, v.rank, v.world);
        monotime_sleep_ms(20); /* rank 0 has not posted the id yet */
        return 0;
    } else {
        memcpy(id, v.id, v.id_len < sizeof id ? v.id_len : sizeof id);
    }
    LOG_INFO("group %s epoch %llu: rank %u of %u (rank 0 at step %llu); opening the %s "
             "communicator", c->group, (unsigned long long)v.epoch, v.rank, v.world,
             (unsigned long long)v.step, dp_comm_kind_name(kind));
    g->epoch = v.epoch;
    memcpy(g->id, id, sizeof id);
    g->rank = (int)v.rank;
    g->world = (int)v.world;
    dp_comm_watch watch = {comm_watch, g};
    double opened_at = monotime_s();
    rc = dp_comm_open_watched(kind, id, (int)v.rank, (int)v.world, c->device, c->comm_timeout_s,
                              &watch, &g->comm, err, sizeof err);
    if (rc == DFLASH_ECONFIG) { /* our own setup (two nccl ranks on one GPU): see the top */
        LOG_ERROR("group %s epoch %llu rank %u of %u: cannot open the %s communicator: %s; this "
                  "rank leaves the group (a re-form would fail the same way)", c->group,
                  (unsigned long long)v.epoch, v.rank, v.world, dp_comm_kind_name(kind), err);
        g->config_fault = true;
        set_state(g, GW_DONE); /* finish(): the final checkpoint, then goodbye to the group */
        return 0;
    }
    if (rc < 0) {
        char why[700];
        if (monotime_s() - opened_at >= 1.0) { /* a wait for the others: they join again */
            g->open_retry_ms = 0;
            snprintf(why, sizeof why, "cannot open the communicator: %s (%s)", err, err_str(rc));
        } else { /* it failed at once and will again: wait longer each time */
            g->open_retry_ms = g->open_retry_ms ? g->open_retry_ms * 2 : OPEN_RETRY_FIRST_MS;
            if (g->open_retry_ms > OPEN_RETRY_MAX_MS) g->open_retry_ms = OPEN_RETRY_MAX_MS;
            snprintf(why, sizeof why, "cannot open the communicator: %s (%s); joining again in "
                     "%.1f s", err, err_str(rc), g->open_retry_ms / 1000.0);
        }
        reform(g, why);
        wait_unless_stopped(g, g->open_retry_ms);
        return 0;
    }
    g->open_retry_ms = 0;
    k->set_group(k->ctx, g->comm, (int)v.rank, (int)v.world);
    if ((rc = k->sync_state(k->ctx, 0)) < 0) {
        /* MISMATCH: we differ from rank 0, whose model is the group's; CONFIG: we cannot train
         * with its settings (the consumer said why) */
        if (rc == DFLASH_EMISMATCH || rc == DFLASH_ECONFIG) {
            if (rc == DFLASH_EMISMATCH)
                LOG_ERROR("group %s: our drafter's shape differs from rank 0's, the group's "
                          "model: give every rank the same model flags (--draft-layers, "
                          "--block-size, the target); leaving the group", c->group);
            close_comm(g);
            client_group_leave(g->cl, c->group); /* the others re-form without us at once */
            return DFLASH_ECONFIG;
        }
        /* AGAIN: a rank of another shape was turned away (dflash_dp said which) */
        reform(g, rc == DFLASH_EAGAIN ? "a rank whose drafter differs from rank 0's is not "
                                        "taken; going on without it"
                                      : "syncing rank 0's state failed");
        return 0;
    }
    g->failed_epoch = 0;
    g->gone_rank = -1;
    LOG_INFO("group %s epoch %llu: rank %d of %d in sync at step %llu (state hash %016llx)",
             c->group, (unsigned long long)g->epoch, g->rank, g->world,
             (unsigned long long)k->model_step(k->ctx),
             (unsigned long long)(k->state_hash ? k->state_hash(k->ctx) : 0));
    set_state(g, GW_STEPPING);
    return 0;
}

/* Rank 0: reports the pending step done. Keeps it pending while no broker answers (0 then:
 * sent again before the next claim, or by finish()); a restarted broker gets it through the
 * hello (late acks). After a stop, the tries end at the first the broker does not answer.
 * 0 or fatal. */
static int step_done(gw *g)
{
    uint64_t s = g->pending_step, acked = 0;
    int rc = DFLASH_ETIMEOUT;
    for (int a = 0; a < 50 && rc == DFLASH_ETIMEOUT && !broker_lost(g); a++) {
        rc = client_step_done(g->cl, g->cfg->group, g->epoch, s, &acked);
        heard(g, rc);
    }
    if (rc == DFLASH_ESTALE && client_broker_restarted(g->cl)) {
        close_comm(g);
        set_state(g, GW_REGISTER); /* hello carries the units; they are acked then */
        return 0;
    }
    if (rc == DFLASH_ETIMEOUT) {
        LOG_WARN("step %llu of epoch %llu: no broker answered its StepDone (%s); kept, reported "
                 "again when the broker answers", (unsigned long long)s,
                 (unsigned long long)g->epoch, client_last_error(g->cl));
        return 0;
    }
    g->pending = false;
    if (rc == 0) {
        LOG_DEBUG("group step %llu done: %llu units acked", (unsigned long long)s,
                  (unsigned long long)acked);
    } else if (rc == DFLASH_ESTALE) {
        LOG_WARN("step %llu of epoch %llu: the broker did not take it as done (%s); the model "
                 "the group goes on from decides it: a surviving rank's, or, if the broker "
                 "expired every rank, the one that creates the group again (ours when we join "
                 "first: the join reports our model step)", (unsigned long long)s,
                 (unsigned long long)g->epoch, client_last_error(g->cl));
        g->refused_step = true;
        reform(g, "step done refused");
    } else {
        LOG_ERROR("the broker did not take step %llu of epoch %llu as done: %s (%s); our model "
                  "has it", (unsigned long long)s, (unsigned long long)g->epoch, err_str(rc),
                  client_last_error(g->cl));
    }
    return 0;
}

/* No step pending: the consumer's settled() (rank 0: a periodic checkpoint, written only once
 * the broker has the step, worker_loop.h, and after the broker's durability barrier:
 * worker_session_offer_barrier), then rank 0's commit report of a new checkpoint, unless one
 * failed within WORKER_COMMIT_RETRY_MS (worker_session_commit_due). 0 or the consumer's fatal
 * code. */
static int settle(gw *g)
{
    worker_consumer *k = g->cons;
    if (k->settled) {
        int rc = k->settled(k->ctx);
        if (rc < 0) return rc;
    }
    uint64_t cs = k->committed ? k->committed(k->ctx) : 0;
    if (g->rank == 0 && cs > g->committed_reported && worker_session_commit_due(g->s)) {
        LOG_DEBUG("reporting checkpoint step %llu as committed", (unsigned long long)cs);
        int crc = worker_session_commit(g->s, cs, 20);
        worker_session_commit_noted(g->s, cs, crc); /* a failure: said, and backed off */
        if (crc == 0) g->committed_reported = cs;
    }
    return 0;
}

/* The consumer's answer for step s (consume() of a one-batch step, or close_step() after the
 * micro-steps; rc its code, step the model's): a bad batch, or a step that diverged (every
 * rank finds it: the group's loss and norm), is fatal, without a StepDone; re-forming would go
 * on from the non-finite weights; a step the group cannot take (EUNSUPPORTED) would fail again
 * after every re-form. Any other failure re-forms. Else rank 0 reports the step done with all
 * its units (every micro-step's, step_units). 0 or fatal. */
static int step_taken(gw *g, int rc, uint64_t step, uint64_t s)
{
    if (rc == DFLASH_ECORRUPT || rc == DFLASH_EMISMATCH || rc == DFLASH_ENONFINITE ||
        rc == DFLASH_EUNSUPPORTED)
        return rc;
    if (rc < 0) {
        char why[200];
        snprintf(why, sizeof why, "step %llu failed in the group: %s", (unsigned long long)s,
                 err_str(rc));
        reform(g, why);
        return 0;
    }
    if (step != s)
        LOG_WARN("group step %llu: the model reports step %llu", (unsigned long long)s,
                 (unsigned long long)step);
    uint32_t n = g->n_step_units;
    g->micro = g->n_step_units = 0;
    if (g->rank != 0) return 0;
    g->pending = true;
    g->pending_step = s;
    g->n_pending = n;
    memcpy(g->pending_units, g->step_units, n * sizeof *g->step_units);
    return step_done(g);
}

/* Closes the open step of micro-steps (the last one trained, or the broker ended the step
 * before the next: ESHUTDOWN to its claim): the collective and the update (the consumer's
 * close_step), then step_taken. 0 or fatal. */
static int close_step(gw *g, uint64_t s)
{
    uint64_t step = 0;
    int rc = g->cons->close_step(g->cons->ctx, &step);
    return step_taken(g, rc, step, s);
}

/* A grant of micro-step k from a broker that knows micro-steps (has_micro), else our
 * --accumulate cannot work there: the slot is given back unread and the loop ends
 * (DFLASH_ECONFIG: exit 2). A grant of another micro-step than ours re-forms. 0 to go on. */
static int check_micro(gw *g, const wire_step_grant *sg)
{
    if (g->accumulate <= 1 || (sg->has_micro && sg->micro == g->micro)) return 0;
    if (sg->has_micro) {
        reform(g, "the broker granted another micro-step than ours");
        return 1;
    }
    LOG_ERROR("--accumulate %u in group %s: the broker predates gradient accumulation in groups "
              "(its StepGrant names no micro-step); run the group without --accumulate, or "
              "upgrade dflash-queue", g->accumulate, g->cfg->group);
    int rc = client_release_unread(g->cl, sg->grant.lease_id);
    heard(g, rc);
    close_comm(g);
    client_group_leave(g->cl, g->cfg->group); /* the others re-form at once */
    return DFLASH_ECONFIG;
}

/* Copies our slot of the step (of micro-step `micro` with accumulation), releases it, trains,
 * and after the step's last micro-step (rank 0) reports the step done. A slot written for
 * another layout (the target's configuration, not the batch's fault) is given back unread and
 * ends the loop with DFLASH_ECONFIG, as in the solo loop. */
static int run_step(gw *g, const wire_step_grant *sg, uint64_t s)
{
    int crc = check_micro(g, sg);
    if (crc) return crc < 0 ? crc : 0;
    const wire_grant *gr = &sg->grant;
    int rc = worker_session_copy(g->s, gr, NULL);
    bool misfit = rc == 0 && worker_session_check_layout(g->s, g->cons, gr) < 0;
    int rrc = DFLASH_ETIMEOUT;
    for (int a = 0; a < 20 && rrc == DFLASH_ETIMEOUT && !*g->stop; a++) {
        rrc = misfit ? client_release_unread(g->cl, gr->lease_id)
                     : client_release(g->cl, gr->lease_id);
        heard(g, rrc);
    }
    if (misfit) {
        close_comm(g);
        client_group_leave(g->cl, g->cfg->group); /* the others re-form without us at once */
        return DFLASH_ECONFIG;
    }
    if (rc < 0) {
        if (worker_session_copy_hopeless(g->s, rc)) return DFLASH_EPEER;
        reform(g, "cannot copy our slot of the step");
        return 0;
    }
    if (rrc < 0) { /* the lease was taken back or expired: the step cannot be trained here */
        if (rrc == DFLASH_ESTALE) g->st.stale_releases++;
        if (rrc == DFLASH_ESTALE && client_broker_restarted(g->cl)) {
            close_comm(g);
            set_state(g, GW_REGISTER);
            return 0;
        }
        reform(g, "our slot's lease is no longer ours");
        return 0;
    }
    uint64_t step = 0;
    rc = worker_session_consume(g->s, g->cons, gr, &step);
    if (rc < 0) return step_taken(g, rc, step, s);
    g->st.batches++;
    g->st.tokens += gr->n_tokens;
    for (uint32_t i = 0; i < sg->n_units && g->n_step_units < WIRE_MAX_WORLD; i++)
        g->step_units[g->n_step_units++] = sg->units[i];
    if (g->accumulate <= 1) return step_taken(g, 0, step, s);
    return ++g->micro < g->accumulate ? 0 : close_step(g, s);
}

/* One STEPPING iteration. 0 or a fatal code. */
static int stepping(gw *g, double *backoff)
{
    const worker_loop_config *c = g->cfg;
    worker_consumer *k = g->cons;
    if (g->micro == 0 && ((c->max_batches > 0 && (int64_t)g->st.batches >= c->max_batches) ||
                          (k->done && k->done(k->ctx)))) {
        set_state(g, GW_DONE);
        return 0;
    }
    if (g->pending) { /* rank 0: a StepDone no broker answered goes first */
        double t0 = monotime_s();
        int rc = step_done(g);
        if (rc == 0 && g->pending) {
            monotime_sleep_ms(*backoff);
            *backoff = *backoff < 20 ? *backoff * 2 : 20;
            g->st.wait_grant_s += monotime_s() - t0;
        }
        return rc;
    }
    int rc = g->micro ? 0 : settle(g); /* checkpoints between steps only */
    if (rc < 0) return rc;
    uint64_t s = k->model_step(k->ctx) + 1;
    static wire_step_grant sg; /* main thread only; large */
    double t0 = monotime_s();
    rc = client_step_claim(g->cl, c->group, g->epoch, s, g->micro, &sg);
    heard(g, rc);
    if (rc == 0) {
        *backoff = 1;
        return run_step(g, &sg, s);
    }
    if (rc == DFLASH_ESHUTDOWN && g->micro > 0) { /* the same answer reached every rank */
        LOG_INFO("group step %llu closes with %u of its %u micro-steps: %s",
                 (unsigned long long)s, g->micro, g->accumulate, client_last_error(g->cl));
        return close_step(g, s);
    }
    if (rc == DFLASH_EAGAIN || rc == DFLASH_ETIMEOUT) {
        if (k->idle) k->idle(k->ctx);
        worker_session_close_stale_pools(g->s);
        monotime_sleep_ms(*backoff);
        *backoff = *backoff < 20 ? *backoff * 2 : 20;
        g->st.wait_grant_s += monotime_s() - t0;
    } else if (rc == DFLASH_ESHUTDOWN && c->exit_when_drained) {
        nothing_left(g);
    } else if (rc == DFLASH_ESHUTDOWN) {
        monotime_sleep_ms(100);
    } else if (rc == DFLASH_ESTALE && client_broker_restarted(g->cl)) {
        close_comm(g);
        set_state(g, GW_REGISTER);
    } else if (rc == DFLASH_ESTALE || rc == DFLASH_ESTATE) {
        reform(g, client_last_error(g->cl));
    } else {
        LOG_WARN("step claim: %s (%s)", err_str(rc), client_last_error(g->cl));
        monotime_sleep_ms(100);
    }
    return 0;
}

/* A progress line every cfg->progress_ms: in a group (STEPPING), our rank, batches and
 * tokens/s, time waiting for a step's slots; outside one, that we train nothing, what we wait
 * for and since when. */
static void progress(gw *g)
{
    worker_stats d;
    double dt;
    if (!worker_session_progress_due(g->s, &d, &dt)) return;
    if (g->state != GW_STEPPING) {
        LOG_INFO("group %s: not training for %.0f s, waiting %s (model step %llu, batches %llu)",
                 g->cfg->group, monotime_s() - g->waiting_since, g->waiting,
                 (unsigned long long)g->cons->model_step(g->cons->ctx),
                 (unsigned long long)g->st.batches);
        return;
    }
    LOG_INFO("group %s epoch %llu rank %d of %d: step %llu, batches %llu, %.0f tokens/s, waiting "
             "for a step %.0f%%", g->cfg->group, (unsigned long long)g->epoch, g->rank, g->world,
             (unsigned long long)g->cons->model_step(g->cons->ctx),
             (unsigned long long)g->st.batches, (double)d.tokens / dt,
             100.0 * d.wait_grant_s / dt);
}

/* The broker refused our hello or join for good (`refused`): the loop ends (main.c: exit 4, 6,
 * or as the join's code) with no more requests. The model keeps what it trained: rank 0's final
 * checkpoint, reported to no broker (worker_session_save_refused; the consumer writes nothing on
 * another rank), a pending step in it without a StepDone. Returns the refusal's code. */
static int end_refused(gw *g, int rc)
{
    char step[48];
    snprintf(step, sizeof step, "step %llu", (unsigned long long)g->pending_step);
    note_unacked(g);
    worker_session_save_refused(g->s, g->cons, g->pending ? step : NULL);
    g->pending = false;
    return rc < 0 ? rc : DFLASH_EEXISTS;
}

/* The loop ended without a fatal error: the pending step's StepDone (first, as before
 * settle()), the final checkpoint (rank 0; the consumer knows), its commit, goodbye to the
 * group. A broker lost after a stop signal gets no request: the checkpoint comes at once. */
static int finish(gw *g)
{
    worker_consumer *k = g->cons;
    int src = 0;
    if (g->pending && client_broker_incarnation(g->cl)) { /* the final checkpoint has it */
        src = DFLASH_ETIMEOUT;
        for (int a = 0; a < 3 && src == DFLASH_ETIMEOUT && !broker_lost(g); a++) {
            src = client_step_done(g->cl, g->cfg->group, g->epoch, g->pending_step, NULL);
            heard(g, src);
        }
        if (src == DFLASH_ESTALE && client_broker_restarted(g->cl) && do_register(g) == 0)
            src = 0; /* the hello carried the units, acked at the step */
        if (src == DFLASH_ESTALE && !client_broker_restarted(g->cl)) {
            g->refused_step = true; /* resolved below by a join */
            src = 0;
        }
        /* untaken: no broker answered, or a restarted one that our hello did not reach */
        bool untaken = src == DFLASH_ETIMEOUT || src == DFLASH_ESTALE;
        if (untaken)
            LOG_WARN("step %llu goes into the final checkpoint but no broker took it as done (%s): "
                     "the checkpoint records its batches, and the drafter resumed from it acks "
                     "them", (unsigned long long)g->pending_step, err_str(src));
        g->pending = untaken; /* for note_unacked */
    }
    if (client_broker_incarnation(g->cl) && !broker_lost(g))
        report_refused_step(g); /* a stop before the join */
    if (g->refused) return end_refused(g, 0); /* a hello above */
    note_unacked(g);
    g->pending = false;
    int rc = k->finish ? k->finish(k->ctx) : 0;
    if (rc < 0) return rc;
    if (src == DFLASH_ETIMEOUT || broker_lost(g)) return 0; /* no broker: no commit, no goodbye */
    if (k->state_hash)
        LOG_INFO("group %s: final state at step %llu has hash %016llx", g->cfg->group,
                 (unsigned long long)k->model_step(k->ctx),
                 (unsigned long long)k->state_hash(k->ctx));
    if (!client_broker_incarnation(g->cl)) return 0;
    /* reported also when it is the periodic checkpoint reported already (a stop right after
     * it, or inside the next step, whose micro-steps are abandoned), as the solo loop does: the
     * line says which checkpoint the run ends on (defect: none, and scripts/train said the
     * drafters reported no final checkpoint) */
    uint64_t cs = k->committed ? k->committed(k->ctx) : 0;
    if (g->rank == 0 && cs && cs >= g->committed_reported &&
        worker_session_commit_final(g->s, cs) == 0)
        g->committed_reported = cs;
    client_group_leave(g->cl, g->cfg->group);
    return 0;
}

int group_worker_run(const worker_loop_config *cfg, worker_consumer *cons,
                     volatile sig_atomic_t *stop, worker_stats *stats)
{
    gw g = {.cfg = cfg, .cons = cons, .stop = stop, .state = GW_REGISTER, .world = 1,
            .gone_rank = -1, .wait_say_at = WAIT_SAY_S};
    int rc = 0;
    double start = monotime_s();
    if (!cons->set_group || !cons->sync_state || !cons->model_step) {
        LOG_ERROR("--group: the %s mode cannot train in a group (use --train)", cons->name);
        rc = DFLASH_ECONFIG; /* the flags: exit 2 */
        goto out;
    }
    g.s = worker_session_new(cfg, &g.st, stop, &rc);
    if (!g.s) goto out;
    g.cl = worker_session_client(g.s);
    worker_session_offer_barrier(g.s, cons);
    if (cons->shape) { /* stated in every join: the broker turns away another shape (joining) */
        uint64_t shape = cons->shape(cons->ctx, g.shape_text, sizeof g.shape_text);
        /* and the collective: a rank of another --comm is turned away the same way */
        shape = dp_comm_shape((dp_comm_kind)cfg->comm_kind, shape, g.shape_text,
                              sizeof g.shape_text);
        client_set_drafter_shape(g.cl, shape, g.shape_text);
    }
    g.accumulate = cons->accumulate ? cons->accumulate(cons->ctx) : 1;
    if (g.accumulate > 1 && !cons->close_step) {
        LOG_ERROR("--group: the %s mode cannot accumulate micro-steps", cons->name);
        rc = DFLASH_ECONFIG;
        goto out_comm;
    }
    client_set_group_accumulate(g.cl, g.accumulate); /* stated in every join, as the shape */
    client_set_group_ends_when_drained(g.cl, cfg->exit_when_drained);
    if (cons->resumed_unacked)
        g.n_resumed = cons->resumed_unacked(cons->ctx, g.resumed, WORKER_MAX_UNACKED);

    double backoff = 1, unreachable_since = monotime_s();
    g.waiting_since = unreachable_since;
    set_state(&g, GW_REGISTER); /* from REGISTER: only sets what the progress line waits for */
    gw_state was = g.state;
    while (g.state != GW_DONE) {
        worker_session_alive(g.s);
        if (*stop) {
            set_state(&g, GW_DONE);
            break;
        }
        progress(&g);
        if (g.state == GW_REGISTER && was != GW_REGISTER)
            unreachable_since = monotime_s(); /* the broker's silence counts from here */
        was = g.state;
        if (g.state == GW_REGISTER) {
            rc = do_register(&g);
            if (rc == 0) {
                unreachable_since = monotime_s();
                set_state(&g, GW_JOINING);
                continue;
            }
            if (g.refused) {
                rc = end_refused(&g, rc);
                goto out_comm;
            }
            /* --broker-wait-ms covers the start-up only: a broker lost later is waited for */
            if (g.st.registrations) {
                monotime_sleep_ms(100);
                rc = 0;
            } else if ((rc = worker_session_await_broker(g.s, unreachable_since)) < 0) {
                goto out_comm;
            }
            continue;
        }
        rc = g.state == GW_JOINING ? joining(&g) : stepping(&g, &backoff);
        if (rc < 0 && g.refused) rc = end_refused(&g, rc);
        if (was == GW_STEPPING && !g.refused &&
            (rc == DFLASH_ECONFIG || rc == DFLASH_ECORRUPT || rc == DFLASH_EMISMATCH)) {
            /* a slot of another layout (the target's configuration), a broker without our
             * --accumulate, or a bad batch, refused before use: the model is whole, keep it,
             * as the solo loop does (defect: rank 0 exited without its final checkpoint, the
             * steps since its last periodic one trained again). The communicator first: the
             * others, blocked in a step's collective, re-form meanwhile. (Slots that cannot be
             * copied, DFLASH_EPEER, end a rank without one: the group's last periodic
             * checkpoint stands, docs/operating.md.) */
            close_comm(&g);
            if (finish(&g) < 0) LOG_ERROR("the final checkpoint before this exit failed too");
            goto out_comm;
        }
        if (rc < 0) goto out_comm;
    }
    rc = finish(&g);
    if (rc == 0 && g.config_fault) rc = DFLASH_ECONFIG; /* the flags: exit 2 */
out_comm:
    close_comm(&g);
    worker_session_destroy(&g.s);
out:
    g.st.elapsed_s = monotime_s() - start;
    if (stats) *stats = g.st;
    return rc;
}
