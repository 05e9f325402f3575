#!/bin/sh
# kiln prepare: text files, folders and JSON Lines into shards that kiln train reads; the
# same input gives the same shards; bad input is refused with the file (and line or byte)
# at fault, and leaves an earlier output folder as it was.
. "$(dirname "$0")/lib.sh"

case_folder_of_text() {
    need_fixture
    run prepare --tokenizer bytes --out d "$FIX/in"
    expect_ok
    expect_out_re '^prepared d: 10 documents'
    for f in train_000.bin val_000.bin prepare.json; do
        check "d/$f exists" test -s "d/$f"
    done
    # The byte tokenizer has no end-of-text token: one token per byte of input.
    total=$(cat "$FIX"/in/*.txt | wc -c)
    check "$total tokens, one per byte" grep -q "^prepared d: 10 documents, $total tokens" "$W/stdout"
    run train $TINY --seq 16 --batch 2 --steps 2 --data d --val-data "d/val_*.bin" --eval-every 1 --save ""
    expect_ok
}

case_deterministic() {
    need_fixture
    run prepare --tokenizer bytes --out a "$FIX/in"
    expect_ok
    run prepare --tokenizer bytes --out b "$FIX/in" --threads 2
    expect_ok
    check "the same train shard twice" same_file a/train_000.bin b/train_000.bin
    check "the same val shard twice" same_file a/val_000.bin b/val_000.bin
    run prepare --tokenizer bytes --out c "$FIX/in" --seed 9
    expect_ok
    check "another seed splits differently" sh -c "! cmp -s a/val_000.bin c/val_000.bin"
}

case_jsonl_and_files() {
    need_fixture
    printf '{"text": "the fox"}\n{"text": "the dog and the cat"}\n{"text": "lazy"}\n' >d.jsonl
    run prepare --tokenizer bytes --val-fraction 0.34 --out j d.jsonl
    expect_ok
    expect_out_re '^prepared j: 3 documents, 30 tokens'
    run prepare --tokenizer bytes --out f "$FIX/in/doc_00.txt" "$FIX/in/doc_01.txt"
    expect_ok
    expect_out_re '^prepared f: 2 documents'
    run prepare --tokenizer "$T300" --out t "$FIX/in"
    expect_ok
    expect_out_re 'vocabulary 296'
}

case_shards_replaced() {
    need_fixture
    run prepare --tokenizer bytes --out d --shard-tokens 1000 "$FIX/in"
    expect_ok
    n=$(ls d | grep -c '^train_.*\.bin$')
    if [ "$n" -gt 5 ]; then ok "--shard-tokens 1000 makes $n train shards"; else bad "many train shards, got $n"; fi
    run prepare --tokenizer bytes --out d "$FIX/in"
    expect_ok
    check "a second prepare leaves no stale shards of the first" \
        sh -c "[ \"\$(ls d | grep -c '^train_.*\\.bin\$')\" -eq 1 ]"
    no_temp_files d
}

case_failure_keeps_output() {
    need_fixture
    run prepare --tokenizer bytes --out d "$FIX/in"
    expect_ok
    cp -r d saved
    mkdir bin
    cp "$FIX/in/doc_00.txt" bin/
    head -c 3000 "$KILN" >bin/program.bin
    run prepare --tokenizer bytes --out d bin
    expect_fail
    expect_err "program.bin"
    for f in train_000.bin val_000.bin prepare.json; do
        check "d/$f is unchanged after a failed prepare" same_file "d/$f" "saved/$f"
    done
    no_temp_files d
    run prepare --tokenizer bytes --out d bin nope.txt
    expect_fail
    check "d/train_000.bin is unchanged after a failed prepare" same_file d/train_000.bin saved/train_000.bin
}

case_bad_inputs() {
    need_fixture
    run prepare --tokenizer bytes --out d nope_dir
    expect_fail
    expect_err "nope_dir"
    mkdir empty
    run prepare --tokenizer bytes --out d empty
    expect_fail
    : >e.txt
    run prepare --tokenizer bytes --out d e.txt
    expect_fail
    expect_err "e.txt"
    mkdir bin
    head -c 3000 "$KILN" >bin/program.bin
    run prepare --tokenizer bytes --out d bin
    expect_fail
    expect_err "program.bin" "offset"
    printf '{"text": "hello"}\n{"text": 5}\nnot json\n' >bad.jsonl
    run prepare --tokenizer bytes --out d bad.jsonl
    expect_fail
    expect_err "bad.jsonl:2"
    printf '{"text": "hello"}\nnot json\n' >bad2.jsonl
    run prepare --tokenizer bytes --out d bad2.jsonl
    expect_fail
    expect_err "bad2.jsonl:2"
    run prepare --tokenizer bytes --out "$FIX/in/doc_00.txt" "$FIX/in"
    expect_fail
    expect_err "doc_00.txt"
    run prepare --tokenizer nope.kbpe --out d "$FIX/in"
    expect_fail
    expect_err "nope.kbpe"
    check "no output folder after failures" test ! -e d
}

case_binary_policies() {
    need_fixture
    mkdir bin
    cp "$FIX/in/doc_00.txt" bin/
    head -c 3000 "$KILN" >bin/program.bin
    run prepare --tokenizer bytes --out s --binary skip bin
    expect_ok
    expect_err "program.bin"
    expect_out_re '^prepared s: 1 document[ ,]'
    run prepare --tokenizer bytes --out e --binary encode bin
    expect_ok
    expect_out_re '^prepared e: 2 documents'
}

case_bad_flags() {
    need_fixture
    for a in "--val-fraction 1" "--val-fraction -0.5" "--val-fraction nan" "--shard-tokens 0" \
        "--shard-tokens -5"; do
        # shellcheck disable=SC2086
        run prepare --tokenizer bytes --out d $a "$FIX/in"
        expect_fail
        expect_err_re "${a#--* }|fraction|shard"
    done
    run prepare --tokenizer bytes --out d --binary maybe "$FIX/in"
    expect_usage
    expect_err "maybe"
    run prepare --tokenizer bytes --out d --threads -1 "$FIX/in"
    expect_usage
    expect_err "--threads"
    check "no output folder after failures" test ! -e d
}

main "$@"
