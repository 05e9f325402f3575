/* kiln report's input: runs from metrics files (kiln train --metrics), folders of them, and
 * checkpoint folders (--checkpoint-dir) whose state.json gives a run's configuration. What
 * cannot be read is skipped with a note saying what and why; the rest is kept. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln/core.h"
#include "report.h"

enum {
    LINE_NOTES_MAX = 5,   /* notes naming one line, a file; then a count of the rest */
    UNKNOWN_KEYS_MAX = 8, /* unknown keys named, a file */
    STATE_MAX = 64 << 20, /* state.json's bytes at most */
};

void report_note(report_set *set, const char *fmt, ...) {
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    if (set->nnotes == set->notes_cap) {
        int cap = set->notes_cap ? 2 * set->notes_cap : 16;
        char **p = realloc(set->notes, (size_t)cap * sizeof *p);
        if (!p)
            return;
        set->notes = p;
        set->notes_cap = cap;
    }
    char *s = strdup(text);
    if (s)
        set->notes[set->nnotes++] = s;
}

static void run_free(report_run *r) {
    if (!r)
        return;
    free(r->name);
    free(r->source);
    free(r->metrics);
    free(r->state_path);
    cJSON_Delete(r->state);
    free(r->step);
    for (int s = 0; s < REPORT_NSERIES; s++)
        free(r->v[s]);
    for (int64_t i = 0; i < r->nev; i++) {
        free(r->ev[i].name);
        free(r->ev[i].text);
    }
    free(r->ev);
    free(r);
}

void report_set_free(report_set *set) {
    for (int i = 0; i < set->n; i++)
        run_free(set->runs[i]);
    free(set->runs);
    for (int i = 0; i < set->nnotes; i++)
        free(set->notes[i]);
    free(set->notes);
    memset(set, 0, sizeof *set);
}

static report_run *run_new(const char *source) {
    report_run *r = calloc(1, sizeof *r);
    if (r && !(r->source = strdup(source))) {
        free(r);
        r = NULL;
    }
    return r;
}

static int set_add(report_set *set, report_run *r) {
    if (set->n == set->cap) {
        int cap = set->cap ? 2 * set->cap : 8;
        report_run **p = realloc(set->runs, (size_t)cap * sizeof *p);
        if (!p)
            return -1;
        set->runs = p;
        set->cap = cap;
    }
    set->runs[set->n++] = r;
    return 0;
}

/* Room for one more kept step. */
static int run_grow(report_run *r) {
    if (r->n < r->cap)
        return 0;
    int64_t cap = r->cap ? 2 * r->cap : 256;
    int64_t *st = realloc(r->step, (size_t)cap * sizeof *st);
    if (!st)
        return -1;
    r->step = st;
    for (int s = 0; s < REPORT_NSERIES; s++) {
        double *v = realloc(r->v[s], (size_t)cap * sizeof *v);
        if (!v)
            return -1;
        r->v[s] = v;
    }
    r->cap = cap;
    return 0;
}

static const struct {
    const char *name;
    report_event_kind kind;
} event_names[] = {
    {"skip", REPORT_EV_SKIP},           {"rollback", REPORT_EV_ROLLBACK},
    {"warning", REPORT_EV_WARNING},     {"clipped_spike", REPORT_EV_CLIPPED},
    {"straggler", REPORT_EV_STRAGGLER}, {"straggler_end", REPORT_EV_STRAGGLER_END},
    {"prune", REPORT_EV_PRUNE},         {"rank_batches", REPORT_EV_REBALANCE},
};

const char *report_event_label(report_event_kind k) {
    static const char *labels[REPORT_EV_NKINDS] = {
        [REPORT_EV_SKIP] = "guard skip",
        [REPORT_EV_ROLLBACK] = "rollback",
        [REPORT_EV_WARNING] = "guard warning",
        [REPORT_EV_CLIPPED] = "clipped spike",
        [REPORT_EV_OVERFLOW] = "fp16 overflow",
        [REPORT_EV_STRAGGLER] = "straggler",
        [REPORT_EV_STRAGGLER_END] = "straggler end",
        [REPORT_EV_RESTART] = "restart",
        [REPORT_EV_PRUNE] = "prune",
        [REPORT_EV_REBALANCE] = "rank rebalance",
        [REPORT_EV_OTHER] = "other event",
    };
    return labels[k];
}

static int add_event(report_run *r, int64_t step, report_event_kind kind, const char *name,
                     const char *text) {
    if (r->nev == r->evcap) {
        int64_t cap = r->evcap ? 2 * r->evcap : 32;
        report_event *p = realloc(r->ev, (size_t)cap * sizeof *p);
        if (!p)
            return -1;
        r->ev = p;
        r->evcap = cap;
    }
    report_event *e = &r->ev[r->nev];
    e->step = step;
    e->kind = kind;
    e->name = strdup(name);
    e->text = strdup(text);
    if (!e->name || !e->text) {
        free(e->name);
        free(e->text);
        return -1;
    }
    r->nev++;
    r->count[kind]++;
    return 0;
}

/* The keys of a step line, and the series each fills (-1: read elsewhere or not plotted). */
static const struct {
    const char *key;
    int series;
} step_keys[] = {
    {"step", -1},
    {"loss", REPORT_LOSS},
    {"lr", REPORT_LR},
    {"grad_norm", REPORT_GRAD_NORM},
    {"ms", REPORT_MS},
    {"tokens_per_s", REPORT_TOKENS_PER_S},
    {"mfu", REPORT_MFU},
    {"peak_rss_mb", REPORT_RSS},
    {"val_loss", REPORT_VAL_LOSS},
    {"loss_scale", REPORT_LOSS_SCALE},
    {"skipped", -1},
    {"skipped_total", -1},
    {"guard", -1},
    {"z", -1},
    {"clipped_spike", -1},
    {"world", -1},
    {"comm_ms", REPORT_COMM_MS},
    {"comm_hidden", REPORT_COMM_HIDDEN},
    {"comm_bytes", -1},
    {"net_bytes", -1},
    {"elapsed_s", REPORT_ELAPSED},
};

/* What one file's reading has seen so far. */
typedef struct reader {
    report_set *set;
    report_run *run;
    const char *path;
    int64_t line;       /* 1-based, of the line being read */
    int64_t last_step;  /* the last step line's step (0: none yet) */
    int rolled;         /* a rollback event since that line */
    double seg_elapsed; /* this process's latest elapsed_s */
    int64_t bad_lines;  /* lines skipped */
    char unknown[UNKNOWN_KEYS_MAX][48];
    int nunknown, more_unknown;
} reader;

static void line_note(reader *rd, const char *why) {
    if (++rd->bad_lines <= LINE_NOTES_MAX)
        report_note(rd->set, "%s: line %lld: %s: skipped", rd->path, (long long)rd->line, why);
}

static void unknown_key(reader *rd, const char *key) {
    for (int i = 0; i < rd->nunknown; i++)
        if (!strcmp(rd->unknown[i], key))
            return;
    if (rd->nunknown == UNKNOWN_KEYS_MAX) {
        rd->more_unknown = 1;
        return;
    }
    snprintf(rd->unknown[rd->nunknown++], sizeof rd->unknown[0], "%s", key);
}

/* An event's fields other than "event" and "step", as "key value, ...". */
static void event_text(const cJSON *j, char *out, size_t cap) {
    size_t at = 0;
    out[0] = '\0';
    for (const cJSON *c = j->child; c && at + 1 < cap; c = c->next) {
        if (!c->string || !strcmp(c->string, "event") || !strcmp(c->string, "step"))
            continue;
        char v[160];
        if (cJSON_IsNumber(c))
            snprintf(v, sizeof v, "%.6g", c->valuedouble);
        else if (cJSON_IsString(c))
            snprintf(v, sizeof v, "%s", c->valuestring);
        else {
            char *p = cJSON_PrintUnformatted(c);
            snprintf(v, sizeof v, "%s", p ? p : "?");
            free(p);
        }
        at += (size_t)snprintf(out + at, cap - at, "%s%s %s", at ? ", " : "", c->string, v);
    }
}

static int read_event(reader *rd, const cJSON *j, const char *name) {
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "step");
    int64_t step = cJSON_IsNumber(st) && st->valuedouble >= 0 && st->valuedouble <= 9.0e15
                       ? (int64_t)st->valuedouble
                       : -1;
    report_event_kind kind = REPORT_EV_OTHER;
    for (size_t i = 0; i < sizeof event_names / sizeof event_names[0]; i++)
        if (!strcmp(name, event_names[i].name))
            kind = event_names[i].kind;
    if (kind == REPORT_EV_ROLLBACK)
        rd->rolled = 1;
    char text[512];
    event_text(j, text, sizeof text);
    return add_event(rd->run, step, kind, name, text);
}

/* A step line: kept at the end of the run, after the steps before it (a step run again
 * replaces its earlier line and those after it). */
static int read_step(reader *rd, const cJSON *j, int64_t step) {
    report_run *r = rd->run;
    if (rd->last_step > 0 && step <= rd->last_step && !rd->rolled) {
        char text[160];
        snprintf(text, sizeof text, "a new process went on from step %lld after step %lld",
                 (long long)step - 1, (long long)rd->last_step);
        if (add_event(r, step, REPORT_EV_RESTART, "restart", text))
            return -1;
        r->elapsed += rd->seg_elapsed;
        rd->seg_elapsed = 0;
    }
    rd->last_step = step;
    rd->rolled = 0;
    int64_t lo = 0, hi = r->n; /* the first kept step >= step: replaced from there */
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (r->step[mid] < step)
            lo = mid + 1;
        else
            hi = mid;
    }
    r->n = lo;
    if (run_grow(r))
        return -1;
    int64_t i = r->n++;
    r->step[i] = step;
    for (int s = 0; s < REPORT_NSERIES; s++)
        r->v[s][i] = NAN;
    int skipped = 0, guard = 0;
    for (const cJSON *c = j->child; c; c = c->next) {
        if (!c->string)
            continue;
        size_t k = 0, nk = sizeof step_keys / sizeof step_keys[0];
        while (k < nk && strcmp(c->string, step_keys[k].key))
            k++;
        if (k == nk) {
            unknown_key(rd, c->string);
            continue;
        }
        if (step_keys[k].series >= 0 && cJSON_IsNumber(c) && isfinite(c->valuedouble))
            r->v[step_keys[k].series][i] = c->valuedouble;
        if (!strcmp(c->string, "skipped"))
            skipped = cJSON_IsNumber(c) && c->valuedouble != 0;
        if (!strcmp(c->string, "guard"))
            guard = 1;
    }
    r->step_lines++;
    if (isfinite(r->v[REPORT_MS][i]))
        r->ms_all += r->v[REPORT_MS][i];
    if (isfinite(r->v[REPORT_ELAPSED][i]))
        rd->seg_elapsed = r->v[REPORT_ELAPSED][i];
    /* an fp16 overflow is told by its step line alone; a guard's skip has its own event */
    if (skipped && !guard &&
        add_event(r, step, REPORT_EV_OVERFLOW, "overflow",
                  "the loss scale overflowed: the step's update was skipped"))
        return -1;
    return 0;
}

/* One line of a metrics file (its newline gone); cut: the file ended without one. */
static int read_line(reader *rd, char *line, size_t len, int cut) {
    while (len > 0 && (line[len - 1] == '\r' || line[len - 1] == ' '))
        line[--len] = '\0';
    if (len == 0)
        return 0;
    cJSON *j = cJSON_ParseWithLength(line, len);
    if (!cJSON_IsObject(j)) {
        char why[128];
        if (cut)
            snprintf(why, sizeof why, "the last line is cut (%zu bytes, no newline at the end)",
                     len);
        else
            snprintf(why, sizeof why, "not a JSON object");
        line_note(rd, why);
        cJSON_Delete(j);
        return 0;
    }
    const cJSON *ev = cJSON_GetObjectItemCaseSensitive(j, "event");
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "step");
    int rc = 0;
    if (cJSON_IsString(ev))
        rc = read_event(rd, j, ev->valuestring);
    else if (cJSON_IsNumber(st) && st->valuedouble >= 0 && st->valuedouble <= 9.0e15 &&
             st->valuedouble == floor(st->valuedouble))
        rc = read_step(rd, j, (int64_t)st->valuedouble);
    else
        line_note(rd, "neither a step (a whole \"step\" number) nor an event");
    cJSON_Delete(j);
    return rc;
}

static void close_reader(reader *rd) {
    report_run *r = rd->run;
    r->elapsed += rd->seg_elapsed;
    for (int64_t i = 0; i < r->n; i++)
        for (int s = 0; s < REPORT_NSERIES; s++)
            if (isfinite(r->v[s][i]))
                r->has[s] = 1;
    if (rd->bad_lines > LINE_NOTES_MAX)
        report_note(rd->set, "%s: %lld more lines skipped (not kiln metrics)", rd->path,
                    (long long)(rd->bad_lines - LINE_NOTES_MAX));
    if (rd->nunknown) {
        char keys[512];
        size_t at = 0;
        keys[0] = '\0';
        for (int i = 0; i < rd->nunknown && at < sizeof keys; i++)
            at += (size_t)snprintf(keys + at, sizeof keys - at, "%s%s", i ? ", " : "",
                                   rd->unknown[i]);
        report_note(rd->set,
                    "%s: keys this kiln does not know (from a newer kiln?) were "
                    "ignored: %s%s",
                    rd->path, keys, rd->more_unknown ? " and more" : "");
    }
    for (int64_t i = 0; i < r->nev; i++)
        if (r->ev[i].kind == REPORT_EV_OTHER) {
            report_note(rd->set,
                        "%s: events of a kind this kiln does not know (\"%s\"...) are "
                        "listed as they are",
                        rd->path, r->ev[i].name);
            break;
        }
}

/* A metrics file into r. 1 when it held a step or an event, 0 when nothing (noted), -1
 * when out of memory. */
static int read_metrics(report_set *set, report_run *r, const char *path) {
    int fd = -1;
    uint64_t size = 0;
    kiln_status st = kiln_file_open_regular(path, &fd, &size);
    if (st != KILN_OK) {
        report_note(set, "%s: %s: skipped", path, kiln_error_message());
        return 0;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        report_note(set, "%s: %s: skipped", path, strerror(errno));
        close(fd);
        return 0;
    }
    if (!(r->metrics = strdup(path))) {
        fclose(f);
        return -1;
    }
    reader rd = {.set = set, .run = r, .path = path};
    char *line = NULL;
    size_t lcap = 0;
    ssize_t len;
    int rc = 0;
    while (rc == 0 && (len = getline(&line, &lcap, f)) >= 0) {
        rd.line++;
        int cut = len == 0 || line[len - 1] != '\n';
        if (!cut)
            line[--len] = '\0';
        rc = read_line(&rd, line, (size_t)len, cut);
    }
    int err = ferror(f) ? errno : 0;
    free(line);
    fclose(f);
    if (rc)
        return -1;
    close_reader(&rd);
    if (err)
        report_note(set, "%s: reading stopped at line %lld: %s", path, (long long)rd.line,
                    strerror(err));
    if (r->n == 0 && r->nev == 0) {
        if (size == 0)
            report_note(set,
                        "%s: the file is empty (a run that has not written a step yet?): "
                        "skipped",
                        path);
        else
            report_note(set, "%s: no step or event of kiln's metrics in it: skipped", path);
        return 0;
    }
    return 1;
}

static int is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int is_file(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* A folder's entries, sorted by name (hidden ones left out); NULL when it cannot be read. */
static char **list_dir(const char *dir, int *n) {
    *n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return NULL;
    char **names = NULL;
    int cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 32;
            char **p = realloc(names, (size_t)cap * sizeof *p);
            if (!p)
                break;
            names = p;
        }
        if (!(names[*n] = strdup(e->d_name)))
            break;
        (*n)++;
    }
    closedir(d);
    if (!names)
        names = calloc(1, sizeof *names);
    for (int i = 1; i < *n; i++) /* insertion sort: a folder holds few files */
        for (int k = i; k > 0 && strcmp(names[k - 1], names[k]) > 0; k--) {
            char *t = names[k];
            names[k] = names[k - 1];
            names[k - 1] = t;
        }
    return names;
}

static void free_list(char **names, int n) {
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

static int ends_with(const char *s, const char *end) {
    size_t a = strlen(s), b = strlen(end);
    return a >= b && !strcmp(s + a - b, end);
}

/* The state.json of a checkpoint folder's newest step, into path (cap bytes): the folder's
 * own (a step folder), the one `latest` names, else the highest step_N holding one. 0 when
 * the folder is no checkpoint folder. */
static int find_state(const char *dir, char *path, size_t cap) {
    snprintf(path, cap, "%s/state.json", dir);
    if (is_file(path))
        return 1;
    char latest[4096], name[256] = "";
    snprintf(latest, sizeof latest, "%s/latest", dir);
    FILE *f = fopen(latest, "r");
    if (f) {
        if (!fgets(name, sizeof name, f))
            name[0] = '\0';
        fclose(f);
        name[strcspn(name, "\r\n")] = '\0';
        snprintf(path, cap, "%s/%s/state.json", dir, name);
        if (name[0] && !strchr(name, '/') && is_file(path))
            return 1;
    }
    int n = 0, found = 0;
    char **names = list_dir(dir, &n);
    for (int i = n - 1; i >= 0 && !found; i--) { /* step_%08lld: the last name is the newest */
        if (strncmp(names[i], "step_", 5))
            continue;
        snprintf(path, cap, "%s/%s/state.json", dir, names[i]);
        found = is_file(path);
    }
    free_list(names, n);
    return found;
}

/* A checkpoint's state.json into r->state. 1 when read, 0 when not (noted), -1 no memory. */
static int read_state(report_set *set, report_run *r, const char *path) {
    char *text = NULL;
    size_t len = 0;
    if (kiln_file_read(path, STATE_MAX, &text, &len) != KILN_OK) {
        report_note(set, "%s: %s: the run's configuration is not shown", path,
                    kiln_error_message());
        return 0;
    }
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(j, "format");
    if (!cJSON_IsObject(j) || !cJSON_IsString(fmt) || strcmp(fmt->valuestring, "kiln-checkpoint")) {
        report_note(set,
                    "%s: not a kiln checkpoint's state.json: the run's configuration is "
                    "not shown",
                    path);
        cJSON_Delete(j);
        return 0;
    }
    if (!(r->state_path = strdup(path))) {
        cJSON_Delete(j);
        return -1;
    }
    r->state = j;
    return 1;
}

/* A folder: each metrics file (*.jsonl) in it is a run; a checkpoint (the folder itself or a
 * folder in it) gives its configuration to the folder's one run. */
static int read_folder(report_set *set, const char *dir) {
    char state[8192] = "";
    int have_state = find_state(dir, state, sizeof state), nstates = have_state;
    int n = 0, runs = 0, rc = 0;
    char **names = list_dir(dir, &n);
    if (!names) {
        report_note(set, "%s: cannot read the folder: %s: skipped", dir, strerror(errno));
        return 0;
    }
    for (int i = 0; i < n && !have_state; i++) {
        char sub[8192], p[8192];
        snprintf(sub, sizeof sub, "%s/%s", dir, names[i]);
        if (is_dir(sub) && find_state(sub, p, sizeof p)) {
            if (nstates++ == 0)
                snprintf(state, sizeof state, "%s", p);
        }
    }
    int first = set->n;
    for (int i = 0; i < n && rc >= 0; i++) {
        char p[8192];
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        if (!ends_with(names[i], ".jsonl") || !is_file(p))
            continue;
        report_run *r = run_new(dir);
        if (!r) {
            rc = -1;
            break;
        }
        rc = read_metrics(set, r, p);
        if (rc > 0 && set_add(set, r) == 0)
            runs++;
        else
            run_free(r);
    }
    free_list(names, n);
    if (rc < 0)
        return -1;
    if (nstates > 1 || (nstates == 1 && runs > 1)) {
        report_note(set,
                    "%s: %d checkpoint folders and %d metrics files: no run is given a "
                    "configuration (give each run a folder of its own)",
                    dir, nstates, runs);
        return 0;
    }
    if (nstates == 1 && runs == 1)
        return read_state(set, set->runs[first], state) < 0 ? -1 : 0;
    if (nstates == 1) { /* a checkpoint alone: its configuration, no plots */
        report_run *r = run_new(dir);
        if (!r)
            return -1;
        int s = read_state(set, r, state);
        if (s > 0 && set_add(set, r) == 0) {
            report_note(set,
                        "%s: no metrics file (*.jsonl) beside the checkpoint: its "
                        "configuration only",
                        dir);
            return 0;
        }
        run_free(r);
        return s < 0 ? -1 : 0;
    }
    if (runs == 0)
        report_note(set,
                    "%s: no metrics file (*.jsonl) with steps and no checkpoint in the "
                    "folder: skipped",
                    dir);
    return 0;
}

int report_read_arg(report_set *set, const char *arg) {
    struct stat sb;
    if (stat(arg, &sb) != 0) {
        report_note(set, "%s: %s: skipped", arg, strerror(errno));
        return 0;
    }
    if (S_ISDIR(sb.st_mode))
        return read_folder(set, arg);
    report_run *r = run_new(arg);
    if (!r)
        return -1;
    const char *base = strrchr(arg, '/');
    int rc = !strcmp(base ? base + 1 : arg, "state.json") ? read_state(set, r, arg)
                                                          : read_metrics(set, r, arg);
    if (rc > 0 && set_add(set, r) == 0)
        return 0;
    run_free(r);
    return rc < 0 ? -1 : 0;
}

/* The name a run goes by: the last `parts` parts of its metrics file's path (else of its
 * folder's), without ".jsonl". */
static void short_name(const report_run *r, int parts, char *out, size_t cap) {
    const char *p = r->metrics ? r->metrics : r->source;
    size_t len = strlen(p);
    while (len > 1 && p[len - 1] == '/')
        len--;
    size_t b = len;
    for (int k = 0; k < parts; k++) {
        if (k > 0 && b > 0)
            b--;
        while (b > 0 && p[b - 1] != '/')
            b--;
    }
    snprintf(out, cap, "%.*s", (int)(len - b), p + b);
    if (ends_with(out, ".jsonl"))
        out[strlen(out) - 6] = '\0';
}

int report_name_runs(report_set *set) {
    for (int i = 0; i < set->n; i++) {
        char name[512], other[512];
        int clash = 0;
        short_name(set->runs[i], 1, name, sizeof name);
        for (int k = 0; k < set->n; k++) {
            short_name(set->runs[k], 1, other, sizeof other);
            clash |= k != i && !strcmp(name, other);
        }
        if (clash) /* m.jsonl in two folders: the folders tell them apart */
            short_name(set->runs[i], 2, name, sizeof name);
        for (int k = 0; k < i; k++) /* the same path given twice */
            if (!strcmp(name, set->runs[k]->name)) {
                size_t l = strlen(name);
                snprintf(name + l, sizeof name - l, " (%d)", i + 1);
                break;
            }
        if (!(set->runs[i]->name = strdup(name)))
            return -1;
    }
    return 0;
}
