#!/usr/bin/env bash
# Installs the Debian packages kvcache builds and tests with, and nothing else.
# Called by the Makefile before every build; a no-op when all are present.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config git   # toolchain
  clang libclang-rt-14-dev              # sanitizer build and libFuzzer runtime
  clang-format                          # make format
  libcmocka-dev                         # unit tests
  libxxhash-dev                         # block hashes (XXH3-128)
  libcjson-dev                          # JSON input and output
  libssl-dev                            # SHA-256 of tenant cache salts (libcrypto)
  libpcre2-dev                          # BPE pre-tokenizer regexes (8-bit, UTF + UCP, JIT)
  libevent-dev                          # kvcache serve: HTTP (evhttp), chunked streaming
  libhiredis-dev                        # the redis KV tier (hiredis)
  redis-server                          # the redis tier's tests start their own server
  curl                                  # server tests (the openai client test needs node + npm)
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "kvcache: missing Debian packages: ${missing[*]}" >&2
  echo "kvcache: run as root, or: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "kvcache: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
