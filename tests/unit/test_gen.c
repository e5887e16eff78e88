/* test_gen: dflash-gen turns a tiny random Qwen3 target into a usable training set.
 *   - every line has input_ids and loss_mask of equal length, mask 0 on the prompt and 1 on the
 *     generated tokens, prompt lengths inside [prompt-min, prompt-max], max-new tokens added
 *     unless the continuation ended at eos, every id inside the vocabulary;
 *   - the same seed gives the same file, another seed another file;
 *   - greedy output does not depend on how prompts are packed (--batch 1 vs 3);
 *   - prompts from a JSONL file are kept as prefixes (truncated to prompt-max); a non-JSON line
 *     and a line with an id outside the vocabulary are skipped and do not count towards --n;
 *   - a missing model directory fails with a non-zero exit and leaves no output file;
 *   - --max-new far past max_position_embeddings (1e6) sizes its buffers for the model's
 *     positions, not for 1e6 tokens a sequence (gigabytes; the product overflowed an int): it
 *     runs within 2 GB of address space and each sequence stops at max_position_embeddings;
 *   - --out that is a directory (or ends in '/'), in a directory that does not exist, the
 *     --prompts file, or an existing file that is no earlier output (the model's config.json,
 *     a FIFO) is refused (exit 2) before the model loads (an earlier output is replaced, but
 *     not by a run that writes no sample: exit 1); a --prompts that is a directory is reported
 *     as unreadable (not as "no usable prompts"); a write that fails (a file size limit) names
 *     the file and reason;
 *   - a stop (SIGTERM) while generating exits 1 and leaves neither output nor temporary file.
 * The tiny checkpoint is written here with the safetensors writer and hf_config_write (the same
 * pieces dflash-mkmodel uses). dflash-gen is found beside this test's build folder
 * (<build>/tools/dflash-gen); when it is not built the test says so and fails.
 */
#include "check.h"
#include "err.h"
#include "hf_config.h"
#include "safetensors.h"
#include "test_files.h"
#include "test_stop.h"

#include <cjson/cJSON.h>
#include <libgen.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define VOCAB 48
#define EOS 5

static char gen_bin[PATH_MAX];

static int write_tiny_model(const char *dir)
{
    model_config c;
    hf_config_defaults(&c, MODEL_QWEN3);
    c.vocab_size = VOCAB;
    c.hidden_size = 32;
    c.intermediate_size = 48;
    c.num_layers = 2;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 8;
    c.max_position_embeddings = 256;
    c.eos_token_id = EOS;
    c.bos_token_id = -1;
    int rc = hf_config_write(dir, &c, "float32");
    if (rc) return rc;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    safetensors_writer *w = safetensors_writer_new(path);
    if (!w) return DFLASH_ENOMEM;
    size_t n = hf_weight_count(&c);
    float **data = calloc(n, sizeof *data);
    uint64_t rng = 12345;
    for (size_t i = 0; i < n && !rc; i++) {
        hf_weight_desc d;
        if (!hf_weight_nth(&c, i, &d)) {
            rc = DFLASH_EINTERNAL;
            break;
        }
        int64_t numel = d.ndim == 1 ? d.shape[0] : d.shape[0] * d.shape[1];
        data[i] = malloc((size_t)numel * sizeof(float));
        for (int64_t k = 0; k < numel; k++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            double u = (double)(rng >> 11) * 0x1.0p-53 - 0.5;
            data[i][k] = d.is_norm ? 1.0f : d.is_bias ? 0.0f : (float)(u * 0.8);
        }
        rc = safetensors_writer_add(w, d.name, SAFETENSORS_F32, d.ndim, d.shape, data[i]);
    }
    if (!rc) rc = safetensors_writer_commit(w);
    safetensors_writer_destroy(&w);
    for (size_t i = 0; i < n; i++) free(data[i]);
    free(data);
    return rc;
}

/* Runs dflash-gen with args; returns its exit status (-1 when it did not exit normally). */
static int run_gen(const char *args)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' --log-level warn %s 2>/dev/null", gen_bin, args);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Runs `LIMITS; dflash-gen ARGS` in a shell (LIMITS: ulimit and trap commands), its stderr in
 * log; returns its exit status. */
static int run_gen_limited(const char *limits, const char *args, const char *log)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "bash -c \"%s; exec '%s' --log-level warn %s\" 2>'%s'", limits,
             gen_bin, args, log);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    if (buf && fread(buf, 1, (size_t)len, f) != (size_t)len) len = 0;
    if (buf) buf[len] = 0;
    fclose(f);
    return buf;
}

/* The log at path holds what. */
static bool log_has(const char *path, const char *what)
{
    char *text = read_all(path);
    bool has = text && strstr(text, what);
    if (!has) fprintf(stderr, "%s lacks \"%s\":\n%s\n", path, what, text ? text : "(none)");
    free(text);
    return has;
}

typedef struct sample {
    int ids[512], mask[512];
    int len, prompt_len;
} sample;

/* Parses and checks every line of a dflash-gen output file; returns the number of lines. */
static int check_file(const char *path, int pmin, int pmax, int max_new, sample *keep,
                      int keep_n)
{
    char *text = read_all(path);
    CHECK(text != NULL);
    if (!text) return 0;
    int lines = 0;
    for (char *save = NULL, *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        cJSON *j = cJSON_Parse(l);
        CHECK(j != NULL);
        if (!j) continue;
        const cJSON *ids = cJSON_GetObjectItem(j, "input_ids");
        const cJSON *mask = cJSON_GetObjectItem(j, "loss_mask");
        int n = cJSON_GetArraySize(ids);
        CHECK(cJSON_IsArray(ids) && cJSON_IsArray(mask) && n == cJSON_GetArraySize(mask));
        sample s = {.len = n < 512 ? n : 512};
        bool in_vocab = true, shape_ok = true;
        int zeros = 0, ones = 0;
        for (int t = 0; t < s.len; t++) {
            s.ids[t] = cJSON_GetArrayItem(ids, t)->valueint;
            s.mask[t] = cJSON_GetArrayItem(mask, t)->valueint;
            in_vocab &= s.ids[t] >= 0 && s.ids[t] < VOCAB;
            if (s.mask[t] == 0) {
                zeros++;
                shape_ok &= ones == 0; /* prompt first, then generated */
            } else {
                ones++;
                shape_ok &= s.mask[t] == 1;
            }
        }
        s.prompt_len = zeros;
        CHECK(in_vocab);
        CHECK(shape_ok);
        CHECK(zeros >= pmin && zeros <= pmax);
        bool at_eos = ones > 0 && s.ids[s.len - 1] == EOS;
        CHECK(ones == max_new || (at_eos && ones >= 1 && ones < max_new));
        if (keep && lines < keep_n) keep[lines] = s;
        lines++;
        cJSON_Delete(j);
    }
    free(text);
    return lines;
}

static bool same_file(const char *a, const char *b)
{
    char *x = read_all(a), *y = read_all(b);
    bool same = x && y && strcmp(x, y) == 0;
    free(x);
    free(y);
    return same;
}

int main(int argc, char **argv)
{
    (void)argc;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = 0;
    snprintf(gen_bin, sizeof gen_bin, "%s/../tools/dflash-gen", dirname(exe));
    if (access(gen_bin, X_OK)) {
        fprintf(stderr, "%s: %s is not built\n", argv[0], gen_bin);
        CHECK(0);
        CHECK_DONE();
    }

    char dir[] = "/tmp/dflash-test-gen-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char model[PATH_MAX], a[PATH_MAX], b[PATH_MAX], c[PATH_MAX], args[8192];
    snprintf(model, sizeof model, "%s/model", dir);
    snprintf(args, sizeof args, "mkdir -p '%s'", model);
    CHECK_EQ_INT(system(args), 0);
    CHECK_EQ_INT(write_tiny_model(model), 0);
    snprintf(a, sizeof a, "%s/a.jsonl", dir);
    snprintf(b, sizeof b, "%s/b.jsonl", dir);
    snprintf(c, sizeof c, "%s/c.jsonl", dir);

    /* sampled training data: shape, determinism, seed dependence */
    const char *common = "--n 7 --prompt-min 3 --prompt-max 9 --max-new 12 --batch 3";
    snprintf(args, sizeof args, "--model '%s' --out '%s' %s --seed 7", model, a, common);
    CHECK_EQ_INT(run_gen(args), 0);
    CHECK_EQ_INT(check_file(a, 3, 9, 12, NULL, 0), 7);
    snprintf(args, sizeof args, "--model '%s' --out '%s' %s --seed 7", model, b, common);
    CHECK_EQ_INT(run_gen(args), 0);
    CHECK(same_file(a, b));
    snprintf(args, sizeof args, "--model '%s' --out '%s' %s --seed 8", model, c, common);
    CHECK_EQ_INT(run_gen(args), 0);
    CHECK_EQ_INT(check_file(c, 3, 9, 12, NULL, 0), 7);
    CHECK(!same_file(a, c));

    /* greedy: independent of packing */
    snprintf(args, sizeof args, "--model '%s' --out '%s' %s --seed 9 --greedy --batch 1", model,
             a, "--n 5 --prompt-min 2 --prompt-max 6 --max-new 10");
    CHECK_EQ_INT(run_gen(args), 0);
    snprintf(args, sizeof args, "--model '%s' --out '%s' %s --seed 9 --greedy --batch 3", model,
             b, "--n 5 --prompt-min 2 --prompt-max 6 --max-new 10");
    CHECK_EQ_INT(run_gen(args), 0);
    CHECK_EQ_INT(check_file(b, 2, 6, 10, NULL, 0), 5);
    CHECK(same_file(a, b));

    /* prompts from a file: kept as prefixes, bad lines skipped */
    char prompts[PATH_MAX];
    snprintf(prompts, sizeof prompts, "%s/prompts.jsonl", dir);
    FILE *f = fopen(prompts, "w");
    CHECK(f != NULL);
    if (f) {
        fputs("{\"input_ids\": [1, 2, 3, 4]}\n", f);
        fputs("not json\n", f);
        fputs("{\"input_ids\": [7, 999]}\n", f); /* outside the vocabulary */
        fputs("{\"input_ids\": [40, 41], \"loss_mask\": [0, 0]}\n", f);
        fclose(f);
    }
    snprintf(args, sizeof args,
             "--model '%s' --out '%s' --prompts '%s' --n 0 --max-new 6 --greedy --batch 4",
             model, c, prompts);
    CHECK_EQ_INT(run_gen(args), 0);
    sample s[2];
    CHECK_EQ_INT(check_file(c, 2, 4, 6, s, 2), 2);
    CHECK(s[0].prompt_len == 4 && s[0].ids[0] == 1 && s[0].ids[3] == 4);
    CHECK(s[1].prompt_len == 2 && s[1].ids[0] == 40 && s[1].ids[1] == 41);
    /* skipped lines do not count towards --n; long prompts are truncated to --prompt-max */
    snprintf(args, sizeof args,
             "--model '%s' --out '%s' --prompts '%s' --n 2 --prompt-max 3 --max-new 4 --greedy",
             model, c, prompts);
    CHECK_EQ_INT(run_gen(args), 0);
    CHECK_EQ_INT(check_file(c, 2, 3, 4, s, 2), 2);
    CHECK(s[0].prompt_len == 3 && s[0].ids[2] == 3);
    CHECK(s[1].prompt_len == 2 && s[1].ids[0] == 40);

    /* a missing model directory is an error, and leaves no output */
    snprintf(args, sizeof args, "--model '%s/none' --out '%s/none.jsonl' --n 2", dir, dir);
    CHECK(run_gen(args) != 0);
    snprintf(args, sizeof args, "%s/none.jsonl", dir);
    CHECK(access(args, F_OK) != 0);

    /* a config.json dflash-gen cannot use is named with its problem, without the hint for a
     * missing directory ("is --model a Hugging Face checkpoint directory?"), which misled */
    char bad_dir[PATH_MAX], cmd[2 * PATH_MAX + 256];
    snprintf(bad_dir, sizeof bad_dir, "%s/yarn", dir);
    CHECK(mkdir(bad_dir, 0755) == 0);
    snprintf(cmd, sizeof cmd, "%s/config.json", bad_dir);
    FILE *cf = fopen(cmd, "w");
    CHECK(cf != NULL);
    if (cf) {
        fputs("{\"model_type\": \"qwen3\", \"rope_scaling\": {\"rope_type\": \"yarn\"}}\n", cf);
        fclose(cf);
    }
    snprintf(cmd, sizeof cmd, "'%s' --model '%s' --out '%s/yarn.jsonl' --n 1 2>'%s/yarn.err'",
             gen_bin, bad_dir, dir, dir);
    CHECK(system(cmd) != 0);
    snprintf(cmd, sizeof cmd, "%s/yarn.err", dir);
    char *said = read_all(cmd);
    CHECK(said && strstr(said, "config.json") && !strstr(said, "checkpoint directory?"));
    free(said);

    /* --max-new 1e6 with max_position_embeddings 256: buffers for 256 positions a sequence
     * (they were sized for 1e6 tokens each, gigabytes, refused under this address-space limit;
     * not under ASan, whose shadow memory alone reserves terabytes of address space: the
     * Release pass checks the limit, this one the output). OpenBLAS starts a thread per core
     * when it loads, whatever --threads says, each with its stack, malloc arena and buffer
     * (~100 MB of address space): on a 16-core machine that alone took the limit, an
     * allocation failed, and dflash-gen spun, deaf to SIGTERM, until ctest's timeout (seen on
     * the GPU machine; 2 cores here never reach it). One OpenBLAS thread: the limit is ours. */
#if defined(__SANITIZE_ADDRESS__)
    const char *address_space_limit = ":";
#else
    const char *address_space_limit = "export OPENBLAS_NUM_THREADS=1; ulimit -v 2000000";
#endif
    char huge[PATH_MAX], huge_log[PATH_MAX];
    snprintf(huge, sizeof huge, "%s/huge.jsonl", dir);
    snprintf(huge_log, sizeof huge_log, "%s/huge.log", dir);
    snprintf(args, sizeof args,
             "--model '%s' --out '%s' --n 3 --batch 3 --greedy --max-new 1000000 --threads 1",
             model, huge);
    CHECK_EQ_INT(run_gen_limited(address_space_limit, args, huge_log), 0);
    char *text = read_all(huge);
    int lines = 0;
    for (char *save = NULL, *l = text ? strtok_r(text, "\n", &save) : NULL; l;
         l = strtok_r(NULL, "\n", &save), lines++) {
        cJSON *j = cJSON_Parse(l);
        const cJSON *ids = cJSON_GetObjectItem(j, "input_ids");
        int n = cJSON_GetArraySize(ids);
        int last = n ? cJSON_GetArrayItem(ids, n - 1)->valueint : -1;
        CHECK(n == 256 || (n < 256 && last == EOS)); /* max_position_embeddings of the model */
        cJSON_Delete(j);
    }
    free(text);
    CHECK_EQ_INT(lines, 3);

    /* --out checked before the model loads: a directory, a directory that does not exist */
    char out_log[PATH_MAX];
    snprintf(out_log, sizeof out_log, "%s/out.log", dir);
    snprintf(args, sizeof args, "--model '%s' --out '%s' --n 2", model, dir);
    CHECK_EQ_INT(run_gen_limited(":", args, out_log), 2);
    CHECK(log_has(out_log, "is a directory"));
    snprintf(args, sizeof args, "--model '%s' --out '%s/none/x.jsonl' --n 2", model, dir);
    CHECK_EQ_INT(run_gen_limited(":", args, out_log), 2);
    CHECK(log_has(out_log, "cannot write into") && log_has(out_log, "No such file"));
    /* a directory's name that does not exist ("none/": it was taken for "none" in ".", and the
     * run failed once the model had loaded, exit 1) */
    snprintf(args, sizeof args, "--model '%s' --out '%s/none/' --n 2", model, dir);
    CHECK_EQ_INT(run_gen_limited(":", args, out_log), 2);
    CHECK(log_has(out_log, "is a directory"));
    /* an existing file that is no earlier output (a mistyped --out naming the model's
     * config.json) is kept, exit 2; an earlier output (huge.jsonl, above) is replaced */
    char cfg_path[PATH_MAX + 16];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", model);
    size_t cfg_len = 0;
    char *cfg_before = test_slurp(cfg_path, &cfg_len);
    snprintf(args, sizeof args, "--model '%s' --out '%s' --n 2", model, cfg_path);
    CHECK_EQ_INT(run_gen_limited(":", args, out_log), 2);
    CHECK(log_has(out_log, "exists and is not an earlier dflash-gen output"));
    size_t cfg_after_len = 0;
    char *cfg_after = test_slurp(cfg_path, &cfg_after_len);
    CHECK(cfg_after && cfg_after_len == cfg_len && memcmp(cfg_before, cfg_after, cfg_len) == 0);
    free(cfg_before), free(cfg_after);
    /* prompts that all leave no room below max_position_embeddings (256): nothing written,
     * exit 1, the earlier output kept (it was replaced by an empty file, exit 0) */
    size_t huge_len = 0;
    char *huge_before = test_slurp(huge, &huge_len);
    snprintf(args, sizeof args, "--model '%s' --out '%s' --n 2 --prompt-min 256 "
             "--prompt-max 260", model, huge);
    CHECK_EQ_INT(run_gen_limited(":", args, out_log), 1);
    CHECK(log_has(out_log, "no sample written"));
    size_t huge_after_len = 0;
    char *huge_after = test_slurp(huge, &huge_after_len);
    CHECK(huge_before && huge_after && huge_len > 0 && huge_after_len == huge_len &&
          memcmp(huge_before, huge_after, huge_len) == 0);
    free(huge_before), free(huge_after);
    snprintf(args, sizeof args, "--model '%s' --out '%s' --n 2", model, huge);
    CHECK_EQ_INT(run_gen_limited(":", args, out_log), 0);
    /* the --prompts file itself (an earlier output read as prompts: it looks like one), and a
     * FIFO (opened to look at it, it hung the run before the model loaded): kept, exit 2 */
    snprintf(args, sizeof args, "--model '%s' --prompts '%s' --out '%s' --n 0", model, huge, huge);
    CHECK_EQ_INT(run_gen_limited(":", args, out_log), 2);
    CHECK(log_has(out_log, "is the --prompts file"));
    char fifo[PATH_MAX + 16];
    snprintf(fifo, sizeof fifo, "%s/fifo.jsonl", dir);
    CHECK(mkfifo(fifo, 0600) == 0);
    snprintf(args, sizeof args, "--model '%s' --out '%s' --n 2", model, fifo);
    CHECK_EQ_INT(run_gen_limited(":", args, out_log), 2); /* it hung: ctest times it out */
    CHECK(log_has(out_log, "exists and is not an earlier dflash-gen output"));
    unlink(fifo);
    /* a --prompts that cannot be read is said so, not "no usable prompts" */
    snprintf(args, sizeof args, "--model '%s' --out '%s' --prompts '%s' --n 0", model, c, dir);
    CHECK_EQ_INT(run_gen_limited(":", args, out_log), 1);
    CHECK(log_has(out_log, "cannot read prompts") && log_has(out_log, "Is a directory"));
    /* a write that fails (EFBIG past a 1 KiB file size limit) names the file and the reason;
     * it used to exit 1 without a word */
    snprintf(args, sizeof args, "--model '%s' --out '%s' --n 40 --max-new 12 --threads 1", model,
             c);
    CHECK_EQ_INT(run_gen_limited("trap '' XFSZ; ulimit -f 1", args, out_log), 1);
    CHECK(log_has(out_log, "cannot write") && log_has(out_log, "File too large"));
    CHECK(!test_dir_has(dir, ".tmp."));

    /* SIGTERM while generating: exit 1, neither the output nor its temporary file (which used
     * to stay behind) */
    char stopped[PATH_MAX], log[PATH_MAX];
    snprintf(stopped, sizeof stopped, "%s/stopped.jsonl", dir);
    snprintf(log, sizeof log, "%s/stopped.log", dir);
    char *argv_stop[] = {gen_bin,  "--model",   model, "--out",       stopped, "--n",
                         "100000", "--threads", "1",   "--log-level", "warn",  NULL};
    CHECK_EQ_INT(test_stop_while_writing(argv_stop, dir, ".tmp.", log), 1);
    CHECK(!test_dir_has(dir, ".tmp."));
    CHECK(access(stopped, F_OK) != 0);

    if (getenv("DFLASH_TEST_KEEP")) { /* for a look at the files */
        printf("kept %s\n", dir);
    } else {
        snprintf(args, sizeof args, "rm -rf '%s'", dir);
        CHECK_EQ_INT(system(args), 0);
    }
    CHECK_DONE();
}
