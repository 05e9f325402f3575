/* Writing checkpoints: the whole training state, every rank's part of it, in a folder per step
 * that appears complete or not at all (trainer_ckpt.h has the format). */
#define _GNU_SOURCE /* renameat2 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "core/error.h"
#include "core/fs.h"
#include "kiln/checkpoint.h"
#include "kiln/core.h"
#include "train/trainer_ckpt.h"
#include "train/trainer_data.h"
#include "train/trainer_elastic.h"
#include "train/trainer_feature.h"
#include "train/trainer_internal.h"

/* The slabs of this rank's optimizer file, in the order they are written. */
typedef struct slab_list {
    const void *p[6];
    size_t bytes[6];
    uint32_t flags;
} slab_list;

static slab_list rank_slabs(kiln_trainer *t) {
    slab_list l = {.flags = 0};
    size_t r = (size_t)(t->shard_hi - t->shard_lo), n = (size_t)kiln_gpt_slab_len(t->model);
    kiln_dtype wd = kiln_gpt_dtype(t->model);
    const void *p[6] = {kiln_optim_state(t->opt, 0),
                        kiln_optim_state(t->opt, 1),
                        kiln_optim_master(t->opt),
                        wd == KILN_DTYPE_F32 ? NULL
                                             : (const char *)kiln_gpt_params(t->model) +
                                                   (size_t)t->shard_lo * kiln_dtype_size(wd),
                        t->outer_weights,
                        t->outer_velocity};
    size_t bytes[6] = {r * 4, r * 4, r * 4, r * kiln_dtype_size(wd), n * 4, n * 4};
    for (int i = 0; i < 6; i++) {
        l.p[i] = p[i];
        l.bytes[i] = p[i] ? bytes[i] : 0;
        if (p[i])
            l.flags |= 1u << i;
    }
    return l;
}

kiln_status kiln__ckpt_path(char *out, const char *dir, const char *name) {
    int k = snprintf(out, KILN__CKPT_PATH, "%s/%s", dir, name);
    if (k < 0 || k >= KILN__CKPT_PATH)
        return kiln_error_setf(KILN_ERR_ARG, "the path %s/%s is too long", dir, name);
    return KILN_OK;
}

/* Size and XXH3-64 of a whole file, read back (model.safetensors is written by the
 * safetensors writer, which does not hash). */
kiln_status kiln__ckpt_hash_file(const char *path, uint64_t *size, uint64_t *hash) {
    int fd = -1;
    KILN_CHECK(kiln_file_open_regular(path, &fd, size));
    XXH3_state_t *st = XXH3_createState();
    enum { CHUNK = 4 << 20 };
    char *buf = malloc(CHUNK);
    kiln_status s = KILN_OK;
    if (!st || !buf) {
        s = kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate a buffer to hash %s", path);
        goto done;
    }
    XXH3_64bits_reset(st);
    uint64_t total = 0;
    for (;;) {
        ssize_t k = read(fd, buf, CHUNK);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            s = kiln_error_setf(KILN_ERR_IO, "cannot read %s: %s", path, strerror(errno));
            goto done;
        }
        if (k == 0)
            break;
        XXH3_64bits_update(st, buf, (size_t)k);
        total += (uint64_t)k;
    }
    *size = total;
    *hash = XXH3_64bits_digest(st);
done:
    free(buf);
    if (st)
        XXH3_freeState(st);
    close(fd);
    return s;
}

/* mkdir that accepts an existing folder. */
static kiln_status make_dir(const char *path) {
    if (mkdir(path, 0777) == 0 || errno == EEXIST) {
        struct stat sb;
        if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
            return KILN_OK;
        return kiln_error_setf(KILN_ERR_IO, "%s exists and is not a folder", path);
    }
    return kiln_error_setf(KILN_ERR_IO, "cannot create the checkpoint folder %s: %s", path,
                           strerror(errno));
}

/* A folder of plain files (a checkpoint's) and the folder itself; best effort. */
void kiln__ckpt_remove_folder(const char *path) {
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        char p[4096];
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
                snprintf(p, sizeof p, "%s/%s", path, e->d_name);
                (void)unlink(p);
            }
        closedir(d);
    }
    (void)rmdir(path);
}

/* Rank 0, first: the checkpoint folder exists (again, if removed under the run), a temporary
 * folder of this run's from a write that failed is gone, and the new one is empty. */
static kiln_status prepare_folder(kiln_trainer *t, const char *tmp) {
    KILN_CHECK(make_dir(t->cfg.checkpoint.dir));
    (void)kiln__sync_parent(t->cfg.checkpoint.dir); /* a new folder's own entry is durable */
    kiln__ckpt_remove_folder(tmp);
    KILN_CHECK(make_dir(tmp));
    return KILN_OK;
}

/* A published folder taken out of the names a resume reads, in one rename, before its files
 * go: a kill midway leaves a hidden folder that the next prune removes, never a step folder
 * with part of its files. */
static void retire_folder(kiln_trainer *t, const char *path, int64_t step) {
    char gone[KILN__CKPT_PATH];
    snprintf(gone, sizeof gone, "%s/.step_%08lld.gone.%ld", t->cfg.checkpoint.dir, (long long)step,
             t->ckpt_owner);
    kiln__ckpt_remove_folder(gone);
    if (rename(path, gone) == 0)
        kiln__ckpt_remove_folder(gone);
    else if (errno != ENOENT)
        kiln__ckpt_remove_folder(path); /* cannot rename: as before, file by file */
}

/* pid in ".step_<8 digits>.{tmp,gone}[.<pid>]" (0: none, -1: not such a name). */
static long hidden_owner(const char *name) {
    long long step;
    int used = 0;
    if (strncmp(name, ".step_", 6) || sscanf(name, ".step_%8lld%n", &step, &used) != 1 ||
        used != 14)
        return -1;
    const char *rest = name + used;
    if (strcmp(rest, ".tmp") == 0) /* the name before folders were named after their writer */
        return 0;
    if (strncmp(rest, ".tmp.", 5) && strncmp(rest, ".gone.", 6))
        return -1;
    rest = strchr(rest + 1, '.') + 1;
    char *end;
    long pid = strtol(rest, &end, 10);
    return *rest >= '0' && *rest <= '9' && *end == '\0' ? pid : -1;
}

static int loaders_of(const kiln_trainer *t, int r) {
    return t->cfg.dist.rank_batches ? (int)t->cfg.dist.rank_batches[r] : 1;
}

static void put_hex(cJSON *o, const char *k, uint64_t v) {
    char b[24];
    snprintf(b, sizeof b, "%016llx", (unsigned long long)v);
    cJSON_AddStringToObject(o, k, b);
}

enum { REC = 8 }; /* a record's u64s before its loaders' (kiln__ckpt_job's rec) */

static void add_file(cJSON *files, const char *name, const char *of, uint64_t size, uint64_t hash) {
    cJSON *f = cJSON_CreateObject();
    cJSON_AddItemToArray(files, f);
    cJSON_AddStringToObject(f, "name", name);
    if (of)
        cJSON_AddStringToObject(f, "of", of);
    cJSON_AddNumberToObject(f, "size", (double)size);
    put_hex(f, "xxh3", hash);
}

/* Rank 0, last: state.json from every rank's record (files' sizes and hashes, loader
 * states) and the state staged with the job. */
static kiln_status write_state(kiln_trainer *t, const kiln__ckpt_writer *w, const uint64_t *all,
                               const int64_t *at) {
    const char *tmp = w->job.tmp;
    int64_t step = w->job.step;
    const kiln_gpt_config *mc = kiln_gpt_get_config(t->model);
    cJSON *j = cJSON_CreateObject();
    if (!j)
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot build state.json");
    cJSON_AddStringToObject(j, "format", "kiln-checkpoint");
    cJSON_AddNumberToObject(j, "version", KILN__CKPT_VERSION);
    cJSON_AddNumberToObject(j, "step", (double)step);
    put_hex(j, "seed", t->cfg.seed);
    cJSON_AddNumberToObject(j, "world", t->world);
    cJSON_AddNumberToObject(j, "zero", t->world > 1 ? t->cfg.dist.dp.zero : 0);
    put_hex(j, "config_hash", kiln__trainer_config_hash(t, mc));
    put_hex(j, "data_hash", kiln__trainer_data_hash(t));
    kiln__ckpt_put_data(t, j); /* the tokens' checksums, shard by shard */
    cJSON *m = cJSON_AddObjectToObject(j, "model");
    cJSON_AddNumberToObject(m, "n_layer", (double)mc->n_layer);
    cJSON_AddNumberToObject(m, "n_head", (double)mc->n_head);
    cJSON_AddNumberToObject(m, "n_embd", (double)mc->n_embd);
    cJSON_AddNumberToObject(m, "head_size", (double)kiln_gpt_config_head_size(mc));
    cJSON_AddNumberToObject(m, "mlp_hidden", (double)kiln_gpt_config_mlp_width(mc));
    if (mc->rank[0] || mc->rank[1] || mc->rank[2] || mc->rank[3]) { /* low-rank factors */
        cJSON *r = cJSON_AddArrayToObject(m, "rank");
        for (int k = 0; k < 4; k++)
            cJSON_AddItemToArray(r, cJSON_CreateNumber((double)mc->rank[k]));
    }
    cJSON_AddNumberToObject(m, "max_seq_len", (double)mc->max_seq_len);
    cJSON_AddNumberToObject(m, "vocab_size", (double)mc->vocab_size);
    cJSON_AddStringToObject(m, "family", kiln_family_name(mc->family));
    if (mc->family != KILN_FAMILY_GPT2) { /* the rest of the description */
        cJSON_AddNumberToObject(m, "n_kv_head", (double)kiln_gpt_config_kv_heads(mc));
        cJSON_AddNumberToObject(m, "norm_eps", (double)kiln_gpt_config_norm_eps(mc));
        cJSON_AddNumberToObject(m, "rope_theta", (double)kiln_gpt_config_rope_theta(mc));
        cJSON_AddBoolToObject(m, "untied_head", mc->untied_head);
    }
    cJSON_AddStringToObject(m, "dtype", kiln_dtype_name(kiln_gpt_dtype(t->model)));
    cJSON_AddStringToObject(j, "optimizer", kiln_optim_kind_name(t->cfg.optim.kind));
    cJSON *ls = cJSON_AddObjectToObject(j, "loss_scaler");
    cJSON_AddNumberToObject(ls, "scale", (double)w->scaler.scale);
    cJSON_AddNumberToObject(ls, "clean_steps", (double)w->scaler.clean_steps);
    cJSON_AddNumberToObject(ls, "skipped", (double)w->scaler.skipped);
    cJSON_AddNumberToObject(j, "first_loss", (double)t->first_loss);
    kiln__ckpt_put_run(t, j); /* the split and the settings by name: resuming on another split */
    cJSON *ranks = cJSON_AddArrayToObject(j, "ranks");
    cJSON *files = cJSON_AddArrayToObject(j, "files");
    cJSON *replicas = cJSON_AddArrayToObject(j, "replicas");
    add_file(files, "model.safetensors", NULL, all[at[0] + 4], all[at[0] + 5]);
    int mr = t->world > 1 ? 1 : 0; /* the rank that writes the model's replica */
    if (all[at[mr] + 6])
        add_file(replicas, "model.replica.safetensors", "model.safetensors", all[at[mr] + 6],
                 all[at[mr] + 7]);
    for (int r = 0; r < t->world; r++) {
        const uint64_t *rec = all + at[r];
        cJSON *ro = cJSON_CreateObject(), *la = cJSON_AddArrayToObject(ro, "loaders");
        cJSON_AddItemToArray(ranks, ro);
        for (int k = 0; k < loaders_of(t, r); k++) {
            cJSON *lo = cJSON_CreateObject();
            cJSON_AddItemToArray(la, lo);
            cJSON_AddNumberToObject(lo, "epoch", (double)rec[REC + 3 * k]);
            cJSON_AddNumberToObject(lo, "position", (double)rec[REC + 1 + 3 * k]);
            put_hex(lo, "seed", rec[REC + 2 + 3 * k]);
        }
        char name[64], rname[64];
        snprintf(name, sizeof name, "optim_rank%d.bin", r);
        add_file(files, name, NULL, rec[0], rec[1]);
        int holder = t->world > 1 ? kiln__ckpt_replica_holder(r, t->world) : 0;
        const uint64_t *hr = all + at[holder];
        snprintf(rname, sizeof rname, "optim_rank%d.replica.bin", r);
        if (hr[2])
            add_file(replicas, rname, name, hr[2], hr[3]);
    }
    if (t->cfg.checkpoint
            .config_json) { /* config.json (write_config), checked on resume like the rest */
        size_t n = strlen(t->cfg.checkpoint.config_json);
        cJSON *c = cJSON_AddObjectToObject(j, "config_file");
        cJSON_AddStringToObject(c, "name", "config.json");
        cJSON_AddNumberToObject(c, "size", (double)n);
        put_hex(c, "xxh3", XXH3_64bits(t->cfg.checkpoint.config_json, n));
    }
    put_hex(j, "state_xxh3", 0); /* sealed below: state.json's own checksum */
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    if (!text)
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot print state.json");
    kiln_status sealed = kiln__ckpt_seal(text, strlen(text));
    if (sealed != KILN_OK) {
        free(text);
        return sealed;
    }
    char path[4096];
    KILN_CHECK(kiln__ckpt_path(path, tmp, "state.json"));
    kiln_status s = kiln__write_file_atomic(path, text, strlen(text));
    free(text);
    return s;
}

/* Rank 0: the run's configuration (cfg.checkpoint.config_json, the tool's resolved flags) beside
 * the step's other files, so that a published step folder can start the same run again. */
static kiln_status write_config(const kiln_trainer *t, const char *tmp) {
    if (!t->cfg.checkpoint.config_json)
        return KILN_OK;
    char path[4096];
    KILN_CHECK(kiln__ckpt_path(path, tmp, "config.json"));
    return kiln__write_file_atomic(path, t->cfg.checkpoint.config_json,
                                   strlen(t->cfg.checkpoint.config_json));
}

static int step_of_name(const char *name, int64_t *step) {
    long long v;
    int used = 0;
    if (strncmp(name, "step_", 5) || strlen(name) != 13 ||
        sscanf(name, "step_%8lld%n", &v, &used) != 1 || used != 13)
        return 0;
    *step = v;
    return 1;
}

/* Every complete step folder's step, ascending, in *steps (malloc'd). */
kiln_status kiln__ckpt_list(const char *dir, int64_t **steps, int *count) {
    *steps = NULL;
    *count = 0;
    DIR *d = opendir(dir);
    if (!d)
        return kiln_error_setf(errno == ENOENT ? KILN_ERR_NOT_FOUND : KILN_ERR_IO,
                               "cannot read the checkpoint folder %s: %s", dir, strerror(errno));
    struct dirent *e;
    int cap = 0;
    kiln_status s = KILN_OK;
    while ((e = readdir(d))) {
        int64_t v;
        if (!step_of_name(e->d_name, &v))
            continue;
        if (*count == cap) {
            cap = cap ? cap * 2 : 16;
            int64_t *p = realloc(*steps, (size_t)cap * sizeof *p);
            if (!p) {
                s = kiln_error_setf(KILN_ERR_NOMEM, "out of memory listing %s", dir);
                break;
            }
            *steps = p;
        }
        (*steps)[(*count)++] = v;
    }
    closedir(d);
    for (int i = 1; i < *count; i++) /* insertion sort: a few folders */
        for (int k = i; k > 0 && (*steps)[k - 1] > (*steps)[k]; k--) {
            int64_t x = (*steps)[k];
            (*steps)[k] = (*steps)[k - 1];
            (*steps)[k - 1] = x;
        }
    return s;
}

/* After a new checkpoint is complete: older ones beyond the last K go, except every M-th;
 * and the hidden folders that writes and removals killed midway left behind. The folder is
 * this run's (its lock): another writer's can only be a dead one's, except where the file
 * system gave no lock, where a folder whose writer lives on this machine is left alone. */
static void prune(kiln_trainer *t, int64_t newest) {
    int64_t *steps = NULL, keep = t->cfg.checkpoint.keep > 0 ? t->cfg.checkpoint.keep : 3;
    int n = 0;
    DIR *d = opendir(t->cfg.checkpoint.dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char p[KILN__CKPT_PATH];
        long pid = hidden_owner(e->d_name);
        if (pid < 0 || kiln__ckpt_path(p, t->cfg.checkpoint.dir, e->d_name) != KILN_OK)
            continue;
        if (!t->ckpt_locked && pid > 0 && pid != t->ckpt_owner && kill((pid_t)pid, 0) == 0)
            continue;
        kiln__ckpt_remove_folder(p);
    }
    if (d)
        closedir(d);
    if (kiln__ckpt_list(t->cfg.checkpoint.dir, &steps, &n) != KILN_OK)
        return;
    for (int i = 0; i < n - keep; i++) {
        int64_t m = t->cfg.checkpoint.keep_every;
        if (steps[i] == newest || (m > 0 && steps[i] % m == 0))
            continue;
        char p[4096];
        snprintf(p, sizeof p, "%s/" KILN__CKPT_STEP_FMT, t->cfg.checkpoint.dir,
                 (long long)steps[i]);
        retire_folder(t, p, steps[i]);
    }
    free(steps);
}

/* Rank 0, the end: the folder renamed to its name, the rename made durable, latest. */
static kiln_status publish(kiln_trainer *t, const char *tmp, const char *final, int64_t step) {
    struct stat sb;
    if (stat(final, &sb) == 0) { /* the same step written by an earlier run: replaced */
        /* in one exchange where the file system can: the step's name never goes missing */
        if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) == 0)
            kiln__ckpt_remove_folder(tmp); /* the old folder, now under the hidden name */
        else
            retire_folder(t, final, step);
    }
    if (stat(tmp, &sb) == 0 && rename(tmp, final) != 0)
        return kiln_error_setf(KILN_ERR_IO, "cannot rename %s to %s: %s", tmp, final,
                               strerror(errno));
    KILN_CHECK(kiln__sync_parent(final));
    char latest[4096], name[32];
    snprintf(latest, sizeof latest, "%s/latest", t->cfg.checkpoint.dir);
    int len = snprintf(name, sizeof name, KILN__CKPT_STEP_FMT "\n", (long long)step);
    return kiln__write_file_atomic(latest, name, (size_t)len);
}

/* Every rank's record: its job's rec (file sizes and hashes), then (epoch, position, seed)
 * per loader as staged. */
static kiln_status exchange_records(kiln_trainer *t, const kiln__ckpt_writer *w, uint64_t **all,
                                    int64_t **at) {
    int64_t *counts = calloc((size_t)t->world, sizeof *counts);
    *at = calloc((size_t)t->world + 1, sizeof **at);
    for (int r = 0; counts && *at && r < t->world; r++) {
        (*at)[r + 1] = (*at)[r] + REC + 3 * loaders_of(t, r);
        counts[r] = 2 * (REC + 3 * loaders_of(t, r)); /* u64s moved as pairs of floats' bytes */
    }
    *all = *at ? calloc((size_t)(*at)[t->world] + 1, sizeof **all) : NULL;
    kiln_status s = KILN_OK;
    if (!counts || !*all) {
        s = kiln_error_setf(KILN_ERR_NOMEM, "out of memory gathering the checkpoint's records");
        goto done;
    }
    uint64_t *mine = *all + (*at)[t->rank];
    memcpy(mine, w->job.rec, REC * sizeof *mine);
    memcpy(mine + REC, w->loaders, (size_t)w->nloaders * 3 * sizeof *mine);
    if (t->world > 1)
        s = kiln_comm_allgather(mine, *all, counts, KILN_DTYPE_F32, t->comm);
done:
    free(counts);
    return s;
}

/* Rank 0 tells the console; another rank says why on stderr when the failure was its own
 * (rank 0's line names it). */
static void warn(kiln_trainer *t, int64_t step, int own) {
    char why[1024];
    snprintf(why, sizeof why, "%s", kiln_error_message());
    char *tail = strstr(why, " (its message says why)"); /* the agreement's "rank 0 stops too" */
    if (tail)
        tail[strlen(" (its message says why)")] = '\0';
    t->ckpt_missed++;
    if (t->ckpt_missed == 1) {
        t->ckpt_first_missed = step;
        snprintf(t->ckpt_why, sizeof t->ckpt_why, "%.500s", why);
    }
    FILE *out = t->rank == 0 ? t->cfg.metrics.log : own ? stderr : NULL;
    char who[32] = "";
    if (t->rank != 0)
        snprintf(who, sizeof who, "rank %d: ", t->rank);
    kiln__warn(out,
               "%sthe checkpoint of step %lld was not written: %s; training goes on (older "
               "checkpoints are kept; the next is tried at the next interval)",
               who, (long long)step, why);
}

/* A step of writing on every rank, then whether all succeeded: a failure is a warning. */
#define AGREE_OR_WARN(local, what)                                                                 \
    do {                                                                                           \
        kiln_status l_ = (local);                                                                  \
        if (kiln__trainer_agree(t, l_, (what)) != KILN_OK) {                                       \
            warn(t, step, l_ != KILN_OK);                                                          \
            goto cleanup;                                                                          \
        }                                                                                          \
    } while (0)

/* After every rank's writer is done (local: this rank's status): the records exchanged, and
 * rank 0 writes state.json, renames the folder, updates latest and prunes. */
static kiln_status publish_job(kiln_trainer *t, kiln__ckpt_writer *w, kiln_status local) {
    int64_t step = w->job.step;
    uint64_t *all = NULL;
    int64_t *at = NULL;
    kiln_status s = KILN_OK, fatal = KILN_OK;
    int published = 0;
    if (local != KILN_OK)
        (void)kiln_error_setf(local, "%s", w->msg);
    AGREE_OR_WARN(local, "to write its checkpoint files");
    if ((fatal = exchange_records(t, w, &all, &at)))
        goto cleanup;
    if (t->rank == 0) {
        s = write_config(t, w->job.tmp);
        if (s == KILN_OK)
            s = write_state(t, w, all, at);
        if (s == KILN_OK)
            s = publish(t, w->job.tmp, w->final, step);
        if (s == KILN_OK)
            prune(t, step);
    }
    AGREE_OR_WARN(s, "to complete the checkpoint");
    published = 1;
    t->ckpt_step = step;
    if (t->cfg.metrics.log && t->cfg.checkpoint.sync)
        fprintf(t->cfg.metrics.log, "checkpoint: %s (step %lld) in %.0f ms\n", w->final,
                (long long)step, kiln_time_ms() - w->started_ms);
    else if (t->cfg.metrics.log)
        fprintf(t->cfg.metrics.log,
                "checkpoint: %s (step %lld): the step paused %.0f ms to copy it; written in the "
                "background in %.0f ms, published %.0f ms after the pause\n",
                w->final, (long long)step, w->copy_ms, w->job.ms,
                kiln_time_ms() - w->started_ms - w->copy_ms);
cleanup:
    if (t->rank == 0 && !published) /* whatever a failed write left (renamed: nothing) */
        kiln__ckpt_remove_folder(w->job.tmp);
    free(all);
    free(at);
    return fatal;
}

static int replicas_on(const kiln_trainer *t) {
    return t->world > 1 ? t->cfg.checkpoint.replicas >= 0 : t->cfg.checkpoint.replicas > 0;
}

/* buf grown to at least bytes (a multiple of 4: images travel as floats), zero-padded. */
static kiln_status grow(void **buf, size_t *cap, size_t bytes) {
    size_t want = (bytes + 3) & ~(size_t)3;
    if (*cap < want) {
        void *p = realloc(*buf, want);
        if (!p)
            return kiln_error_setf(KILN_ERR_NOMEM,
                                   "cannot allocate %.1f MiB to stage the checkpoint",
                                   (double)want / (1 << 20));
        *buf = p;
        *cap = want;
    }
    memset((char *)*buf + bytes, 0, want - bytes);
    return KILN_OK;
}

/* The staging buffers for this checkpoint, sized (local; before any collective). */
static kiln_status stage_alloc(kiln_trainer *t, kiln__ckpt_writer *w) {
    kiln__ckpt_job *j = &w->job;
    int64_t n = kiln_gpt_slab_len(t->model);
    slab_list l = rank_slabs(t);
    size_t wsize = kiln_dtype_size(kiln_gpt_dtype(t->model));
    j->image_bytes = kiln__ckpt_image_bytes(l.flags, t->shard_hi - t->shard_lo, n, wsize);
    KILN_CHECK(grow((void **)&j->image, &j->image_cap, j->image_bytes));
    j->peer_rank = -1;
    if (replicas_on(t) && t->world > 1) {
        int left = (t->rank + t->world - 1) % t->world;
        int64_t lo = 0, hi = n;
        /* the neighbour's optimizer range: its shard with ZeRO >= 1, else the whole slab (as
         * under local SGD) */
        if (t->dp && t->cfg.dist.dp.zero >= 1 && t->cfg.dist.local_steps == 0)
            kiln_dp_shard_of(t->dp, left, &lo, &hi);
        j->peer_bytes = kiln__ckpt_image_bytes(l.flags, hi - lo, n, wsize);
        if (j->peer == j->image)
            j->peer = NULL, j->peer_cap = 0;
        KILN_CHECK(grow((void **)&j->peer, &j->peer_cap, j->peer_bytes));
        j->peer_rank = left;
    } else if (replicas_on(t)) { /* one process: a second copy of its own file */
        if (j->peer != j->image)
            free(j->peer);
        j->peer = j->image;
        j->peer_bytes = j->image_bytes;
        j->peer_rank = 0;
    }
    j->write_model = t->rank == 0;
    j->write_model_replica = replicas_on(t) && t->rank == (t->world > 1 ? 1 : 0);
    float *master = kiln_optim_master(t->opt);
    int sharded = master && (t->shard_lo != 0 || t->shard_hi != n);
    if (j->write_model || j->write_model_replica || sharded)
        KILN_CHECK(grow((void **)&j->weights, &j->weights_cap, (size_t)n * sizeof(float)));
    int nl = loaders_of(t, t->rank);
    if (w->nloaders < nl) {
        uint64_t *p = realloc(w->loaders, (size_t)nl * 3 * sizeof *p);
        if (!p)
            return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate the loaders' states");
        w->loaders = p;
    }
    w->nloaders = nl;
    return KILN_OK;
}

/* The fp32 weights into staging: gathered from every rank's shard (a collective), or
 * copied; ZeRO 3's working weights gathered and dropped again. An error: communication. */
static kiln_status stage_weights(kiln_trainer *t, kiln__ckpt_job *j) {
    float *master = kiln_optim_master(t->opt);
    int64_t n = kiln_gpt_slab_len(t->model);
    int want = j->write_model || j->write_model_replica;
    if (master && (t->shard_lo != 0 || t->shard_hi != n))
        return kiln__trainer_gather_master_into(t, j->weights);
    if (master)
        return want ? kiln__trainer_to_host(t, j->weights, master, (size_t)n * sizeof(float))
                    : KILN_OK;
    KILN_CHECK(kiln__trainer_zero3_need_all(t));
    if (want)
        KILN_CHECK(kiln__trainer_to_host(t, j->weights, kiln_gpt_params(t->model),
                                         (size_t)n * sizeof(float)));
    return kiln__trainer_zero3_drop_all(t);
}

/* This rank's optimizer file's bytes (the payload's hash is the writer's to fill in). An
 * error: a staged slab that could not be read back. */
static kiln_status stage_image(kiln_trainer *t, kiln__ckpt_job *j, int64_t step) {
    slab_list l = rank_slabs(t);
    kiln__ckpt_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, KILN__CKPT_MAGIC, 8);
    h.version = KILN__CKPT_VERSION;
    h.header_bytes = KILN__CKPT_HEADER;
    h.rank = (uint32_t)t->rank;
    h.world = (uint32_t)t->world;
    h.lo = t->shard_lo;
    h.hi = t->shard_hi;
    h.n = kiln_gpt_slab_len(t->model);
    h.work_dtype = (uint32_t)kiln_gpt_dtype(t->model);
    h.flags = l.flags;
    h.optim_steps = kiln_optim_steps_taken(t->opt);
    h.step = step;
    h.payload_bytes = j->image_bytes - sizeof h;
    memcpy(j->image, &h, sizeof h);
    size_t off = sizeof h;
    for (int i = 0; i < 6; i++) {
        /* the optimizer's slabs and the working weights are the backend's; DiLoCo's the host's */
        if (l.bytes[i] && i < 4)
            KILN_CHECK(kiln__trainer_to_host(t, j->image + off, l.p[i], l.bytes[i]));
        else if (l.bytes[i])
            memcpy(j->image + off, l.p[i], l.bytes[i]);
        off += l.bytes[i];
    }
    return KILN_OK;
}

/* Each rank's image to the next rank (a ring): rank 0 sends first, the others receive
 * first, so that no two wait for each other. */
static kiln_status exchange_images(kiln_trainer *t, kiln__ckpt_job *j) {
    enum { TAG = 7301 };
    int right = (t->rank + 1) % t->world, left = (t->rank + t->world - 1) % t->world;
    int64_t mine = (int64_t)((j->image_bytes + 3) / 4), theirs = (int64_t)((j->peer_bytes + 3) / 4);
    if (t->rank == 0)
        KILN_CHECK(kiln_comm_send(j->image, mine, KILN_DTYPE_F32, right, TAG, t->comm));
    KILN_CHECK(kiln_comm_recv(j->peer, theirs, KILN_DTYPE_F32, left, TAG, t->comm));
    if (t->rank != 0)
        KILN_CHECK(kiln_comm_send(j->image, mine, KILN_DTYPE_F32, right, TAG, t->comm));
    return KILN_OK;
}

kiln_status kiln__trainer_checkpoint_start(kiln_trainer *t) {
    if (!t->cfg.checkpoint.dir)
        return KILN_OK;
    if (!t->ckw)
        KILN_CHECK(kiln__ckpt_writer_create(&t->ckw));
    kiln__ckpt_job *j = &t->ckw->job;
    KILN_CHECK(stage_alloc(t, t->ckw));
    /* the pages taken now, not in the first checkpoint's pause (1.4 GiB for gpt2-124m) */
    memset(j->image, 0, j->image_cap);
    if (j->peer && j->peer != j->image)
        memset(j->peer, 0, j->peer_cap);
    if (j->weights)
        memset(j->weights, 0, j->weights_cap);
    return KILN_OK;
}

kiln_status kiln__trainer_checkpoint(kiln_trainer *t, int64_t step) {
    const kiln_train_config *cfg = &t->cfg;
    if (!cfg->checkpoint.dir || cfg->checkpoint.every <= 0 ||
        (step % cfg->checkpoint.every != 0 && step != cfg->steps))
        return KILN_OK;
    KILN_CHECK(kiln__trainer_checkpoint_now(t, step));
    if (step != cfg->steps && !t->stopping)
        return KILN_OK;
    KILN_CHECK(kiln__trainer_checkpoint_poll(t, step, 1)); /* the end waits for its last one */
    /* the run's result is nowhere it was asked to be: written to a file that says so */
    if (step == cfg->steps && t->ckpt_step != step && !cfg->save.path)
        return kiln__trainer_rescue_final(t, step);
    return KILN_OK;
}

kiln_status kiln__trainer_checkpoint_now(kiln_trainer *t, int64_t step) {
    const kiln_train_config *cfg = &t->cfg;
    if (!cfg->checkpoint.dir)
        return KILN_OK;
    KILN_CHECK(kiln__trainer_checkpoint_poll(t, step, 1)); /* one write at a time */
    if (step == t->ckpt_step)
        return KILN_OK;
    if (strlen(cfg->checkpoint.dir) > KILN__CKPT_PATH - 64) {
        (void)kiln_error_setf(KILN_ERR_ARG, "the checkpoint folder's path is too long");
        warn(t, step, 1);
        return KILN_OK;
    }
    if (!t->ckw)
        KILN_CHECK(kiln__ckpt_writer_create(&t->ckw));
    kiln__ckpt_writer *w = t->ckw;
    kiln__ckpt_job *j = &w->job;
    w->started_ms = kiln_time_ms();
    j->step = step;
    j->rank = t->rank;
    j->model = t->model;
    snprintf(j->tmp, sizeof j->tmp, "%s/.step_%08lld.tmp.%ld", cfg->checkpoint.dir, (long long)step,
             t->ckpt_owner);
    snprintf(w->final, sizeof w->final, "%s/" KILN__CKPT_STEP_FMT, cfg->checkpoint.dir,
             (long long)step);
    /* tests (trainer_fault.h): a slow writer; a failed write, or a killed process, at the
     * checkpoint of that step */
    j->delay_ms = t->faults.checkpoint_delay_ms;
    j->fail = t->faults.checkpoint_fail_step == step;
    j->kill = t->faults.checkpoint_kill_step == step;
    kiln_status s = stage_alloc(t, w);
    if (s == KILN_OK && t->rank == 0)
        s = prepare_folder(t, j->tmp);
    AGREE_OR_WARN(s, "to prepare the checkpoint");
    /* the collectives (not a write that may fail), then the copies */
    KILN_CHECK(stage_weights(t, j));
    KILN_CHECK(stage_image(t, j, step));
    if (j->peer_rank >= 0 && t->world > 1)
        KILN_CHECK(exchange_images(t, j));
    for (int k = 0; k < w->nloaders; k++) {
        kiln_loader_state ls =
            kiln_loader_get_state(t->micro_loaders ? t->micro_loaders[k] : t->train);
        w->loaders[3 * k] = ls.epoch;
        w->loaders[3 * k + 1] = ls.position;
        w->loaders[3 * k + 2] = ls.seed;
    }
    w->scaler = t->scaler;
    w->copy_ms = kiln_time_ms() - w->started_ms;
    if (cfg->checkpoint.sync) {
        s = kiln__ckpt_job_write(j);
        snprintf(w->msg, sizeof w->msg, "%s", s != KILN_OK ? kiln_error_message() : "");
        return publish_job(t, w, s);
    }
    s = kiln__ckpt_writer_submit(w);
    if (s != KILN_OK) { /* no thread: written here */
        s = kiln__ckpt_job_write(j);
        snprintf(w->msg, sizeof w->msg, "%s", s != KILN_OK ? kiln_error_message() : "");
        return publish_job(t, w, s);
    }
    w->pending = 1;
    return KILN_OK;
cleanup:
    if (t->rank == 0)
        kiln__ckpt_remove_folder(j->tmp);
    return KILN_OK;
}

kiln_status kiln__trainer_checkpoint_poll(kiln_trainer *t, int64_t step, int wait) {
    kiln__ckpt_writer *w = t->ckw;
    if (!w || !w->pending)
        return KILN_OK;
    if (!wait) {
        /* local SGD's ranks talk at their averages alone */
        if (t->world > 1 && t->cfg.dist.local_steps > 0 && !kiln__trainer_local_sync_due(t, step))
            return KILN_OK;
        double busy = kiln__ckpt_writer_done(w, 0) ? 0.0 : 1.0;
        if (t->world > 1) /* every rank's: through the engine, counted in the step's traffic */
            KILN_CHECK(kiln_dp_allreduce_sums(t->dp, &busy, 1));
        if (busy > 0.0)
            return KILN_OK;
    }
    kiln__ckpt_writer_done(w, 1);
    w->pending = 0;
    return publish_job(t, w, w->status);
}

void kiln__trainer_checkpoint_free(kiln_trainer *t) {
    kiln__ckpt_writer_free(t->ckw);
    t->ckw = NULL;
}

/* ---- checkpoints as a feature of the trainer (trainer_feature.h) ---- */

/* The resume (every file of the run still as it was), then the staging. */
static kiln_status ckpt_init(kiln_trainer *t) {
    KILN_CHECK(kiln__trainer_resume(t));
    return kiln__trainer_checkpoint_start(t);
}

static kiln_status ckpt_step_sync(kiln_trainer *t, int64_t step) {
    return kiln__trainer_checkpoint_poll(t, step, 0); /* a background write done? */
}

static kiln_status ckpt_step_end(kiln_trainer *t, const kiln_step_info *mt, int *done) {
    (void)done;
    return kiln__trainer_checkpoint(t, mt->step);
}

static kiln_status ckpt_save_now(kiln_trainer *t, int64_t step, const char **where) {
    if (!t->cfg.checkpoint.dir)
        return KILN_OK;
    KILN_CHECK(kiln__trainer_checkpoint_now(t, step));
    KILN_CHECK(kiln__trainer_checkpoint_poll(t, step, 1));
    if (t->ckpt_step != step) /* the warning said why */
        return kiln_error_setf(KILN_ERR_IO, "the checkpoint of step %lld was not written",
                               (long long)step);
    *where = t->cfg.checkpoint.dir;
    return KILN_OK;
}

static void ckpt_feature_free(kiln_trainer *t) {
    kiln__trainer_checkpoint_free(t); /* its thread reads the model's tensors */
    kiln__trainer_ckpt_unlock(t);
}

const kiln__feature kiln__feature_checkpoint = {
    .name = "checkpoints",
    .start = kiln__trainer_ckpt_lock,
    .init = ckpt_init,
    .step_sync = ckpt_step_sync,
    .step_end = ckpt_step_end,
    .save_now = ckpt_save_now,
    .free = ckpt_feature_free,
};
