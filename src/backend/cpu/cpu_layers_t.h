/* The CPU backend's layer kernels for one dtype, included by cpu_layers.c once per dtype with
 * DT (a kiln_dtype constant) and T(name) (the name with the dtype's suffix) defined. Loads
 * widen to fp32, arithmetic is fp32, stores round once. No include guard: that is the
 * point. */
static inline void T(encoder_forward)(void *out, const int32_t *inp, const void *wte,
                                      const void *wpe, int64_t B, int64_t T, int64_t C) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < B * T; n++) {
        int64_t o = n * C, e = (int64_t)inp[n] * C, p = (n % T) * C;
        if (!wpe) { /* rotary positions: the token's embedding alone */
#pragma omp simd
            for (int64_t c = 0; c < C; c++)
                kiln__st(out, o + c, kiln__ld(wte, e + c, DT), DT);
            continue;
        }
#pragma omp simd
        for (int64_t c = 0; c < C; c++)
            kiln__st(out, o + c, kiln__ld(wte, e + c, DT) + kiln__ld(wpe, p + c, DT), DT);
    }
}

static inline void T(encoder_backward)(float *dwte, float *dwpe, const void *dout,
                                       const int32_t *inp, int64_t B, int64_t T, int64_t C) {
#pragma omp parallel
    {
        int64_t c0, c1;
        kiln__cpu_split(C, omp_get_thread_num(), omp_get_num_threads(), &c0, &c1);
        for (int64_t n = 0; !dwte && dwpe && n < B * T; n++) { /* wpe alone */
            float *dpe = dwpe + (n % T) * C;
#pragma omp simd
            for (int64_t c = c0; c < c1; c++)
                dpe[c] += kiln__ld(dout, n * C + c, DT);
        }
        for (int64_t n = 0; dwte && !dwpe && n < B * T; n++) { /* wte alone */
            float *dwe = dwte + (int64_t)inp[n] * C;
#pragma omp simd
            for (int64_t c = c0; c < c1; c++)
                dwe[c] += kiln__ld(dout, n * C + c, DT);
        }
        for (int64_t n = 0; dwte && dwpe && n < B * T; n++) {
            float *dwe = dwte + (int64_t)inp[n] * C;
            float *dpe = dwpe + (n % T) * C;
#pragma omp simd
            for (int64_t c = c0; c < c1; c++) {
                float d = kiln__ld(dout, n * C + c, DT);
                dwe[c] += d;
                dpe[c] += d;
            }
        }
    }
}

static inline void T(layernorm_row)(void *out, float *mean, float *rstd, void *res, const void *a,
                                    const void *b, const void *weight, const void *bias, int64_t n,
                                    int64_t C) {
    int64_t r = n * C;
    const void *x = a;
    float sum = 0.0f;
    if (res) {
#pragma omp simd reduction(+ : sum)
        for (int64_t c = 0; c < C; c++) {
            kiln__st(res, r + c, kiln__ld(a, r + c, DT) + kiln__ld(b, r + c, DT), DT);
            sum += kiln__ld(res, r + c, DT);
        }
        x = res;
    } else {
#pragma omp simd reduction(+ : sum)
        for (int64_t c = 0; c < C; c++)
            sum += kiln__ld(x, r + c, DT);
    }
    float m = sum / (float)C;
    float var = 0.0f;
#pragma omp simd reduction(+ : var)
    for (int64_t c = 0; c < C; c++) {
        float d = kiln__ld(x, r + c, DT) - m;
        var += d * d;
    }
    float s = 1.0f / sqrtf(var / (float)C + LN_EPS);
#pragma omp simd
    for (int64_t c = 0; c < C; c++)
        kiln__st(out, r + c,
                 (kiln__ld(x, r + c, DT) - m) * s * kiln__ld(weight, c, DT) + kiln__ld(bias, c, DT),
                 DT);
    mean[n] = m;
    rstd[n] = s;
}

static inline void T(layernorm_forward)(void *out, float *mean, float *rstd, void *res,
                                        const void *a, const void *b, const void *weight,
                                        const void *bias, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++)
        T(layernorm_row)(out, mean, rstd, res, a, b, weight, bias, n, C);
}

static inline void T(layernorm_backward)(void *dinp, float *dweight, float *dbias, const void *dout,
                                         const void *inp, const void *weight, const float *mean,
                                         const float *rstd, int64_t N, int64_t C) {
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; n++) {
            int64_t r = n * C;
            float m = mean[n], s = rstd[n];
            float gsum = 0.0f, gxsum = 0.0f;
#pragma omp simd reduction(+ : gsum, gxsum)
            for (int64_t c = 0; c < C; c++) {
                float g = kiln__ld(weight, c, DT) * kiln__ld(dout, r + c, DT);
                gsum += g;
                gxsum += g * (kiln__ld(inp, r + c, DT) - m) * s;
            }
            float gmean = gsum / (float)C, gxmean = gxsum / (float)C;
#pragma omp simd
            for (int64_t c = 0; c < C; c++) {
                float xhat = (kiln__ld(inp, r + c, DT) - m) * s;
                float g = kiln__ld(weight, c, DT) * kiln__ld(dout, r + c, DT);
                kiln__st(dinp, r + c, kiln__ld(dinp, r + c, DT) + s * (g - gmean - xhat * gxmean),
                         DT);
            }
        }
        int64_t c0, c1;
        kiln__cpu_split(C, omp_get_thread_num(), omp_get_num_threads(), &c0, &c1);
        for (int64_t n = 0; n < N; n++) {
            int64_t r = n * C;
            float m = mean[n], s = rstd[n];
#pragma omp simd
            for (int64_t c = c0; c < c1; c++) {
                float d = kiln__ld(dout, r + c, DT);
                dweight[c] += (kiln__ld(inp, r + c, DT) - m) * s * d;
                dbias[c] += d;
            }
        }
    }
}

static inline void T(gelu_forward)(void *out, const void *inp, int64_t n) {
#pragma omp parallel for simd schedule(simd : static)
    for (int64_t i = 0; i < n; i++)
        kiln__st(out, i, gelu(kiln__ld(inp, i, DT)), DT);
}

static inline void T(gelu_backward)(void *dinp, const void *inp, const void *dout, int64_t n) {
#pragma omp parallel for simd schedule(simd : static)
    for (int64_t i = 0; i < n; i++) {
        float x = kiln__ld(inp, i, DT);
        float u = GELU_SCALE * (x + GELU_CUBE * x * x * x);
        float du = GELU_SCALE * (1.0f + 3.0f * GELU_CUBE * x * x);
        float s = kiln__cpu_sigmoidf(2.0f * u);
        kiln__st(dinp, i, (s + 2.0f * x * s * (1.0f - s) * du) * kiln__ld(dout, i, DT), DT);
    }
}

static inline void T(residual)(void *out, const void *a, const void *b, int64_t n) {
#pragma omp parallel for simd schedule(simd : static)
    for (int64_t i = 0; i < n; i++)
        kiln__st(out, i, kiln__ld(a, i, DT) + kiln__ld(b, i, DT), DT);
}

static inline float T(crossentropy_row)(void *d, const void *x, int64_t r, int32_t y, float dloss,
                                        int64_t V, int64_t Vp) {
    float xy = kiln__ld(x, r + y, DT); /* read before d overwrites it */
    float maxv = -INFINITY;
#pragma omp simd reduction(max : maxv)
    for (int64_t i = 0; i < V; i++) {
        float v = kiln__ld(x, r + i, DT);
        maxv = v > maxv ? v : maxv;
    }
    float sum = 0.0f;
    if (d && DT == KILN_DTYPE_F32) {
        float *df = (float *)d + r;
        const float *xf = (const float *)x + r;
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < V; i++) {
            float e = kiln__cpu_expf(xf[i] - maxv);
            df[i] = e;
            sum += e;
        }
        float f = dloss / sum;
#pragma omp simd
        for (int64_t i = 0; i < V; i++)
            df[i] *= f;
        df[y] -= dloss;
        for (int64_t i = V; i < Vp; i++)
            df[i] = 0.0f;
    } else {
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < V; i++)
            sum += kiln__cpu_expf(kiln__ld(x, r + i, DT) - maxv);
        if (d) {
            float f = dloss / sum;
#pragma omp simd
            for (int64_t i = 0; i < V; i++) {
                float p = kiln__cpu_expf(kiln__ld(x, r + i, DT) - maxv) * f;
                kiln__st(d, r + i, i == y ? p - dloss : p, DT);
            }
            for (int64_t i = V; i < Vp; i++)
                kiln__st(d, r + i, 0.0f, DT);
        }
    }
    return logf(sum) + maxv - xy;
}

static inline void T(crossentropy)(float *losses, void *dlogits, const void *logits,
                                   const int32_t *targets, float dloss, int64_t N, int64_t V,
                                   int64_t Vp) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++)
        losses[n] = T(crossentropy_row)(dlogits, logits, n * Vp, targets[n], dloss, V, Vp);
}
