/* kiln train's watchdog flags into kiln_watchdog_config. */
#include "watchdog_flags.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "tool_common.h"

void tool_watchdog_flags_init(tool_watchdog_flags *f, const kiln_watchdog_config *d) {
    *f = (tool_watchdog_flags){.on = d->enabled,
                               .straggler_exit = d->straggler_exit,
                               .heartbeat_s = d->heartbeat_s,
                               .warn = d->warn_factor,
                               .hang = d->hang_factor,
                               .hang_min_s = d->hang_min_s,
                               .straggler = d->straggler_factor,
                               .straggler_window = d->straggler_window};
}

/* "RANK:VALUE", RANK 0..2^20, VALUE a number >= 0. */
static int parse_pair(const char *flag, const char *text, int *rank, double *value) {
    char *end = NULL;
    long r = strtol(text, &end, 10);
    if (end != text && *end == ':' && r >= 0 && r <= (1 << 20)) {
        const char *v = end + 1;
        double x = strtod(v, &end);
        if (end != v && *end == '\0' && x >= 0 && isfinite(x)) {
            *rank = (int)r;
            *value = x;
            return 0;
        }
    }
    fprintf(stderr, "kiln train: --%s wants RANK:%s, e.g. 1:%s; got '%s'\n", flag,
            flag[7] == 'h' ? "STEP" : "MS", flag[7] == 'h' ? "5" : "20", text);
    return 2;
}

int tool_watchdog_flags_apply(const tool_watchdog_flags *f, kiln_watchdog_config *c,
                              kiln__trainer_faults *faults) {
    c->enabled = f->on;
    c->heartbeat_path = f->heartbeat && f->heartbeat[0] ? f->heartbeat : NULL;
    c->heartbeat_s = f->heartbeat_s;
    c->warn_factor = f->warn;
    c->hang_factor = f->hang;
    c->hang_min_s = f->hang_min_s;
    c->straggler_factor = f->straggler;
    c->straggler_window = (int)f->straggler_window; /* 3..1024, by the flag table */
    c->straggler_exit = f->straggler_exit;
    c->on_hang = tool_watchdog_hung; /* the library reports the hang; the command exits */
    if (!(f->hang >= f->warn)) {
        fprintf(stderr,
                "kiln train: --hang-factor %g is below --hang-warn-factor %g: a step is "
                "warned about before it is hung\n",
                f->hang, f->warn);
        return 2;
    }
    if (!(f->straggler == 0 || (f->straggler > 1 && f->straggler < 1e6))) {
        char v[32];
        snprintf(v, sizeof v, "%g", f->straggler);
        return tool_flag_refuse("kiln train", "straggler-factor", v, "0 (off) or in (1, 1e+06)");
    }
    if (!f->on && (c->heartbeat_path || f->inject_hang || f->inject_slow || f->straggler_exit)) {
        fprintf(stderr, "kiln train: --heartbeat, --straggler-exit and the fault injections need "
                        "the watchdog: drop --no-watchdog\n");
        return 2;
    }
    double step = 0;
    if (f->inject_hang && parse_pair("inject-hang", f->inject_hang, &faults->hang_rank, &step))
        return 2;
    if (f->inject_hang && (step < 1 || step > 1e15 || step != floor(step))) {
        fprintf(stderr, "kiln train: --inject-hang's step must be a whole number >= 1, got '%s'\n",
                f->inject_hang);
        return 2;
    }
    faults->hang_step = (int64_t)step;
    if (f->inject_slow &&
        parse_pair("inject-slow", f->inject_slow, &faults->slow_rank, &faults->slow_ms))
        return 2;
    return 0;
}
