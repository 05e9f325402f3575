#!/usr/bin/python3
"""Training-step benchmark: kiln against PyTorch (fp32 and bf16 autocast), in one run.

    /usr/bin/python3 bench/bench_train.py [--kiln build/kiln] [--data SHARDS]
        [--model gpt2-124m] [--batch 4] [--seq 64] [--warmup 2] [--steps 5] [--threads 2]

Each system trains the same model (random initialisation, AdamW) at the same shapes for
`warmup` untimed and `steps` timed steps, in its own process:

  kiln          `kiln train --model M --batch B --seq T --steps N --data D --metrics F`,
                the per-step times read from F (the JSON Lines metrics file)
  PyTorch fp32  bench/torch_gpt.py --dtype fp32 (tests/ref/gpt_model.py, torch.optim.AdamW)
  PyTorch bf16  bench/torch_gpt.py --dtype bf16 (forward under CPU autocast, fp32 master)

and the table gives ms/step (mean of the timed steps), tokens/s, MFU against the fp32
GEMM peak that `kiln bench peak` measures in the same run, peak RSS (/usr/bin/time -v),
and kiln's speed and memory as ratios to each peer. FLOPs per step are counted as kiln
counts them (kiln_gpt_flops_per_token, with the real vocabulary of 50257; kiln computes
the head over 50304 padded columns, which is not credited).

Every run has OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE removed from its environment (this
machine sets them, which pins OpenBLAS to an older kernel), and OMP_NUM_THREADS set to
--threads; the script prints the OpenBLAS build and kernel that those settings select.
kiln needs token shards for its data: --data, or data/brown/train_*.bin, or else it runs
`kiln prepare` (the Brown corpus, GPT-2 tokenizer) into --work first.
"""

import argparse
import ctypes
import glob
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "ref"))
from gpt_model import flops_per_token  # noqa: E402  (no torch import at module level)

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
TORCH_PY = "/usr/bin/python3"  # Debian's PyTorch
PRESETS = {"gpt2-124m": (12, 12, 768), "gpt2-350m": (24, 16, 1024), "d12": (12, 12, 768),
           "d6": (6, 6, 384), "d4": (4, 4, 256)}
VOCAB = 50257
OPENBLAS_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
LLMC_CITED = "llm.c (cited)"


def bench_env(threads):
    env = dict(os.environ)
    for k in OPENBLAS_VARS:
        env.pop(k, None)
    env["OMP_NUM_THREADS"] = str(threads)
    return env


def openblas_info(env):
    """Build string and kernel of the OpenMP OpenBLAS kiln links, as a child with `env`
    reports them (the kernel is chosen at load time from the environment)."""
    code = ("import ctypes,sys; l=ctypes.CDLL(sys.argv[1]); "
            "l.openblas_get_config.restype=l.openblas_get_corename.restype=ctypes.c_char_p; "
            "print(l.openblas_get_config().decode()); print(l.openblas_get_corename().decode())")
    for lib in ("/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0",
                "/usr/lib/aarch64-linux-gnu/openblas-openmp/libopenblas.so.0", "libopenblas.so.0"):
        try:
            out = subprocess.run([sys.executable, "-c", code, lib], env=env, check=True,
                                 capture_output=True, text=True).stdout.split("\n")
            return out[0], out[1]
        except (subprocess.CalledProcessError, IndexError):
            continue
    return "unknown", "unknown"


def run_timed(cmd, env, log_path):
    """Run cmd under /usr/bin/time -v; returns (returncode, output, peak RSS MiB or None)."""
    full = ["/usr/bin/time", "-v"] + cmd if os.path.exists("/usr/bin/time") else cmd
    p = subprocess.run(full, env=env, capture_output=True, text=True)
    out = p.stdout + p.stderr
    with open(log_path, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n" + out)
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", out)
    return p.returncode, out, (int(m.group(1)) / 1024.0 if m else None)


def kiln_peak(kiln, env, work, tag):
    """`kiln bench peak` -> (GFLOP/s, its report line) or (None, why)."""
    if not os.access(kiln, os.X_OK):
        return None, "no kiln binary at %s" % kiln
    log = os.path.join(work, "peak_%s.log" % tag)
    rc, out, _ = run_timed([kiln, "bench", "peak"], env, log)
    m = re.search(r"^(.*?([0-9.]+)\s*GFLOP/s.*)$", out, re.M)
    if rc != 0 or not m:
        return None, "kiln bench peak failed (see %s)" % log
    return float(m.group(2)), m.group(1).strip()


def find_data(args, kiln, env):
    if args.data:
        return args.data, None
    shards = sorted(glob.glob(os.path.join(ROOT, "data", "brown", "train_*.bin")))
    if shards:
        return os.path.join(ROOT, "data", "brown", "train_*.bin"), None
    out_dir = os.path.join(args.work, "data")
    rc, _, _ = run_timed([kiln, "prepare", "--out", out_dir], env,
                         os.path.join(args.work, "prepare.log"))
    shards = sorted(glob.glob(os.path.join(out_dir, "train_*.bin")))
    if rc == 0 and shards:
        return os.path.join(out_dir, "train_*.bin"), None
    return None, ("no token shards: pass --data, or run `kiln prepare` (see %s/prepare.log)"
                  % args.work)


def run_kiln(args, kiln, env, data, peak):
    metrics = os.path.join(args.work, "kiln_metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    n = args.warmup + args.steps
    cmd = [kiln, "train", "--model", args.model, "--batch", str(args.batch), "--seq",
           str(args.seq), "--steps", str(n), "--data", data, "--metrics", metrics,
           "--threads", str(args.threads), "--save", "", "--eval-every", "0"]
    if peak:  # the same denominator for kiln's own MFU figure
        cmd += ["--peak-gflops", "%.3f" % peak]
    rc, out, rss = run_timed(cmd, env, os.path.join(args.work, "kiln_train.log"))
    if rc != 0 or not os.path.exists(metrics):
        return None, "kiln train failed (rc %d, see %s/kiln_train.log)" % (rc, args.work)
    steps = [json.loads(line) for line in open(metrics) if line.strip().startswith("{")]
    steps = [s for s in steps if "ms" in s]
    timed = steps[args.warmup:]
    if not timed:
        return None, "kiln wrote %d step records, expected %d" % (len(steps), n)
    ms = [s["ms"] for s in timed]
    return {"ms": sum(ms) / len(ms), "ms_min": min(ms), "ms_max": max(ms), "rss": rss,
            "own_mfu": sum(s.get("mfu", 0.0) for s in timed) / len(timed),
            "losses": [s.get("loss") for s in steps]}, None


def run_torch(args, env, dtype, peak):
    cmd = [TORCH_PY, os.path.join(ROOT, "bench", "torch_gpt.py"), "--model", args.model,
           "--batch", str(args.batch), "--seq", str(args.seq), "--warmup", str(args.warmup),
           "--steps", str(args.steps), "--threads", str(args.threads), "--dtype", dtype,
           "--json"]
    if peak:
        cmd += ["--peak-gflops", "%.3f" % peak]
    rc, out, rss = run_timed(cmd, env, os.path.join(args.work, "torch_%s.log" % dtype))
    lines = [x for x in out.splitlines() if x.startswith("{")]
    if rc != 0 or not lines:
        return None, "PyTorch %s failed (rc %d, see %s/torch_%s.log)" % (dtype, rc, args.work,
                                                                          dtype)
    s = json.loads(lines[-1])
    return {"ms": s["ms_per_step"], "ms_min": s["ms_min"], "ms_max": s["ms_max"],
            "rss": rss if rss else s["peak_rss_mb"], "losses": s["losses"]}, None


def fmt(v, spec, none="-"):
    return none if v is None else spec % v


def print_table(rows, tokens, flops_step, peak):
    kiln = rows.get("kiln fp32")
    head = "%-16s %10s %9s %10s %7s %10s %9s %9s %8s"
    print()
    print(head % ("system", "ms/step", "best ms", "tokens/s", "MFU", "peak RSS", "kiln x",
                  "kiln x", "kiln"))
    print(head % ("", "(mean)", "", "(mean)", "(mean)", "", "(mean)", "(best)", "memory"))
    for name, r in rows.items():
        if name == LLMC_CITED:
            # Measured earlier on this machine class; only kiln's ratio is computed here.
            speed = "%.2f-%.2f" % (4000 / kiln["ms"], 4900 / kiln["ms"]) if kiln else "-"
            best = "%.2f-%.2f" % (4000 / kiln["ms_min"], 4900 / kiln["ms_min"]) if kiln else "-"
            print(head % (name, "4000-4900", "-", "52-63", "-", "-", speed, best, "-"))
            continue
        if r is None:
            print(head % (name, "failed", "-", "-", "-", "-", "-", "-", "-"))
            continue
        tps = tokens / r["ms"] * 1e3
        mfu = "%.1f%%" % (100 * flops_step / (r["ms"] / 1e3) / (peak * 1e9)) if peak else "-"
        peer = kiln is not None and r is not kiln
        speed = "%.2f" % (r["ms"] / kiln["ms"]) if peer else "-"
        best = "%.2f" % (r["ms_min"] / kiln["ms_min"]) if peer else "-"
        mem = "%.2f" % (kiln["rss"] / r["rss"]) if peer and kiln["rss"] and r["rss"] else "-"
        rss = "%.0f MiB" % r["rss"] if r["rss"] else "-"
        print(head % (name, "%.1f" % r["ms"], "%.1f" % r["ms_min"], "%.1f" % tps, mfu, rss,
                      speed, best, mem))


def main():
    ap = argparse.ArgumentParser(description="kiln vs PyTorch training-step benchmark")
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"))
    ap.add_argument("--data", help="kiln's training shards (file, folder or glob)")
    ap.add_argument("--model", default="gpt2-124m", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "bench_train"),
                    help="folder for logs, metrics and prepared data")
    ap.add_argument("--only", choices=["kiln", "torch"], help="run one side only")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)

    env = bench_env(args.threads)
    was = ", ".join("%s=%s" % (k, os.environ[k]) for k in OPENBLAS_VARS if k in os.environ)
    print("environment: OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset for every run (they were: "
          "%s); OMP_NUM_THREADS=%d" % (was or "not set", args.threads))
    config, kernel = openblas_info(env)
    print("OpenBLAS: %s; kernel %s" % (config, kernel))

    L, NH, C = PRESETS[args.model]
    tokens = args.batch * args.seq
    flops_step = flops_per_token(L, C, VOCAB, args.seq) * tokens
    print("model %s (L=%d NH=%d C=%d V=%d), B=%d T=%d: %.1f GFLOP per step; %d warm-up + %d "
          "timed steps" % (args.model, L, NH, C, VOCAB, args.batch, args.seq, flops_step / 1e9,
                           args.warmup, args.steps))
    peak, note = kiln_peak(args.kiln, env, args.work, "start")
    print("peak (start): " + note)
    sys.stdout.flush()

    rows = {}
    if args.only != "torch":
        if os.access(args.kiln, os.X_OK):
            data, err = find_data(args, args.kiln, env)
        else:
            data, err = None, "no kiln binary at %s (build it, or pass --kiln)" % args.kiln
        r, err = run_kiln(args, args.kiln, env, data, peak) if data else (None, err)
        rows["kiln fp32"] = r
        if err:
            print("kiln: " + err)
        else:
            print("kiln: own MFU figure %.1f%% (metrics file)" % (100 * r["own_mfu"]))
        sys.stdout.flush()
    if args.only != "kiln":
        for dtype in ("fp32", "bf16"):
            r, err = run_torch(args, env, dtype, peak)
            rows["PyTorch " + dtype] = r
            if err:
                print(err)
            sys.stdout.flush()
    # A peak measured while something else ran is too low, so it is measured again at the
    # end and the better of the two is MFU's denominator.
    peak2, note2 = kiln_peak(args.kiln, env, args.work, "end")
    print("peak (end): " + note2)
    if peak or peak2:
        peak = max(peak or 0.0, peak2 or 0.0)
        print("MFU against %.1f GFLOP/s, the better of the two" % peak)
    else:
        print("no peak measured: MFU not reported")
    rows[LLMC_CITED] = None
    print_table(rows, tokens, flops_step, peak)
    best_ms = min((r["ms"] for r in rows.values() if r), default=None)
    if peak and best_ms and flops_step / (best_ms / 1e3) > peak * 1e9:
        print("\nWARNING: an MFU above 100% means the peak was measured while the machine was "
              "busy; rerun on an idle machine.")
    print("\nkiln x = peer ms/step / kiln ms/step (above 1: kiln is faster), of the mean and of "
          "the best timed step;\nkiln memory = kiln peak RSS / peer peak RSS (below 1: kiln "
          "uses less).")
    print("llm.c: figures measured earlier on this machine class (gpt2-124m, B=4, T=64, "
          "2 threads), not in this run.")


if __name__ == "__main__":
    main()
