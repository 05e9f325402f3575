#!/bin/sh
# kiln bench peak: a short measurement prints a positive rate.
. "$(dirname "$0")/lib.sh"

case_peak() {
    run bench peak --seconds 0.2 --max-dim 128 --threads 1
    expect_ok
    expect_out_re '^peak fp32 GEMM: [0-9]+\.[0-9] GFLOP/s \(1 threads'
    check "the rate is positive" sh -c "! grep -q 'GEMM: 0\\.0 ' '$W/stdout'"
}

main "$@"
