/* Internal error helpers shared by every module (the message setters are public:
 * kiln/status.h). */
#ifndef KILN_CORE_ERROR_H
#define KILN_CORE_ERROR_H

#include <stdio.h>

#include "kiln/status.h"

#define KILN_CHECK(expr)                 \
    do {                                 \
        kiln_status check_s_ = (expr);   \
        if (check_s_ != KILN_OK)         \
            return check_s_;             \
    } while (0)

/* Sets `st` (a kiln_status variable in scope) and jumps to `label` on failure. */
#define KILN_CHECK_GOTO(st, expr, label) \
    do {                                 \
        (st) = (expr);                   \
        if ((st) != KILN_OK)             \
            goto label;                  \
    } while (0)

/* A warning, as one line "kiln: warning: <text>" on stderr, where warnings belong; on `log`
 * too when that is a file of the caller's own (not stdout or stderr). A NULL log: nothing
 * (the caller asked for quiet: a library user without a log, a rank other than 0). */
void kiln__warn(FILE *log, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
