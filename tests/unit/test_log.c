/* test_log: log_init_named, the --log-level option's parser: every name sets its level, a bad
 * name is refused with DFLASH_EINVAL and leaves the level as it was. */
#include "check.h"
#include "err.h"
#include "log.h"

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
    CHECK_DONE();
}
