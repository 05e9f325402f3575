/* kiln train's watchdog flags (hangs, stragglers, heartbeats, fault injection): a block of
 * the flag table and what they set in kiln_watchdog_config. */
#ifndef KILN_TOOL_WATCHDOG_FLAGS_H
#define KILN_TOOL_WATCHDOG_FLAGS_H

#include <stdint.h>

#include "flags.h"
#include "kiln/train.h"
#include "test_faults.h"

typedef struct tool_watchdog_flags {
    int on, straggler_exit;
    const char *heartbeat, *inject_hang, *inject_slow;
    double heartbeat_s, warn, hang, hang_min_s, straggler;
    int64_t straggler_window;
} tool_watchdog_flags;

/* The defaults: d's. */
void tool_watchdog_flags_init(tool_watchdog_flags *f, const kiln_watchdog_config *d);
/* f's values into *c, and the injected hang and slowness into *faults; 0, or 2 after a
 * message on stderr. */
int tool_watchdog_flags_apply(const tool_watchdog_flags *f, kiln_watchdog_config *c,
                              kiln__trainer_faults *faults);

/* The entries of the flag table, for f (a tool_watchdog_flags). */
/* clang-format off */
#define TOOL_WATCHDOG_FLAGS(f)                                                                  \
    {"watchdog", TOOL_FLAG_BOOL, &(f).on,                                                       \
     "watch for hung steps and straggling ranks (--no-watchdog: off, no heartbeat)"},          \
    {"heartbeat", TOOL_FLAG_STRING, &(f).heartbeat,                                             \
     "write a JSON heartbeat (step, times, health) to this file every --heartbeat-s "           \
     "(several ranks: PATH.rank<R>)"},                                                          \
    {"heartbeat-s", TOOL_FLAG_FLOAT, &(f).heartbeat_s, "seconds between heartbeats",    \
     TOOL_RANGE_ABOVE(0, 1e6)},          \
    {"hang-warn-factor", TOOL_FLAG_FLOAT, &(f).warn,                                            \
     "warn on stderr when a step runs this many times the median step", TOOL_RANGE(1, 1e6)},                        \
    {"hang-factor", TOOL_FLAG_FLOAT, &(f).hang,                                                 \
     "a step this many times the median (and --hang-min-s) is hung: exit 4 (at least "         \
     "--hang-warn-factor)", TOOL_RANGE(1, 1e6)},                   \
    {"hang-min-s", TOOL_FLAG_FLOAT, &(f).hang_min_s,                                            \
     "never call a step hung before this many seconds (the only limit for the first steps)",  \
     TOOL_RANGE_ABOVE(0, 1e7)},  \
    {"straggler-factor", TOOL_FLAG_FLOAT, &(f).straggler,                                       \
     "data parallel: a rank whose compute time per step is this many times the other ranks' "  \
     "over a window is a straggler (0: off; else above 1)"},                                                  \
    {"straggler-window", TOOL_FLAG_INT, &(f).straggler_window,                                  \
     "data parallel: steps in a rank's median compute time", TOOL_RANGE(3, 1024)},                                   \
    {"straggler-exit", TOOL_FLAG_BOOL, &(f).straggler_exit,                                     \
     "data parallel: a rank that stays a straggler another window ends the run after a "       \
     "checkpoint, exit 5 (for kiln run --fewer-ranks)"},                                        \
    {"inject-hang", TOOL_FLAG_STRING, &(f).inject_hang,                                         \
     "fault injection (tests): RANK:STEP, that rank sleeps for good inside that step (not "    \
     "in a resumed run)"},                                                                      \
    {"inject-slow", TOOL_FLAG_STRING, &(f).inject_slow,                                         \
     "fault injection (tests): RANK:MS, that rank sleeps MS more in every step (not in a "     \
     "resumed run)"}
/* clang-format on */

#endif
