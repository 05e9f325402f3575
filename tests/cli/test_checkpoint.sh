#!/bin/sh
# Checkpoints and exact resume: a run killed (SIGKILL) after its step-20 checkpoint and resumed
# ends with the same --save bytes as one never interrupted (fp32, and bf16 with stochastic
# rounding); a damaged newest checkpoint, or a `latest` naming a missing folder, gives way to
# the newest good one with a message; a checkpoint of another model is refused with nothing
# overwritten, and another setting named; only the last K are kept (and every M-th); a checkpoint
# folder that can never be written is refused at the start; one run owns a folder at a time,
# and a dead owner's lock is taken over; a run that missed checkpoints says so in its last
# line, and one whose last checkpoint failed with no --save keeps its weights in a rescue
# file. More steps: a finished run
# extended (the schedule's total followed or kept), a checkpoint at --steps: nothing to do. Another
# split of the same global batch in one process (B x micro-batches) reads on where it should.
# The writer thread: a checkpoint written while training goes on resumes byte-identical, a kill
# during a write leaves no checkpoint that is loaded, a failed write is a warning;
# --checkpoint-sync; one process's replicas rebuild a missing or damaged file.
. "$(dirname "$0")/lib.sh"

TRAIN="train $TINY --seq 16 --batch 2 --threads 1 --data $DATA --steps 40"
# A larger model: about 50 ms a step, several steps run while a checkpoint is written.
SLOW="train --layers 2 --heads 4 --embd 128 --context 64 --peak-gflops 100 --seq 64 --batch 24 \
--threads 1 --data $DATA --steps 40"
# The same model at a quarter of the batch, for bf16 with stochastic rounding: its rounding is
# several times slower than fp32 under the sanitizers, and the kill below needs no step time.
SLOW_BF16="train --layers 2 --heads 4 --embd 128 --context 64 --peak-gflops 100 --seq 64 --batch 6 \
--threads 1 --data $DATA --steps 40 --precision bf16 --stochastic-rounding"
CK="--checkpoint-dir ck --checkpoint-every 10"

# kill_after_21 ARGS...: kiln ARGS killed with SIGKILL mid-run after its step-20 checkpoint:
# by a test hook while its writer is in the middle of the step-30 checkpoint, so that the kill
# lands at the same point however loaded the machine is (a kill from this shell, polling the
# metrics, could land after the run's end).
kill_after_21() {
    LAST="kiln $* (KILN_TEST_CHECKPOINT_KILL=30: killed with SIGKILL during the step-30 write)"
    printf '$ %s\n' "$LAST" >>"$W/log"
    KILN_TEST_CHECKPOINT_KILL=30 "$KILN" "$@" </dev/null >"$W/stdout" 2>"$W/stderr"
    RC=$?
    check "the run was killed before its end (status $RC is SIGKILL's)" test "$RC" -eq 137
    check "its step-20 checkpoint is complete" test -f ck/step_00000020/state.json
    check "its step-30 checkpoint is not" test ! -e ck/step_00000030
}

# resumed_equals ARGS...: a whole run, then a killed and resumed one: the same --save bytes.
resumed_equals() {
    run "$@" --save ref.st
    expect_ok
    kill_after_21 "$@" $CK --save res.st
    run "$@" $CK --save res.st --resume ck
    expect_ok
    expect_out_re 'resumed from ck/step_00000020: step 20 of 40'
    check "the resumed run's weights equal the uninterrupted run's, byte for byte" \
        same_file ref.st res.st
    check "the resumed run wrote its last checkpoint" test -f ck/step_00000040/state.json
    check "latest names it" grep -qx step_00000040 ck/latest
    no_temp_files ck
}

case_resume_fp32() {
    need_fixture
    resumed_equals $SLOW
}

case_resume_bf16_stochastic() {
    need_fixture
    resumed_equals $SLOW_BF16
}

case_damaged_falls_back() {
    need_fixture
    run $TRAIN $CK --save w.st
    expect_ok
    flip_byte ck/step_00000040/optim_rank0.bin 1000
    run $TRAIN --resume ck --save w2.st --steps 40
    expect_ok
    expect_out_re 'not loading ck/step_00000040: .*optim_rank0.bin does not match its checksum'
    expect_out_re 'resumed from ck/step_00000030: step 30 of 40'
    # a damaged folder named on its own is an error, not a silent fallback
    run $TRAIN --resume ck/step_00000040 --save w3.st
    expect_fail
    expect_err "optim_rank0.bin does not match its checksum"
    check "nothing saved by the refused run" test ! -e w3.st
}

case_latest_missing() {
    need_fixture
    run $TRAIN $CK --save w.st
    expect_ok
    rm -r ck/step_00000040
    run $TRAIN --resume ck --save w2.st
    expect_ok
    expect_out_re 'latest names step_00000040, which is not there'
    expect_out_re 'resumed from ck/step_00000030: step 30 of 40'
}

case_other_model_refused() {
    need_fixture
    run $TRAIN $CK --save w.st
    expect_ok
    cp w.st keep.st
    cp -r ck ck.before
    echo '{}' >m.jsonl
    run train --layers 3 --heads 2 --embd 32 --context 32 --peak-gflops 100 --seq 16 \
        --batch 2 --threads 1 --data $DATA --steps 40 $CK --resume ck --save w.st --metrics m.jsonl
    expect_fail
    expect_err "another model" "3, 2, 32"
    check "the --save file is untouched" same_file keep.st w.st
    check "the metrics file is untouched" grep -qx '{}' m.jsonl
    check "the checkpoints are untouched" diff -r ck.before ck
    run $TRAIN --optimizer sgd --resume ck --save w.st
    expect_fail
    expect_err "another optimizer"
    run $TRAIN --lr 1e-2 --resume ck --save w.st
    expect_fail
    expect_err "another configuration" "--lr is 0.0003 there and 0.01 in this run"
    run $TRAIN --warmup 3 --resume ck --save w.st
    expect_fail
    expect_err "--warmup is 10 there and 3 in this run"
    run $TRAIN --precision bf16 --resume ck --save w.st
    expect_fail
    expect_err "checkpoint of a fp32 run; this run trains in bf16"
    check "the --save file is still untouched" same_file keep.st w.st
}

# steps 41-60 of a metrics file, one per line
steps_41_to_60() {
    check "$1 holds steps 41 to 60" test "$(sed -n 's/^{"step": \([0-9]*\),.*/\1/p' "$1" |
        tr '\n' ' ')" = "$(seq 41 60 | tr '\n' ' ')"
}

# More steps: a finished 40-step run resumed with --steps 60 runs steps 41-60. The schedule
# (cosine over --steps) follows the new total from step 41, and says so; a total fixed with
# --lr-total-steps is kept, and then the extended run is the 60-step run, byte for byte.
case_more_steps() {
    need_fixture
    run $TRAIN $CK --save w.st
    expect_ok
    run $TRAIN $CK --steps 60 --resume ck --save w60.st --metrics m.jsonl
    expect_ok
    expect_out_re 'resumed from ck/step_00000040: step 40 of 60'
    expect_out_re "schedule ran over 40 steps and now follows this run's total of 60 from step 41"
    steps_41_to_60 m.jsonl
    check "the extended run's last checkpoint is of step 60" test -f ck/step_00000060/state.json
    run $TRAIN --steps 60 --lr-total-steps 60 --save ref.st
    expect_ok
    run $TRAIN --lr-total-steps 60 --checkpoint-dir ck2 --checkpoint-every 20 --save w.st
    expect_ok
    run $TRAIN --steps 60 --checkpoint-dir ck2 --checkpoint-every 20 --resume ck2 --save r.st \
        --metrics r.jsonl
    expect_ok
    expect_out_re 'schedule keeps its total of 60 steps, fixed by the run that wrote the checkpoint'
    steps_41_to_60 r.jsonl
    check "40 steps of a 60-step schedule, resumed to 60, are the 60-step run, byte for byte" \
        same_file ref.st r.st
}

# A checkpoint of step 40 resumed with --steps 40 (or fewer): nothing left to do, exit 0, no file
# touched.
case_nothing_left() {
    need_fixture
    run $TRAIN $CK --save w.st
    expect_ok
    cp w.st keep.st
    cp -r ck ck.before
    echo '{}' >m.jsonl
    for steps in 40 30; do
        run $TRAIN $CK --steps $steps --resume ck --save w.st --metrics m.jsonl
        expect_ok
        expect_out_re "the checkpoint is of step 40 and this run has $steps steps: nothing left to do"
        check "no 'done' line" sh -c "! grep -q '^done' '$W/stdout'"
        check "the --save file is untouched" same_file keep.st w.st
        check "the metrics file is untouched" grep -qx '{}' m.jsonl
        check "the checkpoints are untouched" diff -r ck.before ck
    done
}

# One process, another split of the same global batch: B=10 resumed as B=5 x 2 micro-batches.
# The loader's batch is 10 windows, then 5: their epochs are of different lengths (the few
# windows left over differ), and the checkpoint of step 120 is in the second epoch of both; the
# resumed run reads what an uninterrupted B=5 x 2 run reads (losses within 1e-5: the sums run in
# another order). Another global batch is refused, naming the --batch that matches.
case_other_split() {
    need_fixture
    T2="train $TINY --seq 16 --threads 1 --data $DATA --steps 150"
    run $T2 --batch 5 --grad-accum 2 --save ref.st --metrics ref.jsonl
    expect_ok
    run $T2 --batch 10 --checkpoint-dir ck --checkpoint-every 120 --save w.st
    expect_ok
    run $T2 --batch 5 --grad-accum 2 --resume ck/step_00000120 --save r.st --metrics r.jsonl
    expect_ok
    expect_out_re 'on 1 rank \(ZeRO 0, B=5\): data position mapped onto the new split'
    tail -n 30 ref.jsonl >ref30.jsonl
    if awk 'NR == FNR { a[FNR] = $4; next } { d = a[FNR] - $4; if (d < 0) d = -d
            if (d > 1e-5 || $2 != 120 + FNR ",") bad = 1; n++ } END { exit bad || n != 30 }' \
        ref30.jsonl r.jsonl; then
        ok "steps 121-150 have the uninterrupted B=5 x 2 run's losses"
    else
        bad "steps 121-150 have the uninterrupted B=5 x 2 run's losses: $(paste ref30.jsonl r.jsonl | head -n 3)"
    fi
    run $T2 --batch 4 --grad-accum 2 --resume ck --save x.st
    expect_fail
    expect_err "1 process of B=10 wrote this checkpoint, 10 sequences a step" \
        "with 1 process and --grad-accum 2 use --batch 5"
    check "nothing saved by the refused run" test ! -e x.st
}

case_keep_last() {
    need_fixture
    run $TRAIN --checkpoint-dir ck --checkpoint-every 5 --checkpoint-keep 2 \
        --checkpoint-keep-every 20 --save ""
    expect_ok
    check "the last 2 and every 20th are kept: $(ls ck | tr '\n' ' ')" \
        test "$(ls ck | tr '\n' ' ')" = "latest step_00000020 step_00000035 step_00000040 "
}

# A --checkpoint-dir that can never hold a checkpoint (a file, a folder under a file, a folder
# without write permission) stops the run before its first step, naming the path; nothing is
# trained or saved.
case_unwritable_dir_refused() {
    need_fixture
    : >afile
    mkdir -p ro
    for d in afile afile/ck; do
        run $TRAIN --checkpoint-dir $d --checkpoint-every 10 --save w.st
        expect_fail
        expect_err "the checkpoint folder $d cannot be" "afile is not a folder"
        check "no step was trained" sh -c "! grep -q 'step ' '$W/stdout'"
        check "nothing was saved" test ! -e w.st
    done
    if [ "$(id -u)" -ne 0 ]; then # root writes anywhere
        chmod a-w ro
        run $TRAIN --checkpoint-dir ro/ck --checkpoint-every 10 --save w.st
        expect_fail
        expect_err "cannot create the checkpoint folder ro/ck" "Permission denied"
        chmod u+w ro
    fi
}

# Warnings go to stderr; the last line of a run that finished without every checkpoint it was
# asked for says so (the run's weights are in the --save file: exit 0). With no --save file
# the final weights go to a rescue file the error names (exit 1): never lost, never silent.
case_missed_checkpoints_said_last() {
    need_fixture
    run $TRAIN --save ref.st
    expect_ok
    export KILN_TEST_CHECKPOINT_FAIL=20
    run $TRAIN $CK --save w.st
    expect_ok
    expect_err_re 'kiln: warning: the checkpoint of step 20 was not written: .*injected failure.*training goes on'
    check "no warning on stdout" sh -c "! grep -q 'warning' '$W/stdout'"
    check "the last line says a checkpoint is missing: $(tail -n 1 "$W/stderr")" \
        sh -c "tail -n 1 '$W/stderr' | grep -q 'finished, but 1 checkpoint asked for was not written (the first at step 20: .*injected failure.*); the newest in ck is step 40; the final weights are in the --save file'"
    rm -rf ck
    export KILN_TEST_CHECKPOINT_FAIL=40
    TMPDIR=$W run $TRAIN $CK --save ""
    unset KILN_TEST_CHECKPOINT_FAIL
    expect_fail
    expect_err "the checkpoint of step 40, the last, was not written to ck" "injected failure" \
        "no --save file was asked for" "are in $W/kiln-rescue-step40-"
    check "the rescued weights are the run's" same_file ref.st "$(ls "$W"/kiln-rescue-step40-*)"
    check "latest names step 30" grep -qx step_00000030 ck/latest
}

# One run owns a checkpoint folder: a second run given it while the first trains is refused
# at once (exit 2, so kiln run does not restart it), naming the owner's pid and host; the
# first finishes undisturbed, with every published folder whole. The owner's lock goes with
# it, however it ends: after a SIGKILL the next run takes the lock over and resumes.
case_folder_has_one_owner() {
    need_fixture
    run $SLOW --steps 30 --save ref.st
    expect_ok
    LAST="kiln $SLOW --steps 30 --checkpoint-dir ck --checkpoint-every 1 --save a.st (background)"
    printf '$ %s\n' "$LAST" >>"$W/log"
    "$KILN" $SLOW --steps 30 --checkpoint-dir ck --checkpoint-every 1 --save a.st \
        --metrics m.jsonl </dev/null >a.out 2>a.err &
    _a=$!
    wait_step 3
    run $SLOW --steps 30 --seed 2 --checkpoint-dir ck --checkpoint-every 1 --save b.st
    expect_usage
    expect_err "the checkpoint folder ck is in use by another run (pid $_a on host $(hostname)" \
        "give each run a --checkpoint-dir of its own"
    check "the refused run saved nothing" test ! -e b.st
    wait $_a
    check "the owner finished (status $?)" grep -q "done: 30 steps" a.out
    check "the owner's weights are an undisturbed run's" same_file ref.st a.st
    for f in ck/step_*; do
        check "$f is whole" test -s $f/state.json -a -s $f/model.safetensors -a -s $f/optim_rank0.bin
    done
    check "latest names the owner's last step" grep -qx step_00000030 ck/latest
    check "the lock went with its owner" test ! -e ck/kiln.lock
    # killed: its lock file stays, the lock does not
    rm -rf ck m.jsonl
    kill_after_21 $SLOW --steps 40 $CK --save res.st
    check "the killed run's lock file is left" grep -q '"pid"' ck/kiln.lock
    run $SLOW --steps 40 $CK --save res.st --resume ck
    expect_ok
    expect_out "taking over the lock of pid"
    expect_out_re 'resumed from ck/step_00000020'
}

# The writer thread: each checkpoint is written while training goes on (a writer slowed down
# on purpose: a write spans many steps), and resuming from it ends byte-identical.
case_background_exact() {
    need_fixture
    export KILN_TEST_CHECKPOINT_DELAY_MS=100
    run $TRAIN $CK --save w.st
    unset KILN_TEST_CHECKPOINT_DELAY_MS
    expect_ok
    expect_out_re 'checkpoint: ck/step_00000020 \(step 20\): the step paused [0-9]+ ms to copy it; written in the background in [0-9]+ ms'
    run $TRAIN $CK --resume ck/step_00000020 --save w2.st
    expect_ok
    expect_out_re 'resumed from ck/step_00000020: step 20 of 40'
    check "the run resumed from a checkpoint written in the background ends byte-identical" \
        same_file w.st w2.st
    no_temp_files ck
}

# A process killed (SIGKILL) while its writer is midway through a checkpoint: the temporary
# folder is never loaded, and the resume from the one before ends byte-identical.
case_killed_during_write() {
    need_fixture
    run $TRAIN --save ref.st
    expect_ok
    LAST="kiln $TRAIN $CK --save w.st (KILN_TEST_CHECKPOINT_KILL=20: its writer kills it)"
    printf '$ %s\n' "$LAST" >>"$W/log"
    KILN_TEST_CHECKPOINT_KILL=20 "$KILN" $TRAIN $CK --save w.st </dev/null >"$W/stdout" \
        2>"$W/stderr"
    RC=$?
    check "the run was killed during the step-20 write (status $RC)" test "$RC" -eq 137
    check "its step-20 folder is half written, under its temporary name" \
        test -f ck/.step_00000020.tmp.*/optim_rank0.bin -a ! -e ck/step_00000020
    check "latest names step 10" grep -qx step_00000010 ck/latest
    run $TRAIN $CK --resume ck --save w.st
    expect_ok
    expect_out_re 'resumed from ck/step_00000010: step 10 of 40'
    check "the resumed run's weights equal the uninterrupted run's" same_file ref.st w.st
    check "the half-written folder is gone: $(ls -A ck | tr '\n' ' ')" \
        sh -c "! ls -A ck | grep -q '^\.step_'"
}

# A background write that fails: a warning, training goes on, older checkpoints kept.
case_background_write_fails() {
    need_fixture
    export KILN_TEST_CHECKPOINT_FAIL=20
    run $TRAIN $CK --save w.st
    unset KILN_TEST_CHECKPOINT_FAIL
    expect_ok
    expect_err_re 'warning: the checkpoint of step 20 was not written: .*injected failure.*training goes on'
    check "the others are written: $(ls ck | tr '\n' ' ')" \
        test "$(ls -A ck | tr '\n' ' ')" = "latest step_00000010 step_00000030 step_00000040 "
    check "the run saved its weights" test -s w.st
}

# --checkpoint-sync: written on the training thread, resumed byte-identical.
case_sync() {
    need_fixture
    run $TRAIN $CK --checkpoint-sync --save w.st
    expect_ok
    expect_out_re 'checkpoint: ck/step_00000030 \(step 30\) in [0-9]+ ms'
    run $TRAIN $CK --checkpoint-sync --resume ck/step_00000030 --save w2.st
    expect_ok
    check "the resumed run's weights equal the first run's" same_file w.st w2.st
}

# One process with --checkpoint-replicas on: a second copy of each file; a missing optimizer
# file and a damaged model file are rebuilt from them; both copies bad: the one before.
case_replicas_one_process() {
    need_fixture
    run $TRAIN $CK --checkpoint-replicas on --save ref.st
    expect_ok
    check "the replicas are listed in state.json" \
        grep -q '"of":.*"optim_rank0.bin"' ck/step_00000030/state.json
    rm -r ck/step_00000040
    rm ck/step_00000030/optim_rank0.bin
    flip_byte ck/step_00000030/model.safetensors 5000
    cp -r ck ck.both
    run $TRAIN $CK --checkpoint-replicas on --resume ck --save w.st
    expect_ok
    expect_out_re 'rebuilt ck/step_00000030/optim_rank0.bin from its replica ck/step_00000030/optim_rank0.replica.bin'
    expect_out_re 'rebuilt ck/step_00000030/model.safetensors from its replica .*model.safetensors does not match its checksum'
    expect_out_re 'resumed from ck/step_00000030: step 30 of 40'
    check "the resumed run's weights equal the uninterrupted run's" same_file ref.st w.st
    check "the optimizer file is whole again" \
        same_file ck/step_00000030/optim_rank0.bin ck/step_00000030/optim_rank0.replica.bin
    no_temp_files ck/step_00000030
    flip_byte ck.both/step_00000030/model.replica.safetensors 5000
    run $TRAIN $CK --checkpoint-replicas on --resume ck.both --save w2.st
    expect_ok
    expect_out_re 'not loading ck.both/step_00000030: .*its replica is bad too'
    expect_out_re 'resumed from ck.both/step_00000020: step 20 of 40'
    check "the run resumed from the checkpoint before ends byte-identical" same_file ref.st w2.st
}

main "$@"
