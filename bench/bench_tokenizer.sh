#!/usr/bin/env bash
# Tokenizer throughput: kiln against tiktoken (npm, WebAssembly), GPT-2's encoding, on the
# Brown corpus with its tags stripped (500 documents), measured in one run; best of N.
#   bench/bench_tokenizer.sh [BUILD_DIR] [REPEAT]      (defaults: build, 5)
# Needs scripts/setup.sh (tiktoken, the corpus, GPT-2's files) and a build with
# bench_tokenizer in it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
repeat=${2:-5}
bin="$build/bench_tokenizer"
[ -x "$bin" ] || { echo "bench_tokenizer: $bin not found (build first)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cores=$(nproc)
export KILN_GPT2_DIR=${KILN_GPT2_DIR:-$root/deps/gpt2}

node "$root/bench/bench_tokenizer_tiktoken.js" --root "$root" --docs "$work/docs" \
  --repeat "$repeat" --threads "$cores" > "$work/results"
OMP_NUM_THREADS=$cores "$bin" --repeat "$repeat" "$work"/docs/*.txt >> "$work/results"

awk -v cores="$cores" -v repeat="$repeat" '
  $1 == "tiktoken" || ($1 == "kiln" && $2 != "load") { mbs[$1 "/" $2] = $6; mb = $4; tok[$1 "/" $2] = $7 }
  $1 == "kiln" && $2 == "load" { load = $5 }
  function row(label, threads, t, k,   r) {
    r = (t != "" && k != "") ? sprintf("%.1fx", k / t) : "-"
    printf "%-44s %7s %14s %10s %14s\n", label, threads, t == "" ? "-" : t, k, r
  }
  END {
    printf "GPT-2 tokenizer, Brown corpus (500 documents, %.2f MB, tags stripped), best of %d\n", mb, repeat
    printf "%-44s %7s %14s %10s %14s\n", "case", "threads", "tiktoken MB/s", "kiln MB/s", "kiln/tiktoken"
    row("one core: documents in turn", 1, mbs["tiktoken/documents-1-thread"], mbs["kiln/documents-1-thread"])
    row("all cores: documents spread over threads", cores, mbs["tiktoken/workers"], mbs["kiln/encode_many"])
    row("all cores: one joined text, cut for threads", cores, "", mbs["kiln/encode_parallel"])
    if (tok["tiktoken/documents-1-thread"] != tok["kiln/documents-1-thread"])
      printf "TOKEN COUNTS DIFFER: tiktoken %s, kiln %s\n", tok["tiktoken/documents-1-thread"], tok["kiln/documents-1-thread"]
    else
      printf "both made %s tokens; kiln loads gpt2 in %.0f ms\n", tok["kiln/documents-1-thread"], load * 1000
    printf "(tiktoken all cores: one node worker thread per core, each with its own encoder)\n"
  }' "$work/results"
