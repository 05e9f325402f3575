/* Resuming on another split of the same training (trainer_elastic.h): what a checkpoint records
 * of its run's split, and the pure arithmetic of moving state from one split to another. */
#include "train/trainer_elastic.h"

#include <cjson/cJSON.h>
#include <stdio.h>

#include "train/trainer_internal.h"

void kiln__ckpt_put_run(const kiln_trainer *t, cJSON *j) {
    kiln__config_item items[KILN__CONFIG_ITEMS_MAX];
    int n = kiln__trainer_config_items(t, kiln_gpt_get_config(t->model), items);
    cJSON *c = cJSON_AddObjectToObject(j, "config");
    for (int i = 0; i < n; i++) {
        char hex[24];
        switch (items[i].kind) {
        case KILN__ITEM_REAL: cJSON_AddNumberToObject(c, items[i].name, items[i].f); break;
        case KILN__ITEM_HEX:
            snprintf(hex, sizeof hex, "%016llx", (unsigned long long)items[i].u);
            cJSON_AddStringToObject(c, items[i].name, hex);
            break;
        default: cJSON_AddNumberToObject(c, items[i].name, (double)items[i].i);
        }
    }
    const kiln_train_config *cfg = &t->cfg;
    cJSON *r = cJSON_AddObjectToObject(j, "run");
    cJSON_AddNumberToObject(r, "steps", (double)cfg->steps);
    cJSON_AddNumberToObject(r, "batch", (double)cfg->data.B);
    cJSON_AddNumberToObject(r, "grad_accum", (double)cfg->data.grad_accum);
    cJSON_AddNumberToObject(r, "micro_batches", (double)t->micro_total);
    cJSON_AddNumberToObject(r, "global_batch", (double)kiln__trainer_global_batch(t));
    if (cfg->dist.rank_batches) {
        cJSON *a = cJSON_AddArrayToObject(r, "rank_batches");
        for (int k = 0; k < t->world; k++)
            cJSON_AddItemToArray(a, cJSON_CreateNumber((double)cfg->dist.rank_batches[k]));
    }
    cJSON_AddNumberToObject(r, "lr_total_steps", (double)t->sched.total_steps);
    cJSON_AddBoolToObject(r, "lr_total_fixed", cfg->lr.total_steps > 0);
}

int kiln__ckpt_recut(const int64_t *los, const int64_t *his, int world, int64_t lo, int64_t hi,
                     kiln__recut_piece *out, int64_t *gap) {
    int n = 0;
    for (int64_t at = lo; at < hi;) {
        int r = 0;
        while (r < world && !(los[r] <= at && at < his[r]))
            r++;
        if (r == world) {
            *gap = at;
            return -1;
        }
        int64_t end = his[r] < hi ? his[r] : hi;
        out[n++] = (kiln__recut_piece){.rank = r, .lo = at, .hi = end};
        at = end;
    }
    return n;
}

void kiln__loader_position_after(int64_t k, int64_t per_epoch, uint64_t *epoch,
                                 uint64_t *position) {
    if (k <= 0 || per_epoch <= 0) {
        *epoch = 0;
        *position = 0;
        return;
    }
    *epoch = (uint64_t)((k - 1) / per_epoch);
    *position = (uint64_t)((k - 1) % per_epoch + 1);
}

/* "2 ranks of B=4", "1 process of B=8 x 2 micro-batches" */
static void describe(char *out, size_t size, int world, int64_t B, int64_t micro_total) {
    char micro[64] = "";
    if (micro_total != world)
        snprintf(micro, sizeof micro, " taking %lld micro-batches a step", (long long)micro_total);
    snprintf(out, size, "%d %s of B=%lld%s", world, world == 1 ? "process" : "ranks", (long long)B,
             micro);
}

void kiln__batch_advice(char *out, size_t size, int64_t old_global, int old_world, int64_t old_B,
                        int64_t old_micro_total, int world, int64_t B, int64_t accum,
                        int64_t rank_micro) {
    char was[128], now[128], fix[256];
    int64_t micro_total = rank_micro > 0 ? rank_micro : world * accum;
    describe(was, sizeof was, old_world, old_B, old_micro_total);
    describe(now, sizeof now, world, B, micro_total);
    const char *who = world == 1 ? "1 process" : "ranks";
    if (old_global % micro_total == 0) {
        char more[64] = "";
        if (rank_micro > 0)
            snprintf(more, sizeof more, " and these --rank-batches");
        else if (accum > 1)
            snprintf(more, sizeof more, " and --grad-accum %lld", (long long)accum);
        if (world == 1)
            snprintf(fix, sizeof fix, "with 1 process%s use --batch %lld", more,
                     (long long)(old_global / micro_total));
        else
            snprintf(fix, sizeof fix, "with %d ranks%s use --batch %lld", world, more,
                     (long long)(old_global / micro_total));
    } else if (old_global % world == 0) {
        snprintf(fix, sizeof fix, "with %d %s use --batch %lld --grad-accum 1", world,
                 world == 1 ? "process" : "ranks", (long long)(old_global / world));
    } else {
        snprintf(fix, sizeof fix,
                 "%lld sequences do not split evenly over %d %s: use another number of ranks, "
                 "or --rank-batches",
                 (long long)old_global, world, who);
    }
    snprintf(out, size,
             "%s wrote this checkpoint, %lld sequences a step; this run (%s) takes %lld: the "
             "global batch must stay the same: %s",
             was, (long long)old_global, now, (long long)(B * micro_total), fix);
}
