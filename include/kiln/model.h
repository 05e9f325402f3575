/* kiln: the model: its description (GPT-2 and Llama families, see kiln_family), configuration,
 * parameter layout, forward and backward. What follows describes GPT-2's layout; a Llama's is
 * Hugging Face Llama's (docs/models.md): model.embed_tokens.weight (Vp,C) | blocks of
 * input_layernorm.weight (C), self_attn.{q,k,v,o}_proj.weight (out,in), post_attention_
 * layernorm.weight (C), mlp.{gate,up,down}_proj.weight (out,in) | model.norm.weight (C) |
 * lm_head.weight (Vp,C) when untied.
 *
 * The model is embedding, blocks 0..L-1 and head. Parameters, gradients and optimizer
 * moments each live in one slab, in one order (the working weights in the model's dtype,
 * gradients and optimizer state in fp32):
 *   wte (Vp,C) | wpe (maxT,C) | block 0 | block 1 | ... | block L-1 | ln_f.weight | ln_f.bias
 * and each block is
 *   ln_1.weight (C) | ln_1.bias (C) | attn.c_attn.weight (C,3A) | attn.c_attn.bias (3A) |
 *   attn.c_proj.weight (A,C) | attn.c_proj.bias (C) | ln_2.weight (C) | ln_2.bias (C) |
 *   mlp.c_fc.weight (C,H) | mlp.c_fc.bias (H) | mlp.c_proj.weight (H,C) | mlp.c_proj.bias (C)
 * where A = n_head x head_size is the attention's width and H the MLP's (C and 4C unless
 * the model was made narrower; see kiln_gpt_config).
 * A factored matrix (kiln_gpt_config.rank) is two tensors in its place, "<name>.weight_u" (in,r)
 * then "<name>.weight_v" (r,out), and its product runs as (x U) V + b.
 * Matrices are in Hugging Face GPT-2's layout (Conv1D: (in, out)), so every tensor of a
 * Hugging Face checkpoint is one contiguous range of the slab. The token embedding has Vp
 * rows; the tensor `wte.weight` names its first V rows and the padded rows stay zero. */
#ifndef KILN_MODEL_H
#define KILN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/backend.h"
#include "kiln/dtype.h"
#include "kiln/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The architecture: what each part of the model computes. A model family is a description made
 * of these (kiln_gpt_config_family): GPT-2 is LayerNorm, learned positions, a GELU MLP, biases
 * and the head tied to the token embedding; Llama is RMSNorm, rotary positions, a SwiGLU MLP,
 * grouped key/value heads, no biases and a head tied or not. Zero is GPT-2's in every field. */
typedef enum kiln_family {
    KILN_FAMILY_GPT2 = 0,  /* tensors named and laid out as Hugging Face's GPT-2 */
    KILN_FAMILY_LLAMA = 1, /* as Hugging Face's Llama (model.layers.N..., (out, in) matrices) */
} kiln_family;
typedef enum kiln_norm {
    KILN_NORM_LAYERNORM = 0, /* (x - mean) rstd w + b */
    KILN_NORM_RMSNORM = 1,   /* x / sqrt(mean(x^2) + eps) w */
} kiln_norm;
typedef enum kiln_position {
    KILN_POSITION_LEARNED = 0, /* a (maxT, C) embedding added to the tokens' */
    KILN_POSITION_ROPE = 1,    /* q and k rotated by their position (rope_theta) */
} kiln_position;
typedef enum kiln_mlp {
    KILN_MLP_GELU = 0,   /* c_proj(GELU(c_fc(x))) */
    KILN_MLP_SWIGLU = 1, /* down(silu(gate(x)) * up(x)) */
} kiln_mlp;

typedef struct kiln_gpt_config {
    int64_t max_seq_len;       /* maxT: positions (n_positions) */
    int64_t vocab_size;        /* V */
    int64_t padded_vocab_size; /* Vp: V rounded up to a multiple of 128 (set by validate) */
    int64_t n_layer;           /* L */
    int64_t n_head;            /* NH */
    int64_t n_embd;            /* C */
    /* Cross-layer weight sharing: each block's weights serve this many consecutive layers
     * (layers l and l + 1 of share 2 use block l / 2's); 0 or 1: none. Divides n_layer. The
     * layers keep their own activations; the shared weights' gradients add up over them. */
    int64_t share_layers;
    /* Each head's width: 0 (the default) is n_embd / n_head; a model whose heads were pruned
     * (or one built narrow) has n_head x head_size != n_embd. The attention's inner width
     * A = n_head x head_size: attn.c_attn is (C,3A) and attn.c_proj (A,C). */
    int64_t head_size;
    /* The MLP's hidden width H: 0 (the default) is 4 n_embd; mlp.c_fc is (C,H), mlp.c_proj
     * (H,C). Validation stores the defaults as 0, so equal models have equal configs. */
    int64_t mlp_hidden;
    /* Low-rank factorisation: the rank r of each kind of block matrix, in kiln_gpt_matrix's
     * order (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj), the same in every block; 0: the
     * dense matrix. A factored W (in, out) is U (in, r) x V (r, out), 1 <= r <= min(in, out). */
    int64_t rank[4];
    /* The architecture (see kiln_family): names and layout, then the math. */
    kiln_family family;
    kiln_norm norm;
    kiln_position position;
    kiln_mlp mlp;
    int bias_free;     /* 1: no biases anywhere */
    int untied_head;   /* 1: the head is its own (Vp, C) matrix, not the token embedding */
    int64_t n_kv_head; /* key/value heads, dividing n_head (1: multi-query); 0: n_head */
    double norm_eps;   /* the norms' epsilon; 0: 1e-5 (LayerNorm's is always 1e-5) */
    double rope_theta; /* rotary embeddings' base; 0: 10000 */
} kiln_gpt_config;

/* KILN_OK when cfg is of family f; else KILN_ERR_UNSUPPORTED: "<what> is for <f> models; this
 * one is <its family>". For the features one family has and another not yet. */
kiln_status kiln_gpt_require_family(const kiln_gpt_config *cfg, kiln_family f, const char *what);

/* The families kiln_gpt_config_family knows: "gpt2", "llama". */
extern const char *const kiln_family_names[];
const char *kiln_family_name(kiln_family f);
/* Set the architecture fields of cfg to family's description (its shape is left as it is;
 * n_kv_head is kept when it divides n_head). */
kiln_status kiln_gpt_config_family(kiln_gpt_config *cfg, const char *family);
/* Key/value heads (n_kv_head, or n_head) and their width n_kv_head x head_size. */
int64_t kiln_gpt_config_kv_heads(const kiln_gpt_config *cfg);
int64_t kiln_gpt_config_kv_width(const kiln_gpt_config *cfg);
/* The width of a row of q, k and v together: A + 2 x the key/value width. */
int64_t kiln_gpt_config_qkv_width(const kiln_gpt_config *cfg);
/* The norms' epsilon and the rotary base, defaults resolved. */
float kiln_gpt_config_norm_eps(const kiln_gpt_config *cfg);
float kiln_gpt_config_rope_theta(const kiln_gpt_config *cfg);

/* Names the presets accept, NULL-terminated. */
extern const char *const kiln_gpt_preset_names[];

/* Fill cfg from a preset name: gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1558m, d4, d6, d12, and
 * the Llamas llama-d4, llama-d6, llama-d12, smollm2-135m. The vocabulary is GPT-2's (50257;
 * SmolLM2's 49152); callers may change it before validating. */
kiln_status kiln_gpt_config_preset(kiln_gpt_config *cfg, const char *name);
/* Fill cfg from a JSON file (a regular file of at most 64 KiB) with keys n_layer, n_head,
 * n_embd, max_seq_len (Hugging Face's n_positions is accepted for it), optionally
 * share_layers and rank_qkv, rank_attproj, rank_fc, rank_fcproj, and vocab_size, which
 * may be left out or 0: then cfg->vocab_size is 0 (the caller supplies it, e.g. the data's,
 * before validating) and everything else is already checked. "family": "llama" with n_kv_head,
 * norm_eps, rope_theta and untied_head describes a Llama. A file with "model_type" is Hugging
 * Face's config.json ("llama" or "gpt2"): its keys are read as docs/models.md lists, and a key
 * that changes the math and that kiln does not compute is refused by name
 * (KILN_ERR_UNSUPPORTED). */
kiln_status kiln_gpt_config_from_json(kiln_gpt_config *cfg, const char *path);
/* Check that the configuration can work and set padded_vocab_size. */
kiln_status kiln_gpt_config_validate(kiln_gpt_config *cfg);
/* The blocks of weights: n_layer / share_layers. */
int64_t kiln_gpt_config_blocks(const kiln_gpt_config *cfg);
/* Each head's width (head_size, or n_embd / n_head), the attention's inner width
 * n_head x that, and the MLP's hidden width (mlp_hidden, or 4 n_embd). */
int64_t kiln_gpt_config_head_size(const kiln_gpt_config *cfg);
int64_t kiln_gpt_config_attn_width(const kiln_gpt_config *cfg);
int64_t kiln_gpt_config_mlp_width(const kiln_gpt_config *cfg);
/* Parameters (excluding the padded embedding rows). */
int64_t kiln_gpt_config_num_params(const kiln_gpt_config *cfg);
/* Model FLOPs of one training step (forward + backward) per token at sequence length T:
 * 6 x (parameters in matrix products, a factored matrix's two factors, the head counted with
 * V columns) + attention's 6 x 2 x L x T x A (QK^T and AV over the attention width A, causal
 * mask not discounted). Embedding lookups,
 * LayerNorm and other element-wise work are not counted. */
double kiln_gpt_flops_per_token(const kiln_gpt_config *cfg, int64_t T);

/* One named parameter tensor: a contiguous range of the slabs. */
#define KILN_MAX_DIMS 4
typedef struct kiln_tensor_info {
    char name[64];  /* Hugging Face GPT-2 name, e.g. "h.3.mlp.c_fc.weight" */
    int64_t offset; /* first element in the slab */
    int64_t numel;
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
    int decay; /* 1: a matrix (2-D: wte, wpe, weights) that weight decay applies to;
                  0: biases and LayerNorm parameters */
    int layer; /* block index, or -1 for embedding and head tensors */
} kiln_tensor_info;

typedef struct kiln_gpt kiln_gpt; /* opaque */

/* What a model keeps from forward for backward, and what it computes again instead; each
 * level also drops what the ones before it drop. */
typedef enum kiln_recompute {
    KILN_RECOMPUTE_NONE = 0,  /* keep every activation */
    KILN_RECOMPUTE_GELU,      /* GELU's output: computed again from its input in backward */
    KILN_RECOMPUTE_ATTENTION, /* also attention's state and output: again from q, k, v */
    KILN_RECOMPUTE_BLOCK,     /* keep each block's input only: the whole block again */
} kiln_recompute;
/* "none", "gelu", "attention", "block" */
kiln_status kiln_recompute_parse(const char *s, kiln_recompute *out);
const char *kiln_recompute_name(kiln_recompute r);

/* Where a model's parameter and gradient slabs come from, instead of its backend (host
 * backends only): alloc(ctx, bytes, what) returns zeroed memory or NULL (what: "parameters"
 * or "gradients"); free(ctx, p, bytes) gets it back. A data-parallel trainer hands memory
 * that the ranks of one machine share (kiln_comm_alloc_shared), so that their gradient
 * reductions read each other's slabs. Both calls come in the same order on every rank. */
typedef struct kiln_slab_allocator {
    void *(*alloc)(void *ctx, size_t bytes, const char *what);
    void (*free)(void *ctx, void *p, size_t bytes);
    void *ctx;
} kiln_slab_allocator;

/* How a model is built. */
typedef struct kiln_gpt_options {
    kiln_dtype dtype;         /* working weights and activations (fp32; bf16, fp16) */
    kiln_recompute recompute; /* none */
    int fuse_gelu;            /* bias and GELU in the MLP product's output pass (1) */
    int fuse_residual_ln;     /* each residual add with the LayerNorm after it (1) */
    /* Rows of logits the head computes at a time in training: the classifier and the
     * cross-entropy run chunk by chunk, and the (B,T,V) logits never exist at once (0: all
     * rows at once, and kiln_gpt_logits holds them). */
    int64_t classifier_chunk;
    int inference; /* forward only: no gradients, one block's activations shared by all */
    /* ZeRO 2 and 3: the parameter and gradient slabs are mapped without being touched, so that a
     * part takes memory only while it is written (its rank's shard, a part gathered for use)
     * and gives it back when discarded (kiln_memory_discard); host backends only. With it,
     * forward and backward call the need hook (kiln_gpt_set_param_need) before each use of
     * a part's parameters. */
    int sharded;
    /* The parameter and gradient slabs' memory (alloc NULL: the backend's); not with
     * sharded, whose slabs are mapped untouched. */
    kiln_slab_allocator slabs;
} kiln_gpt_options;
/* fp32, no recompute, both fusions on, classifier_chunk 0, training. */
kiln_gpt_options kiln_gpt_options_default(void);

/* Build a model for batches of at most B sequences of at most T tokens: all memory
 * (parameters, gradients, activations) is planned and taken here, none in the step.
 * opt NULL: the defaults. be NULL: the CPU backend. Working weights start at zero. */
kiln_status kiln_gpt_create(kiln_gpt **out, const kiln_gpt_config *cfg, int64_t B, int64_t T,
                            const kiln_gpt_options *opt, kiln_backend *be);
/* kiln_gpt_create with the defaults and inference on: no gradient slab, no backward
 * scratch, the blocks sharing one block's activation buffers, which forward alone allows;
 * kiln_gpt_grads is NULL and kiln_gpt_backward fails. `dtype` is the working dtype. */
kiln_status kiln_gpt_create_inference(kiln_gpt **out, const kiln_gpt_config *cfg, int64_t B,
                                      int64_t T, kiln_dtype dtype, kiln_backend *be);
void kiln_gpt_free(kiln_gpt *m);

const kiln_gpt_config *kiln_gpt_get_config(const kiln_gpt *m);
const kiln_gpt_options *kiln_gpt_get_options(const kiln_gpt *m);
kiln_backend *kiln_gpt_backend(const kiln_gpt *m);
kiln_dtype kiln_gpt_dtype(const kiln_gpt *m);
int64_t kiln_gpt_max_batch(const kiln_gpt *m);
int64_t kiln_gpt_max_seq(const kiln_gpt *m);

/* GPT-2's initialisation from a seed: weights N(0, 0.02), the residual projections
 * (attn.c_proj, mlp.c_proj) N(0, 0.02/sqrt(2L)), biases 0, LayerNorm weights 1.
 * kiln_gpt_init_weights writes the working weights (rounded to their dtype);
 * kiln_gpt_init_weights_f32 writes the same values unrounded into an fp32 slab laid out as
 * the model's (an optimizer's master weights), of kiln_gpt_slab_len floats. */
void kiln_gpt_init_weights(kiln_gpt *m, uint64_t seed);
void kiln_gpt_init_weights_f32(const kiln_gpt *m, uint64_t seed, float *slab);
/* The values of [lo, hi) of the slab alone, into dst (hi - lo floats): a shard's (ZeRO 3),
 * without the memory of the whole slab. */
void kiln_gpt_init_weights_f32_range(const kiln_gpt *m, uint64_t seed, int64_t lo, int64_t hi,
                                     float *dst);

/* Slabs: the working weights (kiln_gpt_dtype elements) and the fp32 gradients, in the same
 * order and length. */
void *kiln_gpt_params(kiln_gpt *m);
/* The working weights moved to slab (slab_len elements of the model's dtype, from the
 * model's kiln_slab_allocator, holding them already): the model's views point there from
 * now on, and *old is the slab they left, the caller's to give back. Models whose slabs come
 * from a kiln_slab_allocator only. */
kiln_status kiln_gpt_swap_params(kiln_gpt *m, void *slab, void **old);
float *kiln_gpt_grads(kiln_gpt *m);
int64_t kiln_gpt_slab_len(const kiln_gpt *m); /* elements in each slab, padded rows included */
int kiln_gpt_num_tensors(const kiln_gpt *m);
const kiln_tensor_info *kiln_gpt_tensor(const kiln_gpt *m, int i);
/* Index of a tensor by name, or -1. */
int kiln_gpt_find_tensor(const kiln_gpt *m, const char *name);

/* Bytes of each planned category, and in all. The activation arena holds what forward saves
 * for backward (activations) and scratch whose contents do not outlive a phase (workspace:
 * the attention workspace, the backward's activation gradients, the logits or their chunk,
 * fused ops' temporaries); buffers whose lifetimes do not overlap share bytes, so the two
 * add up to the arena's planned size. */
typedef struct kiln_gpt_memory {
    size_t params, grads, activations, workspace, total;
} kiln_gpt_memory;
kiln_gpt_memory kiln_gpt_memory_plan(const kiln_gpt *m);
/* The same figures for a model not built yet: what kiln_gpt_create would take for cfg at
 * B x T with these options (NULL: defaults) on this backend (NULL: CPU), so that a caller can
 * check a whole plan against the machine before taking any of it. Fails, with a message,
 * where creating the model would fail for the configuration or the sizes. */
kiln_status kiln_gpt_memory_plan_for(const kiln_gpt_config *cfg, int64_t B, int64_t T,
                                     const kiln_gpt_options *opt, kiln_backend *be,
                                     kiln_gpt_memory *out);

/* KILN_OK when every working weight is a finite number; else KILN_ERR_RANGE naming the first
 * tensor that holds a NaN or an infinity. One backend sumsq per tensor: a sum of squares
 * taken in double is finite exactly when every element is. */
kiln_status kiln_gpt_check_finite(const kiln_gpt *m);

/* Forward over inputs (B,T). With targets (B,T) it computes the mean loss into *loss
 * (NULL targets: logits only, *loss untouched and may be NULL). Ids are checked:
 * an id >= V fails with KILN_ERR_RANGE and a message naming its position. */
kiln_status kiln_gpt_forward(kiln_gpt *m, const int32_t *inputs, const int32_t *targets, int64_t B,
                             int64_t T, float *loss);
/* Forward over inputs (B,T) that computes the logits of each sequence's last position
 * only, for generation: kiln_gpt_logits then holds (B,Vp). The blocks run in full; the
 * head, which dominates small models, runs on B rows instead of B*T. */
kiln_status kiln_gpt_forward_last(kiln_gpt *m, const int32_t *inputs, int64_t B, int64_t T);

/* Generation with a cache: kiln_gpt_enable_cache takes memory for every layer's q, k and v
 * rows at each planned position (L x maxB x maxT x 3 x n_head x head_size elements of the
 * model's dtype), for an inference model on a backend with attention_decode
 * (KILN_ERR_UNSUPPORTED otherwise). kiln_gpt_forward_cached then runs only the new positions
 * t0..t0+T-1 of inputs (B,T) through the model, their attention reading the cached
 * positions before them, and leaves the logits of each sequence's last position in
 * kiln_gpt_logits (B,Vp) as kiln_gpt_forward_last does for the whole window: the same
 * values up to the order of floating-point sums. t0 0 starts afresh; otherwise t0 is at most
 * the positions cached so far (a later t0 would skip positions), the batch the same, and
 * t0 + T at most maxT. Past maxT, learned positions being absolute, a window that slides past
 * the context must be run whole (kiln_gpt_forward_last); rotary positions go on in the cache
 * one at a time (T 1, t0 the positions run so far), each attending over the last maxT
 * positions, as kiln_gpt_forward_last over those positions computes (attention sees only
 * the differences of rotary positions). Their cache holds 2 maxT rows a sequence for it and
 * moves the last maxT - 1 to its front once every maxT + 1 positions. */
kiln_status kiln_gpt_enable_cache(kiln_gpt *m);
kiln_status kiln_gpt_forward_cached(kiln_gpt *m, const int32_t *inputs, int64_t B, int64_t t0,
                                    int64_t T);

/* Logits (rows,Vp) of the last forward in the model's dtype, valid until backward, which
 * overwrites them in place with their gradient; the padded columns are not meaningful. NULL
 * after a training forward of a chunked head (classifier_chunk > 0), which keeps none. */
const void *kiln_gpt_logits(const kiln_gpt *m);
/* The first `rows` rows of the last forward's logits widened to fp32 into a host buffer
 * (rows x Vp floats). */
kiln_status kiln_gpt_logits_f32(const kiln_gpt *m, int64_t rows, float *out);
/* Distillation: until cleared (p NULL), forward_backward's loss is alpha x the cross-entropy
 * with the targets + (1 - alpha) x T^2 x KL(p || softmax(logits / T)) per position (Hinton
 * et al.'s soft targets, T the temperature), and its gradient flows back; p holds, for each of
 * the B*T positions of the coming batch, the teacher's softmax(logits / T) over the V tokens
 * (rows of V floats, the caller's, alive until the call). An fp32 model on the CPU
 * backend; the reported loss is the mixed one. */
kiln_status kiln_gpt_set_soft_targets(kiln_gpt *m, const float *p, float alpha, float temperature);

/* Per-position losses (B,T) of the last forward with targets. */
const float *kiln_gpt_losses(const kiln_gpt *m);

/* Backward of the last forward (which must have had targets). Gradients are ADDED to the
 * gradient slab, for gradient accumulation; the loss differentiated is
 * grad_scale x mean loss (grad_scale = 1 / micro-steps averages over micro-batches; a loss
 * scale multiplies it too). */
kiln_status kiln_gpt_backward(kiln_gpt *m, float grad_scale);
/* Forward with targets and backward in one call: the head's classifier, cross-entropy and
 * their backward run chunk by chunk together (classifier_chunk), so the logits are
 * computed once and never held whole. What the trainer calls. */
kiln_status kiln_gpt_forward_backward(kiln_gpt *m, const int32_t *inputs, const int32_t *targets,
                                      int64_t B, int64_t T, float grad_scale, float *loss);
void kiln_gpt_zero_grad(kiln_gpt *m);

/* ---- the model in parts: the embedding, ranges of blocks, the head ----
 * What kiln_gpt_forward_backward runs, as calls of their own, so that a caller can run part of
 * the model (a pipeline stage: a range of blocks, with the embedding in front or the head
 * behind) and move the residual stream between parts itself. One training pass is
 *
 *   kiln_gpt_begin(m, inputs, targets, B, T)
 *   kiln_gpt_embed_forward(m)                     or write the stream into kiln_gpt_stream(m, first)
 *   kiln_gpt_blocks_forward(m, first, last)       any ranges, in order
 *   kiln_gpt_head_forward_backward(m, scale, &loss)   or write the gradient of the stream
 *                                                  leaving block last-1 into kiln_gpt_stream_grad
 *   kiln_gpt_blocks_backward(m, first, last)      the same ranges, in reverse order
 *   kiln_gpt_embed_backward(m)                    or read kiln_gpt_stream_grad: the gradient of
 *                                                  the stream entering block first
 *
 * and gives the same loss and gradients, bit for bit in fp32, as kiln_gpt_forward_backward,
 * whatever the ranges (tests/unit/test_gpt_parts.c): a block whose previous block ran in
 * another call computes its own first norm, which a fused tail would otherwise have computed.
 * kiln_gpt_head_forward and kiln_gpt_head_backward split the head's pass in two as
 * kiln_gpt_forward and kiln_gpt_backward do. Parameter hooks (kiln_gpt_set_param_need) and
 * gradient reports (kiln_gpt_set_grad_ready) fire for the parts each call runs. */

/* The batch of the coming pass: inputs (B,T) for the embedding (NULL for a part that does not
 * embed), targets (B,T) for the loss (NULL: none), ids checked as kiln_gpt_forward checks
 * them. */
kiln_status kiln_gpt_begin(kiln_gpt *m, const int32_t *inputs, const int32_t *targets,
                           int64_t B, int64_t T);
kiln_status kiln_gpt_embed_forward(kiln_gpt *m);
/* Blocks first..last-1 forward (0 <= first <= last <= n_layer), reading the stream entering
 * block first. */
kiln_status kiln_gpt_blocks_forward(kiln_gpt *m, int64_t first, int64_t last);
/* The residual stream entering block l (l = n_layer: the last block's output), (B,T,C) of the
 * model's dtype in the backend's memory; NULL for l outside 0..n_layer. */
void *kiln_gpt_stream(kiln_gpt *m, int64_t l);
/* The gradient of the stream, (B,T,C) in the model's dtype in the backend's memory: before
 * kiln_gpt_blocks_backward(m, first, last), of the stream leaving block last-1 (the head's
 * backward leaves it there); after it, of the stream entering block first. */
void *kiln_gpt_stream_grad(kiln_gpt *m);
/* The final norm, classifier and loss: as kiln_gpt_forward's head (targets: the loss into
 * *loss; none: the logits). */
kiln_status kiln_gpt_head_forward(kiln_gpt *m, float *loss);
/* The head's backward after kiln_gpt_head_forward with targets, as kiln_gpt_backward's. */
kiln_status kiln_gpt_head_backward(kiln_gpt *m, float grad_scale);
/* The head forward and backward in one pass, chunk by chunk, as kiln_gpt_forward_backward's;
 * needs targets. */
kiln_status kiln_gpt_head_forward_backward(kiln_gpt *m, float grad_scale, float *loss);
/* Blocks last-1 down to first backward, from the gradient in kiln_gpt_stream_grad. */
kiln_status kiln_gpt_blocks_backward(kiln_gpt *m, int64_t first, int64_t last);
kiln_status kiln_gpt_embed_backward(kiln_gpt *m);

/* Called during backward each time a range [lo, hi) of the gradient slab (elements) holds its
 * final value for this backward pass: ln_f, then blocks L-1..0, then the embeddings (wte and
 * wpe together: the classifier's backward adds to wte too; but see
 * kiln_gpt_set_embed_rows_apart). The ranges of one pass cover the
 * slab exactly once, in decreasing offset order, in every recompute mode and classifier chunk.
 * "Final" is for this pass: gradients accumulate over passes (kiln_gpt_backward), so with
 * accumulation only the last micro-batch's reports hold the step's sums. The backend has
 * finished writing a range before fn is called. fn may start communication on the range; it
 * must not write to the slab outside it. fn NULL clears. */
typedef void (*kiln_grad_ready_fn)(void *ctx, int64_t lo, int64_t hi);
void kiln_gpt_set_grad_ready(kiln_gpt *m, kiln_grad_ready_fn fn, void *ctx);
/* Parameters gathered on demand (ZeRO 3): before forward or backward reads the parameters of
 * part `part` (-1: the embeddings wte and wpe; 0..L-1: a block; L: ln_f; the parts of
 * kiln_gpt_grad_ranges), it calls fn(ctx, part, next), and fn must make that part's range of
 * the parameter slab hold the current weights before it returns. `next` is the part it will
 * need after this one (-2: none known), which fn may start fetching. A failure stops the pass
 * with fn's status. NULL clears. */
typedef kiln_status (*kiln_param_need_fn)(void *ctx, int part, int next);
void kiln_gpt_set_param_need(kiln_gpt *m, kiln_param_need_fn fn, void *ctx);
/* Inference on other weights than the slab's: the matrix products of the blocks and the tied
 * head go to `forward` instead of the backend's matmul_forward (a quantized model's integer
 * products). forward computes out (N,OC) = inp (N,C) x matrix `which` of block `layer` (the
 * head: layer -1, OC = Vp) + bias (OC; NULL: none), fp32 in host memory; GELU, where the
 * model fuses it, runs after it. Once the call succeeds the model owns ctx: kiln_gpt_free
 * calls release(ctx) (NULL: nothing); when it fails the caller keeps it. Only for a model
 * built for inference in fp32 on a host backend (cpu, ref); the working weights of those
 * matrices are then not read, except wte's rows by the embedding. */
typedef enum kiln_gpt_matrix {
    KILN_GPT_MATRIX_QKV = 0, /* attn.c_attn (C,3C) */
    KILN_GPT_MATRIX_ATTPROJ, /* attn.c_proj (C,C) */
    KILN_GPT_MATRIX_FC,      /* mlp.c_fc (C,4C) */
    KILN_GPT_MATRIX_FCPROJ,  /* mlp.c_proj (4C,C) */
    KILN_GPT_MATRIX_HEAD,    /* wte (Vp,C), transposed */
} kiln_gpt_matrix;
/* layer: the block of weights (with shared blocks, the layer's block); -1 for the head. */
typedef void (*kiln_gpt_linear_fn)(void *ctx, int64_t layer, kiln_gpt_matrix which, float *out,
                                   const float *inp, const float *bias, int64_t N, int64_t C,
                                   int64_t OC);
kiln_status kiln_gpt_set_linear(kiln_gpt *m, kiln_gpt_linear_fn forward, void *ctx,
                                void (*release)(void *ctx));
/* Whether m's products run outside the backend: its slab then lacks those matrices. */
int kiln_gpt_has_linear(const kiln_gpt *m);

/* [lo, hi) of the parameter slab that part `part` covers (as above). */
void kiln_gpt_part_range(const kiln_gpt *m, int part, int64_t *lo, int64_t *hi);
/* The ranges themselves, in the order backward reports them: blocks + 2 ranges, of which
 * the first `max` are written to lo[] and hi[]; returns their count. */
int kiln_gpt_grad_ranges(const kiln_gpt *m, int64_t *lo, int64_t *hi, int max);

/* The embedding's rows apart (data parallelism): the tied wte's gradient is the classifier's
 * (dense, computed first in backward) plus the embedding's (one row of dout per token, added
 * last). With on, backward leaves the embedding's rows out of wte's gradient and reports
 * wte's range right after the classifier, so that its reduction (47% of a d12's gradient)
 * runs while the blocks compute; the reports are then wte, ln_f, blocks L-1..0, and wpe (the
 * rest of the embeddings' part) last, the order kiln_gpt_grad_ranges_apart gives. After such
 * a backward, kiln_gpt_embed_rows gives what the caller adds into wte's gradient: row ids[i]
 * += rows[i] (C values of the model's dtype), i < n. Host backends. Stays until set again. */
void kiln_gpt_set_embed_rows_apart(kiln_gpt *m, int on);
int kiln_gpt_grad_ranges_apart(const kiln_gpt *m, int64_t *lo, int64_t *hi, int max);
void kiln_gpt_embed_rows(const kiln_gpt *m, const int32_t **ids, const void **rows, int64_t *n);
/* [lo, hi) of wte's tensor in the slab (its padded rows included). */
void kiln_gpt_wte_range(const kiln_gpt *m, int64_t *lo, int64_t *hi);

#ifdef __cplusplus
}
#endif
#endif
