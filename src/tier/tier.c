/* tier.c - the block-store interface (see include/kvcache/tier.h): the record format and
 * its verification, the slot index, the admission and write-budget gates, the counters,
 * the checked wrappers every call goes through, and the command-line forms.  The backends
 * (host.c, disk.c, redis.c) only move records. */
#include "tier/tier_int.h"
#include "util/msg.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "kvcache/plan.h" /* kvc_plan_parse_bytes: the one size parser (plan uses only util) */

/* ---- the record ---------------------------------------------------------------- */
size_t kvc__tier_record_size(size_t block_bytes, uint32_t block_tokens)
{
    if (block_bytes == 0 || block_tokens == 0 || block_tokens > KVC__TIER_MAX_TOKENS) return 0;
    size_t head = kvc__tier_payload_offset(block_tokens);
    if (block_bytes > SIZE_MAX - head) return 0;
    return head + block_bytes;
}

size_t kvc_tier_record_bytes(size_t block_bytes, uint32_t block_tokens)
{
    return kvc__tier_record_size(block_bytes, block_tokens);
}

const kvc_namespace_t *kvc__tier_key_ns(const kvc_tier_key_t *key)
{
    static const kvc_namespace_t zero;
    return key->ns ? key->ns : &zero;
}

bool kvc__tier_ns_eq(const kvc_namespace_t *a, const kvc_namespace_t *b)
{
    return a->weight_epoch == b->weight_epoch && a->lora_id == b->lora_id && a->group == b->group &&
           memcmp(a->salt, b->salt, KVC_SALT_BYTES) == 0;
}

kvc_hash128_t kvc__tier_ns_digest(const kvc_namespace_t *ns)
{
    /* Fields one after another, no padding, so equal namespaces digest equally. */
    uint8_t buf[8 + 8 + KVC_SALT_BYTES + 4];
    memcpy(buf, &ns->weight_epoch, 8);
    memcpy(buf + 8, &ns->lora_id, 8);
    memcpy(buf + 16, ns->salt, KVC_SALT_BYTES);
    memcpy(buf + 16 + KVC_SALT_BYTES, &ns->group, 4);
    XXH128_hash_t h = XXH3_128bits_withSeed(buf, sizeof buf, 0x6b7663746965726eull);
    return (kvc_hash128_t){h.low64, h.high64};
}

static uint64_t hdr_sum(const kvc__tier_hdr_t *h)
{
    kvc__tier_hdr_t t = *h;
    t.hdr_checksum = 0;
    t.checksum = 0;
    return XXH3_64bits_withSeed(&t, sizeof t, 0x68647221u);
}

static uint64_t record_sum(const void *rec, size_t len)
{
    /* The header with its checksum field zeroed, then the rest as it is. */
    kvc__tier_hdr_t t;
    memcpy(&t, rec, sizeof t);
    t.checksum = 0;
    /* Zeroed first (xxhash.h: XXH3_INITSTATE): libxxhash 0.8.1's reset_withSeed keeps the
     * state's old secret when its seed field already equals the seed and extSecret is NULL,
     * so a stack state over a previous call's frame could hash with garbage as its secret
     * (seen as random checksum failures of 128 KiB records in bench_tier). */
    XXH3_state_t st;
    memset(&st, 0, sizeof st);
    XXH3_64bits_reset_withSeed(&st, 0x72656364u);
    XXH3_64bits_update(&st, &t, sizeof t);
    XXH3_64bits_update(&st, (const char *)rec + sizeof t, len - sizeof t);
    return XXH3_64bits_digest(&st);
}

void kvc__tier_record_encode(void *rec, const kvc_tier_key_t *key, const void *payload,
                             size_t block_bytes, uint64_t seq)
{
    const kvc_namespace_t *ns = kvc__tier_key_ns(key);
    kvc__tier_hdr_t h;
    memset(&h, 0, sizeof h);
    h.magic = KVC__TIER_MAGIC;
    h.version = KVC__TIER_VERSION;
    h.payload_bytes = block_bytes;
    h.n_tokens = key->n_tokens;
    h.depth = key->depth;
    h.hash = key->hash;
    h.parent_hash = key->parent_hash;
    h.fingerprint = key->fingerprint;
    h.weight_epoch = ns->weight_epoch;
    h.lora_id = ns->lora_id;
    memcpy(h.salt, ns->salt, KVC_SALT_BYTES);
    h.group = ns->group;
    h.seq = seq;
    h.hdr_checksum = hdr_sum(&h);
    char *p = rec;
    memcpy(p + sizeof h, key->tokens, (size_t)key->n_tokens * sizeof(kvc_token_t));
    memcpy(p + kvc__tier_payload_offset(key->n_tokens), payload, block_bytes);
    memcpy(p, &h, sizeof h);
    size_t len = kvc__tier_payload_offset(key->n_tokens) + block_bytes;
    h.checksum = record_sum(p, len);
    memcpy(p + offsetof(kvc__tier_hdr_t, checksum), &h.checksum, sizeof h.checksum);
}

bool kvc__tier_hdr_valid(const void *hdr, size_t block_bytes, uint32_t block_tokens)
{
    kvc__tier_hdr_t h;
    memcpy(&h, hdr, sizeof h);
    return h.magic == KVC__TIER_MAGIC && h.version == KVC__TIER_VERSION &&
           h.payload_bytes == block_bytes && h.n_tokens == block_tokens &&
           h.hdr_checksum == hdr_sum(&h);
}

int kvc__tier_record_verify(const void *rec, size_t len, const kvc_tier_key_t *key,
                            size_t block_bytes, uint32_t block_tokens)
{
    size_t want = kvc__tier_record_size(block_bytes, block_tokens);
    if (len != want || !kvc__tier_hdr_valid(rec, block_bytes, block_tokens)) return KVC_ECHECKSUM;
    kvc__tier_hdr_t h;
    memcpy(&h, rec, sizeof h);
    if (h.checksum != record_sum(rec, len)) return KVC_ECHECKSUM;
    /* The bytes are the ones that were written; now are they the block asked for? */
    const kvc_namespace_t *ns = kvc__tier_key_ns(key);
    kvc_namespace_t rns;
    memset(&rns, 0, sizeof rns);
    rns.weight_epoch = h.weight_epoch;
    rns.lora_id = h.lora_id;
    memcpy(rns.salt, h.salt, KVC_SALT_BYTES);
    rns.group = h.group;
    if (!kvc_hash128_eq(h.hash, key->hash) || !kvc_hash128_eq(h.parent_hash, key->parent_hash) ||
        !kvc_hash128_eq(h.fingerprint, key->fingerprint) || !kvc__tier_ns_eq(&rns, ns) ||
        memcmp((const char *)rec + sizeof h, key->tokens,
               (size_t)block_tokens * sizeof(kvc_token_t)) != 0)
        return KVC_ENOENT;
    return 0;
}

/* ---- the slot index ------------------------------------------------------------ */
static uint32_t bucket_of(const kvc__tier_index_t *ix, kvc_hash128_t hash,
                          const kvc_namespace_t *ns)
{
    /* The block hash is already uniform; mix in the namespace's cheap fields so that one
     * block in many namespaces spreads over buckets too. */
    uint64_t x = hash.lo ^ (ns->weight_epoch * 0x9e3779b97f4a7c15ull) ^
                 (ns->lora_id * 0xc2b2ae3d27d4eb4full) ^ ((uint64_t)ns->group << 32) ^
                 ((uint64_t)ns->salt[0] << 8 | ns->salt[31]);
    x ^= x >> 29;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 32;
    return (uint32_t)(x & ix->mask);
}

int kvc__tier_index_init(kvc__tier_index_t *ix, uint32_t n_slots, const kvc_allocator_t *a)
{
    memset(ix, 0, sizeof *ix);
    if (n_slots == 0 || n_slots > (1u << 30)) return KVC_EINVAL;
    if (a) ix->alloc = *a;
    uint32_t nb = 1;
    while (nb < n_slots) nb <<= 1;
    ix->slots = kvc_calloc(&ix->alloc, n_slots, sizeof *ix->slots, 64);
    ix->buckets = kvc_alloc(&ix->alloc, (size_t)nb * sizeof(uint32_t), 64);
    if (!ix->slots || !ix->buckets) {
        kvc_free(&ix->alloc, ix->slots);
        kvc_free(&ix->alloc, ix->buckets);
        memset(ix, 0, sizeof *ix);
        return KVC_ENOMEM;
    }
    ix->n_slots = n_slots;
    ix->mask = nb - 1;
    memset(ix->buckets, 0xff, (size_t)nb * sizeof(uint32_t));
    kvc_list_init(&ix->lru);
    kvc_list_init(&ix->free);
    for (uint32_t i = 0; i < n_slots; i++) {
        ix->slots[i].next = KVC_NONE;
        kvc_list_push_back(&ix->free, &ix->slots[i].lru);
    }
    return 0;
}

void kvc__tier_index_deinit(kvc__tier_index_t *ix)
{
    if (!ix->slots) return;
    kvc_free(&ix->alloc, ix->slots);
    kvc_free(&ix->alloc, ix->buckets);
    memset(ix, 0, sizeof *ix);
}

uint32_t kvc__tier_index_find(const kvc__tier_index_t *ix, kvc_hash128_t hash,
                              const kvc_namespace_t *ns)
{
    for (uint32_t i = ix->buckets[bucket_of(ix, hash, ns)]; i != KVC_NONE; i = ix->slots[i].next) {
        const kvc__tier_slot_t *s = &ix->slots[i];
        if (kvc_hash128_eq(s->hash, hash) && kvc__tier_ns_eq(&s->ns, ns)) return i;
    }
    return KVC_NONE;
}

uint32_t kvc__tier_index_take_free(kvc__tier_index_t *ix)
{
    if (kvc_list_empty(&ix->free)) return KVC_NONE;
    kvc_list_t *n = ix->free.next;
    kvc_list_remove(n);
    return (uint32_t)(kvc_container_of(n, kvc__tier_slot_t, lru) - ix->slots);
}

static void link_slot(kvc__tier_index_t *ix, uint32_t slot, kvc_hash128_t hash,
                      const kvc_namespace_t *ns)
{
    kvc__tier_slot_t *s = &ix->slots[slot];
    KVC_ASSERT(!s->used && !kvc_list_linked(&s->lru));
    s->hash = hash;
    s->ns = *ns;
    s->used = true;
    uint32_t b = bucket_of(ix, hash, ns);
    s->next = ix->buckets[b];
    ix->buckets[b] = slot;
    ix->n_used++;
}

void kvc__tier_index_insert(kvc__tier_index_t *ix, uint32_t slot, kvc_hash128_t hash,
                            const kvc_namespace_t *ns)
{
    link_slot(ix, slot, hash, ns);
    kvc_list_push_front(&ix->lru, &ix->slots[slot].lru);
}

void kvc__tier_index_insert_oldest(kvc__tier_index_t *ix, uint32_t slot, kvc_hash128_t hash,
                                   const kvc_namespace_t *ns)
{
    link_slot(ix, slot, hash, ns);
    kvc_list_push_back(&ix->lru, &ix->slots[slot].lru);
}

void kvc__tier_index_unlink(kvc__tier_index_t *ix, uint32_t slot)
{
    kvc__tier_slot_t *s = &ix->slots[slot];
    KVC_ASSERT(s->used);
    uint32_t *p = &ix->buckets[bucket_of(ix, s->hash, &s->ns)];
    while (*p != slot) {
        KVC_ASSERT(*p != KVC_NONE);
        p = &ix->slots[*p].next;
    }
    *p = s->next;
    s->next = KVC_NONE;
    s->used = false;
    kvc_list_remove(&s->lru);
    ix->n_used--;
}

void kvc__tier_index_release(kvc__tier_index_t *ix, uint32_t slot)
{
    kvc__tier_slot_t *s = &ix->slots[slot];
    KVC_ASSERT(!s->used && !kvc_list_linked(&s->lru));
    kvc_list_push_back(&ix->free, &s->lru);
}

void kvc__tier_index_remove(kvc__tier_index_t *ix, uint32_t slot)
{
    kvc__tier_index_unlink(ix, slot);
    kvc__tier_index_release(ix, slot);
}

void kvc__tier_index_touch(kvc__tier_index_t *ix, uint32_t slot)
{
    kvc_list_t *n = &ix->slots[slot].lru;
    kvc_list_remove(n);
    kvc_list_push_front(&ix->lru, n);
}

uint32_t kvc__tier_index_lru(const kvc__tier_index_t *ix)
{
    if (kvc_list_empty(&ix->lru)) return KVC_NONE;
    return (uint32_t)(kvc_container_of(ix->lru.prev, kvc__tier_slot_t, lru) - ix->slots);
}

int kvc__tier_index_check(const kvc__tier_index_t *ix, char *msg, size_t cap)
{
    uint32_t n_lru = 0, n_free = 0, n_chained = 0;
    for (const kvc_list_t *n = ix->lru.next; n != &ix->lru; n = n->next) {
        const kvc__tier_slot_t *s = kvc_container_of(n, kvc__tier_slot_t, lru);
        if (!s->used) return kvc__msgf(KVC_ECORRUPT, msg, cap, "unused slot in the LRU");
        if (++n_lru > ix->n_slots) return kvc__msgf(KVC_ECORRUPT, msg, cap, "LRU loops");
    }
    for (const kvc_list_t *n = ix->free.next; n != &ix->free; n = n->next) {
        const kvc__tier_slot_t *s = kvc_container_of(n, kvc__tier_slot_t, lru);
        if (s->used) return kvc__msgf(KVC_ECORRUPT, msg, cap, "used slot on the free list");
        if (++n_free > ix->n_slots) return kvc__msgf(KVC_ECORRUPT, msg, cap, "free list loops");
    }
    for (uint32_t b = 0; b <= ix->mask; b++)
        for (uint32_t i = ix->buckets[b]; i != KVC_NONE; i = ix->slots[i].next) {
            const kvc__tier_slot_t *s = &ix->slots[i];
            if (!s->used || bucket_of(ix, s->hash, &s->ns) != b)
                return kvc__msgf(KVC_ECORRUPT, msg, cap, "slot %u misplaced in bucket %u", i, b);
            if (kvc__tier_index_find(ix, s->hash, &s->ns) != i)
                return kvc__msgf(KVC_ECORRUPT, msg, cap, "identity of slot %u indexed twice", i);
            if (++n_chained > ix->n_slots)
                return kvc__msgf(KVC_ECORRUPT, msg, cap, "bucket chains loop");
        }
    if (n_lru != ix->n_used || n_chained != ix->n_used)
        return kvc__msgf(KVC_ECORRUPT, msg, cap, "%u used, %u in the LRU, %u chained", ix->n_used,
                         n_lru, n_chained);
    if (n_free > ix->n_slots - ix->n_used)
        return kvc__msgf(KVC_ECORRUPT, msg, cap, "%u free of %u slots, %u used", n_free,
                         ix->n_slots, ix->n_used);
    return 0;
}

/* ---- the base ------------------------------------------------------------------- */
static uint64_t default_clock(void *ctx)
{
    (void)ctx;
    return kvc_now_ns();
}

kvc_tier_params_t kvc_tier_params_default(void)
{
    return (kvc_tier_params_t){
        .admission = {KVC_TIER_ADMIT_ALWAYS, 0},
        .timeout_ms = 100,
        .backoff_ms = 50,
    };
}

uint64_t kvc__tier_now(const kvc__tier_base_t *b)
{
    return b->p.clock_ns ? b->p.clock_ns(b->p.clock_ctx) : default_clock(NULL);
}

int kvc__tier_base_init(kvc__tier_base_t *b, const kvc_tier_ops_t *ops,
                        const kvc_tier_params_t *params)
{
    size_t rec = kvc__tier_record_size(params->block_bytes, params->block_tokens);
    if (rec == 0 || (unsigned)params->admission.kind >= KVC_TIER_ADMIT__COUNT ||
        params->admission.min_depth > (1u << 31))
        return KVC_EINVAL;
    b->pub.ops = ops;
    b->pub.block_bytes = params->block_bytes;
    b->pub.block_tokens = params->block_tokens;
    b->p = *params;
    b->p.model_id = NULL; /* the redis backend keeps its own copy */
    if (b->p.timeout_ms == 0) b->p.timeout_ms = 100;
    if (b->p.backoff_ms == 0) b->p.backoff_ms = 50;
    b->record_bytes = rec;
    if (b->p.write_budget_per_day) {
        b->budget_burst = b->p.write_budget_burst ? (double)b->p.write_budget_burst
                                                  : (double)b->p.write_budget_per_day / 24.0;
        b->budget_tokens = b->budget_burst;
    }
    if (params->admission.kind == KVC_TIER_ADMIT_SECOND_HIT) {
        uint32_t n = params->ghost_entries ? params->ghost_entries : 4096;
        int rc = kvc__tier_index_init(&b->ghost, n, &params->allocator);
        if (rc) return rc;
    }
    return 0;
}

void kvc__tier_base_deinit(kvc__tier_base_t *b)
{
    kvc__tier_index_deinit(&b->ghost);
}

static void ghost_remember(kvc__tier_base_t *b, const kvc_tier_key_t *key)
{
    const kvc_namespace_t *ns = kvc__tier_key_ns(key);
    uint32_t g = kvc__tier_index_find(&b->ghost, key->hash, ns);
    if (g != KVC_NONE) {
        kvc__tier_index_touch(&b->ghost, g);
        return;
    }
    g = kvc__tier_index_take_free(&b->ghost);
    if (g == KVC_NONE) { /* full: forget the oldest sighting (bounded, invariant 12) */
        g = kvc__tier_index_lru(&b->ghost);
        kvc__tier_index_unlink(&b->ghost, g);
    }
    kvc__tier_index_insert(&b->ghost, g, key->hash, ns);
}

bool kvc__tier_admit(kvc__tier_base_t *b, const kvc_tier_key_t *key)
{
    bool ok = true;
    switch (b->p.admission.kind) {
    case KVC_TIER_ADMIT_ALWAYS:
        break;
    case KVC_TIER_ADMIT_SECOND_HIT: {
        uint32_t g = kvc__tier_index_find(&b->ghost, key->hash, kvc__tier_key_ns(key));
        if (g != KVC_NONE)
            kvc__tier_index_remove(&b->ghost, g); /* seen before: admit, and forget it */
        else {
            ghost_remember(b, key);
            ok = false;
        }
        break;
    }
    case KVC_TIER_ADMIT_DEPTH:
        ok = key->depth >= b->p.admission.min_depth;
        break;
    default:
        ok = false;
        break;
    }
    if (!ok) b->st.n_admission_refused++;
    return ok;
}

void kvc__tier_note_miss(kvc__tier_base_t *b, const kvc_tier_key_t *key)
{
    if (b->p.admission.kind == KVC_TIER_ADMIT_SECOND_HIT) ghost_remember(b, key);
}

bool kvc__tier_budget_take(kvc__tier_base_t *b, uint64_t bytes)
{
    if (!b->p.write_budget_per_day) return true;
    uint64_t now = kvc__tier_now(b);
    if (!b->budget_started) {
        b->budget_started = true;
        b->budget_last_ns = now;
    }
    if (now > b->budget_last_ns) {
        double rate = (double)b->p.write_budget_per_day / 86400e9; /* bytes per ns */
        b->budget_tokens += (double)(now - b->budget_last_ns) * rate;
        if (b->budget_tokens > b->budget_burst) b->budget_tokens = b->budget_burst;
        b->budget_last_ns = now;
    }
    if (b->budget_tokens < (double)bytes) {
        b->st.n_budget_refused++;
        return false;
    }
    b->budget_tokens -= (double)bytes;
    return true;
}

static const uint64_t lat_bounds[KVC_TIER_LAT_BUCKETS - 1] = {
    10000,   25000,    50000,    100000,   250000,    500000,    1000000,    2500000,
    5000000, 10000000, 25000000, 50000000, 100000000, 250000000, 1000000000,
};

const uint64_t *kvc_tier_latency_bounds_ns(void)
{
    return lat_bounds;
}

void kvc__tier_observe_latency(kvc__tier_base_t *b, uint64_t ns)
{
    size_t i = 0;
    while (i < KVC_ARRAY_LEN(lat_bounds) && ns > lat_bounds[i]) i++;
    b->st.latency_counts[i]++;
    b->st.latency_sum_ns += ns;
}

/* ---- the checked wrappers ----------------------------------------------------------- */
static bool key_ok(const kvc_tier_store_t *s, const kvc_tier_key_t *key)
{
    return key && key->tokens && key->n_tokens == s->block_tokens &&
           (!key->ns || key->ns->group < KVC_MAX_GROUPS);
}

int kvc_tier_put(kvc_tier_store_t *s, const kvc_tier_key_t *key, const void *data,
                 kvc_tier_put_status_t *status)
{
    if (!s || !data || !key_ok(s, key)) return KVC_EINVAL;
    kvc_tier_put_status_t st = KVC_TIER_PUT_FAULT;
    int rc = s->ops->put(s, key, data, &st);
    if (rc == 0 && status) *status = st;
    return rc;
}

int kvc_tier_get(kvc_tier_store_t *s, const kvc_tier_key_t *key, void *out)
{
    if (!s || !out || !key_ok(s, key)) return KVC_EINVAL;
    kvc__tier_base_t *b = kvc__tier_base(s);
    uint64_t t0 = kvc__tier_now(b);
    int rc = s->ops->get(s, key, out);
    kvc__tier_observe_latency(b, kvc__tier_now(b) - t0);
    if (rc == 0)
        b->st.n_hits++;
    else {
        b->st.n_misses++;
        kvc__tier_note_miss(b, key);
        rc = KVC_ENOENT;
    }
    return rc;
}

int kvc_tier_contains(kvc_tier_store_t *s, const kvc_tier_key_t *key)
{
    if (!s || !key_ok(s, key)) return KVC_EINVAL;
    return s->ops->contains(s, key);
}

int kvc_tier_delete(kvc_tier_store_t *s, const kvc_tier_key_t *key)
{
    if (!s || !key_ok(s, key)) return KVC_EINVAL;
    int rc = s->ops->del(s, key);
    if (rc == 0) kvc__tier_base(s)->st.n_deletes++;
    return rc;
}

int kvc_tier_get_many(kvc_tier_store_t *s, const kvc_tier_key_t *keys, void *const *out, size_t n,
                      int *results)
{
    if (!s || (n && (!keys || !out || !results))) return KVC_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (!key_ok(s, &keys[i]) || !out[i]) return KVC_EINVAL;
    if (n > INT32_MAX) return KVC_EINVAL;
    int hits = 0;
    if (!s->ops->get_many) {
        for (size_t i = 0; i < n; i++) {
            results[i] = kvc_tier_get(s, &keys[i], out[i]);
            hits += results[i] == 0;
        }
        return hits;
    }
    kvc__tier_base_t *b = kvc__tier_base(s);
    uint64_t t0 = kvc__tier_now(b);
    int rc = s->ops->get_many(s, keys, out, n, results);
    if (rc < 0) return rc;
    /* One batch is one fetch for the histogram: that is what a run's deadline meets. */
    if (n) kvc__tier_observe_latency(b, kvc__tier_now(b) - t0);
    for (size_t i = 0; i < n; i++) {
        if (results[i] == 0) {
            b->st.n_hits++;
            hits++;
        } else {
            results[i] = KVC_ENOENT;
            b->st.n_misses++;
            kvc__tier_note_miss(b, &keys[i]);
        }
    }
    return hits;
}

int kvc_tier_put_many(kvc_tier_store_t *s, const kvc_tier_key_t *keys, const void *const *data,
                      size_t n, kvc_tier_put_status_t *status)
{
    if (!s || (n && (!keys || !data))) return KVC_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (!key_ok(s, &keys[i]) || !data[i]) return KVC_EINVAL;
    if (!s->ops->put_many) {
        for (size_t i = 0; i < n; i++) {
            kvc_tier_put_status_t st = KVC_TIER_PUT_FAULT;
            int rc = s->ops->put(s, &keys[i], data[i], &st);
            if (rc) return rc; /* cannot happen: the keys were checked */
            if (status) status[i] = st;
        }
        return 0;
    }
    return s->ops->put_many(s, keys, data, n, status);
}

void kvc_tier_stats(const kvc_tier_store_t *s, kvc_tier_stats_t *out)
{
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!s) return;
    *out = kvc__tier_cbase(s)->st;
    if (s->ops->stats) s->ops->stats(s, out);
}

const char *kvc_tier_name(const kvc_tier_store_t *s)
{
    return s ? s->ops->name : "?";
}

void kvc_tier_destroy(kvc_tier_store_t *s)
{
    if (s) s->ops->destroy(s);
}

int kvc_tier_check(const kvc_tier_store_t *s, char *msg, size_t msg_cap)
{
    if (!s) return KVC_EINVAL;
    const kvc__tier_base_t *b = kvc__tier_cbase(s);
    if (b->ghost.slots) {
        int rc = kvc__tier_index_check(&b->ghost, msg, msg_cap);
        if (rc) return rc;
    }
    return b->check ? b->check(b, msg, msg_cap) : 0;
}

/* ---- names and the command-line forms -------------------------------------------------- */
static const char *const adm_names[] = {
#define KVC__TIER_ADM_NAME(id, name, summary) name,
    KVC_TIER_ADMISSION_MAP(KVC__TIER_ADM_NAME)
#undef KVC__TIER_ADM_NAME
};

const char *kvc_tier_admission_name(kvc_tier_admission_kind_t k)
{
    return (unsigned)k < KVC_TIER_ADMIT__COUNT ? adm_names[k] : "?";
}

static bool parse_u32(const char *s, uint32_t max, uint32_t *out)
{
    if (!isdigit((unsigned char)*s)) return false;
    uint64_t v = 0;
    for (; *s; s++) {
        if (!isdigit((unsigned char)*s)) return false;
        v = v * 10 + (uint64_t)(*s - '0');
        if (v > max) return false;
    }
    *out = (uint32_t)v;
    return true;
}

int kvc_tier_admission_parse(const char *s, kvc_tier_admission_t *out)
{
    if (!s || !out) return KVC_EINVAL;
    if (strcmp(s, "always") == 0) {
        *out = (kvc_tier_admission_t){KVC_TIER_ADMIT_ALWAYS, 0};
        return 0;
    }
    if (strcmp(s, "second-hit") == 0) {
        *out = (kvc_tier_admission_t){KVC_TIER_ADMIT_SECOND_HIT, 0};
        return 0;
    }
    uint32_t n;
    if (strncmp(s, "depth:", 6) == 0 && parse_u32(s + 6, 1u << 31, &n)) {
        *out = (kvc_tier_admission_t){KVC_TIER_ADMIT_DEPTH, n};
        return 0;
    }
    return KVC_EINVAL;
}

const char *kvc_tier_kind_name(kvc_tier_kind_t k)
{
    switch (k) {
    case KVC_TIER_HOST:
        return "host";
    case KVC_TIER_DISK:
        return "disk";
    case KVC_TIER_REDIS:
        return "redis";
    }
    return "?";
}

const char *kvc_tier_mode_name(kvc_tier_mode_t m)
{
    switch (m) {
    case KVC_TIER_MODE_EVICT:
        return "evict";
    case KVC_TIER_MODE_WRITE_THROUGH:
        return "write-through";
    }
    return "?";
}

static bool copy_str(char *dst, size_t cap, const char *src, size_t n)
{
    if (n >= cap) return false;
    memcpy(dst, src, n);
    dst[n] = '\0';
    return true;
}

/* A redis prefix or model id: 1..63 bytes, no ':' (the key's separator), no whitespace or
 * control bytes. */
static bool key_part_ok(const char *s, size_t n)
{
    if (n == 0 || n >= KVC_TIER_PREFIX_MAX) return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == ':' || c <= ' ' || c == 0x7f) return false;
    }
    return true;
}

static int parse_size(const char *s, size_t n, uint64_t *out)
{
    char buf[64];
    if (!copy_str(buf, sizeof buf, s, n)) return KVC_EINVAL;
    uint64_t v;
    if (kvc_plan_parse_bytes(buf, &v) || v == 0) return KVC_EINVAL;
    *out = v;
    return 0;
}

/* A positive finite decimal number that fills [s, s + n) up to a unit suffix: its value and
 * where the suffix starts.  false for no digits, a sign, a hex or inf/nan spelling. */
static bool parse_number(const char *s, size_t n, double *v, const char **unit)
{
    char buf[64];
    size_t k = 0;
    while (k < n && k + 1 < sizeof buf &&
           (isdigit((unsigned char)s[k]) || s[k] == '.' ||
            ((s[k] == 'e' || s[k] == 'E') && k + 1 < n &&
             (isdigit((unsigned char)s[k + 1]) || s[k + 1] == '-' || s[k + 1] == '+')) ||
            ((s[k] == '-' || s[k] == '+') && k > 0 && (s[k - 1] == 'e' || s[k - 1] == 'E'))))
        k++;
    if (k == 0 || k + 1 >= sizeof buf || !isdigit((unsigned char)s[0])) return false;
    memcpy(buf, s, k);
    buf[k] = 0;
    char *end;
    double x = strtod(buf, &end);
    if (end != buf + k || !isfinite(x) || !(x > 0)) return false;
    *v = x;
    *unit = s + k;
    return true;
}

/* "RATE": a number and a unit, bytes (B/s, KB/s, MB/s, GB/s, TB/s: powers of 1000; KiB/s,
 * MiB/s, GiB/s, TiB/s: of 1024) or bits (Kbit/s, Mbit/s, Gbit/s, Tbit/s: 1000s of bits).
 * 0 and a value that is not finite are refused. */
static int parse_rate(const char *s, size_t n, double *out)
{
    static const struct {
        const char *unit;
        double scale;
    } units[] = {{"B/s", 1},           {"KB/s", 1e3},           {"MB/s", 1e6},
                 {"GB/s", 1e9},        {"TB/s", 1e12},          {"KiB/s", 1024.0},
                 {"MiB/s", 1048576.0}, {"GiB/s", 1073741824.0}, {"TiB/s", 1099511627776.0},
                 {"Kbit/s", 1e3 / 8},  {"Mbit/s", 1e6 / 8},     {"Gbit/s", 1e9 / 8},
                 {"Tbit/s", 1e12 / 8}};
    double v;
    const char *u;
    if (!parse_number(s, n, &v, &u)) return KVC_EINVAL;
    size_t un = (size_t)(s + n - u);
    for (size_t i = 0; i < KVC_ARRAY_LEN(units); i++)
        if (strlen(units[i].unit) == un && strncmp(u, units[i].unit, un) == 0) {
            double r = v * units[i].scale;
            if (!isfinite(r) || !(r > 0)) return KVC_EINVAL;
            *out = r;
            return 0;
        }
    return KVC_EINVAL;
}

/* "TIME": a number and ns, us, ms or s.  0 is refused (a tier without a round trip is none). */
static int parse_time(const char *s, size_t n, double *out)
{
    static const struct {
        const char *unit;
        double scale;
    } units[] = {{"ns", 1e-9}, {"us", 1e-6}, {"ms", 1e-3}, {"s", 1}};
    double v;
    const char *u;
    if (!parse_number(s, n, &v, &u)) return KVC_EINVAL;
    size_t un = (size_t)(s + n - u);
    for (size_t i = 0; i < KVC_ARRAY_LEN(units); i++)
        if (strlen(units[i].unit) == un && strncmp(u, units[i].unit, un) == 0) {
            double r = v * units[i].scale;
            if (!isfinite(r) || !(r > 0) || r > 1e6) return KVC_EINVAL;
            *out = r;
            return 0;
        }
    return KVC_EINVAL;
}

int kvc_tier_spec_parse(const char *s, kvc_tier_spec_t *out, char *msg, size_t msg_cap)
{
    if (!s || !out) return kvc__msgf(KVC_EINVAL, msg, msg_cap, "no tier given");
    kvc_tier_spec_t t;
    memset(&t, 0, sizeof t);
    /* Options after the first ',' (a path with a ',' is not supported: documented). */
    const char *comma = strchr(s, ',');
    size_t body = comma ? (size_t)(comma - s) : strlen(s);
    int mode_opt = -1;
    for (const char *o = comma; o; o = strchr(o + 1, ',')) {
        const char *end = strchr(o + 1, ',');
        size_t n = end ? (size_t)(end - o - 1) : strlen(o + 1);
        if (n == 10 && strncmp(o + 1, "mode=evict", 10) == 0)
            mode_opt = KVC_TIER_MODE_EVICT;
        else if (n == 18 && strncmp(o + 1, "mode=write-through", 18) == 0)
            mode_opt = KVC_TIER_MODE_WRITE_THROUGH;
        else if (n > 3 && strncmp(o + 1, "bw=", 3) == 0) {
            if (parse_rate(o + 4, n - 3, &t.bandwidth_Bps))
                return kvc__msgf(KVC_EINVAL, msg, msg_cap,
                                 "tier '%s': bad bandwidth '%.*s' (e.g. bw=25GB/s, bw=1.25GB/s, "
                                 "bw=10Gbit/s)",
                                 s, (int)n, o + 1);
        } else if (n > 4 && strncmp(o + 1, "rtt=", 4) == 0) {
            if (parse_time(o + 5, n - 4, &t.rtt_s))
                return kvc__msgf(KVC_EINVAL, msg, msg_cap,
                                 "tier '%s': bad round-trip time '%.*s' (e.g. rtt=5us, rtt=0.5ms, "
                                 "rtt=80ms)",
                                 s, (int)n, o + 1);
        } else
            return kvc__msgf(KVC_EINVAL, msg, msg_cap,
                             "tier '%s': unknown option '%.*s' (mode=evict, mode=write-through, "
                             "bw=RATE or rtt=TIME)",
                             s, (int)n, o + 1);
    }
    if (body > 5 && strncmp(s, "host:", 5) == 0) {
        t.kind = KVC_TIER_HOST;
        if (parse_size(s + 5, body - 5, &t.capacity_bytes))
            return kvc__msgf(KVC_EINVAL, msg, msg_cap, "tier '%s': bad size (host:SIZE)", s);
    } else if (body > 5 && strncmp(s, "disk:", 5) == 0) {
        t.kind = KVC_TIER_DISK;
        const char *p = s + 5;
        const char *last = NULL;
        for (const char *q = p; q < s + body; q++)
            if (*q == ':') last = q;
        if (!last || last == p)
            return kvc__msgf(KVC_EINVAL, msg, msg_cap, "tier '%s': want disk:PATH:SIZE", s);
        if (!copy_str(t.path, sizeof t.path, p, (size_t)(last - p)))
            return kvc__msgf(KVC_EINVAL, msg, msg_cap, "tier '%s': path too long", s);
        if (parse_size(last + 1, (size_t)(s + body - last - 1), &t.capacity_bytes))
            return kvc__msgf(KVC_EINVAL, msg, msg_cap, "tier '%s': bad size (disk:PATH:SIZE)", s);
    } else if (body > 8 && strncmp(s, "redis://", 8) == 0) {
        t.kind = KVC_TIER_REDIS;
        t.mode = KVC_TIER_MODE_WRITE_THROUGH;
        const char *h = s + 8, *end = s + body;
        const char *slash = memchr(h, '/', (size_t)(end - h));
        const char *hp_end = slash ? slash : end;
        const char *colon = NULL;
        for (const char *q = h; q < hp_end; q++)
            if (*q == ':') colon = q;
        if (!colon || colon == h)
            return kvc__msgf(KVC_EINVAL, msg, msg_cap, "tier '%s': want redis://HOST:PORT", s);
        for (const char *q = h; q < colon; q++)
            if (!isalnum((unsigned char)*q) && *q != '.' && *q != '-' && *q != '_')
                return kvc__msgf(KVC_EINVAL, msg, msg_cap, "tier '%s': bad host", s);
        if (!copy_str(t.host, sizeof t.host, h, (size_t)(colon - h)))
            return kvc__msgf(KVC_EINVAL, msg, msg_cap, "tier '%s': host too long", s);
        char port[8];
        uint32_t pv;
        if (!copy_str(port, sizeof port, colon + 1, (size_t)(hp_end - colon - 1)) ||
            !parse_u32(port, 65535, &pv) || pv == 0)
            return kvc__msgf(KVC_EINVAL, msg, msg_cap, "tier '%s': bad port (1..65535)", s);
        t.port = (uint16_t)pv;
        if (slash) {
            size_t n = (size_t)(end - slash - 1);
            if (!key_part_ok(slash + 1, n))
                return kvc__msgf(KVC_EINVAL, msg, msg_cap,
                                 "tier '%s': bad prefix (1..63 bytes, no ':' or spaces)", s);
            copy_str(t.prefix, sizeof t.prefix, slash + 1, n);
        } else
            strcpy(t.prefix, "kvc");
    } else
        return kvc__msgf(KVC_EINVAL, msg, msg_cap,
                         "tier '%s': want host:SIZE, disk:PATH:SIZE or redis://HOST:PORT[/PREFIX]",
                         s);
    if (mode_opt >= 0) t.mode = (kvc_tier_mode_t)mode_opt; /* the last one given wins */
    *out = t;
    return 0;
}

int kvc_tier_budget_parse(const char *s, uint64_t *bytes_per_day)
{
    if (!s || !bytes_per_day) return KVC_EINVAL;
    const char *slash = strrchr(s, '/');
    if (!slash || (strcmp(slash + 1, "day") != 0 && strcmp(slash + 1, "d") != 0)) return KVC_EINVAL;
    uint64_t v;
    if (parse_size(s, (size_t)(slash - s), &v)) return KVC_EINVAL;
    *bytes_per_day = v;
    return 0;
}

int kvc_tier_create(const kvc_tier_spec_t *spec, const kvc_tier_params_t *params,
                    kvc_tier_store_t **out)
{
    if (!spec || !params || !out) return KVC_EINVAL;
    kvc_tier_params_t p = *params;
    p.capacity_bytes = spec->capacity_bytes;
    switch (spec->kind) {
    case KVC_TIER_HOST:
        return kvc_tier_host_create(&p, out);
    case KVC_TIER_DISK:
        return kvc_tier_disk_create(spec->path, &p, out);
    case KVC_TIER_REDIS:
        return kvc_tier_redis_create(spec->host, spec->port, spec->prefix, &p, out);
    }
    return KVC_EINVAL;
}
