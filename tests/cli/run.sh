#!/usr/bin/env bash
# CLI tests for `kvcache run` on tests/data/models/stories260K.gguf (real weights, real vocab):
# the story greedy decoding prints from BOS; every key, type and number format of --json (checked
# with python3's json module); --prompts with text and JSON lines; prefix reuse across requests;
# the options that must not change a greedy run's ids (--no-kv-cache, --spec ngram, --spec-model
# with the model as its own draft, --threads, a pool too small for the requests); stop strings and -n; and every bad-input path: exit 1 and one
# line on stderr starting with "kvcache run:", never a crash (an exit code of 128 or more, or a
# sanitizer report, fails the test).
# usage: run.sh <kvcache-binary> <source-dir> <test-data-dir>
set -u
KVC=$1
DATA=$3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
S=$DATA/models/stories260K.gguf
STORY="Once upon a time, there was a little girl named Lily."

# crashed NAME RC: the run crashed (a signal, a sanitizer's exit) or a sanitizer reported
crashed() {
  if [ "$2" -ge 128 ] || grep -Eq 'Sanitizer|runtime error:|LeakSanitizer' "$TMP/err"; then
    fail "$1: crashed (exit $2): $(head -c 2000 "$TMP/err")"
    return 0
  fi
  return 1
}
# run_ok NAME ARGS...: `kvcache run ARGS` exits 0 (stdout in $TMP/out, stderr in $TMP/err)
run_ok() {
  local name=$1; shift
  "$KVC" run "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  crashed "$name" "$rc" && return 1
  [ "$rc" -eq 0 ] || { fail "$name: exit $rc: $(head -c 600 "$TMP/err")"; return 1; }
  return 0
}
# no_crash NAME ARGS...: exit 0, or exit 1 with one line on stderr; never a crash
no_crash() {
  local name=$1; shift
  "$KVC" run "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  crashed "$name" "$rc" && return
  [ "$rc" -eq 0 ] || [ "$rc" -eq 1 ] || fail "$name: exit $rc, want 0 or 1"
  [ "$rc" -eq 0 ] || [ "$(wc -l <"$TMP/err")" -eq 1 ] || fail "$name: stderr is not one line: $(head -c 600 "$TMP/err" | cat -v)"
}
# expect_error NAME STDERR_REGEX -- ARGS...: exit 1, one line on stderr starting "kvcache run: "
# and matching the regex, nothing on stdout
expect_error() {
  local name=$1 regex=$2; shift 3
  "$KVC" run "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  crashed "$name" "$rc" && return
  [ "$rc" -eq 1 ] || fail "$name: exit $rc, want 1"
  [ "$(wc -l <"$TMP/err")" -eq 1 ] || fail "$name: stderr is not one line: $(head -c 600 "$TMP/err" | cat -v)"
  grep -q '^kvcache run: ' "$TMP/err" || fail "$name: stderr does not start with 'kvcache run: ': $(cat -v "$TMP/err")"
  grep -Eq -e "$regex" "$TMP/err" || fail "$name: stderr '$(cat -v "$TMP/err")' does not match '$regex'"
  [ ! -s "$TMP/out" ] || fail "$name: printed to stdout on bad input: $(head -c 200 "$TMP/out")"
}

# check.py MODE FILE: every line of a --json run parses; per request exactly the keys the issue
# lists (with draft_tokens, accepted_tokens in mode spec), each of its type, floats with at most 9
# significant digits, logprobs null unless mode is logprobs (or "any": per request, as asked);
# then one summary.  Prints "ID: ids..." per request in id order, then "summary K=V" lines.
cat >"$TMP/check.py" <<'EOF'
import json, re, sys
mode, path = sys.argv[1], sys.argv[2]
errors = []
def err(m):
    errors.append(m)
def num(s):
    m = s.lstrip('-').split('e')[0].split('E')[0].replace('.', '').lstrip('0')
    if len(m) > 9:
        err("%s has more than 9 significant digits" % s)
    return float(s)
REQ = {"id", "prompt_tokens", "cached_tokens", "completion_tokens", "output_ids", "text",
       "finish_reason", "ttft_ms", "tpot_ms", "logprobs"}
if mode == "spec":
    REQ |= {"draft_tokens", "accepted_tokens"}
SUMMARY = {"summary", "prefill_tokens_per_s", "decode_tokens_per_s", "kv_bytes_per_token",
           "peak_kv_blocks", "preemptions"}
def isint(v):
    return isinstance(v, int) and not isinstance(v, bool)
def isnum(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)
lines = open(path, encoding="utf-8").read().split("\n")
if lines and lines[-1] == "":
    lines.pop()
else:
    err("output does not end with a newline")
objs = []
for i, line in enumerate(lines):
    try:
        objs.append(json.loads(line, parse_float=num))
    except ValueError as e:
        err("line %d does not parse (%s): %r" % (i + 1, e, line[:200]))
if not objs or not isinstance(objs[-1], dict) or objs[-1].get("summary") is not True:
    err("the last line is not the summary")
    objs.append({})
reqs, summ = objs[:-1], objs[-1]
out = {}
for o in reqs:
    if not isinstance(o, dict):
        err("a line is not an object")
        continue
    keys = set(o)
    if keys != REQ:
        err("request keys: missing %s, extra %s" % (sorted(REQ - keys), sorted(keys - REQ)))
        continue
    rid = o["id"]
    for k in ("id", "prompt_tokens", "cached_tokens", "completion_tokens"):
        if not isint(o[k]) or o[k] < 0:
            err("request %r: %s is not a count: %r" % (rid, k, o[k]))
    if rid in out:
        err("id %r twice" % rid)
    ids = o["output_ids"]
    if not isinstance(ids, list) or not all(isint(t) and 0 <= t < 512 for t in ids):
        err("request %r: output_ids is not a list of token ids" % rid)
        continue
    if len(ids) != o["completion_tokens"]:
        err("request %r: %d output_ids, completion_tokens %r" % (rid, len(ids), o["completion_tokens"]))
    if not 1 <= o["prompt_tokens"] or not 0 <= o["cached_tokens"] < o["prompt_tokens"]:
        err("request %r: cached_tokens %r of prompt_tokens %r" % (rid, o["cached_tokens"], o["prompt_tokens"]))
    if not isinstance(o["text"], str):
        err("request %r: text is not a string" % rid)
    if o["finish_reason"] not in ("stop", "length"):
        err("request %r: finish_reason %r" % (rid, o["finish_reason"]))
    if not isnum(o["ttft_ms"]) or o["ttft_ms"] < 0:
        err("request %r: ttft_ms %r" % (rid, o["ttft_ms"]))
    t = o["tpot_ms"]
    if not ((isnum(t) and t >= 0) or (t is None and o["completion_tokens"] <= 1)):
        err("request %r: tpot_ms %r for %r tokens" % (rid, t, o["completion_tokens"]))
    lp = o["logprobs"]
    if mode != "logprobs" and mode != "any" and lp is not None:
        err("request %r: logprobs not asked for, but %r" % (rid, str(lp)[:80]))
    if mode == "logprobs" and lp is None:
        err("request %r: logprobs asked for, but null" % rid)
    if lp is not None:
        if not isinstance(lp, list) or len(lp) != len(ids):
            err("request %r: logprobs is not a list of %d" % (rid, len(ids)))
        else:
            for j, e in enumerate(lp):
                if (not isinstance(e, dict) or not {"token", "logprob"} <= set(e) or
                        e["token"] != ids[j] or not isnum(e["logprob"]) or e["logprob"] > 0):
                    err("request %r: logprobs[%d] = %r" % (rid, j, e))
                    break
    if mode == "spec":
        d, a = o["draft_tokens"], o["accepted_tokens"]
        if not isint(d) or not isint(a) or not 0 <= a <= d:
            err("request %r: draft_tokens %r, accepted_tokens %r" % (rid, d, a))
    out[rid] = o
if sorted(out) != list(range(len(reqs))):
    err("ids %r are not 0..%d" % (sorted(out), len(reqs) - 1))
if summ:
    missing = SUMMARY - set(summ)
    if missing:
        err("summary: missing %s" % sorted(missing))
    for k in ("kv_bytes_per_token", "peak_kv_blocks", "preemptions"):
        if not isint(summ.get(k)) or summ.get(k) < 0:
            err("summary: %s is not a count: %r" % (k, summ.get(k)))
    for k in ("prefill_tokens_per_s", "decode_tokens_per_s"):
        v = summ.get(k)
        if not (v is None or (isnum(v) and v > 0)):
            err("summary: %s = %r" % (k, v))
    if mode == "spec":
        for k in ("draft_tokens", "accepted_tokens"):
            if not isint(summ.get(k)):
                err("summary: %s = %r" % (k, summ.get(k)))
if errors:
    for e in errors[:20]:
        print("json: " + e)
    sys.exit(1)
for rid in sorted(out):
    o = out[rid]
    print("%d: %s" % (rid, " ".join(map(str, o["output_ids"]))))
for k in sorted(summ):
    print("summary %s=%s" % (k, json.dumps(summ[k])))
for rid in sorted(out):
    o = out[rid]
    print("req %d cached=%d prompt=%d completion=%d finish=%s logprobs=%s text=%s" % (
        rid, o["cached_tokens"], o["prompt_tokens"], o["completion_tokens"], o["finish_reason"],
        "null" if o["logprobs"] is None else len(o["logprobs"]), json.dumps(o["text"])))
EOF
# json_ok NAME MODE ARGS...: a --json run that exits 0 and passes check.py; its report is in
# $TMP/NAME.rep and the ids alone ("ID: ids") in $TMP/NAME.ids
json_ok() {
  local name=$1 mode=$2; shift 2
  run_ok "$name" "$@" --json || return 1
  if ! python3 "$TMP/check.py" "$mode" "$TMP/out" >"$TMP/$name.rep"; then
    fail "$name: $(cat "$TMP/$name.rep")"
    return 1
  fi
  grep -E '^[0-9]+: ' "$TMP/$name.rep" >"$TMP/$name.ids"
}
# field NAME KEY: the summary's value of KEY in run NAME's report
field() { sed -n "s/^summary $2=//p" "$TMP/$1.rep"; }
# req NAME ID: request ID's line in run NAME's report
req() { grep "^req $2 " "$TMP/$1.rep"; }
same_ids() { cmp -s "$TMP/$1.ids" "$TMP/$2.ids" || fail "$3: ids differ from $2's: $(diff "$TMP/$2.ids" "$TMP/$1.ids" | head -c 600)"; }

# ---- the story, streamed -------------------------------------------------------------------
if run_ok "story" --model "$S" --prompt-ids 1 -n 40 --threads 1; then
  case "$(head -c ${#STORY} "$TMP/out")" in
  "$STORY") ;;
  *) fail "story: stdout starts '$(head -c 80 "$TMP/out")', want '$STORY'" ;;
  esac
  [ "$(wc -l <"$TMP/out")" -eq 1 ] || fail "story: not one line of text on stdout"
  grep -q '^kvcache run: 1 request(s), ' "$TMP/err" || fail "story: no stats line on stderr: $(cat "$TMP/err")"
fi

# ---- --json: keys, types, numbers ------------------------------------------------------------
if json_ok greedy plain --model "$S" --prompt-ids 1 -n 40 --threads 1; then
  req greedy 0 | grep -q "prompt=1 completion=40 finish=length logprobs=null text=\"$STORY" ||
    fail "greedy --json: $(req greedy 0)"
  [ "$(field greedy kv_bytes_per_token)" = 640 ] || fail "greedy: kv_bytes_per_token $(field greedy kv_bytes_per_token), want 640 (2 x 5 x 4 x 8 x 2)"
  [ "$(field greedy preemptions)" = 0 ] || fail "greedy: preemptions $(field greedy preemptions)"
  # 41 tokens at 16 a block: 3 blocks
  [ "$(field greedy peak_kv_blocks)" -ge 1 ] && [ "$(field greedy peak_kv_blocks)" -le 3 ] ||
    fail "greedy: peak_kv_blocks $(field greedy peak_kv_blocks), want 1..3"
fi
if json_ok logprobs logprobs --model "$S" --prompt-ids 1 -n 12 --logprobs 3 --threads 1; then
  python3 - "$TMP/out" <<'EOF' || fail "--logprobs 3: the top lists"
import json, sys
o = json.loads(open(sys.argv[1]).readline())
for e in o["logprobs"]:
    top = e["top"]
    assert len(top) == 3, top
    assert top[0][0] == e["token"] and top[0][1] == e["logprob"], (top, e)  # greedy: the best
    assert all(top[k][1] >= top[k + 1][1] for k in range(2)), top
EOF
fi
json_ok greedy12 plain --model "$S" --prompt-ids 1 -n 12 --threads 1 && same_ids logprobs greedy12 "--logprobs 3"

# ---- -n and stop strings ------------------------------------------------------------------
if json_ok n7 plain --model "$S" --prompt-ids 1 -n 7 --threads 1; then
  req n7 0 | grep -q 'completion=7 finish=length' || fail "-n 7: $(req n7 0)"
  [ "$(head -1 "$TMP/n7.ids")" = "$(head -1 "$TMP/greedy.ids" | cut -d' ' -f1-8)" ] || fail "-n 7: not the first 7 of the greedy run"
fi
if json_ok stop plain --model "$S" --prompt-ids 1 -n 40 --stop " Lily" --threads 1; then
  req stop 0 | grep -q 'finish=stop logprobs=null text="Once upon a time, there was a little girl named"$' ||
    fail "--stop ' Lily': $(req stop 0)"
fi
if run_ok "stop stream" --model "$S" --prompt-ids 1 -n 40 --stop "little" --stop "girl" --threads 1; then
  [ "$(cat "$TMP/out")" = "Once upon a time, there was a " ] || fail "--stop streamed: '$(cat "$TMP/out")'"
fi
# -n past the context: capped by --ctx, finish length
if json_ok ctxcap plain --model "$S" --prompt-ids "1 403" -n 100 --ctx 10 --threads 1; then
  req ctxcap 0 | grep -q 'prompt=2 completion=8 finish=length' || fail "--ctx 10 -n 100: $(req ctxcap 0)"
fi

# ---- options that must not change greedy ids ------------------------------------------------
json_ok nokv plain --model "$S" --prompt-ids 1 -n 40 --threads 1 --no-kv-cache && same_ids nokv greedy "--no-kv-cache"
json_ok t2 plain --model "$S" --prompt-ids 1 -n 40 --threads 2 && same_ids t2 greedy "--threads 2"
json_ok chunk plain --model "$S" --prompt "$STORY She" -n 30 --threads 1 --chunk 5 &&
  json_ok whole plain --model "$S" --prompt "$STORY She" -n 30 --threads 1 && same_ids chunk whole "--chunk 5"
json_ok bs1 plain --model "$S" --prompt-ids 1 -n 40 --threads 1 --block-size 1 --kv-dtype f16 && same_ids bs1 greedy "--block-size 1"
if json_ok spec spec --model "$S" --prompt-ids 1 -n 120 --threads 1 --spec ngram; then
  json_ok greedy120 plain --model "$S" --prompt-ids 1 -n 120 --threads 1 && same_ids spec greedy120 "--spec ngram"
  [ "$(field spec draft_tokens)" -gt 0 ] || fail "--spec ngram: no drafts in 120 tokens of a story"
fi
if json_ok specp spec --model "$S" --prompt "$STORY She" -n 60 --threads 2 --spec ngram --spec-tokens 2; then
  json_ok greedyp plain --model "$S" --prompt "$STORY She" -n 60 --threads 1 && same_ids specp greedyp "--spec ngram --spec-tokens 2"
fi
# --spec-model: the model as its own draft proposes what greedy verification picks
if json_ok specm spec --model "$S" --prompt-ids 1 -n 120 --threads 1 --spec-model "$S"; then
  [ -f "$TMP/greedy120.ids" ] && same_ids specm greedy120 "--spec-model (itself)"
  d=$(field specm draft_tokens) a=$(field specm accepted_tokens) c=$(field specm draft_computed_tokens)
  [ "${d:-0}" -gt 0 ] && [ $((${a:-0} * 10)) -gt $((d * 9)) ] || fail "--spec-model (itself): $a of $d drafts accepted"
  [ "${c:-0}" -ge 119 ] || fail "--spec-model: draft_computed_tokens '$c'"
fi
if json_ok specm2 spec --model "$S" --prompt "$STORY She" -n 60 --threads 2 --spec-model "$S" --spec-tokens 2; then
  [ -f "$TMP/greedyp.ids" ] && same_ids specm2 greedyp "--spec-model --spec-tokens 2"
fi

# ---- --prompts: text and JSON lines, per-request options -------------------------------------
cat >"$TMP/mixed.txt" <<EOF
$STORY
{"prompt": "One day, a big dog", "n": 5}

{"prompt_ids": [1, 403, 407], "n": 3}
{"prompt": "Tom had a red car.", "temp": 0.8, "seed": 7, "n": 10}
{"prompt": "Tom had a red car.", "temperature": 0.8, "seed": 7, "max_tokens": 10, "top_k": 40, "top_p": 0.95, "min_p": 0.01}
{"prompt_ids": [1], "stop": ["named", "xyz"], "n": 40}
{"prompt_ids": [1], "stop": " girl", "n": 40}
{"prompt_ids": [1], "logprobs": 2, "n": 4}
EOF
if json_ok mixed any --model "$S" --prompts "$TMP/mixed.txt" -n 6 --threads 1; then
  [ "$(grep -c '^req ' "$TMP/mixed.rep")" -eq 8 ] || fail "--prompts: not 8 requests (the empty line is skipped)"
  req mixed 0 | grep -q 'completion=6 finish=length logprobs=null' || fail "--prompts text line: $(req mixed 0)"
  req mixed 1 | grep -q 'completion=5 ' || fail "--prompts \"n\": 5: $(req mixed 1)"
  req mixed 2 | grep -q 'prompt=3 completion=3 ' || fail "--prompts prompt_ids: $(req mixed 2)"
  req mixed 5 | grep -q 'finish=stop logprobs=null text="Once upon a time, there was a little girl "$' || fail "--prompts stop array: $(req mixed 5)"
  req mixed 6 | grep -q 'finish=stop logprobs=null text="Once upon a time, there was a little"$' || fail "--prompts stop string: $(req mixed 6)"
  req mixed 7 | grep -q 'completion=4 finish=length logprobs=4 ' || fail "--prompts logprobs: $(req mixed 7)"
  for i in 0 1 2 3 4 5 6; do req mixed $i | grep -q 'logprobs=null' || fail "--prompts: request $i has logprobs it did not ask for"; done
  # the JSON line's options are the command line's: the same request alone gives the same ids
  if json_ok temp plain --model "$S" --prompt "Tom had a red car." --temp 0.8 --seed 7 -n 10 --threads 1; then
    [ "$(sed -n 's/^0: //p' "$TMP/temp.ids")" = "$(sed -n 's/^3: //p' "$TMP/mixed.ids")" ] ||
      fail "--prompts temp/seed: not the ids of --temp 0.8 --seed 7 alone"
  fi
  json_ok temp8 plain --model "$S" --prompt "Tom had a red car." --temp 0.8 --seed 8 -n 10 --threads 1 &&
    ! cmp -s "$TMP/temp.ids" "$TMP/temp8.ids" || fail "--seed 7 and --seed 8 sampled the same 10 tokens"
  if json_ok text0 plain --model "$S" --prompt "$STORY" -n 6 --threads 1; then
    [ "$(sed -n 's/^0: //p' "$TMP/text0.ids")" = "$(sed -n 's/^0: //p' "$TMP/mixed.ids")" ] ||
      fail "--prompts: a text line's ids are not those of --prompt alone"
  fi
fi

# ---- shared prompts --------------------------------------------------------------------------
LONG="$STORY She loved to play outside in the park. One day, she saw a big, red ball. She wanted to play with it, but it was too high. Lily asked her mom"
for i in 1 2 3 4; do echo "$LONG"; done >"$TMP/shared.txt"
# one at a time (--max-seqs 1): the later requests find the first one's prompt blocks cached
if json_ok serial plain --model "$S" --prompts "$TMP/shared.txt" -n 8 --threads 1 --max-seqs 1; then
  p=$(req serial 0 | sed 's/.*prompt=\([0-9]*\).*/\1/')
  full=$(((p - 1) / 16 * 16))
  req serial 0 | grep -q ' cached=0 ' || fail "shared, serial: the first request found a cache hit: $(req serial 0)"
  for i in 1 2 3; do
    req serial $i | grep -q " cached=$full " || fail "shared, serial: request $i, want cached=$full (the prompt's full blocks): $(req serial $i)"
  done
  [ "$(sed 's/^[0-9]*: //' "$TMP/serial.ids" | sort -u | wc -l)" -eq 1 ] || fail "shared, serial: the same prompt gave different ids"
fi
# two at a time, and all four at once: the engine holds back a request whose prompt prefix
# another one is still computing, so only the first computes it and the others hit its blocks
if json_ok pairs plain --model "$S" --prompts "$TMP/shared.txt" -n 8 --threads 1 --max-seqs 2; then
  same_ids pairs serial "shared, two at a time"
  req pairs 0 | grep -q ' cached=0 ' || fail "shared, two at a time: request 0: $(req pairs 0)"
  for i in 1 2 3; do req pairs $i | grep -q " cached=$full " || fail "shared, two at a time: request $i, want cached=$full: $(req pairs $i)"; done
fi
if json_ok together plain --model "$S" --prompts "$TMP/shared.txt" -n 8 --threads 1; then
  same_ids together serial "shared, all at once"
  req together 0 | grep -q ' cached=0 ' || fail "shared, all at once: request 0: $(req together 0)"
  for i in 1 2 3; do req together $i | grep -q " cached=$full " || fail "shared, all at once: request $i, want cached=$full: $(req together $i)"; done
  p=$(req together 0 | sed 's/.*prompt=\([0-9]*\).*/\1/')
  # the prompt's full blocks once, plus each request's blocks past them
  want=$((p / 16 + 4 * ((p + 8 + 15) / 16 - p / 16)))
  [ "$(field together peak_kv_blocks)" -le "$want" ] ||
    fail "shared, all at once: peak_kv_blocks $(field together peak_kv_blocks), want at most $want (the prompt's blocks once)"
fi
# --no-batch-invariance: runs (the ids may differ in principle; stories260K's head dim 8 takes
# the scalar kernel, whose rows are independent anyway, so here they do not)
if run_ok "nobi" --model "$S" --prompt-ids 1 -n 40 --threads 1 --no-batch-invariance; then
  case "$(head -c ${#STORY} "$TMP/out")" in
  "$STORY") ;;
  *) fail "--no-batch-invariance: stdout starts '$(head -c 80 "$TMP/out")'" ;;
  esac
fi
# --n 2: two samples of one request, each on its own line (no interleaved stream)
if run_ok "n2" --model "$S" --prompt "Once upon a time" --n 2 --temp 0.8 -n 12 --threads 1; then
  [ "$(grep -c '^\[0\] (5 prompt tokens, ' "$TMP/out")" -eq 2 ] || fail "--n 2: want two lines for request 0: $(head -c 300 "$TMP/out")"
fi
# --chat-template: the prompt becomes a user turn (more prompt tokens than the text alone)
if run_ok "chatml" --model "$S" --prompts <(printf "Once upon a time\nLily\n") --chat-template chatml -n 4 --threads 1; then
  grep -Eq '^\[0\] \(([6-9]|[1-9][0-9]+) prompt tokens' "$TMP/out" || fail "--chat-template chatml: $(head -c 300 "$TMP/out")"
fi
# --no-prefix-cache: nothing found, the same ids
if json_ok noprefix plain --model "$S" --prompts "$TMP/shared.txt" -n 8 --threads 1 --max-seqs 1 --no-prefix-cache; then
  same_ids noprefix serial "--no-prefix-cache"
  ! grep -q '^req [0-9]* cached=[1-9]' "$TMP/noprefix.rep" || fail "--no-prefix-cache: a request reports cached tokens"
fi

# ---- a pool too small for the requests: preempted, recomputed, the same ids ------------------
cat >"$TMP/four.txt" <<EOF
$STORY
One day, a big dog went to the park.
Tom had a red car. He liked to drive it
The sun was hot and the bird sang
EOF
if json_ok bigpool plain --model "$S" --prompts "$TMP/four.txt" -n 40 --threads 1; then
  [ "$(field bigpool preemptions)" = 0 ] || fail "large pool: preemptions $(field bigpool preemptions)"
  # 9 blocks of 16 tokens x 640 bytes: each request (at most 58 tokens, 4 blocks) fits, not all four
  if json_ok smallpool plain --model "$S" --prompts "$TMP/four.txt" -n 40 --threads 1 --kv-memory 92160; then
    same_ids smallpool bigpool "--kv-memory 92160"
    [ "$(field smallpool preemptions)" -gt 0 ] || fail "small pool: no preemptions: $(grep summary "$TMP/smallpool.rep" | tr '\n' ' ')"
    [ "$(field smallpool peak_kv_blocks)" -le 9 ] || fail "small pool: peak_kv_blocks $(field smallpool peak_kv_blocks) of 9"
  fi
  json_ok nokv4 plain --model "$S" --prompts "$TMP/four.txt" -n 40 --threads 1 --no-kv-cache && same_ids nokv4 bigpool "--no-kv-cache, four requests"
fi
# a large --ctx with the default pool: sized for the requests (a few blocks), not for the context
# (2M tokens x 640 bytes: 1.3 GB zeroed up front before, measured as the run's peak RSS)
rss=$(python3 -c '
import resource, subprocess, sys
r = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, r.stdout.decode() == "Once upon\n")
' "$KVC" run --model "$S" --prompt-ids 1 -n 2 --ctx 2097152 --threads 1)
set -- $rss
[ "$1" = 0 ] && [ "$3" = True ] || fail "--ctx 2M: exit $1, output right: $3"
[ "$2" -lt 400000 ] || fail "--ctx 2M: peak RSS $2 KiB, want under 400 MiB (the pool is sized for the context)"

# ---- bad input: the model ------------------------------------------------------------------
size=$(wc -c <"$S")
expect_error "no model" "--model FILE is required" -- --prompt-ids 1
expect_error "missing file" "absent\.gguf: cannot open: No such file" -- --model "$DATA/models/absent.gguf" --prompt-ids 1
expect_error "a directory" "not a regular file" -- --model "$DATA/models" --prompt-ids 1
for n in 0 3 4 8 23 24 100 4096 100000 $((size - 1)); do
  head -c $n "$S" >"$TMP/trunc.gguf"
  expect_error "truncated at $n" "trunc\.gguf: " -- --model "$TMP/trunc.gguf" --prompt-ids 1
done
printf 'not a model at all' >"$TMP/text.gguf"
expect_error "not gguf" "no 'GGUF' magic" -- --model "$TMP/text.gguf" --prompt-ids 1
# patch FILE OFFSET HEXBYTES: a copy of stories260K with bytes replaced
patch() {
  cp "$S" "$TMP/$1"
  printf "$(echo "$3" | sed 's/../\\x&/g')" | dd of="$TMP/$1" bs=1 seek="$2" conv=notrunc status=none
}
patch badmagic.gguf 0 47475558 # "GGUX"
expect_error "corrupt magic" "no 'GGUF' magic" -- --model "$TMP/badmagic.gguf" --prompt-ids 1
patch badver.gguf 4 63000000
expect_error "corrupt version" "version" -- --model "$TMP/badver.gguf" --prompt-ids 1
patch badcount.gguf 8 ffffffffffffff7f
expect_error "corrupt tensor count" "badcount\.gguf: " -- --model "$TMP/badcount.gguf" --prompt-ids 1
patch badkv.gguf 16 ffffffff00000000
expect_error "corrupt key count" "badkv\.gguf: " -- --model "$TMP/badkv.gguf" --prompt-ids 1
# offsets found in the file: a value, a tensor's type, a tensor's shape
at() { python3 -c "import sys; d=open(sys.argv[1],'rb').read(); i=d.find(sys.argv[2].encode()); print(i+len(sys.argv[2]) if i>=0 else -1)" "$S" "$1"; }
o=$(at "general.architecture") # then type (u32 8 = string), length (u64 5), "llama"
patch arch.gguf $((o + 12)) 6d616d6261 # "mamba"
expect_error "unknown architecture" "architecture 'mamba' is not supported" -- --model "$TMP/arch.gguf" --prompt-ids 1
o=$(at "output_norm.weight") # then n_dims (u32 1), ne0 (u64 64), type (u32 0 = f32)
patch i32norm.gguf $((o + 12)) 1a000000 # i32: the same bytes, a type nothing converts
expect_error "i32 norm" "output_norm\.weight has type i32, which is not supported" -- --model "$TMP/i32norm.gguf" --prompt-ids 1
o=$(at "blk.0.attn_q.weight") # n_dims (u32 2), ne0, ne1 (u64 64 each), type
patch i32mat.gguf $((o + 20)) 1a000000
expect_error "i32 matrix" "blk\.0\.attn_q\.weight has type i32, which is not supported" -- --model "$TMP/i32mat.gguf" --prompt-ids 1
patch badtype.gguf $((o + 20)) 63000000
expect_error "unknown type" "badtype\.gguf: .*type" -- --model "$TMP/badtype.gguf" --prompt-ids 1
patch f16mat.gguf $((o + 20)) 01000000 # f16: half the bytes, a shape that still fits the file
no_crash "f16 matrix in an f32 file" --model "$TMP/f16mat.gguf" --prompt-ids 1 -n 3 --threads 1
patch shape.gguf $((o + 4)) 2000000000000000 # ne0 32: the wrong shape
expect_error "wrong shape" "blk\.0\.attn_q\.weight has shape \[32, 64\], the model needs \[64, 64\]" -- --model "$TMP/shape.gguf" --prompt-ids 1
o=$(at "llama.embedding_length")
patch dim.gguf $((o + 4)) 00100000 # 4096: no tensor fits
expect_error "embedding length" "dim\.gguf: " -- --model "$TMP/dim.gguf" --prompt-ids 1
o=$(at "tokenizer.ggml.model") # "llama"
patch tok.gguf $((o + 12)) 6770743278 # "gpt2x"
expect_error "unknown tokenizer" "tokenizer\.ggml\.model 'gpt2x' is not supported" -- --model "$TMP/tok.gguf" --prompt-ids 1

# ---- bad input: options --------------------------------------------------------------------
P=(--model "$S" --prompt-ids 1)
expect_error "unknown option" "unknown option '--bogus'" -- "${P[@]}" --bogus
expect_error "unknown short option" "option -x " -- "${P[@]}" -x
expect_error "stray argument" "unexpected argument 'extra'" -- "${P[@]}" extra
expect_error "-n without a value" "option -n needs a value" -- "${P[@]}" -n
expect_error "--temp without a value" "kvcache run: --temp needs a value" -- "${P[@]}" --temp
# NAME VALUE: each numeric option out of its range (and not a number)
for ov in "n 0" "n 16777217" "n x" "temp -1" "temp 101" "temp nan" "top-k -1" "top-k 16777217" \
  "top-p 0" "top-p 1.5" "min-p -0.1" "min-p 2" "repeat-penalty 0" "repeat-penalty 101" \
  "presence-penalty 3" "frequency-penalty -3" "seed -1" "seed 18446744073709551616" \
  "logprobs 21" "logprobs -1" "spec-tokens 0" "spec-tokens 17" "threads 0" "threads 257" \
  "ctx 1" "ctx 16777217" "block-size 0" "block-size 512" "block-size 3" "max-seqs 0" \
  "max-seqs 4097" "batch-tokens 0" "batch-tokens 65537" "chunk 0" "chunk 65537" "beams 0" \
  "beams 65" "kv-memory 0" "kv-memory abc" "kv-memory 1" "kv-memory 100TiB" "kv-dtype f8" \
  "kv-dtype q4_0" "spec foo" "isa sse"; do
  set -- $ov
  if [ "$1" = n ]; then opt=-n; else opt=--$1; fi
  expect_error "$opt $2" "kvcache run: --?$1|out of memory" -- "${P[@]}" "$opt" "$2"
done
expect_error "--n 0" "--n: '0'" -- "${P[@]}" --n 0
expect_error "--n 65" "--n: '65'" -- "${P[@]}" --n 65
expect_error "--spec-model vocabulary" "--spec-model: the draft model's vocabulary has 32000 tokens" -- "${P[@]}" --spec-model "$DATA/models/llama-2-tiny-random.gguf"
expect_error "--spec-model missing" "--spec-model $TMP/nope.gguf: " -- "${P[@]}" --spec-model "$TMP/nope.gguf"
expect_error "--spec and --spec-model" "--spec ngram and --spec-model" -- "${P[@]}" --spec ngram --spec-model "$S"
expect_error "--spec-model without a cache" "--spec and --no-kv-cache" -- "${P[@]}" --spec-model "$S" --no-kv-cache
expect_error "--chat without a template" "--chat: the model has no chat template" -- --model "$S" --prompt Once --chat
expect_error "--chat-template unknown" "--chat-template: 'nope'" -- "${P[@]}" --chat-template nope
expect_error "--chat with ids" "--chat takes text" -- --model "$S" --prompt-ids 1 --chat-template chatml
expect_error "--system without --chat" "--system needs --chat" -- "${P[@]}" --system hi
expect_error "spec without a cache" "--spec and --no-kv-cache" -- "${P[@]}" --spec ngram --no-kv-cache
expect_error "empty stop" "--stop: 1 to 256 bytes" -- "${P[@]}" --stop ""
expect_error "9 stops" "--stop: at most 8" -- "${P[@]}" --stop a --stop b --stop c --stop d --stop e --stop f --stop g --stop h --stop i

# ---- bad input: prompts --------------------------------------------------------------------
expect_error "no prompt" "give exactly one of --prompt, --prompt-ids, --prompts" -- --model "$S"
expect_error "two prompt sources" "give exactly one of" -- --model "$S" --prompt a --prompt-ids 1
expect_error "three prompt sources" "give exactly one of" -- --model "$S" --prompt a --prompt-ids 1 --prompts "$TMP/mixed.txt"
for ids in "" " , " "x" "1 x" "512" "1 -1" "1.5" "99999999999999999999999" "1;2"; do
  expect_error "--prompt-ids '$ids'" "--prompt-ids: " -- --model "$S" --prompt-ids "$ids"
done
expect_error "prompt longer than --ctx" "the prompt has 5 tokens; the context holds 4" -- --model "$S" --prompt-ids "1 2 3 4 5" --ctx 4
expect_error "text prompt longer than --ctx" "the prompt has [0-9]+ tokens; the context holds 8" -- --model "$S" --prompt "$LONG" --ctx 8
expect_error "prompt longer than the model" "the prompt has [0-9]{4} tokens; the context holds 2048" -- --model "$S" --prompt "$(for i in $(seq 60); do echo -n "$LONG "; done)"
expect_error "--prompts absent" "--prompts .*absent\.txt: No such file" -- --model "$S" --prompts "$TMP/absent.txt"
: >"$TMP/empty.txt"
expect_error "--prompts empty" "--prompts .*empty\.txt: no prompts" -- --model "$S" --prompts "$TMP/empty.txt"
# LINE REGEX: a --prompts file whose second line is LINE
badline() {
  printf '%s\n%s\n' "$STORY" "$1" >"$TMP/bad.txt"
  expect_error "--prompts line '$1'" "$2" -- --model "$S" --prompts "$TMP/bad.txt" --threads 1
}
badline '{bad json' "line 2: not a JSON object"
badline '{"prompt": 5}' 'line 2: needs "prompt"'
badline '{"n": 5}' 'line 2: needs "prompt"'
badline '{"prompt_ids": "1 2"}' 'line 2: needs "prompt"'
badline '{"prompt_ids": []}' "line 2: no prompt ids"
badline '{"prompt_ids": [1, 512]}' "line 2: prompt_ids\[1\] is not a token id below 512"
badline '{"prompt_ids": [1, -1]}' "line 2: prompt_ids\[1\]"
badline '{"prompt_ids": [1, 2.5]}' "line 2: prompt_ids\[1\]"
badline '{"prompt_ids": [1, "2"]}' "line 2: prompt_ids\[1\]"
badline '{"prompt": "x", "n": 0}' 'line 2: "n" must be a number'
badline '{"prompt": "x", "n": "5"}' 'line 2: "n" must be a number'
badline '{"prompt": "x", "temp": -1}' 'line 2: "temp" must be a number'
badline '{"prompt": "x", "top_p": 2}' 'line 2: "top_p" must be a number'
badline '{"prompt": "x", "min_p": -1}' 'line 2: "min_p" must be a number'
badline '{"prompt": "x", "top_k": -1}' 'line 2: "top_k" must be a number'
badline '{"prompt": "x", "seed": -1}' 'line 2: "seed" must be a number'
badline '{"prompt": "x", "logprobs": 21}' 'line 2: "logprobs" must be a number'
badline '{"prompt": "x", "stop": 5}' 'line 2: "stop" is a string or an array'
badline '{"prompt": "x", "stop": [1]}' "line 2: stop strings"
badline '{"prompt": "x", "stop": ["a","b","c","d","e","f","g","h","i"]}' "at most 8 stop strings"
printf '%s\n{"prompt_ids": [%s]}\n' "$STORY" "$(seq -s, 1 300)" >"$TMP/long.txt"
expect_error "--prompts line longer than --ctx" "request 1: the prompt has 300 tokens; the context holds 64" -- --model "$S" --prompts "$TMP/long.txt" --ctx 64
printf '%s\n\0\n' "$STORY" >"$TMP/nul.txt"
expect_error "--prompts NUL byte" "--prompts line 2: a NUL byte" -- --model "$S" --prompts "$TMP/nul.txt"

if [ "$fails" -ne 0 ]; then
  echo "$fails check(s) failed"
  exit 1
fi
echo "all run CLI checks passed"
