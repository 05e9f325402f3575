#!/usr/bin/env python3
"""How often the stability guards stop healthy runs, and how often they catch real divergences.

    python3 bench/bench_guards.py --kiln build/kiln --text ../shared/data/tinyshakespeare.txt \
        [--work build/bench_guards] [--jobs 1] [--markdown]

1. Trains a grid of runs with the spike guards off (--guard-z 0): two tokenizers (GPT-2's and
   bytes), several model sizes, learning rates from ordinary to far too high, three seeds, all
   with kiln's defaults (AdamW, --grad-clip 1); and a second grid made to diverge: AdamW at
   learning rates of 0.6 and 2 without clipping, SGD at 1 without clipping and at 3 with it,
   two seeds.
   Every run's loss and gradient norm per step land in its metrics file (kept under --work;
   a second invocation reuses them, so the analysis can be redone without training again).
2. Labels each run by what its loss did: healthy, or diverged (the loss became non-finite, its
   10-step mean ended more than DIVERGE_NATS above the best 10-step mean it had reached, or
   it rose at any time more than DIVERGE_NATS above the untrained model's first loss).
3. Replays every run's series through the guards' own code (build/bench_guard_replay, which
   links guard.c) for several settings (window, z, norm spikes, the ceiling above the first
   loss), and counts for each: healthy runs that would have had
   a step skipped, healthy runs that would have stopped (max-bad bad steps in a row), and
   diverged runs caught (a step judged bad no later than DIVERGE_GRACE steps after the loss
   first rose DIVERGE_NATS above its best).

The replay judges each series as it was trained without guards: a skipped step would have
changed the steps after it, so the counts after a run's first verdict are approximate; the
first verdict, the one that matters, is exact.
"""
import argparse
import itertools
import json
import math
import os
import subprocess
import sys

DIVERGE_NATS = 0.5
DIVERGE_GRACE = 20
SMOOTH = 10

# (tokenizer, layers, channels, heads, learning rates judged healthy-or-not by outcome)
SHAPES = [
    ("gpt2", 2, 64, 2),
    ("gpt2", 2, 128, 4),
    ("bytes", 4, 128, 4),
    ("bytes", 6, 192, 6),
]
LRS = [6e-4, 2e-3, 6e-3, 2e-2, 6e-2, 2e-1]
SEEDS = [1, 2, 3]
STEPS = 200
# (optimizer, learning rate, --grad-clip): kiln's defaults, then settings that diverge
DEFAULT_OPT = [("adamw", lr, 1) for lr in LRS]
DIVERGING = [("adamw", 0.6, 0), ("adamw", 2.0, 0), ("sgd", 1.0, 0), ("sgd", 3.0, 1)]
DIVERGING_SEEDS = [1, 2]

# Guard settings replayed: (name, window, z, whether a clipped run's norm spike skips its
# update, the ceiling above the first loss in nats (0: none))
SETTINGS = [
    ("window 50, z 6, norm spikes skip, no ceiling (the old default)", 50, 6.0, 1, 0),
    ("window 50, z 6, clipped norm spikes train on, no ceiling", 50, 6.0, 0, 0),
    ("window 50, z 6, clipped norm spikes train on, ceiling 1 nat (the default)", 50, 6.0, 0, 1.0),
    ("window 50, z 6, clipped norm spikes train on, ceiling 0.5 nat", 50, 6.0, 0, 0.5),
    ("window 50, z 6, clipped norm spikes train on, ceiling 2 nats", 50, 6.0, 0, 2.0),
    ("window 100, z 6, norm spikes skip, no ceiling", 100, 6.0, 1, 0),
    ("window 50, z 8, norm spikes skip, no ceiling", 50, 8.0, 1, 0),
    ("window 50, z 4, clipped norm spikes train on, ceiling 1 nat", 50, 4.0, 0, 1.0),
]


def prepare(kiln, text, work, tok):
    out = os.path.join(work, "data-" + tok)
    if not os.path.exists(os.path.join(out, "prepare.json")):
        subprocess.run([kiln, "prepare", "--tokenizer", tok, "--out", out, text], check=True,
                       stdout=subprocess.DEVNULL)
    return out


def run_name(shape, opt, seed):
    tok, L, C, H = shape
    optim, lr, clip = opt
    tail = "" if (optim, clip) == ("adamw", 1) else "-%s-clip%g" % (optim, clip)
    return "%s-L%dC%dH%d-lr%g-s%d%s" % (tok, L, C, H, lr, seed, tail)


def train(kiln, data, work, shape, opt, seed, threads):
    tok, L, C, H = shape
    optim, lr, clip = opt
    m = os.path.join(work, run_name(shape, opt, seed) + ".jsonl")
    if os.path.exists(m + ".done"):
        return m
    if os.path.exists(m):
        os.remove(m)
    cmd = [kiln, "train", "--data", data, "--layers", str(L), "--embd", str(C), "--heads",
           str(H), "--context", "64", "--batch", "8", "--seq", "64", "--steps", str(STEPS),
           "--lr", str(lr), "--optimizer", optim, "--grad-clip", str(clip),
           "--seed", str(seed), "--guard-z", "0", "--save", "",
           "--metrics", m, "--threads", str(threads), "--no-watchdog"]
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0 and not os.path.exists(m):
        sys.exit("bench_guards: %s failed (%d): %s" % (" ".join(cmd), r.returncode, r.stderr))
    open(m + ".done", "w").close()
    return m


def series(path):
    loss, norm = [], []
    with open(path) as f:
        for line in f:
            d = json.loads(line)
            if "event" in d or "loss" not in d:
                continue
            loss.append(d["loss"] if d["loss"] is not None else float("nan"))
            norm.append(d.get("grad_norm", float("nan")))
    return loss, norm


def smoothed(xs, k):
    return [sum(xs[i - k + 1:i + 1]) / k for i in range(k - 1, len(xs))]


def label(loss):
    """(diverged, the step at which the loss first rose DIVERGE_NATS above its best)."""
    bad = [i for i, x in enumerate(loss) if not math.isfinite(x)]
    if bad:
        return True, bad[0] + 1
    s = smoothed(loss, SMOOTH)
    best, onset, above_start = float("inf"), None, False
    for i, x in enumerate(s):
        best = min(best, x)
        if onset is None and x > best + DIVERGE_NATS:
            onset = i + SMOOTH
        above_start = above_start or x > loss[0] + DIVERGE_NATS
    return s[-1] > best + DIVERGE_NATS or above_start, onset


def replay(tool, path, window, z, norm_skip, ceiling, max_bad):
    out = subprocess.run([tool, "--window", str(window), "--z", str(z), "--norm-skip",
                          str(norm_skip), "--ceiling", str(ceiling), "--max-bad", str(max_bad),
                          path],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kiln", default="build/kiln")
    ap.add_argument("--text", default="../shared/data/tinyshakespeare.txt")
    ap.add_argument("--work", default=None, help="default: bench_guards beside --kiln")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-bad", type=int, default=3)
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    kiln = os.path.abspath(a.kiln)
    tool = os.path.join(os.path.dirname(kiln), "bench_guard_replay")
    work = os.path.abspath(a.work or os.path.join(os.path.dirname(kiln), "bench_guards"))
    os.makedirs(work, exist_ok=True)
    if not os.path.exists(a.text):
        sys.exit("bench_guards: no text at %s (--text)" % a.text)
    data = {tok: prepare(kiln, a.text, work, tok) for tok in {s[0] for s in SHAPES}}
    runs = []
    grid = list(itertools.product(SHAPES, DEFAULT_OPT, SEEDS)) + \
        list(itertools.product(SHAPES, DIVERGING, DIVERGING_SEEDS))
    for shape, opt, seed in grid:
        m = train(kiln, data[shape[0]], work, shape, opt, seed, a.threads)
        loss, _ = series(m)
        div, onset = label(loss)
        runs.append({"name": run_name(shape, opt, seed), "path": m, "diverged": div,
                     "onset": onset, "clipped": opt[2] > 0,
                     "final": smoothed(loss, SMOOTH)[-1] if len(loss) >= SMOOTH
                     else float("nan")})
        print("%-34s %s (final 10-step loss %.3f)" % (runs[-1]["name"],
              "diverged at step %s" % onset if div else "healthy", runs[-1]["final"]),
              file=sys.stderr)
    healthy = [r for r in runs if not r["diverged"]]
    diverged = [r for r in runs if r["diverged"]]
    rows = []
    for name, window, z, norm_skip, ceiling in SETTINGS:
        skipped = stopped = caught = stopped_div = 0
        for r in runs:
            # without clipping a norm spike is skipped whatever the setting (the trainer's rule)
            v = replay(tool, r["path"], window, z, int(norm_skip or not r["clipped"]), ceiling,
                       a.max_bad)
            if not r["diverged"]:
                skipped += v["bad_steps"] > 0
                stopped += v["stop_step"] > 0
            else:
                first = v["first_bad"]
                caught += first > 0 and r["onset"] is not None and \
                    first <= r["onset"] + DIVERGE_GRACE
                stopped_div += v["stop_step"] > 0
        rows.append((name, skipped, stopped, caught, stopped_div))
    print("%d runs of %d steps: %d healthy, %d diverged (B=8, T=64, --warmup 10; AdamW with "
          "--grad-clip 1 at learning rates %s, seeds %s; and %s, seeds %s)"
          % (len(runs), STEPS, len(healthy), len(diverged), LRS, SEEDS,
             ", ".join("%s lr %g clip %g" % o for o in DIVERGING), DIVERGING_SEEDS))
    for r in diverged:
        print("  diverged: %s (onset step %s)" % (r["name"], r["onset"]))
    head = ["guard setting", "healthy runs with a step skipped", "healthy runs stopped (%d bad "
            "in a row)" % a.max_bad, "diverged runs caught (a bad step by onset + %d)" %
            DIVERGE_GRACE, "diverged runs stopped"]
    fmt = (lambda c: "| " + " | ".join(c) + " |") if a.markdown else (lambda c: "  ".join(c))
    print(fmt(head))
    if a.markdown:
        print(fmt(["---"] * len(head)))
    for name, sk, st, ca, sd in rows:
        print(fmt([name, "%d/%d" % (sk, len(healthy)), "%d/%d" % (st, len(healthy)),
                   "%d/%d" % (ca, len(diverged)), "%d/%d" % (sd, len(diverged))]))


if __name__ == "__main__":
    main()
