# Helpers for the kiln command's end-to-end tests (POSIX sh), sourced by tests/cli/*.sh.
#
# A test script holds functions case_<name>; `sh test_x.sh NAME` runs one of them in a fresh
# work folder, `sh test_x.sh` runs them all. Each check prints "ok" or "FAIL" with what was
# expected; a case fails when any check fails, exits 77 (CTest's skip) when it cannot run
# here, and keeps its work folder on failure.
#
# Environment: KILN_BIN, the kiln binary (required); KILN_SOURCE_DIR, the source tree;
# KILN_CLI_WORK, where work folders go; KILN_CLI_TIMEOUT, seconds one command may take.

set -u

KILN=${KILN_BIN:?"set KILN_BIN to the kiln binary"}
CLI_DIR=$(cd "$(dirname "$0")" && pwd)
SRC=${KILN_SOURCE_DIR:-$(cd "$CLI_DIR/../.." && pwd)}
WORK_ROOT=${KILN_CLI_WORK:-${TMPDIR:-/tmp}/kiln-cli-$(id -u)}
FIX=$WORK_ROOT/fixture
CMD_TIMEOUT=${KILN_CLI_TIMEOUT:-60}
# Idle OpenMP threads sleep instead of spinning: the tests share the cores with other work,
# and a spinning thread that loses its core turns a 1 ms step into a second.
OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
export OMP_WAIT_POLICY

# A model small enough for a step to take about a millisecond.
TINY="--layers 2 --heads 2 --embd 32 --context 32 --peak-gflops 100"

checks=0
failures=0
RC=0
LAST=""

case "$KILN" in
/*) ;;
*) KILN=$(pwd)/$KILN ;;
esac

ok() {
    checks=$((checks + 1))
    printf 'ok   %s\n' "$1"
}

# bad WHAT: a failed check; shows the last command, its status and the start of its stderr.
bad() {
    checks=$((checks + 1))
    failures=$((failures + 1))
    printf 'FAIL %s\n' "$1"
    printf '     command: %s\n     exit status: %s\n' "$LAST" "$RC"
    if [ -s "$W/stderr" ]; then
        printf '     stderr:\n'
        head -n 12 "$W/stderr" | sed 's/^/       /'
    fi
}

check() { # check WHAT COMMAND...: COMMAND must succeed
    _what=$1
    shift
    if "$@"; then ok "$_what"; else bad "$_what"; fi
}

# Sanitizer builds report memory errors, undefined behaviour and leaks on stderr.
sanitizer_report() {
    grep -E -q 'AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer|MemorySanitizer|ThreadSanitizer|runtime error:' "$W/stderr"
}

is_sanitized() { grep -a -q -e __asan_init -e __ubsan_handle "$KILN"; }

# run ARGS...: run kiln with ARGS (stdin from /dev/null), stdout to $W/stdout, stderr to
# $W/stderr, status in RC; then check that it neither crashed, hung nor tripped a sanitizer.
run() {
    run_in /dev/null "$@"
}

# run_in FILE ARGS...: like run, with stdin from FILE.
run_in() {
    _input=$1
    shift
    _sub=${1-}
    LAST="kiln $*"
    printf '$ %s\n' "$LAST" >>"$W/log"
    timeout -k 5 "$CMD_TIMEOUT" "$KILN" "$@" <"$_input" >"$W/stdout" 2>"$W/stderr"
    RC=$?
    printf '[exit %s]\n' "$RC" >>"$W/log"
    cat "$W/stderr" >>"$W/log"
    if [ "$RC" -eq 124 ] || [ "$RC" -eq 137 ]; then
        bad "kiln ${_sub} finished within ${CMD_TIMEOUT} s (it hung or ran away)"
    elif [ "$RC" -ge 125 ]; then
        bad "kiln ${_sub} did not crash (status $RC is a signal or an exec failure)"
    elif sanitizer_report; then
        bad "kiln ${_sub} ran clean under the sanitizers"
    fi
}

# expect_rc CODE...: the last command's status is one of CODEs.
expect_rc() {
    for _c in "$@"; do
        if [ "$RC" -eq "$_c" ]; then
            ok "exit status $RC"
            return 0
        fi
    done
    bad "exit status is one of: $* (got $RC)"
}

expect_ok() { expect_rc 0; }

# expect_fail: a failure (1) or a usage error (2), with a message on stderr.
expect_fail() {
    expect_rc 1 2
    if grep -q 'kiln' "$W/stderr"; then ok "stderr says what went wrong"; else bad "stderr has a kiln message"; fi
}

expect_usage() {
    expect_rc 2
    if [ -s "$W/stderr" ]; then ok "usage error explained on stderr"; else bad "usage error explained on stderr"; fi
}

# expect_err TEXT...: stderr holds each TEXT (fixed strings, case-insensitive).
expect_err() {
    for _t in "$@"; do
        if grep -F -i -q -e "$_t" "$W/stderr"; then ok "stderr names '$_t'"; else bad "stderr names '$_t'"; fi
    done
}

# expect_err_re REGEX: stderr matches the extended regular expression (case-insensitive).
expect_err_re() {
    if grep -E -i -q -e "$1" "$W/stderr"; then ok "stderr matches /$1/"; else bad "stderr matches /$1/"; fi
}

# expect_out TEXT...: stdout holds each TEXT (fixed strings, case-insensitive).
expect_out() {
    for _t in "$@"; do
        if grep -F -i -q -e "$_t" "$W/stdout"; then ok "stdout names '$_t'"; else bad "stdout names '$_t'"; fi
    done
}

expect_out_re() {
    if grep -E -q -e "$1" "$W/stdout"; then ok "stdout matches /$1/"; else bad "stdout matches /$1/"; fi
}

# wait_step N: until m.jsonl shows step N or later (at most 20 s).
wait_step() {
    _i=0
    while [ $_i -lt 2000 ]; do
        _c=$(grep -c '"step"' m.jsonl 2>/dev/null)
        [ "${_c:-0}" -ge "$1" ] && return 0
        sleep 0.01
        _i=$((_i + 1))
    done
}

# same_file A B: byte-identical.
same_file() { cmp -s "$1" "$2"; }

# no_temp_files DIR: a failed or finished write left no temporary files behind.
no_temp_files() {
    if ls -A "$1" | grep -q '\.tmp\.'; then
        bad "no temporary files left in $1: $(ls "$1" | grep '\.tmp\.' | head -n 3 | tr '\n' ' ')"
    else
        ok "no temporary files left in $1"
    fi
}

# ---- damaging files ----

# byte_at FILE OFFSET: the byte's value, 0..255.
byte_at() { od -A n -t u1 -j "$2" -N 1 "$1" | tr -d ' '; }

# flip_byte FILE OFFSET: replace the byte with another value.
flip_byte() {
    _v=$(byte_at "$1" "$2")
    _nv=$(((_v + 0x5a) % 256))
    # shellcheck disable=SC2059
    printf "\\$(printf %o "$_nv")" | dd of="$1" bs=1 seek="$2" conv=notrunc 2>/dev/null
}

# write_at FILE OFFSET TEXT: overwrite bytes in place.
write_at() { printf '%s' "$3" | dd of="$1" bs=1 seek="$2" conv=notrunc 2>/dev/null; }

# st_header_len FILE: a safetensors file's JSON header length (little-endian u64 at 0).
st_header_len() {
    set -- $(od -A n -t u1 -N 8 "$1")
    echo $(($1 + 256 * ($2 + 256 * ($3 + 256 * ($4 + 256 * $5)))))
}

# st_edit_header SRC DST SED: rewrite SRC's JSON header with sed; the header must keep its
# length so that the tensor data stays where the offsets say.
st_edit_header() {
    _n=$(st_header_len "$1")
    head -c $((8 + _n)) "$1" | tail -c "$_n" | sed "$3" >"$W/header.tmp"
    _m=$(wc -c <"$W/header.tmp")
    if [ "$_m" -ne "$_n" ]; then
        echo "st_edit_header: '$3' changed the header length ($_n -> $_m)" >&2
        return 1
    fi
    if head -c $((8 + _n)) "$1" | tail -c "$_n" | cmp -s - "$W/header.tmp"; then
        echo "st_edit_header: '$3' did not change the header" >&2
        return 1
    fi
    { head -c 8 "$1" && cat "$W/header.tmp" && tail -c +$((9 + _n)) "$1"; } >"$2"
}

# ---- shared data ----

# make_text DIR: ten text documents of a ten-word language, the same on every machine.
make_text() {
    mkdir -p "$1"
    awk -v dir="$1" 'BEGIN {
        split("the quick brown fox jumps over lazy dog and cat", w, " ")
        s = 7
        for (d = 0; d < 10; d++) {
            f = sprintf("%s/doc_%02d.txt", dir, d)
            for (l = 0; l < 40; l++) {
                line = ""
                for (i = 0; i < 10; i++) {
                    s = (s * 75 + 74) % 65537
                    line = line w[1 + s % 10] " "
                }
                print line > f
            }
            close(f)
        }
    }'
}

fixture_step() { # fixture_step WHAT ARGS...: a kiln command the fixture needs
    _what=$1
    shift
    if ! "$KILN" "$@" >"$FIXLOG.out" 2>"$FIXLOG.err"; then
        echo "fixture: $_what failed: kiln $*" >&2
        cat "$FIXLOG.err" >&2
        return 1
    fi
}

# fixture_build DIR: byte-level train/val shards, a trained 300-id tokenizer and shards made
# with it, and a tiny model trained on the bytes until it writes the language.
fixture_build() {
    d=$1
    rm -rf "$d"
    mkdir -p "$d"
    FIXLOG=$d/log
    make_text "$d/in" &&
        fixture_step "kiln prepare (bytes)" prepare --tokenizer bytes --out "$d/data" "$d/in" &&
        fixture_step "kiln tokenizer train" tokenizer train --vocab 300 --out "$d/t300.kbpe" \
            "$d"/in/doc_0*.txt &&
        fixture_step "kiln prepare (trained tokenizer)" prepare --tokenizer "$d/t300.kbpe" \
            --out "$d/data300" "$d/in" &&
        fixture_step "kiln train (the fixture model)" train $TINY --seq 32 --batch 4 \
            --steps 300 --lr 1e-2 --warmup 10 --threads 1 --data "$d/data/train_000.bin" \
            --save "$d/good.safetensors" &&
        for f in data/train_000.bin data/val_000.bin data300/train_000.bin data300/val_000.bin \
            good.safetensors t300.kbpe; do
            [ -s "$d/$f" ] || {
                echo "fixture: $d/$f is missing" >&2
                return 1
            }
        done
}

# fixture_install: build the shared data aside, then move it into place.
fixture_install() {
    tmp=$WORK_ROOT/fixture.tmp.$$
    if ! fixture_build "$tmp"; then
        rm -rf "$tmp"
        echo "cannot build the shared test data (see above)" >&2
        return 1
    fi
    touch "$tmp/ready"
    rm -rf "$FIX"
    mv -T "$tmp" "$FIX" 2>/dev/null || rm -rf "$tmp"
    [ -f "$FIX/ready" ]
}

# need_fixture: the shared data; built here when the fixture test has not made it, or when
# the kiln binary is newer than it.
need_fixture() {
    if [ -f "$FIX/ready" ] && [ ! "$KILN" -nt "$FIX/ready" ]; then
        return 0
    fi
    fixture_install || exit 1
}

DATA=$FIX/data/train_000.bin
VAL=$FIX/data/val_000.bin
DATA300=$FIX/data300/train_000.bin
VAL300=$FIX/data300/val_000.bin
GOOD=$FIX/good.safetensors
T300=$FIX/t300.kbpe

# damaged_weights: write damaged copies of the fixture's weights into the work folder, and
# a list, weights.list, of "FILE TEXT..." lines: the texts an error about FILE must hold
# (the file's name first, then the tensor or field at fault).
damaged_weights() {
    _n=$(st_header_len "$GOOD")
    head -c 5000 "$GOOD" >short.safetensors
    head -c 4 "$GOOD" >stub.safetensors
    head -c $((8 + _n)) "$GOOD" >header_only.safetensors
    head -c 300 "$GOOD" >cut_header.safetensors
    cp "$GOOD" garbage.safetensors
    write_at garbage.safetensors 8 "GARBAGE-GARBAGE"
    cp "$GOOD" hugelen.safetensors
    printf '\377\377\377\377\377\377\377\177' | dd of=hugelen.safetensors conv=notrunc 2>/dev/null
    : >empty.safetensors
    _t='"dtype":"F32","shape"'
    st_edit_header "$GOOD" wte_shape.safetensors "s/\"wte.weight\":{$_t:\[256,32\]/\"wte.weight\":{$_t:[128,64]/" &&
        st_edit_header "$GOOD" fc_shape.safetensors \
            "s/\"h.1.mlp.c_fc.weight\":{$_t:\[32,128\]/\"h.1.mlp.c_fc.weight\":{$_t:[64,64] /" &&
        st_edit_header "$GOOD" meta.safetensors 's/"kiln.max_seq_len":"32"/"kiln.max_seq_len":"64"/' &&
        st_edit_header "$GOOD" dtype.safetensors 's/"h.1.ln_2.bias":{"dtype":"F32"/"h.1.ln_2.bias":{"dtype":"I32"/' &&
        st_edit_header "$GOOD" renamed.safetensors 's/"h.1.ln_2.bias"/"h.1.ln_2.BIAS"/' ||
        bad "damaged copies of the weights can be made (kiln's safetensors header changed?)"
    {
        echo "nope.safetensors"
        echo "short.safetensors wte.weight"
        echo "stub.safetensors"
        echo "header_only.safetensors wte.weight"
        echo "cut_header.safetensors"
        echo "garbage.safetensors"
        echo "hugelen.safetensors"
        echo "empty.safetensors"
        echo "wte_shape.safetensors wte.weight"
        echo "fc_shape.safetensors h.1.mlp.c_fc.weight"
        echo "meta.safetensors max_seq_len"
        echo "dtype.safetensors h.1.ln_2.bias I32"
        echo "renamed.safetensors h.1.ln_2.BIAS"
        echo "$DATA train_000.bin"
        echo "$FIX/in/doc_00.txt doc_00.txt"
    } >weights.list
}

# ---- running cases ----

run_one() {
    _name=$1
    W=$WORK_ROOT/$(basename "$0" .sh).$_name
    rm -rf "$W"
    mkdir -p "$W"
    cd "$W" || exit 1
    : >"$W/log"
    checks=0
    failures=0
    echo "== $(basename "$0" .sh) $_name"
    "case_$_name"
    _status=$?
    cd "$WORK_ROOT" || exit 1
    if [ "$_status" -eq 77 ]; then
        return 77
    fi
    if [ "$checks" -eq 0 ]; then
        echo "FAIL the case made no checks"
        return 1
    fi
    if [ "$failures" -gt 0 ]; then
        echo "$failures of $checks checks failed; commands and output in $W"
        return 1
    fi
    echo "all $checks checks passed"
    rm -rf "$W"
    return 0
}

# main "$@": run the named case, or every case of the calling script.
main() {
    mkdir -p "$WORK_ROOT"
    if [ ! -x "$KILN" ]; then
        echo "KILN_BIN=$KILN is not an executable (build the kiln_cli target)" >&2
        exit 1
    fi
    if [ $# -gt 0 ]; then
        run_one "$1"
        exit $?
    fi
    worst=0
    for c in $(sed -n 's/^case_\([a-z0-9_]*\)().*/\1/p' "$0"); do
        run_one "$c"
        s=$?
        [ "$s" -eq 1 ] && worst=1
    done
    exit $worst
}
