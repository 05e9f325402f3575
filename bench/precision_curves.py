#!/usr/bin/python3
"""Loss curves of one model trained in fp32, bf16 and fp16 on the same data and seed.

    /usr/bin/python3 bench/precision_curves.py [--kiln build/kiln] [--data SHARDS]
        [--model d6] [--batch 8] [--seq 64] [--steps 1000] [--seed 1337] [--lr 6e-4]
        [--precisions fp32,bf16,fp16] [--inject-at 300] [--window 50] [--tolerance 0.01]
        [--threads 2] [--work DIR] [--png docs/precision_curves.png]
        [--csv docs/precision_curves.csv] [--reuse] [--markdown]

Each precision is one `kiln train --precision P` process with the same model, data
(the Brown corpus shards of `kiln prepare`, found as bench_train.py finds them), seed and
learning-rate schedule, --steps optimizer steps, its per-step metrics read from --metrics.
The fp16 run also gets `--inject-nonfinite K` (--inject-at, 0: none): an infinite gradient
at step K, which dynamic loss scaling must treat as an overflow (skip the step, halve the
scale) rather than end the run.

The loss is smoothed with a trailing mean over --window steps, and for each reduced
precision the script reports the relative difference of its smoothed curve from fp32's,
(smoothed P - smoothed fp32) / smoothed fp32, over the second half of the run (steps past
--steps / 2): its largest magnitude, its mean and its value at the last step, and whether
the largest is within --tolerance (1%, the criterion "a 1,000-step bf16 run whose smoothed
loss curve stays within 1% of the fp32 run's on the same data and seed"). For fp16 it lists
the skipped steps and the loss scale.

It writes the curves (raw and smoothed losses, relative differences, fp16's loss scale)
to --csv and plots them to --png with matplotlib (Debian: apt-get install
python3-matplotlib); without matplotlib it says so and still prints the numbers and the
CSV. --reuse keeps a run whose metrics file and command match the ones it would run, to
redraw without training again. Every run has OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE removed
and OMP_NUM_THREADS=--threads, as bench_train.py does (the curves do not depend on them;
the step times in the summary do).
"""

import argparse
import csv
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_train as bt  # noqa: E402  (bench/bench_train.py: environment, data, tables)


def parse_args():
    ap = argparse.ArgumentParser(description="fp32 / bf16 / fp16 loss curves of kiln")
    ap.add_argument("--kiln", default=os.path.join(bt.ROOT, "build", "kiln"))
    ap.add_argument("--data", help="training shards (file, folder or glob)")
    ap.add_argument("--model", default="d6", choices=sorted(bt.PRESETS))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--lr", type=float, default=6e-4, help="peak learning rate (cosine)")
    ap.add_argument("--precisions", default="fp32,bf16,fp16", metavar="P[,P...]",
                    help="runs; fp32 is the reference and always run (default fp32,bf16,fp16)")
    ap.add_argument("--inject-at", type=int, default=300, metavar="STEP",
                    help="fp16: an infinite gradient at this step (0: none; default 300)")
    ap.add_argument("--window", type=int, default=50, help="smoothing: trailing mean of steps")
    ap.add_argument("--tolerance", type=float, default=0.01,
                    help="largest relative difference from fp32 allowed (default 0.01)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", default=os.path.join(bt.ROOT, "build", "precision_curves"),
                    help="folder for logs, metrics and prepared data")
    ap.add_argument("--png", default=os.path.join(bt.ROOT, "docs", "precision_curves.png"))
    ap.add_argument("--csv", default=os.path.join(bt.ROOT, "docs", "precision_curves.csv"))
    ap.add_argument("--reuse", action="store_true",
                    help="keep runs whose metrics and command match (redraw only)")
    ap.add_argument("--markdown", action="store_true", help="also print the summary as Markdown")
    args = ap.parse_args()
    ps = bt.parse_precisions(args.precisions)
    args.precisions = ["fp32"] + [p for p in ps if p != "fp32"]
    if args.steps < 2 or args.window < 1:
        sys.exit("--steps must be at least 2 and --window at least 1")
    return args


def run(args, env, data, p):
    """Train in precision p (or reuse its earlier run); returns (per-step records, error)."""
    metrics = os.path.join(args.work, "%s.jsonl" % p)
    log = os.path.join(args.work, "%s.log" % p)
    stamp = os.path.join(args.work, "%s.cmd" % p)
    cmd = [args.kiln, "train", "--model", args.model, "--batch", str(args.batch), "--seq",
           str(args.seq), "--steps", str(args.steps), "--seed", str(args.seed), "--lr",
           repr(args.lr), "--data", data, "--metrics", metrics, "--threads",
           str(args.threads), "--save", "", "--eval-every", "0", "--precision", p]
    if p == "fp16" and args.inject_at > 0:
        cmd += ["--inject-nonfinite", str(args.inject_at)]
    line = " ".join(cmd)
    if args.reuse and os.path.exists(metrics) and os.path.exists(stamp) and \
            open(stamp).read().strip() == line:
        steps = read_metrics(metrics)
        if len(steps) == args.steps:
            print("%s: reusing %s" % (p, metrics))
            return steps, None
    for f in (metrics, stamp):
        if os.path.exists(f):
            os.remove(f)
    print("%s: %s" % (p, line))
    sys.stdout.flush()
    rc, out, _, _ = bt.run_timed(cmd, env, log)
    steps = read_metrics(metrics) if os.path.exists(metrics) else []
    if rc != 0 or len(steps) != args.steps:
        last = out.strip().splitlines()[-1] if out.strip() else "no output"
        return steps, "rc %d after %d of %d steps: %s (see %s)" % (rc, len(steps), args.steps,
                                                                   last, log)
    with open(stamp, "w") as f:
        f.write(line + "\n")
    return steps, None


def read_metrics(path):
    return [json.loads(x) for x in open(path) if x.strip().startswith("{")]


def smooth(losses, window):
    """Trailing mean over the last `window` finite losses (fewer at the start); None where
    there is none yet."""
    out, recent = [], []
    for v in losses:
        if v is not None and math.isfinite(v):
            recent.append(v)
            if len(recent) > window:
                recent.pop(0)
        out.append(sum(recent) / len(recent) if recent else None)
    return out


def compare(args, curves):
    """Per reduced precision: relative differences from fp32 by step, and their summary
    over the second half."""
    ref = curves["fp32"]["smooth"]
    half = args.steps // 2
    for p, c in curves.items():
        if p == "fp32" or not c["smooth"]:
            continue
        rel = [(s - r) / r if s is not None and r else None for s, r in zip(c["smooth"], ref)]
        c["rel"] = rel
        tail = [x for x in rel[half:] if x is not None]
        if tail:
            worst = max(tail, key=abs)
            c["summary"] = {"max": abs(worst), "worst_signed": worst,
                            "mean": sum(tail) / len(tail), "last": rel[-1],
                            "within": abs(worst) <= args.tolerance}


def fp16_notes(steps):
    """Skipped steps and the loss scale of an fp16 run."""
    scales = [s.get("loss_scale") for s in steps if s.get("loss_scale") is not None]
    skipped = [s["step"] for s in steps if s.get("skipped")]
    if not scales:
        return "no loss_scale in the metrics (is dynamic loss scaling on?)"
    return ("skipped steps %s (%d in all, %s by the metrics' skipped_total); loss scale %g at "
            "the start, %g at the lowest, %g at the end" % (
                ", ".join(map(str, skipped)) or "none", len(skipped),
                steps[-1].get("skipped_total", "?"), scales[0], min(scales), scales[-1]))


SUMMARY_COLS = [("precision", ""), ("ms/step", "(mean)"), ("loss", "first"), ("loss", "last"),
                ("smoothed", "last"), ("max rel. diff", "2nd half"), ("mean rel.", "diff"),
                ("rel. diff", "last step"), ("within", "tolerance"), ("skipped", "steps")]


def summary_cells(args, curves):
    cells = []
    for p, c in curves.items():
        steps = c["steps"]
        if not steps:
            cells.append([p, "failed"] + ["-"] * (len(SUMMARY_COLS) - 2))
            continue
        ms = [s["ms"] for s in steps[1:] if "ms" in s] or [steps[0]["ms"]]
        s = c.get("summary")
        pct = (lambda x: "%+.2f%%" % (100 * x))
        skipped = sum(1 for x in steps if x.get("skipped")) if p == "fp16" else "-"
        cells.append([p, "%.1f" % (sum(ms) / len(ms)), fmt_loss(steps[0].get("loss")),
                      fmt_loss(steps[-1].get("loss")), fmt_loss(c["smooth"][-1]),
                      "%.2f%%" % (100 * s["max"]) if s else "-", pct(s["mean"]) if s else "-",
                      pct(s["last"]) if s and s["last"] is not None else "-",
                      ("yes" if s["within"] else "NO") if s else "-", str(skipped)])
    return cells


def fmt_loss(v):
    return "%.4f" % v if v is not None else "-"


def write_csv(args, curves):
    ps = [p for p in curves if curves[p]["steps"]]
    header = ["step"]
    for p in ps:
        header += ["loss_" + p, "smoothed_" + p] + (["rel_diff_" + p] if p != "fp32" else [])
    if "fp16" in ps:
        header += ["loss_scale_fp16", "skipped_fp16"]
    os.makedirs(os.path.dirname(os.path.abspath(args.csv)), exist_ok=True)
    with open(args.csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        for i in range(args.steps):
            row = [i + 1]
            for p in ps:
                c = curves[p]
                rec = c["steps"][i] if i < len(c["steps"]) else {}
                row += [num(rec.get("loss")), num(c["smooth"][i] if i < len(c["smooth"])
                                                  else None)]
                if p != "fp32":
                    row.append(num(c["rel"][i] if c.get("rel") and i < len(c["rel"]) else None))
            if "fp16" in ps:
                rec = curves["fp16"]["steps"][i] if i < len(curves["fp16"]["steps"]) else {}
                row += [num(rec.get("loss_scale")), rec.get("skipped", "")]
            w.writerow(row)
    print("curves written to %s" % args.csv)


def num(v):
    return "" if v is None else "%.6g" % v


def plot(args, curves, title):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed, so no plot: install Debian's with `apt-get install "
              "python3-matplotlib` (as root) and rerun with --reuse to draw %s from these runs "
              "without training again; the numbers above and the CSV do not need it." % args.png)
        return
    colors = {"fp32": "tab:blue", "bf16": "tab:orange", "fp16": "tab:green"}
    # the curves lie on each other: styles keep every one visible
    styles = {"fp32": ("-", 2.4), "bf16": ("--", 1.4), "fp16": (":", 1.6)}
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7.5), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    for p, c in curves.items():
        if not c["steps"]:
            continue
        x = [s["step"] for s in c["steps"]]
        raw = [s.get("loss") for s in c["steps"]]
        top.plot(x, [v if v is not None else float("nan") for v in raw], color=colors.get(p),
                 alpha=0.18, linewidth=0.6)
        style, width = styles.get(p, ("-", 1.4))
        top.plot(x, [v if v is not None else float("nan") for v in c["smooth"]],
                 color=colors.get(p), linestyle=style, linewidth=width,
                 label="%s (trailing mean of %d steps)" % (p, args.window))
        if c.get("rel"):
            worst = " (2nd half: at most %.2f%%)" % (100 * c["summary"]["max"]) \
                if c.get("summary") else ""
            bottom.plot(x, [100 * v if v is not None else float("nan") for v in c["rel"]],
                        color=colors.get(p), linestyle=style, linewidth=1.2,
                        label="%s vs fp32%s" % (p, worst))
    half = args.steps / 2
    tol = 100 * args.tolerance
    bottom.axhspan(-tol, tol, color="0.9", zorder=0, label="within %.0f%%" % tol)
    bottom.axvspan(half, args.steps, color="tab:purple", alpha=0.06, zorder=0,
                   label="second half (judged)")
    bottom.axhline(0, color="0.5", linewidth=0.6)
    if "fp16" in curves and args.inject_at > 0 and curves["fp16"]["steps"]:
        for ax in (top, bottom):
            ax.axvline(args.inject_at, color=colors["fp16"], linestyle=":", linewidth=1)
        top.annotate("fp16: infinite gradient injected at step %d\n(step skipped, loss scale "
                     "halved)" % args.inject_at, xy=(args.inject_at, top.get_ylim()[1]),
                     xytext=(6, -28), textcoords="offset points", fontsize=8,
                     color=colors["fp16"])
    top.set_ylabel("training loss")
    top.set_title(title, fontsize=10)
    top.legend(fontsize=8)
    top.grid(alpha=0.3)
    bottom.set_xlabel("step")
    bottom.set_ylabel("smoothed loss vs fp32 (%)")
    lim = max([tol * 2] + [abs(100 * v) * 1.1 for c in curves.values() if c.get("rel")
                           for v in c["rel"][args.window:] if v is not None])
    bottom.set_ylim(-lim, lim)
    bottom.legend(fontsize=8, loc="upper right")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(args.png)), exist_ok=True)
    fig.savefig(args.png, dpi=110)
    print("plot written to %s" % args.png)


def main():
    args = parse_args()
    os.makedirs(args.work, exist_ok=True)
    env = bt.bench_env(args.threads)
    header = bt.machine_lines(args, bt.blas_alternative(bt.multiarch()), {})
    print("environment:")
    for line in header:
        print("  " + line)
    if not os.access(args.kiln, os.X_OK):
        sys.exit("no kiln binary at %s (build it, or pass --kiln)" % args.kiln)
    data, err = bt.find_data(args, args.kiln, env)
    if err:
        sys.exit(err)
    title = "kiln %s, B=%d T=%d, %d steps, lr %g cosine, seed %d, data: %s" % (
        args.model, args.batch, args.seq, args.steps, args.lr, args.seed,
        args.data or "Brown corpus (kiln prepare)")
    print(title)
    curves = {}
    for p in args.precisions:
        steps, err = run(args, env, data, p)
        if err:
            print("%s: failed: %s" % (p, err))
        curves[p] = {"steps": steps if not err else [],
                     "smooth": smooth([s.get("loss") for s in steps], args.window)
                     if not err else []}
    if not curves["fp32"]["steps"]:
        sys.exit("the fp32 run failed: nothing to compare against")
    compare(args, curves)
    cells = summary_cells(args, curves)
    print()
    bt.print_text_table(cells, SUMMARY_COLS, ("precision",))
    notes = ["rel. diff = (smoothed loss - fp32's) / fp32's, smoothed by a trailing mean of %d "
             "steps; judged over steps %d-%d against a tolerance of %.1f%%." % (
                 args.window, args.steps // 2 + 1, args.steps, 100 * args.tolerance)]
    for p, c in curves.items():
        if c.get("summary"):
            s = c["summary"]
            notes.append("%s: smoothed loss within %.2f%% of fp32's over the second half "
                         "(largest %+.2f%%): %s." % (p, 100 * s["max"], 100 * s["worst_signed"],
                                                     "within %.1f%%" % (100 * args.tolerance)
                                                     if s["within"] else "NOT within %.1f%%"
                                                     % (100 * args.tolerance)))
    if curves.get("fp16", {}).get("steps"):
        notes.append("fp16 (%s): %s." % (
            "infinite gradient injected at step %d" % args.inject_at if args.inject_at > 0
            else "no injection", fp16_notes(curves["fp16"]["steps"])))
    print("\n".join(notes))
    write_csv(args, curves)
    plot(args, curves, title)
    if args.markdown:
        print("\nMarkdown:\n\n" + title + "\n")
        bt.print_markdown_table(cells, SUMMARY_COLS)
        print("\n" + " ".join(notes))


if __name__ == "__main__":
    main()
