/* The data a checkpoint was trained on, by content (see trainer_data.h). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "core/error.h"
#include "kiln/loader.h"
#include "train/trainer_ckpt.h"
#include "train/trainer_data.h"
#include "train/trainer_internal.h"

static void put_hex(cJSON *o, const char *k, uint64_t v) {
    char b[24];
    snprintf(b, sizeof b, "%016llx", (unsigned long long)v);
    cJSON_AddStringToObject(o, k, b);
}

static void put_split(cJSON *d, const char *name, const char *path, const kiln_loader *l) {
    cJSON *o = cJSON_AddObjectToObject(d, name);
    cJSON_AddStringToObject(o, "path", path ? path : "");
    put_hex(o, "content_xxh3", kiln_loader_content_hash(l));
    cJSON *list = cJSON_AddArrayToObject(o, "shards");
    for (int i = 0; i < kiln_loader_num_shards(l); i++) {
        const kiln_shard_info *in = kiln_loader_shard_info(l, i);
        cJSON *e = cJSON_CreateObject();
        cJSON_AddItemToArray(list, e);
        cJSON_AddStringToObject(e, "name", kiln_loader_shard_path(l, i));
        cJSON_AddNumberToObject(e, "tokens", (double)in->num_tokens);
        put_hex(e, "xxh3", in->data_hash);
    }
}

void kiln__ckpt_put_data(const kiln_trainer *t, cJSON *j) {
    cJSON *d = cJSON_AddObjectToObject(j, "data");
    put_split(d, "train", t->cfg.data.train_path, t->train);
    if (t->val)
        put_split(d, "val", t->cfg.data.val_path, t->val);
}

uint64_t kiln__trainer_content_hash(const kiln_trainer *t) {
    uint64_t h[2] = {kiln_loader_content_hash(t->train),
                     t->val ? kiln_loader_content_hash(t->val) : 0};
    return XXH3_64bits(h, sizeof h);
}

static const char *str(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* One split: the checkpoint's record o against the loader l over this run's path. */
static kiln_status check_split(const char *folder, const char *what, const cJSON *o,
                               const char *path, const kiln_loader *l) {
    const char *had = str(o, "content_xxh3"), *was = str(o, "path");
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(o, "shards");
    if (!had || !was || !cJSON_IsArray(list))
        return kiln_error_setf(KILN_ERR_FORMAT, "%s/state.json: a malformed \"data\" record",
                               folder);
    char now[17];
    snprintf(now, sizeof now, "%016llx", (unsigned long long)kiln_loader_content_hash(l));
    if (!strcmp(had, now))
        return KILN_OK;
    int n = cJSON_GetArraySize(list);
    for (int i = 0; n == kiln_loader_num_shards(l) && i < n; i++) {
        const cJSON *e = cJSON_GetArrayItem(list, i);
        const cJSON *tokens = cJSON_GetObjectItemCaseSensitive(e, "tokens");
        const char *name = str(e, "name"), *sum = str(e, "xxh3");
        const kiln_shard_info *in = kiln_loader_shard_info(l, i);
        char mine[17];
        snprintf(mine, sizeof mine, "%016llx", (unsigned long long)in->data_hash);
        if (name && sum && cJSON_IsNumber(tokens) &&
            tokens->valuedouble == (double)in->num_tokens && !strcmp(sum, mine))
            continue;
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "%s is a checkpoint of a run on other %s data: it was trained on "
                               "%s (%.0f tokens, XXH3 %s) and this run reads %s (%lld tokens, XXH3 "
                               "%s): other tokens (the data was prepared again from another "
                               "text, or replaced): not resumed; resume with the data it was "
                               "written with",
                               folder, what, name ? name : "?",
                               cJSON_IsNumber(tokens) ? tokens->valuedouble : -1.0, sum ? sum : "?",
                               kiln_loader_shard_path(l, i), (long long)in->num_tokens, mine);
    }
    return kiln_error_setf(KILN_ERR_CONFIG,
                           "%s is a checkpoint of a run on other %s data: it was trained on %s "
                           "(%d shard(s), content XXH3 %s) and this run reads %s (%d shard(s), "
                           "content XXH3 %s): other tokens: not resumed; resume with the data it "
                           "was written with",
                           folder, what, was, n, had, path ? path : "?", kiln_loader_num_shards(l),
                           now);
}

kiln_status kiln__ckpt_check_data(kiln_trainer *t, const char *folder, const cJSON *j) {
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(j, "data");
    if (!d) {
        if (t->rank == 0 && t->cfg.metrics.log) {
            fprintf(t->cfg.metrics.log,
                    "resume: note: %s records no checksums of its data (written by an older "
                    "kiln): the token counts match this run's, the tokens themselves could not "
                    "be compared\n",
                    folder);
            fflush(t->cfg.metrics.log);
        }
        return KILN_OK;
    }
    if (!cJSON_IsObject(d))
        return kiln_error_setf(KILN_ERR_FORMAT, "%s/state.json: \"data\" is not an object", folder);
    const cJSON *train = cJSON_GetObjectItemCaseSensitive(d, "train");
    const cJSON *val = cJSON_GetObjectItemCaseSensitive(d, "val");
    KILN_CHECK(check_split(folder, "training", train, t->cfg.data.train_path, t->train));
    if (t->val && val)
        KILN_CHECK(check_split(folder, "validation", val, t->cfg.data.val_path, t->val));
    return KILN_OK;
}

kiln_status kiln__trainer_data_failed(kiln_trainer *t, kiln_status st) {
    if (t->world > 1 || t->steps_done == 0)
        return st;
    char why[1536], kept[1024] = "";
    snprintf(why, sizeof why, "%s", kiln_error_message());
    size_t used = 0;
    /* a checkpoint being written is published: it holds a step done */
    if (kiln__trainer_checkpoint_poll(t, t->steps_done, 1) == KILN_OK && t->ckpt_step > 0 &&
        t->cfg.checkpoint.dir)
        used += (size_t)snprintf(kept + used, sizeof kept - used,
                                 "; the newest checkpoint, of step %lld, is in %s",
                                 (long long)t->ckpt_step, t->cfg.checkpoint.dir);
    if (t->cfg.save.path && used < sizeof kept) {
        if (kiln__trainer_maybe_save(t, t->steps_done, 1) == KILN_OK)
            snprintf(kept + used, sizeof kept - used,
                     "; the weights of step %lld, the last good step, are saved in %s",
                     (long long)t->steps_done, t->cfg.save.path);
        else
            snprintf(kept + used, sizeof kept - used,
                     "; the weights of step %lld were not saved: %s", (long long)t->steps_done,
                     kiln_error_message());
    }
    return kiln_error_setf(st, "step %lld: %s%s", (long long)(t->steps_done + 1), why, kept);
}
