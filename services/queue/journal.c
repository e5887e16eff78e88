/* journal: append-only checksummed record file (see journal.h). STUB: bodies follow. */
#include "journal.h"

#include <stddef.h>

#include "err.h"

journal *journal_open(const char *path, journal_replay_fn fn, void *ctx, int *err)
{
    (void)path, (void)fn, (void)ctx;
    if (err) *err = DFLASH_EUNSUPPORTED;
    return NULL;
}
void journal_destroy(journal **j) { if (j) *j = NULL; }
int journal_append(journal *j, uint16_t type, const void *payload, uint32_t len, bool sync)
{
    (void)j, (void)type, (void)payload, (void)len, (void)sync;
    return DFLASH_EUNSUPPORTED;
}
int journal_sync(journal *j) { (void)j; return DFLASH_EUNSUPPORTED; }
int journal_rewrite(journal *j, int (*emit)(void *ctx, journal *tmp), void *ctx)
{
    (void)j, (void)emit, (void)ctx;
    return DFLASH_EUNSUPPORTED;
}
uint64_t journal_size(const journal *j) { (void)j; return 0; }
uint64_t journal_records(const journal *j) { (void)j; return 0; }
uint64_t journal_torn_bytes(const journal *j) { (void)j; return 0; }
uint32_t journal_crc32(uint32_t crc, const void *data, uint64_t len)
{
    (void)data, (void)len;
    return crc;
}
