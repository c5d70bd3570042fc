#!/bin/bash
# ab_attn.sh A B [ab_attn arguments...]: time two versions of
# src/attn/attn_avx512.c against each other in one process (see ab_attn.c).
# A and B are files, or git revisions (the file at that revision); the
# library itself comes from build/ (make build first).
#   bench/ab/ab_attn.sh HEAD~1 src/attn/attn_avx512.c bf16 8 32768 8 16 1
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 5 ] || { echo "usage: bench/ab/ab_attn.sh A B DTYPE G CTX [KV_HEADS [BLOCK [PAGED]]]" >&2; exit 2; }
a=$1 b=$2
shift 2
[ -f build/libkvcache.a ] || { echo "ab_attn.sh: build/libkvcache.a missing: run make build" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
src() { # file or revision -> path
    if [ -f "$1" ]; then echo "$1"; else git show "$1:src/attn/attn_avx512.c" >"$tmp/$2.c" && echo "$tmp/$2.c"; fi
}
flags="-D_GNU_SOURCE -Iinclude -Isrc -O2 -std=c17 -mavx512f -mavx512bw -mavx512vl -mavx512dq
       -mavx512bf16 -mavx512vnni -mfma -mf16c -mavx2"
# shellcheck disable=SC2086
gcc $flags -Dkvc__attn_item_avx512=kvc_ab_item_a -Dkvc__attn_ws_avx512=kvc_ab_ws_a \
    -c "$(src "$a" a)" -o "$tmp/a.o"
# shellcheck disable=SC2086
gcc $flags -Dkvc__attn_item_avx512=kvc_ab_item_b -Dkvc__attn_ws_avx512=kvc_ab_ws_b \
    -c "$(src "$b" b)" -o "$tmp/b.o"
gcc -D_GNU_SOURCE -O2 -std=c17 -Wall -Wextra -Wpedantic -Werror -Wmissing-prototypes -Wshadow \
    -Iinclude bench/ab/ab_attn.c "$tmp/a.o" "$tmp/b.o" build/libkvcache.a \
    -lm -lpthread -o "$tmp/ab_attn"
"$tmp/ab_attn" "$@"
