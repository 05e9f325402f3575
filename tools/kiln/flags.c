#include "flags.h"

#include <errno.h>
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
        printf(")\n");
    }
    printf("  %-24s %s\n", "--help, -h", "print this help");
    printf("(an on/off flag --[no-]NAME also takes --NAME=on or --NAME=off)\n");
}

static int set_value(const tool_flag *f, const char *v) {
    char *end = NULL;
    errno = 0;
    switch (f->type) {
    case TOOL_FLAG_INT: {
        long long x = strtoll(v, &end, 10);
        if (errno || end == v || *end) {
            fprintf(stderr, "kiln: --%s wants an integer, got '%s'\n", f->name, v);
            return TOOL_FLAGS_ERROR;
        }
        *(int64_t *)f->ptr = x;
        return TOOL_FLAGS_OK;
    }
    case TOOL_FLAG_FLOAT: {
        double x = strtod(v, &end);
        if (errno || end == v || *end) {
            fprintf(stderr, "kiln: --%s wants a number, got '%s'\n", f->name, v);
            return TOOL_FLAGS_ERROR;
        }
        *(double *)f->ptr = x;
        return TOOL_FLAGS_OK;
    }
    case TOOL_FLAG_STRING: *(const char **)f->ptr = v; return TOOL_FLAGS_OK;
    case TOOL_FLAG_BOOL:
        if (!strcmp(v, "1") || !strcmp(v, "true") || !strcmp(v, "on")) {
            *(int *)f->ptr = 1;
        } else if (!strcmp(v, "0") || !strcmp(v, "false") || !strcmp(v, "off")) {
            *(int *)f->ptr = 0;
        } else {
            fprintf(stderr, "kiln: --%s wants on or off, got '%s'\n", f->name, v);
            return TOOL_FLAGS_ERROR;
        }
        return TOOL_FLAGS_OK;
    }
    return TOOL_FLAGS_ERROR;
}

int tool_flags_parse(const tool_flag *flags, int nflags, int argc, char **argv, int *npos,
                     const char *usage) {
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
            fprintf(stderr, "kiln: unknown flag %s\n", a);
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
            fprintf(stderr, "kiln: unknown flag --%s (see --help)\n", name);
            return TOOL_FLAGS_ERROR;
        }
        if (f->type == TOOL_FLAG_BOOL && !eq) {
            *(int *)f->ptr = !negated;
            continue;
        }
        const char *v = eq ? eq + 1 : NULL;
        if (!v) {
            if (i + 1 >= argc) {
                fprintf(stderr, "kiln: --%s needs a value\n", name);
                return TOOL_FLAGS_ERROR;
            }
            v = argv[++i];
        }
        int rc = set_value(f, v);
        if (rc)
            return rc;
    }
    *npos = pos - 1; /* positional arguments are now argv[1..pos) */
    return TOOL_FLAGS_OK;
}
