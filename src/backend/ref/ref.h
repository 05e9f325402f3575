/* The reference kernels, exported inside the library so that other backends can fall
 * back to them for ops they do not specialise. Semantics: include/kiln/backend.h. */
#ifndef KILN_BACKEND_REF_H
#define KILN_BACKEND_REF_H

#include <stdint.h>

void kiln__ref_encoder_forward(float *out, const int32_t *inp, const float *wte, const float *wpe,
                               int64_t B, int64_t T, int64_t C);
void kiln__ref_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *inp,
                                int64_t B, int64_t T, int64_t C);
void kiln__ref_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                 const float *weight, const float *bias, int64_t N, int64_t C);
void kiln__ref_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                  const float *inp, const float *weight, const float *mean,
                                  const float *rstd, int64_t N, int64_t C);
void kiln__ref_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                              int64_t N, int64_t C, int64_t OC, int trans_w);
void kiln__ref_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *weight, int64_t N, int64_t C,
                               int64_t OC, int trans_w);
void kiln__ref_attention_forward(float *out, float *att, const float *qkv, int64_t B, int64_t T,
                                 int64_t C, int64_t NH);
void kiln__ref_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                                  const float *att, int64_t B, int64_t T, int64_t C, int64_t NH);
void kiln__ref_gelu_forward(float *out, const float *inp, int64_t n);
void kiln__ref_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t n);
void kiln__ref_residual_forward(float *out, const float *a, const float *b, int64_t n);
void kiln__ref_crossentropy_forward_backward(float *losses, float *dlogits, const float *logits,
                                             const int32_t *targets, float dloss, int64_t N,
                                             int64_t V, int64_t Vp);
void kiln__ref_adam_update(float *p, const float *g, float *m, float *v, int64_t n, float lr,
                           float b1, float b2, float bc1, float bc2, float eps, float decoupled_wd,
                           float l2_wd);
void kiln__ref_sgd_update(float *p, const float *g, float *buf, int64_t n, float lr, float momentum,
                          float dampening, int nesterov, float wd, int first);
void kiln__ref_rmsprop_update(float *p, const float *g, float *sq, float *buf, int64_t n, float lr,
                              float alpha, float eps, float wd, float momentum);
double kiln__ref_sumsq(const float *x, int64_t n);
void kiln__ref_scale(float *x, float s, int64_t n);
void kiln__ref_zero(float *x, int64_t n);

#endif
