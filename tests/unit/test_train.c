/* The trainer end to end on a tiny model and a generated shard: the loss falls, the run
 * is bit-identical from the same seed, metrics are one JSON object per step, and a
 * vocabulary mismatch is refused. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kiln/checkpoint.h"
#include "kiln/loader.h"
#include "kiln/shard.h"
#include "kiln/train.h"
#include "test.h"

static char dir[256];
static char shard_path[300], val_shard_path[300], metrics_path[300], weights_path[300],
    weights2_path[300];

static void make_data(void) {
    test_tmpdir(dir, sizeof dir, "test_train");
    test_path(shard_path, sizeof shard_path, dir, "train_000.bin");
    test_path(val_shard_path, sizeof val_shard_path, dir, "val_000.bin");
    test_path(metrics_path, sizeof metrics_path, dir, "metrics.jsonl");
    test_path(weights_path, sizeof weights_path, dir, "w.safetensors");
    test_path(weights2_path, sizeof weights2_path, dir, "w2.safetensors");
    /* A learnable sequence: each id determines the next. Validation follows another rule,
     * so that evaluating the training data instead would show. */
    int32_t ids[4000];
    for (int i = 0; i < 4000; i++)
        ids[i] = (int32_t)((i * 7 + (i / 13)) % 50);
    CHECK_OK(kiln_shard_write(shard_path, 50, ids, 4000));
    for (int i = 0; i < 1000; i++)
        ids[i] = (int32_t)((i * 11 + 3 + (i / 7)) % 50);
    CHECK_OK(kiln_shard_write(val_shard_path, 50, ids, 1000));
}

static kiln_train_config tiny_run(void) {
    kiln_train_config c = kiln_train_config_default();
    c.model = (kiln_gpt_config){.max_seq_len = 16, .vocab_size = 0, .n_layer = 2, .n_head = 2,
                                .n_embd = 32};
    c.data.train_path = shard_path;
    c.data.B = 4;
    c.data.T = 16;
    c.steps = 40;
    c.lr.lr = 1e-2f;
    c.lr.min_lr = 1e-3f;
    c.lr.warmup_steps = 5;
    c.compute.peak_gflops = 100.0;
    c.seed = 5;
    return c;
}

static void test_loss_falls_and_runs_repeat(void) {
    kiln_train_config c = tiny_run();
    c.metrics.path = metrics_path;
    c.save.path = weights_path;
    kiln_train_result a, b;
    CHECK_OK(kiln_train(&c, &a));
    CHECK_INT_EQ(a.steps, 40);
    CHECK_NEAR(a.first_loss, log(50.0), 0.1);
    if (!(a.last_loss < 0.6 * a.first_loss))
        fprintf(stderr, "  loss %.4f -> %.4f\n", a.first_loss, a.last_loss);
    CHECK_TRUE(a.last_loss < 0.6 * a.first_loss);
    CHECK_TRUE(access(weights_path, F_OK) == 0);
    c.metrics.path = NULL;
    c.save.path = NULL;
    CHECK_OK(kiln_train(&c, &b));
    CHECK_TRUE(a.last_loss == b.last_loss); /* same bits */
    c.seed = 6;
    CHECK_OK(kiln_train(&c, &b));
    CHECK_TRUE(a.last_loss != b.last_loss);

    FILE *f = fopen(metrics_path, "r");
    CHECK_TRUE(f != NULL);
    if (!f)
        return;
    char line[1024];
    int lines = 0;
    while (fgets(line, sizeof line, f)) {
        cJSON *o = cJSON_Parse(line);
        CHECK_TRUE(o != NULL);
        const char *keys[] = {"step", "loss", "lr", "grad_norm", "ms", "tokens_per_s", "mfu"};
        for (size_t k = 0; o && k < sizeof keys / sizeof keys[0]; k++)
            CHECK_TRUE(cJSON_IsNumber(cJSON_GetObjectItem(o, keys[k])));
        if (o)
            CHECK_INT_EQ(cJSON_GetObjectItem(o, "step")->valueint, lines + 1);
        cJSON_Delete(o);
        lines++;
    }
    fclose(f);
    CHECK_INT_EQ(lines, 40);
}

static void test_every_optimizer_learns(void) {
    const kiln_optim_kind kinds[] = {KILN_OPTIM_ADAM, KILN_OPTIM_SGD, KILN_OPTIM_RMSPROP};
    const float lrs[] = {3e-3f, 0.3f, 1e-3f};
    for (int i = 0; i < 3; i++) {
        kiln_train_config c = tiny_run();
        c.optim.kind = kinds[i];
        c.lr.lr = lrs[i];
        c.lr.min_lr = lrs[i] / 10;
        c.data.grad_accum = 2;
        kiln_train_result r;
        CHECK_OK(kiln_train(&c, &r));
        if (!(r.last_loss < 0.8 * r.first_loss))
            fprintf(stderr, "  %s: %.4f -> %.4f\n", kiln_optim_kind_name(kinds[i]), r.first_loss,
                    r.last_loss);
        CHECK_TRUE(r.last_loss < 0.8 * r.first_loss);
    }
}

/* Mean loss of the weights at `path` over the first `batches` batches of `data` in file
 * order, computed here from the model's forward pass (not through kiln_evaluate). */
static double loss_of_weights(const char *path, const char *data, int64_t B, int64_t T,
                              int batches) {
    kiln_gpt_config mc = {0};
    kiln_gpt *m = NULL;
    kiln_loader *l = NULL;
    kiln_loader_config lc = {.path = data, .B = B, .T = T, .rank = 0, .world = 1, .shuffle = 0};
    int32_t in[4 * 16], tg[4 * 16];
    double sum = 0;
    CHECK_TRUE(B * T <= 4 * 16);
    CHECK_OK(kiln_gpt_config_from_safetensors(&mc, path));
    CHECK_OK(kiln_gpt_create(&m, &mc, B, T, NULL, NULL));
    CHECK_OK(m ? kiln_gpt_load_safetensors(m, path) : KILN_ERR_ARG);
    CHECK_OK(kiln_loader_open(&l, &lc));
    for (int i = 0; m && l && i < batches; i++) {
        float loss = NAN;
        CHECK_OK(kiln_loader_next(l, in, tg));
        CHECK_OK(kiln_gpt_forward(m, in, tg, B, T, &loss));
        sum += loss;
    }
    kiln_loader_close(l);
    kiln_gpt_free(m);
    return sum / batches;
}

/* The reported validation loss is the loss of the final weights on the first eval_batches
 * batches of the validation data: recomputed from the saved weights, it is the same number
 * (the same forward pass on the same batches; the mean is taken in double here and there). */
static void test_validation_and_mismatch(void) {
    kiln_train_config c = tiny_run();
    c.steps = 4;
    c.data.val_path = val_shard_path;
    c.data.eval_every = 2;
    c.data.eval_batches = 3;
    c.save.path = weights_path;
    kiln_train_result r;
    CHECK_OK(kiln_train(&c, &r));
    double want = loss_of_weights(weights_path, val_shard_path, c.data.B, c.data.T, 3);
    CHECK_NEAR(r.last_val_loss, want, 1e-6);
    /* and not the training data's, nor more or fewer batches */
    CHECK_TRUE(fabs(loss_of_weights(weights_path, shard_path, c.data.B, c.data.T, 3) - want) >
               1e-3);
    CHECK_TRUE(fabs(loss_of_weights(weights_path, val_shard_path, c.data.B, c.data.T, 4) - want) >
               1e-5);
    CHECK_TRUE(fabs(loss_of_weights(weights_path, val_shard_path, c.data.B, c.data.T, 2) - want) >
               1e-5);

    c = tiny_run();
    c.model.vocab_size = 60;
    CHECK_STATUS(kiln_train(&c, &r), KILN_ERR_CONFIG);
    CHECK_TRUE(strstr(kiln_error_message(), "vocabulary") != NULL);
    c = tiny_run();
    c.data.T = 17; /* beyond the context */
    CHECK_STATUS(kiln_train(&c, &r), KILN_ERR_CONFIG);
    c = tiny_run();
    c.data.train_path = "/nonexistent/kiln/shard.bin";
    CHECK_TRUE(kiln_train(&c, &r) != KILN_OK);
    CHECK_TRUE(strstr(kiln_error_message(), "/nonexistent/kiln/shard.bin") != NULL);
}

/* The trainer object: create and N steps is kiln_train, bit for bit (the losses, the saved
 * weights, the result), and each step's figures are filled. fp32 with accumulation and
 * evaluation every 2 steps; bf16 (saved from the master weights). The trainer keeps its own
 * copy of the config: the caller's struct changed after create changes nothing. */
static void check_trainer_is_kiln_train(kiln_dtype dt) {
    kiln_train_config c = tiny_run();
    c.steps = 6;
    c.compute.model_opt.dtype = dt;
    c.save.path = weights_path;
    if (dt == KILN_DTYPE_F32) {
        c.data.grad_accum = 2;
        c.data.val_path = val_shard_path;
        c.data.eval_every = 4;
        c.data.eval_batches = 2;
    }
    kiln_train_result want, got;
    CHECK_OK(kiln_train(&c, &want));
    CHECK_INT_EQ(want.steps, 6);

    kiln_train_config mine = c;
    mine.save.path = weights2_path;
    kiln_trainer *t = NULL;
    CHECK_OK(kiln_trainer_create(&t, &mine));
    if (!t)
        return;
    mine.steps = 1; /* the trainer's copy is what counts */
    mine.data.B = 1;
    mine.save.path = NULL;
    kiln_trainer_result(t, &got);
    CHECK_INT_EQ(got.steps, 0);
    CHECK_INT_EQ(kiln_trainer_steps_done(t), 0);
    CHECK_TRUE(kiln_trainer_model(t) != NULL);
    CHECK_TRUE(kiln_trainer_optim(t) != NULL);
    float first = NAN, last = NAN;
    for (int64_t k = 1; k <= c.steps; k++) {
        kiln_step_info info;
        memset(&info, 0xff, sizeof info);
        CHECK_OK(kiln_trainer_step(t, &info));
        CHECK_INT_EQ(kiln_trainer_steps_done(t), k);
        CHECK_INT_EQ(info.step, k);
        CHECK_INT_EQ(info.steps, c.steps);
        CHECK_TRUE(isfinite(info.loss) && info.loss > 0);
        CHECK_TRUE(info.lr > 0 && info.lr <= c.lr.lr);
        CHECK_TRUE(isfinite(info.grad_norm) && info.grad_norm > 0);
        CHECK_TRUE(info.ms > 0 && info.tokens_per_s > 0 && info.mfu > 0);
        CHECK_TRUE(info.rss > 0);
        CHECK_TRUE(info.loss_scale == 0 && info.skipped == 0 && info.skipped_total == 0);
        int evaluated = c.data.val_path && (k % c.data.eval_every == 0 || k == c.steps);
        CHECK_INT_EQ(!isnan(info.val_loss), evaluated);
        if (k == 1)
            first = info.loss;
        last = info.loss;
    }
    CHECK_STATUS(kiln_trainer_step(t, NULL), KILN_ERR_ARG); /* the run's steps are done */
    CHECK_TRUE(memcmp(&first, &want.first_loss, sizeof first) == 0);
    CHECK_TRUE(memcmp(&last, &want.last_loss, sizeof last) == 0);
    kiln_trainer_result(t, &got);
    CHECK_INT_EQ(got.steps, want.steps);
    CHECK_TRUE(memcmp(&got.first_loss, &want.first_loss, sizeof got.first_loss) == 0);
    CHECK_TRUE(memcmp(&got.last_loss, &want.last_loss, sizeof got.last_loss) == 0);
    CHECK_TRUE(memcmp(&got.last_val_loss, &want.last_val_loss, sizeof got.last_val_loss) == 0);
    CHECK_TRUE(got.peak_gflops == want.peak_gflops);
    CHECK_TRUE(got.mean_ms > 0 && got.tokens_per_s > 0 && got.mfu > 0);
    double vl = NAN;
    if (c.data.val_path) {
        CHECK_OK(kiln_trainer_evaluate(t, &vl));
        CHECK_TRUE((float)vl == want.last_val_loss); /* the same weights, the same batches */
    } else {
        CHECK_STATUS(kiln_trainer_evaluate(t, &vl), KILN_ERR_CONFIG);
    }
    /* the weights: the two saved files, byte for byte */
    size_t na = 0, nb = 0;
    void *a = test_slurp(weights_path, &na), *b = test_slurp(weights2_path, &nb);
    CHECK_TRUE(a && b && na == nb && na > 0 && memcmp(a, b, na) == 0);
    free(a);
    free(b);
    /* and the trainer's working weights are those of kiln_train's file */
    kiln_gpt *m = kiln_trainer_model(t), *ref = NULL;
    CHECK_OK(kiln_gpt_create(&ref, kiln_gpt_get_config(m), c.data.B, c.data.T, &c.compute.model_opt,
                             NULL));
    if (ref && kiln_gpt_load_safetensors(ref, weights_path) == KILN_OK)
        CHECK_TRUE(memcmp(kiln_gpt_params(ref), kiln_gpt_params(m),
                          (size_t)kiln_gpt_slab_len(m) * kiln_dtype_size(dt)) == 0);
    else
        CHECK_TRUE(0);
    kiln_gpt_free(ref);
    kiln_trainer_free(t);
    kiln_trainer_free(NULL);
}

static void test_trainer_object(void) {
    check_trainer_is_kiln_train(KILN_DTYPE_F32);
    check_trainer_is_kiln_train(KILN_DTYPE_BF16);
}

int main(void) {
    make_data();
    RUN_TEST(test_loss_falls_and_runs_repeat);
    RUN_TEST(test_every_optimizer_learns);
    RUN_TEST(test_validation_and_mismatch);
    RUN_TEST(test_trainer_object);
    test_rmtree(dir);
    TEST_MAIN_END();
}
