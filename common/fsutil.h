/* fsutil: file-system steps shared by the writers. The durability step of every atomic file
 * writer (safetensors, shards, config files, checkpoints, journal compaction): after `write tmp,
 * fsync, rename`, the directory that holds the new name must be fsync'd too, or a crash can lose
 * the rename; fs_write_atomic does all of it for a small file. And `mkdir -p` for the output directories a daemon writes into (metrics,
 * checkpoints), created at start-up so that a bad path is an error then, not hours later.
 * And the readers' first step: a regular file opened (never waiting on a FIFO) or read whole.
 * Thread-safe. */
#ifndef DFLASH_FSUTIL_H
#define DFLASH_FSUTIL_H

#include <stddef.h>

/* fsyncs the directory containing path ("." for a bare name). Returns 0 or DFLASH_EIO (a file
 * system that cannot fsync directories, EINVAL, counts as success). */
int fs_sync_parent_dir(const char *path);

/* mkdir -p dir (mode 0755 for what it creates). Returns 0 when dir is a directory at the end,
 * DFLASH_EIO with errno set when a component cannot be created (or is not a directory),
 * DFLASH_EINVAL for a path over PATH_MAX. */
int fs_make_dirs(const char *dir);

/* Writes len bytes of buf to path atomically: path.tmp.PID, fsync, rename, fsync of the
 * directory. Returns 0, or DFLASH_EIO with errno kept as the failing call left it (a full disk:
 * ENOSPC) and no temporary file left behind. */
int fs_write_atomic(const char *path, const void *buf, size_t len);

/* Opens path for reading, refusing anything but a regular file (a FIFO is not waited on: opened
 * non-blocking): the descriptor (O_CLOEXEC) with its size in *size, or -1 with *rc
 * (DFLASH_ENOTFOUND when it does not exist, else DFLASH_EIO: also a directory, device, FIFO or
 * socket) and the reason, naming path, in err. */
int fs_open_regular(const char *path, size_t *size, char *err, size_t errlen, int *rc);

/* A regular file's whole text (fs_open_regular's checks), NUL-terminated, malloc'd: free it.
 * NULL with *rc and the reason in err: fs_open_regular's codes, DFLASH_EFORMAT for a file over
 * max bytes, DFLASH_ENOMEM. */
char *fs_read_text(const char *path, size_t max, char *err, size_t errlen, int *rc);

#endif
