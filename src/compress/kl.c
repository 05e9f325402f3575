/* kiln_evaluate_kl (include/kiln/compress.h): the teacher's and the model's next-token
 * distributions over the same windows, compared position by position. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kiln/compress.h"
#include "kiln/loader.h"

/* KL(p || q) of one row of logits each (V of them), in double. */
static double row_kl(const float *zt, const float *zm, int64_t V) {
    double mt = -INFINITY, mm = -INFINITY;
    for (int64_t v = 0; v < V; v++) {
        mt = fmax(mt, zt[v]);
        mm = fmax(mm, zm[v]);
    }
    double st = 0.0, sm = 0.0;
    for (int64_t v = 0; v < V; v++) {
        st += exp(zt[v] - mt);
        sm += exp(zm[v] - mm);
    }
    double lt = mt + log(st), lm = mm + log(sm), kl = 0.0;
    for (int64_t v = 0; v < V; v++) {
        double logp = zt[v] - lt;
        kl += exp(logp) * (logp - (zm[v] - lm));
    }
    return kl;
}

kiln_status kiln_evaluate_kl(kiln_gpt *teacher, kiln_gpt *m, struct kiln_loader *l, int64_t B,
                             int64_t T, int64_t batches, double *kl) {
    const kiln_gpt_config *ct = kiln_gpt_get_config(teacher), *cm = kiln_gpt_get_config(m);
    if (ct->vocab_size != cm->vocab_size || kiln_loader_vocab_size(l) != cm->vocab_size)
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "the teacher's vocabulary (%lld tokens), the model's (%lld) and "
                               "the data's (%lld) must be the same",
                               (long long)ct->vocab_size, (long long)cm->vocab_size,
                               (long long)kiln_loader_vocab_size(l));
    kiln_loader_state start = kiln_loader_get_state(l);
    start.epoch = 0;
    start.position = 0;
    KILN_CHECK(kiln_loader_set_state(l, &start));
    int64_t BT = B * T, V = cm->vocab_size, n = kiln_loader_batches_per_epoch(l);
    if (batches > 0 && batches < n)
        n = batches;
    int32_t *in = malloc((size_t)BT * sizeof *in), *tg = malloc((size_t)BT * sizeof *tg);
    float *zt = malloc((size_t)(BT * ct->padded_vocab_size) * sizeof *zt);
    float *zm = malloc((size_t)(BT * cm->padded_vocab_size) * sizeof *zm);
    kiln_status s =
        in && tg && zt && zm ? KILN_OK : kiln_error_setf(KILN_ERR_NOMEM, "out of memory");
    double sum = 0.0;
    for (int64_t i = 0; s == KILN_OK && i < n; i++) {
        s = kiln_loader_next(l, in, tg);
        if (s == KILN_OK)
            s = kiln_gpt_forward(teacher, in, NULL, B, T, NULL);
        if (s == KILN_OK)
            s = kiln_gpt_logits_f32(teacher, BT, zt);
        if (s == KILN_OK)
            s = kiln_gpt_forward(m, in, NULL, B, T, NULL);
        if (s == KILN_OK)
            s = kiln_gpt_logits_f32(m, BT, zm);
        if (s != KILN_OK)
            break;
        double part = 0.0;
#pragma omp parallel for reduction(+ : part) schedule(static)
        for (int64_t r = 0; r < BT; r++)
            part += row_kl(zt + r * ct->padded_vocab_size, zm + r * cm->padded_vocab_size, V);
        sum += part;
    }
    if (s == KILN_OK)
        *kl = n > 0 ? sum / (double)(n * BT) : NAN;
    free(in);
    free(tg);
    free(zt);
    free(zm);
    return s;
}
