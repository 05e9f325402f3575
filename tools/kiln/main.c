/* The kiln command: dispatches to subcommands. */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "tool_common.h"

typedef struct tool_command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} tool_command;

static const tool_command commands[] = {
    {"train", cmd_train, "train a GPT model on token shards"},
    {"eval", cmd_eval, "mean loss and perplexity of a model over a token file"},
    {"sample", cmd_sample, "generate text from a model"},
    {"prepare", cmd_prepare, "turn text into train and validation token shards"},
    {"tokenizer", cmd_tokenizer, "encode, decode, or train a tokenizer"},
    {"replay", cmd_replay,
     "re-run one step of a run from its checkpoint: a bad batch or a blow-up?"},
    {"run", cmd_run, "supervise a training: restart it from its checkpoints after a crash"},
    {"status", cmd_status, "a running training's health from its heartbeat files"},
    {"report", cmd_report, "one HTML page of runs' curves, events and configuration"},
    {"distill", cmd_distill, "train a smaller model on a teacher's outputs"},
    {"export", cmd_export, "write a model as GGUF for llama.cpp"},
    {"compress", cmd_compress, "smaller models: int8 and int4, pruned heads and neurons, low-rank"},
    {"bench", cmd_bench, "measure this machine (kiln bench peak)"},
};

static void usage(FILE *f) {
    fprintf(f,
            "usage: kiln COMMAND [flags]   (kiln COMMAND --help lists its flags)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    tool_exit_handlers_install();
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "kiln: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
