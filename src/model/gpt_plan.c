/* The activation plan: every buffer a step uses, with the span of the step it lives in, laid
 * out in one arena where buffers whose spans do not overlap share bytes.
 *
 * A step is a sequence of phases: the embedding, blocks 0..L-1 and the head forward, then the
 * head, blocks L-1..0 and the embedding backward. A buffer lives from the phase that writes
 * it to the last phase that reads it. What a block keeps for its backward lives from its
 * forward to its backward; what recomputation drops, forward temporaries and the backward
 * scratch are written and read again within a phase and so are shared by all blocks; in
 * inference (forward only) a block's activations live in its phase alone, so consecutive
 * blocks reuse the same bytes.
 *
 * Placement: buffers of the same span are grouped; largest groups first, each at the lowest
 * offset that overlaps no placed group whose span overlaps its own (first fit on an
 * interval graph). Buffers start on 64-byte boundaries. */
#include <stdlib.h>
#include <string.h>

#include "model/gpt_internal.h"

typedef struct plan_buf {
    void **ptr; /* where the buffer's address goes */
    size_t bytes;
    int first, last; /* phases, inclusive */
    size_t offset;
    int placed;
    int ws; /* scratch (workspace), not saved activations */
} plan_buf;

typedef struct plan {
    plan_buf *b;
    int n, cap;
    int failed;
} plan;

static void add(plan *p, void *ptr_of_ptr, size_t bytes, int first, int last) {
    if (p->failed)
        return;
    if (p->n == p->cap) {
        int cap = p->cap ? 2 * p->cap : 64;
        plan_buf *b = realloc(p->b, (size_t)cap * sizeof *b);
        if (!b) {
            p->failed = 1;
            return;
        }
        p->b = b;
        p->cap = cap;
    }
    bytes = (bytes + 63) / 64 * 64;
    p->b[p->n++] = (plan_buf){(void **)ptr_of_ptr, bytes, first, last, 0, 0, 0};
}

/* A scratch buffer (nothing in it outlives the op or phase that uses it), counted as
 * workspace rather than saved activations. */
static void add_ws(plan *p, void *ptr_of_ptr, size_t bytes, int first, int last) {
    add(p, ptr_of_ptr, bytes, first, last);
    if (!p->failed)
        p->b[p->n - 1].ws = 1;
}

/* Buffers with the same span coexist for all of it, so they are laid out back to back as
 * one group, and groups are placed: a model of L blocks has a few groups a block, whatever
 * the number of buffers. */
typedef struct group {
    int first, last;
    size_t bytes, offset;
} group;

static int by_span(const void *a, const void *b) {
    const plan_buf *x = *(plan_buf *const *)a, *y = *(plan_buf *const *)b;
    if (x->first != y->first)
        return x->first < y->first ? -1 : 1;
    if (x->last != y->last)
        return x->last < y->last ? -1 : 1;
    return x < y ? -1 : x > y; /* stable: the order they were added */
}

static int by_size_desc(const void *a, const void *b) {
    const group *x = *(group *const *)a, *y = *(group *const *)b;
    if (x->bytes != y->bytes)
        return x->bytes < y->bytes ? 1 : -1;
    return x < y ? -1 : x > y;
}

typedef struct interval {
    size_t begin, end;
} interval;

static int by_begin(const void *a, const void *b) {
    const interval *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Offsets for every buffer; the arena's size (0 and p->failed when memory ran out). */
static size_t place(plan *p) {
    size_t total = 0;
    int n = p->n;
    plan_buf **bufs = malloc((size_t)(n ? n : 1) * sizeof *bufs);
    group *groups = malloc((size_t)(n ? n : 1) * sizeof *groups);
    group **order = malloc((size_t)(n ? n : 1) * sizeof *order);
    interval *busy = malloc((size_t)(n ? n : 1) * sizeof *busy);
    int *gi = malloc((size_t)(n ? n : 1) * sizeof *gi);
    if (!bufs || !groups || !order || !busy || !gi) {
        p->failed = 1;
        goto done;
    }
    for (int i = 0; i < n; i++)
        bufs[i] = &p->b[i];
    qsort(bufs, (size_t)n, sizeof *bufs, by_span);
    int ng = 0;
    for (int i = 0; i < n; i++) {
        if (!ng || groups[ng - 1].first != bufs[i]->first || groups[ng - 1].last != bufs[i]->last)
            groups[ng++] = (group){bufs[i]->first, bufs[i]->last, 0, 0};
        bufs[i]->offset = groups[ng - 1].bytes; /* within the group, for now */
        groups[ng - 1].bytes += bufs[i]->bytes;
        gi[i] = ng - 1;
    }
    for (int g = 0; g < ng; g++)
        order[g] = &groups[g];
    qsort(order, (size_t)ng, sizeof *order, by_size_desc);
    /* largest first, each at the lowest offset clear of every placed group whose span
     * overlaps its own */
    for (int k = 0; k < ng; k++) {
        group *x = order[k];
        int nb = 0;
        for (int j = 0; j < k; j++) {
            const group *y = order[j];
            if (y->first <= x->last && x->first <= y->last)
                busy[nb++] = (interval){y->offset, y->offset + y->bytes};
        }
        qsort(busy, (size_t)nb, sizeof *busy, by_begin);
        size_t at = 0;
        for (int j = 0; j < nb && busy[j].begin < at + x->bytes; j++)
            at = busy[j].end > at ? busy[j].end : at;
        x->offset = at;
        total = at + x->bytes > total ? at + x->bytes : total;
    }
    for (int i = 0; i < n; i++) {
        bufs[i]->offset += groups[gi[i]].offset;
        bufs[i]->placed = 1;
    }
done:
    free(bufs), free(groups), free(order), free(busy), free(gi);
    return p->failed ? 0 : total;
}

/* Phases of a step with L blocks. */
typedef struct phases {
    int L;
} phases;
static int embed_f(const phases *ph) {
    (void)ph;
    return 0;
}
static int block_f(const phases *ph, int64_t l) {
    (void)ph;
    return 1 + (int)l;
}
static int head_f(const phases *ph) {
    return ph->L + 1;
}
static int head_b(const phases *ph) {
    return ph->L + 2;
}
static int block_b(const phases *ph, int64_t l) {
    return ph->L + 3 + (ph->L - 1 - (int)l);
}
static int embed_b(const phases *ph) {
    return 2 * ph->L + 3;
}

size_t kiln__gpt_plan_acts(kiln_gpt *m, void *base, size_t *workspace) {
    int64_t B = m->maxB, T = m->maxT, C = m->cfg.n_embd, NH = m->cfg.n_head;
    int64_t A = kiln_gpt_config_attn_width(&m->cfg), H = kiln_gpt_config_mlp_width(&m->cfg);
    int64_t BT = B * T, L = m->cfg.n_layer, Vp = m->cfg.padded_vocab_size;
    int64_t Q = kiln_gpt_config_qkv_width(&m->cfg), NKV = kiln_gpt_config_kv_heads(&m->cfg);
    int64_t in, FC; /* the MLP's first product's width: H, or SwiGLU's gate and up */
    kiln__gpt_matrix_shape(&m->cfg, KILN_GPT_MATRIX_FC, &in, &FC);
    /* RMSNorm keeps no mean */
    size_t meanf = m->cfg.norm == KILN_NORM_LAYERNORM ? sizeof(float) : 0;
    kiln_dtype dt = m->opt.dtype;
    size_t e = kiln_dtype_size(dt), f = sizeof(float);
    int inf = m->opt.inference, fused = m->opt.fuse_residual_ln;
    kiln_recompute rc = inf ? KILN_RECOMPUTE_NONE : m->opt.recompute;
    phases ph = {(int)L};
    int last = inf ? head_f(&ph) : embed_b(&ph); /* the step's last phase */
    int all0 = embed_f(&ph);                     /* a buffer shared by every phase */
    plan p = {0};
    /* With base NULL the views go to a throwaway table. */
    gpt_block_acts *blocks = base ? m->blocks : calloc((size_t)L, sizeof *blocks);
    kiln_gpt shadow;
    kiln_gpt *v = base ? m : &shadow;
    if (!base)
        memset(&shadow, 0, sizeof shadow);
    if (!blocks)
        return 0;

    size_t att_saved = m->be->attention_saved_bytes(m->be, dt, B, T, A, NH, NKV);
    size_t att_scratch = m->be->attention_scratch_bytes(m->be, dt, B, T, A, NH, NKV);
    add_ws(&p, &v->att_scratch, att_scratch, all0, last);
    add(&p, &v->encoded, (size_t)(BT * C) * e, embed_f(&ph),
        inf ? block_f(&ph, 0) : block_b(&ph, 0));

    /* What recomputation drops, shared by all blocks (one copy each, alive all step). */
    gpt_block_acts shared;
    memset(&shared, 0, sizeof shared);
    int keep_all =
        rc == KILN_RECOMPUTE_NONE || rc == KILN_RECOMPUTE_GELU || rc == KILN_RECOMPUTE_ATTENTION;
    if (rc == KILN_RECOMPUTE_BLOCK) {
        add(&p, &shared.ln1, (size_t)(BT * C) * e, all0, last);
        if (meanf)
            add(&p, &shared.ln1_mean, (size_t)BT * meanf, all0, last);
        add(&p, &shared.ln1_rstd, (size_t)BT * f, all0, last);
        add(&p, &shared.qkv, (size_t)(BT * Q) * e, all0, last);
        add(&p, &shared.res2, (size_t)(BT * C) * e, all0, last);
        add(&p, &shared.ln2, (size_t)(BT * C) * e, all0, last);
        if (meanf)
            add(&p, &shared.ln2_mean, (size_t)BT * meanf, all0, last);
        add(&p, &shared.ln2_rstd, (size_t)BT * f, all0, last);
        add(&p, &shared.fch, (size_t)(BT * FC) * e, all0, last);
    }
    if (rc == KILN_RECOMPUTE_BLOCK || rc == KILN_RECOMPUTE_ATTENTION) {
        add(&p, &shared.att, att_saved, all0, last);
        add(&p, &shared.atty, (size_t)(BT * A) * e, all0, last);
    }
    if (rc != KILN_RECOMPUTE_NONE)
        add(&p, &shared.fch_gelu, (size_t)(BT * H) * e, all0, last);
    if (fused)
        add_ws(&p, &shared.tmp, (size_t)(BT * C) * e, all0, last);
    /* factored matrices' mids: kept by each block, or shared when the block is recomputed */
    int64_t max_rank = 0;
    for (int k = 0; k < 4; k++) {
        int64_t r = m->cfg.rank[k];
        max_rank = r > max_rank ? r : max_rank;
        if (r && rc == KILN_RECOMPUTE_BLOCK)
            add(&p, &shared.mid[k], (size_t)(BT * r) * e, all0, last);
    }

    for (int64_t l = 0; l < L; l++) {
        gpt_block_acts *a = &blocks[l];
        int f0 = block_f(&ph, l), b0 = inf ? f0 : block_b(&ph, l);
        /* with the fused tail, block l-1 writes block l's first LayerNorm */
        int ln_f0 = fused && l > 0 ? block_f(&ph, l - 1) : f0;
        if (keep_all) {
            add(&p, &a->ln1, (size_t)(BT * C) * e, ln_f0, b0);
            if (meanf)
                add(&p, &a->ln1_mean, (size_t)BT * meanf, ln_f0, b0);
            add(&p, &a->ln1_rstd, (size_t)BT * f, ln_f0, b0);
            add(&p, &a->qkv, (size_t)(BT * Q) * e, f0, b0);
            add(&p, &a->res2, (size_t)(BT * C) * e, f0, b0);
            add(&p, &a->ln2, (size_t)(BT * C) * e, f0, b0);
            if (meanf)
                add(&p, &a->ln2_mean, (size_t)BT * meanf, f0, b0);
            add(&p, &a->ln2_rstd, (size_t)BT * f, f0, b0);
            add(&p, &a->fch, (size_t)(BT * FC) * e, f0, b0);
        }
        if (rc == KILN_RECOMPUTE_NONE || rc == KILN_RECOMPUTE_GELU) {
            add(&p, &a->att, att_saved, f0, b0);
            add(&p, &a->atty, (size_t)(BT * A) * e, f0, b0);
        }
        if (rc == KILN_RECOMPUTE_NONE)
            add(&p, &a->fch_gelu, (size_t)(BT * H) * e, f0, b0);
        for (int k = 0; k < 4 && rc != KILN_RECOMPUTE_BLOCK; k++)
            if (m->cfg.rank[k])
                add(&p, &a->mid[k], (size_t)(BT * m->cfg.rank[k]) * e, f0, b0);
        /* the block's output is the next block's input (the head's, after the last) */
        int out_last = inf ? (l + 1 < L ? block_f(&ph, l + 1) : head_f(&ph))
                           : (l + 1 < L ? block_b(&ph, l + 1) : head_b(&ph));
        add(&p, &a->res3, (size_t)(BT * C) * e, f0, out_last);
    }
    int lnf_first = fused ? block_f(&ph, L - 1) : head_f(&ph),
        head_last = inf ? head_f(&ph) : head_b(&ph);
    add(&p, &v->lnf, (size_t)(BT * C) * e, lnf_first, head_last);
    if (meanf)
        add(&p, &v->lnf_mean, (size_t)BT * meanf, lnf_first, head_last);
    add(&p, &v->lnf_rstd, (size_t)BT * f, lnf_first, head_last);
    int64_t rows =
        m->opt.classifier_chunk > 0 && m->opt.classifier_chunk < BT ? m->opt.classifier_chunk : BT;
    if (rows < B)
        rows = B;
    v->logit_rows = rows;
    add_ws(&p, &v->logits, (size_t)(rows * Vp) * e, head_f(&ph), head_last);
    add(&p, &v->losses, (size_t)BT * f, head_f(&ph), last);
    if (!inf) {
        int d0 = head_b(&ph), d1 = embed_b(&ph);
        add_ws(&p, &v->d.dres, (size_t)(BT * C) * e, d0, d1);
        add_ws(&p, &v->d.dln, (size_t)(BT * C) * e, d0, d1);
        add_ws(&p, &v->d.datty, (size_t)(BT * A) * e, block_b(&ph, L - 1), d1);
        add_ws(&p, &v->d.dqkv, (size_t)(BT * Q) * e, block_b(&ph, L - 1), d1);
        add_ws(&p, &v->d.dfch, (size_t)(BT * FC) * e, block_b(&ph, L - 1), d1);
        add_ws(&p, &v->d.dfch_gelu, (size_t)(BT * H) * e, block_b(&ph, L - 1), d1);
        if (max_rank)
            add_ws(&p, &v->d.dmid, (size_t)(BT * max_rank) * e, block_b(&ph, L - 1), d1);
    }
    size_t total = p.failed ? 0 : place(&p);
    if (workspace && !p.failed) {
        /* the saved activations laid out alone; the workspace is what the rest adds */
        plan saved = {0};
        for (int i = 0; i < p.n; i++)
            if (!p.b[i].ws)
                add(&saved, p.b[i].ptr, p.b[i].bytes, p.b[i].first, p.b[i].last);
        size_t alone = saved.failed ? total : place(&saved);
        *workspace = total > alone ? total - alone : 0;
        free(saved.b);
    }
    if (base && !p.failed) {
        for (int i = 0; i < p.n; i++)
            *p.b[i].ptr = (char *)base + p.b[i].offset;
        /* what the blocks share */
        for (int64_t l = 0; l < L; l++) {
            gpt_block_acts *a = &blocks[l];
            if (!keep_all) {
                a->ln1 = shared.ln1, a->ln1_mean = shared.ln1_mean, a->ln1_rstd = shared.ln1_rstd;
                a->qkv = shared.qkv, a->res2 = shared.res2, a->ln2 = shared.ln2;
                a->ln2_mean = shared.ln2_mean, a->ln2_rstd = shared.ln2_rstd, a->fch = shared.fch;
            }
            if (rc == KILN_RECOMPUTE_BLOCK || rc == KILN_RECOMPUTE_ATTENTION)
                a->att = shared.att, a->atty = shared.atty;
            if (rc != KILN_RECOMPUTE_NONE)
                a->fch_gelu = shared.fch_gelu;
            a->tmp = fused ? shared.tmp : NULL;
            if (rc == KILN_RECOMPUTE_BLOCK)
                memcpy(a->mid, shared.mid, sizeof a->mid);
        }
    }
    if (!base)
        free(blocks);
    free(p.b);
    return total;
}
