#include "core/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char error_msg[1024];

const char *kiln_status_str(kiln_status s) {
    switch (s) {
    case KILN_OK: return "ok";
    case KILN_ERR_ARG: return "invalid argument";
    case KILN_ERR_NOMEM: return "out of memory";
    case KILN_ERR_IO: return "i/o error";
    case KILN_ERR_FORMAT: return "malformed file";
    case KILN_ERR_CHECKSUM: return "checksum mismatch";
    case KILN_ERR_SHAPE: return "wrong shape";
    case KILN_ERR_DTYPE: return "wrong dtype";
    case KILN_ERR_RANGE: return "value out of range";
    case KILN_ERR_CONFIG: return "invalid configuration";
    case KILN_ERR_UNSUPPORTED: return "unsupported";
    case KILN_ERR_NOT_FOUND: return "not found";
    case KILN_ERR_INTERNAL: return "internal error";
    case KILN_ERR_BUSY: return "in use";
    case KILN_ERR_HUNG: return "hung";
    case KILN_ERR_ABORTED: return "aborted";
    }
    return "unknown status";
}

const char *kiln_error_message(void) { return error_msg; }

void kiln_error_clear(void) { error_msg[0] = '\0'; }

kiln_status kiln_error_setf(kiln_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_msg, sizeof error_msg, fmt, ap);
    va_end(ap);
    return s;
}

kiln_status kiln_error_wrapf(kiln_status s, const char *fmt, ...) {
    char prefix[512], old[sizeof error_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, error_msg, sizeof old);
    /* Both parts are cut to fit; a message longer than the buffer loses its tail. */
    size_t n = strlen(prefix);
    memcpy(error_msg, prefix, n + 1);
    if (old[0] && n + 2 < sizeof error_msg) {
        memcpy(error_msg + n, ": ", 3);
        size_t room = sizeof error_msg - n - 3;
        size_t m = strlen(old);
        if (m > room)
            m = room;
        memcpy(error_msg + n + 2, old, m);
        error_msg[n + 2 + m] = '\0';
    }
    return s;
}

void kiln__warn(FILE *log, const char *fmt, ...) {
    if (!log)
        return;
    char text[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    fflush(log); /* the console's lines so far come first */
    fprintf(stderr, "kiln: warning: %s\n", text);
    fflush(stderr);
    if (log != stdout && log != stderr) {
        fprintf(log, "kiln: warning: %s\n", text);
        fflush(log);
    }
}
