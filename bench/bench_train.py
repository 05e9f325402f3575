#!/usr/bin/python3
"""Training-step benchmark: kiln (per precision) against PyTorch (fp32 and bf16 autocast).

    /usr/bin/python3 bench/bench_train.py [--kiln build/kiln] [--data SHARDS]
        [--model gpt2-124m] [--batch 4] [--seq 64] [--warmup 2] [--steps 5] [--threads 2]
        [--kiln-precision fp32,bf16] [--flag-below 0.6] [--gemm-seconds 0.25]
        [--torch-env VAR=VALUE ...] [--peer-malloc tuned|glibc-default] [--markdown]

Each system trains the same model (random initialisation, AdamW) at the same shapes for
`warmup` untimed and `steps` timed steps, in its own process. --model is a preset of kiln's,
a GPT-2 (gpt2-124m, gpt2-350m, d12, d6, d4) or a Llama (llama-d4, llama-d6, llama-d12,
smollm2-135m), each with GPT-2's vocabulary (the data's), as bench/model_presets.py gives
them:

  kiln P        `kiln train --model M --batch B --seq T --steps N --data D --metrics F
                --precision P`, one row per --kiln-precision (fp32 and bf16 by default),
                the per-step times read from F (the JSON Lines metrics file)
  PyTorch fp32  bench/torch_gpt.py --dtype fp32 (tests/ref/gpt_model.py, or for a Llama
                tests/ref/llama_model.py; torch.optim.AdamW)
  PyTorch bf16  bench/torch_gpt.py --dtype bf16 (forward under CPU autocast, fp32 master)

and the table gives ms/step (mean of the timed steps), tokens/s, MFU against the fp32
GEMM peak that `kiln bench peak` measures in the same run (bf16 rows: against the bf16
peak of `kiln bench peak --dtype bf16` where this kiln has it, else the fp32 peak, as the
notes say), peak RSS (/usr/bin/time -v), kiln fp32's speed and memory as ratios to each
peer, and for each reduced kiln precision P a ratio column "kiln P x": kiln fp32's and
PyTorch P's step time over kiln P's. FLOPs per step are counted as kiln
counts them (kiln_gpt_flops_per_token, with the real vocabulary of 50257; kiln computes
the head over 50304 padded columns, which is not credited); the model line of the header
names the family and shape. The llm.c row (figures cited, not measured) is for GPT-2
presets only.

A peer is only as fast as the BLAS it is given (Debian's PyTorch calls whatever
libblas.so.3 the alternatives system selects), so the table also says, for each peer,
which BLAS its process really loaded and the fp32 GEMM rate that process reaches:

  BLAS loaded   the file that provides the process's sgemm_: for PyTorch, as torch_gpt.py
                finds it in its own process; for kiln, the BLAS in its /proc/PID/maps, read
                while it runs (with OpenBLAS's build and kernel as that file reports them
                in kiln's environment)
  GEMM fp32     kiln: `kiln bench peak`; PyTorch: nn.Linear's products at the model's
                shapes, timed inside torch_gpt.py outside its steps (see there)

and marks with "!" a peer whose fp32 GEMM rate is below --flag-below (60%) of the best fp32
GEMM rate measured in the run, printing how to give it the fast BLAS.

Every run has OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE removed from its environment (this
machine sets them, which pins OpenBLAS to an older kernel), and OMP_NUM_THREADS set to
--threads. The header prints the environment (CPU, kernel, the libblas.so.3 alternative,
what was removed); --markdown repeats it with the table as Markdown for README.md.
kiln needs token shards for its data: --data, or data/brown/train_*.bin, or else it runs
`kiln prepare` (the Brown corpus, GPT-2 tokenizer) into --work first.
"""

import argparse
import glob
import json
import os
import platform
import re
import subprocess
import sys
import sysconfig
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "ref"))
sys.path.insert(0, HERE)
import blas_probe  # noqa: E402  (bench/blas_probe.py)
import model_presets  # noqa: E402  (bench/model_presets.py: shapes and FLOPs of --model)

ROOT = os.path.normpath(os.path.join(HERE, ".."))
TORCH_PY = "/usr/bin/python3"  # Debian's PyTorch
# GPT-2 name: (n_layer, n_head, n_embd), as kiln's presets (src/model/config.c) define them
# (the scripts that compare with GPT-2-only peers choose from these); --model here also takes
# the Llama presets of model_presets.LLAMA
PRESETS = {name: p[:3] for name, p in model_presets.GPT2.items()}
VOCAB = model_presets.VOCAB
OPENBLAS_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")
LLMC_CITED = "llm.c (cited)"
PRECISIONS = ("fp32", "bf16", "fp16")  # kiln train --precision


# The PyTorch peer's allocator, at its best. Debian's PyTorch allocates its CPU tensors with
# glibc's malloc, which by default returns large freed blocks to the kernel (mmap'd chunks
# above the dynamic threshold, and heap trimming), so every step faults its activations back
# in: on these VMs a page fault is costly, and gpt2-124m B=4 T=64 runs about 3x slower so.
# PyTorch's CPU performance guides advise jemalloc or tcmalloc preloaded, or glibc kept from
# giving memory back; these keep glibc from doing so (1 GiB mmap threshold and top pad, 4 GiB
# trim threshold). --peer-malloc glibc-default measures the peer without them.
PEER_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 32),
               "MALLOC_TOP_PAD_": str(1 << 30)}
PEER_MALLOC_CHOICES = ("tuned", "glibc-default")


def peer_env(threads, mode="tuned", extra=()):
    """bench_env for a PyTorch peer: with mode "tuned" its allocator kept from returning
    memory to the kernel (PEER_MALLOC), unless extra sets those variables itself."""
    env = bench_env(threads)
    if mode == "tuned":
        env.update(PEER_MALLOC)
    env.update(extra)
    return env


def peer_malloc_line(mode, extra=()):
    """The peer's allocator, in words, for headers and notes."""
    if mode != "tuned":
        return "PyTorch's allocator: glibc malloc with its defaults (returns freed memory " \
            "to the kernel; --peer-malloc glibc-default)"
    own = [k for k in PEER_MALLOC if k in dict(extra)]
    return "PyTorch's allocator: glibc malloc kept from returning memory to the kernel (%s)%s" % (
        " ".join("%s=%s" % kv for kv in PEER_MALLOC.items()),
        "; --torch-env overrides %s" % ", ".join(own) if own else "")


def bench_env(threads, extra=()):
    env = dict(os.environ)
    for k in OPENBLAS_VARS:
        env.pop(k, None)
    env["OMP_NUM_THREADS"] = str(threads)
    env.update(extra)
    return env


def multiarch():
    """Debian's multiarch triplet (x86_64-linux-gnu), from this Python's build."""
    return (sysconfig.get_config_var("MULTIARCH")
            or getattr(sys.implementation, "_multiarch", None)
            or platform.machine() + "-linux-gnu")


def blas_alternative(triplet):
    """`update-alternatives --query libblas.so.3-<triplet>` as {name, status, value, link,
    choices: [(path, priority)]}, or None where there is no such alternative."""
    name = "libblas.so.3-" + triplet
    try:
        out = subprocess.run(["update-alternatives", "--query", name], capture_output=True,
                             text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None

    def field(key):
        m = re.search(r"^%s: (.*)$" % key, out, re.M)
        return m.group(1) if m else None

    choices = re.findall(r"^Alternative: (.*)\nPriority: (-?\d+)", out, re.M)
    return {"name": name, "status": field("Status"), "value": field("Value"),
            "link": field("Link"), "choices": [(p, int(n)) for p, n in choices]}


def machine_lines(args, alt, torch_extra):
    """The environment of the run, one line each, for the header and for --markdown."""
    model, flags = "unknown CPU", set()
    try:
        info = open("/proc/cpuinfo").read()
        model = re.search(r"^model name\s*:\s*(.*)$", info, re.M).group(1).strip()
        flags = set(re.search(r"^flags\s*:\s*(.*)$", info, re.M).group(1).split())
    except (OSError, AttributeError):
        pass
    have = [f for f in CPU_FLAGS if f in flags]
    lack = [f for f in CPU_FLAGS if f not in flags]
    lines = ["CPU: %s, %d cores (%d usable here); has %s; lacks %s" % (
        model, os.cpu_count(), len(os.sched_getaffinity(0)), " ".join(have) or "none",
        " ".join(lack) or "none"),
        "Linux %s, Python %s; load average %.1f at the start" % (
            platform.release(), platform.python_version(), os.getloadavg()[0])]
    if alt:
        choices = ", ".join("%s (priority %d)" % c for c in alt["choices"])
        lines.append("libblas.so.3 alternative (%s): %s mode, selects %s; choices %s" % (
            alt["name"], alt["status"], alt["value"], choices))
    else:
        lines.append("libblas.so.3 alternative: none (no update-alternatives entry here)")
    was = ", ".join("%s=%s" % (k, os.environ[k]) for k in OPENBLAS_VARS if k in os.environ)
    lines.append("variables: %s removed for every run (they were: %s); OMP_NUM_THREADS=%d, "
                 "kiln --threads %d, torch.set_num_threads(%d)" % (
                     " and ".join(OPENBLAS_VARS), was or "not set", args.threads,
                     args.threads, args.threads))
    if torch_extra:
        lines.append("PyTorch runs also get: " + " ".join(
            "%s=%s" % kv for kv in sorted(torch_extra.items())))
    return lines


def child_of(pid):
    """The first child of pid (the program /usr/bin/time runs), or None yet."""
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            kids = f.read().split()
        return int(kids[0]) if kids else None
    except OSError:  # a kernel without CONFIG_PROC_CHILDREN: look for the parent link
        pass
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/stat" % d) as f:
                stat = f.read()
            if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
                return int(d)
        except (OSError, ValueError):
            continue
    return None


def watch_maps(proc, wrapped):
    """Until proc exits, the union of the BLAS-family, OpenMP and oneDNN files mapped into
    the program it runs (read from /proc/PID/maps). Reads start at once, so a program that
    runs a fraction of a second is still seen (one gone within milliseconds is not), and
    thin out to one a second, which costs the program nothing measurable. A read made
    before /usr/bin/time's child has exec'd sees /usr/bin/time, which maps none of these,
    so the union stays right."""
    seen, pid, delay = set(), None if wrapped else proc.pid, 0.005
    while proc.poll() is None:
        if pid is None:
            pid = child_of(proc.pid)
        if pid is not None:
            seen |= blas_probe.mapped_files(pid)
        time.sleep(delay)
        delay = min(2 * delay, 1.0)
    return seen


def run_timed(cmd, env, log_path):
    """Run cmd under /usr/bin/time -v, watching what it maps; returns (returncode, output,
    peak RSS MiB or None, set of BLAS-family/OpenMP/oneDNN files it mapped)."""
    wrapped = os.path.exists("/usr/bin/time")
    full = ["/usr/bin/time", "-v"] + cmd if wrapped else cmd
    with tempfile.TemporaryFile("w+") as so, tempfile.TemporaryFile("w+") as se:
        p = subprocess.Popen(full, env=env, stdout=so, stderr=se, text=True)
        mapped = watch_maps(p, wrapped)
        so.seek(0)
        se.seek(0)
        out = so.read() + se.read()
    with open(log_path, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n" + out)
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", out)
    return p.returncode, out, (int(m.group(1)) / 1024.0 if m else None), mapped


def kiln_peak(kiln, env, work, tag, dtype="fp32"):
    """`kiln bench peak [--dtype D]` -> (GFLOP/s, its report line, files mapped) or (None,
    why, set()). A kiln without --dtype (older than its bf16 GEMM) says so in `why`."""
    if not os.access(kiln, os.X_OK):
        return None, "no kiln binary at %s" % kiln, set()
    cmd = [kiln, "bench", "peak"] + (["--dtype", dtype] if dtype != "fp32" else [])
    log = os.path.join(work, "peak_%s%s.log" % (tag, "" if dtype == "fp32" else "_" + dtype))
    rc, out, _, mapped = run_timed(cmd, env, log)
    lines = re.findall(r"^(.*?([0-9.]+)\s*GFLOP/s.*)$", out, re.M)
    # the line that names the dtype asked for, else the first with a rate
    m = next((x for x in lines if dtype in x[0]), lines[0] if lines else None)
    if rc != 0 or not m:
        if dtype != "fp32" and re.search(r"unknown flag|unrecognized|invalid", out):
            return None, "`%s` is not in this kiln build (see %s)" % (" ".join(
                ["kiln"] + cmd[1:]), log), mapped
        return None, "%s failed (rc %d, see %s)" % (" ".join(["kiln"] + cmd[1:]), rc, log), mapped
    return float(m[1]), m[0].strip(), mapped


def find_data(args, kiln, env):
    if args.data:
        return args.data, None
    shards = sorted(glob.glob(os.path.join(ROOT, "data", "brown", "train_*.bin")))
    if shards:
        return os.path.join(ROOT, "data", "brown", "train_*.bin"), None
    out_dir = os.path.join(args.work, "data")
    rc, _, _, _ = run_timed([kiln, "prepare", "--out", out_dir], env,
                            os.path.join(args.work, "prepare.log"))
    shards = sorted(glob.glob(os.path.join(out_dir, "train_*.bin")))
    if rc == 0 and shards:
        return os.path.join(out_dir, "train_*.bin"), None
    return None, ("no token shards: pass --data, or run `kiln prepare` (see %s/prepare.log)"
                  % args.work)


def run_kiln(args, kiln, env, data, peak, precision="fp32"):
    """One kiln row: `kiln train` at --precision `precision` (the flag is left out for fp32,
    so that a kiln older than mixed precision still gives its fp32 row)."""
    tag = "" if precision == "fp32" else "_" + precision
    metrics = os.path.join(args.work, "kiln_metrics%s.jsonl" % tag)
    log = os.path.join(args.work, "kiln_train%s.log" % tag)
    if os.path.exists(metrics):
        os.remove(metrics)
    n = args.warmup + args.steps
    cmd = [kiln, "train", "--model", args.model, "--batch", str(args.batch), "--seq",
           str(args.seq), "--steps", str(n), "--data", data, "--metrics", metrics,
           "--threads", str(args.threads), "--save", "", "--eval-every", "0"]
    if precision != "fp32":
        cmd += ["--precision", precision]
    if peak:  # the same denominator for kiln's own MFU figure
        cmd += ["--peak-gflops", "%.3f" % peak]
    rc, out, rss, mapped = run_timed(cmd, env, log)
    if rc != 0 or not os.path.exists(metrics):
        return None, "kiln train --precision %s failed (rc %d, see %s)" % (precision, rc, log)
    steps = [json.loads(line) for line in open(metrics) if line.strip().startswith("{")]
    steps = [s for s in steps if "ms" in s]
    timed = steps[args.warmup:]
    if not timed:
        return None, "kiln wrote %d step records, expected %d" % (len(steps), n)
    ms = [s["ms"] for s in timed]
    return {"ms": sum(ms) / len(ms), "ms_min": min(ms), "ms_max": max(ms), "rss": rss,
            "own_mfu": sum(s.get("mfu", 0.0) for s in timed) / len(timed),
            "losses": [s.get("loss") for s in steps], "mapped": mapped, "env": env,
            "binary": kiln, "precision": precision}, None


def run_torch(args, env, dtype, peak):
    cmd = [TORCH_PY, os.path.join(ROOT, "bench", "torch_gpt.py"), "--model", args.model,
           "--batch", str(args.batch), "--seq", str(args.seq), "--warmup", str(args.warmup),
           "--steps", str(args.steps), "--threads", str(args.threads), "--dtype", dtype,
           "--gemm-seconds", str(args.gemm_seconds), "--json"]
    if peak:
        cmd += ["--peak-gflops", "%.3f" % peak]
    rc, out, rss, mapped = run_timed(cmd, env, os.path.join(args.work, "torch_%s.log" % dtype))
    lines = [x for x in out.splitlines() if x.startswith("{")]
    if rc != 0 or not lines:
        return None, "PyTorch %s failed (rc %d, see %s/torch_%s.log)" % (dtype, rc, args.work,
                                                                          dtype)
    s = json.loads(lines[-1])
    rates = s.get("gemm", {})
    return {"ms": s["ms_per_step"], "ms_min": s["ms_min"], "ms_max": s["ms_max"],
            "rss": rss if rss else s["peak_rss_mb"], "losses": s["losses"], "mapped": mapped,
            "env": env, "own_blas": s.get("blas"), "torch": s.get("torch"), "rates": rates,
            "gemm": max(rates["fp32"].values()) if rates.get("fp32") else None}, None


def peer_blas(r):
    """What BLAS a peer's process used: {sgemm, label, openblas: [file, build, kernel] or
    None, mapped: {kind: paths}}. PyTorch's rows come with their own report; for kiln's,
    the sgemm_ provider is the one BLAS file its process mapped (or, of several, the one
    LD_PRELOAD put first, which the dynamic linker searches first)."""
    mapped = set(r.get("mapped") or ())
    own = r.get("own_blas")
    if own:
        for paths in own["mapped"].values():
            mapped.update(paths)
        return dict(own, mapped=blas_probe.by_kind(mapped))
    blas = blas_probe.by_kind(mapped).get("blas", [])
    preload = [os.path.realpath(p) for p in re.split(r"[:\s]+", r["env"].get("LD_PRELOAD", ""))
               if p]
    first = [p for p in preload if p in blas]
    sgemm = first[0] if first else (blas[0] if len(blas) == 1 else None)
    ob_file = blas_probe.openblas_for(sgemm, mapped)
    ob = blas_probe.openblas_config_in(ob_file, r["env"]) if ob_file else None
    label = blas_probe.label(sgemm, ob) if sgemm else (
        "several: " + ", ".join(map(os.path.basename, blas)) if blas else
        "none seen (it exited before a read)")
    return {"sgemm": sgemm, "label": label, "openblas": [ob_file, ob[0], ob[1]] if ob else None,
            "mapped": blas_probe.by_kind(mapped)}


# (first header line, second header line); numbers are right-aligned in text output
COLUMNS = [("system", ""), ("ms/step", "(mean)"), ("best ms", ""), ("tokens/s", "(mean)"),
           ("MFU", "(mean)"), ("peak RSS", ""), ("kiln x", "(mean)"), ("kiln x", "(best)"),
           ("kiln", "memory"), ("BLAS loaded", "(sgemm_)"), ("GEMM fp32", "GFLOP/s")]
LEFT_NAMES = ("system", "BLAS loaded")


def row_dtype(name):
    """The dtype a row name ends in: kiln bf16 -> bf16, PyTorch fp32 -> fp32."""
    return name.split()[-1]


def kiln_rows(rows):
    return [n for n in rows if n.startswith("kiln ")]


def reduced_precisions(rows):
    """The kiln precisions other than fp32 in the table, each of which gets a ratio column."""
    return [row_dtype(n) for n in kiln_rows(rows) if row_dtype(n) != "fp32"]


def columns(reduced):
    """The table's header: COLUMNS, with "kiln P x" (mean, best) for each reduced P before
    the BLAS columns."""
    extra = [(("kiln %s x" % p), part) for p in reduced for part in ("(mean)", "(best)")]
    return COLUMNS[:9] + extra + COLUMNS[9:]


def mfu_peak(dtype, peaks):
    """MFU's denominator for a row of this dtype: the bf16 GEMM peak for bf16 rows where
    kiln measured one, else the fp32 peak."""
    return peaks.get(dtype) or peaks.get("fp32")


def ratio(a, b):
    return "%.2f" % (a / b) if a and b else "-"


def table_rows(rows, tokens, flops_step, peaks, ref, threshold):
    """The table's cells, one list of strings per system."""
    kiln = rows.get("kiln fp32")
    reduced = reduced_precisions(rows)
    width = len(columns(reduced))
    out = []
    for name, r in rows.items():
        if name == LLMC_CITED:
            # Measured earlier on this machine class; only kiln's ratio is computed here.
            speed = "%.2f-%.2f" % (4000 / kiln["ms"], 4900 / kiln["ms"]) if kiln else "-"
            best = "%.2f-%.2f" % (4000 / kiln["ms_min"], 4900 / kiln["ms_min"]) if kiln else "-"
            out.append([name, "4000-4900", "-", "52-63", "-", "-", speed, best, "-"] +
                       ["-"] * (2 * len(reduced)) + ["-", "-"])
            continue
        if r is None:
            out.append([name, "failed"] + ["-"] * (width - 2))
            continue
        tps = tokens / r["ms"] * 1e3
        peak = mfu_peak(row_dtype(name), peaks)
        mfu = "%.1f%%" % (100 * flops_step / (r["ms"] / 1e3) / (peak * 1e9)) if peak else "-"
        peer = kiln is not None and not name.startswith("kiln ")
        speed = ratio(r["ms"], kiln["ms"]) if peer else "-"
        best = ratio(r["ms_min"], kiln["ms_min"]) if peer else "-"
        mem = ratio(kiln["rss"], r["rss"]) if peer else "-"
        rss = "%.0f MiB" % r["rss"] if r["rss"] else "-"
        # kiln P x: this row's step time over kiln P's, for kiln fp32 and PyTorch P
        against = []
        for p in reduced:
            low = rows.get("kiln " + p)
            mine = low and name in ("kiln fp32", "PyTorch " + p)
            against += [ratio(r["ms"], low["ms"]) if mine else "-",
                        ratio(r["ms_min"], low["ms_min"]) if mine else "-"]
        gemm = "-"
        if r.get("gemm"):
            gemm = "%.1f" % r["gemm"]
            if ref:
                gemm += " (%.0f%%)%s" % (100 * r["gemm"] / ref,
                                         " !" if r["gemm"] < threshold * ref else "")
        out.append([name, "%.1f" % r["ms"], "%.1f" % r["ms_min"], "%.1f" % tps, mfu, rss, speed,
                    best, mem] + against +
                   [r["blas"]["label"] if r.get("blas") else "-", gemm])
    return out


def print_text_table(cells, cols, left_names=LEFT_NAMES):
    """cols: (first, second header line) pairs; columns named in left_names are
    left-aligned, the rest (numbers) right-aligned."""
    left = {i for i, c in enumerate(cols) if c[0] in left_names}
    lines = [[h[0] for h in cols], [h[1] for h in cols]] + cells
    widths = [max(len(line[i]) for line in lines) for i in range(len(cols))]
    for line in lines:
        print("  ".join(c.ljust(w) if i in left else c.rjust(w)
                        for i, (c, w) in enumerate(zip(line, widths))).rstrip())


def print_markdown_table(cells, cols):
    print("| " + " | ".join((a + " " + b).strip() for a, b in cols) + " |")
    print("|" + " --- |" * len(cols))
    for line in cells:
        print("| " + " | ".join(line) + " |")


def blas_lines(rows, peaks):
    """One line per peer: the BLAS it used, what else it mapped, its GEMM rates. The kiln
    rows are one binary in one environment, so they share a line."""
    lines = []
    kilns = [n for n in kiln_rows(rows) if rows[n] and rows[n].get("blas")]
    for name, r in rows.items():
        if not r or not r.get("blas") or (name in kilns and name != kilns[0]):
            continue
        b = r["blas"]
        label = ", ".join(kilns) if name in kilns else name
        words = ["%s: sgemm_ from %s" % (label, b["sgemm"] or b["label"])]
        if b["openblas"]:
            words.append("(%s; kernel %s)" % (b["openblas"][1], b["openblas"][2]))
        others = [p for k in ("blas", "lapack") for p in b["mapped"].get(k, [])
                  if p != b["sgemm"]]
        if others:
            words.append("; also mapped " + ", ".join(others))
        for kind, what in (("openmp", "OpenMP"), ("onednn", "oneDNN")):
            if b["mapped"].get(kind):
                words.append("; %s %s" % (what, ", ".join(b["mapped"][kind])))
        if r.get("rates"):
            for mode, rates in r["rates"].items():
                words.append("; GEMM %s%s GFLOP/s: %s" % (
                    mode, " under autocast" if mode == "bf16" else "",
                    ", ".join("%s %.1f" % kv for kv in rates.items())))
        elif r.get("gemm"):
            words.append("; GEMM fp32: `kiln bench peak`, the better of start and end")
            if peaks.get("bf16"):
                words.append("; GEMM bf16 %.1f GFLOP/s: `kiln bench peak --dtype bf16`, the "
                             "better of start and end" % peaks["bf16"])
        lines.append(" ".join(words).replace(" ;", ";"))
    torch_cfg = next((r["torch"] for r in rows.values() if r and r.get("torch")), None)
    if torch_cfg:
        t = torch_cfg
        lines.append("PyTorch %s: BLAS_INFO=%s, LAPACK_INFO=%s, USE_MKLDNN=%s (oneDNN %s, %s), "
                     "MKL %s, OpenMP %s, CPU capability %s, %d threads" % (
                         t["version"], t["blas_info"], t["lapack_info"], t["use_mkldnn"],
                         t["onednn"], "usable" if t["mkldnn_available"] else "not usable",
                         "present" if t["mkl_available"] else "absent", t["openmp"],
                         t["cpu_capability"], t["threads"]))
    return lines


def fast_blas(alt, rows):
    """The libblas.so.3 to recommend: the alternative in the folder of kiln's OpenBLAS,
    else the OpenMP OpenBLAS one, else the highest priority; without alternatives, the
    OpenBLAS kiln loaded (LD_PRELOAD of libopenblas.so.0 serves sgemm_ just as well)."""
    kiln = next((r for n, r in rows.items() if n.startswith("kiln ") and r), None)
    kiln_dir = os.path.dirname(kiln["blas"]["sgemm"]) if kiln and kiln.get("blas") and \
        kiln["blas"]["sgemm"] else None
    choices = [p for p, _ in sorted(alt["choices"], key=lambda c: -c[1])] if alt else []
    for pick in ([c for c in choices if os.path.dirname(os.path.realpath(c)) == kiln_dir],
                 [c for c in choices if "openblas-openmp" in c], choices,
                 [kiln["blas"]["sgemm"]] if kiln_dir else []):
        if pick:
            return pick[0]
    return None


def hint_lines(name, r, ref, threshold, fast, alt):
    """Why a flagged peer is slow and how to give it the fast BLAS."""
    b = r["blas"]
    lines = ["! %s: fp32 GEMM %.1f GFLOP/s is %.0f%% of %.1f (below %.0f%%); its sgemm_ comes "
             "from %s (%s)." % (name, r["gemm"], 100 * r["gemm"] / ref, ref, 100 * threshold,
                                b["sgemm"], b["label"])]
    same = fast and b["sgemm"] and \
        os.path.dirname(os.path.realpath(fast)) == os.path.dirname(b["sgemm"])
    if same or not fast:
        lines.append("  That is already the fast BLAS here: a low rate from it means busy cores "
                     "or fewer threads; rerun on an idle machine.")
        return lines
    if name.startswith("kiln"):
        lines.append("  kiln links libopenblas.so.0: install the OpenMP OpenBLAS "
                     "(libopenblas-openmp-dev, as scripts/setup.sh does), rebuild, and check "
                     "`ldd %s`." % os.path.relpath(r.get("binary", "build/kiln"), ROOT))
        return lines
    lines.append("  To give it the fast BLAS (%s):" % fast)
    sudo = "sudo " if os.geteuid() != 0 else ""
    if alt and alt["value"] != fast:
        lines.append("    every program (the Debian alternative, now %s -> %s):" % (
            alt["status"], alt["value"]))
        lines.append("      %supdate-alternatives --set %s %s" % (sudo, alt["name"], fast))
    elif alt:
        over = ["%s=%s" % (k, r["env"][k]) for k in ("LD_LIBRARY_PATH", "LD_PRELOAD")
                if r["env"].get(k)]
        lines.append("    the libblas.so.3 alternative already selects it, so this process's "
                     "environment overrides it (%s): drop that, or" % (
                         ", ".join(over) or "look at how Python was started"))
    lines.append("    this process only: LD_PRELOAD=%s %s bench/torch_gpt.py ..." % (
        fast, TORCH_PY))
    lines.append("      (in this script: --torch-env LD_PRELOAD=%s)" % fast)
    return lines


def parse_env_pairs(pairs):
    out = {}
    for p in pairs:
        if "=" not in p:
            sys.exit("--torch-env wants VAR=VALUE, not %r" % p)
        k, v = p.split("=", 1)
        out[k] = v
    return out


def parse_precisions(text):
    out = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in out if p not in PRECISIONS]
    if bad or not out:
        sys.exit("--kiln-precision wants a comma-separated list of %s, not %r" % (
            ", ".join(PRECISIONS), text))
    return list(dict.fromkeys(out))


def parse_args():
    ap = argparse.ArgumentParser(description="kiln vs PyTorch training-step benchmark")
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"))
    ap.add_argument("--data", help="kiln's training shards (file, folder or glob)")
    ap.add_argument("--model", default="gpt2-124m", choices=model_presets.NAMES,
                    help="a GPT-2 or Llama preset of kiln's (default gpt2-124m)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kiln-precision", default="fp32,bf16", metavar="P[,P...]",
                    help="kiln rows, one per precision: fp32, bf16, fp16 (default fp32,bf16)")
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "bench_train"),
                    help="folder for logs, metrics and prepared data")
    ap.add_argument("--only", choices=["kiln", "torch"], help="run one side only")
    ap.add_argument("--flag-below", type=float, default=0.6, metavar="FRACTION",
                    help="flag a peer whose fp32 GEMM rate is below this fraction of the "
                    "best one measured in the run (default 0.6)")
    ap.add_argument("--gemm-seconds", type=float, default=0.25,
                    help="PyTorch's GEMM probe: seconds per shape, before and after its "
                    "steps (0: skip it)")
    ap.add_argument("--torch-env", action="append", default=[], metavar="VAR=VALUE",
                    help="set VAR in the PyTorch runs' environment, e.g. LD_PRELOAD=<a "
                    "libblas.so.3> (repeatable)")
    ap.add_argument("--peer-malloc", choices=PEER_MALLOC_CHOICES, default="tuned",
                    help="PyTorch's allocator: tuned (default; glibc kept from returning "
                    "memory to the kernel, see PEER_MALLOC) or glibc-default")
    ap.add_argument("--markdown", action="store_true",
                    help="also print the environment and the table as Markdown for README.md")
    args = ap.parse_args()
    args.kiln_precision = parse_precisions(args.kiln_precision)
    return args


def measure_peaks(args, env, tag, want_bf16, peaks, notes):
    """`kiln bench peak` (and with want_bf16 `--dtype bf16`), keeping in peaks[dtype] the
    better of this run and any earlier one; returns the files the fp32 run mapped."""
    dtypes = ("fp32", "bf16") if want_bf16 else ("fp32",)
    mapped = set()
    for dtype in dtypes:
        if dtype == "bf16" and notes.get("bf16_missing"):
            continue  # not in this build: once is enough to find out
        g, note, m = kiln_peak(args.kiln, env, args.work, tag, dtype)
        print("peak %s (%s): %s" % (dtype, tag, note))
        sys.stdout.flush()
        if dtype == "fp32":
            mapped = m
        if g:
            peaks[dtype] = max(peaks.get(dtype) or 0.0, g)
        elif dtype == "bf16":
            notes["bf16_missing"] = note
    return mapped


def measure(args, env, torch_env):
    """Run every system; returns (rows by name, MFU's peaks by dtype, a line about them)."""
    want_bf16 = "bf16" in args.kiln_precision or args.only != "kiln"
    peaks, notes = {}, {}
    peak_mapped = measure_peaks(args, env, "start", want_bf16, peaks, notes)
    start = dict(peaks)  # kiln's own MFU figure uses the start peaks
    rows = {}
    if args.only != "torch":
        if os.access(args.kiln, os.X_OK):
            data, err = find_data(args, args.kiln, env)
        else:
            data, err = None, "no kiln binary at %s (build it, or pass --kiln)" % args.kiln
        if err:
            print("kiln: " + err)
        for p in args.kiln_precision:
            r, e = run_kiln(args, args.kiln, env, data, mfu_peak(p, start), p) if data \
                else (None, None)
            rows["kiln " + p] = r
            if e:
                print("kiln %s: %s" % (p, e))
            elif r:
                print("kiln %s: own MFU figure %.1f%% (metrics file)" % (p, 100 * r["own_mfu"]))
            sys.stdout.flush()
    if args.only != "kiln":
        for dtype in ("fp32", "bf16"):
            r, err = run_torch(args, torch_env, dtype, mfu_peak(dtype, start))
            rows["PyTorch " + dtype] = r
            if err:
                print(err)
            sys.stdout.flush()
    # A peak measured while something else ran is too low, so it is measured again at the
    # end and the better of the two is MFU's denominator.
    mapped2 = measure_peaks(args, env, "end", want_bf16, peaks, notes)
    peak = peaks.get("fp32")
    if peak:
        peak_note = "MFU against %.1f GFLOP/s, the better of two `kiln bench peak` runs " \
            "(start and end)" % peak
        if peaks.get("bf16"):
            peak_note += "; bf16 rows against the bf16 GEMM peak %.1f GFLOP/s, the better of " \
                "two `kiln bench peak --dtype bf16` runs" % peaks["bf16"]
        elif want_bf16:
            peak_note += "; bf16 rows against that fp32 peak too, as no bf16 GEMM peak was " \
                "measured (%s)" % notes.get("bf16_missing", "?")
        if "fp16" in args.kiln_precision and args.only != "torch":
            peak_note += "; fp16 rows against the fp32 peak"
    else:
        peak_note = "no peak measured: MFU not reported"
    print(peak_note)
    for name in kiln_rows(rows):
        if rows[name]:
            # `kiln bench peak` is the same binary in the same environment: what it mapped
            # counts too, should `kiln train` have been gone before a read
            rows[name]["mapped"] |= peak_mapped | mapped2
            rows[name]["gemm"] = peak
    for r in rows.values():
        if r:
            r["blas"] = peer_blas(r)
    if model_presets.family(args.model) == "gpt2":  # llm.c trains GPT-2 only
        rows[LLMC_CITED] = None
    return rows, peaks, peak_note


def report(args, rows, peaks, header, alt, tokens, flops_step):
    """The table, the BLAS of each peer, the flags and their hints; with --markdown all of
    it again (and the header lines) as Markdown."""
    # The reference for the flag is the best fp32 GEMM rate any peer reached in this run:
    # kiln's peak, unless a peer did better (then it is kiln's BLAS that is suspect).
    peak = peaks.get("fp32")
    ref = max([peak or 0.0] + [r["gemm"] for r in rows.values() if r and r.get("gemm")]) or None
    cols = columns(reduced_precisions(rows))
    cells = table_rows(rows, tokens, flops_step, peaks, ref, args.flag_below)
    print()
    print_text_table(cells, cols)
    over = [n for n, r in rows.items() if r and mfu_peak(row_dtype(n), peaks) and
            flops_step / (r["ms"] / 1e3) > mfu_peak(row_dtype(n), peaks) * 1e9]
    if over:
        print("\nWARNING: an MFU above 100%% (%s) means the peak was measured while the machine "
              "was busy; rerun on an idle machine." % ", ".join(over))
    notes = ["kiln x = peer ms/step / kiln fp32 ms/step (above 1: kiln is faster), of the mean "
             "and of the best timed step;", "kiln memory = kiln fp32 peak RSS / peer peak RSS "
             "(below 1: kiln uses less)."]
    for p in reduced_precisions(rows):
        torch_p = ("PyTorch " + p) in rows
        notes.append("kiln %s x = ms/step of kiln fp32 (its speed-up over fp32)%s / kiln %s "
                     "ms/step." % (p, " and of PyTorch %s (kiln's speed-up over it)" % p
                                   if torch_p else "", p))
    notes.append("MFU: " + ("fp32 rows against the fp32 GEMM peak; bf16 rows against the bf16 "
                            "GEMM peak" if peaks.get("bf16") else
                            "every row against the fp32 GEMM peak (no bf16 GEMM peak in this "
                            "run: `kiln bench peak --dtype bf16` failed or is missing)") + ".")
    if LLMC_CITED in rows:
        notes.append("llm.c: figures measured earlier on this machine class (gpt2-124m, B=4, "
                     "T=64, 2 threads), not in this run.")
    print("\n" + "\n".join(notes))

    blas = blas_lines(rows, peaks)
    # kiln's rows share one binary, BLAS and rate: the first speaks for all of them
    first_kiln = next((n for n in kiln_rows(rows) if rows[n]), None)
    flagged = [(n, r) for n, r in rows.items()
               if r and r.get("gemm") and ref and r["gemm"] < args.flag_below * ref and
               (not n.startswith("kiln ") or n == first_kiln)]
    rule = ("GEMM fp32: kiln's is `kiln bench peak`, PyTorch's the best of the model's products "
            "timed in its process; (%%) is of %s, the best rate in this run, and ! marks a peer "
            "below %.0f%% of it.%s" % ("%.1f GFLOP/s" % ref if ref else "nothing (no rate)",
                                       100 * args.flag_below,
                                       "" if flagged else " No peer is flagged."))
    fast = fast_blas(alt, rows)
    hints = [h for n, r in flagged for h in hint_lines(n, r, ref, args.flag_below, fast, alt)]
    print("\nBLAS per peer (the files each process mapped, read from /proc/PID/maps as it ran):")
    for line in blas:
        print("  " + line)
    print(rule)
    for line in hints:
        print(line)
    if args.markdown:
        print("\nMarkdown for README.md:\n")
        for line in header + blas:
            print("- " + line)
        print()
        print_markdown_table(cells, cols)
        print("\n" + " ".join(notes) + "\n\n" + rule)
        if hints:
            print("\n```\n" + "\n".join(hints) + "\n```")


def main():
    args = parse_args()
    os.makedirs(args.work, exist_ok=True)
    torch_extra = parse_env_pairs(args.torch_env)
    env = bench_env(args.threads)
    torch_env = peer_env(args.threads, args.peer_malloc, torch_extra)
    alt = blas_alternative(multiarch())
    header = machine_lines(args, alt, torch_extra) + [peer_malloc_line(args.peer_malloc,
                                                                        torch_extra)]
    print("environment:")
    for line in header:
        print("  " + line)
    tokens = args.batch * args.seq
    flops_step = model_presets.flops_per_token(args.model, args.seq) * tokens
    model_line = "model %s (%s), B=%d T=%d: %.1f GFLOP per step; %d warm-up + %d timed " \
        "steps; kiln precisions %s" % (
            args.model, model_presets.describe(args.model), args.batch, args.seq,
            flops_step / 1e9, args.warmup, args.steps, ", ".join(args.kiln_precision))
    print(model_line)
    rows, peaks, peak_note = measure(args, env, torch_env)
    report(args, rows, peaks, header + [model_line, peak_note], alt, tokens, flops_step)


if __name__ == "__main__":
    main()
