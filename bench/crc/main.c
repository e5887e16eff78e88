/* bench-crc: how fast are the checksums a checkpoint save and load pay for? Times crc32c with
 * the CPU's crc32 instruction (when present), crc32c through the slicing-by-8 tables and
 * crc32_ieee over one buffer (default 256 MiB, or argv[1] MiB), best of five passes each, and
 * prints GB/s and the seconds each would add to the Qwen3-8B drafter's ~13 GB of checkpoint
 * state. The last line is the hardware/portable ratio. Single-threaded; results go in
 * bench/RESULTS.md.
 */
#include "crc.h"
#include "monotime.h"
#include "rng.h"

#include <stdio.h>
#include <stdlib.h>

#define CKPT_BYTES 13e9 /* the Qwen3-8B drafter's model + training state */

/* Best of five passes over buf, in GB/s; *out receives the checksum (kept, so no pass is
 * optimised away, and printed so the paths can be seen to agree). */
static double time_gbps(uint32_t (*fn)(uint32_t, const void *, size_t), const uint8_t *buf,
                        size_t n, uint32_t *out) {
    double best = 1e30;
    for (int k = 0; k < 5; k++) {
        double t0 = monotime_s();
        *out = fn(0, buf, n);
        double dt = monotime_s() - t0;
        if (dt < best) best = dt;
    }
    return (double)n / best / 1e9;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 256;
    size_t n = (mib ? mib : 256) << 20;
    uint8_t *buf = malloc(n);
    if (!buf) {
        fprintf(stderr, "bench-crc: cannot allocate %zu MiB\n", mib);
        return 1;
    }
    uint64_t seed = 1;
    for (size_t i = 0; i < n; i++)
        buf[i] = (uint8_t)rng_next(&seed);

    uint32_t c_hw, c_port, c_ieee;
    double hw = time_gbps(crc32c, buf, n, &c_hw);
    double port = time_gbps(crc32c_portable, buf, n, &c_port);
    double ieee = time_gbps(crc32_ieee, buf, n, &c_ieee);

    printf("%-34s %10s %10s %12s\n", "path", "GB/s", "crc", "s per 13 GB");
    printf("%-34s %10.2f    %08x %12.2f\n",
           crc32c_hardware() ? "crc32c (SSE4.2 crc32 instruction)" : "crc32c (no SSE4.2: portable)",
           hw, c_hw, CKPT_BYTES / 1e9 / hw);
    printf("%-34s %10.2f    %08x %12.2f\n", "crc32c_portable (slicing-by-8)", port, c_port,
           CKPT_BYTES / 1e9 / port);
    printf("%-34s %10.2f    %08x %12.2f\n", "crc32_ieee (slicing-by-8)", ieee, c_ieee,
           CKPT_BYTES / 1e9 / ieee);
    printf("crc32c hardware / portable: %.2fx over %zu MiB\n", hw / port, n >> 20);
    free(buf);
    return c_hw == c_port ? 0 : 1;
}
