/* The trainer's test-only switches (trainer_fault.h). */
#include "train/trainer_fault.h"

#include <string.h>

/* process-wide, as a signal's disposition: set before the trainers that read them exist */
static kiln__trainer_faults faults;

void kiln__trainer_fault_set(const kiln__trainer_faults *f) {
    if (f)
        faults = *f;
    else
        memset(&faults, 0, sizeof faults);
}

const kiln__trainer_faults *kiln__trainer_faults_get(void) {
    return &faults;
}
