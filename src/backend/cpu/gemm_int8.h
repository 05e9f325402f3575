/* Integer matrix products for quantized inference: fp32 activations quantized to int8 per row
 * on the fly, times int8 (or int4) weights quantized per output channel (int4: per group of
 * G inputs of an output channel), summed in int32, then scaled to fp32 and + bias:
 *
 *   out[m][n] = sa[m] * sum_g (sum_{k in g} xq[m][k] * wq[n][k]) * sw[n][g] + bias[n]
 *
 * xq = round(x * 127 / max|x[m]|) in [-127, 127] and sa[m] = max|x[m]| / 127 (dynamic,
 * per row). The float part is written with fmaf in a fixed order (groups in order, then
 * * sa + bias), so the AVX512-VNNI kernel and the plain kernel give the same bits.
 *
 * VPDPBUSD multiplies unsigned bytes by signed bytes. The activations are the broadcast
 * operand, so they stay signed and the weights are stored unsigned with a zero point
 * (int8: w + 128; int4: w + 8, which is what a nibble holds anyway); the zero point's share,
 * zp x (sum of the activations of the group), is subtracted per row: one sum per row and
 * group computed in the quantizing pass, instead of a column sum per output channel.
 *
 * Packed weights: output channels in blocks of 16; within a block, K in quads of 4:
 * pw[block][kq][lane][4] (64 bytes: one zmm, lane = channel in the block), so one VPDPBUSD
 * adds a quad of products to each of 16 channels. int4 holds two quads per 64 bytes, quad
 * 2p in the low nibbles and 2p+1 in the high ones: pw[block][kq/2][lane][4]. The VNNI kernel
 * unpacks it in registers (one AND and one shift per 64 bytes give two quads' weights); the
 * plain kernel unpacks it to the int8 layout block by block (a thread's buffer, kiln__qws).
 * Scales: sw[block][group][lane]. Channels past N (to the block) and inputs past K (to the
 * quad, or group) hold zero weights and zero scales.
 *
 * Overflow: a quad adds at most 4 x 255 x 127 per lane; int32 holds K up to 66000 inputs
 * (kiln__qmat_pack refuses more). */
#ifndef KILN_BACKEND_CPU_GEMM_INT8_H
#define KILN_BACKEND_CPU_GEMM_INT8_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/status.h"

#define KILN__QMAT_MAX_K 65536

typedef struct kiln__qmat {
    int64_t N, K;   /* output channels, inputs */
    int64_t Nb;     /* blocks of 16 channels: ceil(N / 16) */
    int64_t Kp;     /* K rounded up to the group size */
    int64_t G;      /* inputs per group (int8: Kp, one group) */
    int64_t groups; /* Kp / G */
    int bits;       /* 8 or 4 */
    uint8_t *w;     /* packed, Nb x Kp x 16 bytes (int4: half) */
    float *scale;   /* Nb x groups x 16 */
} kiln__qmat;

/* Pack an int8 matrix q (N,K) with per-channel scales (N) (bits 8, G 0), or an int4 matrix q
 * (N,K/2 bytes: input 2i in the low nibble of byte i, value + 8) with scales (N, K/G) (bits 4,
 * G a multiple of 8 dividing K). `rows` <= N rows of q are given; rows past them are zero
 * (a padded vocabulary). */
kiln_status kiln__qmat_pack(kiln__qmat *out, const void *q, const float *scale, int64_t rows,
                            int64_t N, int64_t K, int bits, int64_t G);
void kiln__qmat_free(kiln__qmat *m);

/* The quantized activations of M rows of K inputs for a matrix of Kp padded inputs and
 * `groups` groups: what kiln__qgemm works in. */
typedef struct kiln__qact {
    int8_t *q;    /* (M, Kp) */
    float *scale; /* (M) */
    int32_t *sum; /* (M, groups): sum of q over each group */
    int64_t cap_rows, cap_k, cap_groups;
} kiln__qact;

kiln_status kiln__qact_init(kiln__qact *a, int64_t rows, int64_t Kp, int64_t groups);
void kiln__qact_free(kiln__qact *a);

/* Per-thread unpacking buffers for int4 matrices of at most Kp inputs (the plain kernel's). */
typedef struct kiln__qws {
    uint8_t *buf;
    size_t stride;
    int threads;
} kiln__qws;
kiln_status kiln__qws_init(kiln__qws *ws, int64_t Kp, int threads);
void kiln__qws_free(kiln__qws *ws);

/* out (M, ldo) columns 0..N-1 = x (M,K) fp32 x W^T + bias (N; NULL: none), as above. a and ws
 * must have room for M rows of W; NULL ws only for int8. Threads with OpenMP. */
void kiln__qgemm(float *out, int64_t ldo, const float *x, const kiln__qmat *w, const float *bias,
                 int64_t M, kiln__qact *a, kiln__qws *ws);

/* The steps alone, for tests: quantize x into a, and the product from a. */
void kiln__qact_quantize(kiln__qact *a, const float *x, int64_t M, int64_t K, int64_t Kp,
                         int64_t G);
void kiln__qgemm_from(float *out, int64_t ldo, const kiln__qact *a, const kiln__qmat *w,
                      const float *bias, int64_t M, kiln__qws *ws);

/* Whether this CPU runs the AVX512-VNNI kernel (CPUID and the OS's saved state); and which
 * kernel kiln__qgemm uses: 1 VNNI (where the CPU has it), 0 the plain one. Returns the
 * previous choice. The default is VNNI where available; KILN_INT8_KERNEL=plain in the
 * environment also chooses the plain one. */
int kiln__qgemm_has_vnni(void);
int kiln__qgemm_use_vnni(int on);
/* "avx512-vnni" or "plain" */
const char *kiln__qgemm_kernel_name(void);

#endif
