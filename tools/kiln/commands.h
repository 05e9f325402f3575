/* kiln's subcommands. Each takes argc/argv starting at the subcommand's name and
 * returns the process exit status (0 ok, 1 failure, 2 usage error; kiln train 3: preempted,
 * saved, resume it; kiln run: its child's). */
#ifndef KILN_TOOL_COMMANDS_H
#define KILN_TOOL_COMMANDS_H

#include <stdint.h>

int cmd_train(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_sample(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_tokenizer(int argc, char **argv);
int cmd_prepare(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_status(int argc, char **argv);
int cmd_report(int argc, char **argv);
int cmd_replay(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_compress(int argc, char **argv);
int cmd_compress_prune(int argc, char **argv); /* kiln compress prune */
int cmd_compress_lowrank(int argc, char **argv); /* kiln compress lowrank */
int cmd_distill(int argc, char **argv);

/* kiln train's parsing and loop (cmd_train.c); replay_step > 0: kiln replay of that step
 * instead (nothing of the run written), through tool_replay (cmd_replay.c). */
struct kiln_train_config;
int tool_train_main(int argc, char **argv, int64_t replay_step);
extern const char *tool_replay_usage;
int tool_replay(const struct kiln_train_config *cfg, int64_t step, const char *run_log, int rank,
                const char *what);

#endif
