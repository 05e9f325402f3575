#!/bin/sh
# Runs the optimizer reference test: torch.optim writes the expected values, then the C
# driver checks kiln's optimizers against them.
# Usage: run_ref.sh DRIVER OUT_FILE. KILN_PYTHON overrides the Python that has torch.
# Without torch it says so and exits 77, which CTest reports as skipped.
set -u
here=$(dirname "$0")
driver=$1
out=$2
py=${KILN_PYTHON:-/usr/bin/python3}
if ! "$py" -c "import torch" >/dev/null 2>&1; then
    echo "SKIP: $py cannot import torch, which this reference test needs." >&2
    echo "Install PyTorch for it (Debian: apt-get install python3-torch) or set KILN_PYTHON." >&2
    exit 77
fi
"$py" "$here/optim_ref.py" "$out" || exit 1
exec "$driver" "$out"
