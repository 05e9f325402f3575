#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "tool_common.h"

#include <errno.h>
#include <omp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln/backend.h"
#include "kiln/checkpoint.h"
#include "kiln/compress.h"

void openblas_set_num_threads(int num_threads);

int64_t tool_cores(void) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? n : 1;
}

void tool_set_threads(int64_t n) {
    /* More threads than cores give the same numbers, much more slowly (every parallel
     * region waits for threads that wait for a core); a run may still want them, to repeat
     * a run of another machine bit for bit, so this is said, not refused. */
    int64_t cores = tool_cores(), asked = n > 0 ? n : omp_get_max_threads();
    const char *how = n > 0 ? "--threads " : "OMP_NUM_THREADS=";
    if (asked > cores && (n > 0 || getenv("OMP_NUM_THREADS")))
        fprintf(stderr,
                "kiln: warning: %s%lld is more than the %lld cores this process may use: each "
                "step waits on threads that wait for a core and runs many times slower (the "
                "numbers are the same); use %s%lld or fewer\n",
                how, (long long)asked, (long long)cores, how, (long long)cores);
    if (n <= 0)
        return;
    omp_set_num_threads((int)n);
    openblas_set_num_threads((int)n);
}

kiln_status tool_load_model(kiln_gpt **out, const char *path, int64_t heads, int64_t B, int64_t T,
                            kiln_dtype dtype) {
    return tool_load_model_on(out, path, heads, B, T, dtype, NULL);
}

kiln_status tool_device_backend(const char *device, kiln_backend **be) {
    *be = NULL;
    if (!strcmp(device, "cpu"))
        return KILN_OK;
    if (strcmp(device, "cuda"))
        return kiln_error_setf(KILN_ERR_ARG, "--device is cpu or cuda, not '%s'", device);
    char why[512];
    if (kiln_cuda_available(why, sizeof why) != KILN_OK)
        return kiln_error_setf(KILN_ERR_UNSUPPORTED, "%s", why);
    if (!(*be = kiln_backend_cuda()))
        return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                               "the CUDA backend could not start: run on the CPU (--device cpu)");
    return KILN_OK;
}

/* The weights of path into m's slab on its backend: read on the host, then copied. */
static kiln_status load_to_device(kiln_gpt *m, const char *path) {
    kiln_backend *be = kiln_gpt_backend(m);
    size_t bytes = (size_t)kiln_gpt_slab_len(m) * kiln_dtype_size(kiln_gpt_dtype(m));
    void *h = malloc(bytes);
    if (!h)
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate %.1f MiB to read %s into",
                               (double)bytes / (1 << 20), path);
    kiln_status s = kiln_gpt_load_slab(m, path, h, kiln_gpt_dtype(m));
    if (s == KILN_OK) {
        be->copy(be, kiln_gpt_params(m), h, bytes, KILN_COPY_TO_DEVICE);
        s = be->synchronize(be);
    }
    free(h);
    return s;
}

kiln_status tool_load_model_on(kiln_gpt **out, const char *path, int64_t heads, int64_t B,
                               int64_t T, kiln_dtype dtype, kiln_backend *be) {
    if (be && !be->device_memory)
        be = NULL; /* the CPU's: loaded in place */
    /* A quantized file (kiln compress quantize) runs on the int8 kernel. */
    kiln_quant_type qt = KILN_QUANT_NONE;
    kiln_status qs = kiln_quant_probe(path, &qt, NULL);
    if (qs != KILN_OK)
        return qs;
    if (qt != KILN_QUANT_NONE) {
        if (be)
            return kiln_error_setf(KILN_ERR_UNSUPPORTED,
                                   "%s is a quantized model (%s): it runs on the CPU's int8 "
                                   "kernel (--device cpu)",
                                   path, kiln_quant_type_name(qt));
        if (dtype != KILN_DTYPE_F32)
            return kiln_error_setf(KILN_ERR_ARG,
                                   "%s is a quantized model (%s): it computes in int8 and fp32, "
                                   "leave --precision at fp32",
                                   path, kiln_quant_type_name(qt));
        return kiln_quant_load(out, path, B, T);
    }
    kiln_gpt_config cfg;
    memset(&cfg, 0, sizeof cfg);
    if (heads < 0)
        return kiln_error_setf(KILN_ERR_ARG, "--heads must be >= 0, got %lld", (long long)heads);
    cfg.n_head = heads;
    kiln_status s = kiln_gpt_config_from_safetensors(&cfg, path);
    if (s != KILN_OK)
        return s;
    /* The caller's head count is used only where the file records none. */
    if (heads > 0 && cfg.n_head != heads)
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "--heads %lld, but the weights in %s have %lld heads",
                               (long long)heads, path, (long long)cfg.n_head);
    if ((s = kiln_gpt_config_validate(&cfg)) != KILN_OK)
        return s;
    if (T <= 0 || T > cfg.max_seq_len)
        T = cfg.max_seq_len;
    if ((s = kiln_gpt_create_inference(out, &cfg, B, T, dtype, be)) != KILN_OK)
        return s;
    s = be ? load_to_device(*out, path) : kiln_gpt_load_safetensors(*out, path);
    if (s) {
        kiln_gpt_free(*out);
        *out = NULL;
    }
    return s;
}

kiln_status tool_make_parent_dirs(const char *path) {
    char buf[4096];
    if (strlen(path) >= sizeof buf)
        return kiln_error_setf(KILN_ERR_ARG, "path too long: %s", path);
    strcpy(buf, path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return kiln_error_setf(KILN_ERR_IO, "cannot create folder %s: %s", buf,
                                   strerror(errno));
        *p = '/';
    }
    return KILN_OK;
}

kiln_status tool_refuse_same_file(const char *in, const char *out) {
    struct stat si, so;
    if (stat(in, &si) != 0 || stat(out, &so) != 0)
        return KILN_OK;
    if (si.st_dev == so.st_dev && si.st_ino == so.st_ino)
        return kiln_error_setf(KILN_ERR_ARG, "--out %s is the input %s itself: write elsewhere",
                               out, in);
    return KILN_OK;
}

const char *tool_default_tokenizer(const char *given, int64_t vocab_size) {
    if (given)
        return given;
    if (vocab_size == 256)
        return "bytes";
    if (vocab_size == 50257)
        return "gpt2";
    kiln_error_setf(KILN_ERR_ARG,
                    "the model's vocabulary has %lld tokens: say which tokenizer with --tokenizer",
                    (long long)vocab_size);
    return NULL;
}

void tool_precision_note(kiln_dtype dt) {
    if (dt == KILN_DTYPE_F16)
        fprintf(stderr, "kiln: fp16 matrix products on this CPU widen to fp32 (x86 CPUs without "
                        "AVX512-FP16 have no fp16 dot products): correct, not faster; bf16 is the "
                        "fast narrow type here\n");
}

kiln_status tool_read_stdin(size_t max, const char *hint, char **out, size_t *len) {
    /* Room for max + 1 bytes at most: one past the limit tells that there is more. */
    size_t limit = max < SIZE_MAX / 2 ? max + 1 : SIZE_MAX / 2;
    size_t cap = 0, n = 0;
    char *buf = NULL;
    for (;;) {
        if (n == cap) {
            size_t grown = !cap              ? (limit < 65536 ? limit : 65536)
                           : cap > limit / 2 ? limit
                                             : 2 * cap;
            char *b = realloc(buf, grown + 1);
            if (!b) {
                free(buf);
                return kiln_error_setf(KILN_ERR_NOMEM, "stdin: no memory for %zu bytes", grown);
            }
            buf = b;
            cap = grown;
        }
        size_t got = fread(buf + n, 1, cap - n, stdin);
        n += got;
        if (n > max) {
            free(buf);
            return kiln_error_setf(KILN_ERR_RANGE,
                                   "stdin holds more than %zu bytes, the most kiln reads from it%s",
                                   max, hint ? hint : "");
        }
        if (got == 0)
            break;
    }
    if (ferror(stdin)) {
        kiln_status st = kiln_error_setf(KILN_ERR_IO, "cannot read stdin: %s", strerror(errno));
        free(buf);
        return st;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return KILN_OK;
}
