/* kiln: model weights as safetensors, with Hugging Face GPT-2 tensor names.
 *
 * Files kiln writes load in PyTorch / Hugging Face unchanged, and GPT-2 checkpoints
 * converted from Hugging Face load into kiln unchanged (a "transformer." prefix on names,
 * an "lm_head.weight" equal to the tied embedding, and the "attn.bias"/"attn.masked_bias"
 * mask buffers are accepted). kiln records its configuration in the file's __metadata__.
 * Writes go to a temporary name, are flushed, then renamed: a failed save never leaves a
 * half-written file under the final name, nor harms the file it would replace. */
#ifndef KILN_CHECKPOINT_H
#define KILN_CHECKPOINT_H

#include "kiln/model.h"
#include "kiln/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Save the working weights stored as save_dtype (the embedding's V rows, not the padded
 * ones). */
kiln_status kiln_gpt_save_safetensors(kiln_gpt *m, const char *path, kiln_dtype save_dtype);
/* The same from any slab laid out as the model's (its fp32 master weights, say), of
 * slab_dtype, in host memory. */
kiln_status kiln_gpt_save_slab(kiln_gpt *m, const char *path, const void *slab,
                               kiln_dtype slab_dtype, kiln_dtype save_dtype);
/* The same with more __metadata__: meta is key, value, key, value, ..., NULL (NULL: none);
 * keys must not be kiln's own (kiln.n_layer, ...). */
kiln_status kiln_gpt_save_slab_meta(kiln_gpt *m, const char *path, const void *slab,
                                    kiln_dtype slab_dtype, kiln_dtype save_dtype,
                                    const char *const *meta);

/* Load every parameter tensor. Each must be present with exactly the model's shape; F32,
 * F16 and BF16 are accepted and converted. The padded embedding rows are zeroed. Errors
 * name the file and the tensor: KILN_ERR_NOT_FOUND (a tensor is missing), KILN_ERR_SHAPE
 * (expected and found shapes), KILN_ERR_DTYPE, KILN_ERR_FORMAT (a malformed file, or a
 * tensor this model does not have), KILN_ERR_UNSUPPORTED (an lm_head.weight that differs
 * from wte.weight). The whole file is checked before anything is copied, so a file that
 * does not fit leaves the parameters as they were. */
kiln_status kiln_gpt_load_safetensors(kiln_gpt *m, const char *path);
/* The same into any slab laid out as the model's (host memory), converted to slab_dtype. */
kiln_status kiln_gpt_load_slab(kiln_gpt *m, const char *path, void *slab, kiln_dtype slab_dtype);

/* The configuration a file holds: from kiln's __metadata__ when present (checked against
 * the tensor shapes), else inferred from the shapes, with n_head taken from *cfg as given
 * (Hugging Face files do not record it; the caller sets it, 12 for gpt2-124m) or, when
 * cfg->n_head is 0, GPT-2's n_embd / 64. The result is validated (padded_vocab_size set). */
kiln_status kiln_gpt_config_from_safetensors(kiln_gpt_config *cfg, const char *path);

#ifdef __cplusplus
}
#endif
#endif
