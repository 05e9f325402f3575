/* Internal file-system helpers shared by every module that writes users' files. */
#ifndef KILN_CORE_FS_H
#define KILN_CORE_FS_H

#include <stddef.h>

#include "kiln/status.h"

/* KILN_OK when `path` does not exist or is a regular file (or a link to one), which a
 * write-then-rename may replace; else KILN_ERR_IO naming it. kiln never replaces a
 * folder, device, FIFO or socket with a file. */
kiln_status kiln__check_replaceable(const char *path);

/* fsync the folder holding `path`, making a rename into it durable. */
kiln_status kiln__sync_parent(const char *path);

/* Write bytes to `path` whole or not at all: into a new temporary file beside it (created
 * exclusively, named with the process id and a counter), flushed to disk, renamed over
 * `path`, then the folder flushed. On failure the temporary is removed and an existing
 * `path` is untouched. */
kiln_status kiln__write_file_atomic(const char *path, const void *data, size_t size);

#endif
