#!/bin/sh
# Run configuration files: kiln train --config FILE takes its flags from a JSON object keyed by
# the flags' names, the command line overriding it wherever --config stands; an unknown key
# (named, with the flag it likely meant), a value of the wrong type or out of its range, and a
# missing, cut, non-object or duplicate-keyed file are usage errors (exit 2) naming the file.
# Every published step folder holds config.json, the run's resolved flags with its paths made
# absolute, and --config STEP/config.json from another folder trains the same run again: the
# same losses and the same weights, bit for bit, on one thread.
. "$(dirname "$0")/lib.sh"

# base FILE [EXTRA JSON MEMBERS]: a tiny run as a configuration file.
base() {
    printf '{"layers": 2, "heads": 2, "embd": 32, "context": 32, "peak-gflops": 100, "seq": 16, "batch": 2, "threads": 1, "data": "%s", "save": ""%s}\n' \
        "$DATA" "${2:+, $2}" >"$1"
}

# steps_in FILE: how many steps a metrics file holds.
steps_in() { grep -c '"step"' "$1" 2>/dev/null || echo 0; }

# losses FILE: each step's number and loss, nothing that depends on the clock.
losses() { sed 's/^\({"step": [0-9]*, "loss": [^,]*\),.*/\1/' "$1"; }

case_file_values_used() {
    need_fixture
    base run.json '"steps": 3, "lr": 0.002, "metrics": "m.jsonl", "optimizer": "sgd", "nesterov": true'
    run train --config run.json
    expect_ok
    check "the file's --steps 3: three steps in its --metrics file" test "$(steps_in m.jsonl)" -eq 3
    check "the file's --lr: the schedule's warmup climbs to 0.002" \
        grep -q '"step": 1, "loss": [^,]*, "lr": 0.0002,' m.jsonl
    expect_out "2 layers"
    # the same run named on the command line trains the same losses
    run train $TINY --seq 16 --batch 2 --threads 1 --data "$DATA" --save "" --steps 3 --lr 0.002 \
        --optimizer sgd --nesterov --metrics flags.jsonl
    expect_ok
    check "the file's run and the same flags' run have the same losses" \
        test "$(losses m.jsonl)" = "$(losses flags.jsonl)"
}

case_command_line_overrides() {
    need_fixture
    base run.json '"steps": 5, "metrics": "m.jsonl", "nesterov": true'
    run train --steps 2 --config run.json
    expect_ok
    check "--steps before --config overrides the file's 5" test "$(steps_in m.jsonl)" -eq 2
    run train --config=run.json --steps 4 --metrics other.jsonl
    expect_ok
    check "--steps after --config overrides it too" test "$(steps_in other.jsonl)" -eq 4
    check "and --metrics: nothing written to the file's metrics path" test "$(steps_in m.jsonl)" -eq 2
    run train --config run.json --steps 1 --metrics off.jsonl --optimizer sgd --no-nesterov \
        --checkpoint-dir ck --checkpoint-every 1
    expect_ok
    check "--no-nesterov turns off the file's true" grep -q '"nesterov":	false' ck/step_00000001/config.json
}

case_unknown_key_refused() {
    need_fixture
    base run.json '"lyers": 3'
    run train --config run.json --steps 1
    expect_usage
    expect_err 'run.json: unknown key "lyers"' 'did you mean "layers"'
    base run.json '"--steps": 3'
    run train --config run.json
    expect_usage
    expect_err 'unknown key "--steps"' '"steps"'
    base run.json '"no-nesterov": true'
    run train --config run.json
    expect_usage
    expect_err 'unknown key "no-nesterov"' '"nesterov": false'
    base run.json '"bogus-thing-entirely": 1'
    run train --config run.json
    expect_usage
    expect_err 'unknown key "bogus-thing-entirely"'
    base run.json '"config": "other.json"'
    run train --config run.json
    expect_usage
    expect_err 'unknown key "config"'
}

case_wrong_type_refused() {
    need_fixture
    for kv in '"vocab": "2"|"vocab" wants an integer' '"vocab": 2.5|"vocab" wants an integer' \
        '"lr": "1e-3"|"lr" wants a number' '"nesterov": 1|"nesterov" wants true or false' \
        '"optimizer": 3|"optimizer" wants a string' '"model": null|"model" wants a string'; do
        base run.json "${kv%%|*}"
        run train --config run.json --steps 1
        expect_usage
        expect_err "run.json: ${kv#*|}"
    done
    base run.json '"seed": 18014398509481984'
    run train --config run.json --steps 1
    expect_usage
    expect_err 'run.json: "seed"' '2^53'
}

case_out_of_range_refused() {
    need_fixture
    base run.json '"lr": -1'
    run train --config run.json --steps 1
    expect_usage
    expect_err 'run.json: --lr -1: must be a finite number >= 0'
    base run.json '"grad-accum": 0'
    run train --config run.json --steps 1
    expect_usage
    expect_err 'run.json: --grad-accum 0: must be >= 1'
    base run.json '"beta1": 1'
    run train --config run.json --steps 1
    expect_usage
    expect_err 'run.json: --beta1 1: must be in [0, 1)'
    # the file is checked as it is read, before the command line that would override it
    base run.json '"lr": -1'
    run train --config run.json --steps 1 --lr 0.001
    expect_usage
    expect_err 'run.json: --lr -1'
}

case_bad_file() {
    need_fixture
    run train --config missing.json
    expect_usage
    expect_err 'missing.json: cannot read the configuration' 'no such file'
    printf '{"steps": 3, "lr": ' >cut.json
    run train --config cut.json
    expect_usage
    expect_err 'cut.json: not valid JSON' 'cut short'
    printf '{"steps": 3}\n{"lr": 1}\n' >two.json
    run train --config two.json
    expect_usage
    expect_err 'two.json: not valid JSON at line 2'
    printf '[{"steps": 3}]\n' >array.json
    run train --config array.json
    expect_usage
    expect_err 'array.json: the configuration must be one JSON object'
    printf '{"steps": 3, "lr": 0.1, "steps": 4}\n' >dup.json
    run train --config dup.json
    expect_usage
    expect_err 'dup.json: key "steps" is given twice'
    : >empty.json
    run train --config empty.json
    expect_usage
    expect_err 'empty.json: the file is empty'
    run train --config
    expect_usage
}

# The run whose step folders the next cases read: data through a relative path, from a folder
# of its own, with flags from a file and the command line.
original_run() {
    mkdir -p orig && ln -s "$(dirname "$DATA")" orig/d
    printf '{"layers": 2, "heads": 2, "embd": 32, "context": 32, "peak-gflops": 100, "seq": 16, "batch": 2, "threads": 1, "data": "d/%s", "steps": 6, "lr": 0.002, "warmup": 2, "grad-clip": 0.5}\n' \
        "$(basename "$DATA")" >orig/run.json
    (cd orig && "$KILN" train --config run.json --save ./m.st --metrics m.jsonl --seed 7 \
        --checkpoint-dir ck --checkpoint-every 2 --checkpoint-keep 5 </dev/null >out 2>err)
    RC=$?
    LAST="(in orig/) kiln train --config run.json --save ./m.st --metrics m.jsonl --seed 7 --checkpoint-dir ck --checkpoint-every 2 --checkpoint-keep 5"
    expect_ok
}

case_config_in_every_step() {
    need_fixture
    original_run
    for s in 2 4 6; do
        f=orig/ck/step_0000000$s/config.json
        check "step $s's folder holds config.json" test -s "$f"
        check "step $s's config.json is step 6's" same_file "$f" orig/ck/step_00000006/config.json
    done
    f=orig/ck/step_00000006/config.json
    here=$(pwd)
    for kv in '"steps":	6' '"lr":	0.002' '"warmup":	2' '"grad-clip":	0.5' '"seed":	7' \
        '"layers":	2' '"checkpoint-every":	2' '"checkpoint-keep":	5' '"nesterov":	false' \
        "\"data\":	\"$here/orig/d/$(basename "$DATA")\"" "\"save\":	\"$here/orig/m.st\"" \
        "\"metrics\":	\"$here/orig/m.jsonl\"" '"precision":	"fp32"' '"watchdog":	true'; do
        check "config.json has $kv" grep -qF "$kv" "$f"
    done
    for k in config resume checkpoint-dir init val-data; do
        check "config.json leaves out \"$k\"" sh -c "! grep -q '\"$k\":' $f"
    done
    # every flag of --help is a key, but for those left out and the unset strings
    "$KILN" train --help | sed -n 's/^  --\(\[no-\]\)\{0,1\}\([a-z0-9-]*\).*/\2/p' | grep -v '^help$' >flags.txt
    missing=""
    for k in $(cat flags.txt); do
        grep -q "\"$k\":" "$f" || missing="$missing $k"
    done
    check "the keys missing are the skipped and unset ones:$missing" test "$missing" = \
        " config init val-data tensorboard checkpoint-dir resume skip-batches inject-spike teacher rank-batches plan-memory heartbeat inject-hang inject-slow"
    run train --config "$f" --steps 0
    expect_ok
    expect_err 'checkpoint-every 2 applies with a --checkpoint-dir'
}

case_rerun_reproduces() {
    need_fixture
    original_run
    mkdir elsewhere
    cd elsewhere || return 1
    run train --config ../orig/ck/step_00000004/config.json --metrics again.jsonl --save again.st
    expect_ok
    cd .. || return 1
    check "the re-run trained 6 steps" test "$(steps_in elsewhere/again.jsonl)" -eq 6
    check "its losses are the original's, bit for bit" \
        test "$(losses orig/m.jsonl)" = "$(losses elsewhere/again.jsonl)"
    check "its weights are the original's" same_file orig/m.st elsewhere/again.st
    check "the original's metrics were not written over" test "$(steps_in orig/m.jsonl)" -eq 6
    # with a checkpoint folder of its own, the re-run's step folders hold the same config.json
    # but for the outputs given anew
    cd elsewhere || return 1
    run train --config ../orig/ck/step_00000004/config.json --metrics again.jsonl --save again.st \
        --checkpoint-dir ck2 --steps 2
    expect_ok
    check "its checkpoint has config.json" test -s ck2/step_00000002/config.json
    check "with the --steps of its command line" grep -qF '"steps":	2' ck2/step_00000002/config.json
    cd .. || return 1
}

main "$@"
