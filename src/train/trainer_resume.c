/* Resuming from a checkpoint: the newest good one is found and checked whole (every file's
 * checksum, and that it is this run's model, optimizer, data and world) before anything of
 * the trainer is touched; then everything a step depends on is restored, so that the resumed
 * run is bit for bit the run that was interrupted. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "kiln/checkpoint.h"
#include "kiln/core.h"
#include "train/trainer_ckpt.h"
#include "train/trainer_internal.h"

static int is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int64_t num(const cJSON *o, const char *k, int *ok) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(v)) {
        *ok = 0;
        return 0;
    }
    return (int64_t)v->valuedouble;
}

static uint64_t hex(const cJSON *o, const char *k, int *ok) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    char *end = NULL;
    if (!cJSON_IsString(v) || !v->valuestring[0]) {
        *ok = 0;
        return 0;
    }
    uint64_t x = strtoull(v->valuestring, &end, 16);
    if (*end)
        *ok = 0;
    return x;
}

/* The checkpoint is this run's: the same model, optimizer, data, world and configuration.
 * KILN_ERR_CONFIG naming the first that differs. */
static kiln_status check_identity(kiln_trainer *t, const char *folder, const cJSON *j) {
    const kiln_gpt_config *mc = kiln_gpt_get_config(t->model);
    int ok = 1;
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "model");
    int64_t L = num(m, "n_layer", &ok), H = num(m, "n_head", &ok), C = num(m, "n_embd", &ok);
    int64_t ctx = num(m, "max_seq_len", &ok), V = num(m, "vocab_size", &ok);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(m, "dtype");
    const cJSON *op = cJSON_GetObjectItemCaseSensitive(j, "optimizer");
    int64_t world = num(j, "world", &ok), zero = num(j, "zero", &ok);
    uint64_t ch = hex(j, "config_hash", &ok), dh = hex(j, "data_hash", &ok);
    if (!ok || !cJSON_IsString(dt) || !cJSON_IsString(op))
        return kiln_error_setf(KILN_ERR_FORMAT, "%s/state.json lacks a field", folder);
    const char *mine_dt = kiln_dtype_name(kiln_gpt_dtype(t->model));
    if (L != mc->n_layer || H != mc->n_head || C != mc->n_embd || ctx != mc->max_seq_len ||
        V != mc->vocab_size)
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "%s is a checkpoint of another model (%lld layers, %lld heads, "
                               "%lld channels, context %lld, vocabulary %lld; this run's has "
                               "%lld, %lld, %lld, %lld, %lld): not resumed",
                               folder, (long long)L, (long long)H, (long long)C, (long long)ctx,
                               (long long)V, (long long)mc->n_layer, (long long)mc->n_head,
                               (long long)mc->n_embd, (long long)mc->max_seq_len,
                               (long long)mc->vocab_size);
    if (strcmp(dt->valuestring, mine_dt))
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "%s is a checkpoint of a %s run; this run trains in %s: not "
                               "resumed",
                               folder, dt->valuestring, mine_dt);
    if (strcmp(op->valuestring, kiln_optim_kind_name(t->cfg.optim.kind)))
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "%s is a checkpoint of another optimizer (%s; this run's is %s): "
                               "not resumed",
                               folder, op->valuestring, kiln_optim_kind_name(t->cfg.optim.kind));
    if (dh != kiln__trainer_data_hash(t))
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "%s is a checkpoint of a run on another data set (its training or "
                               "validation data differ from %s): not resumed",
                               folder, t->cfg.train_path);
    int my_zero = t->world > 1 ? t->cfg.dp.zero : 0;
    if (world != t->world || zero != my_zero)
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "%s was written by %lld rank(s) with ZeRO %lld; this run has %d "
                               "rank(s) with ZeRO %d: resuming on another number of ranks or "
                               "another ZeRO stage is not supported yet",
                               folder, (long long)world, (long long)zero, t->world, my_zero);
    if (ch != kiln__trainer_config_hash(t, mc))
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "%s is a checkpoint of another configuration (batch, steps, "
                               "optimizer settings, schedule, precision, seed or data-parallel "
                               "flags differ): resume with the flags of the run that wrote it",
                               folder);
    return KILN_OK;
}

/* A file state.json lists (an entry of "files" or "replicas") has its size and checksum:
 * KILN_ERR_FORMAT naming it otherwise. */
static kiln_status check_entry(const char *folder, const cJSON *f) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
    int ok = 1;
    uint64_t size = (uint64_t)num(f, "size", &ok), sum = hex(f, "xxh3", &ok), gs, gh;
    if (!ok || !cJSON_IsString(name) || strchr(name->valuestring, '/'))
        return kiln_error_setf(KILN_ERR_FORMAT, "%s/state.json: a malformed file entry", folder);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", folder, name->valuestring);
    if (kiln__ckpt_hash_file(path, &gs, &gh) != KILN_OK) /* any failure: a damaged folder */
        return KILN_ERR_FORMAT;
    if (gs != size || gh != sum)
        return kiln_error_setf(KILN_ERR_FORMAT,
                               "%s does not match its checksum (%llu bytes, XXH3 %016llx; "
                               "state.json says %llu bytes, %016llx)",
                               path, (unsigned long long)gs, (unsigned long long)gh,
                               (unsigned long long)size, (unsigned long long)sum);
    return KILN_OK;
}

/* The replica state.json lists for the file `name` (NULL: none). */
static const cJSON *replica_of(const cJSON *j, const char *name) {
    const cJSON *reps = cJSON_GetObjectItemCaseSensitive(j, "replicas"), *r;
    cJSON_ArrayForEach(r, reps) {
        const cJSON *of = cJSON_GetObjectItemCaseSensitive(r, "of");
        if (cJSON_IsString(of) && !strcmp(of->valuestring, name))
            return r;
    }
    return NULL;
}

/* A file that failed its check (why: the message) rebuilt from its replica when that one is
 * good: the primary rewritten from it, whole or not at all. KILN_ERR_FORMAT when there is no
 * good replica. */
static kiln_status rebuild(kiln_trainer *t, const char *folder, const cJSON *j, const cJSON *f) {
    char why[1024], path[4096], rpath[4096];
    snprintf(why, sizeof why, "%s", kiln_error_message());
    const char *name = cJSON_GetObjectItemCaseSensitive(f, "name")->valuestring;
    const cJSON *r = replica_of(j, name);
    const cJSON *rname = cJSON_GetObjectItemCaseSensitive(r, "name");
    if (!r || !cJSON_IsString(rname))
        return kiln_error_setf(KILN_ERR_FORMAT, "%s", why);
    if (check_entry(folder, r) != KILN_OK) {
        char rwhy[1024];
        snprintf(rwhy, sizeof rwhy, "%s", kiln_error_message());
        return kiln_error_setf(KILN_ERR_FORMAT, "%s; its replica is bad too: %s", why, rwhy);
    }
    int ok = 1;
    uint64_t size = (uint64_t)num(f, "size", &ok), sum = hex(f, "xxh3", &ok), gs = 0, gh = 0;
    snprintf(path, sizeof path, "%s/%s", folder, name);
    snprintf(rpath, sizeof rpath, "%s/%s", folder, rname->valuestring);
    kiln_status s = kiln__ckpt_copy_file(rpath, path, &gs, &gh);
    if (s == KILN_OK && (gs != size || gh != sum))
        s = kiln_error_setf(KILN_ERR_FORMAT, "%s's replica %s is not a copy of it", path, rpath);
    if (s != KILN_OK) {
        char rwhy[1024];
        snprintf(rwhy, sizeof rwhy, "%s", kiln_error_message());
        return kiln_error_setf(KILN_ERR_FORMAT, "%s; rebuilding it from its replica failed: %s",
                               why, rwhy);
    }
    FILE *out = t->rank == 0 ? t->cfg.log : stderr;
    if (out) {
        char who[32] = "";
        if (t->rank != 0)
            snprintf(who, sizeof who, "rank %d: ", t->rank);
        fprintf(out, "resume: %srebuilt %s from its replica %s (%s)\n", who, path, rpath, why);
        fflush(out);
    }
    return KILN_OK;
}

/* Every file listed in state.json has its size and checksum, or is rebuilt from a good
 * replica: KILN_ERR_FORMAT otherwise. */
static kiln_status check_files(kiln_trainer *t, const char *folder, const cJSON *j, int world) {
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(j, "files"), *f;
    if (cJSON_GetArraySize(files) != world + 1)
        return kiln_error_setf(KILN_ERR_FORMAT, "%s/state.json lists %d files, not %d", folder,
                               cJSON_GetArraySize(files), world + 1);
    cJSON_ArrayForEach(f, files) {
        kiln_status s = check_entry(folder, f);
        if (s == KILN_OK)
            continue;
        if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(f, "name")))
            return s;
        KILN_CHECK(rebuild(t, folder, j, f));
    }
    return KILN_OK;
}

/* One candidate folder: state.json read and checked whole. KILN_ERR_CONFIG: not this run's
 * (final); any other error: damaged (an older one may do). */
static kiln_status check_folder(kiln_trainer *t, const char *folder, cJSON **out) {
    *out = NULL;
    char path[4096], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/state.json", folder);
    kiln_status s = kiln_file_read(path, (size_t)64 << 20, &text, &len);
    if (s != KILN_OK) /* its message says why: kept */
        return KILN_ERR_FORMAT;
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    if (!j)
        return kiln_error_setf(KILN_ERR_FORMAT, "%s is not valid JSON", path);
    KILN_CHECK_GOTO(s, check_identity(t, folder, j), fail);
    KILN_CHECK_GOTO(s, check_files(t, folder, j, t->world), fail);
    *out = j;
    return KILN_OK;
fail:
    cJSON_Delete(j);
    return s;
}

/* ---- restoring ---- */

/* The slabs' sizes in a rank file, in flag order (0 for those absent); their sum. */
static size_t slab_sizes(const kiln__ckpt_header *h, size_t sizes[6]) {
    size_t r = (size_t)(h->hi - h->lo), n = (size_t)h->n, sum = 0;
    size_t all[6] = {r * 4, r * 4, r * 4, r * kiln_dtype_size((kiln_dtype)h->work_dtype),
                     n * 4, n * 4};
    for (int i = 0; i < 6; i++) {
        sizes[i] = h->flags & (1u << i) ? all[i] : 0;
        sum += sizes[i];
    }
    return sum;
}

/* Open a rank's file and read its header, checked against the file's size. Its bytes were
 * checked against state.json's checksum just before; the slabs are then read straight into
 * place (pread), never the whole file into memory (a gpt2-124m one is 1 GiB). */
static kiln_status open_rank_file(const char *folder, int r, int64_t n, kiln__ckpt_header *h,
                                  int *fd) {
    char path[KILN__CKPT_PATH], name[64];
    uint64_t size = 0;
    size_t sizes[6];
    snprintf(name, sizeof name, "optim_rank%d.bin", r);
    KILN_CHECK(kiln__ckpt_path(path, folder, name));
    KILN_CHECK(kiln_file_open_regular(path, fd, &size));
    if (size < sizeof *h || pread(*fd, h, sizeof *h, 0) != (ssize_t)sizeof *h)
        goto bad;
    if (memcmp(h->magic, KILN__CKPT_MAGIC, 8) || h->version != KILN__CKPT_VERSION ||
        h->header_bytes != KILN__CKPT_HEADER || (int)h->rank != r || h->n != n || h->lo < 0 ||
        h->lo > h->hi || h->hi > n || h->work_dtype > 64 || h->payload_bytes != size - sizeof *h ||
        slab_sizes(h, sizes) != h->payload_bytes)
        goto bad;
    return KILN_OK;
bad:
    close(*fd);
    *fd = -1;
    return kiln_error_setf(KILN_ERR_FORMAT,
                           "%s is not a kiln optimizer file of rank %d of this model, or is "
                           "damaged",
                           path, r);
}

/* Read the slab of flag `which` into dst (bytes; nothing when dst is NULL), or fail naming
 * what is missing. */
static kiln_status take(int fd, const kiln__ckpt_header *h, uint32_t which, void *dst, size_t bytes,
                        const char *what) {
    size_t sizes[6], off = sizeof *h;
    slab_sizes(h, sizes);
    if (!dst)
        return KILN_OK;
    for (int i = 0; i < 6; i++) {
        if ((1u << i) != which) {
            off += sizes[i];
            continue;
        }
        if (sizes[i] != bytes)
            break;
        for (size_t done = 0; done < bytes;) {
            ssize_t k = pread(fd, (char *)dst + done, bytes - done, (off_t)(off + done));
            if (k < 0 && errno == EINTR)
                continue;
            if (k <= 0)
                return kiln_error_setf(KILN_ERR_IO, "cannot read the checkpoint of rank %u: %s",
                                       h->rank, k < 0 ? strerror(errno) : "it ends early");
            done += (size_t)k;
        }
        return KILN_OK;
    }
    return kiln_error_setf(KILN_ERR_FORMAT, "the checkpoint of rank %u lacks %s", h->rank, what);
}

/* The weights: fp32 master weights (this rank's shard) from model.safetensors, the working
 * weights from every rank's file when narrow (as they were: stochastic rounding is not
 * recomputable), or from model.safetensors when fp32. */
static kiln_status restore_weights(kiln_trainer *t, const char *folder) {
    char path[4096];
    KILN_CHECK(kiln__ckpt_path(path, folder, "model.safetensors"));
    float *master = kiln_optim_master(t->opt);
    if (!master)
        return kiln_gpt_load_safetensors(t->model, path);
    int64_t n = kiln_gpt_slab_len(t->model);
    int whole = t->shard_lo == 0 && t->shard_hi == n; /* else the shard is cut from the slab */
    float *full = whole ? master : malloc((size_t)n * sizeof *full);
    if (!full)
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate the checkpoint's weights");
    kiln_status s = kiln_gpt_load_slab(t->model, path, full, KILN_DTYPE_F32);
    if (s == KILN_OK && !whole)
        memcpy(master, full + t->shard_lo, (size_t)(t->shard_hi - t->shard_lo) * sizeof *full);
    if (!whole)
        free(full);
    kiln_dtype wd = kiln_gpt_dtype(t->model);
    for (int r = 0; r < t->world && s == KILN_OK; r++) {
        kiln__ckpt_header h;
        int fd = -1;
        KILN_CHECK(open_rank_file(folder, r, n, &h, &fd));
        if (h.work_dtype != (uint32_t)wd)
            s = kiln_error_setf(KILN_ERR_FORMAT, "%s: rank %d's working weights are not %s", folder,
                                r, kiln_dtype_name(wd));
        if (s == KILN_OK)
            s = take(fd, &h, KILN__CKPT_WORKING,
                     (char *)kiln_gpt_params(t->model) + (size_t)h.lo * kiln_dtype_size(wd),
                     (size_t)(h.hi - h.lo) * kiln_dtype_size(wd), "its working weights");
        close(fd);
    }
    return s;
}

/* This rank's moments, step count and DiLoCo state from its own file. */
static kiln_status restore_optimizer(kiln_trainer *t, const char *folder) {
    kiln__ckpt_header h;
    int fd = -1;
    KILN_CHECK(open_rank_file(folder, t->rank, kiln_gpt_slab_len(t->model), &h, &fd));
    size_t r4 = (size_t)(t->shard_hi - t->shard_lo) * sizeof(float);
    size_t n4 = (size_t)kiln_gpt_slab_len(t->model) * sizeof(float);
    kiln_status s = KILN_OK;
    if (h.lo != t->shard_lo || h.hi != t->shard_hi || (int)h.world != t->world) {
        s = kiln_error_setf(KILN_ERR_FORMAT, "%s: rank %d's range differs from this run's", folder,
                            t->rank);
        goto done;
    }
    KILN_CHECK_GOTO(s, take(fd, &h, KILN__CKPT_M, kiln_optim_state(t->opt, 0), r4, "moment 0"),
                    done);
    KILN_CHECK_GOTO(s, take(fd, &h, KILN__CKPT_V, kiln_optim_state(t->opt, 1), r4, "moment 1"),
                    done);
    KILN_CHECK_GOTO(s, take(fd, &h, KILN__CKPT_OUTER_W, t->outer_weights, n4, "outer weights"),
                    done);
    KILN_CHECK_GOTO(s, take(fd, &h, KILN__CKPT_OUTER_V, t->outer_velocity, n4, "outer momentum"),
                    done);
    KILN_CHECK_GOTO(s, kiln_optim_set_steps(t->opt, h.optim_steps), done);
done:
    close(fd);
    return s;
}

/* Loader states, loss scaler, step counter from state.json. */
static kiln_status restore_state(kiln_trainer *t, const char *folder, const cJSON *j) {
    int ok = 1;
    const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(j, "ranks");
    const cJSON *loaders =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(ranks, t->rank), "loaders");
    int want = t->micro_loaders ? (int)t->micro : 1;
    if (cJSON_GetArraySize(loaders) != want)
        return kiln_error_setf(KILN_ERR_FORMAT,
                               "%s/state.json: rank %d has %d loader states, "
                               "not %d",
                               folder, t->rank, cJSON_GetArraySize(loaders), want);
    for (int k = 0; k < want; k++) {
        const cJSON *o = cJSON_GetArrayItem(loaders, k);
        kiln_loader_state ls = {.epoch = (uint64_t)num(o, "epoch", &ok),
                                .position = (uint64_t)num(o, "position", &ok),
                                .seed = hex(o, "seed", &ok)};
        if (!ok)
            break;
        KILN_CHECK(kiln_loader_set_state(t->micro_loaders ? t->micro_loaders[k] : t->train, &ls));
    }
    const cJSON *sc = cJSON_GetObjectItemCaseSensitive(j, "loss_scaler");
    const cJSON *scale = cJSON_GetObjectItemCaseSensitive(sc, "scale");
    int64_t clean = num(sc, "clean_steps", &ok), skipped = num(sc, "skipped", &ok);
    int64_t step = num(j, "step", &ok);
    const cJSON *fl = cJSON_GetObjectItemCaseSensitive(j, "first_loss");
    if (!ok || !cJSON_IsNumber(scale) || step < 1 || step > t->cfg.steps)
        return kiln_error_setf(KILN_ERR_FORMAT,
                               "%s/state.json lacks a field or its step is "
                               "beyond this run's %lld steps",
                               folder, (long long)t->cfg.steps);
    t->scaler.scale = (float)scale->valuedouble;
    t->scaler.clean_steps = clean;
    t->scaler.skipped = skipped;
    t->steps_done = step;
    t->ckpt_step = step;
    t->resumed_step = step;
    t->first_loss = cJSON_IsNumber(fl) ? (float)fl->valuedouble : 0.0f;
    return KILN_OK;
}

/* The folders to try, best first: what `latest` names, then every step folder, newest first.
 * A path that is itself a step folder is the only one. */
static kiln_status candidates(kiln_trainer *t, const char *dir, char ***out, int *count) {
    FILE *log = t->cfg.log;
    char path[4096], *text = NULL;
    size_t len = 0;
    int64_t *steps = NULL;
    int n = 0, k = 0;
    *out = NULL;
    *count = 0;
    snprintf(path, sizeof path, "%s/state.json", dir);
    if (access(path, F_OK) == 0) {
        *out = calloc(1, sizeof **out);
        if (!*out || !((*out)[0] = strdup(dir)))
            return kiln_error_setf(KILN_ERR_NOMEM, "out of memory");
        *count = 1;
        return KILN_OK;
    }
    KILN_CHECK(kiln__ckpt_list(dir, &steps, &n));
    *out = calloc((size_t)n + 1, sizeof **out);
    if (!*out) {
        free(steps);
        return kiln_error_setf(KILN_ERR_NOMEM, "out of memory");
    }
    snprintf(path, sizeof path, "%s/latest", dir);
    if (kiln_file_read(path, 4096, &text, &len) == KILN_OK) {
        text[strcspn(text, "\r\n")] = '\0';
        snprintf(path, sizeof path, "%s/%s", dir, text);
        if (!strchr(text, '/') && is_dir(path))
            (*out)[k++] = strdup(path);
        else if (log)
            fprintf(log,
                    "resume: %s/latest names %s, which is not there; trying the newest "
                    "checkpoint in %s\n",
                    dir, text, dir);
        free(text);
    }
    for (int i = n - 1; i >= 0; i--) {
        snprintf(path, sizeof path, "%s/" KILN__CKPT_STEP_FMT, dir, (long long)steps[i]);
        if (k == 0 || strcmp((*out)[0], path))
            (*out)[k++] = strdup(path);
    }
    free(steps);
    *count = k;
    for (int i = 0; i < k; i++)
        if (!(*out)[i])
            return kiln_error_setf(KILN_ERR_NOMEM, "out of memory");
    return KILN_OK;
}

kiln_status kiln__trainer_resume(kiln_trainer *t) {
    const char *dir = t->cfg.resume_path;
    FILE *log = t->cfg.log;
    if (!dir)
        return KILN_OK;
    char **folders = NULL;
    int count = 0, chosen = -1;
    cJSON *j = NULL;
    kiln_status s = candidates(t, dir, &folders, &count);
    for (int i = 0; s == KILN_OK && i < count && chosen < 0; i++) {
        kiln_status c = check_folder(t, folders[i], &j);
        if (c == KILN_OK)
            chosen = i;
        else if (c == KILN_ERR_CONFIG || count == 1)
            s = c;
        else if (log)
            fprintf(log, "resume: not loading %s: %s; trying an older checkpoint\n", folders[i],
                    kiln_error_message());
    }
    if (s == KILN_OK && chosen < 0)
        s = kiln_error_setf(KILN_ERR_NOT_FOUND, "%s holds no good checkpoint to resume from%s", dir,
                            count ? " (each is damaged: see above)" : "");
    if (s == KILN_OK)
        s = restore_weights(t, folders[chosen]);
    if (s == KILN_OK)
        s = restore_optimizer(t, folders[chosen]);
    if (s == KILN_OK)
        s = restore_state(t, folders[chosen], j);
    if (s == KILN_OK && log)
        fprintf(log, "resumed from %s: step %lld of %lld\n", folders[chosen],
                (long long)t->steps_done, (long long)t->cfg.steps);
    cJSON_Delete(j);
    for (int i = 0; i < count; i++)
        free(folders[i]);
    free(folders);
    return s;
}
