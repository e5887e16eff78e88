/* test_ctl_args: runs the dflash-ctl binary (../tools/dflash-ctl from the ctest working
 * directory, or $DFLASH_CTL_BIN) with bad `set` arguments against a runtime directory where no
 * broker listens: bad arguments are exit 1 (the documented "bad arguments"), never exit 2 (no
 * broker answering), so a healthcheck or retry loop does not take a typo for a broker that is
 * down; with --json every failure is one JSON object on stdout (bad arguments, an unknown verb
 * or an unusable endpoint included); an unknown verb's message lists every verb; release takes
 * a batch id as the logs print it, or none, within the wire's bounds; set's keys, values and
 * pairs are bounded by the wire's sizes, not cut. */
#include "check.h"
#include "test_files.h"
#include "wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[256], bin[512];

/* Runs dflash-ctl with args; returns its exit status; stdout/stderr go to dir/out, dir/err. */
static int run(const char *args) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s --runtime-dir %s --timeout-ms 100 %s >%s/out 2>%s/err", bin, dir,
             args, dir, dir);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int main(void) {
    const char *env = getenv("DFLASH_CTL_BIN");
    snprintf(bin, sizeof bin, "%s", env ? env : "../tools/dflash-ctl");
    CHECK(access(bin, X_OK) == 0);
    if (access(bin, X_OK) != 0) {
        fprintf(stderr, "dflash-ctl not found at %s (set DFLASH_CTL_BIN)\n", bin);
        CHECK_DONE();
    }
    snprintf(dir, sizeof dir, "/tmp/dflash-test-ctl-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    char outp[300], errp[300];
    snprintf(outp, sizeof outp, "%s/out", dir);
    snprintf(errp, sizeof errp, "%s/err", dir);

    /* no broker: a well-formed set times out (2); malformed ones are bad arguments (1) */
    CHECK_EQ_INT(run("set min_ready=3"), 2);
    CHECK_EQ_INT(run("set min_ready"), 1);
    char *err = test_slurp(errp, NULL);
    CHECK(strstr(err, "'min_ready' is not KEY=VALUE") != NULL);
    if (!strstr(err, "not KEY=VALUE")) fprintf(stderr, "stderr was:\n%s\n", err);
    free(err);
    CHECK_EQ_INT(run("set =5"), 1);
    CHECK_EQ_INT(run("set"), 1);
    /* a key of WIRE_MAX_KEY - 1 characters and a value of WIRE_MAX_VALUE - 1 fit the request;
     * one more does not (it was cut without a word), nor do more than WIRE_MAX_SETTINGS pairs */
    char big[1024], many[4096];
    snprintf(big, sizeof big, "set %0*d=1", WIRE_MAX_KEY - 1, 0);
    CHECK_EQ_INT(run(big), 2);
    snprintf(big, sizeof big, "set %0*d=1", WIRE_MAX_KEY, 0);
    CHECK_EQ_INT(run(big), 1);
    snprintf(big, sizeof big, "set k=%0*d", WIRE_MAX_VALUE - 1, 0);
    CHECK_EQ_INT(run(big), 2);
    snprintf(big, sizeof big, "set k=%0*d", WIRE_MAX_VALUE, 0);
    CHECK_EQ_INT(run(big), 1);
    size_t at = (size_t)snprintf(many, sizeof many, "set");
    for (int i = 0; i <= WIRE_MAX_SETTINGS && at < sizeof many; i++)
        at += (size_t)snprintf(many + at, sizeof many - at, " k%d=1", i);
    CHECK_EQ_INT(run(many), 1);
    err = test_slurp(errp, NULL);
    CHECK(strstr(err, "unexpected argument 'k32=1'") != NULL); /* the 33rd, named */
    free(err);

    /* --json: the failure is a JSON object on stdout too */
    CHECK_EQ_INT(run("--json set min_ready"), 1);
    char *out = test_slurp(outp, NULL);
    CHECK(strstr(out, "{\"ok\":false,\"verb\":\"set\",\"error\":\"INVAL\"") == out);
    if (strstr(out, "{\"ok\":false") != out) fprintf(stderr, "stdout was:\n%s\n", out);
    free(out);

    /* an unknown verb is exit 1 and the message lists every verb, keygen included */
    CHECK_EQ_INT(run("bogus"), 1);
    err = test_slurp(errp, NULL);
    CHECK(strstr(err, "unknown verb 'bogus' (status, watch, set, pause, resume, drain, release, "
                      "ping, peer, keygen)") != NULL);
    if (!strstr(err, "keygen")) fprintf(stderr, "stderr was:\n%s\n", err);
    free(err);

    /* release: a batch id as the logs print it (the broker's E/B/I, the drafter's (E, B, I)) or
     * 'all' asks the broker (no broker: 2); anything else is a bad argument (1), none too (a
     * forgotten id must not release every quarantined batch), and so is a malformed id */
    CHECK_EQ_INT(run("release 0/0/21"), 2);
    CHECK_EQ_INT(run("release '(0, 1, 21)'"), 2);
    CHECK_EQ_INT(run("release '(0,1,21)'"), 2);
    CHECK_EQ_INT(run("release all"), 2);
    CHECK_EQ_INT(run("release"), 1);
    CHECK_EQ_INT(run("release 0//0/21"), 1);
    CHECK_EQ_INT(run("release '0 0 21'"), 1);
    CHECK_EQ_INT(run("release '(0/0/21)'"), 1);
    CHECK_EQ_INT(run("release 0/0/21/"), 1);
    CHECK_EQ_INT(run("release 0/0"), 1);
    err = test_slurp(errp, NULL);
    CHECK(strstr(err, "'0/0' is not a batch id: give EPOCH/BUCKET/INDEX") != NULL);
    free(err);
    CHECK_EQ_INT(run("release 0/0/-1"), 1);
    CHECK_EQ_INT(run("release 0/99/1"), 1); /* no such bucket */
    /* the bounds, each side: buckets below WIRE_MAX_BUCKETS, epochs and indexes 32-bit */
    char arg[256];
    snprintf(arg, sizeof arg, "release 0/%d/1", WIRE_MAX_BUCKETS - 1);
    CHECK_EQ_INT(run(arg), 2);
    snprintf(arg, sizeof arg, "release 0/%d/1", WIRE_MAX_BUCKETS);
    CHECK_EQ_INT(run(arg), 1);
    CHECK_EQ_INT(run("release 4294967295/0/4294967295"), 2);
    CHECK_EQ_INT(run("release 4294967296/0/1"), 1);
    CHECK_EQ_INT(run("release 0/0/4294967296"), 1);
    CHECK_EQ_INT(run("release 0/0/+1"), 1); /* digits only: no sign, no blank */
    CHECK_EQ_INT(run("release '0/ 0/1'"), 1);
    CHECK_EQ_INT(run("release 0/0/1 0/0/2"), 1);

    /* --json: every refused invocation a script can make prints its JSON failure (an unknown
     * verb, arguments to a verb that takes none, an endpoint that cannot be used printed
     * nothing on stdout, so `dflash-ctl --json ... | jq` read an empty document) */
    static const char *const refused[][2] = {
        {"--json bogus", "{\"ok\":false,\"verb\":\"bogus\",\"error\":\"INVAL\""},
        {"--json pause now", "{\"ok\":false,\"verb\":\"pause\",\"error\":\"INVAL\""},
        {"--json --endpoint nope://x status",
         "{\"ok\":false,\"verb\":\"status\",\"error\":\"INVAL\""},
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        CHECK_EQ_INT(run(refused[i][0]), 1);
        out = test_slurp(outp, NULL);
        CHECK(strstr(out, refused[i][1]) == out);
        if (strstr(out, refused[i][1]) != out)
            fprintf(stderr, "%s: stdout was:\n%s\n", refused[i][0], out);
        free(out);
    }

    test_rmtree(dir);
    CHECK_DONE();
}
