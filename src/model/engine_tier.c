/* engine_tier.c - the engine's KV tiers: host, disk and Redis copies of the pool's blocks.
 *
 * Three paths, all on the engine's step thread (a store is not thread-safe; this first version
 * copies synchronously):
 *
 *   offload (evict mode, host and disk by default): the prefix cache's REMOVED event fires as
 *     the pool evicts a cached block, before it hands the block out again; its bytes, still
 *     intact, are put to every evict-mode tier (inclusive: host and disk both get it; the
 *     disk's admission policy and write budget decide what it keeps).  Copying at eviction
 *     rather than ahead of it (kvc_prefix_offload_begin) loses nothing: offload_begin offers
 *     only leaves, so a chain the pool evicts in one step would keep only its last block.
 *   write-through (redis by default): the STORED event queues the block; after the step the
 *     queue is put (one pipelined put_many per tier), so another replica hits it at once.
 *   fetch: a request's prefix match that ends in the pool continues block by block in the
 *     tiers, in order; each contiguous run found in one tier is fetched or recomputed by
 *     kvc_tier_decide; fetched runs go into fresh pool blocks that are pending (fenced) until
 *     their verified bytes are in, then committed in chain order; a failure aborts the rest
 *     of the run (recomputed).  The fetcher holds a reference on every block of the match
 *     until the scheduler has admitted the request, so nothing it fetched is evicted first.
 *
 * A block's tier identity (namespace, fingerprint, depth, parent hash) is kept per pool block
 * from its STORED event: a child inherits its parent's namespace, a root's is found among the
 * default and the namespaces of recent requests by rehashing its tokens. */
#include "engine_tier_int.h"
#include "llm_int.h"
#include "util/msg.h"

#include <stdlib.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#define RECENT_NS 16

typedef struct {
    kvc_tier_spec_t spec;
    kvc_tier_store_t *store;
    kvc_tier_estimator_t est;
    uint64_t fetched, recompute, fetch_failed, offloaded, written_through;
} etier_t;

typedef struct {
    kvc_namespace_t ns;
    kvc_hash128_t hash, parent, fp;
    uint32_t depth;
    bool valid;
} bmeta_t;

typedef struct {
    uint32_t block;
    int skip; /* the tier it was fetched from (not written back there), or -1 */
    kvc_hash128_t hash;
} wq_t;

struct kvc__etiers {
    kvc_pool_t *pool;
    kvc_prefix_t *pc;
    uint32_t bs, n_blocks, ctx_blocks;
    size_t block_bytes;
    etier_t t[KVC_ENGINE_MAX_TIERS];
    uint32_t n;
    bool any_evict, any_wt;
    kvc_tier_fetch_t policy;
    bmeta_t *meta; /* (n_blocks) */
    kvc_namespace_t recent[RECENT_NS];
    uint32_t n_recent, recent_next;
    wq_t *wq;
    uint32_t n_wq, wq_cap;
    int committing; /* the tier a block being committed came from, or -1 */
    uint32_t held;  /* references held by fetches */
    /* scratch, sized for one context */
    kvc_hash128_t *hashes, *fps;
    uint32_t *hit, *fresh;
    kvc_tier_key_t *keys;
    void **outs;
    const void **datas;
    int *results;
    kvc_tier_put_status_t *status;
    kvc_token_t *tok2; /* (2 * bs): a parent's place, then a block's tokens */
    char model_id[KVC_TIER_PREFIX_MAX + 1];
};

/* ---- the model id ------------------------------------------------------------------------ */
/* 32 hex digits: XXH3-128 of the GGUF's header bytes (metadata and tensor table), every
 * tensor's name, type, shape and its first and last 256 bytes, the kv dtype and block size.
 * Replicas of one model file agree; another model, quantisation or fine-tune of the same
 * shapes (its weights' bytes differ) does not. */
static void derive_model_id(const kvc_llm_t *m, const kvc_engine_params_t *p, char out[33])
{
    XXH3_state_t st;
    memset(&st, 0, sizeof st); /* see tier.c's record_sum */
    XXH3_128bits_reset_withSeed(&st, 0x6b7663746d6f6465ull);
    const kvc_gguf_t *g = kvc_llm_gguf(m);
    const uint64_t nt = g ? kvc_gguf_n_tensors(g) : 0;
    if (nt) {
        const kvc_gguf_tensor_t *t0 = kvc_gguf_tensor(g, 0);
        const uint64_t doff = kvc_gguf_data_offset(g);
        const uint8_t *base = (const uint8_t *)t0->data - t0->offset - doff;
        if (doff <= kvc_gguf_file_bytes(g) && !memcmp(base, "GGUF", 4))
            XXH3_128bits_update(&st, base, doff);
    }
    for (uint64_t i = 0; i < nt; i++) {
        const kvc_gguf_tensor_t *t = kvc_gguf_tensor(g, i);
        XXH3_128bits_update(&st, t->name.s, t->name.len);
        XXH3_128bits_update(&st, &t->type, sizeof t->type);
        XXH3_128bits_update(&st, t->ne, sizeof t->ne);
        const size_t k = t->bytes < 256 ? (size_t)t->bytes : 256;
        XXH3_128bits_update(&st, t->data, k);
        XXH3_128bits_update(&st, (const uint8_t *)t->data + t->bytes - k, k);
    }
    const kvc_model_hparams_t *h = &m->h;
    const uint32_t shape[] = {h->n_layers, h->n_kv_heads,         h->head_dim,
                              h->vocab,    (uint32_t)p->kv_dtype, p->block_size};
    XXH3_128bits_update(&st, shape, sizeof shape);
    XXH128_hash_t d = XXH3_128bits_digest(&st);
    kvc_hash128_hex((kvc_hash128_t){d.low64, d.high64}, out);
}

/* ---- create / destroy --------------------------------------------------------------------- */
static void seed_estimator(etier_t *et)
{
    /* Until measured: host memory at a memcpy, a local disk's page cache plus a syscall, a
     * Redis round trip on a LAN. */
    double lat = 2e-6, bw = 5e9;
    if (et->spec.kind == KVC_TIER_DISK) lat = 5e-5, bw = 1e9;
    if (et->spec.kind == KVC_TIER_REDIS) lat = 2e-4, bw = 5e8;
    /* what the spec says the link does (,bw= ,rtt=), until measured */
    if (et->spec.rtt_s > 0) lat = et->spec.rtt_s;
    if (et->spec.bandwidth_Bps > 0) bw = et->spec.bandwidth_Bps;
    const int rc = kvc_tier_estimator_init(&et->est, lat, bw, 0.1);
    KVC_ASSERT(rc == 0); /* constants in range */
}

void kvc__etiers_destroy(kvc__etiers_t *t)
{
    if (!t) return;
    for (uint32_t i = 0; i < t->n; i++) kvc_tier_destroy(t->t[i].store);
    free(t->meta), free(t->wq), free(t->hashes), free(t->fps), free(t->hit), free(t->fresh);
    free(t->keys), free(t->outs), free(t->datas), free(t->results), free(t->status), free(t->tok2);
    free(t);
}

int kvc__etiers_create(const kvc_llm_t *m, const kvc_engine_params_t *p, size_t block_bytes,
                       uint32_t n_blocks, uint32_t ctx_blocks, uint64_t *seed, kvc__etiers_t **out,
                       char *msg, size_t cap)
{
    *out = NULL;
    if (p->n_tiers > KVC_ENGINE_MAX_TIERS || (p->n_tiers && !p->tiers))
        return kvc__msgf(KVC_EINVAL, msg, cap, "--tier: at most %d tiers", KVC_ENGINE_MAX_TIERS);
    if (p->tier_fetch > KVC_TIER_FETCH_NEVER)
        return kvc__msgf(KVC_EINVAL, msg, cap, "tier fetch policy out of range");
    if (m->n_groups > 1)
        return kvc__msgf(KVC_ENOTSUP, msg, cap,
                         "--tier: models with sliding-window layers (%u KV groups) are not "
                         "supported by the tiers yet",
                         m->n_groups);
    if (p->no_prefix_cache || p->no_kv_cache)
        return kvc__msgf(KVC_EINVAL, msg, cap, "--tier needs the prefix cache and the KV cache");
    kvc__etiers_t *t = calloc(1, sizeof *t);
    if (!t) return kvc__msgf(KVC_ENOMEM, msg, cap, "out of memory");
    t->bs = p->block_size;
    t->n_blocks = n_blocks;
    t->ctx_blocks = ctx_blocks;
    t->block_bytes = block_bytes;
    t->policy = p->tier_fetch;
    t->committing = -1;
    if (p->tier_model_id) {
        if (strlen(p->tier_model_id) > KVC_TIER_PREFIX_MAX || !p->tier_model_id[0]) {
            kvc__etiers_destroy(t);
            return kvc__msgf(KVC_EINVAL, msg, cap, "tier model id: 1 to %d bytes",
                             KVC_TIER_PREFIX_MAX);
        }
        strcpy(t->model_id, p->tier_model_id);
    } else
        derive_model_id(m, p, t->model_id);
    *seed = p->prefix_hash_seed ? p->prefix_hash_seed
                                : (XXH3_64bits(t->model_id, strlen(t->model_id)) | 1);
    t->meta = calloc(n_blocks, sizeof *t->meta);
    t->hashes = malloc(ctx_blocks * sizeof *t->hashes);
    t->fps = malloc(ctx_blocks * sizeof *t->fps);
    t->hit = malloc(ctx_blocks * sizeof *t->hit);
    t->fresh = malloc(ctx_blocks * sizeof *t->fresh);
    t->keys = malloc(ctx_blocks * sizeof *t->keys);
    t->outs = malloc(ctx_blocks * sizeof *t->outs);
    t->datas = malloc(ctx_blocks * sizeof *t->datas);
    t->results = malloc(ctx_blocks * sizeof *t->results);
    t->status = malloc(ctx_blocks * sizeof *t->status);
    t->tok2 = calloc(2 * (size_t)t->bs, sizeof *t->tok2);
    if (!t->meta || !t->hashes || !t->fps || !t->hit || !t->fresh || !t->keys || !t->outs ||
        !t->datas || !t->results || !t->status || !t->tok2) {
        kvc__etiers_destroy(t);
        return kvc__msgf(KVC_ENOMEM, msg, cap, "out of memory");
    }
    for (uint32_t i = 0; i < p->n_tiers; i++) {
        etier_t *et = &t->t[i];
        et->spec = p->tiers[i];
        kvc_tier_params_t tp = kvc_tier_params_default();
        tp.block_bytes = block_bytes;
        tp.block_tokens = p->block_size;
        tp.model_id = t->model_id;
        tp.timeout_ms = p->tier_timeout_ms;
        if (et->spec.kind != KVC_TIER_REDIS) tp.admission = p->tier_admission;
        if (et->spec.kind == KVC_TIER_DISK) tp.write_budget_per_day = p->tier_disk_write_budget;
        const char *kind = kvc_tier_kind_name(et->spec.kind);
        int rc = kvc_tier_create(&et->spec, &tp, &et->store);
        if (rc) {
            const size_t rec = kvc_tier_record_bytes(block_bytes, p->block_size);
            const kvc_tier_spec_t *sp = &p->tiers[i]; /* the caller's: t goes now */
            kvc__etiers_destroy(t);
            if (rc == KVC_EINVAL && sp->kind != KVC_TIER_REDIS && sp->capacity_bytes < rec)
                return kvc__msgf(rc, msg, cap,
                                 "--tier %s: %llu bytes hold no block (a record is %zu bytes)",
                                 kind, (unsigned long long)sp->capacity_bytes, rec);
            if (rc == KVC_EEXIST)
                return kvc__msgf(rc, msg, cap,
                                 "--tier disk:%s: the file holds blocks of another size or "
                                 "capacity (remove it or give another path)",
                                 sp->path);
            if (sp->kind == KVC_TIER_DISK)
                return kvc__msgf(rc, msg, cap, "--tier disk:%s: %s", sp->path, kvc_strerror(rc));
            return kvc__msgf(rc, msg, cap, "--tier %s: %s", kind, kvc_strerror(rc));
        }
        t->n++;
        seed_estimator(et);
        if (et->spec.mode == KVC_TIER_MODE_EVICT)
            t->any_evict = true;
        else
            t->any_wt = true;
    }
    *out = t;
    return 0;
}

void kvc__etiers_attach(kvc__etiers_t *t, kvc_pool_t *pool, kvc_prefix_t *pc)
{
    t->pool = pool;
    t->pc = pc;
}

/* ---- block identity ----------------------------------------------------------------------- */
static bool ns_zero(const kvc_namespace_t *ns)
{
    static const kvc_namespace_t zero;
    return !memcmp(ns, &zero, sizeof zero);
}

/* Remember a request's namespace, so that the roots it caches can be named. */
static void note_ns(kvc__etiers_t *t, const kvc_namespace_t *ns)
{
    if (ns_zero(ns)) return;
    for (uint32_t i = 0; i < t->n_recent; i++)
        if (!memcmp(&t->recent[i], ns, sizeof *ns)) return;
    t->recent[t->recent_next] = *ns;
    t->recent_next = (t->recent_next + 1) % RECENT_NS;
    if (t->n_recent < RECENT_NS) t->n_recent++;
}

static void key_of(const kvc__etiers_t *t, const bmeta_t *m, const kvc_token_t *tokens,
                   kvc_tier_key_t *k)
{
    *k = (kvc_tier_key_t){.hash = m->hash,
                          .parent_hash = m->parent,
                          .fingerprint = m->fp,
                          .ns = &m->ns,
                          .tokens = tokens,
                          .n_tokens = t->bs,
                          .depth = m->depth};
}

/* A block was cached: name it for the tiers (namespace, fingerprint, depth). */
static void stored(kvc__etiers_t *t, const kvc_prefix_event_t *ev)
{
    bmeta_t *m = &t->meta[ev->block];
    m->valid = false;
    if (ev->group != 0 || ev->n_tokens != t->bs) return;
    kvc_hash128_t h, fp;
    if (ev->parent_block != KVC_NONE) {
        const bmeta_t *pm = ev->parent_block < t->n_blocks ? &t->meta[ev->parent_block] : NULL;
        if (!pm || !pm->valid || !kvc_hash128_eq(pm->hash, ev->parent_hash)) return;
        memcpy(t->tok2 + t->bs, ev->tokens, t->bs * sizeof *ev->tokens);
        kvc_prefix_query_t q = {.ns = &pm->ns, .tokens = t->tok2, .n_tokens = 2 * (size_t)t->bs};
        if (kvc_prefix_hash_next(t->pc, &q, 1, &ev->parent_hash, &pm->fp, &h, &fp) ||
            !kvc_hash128_eq(h, ev->hash))
            return;
        m->ns = pm->ns;
        m->depth = pm->depth + 1;
    } else {
        bool found = false;
        for (uint32_t i = 0; i <= t->n_recent && !found; i++) {
            kvc_namespace_t ns = {0};
            if (i) ns = t->recent[i - 1];
            ns.group = ev->group;
            kvc_prefix_query_t q = {.ns = &ns, .tokens = ev->tokens, .n_tokens = t->bs};
            if (kvc_prefix_hash_next(t->pc, &q, 0, NULL, NULL, &h, &fp) == 0 &&
                kvc_hash128_eq(h, ev->hash)) {
                m->ns = ns;
                found = true;
            }
        }
        if (!found) return;
        m->depth = 0;
    }
    m->hash = ev->hash;
    m->parent = ev->parent_hash;
    m->fp = fp;
    m->valid = true;
    if (!t->any_wt) return;
    if (t->n_wq == t->wq_cap) {
        const uint32_t c = t->wq_cap ? 2 * t->wq_cap : 64;
        wq_t *w = c <= KVC_MAX(64, 4 * t->n_blocks) ? realloc(t->wq, c * sizeof *w) : NULL;
        if (!w) return; /* not written through: a later replica recomputes it */
        t->wq = w, t->wq_cap = c;
    }
    t->wq[t->n_wq++] = (wq_t){.block = ev->block, .skip = t->committing, .hash = ev->hash};
}

/* A cached block is being evicted: its bytes are intact until the pool hands it out. */
static void removed(kvc__etiers_t *t, const kvc_prefix_event_t *ev)
{
    bmeta_t *m = &t->meta[ev->block];
    if (m->valid && t->any_evict && kvc_hash128_eq(m->hash, ev->hash)) {
        kvc_tier_key_t k;
        key_of(t, m, ev->tokens, &k);
        const void *data = kvc_pool_block_data(t->pool, ev->block);
        for (uint32_t i = 0; data && i < t->n; i++) {
            etier_t *et = &t->t[i];
            if (et->spec.mode != KVC_TIER_MODE_EVICT) continue;
            kvc_tier_put_status_t st;
            if (kvc_tier_put(et->store, &k, data, &st) == 0 && st == KVC_TIER_PUT_STORED)
                et->offloaded++;
        }
    }
    m->valid = false;
}

void kvc__etiers_event(void *ctx, const kvc_prefix_event_t *ev)
{
    kvc__etiers_t *t = ctx;
    if (!t->pc || ev->block >= t->n_blocks) return;
    if (ev->type == KVC_EVENT_STORED)
        stored(t, ev);
    else if (ev->type == KVC_EVENT_REMOVED)
        removed(t, ev);
}

/* ---- write-through ------------------------------------------------------------------------ */
void kvc__etiers_flush(kvc__etiers_t *t)
{
    if (!t || !t->n_wq) return;
    /* Still cached with the identity it was queued with: its bytes are unchanged (cached
     * blocks are immutable, and nothing writes the pool between the step's completion and
     * here). */
    uint32_t n = 0;
    for (uint32_t i = 0; i < t->n_wq; i++) {
        const wq_t *w = &t->wq[i];
        kvc_hash128_t h;
        const bmeta_t *m = &t->meta[w->block];
        if (!m->valid || !kvc_hash128_eq(m->hash, w->hash) ||
            kvc_prefix_block_hash(t->pc, w->block, &h) || !kvc_hash128_eq(h, w->hash))
            continue;
        t->wq[n++] = *w;
    }
    for (uint32_t ti = 0; ti < t->n; ti++) {
        etier_t *et = &t->t[ti];
        if (et->spec.mode != KVC_TIER_MODE_WRITE_THROUGH) continue;
        for (uint32_t i = 0; i < n;) {
            uint32_t k = 0;
            for (; i < n && k < t->ctx_blocks; i++) {
                const wq_t *w = &t->wq[i];
                if (w->skip == (int)ti) continue;
                key_of(t, &t->meta[w->block], kvc_prefix_block_tokens(t->pc, w->block),
                       &t->keys[k]);
                t->datas[k++] = kvc_pool_block_data(t->pool, w->block);
            }
            if (k && kvc_tier_put_many(et->store, t->keys, t->datas, k, t->status) == 0)
                for (uint32_t j = 0; j < k; j++)
                    et->written_through += t->status[j] == KVC_TIER_PUT_STORED;
        }
    }
    t->n_wq = 0;
}

/* ---- fetch -------------------------------------------------------------------------------- */
static void fetch_key(kvc__etiers_t *t, const kvc_namespace_t *ns, const kvc_token_t *tokens,
                      uint32_t i, kvc_tier_key_t *k)
{
    const kvc_hash128_t zero = {0, 0};
    *k = (kvc_tier_key_t){.hash = t->hashes[i],
                          .parent_hash = i ? t->hashes[i - 1] : zero,
                          .fingerprint = t->fps[i],
                          .ns = ns,
                          .tokens = tokens + (size_t)i * t->bs,
                          .n_tokens = t->bs,
                          .depth = i};
}

static void held_push(kvc__etiers_t *t, kvc__tier_fetch_t *f, uint32_t block)
{
    f->held[f->n_held++] = block;
    t->held++;
}

void kvc__etiers_release(kvc__etiers_t *t, kvc__tier_fetch_t *f)
{
    if (!t || !f->held) return;
    (void)kvc_pool_release(t->pool, f->held, f->n_held);
    t->held -= f->n_held;
    free(f->held);
    f->held = NULL;
    f->n_held = 0;
}

uint32_t kvc__etiers_held(const kvc__etiers_t *t)
{
    return t ? t->held : 0;
}

/* Fetch blocks [i, i + n) of the query from tier ti into the fresh blocks fresh[0..n), pending
 * and chained below `parent`; commit the verified ones in order.  Returns how many were
 * committed (now held by f); the others' references are released. */
static uint32_t fetch_run(kvc__etiers_t *t, uint32_t ti, const kvc_prefix_query_t *q, uint32_t i,
                          uint32_t n, uint32_t parent, uint32_t *fresh, kvc__tier_fetch_t *f)
{
    etier_t *et = &t->t[ti];
    uint32_t n_pend = 0;
    for (; n_pend < n; n_pend++) {
        uint32_t canon;
        const uint32_t b = fresh[n_pend];
        if (kvc_prefix_insert_pending(t->pc, q, i + n_pend, parent, b, &canon) || canon != b)
            break; /* (cached or fetched meanwhile: cannot happen on one thread) */
        parent = b;
        fetch_key(t, q->ns, q->tokens, i + n_pend, &t->keys[n_pend]);
        t->outs[n_pend] = kvc_pool_block_data(t->pool, b);
    }
    uint32_t ok = 0;
    if (n_pend) {
        const uint64_t t0 = kvc_now_ns();
        const int hits = kvc_tier_get_many(et->store, t->keys, t->outs, n_pend, t->results);
        const double dt = (double)(kvc_now_ns() - t0) * 1e-9;
        if (hits > 0 && dt > 0) {
            const int orc =
                kvc_tier_estimator_observe(&et->est, (uint64_t)hits * t->block_bytes, dt);
            KVC_ASSERT(orc == 0); /* bytes and seconds positive and finite */
        }
        for (; ok < n_pend; ok++) {
            if (hits < 0 || t->results[ok] != 0) break;
            uint32_t canon;
            t->committing = (int)ti;
            const int rc = kvc_prefix_commit(t->pc, fresh[ok], &canon);
            t->committing = -1;
            if (rc || canon != fresh[ok]) break;
            held_push(t, f, fresh[ok]);
        }
        if (ok < n_pend) {
            /* the rest of the run chains from bytes that are not there: recomputed (an abort
             * cascades below the block, so the loop usually stops at once) */
            for (uint32_t x = ok; x < n_pend; x++)
                if (kvc_prefix_block_flags(t->pc, fresh[x]) & KVC_PREFIX_BLOCK_PENDING)
                    (void)kvc_prefix_abort(t->pc, fresh[x], NULL);
            et->fetch_failed += n_pend - ok;
        }
    }
    et->fetched += ok;
    if (ok < n) (void)kvc_pool_release(t->pool, fresh + ok, n - ok);
    return ok;
}

int kvc__etiers_fetch(kvc__etiers_t *t, const kvc_namespace_t *ns, const kvc_token_t *tokens,
                      uint32_t n_prompt, double rate, uint32_t max_hold, kvc__tier_fetch_t *f)
{
    memset(f, 0, sizeof *f);
    if (!t || !t->n) return 0;
    note_ns(t, ns);
    /* a hit never covers the last prompt token */
    const uint32_t limit = KVC_MIN((n_prompt - 1) / t->bs, t->ctx_blocks);
    if (!limit || !max_hold) return 0;
    kvc_prefix_query_t q = {.ns = ns, .tokens = tokens, .n_tokens = (size_t)limit * t->bs};
    kvc_prefix_hit_t hit;
    /* the match of the whole prompt: the blocks the scheduler's lookup will hit */
    kvc_prefix_query_t qm = q;
    qm.n_tokens = n_prompt;
    if (kvc_prefix_match(t->pc, &qm, t->hit, limit, NULL, &hit)) return 0;
    const uint32_t h = (uint32_t)hit.n_hit_blocks;
    if (h >= limit) return 0;
    size_t nh;
    if (kvc_prefix_hash(t->pc, &q, t->hashes, limit, &nh) ||
        kvc_prefix_fingerprint(t->pc, &q, t->fps, limit, &nh))
        return 0;
    /* which tier holds block h (the first the pool misses)?  Nothing: no fetch. */
    kvc_tier_key_t k;
    fetch_key(t, ns, tokens, h, &k);
    uint32_t first = UINT32_MAX;
    for (uint32_t ti = 0; ti < t->n && first == UINT32_MAX; ti++)
        if (kvc_tier_contains(t->t[ti].store, &k) == 1) first = ti;
    if (first == UINT32_MAX) return 0;
    if (h >= max_hold) return 0;
    f->held = malloc(limit * sizeof *f->held);
    if (!f->held) return KVC_ENOMEM;
    /* Hold the pool's part of the match: allocating the fetched blocks must not evict it. */
    for (uint32_t i = 0; i < h; i++) {
        if (kvc_pool_ref(t->pool, t->hit[i])) {
            kvc__etiers_release(t, f);
            return 0;
        }
        held_push(t, f, t->hit[i]);
    }
    /* Then the fresh blocks, for all that may be fetched: allocating evicts, and an evicted
     * block's copy into the tiers may evict records there; the runs are looked up after. */
    uint32_t n_fresh = KVC_MIN(limit - h, max_hold - h);
    while (n_fresh && kvc_pool_alloc(t->pool, n_fresh, t->fresh)) n_fresh /= 2;
    if (!n_fresh) {
        kvc__etiers_release(t, f);
        return 0; /* no room now: recomputed */
    }
    uint32_t used = 0;
    uint32_t i = h, parent = h ? t->hit[h - 1] : KVC_NONE, ti = UINT32_MAX;
    while (i < limit && f->n_runs < KVC__TIER_MAX_RUNS && used < n_fresh) {
        /* the run: the first tier holding block i, and the blocks after it that tier holds */
        fetch_key(t, ns, tokens, i, &k);
        for (uint32_t x = 0; x < t->n && ti == UINT32_MAX; x++)
            if (kvc_tier_contains(t->t[x].store, &k) == 1) ti = x;
        if (ti == UINT32_MAX) break;
        etier_t *et = &t->t[ti];
        uint32_t j = i + 1;
        while (j < limit && j - i < n_fresh - used) {
            fetch_key(t, ns, tokens, j, &k);
            if (kvc_tier_contains(et->store, &k) != 1) break;
            j++;
        }
        const uint32_t n = j - i;
        bool fetch = t->policy == KVC_TIER_FETCH_ALWAYS;
        if (t->policy == KVC_TIER_FETCH_DECIDE) {
            kvc_tier_run_t run = {.n_blocks = n,
                                  .block_bytes = t->block_bytes,
                                  .block_tokens = t->bs,
                                  .bandwidth_Bps = et->est.bandwidth_Bps,
                                  .latency_s = et->est.latency_s,
                                  .prefill_tokens_per_s = rate};
            kvc_tier_decision_t d;
            fetch = kvc_tier_decide(&run, &d) == 0 && d.fetch;
        }
        if (!fetch) {
            et->recompute += n;
            break;
        }
        const uint32_t got = fetch_run(t, ti, &q, i, n, parent, t->fresh + used, f);
        if (got) {
            f->run_tier[f->n_runs] = ti;
            f->run_start[f->n_runs] = i;
            f->run_end[f->n_runs++] = i + got;
            parent = t->fresh[used + got - 1];
        }
        used += n;
        if (got < n) break;
        i += n;
        ti = UINT32_MAX;
    }
    if (used < n_fresh) (void)kvc_pool_release(t->pool, t->fresh + used, n_fresh - used);
    if (!f->n_runs) kvc__etiers_release(t, f); /* nothing fetched: the pool hits need no hold */
    return 0;
}

/* ---- stats -------------------------------------------------------------------------------- */
uint32_t kvc__etiers_n(const kvc__etiers_t *t)
{
    return t ? t->n : 0;
}

int kvc__etiers_stats(const kvc__etiers_t *t, uint32_t i, kvc_engine_tier_stats_t *out)
{
    if (!t || !out || i >= t->n) return KVC_EINVAL;
    const etier_t *et = &t->t[i];
    memset(out, 0, sizeof *out);
    out->kind = et->spec.kind;
    out->mode = et->spec.mode;
    kvc_tier_stats(et->store, &out->store);
    out->fetched_blocks = et->fetched;
    out->recompute_blocks = et->recompute;
    out->fetch_failed_blocks = et->fetch_failed;
    out->offloaded_blocks = et->offloaded;
    out->written_through_blocks = et->written_through;
    out->latency_s = et->est.latency_s;
    out->bandwidth_Bps = et->est.bandwidth_Bps;
    return 0;
}

const char *kvc__etiers_model_id(const kvc__etiers_t *t)
{
    return t ? t->model_id : "";
}
