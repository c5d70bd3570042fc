/* test_helpers.h - shared by the cmocka tests: invariant assertions and a
 * scale knob so the sanitizer build runs the heavy randomized tests smaller. */
#ifndef KVC_TEST_HELPERS_H
#define KVC_TEST_HELPERS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/resource.h>
#include <cmocka.h>

#include "kvcache/kvcache.h"

#if defined(__SANITIZE_ADDRESS__)
#define KVC_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVC_TEST_SANITIZED 1
#endif
#endif
#ifndef KVC_TEST_SANITIZED
#define KVC_TEST_SANITIZED 0
#endif

/* Page faults this process has taken so far: pages of memory it touched for the first time,
 * for tests that prove untouched metadata costs nothing. */
static inline long kvc_test_minor_faults(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_minflt;
}

/* Randomized tests run this many times fewer iterations under the sanitizers. */
#define KVC_TEST_SANITIZER_DIVISOR (KVC_TEST_SANITIZED ? 8 : 1)

#define assert_ok(expr)                                                              \
    do {                                                                             \
        int rc_ = (expr);                                                            \
        if (rc_ != 0) fail_msg("%s failed: %s (%d)", #expr, kvc_strerror(rc_), rc_); \
    } while (0)

#define assert_pool_ok(pool)                                                             \
    do {                                                                                 \
        char msg_[256];                                                                  \
        if (kvc_pool_check((pool), msg_, sizeof msg_)) fail_msg("pool check: %s", msg_); \
    } while (0)

#define assert_prefix_ok(pc)                                                               \
    do {                                                                                   \
        char msg_[256];                                                                    \
        if (kvc_prefix_check((pc), msg_, sizeof msg_)) fail_msg("prefix check: %s", msg_); \
    } while (0)

#endif
