#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "core/error.h"
#include "kiln/core.h"

/* Each block carries a 64-byte header holding its size, so kiln_free can count it. */
#define KILN_ALLOC_ALIGN 64

static _Atomic size_t alloc_current;
static _Atomic size_t alloc_peak;
static _Atomic size_t alloc_limit;

void *kiln_alloc(size_t bytes) {
    if (bytes > SIZE_MAX - 2 * KILN_ALLOC_ALIGN)
        return NULL;
    size_t limit = atomic_load(&alloc_limit);
    size_t now = atomic_fetch_add(&alloc_current, bytes) + bytes;
    if (limit && now > limit) {
        atomic_fetch_sub(&alloc_current, bytes);
        return NULL;
    }
    size_t total = (bytes + KILN_ALLOC_ALIGN - 1) / KILN_ALLOC_ALIGN * KILN_ALLOC_ALIGN;
    unsigned char *p = aligned_alloc(KILN_ALLOC_ALIGN, total + KILN_ALLOC_ALIGN);
    if (!p) {
        atomic_fetch_sub(&alloc_current, bytes);
        return NULL;
    }
    memset(p + KILN_ALLOC_ALIGN, 0, bytes);
    memcpy(p, &bytes, sizeof bytes);
    size_t peak = atomic_load(&alloc_peak);
    while (now > peak && !atomic_compare_exchange_weak(&alloc_peak, &peak, now)) {
    }
    return p + KILN_ALLOC_ALIGN;
}

void kiln_free(void *ptr) {
    if (!ptr)
        return;
    unsigned char *p = (unsigned char *)ptr - KILN_ALLOC_ALIGN;
    size_t bytes;
    memcpy(&bytes, p, sizeof bytes);
    atomic_fetch_sub(&alloc_current, bytes);
    free(p);
}

size_t kiln_alloc_current(void) { return atomic_load(&alloc_current); }
size_t kiln_alloc_peak(void) { return atomic_load(&alloc_peak); }
void kiln_alloc_set_limit(size_t bytes) { atomic_store(&alloc_limit, bytes); }
size_t kiln_alloc_get_limit(void) { return atomic_load(&alloc_limit); }

/* MemAvailable + SwapFree from /proc/meminfo, in bytes (0 when unknown). */
static size_t memory_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return 0;
    char line[256];
    unsigned long long kb, total = 0;
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1 ||
            sscanf(line, "SwapFree: %llu kB", &kb) == 1) {
            total += kb;
            found++;
        }
    }
    fclose(f);
    return found ? (size_t)(total * 1024ULL) : 0;
}

kiln_status kiln_alloc_checked(void **out, size_t bytes, const char *what) {
    *out = NULL;
    /* kiln_alloc touches every page it hands out; past the memory the machine has, that
     * would end in the kernel killing the process instead of an error. Large blocks are
     * checked against it first. */
    if (bytes >= ((size_t)64 << 20)) {
        size_t avail = memory_available();
        if (avail && bytes > avail)
            return kiln_error_setf(KILN_ERR_NOMEM,
                                   "cannot allocate %.1f MiB for %s: the machine has %.1f MiB of "
                                   "memory available",
                                   (double)bytes / (1024.0 * 1024.0), what,
                                   (double)avail / (1024.0 * 1024.0));
    }
    *out = kiln_alloc(bytes);
    if (!*out)
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate %zu bytes (%.1f MiB) for %s", bytes,
                               (double)bytes / (1024.0 * 1024.0), what);
    return KILN_OK;
}

/* Bytes of address space this process has mapped (0 when unknown). */
static size_t address_space_used(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long pages = 0;
    if (f) {
        if (fscanf(f, "%lu", &pages) != 1)
            pages = 0;
        fclose(f);
    }
    long page = sysconf(_SC_PAGESIZE);
    return (size_t)pages * (size_t)(page > 0 ? page : 4096);
}

size_t kiln_memory_available(const char **what) {
    size_t best = SIZE_MAX;
    const char *name = "unknown";
    size_t avail = memory_available();
    if (avail) {
        best = avail;
        name = "the machine's available memory (MemAvailable + SwapFree)";
    }
    size_t limit = kiln_alloc_get_limit(), now = kiln_alloc_current();
    if (limit && (limit > now ? limit - now : 0) < best) {
        best = limit > now ? limit - now : 0;
        name = "the room left under kiln's allocation limit";
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        size_t used = address_space_used(), cap = (size_t)rl.rlim_cur;
        size_t room = cap > used ? cap - used : 0;
        if (room < best) {
            best = room;
            name = "the address space left under ulimit -v";
        }
    }
    if (what)
        *what = name;
    return best;
}

size_t kiln_current_rss(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long size = 0, resident = 0;
    if (f) {
        if (fscanf(f, "%lu %lu", &size, &resident) != 2)
            resident = 0;
        fclose(f);
    }
    long page = sysconf(_SC_PAGESIZE);
    return (size_t)resident * (size_t)(page > 0 ? page : 4096);
}

size_t kiln_peak_rss(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0;
    return (size_t)ru.ru_maxrss * 1024; /* Linux reports kilobytes */
}

void kiln_memory_discard(void *p, size_t bytes) {
    if (!p || !bytes)
        return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)p, b = a + bytes;
    uintptr_t a_up = (a + page - 1) / page * page, b_down = b / page * page;
    if (a_up >= b_down) { /* no whole page inside */
        memset(p, 0, bytes);
        return;
    }
    memset(p, 0, a_up - a);
    memset((void *)b_down, 0, b - b_down);
    if (madvise((void *)a_up, b_down - a_up, MADV_DONTNEED) != 0)
        memset((void *)a_up, 0, b_down - a_up); /* not anonymous memory: zero it at least */
}

void *kiln_memory_map(size_t bytes) {
    void *p = mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void kiln_memory_unmap(void *p, size_t bytes) {
    if (p)
        munmap(p, bytes ? bytes : 1);
}
