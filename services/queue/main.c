/* dflash-queue: the broker daemon. main() is the table of contents: load the config table
 * (defaults < file < DFLASH_* < flags; config_load runs broker_config_check, which refuses e.g.
 * a tcp:// endpoint without CURVE, before --dump-config too), resolve the runtime directory and
 * endpoints, log the effective config (and warn about a journal left at its default place, the
 * runtime dir), open the broker (which replays the journal, restores the operator's runtime
 * steering over that config, saying so per value, and binds; a broker that cannot start, e.g.
 * on the runtime dir of a running one, removes the journal and lock files it created), run the
 * loop until SIGINT/SIGTERM has stopped the broker gracefully (broker_stop.c: no new leases, the
 * acks and checkpoint reports in progress waited for up to --stop-grace-ms; a second signal ends
 * it at once), shut down in reverse. Everything else lives in
 * broker.c (server loop; its parts broker_config.c, broker_groups.c, broker_steering.c,
 * broker_stop.c, broker_security.c), policy.c (buckets, leases), steering.c (set/pause/drain
 * kept across restarts) and ledger.c/journal.c (the training ledger). */
#include "broker.h"
#include "client.h"
#include "config.h"
#include "err.h"
#include "fsutil.h"
#include "log.h"
#include "journal.h" /* JOURNAL_HEADER_BYTES, JOURNAL_RECORD_OVERHEAD */
#include "signals.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

/* Creates dir with mode 0700 if missing and refuses one that is not ours alone (fsutil.h, the
 * same check every client makes before it connects): ipc sockets in it are the broker's only
 * access control. */
static int runtime_dir_prepare(const char *dir)
{
    char why[1024];
    int rc = fs_make_private_dir(dir, why, sizeof why);
    if (rc) LOG_ERROR("runtime dir: %s", why);
    return rc;
}

/* The directories of the ipc:// sockets the broker binds, its runtime dir's or others given by
 * --endpoint, --bind and --pub-endpoint: each must be ours alone too, the check each client
 * makes before it connects (client_check_endpoint), so that a misplaced socket is refused here,
 * at start, not by every client. tcp:// endpoints pass. */
static int endpoint_dirs_prepare(const queue_config *c)
{
    const char *eps[] = {c->endpoint, c->bind, c->pub_endpoint};
    for (size_t i = 0; i < sizeof eps / sizeof eps[0]; i++) {
        char why[1024];
        int rc = eps[i][0] ? client_check_endpoint(eps[i], why, sizeof why) : 0;
        if (rc) {
            LOG_ERROR("%s", why);
            return rc;
        }
    }
    return 0;
}

static void resolve_paths(queue_config *c)
{
    if (!c->runtime_dir[0]) client_default_runtime_dir(c->runtime_dir, sizeof c->runtime_dir);
    if (!c->endpoint[0])
        snprintf(c->endpoint, sizeof c->endpoint, "ipc://%.200s/queue.sock", c->runtime_dir);
    if (!c->pub_endpoint[0])
        snprintf(c->pub_endpoint, sizeof c->pub_endpoint, "ipc://%.200s/queue-pub.sock",
                 c->runtime_dir);
    if (!c->journal[0])
        snprintf(c->journal, sizeof c->journal, "%.200s/queue.journal", c->runtime_dir);
}

/* The default journal lives in the runtime dir, on most systems a tmpfs ($XDG_RUNTIME_DIR is
 * emptied at logout, /tmp often at reboot): a broker restarted after that would start a fresh
 * ledger and hand out every batch again. Said at start-up; an explicit --journal is trusted. */
static void warn_default_journal(const queue_config *c)
{
    LOG_WARN("journal %s: the default, in the runtime dir, which the system may empty (logout, "
             "reboot, tmp cleaning); a broker restarted after that forgets which batches were "
             "trained: give --journal a file on persistent storage (or --journal none)",
             c->journal);
}

/* The journal and its lock file that a broker about to open path would create: which of the
 * two are missing now. A broker that then fails to start removes what it created
 * (journal_forget_created), so a failed start leaves the disk as it found it. */
typedef struct journal_files {
    char path[sizeof(((queue_config *)0)->journal)];
    char lock[sizeof(((queue_config *)0)->journal) + sizeof ".lock"];
    bool journal_new, lock_new;
} journal_files;

static void journal_note_missing(const char *path, journal_files *f)
{
    memset(f, 0, sizeof *f);
    if (!path[0] || strcmp(path, "none") == 0) return;
    snprintf(f->path, sizeof f->path, "%s", path);
    snprintf(f->lock, sizeof f->lock, "%s.lock", path);
    struct stat st;
    f->journal_new = stat(f->path, &st) != 0 && errno == ENOENT;
    f->lock_new = stat(f->lock, &st) != 0 && errno == ENOENT;
}

/* Another broker may have created the same files since journal_note_missing looked (two started
 * at once on one --journal): nothing is removed unless this process can take the lock now (no
 * broker uses the journal) and the journal holds nothing a broker wrote after its start (its
 * header and at most the BOOT record every start appends, with no payload). The lock file goes
 * last, still held, so no broker can have locked it in between. */
static void journal_forget_created(const journal_files *f)
{
    if (!f->journal_new && !f->lock_new) return;
    int fd = open(f->lock, O_RDWR | O_CLOEXEC);
    if (fd < 0) return;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) { /* another broker holds it: its files */
        close(fd);
        return;
    }
    struct stat st;
    bool recordless = stat(f->path, &st) != 0 || st.st_size <= JOURNAL_HEADER_BYTES + JOURNAL_RECORD_OVERHEAD;
    if (f->journal_new && recordless && unlink(f->path) == 0)
        LOG_INFO("removed %s, created by this failed start", f->path);
    if (f->lock_new && recordless) unlink(f->lock);
    close(fd);
}

/* The broker has stopped (broker_stop_gracefully's done): uv_run returns. */
static void on_stopped(void *loop)
{
    uv_stop(loop);
}

static void on_signal(uv_signal_t *s, int signum)
{
    broker *b = s->data;
    LOG_INFO("signal %d: %s", signum, broker_stopping(b) ? "a second one, the stop ends now"
                                                          : "stopping");
    broker_stop_gracefully(b, on_stopped, s->loop);
}

int main(int argc, char **argv)
{
    log_init("dflash-queue", LOG_INFO);
    queue_config cfg;
    cfg_table with_sources = *broker_config_table(); /* refusals say where a value came from */
    cfg_source sources[with_sources.n_options];
    with_sources.sources = sources;
    const cfg_table *table = &with_sources;
    int rc = config_load(table, &cfg, argc, argv, NULL, 0, NULL);
    if (rc == 1) return 0;
    if (rc < 0) return 2;
    if (log_init_named(NULL, cfg.log_level) != 0) return 2;
    signals_ignore_write_faults(); /* the journal's write past a size limit: a failing journal */

    bool journal_default = !cfg.journal[0];
    resolve_paths(&cfg);
    rc = runtime_dir_prepare(cfg.runtime_dir);
    if (!rc) rc = endpoint_dirs_prepare(&cfg);
    if (rc) return rc == DFLASH_EIO ? 1 : 2; /* a file there, or open to others: configuration */

    LOG_INFO("effective configuration:");
    config_dump(table, &cfg, stderr);
    if (journal_default) warn_default_journal(&cfg);

    uv_loop_t *loop = uv_default_loop();
    journal_files created;
    journal_note_missing(cfg.journal, &created);
    broker *b = broker_new(loop, &cfg, &rc);
    if (!b) {
        LOG_ERROR("cannot start: %s", err_str(rc));
        journal_forget_created(&created);
        return rc == DFLASH_ECONFIG ? 2 : 1; /* e.g. a CURVE key file it cannot use */
    }
    uv_signal_t sigint, sigterm;
    uv_signal_init(loop, &sigint);
    uv_signal_init(loop, &sigterm);
    sigint.data = sigterm.data = b;
    uv_signal_start(&sigint, on_signal, SIGINT);
    uv_signal_start(&sigterm, on_signal, SIGTERM);

    uv_run(loop, UV_RUN_DEFAULT);

    uv_close((uv_handle_t *)&sigint, NULL);
    uv_close((uv_handle_t *)&sigterm, NULL);
    broker_destroy(&b);
    uv_run(loop, UV_RUN_DEFAULT);
    uv_loop_close(loop);
    LOG_INFO("stopped");
    return 0;
}
