#!/bin/sh
# Watching a live run: the console line gives the elapsed time and the time left; kiln status
# reads a run's heartbeat files (one process, or every rank's) and prints each rank's step,
# health and step times and the expected end, exiting 0 while all is well (and after the end),
# 1 when a rank is hung, stale or missing, 2 when there is no heartbeat to read.
. "$(dirname "$0")/lib.sh"

SLOW="train --layers 2 --heads 4 --embd 128 --context 64 --peak-gflops 100 --seq 64 --batch 24 \
--threads 1 --data $DATA"

# beat FILE RANK WORLD HEALTH AGE_S [ENDED]: a heartbeat file as kiln train writes it, AGE_S old.
beat() {
    _t=$(($(date +%s) - $5))
    printf '{"pid": 4242, "rank": %d, "world": %d, "step": 7, "steps": 20, "in_step": true, "progress_time": %d.0, "since_progress_s": 0.5, "last_step_ms": 40.0, "median_step_ms": 41.0, "health": "%s", "straggler_rank": -1, "straggler_ratio": null, "ended": %s, "time": %d.0}\n' \
        "$2" "$3" "$_t" "$4" "${6:-false}" "$_t" >"$1"
}

case_console_elapsed_and_left() {
    need_fixture
    run train $TINY --seq 16 --batch 2 --threads 1 --data $DATA --steps 5 --save ""
    expect_ok
    check "the first step's line has the elapsed time alone" \
        grep -Eq 'step +1/5 .*\| [0-9]+:[0-9]{2} elapsed$' "$W/stdout"
    check "the later lines have the time left too" \
        grep -Eq 'step +5/5 .*\| [0-9]+:[0-9]{2} elapsed, [0-9]+:[0-9]{2} left$' "$W/stdout"
}

case_live_run() {
    need_fixture
    LAST="kiln $SLOW --steps 400 --heartbeat hb --heartbeat-s 0.2 --metrics m.jsonl (background)"
    printf '$ %s\n' "$LAST" >>"$W/log"
    # shellcheck disable=SC2086
    "$KILN" $SLOW --steps 400 --save "" --heartbeat hb --heartbeat-s 0.2 --metrics m.jsonl \
        </dev/null >a.out 2>a.err &
    _job=$!
    wait_step 5
    sleep 0.5
    run status hb
    expect_ok
    expect_out_re "^0 +$_job +[0-9]+/400 +ok "
    expect_out_re "^step [0-9]+ of 400; expected end: .* from now"
    kill -STOP $_job # a process stopped whole: its heartbeat goes stale
    sleep 1.5
    run status --stale-s 1 hb
    expect_rc 1
    expect_out_re "^0 +$_job +[0-9]+/400 +stale "
    expect_err "unhealthy"
    kill -CONT $_job
    kill $_job
    wait $_job
    check "the stopped run ended on its signal (status $?)" true
}

case_ended_run() {
    need_fixture
    run $SLOW --steps 3 --save "" --heartbeat hb
    expect_ok
    run status hb
    expect_ok
    expect_out_re "^0 +[0-9]+ +3/3 +ended "
    expect_out "the run ended"
}

case_ranks() {
    need_fixture
    beat hb.rank0 0 3 ok 0
    beat hb.rank1 1 3 hung 0
    beat hb.rank2 2 3 ok 0
    run status hb
    expect_rc 1
    expect_out_re "^1 +4242 +7/20 +hung "
    expect_out_re "^step 7 of 20; expected end: "
    beat hb.rank1 1 3 ok 0
    run status hb
    expect_ok
    rm hb.rank2
    run status hb
    expect_rc 1
    expect_out_re "^2 .*missing"
    mkdir beats
    beat beats/a 0 2 ok 0
    beat beats/b 1 2 ok 100
    : >beats/not-a-heartbeat
    run status beats
    expect_rc 1
    expect_out_re "^1 +4242 +7/20 +stale "
}

case_bad_input() {
    need_fixture
    run status nothing
    expect_rc 2
    expect_err "no heartbeat at nothing" "--heartbeat nothing"
    echo '{"step": 1}' >notbeat
    run status notbeat
    expect_rc 2
    expect_err "notbeat is not a kiln heartbeat file"
    mkdir empty
    run status empty
    expect_rc 2
    expect_err "empty holds no kiln heartbeat file"
    run status
    expect_usage
    run status --stale-s 0 hb
    expect_usage
    expect_err "--stale-s 0: must be > 0"
}

main "$@"
