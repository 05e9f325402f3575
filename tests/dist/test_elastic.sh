#!/bin/sh
# Resuming a checkpoint on another number of ranks or another ZeRO stage, label "dist": the
# optimizer state re-cut from the old ranks' files and the data position mapped, so that the
# resumed run equals an uninterrupted run on the new ranks of the same global batch (within the
# 1e-5 of "equal to one process": the sums run in another order), and byte for byte where the
# arithmetic is the same (a change of ZeRO stage on the same ranks). A global batch that differs
# is refused, saying which --batch matches, with nothing written. Uses the cli fixture's data and
# tiny model; skipped (77) without mpirun, without MPI in kiln, or without numpy.
. "$(dirname "$0")/../cli/lib.sh"
MPI_NEEDS_NUMPY=1
. "$(dirname "$0")/lib_mpi.sh"

TRAIN="train $TINY --seq 16 --threads 1 --data $DATA --steps 40 --lr 1e-3"
COMPARE="/usr/bin/python3 $SRC/tests/dist/compare_runs.py"
CK="--checkpoint-dir ck --checkpoint-every 20"

# resumed_equals REF RES TOL [--loss-tol T]: the run RES resumed at step 20 (RES.st, RES.jsonl
# of steps 21-40) against the uninterrupted REF (REF.st, REF.jsonl of steps 1-40).
resumed_equals() {
    _a=$1 _b=$2
    shift 2
    tail -n 20 "$_a.jsonl" >"$_a.21.jsonl"
    if $COMPARE "$_a.st" "$_b.st" "$_a.21.jsonl" "$_b.jsonl" "$@" >cmp.out 2>&1; then
        ok "$_b equals $_a from step 21: $(cat cmp.out)"
    else
        bad "$_b equals $_a from step 21: $(cat cmp.out)"
    fi
}

steps_21_to_40() {
    check "$1 ran steps 21 to 40" test "$(sed -n 's/^{"step": \([0-9]*\),.*/\1/p' "$1" |
        tr '\n' ' ')" = "$(seq 21 40 | tr '\n' ' ')"
}

case_two_ranks_to_one() {
    need_mpi
    run $TRAIN --batch 8 --save ref.st --metrics ref.jsonl
    expect_ok
    mpi 2 $TRAIN --batch 4 --zero 1 $CK --save two.st
    expect_ok
    run $TRAIN --batch 8 --resume ck/step_00000020 --save one.st --metrics one.jsonl
    expect_ok
    expect_out_re 'resumed from ck/step_00000020: step 20 of 40'
    expect_out_re 'resumed a checkpoint of 2 ranks \(ZeRO 1, B=4\) on 1 rank \(ZeRO 0, B=8\): optimizer state re-cut'
    steps_21_to_40 one.jsonl
    resumed_equals ref one 1e-5
    # the resumed process's own checkpoint resumes as usual, byte for byte
    check "the resumed run wrote its checkpoint of step 40" test -f ck/step_00000040/optim_rank0.bin
}

case_one_to_two_ranks_zero2() {
    need_mpi
    mpi 2 $TRAIN --batch 4 --zero 2 --bucket-mb 0.002 --save ref.st --metrics ref.jsonl
    expect_ok
    run $TRAIN --batch 8 $CK --save one.st
    expect_ok
    mpi 2 $TRAIN --batch 4 --zero 2 --bucket-mb 0.002 --resume ck/step_00000020 --save two.st \
        --metrics two.jsonl
    expect_ok
    expect_out_re 'resumed a checkpoint of 1 rank \(ZeRO 0, B=8\) on 2 ranks \(ZeRO 2, B=4\): optimizer state re-cut'
    steps_21_to_40 two.jsonl
    resumed_equals ref two 1e-5
}

# The same ranks and micro-batches, another ZeRO stage: the same sums in the same order (ZeRO 1
# and 0 reduce alike; a rank updates its shard as ZeRO 0 updates the whole), so the same bytes:
# fp32, and bf16 with stochastic rounding (master weights and working weights re-cut).
case_zero1_to_zero0() {
    need_mpi
    for p in "" "--precision bf16 --stochastic-rounding"; do
        rm -rf ck z0.jsonl # a resumed run appends to its metrics
        mpi 2 $TRAIN --batch 4 --zero 0 $p --save ref.st --metrics ref.jsonl
        expect_ok
        mpi 2 $TRAIN --batch 4 --zero 1 $p $CK --save z1.st
        expect_ok
        mpi 2 $TRAIN --batch 4 --zero 0 $p --resume ck/step_00000020 --save z0.st \
            --metrics z0.jsonl
        expect_ok
        expect_out_re 'on 2 ranks \(ZeRO 0, B=4\): optimizer state re-cut'
        check "ZeRO 1 resumed as ZeRO 0 ($p) equals the uninterrupted ZeRO 0 run, byte for byte" \
            same_file ref.st z0.st
        resumed_equals ref z0 0 --loss-tol 0
    done
}

# bf16 with fp32 master weights, 2 ranks to one: the micro-batch of 4 instead of 8 in the first
# 20 steps rounds the bf16 activations differently (2^-8 relative per rounding): the dp tests'
# tolerance for bf16 against one process.
case_bf16_two_ranks_to_one() {
    need_mpi
    run $TRAIN --batch 8 --precision bf16 --save ref.st --metrics ref.jsonl
    expect_ok
    mpi 2 $TRAIN --batch 4 --precision bf16 --zero 1 $CK --save two.st
    expect_ok
    run $TRAIN --batch 8 --precision bf16 --resume ck/step_00000020 --save one.st \
        --metrics one.jsonl
    expect_ok
    expect_out_re 'optimizer state re-cut'
    resumed_equals ref one 2e-2 --loss-tol 0.03
}

# Shards that do not line up: 2 ranks of ZeRO 3 (halves) into 3 ranks of ZeRO 1 (thirds), each
# new range from two old files; and uneven ranks (--rank-batches 3,1: a loader per micro-batch)
# into one process of 4 micro-batches.
case_other_worlds() {
    need_mpi
    mpi 3 $TRAIN --batch 2 --zero 1 --save ref.st --metrics ref.jsonl
    expect_ok
    mpi 2 $TRAIN --batch 3 --zero 3 $CK --save two.st
    expect_ok
    mpi 3 $TRAIN --batch 2 --zero 1 --resume ck/step_00000020 --save three.st --metrics three.jsonl
    expect_ok
    expect_out_re 'of 2 ranks \(ZeRO 3, B=3\) on 3 ranks \(ZeRO 1, B=2\): optimizer state re-cut'
    resumed_equals ref three 1e-5
    rm -rf ck
    run $TRAIN --batch 2 --grad-accum 4 --save ref4.st --metrics ref4.jsonl
    expect_ok
    mpi 2 $TRAIN --batch 2 --rank-batches 3,1 --zero 1 $CK --save uneven.st
    expect_ok
    run $TRAIN --batch 2 --grad-accum 4 --resume ck/step_00000020 --save one.st --metrics one.jsonl
    expect_ok
    resumed_equals ref4 one 1e-5
}

case_global_batch_differs() {
    need_mpi
    mpi 2 $TRAIN --batch 4 --zero 1 $CK --save two.st
    expect_ok
    cp -r ck ck.before
    echo '{}' >m.jsonl
    run $TRAIN --batch 4 --resume ck --save x.st --metrics m.jsonl
    expect_fail
    expect_err "2 ranks of B=4 wrote this checkpoint, 8 sequences a step" \
        "with 1 process use --batch 8"
    check "the checkpoints are untouched" diff -r ck.before ck
    run $TRAIN --batch 8 $CK --save one.st
    expect_ok
    mpi 2 $TRAIN --batch 8 --resume ck/step_00000040 --save x.st --metrics m.jsonl
    expect_rc 1
    expect_err "with 2 ranks use --batch 4"
    check "no weights written by the refused runs" test ! -e x.st
    check "the metrics file is untouched" grep -qx '{}' m.jsonl
    mpi 2 $TRAIN --batch 4 --seed 5 --resume ck/step_00000040 --save x.st
    expect_rc 1
    expect_err "--seed is 1337 there and 5 in this run"
    # local SGD trains each rank's own model between averages: only on as many ranks
    rm -rf ck
    mpi 2 $TRAIN --batch 4 --local-steps 5 $CK --save x.st
    expect_ok
    run $TRAIN --batch 8 --local-steps 5 --resume ck --save y.st
    expect_fail
    expect_err "local SGD resumes on the same number of ranks"
    check "nothing saved by the refused run" test ! -e y.st
}

# The same command on any number of ranks (--global-batch), restarted on fewer: a run on 2
# ranks whose rank 1 hangs at step 12 ends with the hang status; `kiln run --fewer-ranks`
# starts it again on 1 rank, which resumes the step-10 checkpoint (optimizer state re-cut, the
# 4 sequences a step as 2 micro-batches) and ends equal to an uninterrupted run. 3 ranks of a
# global batch of 8 take 3, 3 and 2 micro-batches (uneven ranks) and train alike too.
case_fewer_ranks_after_hang() {
    need_mpi
    G="--batch 2 --global-batch 4"
    run $TRAIN $G --save ref.st --metrics ref.jsonl
    expect_ok
    LAST="kiln run --fewer-ranks -- mpirun -np 2 kiln $TRAIN $G --inject-hang 1:12 ..."
    printf '$ %s\n' "$LAST" >>"$W/log"
    timeout -k 5 120 "$KILN" run --restarts 2 --backoff 0 --fewer-ranks --min-ranks 1 -- \
        "$MPIRUN" $MPIFLAGS -np 2 "$KILN" $TRAIN $G --checkpoint-dir ck --checkpoint-every 5 \
        --inject-hang 1:12 --hang-min-s 2 --save res.st --metrics res.jsonl \
        </dev/null >"$W/stdout" 2>"$W/stderr"
    RC=$?
    expect_ok
    expect_err "--fewer-ranks: the command starts again on 1 rank"
    expect_out_re 'resumed a checkpoint of 2 ranks .* on 1 rank .*optimizer state re-cut'
    if $COMPARE ref.st res.st ref.jsonl ref.jsonl 1e-5 >cmp.out 2>&1; then
        ok "restarted on 1 rank, the run equals the uninterrupted one: $(cat cmp.out)"
    else
        bad "restarted on 1 rank, the run equals the uninterrupted one: $(cat cmp.out)"
    fi
    mpi 3 $TRAIN --batch 2 --global-batch 8 --save three.st --metrics three.jsonl
    expect_ok
    expect_out_re 'a step takes 8 sequences .*uneven ranks'
    run $TRAIN --batch 2 --global-batch 8 --save one.st --metrics one.jsonl
    expect_ok
    if $COMPARE one.st three.st one.jsonl three.jsonl 1e-5 >cmp.out 2>&1; then
        ok "3 uneven ranks equal one process: $(cat cmp.out)"
    else
        bad "3 uneven ranks equal one process: $(cat cmp.out)"
    fi
    run $TRAIN --batch 3 --global-batch 8 --save x.st
    expect_usage
    run $TRAIN --batch 2 --global-batch 8 --grad-accum 2 --save x.st
    expect_usage
}

# --rank-batches auto: rank 1 made slower (30 ms a step more) gets fewer micro-batches after
# the measured steps; the global batch and the training stay one process's, within 1e-5.
case_rank_batches_auto() {
    need_mpi
    run $TRAIN --batch 8 --save one.st --metrics one.jsonl
    expect_ok
    mpi 2 $TRAIN --batch 2 --global-batch 8 --rank-batches auto:6 --inject-slow 1:30 \
        --save two.st --metrics two.jsonl
    expect_ok
    expect_out_re 'uneven ranks after step 6: busy ms per micro-batch rank 0 [0-9.]+, rank 1 [0-9.]+; micro-batches a step now 3,1 \(4 in all'
    check "the new split is an event in the metrics" \
        grep -q '"event": "rank_batches", "step": 6, "counts": \[3, 1\]' two.jsonl
    if $COMPARE one.st two.st one.jsonl two.jsonl 1e-5 >cmp.out 2>&1; then
        ok "the rebalanced ranks equal one process: $(cat cmp.out)"
    else
        bad "the rebalanced ranks equal one process: $(cat cmp.out)"
    fi
    mpi 2 $TRAIN --batch 2 --rank-batches auto:1 --save x.st
    expect_rc 2
}

main "$@"
