/* Internal error helpers shared by every module (the message setters are public:
 * kiln/status.h). */
#ifndef KILN_CORE_ERROR_H
#define KILN_CORE_ERROR_H

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

#endif
