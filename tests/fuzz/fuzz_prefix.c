/* fuzz_prefix.c - libFuzzer target over an encoded sequence of pool and
 * prefix-cache operations, with an oracle.
 *
 * The oracle knows what every cached physical block was computed from: its
 * namespace, every token from position 0 to the block's end, and every
 * multimodal input overlapping that span (hash, start, length).  It learns
 * it when an insert stores a block and forgets it on the cache's REMOVED
 * event.  Every block a lookup, match or probe hands out, and every
 * canonical block an insert names, must have been computed from exactly the
 * request's whole prefix up to that block (invariant 3 with invariant 4),
 * not merely hold the same tokens: this is what catches a sliding-window
 * block matched after an unhashable one (issue 11).  After every operation
 * the invariant checkers pass and the stranded count is exact (0 under
 * every policy but naive-lru).  Any violation aborts.
 *
 * Encoding (missing bytes read as 0):
 *   byte 0: bits 0-1 block size (1, 2, 4, 8); bit 2 a 2-bit index hash;
 *           bits 3-4 the eviction policy; bits 5-7 extra keys per block (0..4)
 *   byte 1: pool size, 4 + b % 32 blocks
 *   byte 2: bits 0-1 group 1's sliding window in blocks (0: full attention),
 *           bit 2 one token more; bits 5-7 weaken the index hash to that many
 *           bits (0: full)
 *   then operations: an opcode byte (op % 8 picks it; op / 8 picks the
 *   namespace, the priority and whether precomputed hashes are passed),
 *   followed by its arguments.  A request's arguments: its length, its
 *   tokens (byte % 4), a count of multimodal inputs, each as start, length
 *   (0..4) and hash (0..2).  A shifted request (op 6) instead names one of
 *   the last prompts and a few tokens to put in front of it: the same
 *   content at other positions, after another prefix, is what a cache must
 *   never confuse.
 */
#include "kvcache/kvcache.h"
#include "kvcache/testing.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXT    32 /* tokens per request */
#define MAXMM   6  /* multimodal inputs per request */
#define MAXB    35 /* pool blocks */
#define MAXLIVE 8
#define N_NS    4 /* namespace 3 is group 1 (sliding when a window is set) */

#define CHECK(cond, ...)                                  \
    do {                                                  \
        if (!(cond)) {                                    \
            fprintf(stderr, "fuzz_prefix: " __VA_ARGS__); \
            fputc('\n', stderr);                          \
            abort();                                      \
        }                                                 \
    } while (0)

typedef struct {
    const uint8_t *p;
    size_t n, at;
} input_t;

static uint8_t next(input_t *in)
{
    return in->at < in->n ? in->p[in->at++] : 0;
}

static kvc_hash128_t weak_hash(const void *data, size_t len, uint64_t seed)
{
    (void)seed;
    const uint8_t *p = data;
    return (kvc_hash128_t){.lo = (p[len / 2] ^ len) & 3, .hi = 0};
}

/* ---- the oracle ------------------------------------------------------------ */
/* What a block's KV was computed from. */
typedef struct {
    bool valid;
    int ns;
    uint32_t n_tokens; /* positions 0 .. n_tokens - 1 */
    kvc_token_t tokens[MAXT];
    uint32_t n_mm; /* the inputs overlapping those positions, sorted */
    kvc_mm_input_t mm[MAXMM];
} origin_t;

typedef struct {
    origin_t block[MAXB];
} oracle_t;

static int mm_cmp(const void *a, const void *b)
{
    const kvc_mm_input_t *x = a, *y = b;
    if (x->start != y->start) return x->start < y->start ? -1 : 1;
    if (x->length != y->length) return x->length < y->length ? -1 : 1;
    if (x->hash.lo != y->hash.lo) return x->hash.lo < y->hash.lo ? -1 : 1;
    return x->hash.hi < y->hash.hi ? -1 : x->hash.hi > y->hash.hi;
}

/* The request's prefix up to the end of its full block `index`. */
static origin_t origin_of(const kvc_prefix_query_t *q, int ns, size_t index, uint32_t bs)
{
    origin_t o = {.valid = true, .ns = ns, .n_tokens = (uint32_t)((index + 1) * bs)};
    memcpy(o.tokens, q->tokens, o.n_tokens * sizeof(kvc_token_t));
    for (size_t i = 0; i < q->n_mm; i++)
        if (q->mm[i].length && q->mm[i].start < o.n_tokens) o.mm[o.n_mm++] = q->mm[i];
    qsort(o.mm, o.n_mm, sizeof o.mm[0], mm_cmp);
    return o;
}

static bool same_origin(const origin_t *a, const origin_t *b)
{
    return a->valid && b->valid && a->ns == b->ns && a->n_tokens == b->n_tokens &&
           memcmp(a->tokens, b->tokens, a->n_tokens * sizeof(kvc_token_t)) == 0 &&
           a->n_mm == b->n_mm && memcmp(a->mm, b->mm, a->n_mm * sizeof(kvc_mm_input_t)) == 0;
}

/* Block `b`, handed out for full block `index` of the request, was computed from its prefix. */
static void check_hit(const oracle_t *o, uint32_t b, const kvc_prefix_query_t *q, int ns,
                      size_t index, uint32_t bs, const char *what)
{
    CHECK(b < MAXB, "%s: block %u out of range", what, b);
    origin_t want = origin_of(q, ns, index, bs);
    const origin_t *got = &o->block[b];
    CHECK(got->valid, "%s: block %u for block %zu of the request holds no identity", what, b,
          index);
    CHECK(same_origin(got, &want),
          "%s: wrong KV: block %u, for positions %zu..%zu (namespace %d), was computed from "
          "%u tokens with %u inputs in namespace %d",
          what, b, index * bs, (index + 1) * bs - 1, ns, got->n_tokens, got->n_mm, got->ns);
}

static void on_event(void *ctx, const kvc_prefix_event_t *ev)
{
    oracle_t *o = ctx;
    CHECK(ev->block < MAXB, "event for block %u", ev->block);
    if (ev->type == KVC_EVENT_REMOVED) o->block[ev->block].valid = false;
}

/* ---- the run ------------------------------------------------------------------ */
typedef struct {
    uint32_t t[MAXT];
    uint32_t n;
} live_t;

#define N_RECENT 4 /* prompts remembered for shifted requests */

typedef struct {
    kvc_token_t t[MAXT];
    size_t n;
} prompt_t;

typedef struct {
    kvc_pool_t *pool;
    kvc_prefix_t *pc;
    oracle_t oracle;
    prompt_t recent[N_RECENT];
    int n_recent;
    kvc_namespace_t ns[N_NS];
    uint32_t bs, n_blocks, max_extra;
    bool sliding_group; /* namespace 3 is sliding */
    kvc_eviction_t policy;
    live_t live[MAXLIVE];
    int n_live;
} world_t;

static void check_all(world_t *w)
{
    char msg[256];
    CHECK(kvc_prefix_check(w->pc, msg, sizeof msg) == 0, "%s", msg);
    kvc_prefix_stats_t s;
    kvc_prefix_stats(w->pc, &s);
    uint32_t stranded = kvc_prefix_count_stranded(w->pc);
    CHECK(stranded == s.n_stranded_blocks, "%u stranded blocks, stats say %u", stranded,
          s.n_stranded_blocks);
    CHECK(w->policy == KVC_EVICT_NAIVE_LRU || stranded == 0, "stranded blocks under %s",
          kvc_eviction_name(w->policy));
}

/* The most extra keys any of blocks 0..index carries (the library refuses more than
 * max_extra). */
static uint32_t max_overlap(const kvc_prefix_query_t *q, size_t index, uint32_t bs)
{
    uint64_t lo = (uint64_t)index * bs, hi = lo + bs;
    uint32_t n = 0;
    for (size_t i = 0; i < q->n_mm; i++) {
        const kvc_mm_input_t *m = &q->mm[i];
        n += m->length && m->start < hi && m->start + m->length > lo;
    }
    return n;
}

typedef struct {
    kvc_token_t t[MAXT];
    kvc_mm_input_t mm[MAXMM];
    kvc_hash128_t hashes[MAXT];
    kvc_prefix_query_t q;
    int ns;
    bool sliding;
} request_t;

static void read_request(world_t *w, input_t *in, uint8_t op, request_t *r)
{
    memset(r, 0, sizeof *r);
    r->ns = (op >> 3) % N_NS;
    r->sliding = r->ns == 3 && w->sliding_group;
    size_t n;
    if (op % 8 == 6 && w->n_recent) { /* shifted: a few tokens, then a recent prompt */
        const prompt_t *p = &w->recent[next(in) % w->n_recent];
        size_t pre = next(in) % (2 * w->bs + 1);
        for (size_t i = 0; i < pre; i++) r->t[i] = next(in) % 4;
        n = KVC_MIN(pre + p->n, (size_t)MAXT);
        memcpy(r->t + pre, p->t, (n - pre) * sizeof(kvc_token_t));
    } else {
        n = 1 + next(in) % MAXT;
        for (size_t i = 0; i < n; i++) r->t[i] = next(in) % 4;
    }
    if (n) { /* remember it */
        prompt_t *slot = &w->recent[w->n_recent < N_RECENT ? w->n_recent++ : next(in) % N_RECENT];
        memcpy(slot->t, r->t, n * sizeof(kvc_token_t));
        slot->n = n;
    }
    size_t n_mm = next(in) % (MAXMM + 1);
    for (size_t i = 0; i < n_mm; i++) {
        r->mm[i].start = next(in) % MAXT;
        r->mm[i].length = next(in) % 5;
        r->mm[i].hash = (kvc_hash128_t){.lo = next(in) % 3, .hi = 0};
    }
    r->q = (kvc_prefix_query_t){.ns = &w->ns[r->ns],
                                .tokens = r->t,
                                .n_tokens = n,
                                .mm = n_mm ? r->mm : NULL,
                                .n_mm = n_mm,
                                .priority = (op >> 5) & 3};
    if (op & 0x80) { /* bring precomputed hashes when they exist */
        size_t nh;
        if (kvc_prefix_hash(w->pc, &r->q, r->hashes, MAXT, &nh) == 0) r->q.hashes = r->hashes;
    }
}

static void check_hits(world_t *w, const request_t *r, const uint32_t *tb,
                       const kvc_prefix_hit_t *hit, const char *what)
{
    const uint32_t bs = w->bs;
    CHECK(hit->n_hit_blocks * bs < r->q.n_tokens || r->q.n_tokens == 0,
          "%s: hit covers the last token", what);
    CHECK(hit->first_hit_block <= hit->n_hit_blocks, "%s: window past the hit", what);
    CHECK(r->sliding || hit->first_hit_block == 0, "%s: full attention with a window", what);
    for (size_t i = 0; i < hit->n_hit_blocks; i++) {
        if (i < hit->first_hit_block) {
            CHECK(tb[i] == KVC_NONE, "%s: out-of-window block held", what);
            continue;
        }
        check_hit(&w->oracle, tb[i], &r->q, r->ns, i, bs, what);
        if (!r->sliding)
            CHECK(kvc_prefix_block_parent(w->pc, tb[i]) == (i ? tb[i - 1] : KVC_NONE),
                  "%s: hit with a foreign parent", what);
    }
}

static void op_request(world_t *w, input_t *in, uint8_t op)
{
    request_t r;
    read_request(w, in, op, &r);
    if (w->n_live == MAXLIVE) return;
    const uint32_t bs = w->bs;
    size_t n = r.q.n_tokens, n_all = (n + bs - 1) / bs, n_full = n / bs;
    uint32_t tb[MAXT];
    kvc_prefix_hit_t hit;
    CHECK(kvc_prefix_lookup(w->pc, &r.q, tb, MAXT, &hit) == 0, "lookup");
    check_hits(w, &r, tb, &hit, "lookup");
    if (kvc_pool_alloc(w->pool, (uint32_t)(n_all - hit.n_hit_blocks), tb + hit.n_hit_blocks)) {
        CHECK(kvc_pool_release(w->pool, tb, (uint32_t)hit.n_hit_blocks) == 0, "release hits");
        return;
    }
    uint32_t parent = hit.n_hit_blocks ? tb[hit.n_hit_blocks - 1] : KVC_NONE;
    for (size_t i = hit.n_hit_blocks; i < n_full; i++) {
        uint32_t canon;
        int rc = kvc_prefix_insert(w->pc, &r.q, i, r.sliding ? KVC_NONE : parent, tb[i], &canon);
        if (rc == KVC_ERANGE) { /* this block (or, sliding, an earlier one) has too many keys */
            CHECK(max_overlap(&r.q, i, bs) > w->max_extra || r.sliding, "ERANGE without cause");
            break; /* nothing after it can be cached either */
        }
        CHECK(rc == 0, "insert: %s", kvc_strerror(rc));
        CHECK(max_overlap(&r.q, i, bs) <= w->max_extra, "inserted a block with too many keys");
        origin_t want = origin_of(&r.q, r.ns, i, bs);
        if (w->oracle.block[canon].valid) { /* found an existing copy: it must be this prefix */
            check_hit(&w->oracle, canon, &r.q, r.ns, i, bs, "insert (canonical copy)");
        } else {
            CHECK(canon == tb[i], "insert named an uncached block %u", canon);
            w->oracle.block[canon] = want;
        }
        if (canon != tb[i]) {
            CHECK(kvc_pool_ref(w->pool, canon) == 0 && kvc_pool_unref(w->pool, tb[i]) == 0, "swap");
            tb[i] = canon;
        }
        parent = tb[i];
    }
    memcpy(w->live[w->n_live].t, tb, n_all * sizeof *tb);
    w->live[w->n_live++].n = (uint32_t)n_all;
}

static void op_match(world_t *w, input_t *in, uint8_t op)
{
    request_t r;
    read_request(w, in, op, &r);
    uint32_t tb[MAXT];
    kvc_block_status_t st[MAXT];
    kvc_prefix_hit_t hit;
    CHECK(kvc_prefix_match(w->pc, &r.q, tb, MAXT, st, &hit) == 0, "match");
    check_hits(w, &r, tb, &hit, "match");
    for (size_t i = 0; i < hit.n_hit_blocks; i++)
        CHECK(st[i] == (i < hit.first_hit_block ? KVC_BLOCK_OUT_OF_WINDOW : KVC_BLOCK_HIT),
              "match: status of hit block %zu", i);
}

static void op_probe(world_t *w, input_t *in, uint8_t op)
{
    request_t r;
    read_request(w, in, op, &r);
    size_t n_full = r.q.n_tokens / w->bs, found;
    uint32_t present[MAXT];
    CHECK(kvc_prefix_probe(w->pc, &r.q, n_full, present, &found) == 0, "probe");
    size_t seen = 0;
    bool gap = false;
    for (size_t i = 0; i < n_full; i++) {
        if (present[i] == KVC_NONE) {
            gap = true;
            continue;
        }
        CHECK(r.sliding || !gap, "probe: a full-attention block found after a miss");
        check_hit(&w->oracle, present[i], &r.q, r.ns, i, w->bs, "probe");
        seen++;
    }
    CHECK(seen == found, "probe: count");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3) return 0;
    input_t in = {data, size, 0};
    static world_t w;
    memset(&w, 0, sizeof w);
    uint8_t cfg = next(&in), b1 = next(&in), b2 = next(&in);
    w.bs = 1u << (cfg & 3);
    w.n_blocks = 4 + b1 % 32;
    w.policy = (kvc_eviction_t)((cfg >> 3) & 3);
    w.max_extra = KVC_MIN((uint32_t)(cfg >> 5), 4);
    uint32_t window = (b2 & 3) ? (b2 & 3) * w.bs + ((b2 >> 2) & 1) : 0, bits = b2 >> 5;
    w.sliding_group = window > 0;
    kvc_pool_params_t pp = kvc_pool_params_default();
    pp.n_blocks = w.n_blocks;
    pp.block_size = w.bs;
    if (kvc_pool_create(&pp, &w.pool)) abort();
    kvc_prefix_params_t cp = kvc_prefix_params_default();
    cp.hash_seed = 42;
    cp.max_extra_keys = w.max_extra;
    cp.eviction = w.policy;
    cp.group_window[1] = window;
    cp.on_event = on_event;
    cp.event_ctx = &w.oracle;
    if (kvc_prefix_create(w.pool, &cp, &w.pc)) abort();
    if ((cfg & 4) && kvc_testing_prefix_set_hash(w.pc, weak_hash)) abort();
    if (bits && kvc_testing_prefix_set_hash_bits(w.pc, bits)) abort();
    w.ns[1].lora_id = 9;
    w.ns[2].salt[KVC_SALT_BYTES - 1] = 1; /* differs from the default in the digest's last byte */
    w.ns[3].group = 1;

    while (in.at < in.n) {
        uint8_t op = next(&in);
        switch (op % 8) {
        case 0: /* request: lookup, allocate, insert; stays live */
        case 6:
            op_request(&w, &in, op);
            break;
        case 1: /* release a live request, tail first */
            if (w.n_live) {
                int k = next(&in) % w.n_live;
                CHECK(kvc_pool_release(w.pool, w.live[k].t, w.live[k].n) == 0, "release");
                w.live[k] = w.live[--w.n_live];
            }
            break;
        case 2: /* release one block reference at a time, in an input-chosen order */
            if (w.n_live) {
                int k = next(&in) % w.n_live;
                live_t *l = &w.live[k];
                while (l->n) {
                    uint32_t j = next(&in) % l->n;
                    if (l->t[j] != KVC_NONE) CHECK(kvc_pool_unref(w.pool, l->t[j]) == 0, "unref");
                    l->t[j] = l->t[--l->n];
                    check_all(&w);
                }
                w.live[k] = w.live[--w.n_live];
            }
            break;
        case 3: { /* explicit eviction */
            uint32_t want = next(&in) % 8, got;
            CHECK(kvc_prefix_evict(w.pc, want, &got) == 0 && got <= want, "evict");
            break;
        }
        case 4: /* raw allocation, uncached */
            if (w.n_live < MAXLIVE) {
                uint32_t k = 1 + next(&in) % 4;
                if (kvc_pool_alloc(w.pool, k, w.live[w.n_live].t) == 0) w.live[w.n_live++].n = k;
            }
            break;
        case 5:
            op_match(&w, &in, op);
            break;
        case 7:
            op_probe(&w, &in, op);
            break;
        }
        check_all(&w);
    }
    for (int k = 0; k < w.n_live; k++)
        CHECK(kvc_pool_release(w.pool, w.live[k].t, w.live[k].n) == 0, "final release");
    CHECK(kvc_pool_n_free(w.pool) == w.n_blocks, "blocks leaked");
    check_all(&w);
    kvc_prefix_destroy(w.pc);
    kvc_pool_destroy(w.pool);
    return 0;
}
