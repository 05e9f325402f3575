/* The test variables into the trainer's test switches (test_faults.h). */
#include "test_faults.h"

#include <stdlib.h>
#include <string.h>

static const char *var(const char *name) {
    const char *v = getenv(name);
    return v && v[0] ? v : NULL;
}

static long num(const char *name) {
    const char *v = var(name);
    return v ? strtol(v, NULL, 10) : 0;
}

void tool_test_faults_from_env(kiln__trainer_faults *f) {
    if (var("KILN_TEST_CHECKPOINT_DELAY_MS"))
        f->checkpoint_delay_ms = num("KILN_TEST_CHECKPOINT_DELAY_MS");
    if (var("KILN_TEST_CHECKPOINT_FAIL"))
        f->checkpoint_fail_step = num("KILN_TEST_CHECKPOINT_FAIL");
    if (var("KILN_TEST_CHECKPOINT_KILL"))
        f->checkpoint_kill_step = num("KILN_TEST_CHECKPOINT_KILL");
    const char *staging = var("KILN_TRAIN_HOST_STAGING");
    if (staging)
        f->host_staging = !strcmp(staging, "1");
    const char *common = var("KILN_COMMON_WEIGHTS");
    if (common)
        f->separate_weights = !strcmp(common, "0");
}
