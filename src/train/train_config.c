/* The training configuration's defaults, one function per concern (kiln/train.h). */
#include <string.h>

#include "kiln/train.h"

kiln_train_data_config kiln_train_data_default(void) {
    return (kiln_train_data_config){.B = 4, .T = 64, .grad_accum = 1, .eval_batches = 20};
}

kiln_train_compute_config kiln_train_compute_default(void) {
    return (kiln_train_compute_config){.model_opt = kiln_gpt_options_default(),
                                       .loss_scaler = kiln_loss_scaler_default()};
}

kiln_train_metrics_config kiln_train_metrics_default(void) {
    return (kiln_train_metrics_config){.path = NULL};
}

kiln_train_save_config kiln_train_save_default(void) {
    return (kiln_train_save_config){.dtype = KILN_DTYPE_F32};
}

kiln_train_checkpoint_config kiln_train_checkpoint_default(void) {
    return (kiln_train_checkpoint_config){.keep = 3};
}

kiln_train_guard_config kiln_train_guard_default(void) {
    return (kiln_train_guard_config){
        .window = 50, .z = 6.0f, .ceiling = 1.0f, .max_bad = 3, .max_rollbacks = 3};
}

kiln_train_compress_config kiln_train_compress_default(void) {
    return (kiln_train_compress_config){.prune_sparsity = 0.0};
}

kiln_train_distill_config kiln_train_distill_default(void) {
    return (kiln_train_distill_config){.alpha = 0.5f, .temperature = 2.0f};
}

kiln_train_dist_config kiln_train_dist_default(void) {
    return (kiln_train_dist_config){.dp = kiln_dp_config_default(), .outer_lr = 1.0f};
}

kiln_watchdog_config kiln_watchdog_config_default(void) {
    return (kiln_watchdog_config){.enabled = 1,
                                  .warn_factor = 5,
                                  .hang_factor = 20,
                                  .hang_min_s = 300,
                                  .window = 20,
                                  .heartbeat_s = 5,
                                  .straggler_factor = 1.3,
                                  .straggler_window = 20};
}

kiln_train_config kiln_train_config_default(void) {
    kiln_train_config c;
    memset(&c, 0, sizeof c);
    c.steps = 100;
    c.seed = 1337;
    c.optim = kiln_optim_config_default();
    c.lr.kind = KILN_LR_COSINE;
    c.lr.lr = 3e-4f;
    c.lr.min_lr = 3e-5f;
    c.lr.warmup_steps = 10;
    c.grad_clip = 1.0f;
    c.data = kiln_train_data_default();
    c.compute = kiln_train_compute_default();
    c.metrics = kiln_train_metrics_default();
    c.save = kiln_train_save_default();
    c.checkpoint = kiln_train_checkpoint_default();
    c.guard = kiln_train_guard_default();
    c.compress = kiln_train_compress_default();
    c.distill = kiln_train_distill_default();
    c.dist = kiln_train_dist_default();
    c.watchdog = kiln_watchdog_config_default();
    return c;
}
