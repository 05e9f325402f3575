#!/usr/bin/python3
"""PyTorch peer of kiln's training benchmark: GPT-2 or Llama training steps on random tokens.

    /usr/bin/python3 bench/torch_gpt.py --model gpt2-124m --batch 4 --seq 64 \
        --warmup 2 --steps 5 --threads 2 --dtype fp32|bf16 [--peak-gflops G] \
        [--gemm-seconds 0.25] [--json]

--model is a preset of kiln's (bench/model_presets.py: the shapes of src/model/config.c).
For a GPT-2 preset the model is tests/ref/gpt_model.py (the one kiln's reference tests
compare against) with GPT-2's initialisation from a seed; for a Llama preset (llama-d4,
llama-d6, llama-d12, smollm2-135m) tests/ref/llama_model.py's Llama (RMSNorm, rotary
embeddings, grouped-query attention, SwiGLU, no biases, tied head) with init_llama from a
seed. Both with the real vocabulary (50257, no padding) and AdamW (lr 6e-4, betas (0.9,
0.95), eps 1e-8, weight decay 0.1 on 2-D tensors, none on biases and norms). A step is
zero_grad, forward, backward, optimizer step; bf16 runs forward under CPU autocast with
float32 master weights and optimizer. Warm-up steps are run and not timed.

Prints one line per step, a summary, and with --json a last line holding the summary as
JSON (ms_per_step is the mean over the timed steps). MFU counts FLOPs as kiln does
(model_presets.flops_per_token: gpt_model's or llama_model's flops_per_token) and needs the
peak from `kiln bench peak`.

It also reports the BLAS this process really calls and the rate it gets from it, so that
a PyTorch given a slow BLAS shows up (Debian's PyTorch calls whatever libblas.so.3 the
alternatives system selects):
  - where libtorch_cpu's sgemm_ resolves, that file's OpenBLAS build and kernel, and the
    BLAS, OpenMP and oneDNN files in /proc/self/maps;
  - the GEMM rate of the model's own products, nn.Linear's (B*T, C) x (C, N) for the
    attention (N = 3C, C), MLP (4C, and 4C -> C) and head (V) shapes (a Llama's: q (N = A),
    k and v (NKV x hs), o (A -> C), gate and up (H), down (H -> C), head (V)): fp32, and with
    --dtype bf16 also under the forward pass's autocast (its casts included). They are
    timed before the model is built and again after the timed steps, with the same thread
    count, never inside a step. A rate is that of the fastest call, as `kiln bench peak`
    counts its own, and each shape keeps the better of its two.
"""

import argparse
import json
import os
import re
import resource
import sys
import time

import torch
import torch.nn.functional as F

import blas_probe  # bench/blas_probe.py, next to this file

import model_presets  # noqa: E402  (bench/model_presets.py, next to this file)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "ref"))
from gpt_model import GPT  # noqa: E402
from llama_model import Llama  # noqa: E402

# GPT-2 name: (n_layer, n_head, n_embd, positions), as kiln's presets (src/model/config.c)
# define them; all with GPT-2's vocabulary. --model also takes model_presets.LLAMA's.
PRESETS = model_presets.GPT2
VOCAB = model_presets.VOCAB


def gemm_shapes(BT, C, V):
    """(name, M, K, N) of the model's matrix products, (M, K) x (K, N)."""
    return [("attn qkv", BT, C, 3 * C), ("attn proj", BT, C, C), ("mlp fc", BT, C, 4 * C),
            ("mlp proj", BT, 4 * C, C), ("head", BT, C, V)]


def llama_gemm_shapes(BT, NH, C, NKV, H, V):
    """(name, M, K, N) of a Llama's matrix products as llama_model.Llama's nn.Linear
    computes them (q, k and v apart, gate and up apart; k and v share a shape)."""
    hs = C // NH
    A, KV = NH * hs, NKV * hs
    return [("attn q", BT, C, A), ("attn k/v", BT, C, KV), ("attn o", BT, A, C),
            ("mlp gate/up", BT, C, H), ("mlp down", BT, H, C), ("head", BT, C, V)]


def model_gemm_shapes(name, BT):
    if name in model_presets.LLAMA:
        _, NH, C, _, NKV, H, _, _ = model_presets.LLAMA[name]
        return llama_gemm_shapes(BT, NH, C, NKV, H, VOCAB)
    return gemm_shapes(BT, PRESETS[name][2], VOCAB)


def build_model(name, seed):
    """The preset's model in train mode, initialised from seed."""
    torch.manual_seed(seed)
    if name in model_presets.LLAMA:
        L, NH, C, _, NKV, H, theta, tied = model_presets.LLAMA[name]
        model = Llama(L, NH, C, VOCAB, n_kv_head=NKV, mlp_hidden=H, rope_theta=theta,
                      untied_head=not tied)
        model.init_llama(torch.Generator().manual_seed(seed))
    else:
        L, NH, C, max_t = PRESETS[name]
        model = GPT(L, NH, C, VOCAB, max_t)
        model.init_gpt2()
    model.train()
    return model


def time_linear(x, w, seconds, bf16):
    """GFLOP/s of the fastest of repeated F.linear(x, w), the product nn.Linear computes,
    within about `seconds`, as `kiln bench peak` counts its rate. The first call is a
    warm-up, unless it alone took `seconds` (a slow BLAS): then it is the measurement, so
    that a reference BLAS does not keep the probe busy for minutes."""
    flops = 2.0 * x.shape[0] * x.shape[1] * w.shape[0]
    times = []
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        while True:
            t0 = time.perf_counter()
            F.linear(x, w)
            times.append(time.perf_counter() - t0)
            if len(times) == 1 and times[0] >= seconds:
                break
            if len(times) >= 3 and sum(times[1:]) >= seconds:
                break
    return flops / min(times[1:] or times) / 1e9


def gemm_probe(shapes, seconds, modes, best):
    """Time every shape in every mode ("fp32"; "bf16": fp32 inputs under autocast),
    keeping in best[mode][shape] the better of this rate and any earlier one (GFLOP/s)."""
    gen = torch.Generator().manual_seed(0)  # leaves the model's random stream alone
    for name, M, K, N in shapes:
        x = torch.randn(M, K, generator=gen)
        w = torch.randn(N, K, generator=gen)  # nn.Linear's (out, in) layout
        key = "%s %dx%dx%d" % (name, M, K, N)
        for mode in modes:
            rates = best.setdefault(mode, {})
            rates[key] = max(rates.get(key, 0.0), time_linear(x, w, seconds, mode == "bf16"))


def blas_report():
    """The BLAS this process calls for fp32 products (where libtorch_cpu's sgemm_
    resolves), its OpenBLAS build and kernel when it is OpenBLAS, and the BLAS, OpenMP and
    oneDNN files mapped."""
    mapped = blas_probe.mapped_files()
    torch_cpu = sorted(blas_probe.mapped_files(keep=lambda p: "libtorch_cpu" in p))
    sgemm = blas_probe.symbol_provider("sgemm_", torch_cpu[0] if torch_cpu else None)
    ob_file = blas_probe.openblas_for(sgemm, mapped)
    ob = blas_probe.openblas_config(ob_file) if ob_file else None
    return {"sgemm": sgemm, "label": blas_probe.label(sgemm, ob),
            "openblas": [ob_file, ob[0], ob[1]] if ob else None,
            "mapped": blas_probe.by_kind(mapped)}


def torch_config():
    """The parts of torch.__config__.show() that decide its CPU speed."""
    show = torch.__config__.show()

    def grab(pattern):
        m = re.search(pattern, show)
        return m.group(1).strip() if m else "?"

    return {"version": torch.__version__, "blas_info": grab(r"\bBLAS_INFO=([^,\s]+)"),
            "lapack_info": grab(r"\bLAPACK_INFO=([^,\s]+)"),
            "use_mkldnn": grab(r"\bUSE_MKLDNN=([^,\s]+)"),
            "onednn": grab(r"(?:MKL-DNN|oneDNN)\s+(v[\d.]+)"),
            "openmp": grab(r"OpenMP (\d+)"),
            "cpu_capability": grab(r"CPU capability usage: (\S+)"),
            "mkldnn_available": torch.backends.mkldnn.is_available(),
            "mkl_available": torch.backends.mkl.is_available(),
            "threads": torch.get_num_threads()}


def train(args):
    """Warm-up and timed steps; returns (timed ms, timed CPU ms, losses, FLOPs/step)."""
    B, T = args.batch, args.seq
    model = build_model(args.model, args.seed)
    opt = torch.optim.AdamW(model.decay_groups(0.1), lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(args.seed)
    n_steps = args.warmup + args.steps
    data = torch.randint(0, VOCAB, (n_steps, B, T + 1), generator=gen)
    n_params = sum(p.numel() for p in model.parameters())
    flops_step = model_presets.flops_per_token(args.model, T) * B * T
    shape = " (%s)" % model_presets.describe(args.model) if args.model in model_presets.LLAMA \
        else ""
    print("PyTorch %s %s: %s%s, %d parameters, B=%d T=%d, %d threads, %.1f GFLOP/step" % (
        torch.__version__, args.dtype, args.model, shape, n_params, B, T,
        torch.get_num_threads(), flops_step / 1e9), flush=True)

    times, cpu_times, losses = [], [], []
    for k in range(n_steps):
        x, y = data[k, :, :T], data[k, :, 1:]
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.dtype == "bf16"):
            _, loss = model(x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        ms = (time.perf_counter() - t0) * 1e3
        cpu_ms = (time.process_time() - c0) * 1e3  # all threads: about ms x threads when idle
        timed = k >= args.warmup
        if timed:
            times.append(ms)
            cpu_times.append(cpu_ms)
        print("step %2d%s loss %.4f  %8.1f ms  %7.1f tokens/s  (CPU time %8.1f ms)" % (
            k, "  " if timed else " w", losses[-1], ms, B * T / ms * 1e3, cpu_ms), flush=True)
    return times, cpu_times, losses, flops_step  # the model and optimizer are freed here


def main():
    ap = argparse.ArgumentParser(description="PyTorch GPT-2 or Llama training-step benchmark")
    ap.add_argument("--model", default="gpt2-124m", choices=model_presets.NAMES,
                    help="a GPT-2 or Llama preset of kiln's (default gpt2-124m)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5, help="timed steps")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--peak-gflops", type=float, default=0.0,
                    help="GEMM peak of this machine for MFU (`kiln bench peak`; bench_train.py "
                    "passes the bf16 peak to --dtype bf16 where kiln measures one)")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--gemm-seconds", type=float, default=0.25,
                    help="time per shape for the GEMM rates, before and after (0: skip them)")
    ap.add_argument("--json", action="store_true", help="end with a JSON summary line")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    B, T = args.batch, args.seq
    if T > model_presets.context(args.model):
        sys.exit("sequence length %d is beyond %s's context of %d" % (
            T, args.model, model_presets.context(args.model)))
    shapes = model_gemm_shapes(args.model, B * T)
    modes = ("fp32", "bf16") if args.dtype == "bf16" else ("fp32",)
    gemm = {}
    if args.gemm_seconds > 0:
        gemm_probe(shapes, args.gemm_seconds, modes, gemm)
    times, cpu_times, losses, flops_step = train(args)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB
    # the second probe runs with the model freed, well under the training's peak RSS
    if args.gemm_seconds > 0:
        gemm_probe(shapes, args.gemm_seconds, modes, gemm)

    blas = blas_report()
    print("BLAS: sgemm_ from %s (%s)" % (blas["sgemm"], blas["label"]))
    for kind, paths in sorted(blas["mapped"].items()):
        print("  mapped %-7s %s" % (kind, ", ".join(paths)))
    for mode, rates in gemm.items():
        print("GEMM %s%s GFLOP/s: %s; best %.1f" % (
            mode, " (autocast)" if mode == "bf16" else "",
            ", ".join("%s %.1f" % kv for kv in rates.items()), max(rates.values())))
    ms = sum(times) / len(times)
    tps = B * T / ms * 1e3
    mfu = flops_step / (ms / 1e3) / (args.peak_gflops * 1e9) if args.peak_gflops > 0 else None
    summary = {"system": "pytorch-" + args.dtype, "model": args.model, "batch": B, "seq": T,
               "threads": args.threads, "timed_steps": len(times), "ms_per_step": ms,
               "ms_min": min(times), "ms_max": max(times),
               "cpu_ms_per_step": sum(cpu_times) / len(cpu_times), "tokens_per_s": tps, "mfu": mfu,
               "peak_rss_mb": rss_mb, "flops_per_step": flops_step, "losses": losses,
               "pid": os.getpid(), "blas": blas, "gemm": gemm, "torch": torch_config()}
    print("mean %.1f ms/step (min %.1f, max %.1f; CPU time %.1f ms/step), %.1f tokens/s, MFU %s, "
          "peak RSS %.0f MiB" % (ms, min(times), max(times), summary["cpu_ms_per_step"], tps,
                                 "%.1f%%" % (100 * mfu) if mfu is not None else "n/a", rss_mb))
    if args.json:
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
