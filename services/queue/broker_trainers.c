/* broker_trainers: one broker, one model (defect: a second solo trainer's resume rewound the
 * ledger under the first, and each restart of either gave the other's batches back: two
 * half-trained models, with only a warning).
 *
 * A trainer's ResumeFrom names its run (run_id, kept in its checkpoint root). A live solo trainer
 * of the same run with another incarnation is its predecessor: ended at once as liveness would
 * (broker_take_over_run). A live trainer of another model (a solo trainer of another run,
 * or a group member: broker_other_model_trainer) refuses the resume, nothing rewound: Error AGAIN
 * for the liveness window and half again since the first ask (that one may be dead and not yet
 * expired; longer while it has sent nothing since: until it expires), then Error EXISTS naming
 * it (broker_trainer_admitted); a GroupJoin beside a live solo trainer alike, ending in Error
 * DENIED; a GroupJoin creating a second group beside a live member of another alike (defect: its
 * creation rewound the first group's batches). A ResumeFrom without a run id (an older drafter)
 * is only warned about. A replaced predecessor is remembered as a name's is
 * (broker_peer_take_over), and its hello refused EXISTS (broker.c's refuse_replaced; defect: two
 * processes sharing a run id both trained on). A solo trainer's later hellos name its run
 * (Hello.run_id), and broker.c's on_hello takes one as its resume admitted again, without a
 * rewind, or holds and then refuses it (DENIED) when another model's trainer came in meanwhile
 * (defect: a trainer that registered again after an expiry or a broker restart was no trainer
 * any more, and a second run's resume rewound its batches).
 * A predecessor is replaced only from the CURVE key it registered with (broker_security.c, "Key
 * binding"): another key's resume or hello naming its run is refused DENIED.
 * Thread: the broker's loop thread. Callers: broker.c (hello, dispatch).
 */
#include "broker_state.h"

#include "err.h"
#include "log.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* An older drafter's resume (no run id): said, not refused, as before run ids existed (a
 * restarted trainer under a new name meets its predecessor here until the broker expires it). */
static void warn_other_trainers(broker *b, const peer *p, uint64_t step)
{
    for (uint32_t i = 0; i < b->n_peers; i++) {
        const peer *q = b->peers[i];
        if (q == p || !q->trains || q->state != PEER_LIVE) continue;
        LOG_WARN("drafter %s resumes from step %" PRIu64 " while drafter %s also trains on this "
                 "broker: the batches %s trained after that step go back to to-do. One broker "
                 "serves one model; to train it on several GPUs give every drafter --group G",
                 p->name, step, q->name, q->name);
    }
}

/* The live drafter that trains another model than p would on this broker, or NULL. When p
 * trains alone (group_name NULL, as run run_id): a solo trainer of another run or of none (an
 * older drafter), or a group member. When p joins group `group_name`: any solo trainer, or a
 * member of another group (creating a group rewinds the ledger under the live one). */
const peer *broker_other_model_trainer(broker *b, const peer *p, uint64_t run_id,
                                        const char *group_name)
{
    for (uint32_t i = 0; i < b->n_peers; i++) {
        const peer *q = b->peers[i];
        if (q == p || q->state != PEER_LIVE || q->role != WIRE_ROLE_DRAFTER) continue;
        if (q->trains && (group_name || !run_id || q->run_id != run_id)) return q;
        const group *qg = group_of_peer(b->groups, q->incarnation);
        if (qg && (!group_name || strcmp(qg->name, group_name) != 0)) return q;
    }
    return NULL;
}

/* A restarted solo trainer (same run id, new incarnation) replaces its predecessor at once:
 * ended as when liveness expires it (its leases end, its held batches go back to to-do), so
 * the restart resumes without waiting for the broker to notice the old process is gone. p
 * remembers the predecessor's incarnation (and those it had replaced): if that process is
 * alive after all (two processes with one run id), its next hello is refused
 * (broker.c's refuse_replaced) instead of both training. A predecessor registered with another
 * CURVE key than p is no predecessor of p's (broker_security.c, "Key binding"; defect: any
 * accepted key that learnt a run id, which refusals name, could end its trainer): nothing is
 * replaced, and that peer is returned for the caller to refuse p. */
static const peer *replace_predecessors(broker *b, peer *p, uint64_t run_id)
{
    for (uint32_t i = 0; i < b->n_peers; i++) {
        const peer *q = b->peers[i];
        if (q != p && q->trains && q->run_id == run_id && q->state == PEER_LIVE &&
            broker_key_differs(q, p->key))
            return q;
    }
    for (uint32_t i = 0; i < b->n_peers;) {
        peer *q = b->peers[i];
        if (q == p || !q->trains || q->run_id != run_id || q->state != PEER_LIVE) {
            i++;
            continue;
        }
        char why[160];
        snprintf(why, sizeof why, "replaced by %s, a restart of its run %016" PRIx64, p->name,
                 run_id);
        broker_peer_take_over(b, p, i, why);
    }
    return NULL;
}

bool broker_take_over_run(broker *b, peer *p, const wire_msg *m, uint64_t run_id, wire_msg *r)
{
    const peer *other_key = replace_predecessors(b, p, run_id);
    if (!other_key) return true;
    char why[WIRE_MAX_TEXT];
    snprintf(why, sizeof why, "run %016" PRIx64 " is trained by a live drafter registered with "
             "another CURVE key: nothing was replaced or rewound; a restart of the run must use "
             "the key it registered with, or wait until that one leaves or is expired", run_id);
    broker_key_refuse(b, m, other_key, why, r);
    /* the refused drafter's own run goes on in that process, which may write the same
     * --checkpoint-dir: told as a replacement's run is, so it writes no final checkpoint there
     * (worker_session_save_refused) */
    r->u.error.replaced_by_run = run_id;
    return false;
}

/* Whether p may train on this broker now (one broker serves one model). False when q, a live
 * drafter that trains another model (broker_other_model_trainer), is there: r then holds Error AGAIN
 * while q may still be a dying process the broker has not expired (for the liveness window and
 * half again since p first asked, and after that while q has sent nothing since: until the cron
 * expires it), Error `final` after that, both naming q and what to do. */
bool broker_trainer_admitted(broker *b, peer *p, const peer *q, uint64_t rid, int final,
                             wire_msg *r)
{
    if (!q) {
        p->trainer_wait_since_ms = 0;
        return true;
    }
    uint64_t now = now_ms(b);
    uint64_t dead_after = (uint64_t)(b->cfg.heartbeat_ms * b->cfg.liveness);
    uint64_t window = dead_after + dead_after / 2;
    group *g = group_of_peer(b->groups, q->incarnation);
    char who[WIRE_MAX_NAME + 64];
    if (g)
        snprintf(who, sizeof who, "drafter %s of group %s", q->name, g->name);
    else if (q->run_id)
        snprintf(who, sizeof who, "drafter %s (run %016" PRIx64 ")", q->name, q->run_id);
    else
        snprintf(who, sizeof who, "drafter %s (no run id: a drafter from before run ids)",
                 q->name);
    const char *todo = "stop it, or give every drafter the same --group G to train one model on "
                       "several GPUs";
    if (!p->trainer_wait_since_ms) {
        p->trainer_wait_since_ms = now;
        LOG_WARN("drafter %s would train while %s trains on this broker (one broker serves one "
                 "model): waiting up to %" PRIu64 " ms in case that one is gone and not yet "
                 "expired", p->name, who, window);
    }
    uint64_t waited = now - p->trainer_wait_since_ms;
    if (waited < window) {
        reply_error(b, r, rid, DFLASH_EAGAIN, "%s trains on this broker (one broker serves one "
                    "model): waiting %" PRIu64 " ms more in case it is gone and not yet expired",
                    who, window - waited);
        return false;
    }
    /* Silent since p first asked: it may be gone and the cron may not have judged it yet (it
     * holds expiries for half a window after a stall of the broker, stall_hold, or has not run
     * since): held on until it expires or is heard from (defect: after a stall of more than half
     * a window the dead one expired past p's window, and p was refused naming a drafter that was
     * gone; the drafter exited 6). */
    if (q->last_seen_ms <= p->trainer_wait_since_ms) {
        reply_error(b, r, rid, DFLASH_EAGAIN, "%s trains on this broker (one broker serves one "
                    "model) and has been silent for %" PRIu64 " ms: waiting until it expires or "
                    "is heard from", who, now - q->last_seen_ms);
        return false;
    }
    LOG_WARN("drafter %s refused: %s trains on this broker and has not expired (one broker "
             "serves one model): %s", p->name, who, todo);
    reply_error(b, r, rid, final, "%s trains another model on this broker, which serves one "
                "model (nothing was rewound): %s", who, todo);
    return false;
}

/* A resume from a trained checkpoint (step > 0) on a ledger that has recorded no training at
 * all: the journal is new or was lost (--journal none after a crash, a runtime dir wiped at a
 * reboot). Taken, as a deliberate new journal is, but said loudly (defect: silent): the plan is
 * handed out from its start again, to a model that has seen part of it. */
static void warn_empty_ledger(broker *b, const peer *p, uint64_t step)
{
    ledger_stats ls;
    ledger_get_stats(b->ledger, &ls);
    if (!step || ls.trained || ls.committed || ls.epochs_committed || ls.last_commit_step) return;
    LOG_WARN("drafter %s resumes from step %" PRIu64 " but this broker's ledger has no record of "
             "any training (a new or lost journal%s): the plan is handed out from its start "
             "again, batches its model has seen among them; to continue the run where it was, "
             "start the broker on that run's journal", p->name, step,
             strcmp(b->cfg.journal, "none") == 0 ? ", --journal none" : "");
}

/* A trainer's resume. With a run id: its run's predecessor is replaced, another model's live
 * trainer refuses it (broker_trainer_admitted; nothing rewound). Without (an older drafter): warned. */
void broker_on_resume_from(broker *b, peer *p, const wire_msg *m, wire_msg *r)
{
    uint64_t run_id = m->u.run_id;
    if (run_id) {
        if (!broker_take_over_run(b, p, m, run_id, r)) return;
        const peer *q = broker_other_model_trainer(b, p, run_id, NULL);
        if (!broker_trainer_admitted(b, p, q, m->request_id, DFLASH_EEXISTS, r)) return;
    } else {
        warn_other_trainers(b, p, m->u.step);
    }
    p->trains = true;
    p->run_id = run_id;
    warn_empty_ledger(b, p, m->u.step);
    int64_t n = broker_rewind_to(b, m->u.step, r, m->request_id);
    if (n < 0) return;
    LOG_INFO("drafter resumes from step %" PRIu64 ": %" PRId64 " batches back to to-do",
             m->u.step, n);
    reply_ok(b, r, m->request_id, (uint64_t)n);
}
