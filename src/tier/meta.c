/* meta.c - the index-only tier: the host store's slot index, admission, write budget and
 * counters without its arena.  The simulator models a host or disk tier of any size with it
 * (a record costs the index ~100 bytes, not the KV bytes), so what it holds, evicts, admits
 * and refuses is what the real store would, by the same code. */
#include "tier/tier_int.h"

typedef struct {
    kvc__tier_base_t base;
    kvc__tier_index_t ix;
} meta_t;

static int meta_put(kvc_tier_store_t *s, const kvc_tier_key_t *key, const void *data,
                    kvc_tier_put_status_t *status)
{
    (void)data;
    meta_t *m = (meta_t *)s;
    const kvc_namespace_t *ns = kvc__tier_key_ns(key);
    uint32_t slot = kvc__tier_index_find(&m->ix, key->hash, ns);
    if (slot != KVC_NONE) {
        kvc__tier_index_touch(&m->ix, slot);
        m->base.st.n_put_present++;
        *status = KVC_TIER_PUT_PRESENT;
        return 0;
    }
    if (!kvc__tier_admit(&m->base, key)) {
        *status = KVC_TIER_PUT_NOT_ADMITTED;
        return 0;
    }
    if (!kvc__tier_budget_take(&m->base, m->base.record_bytes)) {
        *status = KVC_TIER_PUT_OVER_BUDGET;
        return 0;
    }
    slot = kvc__tier_index_take_free(&m->ix);
    if (slot == KVC_NONE) {
        slot = kvc__tier_index_lru(&m->ix);
        kvc__tier_index_unlink(&m->ix, slot);
        m->base.st.n_evictions++;
    }
    kvc__tier_index_insert(&m->ix, slot, key->hash, ns);
    m->base.st.n_puts++;
    m->base.st.bytes_written += m->base.record_bytes;
    *status = KVC_TIER_PUT_STORED;
    return 0;
}

static int meta_get(kvc_tier_store_t *s, const kvc_tier_key_t *key, void *out)
{
    (void)out;
    meta_t *m = (meta_t *)s;
    uint32_t slot = kvc__tier_index_find(&m->ix, key->hash, kvc__tier_key_ns(key));
    if (slot == KVC_NONE) return KVC_ENOENT;
    kvc__tier_index_touch(&m->ix, slot);
    m->base.st.bytes_read += m->base.record_bytes;
    return 0;
}

static int meta_contains(kvc_tier_store_t *s, const kvc_tier_key_t *key)
{
    meta_t *m = (meta_t *)s;
    return kvc__tier_index_find(&m->ix, key->hash, kvc__tier_key_ns(key)) != KVC_NONE;
}

static int meta_del(kvc_tier_store_t *s, const kvc_tier_key_t *key)
{
    meta_t *m = (meta_t *)s;
    uint32_t slot = kvc__tier_index_find(&m->ix, key->hash, kvc__tier_key_ns(key));
    if (slot == KVC_NONE) return KVC_ENOENT;
    kvc__tier_index_remove(&m->ix, slot);
    return 0;
}

static void meta_stats(const kvc_tier_store_t *s, kvc_tier_stats_t *out)
{
    const meta_t *m = (const meta_t *)s;
    out->n_records = m->ix.n_used;
    out->capacity_records = m->ix.n_slots;
}

static int meta_check(const kvc__tier_base_t *b, char *msg, size_t cap)
{
    return kvc__tier_index_check(&((const meta_t *)b)->ix, msg, cap);
}

static void meta_destroy(kvc_tier_store_t *s)
{
    meta_t *m = (meta_t *)s;
    kvc_allocator_t a = m->base.p.allocator;
    kvc__tier_index_deinit(&m->ix);
    kvc__tier_base_deinit(&m->base);
    kvc_free(&a, m);
}

static const kvc_tier_ops_t meta_ops = {
    .name = "meta",
    .put = meta_put,
    .get = meta_get,
    .contains = meta_contains,
    .del = meta_del,
    .stats = meta_stats,
    .destroy = meta_destroy,
};

int kvc_tier_meta_create(const kvc_tier_params_t *params, kvc_tier_store_t **out)
{
    if (!params || !out) return KVC_EINVAL;
    size_t rec = kvc__tier_record_size(params->block_bytes, params->block_tokens);
    if (rec == 0 || params->capacity_bytes < rec) return KVC_EINVAL;
    uint64_t n = params->capacity_bytes / rec;
    if (n > (1u << 30)) return KVC_EINVAL;
    meta_t *m = kvc_calloc(&params->allocator, 1, sizeof *m, 64);
    if (!m) return KVC_ENOMEM;
    int rc = kvc__tier_base_init(&m->base, &meta_ops, params);
    if (rc == 0) rc = kvc__tier_index_init(&m->ix, (uint32_t)n, &params->allocator);
    if (rc) {
        kvc__tier_index_deinit(&m->ix);
        kvc__tier_base_deinit(&m->base);
        kvc_free(&params->allocator, m);
        return rc;
    }
    m->base.check = meta_check;
    *out = &m->base.pub;
    return 0;
}
