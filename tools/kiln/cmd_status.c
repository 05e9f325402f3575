/* kiln status: a running training's health from its heartbeat files (kiln train --heartbeat
 * PATH writes PATH, or PATH.rank<R> for each rank of several), for a person or for cron and a
 * scheduler's health check: the exit status says whether every rank is alive and progressing. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "commands.h"
#include "flags.h"
#include "kiln/core.h"
#include "tool_common.h"

static const char *usage =
    "usage: kiln status [flags] HEARTBEAT\n\n"
    "Reads the heartbeat files of a training started with --heartbeat HEARTBEAT (HEARTBEAT\n"
    "itself for one process, HEARTBEAT.rank<R> for each rank under mpirun; a folder: every\n"
    "heartbeat file in it) and prints each rank's step, health, time since its last progress\n"
    "and last step time, and the run's expected end. Exit status: 0 when every rank is healthy\n"
    "(or the run ended), 1 when a rank is hung, its heartbeat is stale (not renewed for\n"
    "--stale-s seconds), or a rank's file is missing, 2 when no heartbeat could be read.";

enum { MAX_RANKS = 4096 };

typedef struct beat {
    int have;
    long pid;
    int rank, world, in_step, ended, straggler_rank;
    long long step, steps;
    double since_progress, last_ms, median_ms, time, straggler_ratio;
    char health[16];
    char path[4096];
} beat;

static double num_or_nan(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* One heartbeat file into b; 0 when it is not one (or cannot be read: why in *why). */
static int read_beat(const char *path, beat *b, char *why, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(why, cap, "%s: %s", path, strerror(errno));
        return 0;
    }
    char text[4096];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    cJSON *j = cJSON_Parse(text);
    const cJSON *rank = cJSON_GetObjectItemCaseSensitive(j, "rank");
    const cJSON *health = cJSON_GetObjectItemCaseSensitive(j, "health");
    if (!cJSON_IsObject(j) || !cJSON_IsNumber(rank) || !cJSON_IsString(health) ||
        !cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(j, "time"))) {
        snprintf(why, cap, "%s is not a kiln heartbeat file", path);
        cJSON_Delete(j);
        return 0;
    }
    memset(b, 0, sizeof *b);
    b->have = 1;
    b->rank = rank->valueint;
    b->world = (int)num_or_nan(j, "world");
    b->pid = (long)num_or_nan(j, "pid");
    b->step = (long long)num_or_nan(j, "step");
    b->steps = (long long)num_or_nan(j, "steps");
    b->since_progress = num_or_nan(j, "since_progress_s");
    b->last_ms = num_or_nan(j, "last_step_ms");
    b->median_ms = num_or_nan(j, "median_step_ms");
    b->time = num_or_nan(j, "time");
    b->straggler_rank = (int)num_or_nan(j, "straggler_rank");
    b->straggler_ratio = num_or_nan(j, "straggler_ratio");
    b->in_step = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "in_step"));
    b->ended = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "ended"));
    snprintf(b->health, sizeof b->health, "%s", health->valuestring);
    snprintf(b->path, sizeof b->path, "%s", path);
    cJSON_Delete(j);
    if (b->world < 1 || b->world > MAX_RANKS || b->rank < 0 || b->rank >= b->world) {
        snprintf(why, cap, "%s: rank %d of %d is not a rank of a run", path, b->rank, b->world);
        return 0;
    }
    return 1;
}

static double wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static const char *duration(char *buf, size_t cap, double s) {
    if (!isfinite(s))
        snprintf(buf, cap, "-");
    else if (s < 1)
        snprintf(buf, cap, "%.0f ms", s * 1e3);
    else if (s < 60)
        snprintf(buf, cap, "%.1f s", s);
    else if (s < 3600)
        snprintf(buf, cap, "%lld:%02lld", (long long)s / 60, (long long)s % 60);
    else
        snprintf(buf, cap, "%lld:%02lld:%02lld", (long long)s / 3600, (long long)s / 60 % 60,
                 (long long)s % 60);
    return buf;
}

/* Every heartbeat file of the run: PATH (one process), PATH.rank<R>, or a folder's. */
static int gather(const char *path, beat *beats, int *world, char *why, size_t cap) {
    struct stat sb;
    int found = 0;
    *world = 0;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        DIR *d = opendir(path);
        struct dirent *e;
        while (d && (e = readdir(d))) {
            char p[8192];
            beat b;
            if (e->d_name[0] == '.' || strstr(e->d_name, ".tmp."))
                continue;
            snprintf(p, sizeof p, "%s/%s", path, e->d_name);
            char ignore[512];
            if (read_beat(p, &b, ignore, sizeof ignore) && !beats[b.rank].have) {
                beats[b.rank] = b;
                *world = b.world > *world ? b.world : *world;
                found++;
            }
        }
        if (d)
            closedir(d);
        if (!found)
            snprintf(why, cap, "%s holds no kiln heartbeat file", path);
        return found;
    }
    beat b;
    if (stat(path, &sb) == 0) {
        if (!read_beat(path, &b, why, cap))
            return 0;
        beats[b.rank] = b;
        *world = b.world;
        return 1;
    }
    char p[8192];
    snprintf(p, sizeof p, "%s.rank0", path); /* several ranks: rank 0's tells how many */
    if (!read_beat(p, &b, why, cap)) {
        if (errno == ENOENT)
            snprintf(why, cap, "no heartbeat at %s (nor %s.rank0): is the run started with "
                               "--heartbeat %s?",
                     path, path, path);
        return 0;
    }
    beats[0] = b;
    *world = b.world;
    found = 1;
    for (int r = 1; r < *world; r++) {
        char ignore[512];
        snprintf(p, sizeof p, "%s.rank%d", path, r);
        if (read_beat(p, &b, ignore, sizeof ignore) && b.rank == r) {
            beats[r] = b;
            found++;
        }
    }
    return found;
}

int cmd_status(int argc, char **argv) {
    double stale_s = 30.0;
    const tool_flag flags[] = {
        {"stale-s", TOOL_FLAG_FLOAT, &stale_s,
         "a heartbeat not renewed for this many seconds is stale: its process is stopped or gone "
         "(kiln train renews it every --heartbeat-s, 5 s)"},
    };
    int npos = 0;
    int rc = tool_flags_parse(flags, (int)(sizeof flags / sizeof flags[0]), argc, argv, &npos,
                              usage);
    if (rc == TOOL_FLAGS_HELP)
        return 0;
    if (rc != TOOL_FLAGS_OK)
        return TOOL_EXIT_USAGE;
    if (npos != 1) {
        fprintf(stderr, "kiln status: give one heartbeat path (see kiln status --help)\n");
        return TOOL_EXIT_USAGE;
    }
    if (!(stale_s > 0) || stale_s > 1e7) {
        fprintf(stderr, "kiln status: --stale-s %g: must be > 0 and at most 1e7\n", stale_s);
        return TOOL_EXIT_USAGE;
    }
    beat *beats = calloc(MAX_RANKS, sizeof *beats);
    if (!beats) {
        fprintf(stderr, "kiln status: out of memory\n");
        return 1;
    }
    char why[8400] = "";
    int world = 0;
    if (!gather(argv[1], beats, &world, why, sizeof why)) {
        fprintf(stderr, "kiln status: %s\n", why);
        free(beats);
        return 2;
    }
    double now = wall_now();
    int bad = 0, ended = 0, present = 0;
    double eta = 0.0;
    long long step_min = -1, steps = 0;
    printf("%-5s %-8s %12s %-10s %14s %12s %12s %10s\n", "rank", "pid", "step", "health",
           "since progress", "last step", "median step", "heartbeat");
    for (int r = 0; r < world; r++) {
        const beat *b = &beats[r];
        if (!b->have) {
            printf("%-5d %-8s %12s %-10s   (no heartbeat file)\n", r, "-", "-", "missing");
            bad = 1;
            continue;
        }
        present++;
        double age = now - b->time;
        int stale = !b->ended && age > stale_s;
        const char *health = b->ended ? "ended" : stale ? "stale" : b->health;
        if (!b->ended && (stale || !strcmp(b->health, "hung")))
            bad = 1;
        ended += b->ended;
        char st[48], a[32], c[32], d[32], e[32];
        snprintf(st, sizeof st, "%lld/%lld", b->step, b->steps);
        printf("%-5d %-8ld %12s %-10s %14s %12s %12s %10s\n", r, b->pid, st, health,
               duration(a, sizeof a, b->ended ? NAN : b->since_progress + age),
               duration(c, sizeof c, b->last_ms / 1e3), duration(d, sizeof d, b->median_ms / 1e3),
               duration(e, sizeof e, age));
        if (step_min < 0 || b->step < step_min)
            step_min = b->step;
        steps = b->steps;
        double left = (double)(b->steps - b->step) * b->median_ms / 1e3;
        if (isfinite(left) && left > eta)
            eta = left;
        if (b->straggler_rank >= 0 && isfinite(b->straggler_ratio) && r == 0)
            printf("      rank %d is a straggler: %.2fx the others' compute time per step\n",
                   b->straggler_rank, b->straggler_ratio);
    }
    if (ended == present && !bad) {
        printf("the run ended\n");
    } else if (step_min >= 0 && steps > 0) {
        char a[32], when[64] = "";
        time_t end = (time_t)(now + eta);
        struct tm tm;
        if (localtime_r(&end, &tm))
            strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S %Z", &tm);
        if (eta > 0)
            printf("step %lld of %lld; expected end: %s (%s from now, at the median step "
                   "time)\n",
                   step_min, steps, when, duration(a, sizeof a, eta));
        else
            printf("step %lld of %lld; the time left is not known yet (no step timed)\n",
                   step_min, steps);
    }
    if (bad)
        fprintf(stderr, "kiln status: unhealthy: a rank is hung, stale or missing (see above)\n");
    free(beats);
    return bad ? 1 : 0;
}
