/* test_files: whole files in and out, for the tests (header-only).
 * test_slurp returns a file's bytes plus a terminating NUL (so that text can be searched) and
 * their count in *len (len may be NULL); a file that cannot be read gives "" and 0, so that the
 * checks on a missing log fail instead of crashing. Free the result with free().
 * test_spill writes len bytes of b to path, replacing the file. */
#ifndef DFLASH_TEST_FILES_H
#define DFLASH_TEST_FILES_H

#include <stdio.h>
#include <stdlib.h>

static inline char *test_slurp(const char *path, size_t *len) {
    size_t n = 0;
    char *b = NULL;
    FILE *fp = fopen(path, "rb");
    if (fp && fseek(fp, 0, SEEK_END) == 0) {
        long end = ftell(fp);
        if (end > 0 && fseek(fp, 0, SEEK_SET) == 0 && (b = malloc((size_t)end + 1)))
            n = fread(b, 1, (size_t)end, fp) == (size_t)end ? (size_t)end : 0;
    }
    if (fp) fclose(fp);
    if (!b && !(b = malloc(1))) abort();
    b[n] = 0;
    if (len) *len = n;
    return b;
}

static inline void test_spill(const char *path, const char *b, size_t len) {
    FILE *fp = fopen(path, "wb");
    if (!fp) return;
    if (fwrite(b, 1, len, fp) != len) fprintf(stderr, "test_spill: short write to %s\n", path);
    fclose(fp);
}

#endif
