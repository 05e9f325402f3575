/* Internal error helpers shared by every module. */
#ifndef KILN_CORE_ERROR_H
#define KILN_CORE_ERROR_H

#include "kiln/status.h"

/* Record a detailed message for this thread and return s, so that
 *   return kiln__errorf(KILN_ERR_FORMAT, "%s: header is %zu bytes", path, n);
 * both sets the message and fails. */
kiln_status kiln__errorf(kiln_status s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prefix the current message with more context: "loading x.safetensors: <old message>". */
kiln_status kiln__error_wrap(kiln_status s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

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
