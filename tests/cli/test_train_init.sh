#!/bin/sh
# kiln train --init with weights that are missing, truncated, corrupt, of the wrong shape,
# dtype or tensor names, or not weights at all: a failure naming the file and the tensor or
# field at fault, and no weights written.
. "$(dirname "$0")/lib.sh"

case_damaged_init() {
    need_fixture
    damaged_weights
    while read -r f rest; do
        run train --seq 16 --batch 2 --steps 2 --peak-gflops 100 --data "$DATA" --init "$f" \
            --save w.safetensors
        expect_fail
        expect_err "$(basename "$f")"
        for e in $rest; do
            expect_err "$e"
        done
    done <weights.list
    check "nothing was saved" test ! -e w.safetensors
    no_temp_files .
}

case_truncation_named() {
    need_fixture
    head -c 5000 "$GOOD" >short.safetensors
    run train --seq 16 --batch 2 --steps 2 --peak-gflops 100 --data "$DATA" --init short.safetensors
    expect_fail
    expect_err_re 'truncat|past the end|end of the (file|data)|short'
}

case_good_init() {
    need_fixture
    run train --seq 16 --batch 2 --steps 2 --peak-gflops 100 --data "$DATA" --init "$GOOD" \
        --save w.safetensors
    expect_ok
    check "the weights were saved" test -s w.safetensors
    check "the --init file is untouched" same_file "$GOOD" "$FIX/good.safetensors"
    # The run may read and write the same file.
    cp "$GOOD" same.safetensors
    run train --seq 16 --batch 2 --steps 2 --peak-gflops 100 --data "$DATA" \
        --init same.safetensors --save same.safetensors
    expect_ok
    check "the weights were replaced" sh -c "! cmp -s same.safetensors '$GOOD'"
    run eval --weights same.safetensors --data "$VAL" --batch 2 --seq 16 --batches 2
    expect_ok
    no_temp_files .
}

main "$@"
