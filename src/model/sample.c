/* Sampling with temperature and top-k. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kiln/sample.h"

/* Partition so the k largest values of v[0..n) come first (quickselect on values, with
 * their ids carried along). */
static void top_k_select(float *v, float *ids, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        float pivot = v[(lo + hi) / 2];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (v[i] > pivot)
                i++;
            while (v[j] < pivot)
                j--;
            if (i <= j) {
                float t = v[i];
                v[i] = v[j];
                v[j] = t;
                t = ids[i];
                ids[i] = ids[j];
                ids[j] = t;
                i++;
                j--;
            }
        }
        if (k - 1 <= j)
            hi = j;
        else if (k - 1 >= i)
            lo = i;
        else
            break;
    }
}

int32_t kiln_sample_logits(const float *logits, int64_t V, float temperature, int64_t top_k,
                           kiln_rng *rng, float *scratch) {
    if (temperature <= 0.0f) {
        int64_t best = 0;
        for (int64_t i = 1; i < V; i++)
            if (logits[i] > logits[best])
                best = i;
        return (int32_t)best;
    }
    float *v = scratch, *ids = scratch + V; /* ids as floats: exact below 2^24 */
    /* Scaled relative to the largest logit, so that a tiny temperature cannot overflow:
     * every value is <= 0 and the most likely id gets exp(0) = 1. */
    float top = logits[0];
    for (int64_t i = 1; i < V; i++)
        top = logits[i] > top ? logits[i] : top;
    for (int64_t i = 0; i < V; i++) {
        double scaled = ((double)logits[i] - (double)top) / (double)temperature;
        v[i] = scaled < -1e30 ? -1e30f : (float)scaled;
        ids[i] = (float)i;
    }
    int64_t n = V;
    if (top_k > 0 && top_k < V) {
        top_k_select(v, ids, V, top_k);
        n = top_k;
    }
    float mx = v[0];
    for (int64_t i = 1; i < n; i++)
        mx = v[i] > mx ? v[i] : mx;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        v[i] = expf(v[i] - mx);
        sum += v[i];
    }
    double u = (double)kiln_rng_uniform(rng) * sum, acc = 0.0;
    for (int64_t i = 0; i < n; i++) {
        acc += v[i];
        if (u < acc)
            return (int32_t)ids[i];
    }
    return (int32_t)ids[n - 1];
}

kiln_status kiln_generate(kiln_gpt *m, int32_t *ids, int64_t n, int64_t count, float temperature,
                          int64_t top_k, uint64_t seed,
                          kiln_status (*on_token)(int32_t id, void *ctx), void *ctx) {
    return kiln_generate_ex(m, ids, n, count, temperature, top_k, seed, 1, on_token, ctx);
}

kiln_status kiln_generate_ex(kiln_gpt *m, int32_t *ids, int64_t n, int64_t count, float temperature,
                             int64_t top_k, uint64_t seed, int use_cache,
                             kiln_status (*on_token)(int32_t id, void *ctx), void *ctx) {
    const kiln_gpt_config *cfg = kiln_gpt_get_config(m);
    int64_t V = cfg->vocab_size, maxT = kiln_gpt_max_seq(m);
    if (n < 1)
        return kiln_error_setf(KILN_ERR_ARG, "generation needs at least one token to start from");
    if (n > maxT) /* cutting it would drop the start of the prompt unseen */
        return kiln_error_setf(KILN_ERR_RANGE,
                               "the prompt is %lld tokens, more than the %lld the model was "
                               "planned for (its context)",
                               (long long)n, (long long)maxT);
    int64_t Vp = cfg->padded_vocab_size;
    /* the last logits widened to fp32 (Vp), then the sampler's scratch (2V) */
    float *scratch = malloc((size_t)(Vp + 2 * V) * sizeof *scratch);
    if (!scratch)
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate sampling scratch");
    float *last = scratch + 2 * V;
    kiln_rng rng;
    kiln_rng_seed(&rng, seed);
    kiln_status s = KILN_OK;
    /* With a cache each new token runs alone through the model, until the window is full:
     * then learned positions, being absolute, run every window whole, and rotary ones go on
     * with the cache over the last maxT positions (the same attention, as only their
     * differences count). */
    int cached = use_cache && kiln_gpt_enable_cache(m) == KILN_OK;
    int slides = cfg->position == KILN_POSITION_ROPE;
    if (use_cache && !cached)
        kiln_error_clear();
    for (int64_t i = 0; i < count; i++) {
        int64_t len = n + i, T = len < maxT ? len : maxT;
        if (cached && (len <= maxT || slides))
            s = i == 0 ? kiln_gpt_forward_cached(m, ids, 1, 0, len)
                       : kiln_gpt_forward_cached(m, ids + len - 1, 1, len - 1, 1);
        else
            s = kiln_gpt_forward_last(m, ids + len - T, 1, T);
        if (s)
            break;
        if ((s = kiln_gpt_logits_f32(m, 1, last)) != KILN_OK)
            break;
        int finite = 1;
        for (int64_t k = 0; k < V; k++)
            finite &= isfinite(last[k]);
        if (!finite) {
            s = kiln_error_setf(KILN_ERR_RANGE,
                                "the model's output is not finite (its weights hold "
                                "NaN or infinite values)");
            break;
        }
        ids[len] = kiln_sample_logits(last, V, temperature, top_k, &rng, scratch);
        if (on_token && (s = on_token(ids[len], ctx)) != KILN_OK)
            break;
    }
    free(scratch);
    return s;
}
