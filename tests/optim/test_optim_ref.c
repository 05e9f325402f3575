/* kiln's optimizers against torch.optim: reads the file optim_ref.py writes, runs every case
 * with the reference and the CPU backend, and compares, tensor by tensor, the parameters
 * after every step and the moment slabs after the last one.
 *
 * Usage: test_optim_ref FILE */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/backend.h"
#include "kiln/optim.h"

/* Relative error by norm, per tensor. Parameters and moments differ by float rounding
 * only (torch and kiln order a few operations differently, or fuse them): measured at
 * most 1e-7. The displacement p - p0 is not diluted by the parameter's size, so it sees
 * errors in the update itself; its floor is one rounding of p against the distance moved
 * (ulp(1) / 0.03 for a layernorm weight near 1), measured up to 2.2e-6. A 1% error in the
 * decoupled decay shows as 9e-4. */
#define PARAM_TOL 1e-6
#define STATE_TOL 1e-6
#define DELTA_TOL 5e-5

#define MAX_TENSORS 16
#define MAX_CASES 16
#define MAX_STEPS 16

typedef struct ref_case {
    char name[64];
    kiln_optim_config cfg;
    int states;
    float lrs[MAX_STEPS];
    int nlrs;
    const float *expect_params; /* (steps, n) */
    const float *expect_states; /* (states, n) */
} ref_case;

typedef struct ref_file {
    int64_t n;
    int steps;
    int ntensors, ncases;
    char tensor_names[MAX_TENSORS][64];
    kiln_param_range ranges[MAX_TENSORS];
    ref_case cases[MAX_CASES];
    float *data;               /* everything after the header */
    const float *init, *grads; /* (n), (steps, n) */
} ref_file;

static int fail(const char *path, const char *what) {
    fprintf(stderr, "%s: %s\n", path, what);
    return -1;
}

/* key=value fields of a "case" line; returns 0 when every field was understood. */
static int parse_case(char *line, ref_case *c) {
    c->cfg = kiln_optim_config_default();
    int seen_kind = 0;
    for (char *tok = strtok(line, " \n"); tok; tok = strtok(NULL, " \n")) {
        char *eq = strchr(tok, '=');
        if (!eq)
            continue; /* the leading word "case" */
        *eq = '\0';
        const char *k = tok, *v = eq + 1;
        if (!strcmp(k, "name"))
            snprintf(c->name, sizeof c->name, "%s", v);
        else if (!strcmp(k, "kind"))
            seen_kind = kiln_optim_kind_parse(v, &c->cfg.kind) == KILN_OK;
        else if (!strcmp(k, "beta1"))
            c->cfg.beta1 = strtof(v, NULL);
        else if (!strcmp(k, "beta2"))
            c->cfg.beta2 = strtof(v, NULL);
        else if (!strcmp(k, "eps"))
            c->cfg.eps = strtof(v, NULL);
        else if (!strcmp(k, "weight_decay"))
            c->cfg.weight_decay = strtof(v, NULL);
        else if (!strcmp(k, "momentum"))
            c->cfg.momentum = strtof(v, NULL);
        else if (!strcmp(k, "dampening"))
            c->cfg.dampening = strtof(v, NULL);
        else if (!strcmp(k, "nesterov"))
            c->cfg.nesterov = atoi(v);
        else if (!strcmp(k, "alpha"))
            c->cfg.alpha = strtof(v, NULL);
        else if (!strcmp(k, "states"))
            c->states = atoi(v);
        else if (!strcmp(k, "lrs")) {
            char *p = (char *)v;
            while (*p && c->nlrs < MAX_STEPS) {
                c->lrs[c->nlrs++] = strtof(p, &p);
                if (*p == ',')
                    p++;
                else
                    break;
            }
        } else
            return -1;
    }
    return seen_kind && c->states >= 0 && c->states <= 2 ? 0 : -1;
}

static int read_header(FILE *f, const char *path, ref_file *r) {
    char line[4096];
    int64_t offset = 0;
    if (!fgets(line, sizeof line, f) || strcmp(line, "kiln-optim-ref 1\n") != 0)
        return fail(path, "not a kiln-optim-ref 1 file");
    while (fgets(line, sizeof line, f)) {
        long long a;
        int d;
        char name[64];
        if (!strcmp(line, "end\n"))
            return r->n > 0 && r->steps > 0 && offset == r->n ? 0 : fail(path, "bad sizes");
        if (sscanf(line, "n %lld", &a) == 1)
            r->n = a;
        else if (sscanf(line, "steps %d", &r->steps) == 1) {
            if (r->steps <= 0 || r->steps > MAX_STEPS)
                return fail(path, "bad step count");
        } else if (sscanf(line, "tensor %63s %lld %d", name, &a, &d) == 3) {
            if (r->ntensors == MAX_TENSORS)
                return fail(path, "too many tensors");
            snprintf(r->tensor_names[r->ntensors], 64, "%s", name);
            r->ranges[r->ntensors++] = (kiln_param_range){offset, a, d};
            offset += a;
        } else if (!strncmp(line, "case ", 5)) {
            if (r->ncases == MAX_CASES)
                return fail(path, "too many cases");
            ref_case *c = &r->cases[r->ncases++];
            if (parse_case(line, c) != 0 || c->nlrs != r->steps)
                return fail(path, "bad case line");
        } else if (strncmp(line, "torch ", 6) != 0)
            return fail(path, "unknown header line");
    }
    return fail(path, "header has no end line");
}

static int load(const char *path, ref_file *r) {
    memset(r, 0, sizeof *r);
    FILE *f = fopen(path, "rb");
    if (!f)
        return fail(path, "cannot open");
    int rc = read_header(f, path, r);
    if (rc == 0) {
        size_t count = (size_t)r->n * (size_t)(1 + r->steps);
        for (int i = 0; i < r->ncases; i++)
            count += (size_t)r->n * (size_t)(r->steps + r->cases[i].states);
        r->data = malloc(count * sizeof(float));
        if (!r->data || fread(r->data, sizeof(float), count, f) != count || fgetc(f) != EOF)
            rc = fail(path, "data is not the size the header gives");
    }
    fclose(f);
    if (rc != 0) {
        free(r->data);
        r->data = NULL;
        return rc;
    }
    const float *p = r->data;
    r->init = p;
    r->grads = p + r->n;
    p += (size_t)r->n * (size_t)(1 + r->steps);
    for (int i = 0; i < r->ncases; i++) {
        r->cases[i].expect_params = p;
        p += (size_t)r->n * (size_t)r->steps;
        r->cases[i].expect_states = p;
        p += (size_t)r->n * (size_t)r->cases[i].states;
    }
    return 0;
}

static double rel_err(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    if (den == 0)
        return sqrt(num) == 0 ? 0 : INFINITY;
    return sqrt(num / den);
}

/* Compares each tensor of a slab; returns the number of tensors over tol. */
static int compare(const ref_file *r, const float *got, const float *want, double tol,
                   const char *what, const char *be, const char *cs, double *worst) {
    int bad = 0;
    for (int t = 0; t < r->ntensors; t++) {
        const kiln_param_range *g = &r->ranges[t];
        double e = rel_err(got + g->offset, want + g->offset, g->numel);
        if (e > *worst || isnan(e))
            *worst = e;
        if (!(e <= tol)) {
            fprintf(stderr, "FAIL %s/%s: %s of %s: relative error %.3g > %.1g\n", be, cs, what,
                    r->tensor_names[t], e, tol);
            bad++;
        }
    }
    return bad;
}

/* out = a - b, n floats */
static void diff(float *out, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        out[i] = a[i] - b[i];
}

static int run_case(const ref_file *r, const ref_case *c, kiln_backend *be) {
    int bad = 0;
    double worst_p = 0, worst_s = 0, worst_d = 0;
    float *p = malloc((size_t)r->n * sizeof(float));
    float *g = malloc((size_t)r->n * sizeof(float));
    float *dg = malloc((size_t)r->n * sizeof(float)); /* kiln's p - p0 */
    float *dw = malloc((size_t)r->n * sizeof(float)); /* torch's p - p0 */
    kiln_optim *o = NULL;
    if (!p || !g || !dg || !dw) {
        fprintf(stderr, "FAIL %s/%s: out of memory\n", be->name, c->name);
        bad = 1;
        goto done;
    }
    kiln_optim_slab slab = {.n = r->n, .work = KILN_DTYPE_F32};
    kiln_status st = kiln_optim_create(&o, &c->cfg, &slab, r->ranges, r->ntensors, be);
    if (st != KILN_OK) {
        fprintf(stderr, "FAIL %s/%s: create: %s: %s\n", be->name, c->name, kiln_status_str(st),
                kiln_error_message());
        bad = 1;
        goto done;
    }
    memcpy(p, r->init, (size_t)r->n * sizeof(float));
    for (int s = 0; s < r->steps; s++) {
        /* a fresh copy each step: the kernels must not need to write the gradients */
        memcpy(g, r->grads + (size_t)s * (size_t)r->n, (size_t)r->n * sizeof(float));
        st = kiln_optim_step(o, p, g, c->lrs[s]);
        if (st != KILN_OK) {
            fprintf(stderr, "FAIL %s/%s: step %d: %s\n", be->name, c->name, s + 1,
                    kiln_error_message());
            bad = 1;
            goto done;
        }
        char what[32];
        snprintf(what, sizeof what, "step %d parameters", s + 1);
        const float *want = c->expect_params + (size_t)s * (size_t)r->n;
        bad += compare(r, p, want, PARAM_TOL, what, be->name, c->name, &worst_p);
        diff(dg, p, r->init, r->n);
        diff(dw, want, r->init, r->n);
        snprintf(what, sizeof what, "step %d displacement", s + 1);
        bad += compare(r, dg, dw, DELTA_TOL, what, be->name, c->name, &worst_d);
    }
    for (int i = 0; i < 2; i++) {
        const float *mine = kiln_optim_state(o, i);
        if ((mine != NULL) != (i < c->states)) {
            fprintf(stderr, "FAIL %s/%s: state slab %d is %s, torch has %d slabs\n", be->name,
                    c->name, i, mine ? "present" : "absent", c->states);
            bad++;
        } else if (mine) {
            char what[32];
            snprintf(what, sizeof what, "state slab %d", i);
            bad += compare(r, mine, c->expect_states + (size_t)i * (size_t)r->n, STATE_TOL, what,
                           be->name, c->name, &worst_s);
        }
    }
    if (kiln_optim_steps_taken(o) != r->steps) {
        fprintf(stderr, "FAIL %s/%s: %lld steps counted\n", be->name, c->name,
                (long long)kiln_optim_steps_taken(o));
        bad++;
    }
    fprintf(stderr,
            "%s %-4s %-17s worst relative errors: parameters %.1e, displacement %.1e, "
            "state %.1e\n",
            bad ? "FAIL" : "ok  ", be->name, c->name, worst_p, worst_d, worst_s);
done:
    kiln_optim_free(o);
    free(dw);
    free(dg);
    free(g);
    free(p);
    return bad;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s FILE (written by tests/optim/optim_ref.py)\n", argv[0]);
        return 2;
    }
    ref_file r;
    if (load(argv[1], &r) != 0)
        return 1;
    if (r.ncases == 0) {
        fprintf(stderr, "%s holds no cases: nothing was compared\n", argv[1]);
        free(r.data);
        return 1;
    }
    kiln_backend *backends[] = {kiln_backend_ref(), kiln_backend_cpu()};
    int bad = 0;
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < r.ncases; i++)
            bad += run_case(&r, &r.cases[i], backends[b]);
    fprintf(stderr, "%d cases x 2 backends, %d steps, %lld floats: %s\n", r.ncases, r.steps,
            (long long)r.n, bad ? "FAILED" : "all within tolerance");
    free(r.data);
    return bad ? 1 : 0;
}
