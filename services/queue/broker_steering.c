/* broker_steering: the operator's verbs on the broker: set (live options, all or nothing),
 * pause, resume and drain, and release (quarantined batches back to to-do). Set, pause, resume
 * and drain are applied, then journaled as the ledger's settings record (steering.h: the payload
 * and the restore rule); a release as the ledger's UNQUARANTINE records. Each is answered once
 * its records are durable (broker.c, "Journal and replies"); Error IO when they could not be
 * (the change is in force anyway). broker_restore_steering puts a journaled steering back in
 * force at start-up: a value whose configuration is unchanged since it was set comes back, a
 * changed configuration wins (all configured values win when the restored ones do not fit
 * together, live_check), the mode comes back as it was.
 * Thread: the broker's loop thread. Callers: broker.c (dispatch, broker_new, broker_shutdown),
 * tests through broker_set.
 */
#include "broker_state.h"

#include "err.h"
#include "log.h"
#include "steering.h"

#include <inttypes.h>
#include <string.h>

/* Applies cfg's live values to the policy and the log; the shares (which restart the mix
 * accounting) only when shares_changed: cfg.shares, or the target's when it is empty. */
static int apply_live(broker *b, const queue_config *c, bool shares_changed)
{
    log_level lvl;
    if (strcmp(c->log_level, b->cfg_applied_log) != 0 && log_level_parse(c->log_level, &lvl) == 0) {
        log_set_level(lvl);
        snprintf(b->cfg_applied_log, sizeof b->cfg_applied_log, "%s", c->log_level);
    }
    if (!b->policy) return 0;
    policy_set_min_ready(b->policy, (uint32_t)c->min_ready);
    policy_set_max_depth(b->policy, (uint32_t)c->max_depth);
    policy_set_lease_timeout(b->policy, (uint32_t)c->lease_timeout_ms);
    policy_set_max_redeliveries(b->policy, (uint32_t)c->max_redeliveries);
    double sh[WIRE_MAX_BUCKETS];
    if (!shares_changed) return 0;
    if (!c->shares[0]) policy_set_shares(b->policy, b->n_buckets, b->target_share);
    else if (broker_parse_shares(c->shares, b->n_buckets, sh) == 0)
        policy_set_shares(b->policy, b->n_buckets, sh);
    return 0;
}

/* Whether next's live values may run together on b (log level, shares, depth against the
 * largest group and the reservoir). 0 or a code with the reason in err (may be NULL). */
static int live_check(broker *b, const queue_config *next, char *err, size_t err_len)
{
    log_level lvl;
    if (log_level_parse(next->log_level, &lvl)) {
        if (err) snprintf(err, err_len, "log-level: '%s' unknown", next->log_level);
        return DFLASH_EINVAL;
    }
    if (next->shares[0]) {
        double sh[WIRE_MAX_BUCKETS];
        uint32_t n = b->policy ? b->n_buckets : 0;
        if (broker_parse_shares(next->shares, n, sh)) {
            if (err && n)
                snprintf(err, err_len, "shares: need %u finite non-negative numbers, not all 0",
                         n);
            else if (err)
                snprintf(err, err_len, "shares: need finite non-negative numbers, comma "
                         "separated, not all 0");
            return DFLASH_EINVAL;
        }
    }
    uint32_t largest = group_largest(b->groups);
    if (next->max_depth < (int64_t)largest) {
        if (err)
            snprintf(err, err_len, "max-depth %lld is smaller than one step of the largest "
                     "drafter group (%u ranks, one slot each): its steps could never be "
                     "reserved", (long long)next->max_depth, largest);
        return DFLASH_ERANGE;
    }
    return broker_depth_check(next, largest, err, err_len);
}

/* Journals the runtime steering (mode, live values that differ from the configured ones) as
 * the ledger's settings record (fsynced; the reply waits for it: "Journal and replies"); a
 * restarted broker restores it (restore_steering). Returns 0, or a code with why (may be NULL)
 * telling the operator the change is in force but a restart would not keep it.
 * steering_payload: that payload in buf; its length or DFLASH_ENOMEM. */
static int steering_payload(broker *b, uint8_t *buf, size_t cap)
{
    steering_state st;
    steering_capture(broker_config_table(), &b->configured, &b->cfg, b->pending_mode, &st);
    return steering_encode(&st, buf, cap);
}

int broker_journal_steering(broker *b, char *why, size_t why_len)
{
    static uint8_t buf[STEERING_PAYLOAD_MAX]; /* loop thread only */
    int n = steering_payload(b, buf, sizeof buf);
    int rc = n < 0 ? n : ledger_set_settings(b->ledger, buf, (uint32_t)n);
    if (!rc) return 0;
    const char *jf = ledger_journal_failure(b->ledger);
    char msg[400];
    snprintf(msg, sizeof msg, "in force, but the journal did not take it (%s): a broker restart "
             "would forget it until the journal heals (dflash-ctl status)",
             jf ? jf : err_str(rc));
    LOG_WARN("runtime settings %s", msg);
    if (why) snprintf(why, why_len, "%s", msg);
    return rc;
}

int broker_set(broker *b, const wire_settings *set, char *err, size_t err_len)
{
    queue_config next = b->cfg;
    for (uint32_t i = 0; i < set->n; i++) {
        const cfg_option *oi = config_find(broker_config_table(), set->kv[i].key);
        for (uint32_t j = 0; oi && j < i; j++)
            if (config_find(broker_config_table(), set->kv[j].key) == oi) {
                if (err)
                    snprintf(err, err_len, "%s given twice (%s and %s): give it once",
                             set->kv[i].key, set->kv[j].value, set->kv[i].value);
                return DFLASH_EINVAL;
            }
        int rc = config_set(broker_config_table(), &next, set->kv[i].key, set->kv[i].value, true,
                            err, err_len);
        if (rc == DFLASH_ENOTFOUND && err) snprintf(err, err_len, "%s: no such option", set->kv[i].key);
        if (rc == DFLASH_EDENIED && err)
            snprintf(err, err_len, "%s is a start-up setting, not a live one: restart "
                     "dflash-queue with the new value", set->kv[i].key);
        if (rc) return rc;
    }
    int rc = live_check(b, &next, err, err_len);
    if (rc) return rc;
    bool shares_changed = strcmp(next.shares, b->cfg.shares) != 0;
    b->cfg = next;
    apply_live(b, &b->cfg, shares_changed);
    broker_warn_reservoir(b);
    for (uint32_t i = 0; i < set->n; i++)
        LOG_INFO("set %s = %s", set->kv[i].key, set->kv[i].value);
    return broker_journal_steering(b, err, err_len);
}

void broker_on_set(broker *b, const wire_msg *m, wire_msg *r)
{
    char err[400] = "";
    int rc = broker_set(b, &m->u.settings, err, sizeof err);
    if (rc && rc != DFLASH_EIO) return reply_error(b, r, m->request_id, rc, "%s", err);
    reply_init(b, r, WIRE_SET_CONFIG_REPLY, m->request_id);
    r->u.settings.n = m->u.settings.n;
    for (uint32_t i = 0; i < m->u.settings.n; i++) {
        wire_kv *kv = &r->u.settings.kv[i];
        snprintf(kv->key, sizeof kv->key, "%s", m->u.settings.kv[i].key);
        config_get(broker_config_table(), &b->cfg, kv->key, kv->value, sizeof kv->value);
    }
    broker_publish(b, "config", r);
    if (rc) reply_error(b, r, m->request_id, rc, "%s", err); /* in force, not durable */
}

void broker_on_mode(broker *b, const wire_msg *m, wire_msg *r, policy_mode mode)
{
    b->pending_mode = mode;
    if (b->policy) {
        int rc = policy_set_mode(b->policy, mode);
        if (rc) return reply_error(b, r, m->request_id, rc, "mode change refused");
    }
    LOG_INFO("mode: %s", policy_mode_name(mode));
    char why[400];
    if (broker_journal_steering(b, why, sizeof why))
        reply_error(b, r, m->request_id, DFLASH_EIO, "%s", why);
    else
        reply_ok(b, r, m->request_id, 0);
    wire_msg a;
    reply_init(b, &a, WIRE_SET_CONFIG_REPLY, 0);
    a.u.settings.n = 1;
    snprintf(a.u.settings.kv[0].key, WIRE_MAX_KEY, "mode");
    snprintf(a.u.settings.kv[0].value, WIRE_MAX_VALUE, "%s", policy_mode_name(mode));
    broker_publish(b, "config", &a);
}

/* dflash-ctl release: the named quarantined batch, or every one, back to to-do with a fresh set
 * of max-redeliveries + 1 tries (a target fault, e.g. the wrong model, had quarantined good
 * batches). Ok {released}; Error STATE naming the batch's state when it is not quarantined,
 * RANGE when the ledger has no such batch, IO when released but not durable. */
void broker_on_release_quarantine(broker *b, const wire_msg *m, wire_msg *r)
{
    const wire_release_quarantine *q = &m->u.release_q;
    batch_id id = to_batch(&q->unit);
    uint64_t n = 1;
    int rc = q->all ? ledger_release_quarantined(b->ledger, &n)
                    : ledger_release_quarantine(b->ledger, &id);
    batch_state st;
    if (rc == DFLASH_ESTATE && ledger_get(b->ledger, &id, &st, NULL) == 0)
        return reply_error(b, r, m->request_id, rc, "batch %u/%u/%u is not quarantined (it is "
                           "%s): nothing released", id.epoch, id.bucket, id.index,
                           batch_state_name(st));
    if (rc == DFLASH_ERANGE || rc == DFLASH_ESTATE) {
        ledger_stats ls;
        ledger_get_stats(b->ledger, &ls);
        return reply_error(b, r, m->request_id, DFLASH_ERANGE, "batch %u/%u/%u is not in the "
                           "ledger (%u buckets, %u epochs opened): nothing released", id.epoch,
                           id.bucket, id.index, ls.n_buckets, ls.epochs_opened);
    }
    if (q->all)
        LOG_INFO("release (dflash-ctl): %" PRIu64 " quarantined batches back to to-do", n);
    else
        LOG_INFO("release (dflash-ctl): batch %u/%u/%u back to to-do from quarantine", id.epoch,
                 id.bucket, id.index);
    if (rc == DFLASH_EIO) {
        const char *jf = ledger_journal_failure(b->ledger);
        return reply_error(b, r, m->request_id, rc, "released %" PRIu64 ", but the journal did "
                           "not take it (%s): a broker restart would have them quarantined "
                           "again until the journal heals (dflash-ctl status)", n,
                           jf ? jf : err_str(rc));
    }
    reply_ok(b, r, m->request_id, n);
}

/* The steering a previous broker journaled (dflash-ctl set, pause, drain), back in force by the
 * rule of steering.h; journaled again when the configuration won somewhere, so that a later
 * restart compares with what is in force now. Runtime values that do not fit together with the
 * configuration now (e.g. a restored min-ready above a lowered max-depth) are all dropped. */
void broker_restore_steering(broker *b)
{
    uint32_t len;
    const void *p = ledger_settings(b->ledger, &len);
    steering_state js;
    if (!p) return;
    if (steering_decode(p, len, &js)) {
        LOG_WARN("the journal's runtime settings record is damaged: running with the "
                 "configuration, not paused or draining (give dflash-ctl set/pause/drain again "
                 "if they are still wanted)");
        return;
    }
    queue_config next = b->cfg;
    char why[400];
    if (steering_restore(broker_config_table(), &js, &next) &&
        live_check(b, &next, why, sizeof why)) {
        LOG_WARN("the runtime settings restored from the journal do not fit the configuration "
                 "now (%s): running with the configured values", why);
        next = b->cfg;
    }
    b->cfg = next;
    b->pending_mode = js.mode;
    apply_live(b, &b->cfg, false); /* the log level; the policy comes with the first pool */
    if (js.mode == POLICY_PAUSED)
        LOG_WARN("was paused before the restart: still paused; `dflash-ctl resume` to continue");
    else if (js.mode == POLICY_DRAINING)
        LOG_WARN("was draining before the restart: still draining (no work units; claims end "
                 "once nothing is left to hand out); `dflash-ctl resume` to run again");
    static uint8_t now[STEERING_PAYLOAD_MAX]; /* loop thread only */
    int n = steering_payload(b, now, sizeof now);
    if (n >= 0 && ((uint32_t)n != len || memcmp(now, p, len) != 0))
        broker_journal_steering(b, NULL, 0);
}
