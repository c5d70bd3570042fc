#!/usr/bin/env bash
# CLI tests for `kvcache serve` on tests/data/models/stories260K.gguf: a server on 127.0.0.1
# (a free port) started and stopped here, driven with curl and with the official `openai` npm
# client (tests/server/client.mjs, installed in this test's scratch folder; skipped with a
# message when npm cannot install it).  Outputs through the server equal `kvcache run --json`'s
# for the same requests, one at a time and eight at once; a two-turn chat reports the first
# turn as cached_tokens; tenants with their own salts do not share prefixes; bad input gets
# its 4xx and the server goes on; SIGTERM drains a request in flight and exits 0; bad options
# are one line on stderr.  Every wait is bounded.
# usage: serve.sh <kvcache-binary> <source-dir> <test-data-dir>
set -u
KVC=$1
SRC=$2
DATA=$3
TMP=$(mktemp -d)
PID=
cleanup() {
  [ -n "$PID" ] && kill -KILL "$PID" 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
S=$DATA/models/stories260K.gguf
J() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

# start ARGS...: a server on a free port; sets PID and URL
start() {
  "$KVC" serve --model "$S" --port 0 --threads 1 --ctx 512 "$@" 2>"$TMP/log" &
  PID=$!
  local port=
  for _ in $(seq 1 100); do
    port=$(sed -n 's|.*on http://127.0.0.1:\([0-9]*\).*|\1|p' "$TMP/log" | head -1)
    [ -n "$port" ] && break
    sleep 0.1
  done
  [ -n "$port" ] || { fail "the server did not start: $(head -c 500 "$TMP/log")"; return 1; }
  URL=http://127.0.0.1:$port
  for _ in $(seq 1 100); do
    curl -sf "$URL/health" >/dev/null && return 0
    sleep 0.1
  done
  fail "no /health"
  return 1
}
# stop: SIGTERM, a clean exit 0 within 20 s
stop() {
  kill -TERM "$PID"
  local rc=
  for _ in $(seq 1 200); do
    if ! kill -0 "$PID" 2>/dev/null; then
      wait "$PID"
      rc=$?
      break
    fi
    sleep 0.1
  done
  [ -n "$rc" ] || { fail "the server did not exit after SIGTERM"; kill -KILL "$PID"; }
  [ "${rc:-1}" -eq 0 ] || fail "the server exited $rc: $(tail -c 500 "$TMP/log")"
  grep -Eq 'Sanitizer|runtime error:' "$TMP/log" && fail "sanitizer: $(grep -m3 -E 'Sanitizer|runtime error' "$TMP/log")"
  PID=
}
post() { curl -s -m 60 "$URL$1" -H 'Content-Type: application/json' "${@:3}" -d "$2"; }
status() { curl -s -m 60 -o /dev/null -w '%{http_code}' "$URL$1" -H 'Content-Type: application/json' "${@:3}" -d "$2"; }

cat >"$TMP/keys.json" <<'EOF'
{"sk-alice": {"tenant": "alice"}, "sk-bob": {"tenant": "bob"},
 "sk-team1": {"tenant": "team", "cache": "shared"}, "sk-team2": {"tenant": "team", "cache": "shared"}}
EOF

# ---- outputs equal kvcache run's ---------------------------------------------------------
start --chat-template llama3 || exit 1
PROMPTS=("Once upon a time" "Lily and Ben went to the park" "The little dog" "One day, a bird")
for i in 0 1 2 3; do
  "$KVC" run --model "$S" --ctx 512 --prompt "${PROMPTS[$i]}" -n 40 --temp 0.8 --seed $((7 + i)) --json \
    | head -1 | J 'd["text"]' >"$TMP/run.$i" || fail "kvcache run $i"
done
for i in 0 1 2 3; do
  post /v1/completions "{\"model\": \"stories260K\", \"prompt\": \"${PROMPTS[$i]}\", \"max_tokens\": 40, \"temperature\": 0.8, \"seed\": $((7 + i))}" \
    | J 'd["choices"][0]["text"]' >"$TMP/srv.$i"
  cmp -s "$TMP/run.$i" "$TMP/srv.$i" || fail "request $i: server '$(cat "$TMP/srv.$i")' != run '$(cat "$TMP/run.$i")'"
done
# eight at once (two of each): the same outputs (batch invariance)
for k in 0 1; do
  for i in 0 1 2 3; do
    post /v1/completions "{\"model\": \"stories260K\", \"prompt\": \"${PROMPTS[$i]}\", \"max_tokens\": 40, \"temperature\": 0.8, \"seed\": $((7 + i))}" \
      >"$TMP/conc.$k.$i" &
  done
done
wait_jobs() { for j in $(jobs -p); do [ "$j" = "$PID" ] || wait "$j"; done; }
wait_jobs
for k in 0 1; do
  for i in 0 1 2 3; do
    J 'd["choices"][0]["text"]' <"$TMP/conc.$k.$i" >"$TMP/c" 2>/dev/null
    cmp -s "$TMP/run.$i" "$TMP/c" || fail "concurrent request $k.$i differs: $(head -c 300 "$TMP/conc.$k.$i")"
  done
done
# streamed: the deltas concatenate to the same text, then [DONE]
post /v1/completions "{\"model\": \"stories260K\", \"prompt\": \"${PROMPTS[0]}\", \"max_tokens\": 40, \"temperature\": 0.8, \"seed\": 7, \"stream\": true}" -N >"$TMP/sse"
tail -c 14 "$TMP/sse" | grep -q 'data: \[DONE\]' || fail "the stream does not end with data: [DONE]"
grep '^data: {' "$TMP/sse" | sed 's/^data: //' | python3 -c "
import json,sys
print(''.join(json.loads(l)['choices'][0]['text'] for l in sys.stdin if json.loads(l)['choices']))" >"$TMP/s"
cmp -s "$TMP/run.0" "$TMP/s" || fail "stream '$(cat "$TMP/s")' != run '$(cat "$TMP/run.0")'"
curl -s -D "$TMP/h" -o /dev/null "$URL/v1/completions" -d '{"model": "stories260K", "prompt": "Hi", "max_tokens": 4}'
grep -qi '^x-kvcache-timings: queue=.*prefill=.*total=' "$TMP/h" || fail "no x-kvcache-timings header: $(cat "$TMP/h")"

# ---- a two-turn chat: turn two hits turn one ---------------------------------------------
SYS='{"role": "system", "content": "You are a storyteller who tells stories about Lily."}'
U1='{"role": "user", "content": "Tell me a story about a cat and a dog."}'
post /v1/chat/completions "{\"model\": \"stories260K\", \"messages\": [$SYS, $U1], \"max_tokens\": 24, \"temperature\": 0}" >"$TMP/t1"
P1=$(J 'd["usage"]["prompt_tokens"] + d["usage"]["completion_tokens"]' <"$TMP/t1")
REPLY=$(J 'json.dumps(d["choices"][0]["message"]["content"])' <"$TMP/t1")
post /v1/chat/completions "{\"model\": \"stories260K\", \"messages\": [$SYS, $U1, {\"role\": \"assistant\", \"content\": $REPLY}, {\"role\": \"user\", \"content\": \"And then?\"}], \"max_tokens\": 8, \"temperature\": 0}" >"$TMP/t2"
C2=$(J 'd["usage"]["prompt_tokens_details"]["cached_tokens"]' <"$TMP/t2")
[ "${C2:-0}" -ge $((P1 / 16 * 16)) ] || fail "turn two cached $C2 tokens; turn one's prompt and reply hold $P1"
stop

# ---- tenants, limits and bad input ---------------------------------------------------------
start --api-keys "$TMP/keys.json" --max-body 2048 --chat-template llama3 || exit 1
BODY='{"model": "stories260K", "prompt": "Once upon a time, there was a little girl named Lily. She loved to play outside.", "max_tokens": 2}'
[ "$(status /v1/completions "$BODY")" = 401 ] || fail "no key: not 401"
[ "$(status /v1/completions "$BODY" -H 'Authorization: Bearer wrong')" = 401 ] || fail "a wrong key: not 401"
c() { post /v1/completions "$BODY" -H "Authorization: Bearer $1" | J 'd["usage"]["prompt_tokens_details"]["cached_tokens"]'; }
[ "$(c sk-alice)" = 0 ] || fail "alice's first request hit"
[ "$(c sk-alice)" -ge 16 ] || fail "alice's second request missed"
[ "$(c sk-bob)" = 0 ] || fail "bob hit alice's prefix (salts must isolate them)"
[ "$(c sk-team1)" = 0 ] || fail "team's first request hit"
[ "$(c sk-team2)" -ge 16 ] || fail "a shared tenant's keys do not share"
for bad in '{' '[]' '{"model": "stories260K"}' '{"model": "stories260K", "prompt": "x", "max_tokens": -1}' \
  '{"model": "stories260K", "prompt": "x", "n": 100000}' '{"model": "stories260K", "prompt": "x", "max_tokens": 100000}' \
  '{"model": "stories260K", "prompt": "x", "temperature": "warm"}' '{"model": "stories260K", "prompt": [1, 1e9]}'; do
  s=$(status /v1/completions "$bad" -H 'Authorization: Bearer sk-alice')
  [ "$s" = 400 ] || fail "'$bad': $s, not 400"
done
[ "$(status /v1/completions '{"model": "gpt-9", "prompt": "x"}' -H 'Authorization: Bearer sk-alice')" = 404 ] || fail "unknown model: not 404"
printf '{"model": "stories260K", "prompt": "\xff\xfe"}' >"$TMP/badutf8"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/v1/completions" -H 'Authorization: Bearer sk-alice' --data-binary @"$TMP/badutf8")" = 400 ] || fail "invalid UTF-8: not 400"
head -c 100000 /dev/zero | tr '\0' 'a' | sed 's/^/{"model": "stories260K", "prompt": "/; s/$/"}/' >"$TMP/huge"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/v1/completions" -H 'Authorization: Bearer sk-alice' --data-binary @"$TMP/huge")" = 413 ] || fail "a huge body: not 413"
post /v1/completions '{' -H 'Authorization: Bearer sk-alice' | J 'd["error"]["type"], d["error"]["param"], d["error"]["code"]' >/dev/null ||
  fail "an error is not in OpenAI's shape"
[ "$(status /v1/completions "$BODY" -H 'Authorization: Bearer sk-bob')" = 200 ] || fail "the server stopped serving after bad input"
curl -s "$URL/metrics" >"$TMP/metrics"
for m in kvcache_kv_blocks_total kvcache_kv_blocks_used kvcache_kv_blocks_cached kvcache_prefix_hit_tokens_total \
  kvcache_prompt_tokens_total kvcache_generation_tokens_total kvcache_preemptions_total kvcache_requests_running \
  kvcache_requests_waiting kvcache_time_to_first_token_seconds kvcache_time_per_output_token_seconds \
  kvcache_e2e_request_latency_seconds kvcache_hop_seconds; do
  grep -q "^# TYPE $m " "$TMP/metrics" || fail "/metrics has no $m"
done
grep -q '^kvcache_tenant_requests_total{tenant="alice"} 2$' "$TMP/metrics" || fail "no per-tenant counter for alice"
grep -q '^kvcache_hop_seconds_count{hop="prefill"} ' "$TMP/metrics" || fail "no prefill hop histogram"

# ---- the official openai client --------------------------------------------------------------
if command -v node >/dev/null && command -v npm >/dev/null; then
  mkdir -p "$TMP/npm"
  if (cd "$TMP/npm" && npm init -y >/dev/null 2>&1 && timeout 120 npm install --no-audit --no-fund openai >"$TMP/npm.log" 2>&1); then
    cp "$SRC/tests/server/client.mjs" "$TMP/npm/"
    (cd "$TMP/npm" && timeout 120 node client.mjs "$URL/v1" >"$TMP/node.out" 2>&1) ||
      fail "the openai client checks: $(tail -c 1500 "$TMP/node.out")"
    grep -q '^openai client: all checks passed' "$TMP/node.out" || fail "the openai client did not finish: $(tail -c 800 "$TMP/node.out")"
  else
    echo "SKIP: npm could not install the openai package (offline?): $(tail -c 300 "$TMP/npm.log")"
  fi
else
  echo "SKIP: no node/npm: the openai client checks did not run"
fi

# ---- SIGTERM drains what is in flight --------------------------------------------------------
post /v1/completions '{"model": "stories260K", "prompt": [1], "max_tokens": 400, "ignore_eos": true}' \
  -H 'Authorization: Bearer sk-bob' >"$TMP/inflight" &
CURL=$!
sleep 0.2
stop
wait "$CURL"
[ "$(J 'd["usage"]["completion_tokens"]' <"$TMP/inflight" 2>/dev/null)" = 400 ] ||
  fail "the request in flight at SIGTERM was not finished: $(head -c 300 "$TMP/inflight")"
grep -q 'drained, exiting' "$TMP/log" || fail "no drain line: $(tail -c 300 "$TMP/log")"

# ---- bad options: one line on stderr, exit 1 -------------------------------------------------
bad_opt() {
  "$KVC" serve "$@" >/dev/null 2>"$TMP/err"
  local rc=$?
  [ "$rc" -eq 1 ] || fail "serve $*: exit $rc, not 1"
  [ "$(wc -l <"$TMP/err")" -eq 1 ] && grep -q '^kvcache serve: ' "$TMP/err" || fail "serve $*: $(cat "$TMP/err")"
}
bad_opt
bad_opt --model "$S" --port 70000
bad_opt --model "$S" --log-format xml
bad_opt --model "$S" --chat-template nope
bad_opt --model "$S" --api-keys "$TMP/nonexistent.json"
echo '{"k": {"tenant": 5}}' >"$TMP/badkeys.json"
bad_opt --model "$S" --api-keys "$TMP/badkeys.json" --port 0
bad_opt --model "$S" --threads 0
bad_opt --model "$S" --block-size 3
bad_opt --model "$S" --host 256.1.1.1 --port 0
bad_opt --model "$DATA/nonexistent.gguf"
"$KVC" serve --help | grep -q -- '--api-keys FILE' || fail "serve --help"

[ "$fails" -eq 0 ] && echo "all serve CLI checks passed"
[ "$fails" -eq 0 ]
