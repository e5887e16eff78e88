/* test_fsutil: the local-trust steps of fsutil (the security audit's local-trust findings).
 *   - A temporary file is created only new: a symlink another user planted at the predictable
 *     temporary name (NAME.tmp.PID) used to be followed by open(O_CREAT|O_TRUNC), truncating
 *     and overwriting whatever it pointed to. fs_write_atomic and the safetensors writer (the
 *     common writers) now write a file of their own there: the link's target is untouched and
 *     the result is right. fs_write_atomic_mode gives the mode asked for (0600: the journal's
 *     torn-tail copy).
 *   - fs_make_private_dir, the check of the ipc:// socket directory shared by the broker and
 *     every client: a missing dir is made 0700; one open to group or others, a symlink (even to
 *     a good dir), a file, another user's dir (only as root, who can chown) are refused with a
 *     message naming the dir, its owner and mode and the fix.
 *   - the small contracts the readers and writers stand on (test_small_contracts). */
#include "check.h"
#include "err.h"
#include "fsutil.h"
#include "safetensors.h"
#include "test_files.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/wait.h>

static char dir[64];

/* A victim file at DIR/victim holding "precious", and a symlink to it at link_path. */
static void plant(const char *link_path, char *victim, size_t len)
{
    snprintf(victim, len, "%s/victim", dir);
    test_spill(victim, "precious", 8);
    unlink(link_path);
    CHECK_EQ_INT(symlink(victim, link_path), 0);
}

static bool victim_untouched(const char *victim)
{
    size_t n = 0;
    char *s = test_slurp(victim, &n);
    bool same = n == 8 && memcmp(s, "precious", 8) == 0;
    free(s);
    return same;
}

static void test_write_atomic_symlink(void)
{
    char path[128], tmp[160], victim[128];
    snprintf(path, sizeof path, "%s/out.json", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    plant(tmp, victim, sizeof victim);
    CHECK_EQ_INT(fs_write_atomic(path, "{\"new\":1}", 9), 0);
    CHECK(victim_untouched(victim));
    size_t n = 0;
    char *s = test_slurp(path, &n);
    CHECK(n == 9 && memcmp(s, "{\"new\":1}", 9) == 0);
    free(s);
    struct stat st;
    CHECK(lstat(path, &st) == 0 && S_ISREG(st.st_mode));
    CHECK(lstat(tmp, &st) != 0); /* nothing left at the temporary name */
    /* a dangling link there: followed, it would have created a file where it points */
    char nowhere[128];
    snprintf(nowhere, sizeof nowhere, "%s/made-through-link", dir);
    CHECK_EQ_INT(symlink(nowhere, tmp), 0);
    CHECK_EQ_INT(fs_write_atomic(path, "x", 1), 0);
    CHECK(lstat(nowhere, &st) != 0);
    /* the mode asked for */
    CHECK_EQ_INT(fs_write_atomic_mode(path, "y", 1, 0600), 0);
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600);
}

/* A temporary name a live writer holds an flock on (dflash-data's shard: two processes of one
 * PID, in two containers writing one shared volume) is left alone: EBUSY, its bytes kept
 * (defect: it was unlinked, and both runs ended with the other's shard, one said done). Once
 * the lock is gone, the name is taken as before. */
static void test_create_new_locked(void)
{
    char path[128];
    snprintf(path, sizeof path, "%s/x.shard.tmp.1", dir);
    test_spill(path, "live", 4);
    int holder = open(path, O_RDONLY);
    CHECK(holder >= 0 && flock(holder, LOCK_EX | LOCK_NB) == 0);
    errno = 0;
    int fd = fs_create_new(path, O_WRONLY, 0644);
    CHECK_EQ_INT(fd, -1);
    CHECK_EQ_INT(errno, EBUSY);
    CHECK_EQ_INT(test_file_size(path), 4);
    close(holder);
    fd = fs_create_new(path, O_WRONLY, 0644);
    CHECK(fd >= 0);
    if (fd >= 0) close(fd);
    CHECK_EQ_INT(test_file_size(path), 0);
    unlink(path);
}

/* The temporary files of writers killed outright (dflash-data's, dflash-gen's, dflash-mkmodel's
 * "PATH.tmp.PID"): a dead pid's is removed, a live pid's, one under an flock, another name's
 * and a name that is no pid are kept. */
static void test_remove_stale_temps(void)
{
    pid_t child = fork();
    if (child == 0) _exit(0);
    CHECK(child > 0 && waitpid(child, NULL, 0) == child); /* its pid is gone now */
    char path[128], dead[160], live[160], locked[160], other[160], odd[160];
    snprintf(path, sizeof path, "%s/gen.jsonl", dir);
    snprintf(dead, sizeof dead, "%s.tmp.%d", path, (int)child);
    snprintf(live, sizeof live, "%s.tmp.%d", path, (int)getppid());
    snprintf(locked, sizeof locked, "%s.tmp.%d", path, (int)child + 4000000);
    snprintf(other, sizeof other, "%s/other.jsonl.tmp.%d", dir, (int)child);
    snprintf(odd, sizeof odd, "%s.tmp.12x", path);
    const char *all[] = {dead, live, locked, other, odd};
    for (int i = 0; i < 5; i++) test_spill(all[i], "part", 4);
    int holder = open(locked, O_RDONLY);
    CHECK(holder >= 0 && flock(holder, LOCK_EX | LOCK_NB) == 0);
    CHECK_EQ_INT(fs_remove_stale_temps(path, "a partial output"), 1);
    struct stat st;
    CHECK(stat(dead, &st) != 0);
    for (int i = 1; i < 5; i++) CHECK(stat(all[i], &st) == 0);
    close(holder);
    for (int i = 1; i < 5; i++) unlink(all[i]);
}

static void test_safetensors_symlink(void)
{
    char path[128], tmp[160], victim[128];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    plant(tmp, victim, sizeof victim);
    safetensors_writer *w = safetensors_writer_new(path);
    CHECK(w != NULL);
    if (!w) return;
    float v[4] = {1, 2, 3, 4};
    int64_t shape[1] = {4};
    CHECK_EQ_INT(safetensors_writer_add(w, "w", SAFETENSORS_F32, 1, shape, v), 0);
    CHECK_EQ_INT(safetensors_writer_commit(w), 0);
    safetensors_writer_destroy(&w);
    CHECK(victim_untouched(victim));
    int rc = 0;
    safetensors *f = safetensors_open(path, &rc, NULL, 0);
    CHECK(f != NULL);
    safetensors_close(&f);
}

/* fs_make_private_dir on p: its code, the message in why. */
static int private_dir(const char *p, char *why, size_t len)
{
    why[0] = 0;
    return fs_make_private_dir(p, why, len);
}

static void test_private_dir(void)
{
    char p[128], why[1024];
    struct stat st;
    snprintf(p, sizeof p, "%s/rt", dir);
    CHECK_EQ_INT(private_dir(p, why, sizeof why), 0); /* missing: made, ours, 0700 */
    CHECK(lstat(p, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 0777) == 0700);
    CHECK_EQ_INT(private_dir(p, why, sizeof why), 0); /* and accepted as it is */

    CHECK_EQ_INT(chmod(p, 0750), 0);
    CHECK_EQ_INT(private_dir(p, why, sizeof why), DFLASH_EDENIED);
    CHECK(strstr(why, p) && strstr(why, "mode 0750") && strstr(why, "chmod 700"));
    CHECK_EQ_INT(chmod(p, 0701), 0); /* others may only enter: still refused */
    CHECK_EQ_INT(private_dir(p, why, sizeof why), DFLASH_EDENIED);
    CHECK_EQ_INT(chmod(p, 0700), 0);

    if (geteuid() == 0) {
        CHECK_EQ_INT(chown(p, 65534, (gid_t)-1), 0);
        CHECK_EQ_INT(private_dir(p, why, sizeof why), DFLASH_EDENIED);
        CHECK(strstr(why, "owned by uid 65534") && strstr(why, "run this as uid 65534"));
        CHECK_EQ_INT(chown(p, 0, (gid_t)-1), 0);
    }

    char link[128];
    snprintf(link, sizeof link, "%s/rt-link", dir);
    CHECK_EQ_INT(symlink(p, link), 0);
    CHECK_EQ_INT(private_dir(link, why, sizeof why), DFLASH_ECONFIG);
    CHECK(strstr(why, link) && strstr(why, "symbolic link"));
    char link_slash[160]; /* lstat("link/") would judge where it points */
    snprintf(link_slash, sizeof link_slash, "%s//", link);
    CHECK_EQ_INT(private_dir(link_slash, why, sizeof why), DFLASH_ECONFIG);
    CHECK(strstr(why, "symbolic link") != NULL);

    char file[128];
    snprintf(file, sizeof file, "%s/a-file", dir);
    test_spill(file, "x", 1);
    CHECK_EQ_INT(private_dir(file, why, sizeof why), DFLASH_ECONFIG);
    CHECK(strstr(why, "not a directory"));

    char deep[160];
    snprintf(deep, sizeof deep, "%s/no/such", dir); /* only the last component is made */
    CHECK_EQ_INT(private_dir(deep, why, sizeof why), DFLASH_EIO);
    CHECK(strstr(why, "cannot create"));
}

/* The small contracts the daemons' readers and writers stand on: a path's parent ("/" for a
 * file at the root, "." for a bare name), fs_write_atomic's mode 0644 (under umask 022; files
 * others read, e.g. config.json) and no temporary file left when the rename fails, fs_fd_private
 * refusing what is not a regular file of ours with mode 0600 (group or others' access), fs_read_text's
 * limit (one byte over is refused) and its terminating NUL. */
static void test_small_contracts(void)
{
    char out[64];
    CHECK(fs_parent_dir("/x", out, sizeof out) == 0 && strcmp(out, "/") == 0);
    CHECK(fs_parent_dir("x", out, sizeof out) == 0 && strcmp(out, ".") == 0);
    CHECK(fs_parent_dir("a/b/c", out, sizeof out) == 0 && strcmp(out, "a/b") == 0);

    char path[128], tmp[160];
    struct stat st;
    mode_t old = umask(022);
    snprintf(path, sizeof path, "%s/plain.txt", dir);
    CHECK_EQ_INT(fs_write_atomic(path, "abc", 3), 0);
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0644);
    umask(old);
    /* a rename onto a directory fails: EIO, and nothing at the temporary name */
    snprintf(path, sizeof path, "%s/a-dir", dir);
    CHECK_EQ_INT(mkdir(path, 0700), 0);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    CHECK_EQ_INT(fs_write_atomic(path, "abc", 3), DFLASH_EIO);
    CHECK(lstat(tmp, &st) != 0);

    char why[256];
    int fd = open(path, O_RDONLY | O_DIRECTORY); /* ours, a directory */
    CHECK(fd >= 0 && !fs_fd_private(fd, why, sizeof why));
    if (fd >= 0) close(fd);
    snprintf(path, sizeof path, "%s/group.txt", dir);
    test_spill(path, "abc", 3);
    CHECK_EQ_INT(chmod(path, 0640), 0);
    fd = open(path, O_RDONLY);
    CHECK(fd >= 0 && !fs_fd_private(fd, why, sizeof why) && strstr(why, "mode 0640"));
    CHECK_EQ_INT(fchmod(fd, 0604), 0); /* others alone */
    CHECK(fd >= 0 && !fs_fd_private(fd, why, sizeof why) && strstr(why, "mode 0604"));
    CHECK_EQ_INT(fchmod(fd, 0600), 0);
    CHECK(fd >= 0 && fs_fd_private(fd, why, sizeof why));
    if (fd >= 0) close(fd);

    /* an earlier read leaves bytes that are not NUL where the next buffer comes from */
    char *junk = malloc(8192);
    if (junk) memset(junk, 'z', 8192);
    free(junk);
    int rc = 0;
    char *text = fs_read_text(path, 3, why, sizeof why, &rc);
    CHECK(text && strlen(text) == 3 && strcmp(text, "abc") == 0);
    free(text);
    text = fs_read_text(path, 2, why, sizeof why, &rc);
    CHECK(text == NULL && rc == DFLASH_EFORMAT && strstr(why, "larger than 2 bytes"));
    free(text);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/dflash-test-fsutil-XXXXXX");
    if (!mkdtemp(dir)) return 1;
    test_write_atomic_symlink();
    test_create_new_locked();
    test_remove_stale_temps();
    test_safetensors_symlink();
    test_private_dir();
    test_small_contracts();
    test_rmtree(dir);
    CHECK_DONE();
}
