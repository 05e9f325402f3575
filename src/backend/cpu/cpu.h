/* The CPU backend's kernels (semantics: include/kiln/backend.h). Each file's kernels are
 * OpenMP-parallel with static work splits, so that the same inputs and thread count give
 * the same bits; most also give the same bits whatever the thread count. */
#ifndef KILN_BACKEND_CPU_H
#define KILN_BACKEND_CPU_H

#include <stdint.h>

#include "kiln/status.h"

/* cpu_matmul.c */
void kiln__cpu_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                              int64_t N, int64_t C, int64_t OC, int trans_w);
void kiln__cpu_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *weight, int64_t N, int64_t C,
                               int64_t OC, int trans_w);

/* cpu_attention.c */
void kiln__cpu_attention_forward(float *out, float *att, const float *qkv, int64_t B, int64_t T,
                                 int64_t C, int64_t NH);
void kiln__cpu_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                                  const float *att, int64_t B, int64_t T, int64_t C, int64_t NH);

/* cpu_layers.c */
void kiln__cpu_encoder_forward(float *out, const int32_t *inp, const float *wte, const float *wpe,
                               int64_t B, int64_t T, int64_t C);
void kiln__cpu_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *inp,
                                int64_t B, int64_t T, int64_t C);
void kiln__cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                 const float *weight, const float *bias, int64_t N, int64_t C);
void kiln__cpu_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                  const float *inp, const float *weight, const float *mean,
                                  const float *rstd, int64_t N, int64_t C);
void kiln__cpu_gelu_forward(float *out, const float *inp, int64_t n);
void kiln__cpu_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t n);
void kiln__cpu_residual_forward(float *out, const float *a, const float *b, int64_t n);
void kiln__cpu_crossentropy_forward_backward(float *losses, float *dlogits, const float *logits,
                                             const int32_t *targets, float dloss, int64_t N,
                                             int64_t V, int64_t Vp);

/* cpu_optim.c */
void kiln__cpu_adam_update(float *p, const float *g, float *m, float *v, int64_t n, float lr,
                           float b1, float b2, float bc1, float bc2, float eps, float decoupled_wd,
                           float l2_wd);
void kiln__cpu_sgd_update(float *p, const float *g, float *buf, int64_t n, float lr, float momentum,
                          float dampening, int nesterov, float wd, int first);
void kiln__cpu_rmsprop_update(float *p, const float *g, float *sq, float *buf, int64_t n, float lr,
                              float alpha, float eps, float wd, float momentum);
double kiln__cpu_sumsq(const float *x, int64_t n);
void kiln__cpu_scale(float *x, float s, int64_t n);
void kiln__cpu_zero(float *x, int64_t n);
kiln_status kiln__cpu_prepare(void);

#endif
