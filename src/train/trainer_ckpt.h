/* The checkpoint format shared by trainer_ckpt.c (writing) and trainer_resume.c (reading).
 *
 * DIR/step_<8 digits>/ holds model.safetensors (the weights: fp32 master weights when there
 * are some, else the working weights), optim_rank<R>.bin per rank, and state.json (step,
 * seed, every rank's loader states, the loss scaler, the hashes of the configuration and the
 * data, and every other file's size and XXH3-64). DIR/latest holds the newest folder's name.
 *
 * optim_rank<R>.bin: a header of KILN__CKPT_HEADER bytes (little-endian, the machine's
 * own: checkpoints are read back on the machines that wrote them), then the slabs its
 * flags name, in flag order: moments 0 and 1 and the master weights (hi - lo fp32 each), the
 * working weights [lo, hi) in their dtype (bf16/fp16: stochastic rounding makes them not
 * recomputable from the master weights), DiLoCo's outer weights and momentum (n fp32 each). */
#ifndef KILN_TRAIN_TRAINER_CKPT_H
#define KILN_TRAIN_TRAINER_CKPT_H

#include <stddef.h>
#include <stdint.h>

#define KILN__CKPT_MAGIC "KILNOPT1"
enum { KILN__CKPT_VERSION = 1, KILN__CKPT_HEADER = 128 };

enum {
    KILN__CKPT_M = 1 << 0,
    KILN__CKPT_V = 1 << 1,
    KILN__CKPT_MASTER = 1 << 2,
    KILN__CKPT_WORKING = 1 << 3,
    KILN__CKPT_OUTER_W = 1 << 4,
    KILN__CKPT_OUTER_V = 1 << 5,
};

typedef struct kiln__ckpt_header {
    char magic[8];
    uint32_t version, header_bytes;
    uint32_t rank, world;
    int64_t lo, hi, n; /* this rank's range of the slab of n elements */
    uint32_t work_dtype, flags;
    int64_t optim_steps, step;
    uint64_t payload_bytes, payload_xxh3; /* the bytes after the header */
    uint8_t pad[KILN__CKPT_HEADER - 88];
} kiln__ckpt_header;
_Static_assert(sizeof(kiln__ckpt_header) == KILN__CKPT_HEADER, "header layout");

/* "step_00000020" */
#define KILN__CKPT_STEP_FMT "step_%08lld"

#include "kiln/status.h"

/* dir/name into out (KILN__CKPT_PATH bytes): KILN_ERR_ARG when it does not fit. */
enum { KILN__CKPT_PATH = 4096 };
kiln_status kiln__ckpt_path(char *out, const char *dir, const char *name);
/* Size and XXH3-64 of a whole file, read through. */
kiln_status kiln__ckpt_hash_file(const char *path, uint64_t *size, uint64_t *hash);
/* The steps of the step folders in dir, ascending (*steps malloc'd). */
kiln_status kiln__ckpt_list(const char *dir, int64_t **steps, int *count);
/* state.json's own checksum (trainer_ckpt_seal.c): the text holds "state_xxh3" with 16 zero
 * digits, which seal replaces by the XXH3-64 of the whole text; check_seal recomputes it
 * (KILN_ERR_FORMAT naming path when it differs or is absent). */
kiln_status kiln__ckpt_seal(char *text, size_t len);
kiln_status kiln__ckpt_check_seal(const char *path, char *text, size_t len);
/* A checkpoint folder's files and the folder; best effort. */
void kiln__ckpt_remove_folder(const char *path);

#endif
