/* TensorBoard event files (tfevents.h): tf.Event records written by hand-encoded protocol
 * buffers (three small messages) and framed with ISA-L's CRC32C. */
#include "train/tfevents.h"

#include <errno.h>
#include <fcntl.h>
#include <isa-l/crc.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fs.h"

struct kiln__tfevents {
    int fd;
    int versioned; /* the file_version record is written (it goes first) */
    int failing; /* the last write failed: warned once, tried again at the next step */
    int64_t lost;
    char path[4096];
};

uint32_t kiln__crc32c(const void *data, size_t n) {
    /* crc32_iscsi leaves out the final inversion; its length is an int */
    uint32_t c = 0xFFFFFFFFu;
    const unsigned char *p = data;
    while (n > 0) {
        int k = n > (1u << 30) ? 1 << 30 : (int)n;
        c = crc32_iscsi((unsigned char *)p, k, c);
        p += k;
        n -= (size_t)k;
    }
    return c ^ 0xFFFFFFFFu;
}

uint32_t kiln__crc32c_masked(const void *data, size_t n) {
    uint32_t c = kiln__crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* ---- a protocol buffer, appended to a growing buffer ---- */

typedef struct pb {
    unsigned char *p;
    size_t len, cap;
    int oom;
} pb;

static void put(pb *b, const void *data, size_t n) {
    if (b->oom)
        return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->len + n)
            cap *= 2;
        unsigned char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
}

static void varint(pb *b, uint64_t v) {
    unsigned char t[10];
    int n = 0;
    do {
        t[n] = (unsigned char)(v & 0x7f);
        v >>= 7;
        if (v)
            t[n] |= 0x80;
        n++;
    } while (v);
    put(b, t, (size_t)n);
}

static void key(pb *b, int field, int wire) { varint(b, (uint64_t)field << 3 | (uint64_t)wire); }

static void bytes_field(pb *b, int field, const void *data, size_t n) {
    key(b, field, 2);
    varint(b, n);
    put(b, data, n);
}

static void le64(unsigned char *o, uint64_t v) {
    for (int i = 0; i < 8; i++)
        o[i] = (unsigned char)(v >> (8 * i));
}

static void le32(unsigned char *o, uint32_t v) {
    for (int i = 0; i < 4; i++)
        o[i] = (unsigned char)(v >> (8 * i));
}

static double wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Event{wall_time = 1, step = 2, file_version = 3 | summary = 5}. */
static void event_head(pb *e, int64_t step) {
    unsigned char d[8];
    double wt = wall_now();
    uint64_t bits;
    memcpy(&bits, &wt, 8);
    le64(d, bits);
    key(e, 1, 1);
    put(e, d, 8);
    key(e, 2, 0);
    varint(e, (uint64_t)step);
}

/* The record framing, written in one write; a short write is cut back off the file. */
static int write_record(kiln__tfevents *w, const pb *e) {
    size_t n = 12 + e->len + 4;
    unsigned char *r = malloc(n);
    if (!r)
        return ENOMEM;
    le64(r, e->len);
    le32(r + 8, kiln__crc32c_masked(r, 8));
    memcpy(r + 12, e->p, e->len);
    le32(r + 12 + e->len, kiln__crc32c_masked(e->p, e->len));
    off_t at = lseek(w->fd, 0, SEEK_END);
    size_t done = 0;
    int err = 0;
    while (done < n) {
        ssize_t k = write(w->fd, r + done, n - done);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            err = k < 0 ? errno : EIO;
            break;
        }
        done += (size_t)k;
    }
    free(r);
    int cut = err && at >= 0 ? ftruncate(w->fd, at) : 0; /* never part of a record */
    (void)cut;
    return err;
}

static int write_version(kiln__tfevents *w) {
    pb e = {0};
    event_head(&e, 0);
    bytes_field(&e, 3, "brain.Event:2", 13);
    int err = e.oom ? ENOMEM : write_record(w, &e);
    free(e.p);
    return err;
}

kiln_status kiln__tfevents_open(kiln__tfevents **out, const char *dir) {
    *out = NULL;
    int err = 0;
    size_t made = 0;
    KILN_CHECK(kiln__make_dirs(dir, "the TensorBoard folder", &err, &made));
    kiln__tfevents *w = calloc(1, sizeof *w);
    if (!w)
        return kiln_error_setf(KILN_ERR_NOMEM, "out of memory");
    char host[256] = "host";
    if (gethostname(host, sizeof host) != 0)
        snprintf(host, sizeof host, "host");
    host[sizeof host - 1] = '\0';
    int k = snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%lld.%s.%ld", dir,
                     (long long)time(NULL), host, (long)getpid());
    if (k < 0 || (size_t)k >= sizeof w->path) {
        free(w);
        return kiln_error_setf(KILN_ERR_ARG, "the TensorBoard folder's path is too long");
    }
    w->fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        kiln_status s = kiln_error_setf(KILN_ERR_IO, "cannot create %s: %s", w->path,
                                        strerror(errno));
        free(w);
        return s;
    }
    w->versioned = write_version(w) == 0; /* a full disk: tried again before the next event */
    *out = w;
    return KILN_OK;
}

void kiln__tfevents_scalars(kiln__tfevents *w, int64_t step, const char *const *tags,
                            const double *values, int n, FILE *log) {
    if (!w)
        return;
    pb sum = {0}, val = {0}, e = {0};
    for (int i = 0; i < n; i++) {
        if (!isfinite(values[i]))
            continue;
        val.len = 0;
        bytes_field(&val, 1, tags[i], strlen(tags[i]));
        unsigned char f[4];
        float x = (float)values[i];
        uint32_t bits;
        memcpy(&bits, &x, 4);
        le32(f, bits);
        key(&val, 2, 5);
        put(&val, f, 4);
        if (!val.oom)
            bytes_field(&sum, 1, val.p, val.len);
    }
    event_head(&e, step);
    if (!sum.oom)
        bytes_field(&e, 5, sum.p, sum.len);
    int err = w->versioned ? 0 : write_version(w);
    w->versioned = err == 0;
    if (!err)
        err = e.oom || sum.oom || val.oom ? ENOMEM : write_record(w, &e);
    free(sum.p);
    free(val.p);
    free(e.p);
    if (err) {
        w->lost++;
        if (!w->failing)
            kiln__warn(log,
                       "cannot write TensorBoard events to %s: %s; training goes on (the steps' "
                       "events are lost until it can be written again)",
                       w->path, strerror(err));
        w->failing = 1;
    } else if (w->failing) {
        if (log)
            fprintf(log, "tensorboard: %s can be written again (%lld step%s missing)\n", w->path,
                    (long long)w->lost, w->lost == 1 ? "" : "s");
        w->failing = 0;
        w->lost = 0;
    }
}

void kiln__tfevents_step(kiln__tfevents *w, const kiln_step_info *s, FILE *log) {
    if (!w)
        return;
    const char *tags[16];
    double v[16];
    int n = 0;
#define ADD(tag, x) (tags[n] = (tag), v[n++] = (double)(x))
    ADD("train/loss", s->loss);
    ADD("train/lr", s->lr);
    ADD("train/grad_norm", s->grad_norm);
    ADD("val/loss", s->val_loss); /* NaN (left out) but at evaluations */
    ADD("perf/step_ms", s->ms);
    ADD("perf/tokens_per_s", s->tokens_per_s);
    ADD("perf/mfu", s->mfu);
    ADD("mem/peak_rss_mb", (double)s->rss / (1024.0 * 1024.0));
    if (s->loss_scale > 0)
        ADD("train/loss_scale", s->loss_scale);
    if (s->skipped)
        ADD("guard/skipped", 1.0);
    if (s->clipped_spike)
        ADD("guard/clipped_spike", 1.0);
    if (s->world > 1) {
        ADD("comm/ms", s->comm_ms);
        ADD("comm/hidden", s->comm_hidden);
    }
#undef ADD
    kiln__tfevents_scalars(w, s->step, tags, v, n, log);
}

const char *kiln__tfevents_path(const kiln__tfevents *w) { return w ? w->path : ""; }

void kiln__tfevents_close(kiln__tfevents *w) {
    if (!w)
        return;
    int synced = fsync(w->fd); /* best effort: every record was whole when written */
    (void)synced;
    close(w->fd);
    free(w);
}
