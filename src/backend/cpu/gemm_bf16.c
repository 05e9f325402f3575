/* kiln's bf16 GEMM for AVX512-BF16 (VDPBF16PS): bf16 x bf16 products summed in fp32.
 *
 * Goto-style blocking. op(A) is packed in blocks of up to MC_MAX rows x kc columns, as
 * panels of MR rows whose k-pairs are 32-bit words: Ap[panel][p][r] = (A(r,2p), A(r,2p+1)).
 * op(B) is packed one micro-panel of NR columns at a time: Bp[p][j] = (B(2p,j), B(2p+1,j)).
 * The micro-kernel keeps an MR x NR tile of fp32 sums in 24 zmm registers; for each k-pair
 * it loads NR/16 vectors of B, broadcasts each row's pair of A, and VDPBF16PS adds the two
 * products of every pair to the sums. Each B micro-panel is multiplied by the whole A block
 * (in L2) before the next is packed; packing transposes 16 x 16 words in registers where
 * the pairs lie along rows, and the next panel's memory is prefetched meanwhile.
 *
 * K up to KC_ONE is one block (kc = K). Past that, kc = KC, and the partial sums of a block
 * of C wait in a per-thread fp32 buffer T between k-blocks, so that C and its epilogue are
 * written once, after the last. The common epilogues (bias, beta 0 or 1, F32 or BF16 C) are
 * done by the micro-kernel from its registers; GELU and the pre-activation go through
 * kiln__gemm_store.
 *
 * Threads split the MR x NR tiles of C into a grid (rows x columns), never K, and the
 * blocking depends on K alone, so each element's sum runs in the same order whatever the
 * thread count: the bits do not depend on it. The code is compiled for AVX512-BF16 with
 * target attributes and only called where CPUID says the CPU has it (gemm_dispatch.c). */
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "backend/cpu/gemm.h"
#include "core/dtype_inline.h"
#include "kiln/core.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")))

enum {
    MR = 8,             /* rows of a C tile */
    NV = 3,             /* zmm vectors of 16 columns in a C tile */
    NR = 16 * NV,       /* columns of a C tile */
    KC = 384,           /* k per block when K > KC_ONE (even) */
    KC_ONE = 768,       /* K up to this is one block: no partial sums to keep */
    MC_MAX = 512,       /* rows of an A block: up to MC_MAX x KC_ONE bf16 = 768 KiB, in L2 */
    T_FLOATS = 1 << 18, /* the per-thread partial sums buffer, 1 MiB (L2's size) */
};

/* ---- per-thread buffers ---- */

typedef struct thread_ws {
    uint32_t *ap; /* MC_MAX x KC_ONE/2 pairs */
    uint32_t *bp; /* KC_ONE/2 x NR pairs */
    float *t;     /* T_FLOATS */
} thread_ws;

static char *ws_base;
static int ws_threads;

static size_t ws_stride(void) {
    return (size_t)MC_MAX * (KC_ONE / 2) * 4 + (size_t)(KC_ONE / 2) * NR * 4 + (size_t)T_FLOATS * 4;
}

static kiln_status ws_get(int threads) {
    if (threads <= ws_threads)
        return KILN_OK;
    kiln_free(ws_base);
    ws_base = NULL;
    ws_threads = 0;
    kiln_status s = kiln_alloc_checked((void **)&ws_base, ws_stride() * (size_t)threads,
                                       "bf16 GEMM packing buffers");
    if (s)
        return s;
    ws_threads = threads;
    return KILN_OK;
}

static thread_ws ws_of(int t) {
    char *p = ws_base + ws_stride() * (size_t)t;
    size_t a_bytes = (size_t)MC_MAX * (KC_ONE / 2) * 4, b_bytes = (size_t)(KC_ONE / 2) * NR * 4;
    thread_ws w = {(uint32_t *)p, (uint32_t *)(p + a_bytes), (float *)(p + a_bytes + b_bytes)};
    return w;
}

void kiln__gemm_own_release(void) {
    kiln_free(ws_base);
    ws_base = NULL;
    ws_threads = 0;
}

/* ---- packing ---- */

/* Element (i,k) of op(X) as bf16 bits (X stored as F32 or BF16). */
static inline uint16_t elem(const void *x, kiln_dtype dt, int64_t ld, int trans, int64_t i,
                            int64_t k) {
    int64_t off = trans ? k * ld + i : i * ld + k;
    return dt == KILN_DTYPE_BF16 ? ((const uint16_t *)x)[off]
                                 : kiln__to_bf16(((const float *)x)[off]);
}

static inline uint32_t pair(uint16_t lo, uint16_t hi) {
    return (uint32_t)lo | (uint32_t)hi << 16;
}

/* Rows [0, rows) x bf16 elements [0, elems) of src (leading dimension ld, elements), at most
 * 16 x 32, as 16 x 16 32-bit words, transposed: o[p] holds word p (elements 2p, 2p+1) of
 * each row, row r in lane r. Missing rows and elements are zeros (nothing past them is
 * read). */
TARGET static inline void load_transposed(__m512i o[16], const uint16_t *src, int64_t ld, int rows,
                                          int elems) {
    __mmask32 m = elems >= 32 ? 0xffffffffu : (__mmask32)((1u << elems) - 1);
    __m512i t[16];
    for (int r = 0; r < 16; r++)
        o[r] = r < rows ? _mm512_maskz_loadu_epi16(m, src + r * ld) : _mm512_setzero_si512();
    /* 4x4 blocks within each 128-bit lane, then the lanes themselves */
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(o[2 * i], o[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(o[2 * i], o[2 * i + 1]);
    }
    __m512i s[16]; /* s[4q+e], lane L: rows 4q..4q+3 of word 4L+e */
    for (int q = 0; q < 4; q++) {
        s[4 * q] = _mm512_unpacklo_epi64(t[4 * q], t[4 * q + 2]);
        s[4 * q + 1] = _mm512_unpackhi_epi64(t[4 * q], t[4 * q + 2]);
        s[4 * q + 2] = _mm512_unpacklo_epi64(t[4 * q + 1], t[4 * q + 3]);
        s[4 * q + 3] = _mm512_unpackhi_epi64(t[4 * q + 1], t[4 * q + 3]);
    }
    for (int e = 0; e < 4; e++) {
        __m512i y0 = _mm512_shuffle_i32x4(s[e], s[4 + e], 0x44);
        __m512i y1 = _mm512_shuffle_i32x4(s[e], s[4 + e], 0xee);
        __m512i y2 = _mm512_shuffle_i32x4(s[8 + e], s[12 + e], 0x44);
        __m512i y3 = _mm512_shuffle_i32x4(s[8 + e], s[12 + e], 0xee);
        o[e] = _mm512_shuffle_i32x4(y0, y2, 0x88);
        o[4 + e] = _mm512_shuffle_i32x4(y0, y2, 0xdd);
        o[8 + e] = _mm512_shuffle_i32x4(y1, y3, 0x88);
        o[12 + e] = _mm512_shuffle_i32x4(y1, y3, 0xdd);
    }
}

/* Rows [i0, i0+mc) and k in [k0, k0+kc) of op(A) into panels of MR rows; rows past M and k
 * past K are zeros. */
TARGET static void pack_a(uint32_t *ap, const kiln__gemm_call *g, int64_t i0, int64_t mc,
                          int64_t k0, int64_t kc) {
    int64_t kp = (kc + 1) / 2;
    for (int64_t r0 = 0; r0 < mc; r0 += MR) {
        uint32_t *dst = ap + r0 * kp;
        int64_t rows = mc - r0 < MR ? mc - r0 : MR;
        if (MR == 8 && g->a_dt == KILN_DTYPE_BF16 && !g->trans_a) {
            /* pairs are 32-bit words along A's rows: transpose 16 rows (two panels) at once */
            if (r0 % 16)
                continue; /* done with the panel before */
            const uint16_t *src = (const uint16_t *)g->a + (i0 + r0) * g->lda + k0;
            int nrow = mc - r0 < 16 ? (int)(mc - r0) : 16;
            for (int64_t p0 = 0; p0 < kp; p0 += 16) {
                __m512i o[16];
                int64_t left = kc - 2 * p0;
                load_transposed(o, src + 2 * p0, g->lda, nrow, left < 32 ? (int)left : 32);
                int np = kp - p0 < 16 ? (int)(kp - p0) : 16;
                for (int p = 0; p < np; p++) {
                    _mm256_storeu_si256((void *)(dst + (p0 + p) * MR),
                                        _mm512_castsi512_si256(o[p]));
                    if (nrow > MR)
                        _mm256_storeu_si256((void *)(dst + MR * kp + (p0 + p) * MR),
                                            _mm512_extracti64x4_epi64(o[p], 1));
                }
            }
        } else if (MR == 8 && g->a_dt == KILN_DTYPE_BF16 && g->trans_a && rows == MR) {
            /* A stored (K,M): interleave rows k and k+1 of A over MR columns */
            const uint16_t *src = (const uint16_t *)g->a + k0 * g->lda + i0 + r0;
            for (int64_t p = 0; p < kp; p++) {
                __m128i lo = _mm_loadu_si128((const void *)(src + 2 * p * g->lda));
                __m128i hi = 2 * p + 1 < kc
                                 ? _mm_loadu_si128((const void *)(src + (2 * p + 1) * g->lda))
                                 : _mm_setzero_si128();
                __m256i w = _mm256_or_si256(_mm256_cvtepu16_epi32(lo),
                                            _mm256_slli_epi32(_mm256_cvtepu16_epi32(hi), 16));
                _mm256_storeu_si256((void *)(dst + p * MR), w);
            }
        } else {
            for (int64_t p = 0; p < kp; p++)
                for (int r = 0; r < MR; r++) {
                    int64_t i = i0 + r0 + r, k = k0 + 2 * p;
                    uint16_t lo = 0, hi = 0;
                    if (r < rows) {
                        lo = elem(g->a, g->a_dt, g->lda, g->trans_a, i, k);
                        hi =
                            k + 1 < k0 + kc ? elem(g->a, g->a_dt, g->lda, g->trans_a, i, k + 1) : 0;
                    }
                    dst[p * MR + r] = pair(lo, hi);
                }
        }
    }
}

/* Columns [j0, j0+NR) and k in [k0, k0+kc) of op(B) into one micro-panel; columns past N
 * and k past K are zeros. */
TARGET static void pack_b(uint32_t *bp, const kiln__gemm_call *g, int64_t j0, int64_t k0,
                          int64_t kc) {
    int64_t kp = (kc + 1) / 2;
    int64_t cols = g->N - j0 < NR ? g->N - j0 : NR;
    if (g->b_dt == KILN_DTYPE_BF16 && !g->trans_b) {
        /* B stored (K,N): interleave rows k and k+1 over NR columns, 16 at a time */
        const uint16_t *src = (const uint16_t *)g->b + k0 * g->ldb + j0;
        for (int64_t p = 0; p < kp; p++) {
            const uint16_t *r0 = src + 2 * p * g->ldb, *r1 = r0 + g->ldb;
            int has1 = 2 * p + 1 < kc;
            for (int v = 0; v < NV; v++) {
                int64_t n = cols - 16 * v;
                __mmask16 m = n >= 16 ? 0xffff : n > 0 ? (__mmask16)((1u << n) - 1) : 0;
                __m256i lo = _mm256_maskz_loadu_epi16(m, r0 + 16 * v);
                __m256i hi =
                    has1 ? _mm256_maskz_loadu_epi16(m, r1 + 16 * v) : _mm256_setzero_si256();
                __m512i w = _mm512_or_si512(_mm512_cvtepu16_epi32(lo),
                                            _mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16));
                _mm512_storeu_si512(bp + p * NR + 16 * v, w);
            }
        }
    } else if (g->b_dt == KILN_DTYPE_BF16 && g->trans_b) {
        /* B stored (N,K): each column's pairs are 32-bit words; transpose 16 columns at once */
        const uint16_t *src = (const uint16_t *)g->b + j0 * g->ldb + k0;
        for (int v = 0; v < NV; v++) {
            int64_t n = cols - 16 * v;
            int ncol = n >= 16 ? 16 : n > 0 ? (int)n : 0;
            for (int64_t p0 = 0; p0 < kp; p0 += 16) {
                __m512i o[16];
                int64_t left = kc - 2 * p0;
                load_transposed(o, src + 16 * v * g->ldb + 2 * p0, g->ldb, ncol,
                                left < 32 ? (int)left : 32);
                int np = kp - p0 < 16 ? (int)(kp - p0) : 16;
                for (int p = 0; p < np; p++)
                    _mm512_storeu_si512(bp + (p0 + p) * NR + 16 * v, o[p]);
            }
        }
    } else {
        for (int64_t p = 0; p < kp; p++)
            for (int j = 0; j < NR; j++) {
                int64_t k = k0 + 2 * p;
                uint16_t lo = 0, hi = 0;
                if (j < cols) {
                    lo = elem(g->b, g->b_dt, g->ldb, !g->trans_b, j0 + j, k);
                    hi = k + 1 < k0 + kc ? elem(g->b, g->b_dt, g->ldb, !g->trans_b, j0 + j, k + 1)
                                         : 0;
                }
                bp[p * NR + j] = pair(lo, hi);
            }
    }
}

/* ---- the micro-kernel ---- */

/* The common epilogues, done in registers by the micro-kernel on the last k-block:
 * C (F32 or BF16, `rows` x `cols` of the tile) = acc + beta * C + bias with beta 0 or 1,
 * alpha 1, no GELU, no pre-activation; in the same order of operations as kiln__gemm_store,
 * so the bits are the same whichever does it. */
typedef struct direct {
    void *c; /* the tile's (0,0) in C */
    int64_t ldc;
    int bf16;          /* C is BF16 */
    int beta;          /* 1: add C's old value */
    const float *bias; /* at the tile's column 0; NULL: none */
    int rows, cols;
} direct;

/* Round to bf16, nearest even, NaN kept quiet: kiln__to_bf16 on 16 lanes. */
TARGET static inline __m256i to_bf16(__m512 x) {
    __m512i u = _mm512_castps_si512(x);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    __m512i nan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    __mmask16 isnan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                              _mm512_set1_epi32(0x7f800000));
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(isnan, r, nan));
}

/* out (MR x NR, leading dimension ldo) = init (same shape; NULL: zeros) + Ap x Bp over kp
 * k-pairs; out may be init. With d, the result goes to C through the epilogue instead. */
TARGET static void kernel(float *out, int64_t ldo, const float *init, int64_t ldi,
                          const uint32_t *ap, const uint32_t *bp, int64_t kp, const direct *d) {
    __m512 acc[MR][NV];
    for (int r = 0; r < MR; r++)
        for (int v = 0; v < NV; v++)
            acc[r][v] = init ? _mm512_loadu_ps(init + r * ldi + 16 * v) : _mm512_setzero_ps();
    for (int64_t p = 0; p < kp; p++) {
        __m512bh b[NV];
        for (int v = 0; v < NV; v++)
            b[v] = (__m512bh)_mm512_loadu_si512(bp + p * NR + 16 * v);
        for (int r = 0; r < MR; r++) {
            __m512bh a = (__m512bh)_mm512_set1_epi32((int)ap[p * MR + r]);
            for (int v = 0; v < NV; v++)
                acc[r][v] = _mm512_dpbf16_ps(acc[r][v], a, b[v]);
        }
    }
    if (!d) {
        for (int r = 0; r < MR; r++)
            for (int v = 0; v < NV; v++)
                _mm512_storeu_ps(out + r * ldo + 16 * v, acc[r][v]);
        return;
    }
    __mmask16 m[NV];
    __m512 bias[NV];
    for (int v = 0; v < NV; v++) {
        int n = d->cols - 16 * v;
        m[v] = n >= 16 ? 0xffff : n > 0 ? (__mmask16)((1u << n) - 1) : 0;
        bias[v] = d->bias ? _mm512_maskz_loadu_ps(m[v], d->bias + 16 * v) : _mm512_setzero_ps();
    }
    for (int r = 0; r < MR; r++) {
        if (r >= d->rows)
            break;
        for (int v = 0; v < NV; v++) {
            __m512 x = acc[r][v];
            if (d->bf16) {
                uint16_t *c = (uint16_t *)d->c + r * d->ldc + 16 * v;
                if (d->beta) {
                    __m512i old = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m[v], c));
                    x = _mm512_add_ps(x, _mm512_castsi512_ps(_mm512_slli_epi32(old, 16)));
                }
                if (d->bias)
                    x = _mm512_add_ps(x, bias[v]);
                _mm256_mask_storeu_epi16(c, m[v], to_bf16(x));
            } else {
                float *c = (float *)d->c + r * d->ldc + 16 * v;
                if (d->beta)
                    x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(m[v], c));
                if (d->bias)
                    x = _mm512_add_ps(x, bias[v]);
                _mm512_mask_storeu_ps(c, m[v], x);
            }
        }
    }
}

/* ---- prefetching the next operand block ----
 * A block read straight from memory is many short row segments (48 columns of B's rows,
 * kc elements of A's), too short for the hardware prefetcher to ramp up on; the loads of
 * the packing would then wait on memory. So while one micro-panel is multiplied, the lines
 * of the next one are requested, a slice before each micro-kernel call. */

typedef struct region {
    const char *base; /* first byte of the first row */
    int64_t stride;   /* bytes between rows */
    int64_t rows;
    int64_t lines; /* 64-byte lines per row */
} region;

/* Rows [r0, r0+rows) x elements [c0, c0+cols) of X (as stored; type dt, leading dim ld). */
static region region_of(const void *x, kiln_dtype dt, int64_t ld, int64_t r0, int64_t rows,
                        int64_t c0, int64_t cols) {
    size_t es = kiln_dtype_size(dt);
    const char *first = (const char *)x + (size_t)(r0 * ld + c0) * es;
    int64_t skew = (int64_t)((uintptr_t)first & 63);
    region r = {first - skew, ld * (int64_t)es, rows > 0 && cols > 0 ? rows : 0,
                (skew + cols * (int64_t)es + 63) / 64};
    return r;
}

/* Lines [from, to) of the region, row by row. */
TARGET static void prefetch(const region *r, int64_t from, int64_t to) {
    int64_t total = r->rows * r->lines;
    to = to < total ? to : total;
    for (int64_t e = from; e < to; e++)
        _mm_prefetch(r->base + (e / r->lines) * r->stride + (e % r->lines) * 64, _MM_HINT_T0);
}

/* The region the packing of op(B)'s columns [j, j+NR) over k in [k0, k0+kc) reads. */
static region b_region(const kiln__gemm_call *g, int64_t j, int64_t k0, int64_t kc) {
    int64_t cols = g->N - j < NR ? g->N - j : NR;
    return g->trans_b ? region_of(g->b, g->b_dt, g->ldb, j, cols, k0, kc)
                      : region_of(g->b, g->b_dt, g->ldb, k0, kc, j, cols);
}

/* ---- one thread's share ---- */

typedef struct share {
    int64_t i0, i1, j0, j1; /* rows and columns of C, tile-aligned */
} share;

TARGET static void run_share(const kiln__gemm_call *g, thread_ws w, share s) {
    int64_t K = g->K, kcb = K <= KC_ONE ? K : KC, nk = (K + kcb - 1) / kcb;
    /* the epilogues the micro-kernel does itself */
    int simple =
        g->alpha == 1.0f && (g->beta == 0.0f || g->beta == 1.0f) && !g->ep.gelu && !g->ep.pre;
    for (int64_t ic = s.i0; ic < s.i1; ic += MC_MAX) {
        int64_t mc = s.i1 - ic < MC_MAX ? s.i1 - ic : MC_MAX;
        int64_t mcp = (mc + MR - 1) / MR * MR;
        /* columns per pass: all of them when one k-block and the kernel stores C itself,
         * else as many as T holds */
        int64_t nc = s.j1 - s.j0;
        if (nk > 1 || !simple) {
            int64_t fit = T_FLOATS / mcp / NR * NR;
            nc = nc < fit ? nc : fit;
        }
        int64_t ncp = (nc + NR - 1) / NR * NR;
        for (int64_t jc = s.j0; jc < s.j1; jc += nc) {
            int64_t ncur = s.j1 - jc < nc ? s.j1 - jc : nc;
            for (int64_t b = 0; b < nk; b++) {
                int64_t k0 = b * kcb, kc = K - k0 < kcb ? K - k0 : kcb, kp = (kc + 1) / 2;
                int first = b == 0, last = b == nk - 1;
                if (nk > 1 || jc == s.j0)
                    pack_a(w.ap, g, ic, mc, k0, kc);
                for (int64_t jr = 0; jr < ncur; jr += NR) {
                    int64_t j = jc + jr, cols = g->N - j < NR ? g->N - j : NR;
                    pack_b(w.bp, g, j, k0, kc);
                    /* what the next pack reads: the next micro-panel, else the next A block */
                    region next;
                    if (jr + NR < ncur)
                        next = b_region(g, j + NR, k0, kc);
                    else if (!last)
                        next = g->trans_a ? region_of(g->a, g->a_dt, g->lda, k0 + kc,
                                                      K - k0 - kc < kcb ? K - k0 - kc : kcb, ic, mc)
                                          : region_of(g->a, g->a_dt, g->lda, ic, mc, k0 + kc,
                                                      K - k0 - kc < kcb ? K - k0 - kc : kcb);
                    else
                        next = (region){NULL, 0, 0, 0};
                    int64_t slice = (next.rows * next.lines + mcp / MR - 1) / (mcp / MR);
                    for (int64_t ir = 0; ir < mc; ir += MR) {
                        prefetch(&next, ir / MR * slice, (ir / MR + 1) * slice);
                        float *tp = w.t + ir * ncp + jr;
                        const uint32_t *ap = w.ap + ir * kp;
                        if (!last || !simple) {
                            kernel(tp, ncp, first ? NULL : tp, ncp, ap, w.bp, kp, NULL);
                            continue;
                        }
                        int64_t i = ic + ir, rows = g->M - i < MR ? g->M - i : MR;
                        if (g->beta != 0.0f && ir + MR < mc) { /* the next tile's C */
                            region rc = region_of(g->c, g->c_dt, g->ldc, i + MR,
                                                  g->M - i - MR < MR ? g->M - i - MR : MR, j, cols);
                            prefetch(&rc, 0, rc.rows * rc.lines);
                        }
                        direct d = {kiln__at(g->c, i * g->ldc + j, g->c_dt),
                                    g->ldc,
                                    g->c_dt == KILN_DTYPE_BF16,
                                    g->beta != 0.0f,
                                    g->ep.bias ? g->ep.bias + j : NULL,
                                    (int)rows,
                                    (int)cols};
                        kernel(NULL, 0, first ? NULL : tp, ncp, ap, w.bp, kp, &d);
                    }
                }
                if (last && !simple) /* the other epilogues, a row of the block at a time */
                    for (int64_t r = 0; r < mc; r++) {
                        float *x = w.t + r * ncp;
                        if (g->alpha != 1.0f)
                            for (int64_t e = 0; e < ncur; e++)
                                x[e] *= g->alpha;
                        kiln__gemm_store(g, x, ncp, ic + r, ic + r + 1, jc, jc + ncur);
                    }
            }
        }
    }
}

/* The thread grid pr x pc minimising the most tiles a thread gets, then the packing that
 * the split repeats (each column group packs all of its rows of A, each row group all of
 * its columns of B). */
static share share_of(const kiln__gemm_call *g, int t, int p) {
    int64_t mt = (g->M + MR - 1) / MR, nt = (g->N + NR - 1) / NR;
    int best_r = 1;
    double best_cost = -1, best_pack = 0;
    for (int pr = 1; pr <= p; pr++) {
        if (p % pr)
            continue;
        int pc = p / pr;
        double cost = (double)((mt + pr - 1) / pr) * (double)((nt + pc - 1) / pc);
        double pack = (double)g->M * (double)g->K * pc + (double)g->N * (double)g->K * pr;
        if (best_cost < 0 || cost < best_cost || (cost == best_cost && pack < best_pack)) {
            best_cost = cost;
            best_pack = pack;
            best_r = pr;
        }
    }
    int pr = best_r, pc = p / pr, tr = t / pc, tc = t % pc;
    share s;
    s.i0 = mt * tr / pr * MR;
    s.i1 = mt * (tr + 1) / pr * MR;
    s.j0 = nt * tc / pc * NR;
    s.j1 = nt * (tc + 1) / pc * NR;
    s.i1 = s.i1 < g->M ? s.i1 : g->M;
    s.j1 = s.j1 < g->N ? s.j1 : g->N;
    return s;
}

kiln_status kiln__gemm_own(const kiln__gemm_call *g) {
    int threads = omp_get_max_threads();
    kiln_status st = ws_get(threads);
    if (st)
        return st;
#pragma omp parallel num_threads(threads)
    {
        int t = omp_get_thread_num(), p = omp_get_num_threads();
        share s = share_of(g, t, p);
        if (s.i0 < s.i1 && s.j0 < s.j1)
            run_share(g, ws_of(t), s);
    }
    return KILN_OK;
}

#else /* no x86-64: the dispatcher never calls this */

kiln_status kiln__gemm_own(const kiln__gemm_call *g) {
    (void)g;
    return kiln_error_setf(KILN_ERR_UNSUPPORTED, "kiln's bf16 kernel is for x86-64 only");
}
void kiln__gemm_own_release(void) {}

#endif
