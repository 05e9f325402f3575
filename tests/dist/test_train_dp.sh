#!/bin/sh
# Data-parallel training under mpirun, label "dist": N ranks with batch b each equal one
# process with batch N x b (losses and final weights within 1e-5 over 20 steps) for N = 2
# and 4, ZeRO 0 to 3, with many gradient buckets and with one; gradient accumulation and
# evaluation; uneven ranks (--rank-batches) equal to one process over the same batch; local
# SGD and DiLoCo; narrow and low-rank factored models; Llamas; bf16 working weights; an fp16 overflow skipped on every rank; gradients sent in
# bf16. Bad starts: ranks given different flags, a rank whose data is missing, a rank killed
# mid-run: an error on every rank or an end within a bounded time, never a hang, and no
# --save file of another run overwritten. A preempted mpirun (SIGTERM, SIGUSR1): every rank
# stops after the same step with its checkpoint written, and resumes byte for byte. Uses the
# cli fixture's byte-level data and tiny model; skipped (77) without mpirun or without MPI in kiln.
. "$(dirname "$0")/../cli/lib.sh"
MPI_NEEDS_NUMPY=1
. "$(dirname "$0")/lib_mpi.sh"

TRAIN="train $TINY --seq 16 --threads 1 --data $DATA --steps 20 --lr 1e-3"
COMPARE="/usr/bin/python3 $SRC/tests/dist/compare_runs.py"

# mpmd ARGS0 -- ARGS1: rank 0 runs kiln ARGS0, rank 1 kiln ARGS1.
mpmd() {
    _a=""
    while [ "$1" != "--" ]; do _a="$_a $1"; shift; done
    shift
    LAST="mpirun -np 1 kiln$_a : -np 1 kiln $*"
    printf '$ %s\n' "$LAST" >>"$W/log"
    # shellcheck disable=SC2086
    timeout -k 5 "$CMD_TIMEOUT" "$MPIRUN" $MPIFLAGS -np 1 "$KILN" $_a : -np 1 "$KILN" "$@" \
        </dev/null >"$W/stdout" 2>"$W/stderr"
    RC=$?
    printf '[exit %s]\n' "$RC" >>"$W/log"
    cat "$W/stderr" >>"$W/log"
    if [ "$RC" -eq 124 ] || [ "$RC" -eq 137 ]; then
        bad "mpirun with two programs finished within $CMD_TIMEOUT s (it hung)"
    fi
}

# same NAME_A NAME_B TOL [--loss-tol T]: runs A and B (A.st/A.jsonl) agree.
same() {
    _a=$1 _b=$2
    shift 2
    if $COMPARE "$_a.st" "$_b.st" "$_a.jsonl" "$_b.jsonl" "$@" >cmp.out 2>&1; then
        ok "$_b equals $_a: $(cat cmp.out)"
    else
        bad "$_b equals $_a: $(cat cmp.out)"
    fi
}

# equal_ref4 NAME NP ARGS...: kiln ARGS on NP ranks, saving NAME.st and NAME.jsonl, equal to
# the one-process run ref4 within 1e-5.
equal_ref4() {
    _n=$1 _np=$2
    shift 2
    mpi "$_np" $TRAIN "$@" --save "$_n.st" --metrics "$_n.jsonl"
    expect_ok
    same ref4 "$_n" 1e-5
}

# one NAME B ARGS...: the single-process reference with batch B.
one() {
    _n=$1 _b=$2
    shift 2
    run $TRAIN --batch "$_b" --save "$_n.st" --metrics "$_n.jsonl" "$@"
    expect_ok
}

case_equal_one_process() {
    need_mpi
    one ref4 4
    for np in 2 4; do
        b=$((4 / np))
        for z in 0 1 2 3; do
            # 0.002 MiB buckets: about one per block; 0: one reduction after backward
            for mb in 0.002 0; do
                n=np${np}_z${z}_b$mb
                mpi "$np" $TRAIN --batch "$b" --zero "$z" --bucket-mb "$mb" --save "$n.st" \
                    --metrics "$n.jsonl"
                expect_ok
                same ref4 "$n" 1e-5
            done
        done
    done
    grep -q '"comm_ms"' np2_z0_b0.002.jsonl && ok "the metrics give the communication time" ||
        bad "the metrics give the communication time"
}

# The embedding's rows apart (wte's gradient reduced right after the classifier, every
# rank's rows added after backward) and together: both equal one process, at 2 and 4 ranks,
# ZeRO 0, 2 and 3; the two differ only in rounding.
case_embedding_rows() {
    need_mpi
    one ref4 4
    for np in 2 4; do
        b=$((4 / np))
        for z in 0 2 3; do
            for rows in apart together; do
                equal_ref4 np${np}_z${z}_$rows "$np" --batch "$b" --zero "$z" \
                    --bucket-mb 0.002 --embedding-rows "$rows"
            done
        done
    done
    mpi 2 $TRAIN --batch 2 --embedding-rows sideways --save bad.st
    expect_rc 2
    expect_err_re "--embedding-rows is apart, together or auto"
}

# ZeRO 1 on one machine keeps one copy of the weights for all its ranks, each rank updating
# its shard of it in place; a copy per rank (KILN_COMMON_WEIGHTS=0) trains the same bits.
case_common_weights() {
    need_mpi
    for np in 2 4; do
        b=$((4 / np))
        mpi "$np" $TRAIN --batch "$b" --zero 1 --save "c$np.st" --metrics "c$np.jsonl"
        expect_ok
        expect_out "parameters: one copy for the machine's ranks"
        export KILN_COMMON_WEIGHTS=0
        mpi "$np" $TRAIN --batch "$b" --zero 1 --save "p$np.st" --metrics "p$np.jsonl"
        unset KILN_COMMON_WEIGHTS
        expect_ok
        check "$np ranks, KILN_COMMON_WEIGHTS=0: a copy per rank" \
            sh -c "! grep -q 'one copy for the machine' '$W/stdout'"
        check "$np ranks: the same weights either way" same_file "c$np.st" "p$np.st"
        same "p$np" "c$np" 0
    done
}

# Ranks on several machines, simulated (KILN_COMM_NODE_RANKS=2: machines of 2 ranks): shared
# memory on each machine and MPI between them. ZeRO 0, 1 (one copy of the weights on each
# machine) and 2, one reduction or buckets, equal one process.
case_machines() {
    need_mpi
    one ref4 4
    export KILN_COMM_NODE_RANKS=2
    for z in 0 1 2; do
        for mb in 0 0.08; do
            n=m_z${z}_b$mb
            mpi 4 $TRAIN --batch 1 --zero "$z" --bucket-mb "$mb" --save "$n.st" \
                --metrics "$n.jsonl"
            expect_ok
            same ref4 "$n" 1e-5
            if [ "$z" = 1 ]; then
                expect_out "parameters: one copy for the machine's ranks"
                expect_out "of the other ranks' slabs read through shared memory"
            fi
        done
    done
    unset KILN_COMM_NODE_RANKS
}

case_accumulation_and_eval() {
    need_mpi
    one ref 4 --grad-accum 2 --val-data "$VAL" --eval-every 5 --eval-batches 2
    mpi 2 $TRAIN --batch 2 --grad-accum 2 --val-data "$VAL" --eval-every 5 --eval-batches 2 \
        --zero 1 --save acc.st --metrics acc.jsonl
    expect_ok
    same ref acc 1e-5
    v1=$(sed -n 's/.*"val_loss": *\([0-9.]*\).*/\1/p' ref.jsonl | tr '\n' ' ')
    v2=$(sed -n 's/.*"val_loss": *\([0-9.]*\).*/\1/p' acc.jsonl | tr '\n' ' ')
    if [ -n "$v1" ] && awk -v a="$v1" -v b="$v2" 'BEGIN { n = split(a, x, " "); m = split(b, y, " ")
            if (n != m || n < 4) exit 1
            for (i = 1; i <= n; i++) { d = x[i] - y[i]; if (d < 0) d = -d; if (d > 1e-5) exit 1 } }'; then
        ok "validation losses agree with one process's: $v2"
    else
        bad "validation losses agree with one process's: [$v1] against [$v2]"
    fi
}

case_bf16() {
    need_mpi
    one ref 4 --precision bf16
    mpi 2 $TRAIN --batch 2 --precision bf16 --zero 0 --save z0.st --metrics z0.jsonl
    expect_ok
    mpi 2 $TRAIN --batch 2 --precision bf16 --zero 2 --bucket-mb 0.002 --save z2.st \
        --metrics z2.jsonl
    expect_ok
    mpi 2 $TRAIN --batch 2 --precision bf16 --zero 3 --bucket-mb 0.002 --save z3.st \
        --metrics z3.jsonl --val-data "$VAL" --eval-every 10 --eval-batches 2
    expect_ok
    # ZeRO 3 gathers each block's bf16 weights from their owners: the same bits as ZeRO 0's
    same z0 z3 1e-6
    # Sharding changes which rank updates a weight, not how: ZeRO 2 equals ZeRO 0 but for
    # the order of the norm's sum
    same z0 z2 1e-6
    # Against one process, the micro-batch of 2 instead of 4 rounds the bf16 activations
    # differently: 2^-8 relative per rounding, a few of them per layer, grown over 20 steps
    # of AdamW at lr 1e-3. The losses within 0.5%, weights within 2e-2 (the weights are of
    # order 0.02-1; one bf16 ulp at 1 is 2^-7)
    same ref z2 2e-2 --loss-tol 0.03
}

case_fp16_overflow_skipped() {
    need_mpi
    one ref 4 --precision fp16 --inject-nonfinite 3
    mpi 2 $TRAIN --batch 2 --precision fp16 --inject-nonfinite 3 --zero 1 --save h.st \
        --metrics h.jsonl
    expect_ok
    if grep '"step": 3,' h.jsonl | grep -q '"skipped": 1'; then
        ok "step 3's overflow skipped on every rank"
    else
        bad "step 3's overflow skipped: $(grep '"step": 3,' h.jsonl)"
    fi
    # fp16 products of a micro-batch of 2 instead of 4 round differently (2^-11 relative)
    same ref h 1e-2 --loss-tol 1e-3
}

# Stability guards on 2 ranks with ZeRO 1: every rank judges the same reduced loss and norm,
# so all skip the same steps and roll back together; the result equals a run told to skip the
# bad steps' batches, byte for byte.
case_guard_rollback_zero1() {
    need_mpi
    G="--batch 2 --zero 1 --guard-window 10"
    mpi 2 $TRAIN $G --skip-batches 12:3 --save ref.st
    expect_ok
    mpi 2 $TRAIN $G --inject-spike 12:3 --checkpoint-dir ck --checkpoint-every 5 --save h.st \
        --metrics h.jsonl
    expect_ok
    check "every rank rolled back to step 10" \
        grep -q '"event": "rollback", "step": 14, "to_step": 10, "first_bad": 12, "skip_steps": 3' h.jsonl
    check "the weights equal those of the run that skipped the batches, byte for byte" \
        same_file ref.st h.st
}

# Cross-layer weight sharing: a shared block's gradient is final only after its lowest layer's
# backward, and its bucket must wait for it; 2 ranks equal one process at ZeRO 1 and 3.
case_shared_layers() {
    need_mpi
    S="--layers 4 --share-layers 2"
    one ref 4 $S
    for z in 1 3; do
        mpi 2 $TRAIN --batch 2 $S --zero $z --bucket-mb 0.01 --save z$z.st --metrics z$z.jsonl
        expect_ok
        same ref z$z 1e-5
    done
}

# A Llama (grouped key/value heads, an untied head; then a tied one): 2 and 4 ranks equal one
# process at every ZeRO stage.
case_llama() {
    need_mpi
    printf '{"family": "llama", "n_layer": 2, "n_head": 4, "n_kv_head": 2, "n_embd": 32,
 "max_seq_len": 32, "mlp_hidden": 48, "untied_head": true}\n' >llama.json
    for tie in untied tied; do
        if [ $tie = untied ]; then
            M="--model llama.json"
        else
            M="--model llama-d4 --layers 2 --embd 32 --heads 4 --context 32"
        fi
        L="train $M --peak-gflops 100 --seq 16 --threads 1 --data $DATA --steps 20 --lr 1e-3"
        run $L --batch 4 --save ${tie}_ref.st --metrics ${tie}_ref.jsonl
        expect_ok
        for np in 2 4; do
            for z in 0 1 3; do
                mpi $np $L --batch $((4 / np)) --zero $z --bucket-mb 0.002 \
                    --save ${tie}_np${np}_z$z.st --metrics ${tie}_np${np}_z$z.jsonl
                expect_ok
                same ${tie}_ref ${tie}_np${np}_z$z 1e-5
            done
        done
    done
}

# Narrow (structurally pruned) and low-rank factored models: 2 ranks equal one process too.
# They start from a trained model, whose attention key biases have a gradient of exactly zero
# in exact arithmetic (softmax ignores what shifts every score alike) and only rounding noise
# in floats: Adam would scale that noise, which differs with the ranks' order of sums, into
# whole steps, so these runs use SGD with momentum.
case_narrow_and_factored() {
    need_mpi
    run compress prune --weights "$GOOD" --out narrow.safetensors --heads 0.5 --mlp 0.5 \
        --importance magnitude --multiple 8
    expect_ok
    run compress lowrank --weights "$GOOD" --out lowrank.safetensors --rank 4
    expect_ok
    for m in narrow lowrank; do
        T2="train --init $m.safetensors --seq 16 --threads 1 --data $DATA --steps 20 --lr 1e-2 --optimizer sgd --momentum 0.9 --peak-gflops 100"
        run $T2 --batch 4 --save ${m}_ref.st --metrics ${m}_ref.jsonl
        expect_ok
        for z in 1 3; do
            mpi 2 $T2 --batch 2 --zero $z --bucket-mb 0.002 --save ${m}_z$z.st \
                --metrics ${m}_z$z.jsonl
            expect_ok
            same ${m}_ref ${m}_z$z 1e-5
        done
    done
}

case_bf16_reduction() {
    need_mpi
    one ref 4
    mpi 2 $TRAIN --batch 2 --reduce-dtype bf16 --save r.st --metrics r.jsonl
    expect_ok
    # gradients rounded to bf16 once before and once in the sum: 2^-8 relative each; with
    # clipping and Adam's normalisation the steps stay close
    same ref r 5e-3 --loss-tol 5e-3
    expect_out_re "reduced in bf16"
}

case_uneven_ranks() {
    need_mpi
    # rank r takes rank_batches[r] micro-batches of 1: together one process's batch of 4
    one ref 4
    mpi 2 $TRAIN --batch 1 --rank-batches 3,1 --zero 1 --save u2.st --metrics u2.jsonl
    expect_ok
    same ref u2 1e-5
    mpi 4 $TRAIN --batch 1 --rank-batches 1,1,1,1 --bucket-mb 0.002 --save u4.st --metrics u4.jsonl
    expect_ok
    same ref u4 1e-5
    one ref6 6
    mpi 3 $TRAIN --batch 2 --rank-batches 1,1,1 --zero 2 --save u3.st --metrics u3.jsonl
    expect_ok
    same ref6 u3 1e-5
    mpi 2 $TRAIN --batch 1 --rank-batches 3 --save x.st
    expect_usage
    expect_err "--rank-batches wants 2 counts"
    mpi 2 $TRAIN --batch 1 --rank-batches 2,1 --grad-accum 2 --save x.st
    expect_usage
    check "no weights written by the refused runs" test ! -e x.st
}

case_local_sgd() {
    need_mpi
    # SGD without momentum or clipping is linear in the gradient: averaging the weights after
    # every step equals averaging the gradients
    sgd="--optimizer sgd --momentum 0 --grad-clip 0 --lr 0.05"
    mpi 2 $TRAIN --batch 2 $sgd --save dp.st --metrics dp.jsonl
    expect_ok
    mpi 2 $TRAIN --batch 2 $sgd --local-steps 1 --save l1.st --metrics l1.jsonl
    expect_ok
    # the console and metrics give rank 0's own loss between averages: not compared
    same dp l1 1e-5 --loss-tol 10
    # H = 4: no traffic on the steps between averages, and the run learns
    mpi 2 $TRAIN --batch 2 --local-steps 4 --save l4.st --metrics l4.jsonl
    expect_ok
    b=$(sed -n 's/.*"step": \([0-9]*\),.*"comm_bytes": \([0-9]*\).*/\1 \2/p' l4.jsonl | tr '\n' ' ')
    if echo "$b" | awk '{ for (i = 1; i < NF; i += 2) { s = $i; n = $(i + 1)
            if ((s % 4 == 0 || s == 20) != (n > 0)) exit 1 } exit NF != 40 }'; then
        ok "bytes sent only on the averaging steps (4, 8, ..., 20)"
    else
        bad "bytes sent only on the averaging steps: $b"
    fi
    first=$(sed -n '1s/.*"loss": *\([0-9.]*\).*/\1/p' l4.jsonl)
    last=$(sed -n '$s/.*"loss": *\([0-9.]*\).*/\1/p' l4.jsonl)
    awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.1) }' &&
        ok "local SGD learns ($first -> $last)" || bad "local SGD learns ($first -> $last)"
    # DiLoCo: Nesterov momentum on the averaged change
    mpi 2 $TRAIN --batch 2 --local-steps 4 --outer-lr 0.7 --outer-momentum 0.9 --save d.st \
        --metrics d.jsonl
    expect_ok
    last=$(sed -n '$s/.*"loss": *\([0-9.]*\).*/\1/p' d.jsonl)
    awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.1) }' &&
        ok "DiLoCo learns ($first -> $last)" || bad "DiLoCo learns ($first -> $last)"
    check "DiLoCo is not plain averaging" sh -c "! cmp -s l4.st d.st"
    mpi 2 $TRAIN --batch 2 --local-steps 4 --zero 1 --save x.st
    expect_rc 1
    n=$(grep -c "needs ZeRO 0" "$W/stderr")
    [ "$n" -ge 1 ] && ok "local SGD with ZeRO 1 refused ($n messages)" ||
        bad "local SGD with ZeRO 1 refused"
    mpi 2 $TRAIN --batch 2 --local-steps 4 --outer-momentum 1 --save x.st
    expect_rc 2    # a flag out of its range is a usage error, as on one process
    expect_err "--outer-momentum 1: must be in [0, 1)"
    check "no weights written by the refused runs" test ! -e x.st
}

# The GPU trainer's data parallelism, on the CPU: with KILN_TRAIN_HOST_STAGING=1 the trainer
# reaches its slabs only through the backend's copies, the ranks share no slab, and each
# bucket's reduction is started as backward finishes it and waited for after backward (MPI's
# non-blocking collectives where the GPUs queue NCCL's), the loss and norm over the host's
# communicator. Equal to one process at 2 and 4 ranks, ZeRO 0 and 1, buckets or one; a
# checkpointed ZeRO 1 run resumed byte for byte. tests/gpu/test_cuda_train.sh runs it on GPUs.
case_gpu_configuration() {
    need_mpi
    one ref4 4
    KILN_TRAIN_HOST_STAGING=1
    export KILN_TRAIN_HOST_STAGING
    for np in 2 4; do
        for z in 0 1; do
            for mb in 0.002 0; do
                equal_ref4 q_np${np}_z${z}_b$mb "$np" --batch $((4 / np)) --zero "$z" \
                    --bucket-mb "$mb"
            done
        done
    done
    expect_out "gradient reduction: 1 bucket, each started with MPI's non-blocking collectives"
    R="$TRAIN --batch 2 --zero 1 --checkpoint-dir ck --checkpoint-every 10"
    mpi 2 $R --save full.st
    expect_ok
    rm -r ck/step_00000020
    mpi 2 $R --resume ck --save res.st
    expect_ok
    expect_out_re 'resumed from ck/step_00000010: step 10 of 20'
    check "the resumed run's weights equal the uninterrupted run's, byte for byte" \
        same_file full.st res.st
    unset KILN_TRAIN_HOST_STAGING
}

# Several ranks asking for GPUs: what the GPU trainer does not do across GPUs is refused on
# every rank before a GPU is asked for; without a usable GPU every rank says why and names the
# CPU; neither writes a file.
case_gpu_refused() {
    need_mpi
    cp "$GOOD" keep.st
    for f in "--zero 2" "--zero 3" "--reduce-dtype bf16" "--local-steps 2" "--rank-batches 2,1"; do
        mpi 2 $TRAIN --batch 2 --device cuda --save keep.st $f
        expect_rc 1
        n=$(grep -c "does not yet do .*--device cpu" "$W/stderr")
        [ "$n" -ge 2 ] && ok "$f on GPUs: refused on every rank ($n messages)" ||
            bad "$f on GPUs: refused on every rank ($n messages)"
    done
    if "$KILN" train $TINY --seq 16 --batch 2 --data "$DATA" --steps 0 --device cuda \
        >/dev/null 2>&1; then
        ok "a GPU is usable here: tests/gpu/test_cuda_train.sh runs the GPUs' ranks"
    else
        mpi 2 $TRAIN --batch 2 --device cuda --save keep.st --metrics m.jsonl
        expect_rc 1
        n=$(grep -Ec "(no NVIDIA driver|no CUDA GPU|built without CUDA|update the driver).*(CPU|cpu)" \
            "$W/stderr")
        [ "$n" -ge 2 ] && ok "no GPU: every rank says why and names the CPU ($n messages)" ||
            bad "no GPU: every rank says why and names the CPU ($n messages)"
        check "no metrics file" test ! -e m.jsonl
    fi
    check "the --save file is untouched" same_file "$GOOD" keep.st
}

case_flags_differ() {
    need_mpi
    cp "$GOOD" keep.st
    mpmd $TRAIN --batch 2 --save keep.st -- $TRAIN --batch 2 --save keep.st --lr 2e-3
    expect_rc 1
    n=$(grep -c "do not train the same model" "$W/stderr")
    [ "$n" -ge 2 ] && ok "every rank says the ranks differ ($n messages)" ||
        bad "every rank says the ranks differ ($n messages)"
    expect_err "configuration"
    check "the --save file is untouched" same_file "$GOOD" keep.st
}

case_rank_missing_data() {
    need_mpi
    mpmd $TRAIN --batch 2 --save a.st -- train $TINY --seq 16 --threads 1 --steps 20 \
        --lr 1e-3 --data "$W/nowhere/train_*.bin" --batch 2 --save a.st
    expect_rc 1
    expect_err "nowhere" "rank 1 failed to start"
}

# A rank given a shard of the same size as rank 0's but other tokens (the same documents with
# every letter shifted by one, through the byte tokenizer) is refused on every rank, naming
# the rank's file and rank 0's; nothing is trained or saved.
case_rank_other_data() {
    need_mpi
    mkdir other
    for f in "$FIX"/in/*.txt; do tr 'a-z' 'b-za' <"$f" >"other/$(basename "$f")"; done
    run prepare --tokenizer bytes --out o other
    expect_ok
    cp "$DATA" mine.bin
    cp o/train_000.bin theirs.bin
    check "the two shards have the same size" test "$(wc -c <mine.bin)" -eq "$(wc -c <theirs.bin)"
    cp "$GOOD" keep.st
    mpmd train $TINY --seq 16 --threads 1 --steps 5 --lr 1e-3 --data mine.bin --batch 2 \
        --save keep.st -- train $TINY --seq 16 --threads 1 --steps 5 --lr 1e-3 \
        --data theirs.bin --batch 2 --save keep.st
    expect_rc 1
    n=$(grep -c "rank 1's training data theirs.bin holds other tokens than rank 0's mine.bin" \
        "$W/stderr")
    [ "$n" -ge 2 ] && ok "every rank names both files ($n messages)" ||
        bad "every rank names both files ($n messages)"
    check "the --save file is untouched" same_file "$GOOD" keep.st
}

case_rank_killed() {
    need_mpi
    cp "$GOOD" keep.st
    LAST="mpirun -np 2 kiln train --steps 100000 (a rank killed after its first steps)"
    timeout -k 5 "$CMD_TIMEOUT" "$MPIRUN" $MPIFLAGS -np 2 "$KILN" $TRAIN --batch 2 \
        --steps 100000 --save keep.st --metrics m.jsonl </dev/null >"$W/stdout" 2>"$W/stderr" &
    job=$!
    i=0
    while [ "$(wc -l <m.jsonl 2>/dev/null || echo 0)" -lt 3 ] && [ $i -lt 300 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    # the newest of the ranks (their command lines start with the kiln binary; mpirun's and
    # timeout's do not)
    victim=$(pgrep -f -n "^$KILN train .*--steps 100000 --save keep.st")
    if [ -z "$victim" ]; then
        bad "a rank of the run can be found to kill"
        kill "$job" 2>/dev/null
        wait "$job"
        return 0
    fi
    start=$(date +%s)
    kill -9 "$victim"
    wait "$job"
    RC=$?
    took=$(($(date +%s) - start))
    [ "$RC" -ne 0 ] && [ "$RC" -ne 124 ] && ok "mpirun ends with status $RC" ||
        bad "mpirun ends with a non-zero status of its own (got $RC)"
    [ "$took" -le 30 ] && ok "within $took s of the kill" || bad "within 30 s of the kill ($took s)"
    check "the --save file of the earlier run is untouched" same_file "$GOOD" keep.st
    sleep 1
    if pgrep -f "^$KILN train .*--steps 100000 --save keep.st" >/dev/null; then
        bad "no rank of the run is left"
    else
        ok "no rank of the run is left"
    fi
}

case_resume_zero1() {
    need_mpi
    SLOW="train --layers 2 --heads 4 --embd 128 --context 64 --peak-gflops 100 --seq 64 \
--batch 12 --threads 1 --data $DATA --steps 40 --zero 1"
    mpi 2 $SLOW --save ref.st
    expect_ok
    # killed (SIGKILL) by a test hook in the writers during the step-30 checkpoint: after the
    # step-20 one, however loaded the machine is
    LAST="mpirun -np 2 kiln $SLOW --checkpoint-dir ck (KILN_TEST_CHECKPOINT_KILL=30)"
    printf '$ %s\n' "$LAST" >>"$W/log"
    timeout -k 5 "$CMD_TIMEOUT" "$MPIRUN" $MPIFLAGS -x KILN_TEST_CHECKPOINT_KILL=30 -np 2 "$KILN" \
        $SLOW --checkpoint-dir ck --checkpoint-every 10 --save res.st </dev/null >"$W/stdout" \
        2>"$W/stderr"
    RC=$?
    check "the run was killed before its end (mpirun's status $RC)" test "$RC" -ne 0 -a "$RC" -ne 124
    check "its step-20 checkpoint is complete" test -f ck/step_00000020/state.json
    check "its step-30 checkpoint is not" test ! -e ck/step_00000030
    mpi 2 $SLOW --checkpoint-dir ck --checkpoint-every 10 --save res.st --resume ck
    expect_ok
    expect_out_re 'resumed from ck/step_00000020: step 20 of 40'
    check "the resumed run's weights equal the uninterrupted run's, byte for byte" \
        same_file ref.st res.st
    check "both ranks' optimizer files are in the last checkpoint" \
        test -f ck/step_00000040/optim_rank1.bin
}

# Replicas: rank r also writes rank r-1's optimizer file, rank 1 a second model file. Rank 1's
# optimizer file deleted and model.safetensors damaged: both rebuilt from their replicas, and
# the resumed run ends byte-identical; both copies of a file bad: the checkpoint before.
case_replicas_rebuild() {
    need_mpi
    R="$TRAIN --batch 2 --zero 1 --checkpoint-dir ck --checkpoint-every 5"
    mpi 2 $R --save ref.st
    expect_ok
    check "each rank's file has its replica, and the model too: $(ls ck/step_00000015 | tr '\n' ' ')" \
        test -f ck/step_00000015/optim_rank0.replica.bin -a \
        -f ck/step_00000015/optim_rank1.replica.bin -a -f ck/step_00000015/model.replica.safetensors
    rm -r ck/step_00000020
    rm ck/step_00000015/optim_rank1.bin
    flip_byte ck/step_00000015/model.safetensors 5000
    cp -r ck ck.both
    mpi 2 $R --resume ck --save res.st
    expect_ok
    cat "$W/stderr" >>"$W/stdout"
    expect_out_re 'rebuilt ck/step_00000015/optim_rank1.bin from its replica ck/step_00000015/optim_rank1.replica.bin'
    expect_out_re 'rebuilt ck/step_00000015/model.safetensors from its replica ck/step_00000015/model.replica.safetensors'
    expect_out_re 'resumed from ck/step_00000015: step 15 of 20'
    check "the resumed run's weights equal the uninterrupted run's, byte for byte" \
        same_file ref.st res.st
    check "rank 1's optimizer file is whole again" \
        same_file ck/step_00000015/optim_rank1.bin ck/step_00000015/optim_rank1.replica.bin
    rm ck.both/step_00000015/optim_rank1.bin
    flip_byte ck.both/step_00000015/optim_rank1.replica.bin 300
    mpi 2 $R --resume ck.both --save res2.st
    expect_ok
    expect_out_re 'not loading ck.both/step_00000015: .*its replica is bad too'
    expect_out_re 'resumed from ck.both/step_00000010: step 10 of 20'
    check "the run resumed from the checkpoint before ends byte-identical" same_file ref.st res2.st
}

# ZeRO 0: every rank holds the whole optimizer state, and so does its neighbour's replica
# (the replica's size is the neighbour's range, not a reduction shard).
case_replicas_zero0() {
    need_mpi
    R="$TRAIN --batch 2 --zero 0 --checkpoint-dir ck --checkpoint-every 5"
    mpi 2 $R --save ref.st
    expect_ok
    rm -r ck/step_00000020
    rm ck/step_00000015/optim_rank0.bin
    mpi 2 $R --resume ck --save res.st
    expect_ok
    cat "$W/stderr" >>"$W/stdout"
    expect_out_re 'rebuilt ck/step_00000015/optim_rank0.bin from its replica'
    check "the resumed run's weights equal the uninterrupted run's, byte for byte" \
        same_file ref.st res.st
}

# Every rank killed (SIGKILL, by a test hook in its writer) in the middle of writing the
# step-20 checkpoint, ZeRO 2: the half-written folder is never loaded; the resume from step 10
# ends byte-identical.
case_killed_during_write() {
    need_mpi
    R="$TRAIN --steps 30 --batch 2 --zero 2 --checkpoint-dir ck --checkpoint-every 10"
    mpi 2 $TRAIN --steps 30 --batch 2 --zero 2 --save ref.st
    expect_ok
    LAST="mpirun -np 2 kiln $R --save res.st (KILN_TEST_CHECKPOINT_KILL=20)"
    printf '$ %s\n' "$LAST" >>"$W/log"
    timeout -k 5 "$CMD_TIMEOUT" "$MPIRUN" $MPIFLAGS -x KILN_TEST_CHECKPOINT_KILL=20 -np 2 "$KILN" \
        $R --save res.st </dev/null >"$W/stdout" 2>"$W/stderr"
    RC=$?
    check "the run was killed (mpirun's status $RC)" test "$RC" -ne 0 -a "$RC" -ne 124
    check "the step-20 checkpoint is not published" test ! -e ck/step_00000020
    check "latest names step 10" grep -qx step_00000010 ck/latest
    mpi 2 $R --resume ck --save res.st
    expect_ok
    expect_out_re 'resumed from ck/step_00000010: step 10 of 30'
    check "the resumed run's weights equal the uninterrupted run's, byte for byte" \
        same_file ref.st res.st
    check "no temporary folder is left" test -z "$(ls -A ck | grep '\.tmp')"
}

# One run owns a checkpoint folder under mpirun too: rank 0 holds the lock for all its ranks
# (whose checkpoint files go into the folder beside rank 0's), and a second mpirun given the
# folder is refused on every rank at once, naming the owner; the owner ends undisturbed with
# every published folder whole.
case_folder_has_one_owner() {
    need_mpi
    SLOW="train --layers 2 --heads 4 --embd 128 --context 64 --peak-gflops 100 --seq 64 \
--batch 12 --threads 1 --data $DATA --steps 30 --zero 1 --checkpoint-dir ck --checkpoint-every 1"
    LAST="mpirun -np 2 kiln $SLOW --save a.st (in the background)"
    printf '$ %s\n' "$LAST" >>"$W/log"
    "$MPIRUN" $MPIFLAGS -np 2 "$KILN" $SLOW --save a.st --metrics m.jsonl </dev/null >a.out \
        2>a.err &
    _job=$!
    wait_step 2
    owner=$(sed -n 's/.*"pid": \([0-9]*\).*/\1/p' ck/kiln.lock)
    check "the lock names a rank of the first run (pid $owner)" kill -0 "${owner:-0}"
    mpi 2 $SLOW --seed 2 --save b.st
    expect_rc 2
    n=$(grep -c "the checkpoint folder ck is in use by another run (pid $owner on host" "$W/stderr")
    [ "$n" -ge 1 ] && ok "the refusal names the owner ($n messages)" ||
        bad "the refusal names the owner ($n messages)"
    check "every rank of the refused run stopped too" grep -q "rank 0 failed to take the checkpoint folder" "$W/stderr"
    check "the refused run saved nothing" test ! -e b.st
    wait "$_job"
    RC=$?
    check "the owner finished (status $RC)" test "$RC" -eq 0
    for f in ck/step_*; do
        check "$f is whole" test -s $f/state.json -a -s $f/optim_rank0.bin -a -s $f/optim_rank1.bin
    done
    check "no temporary folder or lock is left: $(ls -A ck | tr '\n' ' ')" \
        sh -c "! ls -A ck | grep -q -e '^\.' -e lock"
}

# mpi_signal_at N SIG ARGS...: mpirun -np 2 kiln ARGS (writing m.jsonl) in the background,
# mpirun sent SIG once step N is done; mpirun's status in RC.
mpi_signal_at() {
    _n=$1 _sig=$2
    shift 2
    LAST="mpirun -np 2 kiln $* (mpirun sent SIG$_sig after step $_n)"
    printf '$ %s\n' "$LAST" >>"$W/log"
    rm -f m.jsonl
    "$MPIRUN" $MPIFLAGS -np 2 "$KILN" "$@" --metrics m.jsonl </dev/null >"$W/stdout" \
        2>"$W/stderr" &
    _job=$!
    _i=0
    while _c=$(grep -c '"step"' m.jsonl 2>/dev/null); [ "${_c:-0}" -lt "$_n" ] && [ $_i -lt 2000 ]; do
        sleep 0.01
        _i=$((_i + 1))
    done
    kill -s "$_sig" "$_job"
    wait "$_job"
    RC=$?
    printf '[exit %s]\n' "$RC" >>"$W/log"
    cat "$W/stderr" >>"$W/log"
}

# A preempted mpirun: the ranks stop after the same step, write its checkpoint together and
# exit 3; resumed, the run ends with the bytes of one never stopped. mpirun passes SIGUSR1 on
# to the ranks at once and exits with their 3. SIGTERM it passes on as part of killing the
# job (Open MPI 4.1: about a second later, and SIGKILL follows odls_base_sigkill_timeout, 1 s,
# after it), and its own status is then 1: a job script should send mpirun SIGUSR1
# (sbatch --signal=B:USR1@120), or raise that timeout above a checkpoint's time.
case_preempt_mpi() {
    need_mpi
    SLOW="train --layers 2 --heads 4 --embd 128 --context 64 --peak-gflops 100 --seq 64 \
--batch 12 --threads 1 --data $DATA --steps 80 --zero 1"
    mpi 2 $SLOW --save ref.st
    expect_ok
    for sig in TERM USR1; do
        rm -rf ck res.st
        mpi_signal_at 3 "$sig" $SLOW --checkpoint-dir ck --checkpoint-every 10 --save res.st
        if [ "$sig" = USR1 ]; then expect_rc 3; else expect_rc 1 3; fi
        expect_out_re "preempted: the checkpoint of step [0-9]+ is in ck"
        n=$(tail -n 1 m.jsonl | sed 's/^{"step": \([0-9]*\),.*/\1/')
        step=$(printf 'step_%08d' "$n")
        check "SIG$sig: the run stopped before its end (step $n)" test "$n" -lt 80
        check "both ranks wrote the checkpoint of step $n" \
            test -f "ck/$step/state.json" -a -f "ck/$step/optim_rank1.bin"
        check "latest names it" grep -qx "$step" ck/latest
        mpi 2 $SLOW --checkpoint-dir ck --checkpoint-every 10 --save res.st --resume ck
        expect_ok
        expect_out_re "resumed from ck/$step: step $n of 80"
        check "the resumed run's weights equal the uninterrupted run's, byte for byte" \
            same_file ref.st res.st
    done
}

main "$@"
