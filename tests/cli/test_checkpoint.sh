#!/bin/sh
# Checkpoints and exact resume: a run killed (SIGKILL) after its step-20 checkpoint and resumed
# ends with the same --save bytes as one never interrupted (fp32, and bf16 with stochastic
# rounding); a damaged newest checkpoint, or a `latest` naming a missing folder, gives way to
# the newest good one with a message; a checkpoint of another model is refused with nothing
# overwritten; only the last K are kept (and every M-th); a checkpoint folder that cannot be
# written is a warning and the run finishes. The writer thread: a checkpoint written while
# training goes on resumes byte-identical, a kill during a write leaves no checkpoint that is
# loaded, a failed write is a warning; --checkpoint-sync; one process's replicas rebuild a
# missing or damaged file.
. "$(dirname "$0")/lib.sh"

TRAIN="train $TINY --seq 16 --batch 2 --threads 1 --data $DATA --steps 40"
# A larger model: about 50 ms a step, several steps run while a checkpoint is written.
SLOW="train --layers 2 --heads 4 --embd 128 --context 64 --peak-gflops 100 --seq 64 --batch 24 \
--threads 1 --data $DATA --steps 40"
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
    resumed_equals $SLOW --precision bf16 --stochastic-rounding
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
    expect_err "another configuration"
}

case_keep_last() {
    need_fixture
    run $TRAIN --checkpoint-dir ck --checkpoint-every 5 --checkpoint-keep 2 \
        --checkpoint-keep-every 20 --save ""
    expect_ok
    check "the last 2 and every 20th are kept: $(ls ck | tr '\n' ' ')" \
        test "$(ls ck | tr '\n' ' ')" = "latest step_00000020 step_00000035 step_00000040 "
}

case_unwritable_dir_warns() {
    need_fixture
    : >afile
    run $TRAIN --checkpoint-dir afile/ck --checkpoint-every 10 --save w.st
    expect_ok
    expect_out_re 'warning: the checkpoint of step 10 was not written: .*afile/ck.*training goes on'
    check "every interval is tried again (4 warnings)" \
        test "$(grep -c 'warning: the checkpoint' "$W/stdout")" -eq 4
    check "the run saved its weights" test -s w.st
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
        test -f ck/.step_00000020.tmp/optim_rank0.bin -a ! -e ck/step_00000020
    check "latest names step 10" grep -qx step_00000010 ck/latest
    run $TRAIN $CK --resume ck --save w.st
    expect_ok
    expect_out_re 'resumed from ck/step_00000010: step 10 of 40'
    check "the resumed run's weights equal the uninterrupted run's" same_file ref.st w.st
    check "the half-written folder is gone" test ! -e ck/.step_00000020.tmp
}

# A background write that fails: a warning, training goes on, older checkpoints kept.
case_background_write_fails() {
    need_fixture
    export KILN_TEST_CHECKPOINT_FAIL=20
    run $TRAIN $CK --save w.st
    unset KILN_TEST_CHECKPOINT_FAIL
    expect_ok
    expect_out_re 'warning: the checkpoint of step 20 was not written: .*injected failure.*training goes on'
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
