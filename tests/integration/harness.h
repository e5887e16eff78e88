/* harness: helpers shared by the broker integration tests: temp runtime dirs, spawning and
 * killing processes, starting dflash-queue and waiting until it answers (never fixed sleeps:
 * everything waits for a condition with a deadline). Header-only, static functions. */
#ifndef DFLASH_ITEST_HARNESS_H
#define DFLASH_ITEST_HARNESS_H

#include "client.h"
#include "err.h"
#include "test_files.h" /* test_slurp */

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static __attribute__((unused)) uint64_t h_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static __attribute__((unused)) void h_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Makes a fresh 0700 temp dir; returns its path in buf. */
static __attribute__((unused)) const char *h_tempdir(char *buf, size_t len)
{
    snprintf(buf, len, "/tmp/dflash-itest-XXXXXX");
    if (!mkdtemp(buf)) {
        perror("mkdtemp");
        exit(1);
    }
    return buf;
}

static __attribute__((unused)) void h_rmdir(const char *dir)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
}

/* fork+exec argv; with out_fd, the child's stdout goes to a pipe whose read end is returned. */
static __attribute__((unused)) pid_t h_spawn(char *const argv[], int *out_fd)
{
    int fds[2] = {-1, -1};
    if (out_fd && pipe(fds) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        if (out_fd) {
            dup2(fds[1], 1);
            close(fds[0]);
            close(fds[1]);
        }
        execv(argv[0], argv);
        perror("execv");
        _exit(127);
    }
    if (out_fd) {
        close(fds[1]);
        *out_fd = fds[0];
    }
    return pid;
}

/* fork+exec argv with its stdout and stderr appended to the file at log_path. */
static __attribute__((unused)) pid_t h_spawn_logged(char *const argv[], const char *log_path)
{
    pid_t pid = fork();
    if (pid == 0) {
        FILE *f = fopen(log_path, "a");
        if (!f) _exit(127);
        dup2(fileno(f), 1);
        dup2(fileno(f), 2);
        execv(argv[0], argv);
        perror("execv");
        _exit(127);
    }
    return pid;
}

/* Runs argv to completion with its output appended to log_path: its exit status, or -1 (it did
 * not start, or was killed by a signal). */
static __attribute__((unused)) int h_run_tool(char *const argv[], const char *log_path)
{
    pid_t pid = h_spawn_logged(argv, log_path);
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) < 0) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Waits up to ms for pid to exit: its exit status, or -1 (a signal ended it, it was reaped
 * before, or it was still running at the deadline: then it is SIGKILLed and reaped). A pid
 * already reaped (h_kill) returns -1 at once: it is not ours to wait for or kill any more
 * (defect: it was waited for the whole ms, then sent SIGKILL, a pid the system may have given
 * to another process). */
static __attribute__((unused)) int h_wait_exit(pid_t pid, int ms)
{
    uint64_t end = h_now_ms() + (uint64_t)ms;
    int st = 0;
    if (pid <= 0) return -1; /* a failed spawn: waitpid(-1) would reap any child, kill(-1) all */
    while (h_now_ms() < end) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        if (r < 0 && errno == ECHILD) return -1;
        h_sleep_ms(20);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

/* Whether the file at path (a process's log) holds text past byte `from` (a size taken before
 * what is looked for), waiting up to ms for it to appear. */
static __attribute__((unused)) bool h_wait_text_from(const char *path, size_t from,
                                                     const char *text, int ms)
{
    for (uint64_t end = h_now_ms() + (uint64_t)ms;; h_sleep_ms(50)) {
        size_t len = 0;
        char *log = test_slurp(path, &len);
        bool found = log && from <= len && strstr(log + from, text) != NULL;
        free(log);
        if (found || h_now_ms() >= end) return found;
    }
}

/* Whether the file at path holds text anywhere, waiting up to ms for it to appear. */
static __attribute__((unused)) bool h_wait_text(const char *path, const char *text, int ms)
{
    return h_wait_text_from(path, 0, text, ms);
}

/* A tiny training set in dir for tests that run the real daemons: a random 6-layer Qwen3 target
 * (mkmodel: dflash-mkmodel) at DIR/target, 96 greedy continuations of it (gen: dflash-gen) at
 * DIR/train.jsonl, packed into DIR/train.shard with one 32-token bucket (data: dflash-data);
 * the tools' output goes to DIR/tools.log. model and shard (128 bytes each) receive the paths.
 * 0, or the exit status of the first tool that failed (-1: it did not run). */
static __attribute__((unused)) int h_make_training_set(const char *mkmodel, const char *gen,
                                                       const char *data, const char *dir,
                                                       char model[128], char shard[128])
{
    char log[128], jsonl[128];
    snprintf(log, sizeof log, "%s/tools.log", dir);
    snprintf(model, 128, "%s/target", dir);
    snprintf(jsonl, sizeof jsonl, "%s/train.jsonl", dir);
    snprintf(shard, 128, "%s/train.shard", dir);
    char *mk[] = {(char *)mkmodel, "--family", "qwen3", "--layers", "6", "--seed", "3", "--out",
                  model, NULL};
    char *gn[] = {(char *)gen, "--model", model, "--out", jsonl, "--n", "96", "--seed", "5",
                  "--greedy", "--prompt-max", "12", "--max-new", "20", "--threads", "1", NULL};
    char *dt[] = {(char *)data, "--in", jsonl, "--out", shard, "--model", model, "--buckets", "32",
                  "--strict", NULL};
    int rc = h_run_tool(mk, log);
    if (rc == 0) rc = h_run_tool(gn, log);
    if (rc == 0) rc = h_run_tool(dt, log);
    return rc;
}

/* dflash-target (bin) on h_make_training_set's model and shard, for the broker of runtime dir
 * rt: name "tgt", 4 slots of the 32-token bucket (token_budget tokens, 4 sequences, 3 captured
 * layers), `epochs` epochs, host backend, one thread, 1 s requests; its output appended to the
 * file at log. Returns its pid (or -1). */
static __attribute__((unused)) pid_t h_start_training_target(const char *bin, const char *model,
                                                             const char *shard, const char *rt,
                                                             int epochs, int token_budget,
                                                             const char *log)
{
    char ep[24], tb[24];
    snprintf(ep, sizeof ep, "%d", epochs);
    snprintf(tb, sizeof tb, "%d", token_budget);
    char *argv[] = {(char *)bin, "--name", "tgt", "--model", (char *)model, "--shards",
                    (char *)shard, "--slots", "4", "--epochs", ep, "--buckets", "32",
                    "--token-budget", tb, "--max-seqs", "4", "--layers", "3", "--runtime-dir",
                    (char *)rt, "--threads", "1", "--backend", "host", "--timeout-ms", "1000",
                    NULL};
    return h_spawn_logged(argv, log);
}

/* A training dflash-drafter's command line on h_make_training_set's model, for the slots of
 * h_start_training_target (bucket 32, token_budget tokens, 4 sequences, 3 layers), host
 * backend, one thread, blocks of 4 and 8 anchors, for the broker of runtime dir rt: drafter
 * `name` of bin, checkpoints in ckpt; then extra (NULL-terminated flags and values, up to 32; the
 * test's: learning rate, cadences, timeouts, group; NULL: none). The strings are borrowed, the
 * number kept in cmd, which owns the array. */
typedef struct h_drafter_cmd {
    char *argv[64];
    char budget[16];
} h_drafter_cmd;

static __attribute__((unused)) char *const *h_training_drafter_argv(
    h_drafter_cmd *cmd, const char *bin, const char *model, const char *rt, const char *name,
    const char *ckpt, int token_budget, const char *const *extra)
{
    snprintf(cmd->budget, sizeof cmd->budget, "%d", token_budget);
    char *base[] = {(char *)bin, "--train", "--model", (char *)model, "--name", (char *)name,
                    "--checkpoint-dir", (char *)ckpt, "--block-size", "4", "--anchors", "8",
                    "--buckets", "32", "--token-budget", cmd->budget, "--max-seqs", "4",
                    "--layers", "3", "--runtime-dir", (char *)rt, "--threads", "1", "--backend",
                    "host"};
    size_t n = 0;
    for (; n < sizeof base / sizeof *base; n++) cmd->argv[n] = base[n];
    for (size_t i = 0; extra && extra[i] && i < 32; i++) cmd->argv[n++] = (char *)extra[i];
    cmd->argv[n] = NULL;
    return cmd->argv;
}

/* h_training_drafter_argv's drafter started, its output appended to the file at log: its pid. */
static __attribute__((unused)) pid_t h_start_training_drafter(const char *bin, const char *model,
                                                              const char *rt, const char *name,
                                                              const char *ckpt, int token_budget,
                                                              const char *const *extra,
                                                              const char *log)
{
    h_drafter_cmd cmd;
    return h_spawn_logged(
        h_training_drafter_argv(&cmd, bin, model, rt, name, ckpt, token_budget, extra), log);
}

/* Whether pid is a child of this process not reaped yet (running, stopped, or ended and not
 * waited for): only then is the pid still the process it was, ours to signal. A pid reaped
 * before may be any process's now (the kernel reuses pids; a full test run wraps them), and a
 * kill would reach that one (h_kill and h_stop sent their signal regardless). Reaps nothing. */
static __attribute__((unused)) bool h_is_child(pid_t pid)
{
    siginfo_t info;
    if (pid <= 0) return false;
    return waitid(P_PID, (id_t)pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0;
}

/* kill(pid, sig) when pid is an unreaped child (h_is_child), else -1 and nothing sent: how a
 * test signals its own children (a stop, a pause, a resume); a pid reaped on an earlier failure
 * path, or -1 from a failed spawn (kill(-1) signals every process of the user), is skipped. A
 * process signalling its sibling (a forked rank, the broker) cannot use it. */
static __attribute__((unused)) int h_signal(pid_t pid, int sig)
{
    return h_is_child(pid) ? kill(pid, sig) : -1;
}

/* Sends sig to pid and reaps it, ignoring how it ended (a kill whose outcome is not the point);
 * nothing when pid is not an unreaped child (h_is_child). */
static __attribute__((unused)) void h_kill(pid_t pid, int sig)
{
    if (!h_is_child(pid)) return;
    kill(pid, sig);
    waitpid(pid, NULL, 0);
}

/* Stops pid with SIGTERM and reaps it. Returns its wait status: 0 when it exited 0 (a daemon's
 * clean shutdown; a sanitizer's report or a crash gives non-zero), -1 when pid is not an
 * unreaped child (h_is_child: nothing is sent) or the wait fails. */
static __attribute__((unused)) int h_stop(pid_t pid)
{
    int status = -1;
    if (!h_is_child(pid)) return -1;
    kill(pid, SIGTERM);
    if (waitpid(pid, &status, 0) != pid) return -1;
    if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
        fprintf(stderr, "pid %d exited %d on SIGTERM\n", (int)pid, WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        fprintf(stderr, "pid %d ended by signal %d on SIGTERM\n", (int)pid, WTERMSIG(status));
    return status;
}

/* How long a test waits for a broker it started to answer its first hello: a bound on a
 * broker that never comes up, not a timing (an ASan broker took over 10 s under ctest -j6 on 2
 * cores; e2e_common.py BROKER_UP_S is the same). */
#define H_BROKER_UP_MS 30000

/* Waits until a ctl client gets a hello answer from endpoint, up to deadline_ms. Returns the
 * broker's incarnation or 0. */
static __attribute__((unused)) uint64_t h_wait_broker(const char *endpoint, int deadline_ms)
{
    uint64_t end = h_now_ms() + (uint64_t)deadline_ms;
    client *c = client_new(endpoint, WIRE_ROLE_CTL, "harness");
    uint64_t inc = 0;
    client_set_timeout(c, 200);
    while (h_now_ms() < end) {
        if (client_hello(c, NULL, 0) == 0) {
            inc = client_broker_incarnation(c);
            break;
        }
        h_sleep_ms(20);
    }
    client_destroy(&c);
    return inc;
}

/* The broker's status through a fresh ctl client (hello, then status; up to 20 attempts of 1 s
 * each, for a broker that is still coming back). 0 or the last error. */
static __attribute__((unused)) int h_broker_status(const char *endpoint, wire_status *s)
{
    client *c = client_new(endpoint, WIRE_ROLE_CTL, "check");
    if (!c) return DFLASH_ENOMEM;
    client_set_timeout(c, 1000);
    int rc = DFLASH_ETIMEOUT;
    for (int a = 0; a < 20 && rc; a++)
        if ((rc = client_hello(c, NULL, 0)) == 0) rc = client_status(c, s);
    client_destroy(&c);
    return rc;
}

/* The broker's status through c, polled every 20 ms until pred holds or ms pass (the first at
 * once); whether it held. The last status in *s. */
static __attribute__((unused)) bool h_status_until(client *c, wire_status *s,
                                                   bool (*pred)(const wire_status *), int ms)
{
    for (uint64_t end = h_now_ms() + (uint64_t)ms;; h_sleep_ms(20)) {
        bool ok = client_status(c, s) == 0 && pred(s);
        if (ok || h_now_ms() >= end) return ok;
    }
}

/* client_hello through c, naming the batches it holds, retried every 20 ms for up to ms (a
 * broker being restarted does not answer yet); 0 once one is answered, -1 if none was. */
static __attribute__((unused)) int h_hello_retry(client *c, const wire_unit *held, uint32_t n,
                                                 int ms)
{
    for (uint64_t end = h_now_ms() + (uint64_t)ms; h_now_ms() < end; h_sleep_ms(20))
        if (client_hello(c, held, n) == 0) return 0;
    return -1;
}

/* The slots ready in status s, all buckets together. */
static __attribute__((unused)) uint32_t h_ready_slots(const wire_status *s)
{
    uint32_t n = 0;
    for (uint32_t b = 0; b < s->n_buckets; b++) n += s->buckets[b].ready;
    return n;
}

/* The broker's endpoint in runtime dir `dir` (dflash-queue's default: ipc://DIR/queue.sock). */
static __attribute__((unused)) void h_queue_endpoint(const char *dir, char *ep, size_t len)
{
    snprintf(ep, len, "ipc://%s/queue.sock", dir);
}

/* A temp dir (into dir, 64 bytes), its runtime dir DIR/run (mode 0700, into rt, 128 bytes) and
 * the broker's endpoint there (into ep, 128 bytes): the layout of the tests that start the
 * daemons with --runtime-dir. */
static __attribute__((unused)) void h_run_dirs(char *dir, char *rt, char *ep)
{
    h_tempdir(dir, 64);
    snprintf(rt, 128, "%s/run", dir);
    mkdir(rt, 0700);
    h_queue_endpoint(rt, ep, 128);
}

/* The last "final state at step N has hash H" a group rank logged (dflash-drafter's end). */
static __attribute__((unused)) bool h_final_hash(const char *log, unsigned long long *step,
                                                 unsigned long long *hash)
{
    char *s = test_slurp(log, NULL);
    if (!s) return false;
    bool ok = false;
    for (char *p = s; (p = strstr(p, "final state at step ")); p++)
        ok = sscanf(p, "final state at step %llu has hash %llx", step, hash) == 2;
    free(s);
    return ok;
}

/* The steps group `name` finished, as the broker's log at path says them: for each line "group
 * NAME: step S done: N batches trained", in order, S into step[i] and N into batches[i] (the
 * first max of them). Returns how many were stored (none from a log that cannot be read). */
static __attribute__((unused)) int h_group_steps(const char *path, const char *name,
                                                 unsigned *step, unsigned *batches, int max)
{
    char *log = test_slurp(path, NULL);
    char head[96], fmt[160];
    snprintf(head, sizeof head, "group %s: step ", name);
    snprintf(fmt, sizeof fmt, "%s%%u done: %%u batches trained", head);
    int n = 0;
    for (char *p = log; n < max && (p = strstr(p, head)); p++)
        if (sscanf(p, fmt, &step[n], &batches[n]) == 2) n++;
    free(log);
    return n;
}

/* Group `name` in status s, or NULL. */
static __attribute__((unused)) const wire_group_stat *h_group(const wire_status *s,
                                                              const char *name)
{
    for (uint32_t i = 0; i < s->n_groups; i++)
        if (strcmp(s->groups[i].name, name) == 0) return &s->groups[i];
    return NULL;
}

/* Waits up to ms until group `name` is active with `world` ranks and done >= min_done steps,
 * asking the broker through c every 20 ms; the last status in *s. */
static __attribute__((unused)) bool h_wait_group(client *c, const char *name, uint32_t world,
                                                 uint64_t min_done, int ms, wire_status *s)
{
    uint64_t end = h_now_ms() + (uint64_t)ms;
    while (h_now_ms() < end) {
        if (client_status(c, s) == 0) {
            const wire_group_stat *g = h_group(s, name);
            if (g && g->world == world && g->state == WIRE_GROUP_ACTIVE &&
                g->steps_done >= min_done)
                return true;
        }
        h_sleep_ms(20);
    }
    return false;
}

/* A client of the broker at ep (role, name; 1 s per request) that said hello, trying up to
 * `tries` times while the broker starts; *rc: the last hello's result (0 when it answered). */
static __attribute__((unused)) client *h_client(const char *ep, wire_role role, const char *name,
                                                int tries, int *rc)
{
    client *c = client_new(ep, role, name);
    client_set_timeout(c, 1000);
    *rc = DFLASH_ETIMEOUT;
    for (int a = 0; a < tries && *rc; a++) *rc = client_hello(c, NULL, 0);
    return c;
}

/* The group tests' broker: dflash-queue on runtime dir rt (ep: its endpoint) with its journal
 * and log in dir (queue.journal, queue.log), --min-ready 1 --max-depth 4, then `more`
 * (NULL-terminated flags and values; NULL: --lease-timeout-ms 1500 --heartbeat-ms 300). Waits
 * until it answers. *qp: its pid. Returns a ctl client ("itest", 2 s a request) that said hello,
 * or NULL (the broker did not answer). */
static __attribute__((unused)) client *h_start_group_broker(const char *bin, const char *dir,
                                                            const char *rt, const char *ep,
                                                            const char *const *more, pid_t *qp)
{
    static const char *const dflt[] = {"--lease-timeout-ms", "1500", "--heartbeat-ms", "300",
                                       NULL};
    char rtflag[160], journal[128], log[128];
    snprintf(rtflag, sizeof rtflag, "--runtime-dir=%s", rt);
    snprintf(journal, sizeof journal, "%s/queue.journal", dir);
    snprintf(log, sizeof log, "%s/queue.log", dir);
    char *argv[32] = {(char *)bin, rtflag, "--journal", journal, "--min-ready", "1",
                      "--max-depth", "4"};
    int n = 8;
    for (const char *const *m = more ? more : dflt; *m && n < 31; m++) argv[n++] = (char *)*m;
    argv[n] = NULL;
    *qp = h_spawn_logged(argv, log);
    if (!h_wait_broker(ep, H_BROKER_UP_MS)) return NULL;
    client *c = client_new(ep, WIRE_ROLE_CTL, "itest");
    client_set_timeout(c, 2000);
    if (client_hello(c, NULL, 0) != 0) client_destroy(&c);
    return c;
}

/* Starts dflash-queue with runtime dir `dir` plus extra "--flag=value" args (NULL-terminated)
 * and waits until it answers. Returns its pid (or -1). */
static __attribute__((unused)) pid_t h_start_queue(const char *bin, const char *dir, const char *const *extra)
{
    char *argv[40];
    int n = 0;
    static char rt[300];
    snprintf(rt, sizeof rt, "--runtime-dir=%s", dir);
    argv[n++] = (char *)bin;
    argv[n++] = rt;
    for (int i = 0; extra && extra[i] && n < 38; i++) argv[n++] = (char *)extra[i];
    argv[n] = NULL;
    pid_t pid = h_spawn(argv, NULL);
    char ep[300];
    h_queue_endpoint(dir, ep, sizeof ep);
    if (!h_wait_broker(ep, H_BROKER_UP_MS)) {
        fprintf(stderr, "dflash-queue did not come up\n");
        h_kill(pid, SIGKILL);
        return -1;
    }
    return pid;
}

/* h_start_queue with the small worker-loop tests' broker: its journal at DIR/queue.journal,
 * min-ready 1, max-depth 2, heartbeat 100 ms, no stats announcements, then `more` (NULL-
 * terminated, e.g. the log level; may be NULL). */
static __attribute__((unused)) pid_t h_start_small_queue(const char *bin, const char *dir,
                                                         const char *const *more)
{
    static char journal[300];
    snprintf(journal, sizeof journal, "--journal=%s/queue.journal", dir);
    const char *extra[24] = {journal, "--min-ready=1", "--max-depth=2", "--heartbeat-ms=100",
                             "--stats-interval-ms=0"};
    int n = 5;
    for (int i = 0; more && more[i] && n < 23; i++) extra[n++] = more[i];
    extra[n] = NULL;
    return h_start_queue(bin, dir, extra);
}

/* The slot shape of h_start_small_target's pool, for slot_layout_compute in the worker-loop
 * tests: 256 tokens, 4 sequences, hidden 8, 2 captured layers. */
#define H_SMALL_LAYOUT 256, 4, 8, 2

/* A synthetic host-backend dflash-target on the broker of runtime dir `dir`: peer and pool
 * `name`, 2 slots of H_SMALL_LAYOUT, buckets 64 and 256 of `batches` batches each, request
 * timeout timeout_ms. Returns its pid (or -1). */
static __attribute__((unused)) pid_t h_start_small_target(const char *bin, const char *dir,
                                                          const char *name, int batches,
                                                          int timeout_ms)
{
    char rt[300], nm[96], bpb[64], to[64];
    snprintf(rt, sizeof rt, "--runtime-dir=%s", dir);
    snprintf(nm, sizeof nm, "--name=%s", name);
    snprintf(bpb, sizeof bpb, "--batches-per-bucket=%d", batches);
    snprintf(to, sizeof to, "--timeout-ms=%d", timeout_ms);
    char *argv[] = {(char *)bin, rt, nm, "--model=synthetic", "--slots=2", "--token-budget=256",
                    "--max-seqs=4", "--hidden=8", "--layers=2", "--buckets=64,256", bpb,
                    "--backend=host", to, "--progress-ms=0", "--log-level=warn", NULL};
    return h_spawn(argv, NULL);
}

/* A host-backend pool of n_slots slots, n_buckets equal buckets of `batches` batches each. */
static __attribute__((unused)) void h_pool(wire_pool *p, uint64_t inc, uint32_t n_slots, uint32_t n_buckets,
                   uint32_t batches, uint32_t epochs)
{
    memset(p, 0, sizeof *p);
    p->pool_incarnation = inc;
    p->backend = WIRE_BACKEND_HOST;
    snprintf(p->shm_name, sizeof p->shm_name, "/dflash-itest");
    p->slot_count = n_slots;
    p->slot_size = 1 << 16;
    p->layout_version = 1;
    p->token_budget = 1024;
    p->n_buckets = n_buckets;
    for (uint32_t b = 0; b < n_buckets; b++) {
        p->bucket_upper[b] = 512u << b;
        p->bucket_share[b] = 1.0 / n_buckets;
        p->bucket_batches[b] = batches;
    }
    p->epochs = epochs;
}

/* The broker's status into *s and its ledger in one line, prefixed by what; 0 or the client's
 * error (nothing printed then). */
static __attribute__((unused)) int h_print_ledger(const char *endpoint, const char *what,
                                                  wire_status *s)
{
    int rc = h_broker_status(endpoint, s);
    if (rc == 0)
        printf("%s: ledger trained %llu, in flight %llu, to-do %llu, acks %llu\n", what,
               (unsigned long long)s->batches_trained, (unsigned long long)s->batches_inflight,
               (unsigned long long)s->batches_todo, (unsigned long long)s->acks);
    return rc;
}

/* The group hooks of a worker_consumer without a model (a test's consume() only counts its
 * batches): nothing to take from rank 0; pair them with a model_step returning that count. */
struct dp_comm;
static __attribute__((unused)) void h_set_group_none(void *ctx, struct dp_comm *comm, int rank,
                                                     int world)
{
    (void)ctx, (void)comm, (void)rank, (void)world;
}

static __attribute__((unused)) int h_sync_state_none(void *ctx, int root)
{
    (void)ctx, (void)root;
    return 0;
}

#endif
