/* kiln bench: being built. */
#include <stdio.h>

#include "commands.h"

int cmd_bench(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "kiln bench: not available in this build\n");
    return 1;
}
