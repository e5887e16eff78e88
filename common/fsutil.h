/* fsutil: file-system steps shared by the writers. The durability step of every atomic file
 * writer (safetensors, shards, config files, checkpoints, journal compaction): after `write tmp,
 * fsync, rename`, the directory that holds the new name must be fsync'd too, or a crash can lose
 * the rename; fs_write_atomic does all of it for a small file. And `mkdir -p` for the output directories a daemon writes into (metrics,
 * checkpoints), created at start-up so that a bad path is an error then, not hours later.
 * And the readers' first step: a regular file opened (never waiting on a FIFO) or read whole.
 *
 * Local trust (docs/operating.md, "Across hosts"): another user of the host may plant things
 * where we write or listen. A temporary file is created only new (fs_create_new: a symlink at
 * its name is removed, never followed), and the directory of ipc:// sockets must be ours and
 * closed to everyone else (fs_make_private_dir, for the broker and the daemons, which make it;
 * fs_check_private_dir, the same checks for a program that only looks for a broker, and makes
 * nothing).
 * Thread-safe. */
#ifndef DFLASH_FSUTIL_H
#define DFLASH_FSUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* The directory holding path into out: "." for a bare name, "/" for one at the root. Returns 0
 * or DFLASH_EINVAL (path does not fit len). */
int fs_parent_dir(const char *path, char *out, size_t len);

/* fsyncs the directory containing path ("." for a bare name). Returns 0 or DFLASH_EIO (a file
 * system that cannot fsync directories, EINVAL, counts as success). */
int fs_sync_parent_dir(const char *path);

/* mkdir -p dir (mode 0755 for what it creates). Returns 0 when dir is a directory at the end,
 * DFLASH_EIO with errno set when a component cannot be created (or is not a directory),
 * DFLASH_EINVAL for a path over PATH_MAX. */
int fs_make_dirs(const char *dir);

/* Makes sure dir is a directory only we can use, as the ipc:// sockets in it have no other
 * access control: creates it (mode 0700) when missing, then refuses one that is a symbolic link,
 * not a directory, not owned by our effective uid, or open to group or others (lstat of dir
 * without its trailing slashes: the link itself is judged, never where it points). Returns 0,
 * DFLASH_EIO (it cannot be created or examined), DFLASH_ECONFIG (a symlink, not a directory, a
 * path over PATH_MAX) or DFLASH_EDENIED (not ours, or open), with a message naming dir, its
 * owner and mode and the fix (chmod 700; run as its owner's uid; another directory) in err. */
int fs_make_private_dir(const char *dir, char *err, size_t errlen);
/* fs_make_private_dir's checks of an existing dir, creating nothing: a missing dir (ENOENT; a
 * missing parent too) is DFLASH_ENOTFOUND, "DIR does not exist" in err; else its returns. */
int fs_check_private_dir(const char *dir, char *err, size_t errlen);

/* Whether the file open at fd (a shared-memory object we are about to map) is one of ours: a
 * regular file of our effective uid, closed to group and others (we make them 0600). Another
 * user's, or one others may write, could hold anything. Else false, the reason (its owner and
 * mode) in why (may be NULL). */
bool fs_fd_private(int fd, char *why, size_t len);

/* Creates path anew for writing (flags: O_WRONLY or O_RDWR, plus others) with mode, for a
 * temporary name this process alone writes (NAME.tmp.PID, or one held under a lock): whatever
 * is at the name (a stale temporary, a symlink another user planted) is unlinked first, and the
 * create is exclusive and never follows a symlink, so it cannot write through one; one planted
 * again in between makes it fail (EEXIST). The new file is flock'ed (exclusive) for the
 * descriptor's life, so a file there that another process holds such a lock on (a live writer of
 * the same name: processes of one PID in two containers writing one shared volume) is left
 * alone, and the call fails with EBUSY; so it does when such a writer replaced the name between
 * our create and our lock. Returns the descriptor (O_CLOEXEC) or -1 with errno. */
int fs_create_new(const char *path, int flags, mode_t mode);

/* A writer's temporary file "<path>.tmp.<pid>" (dflash-data's shard, dflash-gen's output,
 * dflash-mkmodel's safetensors) stays behind when its writer is killed outright (SIGKILL, a
 * crash). This removes those of path whose pid is no live process (kill(pid, 0) fails with
 * ESRCH) and that no process holds an flock on (a writer of the same pid number in another
 * container, on a shared volume, holds one), each with a WARN naming it, its size and what
 * (e.g. "a partial shard"); a live pid's (another writer, or one we may not signal) is kept.
 * Returns how many it removed. Call before creating this run's temporary file. */
int fs_remove_stale_temps(const char *path, const char *what);

/* Flushes stdout and says whether everything printed to it was written: false (with
 * "PROGRAM: cannot write the result to standard output: REASON" on stderr) on a full disk or
 * a closed pipe behind it, so that a command's result lost on the way exits non-zero. */
bool fs_stdout_written(const char *program);

/* Writes len bytes of buf to path atomically: path.tmp.PID (fs_create_new), fsync, rename, fsync
 * of the directory; the file gets mode 0644. Returns 0, or DFLASH_EIO with errno kept as the
 * failing call left it (a full disk: ENOSPC) and no temporary file left behind. */
int fs_write_atomic(const char *path, const void *buf, size_t len);
/* The same with the file's mode given (0600: for the owner alone). */
int fs_write_atomic_mode(const char *path, const void *buf, size_t len, mode_t mode);

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
