/* itest_eval_stop: `dflash-drafter eval` reports its progress inside a long sequence and stops
 * within it on SIGTERM or SIGINT, printing the partial tau marked as such.
 *
 * eval used to ignore both signals (the drafter's stop flag was installed, eval never read it:
 * on a real target on the cpu that is hours) and printed its progress line only between
 * sequences, with an ETA by sequences (audit 2026-12-04, findings 3 and 11). Now:
 *   - a line comes every --progress-ms also while one sequence runs (its target layer or its
 *     chunk of drafted blocks named), with the tokens done and an ETA by tokens;
 *   - SIGTERM in the middle of sequence 2 of 3 ends eval within that sequence (not after it:
 *     "stopped after 1 of 3", not 2; not after the whole run, exit 0), exit 143 (128 +
 *     SIGTERM), with "stopped after 1 of 3 sequences: tau X over the 1 sequences done ...
 *     (partial)";
 *   - SIGINT does the same with exit 130, and --json says "partial": true.
 *
 * Setup (in a temp dir): a random Qwen3 target of hidden size 256 (dflash-mkmodel) and a shard
 * written here of one short sequence (200 tokens) and two long ones (3000 tokens, a second or
 * more each at one thread), every token a response token. No broker: eval runs alone.
 * Usage: itest_eval_stop MKMODEL DRAFTER. Exit 0 pass, 1 fail. */
#include "check.h"
#include "harness.h"
#include "shard.h"
#include "test_files.h"

static char dir[64], model[128], heldout[128], out[128];
static const char *drafter_bin;

/* The short sequence, then the two long ones; ids < 2048, loss mask 1 after 8 prompt tokens. */
static int write_shard(void)
{
    static int32_t ids[3000];
    static uint8_t mask[3000];
    for (int p = 0; p < 3000; p++) {
        ids[p] = (int32_t)((p * 37 + 11) % 2048);
        mask[p] = p >= 8;
    }
    const uint32_t lens[3] = {200, 3000, 3000};
    shard_writer *w = shard_writer_new(heldout, 0);
    if (!w) return -1;
    for (int i = 0; i < 3; i++)
        if (shard_writer_add(w, ids, mask, lens[i])) return -1;
    int rc = shard_writer_commit(w);
    shard_writer_destroy(&w);
    return rc;
}

/* Starts eval (extra: one more flag or NULL), waits for its progress line from inside the
 * second sequence, sends sig and returns eval's exit status (-1: still running 10 s later, or
 * no such line within 120 s); its output is in OUT. *ms: from the signal to its exit. */
static int eval_until_signal(int sig, const char *extra, uint64_t *ms)
{
    truncate(out, 0);
    char *argv[] = {(char *)drafter_bin, "eval", "--init-only", "--model", model, "--data", heldout,
                    "--threads", "1", "--progress-ms", "100", (char *)extra, NULL};
    pid_t pid = h_spawn_logged(argv, out);
    if (!h_wait_text(out, "in sequence 2 (3000 tokens)", 120000)) {
        fprintf(stderr, "no progress line from inside sequence 2 within 120 s\n");
        h_kill(pid, SIGKILL);
        return -1;
    }
    uint64_t t0 = h_now_ms();
    h_signal(pid, sig);
    int rc = h_wait_exit(pid, 10000);
    *ms = h_now_ms() - t0;
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s MKMODEL DRAFTER\n", argv[0]);
        return 1;
    }
    drafter_bin = argv[2];
    h_tempdir(dir, sizeof dir);
    snprintf(model, sizeof model, "%s/target", dir);
    snprintf(heldout, sizeof heldout, "%s/heldout.shard", dir);
    snprintf(out, sizeof out, "%s/eval.out", dir);
    char log[128];
    snprintf(log, sizeof log, "%s/tools.log", dir);
    char *mk[] = {argv[1], "--family", "qwen3", "--hidden", "256", "--heads", "4", "--layers",
                  "6", "--intermediate", "768", "--vocab", "2048", "--max-pos", "4096", "--seed",
                  "3", "--threads", "1", "--out", model, NULL};
    CHECK_EQ_INT(h_run_tool(mk, log), 0);
    CHECK_EQ_INT(write_shard(), 0);

    /* SIGTERM inside sequence 2: exit 143 at once, the tau of sequence 1 marked partial */
    uint64_t ms = 0;
    int rc = eval_until_signal(SIGTERM, NULL, &ms);
    char *text = test_slurp(out, NULL);
    const char *line = text ? strstr(text, "in sequence 2 (3000 tokens)") : NULL;
    const char *eol = line ? strchr(line, '\n') : NULL;
    printf("SIGTERM: exit %d after %llu ms; progress line: ...%.*s\n", rc,
           (unsigned long long)ms, line ? (int)(eol ? eol - line : 80) : 0, line ? line : "");
    CHECK_EQ_INT(rc, 143);
    CHECK(ms < 8000);
    /* the tokens done and an ETA by tokens, inside the sequence */
    CHECK(line && strstr(text, "eval 1/3 held-out sequences (200/6200 tokens), in sequence 2"));
    CHECK(line && strstr(line, "ETA ") != NULL);
    const char *partial = text ? strstr(text, "stopped after 1 of 3 sequences: tau ") : NULL;
    if (partial) printf("SIGTERM: %.*s\n", (int)strcspn(partial, "\n"), partial);
    CHECK(partial && strstr(partial, "over the 1 sequences done") &&
          strstr(partial, "(partial)") < strchr(partial, '\n'));
    if (check_failed) printf("eval's output:\n%s\n", text ? text : "(none)");
    free(text);

    /* SIGINT: the same with exit 130, and --json marks the object partial */
    rc = eval_until_signal(SIGINT, "--json", &ms);
    text = test_slurp(out, NULL);
    printf("SIGINT: exit %d after %llu ms\n", rc, (unsigned long long)ms);
    CHECK_EQ_INT(rc, 130);
    const char *json = text ? strstr(text, "{\"tau\": ") : NULL;
    if (json) printf("SIGINT --json: %.*s\n", (int)strcspn(json, "\n"), json);
    CHECK(json && strstr(json, "\"sequences\": 1, ") && strstr(json, "\"total\": 3, ") &&
          strstr(json, "\"partial\": true"));
    free(text);

    if (!check_failed) h_rmdir(dir);
    else printf("left %s for inspection\n", dir);
    CHECK_DONE();
}
