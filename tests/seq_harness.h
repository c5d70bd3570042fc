/* seq_harness.h - a metadata-only engine for seq tests: the "KV" of a slot is
 * the token id written there.  A step reserves slots, writes each position's
 * token into its slot, and completes; copy-on-write copies the fake KV.  So a
 * sequence can be read back through its block table, and must read exactly
 * its own tokens: a wrong share, a missed copy or a bad rollback shows up as
 * a wrong token. */
#ifndef KVC_SEQ_HARNESS_H
#define KVC_SEQ_HARNESS_H

#include "test_helpers.h"
#include "kvcache/testing.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    kvc_pool_t *pool;
    kvc_prefix_t *pc;
    kvc_seqs_t *seqs;
    uint32_t bs, n_blocks, n_groups;
    int32_t *kv; /* (n_blocks, bs): a physical block belongs to one group at a time */
    uint64_t copies;
} harness_t;

static inline void harness_copy(void *ctx, uint32_t dst, uint32_t src)
{
    harness_t *h = ctx;
    memcpy(h->kv + (size_t)dst * h->bs, h->kv + (size_t)src * h->bs, h->bs * sizeof(int32_t));
    h->copies++;
}

typedef struct {
    uint32_t n_blocks, bs, max_seqs, n_groups;
    uint32_t window[KVC_MAX_GROUPS];
    bool no_prefix;
    kvc_hash_fn hash_fn;
    kvc_allocator_t allocator; /* the seq table's (zeroed: libc); pool and prefix use libc */
} harness_cfg_t;

static inline void harness_init(harness_t *h, harness_cfg_t cfg)
{
    memset(h, 0, sizeof *h);
    h->bs = cfg.bs;
    h->n_blocks = cfg.n_blocks;
    h->n_groups = cfg.n_groups ? cfg.n_groups : 1;
    kvc_pool_params_t pp = kvc_pool_params_default();
    pp.n_blocks = cfg.n_blocks;
    pp.block_size = cfg.bs;
    assert_ok(kvc_pool_create(&pp, &h->pool));
    if (!cfg.no_prefix) {
        kvc_prefix_params_t cp = kvc_prefix_params_default();
        cp.hash_seed = 777;
        memcpy(cp.group_window, cfg.window, sizeof cp.group_window);
        assert_ok(kvc_prefix_create(h->pool, &cp, &h->pc));
        assert_ok(kvc_testing_prefix_set_hash(h->pc, cfg.hash_fn));
    }
    kvc_seqs_params_t sp = kvc_seqs_params_default();
    sp.max_seqs = cfg.max_seqs ? cfg.max_seqs : 64;
    sp.n_groups = h->n_groups;
    memcpy(sp.window, cfg.window, sizeof sp.window);
    sp.on_copy = harness_copy;
    sp.copy_ctx = h;
    sp.allocator = cfg.allocator;
    assert_ok(kvc_seqs_create(h->pool, h->pc, &sp, &h->seqs));
    h->kv = malloc((size_t)cfg.n_blocks * cfg.bs * sizeof(int32_t));
    assert_non_null(h->kv);
    memset(h->kv, 0xff, (size_t)cfg.n_blocks * cfg.bs * sizeof(int32_t));
}

static inline void harness_free(harness_t *h)
{
    kvc_seqs_destroy(h->seqs);
    kvc_prefix_destroy(h->pc);
    kvc_pool_destroy(h->pool);
    free(h->kv);
}

static inline void harness_check(const harness_t *h)
{
    char msg[256];
    if (kvc_seqs_check(h->seqs, msg, sizeof msg)) fail_msg("seqs check: %s", msg);
}

/* The forward pass of one sequence: reserve n slots, write the tokens there, complete. */
static inline int harness_step(harness_t *h, kvc_seq_t s, uint32_t n)
{
    kvc_seq_info_t info;
    assert_ok(kvc_seq_info(h->seqs, s, &info));
    int64_t *slots = malloc((size_t)KVC_MAX_GROUPS * (n ? n : 1) * sizeof(int64_t));
    assert_non_null(slots);
    int rc = kvc_seq_reserve(h->seqs, s, n, slots);
    if (rc) {
        free(slots);
        return rc;
    }
    const kvc_token_t *tok;
    size_t nt;
    assert_ok(kvc_seq_tokens(h->seqs, s, &tok, &nt));
    for (uint32_t g = 0; g < h->n_groups; g++)
        for (uint32_t i = 0; i < n; i++) h->kv[slots[(size_t)g * n + i]] = tok[info.n_reserved + i];
    free(slots);
    assert_ok(kvc_seq_complete(h->seqs, s, n));
    return 0;
}

/* Every computed position a group can still see (all of them, or the window of the next
 * position in a sliding group) reads back the sequence's own token. */
static inline void harness_readback(const harness_t *h, kvc_seq_t s, const uint32_t *window)
{
    kvc_seq_info_t info;
    assert_ok(kvc_seq_info(h->seqs, s, &info));
    const kvc_token_t *tok;
    size_t nt;
    assert_ok(kvc_seq_tokens(h->seqs, s, &tok, &nt));
    for (uint32_t g = 0; g < h->n_groups; g++) {
        const uint32_t *table;
        uint32_t n;
        assert_ok(kvc_seq_table(h->seqs, s, g, &table, &n));
        size_t from = 0;
        if (window && window[g] && info.n_computed + 1 > window[g])
            from = info.n_computed + 1 - window[g];
        for (size_t pos = from; pos < info.n_computed; pos++) {
            uint32_t b = table[pos / h->bs];
            if (b == KVC_NONE)
                fail_msg("group %u position %zu: block released inside the window", g, pos);
            int32_t got = h->kv[(size_t)b * h->bs + pos % h->bs];
            if (got != tok[pos])
                fail_msg("group %u position %zu reads token %d, the sequence has %d", g, pos, got,
                         tok[pos]);
        }
    }
}

static inline kvc_seq_t harness_create(harness_t *h, const kvc_token_t *t, size_t n)
{
    kvc_seq_desc_t d = {.prompt = t, .n_prompt = n};
    kvc_seq_t s;
    assert_ok(kvc_seq_create(h->seqs, &d, &s));
    return s;
}

#endif
