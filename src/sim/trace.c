/* trace.c - trace loaders of the sim layer: Mooncake JSONL and the kvcache
 * JSONL.  Both read one JSON object a line (blank lines skipped, unknown
 * keys ignored) and report a malformed record as "file:line: what".
 *
 * Mooncake records name their prompt by hash ids of block_tokens-token
 * blocks.  Each id materialises as tokens drawn from a stream seeded by the
 * id alone, so equal ids give equal tokens wherever they appear and the
 * prefix cache sees exactly the trace's sharing.  Prompts are stored once
 * per "owner": a request whose id path is a prefix of a longer request's
 * path points into that request's tokens (a trie over the id paths finds
 * them), so multi-turn traces store each conversation about once.  With
 * tokens_on_demand only one copy of each distinct block is kept and
 * kvc_workload_prompt assembles prompts. */
#include "workload_int.h"

#include <math.h>
#include <string.h>

#define MOONCAKE_SEED 0x6d6f6f6e63616b65ULL /* "mooncake": block content */
#define OUTPUT_SEED   0x6f75747075747321ULL /* trace output filler */
#define MAX_HASH_ID   9007199254740992.0    /* 2^53: exact in a JSON number */

/* ---- lines ---------------------------------------------------------------------- */
typedef struct {
    const char *p, *end;
    size_t lineno;
} lines_t;

/* The next non-blank line (without its newline) and its 1-based number. */
static bool next_line(lines_t *L, const char **s, size_t *n, size_t *lineno)
{
    while (L->p < L->end) {
        const char *start = L->p;
        const char *eol = memchr(start, '\n', (size_t)(L->end - start));
        if (!eol) eol = L->end;
        L->p = eol < L->end ? eol + 1 : L->end;
        L->lineno++;
        const char *q = start;
        while (q < eol && (*q == ' ' || *q == '\t' || *q == '\r')) q++;
        if (q == eol) continue;
        *s = start;
        *n = (size_t)(eol - start);
        *lineno = L->lineno;
        return true;
    }
    return false;
}

/* Parse one line as a JSON object; NULL (and a message) if it is not one. */
static cJSON *parse_object(const char *s, size_t n, const char *name, size_t lineno, char *err,
                           size_t err_cap, int *rc)
{
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithLengthOpts(s, n, &end, false);
    if (o) {
        const char *q = end;
        while (q < s + n && (*q == ' ' || *q == '\t' || *q == '\r')) q++;
        if (q != s + n) {
            kvc__errf(err, err_cap, "%s:%zu: unexpected text after the JSON object (column %zu)",
                      name, lineno, (size_t)(end - s) + 1);
            cJSON_Delete(o);
            *rc = KVC_EPARSE;
            return NULL;
        }
        if (!cJSON_IsObject(o)) {
            kvc__errf(err, err_cap, "%s:%zu: expected a JSON object", name, lineno);
            cJSON_Delete(o);
            *rc = KVC_EPARSE;
            return NULL;
        }
        return o;
    }
    size_t col = end && end >= s && end <= s + n ? (size_t)(end - s) + 1 : 1;
    kvc__errf(err, err_cap, "%s:%zu: malformed JSON (column %zu)", name, lineno, col);
    *rc = KVC_EPARSE;
    return NULL;
}

/* A trace time (timestamp or think time) scaled to seconds of the run: it must lie within
 * the simulator's horizon.  0, or KVC_EPARSE with the line, the field and the numbers. */
static int check_time(double t_s, double raw, const char *unit, const kvc_workload_params_t *p,
                      const char *name, size_t lineno, const char *key, char *err, size_t err_cap)
{
    if (t_s <= KVC_SIM_MAX_TIME_S) return 0;
    char scaled[64] = " is";
    if (p->time_scale != 1)
        snprintf(scaled, sizeof scaled, " at time scale %.6g is %.6g s,", p->time_scale, t_s);
    kvc__errf(err, err_cap, "%s:%zu: field '%s': %.6g %s%s past the simulator's horizon of %s",
              name, lineno, key, raw, unit, scaled, KVC__SIM_HORIZON_TEXT);
    return KVC_EPARSE;
}

/* Messages for the json helpers' codes. */
static int field_error(int rc, const char *name, size_t lineno, const char *key, const char *want,
                       char *err, size_t err_cap)
{
    kvc__errf(err, err_cap, "%s:%zu: field '%s': %s%s", name, lineno, key,
              rc == KVC_ENOENT ? "missing, expected " : "expected ", want);
    return KVC_EPARSE;
}

/* A trace longer than a workload can hold. */
static int too_many(const char *name, size_t lineno, char *err, size_t err_cap)
{
    kvc__errf(err, err_cap, "%s:%zu: more requests (or hash ids) than a workload can hold", name,
              lineno);
    return KVC_EPARSE;
}

/* A growing array through the workload's allocator. */
static int grow(kvc_workload_t *w, void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap : 1024;
    while (nc < need) {
        if (nc > SIZE_MAX / 2 / elem) return KVC_ENOMEM;
        nc *= 2;
    }
    void *na = kvc__wl_alloc(w, nc * elem);
    if (!na) return KVC_ENOMEM;
    if (*cap) memcpy(na, *arr, *cap * elem);
    kvc__wl_free(w, *arr);
    *arr = na;
    *cap = nc;
    return 0;
}

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n) c *= 2;
    return c;
}

/* ---- a map from two 64-bit words to a 32-bit index (open addressing) ---------------- */
typedef struct {
    uint64_t a, b;
    uint32_t val; /* KVC_NONE = empty */
} slot_t;

typedef struct {
    slot_t *slots;
    size_t cap; /* a power of two, more than twice the entries it will hold */
} map_t;

static int map_init(kvc_workload_t *w, map_t *m, size_t max_entries)
{
    m->cap = pow2_at_least(max_entries * 2 + 1);
    m->slots = kvc__wl_alloc(w, m->cap * sizeof *m->slots);
    if (!m->slots) return KVC_ENOMEM;
    for (size_t i = 0; i < m->cap; i++) m->slots[i].val = KVC_NONE;
    return 0;
}

/* The value for (a, b), inserting `fresh` if absent (*added set). */
static uint32_t map_get_or_add(map_t *m, uint64_t a, uint64_t b, uint32_t fresh, bool *added)
{
    size_t h = (size_t)kvc__mix64(a, b) & (m->cap - 1);
    for (;; h = (h + 1) & (m->cap - 1)) {
        slot_t *s = &m->slots[h];
        if (s->val == KVC_NONE) {
            s->a = a;
            s->b = b;
            s->val = fresh;
            *added = true;
            return fresh;
        }
        if (s->a == a && s->b == b) {
            *added = false;
            return s->val;
        }
    }
}

/* ---- Mooncake -------------------------------------------------------------------- */
typedef struct {
    uint64_t *ids; /* every record's hash ids, in order */
    size_t n_ids, cap_ids;
    kvc__blocklist_t *spans; /* per request: its ids */
    size_t cap_spans;
} mc_t;

static int mooncake_line(kvc_workload_t *w, mc_t *mc, const cJSON *o, const char *name,
                         size_t lineno, char *err, size_t err_cap)
{
    const kvc_workload_params_t *p = &w->params;
    double ts;
    uint64_t in, out;
    int rc = kvc__json_num(o, "timestamp", 0, 1e300, &ts);
    if (rc) return field_error(rc, name, lineno, "timestamp", "a number of ms >= 0", err, err_cap);
    if ((rc = check_time(ts / 1000.0 * p->time_scale, ts, "ms", p, name, lineno, "timestamp", err,
                         err_cap)))
        return rc;
    rc = kvc__json_int(o, "input_length", 1, p->max_tokens, &in);
    if (rc) {
        kvc__errf(err, err_cap, "%s:%zu: field 'input_length': %s an integer in [1, %u]", name,
                  lineno, rc == KVC_ENOENT ? "missing, expected" : "expected", p->max_tokens);
        return KVC_EPARSE;
    }
    rc = kvc__json_int(o, "output_length", 1, p->max_tokens, &out);
    if (rc) {
        kvc__errf(err, err_cap, "%s:%zu: field 'output_length': %s an integer in [1, %u]", name,
                  lineno, rc == KVC_ENOENT ? "missing, expected" : "expected", p->max_tokens);
        return KVC_EPARSE;
    }
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(o, "hash_ids");
    if (!ids) return field_error(KVC_ENOENT, name, lineno, "hash_ids", "an array", err, err_cap);
    if (!cJSON_IsArray(ids) || cJSON_GetArraySize(ids) == 0)
        return field_error(KVC_EPARSE, name, lineno, "hash_ids", "a non-empty array", err, err_cap);
    size_t n_ids = (size_t)cJSON_GetArraySize(ids);
    uint64_t bt = p->block_tokens;
    if (in <= (n_ids - 1) * bt || in > n_ids * bt) {
        kvc__errf(err, err_cap,
                  "%s:%zu: input_length %llu does not fit %zu hash_ids of %llu tokens (needs "
                  "%llu..%llu)",
                  name, lineno, (unsigned long long)in, n_ids, (unsigned long long)bt,
                  (unsigned long long)((n_ids - 1) * bt + 1), (unsigned long long)(n_ids * bt));
        return KVC_EPARSE;
    }
    rc = grow(w, (void **)&mc->ids, &mc->cap_ids, mc->n_ids + n_ids, sizeof *mc->ids);
    if (!rc) rc = grow(w, (void **)&mc->spans, &mc->cap_spans, w->n + 1, sizeof *mc->spans);
    if (!rc) rc = kvc__wl_reserve(w, w->n + 1);
    if (rc == KVC_ERANGE) return too_many(name, lineno, err, err_cap);
    if (rc) {
        kvc__errf(err, err_cap, "%s:%zu: %s", name, lineno, kvc_strerror(rc));
        return rc;
    }
    size_t k = 0;
    for (const cJSON *it = ids->child; it; it = it->next, k++) {
        double v = it->valuedouble;
        if (!cJSON_IsNumber(it) || !(v >= 0) || v >= MAX_HASH_ID || v != floor(v)) {
            kvc__errf(err, err_cap,
                      "%s:%zu: field 'hash_ids': element %zu is not an integer in "
                      "[0, 2^53)",
                      name, lineno, k);
            return KVC_EPARSE;
        }
        mc->ids[mc->n_ids + k] = (uint64_t)v;
    }
    mc->spans[w->n] = (kvc__blocklist_t){.first = mc->n_ids, .n = (uint32_t)n_ids};
    mc->n_ids += n_ids;
    w->req[w->n++] = (kvc_sim_request_t){
        .arrival_s = ts / 1000.0 * p->time_scale,
        .n_prompt = (uint32_t)in,
        .n_output = (uint32_t)out,
        .max_output = (uint32_t)out,
    };
    return 0;
}

/* Output tokens for traces that do not carry them: request i generates
 * tape[i .. i + n_output), one tape for the whole trace. */
static int output_tape(kvc_workload_t *w)
{
    size_t len = 0;
    for (size_t i = 0; i < w->n; i++) len = KVC_MAX(len, i + w->req[i].n_output);
    kvc_token_t *tape = kvc__wl_tokens(w, len);
    if (!tape) return KVC_ENOMEM;
    kvc__fill_tokens(tape, len, OUTPUT_SEED, w->params.vocab);
    for (size_t i = 0; i < w->n; i++) w->req[i].output_tokens = tape + i;
    return 0;
}

static void fill_block(kvc_token_t *dst, size_t n, uint64_t id, uint32_t vocab)
{
    kvc__fill_tokens(dst, n, kvc__mix64(MOONCAKE_SEED, id), vocab);
}

/* Give every request its tokens (see the banner). */
static int mooncake_materialise(kvc_workload_t *w, mc_t *mc)
{
    size_t n = w->n, bt = w->params.block_tokens;
    int rc = KVC_ENOMEM;
    map_t ids = {0}, trie = {0};
    uint32_t *blocks = NULL, *terminal = NULL, *best = NULL;
    uint64_t *store_ids = NULL;
    if (mc->n_ids > UINT32_MAX - 1) return KVC_ERANGE;

    /* distinct ids, numbered in order of first appearance */
    blocks = kvc__wl_alloc(w, mc->n_ids * sizeof *blocks);
    store_ids = kvc__wl_alloc(w, mc->n_ids * sizeof *store_ids);
    if (!blocks || !store_ids || map_init(w, &ids, mc->n_ids)) goto out;
    uint32_t n_unique = 0;
    for (size_t k = 0; k < mc->n_ids; k++) {
        bool added;
        blocks[k] = map_get_or_add(&ids, mc->ids[k], 0, n_unique, &added);
        if (added) store_ids[n_unique++] = mc->ids[k];
    }
    w->unique_blocks = n_unique;
    kvc__wl_free(w, ids.slots);
    ids.slots = NULL;

    if (w->params.tokens_on_demand) {
        if ((size_t)n_unique > SIZE_MAX / sizeof(kvc_token_t) / bt) goto out;
        w->store = kvc__wl_alloc(w, (size_t)n_unique * bt * sizeof *w->store);
        if (!w->store) goto out;
        for (uint32_t u = 0; u < n_unique; u++)
            fill_block(w->store + u * bt, bt, store_ids[u], w->params.vocab);
        w->stored_tokens += (uint64_t)n_unique * bt;
        memcpy(w->lists, mc->spans, n * sizeof *w->lists);
        w->blocks = blocks;
        blocks = NULL;
        rc = 0;
        goto out;
    }

    /* The trie of id paths: node = (parent node + 1, store index).  best[node]
     * is the longest request through it (the first such in file order). */
    terminal = kvc__wl_alloc(w, n * sizeof *terminal);
    best = kvc__wl_alloc(w, mc->n_ids * sizeof *best);
    if (!terminal || !best || map_init(w, &trie, mc->n_ids)) goto out;
    uint32_t n_nodes = 0;
    for (size_t r = 0; r < n; r++) {
        uint64_t parent = 0;
        const kvc__blocklist_t *s = &mc->spans[r];
        for (uint32_t j = 0; j < s->n; j++) {
            bool added;
            uint32_t node = map_get_or_add(&trie, parent, blocks[s->first + j], n_nodes, &added);
            if (added) {
                n_nodes++;
                best[node] = (uint32_t)r;
            } else if (w->req[best[node]].n_prompt < w->req[r].n_prompt) {
                best[node] = (uint32_t)r;
            }
            parent = (uint64_t)node + 1;
        }
        terminal[r] = (uint32_t)(parent - 1);
    }
    for (size_t r = 0; r < n; r++) {
        if (best[terminal[r]] != r) continue;
        const kvc__blocklist_t *s = &mc->spans[r];
        kvc_token_t *t = kvc__wl_tokens(w, w->req[r].n_prompt);
        if (!t) goto out;
        size_t left = w->req[r].n_prompt;
        for (uint32_t j = 0; j < s->n; j++) {
            size_t m = KVC_MIN(bt, left);
            fill_block(t + (size_t)j * bt, m, mc->ids[s->first + j], w->params.vocab);
            left -= m;
        }
        w->req[r].tokens = t;
    }
    for (size_t r = 0; r < n; r++) w->req[r].tokens = w->req[best[terminal[r]]].tokens;
    rc = 0;
out:
    kvc__wl_free(w, ids.slots);
    kvc__wl_free(w, trie.slots);
    kvc__wl_free(w, blocks);
    kvc__wl_free(w, store_ids);
    kvc__wl_free(w, terminal);
    kvc__wl_free(w, best);
    return rc;
}

int kvc__load_mooncake(kvc_workload_t *w, const char *data, size_t len, const char *name, char *err,
                       size_t err_cap)
{
    mc_t mc = {0};
    lines_t L = {.p = data, .end = data + len};
    const char *s;
    size_t n, lineno = 0;
    int rc = 0;
    while (!rc && (w->params.max_requests == 0 || w->n < w->params.max_requests) &&
           next_line(&L, &s, &n, &lineno)) {
        cJSON *o = parse_object(s, n, name, lineno, err, err_cap, &rc);
        if (!o) break;
        rc = mooncake_line(w, &mc, o, name, lineno, err, err_cap);
        cJSON_Delete(o);
    }
    if (!rc && w->n) {
        rc = mooncake_materialise(w, &mc);
        if (rc == KVC_ERANGE) rc = too_many(name, lineno, err, err_cap);
        if (!rc) rc = output_tape(w);
        if (rc && rc != KVC_EPARSE) kvc__errf(err, err_cap, "%s: %s", name, kvc_strerror(rc));
    }
    kvc__wl_free(w, mc.ids);
    kvc__wl_free(w, mc.spans);
    return rc;
}

/* ---- kvcache JSONL ----------------------------------------------------------------- */
#define JSONL_FILLER_SEED 0x6a736f6e6c6f7574ULL

static int declare_names(kvc_workload_t *w, kvc__names_t *t, const cJSON *o, const char *key,
                         const char *name, size_t lineno, char *err, size_t err_cap)
{
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!arr) return 0;
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) == 0)
        return field_error(KVC_EPARSE, name, lineno, key, "a non-empty array of names", err,
                           err_cap);
    for (const cJSON *it = arr->child; it; it = it->next) {
        if (!cJSON_IsString(it) || !it->valuestring[0])
            return field_error(KVC_EPARSE, name, lineno, key, "a non-empty array of names", err,
                               err_cap);
        uint32_t idx;
        int rc = kvc__names_intern(w, t, it->valuestring, strlen(it->valuestring), &idx);
        if (rc) {
            kvc__errf(err, err_cap, "%s:%zu: field '%s': %s", name, lineno, key, kvc_strerror(rc));
            return rc == KVC_ENOMEM ? rc : KVC_EPARSE;
        }
    }
    t->closed = true;
    return 0;
}

/* The index of a record's tenant or class: the named one, else the first
 * declared, else "default". */
static int record_name(kvc_workload_t *w, kvc__names_t *t, const cJSON *o, const char *key,
                       const char *name, size_t lineno, uint32_t *index, char *err, size_t err_cap)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    const char *s = "default";
    if (it) {
        if (!cJSON_IsString(it) || !it->valuestring[0])
            return field_error(KVC_EPARSE, name, lineno, key, "a non-empty string", err, err_cap);
        s = it->valuestring;
    } else if (t->closed) {
        *index = 0;
        return 0;
    }
    int rc = kvc__names_intern(w, t, s, strlen(s), index);
    if (rc == KVC_ENOENT) {
        kvc__errf(err, err_cap, "%s:%zu: field '%s': '%s' is not declared in the header", name,
                  lineno, key, s);
        return KVC_EPARSE;
    }
    if (rc) {
        kvc__errf(err, err_cap, "%s:%zu: field '%s': %s", name, lineno, key, kvc_strerror(rc));
        return rc == KVC_ENOMEM ? rc : KVC_EPARSE;
    }
    return 0;
}

/* Check a token array; its length, or 0 after writing an error. */
static int token_array(const cJSON *arr, const char *key, uint32_t max, const char *name,
                       size_t lineno, uint32_t *n_out, char *err, size_t err_cap)
{
    if (!cJSON_IsArray(arr) || !arr->child)
        return field_error(KVC_EPARSE, name, lineno, key, "a non-empty array of token ids", err,
                           err_cap);
    size_t n = 0;
    for (const cJSON *it = arr->child; it; it = it->next, n++) {
        double v = it->valuedouble;
        if (!cJSON_IsNumber(it) || !(v >= 0) || v > INT32_MAX || v != floor(v)) {
            kvc__errf(err, err_cap,
                      "%s:%zu: field '%s': element %zu is not a token id in [0, 2^31)", name,
                      lineno, key, n);
            return KVC_EPARSE;
        }
    }
    if (n > max) {
        kvc__errf(err, err_cap, "%s:%zu: field '%s': %zu tokens, more than the limit %u", name,
                  lineno, key, n, max);
        return KVC_EPARSE;
    }
    *n_out = (uint32_t)n;
    return 0;
}

static void copy_tokens(kvc_token_t *dst, const cJSON *arr)
{
    size_t i = 0;
    for (const cJSON *it = arr->child; it; it = it->next) dst[i++] = (kvc_token_t)it->valuedouble;
}

static int jsonl_line(kvc_workload_t *w, const cJSON *o, const char *name, size_t lineno, char *err,
                      size_t err_cap)
{
    const kvc_workload_params_t *p = &w->params;
    double arrival, think = 0;
    int rc = kvc__json_num(o, "arrival_s", 0, 1e300, &arrival);
    if (rc) return field_error(rc, name, lineno, "arrival_s", "a number >= 0", err, err_cap);
    if ((rc = check_time(arrival * p->time_scale, arrival, "s", p, name, lineno, "arrival_s", err,
                         err_cap)))
        return rc;
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(o, "tokens");
    if (!toks) return field_error(KVC_ENOENT, name, lineno, "tokens", "an array", err, err_cap);
    uint32_t n_prompt, n_out_tokens = 0;
    if ((rc = token_array(toks, "tokens", p->max_tokens, name, lineno, &n_prompt, err, err_cap)))
        return rc;
    const cJSON *outs = cJSON_GetObjectItemCaseSensitive(o, "output_tokens");
    if (outs && (rc = token_array(outs, "output_tokens", p->max_tokens, name, lineno, &n_out_tokens,
                                  err, err_cap)))
        return rc;
    uint64_t n_output = 0, max_output = 0, conv = 0, turn = 0;
    rc = kvc__json_int(o, "output", 1, p->max_tokens, &n_output);
    if (rc == KVC_ENOENT && outs) {
        n_output = n_out_tokens;
    } else if (rc) {
        kvc__errf(err, err_cap, "%s:%zu: field 'output': %s an integer in [1, %u]", name, lineno,
                  rc == KVC_ENOENT ? "missing, expected" : "expected", p->max_tokens);
        return KVC_EPARSE;
    } else if (outs && n_output != n_out_tokens) {
        kvc__errf(err, err_cap, "%s:%zu: field 'output' is %llu but 'output_tokens' holds %u", name,
                  lineno, (unsigned long long)n_output, n_out_tokens);
        return KVC_EPARSE;
    }
    rc = kvc__json_int(o, "max_output", (double)n_output, UINT32_MAX, &max_output);
    if (rc == KVC_ENOENT)
        max_output = n_output;
    else if (rc)
        return field_error(rc, name, lineno, "max_output", "an integer >= output", err, err_cap);
    rc = kvc__json_int(o, "conversation", 0, MAX_HASH_ID, &conv);
    if (rc && rc != KVC_ENOENT)
        return field_error(rc, name, lineno, "conversation", "an integer >= 0", err, err_cap);
    rc = kvc__json_int(o, "turn", 0, UINT32_MAX, &turn);
    if (rc && rc != KVC_ENOENT)
        return field_error(rc, name, lineno, "turn", "an integer >= 0", err, err_cap);
    rc = kvc__json_num(o, "think_s", 0, 1e300, &think);
    if (rc && rc != KVC_ENOENT)
        return field_error(rc, name, lineno, "think_s", "a number >= 0", err, err_cap);
    if ((rc = check_time(think * p->time_scale, think, "s", p, name, lineno, "think_s", err,
                         err_cap)))
        return rc;
    uint32_t tenant, cls;
    if ((rc = record_name(w, &w->tenants, o, "tenant", name, lineno, &tenant, err, err_cap)) ||
        (rc = record_name(w, &w->classes, o, "class", name, lineno, &cls, err, err_cap)))
        return rc;
    rc = kvc__wl_reserve(w, w->n + 1);
    if (rc == KVC_ERANGE) return too_many(name, lineno, err, err_cap);
    kvc_token_t *t = rc ? NULL : kvc__wl_tokens(w, (size_t)n_prompt + n_output);
    if (!t) {
        rc = rc ? rc : KVC_ENOMEM;
        kvc__errf(err, err_cap, "%s:%zu: %s", name, lineno, kvc_strerror(rc));
        return rc;
    }
    copy_tokens(t, toks);
    if (outs)
        copy_tokens(t + n_prompt, outs);
    else
        kvc__fill_tokens(t + n_prompt, n_output, kvc__mix64(JSONL_FILLER_SEED, w->n), p->vocab);
    w->req[w->n++] = (kvc_sim_request_t){
        .arrival_s = arrival * p->time_scale,
        .tokens = t,
        .n_prompt = n_prompt,
        .n_output = (uint32_t)n_output,
        .tenant = tenant,
        .priority = cls,
        .conversation = conv,
        .turn = (uint32_t)turn,
        .max_output = (uint32_t)max_output,
        .output_tokens = t + n_prompt,
        .think_s = think * p->time_scale,
    };
    return 0;
}

int kvc__load_jsonl(kvc_workload_t *w, const char *data, size_t len, const char *name, char *err,
                    size_t err_cap)
{
    lines_t L = {.p = data, .end = data + len};
    const char *s;
    size_t n, lineno;
    int rc = 0;
    bool first = true;
    while (!rc && (w->params.max_requests == 0 || w->n < w->params.max_requests) &&
           next_line(&L, &s, &n, &lineno)) {
        cJSON *o = parse_object(s, n, name, lineno, err, err_cap, &rc);
        if (!o) break;
        if (cJSON_HasObjectItem(o, "kvcache_workload")) {
            uint64_t version;
            if (!first) {
                kvc__errf(err, err_cap,
                          "%s:%zu: the kvcache_workload header must be the first "
                          "line",
                          name, lineno);
                rc = KVC_EPARSE;
            } else if (kvc__json_int(o, "kvcache_workload", 1, 1, &version)) {
                kvc__errf(err, err_cap,
                          "%s:%zu: field 'kvcache_workload': unsupported version "
                          "(this reader knows 1)",
                          name, lineno);
                rc = KVC_EPARSE;
            } else {
                rc = declare_names(w, &w->tenants, o, "tenants", name, lineno, err, err_cap);
                if (!rc)
                    rc = declare_names(w, &w->classes, o, "classes", name, lineno, err, err_cap);
            }
        } else {
            rc = jsonl_line(w, o, name, lineno, err, err_cap);
        }
        first = false;
        cJSON_Delete(o);
    }
    return rc;
}
