#include "core/fs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "kiln/core.h"

/* What a non-regular file is, for messages. */
static const char *kind_of(mode_t m) {
    return S_ISDIR(m)                    ? "a folder"
           : S_ISFIFO(m)                 ? "a FIFO (named pipe)"
           : S_ISCHR(m) || S_ISBLK(m)    ? "a device"
           : S_ISSOCK(m)                 ? "a socket"
                                         : "not a regular file";
}

kiln_status kiln_file_check_replaceable(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno == ENOENT)
            return KILN_OK;
        return kiln_error_setf(KILN_ERR_IO, "%s: %s", path, strerror(errno));
    }
    if (S_ISREG(st.st_mode))
        return KILN_OK;
    const char *kind = S_ISDIR(st.st_mode)                          ? "a folder"
                       : S_ISFIFO(st.st_mode)                       ? "a FIFO"
                       : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                       : S_ISSOCK(st.st_mode)                       ? "a socket"
                                                                    : "not a regular file";
    return kiln_error_setf(KILN_ERR_IO,
                           "%s is %s; kiln only writes regular files, and will not replace it",
                           path, kind);
}

kiln_status kiln_file_open_regular(const char *path, int *fd, uint64_t *size) {
    *fd = -1;
    struct stat st;
    if (!path || !path[0])
        return kiln_error_setf(KILN_ERR_ARG, "no file named");
    if (stat(path, &st) != 0)
        return kiln_error_setf(errno == ENOENT ? KILN_ERR_NOT_FOUND : KILN_ERR_IO, "%s: %s",
                               path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return kiln_error_setf(KILN_ERR_IO, "%s is %s; kiln reads only regular files", path,
                               kind_of(st.st_mode));
    /* O_NONBLOCK: if the name was swapped for a FIFO since the stat, open does not wait. */
    int f = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (f < 0)
        return kiln_error_setf(errno == ENOENT ? KILN_ERR_NOT_FOUND : KILN_ERR_IO,
                               "cannot open %s: %s", path, strerror(errno));
    if (fstat(f, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(f);
        return kiln_error_setf(KILN_ERR_IO, "%s is not a regular file; kiln reads only those",
                               path);
    }
    int flags = fcntl(f, F_GETFL);
    if (flags >= 0)
        (void)fcntl(f, F_SETFL, flags & ~O_NONBLOCK);
    *fd = f;
    if (size)
        *size = (uint64_t)st.st_size;
    return KILN_OK;
}

kiln_status kiln_file_read(const char *path, size_t max_bytes, char **data, size_t *len) {
    *data = NULL;
    *len = 0;
    int fd;
    uint64_t size;
    KILN_CHECK(kiln_file_open_regular(path, &fd, &size));
    if (max_bytes && size > max_bytes) {
        close(fd);
        return kiln_error_setf(KILN_ERR_RANGE, "%s is %llu bytes, more than the %zu this reader "
                                               "takes",
                               path, (unsigned long long)size, max_bytes);
    }
    if (size >= SIZE_MAX) {
        close(fd);
        return kiln_error_setf(KILN_ERR_NOMEM, "%s is too large to read", path);
    }
    char *b = malloc((size_t)size + 1);
    if (!b) {
        close(fd);
        return kiln_error_setf(KILN_ERR_NOMEM, "no memory for the %llu bytes of %s",
                               (unsigned long long)size, path);
    }
    /* Read what the size said: a file that grows meanwhile is read as it was. */
    size_t got = 0;
    while (got < (size_t)size) {
        ssize_t k = read(fd, b + got, (size_t)size - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            kiln_status s = kiln_error_setf(KILN_ERR_IO, "cannot read %s: %s", path,
                                            strerror(errno));
            free(b);
            close(fd);
            return s;
        }
        if (k == 0)
            break; /* shrank meanwhile: take what is there */
        got += (size_t)k;
    }
    close(fd);
    b[got] = '\0';
    *data = b;
    *len = got;
    return KILN_OK;
}

/* The folder part of path into dir ("." or "/" when it has none). */
static void parent_of(const char *path, char *dir, size_t cap) {
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, cap, ".");
    else if (slash == path)
        snprintf(dir, cap, "/");
    else
        snprintf(dir, cap, "%.*s", (int)(slash - path), path);
}

kiln_status kiln__sync_parent(const char *path) {
    char dir[4096];
    parent_of(path, dir, sizeof dir);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return kiln_error_setf(KILN_ERR_IO, "%s: cannot open the folder to sync it: %s", dir,
                               strerror(errno));
    int rc = fsync(fd);
    int err = errno;
    close(fd);
    if (rc != 0 && err != EINVAL) /* some file systems cannot sync a folder */
        return kiln_error_setf(KILN_ERR_IO, "%s: folder fsync failed: %s", dir, strerror(err));
    return KILN_OK;
}

/* pid when name is "<base>.tmp.<pid>" or "<base>.tmp.<pid>.<n>", else 0. */
static long temp_owner(const char *name, const char *base) {
    size_t n = strlen(base);
    if (strncmp(name, base, n) != 0 || strncmp(name + n, ".tmp.", 5) != 0)
        return 0;
    const char *p = name + n + 5;
    char *end;
    errno = 0;
    long pid = strtol(p, &end, 10);
    if (errno || end == p || pid <= 0 || *p < '0' || *p > '9')
        return 0;
    if (*end == '.') {
        const char *q = end + 1;
        if (*q < '0' || *q > '9')
            return 0;
        strtoul(q, &end, 10);
    }
    return *end == '\0' ? pid : 0;
}

/* flock cannot be had on this file system, so the writer could not lock either. */
static int flock_unsupported(int err) {
    return err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS || err == EINVAL;
}

/* Seconds since st's last write. */
static double age_s(const struct stat *st) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return (double)(now.tv_sec - st->st_mtim.tv_sec) +
           (double)(now.tv_nsec - st->st_mtim.tv_nsec) * 1e-9;
}

/* Whether the temporary `full`, of a process that is not alive on this machine, has no
 * writer left. Its writer holds a flock from creation to commit or abort, so one we can
 * lock is dead, on whatever host it ran (the lock travels where the file system supports
 * locks); a file younger than 2 s may be a writer's between its open and its flock. Without
 * locks, only a temporary left unwritten for a minute is taken for a dead writer's. */
static int temp_abandoned(const char *full, int *fd) {
    *fd = -1;
    struct stat st;
    if (lstat(full, &st) != 0 || !S_ISREG(st.st_mode) || age_s(&st) < 2.0)
        return 0;
    *fd = open(full, O_WRONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    if (*fd < 0) /* not ours to open (another user's): it cannot be locked to tell */
        return age_s(&st) >= 60.0;
    if (flock(*fd, LOCK_EX | LOCK_NB) == 0)
        return 1; /* held until *fd closes, after the unlink */
    /* EWOULDBLOCK: a live writer elsewhere holds it */
    return flock_unsupported(errno) && age_s(&st) >= 60.0;
}

int kiln__remove_stale_temps(const char *path) {
    char dir[4096];
    parent_of(path, dir, sizeof dir);
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (!base[0])
        return 0;
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long pid = temp_owner(e->d_name, base);
        if (pid == 0 || pid == (long)getpid())
            continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue; /* alive here (or not ours to ask about) */
        char full[8192];
        if ((size_t)snprintf(full, sizeof full, "%s/%s", dir, e->d_name) >= sizeof full)
            continue;
        int fd;
        if (temp_abandoned(full, &fd) && unlink(full) == 0)
            removed++;
        if (fd >= 0)
            close(fd);
    }
    closedir(d);
    return removed;
}

kiln_status kiln__atomic_open(kiln__atomic_file *f, const char *path) {
    static _Atomic unsigned counter;
    f->fd = -1;
    f->path = f->tmp = NULL;
    if (!path || !path[0])
        return kiln_error_setf(KILN_ERR_ARG, "no file name to write");
    KILN_CHECK(kiln_file_check_replaceable(path));
    (void)kiln__remove_stale_temps(path);
    size_t cap = strlen(path) + 64;
    f->path = strdup(path);
    f->tmp = malloc(cap);
    if (!f->path || !f->tmp) {
        kiln__atomic_abort(f);
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate a file name for %s", path);
    }
    for (int tries = 0; tries < 100; tries++) {
        snprintf(f->tmp, cap, "%s.tmp.%ld.%u", path, (long)getpid(), atomic_fetch_add(&counter, 1));
        f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (f->fd >= 0) {
            /* Held until the close at commit or abort: while it is, no other process's
             * kiln__remove_stale_temps takes the file for a dead writer's. A file system
             * without locks leaves the age rule alone to protect it. */
            (void)flock(f->fd, LOCK_EX | LOCK_NB);
            return KILN_OK;
        }
        if (errno != EEXIST) {
            kiln_status s =
                kiln_error_setf(KILN_ERR_IO, "cannot create %s: %s", f->tmp, strerror(errno));
            free(f->tmp); /* nothing was created: abort must not remove another's file */
            f->tmp = NULL;
            kiln__atomic_abort(f);
            return s;
        }
    }
    free(f->tmp);
    f->tmp = NULL;
    kiln__atomic_abort(f);
    return kiln_error_setf(KILN_ERR_IO, "cannot create a temporary file next to %s", path);
}

kiln_status kiln__atomic_write(kiln__atomic_file *f, const void *data, size_t n) {
    const char *p = data;
    while (n > 0) {
        ssize_t k = write(f->fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return kiln_error_setf(KILN_ERR_IO, "cannot write %s: %s", f->tmp,
                                   k < 0 ? strerror(errno) : "no progress");
        p += k;
        n -= (size_t)k;
    }
    return KILN_OK;
}

kiln_status kiln__atomic_pwrite(kiln__atomic_file *f, const void *data, size_t n, uint64_t offset) {
    const char *p = data;
    while (n > 0) {
        ssize_t k = pwrite(f->fd, p, n, (off_t)offset);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return kiln_error_setf(KILN_ERR_IO, "cannot write %s: %s", f->tmp,
                                   k < 0 ? strerror(errno) : "no progress");
        p += k;
        n -= (size_t)k;
        offset += (uint64_t)k;
    }
    return KILN_OK;
}

kiln_status kiln__atomic_commit(kiln__atomic_file *f) {
    kiln_status s = KILN_OK;
    if (fsync(f->fd) != 0)
        s = kiln_error_setf(KILN_ERR_IO, "cannot flush %s: %s", f->tmp, strerror(errno));
    int rc = close(f->fd);
    f->fd = -1;
    if (rc != 0 && s == KILN_OK)
        s = kiln_error_setf(KILN_ERR_IO, "cannot close %s: %s", f->tmp, strerror(errno));
    if (s == KILN_OK && rename(f->tmp, f->path) != 0)
        s = kiln_error_setf(KILN_ERR_IO, "cannot rename %s to %s: %s", f->tmp, f->path,
                            strerror(errno));
    if (s != KILN_OK) {
        kiln__atomic_abort(f);
        return s;
    }
    (void)kiln__sync_parent(f->path); /* the data itself is already on disk */
    free(f->tmp);
    free(f->path);
    f->tmp = f->path = NULL;
    return KILN_OK;
}

void kiln__atomic_abort(kiln__atomic_file *f) {
    if (f->fd >= 0)
        close(f->fd);
    f->fd = -1;
    if (f->tmp)
        unlink(f->tmp);
    free(f->tmp);
    free(f->path);
    f->tmp = f->path = NULL;
}

kiln_status kiln__write_file_atomic(const char *path, const void *data, size_t size) {
    kiln__atomic_file f;
    KILN_CHECK(kiln__atomic_open(&f, path));
    kiln_status s = kiln__atomic_write(&f, data, size);
    if (s != KILN_OK) {
        kiln__atomic_abort(&f);
        return s;
    }
    return kiln__atomic_commit(&f);
}

kiln_status kiln_file_write(const char *path, const void *data, size_t size) {
    return kiln__write_file_atomic(path, data, size);
}

kiln_status kiln__make_dirs(const char *path, const char *what, int *err, size_t *made) {
    char p[4096];
    *err = 0;
    *made = 0;
    if ((size_t)snprintf(p, sizeof p, "%s", path) >= sizeof p)
        return kiln_error_setf(KILN_ERR_ARG, "%s's path is too long", what);
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s != '\0')
            continue;
        char c = *s;
        *s = '\0';
        struct stat sb;
        if (mkdir(p, 0777) == 0) {
            if (!*made)
                *made = strlen(p);
        } else if (errno != EEXIST) {
            *err = errno;
            return kiln_error_setf(KILN_ERR_IO, "cannot create %s %s: %s", what, p,
                                   strerror(errno));
        }
        if (stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            *err = ENOTDIR;
            return kiln_error_setf(KILN_ERR_IO, "%s %s cannot be made: %s is not a folder",
                                   what, path, p);
        }
        *s = c;
        if (c == '\0')
            break;
    }
    return KILN_OK;
}
