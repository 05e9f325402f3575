/* Uneven ranks chosen from measured step times (dist.rank_batches_auto): after
 * that many steps every rank's busy time per micro-batch (its step less the communication it
 * waited for) goes to every rank, and the step's micro-batches are split again in inverse
 * proportion to it, each rank at least one. The global batch stays what it was, so the run
 * trains as before (one process's batch, gradients weighted by tokens); each rank opens the
 * loaders of its new micro-batches where an uninterrupted run of the new split would be. Every
 * rank computes the same split from the same numbers. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "train/trainer_elastic.h"
#include "train/trainer_feature.h"
#include "train/trainer_internal.h"

/* counts[0..world) summing to M, proportional to 1/ms, each >= 1: each rank its ideal share
 * rounded down (at least one), then the rest to the largest remainders (or taken back from the
 * smallest, when the ones raised to one overshoot). */
void kiln__balance_split(const double *ms, int world, int64_t M, int64_t *counts) {
    double inv = 0.0, *rest = malloc((size_t)world * sizeof *rest);
    if (!rest) { /* an even split */
        for (int r = 0; r < world; r++)
            counts[r] = M / world + (r < M % world);
        return;
    }
    for (int r = 0; r < world; r++)
        inv += 1.0 / (ms[r] > 1e-9 ? ms[r] : 1e-9);
    int64_t given = 0;
    for (int r = 0; r < world; r++) {
        double ideal = (double)M * (1.0 / (ms[r] > 1e-9 ? ms[r] : 1e-9)) / inv;
        counts[r] = (int64_t)floor(ideal);
        if (counts[r] < 1)
            counts[r] = 1;
        rest[r] = ideal - (double)counts[r];
        given += counts[r];
    }
    while (given != M) {
        int pick = -1;
        for (int r = 0; r < world; r++) {
            if (given > M && counts[r] <= 1)
                continue;
            if (pick < 0 || (given < M ? rest[r] > rest[pick]
                                       : rest[r] < rest[pick]))
                pick = r;
        }
        if (pick < 0)
            break;
        counts[pick] += given < M ? 1 : -1;
        rest[pick] += given < M ? -1.0 : 1.0;
        given += given < M ? 1 : -1;
    }
    free(rest);
}

/* This rank's micro-batch loaders for the split counts, each where it would be after k
 * batches. */
static kiln_status reopen_loaders(kiln_trainer *t, const int64_t *counts, int64_t k) {
    const kiln_train_config *c = &t->cfg;
    int64_t offset = 0, total = 0;
    for (int r = 0; r < t->world; r++) {
        if (r < t->rank)
            offset += counts[r];
        total += counts[r];
    }
    kiln_loader **fresh = calloc((size_t)counts[t->rank], sizeof *fresh);
    if (!fresh)
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate the loaders");
    kiln_loader_config lc = {.path = c->data.train_path,
                             .B = c->data.B,
                             .T = c->data.T,
                             .world = (int)total,
                             .seed = c->seed,
                             .shuffle = 1};
    kiln_status s = KILN_OK;
    for (int64_t m = 0; s == KILN_OK && m < counts[t->rank]; m++) {
        lc.rank = (int)(offset + m);
        s = kiln_loader_open(&fresh[m], &lc);
        if (s == KILN_OK) {
            kiln_loader_state st = kiln_loader_get_state(fresh[m]);
            kiln__loader_position_after(k, kiln_loader_batches_per_epoch(fresh[m]), &st.epoch,
                                        &st.position);
            s = kiln_loader_set_state(fresh[m], &st);
        }
    }
    if (s != KILN_OK) {
        for (int64_t m = 0; m < counts[t->rank]; m++)
            kiln_loader_close(fresh[m]);
        free(fresh);
        return s;
    }
    for (int64_t m = 0; m < t->micro; m++)
        kiln_loader_close(t->micro_loaders[m]);
    free(t->micro_loaders);
    t->micro_loaders = fresh;
    t->train = fresh[0];
    t->micro = counts[t->rank];
    for (int r = 0; r < t->world; r++)
        t->rank_batches[r] = counts[r];
    t->flops_per_step = kiln_gpt_flops_per_token(kiln_gpt_get_config(t->model), c->data.T) *
                        (double)(c->data.B * c->data.T) * (double)t->micro;
    return KILN_OK;
}

kiln_status kiln__trainer_balance(kiln_trainer *t, const kiln_step_info *mt) {
    const kiln_train_config *c = &t->cfg;
    if (c->dist.rank_batches_auto <= 0 || t->world <= 1 || t->balanced || !t->rank_batches)
        return KILN_OK;
    /* the first step of this process warms caches: left out */
    if (mt->step > t->resumed_step + 1)
        t->balance_ms += mt->ms - mt->comm_ms * (1.0 - mt->comm_hidden);
    if (mt->step < t->resumed_step + c->dist.rank_batches_auto)
        return KILN_OK;
    t->balanced = 1;
    int64_t timed = mt->step - t->resumed_step - 1;
    float mine = (float)(t->balance_ms / (double)(timed > 0 ? timed : 1) / (double)t->micro);
    float *all = NULL;
    int64_t *counts = calloc((size_t)t->world, sizeof *counts);
    double *ms = calloc((size_t)t->world, sizeof *ms);
    kiln_status s = counts && ms ? KILN_OK : kiln_error_setf(KILN_ERR_NOMEM, "out of memory");
    if (s == KILN_OK)
        s = kiln__trainer_gather_one(t, mine, &all);
    int changed = 0;
    if (s == KILN_OK) {
        for (int r = 0; r < t->world; r++)
            ms[r] = all[r];
        kiln__balance_split(ms, t->world, t->micro_total, counts);
        for (int r = 0; r < t->world; r++)
            changed |= counts[r] != t->rank_batches[r];
    }
    if (s == KILN_OK && changed) {
        kiln_loader_state st = kiln_loader_get_state(t->micro_loaders[0]);
        int64_t k = (int64_t)st.epoch * kiln_loader_batches_per_epoch(t->micro_loaders[0]) +
                    (int64_t)st.position;
        s = reopen_loaders(t, counts, k);
    }
    if (s == KILN_OK && c->metrics.log) {
        fprintf(c->metrics.log, "uneven ranks after step %lld: busy ms per micro-batch",
                (long long)mt->step);
        for (int r = 0; r < t->world; r++)
            fprintf(c->metrics.log, "%s rank %d %.1f", r ? "," : "", r, ms[r]);
        fprintf(c->metrics.log, "; micro-batches a step %s", changed ? "now" : "kept at");
        for (int r = 0; r < t->world; r++)
            fprintf(c->metrics.log, "%s%lld", r ? "," : " ", (long long)t->rank_batches[r]);
        fprintf(c->metrics.log, " (%lld in all, the same batch)\n", (long long)t->micro_total);
    }
    if (s == KILN_OK && t->metrics) {
        char line[512];
        int at = snprintf(line, sizeof line, "{\"event\": \"rank_batches\", \"step\": %lld, \"counts\": [",
                          (long long)mt->step);
        for (int r = 0; r < t->world && at < (int)sizeof line - 32; r++)
            at += snprintf(line + at, sizeof line - (size_t)at, "%s%lld", r ? ", " : "",
                           (long long)t->rank_batches[r]);
        snprintf(line + at, sizeof line - (size_t)at, "]}");
        kiln__metrics_line(t->metrics, line, c->metrics.log);
    }
    free(all);
    free(counts);
    free(ms);
    return s;
}

/* ---- uneven ranks as a feature of the trainer (trainer_feature.h) ---- */

static kiln_status balance_figures(kiln_trainer *t, kiln_step_info *mt) {
    return kiln__trainer_balance(t, mt);
}

const kiln__feature kiln__feature_balance = {
    .name = "uneven ranks",
    .step_figures = balance_figures,
};
