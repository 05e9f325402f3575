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
 * step over the last (at most the model's planned T) tokens. n must be 1..T: a longer start
 * is KILN_ERR_RANGE, not cut. `ids` holds n+count entries.
 * on_token, if set, is called with each new id (e.g. to print it as it comes); a status
 * other than KILN_OK from it stops generation and is returned. */
kiln_status kiln_generate(kiln_gpt *m, int32_t *ids, int64_t n, int64_t count, float temperature,
                          int64_t top_k, uint64_t seed,
                          kiln_status (*on_token)(int32_t id, void *ctx), void *ctx);

#ifdef __cplusplus
}
#endif
#endif
