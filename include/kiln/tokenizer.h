/* kiln: tokenizers. GPT-2's byte-level BPE (identical to tiktoken's "gpt2" encoding),
 * byte-level BPEs trained by kiln, "bytes" (256 ids, one per byte), and Hugging Face
 * tokenizer.json BPEs (identical to tokenizers.js: Llama 3, Qwen 2, Llama 2, Gemma). */
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
/* Make room for at least `extra` more ids (a caller that knows the size saves regrowth). */
kiln_status kiln_tokens_reserve(kiln_tokens *t, int64_t extra);

/* A growable byte buffer; zero-initialise, free with kiln_bytes_free. */
typedef struct kiln_bytes {
    char *data;
    size_t len, cap;
} kiln_bytes;
void kiln_bytes_free(kiln_bytes *b);

typedef struct kiln_tokenizer kiln_tokenizer; /* opaque; read-only after load, thread-safe */

/* spec: "bytes"; a folder holding GPT-2's encoder.json and vocab.bpe (the tokenizer is then
 * named "gpt2"); the path of a Hugging Face tokenizer.json (a name ending in ".json"; BPE
 * models, byte-level or SentencePiece-style, see docs/data-and-tokenizers.md for what is
 * supported: anything else is refused by name); or the path of a tokenizer file written by
 * kiln_tokenizer_save. A tokenizer.json is prepared once into a binary form cached beside it
 * (".NAME.kiln"), or in $XDG_CACHE_HOME/kiln (~/.cache/kiln) when its folder is read-only;
 * the cache records the checksum of the tokenizer.json it was made from and is made again
 * when that differs. The library
 * does not search for GPT-2's files: the `kiln` command finds them ($KILN_GPT2_DIR, else
 * deps/gpt2 beside its build folder) and passes their folder. */
kiln_status kiln_tokenizer_load(kiln_tokenizer **out, const char *spec);
void kiln_tokenizer_free(kiln_tokenizer *t);
/* "gpt2", "bytes", or the file name a trained tokenizer was loaded from ("bpe" before it
 * is saved). */
const char *kiln_tokenizer_name(const kiln_tokenizer *t);
int64_t kiln_tokenizer_vocab_size(const kiln_tokenizer *t);
/* Id of <|endoftext|>, or -1 when the tokenizer has none ("bytes"). A Hugging Face
 * tokenizer's is its first special added token among <|endoftext|>, <|end_of_text|>, </s>
 * and <eos> (the end of a document: Qwen, Llama 3, Llama 2, Gemma), or -1. */
int32_t kiln_tokenizer_eot(const kiln_tokenizer *t);
/* Id of the token a Hugging Face tokenizer's post-processor puts before a text (Llama's <s>,
 * <|begin_of_text|>, Gemma's <bos>), or -1 (none, or not a Hugging Face tokenizer). The
 * encode calls never add it; a caller that wants it puts it first. */
int32_t kiln_tokenizer_bos(const kiln_tokenizer *t);
/* The tokenizer's identity: a 64-bit hash (XXH3) of what decides the ids of a text (every
 * id's bytes, <|endoftext|>'s id, the merges), never 0. Two tokenizers with the same identity
 * give the same ids for every text; two trained ones with the same vocabulary size differ.
 * It does not depend on the name or the file: "bytes" is always 0x3de38a25146c3056 and GPT-2
 * (its published encoder.json and vocab.bpe) 0x704357ace21a687e. A Hugging Face tokenizer's
 * covers its options, normalisers, tokens, special flags, added tokens and merges by rank (not
 * its path, nor the JSON's spelling or whitespace). Shards and prepare.json
 * record it so that shards of different tokenizers are never mixed. */
uint64_t kiln_tokenizer_id(const kiln_tokenizer *t);

/* Append the ids of text[0..len) to out. Any bytes are accepted (invalid UTF-8 too);
 * the text "<|endoftext|>" is NOT special here: it is encoded as ordinary text. The same
 * holds for a Hugging Face tokenizer's special added tokens ("<s>", "<|im_start|>"): text
 * from documents never turns into control tokens. Its added tokens that are not special are
 * found in text, as Hugging Face does. */
kiln_status kiln_tokenizer_encode(const kiln_tokenizer *t, const char *text, size_t len,
                                  kiln_tokens *out);
/* Append the bytes of ids to out; an id outside the vocabulary is KILN_ERR_RANGE. */
kiln_status kiln_tokenizer_decode(const kiln_tokenizer *t, const int32_t *ids, int64_t n,
                                  kiln_bytes *out);

/* The bytes of one token; <|endoftext|> gives that text. *bytes stays valid while t lives.
 * An id outside the vocabulary is KILN_ERR_RANGE. */
kiln_status kiln_tokenizer_token_bytes(const kiln_tokenizer *t, int32_t id, const char **bytes,
                                       size_t *len);

/* ---- many texts, many threads ----
 * Both give exactly the ids kiln_tokenizer_encode gives, for any thread count. */

/* Encode n documents: the ids of texts[i][0..lens[i]) are appended to outs[i]. The
 * documents are spread over the OpenMP threads. */
kiln_status kiln_tokenizer_encode_many(const kiln_tokenizer *t, const char *const *texts,
                                       const size_t *lens, int64_t n, kiln_tokens *outs);
/* Encode one long text with the OpenMP threads: the text is cut only at places where the
 * pre-tokeniser provably starts a new piece (a letter after a newline, a space between
 * letters), the parts are encoded at once and their ids appended to out in order. */
kiln_status kiln_tokenizer_encode_parallel(const kiln_tokenizer *t, const char *text, size_t len,
                                           kiln_tokens *out);

/* ---- training a byte-level BPE ----
 * Texts are pre-tokenised as GPT-2 does and the pieces counted; merges are then learned
 * over the piece counts, most frequent adjacent pair first (ties: the smaller pair of ids).
 * Ids: 0..255 the bytes, 256 + i the i-th merge, the last id <|endoftext|>. Encoding with
 * the result applies the merges by rank, leftmost first. */
typedef struct kiln_bpe_trainer kiln_bpe_trainer; /* opaque */
kiln_status kiln_bpe_trainer_init(kiln_bpe_trainer **out);
void kiln_bpe_trainer_free(kiln_bpe_trainer *tr);
/* Count the pieces of one more text (any bytes). */
kiln_status kiln_bpe_trainer_add(kiln_bpe_trainer *tr, const char *text, size_t len);
/* Learn up to vocab_size - 257 merges (vocab_size counts the 256 bytes, the merges and
 * <|endoftext|>; 257 <= vocab_size <= 2^24). Learning stops early when no piece has two
 * tokens left; kiln_tokenizer_vocab_size says how many were learned. */
kiln_status kiln_bpe_trainer_finish(kiln_bpe_trainer *tr, int64_t vocab_size, kiln_tokenizer **out);

/* Write a trained tokenizer to path (a small binary file with a magic, the merges and an
 * xxHash64 checksum; written to path.tmp and renamed). "gpt2" and "bytes" are not saved:
 * they are named by their spec. */
kiln_status kiln_tokenizer_save(const kiln_tokenizer *t, const char *path);

#ifdef __cplusplus
}
#endif
#endif
