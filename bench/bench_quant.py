#!/usr/bin/env python3
"""Post-training quantization: a dense model against its int8 and int4 files.

    /usr/bin/python3 bench/bench_quant.py --weights W [--kiln build/kiln]
        [--data 'data/brown/val_*.bin'] [--batch 8] [--seq 64] [--threads 2] [--group 32]
        [--eval-batches 40] [--sample-tokens 200] [--rounds 3] [--loss-batches 0]
        [--work build/bench_quant]

Quantizes W with `kiln compress quantize --type int8` and `--type int4 --group G`, then for
the dense file and each quantized one prints, in one table:

  file MB          the safetensors file's size (and the dense file's / its size)
  val loss, ppl    `kiln eval --weights F --data D --batch B --seq T --batches N` (N
                   --loss-batches; 0: every whole batch), and the perplexity's change
                   against the dense model's
  eval tok/s       tokens per second `kiln eval --batches N` prints (N --eval-batches; the
                   model's loading not counted)
  sample tok/s     tokens per second `kiln sample --temperature 0 --tokens N --timing`
                   prints (N --sample-tokens, from the prompt "The"; loading not counted;
                   with kiln's generation cache, each new token alone through the model)

Each timing is the best of --rounds rounds; a round times dense, int8 and int4 one after
the other, so that the three share the machine's state. Ratios ("x dense") compare figures
of the same run. --wait-policy sets OMP_WAIT_POLICY for every model: "default" leaves
OpenMP's own (idle threads spin a while, then sleep), which is what a user gets and the best
for both on a quiet machine; "passive" (threads sleep at once) suits a shared machine, where
a spinning thread that loses its core stalls every product after it, but it costs a wake-up
per parallel region, which a token run alone through a small model pays many times.
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit("failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), p.stderr[-2000:]))
    return p.stdout, p.stderr


def rate(text, what):
    m = re.search(r"([0-9.]+) tokens/s", text)
    if not m:
        sys.exit("%s printed no tokens/s: %r" % (what, text[-500:]))
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"))
    ap.add_argument("--weights", required=True, help="the dense model (safetensors)")
    ap.add_argument("--data", default="data/brown/val_*.bin", help="validation token shards")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--group", type=int, default=32, help="int4 group size")
    ap.add_argument("--loss-batches", type=int, default=0)
    ap.add_argument("--eval-batches", type=int, default=40)
    ap.add_argument("--sample-tokens", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--wait-policy", choices=("default", "passive", "active"), default="default")
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "bench_quant"),
                    help="where the quantized files go (outside the source tree)")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    kiln = args.kiln
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    if args.wait_policy != "default":
        env["OMP_WAIT_POLICY"] = args.wait_policy
    # the dense peer at its best: OpenBLAS picks its kernels for this CPU (a machine-wide
    # OPENBLAS_CORETYPE holds it to slower ones)
    env.pop("OPENBLAS_CORETYPE", None)

    files = [("dense fp32", args.weights)]
    for ty in ("int8", "int4"):
        out = os.path.join(args.work, "model-%s.safetensors" % ty)
        cmd = [kiln, "compress", "quantize", "--weights", args.weights, "--out", out,
               "--type", ty]
        if ty == "int4":
            cmd += ["--group", str(args.group)]
        run(cmd, env)
        files.append((ty if ty == "int8" else "int4 g%d" % args.group, out))

    common = ["--batch", str(args.batch), "--seq", str(args.seq), "--threads", str(args.threads)]
    rows = []
    for name, path in files:
        out, _ = run([kiln, "eval", "--weights", path, "--data", args.data, "--batches",
                      str(args.loss_batches)] + common, env)
        m = re.search(r"tokens (\d+) \| loss ([0-9.]+) \| perplexity ([0-9.]+)", out)
        if not m:
            sys.exit("kiln eval printed no loss: %r" % out)
        rows.append({"name": name, "path": path, "bytes": os.path.getsize(path),
                     "tokens": int(m.group(1)), "loss": float(m.group(2)),
                     "ppl": float(m.group(3)), "eval": [], "sample": []})

    for _ in range(args.rounds):
        for r in rows:
            out, _ = run([kiln, "eval", "--weights", r["path"], "--data", args.data,
                          "--batches", str(args.eval_batches)] + common, env)
            r["eval"].append(rate(out, "kiln eval"))
            _, err = run([kiln, "sample", "--weights", r["path"], "--tokens",
                          str(args.sample_tokens), "--temperature", "0", "--prompt", "The",
                          "--threads", str(args.threads), "--timing"], env)
            r["sample"].append(rate(err, "kiln sample"))

    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
        cpu = re.search(r"model name\s*:\s*(.*)", info).group(1)
        vnni = "avx512_vnni" in info
    except (OSError, AttributeError):
        vnni = False
    print("# %s, %d threads; int8 kernel: %s" % (cpu, args.threads,
                                                  "avx512-vnni" if vnni else "plain"))
    print("# eval: %s, B=%d T=%d, %d tokens for the loss; timings best of %d rounds; "
          "OMP_WAIT_POLICY %s" % (args.data, args.batch, args.seq, rows[0]["tokens"], args.rounds,
                                  env.get("OMP_WAIT_POLICY", "unset (OpenMP's default)")))
    d = rows[0]
    hdr = ("model", "file MB", "x smaller", "val loss", "perplexity", "ppl vs dense",
           "eval tok/s", "x dense", "sample tok/s", "x dense")
    print("| " + " | ".join(hdr) + " |")
    print("|" + " --- |" * len(hdr))
    for r in rows:
        ev, sm = max(r["eval"]), max(r["sample"])
        print("| %s | %.2f | %.2f | %.4f | %.3f | %+.2f%% | %.0f | %.2f | %.1f | %.2f |" % (
            r["name"], r["bytes"] / 1e6, d["bytes"] / r["bytes"], r["loss"], r["ppl"],
            100.0 * (r["ppl"] / d["ppl"] - 1.0), ev, ev / max(d["eval"]), sm,
            sm / max(d["sample"])))


if __name__ == "__main__":
    main()
