#!/bin/sh
# kiln train on good input: the console lines, the metrics file, saved weights that kiln
# eval reads back, bit-identical reruns, and resuming from saved weights.
. "$(dirname "$0")/lib.sh"

# check_metrics FILE STEPS EVAL_STEPS: FILE holds STEPS JSON objects, one per line, with
# step = 1..STEPS and numeric loss, lr, grad_norm, ms, tokens_per_s, mfu; val_loss exactly
# on the steps listed in EVAL_STEPS (space-separated). The objects are flat (string keys,
# number or string values), which a regular expression checks exactly.
check_metrics() {
    if awk -v steps="$2" -v evals=" $3 " '
        BEGIN {
            num = "-?(0|[1-9][0-9]*)([.][0-9]+)?([eE][-+]?[0-9]+)?"
            pair = "\"[a-z_]+\" *: *(" num "|\"[^\"\\\\]*\")"
            re = "^[{] *" pair "( *, *" pair ")* *[}]$"
            nreq = split("step loss lr grad_norm ms tokens_per_s mfu", req, " ")
            bad = 0
        }
        function fail(msg) { print "metrics line " NR ": " msg; bad = 1 }
        {
            if ($0 !~ re) { fail("not a flat JSON object of numbers: " $0); next }
            body = substr($0, 2, length($0) - 2)
            n = split(body, kv, ",")
            delete val
            for (i = 1; i <= n; i++) {
                p = index(kv[i], ":")
                k = substr(kv[i], 1, p - 1); v = substr(kv[i], p + 1)
                gsub(/[ "]/, "", k); gsub(/ /, "", v)
                if (k in val) fail("key " k " twice")
                val[k] = v
            }
            for (i = 1; i <= nreq; i++)
                if (!(req[i] in val)) fail("no \"" req[i] "\"")
                else if (val[req[i]] !~ ("^" num "$")) fail(req[i] " is not a number")
            if (val["step"] != NR) fail("step is " val["step"] ", expected " NR)
            want = index(evals, " " NR " ") > 0
            if (want && !("val_loss" in val)) fail("no val_loss on an evaluation step")
            if (!want && ("val_loss" in val)) fail("val_loss on a step without evaluation")
            if (val["loss"] + 0 <= 0 || val["loss"] + 0 > 20) fail("loss " val["loss"] " is implausible")
        }
        END {
            if (NR != steps) { print "metrics: " NR " lines, expected " steps; bad = 1 }
            exit bad
        }' "$1" >"$W/metrics.check"; then
        ok "metrics file $1: $2 valid lines, val_loss on steps: $3"
    else
        bad "metrics file $1 is valid: $(head -n 3 "$W/metrics.check")"
    fi
}

# field FILE KEY: the KEY values of a metrics file, one per line, as written.
field() { sed -n "s/.*\"$2\": *\\([^,}]*\\).*/\\1/p" "$1"; }

case_tiny_run() {
    need_fixture
    run train $TINY --seq 16 --batch 2 --steps 3 --threads 1 --data "$DATA" --val-data "$VAL" \
        --eval-every 2 --metrics m.jsonl --save out/sub/w.safetensors
    expect_ok
    plan=$(grep -n '^memory plan: ' "$W/stdout" | head -n 1 | cut -d: -f1)
    first=$(grep -n -E '^step +1/3 ' "$W/stdout" | head -n 1 | cut -d: -f1)
    if [ -n "$plan" ] && [ -n "$first" ] && [ "$plan" -lt "$first" ]; then
        ok "the memory plan line comes before step 1"
    else
        bad "the memory plan line comes before step 1 (plan at line '$plan', step 1 at '$first')"
    fi
    check "the plan line gives parameters, gradients, optimizer and activations" \
        grep -q -E '^memory plan: parameters .* gradients .* optimizer .* activations ' "$W/stdout"
    steps=$(grep -E '^step +[0-9]+/3 ' "$W/stdout" | sed 's/^step *\([0-9]*\)\/.*/\1/' | tr '\n' ' ')
    if [ "$steps" = "1 2 3 " ]; then ok "one console line per step"; else bad "console step lines 1 2 3, got: $steps"; fi
    check "evaluation steps show the validation loss" grep -q -E '^step +2/3 .*val [0-9.]+' "$W/stdout"
    check "step 1 shows no validation loss" sh -c "! grep -E '^step +1/3 .*val ' '$W/stdout'"
    expect_out_re '^saved weights to out/sub/w.safetensors'
    check_metrics m.jsonl 3 "2 3"
    check "the weights were saved (into a new folder)" test -s out/sub/w.safetensors
    check "the weights start with a safetensors header" sh -c "head -c 9 out/sub/w.safetensors | tail -c 1 | grep -q '{'"
    no_temp_files out/sub
    run eval --weights out/sub/w.safetensors --data "$VAL" --batch 2 --seq 16
    expect_ok
    expect_out_re 'loss [0-9]+\.[0-9]+ \| perplexity [0-9]+'
}

case_metrics_without_eval() {
    need_fixture
    run train $TINY --seq 16 --batch 2 --steps 4 --data "$DATA" --metrics m.jsonl --save ""
    expect_ok
    check_metrics m.jsonl 4 ""
    check "--save '' writes no weights" sh -c "! ls '$W' | grep -q safetensors"
    # Every 3 steps and after the last.
    run train $TINY --seq 16 --batch 2 --steps 4 --data "$DATA" --val-data "$VAL" --eval-every 3 \
        --metrics m2.jsonl --save ""
    expect_ok
    check_metrics m2.jsonl 4 "3 4"
}

case_save_every() {
    need_fixture
    run train $TINY --seq 16 --batch 2 --steps 4 --save-every 2 --data "$DATA" --save w.safetensors
    expect_ok
    expect_out_re '^saved weights to w.safetensors \(step 2\)'
    expect_out_re '^saved weights to w.safetensors \(step 4\)'
    check "the weights exist" test -s w.safetensors
    no_temp_files .
}

case_optimizers_and_schedules() {
    need_fixture
    for o in adamw adam sgd rmsprop; do
        run train $TINY --seq 16 --batch 2 --steps 3 --optimizer "$o" --data "$DATA" --save ""
        expect_ok
    done
    run train $TINY --seq 16 --batch 2 --steps 3 --optimizer sgd --nesterov --momentum 0.5 \
        --data "$DATA" --save ""
    expect_ok
    for s in constant cosine linear; do
        run train $TINY --seq 16 --batch 2 --steps 3 --schedule "$s" --warmup 1 --data "$DATA" --save ""
        expect_ok
    done
    run train $TINY --seq 16 --batch 2 --steps 2 --grad-accum 3 --grad-clip 0 --data "$DATA" --save ""
    expect_ok
}

case_model_json() {
    need_fixture
    printf '{"n_layer": 1, "n_head": 2, "n_embd": 16, "vocab_size": 256, "max_seq_len": 16}\n' >m.json
    run train --model m.json --seq 8 --batch 2 --steps 2 --peak-gflops 100 --data "$DATA" --save ""
    expect_ok
    expect_out_re '^model: 1 layers, 2 heads, 16 channels, vocabulary 256 .*context 16'
    printf '{"n_layer": 1, "n_head": 2,' >broken.json
    run train --model broken.json --seq 8 --data "$DATA" --save ""
    expect_fail
    expect_err "broken.json"
    run train --model nope.json --seq 8 --data "$DATA" --save ""
    expect_fail
    expect_err "nope.json"
    run train --model gpt2-9000m --seq 8 --data "$DATA" --save ""
    expect_fail
    expect_err "gpt2-9000m"
}

# Same seed and thread count: the same losses, norms and learning rates to the last digit,
# and the same weights to the bit. Two threads, so that the parallel reductions are in play.
case_determinism() {
    need_fixture
    for r in a b; do
        run train $TINY --seq 16 --batch 4 --steps 8 --threads 2 --seed 7 --lr 3e-3 --data "$DATA" \
            --val-data "$VAL" --eval-every 4 --eval-batches 3 --metrics "$r.jsonl" --save "$r.safetensors"
        expect_ok
    done
    for k in loss grad_norm lr val_loss; do
        field a.jsonl "$k" >"a.$k"
        field b.jsonl "$k" >"b.$k"
        if [ -s a."$k" ] && same_file "a.$k" "b.$k"; then
            ok "identical \"$k\" in both runs"
        else
            bad "identical \"$k\" in both runs: $(tr '\n' ' ' <a."$k") vs $(tr '\n' ' ' <b."$k")"
        fi
    done
    check "bit-identical saved weights" same_file a.safetensors b.safetensors
    run train $TINY --seq 16 --batch 4 --steps 8 --threads 2 --seed 8 --lr 3e-3 --data "$DATA" \
        --metrics c.jsonl --save c.safetensors
    expect_ok
    check "another seed gives other weights" sh -c "! cmp -s a.safetensors c.safetensors"
    field c.jsonl loss >c.loss
    check "another seed gives other losses" sh -c "! cmp -s a.loss c.loss"
}

# Weights saved by one run start the next: the first loss of the second run is close to
# the last loss of the first, far below the loss of a fresh model.
case_resume() {
    need_fixture
    run train $TINY --seq 32 --batch 4 --steps 60 --lr 1e-2 --warmup 5 --data "$DATA" \
        --metrics a.jsonl --save a.safetensors
    expect_ok
    # No model flags: the architecture comes from the weights.
    run train --seq 32 --batch 4 --steps 3 --lr 1e-4 --warmup 0 --schedule constant \
        --peak-gflops 100 --init a.safetensors --data "$DATA" --metrics b.jsonl --save b.safetensors
    expect_ok
    expect_out_re '^model: 2 layers, 2 heads, 32 channels, vocabulary 256 .*context 32'
    a_first=$(field a.jsonl loss | head -n 1)
    a_last=$(field a.jsonl loss | tail -n 1)
    b_first=$(field b.jsonl loss | head -n 1)
    if awk -v f="$a_first" -v l="$a_last" -v b="$b_first" \
        'BEGIN { d = b - l; if (d < 0) d = -d; exit !(f != "" && b != "" && d < 0.3 && b < f - 2) }'; then
        ok "resumed loss $b_first is close to the last loss $a_last (fresh: $a_first)"
    else
        bad "resumed loss '$b_first' is within 0.3 of the last loss '$a_last' and far below the fresh '$a_first'"
    fi
    # The same weights give the same loss through kiln eval.
    run eval --weights a.safetensors --data "$DATA" --batch 4 --seq 32 --batches 20
    expect_ok
    e=$(sed -n 's/.*| loss \([0-9.]*\) |.*/\1/p' "$W/stdout")
    if awk -v e="$e" -v l="$a_last" 'BEGIN { d = e - l; if (d < 0) d = -d; exit !(e != "" && d < 0.3) }'; then
        ok "kiln eval of the saved weights ($e) agrees with the last training loss ($a_last)"
    else
        bad "kiln eval of the saved weights ('$e') is within 0.3 of the last training loss ($a_last)"
    fi
}

main "$@"
