/* kiln sample: generate text from a model. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "flags.h"
#include "kiln/core.h"
#include "kiln/sample.h"
#include "kiln/tokenizer.h"
#include "tool_common.h"

static const char *usage =
    "usage: kiln sample [flags]\n\n"
    "Generate text from a model's weights, continuing --prompt, or the text of --prompt-file\n"
    "(- reads stdin: a prompt longer than a command line takes), the start of a document when\n"
    "empty; a prompt longer than the model's context is refused. Same seed, same weights, same\n"
    "text. Weights quantized by kiln compress quantize run on the int8 kernel. With --device\n"
    "cuda the model runs on the GPU (without the generation cache there: each new token runs\n"
    "its whole window again).";

/* The most bytes --prompt-file reads: far more than any model's context holds. */
#define PROMPT_FILE_MAX ((size_t)64 << 20)

typedef struct print_ctx {
    const kiln_tokenizer *tok;
    kiln_bytes buf;
} print_ctx;

/* Text to stdout; a failed write (a full disk, a closed pipe) is an error that says why. */
static kiln_status write_out(const void *data, size_t n) {
    if ((n && fwrite(data, 1, n, stdout) != n) || fflush(stdout) != 0) {
        int e = errno;
        return kiln_error_setf(KILN_ERR_IO, "cannot write the text to standard output: %s",
                               strerror(e));
    }
    return KILN_OK;
}

static kiln_status print_token(int32_t id, void *p) {
    print_ctx *c = p;
    c->buf.len = 0;
    kiln_status s = kiln_tokenizer_decode(c->tok, &id, 1, &c->buf);
    if (s)
        return s; /* stops generation at once */
    return write_out(c->buf.data, c->buf.len);
}

/* The text of --prompt-file into *text (malloc'd), *len bytes: the file, or stdin for "-".
 * 1 after a message naming it. */
static int read_prompt_file(const char *path, char **text, size_t *len) {
    kiln_status s = strcmp(path, "-") ? kiln_file_read(path, PROMPT_FILE_MAX, text, len)
                                      : tool_read_stdin(PROMPT_FILE_MAX, NULL, text, len);
    if (s == KILN_OK)
        return 0;
    tool_report("sample: --prompt-file", s); /* the message names the file, or stdin */
    return 1;
}

int cmd_sample(int argc, char **argv) {
    const char *weights = "out/model.safetensors", *prompt = "", *tokenizer = NULL;
    const char *prompt_file = NULL;
    int prompt_given = 0;
    int64_t count = 200, top_k = 40, seed = 1337, heads = 0, threads = 0;
    double temperature = 1.0;
    const char *precision = "fp32", *device = "cpu";
    int timing = 0, cache = 1;
    const tool_flag flags[] = {
        {"weights", TOOL_FLAG_STRING, &weights, "model weights (safetensors, dense or quantized)"},
        {"prompt", TOOL_FLAG_STRING, &prompt, "text to continue", {0}, &prompt_given},
        {"prompt-file", TOOL_FLAG_STRING, &prompt_file,
         "read the text to continue from this file (-: stdin), for a prompt longer than a "
         "command line takes; not with --prompt"},
        {"tokens", TOOL_FLAG_INT, &count, "tokens to generate", TOOL_RANGE(0, 1 << 30)},
        {"temperature", TOOL_FLAG_FLOAT, &temperature, "softmax temperature (0: most likely)",
         TOOL_RANGE_BELOW(0, 1e30)},
        {"top-k", TOOL_FLAG_INT, &top_k, "sample among the k most likely (0: all)", TOOL_MIN(0)},
        {"seed", TOOL_FLAG_INT, &seed, "seed of the draws"},
        {"tokenizer", TOOL_FLAG_STRING, &tokenizer,
         "gpt2, bytes or a tokenizer file (none: chosen by the vocabulary size)"},
        {"heads", TOOL_FLAG_INT, &heads, "head count, for weights without kiln metadata",
         TOOL_MIN(0)},
        {"threads", TOOL_FLAG_INT, &threads, "threads (0: OpenMP's default)", TOOL_RANGE(0, 4096)},
        {"precision", TOOL_FLAG_STRING, &precision,
         "fp32, bf16 or fp16: the dtype the weights are held and computed in"},
        {"timing", TOOL_FLAG_BOOL, &timing,
         "print the generation's tokens/s on stderr (the model's loading not counted)"},
        {"cache", TOOL_FLAG_BOOL, &cache,
         "keep each position's q, k and v so that a new token runs alone through the model "
         "(--no-cache: the whole window again for every token)"},
        {"device", TOOL_FLAG_STRING, &device, "cpu or cuda: where the model runs"},
    };
    int npos = 0;
    int rc = tool_flags_parse(flags, sizeof flags / sizeof flags[0], argc, argv, &npos, usage);
    if (rc)
        return rc == TOOL_FLAGS_HELP ? 0 : 2;
    if (npos) {
        fprintf(stderr, "kiln sample: unexpected argument '%s' (see --help)\n", argv[1]);
        return 2;
    }
    kiln_dtype dt = KILN_DTYPE_F32;
    kiln_status ps = kiln_dtype_parse(precision, &dt);
    if (ps) {
        tool_report(argv[0], ps);
        return 2;
    }
    if (strcmp(device, "cpu") && strcmp(device, "cuda")) {
        fprintf(stderr, "kiln sample: --device is cpu or cuda, not '%s'\n", device);
        return 2;
    }
    if (prompt_given && prompt_file) {
        fprintf(stderr, "kiln sample: --prompt and --prompt-file both give the prompt: use one\n");
        return 2;
    }
    /* The file before the model: a name mistyped fails at once. It may hold any bytes. */
    char *file_text = NULL;
    size_t prompt_len = strlen(prompt);
    if (prompt_file && read_prompt_file(prompt_file, &file_text, &prompt_len))
        return 1;
    if (file_text)
        prompt = file_text;
    if (!strcmp(device, "cpu"))
        tool_precision_note(dt);
    tool_set_threads(threads);
    kiln_gpt *m = NULL;
    kiln_tokenizer *tok = NULL;
    kiln_tokens ids = {0};
    print_ctx pc = {0};
    kiln_backend *be = NULL;
    rc = 1;
    kiln_status s = tool_device_backend(device, &be);
    if (!s)
        s = tool_load_model_on(&m, weights, heads, 1, 0, dt, be);
    if (s) {
        tool_report("sample", s);
        goto done;
    }
    const kiln_gpt_config *cfg = kiln_gpt_get_config(m);
    const char *spec = tool_default_tokenizer(tokenizer, cfg->vocab_size);
    if (!spec || (s = tool_tokenizer_load(&tok, spec))) {
        tool_report("sample", spec ? s : KILN_ERR_ARG);
        goto done;
    }
    /* Checked before anything is generated: a larger tokenizer gives ids the model cannot
     * read, a smaller one cannot decode every id the model may draw. */
    if (kiln_tokenizer_vocab_size(tok) != cfg->vocab_size) {
        fprintf(stderr,
                "kiln sample: tokenizer %s has %lld tokens but the model's vocabulary has %lld: "
                "%s (use the tokenizer the model's data was made with)\n",
                spec, (long long)kiln_tokenizer_vocab_size(tok), (long long)cfg->vocab_size,
                kiln_tokenizer_vocab_size(tok) > cfg->vocab_size
                    ? "the model cannot read its larger ids"
                    : "it cannot decode every id the model may draw");
        goto done;
    }
    int32_t eot = kiln_tokenizer_eot(tok);
    if (eot >= 0 && !prompt_len) {
        if ((s = kiln_tokens_reserve(&ids, 1))) {
            tool_report("sample", s);
            goto done;
        }
        ids.ids[0] = eot;
        ids.len = 1;
    } else if ((s = kiln_tokenizer_encode(tok, prompt_len ? prompt : "\n",
                                          prompt_len ? prompt_len : 1, &ids))) {
        tool_report("sample", s);
        goto done;
    }
    /* The model sees at most its context: a longer prompt would lose its start unseen. */
    if (ids.len > kiln_gpt_max_seq(m)) {
        fprintf(stderr,
                "kiln sample: the prompt is %lld tokens, longer than the model's context of %lld "
                "tokens: shorten it to %lld tokens or fewer\n",
                (long long)ids.len, (long long)kiln_gpt_max_seq(m), (long long)kiln_gpt_max_seq(m));
        goto done;
    }
    int32_t *all = malloc((size_t)(ids.len + count) * sizeof *all);
    if (!all) {
        fprintf(stderr, "kiln sample: no memory for %lld tokens\n", (long long)(ids.len + count));
        goto done;
    }
    memcpy(all, ids.ids, (size_t)ids.len * sizeof *all);
    pc.tok = tok;
    s = write_out(prompt, prompt_len);
    double t0 = kiln_time_ms();
    if (!s)
        s = kiln_generate_ex(m, all, ids.len, count, (float)temperature, top_k, (uint64_t)seed,
                             cache, print_token, &pc);
    double secs = (kiln_time_ms() - t0) / 1e3;
    if (!s && timing)
        fprintf(stderr, "kiln sample: %lld tokens in %.3f s: %.1f tokens/s\n", (long long)count,
                secs, secs > 0 ? (double)count / secs : 0.0);
    free(all);
    if (!s)
        s = write_out("\n", 1);
    if (s) {
        tool_report("sample", s);
        goto done;
    }
    rc = 0;
done:
    free(file_text);
    kiln_bytes_free(&pc.buf);
    kiln_tokens_free(&ids);
    kiln_tokenizer_free(tok);
    kiln_gpt_free(m);
    return rc;
}
