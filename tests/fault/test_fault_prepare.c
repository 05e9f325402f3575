/* kiln prepare interrupted: a run that is killed, or that fails half way, leaves the output
 * folder exactly as the previous run left it; the next run clears the dead run's staging.
 * An input truncated while prepare reads it ends the run with an error naming it (it used to
 * die of SIGBUS with no message, leaving its staging folder behind). */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include "kiln/prepare.h"
#include "test.h"

static char dir[256];
static char self_exe[4096];

static void path_in(char *out, size_t n, const char *name) {
    test_path(out, n, dir, name);
}

/* XXH3 of a file's bytes (0 when it cannot be read). */
static uint64_t file_hash(const char *name) {
    char p[512];
    path_in(p, sizeof p, name);
    size_t n = 0;
    char *b = test_slurp(p, &n);
    uint64_t h = b ? XXH3_64bits(b, n) : 0;
    free(b);
    return h;
}

static int count_entries(const char *name, const char *prefix) {
    char p[512];
    path_in(p, sizeof p, name);
    DIR *d = opendir(p);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL)
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    if (d)
        closedir(d);
    return n;
}

static void write_text(const char *name, size_t bytes, int seed) {
    char p[512];
    path_in(p, sizeof p, name);
    FILE *f = fopen(p, "wb");
    for (size_t n = 0; f && n < bytes;)
        n += (size_t)fprintf(f, "line %zu of file %d, some words to encode\n", n, seed);
    if (f)
        fclose(f);
}

typedef struct hook {
    int fd;             /* >= 0: write a byte here at the first progress report, then stop */
    const char *unlink; /* else: delete this file at the first progress report */
    int fired;
    const char *truncate; /* and: cut this file to 1000 bytes at the first progress report */
} hook;

static void on_progress(void *ctx, const kiln_prepare_progress *p) {
    hook *h = ctx;
    if (h->fired || p->bytes_done == 0)
        return;
    h->fired = 1;
    if (h->fd >= 0) {
        if (write(h->fd, "x", 1) != 1)
            _exit(3);
        pause(); /* killed here, half way through */
    }
    if (h->unlink)
        unlink(h->unlink);
    if (h->truncate && truncate(h->truncate, 1000) != 0)
        _exit(6);
}

static kiln_status run(const char *out, const char **inputs, int n, hook *h) {
    char o[512], in[4][512];
    const char *ins[4];
    path_in(o, sizeof o, out);
    for (int i = 0; i < n; i++) {
        path_in(in[i], sizeof in[i], inputs[i]);
        ins[i] = in[i];
    }
    kiln_tokenizer *bytes = NULL;
    kiln_status ts = kiln_tokenizer_load(&bytes, "bytes");
    if (ts != KILN_OK)
        return ts;
    kiln_prepare_config c;
    kiln_prepare_config_default(&c);
    c.tokenizer = bytes;
    c.out_dir = o;
    c.inputs = ins;
    c.num_inputs = n;
    c.shard_tokens = 1 << 20;
    c.threads = 2;
    c.progress = h ? on_progress : NULL;
    c.ctx = h;
    kiln_status st = kiln_prepare(&c, NULL);
    kiln_tokenizer_free(bytes);
    return st;
}

static void test_killed_and_failed_runs(void) {
    write_text("small.txt", 3000000, 1); /* 3 MB: three train shards */
    write_text("big.txt", 40000000, 2);  /* 40 MB: more than two batches */
    write_text("later.txt", 1000, 3);
    const char *small[] = {"small.txt"};
    CHECK_OK(run("out", small, 1, NULL));
    const char *names[] = {"out/train_000.bin", "out/train_001.bin", "out/train_002.bin",
                           "out/val_000.bin", "out/prepare.json"};
    uint64_t before[5];
    for (int i = 0; i < 5; i++) {
        before[i] = file_hash(names[i]);
        CHECK_TRUE(before[i] != 0);
    }

    /* Killed half way: the folder keeps the first run's files, byte for byte. The child
     * is a fresh process (this program again): OpenMP does not survive a bare fork. */
    int fds[2];
    CHECK_TRUE(pipe(fds) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        char fd_arg[16];
        snprintf(fd_arg, sizeof fd_arg, "%d", fds[1]);
        execl(self_exe, self_exe, "--child", fd_arg, dir, (char *)NULL);
        _exit(5);
    }
    close(fds[1]);
    char c;
    CHECK_INT_EQ(read(fds[0], &c, 1), 1);
    close(fds[0]);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    for (int i = 0; i < 5; i++)
        CHECK_TRUE(file_hash(names[i]) == before[i]);
    CHECK_INT_EQ(count_entries("out", ".prepare.tmp."), 1); /* the dead run's staging */
    CHECK_INT_EQ(count_entries("out", "train_"), 3);

    /* Failing half way (an input vanishes between the passes): same, and no staging left. */
    char later[512];
    path_in(later, sizeof later, "later.txt");
    hook h = {-1, later, 0, NULL};
    const char *two[] = {"big.txt", "later.txt"};
    CHECK_STATUS(run("out", two, 2, &h), KILN_ERR_IO);
    CHECK_TRUE(strstr(kiln_error_message(), "later.txt") != NULL);
    CHECK_TRUE(h.fired);
    for (int i = 0; i < 5; i++)
        CHECK_TRUE(file_hash(names[i]) == before[i]);
    CHECK_INT_EQ(count_entries("out", ".prepare.tmp."), 0); /* its own and the dead one's */

    /* A run that completes replaces everything at once. */
    write_text("small2.txt", 500000, 4);
    const char *small2[] = {"small2.txt"};
    CHECK_OK(run("out", small2, 1, NULL));
    CHECK_INT_EQ(count_entries("out", "train_"), 1);
    CHECK_TRUE(file_hash("out/train_000.bin") != before[0]);
}

/* An input cut short while prepare encodes it, in a child (the old reader died of SIGBUS):
 * the child exits 0 when prepare failed, and leaves the message in trunc.msg. */
static void test_input_truncated_mid_run(void) {
    write_text("shrink.txt", 40000000, 5); /* 40 MB: the first progress report comes early */
    pid_t pid = fork();
    if (pid == 0) {
        execl(self_exe, self_exe, "--truncate-child", dir, (char *)NULL);
        _exit(5);
    }
    int status = 0;
    CHECK_TRUE(waitpid(pid, &status, 0) == pid);
    if (WIFSIGNALED(status))
        fprintf(stderr, "prepare died of signal %d (%s)\n", WTERMSIG(status),
                strsignal(WTERMSIG(status)));
    CHECK_TRUE(WIFEXITED(status));
    CHECK_INT_EQ(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 0);
    char p[512];
    path_in(p, sizeof p, "trunc.msg");
    size_t n = 0;
    char *msg = test_slurp(p, &n);
    CHECK_TRUE(msg != NULL);
    if (msg) {
        fprintf(stderr, "(the error: %s)\n", msg);
        CHECK_TRUE(strstr(msg, "shrink.txt") != NULL);
        CHECK_TRUE(strstr(msg, "was 40000") != NULL && strstr(msg, "1000 bytes") != NULL);
    }
    free(msg);
    CHECK_INT_EQ(count_entries("out_shrink", ".prepare.tmp."), 0);
    CHECK_INT_EQ(count_entries("out_shrink", "train_"), 0);
}

static int truncate_child(const char *d) {
    snprintf(dir, sizeof dir, "%s", d);
    char p[512], m[512];
    path_in(p, sizeof p, "shrink.txt");
    path_in(m, sizeof m, "trunc.msg");
    hook h = {-1, NULL, 0, p};
    const char *in[] = {"shrink.txt"};
    kiln_status st = run("out_shrink", in, 1, &h);
    FILE *f = fopen(m, "w");
    if (f) {
        fputs(st == KILN_OK ? "(prepare succeeded)" : kiln_error_message(), f);
        fclose(f);
    }
    return st != KILN_OK && h.fired ? 0 : 1;
}

/* The killed run: prepare big.txt into out, stopping at the first progress report. */
static int child(const char *fd_arg, const char *d) {
    snprintf(dir, sizeof dir, "%s", d);
    hook h = {atoi(fd_arg), NULL, 0, NULL};
    const char *big[] = {"big.txt"};
    run("out", big, 1, &h);
    return 4; /* not reached: killed in the progress report */
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "--child"))
        return child(argv[2], argv[3]);
    if (argc == 3 && !strcmp(argv[1], "--truncate-child"))
        return truncate_child(argv[2]);
    ssize_t n = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);
    self_exe[n > 0 ? n : 0] = '\0';
    test_tmpdir(dir, sizeof dir, "fault_prepare");
    RUN_TEST(test_killed_and_failed_runs);
    RUN_TEST(test_input_truncated_mid_run);
    test_rmtree(dir);
    TEST_MAIN_END();
}
