/* tiers.c - KV tiers in the simulator: host, disk and redis copies of blocks modelled by
 * capacity, bandwidth and round-trip time, driven by the same prefix cache events, the same
 * stores' index, admission and write budget (kvc_tier_meta_create) and the same
 * fetch-or-recompute decision (kvc_tier_decide) as the engine; and the break-even table
 * that says at which round trip a tier's hit stops beating recompute.
 *
 * engine.c calls in at three places (see tiers_int.h): the prefix cache's events (a block
 * cached goes to the write-through tiers, a block evicted to the evict-mode ones), a
 * request's admission (the lookup past the pool, the decision per run, the fetch's time on
 * the link, and, when the fetch is complete, the blocks cached in the pool), and the
 * replica's start and end.  The link of a tier serves one fetch at a time per replica: a
 * fetch waits for the one before it (a queue, not a shared bandwidth); a request that misses
 * blocks another request is fetching waits for that fetch (the fence).  Writes to a tier
 * are asynchronous and cost the link nothing (the engine copies them off the request's
 * path); what they cost a disk is its write budget. */
#include "tiers_int.h"

#include "report_int.h"
#include "util/fmt.h"
#include "util/msg.h"
#include "workload_int.h" /* kvc__json_string */

#include <math.h>
#include <string.h>

/* ---- links, prefill time, break-even ---------------------------------------------------- */
void kvc_sim_tier_link(const kvc_tier_spec_t *spec, const kvc_sim_cost_model_t *cm,
                       double *bandwidth_Bps, double *rtt_s)
{
    const double host = cm && cm->host_link_bytes_per_s > 0 ? cm->host_link_bytes_per_s : 32e9;
    double bw = 0, rtt = 0;
    switch (spec ? spec->kind : KVC_TIER_HOST) {
    case KVC_TIER_HOST:
        bw = host, rtt = 10e-6;
        break;
    case KVC_TIER_DISK:
        bw = fmin(7e9, host), rtt = 100e-6;
        break;
    case KVC_TIER_REDIS:
    default:
        bw = 1.25e9, rtt = 200e-6;
        break;
    }
    if (spec && spec->bandwidth_Bps > 0) bw = spec->bandwidth_Bps;
    if (spec && spec->rtt_s > 0) rtt = spec->rtt_s;
    if (bandwidth_Bps) *bandwidth_Bps = bw;
    if (rtt_s) *rtt_s = rtt;
}

double kvc_sim_prefill_s(const kvc_sim_cost_model_t *cm, uint32_t chunk_tokens, uint64_t first_pos,
                         uint64_t n_tokens)
{
    if (!cm || n_tokens == 0) return 0;
    const double chunk = chunk_tokens ? chunk_tokens : 1;
    double pos = (double)first_pos + (double)n_tokens / 2 - chunk / 2;
    pos = fmin(fmax(pos, 0), (double)UINT32_MAX - chunk);
    kvc_sched_entry_t e = {0};
    e.first_pos = (uint32_t)pos;
    e.n_tokens = (uint32_t)chunk;
    e.n_context = e.first_pos + e.n_tokens;
    e.prefill = true;
    kvc_sched_plan_t plan = {.entries = &e, .n_entries = 1, .n_prefill_tokens = e.n_tokens};
    double t = kvc_sim_step_time(cm, &plan, NULL) - cm->step_overhead_s;
    return t > 0 ? (double)n_tokens * t / chunk : 0;
}

int kvc_sim_break_even(const kvc_sim_cost_model_t *cm, uint32_t chunk_tokens, uint32_t block_tokens,
                       uint64_t block_bytes, double bandwidth_Bps, uint32_t n_tokens,
                       kvc_sim_break_even_t *out)
{
    if (!cm || !out || block_tokens == 0 || !isfinite(bandwidth_Bps) || !(bandwidth_Bps > 0))
        return KVC_EINVAL;
    kvc_sim_break_even_t b = {0};
    b.n_blocks = n_tokens / block_tokens;
    b.n_tokens = b.n_blocks * block_tokens;
    b.bytes = (double)b.n_blocks * (double)block_bytes;
    b.recompute_s = kvc_sim_prefill_s(cm, chunk_tokens, 0, b.n_tokens);
    b.transfer_s = b.bytes / bandwidth_Bps;
    b.rtt_s = b.recompute_s - b.transfer_s;
    b.never = !(b.rtt_s > 0);
    *out = b;
    return 0;
}

static const uint32_t table_lengths[KVC_SIM_BREAK_EVEN_LENGTHS] = {1024, 4096, 16384, 65536};

static int table_fill(const kvc_sim_cost_model_t *cm, uint32_t chunk, uint32_t bs,
                      uint64_t block_bytes, uint64_t max_model_len, const kvc_tier_spec_t *specs,
                      uint32_t n, kvc_sim_tier_table_t *out)
{
    memset(out, 0, sizeof *out);
    out->n_tiers = n;
    out->block_tokens = bs;
    out->block_bytes = block_bytes;
    double p = kvc_sim_prefill_s(cm, chunk, 0, chunk);
    out->prefill_tokens_per_s = p > 0 ? chunk / p : 0;
    for (uint32_t i = 0; i < KVC_SIM_BREAK_EVEN_LENGTHS; i++)
        if (!max_model_len || table_lengths[i] < max_model_len)
            out->lengths[out->n_lengths++] = table_lengths[i];
    if (out->n_lengths == 0) { /* a short context: its longest prompt, in whole blocks */
        uint64_t l = (max_model_len - 1) / bs * bs;
        out->lengths[out->n_lengths++] = (uint32_t)(l ? l : bs);
    }
    for (uint32_t k = 0; k < n; k++) {
        out->kind[k] = specs[k].kind;
        kvc_sim_tier_link(&specs[k], cm, &out->bandwidth_Bps[k], &out->rtt_s[k]);
        for (uint32_t i = 0; i < out->n_lengths; i++) {
            int rc = kvc_sim_break_even(cm, chunk, bs, block_bytes, out->bandwidth_Bps[k],
                                        out->lengths[i], &out->cells[k][i]);
            if (rc) return rc;
        }
    }
    return 0;
}

int kvc_sim_tier_table(const kvc_sim_config_t *cfg, kvc_sim_tier_table_t *out, char *err,
                       size_t cap)
{
    if (!cfg || !out) return kvc__msgf(KVC_EINVAL, err, cap, "missing arguments");
    if (!cfg->tiers || cfg->n_tiers == 0 || cfg->n_tiers > KVC_SIM_MAX_TIERS)
        return kvc__msgf(KVC_EINVAL, err, cap, "%u tiers: give 1 to %d", cfg->n_tiers,
                         KVC_SIM_MAX_TIERS);
    kvc_plan_result_t pr;
    if (cfg->planned) {
        pr = *cfg->planned;
    } else {
        char msg[256];
        int rc = kvc_plan_compute(&cfg->model, &cfg->gpu, &cfg->plan, &pr, msg, sizeof msg);
        if (rc) return kvc__msgf(rc, err, cap, "%s", msg);
    }
    kvc_sim_cost_model_t cm;
    if (kvc_sim_cost_model(&cfg->model, &cfg->gpu, &cfg->plan, &pr, cfg->step_overhead_s,
                           cfg->allreduce_latency_s, &cm))
        return kvc__msgf(KVC_EINVAL, err, cap,
                         "the cost model needs positive, finite FLOP/s, bandwidth and KV bytes "
                         "per token");
    cm.profile = cfg->profile;
    const uint32_t bs = cfg->plan.block_size ? cfg->plan.block_size : 16;
    int rc = table_fill(&cm, pr.params.max_num_batched_tokens, bs, pr.kv_bytes_per_token * bs,
                        pr.max_model_len, cfg->tiers, cfg->n_tiers, out);
    return rc ? kvc__msgf(rc, err, cap, "a tier's bandwidth is not a positive number") : 0;
}

/* "12.3 us", "4.56 ms", "7.890 s" */
static const char *fmt_time(char *buf, size_t cap, double s)
{
    if (s < 1e-3)
        snprintf(buf, cap, "%.1f us", s * 1e6);
    else if (s < 1)
        snprintf(buf, cap, "%.2f ms", s * 1e3);
    else
        snprintf(buf, cap, "%.3f s", s);
    return buf;
}

/* "25.0 GB/s" (powers of 1000, as links are sold) */
static const char *fmt_rate(char *buf, size_t cap, double bps)
{
    if (bps >= 1e9)
        snprintf(buf, cap, "%.2f GB/s", bps / 1e9);
    else if (bps >= 1e6)
        snprintf(buf, cap, "%.2f MB/s", bps / 1e6);
    else
        snprintf(buf, cap, "%.0f B/s", bps);
    return buf;
}

static const char *fmt_tokens(char *buf, size_t cap, uint32_t n)
{
    if (n >= 1024 && n % 1024 == 0)
        snprintf(buf, cap, "%uK", n / 1024);
    else
        snprintf(buf, cap, "%u", n);
    return buf;
}

int kvc_sim_tier_table_write_text(const kvc_sim_tier_table_t *t, FILE *f)
{
    if (!t || !f) return KVC_EINVAL;
    char a[32], b[32];
    fprintf(f,
            "break-even round trip (a fetch of the prefix beats recomputing it below this RTT;\n"
            "  rtt* = recompute - bytes / bandwidth; %u-token blocks of %s; prefill %.0f "
            "tokens/s)\n",
            t->block_tokens, kvc__fmt_iec(a, sizeof a, (double)t->block_bytes),
            t->prefill_tokens_per_s);
    fprintf(f, "  %-6s %12s", "tier", "bandwidth");
    for (uint32_t i = 0; i < t->n_lengths; i++)
        fprintf(f, " %12s", fmt_tokens(a, sizeof a, t->lengths[i]));
    fputc('\n', f);
    for (uint32_t k = 0; k < t->n_tiers; k++) {
        fprintf(f, "  %-6s %12s", kvc_tier_kind_name(t->kind[k]),
                fmt_rate(a, sizeof a, t->bandwidth_Bps[k]));
        for (uint32_t i = 0; i < t->n_lengths; i++) {
            const kvc_sim_break_even_t *c = &t->cells[k][i];
            fprintf(f, " %12s", c->never ? "never" : fmt_time(b, sizeof b, c->rtt_s));
        }
        fputc('\n', f);
    }
    fprintf(f, "  %-6s %12s", "", "recompute");
    for (uint32_t i = 0; i < t->n_lengths; i++)
        fprintf(f, " %12s", t->n_tiers ? fmt_time(b, sizeof b, t->cells[0][i].recompute_s) : "-");
    fputc('\n', f);
    return ferror(f) ? KVC_EIO : 0;
}

int kvc_sim_tier_table_write_json(const kvc_sim_tier_table_t *t, FILE *f, const char *ind)
{
    if (!t || !f) return KVC_EINVAL;
    if (!ind) ind = "";
    fprintf(f, "{\"block_tokens\": %u, \"block_bytes\": %llu, \"prefill_tokens_per_s\": %.9g,\n",
            t->block_tokens, (unsigned long long)t->block_bytes, t->prefill_tokens_per_s);
    fprintf(f, "%s \"tiers\": [", ind);
    for (uint32_t k = 0; k < t->n_tiers; k++) {
        fprintf(
            f, "%s\n%s  {\"kind\": \"%s\", \"bandwidth_Bps\": %.9g, \"rtt_s\": %.9g, \"rows\": [",
            k ? "," : "", ind, kvc_tier_kind_name(t->kind[k]), t->bandwidth_Bps[k], t->rtt_s[k]);
        for (uint32_t i = 0; i < t->n_lengths; i++) {
            const kvc_sim_break_even_t *c = &t->cells[k][i];
            fprintf(f,
                    "%s\n%s    {\"tokens\": %u, \"blocks\": %u, \"bytes\": %.17g, \"recompute_s\": "
                    "%.9g, \"transfer_s\": %.9g, \"break_even_rtt_s\": ",
                    i ? "," : "", ind, c->n_tokens, c->n_blocks, c->bytes, c->recompute_s,
                    c->transfer_s);
            if (c->never)
                fputs("null", f);
            else
                fprintf(f, "%.9g", c->rtt_s);
            fprintf(f, ", \"fetch_wins\": %s}",
                    !c->never && t->rtt_s[k] < c->rtt_s ? "true" : "false");
        }
        fprintf(f, "\n%s  ]}", ind);
    }
    fprintf(f, "%s%s]}", t->n_tiers ? "\n" : "", t->n_tiers ? ind : "");
    return ferror(f) ? KVC_EIO : 0;
}

/* ---- the run's tiers ---------------------------------------------------------------------- */
typedef struct { /* a block in a shared (redis) tier: visible from time t on */
    kvc_hash128_t h;
    double t;
    bool used;
} rentry_t;

typedef struct {
    kvc_tier_spec_t spec;
    kvc_sim_tier_stats_t st;
    kvc_tier_store_t *store; /* host, disk: this replica's */
    double busy_until;       /* this replica's link: when its last fetch completes */
    rentry_t *map;           /* redis: open addressing, power-of-two capacity */
    size_t map_cap, map_n;
} tier_t;

typedef struct { /* a request whose fetch is in flight (until it is committed) */
    uint32_t wi;
    double arrival;
    double ready;          /* when its last run has arrived */
    uint32_t start, n;     /* blocks [start, start + n) of its prompt come from the tiers */
    kvc_hash128_t *hashes; /* (n) theirs: a request that misses them meanwhile waits */
} fetch_t;

/* where[] for a block another request's fetch is bringing in */
#define JOINED 0xff

struct kvc__sim_tiers {
    const kvc_allocator_t *a;
    tier_t tier[KVC_SIM_MAX_TIERS];
    uint32_t n;
    kvc_sim_cost_model_t cm;
    uint32_t bs, chunk;
    uint64_t block_bytes;
    size_t record_bytes;
    kvc_tier_admission_t adm;
    uint64_t disk_budget;
    /* the replica */
    kvc_prefix_t *pc;
    kvc_pool_t *pool;
    const double *now;
    uint32_t *depth; /* (num_blocks) a cached block's index in its prefix */
    uint32_t num_blocks;
    fetch_t *fetch;
    size_t n_fetch, cap_fetch;
    /* scratch, grown to the longest prompt */
    kvc_hash128_t *hashes;
    uint32_t *blocks;
    uint8_t *where;
    double *ready_at; /* (scratch) JOINED blocks: when their fetch completes */
    size_t scratch;
    uint64_t saved_tokens;
    int err; /* the first error an event met */
    kvc_sim_tier_table_t table;
};

static uint64_t sim_clock(void *ctx)
{
    const kvc__sim_tiers_t *t = ctx;
    double now = t->now ? *t->now : 0;
    return now > 0 ? (uint64_t)(now * 1e9) : 0;
}

static kvc_tier_params_t store_params(const kvc__sim_tiers_t *t, const tier_t *k)
{
    kvc_tier_params_t p = kvc_tier_params_default();
    p.block_bytes = (size_t)t->block_bytes;
    p.block_tokens = t->bs;
    p.capacity_bytes = k->spec.capacity_bytes;
    if (k->spec.kind == KVC_TIER_DISK) {
        p.admission = t->adm;
        p.write_budget_per_day = t->disk_budget;
    }
    p.clock_ns = sim_clock;
    p.clock_ctx = (void *)t;
    p.allocator = *t->a;
    return p;
}

int kvc__sim_tiers_create(const kvc_sim_config_t *cfg, const kvc_plan_result_t *pr,
                          const kvc_sim_cost_model_t *cm, uint32_t n_groups,
                          const kvc_allocator_t *a, kvc__sim_tiers_t **out, char *err, size_t cap)
{
    *out = NULL;
    if (cfg->n_tiers > KVC_SIM_MAX_TIERS || !cfg->tiers)
        return kvc__msgf(KVC_EINVAL, err, cap, "%u tiers%s: at most %d", cfg->n_tiers,
                         cfg->tiers ? "" : " and no array of them", KVC_SIM_MAX_TIERS);
    if (!cfg->prefix_caching)
        return kvc__msgf(KVC_EINVAL, err, cap,
                         "tiers need the prefix cache (not with --no-prefix-caching, "
                         "--no-kv-cache or contiguous allocation)");
    if (n_groups != 1 || cfg->model.sliding_window)
        return kvc__msgf(KVC_EINVAL, err, cap,
                         "tiers are simulated for full-attention models only (this one has "
                         "sliding-window layers)");
    const uint32_t bs = cfg->plan.block_size;
    const uint64_t bb = pr->kv_bytes_per_token * bs;
    if (bs == 0 || bb == 0 || bb > SIZE_MAX / 2 || kvc_tier_record_bytes((size_t)bb, bs) == 0)
        return kvc__msgf(KVC_EINVAL, err, cap, "tiers: a KV block of %llu bytes",
                         (unsigned long long)bb);
    kvc__sim_tiers_t *t = kvc_calloc(a, 1, sizeof *t, 0);
    if (!t) return KVC_ENOMEM;
    t->a = a;
    t->n = cfg->n_tiers;
    t->cm = *cm;
    t->bs = bs;
    t->chunk = cfg->plan.max_num_batched_tokens;
    t->block_bytes = bb;
    t->record_bytes = kvc_tier_record_bytes((size_t)bb, bs);
    t->adm = cfg->tier_admission;
    t->disk_budget = cfg->tier_disk_write_budget;
    int rc =
        table_fill(cm, t->chunk, bs, bb, pr->max_model_len, cfg->tiers, cfg->n_tiers, &t->table);
    for (uint32_t k = 0; k < t->n && !rc; k++) {
        tier_t *x = &t->tier[k];
        x->spec = cfg->tiers[k];
        x->st.kind = x->spec.kind;
        x->st.mode = x->spec.mode;
        x->st.bandwidth_Bps = t->table.bandwidth_Bps[k];
        x->st.rtt_s = t->table.rtt_s[k];
        if (x->spec.kind == KVC_TIER_REDIS) continue; /* unbounded, shared */
        x->st.capacity_bytes = x->spec.capacity_bytes;
        /* one store now: its parameters are checked before the run starts */
        kvc_tier_params_t p = store_params(t, x);
        kvc_tier_store_t *s;
        rc = kvc_tier_meta_create(&p, &s);
        if (rc == KVC_EINVAL) {
            char c[32], b[32];
            rc = kvc__msgf(KVC_EINVAL, err, cap,
                           "tier %u (%s, %s): not one block fits (%s a record) or more than 2^30 "
                           "do",
                           k + 1, kvc_tier_kind_name(x->spec.kind),
                           kvc__fmt_iec(c, sizeof c, (double)x->spec.capacity_bytes),
                           kvc__fmt_iec(b, sizeof b, (double)t->record_bytes));
            break;
        }
        if (rc) break;
        kvc_tier_stats_t st;
        kvc_tier_stats(s, &st);
        x->st.capacity_records = st.capacity_records;
        kvc_tier_destroy(s);
    }
    if (rc) {
        kvc__sim_tiers_destroy(t);
        return rc;
    }
    *out = t;
    return 0;
}

void kvc__sim_tiers_destroy(kvc__sim_tiers_t *t)
{
    if (!t) return;
    const kvc_allocator_t *a = t->a;
    for (uint32_t k = 0; k < t->n; k++) {
        kvc_tier_destroy(t->tier[k].store);
        kvc_free(a, t->tier[k].map);
    }
    kvc_free(a, t->depth);
    for (size_t i = 0; i < t->n_fetch; i++) kvc_free(a, t->fetch[i].hashes);
    kvc_free(a, t->fetch);
    kvc_free(a, t->hashes);
    kvc_free(a, t->blocks);
    kvc_free(a, t->where);
    kvc_free(a, t->ready_at);
    kvc_free(a, t);
}

/* ---- the shared (redis) store: hash -> the earliest time a replica wrote it ----------------- */
static size_t map_slot(const rentry_t *m, size_t cap, kvc_hash128_t h)
{
    size_t i = (size_t)(h.lo ^ (h.hi * 0x9e3779b97f4a7c15ULL)) & (cap - 1);
    while (m[i].used && !kvc_hash128_eq(m[i].h, h)) i = (i + 1) & (cap - 1);
    return i;
}

static int map_put(const kvc_allocator_t *a, tier_t *x, kvc_hash128_t h, double now, bool *added)
{
    *added = false;
    if (2 * (x->map_n + 1) > x->map_cap) {
        size_t cap = x->map_cap ? 2 * x->map_cap : 1024;
        rentry_t *m = kvc_calloc(a, cap, sizeof *m, 0);
        if (!m) return KVC_ENOMEM;
        for (size_t i = 0; i < x->map_cap; i++)
            if (x->map[i].used) m[map_slot(m, cap, x->map[i].h)] = x->map[i];
        kvc_free(a, x->map);
        x->map = m;
        x->map_cap = cap;
    }
    size_t i = map_slot(x->map, x->map_cap, h);
    if (x->map[i].used) {
        /* replicas are simulated one after another: keep the earliest writer's time */
        if (now < x->map[i].t) x->map[i].t = now;
        return 0;
    }
    x->map[i] = (rentry_t){.h = h, .t = now, .used = true};
    x->map_n++;
    *added = true;
    return 0;
}

static bool map_has(const tier_t *x, kvc_hash128_t h, double now)
{
    if (!x->map_cap) return false;
    size_t i = map_slot(x->map, x->map_cap, h);
    return x->map[i].used && x->map[i].t <= now;
}

/* ---- events: what the pool caches and evicts ---------------------------------------------- */
static void on_event(void *ctx, const kvc_prefix_event_t *ev)
{
    kvc__sim_tiers_t *t = ctx;
    if (!t->pc || ev->group != 0 || ev->n_tokens != t->bs) return;
    if (ev->type == KVC_EVENT_STORED && ev->block < t->num_blocks)
        t->depth[ev->block] = ev->parent_block < t->num_blocks ? t->depth[ev->parent_block] + 1 : 0;
    const kvc_tier_mode_t mode =
        ev->type == KVC_EVENT_STORED ? KVC_TIER_MODE_WRITE_THROUGH : KVC_TIER_MODE_EVICT;
    const kvc_tier_key_t key = {.hash = ev->hash,
                                .parent_hash = ev->parent_hash,
                                .tokens = ev->tokens,
                                .n_tokens = ev->n_tokens,
                                .depth = ev->block < t->num_blocks ? t->depth[ev->block] : 0};
    static const unsigned char no_bytes = 0; /* an index-only store reads no payload */
    for (uint32_t k = 0; k < t->n; k++) {
        tier_t *x = &t->tier[k];
        if (x->spec.mode != mode) continue;
        int rc = 0;
        if (x->store) {
            rc = kvc_tier_put(x->store, &key, &no_bytes, NULL);
        } else if (x->spec.kind == KVC_TIER_REDIS) {
            bool added;
            rc = map_put(t->a, x, ev->hash, *t->now, &added);
            if (added) x->st.puts++, x->st.bytes_written += t->record_bytes;
        }
        if (rc && !t->err) t->err = rc;
    }
}

void kvc__sim_tiers_hook(kvc__sim_tiers_t *t, kvc_prefix_params_t *cp)
{
    cp->on_event = on_event;
    cp->event_ctx = t;
}

int kvc__sim_tiers_replica_begin(kvc__sim_tiers_t *t, kvc_prefix_t *pc, uint32_t num_blocks,
                                 const double *now)
{
    t->pc = pc;
    t->pool = kvc_prefix_pool(pc);
    t->now = now;
    t->num_blocks = num_blocks;
    t->n_fetch = 0;
    t->depth = kvc_calloc(t->a, num_blocks ? num_blocks : 1, sizeof *t->depth, 0);
    if (!t->depth) return KVC_ENOMEM;
    for (uint32_t k = 0; k < t->n; k++) {
        tier_t *x = &t->tier[k];
        x->busy_until = 0;
        if (x->spec.kind == KVC_TIER_REDIS) continue;
        kvc_tier_params_t p = store_params(t, x);
        int rc = kvc_tier_meta_create(&p, &x->store);
        if (rc) return rc == KVC_ENOMEM ? rc : KVC_ECORRUPT; /* checked at create */
    }
    return 0;
}

int kvc__sim_tiers_replica_end(kvc__sim_tiers_t *t)
{
    for (uint32_t k = 0; k < t->n; k++) {
        tier_t *x = &t->tier[k];
        if (!x->store) continue;
        kvc_tier_stats_t st;
        kvc_tier_stats(x->store, &st);
        x->st.puts += st.n_puts;
        x->st.evictions += st.n_evictions;
        x->st.bytes_written += st.bytes_written;
        x->st.admission_refused += st.n_admission_refused;
        x->st.budget_refused += st.n_budget_refused;
        kvc_tier_destroy(x->store);
        x->store = NULL;
    }
    kvc_free(t->a, t->depth);
    t->depth = NULL;
    t->pc = NULL;
    t->pool = NULL;
    for (size_t i = 0; i < t->n_fetch; i++) kvc_free(t->a, t->fetch[i].hashes);
    t->n_fetch = 0;
    int rc = t->err;
    t->err = 0;
    return rc;
}

/* ---- admission ---------------------------------------------------------------------------- */
static int grow_scratch(kvc__sim_tiers_t *t, size_t n)
{
    if (n <= t->scratch) return 0;
    size_t cap = KVC_MAX(n, 2 * t->scratch);
    kvc_free(t->a, t->hashes);
    kvc_free(t->a, t->blocks);
    kvc_free(t->a, t->where);
    kvc_free(t->a, t->ready_at);
    t->hashes = kvc_alloc(t->a, cap * sizeof *t->hashes, 0);
    t->blocks = kvc_alloc(t->a, cap * sizeof *t->blocks, 0);
    t->where = kvc_alloc(t->a, cap, 0);
    t->ready_at = kvc_alloc(t->a, cap * sizeof *t->ready_at, 0);
    t->scratch = t->hashes && t->blocks && t->where && t->ready_at ? cap : 0;
    return t->scratch ? 0 : KVC_ENOMEM;
}

/* The query's full-block hashes into t->hashes; *n_full their count. */
static int hash_query(kvc__sim_tiers_t *t, const kvc_prefix_query_t *q, size_t *n_full)
{
    int rc = grow_scratch(t, q->n_tokens / t->bs + 1);
    if (rc) return rc;
    rc = kvc_prefix_hash(t->pc, q, t->hashes, t->scratch, n_full);
    return rc ? KVC_ECORRUPT : 0;
}

/* The fetch of request f is complete: pin the pool's prefix, give fresh blocks the identities
 * of the fetched ones (chained from it), and let them go to the free queue, cached. */
static int commit(kvc__sim_tiers_t *t, const kvc_prefix_query_t *q0, const fetch_t *f)
{
    size_t n_full;
    int rc = hash_query(t, q0, &n_full);
    if (rc) return rc;
    kvc_prefix_query_t q = *q0;
    q.hashes = t->hashes;
    const uint32_t end = f->start + f->n;
    kvc_prefix_hit_t hit;
    if ((rc = kvc_prefix_lookup(t->pc, &q, t->blocks, end, &hit)))
        return rc == KVC_EOVERFLOW ? 0 : KVC_ECORRUPT;
    uint32_t hb = (uint32_t)hit.n_hit_blocks, k = 0;
    /* the pool's prefix may have changed while the fetch ran: longer (another request computed
     * some of it) or shorter (evicted; then the fetched blocks chain from nothing cached) */
    uint32_t want = hb >= f->start && hb < end ? end - hb : 0;
    for (k = want; k > 0; k /= 2) {
        rc = kvc_pool_alloc(t->pool, k, t->blocks + hb);
        if (rc == 0) break;
        if (rc != KVC_ENOSPC && rc != KVC_EBUSY) return KVC_ECORRUPT;
    }
    uint32_t parent = hb ? t->blocks[hb - 1] : KVC_NONE, inserted = 0;
    for (uint32_t m = 0; m < k; m++) {
        uint32_t canon;
        if (kvc_prefix_insert(t->pc, &q, hb + m, parent, t->blocks[hb + m], &canon))
            return KVC_ECORRUPT;
        inserted++;
        if (canon != t->blocks[hb + m]) break; /* cached meanwhile: the chain goes on there */
        parent = canon;
    }
    if (kvc_pool_release(t->pool, t->blocks, hb + k)) return KVC_ECORRUPT;
    t->saved_tokens += (uint64_t)inserted * t->bs;
    /* what was fetched and could not be cached: counted against the tier of its first block */
    uint32_t dropped = hb >= end ? 0 : (hb < f->start ? f->n : end - hb - inserted);
    if (dropped) t->tier[0].st.dropped_blocks += dropped;
    return 0;
}

bool kvc__sim_tiers_fetching(const kvc__sim_tiers_t *t, uint32_t wi)
{
    for (size_t i = 0; i < t->n_fetch; i++)
        if (t->fetch[i].wi == wi) return true;
    return false;
}

int kvc__sim_tiers_admit(kvc__sim_tiers_t *t, const kvc_prefix_query_t *q0, uint32_t wi,
                         double *arrival, bool *wait, double *ready_s)
{
    *wait = false;
    if (t->err) return t->err;
    int rc;
    for (size_t i = 0; i < t->n_fetch; i++)
        if (t->fetch[i].wi == wi) { /* its fetch is complete */
            fetch_t f = t->fetch[i];
            t->fetch[i] = t->fetch[--t->n_fetch];
            *arrival = f.arrival;
            rc = commit(t, q0, &f);
            kvc_free(t->a, f.hashes);
            return rc;
        }
    const uint32_t bs = t->bs;
    if (q0->n_tokens < 2) return 0;
    size_t n_full;
    if ((rc = hash_query(t, q0, &n_full))) return rc;
    const size_t limit = KVC_MIN(n_full, (q0->n_tokens - 1) / bs); /* the last token computes */
    if (limit == 0) return 0;
    kvc_prefix_query_t q = *q0;
    q.hashes = t->hashes;
    if (kvc_prefix_probe(t->pc, &q, limit, t->blocks, NULL)) return KVC_ECORRUPT;
    size_t h = 0;
    while (h < limit && t->blocks[h] != KVC_NONE) h++;
    const double now = *t->now;
    /* the blocks past the pool: one another request is fetching is waited for (the engine's
     * fence: a second fetch of an identity is refused); any other is served by the first tier
     * that holds it */
    size_t e = h;
    for (; e < limit; e++) {
        const fetch_t *f = NULL;
        for (size_t i = 0; i < t->n_fetch && !f; i++) {
            const fetch_t *g = &t->fetch[i];
            if (e >= g->start && e - g->start < g->n &&
                kvc_hash128_eq(g->hashes[e - g->start], t->hashes[e]))
                f = g;
        }
        if (f) {
            t->where[e] = JOINED;
            t->ready_at[e] = f->ready;
            continue;
        }
        const kvc_tier_key_t key = {.hash = t->hashes[e],
                                    .tokens = q0->tokens + e * bs,
                                    .n_tokens = bs,
                                    .depth = (uint32_t)e};
        uint32_t k = 0;
        for (; k < t->n; k++) {
            tier_t *x = &t->tier[k];
            if (x->store ? kvc_tier_contains(x->store, &key) == 1 : map_has(x, t->hashes[e], now))
                break;
        }
        if (k == t->n) break;
        t->where[e] = (uint8_t)k;
    }
    if (e == h) return 0;
    /* what a fetch needs, before anything is counted: the run fails whole or not at all */
    kvc_hash128_t *mine = kvc_alloc(t->a, (e - h) * sizeof *mine, 0);
    if (!mine) return KVC_ENOMEM;
    if (t->n_fetch == t->cap_fetch) {
        size_t cap = t->cap_fetch ? 2 * t->cap_fetch : 64;
        fetch_t *v = kvc_alloc(t->a, cap * sizeof *v, 0);
        if (!v) {
            kvc_free(t->a, mine);
            return KVC_ENOMEM;
        }
        if (t->n_fetch) memcpy(v, t->fetch, t->n_fetch * sizeof *v);
        kvc_free(t->a, t->fetch);
        t->fetch = v;
        t->cap_fetch = cap;
    }
    double ready = now;
    size_t fetched_end = h;
    bool stopped = false;
    for (size_t i = h; i < e;) {
        const uint32_t k = t->where[i];
        size_t j = i;
        while (j < e && t->where[j] == k) j++;
        if (k == JOINED) { /* no link time of its own: it arrives with the other's fetch */
            for (size_t m = i; !stopped && m < j; m++) ready = fmax(ready, t->ready_at[m]);
            if (!stopped) fetched_end = j;
            i = j;
            continue;
        }
        tier_t *x = &t->tier[k];
        const uint32_t n = (uint32_t)(j - i);
        x->st.hits += n;
        if (!stopped) {
            double rec = kvc_sim_prefill_s(&t->cm, t->chunk, (uint64_t)i * bs, (uint64_t)n * bs);
            kvc_tier_run_t run = {.n_blocks = n,
                                  .block_bytes = (size_t)t->block_bytes,
                                  .block_tokens = bs,
                                  .bandwidth_Bps = x->st.bandwidth_Bps,
                                  .latency_s = x->st.rtt_s,
                                  .prefill_tokens_per_s = rec > 0 ? (double)n * bs / rec : 1e300};
            kvc_tier_decision_t d;
            if (kvc_tier_decide(&run, &d)) return KVC_ECORRUPT;
            if (d.fetch) {
                double start = fmax(now, x->busy_until);
                x->busy_until = start + d.fetch_s;
                x->st.link_busy_s += d.fetch_s;
                ready = fmax(ready, x->busy_until);
                x->st.fetches++;
                x->st.fetched_blocks += n;
                x->st.fetched_tokens += (uint64_t)n * bs;
                x->st.bytes_read += (uint64_t)n * t->record_bytes;
                for (size_t m = i; x->store && m < j; m++) { /* a use: most recent in its LRU */
                    const kvc_tier_key_t key = {.hash = t->hashes[m],
                                                .tokens = q0->tokens + m * bs,
                                                .n_tokens = bs,
                                                .depth = (uint32_t)m};
                    static unsigned char sink;
                    (void)!kvc_tier_get(x->store, &key, &sink);
                }
                fetched_end = j;
            } else {
                stopped = true;
            }
        }
        if (stopped) x->st.recompute_chosen_blocks += n;
        i = j;
    }
    if (fetched_end == h) {
        kvc_free(t->a, mine);
        return 0;
    }
    memcpy(mine, t->hashes + h, (fetched_end - h) * sizeof *mine);
    t->fetch[t->n_fetch++] = (fetch_t){.wi = wi,
                                       .arrival = *arrival,
                                       .ready = ready,
                                       .start = (uint32_t)h,
                                       .n = (uint32_t)(fetched_end - h),
                                       .hashes = mine};
    *wait = true;
    *ready_s = ready;
    return 0;
}

void kvc__sim_tiers_result(const kvc__sim_tiers_t *t, kvc_sim_result_t *out)
{
    out->n_tiers = t->n;
    for (uint32_t k = 0; k < t->n; k++) out->tiers[k] = t->tier[k].st;
    out->tier_saved_tokens = t->saved_tokens;
    out->break_even = t->table;
}

/* ---- the report's tiers section --------------------------------------------------------- */
typedef struct kvc__report_tiers {
    kvc_sim_tier_stats_t tiers[KVC_SIM_MAX_TIERS];
    uint32_t n;
    uint64_t saved;
    kvc_sim_tier_table_t table;
} report_tiers_t;

int kvc_report_set_tiers(kvc_report_t *r, const kvc_sim_tier_stats_t *tiers, uint32_t n,
                         uint64_t saved_tokens, const kvc_sim_tier_table_t *table)
{
    if (!r || !tiers || !table || n > KVC_SIM_MAX_TIERS) return KVC_EINVAL;
    if (!r->tiers) {
        r->tiers = kvc_calloc(&r->p.allocator, 1, sizeof *r->tiers, 0);
        if (!r->tiers) return KVC_ENOMEM;
    }
    memcpy(r->tiers->tiers, tiers, n * sizeof *tiers);
    r->tiers->n = n;
    r->tiers->saved = saved_tokens;
    r->tiers->table = *table;
    return 0;
}

void kvc__report_tiers_free(kvc_report_t *r)
{
    kvc_free(&r->p.allocator, r->tiers);
    r->tiers = NULL;
}

int kvc__report_tiers_text(const kvc_report_t *r, FILE *f)
{
    const report_tiers_t *x = r->tiers;
    if (!x) return 0;
    char a[32], b[32], c[32], d[32];
    fprintf(f, "\ntiers (prompt tokens fetched instead of recomputed: %llu)\n",
            (unsigned long long)x->saved);
    fprintf(f, "  %-5s %-13s %10s %11s %9s %10s %9s %11s %10s %10s %10s %9s\n", "tier", "mode",
            "capacity", "bandwidth", "rtt", "hit blk", "fetches", "fetched tok", "recomp blk",
            "read", "written", "evicted");
    for (uint32_t k = 0; k < x->n; k++) {
        const kvc_sim_tier_stats_t *s = &x->tiers[k];
        fprintf(
            f, "  %-5s %-13s %10s %11s %9s %10llu %9llu %11llu %10llu %10s %10s %9llu\n",
            kvc_tier_kind_name(s->kind), kvc_tier_mode_name(s->mode),
            s->capacity_bytes ? kvc__fmt_iec(a, sizeof a, (double)s->capacity_bytes) : "unbounded",
            fmt_rate(b, sizeof b, s->bandwidth_Bps), fmt_time(c, sizeof c, s->rtt_s),
            (unsigned long long)s->hits, (unsigned long long)s->fetches,
            (unsigned long long)s->fetched_tokens, (unsigned long long)s->recompute_chosen_blocks,
            kvc__fmt_iec(d, sizeof d, (double)s->bytes_read),
            kvc__fmt_iec(a, sizeof a, (double)s->bytes_written), (unsigned long long)s->evictions);
        if (s->admission_refused || s->budget_refused || s->dropped_blocks)
            fprintf(f,
                    "        refused by admission %llu, by the write budget %llu; fetched, not "
                    "cached %llu blocks\n",
                    (unsigned long long)s->admission_refused, (unsigned long long)s->budget_refused,
                    (unsigned long long)s->dropped_blocks);
    }
    fputc('\n', f);
    return kvc_sim_tier_table_write_text(&x->table, f);
}

int kvc__report_tiers_json(const kvc_report_t *r, FILE *f)
{
    const report_tiers_t *x = r->tiers;
    if (!x) return 0;
    fputs(",\n  \"tiers\": [", f);
    for (uint32_t k = 0; k < x->n; k++) {
        const kvc_sim_tier_stats_t *s = &x->tiers[k];
        fprintf(f,
                "%s\n    {\"kind\": \"%s\", \"mode\": \"%s\", \"capacity_bytes\": %llu, "
                "\"capacity_records\": %llu, \"bandwidth_Bps\": %.9g, \"rtt_s\": %.9g, \"hits\": "
                "%llu, \"fetches\": %llu, \"fetched_blocks\": %llu, \"fetched_tokens\": %llu, "
                "\"recompute_chosen_blocks\": %llu, \"bytes_read\": %llu, \"bytes_written\": "
                "%llu, \"puts\": %llu, \"evictions\": %llu, \"admission_refused\": %llu, "
                "\"budget_refused\": %llu, \"dropped_blocks\": %llu, \"link_busy_s\": %.6f}",
                k ? "," : "", kvc_tier_kind_name(s->kind), kvc_tier_mode_name(s->mode),
                (unsigned long long)s->capacity_bytes, (unsigned long long)s->capacity_records,
                s->bandwidth_Bps, s->rtt_s, (unsigned long long)s->hits,
                (unsigned long long)s->fetches, (unsigned long long)s->fetched_blocks,
                (unsigned long long)s->fetched_tokens,
                (unsigned long long)s->recompute_chosen_blocks, (unsigned long long)s->bytes_read,
                (unsigned long long)s->bytes_written, (unsigned long long)s->puts,
                (unsigned long long)s->evictions, (unsigned long long)s->admission_refused,
                (unsigned long long)s->budget_refused, (unsigned long long)s->dropped_blocks,
                s->link_busy_s);
    }
    fprintf(f, "%s],\n  \"tier_saved_tokens\": %llu,\n  \"break_even\": ", x->n ? "\n  " : "",
            (unsigned long long)x->saved);
    return kvc_sim_tier_table_write_json(&x->table, f, "  ");
}
