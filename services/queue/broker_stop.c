/* broker_stop: the broker's graceful stop (the first SIGTERM or SIGINT; main.c).
 *
 * Why (defect: the broker exited at once): a host shutdown, a systemd stop or a runtime stopping
 * every container sends SIGTERM to broker, target and drafters together. A drafter in the middle
 * of a step finishes it, acks its batch, writes its final checkpoint and reports it; a broker
 * already gone answered none of it: the ack timed out, the batch went into the checkpoint unacked
 * (acked only when the drafter resumed), and the journal left it in flight.
 *
 * Phases (set_phase asserts the transitions):
 *
 *   from \ to   STOPPING                    STOPPED
 *   SERVING     broker_stop_gracefully      -
 *   STOPPING    -                           settled, grace over, or a second call
 *
 * (nothing to wait for, or a grace of 0, goes from SERVING through STOPPING to STOPPED at once).
 * STOPPED is the end: broker_shutdown (the deliberate stop's journal records, broker.h), then
 * the caller's done().
 *
 * While STOPPING, broker_stop_refuses answers Error AGAIN "the broker is stopping" (retryable:
 * a drafter that is not stopping waits and meets the next broker) to a drafter's Claim, to a
 * StepClaim that would reserve a new step (a rank's claim of the step already reserved is
 * served: its slot is leased to it already, and the step can only end with it), and to a
 * target's WorkRequest. Everything else is served as before: releases, acks, StepDone,
 * CheckpointCommitted, a leaving target's PoolLeave, hellos, heartbeats, status, steering.
 *
 * It waits, for live drafters only, for: leases out (granted, not released: policy_worker_leases),
 * batches held (released, not acked: peer.held) and a *checkpoint report*: a drafter that acked a
 * step (a group's rank 0: StepDone) after its last CheckpointCommitted and has not claimed since
 * the stop began is stopping too, and its final checkpoint's report comes next (one that claims
 * is not stopping; it reports to the next broker). broker_stop_note keeps these per peer, from
 * every request's reply. A drafter that never reports (no --checkpoint-dir) is waited for until
 * it is expired. The cron expires silent peers as always (heartbeat-ms x liveness, counted from
 * their last message, not from the stop): that ends a dead holder's leases and gives its held
 * batches back, so a dead drafter holds the stop for one liveness window at most.
 *
 * The checks run on a timer of their own (STOP_POLL_MS), never inside a request's handling: the
 * reply to the request that settles the stop is sent (or deferred for the journal) first, and
 * broker_shutdown then drains the journal and sends every deferred reply. The stop ends once
 * everything has been settled for STOP_SETTLE_MS, not at once (defect: a stopping drafter's final
 * commit report was taken and answered, and the broker exited within a millisecond; the
 * drafter's ZeroMQ socket (ZMQ_IMMEDIATE) drops a reply it has received but not read yet when
 * the connection closes, so the drafter saw no answer and said the report failed).
 *
 * While STOPPING, a StatusReply carries the same tally as the log (broker_stop_status:
 * StatusReply.stopping, docs/protocol.md), so `dflash-ctl status` and `ping` tell a stopping
 * broker from a serving one.
 *
 * Thread: the broker's loop thread. Callers: main.c (broker_stop_gracefully), broker.c
 * (dispatch: broker_stop_refuses, broker_stop_note; broker_stop: broker_stop_close;
 * broker_status: broker_stop_status), tests.
 */
#include "broker_state.h"

#include "log.h"

#include <assert.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#define STOP_POLL_MS 20
#define STOP_SETTLE_MS 200 /* settled this long before the exit: the last replies are read */

static void set_phase(broker *b, broker_stop_phase to)
{
    assert((b->stop_phase == BROKER_SERVING && to == BROKER_STOPPING) ||
           (b->stop_phase == BROKER_STOPPING && to == BROKER_STOPPED));
    b->stop_phase = to;
}

bool broker_stopping(const broker *b)
{
    return b && b->stop_phase == BROKER_STOPPING;
}

/* What the stop still waits for, summed over the live drafters, and who (text for the log). */
typedef struct unsettled {
    uint32_t drafters, leases, held, reports;
    char who[640];
} unsettled;

/* Drafter p acked a step after its last checkpoint report and has not claimed since the stop
 * began: its final checkpoint's report is to come. */
static bool owes_report(const peer *p)
{
    return p->acked_step > p->committed_step && !p->claimed_in_stop;
}

static const char *plural(uint32_t n, const char *one, const char *many)
{
    return n == 1 ? one : many;
}

/* Appends text to buf (len bytes), marking a cut with "...". The cut falls between UTF-8
 * characters (names are not charset-checked; a character cut short made dflash-ctl's JSON
 * invalid): back from the last byte that fits to the start of its character, 3 bytes at most
 * (UTF-8's longest), so a later append still finds buf cut. */
static void append(char *buf, size_t len, const char *text)
{
    size_t used = strlen(buf);
    if (used + 4 >= len) return; /* already cut */
    int n = snprintf(buf + used, len - used, "%s", text);
    if (n < 0 || (size_t)n < len - used) return;
    size_t cut = len - 4;
    for (int k = 0; k < 3 && cut > used && ((unsigned char)buf[cut] & 0xc0) == 0x80; k++)
        cut--; /* buf[cut] continues a character */
    snprintf(buf + cut, 4, "...");
}

static void tally(broker *b, unsettled *u)
{
    memset(u, 0, sizeof *u);
    for (uint32_t i = 0; i < b->n_peers; i++) {
        const peer *p = b->peers[i];
        if (p->role != WIRE_ROLE_DRAFTER || p->state != PEER_LIVE) continue;
        uint32_t leases = b->policy ? policy_worker_leases(b->policy, p->incarnation) : 0;
        bool report = owes_report(p);
        if (!leases && !p->n_held && !report) continue;
        u->drafters++;
        u->leases += leases;
        u->held += p->n_held;
        u->reports += report;
        char one[WIRE_MAX_NAME + 160], part[96];
        snprintf(one, sizeof one, "%sdrafter %s (", u->drafters > 1 ? ", " : "", p->name);
        const char *sep = "";
        if (leases) {
            snprintf(part, sizeof part, "%u %s", leases, plural(leases, "lease", "leases"));
            strcat(one, part);
            sep = ", ";
        }
        if (p->n_held) {
            snprintf(part, sizeof part, "%s%u %s in training", sep, p->n_held,
                     plural(p->n_held, "batch", "batches"));
            strcat(one, part);
            sep = ", ";
        }
        if (report) {
            snprintf(part, sizeof part, "%sa checkpoint to report: acked step %" PRIu64
                     ", reported %" PRIu64, sep, p->acked_step, p->committed_step);
            strcat(one, part);
        }
        strcat(one, ")");
        append(u->who, sizeof u->who, one);
    }
}

/* "N leases, M batches in training, K checkpoint reports: who" into out. */
static void describe(const unsettled *u, char *out, size_t len)
{
    snprintf(out, len, "%u %s, %u %s in training, %u checkpoint %s: %s", u->leases,
             plural(u->leases, "lease", "leases"), u->held, plural(u->held, "batch", "batches"),
             u->reports, plural(u->reports, "report", "reports"), u->who);
}

void broker_stop_status(broker *b, wire_status *s)
{
    s->stopping = b->stop_phase == BROKER_STOPPING;
    if (!s->stopping) return;
    unsettled u;
    tally(b, &u);
    wire_stop_stat *w = &s->stop;
    w->grace_ms = (uint64_t)b->cfg.stop_grace_ms;
    w->elapsed_ms = now_ms(b) - b->stop_since_ms;
    w->drafters = u.drafters, w->leases = u.leases, w->held = u.held, w->reports = u.reports;
    w->waiting_for[0] = '\0';
    append(w->waiting_for, sizeof w->waiting_for, u.who);
}

/* STOPPING -> STOPPED: the deliberate stop's journal records and broker_stop (which closes the
 * stop timer, drains the journal and sends the deferred replies), then the caller's done. */
static void finish(broker *b)
{
    set_phase(b, BROKER_STOPPED);
    broker_shutdown(b);
    if (b->stop_done) b->stop_done(b->stop_done_ctx);
}

static void on_stop_timer(uv_timer_t *t)
{
    broker *b = t->data;
    if (b->stop_phase != BROKER_STOPPING) return;
    unsettled u;
    tally(b, &u);
    uint64_t now = now_ms(b), waited = now - b->stop_since_ms;
    if (u.drafters) b->stop_settled_ms = 0;
    else if (!b->stop_settled_ms) b->stop_settled_ms = now;
    bool grace_over = waited >= (uint64_t)b->cfg.stop_grace_ms;
    if (!u.drafters && (now - b->stop_settled_ms >= STOP_SETTLE_MS || grace_over)) {
        LOG_INFO("stop: all settled after %" PRIu64 " ms (no lease out, every batch in training "
                 "acked, every checkpoint reported): exiting",
                 b->stop_settled_ms - b->stop_since_ms);
        return finish(b);
    }
    if (!grace_over) return;
    char what[900];
    describe(&u, what, sizeof what);
    LOG_WARN("stop: --stop-grace-ms %lld is over: exiting with %s unsettled (a later ack is "
             "recorded in the drafter's checkpoint and taken when it resumes; a lease or batch "
             "in flight returns to to-do after the next start's orphan grace)",
             (long long)b->cfg.stop_grace_ms, what);
    finish(b);
}

void broker_stop_gracefully(broker *b, broker_stopped_fn done, void *ctx)
{
    if (!b || b->stopped || b->stop_phase == BROKER_STOPPED) return;
    b->stop_done = done;
    b->stop_done_ctx = ctx;
    unsettled u;
    char what[900];
    tally(b, &u);
    describe(&u, what, sizeof what);
    if (b->stop_phase == BROKER_STOPPING) {
        if (u.drafters)
            LOG_WARN("stop: a second stop request: exiting at once with %s unsettled", what);
        else
            LOG_INFO("stop: a second stop request: exiting at once");
        return finish(b);
    }
    set_phase(b, BROKER_STOPPING);
    b->stop_since_ms = now_ms(b);
    if (!u.drafters) {
        LOG_INFO("stop: nothing in progress (no lease out, no batch in training, no checkpoint to "
                 "report): exiting");
        return finish(b);
    }
    if (b->cfg.stop_grace_ms <= 0) {
        LOG_WARN("stop: --stop-grace-ms 0: exiting at once with %s unsettled", what);
        return finish(b);
    }
    LOG_INFO("stopping: no new leases or work; waiting up to %lld ms (a second signal exits at "
             "once) for %s", (long long)b->cfg.stop_grace_ms, what);
    uv_timer_init(b->loop, &b->stop_timer);
    b->stop_timer.data = b;
    uv_timer_start(&b->stop_timer, on_stop_timer, STOP_POLL_MS, STOP_POLL_MS);
    b->stop_timer_started = true;
}

void broker_stop_close(broker *b)
{
    if (!b->stop_timer_started) return;
    b->stop_timer_started = false;
    uv_timer_stop(&b->stop_timer);
    uv_close((uv_handle_t *)&b->stop_timer, NULL);
}

/* Whether StepClaim m names the step its group has reserved already (its ranks' slots leased). */
static bool claims_reserved_step(broker *b, const wire_msg *m)
{
    const group *g = group_find(b->groups, m->u.gstep.group);
    return g && g->step_active && g->step == m->u.gstep.step;
}

bool broker_stop_refuses(broker *b, peer *p, const wire_msg *m, wire_msg *r)
{
    if (b->stop_phase != BROKER_STOPPING || !p) return false;
    const char *what = "no new leases";
    switch (m->type) {
    case WIRE_CLAIM:
    case WIRE_STEP_CLAIM:
        if (p->role != WIRE_ROLE_DRAFTER) return false;
        if (m->type == WIRE_STEP_CLAIM && claims_reserved_step(b, m)) return false;
        p->claimed_in_stop = true; /* not stopping itself: its report goes to the next broker */
        break;
    case WIRE_WORK_REQUEST:
        if (p->role != WIRE_ROLE_TARGET) return false;
        what = "no new work";
        break;
    default:
        return false;
    }
    reply_error(b, r, m->request_id, DFLASH_EAGAIN, "the broker is stopping: %s", what);
    return true;
}

void broker_stop_note(broker *b, peer *p, const wire_msg *m, const wire_msg *r)
{
    (void)b;
    if (!p || p->role != WIRE_ROLE_DRAFTER || r->type != WIRE_OK) return;
    uint64_t *mark = NULL, step = 0;
    switch (m->type) {
    case WIRE_ACK: mark = &p->acked_step, step = m->u.ack.step; break;
    case WIRE_STEP_DONE: mark = &p->acked_step, step = m->u.gstep.step; break;
    case WIRE_CHECKPOINT_COMMITTED: mark = &p->committed_step, step = m->u.step; break;
    default: return;
    }
    if (step > *mark) *mark = step;
}
