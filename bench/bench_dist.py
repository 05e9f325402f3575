#!/usr/bin/python3
"""Data-parallel benchmark: kiln over MPI against PyTorch DDP, ranks against threads, ZeRO.

    /usr/bin/python3 bench/bench_dist.py [--kiln build/kiln] [--data SHARDS] [--model d12]
        [--batch 4] [--seq 64] [--warmup 2] [--steps 5] [--ranks 2,4] [--rounds 1]
        [--parts ddp,threads,memory,zero] [--kiln-flags '--zero 1']
        [--ddp-options 25:off,25:on,100:on,5:on] [--no-diagnose]
        [--memory-models gpt2-350m,gpt2-774m] [--memory-ranks 4]
        [--memory-batch 1] [--memory-seq 64] [--memory-steps 2] [--quiet-wait 30]
        [--max-others 0.3] [--retries 2] [--work build/bench_dist] [--markdown]

Four tables, each its own part (--parts):

  ddp      kiln (`mpirun -np N kiln train --threads 1`) against PyTorch DistributedDataParallel
           (bench/torch_ddp.py: gloo, one process and one thread per rank) on the same model,
           per-rank batch, T and AdamW, at 1 rank (no communication) and at each --ranks;
           DDP's bucket_cap_mb and gradient_as_bucket_view are tried at 2 ranks first
           (--ddp-options) and the fastest setting is used at every rank count
  threads  kiln at 2 ranks x 1 thread (--batch B each) against 1 rank x 2 threads (--batch
           2B): the same global batch on the same 2 cores; and rows that take the 2-rank
           step apart: one rank's compute alone, one reduction after backward
           (--bucket-mb 0), no core binding, MPI's waits yielding the core, ZeRO 0,
           MPI's messages instead of shared memory, a copy of the weights per rank
  memory   per rank at --memory-ranks ranks (4), ZeRO 0 to 3, for each --memory-models:
           the plan kiln makes on every rank, and the peak RSS of each rank where all ranks
           fit the machine's available memory
  zero     kiln at 2 ranks, ZeRO 0, 1, 2 with gradients reduced in fp32 and in bf16: step
           time and the bytes each rank sends per step

Every run has OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE removed and OMP_NUM_THREADS set to its
threads per rank (bench_train.py's environment, whose helpers this script imports), so kiln
and PyTorch call the same OpenBLAS at its own kernel. kiln's step times, communication
figures and rank 0's peak RSS come from its --metrics file (rank 0's, one JSON object per
step); PyTorch's from torch_ddp.py's JSON summary. More ranks than cores (4 on 2 cores) are
oversubscribed alike for both systems (`mpirun --oversubscribe`; PyTorch's processes are
not bound to cores either).

The machine may be shared: before each run the script waits up to --quiet-wait seconds for
other processes to leave the cores, and each row reports the CPU that other processes used
while it ran ("others' load", in cores: the machine's busy time less this run's own); a run
during which they used more than --max-others cores is repeated (--retries times at most),
the quietest kept, and a row that stayed above it is marked "!".
"""

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_train as bt  # noqa: E402  (bench/bench_train.py: environment, data, BLAS)

ROOT = bt.ROOT
PARTS = ("ddp", "threads", "memory", "zero")
MIB = 1024.0 * 1024.0


# ---- the machine: CPU time of everyone, of this script's children ----

def cpu_busy_s():
    """Seconds of CPU the whole machine has spent busy since boot (not idle, not iowait)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(v[:8]) - v[3] - v[4]) / hz


def children_cpu_s():
    r = os.times()
    return r.children_user + r.children_system


def wait_quiet(limit_s, cores):
    """Wait (up to limit_s) until other processes use under a quarter of a core over two
    half-second windows in a row; returns the seconds waited."""
    t0, calm = time.time(), 0
    while time.time() - t0 < limit_s and calm < 2:
        b0, w0 = cpu_busy_s(), time.time()
        time.sleep(0.5)
        load = (cpu_busy_s() - b0) / (time.time() - w0)
        calm = calm + 1 if load < 0.25 else 0
    return time.time() - t0


def run(args, cmd, env, log, timeout=None):
    """Run cmd (waiting for quiet cores first); returns (rc, output, others' load in cores
    while it ran, wall seconds). The load is the machine's busy CPU time less this run's
    own (the children's, which mpirun collects from its ranks), over the wall time."""
    wait_quiet(args.quiet_wait, args.cores)
    b0, c0, t0 = cpu_busy_s(), children_cpu_s(), time.time()
    try:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=timeout or args.timeout)
        rc, out = p.returncode, p.stdout
    except subprocess.TimeoutExpired as e:
        rc, out = 124, (e.stdout or b"").decode(errors="replace") + "\n(timed out)\n"
    wall = time.time() - t0
    others = max(0.0, (cpu_busy_s() - b0) - (children_cpu_s() - c0)) / max(wall, 1e-9)
    with open(log, "w") as f:
        f.write("$ " + " ".join(shlex.quote(c) for c in cmd) + "\n" + out)
    return rc, out, others, wall


def quietest(args, attempt):
    """attempt(j) -> a result with "others" (the load other work put on the machine while
    it ran), or None when it failed. Retried (--retries times at most) while the load was
    above --max-others; the attempt with the least load is kept."""
    best = None
    for j in range(args.retries + 1):
        r = attempt(j)
        if r is None:
            return best
        if best is None or r["others"] < best["others"]:
            best = r
        if r["others"] <= args.max_others:
            break
        if j < args.retries:
            print("    (others' load %.2f cores while it ran: again)" % r["others"])
    return best


# ---- kiln ----

def mpirun_prefix(args, ranks, extra=()):
    pre = ["mpirun", "-np", str(ranks)]
    if os.geteuid() == 0:
        pre.append("--allow-run-as-root")
    if ranks > args.cores:
        pre.append("--oversubscribe")
    return pre + list(extra)


def kiln_train_cmd(args, model, batch, seq, steps, threads, metrics, flags=()):
    cmd = [args.kiln, "train", "--model", model, "--batch", str(batch), "--seq", str(seq),
           "--steps", str(steps), "--data", args.data, "--threads", str(threads), "--save", "",
           "--eval-every", "0", "--peak-gflops", "%.1f" % args.peak]
    if metrics:
        cmd += ["--metrics", metrics]
    return cmd + list(flags)


def mean(xs):
    return sum(xs) / len(xs) if xs else None


def kiln_once(args, tag, k, ranks, threads, batch, flags=(), mpi=(), env_extra=None):
    """Round k of one kiln configuration: its timed steps (from the metrics file) and how
    busy the machine was, or None (said) when it failed."""
    env = bt.bench_env(threads, env_extra or {})
    metrics = os.path.join(args.work, "%s_r%d.jsonl" % (tag, k))
    cmd = kiln_train_cmd(args, args.model, batch, args.seq, args.warmup + args.steps, threads,
                         metrics, flags)
    if ranks > 1:
        cmd = mpirun_prefix(args, ranks, mpi) + cmd

    def attempt(j):
        if os.path.exists(metrics):
            os.remove(metrics)
        log = os.path.join(args.work, "%s_r%d%s.log" % (tag, k, "_%d" % j if j else ""))
        rc, out, others, _ = run(args, cmd, env, log)
        steps = []
        if os.path.exists(metrics):
            steps = [json.loads(x) for x in open(metrics) if x.strip().startswith("{")]
        timed = [s for s in steps if "ms" in s][args.warmup:]
        if rc != 0 or not timed:
            print("  %s: failed (rc %d, see %s)" % (tag, rc, log))
            return None
        return {"steps": timed, "others": others, "out": out, "cmd": cmd, "env": env,
                "losses": [s.get("loss") for s in steps], "ranks": ranks, "threads": threads,
                "batch": batch, "tag": tag}

    return quietest(args, attempt)


def kiln_pool(args, rounds):
    """The rounds of one configuration as one row: their timed steps pooled."""
    if not rounds or any(x is None for x in rounds):
        return None
    first = rounds[0]
    ranks, batch = first["ranks"], first["batch"]
    steps = [s for r in rounds for s in r["steps"]]
    ms = [s["ms"] for s in steps]
    r = {"ms": mean(ms), "ms_min": min(ms), "tps": ranks * batch * args.seq / mean(ms) * 1e3,
         "others": mean([x["others"] for x in rounds]), "cmd": first["cmd"], "env": first["env"],
         "rss": max(s.get("peak_rss_mb", 0.0) for s in steps) or None,
         "losses": first["losses"], "out": first["out"], "ranks": ranks,
         "threads": first["threads"], "batch": batch}
    if ranks > 1:
        r["comm_ms"] = mean([s.get("comm_ms", 0.0) for s in steps])
        r["hidden"] = mean([s.get("comm_hidden", 0.0) for s in steps])
        r["bytes"] = mean([s.get("comm_bytes", 0) for s in steps])
    r.update(parse_plan(first["out"]))
    print("  %-34s %8.1f ms/step (best %.1f), %8.1f tokens/s%s; others' load %.2f cores" % (
        first["tag"], r["ms"], r["ms_min"], r["tps"], "; comm %.1f ms (%.0f%% hidden)" % (
            r["comm_ms"], 100 * r["hidden"]) if ranks > 1 else "", r["others"]))
    sys.stdout.flush()
    return r


def run_kiln(args, tag, ranks, threads, batch, flags=(), mpi=(), env_extra=None):
    """One kiln configuration, --rounds times in a row; the timed steps pooled."""
    return kiln_pool(args, [kiln_once(args, tag, k, ranks, threads, batch, flags, mpi, env_extra)
                            for k in range(args.rounds)])


def run_kiln_set(args, configs):
    """Several kiln configurations {key: (tag, ranks, threads, batch, flags, mpi, env)}, one
    round of each after another, --rounds times, so that a machine busy for a while slows
    them alike; {key: pooled row}."""
    raw = {key: [] for key in configs}
    for k in range(args.rounds):
        for key, c in configs.items():
            raw[key].append(kiln_once(args, c[0], k, *c[1:]))
    return {key: kiln_pool(args, raw[key]) for key in configs}


PLAN_KEYS = ("parameters", "gradients", "master weights", "optimizer moments", "activations",
             "workspace", "batches")


def mib_of(text):
    m = re.match(r"([0-9.]+) (MiB|GiB)", text.strip())
    return float(m.group(1)) * (1024.0 if m.group(2) == "GiB" else 1.0) if m else None


def parse_plan(out):
    """The plan kiln printed ("memory plan: ..." and "planned peak: ..."), or the one its
    refusal to start states ("the run is planned to take X (parameters ...) and about Y
    more for the process itself"), in MiB."""
    plan = {}
    m = re.search(r"^memory plan: (.*?) \(B=\d+, T=\d+\): (\S+ \S+)", out, re.M)
    refusal = re.search(r"planned to take (\S+ \S+)(?: \([0-9.]+ GiB\))? \((.*?) at B=\d+, "
                        r"T=\d+\) and about (\S+ \S+) more", out)
    if m:
        body, plan["plan_total"] = m.group(1), mib_of(m.group(2))
        plan["plan_line"] = m.group(0)
    elif refusal:
        body, plan["plan_total"] = refusal.group(2), mib_of(refusal.group(1))
        plan["headroom"] = mib_of(refusal.group(3))
    else:
        return plan
    for key in PLAN_KEYS:
        k = re.search(r"\b%s (\S+ \S+)" % key, body)
        if k:
            plan["plan_" + key.replace(" ", "_")] = mib_of(k.group(1))
    p = re.search(r"^planned peak: (\S+ \S+)", out, re.M)
    if p:
        plan["planned_peak"] = mib_of(p.group(1))
    return plan


# ---- formatting ----

def f1(x, unit=""):
    return "-" if x is None else "%.1f%s" % (x, unit)


def ratio(a, b):
    return "%.2f" % (a / b) if a and b else "-"


def mib(x):
    return "-" if x is None else ("%.0f MiB" % x if x >= 100 else "%.1f MiB" % x)


def comm_cell(r):
    return "%.1f ms (%.0f%% hidden)" % (r["comm_ms"], 100 * r["hidden"]) if r and \
        r.get("comm_ms") is not None else "-"


def load_cell(args, r):
    """Others' load while the row ran, "!" where it stayed above --max-others."""
    if not r:
        return "-"
    return "%.2f%s" % (r["others"], " !" if r["others"] > args.max_others else "")


def show(args, title, cols, cells, notes, md):
    """A table in text now, and kept for --markdown (title, header, rows, notes)."""
    if any(c[-1].endswith(" !") for c in cells):
        notes = notes + ["!: other processes used more than %.2f cores (of %d) while that row "
                         "ran, after %d retries: its times are not reliable." % (
                             args.max_others, args.cores, args.retries)]
    print("\n" + title + "\n")
    bt.print_text_table(cells, cols, left_names=("system", "configuration", "model",
                                                   "DDP setting", "reduce"))
    for n in notes:
        print(n)
    md.append((title, cols, cells, notes))
    sys.stdout.flush()


def reproduce(args, part, extra=""):
    base = "/usr/bin/python3 bench/bench_dist.py --kiln %s --parts %s" % (
        os.path.relpath(args.kiln, ROOT), part)
    if part in ("ddp", "threads", "zero"):
        base += " --model %s --batch %d --seq %d" % (args.model, args.batch, args.seq)
    if args.rounds > 1:
        base += " --rounds %d" % args.rounds
    return "Reproduce: `%s%s`" % (base, extra)


# ---- part 1: kiln against PyTorch DDP ----

def run_torch_ddp(args, world, bucket, view, tag):
    env = bt.peer_env(1, args.peer_malloc)
    cmd = [bt.TORCH_PY, os.path.join(HERE, "torch_ddp.py"), "--world", str(world), "--model",
           args.model, "--batch", str(args.batch), "--seq", str(args.seq), "--warmup",
           str(args.warmup), "--steps", str(args.steps), "--threads", "1", "--bucket-cap-mb",
           "%g" % bucket, "--json"] + (["--grad-as-bucket-view"] if view else [])
    rounds = []
    for k in range(args.rounds):
        def attempt(j):
            log = os.path.join(args.work, "%s_r%d%s.log" % (tag, k, "_%d" % j if j else ""))
            rc, out, others, _ = run(args, cmd, env, log)
            js = [x for x in out.splitlines() if x.startswith("{")]
            if rc != 0 or not js:
                print("  %s: failed (rc %d, see %s)" % (tag, rc, log))
                return None
            return dict(json.loads(js[-1]), others=others)
        s = quietest(args, attempt)
        if s is None:
            return None
        rounds.append(s)
    s = rounds[0]
    ms = [m for x in rounds for m in [x["ms_per_step"]] * x["timed_steps"]]
    r = {"ms": mean(ms), "ms_min": min(x["ms_min"] for x in rounds),
         "tps": world * args.batch * args.seq / mean(ms) * 1e3, "ranks": world, "threads": 1,
         "others": mean([x["others"] for x in rounds]), "rss": max(s["peak_rss_mb"]),
         "agree": all(x.get("ranks_agree") for x in rounds),
         "grad_diff": max(x.get("grad_max_rel_diff", 0.0) for x in rounds),
         "busy": s["cpu_over_wall"], "losses": s["losses"], "cmd": cmd, "bucket": bucket,
         "view": view}
    print("  %-34s %8.1f ms/step (best %.1f), %8.1f tokens/s; gradients equal across ranks: %s; "
          "CPU/wall per rank %s; others' load %.2f cores" % (
              tag, r["ms"], r["ms_min"], r["tps"], "yes" if r["agree"] else "NO",
              " ".join("%.2f" % b for b in r["busy"]), r["others"]))
    sys.stdout.flush()
    return r


def part_ddp(args, md, facts):
    print("\n== kiln against PyTorch DDP (%s, B=%d/rank, T=%d) ==" % (args.model, args.batch,
                                                                     args.seq))
    # PyTorch alone, one process, one thread (bench_train's run: it also says which BLAS its
    # process called and the GEMM rate it reaches there)
    ns = SimpleNamespace(model=args.model, batch=args.batch, seq=args.seq, warmup=args.warmup,
                         steps=args.steps, threads=1, gemm_seconds=0.25, work=args.work)
    errors = []

    def attempt(j):
        wait_quiet(args.quiet_wait, args.cores)
        b0, c0, t0 = cpu_busy_s(), children_cpu_s(), time.time()
        r, e = bt.run_torch(ns, bt.peer_env(1, args.peer_malloc), "fp32", args.peak)
        if e:
            errors.append(e)
            return None
        return dict(r, others=max(0.0, (cpu_busy_s() - b0) - (children_cpu_s() - c0)) /
                    (time.time() - t0))

    t1 = quietest(args, attempt)
    err = errors[-1] if errors else None
    if t1:
        t1.update(ranks=1, threads=1, tps=args.batch * args.seq / t1["ms"] * 1e3)
        t1["blas"] = bt.peer_blas(t1)
        facts["torch_blas"] = t1["blas"]["label"]
        facts["torch_gemm"] = t1["gemm"]
        print("  %-34s %8.1f ms/step (best %.1f); BLAS %s, GEMM %.1f GFLOP/s at 1 thread" % (
            "PyTorch 1 process x 1 thread", t1["ms"], t1["ms_min"], t1["blas"]["label"],
            t1["gemm"] or 0.0))
    else:
        print("  " + (err or "PyTorch 1 process: failed"))
    k1 = run_kiln(args, "ddp_kiln_1x1", 1, 1, args.batch)
    # DDP's settings at 2 ranks: the fastest (mean step) is used at every rank count
    sweep = []
    for opt in args.ddp_options:
        r = run_torch_ddp(args, 2, opt[0], opt[1], "ddp_torch_2x1_b%g_%s" % (
            opt[0], "view" if opt[1] else "copy"))
        sweep.append((opt, r))
    ok = [(o, r) for o, r in sweep if r]
    best_opt = min(ok, key=lambda x: x[1]["ms"])[0] if ok else (25.0, False)
    rows = [("kiln", k1), ("PyTorch", t1)]
    for n in args.ranks:
        rows.append(("kiln", run_kiln(args, "ddp_kiln_%dx1" % n, n, 1, args.batch,
                                      flags=args.kiln_flags)))
        if n == 2 and ok:
            t = dict(ok)[best_opt]
        else:
            t = run_torch_ddp(args, n, best_opt[0], best_opt[1], "ddp_torch_%dx1" % n)
        rows.append(("PyTorch DDP" if n > 1 else "PyTorch", t))

    cols = [("system", ""), ("ranks", ""), ("threads", "/rank"), ("B per", "rank"),
            ("ms/step", "(mean)"), ("best", "ms"), ("tokens/s", "(all ranks)"),
            ("x 1 rank", "(tokens/s)"), ("kiln x", "(mean)"), ("kiln x", "(best)"),
            ("comm", "(kiln)"), ("peak RSS", "per rank"), ("others'", "load")]
    base = {"kiln": k1, "PyTorch": t1, "PyTorch DDP": t1}
    cells = []
    for name, r in rows:
        if not r:
            cells.append([name, "-", "1", str(args.batch), "failed"] + ["-"] * 8)
            continue
        kiln_same = next((k for n, k in rows if n == "kiln" and k and
                          k["ranks"] == r["ranks"]), None)
        peer = not name.startswith("kiln") and kiln_same
        over = " (on %d cores)" % args.cores if r["ranks"] > args.cores else ""
        cells.append([name, "%d%s" % (r["ranks"], over), "1", str(args.batch), f1(r["ms"]),
                      f1(r["ms_min"]), f1(r["tps"]),
                      ratio(r["tps"], base[name]["tps"]) if base.get(name) else "-",
                      ratio(r["ms"], kiln_same["ms"]) if peer else "-",
                      ratio(r["ms_min"], kiln_same["ms_min"]) if peer else "-",
                      comm_cell(r) if name == "kiln" else "-", mib(r.get("rss")),
                      load_cell(args, r)])
    opt_cells = [["bucket_cap_mb %g, gradient_as_bucket_view %s" % (o[0], o[1]),
                  f1(r["ms"]) if r else "failed", f1(r["ms_min"]) if r else "-",
                  f1(r["tps"]) if r else "-", ("yes (max rel. diff %.1g)" % r["grad_diff"]
                                               if r["agree"] else "NO") if r else "-",
                  " ".join("%.2f" % b for b in r["busy"]) if r else "-",
                  load_cell(args, r)] for o, r in sweep]
    show(args, "PyTorch DDP settings at 2 ranks x 1 thread (%s, B=%d/rank, T=%d)" % (
        args.model, args.batch, args.seq),
        [("DDP setting", ""), ("ms/step", "(mean)"), ("best", "ms"), ("tokens/s", ""),
         ("grads equal", "across ranks"), ("CPU/wall", "per rank"), ("others'", "load")],
        opt_cells, ["The fastest mean (bucket_cap_mb %g, gradient_as_bucket_view %s) is used in "
                    "the table below at every rank count." % best_opt,
                    reproduce(args, "ddp", " --ddp-options %s" % ",".join(
                        "%g:%s" % (o[0], "on" if o[1] else "off") for o in args.ddp_options))],
        md)
    notes = [
        "Each rank trains B=%d sequences of T=%d per step (a step is ranks x B sequences), "
        "AdamW, %d warm-up + %d timed steps%s; fp32." % (
            args.batch, args.seq, args.warmup, args.steps,
            ", pooled over %d rounds" % args.rounds if args.rounds > 1 else ""),
        "x 1 rank = tokens/s / the same system's 1-rank tokens/s (the 1-rank rows run without "
        "MPI or DDP: kiln train alone; PyTorch bench/torch_gpt.py).",
        "kiln x = PyTorch ms/step / kiln ms/step at the same ranks (above 1: kiln is faster).",
        "comm: kiln's time in gradient reductions per step and the share of it hidden behind "
        "backward (its metrics' comm_ms, comm_hidden). Peak RSS: kiln's rank 0 (its metrics), "
        "PyTorch's largest rank (each process's ru_maxrss; /usr/bin/time -v for 1 process).",
        ("%d ranks on %d cores are oversubscribed for both systems alike (mpirun "
         "--oversubscribe; Open MPI binds no rank then); at" % (max(args.ranks), args.cores)
         if max(args.ranks) > args.cores else "At") +
        " up to %d ranks Open MPI binds each rank to a core of its own; PyTorch's processes "
        "are never bound." % args.cores,
        "PyTorch DDP: gloo, torch.multiprocessing (spawn) and env:// on 127.0.0.1, "
        "torch.set_num_threads(1), OMP_NUM_THREADS=1; its ranks' gradients after the "
        "reduction were compared on a warm-up step (per tensor sum and sum of squares, fp64): "
        "%s." % ("equal on every rank while the ranks' own losses differ, so DDP reduced "
                 "gradients computed on different data" if all(
                     r["agree"] for n, r in rows if r and n == "PyTorch DDP") else
                 "NOT equal: see the logs"),
        reproduce(args, "ddp", " --ranks %s" % ",".join(map(str, args.ranks)))]
    show(args, "kiln against PyTorch DDP: %s, B=%d per rank, T=%d, 1 thread per rank" % (
        args.model, args.batch, args.seq), cols, cells, notes, md)


# ---- part 2: 2 ranks x 1 thread against 1 rank x 2 threads ----

def part_threads(args, md, facts):
    b = args.batch
    print("\n== kiln: 2 ranks x 1 thread against 1 rank x 2 threads (%s, global batch %d, "
          "T=%d) ==" % (args.model, 2 * b, args.seq))
    yield_env = {"OMPI_MCA_mpi_yield_when_idle": "1"}
    configs = [
        ("1 rank x 2 threads", "ref", 1, 2, 2 * b, (), (), None, "--batch %d --threads 2" % (2 * b)),
        ("2 ranks x 1 thread", "dp", 2, 1, b, tuple(args.kiln_flags), (), None,
         "mpirun -np 2 ... --batch %d %s" % (b, " ".join(args.kiln_flags))),
        ("1 rank x 1 thread (one rank's compute)", "solo", 1, 1, b, (), (), None,
         "--batch %d --threads 1" % b),
        ("2 x 1, ZeRO 0 (every rank's whole optimizer)", "zero0", 2, 1, b, ("--zero", "0"),
         (), None, "--zero 0"),
        ("2 x 1, gradients through MPI's messages", "noshm", 2, 1, b, tuple(args.kiln_flags),
         (), {"KILN_COMM_SHM": "0"}, "KILN_COMM_SHM=0 %s" % " ".join(args.kiln_flags)),
        ("2 x 1, a copy of the weights per rank", "percopy", 2, 1, b, tuple(args.kiln_flags),
         (), {"KILN_COMMON_WEIGHTS": "0"},
         "KILN_COMMON_WEIGHTS=0 %s" % " ".join(args.kiln_flags)),
        ("2 x 1, one reduction after backward", "nobucket", 2, 1, b,
         tuple(args.kiln_flags) + ("--bucket-mb", "0"), (), None, "--bucket-mb 0"),
        ("2 x 1, ranks not bound to cores", "nobind", 2, 1, b, tuple(args.kiln_flags),
         ("--bind-to", "none"), None,
         "mpirun --bind-to none"),
        ("2 x 1, MPI waits yield the core", "yield", 2, 1, b, tuple(args.kiln_flags), (),
         yield_env,
         "OMPI_MCA_mpi_yield_when_idle=1"),
        ("2 x 1, gradients reduced in bf16", "bf16", 2, 1, b,
         tuple(args.kiln_flags) + ("--reduce-dtype", "bf16"), (),
         None, "--reduce-dtype bf16"),
    ]
    if not args.diagnose:
        configs = configs[:2]
    res = run_kiln_set(args, {tag: ("threads_" + tag, n, t, bb, flags, mpi, env)
                              for _, tag, n, t, bb, flags, mpi, env, _ in configs})
    ref = res.get("ref")
    cols = [("configuration", ""), ("flags", ""), ("global", "batch"), ("ms/step", "(mean)"),
            ("best", "ms"), ("tokens/s", "(mean)"), ("x 1x2", "(mean)"), ("x 1x2", "(best)"),
            ("comm", "ms"), ("hidden", ""), ("exposed", "comm ms"), ("sent per", "step"),
            ("others'", "load")]
    cells = []
    for name, tag, n, t, bb, _, _, _, flags in configs:
        r = res.get(tag)
        if not r:
            cells.append([name, flags, str(n * bb), "failed"] + ["-"] * 9)
            continue
        exposed = r["comm_ms"] * (1 - r["hidden"]) if n > 1 else None
        cells.append([name, flags, str(n * bb), f1(r["ms"]), f1(r["ms_min"]), f1(r["tps"]),
                      ratio(r["tps"], ref["tps"]) if ref else "-",
                      ratio(ref["ms_min"] * n * bb, r["ms_min"] * 2 * b) if ref else "-",
                      f1(r.get("comm_ms")), "%.0f%%" % (100 * r["hidden"]) if n > 1 else "-",
                      f1(exposed), "%.1f MiB" % (r["bytes"] / MIB) if n > 1 else "-",
                      load_cell(args, r)])
    notes = ["x 1x2 = tokens/s / 1 rank x 2 threads' tokens/s (target for 2 ranks x 1 thread: "
             "at least 0.9); (best) from the fastest steps. The 1 x 1 row trains half the "
             "global batch, so its ratio is of tokens/s as well."]
    dp = res.get("dp")
    if ref and dp:
        rm, rb = dp["tps"] / ref["tps"], ref["ms_min"] / dp["ms_min"]
        notes.append("2 ranks x 1 thread against 1 rank x 2 threads: %.2fx (mean), %.2fx "
                     "(best): the 0.9x target is %s." % (rm, rb, "met" if rm >= 0.9 else
                                                         "not met" + (" (met on the best "
                                                                      "steps)" if rb >= 0.9
                                                                      else "")))
    solo = res.get("solo")
    if dp and solo:
        exposed = dp["comm_ms"] * (1 - dp["hidden"])
        rest = dp["ms"] - solo["ms"] - exposed
        notes.append("Where the 2-rank step goes (means): one rank's compute alone (1 x 1 row) "
                     "%.1f ms + exposed communication %.1f ms + the rest %.1f ms = %.1f ms: the "
                     "rest is what the step loses to the reduction that runs hidden beside "
                     "backward (its thread and MPI's copies share the rank's core) and to the "
                     "ranks waiting for each other." % (solo["ms"], exposed, rest, dp["ms"]))
    nob = res.get("nobucket")
    if nob and solo:
        red = nob["comm_ms"] * (1 - nob["hidden"])
        notes.append("With one reduction after backward nothing overlaps: %.1f ms = one rank's "
                     "compute %.1f ms + the reduction %.1f ms %+.1f ms%s." % (
                         nob["ms"], solo["ms"], red, nob["ms"] - solo["ms"] - red,
                         "; overlapping the buckets with backward (the 2 x 1 row) changes the "
                         "step by %+.1f ms" % (dp["ms"] - nob["ms"]) if dp else ""))
    notes.append("Bytes sent per step are rank 0's, counted as a ring sends them (kiln's "
                 "comm_bytes). Open MPI binds each of 2 ranks to its own core unless "
                 "`--bind-to none`; kiln reduces each bucket on a communication thread of its "
                 "own, so a bound rank runs its compute and its reduction on one core.")
    notes.append(reproduce(args, "threads"))
    show(args, "kiln: 2 ranks x 1 thread against 1 rank x 2 threads (%s, T=%d, shared memory)"
         % (args.model, args.seq), cols, cells, notes, md)


# ---- part 3: memory per rank ----

WRAPPER = """#!/bin/sh
# bench_dist.py: one rank under an address-space limit (KiB; rank 0: BD_LIMIT0, the others:
# BD_LIMIT) and, with BD_RSS set, /usr/bin/time -v writing its peak RSS to $BD_RSS.<rank>.
r=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}
if [ "$r" = 0 ]; then lim=${BD_LIMIT0:-unlimited}; else lim=${BD_LIMIT:-unlimited}; fi
ulimit -v "$lim" || exit 97
if [ -n "$BD_RSS" ] && [ -x /usr/bin/time ]; then
    exec /usr/bin/time -v -o "$BD_RSS.$r" "$@"
fi
exec "$@"
"""


def mem_available_mib():
    with open("/proc/meminfo") as f:
        m = re.search(r"^MemAvailable:\s+(\d+) kB", f.read(), re.M)
    return int(m.group(1)) / 1024.0


def part_memory(args, md, facts):
    n = args.memory_ranks
    print("\n== memory per rank: %d ranks, B=%d, T=%d ==" % (n, args.memory_batch,
                                                              args.memory_seq))
    wrapper = os.path.join(args.work, "rank_wrapper.sh")
    with open(wrapper, "w") as f:
        f.write(WRAPPER)
    os.chmod(wrapper, 0o755)
    rows = []
    for model in args.memory_models:
        for zero in (0, 1, 2, 3):
            tag = "memory_%s_zero%d" % (model, zero)
            flags = ["--zero", str(zero)]
            base = kiln_train_cmd(args, model, args.memory_batch, args.memory_seq, 0, 1, None,
                                  flags)
            # 1. the plan without allocating: every rank under a 1 GiB address space, so that
            # kiln refuses to start and its refusal states the plan (ZeRO and ranks included)
            env = bt.bench_env(1, {"BD_LIMIT0": str(1 << 20), "BD_LIMIT": str(1 << 20)})
            _, out, _, _ = run(args, mpirun_prefix(args, n) + [wrapper] + base, env,
                               os.path.join(args.work, tag + "_plan.log"), timeout=120)
            mine = "\n".join(x for x in out.splitlines() if "rank 0 of" in x) or out
            plan = parse_plan(mine)
            row = {"model": model, "zero": zero, "plan": plan, "measured": None}
            rows.append(row)
            if not plan.get("plan_total"):
                row["note"] = "no plan (see %s_plan.log)" % tag
                print("  %s: %s" % (tag, row["note"]))
                continue
            need = plan["plan_total"] + plan.get("headroom", 0.0)
            avail = mem_available_mib()
            row["need_all"], row["avail"] = n * need, avail
            print("  %s: plan %s per rank, %d ranks need %s with kiln's headroom; %s available" % (
                tag, mib(plan["plan_total"]), n, mib(n * need), mib(avail)))
            if n * need > 0.85 * avail:
                row["note"] = "%d ranks do not fit: %s needed, %s available" % (
                    n, mib(n * need), mib(avail))
                continue
            # 2. measured: every rank under an address-space limit of its plan, kiln's headroom
            # and 2 GiB more (MPI's own buffers: a reduce-scatter takes temporaries the size
            # of a bucket, the embedding's 200 MiB and more), so that a run far above its plan
            # fails rather than the machine running out; peak RSS from /usr/bin/time -v
            lim = int((need + 2048) * 1024)
            prefix = os.path.join(args.work, tag + "_rss")
            for r in range(n):
                if os.path.exists("%s.%d" % (prefix, r)):
                    os.remove("%s.%d" % (prefix, r))
            env = bt.bench_env(1, {"BD_LIMIT0": str(lim), "BD_LIMIT": str(lim), "BD_RSS": prefix})
            metrics = os.path.join(args.work, tag + ".jsonl")
            cmd = mpirun_prefix(args, n) + [wrapper] + kiln_train_cmd(
                args, model, args.memory_batch, args.memory_seq, args.memory_steps, 1, metrics,
                flags)
            rc, out, others, wall = run(args, cmd, env, os.path.join(args.work, tag + ".log"))
            rss = []
            for r in range(n):
                try:
                    txt = open("%s.%d" % (prefix, r)).read()
                    rss.append(int(re.search(r"Maximum resident set size \(kbytes\): (\d+)",
                                             txt).group(1)) / 1024.0)
                except (OSError, AttributeError):
                    rss.append(None)
            row["plan"] = dict(plan, **parse_plan(out))
            row["measured"] = {"rc": rc, "rss": rss, "wall": wall, "others": others,
                               "cmd": cmd}
            if rc in (137, -9) or "exited on signal 9" in out or "Exit code:    137" in out:
                row["note"] = "a rank was killed (the kernel's out-of-memory killer: other " \
                    "work took memory during the run; see %s.log)" % tag
            elif rc != 0:
                row["note"] = "the run failed (rc %d, see %s.log)" % (rc, tag)
            print("  %s: rc %d, peak RSS per rank %s, %.0f s" % (
                tag, rc, " ".join(mib(x) for x in rss), wall))
    cols = [("model", ""), ("ZeRO", ""), ("parameters", ""), ("gradients", ""),
            ("optimizer", "moments"), ("activations", "+ workspace"), ("plan", "total"),
            ("planned", "peak"), ("peak RSS", "per rank"), ("RSS", "/ planned"), ("4 ranks", "")]
    cells = []
    for row in rows:
        p, m = row["plan"], row["measured"]
        act = (p.get("plan_activations") or 0) + (p.get("plan_workspace") or 0) \
            if p.get("plan_activations") is not None else None
        rss = [x for x in (m["rss"] if m else []) if x]
        cells.append([row["model"], str(row["zero"]), mib(p.get("plan_parameters")),
                      mib(p.get("plan_gradients")), mib(p.get("plan_optimizer_moments")),
                      mib(act), mib(p.get("plan_total")), mib(p.get("planned_peak")),
                      ("%.0f-%.0f MiB" % (min(rss), max(rss)) if len(rss) > 1 else mib(rss[0]))
                      if rss else "-",
                      ratio(max(rss), p.get("planned_peak")) if rss else "-",
                      "measured" if m and m["rc"] == 0 else row.get("note", "-")])
    notes = ["Per rank, at %d ranks, B=%d, T=%d, fp32, AdamW, 1 thread per rank. The plan is "
             "kiln's own, ZeRO and ranks included: each rank of `mpirun -np %d kiln train "
             "--steps 0 --zero Z` run under a 1 GiB address space (`ulimit -v`), where kiln "
             "refuses to start before it allocates and states the plan it could not fit "
             "(planned peak: the \"planned peak\" line of a measured run, the plan plus what the "
             "process held before it)." % (n, args.memory_batch, args.memory_seq, n),
             "Measured: all %d ranks for %d steps, each under /usr/bin/time -v (its maximum "
             "resident set size) and an address-space limit of its plan plus 2.5-3 GiB; "
             "only where %d x (plan + kiln's headroom for the process) fits in 85%% of the "
             "machine's available memory at the time (it is shared)." % (n, args.memory_steps, n),
             reproduce(args, "memory", " --memory-models %s --memory-ranks %d" % (
                 ",".join(args.memory_models), n))]
    show(args, "Memory per rank at %d ranks (kiln, ZeRO 0 to 3)" % n, cols, cells, notes, md)


# ---- part 4: ZeRO and the reduction's dtype ----

def loss_diff(r, ref):
    """The largest |loss - ref's loss| over every step (warm-up too) of the first round."""
    if not r or not ref:
        return "-"
    d = [abs(a - b) for a, b in zip(r["losses"], ref["losses"]) if a is not None and b is not None]
    return "%.1e" % max(d) if d and max(d) > 0 else "0" if d else "-"


def part_zero(args, md, facts):
    print("\n== ZeRO and --reduce-dtype at 2 ranks (%s, B=%d/rank, T=%d) ==" % (
        args.model, args.batch, args.seq))
    keys = [(zero, dtype) for dtype in ("fp32", "bf16") for zero in (0, 1, 2)]
    pooled = run_kiln_set(args, {(z, d): ("zero%d_%s" % (z, d), 2, 1, args.batch,
                                          ("--zero", str(z), "--reduce-dtype", d), (), None)
                                 for z, d in keys})
    res = [(z, d, pooled[(z, d)]) for z, d in keys]
    ref = res[0][2]
    cols = [("ZeRO", ""), ("reduce", ""), ("ms/step", "(mean)"), ("best", "ms"),
            ("tokens/s", "(mean)"), ("time x", "ZeRO 0"), ("comm", "ms"), ("hidden", ""),
            ("sent per", "step"), ("sent x", "ZeRO 0"), ("optimizer", "moments"),
            ("planned", "peak"), ("max loss diff", "vs ZeRO 0 fp32"),
            ("others'", "load")]
    cells = []
    for zero, dtype, r in res:
        if not r:
            cells.append([str(zero), dtype, "failed"] + ["-"] * 11)
            continue
        cells.append([str(zero), dtype, f1(r["ms"]), f1(r["ms_min"]), f1(r["tps"]),
                      ratio(r["ms"], ref["ms"]) if ref else "-", f1(r["comm_ms"]),
                      "%.0f%%" % (100 * r["hidden"]), "%.1f MiB" % (r["bytes"] / MIB),
                      ratio(r["bytes"], ref["bytes"]) if ref else "-",
                      mib(r.get("plan_optimizer_moments")), mib(r.get("planned_peak")),
                      loss_diff(r, ref), load_cell(args, r)])
    notes = ["2 ranks x 1 thread, B=%d per rank. time x ZeRO 0 = ms/step / ZeRO 0 fp32's "
             "(above 1: slower); sent = bytes rank 0 sends per step as a ring sends them "
             "(gradients' reduction, ZeRO's gather of updated shards, the loss and norm), "
             "kiln's comm_bytes; comm ms includes the gather. Optimizer moments and planned "
             "peak are per rank, from kiln's plan. max loss diff: the largest difference of "
             "the loss from ZeRO 0 fp32's over the %d steps (the same data and start: ZeRO "
             "changes no arithmetic, a bf16 reduction rounds the gradients)." % (
                 args.batch, args.warmup + args.steps),
             reproduce(args, "zero")]
    show(args, "ZeRO stages and the reduction's dtype, 2 ranks (%s, T=%d)" % (args.model,
                                                                              args.seq),
         cols, cells, notes, md)


# ---- the run ----

def parse_list(text, kind, what):
    try:
        return [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        sys.exit("%s wants a comma-separated list, not %r" % (what, text))


def parse_ddp_options(text):
    out = []
    for part in text.split(","):
        m = re.match(r"^\s*([0-9.]+):(on|off)\s*$", part)
        if not m:
            sys.exit("--ddp-options wants BUCKET_MB:on|off,... (gradient_as_bucket_view), "
                     "not %r" % part)
        out.append((float(m.group(1)), m.group(2) == "on"))
    return out


def parse_args():
    ap = argparse.ArgumentParser(description="kiln data parallelism benchmark")
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"))
    ap.add_argument("--data", help="kiln's training shards (file, folder or glob)")
    ap.add_argument("--model", default="d12", choices=sorted(bt.PRESETS),
                    help="model of the ddp, threads and zero parts (default d12)")
    ap.add_argument("--batch", type=int, default=4, help="sequences per rank (default 4)")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5, help="timed steps")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run each configuration this many times, pooling the timed steps")
    ap.add_argument("--ranks", default="2,4", help="rank counts of the ddp part")
    ap.add_argument("--parts", default=",".join(PARTS),
                    help="comma-separated: %s (default all)" % ", ".join(PARTS))
    ap.add_argument("--kiln-flags", default="--zero 1",
                    help="kiln's flags for its runs on several ranks in the ddp and threads "
                         "parts (default '--zero 1': each rank updates its shard of the "
                         "optimizer; on one machine the gradients and the updated shards move "
                         "through shared memory)")
    ap.add_argument("--ddp-options", default="25:off,25:on,100:on,5:on",
                    help="DDP settings tried at 2 ranks: bucket_cap_mb:gradient_as_bucket_view")
    ap.add_argument("--no-diagnose", dest="diagnose", action="store_false",
                    help="threads part: only the two rows compared, not the rows that take "
                    "the 2-rank step apart")
    ap.add_argument("--memory-models", default="gpt2-350m,gpt2-774m")
    ap.add_argument("--memory-ranks", type=int, default=4)
    ap.add_argument("--memory-batch", type=int, default=1)
    ap.add_argument("--memory-seq", type=int, default=64)
    ap.add_argument("--memory-steps", type=int, default=2)
    ap.add_argument("--quiet-wait", type=float, default=30.0,
                    help="seconds to wait before each run for other processes to leave the "
                    "cores (0: start at once)")
    ap.add_argument("--max-others", type=float, default=0.3,
                    help="run again (up to --retries times) when other processes used more "
                    "than this many cores while a run ran; the quietest is kept")
    ap.add_argument("--retries", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "bench_dist"),
                    help="folder for logs, metrics and prepared data")
    ap.add_argument("--peer-malloc", choices=bt.PEER_MALLOC_CHOICES, default="tuned",
                    help="PyTorch's allocator: tuned (default; glibc kept from returning "
                    "memory to the kernel) or glibc-default")
    ap.add_argument("--markdown", action="store_true",
                    help="also print the configuration and the tables as Markdown")
    args = ap.parse_args()
    args.parts = parse_list(args.parts, str, "--parts")
    bad = [p for p in args.parts if p not in PARTS]
    if bad:
        sys.exit("--parts: unknown %s (choose from %s)" % (", ".join(bad), ", ".join(PARTS)))
    args.ranks = parse_list(args.ranks, int, "--ranks")
    args.kiln_flags = shlex.split(args.kiln_flags)
    args.memory_models = parse_list(args.memory_models, str, "--memory-models")
    args.ddp_options = parse_ddp_options(args.ddp_options)
    args.kiln = os.path.abspath(args.kiln)
    args.cores = len(os.sched_getaffinity(0))
    return args


def header_lines(args, alt):
    lines = bt.machine_lines(SimpleNamespace(threads=1), alt, {}) + [
        bt.peer_malloc_line(args.peer_malloc)]
    lines[-1] = lines[-1].replace("kiln --threads 1, torch.set_num_threads(1)",
                                  "kiln --threads 1 and torch.set_num_threads(1) per rank "
                                  "(2 threads for kiln's 1 rank x 2 threads row)")
    mpi = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout
    lines.append("MPI: %s (shared memory between ranks on this machine); mpirun%s, "
                 "--oversubscribe above %d ranks" % (
                     (mpi.splitlines() or ["mpirun not found"])[0], " --allow-run-as-root"
                     if os.geteuid() == 0 else "", args.cores))
    return lines


def main():
    args = parse_args()
    os.makedirs(args.work, exist_ok=True)
    env1 = bt.bench_env(1)
    alt = bt.blas_alternative(bt.multiarch())
    header = header_lines(args, alt)
    print("environment:")
    for line in header:
        print("  " + line)
    if not os.access(args.kiln, os.X_OK):
        sys.exit("no kiln binary at %s (build it, or pass --kiln)" % args.kiln)
    args.data, err = bt.find_data(args, args.kiln, env1)
    if err:
        sys.exit("kiln: " + err)
    # One `kiln bench peak` at 1 thread: the MFU denominator every kiln run gets (so that no
    # run spends seconds measuring its own), and the BLAS kiln's process mapped.
    wait_quiet(args.quiet_wait, args.cores)
    peak, note, mapped = bt.kiln_peak(args.kiln, env1, args.work, "start")
    args.peak = peak or 100.0
    kb = bt.peer_blas({"mapped": mapped, "env": env1})
    config = ["kiln: %s; sgemm_ from %s (%s), %s" % (
        os.path.relpath(args.kiln, ROOT), kb["sgemm"], kb["label"], note),
        "data: %s (kiln); PyTorch trains on random tokens" % os.path.relpath(args.data, ROOT)]
    for line in config:
        print(line)
    md, facts = [], {}
    t0 = time.time()
    for part in args.parts:
        print("\n[%s: load average %.1f %.1f %.1f at the start of this part]" % (
            (part,) + os.getloadavg()))
        {"ddp": part_ddp, "threads": part_threads, "memory": part_memory,
         "zero": part_zero}[part](args, md, facts)
    took = "the whole run took %.0f s; load average %.1f at the end" % (
        time.time() - t0, os.getloadavg()[0])
    print("\n" + took)
    if facts.get("torch_blas"):
        config.append("PyTorch: sgemm_ from %s, %.1f GFLOP/s at 1 thread on the model's "
                      "products (kiln: %.1f)" % (facts["torch_blas"], facts["torch_gemm"] or 0,
                                                 args.peak))
    if args.markdown:
        print("\nMarkdown for bench/README.md:\n")
        for line in header + config + [took]:
            print("- " + line)
        for title, cols, cells, notes in md:
            print("\n**%s**\n" % title)
            bt.print_markdown_table(cells, cols)
            print("\n" + " ".join(notes))


if __name__ == "__main__":
    main()
