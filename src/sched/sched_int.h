/* sched_int.h - internal: what the scheduler's files share.  sched.c owns a
 * request's life (its slot and generation, its state and every counter that
 * follows the state, finishing, completion, the checker); step.c plans a step
 * (admission, growth, preemption, swap); policy.c holds the named policies.
 * Never installed. */
#ifndef KVC_SCHED_INT_H
#define KVC_SCHED_INT_H

#include "kvcache/sched.h"

#include <stdarg.h>

/* A request's state.  Every change goes through kvc__sched_set_state(), which moves it
 * between the lists and keeps the counters in step. */
enum {
    R_FREE = 0, /* the slot holds no request (it is on the free list) */
    R_WAITING,  /* in its waiting queue */
    R_RUNNING,  /* in the running list, holds blocks */
    R_SWAPPED,  /* in the swapped list, its KV in host memory */
    R_DONE,     /* finished, its account in the done buffer until taken */
    R__COUNT
};

typedef struct {
    kvc_seq_t seq;
    const kvc_token_t *prompt; /* borrowed until the sequence exists */
    kvc_namespace_t ns;
    uint64_t tag, serial; /* the caller's tag; the order it was added in (for the trace) */
    double arrival, first_token;
    uint32_t gen;        /* the slot's generation: part of the id, bumped when freed */
    uint32_t prev, next; /* waiting-queue links (next is also the free-list link) */
    uint32_t done_at;    /* finished: the index of its account in the done buffer */
    uint32_t n_prompt, max_output, n_output;
    uint32_t n_hit, n_resume_hit, n_preempt, n_accepted;
    uint32_t high_water;     /* most positions ever computed: below it, computing is recomputing */
    uint32_t swapped_tokens; /* computed tokens held in host memory while swapped */
    uint32_t blocks;         /* blocks its tables hold now */
    uint64_t recomputed;
    uint32_t tenant;
    uint8_t state, priority;
    bool has_seq, admitted_once, aborted, planned, is_long;
} req_t;

/* A FIFO of waiting requests linked through their slots: no allocation, O(1) unlink. */
typedef struct {
    uint32_t head, tail, n;
} queue_t;

typedef struct {
    uint32_t *v;
    uint32_t n;
    size_t cap;
} idlist_t;

/* A tenant's part of the scheduler: its waiting queues, its counters, its links in the
 * per-class lists of tenants with waiting requests (so that a step visits only those), and
 * scratch that a step sets and that is valid only when stamp is that step's. */
typedef struct {
    queue_t waiting[KVC_MAX_CLASSES][2]; /* [class][is_long]: a long request held back by its
                                            cap never blocks the short ones behind it */
    uint32_t prev[KVC_MAX_CLASSES], next[KVC_MAX_CLASSES]; /* active-list links per class */
    uint32_t running, blocks;
    uint64_t computed;
    /* KV token-seconds, charged lazily: kv_token_s holds the charge up to the scheduler's
     * charge clock at kv_at; the blocks held since then are charged when they change or are
     * read (kvc__sched_tenant_kv).  Exactly what charging every tenant at every step gives,
     * without a per-step pass over all tenants. */
    double kv_token_s, kv_at;
    /* step scratch */
    uint64_t stamp;
    uint32_t used;   /* fair: prompt tokens planned this step */
    uint8_t blocked; /* bit c * 2 + is_long: that queue is blocked this step */
    bool has_work;   /* fair: it has prompt work this step */
} tenant_t;

/* An admission policy: what a request reserves, and how a refusal reads. */
typedef struct {
    const char *name;
    /* blocks the request should be able to grow to (0: no reservation) */
    uint32_t (*target)(const kvc_sched_t *s, const req_t *r);
    bool reserves_max;    /* prompt + max output is reserved: refuse what could never fit */
    const char *wait_why; /* the trace's reason when the pool cannot take a new request */
} kvc__admit_policy_t;

/* A preemption policy: whether running requests give memory back, and where their KV goes. */
typedef struct {
    const char *name;
    bool preempts; /* false: running requests wait for memory instead (backpressure) */
    bool swaps;    /* a victim's computed KV goes to host memory (else it is recomputed) */
} kvc__preempt_policy_t;

extern const kvc__admit_policy_t kvc__admit_policies[KVC_ADMIT__COUNT];
extern const kvc__preempt_policy_t kvc__preempt_policies[KVC_PREEMPT__COUNT];

struct kvc_sched {
    kvc_sched_params_t p;
    const kvc__admit_policy_t *admit;
    const kvc__preempt_policy_t *pre;
    kvc_seqs_t *seqs;
    kvc_pool_t *pool;
    uint32_t bs, n_groups, pool_blocks;
    bool sliding; /* some KV group has a sliding window (blocks leave as requests decode) */
    /* the request table: slots [0, n_slots), free ones linked from free_head */
    req_t *reqs;
    uint32_t n_slots, n_used, free_head;
    size_t reqs_cap;
    uint32_t n_state[R__COUNT]; /* requests per state (R_FREE: free slots) */
    uint32_t class_running[KVC_MAX_CLASSES], class_waiting[KVC_MAX_CLASSES];
    tenant_t *tenants;                /* (p.n_tenants) */
    uint32_t active[KVC_MAX_CLASSES]; /* per class, the tenants with waiting requests (a list
                                         linked through tenant_t.prev/next; KVC_NONE: empty) */
    uint32_t *chk;                    /* (2 * p.n_tenants): the checker's scratch */
    double charge_clock;              /* sum of the steps' charged intervals */
    double kv_all, kv_all_at;         /* every tenant's KV token-seconds, charged lazily */
    uint32_t blocks_all;              /* every tenant's blocks */
    uint64_t computed_all;
    idlist_t running; /* slots, sorted by (priority, arrival) */
    idlist_t swapped; /* slots, sorted by (priority, arrival) */
    /* capacity reserved at kvc_sched_add, so that nothing later allocates */
    kvc_sched_entry_t *entries;
    size_t entries_cap;
    kvc_sched_cand_t *cands; /* the victim policy's candidates */
    size_t cands_cap;
    kvc_sched_done_t *done[2]; /* done[cur] fills; the other one was handed out last */
    size_t done_cap[2];
    uint32_t n_done, cur;
    kvc_sched_done_t *done_retired; /* a done buffer replaced while handed out: freed at the
                                       next take */
    kvc_token_t *drafts;            /* (spec_tokens) */
    kvc_sched_plan_t plan;
    bool plan_open;          /* a plan awaits kvc_sched_complete */
    double last_now, latest; /* the last step's time; the latest time given to any call */
    uint64_t n_serial;
    uint32_t long_blocks;
    kvc_sched_stats_t st;
    char *trace;
    size_t trace_len, trace_cap;
};

/* ---- shared helpers ---------------------------------------------------------------------- */
static inline kvc_req_id_t kvc__sched_id(const kvc_sched_t *s, uint32_t slot)
{
    return (uint64_t)s->reqs[slot].gen << 32 | slot;
}

/* A tenant's KV token-seconds up to the charge clock. */
static inline double kvc__sched_tenant_kv(const kvc_sched_t *s, const tenant_t *t)
{
    return t->kv_token_s + (double)t->blocks * s->bs / s->n_groups * (s->charge_clock - t->kv_at);
}

/* Blocks that `tokens` positions take in every group (64-bit: a prompt near 2^32 tokens in
 * several groups of small blocks must not wrap into something that seems to fit). */
static inline uint64_t kvc__sched_blocks_for(const kvc_sched_t *s, uint64_t tokens)
{
    return (tokens + s->bs - 1) / s->bs * s->n_groups;
}

static inline bool kvc__sched_before(const req_t *a, const req_t *b)
{
    return a->priority != b->priority ? a->priority < b->priority : a->arrival < b->arrival;
}

/* The blocks a share of the pool allows (0: no cap). */
uint32_t kvc__sched_cap_blocks(const kvc_sched_t *s, double share);
/* Re-read a request's block count and move the difference into the class / tenant / long sums. */
void kvc__sched_account(kvc_sched_t *s, req_t *r);
uint32_t kvc__sched_seq_blocks(const kvc_sched_t *s, const req_t *r);
/* Move request `slot` to state `to`: out of the list or queue of its old state, into the one of
 * its new state (at the front of its queue if `front`), every counter with it.  Never
 * allocates: kvc_sched_add reserved the room. */
void kvc__sched_set_state(kvc_sched_t *s, uint32_t slot, int to, bool front);
/* End a request: its account into the done buffer (reserved), its sequence destroyed. */
void kvc__sched_finish(kvc_sched_t *s, uint32_t slot, double now, bool aborted, int error);
/* Reset a request's sequence for preemption or to give a hit back; if the seq table fails,
 * the request is finished with that error instead (its sequence destroyed).  True if reset. */
bool kvc__sched_reset(kvc_sched_t *s, uint32_t slot);

void kvc__sched_trace(kvc_sched_t *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define TRACE(s, ...)                                       \
    do {                                                    \
        if ((s)->p.trace) kvc__sched_trace(s, __VA_ARGS__); \
    } while (0)

#endif
