/* host.c - the host-memory tier: an arena of fixed-size record slots of its own, found
 * through the slot index and evicted least recently used first.  Every operation is O(1);
 * nothing allocates after create.  Records keep their checksum in memory too, so a stray
 * write into the arena is caught on the next get rather than handed to the engine. */
#include "tier/tier_int.h"

#include <string.h>

typedef struct {
    kvc__tier_base_t base;
    kvc__tier_index_t ix;
    unsigned char *arena; /* (n_slots, record_bytes) */
} host_t;

static unsigned char *slot_rec(host_t *h, uint32_t slot)
{
    return h->arena + (size_t)slot * h->base.record_bytes;
}

static int host_put(kvc_tier_store_t *s, const kvc_tier_key_t *key, const void *data,
                    kvc_tier_put_status_t *status)
{
    host_t *h = (host_t *)s;
    const kvc_namespace_t *ns = kvc__tier_key_ns(key);
    uint32_t slot = kvc__tier_index_find(&h->ix, key->hash, ns);
    if (slot != KVC_NONE && kvc__tier_record_verify(slot_rec(h, slot), h->base.record_bytes, key,
                                                    s->block_bytes, s->block_tokens) == 0) {
        kvc__tier_index_touch(&h->ix, slot);
        h->base.st.n_put_present++;
        *status = KVC_TIER_PUT_PRESENT;
        return 0;
    }
    if (!kvc__tier_admit(&h->base, key)) {
        *status = KVC_TIER_PUT_NOT_ADMITTED;
        return 0;
    }
    if (!kvc__tier_budget_take(&h->base, h->base.record_bytes)) {
        *status = KVC_TIER_PUT_OVER_BUDGET;
        return 0;
    }
    if (slot != KVC_NONE) { /* same hash and namespace, other (or broken) record: replace */
        kvc__tier_index_unlink(&h->ix, slot);
    } else {
        slot = kvc__tier_index_take_free(&h->ix);
        if (slot == KVC_NONE) {
            slot = kvc__tier_index_lru(&h->ix);
            kvc__tier_index_unlink(&h->ix, slot);
            h->base.st.n_evictions++;
        }
    }
    kvc__tier_record_encode(slot_rec(h, slot), key, data, s->block_bytes, 0);
    kvc__tier_index_insert(&h->ix, slot, key->hash, ns);
    h->base.st.n_puts++;
    h->base.st.bytes_written += h->base.record_bytes;
    *status = KVC_TIER_PUT_STORED;
    return 0;
}

static int host_get(kvc_tier_store_t *s, const kvc_tier_key_t *key, void *out)
{
    host_t *h = (host_t *)s;
    uint32_t slot = kvc__tier_index_find(&h->ix, key->hash, kvc__tier_key_ns(key));
    if (slot == KVC_NONE) return KVC_ENOENT;
    const unsigned char *rec = slot_rec(h, slot);
    int rc =
        kvc__tier_record_verify(rec, h->base.record_bytes, key, s->block_bytes, s->block_tokens);
    if (rc) {
        if (rc == KVC_ECHECKSUM)
            h->base.st.n_corrupt++;
        else
            h->base.st.n_mismatch++;
        kvc__tier_index_remove(&h->ix, slot);
        return KVC_ENOENT;
    }
    memcpy(out, rec + kvc__tier_payload_offset(s->block_tokens), s->block_bytes);
    kvc__tier_index_touch(&h->ix, slot);
    h->base.st.bytes_read += h->base.record_bytes;
    return 0;
}

static int host_contains(kvc_tier_store_t *s, const kvc_tier_key_t *key)
{
    host_t *h = (host_t *)s;
    return kvc__tier_index_find(&h->ix, key->hash, kvc__tier_key_ns(key)) != KVC_NONE;
}

static int host_del(kvc_tier_store_t *s, const kvc_tier_key_t *key)
{
    host_t *h = (host_t *)s;
    uint32_t slot = kvc__tier_index_find(&h->ix, key->hash, kvc__tier_key_ns(key));
    if (slot == KVC_NONE) return KVC_ENOENT;
    kvc__tier_index_remove(&h->ix, slot);
    return 0;
}

static void host_stats(const kvc_tier_store_t *s, kvc_tier_stats_t *out)
{
    const host_t *h = (const host_t *)s;
    out->n_records = h->ix.n_used;
    out->capacity_records = h->ix.n_slots;
}

static int host_check(const kvc__tier_base_t *b, char *msg, size_t cap)
{
    return kvc__tier_index_check(&((const host_t *)b)->ix, msg, cap);
}

static void host_destroy(kvc_tier_store_t *s)
{
    host_t *h = (host_t *)s;
    kvc_allocator_t a = h->base.p.allocator;
    kvc__tier_index_deinit(&h->ix);
    kvc__tier_base_deinit(&h->base);
    kvc_free(&a, h->arena);
    kvc_free(&a, h);
}

static const kvc_tier_ops_t host_ops = {
    .name = "host",
    .put = host_put,
    .get = host_get,
    .contains = host_contains,
    .del = host_del,
    .stats = host_stats,
    .destroy = host_destroy,
};

int kvc_tier_host_create(const kvc_tier_params_t *params, kvc_tier_store_t **out)
{
    if (!params || !out) return KVC_EINVAL;
    size_t rec = kvc__tier_record_size(params->block_bytes, params->block_tokens);
    if (rec == 0 || params->capacity_bytes < rec) return KVC_EINVAL;
    uint64_t n = params->capacity_bytes / rec;
    if (n > (1u << 30)) return KVC_EINVAL;
    host_t *h = kvc_calloc(&params->allocator, 1, sizeof *h, 64);
    if (!h) return KVC_ENOMEM;
    int rc = kvc__tier_base_init(&h->base, &host_ops, params);
    if (rc == 0) rc = kvc__tier_index_init(&h->ix, (uint32_t)n, &params->allocator);
    if (rc == 0) {
        h->arena = kvc_alloc(&params->allocator, (size_t)n * rec, 64);
        if (!h->arena) rc = KVC_ENOMEM;
    }
    if (rc) {
        kvc__tier_index_deinit(&h->ix);
        kvc__tier_base_deinit(&h->base);
        kvc_free(&params->allocator, h);
        return rc;
    }
    h->base.check = host_check;
    *out = &h->base.pub;
    return 0;
}

unsigned char *kvc__tier_host_record(kvc_tier_store_t *s, const kvc_tier_key_t *key)
{
    if (!s || s->ops != &host_ops) return NULL;
    host_t *h = (host_t *)s;
    uint32_t slot = kvc__tier_index_find(&h->ix, key->hash, kvc__tier_key_ns(key));
    return slot == KVC_NONE ? NULL : slot_rec(h, slot);
}
