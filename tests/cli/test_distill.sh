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

# kiln eval --teacher: KL(teacher || model) over the same windows, 0 for the teacher itself,
# and lower for a student distilled from it than for the same student trained alone.
case_kl_from_teacher() {
    need_fixture
    run eval --weights "$GOOD" --data "$VAL" --batch 2 --seq 16 --teacher "$GOOD"
    expect_ok
    expect_out_re '\| KL from the teacher 0\.000000$'
    run train $STUDENT --steps 60 --save plain.st
    expect_ok
    run distill --teacher "$GOOD" $STUDENT --steps 60 --save taught.st
    expect_ok
    run eval --weights plain.st --data "$VAL" --batch 2 --seq 16 --teacher "$GOOD"
    expect_ok
    alone=$(sed -n 's/.*KL from the teacher \([0-9.]*\)$/\1/p' "$W/stdout")
    run eval --weights taught.st --data "$VAL" --batch 2 --seq 16 --teacher "$GOOD"
    expect_ok
    taught=$(sed -n 's/.*KL from the teacher \([0-9.]*\)$/\1/p' "$W/stdout")
    check "the distilled student is closer to the teacher ($taught) than the one trained alone ($alone)" \
        /usr/bin/python3 -c "import sys; sys.exit(not (0 < $taught < $alone))"
    run train $TINY --seq 16 --batch 2 --steps 2 --threads 1 --data "$DATA300" --save t300.st
    expect_ok
    run eval --weights "$GOOD" --data "$VAL" --batch 2 --seq 16 --teacher t300.st
    expect_fail
    expect_err "vocabulary"
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
