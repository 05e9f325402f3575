#!/bin/sh
# Low-rank factorisation end to end on the fixture's trained model ($GOOD): kiln compress
# lowrank writes the factors (and the ranks in the metadata), kiln eval and kiln sample run
# the factored file, kiln train --init fine-tunes it (its loss falls) and saves it factored.
# Bad input (an energy outside (0, 1], a rank below 1, at or past min(in, out) or saving no
# weights, an unknown kind, a factored or quantized input): an error that says so, a non-zero
# status and no file written or changed.
. "$(dirname "$0")/lib.sh"

# meta FILE KEY: the value of a metadata key ("" when absent)
meta() {
    /usr/bin/python3 - "$1" "$2" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
print(json.loads(b[8:8 + n]).get("__metadata__", {}).get(sys.argv[2], ""))
PY
}

# shape FILE TENSOR: "a,b" ("" when absent)
shape() {
    /usr/bin/python3 - "$1" "$2" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
print(",".join(map(str, json.loads(b[8:8 + n]).get(sys.argv[2], {}).get("shape", []))))
PY
}

loss_of() { sed -n 's/.*| loss \([0-9.]*\) |.*/\1/p' "$W/stdout"; }
# less A B: A < B
less() { /usr/bin/python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) < float(sys.argv[2]) else 1)" "$1" "$2"; }

case_compress_eval_sample() {
    need_fixture
    run compress lowrank --weights "$GOOD" --out f.st --energy 0.9 --matrices fc,fcproj
    expect_ok
    expect_out_re 'fc +rank [0-9]+ of 32 +energy kept per layer min 0\.9[0-9]* mean'
    expect_out_re 'fcproj +rank [0-9]+ of 32'
    expect_out_re 'qkv +dense \(32, 96\)'
    expect_out_re 'model +params [0-9]+ -> [0-9]+'
    r=$(meta f.st kiln.rank.fc)
    check "the fc rank ($r) is in the metadata, below 32" test "${r:-0}" -ge 1 -a "${r:-99}" -lt 32
    check "h.1.mlp.c_fc.weight_u is (32, $r)" test "$(shape f.st h.1.mlp.c_fc.weight_u)" = "32,$r"
    check "h.1.mlp.c_fc.weight_v is ($r, 128)" test "$(shape f.st h.1.mlp.c_fc.weight_v)" = "$r,128"
    check "no dense h.1.mlp.c_fc.weight" test -z "$(shape f.st h.1.mlp.c_fc.weight)"
    check "attention stays dense" test "$(shape f.st h.0.attn.c_attn.weight)" = "32,96"
    check "the factored file is smaller" test "$(wc -c <f.st)" -lt "$(wc -c <"$GOOD")"
    run eval --weights "$GOOD" --data "$VAL" --seq 32
    expect_ok
    dense=$(loss_of)
    run eval --weights f.st --data "$VAL" --seq 32
    expect_ok
    fl=$(loss_of)
    check "the factored model evaluates ($fl, dense $dense)" test -n "$fl"
    run sample --weights f.st --tokens 40 --prompt "The " --seed 3
    expect_ok
    check "kiln sample wrote text" test "$(wc -c <"$W/stdout")" -gt 20
    # a fixed rank for every kind
    run compress lowrank --weights "$GOOD" --out r.st --rank 8
    expect_ok
    for k in qkv attproj fc fcproj; do
        check "$k at rank 8" test "$(meta r.st kiln.rank.$k)" = 8
    done
    check "h.0.attn.c_attn.weight_v is (8, 96)" test "$(shape r.st h.0.attn.c_attn.weight_v)" = "8,96"
    run eval --weights r.st --data "$VAL" --seq 32
    expect_ok
}

case_finetune() {
    need_fixture
    run compress lowrank --weights "$GOOD" --out f.st --rank 4
    expect_ok
    run eval --weights f.st --data "$VAL" --seq 16 --batch 2 --batches 8
    expect_ok
    before=$(loss_of)
    cp f.st f0.st
    run train --seq 16 --batch 2 --steps 40 --lr 3e-3 --warmup 2 --peak-gflops 100 --threads 1 \
        --data "$DATA" --init f.st --save ft.st
    expect_ok
    check "the --init file is untouched" same_file f.st f0.st
    check "the fine-tuned model is factored still" test "$(shape ft.st h.0.mlp.c_proj.weight_u)" = "128,4"
    check "with its ranks" test "$(meta ft.st kiln.rank.attproj)" = 4
    run eval --weights ft.st --data "$VAL" --seq 16 --batch 2 --batches 8
    expect_ok
    after=$(loss_of)
    check "fine-tuning lowers the loss ($before -> $after)" less "$after" "$before"
    run sample --weights ft.st --tokens 20 --prompt "The " --seed 1
    expect_ok
    # a factored run resumes from its checkpoint to the same bytes; a dense one refuses it
    TR="train --seq 16 --batch 2 --steps 20 --lr 3e-3 --warmup 2 --peak-gflops 100 --threads 1 --data $DATA"
    run $TR --init f.st --save a.st --checkpoint-dir ck --checkpoint-every 10
    expect_ok
    rm -r ck/step_00000020
    echo step_00000010 >ck/latest
    run $TR --init f.st --save b.st --checkpoint-dir ck --checkpoint-every 10 --resume ck
    expect_ok
    check "the resumed factored run ends with the same bytes" same_file a.st b.st
    run $TR --init "$GOOD" --save c.st --checkpoint-dir ck --checkpoint-every 10 --resume ck
    expect_fail
    expect_err 'low-rank factors'
    check "no weights saved by the refused run" test ! -e c.st
    # structured pruning wants the dense model
    run compress prune --weights ft.st --out p.st --heads 0.5 --importance magnitude
    expect_rc 2
    expect_err 'holds low-rank factors'
    check "nothing written" test ! -e p.st
    no_temp_files .
}

case_bad_input() {
    need_fixture
    echo keep >out.st
    for args in "--energy 0" "--energy 1.5" "--energy -0.5" "--energy nan" "--rank 0" \
        "--rank -3" "--rank 32" "--rank 40 --matrices fc" "--rank 16 --matrices attproj" \
        "--energy 0.9 --matrices fc,mlp" "--energy 0.9 --matrices fc,fc" "--energy 0.9 --matrices ''" \
        "--energy 0.9 --rank 4" "" "--energy 1.0 --matrices attproj"; do
        eval "run compress lowrank --weights \"\$GOOD\" --out out.st $args"
        expect_fail
        check "out.st untouched ($args)" test "$(cat out.st)" = keep
    done
    run compress lowrank --weights "$GOOD" --out out.st --energy 1.5
    expect_err "(0, 1]"
    run compress lowrank --weights "$GOOD" --out out.st --rank 32
    expect_err "min(in, out)"
    run compress lowrank --weights "$GOOD" --out out.st --rank 16 --matrices attproj
    expect_err "saves no weights"
    run compress lowrank --weights "$GOOD" --out out.st --energy 0.9 --matrices fc,mlp
    expect_err 'unknown matrix kind "mlp"'
    # a factored input, a quantized one
    run compress lowrank --weights "$GOOD" --out f.st --rank 4
    expect_ok
    run compress lowrank --weights f.st --out out.st --rank 2
    expect_fail
    expect_err "factored already"
    run compress quantize --weights "$GOOD" --out q.st
    expect_ok
    run compress lowrank --weights q.st --out out.st --rank 2
    expect_fail
    expect_err "quantized"
    check "out.st untouched" test "$(cat out.st)" = keep
    # what does not take a factored model says so
    run compress quantize --weights f.st --out q2.st
    expect_fail
    expect_err "factored"
    check "no q2.st" test ! -e q2.st
    run export --weights f.st --tokenizer bytes --out f.gguf
    expect_fail
    expect_err "factored"
    check "no f.gguf" test ! -e f.gguf
    no_temp_files .
}

main "$@"
