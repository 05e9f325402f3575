/* kiln: the op interface.
 *
 * A backend is an instance: a table of ops and the state behind them (its memory, its
 * first error). Model and optimizer code call these ops and never loop over elements
 * themselves. Every backend's every op is tested against the plain reference backend
 * (kiln_backend_ref) on the same inputs.
 *
 * Memory. A backend owns the memory its ops read and write: `alloc` gives device memory
 * (zero-filled), `copy` moves bytes between the host and the device, `synchronize` waits for
 * the ops queued so far. On the CPU, device memory is host memory and every op has finished
 * when it returns; a GPU backend queues ops and the caller synchronises before it reads.
 *
 * Failure. An op that cannot do its work (a library call that fails, a device error)
 * records the first such error in the instance (kiln_backend_fail) and the ops after it may
 * do nothing; `synchronize` returns that error, with its message, and clears it. So model
 * code calls ops in a row and checks once, where it synchronises.
 *
 * Types. Ops take the kiln_dtype `dt` of the tensors they compute on: activations, their
 * gradients and the working weights are all in `dt`. What precision needs stays fp32
 * whatever `dt` is: parameter gradients (float *, accumulated in fp32), LayerNorm's mean and
 * rstd, losses, sums and the optimizer's state. Every op computes in fp32 (or wider) and
 * rounds once when it stores a `dt` value.
 *
 * Conventions (llm.c's): outputs first, then inputs, then sizes. Shapes are row-major.
 * Backward kernels ACCUMULATE into parameter gradients (+=) and WRITE activation
 * gradients (=), with one exception named at layernorm_backward. All sizes in elements.
 * N is the number of token positions (B*T). */
#ifndef KILN_BACKEND_H
#define KILN_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/dtype.h"
#include "kiln/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_backend kiln_backend;

/* ---- the ops ----
 * Each op's signature is written once, as a function type; the table, and every backend's
 * declarations of its kernels, are made from these types and from KILN_BACKEND_OPS, so a
 * backend cannot drift from the interface: a kernel whose signature differs does not
 * compile. */

/* -- memory -- */
/* `bytes` of device memory, zero-filled and 64-byte aligned; NULL when it cannot be had. */
typedef void *kiln_op_alloc(kiln_backend *be, size_t bytes);
typedef void kiln_op_free(kiln_backend *be, void *p); /* NULL is fine */
typedef enum kiln_copy_kind {
    KILN_COPY_TO_DEVICE = 0, /* dst device, src host */
    KILN_COPY_TO_HOST,       /* dst host, src device */
    KILN_COPY_ON_DEVICE,     /* both device */
} kiln_copy_kind;
typedef void kiln_op_copy(kiln_backend *be, void *dst, const void *src, size_t bytes,
                          kiln_copy_kind kind);
/* Wait for every op queued so far; the first error since the last call (KILN_OK if none),
 * its message set as the thread's error message; the error is then cleared. */
typedef kiln_status kiln_op_synchronize(kiln_backend *be);

/* -- layers -- */
/* out (B,T,C) = wte[inp[b,t]] + wpe[t]; inp (B,T) holds ids already checked < V. wpe NULL:
 * no position embedding (rotary positions), out = wte[inp[b,t]]. */
typedef void kiln_op_encoder_forward(kiln_backend *be, kiln_dtype dt, void *out, const int32_t *inp,
                                     const void *wte, const void *wpe, int64_t B, int64_t T,
                                     int64_t C);
/* dwte (V,C) += and dwpe (T,C) += from dout (B,T,C); dwte NULL: dwpe alone; dwpe NULL: dwte
 * alone; both NULL: nothing. */
typedef void kiln_op_encoder_backward(kiln_backend *be, kiln_dtype dt, float *dwte, float *dwpe,
                                      const void *dout, const int32_t *inp, int64_t B, int64_t T,
                                      int64_t C);

/* out (N,C) = (inp - mean) * rstd * weight + bias; mean, rstd (N) are saved for backward.
 * eps = 1e-5 as in GPT-2. */
typedef void kiln_op_layernorm_forward(kiln_backend *be, kiln_dtype dt, void *out, float *mean,
                                       float *rstd, const void *inp, const void *weight,
                                       const void *bias, int64_t N, int64_t C);
/* dweight, dbias (C) +=. dinp (N,C) += as well: layernorm's input is the residual stream,
 * whose gradient is the sum of its branches, so this op adds its part in place. */
typedef void kiln_op_layernorm_backward(kiln_backend *be, kiln_dtype dt, void *dinp, float *dweight,
                                        float *dbias, const void *dout, const void *inp,
                                        const void *weight, const float *mean, const float *rstd,
                                        int64_t N, int64_t C);
/* Fused residual add and the LayerNorm after it: res (N,C) = a + b, then out, mean, rstd as
 * layernorm_forward of res. res may be the same pointer as a or b. */
typedef void kiln_op_residual_layernorm_forward(kiln_backend *be, kiln_dtype dt, void *res,
                                                void *out, float *mean, float *rstd, const void *a,
                                                const void *b, const void *weight, const void *bias,
                                                int64_t N, int64_t C);

/* out (N,OC) = inp (N,C) x W + bias (OC, may be NULL).
 * W is (C,OC) when trans_w == 0 (Hugging Face GPT-2's Conv1D layout) and (OC,C) when
 * trans_w == 1 (the output head, which is the token embedding (Vp,C)).
 * gelu_out (N,OC), when not NULL, also receives GELU(out): bias and GELU in the product's
 * output pass; out keeps the pre-activation that GELU's backward needs. */
typedef void kiln_op_matmul_forward(kiln_backend *be, kiln_dtype dt, void *out, const void *inp,
                                    const void *weight, const void *bias, int64_t N, int64_t C,
                                    int64_t OC, int trans_w, void *gelu_out);
/* dinp (N,C) = dout x W^T (written; skipped when dinp is NULL),
 * dweight (layout as W) += inp^T x dout, dbias (OC) += column sums of dout (NULL: none). */
typedef void kiln_op_matmul_backward(kiln_backend *be, kiln_dtype dt, void *dinp, float *dweight,
                                     float *dbias, const void *dout, const void *inp,
                                     const void *weight, int64_t N, int64_t C, int64_t OC,
                                     int trans_w);

/* RMSNorm: rstd (N) = 1 / sqrt(mean(inp^2) + eps) over the C channels, out (N,C) = inp *
 * rstd * weight; rstd is saved for backward. */
typedef void kiln_op_rmsnorm_forward(kiln_backend *be, kiln_dtype dt, void *out, float *rstd,
                                     const void *inp, const void *weight, int64_t N, int64_t C,
                                     float eps);
/* dweight (C) +=, and dinp (N,C) += as layernorm_backward does (the residual stream's). */
typedef void kiln_op_rmsnorm_backward(kiln_backend *be, kiln_dtype dt, void *dinp, float *dweight,
                                      const void *dout, const void *inp, const void *weight,
                                      const float *rstd, int64_t N, int64_t C);
/* res (N,C) = a + b (res may be a or b), then out and rstd as rmsnorm_forward of res. */
typedef void kiln_op_residual_rmsnorm_forward(kiln_backend *be, kiln_dtype dt, void *res, void *out,
                                              float *rstd, const void *a, const void *b,
                                              const void *weight, int64_t N, int64_t C, float eps);

/* Rotary position embeddings, Hugging Face Llama's convention, in place on the q and k heads
 * of qkv (B,T,(NH + 2 NKV) hs) (v untouched); row t of a sequence is at position pos0 + t.
 * For i < hs/2 (hs even): inv_freq = 1 / theta^(2i/hs) and angle = pos * inv_freq, both in
 * fp32 as Hugging Face computes them; (x_i, x_{i+hs/2}) becomes
 * (x_i cos - x_{i+hs/2} sin, x_{i+hs/2} cos + x_i sin). */
typedef void kiln_op_rope_forward(kiln_backend *be, kiln_dtype dt, void *qkv, int64_t B, int64_t T,
                                  int64_t NH, int64_t NKV, int64_t hs, int64_t pos0, float theta);
/* Its backward in place on dqkv: the rotation by -angle on the q and k parts. */
typedef void kiln_op_rope_backward(kiln_backend *be, kiln_dtype dt, void *dqkv, int64_t B,
                                   int64_t T, int64_t NH, int64_t NKV, int64_t hs, int64_t pos0,
                                   float theta);

/* SwiGLU: inp (N,2H) rows [gate (H) | up (H)], out (N,H) = silu(gate) * up, silu(x) =
 * x / (1 + exp(-x)). */
typedef void kiln_op_swiglu_forward(kiln_backend *be, kiln_dtype dt, void *out, const void *inp,
                                    int64_t N, int64_t H);
/* dinp (N,2H) written from dout (N,H). */
typedef void kiln_op_swiglu_backward(kiln_backend *be, kiln_dtype dt, void *dinp, const void *inp,
                                     const void *dout, int64_t N, int64_t H);

/* Causal self-attention with NKV key/value heads (NKV divides NH; NKV = NH is multi-head,
 * 1 multi-query). qkv (B,T,(NH + 2 NKV) hs) holds for each position the NH query heads, then
 * the NKV key heads, then the NKV value heads, hs = C/NH channels each; query head h reads
 * key/value head h / (NH/NKV). out (B,T,C) receives the heads' outputs, heads side by side. What
 * forward keeps for backward goes to `saved`, of attention_saved_bytes (the backend's
 * choice: the probabilities, or only their row statistics for a kernel that recomputes
 * them); both directions work in `scratch`, of attention_scratch_bytes, whose contents do
 * not outlive the call. */
typedef size_t kiln_op_attention_saved_bytes(kiln_backend *be, kiln_dtype dt, int64_t B, int64_t T,
                                             int64_t C, int64_t NH, int64_t NKV);
typedef size_t kiln_op_attention_scratch_bytes(kiln_backend *be, kiln_dtype dt, int64_t B,
                                               int64_t T, int64_t C, int64_t NH, int64_t NKV);
typedef void kiln_op_attention_forward(kiln_backend *be, kiln_dtype dt, void *out, void *saved,
                                       void *scratch, const void *qkv, int64_t B, int64_t T,
                                       int64_t C, int64_t NH, int64_t NKV);
/* dqkv (B,T,(NH + 2 NKV) hs) written whole: a key/value head's gradient summed over the query
 * heads that read it. */
typedef void kiln_op_attention_backward(kiln_backend *be, kiln_dtype dt, void *dqkv, void *scratch,
                                        const void *dout, const void *qkv, const void *saved,
                                        int64_t B, int64_t T, int64_t C, int64_t NH, int64_t NKV);

/* GELU, tanh approximation (GPT-2's). */
typedef void kiln_op_gelu_forward(kiln_backend *be, kiln_dtype dt, void *out, const void *inp,
                                  int64_t n);
typedef void kiln_op_gelu_backward(kiln_backend *be, kiln_dtype dt, void *dinp, const void *inp,
                                   const void *dout, int64_t n);

/* out = a + b, n elements. */
typedef void kiln_op_residual_forward(kiln_backend *be, kiln_dtype dt, void *out, const void *a,
                                      const void *b, int64_t n);

/* Softmax cross-entropy over the first V of the Vp columns of logits (N,Vp), in fp32.
 * losses (N) written with -log p[target]. When dlogits is not NULL it is written with
 * (softmax - onehot(target)) * dloss for the first V columns and 0 for the padded ones;
 * dlogits may be the same pointer as logits. Targets are already checked < V. */
typedef void kiln_op_crossentropy_forward_backward(kiln_backend *be, kiln_dtype dt, float *losses,
                                                   void *dlogits, const void *logits,
                                                   const int32_t *targets, float dloss, int64_t N,
                                                   int64_t V, int64_t Vp);

/* -- reductions and slabs -- */
/* Sum of x (fp32, n) in double, in an order fixed by n alone (the same bits whatever the
 * thread count): the mean loss. Returns on the host (it synchronises). */
typedef double kiln_op_sum(kiln_backend *be, const float *x, int64_t n);
/* Sum of squares of x (n elements of dt) in double, in an order fixed by n and the thread
 * count: the global gradient norm, and the finite-weights check (the sum is finite exactly
 * when every element is). Returns on the host. */
typedef double kiln_op_sumsq(kiln_backend *be, kiln_dtype dt, const void *x, int64_t n);
/* x *= s (fp32) */
typedef void kiln_op_scale(kiln_backend *be, float *x, float s, int64_t n);
/* bytes of x = 0 */
typedef void kiln_op_zero(kiln_backend *be, void *x, size_t bytes);
/* n elements of src (type st) into dst (type dt), rounding to nearest even. */
typedef void kiln_op_convert(kiln_backend *be, void *dst, kiln_dtype dt, const void *src,
                             kiln_dtype st, int64_t n);

/* -- optimizer kernels, over n contiguous elements of the slabs --
 * The gradient is read as gscale * g (one fp32 multiply, as a separate scale pass would
 * round it): gradient clipping and a loss scale's division fold into the update instead of
 * costing a pass over the gradients. p is the fp32 parameter: the working weights themselves in
 * fp32 training, else the optimizer's fp32 master copy. After the update, when w is not NULL, w->p
 * receives p in w->dtype: rounded to nearest even, or for BF16 with w->round_seed != 0
 * stochastically, element i with 16 random bits that depend only on (round_seed, w->index0 + i), so
 * the result does not depend on threads or how the slab is split into ranges. */
typedef struct kiln_work_out {
    void *p; /* n elements of dtype */
    kiln_dtype dtype;
    uint64_t round_seed; /* 0: nearest even */
    int64_t index0;      /* index of element 0 in the whole slab */
} kiln_work_out;
/* AdamW/Adam: m = b1 m + (1-b1) g'; v = b2 v + (1-b2) g'^2;
 *   p -= lr * (m / bc1) / (sqrt(v / bc2) + eps) + lr * decoupled_wd * p
 *   where g' = g + l2_wd * p, bc1 = 1 - b1^t, bc2 = 1 - b2^t (PyTorch's order of terms:
 *   decoupled decay is applied to p first, p *= 1 - lr * decoupled_wd). */
typedef void kiln_op_adam_update(kiln_backend *be, float *p, const kiln_work_out *w, const float *g,
                                 float gscale, float *m, float *v, int64_t n, float lr, float b1,
                                 float b2, float bc1, float bc2, float eps, float decoupled_wd,
                                 float l2_wd);
/* SGD, PyTorch's semantics: g' = g + wd p; buf = momentum buf + (1-dampening) g'
 * (buf = g' on the first step, first != 0); step = nesterov ? g' + momentum buf : buf;
 * p -= lr step. momentum == 0: plain SGD and buf is unused (may be NULL). */
typedef void kiln_op_sgd_update(kiln_backend *be, float *p, const kiln_work_out *w, const float *g,
                                float gscale, float *buf, int64_t n, float lr, float momentum,
                                float dampening, int nesterov, float wd, int first);
/* RMSprop, PyTorch's semantics (centered = 0): g' = g + wd p;
 * sq = alpha sq + (1-alpha) g'^2; if momentum > 0: buf = momentum buf + g'/(sqrt(sq)+eps),
 * p -= lr buf; else p -= lr g'/(sqrt(sq)+eps). */
typedef void kiln_op_rmsprop_update(kiln_backend *be, float *p, const kiln_work_out *w,
                                    const float *g, float gscale, float *sq, float *buf, int64_t n,
                                    float lr, float alpha, float eps, float wd, float momentum);

/* Optional: called when a model is built on a backend, to check that the process can give
 * the backend what it takes for itself (OpenBLAS's work buffers, say) before any kernel
 * runs. */
typedef kiln_status kiln_op_prepare(kiln_backend *be);

/* Attention for generation with a cache (optional; forward only). qkv holds, for each of
 * the B sequences, ldT rows of (NH + 2 NKV) hs (as in attention_forward) of which positions
 * 0..Tk-1 are filled; out (B,T,C) receives the outputs of the last T of them, positions
 * Tk-T..Tk-1, each attending to the positions up to its own (the causal mask). What
 * attention_forward computes for those rows, without the rows before them. */
typedef void kiln_op_attention_decode(kiln_backend *be, kiln_dtype dt, void *out, const void *qkv,
                                      int64_t B, int64_t ldT, int64_t Tk, int64_t T, int64_t C,
                                      int64_t NH, int64_t NKV);

/* The required ops, in table order: X(arg, name) for each kiln_op_<name>. */
#define KILN_BACKEND_OPS(X, arg)                                                                   \
    X(arg, alloc)                                                                                  \
    X(arg, free)                                                                                   \
    X(arg, copy)                                                                                   \
    X(arg, synchronize)                                                                            \
    X(arg, encoder_forward)                                                                        \
    X(arg, encoder_backward)                                                                       \
    X(arg, layernorm_forward)                                                                      \
    X(arg, layernorm_backward)                                                                     \
    X(arg, residual_layernorm_forward)                                                             \
    X(arg, rmsnorm_forward)                                                                        \
    X(arg, rmsnorm_backward)                                                                       \
    X(arg, residual_rmsnorm_forward)                                                               \
    X(arg, rope_forward)                                                                           \
    X(arg, rope_backward)                                                                          \
    X(arg, swiglu_forward)                                                                         \
    X(arg, swiglu_backward)                                                                        \
    X(arg, matmul_forward)                                                                         \
    X(arg, matmul_backward)                                                                        \
    X(arg, attention_saved_bytes)                                                                  \
    X(arg, attention_scratch_bytes)                                                                \
    X(arg, attention_forward)                                                                      \
    X(arg, attention_backward)                                                                     \
    X(arg, gelu_forward)                                                                           \
    X(arg, gelu_backward)                                                                          \
    X(arg, residual_forward)                                                                       \
    X(arg, crossentropy_forward_backward)                                                          \
    X(arg, sum)                                                                                    \
    X(arg, sumsq)                                                                                  \
    X(arg, scale)                                                                                  \
    X(arg, zero)                                                                                   \
    X(arg, convert)                                                                                \
    X(arg, adam_update)                                                                            \
    X(arg, sgd_update)                                                                             \
    X(arg, rmsprop_update)

/* The instance: every op of KILN_BACKEND_OPS, the optional ones (NULL when the backend has
 * none), and the state behind them. */
#define KILN_BACKEND_FIELD_(unused, op) kiln_op_##op *op;
struct kiln_backend {
    const char *name;
    KILN_BACKEND_OPS(KILN_BACKEND_FIELD_, _)
    kiln_op_prepare *prepare;                   /* optional */
    kiln_op_attention_decode *attention_decode; /* optional: generation recomputes the window */
    /* 1: alloc gives memory the host cannot read or write (a GPU's): callers move data in
     * and out with copy; 0: host memory, which callers may also read and write directly */
    int device_memory;
    /* the first error since the last synchronize (kiln_backend_fail) */
    kiln_status error;
    char error_message[512];
    void *impl; /* the backend's own state */
};
#undef KILN_BACKEND_FIELD_

/* For a backend's own code: KILN_BACKEND_DECLARE(kiln__cpu_) declares its kernels
 * kiln__cpu_encoder_forward, ... with the interface's types, and KILN_BACKEND_FILL(kiln__cpu_)
 * fills a designated initialiser of its table with them. */
#define KILN_BACKEND_DECLARE_ONE_(prefix, op) kiln_op_##op prefix##op;
#define KILN_BACKEND_DECLARE(prefix) KILN_BACKEND_OPS(KILN_BACKEND_DECLARE_ONE_, prefix)
#define KILN_BACKEND_FILL_ONE_(prefix, op) .op = prefix##op,
#define KILN_BACKEND_FILL(prefix) KILN_BACKEND_OPS(KILN_BACKEND_FILL_ONE_, prefix)

/* Record a failure in the instance (the first one since the last synchronize is kept; later
 * ones are dropped) and return it. For backend implementations. */
kiln_status kiln_backend_fail(kiln_backend *be, kiln_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The error recorded so far without waiting or clearing (KILN_OK if none). */
kiln_status kiln_backend_error(const kiln_backend *be);

/* The plain reference: single-threaded loops written for clarity, the ground truth that
 * tests compare every other backend against. For BF16 and F16 it rounds its inputs to fp32,
 * computes in fp32 (sums in double) and rounds each output once. One instance per process. */
kiln_backend *kiln_backend_ref(void);

/* The CPU backend: OpenBLAS (OpenMP build) for fp32 matrix products, OpenMP for the rest.
 * One instance per process. */
kiln_backend *kiln_backend_cpu(void);

/* The CUDA backend (src/backend/cuda, docs/cuda.md): cuBLASLt for matrix products (bf16 and
 * fp16 with fp32 accumulation; fp32 without TF32 unless asked), kiln's own kernels for the
 * rest, flash-style attention that keeps only each row's log-sum-exp, one CUDA stream.
 * Device memory is GPU memory: callers move data with `copy`. Token ids (encoder inputs,
 * cross-entropy targets) may be host or device pointers. NULL when it cannot run here
 * (kiln_cuda_available says why). One instance per process, on device 0 (or the device
 * CUDA_VISIBLE_DEVICES names first), or on the one kiln_cuda_select chose. */
kiln_backend *kiln_backend_cuda(void);
/* KILN_OK when the CUDA backend can run: built with CUDA, a GPU present, a driver at least
 * as new as the toolkit, compute capability 8.0 or more (bf16), and kernels built for it.
 * Otherwise KILN_ERR_UNSUPPORTED with the reason in why (cap bytes, may be NULL) and as the
 * thread's error message, naming the CPU backend as the way to run. */
kiln_status kiln_cuda_available(char *why, size_t cap);
/* Before the CUDA backend starts (the first kiln_backend_cuda): run it on visible GPU `index`
 * (one rank of several on a machine takes its own). KILN_OK when it runs there already;
 * KILN_ERR_CONFIG when it started on another or there is no such GPU (the count in the message),
 * KILN_ERR_UNSUPPORTED when CUDA cannot run here (kiln_cuda_available's reason). *count, when not
 * NULL, is the number of GPUs visible (0 where CUDA cannot run). */
kiln_status kiln_cuda_select(int index, int *count);
/* What kiln_cuda_device_info reports about the CUDA backend's GPU. */
typedef struct kiln_cuda_info {
    char name[256]; /* "NVIDIA H200", ... */
    int device, major, minor, sms;
    double clock_ghz;           /* the SMs' peak clock */
    size_t mem_total, mem_free; /* bytes, now */
    /* Dense peak rates in TFLOP/s, MFU's denominators: tensor cores on bf16/fp16 operands with
     * fp32 accumulation, and fp32 on the CUDA cores (fp32 products without TF32). From
     * NVIDIA's data sheets for the GPUs kiln knows (H100/H200 SXM and PCIe, A100), else SMs x
     * clock x the compute capability's per-SM rate; peak_source says which. */
    double peak_tflops_16, peak_tflops_32;
    char peak_source[160];
} kiln_cuda_info;
/* The GPU's name, memory and peak rates (kiln_cuda_available's checks first: its error when
 * they fail). */
kiln_status kiln_cuda_device_info(kiln_cuda_info *info);

/* Switches of the CUDA backend, each returning its previous value (-1 when built without
 * CUDA). DETERMINISTIC (on by default): no atomic additions, the same bits on every run;
 * FUSE_GELU (on): GELU in the product's epilogue when cuBLASLt has one for it; TF32 (off):
 * fp32 products on TF32 tensor cores (faster, about 2^-11 relative error per product);
 * TC_ATTENTION (on): attention in bf16 and fp16 on tensor cores for head sizes that are
 * multiples of 16 up to 128 (the probabilities and dS rounded to the dtype before their
 * products, fp32 accumulation; off: fp32 arithmetic on CUDA cores, as fp32 and other head
 * sizes always run). Either setting reads what the other's forward saved. */
typedef enum kiln_cuda_flag {
    KILN_CUDA_DETERMINISTIC = 0,
    KILN_CUDA_FUSE_GELU = 1,
    KILN_CUDA_TF32 = 2,
    KILN_CUDA_TC_ATTENTION = 3,
} kiln_cuda_flag;
int kiln_cuda_set_flag(kiln_cuda_flag flag, int on);

/* A backend by name ("cpu", "ref", "cuda"); KILN_ERR_NOT_FOUND naming the choices otherwise,
 * KILN_ERR_UNSUPPORTED with the reason when "cuda" cannot run here. */
kiln_status kiln_backend_by_name(kiln_backend **out, const char *name);

/* The fp32 GEMM rate of this machine with the GEMM the CPU backend uses, in GFLOP/s:
 * the best of a few timed square and GPT-2-shaped products of size up to `max_dim`
 * over `seconds` seconds. MFU is reported against this figure. */
double kiln_backend_cpu_peak_gflops(int64_t max_dim, double seconds);
/* The same for products in dt: bf16 inputs with fp32 accumulation through the bf16 GEMM the
 * CPU backend uses (kiln_backend_cpu_gemm_name); 0 when it cannot be measured. */
double kiln_backend_cpu_peak_gflops_dtype(kiln_dtype dt, int64_t max_dim, double seconds);
/* The fp32 products of the widest weight training multiplies (the classifier's (N,K) =
 * (Vp,C), with M rows), forward and backward, on zeroed operands, so that the BLAS library
 * holds the work memory training's products will take (OpenBLAS's weight-gradient product of
 * d12's classifier takes 46 MiB that smaller products leave untouched) before the process's
 * memory is measured for the plan. The operands are freed before it returns. */
void kiln_backend_cpu_warm_products(int64_t M, int64_t K, int64_t N);
/* The GEMM the CPU backend uses for products in dt, in words ("OpenBLAS sgemm", ...). */
const char *kiln_backend_cpu_gemm_name(kiln_dtype dt);

#ifdef __cplusplus
}
#endif
#endif
