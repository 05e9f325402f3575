#!/bin/sh
# kiln train --tensorboard DIR: the steps' scalars as a TensorBoard events file, decoded by
# tfevents_decode.py independently of kiln's writer (the crc32c and protobuf packages) and
# equal to the metrics file's, validation loss included; a resumed run adds a file of its own;
# a folder that cannot be made stops the run at its start, as --metrics does.
. "$(dirname "$0")/lib.sh"

DECODE="/usr/bin/python3 $SRC/tests/cli/tfevents_decode.py"

need_decoder() {
    if ! /usr/bin/python3 -c 'import crc32c, google.protobuf' 2>/dev/null; then
        echo "SKIP: python3-crc32c and python3-protobuf are not installed (scripts/setup.sh installs them)"
        exit 77
    fi
}

case_decoded_equals_metrics() {
    need_fixture
    need_decoder
    run train $TINY --seq 16 --batch 2 --threads 1 --data $DATA --steps 20 --save "" \
        --val-data "$FIX/data/val_000.bin" --eval-every 5 --metrics m.jsonl --tensorboard tb/run1
    expect_ok
    check "one events file in tb/run1" test "$(ls tb/run1 | grep -c '^events\.out\.tfevents\.')" -eq 1
    f=$(ls tb/run1/events.out.tfevents.*)
    if $DECODE "$f" m.jsonl >dec.out 2>&1; then ok "decoded: $(cat dec.out)"; else bad "decoded: $(cat dec.out)"; fi
    check "20 steps of scalars, 4 validation losses among them" grep -q "21 records, 20 steps" dec.out
    # a resumed run: a file of its own beside the first, with the steps it ran
    run train $TINY --seq 16 --batch 2 --threads 1 --data $DATA --steps 10 --save "" \
        --checkpoint-dir ck --checkpoint-every 5 --metrics m2.jsonl --tensorboard tb/run2
    expect_ok
    run train $TINY --seq 16 --batch 2 --threads 1 --data $DATA --steps 20 --save "" \
        --checkpoint-dir ck --checkpoint-every 5 --resume ck --metrics r.jsonl --tensorboard tb/run2
    expect_ok
    check "the resumed run wrote a second file" test "$(ls tb/run2 | wc -l)" -eq 2
}

case_folder_refused_at_start() {
    need_fixture
    : >afile
    run train $TINY --seq 16 --batch 2 --threads 1 --data $DATA --steps 5 --save w.st \
        --tensorboard afile/tb
    expect_fail
    expect_err "the TensorBoard folder afile/tb cannot be made: afile is not a folder"
    check "nothing was trained or saved" test ! -e w.st
}

main "$@"
