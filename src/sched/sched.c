/* sched.c - the step planner: admission, chunked prefill, preemption,
 * priority classes, tenant quotas and fairness, long-request caps, drafts.
 * See include/kvcache/sched.h.  Time is always passed in. */
#include "kvcache/sched.h"
#include "util/msg.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

enum { R_WAITING = 0, R_RUNNING, R_SWAPPED, R_DONE };

typedef struct {
    kvc_seq_t seq;
    const kvc_token_t *prompt; /* borrowed until the sequence exists */
    kvc_namespace_t ns;
    double arrival, first_token;
    uint32_t n_prompt, max_output, n_output;
    uint32_t n_hit, n_resume_hit, n_preempt, n_accepted;
    uint32_t high_water;     /* most positions ever computed: below it, computing is recomputing */
    uint32_t swapped_tokens; /* computed tokens held in host memory while swapped */
    uint32_t blocks;         /* blocks its tables hold now */
    uint64_t recomputed;
    uint8_t state, priority, tenant;
    bool has_seq, admitted_once, aborted, planned, is_long;
} req_t;

typedef struct {
    uint32_t *v;
    size_t head, n, cap; /* live entries are v[head .. head + n) */
} queue_t;

struct kvc_sched {
    kvc_sched_params_t p;
    kvc_seqs_t *seqs;
    kvc_pool_t *pool;
    uint32_t bs, n_groups, pool_blocks;
    bool sliding; /* some KV group has a sliding window (blocks leave as requests decode) */
    uint32_t class_running[KVC_MAX_CLASSES], class_waiting[KVC_MAX_CLASSES];
    req_t *reqs;
    size_t n_reqs, reqs_cap;
    queue_t waiting[KVC_MAX_CLASSES][KVC_MAX_TENANTS][2]; /* [.][.][is_long]: a long request
                                                              held back by its cap never blocks
                                                              the short ones behind it */
    uint32_t *running;                                    /* ids, sorted by (priority, arrival) */
    size_t n_running, running_cap;
    uint32_t *swapped; /* ids, sorted by (priority, arrival) */
    size_t n_swapped, swapped_cap;
    kvc_sched_entry_t *entries;
    size_t entries_cap;
    kvc_sched_plan_t plan;
    bool plan_open; /* a plan awaits kvc_sched_complete */
    kvc_sched_done_t *done;
    size_t n_done, done_cap;
    kvc_token_t *drafts;
    size_t drafts_cap;
    double last_now;
    uint32_t tenant_running[KVC_MAX_TENANTS];
    uint32_t long_blocks;
    kvc_sched_stats_t st;
    char *trace;
    size_t trace_len, trace_cap;
};

/* ---- names ------------------------------------------------------------------------ */
static const char *const admission_names[] = {"greedy", "reserve-max", "reserve-expected"};
static const char *const preemption_names[] = {"recompute", "swap", "backpressure"};

const char *kvc_admission_name(kvc_admission_t a)
{
    return (unsigned)a < KVC_ARRAY_LEN(admission_names) ? admission_names[a] : "?";
}

const char *kvc_preemption_name(kvc_preemption_t p)
{
    return (unsigned)p < KVC_ARRAY_LEN(preemption_names) ? preemption_names[p] : "?";
}

int kvc_admission_parse(const char *s, kvc_admission_t *out)
{
    for (unsigned i = 0; s && i < KVC_ARRAY_LEN(admission_names); i++)
        if (!strcmp(s, admission_names[i])) return *out = (kvc_admission_t)i, 0;
    return KVC_EINVAL;
}

int kvc_preemption_parse(const char *s, kvc_preemption_t *out)
{
    for (unsigned i = 0; s && i < KVC_ARRAY_LEN(preemption_names); i++)
        if (!strcmp(s, preemption_names[i])) return *out = (kvc_preemption_t)i, 0;
    return KVC_EINVAL;
}

/* ---- small helpers --------------------------------------------------------------------- */
static int grow_slow(const kvc_sched_t *s, void **p, size_t size, size_t *cap, size_t need)
{
    size_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *np = kvc_alloc(&s->p.allocator, c * size, 0);
    if (!np) return KVC_ENOMEM;
    if (*cap) memcpy(np, *p, *cap * size);
    kvc_free(&s->p.allocator, *p);
    *p = np;
    *cap = c;
    return 0;
}

static inline int grow(const kvc_sched_t *s, void **p, size_t size, size_t *cap, size_t need)
{
    return need <= *cap ? 0 : grow_slow(s, p, size, cap, need);
}

__attribute__((format(printf, 2, 3))) static void trace(kvc_sched_t *s, const char *fmt, ...)
{
    if (!s->p.trace) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || grow(s, (void **)&s->trace, 1, &s->trace_cap, s->trace_len + (size_t)n + 2))
        return;
    va_start(ap, fmt);
    vsnprintf(s->trace + s->trace_len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    s->trace_len += (size_t)n;
    s->trace[s->trace_len++] = '\n';
    s->trace[s->trace_len] = 0;
}

#define TRACE(s, ...)                            \
    do {                                         \
        if ((s)->p.trace) trace(s, __VA_ARGS__); \
    } while (0)

static inline uint32_t blocks_for(const kvc_sched_t *s, uint64_t tokens)
{
    return (uint32_t)((tokens + s->bs - 1) / s->bs) * s->n_groups;
}

static inline bool before(const req_t *a, const req_t *b)
{
    return a->priority != b->priority ? a->priority < b->priority : a->arrival < b->arrival;
}

/* Insert id into a list sorted by (priority, arrival); stable for equal keys. */
static int sorted_insert(kvc_sched_t *s, uint32_t **v, size_t *n, size_t *cap, uint32_t id)
{
    int rc = grow(s, (void **)v, sizeof(uint32_t), cap, *n + 1);
    if (rc) return rc;
    size_t at = *n;
    while (at > 0 && before(&s->reqs[id], &s->reqs[(*v)[at - 1]])) at--;
    memmove(*v + at + 1, *v + at, (*n - at) * sizeof(uint32_t));
    (*v)[at] = id;
    (*n)++;
    return 0;
}

static void list_remove(uint32_t *v, size_t *n, uint32_t id)
{
    for (size_t i = 0; i < *n; i++)
        if (v[i] == id) {
            memmove(v + i, v + i + 1, (*n - i - 1) * sizeof(uint32_t));
            (*n)--;
            return;
        }
}

static int queue_push(kvc_sched_t *s, queue_t *q, uint32_t id, bool front)
{
    if (front && q->head > 0) {
        q->v[--q->head] = id;
        q->n++;
        return 0;
    }
    if (q->head && q->head + q->n == q->cap) { /* compact */
        memmove(q->v, q->v + q->head, q->n * sizeof(uint32_t));
        q->head = 0;
    }
    int rc = grow(s, (void **)&q->v, sizeof(uint32_t), &q->cap, q->head + q->n + 1);
    if (rc) return rc;
    if (front) {
        memmove(q->v + q->head + 1, q->v + q->head, q->n * sizeof(uint32_t));
        q->v[q->head] = id;
    } else {
        q->v[q->head + q->n] = id;
    }
    q->n++;
    return 0;
}

/* ---- block accounting ------------------------------------------------------------------- */
static uint32_t seq_blocks(const kvc_sched_t *s, const req_t *r)
{
    uint32_t n = 0;
    if (r->has_seq) (void)kvc_seq_progress(s->seqs, r->seq, NULL, NULL, &n);
    return n;
}

/* Re-read a request's block count and move the difference into the class / tenant / long sums. */
static void account(kvc_sched_t *s, req_t *r)
{
    uint32_t now = seq_blocks(s, r);
    int64_t d = (int64_t)now - (int64_t)r->blocks;
    s->st.class_blocks[r->priority] = (uint32_t)((int64_t)s->st.class_blocks[r->priority] + d);
    s->st.tenant_blocks[r->tenant] = (uint32_t)((int64_t)s->st.tenant_blocks[r->tenant] + d);
    if (r->is_long) s->long_blocks = (uint32_t)((int64_t)s->long_blocks + d);
    r->blocks = now;
}

static uint32_t cap_blocks(const kvc_sched_t *s, double share)
{
    return share > 0 ? (uint32_t)floor(share * s->pool_blocks) : UINT32_MAX;
}

/* Blocks the request should be able to grow to under the admission policy (0: no target). */
static uint32_t target_blocks(const kvc_sched_t *s, const req_t *r)
{
    switch (s->p.admission) {
    case KVC_ADMIT_RESERVE_MAX:
        return blocks_for(s, (uint64_t)r->n_prompt + r->max_output);
    case KVC_ADMIT_RESERVE_EXPECTED: {
        double out = ceil(s->p.expected_output * (1.0 + s->p.expected_margin));
        uint32_t o = (uint32_t)KVC_MIN((double)r->max_output, out);
        return blocks_for(s, (uint64_t)r->n_prompt + o);
    }
    default:
        return 0;
    }
}

/* Blocks the running requests have been promised but do not hold yet. */
static uint64_t outstanding(const kvc_sched_t *s)
{
    uint64_t sum = 0;
    for (size_t i = 0; i < s->n_running; i++) {
        const req_t *r = &s->reqs[s->running[i]];
        uint32_t t = target_blocks(s, r);
        if (t > r->blocks) sum += t - r->blocks;
    }
    return sum;
}

/* ---- creation ---------------------------------------------------------------------------- */
kvc_sched_params_t kvc_sched_params_default(void)
{
    return (kvc_sched_params_t){
        .max_num_seqs = 256, .max_num_batched_tokens = 8192, .expected_margin = 0.2};
}

int kvc_sched_create(kvc_seqs_t *seqs, kvc_pool_t *pool, const kvc_sched_params_t *params,
                     kvc_sched_t **out)
{
    if (!seqs || !pool || !params || !out) return KVC_EINVAL;
    *out = NULL;
    const kvc_sched_params_t *p = params;
    if (p->max_num_seqs == 0 || p->max_num_batched_tokens == 0 || (unsigned)p->admission > 2 ||
        (unsigned)p->preemption > 2 || p->tenant_kv_share < 0 || p->tenant_kv_share > 1 ||
        p->long_kv_cap < 0 || p->long_kv_cap > 1 || p->expected_margin < 0 || p->spec_tokens > 64)
        return KVC_EINVAL;
    for (int c = 0; c < KVC_MAX_CLASSES; c++)
        if (p->class_kv_cap[c] < 0 || p->class_kv_cap[c] > 1) return KVC_EINVAL;
    kvc_sched_t *s = kvc_calloc(&p->allocator, 1, sizeof *s, 0);
    if (!s) return KVC_ENOMEM;
    s->p = *p;
    s->seqs = seqs;
    s->pool = pool;
    s->bs = kvc_pool_block_size(pool);
    s->pool_blocks = kvc_pool_n_blocks(pool);
    s->n_groups = kvc_seqs_n_groups(seqs);
    s->sliding = kvc_seqs_has_sliding(seqs);
    *out = s;
    return 0;
}

void kvc_sched_destroy(kvc_sched_t *s)
{
    if (!s) return;
    const kvc_allocator_t a = s->p.allocator;
    for (size_t i = 0; i < s->n_reqs; i++)
        if (s->reqs[i].has_seq) (void)kvc_seq_destroy(s->seqs, s->reqs[i].seq);
    for (int c = 0; c < KVC_MAX_CLASSES; c++)
        for (int t = 0; t < KVC_MAX_TENANTS; t++)
            for (int l = 0; l < 2; l++) kvc_free(&a, s->waiting[c][t][l].v);
    kvc_free(&a, s->reqs);
    kvc_free(&a, s->running);
    kvc_free(&a, s->swapped);
    kvc_free(&a, s->entries);
    kvc_free(&a, s->done);
    kvc_free(&a, s->drafts);
    kvc_free(&a, s->trace);
    kvc_free(&a, s);
}

int kvc_sched_add(kvc_sched_t *s, const kvc_sched_req_t *q, double now, uint32_t *id)
{
    if (!s || !q || !id || !q->prompt || q->n_prompt == 0 || q->max_output == 0 ||
        q->priority >= KVC_MAX_CLASSES || q->tenant >= KVC_MAX_TENANTS)
        return KVC_EINVAL;
    /* Could it ever run?  Its prompt and first output must fit the pool and every cap. */
    uint32_t need = blocks_for(s, (uint64_t)q->n_prompt + 1);
    bool is_long =
        s->p.long_threshold && (uint64_t)q->n_prompt + q->max_output >= s->p.long_threshold;
    if (need > s->pool_blocks || need > cap_blocks(s, s->p.class_kv_cap[q->priority]) ||
        need > cap_blocks(s, s->p.tenant_kv_share) ||
        (is_long && need > cap_blocks(s, s->p.long_kv_cap)))
        return KVC_ERANGE;
    if (s->p.admission == KVC_ADMIT_RESERVE_MAX &&
        blocks_for(s, (uint64_t)q->n_prompt + q->max_output) > s->pool_blocks)
        return KVC_ERANGE;
    /* Like an engine's max_model_len: a request never grows past what the pool (and its caps)
     * can hold, or it would preempt itself forever.  Its output is capped there ("length"). */
    uint32_t room = s->pool_blocks;
    room = KVC_MIN(room, cap_blocks(s, s->p.class_kv_cap[q->priority]));
    room = KVC_MIN(room, cap_blocks(s, s->p.tenant_kv_share));
    if (is_long) room = KVC_MIN(room, cap_blocks(s, s->p.long_kv_cap));
    uint64_t max_tokens = (uint64_t)(room / s->n_groups) * s->bs;
    uint32_t max_output = (uint32_t)KVC_MIN((uint64_t)q->max_output, max_tokens - q->n_prompt);
    if (s->n_reqs >= UINT32_MAX - 1) return KVC_EOVERFLOW;
    int rc = grow(s, (void **)&s->reqs, sizeof(req_t), &s->reqs_cap, s->n_reqs + 1);
    if (rc) return rc;
    uint32_t rid = (uint32_t)s->n_reqs;
    req_t *r = &s->reqs[rid];
    *r = (req_t){.prompt = q->prompt,
                 .ns = q->ns ? *q->ns : (kvc_namespace_t){0},
                 .arrival = now,
                 .first_token = -1,
                 .n_prompt = q->n_prompt,
                 .max_output = max_output,
                 .priority = (uint8_t)q->priority,
                 .tenant = (uint8_t)q->tenant,
                 .is_long = is_long,
                 .state = R_WAITING};
    if ((rc = queue_push(s, &s->waiting[q->priority][q->tenant][is_long], rid, false))) return rc;
    s->n_reqs++;
    s->st.n_waiting++;
    s->class_waiting[r->priority]++;
    *id = rid;
    return 0;
}

/* ---- finishing ------------------------------------------------------------------------------ */
static void finish(kvc_sched_t *s, uint32_t id, double now, bool aborted)
{
    req_t *r = &s->reqs[id];
    if (grow(s, (void **)&s->done, sizeof(kvc_sched_done_t), &s->done_cap, s->n_done + 1) == 0)
        s->done[s->n_done++] = (kvc_sched_done_t){.id = id,
                                                  .priority = r->priority,
                                                  .tenant = r->tenant,
                                                  .arrival_s = r->arrival,
                                                  .first_token_s = r->first_token,
                                                  .finish_s = now,
                                                  .n_prompt = r->n_prompt,
                                                  .n_output = r->n_output,
                                                  .n_hit_tokens = r->n_hit,
                                                  .n_resume_hit_tokens = r->n_resume_hit,
                                                  .n_preemptions = r->n_preempt,
                                                  .recomputed_tokens = r->recomputed,
                                                  .n_accepted = r->n_accepted,
                                                  .aborted = aborted};
    if (r->state == R_RUNNING) {
        list_remove(s->running, &s->n_running, id);
        s->tenant_running[r->tenant]--;
        s->st.n_running--;
        s->class_running[r->priority]--;
    } else if (r->state == R_SWAPPED) {
        list_remove(s->swapped, &s->n_swapped, id);
        s->st.n_swapped--;
    } else if (r->state == R_WAITING) {
        s->st.n_waiting--; /* removed from its queue lazily (skipped when popped) */
        s->class_waiting[r->priority]--;
    }
    if (r->has_seq) {
        (void)kvc_seq_destroy(s->seqs, r->seq);
        r->has_seq = false;
    }
    account(s, r);
    r->state = R_DONE;
}

int kvc_sched_abort(kvc_sched_t *s, uint32_t id)
{
    if (!s || id >= s->n_reqs) return KVC_EINVAL;
    req_t *r = &s->reqs[id];
    if (r->state == R_DONE) return KVC_ESTALE;
    if (r->planned) { /* in the open plan: finish at completion */
        r->aborted = true;
        return 0;
    }
    finish(s, id, s->last_now, true);
    return 0;
}

/* ---- preemption --------------------------------------------------------------------------------
 */
static void preempt(kvc_sched_t *s, uint32_t id, const char *why, bool force_recompute)
{
    req_t *r = &s->reqs[id];
    kvc_seq_info_t info;
    (void)kvc_seq_info(s->seqs, r->seq, &info);
    uint32_t computed = (uint32_t)info.n_computed;
    bool swap = s->p.preemption == KVC_PREEMPT_SWAP && !force_recompute;
    uint64_t bytes = (uint64_t)r->blocks * s->p.block_bytes;
    if (swap && s->p.swap_space_bytes) {
        uint64_t in_use = 0;
        for (size_t i = 0; i < s->n_swapped; i++)
            in_use +=
                (uint64_t)blocks_for(s, s->reqs[s->swapped[i]].swapped_tokens) * s->p.block_bytes;
        if (in_use + bytes > s->p.swap_space_bytes) swap = false; /* no host room: recompute */
    }
    int rc = kvc_seq_reset(s->seqs, r->seq);
    KVC_ASSERT(rc == 0);
    account(s, r);
    list_remove(s->running, &s->n_running, id);
    s->tenant_running[r->tenant]--;
    s->st.n_running--;
    s->class_running[r->priority]--;
    r->n_preempt++;
    s->st.preemptions++;
    s->plan.n_preempted++;
    if (swap) {
        r->swapped_tokens = computed;
        r->state = R_SWAPPED;
        (void)sorted_insert(s, &s->swapped, &s->n_swapped, &s->swapped_cap, id);
        s->st.n_swapped++;
        s->plan.swap_out_bytes += bytes;
        s->st.swapped_out_bytes += bytes;
        TRACE(s, "  preempt r%u (%s): swap out %u computed tokens, %llu bytes", id, why, computed,
              (unsigned long long)bytes);
    } else {
        r->state = R_WAITING;
        (void)queue_push(s, &s->waiting[r->priority][r->tenant][r->is_long], id,
                         true); /* keeps its place */
        s->st.n_waiting++;
        s->class_waiting[r->priority]++;
        TRACE(s, "  preempt r%u (%s): recompute, %u computed tokens dropped", id, why, computed);
    }
}

typedef enum { F_ALL, F_CLASS, F_TENANT, F_LONG } filter_t;

static bool in_filter(const req_t *v, const req_t *r, filter_t f)
{
    switch (f) {
    case F_CLASS:
        return v->priority == r->priority;
    case F_TENANT:
        return v->tenant == r->tenant;
    case F_LONG:
        return v->is_long;
    default:
        return true;
    }
}

/* The victim for request `id`: the lowest class, then the latest arrival, among running
 * requests not yet planned this step (and matching the filter); `id` itself if none. */
static uint32_t pick_victim(const kvc_sched_t *s, uint32_t id, filter_t f)
{
    const req_t *r = &s->reqs[id];
    for (size_t i = s->n_running; i-- > 0;) {
        uint32_t v = s->running[i];
        const req_t *q = &s->reqs[v];
        if (v == id) return id; /* everything after it in order is planned or is it */
        if (!q->planned && in_filter(q, r, f)) return v;
    }
    return id;
}

/* The latest running request of a class less urgent than `cls`, not planned this step. */
static uint32_t lower_class_victim(const kvc_sched_t *s, uint32_t cls)
{
    for (size_t i = s->n_running; i-- > 0;) {
        const req_t *q = &s->reqs[s->running[i]];
        if (q->priority <= cls) return KVC_NONE; /* sorted: nothing less urgent remains */
        if (!q->planned) return s->running[i];
    }
    return KVC_NONE;
}

/* Make room for request id to take `need` more blocks: caps first, then the pool.  Returns
 * false if id itself had to go (or, under backpressure, must wait). */
static bool make_room(kvc_sched_t *s, uint32_t id, uint32_t need, bool *waited)
{
    for (;;) {
        req_t *r = &s->reqs[id];
        filter_t f = F_ALL;
        const char *why = NULL;
        if (s->st.class_blocks[r->priority] + need >
            cap_blocks(s, s->p.class_kv_cap[r->priority])) {
            f = F_CLASS;
            why = "class KV cap";
        } else if (s->st.tenant_blocks[r->tenant] + need > cap_blocks(s, s->p.tenant_kv_share)) {
            f = F_TENANT;
            why = "tenant KV quota";
        } else if (r->is_long && s->long_blocks + need > cap_blocks(s, s->p.long_kv_cap)) {
            f = F_LONG;
            why = "long-request cap";
        } else if (need > kvc_pool_n_free(s->pool)) {
            why = "pool full";
        } else {
            return true;
        }
        if (s->p.preemption == KVC_PREEMPT_BACKPRESSURE) {
            TRACE(s, "  r%u waits: needs %u blocks (%s)", id, need, why);
            *waited = true;
            return false;
        }
        uint32_t v = pick_victim(s, id, f);
        char reason[96];
        snprintf(reason, sizeof reason, "%s, r%u needs %u blocks", why, id, need);
        preempt(s, v, reason, false);
        if (v == id) return false;
    }
}

/* ---- planning
 * ------------------------------------------------------------------------------------ */
static int add_entry(kvc_sched_t *s, uint32_t id, uint32_t first, uint32_t n, uint32_t drafts,
                     bool prefill, bool samples)
{
    int rc = grow(s, (void **)&s->entries, sizeof(kvc_sched_entry_t), &s->entries_cap,
                  s->plan.n_entries + 1);
    if (rc) return rc;
    req_t *r = &s->reqs[id];
    s->entries[s->plan.n_entries++] = (kvc_sched_entry_t){.id = id,
                                                          .seq = r->seq,
                                                          .first_pos = first,
                                                          .n_tokens = n,
                                                          .n_drafts = drafts,
                                                          .n_context = first + n,
                                                          .prefill = prefill,
                                                          .samples = samples};
    r->planned = true;
    if (prefill)
        s->plan.n_prefill_tokens += n;
    else
        s->plan.n_decode_tokens += n;
    return 0;
}

/* Schedule up to `budget` tokens of running request id.  Returns tokens taken. */
static uint32_t schedule_running(kvc_sched_t *s, uint32_t id, uint32_t budget,
                                 uint32_t prefill_allow, bool *waited)
{
    req_t *r = &s->reqs[id];
    struct {
        size_t n_tokens, n_computed;
    } info;
    if (kvc_seq_progress(s->seqs, r->seq, &info.n_tokens, &info.n_computed, NULL)) return 0;
    uint32_t remaining = (uint32_t)(info.n_tokens - info.n_computed);
    bool prefill = remaining > 1; /* catching up on known tokens: a prompt, or a recompute */
    uint32_t n, drafts = 0;
    if (prefill) {
        n = KVC_MIN(remaining, KVC_MIN(budget, prefill_allow));
        if (s->p.max_prefill_chunk) n = KVC_MIN(n, s->p.max_prefill_chunk);
    } else {
        n = KVC_MIN(remaining, budget); /* 1: the sampled token */
        if (n && s->p.spec_tokens && r->n_output + 1 < r->max_output) {
            drafts = KVC_MIN(s->p.spec_tokens, r->max_output - r->n_output - 1);
            drafts = KVC_MIN(drafts, budget - n);
        }
    }
    if (n == 0) return 0;
    if (drafts) {
        if (grow(s, (void **)&s->drafts, sizeof(kvc_token_t), &s->drafts_cap, drafts)) return 0;
        if (s->p.draft)
            s->p.draft(s->p.draft_ctx, id, drafts, s->drafts);
        else
            memset(s->drafts, 0, drafts * sizeof(kvc_token_t));
        if (kvc_seq_draft(s->seqs, r->seq, s->drafts, drafts)) return 0;
    }
    uint32_t need;
    (void)kvc_seq_blocks_needed(s->seqs, r->seq, n + drafts, &need);
    if (!make_room(s, id, need, waited)) {
        if (drafts && r->state == R_RUNNING) (void)kvc_seq_rollback(s->seqs, r->seq, drafts);
        return 0;
    }
    int rc = kvc_seq_reserve(s->seqs, r->seq, n + drafts, NULL);
    if (rc) {
        if (drafts) (void)kvc_seq_rollback(s->seqs, r->seq, drafts);
        TRACE(s, "  r%u cannot reserve: %s", id, kvc_strerror(rc));
        *waited = true;
        return 0;
    }
    if (need) account(s, r); /* no new block, no change (a copy replaces one it held) */
    bool samples = info.n_computed + n == info.n_tokens; /* every known token computed */
    if (add_entry(s, id, (uint32_t)info.n_computed, n + drafts, drafts, prefill, samples)) return 0;
    TRACE(s, "  run r%u: %s %u tokens at %u%s", id, prefill ? "prefill" : "decode", n,
          (uint32_t)info.n_computed, drafts ? " + drafts" : "");
    return n + drafts;
}

/* Bring swapped requests back while memory allows (priority order). */
static void swap_in(kvc_sched_t *s, int cls)
{
    while (s->n_swapped && s->n_running < s->p.max_num_seqs) {
        uint32_t id = s->swapped[0];
        req_t *r = &s->reqs[id];
        if (r->priority != cls) return; /* sorted by class: the most urgent come first */
        uint32_t need = blocks_for(s, (uint64_t)r->swapped_tokens + 1);
        if (need + outstanding(s) > kvc_pool_n_free(s->pool)) return;
        size_t hit = 0;
        if (kvc_seq_lookup(s->seqs, r->seq, &hit)) return;
        uint32_t rest = r->swapped_tokens > hit ? r->swapped_tokens - (uint32_t)hit : 0;
        if (rest && (kvc_seq_reserve(s->seqs, r->seq, rest, NULL) ||
                     kvc_seq_complete(s->seqs, r->seq, rest))) {
            (void)kvc_seq_reset(s->seqs, r->seq);
            return;
        }
        uint64_t bytes = (uint64_t)blocks_for(s, rest) * s->p.block_bytes;
        s->plan.swap_in_bytes += bytes;
        s->st.swapped_in_bytes += bytes;
        s->plan.n_swapped_in++;
        list_remove(s->swapped, &s->n_swapped, id);
        s->st.n_swapped--;
        r->state = R_RUNNING;
        (void)sorted_insert(s, &s->running, &s->n_running, &s->running_cap, id);
        s->tenant_running[r->tenant]++;
        s->st.n_running++;
        s->class_running[r->priority]++;
        account(s, r);
        TRACE(s, "  swap in r%u: %zu tokens hit the prefix cache, %u restored (%llu bytes)", id,
              hit, rest, (unsigned long long)bytes);
    }
}

/* Dominant share of a tenant's consumption: max(KV token-seconds share, computed share). */
static double tenant_usage(const kvc_sched_t *s, uint32_t t)
{
    double kv_total = 0, comp_total = 0;
    for (int i = 0; i < KVC_MAX_TENANTS; i++) {
        kv_total += s->st.tenant_kv_token_s[i];
        comp_total += (double)s->st.tenant_computed[i];
    }
    double a = kv_total > 0 ? s->st.tenant_kv_token_s[t] / kv_total : 0;
    double b = comp_total > 0 ? (double)s->st.tenant_computed[t] / comp_total : 0;
    return KVC_MAX(a, b);
}

/* The next waiting request to consider, skipping queues blocked this step.  Within the most
 * urgent class with work: the least-consuming tenant if fair, else the earliest arrival. */
static uint32_t next_waiting(kvc_sched_t *s, int c, const bool blocked[KVC_MAX_TENANTS][2])
{
    uint32_t best = KVC_NONE;
    double best_key = 0;
    for (int t = 0; t < KVC_MAX_TENANTS; t++) {
        for (int l = 0; l < 2; l++) {
            queue_t *q = &s->waiting[c][t][l];
            while (q->n && s->reqs[q->v[q->head]].state != R_WAITING) { /* drop finished */
                q->head++;
                q->n--;
            }
            if (!q->n || blocked[t][l]) continue;
            uint32_t id = q->v[q->head];
            double key = s->p.tenant_fair ? tenant_usage(s, (uint32_t)t) : s->reqs[id].arrival;
            if (best == KVC_NONE || key < best_key ||
                (key == best_key && s->reqs[id].arrival < s->reqs[best].arrival)) {
                best = id;
                best_key = key;
            }
        }
    }
    return best;
}

static void pop_waiting(kvc_sched_t *s, uint32_t id)
{
    const req_t *r = &s->reqs[id];
    queue_t *q = &s->waiting[r->priority][r->tenant][r->is_long];
    KVC_ASSERT(q->n && q->v[q->head] == id);
    q->head++;
    q->n--;
}

/* Try to admit waiting request id with up to `budget` tokens; returns tokens taken, or
 * UINT32_MAX when admission must stop (memory), 0 when only this queue is blocked. */
static uint32_t admit(kvc_sched_t *s, uint32_t id, uint32_t budget, bool *queue_blocked)
{
    req_t *r = &s->reqs[id];
    *queue_blocked = false;
    if (s->p.tenant_max_running && s->tenant_running[r->tenant] >= s->p.tenant_max_running) {
        *queue_blocked = true;
        return 0;
    }
    if (!r->has_seq) {
        kvc_seq_desc_t d = {.prompt = r->prompt, .n_prompt = r->n_prompt, .ns = &r->ns};
        int rc = kvc_seq_create(s->seqs, &d, &r->seq);
        if (rc) return UINT32_MAX; /* no sequence slot: wait */
        r->has_seq = true;
    }
    kvc_seq_info_t info;
    (void)kvc_seq_info(s->seqs, r->seq, &info);
    size_t hit = info.n_computed;
    bool looked = false;
    if (info.n_reserved == 0 && info.n_computed == 0) {
        if (kvc_seq_lookup(s->seqs, r->seq, &hit)) return UINT32_MAX;
        looked = true;
        account(s, r);
    }
    uint32_t computed = (uint32_t)hit, known = (uint32_t)info.n_tokens;
    uint32_t n = KVC_MIN(known - computed, budget); /* the prompt, or all of a preempted request */
    if (s->p.max_prefill_chunk) n = KVC_MIN(n, s->p.max_prefill_chunk);
    uint32_t need = 0;
    if (n) (void)kvc_seq_blocks_needed(s->seqs, r->seq, n, &need);
    /* Caps, measured on what the request must be able to hold: its known tokens and the next. */
    uint32_t full = blocks_for(s, (uint64_t)known + 1);
    uint32_t extra = full > r->blocks ? full - r->blocks : 0;
    const char *why = NULL;
    bool stop_all = false;
    if (s->st.class_blocks[r->priority] + extra > cap_blocks(s, s->p.class_kv_cap[r->priority]))
        why = "class KV cap";
    else if (s->st.tenant_blocks[r->tenant] + extra > cap_blocks(s, s->p.tenant_kv_share))
        why = "tenant KV quota";
    else if (r->is_long && s->long_blocks + extra > cap_blocks(s, s->p.long_kv_cap))
        why = "long-request cap";
    else {
        for (;;) {
            uint64_t free_blocks = kvc_pool_n_free(s->pool);
            uint32_t tgt = target_blocks(s, r);
            uint64_t want = tgt ? (tgt > r->blocks ? tgt - r->blocks : 0) + outstanding(s) : need;
            /* Without preemption nobody can take memory back: keep one block of headroom per
             * running request so that they can all grow a block before new ones get in. */
            if (s->p.preemption == KVC_PREEMPT_BACKPRESSURE)
                want += (uint64_t)s->n_running * s->n_groups;
            if (want <= free_blocks) break;
            /* A more urgent request may take the memory of less urgent running ones. */
            uint32_t v = s->p.preemption == KVC_PREEMPT_BACKPRESSURE
                             ? KVC_NONE
                             : lower_class_victim(s, r->priority);
            if (v == KVC_NONE) {
                why = s->p.admission == KVC_ADMIT_GREEDY ? "pool full" : "reservation does not fit";
                stop_all = true;
                break;
            }
            char reason[64];
            snprintf(reason, sizeof reason, "class %u r%u needs room", r->priority, id);
            preempt(s, v, reason, false);
            (void)kvc_seq_blocks_needed(s->seqs, r->seq, n, &need);
        }
    }
    if (why || n == 0) {
        if (looked) { /* give the pinned hit back; it is looked up again next time */
            (void)kvc_seq_reset(s->seqs, r->seq);
            account(s, r);
        }
        if (why) TRACE(s, "  r%u waits: %s", id, why);
        *queue_blocked = !stop_all;
        return stop_all ? UINT32_MAX : 0;
    }
    if (kvc_seq_reserve(s->seqs, r->seq, n, NULL)) {
        if (looked) (void)kvc_seq_reset(s->seqs, r->seq);
        account(s, r);
        return UINT32_MAX;
    }
    pop_waiting(s, id);
    s->st.n_waiting--;
    s->class_waiting[r->priority]--;
    r->state = R_RUNNING;
    (void)sorted_insert(s, &s->running, &s->n_running, &s->running_cap, id);
    s->tenant_running[r->tenant]++;
    s->st.n_running++;
    s->class_running[r->priority]++;
    account(s, r);
    if (looked) {
        if (!r->admitted_once) {
            r->n_hit = (uint32_t)hit;
            s->st.hit_tokens += hit;
            s->st.prompt_tokens_admitted += r->n_prompt;
        } else {
            r->n_resume_hit += (uint32_t)hit;
            s->st.resume_hit_tokens += hit;
        }
    }
    r->admitted_once = true;
    s->plan.n_admitted++;
    (void)add_entry(s, id, computed, n, 0, known - computed > 1, computed + n == known);
    TRACE(s, "  admit r%u (class %u, tenant %u): %zu tokens hit, computing %u", id, r->priority,
          r->tenant, hit, n);
    return n;
}

int kvc_sched_step(kvc_sched_t *s, double now, const kvc_sched_plan_t **plan)
{
    if (!s || !plan) return KVC_EINVAL;
    if (s->plan_open) return KVC_EBUSY; /* the last plan has not completed */
    /* Tenants pay for the KV they held since the last step. */
    double dt = now > s->last_now ? now - s->last_now : 0;
    for (int t = 0; t < KVC_MAX_TENANTS; t++)
        s->st.tenant_kv_token_s[t] += (double)s->st.tenant_blocks[t] * s->bs / s->n_groups * dt;
    s->last_now = now;
    s->plan = (kvc_sched_plan_t){0};
    s->trace_len = 0;
    if (s->trace) s->trace[0] = 0;
    TRACE(s, "step %llu at %.6f s: %zu running, %u waiting, %zu swapped, %u free blocks",
          (unsigned long long)s->st.steps, now, s->n_running, s->st.n_waiting, s->n_swapped,
          kvc_pool_n_free(s->pool));
    uint32_t budget = s->p.max_num_batched_tokens;
    bool waited = false;
    uint64_t preempted_before = s->st.preemptions;

    /* Tenants with prompt work share the prompt budget fairly (decodes are never held back). */
    uint32_t prefill_allow = UINT32_MAX;
    if (s->p.tenant_fair) {
        bool has_work[KVC_MAX_TENANTS] = {false};
        uint32_t n_with = 0;
        for (size_t i = 0; i < s->n_running; i++) {
            const req_t *r = &s->reqs[s->running[i]];
            kvc_seq_info_t info;
            if (!kvc_seq_info(s->seqs, r->seq, &info) && info.n_computed < r->n_prompt)
                has_work[r->tenant] = true;
        }
        for (int c = 0; c < KVC_MAX_CLASSES; c++)
            for (int t = 0; t < KVC_MAX_TENANTS; t++)
                has_work[t] |= s->waiting[c][t][0].n + s->waiting[c][t][1].n > 0;
        for (int t = 0; t < KVC_MAX_TENANTS; t++) n_with += has_work[t];
        if (n_with > 1) prefill_allow = KVC_MAX(1u, budget / n_with);
    }

    /* Class by class, most urgent first: (1) its running requests (decodes and the next chunks of
     * started prompts), (2) its swapped requests, (3) its waiting requests.  A class is admitted
     * only if no request of it or a more urgent class was preempted or had to wait this step. */
    bool blocked[KVC_MAX_CLASSES][KVC_MAX_TENANTS][2] = {{{false}}};
    uint32_t tenant_used[KVC_MAX_TENANTS] = {0};
    bool stop_admitting = false;
    for (int c = 0; c < KVC_MAX_CLASSES; c++) {
        if (!s->class_running[c] && !s->class_waiting[c] && !s->n_swapped) continue;
        for (size_t i = 0; i < s->n_running && budget && s->class_running[c]; i++) {
            uint32_t id = s->running[i];
            if (s->reqs[id].planned || s->reqs[id].priority != c) continue;
            size_t before_n = s->n_running;
            uint32_t took = schedule_running(s, id, budget, prefill_allow, &waited);
            budget -= took;
            if (took && prefill_allow != UINT32_MAX && s->entries[s->plan.n_entries - 1].prefill)
                tenant_used[s->reqs[id].tenant] += took;
            if (s->n_running < before_n) i = (size_t)-1; /* preemption reshaped the list: rescan */
        }
        if (s->st.preemptions != preempted_before || waited) stop_admitting = true;
        if (!stop_admitting) {
            /* swapped requests of this class come back before new ones */
            swap_in(s, c);
            for (size_t i = 0; i < s->n_swapped; i++)
                stop_admitting |= s->reqs[s->swapped[i]].priority == c;
        }
        while (!stop_admitting && budget && s->n_running < s->p.max_num_seqs &&
               s->class_waiting[c]) {
            uint32_t id = next_waiting(s, c, (const bool(*)[2])blocked[c]);
            if (id == KVC_NONE) break;
            req_t *r = &s->reqs[id];
            uint32_t allow = budget;
            if (prefill_allow != UINT32_MAX)
                allow = tenant_used[r->tenant] < prefill_allow
                            ? KVC_MIN(budget, prefill_allow - tenant_used[r->tenant])
                            : 0;
            bool qb;
            uint32_t took = allow ? admit(s, id, allow, &qb) : 0;
            if (took == UINT32_MAX) {
                stop_admitting = true;
                break;
            }
            if (took == 0) {
                blocked[r->priority][r->tenant][r->is_long] = true;
                continue;
            }
            budget -= took;
            tenant_used[r->tenant] += took;
        }
    }
    /* Backpressure can deadlock: everyone running waits for blocks nobody will free.  Break it
     * with one recompute preemption of the latest, least urgent request. */
    if (s->plan.n_entries == 0 && s->n_running && waited) {
        preempt(s, s->running[s->n_running - 1], "deadlock under backpressure", true);
        s->st.forced_preemptions++;
    }
    s->st.steps++;
    s->plan.entries = s->entries;
    s->plan_open = s->plan.n_entries > 0;
    TRACE(s, "  plan: %u rows, %u prefill + %u decode tokens, %u admitted, %u preempted",
          s->plan.n_entries, s->plan.n_prefill_tokens, s->plan.n_decode_tokens, s->plan.n_admitted,
          s->plan.n_preempted);
    *plan = &s->plan;
    return 0;
}

int kvc_sched_complete(kvc_sched_t *s, const kvc_sched_result_t *res, uint32_t n, double now)
{
    if (!s || (n && !res)) return KVC_EINVAL;
    if (!s->plan_open) return n ? KVC_EINVAL : 0;
    if (n != s->plan.n_entries) return KVC_EINVAL;
    for (uint32_t i = 0; i < n; i++)
        if (res[i].id != s->entries[i].id || res[i].n_accepted > s->entries[i].n_drafts)
            return KVC_EINVAL;
    for (uint32_t i = 0; i < n; i++) {
        const kvc_sched_entry_t *e = &s->entries[i];
        req_t *r = &s->reqs[e->id];
        r->planned = false;
        int rc = kvc_seq_complete(s->seqs, r->seq, e->n_tokens);
        KVC_ASSERT(rc == 0);
        uint32_t real = e->n_tokens - e->n_drafts + res[i].n_accepted;
        if (e->n_drafts) (void)kvc_seq_accept(s->seqs, r->seq, res[i].n_accepted);
        /* computing below the high-water mark is redoing lost work */
        uint32_t end = e->first_pos + real;
        if (e->first_pos < r->high_water) {
            uint32_t redo = KVC_MIN(end, r->high_water) - e->first_pos;
            r->recomputed += redo;
            s->st.recomputed_tokens += redo;
        }
        r->high_water = KVC_MAX(r->high_water, end);
        s->st.tenant_computed[r->tenant] += e->n_tokens;
        r->n_accepted += res[i].n_accepted;
        if (e->samples) {
            if (r->first_token < 0) r->first_token = now;
            r->n_output += 1 + res[i].n_accepted;
        }
        bool done = r->aborted || (e->samples && (res[i].finished || r->n_output >= r->max_output));
        if (done) {
            finish(s, e->id, now, r->aborted);
            continue;
        }
        if (e->samples) {
            rc = kvc_seq_append(s->seqs, r->seq, &res[i].token, 1);
            KVC_ASSERT(rc == 0);
        }
        /* blocks change here only by rollback or by sliding-window release */
        if (e->n_drafts || s->sliding) account(s, r);
    }
    s->plan_open = false; /* the plan stays readable until the next step */
    return 0;
}

int kvc_sched_take_finished(kvc_sched_t *s, const kvc_sched_done_t **done, uint32_t *n)
{
    if (!s || !done || !n) return KVC_EINVAL;
    *done = s->done;
    *n = (uint32_t)s->n_done;
    s->n_done = 0;
    return 0;
}

void kvc_sched_stats(const kvc_sched_t *s, kvc_sched_stats_t *out)
{
    *out = s->st;
    out->blocks_used = s->pool_blocks - kvc_pool_n_free(s->pool);
}

const char *kvc_sched_trace(const kvc_sched_t *s)
{
    return s->trace ? s->trace : "";
}

#define fail(msg, cap, ...) kvc__msgf(KVC_ECORRUPT, msg, cap, __VA_ARGS__)

int kvc_sched_check(const kvc_sched_t *s, char *msg, size_t cap)
{
    int rc = kvc_seqs_check(s->seqs, msg, cap);
    if (rc) return rc;
    uint32_t cls[KVC_MAX_CLASSES] = {0}, ten[KVC_MAX_TENANTS] = {0}, lng = 0, n_run = 0, n_wait = 0,
             n_swap = 0;
    for (size_t i = 0; i < s->n_reqs; i++) {
        const req_t *r = &s->reqs[i];
        uint32_t b = seq_blocks(s, r);
        if (b != r->blocks)
            return fail(msg, cap, "r%zu: holds %u blocks, books say %u", i, b, r->blocks);
        cls[r->priority] += b;
        ten[r->tenant] += b;
        if (r->is_long) lng += b;
        switch (r->state) {
        case R_RUNNING:
            n_run++;
            if (!r->has_seq || !kvc_seq_valid(s->seqs, r->seq))
                return fail(msg, cap, "r%zu: running without a sequence", i);
            break;
        case R_WAITING:
            n_wait++;
            if (b) return fail(msg, cap, "r%zu: waiting but holds %u blocks", i, b);
            break;
        case R_SWAPPED:
            n_swap++;
            if (b) return fail(msg, cap, "r%zu: swapped but holds %u blocks", i, b);
            break;
        default:
            if (r->has_seq) return fail(msg, cap, "r%zu: done but has a sequence", i);
        }
    }
    if (n_run != s->n_running || n_run != s->st.n_running || n_wait != s->st.n_waiting ||
        n_swap != s->n_swapped)
        return fail(msg, cap, "counts: %u running, %u waiting, %u swapped vs books %zu/%u/%zu",
                    n_run, n_wait, n_swap, s->n_running, s->st.n_waiting, s->n_swapped);
    for (int c = 0; c < KVC_MAX_CLASSES; c++)
        if (cls[c] != s->st.class_blocks[c])
            return fail(msg, cap, "class %d: %u blocks, books say %u", c, cls[c],
                        s->st.class_blocks[c]);
    for (int t = 0; t < KVC_MAX_TENANTS; t++)
        if (ten[t] != s->st.tenant_blocks[t])
            return fail(msg, cap, "tenant %d: %u blocks, books say %u", t, ten[t],
                        s->st.tenant_blocks[t]);
    if (lng != s->long_blocks)
        return fail(msg, cap, "long requests: %u blocks, books say %u", lng, s->long_blocks);
    for (int c = 0; c < KVC_MAX_CLASSES; c++)
        if (cls[c] > cap_blocks(s, s->p.class_kv_cap[c]))
            return fail(msg, cap, "class %d holds %u blocks over its cap", c, cls[c]);
    for (int t = 0; t < KVC_MAX_TENANTS; t++)
        if (ten[t] > cap_blocks(s, s->p.tenant_kv_share))
            return fail(msg, cap, "tenant %d holds %u blocks over its quota", t, ten[t]);
    if (lng > cap_blocks(s, s->p.long_kv_cap))
        return fail(msg, cap, "long requests hold %u blocks over their cap", lng);
    for (size_t i = 1; i < s->n_running; i++)
        if (before(&s->reqs[s->running[i]], &s->reqs[s->running[i - 1]]))
            return fail(msg, cap, "running list out of order");
    if (s->n_running > s->p.max_num_seqs)
        return fail(msg, cap, "%zu running > max_num_seqs", s->n_running);
    return 0;
}
