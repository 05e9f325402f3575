/* kiln train's test-only switches: its --inject-* flags and the documented test variables,
 * into the trainer's one internal control call (kiln__trainer_fault_set). The library reads
 * no test variable itself; this command does (docs/architecture.md, Tests). */
#ifndef KILN_TOOL_TEST_FAULTS_H
#define KILN_TOOL_TEST_FAULTS_H

/* the trainer's internal control header: the one header of src/ the command includes */
#include "../../src/train/trainer_fault.h"

/* The test variables into *f (those unset leave f as it was):
 *   KILN_TEST_CHECKPOINT_DELAY_MS=MS  the checkpoint writer waits MS before writing
 *   KILN_TEST_CHECKPOINT_FAIL=STEP    the checkpoint of STEP fails to write
 *   KILN_TEST_CHECKPOINT_KILL=STEP    the process kills itself (SIGKILL) writing STEP's
 *   KILN_TRAIN_HOST_STAGING=1         the CPU trainer copies its slabs as the GPU trainer does
 *   KILN_COMMON_WEIGHTS=0             ZeRO 1 on one machine keeps a copy of the weights per
 *                                     rank instead of one for the machine */
void tool_test_faults_from_env(kiln__trainer_faults *f);

#endif
