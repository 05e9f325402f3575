#!/usr/bin/env bash
# kiln's main job on its default data: install what is missing and build, turn the Brown
# corpus into GPT-2 token shards, train a small model for about three minutes, draw its curves
# (out/brown_report.html), then sample.
#   KILN_DEMO_STEPS=N    optimizer steps (default 300)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/setup.sh
kiln=build/kiln

[ -f data/brown/train_000.bin ] || $kiln prepare --out data/brown
$kiln train --model d6 --data 'data/brown/train_*.bin' --val-data 'data/brown/val_*.bin' \
  --batch 8 --seq 128 --steps "${KILN_DEMO_STEPS:-300}" --lr 1e-3 --warmup 20 --eval-every 50 \
  --eval-batches 10 --metrics out/brown_metrics.jsonl --save out/brown.safetensors
$kiln report out/brown_metrics.jsonl --out out/brown_report.html --title "kiln demo: d6 on the Brown corpus"
echo "open out/brown_report.html in a browser: the run's curves"
echo
echo "--- sample ---"
$kiln sample --weights out/brown.safetensors --prompt "The jury said" --tokens 120 --temperature 0.8
