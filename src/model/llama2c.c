/* llama2c.c - llama2.c checkpoints and tokenizers to and from GGUF (see kvcache/llama2c.h).
 *
 * Reading: the header's shape is checked, the sizes it implies are added up in 128 bits
 * and must equal the file's length exactly, the tokenizer's records are walked against its
 * length, and only then is a GGUF built in memory (the GGUF writer's memory sink, the
 * tensors copied from the checkpoint by the fill callback).  The result is handed to the
 * GGUF reader, the hyperparameter reader and the tokenizer before it is returned, so it is
 * exactly what a GGUF file with the same content would give.
 *
 * Writing: every tensor is found, its shape checked against the hyperparameters, and
 * dequantized to f32 one tensor at a time in the legacy order. */
#include "kvcache/llama2c.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvcache/model.h"
#include "kvcache/tokenizer.h"
#include "util/msg.h"

#define HEADER_BYTES 28
#define RMS_EPS      1e-5f
#define ROPE_THETA   10000.0

static const char sp_space[] = "\xe2\x96\x81"; /* U+2581, SentencePiece's space */

/* ---- reading ---------------------------------------------------------------------------- */

typedef struct {
    int32_t dim, hidden, n_layers, n_heads, n_kv_heads, vocab, seq_len;
} header_t;

/* One tensor of the GGUF: its name, shape and where its floats are in the checkpoint. */
typedef struct {
    char name[48];
    uint32_t n_dims;
    uint64_t ne[2];
    uint64_t src; /* byte offset in the checkpoint */
} tdesc_t;

typedef struct {
    const uint8_t *bin;
    tdesc_t *t;
} fill_ctx_t;

static int fill(void *ctx, uint64_t i, void *dst, uint64_t bytes)
{
    const fill_ctx_t *c = ctx;
    memcpy(dst, c->bin + c->t[i].src, (size_t)bytes);
    return 0;
}

static int32_t rd_i32(const uint8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

static void u128_str(kvc__u128 v, char *buf, size_t cap)
{
    if (v > UINT64_MAX)
        snprintf(buf, cap, "more than 2^64");
    else
        snprintf(buf, cap, "%llu", (unsigned long long)v);
}

static int check_header(const uint8_t *bin, size_t n, header_t *h, bool *shared, char *msg,
                        size_t cap)
{
    if (n < HEADER_BYTES)
        return kvc__msgf(KVC_EPARSE, msg, cap,
                         "checkpoint: truncated: the header needs 28 bytes, %zu remain", n);
    int32_t v[7];
    for (int i = 0; i < 7; i++) v[i] = rd_i32(bin + 4 * i);
    *h = (header_t){v[0], v[1], v[2], v[3], v[4], v[5], v[6]};
    static const char *const what[7] = {"dim",        "hidden_dim", "n_layers", "n_heads",
                                        "n_kv_heads", "vocab_size", "seq_len"};
    for (int i = 0; i < 7; i++)
        if (i == 5 ? (v[i] == 0 || v[i] == INT32_MIN) : v[i] <= 0)
            return kvc__msgf(KVC_EPARSE, msg, cap,
                             "checkpoint: header field %d (%s) is %d: not a llama2.c checkpoint",
                             i + 1, what[i], v[i]);
    if (h->dim % h->n_heads)
        return kvc__msgf(KVC_EPARSE, msg, cap,
                         "checkpoint: n_heads %d does not divide dim %d: not a llama2.c checkpoint",
                         h->n_heads, h->dim);
    if (h->n_heads % h->n_kv_heads)
        return kvc__msgf(KVC_EPARSE, msg, cap,
                         "checkpoint: n_kv_heads %d does not divide n_heads %d", h->n_kv_heads,
                         h->n_heads);
    const int32_t hs = h->dim / h->n_heads;
    if (hs % 2)
        return kvc__msgf(KVC_EPARSE, msg, cap, "checkpoint: head size %d is odd (RoPE needs pairs)",
                         hs);
    *shared = h->vocab > 0;
    const kvc__u128 V = (kvc__u128)(h->vocab > 0 ? h->vocab : -(int64_t)h->vocab);
    const kvc__u128 D = (kvc__u128)h->dim, H = (kvc__u128)h->hidden, L = (kvc__u128)h->n_layers;
    const kvc__u128 KV = (kvc__u128)hs * (kvc__u128)h->n_kv_heads, S = (kvc__u128)h->seq_len;
    const kvc__u128 floats = V * D + L * D + L * D * D + 2 * L * KV * D + L * D * D + L * D +
                             3 * L * H * D + D + S * (kvc__u128)hs + (*shared ? 0 : V * D);
    const kvc__u128 want = HEADER_BYTES + 4 * floats;
    if (want != (kvc__u128)n) {
        char wb[32];
        u128_str(want, wb, sizeof wb);
        return kvc__msgf(KVC_EPARSE, msg, cap,
                         "checkpoint: the header (dim %d, hidden %d, %d layers, %d heads, %d KV "
                         "heads, vocab %d, seq_len %d) needs %s bytes, the file has %zu",
                         h->dim, h->hidden, h->n_layers, h->n_heads, h->n_kv_heads, h->vocab,
                         h->seq_len, wb, n);
    }
    return 0;
}

/* The vocabulary of a tokenizer.bin, converted back to SentencePiece's text. */
typedef struct {
    kvc_gguf_str_t *tokens;
    float *scores;
    int32_t *types;
    char *text;
} vocab_t;

static bool is_byte_token(const char *s, size_t n)
{
    static const char hex[] = "0123456789ABCDEF";
    return n == 6 && !memcmp(s, "<0x", 3) && strchr(hex, s[3]) && s[3] && strchr(hex, s[4]) &&
           s[4] && s[5] == '>';
}

static int read_vocab(const uint8_t *tok, size_t n, uint32_t n_vocab, const kvc_allocator_t *a,
                      vocab_t *v, char *msg, size_t cap)
{
    if (n < 4)
        return kvc__msgf(KVC_EPARSE, msg, cap,
                         "tokenizer: truncated: max_token_length needs 4 bytes, %zu remain", n);
    uint32_t max_len;
    memcpy(&max_len, tok, 4);
    if (max_len == 0 || max_len > 65535)
        return kvc__msgf(KVC_EPARSE, msg, cap,
                         "tokenizer: max_token_length %u is out of range: 1..65535", max_len);
    /* walk the records first: the text's size, every length against the file */
    size_t pos = 4, text_bytes = 0;
    for (uint32_t i = 0; i < n_vocab; i++) {
        if (n - pos < 8)
            return kvc__msgf(KVC_EPARSE, msg, cap,
                             "tokenizer: truncated at byte %zu: token %u of %u needs 8 bytes of "
                             "score and length, %zu remain",
                             pos, i, n_vocab, n - pos);
        float score;
        memcpy(&score, tok + pos, 4);
        const int32_t len = rd_i32(tok + pos + 4);
        if (!isfinite(score))
            return kvc__msgf(KVC_EPARSE, msg, cap, "tokenizer: token %u: score is not finite", i);
        if (len < 0 || (uint32_t)len > max_len)
            return kvc__msgf(KVC_EPARSE, msg, cap,
                             "tokenizer: token %u: length %d is out of range: 0..%u (the "
                             "header's max_token_length)",
                             i, len, max_len);
        pos += 8;
        if (n - pos < (size_t)len)
            return kvc__msgf(KVC_EPARSE, msg, cap,
                             "tokenizer: truncated at byte %zu: token %u needs %d bytes, %zu "
                             "remain",
                             pos, i, len, n - pos);
        pos += (size_t)len;
        text_bytes += 3 * (size_t)len + 1;
    }
    if (pos != n)
        return kvc__msgf(KVC_EPARSE, msg, cap,
                         "tokenizer: %zu bytes after the last of the checkpoint's %u tokens: "
                         "not this model's tokenizer",
                         n - pos, n_vocab);
    v->tokens = kvc_calloc(a, n_vocab, sizeof *v->tokens, 8);
    v->scores = kvc_calloc(a, n_vocab, sizeof *v->scores, 8);
    v->types = kvc_calloc(a, n_vocab, sizeof *v->types, 8);
    v->text = kvc_alloc(a, text_bytes + 1, 1);
    if (!v->tokens || !v->scores || !v->types || !v->text)
        return kvc__msgf(KVC_ENOMEM, msg, cap, "out of memory");
    char *t = v->text;
    pos = 4;
    for (uint32_t i = 0; i < n_vocab; i++) {
        memcpy(&v->scores[i], tok + pos, 4);
        size_t len = (size_t)rd_i32(tok + pos + 4);
        const char *s = (const char *)tok + pos + 8;
        pos += 8 + len;
        /* the exporter's "\n<s>\n" and "\n</s>\n" for BOS and EOS */
        if ((i == 1 && len == 5 && !memcmp(s, "\n<s>\n", 5)) ||
            (i == 2 && len == 6 && !memcmp(s, "\n</s>\n", 6)))
            s++, len -= 2;
        v->tokens[i].s = t;
        for (size_t k = 0; k < len; k++) {
            if (s[k] == ' ') {
                memcpy(t, sp_space, 3);
                t += 3;
            } else {
                *t++ = s[k];
            }
        }
        v->tokens[i].len = (uint64_t)(t - v->tokens[i].s);
        v->types[i] = i == 0   ? KVC_TOKTYPE_UNKNOWN
                      : i <= 2 ? KVC_TOKTYPE_CONTROL
                      : is_byte_token(v->tokens[i].s, (size_t)v->tokens[i].len)
                          ? KVC_TOKTYPE_BYTE
                          : KVC_TOKTYPE_NORMAL;
    }
    return 0;
}

static void free_vocab(const kvc_allocator_t *a, vocab_t *v)
{
    kvc_free(a, v->tokens);
    kvc_free(a, v->scores);
    kvc_free(a, v->types);
    kvc_free(a, v->text);
}

static int set_meta(kvc_gguf_writer_t *w, const header_t *h, uint32_t n_vocab, const vocab_t *v)
{
    int rc = 0;
#define TRY(x)                     \
    do {                           \
        if ((rc = (x))) return rc; \
    } while (0)
    if (v) {
        TRY(kvc_gguf_writer_set_arr(w, "tokenizer.ggml.tokens", KVC_GGUF_STRING, v->tokens,
                                    n_vocab));
        TRY(kvc_gguf_writer_set_arr(w, "tokenizer.ggml.scores", KVC_GGUF_FLOAT32, v->scores,
                                    n_vocab));
        TRY(kvc_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", KVC_GGUF_INT32, v->types,
                                    n_vocab));
        TRY(kvc_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama", 5));
    }
    TRY(kvc_gguf_writer_set_str(w, "general.architecture", "llama", 5));
    TRY(kvc_gguf_writer_set_str(w, "general.name", "llama", 5)); /* as llama.cpp's converter */
    if (v) {
        /* the ids run.c fixes; -1 (stored unsigned) for none, as llama.cpp writes it */
        TRY(kvc_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0));
        TRY(kvc_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1));
        TRY(kvc_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2));
        TRY(kvc_gguf_writer_set_u32(w, "tokenizer.ggml.seperator_token_id", UINT32_MAX));
        TRY(kvc_gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", UINT32_MAX));
    } else {
        TRY(kvc_gguf_writer_set_u32(w, "llama.vocab_size", n_vocab));
    }
    TRY(kvc_gguf_writer_set_u32(w, "llama.context_length", (uint32_t)h->seq_len));
    TRY(kvc_gguf_writer_set_u32(w, "llama.embedding_length", (uint32_t)h->dim));
    TRY(kvc_gguf_writer_set_u32(w, "llama.feed_forward_length", (uint32_t)h->hidden));
    TRY(kvc_gguf_writer_set_u32(w, "llama.attention.head_count", (uint32_t)h->n_heads));
    TRY(kvc_gguf_writer_set_u32(w, "llama.attention.head_count_kv", (uint32_t)h->n_kv_heads));
    TRY(kvc_gguf_writer_set_u32(w, "llama.block_count", (uint32_t)h->n_layers));
    TRY(kvc_gguf_writer_set_u32(w, "llama.rope.dimension_count", (uint32_t)(h->dim / h->n_heads)));
    TRY(kvc_gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", RMS_EPS));
#undef TRY
    return rc;
}

/* The tensors in llama.cpp's converter's order, each pointing into the checkpoint. */
static uint64_t describe(const header_t *h, bool shared, tdesc_t *t)
{
    const uint64_t V = (uint64_t)(h->vocab > 0 ? h->vocab : -(int64_t)h->vocab);
    const uint64_t D = (uint64_t)h->dim, H = (uint64_t)h->hidden, L = (uint64_t)h->n_layers;
    const uint64_t KV = (uint64_t)(h->dim / h->n_heads) * (uint64_t)h->n_kv_heads;
    const uint64_t S = (uint64_t)h->seq_len, hs = (uint64_t)(h->dim / h->n_heads);
    /* where each array starts (bytes) */
    uint64_t at = HEADER_BYTES;
    const uint64_t emb = at;
    at += 4 * V * D;
    const uint64_t rms_att = at;
    at += 4 * L * D;
    const uint64_t wq = at;
    at += 4 * L * D * D;
    const uint64_t wk = at;
    at += 4 * L * KV * D;
    const uint64_t wv = at;
    at += 4 * L * KV * D;
    const uint64_t wo = at;
    at += 4 * L * D * D;
    const uint64_t rms_ffn = at;
    at += 4 * L * D;
    const uint64_t w1 = at;
    at += 4 * L * H * D;
    const uint64_t w2 = at;
    at += 4 * L * D * H;
    const uint64_t w3 = at;
    at += 4 * L * H * D;
    const uint64_t rms_final = at;
    at += 4 * D;
    at += 4 * S * hs; /* freq_cis_real, freq_cis_imag */
    const uint64_t wcls = at;
    uint64_t n = 0;
#define T(nm, nd, a0, a1, off)                                           \
    (t[n] = (tdesc_t){.n_dims = (nd), .ne = {(a0), (a1)}, .src = (off)}, \
     snprintf(t[n].name, sizeof t[n].name, "%s", (nm)), n++)
    T("token_embd.weight", 2, D, V, emb);
    T("output_norm.weight", 1, D, 1, rms_final);
    T("output.weight", 2, D, V, shared ? emb : wcls); /* a shared one copied, as llama.cpp does */
    for (uint64_t l = 0; l < L; l++) {
        char b[48];
#define TL(suffix, nd, a0, a1, off)                                                   \
    do {                                                                              \
        snprintf(b, sizeof b, "blk.%llu.%s.weight", (unsigned long long)l, (suffix)); \
        T(b, (nd), (a0), (a1), (off));                                                \
    } while (0)
        TL("attn_q", 2, D, D, wq + 4 * l * D * D);
        TL("attn_k", 2, D, KV, wk + 4 * l * KV * D);
        TL("attn_v", 2, D, KV, wv + 4 * l * KV * D);
        TL("attn_output", 2, D, D, wo + 4 * l * D * D);
        TL("attn_norm", 1, D, 1, rms_att + 4 * l * D);
        TL("ffn_gate", 2, D, H, w1 + 4 * l * H * D);
        TL("ffn_down", 2, H, D, w2 + 4 * l * D * H);
        TL("ffn_up", 2, D, H, w3 + 4 * l * H * D);
        TL("ffn_norm", 1, D, 1, rms_ffn + 4 * l * D);
#undef TL
    }
#undef T
    return n;
}

int kvc_llama2c_open_memory(const void *bin, size_t bin_bytes, const void *tok, size_t tok_bytes,
                            const kvc_allocator_t *a, kvc_gguf_t **out, char *msg, size_t cap)
{
    if (msg && cap) msg[0] = 0;
    if (!out || (!bin && bin_bytes) || (!tok && tok_bytes))
        return kvc__msgf(KVC_EINVAL, msg, cap, "invalid argument");
    header_t h = {0};
    bool shared = true;
    int rc = check_header(bin, bin_bytes, &h, &shared, msg, cap);
    if (rc) return rc;
    const uint32_t n_vocab = (uint32_t)(h.vocab > 0 ? h.vocab : -(int64_t)h.vocab);
    vocab_t v = {0};
    if (tok && (rc = read_vocab(tok, tok_bytes, n_vocab, a, &v, msg, cap))) {
        free_vocab(a, &v);
        return rc;
    }
    /* n_layers is bounded by the file's length (each layer holds at least 4 * dim floats) */
    const uint64_t n_tensors = 3 + 9 * (uint64_t)h.n_layers;
    tdesc_t *t = kvc_calloc(a, (size_t)n_tensors, sizeof *t, 8);
    kvc_gguf_writer_t *w = NULL;
    void *buf = NULL;
    size_t bytes = 0;
    if (!t || kvc_gguf_writer_create(a, &w)) {
        rc = kvc__msgf(KVC_ENOMEM, msg, cap, "out of memory");
        goto done;
    }
    const uint64_t n = describe(&h, shared, t);
    if ((rc = set_meta(w, &h, n_vocab, tok ? &v : NULL))) {
        kvc__msgf(rc, msg, cap, "%s", rc == KVC_ENOMEM ? "out of memory" : "cannot build the GGUF");
        goto done;
    }
    for (uint64_t i = 0; i < n && !rc; i++)
        rc = kvc_gguf_writer_add_tensor(w, t[i].name, KVC_GGML_F32, t[i].n_dims, t[i].ne);
    if (rc) {
        kvc__msgf(rc, msg, cap, "%s", rc == KVC_ENOMEM ? "out of memory" : "cannot build the GGUF");
        goto done;
    }
    fill_ctx_t fc = {bin, t};
    if ((rc = kvc_gguf_writer_write_memory(w, fill, &fc, &buf, &bytes, msg, cap))) goto done;
    kvc_gguf_t *g;
    char why[256];
    if ((rc = kvc_gguf_open_memory_owned(buf, bytes, a, &g, why, sizeof why))) {
        kvc_free(a, buf);
        rc = kvc__msgf(rc, msg, cap, "the converted GGUF: %s", why);
        goto done;
    }
    /* what the engine will ask of it, asked now: a checkpoint whose shape the model layer
     * refuses is refused here, with the reason */
    kvc_model_hparams_t hp;
    if ((rc = kvc_model_hparams_from_gguf(g, &hp, why, sizeof why))) {
        kvc_gguf_close(g);
        rc = kvc__msgf(rc == KVC_ENOMEM ? rc : KVC_EPARSE, msg, cap, "checkpoint: %s", why);
        goto done;
    }
    if (tok) {
        kvc_tokenizer_params_t tp = kvc_tokenizer_params_default();
        if (a) tp.allocator = *a;
        kvc_tokenizer_t *tk;
        if ((rc = kvc_tokenizer_create_gguf(g, &tp, &tk, why, sizeof why))) {
            kvc_gguf_close(g);
            rc = kvc__msgf(rc == KVC_ENOMEM ? rc : KVC_EPARSE, msg, cap, "tokenizer: %s", why);
            goto done;
        }
        kvc_tokenizer_destroy(tk);
    }
    *out = g;
done:
    kvc_gguf_writer_destroy(w);
    kvc_free(a, t);
    free_vocab(a, &v);
    return rc;
}

/* Map a whole file read-only (an empty file: NULL, 0). */
static int map_file(const char *path, const char *what, void **p, size_t *n, char *msg, size_t cap)
{
    *p = NULL;
    *n = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return kvc__msgf(KVC_EIO, msg, cap, "%s %s: cannot open: %s", what, path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        int e = errno;
        close(fd);
        return kvc__msgf(KVC_EIO, msg, cap, "%s %s: %s", what, path,
                         S_ISREG(st.st_mode) ? strerror(e) : "not a regular file");
    }
    if (st.st_size > 0) {
        void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        int e = errno;
        close(fd);
        if (m == MAP_FAILED)
            return kvc__msgf(KVC_EIO, msg, cap, "%s %s: cannot map: %s", what, path, strerror(e));
        *p = m;
        *n = (size_t)st.st_size;
    } else {
        close(fd);
    }
    return 0;
}

int kvc_llama2c_open(const char *bin_path, const char *tokenizer_path, const kvc_allocator_t *a,
                     kvc_gguf_t **out, char *msg, size_t cap)
{
    if (msg && cap) msg[0] = 0;
    if (!bin_path || !out) return kvc__msgf(KVC_EINVAL, msg, cap, "invalid argument");
    void *bin, *tok = NULL;
    size_t nb, nt = 0;
    int rc = map_file(bin_path, "checkpoint", &bin, &nb, msg, cap);
    if (rc) return rc;
    if (tokenizer_path && (rc = map_file(tokenizer_path, "tokenizer", &tok, &nt, msg, cap))) {
        if (bin) munmap(bin, nb);
        return rc;
    }
    static const uint8_t none; /* an empty tokenizer file is still a tokenizer, truncated */
    rc = kvc_llama2c_open_memory(bin, nb, tokenizer_path ? (tok ? tok : &none) : NULL, nt, a, out,
                                 msg, cap);
    if (bin) munmap(bin, nb);
    if (tok) munmap(tok, nt);
    return rc;
}

/* ---- writing ---------------------------------------------------------------------------- */

typedef struct {
    FILE *f;
    float *buf; /* one tensor's floats */
    const kvc_gguf_t *g;
    char *msg;
    size_t cap;
} wr_t;

/* Tensor `name` of shape (ne0, ne1) as f32 to the file. */
static int put_tensor(wr_t *w, const char *name, uint64_t ne0, uint64_t ne1)
{
    const kvc_gguf_tensor_t *t = kvc_gguf_find_tensor(w->g, name);
    if (!t) return kvc__msgf(KVC_EPARSE, w->msg, w->cap, "tensor %s: missing", name);
    const bool ok = ne1 == 1 ? (t->n_dims == 1 && t->ne[0] == ne0)
                             : (t->n_dims == 2 && t->ne[0] == ne0 && t->ne[1] == ne1);
    if (!ok)
        return kvc__msgf(KVC_EPARSE, w->msg, w->cap,
                         "tensor %s: shape [%llu, %llu], the hyperparameters say [%llu, %llu]",
                         name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                         (unsigned long long)ne0, (unsigned long long)ne1);
    if (!kvc_ggml_codec_supported(t->type))
        return kvc__msgf(KVC_ENOTSUP, w->msg, w->cap, "tensor %s: type %s cannot be dequantized",
                         name, kvc_ggml_type_name(t->type) ? kvc_ggml_type_name(t->type) : "?");
    int rc = kvc_ggml_dequantize_row(t->type, t->data, w->buf, t->n_elems);
    if (rc) return kvc__msgf(rc, w->msg, w->cap, "tensor %s: cannot dequantize", name);
    if (fwrite(w->buf, 4, (size_t)t->n_elems, w->f) != t->n_elems)
        return kvc__msgf(KVC_EIO, w->msg, w->cap, "%s", strerror(errno));
    return 0;
}

static int put_layers(wr_t *w, uint32_t n_layers, const char *suffix, uint64_t ne0, uint64_t ne1)
{
    for (uint32_t l = 0; l < n_layers; l++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%u.%s.weight", l, suffix);
        int rc = put_tensor(w, name, ne0, ne1);
        if (rc) return rc;
    }
    return 0;
}

static int check_writable(const kvc_model_hparams_t *h, char *msg, size_t cap)
{
    const char *why = NULL;
    if (h->arch != KVC_ARCH_LLAMA)
        why = "only the llama architecture";
    else if ((uint64_t)h->head_dim * h->n_heads != h->dim || h->v_head_dim != h->head_dim)
        why = "only head_dim x heads = dim";
    else if (h->rope_dim != h->head_dim)
        why = "only RoPE over the whole head";
    else if (h->rope_scaling != KVC_ROPE_SCALING_NONE)
        why = "no RoPE scaling";
    else if (h->rope_theta != ROPE_THETA)
        why = "only RoPE theta 10000 (run.c fixes it)";
    else if ((float)h->rms_eps != RMS_EPS)
        why = "only RMSNorm eps 1e-5 (run.c fixes it)";
    else if (h->qkv_bias || h->qk_norm)
        why = "no QKV bias or Q/K norms";
    else if (h->sliding_window || h->attn_softcap > 0 || h->final_softcap > 0 ||
             h->embed_scale != 1.0)
        why = "no sliding window, soft-capping or embedding scale";
    else if (h->dim > INT32_MAX || h->ff > INT32_MAX || h->vocab > INT32_MAX ||
             h->ctx > INT32_MAX || h->n_layers > INT32_MAX)
        why = "dimensions up to 2^31 - 1";
    if (why) return kvc__msgf(KVC_ENOTSUP, msg, cap, "a llama2.c checkpoint holds %s", why);
    return 0;
}

/* Whether the classifier is the embedding: no output.weight, or one whose floats are the
 * embedding's bit for bit (llama.cpp's converter copies a shared one there). */
static int is_shared(const kvc_gguf_t *g, bool *shared, char *msg, size_t cap)
{
    const kvc_gguf_tensor_t *e = kvc_gguf_find_tensor(g, "token_embd.weight");
    const kvc_gguf_tensor_t *o = kvc_gguf_find_tensor(g, "output.weight");
    *shared = o == NULL;
    if (!o || !e || e->n_elems != o->n_elems || !kvc_ggml_codec_supported(e->type) ||
        !kvc_ggml_codec_supported(o->type))
        return 0; /* the shapes and types are checked, with a message, as they are written */
    float *x = e->n_elems <= SIZE_MAX / 8 ? kvc_alloc(NULL, (size_t)e->n_elems * 4, 64) : NULL;
    float *y = x ? kvc_alloc(NULL, (size_t)e->n_elems * 4, 64) : NULL;
    int rc = y ? 0 : kvc__msgf(KVC_ENOMEM, msg, cap, "out of memory");
    if (!rc && !kvc_ggml_dequantize_row(e->type, e->data, x, e->n_elems) &&
        !kvc_ggml_dequantize_row(o->type, o->data, y, o->n_elems))
        *shared = !memcmp(x, y, (size_t)e->n_elems * 4);
    kvc_free(NULL, x);
    kvc_free(NULL, y);
    return rc;
}

static int write_bin(const kvc_gguf_t *g, const kvc_model_hparams_t *h, const char *path, char *msg,
                     size_t cap)
{
    bool shared;
    int rc = is_shared(g, &shared, msg, cap);
    if (rc) return rc;
    const uint64_t D = h->dim, H = h->ff, V = h->vocab, KV = (uint64_t)h->head_dim * h->n_kv_heads;
    uint64_t biggest =
        KVC_MAX(V * D, KVC_MAX(D * D, KVC_MAX(H * D, (uint64_t)h->ctx * h->head_dim / 2)));
    FILE *f = fopen(path, "wb");
    if (!f) return kvc__msgf(KVC_EIO, msg, cap, "%s: cannot create: %s", path, strerror(errno));
    wr_t w = {f, biggest <= SIZE_MAX / 4 ? kvc_alloc(NULL, (size_t)biggest * 4, 64) : NULL, g, msg,
              cap};
    rc = w.buf ? 0 : kvc__msgf(KVC_ENOMEM, msg, cap, "out of memory");
    const int32_t head[7] = {(int32_t)h->dim,        (int32_t)h->ff,
                             (int32_t)h->n_layers,   (int32_t)h->n_heads,
                             (int32_t)h->n_kv_heads, shared ? (int32_t)V : -(int32_t)V,
                             (int32_t)h->ctx};
    if (!rc && fwrite(head, 4, 7, f) != 7) rc = kvc__msgf(KVC_EIO, msg, cap, "%s", strerror(errno));
    if (!rc) rc = put_tensor(&w, "token_embd.weight", D, V);
    if (!rc) rc = put_layers(&w, h->n_layers, "attn_norm", D, 1);
    if (!rc) rc = put_layers(&w, h->n_layers, "attn_q", D, D);
    if (!rc) rc = put_layers(&w, h->n_layers, "attn_k", D, KV);
    if (!rc) rc = put_layers(&w, h->n_layers, "attn_v", D, KV);
    if (!rc) rc = put_layers(&w, h->n_layers, "attn_output", D, D);
    if (!rc) rc = put_layers(&w, h->n_layers, "ffn_norm", D, 1);
    if (!rc) rc = put_layers(&w, h->n_layers, "ffn_gate", D, H);
    if (!rc) rc = put_layers(&w, h->n_layers, "ffn_down", H, D);
    if (!rc) rc = put_layers(&w, h->n_layers, "ffn_up", D, H);
    if (!rc) rc = put_tensor(&w, "output_norm.weight", D, 1);
    /* freq_cis_real and _imag as export.py wrote them (cos and sin of pos / 10000^(2i/hs));
     * run.c skips them */
    const uint64_t half = h->head_dim / 2;
    for (int part = 0; part < 2 && !rc; part++) {
        for (uint64_t p = 0; p < h->ctx; p++)
            for (uint64_t i = 0; i < half; i++) {
                const double fr = 1.0 / pow(ROPE_THETA, (double)(2 * i) / h->head_dim);
                w.buf[p * half + i] = (float)(part ? sin((double)p * fr) : cos((double)p * fr));
            }
        if (fwrite(w.buf, 4, (size_t)(h->ctx * half), f) != h->ctx * half)
            rc = kvc__msgf(KVC_EIO, msg, cap, "%s", strerror(errno));
    }
    if (!rc && !shared) rc = put_tensor(&w, "output.weight", D, V);
    kvc_free(NULL, w.buf);
    if (fclose(f) != 0 && !rc) rc = kvc__msgf(KVC_EIO, msg, cap, "%s", strerror(errno));
    if (rc) unlink(path);
    return rc;
}

static int write_tokenizer(const kvc_gguf_t *g, uint32_t n_vocab, const char *path, char *msg,
                           size_t cap)
{
    kvc_gguf_str_t model;
    if (kvc_gguf_get_str(g, "tokenizer.ggml.model", &model) || !kvc_gguf_str_eq(model, "llama"))
        return kvc__msgf(KVC_ENOTSUP, msg, cap,
                         "tokenizer.bin holds SentencePiece vocabularies (tokenizer.ggml.model "
                         "llama) only");
    kvc_gguf_arr_t toks, scores;
    const bool has_scores = kvc_gguf_get_arr(g, "tokenizer.ggml.scores", &scores) == 0;
    if (kvc_gguf_get_arr(g, "tokenizer.ggml.tokens", &toks) || toks.type != KVC_GGUF_STRING ||
        toks.n != n_vocab || (has_scores && scores.n != n_vocab))
        return kvc__msgf(KVC_EPARSE, msg, cap,
                         "tokenizer.ggml.tokens / scores: not %u entries (the embedding's rows)",
                         n_vocab);
    uint64_t bos = 1, eos = 2;
    if (kvc_gguf_find(g, "tokenizer.ggml.bos_token_id") >= 0 &&
        kvc_gguf_get_u64(g, "tokenizer.ggml.bos_token_id", &bos))
        bos = UINT64_MAX;
    if (kvc_gguf_find(g, "tokenizer.ggml.eos_token_id") >= 0 &&
        kvc_gguf_get_u64(g, "tokenizer.ggml.eos_token_id", &eos))
        eos = UINT64_MAX;
    kvc_gguf_str_t s1 = {0}, s2 = {0};
    if (bos != 1 || eos != 2 || n_vocab < 3 || kvc_gguf_arr_str(g, &toks, 1, &s1) ||
        kvc_gguf_arr_str(g, &toks, 2, &s2) || !kvc_gguf_str_eq(s1, "<s>") ||
        !kvc_gguf_str_eq(s2, "</s>"))
        return kvc__msgf(KVC_ENOTSUP, msg, cap,
                         "tokenizer.bin needs BOS <s> = 1 and EOS </s> = 2 (run.c fixes them)");
    /* max_token_length first: one pass over the texts as they will be written */
    uint32_t max_len = 0;
    for (uint64_t i = 0; i < n_vocab; i++) {
        kvc_gguf_str_t s;
        if (kvc_gguf_arr_str(g, &toks, i, &s))
            return kvc__msgf(KVC_EPARSE, msg, cap, "token %llu: not a string",
                             (unsigned long long)i);
        uint64_t len = i == 1 ? 5 : i == 2 ? 6 : 0;
        for (uint64_t k = 0; !len && k < s.len;) {
            if (s.s[k] == ' ')
                return kvc__msgf(KVC_ENOTSUP, msg, cap,
                                 "token %llu holds a space, which tokenizer.bin cannot tell from "
                                 "U+2581",
                                 (unsigned long long)i);
            k += (s.len - k >= 3 && !memcmp(s.s + k, sp_space, 3)) ? 3 : 1;
        }
        if (!len) {
            for (uint64_t k = 0; k < s.len; len++)
                k += (s.len - k >= 3 && !memcmp(s.s + k, sp_space, 3)) ? 3 : 1;
        }
        if (len > 65535)
            return kvc__msgf(KVC_ENOTSUP, msg, cap, "token %llu is longer than 65535 bytes",
                             (unsigned long long)i);
        if (len > max_len) max_len = (uint32_t)len;
    }
    FILE *f = fopen(path, "wb");
    if (!f) return kvc__msgf(KVC_EIO, msg, cap, "%s: cannot create: %s", path, strerror(errno));
    int rc = fwrite(&max_len, 4, 1, f) == 1 ? 0 : KVC_EIO;
    char *t = kvc_alloc(NULL, (size_t)max_len + 1, 1);
    if (!t) rc = KVC_ENOMEM;
    for (uint64_t i = 0; i < n_vocab && !rc; i++) {
        kvc_gguf_str_t s;
        double score = 0;
        rc = kvc_gguf_arr_str(g, &toks, i, &s);
        if (!rc && has_scores && kvc_gguf_arr_f64(&scores, i, &score)) rc = KVC_EPARSE;
        if (rc) break;
        int32_t len = 0;
        if (i == 1 || i == 2) {
            const char *special = i == 1 ? "\n<s>\n" : "\n</s>\n";
            len = (int32_t)strlen(special);
            memcpy(t, special, (size_t)len);
        } else {
            for (uint64_t k = 0; k < s.len;) {
                if (s.len - k >= 3 && !memcmp(s.s + k, sp_space, 3)) {
                    t[len++] = ' ';
                    k += 3;
                } else {
                    t[len++] = s.s[k++];
                }
            }
        }
        const float sc = (float)score;
        if (fwrite(&sc, 4, 1, f) != 1 || fwrite(&len, 4, 1, f) != 1 ||
            fwrite(t, 1, (size_t)len, f) != (size_t)len)
            rc = KVC_EIO;
    }
    kvc_free(NULL, t);
    if (fclose(f) != 0 && !rc) rc = KVC_EIO;
    if (rc) {
        unlink(path);
        return kvc__msgf(rc, msg, cap, "%s: %s", path,
                         rc == KVC_EIO ? strerror(errno) : kvc_strerror(rc));
    }
    return 0;
}

int kvc_llama2c_write(const kvc_gguf_t *g, const char *bin_path, const char *tokenizer_path,
                      char *msg, size_t cap)
{
    if (msg && cap) msg[0] = 0;
    if (!g || !bin_path) return kvc__msgf(KVC_EINVAL, msg, cap, "invalid argument");
    kvc_model_hparams_t h;
    int rc = kvc_model_hparams_from_gguf(g, &h, msg, cap);
    if (rc) return rc;
    if ((rc = check_writable(&h, msg, cap))) return rc;
    if ((rc = write_bin(g, &h, bin_path, msg, cap))) return rc;
    if (tokenizer_path && (rc = write_tokenizer(g, h.vocab, tokenizer_path, msg, cap))) {
        unlink(bin_path);
        return rc;
    }
    return 0;
}
