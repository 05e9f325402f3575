#!/bin/sh
# Files kiln writes for a user: a save is whole or absent, and temporaries left by a writer
# that died mid-write are cleared by the next write of the same name.
. "$(dirname "$0")/lib.sh"

# dead_pid: the id of a process that has exited.
dead_pid() {
    sh -c 'echo $$'
}

# hold_lock FILE: a process that holds FILE's flock (a live writer, on another host say)
# until the case kills it; its pid in HOLDER.
hold_lock() {
    # one process holds the open file and its lock: killing it lets both go
    sh -c 'exec 9>>"$1" && flock -x 9 && exec sleep 60' sh "$1" &
    HOLDER=$!
    _i=0
    # until the lock is held: a second try fails
    while [ $_i -lt 200 ] && flock -x -n "$1" true; do
        sleep 0.05
        _i=$((_i + 1))
    done
}

case_stale_temporaries_removed() {
    need_fixture
    mkdir -p out
    pid=$(dead_pid)
    # What a save killed mid-write leaves: the target's name, .tmp., the writer's pid.
    printf 'partial' >out/w.safetensors.tmp."$pid".0
    printf 'partial' >out/w.safetensors.tmp."$pid".1
    printf 'keep' >out/other.safetensors.tmp."$pid".0
    printf 'live' >out/w.safetensors.tmp."$pid".2
    touch -d '2 minutes ago' out/*.tmp.*
    # A dead writer's temporary of a few seconds ago goes as well: nothing holds its lock.
    printf 'recent' >out/w.safetensors.tmp."$pid".3
    touch -d '10 seconds ago' out/w.safetensors.tmp."$pid".3
    # One whose lock is held is a live writer's (on another machine, whatever its pid).
    if command -v flock >/dev/null 2>&1; then
        hold_lock out/w.safetensors.tmp."$pid".2
    fi
    run train $TINY --seq 16 --batch 2 --steps 2 --threads 1 --data "$DATA" \
        --save out/w.safetensors
    expect_ok
    check "the saved weights exist" test -s out/w.safetensors
    check "the dead writer's temporaries are gone" \
        sh -c "! ls out | grep -q 'w.safetensors.tmp.$pid.[013]\$'"
    if [ -n "${HOLDER-}" ]; then
        check "a temporary whose flock is held is kept" test -f out/w.safetensors.tmp."$pid".2
        kill "$HOLDER"
        wait "$HOLDER" 2>/dev/null
    fi
    check "another name's temporary is not touched" test -f out/other.safetensors.tmp."$pid".0
}

# A write killed mid-way and run again within the minute leaves no temporary behind: an
# export killed with SIGKILL, and a temporary of a writer just dead planted beside it.
case_killed_write_rerun() {
    need_fixture
    mkdir -p out
    pid=$(dead_pid)
    printf 'partial' >out/x.gguf.tmp."$pid".0
    touch -d '3 seconds ago' out/x.gguf.tmp."$pid".0
    # A SIGKILL at some point of the export: mid-write or not, the rerun cleans up.
    timeout -s KILL 0.05 "$KILN" export --weights "$GOOD" --out out/x.gguf --type f32 \
        >/dev/null 2>&1
    sleep 2.1 # past the guard for a writer between its open and its lock
    run export --weights "$GOOD" --out out/x.gguf --type f32
    expect_ok
    check "the GGUF file exists" test -s out/x.gguf
    no_temp_files out
}

main "$@"
