#!/bin/sh
# kiln tokenizer: encode then decode gives the text back; train writes a tokenizer that
# encode reads; bad ids, files and tokenizers are refused with what and where.
. "$(dirname "$0")/lib.sh"

case_round_trip() {
    need_fixture
    src=$FIX/in/doc_03.txt
    for t in bytes "$T300"; do
        run tokenizer encode --tokenizer "$t" "$src"
        expect_ok
        cp "$W/stdout" ids
        check "ids are numbers separated by spaces" sh -c "tr -d '0123456789 \n' <ids | cmp -s - /dev/null"
        run tokenizer decode --tokenizer "$t" ids
        expect_ok
        check "decode(encode(text)) is the text ($(basename "$t"))" same_file "$W/stdout" "$src"
        # The same through stdin.
        run_in "$src" tokenizer encode --tokenizer "$t"
        check "stdin and a file encode alike" same_file "$W/stdout" ids
        run_in ids tokenizer decode --tokenizer "$t" -
        check "decode reads stdin" same_file "$W/stdout" "$src"
    done
    printf 'the fox' >fox.txt
    run tokenizer encode --tokenizer bytes fox.txt
    check "bytes: one id per byte" sh -c "printf '116 104 101 32 102 111 120\n' | cmp -s - '$W/stdout'"
    # Several files: one line of ids each.
    printf 'a' >a.txt
    run tokenizer encode --tokenizer bytes fox.txt a.txt
    expect_ok
    check "two files, two lines" sh -c "printf '116 104 101 32 102 111 120\n97\n' | cmp -s - '$W/stdout'"
    : >empty.txt
    run tokenizer encode --tokenizer bytes empty.txt
    expect_ok
    check "no text, no ids" sh -c "tr -d '\n' <'$W/stdout' | cmp -s - /dev/null"
}

case_train() {
    need_fixture
    run tokenizer train --vocab 280 --out t.kbpe "$FIX/in/doc_00.txt" "$FIX/in/doc_01.txt"
    expect_ok
    expect_err "t.kbpe"
    check "the tokenizer file was written" test -s t.kbpe
    run tokenizer encode --tokenizer t.kbpe "$FIX/in/doc_02.txt"
    expect_ok
    n=$(wc -w <"$W/stdout")
    b=$(wc -c <"$FIX/in/doc_02.txt")
    if [ "$n" -gt 0 ] && [ "$n" -lt "$b" ]; then ok "merges shorten the text ($b bytes, $n ids)"; else bad "fewer ids than bytes ($b bytes, $n ids)"; fi
    # The same input trains the same tokenizer.
    run tokenizer train --vocab 280 --out u.kbpe "$FIX/in/doc_00.txt" "$FIX/in/doc_01.txt"
    expect_ok
    check "training is deterministic" same_file t.kbpe u.kbpe
}

case_failed_train_keeps_file() {
    need_fixture
    cp "$T300" keep.kbpe
    run tokenizer train --vocab 300 --out keep.kbpe nope.txt
    expect_fail
    expect_err "nope.txt"
    check "keep.kbpe is unchanged" same_file keep.kbpe "$T300"
    mkdir dir
    run tokenizer train --vocab 300 --out keep.kbpe dir
    expect_fail
    check "keep.kbpe is unchanged" same_file keep.kbpe "$T300"
    no_temp_files .
}

case_bad_ids() {
    need_fixture
    printf '1 2 x3 4\n' >ids
    run tokenizer decode --tokenizer bytes ids
    expect_fail
    expect_err "x3" "byte 4"
    printf '1 2 999\n' >ids
    run tokenizer decode --tokenizer bytes ids
    expect_fail
    expect_err "999" "position 2"
    printf '1 99999999999\n' >ids
    run tokenizer decode --tokenizer bytes ids
    expect_fail
    expect_err "99999999999"
    printf '1 -2\n' >ids
    run tokenizer decode --tokenizer bytes ids
    expect_fail
    expect_err "-2"
    printf '1 296\n' >ids
    run tokenizer decode --tokenizer "$T300" ids
    expect_fail
    expect_err "296"
}

case_bad_files() {
    need_fixture
    run tokenizer encode --tokenizer bytes nope.txt
    expect_fail
    expect_err "nope.txt"
    run tokenizer decode --tokenizer bytes nope.ids
    expect_fail
    expect_err "nope.ids"
    run tokenizer encode --tokenizer nope "$FIX/in/doc_00.txt"
    expect_fail
    expect_err "nope"
    cp "$T300" damaged.kbpe
    flip_byte damaged.kbpe 30
    run tokenizer encode --tokenizer damaged.kbpe "$FIX/in/doc_00.txt"
    expect_fail
    expect_err "damaged.kbpe"
    head -c 100 "$T300" >short.kbpe
    run tokenizer encode --tokenizer short.kbpe "$FIX/in/doc_00.txt"
    expect_fail
    expect_err "short.kbpe"
    : >empty.kbpe
    run tokenizer encode --tokenizer empty.kbpe "$FIX/in/doc_00.txt"
    expect_fail
    expect_err "empty.kbpe"
    run tokenizer encode --tokenizer "$GOOD" "$FIX/in/doc_00.txt"
    expect_fail
    expect_err "good.safetensors"
}

main "$@"
