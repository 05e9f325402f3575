/* The trainer's watchdog: a thread that sees each step begin and end, warns when one runs far
 * past the median step, reports a hang (the config's on_hang; the run marked hung, its steps
 * failing with KILN_ERR_HUNG) when one stays stuck, and writes heartbeats; and the per-step exchange of the ranks' compute times that names a straggler.
 * The training thread owns the windows and the straggler state; what the thread reads is
 * under mu. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "kiln/core.h"
#include "train/trainer_feature.h"
#include "train/trainer_internal.h"
#include "train/watchdog.h"

enum { HEALTH_OK, HEALTH_SLOW, HEALTH_HUNG, HEALTH_STRAGGLER };
static const char *const health_names[] = {"ok", "slow", "hung", "straggler"};

struct kiln__watchdog {
    kiln_watchdog_config cfg;
    kiln__trainer_faults faults; /* the hang and the slowness injected (tests) */
    int rank, world;
    int64_t steps;
    int resumed; /* faults are injected in a run that was not resumed: a restart goes past them */
    char *hb_path, *hb_tmp; /* NULL: no heartbeat */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* under mu: what the thread judges and writes */
    int quit, armed, in_step, ended;
    int64_t step;        /* the step in progress (in_step), else the last one done */
    uint64_t seq;        /* progress events so far (a step's beginning or end) */
    uint64_t warned_seq; /* the stall that was warned about (0: none) */
    double progress_ms;  /* kiln_time_ms of the last progress */
    double last_ms, median_ms;
    double allowance; /* the stall's work in median steps (an evaluation's batches; else 1) */
    int samples;
    int straggler_rank; /* -1: none */
    double straggler_ratio;
    double last_write_ms;
    int write_failed; /* a failed heartbeat was reported once */
    /* the training thread's own */
    kiln__window steps_ms;
    double compute_sum; /* ms of compute since the last exchange, and how many steps */
    int compute_n;
    double exchange_ms; /* this step's exchange */
    int exchanged;      /* whether this step exchanged */
    float *rows;        /* straggler_window x world compute times, a ring */
    float *gathered;    /* world */
    int64_t *counts;    /* world ones */
    int nrows, next_row;
    int verdict_rank; /* the last full window's straggler (-1: none) */
    double verdict_ratio;
    int named_rank, named_for;   /* the rank the verdicts named last, how many in a row */
    int flagged_rank, clear_for; /* the straggler warned about; verdicts without it in a row */
    int exit_code;
    /* a hang found: set once by the thread (hang_msg written first), read by the training
     * thread */
    atomic_int hung;
    char hang_msg[512];
};

/* ---- heartbeat ---- */

typedef struct hb_state {
    int64_t step;
    double since_s, last_ms, median_ms, ratio;
    int health, in_step, straggler_rank, ended;
} hb_state;

static double wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int health_of(const kiln__watchdog *wd, int hung) {
    if (hung || atomic_load(&wd->hung))
        return HEALTH_HUNG;
    if (wd->warned_seq != 0 && wd->warned_seq == wd->seq)
        return HEALTH_SLOW;
    return wd->straggler_rank >= 0 ? HEALTH_STRAGGLER : HEALTH_OK;
}

/* Under mu. */
static hb_state snapshot(const kiln__watchdog *wd, double now_ms, int hung) {
    hb_state s = {.step = wd->step,
                  .since_s = (now_ms - wd->progress_ms) / 1e3,
                  .last_ms = wd->last_ms,
                  .median_ms = wd->median_ms,
                  .ratio = wd->straggler_ratio,
                  .health = health_of(wd, hung),
                  .in_step = wd->in_step,
                  .straggler_rank = wd->straggler_rank,
                  .ended = wd->ended};
    return s;
}

static const char *num(char *buf, size_t cap, double v) {
    if (!isfinite(v))
        return "null";
    snprintf(buf, cap, "%.3f", v);
    return buf;
}

/* The whole file under a temporary name, then renamed over the heartbeat: a reader sees the
 * old one or the new one. Returns 0, or errno. */
static int write_heartbeat(const kiln__watchdog *wd, const hb_state *s) {
    char text[1024], a[32], b[32], c[32];
    double now = wall_s();
    int n = snprintf(text, sizeof text,
                     "{\"pid\": %ld, \"rank\": %d, \"world\": %d, \"step\": %lld, \"steps\": %lld, "
                     "\"in_step\": %s, \"progress_time\": %.3f, \"since_progress_s\": %.3f, "
                     "\"last_step_ms\": %s, \"median_step_ms\": %s, \"health\": \"%s\", "
                     "\"straggler_rank\": %d, \"straggler_ratio\": %s, \"ended\": %s, "
                     "\"time\": %.3f}\n",
                     (long)getpid(), wd->rank, wd->world, (long long)s->step, (long long)wd->steps,
                     s->in_step ? "true" : "false", now - s->since_s, s->since_s,
                     num(a, sizeof a, s->last_ms), num(b, sizeof b, s->median_ms),
                     health_names[s->health], s->straggler_rank,
                     num(c, sizeof c, s->straggler_rank >= 0 ? s->ratio : NAN),
                     s->ended ? "true" : "false", now);
    int fd = open(wd->hb_tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return errno;
    ssize_t w = write(fd, text, (size_t)n);
    int e = w == (ssize_t)n ? 0 : w < 0 ? errno : EIO;
    if (close(fd) != 0 && !e)
        e = errno;
    if (!e && rename(wd->hb_tmp, wd->hb_path) != 0)
        e = errno;
    if (e)
        unlink(wd->hb_tmp);
    return e;
}

/* write(2) on stderr: no stdio lock, which a stuck training thread may hold. */
static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n > 0) {
        ssize_t w = write(2, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
        (void)w;
    }
}

/* The heartbeat now (thread or training thread; not under mu). */
static void beat(kiln__watchdog *wd, int hung) {
    if (!wd->hb_path)
        return;
    pthread_mutex_lock(&wd->mu);
    double now = kiln_time_ms();
    hb_state s = snapshot(wd, now, hung);
    wd->last_write_ms = now;
    pthread_mutex_unlock(&wd->mu);
    int e = write_heartbeat(wd, &s);
    pthread_mutex_lock(&wd->mu);
    int tell = e && !wd->write_failed;
    if (e)
        wd->write_failed = 1;
    pthread_mutex_unlock(&wd->mu);
    if (tell)
        say("kiln: warning: watchdog: rank %d cannot write its heartbeat %s: %s (training goes "
            "on)\n",
            wd->rank, wd->hb_path, strerror(e));
}

/* ---- the thread ---- */

static void where(char *buf, size_t cap, const kiln__watchdog *wd) {
    if (wd->in_step)
        snprintf(buf, cap, "in step %lld", (long long)wd->step);
    else if (wd->allowance > 1)
        snprintf(buf, cap, "evaluating after step %lld", (long long)wd->step);
    else
        snprintf(buf, cap, "after step %lld (evaluating, saving or checkpointing)",
                 (long long)wd->step);
}

static void median_text(char *buf, size_t cap, const kiln__watchdog *wd) {
    if (wd->samples >= KILN__WD_MIN_SAMPLES)
        snprintf(buf, cap, "the median step takes %.1f ms", wd->median_ms);
    else
        snprintf(buf, cap, "no median step yet");
}

/* Under mu: judge the stall and warn once. A hang: the heartbeat says so, the run is marked
 * hung, and *h (its message in wd->hang_msg) is filled for the caller to report; returns 1. */
static int judge(kiln__watchdog *wd, double now, kiln_watchdog_hang *h) {
    double elapsed = (now - wd->progress_ms) / 1e3, warn_s, hang_s;
    double expected_ms = wd->median_ms * fmax(1.0, wd->allowance);
    kiln__hang_verdict v =
        kiln__hang_judge(&wd->cfg, elapsed, expected_ms, wd->samples, &warn_s, &hang_s);
    char at[96], med[64];
    where(at, sizeof at, wd);
    median_text(med, sizeof med, wd);
    if (v == KILN__HANG_HUNG) {
        hb_state s = snapshot(wd, now, 1);
        if (wd->hb_path)
            (void)write_heartbeat(wd, &s);
        snprintf(wd->hang_msg, sizeof wd->hang_msg,
                 "kiln: watchdog: rank %d: no progress for %.1f s %s (%s; the limit is %.1f s): "
                 "hung",
                 wd->rank, elapsed, at, med, hang_s);
        *h = (kiln_watchdog_hang){.rank = wd->rank,
                                  .step = wd->step,
                                  .stalled_s = elapsed,
                                  .limit_s = hang_s,
                                  .message = wd->hang_msg};
        wd->armed = 0; /* one report */
        atomic_store(&wd->hung, 1);
        return 1;
    }
    if (v == KILN__HANG_SLOW && wd->warned_seq != wd->seq) {
        wd->warned_seq = wd->seq;
        wd->last_write_ms = -INFINITY; /* the health changed: a heartbeat now */
        say("kiln: warning: watchdog: rank %d: no progress for %.1f s %s, %.0fx the %s of "
            "%.1f ms (hung at %.1f s)\n",
            wd->rank, elapsed, at, elapsed * 1e3 / fmax(expected_ms, 1e-3),
            wd->allowance > 1 ? "time expected" : "median step", expected_ms, hang_s);
    }
    return 0;
}

/* Outside mu: the hang to the program's handler, or on stderr. */
static void report_hang(kiln__watchdog *wd, const kiln_watchdog_hang *h) {
    if (wd->cfg.on_hang)
        wd->cfg.on_hang(h, wd->cfg.on_hang_user); /* kiln train's ends the process here */
    else
        say("%s; the run stops with an error (no hang handler)\n", h->message);
}

static void *watch(void *arg) {
    kiln__watchdog *wd = arg;
    /* often enough for the smallest limits tests use, at most 10 times a second */
    double period = fmin(100.0, fmax(5.0, wd->cfg.hang_min_s * 1e3 / 20));
    if (wd->hb_path)
        period = fmin(period, fmax(5.0, wd->cfg.heartbeat_s * 1e3));
    pthread_mutex_lock(&wd->mu);
    while (!wd->quit) {
        double now = kiln_time_ms();
        kiln_watchdog_hang h;
        if (wd->armed && judge(wd, now, &h)) {
            pthread_mutex_unlock(&wd->mu);
            report_hang(wd, &h);
            pthread_mutex_lock(&wd->mu);
            continue;
        }
        if (wd->hb_path && now - wd->last_write_ms >= wd->cfg.heartbeat_s * 1e3) {
            pthread_mutex_unlock(&wd->mu);
            beat(wd, 0);
            pthread_mutex_lock(&wd->mu);
        }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        long long ns = (long long)ts.tv_nsec + (long long)(period * 1e6);
        ts.tv_sec += (time_t)(ns / 1000000000LL);
        ts.tv_nsec = (long)(ns % 1000000000LL);
        if (!wd->quit)
            pthread_cond_timedwait(&wd->cv, &wd->mu, &ts);
    }
    pthread_mutex_unlock(&wd->mu);
    return NULL;
}

/* ---- start and stop ---- */

/* resumed: a run that goes on from a checkpoint, where the injected faults do not fire (a
 * restart on fewer ranks may no longer have the rank named). */
static kiln_status check_config(const kiln_watchdog_config *c, const kiln__trainer_faults *f,
                                int world, int resumed) {
    if (!(c->warn_factor >= 1.0) || !(c->hang_factor >= c->warn_factor) || !(c->hang_min_s > 0) ||
        c->hang_factor > 1e6 || c->hang_min_s > 1e7)
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "watchdog: the warning factor (%g) must be >= 1, the hang factor "
                               "(%g) at least the warning factor, and the hang minimum (%g s) > 0",
                               c->warn_factor, c->hang_factor, c->hang_min_s);
    if (c->window < KILN__WD_MIN_SAMPLES || c->window > KILN__WD_MAX_WINDOW ||
        c->straggler_window < 3 || c->straggler_window > KILN__WD_MAX_WINDOW)
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "watchdog: the windows (%d steps, %d for stragglers) must be 3..%d",
                               c->window, c->straggler_window, KILN__WD_MAX_WINDOW);
    if (c->heartbeat_path && (!(c->heartbeat_s > 0) || c->heartbeat_s > 1e6))
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "watchdog: the heartbeat interval (%g s) must be "
                               "> 0",
                               c->heartbeat_s);
    if (!(c->straggler_factor == 0 || (c->straggler_factor > 1.0 && c->straggler_factor < 1e6)))
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "watchdog: the straggler factor (%g) must be > 1, "
                               "or 0 (off)",
                               c->straggler_factor);
    if (f->hang_step < 0 ||
        (f->hang_step > 0 && (f->hang_rank < 0 || (f->hang_rank >= world && !resumed))))
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "fault injection: a hang in step %lld of rank %d, but the run has "
                               "%d rank%s (0..%d) and steps from 1",
                               (long long)f->hang_step, f->hang_rank, world,
                               world == 1 ? "" : "s", world - 1);
    if (!(f->slow_ms >= 0) || f->slow_ms > 1e6 ||
        (f->slow_ms > 0 && (f->slow_rank < 0 || (f->slow_rank >= world && !resumed))))
        return kiln_error_setf(KILN_ERR_CONFIG,
                               "fault injection: %g ms more per step on rank %d, but the run has "
                               "%d rank%s (0..%d), and the time must be 0..1e6 ms",
                               f->slow_ms, f->slow_rank, world, world == 1 ? "" : "s",
                               world - 1);
    return KILN_OK;
}

static char *str_printf(const char *fmt, const char *a, int b) {
    int n = snprintf(NULL, 0, fmt, a, b);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s)
        snprintf(s, (size_t)n + 1, fmt, a, b);
    return s;
}

static void wd_free(kiln__watchdog *wd) {
    if (wd->hb_tmp)
        unlink(wd->hb_tmp);
    free(wd->hb_path);
    free(wd->hb_tmp);
    free(wd->rows);
    free(wd->gathered);
    free(wd->counts);
    pthread_cond_destroy(&wd->cv);
    pthread_mutex_destroy(&wd->mu);
    free(wd);
}

kiln_status kiln__watchdog_start(kiln_trainer *t) {
    const kiln_watchdog_config *c = &t->cfg.watchdog;
    t->wd = NULL;
    if (!c->enabled)
        return KILN_OK;
    KILN_CHECK(check_config(c, &t->faults, t->world, t->cfg.checkpoint.resume_path != NULL));
    kiln__watchdog *wd = calloc(1, sizeof *wd);
    if (!wd)
        return kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate the watchdog");
    wd->cfg = *c;
    wd->faults = t->faults;
    wd->rank = t->rank;
    wd->world = t->world;
    wd->steps = t->cfg.steps;
    wd->straggler_rank = wd->verdict_rank = wd->flagged_rank = wd->named_rank = -1;
    wd->median_ms = wd->last_ms = NAN;
    wd->progress_ms = kiln_time_ms();
    wd->last_write_ms = -INFINITY;
    kiln__window_init(&wd->steps_ms, c->window);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&wd->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&wd->mu, NULL);
    kiln_status s = KILN_OK;
    if (t->world > 1) {
        size_t w = (size_t)t->world;
        wd->rows = calloc((size_t)c->straggler_window * w, sizeof *wd->rows);
        wd->gathered = calloc(w, sizeof *wd->gathered);
        wd->counts = calloc(w, sizeof *wd->counts);
        if (!wd->rows || !wd->gathered || !wd->counts) {
            s = kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate the watchdog's windows");
            goto fail;
        }
        for (int r = 0; r < t->world; r++)
            wd->counts[r] = 1;
    }
    if (c->heartbeat_path) {
        wd->hb_path = t->world > 1 ? str_printf("%s.rank%d", c->heartbeat_path, t->rank)
                                   : strdup(c->heartbeat_path);
        wd->hb_tmp = wd->hb_path ? str_printf("%s.tmp.%d", wd->hb_path, (int)getpid()) : NULL;
        if (!wd->hb_path || !wd->hb_tmp) {
            s = kiln_error_setf(KILN_ERR_NOMEM, "cannot allocate the heartbeat's path");
            goto fail;
        }
        hb_state first = snapshot(wd, kiln_time_ms(), 0);
        int e = write_heartbeat(wd, &first); /* a path that cannot be written fails now */
        if (e) {
            s = kiln_error_setf(KILN_ERR_IO, "cannot write the heartbeat file %s: %s", wd->hb_path,
                                strerror(e));
            goto fail;
        }
        wd->last_write_ms = kiln_time_ms();
    }
    if (pthread_create(&wd->thread, NULL, watch, wd) != 0) {
        s = kiln_error_setf(KILN_ERR_IO, "cannot start the watchdog's thread");
        goto fail;
    }
    t->wd = wd;
    return KILN_OK;
fail:
    wd_free(wd);
    return s;
}

void kiln__watchdog_stop(kiln__watchdog *wd) {
    if (!wd)
        return;
    pthread_mutex_lock(&wd->mu);
    wd->quit = 1;
    wd->armed = 0;
    wd->ended = 1;
    pthread_cond_signal(&wd->cv);
    pthread_mutex_unlock(&wd->mu);
    pthread_join(wd->thread, NULL);
    beat(wd, 0); /* the last state, "ended" */
    wd_free(wd);
}

static int exchanges(const kiln__watchdog *wd) {
    return wd && wd->world > 1 && wd->cfg.straggler_factor > 0;
}

kiln_status kiln__watchdog_ready(kiln_trainer *t) {
    if (t->wd)
        t->wd->resumed = t->resumed_step > 0;
    if (t->world < 2)
        return KILN_OK;
    /* this rank's part (exchange or not, and the window) as a float, and every rank's */
    float mine = exchanges(t->wd) ? (float)t->wd->cfg.straggler_window : 0.0f;
    float *all = NULL;
    kiln_status s = kiln__trainer_gather_one(t, mine, &all);
    for (int r = 1; s == KILN_OK && r < t->world; r++)
        if (all[r] != all[0]) {
            char a[64], b[64];
            snprintf(a, sizeof a, all[0] > 0 ? "over %.0f steps" : "not at all", (double)all[0]);
            snprintf(b, sizeof b, all[r] > 0 ? "over %.0f steps" : "not at all", (double)all[r]);
            s = kiln_error_setf(KILN_ERR_CONFIG,
                                "the ranks' watchdogs differ: rank 0 looks for stragglers %s, "
                                "rank %d %s; give every rank the same --straggler-factor, "
                                "--straggler-window and --watchdog",
                                a, r, b);
            break;
        }
    free(all);
    if (t->dp) /* the start's own traffic is not the first step's */
        (void)kiln_dp_take_stats(t->dp);
    return s;
}

int kiln__watchdog_exit_code(kiln__watchdog *wd) {
    if (!wd)
        return 0;
    return atomic_load(&wd->hung) ? KILN_EXIT_HUNG : wd->exit_code;
}

int kiln_trainer_watchdog_exit(const kiln_trainer *t) {
    return kiln__watchdog_exit_code(t->wd);
}

kiln_status kiln__watchdog_check(kiln__watchdog *wd) {
    if (!wd || !atomic_load(&wd->hung))
        return KILN_OK;
    return kiln_error_setf(KILN_ERR_HUNG, "%s", wd->hang_msg + strlen("kiln: "));
}

/* ---- the training thread's hooks ---- */

static void sleep_ms(double ms) {
    struct timespec ts = {(time_t)(ms / 1e3), (long)(fmod(ms, 1e3) * 1e6)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

kiln_status kiln__watchdog_begin(kiln__watchdog *wd, int64_t step) {
    if (!wd)
        return KILN_OK;
    KILN_CHECK(kiln__watchdog_check(wd)); /* a hung run takes no more steps */
    pthread_mutex_lock(&wd->mu);
    wd->step = step;
    wd->in_step = 1;
    wd->allowance = 1;
    wd->armed = 1;
    wd->seq++;
    wd->progress_ms = kiln_time_ms();
    pthread_mutex_unlock(&wd->mu);
    wd->exchanged = 0;
    wd->exchange_ms = 0;
    const kiln__trainer_faults *f = &wd->faults;
    if (wd->resumed)
        return KILN_OK;
    if (f->slow_ms > 0 && f->slow_rank == wd->rank)
        sleep_ms(f->slow_ms);
    if (f->hang_step == step && f->hang_rank == wd->rank) {
        say("kiln: fault injection: rank %d hangs in step %lld\n", wd->rank, (long long)step);
        /* for good (an hour), unless the watchdog marks the run hung and lets the step fail
         * (no handler ended the process) */
        for (int i = 0; i < 360000 && !atomic_load(&wd->hung); i++)
            sleep_ms(10);
    }
    return kiln__watchdog_check(wd);
}

void kiln__watchdog_evaluating(kiln_trainer *t) {
    kiln__watchdog *wd = t->wd;
    if (!wd || !t->val)
        return;
    int64_t n = kiln_loader_batches_per_epoch(t->val);
    if (t->cfg.data.eval_batches > 0 && t->cfg.data.eval_batches < n)
        n = t->cfg.data.eval_batches;
    pthread_mutex_lock(&wd->mu);
    /* a batch's forward pass is a third of a micro-batch's step: 3x to spare */
    wd->allowance = (double)n / (double)(t->micro > 0 ? t->micro : 1);
    wd->seq++;
    wd->progress_ms = kiln_time_ms();
    pthread_mutex_unlock(&wd->mu);
}

kiln_status kiln__watchdog_exchange(kiln_trainer *t, int64_t step) {
    kiln__watchdog *wd = t->wd;
    if (!exchanges(wd))
        return KILN_OK;
    if (t->cfg.dist.local_steps > 0 && !kiln__trainer_local_sync_due(t, step))
        return KILN_OK; /* local SGD's ranks talk at the averages alone */
    /* the mean compute time of the steps since the last exchange (-1: none timed yet) */
    float mine = wd->compute_n > 0 ? (float)(wd->compute_sum / wd->compute_n) : -1.0f;
    wd->compute_sum = 0;
    wd->compute_n = 0;
    double t0 = kiln_time_ms();
    KILN_CHECK(kiln_comm_allgather(&mine, wd->gathered, wd->counts, KILN_DTYPE_F32, t->comm));
    wd->exchange_ms = kiln_time_ms() - t0;
    wd->exchanged = 1;
    for (int r = 0; r < t->world; r++)
        if (!(wd->gathered[r] >= 0))
            return KILN_OK; /* some rank has no time yet */
    int W = wd->cfg.straggler_window;
    memcpy(wd->rows + (size_t)wd->next_row * (size_t)t->world, wd->gathered,
           (size_t)t->world * sizeof *wd->rows);
    wd->next_row = (wd->next_row + 1) % W;
    if (wd->nrows < W)
        wd->nrows++;
    if (wd->nrows == W) /* a whole window: the same verdict on every rank */
        wd->verdict_rank = kiln__straggler_find(wd->rows, W, t->world, wd->cfg.straggler_factor,
                                                &wd->verdict_ratio);
    return KILN_OK;
}

void kiln__watchdog_account(kiln__watchdog *wd, kiln_step_info *mt) {
    if (!wd || !wd->exchanged)
        return;
    double hidden = mt->comm_ms * mt->comm_hidden;
    mt->comm_ms += wd->exchange_ms;
    mt->comm_hidden = mt->comm_ms > 0 ? hidden / mt->comm_ms : 0.0;
}

/* Rank r's median over the window, and the median of the other ranks' medians. */
static void straggler_figures(const kiln__watchdog *wd, int r, double *mine, double *others) {
    double col[KILN__WD_MAX_WINDOW], med[KILN__WD_MAX_WINDOW];
    int k = 0;
    for (int q = 0; q < wd->world; q++) {
        for (int i = 0; i < wd->nrows; i++)
            col[i] = wd->rows[(size_t)i * (size_t)wd->world + (size_t)q];
        double m = kiln__median(col, wd->nrows);
        if (q == r)
            *mine = m;
        else
            med[k++] = m;
    }
    *others = kiln__median(med, k);
}

static kiln_status write_event(kiln_trainer *t, const char *event, int64_t step, int rank,
                               double ratio, double mine, double others) {
    if (!t->metrics)
        return KILN_OK;
    char line[512];
    snprintf(line, sizeof line,
             "{\"event\": \"%s\", \"step\": %lld, \"rank\": %d, \"ratio\": %.4f, "
             "\"factor\": %.4g, \"window\": %d, \"rank_compute_ms\": %.3f, "
             "\"others_compute_ms\": %.3f}",
             event, (long long)step, rank, ratio, t->cfg.watchdog.straggler_factor,
             t->cfg.watchdog.straggler_window, mine, others);
    kiln__metrics_line(t->metrics, line,
                       t->cfg.metrics.log); /* a failed write is kept and retried */
    return KILN_OK;
}

/* After an exchange. A rank named by the verdicts of a whole window of exchanges in a row is
 * a straggler (rank 0 warns, and writes an event); one not named for a whole window is no
 * longer; with straggler_exit, one named for another whole window stops the run. Every rank
 * has the same verdicts, so they all decide alike. */
static kiln_status straggler_step(kiln_trainer *t, int64_t step) {
    kiln__watchdog *wd = t->wd;
    int W = wd->cfg.straggler_window, r = wd->verdict_rank;
    if (wd->nrows < W)
        return KILN_OK;
    wd->named_for = r >= 0 && r == wd->named_rank ? wd->named_for + 1 : r >= 0;
    wd->named_rank = r;
    wd->clear_for = wd->flagged_rank >= 0 && r != wd->flagged_rank ? wd->clear_for + 1 : 0;
    double mine = 0, others = 0;
    if (r >= 0 && r != wd->flagged_rank && wd->named_for >= W) {
        straggler_figures(wd, r, &mine, &others);
        if (t->rank == 0)
            say("kiln: warning: watchdog: rank %d is a straggler: its compute time per step is "
                "%.2fx the other ranks' (median over the last %d exchanges: %.1f ms against "
                "%.1f ms); --rank-batches gives a slower rank fewer micro-batches%s\n",
                r, wd->verdict_ratio, W, mine, others,
                wd->cfg.straggler_exit ? "; the run ends if it stays one for another window" : "");
        KILN_CHECK(write_event(t, "straggler", step, r, wd->verdict_ratio, mine, others));
        wd->flagged_rank = r;
        wd->clear_for = 0;
    } else if (wd->flagged_rank >= 0 && wd->clear_for >= W) {
        straggler_figures(wd, wd->flagged_rank, &mine, &others);
        if (t->rank == 0)
            say("kiln: watchdog: rank %d is no longer a straggler (median %.1f ms against the "
                "other ranks' %.1f ms)\n",
                wd->flagged_rank, mine, others);
        KILN_CHECK(
            write_event(t, "straggler_end", step, wd->flagged_rank, mine / others, mine, others));
        wd->flagged_rank = -1;
    }
    pthread_mutex_lock(&wd->mu);
    wd->straggler_rank = wd->flagged_rank;
    wd->straggler_ratio = wd->verdict_ratio;
    pthread_mutex_unlock(&wd->mu);
    if (wd->cfg.straggler_exit && wd->flagged_rank >= 0 && wd->named_rank == wd->flagged_rank &&
        wd->named_for >= 2 * W) {
        if (t->rank == 0)
            say("kiln: watchdog: rank %d has stayed a straggler (%.2fx) for another %d exchanges: "
                "ending the run after step %lld with status %d (restart it on fewer ranks, or "
                "with --rank-batches)\n",
                wd->flagged_rank, wd->verdict_ratio, W, (long long)step, KILN_EXIT_STRAGGLER);
        wd->exit_code = KILN_EXIT_STRAGGLER;
        t->stopping = 1;
    }
    return KILN_OK;
}

kiln_status kiln__watchdog_end(kiln_trainer *t, const kiln_step_info *mt) {
    kiln__watchdog *wd = t->wd;
    if (!wd)
        return KILN_OK;
    if (mt->step > t->resumed_step + 1) { /* this process's first step warms caches: left out */
        kiln__window_push(&wd->steps_ms, mt->ms);
        double waited = mt->comm_ms * (1.0 - mt->comm_hidden);
        wd->compute_sum += fmax(0.0, mt->ms - waited);
        wd->compute_n++;
    }
    double median = kiln__window_median(&wd->steps_ms);
    pthread_mutex_lock(&wd->mu);
    int was_warned = wd->warned_seq != 0 && wd->warned_seq == wd->seq;
    double took = (kiln_time_ms() - wd->progress_ms) / 1e3;
    wd->in_step = 0;
    wd->allowance = 1;
    wd->seq++;
    wd->progress_ms = kiln_time_ms();
    wd->last_ms = mt->ms;
    wd->median_ms = median;
    wd->samples = wd->steps_ms.n;
    wd->armed = mt->step < wd->steps; /* after the last step there is nothing to watch */
    pthread_mutex_unlock(&wd->mu);
    if (was_warned)
        say("kiln: watchdog: rank %d: step %lld finished after %.1f s\n", t->rank,
            (long long)mt->step, took);
    if (wd->exchanged)
        KILN_CHECK(straggler_step(t, mt->step));
    return KILN_OK;
}

/* ---- the watchdog as a feature of the trainer (trainer_feature.h) ---- */

static kiln_status wd_step_begin(kiln_trainer *t, int64_t step) {
    return kiln__watchdog_begin(t->wd, step);
}

/* A step that comes back after the thread found a hang fails. */
static kiln_status wd_after_update(kiln_trainer *t, int64_t step, int updated) {
    (void)step;
    (void)updated;
    return kiln__watchdog_check(t->wd);
}

static kiln_status wd_figures(kiln_trainer *t, kiln_step_info *mt) {
    kiln__watchdog_account(t->wd, mt);
    return KILN_OK;
}

static kiln_status wd_step_end(kiln_trainer *t, const kiln_step_info *mt, int *done) {
    (void)done;
    return kiln__watchdog_end(t, mt);
}

static void wd_feature_free(kiln_trainer *t) {
    kiln__watchdog_stop(t->wd);
    t->wd = NULL;
}

const kiln__feature kiln__feature_watchdog = {
    .name = "watchdog",
    .start = kiln__watchdog_start,
    .ready = kiln__watchdog_ready,
    .step_begin = wd_step_begin,
    .after_update = wd_after_update,
    .step_sync = kiln__watchdog_exchange,
    .step_figures = wd_figures,
    .step_end = wd_step_end,
    .before_eval = kiln__watchdog_evaluating,
    .free = wd_feature_free,
};
