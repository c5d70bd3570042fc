/* kvcache/tier.h - copies of KV blocks outside the pool: host memory, a local
 * disk file and a shared Redis, behind one block-store interface, and the
 * fetch-or-recompute policy that decides whether a copy is worth fetching.
 *
 * A block is stored under its identity (kvc_tier_key_t): the chained 128-bit
 * block hash (kvc_prefix_hash) plus the whole namespace, compared exactly.
 * Every stored record carries, besides the KV bytes (opaque to the store:
 * the caller serialises a block's KV across layers), that identity (hash,
 * namespace, parent hash, the block's tokens, a whole-prefix fingerprint and
 * the prefix depth) and an XXH3-64 checksum over header, tokens and payload.
 * A get verifies the checksum and the identity the caller expects; a record
 * that fails either is a miss, is dropped from the store and is counted
 * (n_corrupt, n_mismatch).  A store never hands out bytes it did not
 * checksum (DESIGN.md invariant 11).
 *
 * Backends:
 *   host  - a DRAM arena of its own, sized in bytes, LRU, O(1) operations.
 *   disk  - one preallocated file of fixed-size slots with an in-memory index
 *           rebuilt on open from the slots' headers (a restart reuses what is
 *           there; a torn or corrupt record is skipped and counted), LRU over
 *           slots.  Write errors (ENOSPC, EFBIG, EIO) are counted faults.
 *   redis - hiredis against a redis-server shared by replicas: binary-safe
 *           values under keys "<prefix>:<model-id>:<epoch>:<hash>:<ns digest>",
 *           a TTL, pipelined get_many / put_many, a connect and command
 *           timeout (the fetch deadline).  A lost connection is a miss counted
 *           in n_faults; the store reconnects, with backoff, on a later call.
 * Every backend takes an admission policy (always, second-hit, depth:N) and a
 * write budget in bytes per day (a token bucket over the store's clock);
 * writes refused by either are counted, not errors.
 *
 * Time: each store reads time only through params.clock_ns (default
 * kvc_now_ns), for the write budget, the reconnect backoff and the fetch
 * latency histogram, so tests run on a virtual clock.
 *
 * Errors: functions that return int return 0 or a negative KVC_E* code (each
 * one's are listed at it).  A fault of the medium (a full disk, a dropped
 * connection, a corrupt record) is never an error code: a get misses, a put
 * reports KVC_TIER_PUT_FAULT, and the stats count it.
 *
 * Thread-safety: a store is not thread-safe; its owner serialises calls (the
 * offload thread, or the scheduler thread).  The policy functions are pure
 * and reentrant.
 */
#ifndef KVCACHE_TIER_H
#define KVCACHE_TIER_H

#include "kvcache/prefix.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- block identity --------------------------------------------------------
 * What a record is stored under and verified against.  Borrowed by every call. */
typedef struct {
    kvc_hash128_t hash;        /* the chained block hash (kvc_prefix_hash) */
    kvc_hash128_t parent_hash; /* the previous block's hash; zero for a root */
    kvc_hash128_t fingerprint; /* whole-prefix fingerprint (kvc_prefix_fingerprint-style) */
    const kvc_namespace_t *ns; /* NULL: the default namespace (all zero) */
    const kvc_token_t *tokens; /* (n_tokens): the block's tokens */
    uint32_t n_tokens;         /* must equal the store's block_tokens */
    uint32_t depth;            /* the block's index in its prefix (0 = first block) */
} kvc_tier_key_t;

/* ---- admission policies ------------------------------------------------------
 * Which puts a store writes.  One row here plus its case in src/tier/tier.c
 * make a policy. */
#define KVC_TIER_ADMISSION_MAP(XX)                                                     \
    XX(ALWAYS, "always", "every put is written")                                       \
    XX(SECOND_HIT, "second-hit",                                                       \
       "written only when the block was put or missed before (a bounded ghost set of " \
       "recent identities remembers it)")                                              \
    XX(DEPTH, "depth",                                                                 \
       "depth:N - only blocks at prefix depth >= N (deep blocks of long "              \
       "shared prefixes are the likely hits)")

typedef enum {
#define KVC__TIER_ADM_ENUM(id, name, summary) KVC_TIER_ADMIT_##id,
    KVC_TIER_ADMISSION_MAP(KVC__TIER_ADM_ENUM)
#undef KVC__TIER_ADM_ENUM
        KVC_TIER_ADMIT__COUNT
} kvc_tier_admission_kind_t;

typedef struct {
    kvc_tier_admission_kind_t kind; /* KVC_TIER_ADMIT_ALWAYS (0) by default */
    uint32_t min_depth;             /* depth:N only */
} kvc_tier_admission_t;

/* Parse "always", "second-hit" or "depth:N" (N a decimal integer up to 2^31).  Returns 0, or
 * KVC_EINVAL (*out untouched) for anything else or an argument NULL. */
KVC_API KVC_NODISCARD int kvc_tier_admission_parse(const char *s, kvc_tier_admission_t *out);
/* "always", "second-hit", "depth" (the kind's name); "?" for an invalid kind. */
KVC_API const char *kvc_tier_admission_name(kvc_tier_admission_kind_t k);

/* ---- statistics ------------------------------------------------------------- */
/* Fetch latency histogram: bucket i counts gets that took <= bounds[i] ns (the last bucket,
 * KVC_TIER_LAT_BUCKETS - 1, is +Inf).  Non-cumulative counts; Prometheus sums them. */
#define KVC_TIER_LAT_BUCKETS 16
/* The finite upper bounds in ns (KVC_TIER_LAT_BUCKETS - 1 of them, ascending; static). */
KVC_API const uint64_t *kvc_tier_latency_bounds_ns(void);

typedef struct {
    uint64_t n_hits;              /* gets that returned verified bytes */
    uint64_t n_misses;            /* gets that did not (absent, corrupt, mismatch, fault) */
    uint64_t n_puts;              /* records written */
    uint64_t n_put_present;       /* puts of an identity already stored (host, disk: not
                                     rewritten, only made most recent) */
    uint64_t n_deletes;           /* records removed by kvc_tier_delete */
    uint64_t bytes_read;          /* record bytes read by gets that hit */
    uint64_t bytes_written;       /* record bytes written (headers included) */
    uint64_t n_corrupt;           /* records dropped: checksum, length or format wrong */
    uint64_t n_mismatch;          /* records dropped: checksum right, identity not the
                                     expected one (a hash collision or a stale record) */
    uint64_t n_faults;            /* medium failures: write errors, lost connections */
    uint64_t n_budget_refused;    /* puts refused by the write budget */
    uint64_t n_admission_refused; /* puts refused by the admission policy */
    uint64_t n_evictions;         /* records dropped for space (LRU) */
    uint64_t n_records;           /* current: records indexed (redis: not tracked, 0) */
    uint64_t capacity_records;    /* host, disk: slots; redis: 0 */
    uint64_t latency_counts[KVC_TIER_LAT_BUCKETS]; /* gets, by duration */
    uint64_t latency_sum_ns;
} kvc_tier_stats_t;

/* ---- stores ----------------------------------------------------------------- */
typedef uint64_t (*kvc_tier_clock_fn)(void *ctx);

typedef struct {
    size_t block_bytes;             /* KV payload bytes per block (required, > 0) */
    uint32_t block_tokens;          /* tokens per block (required, 1..4096) */
    uint64_t capacity_bytes;        /* host, disk: bytes of records (headers included) */
    kvc_tier_admission_t admission; /* always by default */
    uint64_t write_budget_per_day;  /* bytes a day; 0: unlimited */
    uint64_t write_budget_burst;    /* token bucket depth in bytes; 0: one hour's budget */
    uint32_t ghost_entries;         /* second-hit's ghost set size; 0: 4096 */
    kvc_tier_clock_fn clock_ns;     /* NULL: kvc_now_ns */
    void *clock_ctx;
    /* redis only */
    const char *model_id;      /* part of every key; NULL: "model" (copied at create) */
    uint64_t weight_epoch;     /* part of every key */
    uint32_t ttl_s;            /* SET ... EX; 0: no TTL */
    uint32_t timeout_ms;       /* connect and command timeout = the fetch deadline; 0: 100 */
    uint32_t backoff_ms;       /* first reconnect delay after a fault (doubles to 5 s); 0: 50 */
    kvc_allocator_t allocator; /* zeroed: the C library */
} kvc_tier_params_t;

/* Zero sizes (set block_bytes, block_tokens, capacity_bytes), always, unlimited budget, the
 * monotonic clock, model "model" epoch 0, no TTL, 100 ms timeout, 50 ms backoff, libc. */
KVC_API kvc_tier_params_t kvc_tier_params_default(void);

/* Bytes one stored record takes (header + tokens + payload) for these sizes; 0 if
 * block_tokens is 0 or above 4096 or block_bytes is 0.  A host or disk store holds
 * capacity_bytes / this many records. */
KVC_API size_t kvc_tier_record_bytes(size_t block_bytes, uint32_t block_tokens);

typedef struct kvc_tier_store kvc_tier_store_t;

/* How a put ended.  Only KVC_TIER_PUT_STORED and _PRESENT leave the block in the store. */
typedef enum {
    KVC_TIER_PUT_STORED = 0,   /* written */
    KVC_TIER_PUT_PRESENT,      /* already stored with this identity; made most recent */
    KVC_TIER_PUT_NOT_ADMITTED, /* refused by the admission policy */
    KVC_TIER_PUT_OVER_BUDGET,  /* refused by the write budget */
    KVC_TIER_PUT_FAULT,        /* the medium failed; nothing stored, index consistent */
} kvc_tier_put_status_t;

/* The interface a backend implements.  get_many / put_many may be NULL: the
 * kvc_tier_* wrappers then loop over get / put.  The wrappers check arguments
 * first, so a backend sees only well-formed keys and sizes. */
typedef struct {
    const char *name; /* "host", "disk", "redis" */
    int (*put)(kvc_tier_store_t *s, const kvc_tier_key_t *key, const void *data,
               kvc_tier_put_status_t *status);
    int (*get)(kvc_tier_store_t *s, const kvc_tier_key_t *key, void *out);
    int (*contains)(kvc_tier_store_t *s, const kvc_tier_key_t *key);
    int (*del)(kvc_tier_store_t *s, const kvc_tier_key_t *key);
    int (*put_many)(kvc_tier_store_t *s, const kvc_tier_key_t *keys, const void *const *data,
                    size_t n, kvc_tier_put_status_t *status);
    int (*get_many)(kvc_tier_store_t *s, const kvc_tier_key_t *keys, void *const *out, size_t n,
                    int *results);
    void (*stats)(const kvc_tier_store_t *s, kvc_tier_stats_t *out);
    void (*destroy)(kvc_tier_store_t *s);
} kvc_tier_ops_t;

/* Every store starts with this; a backend's own struct embeds it first. */
struct kvc_tier_store {
    const kvc_tier_ops_t *ops;
    size_t block_bytes;
    uint32_t block_tokens;
};

/* A host-memory store of params->capacity_bytes (allocated at create).  Errors: KVC_EINVAL
 * (an argument NULL, block_bytes 0, block_tokens 0 or above 4096, a capacity below one
 * record, an invalid admission policy), KVC_ENOMEM.  Free with kvc_tier_destroy. */
KVC_API KVC_NODISCARD int kvc_tier_host_create(const kvc_tier_params_t *params,
                                               kvc_tier_store_t **out);
/* A disk store in the file at `path` of params->capacity_bytes (rounded down to whole
 * slots, plus one 4 KiB header), created and preallocated if missing.  An existing file
 * made with the same block_bytes, block_tokens and capacity is reused: its records are
 * indexed from their headers, most recently written first in the LRU; a slot whose
 * header is torn or corrupt is skipped and counted in n_corrupt.  An existing file made
 * with other sizes is refused (KVC_EEXIST), never overwritten.  Errors: as
 * kvc_tier_host_create (path NULL or empty: KVC_EINVAL), KVC_EEXIST, KVC_EIO (the file
 * cannot be opened, read, preallocated: also ENOSPC and EFBIG at create). */
KVC_API KVC_NODISCARD int kvc_tier_disk_create(const char *path, const kvc_tier_params_t *params,
                                               kvc_tier_store_t **out);
/* A Redis store at host:port whose keys start with `prefix` (NULL or "": "kvc").  It
 * connects at once; a server that cannot be reached is not an error (the store counts a
 * fault and retries on later calls with backoff).  Errors: KVC_EINVAL (host NULL or empty,
 * port 0, a prefix or model id with a ':' or whitespace or over 64 bytes, bad sizes as
 * kvc_tier_host_create), KVC_ENOMEM. */
KVC_API KVC_NODISCARD int kvc_tier_redis_create(const char *host, uint16_t port, const char *prefix,
                                                const kvc_tier_params_t *params,
                                                kvc_tier_store_t **out);
/* An index-only store: what a host (or disk) store of params->capacity_bytes holds, which
 * identities, in which LRU order, with the same admission policy, write budget and counters
 * (bytes_read and bytes_written count the record bytes a real store would move), but no
 * bytes: a put ignores its data and a get writes nothing to its out.  For the simulator,
 * which models a tier of any size without the memory.  Errors: as kvc_tier_host_create
 * (KVC_EINVAL for a capacity of more than 2^30 records).  Free with kvc_tier_destroy. */
KVC_API KVC_NODISCARD int kvc_tier_meta_create(const kvc_tier_params_t *params,
                                               kvc_tier_store_t **out);
/* Free the store (the disk file and the Redis keys stay).  NULL is a no-op. */
KVC_API void kvc_tier_destroy(kvc_tier_store_t *s);

/* Store `data` (block_bytes of it) under key, if the admission policy and the write budget
 * let it; *status (if not NULL) says how it ended.  Every outcome but a caller error returns
 * 0.  Errors: KVC_EINVAL (s, key or data NULL, key->n_tokens != block_tokens, tokens NULL,
 * a namespace group >= KVC_MAX_GROUPS); nothing changes then. */
KVC_API KVC_NODISCARD int kvc_tier_put(kvc_tier_store_t *s, const kvc_tier_key_t *key,
                                       const void *data, kvc_tier_put_status_t *status);
/* Copy the verified bytes (block_bytes) stored under key into out.  Returns 0 on a hit, or
 * KVC_ENOENT on a miss: absent, corrupt (dropped; n_corrupt), another identity under this
 * hash and namespace (dropped; n_mismatch), a fault (n_faults) or a timeout.  out may be
 * partly written on a miss.  KVC_EINVAL as kvc_tier_put (out NULL among them). */
KVC_API KVC_NODISCARD int kvc_tier_get(kvc_tier_store_t *s, const kvc_tier_key_t *key, void *out);
/* 1 if a record is stored under key's hash and namespace (unverified: a hint, no bytes
 * read), 0 if not (or on a fault), KVC_EINVAL as kvc_tier_put. */
KVC_API int kvc_tier_contains(kvc_tier_store_t *s, const kvc_tier_key_t *key);
/* Remove the record under key's hash and namespace: 0, KVC_ENOENT (none, or a fault),
 * KVC_EINVAL as kvc_tier_put. */
KVC_API int kvc_tier_delete(kvc_tier_store_t *s, const kvc_tier_key_t *key);
/* n gets in one batch (redis: one pipelined round trip): results[i] = 0 (hit, out[i]
 * written) or KVC_ENOENT.  Returns the number of hits, or KVC_EINVAL (any key malformed,
 * keys, out or results NULL with n > 0, an out[i] NULL) with nothing read. */
KVC_API KVC_NODISCARD int kvc_tier_get_many(kvc_tier_store_t *s, const kvc_tier_key_t *keys,
                                            void *const *out, size_t n, int *results);
/* n puts in one batch (redis: one pipelined round trip); status[i] (status may be NULL)
 * as kvc_tier_put's.  Returns 0, or KVC_EINVAL as kvc_tier_get_many with nothing written. */
KVC_API KVC_NODISCARD int kvc_tier_put_many(kvc_tier_store_t *s, const kvc_tier_key_t *keys,
                                            const void *const *data, size_t n,
                                            kvc_tier_put_status_t *status);
/* The store's counters.  Both arguments must be non-NULL (else *out is zeroed or nothing
 * happens). */
KVC_API void kvc_tier_stats(const kvc_tier_store_t *s, kvc_tier_stats_t *out);
/* "host", "disk", "redis"; "?" for NULL. */
KVC_API const char *kvc_tier_name(const kvc_tier_store_t *s);
/* Check the store's index (host, disk): every record reachable once from its hash chain
 * and once from the LRU, counts exact, free slots not indexed.  0, or KVC_ECORRUPT with one
 * line in msg; KVC_EINVAL for s NULL.  A backend without an index returns 0. */
KVC_API int kvc_tier_check(const kvc_tier_store_t *s, char *msg, size_t msg_cap);

/* ---- the command-line form ---------------------------------------------------
 *   host:SIZE                       e.g. host:512MiB
 *   disk:PATH:SIZE                  e.g. disk:/var/cache/kvc.bin:2GiB (SIZE after the last ':')
 *   redis://HOST:PORT[/PREFIX]      e.g. redis://127.0.0.1:6379/myprefix
 * each optionally followed by ",mode=evict" or ",mode=write-through".  The default mode is
 * evict for host and disk (blocks the pool evicts are copied down) and write-through for
 * redis (blocks are written as they are computed, so other replicas hit them at once).
 * SIZE is kvc_plan_parse_bytes's form.
 * Two more options, in any order with mode= (the last of each given wins), say what the
 * tier's link is expected to do: ",bw=RATE" (a number and B/s, KB/s, MB/s, GB/s, TB/s in
 * powers of 1000, KiB/s .. TiB/s in powers of 1024, or Kbit/s .. Tbit/s: "bw=25GB/s",
 * "bw=10Gbit/s") and ",rtt=TIME" (a number and ns, us, ms or s, at most 1e6 s: "rtt=5us",
 * "rtt=0.5ms").  Both must be > 0.  The engine seeds its estimator (kvc_tier_estimator_init)
 * with them; the simulator models the link by them (docs/sim.md says its defaults). */
typedef enum { KVC_TIER_HOST = 0, KVC_TIER_DISK, KVC_TIER_REDIS } kvc_tier_kind_t;
typedef enum { KVC_TIER_MODE_EVICT = 0, KVC_TIER_MODE_WRITE_THROUGH } kvc_tier_mode_t;

#define KVC_TIER_PATH_MAX   1024
#define KVC_TIER_HOST_MAX   256
#define KVC_TIER_PREFIX_MAX 64

typedef struct {
    kvc_tier_kind_t kind;
    kvc_tier_mode_t mode;
    uint64_t capacity_bytes;          /* host, disk */
    char path[KVC_TIER_PATH_MAX];     /* disk */
    char host[KVC_TIER_HOST_MAX];     /* redis */
    uint16_t port;                    /* redis */
    char prefix[KVC_TIER_PREFIX_MAX]; /* redis; "kvc" when the URL has none */
    double bandwidth_Bps;             /* ",bw=": bytes/s; 0 = not given */
    double rtt_s;                     /* ",rtt=": seconds; 0 = not given */
} kvc_tier_spec_t;

/* Parse one --tier value.  Returns 0, or KVC_EINVAL (*out untouched) with one line in msg
 * (if msg) for an unknown kind, mode or option, a missing or bad size (0 among them), an
 * empty path, a bad host, port (1..65535) or prefix, a component too long, a bandwidth or
 * round-trip time that is not a positive number with a known unit, or an argument NULL. */
KVC_API KVC_NODISCARD int kvc_tier_spec_parse(const char *s, kvc_tier_spec_t *out, char *msg,
                                              size_t msg_cap);
/* "host", "disk", "redis"; "?" if invalid.  "evict", "write-through"; "?" if invalid. */
KVC_API const char *kvc_tier_kind_name(kvc_tier_kind_t k);
KVC_API const char *kvc_tier_mode_name(kvc_tier_mode_t m);
/* Create the store a spec names (redis: params->model_id etc. as kvc_tier_redis_create);
 * params->capacity_bytes is replaced by the spec's.  Errors: those of the backend's
 * create, KVC_EINVAL for an argument NULL or an invalid kind. */
KVC_API KVC_NODISCARD int kvc_tier_create(const kvc_tier_spec_t *spec,
                                          const kvc_tier_params_t *params, kvc_tier_store_t **out);
/* Parse a write budget "SIZE/day" (also "/d"; "50GiB/day") into bytes per day.  Returns 0,
 * or KVC_EINVAL (*out untouched) for a missing or other period, a bad or zero size, or an
 * argument NULL. */
KVC_API KVC_NODISCARD int kvc_tier_budget_parse(const char *s, uint64_t *bytes_per_day);

/* ---- fetch or recompute --------------------------------------------------------
 * A run of n contiguous blocks found in a tier costs one round trip plus its bytes over
 * the link to fetch, against its tokens at the engine's prefill rate to recompute:
 *     fetch_s     = latency_s + n * block_bytes / bandwidth
 *     recompute_s = n * block_tokens / prefill_tokens_per_s
 * Fetch wins when fetch_s < recompute_s, which holds for every n >= the break-even
 * n* = floor(latency_s / (block_tokens / rate - block_bytes / bandwidth)) + 1, and never when
 * the link moves a block slower than the engine recomputes it. */
typedef struct {
    uint32_t n_blocks;           /* the run's length (0 allowed: nothing to do, recompute) */
    size_t block_bytes;          /* bytes fetched per block */
    uint32_t block_tokens;       /* tokens per block */
    double bandwidth_Bps;        /* the tier's measured bandwidth, bytes/s (> 0) */
    double latency_s;            /* the tier's measured round trip, s (>= 0) */
    double prefill_tokens_per_s; /* the engine's prefill rate at the run's position (> 0) */
} kvc_tier_run_t;

typedef struct {
    bool fetch;          /* fetch_s < recompute_s */
    double fetch_s;      /* estimated */
    double recompute_s;  /* estimated */
    uint32_t break_even; /* smallest run length that fetch wins; UINT32_MAX: never */
} kvc_tier_decision_t;

/* Decide.  Returns 0, or KVC_EINVAL (run or out NULL, block_tokens 0, a rate or
 * bandwidth not finite and > 0, a latency negative or not finite). */
KVC_API KVC_NODISCARD int kvc_tier_decide(const kvc_tier_run_t *run, kvc_tier_decision_t *out);

/* An online estimate of a tier's latency and bandwidth from measured fetches (bytes moved,
 * seconds taken), as the exponentially weighted least-squares line
 * seconds = latency + bytes / bandwidth.  Until the fetches vary enough in size to fit
 * both, the latency stays at its seed (or its last fit) and only the bandwidth follows.
 * Caller-owned; init it before use. */
typedef struct {
    double latency_s, bandwidth_Bps; /* the current estimate */
    double alpha;                    /* weight of a new sample, (0, 1] */
    double mx, my, mxx, mxy;         /* weighted moments of bytes and seconds */
    uint64_t n_samples;
} kvc_tier_estimator_t;

/* Seed with a latency (>= 0) and bandwidth (> 0) and a weight alpha in (0, 1] (0: 0.1).
 * KVC_EINVAL for e NULL or a value out of range (e unchanged). */
KVC_API KVC_NODISCARD int kvc_tier_estimator_init(kvc_tier_estimator_t *e, double latency_s,
                                                  double bandwidth_Bps, double alpha);
/* Add one measured fetch of `bytes` (> 0) in `seconds` (> 0, finite).  KVC_EINVAL (nothing
 * changes) otherwise or for e NULL. */
KVC_API KVC_NODISCARD int kvc_tier_estimator_observe(kvc_tier_estimator_t *e, uint64_t bytes,
                                                     double seconds);

#ifdef __cplusplus
}
#endif
#endif /* KVCACHE_TIER_H */
