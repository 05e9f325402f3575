#!/bin/sh
# kiln train on bad input: every case exits 1 (failure) or 2 (usage) with a message on
# stderr naming what was wrong and where, never crashes, and never replaces an existing
# --save file with anything.
. "$(dirname "$0")/lib.sh"

# train ARGS...: a tiny run on the shared data, saving to w.safetensors.
train() {
    run train $TINY --seq 16 --batch 2 --steps 3 --data "$DATA" --save w.safetensors "$@"
}

no_weights() {
    check "nothing was saved" test ! -e w.safetensors
    no_temp_files .
}

case_heads_not_dividing() {
    need_fixture
    train --heads 3
    expect_fail
    expect_err "3" "32"
    expect_err_re 'head'
    no_weights
    train --heads 64
    expect_fail
}

case_seq_beyond_context() {
    need_fixture
    train --seq 64
    expect_fail
    expect_err "64" "32"
    no_weights
    run train --model d4 --context 8 --seq 9 --data "$DATA" --save w.safetensors
    expect_fail
    expect_err "9" "8"
}

case_missing_data() {
    need_fixture
    train --data nope.bin
    expect_fail
    expect_err "nope.bin"
    no_weights
    train --data 'nowhere/train_*.bin'
    expect_fail
    expect_err "nowhere/train_*.bin"
    mkdir empty
    train --data empty
    expect_fail
    expect_err "empty"
    train --data ""
    expect_fail
    no_weights
}

case_truncated_shard() {
    need_fixture
    head -c 1000 "$DATA" >short.bin
    train --data short.bin
    expect_fail
    expect_err "short.bin"
    expect_err_re 'truncat|short|size|bytes'
    head -c 30 "$DATA" >tiny.bin
    train --data tiny.bin
    expect_fail
    expect_err "tiny.bin"
    : >zero.bin
    train --data zero.bin
    expect_fail
    expect_err "zero.bin"
    no_weights
}

case_corrupt_shard() {
    need_fixture
    cp "$DATA" tokens.bin
    flip_byte tokens.bin 5001
    train --data tokens.bin
    expect_fail
    expect_err "tokens.bin" "checksum"
    cp "$DATA" header.bin
    flip_byte header.bin 17
    train --data header.bin
    expect_fail
    expect_err "header.bin"
    expect_err_re 'checksum|header'
    cp "$DATA" magic.bin
    write_at magic.bin 0 "KILNTOKX"
    train --data magic.bin
    expect_fail
    expect_err "magic.bin"
    # Not a shard at all: weights, and text.
    train --data "$GOOD"
    expect_fail
    expect_err "good.safetensors"
    train --data "$FIX/in/doc_00.txt"
    expect_fail
    expect_err "doc_00.txt"
    no_weights
}

case_vocab_mismatch() {
    need_fixture
    # Shards of a 296-token vocabulary, weights of a 256-token one.
    train --data "$DATA300" --init "$GOOD"
    expect_fail
    expect_err "train_000.bin" "good.safetensors" "296" "256"
    train --vocab 300
    expect_fail
    expect_err "256" "300"
    no_weights
}

case_nonpositive_sizes() {
    need_fixture
    for a in "--batch 0" "--batch -1" "--seq 0" "--seq -16" "--grad-accum 0" "--steps -1" \
        "--lr -1" "--lr nan" "--warmup -1"; do
        # shellcheck disable=SC2086
        train $a
        expect_usage
        expect_err "${a%% *}"
    done
    no_weights
}

# Negative sizes given to the model flags are mistakes, not "keep the preset's value".
case_negative_model_flags() {
    need_fixture
    for a in "--layers -2" "--heads -2" "--embd -32" "--context -32" "--vocab -256"; do
        # shellcheck disable=SC2086
        train $a
        expect_fail
        flag=${a%% *}
        flag=${flag#--}
        expect_err_re "${flag%s}"
    done
    # The head count of kiln eval and kiln sample, likewise.
    run eval --weights "$GOOD" --data "$VAL" --batch 2 --seq 16 --heads -2
    expect_fail
    expect_err_re "head"
    run sample --weights "$GOOD" --tokens 5 --heads -2
    expect_fail
    expect_err_re "head"
}

# A failed run leaves an existing --save file exactly as it was, and no temporary files.
case_save_survives_failure() {
    need_fixture
    cp "$DATA" damaged.bin
    flip_byte damaged.bin 3000
    printf 'not weights' >garbage.safetensors
    for a in "--data nope.bin" "--data damaged.bin" "--init garbage.safetensors" "--heads 3" \
        "--seq 64" "--data $DATA300 --init keep.safetensors" "--val-data damaged.bin --eval-every 1" \
        "--init keep.safetensors --data damaged.bin" "--metrics nodir/sub/m.jsonl"; do
        cp "$GOOD" keep.safetensors
        # shellcheck disable=SC2086
        run train $TINY --seq 16 --batch 2 --steps 3 --data "$DATA" --save keep.safetensors $a
        expect_fail
        check "keep.safetensors is unchanged after a run with $a" same_file keep.safetensors "$GOOD"
    done
    no_temp_files .
}

case_save_to_directory() {
    need_fixture
    mkdir w.safetensors
    echo precious >w.safetensors/file
    train
    expect_fail
    expect_err "w.safetensors"
    check "the folder is still a folder with its file" test -f w.safetensors/file
    no_temp_files .
}

# --save naming something that is not a regular file (a FIFO here; /dev/stdout or a device
# in real life) must not replace it: writing the weights to a temporary file and renaming
# it over the path swaps the FIFO for a regular file.
case_save_over_special_file() {
    need_fixture
    mkfifo w.safetensors
    CMD_TIMEOUT=20
    train
    check "w.safetensors is still a FIFO" test -p w.safetensors
    no_temp_files .
}

case_unwritable_metrics() {
    need_fixture
    train --metrics nodir/sub/m.jsonl
    expect_fail
    expect_err "nodir/sub/m.jsonl"
    mkdir m.jsonl
    train --metrics m.jsonl
    expect_fail
    expect_err "m.jsonl"
}

case_bad_val_data() {
    need_fixture
    train --val-data nope.bin --eval-every 1
    expect_fail
    expect_err "nope.bin"
    cp "$VAL" val.bin
    flip_byte val.bin 200
    train --val-data val.bin --eval-every 1
    expect_fail
    expect_err "val.bin" "checksum"
    train --val-data "$VAL300" --eval-every 1
    expect_fail
    expect_err "val_000.bin" "296" "256"
    no_weights
}

# A damaged validation file is found before training starts, not at the first evaluation
# (which may come hours later, or, as here, after the last step).
case_val_data_checked_before_training() {
    need_fixture
    cp "$VAL" val.bin
    flip_byte val.bin 200
    train --val-data val.bin --eval-every 1000
    expect_fail
    expect_err "val.bin"
    if grep -q -E '^step ' "$W/stdout"; then
        bad "the damaged validation file stops the run before step 1 (it trained $(grep -c -E '^step ' "$W/stdout") steps first)"
    else
        ok "the damaged validation file stops the run before step 1"
    fi
}

case_bad_optimizer_flags() {
    need_fixture
    train --optimizer adagrad
    expect_usage
    expect_err "adagrad"
    train --schedule exponential
    expect_usage
    expect_err "exponential"
    train --lr inf
    expect_fail
    expect_err "inf"
}

# A loss that stops being finite ends the run with a message, and the --save file stays as
# it was. (Sanitizer builds also check the NaN path of the CPU math here.)
case_diverging_loss() {
    need_fixture
    cp "$GOOD" keep.safetensors
    run train $TINY --seq 16 --batch 2 --steps 5 --lr 1e30 --grad-clip 0 --data "$DATA" \
        --save keep.safetensors
    expect_fail
    expect_err_re 'loss.*(nan|inf)'
    check "keep.safetensors is unchanged" same_file keep.safetensors "$GOOD"
    no_temp_files .
}

# NaN weights: the first step's loss is NaN, and the message names that step as the
# console numbers steps (from 1).
case_nan_weights() {
    need_fixture
    cp "$GOOD" nan.safetensors
    n=$(st_header_len nan.safetensors)
    # wte.weight's first 1000 floats become NaN (0xffffffff).
    head -c 4000 /dev/zero | tr '\000' '\377' | dd of=nan.safetensors bs=1 seek=$((8 + n)) conv=notrunc 2>/dev/null
    run train --seq 16 --batch 2 --steps 3 --peak-gflops 100 --data "$DATA" --init nan.safetensors \
        --save w.safetensors
    expect_fail
    expect_err_re 'loss.*nan'
    check "the first step of the run is called step 1" grep -q -E 'step 1([^0-9]|$)' "$W/stderr"
    no_weights
}

# Memory that cannot be had: a clean "out of memory" naming what did not fit, never a kill.
# The address space is capped with ulimit -v so that the test cannot take the machine's
# memory; sanitizer builds reserve terabytes of address space and cannot run under a cap.
case_out_of_memory() {
    need_fixture
    if is_sanitized; then
        echo "skipped: a sanitizer build cannot run under ulimit -v"
        return 77
    fi
    for i in 1 2 3 4; do cat "$FIX"/in/*.txt; done >big.txt
    run prepare --tokenizer bytes --val-fraction 0 --out big big.txt
    expect_ok
    (
        ulimit -v 2000000 || exit 1
        run train --model gpt2-1558m --seq 64 --batch 1 --steps 1 --threads 1 --peak-gflops 100 \
            --data "$DATA" --save w.safetensors
        expect_fail
        expect_err_re 'memory|allocate'
        expect_err "parameters"
        # The activations of T = 4096 do not fit in 1 GB.
        ulimit -v 1000000 || exit 1
        run train --layers 2 --heads 2 --embd 32 --context 4096 --seq 4096 --batch 3 --steps 1 \
            --threads 1 --peak-gflops 100 --data "$DATA" --save w.safetensors
        expect_fail
        expect_err_re 'memory|allocate'
        expect_err "activations"
        # Far too large a batch: refused before anything is allocated (here because the
        # data holds fewer windows than one batch).
        run train --model gpt2-1558m --batch 100000 --seq 1024 --steps 1 --threads 1 \
            --peak-gflops 100 --data "$DATA" --save w.safetensors
        expect_fail
        # Data enough for one window of 65536: the attention maps of 32 heads cannot be
        # planned (1 x 32 x 65536^2 scores), and half that context cannot be allocated.
        run train --layers 1 --heads 32 --embd 64 --context 65536 --seq 65536 --batch 1 \
            --steps 1 --threads 1 --peak-gflops 100 --data big/train_000.bin --save w.safetensors
        expect_fail
        expect_err_re 'too large|memory|allocate'
        run train --layers 1 --heads 32 --embd 64 --context 32768 --seq 32768 --batch 1 \
            --steps 1 --threads 1 --peak-gflops 100 --data big/train_000.bin --save w.safetensors
        expect_fail
        expect_err_re 'too large|memory|allocate'
        no_weights
        echo "$checks $failures" >"$W/counts"
    )
    [ -f "$W/counts" ] || {
        bad "ulimit -v works in this shell"
        return 0
    }
    read -r c f <"$W/counts"
    checks=$((checks + c))
    failures=$((failures + f))
}

# Too little address space for OpenBLAS's working buffers (it asks for 128 MiB per thread
# at the first matrix product) must end in an error, not a hang: OpenBLAS retries a failed
# allocation forever.
case_blas_memory_exhausted() {
    need_fixture
    if is_sanitized; then
        echo "skipped: a sanitizer build cannot run under ulimit -v"
        return 77
    fi
    (
        # Room for OpenBLAS's load-time buffer but not for the work buffers of a second
        # thread: kiln must say so instead of letting OpenBLAS retry its mapping forever.
        ulimit -v 400000 || exit 1
        CMD_TIMEOUT=8
        run train $TINY --seq 16 --batch 2 --steps 1 --threads 2 --data "$DATA" --save ""
        expect_fail
        echo "$checks $failures" >"$W/counts"
    )
    read -r c f <"$W/counts" || exit 1
    checks=$((checks + c))
    failures=$((failures + f))
}

main "$@"
