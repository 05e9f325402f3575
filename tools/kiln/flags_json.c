/* Configuration files: a command's flags as the keys of a JSON object (flags.h). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "flags.h"
#include "kiln/core.h"
#include "kiln/status.h"

/* Integers a JSON number (a double) holds exactly. */
#define JSON_INT_MAX 9007199254740992.0 /* 2^53 */

static const char *type_name(tool_flag_type t) {
    switch (t) {
    case TOOL_FLAG_INT: return "an integer";
    case TOOL_FLAG_FLOAT: return "a number";
    case TOOL_FLAG_STRING: return "a string";
    case TOOL_FLAG_BOOL: return "true or false";
    }
    return "?";
}

/* Edits (insert, delete, substitute) from a to b, both under 128 characters. */
static int edit_distance(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    if (n >= 128 || m >= 128)
        return 1 << 20;
    int row[129];
    for (size_t j = 0; j <= m; j++)
        row[j] = (int)j;
    for (size_t i = 1; i <= n; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= m; j++) {
            int up = row[j];
            int best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[m];
}

static const tool_flag *find_flag(const tool_flag *flags, int nflags, const char *name) {
    for (int k = 0; k < nflags; k++)
        if (!strcmp(flags[k].name, name))
            return &flags[k];
    return NULL;
}

/* "unknown key", with the flag it most likely meant. */
static int unknown_key(const tool_flag *flags, int nflags, const char *where, const char *key) {
    const char *bare = key;
    while (*bare == '-')
        bare++;
    const tool_flag *f = find_flag(flags, nflags, bare);
    if (f) {
        fprintf(stderr, "%s: unknown key \"%s\": write the flag's name without dashes, \"%s\"\n",
                where, key, f->name);
        return TOOL_FLAGS_ERROR;
    }
    if (!strncmp(bare, "no-", 3) && (f = find_flag(flags, nflags, bare + 3)) &&
        f->type == TOOL_FLAG_BOOL) {
        fprintf(stderr, "%s: unknown key \"%s\": write \"%s\": false\n", where, key, f->name);
        return TOOL_FLAGS_ERROR;
    }
    int best = 1 << 20;
    for (int k = 0; k < nflags; k++) {
        int d = edit_distance(bare, flags[k].name);
        if (d < best) {
            best = d;
            f = &flags[k];
        }
    }
    if (f && best <= 2 && (size_t)best < strlen(f->name))
        fprintf(stderr, "%s: unknown key \"%s\" (did you mean \"%s\"?)\n", where, key, f->name);
    else
        fprintf(stderr, "%s: unknown key \"%s\" (the keys are the flags of --help)\n", where, key);
    return TOOL_FLAGS_ERROR;
}

/* The line a byte offset of text falls on, from 1. */
static int line_of(const char *text, size_t at) {
    int line = 1;
    for (size_t i = 0; i < at && text[i]; i++)
        line += text[i] == '\n';
    return line;
}

/* One key's value into its flag. */
void tool_owned_free(tool_owned *o) {
    for (int i = 0; i < o->n; i++)
        free(o->s[i]);
    free(o->s);
    o->s = NULL;
    o->n = 0;
}

static int load_one(const tool_flag *f, const cJSON *v, const char *where, tool_owned *owned) {
    char text[64];
    int ok = 0;
    switch (f->type) {
    case TOOL_FLAG_INT:
        ok = cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble);
        if (ok && fabs(v->valuedouble) > JSON_INT_MAX) {
            fprintf(stderr,
                    "%s: \"%s\": %.17g is beyond the integers a JSON number holds "
                    "exactly (2^53): give it on the command line\n",
                    where, f->name, v->valuedouble);
            return TOOL_FLAGS_ERROR;
        }
        if (ok)
            snprintf(text, sizeof text, "%lld", (long long)v->valuedouble);
        break;
    case TOOL_FLAG_FLOAT:
        ok = cJSON_IsNumber(v);
        if (ok) /* 17 digits: the same double again */
            snprintf(text, sizeof text, "%.17g", v->valuedouble);
        break;
    case TOOL_FLAG_STRING: ok = cJSON_IsString(v); break;
    case TOOL_FLAG_BOOL:
        ok = cJSON_IsBool(v);
        snprintf(text, sizeof text, "%s", cJSON_IsTrue(v) ? "on" : "off");
        break;
    }
    if (!ok) {
        fprintf(stderr, "%s: \"%s\" wants %s\n", where, f->name, type_name(f->type));
        return TOOL_FLAGS_ERROR;
    }
    if (f->given)
        *f->given = 1;
    if (f->type != TOOL_FLAG_STRING)
        return tool_flag_set(where, f, text); /* the command line's checks and messages */
    char **grown = realloc(owned->s, (size_t)(owned->n + 1) * sizeof *grown);
    char *copy = grown ? strdup(v->valuestring) : NULL;
    if (grown)
        owned->s = grown;
    if (!copy) {
        fprintf(stderr, "%s: out of memory\n", where);
        return TOOL_FLAGS_ERROR;
    }
    owned->s[owned->n++] = copy;
    *(const char **)f->ptr = copy;
    return TOOL_FLAGS_OK;
}

int tool_flags_load_json(const tool_flag *flags, int nflags, const char *path, const char *cmd,
                         tool_owned *owned) {
    char where[4200];
    snprintf(where, sizeof where, "%s: %s", cmd, path);
    size_t len = 0;
    char *text = NULL; /* a regular file of at most 64 MiB, NUL after it */
    if (kiln_file_read(path, (size_t)64 << 20, &text, &len) != KILN_OK) {
        fprintf(stderr, "%s: cannot read the configuration: %s\n", where, kiln_error_message());
        return TOOL_FLAGS_ERROR;
    }
    const char *end = NULL;
    /* the NUL counted: cJSON checks for it after the value (no trailing garbage) */
    cJSON *root = cJSON_ParseWithLengthOpts(text, len + 1, &end, 1);
    int rc = TOOL_FLAGS_ERROR;
    if (!root) {
        size_t at = end && end >= text ? (size_t)(end - text) : len;
        if (strspn(text, " \t\r\n") == len)
            fprintf(stderr, "%s: the file is empty: a configuration is one JSON object\n", where);
        else if (at >= len)
            fprintf(stderr, "%s: not valid JSON: the file ends inside its object (cut short?)\n",
                    where);
        else
            fprintf(stderr, "%s: not valid JSON at line %d\n", where, line_of(text, at));
        goto done;
    }
    if (!cJSON_IsObject(root)) {
        fprintf(stderr,
                "%s: the configuration must be one JSON object of flags, e.g. "
                "{\"steps\": 100, \"lr\": 0.001}\n",
                where);
        goto done;
    }
    for (const cJSON *a = root->child; a; a = a->next)
        for (const cJSON *b = a->next; b; b = b->next)
            if (!strcmp(a->string, b->string)) {
                fprintf(stderr, "%s: key \"%s\" is given twice\n", where, a->string);
                goto done;
            }
    for (const cJSON *v = root->child; v; v = v->next) {
        const tool_flag *f = find_flag(flags, nflags, v->string);
        if (!f || !strcmp(v->string, "config")) { /* one file: no nesting */
            if (f)
                fprintf(stderr, "%s: unknown key \"config\": a configuration cannot name another\n",
                        where);
            else
                unknown_key(flags, nflags, where, v->string);
            goto done;
        }
        if (load_one(f, v, where, owned))
            goto done;
    }
    rc = TOOL_FLAGS_OK;
done:
    cJSON_Delete(root);
    free(text);
    return rc;
}

const char *tool_flags_find(int argc, char **argv, const char *name) {
    const char *found = NULL;
    size_t n = strlen(name);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--"))
            break;
        if (strncmp(a, "--", 2) || strncmp(a + 2, name, n))
            continue;
        if (a[2 + n] == '=')
            found = a + 3 + n;
        else if (a[2 + n] == '\0' && i + 1 < argc)
            found = argv[++i];
    }
    return found;
}

static int named(const char *const *list, const char *name) {
    for (; list && *list; list++)
        if (!strcmp(*list, name))
            return 1;
    return 0;
}

/* A path as the current folder sees it from anywhere (malloc'd): relative ones joined to it. */
static char *absolute(const char *p) {
    char cwd[4096];
    if (p[0] == '/' || !p[0] || !getcwd(cwd, sizeof cwd))
        return strdup(p);
    while (p[0] == '.' && p[1] == '/')
        p += 2;
    size_t n = strlen(cwd) + strlen(p) + 2;
    char *out = malloc(n);
    if (out)
        snprintf(out, n, "%s/%s", cwd, p);
    return out;
}

static cJSON *json_value(const tool_flag *f, int path) {
    char text[32];
    switch (f->type) {
    case TOOL_FLAG_INT: /* exact, where a double printed would round past 2^53 */
        snprintf(text, sizeof text, "%lld", (long long)*(int64_t *)f->ptr);
        return cJSON_CreateRaw(text);
    case TOOL_FLAG_FLOAT: return cJSON_CreateNumber(*(double *)f->ptr); /* round-trips */
    case TOOL_FLAG_BOOL: return cJSON_CreateBool(*(int *)f->ptr);
    case TOOL_FLAG_STRING: {
        const char *s = *(const char **)f->ptr;
        if (!path)
            return cJSON_CreateString(s);
        char *a = absolute(s);
        cJSON *v = a ? cJSON_CreateString(a) : NULL;
        free(a);
        return v;
    }
    }
    return NULL;
}

char *tool_flags_to_json(const tool_flag *flags, int nflags, const char *const *skip,
                         const char *const *paths) {
    cJSON *o = cJSON_CreateObject();
    for (int k = 0; o && k < nflags; k++) {
        const tool_flag *f = &flags[k];
        /* a flag that tells given from default (--warmup) is written only when given */
        if (named(skip, f->name) || (f->type == TOOL_FLAG_STRING && !*(const char **)f->ptr) ||
            (f->given && !*f->given))
            continue;
        cJSON *v = json_value(f, named(paths, f->name));
        if (!v || !cJSON_AddItemToObject(o, f->name, v)) {
            cJSON_Delete(v);
            cJSON_Delete(o);
            return NULL;
        }
    }
    char *text = o ? cJSON_Print(o) : NULL;
    cJSON_Delete(o);
    return text;
}
