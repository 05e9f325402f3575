#!/usr/bin/python3
"""Compare two kiln training runs: their saved weights (safetensors) and per-step losses.

    compare_runs.py A.safetensors B.safetensors A.jsonl B.jsonl TOL [--loss-tol T]

Exits 1 (printing the tensor or step) when any weight differs by more than TOL, or any
step's loss by more than the loss tolerance (default TOL), or the runs have different
tensors or step counts; 0 otherwise, printing the largest differences."""
import json
import struct
import sys

import numpy as np

DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}


def load(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        lo, hi = v["data_offsets"]
        a = np.frombuffer(blob[8 + n + lo:8 + n + hi], dtype=DTYPES[v["dtype"]])
        if v["dtype"] == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        out[name] = a.astype(np.float64)
    return out


def losses(path):
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
        return [r["loss"] for r in rows if "event" not in r]  # events (stragglers) are no steps


def main():
    args = sys.argv[1:]
    loss_tol = None
    if "--loss-tol" in args:
        i = args.index("--loss-tol")
        loss_tol = float(args[i + 1])
        del args[i:i + 2]
    wa, wb, la, lb, tol = args
    tol = float(tol)
    loss_tol = tol if loss_tol is None else loss_tol
    a, b = load(wa), load(wb)
    if sorted(a) != sorted(b):
        print(f"FAIL: the tensors differ: {sorted(set(a) ^ set(b))}")
        return 1
    worst, where = 0.0, ""
    for k in a:
        d = float(np.max(np.abs(a[k] - b[k]))) if a[k].size else 0.0
        if not d <= worst:
            worst, where = d, k
    xa, xb = losses(la), losses(lb)
    if len(xa) != len(xb):
        print(f"FAIL: {len(xa)} steps against {len(xb)}")
        return 1
    dl = [abs(x - y) for x, y in zip(xa, xb)]
    worst_loss = max(dl) if dl else 0.0
    step = dl.index(worst_loss) + 1 if dl else 0
    print(f"largest weight difference {worst:.3g} ({where}); largest loss difference "
          f"{worst_loss:.3g} (step {step}); tolerances {tol:g}, {loss_tol:g}")
    if not worst <= tol:
        print(f"FAIL: weights differ by {worst:.3g} in {where}, above {tol:g}")
        return 1
    if not worst_loss <= loss_tol:
        print(f"FAIL: the loss of step {step} differs by {worst_loss:.3g}, above {loss_tol:g}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
