/* kiln sample: being built. */
#include <stdio.h>

#include "commands.h"

int cmd_sample(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "kiln sample: not available in this build\n");
    return 1;
}
