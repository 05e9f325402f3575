/* kiln prepare: being built. */
#include <stdio.h>

#include "commands.h"

int cmd_prepare(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "kiln prepare: not available in this build\n");
    return 1;
}
