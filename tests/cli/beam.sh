#!/usr/bin/env bash
# CLI tests for `kvcache run --beams N` on stories260K: the best hypothesis's text, the JSON
# keys (the issue's plus "beams", one entry per hypothesis, best score first), --beams 1 the
# same text as greedy, --prompts run one after another, and every bad-input path a one-line
# error with nothing on stdout.
# usage: beam.sh <kvcache-binary> <source-dir> <test-data-dir>
set -u
KVC=$1
DATA=$3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# expect_error NAME EXIT STDERR_REGEX -- ARGS...
expect_error() {
  local name=$1 want=$2 regex=$3; shift 4
  "$KVC" "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  [ "$rc" -eq "$want" ] || fail "$name: exit $rc, want $want"
  [ "$(wc -l <"$TMP/err")" -eq 1 ] || fail "$name: stderr is not one line: $(cat -v "$TMP/err")"
  grep -Eq -e "$regex" "$TMP/err" || fail "$name: stderr '$(cat -v "$TMP/err")' does not match '$regex'"
  [ ! -s "$TMP/out" ] || fail "$name: printed to stdout on bad input"
}

S=$DATA/models/stories260K.gguf
R=(run --model "$S" --threads 1)

"$KVC" "${R[@]}" --prompt "Once upon a time" --beams 4 -n 30 >"$TMP/b4" 2>"$TMP/err" ||
  fail "beams 4: exit $? ($(cat "$TMP/err"))"
[ "$(wc -l <"$TMP/b4")" -eq 1 ] || fail "beams 4: not one line of text: $(cat "$TMP/b4")"
grep -q '^, there was a little girl named Lily' "$TMP/b4" || fail "beams 4: text $(cat "$TMP/b4")"
grep -q 'beams, .* steps, peak [0-9]* of [0-9]* KV blocks' "$TMP/err" || fail "beams 4: stderr $(cat "$TMP/err")"

# one beam is greedy: the same text as the engine's greedy run
"$KVC" "${R[@]}" --prompt "The big dog" --beams 1 -n 30 --ignore-eos >"$TMP/b1" 2>/dev/null || fail "beams 1: exit $?"
"$KVC" "${R[@]}" --prompt "The big dog" -n 30 --ignore-eos >"$TMP/g" 2>/dev/null || fail "greedy: exit $?"
cmp -s "$TMP/b1" "$TMP/g" || fail "beams 1 is not greedy: '$(cat "$TMP/b1")' vs '$(cat "$TMP/g")'"

"$KVC" "${R[@]}" --prompt "Once upon a time" --beams 3 -n 12 --length-penalty 0.5 --json >"$TMP/j" 2>"$TMP/err" ||
  fail "json: exit $? ($(cat "$TMP/err"))"
[ "$(wc -l <"$TMP/j")" -eq 2 ] || fail "json: $(wc -l <"$TMP/j") lines, want 2"
python3 - "$TMP/j" <<'PY' || fail "json: keys or values"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
r, s = lines
want = {"id", "prompt_tokens", "cached_tokens", "completion_tokens", "output_ids", "text",
        "finish_reason", "ttft_ms", "tpot_ms", "logprobs", "beams"}
assert set(r) == want, set(r) ^ want
assert len(r["beams"]) == 3
sc = [b["score"] for b in r["beams"]]
assert sc == sorted(sc, reverse=True), sc
assert r["beams"][0]["ids"] == r["output_ids"] and r["beams"][0]["text"] == r["text"]
assert r["completion_tokens"] == len(r["output_ids"]) == 12
for b in r["beams"]:
    assert abs(b["score"] - b["sum_logprob"] / len(b["ids"]) ** 0.5) < 1e-6, b
    assert b["finish_reason"] == "length"
assert s["summary"] is True and s["beams"] == 3 and s["peak_kv_blocks"] >= 1
PY

printf 'Once upon a time\n{"prompt": "The big dog", "n": 8}\n' >"$TMP/prompts"
"$KVC" "${R[@]}" --prompts "$TMP/prompts" --beams 2 -n 10 --json >"$TMP/jp" 2>"$TMP/err" ||
  fail "prompts: exit $? ($(cat "$TMP/err"))"
[ "$(wc -l <"$TMP/jp")" -eq 3 ] || fail "prompts: $(wc -l <"$TMP/jp") lines, want 3"
python3 -c '
import json, sys
l = [json.loads(x) for x in open(sys.argv[1])]
assert [x["id"] for x in l[:2]] == [0, 1] and l[1]["completion_tokens"] == 8, l
' "$TMP/jp" || fail "prompts: ids or per-request n"

expect_error "beams 0" 1 "--beams: '0'" -- "${R[@]}" --prompt x --beams 0
expect_error "beams 65" 1 "--beams: '65'" -- "${R[@]}" --prompt x --beams 65
expect_error "length penalty nan" 1 "--length-penalty: 'nan'" -- "${R[@]}" --prompt x --beams 2 --length-penalty nan
expect_error "beams spec" 1 "--beams does not go with --spec" -- "${R[@]}" --prompt x --beams 2 --spec ngram
expect_error "beams no cache" 1 "--beams does not go with --spec or --no-kv-cache" -- "${R[@]}" --prompt x --beams 2 --no-kv-cache
expect_error "beams stop" 1 "--beams: stop strings" -- "${R[@]}" --prompt x --beams 2 --stop foo
expect_error "beams pool" 1 "too small for 8 beams" -- "${R[@]}" --prompt "Once upon a time" --beams 8 -n 40 --block-size 4 --kv-memory 20KiB
expect_error "beams ctx" 1 "exceed the context" -- "${R[@]}" --prompt x --beams 2 -n 5000

[ "$fails" -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "beam CLI: all passed"
