/* test_mkmodel: runs dflash-mkmodel (../tools/dflash-mkmodel from the ctest working directory,
 * or $DFLASH_MKMODEL_BIN) for each family and checks that what it writes is what the target
 * loader expects: config.json loads back with the asked-for architecture, the safetensors hold
 * exactly the HF tensor names with the right shapes, values look like the HF init, the same seed
 * gives the same bytes, a sharded checkpoint holds the same values as a single file, a stop
 * (SIGTERM) while writing leaves no temporary file and no shard behind and exits 1, a failed
 * write names the system's reason (and leaves no shard of the run), an old model's shards do
 * not outlive its replacement, --out naming a file is refused (exit 2), a --hidden that
 * --heads does not divide is refused unless
 * --head-dim is given, a non-empty --out that mkmodel did not write is refused and left as it
 * was unless --force (a model of its own is replaced: see "rewriting"). */
#include "check.h"
#include "hf_config.h"
#include "safetensors.h"
#include "test_files.h"
#include "test_stop.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[256], bin[512];

static int run(const char *args) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s --log-level warn >%s/out 2>&1", bin, args, dir);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Opens DIR/name, checks the tensor set against the config; returns the open checkpoint. */
static safetensors *check_model(const char *name, model_config *mc) {
    char path[400], err[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    CHECK_EQ_INT(hf_config_load(path, mc, err, sizeof err), 0);
    safetensors *st = safetensors_open(path, NULL, err, sizeof err);
    CHECK(st != NULL);
    if (!st) {
        fprintf(stderr, "  %s\n", err);
        return NULL;
    }
    size_t n = hf_weight_count(mc);
    CHECK_EQ_INT(safetensors_count(st), n);
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        hf_weight_desc d;
        hf_weight_nth(mc, i, &d);
        if (safetensors_expect(st, d.name, d.ndim, d.shape, NULL, err, sizeof err)) {
            bad++;
            fprintf(stderr, "  %s\n", err);
        }
    }
    CHECK_EQ_INT(bad, 0);
    return st;
}

static double std_of(const safetensors *st, const char *name, double *mean) {
    const safetensors_tensor *t = safetensors_find(st, name);
    if (!t) return -1;
    float *v = malloc((size_t)t->numel * sizeof *v);
    safetensors_to_f32(t, v);
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < t->numel; i++) {
        s += v[i];
        s2 += (double)v[i] * v[i];
    }
    free(v);
    *mean = s / (double)t->numel;
    return sqrt(s2 / (double)t->numel - *mean * *mean);
}

static bool same_bytes(const char *a, const char *b) {
    char cmd[1000];
    snprintf(cmd, sizeof cmd, "cmp -s %s/%s %s/%s", dir, a, dir, b);
    return system(cmd) == 0;
}

int main(void) {
    const char *env = getenv("DFLASH_MKMODEL_BIN");
    snprintf(bin, sizeof bin, "%s", env ? env : "../tools/dflash-mkmodel");
    CHECK(access(bin, X_OK) == 0);
    if (access(bin, X_OK) != 0) {
        fprintf(stderr, "dflash-mkmodel not found at %s (set DFLASH_MKMODEL_BIN)\n", bin);
        CHECK_DONE();
    }
    snprintf(dir, sizeof dir, "/tmp/dflash-test-mkmodel-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    char args[1200];
    model_config mc;
    double mean, sd;

    /* qwen3 tiny, bf16 */
    snprintf(args, sizeof args, "--preset tiny --family qwen3 --seed 5 --out %s/q3", dir);
    CHECK_EQ_INT(run(args), 0);
    safetensors *st = check_model("q3", &mc);
    CHECK(mc.family == MODEL_QWEN3 && mc.qk_norm && mc.hidden_size == 64 && mc.num_layers == 4 &&
          mc.vocab_size == 512 && mc.num_kv_heads == 2 && mc.head_dim == 16);
    CHECK(st && safetensors_find(st, "lm_head.weight") &&
          safetensors_find(st, "lm_head.weight")->dtype == SAFETENSORS_BF16);
    sd = std_of(st, "model.embed_tokens.weight", &mean);
    CHECK_NEAR(sd, 0.02, 0.002);
    CHECK_NEAR(mean, 0, 0.002);
    sd = std_of(st, "model.layers.2.self_attn.k_norm.weight", &mean);
    CHECK_NEAR(mean, 1, 0);
    CHECK_NEAR(sd, 0, 0);
    safetensors_close(&st);

    /* same seed: same bytes; other seed: different */
    snprintf(args, sizeof args, "--preset tiny --family qwen3 --seed 5 --out %s/q3b", dir);
    CHECK_EQ_INT(run(args), 0);
    CHECK(same_bytes("q3/model.safetensors", "q3b/model.safetensors"));
    CHECK(same_bytes("q3/config.json", "q3b/config.json"));
    snprintf(args, sizeof args, "--preset tiny --family qwen3 --seed 6 --out %s/q3c", dir);
    CHECK_EQ_INT(run(args), 0);
    CHECK(!same_bytes("q3/model.safetensors", "q3c/model.safetensors"));

    /* qwen2 tied f32 with norm jitter: biases present, no lm_head, norms jittered */
    snprintf(args, sizeof args,
             "--family qwen2 --tie --dtype f32 --norm-jitter 0.1 --hidden 96 --heads 6 "
             "--kv-heads 2 --out %s/q2",
             dir);
    CHECK_EQ_INT(run(args), 0);
    st = check_model("q2", &mc);
    CHECK(mc.family == MODEL_QWEN2 && mc.qkv_bias && mc.tie_word_embeddings && mc.head_dim == 16);
    CHECK(st && !safetensors_find(st, "lm_head.weight"));
    CHECK(st && safetensors_find(st, "model.layers.0.self_attn.v_proj.bias"));
    sd = std_of(st, "model.layers.0.post_attention_layernorm.weight", &mean);
    CHECK(sd > 0.05 && sd < 0.15);
    CHECK_NEAR(mean, 1, 0.05);
    safetensors_close(&st);

    /* llama with rope scaling, f16, sharded vs single file: same values */
    snprintf(args, sizeof args,
             "--family llama --llama3-rope-scaling --rope-original-max 64 --vocab 4096 "
             "--dtype f16 --seed 9 --out %s/ll1",
             dir);
    CHECK_EQ_INT(run(args), 0);
    snprintf(args, sizeof args,
             "--family llama --llama3-rope-scaling --rope-original-max 64 --vocab 4096 "
             "--dtype f16 --seed 9 --shard-size-mb 1 --out %s/ll2",
             dir);
    CHECK_EQ_INT(run(args), 0);
    char p[400];
    snprintf(p, sizeof p, "%s/ll2/model-00002-of-00002.safetensors", dir);
    CHECK(access(p, F_OK) == 0);
    safetensors *a = check_model("ll1", &mc);
    CHECK(mc.family == MODEL_LLAMA && mc.rope_scaling.enabled &&
          mc.rope_scaling.original_max_position_embeddings == 64 && mc.rope_scaling.factor == 8);
    safetensors *b = check_model("ll2", &mc);
    int differ = 0;
    for (size_t i = 0; a && b && i < safetensors_count(a); i++) {
        const safetensors_tensor *x = safetensors_at(a, i), *y = safetensors_find(b, x->name);
        if (!y || x->bytes != y->bytes || memcmp(x->data, y->data, x->bytes) != 0) differ++;
    }
    CHECK_EQ_INT(differ, 0);
    safetensors_close(&a);
    safetensors_close(&b);

    /* rewriting a directory replaces the old checkpoint: sharded over single, single over
     * sharded (a stale index would otherwise win over the new file) */
    snprintf(args, sizeof args, "--family qwen2 --vocab 4096 --shard-size-mb 1 --out %s/ll1", dir);
    CHECK_EQ_INT(run(args), 0);
    snprintf(p, sizeof p, "%s/ll1/model.safetensors", dir);
    CHECK(access(p, F_OK) != 0);
    a = check_model("ll1", &mc);
    CHECK(mc.family == MODEL_QWEN2);
    safetensors_close(&a);
    snprintf(args, sizeof args, "--family qwen3 --out %s/ll1", dir);
    CHECK_EQ_INT(run(args), 0);
    snprintf(p, sizeof p, "%s/ll1/model.safetensors.index.json", dir);
    CHECK(access(p, F_OK) != 0);
    /* and the old shards: without an index a loader reads every *.safetensors (they stayed) */
    snprintf(p, sizeof p, "%s/ll1", dir);
    CHECK(!test_dir_has(p, "-of-"));
    a = check_model("ll1", &mc);
    CHECK(mc.family == MODEL_QWEN3);
    safetensors_close(&a);

    /* SIGTERM while writing: exit 1, no temporary file (it used to stay, as large as the file
     * being written) and, sharded, no shard this run had finished */
    char stopped[400], log[400];
    snprintf(stopped, sizeof stopped, "%s/stopped", dir);
    snprintf(log, sizeof log, "%s/stopped.log", dir);
    CHECK(mkdir(stopped, 0755) == 0);
    char *single[] = {bin,    "--vocab",    "65536", "--hidden",   "1024", "--heads",
                      "8",    "--kv-heads", "4",     "--head-dim", "128",  "--intermediate",
                      "1024", "--layers",   "1",     "--dtype",    "f32",  "--threads",
                      "1",    "--out",      stopped, NULL};
    CHECK_EQ_INT(test_stop_while_writing(single, stopped, ".tmp.", log), 1);
    CHECK(!test_dir_has(stopped, ".tmp."));
    CHECK(!test_dir_has(stopped, "safetensors"));
    char *sharded[] = {bin,    "--vocab",         "512", "--hidden",   "1024",  "--heads",
                       "8",    "--kv-heads",      "4",   "--head-dim", "128",   "--intermediate",
                       "4096", "--layers",        "2",   "--dtype",    "f32",   "--threads",
                       "1",    "--shard-size-mb", "8",   "--out",      stopped, NULL};
    CHECK_EQ_INT(test_stop_while_writing(sharded, stopped, "-00002-of-", log), 1);
    CHECK(!test_dir_has(stopped, ".tmp."));
    CHECK(!test_dir_has(stopped, "safetensors"));

    /* a write that fails (past a file size limit here, a full disk alike) says why; it used
     * to be "input/output error" */
    char cmd[2048], outp[400];
    snprintf(cmd, sizeof cmd,
             "trap '' XFSZ; ulimit -f 4 && %s --preset tiny --out %s/full >%s/out 2>&1", bin, dir,
             dir);
    int ws = system(cmd);
    CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 1);
    snprintf(outp, sizeof outp, "%s/out", dir);
    char *out = test_slurp(outp, NULL), want[200];
    snprintf(want, sizeof want, "model.safetensors: %s", strerror(EFBIG));
    CHECK(out && strstr(out, want) != NULL);
    if (out && !strstr(out, want)) fprintf(stderr, "output was:\n%s\n", out);
    free(out);
    /* sharded, a later shard's failure takes this run's earlier shards with it (a full disk
     * kept them: GBs of no checkpoint) */
    snprintf(cmd, sizeof cmd,
             "trap '' XFSZ; ulimit -f 1600 && %s --hidden 256 --vocab 512 --intermediate 1024 "
             "--shard-size-mb 1 --out %s/fullsh >%s/out 2>&1", bin, dir, dir);
    ws = system(cmd);
    CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 1);
    snprintf(p, sizeof p, "%s/fullsh", dir);
    CHECK(!test_dir_has(p, "safetensors"));
    /* --out an existing file: the flags, exit 2 (it was 1) */
    snprintf(cmd, sizeof cmd, "touch %s/afile", dir);
    CHECK(system(cmd) == 0);
    snprintf(args, sizeof args, "--preset tiny --out %s/afile", dir);
    CHECK_EQ_INT(run(args), 2);

    /* config.json that cannot be written (here a directory stands at its name) says why too;
     * it used to be "input/output error" for config.json and the shards' index */
    snprintf(cmd, sizeof cmd, "mkdir -p %s/dirconf/config.json/sub && %s --preset tiny --force "
             "--out %s/dirconf >%s/out 2>&1", dir, bin, dir, dir);
    ws = system(cmd);
    CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 1);
    out = test_slurp(outp, NULL);
    snprintf(want, sizeof want, "config.json: %s", strerror(EISDIR));
    CHECK(out && strstr(out, want) != NULL);
    if (out && !strstr(out, want)) fprintf(stderr, "output was:\n%s\n", out);
    free(out);

    /* a non-empty --out mkmodel did not write (a real checkpoint typed as --out) is refused and
     * left as it was; it used to lose its config.json and index to a random model, exit 0.
     * --force replaces it; an empty directory is taken */
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s/real && echo '{\"x\": 1}' > %s/real/config.json && "
             "echo i > %s/real/model.safetensors.index.json",
             dir, dir, dir);
    CHECK(system(cmd) == 0);
    snprintf(args, sizeof args, "--preset tiny --out %s/real", dir);
    CHECK_EQ_INT(run(args), 2);
    out = test_slurp(outp, NULL);
    CHECK(out && strstr(out, "is not empty and not a model dflash-mkmodel wrote") != NULL &&
          strstr(out, "--force") != NULL);
    free(out);
    snprintf(p, sizeof p, "%s/real/config.json", dir);
    out = test_slurp(p, NULL);
    CHECK(out && strcmp(out, "{\"x\": 1}\n") == 0);
    free(out);
    snprintf(p, sizeof p, "%s/real/model.safetensors.index.json", dir);
    CHECK(access(p, F_OK) == 0);
    snprintf(p, sizeof p, "%s/real/model.safetensors", dir);
    CHECK(access(p, F_OK) != 0);
    snprintf(args, sizeof args, "--preset tiny --force --out %s/real", dir);
    CHECK_EQ_INT(run(args), 0);
    a = check_model("real", &mc);
    safetensors_close(&a);
    snprintf(p, sizeof p, "%s/empty", dir);
    CHECK(mkdir(p, 0755) == 0);
    snprintf(args, sizeof args, "--preset tiny --out %s/empty", dir);
    CHECK_EQ_INT(run(args), 0);

    /* refusals */
    snprintf(args, sizeof args, "--family qwen3 --heads 5 --kv-heads 2 --out %s/bad", dir);
    CHECK_EQ_INT(run(args), 2);
    snprintf(args, sizeof args, "--family mistral --out %s/bad", dir);
    CHECK_EQ_INT(run(args), 2);
    snprintf(args, sizeof args, "--family qwen3 --llama3-rope-scaling --out %s/bad", dir);
    CHECK_EQ_INT(run(args), 2);
    CHECK_EQ_INT(run("--preset tiny"), 2);
    /* --hidden 64 --heads 5 wrote head_dim 12 (60 != 64) without a word; --head-dim says it */
    snprintf(args, sizeof args, "--family llama --hidden 64 --heads 5 --out %s/bad", dir);
    CHECK_EQ_INT(run(args), 2);
    out = test_slurp(outp, NULL);
    CHECK(out && strstr(out, "hidden size 64 is not a multiple of 5 heads") != NULL);
    free(out);
    snprintf(args, sizeof args,
             "--family llama --hidden 64 --heads 5 --kv-heads 5 --head-dim 12 --out %s/h5", dir);
    CHECK_EQ_INT(run(args), 0);

    test_rmtree(dir);
    CHECK_DONE();
}
