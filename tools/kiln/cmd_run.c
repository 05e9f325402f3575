/* kiln run: a supervisor. Starts a command (kiln train, or mpirun/srun running it) in its own
 * process group, passes the scheduler's signals on to it, restarts it from its checkpoints
 * after a crash, and reports the goodput: useful step time over wall time. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "flags.h"
#include "kiln/core.h"
#include "tool_common.h"

static const char *usage =
    "usage: kiln run [flags] -- COMMAND [ARGS...]\n\n"
    "Run COMMAND (e.g. `kiln train ... --checkpoint-dir D` or `mpirun -np 2 kiln train ...`) in\n"
    "its own process group and pass SIGTERM, SIGINT and SIGUSR1 on to it. When it ends: exit 0\n"
    "is done (exit 0); exit 3 (kiln train preempted: its checkpoint is written) is passed on\n"
    "for the scheduler to requeue the job; any other end (a signal, another code) is a crash:\n"
    "after a backoff (doubling from --backoff up to --max-backoff seconds) the command starts\n"
    "again, with `--resume D` added when it has --checkpoint-dir D, no --resume, and D holds a\n"
    "checkpoint; at most --restarts times, then kiln run exits with the command's last status.\n"
    "A command that cannot be executed exits 127 at once, and one that exits 2 (a usage error:\n"
    "its own arguments are wrong, so it would fail again) is not restarted: kiln run exits 2.\n"
    "At the end it prints the goodput: the time of the steps kept (from the command's --metrics\n"
    "file, a step redone after a restart counted once) over the wall time.\n\n"
    "Hangs: exit 4 (kiln train's watchdog found a hung step) and exit 5 (it stopped a run with\n"
    "a straggling rank, --straggler-exit) are restarted like a crash, and counted apart. With\n"
    "--stale-s S, a heartbeat file (--heartbeat, else the command's own --heartbeat, rank 0's\n"
    "under mpirun) that is not renewed for S seconds means the command is frozen (e.g. stopped\n"
    "whole, where its own watchdog cannot act): its process group gets SIGTERM, SIGKILL after\n"
    "--term-grace seconds, and it is restarted. --fewer-ranks: a restart after a failure of\n"
    "`mpirun ... -np N ...` (or -n N) starts it on N - 1 ranks, down to --min-ranks.";

/* The child's process group, for the handler to pass signals on to (0: none running). */
static volatile sig_atomic_t child_group;
static volatile sig_atomic_t stop_signal; /* the first signal received (0: none) */

static void on_signal(int sig) {
    if (!stop_signal)
        stop_signal = sig;
    if (child_group > 0)
        kill(-(pid_t)child_group, sig);
}

static void set_handlers(void (*h)(int)) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = h;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* The value of --name in a command ("--name V" or "--name=V"); NULL when absent. */
static const char *command_flag(char **cmd, int n, const char *name) {
    size_t len = strlen(name);
    for (int i = 0; i < n; i++) {
        if (strncmp(cmd[i], "--", 2) || strncmp(cmd[i] + 2, name, len))
            continue;
        const char *rest = cmd[i] + 2 + len;
        if (*rest == '=')
            return rest + 1;
        if (*rest == '\0')
            return i + 1 < n ? cmd[i + 1] : "";
    }
    return NULL;
}

/* Whether folder holds a checkpoint to resume from. */
static int has_checkpoint(const char *folder) {
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/latest", folder); /* written with every checkpoint */
    return stat(path, &st) == 0;
}

/* Useful step time: the "ms" of every step in the metrics file, the latest run's for a step
 * that was redone (a resumed run appends its lines, so the last line of a step is the one
 * kept; the file is read after each run). */
typedef struct step_times {
    double *ms; /* [step]; NAN: not seen */
    int64_t cap;
} step_times;

static void read_metrics(step_times *st, const char *path) {
    struct stat sb; /* a regular file: not /dev/stdout or a FIFO, which would block */
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
        return;
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        const char *a = strstr(line, "\"step\": "), *b = strstr(line, "\"ms\": ");
        if (!a || !b)
            continue;
        long long step = strtoll(a + 8, NULL, 10);
        double ms = strtod(b + 6, NULL);
        if (step < 1 || step > (1LL << 40))
            continue;
        if (step >= st->cap) {
            int64_t cap = st->cap ? st->cap : 1024;
            while (cap <= step)
                cap *= 2;
            double *p = realloc(st->ms, (size_t)cap * sizeof *p);
            if (!p)
                break;
            for (int64_t i = st->cap; i < cap; i++)
                p[i] = NAN;
            st->ms = p;
            st->cap = cap;
        }
        st->ms[step] = ms;
    }
    fclose(f);
}

static double wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void nap_ms(double ms) {
    struct timespec ts = {(time_t)(ms / 1e3), (long)(fmod(ms, 1e3) * 1e6)};
    nanosleep(&ts, NULL);
}

/* A heartbeat file to watch (path NULL: none): stale after stale_s seconds without a new one
 * (counted from the command's start while it has written none since), then SIGTERM to the
 * group and SIGKILL grace_s later. */
typedef struct hb_watch {
    const char *path;
    double stale_s, grace_s;
} hb_watch;

static void reap(pid_t pid, int *status) {
    while (waitpid(pid, status, 0) < 0 && errno == EINTR)
        ;
}

/* Wait for pid, the leader of its group; *stale: the heartbeat went stale and the group was
 * killed. */
static void wait_child(pid_t pid, int *status, const hb_watch *w, int *stale) {
    *stale = 0;
    if (!w->path) {
        reap(pid, status);
        return;
    }
    double start = wall_s();
    for (;;) {
        pid_t r = waitpid(pid, status, WNOHANG);
        if (r == pid || (r < 0 && errno != EINTR))
            return;
        double beat = start;
        struct stat sb;
        if (stat(w->path, &sb) == 0)
            beat = fmax(beat, (double)sb.st_mtim.tv_sec + (double)sb.st_mtim.tv_nsec * 1e-9);
        double age = wall_s() - beat;
        if (age <= w->stale_s) {
            nap_ms(50);
            continue;
        }
        *stale = 1;
        fprintf(stderr,
                "kiln run: the heartbeat %s was not renewed for %.1f s (--stale-s %g): "
                "the command is frozen; SIGTERM to its processes, SIGKILL in %g s\n",
                w->path, age, w->stale_s, w->grace_s);
        kill(-pid, SIGTERM);
        double until = now_ms() + w->grace_s * 1e3;
        while (now_ms() < until) {
            if (waitpid(pid, status, WNOHANG) == pid)
                return;
            nap_ms(20);
        }
        kill(-pid, SIGKILL);
        reap(pid, status);
        return;
    }
}

/* Start cmd in a process group of its own and wait for it; *status: waitpid's; *stale: it was
 * killed for a stale heartbeat. Returns 0, or 127 when the command could not be executed
 * (said on stderr). */
static int run_child(char **cmd, const hb_watch *hb, int *status, int *stale) {
    int pipefd[2];
    /* close-on-exec: a successful exec closes it, a failed one writes errno into it */
    if (pipe(pipefd) != 0 || fcntl(pipefd[0], F_SETFD, FD_CLOEXEC) != 0 ||
        fcntl(pipefd[1], F_SETFD, FD_CLOEXEC) != 0) {
        fprintf(stderr, "kiln run: cannot make a pipe: %s\n", strerror(errno));
        return 127;
    }
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "kiln run: cannot fork: %s\n", strerror(errno));
        close(pipefd[0]);
        close(pipefd[1]);
        return 127;
    }
    if (pid == 0) {
        setpgid(0, 0);
        set_handlers(SIG_DFL);
        execvp(cmd[0], cmd);
        int e = errno;
        ssize_t w = write(pipefd[1], &e, sizeof e);
        (void)w;
        _exit(127);
    }
    setpgid(pid, pid); /* as the child does: whichever runs first */
    child_group = pid;
    if (stop_signal) /* a signal before the group existed */
        kill(-pid, stop_signal);
    close(pipefd[1]);
    int e = 0;
    ssize_t r;
    while ((r = read(pipefd[0], &e, sizeof e)) < 0 && errno == EINTR)
        ;
    close(pipefd[0]);
    *stale = 0;
    if (r == (ssize_t)sizeof e) /* the exec failed: nothing to watch */
        reap(pid, status);
    else
        wait_child(pid, status, hb, stale);
    child_group = 0;
    if (r == (ssize_t)sizeof e) {
        fprintf(stderr, "kiln run: cannot execute '%s': %s\n", cmd[0], strerror(e));
        return 127;
    }
    return 0;
}

/* The exit status a shell would give: the code, or 128 + the signal. */
static int shell_status(int status) {
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return 1;
}

static void describe(char *buf, size_t cap, int status) {
    if (WIFSIGNALED(status))
        snprintf(buf, cap, "signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
    else
        snprintf(buf, cap, "exit %d", shell_status(status));
}

static void sleep_s(double s) {
    double end = now_ms() + s * 1e3;
    while (!stop_signal) {
        double left = end - now_ms();
        if (left <= 0)
            break;
        struct timespec ts = {(time_t)(left / 1e3), (long)(fmod(left, 1e3) * 1e6)};
        nanosleep(&ts, NULL);
    }
}

static void report_goodput(const step_times *st, const char *metrics, double wall_ms,
                           int restarts) {
    if (!metrics) {
        printf("kiln run: wall time %.1f s, %d restart%s; goodput unknown (the command has no "
               "--metrics file)\n",
               wall_ms / 1e3, restarts, restarts == 1 ? "" : "s");
        return;
    }
    double useful = 0.0;
    int64_t steps = 0;
    for (int64_t i = 0; i < st->cap; i++)
        if (!isnan(st->ms[i])) {
            useful += st->ms[i];
            steps++;
        }
    printf("kiln run: goodput %.1f%%: %lld steps' time %.1f s over wall time %.1f s, %d "
           "restart%s\n",
           wall_ms > 0 ? 100.0 * useful / wall_ms : 0.0, (long long)steps, useful / 1e3,
           wall_ms / 1e3, restarts, restarts == 1 ? "" : "s");
}

/* The rank count of `mpirun ... -np N ...` (or -n, --np, --n): the index of N in cmd, or -1
 * when cmd is not an mpirun (mpiexec, orterun) or has no count. */
static int rank_count_arg(char **cmd, int n) {
    const char *base = strrchr(cmd[0], '/');
    base = base ? base + 1 : cmd[0];
    if (strcmp(base, "mpirun") && strcmp(base, "mpiexec") && strcmp(base, "orterun"))
        return -1;
    for (int i = 1; i + 1 < n; i++)
        if (!strcmp(cmd[i], "-np") || !strcmp(cmd[i], "-n") || !strcmp(cmd[i], "--np") ||
            !strcmp(cmd[i], "--n")) {
            char *end = NULL;
            long v = strtol(cmd[i + 1], &end, 10);
            return end != cmd[i + 1] && *end == '\0' && v >= 1 && v <= (1 << 20) ? i + 1 : -1;
        }
    return -1;
}

/* The heartbeat file to watch: `given`, else the command's --heartbeat (rank 0's file,
 * PATH.rank0, when it runs on several ranks). 0 when there is none. */
static int heartbeat_path(char *buf, size_t cap, const char *given, char **cmd, int n, int np_at) {
    const char *own = command_flag(cmd, n, "heartbeat");
    if (given && given[0])
        snprintf(buf, cap, "%s", given);
    else if (own && own[0])
        snprintf(buf, cap, "%s%s", own, np_at >= 0 && strcmp(cmd[np_at], "1") ? ".rank0" : "");
    else
        return 0;
    return 1;
}

/* --fewer-ranks: the next start on one rank fewer (down to min_ranks), said on stderr;
 * buf holds the new count's text. */
static void fewer_ranks(char **cmd, int at, int64_t min_ranks, char *buf, size_t cap) {
    long np = strtol(cmd[at], NULL, 10);
    if (np <= min_ranks) {
        fprintf(stderr,
                "kiln run: --fewer-ranks: already at --min-ranks %lld; the command "
                "starts again on %ld ranks\n",
                (long long)min_ranks, np);
        return;
    }
    snprintf(buf, cap, "%ld", np - 1);
    fprintf(stderr,
            "kiln run: --fewer-ranks: the command starts again on %ld rank%s instead of "
            "%ld (%s %ld -> %s %ld)\n",
            np - 1, np - 1 == 1 ? "" : "s", np, cmd[at - 1], np, cmd[at - 1], np - 1);
    cmd[at] = buf;
}

/* Why the command ended, for the restart's count. */
enum { END_CRASH, END_HANG, END_STRAGGLER, END_KINDS };

static int end_kind(int rc, int stale) {
    if (stale || rc == TOOL_EXIT_HUNG)
        return END_HANG;
    return rc == TOOL_EXIT_STRAGGLER ? END_STRAGGLER : END_CRASH;
}

static void report_ends(const int *ends) {
    if (ends[END_CRASH] + ends[END_HANG] + ends[END_STRAGGLER] == 0)
        return;
    printf("kiln run: the command failed %d time%s: %d crash%s, %d hang%s (the watchdog's exit "
           "4 or a stale heartbeat), %d straggler stop%s (exit 5)\n",
           ends[END_CRASH] + ends[END_HANG] + ends[END_STRAGGLER],
           ends[END_CRASH] + ends[END_HANG] + ends[END_STRAGGLER] == 1 ? "" : "s", ends[END_CRASH],
           ends[END_CRASH] == 1 ? "" : "es", ends[END_HANG], ends[END_HANG] == 1 ? "" : "s",
           ends[END_STRAGGLER], ends[END_STRAGGLER] == 1 ? "" : "s");
}

int cmd_run(int argc, char **argv) {
    int64_t restarts = 3, min_ranks = 1;
    double backoff = 1.0, max_backoff = 60.0, stale_s = 0.0, grace_s = 10.0;
    const char *heartbeat = NULL;
    int fewer = 0;
    const tool_flag flags[] = {
        {"restarts", TOOL_FLAG_INT, &restarts, "restarts after a crash before giving up",
         TOOL_MIN(0)},
        {"backoff", TOOL_FLAG_FLOAT, &backoff, "seconds before the first restart (then doubled)",
         TOOL_RANGE(0, 1e6)},
        {"max-backoff", TOOL_FLAG_FLOAT, &max_backoff, "the longest wait between restarts, s",
         TOOL_RANGE(0, 1e6)},
        {"heartbeat", TOOL_FLAG_STRING, &heartbeat,
         "with --stale-s: the heartbeat file to watch (default: the command's --heartbeat, "
         "PATH.rank0 under mpirun -np N > 1)"},
        {"stale-s", TOOL_FLAG_FLOAT, &stale_s,
         "a heartbeat not renewed for this many seconds: kill and restart the command (0: "
         "not watched)",
         TOOL_RANGE(0, 1e7)},
        {"term-grace", TOOL_FLAG_FLOAT, &grace_s,
         "seconds between SIGTERM and SIGKILL to a frozen command", TOOL_RANGE(0, 1e6)},
        {"fewer-ranks", TOOL_FLAG_BOOL, &fewer,
         "restart a failed `mpirun -np N` command on N - 1 ranks (down to --min-ranks)"},
        {"min-ranks", TOOL_FLAG_INT, &min_ranks, "with --fewer-ranks: the fewest ranks",
         TOOL_RANGE(1, 1 << 20)},
    };
    int dash = 1;
    while (dash < argc && strcmp(argv[dash], "--"))
        dash++;
    int npos = 0;
    int rc = tool_flags_parse(flags, sizeof flags / sizeof flags[0], dash, argv, &npos, usage);
    if (rc)
        return rc == TOOL_FLAGS_HELP ? 0 : 2;
    if (npos || dash >= argc - 1) {
        fprintf(stderr, "kiln run: %s (see --help)\n",
                npos ? "arguments before `--`: the command goes after it"
                     : "no command after `--`");
        return 2;
    }
    int n = argc - dash - 1;
    /* the command, and room for `--resume D` and the NULL */
    char **cmd = calloc((size_t)n + 3, sizeof *cmd);
    if (!cmd)
        return 1;
    memcpy(cmd, argv + dash + 1, (size_t)n * sizeof *cmd);
    const char *ckpt = command_flag(cmd, n, "checkpoint-dir");
    const char *metrics = command_flag(cmd, n, "metrics");
    int resumes = command_flag(cmd, n, "resume") != NULL;
    int np_at = rank_count_arg(cmd, n);
    char np_text[32], hb_path[4096];
    hb_watch watch = {NULL, stale_s, grace_s};
    if (stale_s > 0) {
        if (!heartbeat_path(hb_path, sizeof hb_path, heartbeat, cmd, n, np_at)) {
            fprintf(stderr, "kiln run: --stale-s needs a heartbeat file: --heartbeat PATH here, or "
                            "--heartbeat PATH in the command\n");
            free(cmd);
            return 2;
        }
        watch.path = hb_path;
    }
    if (fewer && np_at < 0)
        fprintf(stderr, "kiln run: --fewer-ranks: the command is not `mpirun ... -np N ...`; it "
                        "restarts as it is\n");
    step_times st = {NULL, 0};
    set_handlers(on_signal);
    double t0 = now_ms(), wait_s = backoff;
    int status = 0, done = 0, stale = 0, ends[END_KINDS] = {0};
    for (done = 0;; done++) {
        if (watch.path) /* -np may have changed (--fewer-ranks) */
            heartbeat_path(hb_path, sizeof hb_path, heartbeat, cmd, n, np_at);
        if ((rc = run_child(cmd, &watch, &status, &stale)))
            break;
        if (metrics)
            read_metrics(&st, metrics);
        rc = shell_status(status);
        if (!stale && (rc == 0 || rc == TOOL_EXIT_PREEMPTED || stop_signal))
            break;
        if (!stale && rc == TOOL_EXIT_USAGE) { /* the same arguments would fail the same way */
            fprintf(stderr,
                    "kiln run: the command ended with exit 2, a usage error: its arguments are "
                    "wrong, and running it again would fail the same way; not restarting "
                    "(its message is above)\n");
            break;
        }
        ends[end_kind(rc, stale)]++;
        char what[160];
        describe(what, sizeof what, status);
        if (stale)
            snprintf(what + strlen(what), sizeof what - strlen(what), " after a stale heartbeat");
        else if (rc == TOOL_EXIT_HUNG)
            snprintf(what + strlen(what), sizeof what - strlen(what), " (a hung step)");
        else if (rc == TOOL_EXIT_STRAGGLER)
            snprintf(what + strlen(what), sizeof what - strlen(what), " (a straggling rank)");
        if (done >= restarts || stop_signal) {
            fprintf(stderr, "kiln run: the command ended with %s; giving up after %d restart%s\n",
                    what, done, done == 1 ? "" : "s");
            break;
        }
        if (ckpt && ckpt[0] && !resumes && has_checkpoint(ckpt)) {
            cmd[n] = "--resume";
            cmd[n + 1] = (char *)ckpt;
            resumes = 1;
        }
        fprintf(stderr, "kiln run: the command ended with %s; restart %d of %lld in %.1f s%s\n",
                what, done + 1, (long long)restarts, wait_s,
                cmd[n] ? " (with --resume from its checkpoints)" : "");
        if (fewer && np_at >= 0)
            fewer_ranks(cmd, np_at, min_ranks, np_text, sizeof np_text);
        sleep_s(wait_s);
        wait_s = fmin(wait_s * 2.0, max_backoff);
        if (stop_signal)
            break;
    }
    if (rc == TOOL_EXIT_PREEMPTED)
        fprintf(stderr, "kiln run: the command was preempted (exit 3, its checkpoint written): "
                        "requeue the job to resume it\n");
    report_goodput(&st, metrics, now_ms() - t0, done);
    report_ends(ends);
    free(st.ms);
    free(cmd);
    return rc;
}
