#!/bin/sh
# Hangs and heartbeats. An injected hang makes kiln train exit 4 with its heartbeat saying
# "hung"; under kiln run with checkpoints the run goes on past it and ends with the bytes of
# a run never interrupted. A trainer frozen whole (SIGSTOP), whose own watchdog cannot act,
# leaves its heartbeat stale: kiln run kills and restarts it. --fewer-ranks restarts
# `mpirun -np N` on fewer ranks (a stand-in mpirun records its arguments). The hang limits are
# made small with flags; no check is on a time.
. "$(dirname "$0")/lib.sh"

QUICK="train $TINY --seq 32 --batch 4 --threads 1 --data $DATA --steps 30"
# About 50 ms a step: a signal lands in the middle of a run.
SLOW="train --layers 2 --heads 4 --embd 128 --context 64 --peak-gflops 100 --seq 64 --batch 24 \
--threads 1 --data $DATA --steps 40"

# json_field FILE KEY: the value of KEY in the JSON object in FILE (python's repr).
json_field() {
    /usr/bin/python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"
}

case_hang_exits() {
    need_fixture
    run $QUICK --save w.st --metrics m.jsonl --hang-min-s 2 --inject-hang 0:10 \
        --heartbeat hb.json --heartbeat-s 0.2
    expect_rc 4
    expect_err "fault injection: rank 0 hangs in step 10" \
        "rank 0: no progress for" "s in step 10 (the median step takes" \
        "hung; exiting with status 4"
    check "the heartbeat is JSON and says hung" test "$(json_field hb.json health)" = hung
    check "the heartbeat names step 10" test "$(json_field hb.json step)" = 10
    check "the heartbeat names this process" test "$(json_field hb.json pid)" -gt 0
    check "the metrics end at step 9" test "$(grep -c '"step"' m.jsonl)" -eq 9
    check "no weights saved" test ! -e w.st
    no_temp_files .
}

case_heartbeat_of_a_good_run() {
    need_fixture
    run $QUICK --save w.st --heartbeat hb.json --heartbeat-s 0.05
    expect_ok
    check "the last heartbeat says ok" test "$(json_field hb.json health)" = ok
    check "it names the last step" test "$(json_field hb.json step)" = 30
    check "it says the run ended" test "$(json_field hb.json ended)" = True
    check "it has a median step time" /usr/bin/python3 -c \
        'import json; h = json.load(open("hb.json")); assert h["median_step_ms"] > 0 and h["world"] == 1'
    no_temp_files .
    run $QUICK --save w.st --no-watchdog
    expect_ok
}

case_hang_restarted_same_bytes() {
    need_fixture
    run $QUICK --save ref.st
    expect_ok
    run run --restarts 2 --backoff 0.1 -- "$KILN" $QUICK --save res.st --checkpoint-dir ck \
        --checkpoint-every 5 --metrics "$W/m.jsonl" --hang-min-s 2 --inject-hang 0:12
    expect_ok
    expect_err "exit 4 (a hung step); restart 1 of 2" "--resume"
    expect_out_re '1 hang'
    expect_out_re '0 crashes'
    expect_out_re 'goodput [0-9.]+%: 30 steps'
    check "the restarted run's weights equal the uninterrupted run's, byte for byte" \
        same_file ref.st res.st
}

case_stale_heartbeat_restarted() {
    need_fixture
    run $SLOW --save ref.st
    expect_ok
    rm -f m.jsonl
    LAST="kiln run --stale-s 1 -- kiln $SLOW ... (the trainer SIGSTOPped after step 12)"
    printf '$ %s\n' "$LAST" >>"$W/log"
    timeout -k 5 "$CMD_TIMEOUT" "$KILN" run --restarts 2 --backoff 0.1 --stale-s 1 \
        --term-grace 0.5 -- "$KILN" $SLOW --save res.st --checkpoint-dir ck --checkpoint-every 5 \
        --heartbeat "$W/hb.json" --heartbeat-s 0.1 --metrics "$W/m.jsonl" \
        </dev/null >"$W/stdout" 2>"$W/stderr" &
    sup=$!
    wait_step 12
    victim=$(pgrep -f -n "^$KILN train .*$W/m.jsonl")
    check "the supervised run can be found" test -n "$victim"
    kill -STOP "$victim"
    wait "$sup"
    RC=$?
    printf '[exit %s]\n' "$RC" >>"$W/log"
    cat "$W/stderr" >>"$W/log"
    expect_ok
    expect_err "hb.json was not renewed" "signal 9" "after a stale heartbeat" "--resume"
    expect_out_re '1 hang'
    check "the restarted run's weights equal the uninterrupted run's, byte for byte" \
        same_file ref.st res.st
}

case_fewer_ranks() {
    need_fixture
    # a stand-in mpirun: records its arguments and fails
    printf '#!/bin/sh\necho "$*" >>"%s/args.txt"\nexit 1\n' "$W" >mpirun
    chmod +x mpirun
    run run --restarts 3 --backoff 0 --fewer-ranks --min-ranks 2 -- "$W/mpirun" \
        --oversubscribe -np 4 kiln train --steps 3
    expect_rc 1
    check "four starts" test "$(wc -l <args.txt)" -eq 4
    check "on 4, 3, 2 and 2 ranks" test "$(sed 's/.*-np \([0-9]*\) .*/\1/' args.txt | tr '\n' ' ')" = "4 3 2 2 "
    check "the rest of the command unchanged" test "$(sed -n 2p args.txt)" = \
        "--oversubscribe -np 3 kiln train --steps 3"
    expect_err "starts again on 3 ranks instead of 4 (-np 4 -> -np 3)" "already at --min-ranks 2"
    expect_out_re '4 crashes'
    : >args.txt
    run run --restarts 1 --backoff 0 --fewer-ranks -- "$W/mpirun" -n 2 x
    check "-n N is rewritten too" test "$(cat args.txt | tr '\n' ' ')" = "-n 2 x -n 1 x "
    : >args.txt
    run run --restarts 1 --backoff 0 --fewer-ranks -- sh -c 'exit 4'
    expect_rc 4
    expect_err "is not \`mpirun" "exit 4 (a hung step)"
    expect_out_re '2 hangs'
}

case_bad_flags() {
    need_fixture
    run $QUICK --inject-hang 10
    expect_usage
    expect_err "--inject-hang wants RANK:STEP"
    run $QUICK --inject-slow 0:abc
    expect_usage
    run $QUICK --inject-hang 1:5
    expect_fail
    expect_err "rank 1" "1 rank"
    run $QUICK --hang-factor 2
    expect_usage
    expect_err "--hang-factor 2 is below --hang-warn-factor 5"
    run $QUICK --straggler-factor 0.5
    expect_usage
    expect_err "--straggler-factor 0.5: must be 0 (off) or in (1, 1e+06)"
    run $QUICK --heartbeat "$W/no/such/dir/hb.json"
    expect_fail
    expect_err "no/such/dir/hb.json"
    run $QUICK --no-watchdog --heartbeat hb.json
    expect_usage
    run run --stale-s 1 -- true
    expect_usage
    expect_err "--stale-s needs a heartbeat file"
    run run --min-ranks 0 -- true
    expect_usage
}

main "$@"
