#!/bin/sh
# Bad data that must not hurt: FIFOs and devices where files are expected (refused by name,
# never waited on), inputs without end (bounded), shards of two tokenizers, folders that a
# cut-short prepare left mixed, too many shards, odd file names and JSON strings, an output
# folder inside an input folder, and messages that keep their reason.
. "$(dirname "$0")/lib.sh"

# A FIFO that nothing writes: opening it for reading would wait forever. Commands here get a
# short timeout, so that a regression fails the case instead of hanging it.
FIFO_TIMEOUT=15

# bounded_begin / bounded_end: run the checks between them in a subshell whose memory is
# capped (ulimit -v; under the sanitizers, ASan's RSS limit), so that a regression that reads
# /dev/zero without end fails the case instead of taking the machine's memory.
bounded_counts() {
    [ -f "$W/counts" ] || {
        bad "the capped checks ran"
        return 0
    }
    read -r _c _f <"$W/counts"
    checks=$((checks + _c))
    failures=$((failures + _f))
    rm -f "$W/counts"
}
cap_memory() {
    if is_sanitized; then
        ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}hard_rss_limit_mb=2000
        export ASAN_OPTIONS
    else
        ulimit -v 2000000 || exit 1
    fi
    CMD_TIMEOUT=20
}

# 1. --data naming a FIFO, a folder holding one, a pattern in a missing folder.
case_fifo_data() {
    need_fixture
    CMD_TIMEOUT=$FIFO_TIMEOUT
    mkfifo pipe.bin
    run train $TINY --seq 16 --batch 2 --steps 1 --data pipe.bin --save ""
    expect_fail
    expect_err "pipe.bin" "FIFO"
    check "a FIFO is not called missing" sh -c "! grep -q -i 'not found\|no such' '$W/stderr'"
    mkdir d
    cp "$DATA" d/a.bin
    mkfifo d/b.bin
    run train $TINY --seq 16 --batch 2 --steps 1 --data d --save ""
    expect_fail
    expect_err "b.bin" "FIFO"
    run eval --weights "$GOOD" --data 'd/*.bin' --batch 2 --seq 16 --batches 1
    expect_fail
    expect_err "b.bin" "FIFO"
    run train $TINY --seq 16 --batch 2 --steps 1 --data 'nodir/train_*.bin' --save ""
    expect_fail
    expect_err "nodir" "does not exist"
    run train $TINY --seq 16 --batch 2 --steps 1 --data nodir/train_000.bin --save ""
    expect_fail
    expect_err "nodir" "does not exist"
}

# 2. Inputs without end: /dev/zero, stdin from /dev/zero, FIFOs and devices for prepare.
case_unbounded_inputs() {
    need_fixture
    (
        cap_memory
        run tokenizer encode --tokenizer bytes /dev/zero
        expect_fail
        expect_err "/dev/zero" "device"
        run tokenizer decode --tokenizer bytes /dev/zero
        expect_fail
        expect_err "/dev/zero" "device"
        run tokenizer train --vocab 300 --out t.kbpe /dev/zero
        expect_fail
        expect_err "/dev/zero" "device"
        run_in /dev/zero tokenizer encode --tokenizer bytes --max-input 100000
        expect_fail
        expect_err "stdin" "100000" "--max-input"
        run_in /dev/zero tokenizer decode --tokenizer bytes --max-input 100000 -
        expect_fail
        expect_err "stdin" "100000"
        run_in /dev/zero tokenizer train --vocab 300 --out t.kbpe --max-input 100000 -
        expect_fail
        expect_err "stdin" "100000"
        check "no tokenizer written" test ! -e t.kbpe
        run prepare --tokenizer bytes --out z /dev/zero
        expect_fail
        expect_err "/dev/zero" "device"
        echo "$checks $failures" >"$W/counts"
    )
    bounded_counts
    # Under the limit, stdin still works.
    run_in "$FIX/in/doc_00.txt" tokenizer encode --tokenizer bytes --max-input 100000
    expect_ok
    CMD_TIMEOUT=$FIFO_TIMEOUT
    mkfifo named.txt
    run prepare --tokenizer bytes --out p named.txt
    expect_fail
    expect_err "named.txt" "FIFO"
    run tokenizer encode --tokenizer bytes named.txt
    expect_fail
    expect_err "named.txt" "FIFO"
    mkdir in
    cp "$FIX"/in/doc_0*.txt in/
    mkfifo in/pipe.txt
    run prepare --tokenizer bytes --out p in
    expect_ok
    expect_err "skipping" "pipe.txt" "FIFO"
    expect_out_re '^prepared p: 10 documents'
}

# 3. kiln tokenizer train reads what kiln prepare reads: folders (recursively) and .jsonl.
case_tokenizer_train_inputs() {
    need_fixture
    mkdir -p tree/sub
    cp "$FIX"/in/doc_0[0-4].txt tree/
    cp "$FIX"/in/doc_0[5-9].txt tree/sub/
    run tokenizer train --vocab 280 --out folder.kbpe tree
    expect_ok
    run tokenizer train --vocab 280 --out files.kbpe "$FIX"/in/doc_0*.txt
    expect_ok
    check "a folder trains as its files do" same_file folder.kbpe files.kbpe
    # The same documents as .jsonl lines and as files.
    mkdir j
    printf 'the quick brown fox' >j/a.txt
    printf 'jumps over the lazy dog and the cat' >j/b.txt
    printf '{"text": "the quick brown fox"}\n\n{"text": "jumps over the lazy dog and the cat"}\n' >docs.jsonl
    run tokenizer train --vocab 270 --out jsonl.kbpe docs.jsonl
    expect_ok
    run tokenizer train --vocab 270 --out text.kbpe j
    expect_ok
    check "a .jsonl trains as its texts do" same_file jsonl.kbpe text.kbpe
    printf '{"text": "x"}\nnot json\n' >bad.jsonl
    run tokenizer train --vocab 270 --out bad.kbpe bad.jsonl
    expect_fail
    expect_err "bad.jsonl:2"
}

# 4. Shards of two tokenizers with the same vocabulary size are not trained on together.
case_mixed_tokenizers() {
    need_fixture
    run tokenizer train --vocab 290 --out a.kbpe "$FIX"/in/doc_0[0-4].txt
    expect_ok
    run tokenizer train --vocab 290 --out b.kbpe "$FIX"/in/doc_0[5-9].txt
    expect_ok
    check "two different tokenizers" sh -c "! cmp -s a.kbpe b.kbpe"
    run prepare --tokenizer a.kbpe --val-fraction 0 --out pa "$FIX/in"
    expect_ok
    expect_out_re 'vocabulary 290'
    run prepare --tokenizer b.kbpe --val-fraction 0 --out pb "$FIX/in"
    expect_ok
    expect_out_re 'vocabulary 290'
    check "prepare.json records the tokenizer's identity" grep -q '"tokenizer_id":' pa/prepare.json
    check "the identities differ" sh -c "! cmp -s pa/prepare.json pb/prepare.json && \
        [ \"\$(grep tokenizer_id pa/prepare.json)\" != \"\$(grep tokenizer_id pb/prepare.json)\" ]"
    mkdir mix
    cp pa/train_000.bin mix/train_000.bin
    cp pb/train_000.bin mix/train_001.bin
    run train $TINY --seq 16 --batch 2 --steps 1 --data mix --save ""
    expect_fail
    expect_err "train_000.bin" "train_001.bin" "tokenizer"
    # Each alone trains; "bytes" has its fixed identity.
    run train $TINY --seq 16 --batch 2 --steps 1 --data pa --save ""
    expect_ok
    check "bytes' identity is fixed" grep -q '"tokenizer_id":.*"3de38a25146c3056"' "$FIX/data/prepare.json"
}

# 5a. A folder that a cut-short prepare left: old and new shards mixed, no prepare.json, the
# marker still there. Made here as the commit leaves it when killed after moving the shards.
case_cut_short_prepare() {
    need_fixture
    run prepare --tokenizer bytes --val-fraction 0 --shard-tokens 4000 --out old "$FIX/in"
    expect_ok
    check "a finished prepare leaves no marker" test ! -e old/prepare.incomplete
    n=$(ls old | grep -c '^train_')
    if [ "$n" -ge 3 ]; then ok "$n old shards"; else bad "at least 3 old shards, got $n"; fi
    run prepare --tokenizer bytes --val-fraction 0 --out new "$FIX/in/doc_00.txt" "$FIX/in/doc_01.txt"
    expect_ok
    cp -r old cut
    cp new/train_000.bin cut/train_000.bin
    rm cut/prepare.json
    printf 'kiln prepare is replacing the shards in this folder.\n' >cut/prepare.incomplete
    run train $TINY --seq 16 --batch 2 --steps 1 --data 'cut/train_*.bin' --save ""
    expect_fail
    expect_err "prepare.incomplete" "cut short"
    run train $TINY --seq 16 --batch 2 --steps 1 --data cut/train_001.bin --save ""
    expect_fail
    expect_err "prepare.incomplete"
    # prepare again mends it.
    run prepare --tokenizer bytes --val-fraction 0 --out cut "$FIX/in/doc_00.txt"
    expect_ok
    check "the marker is gone" test ! -e cut/prepare.incomplete
    run train $TINY --seq 16 --batch 2 --steps 1 --data 'cut/train_*.bin' --save ""
    expect_ok
    # A shard that prepare.json does not list (left by an earlier run), or lists with other
    # contents, is refused by name.
    cp old/train_002.bin new/train_002.bin
    run train $TINY --seq 16 --batch 2 --steps 1 --data 'new/train_*.bin' --save ""
    expect_fail
    expect_err "train_002.bin" "prepare.json"
    rm new/train_002.bin
    cp old/train_000.bin new/train_000.bin
    run train $TINY --seq 16 --batch 2 --steps 1 --data new --save ""
    expect_fail
    expect_err "train_000.bin" "prepare.json" "checksum"
}

# 5b. Too many shards: refused before writing, with a larger --shard-tokens suggested.
case_too_many_shards() {
    need_fixture
    for i in 1 2 3 4 5 6; do cat "$FIX"/in/*.txt; done >big.txt
    run prepare --tokenizer bytes --shard-tokens 1 --out many big.txt
    expect_fail
    expect_err "--shard-tokens" "10000 shards"
    check "nothing was written" sh -c "! ls many 2>/dev/null | grep -q bin"
}

# 5c. Shard names past 999 sort in order, and the loader orders shards by number.
case_shard_order() {
    need_fixture
    cat "$FIX"/in/doc_0[0-2].txt >text.txt
    bytes=$(wc -c <text.txt)
    # bytes / 1001 tokens a shard: 1001 shards (the last takes the rest).
    per=$((bytes / 1001))
    run prepare --tokenizer bytes --val-fraction 0 --shard-tokens "$per" --out d text.txt
    expect_ok
    check "shard 1000 is train_1000.bin" test -f d/train_1000.bin
    check "shard 0 is train_0000.bin" test -f d/train_0000.bin
    check "no 3-digit names beside 4-digit ones" sh -c "! ls d | grep -q '^train_[0-9][0-9][0-9]\\.bin'"
    check "the names sort in shard order" sh -c "ls d | grep '^train_' | LC_ALL=C sort -c"
    check "prepare.json lists train_1000.bin" grep -q '"train_1000.bin"' d/prepare.json
    # Two damaged shards outside any prepared folder: the loader opens s_9 before s_10.
    mkdir o
    head -c 100 "$DATA" >o/s_9.bin
    head -c 100 "$DATA" >o/s_10.bin
    run train $TINY --seq 16 --batch 2 --steps 1 --data o --save ""
    expect_fail
    expect_err "s_9.bin"
}

# 5d. File names that are not UTF-8, a \u0000 in a .jsonl string, the output folder inside
# an input folder.
case_odd_inputs() {
    need_fixture
    name=$(printf 'doc\377.txt')
    cp "$FIX/in/doc_00.txt" "$name"
    run prepare --tokenizer bytes --out u "$name" "$FIX/in/doc_01.txt"
    expect_ok
    check "prepare.json spells the name in hex" grep -q '"hex":.*"646f63ff2e747874"' u/prepare.json
    check "prepare.json is UTF-8" sh -c "! grep -q -a \"\$(printf '\\377')\" u/prepare.json"
    # The loader reads prepare.json: it must parse.
    run train $TINY --seq 16 --batch 2 --steps 1 --data 'u/train_*.bin' --save ""
    expect_ok
    printf '{"text": "the fox"}\n{"text": "the dog\\u0000 and the cat"}\n' >nul.jsonl
    run prepare --tokenizer bytes --out n nul.jsonl
    expect_fail
    expect_err "nul.jsonl:2" "u0000"
    printf '{"text": "a \\\\u0000 is six characters"}\n{"text": "b"}\n' >esc.jsonl
    run prepare --tokenizer bytes --out e esc.jsonl
    expect_ok
    mkdir -p in
    cp "$FIX"/in/*.txt in/
    run prepare --tokenizer bytes --out in/out in
    expect_ok
    expect_out_re '^prepared in/out: 10 documents'
    run prepare --tokenizer bytes --out in/out in
    expect_ok
    expect_err "skipping" "output folder"
    expect_out_re '^prepared in/out: 10 documents'
    run prepare --tokenizer bytes --out in in
    expect_fail
    expect_err "output folder"
}

# 6. Messages keep their reason (the errno text), not only what failed.
case_reasons() {
    need_fixture
    run tokenizer encode --tokenizer bytes nope.txt
    expect_fail
    expect_err "nope.txt" "No such file"
    mkdir dir
    run tokenizer encode --tokenizer bytes dir
    expect_fail
    expect_err "dir" "folder"
    printf 'the fox' >fox.txt
    LAST="kiln tokenizer encode fox.txt >/dev/full"
    timeout -k 5 "$CMD_TIMEOUT" "$KILN" tokenizer encode --tokenizer bytes fox.txt >/dev/full 2>"$W/stderr"
    RC=$?
    expect_fail
    expect_err "cannot write" "No space left"
    printf '116 104\n' >ids
    LAST="kiln tokenizer decode ids >/dev/full"
    timeout -k 5 "$CMD_TIMEOUT" "$KILN" tokenizer decode --tokenizer bytes ids >/dev/full 2>"$W/stderr"
    RC=$?
    expect_fail
    expect_err "cannot write" "No space left"
    printf 'x' >file
    run prepare --tokenizer bytes --out file/sub "$FIX/in"
    expect_fail
    expect_err "file"
    expect_err_re 'not a directory|not a folder'
}

main "$@"
