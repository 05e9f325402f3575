/* kiln: drawing tokens from a model's output distribution. */
#ifndef KILN_SAMPLE_H
#define KILN_SAMPLE_H

#include <stdint.h>

#include "kiln/core.h"
#include "kiln/model.h"
#include "kiln/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Draw one id from logits[0..V) (the padded columns are never considered): softmax of
 * logits / temperature over the top_k largest (top_k <= 0 or >= V: all). temperature 0
 * takes the most likely id. `scratch` holds 2*V floats. */
int32_t kiln_sample_logits(const float *logits, int64_t V, float temperature, int64_t top_k,
                           kiln_rng *rng, float *scratch);

/* Extend ids[0..n) to ids[0..n+count) by sampling from the model, one token at a time, each
 * step over the last (at most the model's planned T) tokens (with a generation cache where
 * the model allows one: kiln_generate_ex). n must be 1..T: a longer start
 * is KILN_ERR_RANGE, not cut. `ids` holds n+count entries.
 * on_token, if set, is called with each new id (e.g. to print it as it comes); a status
 * other than KILN_OK from it stops generation and is returned. */
kiln_status kiln_generate(kiln_gpt *m, int32_t *ids, int64_t n, int64_t count, float temperature,
                          int64_t top_k, uint64_t seed,
                          kiln_status (*on_token)(int32_t id, void *ctx), void *ctx);
/* kiln_generate with the cache chosen: use_cache 1 (what kiln_generate does) runs each new
 * token alone through the model, its attention reading the earlier positions' cached q, k
 * and v (kiln_gpt_enable_cache), while the sequence fits the model's context, where the
 * model and backend allow one; 0 runs the whole window for every token. Both give the same
 * tokens but for ties the order of floating-point sums may break otherwise. */
kiln_status kiln_generate_ex(kiln_gpt *m, int32_t *ids, int64_t n, int64_t count,
                             float temperature, int64_t top_k, uint64_t seed, int use_cache,
                             kiln_status (*on_token)(int32_t id, void *ctx), void *ctx);

#ifdef __cplusplus
}
#endif
#endif
