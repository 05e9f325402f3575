/* The CPU backend's kernels (semantics: include/kiln/backend.h). Each file's kernels are
 * OpenMP-parallel with static work splits, so that the same inputs and thread count give
 * the same bits; most also give the same bits whatever the thread count. */
#ifndef KILN_BACKEND_CPU_H
#define KILN_BACKEND_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/backend.h"

/* Every op of KILN_BACKEND_OPS: kiln__cpu_matmul_* in cpu_matmul.c, kiln__cpu_attention_* in
 * cpu_attention.c, the optimizer kernels, sums, scale and zero in cpu_optim.c, memory in
 * cpu.c, RMSNorm, rotary embeddings and SwiGLU in cpu_llama.c, the rest in cpu_layers.c. */
KILN_BACKEND_DECLARE(kiln__cpu_)

/* cpu_prepare.c: the optional prepare op; cpu_attention.c: the optional attention_decode. */
kiln_op_prepare kiln__cpu_prepare;
kiln_op_attention_decode kiln__cpu_attention_decode;


/* cpu.c: the instance's own state. */
typedef struct kiln__cpu_state_t {
    void *scratch;
    size_t scratch_bytes;
    int attention_threads; /* the fewest threads an attention scratch was planned for (0: none) */
    /* cpu_llama.c: rotary embeddings' cos and sin of positions 0..rope_pos-1 for rope_hs and
     * rope_theta (NULL: none yet) */
    float *rope_tab;
    int64_t rope_pos, rope_hs;
    float rope_theta;
} kiln__cpu_state_t;
kiln__cpu_state_t *kiln__cpu_state(kiln_backend *be);

/* x86 with AVX-512F and BW whose state the OS saves: 1, and leaf 7's registers (subleaf 0) in
 * b and c for the caller's features; 0 elsewhere (gemm_dispatch.c). */
int kiln__cpu_avx512_leaf7(unsigned *b, unsigned *c);

/* cpu.c: a buffer of at least `bytes` the backend keeps between calls, for the paths that
 * convert operands (products in a dtype the machine has no fast instructions for). It grows
 * to the largest size asked once and is then reused; NULL (with the error recorded) when it
 * cannot grow. One caller at a time. */
void *kiln__cpu_scratch(kiln_backend *be, size_t bytes);

#endif
