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

const kiln__feature *const kiln__trainer_features[] = {
    &kiln__feature_dist,    &kiln__feature_balance,     &kiln__feature_watchdog,
    &kiln__feature_guard,   &kiln__feature_save,        &kiln__feature_checkpoint,
    &kiln__feature_prune,   &kiln__feature_distill,     &kiln__feature_qat,
    &kiln__feature_metrics, &kiln__feature_dist_update, NULL,
};
