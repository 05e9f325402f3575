/* The CPU backend's Llama-family kernels for one dtype, included by cpu_llama.c once per dtype
 * with DT and T(name) defined (as cpu_layers_t.h is). Loads widen to fp32, arithmetic is fp32,
 * stores round once. No include guard: that is the point. */

/* One row: res = a + b (stored, rounded) when res is not NULL, then out = x rstd w. */
static inline void T(rmsnorm_row)(void *out, float *rstd, void *res, const void *a, const void *b,
                                  const void *weight, int64_t n, int64_t C, float eps) {
    int64_t r = n * C;
    const void *x = a;
    float ss = 0.0f;
    if (res) {
#pragma omp simd reduction(+ : ss)
        for (int64_t c = 0; c < C; c++) {
            kiln__st(res, r + c, kiln__ld(a, r + c, DT) + kiln__ld(b, r + c, DT), DT);
            float v = kiln__ld(res, r + c, DT);
            ss += v * v;
        }
        x = res;
    } else {
#pragma omp simd reduction(+ : ss)
        for (int64_t c = 0; c < C; c++) {
            float v = kiln__ld(x, r + c, DT);
            ss += v * v;
        }
    }
    float s = 1.0f / sqrtf(ss / (float)C + eps);
#pragma omp simd
    for (int64_t c = 0; c < C; c++)
        kiln__st(out, r + c, kiln__ld(x, r + c, DT) * s * kiln__ld(weight, c, DT), DT);
    rstd[n] = s;
}

static inline void T(rmsnorm_forward)(void *out, float *rstd, void *res, const void *a,
                                      const void *b, const void *weight, int64_t N, int64_t C,
                                      float eps) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++)
        T(rmsnorm_row)(out, rstd, res, a, b, weight, n, C, eps);
}

/* dinp += rstd (w dy) - x rstd^3 mean(x w dy) by rows; dweight += sum_n x rstd dy by channel
 * ranges (each thread its own channels, the rows in order). */
static inline void T(rmsnorm_backward)(void *dinp, float *dweight, const void *dout,
                                       const void *inp, const void *weight, const float *rstd,
                                       int64_t N, int64_t C) {
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; n++) {
            int64_t r = n * C;
            float s = rstd[n], dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int64_t c = 0; c < C; c++)
                dot +=
                    kiln__ld(inp, r + c, DT) * kiln__ld(weight, c, DT) * kiln__ld(dout, r + c, DT);
            float k = s * s * s * dot / (float)C;
#pragma omp simd
            for (int64_t c = 0; c < C; c++) {
                float g = kiln__ld(weight, c, DT) * kiln__ld(dout, r + c, DT);
                kiln__st(dinp, r + c,
                         kiln__ld(dinp, r + c, DT) + s * g - kiln__ld(inp, r + c, DT) * k, DT);
            }
        }
        int64_t c0, c1;
        kiln__cpu_split(C, omp_get_thread_num(), omp_get_num_threads(), &c0, &c1);
        for (int64_t n = 0; n < N; n++) {
            int64_t r = n * C;
            float s = rstd[n];
#pragma omp simd
            for (int64_t c = c0; c < c1; c++)
                dweight[c] += kiln__ld(inp, r + c, DT) * s * kiln__ld(dout, r + c, DT);
        }
    }
}

/* The q and k heads of each row rotated by sign x angle; tab holds cos, sin of position p at
 * tab[(p * half + i) * 2]. */
static inline void T(rope)(void *x, const float *tab, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                           int64_t hs, int64_t pos0, float sign) {
    int64_t W = (NH + 2 * NKV) * hs, half = hs / 2;
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < B * T; n++) {
        const float *cs = tab + (pos0 + n % T) * half * 2;
        for (int64_t h = 0; h < NH + NKV; h++) {
            int64_t o = n * W + h * hs;
#pragma omp simd
            for (int64_t i = 0; i < half; i++) {
                float c = cs[2 * i], s = sign * cs[2 * i + 1];
                float x0 = kiln__ld(x, o + i, DT), x1 = kiln__ld(x, o + i + half, DT);
                kiln__st(x, o + i, x0 * c - x1 * s, DT);
                kiln__st(x, o + i + half, x1 * c + x0 * s, DT);
            }
        }
    }
}

static inline void T(swiglu_forward)(void *out, const void *inp, int64_t N, int64_t H) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
#pragma omp simd
        for (int64_t j = 0; j < H; j++) {
            float g = kiln__ld(inp, n * 2 * H + j, DT), u = kiln__ld(inp, n * 2 * H + H + j, DT);
            kiln__st(out, n * H + j, g * kiln__cpu_sigmoidf(g) * u, DT);
        }
    }
}

static inline void T(swiglu_backward)(void *dinp, const void *inp, const void *dout, int64_t N,
                                      int64_t H) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
#pragma omp simd
        for (int64_t j = 0; j < H; j++) {
            float g = kiln__ld(inp, n * 2 * H + j, DT), u = kiln__ld(inp, n * 2 * H + H + j, DT);
            float dy = kiln__ld(dout, n * H + j, DT), s = kiln__cpu_sigmoidf(g);
            kiln__st(dinp, n * 2 * H + j, dy * u * s * (1.0f + g * (1.0f - s)), DT);
            kiln__st(dinp, n * 2 * H + H + j, dy * g * s, DT);
        }
    }
}
