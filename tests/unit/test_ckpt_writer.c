/* The checkpoint writer's pieces that need no trainer: an optimizer file's size, which rank
 * holds which replica, a job written by the writer thread (the payload hash filled in, the
 * replica a byte copy of the file), and a file copied whole. */
#include <stdint.h>
#include <unistd.h>
#include <xxhash.h>

#include "test.h"
#include "train/trainer_ckpt.h"

static void test_image_bytes(void) {
    /* Adam with master weights (M, V, MASTER), bf16 working weights of a range of 10 */
    uint32_t f = KILN__CKPT_M | KILN__CKPT_V | KILN__CKPT_MASTER | KILN__CKPT_WORKING;
    CHECK_INT_EQ(kiln__ckpt_image_bytes(f, 10, 100, 2), 128 + 3 * 40 + 20);
    CHECK_INT_EQ(kiln__ckpt_image_bytes(KILN__CKPT_M, 7, 100, 4), 128 + 28);
    /* DiLoCo's slabs are the whole slab's, whatever the range */
    CHECK_INT_EQ(kiln__ckpt_image_bytes(KILN__CKPT_OUTER_W | KILN__CKPT_OUTER_V, 7, 100, 4),
                 128 + 800);
    CHECK_INT_EQ(kiln__ckpt_image_bytes(0, 7, 100, 4), 128);
}

static void test_replica_holder(void) {
    CHECK_INT_EQ(kiln__ckpt_replica_holder(0, 1), -1);
    CHECK_INT_EQ(kiln__ckpt_replica_holder(0, 2), 1);
    CHECK_INT_EQ(kiln__ckpt_replica_holder(1, 2), 0);
    CHECK_INT_EQ(kiln__ckpt_replica_holder(2, 3), 0);
    /* every rank holds exactly one replica, never its own */
    for (int world = 2; world <= 7; world++) {
        int held[8] = {0};
        for (int r = 0; r < world; r++) {
            int h = kiln__ckpt_replica_holder(r, world);
            CHECK_TRUE(h >= 0 && h < world && h != r);
            held[h]++;
        }
        for (int r = 0; r < world; r++)
            CHECK_INT_EQ(held[r], 1);
    }
}

/* A job of an optimizer file and its replica (no model): the files hold the image with its
 * payload hash, the records their sizes and whole-file hashes. */
static void test_job_write(void) {
    char dir[256], path[512], rpath[512], cpath[512];
    test_tmpdir(dir, sizeof dir, "test_ckpt_writer");
    kiln__ckpt_writer *w = NULL;
    CHECK_OK(kiln__ckpt_writer_create(&w));
    if (!w)
        return;
    kiln__ckpt_job *j = &w->job;
    size_t n = kiln__ckpt_image_bytes(KILN__CKPT_M, 1000, 1000, 4);
    j->image = calloc(1, n);
    j->image_bytes = j->image_cap = n;
    kiln__ckpt_header h = {.magic = KILN__CKPT_MAGIC,
                           .version = KILN__CKPT_VERSION,
                           .header_bytes = KILN__CKPT_HEADER,
                           .rank = 3,
                           .world = 4,
                           .flags = KILN__CKPT_M,
                           .payload_bytes = n - KILN__CKPT_HEADER};
    memcpy(j->image, &h, sizeof h);
    for (size_t i = sizeof h; i < n; i++)
        j->image[i] = (unsigned char)(i * 7);
    j->rank = 3;
    j->peer = j->image; /* one process's second copy */
    j->peer_bytes = n;
    j->peer_rank = 3;
    snprintf(j->tmp, sizeof j->tmp, "%s", dir);
    CHECK_OK(kiln__ckpt_writer_submit(w));
    CHECK_TRUE(kiln__ckpt_writer_done(w, 1));
    CHECK_INT_EQ(w->status, KILN_OK);
    test_path(path, sizeof path, dir, "optim_rank3.bin");
    test_path(rpath, sizeof rpath, dir, "optim_rank3.replica.bin");
    size_t got = 0, rgot = 0;
    unsigned char *a = test_slurp(path, &got), *b = test_slurp(rpath, &rgot);
    CHECK_TRUE(a && b);
    if (a && b) {
        CHECK_INT_EQ(got, n);
        CHECK_INT_EQ(rgot, n);
        CHECK_TRUE(memcmp(a, b, n) == 0);
        kiln__ckpt_header back;
        memcpy(&back, a, sizeof back);
        CHECK_TRUE(back.payload_xxh3 == XXH3_64bits(a + sizeof back, n - sizeof back));
        CHECK_INT_EQ(j->rec[0], n);
        CHECK_TRUE(j->rec[1] == XXH3_64bits(a, n));
        CHECK_TRUE(j->rec[2] == j->rec[0] && j->rec[3] == j->rec[1]);
        CHECK_INT_EQ(j->rec[4], 0); /* no model asked for */
    }
    free(a);
    free(b);
    /* a second job on the same thread, failing by request: a status and a message */
    j->fail = 1;
    CHECK_OK(kiln__ckpt_writer_submit(w));
    CHECK_TRUE(kiln__ckpt_writer_done(w, 1));
    CHECK_INT_EQ(w->status, KILN_ERR_IO);
    CHECK_TRUE(strstr(w->msg, "injected") != NULL);
    /* a file copied whole, with the copy's size and hash */
    uint64_t size = 0, hash = 0;
    test_path(cpath, sizeof cpath, dir, "copy.bin");
    CHECK_OK(kiln__ckpt_copy_file(path, cpath, &size, &hash));
    CHECK_INT_EQ(size, n);
    uint64_t s2 = 0, h2 = 0;
    CHECK_OK(kiln__ckpt_hash_file(cpath, &s2, &h2));
    CHECK_TRUE(s2 == n && h2 == hash);
    test_path(cpath, sizeof cpath, dir, "missing.bin");
    CHECK_TRUE(kiln__ckpt_copy_file(cpath, path, &size, &hash) != KILN_OK);
    CHECK_OK(kiln__ckpt_hash_file(path, &s2, &h2)); /* the target is untouched */
    CHECK_INT_EQ(s2, n);
    kiln__ckpt_writer_free(w); /* frees the image once (peer is the image) */
    CHECK_INT_EQ(test_rmtree(dir), 0);
}

int main(void) {
    RUN_TEST(test_image_bytes);
    RUN_TEST(test_replica_holder);
    RUN_TEST(test_job_write);
    TEST_MAIN_END();
}
