/* The trainer's stability guards (guard.h keeps the numbers): a step whose loss or gradient
 * norm is not finite or spikes skips its update; guard_max_bad such steps in a row roll the
 * run back to its newest good checkpoint and skip the batches that caused them; trends that
 * precede divergence are reported early. Every event is a line of the metrics log:
 * {"event": "...", "step": N, ...}. Every rank sees the same loss and norm (their reduction),
 * so every rank decides alike and rolls back together. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kiln/core.h"
#include "train/metrics.h"
#include "train/trainer_ckpt.h"
#include "train/trainer_feature.h"
#include "train/trainer_internal.h"

kiln_status kiln__trainer_guard_init(kiln_trainer *t) {
    const kiln_train_config *c = &t->cfg;
    if (c->guard.max_bad < 1 || c->guard.max_rollbacks < 0 || c->data.nskip_batches < 0 ||
        c->data.nskip_batches > KILN_TRAIN_MAX_SKIPS)
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "the guard's bad steps in a row must be >= 1 and its rollbacks >= 0, and at most %d "
                               "ranges of batches may be skipped",
                               KILN_TRAIN_MAX_SKIPS);
    for (int i = 0; i < c->data.nskip_batches; i++) {
        if (c->data.skip_batches[i].step < 1 || c->data.skip_batches[i].count < 1)
            return kiln_error_setf(KILN_ERR_CONFIG,
                                   "a range of skipped batches needs a step >= 1 and a count >= 1");
        t->skips[t->nskips++] = c->data.skip_batches[i];
    }
    return kiln__guard_init(&t->guard, c->guard.window, c->guard.z);
}

/* The steps' batches skipped at the start of `step` (the data of the steps that went bad
 * before a rollback, or --skip-batches): drawn and dropped, every rank its own. */
kiln_status kiln__trainer_guard_skip_batches(kiln_trainer *t, int64_t step) {
    for (int i = 0; i < t->nskips; i++) {
        if (t->skips[i].step != step)
            continue;
        for (int64_t k = 0; k < t->skips[i].count * t->micro; k++) {
            kiln_loader *ld = t->micro_loaders ? t->micro_loaders[k % t->micro] : t->train;
            KILN_CHECK(kiln_loader_next(ld, t->inputs, t->targets));
        }
        if (t->cfg.metrics.log)
            fprintf(t->cfg.metrics.log, "guard: step %lld skips %lld step(s) of batches\n",
                    (long long)step, (long long)t->skips[i].count);
    }
    return KILN_OK;
}

/* Tests: a spike injected at the first visit of steps [spike_step, + count): this
 * rank's part of the gradients times 100, the loss times 4 (a rollback that comes back to the
 * step finds its data skipped, so the fault does not come back either). */
void kiln__trainer_guard_inject(kiln_trainer *t, int64_t step, double *loss, double *sumsq) {
    const kiln_train_config *c = &t->cfg;
    const kiln__trainer_faults *f = &t->faults;
    if (f->spike_step <= 0 || step < f->spike_step ||
        step >= f->spike_step + (f->spike_count > 0 ? f->spike_count : 1) ||
        step <= t->high_water)
        return;
    kiln_backend *be = kiln_gpt_backend(t->model);
    int64_t lo = 0, hi = kiln_gpt_slab_len(t->model);
    if (t->dp && !c->dist.local_steps)
        kiln_dp_shard_of(t->dp, t->rank, &lo, &hi);
    be->scale(be, kiln_gpt_grads(t->model) + lo, 100.0f, hi - lo);
    *sumsq *= 1e4;
    if (!f->spike_norm_only)
        *loss *= 4.0;
}

/* The verdict on a step, before its update: KILN_GUARD_OK lets it update. */
kiln_guard_verdict kiln__trainer_guard_check(kiln_trainer *t, kiln_step_info *mt) {
    double z = 0.0;
    /* from the second step (of the run, resumed or not): its first loss is known */
    float margin = t->cfg.guard.ceiling;
    t->guard.ceiling = margin > 0.0f && t->steps_done > 0 && isfinite(t->first_loss)
                           ? (double)t->first_loss + (double)margin
                           : 0.0;
    kiln_guard_verdict v = kiln__guard_check(&t->guard, mt->loss, mt->grad_norm, &z);
    mt->guard_z = z;
    return v;
}

static void event_line(kiln_trainer *t, const char *line) {
    kiln__metrics_line(t->metrics, line, t->cfg.metrics.log);
}

static void report_warnings(kiln_trainer *t, int64_t step, int warn, double ratio) {
    static const struct {
        int bit;
        const char *name, *text;
    } kinds[] = {
        {KILN_GUARD_WARN_NORM_GROWTH, "grad_norm_growth",
         "the gradient norm's median grew %.1fx within %lld steps"},
        {KILN_GUARD_WARN_LOSS_RISE, "loss_rise", "the loss's median rose %.3fx within %lld steps"},
        {KILN_GUARD_WARN_SPIKE_RATE, "spike_rate", "%.0f spikes within %lld steps"},
        {KILN_GUARD_WARN_SCALE_FALL, "loss_scale_fall",
         "the loss scale fell %.0fx within %lld steps"},
    };
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        if (!(warn & kinds[i].bit))
            continue;
        char text[160], line[320];
        snprintf(text, sizeof text, kinds[i].text, ratio, (long long)t->guard.window);
        if (t->cfg.metrics.log)
            fprintf(t->cfg.metrics.log,
                    "guard: early warning at step %lld: %s (a trend that often precedes "
                    "divergence: consider a lower learning rate or tighter clipping)\n",
                    (long long)step, text);
        snprintf(line, sizeof line,
                 "{\"event\": \"warning\", \"step\": %lld, \"kind\": \"%s\", \"value\": %.6g, "
                 "\"window\": %lld}",
                 (long long)step, kinds[i].name, ratio, (long long)t->guard.window);
        event_line(t, line);
        ratio = 0.0; /* the figure belongs to the first warning */
    }
}

/* The newest checkpoint folder older than step `before` that a rollback may use: not the one
 * the last rollback went to when no newer has been written since (that one gave the same bad
 * steps again). *step 0: none. */
static kiln_status rollback_target(kiln_trainer *t, int64_t before, int64_t *step) {
    int64_t *steps = NULL;
    int n = 0;
    *step = 0;
    KILN_CHECK(kiln__ckpt_list(t->cfg.checkpoint.dir, &steps, &n));
    for (int i = n - 1; i >= 0 && !*step; i--)
        if (steps[i] < before && !(t->rollbacks > 0 && steps[i] >= t->last_rollback_to))
            *step = steps[i];
    free(steps);
    return KILN_OK;
}

/* The run cannot go on: the bad steps' figures, and why there is no rollback. The weights
 * are still the last good step's (the bad steps did not update them): saved to --save first
 * (or a rescue file), so that a run the guards stop never loses what it learned. */
static kiln_status give_up(kiln_trainer *t, const kiln_step_info *mt, const char *why) {
    char kept[1024];
    int64_t good = t->first_bad - 1;
    if (good <= t->resumed_step) {
        snprintf(kept, sizeof kept, "the weights are those the run started from");
    } else if (t->cfg.save.path) {
        kiln_status s = kiln__trainer_maybe_save(t, good, 1);
        if (s == KILN_OK)
            snprintf(kept, sizeof kept, "the weights of step %lld are saved in %s", (long long)good,
                     t->cfg.save.path);
        else
            snprintf(kept, sizeof kept, "the weights are those of step %lld: %s", (long long)good,
                     kiln_error_message());
    } else {
        snprintf(kept, sizeof kept, "the weights are those of step %lld (no --save file)",
                 (long long)good);
    }
    return kiln_error_setf(KILN_ERR_RANGE,
                           "%lld bad steps in a row, from step %lld to step %lld (the last: %s, "
                           "loss %g, gradient norm %g): %s; %s (the bad steps did not update "
                           "them)",
                           (long long)t->bad_run, (long long)t->first_bad, (long long)mt->step,
                           mt->guard, mt->loss, mt->grad_norm, why, kept);
}

/* Back to the newest good checkpoint before the bad steps, their batches skipped when the run
 * comes to them again. */
static kiln_status rollback(kiln_trainer *t, const kiln_step_info *mt) {
    const kiln_train_config *c = &t->cfg;
    char why[256];
    if (!c->checkpoint.dir)
        return give_up(t, mt, "no --checkpoint-dir to roll back to");
    if (c->dist.local_steps > 0)
        return give_up(t, mt, "local SGD's ranks do not roll back together");
    if (t->rollbacks >= c->guard.max_rollbacks) {
        snprintf(why, sizeof why, "rolled back %lld time(s) already (the limit): the run diverges",
                 (long long)t->rollbacks);
        return give_up(t, mt, why);
    }
    /* a checkpoint still being written is published first: it may be the one to go back to */
    KILN_CHECK(kiln__trainer_checkpoint_poll(t, mt->step, 1));
    int64_t to = 0;
    kiln_status s = rollback_target(t, t->first_bad, &to);
    if (s == KILN_OK && to == 0) {
        snprintf(why, sizeof why, "no checkpoint older than step %lld in %s%s",
                 (long long)t->first_bad, c->checkpoint.dir,
                 t->rollbacks ? " besides the one rolled back to before" : "");
        return give_up(t, mt, why);
    }
    KILN_CHECK(kiln__trainer_agree(t, s, "to find a checkpoint to roll back to"));
    char folder[KILN__CKPT_PATH];
    snprintf(folder, sizeof folder, "%s/" KILN__CKPT_STEP_FMT, c->checkpoint.dir, (long long)to);
    if (t->nskips >= KILN_TRAIN_MAX_SKIPS)
        return give_up(t, mt, "too many ranges of skipped batches");
    int64_t first_bad = t->first_bad, count = mt->step - first_bad + 1;
    float first_loss = t->first_loss;
    const char *saved = t->cfg.checkpoint.resume_path;
    t->cfg.checkpoint.resume_path = folder;
    s = kiln__trainer_resume(t);
    t->cfg.checkpoint.resume_path = saved;
    s = kiln__trainer_agree(t, s, "to roll back");
    if (s == KILN_OK)
        s = kiln__trainer_zero3_drop_all(t);
    KILN_CHECK(s);
    t->first_loss = first_loss;
    t->skips[t->nskips].step = first_bad;
    t->skips[t->nskips].count = count;
    t->nskips++;
    t->rollbacks++;
    t->last_rollback_to = to;
    t->bad_run = 0;
    if (c->metrics.log)
        fprintf(c->metrics.log,
                "guard: %lld bad steps in a row (steps %lld-%lld, the last: %s): rolled back to "
                "the checkpoint of step %lld; the batches of those steps are skipped when the "
                "run comes to them\n",
                (long long)count, (long long)first_bad, (long long)mt->step, mt->guard,
                (long long)to);
    char line[320];
    snprintf(line, sizeof line,
             "{\"event\": \"rollback\", \"step\": %lld, \"to_step\": %lld, \"first_bad\": %lld, "
             "\"skip_steps\": %lld, \"reason\": \"%s\", \"rollbacks\": %lld}",
             (long long)mt->step, (long long)to, (long long)first_bad, (long long)count,
             mt->guard, (long long)t->rollbacks);
    event_line(t, line);
    return KILN_OK;
}

/* After a step's metrics line: its verdict into the history, the early warnings due, and a
 * rollback after guard_max_bad bad steps in a row (*rolled set). */
kiln_status kiln__trainer_guard_after(kiln_trainer *t, const kiln_step_info *mt, int *rolled) {
    *rolled = 0;
    if (mt->step > t->high_water)
        t->high_water = mt->step;
    kiln_guard_verdict v = KILN_GUARD_OK;
    if (mt->guard)
        for (int k = KILN_GUARD_NONFINITE_LOSS; k <= KILN_GUARD_LOSS_CEILING; k++)
            if (!strcmp(mt->guard, kiln__guard_verdict_name((kiln_guard_verdict)k)))
                v = (kiln_guard_verdict)k;
    /* a clipped norm spike trained on: counted with the spikes (the rate's warning), kept
     * out of the history it was judged against, and no bad step */
    kiln_guard_verdict rec = mt->clipped_spike ? KILN_GUARD_NORM_SPIKE : v;
    double ratio = 0.0;
    int warn = kiln__guard_record(&t->guard, mt->step, rec, mt->loss, mt->grad_norm,
                                  mt->loss_scale, &ratio);
    if (warn)
        report_warnings(t, mt->step, warn, ratio);
    if (mt->clipped_spike) {
        char line[256];
        snprintf(line, sizeof line,
                 "{\"event\": \"clipped_spike\", \"step\": %lld, \"grad_norm\": %.6g, \"z\": "
                 "%.3f}",
                 (long long)mt->step, mt->grad_norm, mt->guard_z);
        event_line(t, line);
    }
    if (v == KILN_GUARD_OK) {
        t->bad_run = 0;
        return KILN_OK;
    }
    if (t->bad_run++ == 0)
        t->first_bad = mt->step;
    char line[256];
    snprintf(line, sizeof line,
             "{\"event\": \"skip\", \"step\": %lld, \"reason\": \"%s\", \"z\": %.3f, "
             "\"bad_in_a_row\": %lld}",
             (long long)mt->step, mt->guard, mt->guard_z, (long long)t->bad_run);
    event_line(t, line);
    if (t->cfg.guard.max_bad == 0 || t->bad_run < t->cfg.guard.max_bad)
        return KILN_OK;
    KILN_CHECK(rollback(t, mt));
    *rolled = 1;
    return KILN_OK;
}

/* ---- the guards as a feature of the trainer (trainer_feature.h) ---- */

static kiln_status guard_after_sync(kiln_trainer *t, int64_t step, double *loss, double *sumsq) {
    kiln__trainer_guard_inject(t, step, loss, sumsq);
    return KILN_OK;
}

/* A bad step skips its update (mt->skipped, mt->guard), except a gradient-norm spike of a
 * clipped run (unless skip_norm_spikes): it is clipped, the update is bounded, and it
 * applies. */
static kiln_status guard_judge(kiln_trainer *t, kiln_step_info *mt) {
    const kiln_train_config *cfg = &t->cfg;
    kiln_guard_verdict v = kiln__trainer_guard_check(t, mt);
    if (v == KILN_GUARD_NORM_SPIKE && cfg->grad_clip > 0.0f && !cfg->guard.skip_norm_spikes) {
        mt->clipped_spike = 1; /* clipped by the update: bounded, and it applies */
        v = KILN_GUARD_OK;
    }
    if (v != KILN_GUARD_OK) {
        mt->skipped = 1;
        mt->guard = kiln__guard_verdict_name(v);
    }
    return KILN_OK;
}

/* A rollback (back at an older step: its checkpoint is the one just loaded), or a bad step
 * before the last (the weights of the last good step are saved already, or due after the
 * streak), ends the step's end here. */
static kiln_status guard_step_end(kiln_trainer *t, const kiln_step_info *mt, int *done) {
    int rolled = 0;
    KILN_CHECK(kiln__trainer_guard_after(t, mt, &rolled));
    *done = rolled || (t->bad_run > 0 && mt->step < t->cfg.steps);
    return KILN_OK;
}

static void guard_feature_free(kiln_trainer *t) {
    kiln__guard_free(&t->guard);
}

const kiln__feature kiln__feature_guard = {
    .name = "guards",
    .init = kiln__trainer_guard_init,
    .step_begin = kiln__trainer_guard_skip_batches,
    .after_sync = guard_after_sync,
    .judge = guard_judge,
    .step_end = guard_step_end,
    .free = guard_feature_free,
};
