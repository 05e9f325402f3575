#!/bin/sh
# Post-training quantization end to end on the cli fixture's trained byte-level model ($GOOD):
# kiln compress quantize, then kiln eval and kiln sample on the quantized file. The
# quantized model's logits after a prompt are the dense model's within a tolerance of the
# largest logit (int8 1.5e-2, int4 in groups of 32 1.5e-1; measured 6.0e-3 and 6.6e-2), with
# the same most likely token; its validation loss within 1% (int8) and 5% (int4)
# of the dense model's. The VNNI and the plain kernel give the same text. Bad input (an unknown
# type, a group that does not divide the inputs, a quantized file given to kiln train --init,
# kiln export or kiln compress): an error that says so, and no file written or changed.
. "$(dirname "$0")/../cli/lib.sh"

IDS=84,104,101,32,113,117,105,99,107,32,98,114,111,119,110
KLOGITS=${KILN_LOGITS:-$(dirname "$KILN")/tests/kiln_logits}

# close DENSE QUANT TOL: logits within TOL of the largest dense logit, same top token
close() {
    /usr/bin/python3 - "$1" "$2" "$3" <<'PY' >>"$W/figures"
import json, sys
d = json.load(open(sys.argv[1]))["logits"]
q = json.load(open(sys.argv[2]))["logits"]
tol = float(sys.argv[3])
big = max(abs(x) for x in d)
diff = max(abs(a - b) for a, b in zip(d, q)) / big
top = max(range(len(d)), key=d.__getitem__) == max(range(len(q)), key=q.__getitem__)
print(f"{sys.argv[2]}: max |difference| / max |logit| = {diff:.3g} (tolerance {tol:g}); same top token: {top}")
sys.exit(0 if len(d) == len(q) and diff <= tol and top else 1)
PY
}

# loss_of: the loss kiln eval printed
loss_of() { sed -n 's/.*| loss \([0-9.]*\) |.*/\1/p' "$W/stdout"; }

# within A B FRAC: |A - B| <= FRAC x B
within() { /usr/bin/python3 -c "import sys; a, b, f = map(float, sys.argv[1:]); sys.exit(0 if abs(a - b) <= f * b else 1)" "$1" "$2" "$3"; }

# quantized TYPE TOL LOSS_FRAC [FLAGS]: quantize, compare logits, eval and sample
quantized() {
    _ty=$1 _tol=$2 _lf=$3
    shift 3
    DENSE=${DENSE:-$GOOD}
    run compress quantize --weights "$DENSE" --out "q-$_ty.safetensors" --type "$_ty" "$@"
    expect_ok
    check "the $_ty file is smaller than the dense one" \
        test "$(wc -c <"q-$_ty.safetensors")" -lt "$(wc -c <"$DENSE")"
    "$KLOGITS" "$DENSE" "$IDS" >dense.json 2>"$W/stderr"
    "$KLOGITS" "q-$_ty.safetensors" "$IDS" >"q-$_ty.json" 2>"$W/stderr"
    check "kiln computed both models' logits" test -s dense.json -a -s "q-$_ty.json"
    if close dense.json "q-$_ty.json" "$_tol"; then _r=0; else _r=1; fi
    check "$(tail -n 1 "$W/figures")" test $_r -eq 0
    run eval --weights "$DENSE" --data "$VAL" --seq 32
    expect_ok
    _dense=$(loss_of)
    run eval --weights "q-$_ty.safetensors" --data "$VAL" --seq 32
    expect_ok
    _q=$(loss_of)
    check "$_ty validation loss $_q within $_lf of the dense $_dense" within "$_q" "$_dense" "$_lf"
    run sample --weights "q-$_ty.safetensors" --tokens 40 --prompt "The " --seed 3
    expect_ok
    cp "$W/stdout" vnni.txt
    check "kiln sample wrote text" test "$(wc -c <vnni.txt)" -gt 20
    KILN_INT8_KERNEL=plain run sample --weights "q-$_ty.safetensors" --tokens 40 --prompt "The " --seed 3
    expect_ok
    check "the plain kernel samples the same text" same_file vnni.txt "$W/stdout"
    run sample --weights "q-$_ty.safetensors" --tokens 5 --timing
    expect_ok
    expect_err_re "5 tokens in [0-9.]+ s: [0-9.]+ tokens/s"
    cat "$W/figures"
}

case_int8() {
    need_fixture
    quantized int8 1.5e-2 0.01
}

case_int4() {
    need_fixture
    quantized int4 1.5e-1 0.05 --group 32
}

# A model whose layers share blocks (--share-layers): the file records it, and the layers use
# their block's quantized matrices.
case_shared_blocks() {
    need_fixture
    run train --layers 4 --share-layers 2 --heads 2 --embd 32 --context 32 --peak-gflops 100 \
        --seq 16 --batch 2 --steps 30 --threads 1 --data "$DATA" --save shared.st
    expect_ok
    DENSE=shared.st quantized int8 1.5e-2 0.01
}

case_bad_input() {
    need_fixture
    run compress quantize --weights "$GOOD" --out x.safetensors --type int3
    expect_usage
    expect_err "int3"
    run compress quantize --weights "$GOOD" --out x.safetensors --type int4 --group 24
    expect_fail
    expect_err "group" "divides"
    run compress quantize --weights "$GOOD" --out x.safetensors --type int4 --group 12
    expect_usage
    run compress quantize --weights "$GOOD" --out x.safetensors --type int4 --group 64
    expect_fail
    run compress quantize --weights "$GOOD" --type int8
    expect_usage
    check "no file" test ! -e x.safetensors
    no_temp_files .
    run compress quantize --weights "$GOOD" --out q.safetensors
    expect_ok
    # a quantized file is for eval and sample only
    run train --seq 16 --batch 2 --steps 2 --peak-gflops 100 --data "$DATA" --init q.safetensors \
        --save t.safetensors
    expect_fail
    expect_err "quantized" "eval and kiln sample only"
    check "train wrote nothing" test ! -e t.safetensors
    run export --weights q.safetensors --out q.gguf
    expect_fail
    check "export wrote nothing" test ! -e q.gguf
    cp q.safetensors keep.safetensors
    run compress quantize --weights keep.safetensors --out q.safetensors --type int4
    expect_fail
    expect_err "quantized already"
    check "the file that was there is unchanged" same_file q.safetensors keep.safetensors
    run eval --weights q.safetensors --data "$VAL" --seq 32 --precision bf16
    expect_fail
    expect_err "quantized" "fp32"
    # a damaged quantized file: a scale tensor renamed
    st_edit_header q.safetensors renamed.safetensors 's/"h.1.mlp.c_fc.weight_scale"/"h.1.mlp.c_fc.weight_SCALE"/'
    run eval --weights renamed.safetensors --data "$VAL" --seq 32
    expect_fail
    expect_err "h.1.mlp.c_fc.weight_scale" "missing"
    st_edit_header q.safetensors badtype.safetensors 's/"kiln.quant":"int8"/"kiln.quant":"int3"/'
    run sample --weights badtype.safetensors --tokens 4
    expect_fail
    expect_err "int3"
    no_temp_files .
}

main "$@"
