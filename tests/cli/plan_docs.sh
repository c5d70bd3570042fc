#!/usr/bin/env bash
# plan_docs.sh - the worked examples in docs/plan.md are the program's real
# output: each pasted block must still match what `kvcache plan` prints, so the
# page cannot drift from the code.
#
# usage: bash plan_docs.sh <kvcache binary> <source dir> <test data dir>
set -u
KVC=$1
DOC=$2/docs/plan.md
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# block N: the lines of the N-th fenced code block that follows a "$ kvcache plan" line.
block() {
  awk -v want="$1" '
    /^    \$ kvcache plan/ { n++; armed = (n == want); next }
    armed && /^```/ { if (inside) exit; inside = 1; next }
    inside { print }
  ' "$DOC"
}

# check N ARGS...: block N is the output of `kvcache plan ARGS` (a "..." line skips to the
# verdict; a trailing "exit S" line is the exit status).
check() {
  local n=$1
  shift
  block "$n" >"$TMP/doc"
  [ -s "$TMP/doc" ] || { fail "docs/plan.md: example $n not found"; return; }
  "$KVC" plan "$@" >"$TMP/out" 2>/dev/null
  local rc=$?
  if grep -q '^exit ' "$TMP/doc"; then
    local want_rc
    want_rc=$(sed -n 's/^exit //p' "$TMP/doc")
    [ "$rc" = "$want_rc" ] || fail "example $n: exit $rc, the doc says $want_rc"
    sed -i '/^exit /d' "$TMP/doc"
  fi
  if grep -q '^\.\.\.$' "$TMP/doc"; then
    # the head up to "...", then the tail from the verdict on
    sed '/^\.\.\.$/,$d' "$TMP/doc" >"$TMP/head"
    head -n "$(wc -l <"$TMP/head")" "$TMP/out" | diff -u "$TMP/head" - >"$TMP/diff" ||
      { fail "example $n drifted:"; cat "$TMP/diff" >&2; }
    sed '1,/^\.\.\.$/d' "$TMP/doc" >"$TMP/tail"
    sed -n '/^verdict/,$p' "$TMP/out" | diff -u "$TMP/tail" - >"$TMP/diff" ||
      { fail "example $n verdict drifted:"; cat "$TMP/diff" >&2; }
  else
    diff -u "$TMP/doc" "$TMP/out" >"$TMP/diff" || { fail "example $n drifted:"; cat "$TMP/diff" >&2; }
  fi
}

check 1 --model llama-3.1-8b --gpu h100-sxm
check 2 --model llama-3.1-70b --gpu h100-sxm --tp 2 --max-num-seqs 256
check 3 --model deepseek-v3 --gpu h200 --tp 8 --weight-dtype fp8

# the JSON excerpt: every line shown (indented two spaces per level) appears in the output
block 4 | grep -vE '^ *(\.\.\.|\{|\})$' >"$TMP/doc"
[ -s "$TMP/doc" ] || fail "docs/plan.md: the JSON example not found"
"$KVC" plan --model deepseek-v3 --gpu h200 --tp 8 --weight-dtype fp8 --json |
  sed 's/\t/  /g' >"$TMP/out"
while IFS= read -r line; do
  grep -qxF -- "$line" "$TMP/out" || fail "JSON example line not in the output: $line"
done <"$TMP/doc"

# the long-context examples show section 13 only: each block is that section of the output
section13() {
  local n=$1
  shift
  block "$n" >"$TMP/doc"
  [ -s "$TMP/doc" ] || { fail "docs/plan.md: example $n not found"; return; }
  "$KVC" plan "$@" 2>/dev/null | sed -n '/^13\./,/^$/p' | sed '$d' >"$TMP/out"
  diff -u "$TMP/doc" "$TMP/out" >"$TMP/diff" || { fail "example $n drifted:"; cat "$TMP/diff" >&2; }
}
section13 5 --model llama-3.1-70b --gpu h100-sxm --tp 8 --rope-scaling yarn:8 --max-model-len 1M --prompt 1M --output 0
section13 6 --model "$3/configs/llama-3.1-70b-mha.json" --gpu h100-sxm --tp 8 --rope-scaling yarn:8 --max-model-len 1M \
  --prompt 1M --output 0

# the hybrid, multimodal and CP-decode examples show one section each
section() {
  local sec=$1 n=$2
  shift 2
  block "$n" >"$TMP/doc"
  [ -s "$TMP/doc" ] || { fail "docs/plan.md: example $n not found"; return; }
  "$KVC" plan "$@" 2>/dev/null | sed -n "/^$sec\./,/^\$/p" | sed '$d' >"$TMP/out"
  diff -u "$TMP/doc" "$TMP/out" >"$TMP/diff" || { fail "example $n drifted:"; cat "$TMP/diff" >&2; }
}
section 15 7 --model "$3/configs/jamba-1.5-mini.json" --gpu h100-sxm --weight-dtype fp8
section 16 8 --model "$3/configs/llava-1.5-7b.json" --gpu h100-sxm --max-num-seqs 256
section 13 9 --model "$3/configs/llama-3.1-70b-mha.json" --gpu h100-sxm --tp 8 --cp 8 --rope-scaling yarn:8 \
  --max-model-len 1M --prompt 1000000 --output 8000
# the ledger excerpt of example 6: each of its lines is in the output
awk '/^## Example 6/ { on = 1 } on && /^```/ { n++; if (n == 3) { inside = 1; next } if (n == 4) exit }
  inside { print }' "$DOC" >"$TMP/doc"
[ -s "$TMP/doc" ] || fail "docs/plan.md: the ledger excerpt of example 6 not found"
"$KVC" plan --model "$3/configs/llava-1.5-7b.json" --gpu h100-sxm --max-num-seqs 256 >"$TMP/out"
while IFS= read -r line; do
  grep -qxF -- "$line" "$TMP/out" || fail "example 6 ledger line not in the output: $line"
done <"$TMP/doc"

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed" >&2
  exit 1
fi
echo "plan docs: the examples match the program"
