/* kvcache/sched.h - the scheduler: each step's plan (who runs, how many tokens
 * each), admission, chunked prefill, preemption, priority classes, tenant
 * quotas and fair shares, long-request caps, speculative drafts.
 *
 * The same code runs under the real engine and the simulator; only the
 * executor differs.  The scheduler never reads a clock: `now` (seconds) is
 * passed in.  A step is:
 *
 *     kvc_sched_step(s, now, &plan);     decide; slots are reserved for the plan
 *     ... the executor runs plan->entries (forward pass or cost model) ...
 *     kvc_sched_complete(s, results, n, now_after);   tokens sampled, drafts
 *                                        accepted, requests finished
 *
 * Per step, running requests go first in priority order (decodes, then the
 * next chunk of prompts already started), then swapped-out requests are
 * brought back, then waiting requests are admitted, all within the token
 * budget (max_num_batched_tokens) and the running cap (max_num_seqs).  When a
 * running request cannot grow, the preemption policy picks a victim: the
 * lowest priority class, then the latest arrival.
 *
 * Thread-safety: not thread-safe; one scheduler thread owns it and the seq
 * table under it.
 */
#ifndef KVCACHE_SCHED_H
#define KVCACHE_SCHED_H

#include "kvcache/seq.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVC_MAX_CLASSES 4 /* priority classes: 0 is the most urgent */
#define KVC_MAX_TENANTS 16

typedef enum {
    KVC_ADMIT_GREEDY = 0,       /* admit while blocks are free; preempt when a running
                                   request cannot grow */
    KVC_ADMIT_RESERVE_MAX,      /* admit only if prompt + max output fits next to what the
                                   running requests reserved; a started request never waits */
    KVC_ADMIT_RESERVE_EXPECTED, /* reserve prompt + expected output (+ margin), capped at the
                                   max; growth beyond it is handled as under greedy */
} kvc_admission_t;

typedef enum {
    KVC_PREEMPT_RECOMPUTE = 0, /* free the victim's blocks and requeue it; its prefix may hit */
    KVC_PREEMPT_SWAP,          /* copy its computed KV to host memory, bring it back later */
    KVC_PREEMPT_BACKPRESSURE,  /* never preempt: a request that cannot grow waits; new
                                  admissions wait while fewer than one free block per running
                                  request remains; a deadlock is broken by recompute */
} kvc_preemption_t;

KVC_API const char *kvc_admission_name(kvc_admission_t a); /* "greedy", "reserve-max", "reserve-expected" */
KVC_API const char *kvc_preemption_name(kvc_preemption_t p); /* "recompute", "swap", "backpressure" */
KVC_API int kvc_admission_parse(const char *s, kvc_admission_t *out);
KVC_API int kvc_preemption_parse(const char *s, kvc_preemption_t *out);

/* Draft tokens for speculative decoding: write n proposals for request id into out. */
typedef void (*kvc_draft_fn)(void *ctx, uint32_t id, uint32_t n, kvc_token_t *out);

typedef struct {
    uint32_t max_num_seqs;           /* running requests at most (default 256) */
    uint32_t max_num_batched_tokens; /* tokens computed per step at most (default 8192) */
    uint32_t max_prefill_chunk;      /* prompt tokens per request per step (0: the budget) */
    kvc_admission_t admission;
    uint32_t expected_output; /* reserve-expected: the estimate of output tokens */
    double expected_margin;   /* reserve-expected: added fraction (0.2 = 20%) */
    kvc_preemption_t preemption;
    size_t block_bytes;                   /* bytes per block, for swap accounting */
    uint64_t swap_space_bytes;            /* host memory for swapped KV (0: unlimited) */
    double class_kv_cap[KVC_MAX_CLASSES]; /* share of the pool's blocks a class may hold
                                             (0: no cap) */
    uint32_t tenant_max_running;          /* request-count limit per tenant (0: none) */
    double tenant_kv_share;               /* KV quota per tenant: share of the pool's blocks it may
                                             hold (0: none) */
    bool tenant_fair;                     /* admit the tenant that consumed least first, and split
                                             the step's prompt budget fairly among tenants */
    uint32_t long_threshold; /* prompt + max output >= this is a long request (0: off) */
    double long_kv_cap;      /* share of the pool long requests may hold together */
    uint32_t spec_tokens;    /* drafts per decode step (0: no speculation) */
    kvc_draft_fn draft;      /* NULL: drafts are token 0 (the simulator's choice) */
    void *draft_ctx;
    bool trace; /* keep a readable account of each step's decisions */
    kvc_allocator_t allocator;
} kvc_sched_params_t;

KVC_API kvc_sched_params_t kvc_sched_params_default(void);

typedef struct {
    const kvc_token_t *prompt; /* (n_prompt), borrowed until admission */
    uint32_t n_prompt;
    uint32_t max_output;       /* the request's declared output cap (>= 1) */
    uint32_t priority;         /* class, < KVC_MAX_CLASSES */
    uint32_t tenant;           /* < KVC_MAX_TENANTS */
    const kvc_namespace_t *ns; /* NULL: default; carries the tenant's cache salt */
} kvc_sched_req_t;

typedef struct kvc_sched kvc_sched_t;

/* Create a scheduler over `seqs` (borrowed; its pool and prefix cache are the
 * ones it manages).  KVC_EINVAL / KVC_ENOMEM. */
KVC_API KVC_NODISCARD int kvc_sched_create(kvc_seqs_t *seqs, kvc_pool_t *pool, const kvc_sched_params_t *params,
                     kvc_sched_t **out);
/* Free the scheduler and every request's sequence.  NULL is a no-op. */
KVC_API void kvc_sched_destroy(kvc_sched_t *s);

/* Queue a request arriving at `now`; *id names it from then on.  The prompt
 * is borrowed until the request is first admitted (its sequence copies it).
 * Its output is capped where prompt + output would exceed the pool or a cap
 * that applies to it (as an engine's max_model_len does), so a request never
 * preempts itself forever.  KVC_EINVAL (empty prompt, bad class or tenant),
 * KVC_ERANGE (it could never fit: prompt + 1 needs more blocks than the pool
 * has, or than a cap allows), KVC_ENOMEM. */
KVC_API KVC_NODISCARD int kvc_sched_add(kvc_sched_t *s, const kvc_sched_req_t *req, double now, uint32_t *id);
/* Abort a request (client gone); its blocks are freed when no step uses them. */
KVC_API int kvc_sched_abort(kvc_sched_t *s, uint32_t id);

typedef struct {
    uint32_t id;
    kvc_seq_t seq;
    uint32_t first_pos; /* position of the first token computed */
    uint32_t n_tokens;  /* tokens computed this step (queries), drafts included */
    uint32_t n_drafts;  /* of which draft tokens */
    uint32_t n_context; /* keys attended by the last query: first_pos + n_tokens */
    bool prefill;       /* computing prompt tokens */
    bool samples;       /* a token is sampled after this step (prompt finished, or decode) */
} kvc_sched_entry_t;

typedef struct {
    const kvc_sched_entry_t *entries;
    uint32_t n_entries;
    uint32_t n_prefill_tokens, n_decode_tokens;
    uint32_t n_admitted, n_preempted, n_swapped_in;
    uint64_t swap_out_bytes, swap_in_bytes; /* KV moved over the host link this step */
} kvc_sched_plan_t;

/* Plan one step at time `now`.  The plan (borrowed until the next call) lists
 * the rows to compute; their slots are reserved (kvc_seq_slots gives them).
 * An empty plan means nothing can run now. */
KVC_API KVC_NODISCARD int kvc_sched_step(kvc_sched_t *s, double now, const kvc_sched_plan_t **plan);

typedef struct {
    uint32_t id;
    kvc_token_t token;   /* the sampled token (entries with samples), else ignored */
    uint32_t n_accepted; /* drafts accepted (speculative entries) */
    bool finished;       /* EOS or the output cap: the request is done */
} kvc_sched_result_t;

/* The executor ran the last plan; results[i] belongs to plan->entries[i]
 * (same order, same ids: KVC_EINVAL otherwise, nothing applied).  `now` is
 * the time the step ended. */
KVC_API KVC_NODISCARD int kvc_sched_complete(kvc_sched_t *s, const kvc_sched_result_t *results, uint32_t n, double now);

/* A finished request's account. */
typedef struct {
    uint32_t id;
    uint32_t priority, tenant;
    double arrival_s, first_token_s, finish_s;
    uint32_t n_prompt, n_output;
    uint32_t n_hit_tokens;        /* prompt tokens from the prefix cache at first admission */
    uint32_t n_resume_hit_tokens; /* tokens re-hit after its own preemptions (not counted as
                                     prefix hits) */
    uint32_t n_preemptions;
    uint64_t recomputed_tokens; /* computed again after a preemption */
    uint32_t n_accepted;        /* drafts accepted */
    bool aborted;
} kvc_sched_done_t;

/* Requests finished since the last call (borrowed until the next call). */
KVC_API int kvc_sched_take_finished(kvc_sched_t *s, const kvc_sched_done_t **done, uint32_t *n);

typedef struct {
    uint32_t n_waiting, n_running, n_swapped;
    uint32_t blocks_used; /* pool blocks referenced */
    uint64_t steps, preemptions, recomputed_tokens, swapped_out_bytes, swapped_in_bytes;
    uint64_t prompt_tokens_admitted, hit_tokens, resume_hit_tokens;
    uint64_t forced_preemptions; /* backpressure deadlocks broken */
    uint32_t class_blocks[KVC_MAX_CLASSES];
    uint32_t tenant_blocks[KVC_MAX_TENANTS];
    double tenant_kv_token_s[KVC_MAX_TENANTS]; /* KV tokens held over time */
    uint64_t tenant_computed[KVC_MAX_TENANTS]; /* tokens computed */
} kvc_sched_stats_t;

KVC_API void kvc_sched_stats(const kvc_sched_t *s, kvc_sched_stats_t *out);

/* The decisions of the last step, in words (NULL-terminated string; empty
 * unless params.trace).  Borrowed until the next step. */
KVC_API const char *kvc_sched_trace(const kvc_sched_t *s);

/* Check the scheduler's bookkeeping against the seq table and the pool:
 * every running request's sequence is live and its block counts add up per
 * class and tenant; waiting and swapped requests hold no blocks; caps hold;
 * plus kvc_seqs_check.  0 or KVC_ECORRUPT with msg. */
KVC_API int kvc_sched_check(const kvc_sched_t *s, char *msg, size_t msg_cap);

#ifdef __cplusplus
}
#endif
#endif /* KVCACHE_SCHED_H */
