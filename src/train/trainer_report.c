/* The run's metrics as a feature of the trainer (trainer_feature.h): the JSON Lines file
 * (metrics.c) and the TensorBoard events file (tfevents.c), opened at the start and written
 * at every step beside the console line. */
#include "core/error.h"
#include "kiln/train.h"
#include "train/metrics.h"
#include "train/tfevents.h"
#include "train/trainer_feature.h"
#include "train/trainer_internal.h"

/* After the resume: a resumed run adds to the lines of the run it continues; one with nothing
 * left to do touches no file. */
static kiln_status report_init(kiln_trainer *t) {
    const kiln_train_config *cfg = &t->cfg;
    int nothing_left = t->resumed_step > 0 && t->steps_done >= cfg->steps;
    if (cfg->metrics.path && !nothing_left)
        KILN_CHECK(kiln__metrics_open(&t->metrics, cfg->metrics.path, t->resumed_step > 0));
    if (cfg->metrics.tensorboard_dir && !nothing_left)
        KILN_CHECK(kiln__tfevents_open(&t->tb, cfg->metrics.tensorboard_dir));
    return KILN_OK;
}

static kiln_status report_step(kiln_trainer *t, const kiln_step_info *mt) {
    FILE *log = t->cfg.metrics.log;
    kiln__train_metrics_console(log, mt);
    if (t->metrics) {
        char line[1024];
        kiln__train_metrics_format(line, sizeof line, mt);
        kiln__metrics_line(t->metrics, line, log);
    }
    kiln__tfevents_step(t->tb, mt, log);
    return KILN_OK;
}

static void report_free(kiln_trainer *t) {
    kiln__metrics_close(t->metrics, t->cfg.metrics.log);
    kiln__tfevents_close(t->tb);
    t->metrics = NULL;
    t->tb = NULL;
}

const kiln__feature kiln__feature_metrics = {
    .name = "metrics",
    .init = report_init,
    .step_report = report_step,
    .free = report_free,
};
