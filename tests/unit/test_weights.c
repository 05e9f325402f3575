/* GPT-2 weights as safetensors: save and load bit for bit, Hugging Face variants (prefix,
 * mask buffers, lm_head, F16/BF16), and the errors of files that do not fit the model. */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln/checkpoint.h"
#include "kiln/core.h"
#include "kiln/safetensors.h"
#include "test.h"

static char dir[256];
static char path_a[512], path_x[512];

static kiln_gpt_config small_config(int64_t L, int64_t C) {
    kiln_gpt_config c;
    memset(&c, 0, sizeof c);
    c.n_layer = L;
    c.n_head = 2;
    c.n_embd = C;
    c.vocab_size = 100; /* padded to 128: 28 padded rows */
    c.max_seq_len = 8;
    kiln_gpt_config_validate(&c);
    return c;
}

static kiln_gpt *make_model(int64_t L, int64_t C, uint64_t seed) {
    kiln_gpt_config c = small_config(L, C);
    kiln_gpt *m = NULL;
    CHECK_OK(kiln_gpt_create(&m, &c, 1, 8, NULL, NULL));
    if (m)
        kiln_gpt_init_weights(m, seed);
    return m;
}

static size_t slab_bytes(const kiln_gpt *m) { return (size_t)kiln_gpt_slab_len(m) * sizeof(float); }

static uint16_t to_bf16(float x) { /* truncation: exact to read back */
    uint32_t b;
    memcpy(&b, &x, 4);
    return (uint16_t)(b >> 16);
}

/* Options for a hand-made file built from model m's tensors. */
typedef struct variant {
    const char *prefix;  /* put before every name ("transformer.") */
    kiln_st_dtype dtype; /* F32 or BF16 */
    int buffers;         /* add attn.bias / attn.masked_bias buffers */
    int lm_head;         /* 1: equal copy of wte, 2: a different one */
    const char *skip;    /* leave this tensor out */
    const char *as_i32;  /* write this tensor as I32 */
    const char *extra;   /* add a tensor of this name */
    int duplicate_wte;   /* add wte both with and without the prefix */
} variant;

static kiln_status write_variant(kiln_gpt *m, const char *path, const variant *v) {
    kiln_safetensors_writer *w = NULL;
    kiln_status s = kiln_safetensors_writer_init(&w);
    if (s != KILN_OK)
        return s;
    const float *p = kiln_gpt_params(m);
    uint16_t *half = kiln_alloc(slab_bytes(m) / 2 + 64);
    float *other = kiln_alloc(slab_bytes(m));
    static const float mask[64] = {1};
    static const int64_t mask_shape[4] = {1, 1, 8, 8};
    char name[128];
    for (int i = 0; i < kiln_gpt_num_tensors(m); i++) {
        const kiln_tensor_info *t = kiln_gpt_tensor(m, i);
        if (v->skip && !strcmp(t->name, v->skip))
            continue;
        snprintf(name, sizeof name, "%s%s", v->prefix ? v->prefix : "", t->name);
        const void *data = p + t->offset;
        kiln_st_dtype dt = v->dtype;
        if (dt == KILN_ST_DTYPE_BF16) {
            for (int64_t k = 0; k < t->numel; k++)
                half[t->offset + k] = to_bf16(p[t->offset + k]);
            data = half + t->offset;
        }
        if (v->as_i32 && !strcmp(t->name, v->as_i32))
            dt = KILN_ST_DTYPE_I32;
        kiln_safetensors_writer_add(w, name, dt, t->ndim, t->shape, data);
        if (v->duplicate_wte && i == 0)
            kiln_safetensors_writer_add(w, t->name, dt, t->ndim, t->shape, data);
        if (v->lm_head && i == 0) {
            if (v->lm_head == 2) {
                memcpy(other, p, (size_t)t->numel * sizeof(float));
                other[5] += 1.0f;
                data = other;
                dt = KILN_ST_DTYPE_F32;
            }
            kiln_safetensors_writer_add(w, "lm_head.weight", dt, t->ndim, t->shape, data);
        }
        if (v->buffers && t->layer >= 0 && strstr(t->name, "ln_1.weight")) {
            snprintf(name, sizeof name, "%sh.%d.attn.bias", v->prefix ? v->prefix : "", t->layer);
            kiln_safetensors_writer_add(w, name, KILN_ST_DTYPE_F32, 4, mask_shape, mask);
            snprintf(name, sizeof name, "%sh.%d.attn.masked_bias", v->prefix ? v->prefix : "",
                     t->layer);
            kiln_safetensors_writer_add(w, name, KILN_ST_DTYPE_F32, 0, NULL, mask);
        }
    }
    if (v->extra) {
        int64_t one = 1;
        kiln_safetensors_writer_add(w, v->extra, KILN_ST_DTYPE_F32, 1, &one, mask);
    }
    s = kiln_safetensors_writer_write(w, path);
    kiln_safetensors_writer_free(w);
    kiln_free(half);
    kiln_free(other);
    return s;
}

static void test_save_load_bits(void) {
    kiln_gpt *a = make_model(2, 16, 1), *b = make_model(2, 16, 2);
    if (!a || !b)
        goto done;
    CHECK_TRUE(memcmp(kiln_gpt_params(a), kiln_gpt_params(b), slab_bytes(a)) != 0);
    CHECK_OK(kiln_gpt_save_safetensors(a, path_a, KILN_DTYPE_F32));
    CHECK_OK(kiln_gpt_load_safetensors(b, path_a));
    CHECK_TRUE(memcmp(kiln_gpt_params(a), kiln_gpt_params(b), slab_bytes(a)) == 0);

    /* The file: Hugging Face names and shapes, F32, kiln's metadata, no padded rows. */
    kiln_safetensors *f = NULL;
    CHECK_OK(kiln_safetensors_open(&f, path_a));
    if (f) {
        CHECK_INT_EQ(kiln_safetensors_num_tensors(f), 2 + 12 * 2 + 2);
        const kiln_st_tensor *t = kiln_safetensors_find(f, "wte.weight");
        CHECK_TRUE(t && t->ndim == 2 && t->shape[0] == 100 && t->shape[1] == 16);
        t = kiln_safetensors_find(f, "h.1.mlp.c_fc.weight");
        CHECK_TRUE(t && t->dtype == KILN_ST_DTYPE_F32 && t->shape[0] == 16 && t->shape[1] == 64);
        CHECK_TRUE(kiln_safetensors_find(f, "h.0.attn.c_attn.bias") != NULL);
        CHECK_STR_EQ(kiln_safetensors_metadata(f, "format"), "pt");
        CHECK_STR_EQ(kiln_safetensors_metadata(f, "kiln.n_layer"), "2");
        CHECK_STR_EQ(kiln_safetensors_metadata(f, "kiln.n_head"), "2");
        CHECK_STR_EQ(kiln_safetensors_metadata(f, "kiln.n_embd"), "16");
        CHECK_STR_EQ(kiln_safetensors_metadata(f, "kiln.vocab_size"), "100");
        CHECK_STR_EQ(kiln_safetensors_metadata(f, "kiln.max_seq_len"), "8");
    }
    kiln_safetensors_close(f);

    kiln_gpt_config c;
    memset(&c, 0, sizeof c);
    CHECK_OK(kiln_gpt_config_from_safetensors(&c, path_a));
    kiln_gpt_config want = small_config(2, 16);
    CHECK_TRUE(memcmp(&c, &want, sizeof c) == 0);

    /* Padded embedding rows come out zero whatever they held. */
    float *pb = kiln_gpt_params(b);
    const kiln_tensor_info *wte = kiln_gpt_tensor(b, 0);
    for (int64_t k = wte->numel; k < 128 * 16; k++)
        pb[wte->offset + k] = 7.0f;
    CHECK_OK(kiln_gpt_load_safetensors(b, path_a));
    CHECK_TRUE(memcmp(kiln_gpt_params(a), pb, slab_bytes(a)) == 0);
done:
    kiln_gpt_free(a);
    kiln_gpt_free(b);
}

/* A file that does not fit: the status, words in the message, and the model untouched. */
static void expect_load_fails(kiln_gpt *m, const char *path, kiln_status want, const char *needle,
                              const char *needle2) {
    size_t n = slab_bytes(m);
    float *before = malloc(n);
    memcpy(before, kiln_gpt_params(m), n);
    CHECK_STATUS(kiln_gpt_load_safetensors(m, path), want);
    const char *msg = kiln_error_message();
    test_checks++;
    if (!strstr(msg, path) || !strstr(msg, needle) || (needle2 && !strstr(msg, needle2))) {
        test_failures++;
        fprintf(stderr, "message \"%s\" lacks \"%s\" or \"%s\"\n", msg, needle,
                needle2 ? needle2 : "");
    }
    CHECK_TRUE(memcmp(before, kiln_gpt_params(m), n) == 0);
    free(before);
}

static void test_mismatched_models(void) {
    kiln_gpt *a = make_model(2, 16, 1), *wide = make_model(2, 32, 3);
    kiln_gpt *shallow = make_model(1, 16, 4), *deep = make_model(3, 16, 5);
    if (!a || !wide || !shallow || !deep)
        goto done;
    CHECK_OK(kiln_gpt_save_safetensors(a, path_a, KILN_DTYPE_F32));
    expect_load_fails(wide, path_a, KILN_ERR_SHAPE, "\"wte.weight\" has shape (100, 16)",
                      "expects (100, 32)");
    expect_load_fails(shallow, path_a, KILN_ERR_FORMAT, "unexpected tensor \"h.1.", "1 layers");
    expect_load_fails(deep, path_a, KILN_ERR_NOT_FOUND, "\"h.2.ln_1.weight\" is missing", NULL);
done:
    kiln_gpt_free(a);
    kiln_gpt_free(wide);
    kiln_gpt_free(shallow);
    kiln_gpt_free(deep);
}

static void test_hugging_face_variants(void) {
    kiln_gpt *a = make_model(2, 16, 1), *b = make_model(2, 16, 2);
    if (!a || !b)
        goto done;
    size_t n = slab_bytes(a);
    /* prefix, mask buffers and a tied lm_head: loads exactly */
    variant hf = {.prefix = "transformer.", .dtype = KILN_ST_DTYPE_F32, .buffers = 1, .lm_head = 1};
    CHECK_OK(write_variant(a, path_x, &hf));
    CHECK_OK(kiln_gpt_load_safetensors(b, path_x));
    CHECK_TRUE(memcmp(kiln_gpt_params(a), kiln_gpt_params(b), n) == 0);

    /* no metadata: the config comes from the shapes, n_head from the caller */
    kiln_gpt_config c;
    memset(&c, 0, sizeof c);
    c.n_head = 4;
    CHECK_OK(kiln_gpt_config_from_safetensors(&c, path_x));
    CHECK_INT_EQ(c.n_layer, 2);
    CHECK_INT_EQ(c.n_head, 4);
    CHECK_INT_EQ(c.n_embd, 16);
    CHECK_INT_EQ(c.vocab_size, 100);
    CHECK_INT_EQ(c.padded_vocab_size, 128);
    CHECK_INT_EQ(c.max_seq_len, 8);
    c.n_head = 0; /* 16 channels are not a multiple of GPT-2's 64 per head */
    CHECK_STATUS(kiln_gpt_config_from_safetensors(&c, path_x), KILN_ERR_CONFIG);
    CHECK_TRUE(strstr(kiln_error_message(), path_x) && strstr(kiln_error_message(), "n_head"));

    /* BF16 everywhere: each value is the bf16 value, exactly */
    variant bf = {.dtype = KILN_ST_DTYPE_BF16, .lm_head = 1};
    CHECK_OK(write_variant(a, path_x, &bf));
    CHECK_OK(kiln_gpt_load_safetensors(b, path_x));
    const float *pa = kiln_gpt_params(a), *pb = kiln_gpt_params(b);
    int exact = 1;
    for (int i = 0; i < kiln_gpt_num_tensors(a); i++) {
        const kiln_tensor_info *t = kiln_gpt_tensor(a, i);
        for (int64_t k = 0; k < t->numel; k++)
            exact &= pb[t->offset + k] == kiln_bf16_to_f32(to_bf16(pa[t->offset + k]));
    }
    CHECK_TRUE(exact);

    /* each broken variant fails with its own error and leaves the model alone */
    variant missing = {.dtype = KILN_ST_DTYPE_F32, .skip = "ln_f.bias"};
    CHECK_OK(write_variant(a, path_x, &missing));
    expect_load_fails(b, path_x, KILN_ERR_NOT_FOUND, "\"ln_f.bias\" is missing", NULL);
    variant ints = {.dtype = KILN_ST_DTYPE_F32, .as_i32 = "h.1.ln_2.bias"};
    CHECK_OK(write_variant(a, path_x, &ints));
    expect_load_fails(b, path_x, KILN_ERR_DTYPE, "\"h.1.ln_2.bias\" is I32", NULL);
    variant foreign = {.dtype = KILN_ST_DTYPE_F32, .extra = "encoder.layer.0.weight"};
    CHECK_OK(write_variant(a, path_x, &foreign));
    expect_load_fails(b, path_x, KILN_ERR_FORMAT, "unexpected tensor \"encoder.layer.0.weight\"",
                      NULL);
    variant untied = {.dtype = KILN_ST_DTYPE_F32, .lm_head = 2};
    CHECK_OK(write_variant(a, path_x, &untied));
    expect_load_fails(b, path_x, KILN_ERR_UNSUPPORTED, "\"lm_head.weight\" differs", NULL);
    variant untied_bf = {.dtype = KILN_ST_DTYPE_BF16, .lm_head = 2};
    CHECK_OK(write_variant(a, path_x, &untied_bf));
    expect_load_fails(b, path_x, KILN_ERR_UNSUPPORTED, "differs", NULL);
    variant twice = {.prefix = "transformer.", .dtype = KILN_ST_DTYPE_F32, .duplicate_wte = 1};
    CHECK_OK(write_variant(a, path_x, &twice));
    expect_load_fails(b, path_x, KILN_ERR_FORMAT, "appears twice", NULL);
done:
    kiln_gpt_free(a);
    kiln_gpt_free(b);
}

/* Edit kiln's metadata of a saved file: a different n_embd, or a key removed. */
static void write_with_metadata(kiln_gpt *m, const char *path, const char *key, const char *value) {
    kiln_safetensors *f = NULL;
    kiln_safetensors_writer *w = NULL;
    CHECK_OK(kiln_gpt_save_safetensors(m, path, KILN_DTYPE_F32));
    CHECK_OK(kiln_safetensors_open(&f, path));
    CHECK_OK(kiln_safetensors_writer_init(&w));
    if (!f || !w)
        return;
    for (int i = 0; i < kiln_safetensors_num_tensors(f); i++) {
        const kiln_st_tensor *t = kiln_safetensors_tensor(f, i);
        kiln_safetensors_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data);
    }
    for (int i = 0; i < kiln_safetensors_num_metadata(f); i++) {
        const char *k, *v;
        kiln_safetensors_metadata_at(f, i, &k, &v);
        if (strcmp(k, key) != 0)
            kiln_safetensors_writer_set_metadata(w, k, v);
        else if (value)
            kiln_safetensors_writer_set_metadata(w, k, value);
    }
    CHECK_OK(kiln_safetensors_writer_write(w, path_x));
    kiln_safetensors_writer_free(w);
    kiln_safetensors_close(f);
}

static void test_config_metadata_errors(void) {
    kiln_gpt *a = make_model(2, 16, 1);
    if (!a)
        return;
    kiln_gpt_config c;
    memset(&c, 0, sizeof c);
    write_with_metadata(a, path_a, "kiln.n_embd", "32");
    CHECK_STATUS(kiln_gpt_config_from_safetensors(&c, path_x), KILN_ERR_FORMAT);
    CHECK_TRUE(strstr(kiln_error_message(), "kiln.n_embd is 32 but the tensors say 16") != NULL);
    write_with_metadata(a, path_a, "kiln.n_head", "two");
    CHECK_STATUS(kiln_gpt_config_from_safetensors(&c, path_x), KILN_ERR_FORMAT);
    write_with_metadata(a, path_a, "kiln.n_head", NULL);
    CHECK_STATUS(kiln_gpt_config_from_safetensors(&c, path_x), KILN_ERR_FORMAT);
    CHECK_TRUE(strstr(kiln_error_message(), "incomplete") != NULL);
    write_with_metadata(a, path_a, "kiln.n_head", "3"); /* 3 does not divide 16 */
    CHECK_STATUS(kiln_gpt_config_from_safetensors(&c, path_x), KILN_ERR_CONFIG);
    write_with_metadata(a, path_a, "kiln.n_head", "8"); /* the file's n_head wins */
    c.n_head = 4;
    CHECK_OK(kiln_gpt_config_from_safetensors(&c, path_x));
    CHECK_INT_EQ(c.n_head, 8);
    CHECK_STATUS(kiln_gpt_config_from_safetensors(&c, "no/such/file.safetensors"),
                 KILN_ERR_NOT_FOUND);
    kiln_gpt_free(a);
}

/* Tensor names that claim far more layers than the file holds the bytes of: refused when the
 * configuration is read, before a caller allocates the model. */
static void test_config_claims_too_much(void) {
    kiln_gpt *a = make_model(1, 16, 1);
    if (!a)
        return;
    kiln_safetensors_writer *w = NULL;
    CHECK_OK(kiln_safetensors_writer_init(&w));
    if (!w)
        return;
    const float *slab = kiln_gpt_params(a);
    for (int i = 0; i < kiln_gpt_num_tensors(a); i++) {
        const kiln_tensor_info *t = kiln_gpt_tensor(a, i);
        CHECK_OK(kiln_safetensors_writer_add(w, t->name, KILN_ST_DTYPE_F32, t->ndim, t->shape,
                                             slab + t->offset));
    }
    const int64_t none[1] = {0};
    CHECK_OK(kiln_safetensors_writer_add(w, "h.999.ln_1.weight", KILN_ST_DTYPE_F32, 1, none, slab));
    CHECK_OK(kiln_safetensors_writer_write(w, path_x));
    kiln_safetensors_writer_free(w);
    kiln_gpt_config c;
    memset(&c, 0, sizeof c);
    c.n_head = 2;
    CHECK_STATUS(kiln_gpt_config_from_safetensors(&c, path_x), KILN_ERR_FORMAT);
    CHECK_TRUE(strstr(kiln_error_message(), "too few for the") != NULL);
    CHECK_TRUE(strstr(kiln_error_message(), "1000 layers") != NULL);
    kiln_gpt_free(a);
}

/* A failed save (the target is a folder) leaves no temporary and no half file. */
static void test_failed_save(void) {
    kiln_gpt *a = make_model(1, 16, 1);
    if (!a)
        return;
    char sub[512];
    test_path(sub, sizeof sub, dir, "folder.safetensors");
    CHECK_TRUE(mkdir(sub, 0755) == 0);
    CHECK_STATUS(kiln_gpt_save_safetensors(a, sub, KILN_DTYPE_F32), KILN_ERR_IO);
    CHECK_TRUE(strstr(kiln_error_message(), "saving model weights") != NULL);
    DIR *dp = opendir(dir);
    int tmp = 0;
    for (struct dirent *e; dp && (e = readdir(dp));)
        tmp += strstr(e->d_name, ".tmp") != NULL;
    closedir(dp);
    CHECK_INT_EQ(tmp, 0);
    rmdir(sub);
    kiln_gpt_free(a);
}

int main(void) {
    test_tmpdir(dir, sizeof dir, "weights");
    test_path(path_a, sizeof path_a, dir, "a.safetensors");
    test_path(path_x, sizeof path_x, dir, "x.safetensors");
    RUN_TEST(test_save_load_bits);
    RUN_TEST(test_mismatched_models);
    RUN_TEST(test_hugging_face_variants);
    RUN_TEST(test_config_metadata_errors);
    RUN_TEST(test_config_claims_too_much);
    RUN_TEST(test_failed_save);
    test_rmtree(dir);
    TEST_MAIN_END();
}
