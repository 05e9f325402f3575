/* Internal file-system helpers shared by every module that writes users' files.
 *
 * Every file kiln writes for a user goes through kiln__atomic_*: the bytes go to a new
 * temporary beside the target ("<target>.tmp.<pid>.<n>", created exclusively), which is
 * flushed, closed and renamed over the target, and the folder is then flushed so the
 * rename itself is durable. Any failure removes the temporary, so the target is either the
 * old file, byte for byte, or the complete new one. The writer holds an exclusive flock on
 * its temporary from creation to commit or abort, so that temporaries of the same target
 * left by processes that died mid-write (a SIGKILL, a lost node) are told from live ones
 * and removed when the next write of that target starts. */
#ifndef KILN_CORE_FS_H
#define KILN_CORE_FS_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/core.h"
#include "kiln/status.h"

/* fsync the folder holding `path`, making a rename into it durable. */
kiln_status kiln__sync_parent(const char *path);

/* A file being written under a temporary name. Initialised with KILN__ATOMIC_FILE_INIT, and
 * after a failed open, a commit or an abort, fd is -1 and the names NULL, and
 * kiln__atomic_abort is a no-op. */
typedef struct kiln__atomic_file {
    int fd;
    char *path; /* the target */
    char *tmp;  /* the temporary beside it */
} kiln__atomic_file;
#define KILN__ATOMIC_FILE_INIT                                                                     \
    { -1, NULL, NULL }

/* Check that `path` may be replaced (kiln_file_check_replaceable), remove stale temporaries
 * of it, and create a new temporary, flock'ed (LOCK_EX) until commit or abort where the file
 * system has locks. On failure f is released. */
kiln_status kiln__atomic_open(kiln__atomic_file *f, const char *path);
/* Append n bytes; pwrite writes at a byte offset (a header filled in last). */
kiln_status kiln__atomic_write(kiln__atomic_file *f, const void *data, size_t n);
kiln_status kiln__atomic_pwrite(kiln__atomic_file *f, const void *data, size_t n, uint64_t offset);
/* Flush, close and rename over the target, then flush the folder. f is released whether
 * this succeeds or not; on failure the temporary is removed and the target untouched. */
kiln_status kiln__atomic_commit(kiln__atomic_file *f);
/* Give up: close and remove the temporary. Safe on a released or zeroed f. */
void kiln__atomic_abort(kiln__atomic_file *f);

/* Write bytes to `path` whole or not at all (open, write, commit). */
kiln_status kiln__write_file_atomic(const char *path, const void *data, size_t size);

/* Remove "<path>.tmp.<pid>[.<n>]" files beside `path` whose writer is dead: the pid is no
 * live process on this machine and the file's flock can be taken (a live writer on another
 * host holds it, where the shared file system supports locks). One younger than 2 s is kept
 * (its writer may be between its open and its flock). Where locks are unsupported (ENOLCK,
 * EOPNOTSUPP, ENOSYS, EINVAL) or the file cannot be opened to lock, only one not written
 * for a minute is removed. Returns the number removed. */
int kiln__remove_stale_temps(const char *path);

/* mkdir -p of path, `what` naming it in errors ("the checkpoint folder"): *err is the errno
 * of a failure (ENOTDIR where a part is not a folder), *made the length of the first folder
 * it made (0: none, path was there). */
kiln_status kiln__make_dirs(const char *path, const char *what, int *err, size_t *made);

#endif
