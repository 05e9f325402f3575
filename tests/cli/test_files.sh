#!/bin/sh
# Files kiln writes for a user: a save is whole or absent, and temporaries left by a writer
# that died mid-write are cleared by the next write of the same name.
. "$(dirname "$0")/lib.sh"

# dead_pid: the id of a process that has exited.
dead_pid() {
    sh -c 'echo $$'
}

case_stale_temporaries_removed() {
    need_fixture
    mkdir -p out
    pid=$(dead_pid)
    # What a save killed mid-write leaves: the target's name, .tmp., the writer's pid.
    printf 'partial' >out/w.safetensors.tmp."$pid".0
    printf 'partial' >out/w.safetensors.tmp."$pid".1
    printf 'keep' >out/other.safetensors.tmp."$pid".0
    touch -d '2 minutes ago' out/*.tmp.*
    # One written just now may be a live writer's on another machine: it stays.
    printf 'fresh' >out/w.safetensors.tmp."$pid".2
    run train $TINY --seq 16 --batch 2 --steps 2 --threads 1 --data "$DATA" \
        --save out/w.safetensors
    expect_ok
    check "the saved weights exist" test -s out/w.safetensors
    check "the dead writer's old temporaries are gone" \
        sh -c "! ls out | grep -q 'w.safetensors.tmp.$pid.[01]\$'"
    check "a fresh temporary is kept" test -f out/w.safetensors.tmp."$pid".2
    check "another name's temporary is not touched" test -f out/other.safetensors.tmp."$pid".0
}

main "$@"
