/* broker_config: dflash-queue's options (one table: name, type, default, range, live or not, help;
 * config.h drives the flags, DFLASH_* variables, the config file and --help from it) and the
 * checks of a configuration: at start-up (broker_config_check: security, the reservoir against
 * the depth cap, the shares' syntax) and for a live set (broker_steering.c's live_check uses the
 * depth check and the shares' parser here).
 * Thread: any (no state). Callers: main.c, broker.c, broker_steering.c, tests.
 */
#include "broker_state.h"

#include "err.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define OPT_S(name, def, live, help, member)                                                       \
    {name, CFG_STRING, def, 1, 0, live, help, offsetof(queue_config, member),                     \
     sizeof(((queue_config *)0)->member)}
#define OPT_I(name, def, lo, hi, live, help, member)                                               \
    {name, CFG_INT, def, lo, hi, live, help, offsetof(queue_config, member), 0}

static const cfg_option queue_options[] = {
    OPT_S("runtime-dir", "", false,
          "0700 directory for ipc sockets (default $XDG_RUNTIME_DIR/dflash or /tmp/dflash-UID)",
          runtime_dir),
    OPT_S("endpoint", "", false, "ROUTER endpoint (default ipc://RUNTIME_DIR/queue.sock)",
          endpoint),
    OPT_S("pub-endpoint", "", false,
          "PUB endpoint for announcements (default ipc://RUNTIME_DIR/queue-pub.sock)",
          pub_endpoint),
    OPT_S("journal", "", false,
          "ledger journal path (default RUNTIME_DIR/queue.journal; 'none' keeps it in memory)",
          journal),
    OPT_S("bind", "", false,
          "extra ROUTER endpoint, e.g. tcp://10.0.0.1:5555 (needs the CURVE options below)",
          bind),
    OPT_S("curve-secret-key", "", false,
          "the broker's CURVE secret key file (dflash-ctl keygen); turns CURVE on for tcp://",
          curve_secret_key),
    OPT_S("curve-clients", "", false,
          "directory of client public keys (*.pub) allowed to connect over tcp://",
          curve_clients),
    OPT_S("admin-keys", "", false,
          "directory of public keys (*.pub) allowed to set/pause/resume/drain/release over tcp://",
          admin_keys),
    {"insecure-tcp", CFG_BOOL, "false", 1, 0, false,
     "FOR TESTS ONLY: allow tcp:// endpoints without CURVE, on loopback addresses only "
     "(127.x.x.x, localhost, [::1]: anyone who reaches the port may steer)",
     offsetof(queue_config, insecure_tcp), 0},
    OPT_I("min-ready", "30", 0, 1 << 20, true,
          "mixing reservoir: claims are served while at least this many slots are ready "
          "(at most max-depth)",
          min_ready),
    OPT_I("max-depth", "90", 1, 1 << 20, true, "cap on filling+ready+leased slots", max_depth),
    OPT_I("lease-timeout-ms", "5000", 1, 3600000, true,
          "a lease not released or heartbeated within this time is redelivered", lease_timeout_ms),
    OPT_I("max-redeliveries", "3", 0, 1000, true,
          "a batch whose deliveries end untrained more often (lease expired, drafter gone "
          "holding it) is quarantined",
          max_redeliveries),
    OPT_S("shares", "", true,
          "bucket token shares, comma separated, finite and >= 0 (not all 0), one per bucket "
          "(default, or when the count does not fit: as the target reports)",
          shares),
    OPT_I("mix-window", "1000", 1, 65536, false, "claims in the TV-distance window", mix_window),
    OPT_I("heartbeat-ms", "1000", 10, 60000, false, "heartbeat interval peers are told",
          heartbeat_ms),
    OPT_I("liveness", "3", 1, 100, false, "heartbeats a peer may miss before it is expired",
          liveness),
    OPT_I("stats-interval-ms", "1000", 0, 3600000, true, "stats on PUB every N ms (0 = off)",
          stats_interval_ms),
    OPT_I("orphan-grace-ms", "0", 0, 3600000, false,
          "after a restart, in-flight batches wait this long for their peers (0 = 2 leases)",
          orphan_grace_ms),
    OPT_I("max-epochs", "0", 0, 1000000, false, "stop after N epochs (0 = as the target says)",
          max_epochs),
    OPT_I("group-hold-ms", "120000", 0, 3600000, false,
          "a drafter that would create a group at a step below the newest committed checkpoint "
          "waits this long for a member resuming from it, which becomes rank 0; a step whose "
          "group's every rank left waits this long for the group to come back, counted again "
          "after a broker restart (0 = no wait)",
          group_hold_ms),
    {"fsync", CFG_BOOL, "true", 1, 0, false, "fsync the journal on commits and rewinds",
     offsetof(queue_config, fsync), 0},
    OPT_I("compact-bytes", "67108864", 0, 1ll << 40, false,
          "rewrite the journal as a snapshot past this size (0 = never)", compact_bytes),
    OPT_I("journal-retry-ms", "15000", 10, 3600000, false,
          "while the journal is failing (a full disk), rewrite it whole from memory this often "
          "until it takes it", journal_retry_ms),
    OPT_I("stop-grace-ms", "8000", 0, 3600000, false,
          "on SIGTERM/SIGINT, claims are refused and the broker exits once no lease is out, "
          "every batch in training is acked and the drafters that stop have reported their "
          "final checkpoints, or after this long (0 = at once; a second signal exits at once); "
          "keep it below the supervisor's stop timeout (docker: 10 s)",
          stop_grace_ms),
    OPT_I("max-peers", "1024", 2, 65536, false,
          "targets and drafters registered at once (a hello past it is answered 'try again' "
          "and warned about); also caps the replies waiting for the journal at 8 per peer",
          max_peers),
    OPT_S("log-level", "info", true, "debug, info, warn or error", log_level),
};

/* config_load's check: what broker_config_check refuses, --dump-config does not print. With
 * the table's sources (dflash-queue's main), the depth refusal names where both values came
 * from ("DFLASH_MAX_DEPTH=4 (environment)", "--min-ready 30 (default)"). */
static int check_table(const cfg_table *t, const void *cfg, char *why, size_t why_len)
{
    if (t->sources && broker_depth_check(cfg, 1, NULL, 0)) {
        char mr[300], md[300];
        return config_refuse(why, why_len, "%s needs that many ready slots, but %s caps the "
                             "slots ever filled: every claim would wait forever (lower min-ready "
                             "or raise max-depth)",
                             config_source(t, cfg, "min-ready", mr, sizeof mr),
                             config_source(t, cfg, "max-depth", md, sizeof md));
    }
    return broker_config_check(cfg, why, why_len);
}

static const cfg_table queue_table = {
    "dflash-queue",
    "the DFlash broker: length buckets, ready reservoir, slot leases and the training ledger",
    "[options]",
    queue_options,
    sizeof queue_options / sizeof *queue_options,
    NULL,
    check_table,
    NULL,
};

const cfg_table *broker_config_table(void) { return &queue_table; }

/* The reservoir must fit under the depth cap: a claim waits for min_ready ready slots, a group
 * step of world ranks for min_ready + world - 1, and at most max_depth slots are ever filled.
 * Returns 0 or DFLASH_ERANGE with why (optional) set. */
int broker_depth_check(const queue_config *c, uint32_t world, char *why, size_t why_len)
{
    int64_t need = c->min_ready + (world > 1 ? world - 1 : 0);
    if (need <= c->max_depth) return 0;
    if (why)
        snprintf(why, why_len, "min-ready %lld needs %lld ready slots for a step of %u rank(s) "
                 "but max-depth is %lld: every claim would wait forever (lower min-ready or "
                 "raise max-depth)", (long long)c->min_ready, (long long)need,
                 world > 1 ? world : 1, (long long)c->max_depth);
    return DFLASH_ERANGE;
}

/* n finite non-negative numbers, not all 0, into out, one per comma-separated entry (blanks
 * around them allowed, an empty entry is not: "1,,2" is no pair); n 0: any count up to
 * WIRE_MAX_BUCKETS (the bucket count is not known yet; out has room for that many). 0 or
 * DFLASH_EINVAL. */
int broker_parse_shares(const char *s, uint32_t n, double *out)
{
    uint32_t k = 0, max = n ? n : WIRE_MAX_BUCKETS;
    double sum = 0;
    const char *p = s;
    while (*p) {
        char *end;
        double v = strtod(p, &end); /* skips the blanks before the number */
        if (end == p || k >= max || !(v >= 0) || !isfinite(v)) return DFLASH_EINVAL;
        out[k++] = v;
        sum += v;
        p = end + strspn(end, " ");
        if (*p == ',') {
            p++;
            if (!p[strspn(p, " ")]) return DFLASH_EINVAL; /* "1,2,": an empty last entry */
        } else if (*p) {
            return DFLASH_EINVAL; /* "1 2" or "1x" */
        }
    }
    /* all 0 with the bucket count unknown too (defect: `set shares=0,0` before the target
     * registered was taken and journaled, and dropped at its registration as not fitting) */
    return (n ? k == n : k > 0) && sum > 0 ? 0 : DFLASH_EINVAL;
}

/* Whether endpoint ep is not tcp://, or is tcp:// on a loopback address (127.x.x.x, localhost,
 * [::1]): where --insecure-tcp may serve. */
static bool tcp_on_loopback(const char *ep)
{
    if (!curve_endpoint_is_tcp(ep)) return true;
    const char *host = ep + strlen("tcp://");
    const char *colon = strrchr(host, ':');
    size_t n = colon ? (size_t)(colon - host) : strlen(host);
    if (n >= 2 && host[0] == '[' && host[n - 1] == ']') host++, n -= 2;
    return (n == 9 && !strncmp(host, "localhost", 9)) || (n == 3 && !strncmp(host, "::1", 3)) ||
           (n > 4 && !strncmp(host, "127.", 4));
}

int broker_config_check(const queue_config *c, char *why, size_t why_len)
{
    bool curve = c->curve_secret_key[0] || c->curve_clients[0];
    const char *tcp = curve_endpoint_is_tcp(c->endpoint)       ? c->endpoint
                      : curve_endpoint_is_tcp(c->bind)         ? c->bind
                      : curve_endpoint_is_tcp(c->pub_endpoint) ? c->pub_endpoint
                                                               : NULL;
    if (curve && !(c->curve_secret_key[0] && c->curve_clients[0])) {
        snprintf(why, why_len, "CURVE needs both --curve-secret-key FILE and --curve-clients DIR");
        return DFLASH_ECONFIG;
    }
    if (curve && !curve_available()) {
        snprintf(why, why_len, "CURVE options given but this libzmq has no CURVE (libsodium)");
        return DFLASH_ECONFIG;
    }
    if (tcp && !curve && !c->insecure_tcp) {
        snprintf(why, why_len,
                 "%s is a tcp:// endpoint: TCP needs CURVE (docs/protocol.md, \"Security\"). Give "
                 "--curve-secret-key FILE and --curve-clients DIR (keys: dflash-ctl keygen DIR "
                 "NAME), or --insecure-tcp for tests on loopback only",
                 tcp);
        return DFLASH_ECONFIG;
    }
    const char *eps[] = {c->endpoint, c->bind, c->pub_endpoint};
    for (int i = 0; i < 3 && tcp && !curve; i++)
        if (!tcp_on_loopback(eps[i])) {
            snprintf(why, why_len,
                     "--insecure-tcp serves loopback only (anyone who reaches the port may "
                     "steer): %s is not on 127.0.0.1, localhost or [::1]; give other hosts CURVE "
                     "(--curve-secret-key FILE and --curve-clients DIR)",
                     eps[i]);
            return DFLASH_ECONFIG;
        }
    if (c->admin_keys[0] && !curve) {
        snprintf(why, why_len, "--admin-keys needs CURVE (--curve-secret-key, --curve-clients)");
        return DFLASH_ECONFIG;
    }
    if (broker_depth_check(c, 1, why, why_len)) return DFLASH_ECONFIG;
    double sh[WIRE_MAX_BUCKETS];
    if (c->shares[0] && broker_parse_shares(c->shares, 0, sh)) {
        snprintf(why, why_len, "--shares '%s': need finite non-negative numbers, comma "
                 "separated, not all 0", c->shares);
        return DFLASH_ECONFIG;
    }
    return 0;
}
