/* What data parallelism attaches to the trainer's phases (trainer_feature.h), beside the
 * reduction itself (trainer_dist.c): the checks across ranks and ZeRO's start, the stop
 * agreement and the communication figures of a step ("dist", first in the registry), and
 * what follows an update ("dist_update", last): local SGD's average (or DiLoCo's outer step)
 * when due, ZeRO 3's stale gathered weights dropped, or every rank's updated shard gathered. */
#include <stdlib.h>

#include "core/error.h"
#include "train/trainer_feature.h"
#include "train/trainer_internal.h"

/* After every rank's start was agreed: the same configuration, data and weights everywhere;
 * ZeRO 1 on one machine, one copy of the weights from now on; ZeRO 3, each rank its shard of
 * the weights alone. */
static kiln_status dist_ready(kiln_trainer *t) {
    KILN_CHECK(kiln__trainer_dist_check(t, kiln_gpt_get_config(t->model)));
    KILN_CHECK(kiln__trainer_common_weights(t));
    return kiln__trainer_zero3_drop_all(t);
}

static kiln_status dist_step_sync(kiln_trainer *t, int64_t step) {
    const kiln_train_config *cfg = &t->cfg;
    if (!cfg->stop_flag || step >= cfg->steps)
        return KILN_OK;
    return kiln__trainer_agree_stop(t, step, *cfg->stop_flag != 0, &t->stopping);
}

static kiln_status dist_figures(kiln_trainer *t, kiln_step_info *mt) {
    kiln__trainer_dist_stats(t, mt);
    return KILN_OK;
}

const kiln__feature kiln__feature_dist = {
    .name = "data parallelism",
    .init = kiln__trainer_local_start,
    .ready = dist_ready,
    .step_sync = dist_step_sync,
    .step_figures = dist_figures,
};

/* A skipped step still averages when local SGD's average is due: it is every rank's. */
static kiln_status dist_after_update(kiln_trainer *t, int64_t step, int updated) {
    if (t->cfg.dist.local_steps > 0)
        return kiln__trainer_local_sync_due(t, step) ? kiln__trainer_outer_step(t) : KILN_OK;
    if (!updated)
        return KILN_OK;
    if (t->zero3) /* gathered weights are stale now: each is gathered again where used */
        return kiln__trainer_zero3_drop_all(t);
    return kiln__trainer_dist_gather(t);
}

static void dist_update_free(kiln_trainer *t) {
    free(t->outer_weights);
    free(t->outer_velocity);
    free(t->part_state);
    free(t->part_ticket);
    free(t->part_used);
    t->outer_weights = t->outer_velocity = NULL;
    t->part_state = NULL;
    t->part_ticket = t->part_used = NULL;
}

const kiln__feature kiln__feature_dist_update = {
    .name = "local SGD and ZeRO",
    .after_update = dist_after_update,
    .free = dist_update_free,
};
