/* run_id: see run_id.h. The file is the id in hex, so a person can read it (`cat run-id`) and
 * match it against the broker's log lines, which name runs that way. */
#include "run_id.h"

#include "err.h"
#include "fsutil.h"
#include "wire.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int run_id_load_or_create(const char *root, uint64_t *id, char *err, size_t errlen)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/run-id", root);
    FILE *f = fopen(path, "r");
    if (f) {
        char text[64] = "";
        size_t n = fread(text, 1, sizeof text - 1, f);
        fclose(f);
        text[n] = 0;
        /* exactly 16 hex digits and an optional newline (strtoull alone took "-1", "+5",
         * "0x..." and leading spaces) */
        bool hex = n == 16 || (n == 17 && text[16] == '\n');
        for (size_t i = 0; i < 16 && hex; i++) hex = isxdigit((unsigned char)text[i]) != 0;
        uint64_t v = hex ? strtoull(text, NULL, 16) : 0;
        if (v == 0) {
            err_fmt(err, errlen, "%s does not hold a run id (16 hex digits): remove it, and the "
                    "run gets a new one", path);
            return DFLASH_EFORMAT;
        }
        *id = v;
        return 0;
    }
    if (errno != ENOENT) {
        err_fmt(err, errlen, "cannot read %s: %s", path, strerror(errno));
        return DFLASH_EIO;
    }
    uint64_t v = wire_new_incarnation(); /* random, non-zero */
    char text[32];
    int n = snprintf(text, sizeof text, "%016" PRIx64 "\n", v);
    if (fs_write_atomic(path, text, (size_t)n) < 0) {
        err_fmt(err, errlen, "cannot write %s: %s", path, strerror(errno));
        return DFLASH_EIO;
    }
    *id = v;
    return 0;
}
