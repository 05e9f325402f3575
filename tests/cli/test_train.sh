#!/bin/sh
# kiln train on good input: the console lines, the metrics file, saved weights that kiln
# eval reads back, bit-identical reruns, and a warm start from saved weights (--init).
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

# close A B TOL: |A - B| <= TOL, both numbers.
close() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && b != "" && d <= t) }'; }

# nth FILE KEY N: the Nth value of KEY in a metrics file.
nth() { field "$1" "$2" | sed -n "$3p"; }

# Every optimizer learns (60 steps from ln 256 = 5.55 to a mean of the last five below 4.05,
# where they all reach about 3.3), and every flag changes what it should: the same seed gives
# the same first step whatever the optimizer, and each choice a different second step.
case_optimizers_learn() {
    need_fixture
    for o in adamw:1e-2 adam:1e-2 sgd:0.5 rmsprop:2e-3; do
        run train $TINY --seq 16 --batch 2 --steps 60 --warmup 5 --optimizer "${o%%:*}" \
            --lr "${o#*:}" --data "$DATA" --metrics "${o%%:*}.jsonl" --save ""
        expect_ok
        first=$(nth "${o%%:*}.jsonl" loss 1)
        last=$(field "${o%%:*}.jsonl" loss | tail -n 5 | awk '{ s += $1 } END { if (NR == 5) print s / 5 }')
        if awk -v f="$first" -v l="$last" 'BEGIN { exit !(f != "" && l != "" && l < f - 1.5) }'; then
            ok "${o%%:*} learns: loss $first -> $last (mean of the last 5 steps)"
        else
            bad "${o%%:*} learns: loss '$first' -> '$last' (mean of the last 5), wanted a fall of 1.5"
        fi
    done
    run train $TINY --seq 16 --batch 2 --steps 60 --warmup 5 --optimizer sgd --nesterov \
        --momentum 0.5 --lr 0.5 --data "$DATA" --metrics nesterov.jsonl --save ""
    expect_ok
    for o in adam sgd rmsprop nesterov; do
        if [ "$(nth adamw.jsonl loss 1)" = "$(nth $o.jsonl loss 1)" ]; then
            ok "$o: the same first loss as adamw (same seed, same batch, same init)"
        else
            bad "$o: the same first loss as adamw: $(nth $o.jsonl loss 1) vs $(nth adamw.jsonl loss 1)"
        fi
    done
    for pair in adamw:adam adam:rmsprop sgd:nesterov; do
        a=$(nth "${pair%%:*}.jsonl" loss 2)
        b=$(nth "${pair#*:}.jsonl" loss 2)
        if [ -n "$a" ] && [ "$a" != "$b" ]; then
            ok "${pair%%:*} and ${pair#*:} take different first steps ($a vs $b)"
        else
            bad "${pair%%:*} and ${pair#*:} take different first steps: '$a' vs '$b'"
        fi
    done
}

# The learning rate of each step is the schedule's (include/kiln/optim.h), as written in the
# metrics: lr (s+1)/w during the warmup (steps s < w, from 0), then lr (constant), or
# min + c (lr - min) with c = (1 + cos(pi f))/2 (cosine) or 1 - f (linear), f = (s-w)/(N-w),
# min = lr x --min-lr-frac.
case_schedules() {
    need_fixture
    for s in constant cosine linear; do
        run train $TINY --seq 16 --batch 2 --steps 10 --schedule "$s" --warmup 3 --lr 2e-3 \
            --min-lr-frac 0.25 --data "$DATA" --metrics "$s.jsonl" --save ""
        expect_ok
        if field "$s.jsonl" lr | awk -v kind="$s" '
            BEGIN { lr = 2e-3; min = lr * 0.25; w = 3; n = 10; pi = atan2(0, -1); bad = 0 }
            {
                s = NR - 1
                if (s < w) want = lr * (s + 1) / w
                else if (kind == "constant") want = lr
                else {
                    f = (s - w) / (n - w)
                    c = kind == "cosine" ? (1 + cos(pi * f)) / 2 : 1 - f
                    want = min + c * (lr - min)
                }
                d = $1 - want; if (d < 0) d = -d
                if (d > 1e-5 * want) { print "step " NR ": lr " $1 ", want " want; bad = 1 }
            }
            END { exit bad || NR != n }' >"$s.check"; then
            ok "$s: the learning rate of each of 10 steps follows the schedule"
        else
            bad "$s: the learning rate follows the schedule: $(head -n 3 "$s.check" | tr '\n' ' ')"
        fi
    done
}

# --grad-accum 3 averages three micro-batches: with lr 0 (the weights stay put) its first
# loss is the mean of the first three losses of a run without accumulation. --grad-clip 0
# turns clipping off: the norm reported is the same (it is taken before clipping), and since
# it is above 1, the second step of SGD differs from a clipped run's.
case_accumulation_and_clipping() {
    need_fixture
    run train $TINY --seq 16 --batch 2 --steps 3 --lr 0 --data "$DATA" --metrics one.jsonl --save ""
    expect_ok
    run train $TINY --seq 16 --batch 2 --steps 1 --lr 0 --grad-accum 3 --data "$DATA" \
        --metrics three.jsonl --save ""
    expect_ok
    mean=$(field one.jsonl loss | awk '{ s += $1 } END { if (NR == 3) printf "%.6f", s / 3 }')
    got=$(nth three.jsonl loss 1)
    if close "$got" "$mean" 2e-6; then
        ok "--grad-accum 3: the loss $got is the mean of three micro-batches' ($mean)"
    else
        bad "--grad-accum 3: the loss '$got' is the mean of three micro-batches' ('$mean')"
    fi
    for c in 0 1; do
        run train $TINY --seq 16 --batch 2 --steps 2 --optimizer sgd --lr 0.5 --warmup 0 \
            --grad-clip "$c" --data "$DATA" --metrics "clip$c.jsonl" --save ""
        expect_ok
    done
    n0=$(nth clip0.jsonl grad_norm 1)
    n1=$(nth clip1.jsonl grad_norm 1)
    if [ -n "$n0" ] && [ "$n0" = "$n1" ] && awk -v n="$n0" 'BEGIN { exit !(n > 1) }'; then
        ok "the first norm ($n0) is reported before clipping, and is above 1"
    else
        bad "the first norm is the same with and without clipping and above 1: '$n0' vs '$n1'"
    fi
    l0=$(nth clip0.jsonl loss 2)
    l1=$(nth clip1.jsonl loss 2)
    if [ -n "$l0" ] && [ "$l0" != "$l1" ]; then
        ok "--grad-clip 0 changes the second step ($l0 unclipped, $l1 clipped)"
    else
        bad "--grad-clip 0 changes the second step: '$l0' vs '$l1'"
    fi
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

# Weights saved by one run start the next (a warm start: the weights only, not the optimizer
# or the data position). With lr 0 the weights stay put, so the run saves the --init
# weights bit for bit, and its validation loss after step 1 is the loss kiln eval gives the
# --init weights. A warm start with lr > 0 takes its first step from the same weights on
# the same batch (the same seed): its first loss is the lr-0 run's, to the last digit, and
# far below a fresh model's.
case_warm_start_from_init() {
    need_fixture
    run train $TINY --seq 32 --batch 4 --steps 60 --lr 1e-2 --warmup 5 --data "$DATA" \
        --metrics a.jsonl --save a.safetensors
    expect_ok
    # No model flags: the architecture comes from the weights.
    run train --seq 32 --batch 4 --steps 1 --lr 0 --warmup 0 --schedule constant --seed 9 \
        --peak-gflops 100 --init a.safetensors --data "$DATA" --val-data "$VAL" --eval-every 1 \
        --eval-batches 20 --metrics z.jsonl --save z.safetensors
    expect_ok
    expect_out_re '^model: 2 layers, 2 heads, 32 channels, vocabulary 256 .*context 32'
    check "lr 0 from --init saves the --init weights bit for bit" same_file a.safetensors z.safetensors
    run eval --weights a.safetensors --data "$VAL" --batch 4 --seq 32 --batches 20
    expect_ok
    e=$(sed -n 's/.*| loss \([0-9.]*\) |.*/\1/p' "$W/stdout")
    v=$(nth z.jsonl val_loss 1)
    if close "$e" "$v" 2e-6; then
        ok "kiln eval of the --init weights ($e) is the run's validation loss ($v)"
    else
        bad "kiln eval of the --init weights ('$e') is the run's validation loss ('$v')"
    fi
    run train --seq 32 --batch 4 --steps 3 --lr 1e-4 --warmup 0 --schedule constant --seed 9 \
        --peak-gflops 100 --init a.safetensors --data "$DATA" --metrics b.jsonl --save b.safetensors
    expect_ok
    a_first=$(nth a.jsonl loss 1)
    z_first=$(nth z.jsonl loss 1)
    b_first=$(nth b.jsonl loss 1)
    if [ -n "$b_first" ] && [ "$b_first" = "$z_first" ] &&
        awk -v f="$a_first" -v b="$b_first" 'BEGIN { exit !(f != "" && b < f - 2) }'; then
        ok "the warm start's first loss $b_first is that of the --init weights (fresh: $a_first)"
    else
        bad "the warm start's first loss '$b_first' is the --init weights' '$z_first' and far below the fresh '$a_first'"
    fi
    check "the warm start changed the weights" sh -c "! cmp -s a.safetensors b.safetensors"
}

main "$@"
