#!/usr/bin/env bash
# CLI tests for `kvcache model convert` (a GGUF to a llama2.c checkpoint and tokenizer.bin) and
# `kvcache model info FILE.bin --tokenizer FILE`: stories260K converted and described as the
# GGUF it came from, the same bytes on a second conversion, and every bad-input path a
# one-line error with nothing on stdout and no file left behind.
# usage: convert.sh <kvcache-binary> <source-dir> <test-data-dir>
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
"$KVC" model convert "$S" -o "$TMP/s.bin" --tokenizer-out "$TMP/tok.bin" >"$TMP/out" 2>"$TMP/err" \
  || fail "convert: exit $? ($(cat "$TMP/err"))"
[ ! -s "$TMP/out" ] || fail "convert printed to stdout"
# 7 int32 + 276416 floats (the weights and the RoPE tables; stories260K's output.weight is
# its embedding, so the classifier is shared)
[ "$(stat -c %s "$TMP/s.bin")" -eq 1105692 ] || fail "s.bin: $(stat -c %s "$TMP/s.bin") bytes, want 1105692"
# the header: dim 64, hidden 172, 5 layers, 8 heads, 4 KV heads, vocab 512, seq_len 2048
[ "$(od -An -t d4 -N 28 "$TMP/s.bin" | tr -s ' \n' ' ')" = " 64 172 5 8 4 512 2048 " ] \
  || fail "s.bin header: $(od -An -t d4 -N 28 "$TMP/s.bin")"
# info describes the checkpoint as it describes the GGUF it came from
"$KVC" model info "$S" >"$TMP/gguf.txt" 2>&1 || fail "info gguf: exit $?"
"$KVC" model info "$TMP/s.bin" --tokenizer "$TMP/tok.bin" >"$TMP/bin.txt" 2>"$TMP/err" \
  || fail "info bin: exit $? ($(cat "$TMP/err"))"
grep -Eq '^file +llama2\.c checkpoint, read as GGUF v3, 1\.1 MiB, 19 keys, 48 tensors$' "$TMP/bin.txt" \
  || fail "info bin file line: $(head -1 "$TMP/bin.txt")"
diff <(tail -n +2 "$TMP/gguf.txt") <(tail -n +2 "$TMP/bin.txt") >"$TMP/diff" \
  || fail "info of the .bin differs from the GGUF's: $(cat "$TMP/diff")"
"$KVC" model info "$TMP/s.bin" >"$TMP/out" 2>&1 || fail "info bin without tokenizer: exit $?"
grep -Eq '^tokenizer +none in the file$' "$TMP/out" || fail "info bin without tokenizer: $(grep tokenizer "$TMP/out")"
# converting again gives the same bytes
"$KVC" model convert "$S" -o "$TMP/s2.bin" --tokenizer-out "$TMP/tok2.bin" 2>/dev/null || fail "convert again: exit $?"
cmp -s "$TMP/s.bin" "$TMP/s2.bin" || fail "convert: two runs wrote different checkpoints"
cmp -s "$TMP/tok.bin" "$TMP/tok2.bin" || fail "convert: two runs wrote different tokenizers"
# a q4_0 model converts (dequantized), weights only
T=$DATA/models/llama-2-tiny-random.gguf
"$KVC" model synth --vocab "$T" --dim 64 --layers 1 --heads 2 --kv-heads 1 --ff 64 --dtype q4_0 --ctx 32 -o "$TMP/q.gguf" 2>/dev/null || fail "synth: exit $?"
"$KVC" model convert "$TMP/q.gguf" -o "$TMP/q.bin" 2>"$TMP/err" || fail "convert q4_0: exit $? ($(cat "$TMP/err"))"
"$KVC" model info "$TMP/q.bin" --tensors >"$TMP/out" 2>&1 || fail "info q4_0 bin: exit $?"
grep -Eq '^  blk\.0\.attn_k\.weight  f32 \[64, 32\]  8192 bytes$' "$TMP/out" || fail "q4_0 bin: attn_k not f32 [64, 32]"

# a GGUF named .bin is still read as a GGUF
cp "$S" "$TMP/gguf.bin"
"$KVC" model info "$TMP/gguf.bin" >"$TMP/out" 2>&1 || fail "info gguf.bin: exit $?"
grep -Eq '^file +GGUF v3, ' "$TMP/out" || fail "gguf.bin not read as a GGUF: $(head -1 "$TMP/out")"

# bad input
head -c 100 "$TMP/s.bin" >"$TMP/trunc.bin"
head -c 1000 "$TMP/tok.bin" >"$TMP/trunc_tok.bin"
expect_error "truncated bin" 1 "trunc\.bin: checkpoint: the header \(dim 64, .*\) needs 1105692 bytes, the file has 100$" -- model info "$TMP/trunc.bin"
expect_error "truncated tokenizer" 1 "tokenizer: truncated at byte [0-9]+: token [0-9]+" -- model info "$TMP/s.bin" --tokenizer "$TMP/trunc_tok.bin"
expect_error "absent bin" 1 "checkpoint .*absent\.bin: cannot open: No such file" -- model info "$DATA/models/absent.bin"
expect_error "tokenizer on gguf" 1 "--tokenizer: only for a llama2\.c checkpoint" -- model info "$S" --tokenizer "$TMP/tok.bin"
expect_error "convert no out" 1 "convert: -o OUT\.bin is required" -- model convert "$S"
expect_error "convert no in" 1 "convert: give exactly one IN\.gguf" -- model convert -o "$TMP/x.bin"
expect_error "convert two in" 1 "convert: give exactly one IN\.gguf" -- model convert "$S" "$T" -o "$TMP/x.bin"
expect_error "convert bad option" 1 "unknown or incomplete option '--bogus'" -- model convert "$S" -o "$TMP/x.bin" --bogus
expect_error "convert absent" 1 "absent\.gguf: cannot open" -- model convert "$DATA/models/absent.gguf" -o "$TMP/x.bin"
expect_error "convert a bin" 1 "no 'GGUF' magic" -- model convert "$TMP/s.bin" -o "$TMP/x.bin"
expect_error "convert vocab only" 1 "^kvcache model: convert .*: " -- model convert "$DATA/models/vocab/ggml-vocab-phi-3.gguf" -o "$TMP/x.bin"
expect_error "convert unwritable" 1 "cannot create" -- model convert "$S" -o /nonexistent/dir/x.bin
expect_error "convert tokenizer unwritable" 1 "cannot create" -- model convert "$S" -o "$TMP/x.bin" --tokenizer-out /nonexistent/dir/t.bin
[ ! -e "$TMP/x.bin" ] || fail "convert: a refused run left a file"
"$KVC" model convert --help >"$TMP/out" 2>&1 || fail "convert --help: exit $?"
grep -q '^       kvcache model convert IN\.gguf -o OUT\.bin \[--tokenizer-out TOKENIZER\.bin\]$' "$TMP/out" || fail "convert --help: no usage line"

if [ "$fails" -ne 0 ]; then
  echo "$fails check(s) failed"
  exit 1
fi
echo "all convert CLI checks passed"
