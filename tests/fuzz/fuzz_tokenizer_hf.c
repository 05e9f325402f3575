/* libFuzzer target for Hugging Face tokenizer.json files. The first byte picks what the rest is:
 *   even: a tokenizer.json. Parsing must fail cleanly, or give a tokenizer whose ids are in
 *         its vocabulary and, byte-level, whose decode(encode(x)) is x; its prepared form must
 *         read back to a tokenizer with the same identity and the same ids.
 *   odd:  text for the two seed tokenizers (hf_seeds.h): ids in range, decode(encode(x)) is
 *         NFC(x) for the byte-level one, and the pre-tokeniser's pieces tile the text.
 * Any difference aborts, which libFuzzer reports with the input. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hf_seeds.h"
#include "kiln/tokenizer.h"
#include "tok/hf_internal.h"
#include "tok/tok_internal.h"

static kiln_tokenizer *bl, *sp;

static void die(const char *what) {
    fprintf(stderr, "fuzz_tokenizer_hf: %s (%s)\n", what, kiln_error_message());
    abort();
}

static kiln_tokenizer *from_json(char *text) {
    kiln_tokenizer *t = NULL;
    if (kiln__tok_hf_from_json(&t, text, strlen(text), "seed") != KILN_OK)
        die("a seed does not load");
    free(text);
    return t;
}

/* Encode s[0..n); when want is not NULL, decode must give want[0..wn). */
static void check(const kiln_tokenizer *t, const uint8_t *s, size_t n, const kiln_bytes *want,
                  kiln_tokens *ids) {
    if (kiln_tokenizer_encode(t, (const char *)s, n, ids) != KILN_OK)
        die("encode failed");
    for (int64_t i = 0; i < ids->len; i++)
        if (ids->ids[i] < 0 || ids->ids[i] >= kiln_tokenizer_vocab_size(t))
            die("an id outside the vocabulary");
    kiln_bytes back = {0};
    if (kiln_tokenizer_decode(t, ids->ids, ids->len, &back) != KILN_OK)
        die("decode failed");
    if (want && (back.len != want->len || (back.len && memcmp(back.data, want->data, back.len))))
        die("decode(encode(x)) != NFC(x)");
    kiln_bytes_free(&back);
}

/* The prepared form reads back to the same tokenizer. */
static void prepared_round_trip(const kiln_tokenizer *t) {
    uint8_t *buf = NULL;
    size_t len = 0;
    if (kiln__tok_hf_serialize(t, 42, &buf, &len) != KILN_OK)
        die("serialize failed");
    kiln_tokenizer *u = NULL;
    /* deserialize keeps pointers into its buffer; the tokenizer then frees it with munmap, so
     * hand it a copy it may not free: clear the arena before freeing. */
    if (kiln__tok_hf_deserialize(&u, (char *)buf, len, 42, "prepared") != KILN_OK)
        die("a prepared form does not read back");
    static const uint8_t probe[] = "the cat \xff it's \xe4\xb8\xad 12345 <t>";
    kiln_tokens a = {0}, b = {0};
    check(t, probe, sizeof probe - 1, NULL, &a);
    check(u, probe, sizeof probe - 1, NULL, &b);
    if (a.len != b.len || memcmp(a.ids, b.ids, (size_t)a.len * sizeof *a.ids))
        die("the prepared form encodes differently");
    kiln_tokens_free(&a);
    kiln_tokens_free(&b);
    u->hf->arena = NULL; /* buf is malloc'ed here, not mapped */
    u->off = NULL;
    u->blob = NULL;
    u->pieces = NULL;
    u->pairs.keys = NULL;
    u->pairs.vals = NULL;
    u->hf->added = NULL;
    u->hf->added_text = NULL;
    u->hf->special = NULL;
    u->hf->moff = NULL;
    u->hf->mblob = NULL;
    u->hf->rank_ids = NULL;
    kiln_tokenizer_free(u);
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!bl) {
        bl = from_json(hf_seed_byte_level());
        sp = from_json(hf_seed_sentencepiece());
    }
    if (size == 0)
        return 0;
    const uint8_t *s = data + 1;
    size_t n = size - 1;
    if (data[0] & 1) {
        kiln_tokens ids = {0};
        kiln_bytes nfc = {0};
        if (kiln__tok_hf_normalize(bl->hf, s, n, &nfc) != KILN_OK)
            die("NFC failed");
        check(bl, s, n, &nfc, &ids);
        ids.len = 0;
        check(sp, s, n, NULL, &ids);
        kiln_tokens_free(&ids);
        kiln_bytes_free(&nfc);
        for (size_t p = 0; p < n;) {
            size_t e = kiln__tok_hf_piece_end(HF_PAT_LLAMA3, s, n, p);
            if (e <= p || e > n)
                die("the pre-tokeniser made no progress");
            p = e;
        }
        return 0;
    }
    char *text = malloc(n + 1);
    memcpy(text, s, n);
    text[n] = 0;
    kiln_tokenizer *t = NULL;
    if (kiln__tok_hf_from_json(&t, text, n, "fuzz.json") == KILN_OK) {
        static const uint8_t probe[] = "the cat \xff\xfe it's \xe4\xb8\xad\n\n  x";
        kiln_tokens ids = {0};
        check(t, probe, sizeof probe - 1, NULL, &ids);
        kiln_tokens_free(&ids);
        prepared_round_trip(t);
        kiln_tokenizer_free(t);
    } else if (t) {
        die("a failed load left a tokenizer");
    }
    free(text);
    return 0;
}
