/* kvcache/sim.h - the simulator: workloads in, reports out, and the engine
 * that runs the real pool, prefix cache, sequences and scheduler against a
 * cost model and a virtual clock.
 *
 * Workloads are arrays of requests in arrival order, loaded from a trace
 * (Mooncake JSONL, kvcache JSONL), generated from a synthetic spec (a JSON
 * file or an inline string), or built by hand.  Every request carries real
 * prompt tokens, so the simulator's prefix cache hashes and matches exactly
 * what a server would: equal prefixes give equal tokens, nothing else does.
 *
 * Reports accumulate one record per finished request and a thinned time
 * series of the engine's state, then compute percentiles, goodput and the
 * per-tenant and per-class breakdowns, and write them as text, JSON, CSV and
 * SVG.  Every output is byte-for-byte deterministic: fixed number formats,
 * no timestamps, names in index order.
 *
 * The formats are described in docs/workloads.md (workloads) and docs/sim.md (reports).
 *
 * Thread-safety: a workload is immutable once loaded (the builder calls
 * excepted) and its const functions may run on any number of threads at
 * once.  A report is owned by one thread.  Nothing here reads the wall clock
 * except the progress bar, which is for command-line front ends.
 */
#ifndef KVCACHE_SIM_H
#define KVCACHE_SIM_H

#include <stdio.h>

#include "kvcache/prefix.h"
#include "kvcache/sched.h"
#include "kvcache/plan.h"
#include "kvcache/tier.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================
 * workloads
 * ==================================================================== */

/* Longest prompt (conversation history included) or output a workload may hold, in tokens. */
#define KVC_SIM_MAX_TOKENS   (1u << 24)
/* Most requests one workload may hold. */
#define KVC_SIM_MAX_REQUESTS ((size_t)UINT32_MAX - 1)
/* The latest arrival (and the longest think time) a workload may hold, in seconds after
 * its start, time scale applied: about 31.7 years.  Past it a double's spacing passes
 * 0.1 us and latencies printed to the microsecond would lose their digits. */
#define KVC_SIM_MAX_TIME_S   1e9

typedef struct {
    double arrival_s;          /* seconds from the start of the run, non-decreasing in a workload */
    const kvc_token_t *tokens; /* (n_prompt) the prompt, owned by the workload; NULL only for
                                  Mooncake traces loaded with tokens_on_demand (use
                                  kvc_workload_prompt) */
    uint32_t n_prompt;         /* >= 1 */
    uint32_t n_output;         /* output tokens to generate, >= 1 */
    uint32_t tenant;           /* index into the workload's tenant names */
    uint32_t priority;         /* class index: 0 is the most urgent */
    uint64_t conversation;     /* multi-turn: conversation id (0 = none) */
    uint32_t turn;             /* multi-turn: 0, 1, ... */
    uint32_t max_output;       /* the request's declared cap (>= n_output), for
                                  reserve-for-max admission */
    const kvc_token_t *output_tokens; /* (n_output) what the simulator appends as the
                                         generated tokens, owned by the workload; in a
                                         conversation they are exactly the tokens the next
                                         turn resends after this turn's prompt */
    double think_s;                   /* multi-turn, turn > 0: the user's think time after the
                                         previous turn.  arrival_s is open-loop (the previous
                                         turn's arrival + think_s); a closed-loop engine may
                                         instead release the turn think_s after the previous
                                         turn finished.  0 otherwise */
} kvc_sim_request_t;

typedef enum {
    KVC_WORKLOAD_AUTO = 0, /* detect from the content (see kvc_workload_load) */
    KVC_WORKLOAD_MOONCAKE, /* JSONL: timestamp (ms), input_length, output_length, hash_ids */
    KVC_WORKLOAD_JSONL,    /* the kvcache JSONL: explicit tokens, one request a line */
    KVC_WORKLOAD_SPEC,     /* a synthetic spec: a JSON object, or an inline string */
    KVC_WORKLOAD_BUILT,    /* built with kvc_workload_create / kvc_workload_add */
} kvc_workload_format_t;

typedef struct {
    uint64_t seed;                /* synthetic generation (traces never depend on it); default 1 */
    size_t max_requests;          /* keep only the first N requests (by arrival for specs, by line
                                     for traces); 0 = all */
    double time_scale;            /* multiplies arrival and think times (0.5 replays twice as
                                     fast); > 0, default 1 */
    uint32_t vocab;               /* generated token ids lie in [0, vocab); >= 2, default 32000 */
    uint32_t block_tokens;        /* tokens per Mooncake hash id; default 512 */
    uint32_t max_tokens;          /* longest prompt or output accepted or generated, >= 1,
                                     <= KVC_SIM_MAX_TOKENS (the default) */
    bool tokens_on_demand;        /* Mooncake only: keep one copy of each hash id's block instead of
                                     a contiguous prompt per request; requests' tokens is then NULL
                                     and kvc_workload_prompt assembles prompts.  Default false */
    kvc_workload_format_t format; /* default KVC_WORKLOAD_AUTO */
    kvc_allocator_t allocator;    /* zeroed: the C library */
} kvc_workload_params_t;

/* seed 1, all requests, time_scale 1, vocab 32000, block_tokens 512,
 * max_tokens KVC_SIM_MAX_TOKENS, contiguous prompts, format detected, libc. */
KVC_API kvc_workload_params_t kvc_workload_params_default(void);

typedef struct kvc_workload kvc_workload_t; /* opaque: owns requests, tokens, names */

/* Load a workload from `path_or_spec`: a file (any supported format), or,
 * when no such file exists (or the string is too long to name one), an
 * inline synthetic spec such as "poisson:rate=5,n=1000,prompt=1024,output=300".
 * With format AUTO a file holding one JSON object with "streams" is a spec;
 * otherwise it is JSONL, Mooncake if its first record has "hash_ids",
 * kvcache JSONL if it has "tokens" (or is the kvcache header line).  Trace
 * records are sorted stably by arrival (kvc_workload_stats counts the
 * records that moved).  params NULL: the defaults.  Every allocation but
 * cJSON's own parse trees (freed before return) goes through
 * params->allocator.  On success *out is a new workload the caller frees
 * with kvc_workload_destroy.  On failure *out is NULL and, if err is not
 * NULL, err holds one line naming the file, the line (JSONL) and the field,
 * with control bytes of what it quotes escaped:
 *   KVC_EIO     the file cannot be opened or read
 *   KVC_EPARSE  malformed or inconsistent input, no requests, an inline spec
 *               whose process is unknown, an arrival or think time past
 *               KVC_SIM_MAX_TIME_S (time scale applied), more requests than
 *               KVC_SIM_MAX_REQUESTS
 *   KVC_EINVAL  bad params, an empty or NULL path, out NULL
 *   KVC_ENOMEM */
KVC_API int kvc_workload_load(const char *path_or_spec, const kvc_workload_params_t *params,
                              kvc_workload_t **out, char *err, size_t err_cap);

/* The same from bytes in memory (`data` need not be NUL-terminated);
 * `name` labels error messages.  An inline spec string is not recognised
 * here: pass format KVC_WORKLOAD_SPEC and a JSON object, or AUTO.
 * KVC_EPARSE, KVC_EINVAL (also: data NULL with len > 0), KVC_ENOMEM, as for
 * kvc_workload_load; never KVC_EIO. */
KVC_API int kvc_workload_load_buffer(const char *data, size_t len, const char *name,
                                     const kvc_workload_params_t *params, kvc_workload_t **out,
                                     char *err, size_t err_cap);

/* Free the workload, its requests, tokens and names.  NULL is a no-op. */
KVC_API void kvc_workload_destroy(kvc_workload_t *w);

/* Number of requests. */
KVC_API size_t kvc_workload_size(const kvc_workload_t *w);
/* Request i, borrowed until the workload is destroyed (or, while building,
 * until the next kvc_workload_add); NULL when i >= size. */
KVC_API const kvc_sim_request_t *kvc_workload_request(const kvc_workload_t *w, size_t i);
/* Copy request i's prompt into buf (cap tokens): works whether or not
 * tokens is materialised.  KVC_EINVAL (i out of range), KVC_ERANGE (cap <
 * n_prompt; buf untouched). */
KVC_API int kvc_workload_prompt(const kvc_workload_t *w, size_t i, kvc_token_t *buf, size_t cap);

/* Tenants and classes: at least one each ("default" when the source names
 * none).  Names are borrowed; index order is the order of declaration (or
 * first appearance).  Class 0 is the most urgent.  Out-of-range: NULL. */
KVC_API uint32_t kvc_workload_n_tenants(const kvc_workload_t *w);
KVC_API const char *kvc_workload_tenant_name(const kvc_workload_t *w, uint32_t t);
KVC_API uint32_t kvc_workload_n_classes(const kvc_workload_t *w);
KVC_API const char *kvc_workload_class_name(const kvc_workload_t *w, uint32_t c);
/* The name arrays themselves (n_tenants / n_classes entries), for kvc_report_params_t. */
KVC_API const char *const *kvc_workload_tenant_names(const kvc_workload_t *w);
KVC_API const char *const *kvc_workload_class_names(const kvc_workload_t *w);

/* Where the workload came from. */
KVC_API kvc_workload_format_t kvc_workload_format(const kvc_workload_t *w);
/* "mooncake", "jsonl", "spec", "built" ("auto" for KVC_WORKLOAD_AUTO). */
KVC_API const char *kvc_workload_format_name(kvc_workload_format_t f);

typedef struct {
    size_t n_requests;
    size_t n_conversations; /* distinct non-zero conversation ids */
    uint64_t prompt_tokens; /* sum of n_prompt */
    uint64_t output_tokens; /* sum of n_output */
    uint64_t stored_tokens; /* token ids held in memory (shared storage counted once) */
    uint64_t unique_blocks; /* Mooncake: distinct hash ids; 0 otherwise */
    size_t n_reordered;     /* trace records whose arrival was earlier than a previous
                               record's (moved by the stable sort) */
    size_t bytes;           /* memory the workload holds, all of it */
    double duration_s;      /* the last arrival */
} kvc_workload_stats_t;

/* Totals over the workload: O(n log n) (conversations are counted by
 * sorting their ids).  KVC_ENOMEM (its scratch array; out is then zeroed). */
KVC_API int kvc_workload_stats(const kvc_workload_t *w, kvc_workload_stats_t *out);

/* Write the workload in the kvcache JSONL format: a header line naming the
 * tenants and classes, then one request a line with every field, tokens
 * included.  Loading the output gives the same workload.  KVC_EIO on a
 * write error, KVC_ENOMEM. */
KVC_API int kvc_workload_write_jsonl(const kvc_workload_t *w, FILE *f);

/* ---- building a workload by hand (tests, embedders) ---------------------
 * kvc_workload_create makes an empty workload; names and requests are then
 * added in arrival order.  A built workload is then used like a loaded one.
 * KVC_EINVAL (bad params, out NULL), KVC_ENOMEM. */
KVC_API int kvc_workload_create(const kvc_workload_params_t *params, kvc_workload_t **out);
/* Index of tenant (or class) `name`, declaring it if new.  KVC_EINVAL (NULL
 * workload, name or index; empty name), KVC_ERANGE (65,536 names already),
 * KVC_ENOMEM. */
KVC_API int kvc_workload_add_tenant(kvc_workload_t *w, const char *name, uint32_t *index);
KVC_API int kvc_workload_add_class(kvc_workload_t *w, const char *name, uint32_t *index);
/* Append a copy of *req (its tokens and output_tokens are copied; NULL
 * output_tokens get deterministic filler; max_output 0 means n_output).
 * A request naming tenant or class 0 when none is declared declares
 * "default".  KVC_EINVAL (NULL workload, request or tokens, empty prompt or
 * output, n_prompt or n_output > max_tokens, max_output < n_output, an
 * undeclared tenant or class, an arrival or think time that is negative,
 * past KVC_SIM_MAX_TIME_S or not a number, an arrival earlier than the
 * previous request's, KVC_SIM_MAX_REQUESTS requests already), KVC_ENOMEM;
 * no request is added on failure. */
KVC_API int kvc_workload_add(kvc_workload_t *w, const kvc_sim_request_t *req);

/* ---- KV tiers in the simulator ---------------------------------------------------------
 * A tier is modelled by its capacity, its link's bandwidth and round-trip time (the spec's
 * bw= and rtt=, or its kind's default: kvc_sim_tier_link), and its mode.  Blocks the
 * simulated pool evicts go to its evict-mode tiers; blocks it caches go to its write-through
 * tiers.  host and disk tiers are per replica and hold what a real store of their capacity
 * would (kvc_tier_meta_create: records of kvc_tier_record_bytes each, LRU); a redis tier is
 * one store shared by every replica, unbounded, where a block is visible from the simulated
 * time it was first written.  At admission a prefix match that ends in the pool continues in
 * the tiers (the first tier, in order, that holds a block serves it); each contiguous run of
 * blocks one tier serves goes through kvc_tier_decide, the first run that recompute wins ends
 * the fetch.  A fetched run holds the request back for its fetch time on the tier's link
 * (one fetch at a time per replica and tier: a queue), then its blocks are cached in the pool
 * and the scheduler hits them. */
#define KVC_SIM_MAX_TIERS          8
/* The prefix lengths of the break-even table: 1K, 4K, 16K and 64K tokens (those under the
 * context length). */
#define KVC_SIM_BREAK_EVEN_LENGTHS 4

typedef struct {
    kvc_tier_kind_t kind;
    kvc_tier_mode_t mode;
    uint64_t capacity_bytes;     /* the spec's; 0: unbounded (redis) */
    uint64_t capacity_records;   /* per replica (host, disk); 0: unbounded */
    double bandwidth_Bps, rtt_s; /* as modelled (the spec's or the kind's default) */
    uint64_t hits;               /* blocks admission lookups found here */
    uint64_t fetches;            /* runs fetched */
    uint64_t fetched_blocks, fetched_tokens;
    uint64_t recompute_chosen_blocks;   /* found here and recomputed: recompute won their run
                                           (or an earlier run of the prefix) */
    uint64_t bytes_read, bytes_written; /* record bytes (headers included) */
    uint64_t puts, evictions, admission_refused, budget_refused;
    uint64_t dropped_blocks; /* fetched but not cached: the pool's prefix they chain from was
                                evicted during the fetch, or no block was free (counted at
                                the first tier) */
    double link_busy_s;      /* seconds its links spent fetching, summed over replicas */
} kvc_sim_tier_stats_t;

/* Fetching a prefix of n_tokens from a tier against recomputing it. */
typedef struct {
    uint32_t n_tokens; /* the prefix, in whole blocks */
    uint32_t n_blocks;
    double bytes;       /* n_blocks x the KV bytes of a block */
    double recompute_s; /* kvc_sim_prefill_s of the prefix from position 0 */
    double transfer_s;  /* bytes / bandwidth */
    double rtt_s;       /* rtt* = recompute_s - transfer_s: below it a fetch wins */
    bool never;         /* rtt* <= 0: the link moves the prefix slower than prefill computes it */
} kvc_sim_break_even_t;

typedef struct {
    uint32_t n_tiers, n_lengths;
    uint32_t block_tokens;
    uint64_t block_bytes;        /* KV bytes of one block, all of a replica's GPUs */
    double prefill_tokens_per_s; /* at position 0 (a full chunk), for reference */
    uint32_t lengths[KVC_SIM_BREAK_EVEN_LENGTHS];
    kvc_tier_kind_t kind[KVC_SIM_MAX_TIERS];
    double bandwidth_Bps[KVC_SIM_MAX_TIERS], rtt_s[KVC_SIM_MAX_TIERS];
    kvc_sim_break_even_t cells[KVC_SIM_MAX_TIERS][KVC_SIM_BREAK_EVEN_LENGTHS];
} kvc_sim_tier_table_t;

/* ======================================================================
 * reports
 * ==================================================================== */

typedef struct { /* one finished request, filled by the simulator */
    double arrival_s, first_token_s, finish_s;
    uint32_t n_prompt, n_output, n_hit_tokens; /* n_hit_tokens: prompt tokens from the
                                                  prefix cache */
    uint32_t tenant, priority;
    uint32_t n_preemptions;
    uint64_t recomputed_tokens;
} kvc_sim_record_t;

typedef struct { /* one time-series sample: the engine's state after a step */
    double t_s;
    uint32_t kv_blocks_used, kv_blocks_total, running, waiting, swapped;
    uint32_t batch_tokens; /* tokens computed in the step */
} kvc_sim_sample_t;

/* Counters the simulator owns and passes in at the end. */
typedef struct {
    uint64_t preemptions, recomputed_tokens, swapped_bytes;
    uint64_t prompt_tokens, hit_tokens; /* for prefix_hit_rate; prompt_tokens 0: summed
                                           from the records */
    uint32_t peak_kv_blocks;
    double simulated_s; /* 0: the last record's finish_s */
    uint64_t steps;
    /* stranded KV (cached, resident, unreachable: only the naive-lru eviction policy strands):
     * the most one replica held at once, what was left at the end, and the blocks ever made
     * unreachable; bytes are KV bytes */
    uint64_t peak_stranded_blocks, peak_stranded_bytes;
    uint64_t end_stranded_blocks, end_stranded_bytes;
    uint64_t strandings;
    uint64_t errored; /* requests that ended with an error (not among the records) */
} kvc_report_totals_t;

typedef struct {
    double ttft_ms, tpot_ms, e2e_ms; /* SLOs; 0 = none.  A request is good when it meets
                                        every SLO given (TPOT only binds n_output > 1) */
    const char *const *tenant_names; /* (n_tenants) borrowed, copied at create; indices past
                                        them are named "tenant<i>" */
    uint32_t n_tenants;
    const char *const *class_names; /* (n_classes) likewise, "class<i>" */
    uint32_t n_classes;
    double sample_interval_s;  /* > 0: one time-series row per interval; 0: adaptive
                                  (starts at 1 ms, doubles to keep <= max_rows) */
    uint32_t max_rows;         /* adaptive mode's bound, >= 16; default 4096 */
    kvc_allocator_t allocator; /* zeroed: the C library */
} kvc_report_params_t;

/* No SLOs, no names, adaptive sampling with at most 4096 rows, libc. */
KVC_API kvc_report_params_t kvc_report_params_default(void);

typedef struct kvc_report kvc_report_t; /* accumulates records and samples */

/* Create an empty report.  KVC_EINVAL (negative or non-finite SLOs or
 * interval, max_rows < 16, NULL or empty names), KVC_ENOMEM.  The caller
 * frees it with kvc_report_destroy. */
KVC_API int kvc_report_create(const kvc_report_params_t *p, kvc_report_t **out);
/* Free the report.  NULL is a no-op. */
KVC_API void kvc_report_destroy(kvc_report_t *r);

/* Record one finished request (copied).  KVC_EINVAL for an inconsistent
 * record (times not finite, not arrival <= first_token <= finish, n_prompt or
 * n_output 0, n_hit_tokens > n_prompt, tenant or priority >= 65536), NULL
 * arguments, or after kvc_report_finish; KVC_ENOMEM.  Amortised O(1). */
KVC_API int kvc_report_add(kvc_report_t *r, const kvc_sim_record_t *rec);
/* Add a time-series sample.  Samples fold into rows of one interval each:
 * a row keeps the maxima of the counts, the last kv_blocks_total, and the
 * sum and maximum of batch_tokens.  KVC_EINVAL (NULL arguments, t_s negative,
 * not finite or earlier than the previous sample, a fixed interval that
 * t_s / interval would take past 9e15 rows, or after finish), KVC_ENOMEM.
 * O(1) amortised. */
KVC_API int kvc_report_sample(kvc_report_t *r, const kvc_sim_sample_t *s);
/* Compute the percentiles, goodput and breakdowns; after this the report
 * takes no more records or samples (KVC_EINVAL), and a second call is
 * KVC_EINVAL, as are t NULL and t->simulated_s negative or not finite.
 * KVC_ENOMEM (the report stays unfinished and may be retried). */
KVC_API int kvc_report_finish(kvc_report_t *r, const kvc_report_totals_t *t);

/* Add a named setting shown in the text report and under "config" in the
 * JSON (the cost model's constants, the policies): a string or a number.
 * Settings keep their order; a repeated key is KVC_EEXIST.  KVC_EINVAL
 * (NULL/empty key, NULL value, non-finite number), KVC_ENOMEM. */
KVC_API int kvc_report_add_config(kvc_report_t *r, const char *key, const char *value);
KVC_API int kvc_report_add_config_num(kvc_report_t *r, const char *key, double value);

/* The tiers section (a run with tiers: kvc_sim_run sets it): per tier what it did, the
 * tokens it saved and the break-even table, printed by the text and JSON writers ("tiers",
 * "tier_saved_tokens", "break_even").  Copied.  A second call replaces the first.
 * KVC_EINVAL (r, tiers or table NULL, n over KVC_SIM_MAX_TIERS), KVC_ENOMEM. */
KVC_API int kvc_report_set_tiers(kvc_report_t *r, const kvc_sim_tier_stats_t *tiers, uint32_t n,
                                 uint64_t saved_tokens, const kvc_sim_tier_table_t *table);

/* Writers: KVC_EINVAL before kvc_report_finish, KVC_EIO on a write error.
 * The text report escapes control bytes in names and settings (\n, \t, \r,
 * else \xNN); JSON escapes them as JSON does.
 * They write nothing else to f and do not close it. */
KVC_API int kvc_report_write_text(const kvc_report_t *r, FILE *f); /* human report */
KVC_API int kvc_report_write_json(const kvc_report_t *r, FILE *f); /* one JSON object and '\n' */
KVC_API int kvc_report_write_csv(const kvc_report_t *r, FILE *f);  /* the time series */
/* Write kv_usage.svg, batch.svg and latency_cdf.svg into dir (created if
 * missing, one level).  KVC_EINVAL (before finish, dir NULL or empty),
 * KVC_EIO (cannot create or write), KVC_ENOMEM. */
KVC_API int kvc_report_write_svg(const kvc_report_t *r, const char *dir);

/* ---- reading a finished report back (tests, sweeps) --------------------- */
typedef enum { KVC_REPORT_ALL, KVC_REPORT_TENANT, KVC_REPORT_CLASS } kvc_report_scope_t;

typedef struct {
    uint64_t count;                       /* samples (TPOT: requests with n_output > 1) */
    double mean, p50, p90, p95, p99, max; /* ms; all 0 when count is 0 */
} kvc_latency_summary_t;

typedef struct {
    uint64_t completed, good; /* good: met every SLO */
    uint64_t prompt_tokens, output_tokens, hit_tokens, preemptions, recomputed_tokens;
    kvc_latency_summary_t ttft_ms, tpot_ms, e2e_ms;
    double throughput_tokens_per_s; /* output tokens per simulated second */
    double goodput_requests_per_s;  /* good requests per simulated second */
    double prefix_hit_rate;         /* hit / prompt tokens (ALL: from the totals) */
} kvc_report_summary_t;

/* The figures of one scope: everything (index ignored), tenant `index` or
 * class `index`.  KVC_EINVAL before finish or for an unknown scope,
 * KVC_ENOENT for an index the report has never seen or been named. */
KVC_API int kvc_report_summary(const kvc_report_t *r, kvc_report_scope_t scope, uint32_t index,
                               kvc_report_summary_t *out);

/* Nearest-rank percentile of sorted[0..n) (ascending): the value at
 * 1-based rank ceil(p / 100 * n), p in [0, 100] taken to 0.01; rank 0 is
 * read as 1.  0 when n is 0. */
KVC_API double kvc_percentile_sorted(const double *sorted, size_t n, double p);

/* ---- progress bar ---------------------------------------------------------
 * For command-line front ends: a one-line bar redrawn in place.  Nothing is
 * drawn until the run has lasted a second, nothing at all when f is not a
 * terminal unless `force`, and at most ten redraws a second.  The caller
 * owns the struct; kvc_progress_start sets every field (a test may then
 * replace now_ns, now_ctx and start_ns to drive a fake clock). */
typedef struct {
    FILE *f;
    const char *label; /* borrowed */
    bool force;        /* draw even when f is not a terminal */
    bool enabled;      /* f is a terminal or force */
    bool drawn;        /* something is on the line */
    uint64_t start_ns, last_draw_ns;
    uint64_t (*now_ns)(void *ctx); /* the clock; kvc_now_ns when NULL (tests set it) */
    void *now_ctx;
} kvc_progress_t;

KVC_API void kvc_progress_start(kvc_progress_t *p, FILE *f, const char *label, bool force);
/* Note progress (done of total, in any unit); draws when due.  Cheap. */
KVC_API void kvc_progress_update(kvc_progress_t *p, uint64_t done, uint64_t total);
/* Draw the final state and end the line, if anything was drawn. */
KVC_API void kvc_progress_finish(kvc_progress_t *p, uint64_t done, uint64_t total);

/* ======================================================================
 * the engine: the real scheduler, pool, prefix cache and sequences in
 * virtual time, with a cost model in place of the forward pass
 * ==================================================================== */

/* The cost of one step, from the planner's descriptors.  Per GPU of one
 * pipeline stage; stages run one after another (no overlap), as the planner
 * assumes:
 *
 *   compute = linear FLOPs of the step's tokens / (peak x mfu)
 *           + attention FLOPs of its (query, key) pairs / (bf16 peak x mfu)
 *   memory  = (weights read once, the input embedding table aside: a step
 *             reads one row of it per token; + KV read by attention + KV written)
 *             / (HBM bandwidth x mbu)
 *   comm    = TP: 2 all-reduces per layer of the step's activations over the
 *             GPU link, ring algorithm, plus a latency per all-reduce
 *   step    = pp x (max(compute, memory) + comm) + overhead
 *             + swapped bytes / host link
 *
 * MoE: the routed experts a step touches are read, 1 - (1 - k/E)^T of them
 * for T tokens choosing k of E.  Every constant is printed in the report. */
/* A measured hardware profile: one machine's step time for a step of T batch tokens whose
 * queries attend K keys each on average (K = the step's (query, key) pairs / T), on a grid
 * measured by a bench program (bench/bench_profile.c: the CPU engine's real steps).  With a
 * profile the cost model's step time is the profile's, interpolated, instead of the
 * roofline's: a step's attention pairs are T x K, so a step cost of the form
 * a + b T + c T K (linear layers, attention, a fixed overhead) is exactly bilinear in
 * (T, K), and bilinear interpolation over the grid reproduces it; beyond the grid the edge
 * segments extend linearly (the result is never negative).
 *
 * The file is JSON:
 *   {"kvcache_profile": 1, "tokens": [1, 2, 4, ...], "context": [16, 128, ...],
 *    "step_ms": [[...one per context...], ...one row per tokens value...], ...}
 * tokens: 1 to 256 strictly increasing values >= 1; context: 1 to 256 strictly increasing
 * values >= 0; step_ms: positive finite milliseconds.  Two optional fields (absent: 0, so a
 * profile written before them loads as it did) hold what a server spends outside its steps,
 * measured through its HTTP API beside the grid, in ms from 0 to 60000:
 *   "request_ms": per request, from the client's send to the first token in its hands, less
 *     the engine's steps (the HTTP request and response, JSON, tokenizing, the hand-over to
 *     the engine thread and back); the simulator admits each request this long after its
 *     arrival, so that an idle server's TTFT is request_ms + its prefill step;
 *   "step_overhead_ms": per step, the server's step loop beyond the engine's step (publishing
 *     each step's tokens to the event thread, the metrics); added to every step's time.
 * Other fields (the machine, the model, how it was measured) are kept for people and
 * ignored.  Immutable once loaded: any number of threads may read it. */
typedef struct kvc_sim_profile kvc_sim_profile_t;
#define KVC_SIM_PROFILE_MAX_POINTS 256

/* Parse a profile from len bytes of JSON (need not be NUL-terminated); `name` labels the
 * message.  On success *out is a profile the caller frees with kvc_sim_profile_destroy.
 * KVC_EPARSE (not JSON, not a version-1 profile, a field missing, of the wrong type, out
 * of order or out of range: one line in err naming it), KVC_EINVAL (NULL arguments),
 * KVC_ENOMEM; *out is then NULL. */
KVC_API KVC_NODISCARD int kvc_sim_profile_parse(const char *json, size_t len, const char *name,
                                                kvc_sim_profile_t **out, char *err, size_t err_cap);
/* The same from a file: also KVC_EIO (it cannot be read). */
KVC_API KVC_NODISCARD int kvc_sim_profile_load(const char *path, kvc_sim_profile_t **out, char *err,
                                               size_t err_cap);
KVC_API void kvc_sim_profile_destroy(kvc_sim_profile_t *p); /* NULL is a no-op */
/* Seconds of a step of `tokens` batch tokens attending `context` keys per query on average,
 * interpolated (see above).  Never fails; >= 0. */
KVC_API double kvc_sim_profile_step_s(const kvc_sim_profile_t *p, double tokens, double context);
/* The profile's fixed costs, in seconds (see above: 0 where the file has none). */
typedef struct {
    double request_s; /* per request, before it reaches the scheduler */
    double step_s;    /* per step, beyond the grid's step time */
} kvc_sim_profile_fixed_t;
/* p's fixed costs; all 0 for NULL.  Never fails. */
KVC_API kvc_sim_profile_fixed_t kvc_sim_profile_fixed(const kvc_sim_profile_t *p);

typedef struct {
    double flops_per_s;             /* per GPU, achieved, for linear layers */
    double attn_flops_per_s;        /* per GPU, achieved, for attention (bf16 rate) */
    double bytes_per_s;             /* per GPU, achieved HBM bandwidth */
    double linear_flops_per_token;  /* per GPU of a stage */
    double attn_flops_per_pair;     /* per GPU of a stage, per (query, key) pair */
    double dense_weight_bytes;      /* per GPU of a stage, read every step */
    double expert_weight_bytes;     /* per GPU of a stage: all routed experts */
    double experts_per_token_share; /* k / E (0: dense) */
    double kv_bytes_per_token;      /* per GPU of a stage */
    double comm_bytes_per_token;    /* per all-reduce, per GPU (activations) */
    uint32_t n_allreduce;           /* per step per stage: 2 per layer when TP > 1 */
    double link_bytes_per_s;        /* GPU to GPU */
    double allreduce_latency_s;
    uint32_t tp, pp;
    double step_overhead_s;       /* scheduling, launch and sampling per step */
    double host_link_bytes_per_s; /* swap traffic */
    /* The block size's kernel term: attention reads a paged block table at
     * block / (block + KVC_SIM_BLOCK_OVERHEAD_TOKENS) of the contiguous rate (a fixed cost per
     * block: the table lookup and the jump to a new page), so KV reads take 1 / efficiency as
     * long.  Calibrated on this repository's decode kernel: paged at 78% of contiguous with
     * 16-token blocks (docs/benchmarks.md, the block sweep, bf16, g = 1). */
    double kv_block_efficiency;
    /* The no-KV-cache baseline: every step recomputes each sequence's whole context (its
     * linear FLOPs, its causal attention, its K/V written and read once), the quadratic cost
     * a KV cache exists to avoid. */
    bool no_kv_cache;
    /* A measured profile (borrowed): non-NULL, a step takes the profile's time for its
     * tokens and mean context, plus the profile's fixed step cost, step_overhead_s and swap
     * traffic, instead of the roofline's. */
    const kvc_sim_profile_t *profile;
} kvc_sim_cost_model_t;

/* The cost model of a planned deployment (kvc_plan_compute's result and its
 * inputs).  step_overhead_s and allreduce_latency_s come from the caller.
 * KVC_EINVAL: a NULL argument, a negative or NaN overhead or latency, TP or
 * PP 0, or a result no step time can come from (FLOP/s or bandwidth not
 * positive and finite, KV bytes per token 0 or over 1e12, a layer count
 * whose all-reduces would wrap); *out is then unspecified. */
KVC_API int kvc_sim_cost_model(const kvc_plan_model_t *model, const kvc_plan_gpu_t *gpu,
                               const kvc_plan_params_t *plan, const kvc_plan_result_t *result,
                               double step_overhead_s, double allreduce_latency_s,
                               kvc_sim_cost_model_t *out);

typedef struct {
    double compute_s, memory_s, comm_s, swap_s, total_s;
    double linear_flops, attn_flops, bytes_read;
} kvc_sim_step_cost_t;

/* Seconds one planned step takes; detail (may be NULL) gets the parts.  cm
 * must come from a successful kvc_sim_cost_model.  Never fails. */
KVC_API double kvc_sim_step_time(const kvc_sim_cost_model_t *cm, const kvc_sched_plan_t *plan,
                                 kvc_sim_step_cost_t *detail);

typedef enum {
    KVC_SIM_ALLOC_PAGED = 0,
    KVC_SIM_ALLOC_CONTIGUOUS,
    KVC_SIM_ALLOC__COUNT
} kvc_sim_allocation_t;
/* "paged", "contiguous" ("?" for an invalid value); the index of a name, or -1.  Never fail. */
KVC_API const char *kvc_sim_allocation_name(kvc_sim_allocation_t a);
KVC_API int kvc_sim_allocation_parse(const char *name);
/* tokens of reading a paged block costs on top of its own (see kv_block_efficiency) */
#define KVC_SIM_BLOCK_OVERHEAD_TOKENS 4.5

typedef struct {
    /* the deployment, as for kvcache plan */
    kvc_plan_model_t model;
    kvc_plan_gpu_t gpu;
    kvc_plan_params_t plan;
    uint32_t num_blocks; /* KV blocks per replica; 0: what the planner derives */
    /* the scheduler (max_num_seqs / max_num_batched_tokens / block size follow plan) */
    kvc_sched_params_t sched;
    bool prefix_caching;     /* default true */
    bool tenant_salts;       /* each tenant's cache salt is its name: no sharing across
                                tenants (default: one shared cache) */
    uint64_t seed;           /* hash seed and draft acceptance draws (default 1) */
    kvc_eviction_t eviction; /* the prefix cache's eviction policy (default KVC_EVICT_LRU);
                                the preemption victim is sched.victim */
    /* the executor */
    double step_overhead_s;           /* default 0.002 */
    double allreduce_latency_s;       /* default 8e-6 */
    const kvc_sim_profile_t *profile; /* measured step times (borrowed; NULL: the roofline);
                                         its request_ms delays each request's admission */
    bool hold_shared_prefix;  /* as kvcache's engine admits: a request that shares a whole block
                                 of prefix with a request still computing it waits until that
                                 block is computed, so that it is computed once (default off:
                                 the scheduler admits both) */
    double spec_acceptance;   /* probability each draft is accepted (default 0.7) */
    bool closed_loop;         /* multi-turn: a turn arrives think_s after the previous
                                 turn finished, not at its trace time */
    double sample_interval_s; /* time series; 0: adaptive */
    /* the report */
    double slo_ttft_ms, slo_tpot_ms, slo_e2e_ms; /* 0: none */
    /* the planner's result for exactly this model, gpu and plan (kvc_plan_compute's, by a
     * caller that runs one deployment many times: a sweep over policies, a fault test); the
     * run uses it instead of planning again.  NULL: the run plans (the default) */
    const kvc_plan_result_t *planned;
    /* progress: called about every 1% of requests (may be NULL) */
    void (*progress)(void *ctx, uint64_t done, uint64_t total);
    void *progress_ctx;
    /* debug trace of every step's decisions (NULL: none) */
    FILE *trace;
    /* check every invariant after every step (kvc_sched_check: blocks balanced, refcounts,
     * caps; and the step's token budget and running cap); slow, for tests.  (The run always
     * checks them at the end of each replica and after a failed allocation.) */
    bool check_every_step;
    /* memory: the most the run may keep resident at once, the workload it is given included
     * (the replica's pool, prefix cache, sequences and scheduler, and the engine's own
     * tables).  A run estimated to need more is refused before it allocates (see
     * kvc_sim_run).  0: the memory this machine has (physical memory, or a lower
     * address-space or cgroup limit) */
    uint64_t max_memory_bytes;
    /* every allocation of the run goes through it (the replicas' pools, prefix caches,
     * sequence tables and schedulers included; sched.allocator is not used); zeroed: the C
     * library */
    kvc_allocator_t allocator;
    /* baselines: KVC_SIM_ALLOC_CONTIGUOUS reserves max_model_len of KV per request when it is
     * admitted (the pre-paging allocator: admission reserves the maximum, no block is shared,
     * the prefix cache is off) and measures the fragmentation; no_kv_cache recomputes every
     * step (the cost model's no_kv_cache; the prefix cache is off, the pool still admits as a
     * paged one would).  Defaults: paged, with a KV cache */
    kvc_sim_allocation_t allocation;
    bool no_kv_cache;
    /* KV tiers (docs/sim.md, "Tiers"): copies of blocks outside the pool, modelled by
     * capacity, bandwidth and round-trip time, in lookup order.  Borrowed; n_tiers <=
     * KVC_SIM_MAX_TIERS; 0: none (the default).  The admission policy and the write budget
     * in bytes a day (0: unlimited) apply to disk tiers, as --tier-admission and
     * --tier-disk-write-budget do */
    const kvc_tier_spec_t *tiers;
    uint32_t n_tiers;
    kvc_tier_admission_t tier_admission;
    uint64_t tier_disk_write_budget;
} kvc_sim_config_t;

KVC_API kvc_sim_config_t kvc_sim_config_default(void);

/* ---- KV tiers: links and the break-even table (the types are above, by the report) ---- */
/* The link a tier is modelled with: the spec's bw and rtt where given, else its kind's
 * default: host, the GPU's host link (cm->host_link_bytes_per_s, PCIe; pinned memcpy reaches
 * about that) and 10 us (a copy's launch and completion); disk, one NVMe SSD, 7 GB/s (PCIe 4
 * x4 sequential reads; no more than the host link) and 100 us (a read's latency); redis, a
 * 10 GbE LAN, 1.25 GB/s and 200 us (a same-datacenter round trip plus Redis's own handling).
 * Never fails. */
KVC_API void kvc_sim_tier_link(const kvc_tier_spec_t *spec, const kvc_sim_cost_model_t *cm,
                               double *bandwidth_Bps, double *rtt_s);

/* Seconds the deployment spends computing the prefill of n_tokens tokens that start at
 * first_pos: n_tokens at the prefill rate of a full chunk of chunk_tokens (the engine's token
 * budget) placed at the run's midpoint, rate = chunk_tokens / (kvc_sim_step_time of that one
 * chunk - the step overhead).  The midpoint makes the attention term exact (it grows linearly
 * with the position).  chunk_tokens 0 counts as 1.  Never fails; 0 for n_tokens 0. */
KVC_API double kvc_sim_prefill_s(const kvc_sim_cost_model_t *cm, uint32_t chunk_tokens,
                                 uint64_t first_pos, uint64_t n_tokens);

/* The break-even row of one prefix: n_tokens rounded down to whole blocks, recompute_s from
 * kvc_sim_prefill_s at position 0, transfer_s = bytes / bandwidth, rtt* = their difference.
 * KVC_EINVAL (cm or out NULL, block_tokens 0, a bandwidth not finite and > 0). */
KVC_API KVC_NODISCARD int kvc_sim_break_even(const kvc_sim_cost_model_t *cm, uint32_t chunk_tokens,
                                             uint32_t block_tokens, uint64_t block_bytes,
                                             double bandwidth_Bps, uint32_t n_tokens,
                                             kvc_sim_break_even_t *out);

/* The break-even table of cfg's tiers for cfg's deployment, without running anything: plans
 * it (or takes cfg->planned), builds its cost model (with cfg->profile) and fills *out for
 * each tier and each length of KVC_SIM_BREAK_EVEN_LENGTHS under the context length (at least
 * one: the context length less one token, rounded down to a block, when even 1K is over it).
 * Errors, with one line in err: KVC_EINVAL (NULL arguments, no tiers or more than
 * KVC_SIM_MAX_TIERS, what kvc_plan_compute or kvc_sim_cost_model refuse). */
KVC_API KVC_NODISCARD int kvc_sim_tier_table(const kvc_sim_config_t *cfg, kvc_sim_tier_table_t *out,
                                             char *err, size_t err_cap);

/* Write the table: text (one row a tier, one column a length, rtt* in us or ms, "never") or
 * JSON (an array of {"kind", "bandwidth_Bps", "rtt_s", "rows": [{"tokens", "blocks",
 * "bytes", "recompute_s", "transfer_s", "break_even_rtt_s" (null: never), "fetch_wins"}]}).
 * `indent` prefixes every JSON line after the first.  KVC_EINVAL (NULL), KVC_EIO. */
KVC_API int kvc_sim_tier_table_write_text(const kvc_sim_tier_table_t *t, FILE *f);
KVC_API int kvc_sim_tier_table_write_json(const kvc_sim_tier_table_t *t, FILE *f,
                                          const char *indent);

typedef struct {
    kvc_plan_result_t planned; /* the planner's view of the deployment */
    kvc_sim_cost_model_t cost;
    uint32_t num_blocks, n_replicas, n_groups;
    uint64_t requests, completed, steps;
    uint64_t rejected; /* refused: over max_model_len, or never fitting the pool or a cap */
    uint64_t errored;  /* ended by the scheduler with an error (kvc_sched_done_t.error: the seq
                          table's allocation failed), like a server's failed request */
    uint64_t preemptions, recomputed_tokens, swapped_out_bytes, swapped_in_bytes;
    uint64_t prompt_tokens, hit_tokens, resume_hit_tokens;
    uint32_t peak_kv_blocks, peak_running;
    /* stranded KV (naive-lru only): blocks cached, resident and unreachable.  Peak: the most
     * one replica's cache held after a step; end: what the replicas' caches held when they
     * finished, together; strandings: blocks made unreachable, all replicas.  Bytes: blocks x
     * kv_bytes_per_block (the model's KV bytes per token x block size, a replica's whole KV,
     * though the simulated pool holds metadata only) */
    uint64_t peak_stranded_blocks, end_stranded_blocks, strandings;
    uint64_t kv_bytes_per_block;
    double simulated_s;
    double wall_s;       /* real seconds the run took */
    uint64_t peak_bytes; /* the most the run held at once through its allocator */
    /* contiguous allocation: 1 - blocks used / blocks reserved (running x max_model_len),
     * the mean over steps and the peak; the most blocks reserved at once.  0 when paged */
    double fragmentation_mean, fragmentation_peak;
    uint64_t peak_reserved_blocks;
    /* KV tiers (cfg->tiers, in order): what each did, summed over the replicas; the prompt
     * tokens fetched instead of recomputed; the break-even table (n_tiers 0: no tiers) */
    uint32_t n_tiers;
    kvc_sim_tier_stats_t tiers[KVC_SIM_MAX_TIERS];
    uint64_t tier_saved_tokens;
    kvc_sim_tier_table_t break_even;
} kvc_sim_result_t;

/* Run the workload through the deployment and fill `report` (created by the
 * caller; finished here).  Deterministic: the same config, workload and seed
 * give the same report, byte for byte.  Data parallelism: request i goes to
 * replica i mod dp; replicas are simulated one after another, those that
 * receive no request not at all; the time series is replica 0's.  Closed
 * loop, a turn waits for the previous turn of its conversation on the same
 * replica; one whose earlier turns all went to other replicas arrives at its
 * trace time.  A request whose prompt reaches max_model_len, or that could
 * never fit the pool or a cap that applies to it, is refused and counted
 * (out->rejected), as a server would answer it with an error; its output
 * stops at max_model_len.  A request the scheduler ends with an error that
 * the environment causes (kvc_sched_done_t.error KVC_ENOMEM: its sequence
 * could not take a step's results) is counted (out->errored) and left out of
 * the records, as a server's failed request, and the run goes on (closed
 * loop, its next turn is released as a finished one's would be); any other
 * error there only a bug can cause, and fails the run (KVC_ECORRUPT).
 *
 * The prefix cache evicts by cfg->eviction.  Under every policy but
 * naive-lru no cached block is ever stranded; naive-lru strands a block's
 * cached children when it evicts the block while they are cached, which the
 * library's tail-first release never lets happen (a parent returns to the
 * free queue after its children), so a run strands nothing under it either
 * unless a layer below changes that: out's stranding counters say.
 *
 * Memory: every allocation goes through cfg->allocator.  Before allocating,
 * the run measures what a replica's engine costs: it builds one at 1,024 and
 * 2,048 blocks, counting the bytes allocated and the pages creation writes,
 * and estimates what the run keeps resident (what creation writes for every
 * block, plus, for each block the workload could ever use, its bytes and a
 * page of each table that grows with the pool; 1/16 on top).  A run whose
 * estimate (with the workload's own bytes) passes max_memory_bytes is
 * refused.  While it runs, an allocation that would take the bytes it holds
 * past max_memory_bytes (or past the bytes the estimate says it allocates,
 * where that is more) fails.  The report is the caller's and allocates
 * through its own allocator.
 *
 * Fails with a one-line message in err:
 *   KVC_EINVAL    NULL arguments, bad parameters (spec acceptance outside
 *                 0..1, a negative step overhead, more tenants or classes
 *                 than the scheduler takes, a pool of 0 or over 2^30 blocks,
 *                 a block size over 256 or that the pool refuses, scheduler
 *                 parameters it refuses), what kvc_plan_compute refuses, a
 *                 deployment that does not start (and no num_blocks), a model
 *                 whose KV cache takes no bytes or a cost model no step time
 *                 can come from, a simulation that is stuck (requests wait
 *                 and nothing can ever run), an eviction policy out of range,
 *                 tiers (cfg->tiers) more than KVC_SIM_MAX_TIERS or NULL with
 *                 n_tiers > 0, with the prefix cache off (also the no-KV-cache
 *                 and contiguous baselines), for a model with sliding-window
 *                 layers, or a host or disk tier that holds not one block or
 *                 more than 2^30
 *   KVC_ENOMEM    an allocation failed, or the run would need more memory
 *                 than max_memory_bytes or the machine has (the message says
 *                 how much)
 *   KVC_ECORRUPT  an invariant failed (check_every_step, the check after each
 *                 replica or the one after a failed allocation), or a layer
 *                 below returned an error only a bug can cause: a bug
 * On failure the report holds what was recorded so far, unfinished. */
KVC_API int kvc_sim_run(const kvc_sim_config_t *cfg, const kvc_workload_t *w, kvc_report_t *report,
                        kvc_sim_result_t *out, char *err, size_t err_cap);

#ifdef __cplusplus
}
#endif
#endif /* KVCACHE_SIM_H */
