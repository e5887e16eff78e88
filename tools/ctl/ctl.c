/* dflash-ctl: inspects and steers dflash-queue over its ROUTER socket (client.h).
 *
 *   dflash-ctl [--endpoint E] [--timeout-ms N] [--json] status|watch|set K=V...|pause|resume|
 *              drain|release E/B/I|all|ping|peer NAME
 *   dflash-ctl [--json] keygen DIR NAME   (writes DIR/NAME.key, mode 0600, and DIR/NAME.pub;
 *                                          curve.h; asks no broker)
 *
 * release: quarantined batches back to to-do, the one named (EPOCH/BUCKET/INDEX as the broker's
 * log prints it, or the drafter's "(E, B, I)"), or every one; prints how many.
 * status lists the live targets and drafters (name, role, heard how long ago, leases and batches
 * in training, pool slots); peer NAME (or PREFIX*; @target and @drafter: this host's daemons
 * by their default names, host_name.h) prints those so named and exits 1 when there is none:
 * the healthcheck of a target or drafter container (deploy/docker-compose.yml).
 * Over tcp:// the broker wants CURVE: --curve-server-key (its .pub file) and --curve-key (our
 * .key file). set/pause/resume/drain/release then need a key in the broker's --admin-keys dir.
 *
 * Before connecting to an ipc:// endpoint (and `watch` to an ipc:// PUB) it refuses one whose
 * directory is not ours alone (client_check_endpoint_existing: exit 1, naming the dir and the
 * fix), and makes none: a directory that does not exist has no broker in it (the broker makes it
 * when it starts), said at once, with exit 2 like any broker not there, so that a mistyped
 * --runtime-dir leaves nothing behind and costs no timeout.
 * Every verb but keygen says hello first (which also tells the broker's PUB endpoint and stats
 * interval for `watch`). Exit status: 0 ok, 1 error (the broker refused, bad arguments), 2 timeout
 * (no broker answering, or `watch` cannot hear its announcements): `dflash-ctl ping` is a
 * healthcheck. A broker that is not there costs one timeout and one line on stderr; `watch` asks
 * the broker after every --timeout-ms without an announcement and exits 2 when it does not answer
 * (a restarted broker is watched on). A broker in its graceful stop (after a SIGTERM: no new
 * leases or work, up to --stop-grace-ms for its drafters' acks and reports) is shown as
 * stopping by status (its first line and --json "state"; the mode then in "mode"), watch and
 * ping; ping still exits 0: the broker answers and exits by
 * itself, and a healthcheck that failed it could only get it killed mid-grace, losing the acks
 * the grace waits for. `watch` also exits 2, naming the PUB endpoint and the flag
 * that fixes it, when the broker announces where this ctl cannot subscribe: an ipc:// PUB (a socket
 * file on the broker's host) reached over tcp://, or nothing heard within three stats intervals
 * (plus a second) while the broker answers. Output: a readable table, or one JSON
 * object per line with --json (every verb, keygen included; failures too, besides stderr).
 * What the broker relays of its peers (names, messages) is printed through log_printable: a
 * control character or a byte that is not UTF-8 shows as '?' (a peer may name itself anything).
 * Single-threaded; the only global is the stop flag for `watch`.
 */
#include "client.h"
#include "config.h"
#include "curve.h"
#include "err.h"
#include "host_name.h"
#include "log.h"
#include "signals.h"

#include <cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct ctl_config {
    char endpoint[256];
    char runtime_dir[256];
    char curve_server_key[256];
    char curve_key[256];
    int64_t timeout_ms;
    bool json;
    int64_t count;
} ctl_config;

static const cfg_option ctl_options[] = {
    {"endpoint", CFG_STRING, "", 1, 0, false,
     "broker ROUTER endpoint (default ipc://RUNTIME_DIR/queue.sock)", offsetof(ctl_config, endpoint),
     sizeof(((ctl_config *)0)->endpoint)},
    {"runtime-dir", CFG_STRING, "", 1, 0, false,
     "the broker's runtime dir, ours alone (mode 0700) or refused; never made here: a missing "
     "one has no broker in it (exit 2 at once) (default $XDG_RUNTIME_DIR/dflash or "
     "/tmp/dflash-UID)",
     offsetof(ctl_config, runtime_dir), sizeof(((ctl_config *)0)->runtime_dir)},
    {"curve-server-key", CFG_STRING, "", 1, 0, false,
     "CURVE: the broker's public key file (NAME.pub), for a tcp:// endpoint",
     offsetof(ctl_config, curve_server_key), sizeof(((ctl_config *)0)->curve_server_key)},
    {"curve-key", CFG_STRING, "", 1, 0, false,
     "CURVE: our secret key file (NAME.key, mode 0600; dflash-ctl keygen DIR NAME)",
     offsetof(ctl_config, curve_key), sizeof(((ctl_config *)0)->curve_key)},
    {"timeout-ms", CFG_INT, "2000", 1, 600000, false, "reply timeout",
     offsetof(ctl_config, timeout_ms), 0},
    {"json", CFG_BOOL, "false", 1, 0, false, "print JSON instead of tables",
     offsetof(ctl_config, json), 0},
    {"count", CFG_INT, "0", 0, 1e9, false,
     "watch: stop after N announcements (0 = never); a broker that stops answering ends watch "
     "with exit 2",
     offsetof(ctl_config, count), 0},
};

static const cfg_table ctl_table = {
    "dflash-ctl",
    "inspect and steer dflash-queue. Verbs: status, watch, set KEY=VALUE..., pause, resume, "
    "drain, release EPOCH/BUCKET/INDEX|all (quarantined batches back to to-do: the one named, as "
    "the logs print it, or all), ping, peer NAME|PREFIX*|@target|@drafter (the live target or "
    "drafter so named, @target and @drafter: this host's by their default names: exit 0, none: "
    "exit 1), keygen DIR NAME (CURVE keypair). Exit 0 ok, 1 error, 2 timeout",
    "[options] VERB [KEY=VALUE... | EPOCH/BUCKET/INDEX | NAME]",
    ctl_options,
    sizeof ctl_options / sizeof *ctl_options,
    NULL,
    NULL,
    NULL,
};

static volatile sig_atomic_t stop_flag;

static void on_sigint(int sig)
{
    (void)sig;
    stop_flag = 1;
}

/* EPEER: the broker answers but its announcements cannot reach `watch` (exit 2 like a broker
 * that is not there: for a script nothing will be heard either way). */
static int exit_code(int rc)
{
    return rc == 0 ? 0 : rc == DFLASH_ETIMEOUT || rc == DFLASH_EPEER ? 2 : 1;
}

/* Reports a failure (JSON on stdout with --json, a line on stderr); returns the exit status. */
static int fail_msg(const ctl_config *c, const char *verb, int rc, const char *text)
{
    char msg[WIRE_MAX_TEXT + 1024]; /* the broker's words may name a peer */
    snprintf(msg, sizeof msg, "%s", text ? text : "");
    log_printable(msg);
    if (c->json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddBoolToObject(o, "ok", 0);
        cJSON_AddStringToObject(o, "verb", verb);
        cJSON_AddStringToObject(o, "error", err_name(rc));
        cJSON_AddStringToObject(o, "message", *msg ? msg : err_str(rc));
        char *s = cJSON_PrintUnformatted(o);
        printf("%s\n", s);
        free(s);
        cJSON_Delete(o);
    }
    fprintf(stderr, "dflash-ctl %s: %s%s%s\n", verb, err_str(rc), *msg ? ": " : "", msg);
    return exit_code(rc);
}

static int fail(const ctl_config *c, client *cl, const char *verb, int rc)
{
    return fail_msg(c, verb, rc, cl ? client_last_error(cl) : "");
}

static const char *state_name(uint32_t s)
{
    return s == 0 ? "running" : s == 1 ? "paused" : s == 2 ? "draining" : "unknown";
}

/* What the broker is doing: "stopping" in its graceful stop (whatever its mode: no new leases
 * or work either way), else its mode. status's first line and --json "state", watch's column
 * (defect: status said "running" beside the stop, and a script reading "state" saw a serving
 * broker). */
static const char *shown_state(const wire_status *s)
{
    return s->stopping ? "stopping" : state_name(s->state);
}

static const char *group_state_name(uint32_t s)
{
    return s == WIRE_GROUP_FORMING     ? "forming"
           : s == WIRE_GROUP_ACTIVE    ? "active"
           : s == WIRE_GROUP_REFORMING ? "re-forming"
                                       : "unknown";
}

/* A stopping broker (its graceful stop): "stopping (grace 8000 ms, 2.1 s left; waiting for:
 * drafter d (1 lease))", or "...; settled: exiting)" once nothing is left to wait for. */
static void stop_text(const wire_stop_stat *st, char *out, size_t len)
{
    uint64_t left = st->grace_ms > st->elapsed_ms ? st->grace_ms - st->elapsed_ms : 0;
    if (st->drafters)
        snprintf(out, len, "stopping (grace %" PRIu64 " ms, %.1f s left; waiting for: %s)",
                 st->grace_ms, (double)left / 1000.0, st->waiting_for);
    else
        snprintf(out, len, "stopping (grace %" PRIu64 " ms, %.1f s left; settled: exiting)",
                 st->grace_ms, (double)left / 1000.0);
}

/* "stopping": the stop as an object while the broker stops, else null (also from a broker older
 * than the field). */
static void stop_json(cJSON *o, const wire_status *s)
{
    if (!s->stopping) {
        cJSON_AddNullToObject(o, "stopping");
        return;
    }
    const wire_stop_stat *st = &s->stop;
    cJSON *x = cJSON_AddObjectToObject(o, "stopping");
#define N(f) cJSON_AddNumberToObject(x, #f, (double)st->f)
    N(grace_ms), N(elapsed_ms), N(drafters), N(leases), N(held), N(reports);
#undef N
    cJSON_AddNumberToObject(x, "left_ms",
                            st->grace_ms > st->elapsed_ms ? (double)(st->grace_ms - st->elapsed_ms)
                                                          : 0.0);
    cJSON_AddStringToObject(x, "waiting_for", st->waiting_for);
}

static const char *role_name(uint32_t r)
{
    return r == WIRE_ROLE_TARGET ? "target" : r == WIRE_ROLE_DRAFTER ? "drafter" : "unknown";
}

/* p's name, printable (log_printable), into name. */
static const char *peer_name(const wire_peer_stat *p, char name[WIRE_MAX_NAME])
{
    snprintf(name, WIRE_MAX_NAME, "%s", p->name);
    log_printable(name);
    return name;
}

/* The text a status holds of its peers (group and member names, the journal's failure, the
 * stop's words: the listed peers' names go through peer_name) made printable, in place. */
static void status_printable(wire_status *s)
{
    log_printable(s->journal_error);
    log_printable(s->stop.waiting_for);
    for (uint32_t i = 0; i < s->n_groups && i < WIRE_MAX_GROUPS; i++) {
        log_printable(s->groups[i].name);
        for (uint32_t k = 0; k < s->groups[i].n_members && k < WIRE_MAX_STATUS_MEMBERS; k++)
            log_printable(s->groups[i].members[k]);
    }
    for (uint32_t i = 0; i < s->n_orphans && i < WIRE_MAX_STATUS_ORPHANS; i++)
        log_printable(s->orphans[i].group);
}

/* The broker's status, made printable (status_printable); client_status's code. */
static int printable_status(client *cl, wire_status *s)
{
    int rc = client_status(cl, s);
    if (rc == 0) status_printable(s);
    return rc;
}

/* Settings as the broker echoes them (keys as their setter spelled them) made printable. */
static void settings_printable(wire_settings *set)
{
    for (uint32_t i = 0; i < set->n && i < WIRE_MAX_SETTINGS; i++) {
        log_printable(set->kv[i].key);
        log_printable(set->kv[i].value);
    }
}

/* A listed peer as JSON: its name, role and what status says of it. */
static cJSON *peer_json(const wire_peer_stat *p)
{
    cJSON *x = cJSON_CreateObject();
    char name[WIRE_MAX_NAME];
    cJSON_AddStringToObject(x, "name", peer_name(p, name));
    cJSON_AddStringToObject(x, "role", role_name(p->role));
#define N(f) cJSON_AddNumberToObject(x, #f, (double)p->f)
    N(heard_ms_ago), N(leases), N(held), N(slots);
#undef N
    cJSON_AddBoolToObject(x, "trains", p->trains);
    return x;
}

static cJSON *status_json(const wire_status *s)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "state", shown_state(s));
    cJSON_AddStringToObject(o, "mode", state_name(s->state));
    stop_json(o, s);
#define N(f) cJSON_AddNumberToObject(o, #f, (double)s->f)
    N(uptime_ms), N(min_ready), N(max_depth), N(lease_timeout_ms), N(tv_distance);
    N(claims_per_s), N(grants), N(releases), N(lease_expiries), N(redeliveries), N(quarantined);
    N(malformed), N(acks), N(batches_todo), N(batches_inflight), N(batches_trained);
    N(batches_committed), N(batches_total), N(committed_step), N(peers), N(epoch), N(slot_count);
    N(hellos_refused_full), N(replies_dropped), N(key_refusals), N(connections_refused);
    N(steering_refused); /* these five: 0 from an older broker */
#undef N
    cJSON *arr = cJSON_AddArrayToObject(o, "buckets");
    for (uint32_t i = 0; i < s->n_buckets; i++) {
        const wire_bucket_stat *b = &s->buckets[i];
        cJSON *x = cJSON_CreateObject();
#define N(f) cJSON_AddNumberToObject(x, #f, (double)b->f)
        N(upper), N(share), N(ready), N(leased), N(filling), N(deficit), N(produced), N(consumed);
        N(produced_tokens), N(consumed_tokens);
#undef N
        cJSON_AddItemToArray(arr, x);
    }
    cJSON_AddStringToObject(o, "journal_error", s->journal_error); /* "": healthy */
    cJSON *groups = cJSON_AddArrayToObject(o, "groups");
    for (uint32_t i = 0; i < s->n_groups; i++) {
        const wire_group_stat *g = &s->groups[i];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "name", g->name);
        cJSON_AddStringToObject(x, "state", group_state_name(g->state));
#define N(f) cJSON_AddNumberToObject(x, #f, (double)g->f)
        N(epoch), N(world), N(step), N(pending), N(steps_done), N(steps_aborted), N(micros);
        N(accumulate);
#undef N
        cJSON_AddBoolToObject(x, "step_reserved", g->step_reserved);
        cJSON *mem = cJSON_AddArrayToObject(x, "members");
        for (uint32_t k = 0; k < g->n_members; k++)
            cJSON_AddItemToArray(mem, cJSON_CreateString(g->members[k]));
        cJSON_AddItemToArray(groups, x);
    }
    cJSON *peers = cJSON_AddArrayToObject(o, "peer_list");
    for (uint32_t i = 0; i < s->n_peer_list; i++)
        cJSON_AddItemToArray(peers, peer_json(&s->peer_list[i]));
    cJSON_AddNumberToObject(o, "peers_unlisted", (double)s->peers_unlisted);
    cJSON *orphans = cJSON_AddArrayToObject(o, "orphans");
    for (uint32_t i = 0; i < s->n_orphans; i++) {
        const wire_orphan_stat *g = &s->orphans[i];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "group", g->group);
#define N(f) cJSON_AddNumberToObject(x, #f, (double)g->f)
        N(step), N(batches), N(held_ms), N(abort_in_ms);
#undef N
        cJSON_AddItemToArray(orphans, x);
    }
    return o;
}

static void print_json(cJSON *o)
{
    char *s = cJSON_PrintUnformatted(o);
    printf("%s\n", s);
    fflush(stdout);
    free(s);
    cJSON_Delete(o);
}

static void print_refusals(const wire_status *s);
static void print_buckets(const wire_status *s);
static void print_groups(const wire_status *s);
static void print_orphans(const wire_status *s);
static void print_peers(const wire_status *s);

static void print_status(const wire_status *s, uint64_t incarnation)
{
    printf("broker    %016" PRIx64 "  %s  up %.1f s  %u peers  %u slots\n", incarnation,
           shown_state(s), (double)s->uptime_ms / 1000.0, s->peers, s->slot_count);
    if (s->stopping) {
        char stop[WIRE_MAX_TEXT + 96];
        stop_text(&s->stop, stop, sizeof stop);
        printf("state     %s: no new leases or work\n", stop);
    }
    printf("settings  min_ready %u  max_depth %u  lease %u ms\n", s->min_ready, s->max_depth,
           s->lease_timeout_ms);
    /* epoch: the oldest with batches to do; the counts are sums over every epoch opened, and
     * epochs overlap (the next opens before this one's last commit; a rewind gives earlier
     * epochs to-do again): todo may exceed one epoch's batches, committed is the whole run's */
    printf("ledger    epoch %u (%" PRIu64 " batches an epoch)  over all epochs: todo %" PRIu64
           "  in flight %" PRIu64 "  trained %" PRIu64 "  committed %" PRIu64 " (step %" PRIu64
           ")  quarantined %" PRIu64 "\n",
           s->epoch, s->batches_total, s->batches_todo, s->batches_inflight, s->batches_trained,
           s->batches_committed, s->committed_step, s->quarantined);
    printf("leases    grants %" PRIu64 "  releases %" PRIu64 "  expiries %" PRIu64
           "  redeliveries %" PRIu64 "  claims/s %.1f  acks %" PRIu64 "\n",
           s->grants, s->releases, s->lease_expiries, s->redeliveries, s->claims_per_s, s->acks);
    printf("health    mix TV distance %.4f  malformed messages %" PRIu64 "  journal %s\n",
           s->tv_distance, s->malformed, s->journal_error[0] ? "FAILING" : "ok");
    if (s->journal_error[0])
        printf("JOURNAL   %s: nothing since is durable; the broker retries and recovers once "
               "the disk has room (do not restart it before)\n", s->journal_error);
    print_refusals(s);
    print_peers(s);
    print_buckets(s);
    print_groups(s);
    print_orphans(s);
}

/* What the broker's caps, key binding and CURVE access refused since it started, when anything
 * (its log says more): hellos at --max-peers, replies waiting for the journal dropped, requests
 * naming another CURVE key's live peer, connections of a key not allowed, steering without an
 * admin key (docs/operating.md section 3). */
static void print_refusals(const wire_status *s)
{
    if (!s->hellos_refused_full && !s->replies_dropped && !s->key_refusals &&
        !s->connections_refused && !s->steering_refused)
        return;
    printf("refused   hellos (peer table full) %" PRIu64 "  replies dropped (journal wait) "
           "%" PRIu64 "  key refusals (another CURVE key) %" PRIu64 "  connections (key not "
           "allowed) %" PRIu64 "  steering (not an admin key) %" PRIu64 "\n",
           s->hellos_refused_full, s->replies_dropped, s->key_refusals, s->connections_refused,
           s->steering_refused);
}

static void print_buckets(const wire_status *s)
{
    if (!s->n_buckets) return;
    printf("\n%-8s %6s %6s %6s %7s %8s %9s %9s %12s %12s\n", "bucket", "share", "ready", "leased",
           "filling", "deficit", "produced", "consumed", "tok.prod", "tok.cons");
    for (uint32_t i = 0; i < s->n_buckets; i++) {
        const wire_bucket_stat *b = &s->buckets[i];
        char name[16];
        snprintf(name, sizeof name, "<=%u", b->upper);
        printf("%-8s %6.3f %6u %6u %7u %8.2f %9" PRIu64 " %9" PRIu64 " %12" PRIu64 " %12" PRIu64
               "\n",
               name, b->share, b->ready, b->leased, b->filling, b->deficit, b->produced,
               b->consumed, b->produced_tokens, b->consumed_tokens);
    }
}

/* One line per data-parallel drafter group; '*' after the step: its slots are reserved now;
 * "micro" k/A: the step's micro-steps reserved of the group's --accumulate A ("-" without). */
static void print_groups(const wire_status *s)
{
    if (!s->n_groups) return;
    printf("\n%-12s %-10s %6s %5s %8s %5s %7s %6s %7s  %s\n", "group", "state", "epoch", "world",
           "step", "micro", "pending", "done", "aborted", "members (rank order)");
    for (uint32_t i = 0; i < s->n_groups; i++) {
        const wire_group_stat *g = &s->groups[i];
        char members[WIRE_MAX_STATUS_MEMBERS * (WIRE_MAX_NAME + 1)] = "";
        size_t off = 0;
        for (uint32_t k = 0; k < g->n_members && off < sizeof members; k++)
            off += (size_t)snprintf(members + off, sizeof members - off, "%s%s", k ? " " : "",
                                    g->members[k]);
        char micro[24] = "-";
        if (g->accumulate > 1) snprintf(micro, sizeof micro, "%u/%u", g->micros, g->accumulate);
        printf("%-12s %-10s %6" PRIu64 " %5u %7" PRIu64 "%s %5s %7u %6" PRIu64 " %7" PRIu64
               "  %s\n",
               g->name, group_state_name(g->state), g->epoch, g->world, g->step,
               g->step_reserved ? "*" : " ", micro, g->pending, g->steps_done, g->steps_aborted,
               members);
    }
}

/* The peer table's header (status and peer print it). */
static void print_peer_header(void)
{
    printf("%-40s %-8s %8s %7s %5s %6s %7s\n", "peer", "role", "heard s", "leases", "held",
           "slots", "trains");
}

/* One listed peer: "-" where a field is not its role's. */
static void print_peer_row(const wire_peer_stat *p)
{
    bool d = p->role == WIRE_ROLE_DRAFTER;
    char leases[16] = "-", held[16] = "-", slots[16] = "-";
    if (d) {
        snprintf(leases, sizeof leases, "%u", p->leases);
        snprintf(held, sizeof held, "%u", p->held);
    } else {
        snprintf(slots, sizeof slots, "%u", p->slots);
    }
    char name[WIRE_MAX_NAME];
    printf("%-40s %-8s %8.1f %7s %5s %6s %7s\n", peer_name(p, name), role_name(p->role),
           (double)p->heard_ms_ago / 1000.0, leases, held, slots, d ? (p->trains ? "yes" : "no")
                                                                      : "-");
}

/* The live targets and drafters (none listed by an older broker: nothing printed). */
static void print_peers(const wire_status *s)
{
    if (!s->n_peer_list) return;
    printf("\n");
    print_peer_header();
    for (uint32_t i = 0; i < s->n_peer_list; i++) print_peer_row(&s->peer_list[i]);
    if (s->peers_unlisted)
        printf("(and %u more live targets and drafters, not listed)\n", s->peers_unlisted);
}

/* One line per orphaned group step: every rank of the group expired while it trained; its
 * batches stay in flight until the group is created again or the broker's group-hold-ms ends. */
static void print_orphans(const wire_status *s)
{
    if (!s->n_orphans) return;
    printf("\n%-12s %8s %7s %9s %11s  %s\n", "orphaned", "step", "batches", "held s",
           "abort in s", "(every rank expired mid-step: the group's creator resolves it)");
    for (uint32_t i = 0; i < s->n_orphans; i++) {
        const wire_orphan_stat *o = &s->orphans[i];
        printf("%-12s %8" PRIu64 " %7u %9.1f %11.1f\n", o->group, o->step, o->batches,
               (double)o->held_ms / 1000.0, (double)o->abort_in_ms / 1000.0);
    }
}

/* Asks the broker whether it is still there after `watch` heard nothing for timeout-ms (its PUB
 * socket cannot tell "quiet" from "gone"). 0 while it answers (a restarted broker: said once on
 * stderr, *restarted set, then watched on), or fail()'s exit status. */
static int watch_check_broker(const ctl_config *c, client *cl, bool *restarted)
{
    int rc = client_heartbeat(cl);
    if (rc == DFLASH_ESTALE && client_broker_restarted(cl)) {
        rc = client_hello(cl, NULL, 0);
        if (!rc) {
            fprintf(stderr, "dflash-ctl watch: the broker restarted (now %016" PRIx64 ")\n",
                    client_broker_incarnation(cl));
            *restarted = true;
        }
    }
    if (!rc) return 0;
    fprintf(stderr, "dflash-ctl watch: the broker at %s stopped answering\n", c->endpoint);
    return fail(c, cl, "watch", rc);
}

/* Why this ctl may not hear announcements on pub, with the flag that fixes it, into why. */
static void watch_pub_hint(const ctl_config *c, const char *pub, char *why, size_t len)
{
    bool router_tcp = curve_endpoint_is_tcp(c->endpoint), pub_tcp = curve_endpoint_is_tcp(pub);
    if (router_tcp && !pub_tcp)
        snprintf(why, len, "the broker announces on %.200s, a socket on its own host, and this "
                 "ctl reaches it over tcp: start dflash-queue with --pub-endpoint "
                 "tcp://HOST:PORT (a second port, CURVE like --bind) to watch from other hosts, "
                 "or watch on the broker's host with --runtime-dir", pub);
    else if (!router_tcp && pub_tcp)
        snprintf(why, len, "the broker announces only on %.200s, a CURVE server, and this ctl "
                 "on %.200s has no keys: watch over tcp (--endpoint tcp://HOST:PORT of its "
                 "--bind, --curve-server-key FILE, --curve-key FILE)", pub, c->endpoint);
    else if (pub_tcp)
        snprintf(why, len, "is %.200s reachable from here (a firewall, the host name the broker "
                 "bound), and is --curve-key's public key in the broker's --curve-clients?", pub);
    else
        snprintf(why, len, "is %.200s the socket of the broker at %.200s (another runtime dir?)",
                 pub, c->endpoint);
}

/* Before subscribing: an ipc:// PUB reached over tcp:// is a file on the broker's host; absent
 * here, no announcement can come (on the same host it can: subscribed to as is). 0 or the
 * exit status. */
static int watch_check_pub(const ctl_config *c, const char *pub)
{
    struct stat st;
    if (!curve_endpoint_is_tcp(c->endpoint) || strncmp(pub, "ipc://", 6) != 0 ||
        stat(pub + 6, &st) == 0)
        return 0;
    char why[700], msg[900];
    watch_pub_hint(c, pub, why, sizeof why);
    snprintf(msg, sizeof msg, "cannot subscribe to %s from here: %s", pub, why);
    return fail_msg(c, "watch", DFLASH_EPEER, msg);
}

/* Nothing heard since subscribing, for the deadline, while the broker answers: asks its stats
 * interval again (a live `set stats_interval_ms=0` is not a fault). 0: watch on (*deadline_ms
 * re-armed, 0 = none), or the exit status. */
static int watch_nothing_heard(const ctl_config *c, client *cl, const char *pub,
                               uint64_t *deadline_ms)
{
    uint32_t was = client_stats_interval_ms(cl);
    if (client_hello(cl, NULL, 0) == 0 && client_stats_interval_ms(cl) != was) {
        uint32_t now = client_stats_interval_ms(cl);
        *deadline_ms = now ? 3 * (uint64_t)now + 1000 : 0;
        return 0;
    }
    char why[700], msg[1000];
    watch_pub_hint(c, pub, why, sizeof why);
    snprintf(msg, sizeof msg, "subscribed to %s, but no announcement came in %.1f s (the broker "
             "announces stats every %.1f s and answers requests): %s", pub,
             (double)*deadline_ms / 1000.0, (double)was / 1000.0, why);
    return fail_msg(c, "watch", DFLASH_EPEER, msg);
}

/* Subscribes *sub (destroying one it holds) to the PUB endpoint the broker's hello named, kept
 * in pub: 0, or the exit status (checked first: an ipc:// socket out of reach, its directory
 * not ours or gone). */
static int watch_subscribe(const ctl_config *c, client *cl, char *pub, size_t len,
                           client_sub **sub)
{
    client_sub_destroy(sub);
    snprintf(pub, len, "%s", client_pub_endpoint(cl));
    int out = watch_check_pub(c, pub);
    if (out) return out;
    char why[1024];
    int bad = client_check_endpoint_existing(pub, why, sizeof why); /* a dir not ours, or none */
    if (bad == DFLASH_EPEER) /* the broker answers, but its PUB socket's dir is gone */
        snprintf(why + strlen(why), sizeof why - strlen(why), ": the broker names it as its "
                 "PUB endpoint (--pub-endpoint); was the directory removed while it runs?");
    if (bad) return fail_msg(c, "watch", bad, why);
    *sub = client_sub_new_curve(pub, "", cl);
    if (*sub) return 0;
    char msg[400];
    snprintf(msg, sizeof msg, "cannot subscribe to the broker's announcements at '%.300s'", pub);
    return fail_msg(c, "watch", DFLASH_EIO, msg);
}

/* The first announcement proves a subscription: stats are due within an interval, the second
 * is margin for the connection (a CURVE handshake). 0: no deadline (no stats announced). */
static uint64_t watch_first_deadline_ms(const client *cl)
{
    uint32_t stats_ms = client_stats_interval_ms(cl);
    return stats_ms ? 3 * (uint64_t)stats_ms + 1000 : 0;
}

static int cmd_watch(const ctl_config *c, client *cl)
{
    char pub[WIRE_MAX_TEXT];
    client_sub *sub = NULL;
    int out = watch_subscribe(c, cl, pub, sizeof pub, &sub);
    if (out) return out;
    signal(SIGINT, on_sigint);
    signal(SIGTERM, on_sigint);
    uint64_t first_deadline_ms = watch_first_deadline_ms(cl);
    if (!first_deadline_ms)
        fprintf(stderr, "dflash-ctl watch: the broker did not say it announces stats (its "
                "stats_interval_ms is 0, or it is older than this ctl): only what it announces "
                "will show, and a silence is not taken for a fault\n");
    static wire_msg m;
    int64_t seen = 0;
    bool heard = false;      /* an announcement came on this subscription */
    uint64_t quiet_ms = 0;   /* since the last announcement or broker answer */
    uint64_t unheard_ms = 0; /* since subscribing, until the first announcement */
    while (!stop_flag && (!c->count || seen < c->count)) {
        char topic[32];
        int rc = client_sub_recv(sub, topic, sizeof topic, &m, 200);
        bool restarted = false;
        if (rc == DFLASH_ETIMEOUT && (quiet_ms += 200) >= (uint64_t)c->timeout_ms) {
            quiet_ms = 0;
            if ((out = watch_check_broker(c, cl, &restarted))) break;
        }
        if (rc == DFLASH_ETIMEOUT && !heard && first_deadline_ms &&
            (unheard_ms += 200) >= first_deadline_ms) {
            if ((out = watch_check_broker(c, cl, &restarted))) break; /* gone: said as such */
            if (!restarted &&
                (out = watch_nothing_heard(c, cl, pub, &first_deadline_ms)))
                break;
            unheard_ms = 0;
        }
        if (restarted && strcmp(pub, client_pub_endpoint(cl)) != 0) {
            /* it announces elsewhere now (defect: watch heard nothing more, for ever) */
            fprintf(stderr, "dflash-ctl watch: it announces on %s now\n", client_pub_endpoint(cl));
            if ((out = watch_subscribe(c, cl, pub, sizeof pub, &sub))) break;
            first_deadline_ms = watch_first_deadline_ms(cl);
            heard = false;
            unheard_ms = 0;
        }
        if (rc) continue;
        quiet_ms = 0;
        seen++;
        heard = true;
        if (m.type == WIRE_STATUS_REPLY) status_printable(&m.u.status);
        if (m.type == WIRE_SET_CONFIG_REPLY) settings_printable(&m.u.settings);
        if (c->json) {
            cJSON *o = m.type == WIRE_STATUS_REPLY ? status_json(&m.u.status) : cJSON_CreateObject();
            cJSON_AddStringToObject(o, "topic", topic);
            if (m.type == WIRE_SLOT_READY) {
                cJSON_AddNumberToObject(o, "slot", m.u.ready.slot);
                cJSON_AddNumberToObject(o, "epoch", m.u.ready.unit.epoch);
                cJSON_AddNumberToObject(o, "bucket", m.u.ready.unit.bucket);
                cJSON_AddNumberToObject(o, "index", (double)m.u.ready.unit.index);
                cJSON_AddNumberToObject(o, "n_tokens", m.u.ready.n_tokens);
            } else if (m.type == WIRE_SET_CONFIG_REPLY) {
                for (uint32_t i = 0; i < m.u.settings.n; i++)
                    cJSON_AddStringToObject(o, m.u.settings.kv[i].key, m.u.settings.kv[i].value);
            }
            print_json(o);
        } else if (m.type == WIRE_STATUS_REPLY) {
            const wire_status *s = &m.u.status;
            uint64_t leased = 0; /* held now (grants - releases also counts expired leases) */
            printf("stats   %-8s ready", shown_state(s));
            for (uint32_t i = 0; i < s->n_buckets; i++) {
                printf(" %u", s->buckets[i].ready);
                leased += s->buckets[i].leased;
            }
            printf("  leased %" PRIu64 "  claims/s %.1f  TV %.4f  trained %" PRIu64
                   "  committed %" PRIu64 "\n",
                   leased, s->claims_per_s, s->tv_distance, s->batches_trained,
                   s->batches_committed);
        } else if (m.type == WIRE_SLOT_READY) {
            printf("ready   slot %u  batch %u/%u/%" PRIu64 "  %u tokens\n", m.u.ready.slot,
                   m.u.ready.unit.epoch, m.u.ready.unit.bucket, m.u.ready.unit.index,
                   m.u.ready.n_tokens);
        } else if (m.type == WIRE_SET_CONFIG_REPLY) {
            printf("config ");
            for (uint32_t i = 0; i < m.u.settings.n; i++)
                printf(" %s=%s", m.u.settings.kv[i].key, m.u.settings.kv[i].value);
            printf("\n");
        }
        fflush(stdout);
        wire_msg_clear(&m);
    }
    client_sub_destroy(&sub);
    return out;
}

/* Parses set's KEY=VALUE arguments into set before any broker is asked: bad arguments are
 * exit 1 whether or not a broker answers. */
static int parse_set(const ctl_config *c, int n, char **kvs, wire_settings *set)
{
    char msg[WIRE_MAX_KEY + WIRE_MAX_VALUE + 64];
    memset(set, 0, sizeof *set);
    if (n < 1 || n > WIRE_MAX_SETTINGS) {
        snprintf(msg, sizeof msg, "give 1 to %d KEY=VALUE pairs", WIRE_MAX_SETTINGS);
        return fail_msg(c, "set", DFLASH_EINVAL, msg);
    }
    for (int i = 0; i < n; i++) {
        const char *eq = strchr(kvs[i], '=');
        if (!eq || eq == kvs[i] || (size_t)(eq - kvs[i]) >= WIRE_MAX_KEY ||
            strlen(eq + 1) >= WIRE_MAX_VALUE) {
            snprintf(msg, sizeof msg, "'%.*s' is not KEY=VALUE", WIRE_MAX_KEY + WIRE_MAX_VALUE,
                     kvs[i]);
            return fail_msg(c, "set", DFLASH_EINVAL, msg);
        }
        snprintf(set->kv[i].key, WIRE_MAX_KEY, "%.*s", (int)(eq - kvs[i]), kvs[i]);
        snprintf(set->kv[i].value, WIRE_MAX_VALUE, "%s", eq + 1);
    }
    set->n = (uint32_t)n;
    return 0;
}

static int cmd_set(const ctl_config *c, client *cl, const wire_settings *set)
{
    static wire_settings applied;
    int rc = client_set(cl, set, &applied);
    if (rc) return fail(c, cl, "set", rc);
    settings_printable(&applied);
    if (c->json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddBoolToObject(o, "ok", 1);
        for (uint32_t i = 0; i < applied.n; i++)
            cJSON_AddStringToObject(o, applied.kv[i].key, applied.kv[i].value);
        print_json(o);
    } else {
        for (uint32_t i = 0; i < applied.n; i++)
            printf("%s = %s\n", applied.kv[i].key, applied.kv[i].value);
    }
    return 0;
}

/* A decimal number at *p (digits only, no sign), past it; false when there is none or it
 * overflows. */
static bool read_number(const char **p, unsigned long long *v)
{
    if (**p < '0' || **p > '9') return false;
    char *end;
    errno = 0;
    *v = strtoull(*p, &end, 10);
    *p = end;
    return errno == 0;
}

/* Whether s is exactly E/B/I (the broker's form) or (E, B, I) (the drafter's; blanks after the
 * commas optional), the three numbers into v. */
static bool batch_form(const char *s, unsigned long long v[3])
{
    bool paren = *s == '(';
    if (paren) s++;
    for (int i = 0; i < 3; i++) {
        if (i) {
            if (*s++ != (paren ? ',' : '/')) return false;
            if (paren) s += strspn(s, " ");
        }
        if (!read_number(&s, &v[i])) return false;
    }
    if (paren && *s++ != ')') return false;
    return *s == 0;
}

/* release's argument: a batch id as the logs print it, E/B/I (the broker's) or (E, B, I) (the
 * drafter's), into *u, before any broker is asked. 0, or fail_msg's exit status (1). */
static int parse_batch(const ctl_config *c, const char *arg, wire_unit *u)
{
    unsigned long long v[3];
    bool ok = batch_form(arg, v) && v[0] <= UINT32_MAX && v[1] < WIRE_MAX_BUCKETS &&
              v[2] <= UINT32_MAX;
    if (ok) {
        *u = (wire_unit){(uint32_t)v[0], (uint32_t)v[1], v[2]};
        return 0;
    }
    char msg[200];
    snprintf(msg, sizeof msg, "'%.64s' is not a batch id: give EPOCH/BUCKET/INDEX as the logs "
             "print it (e.g. 0/0/21), or 'all' to release every quarantined batch", arg);
    return fail_msg(c, "release", DFLASH_EINVAL, msg);
}

/* release E/B/I or all: the named quarantined batch, or every one (unit NULL), back to to-do. */
static int cmd_release(const ctl_config *c, client *cl, const wire_unit *unit)
{
    uint64_t n = 0;
    int rc = client_release_quarantine(cl, unit, &n);
    if (rc == DFLASH_EPROTO) {
        char msg[WIRE_MAX_TEXT + 128];
        snprintf(msg, sizeof msg, "this broker predates release (it answered: %s); upgrade "
                 "dflash-queue to release quarantined batches", client_last_error(cl));
        return fail_msg(c, "release", rc, msg);
    }
    if (rc) return fail(c, cl, "release", rc);
    if (c->json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddBoolToObject(o, "ok", 1);
        cJSON_AddStringToObject(o, "verb", "release");
        cJSON_AddNumberToObject(o, "released", (double)n);
        print_json(o);
    } else if (unit) {
        printf("released batch %u/%u/%" PRIu64 ": back to to-do\n", unit->epoch, unit->bucket,
               unit->index);
    } else if (n) {
        printf("released %" PRIu64 " quarantined batches: back to to-do\n", n);
    } else {
        printf("released 0: no batch is quarantined\n");
    }
    return 0;
}

/* keygen DIR NAME: a CURVE keypair for a broker, a daemon or an operator (curve.h). Prints the
 * two files and the public key (one JSON object with --json); a failure as fail_msg says. */
static int cmd_keygen(const ctl_config *c, int n, char **args)
{
    if (n != 2)
        return fail_msg(c, "keygen", DFLASH_EINVAL,
                        "give DIR NAME (writes DIR/NAME.key and DIR/NAME.pub)");
    curve_key pub;
    char why[400] = "";
    int rc = curve_keygen(args[0], args[1], pub, why, sizeof why);
    if (rc) return fail_msg(c, "keygen", rc, why); /* exit 1: keygen asks no broker */
    char secret_path[600], public_path[600];
    snprintf(secret_path, sizeof secret_path, "%s/%s.key", args[0], args[1]);
    snprintf(public_path, sizeof public_path, "%s/%s.pub", args[0], args[1]);
    if (c->json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddBoolToObject(o, "ok", 1);
        cJSON_AddStringToObject(o, "verb", "keygen");
        cJSON_AddStringToObject(o, "secret_key_file", secret_path);
        cJSON_AddStringToObject(o, "public_key_file", public_path);
        cJSON_AddStringToObject(o, "public_key", pub);
        print_json(o);
    } else {
        printf("%s (secret, mode 0600)\n%s %s\n", secret_path, public_path, pub);
    }
    return 0;
}

static void resolve_endpoint(ctl_config *c)
{
    if (c->endpoint[0]) return;
    client_resolve_endpoint(NULL, c->runtime_dir, c->endpoint, sizeof c->endpoint);
}

/* Whether name is one peer asks for: pattern itself, or with prefix any name starting with it,
 * and with pid_rest only one followed by digits (a drafter's default name: prefix and pid). */
static bool peer_matches(const char *name, const char *pattern, bool prefix, bool pid_rest)
{
    size_t n = strlen(pattern);
    if (!prefix) return strcmp(name, pattern) == 0;
    if (strncmp(name, pattern, n) != 0) return false;
    if (!pid_rest) return true;
    const char *r = name + n;
    if (!*r) return false;
    for (; *r; r++)
        if (*r < '0' || *r > '9') return false;
    return true;
}

/* peer NAME: the live target or drafter NAME as status lists it (NAME ending in '*': every one
 * whose name starts with the rest; @target: this host's target by its default name, @drafter:
 * this host's drafters by theirs, its prefix and a pid), exit 0; none, exit 1 (a container's
 * healthcheck: its daemon is connected and heard by the broker, not only the broker up). The
 * broker lists only the names that start so (an older one: the first 64 live peers). */
static int cmd_peer(const ctl_config *c, client *cl, const char *arg)
{
    char pattern[WIRE_MAX_NAME + 1];
    bool prefix = false, pid_rest = false;
    if (strcmp(arg, "@target") == 0) { /* this host's target by its default name */
        host_name_target(pattern, sizeof pattern);
    } else if (strcmp(arg, "@drafter") == 0) { /* this host's drafters: the prefix and a pid */
        host_name_drafter_prefix(pattern, sizeof pattern);
        prefix = pid_rest = true;
    } else {
        size_t n = strlen(arg);
        prefix = n > 0 && arg[n - 1] == '*';
        if (n - prefix >= WIRE_MAX_NAME)
            return fail_msg(c, "peer", DFLASH_EINVAL, "a peer name has at most 63 characters");
        snprintf(pattern, sizeof pattern, "%.*s", (int)(n - prefix), arg);
    }
    static wire_status s;
    int rc = client_status_peers(cl, pattern, &s);
    if (rc) return fail(c, cl, "peer", rc);
    cJSON *arr = c->json ? cJSON_CreateArray() : NULL;
    uint32_t found = 0;
    for (uint32_t i = 0; i < s.n_peer_list; i++) {
        const wire_peer_stat *p = &s.peer_list[i];
        if (!peer_matches(p->name, pattern, prefix, pid_rest)) continue;
        if (arr) {
            cJSON_AddItemToArray(arr, peer_json(p));
        } else {
            if (!found) print_peer_header();
            print_peer_row(p);
        }
        found++;
    }
    if (!found) {
        cJSON_Delete(arr);
        char msg[WIRE_MAX_NAME + 200];
        snprintf(msg, sizeof msg, "the broker lists no live target or drafter %s %s%s",
                 !prefix ? "named" : pid_rest ? "named by this host's default: " :
                 "whose name starts with", pattern, pid_rest ? "PID" : "");
        return fail_msg(c, "peer", DFLASH_ENOTFOUND, msg);
    }
    if (arr) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddBoolToObject(o, "ok", 1);
        cJSON_AddItemToObject(o, "peers", arr);
        print_json(o);
    }
    return 0;
}

int main(int argc, char **argv)
{
    signals_ignore_write_faults(); /* stdout or keygen's files past a size limit: an error */
    ctl_config c;
    char *pos[1 + WIRE_MAX_SETTINGS];
    int npos = 0;
    int rc = config_load(&ctl_table, &c, argc, argv, pos, 1 + WIRE_MAX_SETTINGS, &npos);
    if (rc == 1) return 0;
    if (rc < 0) return 1;
    if (npos < 1) {
        config_print_help(&ctl_table, stderr);
        return 1;
    }
    const char *verb = pos[0];
    static const char *const verbs[] = {"status", "watch", "set",  "pause",  "resume", "drain",
                                        "release", "ping", "peer", "keygen"};
    bool known = false;
    for (size_t i = 0; i < sizeof verbs / sizeof *verbs; i++) known |= strcmp(verb, verbs[i]) == 0;
    char msg[400];
    if (!known) { /* the list from verbs[], so it names every verb (keygen was left out) */
        size_t off = (size_t)snprintf(msg, sizeof msg, "unknown verb '%.64s' (", verb);
        for (size_t i = 0; i < sizeof verbs / sizeof *verbs && off < sizeof msg; i++)
            off += (size_t)snprintf(msg + off, sizeof msg - off, "%s%s", i ? ", " : "", verbs[i]);
        if (off < sizeof msg) snprintf(msg + off, sizeof msg - off, ")");
        return fail_msg(&c, verb, DFLASH_EINVAL, msg);
    }
    if (strcmp(verb, "keygen") == 0) return cmd_keygen(&c, npos - 1, pos + 1);
    bool release = strcmp(verb, "release") == 0, peer = strcmp(verb, "peer") == 0;
    if (strcmp(verb, "set") != 0 && (release || peer ? npos != 2 : npos > 1))
        return fail_msg(&c, verb, DFLASH_EINVAL,
                        release ? "takes one batch id (EPOCH/BUCKET/INDEX), or 'all' for every "
                                  "quarantined batch"
                        : peer  ? "takes one peer name (NAME, PREFIX* for any name starting so, "
                                  "@target or @drafter)"
                                : "takes no arguments");
    static wire_settings set;
    if (strcmp(verb, "set") == 0 && (rc = parse_set(&c, npos - 1, pos + 1, &set))) return rc;
    wire_unit unit;
    bool one = release && npos == 2 && strcmp(pos[1], "all") != 0;
    if (one && (rc = parse_batch(&c, pos[1], &unit))) return rc;
    resolve_endpoint(&c);
    char why[1024];
    if ((rc = client_check_endpoint_existing(c.endpoint, why, sizeof why))) { /* not ours, none */
        if (rc == DFLASH_EPEER) /* exit 2 at once: no broker there, and no dir made for one */
            snprintf(why + strlen(why), sizeof why - strlen(why), ": start the broker first, or "
                     "give the --runtime-dir (or --endpoint) it was started with");
        return fail_msg(&c, verb, rc, why);
    }
    char name[32];
    snprintf(name, sizeof name, "ctl-%d", (int)getpid());
    client *cl = client_new(c.endpoint, WIRE_ROLE_CTL, name);
    if (!cl) {
        snprintf(msg, sizeof msg, "cannot use endpoint '%.300s' (ipc://PATH or tcp://HOST:PORT)",
                 c.endpoint);
        return fail_msg(&c, verb, DFLASH_EINVAL, msg);
    }
    client_set_timeout(cl, (int)c.timeout_ms);
    if ((c.curve_server_key[0] || c.curve_key[0]) &&
        (rc = client_set_curve_files(cl, c.curve_server_key, c.curve_key))) {
        int out = fail_msg(&c, verb, DFLASH_EINVAL, client_last_error(cl));
        client_destroy(&cl);
        return out;
    }
    rc = client_hello(cl, NULL, 0);
    int out = 0;
    if (rc) {
        out = fail(&c, cl, verb, rc);
    } else if (strcmp(verb, "ping") == 0) {
        static wire_status s;
        if ((rc = client_heartbeat(cl)) || (rc = printable_status(cl, &s))) {
            out = fail(&c, cl, verb, rc);
        } else if (s.journal_error[0]) { /* answering, but what it records is not durable */
            char msg[WIRE_MAX_TEXT + 64];
            snprintf(msg, sizeof msg, "the broker's journal failed: %s", s.journal_error);
            out = fail_msg(&c, verb, DFLASH_EIO, msg);
        } else if (c.json) { /* a stopping broker is healthy: exit 0 (see the top comment) */
            cJSON *o = cJSON_CreateObject();
            cJSON_AddBoolToObject(o, "ok", 1);
            char inc[24];
            snprintf(inc, sizeof inc, "%016" PRIx64, client_broker_incarnation(cl));
            cJSON_AddStringToObject(o, "incarnation", inc);
            stop_json(o, &s);
            print_json(o);
        } else {
            char stop[WIRE_MAX_TEXT + 96] = "";
            if (s.stopping) {
                strcpy(stop, "; ");
                stop_text(&s.stop, stop + 2, sizeof stop - 2);
            }
            printf("ok: dflash-queue %016" PRIx64 " at %s%s\n", client_broker_incarnation(cl),
                   c.endpoint, stop);
        }
    } else if (strcmp(verb, "status") == 0) {
        static wire_status s;
        if ((rc = printable_status(cl, &s))) out = fail(&c, cl, verb, rc);
        else if (c.json) {
            cJSON *o = status_json(&s);
            char inc[24];
            snprintf(inc, sizeof inc, "%016" PRIx64, client_broker_incarnation(cl));
            cJSON_AddStringToObject(o, "incarnation", inc);
            print_json(o);
        } else {
            print_status(&s, client_broker_incarnation(cl));
        }
    } else if (strcmp(verb, "set") == 0) {
        out = cmd_set(&c, cl, &set);
    } else if (strcmp(verb, "watch") == 0) {
        out = cmd_watch(&c, cl);
    } else if (release) {
        out = cmd_release(&c, cl, one ? &unit : NULL);
    } else if (peer) {
        out = cmd_peer(&c, cl, pos[1]);
    } else {
        rc = strcmp(verb, "pause") == 0    ? client_pause(cl)
             : strcmp(verb, "resume") == 0 ? client_resume(cl)
                                           : client_drain(cl);
        if (rc) out = fail(&c, cl, verb, rc);
        else if (c.json) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddBoolToObject(o, "ok", 1);
            cJSON_AddStringToObject(o, "verb", verb);
            print_json(o);
        } else {
            printf("%s: ok\n", verb);
        }
    }
    client_destroy(&cl);
    return out;
}
