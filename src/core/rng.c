#include <math.h>
#include <stdlib.h>

#include "kiln/core.h"

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void kiln_rng_seed(kiln_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t kiln_rng_u64(kiln_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

float kiln_rng_uniform(kiln_rng *r) { return (float)(kiln_rng_u64(r) >> 40) * (1.0f / 16777216.0f); }

/* Box-Muller in double from two draws; u1 in (0, 1] so the log is finite. */
static inline float normal_of(uint64_t a, uint64_t b) {
    double u1 = ((double)(a >> 11) + 1.0) * (1.0 / 9007199254740992.0);
    double u2 = (double)(b >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

float kiln_rng_normal(kiln_rng *r) {
    uint64_t a = kiln_rng_u64(r);
    return normal_of(a, kiln_rng_u64(r));
}

/* The draws are sequential and cheap (about a nanosecond each); the logarithm, cosine and
 * square root of each pair cost some 40 ns, so they run on every thread, chunk by chunk. */
void kiln_rng_normal_fill(kiln_rng *r, float *out, int64_t n, float scale) {
    enum { CHUNK = 1 << 15 };
    uint64_t *raw = n >= 1024 ? malloc(2 * sizeof *raw * (size_t)(n < CHUNK ? n : CHUNK)) : NULL;
    if (!raw) { /* small, or no memory for the draws: one at a time */
        for (int64_t i = 0; i < n; i++)
            out[i] = scale * kiln_rng_normal(r);
        return;
    }
    for (int64_t at = 0; at < n; at += CHUNK) {
        int64_t k = n - at < CHUNK ? n - at : CHUNK;
        for (int64_t i = 0; i < 2 * k; i++)
            raw[i] = kiln_rng_u64(r);
        float *o = out + at;
#pragma omp parallel for schedule(static) if (k >= 4096)
        for (int64_t i = 0; i < k; i++)
            o[i] = scale * normal_of(raw[2 * i], raw[2 * i + 1]);
    }
    free(raw);
}

uint64_t kiln_rng_below(kiln_rng *r, uint64_t n) {
    /* Rejection sampling removes the modulo bias. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do {
        x = kiln_rng_u64(r);
    } while (x >= limit);
    return x % n;
}
