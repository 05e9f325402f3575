/* Step ranges in flags: --skip-batches STEP:COUNT[,...] and --inject-spike STEP[:COUNT]. */
#include <stdio.h>
#include <stdlib.h>

#include "tool_common.h"

/* A number in 1..2^40 at *p, *p moved past it; 0 when there is none. */
static long long take_count(const char **p) {
    char *end = NULL;
    long long x = strtoll(*p, &end, 10);
    if (end == *p || x < 1 || x > (1LL << 40))
        return 0;
    *p = end;
    return x;
}

int tool_parse_step_count(const char *flag, const char *text, int64_t *step, int64_t *count) {
    const char *p = text;
    long long s = take_count(&p), c = 1;
    if (s && *p == ':') {
        p++;
        c = take_count(&p);
    }
    if (!s || !c || *p) {
        fprintf(stderr, "kiln: %s wants STEP or STEP:COUNT (numbers >= 1), e.g. 20:3; got '%s'\n",
                flag, text);
        return 2;
    }
    *step = s;
    *count = c;
    return 0;
}

int tool_parse_skips(const char *flag, const char *text, kiln_batch_skip *out, int cap, int *n) {
    const char *p = text;
    *n = 0;
    for (;;) {
        long long s = take_count(&p), c = 0;
        if (s && *p == ':') {
            p++;
            c = take_count(&p);
        }
        if (!s || !c || *n >= cap)
            break;
        out[*n].step = s;
        out[*n].count = c;
        (*n)++;
        if (*p == '\0')
            return 0;
        if (*p != ',')
            break;
        p++;
    }
    fprintf(stderr,
            "kiln: %s wants up to %d ranges STEP:COUNT (numbers >= 1) separated by commas, e.g. "
            "20:3,95:1; got '%s'\n",
            flag, cap, text);
    return 2;
}
