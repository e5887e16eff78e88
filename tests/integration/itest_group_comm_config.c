/* itest_group_comm_config: a group rank whose communicator refuses its own setup ends (exit 2)
 * instead of re-forming the group for ever (the multi-GPU audit's finding 1).
 *
 * The case that matters is NCCL's "Duplicate GPU detected" (two ranks of one communicator on one
 * GPU), which needs GPUs; test_collective checks that it is classified DFLASH_ECONFIG. Here the
 * drafter's side runs without a GPU: the same class of failure comes from a --device the nccl
 * collective cannot set (device 63: no such GPU here, nor on an 8-GPU host), which dp_comm_open
 * answers DFLASH_ECONFIG the same way.
 *
 * The real dflash-queue runs in a temp dir; a group member is the worker loop in a child process
 * (this binary, "member" mode) with --comm nccl on device 63 and a consumer whose finish() says
 * it ran. Checked: the member's loop returns DFLASH_ECONFIG within 30 s (before, every join
 * opened the communicator, failed and re-formed: 10,000 re-forms in 3 s here, until
 * ncclGetUniqueId itself failed, exit 1; the same loop without end on a GPU); its log names --device
 * 63 and says the rank leaves the group; it never says "re-forming"; finish() ran (the final
 * checkpoint of a trainer); the broker lists no member in group g any more (GroupLeave).
 * Skipped (77) in a build without NCCL.
 * Usage: itest_group_comm_config QUEUE. Exit 0 pass, 1 fail, 77 skip. */
#include "check.h"
#include "collective.h"
#include "harness.h"
#include "test_files.h"
#include "worker_loop.h"

#include <signal.h>

typedef struct member {
    uint64_t step;
    int finished;
} member;

static int consume(void *ctx, const worker_batch *b, uint64_t *step)
{
    (void)b;
    *step = ++((member *)ctx)->step;
    return 0;
}

static uint64_t model_step(void *ctx) { return ((member *)ctx)->step; }

static int finish(void *ctx)
{
    ((member *)ctx)->finished++;
    return 0;
}

static volatile sig_atomic_t member_stop;

static void on_term(int sig)
{
    (void)sig;
    member_stop = 1;
}

/* "member" mode: rank of group g with --comm nccl on device 63 until its loop ends or SIGTERM;
 * prints how the loop ended. Exit 2 on DFLASH_ECONFIG, 0 when stopped, else 1. */
static int member_main(const char *ep)
{
    struct sigaction sa = {.sa_handler = on_term};
    sigaction(SIGTERM, &sa, NULL);
    worker_loop_config lc = {.endpoint = ep, .name = "rank-a", .backend = POOL_HOST,
                             .device = 63, .timeout_ms = 1000, .group = "g",
                             .comm_kind = DP_COMM_NCCL, .comm_timeout_s = 10};
    member k = {0};
    if (slot_layout_compute(H_SMALL_LAYOUT, SLOT_DTYPE_F32, &lc.layout)) return 1;
    worker_consumer cons = {.name = "rank-a", .ctx = &k, .consume = consume,
                            .set_group = h_set_group_none, .sync_state = h_sync_state_none,
                            .model_step = model_step, .finish = finish};
    int rc = worker_loop_run(&lc, &cons, &member_stop, NULL);
    printf("member rank-a: loop ended: %s, finish() ran %d time(s)\n", err_str(rc), k.finished);
    fflush(stdout);
    return rc == DFLASH_ECONFIG ? 2 : rc < 0 ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "member") == 0) return member_main(argv[2]);
    if (argc < 2) {
        fprintf(stderr, "usage: itest_group_comm_config QUEUE\n");
        return 2;
    }
    if (!dp_comm_have_nccl()) {
        printf("skip: this build has no NCCL\n");
        return 77;
    }
    char dir[64], rt[128], ep[128], log[160];
    h_run_dirs(dir, rt, ep);
    snprintf(log, sizeof log, "%s/rank-a.log", dir);
    const char *more[] = {"--log-level=warn", NULL};
    pid_t q = h_start_small_queue(argv[1], rt, more);
    CHECK(q > 0);
    if (q <= 0) CHECK_DONE();
    int rc;
    client *c = h_client(ep, WIRE_ROLE_CTL, "itest", 10, &rc);
    CHECK_EQ_INT(rc, 0);

    char *margv[] = {"/proc/self/exe", "member", ep, NULL};
    uint64_t t0 = h_now_ms();
    pid_t a = h_spawn_logged(margv, log);
    int status = h_wait_exit(a, 30000);
    double took = (double)(h_now_ms() - t0) / 1000.0;
    if (status == -1) h_kill(a, SIGTERM); /* still re-forming: the old behaviour */
    CHECK_EQ_INT(status, 2);
    CHECK(h_wait_text(log, "member rank-a: loop ended: bad configuration, finish() ran 1", 0));
    CHECK(h_wait_text(log, "--device 63 cannot be used", 0));
    CHECK(h_wait_text(log, "this rank leaves the group", 0));
    char *text = test_slurp(log, NULL);
    CHECK(text && !strstr(text, "re-forming"));
    wire_status s;
    CHECK_EQ_INT(client_status(c, &s), 0);
    const wire_group_stat *g = h_group(&s, "g");
    CHECK(!g || g->n_members == 0);
    printf("a group rank on a device the nccl collective cannot use ended in %.1f s with exit "
           "%d, its final finish() run; the broker lists %u member(s) of group g\n", took, status,
           g ? g->n_members : 0);
    if (check_failed && text) fprintf(stderr, "--- member log ---\n%s", text);
    free(text);
    client_destroy(&c);
    h_stop(q);
    h_rmdir(dir);
    CHECK_DONE();
}
