/* The training data loader: windows of T+1 tokens over token shards, read with pread.
 *
 * Shard s of n_s tokens holds floor((n_s - 1) / T) windows; window k starts at token k*T
 * (stride T: a window's last token is the next window's first, as a target then an
 * input). Windows never cross shards. The windows of all shards are numbered in shard
 * order (shards sorted by path, numbers in names compared as numbers) and an epoch visits them in
 * the order perm_e, a Fisher-Yates shuffle of [0, W) drawn from a generator seeded by hash(seed,
 * e). The order is a table of W 32-bit indices (counted by kiln_alloc), built at the first batch of
 * each epoch: about 25 ms per million windows (bench/bench_loader.c), once per epoch. Batch j of
 * rank r takes the B windows perm_e[(j*world + r)*B ..][0..B): the ranks together take the same
 * windows, in the same order, as a single process with batch world*B. An epoch has
 * floor(W / (world*B)) batches; the few windows left over are not visited that epoch
 * (they are in the next, being reshuffled). */
#include "kiln/loader.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <xxhash.h>

#include <cjson/cJSON.h>

#include "core/error.h"
#include "kiln/core.h"
#include "kiln/shard.h"

struct kiln_loader {
    kiln_loader_config cfg; /* cfg.path is not kept */
    kiln_shard **shards;
    int num_shards;
    int64_t *first_window; /* [num_shards + 1]: global index of each shard's first window */
    int64_t num_windows, num_tokens, vocab;
    uint64_t tokenizer_id; /* of the first shard that records one; 0: none does */
    int64_t batches_per_epoch;
    kiln_loader_state state;
    uint32_t *perm;      /* [num_windows] the order of epoch perm_epoch (shuffle only) */
    uint64_t perm_epoch; /* the epoch and seed perm was drawn for; valid when perm_valid */
    uint64_t perm_seed;
    int perm_valid;
    int32_t *window;       /* [T+1] the window being read */
    uint64_t content_hash; /* of every shard's token count and checksum, in order */
};

/* ---- finding the shards ---- */

typedef struct path_list {
    char **items;
    int n, cap;
} path_list;

static void path_list_free(path_list *p) {
    for (int i = 0; i < p->n; i++)
        free(p->items[i]);
    free(p->items);
    p->items = NULL;
    p->n = p->cap = 0;
}

static kiln_status path_list_add(path_list *p, const char *a, const char *b) {
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 16;
        char **items = realloc(p->items, (size_t)cap * sizeof *items);
        if (!items)
            return kiln_error_setf(KILN_ERR_NOMEM, "no memory for the list of shards");
        p->items = items;
        p->cap = cap;
    }
    size_t n = strlen(a) + (b ? strlen(b) + 2 : 1);
    char *s = malloc(n);
    if (!s)
        return kiln_error_setf(KILN_ERR_NOMEM, "no memory for the list of shards");
    snprintf(s, n, b ? "%s/%s" : "%s", a, b);
    p->items[p->n++] = s;
    return KILN_OK;
}

/* Names in order with runs of digits compared as numbers: train_999.bin before
 * train_1000.bin (prepare's names grow a digit past 1000 shards), train_2 before train_10. */
static int cmp_natural(const char *a, const char *b) {
    while (*a && *b) {
        if (isdigit((unsigned char)*a) && isdigit((unsigned char)*b)) {
            const char *a0 = a, *b0 = b;
            while (*a == '0')
                a++;
            while (*b == '0')
                b++;
            const char *ae = a, *be = b;
            while (isdigit((unsigned char)*ae))
                ae++;
            while (isdigit((unsigned char)*be))
                be++;
            if (ae - a != be - b)
                return ae - a < be - b ? -1 : 1;
            int c = memcmp(a, b, (size_t)(ae - a));
            if (c)
                return c;
            if (ae - a0 != be - b0) /* the same number: fewer leading zeros first */
                return ae - a0 < be - b0 ? -1 : 1;
            a = ae;
            b = be;
            continue;
        }
        if (*a != *b)
            return (unsigned char)*a < (unsigned char)*b ? -1 : 1;
        a++;
        b++;
    }
    return *a ? 1 : *b ? -1 : 0;
}

static int cmp_path(const void *a, const void *b) {
    return cmp_natural(*(char *const *)a, *(char *const *)b);
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* What a file that is not a regular file or folder is, for messages. */
static const char *kind_of(mode_t m) {
    return S_ISFIFO(m)                ? "a FIFO (named pipe)"
           : S_ISCHR(m) || S_ISBLK(m) ? "a device"
           : S_ISSOCK(m)              ? "a socket"
                                      : "not a regular file";
}

/* The folder part of path ("." when it has none). */
static void dir_of(const char *path, char *dir, size_t cap) {
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, cap, ".");
    else if (slash == path)
        snprintf(dir, cap, "/");
    else
        snprintf(dir, cap, "%.*s", (int)(slash - path), path);
}

static const char *base_of(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

static kiln_status list_folder(const char *path, path_list *out) {
    DIR *d = opendir(path);
    if (!d)
        return kiln_error_setf(KILN_ERR_IO, "%s: cannot list the folder: %s", path,
                               strerror(errno));
    struct dirent *e;
    kiln_status st = KILN_OK;
    while (st == KILN_OK && (e = readdir(d)) != NULL)
        if (e->d_name[0] != '.' && ends_with(e->d_name, ".bin"))
            st = path_list_add(out, path, e->d_name);
    closedir(d);
    KILN_CHECK(st);
    if (out->n == 0)
        return kiln_error_setf(KILN_ERR_NOT_FOUND, "%s: the folder holds no *.bin shards", path);
    return KILN_OK;
}

/* The first folder glob could not read, and why. */
static _Thread_local char glob_failed_dir[4096];
static _Thread_local int glob_failed_errno;

static int on_glob_error(const char *epath, int eerrno) {
    if (!glob_failed_dir[0]) {
        snprintf(glob_failed_dir, sizeof glob_failed_dir, "%s", epath);
        glob_failed_errno = eerrno;
    }
    return 1; /* stop: a folder that cannot be read would silently drop its shards */
}

static kiln_status expand_pattern(const char *path, path_list *out) {
    glob_t g;
    glob_failed_dir[0] = '\0';
    glob_failed_errno = 0;
    int rc = glob(path, GLOB_ERR, on_glob_error, &g);
    if (rc == GLOB_NOMATCH)
        return kiln_error_setf(KILN_ERR_NOT_FOUND, "%s: no shards match the pattern", path);
    if (rc == GLOB_ABORTED && glob_failed_errno == ENOENT)
        return kiln_error_setf(KILN_ERR_NOT_FOUND, "%s: the folder %s does not exist", path,
                               glob_failed_dir);
    if (rc == GLOB_ABORTED)
        return kiln_error_setf(KILN_ERR_IO, "%s: cannot read the folder %s: %s", path,
                               glob_failed_dir[0] ? glob_failed_dir : "(unknown)",
                               strerror(glob_failed_errno));
    if (rc != 0)
        return kiln_error_setf(rc == GLOB_NOSPACE ? KILN_ERR_NOMEM : KILN_ERR_IO,
                               "%s: cannot expand the pattern (%s)", path,
                               rc == GLOB_NOSPACE ? "out of memory" : "glob failed");
    kiln_status st = KILN_OK;
    for (size_t i = 0; st == KILN_OK && i < g.gl_pathc; i++)
        st = path_list_add(out, g.gl_pathv[i], NULL);
    globfree(&g);
    return st;
}

/* path is a file, a folder (every "*.bin" in it) or a glob pattern; in name order with
 * numbers compared as numbers. Only regular files are shards: anything else is named. */
static kiln_status find_shards(const char *path, path_list *out) {
    struct stat sb;
    kiln_status st;
    if (stat(path, &sb) == 0) {
        if (S_ISREG(sb.st_mode))
            return path_list_add(out, path, NULL);
        if (!S_ISDIR(sb.st_mode))
            return kiln_error_setf(KILN_ERR_IO,
                                   "%s is %s, not a token shard: give a shard file, a folder of "
                                   "them or a pattern",
                                   path, kind_of(sb.st_mode));
        st = list_folder(path, out);
    } else if (errno != ENOENT && errno != ENOTDIR) {
        return kiln_error_setf(KILN_ERR_IO, "%s: %s", path, strerror(errno));
    } else if (!strpbrk(path, "*?[")) {
        char dir[4096];
        dir_of(path, dir, sizeof dir);
        if (stat(dir, &sb) != 0)
            return kiln_error_setf(KILN_ERR_NOT_FOUND,
                                   "%s: no such shard: the folder %s does not exist", path, dir);
        if (!S_ISDIR(sb.st_mode))
            return kiln_error_setf(KILN_ERR_NOT_FOUND, "%s: no such shard: %s is not a folder",
                                   path, dir);
        return kiln_error_setf(KILN_ERR_NOT_FOUND, "%s: no such shard, folder or pattern", path);
    } else {
        st = expand_pattern(path, out);
    }
    KILN_CHECK(st);
    qsort(out->items, (size_t)out->n, sizeof *out->items, cmp_path);
    return KILN_OK;
}

/* ---- the folder a shard is in ----
 * kiln prepare writes "prepare.incomplete" in its output folder before it replaces the shards
 * and removes it after the new prepare.json is written: a folder holding it is a commit cut
 * short, with old and new shards mixed. prepare.json lists every shard of the run with its
 * token count and checksum; a shard it does not list (or lists with another checksum) is not
 * of that run. A folder with neither file (shards written some other way) is not checked. */

enum { MANIFEST_MAX_BYTES = 64 << 20 };

static kiln_status load_folder(const char *dir, cJSON **manifest) {
    *manifest = NULL;
    char p[4200];
    struct stat sb;
    snprintf(p, sizeof p, "%s/prepare.incomplete", dir);
    if (lstat(p, &sb) == 0)
        return kiln_error_setf(KILN_ERR_FORMAT,
                               "%s: a kiln prepare into this folder was cut short (%s is there), "
                               "so it may hold old and new shards mixed: run kiln prepare into "
                               "it again",
                               dir, p);
    snprintf(p, sizeof p, "%s/prepare.json", dir);
    if (stat(p, &sb) != 0) {
        if (errno == ENOENT)
            return KILN_OK;
        return kiln_error_setf(KILN_ERR_IO, "%s: %s", p, strerror(errno));
    }
    char *text = NULL;
    size_t len = 0;
    KILN_CHECK(kiln_file_read(p, MANIFEST_MAX_BYTES, &text, &len));
    *manifest = cJSON_ParseWithLength(text, len);
    free(text);
    if (!*manifest || !cJSON_IsObject(*manifest)) {
        cJSON_Delete(*manifest);
        *manifest = NULL;
        return kiln_error_setf(KILN_ERR_FORMAT,
                               "%s is not a JSON object, so kiln cannot tell which shards in the "
                               "folder belong together: run kiln prepare into it again",
                               p);
    }
    return KILN_OK;
}

/* The shard named `name` in the lists ("shards") of the manifest's splits, or NULL. */
static const cJSON *manifest_entry(const cJSON *root, const char *name) {
    const cJSON *split;
    cJSON_ArrayForEach(split, root) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(split, "shards");
        if (!cJSON_IsObject(split) || !cJSON_IsArray(list))
            continue;
        const cJSON *e;
        cJSON_ArrayForEach(e, list) {
            const cJSON *n = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "name") : e;
            if (cJSON_IsString(n) && !strcmp(n->valuestring, name))
                return e;
        }
    }
    return NULL;
}

static kiln_status check_entry(const cJSON *e, const kiln_shard *s, const char *manifest) {
    const kiln_shard_info *in = kiln_shard_get_info(s);
    if (!cJSON_IsObject(e)) /* an older prepare.json lists names only */
        return KILN_OK;
    const cJSON *tokens = cJSON_GetObjectItemCaseSensitive(e, "tokens");
    const cJSON *hash = cJSON_GetObjectItemCaseSensitive(e, "xxh3");
    char have[17];
    snprintf(have, sizeof have, "%016llx", (unsigned long long)in->data_hash);
    if (cJSON_IsNumber(tokens) && cJSON_IsString(hash) &&
        tokens->valuedouble == (double)in->num_tokens && !strcmp(hash->valuestring, have))
        return KILN_OK;
    char want_tokens[32] = "no";
    if (cJSON_IsNumber(tokens))
        snprintf(want_tokens, sizeof want_tokens, "%.0f", tokens->valuedouble);
    return kiln_error_setf(KILN_ERR_CHECKSUM,
                           "%s holds %lld tokens with checksum %s, but %s lists it with %s tokens "
                           "and checksum %s: it was replaced after kiln prepare wrote it (run "
                           "kiln prepare again)",
                           kiln_shard_path(s), (long long)in->num_tokens, have, manifest,
                           want_tokens, cJSON_IsString(hash) ? hash->valuestring : "none");
}

static kiln_status check_folders(const kiln_loader *l) {
    char cur[4096] = "", dir[4096], manifest_path[4200] = "";
    cJSON *manifest = NULL;
    kiln_status st = KILN_OK;
    for (int i = 0; i < l->num_shards && st == KILN_OK; i++) {
        const char *path = kiln_shard_path(l->shards[i]);
        dir_of(path, dir, sizeof dir);
        if (i == 0 || strcmp(dir, cur) != 0) {
            cJSON_Delete(manifest);
            snprintf(cur, sizeof cur, "%s", dir);
            snprintf(manifest_path, sizeof manifest_path, "%s/prepare.json", dir);
            if ((st = load_folder(dir, &manifest)) != KILN_OK)
                break;
        }
        if (!manifest)
            continue;
        const cJSON *e = manifest_entry(manifest, base_of(path));
        st = e ? check_entry(e, l->shards[i], manifest_path)
               : kiln_error_setf(KILN_ERR_FORMAT,
                                 "%s is not one of the shards that %s lists (left by another run, "
                                 "or copied in): remove it, or run kiln prepare again",
                                 path, manifest_path);
    }
    cJSON_Delete(manifest);
    return st;
}

/* ---- opening ---- */

static kiln_status check_config(const kiln_loader_config *c) {
    if (!c || !c->path)
        return kiln_error_setf(KILN_ERR_ARG, "loader: no shard path given");
    if (c->B < 1 || c->T < 1 || c->B > (1LL << 31) || c->T > (1LL << 31))
        return kiln_error_setf(KILN_ERR_ARG, "loader: B=%lld and T=%lld must both be 1..2^31",
                               (long long)c->B, (long long)c->T);
    if (c->world < 1 || c->rank < 0 || c->rank >= c->world)
        return kiln_error_setf(KILN_ERR_ARG, "loader: rank %d is not in [0, world=%d)", c->rank,
                               c->world);
    return KILN_OK;
}

/* Each open shard holds a descriptor (kiln/shard.h): the soft limit on open files raised
 * toward the hard one when the shards would not fit under it. */
static void reserve_files(int64_t n) {
    struct rlimit r;
    if (getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur == RLIM_INFINITY)
        return;
    rlim_t want = (rlim_t)n + 256; /* and room for everything else the process opens */
    if (r.rlim_max != RLIM_INFINITY && want > r.rlim_max)
        want = r.rlim_max;
    if (want > r.rlim_cur) {
        r.rlim_cur = want;
        (void)setrlimit(RLIMIT_NOFILE, &r);
    }
}

static kiln_status open_shards(kiln_loader *l, const path_list *paths) {
    reserve_files(paths->n);
    l->shards = calloc((size_t)paths->n, sizeof *l->shards);
    l->first_window = calloc((size_t)paths->n + 1, sizeof *l->first_window);
    if (!l->shards || !l->first_window)
        return kiln_error_setf(KILN_ERR_NOMEM, "loader: no memory for %d shards", paths->n);
    int tokenizer_from = 0; /* the shard l->tokenizer_id comes from */
    for (int i = 0; i < paths->n; i++) {
        KILN_CHECK(kiln_shard_open(&l->shards[i], paths->items[i]));
        l->num_shards = i + 1;
        const kiln_shard_info *in = kiln_shard_get_info(l->shards[i]);
        if (i == 0)
            l->vocab = in->vocab_size;
        else if (in->vocab_size != l->vocab)
            return kiln_error_setf(KILN_ERR_FORMAT,
                                   "%s has vocabulary size %lld but %s has %lld: shards written "
                                   "with different tokenizers cannot be mixed",
                                   paths->items[i], (long long)in->vocab_size, paths->items[0],
                                   (long long)l->vocab);
        if (in->tokenizer_id && !l->tokenizer_id)
            tokenizer_from = i;
        if (in->tokenizer_id && !l->tokenizer_id)
            l->tokenizer_id = in->tokenizer_id;
        else if (in->tokenizer_id && in->tokenizer_id != l->tokenizer_id)
            return kiln_error_setf(
                KILN_ERR_FORMAT,
                "%s was written with tokenizer %016llx but %s with tokenizer "
                "%016llx (the same vocabulary size, %lld, but other ids): shards "
                "written with different tokenizers cannot be mixed",
                paths->items[i], (unsigned long long)in->tokenizer_id, paths->items[tokenizer_from],
                (unsigned long long)l->tokenizer_id, (long long)l->vocab);
        if (in->num_tokens < l->cfg.T + 1)
            return kiln_error_setf(KILN_ERR_CONFIG,
                                   "%s holds %lld tokens, fewer than one window of T+1 = %lld "
                                   "(use a smaller T, or more text)",
                                   paths->items[i], (long long)in->num_tokens,
                                   (long long)(l->cfg.T + 1));
        l->num_tokens += in->num_tokens;
        l->first_window[i + 1] = l->first_window[i] + (in->num_tokens - 1) / l->cfg.T;
    }
    l->num_windows = l->first_window[paths->n];
    XXH3_state_t *h = XXH3_createState();
    if (!h)
        return kiln_error_setf(KILN_ERR_NOMEM, "loader: no memory");
    XXH3_64bits_reset(h);
    for (int i = 0; i < l->num_shards; i++) {
        const kiln_shard_info *in = kiln_shard_get_info(l->shards[i]);
        uint64_t rec[2] = {(uint64_t)in->num_tokens, in->data_hash};
        XXH3_64bits_update(h, rec, sizeof rec);
    }
    l->content_hash = XXH3_64bits_digest(h);
    XXH3_freeState(h);
    return check_folders(l);
}

kiln_status kiln_loader_open(kiln_loader **out, const kiln_loader_config *cfg) {
    *out = NULL;
    KILN_CHECK(check_config(cfg));
    kiln_loader *l = calloc(1, sizeof *l);
    if (!l)
        return kiln_error_setf(KILN_ERR_NOMEM, "loader: no memory");
    l->cfg = *cfg;
    l->cfg.path = NULL;
    l->state.seed = cfg->seed;
    path_list paths = {0};
    kiln_status st;
    KILN_CHECK_GOTO(st, find_shards(cfg->path, &paths), fail);
    KILN_CHECK_GOTO(st, open_shards(l, &paths), fail);
    if (!(l->window = malloc((size_t)(cfg->T + 1) * sizeof *l->window))) {
        st = kiln_error_setf(KILN_ERR_NOMEM, "loader: no memory for a window of %lld tokens",
                             (long long)(cfg->T + 1));
        goto fail;
    }
    int64_t per_batch = cfg->B * cfg->world;
    l->batches_per_epoch = l->num_windows / per_batch;
    if (l->batches_per_epoch < 1) {
        st = kiln_error_setf(KILN_ERR_CONFIG,
                             "%s: %lld windows of T+1 = %lld tokens, fewer than one batch of "
                             "B*world = %lld windows",
                             cfg->path, (long long)l->num_windows, (long long)(cfg->T + 1),
                             (long long)per_batch);
        goto fail;
    }
    if (cfg->shuffle && l->num_windows > (int64_t)UINT32_MAX) {
        st = kiln_error_setf(KILN_ERR_CONFIG, "%s: %lld windows, more than the shuffle's 2^32",
                             cfg->path, (long long)l->num_windows);
        goto fail;
    }
    if (cfg->shuffle)
        KILN_CHECK_GOTO(st,
                        kiln_alloc_checked((void **)&l->perm,
                                           (size_t)l->num_windows * sizeof *l->perm,
                                           "the loader's window order"),
                        fail);
    path_list_free(&paths);
    *out = l;
    return KILN_OK;
fail:
    path_list_free(&paths);
    kiln_loader_close(l);
    return st;
}

void kiln_loader_close(kiln_loader *l) {
    if (!l)
        return;
    for (int i = 0; i < l->num_shards; i++)
        kiln_shard_close(l->shards[i]);
    free(l->shards);
    free(l->first_window);
    kiln_free(l->perm);
    free(l->window);
    free(l);
}

/* ---- the order of an epoch ---- */

static void make_perm(kiln_loader *l) {
    uint64_t e = l->state.epoch;
    if (l->perm_valid && l->perm_epoch == e && l->perm_seed == l->state.seed)
        return;
    kiln_rng r;
    kiln_rng_seed(&r, XXH3_64bits_withSeed(&e, sizeof e, l->state.seed));
    uint32_t n = (uint32_t)l->num_windows;
    for (uint32_t i = 0; i < n; i++)
        l->perm[i] = i;
    for (uint32_t i = n - 1; i > 0; i--) {
        uint32_t j = (uint32_t)kiln_rng_below(&r, (uint64_t)i + 1);
        uint32_t t = l->perm[i];
        l->perm[i] = l->perm[j];
        l->perm[j] = t;
    }
    l->perm_epoch = e;
    l->perm_seed = l->state.seed;
    l->perm_valid = 1;
}

/* Read window w: inputs get tokens [0, T), targets [1, T+1). One pread of T+1 ids. */
static kiln_status copy_window(kiln_loader *l, int64_t w, int32_t *inputs, int32_t *targets) {
    int lo = 0, hi = l->num_shards - 1; /* the shard s with first_window[s] <= w */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (l->first_window[mid] <= w)
            lo = mid;
        else
            hi = mid - 1;
    }
    int64_t T = l->cfg.T, start = (w - l->first_window[lo]) * T;
    KILN_CHECK(kiln_shard_read(l->shards[lo], start, T + 1, l->window));
    memcpy(inputs, l->window, (size_t)T * sizeof *inputs);
    memcpy(targets, l->window + 1, (size_t)T * sizeof *targets);
    return KILN_OK;
}

kiln_status kiln_loader_next(kiln_loader *l, int32_t *inputs, int32_t *targets) {
    if (!l || !inputs || !targets)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_loader_next: NULL argument");
    if (l->state.position >= (uint64_t)l->batches_per_epoch) {
        l->state.epoch++;
        l->state.position = 0;
    }
    if (l->cfg.shuffle)
        make_perm(l);
    int64_t B = l->cfg.B, T = l->cfg.T;
    int64_t first = ((int64_t)l->state.position * l->cfg.world + l->cfg.rank) * B;
    for (int64_t b = 0; b < B; b++) {
        int64_t w = l->cfg.shuffle ? (int64_t)l->perm[first + b] : first + b;
        KILN_CHECK(copy_window(l, w, inputs + b * T, targets + b * T)); /* the position stays */
    }
    l->state.position++;
    return KILN_OK;
}

int64_t kiln_loader_vocab_size(const kiln_loader *l) {
    return l->vocab;
}
uint64_t kiln_loader_tokenizer_id(const kiln_loader *l) {
    return l->tokenizer_id;
}
int64_t kiln_loader_num_tokens(const kiln_loader *l) {
    return l->num_tokens;
}
int64_t kiln_loader_batches_per_epoch(const kiln_loader *l) {
    return l->batches_per_epoch;
}
kiln_loader_state kiln_loader_get_state(const kiln_loader *l) {
    return l->state;
}

kiln_status kiln_loader_set_state(kiln_loader *l, const kiln_loader_state *s) {
    if (!l || !s)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_loader_set_state: NULL argument");
    if (s->position > (uint64_t)l->batches_per_epoch)
        return kiln_error_setf(KILN_ERR_RANGE,
                               "loader state: position %llu is past the %lld batches of an epoch "
                               "(saved with other data, B, T or world size?)",
                               (unsigned long long)s->position, (long long)l->batches_per_epoch);
    l->state = *s;
    return KILN_OK;
}

int64_t kiln_loader_num_windows(const kiln_loader *l) {
    return l->num_windows;
}

uint64_t kiln_loader_content_hash(const kiln_loader *l) {
    return l->content_hash;
}
int kiln_loader_num_shards(const kiln_loader *l) {
    return l->num_shards;
}
const char *kiln_loader_shard_path(const kiln_loader *l, int i) {
    return i >= 0 && i < l->num_shards ? kiln_shard_path(l->shards[i]) : NULL;
}
const kiln_shard_info *kiln_loader_shard_info(const kiln_loader *l, int i) {
    return i >= 0 && i < l->num_shards ? kiln_shard_get_info(l->shards[i]) : NULL;
}
