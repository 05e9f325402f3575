/* libFuzzer target for resuming from a checkpoint: the readers of state.json (its seal, the
 * run's identity, the file list and checksums, replicas, loader states, the loss scaler) and
 * of the optimizer files optim_rank<R>.bin (header, ranges, slabs, re-cut across ranks),
 * through kiln_trainer_create with resume_path, as kiln train --resume takes them.
 *
 * Initialisation trains a tiny run once and keeps its step-2 checkpoint's model files; each
 * input is a step folder's other files (ckpt_common.h), written beside them. For any input:
 * the trainer is created, having resumed, and takes a step, or creation fails with a message;
 * nothing crashes, leaks, or reads past what it was given. */
#define _GNU_SOURCE /* memmem */
#include <cjson/cJSON.h>
#include <xxhash.h>

#include "ckpt_common.h"
#include "train/trainer_ckpt.h"

#define REQUIRE(cond)                                                                              \
    do {                                                                                           \
        if (!(cond))                                                                               \
            __builtin_trap();                                                                      \
    } while (0)

static ckpt_run run;
static char case_dir[700];
static char *model, *model_replica;
static size_t model_len, model_replica_len;

static void cleanup(void) {
    ckpt_rmtree(run.dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    char dir[] = "ckpt-work-XXXXXX";
    REQUIRE(mkdtemp(dir) != NULL);
    char abs[512];
    REQUIRE(getcwd(abs, sizeof abs - sizeof dir - 2) != NULL);
    strcat(abs, "/");
    strcat(abs, dir);
    REQUIRE(ckpt_make_data(&run, abs) == 0);
    atexit(cleanup);
    REQUIRE(ckpt_train(&run) == 0);
    char path[800];
    snprintf(path, sizeof path, "%s/step_00000002/model.safetensors", run.ckpt);
    REQUIRE(ckpt_read(path, &model, &model_len) == 0);
    snprintf(path, sizeof path, "%s/step_00000002/model.replica.safetensors", run.ckpt);
    REQUIRE(ckpt_read(path, &model_replica, &model_replica_len) == 0);
    snprintf(case_dir, sizeof case_dir, "%s/case", run.dir);
    return 0;
}

/* Each entry of files and replicas that names a file in the folder: its size and hash. */
static void fix_sums(cJSON *j) {
    static const char *const lists[] = {"files", "replicas"};
    for (int l = 0; l < 2; l++) {
        cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(j, lists[l])) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
            if (!cJSON_IsString(name) || strchr(name->valuestring, '/'))
                continue;
            char path[1024];
            uint64_t size, hash;
            snprintf(path, sizeof path, "%s/%s", case_dir, name->valuestring);
            if (kiln__ckpt_hash_file(path, &size, &hash) != KILN_OK)
                continue;
            char hex[17];
            snprintf(hex, sizeof hex, "%016llx", (unsigned long long)hash);
            cJSON_DeleteItemFromObjectCaseSensitive(e, "size");
            cJSON_DeleteItemFromObjectCaseSensitive(e, "xxh3");
            cJSON_AddNumberToObject(e, "size", (double)size);
            cJSON_AddStringToObject(e, "xxh3", hex);
        }
    }
}

/* state.json from the input's text, its sums and its seal fixed as flags ask. */
static void write_state(const char *text, size_t len, int flags) {
    char *own = NULL;
    if (flags & CKPT_FIX_SUMS) {
        cJSON *j = cJSON_ParseWithLength(text, len);
        if (j) {
            fix_sums(j);
            own = cJSON_PrintUnformatted(j);
            cJSON_Delete(j);
        }
    }
    if (!own) {
        own = malloc(len + 1);
        REQUIRE(own != NULL);
        memcpy(own, text, len);
        own[len] = '\0';
    }
    size_t n = own == text ? len : strlen(own);
    if (own && (flags & CKPT_RESEAL)) {
        char *d = strstr(own, "\"state_xxh3\":\"");
        if (d && strlen(d) >= 14 + 17 && d[14 + 16] == '"') {
            memset(d + 14, '0', 16);
            kiln__ckpt_seal(own, n);
        }
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/state.json", case_dir);
    REQUIRE(ckpt_write(path, own, n) == 0);
    free(own);
}

/* The input's files into the case folder: section k from CKPT_SEP + its name to the next. */
static void write_case(const uint8_t *data, size_t size) {
    ckpt_rmtree(case_dir);
    REQUIRE(mkdir(case_dir, 0755) == 0);
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors", case_dir);
    REQUIRE(ckpt_write(path, model, model_len) == 0);
    snprintf(path, sizeof path, "%s/model.replica.safetensors", case_dir);
    REQUIRE(ckpt_write(path, model_replica, model_replica_len) == 0);
    if (size < 1)
        return;
    int flags = data[0];
    const char *p = (const char *)data + 1, *end = (const char *)data + size;
    const size_t sep = strlen(CKPT_SEP);
    const char *state = NULL;
    size_t state_len = 0;
    while (p < end) {
        const char *s = memmem(p, (size_t)(end - p), CKPT_SEP, sep);
        if (!s)
            break;
        const char *name = s + sep, *nl = memchr(name, '\n', (size_t)(end - name));
        if (!nl)
            break;
        const char *body = nl + 1, *next = memmem(body, (size_t)(end - body), CKPT_SEP, sep);
        size_t blen = (size_t)((next ? next : end) - body);
        for (int k = 0; k < CKPT_NFILES; k++) {
            if ((size_t)(nl - name) != strlen(ckpt_files[k]) ||
                memcmp(name, ckpt_files[k], (size_t)(nl - name)))
                continue;
            if (k == 0) {
                state = body;
                state_len = blen;
            } else {
                snprintf(path, sizeof path, "%s/%s", case_dir, ckpt_files[k]);
                REQUIRE(ckpt_write(path, body, blen) == 0);
            }
        }
        p = next ? next : end;
    }
    if (state) /* last: its sums are of the files written */
        write_state(state, state_len, flags);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    write_case(data, size);
    kiln_train_config c = ckpt_config(&run);
    c.checkpoint.dir = NULL; /* resuming writes nothing */
    c.checkpoint.resume_path = case_dir;
    kiln_trainer *t = NULL;
    kiln_status s = kiln_trainer_create(&t, &c);
    if (getenv("FUZZ_CKPT_VERBOSE")) /* each outcome, to see how deep the inputs go */
        fprintf(stderr, "resume: %d %s\n", s, s ? kiln_error_message() : "ok");
    if (s != KILN_OK) {
        REQUIRE(kiln_error_message()[0] != '\0');
        kiln_trainer_free(t);
        return 0;
    }
    int64_t done = kiln_trainer_steps_done(t);
    REQUIRE(done >= 1);
    if (done < c.steps) {
        kiln_step_info info;
        s = kiln_trainer_step(t, &info);
        REQUIRE(s == KILN_OK || kiln_error_message()[0] != '\0');
    }
    kiln_trainer_free(t);
    return 0;
}
