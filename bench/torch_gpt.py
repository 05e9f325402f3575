#!/usr/bin/python3
"""PyTorch peer of kiln's training benchmark: GPT-2 training steps on random tokens.

    /usr/bin/python3 bench/torch_gpt.py --model gpt2-124m --batch 4 --seq 64 \
        --warmup 2 --steps 5 --threads 2 --dtype fp32|bf16 [--peak-gflops G] [--json]

The model is tests/ref/gpt_model.py (the one kiln's reference tests compare against),
with GPT-2's initialisation from a seed, the real vocabulary (50257, no padding) and
AdamW (lr 6e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on 2-D tensors). A step is
zero_grad, forward, backward, optimizer step; bf16 runs forward under CPU autocast with
float32 master weights and optimizer. Warm-up steps are run and not timed.

Prints one line per step, a summary, and with --json a last line holding the summary as
JSON (ms_per_step is the mean over the timed steps). MFU counts FLOPs as kiln does
(gpt_model.flops_per_token) and needs the peak from `kiln bench peak`.
"""

import argparse
import json
import os
import resource
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "ref"))
from gpt_model import GPT, flops_per_token  # noqa: E402

# name: (n_layer, n_head, n_embd); all with GPT-2's vocabulary and 1024 positions.
PRESETS = {
    "gpt2-124m": (12, 12, 768),
    "gpt2-350m": (24, 16, 1024),
    "d12": (12, 12, 768),
    "d6": (6, 6, 384),
    "d4": (4, 4, 256),
}
VOCAB = 50257
MAX_T = 1024


def main():
    ap = argparse.ArgumentParser(description="PyTorch GPT-2 training-step benchmark")
    ap.add_argument("--model", default="gpt2-124m", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5, help="timed steps")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--peak-gflops", type=float, default=0.0,
                    help="fp32 GEMM peak of this machine (kiln bench peak), for MFU")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--json", action="store_true", help="end with a JSON summary line")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    L, NH, C = PRESETS[args.model]
    B, T = args.batch, args.seq
    model = GPT(L, NH, C, VOCAB, MAX_T)
    model.init_gpt2()
    model.train()
    opt = torch.optim.AdamW(model.decay_groups(0.1), lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(args.seed)
    n_steps = args.warmup + args.steps
    data = torch.randint(0, VOCAB, (n_steps, B, T + 1), generator=gen)
    n_params = sum(p.numel() for p in model.parameters())
    flops_step = flops_per_token(L, C, VOCAB, T) * B * T
    print("PyTorch %s %s: %s, %d parameters, B=%d T=%d, %d threads, %.1f GFLOP/step" % (
        torch.__version__, args.dtype, args.model, n_params, B, T, torch.get_num_threads(),
        flops_step / 1e9), flush=True)

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

    ms = sum(times) / len(times)
    tps = B * T / ms * 1e3
    mfu = flops_step / (ms / 1e3) / (args.peak_gflops * 1e9) if args.peak_gflops > 0 else None
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB
    summary = {"system": "pytorch-" + args.dtype, "model": args.model, "batch": B, "seq": T,
               "threads": args.threads, "timed_steps": len(times), "ms_per_step": ms,
               "ms_min": min(times), "ms_max": max(times),
               "cpu_ms_per_step": sum(cpu_times) / len(cpu_times), "tokens_per_s": tps, "mfu": mfu,
               "peak_rss_mb": rss_mb, "flops_per_step": flops_step, "losses": losses}
    print("mean %.1f ms/step (min %.1f, max %.1f; CPU time %.1f ms/step), %.1f tokens/s, MFU %s, "
          "peak RSS %.0f MiB" % (ms, min(times), max(times), summary["cpu_ms_per_step"], tps,
                                 "%.1f%%" % (100 * mfu) if mfu is not None else "n/a", rss_mb))
    if args.json:
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
