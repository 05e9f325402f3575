#include "train/metrics.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"

/* A JSON number, or null for NaN and infinities (JSON has no such numbers). */
static const char *num(char *buf, size_t cap, const char *fmt, double v) {
    if (!isfinite(v))
        return "null";
    snprintf(buf, cap, fmt, v);
    return buf;
}

kiln_status kiln__train_metrics_write(FILE *f, const char *path, const kiln_step_info *s) {
    char a[32], b[32];
    int n = fprintf(f,
                    "{\"step\": %lld, \"loss\": %s, \"lr\": %.6g, \"grad_norm\": %s, "
                    "\"ms\": %.3f, \"tokens_per_s\": %.2f, \"mfu\": %.5f, \"peak_rss_mb\": %.1f",
                    (long long)s->step, num(a, sizeof a, "%.6f", s->loss), s->lr,
                    num(b, sizeof b, "%.6f", s->grad_norm), s->ms, s->tokens_per_s, s->mfu,
                    (double)s->rss / (1024.0 * 1024.0));
    if (n > 0 && !isnan(s->val_loss))
        n = fprintf(f, ", \"val_loss\": %.6f", s->val_loss);
    if (n > 0 && s->loss_scale > 0)
        n = fprintf(f, ", \"loss_scale\": %.9g, \"skipped\": %d, \"skipped_total\": %lld",
                    s->loss_scale, s->skipped, (long long)s->skipped_total);
    if (n > 0 && s->world > 1)
        n = fprintf(f, ", \"world\": %d, \"comm_ms\": %.3f, \"comm_hidden\": %.4f, "
                       "\"comm_bytes\": %llu",
                    s->world, s->comm_ms, s->comm_hidden, (unsigned long long)s->comm_bytes);
    if (n > 0)
        n = fprintf(f, "}\n");
    if (n < 0 || fflush(f) != 0) {
        int e = errno;
        return kiln_error_setf(KILN_ERR_IO, "cannot write metrics to %s: %s", path, strerror(e));
    }
    return KILN_OK;
}

void kiln__train_metrics_console(FILE *log, const kiln_step_info *s) {
    if (!log)
        return;
    fprintf(log,
            "step %5lld/%lld | loss %.4f | lr %.2e | norm %7.4f | %8.1f ms | %8.0f tok/s | "
            "MFU %5.1f%%",
            (long long)s->step, (long long)s->steps, s->loss, s->lr, s->grad_norm, s->ms,
            s->tokens_per_s, 100.0 * s->mfu);
    if (!isnan(s->val_loss))
        fprintf(log, " | val %.4f", s->val_loss);
    if (s->loss_scale > 0)
        fprintf(log, " | scale %g%s", s->loss_scale, s->skipped ? " (overflow: step skipped)" : "");
    if (s->world > 1)
        fprintf(log, " | comm %.1f ms (%.0f%% hidden)", s->comm_ms, 100.0 * s->comm_hidden);
    fprintf(log, "\n");
    fflush(log);
}
