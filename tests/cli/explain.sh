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

# The library's request path (seq) prints exactly what the hand-written driver printed: the
# whole output, hashes masked (the hash function is the library's business), against the
# driver's output recorded in tests/cli/explain/ before the change.  Since then the header names
# the eviction policy, the totals say what is stranded and how many hashes collided, and each
# JSON line carries its priority, the blocks it stranded and the cache's totals: additions only.
mask() { sed -E 's/[0-9a-f]{32}/<hash>/g; s/hash seed [0-9]+/hash seed <seed>/'; }
golden() { # golden NAME -- ARGS...: the masked stdout equals tests/cli/explain/NAME
  local name=$1; shift 2
  "$KVC" "$@" 2>"$TMP/gerr" | mask >"$TMP/golden" || fail "golden $name: exit $? ($(cat "$TMP/gerr"))"
  diff -u "$SRC/tests/cli/explain/$name" "$TMP/golden" >"$TMP/gdiff" || fail "golden $name differs: $(head -20 "$TMP/gdiff")"
}
golden prompts.txt.out -- explain --seed 7 --pool-blocks 12 --block-size 4 "$SRC/examples/prompts.txt"
golden prompts.txt.json -- explain --json --seed 7 --pool-blocks 12 --block-size 4 "$SRC/examples/prompts.txt"
golden prompts.jsonl.json -- explain --json --seed 3 "$SRC/examples/prompts.jsonl"
printf '1 2 3 4 5 6 7 8 9 10\n1 2 3\n' >"$TMP/small"
golden small-pool.out -- explain --pool-blocks 2 --block-size 2 --seed 1 "$TMP/small"
golden small-pool.json -- explain --json --pool-blocks 2 --block-size 2 --seed 1 "$TMP/small"
# a block computed again under the last-token rule is swapped for the cached copy
grep -q '"recomputed_in":' "$SRC/tests/cli/explain/prompts.txt.json" || fail "golden lacks a recomputed block"

# JSON integers are read exactly, from their text: lora reaches the whole range --lora takes,
# and --json prints it as an integer, never as a double
printf '{"tokens": [1, 2], "lora": 18446744073709551615}\n{"tokens": [1, 2], "lora": 9.2233720368547758e18}\n' >"$TMP/lora"
"$KVC" explain --json "$TMP/lora" >"$TMP/o" 2>"$TMP/err" || fail "lora 2^64-1: exit $? ($(cat "$TMP/err"))"
sed -n 1p "$TMP/o" | grep -q '"lora":18446744073709551615,' || fail "--json lora 2^64-1 is not exact: $(head -c 120 "$TMP/o")"
sed -n 2p "$TMP/o" | grep -q '"lora":9223372036854775800,' || fail "--json lora 9.2233720368547758e18 is not exact"
"$KVC" explain "$TMP/lora" | grep -q ', lora 18446744073709551615$' || fail "text lora 2^64-1"
"$KVC" explain --json --lora 18446744073709551615 "$TMP/small" | grep -q '"lora":18446744073709551615,' \
  || fail "--lora 2^64-1 printed inexactly"
# the same ids however they are written: 15 and 1.5e1 hash alike, and hit
printf '{"tokens": [15, 16, 3]}\n{"tokens": [1.5e1, 160e-1, 3]}\n' >"$TMP/notation"
"$KVC" explain --block-size 2 "$TMP/notation" | grep -q "hit 2 of 3 tokens" || fail "1.5e1 should be token 15"

# The library's path and the explanation agree: what a lookup pins is what match explained,
# on a pool small enough that eviction and failed reservations happen
for seed in 1 2 3; do
  awk -v s=$seed 'BEGIN { srand(s); for (l = 0; l < 40; l++) { n = 1 + int(rand() * 30); p = int(rand() * 3);
    for (i = 0; i < n; i++) printf "%d%s", (i < 12 ? p * 100 + i : int(rand() * 20)), (i + 1 < n ? " " : "\n") } }' >"$TMP/rand"
  "$KVC" explain --seed $seed --pool-blocks 9 --block-size 2 "$TMP/rand" >"$TMP/o" 2>"$TMP/err" \
    || fail "random prompts (seed $seed): exit $? ($(cat "$TMP/err"))"
  grep -q '^totals: 40 lookups' "$TMP/o" || fail "random prompts (seed $seed): no totals"
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

# JSON numbers past what a double holds as an integer: "too large", never a float-cast overflow
# (UBSan) or "not an integer"; fractions stay "not an integer", however close to one
n=20
jerr() { # jerr NAME LINE REGEX: a file holding LINE is refused with REGEX (line 2: after a good one)
  n=$((n + 1)); printf '1 2\n%s\n' "$2" >"$TMP/bad$n"
  expect_error "$1" "bad$n:2: $3" -- explain "$TMP/bad$n"
}
jerr "token 1e30" '{"tokens": [1e30]}' 'token id 1e30 is too large \(max 2147483647\)$'
jerr "token 2^63" '{"tokens": [9.2233720368547758e18]}' 'token id 9.2233720368547758e18 is too large'
jerr "token 1e400" '{"tokens": [1e400]}' 'token id 1e400 is too large'
jerr "token -1e400" '{"tokens": [-1e400]}' 'token id -1e400 is negative'
jerr "token 2^31" '{"tokens": [2147483648]}' 'token id 2147483648 is too large'
jerr "token near 1" '{"tokens": [1.0000000000000001]}' 'token id 1.0000000000000001 is not an integer'
jerr "token 1e-400" '{"tokens": [1e-400]}' 'token id 1e-400 is not an integer'
jerr "lora 1e20" '{"tokens": [1], "lora": 1e20}' '"lora" 1e20 is too large \(max 18446744073709551615\)$'
jerr "lora 2^64" '{"tokens": [1], "lora": 18446744073709551616}' '"lora" 18446744073709551616 is too large'
jerr "lora 1e400" '{"tokens": [1], "lora": 1e400}' '"lora" 1e400 is too large'
jerr "lora fraction" '{"tokens": [1], "lora": 0.5}' '"lora" is not a non-negative integer'
jerr "lora string" '{"tokens": [1], "lora": "7"}' '"lora" is not a non-negative integer'
# a line says one thing, whole: no trailing text, nothing after a NUL, no key it does not know
jerr "json trailing" '{"tokens": [1]} x' "text after the JSON object: 'x'$"
jerr "json twice" '{"tokens": [1]}{"tokens": [2]}' "text after the JSON object"
jerr "json key typo" '{"tokens": [1], "lroa": 5}' 'unknown key "lroa"'
jerr "json duplicate" '{"tokens": [1], "tokens": [2]}' '"tokens" is given twice'
jerr "escaped NUL" '{"tokens": [1], "salt": "a\u0000b"}' 'a string holds U\+0000 \(NUL\)$'
jerr "escaped NUL key" '{"tokens": [1], "salt\u0000x": "a"}' 'a string holds U\+0000 \(NUL\)$'
jerr "text plus" '1 +2' "'\\+2' is not a token id"
jerr "text fraction" '1 1.5' "'1.5' is not a token id"
jerr "text vtab" $'1 \v2' "'\\\\x0b2' is not a token id"
printf '1 2\n3 4\0 5 6\n' >"$TMP/nul1";      expect_error "NUL in text" "nul1:2: a NUL byte at column 4" -- explain "$TMP/nul1"
printf '{"tokens": [1]}\0{"x\n' >"$TMP/nul2"; expect_error "NUL in json" "nul2:1: a NUL byte at column 16" -- explain "$TMP/nul2"
printf '{"tokens": [1], "salt": "\xff"}\n' >"$TMP/utf1"; expect_error "json not utf-8" "utf1:1: not valid UTF-8" -- explain "$TMP/utf1"
expect_error "salt not utf-8" "--salt: '\\\\xff' is not valid UTF-8" -- explain --salt $'\xff' "$TMP/big"
# numbers are plain digits: strtoull skipped spaces and negated (' -18446744073709551615' was 1)
expect_error "pool blocks negated" "--pool-blocks: ' -18446744073709551615'" -- explain --pool-blocks ' -18446744073709551615' "$TMP/big"
expect_error "lora negated" "--lora: ' -1' is not" -- explain --lora ' -1' "$TMP/big"
expect_error "lora plus" "--lora: '\\+1' is not" -- explain --lora +1 "$TMP/big"
expect_error "pool blocks space" "--pool-blocks: '5 '" -- explain --pool-blocks '5 ' "$TMP/big"
expect_error "seed 2^64" "--seed: '18446744073709551616'" -- explain --seed 18446744073709551616 "$TMP/big"
# input quoted in an error is escaped: no raw control byte reaches the terminal
expect_error "escaped file name" 'cannot open .*/evil\\x1b\[2J\\nname' -- explain "$TMP/evil"$'\x1b[2J\n'name
grep -q $'\x1b' "$TMP/err" && fail "a raw ESC in the error"
printf '1 2\n3 \x1b]0;pwned\x07\n' >"$TMP/esc1"; expect_error "escaped token" "esc1:2: '\\\\x1b\\]0;pwned\\\\x07' is not a token id" -- explain "$TMP/esc1"
expect_error "escaped value" "--pool-blocks: '1\\\\n2'" -- explain --pool-blocks $'1\n2' "$TMP/big"
# ... and in the text report: the salt
"$KVC" explain --salt $'t\x1b[31m' "$TMP/big" >"$TMP/o" || fail "control-byte salt: exit $?"
grep -q $'\x1b' "$TMP/o" && fail "a raw ESC in the report"
grep -qF "salt 't\x1b[31m'" "$TMP/o" || fail "the salt is not shown escaped"
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

# ---- eviction policies, stranded blocks, a weakened hash ----
POLICIES="lru lfu priority naive-lru" # what kvc_eviction_names lists
"$KVC" explain --help >"$TMP/help"
for want in '--eviction POLICY' '--release ORDER' 'tail-first' 'head-first' '--kv-bytes-per-token N' \
            '1..1073741824' 'default 131072' '--hash-bits N' 'bits, 1..64' '"priority": N' 'priority 0..63'; do
  grep -qF -- "$want" "$TMP/help" || fail "explain --help lacks '$want'"
done
for pol in $POLICIES; do
  grep -Eq "^ +$pol +[a-z]" "$TMP/help" || fail "explain --help does not list the policy $pol with its summary"
done
awk 'length > 80 { exit 1 }' "$TMP/help" || fail "explain --help has lines over 80 columns"
"$KVC" explain --seed 7 "$TMP/small" | head -1 | grep -q '^pool: 64 blocks of 16 tokens; eviction lru; hash seed 7$' \
  || fail "the header should name the default policy"

# Which eviction order strands a prefix: released head-first, naive-lru evicts the system
# prompt's root under its children; every other policy evicts leaves only and strands none.
STRAND="$SRC/examples/eviction/strand.txt"
strand() { "$KVC" explain --seed 1 --pool-blocks 8 --block-size 4 "$@" "$STRAND"; }
strand --release head-first --eviction naive-lru >"$TMP/naive" 2>"$TMP/err" || fail "strand.txt naive-lru: exit $? ($(cat "$TMP/err"))"
grep -q '^pool: 8 blocks of 4 tokens; eviction naive-lru;' "$TMP/naive" || fail "the header should name naive-lru"
grep -Eq '^  evicted #0 \(hash [0-9a-f]{32}\): least recently used cached block, cached children or not; it had cached children: 2 blocks stranded$' "$TMP/naive" \
  || fail "naive-lru should say its eviction of the root stranded 2 blocks"
grep -Eq '^  stranded #1 \(hash [0-9a-f]{32}\): cached, resident, unreachable: its parent #0 was evicted$' "$TMP/naive" \
  || fail "naive-lru: no 'stranded #1 ... its parent #0 was evicted' line"
grep -Eq '^  stranded #2 \(hash [0-9a-f]{32}\): cached, resident, unreachable: below #1, which is stranded$' "$TMP/naive" \
  || fail "naive-lru: no 'stranded #2 ... below #1' line"
grep -q '^  => stranded now: 2 blocks (1048576 bytes = 1.0 MiB of KV), 0 before this prompt$' "$TMP/naive" \
  || fail "naive-lru: the stranded bytes after prompt 2 (2 blocks x 4 tokens x 131072 bytes)"
[ "$(grep -c '^  => stranded now' "$TMP/naive")" -eq 2 ] || fail "naive-lru: the stranded line should come after the two prompts that changed it"
grep -q 'after-miss #1 .*; stranded #1 holds it, unreachable$' "$TMP/naive" \
  || fail "naive-lru: prompt 3 should say the stranded block holds the block it recomputes"
grep -q '(itself stranded: no lookup could reach it)$' "$TMP/naive" || fail "naive-lru: evicting a stranded block should say so"
[ "$(grep '=> hit' "$TMP/naive" | sed -n 3p | grep -c 'hit 0 of 14 tokens')" -eq 1 ] || fail "naive-lru: prompt 3 should miss its prefix"
grep -q '^stranded: 4 blocks now (2097152 bytes = 2.0 MiB of KV at 131072 bytes a token), 6 ever$' "$TMP/naive" \
  || fail "naive-lru: the totals' stranded line"
for pol in lru lfu priority; do
  for rel in head-first tail-first; do
    strand --release $rel --eviction $pol >"$TMP/o" 2>"$TMP/err" || fail "strand.txt $pol $rel: exit $? ($(cat "$TMP/err"))"
    grep -q '^stranded: 0 blocks now (0 bytes of KV at 131072 bytes a token), 0 ever$' "$TMP/o" || fail "$pol ($rel) strands blocks"
    grep -q 'stranded #' "$TMP/o" && fail "$pol ($rel) printed a stranded block"
    [ "$(grep '=> hit' "$TMP/o" | sed -n 3p | grep -c 'hit 8 of 14 tokens')" -eq 1 ] || fail "$pol ($rel): prompt 3 should hit the 2 blocks left of its prefix"
    grep -q "released $rel;" "$TMP/o" || fail "$pol: the release line should say $rel"
  done
done
# released tail-first (the library's order), no parent is older than its children: even
# naive-lru strands nothing
strand --eviction naive-lru >"$TMP/o" || fail "strand.txt naive-lru tail-first: exit $?"
grep -q '^stranded: 0 blocks now .*, 0 ever$' "$TMP/o" || fail "naive-lru released tail-first strands blocks"
# each policy says why it took a block
strand --release head-first --eviction lfu | grep -q '^  evicted #2 (hash [0-9a-f]*): fewest uses among cached blocks with no cached children' \
  || fail "lfu's eviction line"
strand --release head-first --eviction priority | grep -q ': lowest priority among cached blocks with no cached children' \
  || fail "priority's eviction line"
strand --release head-first --eviction lru | grep -q '^  evicted #2 (hash [0-9a-f]*): least recently used cached block with no cached children$' \
  || fail "lru's eviction line"
# the bytes are KV bytes at --kv-bytes-per-token: 4 blocks x 4 tokens x 1000
strand --release head-first --eviction naive-lru --kv-bytes-per-token 1000 | grep -q '^stranded: 4 blocks now (16000 bytes = 15.6 KiB of KV at 1000 bytes a token), 6 ever$' \
  || fail "--kv-bytes-per-token 1000 should weigh 4 stranded blocks at 16000 bytes"
# --json: the cache's totals after each prompt, the stranded blocks and why
strand --json --release head-first --eviction naive-lru >"$TMP/j" || fail "strand.txt --json: exit $?"
[ "$(wc -l <"$TMP/j")" -eq 3 ] || fail "--json should still print one line per prompt"
for key in '"stranded_blocks":' '"stranded_bytes":' '"strandings":' '"collisions":' '"lookups":' '"priority":0,' '"stranded":\['; do
  [ "$(grep -c "$key" "$TMP/j")" -eq 3 ] || fail "--json: every line should carry $key"
done
sed -n 1p "$TMP/j" | grep -q '"stranded":\[\],' || fail "--json prompt 1 strands nothing"
sed -n 2p "$TMP/j" | grep -q '"stranded":\[{"block":1,"hash":"[0-9a-f]*","parent":0,"parent_evicted":true},{"block":2,"hash":"[0-9a-f]*","parent":1,"parent_evicted":false}\]' \
  || fail "--json prompt 2 should list blocks 1 and 2 as stranded, and why"
sed -n 2p "$TMP/j" | grep -q '"evicted":\[{"block":0,"hash":"[0-9a-f]*","stranded_children":2}\]' || fail "--json: the eviction that stranded"
sed -n 2p "$TMP/j" | grep -q '"stranded_blocks":2,"stranded_bytes":1048576,"strandings":2}' || fail "--json prompt 2's totals"
sed -n 3p "$TMP/j" | grep -q '"stranded_blocks":4,"stranded_bytes":2097152,"strandings":6}' || fail "--json prompt 3's totals"
sed -n 3p "$TMP/j" | grep -q '"stranded_copy":1' || fail "--json: the stranded copy of a recomputed block"
sed -n 3p "$TMP/j" | grep -q '{"block":1,"hash":"[0-9a-f]*","stranded":true}' || fail "--json: the eviction of a stranded block"
# every policy over random prompts in a tiny pool, both release orders: explain's own checks
# (the stranded blocks it finds are the ones the cache counts; every hit holds the prompt's
# exact prefix; the sequence table checks) pass, and only naive-lru released head-first strands
for seed in 1 2; do
  awk -v s=$seed 'BEGIN { srand(s); for (l = 0; l < 60; l++) { n = 1 + int(rand() * 30); p = int(rand() * 3);
    for (i = 0; i < n; i++) printf "%d%s", (i < 12 ? p * 100 + i : int(rand() * 20)), (i + 1 < n ? " " : "\n") } }' >"$TMP/rand"
  for pol in $POLICIES; do
    for rel in tail-first head-first; do
      "$KVC" explain --seed $seed --pool-blocks 9 --block-size 2 --eviction $pol --release $rel "$TMP/rand" >"$TMP/o" 2>"$TMP/err" \
        || fail "random prompts ($pol, $rel, seed $seed): exit $? ($(cat "$TMP/err"))"
      ever=$(sed -n 's/^stranded: .*, \([0-9]*\) ever$/\1/p' "$TMP/o")
      if [ "$pol-$rel" = naive-lru-head-first ]; then
        [ "${ever:-0}" -gt 0 ] || fail "random prompts: naive-lru head-first stranded nothing (seed $seed)"
      else
        [ "$ever" = 0 ] || fail "random prompts: $pol $rel stranded ${ever:-?} blocks (seed $seed)"
      fi
    done
  done
done

# The priority policy keeps what a high-priority request used: the JSON "priority" reaches
# the cache through seq's path (before, every query said 0 and the policy was LRU)
PRIO="$SRC/examples/eviction/priority.jsonl"
"$KVC" explain --seed 1 --pool-blocks 8 --block-size 4 --eviction priority "$PRIO" >"$TMP/o" 2>"$TMP/err" || fail "priority.jsonl: exit $? ($(cat "$TMP/err"))"
grep '=> hit' "$TMP/o" | tail -1 | grep -q 'hit 12 of 14 tokens' || fail "priority: the priority-9 system prompt should survive"
grep -q '^prompt 1 (line 7): 14 tokens = 3 full blocks + 1 partial (block size 4), priority 9$' "$TMP/o" || fail "the text header should show the priority"
for pol in lru lfu naive-lru; do
  "$KVC" explain --seed 1 --pool-blocks 8 --block-size 4 --eviction $pol "$PRIO" | grep '=> hit' | tail -1 | grep -q 'hit 4 of 14 tokens' \
    || fail "$pol ignores priorities: the last prompt should hit 4 tokens"
done
"$KVC" explain --json --seed 1 --pool-blocks 8 --block-size 4 --eviction priority "$PRIO" | head -1 | grep -q '"lora":0,"priority":9,' \
  || fail "--json should carry the priority"
printf '{"tokens": [1, 2, 3], "priority": 63}\n{"tokens": [1, 2, 3], "priority": 1e1}\n{"tokens": [1, 2, 3], "priority": 0}\n' >"$TMP/prio"
"$KVC" explain --json --eviction priority "$TMP/prio" >"$TMP/o" 2>"$TMP/err" || fail "priorities 63, 1e1, 0: exit $? ($(cat "$TMP/err"))"
[ "$(grep -o '"priority":[0-9]*' "$TMP/o" | tr '\n' ' ')" = '"priority":63 "priority":10 "priority":0 ' ] || fail "priorities read inexactly: $(grep -o '"priority":[0-9]*' "$TMP/o" | tr '\n' ' ')"
jerr "priority 64" '{"tokens": [1], "priority": 64}' '"priority" 64 is too large \(max 63\)$'
jerr "priority 1e20" '{"tokens": [1], "priority": 1e20}' '"priority" 1e20 is too large \(max 63\)$'
jerr "priority negative" '{"tokens": [1], "priority": -1}' '"priority" is not a non-negative integer$'
jerr "priority fraction" '{"tokens": [1], "priority": 2.5}' '"priority" is not a non-negative integer$'
jerr "priority string" '{"tokens": [1], "priority": "3"}' '"priority" is not a non-negative integer$'
jerr "priority twice" '{"tokens": [1], "priority": 1, "priority": 2}' '"priority" is given twice$'
jerr "key list" '{"tokens": [1], "prio": 1}' 'unknown key "prio" \(the keys are tokens, salt, lora and priority\)$'

# --hash-bits: unrelated blocks collide, and nothing changes but the hashes and the reason a
# block missed: every hit, every slot, every eviction is the full hash's
WEAK="$SRC/examples/collisions/weak-hash.txt"
norm() { # the hit/miss columns and everything else, hashes masked, a collision read as a miss
  sed -E 's/[0-9a-f]{32}/<hash>/g; s/collision  ((#[0-9]+|-) +)hash found, but its tokens or parent differ \(a collision\)/miss       \1no cached block has this hash/; s/; stranded #[0-9]+ holds it, unreachable//' \
    | grep -v -e '^pool:' -e '^collisions:'
}
"$KVC" explain --seed 1 --block-size 4 --hash-bits 4 "$WEAK" >"$TMP/w" 2>"$TMP/err" || fail "weak-hash.txt --hash-bits 4: exit $? ($(cat "$TMP/err"))"
grep -q '^pool: 64 blocks of 4 tokens; eviction lru; hash seed 1; index hash cut to 4 bits (--hash-bits)$' "$TMP/w" || fail "the header should say the hash is cut"
[ "$(grep -Ec '^  [0-9]+ +[0-9]+-[0-9]+ +[0-9a-f]{32}  collision ' "$TMP/w")" -ge 3 ] || fail "--hash-bits 4 should show collisions"
grep -Eq '^collisions: [1-9][0-9]* \(' "$TMP/w" || fail "--hash-bits 4: the totals should count collisions"
grep -Eq '^  [0-9]+ +[0-9]+-[0-9]+ +0{28}[0-9a-f]{4}  ' "$TMP/w" || fail "--hash-bits 4: hashes should keep their low bits only"
"$KVC" explain --seed 1 --block-size 4 "$WEAK" >"$TMP/f" || fail "weak-hash.txt: exit $?"
grep -q '^collisions: 0 (' "$TMP/f" || fail "the full hash should not collide"
grep -q ' collision ' "$TMP/f" && fail "the full hash should show no collision status"
grep -q 'hit 12 of 17 tokens' "$TMP/f" || fail "weak-hash.txt: prompt 9 should hit the first prompt's 3 blocks"
norm <"$TMP/w" >"$TMP/wn"; norm <"$TMP/f" >"$TMP/fn"
diff -u "$TMP/fn" "$TMP/wn" >"$TMP/d" || fail "--hash-bits 4 changed a hit, a slot or an eviction: $(head -20 "$TMP/d")"
"$KVC" explain --json --seed 1 --block-size 4 --hash-bits 4 "$WEAK" | tail -1 | grep -Eq '"collisions":[1-9]' || fail "--json totals should count collisions"
# ... in a pool small enough to evict, under every policy and both release orders, 1 to 3 bits
for bits in 1 3; do
  for pol in $POLICIES; do
    for rel in tail-first head-first; do
      "$KVC" explain --seed 2 --pool-blocks 9 --block-size 2 --eviction $pol --release $rel --hash-bits $bits "$TMP/rand" 2>"$TMP/err" | norm >"$TMP/wn" \
        || fail "random prompts --hash-bits $bits ($pol, $rel): exit ($(cat "$TMP/err"))"
      "$KVC" explain --seed 2 --pool-blocks 9 --block-size 2 --eviction $pol --release $rel "$TMP/rand" | norm >"$TMP/fn"
      cmp -s "$TMP/wn" "$TMP/fn" || fail "random prompts --hash-bits $bits ($pol, $rel): not the full hash's hits"
    done
  done
done
"$KVC" explain --hash-bits 64 "$TMP/small" >/dev/null || fail "--hash-bits 64 should be accepted"

# bad values: one line, exit 1
expect_error "eviction unknown" "^kvcache explain: --eviction: 'mru' is not a policy \(lru, lfu, priority, naive-lru\)$" -- explain --eviction mru "$TMP/small"
expect_error "eviction case" "--eviction: 'LRU' is not a policy" -- explain --eviction LRU "$TMP/small"
expect_error "eviction empty" "--eviction: '' is not a policy" -- explain --eviction '' "$TMP/small"
expect_error "eviction missing" "--eviction needs a value" -- explain "$TMP/small" --eviction
expect_error "release unknown" "^kvcache explain: --release: 'sideways' is not an order \(tail-first, head-first\)$" -- explain --release sideways "$TMP/small"
expect_error "hash bits 0" "^kvcache explain: --hash-bits: '0' is not a number in 1..64$" -- explain --hash-bits 0 "$TMP/small"
expect_error "hash bits 65" "--hash-bits: '65' is not a number in 1..64" -- explain --hash-bits 65 "$TMP/small"
expect_error "hash bits 128" "--hash-bits: '128' is not a number in 1..64" -- explain --hash-bits 128 "$TMP/small"
expect_error "hash bits junk" "--hash-bits: 'four' is not" -- explain --hash-bits four "$TMP/small"
expect_error "hash bits negative" "--hash-bits: '-4' is not" -- explain --hash-bits -4 "$TMP/small"
expect_error "kv bytes 0" "^kvcache explain: --kv-bytes-per-token: '0' is not a number in 1..1073741824$" -- explain --kv-bytes-per-token 0 "$TMP/small"
expect_error "kv bytes big" "--kv-bytes-per-token: '1073741825' is not" -- explain --kv-bytes-per-token 1073741825 "$TMP/small"
expect_error "kv bytes junk" "--kv-bytes-per-token: '128KiB' is not" -- explain --kv-bytes-per-token 128KiB "$TMP/small"
"$KVC" explain --kv-bytes-per-token 1073741824 "$TMP/small" >/dev/null || fail "--kv-bytes-per-token 2^30 should be accepted"

if [ "$fails" -ne 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "explain CLI: all checks passed"
