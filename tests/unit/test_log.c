/* test_log: log_init_named, the --log-level option's parser: every name sets its level, a bad
 * name is refused with DFLASH_EINVAL and leaves the level as it was; a message is one line,
 * whatever it relays (defect: a peer's name "x\nZ dflash-queue INFO forged" forged a second line
 * in the broker's log); log_printable's cases. */
#include "check.h"
#include "err.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A message relaying a name with a newline, a carriage return and a terminal escape is written
 * as one line, the control characters as '?'. */
static void test_one_line(void) {
    char path[] = "/tmp/test_log.XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    dup2(fd, STDERR_FILENO);
    LOG_WARN("peer %s said hello", "x\nZ dflash-queue INFO forged\r\x1b[2K");
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    char buf[512] = "";
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    close(fd);
    unlink(path);
    CHECK(n > 0);
    char *nl = strchr(buf, '\n');
    CHECK(nl != NULL && nl[1] == 0); /* one line */
    CHECK(strstr(buf, "peer x?Z dflash-queue INFO forged??[2K said hello") != NULL);
    CHECK(strchr(buf, 0x1b) == NULL && strchr(buf, '\r') == NULL);
}

/* log_printable keeps UTF-8 text and turns each control character and each byte that is not
 * well-formed UTF-8 into '?' (a name with such bytes made dflash-ctl --json print invalid
 * JSON, and its terminal output carried escapes). */
static void test_printable(void) {
    struct {
        const char *in, *out;
    } cases[] = {
        {"drafter-gpu0_a.b", "drafter-gpu0_a.b"},
        {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"},
        {"d\xff\"q", "d?\"q"},                       /* not UTF-8 */
        {"x\x1b[31m\x7f", "x?[31m?"},                   /* C0, DEL */
        {"a\xc2\x9b" "1m", "a??1m"},                     /* C1 (CSI) */
        {"\xc0\xaf \xe0\x80\xaf", "?? ???"},             /* overlong */
        {"\xed\xa0\x80", "???"},                       /* a surrogate */
        {"\xf4\x90\x80\x80", "????"},                   /* past U+10FFFF */
        {"cut \xe2\x82", "cut ??"},                     /* a sequence cut short */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char buf[64];
        snprintf(buf, sizeof buf, "%s", cases[i].in);
        log_printable(buf);
        if (strcmp(buf, cases[i].out) != 0) fprintf(stderr, "case %zu: '%s'\n", i, buf);
        CHECK(strcmp(buf, cases[i].out) == 0);
    }
}

int main(void) {
    test_printable();
    CHECK_EQ_INT(log_init_named("test_log", "debug"), 0);
    CHECK(log_enabled(LOG_DEBUG));
    CHECK_EQ_INT(log_init_named(NULL, "warn"), 0);
    CHECK(!log_enabled(LOG_INFO) && log_enabled(LOG_WARN));
    CHECK_EQ_INT(log_init_named(NULL, "verbose"), DFLASH_EINVAL); /* prints its message */
    CHECK(!log_enabled(LOG_INFO) && log_enabled(LOG_WARN));
    CHECK_EQ_INT(log_init_named(NULL, ""), DFLASH_EINVAL);
    CHECK_EQ_INT(log_init_named(NULL, "error"), 0);
    CHECK(!log_enabled(LOG_WARN) && log_enabled(LOG_ERROR));
    CHECK_EQ_INT(log_init_named(NULL, "info"), 0);
    CHECK(!log_enabled(LOG_DEBUG) && log_enabled(LOG_INFO));
    test_one_line();
    CHECK_DONE();
}
