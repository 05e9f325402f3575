#!/usr/bin/python3
"""PyTorch peer of kiln's data-parallel benchmark: GPT-2 training steps under
DistributedDataParallel on the CPU (gloo), one process per rank on this machine.

    /usr/bin/python3 bench/torch_ddp.py --world 2 --model d12 --batch 4 --seq 64 \
        --warmup 2 --steps 5 --threads 1 [--bucket-cap-mb 25] [--grad-as-bucket-view] \
        [--static-graph] [--no-check] [--json]

The model, initialisation and optimizer are bench/torch_gpt.py's (tests/ref/gpt_model.py,
GPT-2's initialisation from --seed on every rank, AdamW lr 6e-4, betas (0.9, 0.95), eps
1e-8, decay 0.1 on the 2-D tensors). Each rank trains on its own random tokens (seed +
rank), --batch sequences of --seq tokens per step, so a step is world x batch sequences.

The ranks are processes started with torch.multiprocessing (spawn) and joined with
torch.distributed's env:// rendezvous on 127.0.0.1 (no torchrun): gloo backend,
torch.set_num_threads(--threads) and OMP_NUM_THREADS in each. --world 1 trains the plain
model in one such process, without DDP (the baseline the ranks scale from).

DDP's knobs that matter on the CPU are passed through: bucket_cap_mb (--bucket-cap-mb,
DDP's default 25), gradient_as_bucket_view (the gradients are views of the reduction's
buckets, saving one copy each way; the gradients are then zeroed in place rather than set
to None), static_graph.

That DDP really averages over ranks that compute at once is checked, unless --no-check: on
the last warm-up step (untimed), after backward, each rank's gradients are summarised per
tensor (sum and sum of squares in fp64) and gathered; they must be equal on every rank
while the ranks' own losses differ (each saw other tokens). The summary also gives the loss
averaged over the ranks at the first and last step, and each rank's CPU time per step
against its wall time (about 1 when a rank had a core to itself all the step).

Prints rank 0's steps, a summary, and with --json a last line holding it as JSON:
ms_per_step is rank 0's mean over the timed steps (every rank waits for the others in the
reduction, so all ranks' step times agree to a few ms); tokens_per_s counts all ranks.
"""

import argparse
import json
import os
import resource
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "ref"))
sys.path.insert(0, HERE)
from gpt_model import GPT  # noqa: E402
from torch_gpt import PRESETS, VOCAB  # noqa: E402  (bench/torch_gpt.py)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def grad_summary(model):
    """Per gradient tensor, (sum, sum of squares) in fp64: equal on every rank after DDP's
    reduction, whatever the reduction's order, because every rank receives the same sums."""
    parts = []
    for p in model.parameters():
        g = p.grad.detach().double() if p.grad is not None else torch.zeros(1, dtype=torch.float64)
        parts.append(torch.stack([g.sum(), (g * g).sum()]))
    return torch.cat(parts)


def check_step(model, world, local_loss):
    """After a backward: (max |difference| of the gradient summaries between rank 0 and any
    other rank, relative to rank 0's largest value; the ranks' local losses)."""
    mine = grad_summary(model)
    every = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    losses = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(losses, torch.tensor([local_loss], dtype=torch.float64))
    scale = float(every[0].abs().max()) or 1.0
    diff = max(float((e - every[0]).abs().max()) for e in every) / scale
    return diff, [float(x) for x in losses]


def rank_main(rank, args, port, results):
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "RANK": str(rank), "WORLD_SIZE": str(args.world),
                       "OMP_NUM_THREADS": str(args.threads)})
    torch.set_num_threads(args.threads)
    ddp = args.world > 1
    if ddp:
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=args.world)
    L, NH, C, max_t = PRESETS[args.model]
    B, T = args.batch, args.seq
    torch.manual_seed(args.seed)  # the same initialisation on every rank (DDP checks it too)
    model = GPT(L, NH, C, VOCAB, max_t)
    model.init_gpt2()
    model.train()
    net = model
    if ddp:
        net = DDP(model, bucket_cap_mb=args.bucket_cap_mb,
                  gradient_as_bucket_view=args.grad_as_bucket_view,
                  static_graph=args.static_graph)
    opt = torch.optim.AdamW(model.decay_groups(0.1), lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(args.seed + rank)  # each rank its own tokens
    n_steps = args.warmup + args.steps
    data = torch.randint(0, VOCAB, (n_steps, B, T + 1), generator=gen)
    # with gradient_as_bucket_view the gradients are the buckets' views: keep them
    set_to_none = not args.grad_as_bucket_view
    check = None
    times, cpu_times, losses = [], [], []
    for k in range(n_steps):
        if ddp and k == args.warmup:
            dist.barrier()  # the timed steps start together
        x, y = data[k, :, :T], data[k, :, 1:]
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=set_to_none)
        _, loss = net(x, y)
        loss.backward()
        if ddp and args.check and k == args.warmup - 1:
            check = check_step(model, args.world, loss.item())  # untimed: a warm-up step
        opt.step()
        lv = loss.item()
        ms = (time.perf_counter() - t0) * 1e3
        cpu_ms = (time.process_time() - c0) * 1e3
        losses.append(lv)
        if k >= args.warmup:
            times.append(ms)
            cpu_times.append(cpu_ms)
        if rank == 0:
            print("step %2d%s loss %.4f  %8.1f ms  %8.1f tokens/s (all ranks)  CPU %8.1f ms" % (
                k, "  " if k >= args.warmup else " w", lv, ms, args.world * B * T / ms * 1e3,
                cpu_ms), flush=True)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB
    results.put({"rank": rank, "times": times, "cpu_times": cpu_times, "losses": losses,
                 "rss": rss, "check": check})
    if ddp:
        dist.barrier()
        dist.destroy_process_group()


def summarise(args, per_rank):
    r0 = per_rank[0]
    ms = r0["times"]
    mean = sum(ms) / len(ms)
    n = args.warmup + args.steps
    loss_mean = [sum(r["losses"][k] for r in per_rank) / len(per_rank) for k in range(n)]
    busy = [sum(r["cpu_times"]) / sum(r["times"]) for r in per_rank]
    s = {"system": "pytorch-ddp" if args.world > 1 else "pytorch", "model": args.model,
         "world": args.world, "batch": args.batch, "seq": args.seq, "threads": args.threads,
         "bucket_cap_mb": args.bucket_cap_mb, "gradient_as_bucket_view": args.grad_as_bucket_view,
         "static_graph": args.static_graph, "timed_steps": len(ms), "ms_per_step": mean,
         "ms_min": min(ms), "ms_max": max(ms),
         "ms_per_step_slowest_rank": max(sum(r["times"]) / len(r["times"]) for r in per_rank),
         "tokens_per_s": args.world * args.batch * args.seq / mean * 1e3,
         "losses": loss_mean, "cpu_over_wall": busy, "peak_rss_mb": [r["rss"] for r in per_rank],
         "torch": torch.__version__}
    check = r0.get("check")
    if check:
        diff, local = check
        s["grad_max_rel_diff"] = diff
        s["local_losses"] = local
        s["ranks_agree"] = diff == 0.0 and len(set(local)) == len(local)
    return s


def main():
    ap = argparse.ArgumentParser(description="PyTorch DDP (gloo, CPU) GPT-2 training steps")
    ap.add_argument("--world", type=int, default=2, help="ranks (processes)")
    ap.add_argument("--model", default="d12", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=4, help="sequences per rank per step")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5, help="timed steps")
    ap.add_argument("--threads", type=int, default=1, help="threads per rank")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0)
    ap.add_argument("--grad-as-bucket-view", action="store_true")
    ap.add_argument("--static-graph", action="store_true")
    ap.add_argument("--no-check", dest="check", action="store_false",
                    help="skip the check that the gradients agree across ranks")
    ap.add_argument("--json", action="store_true", help="end with a JSON summary line")
    args = ap.parse_args()
    if args.warmup < 1 and args.check and args.world > 1:
        sys.exit("the check runs on the last warm-up step: --warmup 1 or more, or --no-check")

    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, args, port, results))
             for r in range(args.world)]
    for p in procs:
        p.start()
    per_rank = [results.get() for _ in procs]  # before join: a full pipe would block them
    for p in procs:
        p.join()
    if any(p.exitcode != 0 for p in procs):
        sys.exit("a rank failed: exit codes %s" % [p.exitcode for p in procs])
    per_rank.sort(key=lambda r: r["rank"])
    s = summarise(args, per_rank)
    print("PyTorch %s %s: %d rank(s) x %d thread(s), B=%d/rank T=%d; DDP bucket_cap_mb %g, "
          "gradient_as_bucket_view %s, static_graph %s" % (
              torch.__version__, args.model, args.world, args.threads, args.batch, args.seq,
              args.bucket_cap_mb, args.grad_as_bucket_view, args.static_graph))
    print("mean %.1f ms/step (min %.1f, max %.1f), %.1f tokens/s (all ranks); loss %.4f -> %.4f; "
          "CPU/wall per rank %s; peak RSS per rank %s MiB" % (
              s["ms_per_step"], s["ms_min"], s["ms_max"], s["tokens_per_s"], s["losses"][0],
              s["losses"][-1], " ".join("%.2f" % b for b in s["cpu_over_wall"]),
              " ".join("%.0f" % m for m in s["peak_rss_mb"])))
    if "grad_max_rel_diff" in s:
        print("check (step %d): gradients across ranks differ by %.3g (relative); local losses "
              "%s: %s" % (args.warmup - 1, s["grad_max_rel_diff"],
                          " ".join("%.4f" % x for x in s["local_losses"]),
                          "reduced and averaged" if s["ranks_agree"] else "NOT AGREEING"))
    if args.json:
        print(json.dumps(s))


if __name__ == "__main__":
    main()
