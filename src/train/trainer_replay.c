/* kiln_train_replay: one step of a run re-run from its checkpoint and data position, to tell a
 * bad batch from a numeric blow-up. The run's newest checkpoint before the step is resumed,
 * the steps up to it are run again (nothing is written), and the step's batches go through
 * forward and backward without an update; so do the batches of the steps after it, with the
 * same weights. A step far worse than the batches after it points at its batch (each
 * sequence's loss says which); batches after it just as bad point at the weights. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kiln/core.h"
#include "train/trainer_ckpt.h"
#include "train/trainer_internal.h"

/* A step far off: its loss 25% above the others' median, or its norm 4x. */
#define REPLAY_LOSS_RATIO 1.25
#define REPLAY_NORM_RATIO 4.0

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static float median(const float *v, int64_t n) {
    float *c = malloc((size_t)n * sizeof *c);
    if (!c || n == 0) {
        free(c);
        return NAN;
    }
    memcpy(c, v, (size_t)n * sizeof *c);
    qsort(c, (size_t)n, sizeof *c, cmp_float);
    float m = c[n / 2];
    free(c);
    return m;
}

/* The next step's batches (skips due at `step` first), forward and backward, no update: the
 * step's mean loss and gradient norm. */
static kiln_status probe(kiln_trainer *t, int64_t step, float *loss, float *norm) {
    double l = 0.0, sumsq = 0.0;
    KILN_CHECK(kiln__trainer_guard_skip_batches(t, step));
    float S = kiln_gpt_dtype(t->model) == KILN_DTYPE_F16 ? t->scaler.scale : 1.0f;
    int64_t done = t->steps_done;
    t->steps_done = step - 1; /* the phases take the step from it (injected faults) */
    kiln_status s = kiln__trainer_forward_backward(t, S, &l);
    if (s == KILN_OK)
        s = kiln__trainer_sync_gradients(t, &l, &sumsq);
    t->steps_done = done;
    KILN_CHECK(s);
    *loss = (float)l;
    *norm = (float)(sqrt(sumsq) / S);
    return KILN_OK;
}

/* The newest checkpoint in dir (a --checkpoint-dir) before `step`. */
static kiln_status pick_checkpoint(const char *dir, int64_t step, int64_t *from) {
    int64_t *steps = NULL;
    int n = 0;
    *from = 0;
    KILN_CHECK(kiln__ckpt_list(dir, &steps, &n));
    for (int i = n - 1; i >= 0 && !*from; i--)
        if (steps[i] < step)
            *from = steps[i];
    free(steps);
    if (!*from)
        return kiln_error_setf(KILN_ERR_NOT_FOUND,
                               "%s holds no checkpoint before step %lld to replay it from (a "
                               "--checkpoint-dir of the run)",
                               dir, (long long)step);
    return KILN_OK;
}

static void verdict(kiln_replay_report *r) {
    float ml = median(r->other_loss, r->nothers), mn = median(r->other_norm, r->nothers);
    int others_bad = 0;
    for (int i = 0; i < r->nothers; i++)
        others_bad += !isfinite(r->other_loss[i]) || !isfinite(r->other_norm[i]);
    int mine_bad = !isfinite(r->loss) || !isfinite(r->grad_norm);
    int far = mine_bad || r->loss > REPLAY_LOSS_RATIO * ml || r->grad_norm > REPLAY_NORM_RATIO * mn;
    /* the batches after it against the step before (the weights' state then) */
    int others_far = others_bad > 0 || (isfinite(r->prev_loss) && ml > REPLAY_LOSS_RATIO * r->prev_loss);
    if (others_far) {
        r->verdict = "numeric";
        snprintf(r->why, sizeof r->why,
                 "the batches after step %lld are as bad (median loss %g, %d not finite; the step "
                 "before had loss %g): the weights themselves have blown up, not one batch; "
                 "lower the learning rate, clip harder, or train in fp32",
                 (long long)r->step, ml, others_bad, r->prev_loss);
    } else if (far) {
        r->verdict = "bad_batch";
        snprintf(r->why, sizeof r->why,
                 "step %lld's batch gives loss %g and gradient norm %g while the %d batches after "
                 "it give %g and %g with the same weights: its data is the cause (see the "
                 "sequences with the highest losses); skip it with --skip-batches %lld:1",
                 (long long)r->step, r->loss, r->grad_norm, r->nothers, ml, mn,
                 (long long)r->step);
    } else {
        r->verdict = "not_reproduced";
        snprintf(r->why, sizeof r->why,
                 "step %lld gives loss %g and gradient norm %g, like the batches after it (%g, "
                 "%g): the event does not come back on replay (a transient fault, or something "
                 "outside the step)",
                 (long long)r->step, r->loss, r->grad_norm, ml, mn);
    }
}

kiln_status kiln_train_replay(const kiln_train_config *cfg, int64_t step,
                              kiln_replay_report *r) {
    memset(r, 0, sizeof *r);
    r->prev_loss = NAN;
    if (!cfg->checkpoint.resume_path)
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "a replay needs the run's checkpoints (--resume or "
                               "--checkpoint-dir)");
    if (step < 2 || step > cfg->steps)
        return kiln_error_setf(KILN_ERR_CONFIG, "the step to replay must be 2..%lld (the run's "
                                                "steps), after a checkpoint",
                               (long long)cfg->steps);
    char folder[KILN__CKPT_PATH];
    KILN_CHECK(pick_checkpoint(cfg->checkpoint.resume_path, step, &r->from_step));
    snprintf(folder, sizeof folder, "%s/" KILN__CKPT_STEP_FMT, cfg->checkpoint.resume_path,
             (long long)r->from_step);
    kiln_train_config c = *cfg; /* nothing of the run is written */
    c.checkpoint.resume_path = folder;
    c.metrics.path = NULL;
    c.save.path = NULL;
    c.checkpoint.dir = NULL;
    c.metrics.tensorboard_dir = NULL;
    c.stop_flag = NULL;
    kiln_trainer *t = NULL;
    KILN_CHECK(kiln_trainer_create(&t, &c));
    kiln_status s = KILN_OK;
    kiln_step_info info;
    while (s == KILN_OK && t->steps_done < step - 1) {
        s = kiln_trainer_step(t, &info);
        r->prev_loss = info.loss;
    }
    r->step = step;
    r->nseq = t->micro * c.data.B;
    r->seq_loss = calloc((size_t)r->nseq, sizeof *r->seq_loss);
    if (s == KILN_OK && !r->seq_loss)
        s = kiln_error_setf(KILN_ERR_NOMEM, "out of memory");
    if (s == KILN_OK) {
        t->probe_seq = r->seq_loss;
        s = probe(t, step, &r->loss, &r->grad_norm);
        t->probe_seq = NULL;
    }
    /* the batches of the steps after it, with the same weights */
    for (int k = 0; s == KILN_OK && k < KILN_REPLAY_OTHERS && step + k + 1 <= c.steps; k++) {
        s = probe(t, step + k + 1, &r->other_loss[k], &r->other_norm[k]);
        r->nothers = k + 1;
    }
    if (s == KILN_OK && r->nothers == 0)
        s = kiln_error_setf(KILN_ERR_CONFIG,
                            "step %lld is the run's last: no batches after it to compare with",
                            (long long)step);
    if (s == KILN_OK)
        verdict(r);
    kiln_trainer_free(t);
    return s;
}

void kiln_replay_report_free(kiln_replay_report *r) {
    if (!r)
        return;
    free(r->seq_loss);
    r->seq_loss = NULL;
}
