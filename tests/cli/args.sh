#!/usr/bin/env bash
# CLI tests for what every kvcache command shares (src/cli/args.c): numbers are plain
# decimals, and errors never echo raw control bytes or invalid UTF-8 from their input.
# usage: args.sh <kvcache-binary> <source-dir> <test-data-dir>
set -u
KVC=$1
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# expect_error NAME EXPECTED_STDERR_REGEX -- ARGS...: exit 1 (2 for the dispatcher), one stderr
# line matching, no raw control byte in it, nothing on stdout
expect_error() {
  local name=$1 regex=$2 want=1; shift 3
  [ "$1" = "--dispatcher" ] && { want=2; shift; }
  "$KVC" "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  [ "$rc" -eq "$want" ] || fail "$name: exit $rc, want $want"
  [ "$(wc -l <"$TMP/err")" -eq 1 ] || fail "$name: stderr is not one line: $(cat -v "$TMP/err")"
  grep -Eq -e "$regex" "$TMP/err" || fail "$name: stderr '$(cat -v "$TMP/err")' does not match '$regex'"
  LC_ALL=C grep -q $'[\x01-\x09\x0b-\x1f\x7f\x80-\xff]' "$TMP/err" && fail "$name: a raw control or non-ASCII byte: $(cat -v "$TMP/err")"
  [ ! -s "$TMP/out" ] || fail "$name: printed to stdout on bad input"
}

M=(--model llama-3.1-8b --gpu h100-sxm)

# ---- whole numbers: digits only (strtoull skipped spaces and negated) ----
expect_error "plan --tp space" "--tp: ' 2'" -- plan --tp ' 2' "${M[@]}"
expect_error "plan --tp negated" "--tp: ' -18446744073709551615'" -- plan --tp ' -18446744073709551615' "${M[@]}"
expect_error "plan --tp plus" "--tp: '\\+2'" -- plan --tp +2 "${M[@]}"
expect_error "sim --num-blocks space" "--num-blocks: ' 5'" -- sim --num-blocks ' 5' "${M[@]}"
# ---- decimal numbers: no spaces, no hex floats, no inf or nan ----
expect_error "plan --mfu hex" "--mfu: '0x1p-1'" -- plan --mfu 0x1p-1 "${M[@]}"
expect_error "plan --mfu space" "--mfu: ' 0.5'" -- plan --mfu ' 0.5' "${M[@]}"
expect_error "plan --mfu nan" "--mfu: 'nan'" -- plan --mfu nan "${M[@]}"
expect_error "plan --mfu inf" "--mfu: 'inf'" -- plan --mfu inf "${M[@]}"
"$KVC" plan --mfu .5 "${M[@]}" >/dev/null 2>"$TMP/err" || fail "plan --mfu .5: exit $? ($(cat "$TMP/err"))"

# ---- escaping, in every command ----
expect_error "dispatcher" "unknown command 'x\\\\x1b\\[2J'" -- --dispatcher $'x\x1b[2J'
expect_error "explain file" "cannot open bad\\\\x1b\\]0;t\\\\x07\\\\nname" -- explain $'bad\x1b]0;t\x07\nname'
expect_error "plan model" "--model 'bad\\\\x9bname\\\\xc2\\\\x9b'" -- plan --model $'bad\x9bname\xc2\x9b' --gpu h100-sxm
expect_error "plan value" "--tp: '\\\\xff\\\\xfe'" -- plan --tp $'\xff\xfe' "${M[@]}"
expect_error "sim workload" "x\\\\x1b\\[31my" -- sim --workload $'x\x1b[31my' "${M[@]}"
expect_error "sim value" "--num-blocks: '1\\\\r2'" -- sim --num-blocks $'1\r2' "${M[@]}"
# a library message that already escaped its input is not escaped twice (one backslash)
expect_error "plan config path" "cannot open $TMP/a\\\\x1bb/c.json: " -- plan --model "$TMP/a"$'\x1b'"b/c.json" --gpu h100-sxm
grep -qF 'a\\x1bb' "$TMP/err" && fail "plan config path: escaped twice: $(cat "$TMP/err")"
# valid UTF-8 stays as it is
"$KVC" explain "$TMP/café" 2>"$TMP/err"
grep -q "cannot open $TMP/café" "$TMP/err" || fail "UTF-8 file name: $(cat "$TMP/err")"

if [ "$fails" -ne 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "CLI arguments and errors: all checks passed"
