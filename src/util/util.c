/* util.c - version, errors, assertions, allocators, hashing, PRNG and clock.
 * The bottom layer: everything above may use it, it uses nothing above. */
#include "kvcache/util.h"
#include "util/msg.h"
#include "util/fmt.h"

#include <stdarg.h>

#include <errno.h>
#include <stdalign.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

/* ---- version ------------------------------------------------------------ */
const char *kvc_version(void)
{
    return KVC_VERSION; /* version.h, generated from the project() version */
}

/* ---- errors ------------------------------------------------------------- */
static const char *const err_msgs[] = {
#define KVC__ERR_MSG(name, msg) msg,
    KVC_ERRNO_MAP(KVC__ERR_MSG)
#undef KVC__ERR_MSG
};
static const char *const err_names[] = {
#define KVC__ERR_NAME(name, msg) #name,
    KVC_ERRNO_MAP(KVC__ERR_NAME)
#undef KVC__ERR_NAME
};

static int err_index(int err)
{
    if (err <= KVC__ERR_FIRST || err >= KVC__ERR_LAST) return -1;
    return err - KVC__ERR_FIRST - 1;
}

const char *kvc_strerror(int err)
{
    if (err == 0) return "success";
    int i = err_index(err);
    return i < 0 ? "unknown error" : err_msgs[i];
}

const char *kvc_errname(int err)
{
    if (err == 0) return "OK";
    int i = err_index(err);
    return i < 0 ? "EUNKNOWN" : err_names[i];
}

int kvc__msgf(int err, char *msg, size_t cap, const char *fmt, ...)
{
    if (msg && cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, cap, fmt, ap);
        va_end(ap);
    }
    return err;
}

void kvc__assert_fail(const char *expr, const char *file, int line, const char *func)
{
    fprintf(stderr, "kvcache: assertion failed: %s (%s:%d in %s)\n", expr, file, line, func);
    fflush(stderr);
    abort();
}

/* ---- allocators --------------------------------------------------------- */
static void *libc_alloc(size_t bytes, size_t align)
{
    if (bytes == 0) bytes = 1;
    if (align <= alignof(max_align_t)) return malloc(bytes);
    void *p = NULL;
    return posix_memalign(&p, align, bytes) == 0 ? p : NULL;
}

void *kvc_alloc(const kvc_allocator_t *a, size_t bytes, size_t align)
{
    if (align == 0) align = alignof(max_align_t);
    if (a && a->alloc) return a->alloc(a->ctx, bytes, align);
    return libc_alloc(bytes, align);
}

void *kvc_calloc(const kvc_allocator_t *a, size_t n, size_t size, size_t align)
{
    if (size != 0 && n > SIZE_MAX / size) return NULL;
    void *p = kvc_alloc(a, n * size, align);
    if (p) memset(p, 0, n * size);
    return p;
}

void kvc_free(const kvc_allocator_t *a, void *p)
{
    if (!p) return;
    if (a && a->alloc) {
        if (a->free) a->free(a->ctx, p);
        return;
    }
    free(p);
}

static void *failing_alloc(void *ctx, size_t bytes, size_t align)
{
    kvc_failing_alloc_t *st = ctx;
    st->n_allocs++;
    if (st->fail_at &&
        (st->n_allocs == st->fail_at || (st->fail_after && st->n_allocs > st->fail_at))) {
        st->n_failed++;
        return NULL;
    }
    void *p = libc_alloc(bytes, align);
    if (p) st->n_live++;
    return p;
}

static void failing_free(void *ctx, void *p)
{
    kvc_failing_alloc_t *st = ctx;
    if (!p) return;
    st->n_live--;
    free(p);
}

kvc_allocator_t kvc_failing_allocator(kvc_failing_alloc_t *state)
{
    return (kvc_allocator_t){.alloc = failing_alloc, .free = failing_free, .ctx = state};
}

/* ---- hashing ------------------------------------------------------------ */
kvc_hash128_t kvc_hash128(const void *data, size_t len, uint64_t seed)
{
    XXH128_hash_t h = XXH3_128bits_withSeed(data, len, seed);
    return (kvc_hash128_t){.lo = h.low64, .hi = h.high64};
}

void kvc_hash128_hex(kvc_hash128_t h, char out[33])
{
    snprintf(out, 33, "%016llx%016llx", (unsigned long long)h.hi, (unsigned long long)h.lo);
}

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t kvc_random_seed(void)
{
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof seed, 0) == (ssize_t)sizeof seed && seed != 0) return seed;
    /* No entropy source: mix the clock and an address (ASLR); better than a constant. */
    uint64_t x = kvc_now_ns() ^ (uint64_t)(uintptr_t)&seed;
    seed = splitmix64(&x);
    return seed ? seed : 1;
}

/* ---- PRNG --------------------------------------------------------------- */
void kvc_rng_seed(kvc_rng_t *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t kvc_rng_next(kvc_rng_t *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

uint64_t kvc_rng_below(kvc_rng_t *r, uint64_t n)
{
    if (n == 0) return 0; /* the empty range: a caller's value, never an abort */
    kvc__u128 m = (kvc__u128)kvc_rng_next(r) * n;
    uint64_t lo = (uint64_t)m;
    if (lo < n) {
        uint64_t threshold = -n % n;
        while (lo < threshold) {
            m = (kvc__u128)kvc_rng_next(r) * n;
            lo = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

double kvc_rng_double(kvc_rng_t *r)
{
    return (double)(kvc_rng_next(r) >> 11) * 0x1.0p-53;
}

/* ---- clock -------------------------------------------------------------- */
uint64_t kvc_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* ---- byte counts for text outputs (util/fmt.h) ---- */
const char *kvc__fmt_iec(char *buf, size_t cap, double bytes)
{
    static const char *const units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int u = 0;
    while (bytes >= 1024 && u < 6) bytes /= 1024, u++;
    snprintf(buf, cap, u ? "%.1f %s" : "%.0f %s", bytes, units[u]);
    return buf;
}
