/* The reference cases' files (tests/ref/gpt_ref.py, gpt_ref_bf16.py): manifest.txt, one
 * line per scalar ("scalar KEY VALUE") or expected tensor ("tensor NAME OFFSET NUMEL", float64
 * elements of expected.f64), read the same way by test_ref_gpt.c and test_ref_bf16.c. */
#ifndef KILN_TESTS_REF_MANIFEST_H
#define KILN_TESTS_REF_MANIFEST_H

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"

#define MAX_ENTRIES 512

typedef struct entry {
    int is_tensor;
    char name[96];
    char value[64];
    int64_t offset, numel; /* float64 elements of expected.f64 */
} entry;

typedef struct ref_manifest {
    char dir[400];
    entry entries[MAX_ENTRIES];
    int n_entries;
    double *expected; /* expected.f64 */
    int64_t n_expected;
} ref_manifest;

/* Stop the current check at the first failed call: later comparisons would be noise. */
#define TRY(expr)                                                                                  \
    do {                                                                                           \
        int before_ = test_failures;                                                               \
        CHECK_OK(expr);                                                                            \
        if (test_failures != before_)                                                              \
            goto done;                                                                             \
    } while (0)

static const entry *find_entry(const ref_manifest *m, int is_tensor, const char *name) {
    for (int i = 0; i < m->n_entries; i++)
        if (m->entries[i].is_tensor == is_tensor && strcmp(m->entries[i].name, name) == 0)
            return &m->entries[i];
    return NULL;
}

static double scalar(const ref_manifest *m, const char *key, int *ok) {
    const entry *e = find_entry(m, 0, key);
    if (!e) {
        fprintf(stderr, "manifest.txt in %s has no scalar %s\n", m->dir, key);
        *ok = 0;
        return 0;
    }
    return strtod(e->value, NULL);
}

/* Expected values of a tensor, or NULL (with a message) when absent or out of range. */
static const double *expected(const ref_manifest *m, const char *name, int64_t numel) {
    const entry *e = find_entry(m, 1, name);
    if (!e || e->numel != numel || e->offset < 0 || e->offset + e->numel > m->n_expected) {
        fprintf(stderr, "expected tensor %s (%" PRId64 " values) is %s in %s\n", name, numel,
                e ? "of another size" : "missing", m->dir);
        return NULL;
    }
    return m->expected + e->offset;
}

/* m->dir/manifest.txt into m's entries; a missing file is reported with `hint` after it. */
static int read_manifest(ref_manifest *m, const char *hint) {
    char path[512], line[512];
    snprintf(path, sizeof path, "%s/manifest.txt", m->dir);
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "cannot open %s%s\n", path, hint);
        return -1;
    }
    m->n_entries = 0;
    while (fgets(line, sizeof line, f)) {
        char kind[16], a[96], b[64], c[64];
        int n = sscanf(line, "%15s %95s %63s %63s", kind, a, b, c);
        if (n < 3)
            continue;
        if (m->n_entries == MAX_ENTRIES) {
            fprintf(stderr, "%s: more than %d entries\n", path, MAX_ENTRIES);
            fclose(f);
            return -1;
        }
        entry *e = &m->entries[m->n_entries++];
        e->is_tensor = strcmp(kind, "tensor") == 0;
        snprintf(e->name, sizeof e->name, "%s", a);
        snprintf(e->value, sizeof e->value, "%s", b);
        e->offset = e->is_tensor ? strtoll(b, NULL, 10) : 0;
        e->numel = e->is_tensor && n == 4 ? strtoll(c, NULL, 10) : 0;
    }
    fclose(f);
    return 0;
}

#endif
