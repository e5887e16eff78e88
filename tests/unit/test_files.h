/* test_files: whole files in and out, for the tests (header-only).
 * test_slurp returns a file's bytes plus a terminating NUL (so that text can be searched) and
 * their count in *len (len may be NULL); a file that cannot be read gives "" and 0, so that the
 * checks on a missing log fail instead of crashing. Free the result with free().
 * test_spill writes len bytes of b to path, replacing the file. test_file_size: the size of
 * the file at path, 0 where it cannot be read. test_copy_prefix: dst becomes the first len bytes
 * of src (all of src where it is shorter). test_edit_in_place overwrites the first occurrence
 * of from in the file at path with to (binary files too: a safetensors header's metadata; same
 * length, so offsets hold) and says whether there was one. test_flip_bit inverts bit (0-7) of the byte at
 * offset in path, in place (damage that keeps the size); 0, or -1 where it cannot. test_rmtree
 * removes a test's temporary directory tree (files, links and folders, without following
 * links); 0, or -1 with a message. test_capture_begin sends stderr (what the code under test
 * logs) into a temporary file until test_capture_end, which puts it back and returns what was
 * written (malloc'd, NUL-terminated; "" where unreadable). test_in_child runs a function in a
 * forked child, its stderr into a file (for code that ends the process). */
#ifndef DFLASH_TEST_FILES_H
#define DFLASH_TEST_FILES_H

#include <fcntl.h>
#include <ftw.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

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

static inline uint64_t test_file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

static inline bool test_edit_in_place(const char *path, const char *from, const char *to) {
    size_t len = 0, n = strlen(from);
    if (strlen(to) != n) abort(); /* the test's own bug */
    char *b = test_slurp(path, &len);
    char *at = memmem(b, len, from, n);
    if (at) {
        memcpy(at, to, n);
        test_spill(path, b, len);
    }
    free(b);
    return at != NULL;
}

static inline void test_copy_prefix(const char *src, const char *dst, uint64_t len) {
    int in = open(src, O_RDONLY), out = open(dst, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    char buf[4096];
    uint64_t done = 0;
    while (in >= 0 && out >= 0 && done < len) {
        ssize_t n = read(in, buf, len - done < sizeof buf ? len - done : sizeof buf);
        if (n <= 0 || write(out, buf, (size_t)n) != n) break;
        done += (uint64_t)n;
    }
    if (in >= 0) close(in);
    if (out >= 0) close(out);
}

static inline int test_flip_bit(const char *path, uint64_t offset, int bit) {
    int fd = open(path, O_RDWR);
    unsigned char b;
    int rc = fd >= 0 && pread(fd, &b, 1, (off_t)offset) == 1 ? 0 : -1;
    b ^= (unsigned char)(1u << bit);
    if (rc == 0 && pwrite(fd, &b, 1, (off_t)offset) != 1) rc = -1;
    if (fd >= 0) close(fd);
    return rc;
}

static inline int test_rmtree_entry(const char *path, const struct stat *st, int flag,
                                    struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static inline int test_rmtree(const char *dir) {
    if (nftw(dir, test_rmtree_entry, 16, FTW_DEPTH | FTW_PHYS) == 0) return 0;
    fprintf(stderr, "cleanup of %s failed\n", dir);
    return -1;
}

typedef struct test_capture {
    int fd, saved;
    char path[40];
} test_capture;

static inline test_capture test_capture_begin(void) {
    test_capture c = {.path = "/tmp/dflash-test-log-XXXXXX"};
    c.fd = mkstemp(c.path);
    c.saved = dup(2);
    fflush(stderr);
    dup2(c.fd, 2);
    return c;
}

static inline char *test_capture_end(test_capture *c) {
    fflush(stderr);
    dup2(c->saved, 2);
    close(c->saved);
    off_t n = lseek(c->fd, 0, SEEK_END);
    char *log = calloc(1, n > 0 ? (size_t)n + 1 : 1);
    if (log && n > 0 && pread(c->fd, log, (size_t)n, 0) != n) log[0] = 0;
    close(c->fd);
    unlink(c->path);
    return log;
}

/* Runs body(arg) in a forked child whose stderr goes to file errpath (read it with
 * test_slurp); the child exits 0 when body returns. Returns the child's wait status, -1 when
 * it could not be forked or waited for. */
static inline int test_in_child(void (*body)(const char *), const char *arg, const char *errpath) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen(errpath, "w", stderr)) _exit(99);
        body(arg);
        _exit(0);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) return -1;
    return status;
}

#endif
