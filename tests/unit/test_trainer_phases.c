/* The trainer's registry of features (src/train/trainer_features.c): every feature once, each
 * with a name and at least one point it attaches to, in the order whose reasons the registry
 * gives (an order that breaks one of them fails here before a run shows it). */
#include <string.h>

#include "test.h"
#include "train/trainer_feature.h"

static int position(const kiln__feature *f) {
    for (int i = 0; kiln__trainer_features[i]; i++)
        if (kiln__trainer_features[i] == f)
            return i;
    return -1;
}

static int attaches(const kiln__feature *f) {
    return f->start || f->init || f->ready || f->step_begin || f->before_forward || f->after_sync ||
           f->judge || f->after_update || f->step_sync || f->step_figures || f->step_report ||
           f->step_end || f->before_eval || f->save_now;
}

static void test_every_feature_once(void) {
    const kiln__feature *all[] = {
        &kiln__feature_dist,    &kiln__feature_balance,    &kiln__feature_watchdog,
        &kiln__feature_guard,   &kiln__feature_save,       &kiln__feature_checkpoint,
        &kiln__feature_prune,   &kiln__feature_distill,    &kiln__feature_qat,
        &kiln__feature_metrics, &kiln__feature_dist_update};
    int n = (int)(sizeof all / sizeof all[0]), registered = 0;
    while (kiln__trainer_features[registered])
        registered++;
    CHECK_INT_EQ(registered, n);
    for (int i = 0; i < n; i++) {
        CHECK_TRUE(position(all[i]) >= 0);
        CHECK_TRUE(all[i]->name && all[i]->name[0]);
        CHECK_TRUE(attaches(all[i]));
        for (int j = i + 1; j < n; j++)
            CHECK_TRUE(strcmp(all[i]->name, all[j]->name) != 0);
    }
}

static void test_order(void) {
    CHECK_INT_EQ(position(&kiln__feature_dist), 0);
    CHECK_TRUE(position(&kiln__feature_balance) < position(&kiln__feature_watchdog));
    CHECK_TRUE(position(&kiln__feature_watchdog) < position(&kiln__feature_guard));
    CHECK_TRUE(position(&kiln__feature_guard) < position(&kiln__feature_save));
    CHECK_TRUE(position(&kiln__feature_save) < position(&kiln__feature_checkpoint));
    CHECK_TRUE(position(&kiln__feature_checkpoint) < position(&kiln__feature_prune));
    CHECK_TRUE(position(&kiln__feature_checkpoint) < position(&kiln__feature_qat));
    CHECK_TRUE(position(&kiln__feature_checkpoint) < position(&kiln__feature_metrics));
    int last = position(&kiln__feature_dist_update);
    CHECK_TRUE(kiln__trainer_features[last] && !kiln__trainer_features[last + 1]);
    /* the watchdog's thread stops before any other feature frees what it may read */
    for (int i = 0; i < position(&kiln__feature_watchdog); i++)
        CHECK_TRUE(kiln__trainer_features[i]->free == NULL);
}

int main(void) {
    RUN_TEST(test_every_feature_once);
    RUN_TEST(test_order);
    TEST_MAIN_END();
}
