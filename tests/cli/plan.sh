#!/usr/bin/env bash
# plan.sh - `kvcache plan` on the command line: every error path gives one line
# on stderr, nothing on stdout and exit status 1; a refusal exits 3 and names
# the phase; a plan that starts exits 0; the JSON carries the documented keys.
#
# usage: bash plan.sh <kvcache binary> <source dir> <test data dir>
set -u
KVC=$1
DATA=$3
CONFIGS=$DATA/configs
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
failures=0

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# expect_error NEEDLE ARGS...: exit 1, one stderr line containing NEEDLE, empty stdout.
expect_error() {
  local needle=$1
  shift
  timeout 30 "$KVC" plan "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  if [ "$rc" -ne 1 ]; then fail "plan $*: exit $rc, want 1"; return; fi
  if [ -s "$TMP/out" ]; then fail "plan $*: wrote to stdout on error"; fi
  if [ "$(wc -l <"$TMP/err")" -ne 1 ]; then fail "plan $*: stderr is not one line: $(cat "$TMP/err")"; fi
  if ! grep -qF -- "$needle" "$TMP/err"; then fail "plan $*: stderr '$(cat "$TMP/err")' lacks '$needle'"; fi
  if ! grep -q '^kvcache plan: ' "$TMP/err"; then fail "plan $*: error not prefixed 'kvcache plan: '"; fi
}

# expect_status RC ARGS...: exit RC, nothing on stderr.
expect_status() {
  local want=$1
  shift
  timeout 30 "$KVC" plan "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  if [ "$rc" -ne "$want" ]; then fail "plan $*: exit $rc, want $want ($(head -c 300 "$TMP/err"))"; fi
  if [ -s "$TMP/err" ]; then fail "plan $*: wrote to stderr: $(head -c 300 "$TMP/err")"; fi
}

# has PATTERN: the last stdout matches the extended regex.
has() {
  if ! grep -qE -- "$1" "$TMP/out"; then fail "output lacks /$1/"; fi
}

# ---- bad input: one clear line, exit 1 -------------------------------------
expect_error "no --model" --gpu h100
expect_error "--model 'nope': not a preset (llama-3.1-8b" --model nope --gpu h100
expect_error "--gpu 'h999': unknown preset (presets: a100-80gb-sxm, a100-40gb, h100-sxm" --model llama-3.1-8b --gpu h999
expect_error "no --gpu: give a preset" --model llama-3.1-8b
expect_error "no --gpu: give a preset" --model llama-3.1-8b --gpu-memory 24GiB --gpu-bandwidth 1TB/s
expect_error "cannot open $TMP/missing.json: No such file or directory" --model "$TMP/missing.json" --gpu h100
expect_error "cannot read $CONFIGS: Is a directory" --model "$CONFIGS" --gpu h100
printf '{"hidden_size": 4096, "num_hidden_layers": ' >"$TMP/truncated.json"
expect_error "malformed JSON at byte" --model "$TMP/truncated.json" --gpu h100
printf 'not json at all' >"$TMP/garbage.json"
expect_error "malformed JSON at byte 0" --model "$TMP/garbage.json" --gpu h100
printf '["an", "array"]' >"$TMP/array.json"
expect_error "expected a JSON object" --model "$TMP/array.json" --gpu h100
printf '{"num_hidden_layers": 32, "num_attention_heads": 32, "vocab_size": 32000, "intermediate_size": 11008}' \
  >"$TMP/nohidden.json"
expect_error "hidden_size is missing" --model "$TMP/nohidden.json" --gpu h100
printf '{"hidden_size": "big", "num_hidden_layers": 32}' >"$TMP/badtype.json"
expect_error 'hidden_size: expected a positive integer, got "big"' --model "$TMP/badtype.json" --gpu h100
if [ "$(id -u)" -ne 0 ]; then
  cp "$CONFIGS/llama-3.1-8b.json" "$TMP/noread.json" && chmod 000 "$TMP/noread.json"
  expect_error "cannot open $TMP/noread.json: Permission denied" --model "$TMP/noread.json" --gpu h100
fi
expect_error "--tp 3 does not divide the 64 attention heads" --model llama-3.1-70b --gpu h100 --tp 3
# 48 query heads and 12 KV heads: TP 8 divides the first, neither divides nor is a multiple of the second
printf '{"hidden_size": 6144, "num_hidden_layers": 4, "num_attention_heads": 48, "num_key_value_heads": 12, "vocab_size": 1000, "intermediate_size": 8192, "max_position_embeddings": 4096}' \
  >"$TMP/heads12.json"
expect_error "--tp 8 neither divides the 12 KV heads nor is a multiple of them" --model "$TMP/heads12.json" --gpu h100 --tp 8
expect_error "--pp 40 exceeds the 32 layers" --model llama-3.1-8b --gpu h100 --pp 40
expect_error "--pp: '65' is not a whole number in 1..64" --model llama-3.1-8b --gpu h100 --pp 65
expect_error "--tp: 'x' is not a whole number in 1..1024" --model llama-3.1-8b --gpu h100 --tp x
expect_error "--tp: '0' is not a whole number" --model llama-3.1-8b --gpu h100 --tp 0
expect_error "--tp needs a value" --model llama-3.1-8b --gpu h100 --tp
expect_error "--weight-dtype: 'fp3' is not bf16, fp16, fp8, int8, int4 or nvfp4" --model llama-3.1-8b --gpu h100 --weight-dtype fp3
expect_error "--kv-dtype: 'int4' is not bf16, fp16, fp8, int8 or nvfp4" --model llama-3.1-8b --gpu h100 --kv-dtype int4
expect_error "--block-size: '24' is not a power of two" --model llama-3.1-8b --gpu h100 --block-size 24
expect_error "--gpu-memory-utilization: '1.5' is not a number" --model llama-3.1-8b --gpu h100 --gpu-memory-utilization 1.5
expect_error "--gpu-memory-utilization: 'abc' is not a number" --model llama-3.1-8b --gpu h100 --gpu-memory-utilization=abc
expect_error "--gpu-memory: 'lots' is not a size" --model llama-3.1-8b --gpu h100 --gpu-memory lots
expect_error "--gpu-bandwidth: '3TB' is not a positive rate" --model llama-3.1-8b --gpu h100 --gpu-bandwidth 3TB
expect_error "--max-model-len 200000 exceeds the model's max_position_embeddings 131072" --model llama-3.1-8b --gpu h100 --max-model-len 200000
expect_error "is longer than max_model_len 4096" --model llama-3.1-8b --gpu h100 --max-model-len 4096 --prompt 4000 --output 200
expect_error "--max-num-batched-tokens 128 is less than --max-num-seqs 256" --model llama-3.1-8b --gpu h100 \
  --max-num-seqs 256 --max-num-batched-tokens 128
expect_error "--spec-acceptance: '1.5' is not a number" --model llama-3.1-8b --gpu h100 --spec-acceptance 1.5
expect_error "unknown option '--bogus' (try --help)" --model llama-3.1-8b --gpu h100 --bogus
expect_error "--json takes no value" --model llama-3.1-8b --gpu h100 --json=yes
expect_error "unexpected argument 'extra'" --model llama-3.1-8b --gpu h100 extra

# ---- hostile input: bounded fields, no wrap, no crash, no hang (each once crashed, hung or
# printed a wrapped number with exit 0) -------------------------------------------------
printf '{"hidden_size":1,"intermediate_size":1,"num_hidden_layers":1,"num_attention_heads":2147483648,"head_dim":2147483648,"vocab_size":1,"max_position_embeddings":4096}' \
  >"$TMP/wrap.json"
expect_error "num_attention_heads 2147483648 is out of range: at most 8192" --model "$TMP/wrap.json" --gpu h100
# 2^32 - 1 layers: the per-layer weight loop ran for minutes (bounded above by timeout 30)
printf '{"hidden_size":64,"intermediate_size":128,"num_hidden_layers":4294967295,"num_attention_heads":8,"vocab_size":100,"max_position_embeddings":4096}' \
  >"$TMP/layers.json"
expect_error "num_hidden_layers 4294967295 is out of range: at most 4096" --model "$TMP/layers.json" --gpu h100
# budget - 9.2e18 - 9.2e18 was a signed overflow that printed a 43533881 GiB pool
expect_error "--weight-memory 9200000000000000000 B is out of range: at most 1152921504606846976 B" \
  --model llama-3.1-8b --gpu h100 --weight-memory 9.2e18 --activation-memory 9.2e18
expect_error "--activation-memory" --model llama-3.1-8b --gpu h100 --activation-memory 2e18
# 65,536 / 1 patches a side: 2^32 image tokens wrapped to 0
printf '{"text_config":{"hidden_size":4096,"intermediate_size":11008,"num_hidden_layers":32,"num_attention_heads":32,"vocab_size":32000,"max_position_embeddings":4096},"vision_config":{"image_size":65536,"patch_size":1}}' \
  >"$TMP/image.json"
expect_error "4294967296 image tokens" --model "$TMP/image.json" --gpu h100
# 16,384 experts of 2^20 over 32 layers: the parameter count
printf '{"hidden_size":4096,"intermediate_size":11008,"num_hidden_layers":32,"num_attention_heads":32,"vocab_size":32000,"max_position_embeddings":4096,"num_local_experts":16384,"num_experts_per_tok":2,"moe_intermediate_size":1048576}' \
  >"$TMP/params.json"
expect_error "parameters, over the bound" --model "$TMP/params.json" --gpu h100
# KV bytes per token: 2 x 4096 x 8192 x 16384 x 2 B
printf '{"hidden_size":1,"intermediate_size":1,"num_hidden_layers":4096,"num_attention_heads":8192,"head_dim":16384,"vocab_size":1,"max_position_embeddings":4096}' \
  >"$TMP/kv.json"
expect_error "KV bytes per token" --model "$TMP/kv.json" --gpu h100
printf '{"hidden_size":4096,"intermediate_size":11008,"num_hidden_layers":32,"num_attention_heads":32,"vocab_size":32000}' \
  >"$TMP/nomaxpos.json"
# the same refusals reach `kvcache sim`, which loads its model through the planner
timeout 30 "$KVC" sim --model "$TMP/wrap.json" --gpu h100 --workload 'poisson:rate=1,n=2,prompt=16,output=4' >"$TMP/out" 2>"$TMP/err"
rc=$?
[ "$rc" -eq 1 ] || fail "sim on the wrapping config: exit $rc, want 1"
grep -qF "num_attention_heads 2147483648 is out of range" "$TMP/err" || fail "sim: $(cat "$TMP/err")"
# token counts past the bound the library holds (2^32): the option says its range
expect_error "--prompt: '4294967297' is not a token count in 1..4294967296" --model llama-3.1-8b --gpu h100 --prompt 4294967297
expect_error "--max-model-len: '1099511627776' is not a token count in 1..4294967296" \
  --model "$TMP/nomaxpos.json" --gpu h100 --max-model-len 1099511627776
# rates and sizes whose product with the unit is inf
expect_error "--host-bandwidth: '1e300TB/s' is not a positive rate" --model llama-3.1-8b --gpu h100 --host-bandwidth 1e300TB/s
expect_error "--gpu-bandwidth: '1e300TB/s' is not a positive rate" --model llama-3.1-8b --gpu h100 --gpu-bandwidth 1e300TB/s
expect_error "--link-bandwidth: '1e308' is not a positive rate" --model llama-3.1-8b --gpu h100 --link-bandwidth 1e308
expect_error "--gpu-memory: '1e300TB' is not a size" --model llama-3.1-8b --gpu h100 --gpu-memory 1e300TB
# a config is one JSON object: trailing text, a NUL, a raw control byte are refused
cp "$CONFIGS/llama-3.1-8b.json" "$TMP/trailing.json" && printf ' trailing garbage' >>"$TMP/trailing.json"
expect_error "trailing text at byte" --model "$TMP/trailing.json" --gpu h100
cp "$CONFIGS/llama-3.1-8b.json" "$TMP/nul.json" && printf '\0{"hidden_size": 8}' >>"$TMP/nul.json"
expect_error "a NUL byte at byte" --model "$TMP/nul.json" --gpu h100
printf '{"hidden_size":4096,"intermediate_size":11008,"num_hidden_layers":32,"num_attention_heads":32,"vocab_size":32000,"max_position_embeddings":4096,"model_type":"l\033[2Jx"}' \
  >"$TMP/ctl.json"
expect_error "control byte 0x1b" --model "$TMP/ctl.json" --gpu h100
# a model named after a folder with control bytes: the report escapes them
evil="$TMP/$(printf 'evil\033[31m\001')"
mkdir -p "$evil" && cp "$CONFIGS/llama-3.1-8b.json" "$evil/config.json"
expect_status 0 --model "$evil/config.json" --gpu h100
has '^kvcache plan: evil\\x1b\[31m\\x01 on 1 x H100 SXM'
if LC_ALL=C grep -q $'[\001-\010\013-\037\177]' "$TMP/out"; then fail "the report echoes raw control bytes"; fi

# ---- the refusal: Llama-3.1-70B in bf16 on two H100s with TP 2 --------------
# (vLLM's default of 1,024 sequences on an H100 makes the sampler's profile peak 4.89 GiB, and
# the budget then has no room for one block; at 256 sequences it fails one phase later)
expect_status 3 --model llama-3.1-70b --gpu h100-sxm --tp 2
has '^3\. Does it start\?  NO: it fails at allocate_kv_pool'
has 'sampler: 1024 sequences x 128,256 vocab x 40 B of fp32 copies = 4\.89 GiB'
expect_status 3 --model llama-3.1-70b --gpu h100-sxm --tp 2 --max-num-seqs 256
has '^3\. Does it start\?  NO: it fails at check_max_model_len'
has 'check_max_model_len +FAILED +one request of max_model_len 131,072 tokens needs 20\.00 GiB > the KV pool.s 2\.13 GiB'
has 'capture_cuda_graphs +not reached'
has 'estimated maximum model length is 13984'
has '--tp 4 starts'
has '^verdict: does not start \(check_max_model_len\)'
expect_status 3 --model "$CONFIGS/llama-3.1-70b.json" --gpu h100 --tp 2 --max-num-seqs 256 --json
has '"fits":[[:space:]]*false'
has '"failed_phase":[[:space:]]*"check_max_model_len"'
has '"kv_bytes_per_token":[[:space:]]*327680,'
has '"kv_bytes_per_token_per_gpu":[[:space:]]*163840,'
has '"kv_pool_bytes_per_gpu":[[:space:]]*2291281559,'
has '"num_blocks":[[:space:]]*874,'

# ---- token suffixes (vLLM's human_readable_int), prefill-only, full acceptance ----
expect_status 0 --model llama-3.1-8b --gpu h100 --prompt 32K --output 0 --json
has '"prompt_tokens":[[:space:]]*32768,'
has '"output_tokens":[[:space:]]*0,'
expect_status 0 --model llama-3.1-8b --gpu h100 --prompt 25.6k --output 1k --json
has '"prompt_tokens":[[:space:]]*25600,'
has '"output_tokens":[[:space:]]*1000,'
expect_status 0 --model llama-3.1-8b --gpu h100 --max-model-len 64K --tenant-tokens 1M --spec-acceptance 1.0
has '^  request  .*max_model_len 65,536'
has 'warning: --tenant-tokens 1,048,576 is over max_model_len 65,536'
has '^   1    4,096             2\.00 '
expect_error "--prompt: '1.5K' is not a token count" --model llama-3.1-8b --gpu h100 --prompt 1.5K
expect_error "--prompt: '32q' is not a token count" --model llama-3.1-8b --gpu h100 --prompt 32q
expect_error "--prompt: 'k' is not a token count" --model llama-3.1-8b --gpu h100 --prompt k
expect_error "--max-model-len: '99999999T' is not a token count" --model llama-3.1-8b --gpu h100 --max-model-len 99999999T
expect_error "--spec-draft-params: 'x' is not a parameter count" --model llama-3.1-8b --gpu h100 --spec-draft-params x
# vLLM's batch defaults: 1,024 sequences on an H100, 256 and 2,048 tokens on an A100
expect_status 0 --model llama-3.1-8b --gpu h100 --json
has '"max_num_seqs":[[:space:]]*1024,'
has '"max_num_seqs_default":[[:space:]]*true'
expect_status 0 --model llama-3.1-8b --gpu a100 --json
has '"max_num_seqs":[[:space:]]*256,'
has '"max_num_batched_tokens":[[:space:]]*2048,'
"$KVC" plan --help | grep -q 'default: half the' || fail "--help gives the wrong --arrival-rate default"

# ---- long context: Llama-3.1-70B at 1M tokens on eight H100s ------------------------
expect_error "exceeds the model's max_position_embeddings 131072 (a deployment extends it with --rope-scaling yarn:FACTOR)" \
  --model llama-3.1-70b --gpu h100 --tp 8 --max-model-len 1M --prompt 1M --output 0
expect_error "--rope-scaling: 'yarn' is not TYPE:FACTOR" --model llama-3.1-70b --gpu h100 --rope-scaling yarn
expect_error "--rope-scaling: 'ntk:4' is not TYPE:FACTOR" --model llama-3.1-70b --gpu h100 --rope-scaling ntk:4
expect_error "--cp: '0' is not a whole number in 1..1024" --model llama-3.1-70b --gpu h100 --cp 0
expect_status 0 --model llama-3.1-70b --gpu h100 --tp 8 --rope-scaling yarn:8 --max-model-len 1M --prompt 1M --output 0
has '^13\. Long context: one request of 1,048,576 tokens'
has '327,680 B per token x 1,048,576 tokens = 320\.00 GiB per request'
has 'TP 8 x CP 1: each GPU holds 40\.00 GiB of it'
has '= 400\.38 s; 90\.9% of the FLOPs in attention'
has '^   8     1     8     bf16     40\.00 GiB       16\.43 GiB    yes'
expect_status 0 --model llama-3.1-70b --gpu h100 --tp 8 --rope-scaling yarn:8 --max-model-len 1M --prompt 1M --output 0 --json
has '"context_parallel":'
has '"kv_bytes_per_request_per_gpu":[[:space:]]*42949672960,'
has '"ring_bytes_per_step":[[:space:]]*0,'
has '"prefill_seconds":'
# the same model with full multi-head attention (8x the KV) no longer fits 8 GPUs
expect_status 3 --model "$CONFIGS/llama-3.1-70b-mha.json" --gpu h100 --tp 8 --rope-scaling yarn:8 --max-model-len 1M --prompt 1M --output 0
has 'none starts on 8 GPUs; what replaces it'
has '^   8     8     64    bf16     40\.00 GiB       18\.62 GiB    yes .* \(between nodes\)'
expect_status 3 --model llama-3.1-70b --gpu h100 --tp 4 --cp 2 --rope-scaling yarn:8 --max-model-len 1M --prompt 1M --output 0 --json
has '"ring_bytes_per_step":[[:space:]]*536870912,'
has '"ring_hidden":[[:space:]]*true'

# ---- LoRA adapters ---------------------------------------------------------------------
expect_status 0 --model llama-3.1-8b --gpu h100 --lora-rank 16 --lora-adapters 100 --lora-resident 20 --json
has '"adapter_bytes":[[:space:]]*83886080,'
has '"resident_bytes_per_gpu":[[:space:]]*1677721600,'
expect_error "--lora-resident 30 is more than the 10 --lora-adapters" --model llama-3.1-8b --gpu h100 \
  --lora-rank 8 --lora-adapters 10 --lora-resident 30

# ---- the dtype grid ------------------------------------------------------------------
expect_status 3 --model llama-3.1-70b --gpu h100 --tp 2 --grid dtypes
has '^14\. Weight dtype x KV dtype'
has '^   fp8      fp8      yes '
expect_error "--grid: 'sizes' is not a grid (the one there is: dtypes)" --model llama-3.1-70b --gpu h100 --grid sizes

# ---- a deployment that starts ---------------------------------------------------
expect_status 0 --model llama-3.1-8b --gpu h100
has '^1\. KV bytes per token'
has '2 x 32 x 8 x 128 x 2 B = 131,072 B \(128 KiB\) per token'
has 'KiB, MiB, GiB = 2\^10, 2\^20, 2\^30 bytes; GB/s, TB/s = 10\^9, 10\^12 bytes/s'
has '^3\. Does it start\?  yes'
for n in 1 2 3 4 5 6 7 8 9 10 11 12; do has "^$n\. "; done
has '^verdict: starts'

# every key the issue asks for, with the right kind of value
expect_status 0 --model llama-3.1-8b --gpu h100 --json
for key in kv_bytes_per_token kv_bytes_per_token_per_gpu kv_head_replication weight_bytes_per_gpu \
  kv_pool_bytes_per_gpu num_blocks max_concurrency kv_bytes_per_request; do
  has "^	\"$key\":[[:space:]]*[0-9]+,?\$"
done
for key in ridge_flops_per_byte sliding_window_saving prefill_attention_flops_fraction; do
  has "^	\"$key\":[[:space:]]*[0-9.e+-]+,?\$"
done
has '^	"fits":[[:space:]]*true,'
has '^	"failed_phase":[[:space:]]*null,'
has '^	"ceilings":[[:space:]]*\{'
for key in kv_memory compute max_num_seqs max_num_batched_tokens; do has "^		\"$key\":[[:space:]]*([0-9]+|null),"; done
has '^		"binding":[[:space:]]*"(kv_memory|compute|max_num_seqs|max_num_batched_tokens)"'
has '^	"ledger":[[:space:]]*\['
# the ledger in engine order, each entry with name, bytes (an integer) and kind
sed -n '/^	"ledger":/,/^		}\]/p' "$TMP/out" >"$TMP/ledger"
names=$(grep -E '^			"name":' "$TMP/ledger" | sed -E 's/.*"name":[[:space:]]*"([a-z_]+)".*/\1/' | tr '\n' ' ')
[ "$names" = "memory_visible budget weights activation_peak cuda_graphs non_torch cuda_context kv_pool " ] ||
  fail "ledger order: $names"
kinds=$(grep -cE '^			"kind":[[:space:]]*"(measured|estimated|configured)"' "$TMP/ledger")
[ "$kinds" -eq 8 ] || fail "ledger kinds: $kinds of 8"
byte_lines=$(grep -cE '^			"bytes":[[:space:]]*[0-9]+,$' "$TMP/ledger")
[ "$byte_lines" -eq 8 ] || fail "ledger bytes as integers: $byte_lines of 8"

# a measured number passed in is labelled measured
expect_status 0 --model llama-3.1-8b --gpu h100 --json --weight-memory 14.96GiB
weights_kind=$(grep -A3 '"name":[[:space:]]*"weights"' "$TMP/out" | grep -oE '"kind":[[:space:]]*"[a-z]+"' | grep -oE '[a-z]+"$')
[ "$weights_kind" = 'measured"' ] || fail "--weight-memory: weights kind is $weights_kind"

# explicit GPU numbers instead of a preset
expect_status 0 --model llama-3.1-8b --gpu-memory 44GiB --gpu-bandwidth 864GB/s --gpu-flops 362
has 'custom GPU: 44\.00 GiB visible'
# a preset with one number replaced: 14.96 GiB of weights and a 0.5 GiB context load into
# 16 GiB, but the profile run's 1.22 GiB activation peak does not fit beside them
expect_status 3 --model llama-3.1-8b --gpu h100 --gpu-memory 16GiB
has 'NO: it fails at profile'
expect_status 3 --model llama-3.1-8b --gpu h100 --gpu-memory 15GiB
has 'NO: it fails at load_weights'

# the MLA example: DeepSeek-V3 in fp8 on 8 H200s
expect_status 0 --model "$CONFIGS/deepseek-v3.json" --gpu h200 --tp 8 --weight-dtype fp8
has '\(512 \+ 64\) x 61 x 2 B = 70,272 B \(68\.62 KiB\) per token'
has 'copies   8 of each latent'

# the forks example from the issue
expect_status 0 --model llama-3.1-8b --gpu h100 --beams 4 --prompt 1000 --output 200 --block-size 16
has 'unshared   4 x 75 blocks = 600 MiB'
has '75 \+ 3 = 78 blocks = 156 MiB'

# a hybrid (Jamba): section 15's state, checkpoints and restart boundary, and its JSON section
expect_status 0 --model "$CONFIGS/jamba-1.5-mini.json" --gpu h100 --weight-dtype fp8 --kv-cache-memory 16GiB
has '51\.57 billion parameters, 12\.11 billion active'
has '^   model    2 x 4 x 8 x 128 x 2 B = 16,384 B \(16 KiB\) per token'
has '28 layers x 304 KiB = 8\.31 MiB per sequence'
has 'every layer resumes at multiples of lcm\(16, 512\) = 512 tokens'
has 'resumes at 512 and recomputes 488'
expect_status 0 --model "$CONFIGS/jamba-1.5-mini.json" --gpu h100 --weight-dtype fp8 --kv-cache-memory 16GiB --json
has '^		"state_bytes_per_seq":[[:space:]]*8716288,'
has '^		"max_sequences":[[:space:]]*605,'
has '^		"restart_boundary_tokens":[[:space:]]*512,'
expect_status 0 --model llama-3.1-8b --gpu h100 --json
has '^	"recurrent":[[:space:]]*null'
expect_status 0 --model "$CONFIGS/jamba-1.5-mini.json" --gpu h100 --weight-dtype fp8 --state-checkpoint-interval 100 \
  --mamba-ssm-cache-dtype float32 --cached-prefixes 10
has 'lcm\(16, 100\) = 400 tokens'
has 'd_state 16 x 4 B = 512 KiB'
expect_error "--cp 2: context parallelism of recurrent (Mamba) layers is not modelled" \
  --model "$CONFIGS/jamba-1.5-mini.json" --gpu h100 --tp 2 --cp 2
expect_error "--mamba-ssm-cache-dtype: 'fp64' is not auto, bfloat16 or float32" \
  --model "$CONFIGS/jamba-1.5-mini.json" --gpu h100 --mamba-ssm-cache-dtype fp64
# the simulator holds KV blocks only: a hybrid is refused there rather than run without its state
timeout 60 "$KVC" sim --model "$CONFIGS/jamba-1.5-mini.json" --gpu h100 --weight-dtype fp8 \
  --workload 'poisson:rate=1,n=2,prompt=16,output=4' >"$TMP/out" 2>"$TMP/err"
rc=$?
[ "$rc" -eq 1 ] || fail "sim on Jamba: exit $rc, want 1"
grep -qF "28 recurrent (Mamba) layers: their per-sequence state is not simulated" "$TMP/err" ||
  fail "sim on Jamba: $(cat "$TMP/err")"
# Mamba-2 (no attention layer: no KV, the state is all a request holds), Nemotron-H (a layer
# pattern) and Qwen3-Next (Gated DeltaNet): section 15, the JSON recurrent section, the refusals
expect_status 0 --model "$CONFIGS/mamba-codestral-7b.json" --gpu h100 --max-model-len 8192 --kv-cache-memory 16GiB
has '7\.29 billion parameters'
has '^   none: no layer attends \(all 64 layers are mamba2 mixers\), so 0 B per token'
has '= 124 slots, one per sequence'
has '64 layers x 2\.06 MiB = 131\.75 MiB per sequence'
has 'a cached prefix resumes only at a checkpoint, multiples of 512'
expect_status 0 --model "$CONFIGS/mamba-codestral-7b.json" --gpu h100 --max-model-len 8192 --kv-cache-memory 16GiB --json
has '^		"kind":[[:space:]]*"mamba2",'
has '^		"attention_layers":[[:space:]]*0,'
has '^		"state_bytes_per_seq":[[:space:]]*138149888,'
has '^		"attention_restart_tokens":[[:space:]]*null,'
has '^	"kv_bytes_per_token":[[:space:]]*0,'
expect_status 0 --model "$CONFIGS/nemotron-h-8b.json" --gpu h100 --kv-cache-memory 16GiB --mamba-ssm-cache-dtype float32
has '8\.10 billion parameters'
has '^   model    2 x 4 x 8 x 128 x 2 B = 16,384 B \(16 KiB\) per token'
has 'SSM heads 128 x head_dim 64 x d_state 128 x 4 B = 4 MiB'
expect_status 0 --model "$CONFIGS/nemotron-h-8b.json" --gpu h100 --kv-cache-memory 16GiB --json
has '^		"layer_pattern":[[:space:]]*"M-M-M-M\*-M-M-M-M-M\*-M-M-M-M-M\*-M-M-M-M-M\*-M-M-M-M-M-",'
has '^		"state_bytes_per_seq":[[:space:]]*51806208,'
has '^		"max_sequences":[[:space:]]*240,'
has '^		"restart_boundary_tokens":[[:space:]]*512,'
expect_status 0 --model "$CONFIGS/qwen3-next-80b-a3b.json" --gpu h200 --weight-dtype fp8 --kv-cache-memory 16GiB --json
has '^		"kind":[[:space:]]*"gated_deltanet",'
has '^		"state_bytes_per_seq":[[:space:]]*39518208,'
has '^		"kv_bytes_per_token":[[:space:]]*24576,'
expect_error "--pp 13: stage 0 (layers 0-3) holds recurrent state but no attention layer" \
  --model "$CONFIGS/nemotron-h-8b.json" --gpu h100 --pp 13
sed 's/"M-M-M-M\*-/"M-M-M-MX-/' "$CONFIGS/nemotron-h-8b.json" >"$TMP/nemo-bad.json"
expect_error "hybrid_override_pattern: layer 7 is 'X'" --model "$TMP/nemo-bad.json" --gpu h100
sed 's/"num_hidden_layers": 52/"num_hidden_layers": 51/' "$CONFIGS/nemotron-h-8b.json" >"$TMP/nemo-len.json"
expect_error "hybrid_override_pattern has 52 layers but num_hidden_layers is 51" --model "$TMP/nemo-len.json" --gpu h100
grep -v '"linear_key_head_dim"' "$CONFIGS/qwen3-next-80b-a3b.json" >"$TMP/next-bad.json"
expect_error "linear_key_head_dim is missing" --model "$TMP/next-bad.json" --gpu h100
for f in mamba-codestral-7b nemotron-h-8b qwen3-next-80b-a3b; do
  timeout 60 "$KVC" sim --model "$CONFIGS/$f.json" --gpu h100 --max-model-len 4096 \
    --workload 'poisson:rate=1,n=2,prompt=16,output=4' >"$TMP/out" 2>"$TMP/err"
  rc=$?
  [ "$rc" -eq 1 ] || fail "sim on $f: exit $rc, want 1"
  [ "$(wc -l <"$TMP/err")" -eq 1 ] || fail "sim on $f: stderr is not one line"
  grep -qF "recurrent (Mamba) layers: their per-sequence state is not simulated" "$TMP/err" ||
    fail "sim on $f: $(cat "$TMP/err")"
done
printf '{"model_type":"mamba","hidden_size":768,"num_hidden_layers":24,"num_attention_heads":1,"vocab_size":50280,"intermediate_size":1536,"state_size":16}' \
  >"$TMP/mamba.json"
expect_error "state_size: a recurrent or hybrid" --model "$TMP/mamba.json" --gpu h100

# a LLaVA-style config: section 16's encoder peak, encoder cache and phases; the ledger names the
# peak phase
printf '{"model_type":"llava","text_config":{"model_type":"llama","hidden_size":4096,"num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":32,"vocab_size":32064,"intermediate_size":11008,"max_position_embeddings":4096,"tie_word_embeddings":false},"vision_config":{"hidden_size":1024,"intermediate_size":4096,"num_hidden_layers":24,"patch_size":14,"image_size":336}}' \
  >"$TMP/llava.json"
expect_status 0 --model "$TMP/llava.json" --gpu h100 --max-num-seqs 256
has 'encodes min\(256 x 1, 8,192 / 576\) = 14'
has 'an image.s embeddings: 576 tokens x hidden 4096 x 2 B = 4\.50 MiB'
has 'prefill with images peaks'
has '126 KV tokens'
has 'peak: prefill with images'
expect_status 0 --model "$TMP/llava.json" --gpu h100 --max-num-seqs 256 --max-num-batched-tokens 2048 \
  --images-per-request 4 --encoder-cache-tokens 32768 --json
has '^		"encoder_images":[[:space:]]*56,'
has '^		"peak_phase":[[:space:]]*"encoder",'
has '^		"pool_tokens_lost":[[:space:]]*1392,'
expect_status 0 --model llama-3.1-8b --gpu h100 --json
has '^	"multimodal":[[:space:]]*null'
expect_error "--images-per-request: '0'" --model "$TMP/llava.json" --gpu h100 --images-per-request 0
# decode-time CP: the partial softmax results per token and layer
expect_status 0 --model llama-3.1-8b --gpu h100 --prompt 100000 --output 1000 --cp 4
has '\(4 - 1\) x 32 heads/GPU x \(128 \+ 2\) x 4 B = 49,920 B per'
expect_status 0 --model llama-3.1-8b --gpu h100 --prompt 100000 --output 1000 --cp 4 --json
has '^			"bytes_per_token_layer":[[:space:]]*49920,'

# every shared config plans, and none of them crashes
for cfg in "$CONFIGS"/*.json; do
  for tp in 1 8; do
    "$KVC" plan --model "$cfg" --gpu h200 --tp "$tp" --max-model-len 4096 >"$TMP/out" 2>"$TMP/err"
    rc=$?
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 3 ]; then fail "$cfg tp $tp: exit $rc: $(cat "$TMP/err")"; fi
  done
done

# listing and help
expect_status 0 --list
has '^  deepseek-v3 '
has '^  mi300x +MI300X'
expect_status 0 --help
has '^usage: kvcache plan'
has 'exit status: 0 when the deployment starts, 3 when it does not, 1 for bad input'

# a quantised checkpoint (config.json's quantization_config) is sized as what it stores, unless
# --weight-dtype says otherwise; a quant_method the planner does not know is refused by name
python3 - "$DATA/configs/llama-3.1-8b.json" "$TMP" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
for name, q in (("fp8", {"quant_method": "fp8", "activation_scheme": "dynamic"}),
                ("awq", {"quant_method": "awq", "bits": 4, "group_size": 128}),
                ("hqq", {"quant_method": "hqq", "nbits": 4})):
    c["quantization_config"] = q
    json.dump(c, open("%s/q-%s.json" % (sys.argv[2], name), "w"))
PY
"$KVC" plan --model "$TMP/q-fp8.json" --gpu h100-sxm >"$TMP/q.out" 2>&1
grep -q "weights fp8, KV bf16" "$TMP/q.out" || fail "an fp8 checkpoint is not sized as fp8: $(head -1 "$TMP/q.out")"
"$KVC" plan --model "$TMP/q-awq.json" --gpu h100-sxm >"$TMP/q.out" 2>&1
grep -q "weights int4, KV bf16" "$TMP/q.out" || fail "an AWQ 4-bit checkpoint is not sized as int4: $(head -1 "$TMP/q.out")"
"$KVC" plan --model "$TMP/q-fp8.json" --gpu h100-sxm --weight-dtype bf16 >"$TMP/q.out" 2>&1
grep -q "weights bf16, KV bf16" "$TMP/q.out" || fail "--weight-dtype does not win over the checkpoint's: $(head -1 "$TMP/q.out")"
"$KVC" plan --model "$TMP/q-hqq.json" --gpu h100-sxm >"$TMP/q.out" 2>"$TMP/q.err"
rc=$?
[ $rc -eq 1 ] && [ "$(wc -l <"$TMP/q.err")" -eq 1 ] && grep -q "quantization_config.quant_method 'hqq' is not modelled" "$TMP/q.err" ||
  fail "an unknown quant_method is not refused by name (exit $rc): $(cat "$TMP/q.err")"

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed" >&2
  exit 1
fi
echo "plan CLI: all checks passed"
