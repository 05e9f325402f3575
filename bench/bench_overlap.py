#!/usr/bin/python3
"""How much of kiln's gradient reduction hides behind backward on a shaped link, against
what the alpha-beta model says can be hidden.

    /usr/bin/python3 bench/bench_overlap.py [--build build] [--data SHARDS] [--rate 1gbit]
        [--ranks 2,4] [--batch 32,24] [--model d12] [--seq 64] [--bucket-mb 8]
        [--warmup 2] [--steps 3] [--work /tmp/kiln-overlap] [--markdown]

Run as root: bench/netsim.sh gives each rank a host of its own (a network namespace behind a
veth shaped to --rate, Open MPI on TCP only). For each rank count n (with the per-rank batch
of the same position in --batch) it runs

  bench_pingpong   one-way times 8 B .. 64 MiB between ranks 0 and 1: alpha (8 B) and beta
                   (the slope over 4 MiB and more), as bench_net.py fits them
(every mpirun with mpi_yield_when_idle 1 and eager TCP sends up to 32 MiB, so that a 2-rank
exchange does not serialise: docs/network.md, section 4.1)
  kiln train       --embedding-rows together, then apart (README "Many processes"), the
                   last --steps timed from --metrics (comm_ms, comm_hidden, comm_bytes)
  kiln train       the same per-rank batch on one rank alone with n ranks' worth of cores
                   shared (n ranks on the machine's cores: 1 thread each, n processes), no
                   network: the compute a rank does, for the model's timeline

The model. A step's gradient reduction is the ring's 2(n-1)/n G beta plus 2(n-1) alpha per
bucket (G the gradient bytes). Backward's timeline comes from its FLOPs: the classifier's
backward first (4 BT C Vp), then the blocks' (2x their forward), so the share of backward
left after the classifier is f = blocks / (classifier + blocks), and backward is 2/3 of the
step's compute (measured alone, above). The reduction can be hidden except for
  together:  wte's bucket (its gradient is final only at backward's end) and the buckets
             behind it: exposed >= the reduction of wte's bucket and of the blocks' buckets
             that backward reports after its last chance to start them
  apart:     what does not fit in the backward after the classifier (reduction - f x
             backward, when positive), the last bucket (the embeddings' wpe and block 0,
             final at the end) and the rows' allgather after backward
and "model hidden" is 1 - that exposed time over the reduction. kiln's "hidden" is its
comm_hidden: 1 - (time waited in kiln_dp_finish + time in the sums and gathers after
backward) / (time of the reductions on the communication thread + those).
"""

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_net as bn  # noqa: E402  (netsim runs, the ping-pong's alpha-beta fit)

ROOT = bn.ROOT
MiB = 1 << 20
# Waits yield the core, and eager TCP sends up to 32 MiB: at 2 ranks Open MPI's rendezvous
# handshake otherwise waits behind the other direction's bulk data on the one TCP connection
# the two ranks share (docs/network.md, 4.1) and the reduction takes twice the model's time;
# at 4 ranks the ring's reduction measured 3.1 s a step with them against 4.0 s without.
def mpi_flags(n):
    return bn.YIELD + bn.EAGER


def train_cmd(args, n, batch, rows, metrics):
    kiln = os.path.join(args.build, "kiln")
    return [kiln, "train", "--model", args.model, "--batch", str(batch), "--seq",
            str(args.seq), "--steps", str(args.warmup + args.steps), "--data", args.data,
            "--threads", "1", "--save", "", "--eval-every", "0", "--peak-gflops", "100",
            "--bucket-mb", str(args.bucket_mb), "--embedding-rows", rows, "--metrics", metrics]


def metrics_of(path, warmup):
    steps = [json.loads(x) for x in open(path) if x.strip().startswith("{")]
    steps = [s for s in steps if "ms" in s][warmup:]
    if not steps:
        return None
    mean = lambda k: sum(s.get(k, 0.0) for s in steps) / len(steps)  # noqa: E731
    return {"ms": mean("ms"), "comm_ms": mean("comm_ms"), "hidden": mean("comm_hidden"),
            "bytes": mean("comm_bytes"), "steps": len(steps)}


def model_numbers(args, n, batch, alpha, beta, compute_ms, grad_bytes):
    """The reduction's alpha-beta time, and the share of it the model lets hide each way."""
    L, C, maxT = {"d12": (12, 384, 512), "d6": (6, 384, 512), "d4": (4, 256, 256)}[args.model]
    Vp, BT = 50304, batch * args.seq
    head = 4.0 * BT * C * Vp                    # the classifier's backward (2 products)
    blocks = 2.0 * L * (2.0 * BT * 12 * C * C)  # the blocks' backward: 2x their products
    f = blocks / (head + blocks)
    bwd_s = compute_ms / 1e3 * 2.0 / 3.0
    ring = 2.0 * (n - 1) / n
    nb = max(1, int(grad_bytes / (args.bucket_mb * MiB)) + 2)
    red_s = ring * grad_bytes * beta + nb * 2 * (n - 1) * alpha
    block_b, wte_b, wpe_b = (12 * C * C + 13 * C) * 4, Vp * C * 4, maxT * C * 4
    rows_s = (n - 1) * BT * C * 4 * beta  # the rows' allgather, after backward
    # apart: the queue of reductions starts with wte's when the classifier is done; the
    # last bucket (block 0 and wpe) is final only at the end
    exp_apart = max(ring * (block_b + wpe_b) * beta, red_s - f * bwd_s) + rows_s
    # together: block 0's bucket and the embeddings' (wte with wpe) are final at the end
    exp_together = max(ring * (block_b + wte_b + wpe_b) * beta, red_s - f * bwd_s)
    return {"reduction_s": red_s, "backward_s": bwd_s, "after_head": f,
            "model_hidden_apart": max(0.0, 1.0 - exp_apart / (red_s + rows_s)),
            "model_hidden_together": max(0.0, 1.0 - exp_together / red_s)}


def measure(args, n, batch):
    res = {"ranks": n, "batch": batch}
    # compute alone: n processes (no MPI between them) each training the same batch
    logs = []
    procs = []
    for r in range(n):
        m = os.path.join(args.work, "alone_n%d_r%d.jsonl" % (n, r))
        if os.path.exists(m):
            os.remove(m)
        cmd = train_cmd(args, 1, batch, "together", m)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        env.pop("OPENBLAS_CORETYPE", None)
        log = open(os.path.join(args.work, "alone_n%d_r%d.log" % (n, r)), "w")
        logs.append(log)
        procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), m))
    alone = []
    for p, m in procs:
        p.wait()
        if p.returncode == 0:
            alone.append(metrics_of(m, args.warmup)["ms"])
    for log in logs:
        log.close()
    if len(alone) != n:
        sys.exit("bench_overlap: the compute-alone runs failed; see %s/alone_n%d_r*.log" % (
            args.work, n))
    res["compute_ms"] = sum(alone) / n
    subprocess.run([bn.NETSIM, "up", str(n), args.rate], check=True)
    try:
        csv = os.path.join(args.work, "pp_n%d.csv" % n)
        prog = [os.path.join(args.build, "bench_pingpong"), "--ops", "pingpong", "--max",
                "64M", "--budget", "0.3", "--csv", csv]
        rc, out, _ = bn.run(bn.mpi_cmd(args.rate, n, mpi_flags(n), prog),
                            os.path.join(args.work, "pp_n%d.log" % n),
                            bn.mpi_env(args.rate, mpi_flags(n)), quiet_s=60)
        if rc != 0:
            sys.exit("bench_overlap: bench_pingpong failed:\n" + out[-2000:])
        alpha, beta, _ = bn.fit_alpha_beta(bn.read_csv(csv))
        res["alpha"], res["beta"] = alpha, beta
        for rows in ("together", "apart"):
            m = os.path.join(args.work, "train_n%d_%s.jsonl" % (n, rows))
            if os.path.exists(m):
                os.remove(m)
            env = bn.mpi_env(args.rate, mpi_flags(n))
            env.pop("OPENBLAS_CORETYPE", None)
            env["OMP_NUM_THREADS"] = "1"
            rc, out, cpu = bn.run(bn.mpi_cmd(args.rate, n, mpi_flags(n),
                                             train_cmd(args, n, batch, rows, m)),
                                  os.path.join(args.work, "train_n%d_%s.log" % (n, rows)), env,
                                  quiet_s=60)
            if rc != 0 or not os.path.exists(m):
                sys.exit("bench_overlap: kiln train failed (status %d):\n%s" % (rc, out[-2000:]))
            r = metrics_of(m, args.warmup)
            r["cpu"] = cpu
            res[rows] = r
            print("  n=%d B=%d %-8s %8.0f ms/step, comm %7.0f ms, %3.0f%% hidden" % (
                n, batch, rows, r["ms"], r["comm_ms"], 100 * r["hidden"]), flush=True)
    finally:
        subprocess.run([bn.NETSIM, "down"], stdout=subprocess.DEVNULL)
    grad = res["apart"]["bytes"] / (2.0 * (n - 1) / n)
    res.update(model_numbers(args, n, batch, res["alpha"], res["beta"], res["compute_ms"], grad))
    return res


def report(args, results):
    head = ("| ranks | B per rank | alpha | 1/beta | compute alone | backward after the head | "
            "model: reduction | embedding rows | ms/step | comm ms | kiln hidden | model hidden |")
    lines = [head, "|" + "---|" * 12]
    for r in results:
        for rows in ("together", "apart"):
            m = r[rows]
            lines.append("| %d | %d | %s | %.3f GB/s | %.0f ms | %.0f%% of %.0f ms | %.0f ms | %s "
                         "| %.0f | %.0f | %.0f%% | %.0f%% |" % (
                             r["ranks"], r["batch"], bn.fmt_t(r["alpha"]), 1e-9 / r["beta"],
                             r["compute_ms"], 100 * r["after_head"], 1e3 * r["backward_s"],
                             1e3 * r["reduction_s"], rows, m["ms"], m["comm_ms"],
                             100 * m["hidden"], 100 * r["model_hidden_" + rows]))
    print("\n".join(lines))
    print("\n%s link (bench/netsim.sh), %s, T=%d, --bucket-mb %g, fp32, 1 thread per rank, %d "
          "timed steps after %d; Reproduce: `/usr/bin/python3 bench/bench_overlap.py --rate %s "
          "--ranks %s --batch %s`" % (args.rate, args.model, args.seq, args.bucket_mb,
                                      args.steps, args.warmup, args.rate,
                                      ",".join(str(r["ranks"]) for r in results),
                                      ",".join(str(r["batch"]) for r in results)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "brown", "train_*.bin"))
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--batch", default="32,24", help="per-rank batch for each rank count")
    ap.add_argument("--model", default="d12")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--bucket-mb", type=float, default=8.0)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--work", default="/tmp/kiln-overlap")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_overlap: run as root (bench/netsim.sh makes namespaces and shapers)")
    ranks = [int(x) for x in args.ranks.split(",")]
    batches = [int(x) for x in args.batch.split(",")]
    if len(batches) != len(ranks):
        sys.exit("bench_overlap: --batch needs one per-rank batch for each of --ranks")
    os.makedirs(args.work, exist_ok=True)
    args.build = os.path.abspath(args.build)
    results = [measure(args, n, b) for n, b in zip(ranks, batches)]
    with open(os.path.join(args.work, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    report(args, results)


if __name__ == "__main__":
    main()
