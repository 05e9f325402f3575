/* Integer matrix products for quantized inference (gemm_int8.h): the AVX512-VNNI kernel,
 * compiled with target attributes and used only where CPUID says the CPU has VNNI, and the
 * plain kernel that gives the same bits everywhere else.
 *
 * Work is split into tiles of 2 channel blocks (32 output channels; 4 blocks when there are
 * at most MR rows) x up to MC rows; threads take whole tiles, never K, so every output's sum
 * runs in one order whatever the thread count. Inside a tile, MR = 4 rows at a time: 4 x 2
 * int32 accumulators (one per row and block) and as many fp32 ones for the group sums; the
 * VPDPBUSD rate bounds it (measured about 1 int8 TOPS on 2 Zen 4 cores at M >= 64). For one
 * row (sampling's head) the tile is a GEMV reading each packed weight once: 1 byte a weight
 * (int8) or half (int4) instead of fp32's 4, with 4 independent sums in flight. The
 * activations' quantizing pass runs in AVX-512 too where the VNNI kernel does. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/cpu/gemm_int8.h"
#include "core/error.h"
#include "kiln/core.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define TARGET __attribute__((target("avx512f,avx512bw,avx512vnni,fma")))
#define HAVE_VNNI_KERNEL 1
#else
#define HAVE_VNNI_KERNEL 0
#endif

enum {
    MR = 4,      /* rows per micro-tile */
    NRB = 2,     /* channel blocks per tile */
    NRB_FEW = 4, /* ... when there are at most MR rows: a GEMV wants more loads in flight */
    MC = 128     /* rows per tile */
};

/* ---- the CPU ---- */

static int detect_vnni(void) {
    unsigned b = 0, c = 0;
    return kiln__cpu_avx512_leaf7(&b, &c) && ((c >> 11) & 1); /* AVX512_VNNI */
}

int kiln__qgemm_has_vnni(void) {
    static int cached = -1;
    if (cached < 0)
        cached = detect_vnni();
    return cached;
}

static int use_vnni = -1; /* -1: not chosen yet */

static int vnni_now(void) {
    if (use_vnni < 0) {
        const char *e = getenv("KILN_INT8_KERNEL");
        use_vnni = kiln__qgemm_has_vnni() && !(e && !strcmp(e, "plain"));
    }
    return use_vnni;
}

int kiln__qgemm_use_vnni(int on) {
    int prev = vnni_now();
    use_vnni = on && kiln__qgemm_has_vnni();
    return prev;
}

const char *kiln__qgemm_kernel_name(void) {
    return vnni_now() ? "avx512-vnni" : "plain";
}

/* ---- packed weights ---- */

kiln_status kiln__qmat_pack(kiln__qmat *out, const void *q, const float *scale, int64_t rows,
                            int64_t N, int64_t K, int bits, int64_t G) {
    memset(out, 0, sizeof *out);
    if (N < 1 || K < 1 || rows < 0 || rows > N || K > KILN__QMAT_MAX_K || (bits != 8 && bits != 4))
        return kiln_error_setf(KILN_ERR_ARG, "int%d matrix %lld x %lld cannot be packed", bits,
                               (long long)N, (long long)K);
    if (bits == 4 && (G < 8 || G % 8 || K % G))
        return kiln_error_setf(KILN_ERR_ARG,
                               "int4 groups of %lld inputs: need a multiple of 8 dividing %lld",
                               (long long)G, (long long)K);
    int64_t Kp = bits == 8 ? (K + 3) / 4 * 4 : K, Nb = (N + 15) / 16;
    if (bits == 8)
        G = Kp;
    int64_t groups = Kp / G;
    size_t wbytes = (size_t)(Nb * Kp * 16) / (bits == 4 ? 2 : 1);
    out->w = kiln_alloc(wbytes);
    out->scale = kiln_alloc((size_t)(Nb * groups * 16) * sizeof(float));
    if (!out->w || !out->scale) {
        kiln__qmat_free(out);
        return kiln_error_setf(KILN_ERR_NOMEM, "no memory for a %lld x %lld int%d matrix",
                               (long long)N, (long long)K, bits);
    }
    out->N = N, out->K = K, out->Nb = Nb, out->Kp = Kp, out->G = G, out->groups = groups;
    out->bits = bits;
    for (int64_t n = 0; n < Nb * 16; n++) {
        int64_t nb = n / 16, lane = n % 16;
        for (int64_t g = 0; g < groups; g++)
            out->scale[(nb * groups + g) * 16 + lane] = n < rows ? scale[n * groups + g] : 0.0f;
        for (int64_t k = 0; k < Kp; k++) {
            int64_t kq = k / 4, t = k % 4;
            if (bits == 8) {
                int v = n < rows && k < K ? ((const int8_t *)q)[n * K + k] : 0;
                out->w[((nb * (Kp / 4) + kq) * 16 + lane) * 4 + t] = (uint8_t)(v + 128);
            } else {
                const uint8_t *row = (const uint8_t *)q + n * (K / 2);
                int v = n < rows ? (row[k / 2] >> (4 * (k % 2))) & 15 : 8; /* w + 8 */
                uint8_t *b = &out->w[((nb * (Kp / 8) + kq / 2) * 16 + lane) * 4 + t];
                *b = (uint8_t)(kq % 2 ? (*b & 15) | (v << 4) : (*b & 0xf0) | v);
            }
        }
    }
    return KILN_OK;
}

void kiln__qmat_free(kiln__qmat *m) {
    if (!m)
        return;
    kiln_free(m->w);
    kiln_free(m->scale);
    memset(m, 0, sizeof *m);
}

/* ---- activations and buffers ---- */

kiln_status kiln__qact_init(kiln__qact *a, int64_t rows, int64_t Kp, int64_t groups) {
    memset(a, 0, sizeof *a);
    a->q = kiln_alloc((size_t)(rows * Kp));
    a->scale = kiln_alloc((size_t)rows * sizeof(float));
    a->sum = kiln_alloc((size_t)(rows * groups) * sizeof(int32_t));
    if (!a->q || !a->scale || !a->sum) {
        kiln__qact_free(a);
        return kiln_error_setf(KILN_ERR_NOMEM, "no memory for %lld quantized activation rows",
                               (long long)rows);
    }
    a->cap_rows = rows, a->cap_k = Kp, a->cap_groups = groups;
    return KILN_OK;
}

void kiln__qact_free(kiln__qact *a) {
    if (!a)
        return;
    kiln_free(a->q);
    kiln_free(a->scale);
    kiln_free(a->sum);
    memset(a, 0, sizeof *a);
}

kiln_status kiln__qws_init(kiln__qws *ws, int64_t Kp, int threads) {
    memset(ws, 0, sizeof *ws);
    ws->stride = (size_t)(NRB_FEW * Kp * 16);
    ws->threads = threads < 1 ? 1 : threads;
    ws->buf = kiln_alloc(ws->stride * (size_t)ws->threads);
    if (!ws->buf)
        return kiln_error_setf(KILN_ERR_NOMEM, "no memory for int4 unpacking buffers");
    return KILN_OK;
}

void kiln__qws_free(kiln__qws *ws) {
    if (!ws)
        return;
    kiln_free(ws->buf);
    memset(ws, 0, sizeof *ws);
}

static void group_sums(int32_t *sum, const int8_t *q, int64_t Kp, int64_t G) {
    for (int64_t g = 0; g < Kp / G; g++) {
        int32_t s = 0;
        for (int64_t k = g * G; k < (g + 1) * G; k++)
            s += q[k];
        sum[g] = s;
    }
}

/* A row whose largest magnitude is below 127 / FLT_MAX (3.7e-37) would make 127 / amax
 * infinite, and 0 x inf a NaN: such a row is multiplied by 2^64 first (exact: a power of two,
 * and its values become normal floats). 1 otherwise, which changes no product. */
static inline float row_prescale(float amax) {
    return amax < 1e-30f ? 18446744073709551616.0f : 1.0f;
}

/* Row m of x (K) into q (Kp: zeros past K), its scale and its group sums. A row that holds a
 * NaN or an infinity gets a NaN scale: its outputs are NaN, as the fp32 product's would be. */
static void quantize_row(int8_t *q, float *scale, int32_t *sum, const float *x, int64_t K,
                         int64_t Kp, int64_t G) {
    float amax = 0.0f;
    int finite = 1;
    for (int64_t k = 0; k < K; k++) {
        float v = fabsf(x[k]);
        finite &= v <= 3.4028235e38f; /* false for NaN and infinities */
        amax = v > amax ? v : amax;
    }
    if (!finite || amax == 0.0f) {
        memset(q, 0, (size_t)Kp);
        for (int64_t g = 0; g < Kp / G; g++)
            sum[g] = 0;
        *scale = finite ? 0.0f : NAN;
        return;
    }
    float pre = row_prescale(amax), inv = 127.0f / (amax * pre);
    for (int64_t k = 0; k < K; k++) {
        float r = rintf(x[k] * pre * inv);
        q[k] = (int8_t)(r > 127.0f ? 127 : r < -127.0f ? -127 : (int)r);
    }
    memset(q + K, 0, (size_t)(Kp - K));
    group_sums(sum, q, Kp, G);
    *scale = amax / 127.0f;
}

#if HAVE_VNNI_KERNEL
/* quantize_row in 16 lanes: the same products rounded the same way (to nearest even), so the
 * same bytes. */
static TARGET void quantize_row_avx512(int8_t *q, float *scale, int32_t *sum, const float *x,
                                       int64_t K, int64_t Kp, int64_t G) {
    const __m512 big = _mm512_set1_ps(3.4028235e38f);
    __m512 vmax = _mm512_setzero_ps();
    __mmask16 bad = 0;
    for (int64_t k = 0; k < K; k += 16) {
        __mmask16 m = K - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (K - k)) - 1u);
        __m512 v = _mm512_abs_ps(_mm512_maskz_loadu_ps(m, x + k));
        bad |= _mm512_mask_cmp_ps_mask(m, v, big, _CMP_NLE_UQ); /* NaN or infinite */
        vmax = _mm512_max_ps(vmax, v);
    }
    float amax = _mm512_reduce_max_ps(vmax);
    if (bad || amax == 0.0f) {
        memset(q, 0, (size_t)Kp);
        for (int64_t g = 0; g < Kp / G; g++)
            sum[g] = 0;
        *scale = bad ? NAN : 0.0f;
        return;
    }
    float pre = row_prescale(amax);
    const __m512 inv = _mm512_set1_ps(127.0f / (amax * pre)), vpre = _mm512_set1_ps(pre);
    const __m512i hi = _mm512_set1_epi32(127), lo = _mm512_set1_epi32(-127);
    for (int64_t k = 0; k < Kp; k += 16) {
        __mmask16 m = K - k >= 16 ? (__mmask16)0xffff
                      : K > k     ? (__mmask16)((1u << (K - k)) - 1u)
                                  : (__mmask16)0;
        __mmask16 st = Kp - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (Kp - k)) - 1u);
        __m512i r = _mm512_cvtps_epi32(
            _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + k), vpre), inv));
        r = _mm512_max_epi32(_mm512_min_epi32(r, hi), lo);
        _mm512_mask_cvtepi32_storeu_epi8(q + k, st, r);
    }
    group_sums(sum, q, Kp, G);
    *scale = amax / 127.0f;
}
#endif

void kiln__qact_quantize(kiln__qact *a, const float *x, int64_t M, int64_t K, int64_t Kp,
                         int64_t G) {
    int64_t groups = Kp / G;
    int vec = HAVE_VNNI_KERNEL && vnni_now();
#pragma omp parallel for schedule(static) if (M * K >= 65536)
    for (int64_t m = 0; m < M; m++) {
#if HAVE_VNNI_KERNEL
        if (vec) {
            quantize_row_avx512(a->q + m * Kp, a->scale + m, a->sum + m * groups, x + m * K, K, Kp,
                                G);
            continue;
        }
#endif
        quantize_row(a->q + m * Kp, a->scale + m, a->sum + m * groups, x + m * K, K, Kp, G);
    }
    (void)vec;
}

/* Blocks nb0..nb0+nr-1 of an int4 matrix into dst in the int8 layout (for the plain kernel). */
static void unpack4(uint8_t *dst, const kiln__qmat *w, int64_t nb0, int nr) {
    int64_t Kp = w->Kp, half = Kp * 8; /* bytes of a packed block */
    for (int j = 0; j < nr; j++) {
        const uint8_t *src = w->w + (nb0 + j) * half;
        uint8_t *d = dst + j * Kp * 16;
        for (int64_t p = 0; p < Kp / 8; p++)
            for (int b = 0; b < 64; b++) {
                uint8_t v = src[p * 64 + b];
                d[(2 * p) * 64 + b] = v & 15;
                d[(2 * p + 1) * 64 + b] = v >> 4;
            }
    }
}

/* ---- the plain kernel ---- */

/* Rows m0..m0+mr-1 x blocks nb0..nb0+nr-1; wp: block nb0 in the int8 layout (blocks Kp x 16
 * bytes apart). */
static void plain_tile(float *out, int64_t ldo, const kiln__qact *a, int64_t m0, int mr,
                       const kiln__qmat *w, const uint8_t *wp, int64_t nb0, int nr,
                       const float *bias, int zp) {
    int64_t Kp = w->Kp, G = w->G, groups = w->groups;
    for (int i = 0; i < mr; i++) {
        const int8_t *x = a->q + (m0 + i) * Kp;
        for (int j = 0; j < nr; j++) {
            const uint8_t *b = wp + j * Kp * 16;
            float f[16] = {0};
            for (int64_t g = 0; g < groups; g++) {
                int32_t acc[16] = {0};
                for (int64_t k = g * G; k < (g + 1) * G; k += 4)
                    for (int lane = 0; lane < 16; lane++)
                        for (int t = 0; t < 4; t++)
                            acc[lane] += (int32_t)b[(k / 4 * 16 + lane) * 4 + t] * x[k + t];
                int32_t corr = zp * a->sum[(m0 + i) * groups + g];
                const float *s = w->scale + ((nb0 + j) * groups + g) * 16;
                for (int lane = 0; lane < 16; lane++)
                    f[lane] = fmaf((float)(acc[lane] - corr), s[lane], f[lane]);
            }
            float sa = a->scale[m0 + i];
            for (int lane = 0; lane < 16; lane++) {
                int64_t n = (nb0 + j) * 16 + lane;
                if (n < w->N)
                    out[(m0 + i) * ldo + n] = fmaf(f[lane], sa, bias ? bias[n] : 0.0f);
            }
        }
    }
}

/* ---- the AVX512-VNNI kernel ---- */

#if HAVE_VNNI_KERNEL
static inline __attribute__((always_inline)) TARGET void
vnni_body(float *out, int64_t ldo, const kiln__qact *a, int64_t m0, const kiln__qmat *w,
          const uint8_t *wp, int64_t nb0, const float *bias, int zp, const int mr, const int nr,
          const int four) {
    /* four: wp holds int4 blocks (Kp x 8 bytes), unpacked here a pair of quads at a time */
    const int64_t Kp = w->Kp, G = w->G, groups = w->groups, bstride = four ? Kp * 8 : Kp * 16;
    const __m512i nibble = _mm512_set1_epi8(15);
    __m512 f[MR][NRB_FEW];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++)
            f[i][j] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        __m512i acc[MR][NRB_FEW];
        for (int i = 0; i < mr; i++)
            for (int j = 0; j < nr; j++)
                acc[i][j] = _mm512_setzero_si512();
        const uint8_t *wg = wp + g * G * (four ? 8 : 16);
        const int8_t *xg = a->q + m0 * Kp + g * G;
        for (int64_t k = 0; four && k < G; k += 8) {
            __m512i wl[NRB_FEW], wh[NRB_FEW];
            for (int j = 0; j < nr; j++) {
                __m512i v = _mm512_load_si512((const void *)(wg + j * bstride + k * 8));
                wl[j] = _mm512_and_si512(v, nibble);
                wh[j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
            }
            for (int i = 0; i < mr; i++) {
                int32_t q0, q1;
                memcpy(&q0, xg + i * Kp + k, 4);
                memcpy(&q1, xg + i * Kp + k + 4, 4);
                __m512i x0 = _mm512_set1_epi32(q0), x1 = _mm512_set1_epi32(q1);
                for (int j = 0; j < nr; j++) {
                    acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], wl[j], x0);
                    acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], wh[j], x1);
                }
            }
        }
        for (int64_t k = 0; !four && k < G; k += 4) {
            __m512i wv[NRB_FEW];
            for (int j = 0; j < nr; j++)
                wv[j] = _mm512_load_si512((const void *)(wg + j * bstride + k * 16));
            for (int i = 0; i < mr; i++) {
                int32_t quad;
                memcpy(&quad, xg + i * Kp + k, 4);
                __m512i xv = _mm512_set1_epi32(quad);
                for (int j = 0; j < nr; j++)
                    acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], wv[j], xv);
            }
        }
        for (int i = 0; i < mr; i++) {
            __m512i corr = _mm512_set1_epi32(zp * a->sum[(m0 + i) * groups + g]);
            for (int j = 0; j < nr; j++) {
                __m512 s = _mm512_load_ps(w->scale + ((nb0 + j) * groups + g) * 16);
                __m512 d = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[i][j], corr));
                f[i][j] = _mm512_fmadd_ps(d, s, f[i][j]);
            }
        }
    }
    for (int i = 0; i < mr; i++) {
        __m512 sa = _mm512_set1_ps(a->scale[m0 + i]);
        for (int j = 0; j < nr; j++) {
            int64_t n0 = (nb0 + j) * 16;
            if (n0 >= w->N)
                continue;
            __mmask16 mask =
                w->N - n0 >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (w->N - n0)) - 1u);
            __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + n0) : _mm512_setzero_ps();
            _mm512_mask_storeu_ps(out + (m0 + i) * ldo + n0, mask, _mm512_fmadd_ps(f[i][j], sa, b));
        }
    }
}

#define VNNI_TILE(R, C)                                                                            \
    static TARGET void vnni_tile_##R##_##C(float *out, int64_t ldo, const kiln__qact *a,           \
                                           int64_t m0, const kiln__qmat *w, const uint8_t *wp,     \
                                           int64_t nb0, const float *bias, int zp) {               \
        vnni_body(out, ldo, a, m0, w, wp, nb0, bias, zp, R, C, 0);                                 \
    }                                                                                              \
    static TARGET void vnni4_tile_##R##_##C(float *out, int64_t ldo, const kiln__qact *a,          \
                                            int64_t m0, const kiln__qmat *w, const uint8_t *wp,    \
                                            int64_t nb0, const float *bias, int zp) {              \
        vnni_body(out, ldo, a, m0, w, wp, nb0, bias, zp, R, C, 1);                                 \
    }
#define VNNI_TILES(R) VNNI_TILE(R, 1) VNNI_TILE(R, 2) VNNI_TILE(R, 3) VNNI_TILE(R, 4)
VNNI_TILES(1)
VNNI_TILES(2)
VNNI_TILES(3)
VNNI_TILES(4)

typedef void vnni_tile_fn(float *, int64_t, const kiln__qact *, int64_t, const kiln__qmat *,
                          const uint8_t *, int64_t, const float *, int);
#define VNNI_ROW(P, C)                                                                             \
    { P##_1_##C, P##_2_##C, P##_3_##C, P##_4_##C }
/* [int4][blocks - 1][rows - 1] */
static vnni_tile_fn *const vnni_tiles[2][NRB_FEW][MR] = {
    {VNNI_ROW(vnni_tile, 1), VNNI_ROW(vnni_tile, 2), VNNI_ROW(vnni_tile, 3),
     VNNI_ROW(vnni_tile, 4)},
    {VNNI_ROW(vnni4_tile, 1), VNNI_ROW(vnni4_tile, 2), VNNI_ROW(vnni4_tile, 3),
     VNNI_ROW(vnni4_tile, 4)},
};
#endif

/* ---- the product ---- */

void kiln__qgemm_from(float *out, int64_t ldo, const kiln__qact *a, const kiln__qmat *w,
                      const float *bias, int64_t M, kiln__qws *ws) {
    int nrb = M <= MR ? NRB_FEW : NRB;
    int64_t pairs = (w->Nb + nrb - 1) / nrb, chunks = (M + MC - 1) / MC, tiles = pairs * chunks;
    int zp = w->bits == 8 ? 128 : 8, vnni = vnni_now();
    int threads = omp_get_max_threads(), unpack = w->bits == 4 && !vnni; /* VNNI: in registers */
    if (unpack && ws->threads < threads)
        threads = ws->threads;
    if (tiles < threads)
        threads = (int)tiles;
#pragma omp parallel num_threads(threads)
    {
        uint8_t *buf = unpack ? ws->buf + ws->stride * (size_t)omp_get_thread_num() : NULL;
        int64_t unpacked = -1; /* the pair buf holds */
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tiles; t++) {
            int64_t pair = t / chunks, m_lo = t % chunks * MC;
            int64_t m_hi = m_lo + MC < M ? m_lo + MC : M, nb0 = pair * nrb;
            int nr = w->Nb - nb0 < nrb ? (int)(w->Nb - nb0) : nrb;
            const uint8_t *wp = w->w + nb0 * w->Kp * (w->bits == 4 ? 8 : 16);
            if (buf) {
                if (unpacked != pair)
                    unpack4(buf, w, nb0, nr);
                unpacked = pair;
                wp = buf;
            }
            for (int64_t m0 = m_lo; m0 < m_hi; m0 += MR) {
                int mr = m_hi - m0 < MR ? (int)(m_hi - m0) : MR;
#if HAVE_VNNI_KERNEL
                if (vnni) {
                    vnni_tiles[w->bits == 4][nr - 1][mr - 1](out, ldo, a, m0, w, wp, nb0, bias, zp);
                    continue;
                }
#endif
                plain_tile(out, ldo, a, m0, mr, w, wp, nb0, nr, bias, zp);
            }
        }
    }
    (void)vnni;
}

void kiln__qgemm(float *out, int64_t ldo, const float *x, const kiln__qmat *w, const float *bias,
                 int64_t M, kiln__qact *a, kiln__qws *ws) {
    kiln__qact_quantize(a, x, M, w->K, w->Kp, w->G);
    kiln__qgemm_from(out, ldo, a, w, bias, M, ws);
}
