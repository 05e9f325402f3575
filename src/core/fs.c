#include "core/fs.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"

kiln_status kiln__check_replaceable(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno == ENOENT)
            return KILN_OK;
        return kiln__errorf(KILN_ERR_IO, "%s: %s", path, strerror(errno));
    }
    if (S_ISREG(st.st_mode))
        return KILN_OK;
    const char *kind = S_ISDIR(st.st_mode)    ? "a folder"
                       : S_ISFIFO(st.st_mode) ? "a FIFO"
                       : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "not a regular file";
    return kiln__errorf(KILN_ERR_IO, "%s is %s; kiln only writes regular files, and will not "
                                     "replace it", path, kind);
}
