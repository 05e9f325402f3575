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
 * recomputable from the master weights), DiLoCo's outer weights and momentum (n fp32 each).
 *
 * Replicas (state.json's "replicas", each naming the file it copies, with its own size and
 * hash): optim_rank<R>.replica.bin, written by rank (R + 1) mod world from the bytes rank R
 * sent it, and model.replica.safetensors, written by rank 1 (one process: both by itself, on
 * request). A resume takes a bad file from its good replica and rewrites it.
 *
 * A folder has one writer: the run whose rank 0 holds an flock on DIR/kiln.lock
 * (trainer_lock.c). A step is assembled in DIR/.step_<8 digits>.tmp.<pid of rank 0> and
 * renamed to its name complete; a published folder that goes (replaced by the same step, or
 * pruned) is first renamed to DIR/.step_<8 digits>.gone.<pid>, so that no name a resume looks
 * at ever holds part of a checkpoint. */
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
/* the owner's lock file in the checkpoint folder */
#define KILN__CKPT_LOCK "kiln.lock"

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
/* src copied to dst (written whole or not at all); *size and *hash: the bytes copied. */
kiln_status kiln__ckpt_copy_file(const char *src, const char *dst, uint64_t *size, uint64_t *hash);
/* The bytes of an optimizer file: the header, then the slabs that flags name for a range of
 * `range` elements of a slab of n, working weights of wsize bytes each. */
size_t kiln__ckpt_image_bytes(uint32_t flags, int64_t range, int64_t n, size_t wsize);
/* The rank that writes rank r's replica (-1: none with one process). */
int kiln__ckpt_replica_holder(int r, int world);

/* ---- the writer (trainer_ckpt_writer.c) ---- */

#include <pthread.h>

#include "kiln/model.h"
#include "kiln/train.h"

/* What a writer writes into a step's temporary folder: copies made on the training thread,
 * so that training goes on meanwhile. The buffers stay allocated between checkpoints. */
typedef struct kiln__ckpt_job {
    int64_t step;
    int rank;
    char tmp[KILN__CKPT_PATH];
    unsigned char *image; /* optim_rank<rank>.bin: header, then slabs (payload hash unset) */
    size_t image_bytes, image_cap;
    unsigned char *peer; /* rank peer_rank's file, for its replica (-1: none) */
    size_t peer_bytes, peer_cap;
    int peer_rank;
    float *weights; /* the whole fp32 slab, for the model files */
    size_t weights_cap;
    kiln_gpt *model; /* its tensors' names and shapes only */
    int write_model, write_model_replica;
    long delay_ms;  /* tests: a pause before writing */
    int fail, kill; /* tests: fail; SIGKILL the process once the first file is written */
    /* out: own file's size and hash, the replica's, model.safetensors's, its replica's */
    uint64_t rec[8];
    double ms;
} kiln__ckpt_job;
/* The job's files into job->tmp (the payload hash filled in first). */
kiln_status kiln__ckpt_job_write(kiln__ckpt_job *j);

/* A job, the state it was staged with, and the thread that writes it. */
typedef struct kiln__ckpt_writer {
    kiln__ckpt_job job;
    uint64_t *loaders; /* (epoch, position, seed) per loader of this rank, at the step */
    int nloaders;
    kiln_loss_scaler scaler;
    int pending; /* handed over, not yet published */
    double copy_ms, started_ms;
    char final[KILN__CKPT_PATH];
    /* the thread */
    int have_thread, queued, done, quit;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    kiln_status status;
    char msg[1024];
} kiln__ckpt_writer;

kiln_status kiln__ckpt_writer_create(kiln__ckpt_writer **out);
/* Hand the job to the thread (started the first time). */
kiln_status kiln__ckpt_writer_submit(kiln__ckpt_writer *w);
/* Whether the job is written (wait: until it is); then w->status and w->msg say how. */
int kiln__ckpt_writer_done(kiln__ckpt_writer *w, int wait);
/* The thread joined (after its job) and everything freed. */
void kiln__ckpt_writer_free(kiln__ckpt_writer *w);

#endif
