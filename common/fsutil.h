/* fsutil: the durability step shared by every atomic file writer (safetensors, shards, config
 * files, checkpoints, journal compaction): after `write tmp, fsync, rename`, the directory that
 * holds the new name must be fsync'd too, or a crash can lose the rename. Thread-safe. */
#ifndef DFLASH_FSUTIL_H
#define DFLASH_FSUTIL_H

/* fsyncs the directory containing path ("." for a bare name). Returns 0 or DFLASH_EIO (a file
 * system that cannot fsync directories, EINVAL, counts as success). */
int fs_sync_parent_dir(const char *path);

#endif
