/* test_config: the config table gives flags, DFLASH_* variables, config files, precedence,
 * range checks, live-only sets, which options were given and the dump; a config file that cannot be read (a directory) is
 * an error, not an empty file; a key twice in a file is refused, a flag twice and a misspelled
 * DFLASH_<PROGRAM>_* variable are warned about; the table's check refuses before --dump-config;
 * blanks around numbers are ignored; config_source names where a value came from (a variable, a
 * file's line, a flag, the default) and the table's check uses it; err_str covers the
 * table. */
#include "check.h"
#include "config.h"
#include "test_files.h"
#include "err.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct demo_cfg {
    int64_t min_ready;
    double ratio;
    bool verbose;
    char endpoint[64];
} demo_cfg;

static const cfg_option demo_options[] = {
    {"min-ready", CFG_INT, "4", 0, 1000, true, "reservoir", offsetof(demo_cfg, min_ready), 0},
    {"ratio", CFG_DOUBLE, "0.5", 0, 1, false, "a ratio", offsetof(demo_cfg, ratio), 0},
    {"verbose", CFG_BOOL, "false", 1, 0, true, "chatty", offsetof(demo_cfg, verbose), 0},
    {"endpoint", CFG_STRING, "ipc:///tmp/x", 1, 0, false, "where",
     offsetof(demo_cfg, endpoint), sizeof(((demo_cfg *)0)->endpoint)},
};
static const cfg_table demo = {"demo", "a demo", "[options]", demo_options, 4, NULL, NULL, NULL};

typedef struct long_cfg {
    char shards[2048];
} long_cfg;

static const cfg_option long_options[] = {
    {"shards", CFG_STRING, "", 1, 0, false, "a long list", offsetof(long_cfg, shards),
     sizeof(((long_cfg *)0)->shards)},
};
static const cfg_table long_table = {"long", "long values", "[options]", long_options, 1,
                                     NULL, NULL, NULL};

/* config_load(t, cfg, argv) with stderr and stdout caught: what it printed on each into err and
 * out (NUL-terminated, cut to their sizes). Returns config_load's result. */
static int load_caught(const cfg_table *t, void *cfg, char **argv, char *err, size_t err_len,
                       char *out, size_t out_len)
{
    int argc = 0;
    while (argv[argc]) argc++;
    char epath[] = "/tmp/dflash-test-config-err-XXXXXX";
    char opath[] = "/tmp/dflash-test-config-out-XXXXXX";
    int efd = mkstemp(epath), ofd = mkstemp(opath);
    fflush(stderr);
    fflush(stdout);
    int saved_err = dup(2), saved_out = dup(1);
    dup2(efd, 2);
    dup2(ofd, 1);
    int rc = config_load(t, cfg, argc, argv, NULL, 0, NULL);
    fflush(stderr);
    fflush(stdout);
    dup2(saved_err, 2);
    dup2(saved_out, 1);
    close(saved_err);
    close(saved_out);
    ssize_t n = pread(efd, err, err_len - 1, 0);
    err[n > 0 ? n : 0] = 0;
    n = pread(ofd, out, out_len - 1, 0);
    out[n > 0 ? n : 0] = 0;
    close(efd);
    close(ofd);
    unlink(epath);
    unlink(opath);
    return rc;
}

/* A check across options: min-ready at most 100 times ratio (any rule will do). */
static int demo_check(const cfg_table *t, const void *cfg, char *why, size_t why_len)
{
    (void)t;
    const demo_cfg *c = cfg;
    if (c->min_ready <= 100 * c->ratio) return 0;
    snprintf(why, why_len, "min-ready %lld is more than 100 times ratio %g",
             (long long)c->min_ready, c->ratio);
    return DFLASH_ECONFIG;
}

/* A check that names where its values came from: ratio at most 0.5. */
static int demo_check_sourced(const cfg_table *t, const void *cfg, char *why, size_t why_len)
{
    const demo_cfg *c = cfg;
    if (c->ratio <= 0.5) return 0;
    char src[200];
    snprintf(why, why_len, "%s is above 0.5", config_source(t, cfg, "ratio", src, sizeof src));
    return DFLASH_ECONFIG;
}

/* A value is named as the user gave it (config_source): an inherited DFLASH_RATIO, a config
 * file's line or a flag, not always "--ratio" (a DFLASH_HIDDEN from a compose file was blamed on
 * a --hidden nobody gave); the table's check says so before --dump-config too. */
static void test_sources(void)
{
    demo_cfg c;
    cfg_source src[4];
    cfg_table t = {"demo-prog", "a demo", "[options]", demo_options, 4, src, demo_check_sourced,
                   NULL};
    char buf[300], err[2048], out[2048];
    char path[] = "/tmp/dflash-test-config-src-XXXXXX";
    int fd = mkstemp(path);
    const char *text = "# comment\nendpoint tcp://h:1\nmin-ready 7\n";
    CHECK(fd >= 0 && write(fd, text, strlen(text)) == (ssize_t)strlen(text));
    close(fd);
    setenv("DFLASH_RATIO", "0.25", 1);
    setenv("DFLASH_DEMO_PROG_MIN_READY", "9", 1); /* over the file's 7 */
    char *argv[] = {"demo-prog", "--config", path, "--no-verbose", NULL};
    CHECK_EQ_INT(config_load(&t, &c, 4, argv, NULL, 0, NULL), 0);
    printf("sources: %s; ", config_source(&t, &c, "ratio", buf, sizeof buf));
    CHECK(strcmp(buf, "DFLASH_RATIO=0.25 (environment)") == 0);
    printf("%s; ", config_source(&t, &c, "min-ready", buf, sizeof buf));
    CHECK(strcmp(buf, "DFLASH_DEMO_PROG_MIN_READY=9 (environment)") == 0);
    printf("%s; ", config_source(&t, &c, "verbose", buf, sizeof buf));
    CHECK(strcmp(buf, "--no-verbose") == 0);
    char want[200];
    snprintf(want, sizeof want, "endpoint 'tcp://h:1' (config file %s, line 2)", path);
    printf("%s\n", config_source(&t, &c, "endpoint", buf, sizeof buf));
    CHECK(strcmp(buf, want) == 0);
    unsetenv("DFLASH_DEMO_PROG_MIN_READY");
    char *argv_flag[] = {"demo-prog", "--min-ready", "3", NULL};
    CHECK_EQ_INT(config_load(&t, &c, 3, argv_flag, NULL, 0, NULL), 0);
    CHECK(strcmp(config_source(&t, &c, "min-ready", buf, sizeof buf), "--min-ready 3") == 0);
    unsetenv("DFLASH_RATIO");
    CHECK_EQ_INT(config_load(&t, &c, 1, argv_flag, NULL, 0, NULL), 0);
    CHECK(strcmp(config_source(&t, &c, "ratio", buf, sizeof buf), "--ratio 0.5 (default)") == 0);
    /* the table's check refuses before --dump-config, naming the variable */
    setenv("DFLASH_RATIO", "0.75", 1);
    char *argv_dump[] = {"demo-prog", "--dump-config", NULL};
    CHECK_EQ_INT(load_caught(&t, &c, argv_dump, err, sizeof err, out, sizeof out),
                 DFLASH_ECONFIG);
    printf("check: %s", err);
    CHECK(out[0] == 0 && strstr(err, "demo-prog: DFLASH_RATIO=0.75 (environment) is above 0.5"));
    unsetenv("DFLASH_RATIO");
    char *argv_ok[] = {"demo-prog", "--ratio", "0.5", "--dump-config", NULL};
    CHECK_EQ_INT(load_caught(&t, &c, argv_ok, err, sizeof err, out, sizeof out), 1);
    CHECK(strstr(out, "ratio 0.5\n") != NULL);
    unlink(path);
}

/* What config_load says and refuses beyond single values: a key twice in a file, a flag twice,
 * a misspelled DFLASH_<PROGRAM>_* variable, a configuration its check refuses (before
 * --dump-config prints it), blanks around numbers. */
static void test_said_and_refused(void)
{
    demo_cfg c;
    char err[2048], out[2048];

    /* a key twice in a config file (either spelling) is refused, naming both lines and values;
     * the second used to win without a word */
    char path[] = "/tmp/dflash-test-config-dup-XXXXXX";
    int fd = mkstemp(path);
    const char *text = "min-ready 3\nratio 0.5\nmin_ready 5\n";
    CHECK(fd >= 0 && write(fd, text, strlen(text)) == (ssize_t)strlen(text));
    close(fd);
    char *argv_dup[] = {"demo", "--config", path, NULL};
    CHECK_EQ_INT(load_caught(&demo, &c, argv_dup, err, sizeof err, out, sizeof out),
                 DFLASH_EINVAL);
    CHECK(strstr(err, ":3: min-ready is set again (line 1 set it to '3', this line to '5')"));
    unlink(path);

    /* a flag twice: the last counts, and a warning names both values */
    char *argv_twice[] = {"demo", "--min-ready", "3", "--ratio", "0.5", "--min-ready=7", NULL};
    CHECK_EQ_INT(load_caught(&demo, &c, argv_twice, err, sizeof err, out, sizeof out), 0);
    CHECK_EQ_INT(c.min_ready, 7);
    CHECK(strstr(err, "warning: --min-ready is given twice ('3', then '7')"));
    char *argv_once[] = {"demo", "--min-ready", "3", "--ratio", "0.5", NULL};
    CHECK_EQ_INT(load_caught(&demo, &c, argv_once, err, sizeof err, out, sizeof out), 0);
    CHECK(err[0] == 0);

    /* DFLASH_DEMO_* naming no option warns (a misspelling used to be ignored silently); a
     * known one, CONFIG, another program's and a subcommand's variables do not */
    setenv("DFLASH_DEMO_MIN_REDY", "3", 1);
    setenv("DFLASH_DEMO_RATIO", "0.5", 1);
    setenv("DFLASH_OTHER_BOGUS", "1", 1);
    setenv("DFLASH_DEMO_SUB_THING", "1", 1);
    setenv("DFLASH_DEMO_BIN", "/x", 1); /* the tests' binary paths: not options, not said */
    const cfg_table demo_sub = {"demo", "a demo", "[options]", demo_options, 4, NULL, NULL,
                                (const char *const[]){"sub", NULL}};
    char *argv0[] = {"demo", NULL};
    CHECK_EQ_INT(load_caught(&demo_sub, &c, argv0, err, sizeof err, out, sizeof out), 0);
    CHECK(strstr(err, "warning: environment DFLASH_DEMO_MIN_REDY names no option of demo "
                      "(there is no --min-redy"));
    CHECK(!strstr(err, "DFLASH_DEMO_RATIO") && !strstr(err, "DFLASH_OTHER_BOGUS") &&
          !strstr(err, "DFLASH_DEMO_SUB_THING") && !strstr(err, "DFLASH_DEMO_BIN"));
    CHECK_EQ_INT(load_caught(&demo, &c, argv0, err, sizeof err, out, sizeof out), 0);
    CHECK(strstr(err, "DFLASH_DEMO_SUB_THING")); /* no subcommand "sub" there */
    unsetenv("DFLASH_DEMO_MIN_REDY");
    unsetenv("DFLASH_DEMO_RATIO");
    unsetenv("DFLASH_OTHER_BOGUS");
    unsetenv("DFLASH_DEMO_SUB_THING");
    unsetenv("DFLASH_DEMO_BIN");

    /* the table's check runs before --dump-config: a configuration the program would refuse is
     * not printed (it used to be, with exit 0) */
    const cfg_table demo_checked = {"demo", "a demo", "[options]", demo_options, 4, NULL,
                                    demo_check, NULL};
    char *argv_bad[] = {"demo", "--min-ready", "90", "--ratio", "0.5", "--dump-config", NULL};
    CHECK_EQ_INT(load_caught(&demo_checked, &c, argv_bad, err, sizeof err, out, sizeof out),
                 DFLASH_ECONFIG);
    CHECK(out[0] == 0 && strstr(err, "demo: min-ready 90 is more than 100 times ratio 0.5"));
    argv_bad[5] = NULL; /* and without the dump */
    CHECK_EQ_INT(load_caught(&demo_checked, &c, argv_bad, err, sizeof err, out, sizeof out),
                 DFLASH_ECONFIG);
    char *argv_good[] = {"demo", "--min-ready", "40", "--ratio", "0.5", "--dump-config", NULL};
    CHECK_EQ_INT(load_caught(&demo_checked, &c, argv_good, err, sizeof err, out, sizeof out), 1);
    CHECK(strstr(out, "min-ready 40\n") != NULL);

    /* blanks around a number or BOOL are ignored on both sides, as on a config file's line
     * (dflash-ctl set min_ready=' 3' was taken, '3 ' refused) */
    CHECK_EQ_INT(config_set(&demo, &c, "min_ready", " 3", true, NULL, 0), 0);
    CHECK_EQ_INT(c.min_ready, 3);
    CHECK_EQ_INT(config_set(&demo, &c, "min_ready", "4 ", true, NULL, 0), 0);
    CHECK_EQ_INT(c.min_ready, 4);
    CHECK_EQ_INT(config_set(&demo, &c, "ratio", "\t0.25 ", false, NULL, 0), 0);
    CHECK_NEAR(c.ratio, 0.25, 0);
    CHECK_EQ_INT(config_set(&demo, &c, "verbose", " yes ", true, NULL, 0), 0);
    CHECK(c.verbose);
    CHECK_EQ_INT(config_set(&demo, &c, "min_ready", "3 4", true, NULL, 0), DFLASH_EINVAL);
    CHECK_EQ_INT(config_set(&demo, &c, "min_ready", " ", true, NULL, 0), DFLASH_EINVAL);
    CHECK_EQ_INT(config_set(&demo, &c, "endpoint", " a b ", false, NULL, 0), 0);
    CHECK(strcmp(c.endpoint, " a b ") == 0); /* a string is taken as given */
}

int main(void)
{
    test_said_and_refused();
    test_sources();
    demo_cfg c;
    char *argv0[] = {"demo", NULL};
    CHECK_EQ_INT(config_load(&demo, &c, 1, argv0, NULL, 0, NULL), 0);
    CHECK_EQ_INT(c.min_ready, 4);
    CHECK_NEAR(c.ratio, 0.5, 0);
    CHECK(!c.verbose);
    CHECK(strcmp(c.endpoint, "ipc:///tmp/x") == 0);

    /* file < env < flag */
    char path[] = "/tmp/dflash-test-config-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    const char *text = "# comment\nmin_ready 7\nratio 0.25  # trailing\nendpoint tcp://a#1\n";
    CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
    close(fd);
    setenv("DFLASH_RATIO", "0.75", 1);
    char *argv1[] = {"demo", "--config", path, "--min-ready=9", "--verbose", "pos", NULL};
    char *pos[2];
    int npos = 0;
    CHECK_EQ_INT(config_load(&demo, &c, 6, argv1, pos, 2, &npos), 0);
    CHECK_EQ_INT(c.min_ready, 9);
    CHECK_NEAR(c.ratio, 0.75, 0);
    CHECK(c.verbose);
    CHECK(strcmp(c.endpoint, "tcp://a#1") == 0); /* a '#' inside a value is kept */
    CHECK_EQ_INT(npos, 1);
    CHECK(npos == 1 && strcmp(pos[0], "pos") == 0);
    unsetenv("DFLASH_RATIO");
    unlink(path);

    /* DFLASH_<PROGRAM>_<NAME> beats DFLASH_<NAME>; another program's scoped variable is not
     * ours */
    setenv("DFLASH_RATIO", "0.75", 1);
    setenv("DFLASH_DEMO_RATIO", "0.125", 1);
    setenv("DFLASH_OTHER_MIN_READY", "11", 1);
    CHECK_EQ_INT(config_load(&demo, &c, 1, argv0, NULL, 0, NULL), 0);
    CHECK_NEAR(c.ratio, 0.125, 0);
    CHECK_EQ_INT(c.min_ready, 4);
    unsetenv("DFLASH_DEMO_RATIO");
    CHECK_EQ_INT(config_load(&demo, &c, 1, argv0, NULL, 0, NULL), 0);
    CHECK_NEAR(c.ratio, 0.75, 0);
    setenv("DFLASH_DEMO_RATIO", "2", 1); /* named as such in the error */
    CHECK_EQ_INT(config_load(&demo, &c, 1, argv0, NULL, 0, NULL), DFLASH_ERANGE);
    unsetenv("DFLASH_DEMO_RATIO");
    unsetenv("DFLASH_RATIO");
    unsetenv("DFLASH_OTHER_MIN_READY");

    /* the config file by variable, as every option: DFLASH_<PROGRAM>_CONFIG beats DFLASH_CONFIG
     * and another program's is not ours (DFLASH_DEMO_CONFIG used to be ignored without a word,
     * so a shell running several programs could only give all of them one file) */
    char ours[] = "/tmp/dflash-test-config-XXXXXX", shared[] = "/tmp/dflash-test-config-XXXXXX";
    int fo = mkstemp(ours), fs = mkstemp(shared);
    CHECK(fo >= 0 && fs >= 0);
    CHECK(write(fo, "min-ready 21\n", 13) == 13);
    CHECK(write(fs, "min-ready 22\n", 13) == 13);
    close(fo);
    close(fs);
    setenv("DFLASH_CONFIG", shared, 1);
    setenv("DFLASH_OTHER_CONFIG", "/nonexistent/other.conf", 1);
    CHECK_EQ_INT(config_load(&demo, &c, 1, argv0, NULL, 0, NULL), 0);
    CHECK_EQ_INT(c.min_ready, 22);
    setenv("DFLASH_DEMO_CONFIG", ours, 1);
    CHECK_EQ_INT(config_load(&demo, &c, 1, argv0, NULL, 0, NULL), 0);
    CHECK_EQ_INT(c.min_ready, 21);
    char *argv_cf[] = {"demo", "--config", shared, NULL}; /* the flag still wins */
    CHECK_EQ_INT(config_load(&demo, &c, 3, argv_cf, NULL, 0, NULL), 0);
    CHECK_EQ_INT(c.min_ready, 22);
    unsetenv("DFLASH_DEMO_CONFIG");
    unsetenv("DFLASH_OTHER_CONFIG");
    /* DFLASH_CONFIG is every program's: a key of another program's there is skipped (it was
     * refused: "unknown option", and every program lacking one of its keys would not start);
     * the same file given by --config (ours alone) still refuses it, and a bad value of one of
     * our keys from the shared file is refused, naming the variable */
    test_spill(shared, "max-depth 7\nmin-ready 23\n", 24);
    CHECK_EQ_INT(config_load(&demo, &c, 1, argv0, NULL, 0, NULL), 0);
    CHECK_EQ_INT(c.min_ready, 23);
    CHECK(config_load(&demo, &c, 3, argv_cf, NULL, 0, NULL) < 0);
    test_spill(shared, "min-ready x\n", 12);
    char said[512], out[64];
    CHECK(load_caught(&demo, &c, argv0, said, sizeof said, out, sizeof out) < 0);
    CHECK(strstr(said, ":1 (DFLASH_CONFIG): ") != NULL);
    /* a key no program has (a misspelling) is warned about, naming its line, and skipped;
     * another program's (max-depth: dflash-queue's, not demo's) is skipped without a word */
    const char *typo = "max-depth 7\nmin_redy 24\nmin-ready 25\n";
    test_spill(shared, typo, strlen(typo));
    CHECK_EQ_INT(load_caught(&demo, &c, argv0, said, sizeof said, out, sizeof out), 0);
    CHECK_EQ_INT(c.min_ready, 25);
    CHECK(strstr(said, ":2 (DFLASH_CONFIG): 'min_redy' is an option of no dflash program") != NULL);
    CHECK(strstr(said, "max-depth") == NULL);
    if (!strstr(said, "'min_redy'")) fprintf(stderr, "  said: %s\n", said);
    unsetenv("DFLASH_CONFIG");
    unlink(ours);
    unlink(shared);

    /* a directory as the config file is an error (exit 2 in the daemons), by flag or by
     * variable: it opened, its first read failed (EISDIR) and it used to count as empty */
    char cdir[] = "/tmp/dflash-test-config-dir-XXXXXX";
    CHECK(mkdtemp(cdir) != NULL);
    char *argv_dir[] = {"demo", "--config", cdir, NULL};
    CHECK_EQ_INT(config_load(&demo, &c, 3, argv_dir, NULL, 0, NULL), DFLASH_EIO);
    setenv("DFLASH_CONFIG", cdir, 1);
    CHECK_EQ_INT(config_load(&demo, &c, 1, argv0, NULL, 0, NULL), DFLASH_EIO);
    unsetenv("DFLASH_CONFIG");
    rmdir(cdir);

    /* which options were given, even at their default value (an explicit --hidden 256 is not
     * the default 256): flags, variables and the config file count, the default does not */
    cfg_source given[4];
    const cfg_table demo_given = {"demo", "a demo", "[options]", demo_options, 4, given,
                                  NULL, NULL};
    char *argv_given[] = {"demo", "--ratio", "0.5", NULL};
    setenv("DFLASH_VERBOSE", "false", 1);
    CHECK_EQ_INT(config_load(&demo_given, &c, 3, argv_given, NULL, 0, NULL), 0);
    CHECK(config_given(&demo_given, "ratio") && config_given(&demo_given, "verbose"));
    CHECK(!config_given(&demo_given, "min-ready") && !config_given(&demo_given, "endpoint"));
    CHECK(!config_given(&demo, "ratio")); /* a table without `sources` */
    unsetenv("DFLASH_VERBOSE");
    CHECK_EQ_INT(config_load(&demo_given, &c, 1, argv0, NULL, 0, NULL), 0);
    CHECK(!config_given(&demo_given, "ratio") && !config_given(&demo_given, "verbose"));

    /* errors */
    char *argv2[] = {"demo", "--min-ready", "5000", NULL};
    CHECK_EQ_INT(config_load(&demo, &c, 3, argv2, NULL, 0, NULL), DFLASH_ERANGE);
    char *argv3[] = {"demo", "--bogus", "1", NULL};
    CHECK_EQ_INT(config_load(&demo, &c, 3, argv3, NULL, 0, NULL), DFLASH_EINVAL);
    char *argv4[] = {"demo", "--ratio", "abc", NULL};
    CHECK_EQ_INT(config_load(&demo, &c, 3, argv4, NULL, 0, NULL), DFLASH_EINVAL);
    char *argv5[] = {"demo", "stray", NULL};
    CHECK_EQ_INT(config_load(&demo, &c, 2, argv5, NULL, 0, NULL), DFLASH_EINVAL);
    /* --config with no file name (`--config $UNSET`, `--config "$UNSET"`) is an error; it used
     * to run on the defaults without a word */
    char *argv6[] = {"demo", "--min-ready", "5", "--config", NULL};
    CHECK_EQ_INT(config_load(&demo, &c, 4, argv6, NULL, 0, NULL), DFLASH_EINVAL);
    char *argv7[] = {"demo", "--config", "", "--min-ready", "5", NULL};
    CHECK_EQ_INT(config_load(&demo, &c, 5, argv7, NULL, 0, NULL), DFLASH_EINVAL);
    char *argv8[] = {"demo", "--config=", NULL};
    CHECK_EQ_INT(config_load(&demo, &c, 2, argv8, NULL, 0, NULL), DFLASH_EINVAL);

    /* integers are decimal: a leading zero is not octal, 0x is no number */
    CHECK_EQ_INT(config_set(&demo, &c, "min_ready", "010", false, NULL, 0), 0);
    CHECK_EQ_INT(c.min_ready, 10);
    CHECK_EQ_INT(config_set(&demo, &c, "min_ready", "0x10", false, NULL, 0), DFLASH_EINVAL);

    /* live sets */
    char err[128];
    CHECK_EQ_INT(config_set(&demo, &c, "min_ready", "11", true, err, sizeof err), 0);
    CHECK_EQ_INT(c.min_ready, 11);
    CHECK_EQ_INT(config_set(&demo, &c, "ratio", "0.1", true, err, sizeof err), DFLASH_EDENIED);
    CHECK_EQ_INT(config_set(&demo, &c, "nope", "1", true, err, sizeof err), DFLASH_ENOTFOUND);
    char v[64];
    CHECK_EQ_INT(config_get(&demo, &c, "min-ready", v, sizeof v), 0);
    CHECK(strcmp(v, "11") == 0);

    /* --help shows each flag as it is written: a BOOL takes no separate value (--fsync false
     * used to be shown as --fsync BOOL, and exits 2), it is --[no-]NAME or --NAME=BOOL */
    char *help = NULL;
    size_t help_len = 0;
    FILE *hf = open_memstream(&help, &help_len);
    config_print_help(&demo, hf);
    fclose(hf);
    CHECK(strstr(help, "--min-ready INT ") != NULL);
    CHECK(strstr(help, "--[no-]verbose ") != NULL);
    CHECK(strstr(help, "--verbose BOOL") == NULL);
    free(help);
    char *argv_no[] = {"demo", "--verbose", "--no-verbose", NULL};
    CHECK_EQ_INT(config_load(&demo, &c, 3, argv_no, NULL, 0, NULL), 0);
    CHECK(!c.verbose);
    /* --no-NAME=BOOL is refused: --no-verbose=true used to turn verbose on */
    char *argv_nov[] = {"demo", "--no-verbose=true", NULL};
    CHECK_EQ_INT(config_load(&demo, &c, 2, argv_nov, NULL, 0, NULL), DFLASH_EINVAL);

    /* --dump-config prints a long string whole: a list of 45 shard paths (1349 characters) used
     * to come out cut at 511, and loaded back as a different, shorter list */
    long_cfg lc;
    char *argv_long[] = {"long", "--shards", NULL, NULL};
    char list[2048] = "";
    for (int i = 0; i < 45; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s/data/shards/train-%04d.shard",
                 i ? "," : "", i);
    argv_long[2] = list;
    CHECK_EQ_INT(config_load(&long_table, &lc, 3, argv_long, NULL, 0, NULL), 0);
    char *dump = NULL;
    size_t dump_len = 0;
    FILE *df = open_memstream(&dump, &dump_len);
    config_dump(&long_table, &lc, df);
    fclose(df);
    char want[2100];
    snprintf(want, sizeof want, "shards %s\n", list);
    CHECK(strstr(dump, want) != NULL);
    /* and a config file line of any length loads: lines used to be read in 1023-byte pieces,
     * the rest of the list parsed as an option of its own ("unknown option '...shard,...'") */
    char lpath[] = "/tmp/dflash-test-config-long-XXXXXX";
    int lfd = mkstemp(lpath);
    CHECK(lfd >= 0 && write(lfd, dump, dump_len) == (ssize_t)dump_len);
    close(lfd);
    free(dump);
    long_cfg back;
    char *argv_back[] = {"long", "--config", lpath, NULL};
    CHECK_EQ_INT(config_load(&long_table, &back, 3, argv_back, NULL, 0, NULL), 0);
    CHECK(strcmp(back.shards, list) == 0);
    unlink(lpath);

    /* a DFLASH_* switch or size outside the tables: unset or empty is the default, a whole
     * number in range is taken (a bad one exits 2: test_dflash_model) */
    unsetenv("DFLASH_TEST_SWITCH");
    CHECK_EQ_INT(config_env_int("DFLASH_TEST_SWITCH", 0, 1, 1), 1);
    setenv("DFLASH_TEST_SWITCH", "", 1);
    CHECK_EQ_INT(config_env_int("DFLASH_TEST_SWITCH", 0, 1, 1), 1);
    setenv("DFLASH_TEST_SWITCH", "0", 1);
    CHECK_EQ_INT(config_env_int("DFLASH_TEST_SWITCH", 0, 1, 1), 0);
    setenv("DFLASH_TEST_SWITCH", "4096", 1);
    CHECK_EQ_INT(config_env_int("DFLASH_TEST_SWITCH", 2, 1 << 30, 8), 4096);
    unsetenv("DFLASH_TEST_SWITCH");

    int ids[3];
    CHECK_EQ_INT(config_parse_int_list("1,9,17", ids, 3, NULL, 0), 3);
    CHECK(ids[0] == 1 && ids[1] == 9 && ids[2] == 17);
    CHECK_EQ_INT(config_parse_int_list("", ids, 3, NULL, 0), 0);
    /* each refusal says why (the daemons printed only "bad --capture-layers") */
    char why[128] = "";
    CHECK_EQ_INT(config_parse_int_list("1,2,3,4", ids, 3, why, sizeof why), DFLASH_EINVAL);
    CHECK(strcmp(why, "more than 3 entries") == 0);
    CHECK_EQ_INT(config_parse_int_list("1,-2", ids, 3, why, sizeof why), DFLASH_EINVAL);
    CHECK(strcmp(why, "-2 is negative") == 0);
    CHECK_EQ_INT(config_parse_int_list("1,x", ids, 3, why, sizeof why), DFLASH_EINVAL);
    CHECK(strcmp(why, "'x' is not a number") == 0);
    CHECK_EQ_INT(config_parse_int_list("1,2x,3", ids, 3, why, sizeof why), DFLASH_EINVAL);
    CHECK(strcmp(why, "'2x' is not a number") == 0);

    CHECK(strcmp(err_str(DFLASH_EINVAL), "invalid argument") == 0);
    CHECK(strcmp(err_name(DFLASH_ETIMEOUT), "TIMEOUT") == 0);
    CHECK(strcmp(err_str(-9999), "unknown error") == 0);
    CHECK_DONE();
}
