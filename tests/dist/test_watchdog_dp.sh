#!/bin/sh
# The watchdog on 2 ranks under mpirun, label "dist": a rank made slower (--inject-slow) is
# named a straggler by rank 0, in a metrics event and in the heartbeats, and with
# --straggler-exit the run stops after a checkpoint with status 5; a rank that hangs
# (--inject-hang) ends both ranks with status 4. The hang limit is made small with a flag; no
# check is on a time. Uses the cli fixture's data; skipped (77) without mpirun or MPI in kiln.
. "$(dirname "$0")/../cli/lib.sh"
. "$(dirname "$0")/lib_mpi.sh"

TRAIN="train $TINY --seq 16 --threads 1 --data $DATA --steps 40 --lr 1e-3"

# py EXPR...: a python check on the run's files (m.jsonl, hb.json.rank<R>).
py() { /usr/bin/python3 -c "import json
ev = [json.loads(l) for l in open('m.jsonl') if l.strip()]
steps = [e for e in ev if 'event' not in e]
events = [e for e in ev if 'event' in e]
hb = [json.load(open('hb.json.rank%d' % r)) for r in (0, 1)]
$1"; }

case_straggler_reported() {
    need_mpi
    mpi 2 $TRAIN --save w.st --metrics m.jsonl --heartbeat hb.json --inject-slow 1:20 \
        --straggler-window 5
    expect_ok
    expect_err_re "watchdog: rank 1 is a straggler: .* is [0-9.]+x the other ranks'"
    expect_err "--rank-batches"
    check "no other rank is named" sh -c "! grep -q 'rank 0 is a straggler' '$W/stderr'"
    check "the metrics file is JSON Lines with all 40 steps" py 'assert len(steps) == 40'
    check "it holds a straggler event for rank 1 above the factor" \
        py 'assert [e["rank"] for e in events if e["event"] == "straggler"] == [1]
assert all(e["ratio"] > e["factor"] for e in events if e["event"] == "straggler")'
    check "both heartbeats say straggler, rank 1" \
        py 'assert [(h["health"], h["straggler_rank"], h["rank"], h["world"]) for h in hb] == [("straggler", 1, 0, 2), ("straggler", 1, 1, 2)]'
}

case_straggler_detection_off() {
    need_mpi
    mpi 2 $TRAIN --save w.st --metrics m.jsonl --heartbeat hb.json --inject-slow 0:20 \
        --straggler-factor 0
    expect_ok
    check "no straggler named with the detection off" sh -c "! grep -q 'straggler' '$W/stderr'"
    check "no event" py 'assert not events and all(h["health"] == "ok" for h in hb)'
}

# Ranks that would not all take part in the exchange are refused at the start, on every rank.
case_watchdogs_differ() {
    need_mpi
    LAST="mpirun -np 1 kiln $TRAIN : -np 1 kiln $TRAIN --straggler-factor 0"
    printf '$ %s\n' "$LAST" >>"$W/log"
    timeout -k 5 "$CMD_TIMEOUT" "$MPIRUN" $MPIFLAGS -np 1 "$KILN" $TRAIN --save w.st : \
        -np 1 "$KILN" $TRAIN --save w.st --straggler-factor 0 </dev/null >"$W/stdout" 2>"$W/stderr"
    RC=$?
    expect_rc 1
    expect_err "rank 0 of 2): invalid configuration: the ranks' watchdogs differ" \
        "rank 1 of 2): invalid configuration" "rank 1 not at all"
    check "nothing saved" test ! -e w.st
}

case_straggler_exit() {
    need_mpi
    mpi 2 $TRAIN --save w.st --metrics m.jsonl --heartbeat hb.json --inject-slow 1:20 \
        --straggler-window 4 --straggler-exit --checkpoint-dir ck --checkpoint-every 100
    expect_rc 5
    expect_err "has stayed a straggler"
    expect_out_re "stopped by the watchdog after step [0-9]+ .*exit 5"
    n=$(py 'print(len(steps))')
    check "it stopped before the end (step $n)" test "$n" -lt 40
    check "the checkpoint of its last step is complete" \
        test -f "ck/$(printf 'step_%08d' "$n")/state.json"
    check "no --save file (the run is not finished)" test ! -e w.st
}

case_hang_ends_both_ranks() {
    need_mpi
    mpi 2 $TRAIN --save w.st --metrics m.jsonl --heartbeat hb.json --inject-hang 1:8 \
        --hang-min-s 2
    expect_rc 4
    expect_err "fault injection: rank 1 hangs in step 8" "s in step 8 (the median step" \
        "hung; exiting with status 4"
    check "a heartbeat says hung" py 'assert "hung" in [h["health"] for h in hb]'
    check "the metrics end at step 7" py 'assert len(steps) == 7'
    check "no weights saved" test ! -e w.st
}

main "$@"
