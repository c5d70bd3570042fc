#!/usr/bin/env bash
# Writes the seed corpus of fuzz_llm (tests/fuzz/corpus/llm): small valid llama models from
# `kvcache model synth` over a 32-token vocabulary written here (so each file is a few KiB: the
# fuzzer's mutations land in metadata, tensor infos and weights alike), one per weight type, and
# variants a step from valid (another architecture, a truncated tail, a tensor of the wrong type).
# The same kvcache writes the same files.  Regression inputs found by fuzzing are kept beside
# them under names that say what they caught; this script does not touch those.
# usage: make_llm_corpus.sh <kvcache-binary> <source-dir>
set -eu
KVC=$1
OUT=$2/tests/fuzz/corpus/llm
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$OUT"

# A llama (SentencePiece) vocabulary of 32 tokens: unknown, BOS, EOS, then pieces.
python3 - "$TMP/vocab.gguf" <<'EOF'
import struct, sys
toks = ["<unk>", "<s>", "</s>", "\u2581", "\u2581Once", "\u2581upon", "\u2581a", "\u2581time",
        ",", ".", "\u2581there", "\u2581was", "\u2581little", "\u2581girl", "\u2581named",
        "\u2581Lily", "e", "t", "a", "o", "n", "i", "s", "r", "h", "l", "d", "y", "m", "g", "p",
        "<0x0A>"]
types = [2, 3, 3] + [1] * 28 + [6]
def s(x):
    b = x.encode()
    return struct.pack("<Q", len(b)) + b
kv = []
kv.append(s("general.architecture") + struct.pack("<I", 8) + s("llama"))
kv.append(s("tokenizer.ggml.model") + struct.pack("<I", 8) + s("llama"))
kv.append(s("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, len(toks)) + b"".join(s(t) for t in toks))
kv.append(s("tokenizer.ggml.scores") + struct.pack("<IIQ", 9, 6, len(toks)) +
          b"".join(struct.pack("<f", -float(i)) for i in range(len(toks))))
kv.append(s("tokenizer.ggml.token_type") + struct.pack("<IIQ", 9, 5, len(toks)) +
          b"".join(struct.pack("<i", t) for t in types))
for k, v in (("bos", 1), ("eos", 2), ("unknown", 0)):
    kv.append(s("tokenizer.ggml.%s_token_id" % k) + struct.pack("<II", 4, v))
open(sys.argv[1], "wb").write(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kv)) + b"".join(kv))
EOF

synth() { # NAME ARGS...
  local name=$1; shift
  "$KVC" model synth --vocab "$TMP/vocab.gguf" --ctx 64 --seed 1 "$@" -o "$OUT/$name.gguf"
}
synth f32_1layer --dim 32 --layers 1 --heads 2 --kv-heads 1 --ff 32 --dtype f32
synth f16_2layers --dim 32 --layers 2 --heads 4 --kv-heads 2 --ff 64 --dtype f16
synth bf16_mha --dim 32 --layers 1 --heads 2 --kv-heads 2 --ff 32 --dtype bf16
synth q8_0 --dim 32 --layers 1 --heads 2 --kv-heads 1 --ff 32 --dtype q8_0
synth q4_0 --dim 64 --layers 1 --heads 4 --kv-heads 1 --ff 32 --dtype q4_0
synth q4_K --dim 256 --layers 1 --heads 2 --kv-heads 1 --ff 256 --dtype q4_K

# Variants: the f32 model as another architecture (same-length names; the keys stay llama's, so
# the loader stops at a missing key or tensor), truncated, and with one matrix of another type.
python3 - "$OUT" <<'EOF'
import sys
out = sys.argv[1]
d = open(out + "/f32_1layer.gguf", "rb").read()
key = b"general.architecture"
at = d.find(key) + len(key) + 12  # type (u32) and length (u64) before the value
assert d[at:at + 5] == b"llama"
open(out + "/arch_qwen2.gguf", "wb").write(d[:at] + b"qwen2" + d[at + 5:])
open(out + "/arch_gemma.gguf", "wb").write(d[:at] + b"gemma" + d[at + 5:])
open(out + "/truncated.gguf", "wb").write(d[: len(d) * 3 // 4])
name = b"blk.0.attn_v.weight"
t = d.find(name) + len(name) + 4 + 16  # n_dims (u32), ne0 and ne1 (u64): the type
assert d[t:t + 4] == b"\0\0\0\0"
open(out + "/attn_v_f16.gguf", "wb").write(d[:t] + b"\1\0\0\0" + d[t + 4:])
EOF
ls -l "$OUT"
