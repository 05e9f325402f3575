/* The trainer's registry of features (trainer_feature.h): the order their callbacks run at
 * each point of a step. What the order keeps:
 *   - dist first: local SGD's start before the guards' and the resume (which restores its
 *     state), and its stop agreement and communication figures before the others';
 *   - balance before the watchdog: the new split of uneven ranks is measured without the
 *     watchdog's exchange in the step's communication;
 *   - the watchdog before the guards: a step is watched from its start, batches skipped
 *     included, and its time is in the median before a rollback;
 *   - guards, then the --save weights, then checkpoints at the step's end: a rollback or a
 *     streak of bad steps saves nothing;
 *   - the resume (checkpoint's init) before pruning and QAT, which read the resumed weights,
 *     and before the metrics files are opened (a refused checkpoint leaves them as they were);
 *   - pruning and QAT after the update before local SGD's average and ZeRO's gather
 *     (dist_update, last), which carry the masked, fake-quantized weights to every rank. */
#include "train/trainer_feature.h"

#include <stddef.h>

#include "core/error.h"

const kiln__feature *const kiln__trainer_features[] = {
    &kiln__feature_dist,    &kiln__feature_balance,     &kiln__feature_watchdog,
    &kiln__feature_guard,   &kiln__feature_save,        &kiln__feature_checkpoint,
    &kiln__feature_prune,   &kiln__feature_distill,     &kiln__feature_qat,
    &kiln__feature_metrics, &kiln__feature_dist_update, NULL,
};

static kiln_status call(const kiln__feature *f, kiln_trainer *t, kiln__phase p,
                        kiln__phase_args *a) {
    switch (p) {
    case KILN__PHASE_START: return f->start ? f->start(t) : KILN_OK;
    case KILN__PHASE_INIT: return f->init ? f->init(t) : KILN_OK;
    case KILN__PHASE_READY: return f->ready ? f->ready(t) : KILN_OK;
    case KILN__PHASE_STEP_BEGIN: return f->step_begin ? f->step_begin(t, a->step) : KILN_OK;
    case KILN__PHASE_BEFORE_FORWARD:
        return f->before_forward ? f->before_forward(t, a->micro) : KILN_OK;
    case KILN__PHASE_AFTER_SYNC:
        return f->after_sync ? f->after_sync(t, a->step, a->loss, a->sumsq) : KILN_OK;
    case KILN__PHASE_JUDGE: return f->judge ? f->judge(t, a->mt) : KILN_OK;
    case KILN__PHASE_AFTER_UPDATE:
        return f->after_update ? f->after_update(t, a->step, a->updated) : KILN_OK;
    case KILN__PHASE_STEP_SYNC: return f->step_sync ? f->step_sync(t, a->step) : KILN_OK;
    case KILN__PHASE_STEP_FIGURES: return f->step_figures ? f->step_figures(t, a->mt) : KILN_OK;
    case KILN__PHASE_STEP_REPORT: return f->step_report ? f->step_report(t, a->mt) : KILN_OK;
    case KILN__PHASE_STEP_END: return f->step_end ? f->step_end(t, a->mt, &a->done) : KILN_OK;
    case KILN__PHASE_BEFORE_EVAL:
        if (f->before_eval)
            f->before_eval(t);
        return KILN_OK;
    case KILN__PHASE_SAVE_NOW: return f->save_now ? f->save_now(t, a->step, a->where) : KILN_OK;
    }
    return kiln_error_setf(KILN_ERR_INTERNAL, "no trainer phase %d", (int)p);
}

kiln_status kiln__trainer_phase(kiln_trainer *t, kiln__phase p, kiln__phase_args *a) {
    kiln__phase_args none = {0};
    if (!a)
        a = &none;
    for (int i = 0; kiln__trainer_features[i]; i++) {
        KILN_CHECK(call(kiln__trainer_features[i], t, p, a));
        if (a->done)
            break;
    }
    return KILN_OK;
}

void kiln__trainer_features_free(kiln_trainer *t) {
    for (int i = 0; kiln__trainer_features[i]; i++)
        if (kiln__trainer_features[i]->free)
            kiln__trainer_features[i]->free(t);
}
