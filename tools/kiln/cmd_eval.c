/* kiln eval: being built. */
#include <stdio.h>

#include "commands.h"

int cmd_eval(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "kiln eval: not available in this build\n");
    return 1;
}
