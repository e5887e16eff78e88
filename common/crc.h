/* crc: the project's two CRC-32s, fast enough to checksum gigabytes.
 *
 *   crc32_ieee  CRC-32 of IEEE 802.3 (reflected polynomial 0xEDB88320, as zlib's crc32): the
 *               journal's records and the slot headers.
 *   crc32c      CRC-32C, Castagnoli (reflected polynomial 0x82F63B78, as iSCSI and SSE4.2's
 *               crc32 instruction): TFRecord frames and the checkpoints' tensor checksums.
 *
 * Both chain the same way: start with 0, continue by passing the previous value, so
 * f(f(0, a), b) == f(0, a || b). Both are pure and thread-safe (their tables are built once,
 * under pthread_once). crc32c uses the SSE4.2 crc32 instruction when the CPU has it (checked at
 * run time: the build runs on any x86-64 and compiles on other machines), slicing-by-8 tables
 * otherwise; crc32_ieee is always slicing-by-8. Callers: slot.c, journal.c, metrics.c,
 * safetensors.c, shard.c, tests/unit/test_crc.c, bench/crc.
 */
#ifndef DFLASH_CRC_H
#define DFLASH_CRC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* CRC-32 (IEEE) of n bytes, continuing from crc. crc32_ieee(0, "123456789", 9) == 0xCBF43926. */
uint32_t crc32_ieee(uint32_t crc, const void *data, size_t n);

/* CRC-32C (Castagnoli) of n bytes, continuing from crc; the fastest path this CPU has.
 * crc32c(0, "123456789", 9) == 0xE3069283. */
uint32_t crc32c(uint32_t crc, const void *data, size_t n);

/* crc32c through the slicing-by-8 tables whatever the CPU: the reference the hardware path is
 * tested and timed against. Same results as crc32c. */
uint32_t crc32c_portable(uint32_t crc, const void *data, size_t n);

/* Whether crc32c uses the CPU's crc32 instruction (SSE4.2) on this machine. */
bool crc32c_hardware(void);

#endif
