/* kiln: tokenizers. GPT-2's byte-level BPE (identical to tiktoken's "gpt2" encoding),
 * byte-level BPEs trained by kiln, and "bytes" (256 ids, one per byte). */
#ifndef KILN_TOKENIZER_H
#define KILN_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A growable array of token ids; zero-initialise, free with kiln_tokens_free. */
typedef struct kiln_tokens {
    int32_t *ids;
    int64_t len, cap;
} kiln_tokens;
void kiln_tokens_free(kiln_tokens *t);

/* A growable byte buffer; zero-initialise, free with kiln_bytes_free. */
typedef struct kiln_bytes {
    char *data;
    size_t len, cap;
} kiln_bytes;
void kiln_bytes_free(kiln_bytes *b);

typedef struct kiln_tokenizer kiln_tokenizer; /* opaque; read-only after load, thread-safe */

/* spec: "bytes", "gpt2" (GPT-2's encoder.json and vocab.bpe, found as described in
 * README.md), or the path of a tokenizer file written by kiln_tokenizer_save. */
kiln_status kiln_tokenizer_load(kiln_tokenizer **out, const char *spec);
void kiln_tokenizer_free(kiln_tokenizer *t);
const char *kiln_tokenizer_name(const kiln_tokenizer *t);
int64_t kiln_tokenizer_vocab_size(const kiln_tokenizer *t);
/* Id of <|endoftext|>, or -1 when the tokenizer has none ("bytes"). */
int32_t kiln_tokenizer_eot(const kiln_tokenizer *t);

/* Append the ids of text[0..len) to out. Any bytes are accepted (invalid UTF-8 too);
 * the text "<|endoftext|>" is NOT special here: it is encoded as ordinary text. */
kiln_status kiln_tokenizer_encode(const kiln_tokenizer *t, const char *text, size_t len,
                                  kiln_tokens *out);
/* Append the bytes of ids to out; an id outside the vocabulary is KILN_ERR_RANGE. */
kiln_status kiln_tokenizer_decode(const kiln_tokenizer *t, const int32_t *ids, int64_t n,
                                  kiln_bytes *out);

#ifdef __cplusplus
}
#endif
#endif
