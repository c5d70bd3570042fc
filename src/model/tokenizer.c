/* model/tokenizer.c - the SentencePiece-style tokenizer (tokenizer.ggml.model
 * "llama") over a GGUF's vocabulary: special-token partition, the
 * score-ordered bigram merge with byte fallback, detokenization and a
 * streaming decoder that only ever hands out valid UTF-8.
 *
 * The behaviour is llama.cpp's llm_tokenizer_spm and its detokenizer (see
 * tokenizer.h), reimplemented over flat arrays: the vocabulary's texts live in
 * one blob, a hash table maps text to id, and encode works in one per-call
 * workspace sized by the text (symbols, a binary heap of candidate merges,
 * the fragment list), so the merge loop never allocates.
 */
#include "kvcache/tokenizer.h"

#include <math.h>
#include <stdalign.h>
#include <stdlib.h>
#include <string.h>

#include "model/tokenizer_int.h"
#include "util/msg.h"

#define MAX_TOKEN_BYTES  65535u
#define MAX_VOCAB        (UINT32_C(1) << 24) /* real vocabularies stop near 2^18 */
#define MAX_ENCODE_BYTES (UINT32_C(1) << 26) /* keeps every workspace index in int32 */

#define STRIP_LEFT  1u /* whitespace before the token */
#define STRIP_RIGHT 2u /* whitespace after it */

/* U+2581 LOWER ONE EIGHTH BLOCK, SentencePiece's visible space. */
static const char SPM_SPACE[3] = {'\xE2', '\x96', '\x81'};

/* ---- small helpers -------------------------------------------------------------------- */

static uint64_t hash_text(const char *s, size_t n)
{
    return kvc_hash128(s, n, 0).lo;
}

static const char *text_of(const kvc_tokenizer_t *t, uint32_t id)
{
    return t->blob + t->text_off[id];
}

kvc_token_t kvc_tokenizer_find(const kvc_tokenizer_t *t, const char *s, size_t len)
{
    if (!t || (!s && len)) return KVC_TOKEN_NONE;
    uint32_t i = (uint32_t)hash_text(s, len) & t->table_mask;
    for (;;) {
        uint32_t v = t->table[i];
        if (!v) return KVC_TOKEN_NONE;
        uint32_t id = v - 1;
        if (t->text_len[id] == len && memcmp(text_of(t, id), s, len) == 0) return (kvc_token_t)id;
        i = (i + 1) & t->table_mask;
    }
}

/* Insert id under its text; a text already present is re-pointed at the later id. */
static void table_insert(kvc_tokenizer_t *t, uint32_t id)
{
    const char *s = text_of(t, id);
    uint32_t len = t->text_len[id];
    uint32_t i = (uint32_t)hash_text(s, len) & t->table_mask;
    for (;;) {
        uint32_t v = t->table[i];
        if (!v || (t->text_len[v - 1] == len && memcmp(text_of(t, v - 1), s, len) == 0)) {
            t->table[i] = id + 1;
            return;
        }
        i = (i + 1) & t->table_mask;
    }
}

/* Bytes in the UTF-8 sequence that byte b starts (1 for a stray continuation byte). */
static size_t utf8_len(unsigned char b)
{
    static const uint8_t lens[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lens[b >> 4];
}

/* Is s[0..n) well-formed UTF-8 (no overlongs, surrogates or values past U+10FFFF)? */
static bool utf8_valid(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned char b = s[i];
        size_t need;
        unsigned char lo = 0x80, hi = 0xBF;
        if (b < 0x80) {
            i++;
            continue;
        } else if (b >= 0xC2 && b <= 0xDF) {
            need = 1;
        } else if (b >= 0xE0 && b <= 0xEF) {
            need = 2;
            if (b == 0xE0) lo = 0xA0;
            if (b == 0xED) hi = 0x9F;
        } else if (b >= 0xF0 && b <= 0xF4) {
            need = 3;
            if (b == 0xF0) lo = 0x90;
            if (b == 0xF4) hi = 0x8F;
        } else {
            return false;
        }
        if (n - i - 1 < need) return false;
        for (size_t k = 1; k <= need; k++) {
            unsigned char c = s[i + k];
            if (c < lo || c > hi) return false;
            lo = 0x80;
            hi = 0xBF;
        }
        i += need + 1;
    }
    return true;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* The byte a `<0xXX>` text names, or -1. */
static int byte_token_value(const char *s, size_t n)
{
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int h = hexval(s[3]), l = hexval(s[4]);
    return h < 0 || l < 0 ? -1 : h * 16 + l;
}

/* ---- creation ------------------------------------------------------------------------- */

kvc_tokenizer_params_t kvc_tokenizer_params_default(void)
{
    kvc_tokenizer_params_t p;
    memset(&p, 0, sizeof p);
    return p;
}

void kvc_tokenizer_destroy(kvc_tokenizer_t *t)
{
    if (!t) return;
    kvc_allocator_t a = t->alloc;
    kvc_free(&a, t->blob);
    kvc_free(&a, t->text_off);
    kvc_free(&a, t->text_len);
    kvc_free(&a, t->scores);
    kvc_free(&a, t->types);
    kvc_free(&a, t->strip);
    kvc_free(&a, t->table);
    kvc_free(&a, t->special);
    kvc__bpe_destroy(t, t->bpe);
    kvc_free(&a, t);
}

/* A special-token id from the metadata: absent gives the default (none when the default is
 * not a valid id), a negative value or -1 stored unsigned (0xFFFFFFFF, UINT64_MAX) none,
 * anything else must be a valid id. */
static int read_special(const kvc_gguf_t *g, const char *key, int64_t def, uint32_t n_vocab,
                        kvc_token_t *out, char *err, size_t cap)
{
    int64_t v;
    int rc = kvc_gguf_get_i64(g, key, &v);
    if (rc == KVC_ENOENT) {
        *out = def >= 0 && def < (int64_t)n_vocab ? (kvc_token_t)def : KVC_TOKEN_NONE;
        return 0;
    }
    uint64_t u;
    if (rc == KVC_ERANGE && kvc_gguf_get_u64(g, key, &u) == 0 && u == UINT64_MAX)
        v = -1;
    else if (rc == KVC_ERANGE)
        return kvc__msgf(KVC_EPARSE, err, cap, "%s is out of range", key);
    else if (rc)
        return kvc__msgf(KVC_EPARSE, err, cap, "%s is not an integer", key);
    /* -1 stored unsigned means none too (llama.cpp's own stories260K has a uint32 0xFFFFFFFF
     * padding id) */
    if (v == UINT32_MAX) v = -1;
    if (v < 0) {
        *out = KVC_TOKEN_NONE;
        return 0;
    }
    if (v >= (int64_t)n_vocab)
        return kvc__msgf(KVC_EPARSE, err, cap, "%s = %lld is out of range (%u tokens)", key,
                         (long long)v, n_vocab);
    *out = (kvc_token_t)v;
    return 0;
}

static int read_flag(const kvc_gguf_t *g, const char *key, bool def, bool *out, char *err,
                     size_t cap)
{
    int rc = kvc_gguf_get_bool(g, key, out);
    if (rc == KVC_ENOENT) {
        *out = def;
        return 0;
    }
    if (rc) return kvc__msgf(KVC_EPARSE, err, cap, "%s is not a bool", key);
    return 0;
}

static int cmp_special(const void *pa, const void *pb, void *ctx)
{
    const kvc_tokenizer_t *t = ctx;
    uint32_t a = *(const uint32_t *)pa, b = *(const uint32_t *)pb;
    if (t->text_len[a] != t->text_len[b]) return t->text_len[a] > t->text_len[b] ? -1 : 1;
    return a < b ? -1 : a > b;
}

static void set_strip(kvc_tokenizer_t *t, const char *text, uint8_t bits)
{
    kvc_token_t id = kvc_tokenizer_find(t, text, strlen(text));
    if (id != KVC_TOKEN_NONE) t->strip[id] = bits;
}

/* Phi-3's added tokens swallow the whitespace after them (Hugging Face's rstrip).  The GGUF does
 * not say so: llama.cpp keys it on general.name containing "phi-3" or "phi3" (any case), and
 * so must we to give the same ids. */
static int phi3_rstrip(kvc_tokenizer_t *t, const kvc_gguf_t *g, char *err, size_t cap)
{
    kvc_gguf_str_t name;
    int rc = kvc_gguf_get_str(g, "general.name", &name);
    if (rc == KVC_ENOENT) return 0;
    if (rc) return kvc__msgf(KVC_EPARSE, err, cap, "general.name is not a string");
    bool phi3 = false;
    for (uint64_t i = 0; i < name.len && !phi3; i++) {
        static const char *const pats[] = {"phi-3", "phi3"};
        for (size_t k = 0; k < 2 && !phi3; k++) {
            size_t m = strlen(pats[k]), j = 0;
            while (j < m && i + j < name.len &&
                   (name.s[i + j] | (name.s[i + j] >= 'A' && name.s[i + j] <= 'Z' ? 0x20 : 0)) ==
                       pats[k][j])
                j++;
            phi3 = j == m;
        }
    }
    if (!phi3) return 0;
    for (uint32_t k = 0; k < t->n_special; k++) t->strip[t->special[k]] = STRIP_RIGHT;
    set_strip(t, "</s>", STRIP_RIGHT);
    set_strip(t, "<unk>", 0);
    set_strip(t, "<s>", 0);
    set_strip(t, "<|endoftext|>", 0);
    return 0;
}

static bool is_space(char c)
{
    return c == ' ' || (c >= '\t' && c <= '\r'); /* C locale isspace */
}

static int load(kvc_tokenizer_t *t, const kvc_gguf_t *g, char *err, size_t cap)
{
    kvc_gguf_str_t model;
    int rc = kvc_gguf_get_str(g, "tokenizer.ggml.model", &model);
    if (rc == KVC_ENOENT)
        return kvc__msgf(KVC_ENOENT, err, cap, "no tokenizer: tokenizer.ggml.model is missing");
    if (rc) return kvc__msgf(KVC_EPARSE, err, cap, "tokenizer.ggml.model is not a string");
    bool bpe = kvc_gguf_str_eq(model, "gpt2");
    if (!bpe && !kvc_gguf_str_eq(model, "llama")) {
        char name[65]; /* printable, so the message stays one line */
        size_t n = KVC_MIN(model.len, sizeof name - 1);
        for (size_t i = 0; i < n; i++) {
            unsigned char c = (unsigned char)model.s[i];
            name[i] = c < 0x20 || c == 0x7F ? '?' : (char)c;
        }
        name[n] = '\0';
        return kvc__msgf(KVC_ENOTSUP, err, cap,
                         "tokenizer.ggml.model '%s' is not supported (only 'llama', "
                         "SentencePiece-style, and 'gpt2', byte-level BPE)",
                         name);
    }

    kvc_gguf_arr_t toks;
    rc = kvc_gguf_get_arr(g, "tokenizer.ggml.tokens", &toks);
    if (rc == KVC_ENOENT)
        return kvc__msgf(KVC_EPARSE, err, cap, "tokenizer.ggml.tokens is missing");
    if (rc || toks.type != KVC_GGUF_STRING)
        return kvc__msgf(KVC_EPARSE, err, cap, "tokenizer.ggml.tokens is not an array of strings");
    if (toks.n == 0) return kvc__msgf(KVC_EPARSE, err, cap, "tokenizer.ggml.tokens is empty");
    if (toks.n > MAX_VOCAB)
        return kvc__msgf(KVC_EPARSE, err, cap, "tokenizer.ggml.tokens has %llu tokens (at most %u)",
                         (unsigned long long)toks.n, MAX_VOCAB);
    uint32_t n = (uint32_t)toks.n;
    t->n_vocab = n;

    kvc_gguf_arr_t scores, types;
    bool has_scores = false, has_types = false;
    rc = kvc_gguf_get_arr(g, "tokenizer.ggml.scores", &scores);
    if (rc == 0) {
        if (scores.type != KVC_GGUF_FLOAT32 && scores.type != KVC_GGUF_FLOAT64)
            return kvc__msgf(KVC_EPARSE, err, cap,
                             "tokenizer.ggml.scores is an array of %s, not float32",
                             kvc_gguf_type_name(scores.type));
        if (scores.n != toks.n)
            return kvc__msgf(KVC_EPARSE, err, cap,
                             "tokenizer.ggml.scores has %llu entries for %u tokens",
                             (unsigned long long)scores.n, n);
        has_scores = true;
    } else if (rc != KVC_ENOENT) {
        return kvc__msgf(KVC_EPARSE, err, cap, "tokenizer.ggml.scores is not an array");
    }
    rc = kvc_gguf_get_arr(g, "tokenizer.ggml.token_type", &types);
    if (rc == 0) {
        if (types.type == KVC_GGUF_STRING || types.type == KVC_GGUF_FLOAT32 ||
            types.type == KVC_GGUF_FLOAT64 || types.type == KVC_GGUF_BOOL)
            return kvc__msgf(KVC_EPARSE, err, cap,
                             "tokenizer.ggml.token_type is an array of %s, not int32",
                             kvc_gguf_type_name(types.type));
        if (types.n != toks.n)
            return kvc__msgf(KVC_EPARSE, err, cap,
                             "tokenizer.ggml.token_type has %llu entries for %u tokens",
                             (unsigned long long)types.n, n);
        has_types = true;
    } else if (rc != KVC_ENOENT) {
        return kvc__msgf(KVC_EPARSE, err, cap, "tokenizer.ggml.token_type is not an array");
    }

    /* texts: measure, then copy into one blob */
    uint64_t blob_bytes = 0;
    for (uint32_t i = 0; i < n; i++) {
        kvc_gguf_str_t s;
        if (kvc_gguf_arr_str(g, &toks, i, &s))
            return kvc__msgf(KVC_EPARSE, err, cap, "tokenizer.ggml.tokens[%u] is unreadable", i);
        if (s.len > MAX_TOKEN_BYTES)
            return kvc__msgf(KVC_EPARSE, err, cap,
                             "tokenizer.ggml.tokens[%u] is %llu bytes long (at most %u)", i,
                             (unsigned long long)s.len, MAX_TOKEN_BYTES);
        if (memchr(s.s, 0, s.len) || !utf8_valid((const unsigned char *)s.s, s.len))
            return kvc__msgf(KVC_EPARSE, err, cap,
                             "tokenizer.ggml.tokens[%u] is not valid UTF-8 text (or holds a NUL)",
                             i);
        blob_bytes += s.len + 1;
    }
    if (blob_bytes > UINT32_MAX)
        return kvc__msgf(KVC_EPARSE, err, cap, "tokenizer.ggml.tokens: %llu bytes of text",
                         (unsigned long long)blob_bytes);

    uint32_t table_n = 16;
    while (table_n < 2 * (uint64_t)n) table_n *= 2;
    const kvc_allocator_t *a = &t->alloc;
    if (!(t->blob = kvc_alloc(a, blob_bytes, 1)) ||
        !(t->text_off = kvc_calloc(a, n, sizeof *t->text_off, alignof(uint32_t))) ||
        !(t->text_len = kvc_calloc(a, n, sizeof *t->text_len, alignof(uint32_t))) ||
        !(t->scores = kvc_calloc(a, n, sizeof *t->scores, alignof(float))) ||
        !(t->types = kvc_calloc(a, n, 1, 1)) || !(t->strip = kvc_calloc(a, n, 1, 1)) ||
        !(t->table = kvc_calloc(a, table_n, sizeof *t->table, alignof(uint32_t))))
        return kvc__msgf(KVC_ENOMEM, err, cap, "out of memory for a %u-token vocabulary", n);
    t->table_mask = table_n - 1;

    uint32_t off = 0, n_special = 0;
    for (uint32_t i = 0; i < n; i++) {
        kvc_gguf_str_t s;
        (void)!kvc_gguf_arr_str(g, &toks, i, &s); /* read once above */
        memcpy(t->blob + off, s.s, s.len);
        t->blob[off + s.len] = '\0';
        t->text_off[i] = off;
        t->text_len[i] = (uint32_t)s.len;
        off += (uint32_t)s.len + 1;
        if (s.len > t->max_text_len) t->max_text_len = (uint32_t)s.len;

        double score = 0;
        if (has_scores && (kvc_gguf_arr_f64(&scores, i, &score) || !isfinite(score)))
            return kvc__msgf(KVC_EPARSE, err, cap,
                             "tokenizer.ggml.scores[%u] is not a finite number", i);
        t->scores[i] = (float)score;

        int64_t type = KVC_TOKTYPE_NORMAL;
        if (has_types &&
            (kvc_gguf_arr_i64(&types, i, &type) || type < 0 || type > KVC_TOKTYPE_BYTE))
            return kvc__msgf(KVC_EPARSE, err, cap,
                             "tokenizer.ggml.token_type[%u] = %lld is not a token type (0..6)", i,
                             (long long)type);
        t->types[i] = (uint8_t)type;
        if (type == KVC_TOKTYPE_BYTE && byte_token_value(s.s, s.len) < 0)
            return kvc__msgf(KVC_EPARSE, err, cap,
                             "tokenizer.ggml.tokens[%u] is a byte token but not <0xXX>", i);
        if (s.len && (type == KVC_TOKTYPE_CONTROL || type == KVC_TOKTYPE_UNKNOWN ||
                      type == KVC_TOKTYPE_USER_DEFINED))
            n_special++;
        /* empty texts are never matched (llama.cpp renames them "[EMPTY_i]") */
        if (s.len) table_insert(t, i);
    }

    if (n_special) {
        if (!(t->special = kvc_calloc(a, n_special, sizeof *t->special, alignof(uint32_t))))
            return kvc__msgf(KVC_ENOMEM, err, cap, "out of memory for the special tokens");
        for (uint32_t i = 0; i < n; i++) {
            uint8_t ty = t->types[i];
            if (t->text_len[i] && (ty == KVC_TOKTYPE_CONTROL || ty == KVC_TOKTYPE_UNKNOWN ||
                                   ty == KVC_TOKTYPE_USER_DEFINED))
                t->special[t->n_special++] = i;
        }
        qsort_r(t->special, t->n_special, sizeof *t->special, cmp_special, t);
    }

    if ((rc = phi3_rstrip(t, g, err, cap))) return rc;

    /* llama.cpp's defaults: SentencePiece bos 1, eos 2, unk 0, BOS added; BPE bos = eos = 11
     * (its gpt2 legacy), no unk, BOS added only where the pre-tokenizer says (Llama 3) */
    bool add_bos_default = true;
    if (bpe && (rc = kvc__bpe_create(t, g, &t->bpe, &add_bos_default, err, cap))) return rc;
    if ((rc = read_special(g, "tokenizer.ggml.bos_token_id", bpe ? 11 : 1, n, &t->bos, err, cap)) ||
        (rc = read_special(g, "tokenizer.ggml.eos_token_id", bpe ? 11 : 2, n, &t->eos, err, cap)) ||
        (rc = read_special(g, "tokenizer.ggml.unknown_token_id", bpe ? -1 : 0, n, &t->unk, err,
                           cap)) ||
        (rc = read_special(g, "tokenizer.ggml.padding_token_id", -1, n, &t->pad, err, cap)) ||
        (rc = read_flag(g, "tokenizer.ggml.add_bos_token", add_bos_default, &t->add_bos, err,
                        cap)) ||
        (rc = read_flag(g, "tokenizer.ggml.add_eos_token", false, &t->add_eos, err, cap)) ||
        (rc =
             read_flag(g, "tokenizer.ggml.add_space_prefix", true, &t->add_space_prefix, err, cap)))
        return rc;
    if (bpe) {
        t->add_space_prefix = false; /* byte-level BPE has no leading-space rule */
        for (int b = 0; b < 256; b++) t->byte_id[b] = KVC_TOKEN_NONE; /* unused */
        return 0;
    }

    /* byte fallback: <0xXX> first, then the one-byte text, then the unknown token */
    for (int b = 0; b < 256; b++) {
        char hex[7], one[1] = {(char)b};
        static const char digits[] = "0123456789ABCDEF";
        memcpy(hex, "<0x", 3);
        hex[3] = digits[b >> 4];
        hex[4] = digits[b & 15];
        hex[5] = '>';
        hex[6] = '\0';
        kvc_token_t id = kvc_tokenizer_find(t, hex, 6);
        if (id == KVC_TOKEN_NONE) id = kvc_tokenizer_find(t, one, 1);
        if (id == KVC_TOKEN_NONE) id = t->unk;
        if (id == KVC_TOKEN_NONE)
            return kvc__msgf(KVC_EPARSE, err, cap,
                             "no token for byte 0x%02X (no <0x%02X>, and no unknown token)", b, b);
        t->byte_id[b] = id;
    }
    return 0;
}

int kvc_tokenizer_create_gguf(const kvc_gguf_t *g, const kvc_tokenizer_params_t *params,
                              kvc_tokenizer_t **out, char *err, size_t cap)
{
    if (!g || !out) return kvc__msgf(KVC_EINVAL, err, cap, "NULL gguf or out");
    kvc_tokenizer_params_t p = params ? *params : kvc_tokenizer_params_default();
    kvc_tokenizer_t *t = kvc_calloc(&p.allocator, 1, sizeof *t, alignof(kvc_tokenizer_t));
    if (!t) return kvc__msgf(KVC_ENOMEM, err, cap, "out of memory for a tokenizer");
    t->alloc = p.allocator;
    int rc = load(t, g, err, cap);
    if (rc) {
        kvc_tokenizer_destroy(t);
        return rc;
    }
    *out = t;
    return 0;
}

/* ---- accessors ------------------------------------------------------------------------ */

uint32_t kvc_tokenizer_n_vocab(const kvc_tokenizer_t *t)
{
    return t->n_vocab;
}
kvc_token_t kvc_tokenizer_bos(const kvc_tokenizer_t *t)
{
    return t->bos;
}
kvc_token_t kvc_tokenizer_eos(const kvc_tokenizer_t *t)
{
    return t->eos;
}
kvc_token_t kvc_tokenizer_unk(const kvc_tokenizer_t *t)
{
    return t->unk;
}
kvc_token_t kvc_tokenizer_pad(const kvc_tokenizer_t *t)
{
    return t->pad;
}
bool kvc_tokenizer_add_bos(const kvc_tokenizer_t *t)
{
    return t->add_bos;
}
bool kvc_tokenizer_add_eos(const kvc_tokenizer_t *t)
{
    return t->add_eos;
}
bool kvc_tokenizer_add_space_prefix(const kvc_tokenizer_t *t)
{
    return t->add_space_prefix;
}
const char *kvc_tokenizer_model(const kvc_tokenizer_t *t)
{
    return t->bpe ? "gpt2" : "llama";
}
const char *kvc_tokenizer_pre(const kvc_tokenizer_t *t)
{
    return t->bpe ? kvc__bpe_pre(t->bpe) : NULL;
}
static bool valid_id(const kvc_tokenizer_t *t, kvc_token_t id)
{
    return id >= 0 && (uint32_t)id < t->n_vocab;
}
const char *kvc_tokenizer_token_text(const kvc_tokenizer_t *t, kvc_token_t id)
{
    return valid_id(t, id) ? text_of(t, (uint32_t)id) : NULL;
}
float kvc_tokenizer_token_score(const kvc_tokenizer_t *t, kvc_token_t id)
{
    return valid_id(t, id) ? t->scores[id] : 0.0f;
}
kvc_toktype_t kvc_tokenizer_token_type(const kvc_tokenizer_t *t, kvc_token_t id)
{
    return valid_id(t, id) ? (kvc_toktype_t)t->types[id] : KVC_TOKTYPE_UNDEFINED;
}
size_t kvc_tokenizer_max_piece_bytes(const kvc_tokenizer_t *t)
{
    /* a held EOS and the token after it, three held bytes, and every byte a U+FFFD */
    return 3 * (2 * (size_t)t->max_text_len + 4);
}

/* ---- encode --------------------------------------------------------------------------- */

typedef struct {
    int32_t prev, next;
    uint32_t off, n; /* bytes of the escaped text; n = 0 once merged into its left neighbour */
} sym_t;

typedef struct {
    float score;
    int32_t left, right;
    uint32_t size; /* bytes of the merged text, to recognise stale entries */
} bigram_t;

typedef struct {
    uint32_t off, len; /* raw text fragment in the input */
    int32_t token;     /* >= 0: a special token, not text */
    int32_t next;
} frag_t;

typedef struct {
    char *text; /* escaped fragment */
    sym_t *sym;
    bigram_t *heap;
    size_t n_heap;
    size_t cap_sym, cap_heap;
    frag_t *frag;
    kvc_token_t *out;
    size_t cap, n_out;
} encoder_t;

static void emit(encoder_t *e, kvc_token_t id)
{
    if (e->n_out < e->cap) e->out[e->n_out] = id;
    e->n_out++;
}

/* Heap order: higher score first, then the leftmost pair. */
static bool bigram_before(const bigram_t *a, const bigram_t *b)
{
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void heap_push(encoder_t *e, bigram_t b)
{
    KVC_ASSERT(e->n_heap < e->cap_heap);
    size_t i = e->n_heap++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!bigram_before(&b, &e->heap[parent])) break;
        e->heap[i] = e->heap[parent];
        i = parent;
    }
    e->heap[i] = b;
}

static bigram_t heap_pop(encoder_t *e)
{
    bigram_t top = e->heap[0], last = e->heap[--e->n_heap];
    size_t i = 0, n = e->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && bigram_before(&e->heap[c + 1], &e->heap[c])) c++;
        if (!bigram_before(&e->heap[c], &last)) break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (n) e->heap[i] = last;
    return top;
}

static void try_bigram(const kvc_tokenizer_t *t, encoder_t *e, int32_t left, int32_t right)
{
    if (left < 0 || right < 0) return;
    const sym_t *l = &e->sym[left], *r = &e->sym[right];
    uint32_t size = l->n + r->n;
    kvc_token_t id = kvc_tokenizer_find(t, e->text + l->off, size);
    if (id == KVC_TOKEN_NONE) return;
    heap_push(e, (bigram_t){.score = t->scores[id], .left = left, .right = right, .size = size});
}

/* SentencePiece over one escaped fragment e->text[0..n). */
static void spm_fragment(const kvc_tokenizer_t *t, encoder_t *e, size_t n)
{
    int32_t n_sym = 0;
    for (size_t off = 0; off < n;) {
        size_t len = KVC_MIN(utf8_len((unsigned char)e->text[off]), n - off);
        KVC_ASSERT((size_t)n_sym < e->cap_sym);
        e->sym[n_sym] =
            (sym_t){.prev = n_sym - 1, .next = -1, .off = (uint32_t)off, .n = (uint32_t)len};
        if (n_sym) e->sym[n_sym - 1].next = n_sym;
        n_sym++;
        off += len;
    }
    if (!n_sym) return;
    e->n_heap = 0;
    for (int32_t i = 1; i < n_sym; i++) try_bigram(t, e, i - 1, i);
    while (e->n_heap) {
        bigram_t b = heap_pop(e);
        sym_t *l = &e->sym[b.left], *r = &e->sym[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size) continue; /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) e->sym[r->next].prev = b.left;
        try_bigram(t, e, l->prev, b.left);
        try_bigram(t, e, b.left, l->next);
    }
    /* Every merge made a vocabulary piece, so only a lone character can be missing from the
     * vocabulary: it falls back to its bytes (llama.cpp's resegment reaches no other case). */
    for (int32_t i = 0; i >= 0; i = e->sym[i].next) {
        const sym_t *s = &e->sym[i];
        kvc_token_t id = kvc_tokenizer_find(t, e->text + s->off, s->n);
        if (id != KVC_TOKEN_NONE) {
            emit(e, id);
        } else {
            for (uint32_t k = 0; k < s->n; k++)
                emit(e, t->byte_id[(unsigned char)e->text[s->off + k]]);
        }
    }
}

/* Find needle[0..m) in hay[0..n), or return -1. */
static ptrdiff_t find_bytes(const char *hay, size_t n, const char *needle, size_t m)
{
    if (m > n) return -1;
    const char *end = hay + (n - m) + 1, *p = hay;
    while (p < end) {
        p = memchr(p, needle[0], (size_t)(end - p));
        if (!p) return -1;
        if (memcmp(p, needle, m) == 0) return p - hay;
        p++;
    }
    return -1;
}

/* Split the fragment list at every occurrence of each special token, longest text first. */
static void partition(const kvc_tokenizer_t *t, encoder_t *e, const char *text, bool parse_special,
                      int32_t *n_frag)
{
    for (uint32_t k = 0; k < t->n_special; k++) {
        uint32_t id = t->special[k];
        uint8_t ty = t->types[id];
        if (!parse_special && ty != KVC_TOKTYPE_USER_DEFINED) continue;
        const char *needle = text_of(t, id);
        size_t m = t->text_len[id];
        for (int32_t i = 0; i >= 0; i = e->frag[i].next) {
            frag_t *f = &e->frag[i];
            if (f->token >= 0) continue;
            ptrdiff_t p = find_bytes(text + f->off, f->len, needle, m);
            if (p < 0) continue;
            uint32_t rest_off = f->off + (uint32_t)p + (uint32_t)m;
            uint32_t rest_len = f->len - (uint32_t)p - (uint32_t)m;
            if (t->strip[id] & STRIP_RIGHT)
                while (rest_len && is_space(text[rest_off])) rest_off++, rest_len--;
            if (t->strip[id] & STRIP_LEFT)
                while (p > 0 && is_space(text[f->off + (uint32_t)p - 1])) p--;
            int32_t after = f->next;
            if (rest_len) {
                int32_t r = (*n_frag)++;
                e->frag[r] = (frag_t){.off = rest_off, .len = rest_len, .token = -1, .next = after};
                after = r;
            }
            if (p > 0) {
                int32_t tk = (*n_frag)++;
                e->frag[tk] = (frag_t){.token = (int32_t)id, .next = after};
                f->len = (uint32_t)p;
                f->next = tk;
                i = tk; /* continue after the token: the remainder is next */
            } else {
                f->token = (int32_t)id;
                f->len = 0;
                f->next = after;
            }
        }
    }
}

/* Byte-level BPE: the same special-token partition, then each plain fragment through
 * tokenizer_bpe.c, in one workspace that also holds the fragment list. */
static int bpe_encode(const kvc_tokenizer_t *t, const char *text, size_t len, unsigned flags,
                      bool add_bos, bool add_eos, encoder_t *e, size_t *n_out)
{
    kvc__bpe_ws_t *ws = NULL;
    int rc = 0;
    if (add_bos) emit(e, t->bos);
    if (len) {
        if ((rc = kvc__bpe_ws_create(t, text, len, 2 * (len + 1) * sizeof(frag_t), &ws))) return rc;
        e->frag = kvc__bpe_ws_extra(ws);
        int32_t n_frag = 1;
        e->frag[0] = (frag_t){.off = 0, .len = (uint32_t)len, .token = -1, .next = -1};
        partition(t, e, text, (flags & KVC_TOK_PARSE_SPECIAL) != 0, &n_frag);
        for (int32_t i = 0; i >= 0 && !rc; i = e->frag[i].next) {
            const frag_t *f = &e->frag[i];
            if (f->token >= 0)
                emit(e, f->token);
            else
                rc = kvc__bpe_encode(t, ws, text + f->off, f->len, e->out, e->cap, &e->n_out);
        }
        kvc__bpe_ws_destroy(t, ws);
        if (rc) return rc;
    }
    if (add_eos) emit(e, t->eos);
    *n_out = e->n_out;
    return e->n_out > e->cap ? KVC_ERANGE : 0;
}

int kvc_tokenizer_encode(const kvc_tokenizer_t *t, const char *text, size_t len, unsigned flags,
                         kvc_token_t *out, size_t cap, size_t *n_out)
{
    const unsigned known =
        KVC_TOK_ADD_BOS | KVC_TOK_ADD_EOS | KVC_TOK_ADD_SPECIAL | KVC_TOK_PARSE_SPECIAL;
    if (!t || !n_out || (!text && len) || (!out && cap) || (flags & ~known) ||
        len > MAX_ENCODE_BYTES)
        return KVC_EINVAL;
    bool add_bos = (flags & KVC_TOK_ADD_BOS) || ((flags & KVC_TOK_ADD_SPECIAL) && t->add_bos);
    bool add_eos = (flags & KVC_TOK_ADD_EOS) || ((flags & KVC_TOK_ADD_SPECIAL) && t->add_eos);
    if ((add_bos && t->bos == KVC_TOKEN_NONE) || (add_eos && t->eos == KVC_TOKEN_NONE))
        return KVC_ENOENT;

    encoder_t e = {.out = out, .cap = cap};
    if (t->bpe) return bpe_encode(t, text, len, flags, add_bos, add_eos, &e, n_out);
    void *ws = NULL;
    if (len) {
        /* one workspace: the escaped fragment (a space becomes 3 bytes, plus the prefix);
         * at most 2 symbols per input byte (a space's ▁ is one symbol, or two when an invalid
         * lead byte before it took its first byte into its own character); a heap of at most
         * 3 bigrams per symbol (one per adjacent pair, two per merge); and at most 2 fragments
         * per byte plus one */
        size_t n1 = len + 1;
        e.cap_sym = 2 * n1;
        e.cap_heap = 3 * e.cap_sym;
        size_t sz_sym = e.cap_sym * sizeof(sym_t), sz_heap = e.cap_heap * sizeof(bigram_t),
               sz_frag = (2 * n1) * sizeof(frag_t), sz_text = 3 * n1;
        ws = kvc_alloc(&t->alloc, sz_sym + sz_heap + sz_frag + sz_text, 16);
        if (!ws) return KVC_ENOMEM;
        char *p = ws;
        e.sym = (sym_t *)p;
        e.heap = (bigram_t *)(p + sz_sym);
        e.frag = (frag_t *)(p + sz_sym + sz_heap);
        e.text = p + sz_sym + sz_heap + sz_frag;
    }

    if (add_bos) emit(&e, t->bos);
    if (len) {
        int32_t n_frag = 1;
        e.frag[0] = (frag_t){.off = 0, .len = (uint32_t)len, .token = -1, .next = -1};
        partition(t, &e, text, (flags & KVC_TOK_PARSE_SPECIAL) != 0, &n_frag);
        bool prev_special = true; /* the text's start counts as following a special token */
        for (int32_t i = 0; i >= 0; i = e.frag[i].next) {
            const frag_t *f = &e.frag[i];
            if (f->token >= 0) {
                emit(&e, f->token);
                prev_special = true;
                continue;
            }
            size_t n = 0;
            if (t->add_space_prefix && prev_special) {
                memcpy(e.text, SPM_SPACE, 3);
                n = 3;
            }
            for (uint32_t k = 0; k < f->len; k++) {
                char c = text[f->off + k];
                if (c == ' ') {
                    memcpy(e.text + n, SPM_SPACE, 3);
                    n += 3;
                } else {
                    e.text[n++] = c;
                }
            }
            spm_fragment(t, &e, n);
            prev_special = false;
        }
    }
    if (add_eos) emit(&e, t->eos);
    kvc_free(&t->alloc, ws);
    *n_out = e.n_out;
    return e.n_out > cap ? KVC_ERANGE : 0;
}

/* ---- decode --------------------------------------------------------------------------- */

/* Render token id's piece into dst (NULL: measure only); returns its bytes.  lstrip drops
 * one leading space of the rendered piece. */
static size_t render_piece(const kvc_tokenizer_t *t, uint32_t id, unsigned flags, bool lstrip,
                           char *dst)
{
    uint8_t ty = t->types[id];
    const char *s = text_of(t, id);
    size_t n = t->text_len[id], w = 0;
    bool special = (flags & KVC_TOK_UNPARSE_SPECIAL) != 0;
    if (ty == KVC_TOKTYPE_CONTROL || ty == KVC_TOKTYPE_UNKNOWN) {
        if (!special) return 0;
    } else if (ty == KVC_TOKTYPE_NORMAL && t->bpe) {
        return kvc__bpe_decode_text(t->bpe, s, n, dst);
    } else if (ty == KVC_TOKTYPE_NORMAL) {
        for (size_t i = 0; i < n;) {
            char c;
            if (n - i >= 3 && memcmp(s + i, SPM_SPACE, 3) == 0) {
                c = ' ';
                i += 3;
            } else {
                c = s[i++];
            }
            if (lstrip && w == 0 && c == ' ') {
                lstrip = false;
                continue;
            }
            lstrip = false;
            if (dst) dst[w] = c;
            w++;
        }
        return w;
    } else if (ty == KVC_TOKTYPE_BYTE && !t->bpe) {
        char c = (char)byte_token_value(s, n);
        if (lstrip && c == ' ') return 0;
        if (dst) dst[0] = c;
        return 1;
    } else if (ty != KVC_TOKTYPE_USER_DEFINED) {
        return 0; /* unused, undefined: suppressed like control tokens */
    }
    /* control / unknown (when asked) and user-defined: verbatim */
    size_t skip = lstrip && n && s[0] == ' ' ? 1 : 0;
    if (dst) memcpy(dst, s + skip, n - skip);
    return n - skip;
}

int kvc_tokenizer_decode(const kvc_tokenizer_t *t, const kvc_token_t *ids, size_t n, unsigned flags,
                         char *out, size_t cap, size_t *n_bytes)
{
    const unsigned known = KVC_TOK_REMOVE_SPECIAL | KVC_TOK_UNPARSE_SPECIAL;
    if (!t || !n_bytes || (!ids && n) || (!out && cap) || (flags & ~known)) return KVC_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (!valid_id(t, ids[i])) return KVC_EINVAL;
    bool lstrip = t->add_space_prefix;
    if ((flags & KVC_TOK_REMOVE_SPECIAL) && t->add_bos && n && ids[0] == t->bos) {
        lstrip = false;
        ids++;
        n--;
    }
    if ((flags & KVC_TOK_REMOVE_SPECIAL) && t->add_eos && n && ids[n - 1] == t->eos) n--;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        size_t w = render_piece(t, (uint32_t)ids[i], flags, lstrip, NULL);
        if (total + w < cap) render_piece(t, (uint32_t)ids[i], flags, lstrip, out + total);
        total += w;
        lstrip = false;
    }
    *n_bytes = total;
    if (total >= cap) return KVC_ERANGE;
    out[total] = '\0';
    return 0;
}

/* ---- streaming decode ----------------------------------------------------------------- */

typedef struct {
    bool at_start;  /* no id seen yet */
    bool lstrip;    /* the next rendered piece loses a leading space */
    bool held_eos;  /* an EOS that is dropped if it turns out to be the last id */
    uint8_t n_buf;  /* bytes of an unfinished character */
    uint8_t need;   /* continuation bytes still expected */
    uint8_t lo, hi; /* the range the next continuation byte must be in */
    char buf[4];
} stream_state_t;

struct kvc_tokenizer_stream {
    const kvc_tokenizer_t *t;
    unsigned flags;
    stream_state_t st;
    char *scratch; /* (max_text_len) one rendered piece */
};

typedef struct {
    char *out;
    size_t cap, n;
} sink_t;

static void sink_put(sink_t *k, const char *s, size_t n)
{
    if (k->n + n < k->cap) memcpy(k->out + k->n, s, n);
    k->n += n;
}

static void put_replacement(sink_t *k)
{
    sink_put(k, "\xEF\xBF\xBD", 3);
}

/* One byte through the UTF-8 decoder (maximal-subpart replacement). */
static void utf8_byte(stream_state_t *st, sink_t *k, unsigned char b)
{
    if (st->need) {
        if (b >= st->lo && b <= st->hi) {
            st->buf[st->n_buf++] = (char)b;
            st->lo = 0x80;
            st->hi = 0xBF;
            if (--st->need == 0) {
                sink_put(k, st->buf, st->n_buf);
                st->n_buf = 0;
            }
            return;
        }
        put_replacement(k); /* the unfinished sequence; b starts afresh */
        st->need = 0;
        st->n_buf = 0;
    }
    st->lo = 0x80;
    st->hi = 0xBF;
    if (b < 0x80) {
        char c = (char)b;
        sink_put(k, &c, 1);
        return;
    } else if (b >= 0xC2 && b <= 0xDF) {
        st->need = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
        st->need = 2;
        if (b == 0xE0) st->lo = 0xA0;
        if (b == 0xED) st->hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        st->need = 3;
        if (b == 0xF0) st->lo = 0x90;
        if (b == 0xF4) st->hi = 0x8F;
    } else {
        put_replacement(k);
        return;
    }
    st->buf[0] = (char)b;
    st->n_buf = 1;
}

static void stream_piece(kvc_tokenizer_stream_t *s, stream_state_t *st, sink_t *k, uint32_t id)
{
    size_t n = render_piece(s->t, id, s->flags, st->lstrip, s->scratch);
    st->lstrip = false;
    for (size_t i = 0; i < n; i++) utf8_byte(st, k, (unsigned char)s->scratch[i]);
}

int kvc_tokenizer_stream_create(const kvc_tokenizer_t *t, unsigned flags,
                                kvc_tokenizer_stream_t **out)
{
    const unsigned known = KVC_TOK_REMOVE_SPECIAL | KVC_TOK_UNPARSE_SPECIAL;
    if (!t || !out || (flags & ~known)) return KVC_EINVAL;
    kvc_tokenizer_stream_t *s =
        kvc_calloc(&t->alloc, 1, sizeof *s, alignof(kvc_tokenizer_stream_t));
    if (!s) return KVC_ENOMEM;
    if (!(s->scratch = kvc_alloc(&t->alloc, (size_t)t->max_text_len + 1, 1))) {
        kvc_free(&t->alloc, s);
        return KVC_ENOMEM;
    }
    s->t = t;
    s->flags = flags;
    kvc_tokenizer_stream_reset(s);
    *out = s;
    return 0;
}

void kvc_tokenizer_stream_destroy(kvc_tokenizer_stream_t *s)
{
    if (!s) return;
    const kvc_tokenizer_t *t = s->t;
    kvc_free(&t->alloc, s->scratch);
    kvc_free(&t->alloc, s);
}

void kvc_tokenizer_stream_reset(kvc_tokenizer_stream_t *s)
{
    memset(&s->st, 0, sizeof s->st);
    s->st.at_start = true;
    s->st.lstrip = s->t->add_space_prefix;
}

static int stream_done(kvc_tokenizer_stream_t *s, const stream_state_t *st, sink_t *k,
                       size_t *n_bytes)
{
    *n_bytes = k->n;
    if (k->n >= k->cap) return KVC_ERANGE; /* the stream keeps its old state */
    k->out[k->n] = '\0';
    s->st = *st;
    return 0;
}

int kvc_tokenizer_stream_push(kvc_tokenizer_stream_t *s, kvc_token_t id, char *out, size_t cap,
                              size_t *n_bytes)
{
    if (!s || !out || !n_bytes || !valid_id(s->t, id)) return KVC_EINVAL;
    const kvc_tokenizer_t *t = s->t;
    stream_state_t st = s->st;
    sink_t k = {.out = out, .cap = cap};
    bool remove = (s->flags & KVC_TOK_REMOVE_SPECIAL) != 0;
    bool first = st.at_start;
    st.at_start = false;
    if (first && remove && t->add_bos && id == t->bos) {
        st.lstrip = false;
        return stream_done(s, &st, &k, n_bytes);
    }
    if (st.held_eos) {
        stream_piece(s, &st, &k, (uint32_t)t->eos); /* it was not the last id after all */
        st.held_eos = false;
    }
    if (remove && t->add_eos && id == t->eos)
        st.held_eos = true;
    else
        stream_piece(s, &st, &k, (uint32_t)id);
    return stream_done(s, &st, &k, n_bytes);
}

int kvc_tokenizer_stream_finish(kvc_tokenizer_stream_t *s, char *out, size_t cap, size_t *n_bytes)
{
    if (!s || !out || !n_bytes) return KVC_EINVAL;
    stream_state_t st = s->st;
    sink_t k = {.out = out, .cap = cap};
    if (st.need) put_replacement(&k);
    int rc = stream_done(s, &st, &k, n_bytes);
    if (rc == 0) kvc_tokenizer_stream_reset(s);
    return rc;
}
