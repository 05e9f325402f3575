/* kiln: smaller models for deployment. GGUF export: a trained GPT-2 or Llama model and its
 * tokenizer in the file format llama.cpp runs. Post-training quantization: int8 or int4 weights that
 * kiln eval and kiln sample run with integer products. Low-rank factorisation: block matrices
 * as products of two thin factors, through a truncated SVD. */
#ifndef KILN_COMPRESS_H
#define KILN_COMPRESS_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/model.h"
#include "kiln/status.h"
#include "kiln/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The type the matrices are stored in. f32 and f16 keep every weight (f16 rounded to
 * nearest even); q8_0 stores blocks of 32 weights as 8-bit integers with an f16 scale
 * (8.5 bits a weight), q4_0 as 4-bit integers with an f16 scale (4.5 bits a weight).
 * Norm weights and biases stay f32 in every type, GPT-2's position embedding too in the
 * quantized ones. */
typedef enum kiln_gguf_type {
    KILN_GGUF_F32 = 0,
    KILN_GGUF_F16,
    KILN_GGUF_Q8_0,
    KILN_GGUF_Q4_0,
} kiln_gguf_type;

/* "f32", "f16", "q8_0", "q4_0" */
const char *kiln_gguf_type_name(kiln_gguf_type t);
kiln_status kiln_gguf_type_parse(const char *name, kiln_gguf_type *out);

/* Write model m with tokenizer tok (its vocabulary must be the model's) as a GGUF version 3
 * file at path: the hyperparameters, the tokenizer (tokens in GPT-2's byte-to-character
 * alphabet, merges, the end-of-text token), and every weight (the token embedding's padded
 * rows left out; shared blocks written once per layer). A GPT-2 is llama.cpp's "gpt2", its
 * matrices transposed to ggml's (out, in) rows. A Llama is llama.cpp's "llama": the matrices
 * are already (out, in), and q's and k's rows are permuted within each head so that llama.cpp's
 * rotation of channel pairs (2i, 2i + 1) is the model's rotate-half of (i, i + hs/2); a tied
 * head has no "output" tensor. name goes in general.name. The file is written under a
 * temporary name and renamed: whole or not at all. Quantized types need the matrices' rows
 * (n_embd, the attention's width, the MLP's) a multiple of 32. */
kiln_status kiln_export_gguf(kiln_gpt *m, const kiln_tokenizer *tok, kiln_gguf_type type,
                             const char *name, const char *path);

/* Quantize n weights (n a multiple of 32) into GGUF blocks: q8_0 writes n / 32 blocks of 34
 * bytes, q4_0 of 18. And back, for tests and for the error a type makes. */
void kiln_quantize_q8_0(void *dst, const float *x, int64_t n);
void kiln_quantize_q4_0(void *dst, const float *x, int64_t n);
void kiln_dequantize_q8_0(float *y, const void *src, int64_t n);
void kiln_dequantize_q4_0(float *y, const void *src, int64_t n);

/* ---- unstructured pruning ----
 * Magnitude pruning of the blocks' matrices (attn.c_attn, attn.c_proj, mlp.c_fc,
 * mlp.c_proj); the embeddings (the tied head), LayerNorms and biases are never pruned. */
typedef enum kiln_prune_scope {
    KILN_PRUNE_GLOBAL = 0, /* one threshold over every prunable weight */
    KILN_PRUNE_LAYER,      /* the same fraction of each matrix */
} kiln_prune_scope;
/* "global", "layer" */
kiln_status kiln_prune_scope_parse(const char *name, kiln_prune_scope *out);

/* Whether tensor i of m is pruned (a block matrix). */
int kiln_prune_tensor(const kiln_gpt *m, int i);

/* The fraction `sparsity` (0..1) of the prunable weights of the fp32 slab w (laid out as m's)
 * with the smallest magnitudes, set to zero: exactly round(sparsity x n) of them (ties broken
 * by position). keep (slab length, may be NULL): 1 for a weight kept, 0 for one pruned,
 * 1 outside the prunable tensors. Weights already zero count among the smallest. */
kiln_status kiln_prune_magnitude(const kiln_gpt *m, float *w, double sparsity,
                                 kiln_prune_scope scope, uint8_t *keep);

/* Zhu and Gupta's gradual schedule ("To prune, or not to prune", 2017): the target sparsity
 * at step t rises from s_init at t0 to s_final at t1 as s_final + (s_init - s_final) x
 * (1 - (t - t0) / (t1 - t0))^3, fast at first and slowly at the end; s_init before t0,
 * s_final from t1 on (t0 == t1: one shot). */
double kiln_prune_schedule(double s_init, double s_final, int64_t t0, int64_t t1, int64_t t);

/* ---- structured pruning ----
 * Whole attention heads and MLP neurons removed and the model rebuilt narrower: n_head
 * smaller (head_size kept) and mlp_hidden smaller, the same count in every block, each block
 * keeping its own highest-scoring ones. Head h of a block is its q, k and v columns in
 * attn.c_attn (weights and bias) and its rows of attn.c_proj; MLP neuron j is column j of
 * mlp.c_fc (and its bias) and row j of mlp.c_proj. */
typedef enum kiln_importance {
    /* first-order Taylor estimate of the loss change when the group is removed (Molchanov
     * et al., "Importance Estimation for Neural Network Pruning", 2019): per batch,
     * (sum over the group's weights of weight x gradient)^2, summed over calibration batches */
    KILN_IMPORTANCE_TAYLOR = 0,
    KILN_IMPORTANCE_MAGNITUDE, /* the L2 norm of the group's weights: no data needed */
} kiln_importance;
/* "taylor", "magnitude" */
kiln_status kiln_importance_parse(const char *name, kiln_importance *out);

/* Scores of m's heads into head[b * n_head + h] and of its neurons into
 * neuron[b * H + j], b over the blocks of weights (kiln_gpt_config_blocks), H the MLP width.
 * magnitude sets them from the fp32 slab w; taylor_add adds one batch's from w and the
 * gradient slab g; calibrate zeroes m's gradients and runs `batches` batches of l (from
 * where it stands) forward and backward through m (fp32, with gradients), adding each
 * batch's Taylor scores; *mean_loss (may be NULL) is their mean loss. */
kiln_status kiln_struct_scores_magnitude(const kiln_gpt *m, const float *w, double *head,
                                         double *neuron);
kiln_status kiln_struct_scores_taylor_add(const kiln_gpt *m, const float *w, const float *g,
                                          double *head, double *neuron);
struct kiln_loader;
kiln_status kiln_struct_scores_calibrate(kiln_gpt *m, struct kiln_loader *l, int64_t B,
                                         int64_t T, int64_t batches, double *head,
                                         double *neuron, double *mean_loss);

/* A new fp32 model (for inference: save it, or load it to train) holding m's weights with
 * only the keep_heads highest-scoring heads and the keep_neurons highest-scoring neurons of
 * each block (ties: the lower index), in their order. Its outputs equal m's with the removed
 * heads' rows of attn.c_proj and the removed neurons' rows of mlp.c_proj set to zero.
 * heads_kept (blocks x keep_heads) and neurons_kept (blocks x keep_neurons), may be NULL:
 * which were kept, ascending. A count below 1 (a layer with no head) or above m's is
 * KILN_ERR_ARG. */
kiln_status kiln_prune_structured(const kiln_gpt *m, const double *head, const double *neuron,
                                  int64_t keep_heads, int64_t keep_neurons, kiln_gpt **out,
                                  int64_t *heads_kept, int64_t *neurons_kept);

/* Zeros of the fp32 slab w in each prunable tensor, and over them all: per-tensor sparsity
 * as a JSON object {"h.0.attn.c_attn.weight": 0.5, ..., "all": 0.5} into out (cap bytes). */
void kiln_prune_report(const kiln_gpt *m, const float *w, char *out, size_t cap,
                       double *overall);

/* ---- post-training quantization (kiln's own inference) ----
 *
 * The matrices of the blocks (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) and the tied
 * token embedding wte are quantized symmetrically: int8 per output channel (scale =
 * max|w| / 127 over the channel's inputs), int4 per group of G inputs of an output channel
 * (scale = max|w| / 7). Biases, LayerNorms and wpe stay fp32.
 *
 * The file is safetensors: each quantized matrix under its Hugging Face name, stored
 * transposed, (out, in), so that a row is an output channel (wte keeps its (V, C)): I8
 * (out, in) for int8; U8 (out, in / 2) for int4, input 2i in the low nibble of byte i and
 * 2i+1 in the high one, each holding its value + 8. Its scales are "<name>_scale", F32 (out)
 * for int8 and (out, in / G) for int4. Metadata: kiln's configuration keys, KILN_ST_META_QUANT
 * ("int8" or "int4"), KILN_ST_META_QUANT_GROUP (G, int4 only), KILN_ST_META_QUANT_VERSION (the
 * layout's version, KILN_QUANT_VERSION; a file without it is of version 1, and one of a version
 * past this kiln's is refused as written by a newer kiln). Dense loaders refuse such a file
 * (kiln_gpt_load_safetensors names it as quantized). */
#define KILN_ST_META_QUANT "kiln.quant"
#define KILN_ST_META_QUANT_GROUP "kiln.quant.group"
#define KILN_ST_META_QUANT_VERSION "kiln.quant_version"
#define KILN_QUANT_VERSION 1

typedef enum kiln_quant_type {
    KILN_QUANT_NONE = 0, /* a dense file */
    KILN_QUANT_INT8,
    KILN_QUANT_INT4,
} kiln_quant_type;

/* "none", "int8", "int4" */
const char *kiln_quant_type_name(kiln_quant_type t);
/* Whether a tensor (by its Hugging Face name) is one of the matrices quantized: the blocks'
 * four and the tied embedding (quantization-aware training fakes the same ones). */
int kiln_quant_is_matrix(const char *name);
/* "int8" or "int4"; KILN_ERR_ARG naming the choices otherwise. */
kiln_status kiln_quant_type_parse(const char *name, kiln_quant_type *out);

/* One matrix. w is (K,N) (kiln's (in, out)) when trans == 0, (N,K) when trans == 1 (wte);
 * q receives (N,K) int8 and scale (N); int4: q (N, K/2) bytes and scale (N, K/G), G a
 * multiple of 8 dividing K (else KILN_ERR_ARG). A channel (group) of zeros has scale 0. */
void kiln_quant_int8(int8_t *q, float *scale, const float *w, int64_t K, int64_t N, int trans);
kiln_status kiln_quant_int4(uint8_t *q, float *scale, const float *w, int64_t K, int64_t N,
                            int64_t G, int trans);
/* And back: w (N,K) = q x scale. */
void kiln_dequant_int8(float *w, const int8_t *q, const float *scale, int64_t N, int64_t K);
void kiln_dequant_int4(float *w, const uint8_t *q, const float *scale, int64_t N, int64_t K,
                       int64_t G);

/* Write fp32 model m quantized to `type` (group: inputs per scale for int4; 0: 32) at path,
 * atomically (a temporary file renamed: whole or not at all, an existing file untouched on
 * failure). KILN_ERR_ARG when the group does not divide n_embd or is not a multiple of 8. */
kiln_status kiln_quant_save(kiln_gpt *m, kiln_quant_type type, int64_t group, const char *path);

/* Whether the safetensors file at path is quantized: *type (KILN_QUANT_NONE for a dense file)
 * and *group (0 unless int4; may be NULL). KILN_ERR_FORMAT for a "kiln.quant" kiln does not
 * know; KILN_ERR_UNSUPPORTED, naming the version, for a quantized file of a version past
 * KILN_QUANT_VERSION (written by a newer kiln). */
kiln_status kiln_quant_probe(const char *path, kiln_quant_type *type, int64_t *group);

/* A model for inference from a quantized file, planned for B x T (T 0 or past the context:
 * the context): its block matrices and head run through the int8 kernel (AVX512-VNNI where
 * the CPU has it, else a plain kernel with the same results; int4 unpacked to int8 on the
 * fly), activations quantized per row in the kernel's first pass; everything else in fp32 on
 * the CPU backend. The embedding reads wte dequantized. */
kiln_status kiln_quant_load(kiln_gpt **out, const char *path, int64_t B, int64_t T);
/* The kernel kiln_quant_load's models use on this machine: "avx512-vnni" or "plain". */
const char *kiln_quant_kernel_name(void);

/* ---- low-rank factorisation ----
 *
 * A block matrix W (in, out) becomes two factors, U (in, r) and V (r, out), so that the
 * product runs as (x U) V + b with r (in + out) weights instead of in x out. The factors come
 * from W's truncated singular value decomposition W ~ U_r S_r V_r^T, split evenly:
 * U = U_r sqrt(S_r), V = sqrt(S_r) V_r^T. A model holds them as "<name>.weight_u" and
 * "<name>.weight_v" in place of "<name>.weight" (kiln_gpt_config.rank). */

/* The kinds of block matrices by kiln_gpt_matrix (QKV..FCPROJ): "qkv", "attproj", "fc",
 * "fcproj"; NULL for others. */
const char *kiln_lowrank_kind_name(kiln_gpt_matrix kind);
/* A comma-separated list of kind names into want[4] (1: listed); KILN_ERR_ARG naming an
 * unknown or repeated kind, or an empty list. */
kiln_status kiln_lowrank_kinds_parse(const char *list, int want[4]);

/* The thin SVD of w (K,N), row-major, through LAPACK (sgesdd; sgesvd where it does not
 * converge): s receives the k = min(K,N) singular values in decreasing order, u (K,k) and
 * vt (k,N) the singular vectors, row-major. w is left as it is. KILN_ERR_NOMEM, or
 * KILN_ERR_RANGE when LAPACK fails (a non-finite input). */
kiln_status kiln_lowrank_svd(const float *w, int64_t K, int64_t N, float *s, float *u, float *vt);
/* The fraction of the squared singular values s[0..k) that the first r keep (1 for a zero
 * matrix). */
double kiln_lowrank_energy(const float *s, int64_t k, int64_t r);
/* The smallest r (1..k) whose first r singular values keep at least `energy` (0..1] of the
 * squared total, less 1e-9 of it (fp32's rounding noise: energy 1 keeps the values above
 * it, the full rank of a matrix of lower rank). */
int64_t kiln_lowrank_rank_for_energy(const float *s, int64_t k, double energy);
/* The balanced factors of rank r (r <= k) from an SVD of (K,N) with k values: U (K,r) =
 * u[:, :r] sqrt(s), V (r,N) = sqrt(s) vt[:r, :]. */
void kiln_lowrank_split(float *U, float *V, const float *u, const float *s, const float *vt,
                        int64_t K, int64_t N, int64_t k, int64_t r);

/* What kiln_lowrank_factor did to one kind of matrix. */
typedef struct kiln_lowrank_report {
    int64_t rank;                     /* 0: the kind was left dense */
    int64_t in, out;                  /* the matrix's shape */
    double energy_min, energy_mean;   /* of the squared singular values kept, over blocks */
    int64_t params_before, params_after; /* the kind's weights over all blocks */
} kiln_lowrank_report;

/* A factored copy of the fp32 model `dense` (not factored itself): each kind listed in
 * want[4] (kiln_gpt_matrix order) of every block truncated to one rank for the kind: `rank`
 * when it is > 0, else the smallest rank at which every block keeps at least `energy`
 * (0..1] of its squared singular values. Every other tensor is copied. *out: an fp32
 * inference model of 1 x 1 (the caller saves it; kiln_gpt_free); report[4] (may be NULL)
 * says per kind what was done. KILN_ERR_ARG for an energy outside (0,1], a rank outside
 * 1..min(in,out)-1 or one that does not reduce a kind's weights (r (in + out) >= in x out),
 * and for a dense model that is factored already. */
kiln_status kiln_lowrank_factor(kiln_gpt *dense, const int want[4], double energy, int64_t rank,
                                kiln_gpt **out, kiln_lowrank_report report[4]);

/* ---- how far a smaller model is from its source ---- */
struct kiln_loader;
/* KL(teacher || m), the mean over every position of the first `batches` batches of l (0: all,
 * in file order from the start; l opened for evaluation with B, T) of sum_v p_teacher(v) x
 * (log p_teacher(v) - log p_m(v)), in nats per token: how much of the teacher's next-token
 * distribution the model loses (0: the same). Both models inference models of B x T or more
 * with the same vocabulary; m may be quantized. */
kiln_status kiln_evaluate_kl(kiln_gpt *teacher, kiln_gpt *m, struct kiln_loader *l, int64_t B,
                             int64_t T, int64_t batches, double *kl);

#ifdef __cplusplus
}
#endif

#endif
