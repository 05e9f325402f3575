/* Resuming from a checkpoint: the newest good one is found and checked whole (every file's
 * checksum, and that it is this run's model, optimizer, data, global batch and settings) before
 * anything of the trainer is touched; then everything a step depends on is restored, so that the
 * resumed run is bit for bit the run that was interrupted. On another number of ranks, ZeRO stage
 * or split of the global batch (trainer_elastic.h), each rank reads its new range of the state
 * from the old ranks' files that hold it, and its loaders go where the new split is at that step:
 * the run is then an uninterrupted run of the new split. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "kiln/checkpoint.h"
#include "kiln/core.h"
#include "train/trainer_ckpt.h"
#include "train/trainer_data.h"
#include "train/trainer_elastic.h"
#include "train/trainer_internal.h"

static int is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int64_t num(const cJSON *o, const char *k, int *ok) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(v) || !(fabs(v->valuedouble) < 0x1p62)) { /* int64_t holds it */
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

/* What state.json says of the run that wrote it: its world, ZeRO stage and split of the global
 * batch, its steps and its schedule's total. */
typedef struct ckpt_run {
    int world, zero;
    int64_t B, accum, micro_total, global, steps, lr_total;
    int lr_fixed, uneven; /* uneven: --rank-batches (a loader per micro-batch) */
} ckpt_run;

static kiln_status read_run(const char *folder, const cJSON *j, ckpt_run *o) {
    int ok = 1;
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "run");
    memset(o, 0, sizeof *o);
    o->world = (int)num(j, "world", &ok);
    o->zero = (int)num(j, "zero", &ok);
    if (!cJSON_IsObject(r)) /* not damaged: of an older format, as its older folders are */
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "%s/state.json does not record its run's split of the batch (an "
                               "older kiln wrote it): resume it with that kiln",
                               folder);
    o->B = num(r, "batch", &ok);
    o->accum = num(r, "grad_accum", &ok);
    o->micro_total = num(r, "micro_batches", &ok);
    o->global = num(r, "global_batch", &ok);
    o->steps = num(r, "steps", &ok);
    o->lr_total = num(r, "lr_total_steps", &ok);
    o->lr_fixed = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "lr_total_fixed"));
    o->uneven = cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(r, "rank_batches"));
    if (!ok || o->world < 1 || o->world > (1 << 20) || o->zero < 0 || o->zero > 3 || o->B < 1 ||
        o->B > (1 << 30) || o->accum < 1 || o->accum > (1 << 20) || o->micro_total < 1 ||
        o->micro_total > (1 << 30) || o->global != o->B * o->micro_total)
        return kiln_error_setf(KILN_ERR_FORMAT, "%s/state.json: its run's split is malformed",
                               folder);
    return KILN_OK;
}

/* "0.001", "adamw", "1337": an item's value for a message; v: the checkpoint's JSON value, or
 * NULL for this run's. */
static void item_text(char *out, size_t size, const kiln__config_item *it, const cJSON *v) {
    if (it->kind == KILN__ITEM_REAL) {
        snprintf(out, size, "%.7g", (double)(float)(v ? v->valuedouble : it->f));
    } else if (it->kind == KILN__ITEM_HEX) {
        unsigned long long u = v ? strtoull(v->valuestring, NULL, 16) : it->u;
        snprintf(out, size, "%llu", u);
    } else {
        int64_t i = v ? (int64_t)v->valuedouble : it->i;
        const char *name = it->label ? it->label((int)i) : NULL;
        if (name)
            snprintf(out, size, "%s", name);
        else
            snprintf(out, size, "%lld", (long long)i);
    }
}

/* Every setting of the training, by name: KILN_ERR_CONFIG naming the first that differs. */
static kiln_status check_items(kiln_trainer *t, const char *folder, const cJSON *j) {
    kiln__config_item items[KILN__CONFIG_ITEMS_MAX];
    int n = kiln__trainer_config_items(t, kiln_gpt_get_config(t->model), items);
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "config");
    for (int i = 0; i < n; i++) {
        const kiln__config_item *it = &items[i];
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(c, it->name);
        int same;
        if (it->kind == KILN__ITEM_HEX) {
            if (!cJSON_IsString(v))
                goto missing;
            same = strtoull(v->valuestring, NULL, 16) == it->u;
        } else {
            if (!cJSON_IsNumber(v))
                goto missing;
            /* the real settings are floats; cJSON prints a number to 15 digits (a float
             * needs 9) */
            same = it->kind == KILN__ITEM_REAL ? (float)v->valuedouble == (float)it->f
                                               : v->valuedouble == (double)it->i;
        }
        if (!same) {
            char was[64], now[64];
            item_text(was, sizeof was, it, v);
            item_text(now, sizeof now, it, NULL);
            return kiln_error_setf(KILN_ERR_CONFIG,
                                   "%s is a checkpoint of another configuration: %s is %s there "
                                   "and %s in this run: resume with the flags of the run that "
                                   "wrote it (the number of ranks, their split of the batch, the "
                                   "ZeRO stage, the data-parallel flags and --steps may change)",
                                   folder, it->name, was, now);
        }
        continue;
    missing:
        return kiln_error_setf(KILN_ERR_FORMAT, "%s/state.json lacks the setting %s", folder,
                               it->name);
    }
    return KILN_OK;
}

/* The checkpoint is this run's: the same model, optimizer, data, global batch and configuration
 * (its split over ranks, the ZeRO stage and the steps may differ). KILN_ERR_CONFIG naming the
 * first that differs. */
static kiln_status check_identity(kiln_trainer *t, const char *folder, const cJSON *j) {
    const kiln_gpt_config *mc = kiln_gpt_get_config(t->model);
    int ok = 1;
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "model");
    int64_t L = num(m, "n_layer", &ok), H = num(m, "n_head", &ok), C = num(m, "n_embd", &ok);
    int64_t ctx = num(m, "max_seq_len", &ok), V = num(m, "vocab_size", &ok);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(m, "dtype");
    const cJSON *op = cJSON_GetObjectItemCaseSensitive(j, "optimizer");
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
    /* the family (checkpoints that lack it are GPT-2's); the rest of the description is in
     * config_hash */
    const cJSON *fam = cJSON_GetObjectItemCaseSensitive(m, "family");
    const char *family = cJSON_IsString(fam) ? fam->valuestring : "gpt2";
    if (strcmp(family, kiln_family_name(mc->family)))
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "%s is a checkpoint of a %s model; this run's is %s: not resumed",
                               folder, family, kiln_family_name(mc->family));
    /* the heads' and the MLP's widths (checkpoints that lack them had the defaults) */
    const cJSON *hsv = cJSON_GetObjectItemCaseSensitive(m, "head_size");
    const cJSON *mhv = cJSON_GetObjectItemCaseSensitive(m, "mlp_hidden");
    int64_t hs = cJSON_IsNumber(hsv) ? (int64_t)hsv->valuedouble : C / (H > 0 ? H : 1);
    int64_t mh = cJSON_IsNumber(mhv) ? (int64_t)mhv->valuedouble : 4 * C;
    if (hs != kiln_gpt_config_head_size(mc) || mh != kiln_gpt_config_mlp_width(mc))
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "%s is a checkpoint of another model (heads of %lld channels, an "
                               "MLP of %lld; this run's has %lld and %lld): not resumed",
                               folder, (long long)hs, (long long)mh,
                               (long long)kiln_gpt_config_head_size(mc),
                               (long long)kiln_gpt_config_mlp_width(mc));
    /* low-rank factors (checkpoints without "rank": dense matrices) */
    const cJSON *rk = cJSON_GetObjectItemCaseSensitive(m, "rank");
    for (int k = 0; k < 4; k++) {
        const cJSON *v = cJSON_IsArray(rk) ? cJSON_GetArrayItem(rk, k) : NULL;
        int64_t r = cJSON_IsNumber(v) ? (int64_t)v->valuedouble : 0;
        if ((rk && (!cJSON_IsArray(rk) || cJSON_GetArraySize(rk) != 4 || !cJSON_IsNumber(v))))
            return kiln_error_setf(KILN_ERR_FORMAT, "%s/state.json: \"rank\" is not 4 numbers",
                                   folder);
        if (r != mc->rank[k])
            return kiln_error_setf(KILN_ERR_CONFIG,
                                   "%s is a checkpoint of another model (its low-rank factors "
                                   "are of ranks %s; this run's are not the same): not resumed",
                                   folder, rk ? "given in its state.json" : "none, dense");
    }
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
                               folder, t->cfg.data.train_path);
    KILN_CHECK(kiln__ckpt_check_data(t, folder, j));
    ckpt_run o;
    KILN_CHECK(read_run(folder, j, &o));
    if (o.global != kiln__trainer_global_batch(t)) {
        char advice[768];
        kiln__batch_advice(advice, sizeof advice, o.global, o.world, o.B, o.micro_total, t->world,
                           t->cfg.data.B, t->cfg.data.grad_accum,
                           t->cfg.dist.rank_batches ? t->micro_total : 0);
        return kiln_error_setf(KILN_ERR_CONFIG, "%s is a checkpoint of another global batch: %s",
                               folder, advice);
    }
    if (t->cfg.dist.local_steps > 0 && o.world != t->world)
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "%s was written by %d rank(s) training alone between averages "
                               "(--local-steps); local SGD resumes on the same number of ranks "
                               "only, not %d",
                               folder, o.world, t->world);
    KILN_CHECK(check_items(t, folder, j));
    if (ch != kiln__trainer_config_hash(t, mc))
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "%s is a checkpoint of another configuration (its hash differs "
                               "from this run's): resume with the flags of the run that wrote it",
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
    FILE *out = t->rank == 0 ? t->cfg.metrics.log : stderr;
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
    /* the run's configuration (no replica): a damaged one would start another run again */
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "config_file");
    return c ? check_entry(folder, c) : KILN_OK;
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
    if ((s = kiln__ckpt_check_seal(path, text, len)) != KILN_OK) {
        free(text);
        return s;
    }
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    if (!j)
        return kiln_error_setf(KILN_ERR_FORMAT, "%s is not valid JSON", path);
    KILN_CHECK_GOTO(s, check_identity(t, folder, j), fail);
    int ok = 1; /* the world was checked with the rest */
    KILN_CHECK_GOTO(s, check_files(t, folder, j, (int)num(j, "world", &ok)), fail);
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
static kiln_status open_rank_file(const char *folder, int r, int world, int64_t n,
                                  kiln__ckpt_header *h, int *fd) {
    char path[KILN__CKPT_PATH], name[64];
    uint64_t size = 0;
    size_t sizes[6];
    snprintf(name, sizeof name, "optim_rank%d.bin", r);
    KILN_CHECK(kiln__ckpt_path(path, folder, name));
    KILN_CHECK(kiln_file_open_regular(path, fd, &size));
    if (size < sizeof *h || pread(*fd, h, sizeof *h, 0) != (ssize_t)sizeof *h)
        goto bad;
    if (memcmp(h->magic, KILN__CKPT_MAGIC, 8) || h->version != KILN__CKPT_VERSION ||
        h->header_bytes != KILN__CKPT_HEADER || (int)h->rank != r || (int)h->world != world ||
        h->n != n || h->lo < 0 || h->lo > h->hi || h->hi > n || h->work_dtype > 64 ||
        h->payload_bytes != size - sizeof *h || slab_sizes(h, sizes) != h->payload_bytes)
        goto bad;
    return KILN_OK;
bad:
    close(*fd);
    *fd = -1;
    return kiln_error_setf(KILN_ERR_FORMAT,
                           "%s is not a kiln optimizer file of rank %d of %d of this model, or is "
                           "damaged",
                           path, r, world);
}

/* The rank files of the checkpoint's run, open: their headers and ranges. */
typedef struct rank_files {
    int world;
    int *fd;
    kiln__ckpt_header *h;
    int64_t *lo, *hi;
} rank_files;

static void rank_files_close(rank_files *f) {
    for (int r = 0; f->fd && r < f->world; r++)
        if (f->fd[r] >= 0)
            close(f->fd[r]);
    free(f->fd);
    free(f->h);
    free(f->lo);
    free(f->hi);
    memset(f, 0, sizeof *f);
}

static kiln_status rank_files_open(rank_files *f, const char *folder, int world, int64_t n) {
    memset(f, 0, sizeof *f);
    f->fd = malloc((size_t)world * sizeof *f->fd);
    f->h = calloc((size_t)world, sizeof *f->h);
    f->lo = calloc((size_t)world, sizeof *f->lo);
    f->hi = calloc((size_t)world, sizeof *f->hi);
    if (!f->fd || !f->h || !f->lo || !f->hi) {
        free(f->fd);
        f->fd = NULL;
        rank_files_close(f);
        return kiln_error_setf(KILN_ERR_NOMEM, "out of memory opening the checkpoint's files");
    }
    for (int r = 0; r < world; r++)
        f->fd[r] = -1;
    f->world = world;
    for (int r = 0; r < world; r++) {
        kiln_status s = open_rank_file(folder, r, world, n, &f->h[r], &f->fd[r]);
        if (s != KILN_OK) {
            rank_files_close(f);
            return s;
        }
        f->lo[r] = f->h[r].lo;
        f->hi[r] = f->h[r].hi;
        if (f->h[r].optim_steps != f->h[0].optim_steps) {
            rank_files_close(f);
            return kiln_error_setf(KILN_ERR_FORMAT,
                                   "%s: the optimizer files of ranks 0 and %d are of different "
                                   "steps",
                                   folder, r);
        }
    }
    return KILN_OK;
}

static kiln_status pread_all(int fd, unsigned rank, void *dst, size_t bytes, size_t off) {
    for (size_t done = 0; done < bytes;) {
        ssize_t k = pread(fd, (char *)dst + done, bytes - done, (off_t)(off + done));
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return kiln_error_setf(KILN_ERR_IO, "cannot read the checkpoint of rank %u: %s", rank,
                                   k < 0 ? strerror(errno) : "it ends early");
        done += (size_t)k;
    }
    return KILN_OK;
}

/* Elements [lo, hi) of the slab of flag `which` (elem bytes each; a slab of the file's range, or
 * of the whole slab for DiLoCo's state) into dst, or fail naming what is missing. */
static kiln_status take(int fd, const kiln__ckpt_header *h, uint32_t which, size_t elem, int64_t lo,
                        int64_t hi, void *dst, const char *what) {
    size_t sizes[6], off = sizeof *h;
    slab_sizes(h, sizes);
    int whole = which == KILN__CKPT_OUTER_W || which == KILN__CKPT_OUTER_V;
    int64_t base = whole ? 0 : h->lo, len = whole ? h->n : h->hi - h->lo;
    for (int i = 0; i < 6; i++) {
        if ((1u << i) != which) {
            off += sizes[i];
            continue;
        }
        if (sizes[i] != (size_t)len * elem || lo < base || hi > base + len)
            break;
        return pread_all(fd, h->rank, dst, (size_t)(hi - lo) * elem,
                         off + (size_t)(lo - base) * elem);
    }
    return kiln_error_setf(KILN_ERR_FORMAT, "the checkpoint of rank %u lacks %s", h->rank, what);
}

/* Elements [lo, hi) of a slab into dst (nothing when dst is NULL), each from the first old rank
 * file that holds it: the old ranks' ranges re-cut to this rank's. */
static kiln_status take_recut(const rank_files *f, uint32_t which, size_t elem, int64_t lo,
                              int64_t hi, void *dst, const char *what) {
    if (!dst || lo >= hi)
        return KILN_OK;
    kiln__recut_piece *p = malloc(((size_t)f->world + 1) * sizeof *p);
    if (!p)
        return kiln_error_setf(KILN_ERR_NOMEM, "out of memory re-cutting the checkpoint");
    int64_t gap = 0;
    int k = kiln__ckpt_recut(f->lo, f->hi, f->world, lo, hi, p, &gap);
    kiln_status s = KILN_OK;
    if (k < 0)
        s = kiln_error_setf(KILN_ERR_FORMAT,
                            "the checkpoint's rank files hold no %s for element %lld of the slab",
                            what, (long long)gap);
    for (int i = 0; i < k && s == KILN_OK; i++)
        s = take(f->fd[p[i].rank], &f->h[p[i].rank], which, elem, p[i].lo, p[i].hi,
                 (char *)dst + (size_t)(p[i].lo - lo) * elem, what);
    free(p);
    return s;
}

/* take_recut into the backend's memory: through a host buffer when the slabs are staged. */
static kiln_status take_into(kiln_trainer *t, const rank_files *f, uint32_t which, size_t elem,
                             int64_t lo, int64_t hi, void *dst, const char *what) {
    if (!t->staged || !dst || lo >= hi)
        return take_recut(f, which, elem, lo, hi, dst, what);
    size_t bytes = (size_t)(hi - lo) * elem;
    void *h = malloc(bytes ? bytes : 1);
    if (!h)
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate %.1f MiB to read the %s into",
                               (double)bytes / (1 << 20), what);
    kiln_status s = take_recut(f, which, elem, lo, hi, h, what);
    if (s == KILN_OK)
        s = kiln__trainer_to_device(t, dst, h, bytes);
    free(h);
    return s;
}

/* The weights: this rank's fp32 master weights and, when narrow, the working weights of the
 * whole slab (as they were: stochastic rounding is not recomputable) from the rank files,
 * each element from an old rank that held it; fp32 working weights from model.safetensors. */
static kiln_status restore_weights(kiln_trainer *t, const char *folder, const rank_files *f) {
    char path[4096];
    KILN_CHECK(kiln__ckpt_path(path, folder, "model.safetensors"));
    float *master = kiln_optim_master(t->opt);
    if (!master)
        return kiln__trainer_load_slab(t, path, kiln_gpt_params(t->model),
                                       kiln_gpt_dtype(t->model));
    kiln_dtype wd = kiln_gpt_dtype(t->model);
    for (int r = 0; r < f->world; r++)
        if (f->h[r].work_dtype != (uint32_t)wd)
            return kiln_error_setf(KILN_ERR_FORMAT, "%s: rank %d's working weights are not %s",
                                   folder, r, kiln_dtype_name(wd));
    KILN_CHECK(take_into(t, f, KILN__CKPT_MASTER, sizeof(float), t->shard_lo, t->shard_hi, master,
                         "master weights"));
    if (wd == KILN_DTYPE_F32) /* master weights kept for fp32 (quantization-aware training): the
                                 working weights are theirs, written again from them */
        return kiln_optim_write_working(t->opt, kiln_gpt_params(t->model));
    return take_into(t, f, KILN__CKPT_WORKING, kiln_dtype_size(wd), 0, kiln_gpt_slab_len(t->model),
                     kiln_gpt_params(t->model), "working weights");
}

/* This rank's moments from the old ranks' files, the step count, DiLoCo's state (the same
 * ranks: local SGD resumes on as many) from this rank's own. */
static kiln_status restore_optimizer(kiln_trainer *t, const rank_files *f) {
    int64_t n = kiln_gpt_slab_len(t->model);
    KILN_CHECK(take_into(t, f, KILN__CKPT_M, sizeof(float), t->shard_lo, t->shard_hi,
                         kiln_optim_state(t->opt, 0), "moment 0"));
    KILN_CHECK(take_into(t, f, KILN__CKPT_V, sizeof(float), t->shard_lo, t->shard_hi,
                         kiln_optim_state(t->opt, 1), "moment 1"));
    if (t->outer_weights) {
        if (t->rank >= f->world)
            return kiln_error_setf(KILN_ERR_FORMAT, "the checkpoint has no rank %d", t->rank);
        int fd = f->fd[t->rank];
        const kiln__ckpt_header *h = &f->h[t->rank];
        KILN_CHECK(take(fd, h, KILN__CKPT_OUTER_W, sizeof(float), 0, n, t->outer_weights,
                        "outer weights"));
        KILN_CHECK(take(fd, h, KILN__CKPT_OUTER_V, sizeof(float), 0, n, t->outer_velocity,
                        "outer momentum"));
    }
    return kiln_optim_set_steps(t->opt, f->h[0].optim_steps);
}

/* Whether the checkpoint's run split the batch as this one does (the same loaders, each at the
 * same place). */
static int same_split(const kiln_trainer *t, const ckpt_run *o, const cJSON *j) {
    if (o->world != t->world || o->B != t->cfg.data.B || o->accum != t->cfg.data.grad_accum ||
        o->uneven != !!t->cfg.dist.rank_batches)
        return 0;
    const cJSON *rb = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "run"),
                                                       "rank_batches");
    for (int r = 0; t->cfg.dist.rank_batches && r < t->world; r++) {
        const cJSON *v = cJSON_GetArrayItem(rb, r);
        if (!cJSON_IsNumber(v) || (int64_t)v->valuedouble != t->cfg.dist.rank_batches[r])
            return 0;
    }
    return 1;
}

static kiln_status read_loader(const char *folder, const cJSON *o, kiln_loader_state *ls) {
    int ok = 1;
    ls->epoch = (uint64_t)num(o, "epoch", &ok);
    ls->position = (uint64_t)num(o, "position", &ok);
    ls->seed = hex(o, "seed", &ok);
    if (!ok)
        return kiln_error_setf(KILN_ERR_FORMAT, "%s/state.json: a malformed loader state", folder);
    return KILN_OK;
}

/* This rank's loaders, where an uninterrupted run of this split would be after `step` steps.
 * The loaders' global order depends on the seed and on the windows a loader's batch covers
 * (every rank's B together), never on the ranks: each old loader's place is checked to be that
 * of the step (k batches from the start), and this run's loaders are put k' batches in. */
static kiln_status map_loaders(kiln_trainer *t, const char *folder, const cJSON *j,
                               const ckpt_run *o, int64_t step) {
    int64_t W = kiln_loader_num_windows(t->train);
    int64_t old_unit = o->B * (o->uneven ? o->micro_total : o->world); /* windows a batch */
    int64_t old_per = old_unit > 0 ? W / old_unit : 0, old_k = step * (o->uneven ? 1 : o->accum);
    const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(j, "ranks"), *rk, *ld;
    kiln_loader_state first = {0};
    int seen = 0;
    cJSON_ArrayForEach(rk, ranks) {
        cJSON_ArrayForEach(ld, cJSON_GetObjectItemCaseSensitive(rk, "loaders")) {
            kiln_loader_state ls;
            KILN_CHECK(read_loader(folder, ld, &ls));
            if (old_per < 1 || (int64_t)(ls.epoch * (uint64_t)old_per + ls.position) != old_k ||
                (seen && ls.seed != first.seed))
                return kiln_error_setf(
                    KILN_ERR_FORMAT,
                    "%s/state.json: a loader's place (epoch %llu, batch %llu) is "
                    "not that of step %lld: its data position cannot be moved "
                    "to another split",
                    folder, (unsigned long long)ls.epoch, (unsigned long long)ls.position,
                    (long long)step);
            if (!seen)
                first = ls;
            seen = 1;
        }
    }
    if (!seen)
        return kiln_error_setf(KILN_ERR_FORMAT, "%s/state.json has no loader states", folder);
    int64_t per = kiln_loader_batches_per_epoch(t->train);
    kiln_loader_state ls = {.seed = first.seed};
    kiln__loader_position_after(step * (t->micro_loaders ? 1 : t->micro), per, &ls.epoch,
                                &ls.position);
    for (int64_t k = 0; k < (t->micro_loaders ? t->micro : 1); k++)
        KILN_CHECK(kiln_loader_set_state(t->micro_loaders ? t->micro_loaders[k] : t->train, &ls));
    return KILN_OK;
}

/* The loaders of the same split, from this rank's own states. */
static kiln_status same_loaders(kiln_trainer *t, const char *folder, const cJSON *j) {
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
        kiln_loader_state ls;
        KILN_CHECK(read_loader(folder, cJSON_GetArrayItem(loaders, k), &ls));
        KILN_CHECK(kiln_loader_set_state(t->micro_loaders ? t->micro_loaders[k] : t->train, &ls));
    }
    return KILN_OK;
}

/* The schedule's total when the steps changed: a total fixed by the checkpoint's run and not by
 * this one is kept; otherwise the schedule follows this run's total from the resumed step, and
 * the console says so when it is not the checkpoint's. */
static kiln_status follow_schedule(kiln_trainer *t, const ckpt_run *o, int64_t step) {
    FILE *log = t->cfg.metrics.log;
    if (o->lr_fixed && t->cfg.lr.total_steps <= 0) {
        t->cfg.lr.total_steps = o->lr_total;
        t->sched.total_steps = o->lr_total;
        KILN_CHECK(kiln_lr_schedule_check(&t->sched));
        if (log)
            fprintf(log,
                    "resume: the learning-rate schedule keeps its total of %lld steps, fixed by "
                    "the run that wrote the checkpoint (--lr-total-steps)\n",
                    (long long)o->lr_total);
        return KILN_OK;
    }
    if (o->lr_total == t->sched.total_steps || !log)
        return KILN_OK;
    kiln_lr_schedule was = t->sched;
    was.total_steps = o->lr_total;
    fprintf(log,
            "resume: note: the learning-rate schedule ran over %lld steps and now follows this "
            "run's total of %lld from step %lld (its learning rate %.4g, against %.4g under the "
            "old total); --lr-total-steps %lld keeps the old schedule\n",
            (long long)o->lr_total, (long long)t->sched.total_steps, (long long)step + 1,
            (double)kiln_lr_at(&t->sched, step), (double)kiln_lr_at(&was, step),
            (long long)o->lr_total);
    return KILN_OK;
}

/* Loader states, loss scaler, step counter from state.json. */
static kiln_status restore_state(kiln_trainer *t, const char *folder, const cJSON *j) {
    int ok = 1;
    ckpt_run o;
    KILN_CHECK(read_run(folder, j, &o));
    const cJSON *sc = cJSON_GetObjectItemCaseSensitive(j, "loss_scaler");
    const cJSON *scale = cJSON_GetObjectItemCaseSensitive(sc, "scale");
    int64_t clean = num(sc, "clean_steps", &ok), skipped = num(sc, "skipped", &ok);
    int64_t step = num(j, "step", &ok);
    const cJSON *fl = cJSON_GetObjectItemCaseSensitive(j, "first_loss");
    if (!ok || !cJSON_IsNumber(scale) || step < 1 || step > ((int64_t)1 << 40))
        return kiln_error_setf(KILN_ERR_FORMAT, "%s/state.json lacks a field or its step", folder);
    if (same_split(t, &o, j))
        KILN_CHECK(same_loaders(t, folder, j));
    else
        KILN_CHECK(map_loaders(t, folder, j, &o, step));
    t->scaler.scale = (float)scale->valuedouble;
    t->scaler.clean_steps = clean;
    t->scaler.skipped = skipped;
    t->steps_done = step;
    t->ckpt_step = step;
    t->resumed_step = step;
    t->first_loss = cJSON_IsNumber(fl) ? (float)fl->valuedouble : 0.0f;
    return KILN_OK;
}

/* What resuming changed, for the console: the optimizer's ranges and the data's split. */
static void say_recut(kiln_trainer *t, const cJSON *j) {
    ckpt_run o;
    FILE *log = t->cfg.metrics.log;
    if (!log || read_run("", j, &o) != KILN_OK)
        return;
    int zero = t->world > 1 ? t->cfg.dist.dp.zero : 0;
    int recut = o.world != t->world || o.zero != zero, mapped = !same_split(t, &o, j);
    if (!recut && !mapped)
        return;
    fprintf(log,
            "resumed a checkpoint of %d %s (ZeRO %d, B=%lld) on %d %s (ZeRO %d, B=%lld): %s%s%s\n",
            o.world, o.world == 1 ? "rank" : "ranks", o.zero, (long long)o.B, t->world,
            t->world == 1 ? "rank" : "ranks", zero, (long long)t->cfg.data.B,
            recut ? "optimizer state re-cut" : "", recut && mapped ? "; " : "",
            mapped ? "data position mapped onto the new split" : "");
}

/* The folders to try, best first: what `latest` names, then every step folder, newest first.
 * A path that is itself a step folder is the only one. */
static kiln_status candidates(kiln_trainer *t, const char *dir, char ***out, int *count) {
    FILE *log = t->cfg.metrics.log;
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
    const char *dir = t->cfg.checkpoint.resume_path;
    FILE *log = t->cfg.metrics.log;
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
    rank_files f = {0};
    int ok = 1; /* state.json's world was checked with the rest (read_run) */
    if (s == KILN_OK)
        s = rank_files_open(&f, folders[chosen], (int)num(j, "world", &ok),
                            kiln_gpt_slab_len(t->model));
    if (s == KILN_OK)
        s = restore_weights(t, folders[chosen], &f);
    if (s == KILN_OK)
        s = restore_optimizer(t, &f);
    rank_files_close(&f);
    if (s == KILN_OK)
        s = restore_state(t, folders[chosen], j);
    if (s == KILN_OK && log) {
        fprintf(log, "resumed from %s: step %lld of %lld\n", folders[chosen],
                (long long)t->steps_done, (long long)t->cfg.steps);
        say_recut(t, j);
    }
    ckpt_run o;
    if (s == KILN_OK && t->steps_done < t->cfg.steps && read_run(folders[chosen], j, &o) == KILN_OK)
        s = follow_schedule(t, &o, t->steps_done);
    if (s == KILN_OK && log && t->steps_done >= t->cfg.steps)
        fprintf(log,
                "resume: the checkpoint is of step %lld and this run has %lld steps: nothing left "
                "to do (nothing is written; a larger --steps trains on%s)\n",
                (long long)t->steps_done, (long long)t->cfg.steps,
                t->steps_done > t->cfg.steps
                    ? "; to go on from an earlier checkpoint, name its step folder"
                    : "");
    cJSON_Delete(j);
    for (int i = 0; i < count; i++)
        free(folders[i]);
    free(folders);
    return s;
}
