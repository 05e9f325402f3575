#!/bin/sh
# kiln eval: loss and perplexity of good weights on good data; clear errors for wrong
# weights, wrong data and wrong sizes.
. "$(dirname "$0")/lib.sh"

case_good() {
    need_fixture
    run eval --weights "$GOOD" --data "$VAL" --batch 2 --seq 16
    expect_ok
    expect_out_re '^tokens [0-9]+ \| loss [0-9]+\.[0-9]+ \| perplexity [0-9]+\.[0-9]+'
    loss=$(sed -n 's/.*| loss \([0-9.]*\) |.*/\1/p' "$W/stdout")
    ppl=$(sed -n 's/.*| perplexity \([0-9.]*\).*/\1/p' "$W/stdout")
    if awk -v l="$loss" -v p="$ppl" 'BEGIN { d = exp(l) - p; if (d < 0) d = -d; exit !(l != "" && d < 1e-3 * p) }'; then
        ok "perplexity $ppl is e^loss ($loss)"
    else
        bad "perplexity '$ppl' is e^loss ('$loss')"
    fi
    # The fixture model has learned the ten-word language: far below log(256) = 5.5.
    if awk -v l="$loss" 'BEGIN { exit !(l != "" && l < 1.5) }'; then
        ok "the trained model's loss $loss is low"
    else
        bad "the trained model's loss '$loss' is below 1.5"
    fi
    run eval --weights "$GOOD" --data "$VAL" --batch 2 --seq 16 --batches 3
    expect_ok
    expect_out_re '^tokens 96 \|'
    # The same again: evaluation is deterministic.
    cp "$W/stdout" first
    run eval --weights "$GOOD" --data "$VAL" --batch 2 --seq 16 --batches 3
    # Only the tokens, loss and perplexity fields: the time and rate fields vary run to run.
    check "the same loss twice" sh -c "cut -d'|' -f1-3 first >a; cut -d'|' -f1-3 '$W/stdout' >b; test -s a && cmp -s a b"
    # A folder of shards and a glob work as well as a file.
    run eval --weights "$GOOD" --data "$FIX/data/val_*.bin" --batch 2 --seq 16 --batches 3
    expect_ok
}

# --heads fills in a head count only for files that record none; kiln's files record theirs.
case_heads_must_agree() {
    need_fixture
    run eval --weights "$GOOD" --data "$VAL" --batch 2 --seq 16 --heads 1
    expect_fail
    expect_err_re 'heads'
    expect_err 'good.safetensors'
}

case_damaged_weights() {
    need_fixture
    damaged_weights
    while read -r f rest; do
        run eval --weights "$f" --data "$VAL" --batch 2 --seq 16
        expect_fail
        expect_err "$(basename "$f")"
        for e in $rest; do
            expect_err "$e"
        done
    done <weights.list
}

case_bad_data() {
    need_fixture
    run eval --weights "$GOOD" --data nope.bin --batch 2 --seq 16
    expect_fail
    expect_err "nope.bin"
    cp "$VAL" val.bin
    flip_byte val.bin 300
    run eval --weights "$GOOD" --data val.bin --batch 2 --seq 16
    expect_fail
    expect_err "val.bin" "checksum"
    head -c 2000 "$VAL" >short.bin
    run eval --weights "$GOOD" --data short.bin --batch 2 --seq 16
    expect_fail
    expect_err "short.bin"
    run eval --weights "$GOOD" --data "$VAL300" --batch 2 --seq 16
    expect_fail
    expect_err "val_000.bin" "296" "256"
    run eval --weights "$GOOD" --data "$GOOD" --batch 2 --seq 16
    expect_fail
    expect_err "good.safetensors"
    # Fewer windows than one batch.
    run eval --weights "$GOOD" --data "$VAL" --batch 300 --seq 16
    expect_fail
    expect_err "val_000.bin"
}

case_bad_sizes() {
    need_fixture
    run eval --weights "$GOOD" --data "$VAL" --batch 2 --seq 64
    expect_usage
    expect_err "64" "32"
    for a in "--batch 0" "--seq 0" "--batches -1" "--batch -4"; do
        # shellcheck disable=SC2086
        run eval --weights "$GOOD" --data "$VAL" $a
        expect_usage
    done
    run eval --weights "$GOOD" --data "$VAL" --batch 4611686018427387904 --seq 4
    expect_fail
    run eval --weights "$GOOD" --data "$VAL" --batch 2 --seq 16 --heads 3
    expect_fail
    expect_err "3"
}

# A --batch that the data cannot fill is refused before the model's activations for it are
# allocated: 100000 x 16 would take 11.6 GiB (and memset them) only to learn that the file
# holds 229 windows. The address space is capped so that the test cannot take the memory.
case_data_checked_before_allocating() {
    need_fixture
    if is_sanitized; then
        echo "skipped: a sanitizer build cannot run under ulimit -v"
        return 77
    fi
    (
        ulimit -v 2000000 || exit 1
        run eval --weights "$GOOD" --data "$VAL" --batch 100000 --seq 16 --threads 1
        expect_fail
        expect_err "val_000.bin"
        echo "$checks $failures" >"$W/counts"
    )
    read -r c f <"$W/counts" || exit 1
    checks=$((checks + c))
    failures=$((failures + f))
}

main "$@"
