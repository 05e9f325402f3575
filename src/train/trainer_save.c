/* The --save weights: written every save_every steps and after the last, only when they are
 * good, and never lost to a failed write. A write that fails (a full disk, no permission)
 * during the run is a warning: the weights stay in memory and the save is tried again while
 * training goes on (after 1, 2, 4, ... steps). At the end (and at a stop) it is tried a few
 * times more with a wait between; if the file still cannot be written, the weights go to a
 * file of their own in the temporary folder (else the current one), and the error says where:
 * a run never ends without either saving its weights or saying where they went. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "kiln/checkpoint.h"
#include "kiln/core.h"
#include "train/trainer_feature.h"
#include "train/trainer_internal.h"

/* Waits before the end's tries: 0.5, 1, 2 s. */
#define SAVE_END_TRIES 3
#define SAVE_END_WAIT_MS 500

/* Weights are saved only when they can be used: every parameter finite, and a finite loss
 * on the last batch (weights of 1e29 are finite, yet overflow in the next forward pass). */
static kiln_status check_savable(kiln_trainer *t) {
    KILN_CHECK(kiln_gpt_check_finite(t->model));
    float loss = 0.0f;
    KILN_CHECK(
        kiln_gpt_forward(t->model, t->inputs, t->targets, t->cfg.data.B, t->cfg.data.T, &loss));
    if (!isfinite(loss))
        return kiln_error_setf(KILN_ERR_RANGE,
                               "they are finite but give a loss of %f on the last batch", loss);
    return KILN_OK;
}

/* The bad-weights error: why, and where the last good weights are. */
static kiln_status not_saved(kiln_trainer *t, int64_t step) {
    const kiln_train_config *cfg = &t->cfg;
    char why[512], kept[512];
    snprintf(why, sizeof why, "%s", kiln_error_message());
    if (t->saved_step > 0)
        snprintf(kept, sizeof kept, "the last good weights, of step %lld, are in %s",
                 (long long)t->saved_step, cfg->save.path);
    else if (t->save_existed)
        snprintf(kept, sizeof kept, "%s is left as it was before this run", cfg->save.path);
    else
        snprintf(kept, sizeof kept, "nothing was saved to %s", cfg->save.path);
    return kiln_error_setf(KILN_ERR_RANGE,
                           "the weights after step %lld are not saved: %s (is the learning "
                           "rate too high?); %s",
                           (long long)step, why, kept);
}

/* Rank 0: the weights into path, from the fp32 master weights when there are some (the
 * optimizer's, in the backend's memory, or gathered from every rank's shard on the host). */
static kiln_status write_weights(kiln_trainer *t, const char *path, const float *master) {
    const void *slab = master ? (const void *)master : kiln_gpt_params(t->model);
    kiln_dtype dt = master ? KILN_DTYPE_F32 : kiln_gpt_dtype(t->model);
    int on_host = master && master != kiln_optim_master(t->opt); /* gathered */
    if (!t->staged || on_host)
        return kiln_gpt_save_slab_meta(t->model, path, slab, dt, t->cfg.save.dtype,
                                       kiln__trainer_prune_meta(t, master));
    /* the slab read back from the backend's memory first (the plan's host_copy) */
    size_t bytes = (size_t)kiln_gpt_slab_len(t->model) * kiln_dtype_size(dt);
    void *h = malloc(bytes);
    if (!h)
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate %.1f MiB to read the weights back",
                               (double)bytes / (1 << 20));
    kiln_status s = kiln__trainer_to_host(t, h, slab, bytes);
    if (s == KILN_OK)
        s = kiln_gpt_save_slab_meta(t->model, path, h, dt, t->cfg.save.dtype,
                                    kiln__trainer_prune_meta(t, master ? h : NULL));
    free(h);
    return s;
}

static void sleep_ms(double ms) {
    struct timespec ts = {.tv_sec = (time_t)(ms / 1e3),
                          .tv_nsec = (long)(fmod(ms, 1e3) * 1e6)};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* Rank 0: the weights into a file of their own, kiln-rescue-step<N>-<pid>-<base>, in TMPDIR,
 * else /tmp, else the current folder (the disk that failed may be any of them); 1 and its
 * name in p when one was written. */
static int write_rescue(kiln_trainer *t, int64_t step, const float *master, const char *base,
                        char *p, size_t cap) {
    const char *dirs[3] = {getenv("TMPDIR"), "/tmp", "."};
    for (int i = 0; i < 3; i++) {
        if (!dirs[i] || !dirs[i][0])
            continue;
        snprintf(p, cap, "%s/kiln-rescue-step%lld-%ld-%s", dirs[i], (long long)step,
                 (long)getpid(), base);
        if (write_weights(t, p, master) == KILN_OK)
            return 1;
    }
    return 0;
}

/* The end: tries with waits, then a rescue file. Returns KILN_OK when path was written, else
 * an error that names the rescue file (or says none could be written). */
static kiln_status write_at_end(kiln_trainer *t, int64_t step, const float *master,
                                char *first_why, size_t cap) {
    const kiln_train_config *cfg = &t->cfg;
    double wait = SAVE_END_WAIT_MS;
    for (int k = 0; k < SAVE_END_TRIES; k++, wait *= 2) {
        kiln__warn(cfg->metrics.log, "saving to %s failed (%s); trying again in %.1f s",
                   cfg->save.path, first_why, wait / 1e3);
        sleep_ms(wait);
        if (write_weights(t, cfg->save.path, master) == KILN_OK)
            return KILN_OK;
        snprintf(first_why, cap, "%s", kiln_error_message());
    }
    const char *base = strrchr(cfg->save.path, '/');
    base = base ? base + 1 : cfg->save.path;
    char p[4096];
    if (write_rescue(t, step, master, base, p, sizeof p))
        return kiln_error_setf(KILN_ERR_IO,
                               "cannot save the weights of step %lld to %s (%s; tried %d "
                               "times); they are in %s instead: move them there when it "
                               "can take them",
                               (long long)step, cfg->save.path, first_why, SAVE_END_TRIES + 1, p);
    return kiln_error_setf(KILN_ERR_IO,
                           "cannot save the weights of step %lld to %s (%s; tried %d times), nor "
                           "to a file in TMPDIR, /tmp or the current folder: they are lost%s",
                           (long long)step, cfg->save.path, first_why, SAVE_END_TRIES + 1,
                           cfg->checkpoint.dir ? " unless a checkpoint holds them" : "");
}

/* Every rank: the weights to write, from the fp32 master weights when there are some: the
 * exact values, in any dtype (with ZeRO each rank holds a shard of them: gathered into *full
 * first). ZeRO 3's working weights are gathered from every rank (*s: how that went). Rank 0
 * writes; weights_end undoes this. */
static kiln_status weights_begin(kiln_trainer *t, float **master, float **full, kiln_status *s) {
    *master = kiln_optim_master(t->opt);
    *full = NULL;
    *s = KILN_OK;
    int64_t n = kiln_gpt_slab_len(t->model);
    if (*master && (t->shard_lo != 0 || t->shard_hi != n)) {
        KILN_CHECK(kiln__trainer_gather_master(t, full));
        *master = *full;
    }
    if (!*master)
        *s = kiln__trainer_zero3_need_all(t);
    return KILN_OK;
}

static void weights_end(kiln_trainer *t, const float *master, float *full, kiln_status *s) {
    free(full);
    if (*s == KILN_OK && !master)
        *s = kiln__trainer_zero3_drop_all(t);
}

kiln_status kiln__trainer_rescue_final(kiln_trainer *t, int64_t step) {
    float *master = NULL, *full = NULL;
    kiln_status s;
    KILN_CHECK(weights_begin(t, &master, &full, &s));
    char p[4096] = "";
    int written = s == KILN_OK && t->rank == 0 &&
                  write_rescue(t, step, master, "model.safetensors", p, sizeof p);
    weights_end(t, master, full, &s);
    KILN_CHECK(s);
    if (t->rank != 0)
        return kiln_error_setf(KILN_ERR_IO, "the last checkpoint was not written (rank 0 says "
                                            "where the weights are)");
    if (written)
        return kiln_error_setf(KILN_ERR_IO,
                               "the checkpoint of step %lld, the last, was not written to %s (%s), "
                               "and no --save file was asked for: the weights of step %lld are in "
                               "%s instead (kiln train --init %s goes on from them, without the "
                               "optimizer's state)",
                               (long long)step, t->cfg.checkpoint.dir, t->ckpt_why, (long long)step,
                               p, p);
    return kiln_error_setf(KILN_ERR_IO,
                           "the checkpoint of step %lld, the last, was not written to %s (%s), and "
                           "the weights could not be written to TMPDIR, /tmp or the current "
                           "folder either: the newest checkpoint in %s is all that is kept",
                           (long long)step, t->cfg.checkpoint.dir, t->ckpt_why,
                           t->cfg.checkpoint.dir);
}

/* Whether any rank's value is set (rank 0's write is everyone's business: the retries gather
 * the weights again, a collective). */
static kiln_status any_rank(kiln_trainer *t, int *v) {
    if (t->world <= 1)
        return KILN_OK;
    float x = (float)*v;
    KILN_CHECK(kiln_comm_allreduce(&x, &x, 1, KILN_DTYPE_F32, KILN_REDUCE_MAX, t->comm));
    *v = x > 0.0f;
    return KILN_OK;
}

/* Whether a save is due after `step`: the interval, the last step, a failed save's retry. */
static int due(const kiln_trainer *t, int64_t step) {
    const kiln_train_config *cfg = &t->cfg;
    if (step == cfg->steps || (cfg->save.every > 0 && step % cfg->save.every == 0))
        return 1;
    return t->save_retry_at > 0 && step >= t->save_retry_at;
}

kiln_status kiln__trainer_maybe_save(kiln_trainer *t, int64_t step, int force) {
    const kiln_train_config *cfg = &t->cfg;
    if (!cfg->save.path)
        return KILN_OK;
    int last = step == cfg->steps || force;
    if (!force && !due(t, step))
        return KILN_OK;
    if (force && t->saved_step == step)
        return KILN_OK;
    /* every rank checks (its own last batch), and all learn whether any failed */
    kiln_status s = kiln__trainer_agree(t, check_savable(t), "the check of its weights");
    if (s == KILN_ERR_RANGE)
        return not_saved(t, step);
    KILN_CHECK(s);
    float *master = NULL, *full = NULL;
    KILN_CHECK(weights_begin(t, &master, &full, &s));
    int failed = 0;
    char why[512] = "";
    kiln_status w = KILN_OK;
    if (s == KILN_OK && t->rank == 0) {
        w = write_weights(t, cfg->save.path, master);
        failed = w != KILN_OK;
        if (failed) {
            snprintf(why, sizeof why, "%s", kiln_error_message());
            if (last)
                w = write_at_end(t, step, master, why, sizeof why);
        }
    }
    weights_end(t, master, full, &s);
    if (s == KILN_OK && !last)
        s = any_rank(t, &failed);
    KILN_CHECK(s);
    if (last && w != KILN_OK)
        return w;
    if (failed && !last) {
        t->save_failures++;
        t->save_retry_at = step + (1LL << (t->save_failures < 10 ? t->save_failures - 1 : 9));
        kiln__warn(cfg->metrics.log,
                   "cannot save the weights of step %lld to %s: %s; training goes on (the "
                   "weights are in memory; the save is tried again at step %lld and at the end)",
                   (long long)step, cfg->save.path, why, (long long)t->save_retry_at);
        return KILN_OK;
    }
    if (t->save_failures > 0 && cfg->metrics.log)
        fprintf(cfg->metrics.log, "saving to %s works again\n", cfg->save.path);
    t->save_failures = 0;
    t->save_retry_at = 0;
    t->saved_step = step;
    if (cfg->metrics.log)
        fprintf(cfg->metrics.log, "saved weights to %s (step %lld)\n", cfg->save.path,
                (long long)step);
    return KILN_OK;
}

/* ---- the --save weights as a feature of the trainer (trainer_feature.h) ---- */

static kiln_status save_step_end(kiln_trainer *t, const kiln_step_info *mt, int *done) {
    (void)done;
    return kiln__trainer_maybe_save(t, mt->step, 0);
}

/* With a checkpoint folder the checkpoint keeps the state (checkpoints', later in the
 * registry); else the --save weights, saved whether due or not. */
static kiln_status save_now(kiln_trainer *t, int64_t step, const char **where) {
    if (t->cfg.checkpoint.dir || !t->cfg.save.path)
        return KILN_OK;
    KILN_CHECK(kiln__trainer_maybe_save(t, step, 1));
    *where = t->cfg.save.path;
    return KILN_OK;
}

const kiln__feature kiln__feature_save = {
    .name = "save",
    .step_end = save_step_end,
    .save_now = save_now,
};
