/* The fuzzers of readers that take a path: the input as a file, without touching the disk.
 * An anonymous memory file (memfd) is a regular file to stat and mmap, reached by the name
 * /proc/self/fd/<n>; each input gets a fresh one, closed after. */
#ifndef KILN_FUZZ_FILE_H
#define KILN_FUZZ_FILE_H

#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define REQUIRE(cond)                                                                              \
    do {                                                                                           \
        if (!(cond))                                                                               \
            __builtin_trap();                                                                      \
    } while (0)

typedef struct fuzz_file {
    int fd;
    char path[64];
} fuzz_file;

static void fuzz_file_open(fuzz_file *f, const uint8_t *data, size_t size) {
    f->fd = memfd_create("fuzz-input", MFD_CLOEXEC);
    REQUIRE(f->fd >= 0);
    for (size_t done = 0; done < size;) {
        ssize_t k = write(f->fd, data + done, size - done);
        REQUIRE(k > 0);
        done += (size_t)k;
    }
    snprintf(f->path, sizeof f->path, "/proc/self/fd/%d", f->fd);
}

static void fuzz_file_close(fuzz_file *f) {
    close(f->fd);
    f->fd = -1;
}

#endif
