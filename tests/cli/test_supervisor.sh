#!/bin/sh
# Preemption and supervision. kiln train stopped by SIGTERM (or SIGUSR1, SIGINT) finishes its
# step, writes the checkpoint of the steps done (or, without --checkpoint-dir, the --save
# weights) and exits 3; resumed, it ends with the same --save bytes as a run never stopped; a
# second SIGTERM while stopping exits 143 at once with nothing half-written. kiln run restarts
# a command killed with SIGKILL with --resume (same final bytes, goodput printed), gives up
# after --restarts with the command's status, passes exit 3 and its signals on, exits 127
# for a command that cannot be executed, and does not restart one that exits 2 (a usage error).
. "$(dirname "$0")/lib.sh"

# About 50 ms a step: a signal lands in the middle of a run.
SLOW="train --layers 2 --heads 4 --embd 128 --context 64 --peak-gflops 100 --seq 64 --batch 24 \
--threads 1 --data $DATA --steps 40"

# signal_at N SIG ARGS...: kiln ARGS (writing m.jsonl) in the background, sent SIG once step N
# is done; its status in RC.
signal_at() {
    _n=$1 _sig=$2
    shift 2
    LAST="kiln $* (sent SIG$_sig after step $_n)"
    printf '$ %s\n' "$LAST" >>"$W/log"
    rm -f m.jsonl
    timeout -k 5 "$CMD_TIMEOUT" "$KILN" "$@" --metrics "$W/m.jsonl" </dev/null >"$W/stdout" \
        2>"$W/stderr" &
    _job=$!
    wait_step "$_n"
    kill -s "$_sig" "$(pgrep -f -n "^$KILN train .*$W/m.jsonl")" 2>/dev/null
    wait "$_job"
    RC=$?
    printf '[exit %s]\n' "$RC" >>"$W/log"
    cat "$W/stderr" >>"$W/log"
}

last_step() { tail -n 1 m.jsonl | sed 's/^{"step": \([0-9]*\),.*/\1/'; }

case_sigterm_checkpoint() {
    need_fixture
    run $SLOW --save ref.st
    expect_ok
    signal_at 7 TERM $SLOW --checkpoint-dir ck --checkpoint-every 10 --save res.st
    expect_rc 3
    n=$(last_step)
    step=$(printf 'step_%08d' "$n")
    check "the run stopped before its end (step $n)" test "$n" -lt 40
    check "the checkpoint of its last step, $n, is complete" test -f "ck/$step/state.json"
    check "latest names it" grep -qx "$step" ck/latest
    check "no --save file yet (the run is not finished)" test ! -e res.st
    expect_out_re "preempted: the checkpoint of step $n is in ck, [0-9]+ ms after the signal; exit 3"
    no_temp_files ck
    run $SLOW --checkpoint-dir ck --checkpoint-every 10 --save res.st --resume ck
    expect_ok
    expect_out_re "resumed from ck/$step: step $n of 40"
    check "the resumed run's weights equal the uninterrupted run's, byte for byte" \
        same_file ref.st res.st
}

case_sigusr1_checkpoint() {
    need_fixture
    signal_at 3 USR1 $SLOW --checkpoint-dir ck --checkpoint-every 10 --save res.st
    expect_rc 3
    check "the checkpoint of the last step is complete" \
        test -f "ck/$(printf 'step_%08d' "$(last_step)")/state.json"
}

case_sigint_saves_weights() {
    need_fixture
    signal_at 5 INT $SLOW --save w.st
    expect_rc 3
    n=$(last_step)
    check "the run stopped before its end (step $n)" test "$n" -lt 40
    expect_out_re "saved weights to w.st \\(step $n\\)"
    expect_out_re "preempted: the weights of step $n are in w.st"
    run eval --weights w.st --data "$VAL" --batch 2 --seq 32
    expect_ok
    expect_out_re 'loss'
}

case_second_signal_exits_at_once() {
    need_fixture
    # about 0.5 s a step: the second signal comes while the first is being acted on
    LAST="kiln $SLOW --batch 240 --checkpoint-dir ck (SIGTERM twice)"
    printf '$ %s\n' "$LAST" >>"$W/log"
    timeout -k 5 "$CMD_TIMEOUT" "$KILN" $SLOW --batch 240 --checkpoint-dir ck \
        --checkpoint-every 1 --save w.st --metrics "$W/m.jsonl" </dev/null >"$W/stdout" \
        2>"$W/stderr" &
    job=$!
    wait_step 1
    pid=$(pgrep -f -n "^$KILN train .*$W/m.jsonl")
    kill -TERM "$pid"
    sleep 0.1
    kill -TERM "$pid"
    wait "$job"
    RC=$?
    expect_rc 143
    check "nothing saved" test ! -e w.st
    if [ -e ck/latest ]; then
        check "latest names a complete checkpoint" test -f "ck/$(cat ck/latest)/state.json"
    else
        ok "no checkpoint was published"
    fi
}

# kiln run ARGS... in the background; its pid in SUP.
supervise() {
    LAST="kiln $*"
    printf '$ %s\n' "$LAST" >>"$W/log"
    timeout -k 5 "$CMD_TIMEOUT" "$KILN" "$@" </dev/null >"$W/stdout" 2>"$W/stderr" &
    SUP=$!
}

finish() {
    wait "$SUP"
    RC=$?
    printf '[exit %s]\n' "$RC" >>"$W/log"
    cat "$W/stderr" >>"$W/log"
}

case_run_restarts_after_kill() {
    need_fixture
    run $SLOW --save ref.st
    expect_ok
    rm -f m.jsonl
    supervise run --restarts 2 --backoff 0.1 -- "$KILN" $SLOW --checkpoint-dir ck \
        --checkpoint-every 5 --save res.st --metrics "$W/m.jsonl"
    wait_step 12
    victim=$(pgrep -f -n "^$KILN train .*$W/m.jsonl")
    check "the supervised run can be found" test -n "$victim"
    kill -9 "$victim"
    finish
    expect_ok
    expect_err "signal 9" "restart 1 of 2" "--resume"
    expect_out_re 'goodput [0-9.]+%: 40 steps.* 1 restart$'
    check "the restarted run's weights equal the uninterrupted run's, byte for byte" \
        same_file ref.st res.st
    check "the last checkpoint is there" test -f ck/step_00000040/state.json
}

case_run_passes_preemption_on() {
    need_fixture
    rm -f m.jsonl
    supervise run -- "$KILN" $SLOW --checkpoint-dir ck --checkpoint-every 10 --save w.st \
        --metrics "$W/m.jsonl"
    wait_step 3
    kill -TERM "$(pgrep -f -n "^$KILN run .*$W/m.jsonl")"
    finish
    expect_rc 3
    expect_err "preempted"
    check "the child wrote its checkpoint" test -f ck/latest
    check "no restart" sh -c "! grep -q 'restart 1' '$W/stderr'"
}

case_run_gives_up() {
    need_fixture
    run run --restarts 2 --backoff 0.1 -- sh -c 'exit 7'
    expect_rc 7
    expect_err "giving up after 2 restarts" "exit 7"
    check "two restarts" test "$(grep -c 'restart [0-9] of 2' "$W/stderr")" -eq 2
}

# A command that fails on its own arguments (exit 2) fails the same way every time: no
# restart, the reason said, the command's status passed on.
case_run_usage_error_not_restarted() {
    need_fixture
    run run --restarts 3 --backoff 0.1 -- "$KILN" train --steps -5 --data "$DATA"
    expect_rc 2
    expect_err "--steps" "usage error" "not restarting"
    check "no restart" sh -c "! grep -q 'restart 1' '$W/stderr'"
    check "the command ran once" test "$(grep -c 'kiln train: ' "$W/stderr")" -eq 1
}

case_run_exec_fails() {
    need_fixture
    LAST="kiln run -- /nonexistent"
    "$KILN" run -- "$W/nonexistent" </dev/null >"$W/stdout" 2>"$W/stderr"
    RC=$?
    expect_rc 127
    expect_err "cannot execute" "nonexistent"
    check "no restart" sh -c "! grep -q restart '$W/stderr'"
}

case_run_bad_input() {
    need_fixture
    run run --
    expect_usage
    expect_err "no command"
    run run --restarts 2
    expect_usage
    run run --restarts -1 -- true
    expect_usage
    run run -- true
    expect_ok
    expect_out_re 'goodput unknown'
}

main "$@"
