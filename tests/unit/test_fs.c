/* Temporaries of atomic writes (core/fs.h): a dead writer's is removed at once, a live
 * writer's (its flock held) is kept, whatever the pid in its name says. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/fs.h"
#include "test.h"

/* The pid of a child that has exited and been reaped: no process has it now. */
static long dead_pid(void) {
    pid_t p = fork();
    if (p == 0)
        _exit(0);
    int st;
    waitpid(p, &st, 0);
    return (long)p;
}

/* Create path with a few bytes, last written `ago` seconds back. */
static int plant(const char *path, int ago) {
    if (test_write_file(path, "partial", 7) != 0)
        return -1;
    struct timespec t[2];
    clock_gettime(CLOCK_REALTIME, &t[0]);
    t[0].tv_sec -= ago;
    t[1] = t[0];
    return utimensat(AT_FDCWD, path, t, 0);
}

static int exists(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0;
}

/* A dead writer's temporary 5 s old (the rule before took a minute) goes at once; one
 * written this instant stays, as a writer's between its open and its flock may be. */
static void test_dead_writer_removed(void) {
    char dir[4096], target[4200], tmp[4300], fresh[4300];
    test_tmpdir(dir, sizeof dir, "fs_dead");
    test_path(target, sizeof target, dir, "x.gguf");
    long pid = dead_pid();
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld.0", target, pid);
    snprintf(fresh, sizeof fresh, "%s.tmp.%ld.1", target, pid);
    CHECK_INT_EQ(plant(tmp, 5), 0);
    CHECK_INT_EQ(plant(fresh, 0), 0);
    CHECK_INT_EQ(kiln__remove_stale_temps(target), 1);
    CHECK_TRUE(!exists(tmp));
    CHECK_TRUE(exists(fresh));
    test_rmtree(dir);
}

/* A temporary whose writer lives on (here a child holding its flock, under a pid that is
 * no live process here, as a writer on another host) is kept however old; once the child
 * is gone it is removed. */
static void test_locked_temp_kept(void) {
    char dir[4096], target[4200], tmp[4300];
    test_tmpdir(dir, sizeof dir, "fs_locked");
    test_path(target, sizeof target, dir, "x.gguf");
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld.0", target, dead_pid());
    CHECK_INT_EQ(plant(tmp, 120), 0);
    int ready[2], done[2];
    if (pipe(ready) != 0 || pipe(done) != 0) {
        TEST_SKIP("pipe: %s", strerror(errno));
        return;
    }
    pid_t child = fork();
    if (child == 0) {
        int fd = open(tmp, O_WRONLY);
        char c = fd >= 0 && flock(fd, LOCK_EX) == 0 ? 'y' : 'n';
        (void)!write(ready[1], &c, 1);
        (void)!read(done[0], &c, 1); /* hold it until the parent has looked */
        _exit(0);
    }
    char c = 0;
    CHECK_INT_EQ(read(ready[0], &c, 1), 1);
    if (c != 'y') {
        TEST_SKIP("this file system has no flock");
    } else {
        CHECK_INT_EQ(kiln__remove_stale_temps(target), 0);
        CHECK_TRUE(exists(tmp));
    }
    (void)!write(done[1], "x", 1);
    int st;
    waitpid(child, &st, 0);
    if (c == 'y') {
        CHECK_INT_EQ(kiln__remove_stale_temps(target), 1);
        CHECK_TRUE(!exists(tmp));
    }
    close(ready[0]), close(ready[1]), close(done[0]), close(done[1]);
    test_rmtree(dir);
}

/* The writer's side: kiln__atomic_open's temporary is locked until the commit. */
static void test_writer_holds_lock(void) {
    char dir[4096], target[4200];
    test_tmpdir(dir, sizeof dir, "fs_writer");
    test_path(target, sizeof target, dir, "w.bin");
    kiln__atomic_file f = KILN__ATOMIC_FILE_INIT;
    CHECK_OK(kiln__atomic_open(&f, target));
    CHECK_OK(kiln__atomic_write(&f, "abc", 3));
    pid_t child = fork();
    if (child == 0) { /* another process: its lock must fail while the writer holds one */
        int fd = open(f.tmp, O_WRONLY);
        _exit(fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK ? 0 : 1);
    }
    int st = 0;
    waitpid(child, &st, 0);
    CHECK_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK_OK(kiln__atomic_commit(&f));
    size_t n = 0;
    char *got = test_slurp(target, &n);
    CHECK_STR_EQ(got, "abc");
    free(got);
    test_rmtree(dir);
}

int main(void) {
    RUN_TEST(test_dead_writer_removed);
    RUN_TEST(test_locked_temp_kept);
    RUN_TEST(test_writer_holds_lock);
    TEST_MAIN_END();
}
