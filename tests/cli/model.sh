#!/usr/bin/env bash
# CLI tests for `kvcache model info` and `kvcache plan --model FILE.gguf`: the real model files
# in tests/data/models described as their provenance says, and every bad-input path a one-line
# error with nothing on stdout.
# usage: model.sh <kvcache-binary> <source-dir> <test-data-dir>
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
# expect_line NAME REGEX: the last output has a line matching
expect_line() {
  grep -Eq -e "$2" "$TMP/out" || { fail "$1: no line matching '$2' in:"; cat "$TMP/out"; }
}

S=$DATA/models/stories260K.gguf
"$KVC" model info "$S" >"$TMP/out" 2>"$TMP/err" || fail "model info stories260K: exit $? ($(cat "$TMP/err"))"
expect_line "stories file" '^file +GGUF v3, 1\.1 MiB, 19 keys, 48 tensors, alignment 32$'
expect_line "stories shape" '^  layers 5, hidden 64, heads 8, KV heads 4, head dim 8, FFN 172, vocab 512, context 2048$'
expect_line "stories rope" '^  RMSNorm eps 1e-05, RoPE theta 10000 on 8 dims, scaling none$'
expect_line "stories tokenizer" '^tokenizer +llama \(SentencePiece\), 512 tokens, bos 1, eos 2, unk 0, pad none$'
expect_line "stories tensors" '^tensors +48 \(1\.1 MiB\): f32 48 \(1\.1 MiB\)$'
# 2 x 5 layers x 4 KV heads x 8 dims x 2 bytes = 640; x 2048 tokens = 1.25 MiB
expect_line "stories kv" '^KV cache +640 bytes per token in 16 bits \(320 in fp8\).* 2048-token context holds 1\.2 MiB$'
[ "$(grep -c '^  blk\.' "$TMP/out")" -eq 0 ] || fail "stories: tensors listed without --tensors"

T=$DATA/models/llama-2-tiny-random.gguf
"$KVC" model info "$T" --tensors >"$TMP/out" 2>"$TMP/err" || fail "model info tiny --tensors: exit $?"
expect_line "tiny tensors" '^tensors +12 .*: f32 3 \(96 bytes\) f16 9'
expect_line "tiny embedding" '^  token_embd\.weight  f16 \[8, 32000\]  512000 bytes$'
[ "$(grep -c '^  [a-z_.0-9]*  f' "$TMP/out")" -eq 12 ] || fail "tiny: not 12 tensor lines"

# the planner takes the GGUF as it takes a config.json
"$KVC" plan --model "$S" --gpu h100-sxm >"$TMP/out" 2>"$TMP/err" || fail "plan --model gguf: exit $? ($(cat "$TMP/err"))"
expect_line "plan gguf kv" '2 x 5 x 4 x 8 x 2 B = 640 B'
"$KVC" plan --model "$S" --gpu h100-sxm --json >"$TMP/out" 2>/dev/null || fail "plan --model gguf --json: exit $?"
expect_line "plan gguf json" '"kv_bytes_per_token":[[:space:]]*640,'

# synth: the model asked for, the same file for the same options, and its refusals
"$KVC" model synth --vocab "$T" --dim 128 --layers 2 --heads 4 --kv-heads 2 --ff 256 --dtype q4_0 --seed 3 -o "$TMP/s1.gguf" 2>"$TMP/err" || fail "synth: exit $? ($(cat "$TMP/err"))"
"$KVC" model synth --vocab "$T" --dim 128 --layers 2 --heads 4 --kv-heads 2 --ff 256 --dtype q4_0 --seed 3 -o "$TMP/s2.gguf" 2>/dev/null || fail "synth again: exit $?"
cmp -s "$TMP/s1.gguf" "$TMP/s2.gguf" || fail "synth: the same options wrote different files"
"$KVC" model info "$TMP/s1.gguf" >"$TMP/out" 2>"$TMP/err" || fail "info on synth: exit $? ($(cat "$TMP/err"))"
expect_line "synth shape" '^  layers 2, hidden 128, heads 4, KV heads 2, head dim 32, FFN 256, vocab 32000, context 2048$'
expect_line "synth tensors" '^tensors +21 .*: f32 5 .* q4_0 16 '
expect_line "synth tokenizer" '^tokenizer +llama \(SentencePiece\), 32000 tokens'
expect_error "synth no vocab" 1 "--vocab VOCAB\.gguf is required" -- model synth -o "$TMP/x.gguf"
expect_error "synth no out" 1 "-o OUT\.gguf is required" -- model synth --vocab "$T"
expect_error "synth bad dtype" 1 "--dtype 'q9': not a tensor type" -- model synth --vocab "$T" -o "$TMP/x.gguf" --dtype q9
expect_error "synth q5_K" 1 "--dtype q5_K: synth writes f32, f16, bf16, q8_0, q4_0, q4_K and q6_K" -- model synth --vocab "$T" -o "$TMP/x.gguf" --dtype q5_k
expect_error "synth dim 0" 1 "--dim: '0' is not a whole number" -- model synth --vocab "$T" -o "$TMP/x.gguf" --dim 0
expect_error "synth dim block" 1 "q8_0 needs dim and ff multiples of 32" -- model synth --vocab "$T" -o "$TMP/x.gguf" --dim 80 --heads 4 --kv-heads 2
expect_error "synth arch" 1 "--arch 'gemma2': synth writes llama models only" -- model synth --vocab "$T" -o "$TMP/x.gguf" --arch gemma2
expect_error "synth vocab missing" 1 "--vocab .*absent\.gguf: cannot open" -- model synth --vocab "$DATA/models/absent.gguf" -o "$TMP/x.gguf"
expect_error "synth unwritable" 1 "cannot create" -- model synth --vocab "$T" -o /nonexistent/dir/x.gguf
[ ! -e "$TMP/x.gguf" ] || fail "synth: a refused run left a file"

# bad input
printf 'GGUF\003\000\000\000' >"$TMP/trunc.gguf"
printf 'not a model' >"$TMP/text.gguf"
expect_error "missing file" 1 "^kvcache model: .*/absent\.gguf: cannot open: No such file" -- model info "$DATA/models/absent.gguf"
expect_error "truncated" 1 "^kvcache model: .*trunc\.gguf: truncated at byte 8: the tensor count needs 8 bytes, 0 remain$" -- model info "$TMP/trunc.gguf"
expect_error "not gguf" 1 "no 'GGUF' magic" -- model info "$TMP/text.gguf"
expect_error "a directory" 1 "not a regular file" -- model info "$DATA/models"
expect_error "no file" 1 "give exactly one FILE\.gguf" -- model info
expect_error "two files" 1 "give exactly one FILE\.gguf" -- model info "$S" "$T"
expect_error "bad option" 1 "unknown option '--bogus'" -- model info --bogus "$S"
expect_error "bad subcommand" 1 "unknown subcommand 'show'" -- model show "$S"
expect_error "no subcommand" 2 "^kvcache model: give a subcommand: info, convert or synth" -- model
expect_error "plan truncated gguf" 1 "^kvcache plan: --model: .*trunc\.gguf: truncated at byte 8" -- plan --model "$TMP/trunc.gguf" --gpu h100-sxm
expect_error "plan absent gguf" 1 "^kvcache plan: --model: .*absent\.gguf: cannot open" -- plan --model "$DATA/models/absent.gguf" --gpu h100-sxm
"$KVC" model --help >"$TMP/out" 2>&1 || fail "model --help: exit $?"
expect_line "help" '^usage: kvcache model info FILE\.gguf \[--tensors\]$'

if [ "$fails" -ne 0 ]; then
  echo "$fails check(s) failed"
  exit 1
fi
echo "all model CLI checks passed"
