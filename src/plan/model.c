/* model.c - the plan layer's model descriptor: built-in presets, reading a
 * Hugging Face config.json, consistency checks and parameter counts.
 *
 * A config is read for what the arithmetic needs and nothing else: unknown
 * fields are ignored, a field the math needs is an error that names it, and
 * defaults follow the transformers library where it has one (a missing
 * num_key_value_heads means multi-head attention; a missing
 * tie_word_embeddings means tied, as PretrainedConfig defaults).  Multimodal
 * configs keep the language model under text_config (or llm_config /
 * language_config); fields found there win over the top level.
 */
#include "plan_int.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- dtypes ---------------------------------------------------------------- */
static const struct {
    const char *name;
    uint32_t bits;
} dtypes[KVC_PLAN_DTYPE__COUNT] = {
    [KVC_PLAN_BF16] = {"bf16", 16}, [KVC_PLAN_FP16] = {"fp16", 16}, [KVC_PLAN_FP8] = {"fp8", 8},
    [KVC_PLAN_INT4] = {"int4", 4},  [KVC_PLAN_INT8] = {"int8", 8},  [KVC_PLAN_NVFP4] = {"nvfp4", 4},
};

const char *kvc_plan_dtype_name(kvc_plan_dtype_t dt)
{
    return (unsigned)dt < KVC_PLAN_DTYPE__COUNT ? dtypes[dt].name : "?";
}

uint32_t kvc_plan_dtype_bits(kvc_plan_dtype_t dt)
{
    return (unsigned)dt < KVC_PLAN_DTYPE__COUNT ? dtypes[dt].bits : 0;
}

uint64_t kvc_plan_dtype_bytes(kvc_plan_dtype_t dt, uint64_t n)
{
    const kvc__u128 w = n;
    kvc__u128 b;
    switch (dt) {
    case KVC_PLAN_BF16:
    case KVC_PLAN_FP16:
        b = 2 * w;
        break;
    case KVC_PLAN_FP8:
    case KVC_PLAN_INT8:
        b = w;
        break;
    case KVC_PLAN_INT4: /* fp16 scale + zero per 128 */
        b = (w + 1) / 2 + (w + 127) / 128 * 4;
        break;
    case KVC_PLAN_NVFP4: /* 16 e2m1 values in 8 bytes and one fp8 scale */
        b = (w + 15) / 16 * 9;
        break;
    default:
        return 0;
    }
    return b > UINT64_MAX ? UINT64_MAX : (uint64_t)b;
}

static const char *const rope_names[KVC_PLAN_ROPE__COUNT] = {"none", "linear", "yarn", "llama3"};
const char *kvc_plan_rope_name(kvc_plan_rope_t r)
{
    return (unsigned)r < KVC_PLAN_ROPE__COUNT ? rope_names[r] : "?";
}

int kvc_plan_rope_parse(const char *s, kvc_plan_rope_t *type, double *factor)
{
    if (!s || !type || !factor) return KVC_EINVAL;
    const char *colon = strchr(s, ':');
    if (!colon) return KVC_EINVAL;
    for (int t = 1; t < KVC_PLAN_ROPE__COUNT; t++) {
        if (strlen(rope_names[t]) != (size_t)(colon - s) ||
            strncasecmp(s, rope_names[t], (size_t)(colon - s)))
            continue;
        char *end;
        errno = 0;
        const double f = strtod(colon + 1, &end);
        if (end == colon + 1 || *end || errno || !(f > 1 && f <= 1024)) return KVC_EINVAL;
        *type = (kvc_plan_rope_t)t;
        *factor = f;
        return 0;
    }
    return KVC_EINVAL;
}

const char *kvc_plan_recurrent_name(kvc_plan_recurrent_t k)
{
    static const char *const names[KVC_PLAN_RECURRENT__COUNT] = {"none", "mamba1", "mamba2",
                                                                 "gated_deltanet"};
    return (unsigned)k < KVC_PLAN_RECURRENT__COUNT ? names[k] : "?";
}

/* A layer pattern is read only up to its NUL (at most KVC_PLAN_MAX_LAYERS letters), so that an
 * unchecked model never reads past it. */
static char pattern_at(const kvc_plan_model_t *m, uint32_t i)
{
    return i < KVC_PLAN_MAX_LAYERS ? m->layer_pattern[i] : 0;
}

bool kvc__layer_recurrent(const kvc_plan_model_t *m, uint32_t i)
{
    if (m->layer_pattern[0]) return pattern_at(m, i) == 'M';
    if (!m->recurrent) return false;
    return !m->attn_layer_period || i % m->attn_layer_period != m->attn_layer_offset;
}

bool kvc__layer_attention(const kvc_plan_model_t *m, uint32_t i)
{
    if (m->layer_pattern[0]) return pattern_at(m, i) == '*';
    return !kvc__layer_recurrent(m, i);
}

bool kvc__layer_moe(const kvc_plan_model_t *m, uint32_t i)
{
    if (m->layer_pattern[0]) return pattern_at(m, i) == 'E';
    if (!m->n_experts) return false;
    if (m->moe_layer_period) return i % m->moe_layer_period == m->moe_layer_offset;
    return i >= m->n_dense_layers;
}

bool kvc__layer_mlp(const kvc_plan_model_t *m, uint32_t i)
{
    if (m->layer_pattern[0]) return pattern_at(m, i) == '-';
    return !kvc__layer_moe(m, i);
}

void kvc__layer_counts(const kvc_plan_model_t *m, kvc__layer_counts_t *c)
{
    memset(c, 0, sizeof *c);
    if (m->layer_pattern[0]) {
        const size_t n = strnlen(m->layer_pattern, sizeof m->layer_pattern);
        for (size_t i = 0; i < n; i++) {
            const char ch = m->layer_pattern[i];
            c->attention += ch == '*';
            c->recurrent += ch == 'M';
            c->mlp += ch == '-';
            c->moe += ch == 'E';
        }
        return;
    }
    /* arithmetic, not a walk: an unchecked model may claim 2^32 layers */
    c->recurrent = m->n_recurrent_layers <= m->n_layers ? m->n_recurrent_layers : m->n_layers;
    c->attention = m->n_layers - c->recurrent;
    c->mlp = !m->n_experts                      ? m->n_layers
             : m->n_dense_layers <= m->n_layers ? m->n_dense_layers
                                                : m->n_layers;
    c->moe = m->n_layers - c->mlp;
}

uint32_t kvc__attn_layers(const kvc_plan_model_t *m)
{
    kvc__layer_counts_t c;
    kvc__layer_counts(m, &c);
    return c.attention;
}

uint64_t kvc__ssm_groups(const kvc_plan_model_t *m, uint32_t tp)
{
    if (m->recurrent == KVC_PLAN_RECURRENT_MAMBA2) {
        /* vLLM (MambaStateShapeCalculator.extra_groups_for_head_shards): groups a TP size does
         * not divide are replicated up to tp, so that every head's group is on its GPU */
        const uint64_t g = m->ssm_n_groups % tp ? tp : m->ssm_n_groups;
        return g / tp;
    }
    return kvc__ceil_div(m->ssm_n_groups, tp);
}

uint64_t kvc__conv_channels(const kvc_plan_model_t *m, uint32_t tp)
{
    const uint64_t d = kvc__ceil_div(m->ssm_d_inner, tp);
    if (m->recurrent == KVC_PLAN_RECURRENT_MAMBA1) return d;
    /* Mamba-2: x, B and C; Gated DeltaNet: v, q and k (n_groups = key heads, d_state = key
     * head dim) */
    return d + 2 * kvc__ssm_groups(m, tp) * m->ssm_d_state;
}

void kvc__mamba_params(const kvc_plan_model_t *m, uint32_t tp, uint64_t *linear, uint64_t *wide)
{
    const uint64_t H = m->hidden_size, d = kvc__ceil_div(m->ssm_d_inner, tp), r = m->ssm_dt_rank,
                   n = m->ssm_d_state, k = m->ssm_d_conv, conv = kvc__conv_channels(m, tp),
                   nh = kvc__ceil_div(m->ssm_n_heads, tp), g = kvc__ssm_groups(m, tp);
    switch (m->recurrent) {
    case KVC_PLAN_RECURRENT_MAMBA2:
        /* in_proj (z, x, B, C and dt: 2 d + 2 g n + heads), out_proj (transformers'
         * Mamba2Mixer, NemotronHMamba2Mixer) */
        *linear = H * (2 * d + 2 * g * n + nh) + d * H;
        /* the depthwise convolution over x, B, C (and its bias); dt_bias, A_log, D per head;
         * the gated RMSNorm over d_inner; biases */
        *wide = conv * k + (m->ssm_conv_bias ? conv : 0) + 3 * nh + d +
                (m->ssm_proj_bias ? 2 * d + 2 * g * n + nh + H : 0);
        return;
    case KVC_PLAN_RECURRENT_GDN:
        /* in_proj_qkvz (q, k: key heads x key dim each; v, z: d_inner each), in_proj_ba (b, a:
         * one per value head each), out_proj (transformers' Qwen3NextGatedDeltaNet) */
        *linear = H * (2 * g * n + 2 * d) + H * 2 * nh + d * H;
        /* the convolution over q, k, v (no bias in Qwen3-Next); dt_bias, A_log per value head;
         * the gated RMSNorm over one value head */
        *wide = conv * k + (m->ssm_conv_bias ? conv : 0) + 2 * nh + m->ssm_head_dim;
        return;
    default:
        break;
    }
    /* in_proj (x and the gate), x_proj (dt, B, C), dt_proj, out_proj: TP splits d_inner */
    *linear = H * 2 * d + d * (r + 2 * n) + r * d + d * H;
    /* the depthwise convolution, dt_proj's bias, A_log, D; biases; Jamba's dt/B/C norms */
    *wide = d * k + (m->ssm_conv_bias ? d : 0) + d + d * n + d +
            (m->ssm_proj_bias ? 2 * d + H : 0) + (m->ssm_inner_norms ? r + 2 * n : 0);
}

int kvc_plan_dtype_parse(const char *name, kvc_plan_dtype_t *out)
{
    static const struct {
        const char *alias;
        kvc_plan_dtype_t dt;
    } aliases[] = {
        {"bf16", KVC_PLAN_BF16},    {"bfloat16", KVC_PLAN_BF16}, {"fp16", KVC_PLAN_FP16},
        {"float16", KVC_PLAN_FP16}, {"half", KVC_PLAN_FP16},     {"fp8", KVC_PLAN_FP8},
        {"fp8_e4m3", KVC_PLAN_FP8}, {"fp8-e4m3", KVC_PLAN_FP8},  {"e4m3", KVC_PLAN_FP8},
        {"fp8_e5m2", KVC_PLAN_FP8}, {"fp8-e5m2", KVC_PLAN_FP8},  {"e5m2", KVC_PLAN_FP8},
        {"int4", KVC_PLAN_INT4},    {"w4a16", KVC_PLAN_INT4},    {"int8", KVC_PLAN_INT8},
        {"w8a8", KVC_PLAN_INT8},    {"nvfp4", KVC_PLAN_NVFP4},   {"fp4", KVC_PLAN_NVFP4},
        {"e2m1", KVC_PLAN_NVFP4},
    };
    if (!name || !out) return KVC_EINVAL;
    for (size_t i = 0; i < KVC_ARRAY_LEN(aliases); i++)
        if (!strcasecmp(name, aliases[i].alias)) {
            *out = aliases[i].dt;
            return 0;
        }
    return KVC_EINVAL;
}

/* ---- presets ----------------------------------------------------------------
 * Numbers copied from each model's public config.json on the Hugging Face hub
 * (the repository is named on each line); no value is estimated here.
 */
static const kvc_plan_model_t model_presets[] = {
    /* meta-llama/Llama-3.1-8B config.json */
    {.name = "llama-3.1-8b",
     .model_type = "llama",
     .hidden_size = 4096,
     .n_layers = 32,
     .n_heads = 32,
     .n_kv_heads = 8,
     .head_dim = 128,
     .v_head_dim = 128,
     .vocab_size = 128256,
     .intermediate_size = 14336,
     .max_position_embeddings = 131072},
    /* meta-llama/Llama-3.1-70B config.json (head_dim derived: 8192 / 64) */
    {.name = "llama-3.1-70b",
     .model_type = "llama",
     .hidden_size = 8192,
     .n_layers = 80,
     .n_heads = 64,
     .n_kv_heads = 8,
     .head_dim = 128,
     .v_head_dim = 128,
     .vocab_size = 128256,
     .intermediate_size = 28672,
     .max_position_embeddings = 131072},
    /* meta-llama/Llama-3.1-405B config.json (head_dim derived: 16384 / 128) */
    {.name = "llama-3.1-405b",
     .model_type = "llama",
     .hidden_size = 16384,
     .n_layers = 126,
     .n_heads = 128,
     .n_kv_heads = 8,
     .head_dim = 128,
     .v_head_dim = 128,
     .vocab_size = 128256,
     .intermediate_size = 53248,
     .max_position_embeddings = 131072},
    /* mistralai/Mistral-7B-v0.1 config.json: sliding_window 4096 on every layer */
    {.name = "mistral-7b-v0.1",
     .model_type = "mistral",
     .hidden_size = 4096,
     .n_layers = 32,
     .n_heads = 32,
     .n_kv_heads = 8,
     .head_dim = 128,
     .v_head_dim = 128,
     .vocab_size = 32000,
     .intermediate_size = 14336,
     .sliding_window = 4096,
     .n_sliding_layers = 32,
     .max_position_embeddings = 32768},
    /* mistralai/Mixtral-8x7B-v0.1 config.json: 8 local experts, 2 per token */
    {.name = "mixtral-8x7b",
     .model_type = "mixtral",
     .hidden_size = 4096,
     .n_layers = 32,
     .n_heads = 32,
     .n_kv_heads = 8,
     .head_dim = 128,
     .v_head_dim = 128,
     .vocab_size = 32000,
     .intermediate_size = 14336,
     .n_experts = 8,
     .n_experts_active = 2,
     .moe_intermediate_size = 14336,
     .max_position_embeddings = 32768},
    /* Qwen/Qwen2.5-72B config.json (Qwen2 projections carry q/k/v biases) */
    {.name = "qwen2.5-72b",
     .model_type = "qwen2",
     .hidden_size = 8192,
     .n_layers = 80,
     .n_heads = 64,
     .n_kv_heads = 8,
     .head_dim = 128,
     .v_head_dim = 128,
     .vocab_size = 152064,
     .intermediate_size = 29568,
     .qkv_bias = true,
     .max_position_embeddings = 32768},
    /* google/gemma-2-27b config.json: explicit head_dim 128 (not 4608 / 32), tied
     * embeddings, sliding_window 4096 on every other layer (23 of 46) */
    {.name = "gemma-2-27b",
     .model_type = "gemma2",
     .hidden_size = 4608,
     .n_layers = 46,
     .n_heads = 32,
     .n_kv_heads = 16,
     .head_dim = 128,
     .v_head_dim = 128,
     .vocab_size = 256000,
     .intermediate_size = 36864,
     .tie_embeddings = true,
     .sliding_window = 4096,
     .n_sliding_layers = 23,
     .max_position_embeddings = 8192},
    /* deepseek-ai/DeepSeek-V3 config.json: MLA (kv_lora_rank 512, rope 64, nope 128,
     * v 128, q_lora_rank 1536); 256 routed experts, 8 per token, 1 shared, the first 3
     * layers dense (MTP layers not counted) */
    {.name = "deepseek-v3",
     .model_type = "deepseek_v3",
     .hidden_size = 7168,
     .n_layers = 61,
     .n_heads = 128,
     .n_kv_heads = 128,
     .head_dim = 192,
     .v_head_dim = 128,
     .vocab_size = 129280,
     .intermediate_size = 18432,
     .n_experts = 256,
     .n_experts_active = 8,
     .moe_intermediate_size = 2048,
     .n_shared_experts = 1,
     .n_dense_layers = 3,
     .mla = true,
     .q_lora_rank = 1536,
     .kv_lora_rank = 512,
     .qk_rope_head_dim = 64,
     .qk_nope_head_dim = 128,
     .max_position_embeddings = 163840},
};

size_t kvc_plan_model_preset_count(void)
{
    return KVC_ARRAY_LEN(model_presets);
}

const char *kvc_plan_model_preset_name(size_t i)
{
    return i < KVC_ARRAY_LEN(model_presets) ? model_presets[i].name : NULL;
}

int kvc_plan_model_preset(const char *name, kvc_plan_model_t *out)
{
    if (!out) return KVC_EINVAL;
    if (!name) return KVC_ENOENT;
    for (size_t i = 0; i < KVC_ARRAY_LEN(model_presets); i++)
        if (!strcasecmp(name, model_presets[i].name)) {
            *out = model_presets[i];
            return 0;
        }
    return KVC_ENOENT;
}

/* ---- parameter counts ----------------------------------------------------------
 * Counted in 128 bits, so that kvc_plan_model_check can bound a model whose
 * count would not fit 64 bits; a checked model's parts all fit (the total is
 * at most KVC_PLAN_MAX_PARAMS).
 */
typedef struct {
    kvc__u128 embedding, lm_head, attention, mlp_dense, experts_routed, experts_shared, router,
        norms, total, active, vision, recurrent;
} wide_count_t;

static void count_params(const kvc_plan_model_t *m, wide_count_t *c)
{
    const kvc__u128 H = m->hidden_size, L = m->n_layers, nh = m->n_heads;
    memset(c, 0, sizeof *c);
    kvc__u128 attn;
    if (m->mla) {
        const kvc__u128 qk = (kvc__u128)m->qk_nope_head_dim + m->qk_rope_head_dim;
        const kvc__u128 q = m->q_lora_rank
                                ? H * m->q_lora_rank + m->q_lora_rank + m->q_lora_rank * nh * qk
                                : H * nh * qk;
        attn = q + H * ((kvc__u128)m->kv_lora_rank + m->qk_rope_head_dim) /* kv_a (with rope k) */
               + m->kv_lora_rank                                          /* kv_a norm */
               + (kvc__u128)m->kv_lora_rank * nh *
                     ((kvc__u128)m->qk_nope_head_dim + m->v_head_dim) /* kv_b */
               + nh * m->v_head_dim * H;                              /* o */
    } else {
        /* Qwen3-Next's gated attention: q_proj yields the query and a gate of the same width */
        const kvc__u128 q = nh * m->head_dim, kv = (kvc__u128)m->n_kv_heads * m->head_dim;
        attn = H * q * (m->attn_output_gate ? 2 : 1) + 2 * H * kv + nh * m->v_head_dim * H;
        if (m->qkv_bias) attn += q + 2 * kv;
    }
    kvc__layer_counts_t lc;
    kvc__layer_counts(m, &lc);
    c->attention = (kvc__u128)lc.attention * attn;
    if (m->recurrent) {
        uint64_t lin, wide;
        kvc__mamba_params(m, 1, &lin, &wide);
        c->recurrent = (kvc__u128)lc.recurrent * (lin + wide);
    }
    /* gate, up and down; Nemotron-H's squared-ReLU MLPs and experts have up and down only */
    const kvc__u128 mats = m->mlp_ungated ? 2 : 3, n_dense = lc.mlp, n_moe = lc.moe;
    c->mlp_dense = n_dense * mats * H * m->intermediate_size;
    if (m->n_experts) {
        const kvc__u128 expert = mats * H * m->moe_intermediate_size;
        c->experts_routed = n_moe * m->n_experts * expert;
        c->experts_shared = n_moe * mats * H *
                            ((kvc__u128)m->n_shared_experts * m->moe_intermediate_size +
                             m->shared_expert_intermediate_size);
        c->router = n_moe * H * m->n_experts;
    }
    /* two RMSNorms per layer; a pattern's layers are single blocks with one */
    c->norms = (m->layer_pattern[0] ? L : 2 * L) * H + H;
    c->embedding = (kvc__u128)m->vocab_size * H;
    c->lm_head = m->tie_embeddings ? 0 : c->embedding;
    c->total = c->embedding + c->lm_head + c->attention + c->recurrent + c->mlp_dense +
               c->experts_routed + c->experts_shared + c->router + c->norms;
    c->vision = m->vision_params;
    c->active = c->total;
    if (m->n_experts)
        c->active -= n_moe * ((kvc__u128)m->n_experts - m->n_experts_active) * mats * H *
                     m->moe_intermediate_size;
}

void kvc_plan_model_params(const kvc_plan_model_t *m, kvc_plan_param_count_t *c)
{
    wide_count_t w;
    count_params(m, &w);
    *c = (kvc_plan_param_count_t){
        .embedding = (uint64_t)w.embedding,
        .lm_head = (uint64_t)w.lm_head,
        .attention = (uint64_t)w.attention,
        .mlp_dense = (uint64_t)w.mlp_dense,
        .experts_routed = (uint64_t)w.experts_routed,
        .experts_shared = (uint64_t)w.experts_shared,
        .router = (uint64_t)w.router,
        .norms = (uint64_t)w.norms,
        .total = (uint64_t)w.total,
        .active = (uint64_t)w.active,
        .vision = (uint64_t)w.vision,
        .recurrent = (uint64_t)w.recurrent,
    };
}

/* ---- checks ------------------------------------------------------------------ */
/* The one line for a value past its bound: the reader and the check say it alike. */
static int out_of_range(char *msg, size_t len, const char *field, uint64_t v, uint64_t max)
{
    return kvc__msgf(KVC_EINVAL, msg, len, "%s %llu is out of range: at most %llu", field,
                     (unsigned long long)v, (unsigned long long)max);
}

/* Every count within what a real model has (plan.h), before any arithmetic on it. */
static int check_bounds(const kvc_plan_model_t *m, char *msg, size_t len)
{
    const struct {
        uint64_t v;
        const char *field;
        uint64_t max;
    } bounds[] = {
        {m->hidden_size, "hidden_size", KVC_PLAN_MAX_HIDDEN},
        {m->n_layers, "num_hidden_layers", KVC_PLAN_MAX_LAYERS},
        {m->n_heads, "num_attention_heads", KVC_PLAN_MAX_HEADS},
        {m->n_kv_heads, "num_key_value_heads", KVC_PLAN_MAX_HEADS},
        {m->head_dim, "head_dim", KVC_PLAN_MAX_HEAD_DIM},
        {m->v_head_dim, "v_head_dim", KVC_PLAN_MAX_HEAD_DIM},
        {m->vocab_size, "vocab_size", KVC_PLAN_MAX_VOCAB},
        {m->intermediate_size, "intermediate_size", KVC_PLAN_MAX_INTERMEDIATE},
        {m->n_experts, "num_experts", KVC_PLAN_MAX_EXPERTS},
        {m->n_experts_active, "num_experts_per_tok", KVC_PLAN_MAX_EXPERTS},
        {m->moe_intermediate_size, "moe_intermediate_size", KVC_PLAN_MAX_INTERMEDIATE},
        {m->n_shared_experts, "n_shared_experts", KVC_PLAN_MAX_EXPERTS},
        {m->shared_expert_intermediate_size, "shared_expert_intermediate_size",
         KVC_PLAN_MAX_INTERMEDIATE},
        {m->n_dense_layers, "dense layers", KVC_PLAN_MAX_LAYERS},
        {m->q_lora_rank, "q_lora_rank", KVC_PLAN_MAX_RANK},
        {m->kv_lora_rank, "kv_lora_rank", KVC_PLAN_MAX_RANK},
        {m->qk_rope_head_dim, "qk_rope_head_dim", KVC_PLAN_MAX_HEAD_DIM},
        {m->qk_nope_head_dim, "qk_nope_head_dim", KVC_PLAN_MAX_HEAD_DIM},
        {m->sliding_window, "sliding_window", KVC_PLAN_MAX_WINDOW},
        {m->n_sliding_layers, "sliding layers", KVC_PLAN_MAX_LAYERS},
        {m->image_tokens, "image tokens", KVC_PLAN_MAX_IMAGE_TOKENS},
        {m->max_position_embeddings, "max_position_embeddings", KVC_PLAN_MAX_TOKENS},
        {m->vision_hidden, "vision_config.hidden_size", KVC_PLAN_MAX_HIDDEN},
        {m->vision_intermediate, "vision_config.intermediate_size", KVC_PLAN_MAX_INTERMEDIATE},
        {m->vision_layers, "vision_config.num_hidden_layers", KVC_PLAN_MAX_LAYERS},
        {m->vision_tokens, "vision tokens (patches + 1)", KVC_PLAN_MAX_IMAGE_TOKENS + 1},
        {m->n_recurrent_layers, "recurrent layers", KVC_PLAN_MAX_LAYERS},
        {m->ssm_d_inner, "mamba_expand x hidden_size", KVC_PLAN_MAX_INTERMEDIATE},
        {m->ssm_d_state, "mamba_d_state", KVC_PLAN_MAX_SSM_STATE},
        {m->ssm_d_conv, "mamba_d_conv", KVC_PLAN_MAX_SSM_STATE},
        {m->ssm_dt_rank, "mamba_dt_rank", KVC_PLAN_MAX_HIDDEN},
        {m->ssm_n_heads, "SSM heads", KVC_PLAN_MAX_HEADS},
        {m->ssm_head_dim, "SSM head_dim", KVC_PLAN_MAX_HEAD_DIM},
        {m->ssm_n_groups, "SSM groups", KVC_PLAN_MAX_HEADS},
    };
    for (size_t i = 0; i < KVC_ARRAY_LEN(bounds); i++)
        if (bounds[i].v > bounds[i].max)
            return out_of_range(msg, len, bounds[i].field, bounds[i].v, bounds[i].max);
    return 0;
}

/* What the fields add up to: each is within its bound, their products may not be. */
static int check_totals(const kvc_plan_model_t *m, char *msg, size_t len)
{
    const kvc__u128 kv16 =
        m->mla ? ((kvc__u128)m->kv_lora_rank + m->qk_rope_head_dim) * m->n_layers * 2
               : (kvc__u128)2 * kvc__attn_layers(m) * m->n_kv_heads * m->head_dim * 2;
    if (kv16 > KVC_PLAN_MAX_KV_BYTES_PER_TOKEN)
        return kvc__msgf(KVC_EINVAL, msg, len,
                         "KV bytes per token at 16 bits (%u layers x %s) are %.4g, over the bound "
                         "%llu",
                         m->n_layers, m->mla ? "the latent" : "KV heads x head_dim x K and V",
                         (double)kv16, (unsigned long long)KVC_PLAN_MAX_KV_BYTES_PER_TOKEN);
    wide_count_t w;
    count_params(m, &w);
    if (w.total > KVC_PLAN_MAX_PARAMS || w.vision > KVC_PLAN_MAX_PARAMS)
        return kvc__msgf(KVC_EINVAL, msg, len, "the model has %.4g parameters, over the bound %llu",
                         (double)w.total, (unsigned long long)KVC_PLAN_MAX_PARAMS);
    return 0;
}

/* A layer pattern: one letter per layer, each M, *, - or E; no periods beside it; 'E' only
 * with experts, 'M' only with a recurrent kind; the MoE counts it implies. */
static int check_pattern(const kvc_plan_model_t *m, char *msg, size_t len)
{
    const size_t n = strnlen(m->layer_pattern, sizeof m->layer_pattern);
    if (n == sizeof m->layer_pattern)
        return kvc__msgf(KVC_EINVAL, msg, len, "the layer pattern is not NUL-terminated");
    if (n != m->n_layers)
        return kvc__msgf(KVC_EINVAL, msg, len,
                         "hybrid_override_pattern has %zu layers but num_hidden_layers is %u", n,
                         m->n_layers);
    for (size_t i = 0; i < n; i++)
        if (!strchr("M*-E", m->layer_pattern[i]))
            return kvc__msgf(KVC_EINVAL, msg, len,
                             "hybrid_override_pattern: layer %zu is '%c' (0x%02x): expected M "
                             "(Mamba), * (attention), - (MLP) or E (MoE)",
                             i,
                             m->layer_pattern[i] >= 0x20 && m->layer_pattern[i] < 0x7f
                                 ? m->layer_pattern[i]
                                 : '?',
                             (unsigned char)m->layer_pattern[i]);
    if (m->attn_layer_period || m->moe_layer_period)
        return kvc__msgf(KVC_EINVAL, msg, len,
                         "a layer pattern with attn_layer_period or expert_layer_period as well");
    kvc__layer_counts_t lc;
    kvc__layer_counts(m, &lc);
    if (lc.moe && !m->n_experts)
        return kvc__msgf(KVC_EINVAL, msg, len,
                         "hybrid_override_pattern has %u MoE layers (E) but no experts "
                         "(n_routed_experts)",
                         lc.moe);
    if (lc.recurrent && !m->recurrent)
        return kvc__msgf(KVC_EINVAL, msg, len,
                         "hybrid_override_pattern has %u Mamba layers (M) but no recurrent kind",
                         lc.recurrent);
    if (m->n_experts && m->n_dense_layers != lc.mlp)
        return kvc__msgf(KVC_EINVAL, msg, len,
                         "%u dense layers, but the layer pattern has %u MLP layers (-)",
                         m->n_dense_layers, lc.mlp);
    return 0;
}

int kvc_plan_model_check(const kvc_plan_model_t *m, char *msg, size_t len)
{
    if (!m) return kvc__msgf(KVC_EINVAL, msg, len, "no model");
#define NEED(field, cfg) \
    if (m->field == 0) return kvc__msgf(KVC_EINVAL, msg, len, "%s is missing or zero", cfg)
    NEED(hidden_size, "hidden_size");
    NEED(n_layers, "num_hidden_layers");
    NEED(vocab_size, "vocab_size");
    int rc = check_bounds(m, msg, len);
    if (rc) return rc;
    if (m->layer_pattern[0] && (rc = check_pattern(m, msg, len))) return rc;
    /* a model without attention layers (pure Mamba-2) has no attention fields to check */
    const bool attends = kvc__attn_layers(m) > 0;
    if (attends) {
        NEED(n_heads, "num_attention_heads");
        NEED(head_dim, "head_dim");
        NEED(v_head_dim, "v_head_dim");
    }
    if (!attends) {
        if (m->mla) return kvc__msgf(KVC_EINVAL, msg, len, "MLA without attention layers");
    } else if (m->mla) {
        NEED(kv_lora_rank, "kv_lora_rank");
        NEED(qk_rope_head_dim, "qk_rope_head_dim");
        NEED(qk_nope_head_dim, "qk_nope_head_dim");
        if (m->head_dim != m->qk_nope_head_dim + m->qk_rope_head_dim)
            return kvc__msgf(KVC_EINVAL, msg, len,
                             "MLA head_dim %u is not qk_nope_head_dim %u + qk_rope_head_dim %u",
                             m->head_dim, m->qk_nope_head_dim, m->qk_rope_head_dim);
    } else {
        NEED(n_kv_heads, "num_key_value_heads");
        if (m->n_kv_heads > m->n_heads || m->n_heads % m->n_kv_heads)
            return kvc__msgf(KVC_EINVAL, msg, len,
                             "num_key_value_heads %u does not divide num_attention_heads %u",
                             m->n_kv_heads, m->n_heads);
    }
    if (m->n_experts) {
        NEED(n_experts_active, "num_experts_per_tok");
        NEED(moe_intermediate_size, "moe_intermediate_size");
        if (m->n_experts_active > m->n_experts)
            return kvc__msgf(KVC_EINVAL, msg, len,
                             "num_experts_per_tok %u exceeds the %u routed experts",
                             m->n_experts_active, m->n_experts);
        if (m->n_dense_layers > m->n_layers)
            return kvc__msgf(KVC_EINVAL, msg, len, "%u dense layers but only %u layers",
                             m->n_dense_layers, m->n_layers);
    }
    if (m->recurrent) {
        if ((unsigned)m->recurrent >= KVC_PLAN_RECURRENT__COUNT)
            return kvc__msgf(KVC_EINVAL, msg, len, "recurrent kind %d is not one the planner knows",
                             (int)m->recurrent);
        const bool m1 = m->recurrent == KVC_PLAN_RECURRENT_MAMBA1,
                   gdn = m->recurrent == KVC_PLAN_RECURRENT_GDN;
        NEED(ssm_d_inner, m1 ? "mamba_expand" : gdn ? "linear_num_value_heads" : "mamba_num_heads");
        NEED(ssm_d_state, m1 ? "mamba_d_state" : gdn ? "linear_key_head_dim" : "ssm_state_size");
        NEED(ssm_d_conv, m1 ? "mamba_d_conv" : gdn ? "linear_conv_kernel_dim" : "conv_kernel");
        if (m1) {
            NEED(ssm_dt_rank, "mamba_dt_rank");
        } else {
            NEED(ssm_n_heads, gdn ? "linear_num_value_heads" : "mamba_num_heads");
            NEED(ssm_head_dim, gdn ? "linear_value_head_dim" : "mamba_head_dim");
            NEED(ssm_n_groups, gdn ? "linear_num_key_heads" : "n_groups");
            if ((uint64_t)m->ssm_n_heads * m->ssm_head_dim != m->ssm_d_inner)
                return kvc__msgf(KVC_EINVAL, msg, len,
                                 "the mixer's d_inner %u is not %u heads x head_dim %u",
                                 m->ssm_d_inner, m->ssm_n_heads, m->ssm_head_dim);
            if (m->ssm_n_heads % m->ssm_n_groups)
                return kvc__msgf(KVC_EINVAL, msg, len, "%s %u does not divide the %u %s",
                                 gdn ? "linear_num_key_heads" : "n_groups", m->ssm_n_groups,
                                 m->ssm_n_heads, gdn ? "value heads" : "SSM heads");
        }
        if (m->ssm_d_conv < 2)
            return kvc__msgf(KVC_EINVAL, msg, len, "the convolution's kernel %u: expected >= 2",
                             m->ssm_d_conv);
        if (m->mla)
            return kvc__msgf(KVC_EINVAL, msg, len, "a recurrent model with MLA is not modelled");
        if (m->attn_layer_period && m->attn_layer_offset >= m->attn_layer_period)
            return kvc__msgf(KVC_EINVAL, msg, len,
                             "attn_layer_offset %u is not below attn_layer_period %u",
                             m->attn_layer_offset, m->attn_layer_period);
        uint32_t n_rec = 0;
        if (m->layer_pattern[0]) {
            kvc__layer_counts_t lc;
            kvc__layer_counts(m, &lc);
            n_rec = lc.recurrent;
        } else {
            for (uint32_t i = 0; i < m->n_layers; i++) n_rec += kvc__layer_recurrent(m, i);
        }
        if (n_rec != m->n_recurrent_layers)
            return kvc__msgf(
                KVC_EINVAL, msg, len, "%u recurrent layers, but %s give %u", m->n_recurrent_layers,
                m->layer_pattern[0] ? "the layer pattern's 'M's" : "attn_layer_period and offset",
                n_rec);
        if (m->n_sliding_layers > kvc__attn_layers(m))
            return kvc__msgf(KVC_EINVAL, msg, len, "%u sliding layers but only %u attention layers",
                             m->n_sliding_layers, kvc__attn_layers(m));
    } else if (m->n_recurrent_layers) {
        return kvc__msgf(KVC_EINVAL, msg, len, "%u recurrent layers without a recurrent kind",
                         m->n_recurrent_layers);
    } else if (!attends) {
        return kvc__msgf(KVC_EINVAL, msg, len, "no layer attends and none is recurrent");
    }
    if (m->moe_layer_period) {
        if (!m->n_experts || m->moe_layer_offset >= m->moe_layer_period)
            return kvc__msgf(KVC_EINVAL, msg, len,
                             "expert_layer_offset %u with expert_layer_period %u and %u experts",
                             m->moe_layer_offset, m->moe_layer_period, m->n_experts);
        uint32_t n_moe = 0;
        for (uint32_t i = 0; i < m->n_layers; i++) n_moe += kvc__layer_moe(m, i);
        if (m->n_layers - n_moe != m->n_dense_layers)
            return kvc__msgf(KVC_EINVAL, msg, len,
                             "%u dense layers, but expert_layer_period %u and offset %u give %u",
                             m->n_dense_layers, m->moe_layer_period, m->moe_layer_offset,
                             m->n_layers - n_moe);
    }
#undef NEED
    kvc__layer_counts_t lc;
    kvc__layer_counts(m, &lc);
    if (lc.mlp && m->intermediate_size == 0)
        return kvc__msgf(KVC_EINVAL, msg, len, "intermediate_size is missing or zero");
    if (m->n_sliding_layers > m->n_layers)
        return kvc__msgf(KVC_EINVAL, msg, len, "%u sliding layers but only %u layers",
                         m->n_sliding_layers, m->n_layers);
    if (m->n_sliding_layers && !m->sliding_window)
        return kvc__msgf(KVC_EINVAL, msg, len, "sliding layers without a sliding_window");
    return check_totals(m, msg, len);
}

/* ---- config.json --------------------------------------------------------------- */
typedef struct {
    const cJSON *text; /* text_config (or NULL) */
    const cJSON *root;
    char *msg;
    size_t len;
} cfg_t;

/* The first of `keys` (NULL-terminated) present and not null, text_config first. */
static const cJSON *find(const cfg_t *c, const char *const *keys, const char **found)
{
    const cJSON *scopes[2] = {c->text, c->root};
    for (int s = 0; s < 2; s++) {
        if (!scopes[s]) continue;
        for (const char *const *k = keys; *k; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(scopes[s], *k);
            if (v && !cJSON_IsNull(v)) {
                if (found) *found = *k;
                return v;
            }
        }
    }
    return NULL;
}

/* Read an unsigned integer (0 < v <= max unless allow_zero).  Returns 0 with
 * *present false when absent; KVC_EPARSE when present but not such a number;
 * KVC_EINVAL when over max, the field's bound (plan.h). */
static int get_uint(const cfg_t *c, const char *const *keys, uint64_t max, bool allow_zero,
                    uint64_t *out, bool *present)
{
    const char *key = keys[0];
    const cJSON *v = find(c, keys, &key);
    *present = v != NULL;
    if (!v) return 0;
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    const bool whole = cJSON_IsNumber(v) && d >= (allow_zero ? 0 : 1) && d == floor(d);
    if (!whole || d > (double)max) {
        char *shown = cJSON_PrintUnformatted(v);
        int rc =
            whole ? kvc__msgf(KVC_EINVAL, c->msg, c->len, "%s %.40s is out of range: at most %llu",
                              key, shown ? shown : "?", (unsigned long long)max)
                  : kvc__msgf(KVC_EPARSE, c->msg, c->len, "%s: expected a %s integer, got %.40s",
                              key, allow_zero ? "non-negative" : "positive", shown ? shown : "?");
        cJSON_free(shown);
        return rc;
    }
    *out = (uint64_t)d;
    return 0;
}

/* A 32-bit count no larger than max (its bound in plan.h, or UINT32_MAX for
 * values that only divide or compare). */
static int get_u32(const cfg_t *c, const char *const *keys, uint32_t max, bool required,
                   uint32_t *out)
{
    uint64_t v = 0;
    bool present;
    int rc = get_uint(c, keys, max, false, &v, &present);
    if (rc) return rc;
    if (!present) {
        if (required) return kvc__msgf(KVC_EINVAL, c->msg, c->len, "%s is missing", keys[0]);
        return 0;
    }
    *out = (uint32_t)v;
    return 0;
}

static int get_bool(const cfg_t *c, const char *const *keys, bool *out, bool *present)
{
    const char *key = keys[0];
    const cJSON *v = find(c, keys, &key);
    if (present) *present = v != NULL;
    if (!v) return 0;
    if (!cJSON_IsBool(v))
        return kvc__msgf(KVC_EPARSE, c->msg, c->len, "%s: expected true or false", key);
    *out = cJSON_IsTrue(v);
    return 0;
}

#define KEYS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* Llama 4's chunked local attention: layers that use RoPE attend within the
 * current chunk of attention_chunk_size tokens, so their KV is bounded like a
 * window's; every nope_layer_interval-th layer (or each 0 in no_rope_layers)
 * is global.  Returns the chunked layer count, or 0. */
static int parse_chunked(const cfg_t *c, const kvc_plan_model_t *m, uint32_t *n_chunked)
{
    *n_chunked = 0;
    const cJSON *rope = find(c, KEYS("no_rope_layers"), NULL);
    if (rope && cJSON_IsArray(rope) && cJSON_GetArraySize(rope) > 0) {
        if ((uint32_t)cJSON_GetArraySize(rope) < m->n_layers)
            return kvc__msgf(KVC_EINVAL, c->msg, c->len,
                             "no_rope_layers has %d entries but num_hidden_layers is %u",
                             cJSON_GetArraySize(rope), m->n_layers);
        const cJSON *v;
        uint32_t i = 0;
        cJSON_ArrayForEach(v, rope)
        {
            if (!cJSON_IsNumber(v))
                return kvc__msgf(KVC_EPARSE, c->msg, c->len,
                                 "no_rope_layers: expected 0 or 1 per layer");
            if (i++ < m->n_layers && v->valuedouble != 0) (*n_chunked)++;
        }
        return 0;
    }
    if (rope && !cJSON_IsArray(rope))
        return kvc__msgf(KVC_EPARSE, c->msg, c->len, "no_rope_layers: expected an array");
    uint32_t interval = 4; /* Llama4TextConfig's default */
    int rc = get_u32(c, KEYS("nope_layer_interval"), UINT32_MAX, false, &interval);
    if (rc) return rc;
    *n_chunked = m->n_layers - m->n_layers / interval;
    return 0;
}

static int parse_sliding(const cfg_t *c, kvc_plan_model_t *m)
{
    uint32_t window = 0, chunk = 0;
    int rc = get_u32(c, KEYS("sliding_window", "interleaved_sliding_window"), KVC_PLAN_MAX_WINDOW,
                     false, &window);
    if (rc) return rc;
    if ((rc = get_u32(c, KEYS("attention_chunk_size"), KVC_PLAN_MAX_WINDOW, false, &chunk)))
        return rc;
    bool use = true, use_present = false;
    if ((rc = get_bool(c, KEYS("use_sliding_window"), &use, &use_present))) return rc;
    const cJSON *types = find(c, KEYS("layer_types"), NULL);
    uint32_t n_sliding_listed = 0, n_chunked_listed = 0;
    if (types) {
        if (!cJSON_IsArray(types))
            return kvc__msgf(KVC_EPARSE, c->msg, c->len, "layer_types: expected an array");
        int n = cJSON_GetArraySize(types);
        if ((uint32_t)n != m->n_layers)
            return kvc__msgf(KVC_EINVAL, c->msg, c->len,
                             "layer_types has %d entries but num_hidden_layers is %u", n,
                             m->n_layers);
        const cJSON *t;
        cJSON_ArrayForEach(t, types)
        {
            if (!cJSON_IsString(t))
                return kvc__msgf(KVC_EPARSE, c->msg, c->len, "layer_types: expected strings");
            if (strstr(t->valuestring, "sliding") || !strcmp(t->valuestring, "local"))
                n_sliding_listed++;
            else if (strstr(t->valuestring, "chunked"))
                n_chunked_listed++;
            else if (m->recurrent == KVC_PLAN_RECURRENT_GDN &&
                     !strcmp(t->valuestring, "linear_attention"))
                continue; /* Qwen3-Next: parse_qwen3_next has read them */
            else if (strcmp(t->valuestring, "full_attention") && strcmp(t->valuestring, "full") &&
                     strcmp(t->valuestring, "global") && strcmp(t->valuestring, "attention"))
            /* linear_attention (Qwen3-Next), mamba, recurrent: not KV, not modelled */
            {
                char shown[64];
                kvc__escape(shown, sizeof shown, t->valuestring);
                return kvc__msgf(KVC_EINVAL, c->msg, c->len,
                                 "layer_types: '%.32s' layers hold a recurrent state, not KV; "
                                 "hybrid models are not modelled (refused rather than sized as "
                                 "attention)",
                                 shown);
            }
        }
    }
    if (use_present && !use) window = 0; /* Qwen2: the window is declared but switched off */
    if (!window && chunk) {
        /* Chunked local attention (Llama 4), bounded like a window of the chunk size. */
        m->sliding_window = chunk;
        m->chunked_attention = true;
        if (types) {
            m->n_sliding_layers = n_chunked_listed + n_sliding_listed;
        } else if ((rc = parse_chunked(c, m, &m->n_sliding_layers))) {
            return rc;
        }
        if (!m->n_sliding_layers) {
            m->sliding_window = 0;
            m->chunked_attention = false;
        }
        return 0;
    }
    if (!window) {
        if (n_sliding_listed)
            return kvc__msgf(KVC_EINVAL, c->msg, c->len,
                             "layer_types names sliding layers but sliding_window is missing");
        if (n_chunked_listed)
            return kvc__msgf(KVC_EINVAL, c->msg, c->len,
                             "layer_types names chunked layers but attention_chunk_size is "
                             "missing");
        return 0;
    }
    m->sliding_window = window;
    uint32_t pattern = 0, max_window_layers = 0;
    if ((rc = get_u32(c, KEYS("sliding_window_pattern"), UINT32_MAX, false, &pattern))) return rc;
    if ((rc = get_u32(c, KEYS("max_window_layers"), UINT32_MAX, false, &max_window_layers)))
        return rc;
    if (types) {
        m->n_sliding_layers = n_sliding_listed; /* the per-layer list says it all */
    } else if (pattern) {
        /* Gemma 3, Cohere 2: every pattern-th layer is global, the rest slide. */
        m->n_sliding_layers = m->n_layers - m->n_layers / pattern;
    } else if (!strncmp(m->model_type, "gemma2", 6)) {
        /* Gemma 2 alternates: layer i slides when i is even. */
        m->n_sliding_layers = (m->n_layers + 1) / 2;
    } else if (use_present && max_window_layers) {
        /* Qwen2 with use_sliding_window: layers from max_window_layers on slide. */
        m->n_sliding_layers = max_window_layers < m->n_layers ? m->n_layers - max_window_layers : 0;
    } else {
        m->n_sliding_layers = m->n_layers; /* Mistral: every layer */
    }
    if (!m->n_sliding_layers) m->sliding_window = 0;
    return 0;
}

static int parse_moe(const cfg_t *c, kvc_plan_model_t *m)
{
    int rc = get_u32(c, KEYS("n_routed_experts", "num_local_experts", "num_experts"),
                     KVC_PLAN_MAX_EXPERTS, false, &m->n_experts);
    if (rc || !m->n_experts) return rc;
    if ((rc = get_u32(c, KEYS("num_experts_per_tok", "num_experts_per_token", "moe_topk"),
                      KVC_PLAN_MAX_EXPERTS, true, &m->n_experts_active)))
        return rc;
    m->moe_intermediate_size = m->intermediate_size;
    if ((rc = get_u32(c, KEYS("moe_intermediate_size"), KVC_PLAN_MAX_INTERMEDIATE, false,
                      &m->moe_intermediate_size)))
        return rc;
    if (!m->moe_intermediate_size)
        return kvc__msgf(KVC_EINVAL, c->msg, c->len,
                         "moe_intermediate_size (or intermediate_size) is missing");
    if ((rc = get_u32(c, KEYS("n_shared_experts"), KVC_PLAN_MAX_EXPERTS, false,
                      &m->n_shared_experts)))
        return rc;
    if ((rc = get_u32(c, KEYS("shared_expert_intermediate_size"), KVC_PLAN_MAX_INTERMEDIATE, false,
                      &m->shared_expert_intermediate_size)))
        return rc;
    uint32_t first_dense = 0, sparse_step = 0;
    if ((rc = get_u32(c, KEYS("first_k_dense_replace"), KVC_PLAN_MAX_LAYERS, false, &first_dense)))
        return rc;
    /* Qwen2-MoE's decoder_sparse_step, Llama 4's interleave_moe_layer_step: every
     * step-th layer is MoE, the others dense. */
    if ((rc = get_u32(c, KEYS("decoder_sparse_step", "interleave_moe_layer_step"), UINT32_MAX,
                      false, &sparse_step)))
        return rc;
    const cJSON *mlp_only = find(c, KEYS("mlp_only_layers"), NULL);
    if (mlp_only && !cJSON_IsArray(mlp_only))
        return kvc__msgf(KVC_EPARSE, c->msg, c->len, "mlp_only_layers: expected an array");
    uint64_t n_dense = first_dense; /* 64 bits: the sum below cannot wrap */
    if (sparse_step > 1) n_dense = m->n_layers - m->n_layers / sparse_step;
    if (mlp_only) n_dense += (uint64_t)cJSON_GetArraySize(mlp_only);
    if (n_dense > m->n_layers)
        return kvc__msgf(KVC_EINVAL, c->msg, c->len, "%llu dense layers but only %u layers",
                         (unsigned long long)n_dense, m->n_layers);
    m->n_dense_layers = (uint32_t)n_dense;
    return 0;
}

static int parse_images(const cfg_t *c, kvc_plan_model_t *m)
{
    int rc = get_u32(c, KEYS("mm_tokens_per_image", "image_seq_length", "num_image_tokens"),
                     KVC_PLAN_MAX_IMAGE_TOKENS, false, &m->image_tokens);
    if (rc || m->image_tokens) return rc;
    const cJSON *vision = cJSON_GetObjectItemCaseSensitive(c->root, "vision_config");
    if (!cJSON_IsObject(vision)) return 0;
    cfg_t v = {.root = vision, .msg = c->msg, .len = c->len};
    uint32_t size = 0, patch = 0;
    if ((rc = get_u32(&v, KEYS("image_size"), UINT32_MAX, false, &size))) return rc;
    if ((rc = get_u32(&v, KEYS("patch_size"), UINT32_MAX, false, &patch))) return rc;
    if (!size || !patch || size < patch) return 0;
    const uint64_t side = size / patch, tokens = side * side; /* < 2^64 for 32-bit sides */
    if (tokens > KVC_PLAN_MAX_IMAGE_TOKENS)
        return kvc__msgf(KVC_EINVAL, c->msg, c->len,
                         "vision_config: image_size %u / patch_size %u gives %llu image tokens, "
                         "over the bound %u",
                         size, patch, (unsigned long long)tokens, KVC_PLAN_MAX_IMAGE_TOKENS);
    m->image_tokens = (uint32_t)tokens;
    return 0;
}

/* Jamba (ai21labs/Jamba-v0.1; transformers' JambaConfig): Mamba-1 mixers in every layer but
 * every attn_layer_period-th (from attn_layer_offset), which attends; MoE every
 * expert_layer_period-th layer (from expert_layer_offset), a dense MLP in the others.  Absent
 * fields take JambaConfig's defaults (8, 4, 2, 1; d_state 16, d_conv 4, expand 2, dt_rank
 * "auto" = ceil(hidden / 16), a conv bias, no projection biases; 16 experts, 2 per token). */
static bool is_jamba(const cfg_t *c, const kvc_plan_model_t *m)
{
    return !strcmp(m->model_type, "jamba") || find(c, KEYS("attn_layer_period"), NULL) ||
           find(c, KEYS("mamba_d_state"), NULL);
}

static int parse_jamba(const cfg_t *c, kvc_plan_model_t *m)
{
    uint32_t period = 8, offset = 4, e_period = 2, e_offset = 1, d_state = 16, d_conv = 4,
             expand = 2;
    int rc;
    uint64_t v;
    bool present;
#define OPT(key, max, out)                                                     \
    do {                                                                       \
        if ((rc = get_uint(c, KEYS(key), max, true, &v, &present))) return rc; \
        if (present) out = (uint32_t)v;                                        \
    } while (0)
    OPT("attn_layer_period", KVC_PLAN_MAX_LAYERS, period);
    OPT("attn_layer_offset", KVC_PLAN_MAX_LAYERS, offset);
    OPT("expert_layer_period", KVC_PLAN_MAX_LAYERS, e_period);
    OPT("expert_layer_offset", KVC_PLAN_MAX_LAYERS, e_offset);
    OPT("mamba_d_state", KVC_PLAN_MAX_SSM_STATE, d_state);
    OPT("mamba_d_conv", KVC_PLAN_MAX_SSM_STATE, d_conv);
    OPT("mamba_expand", 64, expand);
#undef OPT
    if (!period || offset >= period)
        return kvc__msgf(KVC_EINVAL, c->msg, c->len,
                         "attn_layer_offset %u must be below attn_layer_period %u", offset, period);
    if (!d_state || d_conv < 2 || !expand)
        return kvc__msgf(KVC_EINVAL, c->msg, c->len,
                         "mamba_d_state %u, mamba_d_conv %u, mamba_expand %u: expected d_state and "
                         "expand >= 1, d_conv >= 2",
                         d_state, d_conv, expand);
    const uint64_t d_inner = (uint64_t)expand * m->hidden_size;
    if (d_inner > KVC_PLAN_MAX_INTERMEDIATE)
        return kvc__msgf(KVC_EINVAL, c->msg, c->len,
                         "mamba_expand %u x hidden_size %u is out of range: at most %u", expand,
                         m->hidden_size, KVC_PLAN_MAX_INTERMEDIATE);
    uint32_t dt_rank = (m->hidden_size + 15) / 16; /* "auto" */
    const cJSON *dt = find(c, KEYS("mamba_dt_rank"), NULL);
    if (dt && !(cJSON_IsString(dt) && !strcmp(dt->valuestring, "auto"))) {
        if ((rc = get_uint(c, KEYS("mamba_dt_rank"), KVC_PLAN_MAX_HIDDEN, false, &v, &present)))
            return rc;
        dt_rank = (uint32_t)v;
    }
    bool conv_bias = true, proj_bias = false;
    if ((rc = get_bool(c, KEYS("mamba_conv_bias"), &conv_bias, NULL))) return rc;
    if ((rc = get_bool(c, KEYS("mamba_proj_bias"), &proj_bias, NULL))) return rc;
    m->recurrent = KVC_PLAN_RECURRENT_MAMBA1;
    m->attn_layer_period = period;
    m->attn_layer_offset = offset;
    m->ssm_d_inner = (uint32_t)d_inner;
    m->ssm_d_state = d_state;
    m->ssm_d_conv = d_conv;
    m->ssm_dt_rank = dt_rank;
    m->ssm_conv_bias = conv_bias;
    m->ssm_proj_bias = proj_bias;
    m->ssm_inner_norms = true;
    m->n_recurrent_layers = 0;
    for (uint32_t i = 0; i < m->n_layers; i++) m->n_recurrent_layers += kvc__layer_recurrent(m, i);
    /* MoE: JambaConfig's defaults when num_experts is absent; one expert is a dense MLP */
    if (!find(c, KEYS("num_experts"), NULL)) {
        m->n_experts = 16;
        m->moe_intermediate_size = m->intermediate_size;
        if (!find(c, KEYS("num_experts_per_tok"), NULL)) m->n_experts_active = 2;
    }
    if (m->n_experts <= 1) {
        m->n_experts = m->n_experts_active = m->moe_intermediate_size = 0;
        m->n_dense_layers = 0;
        return 0;
    }
    if (!e_period || e_offset >= e_period)
        return kvc__msgf(KVC_EINVAL, c->msg, c->len,
                         "expert_layer_offset %u must be below expert_layer_period %u", e_offset,
                         e_period);
    m->moe_layer_period = e_period;
    m->moe_layer_offset = e_offset;
    uint32_t n_moe = 0;
    for (uint32_t i = 0; i < m->n_layers; i++) n_moe += kvc__layer_moe(m, i);
    m->n_dense_layers = m->n_layers - n_moe;
    return 0;
}

/* The hybrid families read from their own fields (the rest are refused below). */
typedef enum { HY_NONE = 0, HY_MAMBA2, HY_NEMOTRON_H, HY_QWEN3_NEXT } hybrid_t;

static bool arch_is(const cfg_t *c, const char *arch)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(c->root, "architectures");
    const cJSON *first = cJSON_IsArray(a) ? cJSON_GetArrayItem(a, 0) : NULL;
    return cJSON_IsString(first) && !strcmp(first->valuestring, arch);
}

static hybrid_t hybrid_family(const cfg_t *c, const kvc_plan_model_t *m)
{
    if (!strcmp(m->model_type, "mamba2") || arch_is(c, "Mamba2ForCausalLM")) return HY_MAMBA2;
    if (!strcmp(m->model_type, "nemotron_h") || arch_is(c, "NemotronHForCausalLM") ||
        find(c, KEYS("hybrid_override_pattern"), NULL))
        return HY_NEMOTRON_H;
    if (!strcmp(m->model_type, "qwen3_next") || arch_is(c, "Qwen3NextForCausalLM") ||
        find(c, KEYS("linear_num_value_heads"), NULL))
        return HY_QWEN3_NEXT;
    return HY_NONE;
}

/* A field that sizes the recurrent state.  transformers has defaults for them (the sizes of
 * one published checkpoint), but a config that leaves one out would have its state sized as
 * another model's: it is refused, naming the field. */
static int get_state_u32(const cfg_t *c, const char *const *keys, uint32_t max, uint32_t *out)
{
    return get_u32(c, keys, max, true, out);
}

/* Mamba-2 mixer fields under their keys (Mamba2Config: num_heads, head_dim, state_size,
 * n_groups, conv_kernel; NemotronHConfig: mamba_num_heads, mamba_head_dim, ssm_state_size,
 * n_groups, conv_kernel). */
static int parse_mamba2_mixer(const cfg_t *c, kvc_plan_model_t *m, const char *const *heads,
                              const char *const *head_dim, const char *const *state,
                              const char *const *groups, const char *const *kernel,
                              bool check_expand)
{
    int rc;
    if ((rc = get_state_u32(c, heads, KVC_PLAN_MAX_HEADS, &m->ssm_n_heads))) return rc;
    if ((rc = get_state_u32(c, head_dim, KVC_PLAN_MAX_HEAD_DIM, &m->ssm_head_dim))) return rc;
    if ((rc = get_state_u32(c, state, KVC_PLAN_MAX_SSM_STATE, &m->ssm_d_state))) return rc;
    if ((rc = get_state_u32(c, groups, KVC_PLAN_MAX_HEADS, &m->ssm_n_groups))) return rc;
    if ((rc = get_state_u32(c, kernel, KVC_PLAN_MAX_SSM_STATE, &m->ssm_d_conv))) return rc;
    const uint64_t d_inner = (uint64_t)m->ssm_n_heads * m->ssm_head_dim;
    if (d_inner > KVC_PLAN_MAX_INTERMEDIATE)
        return kvc__msgf(KVC_EINVAL, c->msg, c->len, "%s %u x %s %u is out of range: at most %u",
                         heads[0], m->ssm_n_heads, head_dim[0], m->ssm_head_dim,
                         KVC_PLAN_MAX_INTERMEDIATE);
    /* transformers' Mamba2Mixer is expand x hidden_size wide and Mamba2Config refuses a config
     * where that is not num_heads x head_dim; NemotronHMamba2Mixer is mamba_num_heads x
     * mamba_head_dim wide whatever expand says (the Nemotron 3 Nano: 64 x 64 = 4,096 with
     * expand 2 and hidden 2,688) */
    if (check_expand) {
        uint32_t expand = 0;
        if ((rc = get_u32(c, KEYS("expand"), 64, false, &expand))) return rc;
        if (expand && (uint64_t)expand * m->hidden_size != d_inner)
            return kvc__msgf(
                KVC_EINVAL, c->msg, c->len, "expand %u x hidden_size %u is not %s %u x %s %u",
                expand, m->hidden_size, heads[0], m->ssm_n_heads, head_dim[0], m->ssm_head_dim);
    }
    m->recurrent = KVC_PLAN_RECURRENT_MAMBA2;
    m->ssm_d_inner = (uint32_t)d_inner;
    m->ssm_conv_bias = true; /* Mamba2Config's and NemotronHConfig's use_conv_bias */
    m->ssm_proj_bias = false;
    if ((rc = get_bool(c, KEYS("use_conv_bias", "mamba_conv_bias"), &m->ssm_conv_bias, NULL)))
        return rc;
    if ((rc = get_bool(c, KEYS("use_bias", "mamba_proj_bias"), &m->ssm_proj_bias, NULL))) return rc;
    return 0;
}

/* Mamba-2 (Mamba2ForCausalLM, e.g. mistralai/Mamba-Codestral-7B-v0.1): every layer a Mamba-2
 * mixer and nothing else (one norm, no MLP: intermediate_size is the mixer's width), no
 * attention, so no KV at all: the per-request memory is the state.  Written as a layer
 * pattern of all 'M'. */
static int parse_mamba2(const cfg_t *c, kvc_plan_model_t *m)
{
    int rc = parse_mamba2_mixer(c, m, KEYS("num_heads"), KEYS("head_dim"), KEYS("state_size"),
                                KEYS("n_groups"), KEYS("conv_kernel"), true);
    if (rc) return rc;
    memset(m->layer_pattern, 'M', m->n_layers);
    m->layer_pattern[m->n_layers] = 0;
    m->n_recurrent_layers = m->n_layers;
    m->n_heads = m->n_kv_heads = m->head_dim = m->v_head_dim = 0;
    m->intermediate_size = 0;
    return 0;
}

/* Nemotron-H (NemotronHForCausalLM; nvidia/Nemotron-H-8B-Base-8K, the Nemotron 3 Nano 30B-A3B):
 * hybrid_override_pattern (or layers_block_type) gives each layer one block: M a Mamba-2 mixer,
 * * attention (no RoPE, GQA), - a squared-ReLU MLP (up and down), E an MoE of such experts with
 * shared ones of moe_shared_expert_intermediate_size. */
static int parse_nemotron_h(const cfg_t *c, kvc_plan_model_t *m)
{
    const cJSON *pat = find(c, KEYS("hybrid_override_pattern"), NULL);
    const cJSON *types = find(c, KEYS("layers_block_type"), NULL);
    char buf[KVC_PLAN_MAX_LAYERS + 1];
    size_t n = 0;
    if (pat) {
        if (!cJSON_IsString(pat))
            return kvc__msgf(KVC_EPARSE, c->msg, c->len,
                             "hybrid_override_pattern: expected a string");
        n = strlen(pat->valuestring);
        if (n != m->n_layers)
            return kvc__msgf(KVC_EINVAL, c->msg, c->len,
                             "hybrid_override_pattern has %zu layers but num_hidden_layers is %u",
                             n, m->n_layers);
        memcpy(buf, pat->valuestring, n);
    } else if (types) {
        if (!cJSON_IsArray(types))
            return kvc__msgf(KVC_EPARSE, c->msg, c->len, "layers_block_type: expected an array");
        if ((uint32_t)cJSON_GetArraySize(types) != m->n_layers)
            return kvc__msgf(KVC_EINVAL, c->msg, c->len,
                             "layers_block_type has %d layers but num_hidden_layers is %u",
                             cJSON_GetArraySize(types), m->n_layers);
        const cJSON *t;
        cJSON_ArrayForEach(t, types)
        {
            const char *v = cJSON_IsString(t) ? t->valuestring : "";
            const char ch = !strcmp(v, "mamba")       ? 'M'
                            : !strcmp(v, "attention") ? '*'
                            : !strcmp(v, "mlp")       ? '-'
                            : !strcmp(v, "moe")       ? 'E'
                                                      : 0;
            if (!ch) {
                char shown[64];
                kvc__escape(shown, sizeof shown, v);
                return kvc__msgf(KVC_EINVAL, c->msg, c->len,
                                 "layers_block_type: '%.32s' is not mamba, attention, mlp or moe",
                                 shown);
            }
            buf[n++] = ch;
        }
    } else {
        return kvc__msgf(KVC_EINVAL, c->msg, c->len,
                         "hybrid_override_pattern is missing: the layers' kinds are unknown");
    }
    buf[n] = 0;
    for (size_t i = 0; i < n; i++)
        if (!strchr("M*-E", buf[i]))
            return kvc__msgf(KVC_EINVAL, c->msg, c->len,
                             "hybrid_override_pattern: layer %zu is '%c': expected M (Mamba), * "
                             "(attention), - (MLP) or E (MoE)",
                             i, buf[i] >= 0x20 && buf[i] < 0x7f ? buf[i] : '?');
    if (find(c, KEYS("moe_latent_size"), NULL))
        return kvc__msgf(KVC_EINVAL, c->msg, c->len,
                         "moe_latent_size: latent MoE projections are not modelled (refused "
                         "rather than sized as full-width experts)");
    int rc = parse_mamba2_mixer(c, m, KEYS("mamba_num_heads"), KEYS("mamba_head_dim"),
                                KEYS("ssm_state_size"), KEYS("n_groups", "mamba_n_groups"),
                                KEYS("conv_kernel", "mamba_d_conv"), false);
    if (rc) return rc;
    memcpy(m->layer_pattern, buf, n + 1);
    m->mlp_ungated = true;
    m->qkv_bias = false;
    bool bias = false;
    if ((rc = get_bool(c, KEYS("attention_bias"), &bias, NULL))) return rc;
    m->qkv_bias = bias;
    kvc__layer_counts_t lc;
    kvc__layer_counts(m, &lc);
    m->n_recurrent_layers = lc.recurrent;
    if (lc.moe) {
        /* parse_moe read n_routed_experts; the shared experts have their own width */
        uint32_t shared_w = 0;
        if ((rc = get_u32(c, KEYS("moe_shared_expert_intermediate_size"), KVC_PLAN_MAX_INTERMEDIATE,
                          false, &shared_w)))
            return rc;
        const uint64_t w = (uint64_t)(m->n_shared_experts ? m->n_shared_experts : 1) * shared_w;
        if (w > KVC_PLAN_MAX_INTERMEDIATE)
            return out_of_range(c->msg, c->len, "moe_shared_expert_intermediate_size", w,
                                KVC_PLAN_MAX_INTERMEDIATE);
        m->shared_expert_intermediate_size = (uint32_t)w;
        m->n_shared_experts = 0;
        if (!m->n_experts)
            return kvc__msgf(KVC_EINVAL, c->msg, c->len,
                             "hybrid_override_pattern has %u MoE layers (E) but n_routed_experts "
                             "is missing",
                             lc.moe);
    } else {
        m->n_experts = m->n_experts_active = m->moe_intermediate_size = 0;
        m->n_shared_experts = m->shared_expert_intermediate_size = 0;
    }
    m->n_dense_layers = m->n_experts ? lc.mlp : 0;
    return 0;
}

/* Qwen3-Next (Qwen3NextForCausalLM; Qwen/Qwen3-Next-80B-A3B): every full_attention_interval-th
 * layer (i % interval == interval - 1) is gated full attention, the others Gated DeltaNet linear
 * attention; MoE on every layer (parse_moe). */
static int parse_qwen3_next(const cfg_t *c, kvc_plan_model_t *m)
{
    int rc;
    uint32_t kh = 0, vh = 0, kd = 0, vd = 0, kernel = 0, interval = 0;
    if ((rc = get_state_u32(c, KEYS("linear_num_key_heads"), KVC_PLAN_MAX_HEADS, &kh))) return rc;
    if ((rc = get_state_u32(c, KEYS("linear_num_value_heads"), KVC_PLAN_MAX_HEADS, &vh))) return rc;
    if ((rc = get_state_u32(c, KEYS("linear_key_head_dim"), KVC_PLAN_MAX_SSM_STATE, &kd)))
        return rc;
    if ((rc = get_state_u32(c, KEYS("linear_value_head_dim"), KVC_PLAN_MAX_HEAD_DIM, &vd)))
        return rc;
    if ((rc = get_state_u32(c, KEYS("linear_conv_kernel_dim"), KVC_PLAN_MAX_SSM_STATE, &kernel)))
        return rc;
    if ((rc = get_u32(c, KEYS("full_attention_interval"), KVC_PLAN_MAX_LAYERS, false, &interval)))
        return rc;
    const cJSON *types = find(c, KEYS("layer_types"), NULL);
    if (!interval && !types)
        return kvc__msgf(KVC_EINVAL, c->msg, c->len,
                         "full_attention_interval is missing: which layers attend is unknown");
    if (types) {
        /* the list must be the periodic one: an irregular one is not modelled */
        if (!cJSON_IsArray(types) || (uint32_t)cJSON_GetArraySize(types) != m->n_layers)
            return kvc__msgf(KVC_EINVAL, c->msg, c->len,
                             "layer_types: expected one entry per layer (%u)", m->n_layers);
        uint32_t first_full = 0;
        bool seen = false;
        const cJSON *t;
        uint32_t i = 0;
        cJSON_ArrayForEach(t, types)
        {
            if (!seen && cJSON_IsString(t) && !strcmp(t->valuestring, "full_attention")) {
                first_full = i;
                seen = true;
            }
            i++;
        }
        if (!interval) interval = seen ? first_full + 1 : m->n_layers + 1;
        i = 0;
        cJSON_ArrayForEach(t, types)
        {
            const bool full = (i + 1) % interval == 0;
            const char *want = full ? "full_attention" : "linear_attention";
            if (!cJSON_IsString(t) || strcmp(t->valuestring, want))
                return kvc__msgf(KVC_EINVAL, c->msg, c->len,
                                 "layer_types: layer %u is not %s, as full_attention_interval %u "
                                 "gives: an irregular pattern is not modelled",
                                 i, want, interval);
            i++;
        }
    }
    const uint64_t d_inner = (uint64_t)vh * vd;
    if (d_inner > KVC_PLAN_MAX_INTERMEDIATE)
        return out_of_range(c->msg, c->len, "linear_num_value_heads x linear_value_head_dim",
                            d_inner, KVC_PLAN_MAX_INTERMEDIATE);
    m->recurrent = KVC_PLAN_RECURRENT_GDN;
    m->ssm_n_heads = vh;
    m->ssm_head_dim = vd;
    m->ssm_n_groups = kh;
    m->ssm_d_state = kd;
    m->ssm_d_conv = kernel;
    m->ssm_d_inner = (uint32_t)d_inner;
    m->ssm_conv_bias = false;
    m->attn_output_gate = true;
    m->attn_layer_period = interval;
    m->attn_layer_offset = interval - 1;
    m->n_recurrent_layers = 0;
    for (uint32_t i = 0; i < m->n_layers; i++) m->n_recurrent_layers += kvc__layer_recurrent(m, i);
    return 0;
}

/* Recurrent and hybrid models other than Jamba's (Mamba, Nemotron-H, Qwen3-Next, Falcon-H1,
 * Zamba, ...) keep a fixed-size state per layer instead of KV in some or all layers in ways
 * the planner does not model: sized as all-attention they come out wrong, so the field that
 * says so is named and refused. */
static int refuse_recurrent(const cfg_t *c, const kvc_plan_model_t *m)
{
    static const char *const keys[] = {
        "layers_block_type",
        "hybrid_override_pattern",
        "full_attention_interval",
        "linear_num_value_heads",
        "ssm_state_size",
        "ssm_cfg",
        "mamba_n_groups",
        "mamba_n_heads",
        "mamba_head_dim",
        "mamba_num_heads",
        "state_size",
        "time_step_rank",
        "lru_width",
        "block_types",
    };
    for (size_t i = 0; i < KVC_ARRAY_LEN(keys); i++) {
        const char *k[] = {keys[i], NULL};
        if (find(c, k, NULL))
            return kvc__msgf(
                KVC_EINVAL, c->msg, c->len,
                "%s: a recurrent or hybrid (attention + state-space) model; its "
                "recurrent layers hold a fixed state, not KV, and the planner does not "
                "model them (refused rather than sized as all-attention)",
                keys[i]);
    }
    static const char *const types[] = {
        "mamba",  "mamba2",          "falcon_h1", "nemotron_h", "qwen3_next",      "zamba",
        "zamba2", "recurrent_gemma", "rwkv",      "bamba",      "granitemoehybrid"};
    for (size_t i = 0; i < KVC_ARRAY_LEN(types); i++)
        if (!strcmp(m->model_type, types[i]))
            return kvc__msgf(KVC_EINVAL, c->msg, c->len,
                             "model_type %s: a recurrent or hybrid model; its recurrent layers "
                             "hold a fixed state, not KV, and the planner does not model them "
                             "(refused rather than sized as all-attention)",
                             types[i]);
    return 0;
}

/* The vision tower of a multimodal config: a ViT of vision_config's widths (per layer the
 * q, k, v, o projections with biases, a two-matrix MLP with biases, two LayerNorms; a patch
 * embedding, one position per patch and a class token) and a two-layer projector into the
 * language model's width (LLaVA's mlp2x).  A vision_config that gives widths but not all of
 * them is refused, naming the field, rather than left out of the weights. */
static int parse_vision_tower(const cfg_t *c, kvc_plan_model_t *m)
{
    const cJSON *vision = cJSON_GetObjectItemCaseSensitive(c->root, "vision_config");
    if (!cJSON_IsObject(vision)) return 0;
    cfg_t v = {.root = vision, .msg = c->msg, .len = c->len};
    uint32_t hv = 0, iv = 0, lv = 0, patch = 0, size = 0, ch = 3;
    int rc;
    if ((rc = get_u32(&v, KEYS("hidden_size", "embed_dim", "width"), KVC_PLAN_MAX_HIDDEN, false,
                      &hv)))
        return rc;
    if (!hv)
        return kvc__msgf(KVC_EINVAL, c->msg, c->len,
                         "vision_config.hidden_size is missing: the vision tower's weights cannot "
                         "be sized");
    if ((rc = get_u32(&v, KEYS("intermediate_size", "mlp_dim"), KVC_PLAN_MAX_INTERMEDIATE, false,
                      &iv)))
        return rc;
    if ((rc = get_u32(&v, KEYS("num_hidden_layers", "depth", "layers"), KVC_PLAN_MAX_LAYERS, false,
                      &lv)))
        return rc;
    if ((rc = get_u32(&v, KEYS("patch_size"), 4096, false, &patch))) return rc;
    if ((rc = get_u32(&v, KEYS("image_size"), 1u << 20, false, &size))) return rc;
    if ((rc = get_u32(&v, KEYS("num_channels", "in_channels"), 16, false, &ch))) return rc;
    const char *missing = !iv      ? "intermediate_size"
                          : !lv    ? "num_hidden_layers"
                          : !patch ? "patch_size"
                          : !size  ? "image_size"
                                   : NULL;
    if (missing)
        return kvc__msgf(KVC_EINVAL, c->msg, c->len,
                         "vision_config.%s is missing: the vision tower's weights cannot be sized",
                         missing);
    const uint64_t H = hv, I = iv, side = size / patch, Ht = m->hidden_size;
    const uint64_t layer = 4 * H * H + 4 * H + 2 * H * I + I + H + 4 * H;
    const uint64_t embed = (uint64_t)ch * patch * patch * H + H + (side * side + 1) * H + H;
    const uint64_t projector = H * Ht + Ht + Ht * Ht + Ht;
    m->vision_params = lv * layer + embed + projector + 2 * H; /* + the final LayerNorm */
    m->vision_hidden = hv;
    m->vision_intermediate = iv;
    m->vision_layers = lv;
    m->vision_tokens = (uint32_t)KVC_MIN(side * side + 1, UINT32_MAX);
    return 0;
}

/* config.json's quantization_config (at the top or in the text model's config): what the
 * checkpoint's weights are stored as (see kvc_plan_model_t.checkpoint_quant). */
static void parse_quantization(const cfg_t *c, kvc_plan_model_t *m)
{
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(c->root, "quantization_config");
    if (!cJSON_IsObject(q) && c->text)
        q = cJSON_GetObjectItemCaseSensitive(c->text, "quantization_config");
    if (!cJSON_IsObject(q)) return;
    const cJSON *method = cJSON_GetObjectItemCaseSensitive(q, "quant_method");
    snprintf(m->checkpoint_quant, sizeof m->checkpoint_quant, "%s",
             cJSON_IsString(method) && method->valuestring[0] ? method->valuestring : "?");
    const char *name = m->checkpoint_quant;
    const cJSON *bits = cJSON_GetObjectItemCaseSensitive(q, "bits");
    const int b = cJSON_IsNumber(bits) ? (int)bits->valuedouble : 4;
    m->checkpoint_dtype_known = true;
    if (!strcasecmp(name, "fp8") || !strcasecmp(name, "fbgemm_fp8")) {
        m->checkpoint_dtype = KVC_PLAN_FP8;
    } else if ((!strcasecmp(name, "awq") || !strcasecmp(name, "gptq")) && (b == 4 || b == 8)) {
        m->checkpoint_dtype = b == 4 ? KVC_PLAN_INT4 : KVC_PLAN_INT8;
    } else if (!strcasecmp(name, "bitsandbytes")) {
        const bool four = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(q, "load_in_4bit"));
        const bool eight = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(q, "load_in_8bit"));
        m->checkpoint_dtype_known = four != eight;
        m->checkpoint_dtype = four ? KVC_PLAN_INT4 : KVC_PLAN_INT8;
    } else if (!strcasecmp(name, "modelopt")) {
        const cJSON *algo = cJSON_GetObjectItemCaseSensitive(q, "quant_algo");
        m->checkpoint_dtype_known = cJSON_IsString(algo) && !strcasecmp(algo->valuestring, "NVFP4");
        m->checkpoint_dtype = KVC_PLAN_NVFP4;
    } else {
        m->checkpoint_dtype_known = false;
    }
}

static int parse_config(const cfg_t *c, kvc_plan_model_t *m)
{
    int rc;
    const cJSON *mt = find(c, KEYS("model_type"), NULL);
    if (cJSON_IsString(mt)) snprintf(m->model_type, sizeof m->model_type, "%s", mt->valuestring);

    if ((rc = get_u32(c, KEYS("hidden_size", "n_embd", "d_model"), KVC_PLAN_MAX_HIDDEN, true,
                      &m->hidden_size)))
        return rc;
    if ((rc = get_u32(c, KEYS("num_hidden_layers", "n_layer", "num_layers"), KVC_PLAN_MAX_LAYERS,
                      true, &m->n_layers)))
        return rc;
    /* Mamba-2 has no attention: its attention fields are absent (or describe nothing) */
    const hybrid_t hy = hybrid_family(c, m);
    if (hy != HY_MAMBA2 && (rc = get_u32(c, KEYS("num_attention_heads", "n_head"),
                                         KVC_PLAN_MAX_HEADS, true, &m->n_heads)))
        return rc;
    if ((rc = get_u32(c, KEYS("vocab_size"), KVC_PLAN_MAX_VOCAB, true, &m->vocab_size))) return rc;
    if ((rc = get_u32(c, KEYS("intermediate_size", "ffn_dim", "n_inner"), KVC_PLAN_MAX_INTERMEDIATE,
                      false, &m->intermediate_size)))
        return rc;

    /* MLA: the cache holds one latent per token and layer. */
    uint32_t kv_lora = 0;
    if ((rc = get_u32(c, KEYS("kv_lora_rank"), KVC_PLAN_MAX_RANK, false, &kv_lora))) return rc;
    if (hy == HY_MAMBA2) {
        /* no attention layer */
    } else if (kv_lora) {
        m->mla = true;
        m->kv_lora_rank = kv_lora;
        if ((rc = get_u32(c, KEYS("qk_rope_head_dim"), KVC_PLAN_MAX_HEAD_DIM, true,
                          &m->qk_rope_head_dim)))
            return rc;
        if ((rc = get_u32(c, KEYS("qk_nope_head_dim"), KVC_PLAN_MAX_HEAD_DIM, true,
                          &m->qk_nope_head_dim)))
            return rc;
        if ((rc = get_u32(c, KEYS("v_head_dim"), KVC_PLAN_MAX_HEAD_DIM, true, &m->v_head_dim)))
            return rc;
        if ((rc = get_u32(c, KEYS("q_lora_rank"), KVC_PLAN_MAX_RANK, false, &m->q_lora_rank)))
            return rc;
        m->head_dim = m->qk_nope_head_dim + m->qk_rope_head_dim;
        m->n_kv_heads = m->n_heads;
    } else {
        m->n_kv_heads = m->n_heads; /* transformers' default: multi-head attention */
        bool mqa = false, mqa_present = false;
        if ((rc = get_bool(c, KEYS("multi_query"), &mqa, &mqa_present))) return rc;
        if (mqa_present && mqa) m->n_kv_heads = 1;
        if ((rc = get_u32(
                 c,
                 KEYS("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num"),
                 KVC_PLAN_MAX_HEADS, false, &m->n_kv_heads)))
            return rc;
        if ((rc = get_u32(c, KEYS("head_dim", "attention_head_dim"), KVC_PLAN_MAX_HEAD_DIM, false,
                          &m->head_dim)))
            return rc;
        if (!m->head_dim) {
            if (m->hidden_size % m->n_heads)
                return kvc__msgf(KVC_EINVAL, c->msg, c->len,
                                 "head_dim is missing and hidden_size %u is not a multiple of "
                                 "num_attention_heads %u",
                                 m->hidden_size, m->n_heads);
            m->head_dim = m->hidden_size / m->n_heads;
        }
        m->v_head_dim = m->head_dim;
    }

    m->tie_embeddings = true; /* PretrainedConfig's default */
    if ((rc = get_bool(c, KEYS("tie_word_embeddings"), &m->tie_embeddings, NULL))) return rc;
    bool bias = false, bias_present = false;
    if ((rc = get_bool(c, KEYS("attention_bias", "qkv_bias"), &bias, &bias_present))) return rc;
    m->qkv_bias = bias_present ? bias : !strncmp(m->model_type, "qwen2", 5);

    uint64_t maxpos = 0;
    bool present;
    if ((rc = get_uint(
             c, KEYS("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"),
             KVC_PLAN_MAX_TOKENS, false, &maxpos, &present)))
        return rc;
    m->max_position_embeddings = maxpos;

    if (hy == HY_NONE && (rc = refuse_recurrent(c, m))) return rc;
    if ((rc = parse_moe(c, m))) return rc;
    switch (hy) {
    case HY_MAMBA2:
        rc = parse_mamba2(c, m);
        break;
    case HY_NEMOTRON_H:
        rc = parse_nemotron_h(c, m);
        break;
    case HY_QWEN3_NEXT:
        rc = parse_qwen3_next(c, m);
        break;
    default:
        rc = is_jamba(c, m) ? parse_jamba(c, m) : 0;
        break;
    }
    if (rc) return rc;
    if ((rc = parse_sliding(c, m))) return rc;
    if ((rc = parse_images(c, m))) return rc;
    if ((rc = parse_vision_tower(c, m))) return rc;
    parse_quantization(c, m);
    return kvc_plan_model_check(m, c->msg, c->len);
}

/* JSON text holds no NUL and no raw control byte but whitespace between tokens;
 * cJSON accepts both (a NUL cut a string short, and what followed it went
 * unread), so they are refused here first. */
static int check_bytes(const char *text, size_t len, char *msg, size_t msg_len)
{
    bool in_string = false, escaped = false;
    for (size_t i = 0; i < len; i++) {
        const unsigned char ch = (unsigned char)text[i];
        if (ch == 0) return kvc__msgf(KVC_EPARSE, msg, msg_len, "a NUL byte at byte %zu", i);
        if (ch < 0x20 && (in_string || (ch != '\t' && ch != '\n' && ch != '\r')))
            return kvc__msgf(KVC_EPARSE, msg, msg_len,
                             "a raw control byte 0x%02x at byte %zu (JSON escapes it)", ch, i);
        if (escaped)
            escaped = false;
        else if (in_string && ch == '\\')
            escaped = true;
        else if (ch == '"')
            in_string = !in_string;
    }
    return 0;
}

int kvc_plan_model_from_json(const char *text, size_t len, const char *name, kvc_plan_model_t *out,
                             char *msg, size_t msg_len)
{
    if (!text || !out) return kvc__msgf(KVC_EINVAL, msg, msg_len, "no config text");
    int rc = check_bytes(text, len, msg, msg_len);
    if (rc) return rc;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, false);
    if (!root) {
        size_t at = end && end >= text ? (size_t)(end - text) : 0;
        return kvc__msgf(KVC_EPARSE, msg, msg_len, "malformed JSON at byte %zu", at);
    }
    size_t at = (size_t)(end - text);
    while (at < len &&
           (text[at] == ' ' || text[at] == '\t' || text[at] == '\n' || text[at] == '\r'))
        at++;
    if (at < len) {
        rc = kvc__msgf(KVC_EPARSE, msg, msg_len, "trailing text at byte %zu after the JSON value",
                       at);
    } else if (!cJSON_IsObject(root)) {
        rc = kvc__msgf(KVC_EPARSE, msg, msg_len, "expected a JSON object at the top");
    } else {
        cfg_t c = {.root = root, .msg = msg, .len = msg_len};
        static const char *const nested[] = {"text_config", "llm_config", "language_config"};
        for (size_t i = 0; i < KVC_ARRAY_LEN(nested) && !c.text; i++) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, nested[i]);
            if (cJSON_IsObject(t)) c.text = t;
        }
        kvc_plan_model_t m = {0};
        if (name) snprintf(m.name, sizeof m.name, "%s", name);
        rc = parse_config(&c, &m);
        if (!rc) *out = m;
    }
    cJSON_Delete(root);
    return rc;
}

int kvc_plan_model_load(const char *path, kvc_plan_model_t *out, char *msg, size_t msg_len)
{
    enum { MAX_CONFIG = 16 << 20 };
    if (!path || !out) return kvc__msgf(KVC_EINVAL, msg, msg_len, "no config path");
    /* The path as messages show it: a control byte in it is escaped, never echoed. */
    char shown[512];
    kvc__escape(shown, sizeof shown, path);
    FILE *f = fopen(path, "rb");
    if (!f) return kvc__msgf(KVC_EIO, msg, msg_len, "cannot open %s: %s", shown, strerror(errno));
    char *buf = malloc(MAX_CONFIG + 1);
    if (!buf) {
        fclose(f);
        return kvc__msgf(KVC_ENOMEM, msg, msg_len, "out of memory");
    }
    size_t n = fread(buf, 1, MAX_CONFIG + 1, f);
    int rc = 0;
    if (ferror(f))
        rc = kvc__msgf(KVC_EIO, msg, msg_len, "cannot read %s: %s", shown, strerror(errno));
    else if (n > MAX_CONFIG)
        rc = kvc__msgf(KVC_EOVERFLOW, msg, msg_len, "%s: larger than 16 MiB", shown);
    fclose(f);
    if (!rc) {
        /* Name it after the file, or after its folder for a hub snapshot's config.json. */
        char name[sizeof out->name];
        const char *base = strrchr(path, '/');
        if (base && !strcmp(base + 1, "config.json") && base > path) {
            const char *dir = base;
            while (dir > path && dir[-1] != '/') dir--;
            snprintf(name, sizeof name, "%.*s", (int)(base - dir), dir);
        } else {
            snprintf(name, sizeof name, "%s", base ? base + 1 : path);
        }
        char local[256] = "";
        rc = kvc_plan_model_from_json(buf, n, name, out, local, sizeof local);
        if (rc) kvc__msgf(rc, msg, msg_len, "%s: %s", shown, local);
    }
    free(buf);
    return rc;
}
