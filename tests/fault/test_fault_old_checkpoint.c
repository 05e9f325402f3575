/* A checkpoint written before state.json recorded its data's token checksums (no "data"
 * record; its own seal made good again) still resumes, with a note that the tokens could not
 * be compared; the same checkpoint with its record resumes without the note. Runs the kiln
 * binary of this build (KILN_BIN); skipped (77) without it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "kiln/shard.h"
#include "test.h"

static char dir[256];
static const char *kiln_bin;

static int kiln_run(const char *args, const char *log) {
    char cmd[4096];
    snprintf(
        cmd, sizeof cmd,
        "cd '%s' && '%s' train --layers 2 --heads 2 --embd 32 --context 32 --seq 16 --batch 2 "
        "--threads 1 --lr 1e-3 --data a.bin --save '' --checkpoint-dir ck --checkpoint-every 2 "
        "--checkpoint-sync %s >%s 2>&1",
        dir, kiln_bin, args, log);
    return system(cmd);
}

/* Drop the "data" object from the state.json text s (in place) and seal it again. */
static int drop_data_record(char *s) {
    char *k = strstr(s, "\"data\":");
    char *open = k ? strchr(k, '{') : NULL;
    if (!open)
        return 0;
    int depth = 0;
    char *e = open;
    for (; *e; e++) {
        depth += *e == '{';
        depth -= *e == '}';
        if (depth == 0)
            break;
    }
    if (!*e)
        return 0;
    e++;
    while (*e == ',' || *e == '\n' || *e == '\t' || *e == ' ')
        e++;
    memmove(k, e, strlen(e) + 1);
    char *d = strstr(s, "\"state_xxh3\":");
    d = d ? strchr(d + 13, '"') : NULL;
    if (!d)
        return 0;
    memcpy(d + 1, "0000000000000000", 16);
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH3_64bits(s, strlen(s)));
    memcpy(d + 1, hex, 16);
    return 1;
}

static int log_has(const char *log, const char *needle) {
    char p[512];
    test_path(p, sizeof p, dir, log);
    size_t n = 0;
    char *t = test_slurp(p, &n);
    int yes = t && strstr(t, needle);
    if (!yes && t)
        fprintf(stderr, "%s lacks \"%s\":\n%s\n", log, needle, t);
    free(t);
    return yes;
}

static int strstr_file(const char *log, const char *needle) {
    char p[512];
    test_path(p, sizeof p, dir, log);
    size_t n = 0;
    char *t = test_slurp(p, &n);
    int yes = t && strstr(t, needle);
    free(t);
    return yes;
}

static void test_old_checkpoint_resumes(void) {
    char p[512];
    test_path(p, sizeof p, dir, "a.bin");
    int32_t ids[4000];
    for (int i = 0; i < 4000; i++)
        ids[i] = (i * 37 + i / 7) % 256;
    CHECK_OK(kiln_shard_write(p, 256, ids, 4000));
    CHECK_INT_EQ(kiln_run("--steps 4", "first.log"), 0);
    CHECK_INT_EQ(kiln_run("--steps 6 --resume ck", "new.log"), 0);
    CHECK_TRUE(log_has("new.log", "resumed from ck/step_00000004"));
    CHECK_TRUE(!strstr_file("new.log", "could not be compared"));
    test_path(p, sizeof p, dir, "ck/step_00000006/state.json");
    size_t n = 0;
    char *s = test_slurp(p, &n);
    CHECK_TRUE(s && strstr(s, "\"content_xxh3\""));
    CHECK_TRUE(s && drop_data_record(s));
    CHECK_TRUE(s && !strstr(s, "\"content_xxh3\""));
    if (s)
        CHECK_INT_EQ(test_write_file(p, s, strlen(s)), 0);
    free(s);
    CHECK_INT_EQ(kiln_run("--steps 8 --resume ck", "old.log"), 0);
    CHECK_TRUE(log_has("old.log", "resumed from ck/step_00000006"));
    CHECK_TRUE(log_has("old.log", "could not be compared"));
}

int main(void) {
    kiln_bin = getenv("KILN_BIN");
    if (!kiln_bin || access(kiln_bin, X_OK) != 0) {
        printf("SKIP: no kiln binary (KILN_BIN)\n");
        return 77;
    }
    test_tmpdir(dir, sizeof dir, "fault_old_ckpt");
    RUN_TEST(test_old_checkpoint_resumes);
    test_rmtree(dir);
    TEST_MAIN_END();
}
