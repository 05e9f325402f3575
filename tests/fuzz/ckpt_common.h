/* What the checkpoint fuzzer and its seed generator share: one tiny training run (its data
 * and configuration), its checkpoint written by the real writer, and the layout of an input.
 *
 * An input is a flags byte, then the files of one step folder, each after a separator line
 * naming it (CKPT_SEP then the name, then a newline): state.json, optim_rank0.bin,
 * optim_rank1.bin, optim_rank0.replica.bin. model.safetensors and its replica are the run's
 * own, written by the fuzzer beside them. Flags: CKPT_FIX_SUMS, state.json's listed sizes and
 * XXH3s of the files given are set to theirs; CKPT_RESEAL, state.json's own checksum
 * (state_xxh3) is set to its text's; so that mutations get past the checksums to the readers
 * behind them, while inputs without the flags still test the checksums themselves. */
#ifndef KILN_FUZZ_CKPT_COMMON_H
#define KILN_FUZZ_CKPT_COMMON_H

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln/core.h"
#include "kiln/shard.h"
#include "kiln/train.h"

#define CKPT_SEP "\n%%kiln-fuzz-file "
enum { CKPT_FIX_SUMS = 1, CKPT_RESEAL = 2 };
static const char *const ckpt_files[] = {"state.json", "optim_rank0.bin", "optim_rank1.bin",
                                         "optim_rank0.replica.bin"};
enum { CKPT_NFILES = 4 };

typedef struct ckpt_run {
    char dir[512], train[600], ckpt[600];
} ckpt_run;

/* A vocabulary of 32 and a learnable sequence. */
static inline int ckpt_make_data(ckpt_run *r, const char *dir) {
    snprintf(r->dir, sizeof r->dir, "%s", dir);
    snprintf(r->train, sizeof r->train, "%s/train_000.bin", dir);
    snprintf(r->ckpt, sizeof r->ckpt, "%s/ckpt", dir);
    int32_t ids[2000];
    for (int i = 0; i < 2000; i++)
        ids[i] = (int32_t)((i * 7 + i / 13) % 32);
    return kiln_shard_write(r->train, 32, ids, 2000) == KILN_OK ? 0 : -1;
}

/* The run: 4 steps of a 1-layer model, a checkpoint every 2 (each file with a replica). The
 * fuzzer resumes it from step 2 with resume_path set. */
static inline kiln_train_config ckpt_config(const ckpt_run *r) {
    kiln_train_config c = kiln_train_config_default();
    c.model = (kiln_gpt_config){
        .max_seq_len = 8, .vocab_size = 0, .n_layer = 1, .n_head = 2, .n_embd = 16};
    c.data.train_path = r->train;
    c.data.B = 2;
    c.data.T = 8;
    c.steps = 4;
    c.lr.warmup_steps = 1;
    c.compute.peak_gflops = 100.0;
    c.seed = 7;
    c.checkpoint.dir = r->ckpt;
    c.checkpoint.every = 2;
    c.checkpoint.sync = 1;
    c.checkpoint.replicas = 1;
    c.watchdog.enabled = 0;
    c.metrics.log = NULL;
    return c;
}

/* The checkpoint of step 2 in r->ckpt/step_00000002. */
static inline int ckpt_train(const ckpt_run *r) {
    kiln_train_config c = ckpt_config(r);
    kiln_train_result res;
    if (kiln_train(&c, &res) != KILN_OK) {
        fprintf(stderr, "checkpoint run: %s\n", kiln_error_message());
        return -1;
    }
    return 0;
}

static inline int ckpt_read(const char *path, char **text, size_t *len) {
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return -1;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    *text = malloc((size_t)n + 1);
    int ok = *text && fread(*text, 1, (size_t)n, fp) == (size_t)n;
    fclose(fp);
    if (!ok) {
        free(*text);
        return -1;
    }
    (*text)[n] = '\0';
    *len = (size_t)n;
    return 0;
}

static inline int ckpt_write(const char *path, const void *p, size_t n) {
    FILE *fp = fopen(path, "wb");
    if (!fp)
        return -1;
    int ok = fwrite(p, 1, n, fp) == n;
    return fclose(fp) == 0 && ok ? 0 : -1;
}

/* rm -rf of a folder of plain files and folders (no links followed). */
static inline void ckpt_rmtree(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0)
        return;
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        for (struct dirent *e; d && (e = readdir(d));) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                continue;
            char sub[1024];
            snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
            ckpt_rmtree(sub);
        }
        if (d)
            closedir(d);
        rmdir(path);
    } else {
        unlink(path);
    }
}

#endif
