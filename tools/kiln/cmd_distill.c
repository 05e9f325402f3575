/* kiln distill: kiln train with a teacher (--teacher WEIGHTS required). */
#include <stdio.h>
#include <string.h>

#include "commands.h"

int cmd_distill(int argc, char **argv) {
    int has = 0, help = 0;
    for (int i = 1; i < argc; i++) {
        has |= !strcmp(argv[i], "--teacher") || !strncmp(argv[i], "--teacher=", 10);
        help |= !strcmp(argv[i], "--help") || !strcmp(argv[i], "-h");
    }
    if (!has && !help) {
        fprintf(stderr,
                "usage: kiln distill --teacher WEIGHTS [kiln train flags]\n\n"
                "Train a student model (the kiln train flags: e.g. fewer --layers) on the data and\n"
                "on a trained teacher's outputs softened at --distill-temperature: its loss is\n"
                "--distill-alpha x the data's cross-entropy + (1 - alpha) x T^2 x KL(teacher ||\n"
                "student). The teacher runs forward only. kiln train --help lists the flags.\n");
        return 2;
    }
    return tool_train_main(argc, argv, 0);
}
