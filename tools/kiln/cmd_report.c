/* kiln report: one self-contained HTML page (inline SVG, no script, nothing fetched) from one
 * or more runs' metrics files and checkpoint folders: a summary table, the curves of every
 * series the runs logged with their events marked along the steps, the events listed, and
 * each run's configuration. Several runs are overlaid on every plot. */
#include <cjson/cJSON.h>
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
#include "report.h"
#include "tool_common.h"

static const char *usage =
    "usage: kiln report [flags] RUN...\n\n"
    "Writes one HTML page that a browser opens with no network: each RUN's loss and validation\n"
    "loss, learning rate, gradient norm, tokens/s, MFU, memory, communication time and how much\n"
    "of it compute hid, and loss scale, as curves over the steps, several runs overlaid; guard\n"
    "events, fp16 overflows, stragglers, rank rebalances and restarts marked on the step axis; a\n"
    "summary table (steps, tokens, wall time, goodput, best validation loss) and each run's\n"
    "configuration. A RUN is a metrics file (kiln train --metrics), a folder of them (*.jsonl),\n"
    "or a checkpoint folder (--checkpoint-dir) or one holding both, whose newest state.json and\n"
    "config.json give the run's shape and flags. What cannot be read (a cut last line, keys\n"
    "from a newer kiln, an empty file) is skipped, said on stderr and on the page, and the rest\n"
    "is drawn. Exit status 0 when the page was written, 1 when no RUN held anything to show\n"
    "or the page could not be written, 2 on a usage error.";

enum {
    EVENT_ROWS_MAX = 200, /* events listed a run; then a count of the rest */
    CONFIG_MAX = 4 << 20, /* config.json's bytes at most */
    MARKER_SCAN = 4096,   /* bytes of an existing --out searched for the generator mark */
};

#define GENERATOR "<meta name=\"generator\" content=\"kiln report\">"

/* ---- the summary ---- */

typedef struct summary {
    int64_t steps, first, last; /* steps kept, and the first and last of them */
    double tokens;              /* NAN: unknown */
    double step_s, wall_s;      /* kept steps' time, and the processes' wall time (0: unknown) */
    double final_loss, best_val;
    int64_t best_val_step;
} summary;

static summary summarise(const report_run *r) {
    summary s = {.tokens = 0, .final_loss = NAN, .best_val = NAN, .best_val_step = -1};
    s.steps = r->n;
    s.first = r->n ? r->step[0] : 0;
    s.last = r->n ? r->step[r->n - 1] : 0;
    int tokens_known = r->n > 0;
    for (int64_t i = 0; i < r->n; i++) {
        double ms = r->v[REPORT_MS][i], tps = r->v[REPORT_TOKENS_PER_S][i];
        if (isfinite(ms))
            s.step_s += ms / 1e3;
        if (isfinite(ms) && isfinite(tps))
            s.tokens += tps * ms / 1e3; /* tokens_per_s is the step's tokens over its time */
        else
            tokens_known = 0;
        if (isfinite(r->v[REPORT_LOSS][i]))
            s.final_loss = r->v[REPORT_LOSS][i];
        double v = r->v[REPORT_VAL_LOSS][i];
        if (isfinite(v) && !(v >= s.best_val)) {
            s.best_val = v;
            s.best_val_step = r->step[i];
        }
    }
    if (!tokens_known)
        s.tokens = NAN;
    s.wall_s = r->elapsed;
    return s;
}

static void put_duration(report_buf *b, double s) {
    if (!(s > 0)) {
        report_buf_puts(b, "-");
        return;
    }
    long long t = llround(s);
    if (s < 1)
        report_buf_printf(b, "%.0f ms", s * 1e3);
    else if (t < 60)
        report_buf_printf(b, "%.1f s", s);
    else if (t < 3600)
        report_buf_printf(b, "%lld:%02lld", t / 60, t % 60);
    else
        report_buf_printf(b, "%lld:%02lld:%02lld", t / 3600, t / 60 % 60, t % 60);
}

static void put_count(report_buf *b, double v) {
    if (!isfinite(v))
        report_buf_puts(b, "-");
    else if (v >= 1e9)
        report_buf_printf(b, "%.2fG", v / 1e9);
    else if (v >= 1e6)
        report_buf_printf(b, "%.2fM", v / 1e6);
    else if (v >= 1e4)
        report_buf_printf(b, "%.1fk", v / 1e3);
    else
        report_buf_printf(b, "%.0f", v);
}

static void put_swatch(report_buf *b, int i) {
    report_buf_printf(b, "<span class=\"sw\" style=\"background:#%06x\"></span>",
                      report_palette[i % 10]);
}

static void summary_table(report_buf *b, report_run *const *runs, int n) {
    report_buf_printf(b, "<h2 id=\"summary\">Summary</h2>\n<table class=\"summary\">\n<tr><th>run"
                         "</th><th>steps</th><th>tokens</th><th>step time</th><th>wall time</th>"
                         "<th>goodput</th><th>final loss</th><th>best val loss</th><th>restarts"
                         "</th><th>guard events</th><th>fp16 overflows</th><th>stragglers</th>"
                         "</tr>\n");
    for (int i = 0; i < n; i++) {
        const report_run *r = runs[i];
        summary s = summarise(r);
        report_buf_puts(b, "<tr><td>");
        put_swatch(b, i);
        report_buf_html(b, r->name);
        report_buf_puts(b, "</td><td>");
        if (s.steps)
            report_buf_printf(b, "%lld (%lld-%lld)", (long long)s.steps, (long long)s.first,
                              (long long)s.last);
        else
            report_buf_puts(b, "-");
        report_buf_puts(b, "</td><td>");
        put_count(b, s.tokens);
        report_buf_puts(b, "</td><td>");
        put_duration(b, s.step_s);
        report_buf_puts(b, "</td><td>");
        put_duration(b, s.wall_s);
        report_buf_puts(b, "</td><td>");
        if (s.wall_s > 0 && s.step_s > 0)
            report_buf_printf(b, "%.1f%%", 100.0 * fmin(1.0, s.step_s / s.wall_s));
        else
            report_buf_puts(b, "-");
        report_buf_puts(b, "</td><td>");
        if (isfinite(s.final_loss))
            report_buf_printf(b, "%.4f", s.final_loss);
        else
            report_buf_puts(b, "-");
        report_buf_puts(b, "</td><td>");
        if (isfinite(s.best_val))
            report_buf_printf(b, "%.4f (step %lld)", s.best_val, (long long)s.best_val_step);
        else
            report_buf_puts(b, "-");
        long long guards = (long long)(r->count[REPORT_EV_SKIP] + r->count[REPORT_EV_ROLLBACK] +
                                       r->count[REPORT_EV_WARNING] + r->count[REPORT_EV_CLIPPED]);
        report_buf_printf(b, "</td><td>%lld</td><td>%lld</td><td>%lld</td><td>%lld</td></tr>\n",
                          (long long)r->count[REPORT_EV_RESTART], guards,
                          (long long)r->count[REPORT_EV_OVERFLOW],
                          (long long)r->count[REPORT_EV_STRAGGLER]);
    }
    report_buf_puts(b, "</table>\n");
    report_buf_puts(b, "<p class=\"small\">Goodput: the kept steps' time over the processes' wall "
                       "time (a step run again after a restart or a rollback counts once). Tokens: "
                       "each kept step's tokens/s times its time.</p>\n");
}

/* ---- events and configuration ---- */

static void events_table(report_buf *b, report_run *const *runs, int n) {
    int64_t total = 0;
    for (int i = 0; i < n; i++)
        total += runs[i]->nev;
    if (!total)
        return;
    report_buf_printf(b, "<h2 id=\"events\">Events</h2>\n<table class=\"events\">\n<tr><th>run"
                         "</th><th>step</th><th>event</th><th>details</th></tr>\n");
    for (int i = 0; i < n; i++) {
        const report_run *r = runs[i];
        for (int64_t e = 0; e < r->nev && e < EVENT_ROWS_MAX; e++) {
            const report_event *ev = &r->ev[e];
            report_buf_puts(b, "<tr><td>");
            put_swatch(b, i);
            report_buf_html(b, r->name);
            if (ev->step >= 0)
                report_buf_printf(b, "</td><td>%lld</td><td>", (long long)ev->step);
            else
                report_buf_puts(b, "</td><td>-</td><td>");
            report_buf_html(b,
                            ev->kind == REPORT_EV_OTHER ? ev->name : report_event_label(ev->kind));
            report_buf_puts(b, "</td><td>");
            report_buf_html(b, ev->text);
            report_buf_puts(b, "</td></tr>\n");
        }
        if (r->nev > EVENT_ROWS_MAX) {
            report_buf_puts(b, "<tr><td>");
            report_buf_html(b, r->name);
            report_buf_printf(b, "</td><td></td><td colspan=\"2\">and %lld more events</td></tr>\n",
                              (long long)(r->nev - EVENT_ROWS_MAX));
        }
    }
    report_buf_puts(b, "</table>\n");
}

static void put_json_value(report_buf *b, const cJSON *v) {
    if (cJSON_IsString(v)) {
        report_buf_html(b, v->valuestring);
        return;
    }
    char *p = cJSON_PrintUnformatted(v);
    report_buf_html(b, p ? p : "?");
    free(p);
}

/* An object's members as rows of a two-column table, objects within flattened "a.b". */
static void json_rows(report_buf *b, const cJSON *o, const char *prefix, int depth) {
    for (const cJSON *c = o->child; c; c = c->next) {
        if (!c->string)
            continue;
        char key[256];
        snprintf(key, sizeof key, "%s%s%s", prefix, prefix[0] ? "." : "", c->string);
        if (cJSON_IsObject(c) && depth < 3) {
            json_rows(b, c, key, depth + 1);
            continue;
        }
        report_buf_puts(b, "<tr><td>");
        report_buf_html(b, key);
        report_buf_puts(b, "</td><td>");
        put_json_value(b, c);
        report_buf_puts(b, "</td></tr>\n");
    }
}

/* The step folder's config.json (the run's flags), beside its state.json. */
static cJSON *read_config(report_set *set, const char *state_path) {
    char path[8192];
    snprintf(path, sizeof path, "%s", state_path);
    char *slash = strrchr(path, '/');
    if (slash)
        snprintf(slash + 1, sizeof path - (size_t)(slash + 1 - path), "config.json");
    else
        snprintf(path, sizeof path, "config.json");
    struct stat sb;
    if (stat(path, &sb) != 0)
        return NULL; /* a run started without a configuration to record */
    char *text = NULL;
    size_t len = 0;
    if (kiln_file_read(path, CONFIG_MAX, &text, &len) != KILN_OK) {
        report_note(set, "%s: %s: the run's flags are not shown", path, kiln_error_message());
        return NULL;
    }
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsObject(j)) {
        report_note(set, "%s: not a JSON object: the run's flags are not shown", path);
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

static void config_section(report_buf *b, report_set *set) {
    int any = 0;
    for (int i = 0; i < set->n; i++)
        any |= set->runs[i]->state != NULL;
    if (!any)
        return;
    report_buf_puts(b, "<h2 id=\"config\">Configuration</h2>\n");
    for (int i = 0; i < set->n; i++) {
        report_run *r = set->runs[i];
        if (!r->state)
            continue;
        report_buf_puts(b, "<details open><summary>");
        put_swatch(b, i);
        report_buf_html(b, r->name);
        report_buf_puts(b, ": ");
        report_buf_html(b, r->state_path);
        report_buf_puts(b, "</summary>\n<div class=\"cfg\"><table class=\"kv\">\n"
                           "<tr><th colspan=\"2\">checkpoint</th></tr>\n");
        static const char *keys[] = {"step", "world", "zero", "model", "optimizer", "loss_scaler"};
        cJSON *shown = cJSON_CreateObject();
        for (size_t k = 0; shown && k < sizeof keys / sizeof keys[0]; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->state, keys[k]);
            if (v)
                cJSON_AddItemToObject(shown, keys[k], cJSON_Duplicate(v, 1));
        }
        if (shown)
            json_rows(b, shown, "", 0);
        cJSON_Delete(shown);
        report_buf_puts(b, "</table>\n");
        cJSON *cfg = read_config(set, r->state_path);
        if (cfg) {
            report_buf_puts(b, "<table class=\"kv\">\n<tr><th colspan=\"2\">flags (config.json)"
                               "</th></tr>\n");
            json_rows(b, cfg, "", 0);
            report_buf_puts(b, "</table>\n");
            cJSON_Delete(cfg);
        }
        report_buf_puts(b, "</div></details>\n");
    }
}

/* ---- the page ---- */

static const char *style =
    "body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;color:#222;margin:24px auto;"
    "max-width:960px;padding:0 16px}h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px "
    "0 8px;border-bottom:1px solid "
    "#ddd;padding-bottom:4px}table{border-collapse:collapse;font-size:"
    "12.5px;margin:6px 0}th,td{border:1px solid #ddd;padding:3px "
    "7px;text-align:left;vertical-align:"
    "top}th{background:#f5f5f5}td{font-variant-numeric:tabular-nums}.sw{display:inline-block;"
    "width:10px;height:10px;border-radius:2px;margin-right:6px}.small{color:#666;font-size:12px}"
    ".notes{background:#fff8e1;border:1px solid #f0d98c;padding:6px 12px 6px 28px;font-size:12.5px}"
    "figure{margin:10px 0 18px}svg.plot{max-width:100%;height:auto;font-family:system-ui,sans-"
    "serif}svg.plot text{font-size:11px}.cfg{display:flex;gap:16px;flex-wrap:wrap;align-items:"
    "flex-start}details{margin:8px 0}summary{cursor:pointer;font-weight:600}nav a{margin-right:"
    "12px}.series:hover{stroke-width:3}";

static void page(report_buf *b, report_set *set, const char *title, int *nplotted) {
    report_buf_puts(b, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    report_buf_puts(b, GENERATOR "\n");
    /* nothing may be fetched: a page that would reach the network says so in the console */
    report_buf_printf(b, "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src "
                         "'none'; style-src 'unsafe-inline'; img-src data:\">\n"
                         "<meta name=\"viewport\" content=\"width=device-width\">\n<title>");
    report_buf_html(b, title);
    report_buf_printf(b, "</title>\n<style>%s</style>\n</head>\n<body>\n<h1>", style);
    report_buf_html(b, title);
    char when[64] = "";
    time_t now = time(NULL);
    struct tm tm;
    if (localtime_r(&now, &tm))
        strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S %Z", &tm);
    report_buf_printf(b, "</h1>\n<p class=\"small\">%d run%s, written %s by kiln report.</p>\n",
                      set->n, set->n == 1 ? "" : "s", when);
    int64_t nev = 0, nstate = 0;
    for (int i = 0; i < set->n; i++) {
        nev += set->runs[i]->nev;
        nstate += set->runs[i]->state != NULL;
    }
    report_buf_puts(b, "<nav>");
    if (set->nnotes)
        report_buf_puts(b, "<a href=\"#skipped\">skipped</a>");
    report_buf_puts(b, "<a href=\"#summary\">summary</a><a href=\"#plots\">plots</a>");
    if (nev)
        report_buf_puts(b, "<a href=\"#events\">events</a>");
    if (nstate)
        report_buf_puts(b, "<a href=\"#config\">configuration</a>");
    report_buf_puts(b, "</nav>\n");
    if (set->nnotes) {
        report_buf_puts(b, "<h2 id=\"skipped\">Skipped</h2>\n<ul class=\"notes\">\n");
        for (int i = 0; i < set->nnotes; i++) {
            report_buf_puts(b, "<li>");
            report_buf_html(b, set->notes[i]);
            report_buf_puts(b, "</li>\n");
        }
        report_buf_puts(b, "</ul>\n");
    }
    summary_table(b, set->runs, set->n);
    report_buf_puts(b, "<h2 id=\"plots\">Plots</h2>\n");
    *nplotted = 0;
    for (int p = 0; p < report_nplots; p++) {
        const report_plot_def *d = &report_plots[p];
        if (!report_plot_present(d, set->runs, set->n))
            continue;
        report_buf_printf(b, "<figure id=\"plot-%s\">\n", d->id);
        report_svg_plot(b, d, set->runs, set->n);
        report_buf_puts(b, "</figure>\n");
        (*nplotted)++;
    }
    if (!*nplotted)
        report_buf_puts(b, "<p>No run logged a step: nothing to plot.</p>\n");
    report_buf_puts(b, "<p class=\"small\">Solid: training; dashed: validation. Hover a curve or a "
                       "mark for what it is.</p>\n");
    events_table(b, set->runs, set->n);
    config_section(b, set);
    report_buf_puts(b, "</body>\n</html>\n");
}

/* An existing --out is replaced only when it is a page kiln report wrote. */
static int may_replace(const char *path, char *why, size_t cap) {
    struct stat sb;
    if (stat(path, &sb) != 0)
        return errno == ENOENT ? 1 : (snprintf(why, cap, "%s", strerror(errno)), 0);
    if (kiln_file_check_replaceable(path) != KILN_OK) {
        snprintf(why, cap, "%s", kiln_error_message());
        return 0;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(why, cap, "%s", strerror(errno));
        return 0;
    }
    char head[MARKER_SCAN + 1];
    size_t n = fread(head, 1, MARKER_SCAN, f);
    fclose(f);
    head[n] = '\0';
    if (n == 0 || strstr(head, GENERATOR))
        return 1;
    snprintf(why, cap,
             "the file is there and is not a page kiln report wrote: not replaced "
             "(remove it or give another --out)");
    return 0;
}

static int write_pngs(report_set *set, const char *dir) {
    char probe[8192];
    snprintf(probe, sizeof probe, "%s/x", dir);
    struct stat sb;
    if (stat(dir, &sb) == 0 && !S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "kiln report: --png %s: there is a file of that name, not a folder\n", dir);
        return 1;
    }
    if (tool_make_parent_dirs(probe) != KILN_OK) {
        fprintf(stderr, "kiln report: --png %s: %s\n", dir, kiln_error_message());
        return 1;
    }
    for (int p = 0; p < report_nplots; p++) {
        const report_plot_def *d = &report_plots[p];
        if (!report_plot_present(d, set->runs, set->n))
            continue;
        char path[8192], why[1024];
        snprintf(path, sizeof path, "%s/%s.png", dir, d->id);
        if (report_png_plot(path, d, set->runs, set->n, why, sizeof why)) {
            fprintf(stderr, "kiln report: --png %s: %s\n", dir, why);
            return 1;
        }
        printf("kiln report: wrote %s\n", path);
    }
    return 0;
}

int cmd_report(int argc, char **argv) {
    const char *out = "report.html", *png = NULL, *title = NULL;
    const tool_flag flags[] = {
        {"out", TOOL_FLAG_STRING, &out,
         "the page to write; an existing file is replaced only when kiln report wrote it"},
        {"png", TOOL_FLAG_STRING, &png,
         "a folder to write each plot into as a PNG image too (loss.png, lr.png, ...)"},
        {"title", TOOL_FLAG_STRING, &title, "the page's title (default: kiln report: the runs)"},
    };
    int npos = 0;
    int rc =
        tool_flags_parse(flags, (int)(sizeof flags / sizeof flags[0]), argc, argv, &npos, usage);
    if (rc == TOOL_FLAGS_HELP)
        return 0;
    if (rc != TOOL_FLAGS_OK)
        return TOOL_EXIT_USAGE;
    if (npos < 1) {
        fprintf(stderr, "kiln report: give one or more runs: metrics files or checkpoint "
                        "folders (see kiln report --help)\n");
        return TOOL_EXIT_USAGE;
    }
    if (!out || !out[0]) {
        fprintf(stderr, "kiln report: --out: give a file name\n");
        return TOOL_EXIT_USAGE;
    }
    if (png && !png[0]) {
        fprintf(stderr, "kiln report: --png: give a folder\n");
        return TOOL_EXIT_USAGE;
    }
    char why[1024];
    if (!may_replace(out, why, sizeof why)) {
        fprintf(stderr, "kiln report: --out %s: %s\n", out, why);
        return 1;
    }
    report_set set = {0};
    int status = 1;
    report_buf b = {0};
    for (int i = 1; i <= npos; i++)
        if (report_read_arg(&set, argv[i]) < 0)
            goto oom;
    if (report_name_runs(&set) < 0)
        goto oom;
    for (int i = 0; i < set.nnotes; i++)
        fprintf(stderr, "kiln report: %s\n", set.notes[i]);
    if (set.n == 0) {
        fprintf(stderr, "kiln report: no run to show: nothing written\n");
        goto done;
    }
    char auto_title[512];
    if (!title) {
        size_t at = (size_t)snprintf(auto_title, sizeof auto_title, "kiln report: ");
        for (int i = 0; i < set.n && at < sizeof auto_title; i++)
            at += (size_t)snprintf(auto_title + at, sizeof auto_title - at, "%s%s", i ? ", " : "",
                                   set.runs[i]->name);
        title = auto_title;
    }
    int nplotted = 0;
    page(&b, &set, title, &nplotted);
    if (b.failed)
        goto oom;
    if (tool_make_parent_dirs(out) != KILN_OK || kiln_file_write(out, b.s, b.len) != KILN_OK) {
        fprintf(stderr, "kiln report: --out %s: %s\n", out, kiln_error_message());
        goto done;
    }
    printf("kiln report: wrote %s: %d run%s, %d plot%s%s\n", out, set.n, set.n == 1 ? "" : "s",
           nplotted, nplotted == 1 ? "" : "s",
           set.nnotes ? " (some input skipped: see above)" : "");
    status = png ? write_pngs(&set, png) : 0;
    goto done;
oom:
    fprintf(stderr, "kiln report: out of memory\n");
done:
    report_buf_free(&b);
    report_set_free(&set);
    return status;
}
