/* The CPU backend's table: OpenBLAS sgemm for matrix products, OpenMP loops for the rest. */
#include "backend/cpu/cpu.h"
#include "kiln/backend.h"

static const kiln_backend cpu_backend = {
    .name = "cpu",
    .encoder_forward = kiln__cpu_encoder_forward,
    .encoder_backward = kiln__cpu_encoder_backward,
    .layernorm_forward = kiln__cpu_layernorm_forward,
    .layernorm_backward = kiln__cpu_layernorm_backward,
    .matmul_forward = kiln__cpu_matmul_forward,
    .matmul_backward = kiln__cpu_matmul_backward,
    .attention_forward = kiln__cpu_attention_forward,
    .attention_backward = kiln__cpu_attention_backward,
    .gelu_forward = kiln__cpu_gelu_forward,
    .gelu_backward = kiln__cpu_gelu_backward,
    .residual_forward = kiln__cpu_residual_forward,
    .crossentropy_forward_backward = kiln__cpu_crossentropy_forward_backward,
    .adam_update = kiln__cpu_adam_update,
    .sgd_update = kiln__cpu_sgd_update,
    .rmsprop_update = kiln__cpu_rmsprop_update,
    .sumsq = kiln__cpu_sumsq,
    .scale = kiln__cpu_scale,
    .zero = kiln__cpu_zero,
    .prepare = kiln__cpu_prepare,
};

const kiln_backend *kiln_backend_cpu(void) { return &cpu_backend; }
