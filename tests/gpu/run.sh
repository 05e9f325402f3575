#!/usr/bin/env bash
# The CUDA backend on a GPU machine, in one go, from the repository root:
#
#   tests/gpu/run.sh            (KILN_GPU_BUDGET=seconds, default 480)
#
#   1. build kiln with CUDA (Release, -j16) into build-gpu: the library, the GPU tests and
#      the two CUDA benchmarks only
#   2. nvidia-smi
#   3. gpu.cuda_ops: every op against the reference backend, each op's max error in a table
#   4. gpu.cuda_model: the model on the GPU against the CPU model, three training steps;
#      gpu.train: `kiln train --device cuda` against the CPU trainer over 20 steps (fp32 and
#      bf16), bit-for-bit repeats and resume, the GPU's weights read on the CPU, a plan too
#      large for the GPU refused, and gpt2-124m at T=1024 through the trainer (tests/gpu/
#      test_cuda_train.sh)
#   5. gpu.comm_nccl: the NCCL communicator on one GPU, every collective against the host's
#      result; gpu.comm_nccl_np2: the same on two ranks under mpirun, one GPU each (SKIP with
#      fewer than two GPUs)
#   6. bench_cuda_ops: each op's time at GPT-2 124M's shapes, bf16, B=8 and B=16, T=1024,
#      TFLOP/s of the products and of attention
#   7. bench_cuda_train: a short gpt2-124m bf16 training run (B=16, T=1024, AdamW), tokens/s
#      and MFU against the H200 SXM's dense bf16 peak, 989 TFLOP/s
#
# Every step runs under a time limit cut to what is left of the budget, its output goes to
# the terminal and to build-gpu/logs/<step>.log, and its status (ok, FAIL with the exit
# code, SKIP, TIMEOUT, or "not run" when the budget or an earlier step stopped it) goes to
# the summary table printed at the end. The script exits 0 only when every step is ok, or
# n/a: a step this machine cannot run (the two-GPU test on a machine of one GPU).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 1
budget=${KILN_GPU_BUDGET:-480}
t_end=$((SECONDS + budget))
build=build-gpu
logs=$build/logs
mkdir -p "$logs"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}

names=()
states=()
times=()
notes=()

add() { names+=("$1"); states+=("$2"); times+=("$3"); notes+=("$4"); }

# step NAME LIMIT COMMAND...: run with the smaller of LIMIT and the budget left.
step() {
    local name=$1 limit=$2
    shift 2
    local left=$((t_end - SECONDS))
    if [ "$left" -lt 10 ]; then
        add "$name" "not run" 0 "the time budget (${budget}s) is spent"
        return 1
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo
    echo "=== $name (limit ${limit}s): $*"
    local t0=$SECONDS rc
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$logs/$name.log"
    rc=${PIPESTATUS[0]}
    local dt=$((SECONDS - t0)) note fails
    note=$(grep -a '^RESULT' "$logs/$name.log" | tail -1 | cut -c8-)
    [ -z "$note" ] && note=$(grep -a -v '^[[:space:]]*$' "$logs/$name.log" | tail -1 | cut -c1-100)
    if [ "$rc" -eq 0 ]; then
        add "$name" ok "$dt" "$note"
    elif [ "$rc" -eq 77 ]; then
        add "$name" SKIP "$dt" "$(grep -a -m1 'SKIP' "$logs/$name.log" | cut -c1-120)"
    elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        add "$name" TIMEOUT "$dt" "stopped after ${limit}s"
    else
        fails=$(grep -a -E 'FAIL|error|Error' "$logs/$name.log" | head -1 | cut -c1-100)
        [ -n "$fails" ] && note="$fails"
        add "$name" "FAIL($rc)" "$dt" "$note"
    fi
    return "$rc"
}

build_ok=0
if step configure 120 cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON; then
    if step build 240 cmake --build "$build" -j16 --target kiln kiln_cli test_cuda_ops \
        test_cuda_model bench_cuda_ops bench_cuda_train test_comm_nccl; then
        build_ok=1
    fi
else
    add build "not run" 0 "configure failed"
fi

step nvidia-smi 20 nvidia-smi

if [ "$build_ok" = 1 ]; then
    step gpu.cuda_ops 120 "$build/tests/test_cuda_ops"
    step gpu.cuda_model 90 "$build/tests/test_cuda_model"
    step gpu.train 170 sh tests/gpu/test_cuda_train.sh "$build/kiln" "$build/train-test"
    step gpu.comm_nccl 60 "$build/tests/test_comm_nccl"
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    if [ "$gpus" -ge 2 ]; then
        step gpu.comm_nccl_np2 70 env KILN_MPIRUN="${KILN_MPIRUN:-$(command -v mpirun)}" \
            sh tests/dist/run_mpi.sh 2 ok "$build/tests/test_comm_nccl"
    else
        add gpu.comm_nccl_np2 n/a 0 "$gpus GPU visible, and the test needs 2"
    fi
    step bench_cuda_ops_b8 60 "$build/bench_cuda_ops" 8 1024
    step bench_cuda_ops_b16 60 "$build/bench_cuda_ops" 16 1024
    # the run's own limit (50 s of steps) inside the step's, which adds model set-up
    step bench_cuda_train 110 "$build/bench_cuda_train" gpt2-124m 16 1024 40 50 989 bf16
else
    for n in gpu.cuda_ops gpu.cuda_model gpu.train gpu.comm_nccl gpu.comm_nccl_np2 bench_cuda_ops_b8 \
        bench_cuda_ops_b16 bench_cuda_train; do
        add "$n" "not run" 0 "the build failed"
    done
fi

echo
echo "=== summary (logs in $logs; MFU against 989 TFLOP/s, the H200 SXM's dense bf16 peak)"
printf '%-20s %-10s %6s  %s\n' step status seconds note
status=0
for i in "${!names[@]}"; do
    printf '%-20s %-10s %6s  %s\n' "${names[$i]}" "${states[$i]}" "${times[$i]}" "${notes[$i]}"
    [ "${states[$i]}" = ok ] || [ "${states[$i]}" = n/a ] || status=1
done
exit $status
