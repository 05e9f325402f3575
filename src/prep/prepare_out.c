/* kiln prepare's outputs: cutting ids into shards and publishing a run's shards together. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fs.h"
#include "kiln/prepare.h"
#include "prep/prepare_out.h"

/* ---- shards ----
 * Ids collect in pend; once more than 2R are held, all but R go to the writer, S per shard.
 * At the end the held R (or fewer) join the last shard. So a new shard is started only when
 * more than R ids remain for it: every shard has S ids except the last, which has more
 * than R and at most S + R (a split with fewer ids in all is one smaller shard). */

void kiln__prep_out_init(prep_out *o, const char *name, const char *dir, int64_t vocab,
                         int64_t shard_tokens, uint64_t tokenizer_id) {
    memset(o, 0, sizeof *o);
    o->name = name;
    o->dir = dir;
    o->vocab = vocab;
    o->tokenizer_id = tokenizer_id;
    o->shard_tokens = shard_tokens;
    int64_t r = shard_tokens / 8 < ((int64_t)1 << 20) ? shard_tokens / 8 : (int64_t)1 << 20;
    o->reserve = r > 0 ? r : 1;
}

void kiln__prep_shard_name(char *buf, size_t cap, const char *name, int i, int n) {
    char digits[16];
    int width = 3;
    for (int k = n - 1; k >= 1000 && width < 10; k /= 10)
        width++;
    snprintf(digits, sizeof digits, "%0*d", width, i < 0 ? 0 : i);
    if ((size_t)snprintf(buf, cap, "%s_%s.bin", name, digits) >= cap && cap > 0)
        buf[0] = '\0'; /* never: names are "train" or "val" */
}

static void staged_path(char *buf, size_t cap, const char *dir, const char *name, int i) {
    snprintf(buf, cap, "%s/%s_%d.bin", dir, name, i);
}

static kiln_status open_next(prep_out *o) {
    if (o->shards >= KILN_PREPARE_MAX_SHARDS) {
        o->too_many = 1;
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "prepare: the %s split needs more than %d shards of %lld tokens",
                               o->name, KILN_PREPARE_MAX_SHARDS, (long long)o->shard_tokens);
    }
    if (o->shards == o->recs_cap) {
        int cap = o->recs_cap ? 2 * o->recs_cap : 16;
        prep_shard_rec *r = realloc(o->recs, (size_t)cap * sizeof *r);
        if (!r)
            return kiln_error_setf(KILN_ERR_NOMEM, "no memory for the list of %s shards", o->name);
        o->recs = r;
        o->recs_cap = cap;
    }
    char p[4200];
    staged_path(p, sizeof p, o->dir, o->name, o->shards);
    KILN_CHECK(kiln_shard_writer_open(&o->w, p, o->vocab));
    kiln_shard_writer_set_tokenizer(o->w, o->tokenizer_id);
    return KILN_OK;
}

static kiln_status close_current(prep_out *o) {
    kiln_status st = kiln_shard_writer_finish(o->w);
    if (st == KILN_OK) {
        const kiln_shard_info *in = kiln_shard_writer_info(o->w);
        o->recs[o->shards] = (prep_shard_rec){in->num_tokens, in->data_hash};
        o->shards++;
    }
    kiln_shard_writer_free(o->w);
    o->w = NULL;
    return st;
}

/* Give the writers ids pend[0..n), S per shard. */
static kiln_status drain(prep_out *o, int64_t n) {
    int64_t done = 0;
    while (done < n) {
        if (o->w && kiln_shard_writer_count(o->w) >= o->shard_tokens)
            KILN_CHECK(close_current(o));
        if (!o->w)
            KILN_CHECK(open_next(o));
        int64_t room = o->shard_tokens - kiln_shard_writer_count(o->w);
        int64_t k = n - done < room ? n - done : room;
        KILN_CHECK(kiln_shard_writer_append(o->w, o->pend + done, k));
        done += k;
    }
    memmove(o->pend, o->pend + n, (size_t)(o->npend - n) * sizeof *o->pend);
    o->npend -= n;
    return KILN_OK;
}

kiln_status kiln__prep_out_append(prep_out *o, const int32_t *ids, int64_t n) {
    if (o->npend + n > o->cap) {
        int64_t cap = o->cap ? o->cap : 1 << 16;
        while (cap < o->npend + n)
            cap *= 2;
        int32_t *p = realloc(o->pend, (size_t)cap * sizeof *p);
        if (!p)
            return kiln_error_setf(KILN_ERR_NOMEM, "no memory to hold %lld ids for %s shards",
                                   (long long)cap, o->name);
        o->pend = p;
        o->cap = cap;
    }
    memcpy(o->pend + o->npend, ids, (size_t)n * sizeof *ids);
    o->npend += n;
    o->tokens += n;
    if (o->npend > 2 * o->reserve)
        return drain(o, o->npend - o->reserve);
    return KILN_OK;
}

kiln_status kiln__prep_out_finish(prep_out *o) {
    if (o->npend > 0) {
        /* The last shard takes the rest even past S: at most R more. */
        if (!o->w)
            KILN_CHECK(open_next(o));
        KILN_CHECK(kiln_shard_writer_append(o->w, o->pend, o->npend));
        o->npend = 0;
    }
    return o->w ? close_current(o) : KILN_OK;
}

void kiln__prep_out_free(prep_out *o) {
    kiln_shard_writer_free(o->w);
    free(o->recs);
    free(o->pend);
    memset(o, 0, sizeof *o);
}

/* ---- the staging folder ---- */

static void remove_tree_flat(const char *d) {
    DIR *dir = opendir(d);
    if (dir) {
        struct dirent *e;
        while ((e = readdir(dir)) != NULL) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                continue;
            char p[4400];
            snprintf(p, sizeof p, "%s/%s", d, e->d_name);
            unlink(p);
        }
        closedir(dir);
    }
    rmdir(d);
}

/* Staging folders of runs whose process is gone. */
static void remove_dead_staging(const char *out_dir) {
    DIR *dir = opendir(out_dir);
    if (!dir)
        return;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        long pid;
        char tail;
        if (sscanf(e->d_name, ".prepare.tmp.%ld%c", &pid, &tail) != 1 || pid <= 0)
            continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        char p[4400];
        snprintf(p, sizeof p, "%s/%s", out_dir, e->d_name);
        remove_tree_flat(p);
    }
    closedir(dir);
}

kiln_status kiln__prep_stage_begin(const char *out_dir, char **staging) {
    *staging = NULL;
    int err = 0;
    size_t made = 0;
    KILN_CHECK(kiln__make_dirs(out_dir, "the output folder", &err, &made));
    remove_dead_staging(out_dir);
    size_t n = strlen(out_dir) + 40;
    char *s = malloc(n);
    if (!s)
        return kiln_error_setf(KILN_ERR_NOMEM, "no memory");
    snprintf(s, n, "%s/.prepare.tmp.%ld", out_dir, (long)getpid());
    remove_tree_flat(s); /* ours from an earlier run in this process */
    if (mkdir(s, 0755) != 0) {
        kiln_status st = kiln_error_setf(KILN_ERR_IO, "%s: cannot create: %s", s, strerror(errno));
        free(s);
        return st;
    }
    *staging = s;
    return KILN_OK;
}

void kiln__prep_stage_abort(const char *staging) {
    if (staging)
        remove_tree_flat(staging);
}

/* 1 when name is <prefix>_<digits>.bin (a shard name of that split, any width). */
static int is_shard_name(const char *name, const char *prefix) {
    size_t n = strlen(prefix);
    if (strncmp(name, prefix, n) != 0 || name[n] != '_')
        return 0;
    const char *d = name + n + 1;
    const char *e = d;
    while (*e >= '0' && *e <= '9')
        e++;
    return e > d && strcmp(e, ".bin") == 0;
}

/* 1 when name is one this run publishes. */
static int is_ours(const char *name, const prep_out *outs, int n_outs) {
    for (int k = 0; k < n_outs; k++) {
        if (!is_shard_name(name, outs[k].name))
            continue;
        long v = strtol(name + strlen(outs[k].name) + 1, NULL, 10);
        if (v < 0 || v >= outs[k].shards)
            return 0;
        char want[64];
        kiln__prep_shard_name(want, sizeof want, outs[k].name, (int)v, outs[k].shards);
        return strcmp(name, want) == 0;
    }
    return 0;
}

static const char marker_text[] =
    "kiln prepare is replacing the shards in this folder. If this file is still here, that was\n"
    "cut short and the folder may hold shards of two runs: kiln's loader refuses it until kiln\n"
    "prepare is run into it again.\n";

kiln_status kiln__prep_stage_commit(const char *out_dir, const char *staging, const prep_out *outs,
                                    int n_outs, const char *manifest) {
    /* Every destination is checked before the first move, so that nothing a move could
     * refuse is found half way. From the marker's write to its removal the folder is marked
     * as mixed; the old manifest goes first and the new one comes last. */
    char to[4200], from[4200], name[64];
    for (int k = 0; k < n_outs; k++)
        for (int i = 0; i < outs[k].shards; i++) {
            kiln__prep_shard_name(name, sizeof name, outs[k].name, i, outs[k].shards);
            snprintf(to, sizeof to, "%s/%s", out_dir, name);
            KILN_CHECK(kiln_file_check_replaceable(to));
        }
    char mp[4200], marker[4200];
    snprintf(mp, sizeof mp, "%s/prepare.json", out_dir);
    snprintf(marker, sizeof marker, "%s/prepare.incomplete", out_dir);
    KILN_CHECK(kiln_file_check_replaceable(mp));
    KILN_CHECK(kiln__write_file_atomic(marker, marker_text, sizeof marker_text - 1));
    if (unlink(mp) != 0 && errno != ENOENT)
        return kiln_error_setf(KILN_ERR_IO, "%s: cannot remove the old manifest: %s", mp,
                               strerror(errno));
    for (int k = 0; k < n_outs; k++)
        for (int i = 0; i < outs[k].shards; i++) {
            staged_path(from, sizeof from, staging, outs[k].name, i);
            kiln__prep_shard_name(name, sizeof name, outs[k].name, i, outs[k].shards);
            snprintf(to, sizeof to, "%s/%s", out_dir, name);
            if (rename(from, to) != 0)
                return kiln_error_setf(KILN_ERR_IO, "moving %s to %s failed: %s", from, to,
                                       strerror(errno));
        }
    DIR *dir = opendir(out_dir);
    if (!dir)
        return kiln_error_setf(KILN_ERR_IO, "%s: cannot list the folder: %s", out_dir,
                               strerror(errno));
    struct dirent *e;
    kiln_status st = KILN_OK;
    while (st == KILN_OK && (e = readdir(dir)) != NULL) {
        int shard = 0;
        for (int k = 0; k < n_outs; k++)
            shard |= is_shard_name(e->d_name, outs[k].name);
        if (!shard || is_ours(e->d_name, outs, n_outs))
            continue;
        /* an earlier run's: it would mix with this one */
        snprintf(to, sizeof to, "%s/%s", out_dir, e->d_name);
        if (unlink(to) != 0 && errno != ENOENT)
            st = kiln_error_setf(KILN_ERR_IO, "%s: cannot remove this shard of an earlier run: %s",
                                 to, strerror(errno));
    }
    closedir(dir);
    KILN_CHECK(st);
    KILN_CHECK(kiln__write_file_atomic(mp, manifest, strlen(manifest)));
    if (unlink(marker) != 0)
        return kiln_error_setf(KILN_ERR_IO, "%s: cannot remove: %s", marker, strerror(errno));
    remove_tree_flat(staging);
    return kiln__sync_parent(marker);
}
