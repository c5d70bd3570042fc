/* engine_tier_int.h - internal: the engine's KV tiers (engine_tier.c).
 *
 * What engine.c calls: create the stores from the specs (before the prefix cache, whose hash
 * seed and event hook they give), fetch a request's prefix from the tiers before it is given
 * to the scheduler (the blocks it fetched held until the scheduler has admitted it), and after
 * each step write through the blocks cached in it.  Evicted blocks are copied down from the
 * prefix cache's REMOVED event, synchronously, before the pool reuses them.  Everything runs on
 * the engine's step thread. */
#ifndef KVC_MODEL_ENGINE_TIER_INT_H
#define KVC_MODEL_ENGINE_TIER_INT_H

#include "kvcache/engine.h"

typedef struct kvc__etiers kvc__etiers_t;

#define KVC__TIER_MAX_RUNS 8

/* A request's fetch: the references it holds until the scheduler admits it, and which tier
 * each fetched block came from (blocks [run_start[i], run_end[i]) of the prompt from tier
 * run_tier[i]), for its account. */
typedef struct {
    uint32_t *held; /* (n_held) pool references: the pool hits and the fetched blocks */
    uint32_t n_held;
    uint32_t n_runs;
    uint32_t run_tier[KVC__TIER_MAX_RUNS], run_start[KVC__TIER_MAX_RUNS],
        run_end[KVC__TIER_MAX_RUNS];
} kvc__tier_fetch_t;

/* The stores of p->tiers for model m over a pool of n_blocks blocks of block_bytes and
 * p->block_size tokens.  *seed receives the prefix cache's hash seed (p->prefix_hash_seed, or
 * derived from the model id).  KVC_EINVAL / KVC_ENOTSUP / KVC_EEXIST / KVC_EIO / KVC_ENOMEM
 * with one line in msg. */
int kvc__etiers_create(const kvc_llm_t *m, const kvc_engine_params_t *p, size_t block_bytes,
                       uint32_t n_blocks, uint32_t ctx_blocks, uint64_t *seed, kvc__etiers_t **out,
                       char *msg, size_t cap);
/* The prefix cache's event hook (ctx: the kvc__etiers_t). */
void kvc__etiers_event(void *ctx, const kvc_prefix_event_t *ev);
/* Attach the pool and the prefix cache, once created. */
void kvc__etiers_attach(kvc__etiers_t *t, kvc_pool_t *pool, kvc_prefix_t *pc);
void kvc__etiers_destroy(kvc__etiers_t *t);

/* Continue the prompt's pool match in the tiers and fetch what the policy takes into pending
 * pool blocks, committed in chain order; f receives the references held (released by
 * kvc__etiers_release once the scheduler has the request).  max_hold: blocks it may hold.
 * A tier fault is a miss.  0, or KVC_ENOMEM (nothing held then). */
int kvc__etiers_fetch(kvc__etiers_t *t, const kvc_namespace_t *ns, const kvc_token_t *tokens,
                      uint32_t n_prompt, double prefill_tokens_per_s, uint32_t max_hold,
                      kvc__tier_fetch_t *f);
/* Release f's references (its runs stay, for the account). */
void kvc__etiers_release(kvc__etiers_t *t, kvc__tier_fetch_t *f);
/* References held by all fetches not yet released. */
uint32_t kvc__etiers_held(const kvc__etiers_t *t);
/* Write the blocks cached since the last call to the write-through tiers. */
void kvc__etiers_flush(kvc__etiers_t *t);

uint32_t kvc__etiers_n(const kvc__etiers_t *t);
int kvc__etiers_stats(const kvc__etiers_t *t, uint32_t i, kvc_engine_tier_stats_t *out);
const char *kvc__etiers_model_id(const kvc__etiers_t *t);

#endif
