/* kvcache/plan.h - the capacity planner: model and hardware descriptors, the
 * startup memory ledger, the ceilings on the running batch, parallelism math.
 *
 * Pure functions over plain structs: describe a model (a built-in preset or a
 * Hugging Face config.json), a GPU (a preset or explicit numbers) and the
 * deployment (parallelism, dtypes, engine limits, the typical request), call
 * kvc_plan_compute(), and read every number from the result.  The two
 * renderers turn a result into the text derivation (formula, numbers
 * substituted, result) or one JSON object, so a C caller gets exactly what
 * `kvcache plan` prints.  This layer depends on nothing above `util`.
 *
 * Units: bytes are exact integers; "GiB" means 2^30 bytes and "GB" 10^9;
 * bandwidths are bytes per second, FLOP rates FLOP per second (dense, no
 * sparsity).  Every number is one of four kinds, and the output says which:
 * measured (an engine measured it and you passed it in), estimated (our
 * formula; an engine would measure it), configured (you or a preset gave
 * it), or a ceiling (an upper bound, never a prediction).
 *
 * Thread-safety: every function is reentrant; presets are read-only tables.
 * Nothing here allocates except the renderers and kvc_plan_model_load.
 */
#ifndef KVCACHE_PLAN_H
#define KVCACHE_PLAN_H

#include "kvcache/util.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A byte override left at KVC_PLAN_AUTO is estimated by the planner. */
#define KVC_PLAN_AUTO      UINT64_MAX
/* A ceiling or count that does not exist (e.g. a decode step that never
 * becomes compute-bound) reads KVC_PLAN_UNBOUNDED. */
#define KVC_PLAN_UNBOUNDED UINT64_MAX

/* ---- number formats ------------------------------------------------------- */
typedef enum {
    KVC_PLAN_BF16 = 0,
    KVC_PLAN_FP16,
    KVC_PLAN_FP8,   /* weights: 1 byte per parameter (scales neglected); KV: 1 byte per element */
    KVC_PLAN_INT4,  /* weights only: 4 bits plus one fp16 scale and one fp16 zero per 128 weights */
    KVC_PLAN_INT8,  /* 1 byte per element (per-channel or per-tensor scales neglected); int8
                       weights compute at the fp8 tensor rate where the GPU has one (W8A8) */
    KVC_PLAN_NVFP4, /* 4-bit e2m1 plus one fp8 scale per 16 elements: 9 bytes per 16 (weights
                       and KV); computes at the fp8 tensor rate (a conservative stand-in for
                       Blackwell's fp4 rate, which the GPU descriptor does not carry) */
    KVC_PLAN_DTYPE__COUNT
} kvc_plan_dtype_t;

/* "bf16", "fp16", "fp8", "int4", "int8", "nvfp4"; "?" for an invalid value.  Never fails. */
KVC_API const char *kvc_plan_dtype_name(kvc_plan_dtype_t dt);
/* Parse a name (also "bfloat16", "float16", "half", "fp8_e4m3", "e4m3", "e5m2", "fp4"),
 * case-insensitively.  Returns 0, or KVC_EINVAL for an unknown name or a NULL
 * argument (*out is then untouched). */
KVC_API int kvc_plan_dtype_parse(const char *name, kvc_plan_dtype_t *out);
/* Bits per element, scales aside: 16, 16, 8, 4, 8, 4; 0 for an invalid value. */
KVC_API uint32_t kvc_plan_dtype_bits(kvc_plan_dtype_t dt);
/* Bytes n elements take in dt, block scales included (nvfp4: 9 per 16, rounded up; int4 as a
 * weight format: 0.5 + 4 B of fp16 scale and zero per 128).  Saturates; 0 for an invalid
 * dtype.  Never fails. */
KVC_API uint64_t kvc_plan_dtype_bytes(kvc_plan_dtype_t dt, uint64_t n);

/* ---- bounds ----------------------------------------------------------------
 * Every count a model, a GPU or a deployment carries is bounded by what a real
 * one has, with a wide margin, so that every product the planner forms fits
 * its type: an input past a bound is refused with one line naming the field
 * and the bound, never wrapped into a small wrong number.  The largest
 * published values (2025) are given for scale.
 */
/* hidden_size, and q_lora_rank / kv_lora_rank (a rank past the width compresses
 * nothing): widest 16,384 (Llama 3.1 405B), 20,480 (Megatron-Turing NLG 530B). */
#define KVC_PLAN_MAX_HIDDEN             (UINT32_C(1) << 17)
#define KVC_PLAN_MAX_RANK               KVC_PLAN_MAX_HIDDEN
/* num_hidden_layers: deepest decoders 126 (Llama 3.1 405B); research stacks of
 * 1,000 layers (DeepNet) still fit. */
#define KVC_PLAN_MAX_LAYERS             UINT32_C(4096)
/* num_attention_heads (and the KV heads, never more): most 128 (Llama 3.1 405B,
 * DeepSeek-V3), 232 (Falcon 180B). */
#define KVC_PLAN_MAX_HEADS              UINT32_C(8192)
/* head_dim, v_head_dim, qk_nope_head_dim + qk_rope_head_dim: widest 256 (Gemma). */
#define KVC_PLAN_MAX_HEAD_DIM           UINT32_C(16384)
/* vocab_size: largest 262,144 (Gemma 3). */
#define KVC_PLAN_MAX_VOCAB              (UINT32_C(1) << 24)
/* intermediate_size, moe_intermediate_size, shared_expert_intermediate_size:
 * widest 73,728 (PaLM 540B). */
#define KVC_PLAN_MAX_INTERMEDIATE       (UINT32_C(1) << 20)
/* routed experts (and shared ones): most 512 (Qwen3-Next), 384 (Kimi K2). */
#define KVC_PLAN_MAX_EXPERTS            (UINT32_C(1) << 14)
/* A Mamba mixer's d_state and d_conv: 16 and 4 (Mamba-1, Jamba), 128 and 4 (Mamba-2). */
#define KVC_PLAN_MAX_SSM_STATE          (UINT32_C(1) << 16)
/* KV tokens one image takes: LLaVA-1.5 576, Qwen2-VL up to 16,384. */
#define KVC_PLAN_MAX_IMAGE_TOKENS       (UINT32_C(1) << 20)
/* sliding_window / attention_chunk_size: 4,096 (Mistral), 262,144 (Phi-3). */
#define KVC_PLAN_MAX_WINDOW             (UINT32_C(1) << 30)
/* Token counts: max_position_embeddings, max_model_len, the request's prompt,
 * output and context, tenant_tokens.  Longest context 10 M (Llama 4 Scout). */
#define KVC_PLAN_MAX_TOKENS             (UINT64_C(1) << 32)
/* Derived from the fields: parameters (about 1.1e15; largest 1.6e12, Switch-C)
 * and KV bytes per token at 16 bits, whole model (1 GiB; GPT-3 175B's
 * multi-head cache is 4.5 MiB).  With the token bound, one request's KV then
 * stays below 2^62 bytes. */
#define KVC_PLAN_MAX_PARAMS             (UINT64_C(1) << 50)
#define KVC_PLAN_MAX_KV_BYTES_PER_TOKEN (UINT64_C(1) << 30)
/* Bytes: a GPU's memory and L2, each measured override and the explicit KV
 * budget: 1 EiB (the largest GPU holds 288 GB).  Five such terms still fit a
 * signed 64-bit ledger. */
#define KVC_PLAN_MAX_BYTES              (UINT64_C(1) << 60)
/* Bandwidths (bytes/s) and FLOP rates: finite and at most 1e18 and 1e21 (HBM
 * runs at 8e12 B/s, a B200 at 4.5e15 fp8 FLOP/s). */
#define KVC_PLAN_MAX_RATE               1e18
#define KVC_PLAN_MAX_FLOPS              1e21
/* Engine limits: max_num_seqs 2^24, max_num_batched_tokens 2^30, --n and
 * --beams 1,024, tp x pp x dp 2^24 GPUs (the largest clusters hold ~2e5). */
#define KVC_PLAN_MAX_SEQS               (UINT32_C(1) << 24)
#define KVC_PLAN_MAX_BATCHED            (UINT32_C(1) << 30)
#define KVC_PLAN_MAX_FORKS              UINT32_C(1024)
#define KVC_PLAN_MAX_GPUS               (UINT64_C(1) << 24)

/* What a recurrent layer keeps per sequence (elements; bytes in the state's dtype).
 *   MAMBA1  Mamba's selective scan (Jamba's mixer): a conv state of (d_conv - 1) x d_inner and
 *           an SSM state of d_inner x d_state.
 *   MAMBA2  Mamba-2's SSD mixer (Mamba2ForCausalLM, Nemotron-H): a conv state of (d_conv - 1) x
 *           (d_inner + 2 x n_groups x d_state) (x, B and C pass the convolution) and an SSM
 *           state of heads x head_dim x d_state; d_inner = heads x head_dim.
 *   GDN     Gated DeltaNet (Qwen3-Next's linear attention): a conv state of (d_conv - 1) x
 *           (2 x key heads x key head dim + value heads x value head dim) (q, k and v) and a
 *           recurrent state of value heads x key head dim x value head dim.  Stored as MAMBA2's
 *           fields (heads = value heads, head_dim = value head dim, n_groups = key heads,
 *           d_state = key head dim), for which both formulas are the same.
 * vLLM's MambaStateShapeCalculator (mamba1/mamba2/gated_delta_net_state_shape) gives these. */
typedef enum {
    KVC_PLAN_RECURRENT_NONE = 0,
    KVC_PLAN_RECURRENT_MAMBA1,
    KVC_PLAN_RECURRENT_MAMBA2,
    KVC_PLAN_RECURRENT_GDN,
    KVC_PLAN_RECURRENT__COUNT
} kvc_plan_recurrent_t;
/* "none", "mamba1", "mamba2", "gated_deltanet"; "?" for an invalid value.  Never fails. */
KVC_API const char *kvc_plan_recurrent_name(kvc_plan_recurrent_t k);

/* ---- the model -------------------------------------------------------------
 * What the math needs from a transformer decoder.  A zeroed field means "not
 * present" (no MoE, no MLA, no sliding window, no images).  Each count is
 * bounded (see above); kvc_plan_model_check says which bound a model breaks.
 */
typedef struct {
    char name[64];       /* preset name or the config's file name */
    char model_type[32]; /* the config's model_type, "" when absent */
    uint32_t hidden_size;
    uint32_t n_layers;
    uint32_t n_heads;    /* query heads */
    uint32_t n_kv_heads; /* K/V heads (GQA); ignored for MLA */
    uint32_t head_dim;   /* query/key head width; MLA: qk_nope + qk_rope */
    uint32_t v_head_dim; /* value head width; head_dim unless MLA */
    uint32_t vocab_size;
    uint32_t intermediate_size; /* dense MLP width (gated: gate, up, down) */
    bool tie_embeddings;        /* the LM head reuses the input embedding */
    bool qkv_bias;              /* Q, K, V projections carry biases */
    /* mixture of experts (n_experts == 0: dense) */
    uint32_t n_experts;                       /* routed experts per MoE layer */
    uint32_t n_experts_active;                /* routed experts per token */
    uint32_t moe_intermediate_size;           /* one routed expert's width */
    uint32_t n_shared_experts;                /* each moe_intermediate_size wide */
    uint32_t shared_expert_intermediate_size; /* one shared expert of this width */
    uint32_t n_dense_layers;                  /* layers with a dense MLP instead */
    /* multi-head latent attention (DeepSeek-V2/V3) */
    bool mla;
    uint32_t q_lora_rank; /* 0: Q is projected directly */
    uint32_t kv_lora_rank;
    uint32_t qk_rope_head_dim;
    uint32_t qk_nope_head_dim;
    /* sliding-window attention */
    uint32_t sliding_window;   /* tokens; 0: every layer attends to everything */
    uint32_t n_sliding_layers; /* layers that use the window */
    bool chunked_attention;    /* those layers attend within chunks of sliding_window tokens
                                  (Llama 4): bounded like a window, planned as one */
    /* multimodal */
    uint32_t image_tokens;  /* KV tokens one image takes; 0: text only or unknown */
    uint64_t vision_params; /* the vision tower and its projector (a config's vision_config:
                               a ViT of its widths and a two-layer projector); 0: none.  Held
                               in 16 bits on the first stage, split by TP, run only on images:
                               never read by a decode step */
    /* the vision tower's widths (vision_config), for its activation peak; 0: not given */
    uint32_t vision_hidden;
    uint32_t vision_intermediate;
    uint32_t vision_layers;
    uint32_t vision_tokens; /* tokens one image enters the tower as: patches + the class token */
    uint64_t max_position_embeddings; /* 0: not given */
    /* recurrent and hybrid models (Jamba): some layers keep a fixed-size state per sequence, a
     * causal convolution's window and a selective-scan (SSM) state, instead of KV; the state
     * does not grow with the context.  recurrent NONE: every layer attends */
    kvc_plan_recurrent_t recurrent;
    uint32_t n_recurrent_layers; /* layers with a state instead of attention (derived) */
    uint32_t attn_layer_period;  /* hybrid: layer i attends iff i % period == offset */
    uint32_t attn_layer_offset;
    uint32_t moe_layer_period; /* MoE on layer i iff i % period == offset (Jamba's
                                  expert_layer_period); 0: the first n_dense_layers are dense */
    uint32_t moe_layer_offset;
    uint32_t ssm_d_inner;  /* the mixer's inner width: expand x hidden_size (MAMBA2, GDN:
                              heads x head_dim) */
    uint32_t ssm_d_state;  /* SSM state per inner channel (GDN: the key head dim) */
    uint32_t ssm_d_conv;   /* the convolution's kernel: the state keeps d_conv - 1 columns */
    uint32_t ssm_dt_rank;  /* MAMBA1: the time-step projection's rank */
    uint32_t ssm_n_heads;  /* MAMBA2: SSM heads; GDN: value heads */
    uint32_t ssm_head_dim; /* MAMBA2: channels per head; GDN: the value head dim */
    uint32_t ssm_n_groups; /* MAMBA2: groups sharing B and C; GDN: key heads */
    bool ssm_conv_bias;    /* the convolution has a bias */
    bool ssm_proj_bias;    /* in_proj and out_proj have biases */
    bool ssm_inner_norms;  /* Jamba: RMSNorms on dt, B and C (dt_rank + 2 x d_state weights) */
    /* Per-layer kinds (Nemotron-H's hybrid_override_pattern; a pure Mamba-2 model is all 'M'):
     * layer i is 'M' a recurrent mixer, '*' attention, '-' a dense MLP, 'E' MoE, each a block
     * of its own (one norm, no second sublayer).  "": every layer has a mixer (attention, or
     * recurrent by attn_layer_period) and an MLP (dense or MoE by the MoE fields). */
    char layer_pattern[KVC_PLAN_MAX_LAYERS + 1];
    bool mlp_ungated;      /* MLPs and experts are up + down (Nemotron-H's squared ReLU), not
                              gate + up + down */
    bool attn_output_gate; /* q_proj also yields a per-channel output gate (Qwen3-Next): the
                              query projection is 2 x heads x head_dim wide */
    /* The checkpoint's own weight format, from config.json's quantization_config: its
     * quant_method as written ("" when the config has none) and, when the planner knows it,
     * the dtype that sizes it (fp8, fbgemm_fp8: fp8; awq, gptq, bitsandbytes: int4 or int8 by
     * their bits; modelopt NVFP4: nvfp4).  The CLI plans with it unless --weight-dtype is
     * given, and refuses a quant_method it does not know rather than size it as bf16. */
    char checkpoint_quant[32];
    bool checkpoint_dtype_known;
    kvc_plan_dtype_t checkpoint_dtype;
} kvc_plan_model_t;

/* Parameter counts of a model, by part. */
typedef struct {
    uint64_t embedding;      /* vocab x hidden (the input table) */
    uint64_t lm_head;        /* vocab x hidden; 0 when tied to the embedding */
    uint64_t attention;      /* every layer's projections (and biases) */
    uint64_t mlp_dense;      /* every dense layer's gated MLP */
    uint64_t experts_routed; /* every routed expert of every MoE layer */
    uint64_t experts_shared;
    uint64_t router;
    uint64_t norms;
    uint64_t total;     /* the language model; the vision tower is counted apart */
    uint64_t active;    /* what one token touches: total minus the routed experts it skips */
    uint64_t vision;    /* the vision tower and projector (model.vision_params) */
    uint64_t recurrent; /* every recurrent layer's mixer (in place of attention; in total) */
} kvc_plan_param_count_t;

/* Count parameters (gated MLPs, RMSNorm weights, no biases beyond qkv_bias).
 * Cannot fail.  The model must have passed kvc_plan_model_check: its counts
 * then fit (the total is at most KVC_PLAN_MAX_PARAMS); an unchecked one past
 * the bounds gets counts reduced modulo 2^64 (no undefined behaviour). */
KVC_API void kvc_plan_model_params(const kvc_plan_model_t *m, kvc_plan_param_count_t *out);

/* Check that a model is complete, consistent and within the bounds above.
 * Returns 0, or KVC_EINVAL with one line in msg (msg may be NULL) naming what
 * is wrong: a required field that is zero, a field past its bound ("<field> <v>
 * is out of range: at most <bound>"), KV heads that do not divide the query
 * heads, an MLA head_dim that is not nope + rope, more active experts than
 * experts, more dense or sliding layers than layers, sliding layers without a
 * window, KV bytes per token past KVC_PLAN_MAX_KV_BYTES_PER_TOKEN or
 * parameters past KVC_PLAN_MAX_PARAMS; for a recurrent model a zero mixer width
 * (d_inner, d_state, d_conv; dt_rank for MAMBA1; heads, head_dim, groups for
 * MAMBA2 and GDN), d_inner that is not heads x head_dim or groups that do not
 * divide the heads (MAMBA2, GDN), an unknown kind, MLA, an attention or MoE
 * offset not below its period, a recurrent or dense layer count the periods (or
 * the layer pattern) do not give, more sliding layers than attention layers;
 * recurrent layers without a kind; a layer pattern whose length is not the
 * layer count, with a letter other than M * - E, with periods as well, with 'E'
 * and no experts or 'M' and no recurrent kind; or m NULL.  A model without
 * attention layers (pure Mamba-2) needs no attention fields and has no KV.
 * Reads only *m. */
KVC_API int kvc_plan_model_check(const kvc_plan_model_t *m, char *msg, size_t msg_len);

/* KV bytes one token takes in the whole model, one copy, with K/V stored as
 * kv_dtype: 2 x layers x KV heads x head_dim elements, or for MLA the latent
 * plus the RoPE key per layer.  The formula every plan uses.  The model must
 * have passed kvc_plan_model_check (the product then fits). */
KVC_API uint64_t kvc_plan_kv_bytes_per_token(const kvc_plan_model_t *m, kvc_plan_dtype_t kv_dtype);

/* Built-in model presets, their numbers written in the source from the
 * public config.json files named there.  Lookup is case-insensitive.
 * Returns 0, KVC_ENOENT (no such preset, or name NULL) or KVC_EINVAL (out
 * NULL). */
KVC_API int kvc_plan_model_preset(const char *name, kvc_plan_model_t *out);
/* How many presets there are.  Never fails. */
KVC_API size_t kvc_plan_model_preset_count(void);
/* The i-th preset's name (static), or NULL past the end.  Never fails. */
KVC_API const char *kvc_plan_model_preset_name(size_t i);

/* Read a Hugging Face config.json held in text[0..len).  Reads what the math
 * needs (see the field comments); a multimodal config's nested text_config
 * wins over its top level; a vision_config is sized as a ViT of its widths (its
 * hidden_size, intermediate_size, num_hidden_layers, patch_size and image_size
 * are then required) plus a two-layer projector; unknown fields are ignored,
 * except those of recurrent and hybrid models: Jamba's (model_type jamba, or
 * attn_layer_period / mamba_d_state: Mamba-1 layers with attention every
 * attn_layer_period-th layer and MoE every expert_layer_period-th) are modelled;
 * the others (Mamba, Mamba2, Nemotron-H, Qwen3-Next, ...: layers_block_type,
 * hybrid_override_pattern, full_attention_interval, ssm_state_size, a layer_types
 * entry that is not attention, such a model_type) change memory in ways the
 * planner does not model and are refused (KVC_EINVAL, naming the field) rather
 * than sized as attention.  The text must be one
 * JSON object and nothing else.  Fails, with one line in msg naming what and
 * where, and *out untouched, with
 *   KVC_EPARSE  malformed JSON; a NUL byte or a raw control byte anywhere;
 *               text after the value; a top level that is not an object; a
 *               field of the wrong type (not a positive integer, a boolean,
 *               an array); also an allocation failure inside the JSON parser,
 *               which cJSON does not tell apart from malformed text;
 *   KVC_EINVAL  a field the math needs missing, a field past its bound (the
 *               key as the config spells it), or any kvc_plan_model_check
 *               failure; text or out NULL.
 * `name` (may be NULL) goes into out->name, truncated to fit. */
KVC_API int kvc_plan_model_from_json(const char *text, size_t len, const char *name,
                                     kvc_plan_model_t *out, char *msg, size_t msg_len);
/* As kvc_plan_model_from_json, reading the file at path (at most 16 MiB);
 * out->name is the file's name, or its folder's for a config.json.  Fails also
 * with KVC_EIO (cannot open or read), KVC_EOVERFLOW (over 16 MiB), KVC_ENOMEM
 * (no memory for the buffer) or KVC_EINVAL (path or out NULL).  Messages
 * quote the path with its control bytes escaped (\xNN). */
KVC_API int kvc_plan_model_load(const char *path, kvc_plan_model_t *out, char *msg, size_t msg_len);

/* ---- the GPU ------------------------------------------------------------- */
typedef struct {
    char name[32];
    uint64_t memory_bytes;           /* what the runtime reports as total (cudaMemGetInfo) */
    double hbm_bytes_per_s;          /* peak memory bandwidth */
    double bf16_flops;               /* dense bf16/fp16 tensor FLOP/s */
    double fp8_flops;                /* dense fp8 tensor FLOP/s; 0: no fp8 tensor cores */
    uint64_t l2_bytes;               /* last on-die cache before HBM */
    double interconnect_bytes_per_s; /* GPU to GPU, per direction; 0: none */
    double pcie_bytes_per_s;         /* host link, per direction */
} kvc_plan_gpu_t;

/* Presets: "a100-80gb-sxm", "a100-40gb", "h100-sxm", "h100-pcie", "h200", "b200", "l40s",
 * "mi300x" (case-insensitive; also "a100", "h100").  Each value's public
 * source is named in the source.  Returns 0, KVC_ENOENT (no such preset, or
 * name NULL) or KVC_EINVAL (out NULL). */
KVC_API int kvc_plan_gpu_preset(const char *name, kvc_plan_gpu_t *out);
/* How many presets there are; the i-th one's canonical name (static) or NULL
 * past the end.  Never fail. */
KVC_API size_t kvc_plan_gpu_preset_count(void);
KVC_API const char *kvc_plan_gpu_preset_name(size_t i);
/* Check the numbers are usable: memory > 0 and, with L2, at most
 * KVC_PLAN_MAX_BYTES; bandwidth and bf16 FLOP/s > 0; no rate negative, NaN or
 * past KVC_PLAN_MAX_RATE / KVC_PLAN_MAX_FLOPS (so never inf).  Returns 0, or
 * KVC_EINVAL with one line in msg (also for g NULL). */
KVC_API int kvc_plan_gpu_check(const kvc_plan_gpu_t *g, char *msg, size_t msg_len);

/* ---- quantities with units ------------------------------------------------
 * "80GiB", "85GB", "512 MiB", "1.5e9", "1234" (bytes).  Decimal prefixes
 * (kB, MB, GB, TB) are powers of 1000, binary ones (KiB, MiB, GiB, TiB) of
 * 1024; units are case-insensitive.  Returns 0, or KVC_EINVAL (*out untouched)
 * for junk, a sign, an unknown unit, NaN, a number or product with its unit
 * that is not finite, 2^63 bytes or more, or an argument NULL. */
KVC_API int kvc_plan_parse_bytes(const char *s, uint64_t *out);
/* A rate in bytes per second: "3.35TB/s", "900GB/s", "64 GiB/s"; a bare
 * number means GB/s.  Returns 0, or KVC_EINVAL (*out untouched) as
 * kvc_plan_parse_bytes does, for a product that is not finite (1e300TB/s)
 * among them. */
KVC_API int kvc_plan_parse_rate(const char *s, double *out);

/* ---- the deployment -------------------------------------------------------- */
/* How a deployment extends the context past the trained length (a config's rope_scaling). */
typedef enum {
    KVC_PLAN_ROPE_NONE = 0,
    KVC_PLAN_ROPE_LINEAR, /* position interpolation */
    KVC_PLAN_ROPE_YARN,
    KVC_PLAN_ROPE_LLAMA3,
    KVC_PLAN_ROPE__COUNT
} kvc_plan_rope_t;
/* "none", "linear", "yarn", "llama3"; "?" for an invalid value.  Never fails. */
KVC_API const char *kvc_plan_rope_name(kvc_plan_rope_t r);
/* Parse "TYPE:FACTOR" (linear, yarn, llama3; FACTOR a number > 1 and at most 1024).  Returns
 * 0, or KVC_EINVAL (*type and *factor untouched) for anything else or an argument NULL. */
KVC_API int kvc_plan_rope_parse(const char *s, kvc_plan_rope_t *type, double *factor);

typedef struct {
    uint32_t tp, pp, dp; /* tensor, pipeline, data parallel sizes */
    /* context parallelism (ring attention): each request's KV split over cp GPUs, each holding
     * 1/cp of its tokens; the ring passes K/V blocks per layer.  1 (0 reads as 1): none */
    uint32_t cp;
    uint32_t gpus_per_node;       /* a TP x CP group larger than this rings over the inter-node
                                     link (link_bytes_per_s); 0 reads as 8 */
    kvc_plan_rope_t rope_scaling; /* NONE: max_model_len <= max_position_embeddings */
    double rope_factor; /* > 1 with a scaling: max_model_len <= factor x max_position_embeddings */
    kvc_plan_dtype_t weight_dtype;
    kvc_plan_dtype_t kv_dtype;
    uint32_t block_size;           /* tokens per KV block: a power of two, 1..1024 */
    double gpu_memory_utilization; /* (0, 1]: the share of memory the engine budgets */
    uint64_t max_model_len;        /* 0: the model's max_position_embeddings */
    /* 0 (the default): vLLM's own default for this GPU (EngineArgs.get_batch_defaults, the
     * OpenAI server's: 1,024 sequences and 8,192 tokens on a GPU of 70 GiB or more that is
     * not an A100, else 256 and 2,048; then max_num_seqs <= max_num_batched_tokens and
     * max_num_batched_tokens <= max_num_seqs x max_model_len).  The result's params hold
     * the values used. */
    uint32_t max_num_seqs;
    uint32_t max_num_batched_tokens; /* the step's token budget (chunked prefill) */
    /* the typical request */
    uint64_t prompt_tokens;
    uint64_t output_tokens;
    uint64_t context_tokens; /* sections 5 and 6; 0: prompt + output */
    bool window_freeing;     /* free out-of-window blocks of sliding layers */
    /* measured (or, for the KV budget, configured) overrides; KVC_PLAN_AUTO: estimate */
    uint64_t weight_bytes;       /* per GPU, as an engine logs after loading */
    uint64_t activation_bytes;   /* the profile run's peak */
    uint64_t cuda_graph_bytes;   /* as logged after graph capture */
    uint64_t non_torch_bytes;    /* NCCL buffers, workspaces: outside the framework allocator */
    uint64_t cuda_context_bytes; /* the driver context, present before the engine starts */
    uint64_t kv_cache_bytes;     /* an explicit KV budget (like --kv-cache-memory-bytes) */
    bool enforce_eager;          /* no CUDA graphs */
    bool graphs_outside_budget;  /* graphs captured after the pool, in the slack (older engines) */
    /* forks */
    uint32_t n_samples; /* parallel sampling width */
    uint32_t beams;     /* beam width */
    /* throughput model */
    double arrival_rate; /* requests per second, whole deployment; 0: half the sustainable rate */
    double mfu;          /* achieved share of peak FLOP/s, (0, 1] */
    double mbu;          /* achieved share of peak memory bandwidth, (0, 1] */
    /* disaggregated prefill */
    double link_bytes_per_s;     /* prefill-to-decode link per GPU */
    double prefill_tokens_per_s; /* per replica, measured; 0: estimate */
    /* tiers */
    double host_bytes_per_s;      /* 0: the GPU's PCIe link */
    double nvme_bytes_per_s;      /* per GPU */
    double network_bytes_per_s;   /* per GPU, to a remote KV store */
    double ssd_endurance_bytes;   /* the drive's rated write volume (TBW) */
    double ssd_write_bytes_per_s; /* 0: the KV a prefill GPU emits */
    /* speculative decoding */
    uint32_t spec_tokens;       /* draft tokens per sequence per step */
    double spec_acceptance;     /* per-token acceptance rate, [0, 1] */
    uint64_t spec_draft_params; /* the draft model's parameters; 0: drafts cost nothing
                                   (prompt lookup / n-gram) */
    /* tenancy */
    uint64_t tenant_tokens; /* one more request length to price; 0: none */
    /* comparisons: re-plan for every weight dtype x KV dtype pair (the result's dtype_grid) */
    bool grid_dtypes;
    /* LoRA adapters served S-LoRA style: rank, adapters in all, adapters resident in GPU memory
     * (taken from the KV pool, as S-LoRA's unified paging does); 0: none */
    uint32_t lora_rank;
    uint32_t lora_adapters;
    uint32_t lora_resident;
    /* recurrent state (a model with recurrent layers) */
    bool ssm_state_fp32; /* the SSM state in fp32 (vLLM's --mamba-ssm-cache-dtype float32);
                            false: 16 bits, the model's dtype (vLLM's auto) */
    uint64_t state_checkpoint_interval; /* tokens between the states prefix caching keeps of a
                                           cached prompt; 0 reads as 512 */
    uint64_t cached_prefixes;           /* cached prompts to price (section 15); 0 reads as 100 */
    /* multimodal (a model with image tokens) */
    uint32_t images_per_request;   /* images in the typical request (vLLM's --limit-mm-per-prompt
                                      caps them); 0 reads as 1 */
    uint64_t encoder_cache_tokens; /* the encoder cache and compute budget in embedding tokens;
                                      0: max(max_num_batched_tokens, image tokens), as vLLM's
                                      compute_encoder_budget */
} kvc_plan_params_t;

/* TP/PP/DP 1, bf16 weights and KV, block 16, utilization 0.9, max_model_len
 * from the model, max_num_seqs and max_num_batched_tokens 0 (vLLM's defaults for
 * the GPU, see above), 1000-token prompts with
 * 200-token outputs, window freeing on, every byte estimated, graphs inside
 * the budget, 4 samples, 4 beams, MFU 0.5, MBU 0.8, a 50 GB/s
 * disaggregation link, host link from the GPU, 7 GB/s NVMe, 12.5 GB/s network,
 * an arrival rate of half the sustainable one (arrival_rate 0), a 7,008 TB-rated
 * SSD, no speculation (acceptance 0.7 for the table). */
KVC_API kvc_plan_params_t kvc_plan_params_default(void); /* never fails */

/* ---- the result ------------------------------------------------------------ */
typedef enum { KVC_PLAN_MEASURED = 0, KVC_PLAN_ESTIMATED, KVC_PLAN_CONFIGURED } kvc_plan_kind_t;
/* "measured", "estimated", "configured"; "?" for an invalid value.  The name
 * functions below never fail either. */
KVC_API const char *kvc_plan_kind_name(kvc_plan_kind_t k);

/* How a ledger line enters the arithmetic. */
typedef enum {
    KVC_PLAN_OP_TOTAL = 0, /* memory visible */
    KVC_PLAN_OP_BUDGET,    /* visible x utilization (or the explicit KV budget's total) */
    KVC_PLAN_OP_SUBTRACT,  /* taken from the budget before the KV pool */
    KVC_PLAN_OP_OUTSIDE,   /* lives outside the budget, in the slack */
    KVC_PLAN_OP_REMAINDER  /* what is left: the KV pool */
} kvc_plan_op_t;
/* "total", "budget", "subtract", "outside", "remainder". */
KVC_API const char *kvc_plan_op_name(kvc_plan_op_t op);

typedef struct {
    const char *name; /* static: "memory_visible", "budget", "weights", ... */
    uint64_t bytes;
    kvc_plan_kind_t kind;   /* what our number is */
    kvc_plan_kind_t engine; /* how an engine such as vLLM gets it */
    kvc_plan_op_t op;
} kvc_plan_ledger_entry_t;

typedef enum {
    KVC_PLAN_PHASE_INIT = 0,       /* free memory at startup >= the budget */
    KVC_PLAN_PHASE_LOAD_WEIGHTS,   /* weights fit in the device */
    KVC_PLAN_PHASE_PROFILE,        /* weights + a forward at the token budget fit */
    KVC_PLAN_PHASE_ALLOCATE_KV,    /* the budget leaves at least one block */
    KVC_PLAN_PHASE_CHECK_MAX_LEN,  /* one request of max_model_len fits the pool */
    KVC_PLAN_PHASE_CAPTURE_GRAPHS, /* graphs fit where the engine puts them */
    KVC_PLAN_PHASE__COUNT
} kvc_plan_phase_id_t;
/* "init", "load_weights", "profile", "allocate_kv_pool", "check_max_model_len",
 * "capture_cuda_graphs". */
KVC_API const char *kvc_plan_phase_name(kvc_plan_phase_id_t id);

typedef enum {
    KVC_PLAN_PHASE_OK = 0,
    KVC_PLAN_PHASE_FAILED,
    KVC_PLAN_PHASE_SKIPPED,    /* e.g. graph capture with enforce_eager */
    KVC_PLAN_PHASE_NOT_REACHED /* an earlier phase failed */
} kvc_plan_phase_status_t;
/* "ok", "failed", "skipped", "not reached". */
KVC_API const char *kvc_plan_phase_status_name(kvc_plan_phase_status_t s);

typedef struct {
    kvc_plan_phase_status_t status;
    uint64_t need_bytes; /* what the phase needs, per GPU */
    uint64_t have_bytes; /* what it has */
    uint32_t stage;      /* the pipeline stage the numbers are for */
} kvc_plan_phase_t;

typedef enum {
    KVC_PLAN_CEIL_KV_MEMORY = 0,
    KVC_PLAN_CEIL_COMPUTE,
    KVC_PLAN_CEIL_MAX_NUM_SEQS,
    KVC_PLAN_CEIL_MAX_NUM_BATCHED_TOKENS,
    KVC_PLAN_CEIL__COUNT
} kvc_plan_ceiling_id_t;
/* "kv_memory", "compute", "max_num_seqs", "max_num_batched_tokens". */
KVC_API const char *kvc_plan_ceiling_name(kvc_plan_ceiling_id_t id);

#define KVC_PLAN_LEDGER_MAX     9
#define KVC_PLAN_SWEEP_MAX      8
#define KVC_PLAN_TIERS          4
#define KVC_PLAN_SPEC_ROWS      5
#define KVC_PLAN_TENANT_MAX     3
#define KVC_PLAN_SPEC_BEST_ROWS 7
#define KVC_PLAN_SPEC_MAX_BATCH 16384
#define KVC_PLAN_RECOMPUTE_ROWS 5
#define KVC_PLAN_LAYOUT_ROWS    10
#define KVC_PLAN_GRID_ROWS      20

typedef struct {
    uint32_t tp;
    uint32_t kv_heads_per_gpu; /* MLA: 1 latent */
    uint32_t replication;      /* copies of each KV head across the TP group */
    uint64_t kv_bytes_per_token_per_gpu;
    uint64_t weight_bytes_per_gpu;
} kvc_plan_tp_row_t;

typedef struct {
    const char *name; /* "hbm", "host", "nvme", "network" */
    double bytes_per_s;
    double latency_s;           /* per transfer, estimated */
    double fetch_s_per_token;   /* KV bytes per GPU / bandwidth */
    double speedup;             /* recompute time / fetch time (> 1: fetching wins) */
    uint64_t min_tokens_to_win; /* smallest copy that beats recomputing; UNBOUNDED: never */
    double max_shared_fraction; /* share of the link others may take before fetching loses */
} kvc_plan_tier_t;

typedef struct {
    uint32_t spec_tokens;
    uint32_t max_batch_by_tokens; /* floor(max_num_batched_tokens / (1 + k)) */
    uint64_t compute_bound_batch; /* batch above which verification is compute-bound */
    double tokens_per_step;       /* expected tokens per sequence per step: 1 + a + ... + a^k */
    uint32_t kv_slots_per_seq;    /* lookahead slots reserved for drafts */
    /* Tokens/s with speculation over tokens/s without, under the same roofline: a step
     * verifying k drafts costs max((weights + KV) / bandwidth, (1 + k) x B x FLOP per token
     * / peak) plus the draft's k steps of max(its weights / bandwidth, B x its FLOP / peak). */
    double speedup_at_batch_1;
    /* The smallest batch from which speculation is slower than plain decode, up to
     * KVC_PLAN_SPEC_MAX_BATCH; UNBOUNDED: it never loses there. */
    uint64_t loses_from_batch;
} kvc_plan_spec_row_t;

/* One weight dtype x KV dtype pair of the same deployment. */
typedef struct {
    kvc_plan_dtype_t weight_dtype, kv_dtype;
    bool fits;
    int failed_phase; /* a kvc_plan_phase_id_t, or -1 */
    uint64_t weight_bytes_per_gpu;
    uint64_t kv_pool_bytes_per_gpu;
    uint64_t max_concurrency; /* typical requests resident at once (ceiling) */
    uint64_t max_model_len_that_fits;
} kvc_plan_grid_row_t;

/* One TP x CP layout of a long-context deployment. */
typedef struct {
    uint32_t tp, cp, gpus;
    kvc_plan_dtype_t kv_dtype;
    bool fits;       /* every startup phase passes (one max_model_len request fits) */
    bool inter_node; /* tp x cp > gpus_per_node: the ring crosses nodes */
    uint64_t kv_bytes_per_request_per_gpu; /* at the context */
    uint64_t weight_bytes_per_gpu;
    double prefill_seconds;       /* one request at the context, over the tp x cp GPUs */
    uint64_t ring_bytes_per_step; /* per GPU, per layer and ring step */
    bool ring_hidden;             /* the transfer takes no longer than the step's attention */
} kvc_plan_layout_t;

/* The best draft count at one batch size (k 0: speculation does not pay). */
typedef struct {
    uint32_t batch;
    uint32_t best_k; /* 0..8 */
    double speedup;  /* tokens/s at best_k over tokens/s at k 0 */
} kvc_plan_spec_best_t;

/* Recomputing a cached prefix of n tokens: linear FLOPs per token plus attention FLOPs,
 * which grow with the prefix (each token attends to those before it). */
typedef struct {
    uint64_t prefix_tokens;
    double recompute_s_per_token;  /* per GPU at the achieved FLOP/s, attention included */
    double attention_extra;        /* attention time / linear time */
    double break_even_bytes_per_s; /* per GPU: faster links fetch */
} kvc_plan_recompute_row_t;

typedef struct {
    uint64_t tokens;
    uint64_t bytes_per_gpu;
    double pool_share; /* of one GPU's KV pool */
    uint64_t per_pool; /* how many such requests fit at once */
} kvc_plan_tenant_row_t;

typedef struct {
    /* the inputs, copied and resolved */
    kvc_plan_model_t model;
    kvc_plan_gpu_t gpu;
    kvc_plan_params_t params;
    kvc_plan_param_count_t counts;
    uint64_t max_model_len;  /* resolved */
    uint64_t context_tokens; /* resolved */
    bool max_num_seqs_auto;  /* params.max_num_seqs was 0: vLLM's default for the GPU */
    bool max_num_batched_tokens_auto;
    uint32_t n_gpus;   /* tp x pp x dp */
    double peak_flops; /* the rate used: fp8 when weights are fp8 and the GPU has it */
    bool fp8_compute;

    /* 1. KV bytes per token */
    uint64_t kv_bytes_per_token;         /* whole model, one copy */
    uint64_t kv_bytes_per_token_per_gpu; /* the binding pipeline stage */
    uint32_t kv_heads_per_gpu;           /* MLA: 1 latent */
    uint32_t layers_per_gpu;             /* the binding stage's */
    uint32_t sliding_layers_per_gpu;     /* of those, the windowed ones */
    uint64_t kv_bytes_per_token_per_layer_per_gpu;
    uint32_t kv_head_replication; /* copies of each head (MLA: of the latent) per replica */
    uint64_t kv_replicated_bytes_per_token; /* per replica, copies beyond the first */
    uint32_t max_tp_without_replication;
    uint32_t n_tp_rows;
    kvc_plan_tp_row_t tp_rows[KVC_PLAN_SWEEP_MAX];

    /* 2. ledger (per GPU, binding stage) */
    uint64_t weight_bytes_total; /* one replica's weights, no copies */
    uint64_t weight_bytes_per_gpu;
    uint64_t weight_linear_params_per_gpu; /* projections, in the weight dtype */
    uint64_t weight_wide_params_per_gpu;   /* embeddings, norms, biases, router: 16 bits */
    uint64_t activation_bytes;
    uint64_t activation_forward_bytes;   /* the forward part of the estimate */
    uint64_t activation_sampler_bytes;   /* the sampler part */
    uint64_t activation_elems_per_token; /* values one token keeps live in the widest layer */
    uint64_t cuda_graph_bytes;
    uint32_t n_cuda_graphs;
    uint32_t max_graph_batch;
    uint64_t non_torch_bytes;
    uint64_t cuda_context_bytes;
    uint64_t budget_bytes;
    int64_t kv_pool_signed_bytes; /* negative when the budget is overdrawn */
    uint64_t kv_pool_bytes_per_gpu;
    uint64_t num_blocks;
    uint64_t pool_tokens;
    uint32_t n_ledger;
    kvc_plan_ledger_entry_t ledger[KVC_PLAN_LEDGER_MAX];
    uint32_t binding_stage; /* the stage with the fewest blocks (engines take the minimum) */

    /* 3. startup */
    bool fits;
    int failed_phase; /* a kvc_plan_phase_id_t, or -1 */
    kvc_plan_phase_t phases[KVC_PLAN_PHASE__COUNT];
    uint64_t max_model_len_that_fits; /* the largest max_model_len the pool holds */
    /* when it does not start: re-plans with one input changed */
    uint32_t suggest_tp;        /* the smallest larger TP that starts; 0: none up to 64 */
    bool suggest_fp8_kv_fits;   /* fp8 KV alone would make it start */
    double suggest_utilization; /* the utilization that holds max_model_len; 0: none */

    /* 4. concurrency and ceilings */
    uint64_t request_tokens; /* prompt + output */
    uint64_t blocks_per_request;
    uint64_t partial_block_waste_tokens;
    uint64_t kv_bytes_per_request; /* per GPU, block-rounded, window freeing applied */
    uint64_t max_concurrency;      /* ceiling: sequences resident at once */
    uint64_t admitted_at_prompt;   /* how many fit if each holds only its prompt + 1 token */
    double ridge_flops_per_byte;   /* peak FLOP/s / peak bytes/s */
    uint64_t decode_context;       /* prompt + output / 2: the average context while decoding */
    double decode_flops_per_seq;   /* per GPU per step, linear + attention */
    double decode_attention_flops_per_seq; /* the attention part, run at the bf16 rate */
    double decode_bytes_per_seq;           /* KV read per GPU per step */
    double weight_read_bytes;              /* per GPU per step at batch 1 */
    /* the input embedding table on the binding stage: a step reads one row per token, not
     * the table (a tied table is read whole, as the LM head, and is not counted here) */
    uint64_t embedding_bytes_not_read;
    uint64_t vision_bytes_per_gpu; /* the vision tower's shard on the binding stage (in the
                                      weights, not read by a decode step) */
    uint64_t ceilings[KVC_PLAN_CEIL__COUNT]; /* UNBOUNDED where none */
    uint64_t compute_weights_only;           /* the ridge batch ignoring KV reads */
    double compute_weights_only_exact;       /* the real-valued crossover (dense models;
                                                0 for MoE, whose reads grow with the batch) */
    kvc_plan_ceiling_id_t binding_ceiling;

    /* 5. sliding windows */
    uint64_t kv_bytes_per_request_model; /* whole model at the context, with freeing */
    uint64_t swa_bytes_with_freeing;     /* whole model at the context */
    uint64_t swa_bytes_without_freeing;
    double sliding_window_saving;       /* 1 - with / without */
    double sliding_window_saving_limit; /* windowed layers / layers */

    /* 6. prefill FLOPs at the context */
    double prefill_linear_flops;
    double prefill_attention_flops;
    double prefill_attention_flops_fraction;

    /* 7. forks (per GPU) */
    uint64_t fork_unshared_bytes_samples;
    uint64_t fork_shared_bytes_samples;
    uint64_t fork_unshared_bytes_beams;
    uint64_t fork_shared_bytes_beams;          /* beams share history: one private block each */
    uint64_t fork_shared_bytes_beams_diverged; /* worst case: diverged at the first token */

    /* 8. disaggregated prefill */
    double prompt_linear_flops; /* one typical prompt, whole model */
    double prompt_attention_flops;
    double prefill_work_s;       /* one prompt in GPU-seconds at the achieved rates */
    double prefill_tokens_per_s; /* per replica */
    kvc_plan_kind_t prefill_rate_kind;
    double prefill_kv_bytes_per_s; /* per replica */
    double prefill_kv_bytes_per_s_per_gpu;
    double prefill_kv_bytes_per_s_linear_only; /* per GPU, attention ignored: P cancels */
    double link_utilization;                   /* per-GPU emission / link */
    double link_limited_tokens_per_s;          /* per replica */

    /* 9. recompute vs fetch */
    double recompute_s_per_token; /* per GPU at the achieved FLOP/s, linear layers only
                                     (a short prefix) */
    kvc_plan_recompute_row_t recompute[KVC_PLAN_RECOMPUTE_ROWS]; /* by prefix length */
    /* Copy granularity over the host link: a copy of S bytes takes S / bandwidth + the tier's
     * setup latency; per-layer and per-block copies are small and fall below the break-even
     * bandwidth that larger copies meet.  Rows: one layer of one block, one block (all the
     * stage's layers), the typical prompt's prefix at once. */
    uint64_t copy_bytes[3];
    double copy_bytes_per_s[3]; /* effective */
    /* A memory-bound decode step streams the weights anyway: prefix tokens recomputed in it
     * cost nothing until its compute catches up with its memory time.  Tokens that ride free
     * per step at batch 1 and at Little's resident N (section 10). */
    /* Decode attention's arithmetic intensity: attention FLOPs per KV byte read, per GPU.
     * GQA: 2 x group / bytes per element (each KV head serves its query group); MLA
     * (absorbed): every query head reads the one latent, 2 x heads x (576 + 512) / 576 B per
     * element at TP 1, divided by TP (each GPU reads the whole latent for its share of heads) */
    double attention_flops_per_kv_byte;
    /* MLA under TP against data-parallel attention (each GPU attends for its own requests
     * with all heads: no latent copies, the pool holds tp x the tokens; the MoE or MLP part
     * then needs an all-to-all, dispatch and combine, of each token's hidden state per layer
     * in place of TP's two all-reduces).  Bytes per token per layer per GPU over the link. */
    uint64_t dp_attention_pool_tokens;
    double dp_attention_flops_per_kv_byte;
    double dp_attention_comm_bytes_per_token_layer; /* 2 x hidden x 2 B x (tp - 1) / tp */
    double tp_comm_bytes_per_token_layer; /* 2 all-reduces: 2 x 2 x hidden x 2 B x (tp - 1) / tp */
    uint64_t recompute_free_tokens_batch_1;
    uint64_t recompute_free_tokens_at_n;
    uint32_t n_recompute;
    double break_even_bytes_per_s; /* per GPU */
    kvc_plan_tier_t tiers[KVC_PLAN_TIERS];
    double ssd_write_bytes_per_s;
    double ssd_endurance_days;

    /* 10. Little's law (per replica) */
    double arrival_rate;    /* whole deployment, resolved */
    bool arrival_rate_auto; /* chosen as half the sustainable rate */
    double arrival_rate_per_replica;
    bool little_stable;
    double little_resident;       /* N = lambda x T(N) */
    double little_time_in_system; /* T at N */
    double little_step_s;         /* decode step at N */
    double little_prefill_s;
    double little_naive_resident;   /* lambda x T(1): what ignoring the fixed point gives */
    double little_max_arrival_rate; /* per replica: the largest with a fixed point under the
                                       ceilings */
    bool little_max_by_ceiling;     /* that rate is set by the ceilings (else by throughput) */
    int little_iterations;

    /* 11. speculative decoding */
    kvc_plan_spec_row_t spec[KVC_PLAN_SPEC_ROWS];
    uint32_t n_spec;
    uint64_t spec_context;             /* the decode context the rows are priced at */
    uint64_t spec_draft_bytes_per_gpu; /* the draft model's weights, read every draft step */
    kvc_plan_spec_best_t spec_best[KVC_PLAN_SPEC_BEST_ROWS];
    uint32_t n_spec_best;

    /* 13. long context and context parallelism (the context of sections 5 and 6) */
    uint64_t kv_bytes_per_request_context;   /* whole model, one copy, at the context */
    uint64_t kv_bytes_per_request_per_gpu;   /* per GPU, 1/cp of the tokens, block-rounded */
    uint64_t max_position_embeddings_scaled; /* the context rope scaling allows; 0: none */
    double prefill_seconds;     /* one request at the context over tp x cp GPUs (PP stages in turn),
                                   at the achieved rates */
    uint64_t ring_chunk_tokens; /* ceil(context / cp): each GPU's share */
    uint64_t ring_bytes_per_step; /* per GPU per layer per ring step: its chunk's K/V */
    double ring_link_bytes_per_s; /* the GPU link, or the inter-node link past a node */
    double ring_step_s;           /* one step's transfer */
    double ring_attention_step_s; /* one step's attention, which the transfer hides behind */
    bool ring_hidden;
    bool ring_inter_node;
    /* Decode under CP: each rank attends over its 1/cp of the context, and the partial results
     * (per query head the output vector, its running max and its sum, fp32) are all-gathered
     * per attention layer and combined.  Per GPU: (cp - 1) x heads/GPU x (d_v + 2) x 4 B per
     * token and layer (MLA: d_v is the 512-wide latent the absorbed form outputs); each layer's
     * exchange also pays a collective's latency.  Priced at batch 1 and at the batch the
     * ceilings allow, against the decode step at the achieved rates. */
    uint64_t cp_decode_bytes_per_token_layer;
    uint32_t cp_decode_layers;  /* the binding stage's attention layers: one exchange each */
    double cp_decode_latency_s; /* per exchange: within a node, or between nodes */
    uint64_t cp_decode_batch;   /* the second row's batch: the binding ceiling */
    double cp_decode_comm_s[2]; /* per step: layers x (batch x bytes / link + latency) */
    double cp_decode_step_s[2]; /* the decode step without the exchange */
    kvc_plan_layout_t layouts[KVC_PLAN_LAYOUT_ROWS]; /* computed for long contexts (>= 65,536
                                                        tokens) or cp > 1 */
    uint32_t n_layouts;
    uint32_t n_layouts_same_gpus; /* the first rows keep the plan's GPU count; then what
                                     replaces it when none fits: more CP ranks (across nodes),
                                     fp8 KV */

    /* LoRA (params.lora_rank): one adapter on q, k, v, o, gate, up and down of every layer, A
     * (in x rank) and B (rank x out) in 16 bits; split by TP */
    uint64_t lora_adapter_bytes;          /* one adapter, whole model */
    uint64_t lora_adapter_bytes_per_gpu;  /* on the binding stage */
    uint64_t lora_resident_bytes_per_gpu; /* lora_resident of them, out of the KV pool */
    uint64_t lora_pool_tokens_lost;       /* KV tokens per replica those bytes would hold */
    uint64_t lora_prefix_blocks;          /* a prompt shared by requests of every resident
                                             adapter is cached once per adapter (KV depends on
                                             the adapter: no reuse across adapters) */

    /* comparisons (params.grid_dtypes): weights bf16, fp8, int8, int4, nvfp4 x KV bf16, fp8,
     * int8, nvfp4 */
    kvc_plan_grid_row_t dtype_grid[KVC_PLAN_GRID_ROWS];
    uint32_t n_dtype_grid;

    /* 12. tenancy */
    kvc_plan_tenant_row_t tenants[KVC_PLAN_TENANT_MAX];
    uint32_t n_tenants;
    uint64_t tokens_per_percent;    /* KV tokens in 1% of the pool */
    bool tenant_over_max_model_len; /* params.tenant_tokens > max_model_len: the engine would
                                       refuse such a request; it is priced anyway */
    uint64_t image_bytes_per_gpu; /* KV one image adds (image_tokens x bytes per token); 0: none */

    /* 15. recurrent state (model.recurrent): a sequence's state does not grow with its length.
     * kv_bytes_per_request and kvc_plan_request_bytes include it; everything per GPU is on
     * the binding stage, split by TP (each GPU holds d_inner / tp channels) */
    uint32_t kv_layers_per_gpu; /* attention layers of the binding stage (all its layers
                                   without recurrent ones) */
    uint32_t recurrent_layers_per_gpu;
    uint64_t conv_state_bytes_per_layer; /* one sequence and layer, whole model: (d_conv - 1) x
                                            d_inner x 2 B */
    uint64_t ssm_state_bytes_per_layer;  /* d_inner x d_state x 2 B (4 B in fp32) */
    uint64_t state_bytes_per_seq;        /* whole model: recurrent layers x (conv + SSM) */
    uint64_t state_bytes_per_seq_per_gpu;
    uint64_t all_attention_kv_bytes_per_token; /* the same widths with every layer attending */
    uint64_t state_kv_tokens;         /* tokens of KV that weigh as much as one state (per GPU) */
    uint64_t request_kv_bytes;        /* the typical request's KV alone, per GPU */
    uint64_t state_only_sequences;    /* pool / state: the sequences if KV took nothing */
    uint64_t checkpoint_interval;     /* resolved params.state_checkpoint_interval */
    uint64_t checkpoints_per_prefix;  /* the typical prompt cached: floor(prompt / interval) */
    uint64_t prefix_kv_bytes_per_gpu; /* its full blocks of KV */
    uint64_t prefix_bytes_per_gpu;    /* KV + every checkpoint (any shorter hit can resume) */
    uint64_t prefix_bytes_last_checkpoint_per_gpu; /* KV + its last checkpoint only */
    uint64_t cached_prefixes;                      /* resolved params.cached_prefixes */
    uint64_t cached_prefixes_bytes_per_gpu;        /* that many prompts, every checkpoint kept */
    uint64_t prefixes_in_pool;                     /* how many such prompts the pool holds */
    uint64_t restart_boundary_tokens; /* lcm(block_size, interval): where every layer can resume */
    double mean_recomputed_tokens;    /* boundary / 2: a hit of uniform length loses that much */
    double mean_recompute_s;          /* those tokens at recompute_s_per_token */
    uint64_t prompt_resume_tokens;    /* the typical prompt, cached whole, resumes here: the last
                                         boundary at or before prompt - 1 */
    uint64_t prompt_recomputed_tokens;

    /* 16. multimodal (model.image_tokens): the vision encoder's activation peak, the encoder
     * cache (image embeddings kept for reuse) and which phase of the profile run peaks, on the
     * first pipeline stage, per GPU.  The ledger's activation_peak is the largest phase. */
    uint32_t images_per_request;           /* resolved */
    uint64_t encoder_budget_tokens;        /* resolved params.encoder_cache_tokens */
    uint64_t encoder_images;               /* images the profile encodes at once: min(max_num_seqs x
                                              images_per_request, budget / image tokens), at least 1 */
    uint64_t encoder_live_elems_per_token; /* a ViT layer's live values per token per GPU: 5 x
                                              hidden + (3 x hidden + intermediate) / tp; 0: no
                                              vision widths (the encoder is then not estimated) */
    uint64_t encoder_activation_bytes;     /* images x vision tokens x live x 2 B */
    uint64_t encoder_cache_bytes_per_image; /* image tokens x the LM's hidden x 2 B */
    uint64_t encoder_cache_bytes;           /* encoder_images of them */
    /* the profile run's phases: the encoder (its activations and outputs), the prefill with
     * the images (the forward at the token budget and the embeddings it consumes), decode (the
     * sampler over max_num_seqs rows) */
    uint64_t phase_bytes[3];
    int peak_phase;                       /* 0 encoder, 1 prefill, 2 decode */
    uint64_t text_only_activation_bytes;  /* the peak without images */
    uint64_t encoder_pool_tokens_lost;    /* KV tokens the images' share of the peak takes from
                                             the pool (memory decode never uses) */
    uint64_t image_request_bytes_per_gpu; /* the typical request with its images' KV tokens */
} kvc_plan_result_t;

/* Plan a deployment.  The only error is KVC_EINVAL, with one line in msg
 * (*out is then unspecified), when the inputs are impossible: the model or
 * the GPU fails its check; a TP that does not divide the heads, a PP past the
 * layers, int4 KV, a block size that is not a power of two in 1..1024, a
 * fraction out of range; a request or context longer than max_model_len, or
 * no max_model_len at all; a value past its bound (plan.h: tokens, measured
 * bytes, rates, engine limits, GPUs); an activation or CUDA-graph estimate
 * past KVC_PLAN_MAX_BYTES (pass the measured number); for a recurrent model,
 * cp > 1, a LoRA rank, draft tokens, a TP that does not divide d_inner, the
 * SSM heads or (Gated DeltaNet) the key heads, or a PP that leaves a stage with
 * recurrent layers and no attention layer while the model has some;
 * images_per_request past 4,096, encoder_cache_tokens, state_checkpoint_interval
 * or cached_prefixes past KVC_PLAN_MAX_TOKENS; an argument NULL.  A
 * deployment that does not start is NOT an error: out->fits is false and
 * out->failed_phase names the phase.  Writes only *out and msg. */
KVC_API int kvc_plan_compute(const kvc_plan_model_t *model, const kvc_plan_gpu_t *gpu,
                             const kvc_plan_params_t *params, kvc_plan_result_t *out, char *msg,
                             size_t msg_len);

/* Bytes of KV one request of n_tokens takes per GPU in the plan's pool
 * (block-rounded, window freeing as configured).  Cannot fail; a product past
 * 64 bits saturates at UINT64_MAX (within the token bound it stays below
 * 2^62).  r must be a result of kvc_plan_compute. */
KVC_API uint64_t kvc_plan_request_bytes(const kvc_plan_result_t *r, uint64_t n_tokens);

/* Render the derivation as text (twelve sections and, where they apply, 13-16: formula, numbers
 * substituted, result, kind) or as one JSON object (keys in docs/plan.md).
 * *out is a NUL-terminated string the caller frees with kvc_plan_string_free.
 * Names from the input (the model's, the GPU's) appear in the text with their
 * control bytes escaped (\xNN), in the JSON escaped as JSON escapes them.
 * Returns 0, KVC_ENOMEM (nothing is handed out, nothing leaks) or KVC_EINVAL
 * (r or out NULL). */
KVC_API int kvc_plan_render_text(const kvc_plan_result_t *r, char **out);
KVC_API int kvc_plan_render_json(const kvc_plan_result_t *r, char **out);
/* Free a rendered string; NULL is a no-op. */
KVC_API void kvc_plan_string_free(char *s);

#ifdef __cplusplus
}
#endif
#endif /* KVCACHE_PLAN_H */
