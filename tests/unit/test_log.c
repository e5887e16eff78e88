/* test_log: log_init_named, the --log-level option's parser: every name sets its level, a bad
 * name is refused with DFLASH_EINVAL and leaves the level as it was; a message is one line,
 * whatever it relays (defect: a peer's name "x\nZ dflash-queue INFO forged" forged a second line
 * in the broker's log). */
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

int main(void) {
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
