/* kiln: status codes and error messages.
 *
 * Every call that can fail returns a kiln_status. kiln_status_str() names the code;
 * kiln_error_message() gives the detail of the last failure on the calling thread
 * (what was wrong and where: file, tensor, offset). */
#ifndef KILN_STATUS_H
#define KILN_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kiln_status {
    KILN_OK = 0,
    KILN_ERR_ARG = -1,         /* an argument the caller passed is invalid */
    KILN_ERR_NOMEM = -2,       /* memory could not be had */
    KILN_ERR_IO = -3,          /* a file could not be opened, read or written */
    KILN_ERR_FORMAT = -4,      /* a file's contents are malformed or truncated */
    KILN_ERR_CHECKSUM = -5,    /* stored and computed checksums differ */
    KILN_ERR_SHAPE = -6,       /* a tensor has the wrong shape */
    KILN_ERR_DTYPE = -7,       /* a tensor has the wrong element type */
    KILN_ERR_RANGE = -8,       /* a value is outside its allowed range (a token id, say) */
    KILN_ERR_CONFIG = -9,      /* a configuration that cannot work */
    KILN_ERR_UNSUPPORTED = -10,
    KILN_ERR_NOT_FOUND = -11,  /* a named thing (file, tensor, preset) does not exist */
    KILN_ERR_INTERNAL = -12,
    KILN_ERR_BUSY = -13,       /* held by another process (a checkpoint folder another run owns) */
    KILN_ERR_HUNG = -14,       /* a step made no progress past the watchdog's hang limit */
    KILN_ERR_ABORTED = -15,    /* the job was aborted (kiln_comm_abort) and the process goes on */
} kiln_status;

/* A short fixed name for the code, never NULL. */
const char *kiln_status_str(kiln_status s);

/* The detailed message of the last error set on this thread ("" when none). */
const char *kiln_error_message(void);

/* Forget the last message on this thread. */
void kiln_error_clear(void);

/* Record a detailed message for this thread and return s, so that
 *   return kiln_error_setf(KILN_ERR_FORMAT, "%s: header is %zu bytes", path, n);
 * both sets the message and fails. Callers of kiln (a progress callback, a command) use it
 * to report their own failures through the same channel. */
kiln_status kiln_error_setf(kiln_status s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prefix the current message with more context: "loading x.safetensors: <old message>". */
kiln_status kiln_error_wrapf(kiln_status s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#ifdef __cplusplus
}
#endif
#endif
