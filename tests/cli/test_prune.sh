#!/bin/sh
# Magnitude pruning while training: the cubic schedule's steps reach the final sparsity
# exactly (globally, or in each matrix), pruned weights stay zero through the updates after
# the last pruning step, the saved file records each matrix's sparsity, a run resumed in the
# middle of the schedule ends with the uninterrupted run's bytes, and bad flags are refused.
. "$(dirname "$0")/lib.sh"

TRAIN="train $TINY --seq 16 --batch 2 --threads 1 --data $DATA --steps 40"
PRUNE="--prune-sparsity 0.5 --prune-start 5 --prune-end 25 --prune-every 5"

# sparsity FILE KEY: the sparsity the file's metadata gives KEY ("all": over every matrix).
sparsity() {
    /usr/bin/python3 - "$1" "$2" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
print(json.loads(json.loads(b[8:8 + n])["__metadata__"]["kiln.sparsity"])[sys.argv[2]])
PY
}

# zeros FILE: the fraction of zeros over the block matrices, counted in the tensors.
zeros() {
    /usr/bin/python3 - "$1" <<'PY'
import json, struct, sys, array
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
z = t = 0
for k, v in h.items():
    if k == "__metadata__" or not k.endswith("weight") or ".h." not in "." + k or "ln_" in k:
        continue
    a = array.array("f", b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
    z += sum(1 for x in a if x == 0.0)
    t += len(a)
print(f"{z / t:.6f}")
PY
}

# near X Y: |X - Y| <= 0.001 (a matrix's count is rounded to whole weights)
near() { /usr/bin/python3 -c "import sys; sys.exit(abs(float('$1') - float('$2')) > 1e-3)"; }

case_gradual_global() {
    need_fixture
    run $TRAIN $PRUNE --save w.st --metrics m.jsonl
    expect_ok
    expect_out_re 'prune: step 10: 28.9% of the blocks. matrices set to zero'
    expect_out_re 'prune: step 25: 50.0%'
    check "5 pruning events" sh -c "test \$(grep -c '\"event\": \"prune\"' m.jsonl) -eq 5"
    check "the file says 50% over all matrices" test "$(sparsity w.st all)" = 0.5
    check "and the tensors hold 50% zeros, 15 updates after the last pruning step" \
        test "$(zeros w.st)" = 0.500000
    check "a global threshold prunes the matrices unevenly" \
        test "$(sparsity w.st h.0.attn.c_proj.weight)" != 0.5
}

case_layer_one_shot() {
    need_fixture
    run $TRAIN --prune-sparsity 0.3 --prune-scope layer --prune-start 10 --save w.st
    expect_ok
    expect_out_re 'prune: step 10: 30.0% .*per matrix'
    for t in h.0.attn.c_attn.weight h.1.mlp.c_fc.weight h.1.mlp.c_proj.weight; do
        check "$t is 30% zeros ($(sparsity w.st $t))" near "$(sparsity w.st $t)" 0.3
    done
    # bf16: the master weights are pruned and so are the working ones
    run $TRAIN --prune-sparsity 0.3 --prune-scope layer --prune-start 10 --precision bf16 --save b.st
    expect_ok
    check "bf16: 30% zeros in the saved weights ($(zeros b.st))" near "$(zeros b.st)" 0.3
}

case_resume_mid_schedule() {
    need_fixture
    run $TRAIN $PRUNE --save ref.st
    expect_ok
    run $TRAIN $PRUNE --save r.st --checkpoint-dir ck --checkpoint-every 10 --steps 40
    expect_ok
    rm -r ck/step_00000030 ck/step_00000040
    echo step_00000020 >ck/latest
    run $TRAIN $PRUNE --save r.st --checkpoint-dir ck --checkpoint-every 10 --resume ck
    expect_ok
    expect_out_re 'resumed from ck/step_00000020'
    check "resumed at step 20 of the schedule: the same bytes as the uninterrupted run" \
        same_file ref.st r.st
}

case_bad_flags() {
    need_fixture
    for f in "--prune-sparsity 1" "--prune-sparsity -0.1" "--prune-sparsity 0.5 --prune-scope row" \
        "--prune-sparsity 0.5 --prune-start 0" "--prune-sparsity 0.5 --prune-start 9 --prune-end 3" \
        "--prune-sparsity 0.5 --prune-every 0"; do
        run $TRAIN $f --save w.st
        expect_usage
    done
    check "nothing saved" test ! -e w.st
}

main "$@"
