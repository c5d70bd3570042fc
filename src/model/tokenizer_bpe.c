/* model/tokenizer_bpe.c - the byte-level BPE tokenizer (tokenizer.ggml.model "gpt2"): the
 * pre-tokenizer that splits text into words with the regexes tokenizer.ggml.pre names, the
 * GPT-2 byte-to-unicode map, and the merges of tokenizer.ggml.merges applied by rank.
 *
 * The behaviour is llama.cpp's llm_tokenizer_bpe with its unicode_regex_split (see
 * tokenizer.h): each regex of the pre-tokenizer's list splits every piece the previous one
 * left, the matches and the text between them both becoming pieces; the regexes run on
 * PCRE2 (UTF + UCP, JIT where the platform has it) over the piece alone, so a lookahead or
 * `$` sees the piece's end as llama.cpp's std::regex does.  A word's bytes are its first
 * symbols (each byte's token is the one whose text is the byte's GPT-2 character); adjacent
 * symbols merge lowest rank first (ties: leftmost) through a hash table keyed by the two token
 * ids, and a binary heap of candidate pairs keeps a word's merging O(n log n).
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdalign.h>
#include <string.h>

#include "model/tokenizer_int.h"
#include "util/msg.h"

#define MAX_REGEX 6
#define N_MAPPED  324 /* code points of the byte map: 0..255 and 256..323 */

/* ---- the pre-tokenizers (regex lists as in llama.cpp's llm_tokenizer_bpe) ------------------- */

/* GPT-2's split: contractions, letters, digits, other symbols (each with one optional leading
 * space), then whitespace not followed by a non-space. */
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
/* Llama 3's (tiktoken cl100k-style): any-case contractions, a letter run with one optional
 * non-letter, non-digit prefix, digits in groups of up to three, symbols with the newlines
 * after them, newline runs, then other whitespace. */
#define RE_LLAMA3                                                                             \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"                               \
    "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+" \
    "|\\s+(?!\\S)|\\s+"
/* Qwen 2's: Llama 3's with one digit per piece. */
#define RE_QWEN2                                                                         \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"                          \
    "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+" \
    "|\\s+(?!\\S)|\\s+"
/* DeepSeek's: CJK (and U+0800..U+4E00) runs, and the cased letters of Unicode as one class. */
#define RE_DEEPSEEK_CJK "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"
#define RE_DEEPSEEK_CASED                                                                         \
    "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-"  \
    "\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}" \
    "\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-"       \
    "\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}"          \
    "\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-"      \
    "\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}"       \
    "\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}"        \
    "\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}"       \
    "\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}"       \
    "\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}"         \
    "\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}"       \
    "\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}"        \
    "\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-"       \
    "\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}"       \
    "\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}\\x{104D8}-" \
    "\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}\\x{1E900}-"        \
    "\\x{1E943}]+"

typedef struct {
    const char *names[8]; /* the tokenizer.ggml.pre values that select it */
    const char *regex[MAX_REGEX];
    bool ignore_merges; /* a word that is a token is that token, merges or not (Llama 3) */
    bool add_bos;       /* llama.cpp's add_bos default for it */
} pre_t;

static const pre_t PRES[] = {
    {{"default"},
     {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"},
     false,
     false},
    {{"gpt-2", "phi-2", "mpt", "olmo", "jais"}, {RE_GPT2}, false, false},
    {{"llama-bpe", "llama3", "llama-v3", "falcon3"}, {RE_LLAMA3}, true, true},
    {{"dbrx", "smaug-bpe"}, {RE_LLAMA3}, false, false},
    {{"qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"}, {RE_QWEN2}, false, false},
    {{"deepseek-llm"},
     {"[\r\n]", RE_DEEPSEEK_CASED,
      "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-"
      "\\x{201F}\\x{3000}-\\x{3002}]+",
      "\\s+$", RE_DEEPSEEK_CJK, "\\p{N}+"},
     false,
     false},
    {{"deepseek-coder"},
     {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_DEEPSEEK_CJK, "\\p{N}"},
     false,
     false},
    {{"falcon"}, {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]"}, false, false},
    {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone"},
     {"\\p{N}", RE_GPT2},
     false,
     false},
};

/* ---- the tokenizer's BPE state ------------------------------------------------------------ */

typedef struct {
    uint32_t left, right; /* token ids; rank UINT32_MAX marks an empty slot */
    uint32_t rank, merged;
} merge_t;

struct kvc__bpe {
    const pre_t *pre;
    const char *pre_name; /* as the GGUF spells it (one of pre->names) */
    pcre2_general_context *gctx;
    pcre2_code *re[MAX_REGEX];
    uint32_t n_re;
    merge_t *merges; /* (merge_mask + 1) open addressing on (left, right) */
    uint32_t merge_mask, n_merges;
    kvc_token_t byte_tok[256]; /* the token of each byte's character, KVC_TOKEN_NONE if none */
    int16_t cp_byte[N_MAPPED]; /* the byte each mapped code point stands for, or -1 */
    uint16_t byte_cp[256];     /* the code point each byte stands for */
};

static void *pcre_alloc(size_t n, void *ctx)
{
    return kvc_alloc(ctx, n ? n : 1, 16);
}

static void pcre_free(void *p, void *ctx)
{
    kvc_free(ctx, p);
}

const char *kvc__bpe_pre(const kvc__bpe_t *b)
{
    return b->pre_name;
}

void kvc__bpe_destroy(const kvc_tokenizer_t *t, kvc__bpe_t *b)
{
    if (!b) return;
    for (uint32_t i = 0; i < b->n_re; i++) pcre2_code_free(b->re[i]);
    pcre2_general_context_free(b->gctx);
    kvc_free(&t->alloc, b->merges);
    kvc_free(&t->alloc, b);
}

static uint32_t pair_hash(uint32_t a, uint32_t b)
{
    uint64_t k = ((uint64_t)a << 32) | b;
    k ^= k >> 33;
    k *= UINT64_C(0xff51afd7ed558ccd);
    k ^= k >> 33;
    return (uint32_t)k;
}

static const merge_t *merge_find(const kvc__bpe_t *b, uint32_t left, uint32_t right)
{
    for (uint32_t i = pair_hash(left, right) & b->merge_mask;; i = (i + 1) & b->merge_mask) {
        const merge_t *m = &b->merges[i];
        if (m->rank == UINT32_MAX) return NULL;
        if (m->left == left && m->right == right) return m;
    }
}

static size_t utf8_put(uint32_t cp, char *dst)
{
    if (cp < 0x80) {
        dst[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        dst[0] = (char)(0xC0 | (cp >> 6));
        dst[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        dst[0] = (char)(0xE0 | (cp >> 12));
        dst[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        dst[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    dst[0] = (char)(0xF0 | (cp >> 18));
    dst[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    dst[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    dst[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* A printable copy of a metadata string for a one-line message. */
static void printable(char *dst, size_t cap, const char *s, size_t n)
{
    size_t k = KVC_MIN(n, cap - 1);
    for (size_t i = 0; i < k; i++) {
        unsigned char c = (unsigned char)s[i];
        dst[i] = c < 0x20 || c == 0x7F ? '?' : (char)c;
    }
    dst[k] = '\0';
}

static int read_pre(kvc__bpe_t *b, const kvc_gguf_t *g, char *err, size_t cap)
{
    kvc_gguf_str_t pre;
    int rc = kvc_gguf_get_str(g, "tokenizer.ggml.pre", &pre);
    if (rc == KVC_ENOENT) { /* llama.cpp's fallback for a GGUF without one */
        b->pre = &PRES[0];
        b->pre_name = PRES[0].names[0];
        return 0;
    }
    if (rc) return kvc__msgf(KVC_EPARSE, err, cap, "tokenizer.ggml.pre is not a string");
    for (size_t i = 0; i < sizeof PRES / sizeof PRES[0]; i++)
        for (size_t k = 0; k < 8 && PRES[i].names[k]; k++)
            if (kvc_gguf_str_eq(pre, PRES[i].names[k])) {
                b->pre = &PRES[i];
                b->pre_name = PRES[i].names[k];
                return 0;
            }
    char name[65];
    printable(name, sizeof name, pre.s, pre.len);
    return kvc__msgf(KVC_ENOTSUP, err, cap,
                     "tokenizer.ggml.pre '%s' is not a supported pre-tokenizer (known: default, "
                     "gpt-2, llama-bpe, qwen2, deepseek-llm, deepseek-coder, falcon, starcoder, "
                     "mpt, refact and their aliases)",
                     name);
}

static int compile_regexes(const kvc_tokenizer_t *t, kvc__bpe_t *b, char *err, size_t cap)
{
    b->gctx = pcre2_general_context_create(pcre_alloc, pcre_free, (void *)&t->alloc);
    if (!b->gctx) return kvc__msgf(KVC_ENOMEM, err, cap, "out of memory for the regex engine");
    pcre2_compile_context *cc = pcre2_compile_context_create(b->gctx);
    if (!cc) return kvc__msgf(KVC_ENOMEM, err, cap, "out of memory for the regex engine");
    int rc = 0;
    for (size_t i = 0; i < MAX_REGEX && b->pre->regex[i]; i++) {
        int code;
        PCRE2_SIZE at;
        pcre2_code *re =
            pcre2_compile((PCRE2_SPTR)b->pre->regex[i], PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &code, &at, cc);
        if (!re) {
            /* the patterns are fixed, so only memory can fail here */
            rc = code == PCRE2_ERROR_NOMEMORY || code == PCRE2_ERROR_HEAP_FAILED
                     ? kvc__msgf(KVC_ENOMEM, err, cap, "out of memory compiling a regex")
                     : kvc__msgf(KVC_ENOTSUP, err, cap,
                                 "pre-tokenizer '%s': regex %zu does not compile (PCRE2 error %d)",
                                 b->pre_name, i, code);
            break;
        }
        b->re[b->n_re++] = re;
        /* where the platform has no JIT the interpreter runs it; out of memory is an error */
        if (pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == PCRE2_ERROR_NOMEMORY) {
            rc = kvc__msgf(KVC_ENOMEM, err, cap, "out of memory compiling a regex");
            break;
        }
    }
    pcre2_compile_context_free(cc);
    return rc;
}

static int read_merges(const kvc_tokenizer_t *t, kvc__bpe_t *b, const kvc_gguf_t *g, char *err,
                       size_t cap)
{
    kvc_gguf_arr_t arr;
    int rc = kvc_gguf_get_arr(g, "tokenizer.ggml.merges", &arr);
    if (rc == KVC_ENOENT)
        return kvc__msgf(KVC_EPARSE, err, cap,
                         "tokenizer.ggml.merges is missing (a gpt2 tokenizer needs its merges)");
    if (rc || arr.type != KVC_GGUF_STRING)
        return kvc__msgf(KVC_EPARSE, err, cap, "tokenizer.ggml.merges is not an array of strings");
    if (arr.n >= UINT32_MAX / 2)
        return kvc__msgf(KVC_EPARSE, err, cap, "tokenizer.ggml.merges has %llu entries",
                         (unsigned long long)arr.n);
    uint32_t n = (uint32_t)arr.n, size = 16;
    while (size < 2 * (uint64_t)n) size *= 2;
    if (!(b->merges = kvc_alloc(&t->alloc, (size_t)size * sizeof *b->merges, alignof(merge_t))))
        return kvc__msgf(KVC_ENOMEM, err, cap, "out of memory for %u merges", n);
    memset(b->merges, 0xFF, (size_t)size * sizeof *b->merges);
    b->merge_mask = size - 1;
    char *both = kvc_alloc(&t->alloc, 2u * 65535u + 2, 1);
    if (!both) return kvc__msgf(KVC_ENOMEM, err, cap, "out of memory for the merges");
    rc = 0;
    for (uint32_t i = 0; i < n && !rc; i++) {
        kvc_gguf_str_t s;
        if (kvc_gguf_arr_str(g, &arr, i, &s)) {
            rc = kvc__msgf(KVC_EPARSE, err, cap, "tokenizer.ggml.merges[%u] is unreadable", i);
            break;
        }
        /* "left right", split at the first space after the first byte (as llama.cpp) */
        const char *sp = s.len > 1 ? memchr(s.s + 1, ' ', s.len - 1) : NULL;
        char shown[97];
        printable(shown, sizeof shown, s.s, s.len);
        if (!sp || (size_t)(sp - s.s) + 1 == s.len) {
            rc = kvc__msgf(KVC_EPARSE, err, cap,
                           "tokenizer.ggml.merges[%u] '%s' is not two tokens with a space between",
                           i, shown);
            break;
        }
        size_t nl = (size_t)(sp - s.s), nr = s.len - nl - 1;
        kvc_token_t l = kvc_tokenizer_find(t, s.s, nl), r = kvc_tokenizer_find(t, sp + 1, nr);
        kvc_token_t m = KVC_TOKEN_NONE;
        if (l != KVC_TOKEN_NONE && r != KVC_TOKEN_NONE && nl + nr <= 2u * 65535u) {
            memcpy(both, s.s, nl);
            memcpy(both + nl, sp + 1, nr);
            m = kvc_tokenizer_find(t, both, nl + nr);
        }
        if (m == KVC_TOKEN_NONE) {
            rc = kvc__msgf(KVC_EPARSE, err, cap,
                           "tokenizer.ggml.merges[%u] '%s' names a text that is not a token (%s)",
                           i, shown,
                           l == KVC_TOKEN_NONE   ? "its left part"
                           : r == KVC_TOKEN_NONE ? "its right part"
                                                 : "the two joined");
            break;
        }
        uint32_t k = pair_hash((uint32_t)l, (uint32_t)r) & b->merge_mask;
        while (b->merges[k].rank != UINT32_MAX &&
               !(b->merges[k].left == (uint32_t)l && b->merges[k].right == (uint32_t)r))
            k = (k + 1) & b->merge_mask;
        if (b->merges[k].rank == UINT32_MAX) /* a repeated pair keeps its first (best) rank */
            b->merges[k] = (merge_t){(uint32_t)l, (uint32_t)r, i, (uint32_t)m};
    }
    kvc_free(&t->alloc, both);
    b->n_merges = n;
    return rc;
}

int kvc__bpe_create(const kvc_tokenizer_t *t, const kvc_gguf_t *g, kvc__bpe_t **out,
                    bool *add_bos_default, char *err, size_t cap)
{
    kvc__bpe_t *b = kvc_calloc(&t->alloc, 1, sizeof *b, alignof(kvc__bpe_t));
    if (!b) return kvc__msgf(KVC_ENOMEM, err, cap, "out of memory for a BPE tokenizer");
    int rc;
    if ((rc = read_pre(b, g, err, cap)) || (rc = read_merges(t, b, g, err, cap)) ||
        (rc = compile_regexes(t, b, err, cap))) {
        kvc__bpe_destroy(t, b);
        return rc;
    }
    /* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68
     * (controls, space, DEL, NBSP, soft hyphen) for U+0100.. in byte order */
    uint32_t n_extra = 0;
    for (int i = 0; i < N_MAPPED; i++) b->cp_byte[i] = -1;
    for (uint32_t c = 0; c < 256; c++) {
        bool self = (c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE;
        uint32_t cp = self ? c : 256 + n_extra++;
        char u[4];
        size_t k = utf8_put(cp, u);
        b->byte_tok[c] = kvc_tokenizer_find(t, u, k);
        b->cp_byte[cp] = (int16_t)c;
        b->byte_cp[c] = (uint16_t)cp;
    }
    *add_bos_default = b->pre->add_bos;
    *out = b;
    return 0;
}

/* ---- decode ------------------------------------------------------------------------------- */

size_t kvc__bpe_decode_text(const kvc__bpe_t *b, const char *s, size_t n, char *dst)
{
    size_t w = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t k = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; /* texts are valid UTF-8 */
        uint32_t cp = k == 1 ? c : c & (0x7Fu >> k);
        for (size_t j = 1; j < k; j++) cp = cp << 6 | ((unsigned char)s[i + j] & 0x3F);
        if (cp < N_MAPPED && b->cp_byte[cp] >= 0) {
            if (dst) dst[w] = (char)b->cp_byte[cp];
            w++;
        } else {
            if (dst) memcpy(dst + w, s + i, k);
            w += k;
        }
        i += k;
    }
    return w;
}

/* ---- encode ------------------------------------------------------------------------------- */

typedef struct {
    int32_t prev, next;
    uint32_t n;     /* bytes; 0 once merged into its left neighbour */
    kvc_token_t id; /* KVC_TOKEN_NONE: a byte without a token, which never merges */
} sym_t;

typedef struct {
    uint32_t rank;
    int32_t left, right;
    uint32_t size;   /* bytes of the pair, to recognise a stale entry */
    uint32_t merged; /* the pair's token */
} cand_t;

struct kvc__bpe_ws {
    pcre2_match_data *md;
    char *norm;        /* (cap) the fragment as valid UTF-8 */
    uint32_t *ends[2]; /* (cap + 1) piece ends, before and after one regex */
    sym_t *sym;        /* (cap) */
    cand_t *heap;      /* (3 * cap) */
    char *mapped;      /* (2 * cap) a word through the byte map (ignore_merges) */
    size_t cap;
    void *extra;
};

/* Copy s[0..n) into dst as valid UTF-8, the way llama.cpp reads text: a byte that cannot
 * start a sequence, or a lead byte without its continuation bytes, becomes U+FFFD and the
 * next byte starts afresh; an overlong form is read as the code point it spells.  Unlike
 * llama.cpp (which keeps them), surrogates and values past U+10FFFF become U+FFFD too, since
 * no tokenizer the vectors come from can see them.  dst NULL: measure only. */
static size_t norm_len(const unsigned char *s, size_t n, char *dst)
{
    static const char fffd[3] = {'\xEF', '\xBF', '\xBD'};
    size_t w = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        if (c < 0x80) {
            if (dst) dst[w] = (char)c;
            w++;
            i++;
            continue;
        }
        size_t need = !(c & 0x40) ? 0 : !(c & 0x20) ? 1 : !(c & 0x10) ? 2 : !(c & 0x08) ? 3 : 0;
        bool ok = need && i + need < n;
        for (size_t j = 1; ok && j <= need; j++) ok = (s[i + j] & 0xC0) == 0x80;
        uint32_t cp = 0xFFFD;
        if (ok) {
            cp = c & (0x3Fu >> need);
            for (size_t j = 1; j <= need; j++) cp = cp << 6 | (s[i + j] & 0x3F);
            if ((cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) cp = 0xFFFD;
            i += need + 1;
        } else {
            i++;
        }
        char u[4];
        size_t k = cp == 0xFFFD ? 3 : utf8_put(cp, u);
        if (dst) memcpy(dst + w, cp == 0xFFFD ? fffd : u, k);
        w += k;
    }
    return w;
}

int kvc__bpe_ws_create(const kvc_tokenizer_t *t, const char *text, size_t len, size_t extra,
                       kvc__bpe_ws_t **out)
{
    size_t cap = norm_len((const unsigned char *)text, len, NULL) + 1;
    size_t sz_head = (sizeof(kvc__bpe_ws_t) + 15) & ~(size_t)15;
    size_t sz_extra = (extra + 15) & ~(size_t)15;
    size_t sz_sym = cap * sizeof(sym_t), sz_heap = 3 * cap * sizeof(cand_t);
    size_t sz_ends = ((cap + 1) * sizeof(uint32_t) + 15) & ~(size_t)15;
    size_t sz_mapped = t->bpe->pre->ignore_merges ? 2 * cap : 0;
    char *p = kvc_alloc(&t->alloc,
                        sz_head + sz_extra + sz_sym + sz_heap + 2 * sz_ends + cap + sz_mapped, 16);
    if (!p) return KVC_ENOMEM;
    kvc__bpe_ws_t *ws = (kvc__bpe_ws_t *)p;
    memset(ws, 0, sizeof *ws);
    ws->extra = p + sz_head;
    ws->sym = (sym_t *)(p + sz_head + sz_extra);
    ws->heap = (cand_t *)((char *)ws->sym + sz_sym);
    ws->ends[0] = (uint32_t *)((char *)ws->heap + sz_heap);
    ws->ends[1] = (uint32_t *)((char *)ws->ends[0] + sz_ends);
    ws->norm = (char *)ws->ends[1] + sz_ends;
    ws->mapped = sz_mapped ? ws->norm + cap : NULL;
    ws->cap = cap;
    ws->md = pcre2_match_data_create(1, t->bpe->gctx);
    if (!ws->md) {
        kvc_free(&t->alloc, p);
        return KVC_ENOMEM;
    }
    *out = ws;
    return 0;
}

void *kvc__bpe_ws_extra(kvc__bpe_ws_t *ws)
{
    return ws->extra;
}

void kvc__bpe_ws_destroy(const kvc_tokenizer_t *t, kvc__bpe_ws_t *ws)
{
    if (!ws) return;
    pcre2_match_data_free(ws->md);
    kvc_free(&t->alloc, ws);
}

static void emit(kvc_token_t id, kvc_token_t *out, size_t cap, size_t *n_out)
{
    if (*n_out < cap) out[*n_out] = id;
    (*n_out)++;
}

/* Heap order: lower rank first, then the leftmost pair. */
static bool cand_before(const cand_t *a, const cand_t *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void heap_push(kvc__bpe_ws_t *ws, size_t *n_heap, cand_t c)
{
    KVC_ASSERT(*n_heap < 3 * ws->cap);
    size_t i = (*n_heap)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!cand_before(&c, &ws->heap[parent])) break;
        ws->heap[i] = ws->heap[parent];
        i = parent;
    }
    ws->heap[i] = c;
}

static cand_t heap_pop(kvc__bpe_ws_t *ws, size_t *n_heap)
{
    cand_t top = ws->heap[0], last = ws->heap[--*n_heap];
    size_t i = 0, n = *n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && cand_before(&ws->heap[c + 1], &ws->heap[c])) c++;
        if (!cand_before(&ws->heap[c], &last)) break;
        ws->heap[i] = ws->heap[c];
        i = c;
    }
    if (n) ws->heap[i] = last;
    return top;
}

static void try_pair(const kvc__bpe_t *b, kvc__bpe_ws_t *ws, size_t *n_heap, int32_t left,
                     int32_t right)
{
    if (left < 0 || right < 0) return;
    const sym_t *l = &ws->sym[left], *r = &ws->sym[right];
    if (l->id == KVC_TOKEN_NONE || r->id == KVC_TOKEN_NONE) return;
    const merge_t *m = merge_find(b, (uint32_t)l->id, (uint32_t)r->id);
    if (!m) return;
    heap_push(ws, n_heap,
              (cand_t){.rank = m->rank,
                       .left = left,
                       .right = right,
                       .size = l->n + r->n,
                       .merged = m->merged});
}

/* BPE over one word w[0..m) (valid UTF-8, m >= 1). */
static void bpe_word(const kvc_tokenizer_t *t, kvc__bpe_ws_t *ws, const unsigned char *w, size_t m,
                     kvc_token_t *out, size_t cap, size_t *n_out)
{
    const kvc__bpe_t *b = t->bpe;
    if (b->pre->ignore_merges) {
        size_t k = 0;
        for (size_t i = 0; i < m; i++) k += utf8_put(b->byte_cp[w[i]], ws->mapped + k);
        kvc_token_t id = kvc_tokenizer_find(t, ws->mapped, k);
        if (id != KVC_TOKEN_NONE) {
            emit(id, out, cap, n_out);
            return;
        }
    }
    for (size_t i = 0; i < m; i++)
        ws->sym[i] = (sym_t){.prev = (int32_t)i - 1,
                             .next = i + 1 < m ? (int32_t)i + 1 : -1,
                             .n = 1,
                             .id = b->byte_tok[w[i]]};
    size_t n_heap = 0;
    for (size_t i = 1; i < m; i++) try_pair(b, ws, &n_heap, (int32_t)i - 1, (int32_t)i);
    while (n_heap) {
        cand_t c = heap_pop(ws, &n_heap);
        sym_t *l = &ws->sym[c.left], *r = &ws->sym[c.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != c.size) continue; /* stale */
        l->n += r->n;
        l->id = (kvc_token_t)c.merged;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) ws->sym[r->next].prev = c.left;
        try_pair(b, ws, &n_heap, l->prev, c.left);
        try_pair(b, ws, &n_heap, c.left, l->next);
    }
    /* a byte whose character the vocabulary lacks is dropped, as llama.cpp and Hugging Face
     * do (Falcon's has no token for some control bytes, nor for bytes UTF-8 never uses) */
    for (int32_t i = 0; i >= 0; i = ws->sym[i].next)
        if (ws->sym[i].id != KVC_TOKEN_NONE) emit(ws->sym[i].id, out, cap, n_out);
}

/* Split every piece of ends[0..*n) of s with regex re, into the other ends array. */
static int split(kvc__bpe_ws_t *ws, const pcre2_code *re, const char *s, int src, size_t *n)
{
    const uint32_t *in = ws->ends[src];
    uint32_t *outv = ws->ends[!src];
    size_t n_out = 0;
    uint32_t start = 0;
    for (size_t f = 0; f < *n; f++) {
        uint32_t end = in[f], pos = start;
        const PCRE2_SPTR subj = (PCRE2_SPTR)(s + start);
        const PCRE2_SIZE len = end - start;
        while (pos < end) {
            int rc = pcre2_match(re, subj, len, pos - start, PCRE2_NO_UTF_CHECK, ws->md, NULL);
            if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
                rc = pcre2_match(re, subj, len, pos - start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                                 ws->md, NULL);
            if (rc == PCRE2_ERROR_NOMATCH) break;
            if (rc < 0) return KVC_ENOMEM; /* heap, match or depth limit */
            const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(ws->md);
            uint32_t ms = start + (uint32_t)ov[0], me = start + (uint32_t)ov[1];
            if (me == ms) { /* no pattern matches empty, but never loop on one */
                pos = ms + 1;
                while (pos < end && ((unsigned char)s[pos] & 0xC0) == 0x80) pos++;
                continue;
            }
            if (ms > pos) outv[n_out++] = ms; /* the text between matches is a piece too */
            outv[n_out++] = me;
            pos = me;
        }
        if (pos < end) outv[n_out++] = end;
        start = end;
    }
    *n = n_out;
    return 0;
}

int kvc__bpe_encode(const kvc_tokenizer_t *t, kvc__bpe_ws_t *ws, const char *s, size_t n,
                    kvc_token_t *out, size_t cap, size_t *n_out)
{
    const kvc__bpe_t *b = t->bpe;
    size_t m = norm_len((const unsigned char *)s, n, ws->norm);
    if (!m) return 0;
    KVC_ASSERT(m < ws->cap);
    size_t n_pieces = 1;
    int cur = 0;
    ws->ends[0][0] = (uint32_t)m;
    for (uint32_t i = 0; i < b->n_re; i++) {
        int rc = split(ws, b->re[i], ws->norm, cur, &n_pieces);
        if (rc) return rc;
        cur = !cur;
    }
    uint32_t start = 0;
    for (size_t i = 0; i < n_pieces; i++) {
        uint32_t end = ws->ends[cur][i];
        bpe_word(t, ws, (const unsigned char *)ws->norm + start, end - start, out, cap, n_out);
        start = end;
    }
    return 0;
}

int kvc__bpe_pieces(const kvc_tokenizer_t *t, const char *s, size_t n,
                    void (*fn)(const char *piece, size_t len, void *ctx), void *ctx)
{
    if (!t->bpe) return KVC_EINVAL;
    kvc__bpe_ws_t *ws;
    int rc = kvc__bpe_ws_create(t, s, n, 0, &ws);
    if (rc) return rc;
    const kvc__bpe_t *b = t->bpe;
    size_t m = norm_len((const unsigned char *)s, n, ws->norm), n_pieces = m ? 1 : 0;
    int cur = 0;
    ws->ends[0][0] = (uint32_t)m;
    for (uint32_t i = 0; i < b->n_re && n_pieces && !rc; i++, cur = !cur)
        rc = split(ws, b->re[i], ws->norm, cur, &n_pieces);
    uint32_t start = 0;
    for (size_t i = 0; i < n_pieces && !rc; i++) {
        fn(ws->norm + start, ws->ends[cur][i] - start, ctx);
        start = ws->ends[cur][i];
    }
    kvc__bpe_ws_destroy(t, ws);
    return rc;
}
