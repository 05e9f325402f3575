/* kiln: the op interface.
 *
 * A backend is a table of kernels. Model and optimizer code call these and never loop
 * over elements themselves. Every backend's every op is tested against the plain
 * reference backend (kiln_backend_ref) on the same inputs.
 *
 * Conventions (llm.c's): outputs first, then inputs, then sizes. Shapes are row-major.
 * Backward kernels ACCUMULATE into parameter gradients (+=) and WRITE activation
 * gradients (=), with one exception named at layernorm_backward. All sizes in elements.
 * N is the number of token positions (B*T). */
#ifndef KILN_BACKEND_H
#define KILN_BACKEND_H

#include <stdint.h>

#include "kiln/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the ops ----
 * Each op's signature is written once, as a function type; the table, and every backend's
 * declarations of its kernels, are made from these types and from KILN_BACKEND_OPS, so a
 * backend cannot drift from the interface: a kernel whose signature differs does not
 * compile. */

/* out (B,T,C) = wte[inp[b,t]] + wpe[t]; inp (B,T) holds ids already checked < V. */
typedef void kiln_op_encoder_forward(float *out, const int32_t *inp, const float *wte,
                                     const float *wpe, int64_t B, int64_t T, int64_t C);
/* dwte (V,C) += and dwpe (T,C) += from dout (B,T,C). */
typedef void kiln_op_encoder_backward(float *dwte, float *dwpe, const float *dout,
                                      const int32_t *inp, int64_t B, int64_t T, int64_t C);

/* out (N,C) = (inp - mean) * rstd * weight + bias; mean, rstd (N) are saved for backward.
 * eps = 1e-5 as in GPT-2. */
typedef void kiln_op_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                       const float *weight, const float *bias, int64_t N,
                                       int64_t C);
/* dweight, dbias (C) +=. dinp (N,C) += as well: layernorm's input is the residual stream,
 * whose gradient is the sum of its branches, so this op adds its part in place. */
typedef void kiln_op_layernorm_backward(float *dinp, float *dweight, float *dbias,
                                        const float *dout, const float *inp, const float *weight,
                                        const float *mean, const float *rstd, int64_t N, int64_t C);

/* out (N,OC) = inp (N,C) x W + bias (OC, may be NULL).
 * W is (C,OC) when trans_w == 0 (Hugging Face GPT-2's Conv1D layout) and (OC,C) when
 * trans_w == 1 (the output head, which is the token embedding (Vp,C)). */
typedef void kiln_op_matmul_forward(float *out, const float *inp, const float *weight,
                                    const float *bias, int64_t N, int64_t C, int64_t OC,
                                    int trans_w);
/* dinp (N,C) = dout x W^T (written; skipped when dinp is NULL),
 * dweight (layout as W) += inp^T x dout, dbias (OC) += column sums of dout (NULL: none). */
typedef void kiln_op_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                     const float *inp, const float *weight, int64_t N, int64_t C,
                                     int64_t OC, int trans_w);

/* Causal self-attention. qkv (B,T,3C) holds q, k, v for each position, each (NH heads x
 * hs = C/NH channels). att (B,NH,T,T) receives the softmax probabilities (entries above
 * the diagonal are 0) and out (B,T,C) the heads' outputs, heads side by side. */
typedef void kiln_op_attention_forward(float *out, float *att, const float *qkv, int64_t B,
                                       int64_t T, int64_t C, int64_t NH);
/* dqkv (B,T,3C) written. scratch holds at least B*NH*T*T floats. */
typedef void kiln_op_attention_backward(float *dqkv, float *scratch, const float *dout,
                                        const float *qkv, const float *att, int64_t B, int64_t T,
                                        int64_t C, int64_t NH);

/* GELU, tanh approximation (GPT-2's). */
typedef void kiln_op_gelu_forward(float *out, const float *inp, int64_t n);
typedef void kiln_op_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t n);

/* out = a + b, n elements. */
typedef void kiln_op_residual_forward(float *out, const float *a, const float *b, int64_t n);

/* Softmax cross-entropy over the first V of the Vp columns of logits (N,Vp).
 * losses (N) written with -log p[target]. When dlogits is not NULL it is written with
 * (softmax - onehot(target)) * dloss for the first V columns and 0 for the padded ones;
 * dlogits may be the same pointer as logits. Targets are already checked < V. */
typedef void kiln_op_crossentropy_forward_backward(float *losses, float *dlogits,
                                                   const float *logits, const int32_t *targets,
                                                   float dloss, int64_t N, int64_t V, int64_t Vp);

/* ---- optimizer kernels, over n contiguous elements of the slabs ----
 * AdamW/Adam: m = b1 m + (1-b1) g'; v = b2 v + (1-b2) g'^2;
 *   p -= lr * (m / bc1) / (sqrt(v / bc2) + eps) + lr * decoupled_wd * p
 *   where g' = g + l2_wd * p, bc1 = 1 - b1^t, bc2 = 1 - b2^t (PyTorch's order of terms:
 *   decoupled decay is applied to p first, p *= 1 - lr * decoupled_wd). */
typedef void kiln_op_adam_update(float *p, const float *g, float *m, float *v, int64_t n, float lr,
                                 float b1, float b2, float bc1, float bc2, float eps,
                                 float decoupled_wd, float l2_wd);
/* SGD, PyTorch's semantics: g' = g + wd p; buf = momentum buf + (1-dampening) g'
 * (buf = g' on the first step, first != 0); step = nesterov ? g' + momentum buf : buf;
 * p -= lr step. momentum == 0: plain SGD and buf is unused (may be NULL). */
typedef void kiln_op_sgd_update(float *p, const float *g, float *buf, int64_t n, float lr,
                                float momentum, float dampening, int nesterov, float wd, int first);
/* RMSprop, PyTorch's semantics (centered = 0): g' = g + wd p;
 * sq = alpha sq + (1-alpha) g'^2; if momentum > 0: buf = momentum buf + g'/(sqrt(sq)+eps),
 * p -= lr buf; else p -= lr g'/(sqrt(sq)+eps). */
typedef void kiln_op_rmsprop_update(float *p, const float *g, float *sq, float *buf, int64_t n,
                                    float lr, float alpha, float eps, float wd, float momentum);
/* Sum of squares of x in double (for the global gradient norm). */
typedef double kiln_op_sumsq(const float *x, int64_t n);
/* x *= s */
typedef void kiln_op_scale(float *x, float s, int64_t n);
/* x = 0 */
typedef void kiln_op_zero(float *x, int64_t n);

/* Optional: called when a model is built on a backend, to check that the process can give
 * the backend what it takes for itself (OpenBLAS's work buffers, say) before any kernel
 * runs. */
typedef kiln_status kiln_op_prepare(void);

/* The required ops, in table order: X(arg, name) for each kiln_op_<name>. */
#define KILN_BACKEND_OPS(X, arg)                                                                   \
    X(arg, encoder_forward)                                                                        \
    X(arg, encoder_backward)                                                                       \
    X(arg, layernorm_forward)                                                                      \
    X(arg, layernorm_backward)                                                                     \
    X(arg, matmul_forward)                                                                         \
    X(arg, matmul_backward)                                                                        \
    X(arg, attention_forward)                                                                      \
    X(arg, attention_backward)                                                                     \
    X(arg, gelu_forward)                                                                           \
    X(arg, gelu_backward)                                                                          \
    X(arg, residual_forward)                                                                       \
    X(arg, crossentropy_forward_backward)                                                          \
    X(arg, adam_update)                                                                            \
    X(arg, sgd_update)                                                                             \
    X(arg, rmsprop_update)                                                                         \
    X(arg, sumsq)                                                                                  \
    X(arg, scale)                                                                                  \
    X(arg, zero)

/* The table a backend fills: every op of KILN_BACKEND_OPS, then the optional ones (NULL
 * when the backend has none). */
#define KILN_BACKEND_FIELD_(unused, op) kiln_op_##op *op;
typedef struct kiln_backend {
    const char *name;
    KILN_BACKEND_OPS(KILN_BACKEND_FIELD_, _)
    kiln_op_prepare *prepare; /* optional */
} kiln_backend;
#undef KILN_BACKEND_FIELD_

/* For a backend's own code: KILN_BACKEND_DECLARE(kiln__cpu_) declares its kernels
 * kiln__cpu_encoder_forward, ... with the interface's types, and KILN_BACKEND_FILL(kiln__cpu_)
 * fills a designated initialiser of its table with them. */
#define KILN_BACKEND_DECLARE_ONE_(prefix, op) kiln_op_##op prefix##op;
#define KILN_BACKEND_DECLARE(prefix) KILN_BACKEND_OPS(KILN_BACKEND_DECLARE_ONE_, prefix)
#define KILN_BACKEND_FILL_ONE_(prefix, op) .op = prefix##op,
#define KILN_BACKEND_FILL(prefix) KILN_BACKEND_OPS(KILN_BACKEND_FILL_ONE_, prefix)
/* The plain reference: single-threaded loops written for clarity, the ground truth that
 * tests compare every other backend against. */
const kiln_backend *kiln_backend_ref(void);

/* The CPU backend: OpenBLAS (OpenMP build) for matrix products, OpenMP for the rest. */
const kiln_backend *kiln_backend_cpu(void);

/* The fp32 GEMM rate of this machine with the GEMM the CPU backend uses, in GFLOP/s:
 * the best of a few timed square and GPT-2-shaped products of size up to `max_dim`
 * over `seconds` seconds. MFU is reported against this figure. */
double kiln_backend_cpu_peak_gflops(int64_t max_dim, double seconds);

#ifdef __cplusplus
}
#endif
#endif
