/* kvcache/model.h - the model layer: what a model file says about the model.
 *
 * This first part of the layer reads a model's hyperparameters from a GGUF
 * file's metadata alone (kvcache/gguf.h): the architecture, widths, layer and
 * head counts, normalisation, RoPE and its scaling, context length, tied
 * embeddings, sliding windows and soft-capping.  It hands the planner the
 * same model as a kvc_plan_model_t, so that `kvcache plan` and `kvcache
 * model info` size a GGUF exactly as they size its config.json.  (Loading the
 * weights, tokenizers and the forward pass come next: docs/design.md.)
 *
 * Architectures: llama (Llama 2/3/3.1/3.2, TinyLlama, Mistral, SmolLM), qwen2,
 * qwen3, gemma2.  Any other `general.architecture`, or a mixture-of-experts
 * file, is refused with KVC_ENOTSUP and a message naming it.
 *
 * Errors: 0 or a negative KVC_E* code, with one line in msg (may be NULL).
 * Thread-safety: the functions are reentrant; they only read the kvc_gguf_t.
 */
#ifndef KVCACHE_MODEL_H
#define KVCACHE_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "kvcache/gguf.h"
#include "kvcache/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    KVC_ARCH_LLAMA = 0,
    KVC_ARCH_QWEN2,
    KVC_ARCH_QWEN3,
    KVC_ARCH_GEMMA2,
    KVC_ARCH__COUNT
} kvc_arch_t;

/* "llama", "qwen2", "qwen3", "gemma2"; "?" outside the enum. */
KVC_API const char *kvc_arch_name(kvc_arch_t a);

typedef enum {
    KVC_ROPE_SCALING_NONE = 0,
    KVC_ROPE_SCALING_LINEAR, /* positions divided by the factor */
    KVC_ROPE_SCALING_YARN,
    KVC_ROPE_SCALING_LLAMA3, /* per-dimension frequency factors (the rope_freqs tensor) */
    KVC_ROPE_SCALING__COUNT
} kvc_rope_scaling_t;

/* "none", "linear", "yarn", "llama3"; "?" outside the enum. */
KVC_API const char *kvc_rope_scaling_name(kvc_rope_scaling_t s);

typedef struct {
    kvc_arch_t arch;
    char name[64];       /* general.name, truncated; "" when absent */
    uint32_t n_layers;   /* {arch}.block_count */
    uint32_t dim;        /* {arch}.embedding_length */
    uint32_t n_heads;    /* {arch}.attention.head_count */
    uint32_t n_kv_heads; /* {arch}.attention.head_count_kv (absent: n_heads) */
    uint32_t head_dim;   /* {arch}.attention.key_length (absent: dim / n_heads) */
    uint32_t v_head_dim; /* {arch}.attention.value_length (absent: head_dim) */
    uint32_t ff;         /* {arch}.feed_forward_length */
    uint32_t vocab;      /* {arch}.vocab_size, else the tokenizer's, else token_embd's rows */
    uint64_t ctx;        /* {arch}.context_length */
    double rms_eps;      /* {arch}.attention.layer_norm_rms_epsilon */
    double rope_theta;   /* {arch}.rope.freq_base (absent: 10000) */
    uint32_t rope_dim;   /* {arch}.rope.dimension_count (absent: head_dim) */
    kvc_rope_scaling_t rope_scaling;
    double rope_factor;        /* {arch}.rope.scaling.factor; 1 when none */
    uint64_t rope_orig_ctx;    /* {arch}.rope.scaling.original_context_length; 0 when absent */
    bool tied;                 /* no output.weight: the LM head is the embedding */
    bool qkv_bias;             /* attn_q.bias present (qwen2) */
    bool qk_norm;              /* per-head RMSNorm of Q and K (qwen3: attn_q_norm) */
    uint32_t sliding_window;   /* tokens; 0: none */
    uint32_t n_sliding_layers; /* layers that use it */
    bool sliding_even_layers;  /* gemma2: layers 0, 2, 4, ... slide; the others attend fully */
    double attn_softcap;       /* gemma2: attention logits soft-capped at this; 0: none */
    double final_softcap;      /* gemma2: output logits soft-capped; 0: none */
    double embed_scale;        /* gemma2: embeddings multiplied by sqrt(dim); 1 otherwise */
} kvc_model_hparams_t;

/* Read the hyperparameters of the model in `g`.  KVC_ENOTSUP (architecture
 * or a feature not supported, named), KVC_EPARSE (a key of the wrong type, a
 * required key missing, a value out of range or inconsistent: the message
 * names the key), KVC_EINVAL (g or out NULL).  *out is untouched on failure. */
KVC_API KVC_NODISCARD int kvc_model_hparams_from_gguf(const kvc_gguf_t *g, kvc_model_hparams_t *out,
                                                      char *msg, size_t cap);

/* The same model as the planner describes it (its name from h->name or
 * `fallback_name`).  The result passes kvc_plan_model_check whenever
 * kvc_model_hparams_from_gguf accepted h.  Cannot fail. */
KVC_API void kvc_model_hparams_to_plan(const kvc_model_hparams_t *h, const char *fallback_name,
                                       kvc_plan_model_t *out);

/* Open the GGUF at path and describe its model for the planner: the path to
 * `kvcache plan --model FILE.gguf`.  The errors of kvc_gguf_open and
 * kvc_model_hparams_from_gguf; msg says which. */
KVC_API KVC_NODISCARD int kvc_model_plan_from_gguf_file(const char *path, kvc_plan_model_t *out,
                                                        char *msg, size_t cap);

/* ---- tensor encodings (reference, scalar) ----
 * n f32 values to / from a tensor type's encoding in ggml's block layout:
 * F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K (see ggml_quant.c for the layouts).  n must be
 * a multiple of the type's block (KVC_EINVAL otherwise); other types are
 * KVC_ENOTSUP.  dst holds n / block x block bytes (kvc_ggml_type_size). */
KVC_API int kvc_ggml_quantize_row(uint32_t type, const float *x, void *dst, uint64_t n);
/* Whether the two functions here convert `type`. */
KVC_API bool kvc_ggml_codec_supported(uint32_t type);
KVC_API int kvc_ggml_dequantize_row(uint32_t type, const void *src, float *y, uint64_t n);

/* ---- random-weight models (kvcache model synth) ---- */
typedef struct {
    kvc_arch_t arch; /* llama, qwen2 (QKV bias), qwen3 (per-head Q/K RMSNorm), gemma2 */
    uint32_t dim, n_layers, n_heads, n_kv_heads, ff;
    uint32_t head_dim; /* 0: dim / n_heads (written as attention.key_length when it differs,
                          and always for qwen3 and gemma2) */
    uint32_t ctx;      /* context_length (default 2048) */
    uint32_t type;     /* the matrices' kvc_ggml_type_t; norms, biases, rope_freqs stay F32 */
    uint64_t seed;
    const char *name;        /* general.name (default "kvcache-synth") */
    bool tied;               /* no output.weight: the LM head is token_embd (default false) */
    float norm_jitter;       /* norm weights 1 + U(-j, j); < 0 (default): the architecture's own:
                                0 for llama (norms exactly 1), 0.1 for the others, so they matter */
    uint32_t sliding_window; /* llama: every layer slides (Mistral); gemma2: the even layers
                                (0: gemma2's 4096); qwen2 / qwen3 take none (default 0) */
    float attn_softcap, final_softcap; /* gemma2's soft-capping (< 0, the default: gemma2's
                                          50 and 30; 0: off); other architectures take none */
    kvc_rope_scaling_t rope_scaling;   /* default none */
    float rope_factor;      /* linear / yarn / llama3 factor (0: 4 for linear and yarn, 8 for
                               llama3) */
    uint32_t rope_orig_ctx; /* yarn: original_context_length (0: not written, which readers
                               take as the context length, as llama.cpp does); llama3: the
                               original context its rope_freqs are computed for (0: 8192) */
    double rope_theta;      /* rope.freq_base (0: 10000) */
} kvc_model_synth_t;

/* Defaults: llama, dim 512, 8 layers, 8 heads, 4 KV heads, FFN 1536, ctx
 * 2048, Q8_0, seed 1, untied, no sliding window, no RoPE scaling.  Never
 * fails. */
KVC_API kvc_model_synth_t kvc_model_synth_default(void);

/* Write a random-weight model to `path`: the tokenizer (every tokenizer.* key)
 * copied from `vocab`, llama.cpp's metadata keys, tensor names and shapes for
 * the architecture, matrices drawn uniformly in +-1/sqrt(fan-in) from `seed`
 * (the same seed, the same file, byte for byte), norms 1 + U(-norm_jitter,
 * norm_jitter) (gemma2's with the +1 already added, as llama.cpp's converter
 * stores them), qwen2's biases U(-0.2, 0.2), llama3's rope_freqs.weight as
 * Llama 3.1 computes it (low / high frequency factors 1 and 4).  A llama
 * model with the defaults of every field after `name` is the file earlier
 * versions wrote.  KVC_EINVAL (a width not a multiple of the type's block,
 * heads that do not divide, an odd head dim, a count out of the planner's
 * bounds, a feature the architecture does not have, such as soft-capping
 * outside gemma2 or a sliding window on qwen: the message says which),
 * KVC_ENOTSUP (a type the reference converters do not write yet, an
 * architecture outside the enum), KVC_EPARSE (vocab has no tokenizer),
 * KVC_EIO, KVC_ENOMEM. */
KVC_API KVC_NODISCARD int kvc_model_synth(const kvc_model_synth_t *p, const kvc_gguf_t *vocab,
                                          const char *path, char *msg, size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* KVCACHE_MODEL_H */
