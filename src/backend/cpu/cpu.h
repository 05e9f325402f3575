/* The CPU backend's kernels (semantics: include/kiln/backend.h). Each file's kernels are
 * OpenMP-parallel with static work splits, so that the same inputs and thread count give
 * the same bits; most also give the same bits whatever the thread count. */
#ifndef KILN_BACKEND_CPU_H
#define KILN_BACKEND_CPU_H

#include <stdint.h>

#include "kiln/backend.h"

/* Every op of KILN_BACKEND_OPS: kiln__cpu_matmul_forward in cpu_matmul.c,
 * kiln__cpu_attention_* in cpu_attention.c, the optimizer kernels, sumsq, scale and zero in
 * cpu_optim.c, the rest in cpu_layers.c. */
KILN_BACKEND_DECLARE(kiln__cpu_)

/* cpu_prepare.c: the optional prepare op. */
kiln_op_prepare kiln__cpu_prepare;

#endif
