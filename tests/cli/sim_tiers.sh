#!/usr/bin/env bash
# CLI tests for `kvcache sim --tier`: a host tier against none on a multi-turn workload whose
# history is several times the pool, a tier too far away, the break-even table alone, the
# report's tiers section, and every bad tier flag (exit 1, one line on stderr, nothing on stdout).
# usage: sim_tiers.sh <kvcache-binary> <source-dir> <test-data-dir>
set -u
KVC=$1
SRC=$2
DATA=$3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

expect_error() { # NAME REGEX -- ARGS...
  local name=$1 regex=$2; shift 3
  "$KVC" "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  [ "$rc" -eq 1 ] || fail "$name: exit $rc, want 1"
  [ "$(wc -l <"$TMP/err")" -eq 1 ] || fail "$name: stderr is not one line: $(cat "$TMP/err")"
  grep -Eq -e "$regex" "$TMP/err" || fail "$name: stderr '$(cat "$TMP/err")' does not match '$regex'"
  [ ! -s "$TMP/out" ] || fail "$name: printed to stdout on bad input"
}

# a JSON number by key (the first one)
num() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"; }

BASE=(sim --model "$DATA/configs/llama-3.1-8b.json" --gpu h100-sxm --quiet --closed-loop --num-blocks 3000)
W='poisson:rate=2,n=300,prompt=1500..2000,output=50..100,turns=4..8,think=5..20,user=100..300'

"$KVC" sim --help | grep -q -- "--tier SPEC" || fail "sim --help lacks --tier"
"$KVC" "${BASE[@]}" --workload "$W" --json >"$TMP/none.json" || fail "no tier: exit $?"
"$KVC" "${BASE[@]}" --workload "$W" --json --tier host:64GiB >"$TMP/host.json" || fail "host: exit $?"
"$KVC" "${BASE[@]}" --workload "$W" --json --tier 'host:64GiB,rtt=1000s' >"$TMP/far.json" || fail "far: exit $?"
grep -q '"tiers"' "$TMP/none.json" && fail "a run without tiers has a tiers section"
for key in kind mode capacity_bytes bandwidth_Bps rtt_s hits fetched_blocks fetched_tokens \
           recompute_chosen_blocks bytes_read bytes_written evictions tier_saved_tokens break_even \
           break_even_rtt_s; do
  grep -q "\"$key\"" "$TMP/host.json" || fail "JSON lacks \"$key\""
done
# with the host tier the prompt tokens computed drop and TTFT p50 improves
c_none=$(num "$TMP/none.json" 'd["prompt_tokens"]-d["hit_tokens"]')
c_host=$(num "$TMP/host.json" 'd["prompt_tokens"]-d["hit_tokens"]')
t_none=$(num "$TMP/none.json" 'd["ttft_ms"]["p50"]')
t_host=$(num "$TMP/host.json" 'd["ttft_ms"]["p50"]')
echo "computed prompt tokens: $c_none without a tier, $c_host with host:64GiB; TTFT p50 $t_none ms, $t_host ms"
[ "$c_host" -lt "$c_none" ] || fail "host tier: $c_host computed, no tier $c_none"
python3 -c "import sys; sys.exit(0 if $t_host < $t_none else 1)" || fail "host tier: TTFT p50 $t_host >= $t_none"
[ "$(num "$TMP/host.json" 'd["tiers"][0]["fetched_blocks"] > 0')" = True ] || fail "host tier fetched nothing"
# a tier 1000 s away: found, never fetched, the run unchanged up to the tiers section
[ "$(num "$TMP/far.json" 'd["tiers"][0]["fetched_blocks"]')" = 0 ] || fail "far tier fetched"
[ "$(num "$TMP/far.json" 'd["tiers"][0]["hits"] > 0')" = True ] || fail "far tier found nothing"
sed -n '/"tiers": \[/q;p' "$TMP/far.json" >"$TMP/far.head"
sed -n '/"config": {/q;p' "$TMP/none.json" >"$TMP/none.head"
cmp -s "$TMP/far.head" "$TMP/none.head" || fail "a tier never fetched from changed the run"
# the text report
"$KVC" "${BASE[@]}" --workload "$W" --tier host:64GiB --tier redis://kv:6379,rtt=80ms >"$TMP/text" || fail "text: exit $?"
grep -q "^tiers (prompt tokens fetched instead of recomputed: " "$TMP/text" || fail "text lacks the tiers section"
grep -q "^break-even round trip" "$TMP/text" || fail "text lacks the break-even table"
# the table alone: 4K tokens of Llama-3.1-8B are 512 MiB; at 10 GbE that is 429 ms, more than
# the H100 takes to recompute them: never; at 100 GB/s about 5 ms
"$KVC" sim --model "$DATA/configs/llama-3.1-8b.json" --gpu h100-sxm --break-even \
  --tier redis://r:1,bw=10Gbit/s --tier redis://r:1,bw=100GB/s >"$TMP/be" || fail "--break-even: exit $?"
grep -Eq "^  redis +1\.25 GB/s +never +never +never +never$" "$TMP/be" || fail "--break-even: 10 GbE is not never: $(cat "$TMP/be")"
"$KVC" sim --model "$DATA/configs/llama-3.1-8b.json" --gpu h100-sxm --break-even --json \
  --tier redis://r:1,bw=100GB/s >"$TMP/be.json" || fail "--break-even --json: exit $?"
python3 - "$TMP/be.json" <<'PY' || fail "--break-even --json: the 4K row is not recompute - bytes / bw"
import json, sys
d = json.load(open(sys.argv[1]))
row = [r for r in d["tiers"][0]["rows"] if r["tokens"] == 4096][0]
assert row["bytes"] == 4096 * 131072, row
assert abs(row["transfer_s"] - row["bytes"] / 100e9) < 1e-8, row
assert abs(row["break_even_rtt_s"] - (row["recompute_s"] - row["transfer_s"])) < 1e-8, row
assert row["fetch_wins"] is True, row
PY

# requests that queue: turns arrive back to back with 4 running slots, so a prefix in the
# pool at a turn's arrival is evicted while it waits.  The lookup happens at admission (as the
# engine's): the evicted blocks are fetched from the tier, not recomputed.  (With the lookup at
# arrival, this run fetched nothing: every prefix was still in the pool when it looked.)
"$KVC" sim --model "$DATA/configs/llama-3.1-8b.json" --gpu h100-sxm --quiet --json --closed-loop \
  --num-blocks 1000 --max-num-seqs 4 --tier host:64GiB \
  --workload 'poisson:rate=50,n=40,prompt=1500..2000,output=50..100,turns=4..6,think=0..0,user=100..300' \
  >"$TMP/queued.json" || fail "queued run: exit $?"
python3 - "$TMP/queued.json" <<'PY' || fail "queued requests: the tier fetched nothing for prefixes evicted while they waited"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["tier_saved_tokens"] > 5000 and d["prefix_hit_rate"] > 0.3, (d["tier_saved_tokens"], d["prefix_hit_rate"])
PY

# the scenario: one command, the tiers side by side
"$KVC" sim --scenario "$SRC/examples/scenarios/tiers.json" --json >"$TMP/sc.json" 2>/dev/null || fail "tiers scenario: exit $?"
python3 - "$TMP/sc.json" <<'PY' || fail "tiers scenario: the host tier does not beat no tier, or the 10 GbE Redis is not (nearly) the no-tier run"
import json, sys
d = json.load(open(sys.argv[1]))
rows = {v["name"]: v["metrics"] for v in d["variants"]}
none, host, lan = rows["no tier"], rows["host 64GiB"], rows["redis 10GbE LAN"]
assert host["ttft_ms.p50"] < none["ttft_ms.p50"] and host["tier_saved_tokens"] > 0, (none, host)
# the 10 GbE Redis finds blocks but never fetches (recompute wins for this model): nothing
# saved, and the run is the no-tier one but for the admission rule tiers bring (a request is
# handed to the scheduler only when it can run now, as the engine does: a few TTFTs move)
assert lan["tier_saved_tokens"] == 0, lan
assert abs(lan["prefix_hit_rate"] - none["prefix_hit_rate"]) < 0.005, (lan, none)
assert abs(lan["ttft_ms.p50"] - none["ttft_ms.p50"]) < 0.01 * none["ttft_ms.p50"], (lan, none)
PY

# bad flags
expect_error "bad tier" "--tier: tier 'nvme:1GiB'" -- "${BASE[@]}" --workload "$W" --tier nvme:1GiB
expect_error "bad bw" "bad bandwidth" -- "${BASE[@]}" --workload "$W" --tier host:1GiB,bw=fast
expect_error "bad rtt" "bad round-trip time" -- "${BASE[@]}" --workload "$W" --tier host:1GiB,rtt=5
expect_error "bad option" "unknown option 'lat=5us'" -- "${BASE[@]}" --workload "$W" --tier host:1GiB,lat=5us
expect_error "bad admission" "--tier-admission: 'never'" -- "${BASE[@]}" --workload "$W" --tier host:1GiB --tier-admission never
expect_error "bad budget" "--tier-disk-write-budget: '5GiB'" -- "${BASE[@]}" --workload "$W" --tier-disk-write-budget 5GiB
expect_error "too many" "at most 8 tiers" -- "${BASE[@]}" --workload "$W" $(for i in 1 2 3 4 5 6 7 8 9; do echo --tier host:1GiB; done)
expect_error "tiny tier" "not one block fits" -- "${BASE[@]}" --workload "$W" --tier host:1MiB
expect_error "no prefix cache" "tiers need the prefix cache" -- "${BASE[@]}" --workload "$W" --tier host:1GiB --no-prefix-caching
expect_error "break-even without tiers" "--break-even: give the tiers" -- sim --model llama-3.1-8b --gpu h100-sxm --break-even

if [ "$fails" -ne 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "sim tiers CLI: all checks passed"
