#!/bin/sh
# GPT-2 and Llama shapes of about the same parameter count (d6 and llama-d6: 6 layers of 192
# channels; the Llama with 3 key/value heads for 6 query heads and a SwiGLU MLP of 512) trained
# on the Brown corpus for the same tokens, seed and schedule; then one kiln report page with
# both runs overlaid and its plots as PNG, and a table of their losses and step times.
#
#   sh bench/family_curves.sh [KILN] [OUT]     (defaults: build/kiln, build/family_curves)
#   KILN_FAMILY_STEPS=N   optimizer steps (default 300)   KILN_FAMILY_THREADS=N (default 2)
#   KILN_FAMILY_PRECISION=fp32|bf16|fp16 (default fp32)
#
# The data is data/brown (kiln prepare --out data/brown, as scripts/demo.sh makes it).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
kiln=${1:-$root/build/kiln}
out=${2:-$root/build/family_curves}
steps=${KILN_FAMILY_STEPS:-300}
threads=${KILN_FAMILY_THREADS:-2}
precision=${KILN_FAMILY_PRECISION:-fp32}
data=$root/data/brown
[ -f "$data/train_000.bin" ] || "$kiln" prepare --out "$data"
mkdir -p "$out"
for model in d6 llama-d6; do
    "$kiln" train --model "$model" --data "$data/train_*.bin" --val-data "$data/val_*.bin" \
        --batch 8 --seq 128 --steps "$steps" --lr 1e-3 --warmup 20 --eval-every 50 \
        --eval-batches 10 --threads "$threads" --precision "$precision" --seed 1 \
        --metrics "$out/$model.jsonl" \
        --save "$out/$model.safetensors" >"$out/$model.log"
done
"$kiln" report "$out/d6.jsonl" "$out/llama-d6.jsonl" --out "$out/report.html" --png "$out/png" \
    --title "GPT-2 (d6) and Llama (llama-d6) on the Brown corpus"
# the table: parameters, final training loss, best validation loss, median step time
printf '| model | parameters | final loss | best validation loss | median step (ms) |\n'
printf '| --- | --- | --- | --- | --- |\n'
for model in d6 llama-d6; do
    params=$(sed -n 's/.*: \([0-9.]*M\) parameters.*/\1/p' "$out/$model.log" | head -n 1)
    python3 - "$out/$model.jsonl" "$model" "$params" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
steps = [r for r in rows if "loss" in r and "ms" in r]
vals = [r["val_loss"] for r in rows if "val_loss" in r]
print("| %s | %s | %.4f | %.4f | %.1f |" % (sys.argv[2], sys.argv[3], steps[-1]["loss"],
      min(vals) if vals else float("nan"), statistics.median(r["ms"] for r in steps)))
EOF
done
echo "report: $out/report.html, plots: $out/png/"
