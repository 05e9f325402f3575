/* kiln: smaller models for deployment. GGUF export: a trained GPT-2 model and its tokenizer
 * in the file format llama.cpp runs. */
#ifndef KILN_COMPRESS_H
#define KILN_COMPRESS_H

#include "kiln/model.h"
#include "kiln/status.h"
#include "kiln/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The type the matrices are stored in. f32 and f16 keep every weight (f16 rounded to
 * nearest even); q8_0 stores blocks of 32 weights as 8-bit integers with an f16 scale
 * (8.5 bits a weight), q4_0 as 4-bit integers with an f16 scale (4.5 bits a weight).
 * LayerNorm parameters and biases stay f32 in every type, the position embedding too in the
 * quantized ones. */
typedef enum kiln_gguf_type {
    KILN_GGUF_F32 = 0,
    KILN_GGUF_F16,
    KILN_GGUF_Q8_0,
    KILN_GGUF_Q4_0,
} kiln_gguf_type;

/* "f32", "f16", "q8_0", "q4_0" */
const char *kiln_gguf_type_name(kiln_gguf_type t);
kiln_status kiln_gguf_type_parse(const char *name, kiln_gguf_type *out);

/* Write model m (GPT-2 architecture: llama.cpp's "gpt2") with tokenizer tok (its vocabulary
 * must be the model's) as a GGUF version 3 file at path: the hyperparameters, the tokenizer
 * (tokens in GPT-2's byte-to-character alphabet, merges, the end-of-text token), and every
 * weight (matrices transposed to ggml's (out, in) rows; the token embedding's padded rows
 * left out). name goes in general.name. The file is written under a temporary name and
 * renamed: whole or not at all. Quantized types need n_embd a multiple of 32. */
kiln_status kiln_export_gguf(kiln_gpt *m, const kiln_tokenizer *tok, kiln_gguf_type type,
                             const char *name, const char *path);

/* Quantize n weights (n a multiple of 32) into GGUF blocks: q8_0 writes n / 32 blocks of 34
 * bytes, q4_0 of 18. And back, for tests and for the error a type makes. */
void kiln_quantize_q8_0(void *dst, const float *x, int64_t n);
void kiln_quantize_q4_0(void *dst, const float *x, int64_t n);
void kiln_dequantize_q8_0(float *y, const void *src, int64_t n);
void kiln_dequantize_q4_0(float *y, const void *src, int64_t n);

#ifdef __cplusplus
}
#endif

#endif
