/* Internal file-system helpers shared by every module that writes users' files. */
#ifndef KILN_CORE_FS_H
#define KILN_CORE_FS_H

#include "kiln/status.h"

/* KILN_OK when `path` does not exist or is a regular file (or a link to one), which a
 * write-then-rename may replace; else KILN_ERR_IO naming it. kiln never replaces a
 * folder, device, FIFO or socket with a file. */
kiln_status kiln__check_replaceable(const char *path);

#endif
