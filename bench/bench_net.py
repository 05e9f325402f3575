#!/usr/bin/python3
"""kiln's data parallelism on a simulated network: measured against the alpha-beta model.

    /usr/bin/python3 bench/bench_net.py [--build build-net] [--links shm,10gbit,1gbit]
        [--ranks 2,4] [--max 256M] [--budget 0.3] [--model d12] [--warmup 2] [--steps 5]
        [--work /tmp/kiln-net] [--data SHARDS] [--docs docs] [--report-only]

For each link and rank count it runs, as root, three programs:

  bench_pingpong      ping-pong (8 B .. --max) and allreduce / reduce-scatter / allgather
                      (4 KiB .. --max) with Open MPI's own choice of algorithm ("default")
  bench_pingpong      the three collectives again with the ring algorithm forced ("ring":
                      coll_tuned allreduce 4, reduce_scatter 3, allgatherv 3), and over TCP
                      once more with Open MPI's algorithms but eager sends up to 32 MiB
                      ("eager": btl_tcp_eager_limit and btl_tcp_max_send_size)
  kiln train          --model M --batch 2 --seq 64 --threads 1, --warmup + --steps steps, the
                      last --steps timed from the --metrics file; in each configuration

A link is "shm" (plain mpirun: Open MPI's shared memory, vader) or a tc rate (10gbit,
1gbit): bench/netsim.sh puts each rank in its own network namespace behind a veth shaped to
that rate, and Open MPI talks TCP only. Every run has mpi_yield_when_idle 1 (a rank waiting
in MPI gives up its core: the machine has fewer cores than ranks plus the kernel's TCP
work), and the CPU time of the whole machine over the run is read from /proc/stat.

The model (a, b from the same run's ping-pong: a = the one-way time of 8 bytes, b = the
slope of a least-squares line through the one-way times of messages of 4 MiB and more):
  ring allreduce           2(n-1) a + 2(n-1)/n S b
  ring reduce-scatter      (n-1) a + (n-1)/n S b      (S: the bytes every rank puts in)
  ring allgather           (n-1) a + (n-1)/n S b      (S: the bytes every rank gets out)
  kiln's gradients         k (2(n-1) a) + 2(n-1)/n G b, G the gradient bytes, k the buckets

and the projection to 8-1024 ranks uses stated (cited, not measured) a and b of real
networks. Results accumulate in WORK/results.json (a link already there is not run again
unless --rerun names it); the tables are printed as Markdown and written to
DOCS/network_*.csv with the figure DOCS/network.png.
"""

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, ".."))
NETSIM = os.path.join(HERE, "netsim.sh")
YIELD = ["--mca", "mpi_yield_when_idle", "1"]
# Open MPI's own choice of algorithm: kiln asks for the ring unless told otherwise
# (src/dist/comm_mpi.c), and dynamic rules off restores Open MPI's decisions
OWN = ["--mca", "coll_tuned_use_dynamic_rules", "0"]
RING = ["--mca", "coll_tuned_use_dynamic_rules", "1", "--mca", "coll_tuned_allreduce_algorithm",
        "4", "--mca", "coll_tuned_reduce_scatter_algorithm", "3", "--mca",
        "coll_tuned_allgatherv_algorithm", "3"]
# Eager sends up to 32 MiB: no rendezvous handshake whose reply can wait behind bulk data
EAGER = ["--mca", "btl_tcp_eager_limit", str(32 << 20), "--mca", "btl_tcp_max_send_size",
         str(32 << 20)]
SHM = ["--allow-run-as-root", "--oversubscribe", "--mca", "pml", "ob1", "--mca", "btl",
       "self,vader"]
BUCKET_BYTES = 25 << 20  # kiln train's default --bucket-mb 25
MiB = 1 << 20

# ---- (d): real networks, cited rather than measured ----
# a: one-way MPI latency of a small message; b: seconds per byte at the payload rate.
NETWORKS = [
    ("10 GbE, TCP", 20e-6, 1 / (10e9 / 8 * 0.94),
     "a: 20 us, kernel TCP over a 10 GbE NIC and one switch (typically 10-30 us; 10 us over "
     "veth here); b: 1.25 GB/s x 0.94 (1448 payload bytes per 1538 on the wire)"),
    ("100 Gb/s IB (EDR, HDR100)", 1.5e-6, 1 / 12.0e9,
     "a: 1.5 us (MPI ping-pong over RDMA, ~1 us on the NIC plus a switch hop); b: 12.0 GB/s "
     "(96% of 12.5)"),
    ("400 Gb/s IB NDR", 1.5e-6, 1 / 48.0e9,
     "a: 1.5 us; b: 48 GB/s (96% of 50)"),
]
SCALE_RANKS = [8, 16, 64, 256, 1024]
# GPT-2 sizes as kiln's presets (vocabulary padded to 50304, context 1024, tied head)
GPT2 = {"gpt2-124m": (12, 768), "gpt2-350m": (24, 1024), "gpt2-774m": (36, 1280)}
TOKENS_PER_RANK = 8 * 1024  # per step: micro-batch 8 x 1024
FLOPS_PER_RANK = 100e12     # effective FLOP/s of one rank (an A100 at ~32% of its bf16 peak)


def gpt2_params(layers, channels, vocab=50304, ctx=1024):
    c = channels
    return vocab * c + ctx * c + layers * (12 * c * c + 13 * c) + 2 * c


def parse_size(s):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMG]?)", s.strip(), re.I)
    if not m:
        raise argparse.ArgumentTypeError("a size like 256M, not %r" % s)
    return int(float(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[
        m.group(2).upper()])


def cpu_times():
    """Jiffies of the whole machine from /proc/stat: (user+nice, system, softirq+irq, idle)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (v[0] + v[1], v[2], v[5] + v[6], v[3] + v[4])


def cpu_share(before, after):
    d = [b - a for a, b in zip(before, after)]
    total = sum(d) or 1
    return {"user": d[0] / total, "system": d[1] / total, "irq": d[2] / total,
            "idle": d[3] / total, "cores": os.cpu_count()}


def busy_share(seconds=1.0):
    """Share of the machine's CPU time busy over the next `seconds`."""
    c0 = cpu_times()
    time.sleep(seconds)
    s = cpu_share(c0, cpu_times())
    return 1 - s["idle"]


def wait_quiet(limit_s, most=0.25):
    """Wait (up to limit_s) until other work leaves the machine at least 1 - most idle: with
    two cores, anyone else's process changes every figure. Returns the last busy share."""
    t0 = time.time()
    while True:
        b = busy_share()
        if b <= most or time.time() - t0 > limit_s:
            if b > most:
                print("  warning: the machine is %.0f%% busy before this run" % (100 * b),
                      flush=True)
            return b
        print("  the machine is %.0f%% busy with other work: waiting" % (100 * b), flush=True)
        time.sleep(10)


def run(cmd, log, env=None, timeout=1800, quiet_s=600):
    """Run cmd, its output to log; returns (status, output, cpu share); first waits for a
    quiet machine."""
    before = wait_quiet(quiet_s)
    c0, t0 = cpu_times(), time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env=env, timeout=timeout)
    c1 = cpu_times()
    with open(log, "w") as f:
        f.write("$ %s\n%s" % (" ".join(cmd), p.stdout))
    share = cpu_share(c0, c1)
    share["wall_s"] = time.time() - t0
    share["busy_before"] = before
    return p.returncode, p.stdout, share


def mpi_cmd(link, n, extra, prog):
    """The command line running prog (a list) on n ranks over link."""
    if link == "shm":
        return ["mpirun"] + SHM + extra + ["-np", str(n)] + prog
    return [NETSIM, "run", str(n), "--"] + prog


def mpi_env(link, extra):
    env = dict(os.environ)
    if link != "shm":
        env["NETSIM_MPIRUN_EXTRA"] = " ".join(extra)
    return env


def read_csv(path):
    rows = []
    with open(path) as f:
        head = f.readline().strip().split(",")
        for line in f:
            v = line.strip().split(",")
            r = dict(zip(head, v))
            for k in ("ranks", "bytes", "reps", "sent_bytes"):
                r[k] = int(r[k])
            for k in ("median_s", "best_s"):
                r[k] = float(r[k])
            rows.append(r)
    return rows


def slope(rows):
    """Least-squares slope of median_s over bytes, through the rows of 4 MiB and more."""
    big = [r for r in rows if r["bytes"] >= 4 * MiB] or rows[-3:]
    xs = [r["bytes"] for r in big]
    ys = [r["median_s"] for r in big]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else my / mx


def fit_alpha_beta(rows):
    """alpha: one-way time of the smallest ping-pong; beta: the ping-pong's slope over >= 4
    MiB; gamma: local_sum's slope (seconds per byte added), 0 without it."""
    pp = sorted((r for r in rows if r["op"] == "pingpong"), key=lambda r: r["bytes"])
    loc = sorted((r for r in rows if r["op"] == "local_sum"), key=lambda r: r["bytes"])
    return pp[0]["median_s"], slope(pp), slope(loc) if loc else 0.0


def model(op, n, size, alpha, beta, gamma=0.0):
    """Ring: allreduce and reduce-scatter add (n-1)/n S bytes locally, allgather nothing."""
    add = (n - 1) / n * size * gamma if op in ("allreduce", "reduce_scatter") else 0.0
    if op == "allreduce":
        return 2 * (n - 1) * alpha + 2 * (n - 1) / n * size * beta + add
    return (n - 1) * alpha + (n - 1) / n * size * beta + add


def train_cmd(args, tag):
    return [os.path.join(args.build, "kiln"), "train", "--model", args.model, "--data", args.data,
            "--batch", "2", "--seq", "64", "--threads", "1", "--steps",
            str(args.warmup + args.steps), "--peak-gflops", "1000", "--metrics",
            os.path.join(args.work, tag + ".jsonl"), "--save",
            os.path.join(args.work, tag + ".safetensors")]


def read_metrics(path, warmup):
    steps = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{") and '"event"' not in line:  # watchdog events
                steps.append(json.loads(line))
    timed = [s for s in steps if s["step"] > warmup]
    mean = lambda k: sum(s[k] for s in timed) / len(timed)  # noqa: E731
    return {"steps": len(timed), "ms": mean("ms"), "comm_ms": mean("comm_ms"),
            "comm_hidden": mean("comm_hidden"), "comm_bytes": mean("comm_bytes"),
            "tokens_per_s": mean("tokens_per_s")}


def configs(link, first_ops, ops):
    """(name, mpirun flags, bench ops) of each Open MPI configuration measured on link."""
    out = [("default", YIELD + OWN, first_ops), ("ring", YIELD + RING, ops)]
    if link != "shm":  # the TCP BTL's settings: nothing to change on shared memory
        out.append(("eager", YIELD + OWN + EAGER, ops))
    return out


def measure_link(link, n, args):
    """Every run of one link at n ranks -> dict."""
    tag = "%s_n%d" % (link, n)
    res = {"link": link, "ranks": n}
    if link != "shm":
        subprocess.run([NETSIM, "up", str(n), link], check=True)
    try:
        pp = os.path.join(args.build, "bench_pingpong")
        common = ["--max", str(args.max), "--budget", str(args.budget)]
        colls = "allreduce,reduce_scatter,allgather"
        for alg, extra, ops in configs(link, "pingpong,local_sum," + colls, colls):
            csv = os.path.join(args.work, "%s_%s.csv" % (tag, alg))
            prog = [pp, "--ops", ops, "--csv", csv] + common
            rc, out, cpu = run(mpi_cmd(link, n, extra, prog), os.path.join(
                args.work, "%s_%s.log" % (tag, alg)), mpi_env(link, extra))
            if rc != 0:
                sys.exit("bench_net: %s failed (status %d); see %s/%s_%s.log\n%s" % (
                    " ".join(prog), rc, args.work, tag, alg, out[-2000:]))
            res["bench_" + alg] = {"rows": read_csv(csv), "cpu": cpu}
            print("  %s %s: %.0f s, CPU %s" % (tag, alg, cpu["wall_s"], fmt_cpu(cpu)),
                  flush=True)
        for alg, extra, _ in configs(link, "", ""):
            t = "%s_train_%s" % (tag, alg)
            rc, out, cpu = run(mpi_cmd(link, n, extra, train_cmd(args, t)),
                               os.path.join(args.work, t + ".log"), mpi_env(link, extra))
            if rc != 0:
                sys.exit("bench_net: kiln train failed (status %d); see %s/%s.log\n%s" % (
                    rc, args.work, t, out[-2000:]))
            m = read_metrics(os.path.join(args.work, t + ".jsonl"), args.warmup)
            m["cpu"] = cpu
            res["train_" + alg] = m
            print("  %s train %s: %.0f ms/step, comm %.0f ms (%.0f%% hidden), CPU %s" % (
                tag, alg, m["ms"], m["comm_ms"], 100 * m["comm_hidden"], fmt_cpu(cpu)),
                flush=True)
    finally:
        if link != "shm":
            subprocess.run([NETSIM, "down"], stdout=subprocess.DEVNULL)
    return res


# ---- report ----

def fmt_cpu(cpu):
    """The machine's CPU time over a run: user / kernel (system + irq) / idle."""
    return "%.0f/%.0f/%.0f%%" % (100 * cpu["user"], 100 * (cpu["system"] + cpu["irq"]),
                                 100 * cpu["idle"])

def fmt_t(s):
    if s < 1e-3:
        return "%.1f us" % (s * 1e6)
    if s < 1:
        return "%.2f ms" % (s * 1e3)
    return "%.2f s" % s


def fmt_b(b):
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k:
            return "%g %s" % (b / k, unit)
    return "%d B" % b


def fits(results):
    out = {}
    for key, r in results.items():
        out[key] = fit_alpha_beta(r["bench_default"]["rows"])
    return out


def table_alpha_beta(results, ab):
    lines = ["| link | ranks | alpha (8 B one-way) | 1/beta (>= 4 MiB) | one-way 64 KiB | "
             "one-way 16 MiB | 1/gamma (local sum) | CPU user/kernel/idle |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for key, r in results.items():
        a, b, g = ab[key]
        pp = {x["bytes"]: x["median_s"] for x in r["bench_default"]["rows"]
              if x["op"] == "pingpong"}
        lines.append("| %s | %d | %s | %.3f GB/s (%.2f Gbit/s) | %s | %s | %.1f GB/s | %s |" % (
            r["link"], r["ranks"], fmt_t(a), 1e-9 / b, 8e-9 / b,
            fmt_t(pp.get(64 << 10, float("nan"))), fmt_t(pp.get(16 << 20, float("nan"))),
            1e-9 / g if g > 0 else float("nan"), fmt_cpu(r["bench_default"]["cpu"])))
    return "\n".join(lines)


def collective_rows(results, ab):
    """Every (link, n, op, size): predicted, measured default, ring and eager (None: not
    measured)."""
    rows = []
    for key, r in results.items():
        a, b, g = ab[key]
        n = r["ranks"]
        other = {alg: {(x["op"], x["bytes"]): x["median_s"] for x in r["bench_" + alg]["rows"]}
                 for alg in ("ring", "eager") if "bench_" + alg in r}
        for x in r["bench_default"]["rows"]:
            if x["op"] in ("pingpong", "local_sum"):
                continue
            k = (x["op"], x["bytes"])
            rows.append({"link": r["link"], "ranks": n, "op": x["op"], "bytes": x["bytes"],
                         "model_s": model(x["op"], n, x["bytes"], a, b),
                         "model_abg_s": model(x["op"], n, x["bytes"], a, b, g),
                         "default_s": x["median_s"],
                         "ring_s": other.get("ring", {}).get(k),
                         "eager_s": other.get("eager", {}).get(k),
                         "sent_bytes": x["sent_bytes"]})
    return rows


def cell(t, m):
    return ("%s | %.2f" % (fmt_t(t), t / m)) if t else "- | -"


def table_collectives(rows, sizes):
    lines = ["| link | n | op | size | model a-b | + local sum | Open MPI default | / model | "
             "ring forced | / model | eager 32 MiB | / model |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for x in rows:
        if x["bytes"] not in sizes:
            continue
        lines.append("| %s | %d | %s | %s | %s | %s | %s | %s | %s |" % (
            x["link"], x["ranks"], x["op"], fmt_b(x["bytes"]), fmt_t(x["model_s"]),
            fmt_t(x["model_abg_s"]), cell(x["default_s"], x["model_s"]),
            cell(x["ring_s"], x["model_s"]), cell(x["eager_s"], x["model_s"])))
    return "\n".join(lines)


def train_prediction(r, a, b, gamma):
    """Gradient bytes, buckets, and the ring model's time of their reduction (with the
    local sums)."""
    n = r["ranks"]
    g = r["train_default"]["comm_bytes"] / (2 * (n - 1) / n)  # gradient bytes (+ tiny sums)
    k = math.ceil(g / BUCKET_BYTES)
    return g, k, model("allreduce", n, g, k * a, b, gamma)


def table_train(results, ab):
    lines = ["| link | n | algorithm | ms/step | tokens/s | comm ms | hidden | exposed ms | "
             "model comm ms | measured / model | CPU user/kernel/idle |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for key, r in results.items():
        g, k, pred = train_prediction(r, *ab[key])
        for alg in ("default", "ring", "eager"):
            m = r.get("train_" + alg)
            if m is None:
                continue
            lines.append("| %s | %d | %s | %.0f | %.0f | %.0f | %.0f%% | %.0f | %.0f | %.2f | "
                         "%s |" % (
                             r["link"], r["ranks"], alg, m["ms"], m["tokens_per_s"],
                             m["comm_ms"], 100 * m["comm_hidden"],
                             m["comm_ms"] * (1 - m["comm_hidden"]), pred * 1e3,
                             m["comm_ms"] / (pred * 1e3), fmt_cpu(m["cpu"])))
    return "\n".join(lines)


def scaling_rows():
    rows = []
    for net, a, b, _ in NETWORKS:
        for name, (layers, ch) in GPT2.items():
            p = gpt2_params(layers, ch)
            g = 4 * p
            k = math.ceil(g / BUCKET_BYTES)
            compute = 6 * p * TOKENS_PER_RANK / FLOPS_PER_RANK
            for n in SCALE_RANKS:
                lat = k * 2 * (n - 1) * a
                bw = 2 * (n - 1) / n * g * b
                ring = lat + bw
                z3 = k * 3 * (n - 1) * a + 3 * (n - 1) / n * g * b
                rows.append({"network": net, "model": name, "params": p, "ranks": n,
                             "grad_bytes": g, "buckets": k, "compute_s": compute,
                             "allreduce_s": ring, "latency_part_s": lat,
                             "allreduce_bf16_s": k * 2 * (n - 1) * a + bw / 2,
                             "zero3_s": z3, "frac": ring / (ring + compute),
                             "frac_bf16": (k * 2 * (n - 1) * a + bw / 2) /
                             (k * 2 * (n - 1) * a + bw / 2 + compute)})
    return rows


def table_scaling(rows):
    lines = ["| network | ranks | " + " | ".join(
        "%s allreduce (latency part) | comm share" % m for m in GPT2) + " |",
        "|---|---:|" + "---:|---:|" * len(GPT2)]
    for net, _, _, _ in NETWORKS:
        for n in SCALE_RANKS:
            cells = []
            for m in GPT2:
                x = next(r for r in rows if r["network"] == net and r["model"] == m and
                         r["ranks"] == n)
                cells.append("%s (%s) | %.0f%%" % (fmt_t(x["allreduce_s"]),
                                                   fmt_t(x["latency_part_s"]), 100 * x["frac"]))
            lines.append("| %s | %d | %s |" % (net, n, " | ".join(cells)))
    return "\n".join(lines)


def write_csvs(docs, rows, results, ab, scale):
    with open(os.path.join(docs, "network_collectives.csv"), "w") as f:
        f.write("link,ranks,op,bytes,model_s,model_abg_s,default_s,ring_s,eager_s,sent_bytes\n")
        for x in rows:
            f.write("%s,%d,%s,%d,%.6g,%.6g,%.6g,%s,%s,%d\n" % (
                x["link"], x["ranks"], x["op"], x["bytes"], x["model_s"], x["model_abg_s"],
                x["default_s"], "%.6g" % x["ring_s"] if x["ring_s"] else "",
                "%.6g" % x["eager_s"] if x["eager_s"] else "", x["sent_bytes"]))
    with open(os.path.join(docs, "network_pingpong.csv"), "w") as f:
        f.write("link,ranks,op,bytes,median_s,best_s,alpha_s,beta_s_per_byte,gamma_s_per_byte\n")
        for key, r in results.items():
            a, b, g = ab[key]
            for x in r["bench_default"]["rows"]:
                if x["op"] in ("pingpong", "local_sum"):
                    f.write("%s,%d,%s,%d,%.6g,%.6g,%.6g,%.6g,%.6g\n" % (
                        r["link"], r["ranks"], x["op"], x["bytes"], x["median_s"], x["best_s"],
                        a, b, g))
    with open(os.path.join(docs, "network_train.csv"), "w") as f:
        f.write("link,ranks,algorithm,ms,tokens_per_s,comm_ms,comm_hidden,comm_bytes,"
                "model_comm_ms,cpu_user,cpu_kernel,cpu_idle\n")
        for key, r in results.items():
            _, _, pred = train_prediction(r, *ab[key])
            for alg in ("default", "ring", "eager"):
                m = r.get("train_" + alg)
                if m is None:
                    continue
                c = m["cpu"]
                f.write("%s,%d,%s,%.1f,%.1f,%.1f,%.3f,%d,%.1f,%.3f,%.3f,%.3f\n" % (
                    r["link"], r["ranks"], alg, m["ms"], m["tokens_per_s"], m["comm_ms"],
                    m["comm_hidden"], m["comm_bytes"], pred * 1e3, c["user"],
                    c["system"] + c["irq"], c["idle"]))
    with open(os.path.join(docs, "network_scaling.csv"), "w") as f:
        keys = list(scale[0].keys())
        f.write(",".join(keys) + "\n")
        for x in scale:
            f.write(",".join(str(x[k]) if isinstance(x[k], (int, str)) else "%.6g" % x[k]
                             for k in keys) + "\n")


def plot(docs, rows, results, ab, scale):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib (apt-get install python3-matplotlib): no figure")
        return
    links = sorted({x["link"] for x in rows}, key=lambda l: ["shm", "10gbit", "1gbit"].index(l)
                   if l in ("shm", "10gbit", "1gbit") else 9)
    fig, axes = plt.subplots(1, 3, figsize=(17, 5))
    colours = {"shm": "tab:green", "10gbit": "tab:blue", "1gbit": "tab:red"}
    for ax, n in zip(axes[:2], (2, 4)):
        for link in links:
            xs = [x for x in rows if x["link"] == link and x["ranks"] == n and
                  x["op"] == "allreduce"]
            if not xs:
                continue
            c = colours.get(link, "black")
            s = [x["bytes"] for x in xs]
            ax.loglog(s, [x["model_s"] for x in xs], "-", color=c, alpha=0.6,
                      label="%s model" % link)
            for k, mark, name in (("default_s", "o", "Open MPI default"), ("ring_s", "x", "ring"),
                                  ("eager_s", "+", "eager")):
                pts = [(x["bytes"], x[k]) for x in xs if x[k]]
                if pts:
                    ax.loglog([p[0] for p in pts], [p[1] for p in pts], mark, color=c,
                              mfc="none", label="%s %s" % (link, name))
        ax.set_title("allreduce, %d ranks: alpha-beta model (line) vs measured" % n)
        ax.set_xlabel("bytes")
        ax.set_ylabel("seconds")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    ax = axes[2]
    # the share hardly depends on the model (compute and bytes both scale with the
    # parameters; only the latency part does not): the smallest model shows the most
    for (net, _, _, _), c in zip(NETWORKS, ("tab:red", "tab:blue", "tab:green")):
        for key, ls, what in (("frac", "-", "fp32"), ("frac_bf16", "--", "bf16")):
            xs = [x for x in scale if x["network"] == net and x["model"] == "gpt2-124m"]
            ax.semilogx([x["ranks"] for x in xs], [100 * x[key] for x in xs], ls, color=c,
                        marker="o", ms=3, label="%s, %s gradients" % (net, what))
    ax.set_title("projection, gpt2-124m: share of a step in ring allreduce\n"
                 "(no overlap; compute %.0f ms per step)" % (
                     1e3 * 6 * gpt2_params(*GPT2["gpt2-124m"]) * TOKENS_PER_RANK /
                     FLOPS_PER_RANK))
    ax.set_ylim(0, 100)
    ax.set_xlabel("ranks")
    ax.set_ylabel("% of step")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(os.path.join(docs, "network.png"), dpi=110)
    print("wrote %s" % os.path.join(docs, "network.png"))


def report(results, args):
    ab = fits(results)
    rows = collective_rows(results, ab)
    scale = scaling_rows()
    os.makedirs(args.docs, exist_ok=True)
    write_csvs(args.docs, rows, results, ab, scale)
    plot(args.docs, rows, results, ab, scale)
    print("\n### (a) alpha and beta from the ping-pong\n")
    print(table_alpha_beta(results, ab))
    print("\n### (b) collectives: ring alpha-beta model vs measured (median)\n")
    print(table_collectives(rows, {4 << 10, 1 << 20, 16 << 20, 256 << 20}))
    print("\n### (c) kiln train %s, --batch 2 --seq 64 --threads 1, %d timed steps\n" % (
        args.model, args.steps))
    print(table_train(results, ab))
    print("\n### (d) projection: fp32 ring allreduce of GPT-2 gradients, %s buckets, compute "
          "%.0f TFLOP/s x %d tokens per rank per step\n" % (
              fmt_b(BUCKET_BYTES), FLOPS_PER_RANK / 1e12, TOKENS_PER_RANK))
    print(table_scaling(scale))
    for net, a, b, why in NETWORKS:
        print("- %s: alpha %s, 1/beta %.2f GB/s. %s" % (net, fmt_t(a), 1e-9 / b, why))
    for name, (layers, ch) in GPT2.items():
        p = gpt2_params(layers, ch)
        print("- %s: %.1fM parameters, %s of fp32 gradients, compute %s per step" % (
            name, p / 1e6, fmt_b(4 * p), fmt_t(6 * p * TOKENS_PER_RANK / FLOPS_PER_RANK)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build-net"))
    ap.add_argument("--links", default="shm,10gbit,1gbit")
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--max", type=parse_size, default=256 << 20)
    ap.add_argument("--budget", type=float, default=0.3, help="seconds per size (>= 3 reps)")
    ap.add_argument("--model", default="d12")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--work", default="/tmp/kiln-net")
    ap.add_argument("--data", default=None, help="token shards (default: kiln prepare, Brown)")
    ap.add_argument("--docs", default=os.path.join(ROOT, "docs"))
    ap.add_argument("--rerun", default="", help="links to measure again (comma list, or all)")
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args()
    args.build = os.path.abspath(args.build)
    os.makedirs(args.work, exist_ok=True)
    store = os.path.join(args.work, "results.json")
    results = json.load(open(store)) if os.path.exists(store) else {}
    if not args.report_only:
        if os.geteuid() != 0:
            sys.exit("bench_net: run as root (bench/netsim.sh makes namespaces and shapers)")
        if args.data is None:
            args.data = os.path.join(args.work, "data", "train_*.bin")
            if not os.path.exists(os.path.join(args.work, "data", "prepare.json")):
                subprocess.run([os.path.join(args.build, "kiln"), "prepare", "--out",
                                os.path.join(args.work, "data")], check=True)
        rerun = set(args.rerun.split(",")) if args.rerun else set()
        for link in args.links.split(","):
            for n in (int(x) for x in args.ranks.split(",")):
                key = "%s_n%d" % (link, n)
                if key in results and link not in rerun and "all" not in rerun:
                    continue
                print("measuring %s, %d ranks" % (link, n), flush=True)
                results[key] = measure_link(link, n, args)
                json.dump(results, open(store, "w"), indent=1)
    order = {"shm": 0, "10gbit": 1, "1gbit": 2}
    results = dict(sorted(results.items(), key=lambda kv: (order.get(kv[1]["link"], 9),
                                                          kv[1]["ranks"])))
    if results:
        report(results, args)


if __name__ == "__main__":
    main()
