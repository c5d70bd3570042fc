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
 *     kvc_sched_take_finished(s, &done, &n);          their accounts
 *
 * Per step, running requests go first in priority order (decodes, then the
 * next chunk of prompts already started), then swapped-out requests are
 * brought back, then waiting requests are admitted, all within the token
 * budget (max_num_batched_tokens) and the running cap (max_num_seqs).  When a
 * running request cannot grow, the victim policy (params.victim) picks a
 * request to preempt; the default takes the lowest priority class, then the
 * latest arrival.
 *
 * Requests are named by ids that carry a generation, like seq's handles
 * (DESIGN.md invariant 6): a request's slot is reused once its account has
 * been taken, under a new generation, and an old id is refused with
 * KVC_ESTALE.  The scheduler's memory is bounded by the live requests
 * (waiting, running, swapped, and finished but not yet taken; invariant 12):
 * every array a request may need is reserved when it is added, so that no
 * later call fails for memory on the scheduler's side (the seq table under
 * it allocates on its own).  Every allocation goes through params.allocator.
 *
 * Thread-safety: not thread-safe; one scheduler thread owns it and the seq
 * table under it.  The policy and draft callbacks run on that thread, inside
 * kvc_sched_step, and must not call back into the scheduler.
 */
#ifndef KVCACHE_SCHED_H
#define KVCACHE_SCHED_H

#include "kvcache/seq.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVC_MAX_CLASSES 4 /* priority classes: 0 is the most urgent */

/* The prefix-cache priority (kvc_seq_desc_t.priority, read by the "priority" eviction
 * policy) of the sequences the scheduler creates for class c: class 0 gets
 * KVC_PREFIX_MAX_PRIORITY (63), and each less urgent class 21 less (42, 21, 0), so a more
 * urgent class's cached prefixes are evicted after a less urgent one's. */
#define KVC_CLASS_PREFIX_PRIORITY(c) \
    (KVC_PREFIX_MAX_PRIORITY - (c) * (KVC_PREFIX_MAX_PRIORITY / (KVC_MAX_CLASSES - 1)))
/* Tenants: a scheduler has params.n_tenants of them (indices 0 .. n_tenants - 1), default
 * KVC_SCHED_DEFAULT_TENANTS, at most KVC_SCHED_MAX_TENANTS.  Its per-tenant state (waiting
 * queues, counters) is allocated at creation; a step's cost grows with the tenants that have
 * requests waiting or running, never with n_tenants. */
#define KVC_SCHED_DEFAULT_TENANTS 16
#define KVC_SCHED_MAX_TENANTS     65536

/* A request's name: (generation << 32) | slot.  0 is never an id. */
typedef uint64_t kvc_req_id_t;

typedef enum {
    KVC_ADMIT_GREEDY = 0,       /* admit while blocks are free; preempt when a running
                                   request cannot grow */
    KVC_ADMIT_RESERVE_MAX,      /* admit only if prompt + max output fits next to what the
                                   running requests reserved; a started request never waits */
    KVC_ADMIT_RESERVE_EXPECTED, /* reserve prompt + expected output (+ margin), capped at the
                                   max; growth beyond it is handled as under greedy */
    KVC_ADMIT__COUNT
} kvc_admission_t;

typedef enum {
    KVC_PREEMPT_RECOMPUTE = 0, /* free the victim's blocks and requeue it; its prefix may hit */
    KVC_PREEMPT_SWAP,          /* copy its computed KV to host memory, bring it back later */
    KVC_PREEMPT_BACKPRESSURE,  /* never preempt: a request that cannot grow waits; new
                                  admissions wait while fewer than one free block per running
                                  request remains; a deadlock is broken by recompute */
    KVC_PREEMPT__COUNT
} kvc_preemption_t;

/* The built-in victim policies (see kvc_victim_fn). */
typedef enum {
    KVC_VICTIM_LATEST = 0, /* the lowest priority class, then the latest arrival (default) */
    KVC_VICTIM_LARGEST,    /* the lowest priority class, then the most blocks held (one
                              preemption frees the most memory), then the latest arrival */
    KVC_VICTIM__COUNT
} kvc_victim_t;

/* Names ("greedy", "reserve-max", "reserve-expected"; "recompute", "swap",
 * "backpressure"; "latest", "largest"); "?" for a value out of range. */
KVC_API const char *kvc_admission_name(kvc_admission_t a);
KVC_API const char *kvc_preemption_name(kvc_preemption_t p);
KVC_API const char *kvc_victim_name(kvc_victim_t v);
/* Parse a name as written by the functions above.  KVC_EINVAL for an unknown
 * name or NULL (and *out unchanged). */
KVC_API int kvc_admission_parse(const char *s, kvc_admission_t *out);
KVC_API int kvc_preemption_parse(const char *s, kvc_preemption_t *out);
KVC_API int kvc_victim_parse(const char *s, kvc_victim_t *out);

/* A running request the victim policy may choose. */
typedef struct {
    kvc_req_id_t id;
    uint64_t tag; /* the caller's, from kvc_sched_req_t */
    uint32_t priority, tenant;
    double arrival_s;
    uint32_t n_prompt, n_output;
    uint32_t n_blocks; /* pool blocks it holds now (all groups) */
    bool is_long;      /* it counts against params.long_kv_cap */
} kvc_sched_cand_t;

/* Choose the request to preempt.  cands[0..n_cands) are the requests it may
 * take, in the scheduler's order (most urgent class first, then earliest
 * arrival); the scheduler has already left out those that would not help (in
 * the plan being built, or outside the cap that is full).  `needy` is the
 * request that needs `need_blocks` more blocks:
 *   - a running request that cannot grow: it is itself among cands, and
 *     choosing it (or returning n_cands or more) preempts it;
 *   - a waiting request of a more urgent class than every candidate: n_cands
 *     or more means that it waits instead;
 *   - NULL: a deadlock under backpressure that one preemption must break;
 *     n_cands or more means the last candidate.
 * Returns an index into cands.  Called inside kvc_sched_step. */
typedef uint32_t (*kvc_victim_fn)(void *ctx, const kvc_sched_cand_t *needy, uint32_t need_blocks,
                                  const kvc_sched_cand_t *cands, uint32_t n_cands);

/* The function of a built-in victim policy (NULL for a value out of range). */
KVC_API kvc_victim_fn kvc_victim_policy(kvc_victim_t v);

/* Draft tokens for speculative decoding: write n proposals for request id (with the
 * caller's tag) into out.  Called inside kvc_sched_step. */
typedef void (*kvc_draft_fn)(void *ctx, kvc_req_id_t id, uint64_t tag, uint32_t n,
                             kvc_token_t *out);

typedef struct {
    uint32_t max_num_seqs;           /* running requests at most (default 256) */
    uint32_t max_num_batched_tokens; /* tokens computed per step at most (default 8192) */
    uint32_t max_prefill_chunk;      /* prompt tokens per request per step (0: the budget) */
    kvc_admission_t admission;
    uint32_t expected_output; /* reserve-expected: the estimate of output tokens */
    double expected_margin;   /* reserve-expected: added fraction (0.2 = 20%), finite, >= 0 */
    kvc_preemption_t preemption;
    kvc_victim_fn victim; /* NULL: kvc_victim_policy(KVC_VICTIM_LATEST) */
    void *victim_ctx;
    size_t block_bytes;                   /* bytes per block, for swap accounting */
    uint64_t swap_space_bytes;            /* host memory for swapped KV (0: unlimited) */
    double class_kv_cap[KVC_MAX_CLASSES]; /* share of the pool's blocks a class may hold
                                             (0: no cap) */
    uint32_t n_tenants;                   /* tenants, 1 .. KVC_SCHED_MAX_TENANTS (default
                                             KVC_SCHED_DEFAULT_TENANTS) */
    uint32_t tenant_max_running;          /* request-count limit per tenant (0: none) */
    double tenant_kv_share;               /* KV quota per tenant: share of the pool's blocks it may
                                             hold (0: none) */
    bool tenant_fair;                     /* admit the tenant that consumed least first, and split
                                             the step's prompt budget fairly among tenants */
    uint32_t long_threshold; /* prompt + max output >= this is a long request (0: off) */
    double long_kv_cap;      /* share of the pool long requests may hold together (0: no cap) */
    /* Swap preemption with real K/V (an engine's copies over the host link; NULL: nothing is
     * copied, as in the simulator).  swap_out is called for a victim before its blocks are
     * released, to copy the K/V of positions [0, n) out; false makes this preemption a
     * recompute instead.  swap_in is called when a swapped request comes back, after
     * positions [first, first + n) have slots again and before they count as computed (so
     * no block becomes hittable before its bytes are back), to copy them in. */
    bool (*swap_out)(void *ctx, kvc_req_id_t id, uint64_t tag, kvc_seq_t seq, uint32_t n);
    void (*swap_in)(void *ctx, kvc_req_id_t id, uint64_t tag, kvc_seq_t seq, uint32_t first,
                    uint32_t n);
    void *swap_ctx;
    uint32_t spec_tokens; /* drafts per decode step, at most 64 (0: no speculation) */
    kvc_draft_fn draft;   /* NULL: drafts are token 0 (the simulator's choice) */
    void *draft_ctx;
    bool trace; /* keep a readable account of each step's decisions */
    kvc_allocator_t allocator;
} kvc_sched_params_t;

KVC_API kvc_sched_params_t kvc_sched_params_default(void);

typedef struct {
    const kvc_token_t *prompt; /* (n_prompt), borrowed until admission */
    uint32_t n_prompt;
    uint32_t max_output;       /* the request's declared output cap (>= 1) */
    uint32_t priority;         /* class, < KVC_MAX_CLASSES; its prefix-cache priority is
                                  KVC_CLASS_PREFIX_PRIORITY(class) */
    uint32_t tenant;           /* < params.n_tenants */
    const kvc_namespace_t *ns; /* NULL: default; carries the tenant's cache salt */
    uint64_t tag;              /* the caller's: echoed in entries, accounts and callbacks */
} kvc_sched_req_t;

typedef struct kvc_sched kvc_sched_t;

/* Create a scheduler over `seqs` (borrowed, it must outlive the scheduler;
 * the pool and prefix cache it manages are the seq table's).  KVC_EINVAL
 * (NULL arguments; a zero max_num_seqs or max_num_batched_tokens; an
 * admission or preemption value out of range; a share outside 0..1 or NaN;
 * expected_margin negative or not finite; spec_tokens over 64; n_tenants 0 or over
 * KVC_SCHED_MAX_TENANTS), KVC_ENOMEM.
 * On failure *out is NULL.  The caller frees it with kvc_sched_destroy. */
KVC_API KVC_NODISCARD int kvc_sched_create(kvc_seqs_t *seqs, const kvc_sched_params_t *params,
                                           kvc_sched_t **out);
/* Free the scheduler and every request's sequence.  NULL is a no-op. */
KVC_API void kvc_sched_destroy(kvc_sched_t *s);

/* Queue a request arriving at `now`; *id names it until its account is taken
 * (kvc_sched_take_finished).  The prompt is borrowed until the request is
 * first admitted (its sequence copies it).  Its output is capped where
 * prompt + output would exceed the pool or a cap that applies to it (as an
 * engine's max_model_len does), so a request never preempts itself forever.
 * Everything the request may need from the scheduler's allocator is reserved
 * here.  All or nothing: KVC_EINVAL (NULL arguments, empty prompt, a zero
 * max_output, bad class or tenant, `now` not finite), KVC_ERANGE (it could
 * never fit: prompt + 1 needs more blocks than the pool has, or than a cap
 * allows; under reserve-max, prompt + max_output needs more than the pool),
 * KVC_EOVERFLOW (2^32 - 1 requests live at once), KVC_ENOMEM. */
KVC_API KVC_NODISCARD int kvc_sched_add(kvc_sched_t *s, const kvc_sched_req_t *req, double now,
                                        kvc_req_id_t *id);
/* Abort a request (client gone).  A request in the open plan is finished when
 * the plan completes; any other now, its blocks freed.  Its account says
 * aborted, with the latest time the scheduler was given as its finish time.
 * KVC_EINVAL (s is NULL), KVC_ESTALE (id names no live request: finished,
 * taken, or never issued), and nothing changes. */
KVC_API int kvc_sched_abort(kvc_sched_t *s, kvc_req_id_t id);

typedef struct {
    kvc_req_id_t id;
    uint64_t tag; /* the request's kvc_sched_req_t.tag */
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

/* Plan one step at time `now`.  The plan (borrowed until the next step) lists
 * the rows to compute; their slots are reserved (kvc_seq_slots gives them).
 * An empty plan means nothing can run now (and needs no completion).  A
 * request whose sequence cannot be created or grown now (the seq table is
 * full or its allocator failed) waits; the trace says so.  KVC_EINVAL (NULL
 * arguments, `now` not finite), KVC_EBUSY (the last plan has not completed),
 * and nothing changes. */
KVC_API KVC_NODISCARD int kvc_sched_step(kvc_sched_t *s, double now, const kvc_sched_plan_t **plan);

typedef struct {
    kvc_req_id_t id;
    kvc_token_t token;   /* the sampled token (entries with samples), else ignored */
    uint32_t n_accepted; /* drafts accepted (speculative entries), <= the entry's n_drafts */
    bool finished;       /* EOS or the output cap: the request is done */
    /* Parallel sampling: fork n_forks children from this request as this step completes
     * (an entry that samples, without drafts).  Child k shares every block of the request
     * (kvc_seq_fork: copy-on-write, the prompt stored once), continues with fork_tokens[k]
     * instead of `token` (its own sample of the same position), carries fork_tags[k], and is
     * a running request from then on with the parent's prompt, output count and cap.  Its id
     * goes to fork_ids[k], or 0 where it could not be made (max_num_seqs running already, the
     * seq table full or its allocator failed): the caller then finishes it itself.  A child
     * whose output reaches the cap at once is finished at once (its account follows). */
    uint32_t n_forks;
    const kvc_token_t *fork_tokens;
    const uint64_t *fork_tags;
    kvc_req_id_t *fork_ids;
} kvc_sched_result_t;

/* The executor ran the last plan; results[i] belongs to plan->entries[i]
 * (same order, same ids).  `now` is the time the step ended.  Requests that
 * finish (or were aborted during the step) get their accounts; a request
 * whose sequence cannot take the step's results (the seq table's allocator
 * failed) is finished with error KVC_ENOMEM in its account, and the others
 * proceed.  KVC_EINVAL (NULL arguments, `now` not finite, no open plan but
 * n > 0, n that differs from the plan, a result whose id belongs to another
 * entry, too many accepted drafts, forks on an entry that does not sample or has drafts,
 * or fork arrays missing), KVC_ESTALE (a result's id names no live
 * request), and then nothing is applied.  With no open plan, n == 0 is a
 * no-op. */
KVC_API KVC_NODISCARD int kvc_sched_complete(kvc_sched_t *s, const kvc_sched_result_t *results,
                                             uint32_t n, double now);

/* A finished request's account. */
typedef struct {
    kvc_req_id_t id;
    uint64_t tag; /* the request's kvc_sched_req_t.tag */
    uint32_t priority, tenant;
    double arrival_s, first_token_s, finish_s; /* first_token_s < 0: none */
    uint32_t n_prompt, n_output;
    uint32_t n_hit_tokens;        /* prompt tokens from the prefix cache at first admission */
    uint32_t n_resume_hit_tokens; /* tokens re-hit after its own preemptions (not counted as
                                     prefix hits) */
    uint32_t n_preemptions;
    uint64_t recomputed_tokens; /* computed again after a preemption */
    uint32_t n_accepted;        /* drafts accepted */
    bool aborted;               /* kvc_sched_abort ended it */
    int error; /* 0, or the seq table's error that ended it: KVC_ENOMEM when its allocator
                  failed (KVC_EBUSY if an engine still had a seq step in flight for a request
                  being preempted) */
} kvc_sched_done_t;

/* The requests finished since the last call, in the order they finished.
 * The array is borrowed until the next call (later completions do not touch
 * it); their ids are stale from now on and their slots are reused.  Never
 * allocates.  KVC_EINVAL (NULL arguments). */
KVC_API int kvc_sched_take_finished(kvc_sched_t *s, const kvc_sched_done_t **done, uint32_t *n);

typedef struct {
    uint32_t n_waiting, n_running, n_swapped;
    uint32_t n_finished;  /* finished, accounts not yet taken */
    uint32_t blocks_used; /* pool blocks referenced */
    uint64_t steps, preemptions, recomputed_tokens, swapped_out_bytes, swapped_in_bytes;
    uint64_t prompt_tokens_admitted, hit_tokens, resume_hit_tokens;
    uint64_t forced_preemptions; /* backpressure deadlocks broken */
    uint64_t n_added, n_errors;  /* requests added; finished with an error */
    uint32_t class_blocks[KVC_MAX_CLASSES];
} kvc_sched_stats_t;

/* The counters (all zero when s is NULL).  Per tenant: kvc_sched_tenant_stats. */
KVC_API void kvc_sched_stats(const kvc_sched_t *s, kvc_sched_stats_t *out);

/* One tenant's share of the scheduler. */
typedef struct {
    uint32_t n_waiting, n_running; /* requests */
    uint32_t blocks;               /* pool blocks its running requests hold (all groups) */
    double kv_token_s;             /* KV tokens held over time, up to the last step */
    uint64_t computed;             /* tokens computed (drafts included) */
} kvc_sched_tenant_stats_t;

/* The number of tenants (params.n_tenants; 0 when s is NULL). */
KVC_API uint32_t kvc_sched_n_tenants(const kvc_sched_t *s);
/* Tenant `tenant`'s counters into *out.  Never allocates; O(1).  KVC_EINVAL (NULL arguments,
 * tenant >= kvc_sched_n_tenants), and *out is unchanged. */
KVC_API int kvc_sched_tenant_stats(const kvc_sched_t *s, uint32_t tenant,
                                   kvc_sched_tenant_stats_t *out);

/* The decisions of the last step, in words (NULL-terminated string; empty
 * unless params.trace).  Requests are named r0, r1, ... in the order they
 * were added.  Best effort: text that cannot be stored (the allocator failed)
 * is left out, and the step goes on.  Borrowed until the next step. */
KVC_API const char *kvc_sched_trace(const kvc_sched_t *s);

/* Check the scheduler's bookkeeping against a recount and against the seq
 * table and the pool: every request is in exactly the list or queue its state
 * says, and every counter (per state, class and tenant) matches; every
 * running request's sequence is live and its block counts add up per class,
 * tenant and long requests; waiting and swapped requests hold no blocks; caps
 * hold; the reserved capacity covers every live request; plus
 * kvc_seqs_check.  0, KVC_EINVAL (s is NULL) or KVC_ECORRUPT with msg. */
KVC_API int kvc_sched_check(const kvc_sched_t *s, char *msg, size_t msg_cap);

#ifdef __cplusplus
}
#endif
#endif /* KVCACHE_SCHED_H */
