/* libFuzzer target for the tokenizers. The first byte picks what the rest is:
 *   even: text. Every tokenizer ("bytes", a BPE trained here, and GPT-2 when its files are
 *         found through KILN_GPT2_DIR) must give back the same bytes from decode(encode(x)),
 *         and GPT-2's ASCII scanner must cut the text exactly where its regex does.
 *   odd:  a tokenizer file. Loading it must fail cleanly or give a tokenizer that round-trips.
 *         With bit 1 set its last 8 bytes are replaced by the right checksum, so that the
 *         checks behind the checksum are reached too.
 * Any difference aborts, which libFuzzer reports with the input. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <xxhash.h>

#include "kiln/tokenizer.h"
#include "tok/tok_internal.h"

static kiln_tokenizer *toks[3];
static int ntoks;
static char file_path[64];

static void die(const char *what) {
    fprintf(stderr, "fuzz_tokenizer: %s (%s)\n", what, kiln_error_message());
    abort();
}

static void init(void) {
    if (ntoks)
        return;
    if (kiln_tokenizer_load(&toks[ntoks], "bytes") != KILN_OK)
        die("cannot load bytes");
    ntoks++;
    kiln_bpe_trainer *tr = NULL;
    static const char text[] = "the cat sat on the mat; the cats sat on the mats. It's 1234 "
                               "\xc3\xa9t\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87   \n\n the the";
    if (kiln_bpe_trainer_init(&tr) != KILN_OK || kiln_bpe_trainer_add(tr, text, sizeof text - 1) ||
        kiln_bpe_trainer_finish(tr, 300, &toks[ntoks]) != KILN_OK)
        die("cannot train");
    kiln_bpe_trainer_free(tr);
    ntoks++;
    const char *gpt2 = getenv("KILN_GPT2_DIR"); /* set by the CTest test */
    if (gpt2 && kiln_tokenizer_load(&toks[ntoks], gpt2) == KILN_OK)
        ntoks++;
    else
        fprintf(stderr, "fuzz_tokenizer: no GPT-2 (%s); fuzzing bytes and a trained BPE\n",
                gpt2 ? kiln_error_message() : "KILN_GPT2_DIR is not set");
    snprintf(file_path, sizeof file_path, "/tmp/fuzz_tokenizer_%d.kbpe", (int)getpid());
}

static void round_trip(const kiln_tokenizer *t, const uint8_t *s, size_t n) {
    kiln_tokens ids = {0};
    kiln_bytes back = {0};
    if (kiln_tokenizer_encode(t, (const char *)s, n, &ids) != KILN_OK)
        die("encode failed");
    for (int64_t i = 0; i < ids.len; i++)
        if (ids.ids[i] < 0 || ids.ids[i] >= kiln_tokenizer_vocab_size(t))
            die("an id outside the vocabulary");
    if (kiln_tokenizer_decode(t, ids.ids, ids.len, &back) != KILN_OK)
        die("decode failed");
    if (back.len != n || (n && memcmp(back.data, s, n)))
        die("decode(encode(x)) != x");
    kiln_bytes_free(&back);
    kiln_tokens_free(&ids);
}

static void scanner_matches_regex(const kiln_tokenizer *t, const uint8_t *s, size_t n) {
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(t->pretok.re, NULL);
    for (size_t a = 0, b = 0; a < n;) {
        size_t ea = 0, eb = 0;
        if (kiln__tok_pretok_next(&t->pretok, md, s, n, a, 1, &ea) != KILN_OK ||
            kiln__tok_pretok_next(&t->pretok, md, s, n, b, 0, &eb) != KILN_OK)
            die("pre-tokeniser failed");
        if (ea != eb)
            die("the ASCII scanner and the regex cut differently");
        a = ea;
        b = eb;
    }
    pcre2_match_data_free(md);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    init();
    if (size == 0)
        return 0;
    const uint8_t *s = data + 1;
    size_t n = size - 1;
    if ((data[0] & 1) == 0) {
        for (int i = 0; i < ntoks; i++)
            round_trip(toks[i], s, n);
        scanner_matches_regex(toks[1], s, n);
        return 0;
    }
    uint8_t *buf = malloc(n + 8);
    memcpy(buf, s, n);
    if ((data[0] & 2) && n >= 8) {
        uint64_t h = XXH64(buf, n - 8, 0);
        for (int i = 0; i < 8; i++)
            buf[n - 8 + i] = (uint8_t)(h >> (8 * i));
    }
    FILE *f = fopen(file_path, "wb");
    if (!f)
        die("cannot write the scratch file");
    fwrite(buf, 1, n, f);
    fclose(f);
    free(buf);
    kiln_tokenizer *t = NULL;
    if (kiln_tokenizer_load(&t, file_path) == KILN_OK) {
        static const uint8_t probe[] = "the cat \xff\xfe it's \xe4\xb8\xad";
        round_trip(t, probe, sizeof probe - 1);
        kiln_tokenizer_free(t);
    } else if (t) {
        die("a failed load left a tokenizer");
    }
    remove(file_path);
    return 0;
}
