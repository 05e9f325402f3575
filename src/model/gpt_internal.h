/* Internal layout of the GPT model: named views into the parameter, gradient and
 * activation slabs. */
#ifndef KILN_MODEL_GPT_INTERNAL_H
#define KILN_MODEL_GPT_INTERNAL_H

#include "kiln/model.h"

/* One block's parameters (or gradients): views into a slab. */
typedef struct gpt_block_params {
    float *ln1w, *ln1b;         /* (C) */
    float *qkvw, *qkvb;         /* (C,3C), (3C) */
    float *attprojw, *attprojb; /* (C,C), (C) */
    float *ln2w, *ln2b;         /* (C) */
    float *fcw, *fcb;           /* (C,4C), (4C) */
    float *fcprojw, *fcprojb;   /* (4C,C), (C) */
} gpt_block_params;

typedef struct gpt_params {
    float *wte;              /* (Vp,C); rows V..Vp-1 are padding, always 0 */
    float *wpe;              /* (maxT,C) */
    gpt_block_params *block; /* [L] */
    float *lnfw, *lnfb;      /* (C) */
} gpt_params;

/* One block's saved activations, sized for the planned maximum B and T; a smaller batch
 * uses the leading part of each buffer. */
typedef struct gpt_block_acts {
    float *ln1, *ln1_mean, *ln1_rstd; /* (B,T,C), (B,T), (B,T) */
    float *qkv;                       /* (B,T,3C) */
    float *atty;                      /* (B,T,C) heads' outputs */
    float *att;                       /* (B,NH,T,T) attention probabilities */
    float *res2;                      /* (B,T,C) residual after attention */
    float *ln2, *ln2_mean, *ln2_rstd; /* (B,T,C), (B,T), (B,T) */
    float *fch;                       /* (B,T,4C) before GELU */
    float *fch_gelu;                  /* (B,T,4C) */
    float *res3;                      /* (B,T,C) block output */
} gpt_block_acts;

/* Gradients of activations, reused by every block in backward. */
typedef struct gpt_grad_scratch {
    float *dres;      /* (B,T,C) gradient of the residual stream */
    float *dln;       /* (B,T,C) gradient of a LayerNorm output */
    float *datty;     /* (B,T,C) */
    float *dqkv;      /* (B,T,3C) */
    float *dfch;      /* (B,T,4C) */
    float *dfch_gelu; /* (B,T,4C) */
    float *datt;      /* (B,NH,T,T) */
} gpt_grad_scratch;

struct kiln_gpt {
    kiln_gpt_config cfg;
    const kiln_backend *be;
    int64_t maxB, maxT;

    float *params, *grads; /* slabs of slab_len floats */
    int64_t slab_len;
    kiln_tensor_info *tensors;
    int ntensors;
    gpt_params p, g; /* views into params and grads */

    float *acts; /* one slab for every activation and scratch buffer */
    size_t acts_bytes;
    float *encoded; /* (B,T,C) */
    gpt_block_acts *blocks;
    float *lnf, *lnf_mean, *lnf_rstd; /* (B,T,C), (B,T), (B,T) */
    float *logits;                    /* (B,T,Vp); holds dlogits after backward */
    float *losses;                    /* (B,T) */
    gpt_grad_scratch d;
    int32_t *inputs, *targets; /* the last forward's batch (B,T) */

    int64_t B, T;     /* sizes of the last forward */
    int have_targets; /* the last forward had targets and backward may run */
    int inference;    /* forward only: no gradients, one block's activations shared by all */
};

#endif
