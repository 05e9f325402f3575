#!/bin/sh
# GGUF export against llama.cpp itself (node-llama-cpp 3.22.1's prebuilt llama.cpp, installed
# from the npm registry into deps/llama on first use; skipped, saying why, when node or the
# registry is not there). For a byte-level model and a model with a trained BPE tokenizer,
# each type's file is loaded by llama.cpp and its logits after a prompt are compared with
# kiln's: the largest difference over the largest logit within the type's tolerance (f32
# 5e-4: llama.cpp's CPU GELU reads an f16 table; f16 3e-3, q8_0 3e-2, q4_0 2.5e-1). A matrix written the wrong way round loads without
# complaint and fails here. llama.cpp's tokenization of a text equals kiln's. Bad input: an
# unknown type, a tokenizer of another vocabulary, a folder that cannot be written: an error
# and no file, no partial file.
. "$(dirname "$0")/../cli/lib.sh"

LLAMA=${KILN_LLAMA_DIR:-$SRC/deps/llama}

need_llama() {
    need_fixture
    if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
        echo "SKIP: no node and npm (apt-get install nodejs npm)"
        exit 77
    fi
    # The cases run in parallel: one installs while the others wait on the lock, and a
    # folder is complete only once the marker written after a finished install is there (an
    # install cut short is done again from the start).
    mkdir -p "$LLAMA"
    exec 9>"$LLAMA.lock"
    flock 9
    if [ ! -f "$LLAMA/.installed-3.22.1" ]; then
        rm -rf "$LLAMA/node_modules" "$LLAMA/package-lock.json"
        [ -f "$LLAMA/package.json" ] || echo '{"name":"kiln-llama","private":true}' >"$LLAMA/package.json"
        if ! NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install --no-audit --no-fund --loglevel=error \
            --omit=optional --ignore-scripts --prefix "$LLAMA" node-llama-cpp@3.22.1 \
            @node-llama-cpp/linux-x64@3.22.1 >"$W/npm.log" 2>&1; then
            flock -u 9
            echo "SKIP: cannot install node-llama-cpp from the npm registry: $(tail -n 3 "$W/npm.log")"
            exit 77
        fi
        touch "$LLAMA/.installed-3.22.1"
    fi
    cp "$SRC/tests/compress/llama_logits.mjs" "$LLAMA/.llama_logits.mjs.$$"
    mv -f "$LLAMA/.llama_logits.mjs.$$" "$LLAMA/llama_logits.mjs"
    flock -u 9
    exec 9>&-
}

IDS=84,104,101,32,113,117,105,99,107,32,98,114,111,119,110
KLOGITS=${KILN_LOGITS:-$(dirname "$KILN")/tests/kiln_logits}

# close NAME TOL: kiln's and llama.cpp's logits (kiln.json, NAME.json) agree within TOL of the
# largest logit; prints the figure.
close() {
    /usr/bin/python3 - "$1" "$2" <<'PY' >>"$W/figures"
import json, sys
name, tol = sys.argv[1], float(sys.argv[2])
k = json.load(open("kiln.json"))["logits"]
l = json.load(open(name + ".json"))["logits"]
if len(k) != len(l) or any(x is None for x in l):
    print(f"{name}: {len(l)} logits from llama.cpp, {len(k)} from kiln"); sys.exit(1)
big = max(abs(x) for x in k)
d = max(abs(a - b) for a, b in zip(k, l)) / big
top = max(range(len(k)), key=k.__getitem__) == max(range(len(l)), key=l.__getitem__)
print(f"{name}: max |difference| / max |logit| = {d:.3g} (tolerance {tol:g}); same top token: {top}")
sys.exit(0 if d <= tol else 1)
PY
}

# compare WEIGHTS TOKENIZER LABEL: every type against kiln.
compare() {
    "$KLOGITS" "$1" "$IDS" >kiln.json 2>"$W/stderr"
    check "kiln computed its logits ($3)" test -s kiln.json
    for t in f32:5e-4 f16:3e-3 q8_0:3e-2 q4_0:2.5e-1; do
        ty=${t%%:*} tol=${t#*:}
        run export --weights "$1" --tokenizer "$2" --type "$ty" --out "$3-$ty.gguf"
        expect_ok
        LAST="node llama_logits.mjs $3-$ty.gguf"
        (cd "$LLAMA" && timeout 120 node llama_logits.mjs "$W/$3-$ty.gguf" "$IDS" "$TEXT") \
            >"$3-$ty.json" 2>"$W/stderr"
        check "llama.cpp loads and runs the $ty file ($3)" test -s "$3-$ty.json"
        if close "$3-$ty" "$tol"; then _r=0; else _r=1; fi
        check "llama.cpp's logits are kiln's within $tol: $(tail -n 1 "$W/figures")" test $_r -eq 0
    done
    cat "$W/figures"
}

TEXT="The quick brown fox jumps over the lazy dog."

case_bytes_model() {
    need_llama
    compare "$GOOD" bytes bytes
}

case_bpe_model() {
    need_llama
    run train $TINY --seq 16 --batch 2 --steps 20 --threads 1 --data "$DATA300" --save m300.st
    expect_ok
    compare m300.st "$T300" bpe
    # llama.cpp tokenizes a text as kiln does, with the trained merges from the file
    printf '%s' "$TEXT" >text.txt
    run tokenizer encode --tokenizer "$T300" text.txt
    expect_ok
    kiln_ids=$(tr ' ' ',' <"$W/stdout" | tr -d '\n')
    llama_ids=$(/usr/bin/python3 -c "import json; print(','.join(map(str, json.load(open('bpe-f32.json'))['tokens'])))")
    check "llama.cpp tokenizes the text as kiln does ($kiln_ids | $llama_ids)" test "$kiln_ids" = "$llama_ids"
}

# A model whose layers share blocks: each layer written with its block's weights.
case_shared_blocks() {
    need_llama
    run train --layers 4 --share-layers 2 --heads 2 --embd 32 --context 32 --peak-gflops 100 \
        --seq 16 --batch 2 --steps 20 --threads 1 --data "$DATA" --save sh.st
    expect_ok
    compare sh.st bytes shared
}

case_bad_input() {
    need_fixture
    run export --weights "$GOOD" --type q9 --out x.gguf
    expect_usage
    run export --weights "$GOOD" --tokenizer "$T300" --out x.gguf
    expect_fail
    expect_err "296 tokens" "vocabulary is 256"
    check "no file" test ! -e x.gguf
    : >afile
    run export --weights "$GOOD" --out afile/x.gguf
    expect_fail
    run export --weights "$GOOD" --out x.gguf --type q8_0
    expect_ok
    cp x.gguf keep.gguf
    run export --weights "$GOOD" --tokenizer "$T300" --out x.gguf
    expect_fail
    check "a failed export leaves the file that was there" same_file x.gguf keep.gguf
    no_temp_files .
}

main "$@"
