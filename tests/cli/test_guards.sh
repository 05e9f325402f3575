#!/bin/sh
# Stability guards: a non-finite or spiking step skips its update and the run goes on; bad
# steps in a row roll back to the newest checkpoint before them and skip their batches, which
# ends with the weights of a run told to skip those batches; without a checkpoint the run
# stops with the weights of the last good step named; an ordinary run is never judged bad; a
# loss that stays above the run's start is caught from the first steps on.
. "$(dirname "$0")/lib.sh"

ARGS="$TINY --seq 16 --batch 2 --threads 1 --data $DATA --steps 40 --save-every 0"
TRAIN="train $ARGS"

# metric STEP KEY: the step's metrics line holds "KEY".
step_line() { grep "^{\"step\": $1," m.jsonl; }

case_ordinary_run_not_judged() {
    need_fixture
    run $TRAIN --metrics m.jsonl --save w.st
    expect_ok
    check "no step of an ordinary run is skipped" sh -c "! grep -q '\"guard\"' m.jsonl"
    check "no event lines" sh -c "! grep -q '\"event\"' m.jsonl"
    check "40 step lines" sh -c "test \$(grep -c '^{\"step\"' m.jsonl) -eq 40"
}

case_spike_skipped() {
    need_fixture
    run $TRAIN --metrics m.jsonl --save w.st --inject-spike 30
    expect_ok
    check "step 30 is skipped as a spike" sh -c "grep '^{\"step\": 30,' m.jsonl | grep -q '\"skipped\": 1, \"guard\": \"[a-z_]*spike\"'"
    check "a skip event follows" grep -q '"event": "skip", "step": 30, "reason": "[a-z_]*spike"' m.jsonl
    check "step 31 updates again" sh -c "! grep '^{\"step\": 31,' m.jsonl | grep -q skipped"
    expect_out_re 'step +30/40 .*skipped: (loss|grad_norm)_spike'
    # the z-score threshold off: the same spike is taken (clipped) and not skipped
    run $TRAIN --metrics m2.jsonl --save w2.st --inject-spike 30 --guard-z 0
    expect_ok
    check "with --guard-z 0 nothing is skipped" sh -c "! grep -q '\"guard\"' m2.jsonl"
}

case_nonfinite_skipped() {
    need_fixture
    run $TRAIN --metrics m.jsonl --save w.st --inject-nonfinite 5
    expect_ok
    check "step 5 is skipped for its infinite gradient" sh -c "grep '^{\"step\": 5,' m.jsonl | grep -q '\"guard\": \"nonfinite_grad\"'"
    check "the run saved its weights" test -s w.st
}

# Three bad steps in a row (21-23) roll back to the step-20 checkpoint and skip their
# batches: the same weights as a run that skips those batches from the start. (A window of 20
# good steps: spikes are judged once half of it is there.)
case_rollback_skips_batches() {
    need_fixture
    run $TRAIN --save ref.st --skip-batches 21:3
    expect_ok
    expect_out_re 'guard: step 21 skips 3 step\(s\) of batches'
    run $TRAIN --metrics m.jsonl --save w.st --inject-spike 21:3 --guard-window 20 --checkpoint-dir ck \
        --checkpoint-every 10
    expect_ok
    expect_out_re 'guard: 3 bad steps in a row \(steps 21-23.*rolled back to the checkpoint of step 20'
    check "a rollback event" grep -q '"event": "rollback", "step": 23, "to_step": 20, "first_bad": 21, "skip_steps": 3' m.jsonl
    check "the steps after the rollback are not skipped" sh -c "tail -n 20 m.jsonl | grep -vq skipped"
    check "the weights equal those of a run that skipped the batches" same_file ref.st w.st
    check "no checkpoint was written during the bad steps" test ! -e ck/step_00000023
    no_temp_files ck
}

# A gradient-norm spike alone, in a run whose gradients are clipped (--grad-clip 1, the
# default), is clipped and trains on, as PyTorch's clipping does; three in a row do not stop
# the run. --guard-skip-norm-spikes skips them as before.
case_clipped_norm_spike_trains_on() {
    need_fixture
    run $TRAIN --metrics m.jsonl --save w.st --inject-spike 21:3 --inject-spike-norm-only --guard-window 20
    expect_ok
    check "step 21 updated, its norm clipped" sh -c "grep '^{\"step\": 21,' m.jsonl | grep -q '\"clipped_spike\": 1'"
    check "no step skipped" sh -c "! grep -q '\"skipped\"' m.jsonl"
    check "a clipped_spike event" grep -q '"event": "clipped_spike", "step": 23' m.jsonl
    expect_out_re 'step +22/40 .*norm spike clipped'
    check "the run saved its weights" test -s w.st
    run $TRAIN --metrics m2.jsonl --save w2.st --inject-spike 21 --inject-spike-norm-only --guard-window 20 \
        --guard-skip-norm-spikes
    expect_ok
    check "--guard-skip-norm-spikes skips it" sh -c "grep '^{\"step\": 21,' m2.jsonl | grep -q '\"guard\": \"grad_norm_spike\"'"
    # without clipping nothing bounds the update: the spike is skipped
    run $TRAIN --metrics m3.jsonl --save w3.st --inject-spike 21 --inject-spike-norm-only --guard-window 20 \
        --grad-clip 0
    expect_ok
    check "--grad-clip 0 skips it" sh -c "grep '^{\"step\": 21,' m3.jsonl | grep -q '\"guard\": \"grad_norm_spike\"'"
}

# A run that diverges right after warmup (AdamW at lr 2, unclipped), before the spike checks
# have history: its loss stays above the start, so the third such step in a row is bad
# (loss_above_start), the run stops after three bad steps, and the last good weights are saved;
# --guard-ceiling 0 lets it train on.
case_divergence_above_start_caught() {
    need_fixture
    run $TRAIN --lr 2 --grad-clip 0 --metrics m.jsonl --save w.st
    expect_fail
    expect_out_re 'skipped: loss_above_start'
    expect_err_re '3 bad steps in a row, from step [0-9]+ to step [0-9]+ \(the last: loss_above_start'
    expect_err_re 'the weights of step [0-9]+ are saved in w.st'
    first=$(grep -m 1 '"guard": "loss_above_start"' m.jsonl | sed 's/^{"step": \([0-9]*\),.*/\1/')
    check "caught early, at step ${first:-none} (before half a 50-step window)" \
        test "${first:-99}" -lt 25
    run eval --weights w.st --data $DATA --batch 2 --seq 16
    expect_ok
    run $TRAIN --lr 2 --grad-clip 0 --metrics m2.jsonl --save w2.st --guard-ceiling 0
    expect_ok
    check "with --guard-ceiling 0 no step is judged above the start" \
        sh -c "! grep -q loss_above_start m2.jsonl"
}

case_no_checkpoint_stops() {
    need_fixture
    run $TRAIN --save w.st --inject-spike 21:3 --guard-window 20
    expect_fail
    expect_err "3 bad steps in a row" "from step 21 to step 23" "no --checkpoint-dir" "step 20" \
        "saved in w.st"
    check "the last good weights (step 20) are in the --save file" test -s w.st
    run eval --weights w.st --data $DATA --batch 2 --seq 16 --threads 1
    expect_ok
    rm -f w.st
    # the rollback budget spent: the same stop, saying why
    run $TRAIN --save w.st --inject-spike 21:3 --guard-window 20 --checkpoint-dir ck --checkpoint-every 10 \
        --guard-max-rollbacks 0
    expect_fail
    expect_err "rolled back 0 time(s) already" "diverges"
    # more bad steps allowed than there are: skipped one by one, and the run ends
    run $TRAIN --save w.st --inject-spike 21:3 --guard-window 20 --guard-max-bad 4 --metrics m.jsonl
    expect_ok
    check "3 steps skipped" sh -c "test \$(grep -c '\"event\": \"skip\"' m.jsonl) -eq 3"
}

# kiln replay re-runs one step from its checkpoint: the injected spike comes back with the
# flag (a bad batch: the batches after it are normal), and without it the step is normal
# and differs from the run's log. Nothing of the run is written.
case_replay() {
    need_fixture
    R="$ARGS --checkpoint-dir ck --checkpoint-every 10 --guard-window 20"
    run train $R --metrics m.jsonl --save w.st --inject-spike 25
    expect_ok
    cp m.jsonl m.before
    run replay --step 25 $R --metrics m.jsonl --save w2.st --inject-spike 25
    expect_ok
    expect_out_re '^replay of step 25 from the checkpoint of step 20'
    expect_out_re 'the run.s log \(m.jsonl\) has step 25 at loss .*the replay reproduces it'
    expect_out_re '^verdict: bad_batch: .*--skip-batches 25:1'
    expect_out_re 'the batches of step 28, same weights'
    check "the run's log is not written" same_file m.jsonl m.before
    check "no weights are written" test ! -e w2.st
    check "no checkpoint is added" test ! -e ck/step_00000025
    run replay --step 25 $R --metrics m.jsonl
    expect_ok
    expect_out_re 'the replay differs'
    expect_out_re '^verdict: not_reproduced'
    run replay $R
    expect_usage
    run replay --step 5 $R
    expect_fail
    expect_err "no checkpoint before step 5"
}

case_bad_flags() {
    need_fixture
    for f in "--guard-max-bad 0" "--guard-window -1" "--guard-z -1" "--skip-batches 3" \
        "--skip-batches 0:1" "--skip-batches 3:1,x" "--inject-spike 3:0"; do
        run $TRAIN $f
        expect_usage
    done
}

main "$@"
