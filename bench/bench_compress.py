#!/usr/bin/env python3
"""Smaller models against the dense model they come from, in one run.

    bench_compress.py --kiln build/kiln [--text ../shared/data/tinyshakespeare.txt]
                      [--steps 600] [--tune 300] [--struct-heads 0.3] [--struct-mlp 0.3]
                      [--lowrank-energy 0.9] [--lowrank-rank 48] [--rounds 5] [--sample-tokens 63]
                      [--speed-batches 60]

Trains a dense d6-shaped model (6 layers, 6 heads, 192 channels, byte-level tokens, T=64,
B=16) on the text, then from it or beside it:
  - gradual magnitude pruning to 50% of the block matrices while fine-tuning --tune steps
    (Zhu and Gupta's schedule over the first two thirds), against the dense model fine-tuned
    the same steps;
  - structured pruning (kiln compress prune): --struct-heads of each layer's heads and
    --struct-mlp of its MLP neurons removed by their Taylor scores over 16 training batches,
    before and after fine-tuning --tune steps;
  - the MLP's matrices factored to low rank (kiln compress lowrank, 0.9 of the squared
    singular values kept in every layer: --lowrank-energy), and every block matrix at rank 48
    (--lowrank-rank), each fine-tuned the same steps;
  - a student of half the layers trained --steps steps with the dense model as its teacher
    (kiln distill, alpha 0.5, T 2) against the same student trained without one;
  - the same model with each block shared by two layers (--share-layers 2), trained --steps;
  - int8 and int4 post-training quantization (kiln compress quantize, when this kiln has it)
    and quantization-aware fine-tuning (--qat 8) then int8;
  - GGUF files (f16, q8_0, q4_0) sizes.
For each: parameters, file size, validation loss (kiln eval over the held-out tenth), its
change against the dense model's, KL(dense || it) in nats per token over the same windows
(kiln eval --teacher), and kiln eval's tokens/s (--speed-batches batches of 16 x 64) and
kiln sample's (--sample-tokens greedy tokens after a one-byte prompt: 63 by default, which
fill the model's context of 64, where each new token runs alone through the model with the
generation cache; past the context every token's window of 64 runs whole), loading not
counted, each the best of --rounds rounds that time every model in turn (threads 2,
OPENBLAS_CORETYPE unset in kiln's environment, so that OpenBLAS picks its kernels for the
CPU). The losses are deterministic; the speeds are
this machine's.
"""
import argparse
import json
import os
import re
import struct
import subprocess
import sys
import time


def run(cmd, env, log):
    log.write("$ " + " ".join(cmd) + "\n")
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    log.write(r.stdout + r.stderr)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-2000:]}")
    return r.stdout + r.stderr


def params_of(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    total = 0
    for k, v in h.items():
        if k == "__metadata__":
            continue
        c = 1
        for d in v["shape"]:
            c *= d
        total += c
    return total


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kiln", default="build/kiln")
    here = os.path.dirname(os.path.abspath(__file__))
    p.add_argument("--text", default=os.path.join(here, "..", "..", "shared", "data",
                                                  "tinyshakespeare.txt"))
    p.add_argument("--work", default="build/bench_compress")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--tune", type=int, default=300)
    p.add_argument("--struct-heads", type=float, default=0.3,
                   help="structured pruning: fraction of each layer's heads removed")
    p.add_argument("--struct-mlp", type=float, default=0.3,
                   help="structured pruning: fraction of each layer's MLP neurons removed")
    p.add_argument("--rounds", type=int, default=5, help="speed rounds; the best of each kept")
    p.add_argument("--sample-tokens", type=int, default=63,
                   help="tokens kiln sample generates in each timing (63: up to the context)")
    p.add_argument("--speed-batches", type=int, default=60,
                   help="kiln eval batches timed in each round")
    p.add_argument("--lowrank-energy", type=float, default=0.9,
                   help="energy the low-rank MLP keeps (kiln compress lowrank --energy)")
    p.add_argument("--lowrank-rank", type=int, default=48,
                   help="rank of every block matrix in the second low-rank row")
    a = p.parse_args()
    kiln = os.path.abspath(a.kiln)
    if not os.path.exists(a.text):
        sys.exit(f"no text at {a.text} (../shared/data/tinyshakespeare.txt)")
    os.makedirs(a.work, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="2")
    env.pop("OPENBLAS_CORETYPE", None)
    log = open(os.path.join(a.work, "log.txt"), "w")
    data = os.path.join(a.work, "data")
    if not os.path.exists(os.path.join(data, "train_000.bin")):
        run([kiln, "prepare", "--tokenizer", "bytes", "--out", data, a.text], env, log)
    train = os.path.join(data, "train_000.bin")
    val = os.path.join(data, "val_000.bin")
    shape = ["--layers", "6", "--heads", "6", "--embd", "192", "--context", "64", "--seq", "64",
             "--batch", "16", "--threads", "2", "--data", train, "--lr", "1e-3",
             "--warmup", str(min(20, a.steps, a.tune))]  # kiln refuses a warmup past --steps
    W = lambda name: os.path.join(a.work, name)
    rows = []

    def measure(label, path):
        """The loss and KL now (deterministic); the speeds later, in rounds."""
        out = run([kiln, "eval", "--weights", path, "--data", val, "--batch", "16", "--seq", "64",
                   "--threads", "2", "--teacher", W("dense.st")], env, log)
        kl = float(re.search(r"KL from the teacher ([0-9.]+)", out).group(1))
        loss = float(re.search(r"\| loss ([0-9.]+)", out).group(1))
        rows.append(dict(label=label, path=path, params=params_of(path),
                         mb=os.path.getsize(path) / 1e6, loss=loss, kl=kl, eval=0.0, sample=0.0))
        log.flush()

    have_lowrank = subprocess.run([kiln, "compress", "lowrank", "--help"], env=env,
                                  capture_output=True).returncode == 0

    def speeds(row):
        """kiln eval's tokens/s over --speed-batches batches and kiln sample's over --sample-tokens
        (loading not counted in either)."""
        out = run([kiln, "eval", "--weights", row["path"], "--data", val, "--batch", "16",
                   "--seq", "64", "--threads", "2", "--batches", str(a.speed_batches)], env, log)
        row["eval"] = max(row["eval"], float(re.search(r"([0-9.]+) tokens/s", out).group(1)))
        out = run([kiln, "sample", "--weights", row["path"], "--tokens", str(a.sample_tokens),
                   "--prompt", "\n", "--seed", "1",
                   "--temperature", "0", "--threads", "2", "--timing"], env, log)
        row["sample"] = max(row["sample"], float(re.search(r"([0-9.]+) tokens/s", out).group(1)))

    have_quant = "quantize" in subprocess.run([kiln, "compress", "--help"], env=env,
                                              capture_output=True, text=True).stdout + \
        subprocess.run([kiln, "compress", "--help"], env=env, capture_output=True,
                       text=True).stderr
    # the dense model, and the same fine-tuned as long as the pruned one
    run([kiln, "train"] + shape + ["--steps", str(a.steps), "--save", W("dense.st")], env, log)
    measure("dense fp32", W("dense.st"))
    run([kiln, "train", "--init", W("dense.st")] + shape[8:] +
        ["--steps", str(a.tune), "--save", W("dense_ft.st")], env, log)
    measure(f"dense, fine-tuned {a.tune} more steps", W("dense_ft.st"))
    # structured: heads and MLP neurons removed by their Taylor scores, then fine-tuned
    run([kiln, "compress", "prune", "--weights", W("dense.st"), "--out", W("narrow0.st"),
         "--heads", str(a.struct_heads), "--mlp", str(a.struct_mlp), "--data", train,
         "--batches", "16", "--batch", "16", "--seq", "64", "--threads", "2"], env, log)
    measure(f"structured: {a.struct_heads:.0%} of heads and {a.struct_mlp:.0%} of MLP neurons "
            "removed, not fine-tuned", W("narrow0.st"))
    run([kiln, "train", "--init", W("narrow0.st")] + shape[8:] +
        ["--steps", str(a.tune), "--save", W("narrow.st")], env, log)
    measure(f"structured, fine-tuned {a.tune} steps", W("narrow.st"))
    run([kiln, "train", "--init", W("dense.st")] + shape[8:] +
        ["--steps", str(a.tune), "--prune-sparsity", "0.5", "--prune-start", "1",
         "--prune-end", str(2 * a.tune // 3), "--prune-every", "10", "--save", W("pruned.st")],
        env, log)
    measure("gradual pruning to 50% (fine-tuned the same)", W("pruned.st"))
    if have_lowrank:  # the MLP's matrices factored by their SVD, then fine-tuned the same
        run([kiln, "compress", "lowrank", "--weights", W("dense.st"), "--matrices", "fc,fcproj",
             "--energy", str(a.lowrank_energy), "--out", W("lowrank.st")], env, log)
        run([kiln, "train", "--init", W("lowrank.st")] + shape[8:] +
            ["--steps", str(a.tune), "--save", W("lowrank_ft.st")], env, log)
        measure(f"low-rank MLP, energy {a.lowrank_energy:g} (fine-tuned the same)",
                W("lowrank_ft.st"))
        # every block matrix at one fixed rank, for a reduction the energy does not promise
        run([kiln, "compress", "lowrank", "--weights", W("dense.st"), "--rank",
             str(a.lowrank_rank), "--out", W("lowrank_r.st")], env, log)
        run([kiln, "train", "--init", W("lowrank_r.st")] + shape[8:] +
            ["--steps", str(a.tune), "--save", W("lowrank_r_ft.st")], env, log)
        measure(f"low-rank, every matrix at rank {a.lowrank_rank} (fine-tuned the same)",
                W("lowrank_r_ft.st"))
    half = ["--layers", "3"] + shape[2:]
    run([kiln, "train"] + half + ["--steps", str(a.steps), "--save", W("student.st")], env, log)
    measure("3-layer student, no teacher", W("student.st"))
    run([kiln, "distill", "--teacher", W("dense.st")] + half +
        ["--steps", str(a.steps), "--save", W("distilled.st")], env, log)
    measure("3-layer student distilled from the dense", W("distilled.st"))
    run([kiln, "train"] + shape + ["--share-layers", "2", "--steps", str(a.steps), "--save",
                                   W("shared.st")], env, log)
    measure("blocks shared by 2 layers", W("shared.st"))
    if have_quant:
        for ty in ("int8", "int4"):
            run([kiln, "compress", "quantize", "--weights", W("dense_ft.st"), "--type", ty,
                 "--out", W(f"dense_ft-{ty}.st")], env, log)
            measure(f"{ty} of the fine-tuned dense", W(f"dense_ft-{ty}.st"))
        run([kiln, "train", "--init", W("dense.st")] + shape[8:] +
            ["--steps", str(a.tune), "--qat", "8", "--save", W("qat.st")], env, log)
        run([kiln, "compress", "quantize", "--weights", W("qat.st"), "--type", "int8", "--out",
             W("qat-int8.st")], env, log)
        measure("quantization-aware fine-tuning, then int8", W("qat-int8.st"))
    sizes = []
    for ty in ("f16", "q8_0", "q4_0"):
        run([kiln, "export", "--weights", W("dense.st"), "--type", ty, "--out",
             W(f"dense-{ty}.gguf")], env, log)
        sizes.append(f"{ty} {os.path.getsize(W(f'dense-{ty}.gguf')) / 1e6:.2f} MB")
    for _ in range(a.rounds):  # each round times every model once, in turn
        for row in rows:
            speeds(row)
    base = rows[0]
    print(f"# bench_compress: {a.steps} steps dense (tune {a.tune}), byte-level "
          f"{os.path.basename(a.text)}, d6 shape, 2 threads; speeds best of {a.rounds} rounds, "
          f"sample {a.sample_tokens} tokens; GGUF of the dense: {', '.join(sizes)}")
    hdr = ["method", "params", "file MB", "val loss", "vs dense", "KL from dense", "eval tok/s",
           "x dense", "sample tok/s", "x dense"]
    print("| " + " | ".join(hdr) + " |")
    print("|" + " --- |" * len(hdr))
    for r in rows:
        print(f"| {r['label']} | {r['params'] / 1e6:.2f}M | {r['mb']:.2f} | {r['loss']:.4f} | "
              f"{100 * (r['loss'] / base['loss'] - 1):+.2f}% | {r['kl']:.4f} | {r['eval']:.0f} | "
              f"{r['eval'] / base['eval']:.2f} | {r['sample']:.1f} | "
              f"{r['sample'] / base['sample']:.2f} |")


if __name__ == "__main__":
    main()
