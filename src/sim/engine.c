/* engine.c - the simulator: the real pool (metadata only), prefix cache,
 * sequences and scheduler, driven in virtual time by a cost model of the GPU
 * (cost.c) in place of the forward pass.  Nothing here re-implements
 * allocation or scheduling; it only decides how long each planned step takes
 * and what the "model" samples (the workload's own output tokens).
 *
 * Every allocation of a run goes through the caller's allocator, counted
 * against a memory limit (the machine's physical memory unless the caller
 * gives one): a run that cannot fit is refused before it allocates, with
 * what it would need, and an allocation that would pass the limit fails
 * cleanly instead of waking the OOM killer.
 *
 * A step of one replica, in run_replica's loop:
 *   admit_arrivals    requests whose arrival time has come go to the scheduler
 *   kvc_sched_step    the plan (an empty one: wait_for_work moves the clock)
 *   kvc_sim_step_time the clock advances by the step's cost
 *   step_results      what each row sampled and how many drafts it accepted
 *   kvc_sched_complete
 *   collect_finished  finished requests become report records (closed loop:
 *                     their next turns are released)
 *   sample_state      peaks, the time series, progress
 * The scheduler's call sites are marked "sched:". */
#include "kvcache/sim.h"

#include "util/fmt.h"
#include "util/msg.h"
#include "tiers_int.h"    /* KV tiers: tiers.c */
#include "workload_int.h" /* the bytes a workload holds, for the memory estimate */

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static const char *const allocation_names[KVC_SIM_ALLOC__COUNT] = {"paged", "contiguous"};
const char *kvc_sim_allocation_name(kvc_sim_allocation_t a)
{
    return (unsigned)a < KVC_SIM_ALLOC__COUNT ? allocation_names[a] : "?";
}

int kvc_sim_allocation_parse(const char *name)
{
    for (int i = 0; name && i < KVC_SIM_ALLOC__COUNT; i++)
        if (!strcmp(name, allocation_names[i])) return i;
    return -1;
}

kvc_sim_config_t kvc_sim_config_default(void)
{
    kvc_sim_config_t c = {0};
    c.plan = kvc_plan_params_default();
    c.sched = kvc_sched_params_default();
    c.prefix_caching = true;
    c.seed = 1;
    c.step_overhead_s = 0.002;
    c.allreduce_latency_s = 8e-6;
    c.spec_acceptance = 0.7;
    return c;
}

/* ---- memory: the caller's allocator, counted against the limit -------------------------- */
typedef struct {
    kvc_allocator_t inner; /* the caller's */
    uint64_t limit;        /* bytes the run may hold at once */
    uint64_t live, peak;   /* bytes held (headers included) */
    uint64_t refused;      /* the request the limit refused (0: none) */
    uint64_t held;         /* what was held when it was refused */
    uint64_t failed;       /* the largest request the caller's allocator refused (0: none) */
} mem_t;

/* Each block carries its size and alignment in front of it, so that free knows what it
 * gives back.  The header is one alignment unit (at least 16 bytes), so the block stays
 * aligned as asked. */
static void *mem_alloc(void *ctx, size_t bytes, size_t align)
{
    mem_t *m = ctx;
    if (align < 16) align = 16;
    if (bytes > SIZE_MAX - align) return NULL;
    size_t total = bytes + align;
    if (total > m->limit || m->live > m->limit - total) {
        m->refused = total;
        m->held = m->live;
        return NULL;
    }
    unsigned char *p = kvc_alloc(&m->inner, total, align);
    if (!p) {
        m->failed = KVC_MAX(m->failed, (uint64_t)total);
        return NULL;
    }
    unsigned char *q = p + align;
    size_t hdr[2] = {total, align};
    memcpy(q - sizeof hdr, hdr, sizeof hdr);
    m->live += total;
    m->peak = KVC_MAX(m->peak, m->live);
    return q;
}

static void mem_free(void *ctx, void *ptr)
{
    mem_t *m = ctx;
    if (!ptr) return;
    unsigned char *q = ptr;
    size_t hdr[2];
    memcpy(hdr, q - sizeof hdr, sizeof hdr);
    m->live -= hdr[0];
    kvc_free(&m->inner, q - hdr[1]);
}

static kvc_allocator_t mem_allocator(mem_t *m)
{
    return (kvc_allocator_t){.alloc = mem_alloc, .free = mem_free, .ctx = m};
}

/* The most this process can hold: physical memory, or less where an address-space or
 * cgroup limit says so. */
static uint64_t memory_available(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    uint64_t m = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : UINT64_MAX;
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < m)
        m = (uint64_t)rl.rlim_cur;
    FILE *f = fopen("/sys/fs/cgroup/memory.max", "r");
    if (f) {
        unsigned long long v;
        if (fscanf(f, "%llu", &v) == 1 && v > 0 && v < m) m = v;
        fclose(f);
    }
    return m;
}

/* a x b, or UINT64_MAX where it would wrap (byte counts of absurd deployments) */
static uint64_t sat_mul(uint64_t a, uint64_t b)
{
    return b && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

/* ---- arrivals: a binary min-heap by (time, workload index), so ties have one order ------ */
typedef struct {
    double t;
    uint32_t idx; /* workload index */
} arrival_t;

typedef struct {
    arrival_t *v;
    size_t n, cap;
} heap_t;

static bool arr_less(arrival_t a, arrival_t b)
{
    return a.t < b.t || (a.t == b.t && a.idx < b.idx);
}

static int heap_push(heap_t *h, const kvc_allocator_t *al, arrival_t a)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? 2 * h->cap : 1024;
        arrival_t *v = kvc_alloc(al, cap * sizeof *v, 0);
        if (!v) return KVC_ENOMEM;
        if (h->n) memcpy(v, h->v, h->n * sizeof *v);
        kvc_free(al, h->v);
        h->v = v;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0 && arr_less(a, h->v[(i - 1) / 2])) {
        h->v[i] = h->v[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->v[i] = a;
    return 0;
}

static arrival_t heap_pop(heap_t *h)
{
    arrival_t top = h->v[0], last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        arrival_t mv = last;
        if (l < h->n && arr_less(h->v[l], mv)) m = l, mv = h->v[l];
        if (r < h->n && arr_less(h->v[r], mv)) m = r;
        if (m == i) break;
        h->v[i] = h->v[m];
        i = m;
    }
    if (h->n) h->v[i] = last;
    return top;
}

/* ---- the run's state ----------------------------------------------------------------------- */
typedef struct { /* one replica's engine: created per replica, destroyed after it */
    kvc_pool_t *pool;
    kvc_prefix_t *pc;
    kvc_seqs_t *seqs;
    kvc_sched_t *s;
} replica_t;

typedef struct {
    const kvc_sim_config_t *cfg;
    const kvc_workload_t *w;
    kvc_report_t *report;
    kvc_sim_result_t *res;
    kvc_sim_cost_model_t cost;
    const kvc_allocator_t *a; /* every allocation: the caller's, counted (mem_t) */
    uint32_t num_blocks, n_groups, window[KVC_MAX_GROUPS];
    uint32_t replica, n_replicas;
    uint32_t *produced;  /* per workload index: output tokens sampled */
    uint32_t *next_turn; /* per workload index: the next turn of its conversation on the same
                            replica, or KVC_NONE */
    bool *follows;       /* per workload index: an earlier turn of its conversation goes to the
                            same replica (closed loop: that turn releases it) */
    kvc_token_t **owned; /* per workload index: assembled prompts (on-demand traces) */
    /* hold_shared_prefix: per workload index, prompt tokens computed while its prompt is being
     * computed (KVC_NONE otherwise); the indices of those requests; arrivals held back */
    uint32_t *computed;
    uint32_t *computing;
    size_t n_computing;
    arrival_t *held;
    size_t n_held;
    uint32_t tier_room; /* with tiers: requests admit_arrivals may still hand the scheduler */
    kvc_rng_t rng;
    uint64_t done_total, total;
    /* the replica being simulated */
    const kvc_prefix_t *pc; /* its prefix cache, or NULL */
    heap_t heap;
    double now;
    kvc_sched_result_t *results;
    size_t results_cap;
    uint64_t last_progress;
    double frag_sum; /* contiguous allocation: fragmentation summed over the steps */
    uint64_t frag_steps;
    kvc__sim_tiers_t *tiers; /* cfg->tiers modelled (tiers.c), or NULL */
    char *err;
    size_t err_cap;
} run_t;

/* An error from a layer below that only a bug can cause (the engine hands them nothing a
 * caller chose unchecked): KVC_ECORRUPT, naming the call.  Allocation failures pass as they
 * are. */
static int internal(run_t *r, int rc, const char *call)
{
    if (rc == 0 || rc == KVC_ENOMEM) return rc;
    return kvc__msgf(KVC_ECORRUPT, r->err, r->err_cap, "internal: %s: %s", call, kvc_strerror(rc));
}

static void draft_tokens(void *ctx, kvc_req_id_t id, uint64_t tag, uint32_t n, kvc_token_t *out)
{
    /* A drafter that proposes the tokens the model will sample; acceptance is drawn later. */
    (void)id;
    run_t *r = ctx;
    uint32_t wi = (uint32_t)tag; /* sched: the workload index */
    const kvc_sim_request_t *q = kvc_workload_request(r->w, wi);
    uint32_t k = r->produced[wi];
    for (uint32_t j = 0; j < n; j++)
        out[j] = k + j < q->n_output && q->output_tokens ? q->output_tokens[k + j] : 0;
}

/* Conversations: link each turn to the next turn of its conversation that goes to the same
 * replica (request i goes to replica i mod dp), in workload order.  One pass for all
 * replicas. */
static int link_turns(run_t *r)
{
    size_t n = kvc_workload_size(r->w), cap = 16;
    while (cap < 2 * n) cap <<= 1;
    uint64_t *keys = kvc_calloc(r->a, cap, sizeof(uint64_t), 0);
    uint32_t *reps = kvc_alloc(r->a, cap * sizeof(uint32_t), 0);
    uint32_t *last = kvc_alloc(r->a, cap * sizeof(uint32_t), 0);
    if (!keys || !reps || !last) {
        kvc_free(r->a, keys);
        kvc_free(r->a, reps);
        kvc_free(r->a, last);
        return KVC_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) r->next_turn[i] = KVC_NONE, r->follows[i] = false;
    for (size_t i = 0; i < n; i++) {
        const kvc_sim_request_t *q = kvc_workload_request(r->w, i);
        if (!q->conversation) continue;
        uint32_t rep = (uint32_t)(i % r->n_replicas);
        size_t k =
            (size_t)((q->conversation ^ ((uint64_t)rep << 40)) * 0x9e3779b97f4a7c15ULL) & (cap - 1);
        while (keys[k] && (keys[k] != q->conversation || reps[k] != rep)) k = (k + 1) & (cap - 1);
        if (keys[k]) r->next_turn[last[k]] = (uint32_t)i, r->follows[i] = true;
        keys[k] = q->conversation;
        reps[k] = rep;
        last[k] = (uint32_t)i;
    }
    kvc_free(r->a, keys);
    kvc_free(r->a, reps);
    kvc_free(r->a, last);
    return 0;
}

/* Closed loop, a turn waits for the previous turn of its conversation on its replica.  A turn
 * with none there (its conversation's earlier turns went to other replicas, or the trace starts
 * mid-conversation) arrives at its trace time: nothing else would ever release it. */
static bool has_predecessor(const run_t *r, size_t i)
{
    return r->cfg->closed_loop && r->follows[i];
}

/* ---- one replica's engine ------------------------------------------------------------------ */
static void replica_close(replica_t *rep)
{
    kvc_sched_destroy(rep->s);
    kvc_seqs_destroy(rep->seqs);
    kvc_prefix_destroy(rep->pc);
    kvc_pool_destroy(rep->pool);
    *rep = (replica_t){0};
}

/* The pool, prefix cache, sequence table and scheduler of one replica, allocating through
 * `a`.  On failure nothing is left. */
static int replica_open(run_t *r, const kvc_allocator_t *a, uint32_t num_blocks, replica_t *rep)
{
    const kvc_sim_config_t *cfg = r->cfg;
    const uint32_t bs = cfg->plan.block_size;
    *rep = (replica_t){0};
    int rc;
    kvc_pool_params_t pp = kvc_pool_params_default();
    pp.n_blocks = num_blocks;
    pp.block_size = bs;
    pp.allocator = *a;
    if ((rc = kvc_pool_create(&pp, &rep->pool))) {
        if (rc != KVC_ENOMEM)
            kvc__msgf(rc, r->err, r->err_cap, "KV pool of %u blocks of %u tokens: %s", num_blocks,
                      bs, kvc_strerror(rc));
        goto fail;
    }
    if (cfg->prefix_caching) {
        kvc_prefix_params_t cp = kvc_prefix_params_default();
        cp.hash_seed = cfg->seed ? cfg->seed : 1;
        cp.max_extra_keys = 0; /* workloads carry no multimodal inputs: save the metadata */
        cp.eviction = cfg->eviction;
        memcpy(cp.group_window, r->window, sizeof cp.group_window);
        cp.allocator = *a;
        if (r->tiers) kvc__sim_tiers_hook(r->tiers, &cp);
        if ((rc = kvc_prefix_create(rep->pool, &cp, &rep->pc))) {
            if (rc != KVC_ENOMEM)
                kvc__msgf(rc, r->err, r->err_cap, "prefix cache: %s", kvc_strerror(rc));
            goto fail;
        }
    }
    kvc_seqs_params_t sp = kvc_seqs_params_default();
    sp.max_seqs = cfg->plan.max_num_seqs * 4 + 256;
    sp.n_groups = r->n_groups;
    memcpy(sp.window, r->window, sizeof sp.window);
    sp.allocator = *a;
    if ((rc = kvc_seqs_create(rep->pool, rep->pc, &sp, &rep->seqs))) {
        if (rc != KVC_ENOMEM)
            kvc__msgf(rc, r->err, r->err_cap, "sequence table of %u: %s", sp.max_seqs,
                      kvc_strerror(rc));
        goto fail;
    }
    kvc_sched_params_t schp = cfg->sched;
    schp.max_num_seqs = cfg->plan.max_num_seqs;
    schp.max_num_batched_tokens = cfg->plan.max_num_batched_tokens;
    schp.block_bytes = (size_t)(r->cost.kv_bytes_per_token * bs);
    schp.draft = draft_tokens;
    schp.draft_ctx = r;
    schp.trace = cfg->trace != NULL;
    schp.allocator = *a;
    /* one scheduler tenant per workload tenant (the default when the workload names none) */
    uint32_t n_ten = kvc_workload_n_tenants(r->w);
    if (n_ten > schp.n_tenants) schp.n_tenants = n_ten;
    /* sched: */
    if ((rc = kvc_sched_create(rep->seqs, &schp, &rep->s))) {
        if (rc != KVC_ENOMEM)
            kvc__msgf(rc, r->err, r->err_cap, "scheduler parameters: %s", kvc_strerror(rc));
        goto fail;
    }
    return 0;
fail:
    replica_close(rep);
    return rc;
}

/* ---- the memory estimate ---------------------------------------------------------------- */
/* What one replica's engine costs, measured by building it at two small sizes through an
 * allocator that records each allocation and fills it with a pattern: the bytes allocated
 * per block, and the pages creation writes (those are resident at once).  A pool or cache
 * that allocates its tables up front but writes a block's entries only when the block is
 * used costs, resident, what creation writes plus what the blocks in use touch. */
#define PROBE_BLOCKS 1024u
#define PROBE_MAX    256 /* allocations one replica's engine makes at creation, at most */
#define PAGE         4096.0
#define POISON       0xa5

typedef struct {
    mem_t m;
    struct {
        unsigned char *p;
        size_t n;
    } a[PROBE_MAX];
    int n_a;
    bool overflow; /* more allocations than recorded: count them all as written */
} probe_mem_t;

static void *probe_alloc(void *ctx, size_t bytes, size_t align)
{
    probe_mem_t *pm = ctx;
    unsigned char *p = mem_alloc(&pm->m, bytes, align);
    if (!p) return NULL;
    memset(p, POISON, bytes);
    int i = 0;
    while (i < pm->n_a && pm->a[i].p) i++; /* a free record */
    if (i == PROBE_MAX)
        pm->overflow = true;
    else {
        pm->a[i].p = p, pm->a[i].n = bytes;
        if (i == pm->n_a) pm->n_a++;
    }
    return p;
}

static void probe_free(void *ctx, void *p)
{
    probe_mem_t *pm = ctx;
    for (int i = 0; p && i < pm->n_a; i++)
        if (pm->a[i].p == p) pm->a[i].p = NULL;
    mem_free(&pm->m, p);
}

typedef struct {
    double alloc, written; /* bytes allocated; bytes of the pages written */
    int n_big;             /* allocations of a page or more */
} probe_sum_t;

static probe_sum_t probe_measure(const probe_mem_t *pm)
{
    probe_sum_t s = {0};
    for (int i = 0; i < pm->n_a; i++) {
        const unsigned char *p = pm->a[i].p;
        size_t n = pm->a[i].n;
        if (!p) continue;
        s.alloc += (double)n;
        s.n_big += n >= PAGE;
        for (size_t at = 0; at < n; at += (size_t)PAGE) {
            size_t len = KVC_MIN(n - at, (size_t)PAGE);
            for (size_t k = 0; k < len; k++)
                if (p[at + k] != POISON) {
                    s.written += (double)len;
                    break;
                }
        }
    }
    if (pm->overflow) s.written = (double)pm->m.live;
    return s;
}

typedef struct {
    double fixed_alloc, fixed_written;         /* at creation, whatever the size */
    double alloc_per_block, written_per_block; /* at creation, per block of the pool */
    double big_per_block;                      /* tables that grow with the pool */
} probe_t;

static int probe_engine(run_t *r, probe_t *out)
{
    probe_sum_t sum[2];
    int rc = 0;
    for (int i = 0; i < 2 && !rc; i++) {
        probe_mem_t *pm = kvc_calloc(r->a, 1, sizeof *pm, 0);
        if (!pm) return KVC_ENOMEM;
        pm->m = (mem_t){.inner = *r->a, .limit = UINT64_MAX};
        kvc_allocator_t a = {.alloc = probe_alloc, .free = probe_free, .ctx = pm};
        replica_t rep;
        if (!(rc = replica_open(r, &a, PROBE_BLOCKS << i, &rep))) {
            sum[i] = probe_measure(pm);
            replica_close(&rep);
        }
        kvc_free(r->a, pm);
    }
    if (rc) return rc;
    out->alloc_per_block = KVC_MAX(0.0, (sum[1].alloc - sum[0].alloc) / PROBE_BLOCKS);
    out->written_per_block = KVC_MAX(0.0, (sum[1].written - sum[0].written) / PROBE_BLOCKS);
    out->fixed_alloc = KVC_MAX(0.0, sum[0].alloc - out->alloc_per_block * PROBE_BLOCKS);
    out->fixed_written = KVC_MAX(0.0, sum[0].written - out->written_per_block * PROBE_BLOCKS);
    out->big_per_block = sum[1].n_big;
    return 0;
}

/* The most blocks one replica can ever hand out: every request's prompt and output (and
 * its drafts), in every group, or the pool, whichever is less.  A pool that allocates on
 * use touches no more than that. */
static uint64_t blocks_touched_bound(const run_t *r)
{
    const size_t n = kvc_workload_size(r->w);
    const uint64_t bs = r->cfg->plan.block_size, extra = r->cfg->sched.spec_tokens + 1;
    uint64_t most = 0;
    for (uint32_t rep = 0; rep < r->n_replicas && rep < n; rep++) {
        uint64_t sum = 0;
        for (size_t i = rep; i < n && sum < r->num_blocks; i += r->n_replicas) {
            const kvc_sim_request_t *q = kvc_workload_request(r->w, i);
            uint64_t tokens = (uint64_t)q->n_prompt + KVC_MAX(q->max_output, q->n_output) + extra;
            sum += (tokens + bs - 1) / bs * r->n_groups;
        }
        most = KVC_MAX(most, KVC_MIN(sum, (uint64_t)r->num_blocks));
    }
    return most;
}

/* Refuse a run whose resident memory could pass `limit` bytes (the workload included) before
 * allocating it; *alloc_bytes: what it will ask its allocator for (the pages it never writes
 * included). */
static int check_memory(run_t *r, uint64_t limit, bool limit_given, double *alloc_bytes, char *err,
                        size_t cap)
{
    *alloc_bytes = 0;
    /* a pool no bigger than the probe's: building it costs what measuring it would, and the
     * limit still holds allocation by allocation */
    if (r->num_blocks <= 2 * PROBE_BLOCKS) return 0;
    probe_t pr = {0};
    int rc = probe_engine(r, &pr);
    if (rc) return rc;
    const size_t n = kvc_workload_size(r->w);
    const double blocks = r->num_blocks;
    /* the engine's own tables: per request, the counters, the arrival heap */
    const double per_request = 2 * sizeof(uint32_t) + sizeof(bool) + sizeof(kvc_token_t *) +
                               2 * sizeof(arrival_t) + 4 * sizeof(uint64_t);
    const double used = (double)blocks_touched_bound(r);
    /* Resident: what creation writes, and for each block in use its own bytes plus, at
     * worst, a page of every table that grows with the pool (a hash bucket, say) */
    double alloc = pr.fixed_alloc + pr.alloc_per_block * blocks;
    double resident = pr.fixed_written + pr.written_per_block * blocks +
                      used * (pr.alloc_per_block + pr.big_per_block * PAGE);
    resident = KVC_MIN(resident, alloc);
    /* plus 1/16 for what the allocator and the kernel keep on top (headers, page tables, the
     * checker's own scratch): about 5% at 1e7 blocks, measured against the process's RSS */
    double need = resident * 17 / 16 + per_request * (double)n + (double)r->w->bytes;
    *alloc_bytes = alloc * 17 / 16 + per_request * (double)n;
    if (need <= (double)limit) return 0;
    char a[32], b[32], c[32];
    return kvc__msgf(
        KVC_ENOMEM, err, cap,
        "the simulation would need about %s of memory (%u KV blocks per replica at about "
        "%.0f bytes of metadata each, the workload's %s and the tables of its %zu requests), more "
        "than the limit of %s (%s)",
        kvc__fmt_iec(a, sizeof a, need), r->num_blocks, resident / blocks,
        kvc__fmt_iec(b, sizeof b, (double)r->w->bytes), n, kvc__fmt_iec(c, sizeof c, (double)limit),
        limit_given ? "the limit given" : "the memory this machine has");
}

/* ---- one step's parts -------------------------------------------------------------------- */
/* Requests of this replica whose first turn (or, closed loop, every turn) is known up front. */
static int queue_arrivals(run_t *r)
{
    const size_t n = kvc_workload_size(r->w);
    for (size_t i = r->replica; i < n; i += r->n_replicas) {
        if (has_predecessor(r, i)) continue; /* released when its previous turn finishes */
        int rc = heap_push(&r->heap, r->a,
                           (arrival_t){kvc_workload_request(r->w, i)->arrival_s, (uint32_t)i});
        if (rc) return rc;
    }
    return 0;
}

/* The engine's hold-back (src/model/engine.c): request wi waits while a request in the
 * scheduler that is still computing its prompt shares a whole block of prefix with wi that it
 * has not computed yet (the same namespace: with tenant salts, the same tenant). */
static bool held_back(const run_t *r, uint32_t wi, const kvc_token_t *prompt)
{
    const kvc_sim_request_t *q = kvc_workload_request(r->w, wi);
    const uint32_t bs = r->cfg->plan.block_size ? r->cfg->plan.block_size : 16;
    for (size_t i = 0; i < r->n_computing; i++) {
        const uint32_t ai = r->computing[i];
        const kvc_sim_request_t *a = kvc_workload_request(r->w, ai);
        if (r->cfg->tenant_salts && a->tenant != q->tenant) continue;
        const kvc_token_t *ap = a->tokens ? a->tokens : r->owned[ai];
        if (!ap) continue;
        /* it holds wi back iff their common prefix (the last prompt token aside) covers a whole
         * block past what it has computed */
        const uint64_t need = KVC_MAX((uint64_t)bs, ((uint64_t)r->computed[ai] / bs + 1) * bs);
        const uint32_t n = KVC_MIN(q->n_prompt, a->n_prompt) - 1;
        if (need > n) continue;
        uint32_t l = 0;
        while (l < need && prompt[l] == ap[l]) l++;
        if (l == need) return true;
    }
    return false;
}

static int admit_one(run_t *r, kvc_sched_t *s, arrival_t a, bool force);

/* A measured profile's per-request cost: a request reaches the scheduler this long after it
 * arrived (a server's HTTP, JSON, tokenizing and hand-over), its TTFT counted from arrival. */
static double admit_delay_s(const run_t *r)
{
    return kvc_sim_profile_fixed(r->cfg->profile).request_s;
}

/* Hand the scheduler every request that has arrived by now; refuse, like a server, those that
 * can never run.  With hold_shared_prefix, arrivals held back are tried first, in order;
 * `force` admits them all (nothing else can run). */
static int admit_arrivals(run_t *r, kvc_sched_t *s, bool force)
{
    size_t n_held = r->n_held;
    r->n_held = 0;
    if (r->tiers) { /* the engine's rule (engine.c, admit_pending): see admit_one */
        kvc_sched_stats_t st;
        kvc_sched_stats(s, &st); /* sched: */
        const uint32_t max = r->cfg->plan.max_num_seqs;
        r->tier_room = st.n_waiting || st.n_running >= max ? 0 : max - st.n_running;
    }
    for (size_t i = 0; i < n_held; i++) {
        int rc = admit_one(r, s, r->held[i], force);
        if (rc) return rc;
    }
    while (r->heap.n && r->heap.v[0].t + admit_delay_s(r) <= r->now) {
        int rc = admit_one(r, s, heap_pop(&r->heap), force);
        if (rc) return rc;
    }
    return 0;
}

static int admit_one(run_t *r, kvc_sched_t *s, arrival_t a, bool force)
{
    const kvc_sim_config_t *cfg = r->cfg;
    {
        const kvc_sim_request_t *q = kvc_workload_request(r->w, a.idx);
        const kvc_token_t *prompt = q->tokens;
        if (!prompt && r->owned[a.idx]) prompt = r->owned[a.idx]; /* held back before */
        if (!prompt) { /* a trace kept with tokens on demand: assemble this prompt */
            r->owned[a.idx] = kvc_alloc(r->a, q->n_prompt * sizeof(kvc_token_t), 0);
            if (!r->owned[a.idx]) return KVC_ENOMEM;
            (void)kvc_workload_prompt(r->w, a.idx, r->owned[a.idx], q->n_prompt);
            prompt = r->owned[a.idx];
        }
        /* Like a server: a prompt at or over max_model_len is refused; outputs stop there. */
        uint64_t mml = r->res->planned.max_model_len;
        if (mml && q->n_prompt >= mml) {
            r->res->rejected++;
            return 0;
        }
        if (r->computed && !force && held_back(r, a.idx, prompt)) {
            r->held[r->n_held++] = a; /* room for every request: allocated with the run */
            return 0;
        }
        uint32_t max_out = KVC_MAX(q->max_output, q->n_output);
        if (mml && (uint64_t)q->n_prompt + max_out > mml) max_out = (uint32_t)(mml - q->n_prompt);
        /* the pre-paging allocator reserves max_model_len for every request it admits */
        if (cfg->allocation == KVC_SIM_ALLOC_CONTIGUOUS && mml)
            max_out = (uint32_t)KVC_MIN(mml - q->n_prompt, (uint64_t)UINT32_MAX);
        kvc_namespace_t ns = {0};
        if (cfg->tenant_salts) {
            int rc = kvc_namespace_set_salt(&ns, kvc_workload_tenant_name(r->w, q->tenant));
            if (rc) return internal(r, rc, "kvc_namespace_set_salt");
        }
        /* With tiers, the engine hands a request to the scheduler (and fetches for it) only when
         * it can be admitted now: nothing waits there and a running slot is free.  Else it
         * waits, in arrival order, so that its lookup sees the pool and the tiers as they are at
         * its admission: a prefix evicted while it queued is fetched, not recomputed. */
        if (r->tiers && !force && !kvc__sim_tiers_fetching(r->tiers, a.idx)) {
            if (!r->tier_room) {
                r->held[r->n_held++] = a; /* room for every request: allocated with the run */
                return 0;
            }
            r->tier_room--;
        }
        if (r->tiers) { /* the lookup goes on past the pool; a fetch holds the request back */
            const kvc_prefix_query_t pq = {
                .ns = &ns,
                .tokens = prompt,
                .n_tokens = q->n_prompt,
                .priority = KVC_MIN(q->priority, (uint32_t)KVC_PREFIX_MAX_PRIORITY)};
            bool wait;
            double ready;
            int rc = kvc__sim_tiers_admit(r->tiers, &pq, a.idx, &a.t, &wait, &ready);
            if (rc) return internal(r, rc, "the tier lookup");
            if (wait) return heap_push(&r->heap, r->a, (arrival_t){ready, a.idx});
        }
        kvc_sched_req_t req = {.prompt = prompt,
                               .n_prompt = q->n_prompt,
                               .max_output = max_out,
                               .priority = q->priority,
                               .tenant = q->tenant,
                               .ns = &ns,
                               .tag = a.idx};
        kvc_req_id_t id;
        int rc = kvc_sched_add(s, &req, a.t, &id); /* sched: */
        if (rc == KVC_ERANGE) { /* it can never fit the pool or its caps: refused, counted */
            if (cfg->trace)
                fprintf(cfg->trace, "request %u (%u prompt tokens) refused: it can never fit\n",
                        a.idx, q->n_prompt);
            r->res->rejected++;
            return 0;
        }
        if (rc) return internal(r, rc, "kvc_sched_add");
        if (r->computed) {
            r->computed[a.idx] = 0;
            r->computing[r->n_computing++] = a.idx;
        }
    }
    return 0;
}

/* hold_shared_prefix: request wi's prompt is computed up to `upto` (KVC_NONE: done, or it
 * ended). */
static void note_computed(run_t *r, uint32_t wi, uint32_t upto)
{
    if (!r->computed || r->computed[wi] == KVC_NONE) return;
    r->computed[wi] = upto;
    if (upto != KVC_NONE) return;
    for (size_t i = 0; i < r->n_computing; i++)
        if (r->computing[i] == wi) {
            r->computing[i] = r->computing[--r->n_computing];
            return;
        }
}

/* Nothing can run now: move the clock to the next arrival, or stop.  *stop is set when the
 * replica has nothing left to do. */
static int wait_for_work(run_t *r, kvc_sched_t *s, uint64_t *stuck, bool *stop)
{
    kvc_sched_stats_t st;
    kvc_sched_stats(s, &st); /* sched: */
    bool busy = st.n_running || st.n_waiting || st.n_swapped;
    *stop = !busy && !r->heap.n;
    if (*stop) return 0;
    if (r->heap.n && (!busy || ++*stuck > 2)) {
        r->now = KVC_MAX(r->now, r->heap.v[0].t + admit_delay_s(r));
        *stuck = 0;
        return 0;
    }
    if (!r->heap.n && ++*stuck > 1000)
        return kvc__msgf(KVC_EINVAL, r->err, r->err_cap,
                         "the simulation is stuck: %u requests wait and nothing can run",
                         st.n_waiting + st.n_swapped);
    return 0;
}

/* What each row of the plan sampled: the workload's next output token, after accepting each
 * draft with probability spec_acceptance.  *batch_tokens: the tokens the step computed. */
static int step_results(run_t *r, const kvc_sched_plan_t *plan, uint32_t *batch_tokens)
{
    if (r->results_cap < plan->n_entries) {
        kvc_free(r->a, r->results);
        r->results_cap = plan->n_entries * 2;
        r->results = kvc_alloc(r->a, r->results_cap * sizeof *r->results, 0);
        if (!r->results) {
            r->results_cap = 0;
            return KVC_ENOMEM;
        }
    }
    *batch_tokens = 0;
    for (uint32_t i = 0; i < plan->n_entries; i++) {
        const kvc_sched_entry_t *e = &plan->entries[i];
        uint32_t wi = (uint32_t)e->tag;
        const kvc_sim_request_t *q = kvc_workload_request(r->w, wi);
        *batch_tokens += e->n_tokens;
        r->results[i] = (kvc_sched_result_t){.id = e->id};
        note_computed(r, wi, e->samples ? KVC_NONE : e->first_pos + e->n_tokens);
        if (!e->samples) continue;
        uint32_t k = r->produced[wi], a = 0;
        while (a < e->n_drafts && kvc_rng_double(&r->rng) < r->cfg->spec_acceptance) a++;
        if (k + 1 + a > q->n_output) a = q->n_output > k + 1 ? q->n_output - k - 1 : 0;
        uint32_t bonus = k + a;
        r->results[i].n_accepted = a;
        r->results[i].token = q->output_tokens && bonus < q->n_output ? q->output_tokens[bonus] : 0;
        r->produced[wi] = k + 1 + a;
        r->results[i].finished = r->produced[wi] >= q->n_output;
    }
    return 0;
}

/* The scheduler's checker (which checks the seq table, prefix cache and pool under it): 0, the
 * checker's own allocation failure as is, or KVC_ECORRUPT with `what` and its message. */
static int check_sched(run_t *r, const kvc_sched_t *s, const char *what)
{
    char msg[256] = "";
    int rc = kvc_sched_check(s, msg, sizeof msg); /* sched: */
    if (rc == 0 || rc == KVC_ENOMEM) return rc;
    return kvc__msgf(KVC_ECORRUPT, r->err, r->err_cap, "%s: %s", what,
                     msg[0] ? msg : kvc_strerror(rc));
}

/* check_every_step: the scheduler's invariants, the token budget and the running cap. */
static int check_step(run_t *r, const kvc_sched_t *s, uint32_t batch_tokens)
{
    const kvc_sim_config_t *cfg = r->cfg;
    kvc_sched_stats_t cst;
    kvc_sched_stats(s, &cst); /* sched: */
    char what[32];
    snprintf(what, sizeof what, "step %llu", (unsigned long long)r->res->steps);
    int rc = check_sched(r, s, what);
    if (rc) return rc;
    if (batch_tokens > cfg->plan.max_num_batched_tokens || cst.n_running > cfg->plan.max_num_seqs)
        return kvc__msgf(KVC_ECORRUPT, r->err, r->err_cap,
                         "step %llu: %u tokens, %u running: over the limits",
                         (unsigned long long)r->res->steps, batch_tokens, cst.n_running);
    return 0;
}

/* Finished requests become records; closed loop, each releases its conversation's next turn
 * think_s after it finished. */
static int collect_finished(run_t *r, kvc_sched_t *s)
{
    const kvc_sched_done_t *done;
    uint32_t nd;
    (void)kvc_sched_take_finished(s, &done, &nd); /* sched: */
    for (uint32_t i = 0; i < nd; i++) {
        const kvc_sched_done_t *d = &done[i];
        uint32_t wi = (uint32_t)d->tag;
        int rc;
        note_computed(r, wi, KVC_NONE);
        if (d->error) {
            /* Its sequence could not take a step's results for lack of memory: a server's
             * failed request, counted; the run goes on.  Any other error only a bug causes
             * (the engine never leaves a seq step in flight). */
            if (d->error != KVC_ENOMEM)
                return kvc__msgf(KVC_ECORRUPT, r->err, r->err_cap,
                                 "internal: request %u ended with %s", wi, kvc_errname(d->error));
            r->res->errored++;
        } else {
            kvc_sim_record_t rec = {.arrival_s = d->arrival_s,
                                    .first_token_s = d->first_token_s,
                                    .finish_s = d->finish_s,
                                    .n_prompt = d->n_prompt,
                                    .n_output = d->n_output,
                                    .n_hit_tokens = d->n_hit_tokens,
                                    .tenant = d->tenant,
                                    .priority = d->priority,
                                    .n_preemptions = d->n_preemptions,
                                    .recomputed_tokens = d->recomputed_tokens};
            if ((rc = kvc_report_add(r->report, &rec))) return internal(r, rc, "kvc_report_add");
            r->res->completed++;
        }
        kvc_free(r->a, r->owned[wi]);
        r->owned[wi] = NULL;
        uint32_t nx = r->next_turn[wi];
        if (nx != KVC_NONE && r->cfg->closed_loop) {
            const kvc_sim_request_t *q2 = kvc_workload_request(r->w, nx);
            if ((rc = heap_push(&r->heap, r->a, (arrival_t){d->finish_s + q2->think_s, nx})))
                return rc;
        }
    }
    r->done_total += nd;
    return 0;
}

/* After a step: the peaks, replica 0's time series, the step count and progress. */
static int sample_state(run_t *r, const kvc_sched_t *s, uint32_t batch_tokens)
{
    const kvc_sim_config_t *cfg = r->cfg;
    kvc_sched_stats_t st;
    kvc_sched_stats(s, &st); /* sched: */
    r->res->peak_kv_blocks = KVC_MAX(r->res->peak_kv_blocks, st.blocks_used);
    if (cfg->allocation == KVC_SIM_ALLOC_CONTIGUOUS && st.n_running) {
        /* each running request holds max_model_len of reserved KV: what it does not use is
         * fragmentation (internal to its reservation) */
        const uint64_t per =
            (r->res->planned.max_model_len + cfg->plan.block_size - 1) / cfg->plan.block_size;
        const uint64_t reserved = per * st.n_running;
        const double frag = reserved ? 1.0 - (double)st.blocks_used / (double)reserved : 0;
        r->res->peak_reserved_blocks = KVC_MAX(r->res->peak_reserved_blocks, reserved);
        r->res->fragmentation_peak = fmax(r->res->fragmentation_peak, frag);
        r->frag_sum += frag;
        r->frag_steps++;
    }
    r->res->peak_running = KVC_MAX(r->res->peak_running, st.n_running);
    if (r->pc) { /* after each step: blocks are stranded as they are allocated, in the step */
        kvc_prefix_stats_t ps;
        kvc_prefix_stats(r->pc, &ps);
        r->res->peak_stranded_blocks = KVC_MAX(r->res->peak_stranded_blocks, ps.n_stranded_blocks);
    }
    if (r->replica == 0) {
        kvc_sim_sample_t smp = {.t_s = r->now,
                                .kv_blocks_used = st.blocks_used,
                                .kv_blocks_total = r->num_blocks,
                                .running = st.n_running,
                                .waiting = st.n_waiting,
                                .swapped = st.n_swapped,
                                .batch_tokens = batch_tokens};
        int rc = kvc_report_sample(r->report, &smp);
        if (rc) return internal(r, rc, "kvc_report_sample");
    }
    r->res->steps++;
    if (cfg->progress && r->done_total - r->last_progress >= KVC_MAX(r->total / 100, 1)) {
        r->last_progress = r->done_total;
        cfg->progress(cfg->progress_ctx, r->done_total, r->total);
    }
    return 0;
}

/* The replica's counters into the result, and its final check. */
static int replica_totals(run_t *r, const kvc_sched_t *s)
{
    kvc_sched_stats_t st;
    kvc_sched_stats(s, &st); /* sched: */
    r->res->preemptions += st.preemptions;
    r->res->recomputed_tokens += st.recomputed_tokens;
    r->res->swapped_out_bytes += st.swapped_out_bytes;
    r->res->swapped_in_bytes += st.swapped_in_bytes;
    r->res->prompt_tokens += st.prompt_tokens_admitted;
    r->res->hit_tokens += st.hit_tokens;
    r->res->resume_hit_tokens += st.resume_hit_tokens;
    r->res->simulated_s = KVC_MAX(r->res->simulated_s, r->now);
    if (r->pc) {
        kvc_prefix_stats_t ps;
        kvc_prefix_stats(r->pc, &ps);
        r->res->end_stranded_blocks += ps.n_stranded_blocks;
        r->res->strandings += ps.n_strandings;
    }
    return check_sched(r, s, "internal");
}

static int run_replica(run_t *r)
{
    const kvc_sim_config_t *cfg = r->cfg;
    replica_t rep;
    int rc = replica_open(r, r->a, r->num_blocks, &rep);
    if (rc) return rc;
    kvc_sched_t *s = rep.s;
    r->pc = rep.pc;
    if (r->tiers && (rc = kvc__sim_tiers_replica_begin(r->tiers, rep.pc, r->num_blocks, &r->now))) {
        (void)kvc__sim_tiers_replica_end(r->tiers);
        r->pc = NULL;
        replica_close(&rep);
        return rc;
    }
    r->heap.n = 0;
    r->n_held = r->n_computing = 0;
    r->now = 0;
    r->last_progress = 0;
    uint64_t stuck = 0;
    if ((rc = queue_arrivals(r))) goto out;
    for (;;) {
        if ((rc = admit_arrivals(r, s, false))) goto out;
        const kvc_sched_plan_t *plan;
        if ((rc = internal(r, kvc_sched_step(s, r->now, &plan), "kvc_sched_step"))) /* sched: */
            goto out;
        if (cfg->trace) fputs(kvc_sched_trace(s), cfg->trace);
        if (plan->n_entries == 0 && r->n_held) { /* nothing runs: what is held goes in */
            if ((rc = admit_arrivals(r, s, true))) goto out;
            continue;
        }
        if (plan->n_entries == 0) {
            bool stop;
            if ((rc = wait_for_work(r, s, &stuck, &stop))) goto out;
            if (stop) break;
            continue;
        }
        stuck = 0;
        r->now += kvc_sim_step_time(&r->cost, plan, NULL);
        uint32_t batch_tokens;
        if ((rc = step_results(r, plan, &batch_tokens))) goto out;
        rc = kvc_sched_complete(s, r->results, plan->n_entries, r->now); /* sched: */
        if ((rc = internal(r, rc, "kvc_sched_complete"))) goto out;
        if (cfg->check_every_step && (rc = check_step(r, s, batch_tokens))) goto out;
        if ((rc = collect_finished(r, s))) goto out;
        if ((rc = sample_state(r, s, batch_tokens))) goto out;
    }
    rc = replica_totals(r, s);
out:
    if (rc == KVC_ENOMEM) {
        /* a failed allocation must leave the scheduler's state whole (one check, on the way out) */
        int crc = check_sched(r, s, "after a failed allocation");
        if (crc == KVC_ECORRUPT) rc = crc;
    }
    r->pc = NULL;
    if (r->tiers) {
        int trc = kvc__sim_tiers_replica_end(r->tiers);
        if (!rc) rc = trc;
    }
    replica_close(&rep);
    return rc;
}

/* ---- the run -------------------------------------------------------------------------------- */
/* The deployment's pool and groups, the cost model and the checks on them; 0 or an error with
 * the message written. */
static int plan_run(const kvc_sim_config_t *cfg, const kvc_workload_t *w, kvc_sim_result_t *out,
                    uint32_t window[KVC_MAX_GROUPS], char *err, size_t cap)
{
    if ((unsigned)cfg->allocation >= KVC_SIM_ALLOC__COUNT)
        return kvc__msgf(KVC_EINVAL, err, cap, "allocation %d is not paged or contiguous",
                         (int)cfg->allocation);
    if (cfg->spec_acceptance < 0 || cfg->spec_acceptance > 1 || cfg->step_overhead_s < 0)
        return kvc__msgf(KVC_EINVAL, err, cap,
                         "spec acceptance must be in 0..1 and the step overhead >= 0");
    if (kvc_workload_n_tenants(w) > KVC_SCHED_MAX_TENANTS ||
        kvc_workload_n_classes(w) > KVC_MAX_CLASSES)
        return kvc__msgf(KVC_EINVAL, err, cap,
                         "the workload has %u tenants and %u classes; at most %d and %d",
                         kvc_workload_n_tenants(w), kvc_workload_n_classes(w),
                         KVC_SCHED_MAX_TENANTS, KVC_MAX_CLASSES);
    if ((unsigned)cfg->eviction >= KVC_EVICT__COUNT) {
        char names[128] = "";
        for (const char *const *n = kvc_eviction_names(); *n; n++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s",
                     n == kvc_eviction_names() ? "" : ", ", *n);
        return kvc__msgf(KVC_EINVAL, err, cap, "eviction policy %d is not one of %s",
                         (int)cfg->eviction, names);
    }
    /* The planner sizes a hybrid's recurrent state; the simulated pool holds KV blocks only. */
    if (cfg->model.recurrent)
        return kvc__msgf(KVC_EINVAL, err, cap,
                         "%u recurrent (Mamba) layers: their per-sequence state is not simulated "
                         "(kvcache plan sizes it)",
                         cfg->model.n_recurrent_layers);
    int rc = 0;
    if (cfg->planned) { /* the caller planned this deployment already */
        out->planned = *cfg->planned;
    } else {
        char msg[256];
        rc = kvc_plan_compute(&cfg->model, &cfg->gpu, &cfg->plan, &out->planned, msg, sizeof msg);
        if (rc) return kvc__msgf(rc, err, cap, "%s", msg);
    }
    uint64_t blocks = cfg->num_blocks ? cfg->num_blocks : out->planned.num_blocks;
    if (!cfg->num_blocks && !out->planned.fits)
        return kvc__msgf(
            KVC_EINVAL, err, cap,
            "the deployment does not start (it fails at %s; see kvcache plan); give --num-blocks "
            "to simulate a pool anyway",
            kvc_plan_phase_name((kvc_plan_phase_id_t)out->planned.failed_phase));
    if (blocks == 0 || blocks > (1u << 30))
        return kvc__msgf(KVC_EINVAL, err, cap, "the KV pool would hold %llu blocks",
                         (unsigned long long)blocks);
    if (cfg->plan.block_size > 256)
        return kvc__msgf(KVC_EINVAL, err, cap, "block size %u: the simulator's pool takes 1..256",
                         cfg->plan.block_size);
    /* KV groups: sliding-window layers get a group of their own when their blocks are freed. */
    uint32_t n_groups = 1;
    const kvc_plan_model_t *m = &cfg->model;
    memset(window, 0, KVC_MAX_GROUPS * sizeof *window);
    if (m->sliding_window && m->n_sliding_layers && cfg->plan.window_freeing) {
        if (m->n_sliding_layers >= m->n_layers) {
            window[0] = m->sliding_window;
        } else {
            n_groups = 2;
            window[1] = m->sliding_window;
        }
    }
    out->num_blocks = (uint32_t)blocks;
    out->n_groups = n_groups;
    out->n_replicas = cfg->plan.dp ? cfg->plan.dp : 1;
    const kvc_plan_result_t *pr = &out->planned;
    if (pr->kv_bytes_per_token_per_gpu == 0 || pr->layers_per_gpu == 0 ||
        pr->layers_per_gpu > UINT32_MAX / 2)
        return kvc__msgf(KVC_EINVAL, err, cap,
                         "the model's KV cache takes %llu bytes per token over %u layers per GPU: "
                         "nothing a simulated pool can hold (check the config's layer and head "
                         "counts)",
                         (unsigned long long)pr->kv_bytes_per_token_per_gpu, pr->layers_per_gpu);
    out->kv_bytes_per_block = sat_mul(pr->kv_bytes_per_token, cfg->plan.block_size);
    if ((rc = kvc_sim_cost_model(m, &cfg->gpu, &cfg->plan, pr, cfg->step_overhead_s,
                                 cfg->allreduce_latency_s, &out->cost)))
        return kvc__msgf(rc, err, cap,
                         "the cost model needs positive, finite FLOP/s, bandwidth and KV bytes "
                         "per token (at most 1e12), and finite sizes");
    out->cost.no_kv_cache = cfg->no_kv_cache;
    out->cost.profile = cfg->profile;
    return 0;
}

/* The built-in victim policy's name, "custom" for the caller's own. */
static const char *victim_name(kvc_victim_fn fn)
{
    if (!fn) return kvc_victim_name(KVC_VICTIM_LATEST); /* the scheduler's default */
    for (int v = 0; v < KVC_VICTIM__COUNT; v++)
        if (kvc_victim_policy((kvc_victim_t)v) == fn) return kvc_victim_name((kvc_victim_t)v);
    return "custom";
}

/* Every constant the numbers rest on goes into the report; then it is finished. */
static int finish_report(const kvc_sim_config_t *cfg, const kvc_sim_result_t *out,
                         kvc_report_t *report)
{
    const kvc_sim_cost_model_t *cm = &out->cost;
    struct {
        const char *key;
        double v;
    } nums[] = {
        {"kv_blocks_per_replica", out->num_blocks},
        {"block_size", cfg->plan.block_size},
        {"kv_groups", out->n_groups},
        {"replicas", out->n_replicas},
        {"tp", cm->tp},
        {"pp", cm->pp},
        {"max_num_seqs", cfg->plan.max_num_seqs},
        {"max_num_batched_tokens", cfg->plan.max_num_batched_tokens},
        {"cost.flops_per_s", cm->flops_per_s},
        {"cost.attn_flops_per_s", cm->attn_flops_per_s},
        {"cost.bytes_per_s", cm->bytes_per_s},
        {"cost.linear_flops_per_token", cm->linear_flops_per_token},
        {"cost.attn_flops_per_pair", cm->attn_flops_per_pair},
        {"cost.dense_weight_bytes", cm->dense_weight_bytes},
        {"cost.expert_weight_bytes", cm->expert_weight_bytes},
        {"cost.kv_bytes_per_token", cm->kv_bytes_per_token},
        {"cost.comm_bytes_per_token", cm->comm_bytes_per_token},
        {"cost.allreduce_per_step", cm->n_allreduce},
        {"cost.link_bytes_per_s", cm->link_bytes_per_s},
        {"cost.allreduce_latency_s", cm->allreduce_latency_s},
        {"cost.step_overhead_s", cm->step_overhead_s},
        {"cost.host_link_bytes_per_s", cm->host_link_bytes_per_s},
        {"spec_tokens", cfg->sched.spec_tokens},
        {"spec_acceptance", cfg->spec_acceptance},
        {"seed", (double)cfg->seed},
        {"resume_hit_tokens", (double)out->resume_hit_tokens},
        {"rejected_requests", (double)out->rejected},
        {"kv_bytes_per_block", (double)out->kv_bytes_per_block},
        {"max_model_len", (double)out->planned.max_model_len},
        {"cost.kv_block_efficiency", cm->kv_block_efficiency},
        {"fragmentation.mean", out->fragmentation_mean},
        {"fragmentation.peak", out->fragmentation_peak},
    };
    int rc = 0;
    for (size_t i = 0; i < KVC_ARRAY_LEN(nums) && !rc; i++)
        rc = kvc_report_add_config_num(report, nums[i].key, nums[i].v);
    const char *strs[][2] = {
        {"model", cfg->model.name},
        {"gpu", cfg->gpu.name},
        {"admission", kvc_admission_name(cfg->sched.admission)},
        {"preemption", kvc_preemption_name(cfg->sched.preemption)},
        {"victim", victim_name(cfg->sched.victim)},
        {"eviction", kvc_eviction_name(cfg->eviction)},
        {"prefix_caching", cfg->prefix_caching ? "on" : "off"},
        {"allocation", kvc_sim_allocation_name(cfg->allocation)},
        {"kv_cache", cfg->no_kv_cache ? "off (every step recomputes the whole context)" : "on"},
        {"arrivals", cfg->closed_loop ? "closed loop" : "open loop (trace times)"},
        {"step_time", "pp x (max(compute, memory) + tp comm) + overhead + swap bytes / host link"},
    };
    for (size_t i = 0; i < KVC_ARRAY_LEN(strs) && !rc; i++)
        rc = kvc_report_add_config(report, strs[i][0], strs[i][1]);
    if (rc) return rc;
    kvc_report_totals_t t = {
        .preemptions = out->preemptions,
        .recomputed_tokens = out->recomputed_tokens,
        .swapped_bytes = out->swapped_out_bytes + out->swapped_in_bytes,
        .prompt_tokens = out->prompt_tokens,
        .hit_tokens = out->hit_tokens,
        .peak_kv_blocks = out->peak_kv_blocks,
        .simulated_s = out->simulated_s,
        .steps = out->steps,
        .peak_stranded_blocks = out->peak_stranded_blocks,
        .peak_stranded_bytes = sat_mul(out->peak_stranded_blocks, out->kv_bytes_per_block),
        .end_stranded_blocks = out->end_stranded_blocks,
        .end_stranded_bytes = sat_mul(out->end_stranded_blocks, out->kv_bytes_per_block),
        .strandings = out->strandings,
        .errored = out->errored};
    return kvc_report_finish(report, &t);
}

int kvc_sim_run(const kvc_sim_config_t *cfg, const kvc_workload_t *w, kvc_report_t *report,
                kvc_sim_result_t *out, char *err, size_t cap)
{
    if (err && cap) err[0] = 0;
    if (!cfg || !w || !report || !out) return kvc__msgf(KVC_EINVAL, err, cap, "missing arguments");
    *out = (kvc_sim_result_t){0};
    uint64_t t0 = kvc_now_ns();
    uint32_t window[KVC_MAX_GROUPS];
    int rc = plan_run(cfg, w, out, window, err, cap);
    if (rc) return rc;
    /* The engine limits as the planner resolved them (0 in the config: vLLM's default for the
     * GPU), so the scheduler and the report use the values the plan priced. */
    kvc_sim_config_t resolved = *cfg;
    resolved.plan.max_num_seqs = out->planned.params.max_num_seqs;
    resolved.plan.max_num_batched_tokens = out->planned.params.max_num_batched_tokens;
    /* the baselines: nothing to hit without a cache or with private contiguous regions; the
     * contiguous allocator admits only what its reservation of max_model_len fits */
    if (cfg->no_kv_cache || cfg->allocation == KVC_SIM_ALLOC_CONTIGUOUS)
        resolved.prefix_caching = false;
    if (cfg->allocation == KVC_SIM_ALLOC_CONTIGUOUS)
        resolved.sched.admission = KVC_ADMIT_RESERVE_MAX;
    cfg = &resolved;

    const size_t n = kvc_workload_size(w);
    const bool limit_given = cfg->max_memory_bytes != 0;
    const uint64_t limit = limit_given ? cfg->max_memory_bytes : memory_available();
    /* the workload is already in memory: the run has what is left */
    mem_t mem = {.inner = cfg->allocator, .limit = limit > w->bytes ? limit - w->bytes : 0};
    const kvc_allocator_t a = mem_allocator(&mem);
    run_t r = {.cfg = cfg,
               .w = w,
               .report = report,
               .res = out,
               .cost = out->cost,
               .a = &a,
               .num_blocks = out->num_blocks,
               .n_groups = out->n_groups,
               .n_replicas = out->n_replicas,
               .total = n,
               .err = err,
               .err_cap = cap};
    memcpy(r.window, window, sizeof r.window);
    double alloc_bytes = 0;
    rc = check_memory(&r, limit, limit_given, &alloc_bytes, err, cap);
    /* allocations count against the limit, or against what the estimate said the run would
     * allocate where that is more (tables whose pages are written only as blocks are used) */
    if (!rc && alloc_bytes > (double)mem.limit)
        mem.limit = alloc_bytes >= 1.8e19 ? UINT64_MAX : (uint64_t)alloc_bytes;
    if (!rc) {
        r.produced = kvc_calloc(&a, n ? n : 1, sizeof(uint32_t), 0);
        r.next_turn = kvc_alloc(&a, (n ? n : 1) * sizeof(uint32_t), 0);
        r.follows = kvc_alloc(&a, (n ? n : 1) * sizeof(bool), 0);
        r.owned = kvc_calloc(&a, n ? n : 1, sizeof(kvc_token_t *), 0);
        if (!r.produced || !r.next_turn || !r.follows || !r.owned) rc = KVC_ENOMEM;
    }
    if (!rc && cfg->hold_shared_prefix && cfg->prefix_caching) {
        r.computed = kvc_alloc(&a, (n ? n : 1) * sizeof(uint32_t), 0);
        r.computing = kvc_alloc(&a, (n ? n : 1) * sizeof(uint32_t), 0);
        if (!r.computed || !r.computing) rc = KVC_ENOMEM;
        for (size_t i = 0; !rc && i < n; i++) r.computed[i] = KVC_NONE;
    }
    if (!rc && ((cfg->hold_shared_prefix && cfg->prefix_caching) || cfg->n_tiers) &&
        !(r.held = kvc_alloc(&a, (n ? n : 1) * sizeof(arrival_t), 0)))
        rc = KVC_ENOMEM;
    if (!rc && cfg->n_tiers)
        rc = kvc__sim_tiers_create(cfg, &out->planned, &out->cost, out->n_groups, &a, &r.tiers, err,
                                   cap);
    kvc_rng_seed(&r.rng, cfg->seed);
    out->requests = n;
    if (!rc) rc = link_turns(&r);
    /* request i goes to replica i mod dp: replicas past the last request receive none and
     * cost nothing */
    for (uint32_t rep = 0; !rc && rep < out->n_replicas && rep < n; rep++) {
        r.replica = rep;
        rc = run_replica(&r);
    }
    for (size_t i = 0; r.owned && i < n; i++) kvc_free(&a, r.owned[i]);
    kvc_free(&a, r.owned);
    kvc_free(&a, r.produced);
    kvc_free(&a, r.next_turn);
    kvc_free(&a, r.follows);
    kvc_free(&a, r.computed);
    kvc_free(&a, r.computing);
    kvc_free(&a, r.held);
    kvc_free(&a, r.heap.v);
    kvc_free(&a, r.results);
    if (r.tiers) kvc__sim_tiers_result(r.tiers, out);
    kvc__sim_tiers_destroy(r.tiers);
    out->peak_bytes = mem.peak;
    if (rc) {
        char x[32], y[32], z[32];
        if (rc == KVC_ENOMEM && mem.refused && err && cap && !err[0])
            kvc__msgf(rc, err, cap,
                      "the simulation needs more memory than the limit of %s (%s): it held %s "
                      "when it asked for %llu bytes more",
                      kvc__fmt_iec(x, sizeof x, (double)limit),
                      limit_given ? "the limit given" : "the memory this machine has",
                      kvc__fmt_iec(y, sizeof y, (double)(mem.held + w->bytes)),
                      (unsigned long long)mem.refused);
        if (rc == KVC_ENOMEM && mem.failed && err && cap && !err[0])
            kvc__msgf(rc, err, cap,
                      "out of memory: an allocation of %s failed (the run would allocate about %s "
                      "in all; this machine has %s)",
                      kvc__fmt_iec(x, sizeof x, (double)mem.failed),
                      kvc__fmt_iec(y, sizeof y, alloc_bytes > 0 ? alloc_bytes : (double)mem.peak),
                      kvc__fmt_iec(z, sizeof z, (double)memory_available()));
        if (err && cap && !err[0])
            kvc__msgf(rc, err, cap, "simulation failed: %s", kvc_strerror(rc));
        return rc;
    }
    if (r.frag_steps) out->fragmentation_mean = r.frag_sum / (double)r.frag_steps;
    if (out->n_tiers)
        rc = kvc_report_set_tiers(report, out->tiers, out->n_tiers, out->tier_saved_tokens,
                                  &out->break_even);
    if (!rc) rc = finish_report(cfg, out, report);
    if (rc) return kvc__msgf(rc, err, cap, "the report: %s", kvc_strerror(rc));
    out->wall_s = (double)(kvc_now_ns() - t0) * 1e-9;
    return 0;
}
