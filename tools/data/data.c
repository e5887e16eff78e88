/* dflash-data: converts JSONL {"input_ids": [...], "loss_mask": [...]} lines into a shard.
 *
 *   dflash-data --in train.jsonl --out train.shard --model /models/qwen3-8b
 *   dflash-data --in x.jsonl --out x.shard --vocab 512 --max-len 3072 --strict
 *
 * Each line is checked: one JSON object and nothing after it, input_ids a non-empty array of
 * integers inside the vocabulary (--vocab, or vocab_size of --model's config.json; unchecked when
 * neither is given), loss_mask an array of 0/1 of the same length, neither key given twice. A bad
 * line is reported with its line number and skipped (counted; the first --show-errors are
 * printed), or, with --strict, stops the conversion (exit 1, nothing written). A valid line of
 * more than --max-len tokens is left out whole (nothing here truncates: chat_to_jsonl.py --max-len
 * cuts ids and mask together) and counted apart from the bad ones, with its tokens' share of all
 * valid lines' tokens, in a WARN and the summary line; --strict stops at it too. Blank lines
 * (only whitespace) are ignored. A line longer than any record of --max-len tokens can be
 * (line_limit) is bad without being parsed, and an input whose first byte is '[' (a JSON array)
 * is refused before it is read (exit 3): cJSON holds ~28 times a line's size.
 * A valid line the drafter would train nothing on, with no anchor candidate (dflash_anchor.h:
 * no two loss tokens in a row; an all-zero loss mask among them), is left out too: the target
 * would run its forward over it every epoch for nothing. Such lines are counted, with their
 * token share, in one WARN and the summary line; when no line has an anchor, nothing is written.
 * At the end it prints the per-bucket length histogram for --buckets of the sequences written:
 * sequences, tokens and token share per bucket (the shares the broker's deficits use) and the
 * sequences longer than the last bound; when that is every sequence written, a WARN says so: a
 * target with these buckets would leave them all out and refuse the shard (exit 2).
 * While it reads, a progress line on stderr (progress.h: every 10 s, 0.2 s on a terminal) gives
 * the lines and megabytes read so far. The shard is written under a temporary name and renamed
 * when complete; an error, SIGINT or SIGTERM removes it (exit 1) and leaves an existing shard of
 * that name as it was. An --out that is the input file itself is refused (exit 2).
 * Exit status: 0 written, 1 error, 2 bad usage, 3 nothing written: no valid line (every line bad
 * or too long, the input empty or a JSON array; the first bad line's reason is printed), or no
 * valid line with an anchor (every loss_mask all 0: "no trainable token"; loss tokens never two
 * in a row: "no anchor").
 * One thread; memory: one line at a time, at most line_limit bytes of it.
 */
#include "batch_plan.h"
#include "config.h"
#include "dflash_anchor.h"
#include "fsutil.h"
#include "err.h"
#include "hf_config.h"
#include "log.h"
#include "progress.h"
#include "shard.h"
#include "signals.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct data_cfg {
    char in[1024];
    char out[1024];
    char model[1024];
    int64_t vocab;
    int64_t max_len;
    char buckets[256];
    bool strict;
    int64_t show_errors;
    char log_level[16];
} data_cfg;

#define STR_OPT(field) offsetof(data_cfg, field), sizeof(((data_cfg *)0)->field)
static const cfg_option data_options[] = {
    {"in", CFG_STRING, "", 1, 0, false, "input JSONL file ('-' for stdin)", STR_OPT(in)},
    {"out", CFG_STRING, "", 1, 0, false, "output shard file", STR_OPT(out)},
    {"model", CFG_STRING, "", 1, 0, false,
     "checkpoint directory whose config.json gives the vocabulary", STR_OPT(model)},
    {"vocab", CFG_INT, "0", 0, 1 << 30, false,
     "vocabulary size; ids must be below it (0: from --model, else unchecked)",
     offsetof(data_cfg, vocab), 0},
    {"max-len", CFG_INT, "3072", 1, 1 << 24, false,
     "longest sequence kept (tokens; a longer one is left out whole, counted in the summary); a "
     "line over 64 bytes a token + 4 MiB is skipped unparsed",
     offsetof(data_cfg, max_len), 0},
    {"buckets", CFG_STRING, "512,1024,2048,3072", 1, 0, false,
     "bucket upper bounds for the length histogram, as the target's (at most 16; a warning "
     "when every sequence written is longer than the last)",
     STR_OPT(buckets)},
    {"strict", CFG_BOOL, "false", 1, 0, false, "stop at the first bad line instead of skipping it",
     offsetof(data_cfg, strict), 0},
    {"show-errors", CFG_INT, "20", 0, 1e9, false, "bad lines reported individually",
     offsetof(data_cfg, show_errors), 0},
    {"log-level", CFG_STRING, "info", 1, 0, false, "debug, info, warn or error",
     STR_OPT(log_level)},
};
static const cfg_table data_table = {
    "dflash-data",
    "convert JSONL input_ids/loss_mask lines into a shard\n"
    "a line whose loss_mask never marks two tokens in a row (all 0, alternating, one-token\n"
    "replies) has no anchor, trains nothing, and is left out and counted\n"
    "exit status: 0 written, 1 error, 2 bad usage (or --out is the input file), 3 no line kept\n"
    "(every line bad or longer than --max-len, the input empty or a JSON array) or no line\n"
    "with an anchor (no trainable token, or no two in a row); nothing written",
    "[options]", data_options, sizeof data_options / sizeof data_options[0], NULL, NULL,
    NULL};

typedef struct line_buf {
    int32_t *ids;
    uint8_t *mask;
    size_t cap;
} line_buf;

/* The longest line worth parsing for --max-len tokens: 64 bytes a token (an id, its mask value,
 * separators and spaces take under 20) plus 4 MiB for other keys. A longer line cannot hold an
 * acceptable record, and cJSON needs ~28 times a line's size: it is skipped unparsed. */
static size_t line_limit(const data_cfg *c) {
    return (size_t)c->max_len * 64 + ((size_t)4 << 20);
}

/* Reads one line, without its newline, into *buf (grown as needed, at most limit + 1 bytes):
 * a line longer than limit bytes is read to its end but not kept (*too_long set, *buf holds its
 * first limit bytes). Returns the line's full length, or -1 at the end of the input. */
static long long read_line(FILE *in, char **buf, size_t *cap, size_t limit, bool *too_long) {
    long long n = 0;
    int ch;
    *too_long = false;
    while ((ch = getc_unlocked(in)) != EOF && ch != '\n') {
        if ((size_t)n >= limit) {
            *too_long = true;
            n++;
            continue;
        }
        if ((size_t)n + 1 >= *cap) {
            size_t nc = *cap ? *cap * 2 : 4096;
            if (nc > limit + 1) nc = limit + 1;
            char *b = realloc(*buf, nc);
            if (!b) LOG_FATAL("out of memory");
            *buf = b;
            *cap = nc;
        }
        (*buf)[n++] = (char)ch;
    }
    if (ch == EOF && n == 0) return -1;
    return n;
}

/* Skips the input's UTF-8 byte-order mark and leading whitespace, counting its newlines into
 * *lines, and returns its first other byte, left unread (EOF for a blank input). A first byte
 * 0xEF that starts no mark is returned with at most one byte after it left unread: that line is
 * no JSON object either way. */
static int first_byte(FILE *in, uint64_t *lines) {
    int ch = getc(in);
    if (ch == 0xEF) {
        int b2 = getc(in), b3 = b2 == 0xBB ? getc(in) : b2;
        if (b2 != 0xBB || b3 != 0xBF) {
            if (b3 != EOF) ungetc(b3, in);
            return 0xEF;
        }
        ch = getc(in);
    }
    for (; ch != EOF && isspace(ch); ch = getc(in))
        *lines += ch == '\n';
    if (ch != EOF) ungetc(ch, in);
    return ch;
}

/* Parses one line into lb; returns its length (any: the caller checks --max-len), or -1 with the
 * reason in why. */
static long parse_line(const char *text, size_t len, uint32_t vocab, line_buf *lb, char *why,
                       size_t whylen) {
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, len, &end, false);
    long n = -1;
    if (!j || !cJSON_IsObject(j)) {
        snprintf(why, whylen, "not a JSON object");
        goto out;
    }
    while (end < text + len && isspace((unsigned char)*end))
        end++;
    if (end < text + len) { /* e.g. two objects on one line: files joined without a newline */
        snprintf(why, whylen, "text after the JSON object at column %ld", (long)(end - text) + 1);
        goto out;
    }
    /* cJSON would take the first of two same-named keys, Python's json the last: neither */
    int n_ids_keys = 0, n_mask_keys = 0;
    for (const cJSON *e = j->child; e; e = e->next) {
        n_ids_keys += e->string && strcmp(e->string, "input_ids") == 0;
        n_mask_keys += e->string && strcmp(e->string, "loss_mask") == 0;
    }
    if (n_ids_keys > 1 || n_mask_keys > 1) {
        snprintf(why, whylen, "duplicate key \"%s\" (JSON readers differ on which one counts)",
                 n_ids_keys > 1 ? "input_ids" : "loss_mask");
        goto out;
    }
    cJSON *ids = cJSON_GetObjectItemCaseSensitive(j, "input_ids");
    cJSON *mask = cJSON_GetObjectItemCaseSensitive(j, "loss_mask");
    if (!cJSON_IsArray(ids)) {
        snprintf(why, whylen, "input_ids missing or not an array");
        goto out;
    }
    if (!cJSON_IsArray(mask)) {
        snprintf(why, whylen, "loss_mask missing or not an array");
        goto out;
    }
    long ni = cJSON_GetArraySize(ids), nm = cJSON_GetArraySize(mask);
    if (ni == 0) {
        snprintf(why, whylen, "input_ids is empty");
        goto out;
    }
    if (ni != nm) {
        snprintf(why, whylen, "length mismatch: %ld input_ids but %ld loss_mask entries", ni, nm);
        goto out;
    }
    if ((size_t)ni > lb->cap) {
        size_t nc = (size_t)ni * 2;
        int32_t *a = realloc(lb->ids, nc * sizeof *a);
        if (a) lb->ids = a;
        uint8_t *b = realloc(lb->mask, nc);
        if (b) lb->mask = b;
        if (!a || !b) LOG_FATAL("out of memory");
        lb->cap = nc;
    }
    long k = 0;
    for (cJSON *e = ids->child; e; e = e->next, k++) {
        double v = cJSON_IsNumber(e) ? e->valuedouble : NAN;
        if (!(v == floor(v))) {
            snprintf(why, whylen, "input_ids[%ld] is not an integer", k);
            goto out;
        }
        if (fabs(v) > 2147483647.0) {
            snprintf(why, whylen, "input_ids[%ld] = %.0f is outside the int32 range of token ids",
                     k, v);
            goto out;
        }
        if (v < 0) {
            snprintf(why, whylen, "token id %.0f at position %ld is negative", v, k);
            goto out;
        }
        if (vocab && v >= vocab) {
            snprintf(why, whylen, "token id %.0f at position %ld is outside the vocabulary of %u",
                     v, k, vocab);
            goto out;
        }
        lb->ids[k] = (int32_t)v;
    }
    k = 0;
    for (cJSON *e = mask->child; e; e = e->next, k++) {
        if (!cJSON_IsNumber(e) || (e->valuedouble != 0 && e->valuedouble != 1)) {
            if (cJSON_IsBool(e)) {
                lb->mask[k] = cJSON_IsTrue(e);
                continue;
            }
            snprintf(why, whylen, "loss_mask[%ld] is not 0 or 1", k);
            goto out;
        }
        lb->mask[k] = (uint8_t)e->valuedouble;
    }
    n = ni;
out:
    cJSON_Delete(j);
    return n;
}

/* The reason a write failed: the system's (e.g. "No space left on device") when there is one. */
static const char *write_error(const shard_writer *w, int rc) {
    int e = rc == DFLASH_EIO ? shard_writer_errno(w) : 0;
    return e ? strerror(e) : err_str(rc);
}

int main(int argc, char **argv) {
    /* SIGINT/SIGTERM stop the loop, so the temporary shard is removed, not left behind */
    volatile sig_atomic_t *stop = signals_install_stop_flag();
    data_cfg c;
    int rc = config_load(&data_table, &c, argc, argv, NULL, 0, NULL);
    if (rc) return rc > 0 ? 0 : 2;
    if (log_init_named("dflash-data", c.log_level) != 0) return 2;
    if (!c.in[0] || !c.out[0]) {
        LOG_ERROR("--in FILE.jsonl and --out FILE.shard are required");
        return 2;
    }
    /* the shard is renamed onto --out: that would replace a device node (as root, --out
     * /dev/null for a dry run replaced /dev/null with the shard) or a FIFO */
    struct stat st;
    if (stat(c.out, &st) == 0 && !S_ISREG(st.st_mode)) {
        LOG_ERROR("--out %s exists and is not a regular file: give the path of a shard file",
                  c.out);
        return 2;
    }
    uint32_t bounds[BATCH_PLAN_MAX_BUCKETS];
    char berr[256];
    int nb = batch_plan_parse_bounds(c.buckets, bounds, BATCH_PLAN_MAX_BUCKETS, berr, sizeof berr);
    if (nb < 0) {
        LOG_ERROR("--buckets '%s': %s", c.buckets, berr);
        return 2;
    }
    uint32_t vocab = (uint32_t)c.vocab;
    if (c.model[0]) {
        model_config mc;
        char err[512];
        if (hf_config_load(c.model, &mc, err, sizeof err)) {
            LOG_ERROR("%s", err);
            return 1;
        }
        if (vocab && vocab != (uint32_t)mc.vocab_size)
            LOG_WARN("--vocab %u differs from the model's %d; using --vocab", vocab, mc.vocab_size);
        if (!vocab) vocab = (uint32_t)mc.vocab_size;
    }
    if (!vocab) LOG_WARN("no --vocab or --model: token ids are not checked against a vocabulary");

    FILE *in = strcmp(c.in, "-") == 0 ? stdin : fopen(c.in, "r");
    if (!in) {
        LOG_ERROR("cannot open %s: %s", c.in, strerror(errno));
        return 1;
    }
    struct stat in_st; /* the input's size, for the progress line (0: a pipe) */
    bool in_known = fstat(fileno(in), &in_st) == 0;
    if (in_known && S_ISDIR(in_st.st_mode)) {
        LOG_ERROR("--in %s is a directory: give the JSONL file", c.in);
        fclose(in);
        return 2;
    }
    /* nor onto the input itself (./x and x, a hard link, stdin redirected from it): the shard
     * would replace the user's JSONL */
    if (in_known && stat(c.out, &st) == 0 && st.st_dev == in_st.st_dev &&
        st.st_ino == in_st.st_ino) {
        LOG_ERROR("--out %s is the input file %s: the shard would replace it; give the shard "
                  "another name",
                  c.out, c.in);
        if (in != stdin) fclose(in);
        return 2;
    }
    /* a JSON array (a .json file given by mistake) is one huge line: refused before reading it */
    uint64_t lineno = 0;
    if (first_byte(in, &lineno) == '[') {
        LOG_ERROR("%s is a JSON array; dflash-data reads JSONL, one object per line (convert it: "
                  "jq -c '.[]' FILE.json > FILE.jsonl); nothing written",
                  c.in);
        if (in != stdin) fclose(in);
        return 3;
    }
    fs_remove_stale_temps(c.out, "a partial shard"); /* an earlier run's, killed outright */
    shard_writer *w = shard_writer_new(c.out, vocab);
    if (!w) {
        if (errno == EBUSY)
            LOG_ERROR("cannot create %s: another dflash-data is writing it now (its temporary "
                      "%s.tmp.%ld is locked): wait for it, or write elsewhere", c.out, c.out,
                      (long)getpid());
        else
            LOG_ERROR("cannot create %s: %s", c.out, strerror(errno));
        return 1;
    }
    uint64_t seqs[BATCH_PLAN_MAX_BUCKETS + 1] = {0}, toks[BATCH_PLAN_MAX_BUCKETS + 1] = {0};
    uint64_t bad = 0, kept = 0, kept_tokens = 0, first_bad = 0; /* first_bad: first line not kept */
    uint64_t n_long = 0, long_tokens = 0, first_long = 0;       /* valid, longer than --max-len */
    /* valid lines left out for having no anchor (dflash_anchor.h): loss_mask all 0 (no_loss) or
     * loss tokens never two in a row (no_pair); their tokens, the first one's line */
    uint64_t no_loss = 0, no_pair = 0, no_anchor_tokens = 0, first_no_anchor = 0;
    uint32_t over_min = 0, over_max = 0; /* lengths of those written past the last bound */
    char first_why[256] = "";
    line_buf lb = {0};
    char *line = NULL;
    size_t cap = 0, limit = line_limit(&c);
    long long len;
    bool too_long;
    int status = 0;
    double in_mb = in_known && S_ISREG(in_st.st_mode) ? (double)in_st.st_size / 1e6 : 0;
    progress prog;
    progress_start(&prog, stderr);
    while (!*stop && (len = read_line(in, &line, &cap, limit, &too_long)) >= 0) {
        lineno++;
        if (progress_due(&prog)) {
            char mb[64] = ""; /* how far into the input: not known of a pipe */
            off_t at = ftello(in);
            if (at >= 0 && in_mb > 0)
                snprintf(mb, sizeof mb, " (%.0f of %.0f MB)", (double)at / 1e6, in_mb);
            else if (at >= 0)
                snprintf(mb, sizeof mb, " (%.0f MB)", (double)at / 1e6);
            progress_printf(&prog, "data: %llu lines read%s, %llu kept, %llu bad",
                            (unsigned long long)lineno, mb, (unsigned long long)kept,
                            (unsigned long long)bad);
        }
        char why[256];
        long n = -1;
        if (too_long) {
            snprintf(why, sizeof why,
                     "line too long: %lld bytes, more than a record of --max-len %lld tokens "
                     "takes (%zu); not parsed",
                     len, (long long)c.max_len, limit);
        } else {
            size_t l = (size_t)len;
            while (l && isspace((unsigned char)line[l - 1]))
                l--;
            if (l == 0) continue; /* blank: only whitespace */
            n = parse_line(line, l, vocab, &lb, why, sizeof why);
        }
        if (n > c.max_len) { /* valid but longer than the budget: counted apart from bad lines */
            snprintf(why, sizeof why, "too long: %ld tokens, --max-len is %lld", n,
                     (long long)c.max_len);
            if (!bad && !n_long) {
                first_bad = lineno;
                snprintf(first_why, sizeof first_why, "%s", why);
            }
            if (!n_long++) first_long = lineno;
            long_tokens += (uint64_t)n;
            if (c.strict) {
                progress_end(&prog);
                LOG_ERROR("%s:%llu: %s (--strict: stopping, nothing written)", c.in,
                          (unsigned long long)lineno, why);
                status = 1;
                break;
            }
            continue;
        }
        if (n < 0) {
            if (!bad++ && !n_long) {
                first_bad = lineno;
                snprintf(first_why, sizeof first_why, "%s", why);
            }
            progress_end(&prog); /* the line a terminal shows ends before a message */
            if (c.strict) {
                LOG_ERROR("%s:%llu: %s (--strict: stopping, nothing written)", c.in,
                          (unsigned long long)lineno, why);
                status = 1;
                break;
            }
            if ((int64_t)bad <= c.show_errors)
                LOG_WARN("%s:%llu: %s; line skipped", c.in, (unsigned long long)lineno, why);
            continue;
        }
        if (!dflash_anchor_any(lb.mask, (int)n)) { /* trains nothing: not worth a forward */
            bool any = false;
            for (long i = 0; i < n && !any; i++)
                any = lb.mask[i];
            if (!no_loss && !no_pair) first_no_anchor = lineno;
            no_loss += !any;
            no_pair += any;
            no_anchor_tokens += (uint64_t)n;
            continue;
        }
        rc = shard_writer_add(w, lb.ids, lb.mask, (uint32_t)n);
        if (rc) {
            progress_end(&prog);
            LOG_ERROR("cannot write %s: %s", c.out, write_error(w, rc));
            status = 1;
            break;
        }
        kept++;
        kept_tokens += (uint64_t)n;
        int b = 0;
        while (b < nb && (uint32_t)n > bounds[b])
            b++;
        if (b == nb && (!seqs[b] || (uint32_t)n < over_min)) over_min = (uint32_t)n;
        if (b == nb && (uint32_t)n > over_max) over_max = (uint32_t)n;
        seqs[b]++;
        toks[b] += (uint64_t)n;
    }
    int read_errno = errno; /* of the read that ended the loop, if one failed */
    progress_end(&prog);
    if (!status && *stop) {
        LOG_ERROR("interrupted at %s:%llu: nothing written", c.in, (unsigned long long)lineno);
        status = 1;
    }
    if (!status && ferror(in)) {
        LOG_ERROR("read error on %s: %s", c.in, strerror(read_errno));
        status = 1;
    }
    /* an empty shard only fails later, in the target ("batch plan: 0 sequences"); one of lines
     * without an anchor, at the drafter's end ("no step trained"), after the target had read
     * the data for every epoch */
    if (!status && kept == 0 && no_loss + no_pair == 0) {
        if (bad || n_long)
            LOG_ERROR("no line kept: of the %llu lines of %s, %llu are bad and %llu longer than "
                      "--max-len %lld (the first, line %llu: %s); nothing written",
                      (unsigned long long)(bad + n_long), c.in, (unsigned long long)bad,
                      (unsigned long long)n_long, (long long)c.max_len,
                      (unsigned long long)first_bad, first_why);
        else
            LOG_ERROR("no line kept: %s holds no JSONL line; nothing written", c.in);
        status = 3;
    } else if (!status && kept == 0 && no_pair == 0) {
        LOG_ERROR("no trainable token: every loss_mask is 0 (all %llu lines of %s that could "
                  "be kept: valid, within --max-len); nothing written. loss_mask is 1 on the "
                  "tokens to learn, the replies: "
                  "scripts/chat_to_jsonl.py --tokenizer MODEL --in CHATS.jsonl --out FILE.jsonl "
                  "marks each assistant reply so",
                  (unsigned long long)no_loss, c.in);
        status = 3;
    } else if (!status && kept == 0) {
        LOG_ERROR("no anchor: in none of the %llu lines of %s that could be kept (valid, within "
                  "--max-len) do two loss tokens come in a row (%llu with loss_mask all 0, %llu "
                  "whose loss tokens are never adjacent: alternating masks, one-token replies); "
                  "nothing written. A block starts where loss_mask marks a token and the next "
                  "one: mark every token of a reply, at least two in a row "
                  "(scripts/chat_to_jsonl.py --tokenizer MODEL --in CHATS.jsonl --out FILE.jsonl "
                  "marks each assistant reply so)",
                  (unsigned long long)(no_loss + no_pair), c.in, (unsigned long long)no_loss,
                  (unsigned long long)no_pair);
        status = 3;
    }
    if (in != stdin) fclose(in);
    free(line);
    free(lb.ids);
    free(lb.mask);
    if (!status && (rc = shard_writer_commit(w))) {
        LOG_ERROR("cannot write %s: %s", c.out, write_error(w, rc));
        status = 1;
    }
    shard_writer_destroy(&w);
    if (status) return status;

    /* shares of all valid lines' tokens, written or left out */
    double all_tokens = (double)(kept_tokens + long_tokens + no_anchor_tokens);
    if (bad)
        LOG_WARN("%llu of %llu lines skipped as bad", (unsigned long long)bad,
                 (unsigned long long)(kept + bad + n_long + no_loss + no_pair));
    if (n_long)
        LOG_WARN("%llu sequences longer than --max-len %lld left out (%llu tokens, %.1f%% of all "
                 "tokens; the first, line %llu): raise --max-len, or cut them when tokenizing "
                 "(scripts/chat_to_jsonl.py --max-len N keeps each conversation's first N tokens "
                 "and their loss mask)",
                 (unsigned long long)n_long, (long long)c.max_len, (unsigned long long)long_tokens,
                 100.0 * (double)long_tokens / all_tokens, (unsigned long long)first_long);
    if (no_loss + no_pair)
        LOG_WARN("%llu sequences without an anchor left out (%llu tokens, %.1f%% of all tokens; "
                 "the first, line %llu): %llu with loss_mask all 0, %llu whose loss tokens never "
                 "come two in a row (alternating masks, one-token replies); the drafter trains "
                 "nothing on them: a block starts where loss_mask marks a token and the next one",
                 (unsigned long long)(no_loss + no_pair), (unsigned long long)no_anchor_tokens,
                 100.0 * (double)no_anchor_tokens / all_tokens, (unsigned long long)first_no_anchor,
                 (unsigned long long)no_loss, (unsigned long long)no_pair);
    /* every sequence written has an anchor: when none fits the last bucket, a target with these
     * buckets has nothing to train on (it refuses the shard, exit 2) */
    if (seqs[nb] == kept)
        LOG_WARN("every one of the %llu sequences written is longer than the last of --buckets, "
                 "%u tokens (%u to %u tokens): a target with these buckets leaves them all out "
                 "and refuses the shard. Give the target's --buckets a last bound of at least %u "
                 "(and --token-budget at least that), or cut the sequences to fit when "
                 "tokenizing (scripts/chat_to_jsonl.py --max-len N)",
                 (unsigned long long)kept, bounds[nb - 1], over_min, over_max, over_min);
    printf("%s: %llu sequences, %llu tokens, %llu longer than --max-len %lld left out (%.1f%% of "
           "all tokens), %llu without an anchor left out (%.1f%% of all tokens), %llu bad lines "
           "skipped, vocab %u\n",
           c.out, (unsigned long long)kept, (unsigned long long)kept_tokens,
           (unsigned long long)n_long, (long long)c.max_len,
           100.0 * (double)long_tokens / all_tokens, (unsigned long long)(no_loss + no_pair),
           100.0 * (double)no_anchor_tokens / all_tokens, (unsigned long long)bad, vocab);
    printf("%-12s %10s %8s %12s %8s\n", "bucket", "seqs", "share", "tokens", "share");
    for (int b = 0; b <= nb; b++) {
        if (b == nb && !seqs[b]) break;
        char name[32];
        if (b < nb)
            snprintf(name, sizeof name, "<=%u", bounds[b]);
        else
            snprintf(name, sizeof name, ">%u", bounds[nb - 1]);
        printf("%-12s %10llu %7.1f%% %12llu %7.1f%%\n", name, (unsigned long long)seqs[b],
               kept ? 100.0 * seqs[b] / kept : 0.0, (unsigned long long)toks[b],
               kept_tokens ? 100.0 * toks[b] / kept_tokens : 0.0);
    }
    return 0;
}
