#!/bin/sh
# Builds the data the kiln command's tests share (the CTest fixture "cli_fixture"): text,
# byte-level shards, a trained tokenizer with its shards, and a tiny trained model. It is
# rebuilt on every CTest run so that it always comes from the kiln under test.
. "$(dirname "$0")/lib.sh"

mkdir -p "$WORK_ROOT"
if [ ! -x "$KILN" ]; then
    echo "KILN_BIN=$KILN is not an executable (build the kiln_cli target)" >&2
    exit 1
fi
fixture_install || exit 1
echo "built the shared test data in $FIX"
