/* Token shards under damage: truncated files, flipped bytes anywhere, a foreign format
 * version, ids outside the vocabulary behind valid checksums, writers killed mid-write or
 * stopped by a full disk, writers racing for one name, and a loader given a damaged shard.
 * Each damaged file must be refused with a message naming the file and what is wrong; a
 * good file must never be lost or replaced by a bad one. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "kiln/loader.h"
#include "kiln/shard.h"
#include "test.h"

static char dir[256];

static void path_in(char *out, size_t n, const char *name) {
    test_path(out, n, dir, name);
}

static void write_file(const char *p, const unsigned char *b, size_t n) {
    CHECK_INT_EQ(test_write_file(p, b, n), 0);
}

static int file_exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

/* A good shard of n ids (i*7 mod V) at path. */
static void write_good(const char *p, int64_t n, int64_t vocab, int32_t offset) {
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    for (int64_t i = 0; i < n; i++)
        ids[i] = (int32_t)((i * 7 + offset) % vocab);
    if (kiln_shard_write(p, vocab, ids, n) != KILN_OK)
        fprintf(stderr, "writing %s: %s\n", p, kiln_error_message());
    free(ids);
}

/* Open must fail with want and a message holding the path and needle. */
static void expect_refused(const char *p, kiln_status want, const char *needle) {
    kiln_shard *s = NULL;
    kiln_status got = kiln_shard_open(&s, p);
    CHECK_INT_EQ(got, want);
    CHECK_TRUE(s == NULL);
    const char *m = kiln_error_message();
    if (!strstr(m, p) || (needle && !strstr(m, needle))) {
        fprintf(stderr, "message \"%s\" lacks the path or \"%s\"\n", m, needle ? needle : "");
        CHECK_TRUE(0);
    }
    kiln_shard_close(s);
}

/* The shard at p opens, verifies, and holds the ids write_good(n, V, offset) wrote. */
static int holds_good(const char *p, int64_t n, int64_t vocab, int32_t offset) {
    kiln_shard *s = NULL;
    if (kiln_shard_open(&s, p) != KILN_OK) {
        fprintf(stderr, "%s: %s\n", p, kiln_error_message());
        return 0;
    }
    int ok = kiln_shard_get_info(s)->num_tokens == n;
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    ok = ok && kiln_shard_read(s, 0, n, ids) == KILN_OK;
    for (int64_t i = 0; ok && i < n; i++)
        ok = ids[i] == (int32_t)((i * 7 + offset) % vocab);
    free(ids);
    kiln_shard_close(s);
    return ok;
}

static void test_truncated(void) {
    char good[512], p[512];
    path_in(good, sizeof good, "good.bin");
    path_in(p, sizeof p, "truncated.bin");
    write_good(good, 1000, 50257, 0);
    size_t n;
    unsigned char *b = test_slurp(good, &n);
    CHECK_INT_EQ(n, 64 + 2000);
    size_t cuts[] = {n - 1, n - 2, n / 2, 65, 64, 63, 8, 0};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        write_file(p, b, cuts[i]);
        expect_refused(p, KILN_ERR_FORMAT, cuts[i] >= 64 ? "truncated by" : "shorter than");
    }
    unsigned char *longer = malloc(n + 3);
    memcpy(longer, b, n);
    memset(longer + n, 0, 3);
    write_file(p, longer, n + 3);
    expect_refused(p, KILN_ERR_FORMAT, "extra bytes");
    free(longer);
    free(b);
}

/* Every single flipped bit in the header, and bits spread over the tokens, is caught. */
static void test_flipped_bytes(void) {
    char good[512], p[512];
    path_in(good, sizeof good, "good.bin");
    path_in(p, sizeof p, "flipped.bin");
    write_good(good, 1000, 50257, 0);
    size_t n;
    unsigned char *b = test_slurp(good, &n);
    int all_refused = 1;
    for (size_t off = 0; off < 64; off++)
        for (int bit = 0; bit < 8; bit++) {
            b[off] ^= (unsigned char)(1 << bit);
            write_file(p, b, n);
            kiln_shard *s = NULL;
            kiln_status st = kiln_shard_open(&s, p);
            if (st == KILN_OK || !strstr(kiln_error_message(), p)) {
                fprintf(stderr, "header byte %zu bit %d: %s\n", off, bit, kiln_error_message());
                all_refused = 0;
            }
            kiln_shard_close(s);
            b[off] ^= (unsigned char)(1 << bit);
        }
    CHECK_TRUE(all_refused);

    b[40] ^= 1; /* a header field: the header checksum names its range */
    write_file(p, b, n);
    expect_refused(p, KILN_ERR_CHECKSUM, "header bytes 0..55 fail their checksum");
    b[40] ^= 1;

    for (size_t off = 64; off < n; off += 97) {
        b[off] ^= 0x10;
        write_file(p, b, n);
        expect_refused(p, KILN_ERR_CHECKSUM, "token bytes 64..2064 fail their checksum");
        b[off] ^= 0x10;
    }
    /* A flip that pushes an id past V: the message also points at it. */
    b[64 + 2 * 500 + 1] = 0xFD; /* token 500 (id 3500) becomes 0xFDAC = 64940 >= V */
    write_file(p, b, n);
    expect_refused(p, KILN_ERR_CHECKSUM, "token 500 (byte offset 1064) is out of range");
    free(b);
}

/* A header that is valid for another format version: refused by version, not by hash. */
static void test_other_version(void) {
    char good[512], p[512];
    path_in(good, sizeof good, "good.bin");
    path_in(p, sizeof p, "v2.bin");
    write_good(good, 100, 256, 0);
    size_t n;
    unsigned char *b = test_slurp(good, &n);
    uint32_t v = 3;
    memcpy(b + 8, &v, 4);
    uint64_t h = XXH3_64bits(b, 56);
    memcpy(b + 56, &h, 8);
    write_file(p, b, n);
    expect_refused(p, KILN_ERR_FORMAT, "format version 3, this build reads version 1 to 2");
    kiln_shard_info info;
    CHECK_INT_EQ(kiln_shard_read_info(p, &info), KILN_ERR_FORMAT);
    memcpy(b, "KILNTOKZ", 8);
    write_file(p, b, n);
    expect_refused(p, KILN_ERR_FORMAT, "not a kiln token shard");
    free(b);
}

/* Checksums that match but an id >= V (a faulty writer elsewhere): refused by range. */
static void test_out_of_range_id(void) {
    char good[512], p[512];
    path_in(good, sizeof good, "good.bin");
    path_in(p, sizeof p, "range.bin");
    write_good(good, 100, 256, 0);
    size_t n;
    unsigned char *b = test_slurp(good, &n);
    uint16_t bad = 256;
    memcpy(b + 64 + 2 * 37, &bad, 2);
    uint64_t dh = XXH3_64bits(b + 64, n - 64);
    memcpy(b + 32, &dh, 8);
    uint64_t hh = XXH3_64bits(b, 56);
    memcpy(b + 56, &hh, 8);
    write_file(p, b, n);
    expect_refused(p, KILN_ERR_RANGE,
                   "token 37 (byte offset 138) is id 256, outside the vocabulary of 256");
    /* A width that does not fit V, with a valid header checksum. */
    memcpy(b + 64 + 2 * 37, &(uint16_t){37 * 7}, 2);
    uint64_t big = 70000;
    memcpy(b + 16, &big, 8);
    dh = XXH3_64bits(b + 64, n - 64);
    memcpy(b + 32, &dh, 8);
    hh = XXH3_64bits(b, 56);
    memcpy(b + 56, &hh, 8);
    write_file(p, b, n);
    expect_refused(p, KILN_ERR_FORMAT, "token width 2 bytes does not fit vocabulary size 70000");
    free(b);
}

/* A child writes to p and is SIGKILLed: after `appends` appends (mid-write), or after all of
 * them but before finish. p keeps its old good content; no file under p is ever partial. */
static void kill_writer(const char *p, int before_finish, char *tmp, size_t cap) {
    int fds[2];
    if (pipe(fds) != 0) {
        CHECK_TRUE(0);
        return;
    }
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        kiln_shard_writer *w = NULL;
        if (kiln_shard_writer_open(&w, p, 50257) != KILN_OK)
            _exit(3);
        int32_t ids[4096];
        for (int i = 0; i < 4096; i++)
            ids[i] = i;
        for (int k = 0; k < 300; k++) /* ~2.4 MB: past the writer's buffer, so on disk */
            kiln_shard_writer_append(w, ids, 4096);
        if (write(fds[1], "x", 1) != 1)
            _exit(4);
        if (before_finish)
            pause();
        for (;;) /* mid-write: keep writing until killed */
            kiln_shard_writer_append(w, ids, 4096);
    }
    close(fds[1]);
    char c;
    CHECK_INT_EQ(read(fds[0], &c, 1), 1);
    close(fds[0]);
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    /* the kill left the temporary file, never the final name */
    CHECK_TRUE(test_find_temp(p, (long)pid, tmp, cap));
    expect_refused(tmp, KILN_ERR_FORMAT, "not a kiln token shard");
}

static void age(const char *p, int seconds) {
    struct timespec t[2] = {{time(NULL) - seconds, 0}, {time(NULL) - seconds, 0}};
    CHECK_INT_EQ(utimensat(AT_FDCWD, p, t, 0), 0);
}

static void test_killed_writer(void) {
    char p[512], fresh[512], t1[600], t2[600], t3[600];
    path_in(p, sizeof p, "precious.bin");
    path_in(fresh, sizeof fresh, "fresh.bin");
    write_good(p, 5000, 50257, 3);
    kill_writer(p, 0, t1, sizeof t1);
    CHECK_TRUE(holds_good(p, 5000, 50257, 3));
    kill_writer(p, 1, t2, sizeof t2);
    CHECK_TRUE(holds_good(p, 5000, 50257, 3));
    kill_writer(fresh, 0, t3, sizeof t3);
    CHECK_TRUE(!file_exists(fresh));
    /* The next write of a name removes the dead writers' temporaries, once they have gone a
     * minute without a write (a fresh one may be a live writer's on another machine). */
    write_good(p, 10, 50257, 9);
    CHECK_TRUE(file_exists(t1) && file_exists(t2));
    age(t1, 120);
    age(t2, 120);
    age(t3, 120);
    write_good(p, 11, 50257, 9);
    CHECK_TRUE(holds_good(p, 11, 50257, 9));
    CHECK_TRUE(!file_exists(t1) && !file_exists(t2));
    CHECK_TRUE(file_exists(t3)); /* another name's temporary is not touched */
    unlink(t3);
}

static void test_full_disk(void) {
    char p[512];
    path_in(p, sizeof p, "full.bin");
    write_good(p, 100, 50257, 1);
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {100000, 100000};
        setrlimit(RLIMIT_FSIZE, &rl);
        int64_t n = 1000000;
        int32_t *ids = calloc((size_t)n, sizeof *ids);
        kiln_status st = kiln_shard_write(p, 50257, ids, n);
        char tmp[600];
        int ok = st == KILN_ERR_IO && strstr(kiln_error_message(), "cannot write") &&
                 !test_find_temp(p, (long)getpid(), tmp, sizeof tmp);
        if (!ok)
            fprintf(stderr, "full disk: %s: %s\n", kiln_status_str(st), kiln_error_message());
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK_TRUE(holds_good(p, 100, 50257, 1));
}

/* The shard at p, opened and read: 1 + j when it holds the ids of write_good(n, 50257,
 * offsets[j]); 0 when it does not open or holds none of them. */
static int which_good(const char *p, int64_t n, const int *offsets, int noffsets) {
    kiln_shard *s = NULL;
    if (kiln_shard_open(&s, p) != KILN_OK) {
        fprintf(stderr, "open during the race: %s\n", kiln_error_message());
        return 0;
    }
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    int found = -1;
    if (ids && kiln_shard_get_info(s)->num_tokens == n && kiln_shard_read(s, 0, n, ids) == KILN_OK)
        for (int k = 0; k < noffsets && found < 0; k++) {
            int64_t i = 0;
            while (i < n && ids[i] == (int32_t)((i * 7 + offsets[k]) % 50257))
                i++;
            found = i == n ? k : -1;
        }
    free(ids);
    kiln_shard_close(s);
    if (found < 0)
        fprintf(stderr, "a shard opened during the race holds none of the writers' ids\n");
    return 1 + found;
}

/* Four processes write the same name at once while this one keeps opening it: every open
 * sees a complete shard, one writer's ids or the first file's, and the survivor is one
 * writer's whole file. The writers start together when this process says so, and the opens
 * counted are those made while a writer was still running: at least one of them must have
 * found a writer's file (the race happened, and opens saw its results). */
static void test_racing_writers(void) {
    char p[512];
    path_in(p, sizeof p, "raced.bin");
    int64_t n = 200000;
    write_good(p, n, 50257, 100);
    int go[2];
    CHECK_INT_EQ(pipe(go), 0);
    pid_t kids[4];
    for (int k = 0; k < 4; k++) {
        kids[k] = fork();
        if (kids[k] == 0) {
            char c;
            close(go[1]);
            if (read(go[0], &c, 1) != 1)
                _exit(1);
            for (int round = 0; round < 3; round++)
                write_good(p, n, 50257, k);
            _exit(0);
        }
    }
    close(go[0]);
    const int offsets[5] = {100, 0, 1, 2, 3};
    int opens_ok = 1, opens_racing = 0, saw_writer = 0, done[4] = {0, 0, 0, 0};
    CHECK_INT_EQ(write(go[1], "gggg", 4), 4);
    close(go[1]);
    for (;;) {
        int running = 0;
        for (int k = 0; k < 4; k++) {
            int status = 0;
            if (!done[k] && kids[k] > 0 && waitpid(kids[k], &status, WNOHANG) == kids[k]) {
                done[k] = 1;
                opens_ok &= WIFEXITED(status) && WEXITSTATUS(status) == 0;
            }
            running += kids[k] > 0 && !done[k];
        }
        int w = which_good(p, n, offsets, 5);
        opens_ok &= w > 0;
        if (!running)
            break;
        opens_racing++;
        saw_writer |= w > 1; /* a writer's file, not the first one */
    }
    for (int k = 0; k < 4; k++)
        if (kids[k] > 0 && !done[k])
            waitpid(kids[k], NULL, 0);
    fprintf(stderr, "  %d opens while writers ran\n", opens_racing);
    CHECK_TRUE(opens_ok);
    CHECK_TRUE(opens_racing >= 1);
    CHECK_TRUE(saw_writer);
    int which = 0;
    for (int k = 0; k < 4; k++)
        which += holds_good(p, n, 50257, k);
    CHECK_INT_EQ(which, 1);
}

/* A loader given a damaged shard among good ones refuses to start and names it. */
static void test_loader_refuses_damage(void) {
    char sub[512], a[600], b[600];
    path_in(sub, sizeof sub, "set");
    mkdir(sub, 0755);
    snprintf(a, sizeof a, "%s/train_000.bin", sub);
    snprintf(b, sizeof b, "%s/train_001.bin", sub);
    write_good(a, 1000, 50257, 0);
    write_good(b, 1000, 50257, 0);
    size_t n;
    unsigned char *buf = test_slurp(b, &n);
    buf[700] ^= 4;
    write_file(b, buf, n);
    free(buf);
    kiln_loader_config c = {sub, 2, 16, 0, 1, 1, 1};
    kiln_loader *l = NULL;
    CHECK_INT_EQ(kiln_loader_open(&l, &c), KILN_ERR_CHECKSUM);
    CHECK_TRUE(l == NULL);
    CHECK_TRUE(strstr(kiln_error_message(), "train_001.bin") != NULL);
}

int main(void) {
    test_tmpdir(dir, sizeof dir, "fault_shard");
    RUN_TEST(test_truncated);
    RUN_TEST(test_flipped_bytes);
    RUN_TEST(test_other_version);
    RUN_TEST(test_out_of_range_id);
    RUN_TEST(test_killed_writer);
    RUN_TEST(test_full_disk);
    RUN_TEST(test_racing_writers);
    RUN_TEST(test_loader_refuses_damage);
    test_rmtree(dir);
    TEST_MAIN_END();
}
