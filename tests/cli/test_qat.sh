#!/bin/sh
# Quantization-aware training (--qat 8): the model it evaluates and trains is the master
# weights fake-quantized per output channel: int8-quantizing the saved master weights by
# hand (numpy, round half to even) and evaluating them gives the run's own final validation
# loss exactly; a QAT run resumed from a checkpoint ends byte-identical; bad values refused.
. "$(dirname "$0")/lib.sh"

TRAIN="train $TINY --seq 16 --batch 2 --threads 1 --data $DATA --steps 30 --val-data $VAL --eval-batches 8"

# fake_quant SRC DST: the block matrices per column and wte per row, int8 symmetric.
fake_quant() {
    /usr/bin/python3 - "$1" "$2" <<'PY'
import json, struct, sys
import numpy as np
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
data = bytearray(b[8 + n:])
for k, v in h.items():
    if k == "__metadata__":
        continue
    lo, hi = v["data_offsets"]
    w = np.frombuffer(bytes(data[lo:hi]), dtype=np.float32).reshape(v["shape"])
    block = ".h." in "." + k and w.ndim == 2
    if not (block or k.endswith("wte.weight")):
        continue
    axis = 1 if k.endswith("wte.weight") else 0  # the max over a row (wte) or a column
    s = (np.abs(w).max(axis=axis, keepdims=True) / np.float32(127)).astype(np.float32)
    q = np.where(s > 0, np.rint(w / np.where(s > 0, s, 1)) * s, 0).astype(np.float32)
    data[lo:hi] = q.tobytes()
open(sys.argv[2], "wb").write(b[:8 + n] + bytes(data))
PY
}

case_quantized_model_is_the_trained_one() {
    need_fixture
    run $TRAIN --qat 8 --save q.st
    expect_ok
    expect_out_re '^quantization-aware training: int8 per output channel'
    expect_out_re 'master weights 0.1 MiB'
    val=$(sed -n 's/.*| val \([0-9.]*\).*/\1/p' "$W/stdout" | tail -n 1)
    fake_quant q.st fq.st
    run eval --weights fq.st --data "$VAL" --batch 2 --seq 16 --batches 8
    expect_ok
    got=$(sed -n 's/.*| loss \([0-9.]*\) |.*/\1/p' "$W/stdout")
    check "the fake-quantized master weights give the run's validation loss ($val = $got)" \
        /usr/bin/python3 -c "import sys; sys.exit(abs($val - $got) > 1e-4)"
    run eval --weights q.st --data "$VAL" --batch 2 --seq 16 --batches 8
    expect_ok
    raw=$(sed -n 's/.*| loss \([0-9.]*\) |.*/\1/p' "$W/stdout")
    check "the master weights themselves are another model ($raw)" test "$raw" != "$got"
}

case_resume_exact() {
    need_fixture
    run $TRAIN --qat 8 --save ref.st
    expect_ok
    run $TRAIN --qat 8 --save r.st --checkpoint-dir ck --checkpoint-every 10
    expect_ok
    rm -r ck/step_00000020 ck/step_00000030
    echo step_00000010 >ck/latest
    run $TRAIN --qat 8 --save r.st --checkpoint-dir ck --checkpoint-every 10 --resume ck
    expect_ok
    expect_out_re 'resumed from ck/step_00000010'
    check "a QAT run resumed at step 10 ends byte-identical" same_file ref.st r.st
}

case_bad_flags() {
    need_fixture
    run $TRAIN --qat 4 --save x.st
    expect_usage
    check "nothing saved" test ! -e x.st
}

main "$@"
