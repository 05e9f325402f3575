#!/bin/sh
# --device: where the trainer's slabs live. Here (no GPU needed): a run asking for the GPU where
# none can be used says why, names the CPU, and writes no file; what the GPU trainer does not do
# is refused the same way on every machine; an unknown device is a usage error; --plan shows
# the GPU's part. The GPU trainer reaches the model's and optimizer's slabs only through the
# backend's copies (initial weights, --init, checkpoints, resume, --save): with
# KILN_TRAIN_HOST_STAGING=1 the CPU trainer takes those same paths, and every byte it writes
# must equal the direct path's. The GPU run itself is tests/gpu/test_cuda_train.sh.
. "$(dirname "$0")/lib.sh"

TRAIN="train $TINY --seq 16 --batch 2 --threads 1 --data $DATA"

# gpu_usable: whether this kiln can train on a GPU here (then the refusal cases cannot run)
gpu_usable() {
    "$KILN" train $TINY --seq 16 --batch 2 --data "$DATA" --steps 0 --device cuda \
        >/dev/null 2>&1
}

case_cuda_unavailable() {
    need_fixture
    if gpu_usable; then
        echo "SKIP: a GPU is usable here (tests/gpu/test_cuda_train.sh checks the GPU run)"
        exit 77
    fi
    printf 'good weights\n' >w.safetensors
    cp w.safetensors before
    run $TRAIN --steps 3 --device cuda --save w.safetensors --metrics m.jsonl \
        --checkpoint-dir ck --checkpoint-every 1
    expect_fail
    expect_err_re 'no NVIDIA driver|no CUDA GPU|built without CUDA|compute capability|update the driver|not built for GPU'
    expect_err_re 'CPU'
    check "the --save file is as it was" same_file w.safetensors before
    check "no metrics file" test ! -e m.jsonl
    check "no checkpoint folder" test ! -e ck
}

case_cuda_refuses_unsupported() {
    need_fixture
    # refused before the GPU is asked for: the same on every machine
    run $TRAIN --steps 3 --device cuda --prune-sparsity 0.5 --save w.st
    expect_fail
    expect_err "pruning" "--device cpu"
    run $TRAIN --steps 3 --device cuda --qat 8 --save w.st
    expect_fail
    expect_err "quantization-aware" "--device cpu"
    run $TRAIN --steps 3 --device cuda --teacher "$GOOD" --save w.st
    expect_fail
    expect_err "distillation" "--device cpu"
    check "nothing saved" test ! -e w.st
}

# kiln eval and kiln sample on the GPU: without one, the reason and the CPU named, exit 1; an
# unknown device or --teacher on the GPU: usage errors. The GPU run is test_cuda_train.sh's.
case_eval_sample_device() {
    need_fixture
    run train $TINY --seq 16 --batch 2 --threads 1 --data "$DATA" --steps 2 --save w.st
    expect_ok
    if gpu_usable; then
        echo "SKIP: a GPU is usable here (tests/gpu/test_cuda_train.sh checks eval and sample on it)"
        exit 77
    fi
    run eval --weights w.st --data "$DATA" --batch 2 --seq 16 --device cuda
    expect_rc 1
    expect_err_re 'no NVIDIA driver|no CUDA GPU|built without CUDA|compute capability|update the driver|not built for GPU'
    expect_err_re 'CPU|cpu'
    run sample --weights w.st --tokens 4 --device cuda
    expect_rc 1
    expect_err_re 'no NVIDIA driver|no CUDA GPU|built without CUDA|compute capability|update the driver|not built for GPU'
    run eval --weights w.st --data "$DATA" --batch 2 --seq 16 --device tpu
    expect_usage
    expect_err "--device is cpu or cuda" "tpu"
    run sample --weights w.st --tokens 4 --device tpu
    expect_usage
    run eval --weights w.st --data "$DATA" --batch 2 --seq 16 --device cuda --teacher w.st
    expect_usage
    expect_err "--teacher"
    run eval --weights w.st --data "$DATA" --batch 2 --seq 16 --device cpu
    expect_ok
}

case_unknown_device() {
    need_fixture
    run $TRAIN --steps 3 --device tpu --save w.st
    expect_usage
    expect_err "--device is cpu or cuda" "tpu"
    check "nothing saved" test ! -e w.st
}

case_plan_shows_gpu_part() {
    need_fixture
    run $TRAIN --plan --device cuda --precision bf16
    expect_ok
    expect_out_re 'on the GPU: [0-9.]+ (MiB|GiB)'
    expect_out_re 'on the host: [0-9.]+ (MiB|GiB)'
    run $TRAIN --plan
    expect_ok
    if grep -q 'on the GPU' "$W/stdout"; then bad "a CPU plan has no GPU part"; else ok "a CPU plan has no GPU part"; fi
}

# staged_same ARGS...: a run direct and through host copies: the same metrics' losses and norms,
# saved weights and checkpoint files; then resumed from its step-3 checkpoint, staged, to the
# same saved bytes.
staged_same() {
    run $TRAIN --steps 6 --save d.st --metrics d.jsonl --checkpoint-dir ckd --checkpoint-every 3 "$@"
    expect_ok
    KILN_TRAIN_HOST_STAGING=1
    export KILN_TRAIN_HOST_STAGING
    run $TRAIN --steps 6 --save s.st --metrics s.jsonl --checkpoint-dir cks --checkpoint-every 3 "$@"
    expect_ok
    sed 's/"ms".*//' d.jsonl >d.cut
    sed 's/"ms".*//' s.jsonl >s.cut
    check "the same losses and gradient norms at each of 6 steps" same_file d.cut s.cut
    check "the same saved weights" same_file d.st s.st
    for f in model.safetensors optim_rank0.bin; do
        check "checkpoint step 6: the same $f" same_file ckd/step_00000006/$f cks/step_00000006/$f
    done
    rm -r cks/step_00000006
    printf 'step_00000003\n' >cks/latest
    run $TRAIN --steps 6 --save r.st --checkpoint-dir cks --checkpoint-every 3 --resume cks "$@"
    expect_ok
    expect_out_re 'resumed from cks/step_00000003: step 3 of 6'
    check "resumed through host copies: the same saved weights" same_file d.st r.st
    # starting weights from a file (--init) through host copies
    run $TRAIN --steps 2 --init d.st --save i2.st "$@"
    expect_ok
    unset KILN_TRAIN_HOST_STAGING
    run $TRAIN --steps 2 --init d.st --save i1.st "$@"
    expect_ok
    check "--init through host copies: the same saved weights" same_file i1.st i2.st
}

case_host_staging_fp32() {
    need_fixture
    staged_same
}

case_host_staging_bf16() {
    need_fixture
    staged_same --precision bf16 --stochastic-rounding
}

case_host_staging_fp16() {
    need_fixture
    staged_same --precision fp16
}

main "$@"
