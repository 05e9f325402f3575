/* kiln: memory, random numbers and time. */
#ifndef KILN_CORE_H
#define KILN_CORE_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- memory ----
 * Every large buffer kiln owns comes from kiln_alloc: 64-byte aligned, zero-filled, and
 * counted, so that the planned peak printed before training is the peak that was taken. */
void *kiln_alloc(size_t bytes);   /* NULL when memory cannot be had (or past the limit) */
void kiln_free(void *p);          /* kiln_free(NULL) is safe */
size_t kiln_alloc_current(void);  /* bytes held now through kiln_alloc */
size_t kiln_alloc_peak(void);     /* most bytes held at once */
/* Make kiln_alloc fail once more than `bytes` would be held (0: no limit). For tests
 * and for users who want a hard memory ceiling. */
void kiln_alloc_set_limit(size_t bytes);
/* The limit kiln_alloc_set_limit set (0: none). */
size_t kiln_alloc_get_limit(void);
/* Allocate into *out or return KILN_ERR_NOMEM with a message naming `what`. */
kiln_status kiln_alloc_checked(void **out, size_t bytes, const char *what);
/* Bytes this process can still take, as far as it can tell: the least of the memory the
 * machine has available (MemAvailable + SwapFree), the room left under kiln_alloc's limit
 * and the room left in the address space under `ulimit -v`. *what (may be NULL) names
 * which one that is, for messages. SIZE_MAX when none is known. A plan is checked against
 * this before its memory is taken, so that it fails at once with both figures rather than
 * after minutes, or by the kernel killing the process. */
size_t kiln_memory_available(const char **what);

/* Peak resident set size of this process in bytes (0 if unknown). */
size_t kiln_peak_rss(void);
/* Resident set size of this process now, in bytes (0 if unknown). */
size_t kiln_current_rss(void);
/* Zero [p, p+bytes) and give its whole pages back to the system (madvise MADV_DONTNEED on
 * private anonymous memory: they read as zeros and take no memory until written again);
 * the partial pages at either end are zeroed in place. */
void kiln_memory_discard(void *p, size_t bytes);
/* Anonymous memory that takes no physical pages until written (mmap), zero-filled; NULL when
 * the system refuses. kiln_memory_unmap(p, bytes) gives it back. */
void *kiln_memory_map(size_t bytes);
void kiln_memory_unmap(void *p, size_t bytes);

/* ---- random numbers ----
 * xoshiro256** seeded through splitmix64; the whole state is plain data so that a
 * checkpoint can save it and a resumed run continues the same stream. */
typedef struct kiln_rng {
    uint64_t s[4];
} kiln_rng;

void kiln_rng_seed(kiln_rng *r, uint64_t seed);
uint64_t kiln_rng_u64(kiln_rng *r);
float kiln_rng_uniform(kiln_rng *r);       /* [0, 1) with 24 random bits */
float kiln_rng_normal(kiln_rng *r);        /* standard normal (Box-Muller) */
/* out[i] = scale x the i-th of n kiln_rng_normal draws, the same bits and the same generator
 * state after, with the transcendental functions computed on every OpenMP thread. */
void kiln_rng_normal_fill(kiln_rng *r, float *out, int64_t n, float scale);
uint64_t kiln_rng_below(kiln_rng *r, uint64_t n); /* uniform in [0, n), unbiased; n > 0 */

/* ---- files ---- */
/* KILN_OK when `path` does not exist or is a regular file (or a link to one), which kiln
 * may replace with a file it writes; else KILN_ERR_IO naming what it is. kiln never
 * replaces a folder, device, FIFO or socket with a file. A command calls this before a
 * long run, so that a save that could never succeed is refused up front. */
kiln_status kiln_file_check_replaceable(const char *path);

/* Open `path` for reading, only if it is a regular file (or a link to one): *fd (O_CLOEXEC)
 * and, when size is not NULL, its size in bytes. A FIFO, device, socket or folder is refused
 * with KILN_ERR_IO naming what it is (never opened: a FIFO would block and /dev/zero never
 * ends); a missing file is KILN_ERR_NOT_FOUND. */
kiln_status kiln_file_open_regular(const char *path, int *fd, uint64_t *size);

/* The whole of a regular file (kiln_file_open_regular's rules) of at most max_bytes bytes
 * (0: no bound but the machine's memory): *data is malloc'ed with a NUL after it (free with
 * free), *len its size. A larger file is KILN_ERR_RANGE naming both sizes. */
kiln_status kiln_file_read(const char *path, size_t max_bytes, char **data, size_t *len);

/* Write size bytes to `path` whole or not at all: they go to a temporary beside it, which is
 * flushed and renamed over it, so `path` is either its old bytes or all the new ones. A
 * folder, device, FIFO or socket at `path` is refused (kiln_file_check_replaceable). */
kiln_status kiln_file_write(const char *path, const void *data, size_t size);

/* ---- time ---- */
double kiln_time_ms(void); /* monotonic milliseconds */

#ifdef __cplusplus
}
#endif
#endif
