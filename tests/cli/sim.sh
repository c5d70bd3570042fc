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

# the classic baselines: no KV cache (recompute every step), contiguous allocation
"$KVC" "${BASE[@]}" --workload 'poisson:rate=20,n=40,prompt=300,output=30' --num-blocks 3000 --max-model-len 4096 \
  --allocation contiguous --json >"$TMP/contig.json" || fail "contiguous run: exit $?"
grep -qF '"allocation": "contiguous"' "$TMP/contig.json" || fail "contiguous run: JSON lacks the allocation"
grep -qE '"fragmentation.mean": 0\.[89]' "$TMP/contig.json" || fail "contiguous run: fragmentation missing or low"
"$KVC" "${BASE[@]}" --workload 'poisson:rate=20,n=20,prompt=300,output=30' --no-kv-cache --json >"$TMP/nokv.json" ||
  fail "no-kv-cache run: exit $?"
grep -qF '"kv_cache": "off (every step recomputes the whole context)"' "$TMP/nokv.json" || fail "no-kv-cache run: JSON lacks kv_cache"
grep -qF '"cost.kv_block_efficiency": 0.78048' "$TMP/nokv.json" || fail "the block size's efficiency is not in the report"
expect_error "allocation name" "^kvcache sim: --allocation: 'buddy' is not paged or contiguous$" -- "${BASE[@]}" --workload "$W" --allocation buddy

# kv_blocks_total, a key of the report, is a scenario metric too (the blocks per replica)
cat >"$TMP/blocks.json" <<'EOF2'
{"question": "how many blocks?", "args": ["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--num-blocks", "777",
 "--workload", "poisson:rate=5,n=20,prompt=100,output=10"],
 "variants": [{"name": "one", "args": []}], "metrics": ["kv_blocks_total", "peak_kv_blocks"]}
EOF2
"$KVC" sim --scenario "$TMP/blocks.json" --json >"$TMP/blocks.out" 2>"$TMP/blocks.err" || fail "kv_blocks_total scenario: exit $? ($(cat "$TMP/blocks.err"))"
grep -q '"kv_blocks_total":[[:space:]]*777' "$TMP/blocks.out" || fail "kv_blocks_total scenario: $(cat "$TMP/blocks.out")"

# eviction and victim policies by name; stranded KV and errored requests in the report
"$KVC" "${BASE[@]}" --workload "$W" --eviction naive-lru --victim largest --json >"$TMP/ev.json" || fail "eviction run: exit $?"
for key in '"eviction": "naive-lru"' '"victim": "largest"' '"stranded_blocks": {"peak": 0, "end": 0}' \
           '"stranded_bytes": {"peak": 0, "end": 0}' '"strandings": 0' '"errored_requests": 0' '"kv_bytes_per_block": 2097152'; do
  grep -qF "$key" "$TMP/ev.json" || fail "eviction run: JSON lacks $key"
done
grep -qF '"victim": "latest"' "$TMP/a.json" || fail "the default victim policy is not named latest"
grep -qF '"eviction": "lru"' "$TMP/a.json" || fail "the default eviction policy is not named lru"
grep -q '^  stranded KV        peak 0 blocks (0 bytes), at the end 0 (0 bytes); 0 blocks stranded in all$' "$TMP/text" \
  || fail "text report lacks the stranded KV line"
grep -q '^  errored requests   0 ' "$TMP/text" || fail "text report lacks the errored requests line"
expect_error "eviction name" "^kvcache sim: --eviction: 'mru' is not lru, lfu, priority or naive-lru$" -- "${BASE[@]}" --workload "$W" --eviction mru
expect_error "victim name" "^kvcache sim: --victim: 'oldest' is not latest or largest$" -- "${BASE[@]}" --workload "$W" --victim oldest
# the eviction scenario: lru and naive-lru give the same row (tail-first release: nothing is
# ever stranded), priority keeps the interactive class's system prompts best, nothing strands
"$KVC" sim --scenario "$SRC/examples/scenarios/eviction.json" >"$TMP/ev.sc" 2>/dev/null || fail "eviction scenario: exit $?"
lru_row=$(sed -n 's/^lru  *//p' "$TMP/ev.sc")
naive_row=$(sed -n 's/^naive-lru  *//p' "$TMP/ev.sc")
[ -n "$lru_row" ] && [ "$lru_row" = "$naive_row" ] || fail "eviction scenario: lru '$lru_row' and naive-lru '$naive_row' differ"
grep -q '^note: naive-lru evicts' "$TMP/ev.sc" || fail "eviction scenario: no note"
"$KVC" sim --scenario "$SRC/examples/scenarios/eviction.json" --json >"$TMP/ev.sc.json" 2>/dev/null || fail "eviction scenario json"
python3 - "$TMP/ev.sc.json" <<'PY' || fail "eviction scenario JSON: wrong numbers"
import json, sys
d = json.load(open(sys.argv[1]))
m = {v["name"]: v["metrics"] for v in d["variants"]}
hit = "class:interactive.prefix_hit_rate"
assert m["priority (by class)"][hit] > m["lfu"][hit] > m["lru"][hit], m
for v in m.values():
    for k in ("stranded_blocks.peak", "stranded_bytes.peak", "stranded_blocks.end", "strandings"):
        assert v[k] == 0, (k, v)
assert d["note"].startswith("naive-lru")
PY
printf '{"question":"q","note":3,"args":[],"variants":[{"name":"a","args":[]}],"metrics":["completed"]}' >"$TMP/sc-note.json"
expect_error "scenario note" "a \"note\", if any, is a string" -- sim --scenario "$TMP/sc-note.json"
"$KVC" sim --scenario "$SRC/examples/scenarios/victim.json" >"$TMP/victim.sc" 2>/dev/null || fail "victim scenario: exit $?"
grep -q '^recompute, largest ' "$TMP/victim.sc" || fail "victim scenario lacks the largest-victim row"

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

no_control_bytes() { # NAME FILE: nothing but printable text and line ends
  if LC_ALL=C grep -q "$(printf '[\001-\011\013-\037\177]')" "$2"; then fail "$1: raw control bytes in $(od -c "$2" | head -3)"; fi
}

# times past the simulator's horizon (1e9 s) are refused with the line and the field
printf '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n{"timestamp": 1e300, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n' >"$TMP/far.jsonl"
expect_error "Mooncake 1e300 ms" "far.jsonl:2: field 'timestamp': 1e\+300 ms is past the simulator's horizon" -- "${BASE[@]}" --workload "$TMP/far.jsonl"
printf '{"arrival_s": 1e300, "tokens": [1, 2], "output": 2}\n' >"$TMP/far2.jsonl"
expect_error "time scale 1e9, huge arrival" "far2.jsonl:1: field 'arrival_s'.*time scale 1e\+09" -- "${BASE[@]}" --workload "$TMP/far2.jsonl" --time-scale 1e9
expect_error "time scale 1e9, spec" "streams\[0\]: request [0-9]+ arrives at .* past the simulator's horizon" -- "${BASE[@]}" --workload "$W" --time-scale 1e9
# inline specs: an unknown process is named, a spec longer than a file name runs
expect_error "unknown process" "zipf:rate=5,n=20: no such file, and 'zipf' is not an arrival process" -- "${BASE[@]}" --workload zipf:rate=5,n=20
LONG="poisson:rate=20,n=30,prompt=100,output=5,tenant=$(printf 't%.0s' $(seq 300))"
"$KVC" "${BASE[@]}" --workload "$LONG" --json >"$TMP/long.json" 2>"$TMP/long.err" || fail "300-character inline spec: $(cat "$TMP/long.err")"
grep -q '"completed": 30' "$TMP/long.json" || fail "the 300-character inline spec did not run"

# --csv and --svg that cannot be written fail before the run: no report on stdout
expect_error "csv unwritable" "--csv: cannot write .*/no/such/x.csv: No such file" -- "${BASE[@]}" --workload "$W" --csv "$TMP/no/such/x.csv"
: >"$TMP/afile"
expect_error "svg is a file" "--svg: cannot write into .*afile: Not a directory" -- "${BASE[@]}" --workload "$W" --svg "$TMP/afile"
expect_error "svg under a file" "--svg: cannot write into .*afile/charts" -- "${BASE[@]}" --workload "$W" --svg "$TMP/afile/charts"
# a run that fails leaves no --csv or --svg behind
expect_error "failed run, outputs" "more than the limit of 256.0 MiB|more memory than the limit of 256.0 MiB" -- "${BASE[@]}" --workload "$W" --num-blocks 100000000 --max-memory 256MiB --csv "$TMP/left.csv" --svg "$TMP/left-svg"
[ ! -e "$TMP/left.csv" ] && [ ! -e "$TMP/left-svg" ] || fail "a failed run left its --csv or --svg behind"
expect_error "max-memory value" "--max-memory: 'lots' is not a size" -- "${BASE[@]}" --workload "$W" --max-memory lots

# scenarios: options beside --scenario, a recursive scenario, a variant's outputs
expect_error "options beside --scenario" "--scenario: --model cannot be given next to --scenario" -- sim --scenario "$SRC/examples/scenarios/multiturn.json" --model llama-3.1-8b
sc() { # FILE VARIANT-ARGS-JSON: a one-variant scenario
  printf '{"question":"q","args":["--model","llama-3.1-8b","--gpu","h100-sxm","--workload","%s"],"variants":[{"name":"v","args":%s}],"metrics":["completed"]}' "$W" "$2" >"$1"
}
sc "$TMP/sc-rec.json" "[\"--scenario\", \"$TMP/sc-rec.json\"]"
expect_error "recursive scenario" "variant 'v' gives --scenario: a scenario cannot run another scenario" -- sim --scenario "$TMP/sc-rec.json"
sc "$TMP/sc-json.json" '["--json"]'
expect_error "--json in a variant" "variant 'v' gives --json: give it next to --scenario" -- sim --scenario "$TMP/sc-json.json"
sc "$TMP/sc-csv-bad.json" "[\"--csv\", \"$TMP/no/such/v.csv\"]"
expect_error "variant csv unwritable" "--csv: cannot write .*/no/such/v.csv" -- sim --scenario "$TMP/sc-csv-bad.json"
sc "$TMP/sc-csv.json" "[\"--csv\", \"$TMP/v.csv\"]"
"$KVC" sim --scenario "$TMP/sc-csv.json" >"$TMP/sc-csv.out" 2>/dev/null || fail "variant with --csv: exit $?"
[ "$(wc -l <"$TMP/v.csv" 2>/dev/null || echo 0)" -gt 5 ] || fail "a variant's --csv was not written"

# control bytes from the input are escaped in errors and in the text report
printf '{"kvcache_workload": 1, "tenants": ["a"]}\n{"arrival_s": 0, "tokens": [1], "output": 1, "tenant": "x\\u001b[2Jy"}\n' >"$TMP/esc.jsonl"
expect_error "escaped tenant" "'x.x1b\[2Jy' is not declared" -- "${BASE[@]}" --workload "$TMP/esc.jsonl"
no_control_bytes "escaped tenant" "$TMP/err"
expect_error "escaped path" "no.x01such: cannot open" -- "${BASE[@]}" --workload "$(printf 'no\001such')"
no_control_bytes "escaped path" "$TMP/err"
printf '{"kvcache_workload": 1, "tenants": ["x\\u001b[2Jy"]}\n{"arrival_s": 0, "tokens": [1, 2, 3], "output": 2}\n' >"$TMP/esc2.jsonl"
"$KVC" "${BASE[@]}" --workload "$TMP/esc2.jsonl" >"$TMP/esc2.txt" || fail "escaped tenant run: exit $?"
grep -qF 'x\x1b[2Jy' "$TMP/esc2.txt" || fail "the text report does not show the tenant escaped"
no_control_bytes "text report" "$TMP/esc2.txt"

# replicas that receive no request cost nothing (--dp 65536 took about a minute for 50 requests)
timeout 60 "$KVC" "${BASE[@]}" --workload 'poisson:rate=5,n=50,prompt=500,output=50' --dp 65536 --json >"$TMP/dp.json" \
  || fail "--dp 65536 with 50 requests: exit $? (124: over a minute)"
grep -q '"completed": 50' "$TMP/dp.json" || fail "--dp 65536 should complete 50"

# a config whose KV bytes per token wrap to 0 (it crashed kvcache plan and sim): one line, exit 1
printf '{"hidden_size":1,"intermediate_size":1,"num_hidden_layers":1,"num_attention_heads":2147483648,"head_dim":2147483648,"vocab_size":1,"max_position_embeddings":4096}' >"$TMP/overflow.json"
expect_error "overflowing config" "." -- sim --model "$TMP/overflow.json" --gpu h100-sxm --workload "$W" --quiet
expect_error "overflowing config, pool given" "." -- sim --model "$TMP/overflow.json" --gpu h100-sxm --workload "$W" --num-blocks 1000 --quiet

# more tenants than the scheduler's old compile-time limit (16): 40 tenants, fair shares on, each
# tenant's requests reported under its name
python3 - "$TMP/t40.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    f.write(json.dumps({"kvcache_workload": 1, "tenants": ["t%d" % i for i in range(40)]}) + "\n")
    for k in range(120):
        f.write(json.dumps({"arrival_s": k * 0.01, "tokens": list(range(1, 200)), "output": 8,
                            "tenant": "t%d" % (k % 40)}) + "\n")
PY
"$KVC" "${BASE[@]}" --workload "$TMP/t40.jsonl" --tenant-fair --json >"$TMP/t40.json" || fail "40 tenants: exit $?"
python3 - "$TMP/t40.json" <<'PY' || fail "40 tenants: the report does not list each tenant's 3 requests"
import json, sys
r = json.load(open(sys.argv[1]))
def find(o):
    if isinstance(o, dict):
        if "tenants" in o and isinstance(o["tenants"], (list, dict)) and len(o["tenants"]) == 40:
            return o["tenants"]
        for v in o.values():
            x = find(v)
            if x is not None: return x
    elif isinstance(o, list):
        for v in o:
            x = find(v)
            if x is not None: return x
ts = find(r)
assert ts is not None, "no list of 40 tenants"
items = ts.items() if isinstance(ts, dict) else [(t.get("tenant", t.get("name")), t) for t in ts]
names = set()
for name, t in items:
    names.add(name)
    assert t.get("completed", t.get("n", t.get("requests"))) == 3, (name, t)
assert names == {"t%d" % i for i in range(40)}, names
PY

# --profile: measured step times instead of the roofline.  Every step of this profile takes
# 10 ms (and no overhead is added): alone, each request's TTFT is one step and its TPOT one step
printf '{"kvcache_profile": 1, "tokens": [1, 1000], "context": [0, 1000], "step_ms": [[10, 10], [10, 10]]}' >"$TMP/p10.json"
"$KVC" "${BASE[@]}" --workload 'poisson:rate=1,n=3,prompt=100,output=11' --profile "$TMP/p10.json" --json >"$TMP/prof.json" \
  || fail "--profile run: exit $?"
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["ttft_ms"]["max"] == 10 and r["tpot_ms"]["min" if "min" in r["tpot_ms"] else "p50"] == 10 and r["tpot_ms"]["max"] == 10, (r["ttft_ms"], r["tpot_ms"])' "$TMP/prof.json" \
  || fail "--profile: TTFT and TPOT are not the profile's 10 ms"
"$KVC" "${BASE[@]}" --workload 'poisson:rate=1,n=3,prompt=100,output=11' --profile "$TMP/p10.json" --step-overhead-ms 5 --json >"$TMP/prof5.json" \
  || fail "--profile with overhead: exit $?"
grep -q '"ttft_ms": {"count": 3, "mean": 15' "$TMP/prof5.json" || fail "--profile: --step-overhead-ms is not added"
expect_error "profile missing" "--profile: .*/nope.json: cannot open" -- "${BASE[@]}" --workload "$W" --profile "$TMP/nope.json"
printf '{"kvcache_profile": 1, "tokens": [1, 1], "context": [0], "step_ms": [[1], [1]]}' >"$TMP/pbad.json"
expect_error "profile out of order" "--profile: .*pbad.json: \"tokens\" must increase" -- "${BASE[@]}" --workload "$W" --profile "$TMP/pbad.json"
expect_error "profile not JSON" "--profile: .*: not a JSON object" -- "${BASE[@]}" --workload "$W" --profile "$SRC/README.md"

# --hold-shared-prefix: four requests sharing a 64-token prefix arrive together.  The scheduler
# alone admits all four in one step, none of them cached yet: no hit.  Held back as the engine
# does, the first computes the prefix and the other three hit its 4 blocks (3 x 64 tokens)
python3 - "$TMP/shared4.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    f.write(json.dumps({"kvcache_workload": 1}) + "\n")
    for k in range(4):
        f.write(json.dumps({"arrival_s": 0, "tokens": list(range(1, 65)) + [100 + k] * 8, "output": 4}) + "\n")
PY
for h in "" --hold-shared-prefix; do
  "$KVC" "${BASE[@]}" --workload "$TMP/shared4.jsonl" --profile "$TMP/p10.json" $h --json >"$TMP/shared4$h.json" || fail "shared4 $h: exit $?"
done
grep -q '"hit_tokens": 0,' "$TMP/shared4.json" || fail "shared4: the scheduler alone should hit nothing"
grep -q '"hit_tokens": 192,' "$TMP/shared4--hold-shared-prefix.json" || fail "--hold-shared-prefix: the three later requests should hit 192 tokens"

if [ "$fails" -ne 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "sim CLI: all checks passed"
