/* test_data_tool: runs the dflash-data binary (../tools/dflash-data from the ctest working
 * directory, or $DFLASH_DATA_BIN) on a JSONL file with good and bad lines: bad lines are reported
 * with their line number and reason and skipped, good ones land in the shard exactly, the
 * histogram counts each bucket, --strict stops with no output, --model supplies the vocabulary,
 * a line holding more than one object (files joined without a newline) is bad, not cut short,
 * SIGTERM leaves no temporary file, one a SIGKILLed run left is removed by the next run on
 * that --out (only a gone pid's), an --out that is no regular file is left alone, and a run
 * that keeps no line fails (exit 3) instead of writing an empty shard, and a failed write says
 * why (the errno, e.g. a full disk); reading a large input (40 MB) on a terminal shows a
 * progress line (it was silent until the histogram); an --out that is the input file is refused
 * (the shard replaced it); sequences with no anchor to train on (all-zero or alternating masks,
 * one token) are left out of the shard, counted with their token share and warned about, and
 * data with no anchor at all is refused (exit 3, nothing written), named for what it lacks (no
 * trainable token, or no two in a row); a loss_mask of JSON booleans is kept value for value
 * (false stays 0); an over-long line is skipped unparsed and
 * a JSON array input refused at its first byte; an id past int32, a negative id and a
 * duplicated key each get their own message and a whitespace-only line is blank; a shard whose
 * every sequence is longer than the last of --buckets is written with a WARN that a target with
 * those buckets refuses it. */
#include "check.h"
#include "hf_config.h"
#include "shard.h"
#include "test_files.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[256], bin[512];

/* Runs the tool with args; returns its exit status; stdout/stderr go to dir/out, dir/err. */
static int run(const char *args) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s >%s/out 2>%s/err", bin, args, dir, dir);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A JSON line of n tokens: ids start, start+1, ... (mod 1000), mask 0 on the first half (the
 * prompt), 1 on the rest (the reply). */
static void put_seq(FILE *fp, int n, int start) {
    fprintf(fp, "{\"input_ids\": [");
    for (int i = 0; i < n; i++)
        fprintf(fp, "%s%d", i ? "," : "", (start + i) % 1000);
    fprintf(fp, "], \"loss_mask\": [");
    for (int i = 0; i < n; i++)
        fprintf(fp, "%s%d", i ? "," : "", i >= n / 2);
    fprintf(fp, "]}\n");
}

/* dflash-data --in - --out shard, its stdin the write end returned in *feed (stderr to
 * /dev/null), fed one line; returns its pid once it has begun its temporary shard, whose path
 * goes to tmp (len bytes). */
static pid_t start_mid_conversion(const char *shard, const char *line, int *feed, char *tmp,
                                  size_t len) {
    int in_pipe[2];
    CHECK(pipe(in_pipe) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(in_pipe[0], 0);
        close(in_pipe[0]);
        close(in_pipe[1]);
        if (!freopen("/dev/null", "w", stderr)) _exit(126);
        execl(bin, bin, "--in", "-", "--out", shard, (char *)NULL);
        _exit(127);
    }
    close(in_pipe[0]);
    *feed = in_pipe[1];
    CHECK(write(in_pipe[1], line, strlen(line)) == (ssize_t)strlen(line));
    snprintf(tmp, len, "%s.tmp.%d", shard, (int)pid);
    for (int i = 0; i < 10000 && access(tmp, F_OK) != 0; i++) /* until the writer has begun */
        usleep(1000);
    CHECK(access(tmp, F_OK) == 0);
    return pid;
}

int main(void) {
    const char *env = getenv("DFLASH_DATA_BIN");
    snprintf(bin, sizeof bin, "%s", env ? env : "../tools/dflash-data");
    CHECK(access(bin, X_OK) == 0);
    if (access(bin, X_OK) != 0) {
        fprintf(stderr, "dflash-data not found at %s (set DFLASH_DATA_BIN)\n", bin);
        CHECK_DONE();
    }
    snprintf(dir, sizeof dir, "/tmp/dflash-test-data-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    char jsonl[400], shardp[400], args[1600];
    snprintf(jsonl, sizeof jsonl, "%s/in.jsonl", dir);
    snprintf(shardp, sizeof shardp, "%s/out.shard", dir);
    FILE *fp = fopen(jsonl, "w");
    put_seq(fp, 3, 10);                                               /* 1: ok */
    fprintf(fp, "{\"input_ids\": [1,2,3], \"loss_mask\": [0,1,1]\n"); /* 2: not JSON */
    fprintf(fp, "\n");                                                /* 3: blank */
    fprintf(fp, "{\"input_ids\": [5,1000], \"loss_mask\": [1,1]}\n"); /* 4: out of vocab */
    fprintf(fp, "{\"input_ids\": [5,6,7], \"loss_mask\": [1,1]}\n");  /* 5: mismatch */
    put_seq(fp, 2500, 0);                                             /* 6: too long */
    put_seq(fp, 600, 100);                                            /* 7: ok */
    fprintf(fp, "{\"input_ids\": [5,6], \"loss_mask\": [1,2]}\n");    /* 8: bad mask */
    fprintf(fp, "{\"input_ids\": [5,6.5], \"loss_mask\": [1,1]}\n");  /* 9: not integer */
    put_seq(fp, 1500, 7);                                             /* 10: ok */
    fprintf(fp, "{\"loss_mask\": [1]}\n");                            /* 11: no input_ids */
    fclose(fp);

    snprintf(args, sizeof args,
             "--in %s --out %s --vocab 1000 --max-len 2000 --buckets 512,1024,2048", jsonl, shardp);
    CHECK_EQ_INT(run(args), 0);
    char errp[300], outp[300];
    snprintf(errp, sizeof errp, "%s/err", dir);
    snprintf(outp, sizeof outp, "%s/out", dir);
    char *err = test_slurp(errp, NULL), *out = test_slurp(outp, NULL);
    char want[600];
    const char *expect[] = {":2: not a JSON object",
                            ":4: token id 1000 at position 1 is outside the vocabulary of 1000",
                            ":5: length mismatch: 3 input_ids but 2 loss_mask entries",
                            ":8: loss_mask[1] is not 0 or 1",
                            ":9: input_ids[1] is not an integer",
                            ":11: input_ids missing"};
    for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++) {
        snprintf(want, sizeof want, "%s%s", jsonl, expect[i]);
        CHECK(strstr(err, want) != NULL);
        if (!strstr(err, want)) fprintf(stderr, "  missing '%s' in:\n%s\n", want, err);
    }
    CHECK(strstr(err, ":1:") == NULL && strstr(err, ":3:") == NULL && strstr(err, ":7:") == NULL);
    /* line 6, valid but longer than --max-len, is no bad line: it is counted apart, with its
     * share of the tokens (2500 of 2500 + 2103 = 54.3%); it was one of "7 bad lines", and the
     * data lost was nowhere */
    CHECK(strstr(err, ":6:") == NULL);
    CHECK(strstr(err, "6 of 10 lines skipped as bad") != NULL);
    CHECK(strstr(err, "1 sequences longer than --max-len 2000 left out (2500 tokens, 54.3% of all "
                      "tokens; the first, line 6): raise --max-len") != NULL);
    if (!strstr(err, "54.3%")) fprintf(stderr, "stderr was:\n%s\n", err);
    CHECK(strstr(out, "3 sequences, 2103 tokens, 1 longer than --max-len 2000 left out (54.3% of "
                      "all tokens), 0 without an anchor left out (0.0% of all tokens), 6 bad lines "
                      "skipped") != NULL);
    /* histogram rows: bucket, seqs, share, tokens, share */
    CHECK(strstr(out, "<=512                 1    33.3%            3     0.1%") != NULL);
    CHECK(strstr(out, "<=1024                1    33.3%          600    28.5%") != NULL);
    CHECK(strstr(out, "<=2048                1    33.3%         1500    71.3%") != NULL);
    if (!strstr(out, "<=2048                1")) fprintf(stderr, "stdout was:\n%s\n", out);
    free(err);
    free(out);

    char e[512];
    shard *s = shard_open(shardp, e, sizeof e);
    CHECK(s != NULL);
    if (s) {
        CHECK_EQ_INT(shard_count(s), 3);
        CHECK_EQ_INT(shard_vocab(s), 1000);
        shard_seq q;
        CHECK_EQ_INT(shard_get(s, 1, &q), 0);
        CHECK_EQ_INT(q.len, 600);
        CHECK(q.ids[0] == 100 && q.ids[599] == 699 && q.mask[0] == 0 && q.mask[599] == 1);
        CHECK_EQ_INT(shard_get(s, 2, &q), 0);
        CHECK(q.len == 1500 && q.ids[1499] == (7 + 1499) % 1000);
        shard_close(&s);
    }

    /* --strict: the first bad line stops it and nothing is written */
    unlink(shardp);
    snprintf(args, sizeof args, "--in %s --out %s --vocab 1000 --strict", jsonl, shardp);
    CHECK_EQ_INT(run(args), 1);
    err = test_slurp(errp, NULL);
    snprintf(want, sizeof want, "%s:2: not a JSON object", jsonl);
    CHECK(strstr(err, want) != NULL);
    free(err);
    CHECK(access(shardp, F_OK) != 0);

    /* --model: vocabulary from config.json (500): line 7's ids 100..699 are now out of range */
    model_config mc;
    hf_config_defaults(&mc, MODEL_QWEN3);
    mc.vocab_size = 500;
    mc.hidden_size = 8;
    mc.intermediate_size = 8;
    mc.num_layers = 1;
    mc.num_heads = 2;
    mc.num_kv_heads = 1;
    mc.head_dim = 4;
    CHECK_EQ_INT(hf_config_write(dir, &mc, NULL), 0);
    snprintf(args, sizeof args, "--in %s --out %s --model %s --max-len 2000", jsonl, shardp, dir);
    CHECK_EQ_INT(run(args), 0);
    err = test_slurp(errp, NULL);
    snprintf(want, sizeof want, "%s:7: token id 500 at position 400", jsonl);
    CHECK(strstr(err, want) != NULL);
    free(err);
    s = shard_open(shardp, e, sizeof e);
    CHECK(s != NULL && shard_count(s) == 1 && shard_vocab(s) == 500);
    shard_close(&s);

    /* two files joined when the first lacks its final newline: the line holds two objects. The
     * second used to be dropped without a word (and the first kept), --strict or not. */
    fp = fopen(jsonl, "w");
    fprintf(fp,
            "{\"input_ids\": [1], \"loss_mask\": [1]}{\"input_ids\": [2], \"loss_mask\": [1]}\n");
    fprintf(fp, "{\"input_ids\": [3], \"loss_mask\": [1]} junk\n");
    fprintf(fp, "{\"input_ids\": [4,5], \"loss_mask\": [1,1]} \t\r\n");
    fclose(fp);
    snprintf(args, sizeof args, "--in %s --out %s --vocab 1000", jsonl, shardp);
    CHECK_EQ_INT(run(args), 0);
    err = test_slurp(errp, NULL);
    snprintf(want, sizeof want, "%s:1: text after the JSON object at column 37", jsonl);
    CHECK(strstr(err, want) != NULL);
    snprintf(want, sizeof want, "%s:2: text after the JSON object", jsonl);
    CHECK(strstr(err, want) != NULL);
    CHECK(strstr(err, ":3:") == NULL);
    if (!strstr(err, want)) fprintf(stderr, "stderr was:\n%s\n", err);
    free(err);
    s = shard_open(shardp, e, sizeof e);
    CHECK(s != NULL && shard_count(s) == 1);
    shard_close(&s);
    unlink(shardp);
    snprintf(args, sizeof args, "--in %s --out %s --vocab 1000 --strict", jsonl, shardp);
    CHECK_EQ_INT(run(args), 1);
    CHECK(access(shardp, F_OK) != 0);

    /* SIGTERM (or ^C) mid-conversion: exit 1 and no temporary shard left behind. It used to die
     * of the signal and leave OUT.tmp.PID, as big as what it had converted, for good. The tool
     * reads stdin, which the test holds open, so it is waiting for a line when the signal comes. */
    const char *line = "{\"input_ids\": [1, 2], \"loss_mask\": [0, 1]}\n";
    char tmp[450];
    int feed = -1;
    pid_t pid = start_mid_conversion(shardp, line, &feed, tmp, sizeof tmp);
    kill(pid, SIGTERM);
    close(feed); /* EOF, should the signal land just before a read */
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1);
    CHECK(access(tmp, F_OK) != 0);
    CHECK(access(shardp, F_OK) != 0);
    unlink(tmp);

    /* SIGKILL mid-conversion leaves OUT.tmp.PID (nothing can remove it then); the next run on
     * the same --out removes it, saying so, as it removes any OUT.tmp.PID of a pid that is gone.
     * One of a live process (this one's pid), of another --out, or not named by a pid, stays. */
    pid = start_mid_conversion(shardp, line, &feed, tmp, sizeof tmp);
    kill(pid, SIGKILL);
    CHECK(waitpid(pid, &st, 0) == pid);
    close(feed);
    CHECK(access(tmp, F_OK) == 0); /* left behind */
    char alive[450], other[450], odd[450], locked[450];
    snprintf(alive, sizeof alive, "%s.tmp.%d", shardp, (int)getpid());
    snprintf(other, sizeof other, "%s/other.shard.tmp.%d", dir, (int)pid);
    snprintf(odd, sizeof odd, "%s.tmp.12x", shardp);
    /* a pid gone here but the file locked: a writer in another container on a shared volume */
    snprintf(locked, sizeof locked, "%s.tmp.%d", shardp, (int)pid + 1000000);
    const char *keep[] = {alive, other, odd, locked};
    int lock_fd = -1;
    for (int i = 0; i < 4; i++) {
        FILE *k = fopen(keep[i], "w");
        CHECK(k != NULL);
        if (k) fclose(k);
    }
    lock_fd = open(locked, O_RDONLY);
    CHECK(lock_fd >= 0 && flock(lock_fd, LOCK_EX) == 0);
    snprintf(args, sizeof args, "--in %s --out %s --vocab 1000", jsonl, shardp);
    CHECK_EQ_INT(run(args), 0);
    CHECK(access(tmp, F_OK) != 0);
    char *err_text = test_slurp(errp, NULL);
    char said[480];
    snprintf(said, sizeof said, "removed %s (", tmp);
    CHECK(err_text && strstr(err_text, said) && strstr(err_text, "which is gone"));
    if (err_text && !strstr(err_text, said)) printf("stderr: %s\n", err_text);
    free(err_text);
    for (int i = 0; i < 4; i++) {
        CHECK(access(keep[i], F_OK) == 0);
        unlink(keep[i]);
    }
    if (lock_fd >= 0) close(lock_fd);
    unlink(shardp);

    /* --out that is no regular file (a FIFO here; /dev/null for a dry run as root) is refused
     * and left alone: the finished shard used to be renamed over it */
    char fifo[420];
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    CHECK(mkfifo(fifo, 0600) == 0);
    snprintf(args, sizeof args, "--in %s --out %s --vocab 1000", jsonl, fifo);
    CHECK_EQ_INT(run(args), 2);
    struct stat fst;
    CHECK(stat(fifo, &fst) == 0 && S_ISFIFO(fst.st_mode));
    unlink(fifo);

    /* no line kept (every line bad, here too long for --max-len; or an empty input): exit 3
     * with the reason and no shard. It used to write an empty shard and exit 0, and the run
     * failed later in the target with "batch plan: 0 sequences". */
    fp = fopen(jsonl, "w");
    put_seq(fp, 40, 0);
    fprintf(fp, "\n");
    put_seq(fp, 50, 0);
    fclose(fp);
    unlink(shardp);
    snprintf(args, sizeof args, "--in %s --out %s --vocab 1000 --max-len 32", jsonl, shardp);
    CHECK_EQ_INT(run(args), 3);
    err = test_slurp(errp, NULL);
    snprintf(want, sizeof want,
             "no line kept: of the 2 lines of %s, 0 are bad and 2 longer than --max-len 32 (the "
             "first, line 1: too long: 40 tokens, --max-len is 32); nothing written",
             jsonl);
    CHECK(strstr(err, want) != NULL);
    if (!strstr(err, want)) fprintf(stderr, "stderr was:\n%s\n", err);
    free(err);
    CHECK(access(shardp, F_OK) != 0);
    fp = fopen(jsonl, "w");
    fprintf(fp, "\n");
    fclose(fp);
    snprintf(args, sizeof args, "--in %s --out %s --vocab 1000", jsonl, shardp);
    CHECK_EQ_INT(run(args), 3);
    err = test_slurp(errp, NULL);
    CHECK(strstr(err, "holds no JSONL line; nothing written") != NULL);
    free(err);
    CHECK(access(shardp, F_OK) != 0);

    /* a write that fails (here past the file size limit; a full disk alike) is reported with
     * the system's reason ("File too large", "No space left on device"); it used to be
     * "input/output error" for all. Once while adding (2 MB of sequences), once while
     * committing (under 4 KiB, still in the stdio buffer until the final flush). */
    for (int big = 1; big >= 0; big--) {
        fp = fopen(jsonl, "w");
        for (int i = 0; i < (big ? 400 : 30); i++)
            put_seq(fp, big ? 1000 : 10, i);
        fclose(fp);
        char cmd[2048];
        snprintf(cmd, sizeof cmd,
                 "trap '' XFSZ; ulimit -f 1 && %s --in %s --out %s --vocab 1000 >%s/out 2>%s/err",
                 bin, jsonl, shardp, dir, dir);
        int st = system(cmd);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1);
        err = test_slurp(errp, NULL);
        snprintf(want, sizeof want, "cannot write %s: %s", shardp, strerror(EFBIG));
        CHECK(strstr(err, want) != NULL);
        if (!strstr(err, want)) fprintf(stderr, "stderr was:\n%s\n", err);
        free(err);
        CHECK(access(shardp, F_OK) != 0);
    }

    /* progress while reading: on a terminal (`script`'s) a line every 0.2 s */
    if (system("command -v script >/dev/null") == 0) {
        fp = fopen(jsonl, "w");
        for (int i = 0; i < 7000; i++)
            put_seq(fp, 1000, i);
        fclose(fp);
        char cmd[2048];
        snprintf(cmd, sizeof cmd,
                 "script -qec '%s --in %s --out %s --vocab 1000' /dev/null >%s/out 2>&1", bin,
                 jsonl, shardp, dir);
        int st = system(cmd);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        snprintf(want, sizeof want, "%s/out", dir);
        char *out = test_slurp(want, NULL), *line = strstr(out, "\rdata: ");
        if (line) printf("progress: %.60s\n", line + 1);
        CHECK(line && strstr(line, "lines read"));
        free(out);
        unlink(shardp);
    } else {
        printf("progress: not checked (no `script` for a terminal)\n");
    }

    /* sequences the drafter trains nothing on (anchors need loss_mask[p] and loss_mask[p+1]):
     * left out of the shard (the target ran its forward over them every epoch for nothing),
     * counted with their share of the tokens in a WARN and the summary. All-zero masks were
     * warned about and written, alternating masks and single tokens written in silence */
    fp = fopen(jsonl, "w");
    fprintf(fp, "{\"input_ids\": [1,2,3,4], \"loss_mask\": [0,1,1,0]}\n"); /* trains */
    fprintf(fp, "{\"input_ids\": [1,2,3,4], \"loss_mask\": [0,0,0,0]}\n"); /* no loss */
    fprintf(fp, "{\"input_ids\": [1,2,3,4], \"loss_mask\": [0,1,0,1]}\n"); /* no anchor */
    fprintf(fp, "{\"input_ids\": [7], \"loss_mask\": [1]}\n");             /* no anchor */
    fprintf(fp, "{\"input_ids\": [5,6,7,8,9], \"loss_mask\": [1,1,0,0,0]}\n"); /* trains */
    fclose(fp);
    unlink(shardp);
    snprintf(args, sizeof args, "--in %s --out %s --vocab 1000", jsonl, shardp);
    CHECK_EQ_INT(run(args), 0);
    err = test_slurp(errp, NULL);
    out = test_slurp(outp, NULL);
    CHECK(strstr(err, "3 sequences without an anchor left out (9 tokens, 50.0% of all tokens; the "
                      "first, line 2): 1 with loss_mask all 0, 2 whose loss tokens never come two "
                      "in a row") != NULL);
    CHECK(strstr(out, "2 sequences, 9 tokens, 0 longer than --max-len 3072 left out (0.0% of all "
                      "tokens), 3 without an anchor left out (50.0% of all tokens), 0 bad lines "
                      "skipped") != NULL);
    CHECK(strstr(out, "<=512                 2   100.0%            9   100.0%") != NULL);
    if (!strstr(err, "without an anchor")) fprintf(stderr, "stderr was:\n%s\n", err);
    if (!strstr(out, "2 sequences")) fprintf(stderr, "stdout was:\n%s\n", out);
    CHECK(strstr(err, "longer than the last of --buckets") == NULL);
    free(err);
    free(out);
    s = shard_open(shardp, e, sizeof e);
    CHECK(s != NULL && shard_count(s) == 2);
    if (s) {
        shard_seq q;
        CHECK(shard_get(s, 0, &q) == 0 && q.len == 4 && q.mask[1] == 1 && q.mask[2] == 1);
        CHECK(shard_get(s, 1, &q) == 0 && q.len == 5 && q.ids[0] == 5);
        shard_close(&s);
    }
    /* a loss_mask of JSON booleans (as some exporters write it) is taken value for value:
     * false is a prompt token, not trained on */
    fp = fopen(jsonl, "w");
    fprintf(fp, "{\"input_ids\": [1,2,3,4,5], \"loss_mask\": [false,true,true,false,0]}\n");
    fclose(fp);
    unlink(shardp);
    snprintf(args, sizeof args, "--in %s --out %s --vocab 1000", jsonl, shardp);
    CHECK_EQ_INT(run(args), 0);
    s = shard_open(shardp, e, sizeof e);
    CHECK(s != NULL && shard_count(s) == 1);
    if (s) {
        shard_seq q;
        const uint8_t want_mask[5] = {0, 1, 1, 0, 0};
        CHECK(shard_get(s, 0, &q) == 0 && q.len == 5 && memcmp(q.mask, want_mask, 5) == 0);
        shard_close(&s);
    }
    /* every sequence written (each has an anchor) longer than the last bucket: written, with a
     * WARN that a target with these --buckets leaves them all out and refuses the shard. It was
     * said only by the histogram's ">32" row, and the target started on such data */
    fp = fopen(jsonl, "w");
    put_seq(fp, 50, 0);
    fprintf(fp, "{\"input_ids\": [1,2,3,4], \"loss_mask\": [0,1,0,1]}\n"); /* no anchor */
    put_seq(fp, 40, 0);
    fclose(fp);
    unlink(shardp);
    snprintf(args, sizeof args, "--in %s --out %s --vocab 1000 --buckets 16,32", jsonl, shardp);
    CHECK_EQ_INT(run(args), 0);
    err = test_slurp(errp, NULL);
    CHECK(strstr(err, "every one of the 2 sequences written is longer than the last of --buckets, "
                      "32 tokens (40 to 50 tokens): a target with these buckets leaves them all "
                      "out and refuses the shard. Give the target's --buckets a last bound of at "
                      "least 40") != NULL);
    if (!strstr(err, "every one of")) fprintf(stderr, "stderr was:\n%s\n", err);
    free(err);
    /* one of them within the last bucket: no such WARN */
    snprintf(args, sizeof args, "--in %s --out %s --vocab 1000 --buckets 16,40", jsonl, shardp);
    CHECK_EQ_INT(run(args), 0);
    err = test_slurp(errp, NULL);
    CHECK(strstr(err, "longer than the last of --buckets") == NULL);
    free(err);
    snprintf(args, sizeof args, "--in %s --out %s --vocab 1000", jsonl, shardp);
    /* every valid mask all 0 (and a bad line): nothing to train on at all is refused (exit 3,
     * no shard), naming the cause and chat_to_jsonl. It was a warning and exit 0, and the
     * target then read the data for every epoch before the drafter failed */
    fp = fopen(jsonl, "w");
    fprintf(fp, "{\"input_ids\": [1,2,3,4], \"loss_mask\": [0,0,0,0]}\n");
    fprintf(fp, "{\"input_ids\": [5,6], \"loss_mask\": [1,2]}\n");
    fprintf(fp, "{\"input_ids\": [7,8,9], \"loss_mask\": [0,0,0]}\n");
    fclose(fp);
    unlink(shardp);
    CHECK_EQ_INT(run(args), 3);
    CHECK(access(shardp, F_OK) != 0);
    err = test_slurp(errp, NULL);
    CHECK(strstr(err, "no trainable token: every loss_mask is 0 (all 2 lines of") != NULL);
    CHECK(strstr(err, "scripts/chat_to_jsonl.py") != NULL);
    if (!strstr(err, "no trainable token")) fprintf(stderr, "stderr was:\n%s\n", err);
    free(err);
    /* loss tokens, but never two in a row (and a line over --max-len that would have trained):
     * no anchor anywhere is refused too (exit 3, no shard), saying what the masks lack. It
     * passed with a warning, and the drafter failed at the end ("no step trained", exit 8),
     * after the target had read the data for every epoch */
    fp = fopen(jsonl, "w");
    fprintf(fp, "{\"input_ids\": [1,2,3,4], \"loss_mask\": [0,1,0,1]}\n");
    fprintf(fp, "{\"input_ids\": [7], \"loss_mask\": [1]}\n");
    fprintf(fp, "{\"input_ids\": [7,8,9], \"loss_mask\": [0,0,0]}\n");
    put_seq(fp, 40, 0);
    fclose(fp);
    unlink(shardp);
    snprintf(args, sizeof args, "--in %s --out %s --vocab 1000 --max-len 32", jsonl, shardp);
    CHECK_EQ_INT(run(args), 3);
    CHECK(access(shardp, F_OK) != 0);
    err = test_slurp(errp, NULL);
    snprintf(want, sizeof want,
             "no anchor: in none of the 3 lines of %s that could be kept (valid, within --max-len) "
             "do two loss tokens come in a row (1 with loss_mask all 0, 2 whose loss tokens are "
             "never adjacent",
             jsonl);
    CHECK(strstr(err, want) != NULL);
    CHECK(strstr(err, "at least two in a row") != NULL);
    CHECK(strstr(err, "scripts/chat_to_jsonl.py") != NULL);
    if (!strstr(err, "no anchor:")) fprintf(stderr, "stderr was:\n%s\n", err);
    free(err);

    /* messages that said the wrong thing: an id past int32 "is not an integer", a negative one
     * without --vocab "outside the vocabulary of 0", a tab-only line "not a JSON object"
     * (blank lines are ignored); a duplicated key was read as its first value (Python's json
     * takes the last) and is now a bad line */
    fp = fopen(jsonl, "w");
    fprintf(fp, "{\"input_ids\": [1,3000000000], \"loss_mask\": [1,1]}\n");
    fprintf(fp, "{\"input_ids\": [1,-2], \"loss_mask\": [1,1]}\n");
    fprintf(fp, "\t \r\n");
    fprintf(fp, "{\"input_ids\": [1,2], \"loss_mask\": [1,1], \"input_ids\": [7,8]}\n");
    fprintf(fp, "{\"loss_mask\": [1,1], \"input_ids\": [1,2], \"loss_mask\": [0,0]}\n");
    fprintf(fp, "{\"input_ids\": [4,5], \"loss_mask\": [1,1]}\n");
    fclose(fp);
    unlink(shardp);
    snprintf(args, sizeof args, "--in %s --out %s", jsonl, shardp);
    CHECK_EQ_INT(run(args), 0);
    err = test_slurp(errp, NULL);
    const char *msgs[] = {":1: input_ids[1] = 3000000000 is outside the int32 range",
                          ":2: token id -2 at position 1 is negative",
                          ":4: duplicate key \"input_ids\" (JSON readers differ",
                          ":5: duplicate key \"loss_mask\" (JSON readers differ"};
    for (size_t i = 0; i < sizeof msgs / sizeof msgs[0]; i++) {
        snprintf(want, sizeof want, "%s%s", jsonl, msgs[i]);
        CHECK(strstr(err, want) != NULL);
        if (!strstr(err, want)) fprintf(stderr, "  missing '%s' in:\n%s\n", want, err);
    }
    CHECK(strstr(err, ":3:") == NULL && strstr(err, ":6:") == NULL);
    CHECK(strstr(err, "4 of 5 lines skipped") != NULL);
    free(err);

    /* a line longer than any --max-len record can be is skipped unparsed (cJSON holds ~28 times
     * its size; it used to parse it whole), and a JSON array (a .json file given for JSONL) is
     * refused at its first byte, exit 3 (a 64 MB one took 1.8 GB, then was rejected) */
    fp = fopen(jsonl, "w");
    fprintf(fp, "{\"x\": [");
    for (int i = 0; i < (5 << 20) / 2; i++)
        fputs("1,", fp);
    fprintf(fp, "1]}\n");
    fprintf(fp, "{\"input_ids\": [4,5], \"loss_mask\": [1,1]}\n");
    fclose(fp);
    unlink(shardp);
    snprintf(args, sizeof args, "--in %s --out %s --vocab 1000 --max-len 4", jsonl, shardp);
    CHECK_EQ_INT(run(args), 0);
    err = test_slurp(errp, NULL);
    snprintf(want, sizeof want,
             "%s:1: line too long: 5242890 bytes, more than a record of --max-len 4 tokens takes "
             "(4194560); not parsed",
             jsonl);
    CHECK(strstr(err, want) != NULL);
    if (!strstr(err, want)) fprintf(stderr, "  missing '%s' in:\n%s\n", want, err);
    free(err);
    fp = fopen(jsonl, "w");
    fprintf(fp, " \n [{\"input_ids\": [1,2], \"loss_mask\": [1,1]},\n");
    fprintf(fp, "{\"input_ids\": [3,4], \"loss_mask\": [1,1]}]\n");
    fclose(fp);
    unlink(shardp);
    snprintf(args, sizeof args, "--in %s --out %s", jsonl, shardp);
    CHECK_EQ_INT(run(args), 3);
    err = test_slurp(errp, NULL);
    CHECK(strstr(err, "is a JSON array; dflash-data reads JSONL, one object per line") != NULL);
    if (!strstr(err, "is a JSON array")) fprintf(stderr, "stderr was:\n%s\n", err);
    free(err);
    CHECK(access(shardp, F_OK) != 0);
    /* the same after a UTF-8 byte-order mark (each line was refused instead, exit 3 all the
     * same, without the hint) */
    fp = fopen(jsonl, "w");
    fprintf(fp, "\xef\xbb\xbf[{\"input_ids\": [1,2], \"loss_mask\": [1,1]},\n");
    fprintf(fp, "{\"input_ids\": [3,4], \"loss_mask\": [1,1]}]\n");
    fclose(fp);
    CHECK_EQ_INT(run(args), 3);
    err = test_slurp(errp, NULL);
    CHECK(strstr(err, "is a JSON array; dflash-data reads JSONL, one object per line") != NULL);
    free(err);
    CHECK(access(shardp, F_OK) != 0);
    /* a BOM before JSONL is read past: both lines kept */
    fp = fopen(jsonl, "w");
    fprintf(fp, "\xef\xbb\xbf{\"input_ids\": [1,2], \"loss_mask\": [1,1]}\n");
    fprintf(fp, "{\"input_ids\": [3,4], \"loss_mask\": [1,1]}\n");
    fclose(fp);
    CHECK_EQ_INT(run(args), 0);
    out = test_slurp(outp, NULL);
    CHECK(out && strstr(out, ": 2 sequences") != NULL);
    free(out);
    unlink(shardp);
    /* a directory as --in: said (it was "read error" without a reason, exit 1) */
    snprintf(args, sizeof args, "--in %s --out %s", dir, shardp);
    CHECK_EQ_INT(run(args), 2);
    err = test_slurp(errp, NULL);
    CHECK(strstr(err, "is a directory") != NULL);
    free(err);
    CHECK(access(shardp, F_OK) != 0);

    /* --out naming the input (as ./in.jsonl, or stdin redirected from it) is refused (exit 2)
     * and the JSONL left as it was: the shard used to be renamed over it, exit 0 */
    fp = fopen(jsonl, "w");
    put_seq(fp, 5, 1);
    fclose(fp);
    size_t jsonl_len = 0, now_len = 0;
    char *before = test_slurp(jsonl, &jsonl_len);
    char same[420];
    snprintf(same, sizeof same, "%s/./in.jsonl", dir);
    snprintf(args, sizeof args, "--in %s --out %s --vocab 1000", jsonl, same);
    CHECK_EQ_INT(run(args), 2);
    err = test_slurp(errp, NULL);
    CHECK(strstr(err, "is the input file") != NULL);
    if (!strstr(err, "is the input file")) fprintf(stderr, "stderr was:\n%s\n", err);
    free(err);
    snprintf(args, sizeof args, "--in - --out %s --vocab 1000 <%s", jsonl, jsonl);
    CHECK_EQ_INT(run(args), 2);
    char *after = test_slurp(jsonl, &now_len);
    CHECK(before && after && now_len == jsonl_len && memcmp(before, after, jsonl_len) == 0);
    free(before);
    free(after);

    /* bad usage */
    CHECK_EQ_INT(run("--in x.jsonl"), 2);
    snprintf(args, sizeof args, "--in %s --out %s --buckets 512,100", jsonl, shardp);
    CHECK_EQ_INT(run(args), 2);
    /* more buckets than the daemons take: the message names the maximum */
    snprintf(args, sizeof args,
             "--in %s --out %s --buckets 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17", jsonl, shardp);
    CHECK_EQ_INT(run(args), 2);
    err = test_slurp(errp, NULL);
    CHECK(strstr(err, "too many buckets: at most 16") != NULL);
    free(err);

    test_rmtree(dir);
    CHECK_DONE();
}
