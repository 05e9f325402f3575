/* libFuzzer target for the safetensors reader and writer.
 *
 * For any input: opening either fails with a message naming the file, or yields tensors
 * whose bytes all lie inside the input, tile the data buffer, convert to floats when they
 * are floats, and survive a write and re-read unchanged. Any broken promise traps. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/safetensors.h"

#define REQUIRE(cond)                                                                              \
    do {                                                                                           \
        if (!(cond))                                                                               \
            __builtin_trap();                                                                      \
    } while (0)

static unsigned touch(const kiln_st_tensor *t) {
    const unsigned char *p = t->data;
    unsigned sum = 0;
    for (size_t i = 0; i < t->nbytes; i++)
        sum += p[i];
    return sum;
}

static int is_float(kiln_st_dtype d) {
    return d == KILN_ST_DTYPE_F32 || d == KILN_ST_DTYPE_F16 || d == KILN_ST_DTYPE_BF16 ||
           d == KILN_ST_DTYPE_F64;
}

/* Write every tensor and metadata entry back out and read the result: the same listing. */
static void round_trip(const kiln_safetensors *f) {
    kiln_safetensors_writer *w = NULL;
    REQUIRE(kiln_safetensors_writer_init(&w) == KILN_OK);
    int n = kiln_safetensors_num_tensors(f);
    for (int i = 0; i < n; i++) {
        const kiln_st_tensor *t = kiln_safetensors_tensor(f, i);
        REQUIRE(kiln_safetensors_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data) ==
                KILN_OK);
    }
    for (int i = 0; i < kiln_safetensors_num_metadata(f); i++) {
        const char *k, *v;
        kiln_safetensors_metadata_at(f, i, &k, &v);
        REQUIRE(kiln_safetensors_writer_set_metadata(w, k, v) == KILN_OK);
    }
    void *mem = NULL;
    size_t size = 0;
    kiln_status s = kiln_safetensors_writer_to_memory(w, &mem, &size);
    kiln_safetensors_writer_free(w);
    if (s == KILN_ERR_NOMEM)
        return;
    REQUIRE(s == KILN_OK);
    kiln_safetensors *g = NULL;
    REQUIRE(kiln_safetensors_open_memory(&g, mem, size, "rewritten") == KILN_OK);
    REQUIRE(kiln_safetensors_num_tensors(g) == n);
    REQUIRE(kiln_safetensors_num_metadata(g) == kiln_safetensors_num_metadata(f));
    for (int i = 0; i < n; i++) {
        const kiln_st_tensor *a = kiln_safetensors_tensor(f, i);
        const kiln_st_tensor *b = kiln_safetensors_tensor(g, i);
        REQUIRE(strcmp(a->name, b->name) == 0 && a->dtype == b->dtype && a->ndim == b->ndim);
        REQUIRE(a->offset == b->offset && a->nbytes == b->nbytes);
        REQUIRE(memcmp(a->shape, b->shape, sizeof a->shape[0] * (size_t)a->ndim) == 0);
        REQUIRE(a->nbytes == 0 || memcmp(a->data, b->data, a->nbytes) == 0);
    }
    for (int i = 0; i < kiln_safetensors_num_metadata(f); i++) {
        const char *k, *v;
        kiln_safetensors_metadata_at(f, i, &k, &v);
        const char *v2 = kiln_safetensors_metadata(g, k);
        REQUIRE(v2 && strcmp(v, v2) == 0);
    }
    kiln_safetensors_close(g);
    free(mem);
}

/* Keeps the reads of every byte from being optimised away. */
static volatile unsigned fuzz_sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kiln_safetensors *f = NULL;
    kiln_status s = kiln_safetensors_open_memory(&f, data, size, "fuzz-input");
    if (s != KILN_OK) {
        REQUIRE(f == NULL);
        REQUIRE(s == KILN_ERR_FORMAT || s == KILN_ERR_UNSUPPORTED || s == KILN_ERR_NOMEM);
        REQUIRE(strstr(kiln_error_message(), "fuzz-input") != NULL);
        return 0;
    }
    int n = kiln_safetensors_num_tensors(f);
    size_t expect = 0;
    unsigned sink = 0;
    for (int i = 0; i < n; i++) {
        const kiln_st_tensor *t = kiln_safetensors_tensor(f, i);
        const unsigned char *p = t->data;
        REQUIRE(p >= data && p + t->nbytes <= data + size);
        REQUIRE(t->offset == expect);
        REQUIRE(t->nbytes == (size_t)t->numel * kiln_st_dtype_size(t->dtype));
        expect += t->nbytes;
        REQUIRE(kiln_safetensors_find(f, t->name) == t);
        sink += touch(t);
        if (is_float(t->dtype)) {
            float *out = malloc((size_t)t->numel * sizeof(float) + 1);
            REQUIRE(out != NULL);
            REQUIRE(kiln_safetensors_read_f32(f, t, out) == KILN_OK);
            for (int64_t k = 0; k < t->numel; k++)
                sink += out[k] == out[k];
            free(out);
        }
    }
    REQUIRE(8 + expect <= size);
    for (int i = 0; i < kiln_safetensors_num_metadata(f); i++) {
        const char *k, *v;
        kiln_safetensors_metadata_at(f, i, &k, &v);
        REQUIRE(k && v && kiln_safetensors_metadata(f, k) != NULL);
    }
    fuzz_sink = sink;
    round_trip(f);
    kiln_safetensors_close(f);
    return 0;
}
