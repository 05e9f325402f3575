/* One run owns a checkpoint folder at a time (trainer_ckpt.h): rank 0 holds an flock on
 * <dir>/kiln.lock for the trainer's life, and the file names the owner (pid, host, start) for
 * the message a second run is refused with. The kernel drops the lock when its process dies,
 * however it dies, so a dead owner's lock is taken over by the next run; on a network file
 * system the lock server does the same when the owner's machine goes. The folder is made, and
 * shown writable, at the start: a path that can never hold a checkpoint stops the run before
 * its first step instead of failing at every interval. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fs.h"
#include "kiln/comm.h"
#include "train/trainer_ckpt.h"
#include "train/trainer_internal.h"

/* Faults that may pass (the disk is full now): a warning, and the run goes on unlocked. */
static int may_pass(int err) {
    return err == ENOSPC || err == EDQUOT || err == EINTR || err == EAGAIN || err == ENOMEM ||
           err == EIO;
}

/* "pid 123 on host h since 2026-12-05T10:00:00Z" from a lock file's text (empty: unknown). */
static void describe_owner(const char *text, char *out, size_t cap) {
    cJSON *j = cJSON_Parse(text);
    const cJSON *pid = cJSON_GetObjectItemCaseSensitive(j, "pid");
    const cJSON *host = cJSON_GetObjectItemCaseSensitive(j, "host");
    const cJSON *since = cJSON_GetObjectItemCaseSensitive(j, "started");
    const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(j, "ranks");
    char of[48] = "";
    if (cJSON_IsNumber(ranks) && ranks->valuedouble > 1)
        snprintf(of, sizeof of, ", rank 0 of %.0f", ranks->valuedouble);
    if (cJSON_IsNumber(pid) && cJSON_IsString(host))
        snprintf(out, cap, "pid %.0f on host %s%s%s%s", pid->valuedouble, host->valuestring, of,
                 cJSON_IsString(since) ? " since " : "",
                 cJSON_IsString(since) ? since->valuestring : "");
    else
        snprintf(out, cap, "a run whose lock file names no owner yet");
    cJSON_Delete(j);
}

static void read_text(int fd, char *buf, size_t cap) {
    ssize_t k = pread(fd, buf, cap - 1, 0);
    buf[k > 0 ? k : 0] = '\0';
}

static kiln_status write_owner(kiln_trainer *t, int fd) {
    char host[256] = "unknown", when[32] = "";
    if (gethostname(host, sizeof host) != 0)
        snprintf(host, sizeof host, "unknown");
    host[sizeof host - 1] = '\0';
    time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm))
        strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    char text[512];
    int n = snprintf(text, sizeof text,
                     "{\"pid\": %ld, \"host\": \"%s\", \"started\": \"%s\", \"ranks\": %d}\n",
                     (long)getpid(), host, when, t->world);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, text, (size_t)n, 0) != (ssize_t)n)
        return kiln_error_setf(KILN_ERR_IO, "%s", strerror(errno));
    return KILN_OK;
}

/* Rank 0: the folder made, its lock taken (or a reason the run goes on without one, in
 * *unlocked). */
static kiln_status take(kiln_trainer *t, char *unlocked, size_t cap) {
    const char *dir = t->cfg.checkpoint.dir;
    int err = 0;
    unlocked[0] = '\0';
    kiln_status s = kiln__make_dirs(dir, "the checkpoint folder", &err, &t->ckpt_dir_made);
    if (s != KILN_OK && may_pass(err)) {
        snprintf(unlocked, cap, "%s", kiln_error_message());
        return KILN_OK;
    }
    KILN_CHECK(s);
    char path[KILN__CKPT_PATH];
    KILN_CHECK(kiln__ckpt_path(path, dir, KILN__CKPT_LOCK));
    for (int tries = 0; tries < 100; tries++) {
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd < 0 && may_pass(errno)) {
            snprintf(unlocked, cap, "cannot create %.900s: %s", path, strerror(errno));
            return KILN_OK;
        }
        if (fd < 0)
            return kiln_error_setf(KILN_ERR_IO,
                                   "the checkpoint folder %s cannot be written: cannot create %s: "
                                   "%s",
                                   dir, path, strerror(errno));
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            int e = errno;
            if (e == EWOULDBLOCK) {
                char text[512], who[400];
                read_text(fd, text, sizeof text);
                close(fd);
                describe_owner(text, who, sizeof who);
                return kiln_error_setf(KILN_ERR_BUSY,
                                       "the checkpoint folder %s is in use by another run (%s): "
                                       "give each run a --checkpoint-dir of its own, or wait "
                                       "for that run to end",
                                       dir, who);
            }
            close(fd);
            snprintf(unlocked, cap, "%.900s cannot be locked on this file system: %s", path,
                     strerror(e));
            return KILN_OK;
        }
        /* the file a run that ended unlinked after this open: lock the one at the path now */
        struct stat held, named;
        if (fstat(fd, &held) != 0 || stat(path, &named) != 0 || held.st_ino != named.st_ino ||
            held.st_dev != named.st_dev) {
            close(fd);
            continue;
        }
        char text[512];
        read_text(fd, text, sizeof text);
        if (text[0] && t->cfg.metrics.log) { /* an owner that died without ending */
            char who[400];
            describe_owner(text, who, sizeof who);
            fprintf(t->cfg.metrics.log,
                    "checkpoint folder %s: taking over the lock of %s, which ended "
                    "without releasing it\n",
                    dir, who);
        }
        if (write_owner(t, fd) != KILN_OK) /* the lock holds; only the owner's name is missing */
            fprintf(stderr, "kiln: warning: cannot write the owner into %s: %s\n", path,
                    kiln_error_message());
        t->ckpt_lock_fd = fd;
        t->ckpt_locked = 1;
        snprintf(t->ckpt_lock_path, sizeof t->ckpt_lock_path, "%s", path);
        return KILN_OK;
    }
    return kiln_error_setf(KILN_ERR_IO, "cannot lock %s: it was replaced 100 times meanwhile",
                           path);
}

kiln_status kiln__trainer_ckpt_lock(kiln_trainer *t) {
    t->ckpt_owner = (long)getpid();
    if (!t->cfg.checkpoint.dir)
        return KILN_OK;
    char unlocked[1024] = "";
    kiln_status s = t->rank == 0 ? take(t, unlocked, sizeof unlocked) : KILN_OK;
    if (t->world > 1) { /* every rank learns rank 0's status, and ends with its code */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", s != KILN_OK ? kiln_error_message() : "");
        float code = (float)-s;
        KILN_CHECK(kiln_comm_allreduce(&code, &code, 1, KILN_DTYPE_F32, KILN_REDUCE_MAX, t->comm));
        if (code > 0.0f) {
            t->agreed_failure = 1;
            if (t->rank == 0)
                return kiln_error_setf(s, "%s", msg);
            return kiln_error_setf((kiln_status)-(int)code,
                                   "rank 0 failed to take the checkpoint folder (its message says "
                                   "why); rank %d stops too",
                                   t->rank);
        }
    }
    KILN_CHECK(s);
    if (unlocked[0])
        fprintf(stderr,
                "kiln: warning: the checkpoint folder %s is not locked (%s): make sure no other "
                "run writes checkpoints into it\n",
                t->cfg.checkpoint.dir, unlocked);
    if (t->world > 1) { /* every rank names the temporary folders after rank 0's process */
        double owner = (double)t->ckpt_owner;
        KILN_CHECK(kiln_comm_broadcast(&owner, 2, KILN_DTYPE_F32, 0, t->comm));
        t->ckpt_owner = (long)owner;
    }
    return KILN_OK;
}

void kiln__trainer_ckpt_unlock(kiln_trainer *t) {
    if (!t->ckpt_locked)
        return;
    (void)unlink(t->ckpt_lock_path); /* while held: the next run locks a file of its own */
    close(t->ckpt_lock_fd);
    t->ckpt_locked = 0;
    /* the folders this run made and left empty (a start refused later on, a run that wrote
     * no checkpoint) go again: a failed run leaves the files as they were */
    char p[KILN__CKPT_PATH];
    snprintf(p, sizeof p, "%s", t->cfg.checkpoint.dir);
    while (t->ckpt_dir_made > 0 && strlen(p) >= t->ckpt_dir_made && rmdir(p) == 0) {
        char *slash = strrchr(p, '/');
        if (!slash)
            break;
        *slash = '\0';
    }
}
