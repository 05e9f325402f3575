/* kiln: GPT-2 model: configuration, parameter layout, forward and backward.
 *
 * The model is embedding, blocks 0..L-1 and head. Parameters, gradients and optimizer
 * moments each live in one slab of floats, in one order:
 *   wte (Vp,C) | wpe (maxT,C) | block 0 | block 1 | ... | block L-1 | ln_f.weight | ln_f.bias
 * and each block is
 *   ln_1.weight (C) | ln_1.bias (C) | attn.c_attn.weight (C,3C) | attn.c_attn.bias (3C) |
 *   attn.c_proj.weight (C,C) | attn.c_proj.bias (C) | ln_2.weight (C) | ln_2.bias (C) |
 *   mlp.c_fc.weight (C,4C) | mlp.c_fc.bias (4C) | mlp.c_proj.weight (4C,C) | mlp.c_proj.bias (C)
 * Matrices are in Hugging Face GPT-2's layout (Conv1D: (in, out)), so every tensor of a
 * Hugging Face checkpoint is one contiguous range of the slab. The token embedding has Vp
 * rows; the tensor `wte.weight` names its first V rows and the padded rows stay zero. */
#ifndef KILN_MODEL_H
#define KILN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/backend.h"
#include "kiln/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_gpt_config {
    int64_t max_seq_len;       /* maxT: positions (n_positions) */
    int64_t vocab_size;        /* V */
    int64_t padded_vocab_size; /* Vp: V rounded up to a multiple of 128 (set by validate) */
    int64_t n_layer;           /* L */
    int64_t n_head;            /* NH */
    int64_t n_embd;            /* C */
} kiln_gpt_config;

/* Names the presets accept, NULL-terminated. */
extern const char *const kiln_gpt_preset_names[];

/* Fill cfg from a preset name: gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1558m, d4, d6, d12.
 * The vocabulary is GPT-2's (50257); callers may change it before validating. */
kiln_status kiln_gpt_config_preset(kiln_gpt_config *cfg, const char *name);
/* Fill cfg from a JSON file (a regular file of at most 64 KiB) with keys n_layer, n_head,
 * n_embd, max_seq_len (Hugging Face's n_positions is accepted for it) and vocab_size, which
 * may be left out or 0: then cfg->vocab_size is 0 (the caller supplies it, e.g. the data's,
 * before validating) and everything else is already checked. */
kiln_status kiln_gpt_config_from_json(kiln_gpt_config *cfg, const char *path);
/* Check that the configuration can work and set padded_vocab_size. */
kiln_status kiln_gpt_config_validate(kiln_gpt_config *cfg);
/* Parameters (excluding the padded embedding rows). */
int64_t kiln_gpt_config_num_params(const kiln_gpt_config *cfg);
/* Model FLOPs of one training step (forward + backward) per token at sequence length T:
 * 6 x (parameters in matrix products, the head counted with V columns) + attention's
 * 6 x 2 x L x T x C (QK^T and AV, causal mask not discounted). Embedding lookups,
 * LayerNorm and other element-wise work are not counted. */
double kiln_gpt_flops_per_token(const kiln_gpt_config *cfg, int64_t T);

/* One named parameter tensor: a contiguous range of the slabs. */
#define KILN_MAX_DIMS 4
typedef struct kiln_tensor_info {
    char name[64];          /* Hugging Face GPT-2 name, e.g. "h.3.mlp.c_fc.weight" */
    int64_t offset;         /* first element in the slab */
    int64_t numel;
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
    int decay;              /* 1: a matrix (2-D: wte, wpe, weights) that weight decay applies to;
                               0: biases and LayerNorm parameters */
    int layer;              /* block index, or -1 for embedding and head tensors */
} kiln_tensor_info;

typedef struct kiln_gpt kiln_gpt; /* opaque */

/* Build a model for batches of at most B sequences of at most T tokens: all memory
 * (parameters, gradients, activations) is planned and taken here, none in the step.
 * `be` NULL means the CPU backend. */
kiln_status kiln_gpt_create(kiln_gpt **out, const kiln_gpt_config *cfg, int64_t B, int64_t T,
                            const kiln_backend *be);
/* The same for forward only (evaluation, generation): no gradient slab, no backward
 * scratch, and the blocks share one block's activation buffers, which forward alone
 * allows; kiln_gpt_grads is NULL and kiln_gpt_backward fails. */
kiln_status kiln_gpt_create_inference(kiln_gpt **out, const kiln_gpt_config *cfg, int64_t B,
                                      int64_t T, const kiln_backend *be);
void kiln_gpt_free(kiln_gpt *m);

const kiln_gpt_config *kiln_gpt_get_config(const kiln_gpt *m);
const kiln_backend *kiln_gpt_backend(const kiln_gpt *m);
int64_t kiln_gpt_max_batch(const kiln_gpt *m);
int64_t kiln_gpt_max_seq(const kiln_gpt *m);

/* GPT-2's initialisation from a seed: weights N(0, 0.02), the residual projections
 * (attn.c_proj, mlp.c_proj) N(0, 0.02/sqrt(2L)), biases 0, LayerNorm weights 1. */
void kiln_gpt_init_weights(kiln_gpt *m, uint64_t seed);

/* Slabs: parameters, gradients (same order and length). */
float *kiln_gpt_params(kiln_gpt *m);
float *kiln_gpt_grads(kiln_gpt *m);
int64_t kiln_gpt_slab_len(const kiln_gpt *m); /* floats in each slab, padded rows included */
int kiln_gpt_num_tensors(const kiln_gpt *m);
const kiln_tensor_info *kiln_gpt_tensor(const kiln_gpt *m, int i);
/* Index of a tensor by name, or -1. */
int kiln_gpt_find_tensor(const kiln_gpt *m, const char *name);

/* Bytes of each planned category, and in all. */
typedef struct kiln_gpt_memory {
    size_t params, grads, activations, total;
} kiln_gpt_memory;
kiln_gpt_memory kiln_gpt_memory_plan(const kiln_gpt *m);
/* The same figures for a model not built yet: what kiln_gpt_create (inference 0) or
 * kiln_gpt_create_inference (inference 1) would take for cfg at B x T, so that a caller can
 * check a whole plan against the machine before taking any of it. Fails, with a message,
 * where creating the model would fail for the configuration or the sizes. */
kiln_status kiln_gpt_memory_plan_for(const kiln_gpt_config *cfg, int64_t B, int64_t T,
                                     int inference, kiln_gpt_memory *out);

/* KILN_OK when every parameter is a finite number; else KILN_ERR_RANGE naming the first
 * tensor that holds a NaN or an infinity. One backend sumsq per tensor: a sum of squares
 * taken in double is finite exactly when every element is. */
kiln_status kiln_gpt_check_finite(const kiln_gpt *m);

/* Forward over inputs (B,T). With targets (B,T) it computes the mean loss into *loss
 * (NULL targets: logits only, *loss untouched and may be NULL). Ids are checked:
 * an id >= V fails with KILN_ERR_RANGE and a message naming its position. */
kiln_status kiln_gpt_forward(kiln_gpt *m, const int32_t *inputs, const int32_t *targets,
                             int64_t B, int64_t T, float *loss);
/* Forward over inputs (B,T) that computes the logits of each sequence's last position
 * only, for generation: kiln_gpt_logits then holds (B,Vp). The blocks run in full; the
 * head, which dominates small models, runs on B rows instead of B*T. */
kiln_status kiln_gpt_forward_last(kiln_gpt *m, const int32_t *inputs, int64_t B, int64_t T);

/* Logits (B,T,Vp) of the last forward, valid until backward, which overwrites them in place
 * with their gradient; the padded columns are not meaningful. */
const float *kiln_gpt_logits(const kiln_gpt *m);
/* Per-position losses (B,T) of the last forward with targets. */
const float *kiln_gpt_losses(const kiln_gpt *m);

/* Backward of the last forward (which must have had targets). Gradients are ADDED to the
 * gradient slab, for gradient accumulation; the loss differentiated is
 * grad_scale x mean loss (grad_scale = 1 / micro-steps averages over micro-batches). */
kiln_status kiln_gpt_backward(kiln_gpt *m, float grad_scale);
void kiln_gpt_zero_grad(kiln_gpt *m);

#ifdef __cplusplus
}
#endif
#endif
