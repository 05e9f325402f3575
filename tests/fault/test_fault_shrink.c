/* Files that shrink while kiln holds them open: a token shard truncated after the loader
 * opened it, mid-run. kiln reads shards with pread, so the next batch that needs the lost
 * bytes is an error naming the file and its sizes then and now, the loader's position stays
 * where it was, and the process goes on (a mapping ended it with SIGBUS and no message).
 * Also: the loader's content hash tells two shards of the same size apart. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kiln/loader.h"
#include "kiln/shard.h"
#include "test.h"

static char dir[256];

static void write_ids(const char *p, int64_t n, int64_t vocab, int32_t offset) {
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    for (int64_t i = 0; i < n; i++)
        ids[i] = (int32_t)((i * 7 + offset) % vocab);
    if (kiln_shard_write(p, vocab, ids, n) != KILN_OK)
        fprintf(stderr, "writing %s: %s\n", p, kiln_error_message());
    free(ids);
}

static int mentions(const char *needle) {
    if (strstr(kiln_error_message(), needle))
        return 1;
    fprintf(stderr, "message \"%s\" lacks \"%s\"\n", kiln_error_message(), needle);
    return 0;
}

/* Both widths: a shard truncated under an open kiln_shard and under a loader. */
static void shrink_case(int64_t vocab) {
    char p[512];
    test_path(p, sizeof p, dir, vocab > 65536 ? "wide.bin" : "narrow.bin");
    const int64_t n = 200000;
    write_ids(p, n, vocab, 3);
    kiln_shard *s = NULL;
    CHECK_OK(kiln_shard_open(&s, p));
    kiln_loader_config c = {p, 4, 64, 0, 1, 7, 1};
    kiln_loader *l = NULL;
    CHECK_OK(kiln_loader_open(&l, &c));
    if (!s || !l) {
        kiln_shard_close(s);
        kiln_loader_close(l);
        return;
    }
    int32_t in[256], tg[256], ids[100];
    CHECK_OK(kiln_loader_next(l, in, tg));
    CHECK_TRUE(truncate(p, KILN_SHARD_HEADER_BYTES + 1000) == 0);
    /* the shard: ids past the cut are an error naming the file and both sizes */
    CHECK_OK(kiln_shard_read(s, 0, 100, ids));
    CHECK_INT_EQ(ids[1], (int32_t)((7 + 3) % vocab));
    CHECK_STATUS(kiln_shard_read(s, n - 100, 100, ids), KILN_ERR_IO);
    CHECK_TRUE(mentions(p));
    char was[64];
    snprintf(was, sizeof was, "was %lld bytes",
             (long long)(KILN_SHARD_HEADER_BYTES + n * kiln_shard_token_width(vocab)));
    CHECK_TRUE(mentions(was));
    CHECK_TRUE(mentions("is 1064 bytes now"));
    /* the loader: some batch of the epoch needs the lost bytes; that batch is an error, and
     * the position stays before it */
    kiln_status st = KILN_OK;
    kiln_loader_state before = kiln_loader_get_state(l);
    for (int64_t b = 1; b < kiln_loader_batches_per_epoch(l) && st == KILN_OK; b++) {
        before = kiln_loader_get_state(l);
        st = kiln_loader_next(l, in, tg);
    }
    CHECK_INT_EQ(st, KILN_ERR_IO);
    CHECK_TRUE(mentions(p));
    CHECK_TRUE(mentions("truncated"));
    kiln_loader_state after = kiln_loader_get_state(l);
    CHECK_TRUE(after.position == before.position && after.epoch == before.epoch);
    kiln_shard_close(s);
    kiln_loader_close(l);
}

static void test_shard_truncated_while_open(void) {
    shrink_case(50257);
    shrink_case(100000);
}

/* Two shards of the same size and other ids: the same token count, other content hashes;
 * the same file opened twice: the same hash. */
static void test_content_hash(void) {
    char a[512], b[512];
    test_path(a, sizeof a, dir, "a.bin");
    test_path(b, sizeof b, dir, "b.bin");
    write_ids(a, 5000, 50257, 1);
    write_ids(b, 5000, 50257, 2);
    kiln_loader_config ca = {a, 2, 16, 0, 1, 1, 1}, cb = {b, 2, 16, 0, 1, 1, 1};
    kiln_loader *la = NULL, *lb = NULL, *la2 = NULL;
    CHECK_OK(kiln_loader_open(&la, &ca));
    CHECK_OK(kiln_loader_open(&lb, &cb));
    CHECK_OK(kiln_loader_open(&la2, &ca));
    if (la && lb && la2) {
        CHECK_INT_EQ(kiln_loader_num_tokens(la), kiln_loader_num_tokens(lb));
        CHECK_TRUE(kiln_loader_content_hash(la) != kiln_loader_content_hash(lb));
        CHECK_TRUE(kiln_loader_content_hash(la) == kiln_loader_content_hash(la2));
        CHECK_INT_EQ(kiln_loader_num_shards(la), 1);
        CHECK_TRUE(!strcmp(kiln_loader_shard_path(la, 0), a));
        CHECK_TRUE(kiln_loader_shard_path(la, 1) == NULL);
    }
    kiln_loader_close(la);
    kiln_loader_close(lb);
    kiln_loader_close(la2);
}

int main(void) {
    test_tmpdir(dir, sizeof dir, "fault_shrink");
    RUN_TEST(test_shard_truncated_while_open);
    RUN_TEST(test_content_hash);
    test_rmtree(dir);
    TEST_MAIN_END();
}
