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

# The other architectures and variants, rewritten from the synth files: keys renamed, tensors
# added (f32, norms 1, biases 0.01), tensor data realigned.  Each loads and runs.
python3 - "$OUT" <<'EOF'
import struct, sys
out = sys.argv[1]
SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
BLOCK = {0: (1, 4), 1: (1, 2), 30: (1, 2), 8: (32, 34), 2: (32, 18), 12: (256, 144), 14: (256, 210)}
def read(path):
    d = open(path, "rb").read()
    n_t, n_kv = struct.unpack_from("<QQ", d, 8)
    p = 24
    def string(p):
        n, = struct.unpack_from("<Q", d, p)
        return d[p + 8:p + 8 + n].decode(), p + 8 + n
    def value(t, p):
        if t == 8:
            return string(p)[1]
        if t == 9:
            et, n = struct.unpack_from("<IQ", d, p)
            p += 12
            for _ in range(n):
                p = value(et, p)
            return p
        return p + SIZES[t]
    kvs = []
    for _ in range(n_kv):
        k, p = string(p)
        t, = struct.unpack_from("<I", d, p)
        e = value(t, p + 4)
        kvs.append([k, d[p:e]])
        p = e
    infos = []
    for _ in range(n_t):
        name, p = string(p)
        nd, = struct.unpack_from("<I", d, p)
        ne = list(struct.unpack_from("<%dQ" % nd, d, p + 4))
        t, off = struct.unpack_from("<IQ", d, p + 4 + 8 * nd)
        p += 4 + 8 * nd + 12
        infos.append((name, ne, t, off))
    base = (p + 31) // 32 * 32
    tensors = []
    for name, ne, t, off in infos:
        n = 1
        for x in ne:
            n *= x
        blk, b = BLOCK[t]
        tensors.append([name, ne, t, d[base + off:base + off + n // blk * b]])
    return kvs, tensors
def write(path, kvs, tensors):
    def s(x):
        b = x.encode()
        return struct.pack("<Q", len(b)) + b
    h = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    h += b"".join(s(k) + v for k, v in kvs)
    off, data = 0, b""
    for name, ne, t, raw in tensors:
        h += s(name) + struct.pack("<I", len(ne)) + struct.pack("<%dQ" % len(ne), *ne)
        h += struct.pack("<IQ", t, off)
        pad = (len(raw) + 31) // 32 * 32 - len(raw)
        data += raw + b"\0" * pad
        off += len(raw) + pad
    h += b"\0" * ((len(h) + 31) // 32 * 32 - len(h))
    open(path, "wb").write(h + data)
def u32(x):
    return struct.pack("<II", 4, x)
def f32(x):
    return struct.pack("<If", 6, x)
def sval(x):
    b = x.encode()
    return struct.pack("<IQ", 8, len(b)) + b
def vec(name, n, v):
    return [name, [n], 0, struct.pack("<%df" % n, *([v] * n))]
def arch(kvs, a):
    r = []
    for k, v in kvs:
        if k == "general.architecture":
            v = sval(a)
        elif k.startswith("llama."):
            k = a + k[5:]
        r.append([k, v])
    return r
def get(kvs, key):
    for k, v in kvs:
        if k == key:
            return struct.unpack_from("<I", v, 4)[0]
def layers(kvs, a):
    return get(kvs, a + ".block_count")

# qwen2: q/k/v biases, the output tied to the embedding
kvs, ts = read(out + "/f32_1layer.gguf")
kvs = arch(kvs, "qwen2")
dim, nh, nkv = get(kvs, "qwen2.embedding_length"), get(kvs, "qwen2.attention.head_count"), get(kvs, "qwen2.attention.head_count_kv")
hd = dim // nh
ts = [t for t in ts if t[0] != "output.weight"]
for l in range(layers(kvs, "qwen2")):
    ts += [vec("blk.%d.attn_q.bias" % l, nh * hd, 0.01), vec("blk.%d.attn_k.bias" % l, nkv * hd, 0.01),
           vec("blk.%d.attn_v.bias" % l, nkv * hd, 0.01)]
write(out + "/qwen2_tied.gguf", kvs, ts)

# qwen3: per-head q/k norms
kvs, ts = read(out + "/q8_0.gguf")
kvs = arch(kvs, "qwen3")
dim, nh = get(kvs, "qwen3.embedding_length"), get(kvs, "qwen3.attention.head_count")
for l in range(layers(kvs, "qwen3")):
    ts += [vec("blk.%d.attn_q_norm.weight" % l, dim // nh, 1.0), vec("blk.%d.attn_k_norm.weight" % l, dim // nh, 1.0)]
write(out + "/qwen3_qk_norm.gguf", kvs, ts)

# gemma2: sliding layers (even) and full ones, soft-capping, post norms
kvs, ts = read(out + "/f16_2layers.gguf")
kvs = arch(kvs, "gemma2")
dim = get(kvs, "gemma2.embedding_length")
kvs += [["gemma2.attention.sliding_window", u32(4)], ["gemma2.attn_logit_softcapping", f32(50.0)],
        ["gemma2.final_logit_softcapping", f32(30.0)]]
for l in range(layers(kvs, "gemma2")):
    ts += [vec("blk.%d.post_attention_norm.weight" % l, dim, 1.0), vec("blk.%d.post_ffw_norm.weight" % l, dim, 1.0)]
write(out + "/gemma2_sliding.gguf", kvs, ts)

# llama with llama3 RoPE frequencies and a sliding window on every layer (Mistral)
kvs, ts = read(out + "/q4_0.gguf")
dim, nh = get(kvs, "llama.embedding_length"), get(kvs, "llama.attention.head_count")
kvs += [["llama.attention.sliding_window", u32(6)]]
ts += [vec("rope_freqs.weight", dim // nh // 2, 1.0)]
write(out + "/llama3_rope_window.gguf", kvs, ts)
EOF
ls -l "$OUT"
