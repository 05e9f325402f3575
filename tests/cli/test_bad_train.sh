#!/bin/sh
# Bad input that used to hurt without crashing: reads that block forever, saves that lose
# good weights, silent changes of what was asked, plans that fail late, and messages that
# drop their reason. Each case failed before its fix.
. "$(dirname "$0")/lib.sh"

# train ARGS...: a tiny run on the shared data.
train() {
    run train $TINY --seq 16 --batch 2 --steps 3 --data "$DATA" "$@"
}

# not_generated: a refused sample printed nothing (it was refused before generating).
not_generated() {
    if [ -s "$W/stdout" ]; then
        bad "nothing was generated before the refusal (stdout: $(head -c 60 "$W/stdout"))"
    else
        ok "nothing was generated before the refusal"
    fi
}

# run_to FILE ARGS...: like run, with stdout to FILE (a device, say).
run_to() {
    _out=$1
    shift
    LAST="kiln $* >$_out"
    printf '$ %s\n' "$LAST" >>"$W/log"
    timeout -k 5 "$CMD_TIMEOUT" "$KILN" "$@" </dev/null >"$_out" 2>"$W/stderr"
    RC=$?
    cat "$W/stderr" >>"$W/log"
    if [ "$RC" -eq 124 ] || [ "$RC" -eq 137 ]; then
        bad "kiln $1 finished within ${CMD_TIMEOUT} s"
    elif [ "$RC" -ge 125 ] || sanitizer_report; then
        bad "kiln $1 neither crashed nor tripped a sanitizer (status $RC)"
    fi
}

# Paths that are not regular files are refused at once, with a message naming them; a FIFO
# used to block the open forever (run() fails a command that outlives CMD_TIMEOUT).
case_fifo_inputs() {
    need_fixture
    CMD_TIMEOUT=10
    mkfifo w.safetensors m.json t.kbpe
    run eval --weights w.safetensors --data "$VAL" --batch 2 --seq 16
    expect_fail
    expect_err "w.safetensors" "FIFO"
    train --init w.safetensors --save ""
    expect_fail
    expect_err "w.safetensors" "FIFO"
    run sample --weights w.safetensors --tokens 5
    expect_fail
    expect_err "w.safetensors" "FIFO"
    run train --model m.json --seq 16 --batch 2 --steps 1 --peak-gflops 100 --data "$DATA" --save ""
    expect_fail
    expect_err "m.json" "FIFO"
    run sample --weights "$GOOD" --tokens 5 --tokenizer t.kbpe
    expect_fail
    expect_err "t.kbpe" "FIFO"
    # A GPT-2 tokenizer folder whose files are FIFOs.
    mkdir g2 g2b
    mkfifo g2/encoder.json g2/vocab.bpe g2b/vocab.bpe
    run sample --weights "$GOOD" --tokens 5 --tokenizer g2
    expect_fail
    expect_err "encoder.json" "FIFO"
    if [ -f "$SRC/deps/gpt2/encoder.json" ]; then
        cp "$SRC/deps/gpt2/encoder.json" g2b/
        run sample --weights "$GOOD" --tokens 5 --tokenizer g2b
        expect_fail
        expect_err "vocab.bpe" "FIFO"
    fi
    # A device is no file to read either (/dev/zero never ends).
    ln -s /dev/zero z.json
    run train --model z.json --seq 16 --steps 1 --data "$DATA" --save ""
    expect_fail
    expect_err "z.json" "device"
    run sample --weights "$GOOD" --tokens 5 --tokenizer /dev/zero
    expect_fail
    expect_err "/dev/zero"
    no_temp_files .
}

# Weights that are not finite, or finite but too large to give a finite loss, are never
# saved: the run stops, the --save file keeps the last good weights, and the message says
# where they are. (--lr 1e30 used to save weights of 1e29 over the good file at step 1.)
case_nonfinite_weights_not_saved() {
    need_fixture
    cp "$GOOD" keep.safetensors
    train --lr 1e30 --save-every 1 --save keep.safetensors
    expect_fail
    expect_err "not saved" "step 1" "keep.safetensors"
    expect_err_re 'left as it was|last good'
    check "keep.safetensors is unchanged" same_file keep.safetensors "$GOOD"
    # The final save is checked as well.
    train --lr 1e30 --steps 1 --save keep.safetensors
    expect_fail
    check "keep.safetensors is unchanged after the final save" same_file keep.safetensors "$GOOD"
    # Weights holding infinities (RMSprop steps 10 x lr on its first step): the tensor is
    # named, and a file that did not exist is not created.
    train --optimizer rmsprop --lr 1e38 --warmup 0 --save-every 1 --save new.safetensors
    expect_fail
    expect_err "not saved" "NaN or infinite" "new.safetensors"
    check "no weights were written" test ! -e new.safetensors
    no_temp_files .
}

# --steps 0 trains nothing and saves nothing: it checks the data, the model and the memory
# plan. (It used to write the random initial weights over the --save file.)
case_steps_zero() {
    need_fixture
    cp "$GOOD" keep.safetensors
    train --steps 0 --save keep.safetensors
    expect_ok
    check "keep.safetensors is unchanged" same_file keep.safetensors "$GOOD"
    expect_out_re 'nothing was trained and nothing saved'
    expect_out_re '^memory plan: '
    train --steps 0 --save new.safetensors
    expect_ok
    check "no weights were written" test ! -e new.safetensors
    run train --help
    expect_ok
    expect_out_re '--steps N +.*0: check'
    no_temp_files .
}

# A model JSON's vocab_size is the model's: a data vocabulary that differs is an error
# naming both, not a silent replacement; left out (or 0) it takes the data's.
case_model_json_vocab() {
    need_fixture
    printf '{"n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 300, "max_seq_len": 16}' >v300.json
    run train --model v300.json --seq 8 --batch 2 --steps 1 --peak-gflops 100 --data "$DATA" \
        --save w.safetensors
    expect_fail
    expect_err "300" "256" "vocab_size"
    check "nothing was saved" test ! -e w.safetensors
    printf '{"n_layer": 1, "n_head": 2, "n_embd": 16, "max_seq_len": 16}\n' >novocab.json
    run train --model novocab.json --seq 8 --batch 2 --steps 1 --peak-gflops 100 \
        --data "$DATA" --save ""
    expect_ok
    expect_out_re '^model: .*vocabulary 256 '
    printf '{"n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 0, "max_seq_len": 16}' >zero.json
    run train --model zero.json --seq 8 --batch 2 --steps 1 --peak-gflops 100 --data "$DATA" \
        --save ""
    expect_ok
    expect_out_re '^model: .*vocabulary 256 '
}

# A numeric flag out of its range is named alone, with its value and its limit, as a usage
# error: the messages used to list every limit of a group of flags ("--batch, --seq,
# --grad-accum must be >= 1 and --steps, --lr, --warmup, ... >= 0") and leave the user to
# find which. Each line: the command, the flag, its value, then the limit's text.
case_flag_out_of_range_named() {
    while IFS='|' read -r cmd flag value limit; do
        # shellcheck disable=SC2086
        run $cmd --"$flag" "$value"
        expect_usage
        expect_err "--$flag $value: must be $limit"
        others=$(grep -o -E -e '--[a-z][a-z0-9-]*' "$W/stderr" | sort -u | grep -v -x -e "--$flag")
        if [ -z "$others" ]; then
            ok "the message about --$flag names no other flag"
        else
            bad "the message about --$flag names no other flag (it names $others)"
        fi
    done <<'EOF'
train|steps|-1|>= 0
train|batch|0|1..1048576
train|seq|-16|1..1048576
train|grad-accum|0|>= 1
train|lr|-1|a finite number >= 0
train|warmup|-1|>= 0
train|min-lr-frac|-0.5|in [0, 1]
train|lr-total-steps|-3|>= 0
train|threads|5000|0..4096
train|eval-every|-1|>= 0
train|grad-clip|nan|>= 0
train|guard-z|-1|in [0, 1e+06]
train|checkpoint-keep|0|>= 1
train|prune-sparsity|1|in [0, 1)
train|zero|4|0..3
train|loss-scale|inf|a finite number > 0
train|beta2|1|in [0, 1)
train|straggler-window|2|3..1024
eval|batches|-1|>= 0
eval|seq|0|1..1048576
sample|tokens|-3|0..1073741824
sample|temperature|-1|in [0, 1e+30)
sample|top-k|-1|>= 0
prepare|val-fraction|1|in [0, 1)
bench peak|seconds|0|> 0
run|restarts|-1|>= 0
compress prune|multiple|0|1..4096
compress lowrank|energy|1.5|in (0, 1]
tokenizer encode|max-input|0|>= 1
tokenizer train|vocab|100|>= 257
EOF
    # --help shows each limit
    run train --help
    expect_out_re '--steps N .*; >= 0\)$'
    expect_out_re '--threads N .*; 0\.\.4096\)$'
}

# A --warmup longer than the schedule never lets the learning rate reach --lr; it used to
# be taken without a word. The schedule is --lr-total-steps when given, else --steps. The
# default warmup (10 steps) stays silent with a shorter run.
case_warmup_longer_than_schedule() {
    need_fixture
    train --steps 20 --warmup 50 --save ""
    expect_usage
    expect_err "--warmup 50" "--steps 20"
    train --steps 20 --lr-total-steps 30 --warmup 40 --save ""
    expect_usage
    expect_err "--warmup 40" "--lr-total-steps 30"
    train --steps 10 --warmup 11 --save ""
    expect_usage
    # A warmup as long as the schedule reaches --lr at its last step.
    train --steps 3 --warmup 3 --save ""
    expect_ok
    train --steps 3 --lr-total-steps 60 --warmup 50 --save ""
    expect_ok
    train --save ""
    expect_ok
    check "the default warmup with a 3-step run says nothing" \
        sh -c "! grep -q -i warmup '$W/stderr'"
}

# A prompt longer than the model's context is refused up front with both counts, not cut
# to its tail.
case_long_prompt() {
    need_fixture
    p40=$(head -c 40 "$FIX/in/doc_01.txt")
    run sample --weights "$GOOD" --tokens 5 --tokenizer bytes --prompt "$p40"
    expect_fail
    expect_err "40 tokens" "context of 32"
    not_generated
    p32=$(head -c 32 "$FIX/in/doc_01.txt")
    run sample --weights "$GOOD" --tokens 5 --tokenizer bytes --prompt "$p32"
    expect_ok
}

# A tokenizer smaller than the model's vocabulary is refused before generating, naming both;
# it used to fail in the middle of the text, when the model drew an id it lacks.
case_small_tokenizer() {
    need_fixture
    run train $TINY --seq 16 --batch 2 --steps 1 --data "$DATA300" --save m296.safetensors
    expect_ok
    for seed in 1 2 3; do
        run sample --weights m296.safetensors --tokens 40 --tokenizer bytes --seed "$seed"
        expect_fail
        expect_err "bytes" "256" "296"
        not_generated
    done
}

# --eval-every without validation data is an error; validation data without --eval-every is
# evaluated after the last step (it used to be opened, checked, and never evaluated).
case_eval_flags() {
    need_fixture
    train --eval-every 2 --save ""
    expect_usage
    expect_err "--eval-every" "--val-data"
    train --val-data "$VAL" --metrics m.jsonl --save ""
    expect_ok
    expect_out_re '^step +3/3 .*val [0-9.]+'
    check "the last metrics line has val_loss" sh -c "tail -n 1 m.jsonl | grep -q '\"val_loss\"'"
    check "earlier lines have none" sh -c "! head -n 2 m.jsonl | grep -q '\"val_loss\"'"
    run train --help
    expect_out_re 'after the last step'
}

# More threads than cores: the same numbers, many times slower; kiln says so, naming the
# cores (it used to accept them without a word).
case_threads_above_cores() {
    need_fixture
    cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
    if [ "$cores" -gt 32 ]; then
        echo "skipped: $cores cores; the case would start too many threads"
        return 77
    fi
    t=$((cores * 4))
    train --threads "$t" --steps 1 --save ""
    expect_ok
    expect_err "warning" "--threads $t" "$cores cores"
    train --threads "$cores" --steps 1 --save ""
    expect_ok
    check "no warning at --threads $cores" sh -c "! grep -q -i warning '$W/stderr'"
    OMP_NUM_THREADS=$t train --steps 1 --save ""
    expect_ok
    expect_err "OMP_NUM_THREADS=$t" "$cores cores"
}

# A plan that cannot fit fails before anything is allocated or measured, with the planned
# bytes, the available bytes and a hint (gpt2-1558m used to run 76 s to 18.6 GB first).
case_plan_too_large() {
    need_fixture
    CMD_TIMEOUT=20
    # 1024 layers of 65536 channels: hundreds of terabytes, more than any machine.
    run train --layers 1024 --heads 512 --embd 65536 --context 32 --seq 16 --batch 2 --steps 1 \
        --data "$DATA" --save w.safetensors
    expect_fail
    expect_err "planned" "available" "parameters" "gradients" "optimizer" "activations" "--batch"
    check "nothing was trained or measured first" sh -c "! grep -q -E '^(step|compute)' '$W/stdout'"
    check "nothing was saved" test ! -e w.safetensors
    # GPT-2 1558M (23.3 GiB with AdamW at B=4, T=64, and 1.4 GiB of headroom) on a machine
    # with less than that free.
    avail=$(awk '/^(MemAvailable|SwapFree):/ { s += $2 } END { print s + 0 }' /proc/meminfo)
    if [ "$avail" -gt 0 ] && [ "$avail" -lt 25000000 ]; then
        run train --model gpt2-1558m --seq 64 --batch 4 --steps 1 --data "$DATA" \
            --save w.safetensors
        expect_fail
        expect_err "planned" "available" "--batch"
        check "nothing was trained or measured first" \
            sh -c "! grep -q -E '^(step|compute)' '$W/stdout'"
    fi
}

# Failures to write say why: no space, a folder, a FIFO that nobody reads (which used to
# block the run).
case_write_errors_say_why() {
    need_fixture
    CMD_TIMEOUT=10
    if [ -c /dev/full ]; then
        # metrics that cannot be written do not stop the run: a warning, and the lines are
        # kept and written elsewhere at the end
        TMPDIR=$W train --metrics /dev/full --save ""
        expect_ok
        expect_err "warning: cannot write metrics to /dev/full" "No space left on device" \
            "training goes on"
        expect_err_re "3 line\(s\) that /dev/full would not take are in .*full.unwritten-"
        check "no warning on stdout alone" sh -c "! grep -q warning '$W/stdout'"
        check "the kept lines are in the temporary folder" sh -c "grep -c '\"step\"' $W/full.unwritten-* | grep -qx 3"
        run_to /dev/full sample --weights "$GOOD" --tokens 5
        expect_fail
        expect_err "No space left on device"
        run_to /dev/full eval --weights "$GOOD" --data "$VAL" --batch 2 --seq 16
        expect_fail
        expect_err "No space left on device"
    fi
    mkdir m.jsonl
    train --metrics m.jsonl --save ""
    expect_fail
    expect_err "m.jsonl" "Is a directory"
    train --metrics nodir/m.jsonl --save ""
    expect_fail
    expect_err "nodir/m.jsonl" "No such file or directory"
    mkfifo fifo.jsonl
    train --metrics fifo.jsonl --save ""
    expect_fail
    expect_err "fifo.jsonl" "FIFO"
    if [ "$(id -u)" -ne 0 ]; then
        mkdir ro
        chmod 500 ro
        train --metrics ro/m.jsonl --save ""
        expect_fail
        expect_err "ro/m.jsonl" "Permission denied"
        chmod 700 ro
    fi
}

main "$@"
