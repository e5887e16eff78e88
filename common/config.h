/* config: one table per program drives flags, DFLASH_* variables, config files, --help and the
 * dump of the effective configuration.
 *
 * A program declares a plain struct of settings and a cfg_option table describing each member:
 * name, type, default, range, whether it may change live, help line and offsetof() into the
 * struct. Defaults live only in that table. Precedence, lowest first:
 *   table default < config file (`--config FILE`, else DFLASH_<PROGRAM>_CONFIG, else
 *     DFLASH_CONFIG) < DFLASH_<NAME> < DFLASH_<PROGRAM>_<NAME> < --name VALUE
 * Option "min-ready" is flag --min-ready, variables DFLASH_MIN_READY and (dflash-queue's)
 * DFLASH_QUEUE_MIN_READY, file key min-ready or min_ready. PROGRAM is the table's program
 * name without "dflash-", upper-cased, other characters as '_' ("dflash-drafter eval":
 * DRAFTER_EVAL). Config files hold `key value` lines; '#' at the start or after a blank starts a
 * comment. Integers are decimal. A BOOL flag takes no separate value: --name, --no-name or
 * --name=BOOL (--help shows it as --[no-]name); --no-name=BOOL is an error.
 * A key given twice in a config file is an error (both lines named); a flag given twice warns
 * on stderr, naming both values, and the last one counts (a script may append an override). A
 * DFLASH_<PROGRAM>_* variable that names no option of the program warns (a misspelling: it can
 * only have been meant for this program; the project's own DFLASH_<TOOL>_BIN and deploy's
 * DFLASH_TARGET_GPU, DFLASH_DRAFTER_GPU, DFLASH_DATA_DIR excepted). DFLASH_CONFIG's file is
 * every program's: a key of another program's there is skipped, one of no program's warned about
 * (config_keys.h) and skipped. Blanks around a number or BOOL value are ignored
 * wherever it comes from (flag, variable, file, dflash-ctl set), as a config file's line is.
 * config_load records where each value came from (the table's `sources`), so that a refusal
 * names what the user actually set: an inherited DFLASH_HIDDEN is no "--hidden" (config_source).
 *
 * Strings are fixed char arrays inside the struct (size given in the table), so the struct can be
 * copied and needs no cleanup. Not thread-safe: a daemon owns its config on its loop thread.
 */
#ifndef DFLASH_CONFIG_H
#define DFLASH_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" { /* config_env_int is read by the cuda backend's .cu files too */
#endif

typedef enum {
    CFG_INT,    /* int64_t member */
    CFG_DOUBLE, /* double member */
    CFG_BOOL,   /* bool member; values true/false/1/0/yes/no/on/off */
    CFG_STRING, /* char[size] member */
} cfg_type;

typedef struct cfg_option {
    const char *name; /* lower-case, words joined by '-' */
    cfg_type type;
    const char *def;  /* default, as text */
    double min, max;  /* inclusive range for CFG_INT / CFG_DOUBLE; ignored when min > max */
    bool live;        /* may change while running (dflash-ctl set) */
    const char *help; /* one line */
    size_t offset;    /* offsetof(struct, member) */
    size_t size;      /* CFG_STRING: sizeof the char array */
} cfg_option;

/* Where config_load took an option's value from. */
typedef enum {
    CFG_FROM_DEFAULT,     /* the table's default */
    CFG_FROM_FILE,        /* the config file */
    CFG_FROM_ENV,         /* DFLASH_<NAME> */
    CFG_FROM_PROGRAM_ENV, /* DFLASH_<PROGRAM>_<NAME> */
    CFG_FROM_FLAG,        /* --name */
} cfg_from;

typedef struct cfg_source {
    cfg_from from;
    const char *file; /* CFG_FROM_FILE: the file's path, argv's or the environment's string (valid
                         while they are) */
    int line;         /* CFG_FROM_FILE: the line that set it */
} cfg_source;

typedef struct cfg_table {
    const char *program; /* e.g. "dflash-queue" */
    const char *summary; /* one line under the usage line of --help */
    const char *usage;   /* e.g. "[options]" or "[options] COMMAND" */
    const cfg_option *options;
    size_t n_options;
    cfg_source *sources; /* optional, n_options entries: where config_load took each value from
                            (config_given, config_source) */
    /* optional: the checks across options the program makes at start-up (min-ready against
     * max-depth); config_load runs them after the flags, before --dump-config, so a dump is
     * always a configuration the program takes. t is the table being loaded, so that the
     * reason can say where a value came from (config_source: "DFLASH_HIDDEN=4096
     * (environment)", not "--hidden 4096"). 0, or non-zero with the reason in why. */
    int (*check)(const struct cfg_table *t, const void *cfg, char *why, size_t why_len);
    /* optional, NULL-terminated: the program's subcommands ("eval" of dflash-drafter), whose
     * variables DFLASH_<PROGRAM>_<SUBCOMMAND>_* are theirs, not unknown names of the program */
    const char *const *subcommands;
} cfg_table;

/* Fills cfg from defaults, then the config file, the environment, then argv, and runs the
 * table's check. Returns 0 when the program should run, 1 when it printed --help or
 * --dump-config and should exit 0, or a negative code after printing the problem (unknown flag,
 * bad value, range; DFLASH_ECONFIG: the check refused it) to stderr. Arguments that are not
 * flags are left, in order, in positional[0..*n_positional) (pointers into argv); pass NULL to
 * refuse positionals. */
int config_load(const cfg_table *t, void *cfg, int argc, char **argv, char **positional,
                int max_positional, int *n_positional);

/* Sets one option from text. Refuses (DFLASH_EDENIED) an option that is not live when
 * live_only. Returns DFLASH_ENOTFOUND, DFLASH_EINVAL, DFLASH_ERANGE with a message in
 * err_msg (may be NULL). */
int config_set(const cfg_table *t, void *cfg, const char *name, const char *value, bool live_only,
               char *err_msg, size_t err_len);

/* Writes the current value of option name as text. Returns 0 or DFLASH_ENOTFOUND. */
int config_get(const cfg_table *t, const void *cfg, const char *name, char *out, size_t len);

const cfg_option *config_find(const cfg_table *t, const char *name);
/* Orders two option names as flags spell them: '-' and '_' alike, case-insensitively (so
 * DFLASH_MIN_READY, min_ready and min-ready are one name); 0 when they are one. */
int config_name_cmp(const char *a, const char *b);

/* True when the last config_load set option name from the config file, the environment or a
 * flag, even to its default value; false when it kept the default, and for a table without
 * `sources`. For "an explicit --hidden disagrees with the model" checks. */
bool config_given(const cfg_table *t, const char *name);

/* Option name's value in cfg as the user gave it, for a message that refuses it: "--hidden
 * 4096" (a flag, or a table without `sources`), "DFLASH_HIDDEN=4096 (environment)",
 * "hidden 4096 (config file run.conf, line 3)" or "--hidden 256 (default)". A string value is
 * quoted ('1,9'), a BOOL flag is --name or --no-name. Writes into buf (cut to len) and returns
 * it. name must be one of the table's options. */
const char *config_source(const cfg_table *t, const void *cfg, const char *name, char *buf,
                          size_t len);

/* For a table's check: writes the reason (printf-style) into why and returns DFLASH_ECONFIG,
 * so that a refusal reads `return config_refuse(why, len, "...", ...)`. */
int config_refuse(char *why, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Parses a comma-separated list of non-negative integers ("1,9,17"; "" gives 0 entries) into
 * out[0..max). Returns the count or DFLASH_EINVAL with the reason in err (may be NULL): not a
 * number, negative, too many. */
int config_parse_int_list(const char *s, int *out, int max, char *err, size_t errlen);

/* `key value` lines of the effective config, loadable again as a config file. */
void config_dump(const cfg_table *t, const void *cfg, FILE *out);
void config_print_help(const cfg_table *t, FILE *out);

/* A DFLASH_* variable outside every option table (the compute backends' switches and sizes:
 * DFLASH_LM_CHUNK, DFLASH_LAYER0_DEDUP, DFLASH_CUDA_VEC, ...), read where it is used: unset or
 * empty gives def; a whole decimal number in [min, max] gives that number (a switch is [0, 1]).
 * Anything else ("on", "true", "4k", out of range) is bad configuration: it logs an error
 * naming the variable, its value and what it takes, and exits 2, since a kernel or size other
 * than the one asked for must not run silently. Thread-safe (reads the environment only). */
int64_t config_env_int(const char *var, int64_t min, int64_t max, int64_t def);

#ifdef __cplusplus
}
#endif

#endif
