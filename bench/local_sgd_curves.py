#!/usr/bin/python3
"""Loss curves and traffic of kiln's ways to send less: plain data parallelism (gradients
reduced every step, in fp32 or bf16), local SGD (weights averaged every H steps) and DiLoCo
(an outer Nesterov step on the averaged change), on the same data, seed and ranks.

    /usr/bin/python3 bench/local_sgd_curves.py [--kiln build/kiln] [--ranks 2] [--model d6]
        [--batch 4] [--seq 64] [--steps 300] [--eval-every 25] [--lr 6e-4]
        [--png docs/local_sgd.png] [--csv docs/local_sgd.csv] [--markdown]

Each run is `mpirun -np R kiln train` with --val-data, so the curve compared is the
validation loss (every rank's model evaluated on its slice of the same validation batches,
averaged: between averages the ranks' models differ, and the mean of their losses is what
the runs are judged by). Bytes are what each rank sent per step, as kiln counts them (the
textbook ring algorithm's payload), averaged over the run's steps.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ensure_data(kiln, out_dir):
    """The Brown corpus shards of `kiln prepare`: data/brown when there, else made."""
    brown = os.path.join(ROOT, "data", "brown")
    if os.path.exists(os.path.join(brown, "prepare.json")):
        return brown
    if not os.path.exists(os.path.join(out_dir, "prepare.json")):
        subprocess.run([kiln, "prepare", "--out", out_dir], check=True,
                       stdout=subprocess.DEVNULL)
    return out_dir

RUNS = [
    ("data parallel, fp32 gradients", []),
    ("data parallel, bf16 gradients", ["--reduce-dtype", "bf16"]),
    ("local SGD, H=4", ["--local-steps", "4"]),
    ("local SGD, H=16", ["--local-steps", "16"]),
    ("DiLoCo, H=16 (outer lr 0.7, Nesterov 0.9)",
     ["--local-steps", "16", "--outer-lr", "0.7", "--outer-momentum", "0.9"]),
]


def mpirun():
    exe = shutil.which("mpirun") or shutil.which("mpiexec")
    if not exe:
        sys.exit("no mpirun: apt-get install openmpi-bin libopenmpi-dev")
    return [exe, "--oversubscribe", "--allow-run-as-root"]


def run(args, name, extra, work):
    metrics = os.path.join(work, f"run{RUNS.index((name, extra))}.jsonl")
    cmd = mpirun() + ["-np", str(args.ranks), args.kiln, "train", "--model", args.model,
                      "--batch", str(args.batch), "--seq", str(args.seq), "--steps",
                      str(args.steps), "--lr", str(args.lr), "--seed", "1337", "--threads", "1",
                      "--data", args.data, "--val-data", args.val, "--eval-every",
                      str(args.eval_every), "--eval-batches", str(args.eval_batches),
                      "--metrics", metrics, "--save", "", "--peak-gflops", "100"] + extra
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        env.pop(k, None)
    print(f"{name}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{name} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    rows = [json.loads(line) for line in open(metrics) if line.strip()]
    rows = [r for r in rows if "event" not in r]  # watchdog events (stragglers)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kiln", default="build/kiln")
    ap.add_argument("--data", default=None, help="training shards (default: the Brown corpus)")
    ap.add_argument("--val", default=None, help="validation shards")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--model", default="d6")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--eval-batches", type=int, default=8)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--work", default="build/local_sgd")
    ap.add_argument("--png", default="docs/local_sgd.png")
    ap.add_argument("--csv", default="docs/local_sgd.csv")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    if not args.data:
        d = ensure_data(args.kiln, os.path.join(args.work, "data"))
        args.data = os.path.join(d, "train_*.bin")
        args.val = os.path.join(d, "val_*.bin")
    elif not args.val:
        sys.exit("--data needs --val")
    results = [(name, run(args, name, extra, args.work)) for name, extra in RUNS]

    head = ("| run | val loss at " + " | ".join(
        str(s) for s in range(args.eval_every, args.steps + 1, args.eval_every * 3)) +
        " | final val loss | x plain's final | bytes sent per step per rank | x plain's bytes |")
    lines = [head, "| " + " | ".join(["---"] * (head.count("|") - 1)) + " |"]
    base_val, base_bytes = None, None
    csv = ["step," + ",".join(f'"{n}"' for n, _ in results)]
    vals = {}
    for name, rows in results:
        v = {r["step"]: r["val_loss"] for r in rows if "val_loss" in r}
        vals[name] = v
        b = sum(r.get("comm_bytes", 0) for r in rows) / len(rows)
        final = v[max(v)]
        if base_val is None:
            base_val, base_bytes = final, b
        picks = [f"{v[s]:.4f}" if s in v else "-"
                 for s in range(args.eval_every, args.steps + 1, args.eval_every * 3)]
        lines.append(f"| {name} | " + " | ".join(picks) +
                     f" | {final:.4f} | {final / base_val:.4f} | {b / 1e6:.2f} MB | "
                     f"{b / base_bytes:.3f} |")
    steps = sorted(vals[results[0][0]])
    for s in steps:
        csv.append(f"{s}," + ",".join(f"{vals[n].get(s, float('nan')):.6f}" for n, _ in results))
    with open(args.csv, "w") as f:
        f.write("\n".join(csv) + "\n")
    print(f"kiln {args.model}, {args.ranks} ranks x B={args.batch} T={args.seq} (1 thread "
          f"each), {args.steps} steps, AdamW lr {args.lr} cosine, seed 1337, validation every "
          f"{args.eval_every} steps ({args.eval_batches} batches)\n")
    print("\n".join(lines))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for name, _ in results:
            xs = sorted(vals[name])
            ax.plot(xs, [vals[name][x] for x in xs], marker="o", ms=3, label=name)
        ax.set_xlabel("step")
        ax.set_ylabel("validation loss")
        ax.set_title(f"kiln {args.model}, {args.ranks} ranks: less traffic, same data")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(args.png, dpi=110)
        print(f"\nplot written to {args.png}; curves to {args.csv}")
    except ImportError:
        print(f"\n(no matplotlib: apt-get install python3-matplotlib for the plot); curves to "
              f"{args.csv}")


if __name__ == "__main__":
    main()
