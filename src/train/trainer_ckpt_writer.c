/* The checkpoint writer: a thread per process that writes, hashes and flushes the files of a
 * staged checkpoint while training goes on (trainer_ckpt.c stages and publishes), and the
 * pieces of the format that need no trainer. */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "core/error.h"
#include "core/fs.h"
#include "kiln/checkpoint.h"
#include "kiln/core.h"
#include "train/trainer_ckpt.h"

size_t kiln__ckpt_image_bytes(uint32_t flags, int64_t range, int64_t n, size_t wsize) {
    size_t r = (size_t)range,
           all[6] = {r * 4, r * 4, r * 4, r * wsize, (size_t)n * 4, (size_t)n * 4};
    size_t sum = KILN__CKPT_HEADER;
    for (int i = 0; i < 6; i++)
        if (flags & (1u << i))
            sum += all[i];
    return sum;
}

int kiln__ckpt_replica_holder(int r, int world) {
    return world > 1 ? (r + 1) % world : -1;
}

/* bytes to folder/name, durable; *size and *hash: the file's. */
static kiln_status write_bytes(const char *folder, const char *name, const void *p, size_t n,
                               uint64_t *size, uint64_t *hash) {
    char path[KILN__CKPT_PATH];
    KILN_CHECK(kiln__ckpt_path(path, folder, name));
    kiln__atomic_file f = KILN__ATOMIC_FILE_INIT;
    KILN_CHECK(kiln__atomic_open(&f, path));
    kiln_status s = kiln__atomic_write(&f, p, n);
    if (s == KILN_OK)
        s = kiln__atomic_commit(&f);
    else
        kiln__atomic_abort(&f);
    *size = n;
    *hash = XXH3_64bits(p, n);
    return s;
}

/* An optimizer file's image: its header's payload hash filled in, then written. */
static kiln_status write_image(const char *folder, const char *name, unsigned char *image, size_t n,
                               uint64_t *size, uint64_t *hash) {
    kiln__ckpt_header h;
    memcpy(&h, image, sizeof h);
    h.payload_xxh3 = XXH3_64bits(image + sizeof h, n - sizeof h);
    memcpy(image, &h, sizeof h);
    return write_bytes(folder, name, image, n, size, hash);
}

static kiln_status write_model(kiln__ckpt_job *j, const char *name, uint64_t *size,
                               uint64_t *hash) {
    char path[KILN__CKPT_PATH];
    KILN_CHECK(kiln__ckpt_path(path, j->tmp, name));
    KILN_CHECK(kiln_gpt_save_slab(j->model, path, j->weights, KILN_DTYPE_F32, KILN_DTYPE_F32));
    return kiln__ckpt_hash_file(path, size, hash);
}

kiln_status kiln__ckpt_job_write(kiln__ckpt_job *j) {
    double t0 = kiln_time_ms();
    char name[64];
    memset(j->rec, 0, sizeof j->rec);
    if (j->delay_ms > 0) {
        struct timespec ts = {j->delay_ms / 1000, (j->delay_ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
    }
    snprintf(name, sizeof name, "optim_rank%d.bin", j->rank);
    KILN_CHECK(write_image(j->tmp, name, j->image, j->image_bytes, &j->rec[0], &j->rec[1]));
    if (j->kill) /* tests: a process killed with a half-written checkpoint */
        (void)kill(getpid(), SIGKILL);
    if (j->fail)
        return kiln_error_setf(KILN_ERR_IO,
                               "cannot write %s/model.safetensors: an injected "
                               "failure (KILN_TEST_CHECKPOINT_FAIL)",
                               j->tmp);
    if (j->peer_rank >= 0) {
        snprintf(name, sizeof name, "optim_rank%d.replica.bin", j->peer_rank);
        KILN_CHECK(write_image(j->tmp, name, j->peer, j->peer_bytes, &j->rec[2], &j->rec[3]));
    }
    if (j->write_model)
        KILN_CHECK(write_model(j, "model.safetensors", &j->rec[4], &j->rec[5]));
    if (j->write_model_replica)
        KILN_CHECK(write_model(j, "model.replica.safetensors", &j->rec[6], &j->rec[7]));
    j->ms = kiln_time_ms() - t0;
    return KILN_OK;
}

kiln_status kiln__ckpt_copy_file(const char *src, const char *dst, uint64_t *size, uint64_t *hash) {
    int fd = -1;
    uint64_t total = 0;
    KILN_CHECK(kiln_file_open_regular(src, &fd, &total));
    enum { CHUNK = 4 << 20 };
    char *buf = malloc(CHUNK);
    XXH3_state_t *st = XXH3_createState();
    kiln__atomic_file f = KILN__ATOMIC_FILE_INIT;
    kiln_status s = KILN_OK;
    if (!buf || !st) {
        s = kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate a buffer to copy %s", src);
        goto done;
    }
    XXH3_64bits_reset(st);
    KILN_CHECK_GOTO(s, kiln__atomic_open(&f, dst), done);
    *size = 0;
    for (;;) {
        ssize_t k = read(fd, buf, CHUNK);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            s = kiln_error_setf(KILN_ERR_IO, "cannot read %s: %s", src, strerror(errno));
            break;
        }
        if (k == 0)
            break;
        XXH3_64bits_update(st, buf, (size_t)k);
        *size += (uint64_t)k;
        if ((s = kiln__atomic_write(&f, buf, (size_t)k)) != KILN_OK)
            break;
    }
    if (s == KILN_OK)
        s = kiln__atomic_commit(&f);
    else
        kiln__atomic_abort(&f);
    *hash = XXH3_64bits_digest(st);
done:
    if (st)
        XXH3_freeState(st);
    free(buf);
    close(fd);
    return s;
}

/* ---- the thread ---- */

static void *writer_main(void *arg) {
    kiln__ckpt_writer *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->queued && !w->quit)
            pthread_cond_wait(&w->cv, &w->mu);
        if (!w->queued)
            break;
        w->queued = 0;
        pthread_mutex_unlock(&w->mu);
        kiln_status s = kiln__ckpt_job_write(&w->job);
        pthread_mutex_lock(&w->mu);
        w->status = s;
        /* the message is this thread's: kept for the training thread's warning */
        snprintf(w->msg, sizeof w->msg, "%s", s != KILN_OK ? kiln_error_message() : "");
        w->done = 1;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

kiln_status kiln__ckpt_writer_create(kiln__ckpt_writer **out) {
    kiln__ckpt_writer *w = calloc(1, sizeof *w);
    if (!w)
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate the checkpoint writer");
    w->job.peer_rank = -1;
    if (pthread_mutex_init(&w->mu, NULL) != 0) {
        free(w);
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot create the checkpoint writer's lock");
    }
    if (pthread_cond_init(&w->cv, NULL) != 0) {
        pthread_mutex_destroy(&w->mu);
        free(w);
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot create the checkpoint writer's lock");
    }
    *out = w;
    return KILN_OK;
}

kiln_status kiln__ckpt_writer_submit(kiln__ckpt_writer *w) {
    if (!w->have_thread) {
        /* signals (preemption) go to the training thread: the writer never runs a handler */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        int e = pthread_create(&w->thread, NULL, writer_main, w);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (e != 0)
            return kiln_error_setf(KILN_ERR_IO, "cannot start the checkpoint writer thread: %s",
                                   strerror(e));
        w->have_thread = 1;
    }
    pthread_mutex_lock(&w->mu);
    w->done = 0;
    w->queued = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return KILN_OK;
}

int kiln__ckpt_writer_done(kiln__ckpt_writer *w, int wait) {
    pthread_mutex_lock(&w->mu);
    while (wait && !w->done)
        pthread_cond_wait(&w->cv, &w->mu);
    int done = w->done;
    pthread_mutex_unlock(&w->mu);
    return done;
}

void kiln__ckpt_writer_free(kiln__ckpt_writer *w) {
    if (!w)
        return;
    if (w->have_thread) {
        pthread_mutex_lock(&w->mu);
        w->quit = 1;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->thread, NULL);
    }
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w->job.image);
    if (w->job.peer != w->job.image)
        free(w->job.peer);
    free(w->job.weights);
    free(w->loaders);
    free(w);
}
