#!/usr/bin/env bash
# CLI tests for `kvcache sim`: outputs, determinism, scenarios, every bad-input path.
# usage: sim.sh <kvcache-binary> <source-dir> <test-data-dir>
set -u
KVC=$1
SRC=$2
DATA=$3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

expect_error() { # NAME REGEX -- ARGS...: exit 1, one stderr line matching, nothing on stdout
  local name=$1 regex=$2; shift 3
  "$KVC" "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  [ "$rc" -eq 1 ] || fail "$name: exit $rc, want 1"
  [ "$(wc -l <"$TMP/err")" -eq 1 ] || fail "$name: stderr is not one line: $(cat "$TMP/err")"
  grep -Eq -e "$regex" "$TMP/err" || fail "$name: stderr '$(cat "$TMP/err")' does not match '$regex'"
  [ ! -s "$TMP/out" ] || fail "$name: printed to stdout on bad input"
}

BASE=(sim --model llama-3.1-8b --gpu h100-sxm --quiet)
W='poisson:rate=20,n=300,prompt=700,output=60'

"$KVC" --help | grep -q "^  sim " || fail "--help does not list sim"
"$KVC" sim --help | grep -q -- "--workload" || fail "sim --help lacks --workload"

# text and JSON reports; CSV and SVG files; the same bytes twice
"$KVC" "${BASE[@]}" --workload "$W" >"$TMP/text" || fail "text run: exit $?"
grep -q "completed" "$TMP/text" || fail "text report lacks completed"
grep -q "cost.kv_bytes_per_token" "$TMP/text" || fail "text report lacks the cost model's constants"
"$KVC" "${BASE[@]}" --workload "$W" --json --csv "$TMP/ts.csv" --svg "$TMP/svg" >"$TMP/a.json" || fail "json run"
"$KVC" "${BASE[@]}" --workload "$W" --json >"$TMP/b.json"
cmp -s "$TMP/a.json" "$TMP/b.json" || fail "same inputs, different JSON"
for key in completed ttft_ms tpot_ms e2e_ms p50 p90 p99 throughput_tokens_per_s goodput_requests_per_s \
           prefix_hit_rate preemptions recomputed_tokens swapped_bytes peak_kv_blocks simulated_seconds; do
  grep -q "\"$key\"" "$TMP/a.json" || fail "JSON lacks \"$key\""
done
grep -q '"completed": 300' "$TMP/a.json" || fail "JSON should say 300 completed"
[ "$(wc -l <"$TMP/ts.csv")" -gt 5 ] || fail "CSV time series is too short"
for f in kv_usage.svg batch.svg latency_cdf.svg; do
  grep -q "<svg" "$TMP/svg/$f" 2>/dev/null || fail "no $f"
done
"$KVC" "${BASE[@]}" --workload "$W" --seed 9 --json >"$TMP/c.json"
cmp -s "$TMP/a.json" "$TMP/c.json" && fail "another seed gave the same report"
# the step trace
"$KVC" "${BASE[@]}" --workload 'poisson:rate=5,n=5,prompt=100,output=3' --trace "$TMP/trace" >/dev/null || fail "trace run"
grep -q "admit r0" "$TMP/trace" || fail "the trace does not show admissions"
# policies and a spec file
"$KVC" "${BASE[@]}" --workload "$SRC/examples/workloads/interactive_and_batch.json" --max-requests 200 \
  --admission reserve-expected --expected-output 200 --preemption swap --class-kv-cap batch=0.4 \
  --tenant-fair --tenant-kv-share 0.8 --spec-tokens 2 --slo-ttft-ms 500 --slo-tpot-ms 50 --json >"$TMP/p.json" \
  || fail "policy run: exit $?"
grep -q '"completed": 200' "$TMP/p.json" || fail "policy run should complete 200"
# a scenario: one command, a table of variants
"$KVC" sim --scenario "$SRC/examples/scenarios/multiturn.json" >"$TMP/sc" 2>/dev/null || fail "scenario: exit $?"
grep -q "^question:" "$TMP/sc" || fail "scenario output lacks the question"
grep -q "^no prefix caching" "$TMP/sc" || fail "scenario output lacks a variant row"
"$KVC" sim --scenario "$SRC/examples/scenarios/multiturn.json" --json >"$TMP/sc.json" 2>/dev/null || fail "scenario json"
grep -q '"variants"' "$TMP/sc.json" || fail "scenario JSON lacks variants"

# bad input
expect_error "no workload" "no --workload" -- "${BASE[@]}"
expect_error "no model" "no --model" -- sim --workload "$W"
expect_error "missing trace" "nope" -- "${BASE[@]}" --workload "$TMP/nope.jsonl"
printf '{"timestamp": 0, "input_length": 10}\n' >"$TMP/bad.jsonl"
expect_error "bad trace line" "bad.jsonl:1" -- "${BASE[@]}" --workload "$TMP/bad.jsonl"
expect_error "admission" "--admission: 'lazy'" -- "${BASE[@]}" --workload "$W" --admission lazy
expect_error "preemption" "--preemption: 'kill'" -- "${BASE[@]}" --workload "$W" --preemption kill
expect_error "class cap syntax" "--class-kv-cap: 'batch'" -- "${BASE[@]}" --workload "$W" --class-kv-cap batch
expect_error "class cap share" "--class-kv-cap: 'batch=2'" -- "${BASE[@]}" --workload "$W" --class-kv-cap batch=2
expect_error "unknown class" "no class 'gold'" -- "${BASE[@]}" --workload "$W" --class-kv-cap gold=0.5
expect_error "num blocks" "--num-blocks: 'x'" -- "${BASE[@]}" --workload "$W" --num-blocks x
expect_error "unknown option" "unknown option '--frob'" -- "${BASE[@]}" --workload "$W" --frob
expect_error "does not start" "does not start" -- sim --model llama-3.1-70b --gpu h100-sxm --tp 2 --workload "$W" --quiet
expect_error "scenario missing" "cannot read" -- sim --scenario "$TMP/none.json"
printf '{"question": "q"}' >"$TMP/sc-bad.json"
expect_error "scenario shape" "needs \"question\"" -- sim --scenario "$TMP/sc-bad.json"
printf '{"question":"q","args":["--model","llama-3.1-8b","--gpu","h100-sxm","--workload","%s"],"variants":[{"name":"a","args":[]}],"metrics":["warp_speed"]}' "$W" >"$TMP/sc-metric.json"
expect_error "scenario metric" "unknown metric 'warp_speed'" -- sim --scenario "$TMP/sc-metric.json"

if [ "$fails" -ne 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "sim CLI: all checks passed"
