/* Writes the seed corpus of fuzz_ckpt into a folder: the step-2 checkpoint of the tiny run of
 * ckpt_common.h as the real writer left it, packed as fuzz_ckpt's inputs (ckpt_common.h):
 * with and without the replica, with the checksums to be fixed and as written; and the same
 * state cut in two as a run of two ranks would have written it (each rank's half of the
 * moments, one sequence each), which the resume re-cuts to its one rank. */
#include <cjson/cJSON.h>

#include "ckpt_common.h"
#include "train/trainer_ckpt.h"

static int pack(const char *out, const char *name, int flags, const char *folder, int nfiles) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", out, name);
    FILE *fp = fopen(path, "wb");
    if (!fp)
        return -1;
    fputc(flags, fp);
    for (int k = 0; k < nfiles; k++) {
        if (k == 2) /* one rank: no optim_rank1.bin */
            continue;
        char *text = NULL, src[1024];
        size_t len = 0;
        snprintf(src, sizeof src, "%s/%s", folder, ckpt_files[k]);
        if (ckpt_read(src, &text, &len) != 0) {
            fclose(fp);
            fprintf(stderr, "gen_ckpt_seeds: cannot read %s\n", src);
            return -1;
        }
        fprintf(fp, "%s%s\n", CKPT_SEP, ckpt_files[k]);
        fwrite(text, 1, len, fp);
        free(text);
    }
    return fclose(fp) == 0 ? 0 : -1;
}

/* The one-rank checkpoint in folder as two ranks': state.json's world and split, and each rank's
 * file with half the range. */
static int pack_two_ranks(const char *out, const char *folder) {
    char path[1024], *state = NULL, *opt = NULL, *text = NULL;
    size_t state_len = 0, opt_len = 0;
    snprintf(path, sizeof path, "%s/state.json", folder);
    if (ckpt_read(path, &state, &state_len) != 0)
        return -1;
    snprintf(path, sizeof path, "%s/optim_rank0.bin", folder);
    if (ckpt_read(path, &opt, &opt_len) != 0 || opt_len < KILN__CKPT_HEADER) {
        free(state);
        return -1;
    }
    cJSON *j = cJSON_Parse(state);
    kiln__ckpt_header h;
    memcpy(&h, opt, sizeof h);
    int rc = -1;
    if (!j || h.flags != (KILN__CKPT_M | KILN__CKPT_V) || h.lo != 0 || h.hi != h.n)
        goto done;
    cJSON_ReplaceItemInObject(j, "world", cJSON_CreateNumber(2));
    cJSON *run = cJSON_GetObjectItemCaseSensitive(j, "run");
    cJSON_ReplaceItemInObject(run, "batch", cJSON_CreateNumber(1));
    cJSON_ReplaceItemInObject(run, "micro_batches", cJSON_CreateNumber(2));
    cJSON *ranks = cJSON_GetObjectItemCaseSensitive(j, "ranks");
    cJSON_AddItemToArray(ranks, cJSON_Duplicate(cJSON_GetArrayItem(ranks, 0), 1));
    cJSON *files = cJSON_GetObjectItemCaseSensitive(j, "files");
    cJSON *second = cJSON_Duplicate(cJSON_GetArrayItem(files, 1), 1);
    cJSON_ReplaceItemInObject(second, "name", cJSON_CreateString("optim_rank1.bin"));
    cJSON_AddItemToArray(files, second);
    cJSON_DeleteItemFromObject(j, "replicas");
    text = cJSON_Print(j);
    snprintf(path, sizeof path, "%s/two_ranks", out);
    FILE *fp = fopen(path, "wb");
    if (!text || !fp)
        goto done;
    fputc(CKPT_FIX_SUMS | CKPT_RESEAL, fp);
    fprintf(fp, "%sstate.json\n%s", CKPT_SEP, text);
    const float *m = (const float *)(opt + sizeof h), *v = m + h.n;
    int64_t half = h.n / 2;
    for (int r = 0; r < 2; r++) {
        kiln__ckpt_header hr = h;
        hr.rank = (uint32_t)r;
        hr.world = 2;
        hr.lo = r ? half : 0;
        hr.hi = r ? h.n : half;
        hr.payload_bytes = (uint64_t)(hr.hi - hr.lo) * 2 * sizeof(float);
        fprintf(fp, "%soptim_rank%d.bin\n", CKPT_SEP, r);
        fwrite(&hr, sizeof hr, 1, fp);
        fwrite(m + hr.lo, sizeof(float), (size_t)(hr.hi - hr.lo), fp);
        fwrite(v + hr.lo, sizeof(float), (size_t)(hr.hi - hr.lo), fp);
    }
    rc = fclose(fp) == 0 ? 0 : -1;
done:
    free(text);
    cJSON_Delete(j);
    free(state);
    free(opt);
    return rc;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: gen_ckpt_seeds DIR\n");
        return 2;
    }
    char dir[] = "ckpt-seed-XXXXXX", abs[512];
    if (!mkdtemp(dir) || !getcwd(abs, sizeof abs - sizeof dir - 2))
        return 1;
    strcat(abs, "/");
    strcat(abs, dir);
    ckpt_run r;
    int rc = ckpt_make_data(&r, abs) || ckpt_train(&r);
    char folder[700];
    snprintf(folder, sizeof folder, "%s/step_00000002", r.ckpt);
    rc = rc || pack(argv[1], "fixed", CKPT_FIX_SUMS | CKPT_RESEAL, folder, 2) ||
         pack(argv[1], "fixed_replica", CKPT_FIX_SUMS | CKPT_RESEAL, folder, 4) ||
         pack(argv[1], "as_written", 0, folder, 4) || pack_two_ranks(argv[1], folder);
    ckpt_rmtree(abs);
    return rc;
}
