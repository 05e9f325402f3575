#include "train/metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"

struct kiln__metrics {
    int fd;
    char *path;
    off_t good;       /* the end of the last whole line written (-1: not seekable) */
    char *keep;       /* lines not yet written, each with its newline */
    size_t len, cap;
    int64_t lines;    /* lines in keep */
    int64_t dropped;  /* lines dropped for keep's limit */
    int failing;      /* the last write failed (the console was told) */
    int inject;       /* test aid: writes still to fail */
    int inject_half;  /* the next injected failure writes half its bytes first */
};

/* Metrics may go to a regular file, a device (/dev/stdout) or a FIFO that a process reads;
 * O_NONBLOCK makes a FIFO that nobody reads fail at once instead of blocking the run. */
kiln_status kiln__metrics_open(kiln__metrics **out, const char *path, int append) {
    *out = NULL;
    int fd = open(path, O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC) | O_CLOEXEC | O_NONBLOCK,
                  0666);
    if (fd < 0) {
        int e = errno;
        return kiln_error_setf(KILN_ERR_IO, "cannot open metrics file %s for writing: %s%s", path,
                               strerror(e),
                               e == ENXIO ? " (a FIFO that no process is reading)" : "");
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0)
        (void)fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    kiln__metrics *m = calloc(1, sizeof *m);
    if (!m || !(m->path = strdup(path))) {
        free(m);
        close(fd);
        return kiln_error_setf(KILN_ERR_NOMEM, "out of memory");
    }
    m->fd = fd;
    m->good = lseek(fd, 0, SEEK_END);
    *out = m;
    return KILN_OK;
}

/* All of buf, or -1 with errno. */
static int write_all(kiln__metrics *m, const char *buf, size_t n) {
    if (m->inject > 0) {
        m->inject--;
        if (m->inject_half) {
            m->inject_half = 0;
            if (write(m->fd, buf, n / 2) < 0)
                return -1;
        }
        errno = ENOSPC;
        return -1;
    }
    while (n > 0) {
        ssize_t w = write(m->fd, buf, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            if (w == 0)
                errno = EIO;
            return -1;
        }
        buf += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Everything kept, written; on failure the file cut back to its last whole line. */
static int flush_kept(kiln__metrics *m, int *err) {
    if (m->len == 0)
        return 0;
    if (write_all(m, m->keep, m->len) == 0) {
        if (m->good >= 0)
            m->good += (off_t)m->len;
        m->len = 0;
        m->lines = 0;
        return 0;
    }
    *err = errno;
    if (m->good >= 0 && ftruncate(m->fd, m->good) == 0)
        (void)lseek(m->fd, m->good, SEEK_SET);
    return -1;
}

static void keep_line(kiln__metrics *m, const char *line) {
    size_t n = strlen(line) + 1;
    while (m->len + n > KILN__METRICS_KEEP && m->len > 0) { /* the oldest line goes */
        char *nl = memchr(m->keep, '\n', m->len);
        size_t first = nl ? (size_t)(nl - m->keep) + 1 : m->len;
        memmove(m->keep, m->keep + first, m->len - first);
        m->len -= first;
        m->lines--;
        m->dropped++;
    }
    if (m->len + n > m->cap) {
        size_t cap = m->cap ? m->cap : 4096;
        while (cap < m->len + n)
            cap *= 2;
        char *k = realloc(m->keep, cap);
        if (!k) {
            m->dropped++;
            return;
        }
        m->keep = k;
        m->cap = cap;
    }
    memcpy(m->keep + m->len, line, n - 1);
    m->keep[m->len + n - 1] = '\n';
    m->len += n;
    m->lines++;
}

void kiln__metrics_line(kiln__metrics *m, const char *line, FILE *log) {
    if (!m)
        return;
    keep_line(m, line);
    int err = 0;
    if (flush_kept(m, &err) == 0) {
        if (m->failing && log)
            fprintf(log, "metrics: %s can be written again; the lines kept meanwhile are in it\n",
                    m->path);
        m->failing = 0;
        return;
    }
    if (!m->failing)
        kiln__warn(log,
                   "cannot write metrics to %s: %s; training goes on and the lines are kept in "
                   "memory and written when the file takes them again",
                   m->path, strerror(err));
    m->failing = 1;
}

int64_t kiln__metrics_pending(const kiln__metrics *m) { return m ? m->lines : 0; }

void kiln__metrics_fail_writes(kiln__metrics *m, int count) {
    m->inject = count;
    m->inject_half = 1;
}

/* Lines that the metrics file would not take, in a file of their own: TMPDIR, /tmp, then the
 * current folder. */
static void rescue(kiln__metrics *m, FILE *log) {
    const char *dirs[3] = {getenv("TMPDIR"), "/tmp", "."};
    const char *base = strrchr(m->path, '/');
    base = base ? base + 1 : m->path;
    for (int i = 0; i < 3; i++) {
        if (!dirs[i] || !dirs[i][0])
            continue;
        char p[4096];
        snprintf(p, sizeof p, "%s/%s.unwritten-%ld", dirs[i], base, (long)getpid());
        int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0)
            continue;
        size_t off = 0;
        while (off < m->len) {
            ssize_t w = write(fd, m->keep + off, m->len - off);
            if (w <= 0)
                break;
            off += (size_t)w;
        }
        int ok = off == m->len && fsync(fd) == 0;
        ok = close(fd) == 0 && ok;
        if (ok) {
            kiln__warn(log, "metrics: %lld line(s) that %s would not take are in %s (append "
                            "them to it)",
                       (long long)m->lines, m->path, p);
            return;
        }
        unlink(p);
    }
    kiln__warn(log, "metrics: %lld line(s) could not be written anywhere: they are lost",
               (long long)m->lines);
}

void kiln__metrics_close(kiln__metrics *m, FILE *log) {
    if (!m)
        return;
    int err = 0;
    if (flush_kept(m, &err) != 0)
        rescue(m, log);
    if (m->dropped)
        kiln__warn(log, "metrics: %lld line(s) were dropped while %s could not be written",
                   (long long)m->dropped, m->path);
    close(m->fd);
    free(m->keep);
    free(m->path);
    free(m);
}

/* A JSON number, or null for NaN and infinities (JSON has no such numbers). */
static const char *num(char *buf, size_t cap, const char *fmt, double v) {
    if (!isfinite(v))
        return "null";
    snprintf(buf, cap, fmt, v);
    return buf;
}

/* Appends to buf at *at (bounded by cap). */
#define PUT(...)                                                                                   \
    do {                                                                                           \
        if (*at < cap)                                                                             \
            *at += (size_t)snprintf(buf + *at, cap - *at, __VA_ARGS__);                            \
    } while (0)

static void format_into(char *buf, size_t cap, size_t *at, const kiln_step_info *s) {
    char a[32], b[32];
    PUT("{\"step\": %lld, \"loss\": %s, \"lr\": %.6g, \"grad_norm\": %s, \"ms\": %.3f, "
        "\"tokens_per_s\": %.2f, \"mfu\": %.5f, \"peak_rss_mb\": %.1f",
        (long long)s->step, num(a, sizeof a, "%.6f", s->loss), s->lr,
        num(b, sizeof b, "%.6f", s->grad_norm), s->ms, s->tokens_per_s, s->mfu,
        (double)s->rss / (1024.0 * 1024.0));
    if (!isnan(s->val_loss))
        PUT(", \"val_loss\": %.6f", s->val_loss);
    if (s->loss_scale > 0)
        PUT(", \"loss_scale\": %.9g, \"skipped\": %d, \"skipped_total\": %lld", s->loss_scale,
            s->skipped, (long long)s->skipped_total);
    else if (s->skipped)
        PUT(", \"skipped\": 1");
    if (s->guard)
        PUT(", \"guard\": \"%s\", \"z\": %.3f", s->guard, s->guard_z);
    else if (s->clipped_spike)
        PUT(", \"clipped_spike\": 1, \"z\": %.3f", s->guard_z);
    if (s->world > 1)
        PUT(", \"world\": %d, \"comm_ms\": %.3f, \"comm_hidden\": %.4f, \"comm_bytes\": %llu, "
            "\"net_bytes\": %llu",
            s->world, s->comm_ms, s->comm_hidden, (unsigned long long)s->comm_bytes,
            (unsigned long long)s->net_bytes);
    if (s->elapsed_s > 0)
        PUT(", \"elapsed_s\": %.3f", s->elapsed_s);
    PUT("}");
}

void kiln__train_metrics_format(char *buf, size_t cap, const kiln_step_info *s) {
    size_t at = 0;
    buf[0] = '\0';
    format_into(buf, cap, &at, s);
}

/* Seconds as m:ss, or h:mm:ss from an hour on. */
static const char *clock_text(char *buf, size_t cap, double seconds) {
    long long t = (long long)(seconds + 0.5);
    if (t >= 3600)
        snprintf(buf, cap, "%lld:%02lld:%02lld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(buf, cap, "%lld:%02lld", t / 60, t % 60);
    return buf;
}

void kiln__train_metrics_console(FILE *log, const kiln_step_info *s) {
    if (!log)
        return;
    fprintf(log,
            "step %5lld/%lld | loss %.4f | lr %.2e | norm %7.4f | %8.1f ms | %8.0f tok/s | "
            "MFU %5.1f%%",
            (long long)s->step, (long long)s->steps, s->loss, s->lr, s->grad_norm, s->ms,
            s->tokens_per_s, 100.0 * s->mfu);
    if (!isnan(s->val_loss))
        fprintf(log, " | val %.4f", s->val_loss);
    if (s->loss_scale > 0)
        fprintf(log, " | scale %g%s", s->loss_scale,
                s->skipped && !s->guard ? " (overflow: step skipped)" : "");
    if (s->guard)
        fprintf(log, " | skipped: %s (z %.1f)", s->guard, s->guard_z);
    else if (s->clipped_spike)
        fprintf(log, " | norm spike clipped (z %.1f)", s->guard_z);
    if (s->world > 1)
        fprintf(log, " | comm %.1f ms (%.0f%% hidden)", s->comm_ms, 100.0 * s->comm_hidden);
    if (s->elapsed_s > 0) {
        char el[32], left[32];
        fprintf(log, " | %s elapsed", clock_text(el, sizeof el, s->elapsed_s));
        if (isfinite(s->eta_s))
            fprintf(log, ", %s left", clock_text(left, sizeof left, s->eta_s));
    }
    fprintf(log, "\n");
    fflush(log);
}
