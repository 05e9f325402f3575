#!/bin/sh
# `kiln train --device cuda` on a GPU, against the CPU trainer:
#
#   tests/gpu/test_cuda_train.sh KILN_BINARY [WORK_FOLDER]
#
#   1. data: the repository's own text (README, docs) prepared with `kiln prepare`
#   2. 20 steps of d4 (B=4, T=128, the same seed and data) on the CPU in fp32 and on the GPU
#      in fp32 and bf16: the losses side by side; the GPU's fp32 within 1e-3 of the CPU's
#      (relative) at every step, bf16 within 2%, and the loss falling
#   3. the same GPU bf16 run again: the same losses, norms and saved weights, bit for bit
#   4. resumed on the GPU from its step-10 checkpoint: the same saved weights as the whole run
#   5. the GPU's weights on the CPU: `kiln eval` and `kiln sample` read them; then on the GPU
#      (--device cuda): eval's loss within 1e-4 of the CPU's, and sample writes text
#   6. a plan too large for the GPU: refused before the first step, saying how far short
#   7. gpt2-124m, bf16, T=1024, the largest micro-batch --plan finds fits (at most 64): 20
#      steps, the trainer's tokens/s, MFU and GPU memory
#   8. several ranks (mpirun), a GPU each, NCCL between them: with two GPUs or more, 2 ranks of
#      B=2 against the one-GPU run of B=4 (fp32, ZeRO 0 and 1: losses within 1e-4 relative);
#      with one, 2 ranks refused on every rank, saying each needs a GPU of its own
#
# Exits 77 (SKIP) where kiln cannot train on a GPU, 0 when every check passes, 1 otherwise.
# The last line starts with RESULT.
set -u
KILN=${1:?"usage: test_cuda_train.sh KILN_BINARY [WORK_FOLDER]"}
case "$KILN" in /*) ;; *) KILN=$(pwd)/$KILN ;; esac
SRC=$(cd "$(dirname "$0")/../.." && pwd)
W=${2:-${TMPDIR:-/tmp}/kiln-gpu-train-$$}
rm -rf "$W" && mkdir -p "$W" && cd "$W" || exit 1
fails=0
ok() { printf 'ok   %s\n' "$1"; }
bad() {
    printf 'FAIL %s\n' "$1"
    fails=$((fails + 1))
}
# run NAME ARGS...: kiln ARGS, output in NAME.log, status in RC
run() {
    _n=$1
    shift
    echo "\$ kiln $*" >"$_n.log"
    "$KILN" "$@" >>"$_n.log" 2>&1
    RC=$?
    return $RC
}
losses() { sed -n 's/.*"loss": *\([^,}]*\).*/\1/p' "$1"; }

i=0
: >text.txt
while [ $i -lt 16 ]; do # enough tokens for a batch of 64 x 1024
    cat "$SRC"/README.md "$SRC"/docs/*.md >>text.txt
    i=$((i + 1))
done
if ! run prepare prepare --out data text.txt; then
    cat prepare.log
    echo "RESULT failed (kiln prepare)"
    exit 1
fi
DATA=data/train_000.bin
VAL=data/val_000.bin
SMALL="train --model d4 --batch 4 --seq 128 --steps 20 --data $DATA --seed 7 --threads 8"

if ! run probe $SMALL --steps 0 --device cuda; then
    if grep -E -q 'no NVIDIA driver|no CUDA GPU|built without CUDA|compute capability|update the driver' probe.log; then
        echo "SKIP: $(grep -m1 '^kiln' probe.log)"
        echo "RESULT skipped"
        exit 77
    fi
    cat probe.log
    echo "RESULT failed (kiln train --device cuda --steps 0)"
    exit 1
fi

# 2. the CPU and the GPU on the same data and starting weights
run cpu32 $SMALL --precision fp32 --metrics cpu32.jsonl --save cpu32.st || bad "CPU fp32 run (see cpu32.log)"
run gpu32 $SMALL --precision fp32 --metrics gpu32.jsonl --save gpu32.st --device cuda ||
    bad "GPU fp32 run: $(grep -m1 'kiln' gpu32.log)"
run gpu16 $SMALL --precision bf16 --metrics gpu16.jsonl --save gpu16.st --device cuda \
    --checkpoint-dir ck --checkpoint-every 10 || bad "GPU bf16 run: $(grep -m1 'kiln' gpu16.log)"
losses cpu32.jsonl >l_cpu32
losses gpu32.jsonl >l_gpu32
losses gpu16.jsonl >l_gpu16
echo
echo "loss over 20 steps, d4, B=4, T=128, seed 7: the CPU in fp32 against the GPU"
paste l_cpu32 l_gpu32 l_gpu16 | awk '
    BEGIN { printf "%5s %10s %10s %10s %10s %10s\n", "step", "CPU fp32", "GPU fp32", "rel diff", "GPU bf16", "rel diff" }
    { d32 = ($2 - $1) / $1; d16 = ($3 - $1) / $1
      printf "%5d %10.6f %10.6f %10.2e %10.6f %10.2e\n", NR, $1, $2, d32, $3, d16 }'
if paste l_cpu32 l_gpu32 | awk '{ d = ($2 - $1) / $1; if (d < 0) d = -d; if (d > 1e-3) b = 1; n++ } END { exit b || n != 20 }'; then
    ok "GPU fp32 losses within 1e-3 (relative) of the CPU's at each of 20 steps"
else
    bad "GPU fp32 losses within 1e-3 of the CPU's"
fi
if paste l_cpu32 l_gpu16 | awk '{ d = ($2 - $1) / $1; if (d < 0) d = -d; if (d > 0.02) b = 1; n++ } END { exit b || n != 20 }'; then
    ok "GPU bf16 losses within 2% of the CPU fp32's at each of 20 steps"
else
    bad "GPU bf16 losses within 2% of the CPU fp32's"
fi
if awk 'NR == 1 { f = $1 } { l = $1 } END { exit !(NR == 20 && l < f - 0.5) }' l_gpu16; then
    ok "the GPU's bf16 loss falls by more than 0.5 over 20 steps"
else
    bad "the GPU's bf16 loss falls by more than 0.5 over 20 steps"
fi

# 3. determinism
run gpu16b $SMALL --precision bf16 --metrics gpu16b.jsonl --save gpu16b.st --device cuda ||
    bad "GPU bf16 run again"
sed 's/"ms".*//' gpu16.jsonl >a.cut
sed 's/"ms".*//' gpu16b.jsonl >b.cut
if cmp -s a.cut b.cut && cmp -s gpu16.st gpu16b.st; then
    ok "the same GPU run twice: the same losses, norms and weights, bit for bit"
else
    bad "the same GPU run twice differs (losses/norms or weights)"
fi

# 4. resume on the GPU
if [ -f ck/step_00000010/state.json ]; then
    rm -rf ck/step_00000020
    echo step_00000010 >ck/latest
    run resume $SMALL --precision bf16 --save res.st --device cuda --checkpoint-dir ck \
        --checkpoint-every 10 --resume ck || bad "GPU resume (see resume.log)"
    if cmp -s gpu16.st res.st; then
        ok "resumed on the GPU from step 10: the same weights as the whole run"
    else
        bad "resumed on the GPU from step 10: weights differ from the whole run's"
    fi
else
    bad "the GPU run wrote no step-10 checkpoint"
fi

# 5. the GPU's weights on the CPU
if run eval eval --weights gpu16.st --data "$VAL" --batch 4 --seq 128 --batches 4 &&
    run sample sample --weights gpu16.st --tokens 24 --seed 1; then
    ok "kiln eval and kiln sample read the GPU's weights ($(grep -m1 -i 'loss' eval.log))"
else
    bad "kiln eval / sample on the GPU's weights (eval.log, sample.log)"
fi

# 5b. eval and sample on the GPU (--device cuda): the CPU's loss within 1e-4 (fp32), and text
if run evalg eval --weights gpu16.st --data "$VAL" --batch 4 --seq 128 --batches 4 --device cuda &&
    run sampleg sample --weights gpu16.st --tokens 24 --seed 1 --device cuda; then
    lc=$(sed -n 's/.*| loss \([0-9.]*\) |.*/\1/p' eval.log)
    lg=$(sed -n 's/.*| loss \([0-9.]*\) |.*/\1/p' evalg.log)
    if [ -n "$lc" ] && [ -n "$lg" ] &&
        awk -v a="$lc" -v b="$lg" 'BEGIN { d = (b - a) / a; if (d < 0) d = -d; exit !(d <= 1e-4) }'; then
        ok "kiln eval on the GPU: loss $lg against the CPU's $lc"
    else
        bad "kiln eval on the GPU: loss '$lg' against the CPU's '$lc'"
    fi
    if [ "$(tail -n +2 sampleg.log | wc -c)" -gt 0 ]; then
        tail -n +2 sample.log >s_cpu.txt
        tail -n +2 sampleg.log >s_gpu.txt
        cmp -s s_cpu.txt s_gpu.txt && same="the CPU's text" || same="text other than the CPU's"
        ok "kiln sample on the GPU wrote $same (24 tokens, seed 1)"
    else
        bad "kiln sample on the GPU wrote nothing (sampleg.log)"
    fi
else
    bad "kiln eval / sample on the GPU: $(grep -m1 'kiln' evalg.log sampleg.log 2>/dev/null)"
fi

# 6. too large for the GPU
run big train --model gpt2-1558m --batch 512 --seq 1024 --steps 1 --data "$DATA" --device cuda
if [ "$RC" -ne 0 ] && grep -q 'GPU memory' big.log && grep -q 'short' big.log && ! grep -q '^step' big.log; then
    ok "a plan too large for the GPU is refused before the first step"
else
    bad "a plan too large for the GPU (RC $RC): $(tail -1 big.log)"
fi

# 7. gpt2-124m at T=1024
B124=16
if run plan124 train --model gpt2-124m --precision bf16 --seq 1024 --batch 8 --data "$DATA" \
    --device cuda --plan; then
    fit=$(sed -n 's/^largest batch that fits at T=1024: B=\([0-9]*\).*/\1/p' plan124.log)
    [ -n "$fit" ] && B124=$fit
    [ "$B124" -gt 64 ] && B124=64
fi
echo
echo "gpt2-124m, bf16, B=$B124, T=1024, 20 steps:"
if run t124 train --model gpt2-124m --precision bf16 --seq 1024 --batch "$B124" --steps 20 \
    --data "$DATA" --device cuda --metrics t124.jsonl --lr 6e-4; then
    grep -E '^(memory plan|compute|done|GPU memory)' t124.log
    ok "gpt2-124m trained on the GPU: $(grep '^done' t124.log)"
else
    tail -5 t124.log
    bad "gpt2-124m on the GPU (t124.log)"
fi

# 8. several ranks, a GPU each
MPIRUN=$(command -v mpirun || true)
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
mpi2() {
    _n=$1
    shift
    echo "\$ mpirun -np 2 kiln $*" >"$_n.log"
    timeout -k 5 300 "$MPIRUN" --allow-run-as-root --oversubscribe --bind-to none -np 2 \
        "$KILN" "$@" \
        >>"$_n.log" 2>&1 </dev/null
    RC=$?
    return $RC
}
echo
if [ -z "$MPIRUN" ]; then
    echo "SKIP: no mpirun: several ranks on GPUs not run"
elif [ "$NGPU" -ge 2 ]; then
    echo "loss over 20 steps, d4, fp32: one GPU at B=4 against 2 ranks on 2 GPUs at B=2 each"
    for z in 0 1; do
        if mpi2 dp$z $SMALL --batch 2 --precision fp32 --zero $z --device cuda \
            --metrics dp$z.jsonl --save dp$z.st; then
            losses dp$z.jsonl >l_dp$z
            grep -E '^(gradient reduction|done)' dp$z.log
            if paste l_gpu32 l_dp$z | awk '{ d = ($2 - $1) / $1; if (d < 0) d = -d; if (d > 1e-4) b = 1; n++ } END { exit b || n != 20 }'; then
                ok "2 GPUs, ZeRO $z: losses within 1e-4 of one GPU's at each of 20 steps"
            else
                bad "2 GPUs, ZeRO $z: losses differ from one GPU's: $(paste l_gpu32 l_dp$z | tr '\n' ' ')"
            fi
            grep -q 'over NCCL' dp$z.log && ok "the reduction went over NCCL" ||
                bad "the reduction went over NCCL (dp$z.log)"
        else
            bad "2 ranks on GPUs, ZeRO $z: $(grep -m1 'kiln' dp$z.log)"
        fi
    done
else
    mpi2 dp1 $SMALL --batch 2 --device cuda --save dp1.st
    n=$(grep -c 'each needs a GPU of its own' dp1.log)
    if grep -q 'built without MPI' dp1.log; then
        echo "SKIP: this kiln was built without MPI: several ranks on GPUs not run"
    elif [ "$RC" -ne 0 ] && [ "$n" -ge 2 ] && [ ! -e dp1.st ]; then
        ok "one GPU: 2 ranks refused on every rank, each needing a GPU of its own"
    else
        bad "one GPU: 2 ranks (RC $RC, $n messages): $(grep -m1 'kiln' dp1.log)"
    fi
    echo "SKIP: $NGPU GPU: the 2-rank equality needs two"
fi

echo
if [ "$fails" -eq 0 ]; then
    echo "RESULT ok: GPU fp32 and bf16 against the CPU over 20 steps, deterministic, resumed," \
        "$(sed -n 's/^done: .*, \([0-9]* tokens\/s\), MFU \([0-9.]*%\).*/124M B='"$B124"' \1 MFU \2/p' t124.log)"
    exit 0
fi
echo "RESULT failed ($fails checks; logs in $W)"
exit 1
