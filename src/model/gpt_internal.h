/* Internal layout of the GPT model: named views into the parameter, gradient and
 * activation memory, and the activation plan. */
#ifndef KILN_MODEL_GPT_INTERNAL_H
#define KILN_MODEL_GPT_INTERNAL_H

#include "kiln/model.h"

/* One block's working weights (in the model's dtype): views into the parameter slab. Shapes
 * are GPT-2's (in, out); a Llama's matrices are (out, in) (kiln_gpt.tw), q, k and v one
 * (Q, C) matrix of Q = A + 2 x the key/value width, gate and up one (2H, C), and it has no
 * biases (NULL) and no norm biases (RMSNorm). */
typedef struct gpt_block_params {
    void *ln1w, *ln1b;         /* (C) */
    void *qkvw, *qkvb;         /* (C,Q), (Q); A: the attention's width, Q = 3A in GPT-2 */
    void *attprojw, *attprojb; /* (A,C), (C) */
    void *ln2w, *ln2b;         /* (C) */
    void *fcw, *fcb;           /* (C,H), (H); H: the MLP's width (2H: SwiGLU's gate and up) */
    void *fcprojw, *fcprojb;   /* (H,C), (C) */
    /* factored matrices by kiln_gpt_matrix (QKV..FCPROJ): U (in,r) and V (r,out) in place of
     * the weight above, which is then NULL; NULL for a dense one */
    void *u[4], *v[4];
} gpt_block_params;

typedef struct gpt_params {
    void *wte;               /* (Vp,C); rows V..Vp-1 are padding, always 0 */
    void *wpe;               /* (maxT,C); NULL with rotary positions */
    gpt_block_params *block; /* [L] */
    void *lnfw, *lnfb;       /* (C); lnfb NULL with RMSNorm */
    void *head;              /* (Vp,C): wte, or an untied head's own matrix */
} gpt_params;

/* The same for the fp32 gradient slab. */
typedef struct gpt_block_grads {
    float *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb;
    float *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
    float *u[4], *v[4]; /* as in gpt_block_params */
} gpt_block_grads;

typedef struct gpt_grads {
    float *wte, *wpe;
    gpt_block_grads *block;
    float *lnfw, *lnfb;
    float *head;
} gpt_grads;

/* One block's activations, sized for the planned maximum B and T (a smaller batch uses the
 * leading part of each buffer), in the model's dtype unless marked fp32. Which of them a
 * block owns and which are shared with other blocks is the plan's business (gpt_plan.c):
 * what recomputation drops, and everything in inference, is shared by lifetime. */
typedef struct gpt_block_acts {
    void *ln1;                  /* (B,T,C) */
    float *ln1_mean, *ln1_rstd; /* (B,T), (B,T) fp32 */
    void *qkv;                  /* (B,T,Q), q and k rotated with rotary positions */
    void *att;                  /* the backend's attention state (attention_saved_bytes) */
    void *atty;                 /* (B,T,A) heads' outputs */
    void *res2;                 /* (B,T,C) residual after attention */
    void *ln2;                  /* (B,T,C) */
    float *ln2_mean, *ln2_rstd; /* (B,T), (B,T) fp32 */
    void *fch;                  /* (B,T,H) before GELU; (B,T,2H) gate and up before SwiGLU */
    void *fch_gelu;             /* (B,T,H) the activation's output */
    void *res3;                 /* (B,T,C) block output: the next block's input */
    void *tmp;                  /* (B,T,C) a product's output before a fused residual add */
    void *mid[4]; /* (B,T,r) x U of a factored matrix, by kiln_gpt_matrix (NULL: dense) */
} gpt_block_acts;

/* Gradients of activations, reused by every block in backward. */
typedef struct gpt_grad_scratch {
    void *dres;      /* (B,T,C) gradient of the residual stream */
    void *dln;       /* (B,T,C) gradient of a LayerNorm output */
    void *datty;     /* (B,T,A) */
    void *dqkv;      /* (B,T,Q) */
    void *dfch;      /* (B,T,H), or (B,T,2H) */
    void *dfch_gelu; /* (B,T,H) */
    void *dmid;      /* (B,T,r) of the largest rank: the gradient of a factored product's mid */
} gpt_grad_scratch;

struct kiln_gpt {
    kiln_gpt_config cfg;
    kiln_gpt_options opt;
    kiln_dtype dt; /* opt.dtype */
    kiln_backend *be;
    int64_t maxB, maxT;

    void *params; /* working weights, slab_len elements of dt */
    float *grads; /* slab_len floats */
    int64_t slab_len;
    kiln_tensor_info *tensors;
    int ntensors;
    int nembed;   /* tensors before block 0's: wte and wpe, or a Llama's embed_tokens */
    int tw;       /* the block matrices' layout, matmul's trans_w: 0 (in, out), 1 (out, in) */
    gpt_params p; /* views into params */
    gpt_grads g;  /* views into grads */

    void *acts; /* the activation arena: every activation and scratch buffer */
    size_t acts_bytes, workspace_bytes;
    void *encoded; /* (B,T,C) */
    gpt_block_acts *blocks;
    void *lnf;                  /* (B,T,C) */
    float *lnf_mean, *lnf_rstd; /* (B,T) fp32 */
    void *logits;               /* (logit_rows,Vp); holds dlogits after backward */
    int64_t logit_rows;         /* B*T, or the classifier chunk (at least maxB) */
    float *losses;              /* (B,T) fp32 */
    /* distillation (kiln_gpt_set_soft_targets): the teacher's tempered probabilities
     * (B*T, V, the caller's), the mix, and per row its KL term; scratch: a chunk's rows */
    struct {
        const float *p;
        float alpha, temperature;
        float *kl;      /* (maxB*maxT) */
        float *scratch; /* (logit_rows, Vp) */
    } soft;
    void *att_scratch; /* the backend's attention workspace */
    gpt_grad_scratch d;
    int32_t *inputs, *targets; /* the last forward's batch (B,T), host memory */

    int64_t B, T;     /* sizes of the last forward */
    int have_targets; /* the last forward had targets and backward may run */
    int logits_valid; /* kiln_gpt_logits holds the last forward's logits */
    /* the block (L: the final norm) whose first norm the fused tail of the block run last in
     * this forward computed; -1 none (it runs its own) */
    int64_t norm_ready;
    int have_batch; /* kiln_gpt_begin has recorded a batch this step */

    int rows_apart;                /* kiln_gpt_set_embed_rows_apart */
    int64_t rows_n;                /* rows the last backward left apart (0: none) */
    kiln_grad_ready_fn grad_ready; /* kiln_gpt_set_grad_ready (NULL: none) */
    void *grad_ready_ctx;
    kiln_param_need_fn param_need; /* kiln_gpt_set_param_need (NULL: every part resident) */
    void *param_need_ctx;
    int mapped; /* opt.sharded: params and grads from kiln_memory_map */
    /* kiln_gpt_set_linear: the products done outside the backend (NULL: none) */
    /* generation's cache (kiln_gpt_enable_cache): every layer's q, k, v rows, (L, maxB, cap,
     * Q) in dt, cap rows a sequence (maxT; 2 maxT with rotary positions, whose window slides
     * on past maxT); row r holds position base + r; len positions of each sequence run so far;
     * t0 >= 0 while a cached forward runs (its first position), -1 otherwise */
    struct {
        void *buf;
        int64_t len, t0, cap, base;
    } kv;
    kiln_gpt_linear_fn linear;
    void *linear_ctx;
    void (*linear_release)(void *ctx);
};

/* config.c: an integer at key (or alt) of a JSON object; when optional, a missing key leaves
 * *out as it is. The message names path and the key. */
struct cJSON;
kiln_status kiln__json_int(const struct cJSON *root, const char *key, const char *alt, int optional,
                           int64_t *out, const char *path);
/* config_hf.c: kiln's own keys for the architecture ("family", "n_kv_head", "norm_eps",
 * "rope_theta", "untied_head"), each optional, into c (its family's description first). */
kiln_status kiln__json_arch(const struct cJSON *root, kiln_gpt_config *c, const char *path);
/* config_hf.c: a Hugging Face config.json (model_type "llama" or "gpt2") into c; keys that
 * change the math and that kiln does not support are refused by name. */
kiln_status kiln__gpt_config_from_hf(const struct cJSON *root, kiln_gpt_config *c,
                                     const char *path);

/* config.c: the shape (in, out) of block matrix `kind` (kiln_gpt_matrix, QKV..FCPROJ). */
void kiln__gpt_matrix_shape(const kiln_gpt_config *cfg, int kind, int64_t *in, int64_t *out);
/* gpt_layout.c: the tensors of one block: GPT-2's 12, and one more for each factored kind;
 * a Llama's 9. */
int kiln__gpt_block_tensors(const kiln_gpt_config *cfg);

/* gpt_layout.c: the gradient slab's range [*lo, *hi) of one part of the model, which backward
 * finishes as a whole: block `part` (0..L-1), ln_f (L) or the embeddings wte and wpe (-1). */
void kiln__gpt_part_range(const kiln_gpt *m, int64_t part, int64_t *lo, int64_t *hi);

/* gpt_plan.c: lay out every activation and scratch buffer of m (sizes from m->cfg, m->opt,
 * m->maxB, m->maxT and the backend) in one arena, buffers whose lifetimes in a step do not
 * overlap sharing bytes. With base NULL it only measures; returns the arena's bytes (0 when
 * the plan cannot be made), and the bytes of scratch buffers in *workspace (may be NULL).
 * With base, it points m's views into it. */
size_t kiln__gpt_plan_acts(kiln_gpt *m, void *base, size_t *workspace);

#endif
