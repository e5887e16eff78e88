/* config: see config.h. The table is read-only; every function walks it linearly (tables hold a
 * few dozen options at most). Parsing is strict: trailing garbage, out-of-range numbers and
 * unknown names are errors with a message naming the option and where the value came from. */
#include "config.h"
#include "config_keys.h"
#include "err.h"
#include "log.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int config_name_cmp(const char *a, const char *b)
{
    for (;; a++, b++) {
        unsigned char ca = *a == '_' ? '-' : (unsigned char)tolower((unsigned char)*a);
        unsigned char cb = *b == '_' ? '-' : (unsigned char)tolower((unsigned char)*b);
        if (ca != cb) return ca - cb;
        if (!ca) return 0;
    }
}

static bool name_eq(const char *a, const char *b) { return config_name_cmp(a, b) == 0; }

const cfg_option *config_find(const cfg_table *t, const char *name)
{
    for (size_t i = 0; i < t->n_options; i++)
        if (name_eq(t->options[i].name, name)) return &t->options[i];
    return NULL;
}

bool config_given(const cfg_table *t, const char *name)
{
    const cfg_option *o = config_find(t, name);
    return o && t->sources && t->sources[o - t->options].from != CFG_FROM_DEFAULT;
}

/* Records where option o's value came from (file and line: CFG_FROM_FILE only). */
static void mark_source(const cfg_table *t, const cfg_option *o, cfg_from from, const char *file,
                        int line)
{
    if (t->sources && o) t->sources[o - t->options] = (cfg_source){from, file, line};
}

static int parse_bool(const char *s, bool *out)
{
    static const char *const yes[] = {"true", "1", "yes", "on"};
    static const char *const no[] = {"false", "0", "no", "off"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0) return *out = true, 0;
        if (strcasecmp(s, no[i]) == 0) return *out = false, 0;
    }
    return DFLASH_EINVAL;
}

/* value without the blanks around it, into buf (cut to its size): how a config file's line
 * gives it, so " 3" and "3 " are both 3 wherever a number or BOOL comes from. */
static const char *trim_blanks(const char *value, char *buf, size_t size)
{
    while (isspace((unsigned char)*value)) value++;
    size_t n = strlen(value);
    while (n && isspace((unsigned char)value[n - 1])) n--;
    snprintf(buf, size, "%.*s", (int)n, value);
    return buf;
}

static int set_value(const cfg_option *o, void *cfg, const char *value, char *err, size_t len)
{
    char *member = (char *)cfg + o->offset;
    char trimmed[128]; /* a number or BOOL longer than this is not one either way */
    if (o->type != CFG_STRING) value = trim_blanks(value, trimmed, sizeof trimmed);
    char *end = NULL;
    errno = 0;
    switch (o->type) {
    case CFG_INT: {
        long long v = strtoll(value, &end, 10); /* "010" is ten, as a user means it */
        if (errno || end == value || *end) {
            if (err) snprintf(err, len, "%s: '%s' is not an integer", o->name, value);
            return DFLASH_EINVAL;
        }
        if (o->min <= o->max && ((double)v < o->min || (double)v > o->max)) {
            if (err)
                snprintf(err, len, "%s: %lld is outside [%.17g, %.17g]", o->name, v, o->min,
                         o->max);
            return DFLASH_ERANGE;
        }
        *(int64_t *)member = v;
        return 0;
    }
    case CFG_DOUBLE: {
        double v = strtod(value, &end);
        if (errno || end == value || *end || !isfinite(v)) {
            if (err) snprintf(err, len, "%s: '%s' is not a number", o->name, value);
            return DFLASH_EINVAL;
        }
        if (o->min <= o->max && (v < o->min || v > o->max)) {
            if (err)
                snprintf(err, len, "%s: %g is outside [%.15g, %.15g]", o->name, v, o->min, o->max);
            return DFLASH_ERANGE;
        }
        *(double *)member = v;
        return 0;
    }
    case CFG_BOOL: {
        bool b;
        if (parse_bool(value, &b)) {
            if (err) snprintf(err, len, "%s: '%s' is not true or false", o->name, value);
            return DFLASH_EINVAL;
        }
        *(bool *)member = b;
        return 0;
    }
    case CFG_STRING:
        if (strlen(value) >= o->size) {
            if (err) snprintf(err, len, "%s: value longer than %zu bytes", o->name, o->size - 1);
            return DFLASH_ERANGE;
        }
        memcpy(member, value, strlen(value) + 1);
        return 0;
    }
    return DFLASH_EINVAL;
}

int config_set(const cfg_table *t, void *cfg, const char *name, const char *value, bool live_only,
               char *err_msg, size_t err_len)
{
    const cfg_option *o = config_find(t, name);
    if (!o) {
        if (err_msg) snprintf(err_msg, err_len, "unknown option '%s'", name);
        return DFLASH_ENOTFOUND;
    }
    if (live_only && !o->live) {
        if (err_msg) snprintf(err_msg, err_len, "%s cannot change while running", o->name);
        return DFLASH_EDENIED;
    }
    return set_value(o, cfg, value, err_msg, err_len);
}

int config_get(const cfg_table *t, const void *cfg, const char *name, char *out, size_t len)
{
    const cfg_option *o = config_find(t, name);
    if (!o) return DFLASH_ENOTFOUND;
    const char *member = (const char *)cfg + o->offset;
    switch (o->type) {
    case CFG_INT:
        snprintf(out, len, "%lld", (long long)*(const int64_t *)member);
        break;
    case CFG_DOUBLE:
        snprintf(out, len, "%.17g", *(const double *)member);
        break;
    case CFG_BOOL:
        snprintf(out, len, "%s", *(const bool *)member ? "true" : "false");
        break;
    case CFG_STRING:
        snprintf(out, len, "%s", member);
        break;
    }
    return 0;
}

/* Loads config file path. shared: it came from DFLASH_CONFIG, which every program reads, so a
 * key that names none of this program's options is another program's: skipped (as a plain
 * DFLASH_* variable is), not refused as in a file of its own (--config, DFLASH_<PROGRAM>_CONFIG:
 * a shared file made every program that lacked one of its keys refuse to start); one that no
 * program has (config_keys) is warned about, by each program that reads the file. */
static int load_file(const cfg_table *t, void *cfg, const char *path, bool shared)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "%s: cannot open config file %s: %s\n", t->program, path,
                strerror(errno));
        return DFLASH_EIO;
    }
    char *line = NULL; /* any length: a value may be a long list of paths */
    size_t cap = 0;
    int lineno = 0, rc = 0;
    int *key_line = calloc(t->n_options, sizeof *key_line); /* where each key was set, 0: not */
    if (!key_line) {
        fclose(f);
        return DFLASH_ENOMEM;
    }
    errno = 0;
    while (getline(&line, &cap, f) >= 0) {
        lineno++;
        /* a comment starts at a '#' that begins the line or follows a blank: a value may hold
         * one (a path "a#b", as --dump-config prints it, loads back) */
        for (char *h = line; (h = strchr(h, '#')); h++)
            if (h == line || isspace((unsigned char)h[-1])) {
                *h = 0;
                break;
            }
        char *key = line;
        while (isspace((unsigned char)*key)) key++;
        if (!*key) continue;
        char *val = key;
        while (*val && !isspace((unsigned char)*val)) val++;
        if (*val) *val++ = 0;
        while (isspace((unsigned char)*val)) val++;
        char *end = val + strlen(val);
        while (end > val && isspace((unsigned char)end[-1])) *--end = 0;
        const cfg_option *o = config_find(t, key);
        if (!o && shared) { /* another program's key, or one no program has: a misspelling */
            if (!config_key_of_any_program(key))
                fprintf(stderr, "%s: warning: %s:%d (DFLASH_CONFIG): '%s' is an option of no "
                        "dflash program (a misspelling? see each program's --help): ignored\n",
                        t->program, path, lineno, key);
            continue;
        }
        if (o && key_line[o - t->options]) { /* min-ready and min_ready are one key */
            char first[256];
            config_get(t, cfg, o->name, first, sizeof first);
            fprintf(stderr, "%s: %s:%d: %s is set again (line %d set it to '%s', this line to "
                    "'%s'): give each key once\n", t->program, path, lineno, o->name,
                    key_line[o - t->options], first, val);
            rc = DFLASH_EINVAL;
            break;
        }
        char err[256];
        int r = config_set(t, cfg, key, val, false, err, sizeof err);
        if (r) {
            fprintf(stderr, "%s: %s:%d%s: %s\n", t->program, path, lineno,
                    shared ? " (DFLASH_CONFIG)" : "", err);
            rc = r;
            break;
        }
        key_line[o - t->options] = lineno;
        mark_source(t, o, CFG_FROM_FILE, path, lineno);
        errno = 0;
    }
    free(key_line);
    /* a directory opens, then fails its first read (EISDIR): it is no empty config file */
    if (!rc && ferror(f)) {
        fprintf(stderr, "%s: cannot read config file %s: %s\n", t->program, path,
                strerror(errno ? errno : EIO));
        rc = DFLASH_EIO;
    }
    free(line);
    fclose(f);
    return rc;
}

/* DFLASH_<SCOPE><NAME> into var: name upper-cased with '-' as '_'; scope "" or e.g. "MKMODEL_". */
static void env_var_name(const char *scope, const char *name, char *var, size_t size)
{
    size_t n = (size_t)snprintf(var, size, "DFLASH_%s", scope);
    for (const char *p = name; *p && n + 1 < size; p++)
        var[n++] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
    var[n < size ? n : size - 1] = 0;
}

/* The program's scope of its variables: "dflash-mkmodel" gives "MKMODEL_", "dflash-drafter eval"
 * "DRAFTER_EVAL_" (letters and digits upper-cased, anything else '_'). */
static void env_scope(const cfg_table *t, char *scope, size_t size)
{
    const char *p = t->program;
    if (strncmp(p, "dflash-", 7) == 0) p += 7;
    size_t n = 0;
    for (; *p && n + 2 < size; p++)
        scope[n++] = isalnum((unsigned char)*p) ? (char)toupper((unsigned char)*p) : '_';
    scope[n++] = '_';
    scope[n] = 0;
}

/* The DFLASH_<PROGRAM>_* names this project gives other meanings, which no program warns about:
 * the tests' DFLASH_<TOOL>_BIN (a binary's path) and deploy/'s compose variables for the
 * operator's shell or .env (the GPU each service uses, the data folder mounted). */
static bool used_elsewhere(const char *var)
{
    static const char *const names[] = {"DFLASH_TARGET_GPU", "DFLASH_DRAFTER_GPU",
                                        "DFLASH_DRAFTER_GPUS", "DFLASH_DATA_DIR", NULL};
    size_t n = strlen(var);
    if (n > 4 && strcmp(var + n - 4, "_BIN") == 0) return true;
    for (const char *const *p = names; *p; p++)
        if (strcmp(var, *p) == 0) return true;
    return false;
}

/* Warns about each DFLASH_<PROGRAM>_* variable in the environment that names no option of the
 * program (nor CONFIG, nor one of its subcommands' scopes, nor one used_elsewhere): a
 * misspelling that would otherwise be ignored without a word. Plain DFLASH_* names are shared by
 * every program and the compute backends, so an unknown one there may be meant for another: not
 * said. */
static void warn_unknown_env(const cfg_table *t, const char *scope)
{
    extern char **environ;
    char prefix[80];
    snprintf(prefix, sizeof prefix, "DFLASH_%s", scope);
    size_t plen = strlen(prefix);
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, prefix, plen) != 0) continue;
        const char *rest = *e + plen;
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)strcspn(rest, "="), rest);
        if (config_find(t, name) || name_eq(name, "config")) continue;
        char var[200];
        snprintf(var, sizeof var, "%s%s", prefix, name);
        if (used_elsewhere(var)) continue;
        bool sub = false;
        for (const char *const *w = t->subcommands; w && *w && !sub; w++) {
            size_t n = strlen(*w);
            sub = strncasecmp(name, *w, n) == 0 && name[n] == '_';
        }
        if (sub) continue;
        char flag[128];
        size_t n = 0;
        for (const char *p = name; *p && n + 1 < sizeof flag; p++)
            flag[n++] = *p == '_' ? '-' : (char)tolower((unsigned char)*p);
        flag[n] = 0;
        fprintf(stderr, "%s: warning: environment %s%s names no option of %s (there is no "
                "--%s; see --help): ignored\n", t->program, prefix, name, t->program, flag);
    }
}

/* DFLASH_<NAME> for every option, then DFLASH_<PROGRAM>_<NAME>, which wins: a shell that runs
 * several programs can give each its own value of an option they share by name (--layers is
 * the captured layers to the daemons, the decoder layers to dflash-mkmodel). */
static int load_env(const cfg_table *t, void *cfg)
{
    char scope[64];
    env_scope(t, scope, sizeof scope);
    warn_unknown_env(t, scope);
    const char *scopes[] = {"", scope};
    for (int k = 0; k < 2; k++) {
        for (size_t i = 0; i < t->n_options; i++) {
            const cfg_option *o = &t->options[i];
            char var[160];
            env_var_name(scopes[k], o->name, var, sizeof var);
            const char *v = getenv(var);
            if (!v) continue;
            char err[256];
            int r = set_value(o, cfg, v, err, sizeof err);
            if (r) {
                fprintf(stderr, "%s: environment %s: %s\n", t->program, var, err);
                return r;
            }
            mark_source(t, o, k ? CFG_FROM_PROGRAM_ENV : CFG_FROM_ENV, NULL, 0);
        }
    }
    return 0;
}

/* The config file named by the environment: DFLASH_<PROGRAM>_CONFIG, else DFLASH_CONFIG, as for
 * every option (a shell that runs several programs can give each its own file); *shared when it
 * is DFLASH_CONFIG's, every program's (load_file). NULL if neither. */
static const char *config_file_from_env(const cfg_table *t, bool *shared)
{
    char scope[64], var[160];
    env_scope(t, scope, sizeof scope);
    env_var_name(scope, "config", var, sizeof var);
    const char *file = getenv(var);
    *shared = !file && getenv("DFLASH_CONFIG");
    return file ? file : getenv("DFLASH_CONFIG");
}

static void set_defaults(const cfg_table *t, void *cfg)
{
    for (size_t i = 0; i < t->n_options; i++) {
        mark_source(t, &t->options[i], CFG_FROM_DEFAULT, NULL, 0);
        char err[256];
        int r = set_value(&t->options[i], cfg, t->options[i].def, err, sizeof err);
        /* A default outside its own range is a bug in the table. */
        if (r) {
            fprintf(stderr, "%s: bad default in option table: %s\n", t->program, err);
            abort();
        }
    }
}

/* The flags of argv, in order, over what the file and the environment gave; non-flags into
 * positional. A flag given twice warns, naming both values; the last one counts. */
static int load_flags(const cfg_table *t, void *cfg, int argc, char **argv, char **positional,
                      int max_positional, int *n_positional)
{
    bool *flagged = calloc(t->n_options ? t->n_options : 1, sizeof *flagged);
    if (!flagged) return DFLASH_ENOMEM;
    int rc = 0;
    for (int i = 1; i < argc && !rc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--config") == 0) {
            i++;
            continue;
        }
        if (strncmp(a, "--config=", 9) == 0 || strcmp(a, "--dump-config") == 0) continue;
        if (strncmp(a, "--", 2) != 0 || a[2] == 0) {
            if (strcmp(a, "--") == 0) continue;
            if (!positional || !n_positional || *n_positional >= max_positional) {
                fprintf(stderr, "%s: unexpected argument '%s' (see --help)\n", t->program, a);
                rc = DFLASH_EINVAL;
                break;
            }
            positional[(*n_positional)++] = argv[i];
            continue;
        }
        char name[128];
        const char *value = NULL;
        const char *eq = strchr(a + 2, '=');
        size_t nl = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
        if (nl >= sizeof name) nl = sizeof name - 1;
        memcpy(name, a + 2, nl);
        name[nl] = 0;
        const cfg_option *o = config_find(t, name);
        bool negated = false;
        if (!o && strncmp(name, "no-", 3) == 0) {
            o = config_find(t, name + 3);
            negated = o && o->type == CFG_BOOL;
            if (!negated) o = NULL;
        }
        if (!o) {
            fprintf(stderr, "%s: unknown option --%s (see --help)\n", t->program, name);
            rc = DFLASH_EINVAL;
            break;
        }
        if (eq && negated) { /* --no-fsync=true used to mean fsync true: refuse the riddle */
            fprintf(stderr, "%s: --no-%s takes no value (write --%s=BOOL)\n", t->program, o->name,
                    o->name);
            rc = DFLASH_EINVAL;
            break;
        }
        if (eq) value = eq + 1;
        else if (o->type == CFG_BOOL) value = negated ? "false" : "true";
        else if (i + 1 < argc) value = argv[++i];
        else {
            fprintf(stderr, "%s: --%s needs a value\n", t->program, o->name);
            rc = DFLASH_EINVAL;
            break;
        }
        char before[256], err[256];
        config_get(t, cfg, o->name, before, sizeof before);
        if ((rc = set_value(o, cfg, value, err, sizeof err))) {
            fprintf(stderr, "%s: --%s\n", t->program, err);
            break;
        }
        if (flagged[o - t->options])
            fprintf(stderr, "%s: warning: --%s is given twice ('%s', then '%s'): the last one "
                    "counts\n", t->program, o->name, before, value);
        flagged[o - t->options] = true;
        mark_source(t, o, CFG_FROM_FLAG, NULL, 0);
    }
    free(flagged);
    return rc;
}

static int load_sourced(const cfg_table *t, void *cfg, int argc, char **argv, char **positional,
                        int max_positional, int *n_positional);

int config_load(const cfg_table *t, void *cfg, int argc, char **argv, char **positional,
                int max_positional, int *n_positional)
{
    if (t->sources)
        return load_sourced(t, cfg, argc, argv, positional, max_positional, n_positional);
    /* a table without its own: sources for this load alone, so that a refusal (and the table's
     * check) says where a value came from, not "--log-level" of a DFLASH_LOG_LEVEL */
    cfg_table with_sources = *t;
    cfg_source sources[t->n_options ? t->n_options : 1];
    with_sources.sources = sources;
    return load_sourced(&with_sources, cfg, argc, argv, positional, max_positional,
                        n_positional);
}

static int load_sourced(const cfg_table *t, void *cfg, int argc, char **argv, char **positional,
                        int max_positional, int *n_positional)
{
    set_defaults(t, cfg);
    if (n_positional) *n_positional = 0;

    /* The config file comes first whatever its place on the command line. */
    bool shared = false;
    const char *file = config_file_from_env(t, &shared);
    bool help = false, dump = false, no_file = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--config") == 0 || strncmp(argv[i], "--config=", 9) == 0) {
            file = argv[i][8] == '=' ? argv[i] + 9 : i + 1 < argc ? argv[++i] : "";
            shared = false;
            no_file = !*file; /* `--config "$UNSET"` must not quietly mean the defaults */
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            help = true;
        } else if (strcmp(argv[i], "--dump-config") == 0) {
            dump = true;
        }
    }
    if (help) {
        config_print_help(t, stdout);
        return 1;
    }
    if (no_file) {
        fprintf(stderr, "%s: --config needs a file name\n", t->program);
        return DFLASH_EINVAL;
    }
    int rc;
    if (file && *file && (rc = load_file(t, cfg, file, shared))) return rc;
    if ((rc = load_env(t, cfg))) return rc;
    if ((rc = load_flags(t, cfg, argc, argv, positional, max_positional, n_positional)))
        return rc;
    char why[1024];
    /* every program's --log-level, checked here so that a dump refuses it as the start does */
    const cfg_option *lo = config_find(t, "log-level");
    log_level level;
    if (lo && lo->type == CFG_STRING && log_level_parse((const char *)cfg + lo->offset, &level)) {
        fprintf(stderr, "%s: bad %s: use debug, info, warn or error\n", t->program,
                config_source(t, cfg, "log-level", why, sizeof why));
        return DFLASH_EINVAL;
    }
    /* before a dump: it must be usable */
    if (t->check && t->check(t, cfg, why, sizeof why)) {
        fprintf(stderr, "%s: %s\n", t->program, why);
        return DFLASH_ECONFIG;
    }
    if (dump) {
        config_dump(t, cfg, stdout);
        return 1;
    }
    return 0;
}

int config_refuse(char *why, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (why && len) vsnprintf(why, len, fmt, ap);
    va_end(ap);
    return DFLASH_ECONFIG;
}

int config_parse_int_list(const char *s, int *out, int max, char *err, size_t errlen)
{
    int n = 0;
    for (const char *c = s; *c;) {
        char *end;
        errno = 0;
        long v = strtol(c, &end, 10);
        int len = (int)strcspn(c, ",");
        if (end == c || errno || v > INT32_MAX || (*end && *end != ',')) {
            if (err) err_fmt(err, errlen, "'%.*s' is not a number", len, c);
            return DFLASH_EINVAL;
        }
        if (v < 0) {
            if (err) err_fmt(err, errlen, "%ld is negative", v);
            return DFLASH_EINVAL;
        }
        if (n >= max) {
            if (err) err_fmt(err, errlen, "more than %d entries", max);
            return DFLASH_EINVAL;
        }
        out[n++] = (int)v;
        c = *end ? end + 1 : end;
    }
    return n;
}

/* The value of o in cfg for a message: numbers short (%g), a string quoted. */
static void value_text(const cfg_option *o, const void *cfg, char *buf, size_t len)
{
    const char *member = (const char *)cfg + o->offset;
    switch (o->type) {
    case CFG_INT:
        snprintf(buf, len, "%lld", (long long)*(const int64_t *)member);
        break;
    case CFG_DOUBLE:
        snprintf(buf, len, "%g", *(const double *)member);
        break;
    case CFG_BOOL:
        snprintf(buf, len, "%s", *(const bool *)member ? "true" : "false");
        break;
    case CFG_STRING:
        snprintf(buf, len, "'%s'", member);
        break;
    }
}

const char *config_source(const cfg_table *t, const void *cfg, const char *name, char *buf,
                          size_t len)
{
    const cfg_option *o = config_find(t, name);
    assert(o); /* the caller names one of its own options */
    cfg_source src = t->sources ? t->sources[o - t->options] : (cfg_source){CFG_FROM_FLAG, NULL, 0};
    char value[300], var[160], scope[64] = "";
    value_text(o, cfg, value, sizeof value);
    switch (src.from) {
    case CFG_FROM_ENV:
    case CFG_FROM_PROGRAM_ENV:
        if (src.from == CFG_FROM_PROGRAM_ENV) env_scope(t, scope, sizeof scope);
        env_var_name(scope, o->name, var, sizeof var);
        snprintf(buf, len, "%s=%s (environment)", var, value);
        break;
    case CFG_FROM_FILE:
        snprintf(buf, len, "%s %s (config file %s, line %d)", o->name, value, src.file, src.line);
        break;
    case CFG_FROM_FLAG:
    case CFG_FROM_DEFAULT:
        if (o->type == CFG_BOOL)
            snprintf(buf, len, "--%s%s", strcmp(value, "true") == 0 ? "" : "no-", o->name);
        else
            snprintf(buf, len, "--%s %s", o->name, value);
        if (src.from == CFG_FROM_DEFAULT) {
            size_t n = strlen(buf);
            snprintf(buf + n, len > n ? len - n : 0, " (default)");
        }
        break;
    }
    return buf;
}

void config_dump(const cfg_table *t, const void *cfg, FILE *out)
{
    for (size_t i = 0; i < t->n_options; i++) {
        const cfg_option *o = &t->options[i];
        char v[64]; /* numbers and bools; a string is printed whole, however long */
        if (o->type == CFG_STRING) {
            fprintf(out, "%s %s\n", o->name, (const char *)cfg + o->offset);
            continue;
        }
        config_get(t, cfg, o->name, v, sizeof v);
        fprintf(out, "%s %s\n", o->name, v);
    }
}

void config_print_help(const cfg_table *t, FILE *out)
{
    char scope[64];
    env_scope(t, scope, sizeof scope);
    fprintf(out, "usage: %s %s\n%s\n\noptions (flag; variable DFLASH_NAME, or DFLASH_%sNAME for "
            "this program alone; config-file key):\n", t->program,
            t->usage ? t->usage : "[options]", t->summary ? t->summary : "", scope);
    for (size_t i = 0; i < t->n_options; i++) {
        const cfg_option *o = &t->options[i];
        static const char *const types[] = {"INT", "NUM", "BOOL", "STR"};
        char flag[96];
        if (o->type == CFG_BOOL) /* no separate value: --NAME, --no-NAME or --NAME=BOOL */
            snprintf(flag, sizeof flag, "--[no-]%s", o->name);
        else
            snprintf(flag, sizeof flag, "--%s %s", o->name, types[o->type]);
        fprintf(out, "  %-34s %s (default: %s%s%s)\n", flag, o->help, *o->def ? o->def : "\"\"",
                o->live ? ", live" : "", "");
    }
    fprintf(out, "  %-34s %s\n", "--config FILE", "read `key value` lines from FILE first");
    fprintf(out, "  %-34s %s\n", "--dump-config", "print the effective configuration and exit");
    fprintf(out, "  %-34s %s\n", "--help", "print this help and exit");
}

int64_t config_env_int(const char *var, int64_t min, int64_t max, int64_t def)
{
    const char *v = getenv(var);
    if (!v || !*v) return def;
    char *end = NULL;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    if (!errno && end != v && !*end && n >= min && n <= max) return n;
    if (min == 0 && max == 1)
        LOG_ERROR("environment %s='%s': give 0 (off) or 1 (on), or unset it for the default",
                  var, v);
    else
        LOG_ERROR("environment %s='%s': give a whole number in [%lld, %lld], or unset it for the "
                  "default", var, v, (long long)min, (long long)max);
    exit(2);
}
