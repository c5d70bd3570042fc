/* fuzz_prefix.c - libFuzzer target over an encoded sequence of pool and
 * prefix-cache operations.  After every operation the invariant checkers
 * must pass, no cached block may be stranded, and every lookup hit must hold
 * exactly the request's tokens; any violation aborts.
 *
 * Encoding: byte 0 picks the block size (bits 0-1), a weak 2-bit hash (bit 2,
 * so collisions are constant), the namespace mix (bit 3) and a sliding-window
 * group's window (bits 4-7: 0 = none); byte 1 the pool
 * size (4..35 blocks); then operations, one opcode byte each followed by
 * their arguments (missing argument bytes read as 0). */
#include "kvcache/kvcache.h"
#include "kvcache/testing.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXT    32
#define MAXLIVE 8

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

#define CHECK(cond, ...)                                  \
    do {                                                  \
        if (!(cond)) {                                    \
            fprintf(stderr, "fuzz_prefix: " __VA_ARGS__); \
            fputc('\n', stderr);                          \
            abort();                                      \
        }                                                 \
    } while (0)

typedef struct {
    uint32_t t[MAXT];
    uint32_t n;
} live_t;

static void check_all(kvc_prefix_t *pc)
{
    char msg[256];
    CHECK(kvc_prefix_check(pc, msg, sizeof msg) == 0, "%s", msg);
    CHECK(kvc_prefix_count_stranded(pc) == 0, "stranded blocks");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    input_t in = {data, size, 0};
    uint8_t cfg = next(&in);
    uint32_t bs = 1u << (cfg & 3), n_blocks = 4 + next(&in) % 32;
    kvc_pool_params_t pp = kvc_pool_params_default();
    pp.n_blocks = n_blocks;
    pp.block_size = bs;
    kvc_pool_t *pool;
    if (kvc_pool_create(&pp, &pool)) abort();
    kvc_prefix_params_t cp = kvc_prefix_params_default();
    cp.hash_seed = 42;
    uint32_t window = (cfg >> 4) * 3; /* namespace 2 is group 1, sliding when window > 0 */
    cp.group_window[1] = window;
    kvc_prefix_t *pc;
    if (kvc_prefix_create(pool, &cp, &pc)) abort();
    if ((cfg & 4) && kvc_testing_prefix_set_hash(pc, weak_hash)) abort();
    kvc_namespace_t ns[3] = {{0}, {.lora_id = 9}, {.group = 1}};
    live_t live[MAXLIVE];
    int n_live = 0;

    while (in.at < in.n) {
        uint8_t op = next(&in);
        switch (op % 6) {
        case 0:   /* request: lookup, allocate, insert; stays live */
        case 5: { /* match only */
            kvc_token_t t[MAXT];
            size_t n = 1 + next(&in) % MAXT;
            for (size_t i = 0; i < n; i++) t[i] = next(&in) % 4;
            int nsi = (cfg & 8) ? (op >> 3) % 3 : 0;
            bool sliding = nsi == 2 && window;
            kvc_prefix_query_t q = {.ns = &ns[nsi], .tokens = t, .n_tokens = n};
            size_t n_all = (n + bs - 1) / bs, n_full = n / bs;
            uint32_t tb[MAXT];
            kvc_prefix_hit_t hit;
            if (op % 6 == 5) {
                kvc_block_status_t st[MAXT];
                CHECK(kvc_prefix_match(pc, &q, tb, MAXT, st, &hit) == 0, "match");
                CHECK(hit.n_hit_blocks * bs < n, "hit covers the last token");
                break;
            }
            if (n_live == MAXLIVE) break;
            CHECK(kvc_prefix_lookup(pc, &q, tb, MAXT, &hit) == 0, "lookup");
            CHECK(hit.n_hit_tokens < n, "hit covers the last token");
            for (size_t i = 0; i < hit.n_hit_blocks; i++) {
                if (i < hit.first_hit_block) {
                    CHECK(tb[i] == KVC_NONE, "out-of-window block held");
                    continue;
                }
                const kvc_token_t *bt = kvc_prefix_block_tokens(pc, tb[i]);
                CHECK(bt && memcmp(bt, t + i * bs, bs * sizeof *t) == 0, "hit with foreign tokens");
                if (!sliding)
                    CHECK(kvc_prefix_block_parent(pc, tb[i]) == (i ? tb[i - 1] : KVC_NONE),
                          "hit with foreign parent");
            }
            if (kvc_pool_alloc(pool, (uint32_t)(n_all - hit.n_hit_blocks), tb + hit.n_hit_blocks)) {
                CHECK(kvc_pool_release(pool, tb, (uint32_t)hit.n_hit_blocks) == 0, "release hits");
                break;
            }
            uint32_t parent = hit.n_hit_blocks ? tb[hit.n_hit_blocks - 1] : KVC_NONE;
            for (size_t i = hit.n_hit_blocks; i < n_full; i++) {
                uint32_t canon;
                CHECK(kvc_prefix_insert(pc, &q, i, sliding ? KVC_NONE : parent, tb[i], &canon) == 0,
                      "insert");
                if (canon != tb[i]) {
                    CHECK(kvc_pool_ref(pool, canon) == 0 && kvc_pool_unref(pool, tb[i]) == 0,
                          "swap");
                    tb[i] = canon;
                }
                parent = tb[i];
            }
            memcpy(live[n_live].t, tb, n_all * sizeof *tb);
            live[n_live++].n = (uint32_t)n_all;
            break;
        }
        case 1: /* release a live request, tail first */
            if (n_live) {
                int k = next(&in) % n_live;
                CHECK(kvc_pool_release(pool, live[k].t, live[k].n) == 0, "release");
                live[k] = live[--n_live];
            }
            break;
        case 2: /* release one block reference at a time, in an input-chosen order */
            if (n_live) {
                int k = next(&in) % n_live;
                live_t *l = &live[k];
                while (l->n) {
                    uint32_t j = next(&in) % l->n;
                    if (l->t[j] != KVC_NONE) CHECK(kvc_pool_unref(pool, l->t[j]) == 0, "unref");
                    l->t[j] = l->t[--l->n];
                    check_all(pc);
                }
                live[k] = live[--n_live];
            }
            break;
        case 3: { /* explicit eviction */
            uint32_t want = next(&in) % 8, got;
            CHECK(kvc_prefix_evict(pc, want, &got) == 0 && got <= want, "evict");
            break;
        }
        case 4: /* raw allocation, uncached */
            if (n_live < MAXLIVE) {
                uint32_t k = 1 + next(&in) % 4;
                if (kvc_pool_alloc(pool, k, live[n_live].t) == 0) live[n_live++].n = k;
            }
            break;
        }
        check_all(pc);
    }
    for (int k = 0; k < n_live; k++)
        CHECK(kvc_pool_release(pool, live[k].t, live[k].n) == 0, "final release");
    CHECK(kvc_pool_n_free(pool) == n_blocks, "blocks leaked");
    check_all(pc);
    kvc_prefix_destroy(pc);
    kvc_pool_destroy(pool);
    return 0;
}
