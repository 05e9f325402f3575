/* The trainer end to end on a tiny model and a generated shard: the loss falls, the run
 * is bit-identical from the same seed, metrics are one JSON object per step, and a
 * vocabulary mismatch is refused. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "kiln/checkpoint.h"
#include "kiln/loader.h"
#include "kiln/shard.h"
#include "kiln/train.h"
#include "test.h"

static char dir[256];
static char shard_path[300], val_shard_path[300], metrics_path[300], weights_path[300];

static void make_data(void) {
    test_tmpdir(dir, sizeof dir, "test_train");
    test_path(shard_path, sizeof shard_path, dir, "train_000.bin");
    test_path(val_shard_path, sizeof val_shard_path, dir, "val_000.bin");
    test_path(metrics_path, sizeof metrics_path, dir, "metrics.jsonl");
    test_path(weights_path, sizeof weights_path, dir, "w.safetensors");
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
    c.train_path = shard_path;
    c.B = 4;
    c.T = 16;
    c.steps = 40;
    c.lr.lr = 1e-2f;
    c.lr.min_lr = 1e-3f;
    c.lr.warmup_steps = 5;
    c.peak_gflops = 100.0;
    c.seed = 5;
    return c;
}

static void test_loss_falls_and_runs_repeat(void) {
    kiln_train_config c = tiny_run();
    c.metrics_path = metrics_path;
    c.save_path = weights_path;
    kiln_train_result a, b;
    CHECK_OK(kiln_train(&c, &a));
    CHECK_INT_EQ(a.steps, 40);
    CHECK_NEAR(a.first_loss, log(50.0), 0.1);
    if (!(a.last_loss < 0.6 * a.first_loss))
        fprintf(stderr, "  loss %.4f -> %.4f\n", a.first_loss, a.last_loss);
    CHECK_TRUE(a.last_loss < 0.6 * a.first_loss);
    CHECK_TRUE(access(weights_path, F_OK) == 0);
    c.metrics_path = NULL;
    c.save_path = NULL;
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
        c.grad_accum = 2;
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
    c.val_path = val_shard_path;
    c.eval_every = 2;
    c.eval_batches = 3;
    c.save_path = weights_path;
    kiln_train_result r;
    CHECK_OK(kiln_train(&c, &r));
    double want = loss_of_weights(weights_path, val_shard_path, c.B, c.T, 3);
    CHECK_NEAR(r.last_val_loss, want, 1e-6);
    /* and not the training data's, nor more or fewer batches */
    CHECK_TRUE(fabs(loss_of_weights(weights_path, shard_path, c.B, c.T, 3) - want) > 1e-3);
    CHECK_TRUE(fabs(loss_of_weights(weights_path, val_shard_path, c.B, c.T, 4) - want) > 1e-5);
    CHECK_TRUE(fabs(loss_of_weights(weights_path, val_shard_path, c.B, c.T, 2) - want) > 1e-5);

    c = tiny_run();
    c.model.vocab_size = 60;
    CHECK_STATUS(kiln_train(&c, &r), KILN_ERR_CONFIG);
    CHECK_TRUE(strstr(kiln_error_message(), "vocabulary") != NULL);
    c = tiny_run();
    c.T = 17; /* beyond the context */
    CHECK_STATUS(kiln_train(&c, &r), KILN_ERR_CONFIG);
    c = tiny_run();
    c.train_path = "/nonexistent/kiln/shard.bin";
    CHECK_TRUE(kiln_train(&c, &r) != KILN_OK);
    CHECK_TRUE(strstr(kiln_error_message(), "/nonexistent/kiln/shard.bin") != NULL);
}

int main(void) {
    make_data();
    RUN_TEST(test_loss_falls_and_runs_repeat);
    RUN_TEST(test_every_optimizer_learns);
    RUN_TEST(test_validation_and_mismatch);
    test_rmtree(dir);
    TEST_MAIN_END();
}
