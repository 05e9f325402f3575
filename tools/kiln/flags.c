#include "flags.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/status.h"

void tool_report(const char *what, int status) {
    const char *msg = kiln_error_message();
    fprintf(stderr, "kiln: %s: %s%s%s\n", what, kiln_status_str((kiln_status)status),
            msg[0] ? ": " : "", msg);
}

static void print_default(const tool_flag *f) {
    switch (f->type) {
    case TOOL_FLAG_INT: printf("%lld", (long long)*(int64_t *)f->ptr); break;
    case TOOL_FLAG_FLOAT: printf("%g", *(double *)f->ptr); break;
    case TOOL_FLAG_STRING: {
        const char *s = *(const char **)f->ptr;
        printf("%s", s ? s : "(none)");
        break;
    }
    case TOOL_FLAG_BOOL: printf("%s", *(int *)f->ptr ? "on" : "off"); break;
    }
}

/* The command a usage names: "usage: kiln compress prune --weights ..." gives "kiln
 * compress prune". */
static void command_name(const char *usage, char *out, size_t cap) {
    const char *p = usage && !strncmp(usage, "usage: ", 7) ? usage + 7 : "kiln";
    size_t n = 0;
    for (const char *q = p; *q;) {
        const char *w = q;
        while (islower((unsigned char)*q))
            q++;
        if (q == w || (*q && *q != ' ' && *q != '\n'))
            break;
        n = (size_t)(q - p);
        if (*q != ' ')
            break;
        q++;
    }
    snprintf(out, cap, "%.*s", (int)(n ? n : 4), n ? p : "kiln");
}

static int range_number(char *out, size_t cap, double x, int integer) {
    return integer ? snprintf(out, cap, "%lld", (long long)x) : snprintf(out, cap, "%g", x);
}

/* What r asks for, as in "must be >= 0", "must be 0..4096", "must be in [0, 1)". */
static void range_text(char *out, size_t cap, tool_flag_range r, int integer) {
    char lo[32], hi[32];
    range_number(lo, sizeof lo, r.lo, integer);
    range_number(hi, sizeof hi, r.hi, integer);
    if (isinf(r.hi))
        snprintf(out, cap, "%s%s %s", r.hi_open ? "a finite number " : "",
                 r.lo_open ? ">" : ">=", lo);
    else if (integer && !r.lo_open && !r.hi_open)
        snprintf(out, cap, "%s..%s", lo, hi);
    else
        snprintf(out, cap, "in %c%s, %s%c", r.lo_open ? '(' : '[', lo, hi, r.hi_open ? ')' : ']');
}

static int in_range(double v, tool_flag_range r) {
    if (!r.set)
        return 1;
    return (r.lo_open ? v > r.lo : v >= r.lo) && (r.hi_open ? v < r.hi : v <= r.hi);
}

int tool_flag_refuse(const char *cmd, const char *flag, const char *value, const char *limit) {
    fprintf(stderr, "%s: --%s %s: must be %s\n", cmd, flag, value, limit);
    return TOOL_FLAGS_ERROR;
}

int tool_flag_check(const char *cmd, const char *flag, double v, int integer, tool_flag_range r) {
    if (in_range(v, r))
        return 0;
    char value[32], limit[96];
    range_number(value, sizeof value, v, integer);
    range_text(limit, sizeof limit, r, integer);
    return tool_flag_refuse(cmd, flag, value, limit);
}

void tool_flags_help(const tool_flag *flags, int nflags, const char *usage) {
    printf("%s\n\nflags:\n", usage);
    for (int i = 0; i < nflags; i++) {
        const tool_flag *f = &flags[i];
        const char *arg = f->type == TOOL_FLAG_INT     ? " N"
                          : f->type == TOOL_FLAG_FLOAT ? " X"
                          : f->type == TOOL_FLAG_STRING ? " S"
                                                        : "";
        char left[96];
        if (f->type == TOOL_FLAG_BOOL) /* both spellings: --name turns it on, --no-name off */
            snprintf(left, sizeof left, "--[no-]%s", f->name);
        else
            snprintf(left, sizeof left, "--%s%s", f->name, arg);
        printf("  %-24s %s (default: ", left, f->help);
        print_default(f);
        if (f->range.set) {
            char limit[96];
            range_text(limit, sizeof limit, f->range, f->type == TOOL_FLAG_INT);
            printf("; %s", limit);
        }
        printf(")\n");
    }
    printf("  %-24s %s\n", "--help, -h", "print this help");
    printf("(an on/off flag --[no-]NAME also takes --NAME=on or --NAME=off)\n");
}

/* A parsed number outside the flag's range: named with the text given. */
static int out_of_range(const char *cmd, const tool_flag *f, double x, const char *v) {
    if (in_range(x, f->range))
        return TOOL_FLAGS_OK;
    char limit[96];
    range_text(limit, sizeof limit, f->range, f->type == TOOL_FLAG_INT);
    return tool_flag_refuse(cmd, f->name, v, limit);
}

int tool_flag_set(const char *cmd, const tool_flag *f, const char *v) {
    char *end = NULL;
    errno = 0;
    switch (f->type) {
    case TOOL_FLAG_INT: {
        long long x = strtoll(v, &end, 10);
        if (errno || end == v || *end) {
            fprintf(stderr, "%s: --%s wants an integer, got '%s'\n", cmd, f->name, v);
            return TOOL_FLAGS_ERROR;
        }
        *(int64_t *)f->ptr = x;
        return out_of_range(cmd, f, (double)x, v);
    }
    case TOOL_FLAG_FLOAT: {
        double x = strtod(v, &end);
        if (errno || end == v || *end) {
            fprintf(stderr, "%s: --%s wants a number, got '%s'\n", cmd, f->name, v);
            return TOOL_FLAGS_ERROR;
        }
        *(double *)f->ptr = x;
        return out_of_range(cmd, f, x, v);
    }
    case TOOL_FLAG_STRING: *(const char **)f->ptr = v; return TOOL_FLAGS_OK;
    case TOOL_FLAG_BOOL:
        if (!strcmp(v, "1") || !strcmp(v, "true") || !strcmp(v, "on")) {
            *(int *)f->ptr = 1;
        } else if (!strcmp(v, "0") || !strcmp(v, "false") || !strcmp(v, "off")) {
            *(int *)f->ptr = 0;
        } else {
            fprintf(stderr, "%s: --%s wants on or off, got '%s'\n", cmd, f->name, v);
            return TOOL_FLAGS_ERROR;
        }
        return TOOL_FLAGS_OK;
    }
    return TOOL_FLAGS_ERROR;
}

int tool_flags_parse(const tool_flag *flags, int nflags, int argc, char **argv, int *npos,
                     const char *usage) {
    char cmd[64];
    command_name(usage, cmd, sizeof cmd);
    int pos = 1;
    for (int i = 1; i < argc; i++) {
        char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            tool_flags_help(flags, nflags, usage);
            return TOOL_FLAGS_HELP;
        }
        if (!strcmp(a, "--")) { /* the rest is positional */
            for (i++; i < argc; i++)
                argv[pos++] = argv[i];
            break;
        }
        if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
            argv[pos++] = a;
            continue;
        }
        char name[128];
        const char *eq = strchr(a + 2, '=');
        size_t len = eq ? (size_t)(eq - (a + 2)) : strlen(a + 2);
        if (len >= sizeof name) {
            fprintf(stderr, "%s: unknown flag %s\n", cmd, a);
            return TOOL_FLAGS_ERROR;
        }
        memcpy(name, a + 2, len);
        name[len] = '\0';
        const tool_flag *f = NULL;
        int negated = 0;
        for (int k = 0; k < nflags; k++)
            if (!strcmp(flags[k].name, name))
                f = &flags[k];
        if (!f && !strncmp(name, "no-", 3))
            for (int k = 0; k < nflags; k++)
                if (flags[k].type == TOOL_FLAG_BOOL && !strcmp(flags[k].name, name + 3)) {
                    f = &flags[k];
                    negated = 1;
                }
        if (!f) {
            fprintf(stderr, "%s: unknown flag --%s (see --help)\n", cmd, name);
            return TOOL_FLAGS_ERROR;
        }
        if (f->given)
            *f->given = 1;
        if (f->type == TOOL_FLAG_BOOL && !eq) {
            *(int *)f->ptr = !negated;
            continue;
        }
        const char *v = eq ? eq + 1 : NULL;
        if (!v) {
            if (i + 1 >= argc) {
                fprintf(stderr, "%s: --%s needs a value\n", cmd, name);
                return TOOL_FLAGS_ERROR;
            }
            v = argv[++i];
        }
        int rc = tool_flag_set(cmd, f, v);
        if (rc)
            return rc;
    }
    *npos = pos - 1; /* positional arguments are now argv[1..pos) */
    return TOOL_FLAGS_OK;
}
