/* seq.c - request KV memory: block tables, reservation with copy-on-write,
 * prefix reuse across KV groups, drafts and rollback, forks and beams,
 * sliding-window release, and the step launch/completion contract.
 * See include/kvcache/seq.h for the model. */
#include "kvcache/seq.h"
#include "pool/pool_int.h"
#include "util/msg.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

enum { SLOT_FREE = 0, SLOT_LIVE, SLOT_ZOMBIE };

typedef struct {
    uint32_t *v; /* (cap) logical block -> physical block, KVC_NONE when released */
    uint32_t n, cap;
    uint32_t n_released;   /* sliding: leading entries released */
    uint32_t n_inserted;   /* full blocks handed to the prefix cache (or found there) */
    bool insert_blocked;   /* a block could not be cached: no later block can chain from it */
    kvc_hash128_t *hashes; /* (hash_cap) per full committed block */
    kvc_hash128_t *fps;    /* sliding groups: fingerprints alongside */
    uint32_t n_hashed, hash_cap;
} group_t;

typedef struct {
    uint32_t gen;
    uint8_t state;
    uint32_t next_free;
    uint32_t n_inflight;
    uint64_t mark; /* distinct-row check in step_launch */
    kvc_token_t *tokens;
    size_t n_tokens, tok_cap;
    size_t n_prompt, n_draft, n_reserved, n_computed, n_accepted, n_emitted, n_hit;
    bool looked_up;
    size_t next_work; /* insert_ready has nothing to do while min(computed, committed) is below */
    size_t next_hash; /* update_hashes has nothing to do while the committed tokens are below */
    kvc_namespace_t ns;
    uint32_t priority; /* its prefix queries' (the "priority" eviction policy's) */
    kvc_mm_input_t *mm;
    size_t n_mm, mm_cap;
    group_t g[KVC_MAX_GROUPS];
} seq_t;

typedef struct {
    kvc_step_id_t id; /* 0: free record */
    uint32_t n_rows;
    kvc_seq_t *rows; /* (max_batch) */
} step_t;

struct kvc_seqs {
    kvc_pool_t *pool;
    kvc_prefix_t *pc;
    kvc_seqs_params_t params;
    uint32_t bs;
    seq_t *slots; /* (max_seqs) */
    uint32_t free_head;
    uint32_t n_live, n_zombies;
    step_t *steps; /* (max_inflight_steps) */
    kvc_step_id_t next_step;
    uint64_t mark_epoch;
    uint32_t *scratch; /* block ids for one allocation */
    size_t scratch_cap;
    kvc_seqs_stats_t stats;
};

/* ---- small helpers ------------------------------------------------------------ */
static const kvc_allocator_t *alloc_of(const kvc_seqs_t *s)
{
    return &s->params.allocator;
}

/* Grow *p (elements of `size` bytes, *cap of them) to hold at least `need`. */
static int grow_slow(const kvc_seqs_t *s, void **p, size_t size, size_t *cap, size_t need)
{
    size_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *np = kvc_alloc(alloc_of(s), c * size, 0);
    if (!np) return KVC_ENOMEM;
    if (*cap) memcpy(np, *p, *cap * size);
    kvc_free(alloc_of(s), *p);
    *p = np;
    *cap = c;
    return 0;
}

static inline int grow(const kvc_seqs_t *s, void **p, size_t size, size_t *cap, size_t need)
{
    return need <= *cap ? 0 : grow_slow(s, p, size, cap, need);
}

static int grow32(const kvc_seqs_t *s, uint32_t **p, uint32_t *cap, size_t need)
{
    size_t c = *cap;
    int rc = grow(s, (void **)p, sizeof(uint32_t), &c, need);
    *cap = (uint32_t)c;
    return rc;
}

static inline size_t div_up(size_t a, size_t b)
{
    return (a + b - 1) / b;
}

/* memcpy that also takes (NULL, 0): an empty table or token array has no storage yet. */
static inline void copy_n(void *dst, const void *src, size_t bytes)
{
    if (bytes) memcpy(dst, src, bytes);
}

static inline size_t committed(const seq_t *q)
{
    return q->n_tokens - q->n_draft;
}

/* The live sequence a handle names, or NULL (counted as a stale call). */
static seq_t *get(kvc_seqs_t *s, kvc_seq_t h)
{
    if (h.slot < s->params.max_seqs) {
        seq_t *q = &s->slots[h.slot];
        if (q->state == SLOT_LIVE && q->gen == h.gen) return q;
    }
    s->stats.n_stale++;
    return NULL;
}

static const seq_t *get_const(const kvc_seqs_t *s, kvc_seq_t h)
{
    if (h.slot >= s->params.max_seqs) return NULL;
    const seq_t *q = &s->slots[h.slot];
    return q->state == SLOT_LIVE && q->gen == h.gen ? q : NULL;
}

int kvc_seq_progress(const kvc_seqs_t *s, kvc_seq_t h, size_t *n_tokens, size_t *n_computed,
                     uint32_t *n_blocks)
{
    const seq_t *q = get_const(s, h);
    if (!q) return KVC_ESTALE;
    if (n_tokens) *n_tokens = q->n_tokens;
    if (n_computed) *n_computed = q->n_computed;
    if (n_blocks) {
        uint32_t nb = 0;
        for (uint32_t g = 0; g < s->params.n_groups; g++) nb += q->g[g].n - q->g[g].n_released;
        *n_blocks = nb;
    }
    return 0;
}

bool kvc_seqs_has_sliding(const kvc_seqs_t *seqs)
{
    for (uint32_t g = 0; g < seqs->params.n_groups; g++)
        if (seqs->params.window[g]) return true;
    return false;
}

uint32_t kvc_seqs_n_groups(const kvc_seqs_t *seqs)
{
    return seqs->params.n_groups;
}

bool kvc_seq_valid(const kvc_seqs_t *seqs, kvc_seq_t h)
{
    return get_const(seqs, h) != NULL;
}

static bool sliding(const kvc_seqs_t *s, uint32_t g)
{
    return s->params.window[g] != 0;
}

static kvc_prefix_query_t group_query(const kvc_seqs_t *s, const seq_t *q, uint32_t g,
                                      kvc_namespace_t *ns, size_t n_tokens)
{
    *ns = q->ns;
    ns->group = g;
    return (kvc_prefix_query_t){.ns = ns,
                                .tokens = q->tokens,
                                .n_tokens = n_tokens,
                                .mm = q->n_mm ? q->mm : NULL,
                                .n_mm = q->n_mm,
                                .hashes = q->g[g].hashes,
                                .fingerprints = sliding(s, g) ? q->g[g].fps : NULL,
                                .priority = q->priority};
}

/* ---- creation ----------------------------------------------------------------- */
kvc_seqs_params_t kvc_seqs_params_default(void)
{
    return (kvc_seqs_params_t){.max_seqs = 256, .n_groups = 1, .max_inflight_steps = 4};
}

int kvc_seqs_create(kvc_pool_t *pool, kvc_prefix_t *pc, const kvc_seqs_params_t *params,
                    kvc_seqs_t **out)
{
    if (!pool || !params || !out) return KVC_EINVAL;
    *out = NULL;
    kvc_seqs_params_t p = *params;
    if (p.max_batch == 0) p.max_batch = p.max_seqs;
    if (p.max_seqs == 0 || p.max_seqs >= (1u << 30) || p.n_groups == 0 ||
        p.n_groups > KVC_MAX_GROUPS || p.max_inflight_steps == 0 || p.max_inflight_steps > 1024)
        return KVC_EINVAL;
    for (uint32_t g = p.n_groups; g < KVC_MAX_GROUPS; g++)
        if (p.window[g]) return KVC_EINVAL;
    /* The prefix cache must be over this pool and see the same groups: a full-attention group
     * that the cache treats as sliding would get tables with holes, and the reverse would
     * release blocks the cache's lookups still need. */
    if (pc && kvc_prefix_pool(pc) != pool) return KVC_EINVAL;
    for (uint32_t g = 0; pc && g < p.n_groups; g++)
        if (p.window[g] != kvc_prefix_group_window(pc, g)) return KVC_EINVAL;
    const kvc_allocator_t *a = &p.allocator;
    kvc_seqs_t *s = kvc_calloc(a, 1, sizeof *s, 0);
    if (!s) return KVC_ENOMEM;
    s->pool = pool;
    s->pc = pc;
    s->params = p;
    s->bs = kvc_pool_block_size(pool);
    s->slots = kvc_calloc(a, p.max_seqs, sizeof(seq_t), 64);
    s->steps = kvc_calloc(a, p.max_inflight_steps, sizeof(step_t), 0);
    if (!s->slots || !s->steps) goto oom;
    for (uint32_t i = 0; i < p.max_inflight_steps; i++) {
        s->steps[i].rows = kvc_calloc(a, p.max_batch, sizeof(kvc_seq_t), 0);
        if (!s->steps[i].rows) goto oom;
    }
    for (uint32_t i = 0; i < p.max_seqs; i++) {
        s->slots[i].next_free = i + 1 < p.max_seqs ? i + 1 : KVC_NONE;
        s->slots[i].gen = 1;
    }
    s->free_head = 0;
    s->next_step = 1;
    *out = s;
    return 0;
oom:
    kvc_seqs_destroy(s);
    return KVC_ENOMEM;
}

/* Take back the references a group's entries [keep, n) hold: the inverse of release_from. */
static void reref(kvc_seqs_t *s, const group_t *gr, uint32_t keep)
{
    for (uint32_t i = keep; i < gr->n; i++)
        if (gr->v[i] != KVC_NONE) {
            int rc = kvc_pool_ref(s->pool, gr->v[i]);
            KVC_ASSERT(rc == 0); /* we dropped this very reference a moment ago */
        }
}

/* Drop the references every group's entries [keep, n) hold, tail first, leaving the tables
 * as they are.  All or nothing: a caller that dropped one of them itself (kvc_pool_unref on a
 * block a sequence holds) would make the pool free a block twice; the pool refuses with
 * KVC_EUNDERFLOW, and the groups already released take their references back. */
static int release_from(kvc_seqs_t *s, seq_t *q, uint32_t keep)
{
    for (uint32_t g = 0; g < s->params.n_groups; g++) {
        group_t *gr = &q->g[g];
        if (gr->n <= keep) continue;
        int rc = kvc_pool_release(s->pool, gr->v + keep, gr->n - keep);
        if (rc) {
            while (g-- > 0) reref(s, &q->g[g], keep);
            return rc;
        }
    }
    return 0;
}

/* Whether release_from(s, q, 0) would succeed, without releasing (a sequence's blocks are
 * distinct, so each needs one reference left). */
static int releasable(const kvc_seqs_t *s, const seq_t *q)
{
    for (uint32_t g = 0; g < s->params.n_groups; g++)
        for (uint32_t i = 0; i < q->g[g].n; i++)
            if (q->g[g].v[i] != KVC_NONE && kvc_pool_refcount(s->pool, q->g[g].v[i]) == 0)
                return KVC_EUNDERFLOW;
    return 0;
}

/* The tables are empty now (their references are gone). */
static void forget_tables(seq_t *q)
{
    for (uint32_t g = 0; g < KVC_MAX_GROUPS; g++) {
        group_t *gr = &q->g[g];
        gr->n = gr->n_released = gr->n_inserted = gr->n_hashed = 0;
        gr->insert_blocked = false;
    }
    q->next_work = q->next_hash = 0;
}

/* Release everything where no caller can be refused (a deferred free, the table's
 * destruction): a block the caller already freed by mistake is skipped, never freed twice. */
static void release_all(kvc_seqs_t *s, seq_t *q)
{
    if (release_from(s, q, 0) != 0)
        for (uint32_t g = 0; g < s->params.n_groups; g++)
            for (uint32_t i = q->g[g].n; i-- > 0;) {
                uint32_t b = q->g[g].v[i];
                if (b != KVC_NONE && kvc_pool_refcount(s->pool, b) > 0)
                    (void)kvc_pool_unref(s->pool, b);
            }
    forget_tables(q);
}

static void free_slot_memory(kvc_seqs_t *s, seq_t *q)
{
    const kvc_allocator_t *a = alloc_of(s);
    kvc_free(a, q->tokens);
    kvc_free(a, q->mm);
    for (uint32_t g = 0; g < KVC_MAX_GROUPS; g++) {
        kvc_free(a, q->g[g].v);
        kvc_free(a, q->g[g].hashes);
        kvc_free(a, q->g[g].fps);
    }
}

void kvc_seqs_destroy(kvc_seqs_t *s)
{
    if (!s) return;
    const kvc_allocator_t a = s->params.allocator;
    if (s->slots) {
        for (uint32_t i = 0; i < s->params.max_seqs; i++) {
            if (s->slots[i].state != SLOT_FREE) release_all(s, &s->slots[i]);
            free_slot_memory(s, &s->slots[i]);
        }
    }
    if (s->steps)
        for (uint32_t i = 0; i < s->params.max_inflight_steps; i++) kvc_free(&a, s->steps[i].rows);
    kvc_free(&a, s->steps);
    kvc_free(&a, s->slots);
    kvc_free(&a, s->scratch);
    kvc_free(&a, s);
}

/* ---- capacity: every array a change needs is grown before the change starts ------------- */
/* Growing is invisible (contents are kept), so an operation that grows first and changes
 * after can fail with KVC_ENOMEM and change nothing. */
static int table_room(kvc_seqs_t *s, seq_t *q, size_t n_blocks)
{
    for (uint32_t g = 0; g < s->params.n_groups; g++) {
        int rc = grow32(s, &q->g[g].v, &q->g[g].cap, n_blocks);
        if (rc) return rc;
    }
    return 0;
}

/* Room for the hashes of n_full full committed blocks in every group. */
static int hash_room(kvc_seqs_t *s, seq_t *q, size_t n_full)
{
    for (uint32_t g = 0; s->pc && g < s->params.n_groups; g++) {
        group_t *gr = &q->g[g];
        if (gr->hash_cap >= n_full) continue;
        size_t hc = gr->hash_cap, fc = gr->hash_cap;
        int rc = grow(s, (void **)&gr->hashes, sizeof(kvc_hash128_t), &hc, n_full);
        if (!rc && sliding(s, g))
            rc = grow(s, (void **)&gr->fps, sizeof(kvc_hash128_t), &fc, n_full);
        if (rc) return rc;
        gr->hash_cap = (uint32_t)hc;
    }
    return 0;
}

/* Everything a sequence of n_tokens known tokens (n_mm multimodal inputs, n_blocks table
 * entries) needs, for a slot about to hold one. */
static int slot_room(kvc_seqs_t *s, seq_t *q, size_t n_tokens, size_t n_mm, size_t n_blocks)
{
    int rc = grow(s, (void **)&q->tokens, sizeof(kvc_token_t), &q->tok_cap, n_tokens);
    if (!rc && n_mm) rc = grow(s, (void **)&q->mm, sizeof(kvc_mm_input_t), &q->mm_cap, n_mm);
    if (!rc) rc = table_room(s, q, n_blocks);
    if (!rc) rc = hash_room(s, q, n_tokens / s->bs);
    return rc;
}

/* Hash every full committed block not hashed yet, in every group (hash_room made room).
 * KVC_ERANGE for a block with more multimodal inputs than a block's extra keys hold: hashing
 * stops there, so that block and the ones after it are never cached. */
static int hash_blocks(kvc_seqs_t *s, seq_t *q)
{
    if (!s->pc || committed(q) < q->next_hash) return 0; /* the common case: no block filled */
    size_t n_full = committed(q) / s->bs;
    int err = 0;
    for (uint32_t g = 0; g < s->params.n_groups; g++) {
        group_t *gr = &q->g[g];
        KVC_ASSERT(gr->hash_cap >= n_full);
        kvc_namespace_t ns;
        kvc_prefix_query_t pq = group_query(s, q, g, &ns, committed(q));
        for (size_t i = gr->n_hashed; i < n_full; i++) {
            int rc = kvc_prefix_hash_next(s->pc, &pq, i, i ? &gr->hashes[i - 1] : NULL,
                                          sliding(s, g) && i ? &gr->fps[i - 1] : NULL,
                                          &gr->hashes[i], sliding(s, g) ? &gr->fps[i] : NULL);
            if (rc) {
                err = rc;
                break;
            }
            gr->n_hashed = (uint32_t)i + 1;
        }
    }
    q->next_hash = (n_full + 1) * s->bs;
    return err;
}

/* After create, no block can fail to hash (create checked every block its inputs touch). */
static void update_hashes(kvc_seqs_t *s, seq_t *q)
{
    (void)hash_blocks(s, q);
}

/* The prompt's last block, if partial, is hashed only once later tokens fill it: check now
 * that its multimodal inputs fit a block's extra keys, so that no later append, accept or
 * beam step can fail on them.  The check hashes the block padded to full length. */
static int check_partial_block(kvc_seqs_t *s, seq_t *q)
{
    size_t n = q->n_prompt, padded = div_up(n, s->bs) * s->bs;
    if (!s->pc || !q->n_mm || padded == n) return 0;
    memset(q->tokens + n, 0, (padded - n) * sizeof(kvc_token_t));
    kvc_namespace_t ns;
    kvc_prefix_query_t pq = group_query(s, q, 0, &ns, padded);
    const kvc_hash128_t zero = {0, 0};
    kvc_hash128_t hash;
    return kvc_prefix_hash_next(s->pc, &pq, padded / s->bs - 1, &zero, NULL, &hash, NULL);
}

int kvc_seq_create(kvc_seqs_t *s, const kvc_seq_desc_t *d, kvc_seq_t *out)
{
    if (!s || !d || !out || !d->prompt || d->n_prompt == 0 || (d->n_mm && !d->mm) ||
        d->priority > KVC_PREFIX_MAX_PRIORITY)
        return KVC_EINVAL;
    for (size_t i = 0; i < d->n_mm; i++) /* inputs lie in the prompt */
        if (d->mm[i].start > d->n_prompt || d->mm[i].length > d->n_prompt - d->mm[i].start)
            return KVC_EINVAL;
    if (s->free_head == KVC_NONE) return KVC_ENOSPC;
    uint32_t slot = s->free_head;
    seq_t *q = &s->slots[slot];
    int rc = slot_room(s, q, div_up(d->n_prompt, s->bs) * s->bs, d->n_mm, 0);
    if (rc) return rc;
    memcpy(q->tokens, d->prompt, d->n_prompt * sizeof(kvc_token_t));
    copy_n(q->mm, d->mm, d->n_mm * sizeof(kvc_mm_input_t));
    q->n_mm = d->n_mm;
    q->ns = d->ns ? *d->ns : (kvc_namespace_t){0};
    q->priority = d->priority;
    q->n_tokens = q->n_prompt = d->n_prompt;
    q->n_draft = q->n_reserved = q->n_computed = q->n_accepted = q->n_emitted = q->n_hit = 0;
    q->n_inflight = 0;
    q->looked_up = false;
    forget_tables(q);
    /* KVC_ERANGE: too many multimodal inputs in one block; the slot stays free */
    if ((rc = hash_blocks(s, q)) || (rc = check_partial_block(s, q))) return rc;
    s->free_head = q->next_free;
    q->state = SLOT_LIVE;
    s->n_live++;
    s->stats.n_created++;
    *out = (kvc_seq_t){.slot = slot, .gen = q->gen};
    return 0;
}

/* The slot goes back to the free list (its blocks are released already). */
static void free_slot(kvc_seqs_t *s, uint32_t slot)
{
    seq_t *q = &s->slots[slot];
    forget_tables(q);
    q->state = SLOT_FREE;
    q->next_free = s->free_head;
    s->free_head = slot;
}

/* The bookkeeping of a destroy whose blocks are released (or, in flight, kept). */
static void retire(kvc_seqs_t *s, uint32_t slot)
{
    seq_t *q = &s->slots[slot];
    q->gen = q->gen + 1 ? q->gen + 1 : 1; /* the handle is stale from now on */
    s->n_live--;
    s->stats.n_destroyed++;
    if (q->n_inflight) {
        q->state = SLOT_ZOMBIE; /* blocks stay until the step completes */
        s->n_zombies++;
        s->stats.n_deferred++;
        return;
    }
    free_slot(s, slot);
}

int kvc_seq_destroy(kvc_seqs_t *s, kvc_seq_t h)
{
    seq_t *q = get(s, h);
    if (!q) return KVC_ESTALE;
    int rc = q->n_inflight ? releasable(s, q) : release_from(s, q, 0);
    if (rc) return rc;
    retire(s, h.slot);
    return 0;
}

int kvc_seq_reset(kvc_seqs_t *s, kvc_seq_t h)
{
    seq_t *q = get(s, h);
    if (!q) return KVC_ESTALE;
    if (q->n_inflight) return KVC_EBUSY;
    int rc = release_from(s, q, 0);
    if (rc) return rc;
    forget_tables(q); /* also forgets hashes; they are recomputed from the tokens */
    q->n_tokens -= q->n_draft;
    q->n_draft = 0;
    q->n_reserved = q->n_computed = 0;
    q->looked_up = false;
    update_hashes(s, q); /* into the arrays that held them: no allocation */
    return 0;
}

/* ---- lookup ----------------------------------------------------------------------- */
static size_t window_first_block(size_t h, uint32_t bs, uint32_t window)
{
    size_t next = h * bs;
    size_t first = next + 1 > window ? next + 1 - window : 0;
    return KVC_MIN(first / bs, h);
}

/* The longest hit valid in every group: full groups need [0, h), sliding groups [first(h), h). */
static int hybrid_hit(kvc_seqs_t *s, seq_t *q, size_t max_hit, size_t *out)
{
    const uint32_t G = s->params.n_groups;
    uint32_t *present = kvc_alloc(alloc_of(s), (max_hit + 1) * G * sizeof(uint32_t), 0);
    uint32_t *run = kvc_alloc(alloc_of(s), (max_hit + 1) * G * sizeof(uint32_t), 0);
    int rc = present && run ? 0 : KVC_ENOMEM;
    size_t h_max = max_hit;
    for (uint32_t g = 0; g < G && !rc; g++) {
        kvc_namespace_t ns;
        kvc_prefix_query_t pq = group_query(s, q, g, &ns, q->n_prompt);
        uint32_t *pg = present + (size_t)g * (max_hit + 1), *rg = run + (size_t)g * (max_hit + 1);
        rc = kvc_prefix_probe(s->pc, &pq, max_hit, pg, NULL);
        for (size_t i = 0; !rc && i < max_hit; i++) {
            rg[i] = pg[i] == KVC_NONE ? 0 : (i ? rg[i - 1] : 0) + 1;
            if (!sliding(s, g) && pg[i] == KVC_NONE) h_max = KVC_MIN(h_max, i);
        }
    }
    size_t h = rc ? 0 : h_max;
    for (; !rc && h > 0; h--) {
        bool ok = true;
        for (uint32_t g = 0; g < G && ok; g++)
            if (sliding(s, g))
                ok = run[(size_t)g * (max_hit + 1) + h - 1] >=
                     h - window_first_block(h, s->bs, s->params.window[g]);
        if (ok) break;
    }
    kvc_free(alloc_of(s), present);
    kvc_free(alloc_of(s), run);
    *out = h;
    return rc;
}

int kvc_seq_lookup(kvc_seqs_t *s, kvc_seq_t h, size_t *n_hit_tokens)
{
    seq_t *q = get(s, h);
    if (!q) return KVC_ESTALE;
    if (q->looked_up || q->n_reserved) return KVC_EBUSY;
    if (n_hit_tokens) *n_hit_tokens = 0;
    if (!s->pc) {
        q->looked_up = true;
        return 0;
    }
    const uint32_t bs = s->bs, G = s->params.n_groups;
    size_t max_hit = (q->n_prompt - 1) / bs, hit = max_hit;
    int rc = table_room(s, q, max_hit);
    if (rc) return rc;
    if (G > 1 && (rc = hybrid_hit(s, q, max_hit, &hit))) return rc;
    for (uint32_t g = 0; g < G; g++) {
        group_t *gr = &q->g[g];
        kvc_namespace_t ns;
        kvc_prefix_query_t pq = group_query(s, q, g, &ns, q->n_prompt);
        kvc_prefix_hit_t ph;
        rc = kvc_prefix_lookup(s->pc, &pq, gr->v, hit, &ph);
        if (!rc && G > 1 && ph.n_hit_blocks != hit)
            rc = KVC_ECORRUPT; /* probe and lookup disagree: a bug, reported, not an abort */
        if (rc) {              /* undo the groups already pinned (a failed lookup pinned nothing) */
            if (rc == KVC_ECORRUPT)
                (void)kvc_pool_release(s->pool, gr->v, (uint32_t)ph.n_hit_blocks);
            for (uint32_t k = 0; k < g; k++) {
                (void)kvc_pool_release(s->pool, q->g[k].v, q->g[k].n);
                q->g[k].n = q->g[k].n_released = q->g[k].n_inserted = 0;
            }
            return rc;
        }
        hit = ph.n_hit_blocks; /* single group: whatever the cache has */
        gr->n = (uint32_t)hit;
        gr->n_released = (uint32_t)ph.first_hit_block;
        gr->n_inserted = (uint32_t)hit;
    }
    q->n_hit = q->n_computed = q->n_reserved = hit * bs;
    q->looked_up = true;
    q->next_work = 0;
    s->stats.n_hit_tokens += q->n_hit;
    if (n_hit_tokens) *n_hit_tokens = q->n_hit;
    return 0;
}

/* ---- reservation -------------------------------------------------------------------- */
/* Blocks group g needs for positions up to `end` (exclusive) from n_reserved: new blocks, and
 * whether the first written block is shared and must be copied. */
static void group_needs(const kvc_seqs_t *s, const seq_t *q, uint32_t g, size_t end,
                        uint32_t *n_new, bool *cow)
{
    const group_t *gr = &q->g[g];
    size_t first = q->n_reserved, new_len = div_up(end, s->bs);
    *n_new = (uint32_t)(new_len > gr->n ? new_len - gr->n : 0);
    *cow = false;
    if (end > first && first % s->bs) {
        uint32_t b = gr->v[first / s->bs];
        *cow = b != KVC_NONE && kvc_pool_refcount(s->pool, b) > 1;
    }
}

int kvc_seq_blocks_needed(const kvc_seqs_t *s, kvc_seq_t h, uint32_t n, uint32_t *n_blocks)
{
    const seq_t *q = get_const(s, h);
    if (!q) return KVC_ESTALE;
    if (!n_blocks || q->n_reserved + n > q->n_tokens) return n_blocks ? KVC_ERANGE : KVC_EINVAL;
    size_t off = q->n_reserved % s->bs;
    if (off && off + n <= s->bs && s->params.n_groups == 1 &&
        kvc_pool_refcount(s->pool, q->g[0].v[q->n_reserved / s->bs]) == 1) {
        *n_blocks = 0; /* a decode step inside a block we alone hold */
        return 0;
    }
    uint32_t total = 0;
    for (uint32_t g = 0; g < s->params.n_groups; g++) {
        uint32_t n_new;
        bool cow;
        group_needs(s, q, g, q->n_reserved + n, &n_new, &cow);
        total += n_new + cow;
    }
    *n_blocks = total;
    return 0;
}

static void copy_block(kvc_seqs_t *s, uint32_t dst, uint32_t src)
{
    if (s->params.on_copy)
        s->params.on_copy(s->params.copy_ctx, dst, src);
    else
        (void)kvc_pool_copy_block(s->pool, dst, src);
    s->stats.n_cow_copies++;
}

static void write_slots(const kvc_seqs_t *s, const seq_t *q, size_t first, uint32_t n,
                        int64_t *slots)
{
    for (uint32_t g = 0; g < s->params.n_groups; g++)
        for (uint32_t i = 0; i < n; i++) {
            size_t pos = first + i;
            slots[(size_t)g * n + i] =
                (int64_t)q->g[g].v[pos / s->bs] * s->bs + (int64_t)(pos % s->bs);
        }
}

/* What reserving positions [n_reserved, end) takes: per group, new blocks and whether the
 * first written block is shared and must be copied. */
typedef struct {
    uint32_t n_new[KVC_MAX_GROUPS];
    bool cow[KVC_MAX_GROUPS];
    uint32_t total; /* blocks from the pool: new ones plus copies */
} plan_t;

static void plan_reserve(const kvc_seqs_t *s, const seq_t *q, size_t end, plan_t *p)
{
    p->total = 0;
    for (uint32_t g = 0; g < s->params.n_groups; g++) {
        group_needs(s, q, g, end, &p->n_new[g], &p->cow[g]);
        p->total += p->n_new[g] + p->cow[g];
    }
}

/* Carry a plan out with blocks[0..p->total), ours (refcount 1): cannot fail (table_room made
 * room). */
static void apply_reserve(kvc_seqs_t *s, seq_t *q, size_t end, const plan_t *p,
                          const uint32_t *blocks)
{
    uint32_t k = 0;
    for (uint32_t g = 0; g < s->params.n_groups; g++) {
        group_t *gr = &q->g[g];
        if (p->cow[g]) { /* copy-on-write: we are not the last sharer of the block we write into */
            size_t i0 = q->n_reserved / s->bs;
            uint32_t src = gr->v[i0], dst = blocks[k++];
            copy_block(s, dst, src);
            (void)kvc_pool_unref(s->pool, src);
            gr->v[i0] = dst;
        }
        for (uint32_t j = 0; j < p->n_new[g]; j++) gr->v[gr->n++] = blocks[k++];
    }
    q->n_reserved = end;
}

int kvc_seq_reserve(kvc_seqs_t *s, kvc_seq_t h, uint32_t n, int64_t *slots)
{
    seq_t *q = get(s, h);
    if (!q) return KVC_ESTALE;
    if (q->n_reserved + n > q->n_tokens) return KVC_ERANGE;
    if (n == 0) return 0;
    /* Fast path (a decode step): the positions fit in the last block, which we alone hold. */
    size_t off = q->n_reserved % s->bs;
    if (off && off + n <= s->bs) {
        bool alone = true;
        for (uint32_t g = 0; g < s->params.n_groups && alone; g++)
            alone = kvc_pool_refcount(s->pool, q->g[g].v[q->n_reserved / s->bs]) == 1;
        if (alone) {
            size_t first = q->n_reserved;
            q->n_reserved += n;
            if (slots) write_slots(s, q, first, n, slots);
            return 0;
        }
    }
    size_t first = q->n_reserved, end = first + n;
    plan_t p;
    plan_reserve(s, q, end, &p);
    /* Capacity first: growing arrays is invisible, so a failure after it changes nothing. */
    int rc = table_room(s, q, div_up(end, s->bs));
    if (!rc) rc = grow(s, (void **)&s->scratch, sizeof(uint32_t), &s->scratch_cap, p.total);
    if (!rc) rc = kvc_pool_alloc(s->pool, p.total, s->scratch);
    if (rc) return rc;
    apply_reserve(s, q, end, &p, s->scratch);
    if (slots) write_slots(s, q, first, n, slots);
    return 0;
}

int kvc_seq_slots(const kvc_seqs_t *s, kvc_seq_t h, uint32_t group, size_t first, uint32_t n,
                  int64_t *slots)
{
    const seq_t *q = get_const(s, h);
    if (!q) return KVC_ESTALE;
    if (group >= s->params.n_groups || (n && !slots)) return KVC_EINVAL;
    if (first + n > q->n_reserved) return KVC_ERANGE;
    for (uint32_t i = 0; i < n; i++) {
        size_t pos = first + i;
        uint32_t b = q->g[group].v[pos / s->bs];
        if (b == KVC_NONE) return KVC_ERANGE;
        slots[i] = (int64_t)b * s->bs + (int64_t)(pos % s->bs);
    }
    return 0;
}

/* ---- completion: insertion and window release ---------------------------------------- */
static void insert_ready(kvc_seqs_t *s, seq_t *q)
{
    size_t limit = KVC_MIN(q->n_computed, committed(q));
    if (limit < q->next_work) return; /* the common case: no block filled, nothing slid out */
    if (s->pc) {
        size_t ready = limit / s->bs;
        for (uint32_t g = 0; g < s->params.n_groups; g++) {
            group_t *gr = &q->g[g];
            if (gr->insert_blocked) continue;
            kvc_namespace_t ns;
            kvc_prefix_query_t pq = group_query(s, q, g, &ns, committed(q));
            for (size_t i = gr->n_inserted; i < ready && i < gr->n_hashed; i++) {
                uint32_t b = gr->v[i], canon;
                if (b == KVC_NONE) { /* released before it could be cached: nothing to chain */
                    gr->n_inserted = (uint32_t)i + 1;
                    continue;
                }
                uint32_t parent = !sliding(s, g) && i ? gr->v[i - 1] : KVC_NONE;
                int rc = kvc_prefix_insert(s->pc, &pq, i, parent, b, &canon);
                if (rc) { /* e.g. too many extra keys: later blocks cannot chain from this one */
                    gr->insert_blocked = true;
                    break;
                }
                if (canon != b) { /* share the identical cached copy, give ours back */
                    /* fails only at the counter's limit (a caller pinning it 2^32 times):
                     * then we keep ours, and the chain cannot continue from it */
                    if (kvc_pool_ref(s->pool, canon)) {
                        gr->insert_blocked = true;
                        break;
                    }
                    (void)kvc_pool_unref(s->pool, b);
                    gr->v[i] = canon;
                    s->stats.n_duplicates_shared++;
                }
                gr->n_inserted = (uint32_t)i + 1;
            }
        }
    }
    /* Sliding groups: release blocks entirely before the window of the next position. */
    for (uint32_t g = 0; g < s->params.n_groups; g++) {
        uint32_t w = s->params.window[g];
        if (!w || limit + 1 <= w) continue;
        group_t *gr = &q->g[g];
        size_t upto = KVC_MIN((limit + 1 - w) / s->bs, gr->n);
        /* never release a block the prefix cache still has to see */
        if (s->pc && !gr->insert_blocked) upto = KVC_MIN(upto, gr->n_inserted);
        for (size_t i = gr->n_released; i < upto; i++) {
            if (gr->v[i] != KVC_NONE) {
                (void)kvc_pool_unref(s->pool, gr->v[i]);
                gr->v[i] = KVC_NONE;
                s->stats.n_window_released++;
            }
        }
        if (upto > gr->n_released) gr->n_released = (uint32_t)upto;
    }
    /* The next limit at which something can happen: a block to insert, or one to release. */
    size_t next = SIZE_MAX;
    for (uint32_t g = 0; g < s->params.n_groups; g++) {
        const group_t *gr = &q->g[g];
        if (s->pc && !gr->insert_blocked)
            next = KVC_MIN(next, ((size_t)gr->n_inserted + 1) * s->bs);
        if (s->params.window[g])
            next = KVC_MIN(next, ((size_t)gr->n_released + 1) * s->bs + s->params.window[g] - 1);
    }
    q->next_work = next;
}

int kvc_seq_complete(kvc_seqs_t *s, kvc_seq_t h, uint32_t n)
{
    seq_t *q = get(s, h);
    if (!q) return KVC_ESTALE;
    if (q->n_computed + n > q->n_reserved) return KVC_ERANGE;
    q->n_computed += n;
    insert_ready(s, q); /* the hashes are up to date: the tokens' own calls made them */
    return 0;
}

/* Append n known tokens (room made by the caller). */
static void push_tokens(seq_t *q, const kvc_token_t *tokens, uint32_t n)
{
    copy_n(q->tokens + q->n_tokens, tokens, (size_t)n * sizeof(kvc_token_t));
    q->n_tokens += n;
}

int kvc_seq_append(kvc_seqs_t *s, kvc_seq_t h, const kvc_token_t *tokens, uint32_t n)
{
    seq_t *q = get(s, h);
    if (!q) return KVC_ESTALE;
    if (n && !tokens) return KVC_EINVAL;
    if (q->n_draft) return KVC_EBUSY;
    int rc = grow(s, (void **)&q->tokens, sizeof(kvc_token_t), &q->tok_cap, q->n_tokens + n);
    if (!rc) rc = hash_room(s, q, (committed(q) + n) / s->bs);
    if (rc) return rc;
    push_tokens(q, tokens, n);
    update_hashes(s, q);
    insert_ready(s, q);
    return 0;
}

/* ---- drafts -------------------------------------------------------------------------- */
int kvc_seq_draft(kvc_seqs_t *s, kvc_seq_t h, const kvc_token_t *tokens, uint32_t n)
{
    seq_t *q = get(s, h);
    if (!q) return KVC_ESTALE;
    if (n && !tokens) return KVC_EINVAL;
    int rc = grow(s, (void **)&q->tokens, sizeof(kvc_token_t), &q->tok_cap, q->n_tokens + n);
    if (rc) return rc;
    push_tokens(q, tokens, n); /* drafts are never hashed: they are not committed */
    q->n_draft += n;
    s->stats.n_drafted += n;
    return 0;
}

/* Remove the last n drafts: blocks that covered only their positions go back to the pool
 * (tail first), counts and tokens go back.  All or nothing (KVC_EUNDERFLOW, from
 * release_from). */
static int rollback(kvc_seqs_t *s, seq_t *q, uint32_t n)
{
    size_t n_tokens = q->n_tokens - n, n_reserved = KVC_MIN(q->n_reserved, n_tokens);
    uint32_t keep = (uint32_t)div_up(n_reserved, s->bs);
    int rc = release_from(s, q, keep);
    if (rc) return rc;
    for (uint32_t g = 0; g < s->params.n_groups; g++) q->g[g].n = KVC_MIN(q->g[g].n, keep);
    q->n_tokens = n_tokens;
    q->n_draft -= n;
    q->n_reserved = n_reserved;
    q->n_computed = KVC_MIN(q->n_computed, n_tokens);
    s->stats.n_rolled_back += n;
    return 0;
}

int kvc_seq_rollback(kvc_seqs_t *s, kvc_seq_t h, uint32_t n)
{
    seq_t *q = get(s, h);
    if (!q) return KVC_ESTALE;
    if (n > q->n_draft) return KVC_ERANGE;
    return rollback(s, q, n);
}

int kvc_seq_accept(kvc_seqs_t *s, kvc_seq_t h, uint32_t n_accepted)
{
    seq_t *q = get(s, h);
    if (!q) return KVC_ESTALE;
    if (n_accepted > q->n_draft) return KVC_ERANGE;
    uint32_t rejected = (uint32_t)q->n_draft - n_accepted;
    /* room for the hashes of the blocks the accepted drafts fill, before anything changes */
    int rc = hash_room(s, q, (committed(q) + n_accepted) / s->bs);
    if (!rc && rejected) rc = rollback(s, q, rejected);
    if (rc) return rc;
    q->n_draft = 0;
    q->n_accepted += n_accepted;
    s->stats.n_accepted += n_accepted;
    update_hashes(s, q);
    insert_ready(s, q);
    return 0;
}

int kvc_seq_emit(kvc_seqs_t *s, kvc_seq_t h, uint32_t n)
{
    seq_t *q = get(s, h);
    if (!q) return KVC_ESTALE;
    if (q->n_emitted + n > committed(q) - q->n_prompt) return KVC_ERANGE;
    q->n_emitted += n;
    return 0;
}

/* ---- forks and beams ------------------------------------------------------------------ */
/* Room in slot c for a child of p that will then append `extra` tokens and reserve them. */
static int child_room(kvc_seqs_t *s, seq_t *c, const seq_t *p, size_t extra)
{
    return slot_room(s, c, p->n_tokens + extra, p->n_mm, div_up(p->n_reserved + extra, s->bs));
}

/* KVC_EOVERFLOW if giving each of p's blocks `extra` more references would pass the pool's
 * counter limit (only a caller that pins blocks itself gets near it). */
static int refs_fit(const kvc_seqs_t *s, const seq_t *p, uint32_t extra)
{
    for (uint32_t g = 0; g < s->params.n_groups; g++)
        for (uint32_t i = 0; i < p->g[g].n; i++)
            if (p->g[g].v[i] != KVC_NONE &&
                kvc_pool_refcount(s->pool, p->g[g].v[i]) > UINT32_MAX - extra)
                return KVC_EOVERFLOW;
    return 0;
}

/* Make the head of the free list a child of p: same tokens, counts, hashes and blocks (one
 * more reference each).  Cannot fail: child_room and refs_fit were checked. */
static void fork_commit(kvc_seqs_t *s, seq_t *p, kvc_seq_t *child)
{
    uint32_t slot = s->free_head;
    seq_t *c = &s->slots[slot];
    memcpy(c->tokens, p->tokens, p->n_tokens * sizeof(kvc_token_t));
    copy_n(c->mm, p->mm, p->n_mm * sizeof(kvc_mm_input_t));
    c->n_mm = p->n_mm;
    c->ns = p->ns;
    c->priority = p->priority;
    c->n_tokens = p->n_tokens;
    c->n_prompt = p->n_prompt;
    c->n_draft = p->n_draft;
    c->n_reserved = p->n_reserved;
    c->n_computed = p->n_computed;
    c->n_accepted = p->n_accepted;
    c->n_emitted = p->n_emitted;
    c->n_hit = p->n_hit;
    c->looked_up = true;
    c->n_inflight = 0;
    c->next_work = c->next_hash = 0;
    for (uint32_t g = 0; g < s->params.n_groups; g++) {
        group_t *cg = &c->g[g];
        const group_t *pg = &p->g[g];
        copy_n(cg->v, pg->v, pg->n * sizeof(uint32_t));
        for (uint32_t i = 0; i < pg->n; i++)
            if (pg->v[i] != KVC_NONE) {
                int rc = kvc_pool_ref(s->pool, pg->v[i]);
                KVC_ASSERT(rc == 0); /* refs_fit */
            }
        cg->n = pg->n;
        cg->n_released = pg->n_released;
        cg->n_inserted = pg->n_inserted;
        cg->insert_blocked = pg->insert_blocked;
        cg->n_hashed = pg->n_hashed;
        if (s->pc) {
            copy_n(cg->hashes, pg->hashes, pg->n_hashed * sizeof(kvc_hash128_t));
            if (sliding(s, g)) copy_n(cg->fps, pg->fps, pg->n_hashed * sizeof(kvc_hash128_t));
        }
    }
    s->free_head = c->next_free;
    c->state = SLOT_LIVE;
    s->n_live++;
    s->stats.n_created++;
    s->stats.n_forks++;
    *child = (kvc_seq_t){.slot = slot, .gen = c->gen};
}

int kvc_seq_fork(kvc_seqs_t *s, kvc_seq_t parent, kvc_seq_t *child)
{
    seq_t *p = get(s, parent);
    if (!p) return KVC_ESTALE;
    if (!child) return KVC_EINVAL;
    if (p->n_reserved != p->n_computed || p->n_draft) return KVC_EBUSY;
    if (s->free_head == KVC_NONE) return KVC_ENOSPC;
    int rc = child_room(s, &s->slots[s->free_head], p, 0);
    if (!rc) rc = refs_fit(s, p, 1);
    if (rc) return rc;
    fork_commit(s, p, child);
    return 0;
}

/* Blocks the survivors of a beam step take from the pool, with the dead beams' references
 * already dropped: per group, a new block for each new beam at a block boundary; inside a
 * block, each distinct last block is copied by all its writers but the last, or by all of
 * them if a table outside the step also holds it.  What the reservations will then take,
 * exactly: a shared partial block is held, at the same index, only by the tables forked from
 * the one that filled it so far. */
static uint32_t beam_blocks_needed(const kvc_seqs_t *s, const kvc_seq_t *beams, uint32_t n_beams,
                                   const uint32_t *children)
{
    uint32_t need = 0;
    for (uint32_t g = 0; g < s->params.n_groups; g++)
        for (uint32_t i = 0; i < n_beams; i++) {
            if (!children[i]) continue;
            const seq_t *q = &s->slots[beams[i].slot];
            if (q->n_reserved % s->bs == 0) {
                need += children[i];
                continue;
            }
            size_t idx = q->n_reserved / s->bs;
            uint32_t b = q->g[g].v[idx], writers = 0, holders = 0;
            bool first_holder = true;
            for (uint32_t k = 0; k < n_beams; k++) {
                const seq_t *o = &s->slots[beams[k].slot];
                if (!children[k] || o->n_reserved % s->bs == 0 || o->n_reserved / s->bs != idx ||
                    o->g[g].v[idx] != b)
                    continue;
                writers += children[k];
                holders++;
                if (k < i) first_holder = false;
            }
            if (!first_holder) continue; /* counted at its first holder */
            bool outsiders = kvc_pool_refcount(s->pool, b) > holders;
            need += outsiders ? writers : writers - 1;
        }
    return need;
}

int kvc_seq_beam_step(kvc_seqs_t *s, const kvc_seq_t *beams, uint32_t n_beams,
                      const kvc_beam_choice_t *choices, uint32_t n_choices, kvc_seq_t *new_beams,
                      int64_t *slots)
{
    if (!s || (n_beams && !beams) || (n_choices && (!choices || !new_beams)) ||
        n_beams > KVC_MAX_BEAMS || n_beams > s->params.max_seqs)
        return KVC_EINVAL;
    /* ---- 1. Check and make room for everything, changing nothing visible. */
    uint32_t children[KVC_MAX_BEAMS], used[KVC_MAX_BEAMS];
    memset(children, 0, n_beams * sizeof(uint32_t));
    for (uint32_t i = 0; i < n_beams; i++) {
        seq_t *q = get(s, beams[i]);
        if (!q) return KVC_ESTALE;
        if (q->n_reserved != q->n_computed || q->n_computed != q->n_tokens || q->n_draft)
            return KVC_EBUSY;
        for (uint32_t j = 0; j < i; j++)
            if (kvc_seq_eq(beams[i], beams[j])) return KVC_EINVAL;
    }
    for (uint32_t j = 0; j < n_choices; j++) {
        if (choices[j].parent >= n_beams) return KVC_EINVAL;
        children[choices[j].parent]++;
    }
    /* Slots: a dead beam's slot is free for a fork only if no step in flight keeps it. */
    uint32_t n_forks = 0, n_dead_free = 0;
    for (uint32_t i = 0; i < n_beams; i++) {
        const seq_t *q = &s->slots[beams[i].slot];
        n_forks += children[i] > 1 ? children[i] - 1 : 0;
        n_dead_free += !children[i] && !q->n_inflight;
    }
    if (s->params.max_seqs - s->n_live - s->n_zombies + n_dead_free < n_forks) return KVC_ENOSPC;
    /* Array room, for the survivors and for each fork's slot: the dead beams' slots (their
     * frees push them, in beam order, onto the free list) and then the free list's own. */
    int rc = 0;
    for (uint32_t i = 0; i < n_beams && !rc; i++)
        if (children[i]) {
            seq_t *q = &s->slots[beams[i].slot];
            rc = child_room(s, q, q, 1);
            if (!rc && children[i] > 1) rc = refs_fit(s, q, n_forks);
        } else if (s->slots[beams[i].slot].n_inflight) {
            rc = releasable(s, &s->slots[beams[i].slot]); /* a deferred destroy's check */
        }
    uint32_t dead_left = n_dead_free, dead_at = n_beams, free_at = s->free_head;
    memset(used, 0, n_beams * sizeof(uint32_t));
    for (uint32_t j = 0; j < n_choices && !rc; j++) {
        if (used[choices[j].parent]++ == 0) continue;
        uint32_t slot;
        if (dead_left) { /* the last dead beam freed is the first slot taken */
            while (children[--dead_at] || s->slots[beams[dead_at].slot].n_inflight) {
            }
            slot = beams[dead_at].slot;
            dead_left--;
        } else {
            slot = free_at;
            free_at = s->slots[slot].next_free;
        }
        rc = child_room(s, &s->slots[slot], &s->slots[beams[choices[j].parent].slot], 1);
    }
    /* the blocks: at most one per group for each new beam (a new one or a copy) */
    if (!rc)
        rc = grow(s, (void **)&s->scratch, sizeof(uint32_t), &s->scratch_cap,
                  (size_t)n_choices * s->params.n_groups);
    if (rc) return rc;

    /* ---- 2. Drop the dead beams' references first: a survivor may become the last holder of
     *         a shared block and then writes into it in place instead of copying.  Then take
     *         every block the survivors need at once; if the pool cannot give them, the dead
     *         beams take their references back and nothing has changed. */
    uint32_t n_released = 0;
    for (uint32_t i = 0; i < n_beams && !rc; i++) {
        seq_t *q = &s->slots[beams[i].slot];
        if (children[i] || q->n_inflight) continue; /* in flight: its blocks stay */
        rc = release_from(s, q, 0);
        n_released += !rc;
    }
    uint32_t need = rc ? 0 : beam_blocks_needed(s, beams, n_beams, children);
    if (!rc) rc = kvc_pool_alloc(s->pool, need, s->scratch);
    if (rc) { /* KVC_EUNDERFLOW from a dead beam, or KVC_ENOSPC / KVC_EBUSY from the pool */
        for (uint32_t i = 0; i < n_beams && n_released; i++) {
            seq_t *q = &s->slots[beams[i].slot];
            if (children[i] || q->n_inflight) continue;
            for (uint32_t g = 0; g < s->params.n_groups; g++) reref(s, &q->g[g], 0);
            n_released--;
        }
        return rc;
    }

    /* ---- 3. Nothing can fail from here on. */
    for (uint32_t i = 0; i < n_beams; i++)
        if (!children[i]) retire(s, beams[i].slot);
    /* Each parent's first choice continues the parent, the others fork from it.  All forks
     * happen before any write, so that copies go to all but the last writer. */
    memset(used, 0, n_beams * sizeof(uint32_t));
    for (uint32_t j = 0; j < n_choices; j++) {
        uint32_t p = choices[j].parent;
        if (used[p]++ == 0)
            new_beams[j] = beams[p];
        else
            fork_commit(s, &s->slots[beams[p].slot], &new_beams[j]);
    }
    /* Append and reserve: the writers that are not the last holder copy. */
    uint32_t taken = 0;
    for (uint32_t j = 0; j < n_choices; j++) {
        seq_t *q = &s->slots[new_beams[j].slot];
        push_tokens(q, &choices[j].token, 1);
        update_hashes(s, q);
        size_t pos = q->n_reserved;
        plan_t plan;
        plan_reserve(s, q, pos + 1, &plan);
        KVC_ASSERT(taken + plan.total <= need); /* beam_blocks_needed counts what this takes */
        apply_reserve(s, q, pos + 1, &plan, s->scratch + taken);
        taken += plan.total;
        if (!slots) continue;
        for (uint32_t g = 0; g < s->params.n_groups; g++)
            slots[(size_t)g * n_choices + j] =
                (int64_t)q->g[g].v[pos / s->bs] * s->bs + (int64_t)(pos % s->bs);
    }
    KVC_ASSERT(taken == need);
    return 0;
}

/* ---- steps ------------------------------------------------------------------------------ */
int kvc_step_launch(kvc_seqs_t *s, const kvc_seq_t *rows, uint32_t n_rows, kvc_step_id_t *id)
{
    if (!s || !id || (n_rows && !rows) || n_rows > s->params.max_batch) return KVC_EINVAL;
    step_t *rec = NULL;
    for (uint32_t i = 0; i < s->params.max_inflight_steps && !rec; i++)
        if (s->steps[i].id == 0) rec = &s->steps[i];
    if (!rec) return KVC_EBUSY;
    uint64_t epoch = ++s->mark_epoch;
    for (uint32_t i = 0; i < n_rows; i++) {
        seq_t *q = get(s, rows[i]);
        if (!q) return KVC_ESTALE;
        if (q->mark == epoch) return KVC_EINVAL; /* the same sequence twice */
        q->mark = epoch;
    }
    for (uint32_t i = 0; i < n_rows; i++) s->slots[rows[i].slot].n_inflight++;
    copy_n(rec->rows, rows, n_rows * sizeof(kvc_seq_t));
    rec->n_rows = n_rows;
    rec->id = s->next_step++;
    *id = rec->id;
    return 0;
}

int kvc_step_complete(kvc_seqs_t *s, kvc_step_id_t id, const kvc_seq_t *rows, uint32_t n_rows,
                      bool *live)
{
    if (!s || (n_rows && !rows)) return KVC_EINVAL;
    step_t *rec = NULL;
    for (uint32_t i = 0; i < s->params.max_inflight_steps && !rec; i++)
        if (id && s->steps[i].id == id) rec = &s->steps[i];
    if (!rec || rec->n_rows != n_rows) {
        s->stats.n_rejected_completions++;
        return KVC_ESTALE;
    }
    for (uint32_t i = 0; i < n_rows; i++)
        if (!kvc_seq_eq(rec->rows[i], rows[i])) {
            s->stats.n_rejected_completions++;
            return KVC_ESTALE;
        }
    for (uint32_t i = 0; i < n_rows; i++) {
        seq_t *q = &s->slots[rows[i].slot];
        KVC_ASSERT(q->n_inflight > 0);
        q->n_inflight--;
        bool is_live = q->state == SLOT_LIVE && q->gen == rows[i].gen;
        if (live) live[i] = is_live;
        if (q->state == SLOT_ZOMBIE && q->n_inflight == 0) {
            s->n_zombies--;
            release_all(s, q); /* skips a block the caller freed meanwhile, never frees twice */
            free_slot(s, rows[i].slot);
        }
    }
    rec->id = 0;
    return 0;
}

/* ---- reading ------------------------------------------------------------------------------ */
int kvc_seq_info(const kvc_seqs_t *s, kvc_seq_t h, kvc_seq_info_t *out)
{
    const seq_t *q = get_const(s, h);
    if (!q) return KVC_ESTALE;
    if (!out) return KVC_EINVAL;
    *out = (kvc_seq_info_t){.n_prompt = q->n_prompt,
                            .n_tokens = q->n_tokens,
                            .n_draft = q->n_draft,
                            .n_reserved = q->n_reserved,
                            .n_computed = q->n_computed,
                            .n_accepted = q->n_accepted,
                            .n_emitted = q->n_emitted,
                            .n_hit_tokens = q->n_hit,
                            .n_inflight = q->n_inflight};
    uint32_t committed_blocks = (uint32_t)div_up(committed(q), s->bs);
    for (uint32_t g = 0; g < s->params.n_groups; g++) {
        const group_t *gr = &q->g[g];
        out->n_blocks[g] = gr->n - gr->n_released;
        if (gr->n > committed_blocks) out->n_draft_blocks += gr->n - committed_blocks;
    }
    return 0;
}

int kvc_seq_tokens(const kvc_seqs_t *s, kvc_seq_t h, const kvc_token_t **tokens, size_t *n)
{
    const seq_t *q = get_const(s, h);
    if (!q) return KVC_ESTALE;
    if (!tokens || !n) return KVC_EINVAL;
    *tokens = q->tokens;
    *n = q->n_tokens;
    return 0;
}

int kvc_seq_table(const kvc_seqs_t *s, kvc_seq_t h, uint32_t group, const uint32_t **table,
                  uint32_t *n_blocks)
{
    const seq_t *q = get_const(s, h);
    if (!q) return KVC_ESTALE;
    if (group >= s->params.n_groups || !table || !n_blocks) return KVC_EINVAL;
    *table = q->g[group].v;
    *n_blocks = q->g[group].n;
    return 0;
}

int kvc_seqs_csr(const kvc_seqs_t *s, const kvc_seq_t *rows, uint32_t n_rows, uint32_t group,
                 uint32_t *indptr, uint32_t *indices, size_t indices_cap, uint32_t *last_page_len)
{
    if (!s || (n_rows && (!rows || !last_page_len)) || !indptr || group >= s->params.n_groups)
        return KVC_EINVAL;
    size_t at = 0;
    indptr[0] = 0;
    for (uint32_t i = 0; i < n_rows; i++) {
        const seq_t *q = get_const(s, rows[i]);
        if (!q) return KVC_ESTALE;
        const group_t *gr = &q->g[group];
        if (at + gr->n > indices_cap || (gr->n && !indices)) return KVC_ERANGE;
        if (gr->n) memcpy(indices + at, gr->v, gr->n * sizeof(uint32_t));
        at += gr->n;
        indptr[i + 1] = (uint32_t)at;
        last_page_len[i] = gr->n ? (uint32_t)(q->n_reserved - (size_t)(gr->n - 1) * s->bs) : 0;
    }
    return 0;
}

void kvc_seqs_stats(const kvc_seqs_t *s, kvc_seqs_stats_t *out)
{
    *out = s->stats;
    out->n_live = s->n_live;
    out->n_zombies = s->n_zombies;
    uint32_t inflight = 0;
    for (uint32_t i = 0; i < s->params.max_inflight_steps; i++) inflight += s->steps[i].id != 0;
    out->n_steps_inflight = inflight;
}

/* ---- invariants ----------------------------------------------------------------------------- */
#define fail(msg, cap, ...) kvc__msgf(KVC_ECORRUPT, msg, cap, __VA_ARGS__)

int kvc_seqs_check(const kvc_seqs_t *s, char *msg, size_t cap)
{
    int rc = s->pc ? kvc_prefix_check(s->pc, msg, cap) : kvc_pool_check(s->pool, msg, cap);
    if (rc) return rc;
    /* Blocks at or above the pool's high-water mark were never handed out: no table may hold
     * one, and counting stops there, so the check touches no more memory than the run used. */
    const uint32_t n_blocks = kvc__pool_high_water(s->pool), bs = s->bs;
    uint32_t *refs = kvc__pool_check_scratch(s->pool); /* never allocates: see pool_int.h */
    memset(refs, 0, n_blocks * sizeof *refs);
    uint32_t live = 0, zombies = 0;
    for (uint32_t slot = 0; slot < s->params.max_seqs && !rc; slot++) {
        const seq_t *q = &s->slots[slot];
        if (q->state == SLOT_FREE) continue;
        live += q->state == SLOT_LIVE;
        zombies += q->state == SLOT_ZOMBIE;
        if (q->state == SLOT_ZOMBIE && q->n_inflight == 0)
            rc = fail(msg, cap, "slot %u: zombie with no step in flight", slot);
        if (!(q->n_computed <= q->n_reserved && q->n_reserved <= q->n_tokens &&
              q->n_draft <= q->n_tokens && q->n_prompt <= committed(q) &&
              q->n_emitted <= committed(q) - q->n_prompt))
            rc = fail(
                msg, cap,
                "slot %u: counts out of order (tokens %zu draft %zu reserved %zu computed %zu)",
                slot, q->n_tokens, q->n_draft, q->n_reserved, q->n_computed);
        for (uint32_t g = 0; g < s->params.n_groups && !rc; g++) {
            const group_t *gr = &q->g[g];
            if (gr->n != div_up(q->n_reserved, bs))
                rc = fail(msg, cap, "slot %u group %u: %u blocks for %zu reserved positions", slot,
                          g, gr->n, q->n_reserved);
            for (uint32_t i = 0; i < gr->n && !rc; i++) {
                uint32_t b = gr->v[i];
                if (b == KVC_NONE) {
                    if (!sliding(s, g) || i >= gr->n_released)
                        rc = fail(msg, cap, "slot %u group %u: hole at block %u", slot, g, i);
                    continue;
                }
                if (b >= n_blocks) {
                    rc = fail(msg, cap, "slot %u group %u: block id %u, never handed out", slot,
                              g, b);
                    break;
                }
                refs[b]++;
                /* invariant 7: positions about to be written are in blocks no one else holds */
                size_t first_pos = (size_t)i * bs, end_pos = first_pos + bs;
                if (end_pos > q->n_computed && first_pos < q->n_reserved &&
                    q->n_reserved > q->n_computed && kvc_pool_refcount(s->pool, b) != 1)
                    rc = fail(msg, cap, "slot %u group %u: block %u is written while shared", slot,
                              g, b);
                if (s->pc && i < gr->n_inserted && i < gr->n_hashed &&
                    kvc_pool_is_cached(s->pool, b)) {
                    kvc_hash128_t hh;
                    if (kvc_prefix_block_hash(s->pc, b, &hh) || !kvc_hash128_eq(hh, gr->hashes[i]))
                        rc = fail(msg, cap, "slot %u group %u: block %u carries another hash", slot,
                                  g, i);
                }
            }
            if (!rc && s->pc && gr->n_hashed > committed(q) / bs)
                rc =
                    fail(msg, cap, "slot %u group %u: hashes beyond the committed tokens", slot, g);
        }
    }
    for (uint32_t b = 0; b < n_blocks && !rc; b++)
        if (refs[b] != kvc_pool_refcount(s->pool, b))
            rc = fail(msg, cap, "block %u: refcount %u, held by %u tables", b,
                      kvc_pool_refcount(s->pool, b), refs[b]);
    if (!rc && (live != s->n_live || zombies != s->n_zombies))
        rc = fail(msg, cap, "%u live and %u zombie slots, counters say %u and %u", live, zombies,
                  s->n_live, s->n_zombies);
    return rc;
}

kvc_pool_t *kvc_seqs_pool(const kvc_seqs_t *seqs)
{
    return seqs->pool;
}
