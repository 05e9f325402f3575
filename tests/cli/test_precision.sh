#!/bin/sh
# Precision and memory: bf16 and fp16 training close to fp32, fp16's loss scaling (an
# overflow skipped, a collapsed scale stopping the run with the last good weights kept),
# weights saved in any dtype and read back in any, a file whose declared dtype disagrees with
# a tensor refused, --plan, and recomputation giving the same numbers.
. "$(dirname "$0")/lib.sh"

TRAIN="train $TINY --seq 16 --batch 2 --threads 1 --data $DATA"

# losses FILE: the loss column of a metrics file, one per line.
losses() { sed -n 's/.*"loss": *\([^,}]*\).*/\1/p' "$1"; }

case_precisions_agree() {
    need_fixture
    for p in fp32 bf16 fp16; do
        run $TRAIN --steps 8 --precision $p --metrics m_$p.jsonl --save ""
        expect_ok
    done
    # the same data, seed and model: bf16 and fp16 losses within 1% of fp32's at every step
    if paste -d' ' m_fp32.jsonl m_bf16.jsonl m_fp16.jsonl >/dev/null &&
        losses m_fp32.jsonl >l32 && losses m_bf16.jsonl >l16b && losses m_fp16.jsonl >l16h &&
        paste l32 l16b l16h | awk '{ for (i = 2; i <= 3; i++) { d = ($i - $1) / $1; if (d < 0) d = -d; if (d > 0.01) bad = 1 } n++ }
            END { exit bad || n != 8 }'; then
        ok "bf16 and fp16 losses within 1% of fp32's at each of 8 steps"
    else
        bad "bf16 and fp16 losses within 1% of fp32's: $(paste l32 l16b l16h | tr '\t\n' ' ;')"
    fi
    check "bf16 is not fp32 (the precision took effect)" sh -c "! cmp -s l32 l16b"
}

case_fp16_overflow_skipped() {
    need_fixture
    run $TRAIN --steps 5 --precision fp16 --inject-nonfinite 3 --metrics m.jsonl --save w.safetensors
    expect_ok
    expect_out_re 'overflow: step skipped'
    check "step 3 is marked skipped with the scale halved" \
        grep -q '"step": 3,.*"loss_scale": 32768, "skipped": 1' m.jsonl
    check "steps after it run at the lower scale" grep -q '"step": 5,.*"loss_scale": 32768, "skipped": 0' m.jsonl
    check "the run saved its weights" test -s w.safetensors
}

case_loss_scale_collapse() {
    need_fixture
    run $TRAIN --steps 4 --precision fp16 --metrics m.jsonl --save w.safetensors --save-every 1
    expect_ok
    cp w.safetensors before.safetensors
    # a starting scale just above the minimum (2^-14): one overflow takes it below
    run $TRAIN --steps 4 --precision fp16 --loss-scale 0.0001 --inject-nonfinite 2 \
        --save w.safetensors --save-every 1
    expect_fail
    expect_err "loss scale" "minimum"
    check "the last good weights (of step 1) are kept, not replaced by a bad step's" \
        sh -c "test -s w.safetensors && ! cmp -s w.safetensors before.safetensors"
    run eval --weights w.safetensors --data "$VAL" --batch 1 --seq 16
    expect_ok
}

case_save_dtypes() {
    need_fixture
    for d in fp32 bf16 fp16; do
        run $TRAIN --steps 2 --precision bf16 --save w_$d.safetensors --save-dtype $d
        expect_ok
    done
    s32=$(wc -c <w_fp32.safetensors) s16=$(wc -c <w_bf16.safetensors)
    check "bf16 weights take about half the bytes of fp32's" test $((s16 * 2)) -lt $((s32 + 4096))
    check "the file records its dtype" grep -a -q '"kiln.dtype":"bf16"' w_bf16.safetensors
    for d in fp32 bf16 fp16; do
        for p in fp32 bf16; do
            run eval --weights w_$d.safetensors --data "$VAL" --batch 1 --seq 16 --precision $p
            expect_ok
        done
    done
    # fp32 weights of a bf16 run are its master weights: not all bf16 values
    run $TRAIN --steps 2 --precision bf16 --save m.safetensors --save-dtype fp32 --init w_fp32.safetensors
    expect_ok
}

case_declared_dtype_mismatch() {
    need_fixture
    run $TRAIN --steps 1 --save w.safetensors --save-dtype fp32
    expect_ok
    # the header says bf16 but the tensors are F32: refused, naming a tensor
    st_edit_header w.safetensors lie.safetensors 's/"kiln.dtype":"fp32"/"kiln.dtype":"bf16"/' ||
        bad "the header can be edited"
    run eval --weights lie.safetensors --data "$VAL" --batch 1 --seq 16
    expect_fail
    expect_err "lie.safetensors" "bf16" "F32" "tensor"
}

case_plan() {
    need_fixture
    run train --model gpt2-124m --plan --batch 4 --seq 64 --precision bf16 --data "$DATA"
    expect_ok
    for w in parameters gradients "master weights" "optimizer moments" activations workspace; do
        check "--plan shows $w" grep -q "$w" "$W/stdout"
    done
    expect_out_re 'largest batch that fits at T=64: B=[0-9]+'
    check "--plan allocates nothing: no step ran" sh -c "! grep -q '^step' '$W/stdout'"
    run train --model gpt2-1558m --plan --batch 8 --seq 1024 --plan-memory 8G --data "$DATA"
    expect_ok
    expect_out_re 'does not fit, [0-9.]+ GiB short'
    run train --model gpt2-124m --plan --plan-memory lots --data "$DATA"
    expect_usage
}

case_recompute_same_numbers() {
    need_fixture
    for r in none gelu attention block; do
        run $TRAIN --steps 4 --recompute $r --metrics m_$r.jsonl --save w_$r.safetensors
        expect_ok
    done
    for r in gelu attention block; do
        check "--recompute $r gives the losses of none" sh -c "losses() { sed -n 's/.*\"loss\": *\([^,}]*\).*/\1/p' \"\$1\"; }; [ \"\$(losses m_none.jsonl)\" = \"\$(losses m_$r.jsonl)\" ]"
        check "--recompute $r gives the weights of none" cmp -s w_none.safetensors w_$r.safetensors
    done
}

case_bad_precision_flags() {
    need_fixture
    run $TRAIN --steps 1 --precision fp8
    expect_usage
    expect_err "fp8"
    run $TRAIN --steps 1 --recompute everything
    expect_usage
    run $TRAIN --steps 1 --save-dtype int8
    expect_usage
    run $TRAIN --steps 1 --classifier-chunk -3
    expect_usage
    run $TRAIN --steps 1 --precision fp16 --loss-scale 0
    expect_usage
}

# --plan for rank 0 of N data-parallel ranks: each ZeRO stage holds less per rank
case_plan_ranks() {
    need_fixture
    last=0
    for z in 0 1 2 3; do
        run train --model gpt2-774m --plan --batch 1 --seq 64 --zero $z --plan-ranks 4 \
            --plan-memory 64G --data "$DATA"
        expect_ok
        mib=$(sed -n 's/^memory plan: .*(B=1, T=64): \([0-9.]*\) MiB.*/\1/p' "$W/stdout")
        if [ -n "$mib" ] && { [ "$last" = 0 ] || awk -v a="$mib" -v b="$last" 'BEGIN { exit !(a < b) }'; }; then
            ok "ZeRO $z plans $mib MiB per rank (less than the stage before: $last)"
        else
            bad "ZeRO $z plans less per rank than the stage before ($mib against $last)"
        fi
        last=$mib
    done
    run train --model gpt2-124m --plan --plan-ranks -1 --data "$DATA"
    expect_usage
}

main "$@"
