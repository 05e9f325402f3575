/* The training data loader: windows of T+1 tokens over memory-mapped shards.
 *
 * Shard s of n_s tokens holds floor((n_s - 1) / T) windows; window k starts at token k*T
 * (stride T: a window's last token is the next window's first, as a target then an
 * input). Windows never cross shards. The windows of all shards are numbered in shard
 * order (shards sorted by path) and an epoch visits them in the order perm_e, a
 * Fisher-Yates shuffle of [0, W) drawn from a generator seeded by hash(seed, e). The order
 * is a table of W 32-bit indices (counted by kiln_alloc), built at the first batch of each
 * epoch: about 25 ms per million windows (bench/bench_loader.c), once per epoch. Batch j of rank r
 * takes the B windows perm_e[(j*world + r)*B ..][0..B): the ranks together take the same
 * windows, in the same order, as a single process with batch world*B. An epoch has
 * floor(W / (world*B)) batches; the few windows left over are not visited that epoch
 * (they are in the next, being reshuffled). */
#include "kiln/loader.h"

#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "core/error.h"
#include "kiln/core.h"
#include "kiln/shard.h"

struct kiln_loader {
    kiln_loader_config cfg; /* cfg.path is not kept */
    kiln_shard **shards;
    int num_shards;
    int64_t *first_window; /* [num_shards + 1]: global index of each shard's first window */
    int64_t num_windows, num_tokens, vocab;
    int64_t batches_per_epoch;
    kiln_loader_state state;
    uint32_t *perm;      /* [num_windows] the order of epoch perm_epoch (shuffle only) */
    uint64_t perm_epoch; /* the epoch and seed perm was drawn for; valid when perm_valid */
    uint64_t perm_seed;
    int perm_valid;
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

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* path is a file, a folder (every "*.bin" in it) or a glob pattern; sorted by name. */
static kiln_status find_shards(const char *path, path_list *out) {
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode))
        return path_list_add(out, path, NULL);
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
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
            return kiln_error_setf(KILN_ERR_NOT_FOUND, "%s: the folder holds no *.bin shards",
                                   path);
        qsort(out->items, (size_t)out->n, sizeof *out->items, cmp_str);
        return KILN_OK;
    }
    if (!strpbrk(path, "*?["))
        return kiln_error_setf(KILN_ERR_NOT_FOUND, "%s: no such shard, folder or pattern", path);
    glob_t g;
    int rc = glob(path, GLOB_ERR, NULL, &g);
    if (rc == GLOB_NOMATCH)
        return kiln_error_setf(KILN_ERR_NOT_FOUND, "%s: no shards match the pattern", path);
    if (rc != 0)
        return kiln_error_setf(KILN_ERR_IO, "%s: cannot expand the pattern", path);
    kiln_status st = KILN_OK;
    for (size_t i = 0; st == KILN_OK && i < g.gl_pathc; i++)
        st = path_list_add(out, g.gl_pathv[i], NULL);
    globfree(&g);
    KILN_CHECK(st);
    qsort(out->items, (size_t)out->n, sizeof *out->items, cmp_str); /* glob sorts by locale */
    return KILN_OK;
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

static kiln_status open_shards(kiln_loader *l, const path_list *paths) {
    l->shards = calloc((size_t)paths->n, sizeof *l->shards);
    l->first_window = calloc((size_t)paths->n + 1, sizeof *l->first_window);
    if (!l->shards || !l->first_window)
        return kiln_error_setf(KILN_ERR_NOMEM, "loader: no memory for %d shards", paths->n);
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
    return KILN_OK;
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

/* Copy window w: inputs get tokens [0, T), targets [1, T+1). */
static void copy_window(const kiln_loader *l, int64_t w, int32_t *inputs, int32_t *targets) {
    int lo = 0, hi = l->num_shards - 1; /* the shard s with first_window[s] <= w */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (l->first_window[mid] <= w)
            lo = mid;
        else
            hi = mid - 1;
    }
    const kiln_shard *s = l->shards[lo];
    int64_t T = l->cfg.T, start = (w - l->first_window[lo]) * T;
    const void *data = kiln_shard_data(s);
    if (kiln_shard_get_info(s)->token_width == 2) {
        const uint16_t *p = (const uint16_t *)data + start;
        for (int64_t t = 0; t < T; t++) {
            inputs[t] = p[t];
            targets[t] = p[t + 1];
        }
    } else {
        const int32_t *p = (const int32_t *)data + start;
        memcpy(inputs, p, (size_t)T * sizeof *p);
        memcpy(targets, p + 1, (size_t)T * sizeof *p);
    }
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
        copy_window(l, w, inputs + b * T, targets + b * T);
    }
    l->state.position++;
    return KILN_OK;
}

int64_t kiln_loader_vocab_size(const kiln_loader *l) {
    return l->vocab;
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
