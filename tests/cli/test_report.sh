#!/bin/sh
# kiln report: one self-contained HTML page from runs' metrics files and checkpoint folders.
# The page is opened in a real headless browser (Debian's chromium): it must log nothing to
# the console (no script error, nothing fetched: its Content-Security-Policy forbids the
# network), and the screenshot must show the runs' curves in their colours, counted by a PNG
# decoder of Python's zlib alone (png_pixels.py). --png writes each plot as an image, checked
# the same way. Bad input is skipped with a note and the rest still drawn.
. "$(dirname "$0")/lib.sh"

BLUE=1f77b4   # the first run's colour
ORANGE=ff7f0e # the second's

# train_run DIR [FLAGS...]: 40 steps with validation every 10 into DIR/m.jsonl.
train_run() {
    _d=$1
    shift
    mkdir -p "$_d"
    run train $TINY --seq 16 --batch 4 --threads 1 --data "$DATA" --val-data "$VAL" \
        --eval-every 10 --eval-batches 2 --steps 40 --metrics "$_d/m.jsonl" --save "" "$@"
    expect_ok
}

# browse PAGE SHOT: chromium renders PAGE to the screenshot SHOT; its console lines to
# SHOT.console. 77 (skip) when chromium is not installed.
browse() {
    _chrome=$(command -v chromium || command -v chromium-browser || true)
    if [ -z "$_chrome" ]; then
        echo "chromium is not installed (scripts/setup.sh installs it): skipped"
        exit 77
    fi
    printf '$ chromium --headless --screenshot=%s file://%s\n' "$2" "$(pwd)/$1" >>"$W/log"
    timeout -k 5 60 "$_chrome" --headless --no-sandbox --disable-gpu --hide-scrollbars \
        --user-data-dir="$(pwd)/chrome" --window-size=1000,1400 --screenshot="$(pwd)/$2" \
        --enable-logging=stderr --v=0 "file://$(pwd)/$1" >/dev/null 2>"$2.err"
    _rc=$?
    grep -F ':CONSOLE' "$2.err" >"$2.console"
    check "chromium rendered $1 (status $_rc)" test "$_rc" -eq 0 -a -s "$2"
}

no_console() {
    if [ -s "$1.console" ]; then
        bad "the page logs nothing to the browser's console: $(head -c 300 "$1.console")"
    else
        ok "the page logs nothing to the browser's console"
    fi
}

pixels() { # pixels PNG COLOUR:MIN...: the image holds at least MIN pixels of each COLOUR
    _png=$1
    shift
    _out=$(python3 "$CLI_DIR/png_pixels.py" "$_png" "$@")
    _s=$?
    printf '%s: %s\n' "$_png" "$_out" >>"$W/log"
    check "$_png has its curves drawn ($* -> $_out)" test "$_s" -eq 0
}

case_one_run() {
    need_fixture
    train_run a --checkpoint-dir a/ck --checkpoint-every 20
    run report a --out page.html --png png
    expect_ok
    expect_out "wrote page.html: 1 run, 6 plots" "wrote png/loss.png"
    check "the page names its generator" grep -q '<meta name="generator" content="kiln report">' page.html
    for p in loss lr grad_norm tokens_per_s mfu memory; do
        check "the page plots $p" grep -q "data-plot=\"$p\"" page.html
        check "png/$p.png is written" test -s "png/$p.png"
    done
    check "a series that was not logged is not plotted" sh -c '! grep -q "data-plot=\"loss_scale\"" page.html'
    check "the summary counts the run's 40 steps" grep -q '<td>40 (1-40)</td>' page.html
    check "validation is drawn dashed" grep -q 'stroke-dasharray="6 4" points=' page.html
    check "the best validation loss is in the summary" grep -Eq '<td>[0-9.]+ \(step (10|20|30|40)\)</td>' page.html
    check "the configuration comes from the newest checkpoint" grep -q 'a/ck/step_00000040/state.json' page.html
    check "the run's flags come from its config.json" grep -q 'flags (config.json)' page.html
    check "nothing is fetched: no src or href leaves the page" \
        sh -c '! grep -Eq "(src|href)=\"[a-z]*:?//" page.html'
    browse page.html shot.png
    no_console shot.png
    pixels shot.png "$BLUE:1500"
    pixels png/loss.png "$BLUE:1500"
    pixels png/lr.png "$BLUE:800"
    run report a/ck --out ck.html
    expect_ok
    expect_err "no metrics file (*.jsonl) beside the checkpoint: its configuration only"
    check "a checkpoint alone shows its configuration" grep -q 'a/ck/step_00000040/state.json' ck.html
    check "and no plot" sh -c '! grep -q "data-plot=" ck.html'
}

case_two_runs_overlaid() {
    need_fixture
    train_run a
    train_run b --lr 3e-3
    run report a/m.jsonl b/m.jsonl --out two.html --png png
    expect_ok
    expect_out "2 runs"
    check "the two runs go by their folders (both files are m.jsonl)" \
        grep -q '<title>kiln report: a/m, b/m</title>' two.html
    _n=$(grep -c 'class="series"' two.html)
    check "each plot has a curve of each run ($_n curves)" test "$_n" -ge 12
    browse two.html shot.png
    no_console shot.png
    pixels shot.png "$BLUE:1500" "$ORANGE:1500"
    pixels png/loss.png "$BLUE:1500" "$ORANGE:1500"
}

# The browser check can fail: a page with a script error or a fetch is caught.
case_browser_check_catches_errors() {
    need_fixture
    printf '<!DOCTYPE html><html><body><script>console.error("broken")</script>x</body></html>\n' >bad.html
    browse bad.html bad.png
    check "a console error is seen" grep -q '"broken"' bad.png.console
    printf '<!DOCTYPE html><html><body><p>blank</p></body></html>\n' >blank.html
    browse blank.html blank.png
    if python3 "$CLI_DIR/png_pixels.py" blank.png "$BLUE:1500" >/dev/null; then
        bad "a page without curves fails the pixel check"
    else
        ok "a page without curves fails the pixel check"
    fi
}

case_events_restarts_and_goodput() {
    need_fixture
    cat >m.jsonl <<'EOF'
{"step": 1, "loss": 5.0, "lr": 0.001, "grad_norm": 1.0, "ms": 100.0, "tokens_per_s": 640.0, "elapsed_s": 0.1}
{"step": 2, "loss": 4.9, "lr": 0.001, "grad_norm": 9.0, "ms": 100.0, "tokens_per_s": 640.0, "skipped": 1, "loss_scale": 32768, "elapsed_s": 0.2}
{"event": "skip", "step": 3, "guard": "grad_norm", "z": 7.5}
{"step": 3, "loss": 4.8, "lr": 0.001, "grad_norm": 1.0, "ms": 100.0, "tokens_per_s": 640.0, "loss_scale": 16384, "elapsed_s": 0.3}
{"event": "straggler", "step": 3, "rank": 1, "ratio": 1.8}
{"step": 2, "loss": 4.85, "lr": 0.001, "grad_norm": 1.0, "ms": 100.0, "tokens_per_s": 640.0, "loss_scale": 16384, "elapsed_s": 0.1}
{"step": 3, "loss": 4.7, "lr": 0.001, "grad_norm": 1.0, "ms": 100.0, "tokens_per_s": 640.0, "loss_scale": 16384, "elapsed_s": 0.2}
{"step": 4, "loss": 4.6, "lr": 0.001, "grad_norm": 1.0, "ms": 100.0, "tokens_per_s": 640.0, "loss_scale": 16384, "elapsed_s": 0.4}
EOF
    run report m.jsonl --out page.html
    expect_ok
    # a second process went on from step 1: steps 2-3 run again, kept once; the 4 kept steps'
    # 0.4 s over the two processes' 0.3 + 0.4 s
    check "4 steps are kept" grep -q '<td>4 (1-4)</td>' page.html
    check "goodput is the kept steps' time over the wall time" grep -q '<td>57.1%</td>' page.html
    check "tokens: each kept step's tokens/s times its time" grep -q '<td>256</td>' page.html
    check "restart, guard, overflow and straggler counts" \
        grep -q '<td>1</td><td>1</td><td>1</td><td>1</td></tr>' page.html
    for e in "guard skip" "fp16 overflow" "straggler" "restart"; do
        check "the events list a $e" grep -q "<td>$e</td>" page.html
    done
    check "the loss scale is plotted" grep -q 'data-plot="loss_scale"' page.html
    check "events are marked on the plots" grep -q 'class="mark"' page.html
    check "a restart is drawn across the plot" grep -q 'stroke-dasharray="6 4"/>' page.html
}

case_bad_input_skipped() {
    need_fixture
    train_run good
    head -c 300 good/m.jsonl >cut.jsonl # the last line cut in two
    printf '{"step": 1, "loss": 5.0, "future_metric": 3, "ms": 1.0}\n{"event": "new_kind", "step": 1}\n' >newer.jsonl
    : >empty.jsonl
    mkdir nothing
    echo 'not json at all' >nothing/readme.txt
    run report good/m.jsonl cut.jsonl newer.jsonl empty.jsonl nothing missing.jsonl --out page.html
    expect_ok
    expect_err "cut.jsonl: line" "the last line is cut" \
        "newer.jsonl: keys this kiln does not know" "future_metric" "new_kind" \
        "empty.jsonl: the file is empty" "nothing: no metrics file" "missing.jsonl: No such file"
    check "what was skipped is on the page" grep -q '<h2 id="skipped">Skipped</h2>' page.html
    check "the page says the last line is cut" grep -q 'the last line is cut' page.html
    check "the good run, the cut file's steps and the newer file are drawn" \
        grep -q '<title>kiln report: m, cut, newer</title>' page.html
    check "an unknown event is listed as it is" grep -q '<td>new_kind</td>' page.html
    browse page.html shot.png
    no_console shot.png
}

case_nothing_to_show() {
    need_fixture
    : >empty.jsonl
    mkdir nothing
    run report empty.jsonl nothing --out page.html
    expect_rc 1
    expect_err "no run to show"
    check "no page is written" test ! -e page.html
    run report
    expect_usage
    run report --out "" x
    expect_usage
}

case_out_not_replaced() {
    need_fixture
    train_run a
    echo "my notes" >notes.html
    run report a --out notes.html
    expect_rc 1
    expect_err "is not a page kiln report wrote"
    check "the file is untouched" grep -qx 'my notes' notes.html
    mkdir dir.html
    run report a --out dir.html
    expect_rc 1
    run report a --out page.html
    expect_ok
    run report a --out page.html
    expect_ok
    expect_out "wrote page.html"
    : >png
    run report a --out page2.html --png png
    expect_rc 1
    expect_err "--png png"
    no_temp_files .
}

main "$@"
