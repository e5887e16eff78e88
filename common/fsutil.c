/* fsutil: see fsutil.h. */
#include "fsutil.h"
#include "err.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int fs_sync_parent_dir(const char *path)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) slash[1] = 0;
    else *slash = 0;
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return DFLASH_EIO;
    int rc = fsync(dfd) == 0 || errno == EINVAL ? 0 : DFLASH_EIO;
    close(dfd);
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
