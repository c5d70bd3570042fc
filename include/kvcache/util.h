/* kvcache/util.h - the bottom layer: errors, assertions, intrusive lists,
 * allocators (with fault injection), a deterministic PRNG, 128-bit hashes, a
 * monotonic clock and the library's version.  Nothing here knows what a token
 * is.
 *
 * Return values: no function in this header returns an error code.  They
 * return values (hashes, random numbers, nanoseconds), strings that are never
 * NULL (kvc_strerror, kvc_errname, kvc_version), a pointer that is NULL when
 * memory is short (kvc_alloc, kvc_calloc), or a bool (the list tests).  The
 * codes they describe are what the layers above return.
 *
 * Thread-safety: every function here is reentrant; the objects (lists, RNG
 * state, counting allocators) are owned by their caller and must not be used
 * from two threads at once without the caller's own locking.
 */
#ifndef KVCACHE_UTIL_H
#define KVCACHE_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvcache/version.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- symbol visibility and checked results ---------------------------------
 * The library is built with -fvisibility=hidden: only declarations marked
 * KVC_API are exported from the shared library; kvc__ internals shared across
 * the library's own files stay private.  KVC_NODISCARD marks results that are
 * a bug to ignore (an error code that says whether memory or a reference
 * changed hands); GCC warns even through a (void) cast, so a caller that
 * really means to ignore one says why in a comment and tests it anyway.
 */
#if defined(__GNUC__) || defined(__clang__)
#define KVC_API       __attribute__((visibility("default")))
#define KVC_NODISCARD __attribute__((warn_unused_result))
#else
#define KVC_API
#define KVC_NODISCARD
#endif

/* ---- version ---------------------------------------------------------------
 * The version the library was built with ("MAJOR.MINOR.PATCH", the same
 * string as its KVC_VERSION).  A program compiled against these headers can
 * compare it with KVC_VERSION to catch linking a library of another version.
 * Never NULL; a static string. */
KVC_API const char *kvc_version(void);

/* ---- errors --------------------------------------------------------------
 * Functions that report failure return 0 on success or a negative KVC_E*
 * code (each header says which of its functions return counts, sizes or
 * booleans instead, and which codes each function can return).  One table makes
 * the enum and kvc_strerror() / kvc_errname(), so they cannot drift apart.
 */
#define KVC_ERRNO_MAP(XX)                            \
    XX(EINVAL, "invalid argument")                   \
    XX(ENOMEM, "out of memory")                      \
    XX(ENOSPC, "not enough free blocks in the pool") \
    XX(EBUSY, "resource is busy")                    \
    XX(EEXIST, "already exists")                     \
    XX(ENOENT, "not found")                          \
    XX(ESTALE, "stale handle")                       \
    XX(EUNDERFLOW, "reference count underflow")      \
    XX(ECORRUPT, "invariant violated")               \
    XX(ERANGE, "value out of range")                 \
    XX(EIO, "input/output error")                    \
    XX(EPARSE, "malformed input")                    \
    XX(ENOTSUP, "not supported")                     \
    XX(ECHECKSUM, "checksum mismatch")               \
    XX(EOVERFLOW, "value too large")

typedef enum {
    KVC_OK = 0,
#define KVC__ERR_ENUM(name, msg) KVC_##name,
    KVC__ERR_FIRST = -1000,
    KVC_ERRNO_MAP(KVC__ERR_ENUM)
#undef KVC__ERR_ENUM
        KVC__ERR_LAST
} kvc_err_t;

/* Human-readable message for a KVC_E* code (or "success" for 0). Never NULL. */
KVC_API const char *kvc_strerror(int err);
/* The code's name without the KVC_ prefix, e.g. "ENOSPC". Never NULL. */
KVC_API const char *kvc_errname(int err);

/* ---- assertions ----------------------------------------------------------
 * KVC_ASSERT is for programmer errors and stays on in release builds: it
 * prints file:line and the expression to stderr and aborts.  Bad input from
 * users gets an error code, never an assertion.
 */
KVC_API void kvc__assert_fail(const char *expr, const char *file, int line, const char *func)
    __attribute__((noreturn, cold));
#define KVC_ASSERT(expr) ((expr) ? (void)0 : kvc__assert_fail(#expr, __FILE__, __LINE__, __func__))

#define KVC_LIKELY(x)    __builtin_expect(!!(x), 1)
#define KVC_UNLIKELY(x)  __builtin_expect(!!(x), 0)
#define KVC_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define KVC_MIN(a, b)    ((a) < (b) ? (a) : (b))
#define KVC_MAX(a, b)    ((a) > (b) ? (a) : (b))
#define KVC_NONE         UINT32_MAX /* "no block", "no index" */

/* 128-bit unsigned integer for overflow-checked size arithmetic (GCC and clang). */
__extension__ typedef unsigned __int128 kvc__u128;

/* ---- intrusive doubly linked list (Linux list.h) ---------------------------
 * A circular list with a sentinel head.  Nodes live inside the objects they
 * link, so no operation allocates.  All operations are O(1).
 */
typedef struct kvc_list {
    struct kvc_list *prev, *next;
} kvc_list_t;

#define kvc_container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

static inline void kvc_list_init(kvc_list_t *head)
{
    head->prev = head->next = head;
}
static inline bool kvc_list_empty(const kvc_list_t *head)
{
    return head->next == head;
}
static inline void kvc__list_insert(kvc_list_t *node, kvc_list_t *prev, kvc_list_t *next)
{
    node->prev = prev;
    node->next = next;
    prev->next = node;
    next->prev = node;
}
/* Insert node at the back (before head). */
static inline void kvc_list_push_back(kvc_list_t *head, kvc_list_t *node)
{
    kvc__list_insert(node, head->prev, head);
}
/* Insert node at the front (after head). */
static inline void kvc_list_push_front(kvc_list_t *head, kvc_list_t *node)
{
    kvc__list_insert(node, head, head->next);
}
/* Unlink node from whatever list holds it; node becomes a list of its own. */
static inline void kvc_list_remove(kvc_list_t *node)
{
    node->prev->next = node->next;
    node->next->prev = node->prev;
    node->prev = node->next = node;
}
/* True if node is linked into some list (removed or never-linked nodes point at themselves). */
static inline bool kvc_list_linked(const kvc_list_t *node)
{
    return node->next != node;
}

/* ---- allocators ------------------------------------------------------------
 * Every object that allocates takes an allocator in its parameters, so tests
 * can inject failures.  A zeroed kvc_allocator_t means the C library.
 * alloc(ctx, bytes, align) returns memory aligned to `align` (a power of two,
 * at most 4096) or NULL; free(ctx, p) accepts NULL.
 */
typedef struct {
    void *(*alloc)(void *ctx, size_t bytes, size_t align);
    void (*free)(void *ctx, void *p);
    void *ctx;
} kvc_allocator_t;

/* Allocate / free through `a` (NULL or zeroed: the C library).  kvc_alloc does not zero;
 * kvc_calloc zeroes and checks n * size for overflow.  Both return NULL when the allocator
 * fails (or, for kvc_calloc, when n * size overflows); the caller turns that into KVC_ENOMEM. */
KVC_API void *kvc_alloc(const kvc_allocator_t *a, size_t bytes, size_t align);
KVC_API void *kvc_calloc(const kvc_allocator_t *a, size_t n, size_t size, size_t align);
KVC_API void kvc_free(const kvc_allocator_t *a, void *p);

/* A counting allocator that fails the Nth allocation (and, if `fail_after`,
 * every one after it).  fail_at = 0 never fails.  Caller owns the struct. */
typedef struct {
    uint64_t n_allocs; /* allocations attempted so far */
    uint64_t n_live;   /* allocations not yet freed */
    uint64_t fail_at;  /* 1-based index of the allocation to fail; 0 = never */
    bool fail_after;   /* also fail every allocation after fail_at */
    uint64_t n_failed; /* how many were failed */
} kvc_failing_alloc_t;

/* An allocator that routes through `state`. */
KVC_API kvc_allocator_t kvc_failing_allocator(kvc_failing_alloc_t *state);

/* ---- 128-bit hash values ------------------------------------------------ */
typedef struct {
    uint64_t lo, hi;
} kvc_hash128_t;

static inline bool kvc_hash128_eq(kvc_hash128_t a, kvc_hash128_t b)
{
    return a.lo == b.lo && a.hi == b.hi;
}
/* XXH3-128 of `len` bytes with `seed`. */
KVC_API kvc_hash128_t kvc_hash128(const void *data, size_t len, uint64_t seed);
/* 32 lowercase hex digits (hi then lo) and a NUL into out[33]. */
KVC_API void kvc_hash128_hex(kvc_hash128_t h, char out[33]);
/* 64 random bits from the operating system (getrandom); falls back to the
 * clock and address entropy if the call fails.  For per-process hash seeds. */
KVC_API uint64_t kvc_random_seed(void);

/* ---- deterministic PRNG (xoshiro256**, seeded by splitmix64) ---------------
 * For tests, simulators and benchmarks: the same seed gives the same stream
 * on every platform. */
typedef struct {
    uint64_t s[4];
} kvc_rng_t;

KVC_API void kvc_rng_seed(kvc_rng_t *r, uint64_t seed);
KVC_API uint64_t kvc_rng_next(kvc_rng_t *r);
/* Uniform integer in [0, n).  Unbiased (Lemire's method).  n = 0 (an empty range) returns 0
 * and draws nothing. */
KVC_API uint64_t kvc_rng_below(kvc_rng_t *r, uint64_t n);
/* Uniform double in [0, 1). */
KVC_API double kvc_rng_double(kvc_rng_t *r);

/* ---- clocks ------------------------------------------------------------
 * Monotonic nanoseconds, for benchmarks and the CLI.  The scheduler never
 * reads a clock: time is passed in. */
KVC_API uint64_t kvc_now_ns(void);

#ifdef __cplusplus
}
#endif
#endif /* KVCACHE_UTIL_H */
