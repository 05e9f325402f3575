#!/usr/bin/python3
"""What each of kiln's fusions and recomputation modes costs or saves, in one run.

    /usr/bin/python3 bench/bench_ablation.py [--kiln build/kiln] [--data SHARDS]
        [--model gpt2-124m] [--shape 4x64 [--shape 8x256 ...]] [--precision fp32,bf16]
        [--warmup 2] [--steps 5] [--rounds 1] [--threads 2] [--chunk 256]
        [--tables fusion,recompute] [--work DIR] [--markdown]

For every shape (B x T) and precision, each setting is one `kiln train` process of
`warmup` untimed and `steps` timed steps (the step times read from its --metrics file),
and two tables are printed:

  (a) fusions: all on (kiln's defaults), --no-fuse-gelu alone, --no-fuse-residual-ln
      alone, --classifier-chunk N (N rows of logits at a time, against the default 0: all
      rows at once), and all fusions off (both --no-fuse flags, --classifier-chunk 0);
  (b) recomputation: --recompute none, gelu, attention and block, with the ratios of
      step time and planned activation memory to none, and whether block meets the
      target: at least 60% less activation memory for at most 35% more time.

The columns are ms/step (mean and best of the timed steps), tokens/s, the planned
activations and workspace (parsed from the "memory plan" line kiln prints before step 1;
kiln gives them to 0.1 MiB, or to the MiB above 1 GiB), peak RSS (/usr/bin/time -v), and
the largest difference of any step's loss from the reference row's (fusions and
recomputation should change the loss by rounding at most). The default setting and
"recompute none" are one run, shown in both tables.

--rounds R runs the whole set R times, setting after setting, and pools the timed steps:
on a machine that is not idle, drift then hits every setting alike. Every run has
OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE removed (this machine sets OPENBLAS_CORETYPE, which
holds OpenBLAS to an older kernel) and OMP_NUM_THREADS=--threads, as bench_train.py does.
"""

import argparse
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_train as bt  # noqa: E402  (bench/bench_train.py: environment, data, tables)

# (label, flags); the chunk row's N comes from --chunk
FUSIONS = [("all on (default)", []),
           ("GELU not fused", ["--no-fuse-gelu"]),
           ("residual+LN not fused", ["--no-fuse-residual-ln"]),
           ("classifier chunk {chunk}", ["--classifier-chunk", "{chunk}"]),
           ("all fusions off", ["--no-fuse-gelu", "--no-fuse-residual-ln",
                                "--classifier-chunk", "0"])]
RECOMPUTE = ["none", "gelu", "attention", "block"]
TARGET_MEMORY, TARGET_TIME = 0.60, 0.35  # block: >= 60% less activation memory, <= 35% slower
# "memory plan: parameters 474.8 MiB, ..., batches 0.0 MiB (B=4, T=64): 2105 MiB (2.1 GiB) in
# all": sizes in MiB, a GiB figure in brackets after those of 1 GiB and more
PLAN_RE = re.compile(r"memory plan: (.*?) \(B=\d+, T=\d+\): ([0-9.]+) MiB(?: \([0-9.]+ GiB\))? in all")
UNIT = {"MiB": 1 << 20}


def parse_plan(text):
    """The first "memory plan" line's categories in bytes ({"activations": ..., "all": ...}),
    or None."""
    m = PLAN_RE.search(text)
    if not m:
        return None
    plan = {"all": float(m.group(2)) * UNIT["MiB"]}
    for name, value in re.findall(r"([a-z ]+?) ([0-9.]+) MiB(?: \([0-9.]+ GiB\))?", m.group(1)):
        plan[name.strip()] = float(value) * UNIT["MiB"]
    return plan


def settings(args):
    """(table, label, flags) of every run: the fusion rows, then the recompute rows; the
    default run stands for "recompute none" too."""
    out = []
    if "fusion" in args.tables:
        for label, flags in FUSIONS:
            out.append(("fusion", label.format(chunk=args.chunk),
                        [f.format(chunk=args.chunk) for f in flags]))
    if "recompute" in args.tables:
        for mode in RECOMPUTE:
            if mode == "none" and "fusion" in args.tables:
                continue  # the fusion table's default run
            out.append(("recompute", mode, [] if mode == "none" else ["--recompute", mode]))
    return out


def run_one(args, env, data, B, T, precision, flags, tag):
    """One `kiln train`: {ms: [timed step ms], losses, plan, rss} or {error}."""
    metrics = os.path.join(args.work, tag + ".jsonl")
    log = os.path.join(args.work, tag + ".log")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [args.kiln, "train", "--model", args.model, "--batch", str(B), "--seq", str(T),
           "--steps", str(args.warmup + args.steps), "--data", data, "--metrics", metrics,
           "--threads", str(args.threads), "--save", "", "--eval-every", "0",
           "--precision", precision] + flags
    if args.peak:  # else each run measures the peak for its MFU figure: seconds, and noise
        cmd += ["--peak-gflops", "%.3f" % args.peak]
    rc, out, rss, _ = bt.run_timed(cmd, env, log)
    steps = []
    if os.path.exists(metrics):
        steps = [json.loads(x) for x in open(metrics) if x.strip().startswith("{")]
    timed = [s["ms"] for s in steps if "ms" in s][args.warmup:]
    if rc != 0 or not timed:
        why = out.strip().splitlines()[-1] if out.strip() else "no output"
        return {"error": "rc %d, %d timed steps (%s; see %s)" % (rc, len(timed), why, log)}
    if rss is None:
        rss = max(s.get("peak_rss_mb", 0.0) for s in steps)
    return {"ms": timed, "losses": [s.get("loss") for s in steps], "plan": parse_plan(out),
            "rss": rss}


def pool(runs):
    """The rounds of one setting as one result: their timed steps together."""
    good = [r for r in runs if "error" not in r]
    if not good:
        return runs[-1]
    ms = [x for r in good for x in r["ms"]]
    return {"ms": ms, "mean": sum(ms) / len(ms), "best": min(ms), "losses": good[0]["losses"],
            "plan": good[0]["plan"], "rss": max(r["rss"] or 0.0 for r in good) or None}


def mib(plan, *keys):
    if not plan or any(k not in plan for k in keys):
        return "-"
    return "%.1f" % (sum(plan[k] for k in keys) / (1 << 20))


def ratio(a, b, fmt="%.2f"):
    return fmt % (a / b) if a and b else "-"


def loss_delta(r, ref):
    """The largest |loss - reference loss| over the steps both ran, as text."""
    pairs = [(a, b) for a, b in zip(r["losses"], ref["losses"]) if a is not None and
             b is not None]
    if not pairs:
        return "-"
    d = max(abs(a - b) for a, b in pairs)
    return "0" if d == 0 else "%.1e" % d


FUSION_COLS = [("setting", ""), ("flags", ""), ("ms/step", "(mean)"), ("best ms", ""),
               ("tokens/s", "(mean)"), ("x default", "(mean)"), ("x default", "(best)"),
               ("activations", "MiB (plan)"), ("workspace", "MiB (plan)"),
               ("act.+work.", "MiB (plan)"), ("peak RSS", "MiB"), ("max loss", "diff")]
RECOMPUTE_COLS = [("recompute", ""), ("ms/step", "(mean)"), ("best ms", ""),
                  ("tokens/s", "(mean)"), ("time x none", "(mean)"), ("time x none", "(best)"),
                  ("activations", "MiB (plan)"), ("activations", "x none"),
                  ("act.+work.", "MiB (plan)"), ("peak RSS", "MiB"), ("max loss", "diff")]
LEFT = ("setting", "flags", "recompute")


def row_cells(label, flags, r, ref, tokens, fusion):
    if "error" in r:
        width = len(FUSION_COLS if fusion else RECOMPUTE_COLS)
        return [label] + ([" ".join(flags) or "-"] if fusion else []) + \
            ["failed"] + ["-"] * (width - (3 if fusion else 2))
    plan, rp = r["plan"], ref.get("plan") if "error" not in ref else None
    common = ["%.1f" % r["mean"], "%.1f" % r["best"], "%.1f" % (tokens / r["mean"] * 1e3)]
    refmean, refbest = ref.get("mean"), ref.get("best")
    times = [ratio(r["mean"], refmean), ratio(r["best"], refbest)]
    rss = "%.0f" % r["rss"] if r["rss"] else "-"
    delta = loss_delta(r, ref) if "error" not in ref else "-"
    if fusion:
        return [label, " ".join(flags) or "-"] + common + times + [
            mib(plan, "activations"), mib(plan, "workspace"),
            mib(plan, "activations", "workspace"), rss, delta]
    act = plan.get("activations") if plan else None
    return [label] + common + times + [
        mib(plan, "activations"), ratio(act, rp.get("activations") if rp else None),
        mib(plan, "activations", "workspace"), rss, delta]


def target_line(res):
    """Block recompute against the issue's target, from the recompute table's runs."""
    none, block = res.get("none"), res.get("block")
    if not none or not block or "error" in none or "error" in block or \
            not (none["plan"] and block["plan"]):
        return "block recompute target: not measured"
    saved = 1 - block["plan"]["activations"] / none["plan"]["activations"]
    slower, slower_best = block["mean"] / none["mean"] - 1, block["best"] / none["best"] - 1
    ok = saved >= TARGET_MEMORY and slower <= TARGET_TIME
    return ("block recompute target (at least %.0f%% less activation memory for at most %.0f%% "
            "more time): %.0f%% less, %+.0f%% time (mean; %+.0f%% best): %s" % (
                100 * TARGET_MEMORY, 100 * TARGET_TIME, 100 * saved, 100 * slower,
                100 * slower_best, "met" if ok else "NOT met"))


def parse_shape(text):
    m = re.fullmatch(r"(\d+)x(\d+)", text)
    if not m:
        sys.exit("--shape wants BxT, e.g. 8x256, not %r" % text)
    return int(m.group(1)), int(m.group(2))


def parse_args():
    ap = argparse.ArgumentParser(description="kiln fusion and recomputation ablation")
    ap.add_argument("--kiln", default=os.path.join(bt.ROOT, "build", "kiln"))
    ap.add_argument("--data", help="training shards (file, folder or glob)")
    ap.add_argument("--model", default="gpt2-124m", choices=sorted(bt.PRESETS))
    ap.add_argument("--shape", action="append", metavar="BxT",
                    help="batch x sequence length, repeatable (default 4x64; the larger "
                    "shape of the README: --shape 4x64 --shape 8x256)")
    ap.add_argument("--precision", default="fp32,bf16", metavar="P[,P...]",
                    help="kiln precisions, each its own tables (default fp32,bf16)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per run")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every setting this many times, in turn, pooling the timed steps")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=256,
                    help="--classifier-chunk of the chunked-classifier row (default 256)")
    ap.add_argument("--tables", default="fusion,recompute",
                    help="fusion, recompute or both (default)")
    ap.add_argument("--peak-gflops", type=float, default=0.0, dest="peak",
                    help="pass to kiln for its MFU figure (0: `kiln bench peak` once at the "
                    "start)")
    ap.add_argument("--work", default=os.path.join(bt.ROOT, "build", "bench_ablation"),
                    help="folder for logs, metrics and prepared data")
    ap.add_argument("--markdown", action="store_true", help="also print the tables as Markdown")
    args = ap.parse_args()
    args.shapes = [parse_shape(s) for s in (args.shape or ["4x64"])]
    args.precisions = bt.parse_precisions(args.precision)
    args.tables = [t.strip() for t in args.tables.split(",") if t.strip()]
    if not args.tables or any(t not in ("fusion", "recompute") for t in args.tables):
        sys.exit("--tables wants fusion, recompute or fusion,recompute")
    if args.rounds < 1 or args.steps < 1:
        sys.exit("--rounds and --steps must be at least 1")
    return args


def measure(args, env, data):
    """{(B, T, precision): {(table, label): pooled result}}, running round after round."""
    runs = {}
    todo = [(B, T, p, s) for B, T in args.shapes for p in args.precisions for s in settings(args)]
    for k in range(args.rounds):
        for B, T, p, (table, label, flags) in todo:
            tag = "%s_B%dT%d_%s_%s_r%d" % (args.model, B, T, p,
                                           re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-"),
                                           k + 1)
            r = run_one(args, env, data, B, T, p, flags, tag)
            runs.setdefault((B, T, p), {}).setdefault((table, label), []).append(r)
            print("  round %d, B=%d T=%d %s, %s: %s" % (
                k + 1, B, T, p, label, r["error"] if "error" in r else
                "%.1f ms/step mean, %.1f best" % (sum(r["ms"]) / len(r["ms"]), min(r["ms"]))))
            sys.stdout.flush()
    return {key: {k: pool(v) for k, v in by.items()} for key, by in runs.items()}


def report(args, results, markdown):
    for (B, T, p), res in results.items():
        tokens = B * T
        title = "%s B=%d T=%d, %s: %d warm-up + %d timed steps x %d round(s), %d threads" % (
            args.model, B, T, p, args.warmup, args.steps, args.rounds, args.threads)
        default = res.get(("fusion", FUSIONS[0][0])) or res.get(("recompute", "none"))
        blocks = []
        if "fusion" in args.tables:
            cells = [row_cells(label, flags, res[("fusion", label)], default, tokens, True)
                     for _, label, flags in settings(args) if _ == "fusion"]
            notes = ["x default = ms/step / the default's (above 1: slower without that "
                     "fusion)."]
            if args.chunk >= tokens:
                notes.append("classifier chunk %d: B x T = %d rows fit in one chunk, so it "
                             "is one chunk, as with chunk 0 (--chunk %d would split them)." % (
                                 args.chunk, tokens, max(1, tokens // 4)))
            blocks.append(("(a) fusions", FUSION_COLS, cells, notes))
        if "recompute" in args.tables:
            by_mode = {m: res.get(("recompute", m)) or (default if m == "none" else None)
                       for m in RECOMPUTE}
            none = by_mode["none"] or {"error": "none not run"}
            cells = [row_cells(m, [], by_mode[m], none, tokens, False) for m in RECOMPUTE]
            notes = ["time x none = ms/step / recompute none's; activations x none = planned "
                     "activations / none's."]
            if "fusion" in args.tables:
                notes.append("recompute none is the fusion table's default run.")
            notes.append(target_line(by_mode))
            blocks.append(("(b) recomputation", RECOMPUTE_COLS, cells, notes))
        for name, cols, cells, notes in blocks:
            if markdown:
                print("\n**%s, %s**\n" % (name, title))
                bt.print_markdown_table(cells, cols)
                print("\n" + " ".join(notes))
            else:
                print("\n%s, %s\n" % (name, title))
                bt.print_text_table(cells, cols, LEFT)
                print("\n".join(notes))


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
    if not args.peak:
        args.peak, note, _ = bt.kiln_peak(args.kiln, env, args.work, "start")
        print("peak: %s" % note)
    data, err = bt.find_data(args, args.kiln, env)
    if err:
        sys.exit(err)
    print("data %s; model %s; shapes %s; precisions %s; %d settings each" % (
        data, args.model, ", ".join("B=%d T=%d" % s for s in args.shapes),
        ", ".join(args.precisions), len(settings(args))))
    results = measure(args, env, data)
    report(args, results, False)
    if args.markdown:
        print("\nMarkdown:\n")
        for line in header:
            print("- " + line)
        report(args, results, True)


if __name__ == "__main__":
    main()
