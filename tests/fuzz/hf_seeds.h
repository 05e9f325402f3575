/* Small tokenizer.json files for fuzz_tokenizer_hf: one byte-level (Llama 3's pattern, an
 * added token), one SentencePiece-style (byte fallback, Prepend and Replace). */
#ifndef KILN_FUZZ_HF_SEEDS_H
#define KILN_FUZZ_HF_SEEDS_H
#include <stdio.h>
#include <stdlib.h>

/* GPT-2's byte alphabet in id order: the character for id i, as UTF-8 (JSON-escaped). */
static void hf_seed_alphabet(int id, char *out) {
    int n = 0, printable_count = 0;
    for (int x = 0; x < 256; x++)
        printable_count += (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
    for (int pass = 0; pass < 2; pass++)
        for (int x = 0, extra = 0; x < 256; x++) {
            int pr = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
            int cp = pr ? x : 256 + extra;
            extra += !pr;
            if (pr != !pass || n++ != id)
                continue;
            if (cp == '"' || cp == '\\')
                snprintf(out, 8, "\\%c", cp);
            else if (cp < 0x80)
                snprintf(out, 8, "%c", cp);
            else
                snprintf(out, 8, "%c%c", 0xC0 | (cp >> 6), 0x80 | (cp & 0x3F));
            return;
        }
    (void)printable_count;
}

static char *hf_seed_byte_level(void) {
    size_t cap = 1 << 15, n = 0;
    char *s = malloc(cap);
    n += (size_t)snprintf(
        s + n, cap - n,
        "{\"added_tokens\":[{\"id\":259,\"content\":\"<|endoftext|>\",\"special\":true},"
        "{\"id\":260,\"content\":\"<t>\",\"special\":false,\"normalized\":false}],"
        "\"normalizer\":{\"type\":\"NFC\"},\"pre_tokenizer\":{\"type\":\"Sequence\","
        "\"pretokenizers\":["
        "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|"
        "[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| "
        "?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|"
        "\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\",\"invert\":false},"
        "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]},"
        "\"post_processor\":null,\"decoder\":{\"type\":\"ByteLevel\"},"
        "\"model\":{\"type\":\"BPE\",\"ignore_merges\":true,\"vocab\":{");
    for (int id = 0; id < 256; id++) {
        char c[8];
        hf_seed_alphabet(id, c);
        n += (size_t)snprintf(s + n, cap - n, "\"%s\":%d,", c, id);
    }
    snprintf(s + n, cap - n,
             "\"he\":256,\"\xc4\xa0t\":257,\"\xc4\xa0the\":258},"
             "\"merges\":[\"h e\",\"\xc4\xa0 t\",\"\xc4\xa0t he\"]}}");
    return s;
}

static char *hf_seed_sentencepiece(void) {
    size_t cap = 1 << 14, n = 0;
    char *s = malloc(cap);
    n += (size_t)snprintf(
        s + n, cap - n,
        "{\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true}],"
        "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":"
        "\"\xe2\x96\x81\"},{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":"
        "\"\xe2\x96\x81\"}]},\"pre_tokenizer\":null,\"post_processor\":null,"
        "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":"
        "{\"String\":\"\xe2\x96\x81\"},\"content\":\" \"},{\"type\":\"ByteFallback\"}]},"
        "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"byte_fallback\":true,\"vocab\":{"
        "\"<unk>\":0,");
    for (int b = 0; b < 256; b++)
        n += (size_t)snprintf(s + n, cap - n, "\"<0x%02X>\":%d,", b, 1 + b);
    snprintf(s + n, cap - n,
             "\"\xe2\x96\x81\":257,\"a\":258,\"\xe2\x96\x81"
             "a\":259,"
             "\"\xe4\xb8\xad\":260},\"merges\":[\"\xe2\x96\x81 a\"]}}");
    return s;
}
#endif
