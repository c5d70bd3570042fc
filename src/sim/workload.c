/* workload.c - the simulator's workload: an array of requests in arrival
 * order with the token storage and names they point into.  This file owns
 * the object (allocation, token arena, name tables, the stable arrival
 * sort, accessors, the hand builder and the JSONL writer) and dispatches
 * loading to trace.c (Mooncake and kvcache JSONL) and synth.c (specs).
 *
 * Token storage is an arena of chunks that never move, so request pointers
 * stay valid; requests that share content share storage where the format
 * allows it (see trace.c and synth.c). */
#include "workload_int.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define TOK_CHUNK_TOKENS ((size_t)1 << 18)     /* 1 MiB chunks for small allocations */
#define FILLER_SEED      0x6b7663616368656fULL /* output filler of built workloads */
#define MAX_NAMES        65536u

/* ---- small helpers ----------------------------------------------------------- */
size_t kvc__sim_escape(char *out, size_t cap, const char *s, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    size_t at = 0;
    if (cap == 0) return 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        char e[5];
        size_t k = 0;
        if (c == '\n' || c == '\t' || c == '\r') {
            e[k++] = '\\';
            e[k++] = c == '\n' ? 'n' : c == '\t' ? 't' : 'r';
        } else if (c < 0x20 || c == 0x7f) {
            e[k++] = '\\';
            e[k++] = 'x';
            e[k++] = hex[c >> 4];
            e[k++] = hex[c & 15];
        } else {
            e[k++] = (char)c;
        }
        if (at + k >= cap) break; /* an escape is never cut in half */
        memcpy(out + at, e, k);
        at += k;
    }
    out[at] = '\0';
    return at;
}

void kvc__errf(char *err, size_t cap, const char *fmt, ...)
{
    if (!err || cap == 0) return;
    /* one line of printable text, whatever the message quoted (names, paths, specs) */
    char raw[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    kvc__sim_escape(err, cap, raw, KVC_MIN((size_t)n, sizeof raw - 1));
}

uint64_t kvc__mix64(uint64_t a, uint64_t b)
{
    uint64_t z = a + 0x9e3779b97f4a7c15ULL * (b + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    z += 0x9e3779b97f4a7c15ULL * (a ^ (b << 1));
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void kvc__fill_tokens(kvc_token_t *out, size_t n, uint64_t seed, uint32_t vocab)
{
    /* Two tokens per 64-bit draw, each by multiply-shift: the bias is at most
     * vocab / 2^32 (under 1e-5), irrelevant for token content, and a prefix of
     * a longer fill is the shorter fill, which Mooncake blocks rely on. */
    kvc_rng_t r;
    kvc_rng_seed(&r, seed);
    size_t i = 0;
    for (; i + 2 <= n; i += 2) {
        uint64_t x = kvc_rng_next(&r);
        out[i] = (kvc_token_t)(((x & 0xffffffffULL) * vocab) >> 32);
        out[i + 1] = (kvc_token_t)(((x >> 32) * vocab) >> 32);
    }
    if (i < n) {
        uint64_t x = kvc_rng_next(&r);
        out[i] = (kvc_token_t)(((x & 0xffffffffULL) * vocab) >> 32);
    }
}

int kvc__json_num(const cJSON *obj, const char *key, double lo, double hi, double *out)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!it) return KVC_ENOENT;
    if (!cJSON_IsNumber(it)) return KVC_EPARSE;
    double v = it->valuedouble;
    if (!isfinite(v) || v < lo || v > hi) return KVC_EPARSE;
    *out = v;
    return 0;
}

int kvc__json_int(const cJSON *obj, const char *key, double lo, double hi, uint64_t *out)
{
    double v;
    int rc = kvc__json_num(obj, key, lo, hi, &v);
    if (rc) return rc;
    if (v != floor(v)) return KVC_EPARSE;
    *out = (uint64_t)v;
    return 0;
}

/* ---- allocation ---------------------------------------------------------------- */
#define HDR 16

void *kvc__wl_alloc(kvc_workload_t *w, size_t bytes)
{
    if (bytes > SIZE_MAX - HDR) return NULL;
    unsigned char *p = kvc_alloc(&w->params.allocator, bytes + HDR, HDR);
    if (!p) return NULL;
    memcpy(p, &bytes, sizeof bytes);
    w->bytes += bytes + HDR;
    return p + HDR;
}

void kvc__wl_free(kvc_workload_t *w, void *p)
{
    if (!p) return;
    unsigned char *base = (unsigned char *)p - HDR;
    size_t bytes;
    memcpy(&bytes, base, sizeof bytes);
    w->bytes -= bytes + HDR;
    kvc_free(&w->params.allocator, base);
}

kvc_token_t *kvc__wl_tokens(kvc_workload_t *w, size_t n)
{
    if (n == 0) n = 1;
    kvc__tok_chunk_t *c = w->chunks;
    if (c && c->cap - c->used >= n) {
        kvc_token_t *t = c->data + c->used;
        c->used += n;
        w->stored_tokens += n;
        return t;
    }
    /* Big requests get a chunk of their own, placed behind the current one so
     * that its free space is still used. */
    size_t cap = n >= TOK_CHUNK_TOKENS / 4 ? n : TOK_CHUNK_TOKENS;
    if (cap > (SIZE_MAX - sizeof(kvc__tok_chunk_t)) / sizeof(kvc_token_t)) return NULL;
    kvc__tok_chunk_t *nc = kvc__wl_alloc(w, sizeof *nc + cap * sizeof(kvc_token_t));
    if (!nc) return NULL;
    nc->cap = cap;
    nc->used = n;
    if (c && cap == n) {
        nc->next = c->next;
        c->next = nc;
    } else {
        nc->next = c;
        w->chunks = nc;
    }
    w->stored_tokens += n;
    return nc->data;
}

int kvc__wl_reserve(kvc_workload_t *w, size_t need)
{
    if (need <= w->cap) return 0;
    if (need > KVC_SIM_MAX_REQUESTS) return KVC_ERANGE;
    size_t cap = w->cap ? w->cap : 64;
    while (cap < need) cap = cap > SIZE_MAX / 4 ? need : cap * 2;
    if (cap > KVC_SIM_MAX_REQUESTS) cap = KVC_SIM_MAX_REQUESTS;
    kvc_sim_request_t *req = kvc__wl_alloc(w, cap * sizeof *req);
    if (!req) return KVC_ENOMEM;
    kvc__blocklist_t *lists = NULL;
    if (w->params.tokens_on_demand && w->format == KVC_WORKLOAD_MOONCAKE) {
        lists = kvc__wl_alloc(w, cap * sizeof *lists);
        if (!lists) {
            kvc__wl_free(w, req);
            return KVC_ENOMEM;
        }
        if (w->n) memcpy(lists, w->lists, w->n * sizeof *lists);
        kvc__wl_free(w, w->lists);
        w->lists = lists;
    }
    if (w->n) memcpy(req, w->req, w->n * sizeof *req);
    kvc__wl_free(w, w->req);
    w->req = req;
    w->cap = cap;
    return 0;
}

/* ---- names --------------------------------------------------------------------- */
static uint32_t name_hash(const char *s, size_t len)
{
    return (uint32_t)kvc_hash128(s, len, 0x6e616d6573ULL).lo;
}

static int names_reindex(kvc_workload_t *w, kvc__names_t *t, uint32_t cap)
{
    uint32_t *idx = kvc__wl_alloc(w, cap * sizeof *idx);
    if (!idx) return KVC_ENOMEM;
    for (uint32_t i = 0; i < cap; i++) idx[i] = KVC_NONE;
    for (uint32_t i = 0; i < t->n; i++) {
        uint32_t h = name_hash(t->names[i], strlen(t->names[i])) & (cap - 1);
        while (idx[h] != KVC_NONE) h = (h + 1) & (cap - 1);
        idx[h] = i;
    }
    kvc__wl_free(w, t->index);
    t->index = idx;
    t->index_cap = cap;
    return 0;
}

int kvc__names_intern(kvc_workload_t *w, kvc__names_t *t, const char *name, size_t len,
                      uint32_t *index)
{
    if (t->index_cap) {
        uint32_t h = name_hash(name, len) & (t->index_cap - 1);
        for (; t->index[h] != KVC_NONE; h = (h + 1) & (t->index_cap - 1)) {
            const char *s = t->names[t->index[h]];
            if (strlen(s) == len && memcmp(s, name, len) == 0) {
                *index = t->index[h];
                return 0;
            }
        }
    }
    if (t->closed) return KVC_ENOENT;
    if (t->n >= MAX_NAMES) return KVC_ERANGE;
    if (t->n == t->cap) {
        uint32_t cap = t->cap ? t->cap * 2 : 8;
        char **names = kvc__wl_alloc(w, cap * sizeof *names);
        if (!names) return KVC_ENOMEM;
        if (t->n) memcpy(names, t->names, t->n * sizeof *names);
        kvc__wl_free(w, t->names);
        t->names = names;
        t->cap = cap;
    }
    char *copy = kvc__wl_alloc(w, len + 1);
    if (!copy) return KVC_ENOMEM;
    memcpy(copy, name, len);
    copy[len] = '\0';
    if ((t->n + 1) * 2 > t->index_cap) {
        /* reindex before publishing the name, so failure leaves the table as it was */
        t->names[t->n] = copy;
        t->n++;
        int rc = names_reindex(w, t, t->index_cap ? t->index_cap * 2 : 16);
        if (rc) {
            t->n--;
            kvc__wl_free(w, copy);
            return rc;
        }
    } else {
        uint32_t h = name_hash(copy, len) & (t->index_cap - 1);
        while (t->index[h] != KVC_NONE) h = (h + 1) & (t->index_cap - 1);
        t->index[h] = t->n;
        t->names[t->n++] = copy;
    }
    *index = t->n - 1;
    return 0;
}

int kvc__wl_default_names(kvc_workload_t *w)
{
    uint32_t idx;
    int rc = 0;
    if (w->tenants.n == 0) rc = kvc__names_intern(w, &w->tenants, "default", 7, &idx);
    if (!rc && w->classes.n == 0) rc = kvc__names_intern(w, &w->classes, "default", 7, &idx);
    return rc;
}

static void names_free(kvc_workload_t *w, kvc__names_t *t)
{
    for (uint32_t i = 0; i < t->n; i++) kvc__wl_free(w, t->names[i]);
    kvc__wl_free(w, t->names);
    kvc__wl_free(w, t->index);
    memset(t, 0, sizeof *t);
}

/* ---- lifecycle ------------------------------------------------------------------ */
kvc_workload_params_t kvc_workload_params_default(void)
{
    return (kvc_workload_params_t){
        .seed = 1,
        .max_requests = 0,
        .time_scale = 1.0,
        .vocab = 32000,
        .block_tokens = 512,
        .max_tokens = KVC_SIM_MAX_TOKENS,
        .tokens_on_demand = false,
        .format = KVC_WORKLOAD_AUTO,
    };
}

int kvc__wl_params(const kvc_workload_params_t *in, kvc_workload_params_t *out, char *err,
                   size_t err_cap)
{
    *out = in ? *in : kvc_workload_params_default();
    const char *bad = NULL;
    if (!(out->time_scale > 0) || !isfinite(out->time_scale))
        bad = "time_scale must be > 0";
    else if (out->vocab < 2 || out->vocab > (uint32_t)INT32_MAX)
        bad = "vocab must be in [2, 2^31)";
    else if (out->block_tokens < 1 || out->block_tokens > (1u << 20))
        bad = "block_tokens must be in [1, 2^20]";
    else if (out->max_tokens < 1 || out->max_tokens > KVC_SIM_MAX_TOKENS)
        bad = "max_tokens must be in [1, KVC_SIM_MAX_TOKENS]";
    else if ((unsigned)out->format > KVC_WORKLOAD_SPEC)
        bad = "format must be a loadable format";
    if (bad) {
        kvc__errf(err, err_cap, "workload parameters: %s", bad);
        return KVC_EINVAL;
    }
    return 0;
}

kvc_workload_t *kvc__wl_new(const kvc_workload_params_t *params, kvc_workload_format_t format)
{
    kvc_workload_t *w = kvc_alloc(&params->allocator, sizeof *w, 0);
    if (!w) return NULL;
    memset(w, 0, sizeof *w);
    w->params = *params;
    w->format = format;
    w->bytes = sizeof *w;
    return w;
}

void kvc_workload_destroy(kvc_workload_t *w)
{
    if (!w) return;
    while (w->chunks) {
        kvc__tok_chunk_t *next = w->chunks->next;
        kvc__wl_free(w, w->chunks);
        w->chunks = next;
    }
    kvc__wl_free(w, w->req);
    kvc__wl_free(w, w->lists);
    kvc__wl_free(w, w->blocks);
    kvc__wl_free(w, w->store);
    names_free(w, &w->tenants);
    names_free(w, &w->classes);
    kvc_allocator_t a = w->params.allocator;
    kvc_free(&a, w);
}

/* ---- the stable arrival sort ------------------------------------------------------- */
int kvc__arrival_perm(kvc_workload_t *w, const kvc_sim_request_t *req, size_t n, uint32_t **perm,
                      size_t *n_moved)
{
    *perm = NULL;
    double hi = -INFINITY;
    size_t moved = 0;
    for (size_t i = 0; i < n; i++) {
        if (req[i].arrival_s < hi)
            moved++;
        else
            hi = req[i].arrival_s;
    }
    if (n_moved) *n_moved = moved;
    if (moved == 0) return 0;

    /* Bottom-up merge sort of indices: stable, O(n log n), no recursion. */
    uint32_t *a = kvc__wl_alloc(w, n * sizeof *a);
    uint32_t *b = kvc__wl_alloc(w, n * sizeof *b);
    if (!a || !b) {
        kvc__wl_free(w, a);
        kvc__wl_free(w, b);
        return KVC_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) a[i] = (uint32_t)i;
    for (size_t width = 1; width < n; width *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * width) {
            size_t mid = KVC_MIN(lo + width, n), hi2 = KVC_MIN(lo + 2 * width, n);
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi2)
                b[k++] = req[a[j]].arrival_s < req[a[i]].arrival_s ? a[j++] : a[i++];
            while (i < mid) b[k++] = a[i++];
            while (j < hi2) b[k++] = a[j++];
        }
        uint32_t *t = a;
        a = b;
        b = t;
    }
    kvc__wl_free(w, b);
    *perm = a;
    return 0;
}

int kvc__wl_sort(kvc_workload_t *w)
{
    uint32_t *perm;
    int rc = kvc__arrival_perm(w, w->req, w->n, &perm, &w->n_reordered);
    if (rc || !perm) return rc;
    kvc_sim_request_t *req = kvc__wl_alloc(w, w->cap * sizeof *req);
    kvc__blocklist_t *lists = w->lists ? kvc__wl_alloc(w, w->cap * sizeof *lists) : NULL;
    if (!req || (w->lists && !lists)) {
        kvc__wl_free(w, req);
        kvc__wl_free(w, lists);
        kvc__wl_free(w, perm);
        return KVC_ENOMEM;
    }
    for (size_t i = 0; i < w->n; i++) {
        req[i] = w->req[perm[i]];
        if (lists) lists[i] = w->lists[perm[i]];
    }
    kvc__wl_free(w, w->req);
    kvc__wl_free(w, w->lists);
    kvc__wl_free(w, perm);
    w->req = req;
    w->lists = lists;
    return 0;
}

/* ---- accessors --------------------------------------------------------------------- */
size_t kvc_workload_size(const kvc_workload_t *w)
{
    return w->n;
}

const kvc_sim_request_t *kvc_workload_request(const kvc_workload_t *w, size_t i)
{
    return i < w->n ? &w->req[i] : NULL;
}

int kvc_workload_prompt(const kvc_workload_t *w, size_t i, kvc_token_t *buf, size_t cap)
{
    if (i >= w->n) return KVC_EINVAL;
    const kvc_sim_request_t *r = &w->req[i];
    if (cap < r->n_prompt) return KVC_ERANGE;
    if (r->tokens) {
        memcpy(buf, r->tokens, (size_t)r->n_prompt * sizeof *buf);
        return 0;
    }
    const kvc__blocklist_t *l = &w->lists[i];
    size_t bt = w->params.block_tokens, left = r->n_prompt;
    for (uint32_t j = 0; j < l->n; j++) {
        size_t n = KVC_MIN(bt, left);
        memcpy(buf + (size_t)j * bt, w->store + (size_t)w->blocks[l->first + j] * bt,
               n * sizeof *buf);
        left -= n;
    }
    return 0;
}

uint32_t kvc_workload_n_tenants(const kvc_workload_t *w)
{
    return w->tenants.n;
}

const char *kvc_workload_tenant_name(const kvc_workload_t *w, uint32_t t)
{
    return t < w->tenants.n ? w->tenants.names[t] : NULL;
}

uint32_t kvc_workload_n_classes(const kvc_workload_t *w)
{
    return w->classes.n;
}

const char *kvc_workload_class_name(const kvc_workload_t *w, uint32_t c)
{
    return c < w->classes.n ? w->classes.names[c] : NULL;
}

const char *const *kvc_workload_tenant_names(const kvc_workload_t *w)
{
    return (const char *const *)w->tenants.names;
}

const char *const *kvc_workload_class_names(const kvc_workload_t *w)
{
    return (const char *const *)w->classes.names;
}

kvc_workload_format_t kvc_workload_format(const kvc_workload_t *w)
{
    return w->format;
}

const char *kvc_workload_format_name(kvc_workload_format_t f)
{
    switch (f) {
    case KVC_WORKLOAD_AUTO:
        return "auto";
    case KVC_WORKLOAD_MOONCAKE:
        return "mooncake";
    case KVC_WORKLOAD_JSONL:
        return "jsonl";
    case KVC_WORKLOAD_SPEC:
        return "spec";
    case KVC_WORKLOAD_BUILT:
        return "built";
    }
    return "unknown";
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

int kvc_workload_stats(const kvc_workload_t *w, kvc_workload_stats_t *out)
{
    memset(out, 0, sizeof *out);
    size_t n_conv_turns = 0;
    for (size_t i = 0; i < w->n; i++)
        if (w->req[i].conversation) n_conv_turns++;
    size_t n_conv = 0;
    if (n_conv_turns) {
        uint64_t *ids = kvc_alloc(&w->params.allocator, n_conv_turns * sizeof *ids, 0);
        if (!ids) return KVC_ENOMEM;
        size_t k = 0;
        for (size_t i = 0; i < w->n; i++)
            if (w->req[i].conversation) ids[k++] = w->req[i].conversation;
        qsort(ids, k, sizeof *ids, cmp_u64);
        for (size_t i = 0; i < k; i++)
            if (i == 0 || ids[i] != ids[i - 1]) n_conv++;
        kvc_free(&w->params.allocator, ids);
    }
    out->n_requests = w->n;
    out->n_conversations = n_conv;
    for (size_t i = 0; i < w->n; i++) {
        out->prompt_tokens += w->req[i].n_prompt;
        out->output_tokens += w->req[i].n_output;
    }
    out->stored_tokens = w->stored_tokens;
    out->unique_blocks = w->unique_blocks;
    out->n_reordered = w->n_reordered;
    out->bytes = w->bytes;
    out->duration_s = w->n ? w->req[w->n - 1].arrival_s : 0;
    return 0;
}

/* ---- writing JSONL ------------------------------------------------------------------ */
void kvc__json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"':
            fputs("\\\"", f);
            break;
        case '\\':
            fputs("\\\\", f);
            break;
        case '\n':
            fputs("\\n", f);
            break;
        case '\r':
            fputs("\\r", f);
            break;
        case '\t':
            fputs("\\t", f);
            break;
        default:
            if (*p < 0x20)
                fprintf(f, "\\u%04x", *p);
            else
                fputc(*p, f);
        }
    }
    fputc('"', f);
}

/* Tokens as a JSON array, formatted by hand: fprintf per token would make
 * writing a million-request workload take minutes. */
static void write_tokens(FILE *f, const kvc_token_t *t, size_t n)
{
    char buf[4096];
    size_t at = 0;
    buf[at++] = '[';
    for (size_t i = 0; i < n; i++) {
        if (at > sizeof buf - 16) {
            fwrite(buf, 1, at, f);
            at = 0;
        }
        if (i) buf[at++] = ',';
        char tmp[12];
        int k = 0;
        uint32_t v = (uint32_t)t[i];
        do {
            tmp[k++] = (char)('0' + v % 10);
            v /= 10;
        } while (v);
        while (k) buf[at++] = tmp[--k];
    }
    buf[at++] = ']';
    fwrite(buf, 1, at, f);
}

static void write_names(FILE *f, const kvc__names_t *t)
{
    fputc('[', f);
    for (uint32_t i = 0; i < t->n; i++) {
        if (i) fputc(',', f);
        kvc__json_string(f, t->names[i]);
    }
    fputc(']', f);
}

int kvc_workload_write_jsonl(const kvc_workload_t *w, FILE *f)
{
    uint32_t max_prompt = 0;
    for (size_t i = 0; i < w->n; i++) max_prompt = KVC_MAX(max_prompt, w->req[i].n_prompt);
    kvc_token_t *scratch = NULL;
    if (w->lists) {
        scratch = kvc_alloc(&w->params.allocator, (size_t)max_prompt * sizeof *scratch, 0);
        if (!scratch) return KVC_ENOMEM;
    }
    fputs("{\"kvcache_workload\":1,\"tenants\":", f);
    write_names(f, &w->tenants);
    fputs(",\"classes\":", f);
    write_names(f, &w->classes);
    fputs("}\n", f);
    for (size_t i = 0; i < w->n; i++) {
        const kvc_sim_request_t *r = &w->req[i];
        fprintf(f, "{\"arrival_s\":%.17g,\"tenant\":", r->arrival_s);
        kvc__json_string(f, w->tenants.names[r->tenant]);
        fputs(",\"class\":", f);
        kvc__json_string(f, w->classes.names[r->priority]);
        fprintf(f,
                ",\"conversation\":%llu,\"turn\":%u,\"think_s\":%.17g,\"output\":%u,"
                "\"max_output\":%u,\"tokens\":",
                (unsigned long long)r->conversation, r->turn, r->think_s, r->n_output,
                r->max_output);
        const kvc_token_t *t = r->tokens;
        if (!t) {
            kvc_workload_prompt(w, i, scratch, max_prompt);
            t = scratch;
        }
        write_tokens(f, t, r->n_prompt);
        fputs(",\"output_tokens\":", f);
        write_tokens(f, r->output_tokens, r->n_output);
        fputs("}\n", f);
    }
    kvc_free(&w->params.allocator, scratch);
    return ferror(f) ? KVC_EIO : 0;
}

/* ---- building by hand ----------------------------------------------------------------- */
int kvc_workload_create(const kvc_workload_params_t *params, kvc_workload_t **out)
{
    if (!out) return KVC_EINVAL;
    *out = NULL;
    kvc_workload_params_t p;
    if (kvc__wl_params(params, &p, NULL, 0)) return KVC_EINVAL;
    p.tokens_on_demand = false;
    kvc_workload_t *w = kvc__wl_new(&p, KVC_WORKLOAD_BUILT);
    if (!w) return KVC_ENOMEM;
    *out = w;
    return 0;
}

static int add_name(kvc_workload_t *w, kvc__names_t *t, const char *name, uint32_t *index)
{
    if (!name || !*name || !index) return KVC_EINVAL;
    return kvc__names_intern(w, t, name, strlen(name), index);
}

int kvc_workload_add_tenant(kvc_workload_t *w, const char *name, uint32_t *index)
{
    return w ? add_name(w, &w->tenants, name, index) : KVC_EINVAL;
}

int kvc_workload_add_class(kvc_workload_t *w, const char *name, uint32_t *index)
{
    return w ? add_name(w, &w->classes, name, index) : KVC_EINVAL;
}

int kvc_workload_add(kvc_workload_t *w, const kvc_sim_request_t *req)
{
    if (!w || !req) return KVC_EINVAL;
    uint32_t max_output = req->max_output ? req->max_output : req->n_output;
    if (!req->tokens || req->n_prompt == 0 || req->n_output == 0 ||
        req->n_prompt > w->params.max_tokens || req->n_output > w->params.max_tokens ||
        max_output < req->n_output || !(req->arrival_s >= 0) ||
        !(req->arrival_s <= KVC_SIM_MAX_TIME_S) || !(req->think_s >= 0) ||
        !(req->think_s <= KVC_SIM_MAX_TIME_S) ||
        (w->n && req->arrival_s < w->req[w->n - 1].arrival_s))
        return KVC_EINVAL;
    if ((req->tenant >= w->tenants.n && !(req->tenant == 0 && w->tenants.n == 0)) ||
        (req->priority >= w->classes.n && !(req->priority == 0 && w->classes.n == 0)))
        return KVC_EINVAL;
    int rc = kvc__wl_reserve(w, w->n + 1);
    if (rc) return rc == KVC_ERANGE ? KVC_EINVAL : rc;
    size_t held = w->stored_tokens;
    kvc_token_t *t = kvc__wl_tokens(w, (size_t)req->n_prompt + req->n_output);
    if (!t) return KVC_ENOMEM;
    if (kvc__wl_default_names(w)) {
        w->stored_tokens = held; /* the arena keeps the space; nothing points at it */
        return KVC_ENOMEM;
    }
    memcpy(t, req->tokens, (size_t)req->n_prompt * sizeof *t);
    if (req->output_tokens)
        memcpy(t + req->n_prompt, req->output_tokens, (size_t)req->n_output * sizeof *t);
    else
        kvc__fill_tokens(t + req->n_prompt, req->n_output, kvc__mix64(FILLER_SEED, w->n),
                         w->params.vocab);
    kvc_sim_request_t *r = &w->req[w->n++];
    *r = *req;
    r->tokens = t;
    r->output_tokens = t + req->n_prompt;
    r->max_output = max_output;
    return 0;
}

/* ---- loading ----------------------------------------------------------------------------- */
static const char *skip_ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')) p++;
    return p;
}

/* Line and column (1-based) of position `at` in data. */
static void line_col(const char *data, const char *at, size_t *line, size_t *col)
{
    *line = 1;
    *col = 1;
    for (const char *p = data; p < at; p++) {
        if (*p == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

/* What a buffer holds, for format AUTO: the first record decides. */
static int detect(const char *data, size_t len, const char *name, kvc_workload_format_t *fmt,
                  char *err, size_t err_cap)
{
    const char *end = data + len, *p = skip_ws(data, end);
    if (p == end) {
        kvc__errf(err, err_cap, "%s: no requests (empty input)", name);
        return KVC_EPARSE;
    }
    size_t lineno, col;
    line_col(data, p, &lineno, &col);
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    if (!eol) eol = end;
    const char *pend = NULL;
    cJSON *first = cJSON_ParseWithLengthOpts(p, (size_t)(eol - p), &pend, false);
    if (first && skip_ws(pend, eol) == eol) {
        int rc = 0;
        if (!cJSON_IsObject(first)) {
            kvc__errf(err, err_cap, "%s:%zu: expected a JSON object", name, lineno);
            rc = KVC_EPARSE;
        } else if (cJSON_HasObjectItem(first, "streams")) {
            *fmt = KVC_WORKLOAD_SPEC;
        } else if (cJSON_HasObjectItem(first, "hash_ids")) {
            *fmt = KVC_WORKLOAD_MOONCAKE;
        } else if (cJSON_HasObjectItem(first, "tokens") ||
                   cJSON_HasObjectItem(first, "kvcache_workload")) {
            *fmt = KVC_WORKLOAD_JSONL;
        } else {
            kvc__errf(err, err_cap,
                      "%s:%zu: unknown record: neither a Mooncake record (no 'hash_ids'), a "
                      "kvcache record (no 'tokens') nor a spec (no 'streams')",
                      name, lineno);
            rc = KVC_EPARSE;
        }
        cJSON_Delete(first);
        return rc;
    }
    cJSON_Delete(first);
    /* Not one JSON value on the first line: a multi-line document (a spec). */
    if (*p == '{') {
        *fmt = KVC_WORKLOAD_SPEC;
        return 0;
    }
    kvc__errf(err, err_cap, "%s:%zu: malformed JSON", name, lineno);
    return KVC_EPARSE;
}

static int load_spec_buffer(kvc_workload_t *w, const char *data, size_t len, const char *name,
                            char *err, size_t err_cap)
{
    const char *end = NULL;
    cJSON *spec = cJSON_ParseWithLengthOpts(data, len, &end, false);
    if (!spec || skip_ws(end, data + len) != data + len) {
        const char *at = spec ? end : end ? end : data;
        size_t line, col;
        line_col(data, at, &line, &col);
        kvc__errf(err, err_cap, "%s:%zu:%zu: %s", name, line, col,
                  spec ? "unexpected text after the spec object" : "malformed JSON");
        cJSON_Delete(spec);
        return KVC_EPARSE;
    }
    int rc = KVC_EPARSE;
    if (!cJSON_IsObject(spec))
        kvc__errf(err, err_cap, "%s: a spec must be a JSON object", name);
    else
        rc = kvc__load_spec(w, spec, name, err, err_cap);
    cJSON_Delete(spec);
    return rc;
}

static int finish_load(kvc_workload_t *w, const char *name, char *err, size_t err_cap)
{
    if (w->n == 0) {
        kvc__errf(err, err_cap, "%s: no requests", name);
        return KVC_EPARSE;
    }
    int rc = kvc__wl_default_names(w);
    if (!rc) rc = kvc__wl_sort(w);
    if (rc) kvc__errf(err, err_cap, "%s: %s", name, kvc_strerror(rc));
    return rc;
}

int kvc_workload_load_buffer(const char *data, size_t len, const char *name,
                             const kvc_workload_params_t *params, kvc_workload_t **out, char *err,
                             size_t err_cap)
{
    if (err && err_cap) err[0] = '\0';
    if (!out) {
        kvc__errf(err, err_cap, "workload: no place for the result");
        return KVC_EINVAL;
    }
    *out = NULL;
    if (!name) name = "<buffer>";
    kvc_workload_params_t p;
    int rc = kvc__wl_params(params, &p, err, err_cap);
    if (rc) return rc;
    if (!data && len) {
        kvc__errf(err, err_cap, "%s: no data", name);
        return KVC_EINVAL;
    }
    kvc_workload_format_t fmt = p.format;
    if (fmt == KVC_WORKLOAD_AUTO) {
        rc = detect(data ? data : "", len, name, &fmt, err, err_cap);
        if (rc) return rc;
    }
    kvc_workload_t *w = kvc__wl_new(&p, fmt);
    if (!w) {
        kvc__errf(err, err_cap, "%s: %s", name, kvc_strerror(KVC_ENOMEM));
        return KVC_ENOMEM;
    }
    switch (fmt) {
    case KVC_WORKLOAD_MOONCAKE:
        rc = kvc__load_mooncake(w, data, len, name, err, err_cap);
        break;
    case KVC_WORKLOAD_JSONL:
        rc = kvc__load_jsonl(w, data, len, name, err, err_cap);
        break;
    default:
        rc = load_spec_buffer(w, data ? data : "", len, name, err, err_cap);
        break;
    }
    if (!rc) rc = finish_load(w, name, err, err_cap);
    if (rc) {
        kvc_workload_destroy(w);
        return rc;
    }
    *out = w;
    return 0;
}

/* The whole file, through the caller's allocator (files of traces are read
 * once, and parsing from memory keeps one code path). */
static int read_file(FILE *f, const kvc_allocator_t *a, char **data, size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = kvc_alloc(a, cap, 0);
    if (!buf) return KVC_ENOMEM;
    for (;;) {
        if (n == cap) {
            if (cap > SIZE_MAX / 2) {
                kvc_free(a, buf);
                return KVC_ENOMEM;
            }
            char *nb = kvc_alloc(a, cap * 2, 0);
            if (!nb) {
                kvc_free(a, buf);
                return KVC_ENOMEM;
            }
            memcpy(nb, buf, n);
            kvc_free(a, buf);
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    if (ferror(f)) {
        kvc_free(a, buf);
        return KVC_EIO;
    }
    *data = buf;
    *len = n;
    return 0;
}

/* "word:..." with a key=value after the colon (or nothing): what an inline spec looks like,
 * whatever its process. */
static bool looks_like_spec(const char *s)
{
    const char *colon = strchr(s, ':');
    if (!colon || colon == s) return false;
    for (const char *p = s; p < colon; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_' || *p == '-' ||
              (*p >= '0' && *p <= '9')))
            return false;
    return colon[1] == '\0' || strchr(colon, '=') != NULL;
}

int kvc_workload_load(const char *path_or_spec, const kvc_workload_params_t *params,
                      kvc_workload_t **out, char *err, size_t err_cap)
{
    if (err && err_cap) err[0] = '\0';
    if (!out) {
        kvc__errf(err, err_cap, "workload: no place for the result");
        return KVC_EINVAL;
    }
    *out = NULL;
    kvc_workload_params_t p;
    int rc = kvc__wl_params(params, &p, err, err_cap);
    if (rc) return rc;
    if (!path_or_spec || !*path_or_spec) {
        kvc__errf(err, err_cap, "workload: no file or spec given");
        return KVC_EINVAL;
    }
    FILE *f = fopen(path_or_spec, "rb");
    if (!f) {
        int e = errno;
        /* no such file (a spec longer than a file name can be is no file either) */
        bool no_file = e == ENOENT || e == ENAMETOOLONG || e == ENOTDIR;
        bool spec_ok = p.format == KVC_WORKLOAD_AUTO || p.format == KVC_WORKLOAD_SPEC;
        if (no_file && spec_ok && !kvc__is_inline_spec(path_or_spec) &&
            looks_like_spec(path_or_spec)) {
            const char *colon = strchr(path_or_spec, ':');
            kvc__errf(err, err_cap,
                      "%s: no such file, and '%.*s' is not an arrival process of an inline spec "
                      "(poisson, burst, fixed or uniform)",
                      path_or_spec, (int)(colon - path_or_spec), path_or_spec);
            return KVC_EPARSE;
        }
        if (no_file && spec_ok && kvc__is_inline_spec(path_or_spec)) {
            cJSON *spec = kvc__inline_spec(path_or_spec, &p.allocator, &rc, err, err_cap);
            if (!spec) return rc;
            kvc_workload_t *w = kvc__wl_new(&p, KVC_WORKLOAD_SPEC);
            if (!w) {
                cJSON_Delete(spec);
                kvc__errf(err, err_cap, "spec '%s': %s", path_or_spec, kvc_strerror(KVC_ENOMEM));
                return KVC_ENOMEM;
            }
            rc = kvc__load_spec(w, spec, path_or_spec, err, err_cap);
            cJSON_Delete(spec);
            if (!rc) rc = finish_load(w, path_or_spec, err, err_cap);
            if (rc) {
                kvc_workload_destroy(w);
                return rc;
            }
            *out = w;
            return 0;
        }
        kvc__errf(err, err_cap, "%s: cannot open: %s", path_or_spec, strerror(e));
        return KVC_EIO;
    }
    char *data = NULL;
    size_t len = 0;
    rc = read_file(f, &p.allocator, &data, &len);
    int e = errno;
    fclose(f);
    if (rc) {
        kvc__errf(err, err_cap, "%s: cannot read: %s", path_or_spec,
                  rc == KVC_EIO ? strerror(e) : kvc_strerror(rc));
        return rc;
    }
    rc = kvc_workload_load_buffer(data, len, path_or_spec, &p, out, err, err_cap);
    kvc_free(&p.allocator, data);
    return rc;
}
