/* Driver for the safetensors cross-check with PyTorch (check_safetensors.py).
 *
 *   st_tool example PATH         write a file of several dtypes with kiln's writer
 *   st_tool dump PATH            print every tensor as kiln reads it
 *   st_tool gpt-save PATH        save a small GPT-2 model, print its parameters from memory
 *   st_tool gpt-load PATH NHEAD  load a GPT-2 file into a model, print its parameters
 *   st_tool dump-as PATH DTYPE   hold the file to its declared dtype, then print every tensor
 *                                read as DTYPE (fp32, bf16, fp16)
 *   st_tool write-as IN OUT HELD STORED   read every tensor of IN as HELD, then write them to
 *                                OUT stored as STORED (converted while writing), declared so
 *
 * Printed lines: "name dtype d0,d1,.. offset hex-bits-of-each-float32-value" (values only
 * for float dtypes; "-" when there are none); dump-as prints each value's bits in DTYPE
 * (8 or 4 hex digits) and first "@declared DTYPE" or "@declared -". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/checkpoint.h"
#include "kiln/safetensors.h"

static int fail(const char *what, kiln_status s) {
    fprintf(stderr, "st_tool: %s: %s: %s\n", what, kiln_status_str(s), kiln_error_message());
    return 1;
}

static void print_line(const char *name, const char *dtype, int ndim, const int64_t *shape,
                       long long offset, const float *v, int64_t n) {
    printf("%s %s ", name, dtype);
    for (int i = 0; i < ndim; i++)
        printf("%s%lld", i ? "," : "", (long long)shape[i]);
    printf("%s %lld ", ndim ? "" : "-", offset);
    for (int64_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, &v[i], 4);
        printf("%08x", b);
    }
    printf("%s\n", n ? "" : "-");
}

static int dump_as(const char *path, const char *type) {
    kiln_dtype d;
    kiln_status s = kiln_dtype_parse(type, &d);
    if (s)
        return fail(type, s);
    kiln_safetensors *f = NULL;
    s = kiln_safetensors_open(&f, path);
    if (s)
        return fail(path, s);
    int declared = 0;
    kiln_dtype dt = KILN_DTYPE_F32;
    s = kiln_safetensors_check_dtype(f, &declared, &dt);
    if (!s)
        printf("@declared %s\n", declared ? kiln_dtype_name(dt) : "-");
    size_t z = kiln_dtype_size(d);
    for (int i = 0; !s && i < kiln_safetensors_num_tensors(f); i++) {
        const kiln_st_tensor *t = kiln_safetensors_tensor(f, i);
        unsigned char *v = malloc((size_t)t->numel * z + 4);
        s = v ? kiln_safetensors_read_as(f, t, d, v) : KILN_ERR_NOMEM;
        if (!s) {
            printf("%s %s ", t->name, kiln_st_dtype_name(t->dtype));
            for (int k = 0; k < t->ndim; k++)
                printf("%s%lld", k ? "," : "", (long long)t->shape[k]);
            printf("%s %lld ", t->ndim ? "" : "-", (long long)t->offset);
            for (int64_t k = 0; k < t->numel; k++) {
                uint32_t b = 0;
                uint16_t h = 0;
                if (z == 4)
                    memcpy(&b, v + 4 * k, 4);
                else
                    memcpy(&h, v + 2 * k, 2), b = h;
                printf(z == 4 ? "%08x" : "%04x", b);
            }
            printf("%s\n", t->numel ? "" : "-");
        }
        free(v);
    }
    kiln_safetensors_close(f);
    return s ? fail(path, s) : 0;
}

static int write_as(const char *in, const char *out, const char *held, const char *stored) {
    kiln_dtype h, st;
    kiln_status s = kiln_dtype_parse(held, &h);
    if (!s)
        s = kiln_dtype_parse(stored, &st);
    if (s)
        return fail("dtype", s);
    kiln_safetensors *f = NULL;
    s = kiln_safetensors_open(&f, in);
    if (s)
        return fail(in, s);
    int n = kiln_safetensors_num_tensors(f);
    void **bufs = calloc((size_t)n + 1, sizeof *bufs);
    kiln_safetensors_writer *w = NULL;
    s = bufs ? kiln_safetensors_writer_init(&w) : KILN_ERR_NOMEM;
    for (int i = 0; !s && i < n; i++) { /* the buffers stay borrowed until the write */
        const kiln_st_tensor *t = kiln_safetensors_tensor(f, i);
        bufs[i] = malloc((size_t)t->numel * kiln_dtype_size(h) + 4);
        s = bufs[i] ? kiln_safetensors_read_as(f, t, h, bufs[i]) : KILN_ERR_NOMEM;
        if (!s)
            s = kiln_safetensors_writer_add_as(w, t->name, st, t->ndim, t->shape, h, bufs[i]);
    }
    if (!s)
        s = kiln_safetensors_writer_declare_dtype(w, st);
    if (!s)
        s = kiln_safetensors_writer_set_metadata(w, "format", "pt");
    if (!s)
        s = kiln_safetensors_writer_write(w, out);
    kiln_safetensors_writer_free(w);
    for (int i = 0; bufs && i < n; i++)
        free(bufs[i]);
    free(bufs);
    kiln_safetensors_close(f);
    return s ? fail(out, s) : 0;
}

static int example(const char *path) {
    static float f32[12];
    static uint16_t f16[5] = {0x3c00, 0xc000, 0x7bff, 0x0001, 0xfc00};
    static uint16_t bf16[6] = {0x3f80, 0x4049, 0xbf80, 0x0001, 0x7f80, 0x8000};
    static int64_t i64[4] = {1, -2, 1LL << 40, -(1LL << 62)};
    static double f64[2] = {0.1, -3.5};
    static float scalar = 2.5f;
    for (int i = 0; i < 12; i++)
        f32[i] = (float)i * 0.5f - 1.0f;
    kiln_safetensors_writer *w = NULL;
    kiln_status s = kiln_safetensors_writer_init(&w);
    int64_t s34[2] = {3, 4}, s5[1] = {5}, s23[2] = {2, 3}, s4[1] = {4}, s03[2] = {0, 3},
            s2[1] = {2};
    if (!s)
        s = kiln_safetensors_writer_add(w, "f32", KILN_ST_DTYPE_F32, 2, s34, f32);
    if (!s)
        s = kiln_safetensors_writer_add(w, "f16", KILN_ST_DTYPE_F16, 1, s5, f16);
    if (!s)
        s = kiln_safetensors_writer_add(w, "bf16", KILN_ST_DTYPE_BF16, 2, s23, bf16);
    if (!s)
        s = kiln_safetensors_writer_add(w, "i64", KILN_ST_DTYPE_I64, 1, s4, i64);
    if (!s)
        s = kiln_safetensors_writer_add(w, "scalar", KILN_ST_DTYPE_F32, 0, NULL, &scalar);
    if (!s)
        s = kiln_safetensors_writer_add(w, "empty", KILN_ST_DTYPE_F32, 2, s03, NULL);
    if (!s)
        s = kiln_safetensors_writer_add(w, "f64", KILN_ST_DTYPE_F64, 1, s2, f64);
    if (!s)
        s = kiln_safetensors_writer_set_metadata(w, "format", "pt");
    if (!s)
        s = kiln_safetensors_writer_set_metadata(w, "note", "caf\xc3\xa9 \"quoted\"");
    if (!s)
        s = kiln_safetensors_writer_write(w, path);
    kiln_safetensors_writer_free(w);
    return s ? fail(path, s) : 0;
}

static int dump(const char *path) {
    kiln_safetensors *f = NULL;
    kiln_status s = kiln_safetensors_open(&f, path);
    if (s)
        return fail(path, s);
    for (int i = 0; i < kiln_safetensors_num_tensors(f); i++) {
        const kiln_st_tensor *t = kiln_safetensors_tensor(f, i);
        float *v = malloc((size_t)t->numel * sizeof(float) + 4);
        int64_t n = kiln_safetensors_read_f32(f, t, v) == KILN_OK ? t->numel : 0;
        print_line(t->name, kiln_st_dtype_name(t->dtype), t->ndim, t->shape, (long long)t->offset,
                   v, n);
        free(v);
    }
    for (int i = 0; i < kiln_safetensors_num_metadata(f); i++) {
        const char *k, *v;
        kiln_safetensors_metadata_at(f, i, &k, &v);
        printf("@meta %s=%s\n", k, v);
    }
    kiln_safetensors_close(f);
    return 0;
}

static void print_model(kiln_gpt *m) {
    const float *p = kiln_gpt_params(m);
    for (int i = 0; i < kiln_gpt_num_tensors(m); i++) {
        const kiln_tensor_info *t = kiln_gpt_tensor(m, i);
        print_line(t->name, "F32", t->ndim, t->shape, (long long)t->offset, p + t->offset,
                   t->numel);
    }
}

static int gpt_save(const char *path) {
    kiln_gpt_config c = {
        .max_seq_len = 8, .vocab_size = 100, .n_layer = 2, .n_head = 2, .n_embd = 16};
    kiln_gpt *m = NULL;
    kiln_status s = kiln_gpt_config_validate(&c);
    if (!s)
        s = kiln_gpt_create(&m, &c, 1, 8, NULL, NULL);
    if (s)
        return fail("creating a model", s);
    kiln_gpt_init_weights(m, 7);
    s = kiln_gpt_save_safetensors(m, path, KILN_DTYPE_F32);
    if (!s)
        print_model(m);
    kiln_gpt_free(m);
    return s ? fail(path, s) : 0;
}

static int gpt_load(const char *path, int64_t heads) {
    kiln_gpt_config c = {.n_head = heads};
    kiln_gpt *m = NULL;
    kiln_status s = kiln_gpt_config_from_safetensors(&c, path);
    if (!s)
        s = kiln_gpt_create(&m, &c, 1, c.max_seq_len, NULL, NULL);
    if (!s)
        s = kiln_gpt_load_safetensors(m, path);
    if (!s) {
        printf("@config %lld %lld %lld %lld %lld\n", (long long)c.n_layer, (long long)c.n_head,
               (long long)c.n_embd, (long long)c.vocab_size, (long long)c.max_seq_len);
        print_model(m);
    }
    kiln_gpt_free(m);
    return s ? fail(path, s) : 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "example"))
        return example(argv[2]);
    if (argc == 3 && !strcmp(argv[1], "dump"))
        return dump(argv[2]);
    if (argc == 3 && !strcmp(argv[1], "gpt-save"))
        return gpt_save(argv[2]);
    if (argc == 4 && !strcmp(argv[1], "gpt-load"))
        return gpt_load(argv[2], atoll(argv[3]));
    if (argc == 4 && !strcmp(argv[1], "dump-as"))
        return dump_as(argv[2], argv[3]);
    if (argc == 6 && !strcmp(argv[1], "write-as"))
        return write_as(argv[2], argv[3], argv[4], argv[5]);
    fprintf(stderr, "usage: st_tool example|dump|gpt-save PATH, gpt-load PATH NHEAD, dump-as PATH "
                    "DTYPE, or write-as IN OUT HELD STORED\n");
    return 2;
}
