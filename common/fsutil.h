/* fsutil: file-system steps shared by the writers. The durability step of every atomic file
 * writer (safetensors, shards, config files, checkpoints, journal compaction): after `write tmp,
 * fsync, rename`, the directory that holds the new name must be fsync'd too, or a crash can lose
 * the rename. And `mkdir -p` for the output directories a daemon writes into (metrics,
 * checkpoints), created at start-up so that a bad path is an error then, not hours later.
 * Thread-safe. */
#ifndef DFLASH_FSUTIL_H
#define DFLASH_FSUTIL_H

/* fsyncs the directory containing path ("." for a bare name). Returns 0 or DFLASH_EIO (a file
 * system that cannot fsync directories, EINVAL, counts as success). */
int fs_sync_parent_dir(const char *path);

/* mkdir -p dir (mode 0755 for what it creates). Returns 0 when dir is a directory at the end,
 * DFLASH_EIO with errno set when a component cannot be created (or is not a directory),
 * DFLASH_EINVAL for a path over PATH_MAX. */
int fs_make_dirs(const char *dir);

#endif
