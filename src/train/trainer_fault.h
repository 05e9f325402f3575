/* Test-only switches of the trainer: faults to inject and paths to force, set through one
 * internal control call (as SQLite's sqlite3_test_control) by test programs and the kiln
 * command (its --inject-* flags and documented test variables), never read from the
 * environment by the library. A trainer takes a copy when it is created: later calls change
 * the trainers created after them. Not part of the public API (include/kiln). */
#ifndef KILN_TRAIN_TRAINER_FAULT_H
#define KILN_TRAIN_TRAINER_FAULT_H

#include <stdint.h>

typedef struct kiln__trainer_faults {
    /* guards: one gradient made infinite after the reduction at this step (fp16: an overflow
     * to skip); a spike (gradients x100, loss x4) at the first visit of steps [spike_step,
     * spike_step + spike_count), in the gradients alone with spike_norm_only (0: never) */
    int64_t nonfinite_step;
    int64_t spike_step, spike_count;
    int spike_norm_only;
    /* the watchdog, in a run that was not resumed (a restart goes past them): rank hang_rank
     * sleeps inside step hang_step until the process ends or the run is marked hung (0:
     * never); rank slow_rank sleeps slow_ms more in every step */
    int64_t hang_step;
    int hang_rank;
    double slow_ms;
    int slow_rank;
    /* checkpoints: the writer waits checkpoint_delay_ms before writing; the checkpoint of step
     * checkpoint_fail_step fails to write, and at checkpoint_kill_step's the process kills
     * itself (SIGKILL) with the files half written (0: never) */
    long checkpoint_delay_ms;
    int64_t checkpoint_fail_step, checkpoint_kill_step;
    /* the CPU trainer reaches its slabs through the backend's copy op, as the GPU trainer does
     * (its copies checked where they can run) */
    int host_staging;
    /* ZeRO 1 on one machine keeps a copy of the weights per rank instead of one for the
     * machine (the two train the same bits) */
    int separate_weights;
} kiln__trainer_faults;

/* The process's switches from now on (NULL: none). */
void kiln__trainer_fault_set(const kiln__trainer_faults *f);
/* The switches in force (all zero until set). */
const kiln__trainer_faults *kiln__trainer_faults_get(void);

#endif
