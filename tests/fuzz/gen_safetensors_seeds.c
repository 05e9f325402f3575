/* Writes the seed corpus for fuzz_safetensors into a folder: valid files made by kiln's
 * writer (every dtype, metadata, scalars, empty tensors, a GPT-2-shaped block) and
 * hand-made near misses (each breaks one rule of the format). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/safetensors.h"

static const char *out_dir;
static int written;

static int save_bytes(const char *name, const void *bytes, size_t size) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", out_dir, name);
    FILE *fp = fopen(path, "wb");
    if (!fp || fwrite(bytes, 1, size, fp) != size || fclose(fp) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        return 1;
    }
    written++;
    return 0;
}

/* 8-byte length, the header, then data_size bytes counting up. */
static int save_raw(const char *name, const char *json, size_t data_size) {
    size_t n = strlen(json), size = 8 + n + data_size;
    unsigned char *b = malloc(size);
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(b + 8, json, n);
    for (size_t i = 0; i < data_size; i++)
        b[8 + n + i] = (unsigned char)(i * 37 + 1);
    int rc = save_bytes(name, b, size);
    free(b);
    return rc;
}

static int save_writer(const char *name, kiln_safetensors_writer *w) {
    void *mem = NULL;
    size_t size = 0;
    kiln_status s = kiln_safetensors_writer_to_memory(w, &mem, &size);
    kiln_safetensors_writer_free(w);
    if (s != KILN_OK) {
        fprintf(stderr, "%s: %s\n", name, kiln_error_message());
        return 1;
    }
    int rc = save_bytes(name, mem, size);
    free(mem);
    return rc;
}

static int valid_seeds(void) {
    static unsigned char bytes[4096];
    for (size_t i = 0; i < sizeof bytes; i++)
        bytes[i] = (unsigned char)(i * 131 + 7);
    int rc = 0;
    kiln_safetensors_writer *w = NULL;

    /* one tensor of each dtype, shapes of rank 0..3 */
    kiln_safetensors_writer_init(&w);
    for (int d = 0; d < KILN_ST_DTYPE_COUNT; d++) {
        int64_t shape[3] = {2, 1 + d % 3, 3};
        char name[32];
        snprintf(name, sizeof name, "t%d.%s", d, kiln_st_dtype_name((kiln_st_dtype)d));
        kiln_safetensors_writer_add(w, name, (kiln_st_dtype)d, d % 4, shape, bytes);
    }
    kiln_safetensors_writer_set_metadata(w, "format", "pt");
    rc |= save_writer("valid_dtypes", w);

    /* empty tensors and a scalar, no metadata */
    kiln_safetensors_writer_init(&w);
    int64_t e[2] = {0, 7}, one[1] = {1};
    kiln_safetensors_writer_add(w, "empty", KILN_ST_DTYPE_F32, 2, e, NULL);
    kiln_safetensors_writer_add(w, "scalar", KILN_ST_DTYPE_F64, 0, NULL, bytes);
    kiln_safetensors_writer_add(w, "one", KILN_ST_DTYPE_BF16, 1, one, bytes);
    rc |= save_writer("valid_empty_scalar", w);

    /* names and metadata of the GPT-2 kind, with kiln's metadata */
    kiln_safetensors_writer_init(&w);
    int64_t C = 4, V = 5, T = 3, wte[2] = {V, C}, wpe[2] = {T, C}, c[1] = {C};
    int64_t attn[2] = {C, 3 * C}, b3[1] = {3 * C};
    kiln_safetensors_writer_add(w, "wte.weight", KILN_ST_DTYPE_F32, 2, wte, bytes);
    kiln_safetensors_writer_add(w, "wpe.weight", KILN_ST_DTYPE_F32, 2, wpe, bytes);
    kiln_safetensors_writer_add(w, "h.0.ln_1.weight", KILN_ST_DTYPE_F32, 1, c, bytes);
    kiln_safetensors_writer_add(w, "h.0.attn.c_attn.weight", KILN_ST_DTYPE_F16, 2, attn, bytes);
    kiln_safetensors_writer_add(w, "h.0.attn.c_attn.bias", KILN_ST_DTYPE_BF16, 1, b3, bytes);
    kiln_safetensors_writer_add(w, "ln_f.bias", KILN_ST_DTYPE_F32, 1, c, bytes);
    kiln_safetensors_writer_set_metadata(w, "format", "pt");
    kiln_safetensors_writer_set_metadata(w, "kiln.n_layer", "1");
    kiln_safetensors_writer_set_metadata(w, "kiln.n_embd", "4");
    kiln_safetensors_writer_set_metadata(w, "escaped \"key\"", "line\nbreak \\ \u00e9");
    rc |= save_writer("valid_gpt_like", w);

    /* mixed precision: a declared dtype kept, values past F16's range, an unaligned F32
     * tensor after an odd-length BF16 one; and a declared dtype a tensor breaks */
    static float big[4] = {1.0f, 65519.0f, 65520.0f, -1e5f}, fits[3] = {1.0f, 65519.0f, -2.0f};
    int64_t four[1] = {4}, three[1] = {3};
    kiln_safetensors_writer_init(&w);
    kiln_safetensors_writer_add_as(w, "h.0.mlp.c_fc.weight", KILN_DTYPE_BF16, 1, four,
                                   KILN_DTYPE_F32, big);
    kiln_safetensors_writer_add_as(w, "odd", KILN_DTYPE_BF16, 1, three, KILN_DTYPE_F32, big);
    kiln_safetensors_writer_declare_dtype(w, KILN_DTYPE_BF16);
    rc |= save_writer("valid_declared_bf16", w);
    kiln_safetensors_writer_init(&w);
    kiln_safetensors_writer_add_as(w, "odd", KILN_DTYPE_F16, 1, three, KILN_DTYPE_F32, fits);
    kiln_safetensors_writer_add(w, "wide", KILN_ST_DTYPE_F32, 1, four, big);
    rc |= save_writer("valid_unaligned_overflow", w);
    rc |= save_raw("valid_declared_mismatch",
                   "{\"__metadata__\":{\"kiln.dtype\":\"fp16\"},"
                   "\"a\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[0,2]},"
                   "\"h.3.mlp.c_fc.weight\":{\"dtype\":\"F32\",\"shape\":[1],"
                   "\"data_offsets\":[2,6]}}",
                   6);

    /* hand-written valid headers: unsorted data, unpadded header, odd alignment */
    rc |= save_raw("valid_unsorted",
                   "{\"b\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[4,7]},"
                   "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                   7);
    rc |= save_raw("valid_minimal", "{}", 0);
    return rc;
}

/* Each of these breaks exactly one rule. */
static int near_misses(void) {
    static const struct {
        const char *json;
        size_t data;
    } cases[] = {
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
         12},
        {"{\"a\":{\"dtype\":\"F99\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,2],\"data_offsets\":[0,1]}}",
         1},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":0}}", 4},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
         8},
        {"{\"__metadata__\":{\"k\":1}}", 0},
        {"{\"__metadata__\":[]}", 0},
        {"{\"a\":[1,2]}", 0},
        {"{\"a\":", 0},
        {"{}garbage", 0},
        {"[]", 0},
    };
    int rc = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "miss_%02zu", i);
        rc |= save_raw(name, cases[i].json, cases[i].data);
    }
    /* lengths: short file, length past the end, absurd length */
    unsigned char b[16] = {0x10, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '};
    rc |= save_bytes("miss_short", b, 5);
    rc |= save_bytes("miss_past_end", b, 16);
    b[0] = 0;
    b[4] = 0x40;
    rc |= save_bytes("miss_absurd", b, 16);
    return rc;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
        return 2;
    }
    out_dir = argv[1];
    int rc = valid_seeds() | near_misses();
    fprintf(stderr, "%d seed files in %s\n", written, out_dir);
    return rc ? 1 : 0;
}
