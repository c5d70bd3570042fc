#!/usr/bin/env bash
# CLI tests for `kvcache serve` with KV tiers (docs/tiers.md), on tests/data/models/stories260K.gguf:
#   - two replicas sharing one redis-server (started here on a free port, stopped at the end):
#     a prompt computed on replica A is written through to Redis and served from it on replica
#     B (cached_tokens > 0 there, cached_tokens_by_tier says redis), with output ids identical
#     to A's, which recomputed everything (batch invariance makes the comparison exact);
#   - /metrics on both carries kvcache_tier_*{tier="redis"} with the writes and the hits;
#   - redis-server killed mid-run: B answers every request, right, and counts the faults;
#   - a replica with a host tier and a pool too small for its turns: a later turn fetches
#     (cached_tokens_by_tier.host > 0) with the output of a server that has no tier;
#   - bad --tier values are one line on stderr, exit 1.
# Skipped (77) where redis-server is not installed (scripts/install-deps.sh installs it).
# usage: serve_tier.sh <kvcache-binary> <source-dir> <test-data-dir>
set -u
KVC=$1
DATA=$3
TMP=$(mktemp -d)
PIDS=()
RPID=
cleanup() {
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  [ -n "$RPID" ] && kill -KILL "$RPID" 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
S=$DATA/models/stories260K.gguf
J() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }

# ---- bad flags (no redis needed) -------------------------------------------------------------
for bad in "nvme:1GiB" "host:" "host:0" "disk::1GiB" "redis://:6379" "redis://127.0.0.1:0" \
  "host:1GiB,mode=sometimes"; do
  "$KVC" serve --model "$S" --port 0 --tier "$bad" >"$TMP/o" 2>"$TMP/e"
  rc=$?
  [ $rc -eq 1 ] || fail "--tier $bad: exit $rc, want 1"
  [ "$(wc -l <"$TMP/e")" -eq 1 ] || fail "--tier $bad: not one line: $(cat "$TMP/e")"
done
"$KVC" serve --model "$S" --port 0 --tier host:1MiB --tier-admission often >/dev/null 2>"$TMP/e"
[ $? -eq 1 ] && [ "$(wc -l <"$TMP/e")" -eq 1 ] || fail "--tier-admission often: $(cat "$TMP/e")"
"$KVC" serve --model "$S" --port 0 --tier host:1MiB --tier-disk-write-budget 5GiB >/dev/null 2>"$TMP/e"
[ $? -eq 1 ] && [ "$(wc -l <"$TMP/e")" -eq 1 ] || fail "--tier-disk-write-budget 5GiB: $(cat "$TMP/e")"

if ! command -v redis-server >/dev/null 2>&1; then
  [ $fails -eq 0 ] || exit 1
  echo "SKIP: redis-server is not installed (scripts/install-deps.sh installs it)"
  exit 77
fi

# ---- redis -----------------------------------------------------------------------------------
RPORT=$(free_port)
redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize no \
  >"$TMP/redis.log" 2>&1 &
RPID=$!
for _ in $(seq 1 100); do
  redis-cli -p "$RPORT" ping 2>/dev/null | grep -q PONG && break
  sleep 0.1
done
redis-cli -p "$RPORT" ping 2>/dev/null | grep -q PONG || { echo "FAIL: redis-server did not start"; exit 1; }

# start NAME ARGS...: a server on a free port; sets URL_<NAME>, PID_<NAME>
start() {
  local name=$1
  shift
  "$KVC" serve --model "$S" --port 0 --threads 1 --ctx 512 "$@" 2>"$TMP/log.$name" &
  local pid=$!
  PIDS+=("$pid")
  eval "PID_$name=$pid"
  local port=
  for _ in $(seq 1 100); do
    port=$(sed -n 's|.*on http://127.0.0.1:\([0-9]*\).*|\1|p' "$TMP/log.$name" | head -1)
    [ -n "$port" ] && break
    sleep 0.1
  done
  [ -n "$port" ] || { fail "server $name did not start: $(head -c 500 "$TMP/log.$name")"; return 1; }
  eval "URL_$name=http://127.0.0.1:$port"
  for _ in $(seq 1 100); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && return 0
    sleep 0.1
  done
  fail "server $name: no /health"
  return 1
}
stop() {
  local name=$1 pid
  eval "pid=\$PID_$name"
  kill -TERM "$pid"
  local rc=
  for _ in $(seq 1 200); do
    if ! kill -0 "$pid" 2>/dev/null; then
      wait "$pid"
      rc=$?
      break
    fi
    sleep 0.1
  done
  [ -n "$rc" ] || { fail "server $name did not exit after SIGTERM"; kill -KILL "$pid"; }
  [ "${rc:-1}" -eq 0 ] || fail "server $name exited $rc: $(tail -c 500 "$TMP/log.$name")"
  grep -Eq 'Sanitizer|runtime error:' "$TMP/log.$name" &&
    fail "server $name: sanitizer: $(grep -m3 -E 'Sanitizer|runtime error' "$TMP/log.$name")"
}
post() { curl -s -m 120 "$1/v1/completions" -H 'Content-Type: application/json' -d "$2"; }
metric() { curl -s -m 30 "$1/metrics" | awk -v k="$2" '$1 == k { print $2 }'; }
body() { # PROMPT MAX_TOKENS: a greedy completion returning its ids
  printf '{"model": "stories260K", "prompt": "%s", "max_tokens": %s, "temperature": 0, "return_token_ids": true}' "$1" "$2"
}

# a prompt of several 16-token blocks
P1="Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends. One day, she saw a big red ball"
P2="Tom and his mom went to the store to buy some food. Tom saw a big box of toys and he wanted one. His mom said no, and Tom was sad"
TIER="redis://127.0.0.1:$RPORT/test$$"

# ---- two replicas sharing one Redis ----------------------------------------------------------
start A --tier "$TIER" || exit 1
# B fetches whatever it finds (--tier-fetch always): stories260K recomputes a block in well
# under Redis's round trip, so the cost decision alone would (rightly) recompute; the point
# here is that the bytes another replica wrote are exact.
start B --tier "$TIER" --tier-fetch always || exit 1
post "$URL_A" "$(body "$P1" 24)" >"$TMP/a1"
CA=$(J 'd["usage"]["prompt_tokens_details"]["cached_tokens"]' <"$TMP/a1")
PT=$(J 'd["usage"]["prompt_tokens"]' <"$TMP/a1")
[ "${CA:-x}" = 0 ] || fail "replica A's first request cached $CA tokens: $(head -c 300 "$TMP/a1")"
[ "${PT:-0}" -ge 32 ] || fail "the prompt has $PT tokens; the test needs two blocks or more"
WT=$(metric "$URL_A" 'kvcache_tier_written_through_blocks_total{tier="redis"}')
[ "${WT:-0}" -ge 1 ] || fail "replica A wrote $WT blocks through to redis"
post "$URL_B" "$(body "$P1" 24)" >"$TMP/b1"
CB=$(J 'd["usage"]["prompt_tokens_details"]["cached_tokens"]' <"$TMP/b1")
RB=$(J 'd["usage"]["prompt_tokens_details"]["cached_tokens_by_tier"]["redis"]' <"$TMP/b1")
[ "${CB:-0}" -gt 0 ] || fail "replica B cached $CB tokens of A's prompt: $(head -c 400 "$TMP/b1")"
[ "${RB:-0}" -gt 0 ] && [ "${RB:-0}" -le "${CB:-0}" ] || fail "replica B: $RB of $CB cached tokens from redis"
J 'd["choices"][0]["token_ids"]' <"$TMP/a1" >"$TMP/ids.a"
J 'd["choices"][0]["token_ids"]' <"$TMP/b1" >"$TMP/ids.b"
[ -s "$TMP/ids.a" ] && cmp -s "$TMP/ids.a" "$TMP/ids.b" ||
  fail "replica B's ids (from redis) $(cat "$TMP/ids.b") != replica A's (computed) $(cat "$TMP/ids.a")"
HB=$(metric "$URL_B" 'kvcache_tier_hits_total{tier="redis"}')
FB=$(metric "$URL_B" 'kvcache_tier_fetched_blocks_total{tier="redis"}')
[ "${HB:-0}" -ge 1 ] && [ "${FB:-0}" -ge 1 ] || fail "replica B's redis metrics: hits $HB, fetched blocks $FB"
curl -s "$URL_B/metrics" | grep -q '^kvcache_tier_fetch_seconds_bucket{tier="redis",le="+Inf"}' ||
  fail "no kvcache_tier_fetch_seconds histogram"
# a model that differs shares nothing: keys carry the model id (here the block size differs)
start C --tier "$TIER" --block-size 32 || exit 1
post "$URL_C" "$(body "$P1" 8)" >"$TMP/c1"
CC=$(J 'd["usage"]["prompt_tokens_details"]["cached_tokens"]' <"$TMP/c1")
[ "${CC:-x}" = 0 ] || fail "a replica with another block layout hit $CC tokens of redis records"
stop C

# ---- redis-server killed mid-run -------------------------------------------------------------
post "$URL_A" "$(body "$P2" 40)" >"$TMP/a2" &
QPID=$!
sleep 0.2
kill -KILL "$RPID"
wait "$RPID" 2>/dev/null
RPID=
wait "$QPID"
J 'd["choices"][0]["token_ids"]' <"$TMP/a2" >"$TMP/ids.a2" || fail "A's request during the kill: $(head -c 300 "$TMP/a2")"
post "$URL_B" "$(body "$P2" 40)" >"$TMP/b2"
J 'd["choices"][0]["token_ids"]' <"$TMP/b2" >"$TMP/ids.b2" || fail "B's request with redis down: $(head -c 300 "$TMP/b2")"
cmp -s "$TMP/ids.a2" "$TMP/ids.b2" || fail "with redis down, B's ids $(cat "$TMP/ids.b2") != A's $(cat "$TMP/ids.a2")"
FA=$(metric "$URL_B" 'kvcache_tier_faults_total{tier="redis"}')
[ "${FA:-0}" -ge 1 ] || fail "replica B counted $FA redis faults with redis down"
stop A
stop B

# ---- a host tier under a pool too small for the turns ----------------------------------------
# stories260K's K/V is 640 bytes a token (5 layers x K and V x 4 KV heads x 8 dims x f16), a
# 16-token block 10 KiB: 64 KiB holds 6 blocks, about one prompt with its output.  Two prompts
# alternate, so each one's blocks are evicted before it comes back: with a host tier it comes
# back from there.
start N --ctx 128 --kv-memory 64KiB || exit 1
start H --ctx 128 --kv-memory 64KiB --tier host:16MiB || exit 1
for round in 1 2; do
  for k in 1 2; do
    eval "p=\$P$k"
    post "$URL_N" "$(body "$p" 16)" | J 'd["choices"][0]["token_ids"]' >"$TMP/n.$round.$k"
    post "$URL_H" "$(body "$p" 16)" >"$TMP/h.$round.$k.json"
    J 'd["choices"][0]["token_ids"]' <"$TMP/h.$round.$k.json" >"$TMP/h.$round.$k"
    cmp -s "$TMP/n.$round.$k" "$TMP/h.$round.$k" ||
      fail "round $round prompt $k: host tier ids $(cat "$TMP/h.$round.$k") != no tier $(cat "$TMP/n.$round.$k")"
  done
done
HH=$(J 'd["usage"]["prompt_tokens_details"]["cached_tokens_by_tier"]["host"]' <"$TMP/h.2.1.json")
[ "${HH:-0}" -gt 0 ] || fail "round 2 fetched $HH tokens from the host tier: $(head -c 400 "$TMP/h.2.1.json")"
OF=$(metric "$URL_H" 'kvcache_tier_offloaded_blocks_total{tier="host"}')
[ "${OF:-0}" -ge 1 ] || fail "the host tier was offloaded $OF blocks"
stop N
stop H

[ $fails -eq 0 ] && echo "serve_tier: all passed"
[ $fails -eq 0 ]
