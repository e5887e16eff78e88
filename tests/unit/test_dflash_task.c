/* test_dflash_task: dflash_task.h's synthetic task. Its tables on the cpu backend (a normal one of
 * an odd count, then a uniform one from where the stream was left) hold rng_fill's values and
 * leave the stream where rng_fill leaves it (rng_fill against one-by-one draws: test_rng); the
 * tokens follow the stated formula (the PyTorch reference's 151000 modulus at Qwen3's
 * vocabulary, V - 64 below it), with each sequence's 64-token prompt masked; the config
 * validates, with Qwen3's MASK id where the vocabulary holds it.
 */
#include "check.h"
#include "dflash_task.h"
#include "rng.h"
#include "rng_fill.h"

#include <stdint.h>
#include <stdlib.h>

int main(void) {
    /* tables on the cpu backend: rng_fill's values, the stream advanced alike */
    const nn_ops *ops = nn_cpu_ops();
    nn_ctx *ctx = nn_cpu_new(1);
    const size_t n = 3000001;
    uint64_t sa = RNG_GOLDEN, sb = RNG_GOLDEN;
    float *h = malloc(n * sizeof(float));
    for (int normal = 1; normal >= 0; normal--) {
        float *t = dflash_task_table(ops, ctx, &sa, n, normal ? 0.05 : 1.0, normal);
        CHECK(t != NULL);
        rng_fill(&sb, h, n, normal ? 0.05 : 1.0, normal ? RNG_FILL_NORMAL : RNG_FILL_UNIFORM);
        size_t bad = 0;
        for (size_t k = 0; t && k < n; k++)
            bad += t[k] != h[k];
        CHECK_EQ_INT((long)bad, 0);
        CHECK(sa == sb);
        ops->free(ctx, t);
    }
    free(h);
    nn_cpu_destroy(&ctx);

    /* tokens: two sequences of 100 over Qwen3's vocabulary, one of 70 over 1024 */
    int32_t off[3], ids[200], pos[200];
    uint8_t mask[200];
    dflash_task_tokens(2, 100, 151936, off, ids, pos, mask);
    CHECK(off[0] == 0 && off[1] == 100 && off[2] == 200);
    for (int g = 0; g < 200; g++) {
        CHECK_EQ_INT(ids[g], (int)((int64_t)g * 7919 % 151000));
        CHECK_EQ_INT(pos[g], g % 100);
        CHECK_EQ_INT(mask[g], g % 100 >= DFLASH_TASK_PROMPT);
    }
    dflash_task_tokens(1, 70, 1024, off, ids, NULL, mask);
    for (int g = 0; g < 70; g++)
        CHECK_EQ_INT(ids[g], g * 7919 % 960);

    /* config: Qwen3-8B's drafter, and a small one */
    dflash_config c;
    char msg[256] = "";
    CHECK_EQ_INT(dflash_task_config(&c, 4096, 5, 32, 8, 12288, 5, 151936, msg, sizeof msg), 0);
    CHECK_EQ_INT(c.head_dim, 128);
    CHECK_EQ_INT(c.mask_token_id, 151669);
    const int want[5] = {1, 9, 17, 25, 33};
    for (int i = 0; i < 5; i++)
        CHECK_EQ_INT(c.target_layer_ids[i], want[i]);
    CHECK_EQ_INT(dflash_task_config(&c, 128, 3, 4, 2, 384, 2, 1024, msg, sizeof msg), 0);
    CHECK_EQ_INT(c.mask_token_id, 1023);
    CHECK(dflash_task_config(&c, 128, 3, 4, 3, 384, 2, 1024, msg, sizeof msg) != 0); /* 4 % 3 */
    printf("a bad config: %s\n", msg);
    CHECK_DONE();
}
