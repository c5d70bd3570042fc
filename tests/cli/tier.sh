#!/usr/bin/env bash
# CLI tests for `kvcache run --tier ...` on tests/data/models/stories260K.gguf: prompts that come
# back after the pool (a few blocks over one context) evicted them are fetched from a host tier,
# and from a disk tier, with output ids identical to the run with no tier; the per-tier summary
# line and the "tiers" array of --json; and every bad tier flag: exit 1 and one line on stderr
# starting "kvcache run:", never a crash.
# usage: tier.sh <kvcache-binary> <source-dir> <test-data-dir>
set -u
KVC=$1
DATA=$3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
S=$DATA/models/stories260K.gguf

crashed() {
  if [ "$2" -ge 128 ] || grep -Eq 'Sanitizer|runtime error:|LeakSanitizer' "$TMP/err"; then
    fail "$1: crashed (exit $2): $(head -c 2000 "$TMP/err")"
    return 0
  fi
  return 1
}
run_ok() {
  local name=$1; shift
  "$KVC" run "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  crashed "$name" "$rc" && return 1
  [ "$rc" -eq 0 ] || { fail "$name: exit $rc: $(head -c 600 "$TMP/err")"; return 1; }
  return 0
}
expect_error() {
  local name=$1 regex=$2; shift 3
  "$KVC" run "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  crashed "$name" "$rc" && return
  [ "$rc" -eq 1 ] || fail "$name: exit $rc, want 1"
  [ "$(wc -l <"$TMP/err")" -eq 1 ] || fail "$name: stderr is not one line: $(head -c 600 "$TMP/err" | cat -v)"
  grep -q '^kvcache run: ' "$TMP/err" || fail "$name: stderr does not start with 'kvcache run: ': $(cat -v "$TMP/err")"
  grep -Eq -e "$regex" "$TMP/err" || fail "$name: stderr '$(cat -v "$TMP/err")' does not match '$regex'"
}

# Three 100-token prompts, then the same three again: one runs at a time (--max-seqs 1) on a
# pool of 12 blocks (a context is 7), so each one's blocks are evicted before it comes back.
python3 - "$TMP/prompts.txt" <<'PY'
import json, random, sys
random.seed(7)
ps = [[1] + [random.randrange(3, 512) for _ in range(99)] for _ in range(3)]
with open(sys.argv[1], "w") as f:
    for p in ps + ps:
        f.write(json.dumps({"prompt_ids": p, "max_tokens": 8}) + "\n")
PY
COMMON=(--model "$S" --prompts "$TMP/prompts.txt" --kv-memory 120KiB --max-seqs 1 --threads 1 --json)
ids() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    o = json.loads(l)
    if not o.get("summary"): print(o["id"], o["output_ids"])' "$1"; }
summary() { python3 -c '
import json, sys
for l in open(sys.argv[1]):
    o = json.loads(l)
    if o.get("summary"):
        t = o.get("tiers", [])
        print(o["prefill_tokens"], " ".join("%s:%s:%d:%d" % (x["kind"], x["mode"], x["fetched_blocks"], x["offloaded_blocks"]) for x in t))' "$1"; }

run_ok "no tier" "${COMMON[@]}" && ids "$TMP/out" >"$TMP/ref.ids" && summary "$TMP/out" >"$TMP/ref.sum"
REF_PREFILL=$(cut -d' ' -f1 "$TMP/ref.sum")
for tier in "host:64MiB" "disk:$TMP/tier.bin:4MiB"; do
  if run_ok "--tier $tier" "${COMMON[@]}" --tier "$tier" --tier-fetch always; then
    ids "$TMP/out" >"$TMP/got.ids"
    cmp -s "$TMP/ref.ids" "$TMP/got.ids" || fail "--tier $tier: output ids differ from the run with no tier"
    read -r prefill t <<<"$(summary "$TMP/out")"
    kind=${tier%%:*}
    case "$t" in
      "$kind:evict:"*) ;;
      *) fail "--tier $tier: summary tiers '$t'" ;;
    esac
    fetched=$(echo "$t" | cut -d: -f3)
    [ "$fetched" -gt 0 ] || fail "--tier $tier: nothing fetched ($t)"
    [ "$prefill" -lt "$REF_PREFILL" ] || fail "--tier $tier: prefill $prefill, not below $REF_PREFILL"
  fi
done
# the text summary: one line per tier
if run_ok "--tier host text" --model "$S" --prompts "$TMP/prompts.txt" --kv-memory 120KiB --max-seqs 1 --tier host:64MiB --tier "disk:$TMP/tier2.bin:4MiB,mode=write-through"; then
  grep -Eq '^kvcache run: tier 0 host \(evict\): [0-9]+ hits, [0-9]+ misses, [1-9][0-9]* blocks fetched, [0-9]+ recomputes chosen, [0-9]+ fetches failed, [0-9]+ offloaded' "$TMP/err" || fail "--tier host: no summary line: $(cat "$TMP/err")"
  grep -Eq '^kvcache run: tier 1 disk \(write-through\): .* [1-9][0-9]* written through' "$TMP/err" || fail "--tier disk write-through: no summary line: $(cat "$TMP/err")"
fi
# ,bw= and ,rtt= seed the fetch decision's estimate until fetches are measured
if run_ok "--tier bw/rtt seed" --model "$S" --prompt-ids "1 2 3" -n 4 --json --tier "host:1MiB,bw=3GB/s,rtt=7us"; then
  python3 - "$TMP/out" <<'PY' || fail "--tier host:1MiB,bw=3GB/s,rtt=7us: the estimate is not the spec's"
import json, sys
t = [json.loads(l) for l in open(sys.argv[1]) if json.loads(l).get("summary")][0]["tiers"][0]
assert abs(t["latency_s"] - 7e-6) < 1e-12 and abs(t["bandwidth_Bps"] - 3e9) < 1, t
PY
fi
run_ok "--tier with admission and budget" --model "$S" --prompt-ids "1 2 3" -n 4 --tier "disk:$TMP/tier3.bin:1MiB" --tier-admission second-hit --tier-disk-write-budget 1GiB/day

expect_error "--tier bogus" "--tier: 'bogus'" -- --model "$S" --prompt x --tier bogus
expect_error "--tier host:0" "--tier: 'host:0'" -- --model "$S" --prompt x --tier host:0
expect_error "--tier bad mode" "--tier: 'host:1MiB,mode=sometimes'" -- --model "$S" --prompt x --tier host:1MiB,mode=sometimes
expect_error "five tiers" "--tier: at most 4 tiers" -- --model "$S" --prompt x --tier host:1MiB --tier host:1MiB --tier host:1MiB --tier host:1MiB --tier host:1MiB
expect_error "--tier-admission" "--tier-admission: 'often' is not always, second-hit or depth:N" -- --model "$S" --prompt x --tier-admission often
expect_error "--tier-disk-write-budget" "--tier-disk-write-budget: '5GiB' is not SIZE/day" -- --model "$S" --prompt x --tier-disk-write-budget 5GiB
expect_error "--tier-fetch" "--tier-fetch: 'maybe' is not decide, always or never" -- --model "$S" --prompt x --tier-fetch maybe
expect_error "--tier too small" "--tier host: 100 bytes hold no block" -- --model "$S" --prompt x --tier host:100
expect_error "--tier without the prefix cache" "--tier needs the prefix cache" -- --model "$S" --prompt x --tier host:1MiB --no-prefix-cache
mkdir "$TMP/dir"
expect_error "--tier disk on a directory" "--tier disk:$TMP/dir" -- --model "$S" --prompt x --tier "disk:$TMP/dir:1MiB"

if [ "$fails" -ne 0 ]; then
  echo "$fails check(s) failed"
  exit 1
fi
echo "all tier CLI checks passed"
