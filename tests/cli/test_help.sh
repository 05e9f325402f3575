#!/bin/sh
# kiln's help and usage errors: --help lists every command and, for each command, every
# flag with its default; unknown commands, unknown flags and bad values exit 2 with a
# message on stderr.
. "$(dirname "$0")/lib.sh"

COMMANDS="train eval sample prepare tokenizer bench run"

case_top_help() {
    for h in --help -h help; do
        run "$h"
        expect_ok
        for c in $COMMANDS; do
            check "kiln $h lists '$c'" grep -q "^  $c " "$W/stdout"
        done
    done
}

case_no_command() {
    run
    expect_usage
    check "the usage lists the commands" grep -q 'train' "$W/stderr"
}

case_unknown_command() {
    run frobnicate --steps 3
    expect_usage
    expect_err "frobnicate"
    run --steps
    expect_usage
}

# help_lists_flags NAME HELPFILE: each flag line shows a default, and every flag of the
# command's table in the source (when the source is here) is listed.
help_lists_flags() {
    name=$1
    help=$2
    n=$(grep -c '^  --' "$help")
    if [ "$n" -ge 2 ]; then ok "kiln $name --help lists flags ($n)"; else bad "kiln $name --help lists flags"; fi
    missing=$(grep '^  --' "$help" | grep -v '^  --help' | grep -v '(default: ' | head -n 3)
    if [ -z "$missing" ]; then
        ok "every flag of kiln $name shows its default"
    else
        bad "every flag of kiln $name shows its default; not: $missing"
    fi
}

# source_flags FILE: the flag names in a command's flag table.
source_flags() {
    sed -n 's/.*{"\([a-z0-9-]*\)", *TOOL_FLAG_.*/\1/p' "$1"
}

case_command_help() {
    for c in train eval sample prepare bench; do
        run "$c" --help
        expect_ok
        cp "$W/stdout" "$W/help.$c"
        help_lists_flags "$c" "$W/help.$c"
        run "$c" -h
        check "kiln $c -h is kiln $c --help" same_file "$W/stdout" "$W/help.$c"
    done
    : >"$W/help.tokenizer"
    for s in encode decode train; do
        run tokenizer "$s" --help
        expect_ok
        cp "$W/stdout" "$W/help.tokenizer.$s"
        cat "$W/stdout" >>"$W/help.tokenizer"
        help_lists_flags "tokenizer $s" "$W/help.tokenizer.$s"
    done
    run tokenizer --help
    expect_ok
    for s in encode decode train; do
        check "kiln tokenizer --help names '$s'" grep -q "tokenizer $s" "$W/stdout"
    done
    if [ ! -d "$SRC/tools/kiln" ]; then
        echo "note: $SRC/tools/kiln is absent: not comparing --help with the flag tables"
        return 0
    fi
    for c in train eval sample prepare bench tokenizer; do
        for f in $(source_flags "$SRC/tools/kiln/cmd_$c.c"); do
            if grep -q -e "^  --${f}[ =]" -e "^  --${f}\$" -e "^  --\[no-\]${f}[ =]" "$W/help.$c"; then
                ok "kiln $c --help lists --$f"
            else
                bad "kiln $c --help lists --$f (in tools/kiln/cmd_$c.c)"
            fi
        done
    done
}

case_unknown_flag() {
    for c in train eval sample prepare bench run "tokenizer encode" "tokenizer decode" "tokenizer train"; do
        # shellcheck disable=SC2086
        run $c --no-such-flag 3
        expect_usage
        expect_err "--no-such-flag"
    done
}

case_bad_values() {
    run train --steps abc
    expect_usage
    expect_err "--steps" "abc"
    run train --lr fast
    expect_usage
    expect_err "--lr" "fast"
    run train --seed 99999999999999999999999
    expect_usage
    expect_err "--seed"
    run train --nesterov=maybe
    expect_usage
    expect_err "--nesterov"
    run train --steps
    expect_usage
    expect_err "--steps"
    run train --steps=
    expect_usage
    run eval --batch 2x
    expect_usage
    run sample --tokens=-3
    expect_usage
    run bench peak --seconds -1
    expect_usage
    run bench peek
    expect_usage
    run bench
    expect_usage
}

case_unexpected_argument() {
    run train extra
    expect_usage
    expect_err "extra"
    run eval extra
    expect_usage
    run sample extra
    expect_usage
    run tokenizer decode a b
    expect_usage
}

# `kiln tokenizer` without a subcommand is a usage error: the usage goes to stderr.
case_tokenizer_usage() {
    run tokenizer
    expect_usage
    check "stdout stays empty on a usage error" test ! -s "$W/stdout"
    run tokenizer frobnicate
    expect_usage
    expect_err "frobnicate"
    run tokenizer train
    expect_usage
    run tokenizer train --vocab 100 "$W/log"
    expect_usage
    expect_err "--vocab"
}

main "$@"
