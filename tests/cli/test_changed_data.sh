#!/bin/sh
# Data that changes under a run: a resume on data of the same size but other tokens (a folder
# prepared again from another text, a lone shard replaced) is refused, naming the checkpoint's
# file and this run's; a --data shard truncated while training reads it ends the run with an
# error naming it (never a bare SIGBUS), the --save file holding the last good weights.
. "$(dirname "$0")/lib.sh"

CK="--checkpoint-dir ck --checkpoint-every 2 --checkpoint-sync"
T="train $TINY --seq 16 --batch 2 --threads 1 --lr 1e-3"

# other_text IN OUT: the same documents with every letter shifted by one: the same bytes per
# document, so the byte tokenizer gives the same token counts, but other tokens.
other_text() {
    mkdir -p "$2"
    for f in "$1"/*.txt; do
        tr 'a-z' 'b-za' <"$f" >"$2/$(basename "$f")"
    done
}

case_resume_reprepared_folder() {
    need_fixture
    other_text "$FIX/in" other
    run prepare --tokenizer bytes --out d "$FIX/in"
    expect_ok
    run $T --data d/train_000.bin --val-data d/val_000.bin --steps 4 $CK --save w.st
    expect_ok
    # the same data again: resumed
    run $T --data d/train_000.bin --val-data d/val_000.bin --steps 6 $CK --save w.st --resume ck
    expect_ok
    cp d/train_000.bin before.bin
    run prepare --tokenizer bytes --out d other
    expect_ok
    check "the new shard has the old one's size" test "$(wc -c <d/train_000.bin)" -eq "$(wc -c <before.bin)"
    check "but other bytes" sh -c "! cmp -s d/train_000.bin before.bin"
    run $T --data d/train_000.bin --val-data d/val_000.bin --steps 8 $CK --save w.st --resume ck
    expect_fail
    expect_err "ck/step_00000006" "other training data" "d/train_000.bin" "other tokens"
    check "nothing was trained on the other data" test ! -d ck/step_00000008
}

case_resume_replaced_shard() {
    need_fixture
    cp "$DATA" a.bin
    run $T --data a.bin --steps 4 $CK --save w.st
    expect_ok
    other_text "$FIX/in" other
    run prepare --tokenizer bytes --out o other
    expect_ok
    check "the other shard has the same size" test "$(wc -c <o/train_000.bin)" -eq "$(wc -c <a.bin)"
    cp o/train_000.bin a.bin
    run $T --data a.bin --steps 6 $CK --save w.st --resume ck
    expect_fail
    expect_err "ck/step_00000004" "a.bin" "other tokens"
    # validation data is compared too
    cp "$DATA" a.bin
    cp "$VAL" v.bin
    rm -rf ck
    run $T --data a.bin --val-data v.bin --steps 4 $CK --save w.st
    expect_ok
    cp o/val_000.bin v.bin
    check "the other val shard has the same size" test "$(wc -c <v.bin)" -eq "$(wc -c <$VAL)"
    run $T --data a.bin --val-data v.bin --steps 6 $CK --save w.st --resume ck
    expect_fail
    expect_err "other validation data" "v.bin"
}

# A shard cut short while the run reads it: the next batch that needs the lost bytes fails
# with the file named; the weights of the last step done go to --save.
case_shard_truncated_mid_run() {
    need_fixture
    cp "$DATA" a.bin
    "$KILN" $T --data a.bin --steps 100000 --save w.st --metrics m.jsonl \
        </dev/null >"$W/stdout" 2>"$W/stderr" &
    _pid=$!
    wait_step 5
    truncate -s 100 a.bin
    wait $_pid
    RC=$?
    LAST="kiln $T --data a.bin --steps 100000 (a.bin truncated after step 5)"
    cat "$W/stderr" >>"$W/log"
    check "kiln did not die of a signal (status $RC)" test "$RC" -lt 125
    expect_fail
    expect_err "a.bin" "truncated" "last good step" "w.st"
    check "the last good weights were saved" test -s w.st
    run eval --weights w.st --data "$VAL" --batch 1 --seq 16 --batches 2
    expect_ok
}

main "$@"
