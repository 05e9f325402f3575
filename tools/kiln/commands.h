/* kiln's subcommands. Each takes argc/argv starting at the subcommand's name and
 * returns the process exit status (0 ok, 1 failure, 2 usage error; kiln train 3: preempted,
 * saved, resume it; kiln run: its child's). */
#ifndef KILN_TOOL_COMMANDS_H
#define KILN_TOOL_COMMANDS_H

int cmd_train(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_sample(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_tokenizer(int argc, char **argv);
int cmd_prepare(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_replay(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_compress(int argc, char **argv);

#endif
