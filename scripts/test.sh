#!/usr/bin/env bash
# Install what is missing, build with warnings as errors, and run every test:
#   1. all CTest suites (unit, reference against PyTorch and tiktoken, fault injection)
#   2. the unit, command and multi-process tests again under AddressSanitizer and
#      UndefinedBehaviorSanitizer
#   3. the fuzzers for a bounded time (clang's libFuzzer)
# Each stage is its own build folder: build-test, build-asan, build-fuzz.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
jobs=$(nproc)

KILN_SETUP_NO_BUILD=1 scripts/setup.sh || exit 1

failed=()
stage() { echo; echo "=== $*"; }

stage "build (-Werror) and all tests"
if cmake -S . -B build-test -DCMAKE_BUILD_TYPE=Release -DKILN_WERROR=ON >/dev/null &&
   cmake --build build-test -j"$jobs"; then
  ctest --test-dir build-test --output-on-failure -j1 || failed+=("tests")
else
  failed+=("build")
fi

stage "unit and command tests under AddressSanitizer + UndefinedBehaviorSanitizer"
if cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_WERROR=ON -DKILN_SANITIZE=ON >/dev/null &&
   cmake --build build-asan -j"$jobs"; then
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan -L "unit|cli|dist" --output-on-failure -j1 || failed+=("sanitizers")
else
  failed+=("sanitizer build")
fi

stage "fuzzers (bounded)"
if CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_FUZZ=ON >/dev/null &&
   cmake --build build-fuzz -j"$jobs"; then
  ctest --test-dir build-fuzz -L fuzz --output-on-failure -j1 || failed+=("fuzz")
else
  failed+=("fuzz build")
fi

echo
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED: ${failed[*]}"
  exit 1
fi
echo "all stages passed"
