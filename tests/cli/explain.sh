#!/usr/bin/env bash
# CLI tests for `kvcache explain` and the command dispatcher.
# usage: explain.sh <kvcache-binary> <source-dir> <test-data-dir>
set -u
KVC=$1
SRC=$2
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
pass() { :; }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# expect_error NAME EXPECTED_STDERR_REGEX -- ARGS...: exit 1, one stderr line matching, no stdout
expect_error() {
  local name=$1 regex=$2; shift 3
  "$KVC" "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  [ "$rc" -eq 1 ] || fail "$name: exit $rc, want 1"
  [ "$(wc -l <"$TMP/err")" -eq 1 ] || fail "$name: stderr is not one line: $(cat "$TMP/err")"
  grep -Eq -e "$regex" "$TMP/err" || fail "$name: stderr '$(cat "$TMP/err")' does not match '$regex'"
  [ ! -s "$TMP/out" ] || fail "$name: printed to stdout on bad input"
}

# ---- the dispatcher ----
"$KVC" --help >"$TMP/out" 2>&1 || fail "--help exits non-zero"
grep -q "explain" "$TMP/out" || fail "--help does not list explain"
"$KVC" >/dev/null 2>&1; [ $? -eq 2 ] || fail "no command: want exit 2"
"$KVC" frobnicate >/dev/null 2>"$TMP/err"; [ $? -eq 2 ] || fail "unknown command: want exit 2"
grep -q "unknown command 'frobnicate'" "$TMP/err" || fail "unknown command message"
"$KVC" explain --help | grep -q -- "--pool-blocks" || fail "explain --help lacks --pool-blocks"

# ---- the shipped examples ----
"$KVC" explain --seed 7 --pool-blocks 12 --block-size 4 "$SRC/examples/prompts.txt" >"$TMP/a" 2>"$TMP/err" \
  || fail "examples/prompts.txt: exit $? ($(cat "$TMP/err"))"
grep -q "hit 12 of 17 tokens (3 blocks); computed 5" "$TMP/a" || fail "prompt 2 should hit its 3 shared blocks"
grep -q "cut by the last-token rule" "$TMP/a" || fail "prompt 3 should be cut by the last-token rule"
grep -Eq "^  3 +12-15 .* last-token " "$TMP/a" || fail "prompt 3 block 3 should say last-token"
grep -q "salt 'tenant-b'" "$TMP/a" || fail "prompt 4 should show its salt"
[ "$(grep -c '^  evicted #' "$TMP/a")" -eq 2 ] || fail "prompt 5 should evict exactly two blocks"
grep -q "hit 12 of 13 tokens" "$TMP/a" || fail "prompt 6 should still hit the shared prefix after eviction"
grep -q "^totals: 6 lookups, 36 of 99 prompt tokens hit" "$TMP/a" || fail "totals line"
"$KVC" explain --seed 7 --pool-blocks 12 --block-size 4 "$SRC/examples/prompts.txt" >"$TMP/b"
cmp -s "$TMP/a" "$TMP/b" || fail "same seed, different output"
# default seed is random per process: hashes differ between runs
"$KVC" explain "$SRC/examples/prompts.txt" | grep -v '^pool:' >"$TMP/c"
"$KVC" explain "$SRC/examples/prompts.txt" | grep -v '^pool:' >"$TMP/d"
cmp -s "$TMP/c" "$TMP/d" && fail "two runs without --seed printed the same hashes"

"$KVC" explain --json --seed 3 "$SRC/examples/prompts.jsonl" >"$TMP/j" || fail "prompts.jsonl: exit $?"
[ "$(wc -l <"$TMP/j")" -eq 4 ] || fail "--json should print one line per prompt"
sed -n 2p "$TMP/j" | grep -q '"hit_blocks":1,' || fail "jsonl prompt 2 should hit 1 block"
sed -n 3p "$TMP/j" | grep -q '"hit_blocks":0,' || fail "jsonl prompt 3 (another LoRA) should miss"
sed -n 3p "$TMP/j" | grep -q '"lora":7' || fail "jsonl prompt 3 should carry lora 7"
sed -n 4p "$TMP/j" | grep -q '"hit_blocks":0,' || fail "jsonl prompt 4 (salted) should miss"
for key in '"prompt":' '"line":' '"n_tokens":' '"blocks":\[' '"status":"' '"hash":"' '"evicted":\[' \
           '"computed_tokens":' '"pool_free":' '"error":null'; do
  head -1 "$TMP/j" | grep -q "$key" || fail "--json lacks $key"
done

# stdin, commas, comments
printf '# a comment\n1,2,3,4,5\n1, 2, 3, 4, 6\n' | "$KVC" explain --block-size 2 --seed 1 - >"$TMP/s" \
  || fail "stdin input"
grep -q "hit 4 of 5 tokens" "$TMP/s" || fail "comma-separated prompt should hit 2 blocks"

# a prompt larger than the pool is an outcome, not an input error
printf '1 2 3 4 5 6 7 8 9 10\n' >"$TMP/big"
"$KVC" explain --pool-blocks 2 --block-size 2 "$TMP/big" >"$TMP/o" || fail "too-big prompt: exit $?"
grep -q "cannot run: needs 5 more blocks, the pool has 2 free" "$TMP/o" || fail "too-big prompt message"

# ---- bad input: one line naming the line, exit 1, nothing on stdout ----
printf '1 2 3\n1 2 abc\n' >"$TMP/bad1";        expect_error "non-number" "bad1:2: 'abc' is not a token id" -- explain "$TMP/bad1"
printf '1 -5 3\n' >"$TMP/bad2";                expect_error "negative" "bad2:1: token id -5 is negative" -- explain "$TMP/bad2"
printf '1 2\n\n3 4\n' >"$TMP/bad3";            expect_error "empty line" "bad3:2: empty prompt" -- explain "$TMP/bad3"
printf '1 99999999999\n' >"$TMP/bad4";         expect_error "too large" "bad4:1: token id 99999999999 is too large" -- explain "$TMP/bad4"
printf '1 2x\n' >"$TMP/bad5";                  expect_error "trailing junk" "bad5:1: '2x' is not a token id" -- explain "$TMP/bad5"
printf '{"tokens": [1, 2}\n' >"$TMP/bad6";     expect_error "broken json" "bad6:1: not a JSON object" -- explain "$TMP/bad6"
printf '{"toks": [1, 2]}\n' >"$TMP/bad7";      expect_error "no tokens" "bad7:1: no \"tokens\" array" -- explain "$TMP/bad7"
printf '{"tokens": [1, "a"]}\n' >"$TMP/bad8";  expect_error "string token" "bad8:1: a token in \"tokens\" is not a number" -- explain "$TMP/bad8"
printf '{"tokens": []}\n' >"$TMP/bad9";        expect_error "empty json" "bad9:1: empty prompt" -- explain "$TMP/bad9"
printf '{"tokens": [1.5]}\n' >"$TMP/bad10";    expect_error "float" "bad10:1: token id 1.5 is not an integer" -- explain "$TMP/bad10"
printf '{"tokens": [-1]}\n' >"$TMP/bad11";     expect_error "negative json" "bad11:1: token id -1 is negative" -- explain "$TMP/bad11"
printf '{"tokens": [1], "salt": 3}\n' >"$TMP/bad12"; expect_error "salt type" "bad12:1: \"salt\" is not a string" -- explain "$TMP/bad12"
printf '{"tokens": [1], "lora": -2}\n' >"$TMP/bad13"; expect_error "lora" "bad13:1: \"lora\" is not a non-negative integer" -- explain "$TMP/bad13"
printf '# only comments\n' >"$TMP/bad14";      expect_error "no prompts" "no prompts" -- explain "$TMP/bad14"
expect_error "missing file" "cannot open $TMP/nope" -- explain "$TMP/nope"
expect_error "block size" "--block-size: '3' is not a power of two" -- explain --block-size 3 "$TMP/big"
expect_error "block size big" "--block-size: '512'" -- explain --block-size 512 "$TMP/big"
expect_error "pool blocks" "--pool-blocks: '0'" -- explain --pool-blocks 0 "$TMP/big"
expect_error "pool blocks junk" "--pool-blocks: 'ten'" -- explain --pool-blocks ten "$TMP/big"
expect_error "seed" "--seed: 'x'" -- explain --seed x "$TMP/big"
expect_error "lora flag" "--lora: '-1'" -- explain --lora -1 "$TMP/big"
expect_error "unknown option" "unknown option '--frob'" -- explain --frob "$TMP/big"
expect_error "missing value" "--pool-blocks needs a value" -- explain "$TMP/big" --pool-blocks
expect_error "no file" "no input file" -- explain
expect_error "two files" "one input file expected" -- explain "$TMP/big" "$TMP/big"

if [ "$fails" -ne 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "explain CLI: all checks passed"
