#!/usr/bin/env python3
"""The watchdog's detection times, measured: an injected hang (from the step that hangs to the
end of the process, or of mpirun), a straggler (from the start of training to rank 0's warning,
in steps and seconds), and what the per-step exchange of compute times costs.

    bench/bench_watchdog.py --kiln build/kiln --data data/brown/train_000.bin [--mpirun mpirun]

Prints a markdown table. Each figure is one run on this machine; the hang's time is the
limit (max(hang factor x median step, --hang-min-s)) plus the watchdog's polling and the exit.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

TINY = "--layers 2 --heads 2 --embd 32 --context 32 --peak-gflops 100 --seq 16 --threads 1"
# a few hundred ms a step on one core: the hang factor, not the minimum, sets the limit
MID = "--layers 4 --heads 4 --embd 256 --context 128 --peak-gflops 100 --seq 128 --batch 8 --threads 1"


def timed_lines(cmd, env, cwd):
    """Runs cmd; returns (status, [(seconds since start, stderr line)], seconds to the end)."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         env=env, cwd=cwd)
    lines = [(time.monotonic() - t0, line.rstrip()) for line in p.stderr]
    rc = p.wait()
    return rc, lines, time.monotonic() - t0


def first(lines, pattern):
    for t, line in lines:
        if re.search(pattern, line):
            return t, line
    return None, None


def hang(args, env, work, shape, extra, np_):
    mpi = [args.mpirun, "--oversubscribe", "--allow-run-as-root", "-np", str(np_)] if np_ > 1 else []
    cmd = mpi + [args.kiln, "train"] + shape.split() + ["--data", args.data, "--steps", "60",
                                                       "--save", "", "--inject-hang",
                                                       "%d:10" % (np_ - 1)] + extra
    rc, lines, end = timed_lines(cmd, env, work)
    t_inj, _ = first(lines, "fault injection")
    t_warn, _ = first(lines, "warning: watchdog")
    _, hung = first(lines, "hung; exiting")
    limit = re.search(r"the limit is ([0-9.]+) s", hung or "")
    return {"status": rc, "detect_s": end - t_inj if t_inj is not None else None,
            "warn_s": t_warn - t_inj if t_warn is not None and t_inj is not None else None,
            "limit_s": float(limit.group(1)) if limit else None}


def straggler(args, env, work, extra):
    m = os.path.join(work, "s.jsonl")
    cmd = [args.mpirun, "--oversubscribe", "--allow-run-as-root", "-np", "2", args.kiln,
           "train"] + TINY.split() + ["--data", args.data, "--steps", "120", "--save", "",
                                      "--metrics", m] + extra
    rc, lines, end = timed_lines(cmd, env, work)
    t_warn, line = first(lines, "is a straggler")
    rows = [json.loads(x) for x in open(m) if x.strip()]
    steps = [r for r in rows if "event" not in r]
    ev = [r for r in rows if r.get("event") == "straggler"]
    comm = [r["comm_ms"] for r in steps[5:]]
    return {"status": rc, "warn_s": t_warn, "line": line,
            "event_step": ev[0]["step"] if ev else None,
            "ratio": ev[0]["ratio"] if ev else None,
            "comm_ms": sorted(comm)[len(comm) // 2] if comm else None}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--mpirun", default=shutil.which("mpirun"))
    a = ap.parse_args()
    a.kiln = os.path.abspath(a.kiln)
    a.data = os.path.abspath(a.data)
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="passive")
    work = tempfile.mkdtemp(prefix="kiln_wd_")
    print("| case | status | warned after | ended after | limit |")
    print("| --- | --- | --- | --- | --- |")
    cases = [("1 process, tiny steps, --hang-min-s 5", TINY + " --batch 4", ["--hang-min-s", "5"], 1),
             ("1 process, steps of a few 100 ms, --hang-min-s 1", MID, ["--hang-min-s", "1"], 1)]
    if a.mpirun:
        cases.append(("2 ranks, rank 1 hangs, --hang-min-s 5", TINY + " --batch 4",
                      ["--hang-min-s", "5"], 2))
    for name, shape, extra, np_ in cases:
        r = hang(a, env, work, shape, extra, np_)
        fmt = lambda v: "%.2f s" % v if v is not None else "-"  # noqa: E731
        print("| hang: %s | %d | %s | %s | %s |" % (name, r["status"], fmt(r["warn_s"]),
                                                   fmt(r["detect_s"]), fmt(r["limit_s"])))
    if not a.mpirun:
        return
    s = straggler(a, env, work, ["--inject-slow", "1:20"])
    on = straggler(a, env, work, [])
    off = straggler(a, env, work, ["--straggler-factor", "0"])
    print()
    print("straggler (2 ranks, rank 1 +20 ms a step, --straggler-window 20): status %d, event at "
          "step %s, ratio %s, warned %.2f s after the start" %
          (s["status"], s["event_step"], s["ratio"], s["warn_s"] or float("nan")))
    print("  " + (s["line"] or "(no warning)"))
    print("median comm ms per step (2 ranks, tiny model): %.3f with the exchange, %.3f without" %
          (off_or(on["comm_ms"]), off_or(off["comm_ms"])))
    shutil.rmtree(work, ignore_errors=True)


def off_or(v):
    return v if v is not None else float("nan")


if __name__ == "__main__":
    sys.exit(main())
