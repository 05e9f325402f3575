#include "core/fs.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

kiln_status kiln__sync_parent(const char *path) {
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return kiln__errorf(KILN_ERR_IO, "%s: cannot open the folder to sync it: %s", dir,
                            strerror(errno));
    int rc = fsync(fd);
    int err = errno;
    close(fd);
    if (rc != 0 && err != EINVAL) /* some file systems cannot sync a folder */
        return kiln__errorf(KILN_ERR_IO, "%s: folder fsync failed: %s", dir, strerror(err));
    return KILN_OK;
}

kiln_status kiln__write_file_atomic(const char *path, const void *data, size_t size) {
    static _Atomic unsigned counter;
    KILN_CHECK(kiln__check_replaceable(path));
    size_t cap = strlen(path) + 64;
    char *tmp = malloc(cap);
    if (!tmp)
        return kiln__errorf(KILN_ERR_NOMEM, "cannot allocate a file name for %s", path);
    snprintf(tmp, cap, "%s.tmp.%ld.%u", path, (long)getpid(), atomic_fetch_add(&counter, 1));
    kiln_status s = KILN_OK;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        s = kiln__errorf(KILN_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
        free(tmp);
        return s;
    }
    const char *p = data;
    size_t left = size;
    while (left > 0 && s == KILN_OK) {
        ssize_t n = write(fd, p, left);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            s = kiln__errorf(KILN_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
        else
            p += n, left -= (size_t)n;
    }
    if (s == KILN_OK && fsync(fd) != 0)
        s = kiln__errorf(KILN_ERR_IO, "cannot flush %s: %s", tmp, strerror(errno));
    if (close(fd) != 0 && s == KILN_OK)
        s = kiln__errorf(KILN_ERR_IO, "cannot close %s: %s", tmp, strerror(errno));
    if (s == KILN_OK && rename(tmp, path) != 0)
        s = kiln__errorf(KILN_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    if (s != KILN_OK)
        unlink(tmp);
    else
        (void)kiln__sync_parent(path); /* the data itself is already on disk */
    free(tmp);
    return s;
}
