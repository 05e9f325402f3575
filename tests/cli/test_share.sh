#!/bin/sh
# Cross-layer weight sharing (--share-layers): half the blocks' weights, a file that records it
# (eval, sample, --init and GGUF export read it back), an exact resume, and bad values refused.
. "$(dirname "$0")/lib.sh"

TRAIN="train --layers 4 --heads 2 --embd 32 --context 32 --peak-gflops 100 --seq 16 --batch 2 --threads 1 --data $DATA --steps 30"

case_train_save_load() {
    need_fixture
    run $TRAIN --share-layers 2 --save s.st
    expect_ok
    expect_out_re '^model: 4 layers, .*0.03M parameters'
    run $TRAIN --save u.st
    expect_ok
    expect_out_re '^model: 4 layers, .*0.06M parameters'
    check "the shared model's file is smaller" test "$(wc -c <s.st)" -lt "$(wc -c <u.st)"
    run eval --weights s.st --data "$VAL" --batch 2 --seq 16
    expect_ok
    run sample --weights s.st --tokens 8 --seed 3
    expect_ok
    # --init keeps the file's sharing and trains on
    run train --init s.st --seq 16 --batch 2 --threads 1 --data "$DATA" --steps 3 --peak-gflops 100 --save s2.st
    expect_ok
    expect_out_re '^model: 4 layers, .*0.03M parameters'
    run export --weights s.st --out s.gguf --type f32
    expect_ok
}

case_resume_exact() {
    need_fixture
    run $TRAIN --share-layers 2 --save ref.st
    expect_ok
    run $TRAIN --share-layers 2 --save r.st --checkpoint-dir ck --checkpoint-every 10
    expect_ok
    rm -r ck/step_00000020 ck/step_00000030
    echo step_00000010 >ck/latest
    run $TRAIN --share-layers 2 --save r.st --checkpoint-dir ck --checkpoint-every 10 --resume ck
    expect_ok
    check "a shared model resumed at step 10 ends byte-identical" same_file ref.st r.st
    run $TRAIN --save x.st --checkpoint-dir ck --checkpoint-every 10 --resume ck
    expect_fail
    expect_err "--share-layers is 2 there and 1 in this run"
}

case_bad_values() {
    need_fixture
    run $TRAIN --share-layers 3 --save x.st
    expect_fail
    expect_err "share_layers is 3; it must divide n_layer 4"
    run $TRAIN --share-layers -1 --save x.st
    expect_usage
    check "nothing saved" test ! -e x.st
}

main "$@"
