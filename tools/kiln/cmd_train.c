/* kiln train: being built. */
#include <stdio.h>

#include "commands.h"

int cmd_train(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "kiln train: not available in this build\n");
    return 1;
}
