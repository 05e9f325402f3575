#include "train/metrics.h"

#include <errno.h>
#include <math.h>
#include <string.h>

#include "core/error.h"

kiln_status kiln__train_metrics_write(FILE *f, const char *path, const train_step_metrics *s) {
    int n = fprintf(f,
                    "{\"step\": %lld, \"loss\": %.6f, \"lr\": %.6g, \"grad_norm\": %.6f, "
                    "\"ms\": %.3f, \"tokens_per_s\": %.2f, \"mfu\": %.5f, \"peak_rss_mb\": %.1f",
                    (long long)s->step, s->loss, s->lr, s->grad_norm, s->ms, s->tokens_per_s,
                    s->mfu, (double)s->rss / (1024.0 * 1024.0));
    if (n > 0 && !isnan(s->val_loss))
        n = fprintf(f, ", \"val_loss\": %.6f", s->val_loss);
    if (n > 0)
        n = fprintf(f, "}\n");
    if (n < 0 || fflush(f) != 0) {
        int e = errno;
        return kiln_error_setf(KILN_ERR_IO, "cannot write metrics to %s: %s", path, strerror(e));
    }
    return KILN_OK;
}

void kiln__train_metrics_console(FILE *log, const train_step_metrics *s) {
    if (!log)
        return;
    fprintf(log,
            "step %5lld/%lld | loss %.4f | lr %.2e | norm %7.4f | %8.1f ms | %8.0f tok/s | "
            "MFU %5.1f%%",
            (long long)s->step, (long long)s->steps, s->loss, s->lr, s->grad_norm, s->ms,
            s->tokens_per_s, 100.0 * s->mfu);
    if (!isnan(s->val_loss))
        fprintf(log, " | val %.4f", s->val_loss);
    fprintf(log, "\n");
    fflush(log);
}
