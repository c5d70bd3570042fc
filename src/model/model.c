/* model.c - a model's hyperparameters from GGUF metadata, and the planner's view of them
 * (see kvcache/model.h).  Keys are llama.cpp's (`{arch}.block_count`, ...); every value
 * read is type-checked by the GGUF reader and range-checked here, and the result is
 * checked once more by the planner's own bounds, so a hostile file cannot make a count
 * wrap or a division by zero. */
#include "kvcache/model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "util/msg.h"

static const char *const arch_names[KVC_ARCH__COUNT] = {"llama", "qwen2", "qwen3", "gemma2"};
static const char *const scaling_names[KVC_ROPE_SCALING__COUNT] = {"none", "linear", "yarn",
                                                                   "llama3"};

const char *kvc_arch_name(kvc_arch_t a)
{
    return (unsigned)a < KVC_ARCH__COUNT ? arch_names[a] : "?";
}

const char *kvc_rope_scaling_name(kvc_rope_scaling_t s)
{
    return (unsigned)s < KVC_ROPE_SCALING__COUNT ? scaling_names[s] : "?";
}

typedef struct {
    const kvc_gguf_t *g;
    const char *arch;
    char *msg;
    size_t cap;
    char key[128];
} rd_t;

static const char *akey(rd_t *r, const char *suffix)
{
    snprintf(r->key, sizeof r->key, "%s.%s", r->arch, suffix);
    return r->key;
}

static int why(rd_t *r, int rc, const char *key, const char *want)
{
    if (rc == KVC_ENOENT) return kvc__msgf(KVC_EPARSE, r->msg, r->cap, "%s: missing", key);
    if (rc == KVC_ERANGE)
        return kvc__msgf(KVC_EPARSE, r->msg, r->cap, "%s: out of range for %s", key, want);
    return kvc__msgf(KVC_EPARSE, r->msg, r->cap, "%s: not %s", key, want);
}

/* A count in 1..max; `def` when absent (0: required). */
static int count(rd_t *r, const char *key, uint32_t def, uint32_t max, uint32_t *out)
{
    uint64_t v;
    int rc = kvc_gguf_get_u64(r->g, key, &v);
    if (rc == KVC_ENOENT && def) {
        *out = def;
        return 0;
    }
    if (rc) return why(r, rc, key, "a non-negative integer");
    if (v < 1 || v > max)
        return kvc__msgf(KVC_EPARSE, r->msg, r->cap, "%s: %llu is out of range: 1..%u", key,
                         (unsigned long long)v, max);
    *out = (uint32_t)v;
    return 0;
}

/* A finite number in (lo, hi]; `def` when absent (NAN: required). */
static int real(rd_t *r, const char *key, double def, double lo, double hi, double *out)
{
    double v;
    int rc = kvc_gguf_get_f64(r->g, key, &v);
    if (rc == KVC_ENOENT && !isnan(def)) {
        *out = def;
        return 0;
    }
    if (rc) return why(r, rc, key, "a number");
    if (!(v > lo && v <= hi))
        return kvc__msgf(KVC_EPARSE, r->msg, r->cap, "%s: %g is out of range: (%g, %g]", key, v, lo,
                         hi);
    *out = v;
    return 0;
}

static bool has_tensor(const kvc_gguf_t *g, const char *name)
{
    return kvc_gguf_find_tensor(g, name) != NULL;
}

static int read_arch(rd_t *r, kvc_model_hparams_t *h)
{
    kvc_gguf_str_t s;
    int rc = kvc_gguf_get_str(r->g, "general.architecture", &s);
    if (rc) return why(r, rc, "general.architecture", "a string");
    for (int a = 0; a < KVC_ARCH__COUNT; a++)
        if (kvc_gguf_str_eq(s, arch_names[a])) {
            h->arch = (kvc_arch_t)a;
            r->arch = arch_names[a];
            return 0;
        }
    char buf[40];
    size_t n = s.len < sizeof buf - 1 ? (size_t)s.len : sizeof buf - 1;
    for (size_t i = 0; i < n; i++) buf[i] = s.s[i] >= 0x20 && s.s[i] < 0x7f ? s.s[i] : '?';
    buf[n] = 0;
    return kvc__msgf(KVC_ENOTSUP, r->msg, r->cap,
                     "architecture '%s' is not supported (llama, qwen2, qwen3, gemma2)", buf);
}

static int read_shape(rd_t *r, kvc_model_hparams_t *h)
{
    int rc;
    if ((rc = count(r, akey(r, "block_count"), 0, KVC_PLAN_MAX_LAYERS, &h->n_layers))) return rc;
    if ((rc = count(r, akey(r, "embedding_length"), 0, KVC_PLAN_MAX_HIDDEN, &h->dim))) return rc;
    if ((rc = count(r, akey(r, "attention.head_count"), 0, KVC_PLAN_MAX_HEADS, &h->n_heads)))
        return rc;
    if ((rc = count(r, akey(r, "attention.head_count_kv"), h->n_heads, KVC_PLAN_MAX_HEADS,
                    &h->n_kv_heads)))
        return rc;
    if (h->n_heads % h->n_kv_heads)
        return kvc__msgf(KVC_EPARSE, r->msg, r->cap, "%u KV heads do not divide %u query heads",
                         h->n_kv_heads, h->n_heads);
    const uint32_t hd = h->dim / h->n_heads;
    if ((rc = count(r, akey(r, "attention.key_length"), hd ? hd : 0, KVC_PLAN_MAX_HEAD_DIM,
                    &h->head_dim)))
        return rc;
    if ((rc = count(r, akey(r, "attention.value_length"), h->head_dim, KVC_PLAN_MAX_HEAD_DIM,
                    &h->v_head_dim)))
        return rc;
    if ((rc = count(r, akey(r, "feed_forward_length"), 0, KVC_PLAN_MAX_INTERMEDIATE, &h->ff)))
        return rc;
    uint32_t ctx;
    if ((rc = count(r, akey(r, "context_length"), 0, UINT32_MAX, &ctx))) return rc;
    h->ctx = ctx;
    /* the vocabulary: declared, else the tokenizer's, else the embedding's rows */
    const kvc_gguf_tensor_t *emb = kvc_gguf_find_tensor(r->g, "token_embd.weight");
    kvc_gguf_arr_t tok;
    uint32_t vocab = 0;
    if (kvc_gguf_get_arr(r->g, "tokenizer.ggml.tokens", &tok) == 0 && tok.n &&
        tok.n <= KVC_PLAN_MAX_VOCAB)
        vocab = (uint32_t)tok.n;
    else if (emb && emb->n_dims == 2 && emb->ne[1] <= KVC_PLAN_MAX_VOCAB)
        vocab = (uint32_t)emb->ne[1];
    if ((rc = count(r, akey(r, "vocab_size"), vocab, KVC_PLAN_MAX_VOCAB, &h->vocab))) return rc;
    if (emb && (emb->n_dims != 2 || emb->ne[0] != h->dim || emb->ne[1] != h->vocab))
        return kvc__msgf(KVC_EPARSE, r->msg, r->cap,
                         "token_embd.weight is [%llu, %llu], the metadata says [%u, %u]",
                         (unsigned long long)emb->ne[0], (unsigned long long)emb->ne[1], h->dim,
                         h->vocab);
    return 0;
}

static int read_rope(rd_t *r, kvc_model_hparams_t *h)
{
    int rc;
    if ((rc = real(r, akey(r, "attention.layer_norm_rms_epsilon"), NAN, 0, 1, &h->rms_eps)))
        return rc;
    if ((rc = real(r, akey(r, "rope.freq_base"), 10000.0, 0, 1e12, &h->rope_theta))) return rc;
    if ((rc = count(r, akey(r, "rope.dimension_count"), h->head_dim, h->head_dim, &h->rope_dim)))
        return rc;
    if (h->rope_dim % 2)
        return kvc__msgf(KVC_EPARSE, r->msg, r->cap, "%s: %u is odd", r->key, h->rope_dim);
    h->rope_scaling = KVC_ROPE_SCALING_NONE;
    h->rope_factor = 1.0;
    kvc_gguf_str_t s;
    rc = kvc_gguf_get_str(r->g, akey(r, "rope.scaling.type"), &s);
    if (rc && rc != KVC_ENOENT) return why(r, rc, r->key, "a string");
    if (rc == 0) {
        if (kvc_gguf_str_eq(s, "linear"))
            h->rope_scaling = KVC_ROPE_SCALING_LINEAR;
        else if (kvc_gguf_str_eq(s, "yarn"))
            h->rope_scaling = KVC_ROPE_SCALING_YARN;
        else if (!kvc_gguf_str_eq(s, "none"))
            return kvc__msgf(KVC_ENOTSUP, r->msg, r->cap,
                             "%s: only none, linear and yarn are supported", r->key);
    }
    if (has_tensor(r->g, "rope_freqs.weight")) h->rope_scaling = KVC_ROPE_SCALING_LLAMA3;
    if (h->rope_scaling == KVC_ROPE_SCALING_LINEAR || h->rope_scaling == KVC_ROPE_SCALING_YARN) {
        if ((rc = real(r, akey(r, "rope.scaling.factor"), NAN, 0, 1e6, &h->rope_factor))) return rc;
        uint32_t orig = 0;
        rc = count(r, akey(r, "rope.scaling.original_context_length"), UINT32_MAX, UINT32_MAX,
                   &orig);
        if (rc) return rc;
        h->rope_orig_ctx = orig == UINT32_MAX ? 0 : orig;
    }
    return 0;
}

static int read_variant(rd_t *r, kvc_model_hparams_t *h)
{
    int rc;
    uint64_t experts;
    if (kvc_gguf_get_u64(r->g, akey(r, "expert_count"), &experts) == 0 && experts > 0)
        return kvc__msgf(KVC_ENOTSUP, r->msg, r->cap,
                         "mixture-of-experts files (%s %llu) are not supported yet", r->key,
                         (unsigned long long)experts);
    h->tied = kvc_gguf_n_tensors(r->g) > 0 && !has_tensor(r->g, "output.weight");
    h->qkv_bias = has_tensor(r->g, "blk.0.attn_q.bias");
    h->qk_norm = has_tensor(r->g, "blk.0.attn_q_norm.weight");
    h->embed_scale = 1.0;
    uint32_t window = 0;
    rc = count(r, akey(r, "attention.sliding_window"), UINT32_MAX, KVC_PLAN_MAX_WINDOW, &window);
    if (rc) return rc;
    h->sliding_window = window == UINT32_MAX ? 0 : window;
    if (h->arch == KVC_ARCH_GEMMA2) {
        if (!h->sliding_window)
            return kvc__msgf(KVC_EPARSE, r->msg, r->cap, "%s: missing (gemma2 needs it)", r->key);
        h->sliding_even_layers = true;
        h->n_sliding_layers = (h->n_layers + 1) / 2;
        if ((rc = real(r, akey(r, "attn_logit_softcapping"), 0.0, -1, 1e6, &h->attn_softcap)))
            return rc;
        if ((rc = real(r, akey(r, "final_logit_softcapping"), 0.0, -1, 1e6, &h->final_softcap)))
            return rc;
        if (h->attn_softcap < 0 || h->final_softcap < 0)
            return kvc__msgf(KVC_EPARSE, r->msg, r->cap, "gemma2: negative soft-capping");
        h->embed_scale = sqrt((double)h->dim);
    } else if (h->sliding_window) {
        h->n_sliding_layers = h->n_layers; /* Mistral: every layer */
    }
    return 0;
}

int kvc_model_hparams_from_gguf(const kvc_gguf_t *g, kvc_model_hparams_t *out, char *msg,
                                size_t cap)
{
    if (msg && cap) msg[0] = 0;
    if (!g || !out) return kvc__msgf(KVC_EINVAL, msg, cap, "invalid argument");
    rd_t r = {.g = g, .msg = msg, .cap = cap};
    kvc_model_hparams_t h = {0};
    int rc;
    if ((rc = read_arch(&r, &h)) || (rc = read_shape(&r, &h)) || (rc = read_rope(&r, &h)) ||
        (rc = read_variant(&r, &h)))
        return rc;
    kvc_gguf_str_t name;
    if (kvc_gguf_get_str(g, "general.name", &name) == 0) {
        size_t n = name.len < sizeof h.name - 1 ? (size_t)name.len : sizeof h.name - 1;
        for (size_t i = 0; i < n; i++)
            h.name[i] = (unsigned char)name.s[i] < 0x20 || name.s[i] == 0x7f ? '?' : name.s[i];
    }
    /* the planner's bounds, once more, on the whole model */
    kvc_plan_model_t pm;
    kvc_model_hparams_to_plan(&h, "model", &pm);
    char why_plan[160];
    if (kvc_plan_model_check(&pm, why_plan, sizeof why_plan))
        return kvc__msgf(KVC_EPARSE, msg, cap, "the model is out of range: %s", why_plan);
    *out = h;
    return 0;
}

void kvc_model_hparams_to_plan(const kvc_model_hparams_t *h, const char *fallback_name,
                               kvc_plan_model_t *out)
{
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s",
             h->name[0]      ? h->name
             : fallback_name ? fallback_name
                             : "");
    snprintf(out->model_type, sizeof out->model_type, "%s", kvc_arch_name(h->arch));
    out->hidden_size = h->dim;
    out->n_layers = h->n_layers;
    out->n_heads = h->n_heads;
    out->n_kv_heads = h->n_kv_heads;
    out->head_dim = h->head_dim;
    out->v_head_dim = h->v_head_dim;
    out->vocab_size = h->vocab;
    out->intermediate_size = h->ff;
    out->tie_embeddings = h->tied;
    out->qkv_bias = h->qkv_bias;
    out->sliding_window = h->sliding_window;
    out->n_sliding_layers = h->n_sliding_layers;
    out->max_position_embeddings = h->ctx;
}

int kvc_model_plan_from_gguf_file(const char *path, kvc_plan_model_t *out, char *msg, size_t cap)
{
    if (!path || !out) return kvc__msgf(KVC_EINVAL, msg, cap, "invalid argument");
    kvc_gguf_t *g;
    int rc = kvc_gguf_open(path, NULL, &g, msg, cap);
    if (rc) return rc;
    kvc_model_hparams_t h;
    rc = kvc_model_hparams_from_gguf(g, &h, msg, cap);
    if (rc == 0) {
        const char *base = strrchr(path, '/');
        kvc_model_hparams_to_plan(&h, base ? base + 1 : path, out);
    }
    kvc_gguf_close(g);
    return rc;
}
