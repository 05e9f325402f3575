#!/bin/sh
# Structured pruning (kiln compress prune): a narrower model that eval, sample, quantize and
# train (--init, checkpoints and resume) take, fine-tuning winning back loss; magnitude scores
# need no data; GGUF takes a narrower MLP and refuses narrower attention; bad input refused
# with nothing written.
. "$(dirname "$0")/lib.sh"

PRUNE="compress prune --weights $GOOD --data $DATA --batches 4 --batch 2 --seq 32"

# loss_of FILE: kiln eval's loss of the model in FILE over the fixture's validation data.
loss_of() {
    "$KILN" eval --weights "$1" --data "$VAL" --batch 2 --seq 32 | sed -n 's/.*| loss \([0-9.]*\) |.*/\1/p'
}
less_than() { /usr/bin/python3 -c "import sys; sys.exit(not float('$1') < float('$2'))"; }

case_prune_finetune() {
    need_fixture
    run $PRUNE --heads 0.5 --mlp 0.5 --out p.st
    expect_ok
    expect_out_re 'scored by the Taylor estimate over 4 batches'
    expect_out_re 'heads 2 -> 1 per layer .*MLP 128 -> 64'
    expect_out_re '^block 1 keeps heads [01]$'
    full=$(loss_of "$GOOD")
    pruned=$(loss_of p.st)
    check "pruning costs loss ($full -> $pruned)" less_than "$full" "$pruned"
    run train --init p.st --seq 32 --batch 4 --steps 60 --lr 3e-3 --threads 1 --data "$DATA" \
        --peak-gflops 100 --save ft.st --checkpoint-dir ck --checkpoint-every 30
    expect_ok
    expect_out_re '^model: 2 layers, 1 heads, 32 channels'
    expect_out_re '^model: heads of 16 channels \(attention width 16\), MLP width 64'
    tuned=$(loss_of ft.st)
    check "fine-tuning wins loss back ($pruned -> $tuned)" less_than "$tuned" "$pruned"
    # a narrow model's checkpoint resumes to the same bytes
    rm -r ck/step_00000060
    echo step_00000030 >ck/latest
    run train --init p.st --seq 32 --batch 4 --steps 60 --lr 3e-3 --threads 1 --data "$DATA" \
        --peak-gflops 100 --save ft2.st --checkpoint-dir ck --checkpoint-every 30 --resume ck
    expect_ok
    check "the resumed run ends with the same bytes" same_file ft.st ft2.st
    run sample --weights ft.st --tokens 8 --seed 1
    expect_ok
    run compress quantize --weights ft.st --out q.st
    expect_ok
    run eval --weights q.st --data "$VAL" --batch 2 --seq 32
    expect_ok
    run compress quantize --weights ft.st --out q4.st --type int4 --group 16
    expect_ok
    run sample --weights q4.st --tokens 8 --seed 1
    expect_ok
    # llama.cpp's gpt2 graph needs the attention n_embd wide
    run export --weights ft.st --out p.gguf --type f32
    expect_fail
    expect_err 'attention is 16 wide for n_embd 32'
    check "no GGUF file is left" test ! -e p.gguf
    no_temp_files .
}

case_magnitude_mlp_only() {
    need_fixture
    run compress prune --weights "$GOOD" --out m.st --mlp 0.25 --importance magnitude --multiple 8
    expect_ok
    expect_out_re 'scored by the L2 norm'
    expect_out_re 'heads 2 -> 2 per layer .*MLP 128 -> 96'
    run eval --weights m.st --data "$VAL" --batch 2 --seq 32
    expect_ok
    run export --weights m.st --out m.gguf --type f32
    expect_ok
    check "a narrower MLP exports" test -s m.gguf
    # the kept count is rounded to --multiple
    run compress prune --weights "$GOOD" --out r.st --mlp 0.3 --importance magnitude --multiple 32
    expect_ok
    expect_out_re 'MLP 128 -> 96'
}

case_bad_input() {
    need_fixture
    cp "$GOOD" w.st
    run $PRUNE --heads 1 --out z.st
    expect_rc 2
    expect_err 'would leave 0 of 2 heads'
    run $PRUNE --heads 1.5 --out z.st
    expect_rc 2
    expect_err '--heads 1.5: must be in [0, 1]'
    run $PRUNE --mlp -0.1 --out z.st
    expect_rc 2
    expect_err '--mlp -0.1: must be in [0, 1]'
    run $PRUNE --out z.st
    expect_rc 2
    expect_err 'nothing to remove'
    run $PRUNE --heads 0.2 --out z.st
    expect_rc 2
    expect_err 'remove none'
    run $PRUNE --heads 0.5 --importance random --out z.st
    expect_rc 2
    expect_err "unknown importance 'random'"
    check "nothing written" test ! -e z.st
    run compress prune --weights w.st --out w.st --heads 0.5 --importance magnitude
    expect_rc 2
    expect_err 'is the input w.st itself'
    check "the dense model is untouched" same_file w.st "$GOOD"
    for c in "compress quantize" "compress lowrank --rank 4" "export --type f32"; do
        run $c --weights w.st --out ./w.st
        expect_rc 2
        expect_err 'itself'
        check "$c: the model is untouched" same_file w.st "$GOOD"
    done
    run compress prune --weights w.st --out z.st --heads 0.5 --data missing_dir/x.bin
    expect_fail
    check "nothing written without data" test ! -e z.st
    run compress quantize --weights w.st --out q.st
    expect_ok
    run compress prune --weights q.st --out z.st --heads 0.5 --importance magnitude
    expect_fail
    expect_err 'quantized'
    check "nothing written from a quantized file" test ! -e z.st
    # data of another vocabulary
    run compress prune --weights w.st --out z.st --heads 0.5 --data "$DATA300"
    expect_fail
    expect_err 'vocabulary'
    check "nothing written" test ! -e z.st
    no_temp_files .
}
main "$@"
