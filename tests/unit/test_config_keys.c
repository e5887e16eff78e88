/* test_config_keys: common/config_keys.c's list of every program's option names is the union of
 * the options the programs have, as each one's --help lists them (dflash-queue, -target,
 * -drafter and its eval, -ctl, -data, -gen, -mkmodel, and bench-pipeline and bench-mix, which
 * read config files too; found beside this test's build folder):
 * a name a program has that the list lacks would be warned about as a misspelling in a shared
 * DFLASH_CONFIG file, and a name the list keeps that no program has would hide one. The list is
 * sorted without repeats (config_key_of_any_program searches it by halves), and a key is read
 * as config_find reads it ('_' as '-', any case). */
#include "check.h"
#include "config_keys.h"

#include <libgen.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MAX_NAMES = 512 };
static char seen[MAX_NAMES][64];
static int n_seen;

/* Adds each --name of PROG's --help (its option lines: two blanks, then --name or --[no-]name)
 * to seen[], checking it against the list. Returns the options read, -1 when it did not run. */
static int read_help(const char *build, const char *prog)
{
    char cmd[PATH_MAX + 64];
    snprintf(cmd, sizeof cmd, "%s/%s --help 2>&1", build, prog);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, p)) {
        if (strncmp(line, "  --", 4) != 0) continue;
        char *name = line + 4;
        if (strncmp(name, "[no-]", 5) == 0) name += 5;
        name[strspn(name, "abcdefghijklmnopqrstuvwxyz0123456789-")] = 0;
        if (!*name || !strcmp(name, "config") || !strcmp(name, "dump-config") ||
            !strcmp(name, "help"))
            continue; /* config_load's own */
        n++;
        if (!config_key_of_any_program(name)) {
            CHECK(!"an option missing from common/config_keys.c");
            fprintf(stderr, "  %s has --%s: add \"%s\" to common/config_keys.c's list\n", prog,
                    name, name);
        }
        bool dup = false;
        for (int i = 0; i < n_seen && !dup; i++) dup = strcmp(seen[i], name) == 0;
        if (!dup && n_seen < MAX_NAMES) snprintf(seen[n_seen++], sizeof seen[0], "%s", name);
    }
    int rc = pclose(p);
    return rc == -1 ? -1 : n;
}

int main(int argc, char **argv)
{
    (void)argc;
    char exe[PATH_MAX], build[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        snprintf(exe, sizeof exe, "%s", argv[0]);
        n = (ssize_t)strlen(exe);
    }
    exe[n] = 0;
    snprintf(build, sizeof build, "%s/..", dirname(exe)); /* <build>/tests/.. */
    static const char *const progs[] = {
        "services/queue/dflash-queue", "services/target/dflash-target",
        "services/drafter/dflash-drafter", "services/drafter/dflash-drafter eval",
        "tools/dflash-ctl", "tools/dflash-data", "tools/dflash-gen", "tools/dflash-mkmodel",
        "bench/bench-pipeline", "bench/bench-mix"};
    for (size_t i = 0; i < sizeof progs / sizeof progs[0]; i++) {
        int got = read_help(build, progs[i]);
        CHECK(got > 0);
        if (got <= 0) fprintf(stderr, "  %s/%s --help listed no option\n", build, progs[i]);
    }
    const char *const *keys;
    size_t nk = config_every_key(&keys);
    for (size_t k = 0; k < nk; k++) {
        if (k) CHECK(strcmp(keys[k - 1], keys[k]) < 0); /* sorted, no repeats */
        bool had = false;
        for (int i = 0; i < n_seen && !had; i++) had = strcmp(seen[i], keys[k]) == 0;
        if (!had) {
            CHECK(!"a name in common/config_keys.c that no program has");
            fprintf(stderr, "  no program has --%s: remove it from common/config_keys.c\n",
                    keys[k]);
        }
    }
    CHECK_EQ_INT((long)nk, n_seen);
    CHECK(config_key_of_any_program("min_ready") && config_key_of_any_program("min-ready"));
    CHECK(config_key_of_any_program("MAX_DEPTH") && config_key_of_any_program("Min-Ready"));
    CHECK(!config_key_of_any_program("min_redy") && !config_key_of_any_program(""));
    CHECK(config_key_of_any_program(keys[0]) && config_key_of_any_program(keys[nk - 1]));
    printf("%zu option names, every program's and no other\n", nk);
    CHECK_DONE();
}
