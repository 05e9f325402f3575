#!/bin/sh
# kiln distill: a student trained on a teacher's softened outputs. With --distill-alpha 1 the
# teacher's share is zero and the run is plain training, byte for byte; a teacher of another
# vocabulary, a bf16 student and a missing --teacher are refused before anything is written.
. "$(dirname "$0")/lib.sh"

STUDENT="$TINY --layers 1 --seq 16 --batch 2 --threads 1 --data $DATA --steps 30"

case_distill_runs() {
    need_fixture
    run distill --teacher "$GOOD" $STUDENT --save s.st --metrics m.jsonl
    expect_ok
    expect_out_re '^distillation: teacher .* \(2 layers, 32 channels\), alpha 0.5 .* temperature 2'
    check "30 steps logged" sh -c "test \$(grep -c '^{\"step\"' m.jsonl) -eq 30"
    run eval --weights s.st --data "$VAL" --batch 2 --seq 16
    expect_ok
    # alpha 1: only the data's cross-entropy, the same bytes as training without a teacher
    run train $STUDENT --save plain.st
    expect_ok
    run distill --teacher "$GOOD" --distill-alpha 1 $STUDENT --save a1.st
    expect_ok
    check "alpha 1 trains as plain training, byte for byte" same_file plain.st a1.st
    run distill --teacher "$GOOD" --distill-alpha 0 --distill-temperature 4 $STUDENT --save kl.st
    expect_ok
    check "alpha 0 (the teacher alone) trains another model" sh -c "! cmp -s plain.st kl.st"
}

case_bad_teacher() {
    need_fixture
    run train $TINY --seq 16 --batch 2 --steps 2 --threads 1 --data "$DATA300" --save t300.st
    expect_ok
    run distill --teacher t300.st $STUDENT --save s.st
    expect_fail
    expect_err "296-token vocabulary" "the same tokenizer"
    check "nothing saved" test ! -e s.st
    run distill --teacher "$GOOD" $STUDENT --precision bf16 --save s.st
    expect_fail
    expect_err "fp32 student"
    run distill $STUDENT --save s.st
    expect_usage
    run distill --teacher "$GOOD" --distill-alpha 2 $STUDENT --save s.st
    expect_usage
    run distill --teacher nothere.st $STUDENT --save s.st
    expect_fail
    expect_err "nothere.st"
    check "nothing saved" test ! -e s.st
}

main "$@"
