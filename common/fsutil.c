/* fsutil: see fsutil.h. */
#include "fsutil.h"
#include "err.h"
#include "log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

int fs_parent_dir(const char *path, char *out, size_t len)
{
    if (len < 2 || snprintf(out, len, "%s", path) >= (int)len) return DFLASH_EINVAL;
    char *slash = strrchr(out, '/');
    if (!slash) snprintf(out, len, ".");
    else if (slash == out) slash[1] = 0;
    else *slash = 0;
    return 0;
}

int fs_sync_parent_dir(const char *path)
{
    char dir[PATH_MAX];
    fs_parent_dir(path, dir, sizeof dir);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return DFLASH_EIO;
    int rc = fsync(dfd) == 0 || errno == EINVAL ? 0 : DFLASH_EIO;
    int why = errno;
    close(dfd);
    errno = why; /* the caller reports fsync's reason, not close's */
    return rc;
}

int fs_make_dirs(const char *dir)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path) return DFLASH_EINVAL;
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(path, 0755) && errno != EEXIST) return DFLASH_EIO;
        *p = '/';
    }
    if (mkdir(path, 0755) && errno != EEXIST) return DFLASH_EIO;
    struct stat st;
    if (stat(path, &st)) return DFLASH_EIO;
    if (!S_ISDIR(st.st_mode)) return errno = ENOTDIR, DFLASH_EIO;
    return 0;
}

/* fs_make_private_dir (create: mkdir 0700 first) and fs_check_private_dir (never creates: a
 * missing dir is DFLASH_ENOTFOUND): one set of checks for both. */
static int private_dir(const char *dir_given, bool create, char *err, size_t errlen)
{
    char dir[PATH_MAX]; /* without trailing slashes: lstat("link/") would follow the link */
    size_t n = strlen(dir_given);
    if (n >= sizeof dir) {
        err_fmt(err, errlen, "%.200s...: the path is too long", dir_given);
        return DFLASH_ECONFIG;
    }
    memcpy(dir, dir_given, n + 1);
    while (n > 1 && dir[n - 1] == '/') dir[--n] = 0;
    if (create && mkdir(dir, 0700) != 0 && errno != EEXIST) {
        err_fmt(err, errlen, "cannot create %s: %s", dir, strerror(errno));
        return DFLASH_EIO;
    }
    struct stat st;
    if (lstat(dir, &st) != 0) {
        if (!create && errno == ENOENT) {
            err_fmt(err, errlen, "%s does not exist", dir);
            return DFLASH_ENOTFOUND;
        }
        err_fmt(err, errlen, "cannot examine %s: %s", dir, strerror(errno));
        return DFLASH_EIO;
    }
    if (S_ISLNK(st.st_mode)) {
        err_fmt(err, errlen, "%s is a symbolic link (owner uid %u): give the directory itself, "
                "or remove the link if nobody here made it", dir, (unsigned)st.st_uid);
        return DFLASH_ECONFIG;
    }
    if (!S_ISDIR(st.st_mode)) {
        err_fmt(err, errlen, "%s is not a directory (owner uid %u, mode %04o): remove it or give "
                "another directory", dir, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
        return DFLASH_ECONFIG;
    }
    if (st.st_uid != geteuid()) {
        err_fmt(err, errlen, "%s is owned by uid %u, not by us (uid %u; mode %04o), where it "
                "must be ours with mode 0700: if the broker there is that user's, run this as "
                "uid %u (sudo -u, docker exec -u); if nobody here made it, another user may have, "
                "to pose as our broker: give another directory (and remove that one)", dir,
                (unsigned)st.st_uid, (unsigned)geteuid(), (unsigned)(st.st_mode & 07777),
                (unsigned)st.st_uid);
        return DFLASH_EDENIED;
    }
    if (st.st_mode & 077) {
        err_fmt(err, errlen, "%s has mode %04o (owner uid %u), open to group or others, where "
                "it must be ours with mode 0700: chmod 700 %s", dir,
                (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid, dir);
        return DFLASH_EDENIED;
    }
    return 0;
}

int fs_make_private_dir(const char *dir, char *err, size_t errlen)
{
    return private_dir(dir, true, err, errlen);
}

int fs_check_private_dir(const char *dir, char *err, size_t errlen)
{
    return private_dir(dir, false, err, errlen);
}

bool fs_fd_private(int fd, char *why, size_t len)
{
    struct stat st;
    if (fstat(fd, &st) != 0) {
        err_fmt(why, len, "cannot stat it: %s", strerror(errno));
        return false;
    }
    if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077)) {
        err_fmt(why, len, "owner uid %u, mode %04o, where ours are made by uid %u with mode 0600",
                (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777), (unsigned)geteuid());
        return false;
    }
    return true;
}

/* Whether a live writer holds path's flock. A shared lock, which a read-only descriptor can take
 * on NFS too (its exclusive emulation needs one opened for writing), conflicts with the writer's
 * exclusive one. */
static bool held_by_writer(const char *path)
{
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return false;
    bool busy = flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    close(fd);
    return busy;
}

int fs_create_new(const char *path, int flags, mode_t mode)
{
    if (held_by_writer(path)) {
        errno = EBUSY;
        return -1;
    }
    if (unlink(path) != 0 && errno != ENOENT) return -1;
    int fd = open(path, flags | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0) return -1;
    /* held for the descriptor's life; then the name must still be ours: another writer of the
     * name that probed it before the lock was taken has replaced it (it goes on, we stop) */
    struct stat mine, named;
    if (flock(fd, LOCK_EX) != 0 || fstat(fd, &mine) != 0 || stat(path, &named) != 0 ||
        mine.st_ino != named.st_ino || mine.st_dev != named.st_dev) {
        close(fd);
        errno = EBUSY;
        return -1;
    }
    return fd;
}

int fs_write_atomic(const char *path, const void *buf, size_t len)
{
    return fs_write_atomic_mode(path, buf, len, 0644);
}

int fs_write_atomic_mode(const char *path, const void *buf, size_t len, mode_t mode)
{
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return DFLASH_EINVAL;
    int fd = fs_create_new(tmp, O_WRONLY, mode);
    if (fd < 0) return DFLASH_EIO;
    const char *p = buf;
    int rc = 0;
    while (len && !rc) {
        ssize_t k = write(fd, p, len > (1u << 30) ? (1u << 30) : len);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) rc = DFLASH_EIO;
        else p += k, len -= (size_t)k;
    }
    if (!rc && fsync(fd) != 0) rc = DFLASH_EIO;
    int e = errno;
    if (close(fd) != 0 && !rc) rc = DFLASH_EIO, e = errno;
    if (!rc && rename(tmp, path) != 0) rc = DFLASH_EIO, e = errno;
    if (rc) {
        unlink(tmp);
        errno = e; /* the failing call's reason, not unlink's */
        return rc;
    }
    return fs_sync_parent_dir(path);
}

int fs_open_regular(const char *path, size_t *size, char *err, size_t errlen, int *rc) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        err_fmt(err, errlen, "%s: cannot open: %s", path, strerror(e));
        *rc = e == ENOENT ? DFLASH_ENOTFOUND : DFLASH_EIO;
        return -1;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        err_fmt(err, errlen, "%s: cannot stat: %s", path, strerror(errno));
    } else if (!S_ISREG(sb.st_mode)) {
        err_fmt(err, errlen, "%s: cannot read: %s, not a regular file", path,
                S_ISDIR(sb.st_mode) ? "a directory" : "a device, FIFO or socket");
    } else {
        *size = (size_t)sb.st_size;
        return fd;
    }
    close(fd);
    *rc = DFLASH_EIO;
    return -1;
}

char *fs_read_text(const char *path, size_t max, char *err, size_t errlen, int *rc) {
    size_t size;
    int fd = fs_open_regular(path, &size, err, errlen, rc);
    if (fd < 0) return NULL;
    FILE *fp = fdopen(fd, "rb");
    if (!fp) {
        err_fmt(err, errlen, "%s: cannot read: %s", path, strerror(errno));
        close(fd);
        *rc = DFLASH_EIO;
        return NULL;
    }
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 8192;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(fp);
                *rc = DFLASH_ENOMEM;
                return NULL;
            }
            buf = nb;
        }
        size_t got = fread(buf + len, 1, 4096, fp);
        len += got;
        if (got == 0) break;
        if (len > max) {
            err_fmt(err, errlen, "%s: larger than %zu bytes", path, max);
            free(buf);
            fclose(fp);
            *rc = DFLASH_EFORMAT;
            return NULL;
        }
    }
    int read_errno = errno;
    bool bad = ferror(fp);
    fclose(fp);
    if (bad) {
        err_fmt(err, errlen, "%s: cannot read: %s", path, strerror(read_errno));
        free(buf);
        *rc = DFLASH_EIO;
        return NULL;
    }
    buf[len] = 0;
    return buf;
}

bool fs_stdout_written(const char *program)
{
    errno = 0;
    if (fflush(stdout) == 0 && !ferror(stdout)) return true;
    fprintf(stderr, "%s: cannot write the result to standard output: %s\n", program,
            errno ? strerror(errno) : "write error");
    return false;
}

/* The pid of a "<base>.tmp.<pid>" name (all digits after the prefix), else 0. */
static long temp_pid(const char *name, const char *base)
{
    size_t n = strlen(base);
    if (strncmp(name, base, n) != 0 || strncmp(name + n, ".tmp.", 5) != 0) return 0;
    const char *d = name + n + 5;
    char *end;
    errno = 0;
    long pid = *d >= '0' && *d <= '9' ? strtol(d, &end, 10) : 0;
    return pid > 0 && !errno && !*end ? pid : 0;
}

int fs_remove_stale_temps(const char *path, const char *what)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    if (slash) *(slash == dir ? slash + 1 : slash) = '\0';
    else snprintf(dir, sizeof dir, ".");
    if (!*base) return 0;
    DIR *d = opendir(dir);
    if (!d) return 0;
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        long pid = temp_pid(e->d_name, base);
        if (!pid || pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        char p[8192];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        /* its writer holds an flock for its lifetime: a pid that is not ours to see (another
         * container or host writing the same --out on a shared volume) still holds it */
        int fd = open(p, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        if (flock(fd, LOCK_SH | LOCK_NB) != 0) { /* a live writer's, or no lock to be had */
            close(fd);
            continue;
        }
        struct stat st;
        long long size = fstat(fd, &st) == 0 ? (long long)st.st_size : -1;
        int gone = unlink(p);
        close(fd);
        if (gone != 0) {
            LOG_WARN("cannot remove %s, %s left by process %ld, which is gone: %s", p, what,
                     pid, strerror(errno));
            continue;
        }
        LOG_WARN("removed %s (%lld bytes): %s left by process %ld, which is gone (killed "
                 "while writing it)", p, size, what, pid);
        removed++;
    }
    closedir(d);
    return removed;
}
