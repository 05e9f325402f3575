#!/bin/sh
# Failures that must not cost the run, on a real full disk (a small tmpfs the test mounts;
# skipped where mounting is not allowed): a --save file that cannot be written is a warning
# and retried while training goes on; one that still cannot be written at the end goes to a
# file of its own that the error names, equal to the weights the run would have saved; a
# disk that frees up mid-run takes the retried save; checkpoints that stop fitting are
# warnings, and the older ones stay whole and resumable; TensorBoard events too.
. "$(dirname "$0")/lib.sh"

TRAIN="train $TINY --seq 16 --batch 2 --threads 1 --data $DATA --steps 40"

# mount_full KB: a tmpfs of KB KiB at ./full (skips the case where mounting is not allowed).
mount_full() {
    mkdir -p full
    if ! mount -t tmpfs -o size="$1"k tmpfs full 2>/dev/null; then
        echo "SKIP: cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN)"
        exit 77
    fi
    trap 'umount "$W/full" 2>/dev/null' EXIT
}

unmount_full() { umount full 2>/dev/null; trap - EXIT; }

case_save_rescued() {
    need_fixture
    run $TRAIN --save ref.st
    expect_ok
    mount_full 64 # the weights take 120 KiB
    TMPDIR=$W run $TRAIN --save full/w.st --save-every 10
    expect_fail
    expect_err "warning: cannot save the weights of step 10 to full/w.st" "No space left" \
        "training goes on"
    expect_err_re "trying again in 0.5 s"
    expect_err "cannot save the weights of step 40 to full/w.st" "tried 4 times" \
        "they are in $W/kiln-rescue-step40-"
    check "the run reached its last step" grep -q "step    40/40" "$W/stdout"
    check "the rescued weights equal those the run would have saved" \
        same_file ref.st "$(ls "$W"/kiln-rescue-step40-*-w.st)"
    check "the full disk holds no half-written file" sh -c "test -z \"\$(ls -A full)\""
    unmount_full
}

case_disk_frees_up() {
    need_fixture
    SLOW="train --layers 2 --heads 4 --embd 128 --context 64 --peak-gflops 100 --seq 64 \
--batch 24 --threads 1 --data $DATA --steps 40"
    run $SLOW --save ref.st
    expect_ok
    mount_full 4096
    head -c 4000k /dev/zero >full/filler 2>/dev/null
    LAST="kiln $SLOW --save full/w.st --save-every 5 (the disk freed after step 12)"
    "$KILN" $SLOW --save full/w.st --save-every 5 --metrics m.jsonl </dev/null \
        >"$W/stdout" 2>"$W/stderr" &
    _job=$!
    _i=0
    while ! grep -q '"step": \(1[2-9]\|[23][0-9]\|40\),' m.jsonl 2>/dev/null && [ $_i -lt 3000 ]; do
        sleep 0.01
        _i=$((_i + 1))
    done
    rm -f full/filler
    wait "$_job"
    RC=$?
    expect_ok
    expect_err "warning: cannot save the weights of step 5 to full/w.st"
    expect_out "saving to full/w.st works again"
    check "the final weights are in full/w.st, equal to an undisturbed run's" same_file ref.st full/w.st
    unmount_full
}

case_checkpoints_stop_fitting() {
    need_fixture
    run $TRAIN --save ref.st
    expect_ok
    # one checkpoint (about 520 KiB) fits, a second does not
    mount_full 800
    run $TRAIN --save w.st --checkpoint-dir full/ck --checkpoint-every 10 --metrics full/m.jsonl
    expect_ok
    expect_err "warning: the checkpoint of step 20 was not written"
    check "the last line says the run lacks checkpoints it was asked for" \
        sh -c "tail -n 1 '$W/stderr' | grep -q 'finished, but 3 checkpoints asked for were not written (the first at step 20: .*); the newest in full/ck is step 10; the final weights are in the --save file'"
    check "the run's weights are saved" same_file ref.st w.st
    check "latest still names the step-10 checkpoint" grep -qx step_00000010 full/ck/latest
    check "no temporary checkpoint folder is left" sh -c "! ls -A full/ck | grep -q tmp"
    # the kept checkpoint is whole: resuming it ends with the uninterrupted run's weights
    run $TRAIN --save res.st --checkpoint-dir ck2 --checkpoint-every 10 --resume full/ck
    expect_ok
    expect_out_re "resumed from full/ck/step_00000010: step 10 of 40"
    check "resumed from the kept checkpoint: the same weights" same_file ref.st res.st
    unmount_full
}

# TensorBoard events that stop fitting: a warning, training goes on, the file keeps whole
# records only (the decoder reads it to its end).
case_tensorboard_stops_fitting() {
    need_fixture
    mount_full 64
    head -c 60k /dev/zero >full/filler 2>/dev/null
    run $TRAIN --save w.st --tensorboard full/tb
    expect_ok
    expect_err "warning: cannot write TensorBoard events to full/tb/events.out.tfevents." \
        "No space left" "training goes on"
    check "the run's weights are saved" test -s w.st
    if /usr/bin/python3 -c 'import crc32c, google.protobuf' 2>/dev/null; then
        : >none.jsonl
        check "the events file holds whole records only" /usr/bin/python3 \
            "$SRC/tests/cli/tfevents_decode.py" full/tb/events.out.tfevents.* none.jsonl
    fi
    unmount_full
}

main "$@"
