/* kiln tokenizer: being built. */
#include <stdio.h>

#include "commands.h"

int cmd_tokenizer(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "kiln tokenizer: not available in this build\n");
    return 1;
}
