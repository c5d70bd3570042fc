/* test_tier.c - the tier layer: each backend's put/get/contains/delete, LRU order,
 * checksums and identity (flipped bytes, truncated records, same hash with other tokens or
 * namespace), the disk store's restart and file-size faults, the write budget on a virtual
 * clock, each admission policy, Redis against a real redis-server started here (pipelined
 * batches, TTL, prefixes, a server killed and restarted), a randomized model-based test per
 * backend against a reference map, the command-line forms, and the fetch-or-recompute
 * arithmetic. */
#include "test_helpers.h"
#include "test_redis.h"
#include "tier/tier_int.h"

#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvcache/tier.h"

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t, for prime_stack */
#include <xxhash.h>

#define BT 4  /* tokens per block */
#define BB 64 /* payload bytes per block */

/* ---- helpers ------------------------------------------------------------------------ */
static uint64_t fake_now;
static uint64_t fake_clock(void *ctx)
{
    (void)ctx;
    return fake_now;
}

typedef struct {
    kvc_tier_key_t key;
    kvc_token_t tokens[BT];
    kvc_namespace_t ns;
} tkey_t;

/* Key number i: its hash, tokens, parent and fingerprint all follow from i. */
static void mk(tkey_t *k, uint64_t i)
{
    memset(k, 0, sizeof *k);
    for (int t = 0; t < BT; t++) k->tokens[t] = (kvc_token_t)(i * 31 + (uint64_t)t);
    k->key.hash = (kvc_hash128_t){i * 0x9e3779b97f4a7c15ull + 1, i};
    k->key.parent_hash = (kvc_hash128_t){i, i + 1};
    k->key.fingerprint = (kvc_hash128_t){~i, i * 3};
    k->key.ns = &k->ns;
    k->key.tokens = k->tokens;
    k->key.n_tokens = BT;
    k->key.depth = (uint32_t)(i % 8);
}

static void payload(unsigned char *p, uint64_t i)
{
    for (int b = 0; b < BB; b++) p[b] = (unsigned char)(i * 7 + (uint64_t)b);
}

static kvc_tier_params_t params(uint32_t n_records)
{
    kvc_tier_params_t p = kvc_tier_params_default();
    p.block_bytes = BB;
    p.block_tokens = BT;
    /* disk slots are rounded to 64 bytes: size for that so both hold n_records */
    size_t rec = kvc_tier_record_bytes(BB, BT);
    p.capacity_bytes = (uint64_t)n_records * ((rec + 63) / 64 * 64);
    p.clock_ns = fake_clock;
    return p;
}

#define assert_store_ok(s)                                                            \
    do {                                                                              \
        char msg_[256];                                                               \
        if (kvc_tier_check((s), msg_, sizeof msg_)) fail_msg("tier check: %s", msg_); \
    } while (0)

static kvc_tier_put_status_t put_i(kvc_tier_store_t *s, uint64_t i)
{
    tkey_t k;
    mk(&k, i);
    unsigned char d[BB];
    payload(d, i);
    kvc_tier_put_status_t st = KVC_TIER_PUT_FAULT;
    assert_ok(kvc_tier_put(s, &k.key, d, &st));
    assert_store_ok(s);
    return st;
}

/* 0 if key i is there with its own bytes, KVC_ENOENT if it misses. */
static int get_i(kvc_tier_store_t *s, uint64_t i)
{
    tkey_t k;
    mk(&k, i);
    unsigned char d[BB], want[BB];
    payload(want, i);
    int rc = kvc_tier_get(s, &k.key, d);
    if (rc == 0)
        assert_memory_equal(d, want, BB);
    else
        assert_int_equal(rc, KVC_ENOENT);
    assert_store_ok(s);
    return rc;
}

static kvc_tier_stats_t stats(kvc_tier_store_t *s)
{
    kvc_tier_stats_t st;
    kvc_tier_stats(s, &st);
    return st;
}

/* A scratch path inside the build tree (tests write nothing outside it). */
static void scratch_path(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "tier-scratch-%d-%s.bin", (int)getpid(), name);
    unlink(buf);
}

/* ---- the common behaviour, run against host and disk -------------------------------- */
typedef kvc_tier_store_t *(*make_fn)(uint32_t n_records, kvc_tier_params_t *p);

static char disk_path[256];

static kvc_tier_store_t *make_host(uint32_t n, kvc_tier_params_t *p)
{
    kvc_tier_params_t q = p ? *p : params(n);
    q.capacity_bytes = (uint64_t)n * kvc_tier_record_bytes(BB, BT); /* no rounding in memory */
    kvc_tier_store_t *s = NULL;
    assert_ok(kvc_tier_host_create(&q, &s));
    assert_int_equal(stats(s).capacity_records, n);
    return s;
}

static kvc_tier_store_t *make_disk(uint32_t n, kvc_tier_params_t *p)
{
    kvc_tier_params_t q = p ? *p : params(n);
    if (p) q.capacity_bytes = params(n).capacity_bytes;
    scratch_path(disk_path, sizeof disk_path, "store");
    kvc_tier_store_t *s = NULL;
    assert_ok(kvc_tier_disk_create(disk_path, &q, &s));
    assert_int_equal(stats(s).capacity_records, n);
    return s;
}

static void done(kvc_tier_store_t *s)
{
    kvc_tier_destroy(s);
    if (disk_path[0]) unlink(disk_path);
    disk_path[0] = '\0';
}

static void basic_ops(make_fn make)
{
    kvc_tier_store_t *s = make(8, NULL);
    tkey_t k;
    mk(&k, 1);
    assert_int_equal(kvc_tier_contains(s, &k.key), 0);
    assert_int_equal(get_i(s, 1), KVC_ENOENT);
    assert_int_equal(put_i(s, 1), KVC_TIER_PUT_STORED);
    assert_int_equal(put_i(s, 2), KVC_TIER_PUT_STORED);
    assert_int_equal(kvc_tier_contains(s, &k.key), 1);
    assert_int_equal(get_i(s, 1), 0);
    assert_int_equal(get_i(s, 2), 0);
    /* host and disk keep an index and do not rewrite what they hold; redis rewrites (a SET
     * that refreshes the TTL) and keeps no count of its keys */
    bool indexed = strcmp(kvc_tier_name(s), "redis") != 0;
    assert_int_equal(put_i(s, 1), indexed ? KVC_TIER_PUT_PRESENT : KVC_TIER_PUT_STORED);
    assert_int_equal(kvc_tier_delete(s, &k.key), 0);
    assert_int_equal(kvc_tier_delete(s, &k.key), KVC_ENOENT);
    assert_int_equal(kvc_tier_contains(s, &k.key), 0);
    assert_int_equal(get_i(s, 1), KVC_ENOENT);
    kvc_tier_stats_t st = stats(s);
    assert_int_equal(st.n_hits, 2);
    assert_int_equal(st.n_misses, 2);
    assert_int_equal(st.n_puts, indexed ? 2 : 3);
    assert_int_equal(st.n_put_present, indexed ? 1 : 0);
    assert_int_equal(st.n_deletes, 1);
    assert_int_equal(st.n_records, indexed ? 1 : 0);
    assert_int_equal(st.bytes_written, (indexed ? 2 : 3) * kvc_tier_record_bytes(BB, BT));
    assert_int_equal(st.bytes_read, 2 * kvc_tier_record_bytes(BB, BT));
    uint64_t sum = 0;
    for (int b = 0; b < KVC_TIER_LAT_BUCKETS; b++) sum += st.latency_counts[b];
    assert_int_equal(sum, 4); /* every get, hit or miss, is in the histogram */
    /* Caller errors. */
    unsigned char d[BB];
    assert_int_equal(kvc_tier_put(s, NULL, d, NULL), KVC_EINVAL);
    assert_int_equal(kvc_tier_put(s, &k.key, NULL, NULL), KVC_EINVAL);
    k.key.n_tokens = BT - 1;
    assert_int_equal(kvc_tier_put(s, &k.key, d, NULL), KVC_EINVAL);
    assert_int_equal(kvc_tier_get(s, &k.key, d), KVC_EINVAL);
    k.key.n_tokens = BT;
    k.ns.group = KVC_MAX_GROUPS;
    assert_int_equal(kvc_tier_contains(s, &k.key), KVC_EINVAL);
    assert_int_equal(stats(s).n_puts, indexed ? 2 : 3); /* nothing changed */
    done(s);
}

static void host_put_get_contains_delete(void **state)
{
    (void)state;
    basic_ops(make_host);
}
static void disk_put_get_contains_delete(void **state)
{
    (void)state;
    basic_ops(make_disk);
}

static void lru_order(make_fn make)
{
    kvc_tier_store_t *s = make(3, NULL);
    put_i(s, 1);
    put_i(s, 2);
    put_i(s, 3);
    assert_int_equal(get_i(s, 1), 0);                    /* 1 is now most recent: 2 is LRU */
    assert_int_equal(put_i(s, 2), KVC_TIER_PUT_PRESENT); /* a put refreshes too: 3 is LRU */
    assert_int_equal(put_i(s, 4), KVC_TIER_PUT_STORED);  /* evicts 3 */
    assert_int_equal(get_i(s, 3), KVC_ENOENT);
    assert_int_equal(put_i(s, 5), KVC_TIER_PUT_STORED); /* evicts 1 (2 was refreshed after) */
    assert_int_equal(get_i(s, 1), KVC_ENOENT);
    assert_int_equal(get_i(s, 2), 0);
    assert_int_equal(get_i(s, 4), 0);
    assert_int_equal(get_i(s, 5), 0);
    assert_int_equal(stats(s).n_evictions, 2);
    done(s);
}

static void host_evicts_least_recently_used(void **state)
{
    (void)state;
    lru_order(make_host);
}
static void disk_evicts_least_recently_used(void **state)
{
    (void)state;
    lru_order(make_disk);
}

static void identity(make_fn make)
{
    kvc_tier_store_t *s = make(8, NULL);
    put_i(s, 1);
    unsigned char d[BB];
    tkey_t k;
    /* Another namespace: another block, however equal the hash. */
    mk(&k, 1);
    k.ns.lora_id = 5;
    assert_int_equal(kvc_tier_contains(s, &k.key), 0);
    assert_int_equal(kvc_tier_get(s, &k.key, d), KVC_ENOENT);
    mk(&k, 1);
    k.ns.salt[17] = 1;
    assert_int_equal(kvc_tier_get(s, &k.key, d), KVC_ENOENT);
    assert_int_equal(stats(s).n_mismatch, 0); /* not even a candidate */
    /* Same hash and namespace, other tokens (a forced collision): a miss, the record
     * dropped, counted. */
    mk(&k, 1);
    k.tokens[2] ^= 1;
    assert_int_equal(kvc_tier_get(s, &k.key, d), KVC_ENOENT);
    assert_int_equal(stats(s).n_mismatch, 1);
    assert_int_equal(get_i(s, 1), KVC_ENOENT); /* dropped */
    /* Other parent, other fingerprint: the same. */
    put_i(s, 2);
    mk(&k, 2);
    k.key.parent_hash.lo ^= 1;
    assert_int_equal(kvc_tier_get(s, &k.key, d), KVC_ENOENT);
    put_i(s, 3);
    mk(&k, 3);
    k.key.fingerprint.hi ^= 1;
    assert_int_equal(kvc_tier_get(s, &k.key, d), KVC_ENOENT);
    assert_int_equal(stats(s).n_mismatch, 3);
    assert_int_equal(stats(s).n_corrupt, 0);
    assert_int_equal(stats(s).n_records, 0);
    done(s);
}

static void host_identity_mismatch_is_a_miss(void **state)
{
    (void)state;
    identity(make_host);
}
static void disk_identity_mismatch_is_a_miss(void **state)
{
    (void)state;
    identity(make_disk);
}

/* Flip one byte of each region of a host record: header, tokens, payload, checksum. */
static void host_flipped_bytes_are_a_counted_miss(void **state)
{
    (void)state;
    kvc_tier_store_t *s = make_host(8, NULL);
    size_t rec = kvc_tier_record_bytes(BB, BT);
    size_t at[] = {0,
                   12,
                   offsetof(kvc__tier_hdr_t, seq),
                   offsetof(kvc__tier_hdr_t, checksum),
                   sizeof(kvc__tier_hdr_t) + 1,
                   kvc__tier_payload_offset(BT),
                   rec - 1};
    for (size_t i = 0; i < KVC_ARRAY_LEN(at); i++) {
        put_i(s, 10 + i);
        tkey_t k;
        mk(&k, 10 + i);
        unsigned char *r = kvc__tier_host_record(s, &k.key);
        assert_non_null(r);
        r[at[i]] ^= 0x10;
        assert_int_equal(get_i(s, 10 + i), KVC_ENOENT);
        assert_int_equal(stats(s).n_corrupt, i + 1);
        assert_int_equal(kvc_tier_contains(s, &k.key), 0); /* dropped */
    }
    assert_int_equal(stats(s).n_records, 0);
    done(s);
}

static void flip_file_byte(const char *path, long long off)
{
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    unsigned char c;
    assert_int_equal(pread(fd, &c, 1, off), 1);
    c ^= 0x01;
    assert_int_equal(pwrite(fd, &c, 1, off), 1);
    close(fd);
}

static void disk_flipped_or_truncated_records_are_counted_misses(void **state)
{
    (void)state;
    kvc_tier_params_t p = params(8);
    kvc_tier_store_t *s = make_disk(8, &p);
    for (uint64_t i = 1; i <= 4; i++) put_i(s, i);
    tkey_t k;
    /* A payload byte: caught by the record checksum at get. */
    mk(&k, 1);
    long long off1 = kvc__tier_disk_offset(s, &k.key);
    assert_true(off1 > 0);
    flip_file_byte(disk_path, off1 + (long long)kvc__tier_payload_offset(BT) + 5);
    assert_int_equal(get_i(s, 1), KVC_ENOENT);
    assert_int_equal(stats(s).n_corrupt, 1);
    assert_int_equal(kvc_tier_contains(s, &k.key), 0);
    /* A header byte of record 2, then a restart: skipped by the scan, counted. */
    mk(&k, 2);
    long long off2 = kvc__tier_disk_offset(s, &k.key);
    flip_file_byte(disk_path, off2 + 20);
    mk(&k, 4);
    long long off4 = kvc__tier_disk_offset(s, &k.key);
    kvc_tier_destroy(s);
    /* Truncate the file in the middle of record 4's payload (its header, 152 bytes, and
     * tokens, 16, stay whole). */
    struct stat sb;
    assert_int_equal(stat(disk_path, &sb), 0);
    assert_int_equal(truncate(disk_path, off4 + 200), 0);
    s = NULL;
    assert_ok(kvc_tier_disk_create(disk_path, &p, &s));
    assert_store_ok(s);
    kvc_tier_stats_t st = stats(s);
    assert_int_equal(st.n_corrupt, 1); /* record 2's header */
    assert_int_equal(st.n_records, 2); /* 3, and 4's intact header */
    assert_int_equal(get_i(s, 2), KVC_ENOENT);
    assert_int_equal(get_i(s, 3), 0);          /* survived the restart */
    assert_int_equal(get_i(s, 4), KVC_ENOENT); /* its tail was cut */
    assert_int_equal(stats(s).n_corrupt, 2);
    /* The file was grown back to its size, and the slots work again. */
    assert_int_equal(stat(disk_path, &sb), 0);
    assert_true(sb.st_size > off4 + 200);
    assert_int_equal(put_i(s, 4), KVC_TIER_PUT_STORED);
    assert_int_equal(get_i(s, 4), 0);
    done(s);
}

static void disk_restart_reuses_records_in_lru_order(void **state)
{
    (void)state;
    kvc_tier_params_t p = params(4);
    kvc_tier_store_t *s = make_disk(4, &p);
    for (uint64_t i = 1; i <= 4; i++) put_i(s, i);
    tkey_t k;
    mk(&k, 2);
    assert_int_equal(kvc_tier_delete(s, &k.key), 0);
    kvc_tier_destroy(s);
    s = NULL;
    assert_ok(kvc_tier_disk_create(disk_path, &p, &s));
    assert_store_ok(s);
    assert_int_equal(stats(s).n_records, 3); /* the deleted one stays deleted */
    assert_int_equal(get_i(s, 2), KVC_ENOENT);
    /* Write order is the LRU after a restart: 1 is the oldest. */
    put_i(s, 5); /* fills the free slot */
    put_i(s, 6); /* evicts 1 */
    assert_int_equal(get_i(s, 1), KVC_ENOENT);
    assert_int_equal(get_i(s, 3), 0);
    assert_int_equal(get_i(s, 4), 0);
    kvc_tier_destroy(s);
    /* A file made with other sizes is refused, never overwritten. */
    kvc_tier_params_t q = p;
    q.block_bytes = BB * 2;
    s = NULL;
    assert_int_equal(kvc_tier_disk_create(disk_path, &q, &s), KVC_EEXIST);
    q = p;
    q.capacity_bytes *= 2;
    assert_int_equal(kvc_tier_disk_create(disk_path, &q, &s), KVC_EEXIST);
    assert_null(s);
    assert_ok(kvc_tier_disk_create(disk_path, &p, &s));
    assert_int_equal(stats(s).n_records, 4);
    done(s);
}

/* RLIMIT_FSIZE in a child: writes past the limit fail with EFBIG (SIGXFSZ ignored), each
 * one a counted fault; what was written whole stays readable and the index consistent. */
static void disk_write_errors_are_counted_faults(void **state)
{
    (void)state;
    kvc_tier_params_t p = params(8);
    kvc_tier_store_t *s = make_disk(8, &p);
    kvc_tier_destroy(s); /* the file exists, preallocated, empty */
    size_t slot = (kvc_tier_record_bytes(BB, BT) + 63) / 64 * 64;
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {4096 + 3 * slot, 4096 + 3 * slot};
        if (setrlimit(RLIMIT_FSIZE, &rl)) _exit(10);
        kvc_tier_store_t *c = NULL;
        if (kvc_tier_disk_create(disk_path, &p, &c)) _exit(11);
        int n_stored = 0, n_fault = 0;
        for (uint64_t i = 0; i < 8; i++) {
            tkey_t k;
            mk(&k, i);
            unsigned char d[BB];
            payload(d, i);
            kvc_tier_put_status_t st;
            if (kvc_tier_put(c, &k.key, d, &st)) _exit(12);
            n_stored += st == KVC_TIER_PUT_STORED;
            n_fault += st == KVC_TIER_PUT_FAULT;
            if (kvc_tier_check(c, NULL, 0)) _exit(13);
        }
        kvc_tier_stats_t st;
        kvc_tier_stats(c, &st);
        if (n_stored != 3 || n_fault != 5 || st.n_faults != 5 || st.n_records != 3) _exit(14);
        for (uint64_t i = 0; i < 8; i++) {
            tkey_t k;
            mk(&k, i);
            unsigned char d[BB];
            int rc = kvc_tier_get(c, &k.key, d);
            if ((i < 3) != (rc == 0)) _exit(15);
        }
        kvc_tier_destroy(c);
        _exit(0);
    }
    int ws = 0;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    assert_true(WIFEXITED(ws));
    assert_int_equal(WEXITSTATUS(ws), 0);
    /* A store that cannot even be preallocated is an error at create, not a crash. */
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {4096, 4096};
        if (setrlimit(RLIMIT_FSIZE, &rl)) _exit(10);
        char other[256];
        snprintf(other, sizeof other, "%s.big", disk_path);
        kvc_tier_store_t *c = NULL;
        int rc = kvc_tier_disk_create(other, &p, &c);
        unlink(other);
        _exit(rc == KVC_EIO && c == NULL ? 0 : 20);
    }
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    assert_true(WIFEXITED(ws));
    assert_int_equal(WEXITSTATUS(ws), 0);
    done(NULL);
}

/* Fill the stack below the caller's frame so that any XXH3_state_t placed there (64-byte
 * aligned) reads seed = tier.c's record seed (0x72656364) and extSecret = NULL with garbage
 * in its secret: what a previous call's frame can leave, and the one case in which
 * libxxhash 0.8.1's XXH3_64bits_reset_withSeed keeps the garbage as its secret. */
static __attribute__((noinline)) void prime_stack(void)
{
    _Alignas(64) volatile uint64_t buf[16384];
    size_t seed_w = (offsetof(XXH3_state_t, seed) % 64) / 8;
    size_t ext_w = (offsetof(XXH3_state_t, extSecret) % 64) / 8;
    for (size_t i = 0; i < KVC_ARRAY_LEN(buf); i++)
        buf[i] = i % 8 == seed_w ? 0x72656364u : i % 8 == ext_w ? 0 : 0x5a5a5a5a5a5a5a5aull;
}

/* Blocks of the bench models' size (128 KiB) round-trip with no checksum failure: a record
 * checksum that depended on stack garbage (libxxhash 0.8.1's seeded reset reads the state's
 * old seed and, if equal, keeps its old secret) failed some of these at random in the bench;
 * prime_stack makes the garbage the worst case. */
static void large_blocks_round_trip(void **state)
{
    (void)state;
    enum { LB = 128 << 10, N = 64 };
    kvc_tier_params_t p = kvc_tier_params_default();
    p.block_bytes = LB;
    p.block_tokens = BT;
    p.capacity_bytes = (uint64_t)kvc_tier_record_bytes(LB, BT) * N;
    unsigned char *d = malloc(LB), *o = malloc(LB);
    assert_non_null(d);
    assert_non_null(o);
    for (int kind = 0; kind < 2; kind++) {
        kvc_tier_store_t *s = NULL;
        if (kind == 0)
            assert_ok(kvc_tier_host_create(&p, &s));
        else {
            scratch_path(disk_path, sizeof disk_path, "large");
            kvc_tier_params_t q = p;
            q.capacity_bytes = (uint64_t)(kvc_tier_record_bytes(LB, BT) + 64) * N;
            assert_ok(kvc_tier_disk_create(disk_path, &q, &s));
        }
        for (int round = 0; round < 3; round++) {
            for (uint64_t i = 0; i < N; i++) {
                tkey_t k;
                mk(&k, i + (uint64_t)round * N);
                memset(d, (int)(i + 1), LB);
                kvc_tier_put_status_t st;
                assert_ok(kvc_tier_put(s, &k.key, d, &st));
                assert_int_equal(st, KVC_TIER_PUT_STORED);
            }
            for (uint64_t i = 0; i < N; i++) {
                tkey_t k;
                mk(&k, i + (uint64_t)round * N);
                prime_stack();
                assert_ok(kvc_tier_get(s, &k.key, o));
                assert_int_equal(o[LB - 1], (unsigned char)(i + 1));
            }
        }
        assert_int_equal(stats(s).n_corrupt, 0);
        done(s);
    }
    free(d);
    free(o);
}

/* ---- budget and admission (host and disk share the gate) ------------------------------- */
static void budget(make_fn make)
{
    size_t rec = kvc_tier_record_bytes(BB, BT);
    kvc_tier_params_t p = params(64);
    p.write_budget_per_day = 86400ull * rec; /* one record a second */
    p.write_budget_burst = 2 * rec;
    fake_now = 1000000000ull;
    kvc_tier_store_t *s = make(64, &p);
    assert_int_equal(put_i(s, 1), KVC_TIER_PUT_STORED);
    assert_int_equal(put_i(s, 2), KVC_TIER_PUT_STORED);
    assert_int_equal(put_i(s, 3), KVC_TIER_PUT_OVER_BUDGET); /* the burst is spent */
    assert_int_equal(get_i(s, 3), KVC_ENOENT);
    assert_int_equal(put_i(s, 1), KVC_TIER_PUT_PRESENT); /* no write, no charge */
    fake_now += 999999999ull;                            /* not quite one record's worth */
    assert_int_equal(put_i(s, 3), KVC_TIER_PUT_OVER_BUDGET);
    fake_now += 1;
    assert_int_equal(put_i(s, 3), KVC_TIER_PUT_STORED);
    fake_now += 3600ull * 1000000000ull; /* an hour idle refills the burst only */
    assert_int_equal(put_i(s, 4), KVC_TIER_PUT_STORED);
    assert_int_equal(put_i(s, 5), KVC_TIER_PUT_STORED);
    assert_int_equal(put_i(s, 6), KVC_TIER_PUT_OVER_BUDGET);
    kvc_tier_stats_t st = stats(s);
    assert_int_equal(st.n_budget_refused, 3);
    assert_int_equal(st.n_puts, 5);
    assert_int_equal(st.bytes_written, 5 * rec);
    done(s);
    /* Over a simulated day at ten puts a second, what is written stays within the budget
     * plus the burst. */
    p.write_budget_per_day = 1000ull * rec;
    p.write_budget_burst = 0; /* one hour's: 41.7 records */
    fake_now = 0;
    s = make(64, &p);
    for (uint64_t t = 0; t < 86400ull * 10; t += 7) {
        fake_now = t * 100000000ull;
        put_i(s, 1000 + t);
    }
    st = stats(s);
    assert_true(st.bytes_written <= 1000 * rec + 1000 * rec / 24 + rec);
    assert_true(st.bytes_written >= 990 * rec);
    done(s);
}

static void host_write_budget_is_enforced(void **state)
{
    (void)state;
    budget(make_host);
}
static void disk_write_budget_is_enforced(void **state)
{
    (void)state;
    budget(make_disk);
}

static void admission(make_fn make)
{
    kvc_tier_params_t p = params(16);
    assert_ok(kvc_tier_admission_parse("second-hit", &p.admission));
    p.ghost_entries = 2;
    kvc_tier_store_t *s = make(16, &p);
    assert_int_equal(put_i(s, 1), KVC_TIER_PUT_NOT_ADMITTED); /* first sighting */
    assert_int_equal(put_i(s, 1), KVC_TIER_PUT_STORED);       /* second */
    assert_int_equal(get_i(s, 2), KVC_ENOENT);                /* a miss is a sighting */
    assert_int_equal(put_i(s, 2), KVC_TIER_PUT_STORED);
    /* The ghost set is bounded: a third identity pushes out the oldest. */
    assert_int_equal(put_i(s, 3), KVC_TIER_PUT_NOT_ADMITTED);
    assert_int_equal(put_i(s, 4), KVC_TIER_PUT_NOT_ADMITTED);
    assert_int_equal(put_i(s, 5), KVC_TIER_PUT_NOT_ADMITTED); /* forgets 3 */
    assert_int_equal(put_i(s, 3), KVC_TIER_PUT_NOT_ADMITTED);
    assert_int_equal(put_i(s, 5), KVC_TIER_PUT_STORED);
    assert_int_equal(stats(s).n_admission_refused, 5);
    done(s);

    p = params(16);
    assert_ok(kvc_tier_admission_parse("depth:3", &p.admission));
    s = make(16, &p);
    for (uint64_t i = 0; i < 8; i++) /* mk gives depth i % 8 */
        assert_int_equal(put_i(s, i), i >= 3 ? KVC_TIER_PUT_STORED : KVC_TIER_PUT_NOT_ADMITTED);
    assert_int_equal(stats(s).n_admission_refused, 3);
    done(s);

    p = params(16);
    assert_ok(kvc_tier_admission_parse("always", &p.admission));
    s = make(16, &p);
    assert_int_equal(put_i(s, 0), KVC_TIER_PUT_STORED);
    done(s);
}

static void host_admission_policies(void **state)
{
    (void)state;
    admission(make_host);
}
static void disk_admission_policies(void **state)
{
    (void)state;
    admission(make_disk);
}

/* ---- a randomized model-based test per local backend ---------------------------------- */
#define MB_KEYS 40
#define MB_CAP  12

typedef struct {
    bool present;
    uint64_t last_use;  /* for the reference LRU */
    uint64_t write_seq; /* when its record was written: the disk store's LRU after a restart */
} ref_t;

/* restarts: the disk store is closed and reopened now and then (its index rebuilt from the
 * file, most recently written first). */
static void model_based(make_fn make, uint64_t seed, int n_ops, bool restarts)
{
    kvc_tier_store_t *s = make(MB_CAP, NULL);
    ref_t ref[MB_KEYS];
    memset(ref, 0, sizeof ref);
    kvc_rng_t rng;
    kvc_rng_seed(&rng, seed);
    uint64_t clock = 1;
    for (int op = 0; op < n_ops; op++) {
        uint64_t i = kvc_rng_below(&rng, MB_KEYS);
        uint64_t what = kvc_rng_below(&rng, 10);
        if (restarts && kvc_rng_below(&rng, 40) == 0) {
            kvc_tier_destroy(s);
            kvc_tier_params_t p = params(MB_CAP);
            s = NULL;
            assert_ok(kvc_tier_disk_create(disk_path, &p, &s));
            for (int j = 0; j < MB_KEYS; j++) ref[j].last_use = ref[j].write_seq;
        }
        uint32_t n_ref = 0;
        for (int j = 0; j < MB_KEYS; j++) n_ref += ref[j].present;
        if (what < 4) { /* put */
            kvc_tier_put_status_t st = put_i(s, i);
            if (ref[i].present)
                assert_int_equal(st, KVC_TIER_PUT_PRESENT);
            else {
                assert_int_equal(st, KVC_TIER_PUT_STORED);
                if (n_ref == MB_CAP) { /* the reference evicts its LRU */
                    int v = -1;
                    for (int j = 0; j < MB_KEYS; j++)
                        if (ref[j].present && (v < 0 || ref[j].last_use < ref[v].last_use)) v = j;
                    ref[v].present = false;
                }
                ref[i].present = true;
                ref[i].write_seq = clock;
            }
            ref[i].last_use = clock++;
        } else if (what < 8) { /* get */
            int rc = get_i(s, i);
            assert_int_equal(rc == 0, ref[i].present);
            if (rc == 0) ref[i].last_use = clock++;
        } else if (what < 9) { /* contains */
            tkey_t k;
            mk(&k, i);
            assert_int_equal(kvc_tier_contains(s, &k.key), ref[i].present);
        } else { /* delete */
            tkey_t k;
            mk(&k, i);
            assert_int_equal(kvc_tier_delete(s, &k.key) == 0, ref[i].present);
            ref[i].present = false;
        }
        assert_store_ok(s);
        n_ref = 0;
        for (int j = 0; j < MB_KEYS; j++) n_ref += ref[j].present;
        assert_int_equal(stats(s).n_records, n_ref);
    }
    /* Finally every key agrees. */
    for (uint64_t j = 0; j < MB_KEYS; j++) {
        tkey_t k;
        mk(&k, j);
        assert_int_equal(kvc_tier_contains(s, &k.key), ref[j].present);
    }
    done(s);
}

static void host_matches_a_reference_lru(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 4; seed++)
        model_based(make_host, seed, 4000 / KVC_TEST_SANITIZER_DIVISOR, false);
}
static void disk_matches_a_reference_lru(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 4; seed++)
        model_based(make_disk, seed, 3000 / KVC_TEST_SANITIZER_DIVISOR, seed % 2 == 0);
}

/* A clock that moves 30 us each time it is read: a get reads it twice, so every get takes
 * 30 us and lands in the histogram's (25 us, 50 us] bucket, hit or miss. */
static uint64_t ticking_now;
static uint64_t ticking_clock(void *ctx)
{
    (void)ctx;
    return ticking_now += 30000;
}

static void fetch_latency_histogram_buckets(void **state)
{
    (void)state;
    const uint64_t *b = kvc_tier_latency_bounds_ns();
    for (int i = 1; i < KVC_TIER_LAT_BUCKETS - 1; i++) assert_true(b[i] > b[i - 1]);
    assert_int_equal(b[1], 25000);
    assert_int_equal(b[2], 50000);
    kvc_tier_params_t p = params(4);
    p.clock_ns = ticking_clock;
    kvc_tier_store_t *s = make_host(4, &p);
    put_i(s, 1);
    assert_int_equal(get_i(s, 1), 0);
    assert_int_equal(get_i(s, 2), KVC_ENOENT);
    kvc_tier_stats_t st = stats(s);
    for (int i = 0; i < KVC_TIER_LAT_BUCKETS; i++)
        assert_int_equal(st.latency_counts[i], i == 2 ? 2 : 0);
    assert_int_equal(st.latency_sum_ns, 60000);
    done(s);
}

static void create_rejects_bad_parameters(void **state)
{
    (void)state;
    kvc_tier_store_t *s = NULL;
    kvc_tier_params_t p = params(4);
    assert_int_equal(kvc_tier_host_create(NULL, &s), KVC_EINVAL);
    assert_int_equal(kvc_tier_host_create(&p, NULL), KVC_EINVAL);
    p.block_bytes = 0;
    assert_int_equal(kvc_tier_host_create(&p, &s), KVC_EINVAL);
    p = params(4);
    p.block_tokens = 4097;
    assert_int_equal(kvc_tier_host_create(&p, &s), KVC_EINVAL);
    p = params(4);
    p.capacity_bytes = 10;
    assert_int_equal(kvc_tier_host_create(&p, &s), KVC_EINVAL);
    assert_int_equal(kvc_tier_disk_create("x", &p, &s), KVC_EINVAL);
    p = params(4);
    p.admission.kind = KVC_TIER_ADMIT__COUNT;
    assert_int_equal(kvc_tier_host_create(&p, &s), KVC_EINVAL);
    p = params(4);
    assert_int_equal(kvc_tier_disk_create("", &p, &s), KVC_EINVAL);
    assert_int_equal(kvc_tier_disk_create("no-such-dir/x/y.bin", &p, &s), KVC_EIO);
    assert_int_equal(kvc_tier_redis_create("", 6379, NULL, &p, &s), KVC_EINVAL);
    assert_int_equal(kvc_tier_redis_create("h", 0, NULL, &p, &s), KVC_EINVAL);
    assert_int_equal(kvc_tier_redis_create("h", 1, "a:b", &p, &s), KVC_EINVAL);
    p.model_id = "has space";
    assert_int_equal(kvc_tier_redis_create("h", 1, NULL, &p, &s), KVC_EINVAL);
    assert_null(s);
    kvc_tier_destroy(NULL);
    /* Allocation faults: every failing allocation is a clean KVC_ENOMEM, nothing leaks. */
    for (uint64_t n = 1; n < 20; n++) {
        kvc_failing_alloc_t fa = {.fail_at = n};
        p = params(4);
        p.allocator = kvc_failing_allocator(&fa);
        assert_ok(kvc_tier_admission_parse("second-hit", &p.admission));
        int rc = kvc_tier_host_create(&p, &s);
        if (rc == 0)
            kvc_tier_destroy(s);
        else
            assert_int_equal(rc, KVC_ENOMEM);
        assert_int_equal(fa.n_live, 0);
    }
}

/* ---- redis -------------------------------------------------------------------------------- */
static bool have_redis;

static int redis_group_setup(void **state)
{
    (void)state;
    signal(SIGPIPE, SIG_DFL); /* the store must survive a dead server without help */
    if (!redis_binary_present()) return 0;
    redis_port = free_port();
    have_redis = redis_port > 0 && redis_start();
    return have_redis ? 0 : -1; /* present but not starting: a failure, never a pass */
}

static int redis_group_teardown(void **state)
{
    (void)state;
    redis_stop();
    return 0;
}

#define NEED_REDIS()                                                            \
    do {                                                                        \
        if (!have_redis) {                                                      \
            print_message("redis-server is not installed: redis tests skipped " \
                          "(apt-get install redis-server)\n");                  \
            skip();                                                             \
        }                                                                       \
    } while (0)

static kvc_tier_store_t *make_redis_p(const char *prefix, kvc_tier_params_t *p)
{
    kvc_tier_store_t *s = NULL;
    assert_ok(kvc_tier_redis_create("127.0.0.1", (uint16_t)redis_port, prefix, p, &s));
    return s;
}

static kvc_tier_store_t *make_redis(uint32_t n, kvc_tier_params_t *p)
{
    (void)n;
    kvc_tier_params_t q = p ? *p : params(4);
    if (!q.model_id) q.model_id = "test-model";
    q.timeout_ms = 1000;
    return make_redis_p("t", &q);
}

static void redis_flush(void)
{
    redisContext *c = redis_admin();
    assert_non_null(c);
    redisReply *r = redisCommand(c, "FLUSHALL");
    assert_non_null(r);
    freeReplyObject(r);
    redisFree(c);
}

static void redis_key_of(kvc_tier_store_t *s, uint64_t i, char *out, size_t cap, const char *prefix,
                         const char *model, uint64_t epoch)
{
    (void)s;
    tkey_t k;
    mk(&k, i);
    char h[33], n[33];
    kvc_hash128_hex(k.key.hash, h);
    kvc_hash128_hex(kvc__tier_ns_digest(&k.ns), n);
    snprintf(out, cap, "%s:%s:%llu:%s:%s", prefix, model, (unsigned long long)epoch, h, n);
}

static void redis_put_get_contains_delete(void **state)
{
    (void)state;
    NEED_REDIS();
    redis_flush();
    basic_ops(make_redis);
    redis_flush();
    identity(make_redis);
    redis_flush();
    kvc_tier_params_t p = params(4);
    assert_ok(kvc_tier_admission_parse("second-hit", &p.admission));
    kvc_tier_store_t *s = make_redis(0, &p);
    assert_int_equal(put_i(s, 1), KVC_TIER_PUT_NOT_ADMITTED);
    assert_int_equal(put_i(s, 1), KVC_TIER_PUT_STORED);
    assert_int_equal(get_i(s, 1), 0);
    kvc_tier_destroy(s);
    /* The key has the documented form. */
    redisContext *c = redis_admin();
    char key[256];
    redis_key_of(NULL, 1, key, sizeof key, "t", "test-model", 0);
    redisReply *r = redisCommand(c, "EXISTS %s", key);
    assert_int_equal(r->integer, 1);
    freeReplyObject(r);
    redisFree(c);
}

static void redis_batches_are_pipelined(void **state)
{
    (void)state;
    NEED_REDIS();
    redis_flush();
    kvc_tier_store_t *s = make_redis(0, NULL);
    enum { N = 300 }; /* more than one pipelined chunk */
    static tkey_t keys[N];
    static unsigned char data[N][BB], out[N][BB];
    kvc_tier_key_t kk[N];
    const void *dp[N];
    void *op[N];
    int res[N];
    kvc_tier_put_status_t st[N];
    for (int i = 0; i < N; i++) {
        mk(&keys[i], (uint64_t)i);
        kk[i] = keys[i].key;
        payload(data[i], (uint64_t)i);
        dp[i] = data[i];
        op[i] = out[i];
    }
    /* Only the even ones first: the batch's odd gets miss. */
    for (int i = 0; i < N; i += 2) assert_int_equal(put_i(s, (uint64_t)i), KVC_TIER_PUT_STORED);
    assert_int_equal(kvc_tier_get_many(s, kk, op, N, res), N / 2);
    for (int i = 0; i < N; i++) {
        assert_int_equal(res[i], i % 2 ? KVC_ENOENT : 0);
        if (i % 2 == 0) assert_memory_equal(out[i], data[i], BB);
    }
    assert_ok(kvc_tier_put_many(s, kk, dp, N, st));
    for (int i = 0; i < N; i++) assert_int_equal(st[i], KVC_TIER_PUT_STORED);
    memset(out, 0, sizeof out);
    assert_int_equal(kvc_tier_get_many(s, kk, op, N, res), N);
    for (int i = 0; i < N; i++) assert_memory_equal(out[i], data[i], BB);
    kvc_tier_stats_t t = stats(s);
    assert_int_equal(t.n_hits, N / 2 + N);
    assert_int_equal(t.n_misses, N / 2);
    assert_int_equal(t.n_puts, N / 2 + N);
    assert_int_equal(t.n_faults, 0);
    /* One corrupt value inside a batch: a miss, dropped, the rest hit. */
    redisContext *c = redis_admin();
    char key[256];
    redis_key_of(NULL, 7, key, sizeof key, "t", "test-model", 0);
    redisReply *r = redisCommand(c, "SETRANGE %s %d %b", key, 200, "\x5a", (size_t)1);
    assert_non_null(r);
    freeReplyObject(r);
    assert_int_equal(kvc_tier_get_many(s, kk, op, N, res), N - 1);
    assert_int_equal(res[7], KVC_ENOENT);
    assert_int_equal(stats(s).n_corrupt, 1);
    r = redisCommand(c, "EXISTS %s", key);
    assert_int_equal(r->integer, 0); /* dropped from redis */
    freeReplyObject(r);
    redisFree(c);
    /* Caller errors: nothing is sent. */
    kk[3].n_tokens = 1;
    assert_int_equal(kvc_tier_get_many(s, kk, op, N, res), KVC_EINVAL);
    assert_int_equal(kvc_tier_put_many(s, kk, dp, N, st), KVC_EINVAL);
    kvc_tier_destroy(s);
}

static void redis_corrupt_and_truncated_values_are_misses(void **state)
{
    (void)state;
    NEED_REDIS();
    redis_flush();
    kvc_tier_store_t *s = make_redis(0, NULL);
    redisContext *c = redis_admin();
    char key[256];
    size_t rec = kvc_tier_record_bytes(BB, BT);
    size_t at[] = {0, 30, sizeof(kvc__tier_hdr_t) + 2, rec - 1};
    for (size_t i = 0; i < KVC_ARRAY_LEN(at); i++) {
        put_i(s, 100 + i);
        redis_key_of(NULL, 100 + i, key, sizeof key, "t", "test-model", 0);
        redisReply *g = redisCommand(c, "GETRANGE %s %d %d", key, (int)at[i], (int)at[i]);
        assert_int_equal(g->len, 1);
        char flipped = (char)(g->str[0] ^ 0x04);
        freeReplyObject(g);
        redisReply *r = redisCommand(c, "SETRANGE %s %d %b", key, (int)at[i], &flipped, (size_t)1);
        freeReplyObject(r);
        assert_int_equal(get_i(s, 100 + i), KVC_ENOENT);
        assert_int_equal(stats(s).n_corrupt, i + 1);
    }
    /* Truncated: the first half of a valid value. */
    put_i(s, 200);
    redis_key_of(NULL, 200, key, sizeof key, "t", "test-model", 0);
    redisReply *g = redisCommand(c, "GET %s", key);
    assert_int_equal(g->len, rec);
    redisReply *r = redisCommand(c, "SET %s %b", key, g->str, (size_t)(rec / 2));
    freeReplyObject(r);
    freeReplyObject(g);
    assert_int_equal(get_i(s, 200), KVC_ENOENT);
    assert_int_equal(stats(s).n_corrupt, KVC_ARRAY_LEN(at) + 1);
    r = redisCommand(c, "EXISTS %s", key);
    assert_int_equal(r->integer, 0);
    freeReplyObject(r);
    redisFree(c);
    kvc_tier_destroy(s);
}

/* Another writer (a replica with a bug, or a forged value) stores a well-formed record of
 * another block under this block's key: its checksum is right, its identity is not, so it
 * is a mismatch, dropped, never served. */
static void redis_value_under_the_wrong_key_is_a_mismatch(void **state)
{
    (void)state;
    NEED_REDIS();
    redis_flush();
    kvc_tier_store_t *s = make_redis(0, NULL);
    redisContext *c = redis_admin();
    size_t rec = kvc_tier_record_bytes(BB, BT);
    unsigned char *buf = malloc(rec), d[BB];
    assert_non_null(buf);
    char key[256];
    for (int field = 0; field < 3; field++) {
        tkey_t other;
        mk(&other, 5);
        if (field == 0) other.ns.weight_epoch = 9; /* another namespace */
        if (field == 1) other.ns.salt[0] = 3;
        if (field == 2) other.tokens[0] ^= 8; /* other tokens */
        payload(d, 5);
        kvc__tier_record_encode(buf, &other.key, d, BB, 0);
        redis_key_of(NULL, 5, key, sizeof key, "t", "test-model", 0);
        redisReply *r = redisCommand(c, "SET %s %b", key, buf, rec);
        freeReplyObject(r);
        assert_int_equal(get_i(s, 5), KVC_ENOENT);
        assert_int_equal(stats(s).n_mismatch, (uint64_t)field + 1);
        assert_int_equal(stats(s).n_corrupt, 0);
        r = redisCommand(c, "EXISTS %s", key);
        assert_int_equal(r->integer, 0);
        freeReplyObject(r);
    }
    free(buf);
    redisFree(c);
    kvc_tier_destroy(s);
}

static void redis_ttl_and_prefixes(void **state)
{
    (void)state;
    NEED_REDIS();
    redis_flush();
    kvc_tier_params_t p = params(4);
    p.ttl_s = 600;
    p.model_id = "llama";
    p.weight_epoch = 3;
    kvc_tier_store_t *a = make_redis_p("pa", &p);
    put_i(a, 1);
    redisContext *c = redis_admin();
    char key[256];
    redis_key_of(NULL, 1, key, sizeof key, "pa", "llama", 3);
    redisReply *r = redisCommand(c, "TTL %s", key);
    assert_int_equal(r->type, REDIS_REPLY_INTEGER);
    assert_true(r->integer > 590 && r->integer <= 600);
    freeReplyObject(r);
    /* Another prefix, model or epoch never meets this one. */
    kvc_tier_params_t q = p;
    kvc_tier_store_t *b = make_redis_p("pb", &q);
    q.model_id = "mistral";
    kvc_tier_store_t *m = make_redis_p("pa", &q);
    q = p;
    q.weight_epoch = 4;
    kvc_tier_store_t *e = make_redis_p("pa", &q);
    kvc_tier_store_t *same = make_redis_p("pa", &p);
    assert_int_equal(get_i(b, 1), KVC_ENOENT);
    assert_int_equal(get_i(m, 1), KVC_ENOENT);
    assert_int_equal(get_i(e, 1), KVC_ENOENT);
    assert_int_equal(get_i(same, 1), 0); /* another replica with the same names hits */
    put_i(b, 2);
    assert_int_equal(get_i(a, 2), KVC_ENOENT);
    assert_int_equal(get_i(b, 2), 0);
    /* No TTL: none set. */
    q = p;
    q.ttl_s = 0;
    kvc_tier_store_t *n = make_redis_p("pn", &q);
    put_i(n, 1);
    redis_key_of(NULL, 1, key, sizeof key, "pn", "llama", 3);
    r = redisCommand(c, "TTL %s", key);
    assert_int_equal(r->integer, -1);
    freeReplyObject(r);
    redisFree(c);
    kvc_tier_destroy(a);
    kvc_tier_destroy(b);
    kvc_tier_destroy(m);
    kvc_tier_destroy(e);
    kvc_tier_destroy(same);
    kvc_tier_destroy(n);
}

static void redis_killed_is_a_miss_and_the_store_reconnects(void **state)
{
    (void)state;
    NEED_REDIS();
    redis_flush();
    fake_now = 0;
    kvc_tier_params_t p = params(4);
    p.backoff_ms = 100;
    kvc_tier_store_t *s = make_redis(0, &p);
    put_i(s, 1);
    assert_int_equal(get_i(s, 1), 0);
    redis_stop();
    assert_int_equal(get_i(s, 1), KVC_ENOENT); /* the dead connection: a fault */
    assert_int_equal(stats(s).n_faults, 1);
    assert_int_equal(put_i(s, 2), KVC_TIER_PUT_FAULT); /* backing off: no attempt, a miss */
    tkey_t k;
    mk(&k, 1);
    assert_int_equal(kvc_tier_contains(s, &k.key), 0);
    tkey_t keys[3];
    kvc_tier_key_t kk[3];
    unsigned char o[3][BB];
    void *op[3] = {o[0], o[1], o[2]};
    int res[3];
    for (int i = 0; i < 3; i++) {
        mk(&keys[i], (uint64_t)i);
        kk[i] = keys[i].key;
    }
    assert_int_equal(kvc_tier_get_many(s, kk, op, 3, res), 0);
    uint64_t f = stats(s).n_faults;
    assert_true(f >= 4);
    fake_now += 100000000ull; /* the backoff passed: it tries, and fails (server down) */
    assert_int_equal(get_i(s, 1), KVC_ENOENT);
    assert_int_equal(stats(s).n_faults, f + 1);
    assert_true(redis_start());                        /* an empty server on the same port */
    assert_int_equal(put_i(s, 1), KVC_TIER_PUT_FAULT); /* still backing off (now 200 ms) */
    fake_now += 200000000ull;
    assert_int_equal(put_i(s, 1), KVC_TIER_PUT_STORED); /* reconnected */
    assert_int_equal(get_i(s, 1), 0);
    assert_int_equal(get_i(s, 2), KVC_ENOENT);
    kvc_tier_destroy(s);
    /* A server that was never there: create succeeds, calls miss, faults counted. */
    int port = free_port();
    kvc_tier_store_t *d = NULL;
    p = params(4);
    assert_ok(kvc_tier_redis_create("127.0.0.1", (uint16_t)port, NULL, &p, &d));
    assert_int_equal(get_i(d, 1), KVC_ENOENT);
    assert_true(stats(d).n_faults >= 2);
    kvc_tier_destroy(d);
}

/* A fetch past its deadline is a miss, never a wait: the server is paused (CLIENT PAUSE,
 * as a stalled or overloaded redis would be) longer than the store's 100 ms timeout; the
 * get returns within about that deadline, counts a fault, and the store reconnects after
 * the pause. */
static void redis_fetch_past_its_deadline_is_a_miss(void **state)
{
    (void)state;
    NEED_REDIS();
    redis_flush();
    fake_now = 0;
    kvc_tier_params_t p = params(4);
    p.model_id = "test-model";
    p.timeout_ms = 100;
    p.backoff_ms = 1;
    kvc_tier_store_t *s = make_redis_p("t", &p);
    put_i(s, 1);
    assert_int_equal(get_i(s, 1), 0);
    redisContext *c = redis_admin();
    redisReply *r = redisCommand(c, "CLIENT PAUSE 1500 ALL");
    assert_non_null(r);
    assert_int_equal(r->type, REDIS_REPLY_STATUS);
    freeReplyObject(r);
    uint64_t t0 = kvc_now_ns();
    assert_int_equal(get_i(s, 1), KVC_ENOENT);
    uint64_t took = kvc_now_ns() - t0;
    assert_true(took >= 90000000ull && took < 1000000000ull); /* the deadline, not the pause */
    assert_int_equal(stats(s).n_faults, 1);
    struct timespec ts = {1, 600000000};
    nanosleep(&ts, NULL);   /* the pause is over */
    fake_now += 1000000ull; /* and the backoff */
    assert_int_equal(get_i(s, 1), 0);
    assert_int_equal(stats(s).n_faults, 1);
    redisFree(c);
    kvc_tier_destroy(s);
}

static void redis_matches_a_reference_map(void **state)
{
    (void)state;
    NEED_REDIS();
    redis_flush();
    kvc_tier_store_t *s = make_redis(0, NULL);
    bool ref[MB_KEYS] = {false};
    kvc_rng_t rng;
    kvc_rng_seed(&rng, 99);
    int n_ops = 2000 / KVC_TEST_SANITIZER_DIVISOR;
    for (int op = 0; op < n_ops; op++) {
        uint64_t i = kvc_rng_below(&rng, MB_KEYS);
        uint64_t what = kvc_rng_below(&rng, 10);
        tkey_t k;
        mk(&k, i);
        if (what < 4) {
            assert_int_equal(put_i(s, i), KVC_TIER_PUT_STORED);
            ref[i] = true;
        } else if (what < 7) {
            assert_int_equal(get_i(s, i) == 0, ref[i]);
        } else if (what < 8) {
            /* a batch of 4 consecutive keys */
            tkey_t ks[4];
            kvc_tier_key_t kk[4];
            unsigned char o[4][BB];
            void *op4[4] = {o[0], o[1], o[2], o[3]};
            int res[4];
            int want = 0;
            for (int j = 0; j < 4; j++) {
                mk(&ks[j], (i + (uint64_t)j) % MB_KEYS);
                kk[j] = ks[j].key;
                want += ref[(i + (uint64_t)j) % MB_KEYS];
            }
            assert_int_equal(kvc_tier_get_many(s, kk, op4, 4, res), want);
            for (int j = 0; j < 4; j++) {
                uint64_t id = (i + (uint64_t)j) % MB_KEYS;
                assert_int_equal(res[j] == 0, ref[id]);
                if (ref[id]) {
                    unsigned char w[BB];
                    payload(w, id);
                    assert_memory_equal(o[j], w, BB);
                }
            }
        } else if (what < 9) {
            assert_int_equal(kvc_tier_contains(s, &k.key), ref[i]);
        } else {
            assert_int_equal(kvc_tier_delete(s, &k.key) == 0, ref[i]);
            ref[i] = false;
        }
    }
    assert_int_equal(stats(s).n_faults, 0);
    assert_int_equal(stats(s).n_corrupt, 0);
    kvc_tier_destroy(s);
}

/* ---- parsers --------------------------------------------------------------------------- */
static void specs_parse(void **state)
{
    (void)state;
    kvc_tier_spec_t t;
    char msg[256];
    assert_ok(kvc_tier_spec_parse("host:512MiB", &t, msg, sizeof msg));
    assert_int_equal(t.kind, KVC_TIER_HOST);
    assert_int_equal(t.capacity_bytes, 512ull << 20);
    assert_int_equal(t.mode, KVC_TIER_MODE_EVICT);
    assert_ok(
        kvc_tier_spec_parse("disk:/var/tmp/a:b.bin:2GiB,mode=write-through", &t, msg, sizeof msg));
    assert_int_equal(t.kind, KVC_TIER_DISK);
    assert_string_equal(t.path, "/var/tmp/a:b.bin");
    assert_int_equal(t.capacity_bytes, 2ull << 30);
    assert_int_equal(t.mode, KVC_TIER_MODE_WRITE_THROUGH);
    assert_ok(kvc_tier_spec_parse("redis://127.0.0.1:6379/myprefix", &t, msg, sizeof msg));
    assert_int_equal(t.kind, KVC_TIER_REDIS);
    assert_string_equal(t.host, "127.0.0.1");
    assert_int_equal(t.port, 6379);
    assert_string_equal(t.prefix, "myprefix");
    assert_int_equal(t.mode, KVC_TIER_MODE_WRITE_THROUGH);
    assert_ok(kvc_tier_spec_parse("redis://cache-1.local:7000,mode=evict", &t, msg, sizeof msg));
    assert_string_equal(t.prefix, "kvc");
    assert_int_equal(t.mode, KVC_TIER_MODE_EVICT);
    const char *bad[] = {"",
                         "host:",
                         "host:0",
                         "host:12XB",
                         "disk:x",
                         "disk::1GiB",
                         "disk:/p:",
                         "redis://h",
                         "redis://:1",
                         "redis://h:0",
                         "redis://h:65536",
                         "redis://h:1/a:b",
                         "redis://h:1/",
                         "nvme:1GiB",
                         "host:1GiB,mode=lazy",
                         "host:1GiB,",
                         "redis://h h:1"};
    for (size_t i = 0; i < KVC_ARRAY_LEN(bad); i++) {
        t.kind = KVC_TIER_DISK;
        msg[0] = '\0';
        if (kvc_tier_spec_parse(bad[i], &t, msg, sizeof msg) != KVC_EINVAL)
            fail_msg("'%s' parsed", bad[i]);
        assert_true(msg[0] != '\0');
        assert_int_equal(t.kind, KVC_TIER_DISK); /* untouched */
    }
    assert_int_equal(kvc_tier_spec_parse(NULL, &t, NULL, 0), KVC_EINVAL);

    uint64_t b;
    assert_ok(kvc_tier_budget_parse("50GiB/day", &b));
    assert_int_equal(b, 50ull << 30);
    assert_ok(kvc_tier_budget_parse("1TB/d", &b));
    assert_int_equal(b, 1000000000000ull);
    const char *bad_b[] = {"50GiB", "50GiB/h", "/day", "0/day", "x/day", "50GiB/day/day"};
    for (size_t i = 0; i < KVC_ARRAY_LEN(bad_b); i++)
        assert_int_equal(kvc_tier_budget_parse(bad_b[i], &b), KVC_EINVAL);

    kvc_tier_admission_t a;
    assert_ok(kvc_tier_admission_parse("depth:12", &a));
    assert_int_equal(a.kind, KVC_TIER_ADMIT_DEPTH);
    assert_int_equal(a.min_depth, 12);
    assert_string_equal(kvc_tier_admission_name(a.kind), "depth");
    assert_ok(kvc_tier_admission_parse("second-hit", &a));
    assert_string_equal(kvc_tier_admission_name(a.kind), "second-hit");
    const char *bad_a[] = {"", "depth:", "depth:-1", "depth:x", "never", "depth:99999999999"};
    for (size_t i = 0; i < KVC_ARRAY_LEN(bad_a); i++)
        assert_int_equal(kvc_tier_admission_parse(bad_a[i], &a), KVC_EINVAL);
    assert_string_equal(kvc_tier_admission_name(KVC_TIER_ADMIT__COUNT), "?");
    assert_string_equal(kvc_tier_kind_name(KVC_TIER_REDIS), "redis");
    assert_string_equal(kvc_tier_mode_name(KVC_TIER_MODE_WRITE_THROUGH), "write-through");

    /* kvc_tier_create builds what a spec names. */
    kvc_tier_params_t p = params(4);
    assert_ok(kvc_tier_spec_parse("host:64KiB", &t, msg, sizeof msg));
    kvc_tier_store_t *s = NULL;
    assert_ok(kvc_tier_create(&t, &p, &s));
    assert_string_equal(kvc_tier_name(s), "host");
    assert_int_equal(stats(s).capacity_records, (64 << 10) / kvc_tier_record_bytes(BB, BT));
    kvc_tier_destroy(s);
}

/* bw= and rtt=: units, any order with mode=, the last one wins, and every bad form refused
 * with one line and *out untouched. */
static void specs_parse_bandwidth_and_rtt(void **state)
{
    (void)state;
    kvc_tier_spec_t t;
    char msg[256];
    assert_ok(kvc_tier_spec_parse("host:1GiB", &t, msg, sizeof msg));
    assert_true(t.bandwidth_Bps == 0 && t.rtt_s == 0); /* not given */
    assert_ok(kvc_tier_spec_parse("host:1GiB,bw=25GB/s,rtt=5us", &t, msg, sizeof msg));
    assert_true(t.bandwidth_Bps == 25e9);
    assert_true(fabs(t.rtt_s - 5e-6) < 1e-18);
    assert_int_equal(t.mode, KVC_TIER_MODE_EVICT);
    assert_ok(
        kvc_tier_spec_parse("redis://h:1/p,rtt=80ms,mode=evict,bw=1.25GB/s", &t, msg, sizeof msg));
    assert_true(t.bandwidth_Bps == 1.25e9);
    assert_true(fabs(t.rtt_s - 0.08) < 1e-15);
    assert_int_equal(t.mode, KVC_TIER_MODE_EVICT);
    assert_string_equal(t.prefix, "p");
    assert_ok(
        kvc_tier_spec_parse("disk:/x:1GiB,bw=10Gbit/s,rtt=0.5ms,bw=2GiB/s", &t, msg, sizeof msg));
    assert_true(t.bandwidth_Bps == 2.0 * 1073741824.0); /* the last one given */
    assert_true(fabs(t.rtt_s - 5e-4) < 1e-15);
    assert_ok(kvc_tier_spec_parse("host:1GiB,bw=10Gbit/s,rtt=2s", &t, msg, sizeof msg));
    assert_true(t.bandwidth_Bps == 1.25e9);
    assert_true(t.rtt_s == 2);
    assert_ok(kvc_tier_spec_parse("host:1GiB,bw=1e3MB/s,rtt=250ns", &t, msg, sizeof msg));
    assert_true(t.bandwidth_Bps == 1e9);
    assert_true(fabs(t.rtt_s - 250e-9) < 1e-20);
    const char *bad[] = {"host:1GiB,bw=",        "host:1GiB,bw=25",       "host:1GiB,bw=25GB",
                         "host:1GiB,bw=0GB/s",   "host:1GiB,bw=-1GB/s",   "host:1GiB,bw=xGB/s",
                         "host:1GiB,bw=inf",     "host:1GiB,bw=nanGB/s",  "host:1GiB,bw=25gb/s",
                         "host:1GiB,rtt=",       "host:1GiB,rtt=5",       "host:1GiB,rtt=0us",
                         "host:1GiB,rtt=5min",   "host:1GiB,rtt=-1ms",    "host:1GiB,rtt=2e6s",
                         "host:1GiB,rtt=0x10ms", "host:1GiB,latency=5us", "host:1GiB,bw=1e999GB/s"};
    for (size_t i = 0; i < KVC_ARRAY_LEN(bad); i++) {
        t.kind = KVC_TIER_DISK;
        msg[0] = '\0';
        if (kvc_tier_spec_parse(bad[i], &t, msg, sizeof msg) != KVC_EINVAL)
            fail_msg("'%s' parsed", bad[i]);
        assert_true(msg[0] != '\0');
        assert_null(strchr(msg, '\n'));
        assert_int_equal(t.kind, KVC_TIER_DISK); /* untouched */
    }
}

/* The index-only store the simulator models tiers with holds, evicts, admits and refuses
 * exactly what the host store of the same capacity does: the same operations on both give
 * the same statuses, the same contains and hits, the same counters. */
static void meta_store_matches_the_host_store(void **state)
{
    (void)state;
    const kvc_tier_admission_t adms[] = {
        {KVC_TIER_ADMIT_ALWAYS, 0}, {KVC_TIER_ADMIT_SECOND_HIT, 0}, {KVC_TIER_ADMIT_DEPTH, 3}};
    for (size_t a = 0; a < KVC_ARRAY_LEN(adms); a++) {
        kvc_tier_params_t p = params(16);
        p.capacity_bytes = 16 * kvc_tier_record_bytes(BB, BT);
        p.admission = adms[a];
        /* always: a budget of 10 records a second, 2 deep, against 25 puts a second */
        p.write_budget_per_day = a == 0 ? 86400ull * 10 * kvc_tier_record_bytes(BB, BT) : 0;
        p.write_budget_burst = 2 * kvc_tier_record_bytes(BB, BT);
        fake_now = 1000000000ull;
        kvc_tier_store_t *host, *meta;
        assert_ok(kvc_tier_host_create(&p, &host));
        assert_ok(kvc_tier_meta_create(&p, &meta));
        assert_string_equal(kvc_tier_name(meta), "meta");
        uint64_t rng = 12345 + a;
        for (int op = 0; op < 3000; op++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            uint64_t i = (rng >> 33) % 40, what = (rng >> 20) % 4;
            fake_now += 20000000ull; /* 20 ms */
            tkey_t k;
            mk(&k, i);
            unsigned char d[BB], out[BB];
            payload(d, i);
            if (what < 2) {
                kvc_tier_put_status_t sh = KVC_TIER_PUT_FAULT, sm = KVC_TIER_PUT_FAULT;
                assert_ok(kvc_tier_put(host, &k.key, d, &sh));
                assert_ok(kvc_tier_put(meta, &k.key, d, &sm));
                assert_int_equal(sh, sm);
            } else if (what == 2) {
                assert_int_equal(kvc_tier_get(host, &k.key, out), kvc_tier_get(meta, &k.key, out));
            } else {
                assert_int_equal(kvc_tier_contains(host, &k.key), kvc_tier_contains(meta, &k.key));
            }
            assert_store_ok(meta);
        }
        kvc_tier_stats_t h = stats(host), m = stats(meta);
        assert_int_equal(h.n_hits, m.n_hits);
        assert_int_equal(h.n_misses, m.n_misses);
        assert_int_equal(h.n_puts, m.n_puts);
        assert_int_equal(h.n_put_present, m.n_put_present);
        assert_int_equal(h.n_evictions, m.n_evictions);
        assert_int_equal(h.n_admission_refused, m.n_admission_refused);
        assert_int_equal(h.n_budget_refused, m.n_budget_refused);
        assert_int_equal(h.bytes_written, m.bytes_written);
        assert_int_equal(h.bytes_read, m.bytes_read);
        assert_int_equal(h.n_records, m.n_records);
        assert_int_equal(h.capacity_records, m.capacity_records);
        assert_true(m.n_evictions > 0 && m.n_hits > 0);
        if (a) assert_true(m.n_admission_refused > 0);
        if (a == 0) assert_true(m.n_budget_refused > 0);
        kvc_tier_destroy(host);
        kvc_tier_destroy(meta);
    }
    kvc_tier_params_t p = params(4);
    kvc_tier_store_t *s = NULL;
    p.capacity_bytes = 10;
    assert_int_equal(kvc_tier_meta_create(&p, &s), KVC_EINVAL);
    assert_int_equal(kvc_tier_meta_create(NULL, &s), KVC_EINVAL);
    p = params(4);
    assert_int_equal(kvc_tier_meta_create(&p, NULL), KVC_EINVAL);
    p.capacity_bytes = (2ull << 30) * kvc_tier_record_bytes(BB, BT); /* 2^31 records */
    assert_int_equal(kvc_tier_meta_create(&p, &s), KVC_EINVAL);
    assert_null(s);
}

/* ---- fetch or recompute --------------------------------------------------------------- */
static void decide_matches_hand_arithmetic(void **state)
{
    (void)state;
    /* 1 MiB blocks of 16 tokens over 10 GB/s with 1 ms latency, prefill 8000 tok/s:
     *   per block: fetch 1048576 / 1e10 = 104.8576 us, recompute 16 / 8000 = 2 ms.
     *   n = 1: fetch 1 ms + 0.1048576 ms = 1.1048576 ms < recompute 2 ms: fetch.
     *   break-even: floor(1e-3 / (2e-3 - 1.048576e-4)) + 1 = floor(0.5277) + 1 = 1. */
    kvc_tier_run_t run = {.n_blocks = 1,
                          .block_bytes = 1 << 20,
                          .block_tokens = 16,
                          .bandwidth_Bps = 1e10,
                          .latency_s = 1e-3,
                          .prefill_tokens_per_s = 8000};
    kvc_tier_decision_t d;
    assert_ok(kvc_tier_decide(&run, &d));
    assert_true(d.fetch);
    assert_float_equal(d.fetch_s, 1.1048576e-3, 1e-12);
    assert_float_equal(d.recompute_s, 2e-3, 1e-12);
    assert_int_equal(d.break_even, 1);
    /* A fast engine: 80000 tok/s, recompute 0.2 ms a block; same link, 10 ms latency:
     *   break-even = floor(1e-2 / (2e-4 - 1.048576e-4)) + 1 = floor(105.10...) + 1 = 106.
     *   n = 105: fetch 10 ms + 105 * 0.1048576 ms = 21.010048 ms vs recompute 21 ms:
     *   recompute.  n = 106: 21.1148... vs 21.2 ms: fetch. */
    run.prefill_tokens_per_s = 80000;
    run.latency_s = 1e-2;
    run.n_blocks = 105;
    assert_ok(kvc_tier_decide(&run, &d));
    assert_false(d.fetch);
    assert_float_equal(d.fetch_s, 21.010048e-3, 1e-12);
    assert_float_equal(d.recompute_s, 21e-3, 1e-12);
    assert_int_equal(d.break_even, 106);
    run.n_blocks = 106;
    assert_ok(kvc_tier_decide(&run, &d));
    assert_true(d.fetch);
    /* A link slower per block than recompute: never fetch (1 GB/s: 1.048576 ms a block
     * against 0.2 ms). */
    run.bandwidth_Bps = 1e9;
    run.n_blocks = 1000000;
    assert_ok(kvc_tier_decide(&run, &d));
    assert_false(d.fetch);
    assert_int_equal(d.break_even, UINT32_MAX);
    /* A run exactly at break-even gains nothing: recompute wins ties.  Free bytes, 1 s a
     * block to recompute, 3 s latency: n = 3 costs 3 s both ways, so n* = 4. */
    kvc_tier_run_t tie = {.n_blocks = 3,
                          .block_bytes = 0,
                          .block_tokens = 1,
                          .bandwidth_Bps = 1,
                          .latency_s = 3,
                          .prefill_tokens_per_s = 1};
    assert_ok(kvc_tier_decide(&tie, &d));
    assert_false(d.fetch);
    assert_int_equal(d.break_even, 4);
    tie.n_blocks = 4;
    assert_ok(kvc_tier_decide(&tie, &d));
    assert_true(d.fetch);
    /* An empty run fetches nothing. */
    run.n_blocks = 0;
    assert_ok(kvc_tier_decide(&run, &d));
    assert_false(d.fetch);
    assert_float_equal(d.fetch_s, 0, 0);
    /* Bad inputs. */
    run = (kvc_tier_run_t){.n_blocks = 1,
                           .block_bytes = 1,
                           .block_tokens = 1,
                           .bandwidth_Bps = 1,
                           .latency_s = 0,
                           .prefill_tokens_per_s = 1};
    assert_ok(kvc_tier_decide(&run, &d));
    kvc_tier_run_t b = run;
    b.block_tokens = 0;
    assert_int_equal(kvc_tier_decide(&b, &d), KVC_EINVAL);
    b = run;
    b.bandwidth_Bps = 0;
    assert_int_equal(kvc_tier_decide(&b, &d), KVC_EINVAL);
    b = run;
    b.latency_s = -1;
    assert_int_equal(kvc_tier_decide(&b, &d), KVC_EINVAL);
    b = run;
    b.prefill_tokens_per_s = 1.0 / 0.0;
    assert_int_equal(kvc_tier_decide(&b, &d), KVC_EINVAL);
    assert_int_equal(kvc_tier_decide(NULL, &d), KVC_EINVAL);
}

static void estimator_recovers_latency_and_bandwidth(void **state)
{
    (void)state;
    kvc_tier_estimator_t e;
    assert_ok(kvc_tier_estimator_init(&e, 1e-3, 1e9, 0.2));
    assert_float_equal(e.latency_s, 1e-3, 0);
    /* Fetches on the exact line seconds = 200 us + bytes / 2 GB/s, two sizes:
     *   1 MB: 0.0002 + 0.0005 = 0.7 ms;  4 MB: 0.0002 + 0.002 = 2.2 ms.
     * Any weights of points on one line fit that line exactly. */
    for (int i = 0; i < 20; i++) {
        uint64_t x = i % 2 ? 4000000 : 1000000;
        assert_ok(kvc_tier_estimator_observe(&e, x, 2e-4 + (double)x / 2e9));
    }
    assert_float_equal(e.latency_s, 2e-4, 1e-9);
    assert_float_equal(e.bandwidth_Bps, 2e9, 1e3);
    /* One size only (the usual case: fixed blocks): the latency stays, the bandwidth
     * follows.  Seed 1 ms; fetches of 1 MB taking 1.5 ms: 1e6 / 0.5e-3 = 2 GB/s. */
    assert_ok(kvc_tier_estimator_init(&e, 1e-3, 1e8, 0.5));
    assert_ok(kvc_tier_estimator_observe(&e, 1000000, 1.5e-3));
    assert_float_equal(e.latency_s, 1e-3, 0);
    assert_float_equal(e.bandwidth_Bps, 2e9, 1);
    /* The link slows to 3.5 ms a fetch: EWMA with alpha 0.5 moves the mean time
     * to 2.5 ms, then 3 ms: bandwidth 1e6 / 1.5e-3, then 1e6 / 2e-3. */
    assert_ok(kvc_tier_estimator_observe(&e, 1000000, 3.5e-3));
    assert_float_equal(e.bandwidth_Bps, 1e6 / 1.5e-3, 1e-3);
    assert_ok(kvc_tier_estimator_observe(&e, 1000000, 3.5e-3));
    assert_float_equal(e.bandwidth_Bps, 1e6 / 2e-3, 1e-3);
    /* Fetches faster than the seeded latency: 1 ms seed, 1 MB in 0.4 ms: the latency is
     * halved into the mean time (0.2 ms) and the bandwidth takes the rest, 1e6 / 0.2e-3. */
    kvc_tier_estimator_t f;
    assert_ok(kvc_tier_estimator_init(&f, 1e-3, 1e9, 1));
    assert_ok(kvc_tier_estimator_observe(&f, 1000000, 4e-4));
    assert_float_equal(f.latency_s, 2e-4, 1e-15);
    assert_float_equal(f.bandwidth_Bps, 5e9, 1);
    assert_int_equal(kvc_tier_estimator_observe(&e, 0, 1), KVC_EINVAL);
    assert_int_equal(kvc_tier_estimator_observe(&e, 1, 0), KVC_EINVAL);
    assert_int_equal(kvc_tier_estimator_init(&e, -1, 1, 0), KVC_EINVAL);
    assert_int_equal(kvc_tier_estimator_init(&e, 0, 0, 0), KVC_EINVAL);
    assert_int_equal(kvc_tier_estimator_init(&e, 0, 1, 2), KVC_EINVAL);
    assert_int_equal(e.n_samples, 3); /* failed calls changed nothing */
}

int main(int argc, char **argv)
{
    const struct CMUnitTest local[] = {
        cmocka_unit_test(host_put_get_contains_delete),
        cmocka_unit_test(disk_put_get_contains_delete),
        cmocka_unit_test(host_evicts_least_recently_used),
        cmocka_unit_test(disk_evicts_least_recently_used),
        cmocka_unit_test(host_identity_mismatch_is_a_miss),
        cmocka_unit_test(disk_identity_mismatch_is_a_miss),
        cmocka_unit_test(host_flipped_bytes_are_a_counted_miss),
        cmocka_unit_test(disk_flipped_or_truncated_records_are_counted_misses),
        cmocka_unit_test(disk_restart_reuses_records_in_lru_order),
        cmocka_unit_test(disk_write_errors_are_counted_faults),
        cmocka_unit_test(large_blocks_round_trip),
        cmocka_unit_test(host_write_budget_is_enforced),
        cmocka_unit_test(disk_write_budget_is_enforced),
        cmocka_unit_test(host_admission_policies),
        cmocka_unit_test(disk_admission_policies),
        cmocka_unit_test(host_matches_a_reference_lru),
        cmocka_unit_test(disk_matches_a_reference_lru),
        cmocka_unit_test(fetch_latency_histogram_buckets),
        cmocka_unit_test(create_rejects_bad_parameters),
        cmocka_unit_test(specs_parse),
        cmocka_unit_test(specs_parse_bandwidth_and_rtt),
        cmocka_unit_test(meta_store_matches_the_host_store),
        cmocka_unit_test(decide_matches_hand_arithmetic),
        cmocka_unit_test(estimator_recovers_latency_and_bandwidth),
    };
    const struct CMUnitTest remote[] = {
        cmocka_unit_test(redis_put_get_contains_delete),
        cmocka_unit_test(redis_batches_are_pipelined),
        cmocka_unit_test(redis_corrupt_and_truncated_values_are_misses),
        cmocka_unit_test(redis_value_under_the_wrong_key_is_a_mismatch),
        cmocka_unit_test(redis_ttl_and_prefixes),
        cmocka_unit_test(redis_killed_is_a_miss_and_the_store_reconnects),
        cmocka_unit_test(redis_fetch_past_its_deadline_is_a_miss),
        cmocka_unit_test(redis_matches_a_reference_map),
    };
    /* `test_tier` runs the local stores; `test_tier --redis` (ctest's tier.redis) the redis
     * store against a server it starts, and exits 77 (ctest: skipped, never passed) when
     * redis-server is not installed. */
    if (argc > 1 && !strcmp(argv[1], "--redis")) {
        if (!redis_binary_present()) {
            printf("redis-server is not installed: tier.redis skipped "
                   "(apt-get install redis-server)\n");
            return 77;
        }
        return cmocka_run_group_tests_name("tier_redis", remote, redis_group_setup,
                                           redis_group_teardown);
    }
    return cmocka_run_group_tests_name("tier", local, NULL, NULL);
}
