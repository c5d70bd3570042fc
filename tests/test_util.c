/* test_util.c - version, errors, lists, allocators, hashing, PRNG. */
#include "test_helpers.h"

#include <stdio.h>
#include <string.h>

/* The library, its headers and CMakeLists.txt's project() say one version: version.h is
 * generated from project(), and kvc_version() is compiled from version.h. */
static void version_is_the_project_version(void **state)
{
    (void)state;
    assert_string_equal(kvc_version(), KVC_VERSION);
    char parts[32];
    snprintf(parts, sizeof parts, "%d.%d.%d", KVC_VERSION_MAJOR, KVC_VERSION_MINOR,
             KVC_VERSION_PATCH);
    assert_string_equal(parts, KVC_VERSION);
    assert_int_equal(KVC_VERSION_NUMBER,
                     KVC_VERSION_MAJOR * 10000 + KVC_VERSION_MINOR * 100 + KVC_VERSION_PATCH);
    FILE *f = fopen(KVC_SOURCE_DIR "/CMakeLists.txt", "r");
    assert_non_null(f);
    char line[256], want[64];
    snprintf(want, sizeof want, "project(kvcache VERSION %s ", KVC_VERSION);
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) found = strncmp(line, want, strlen(want)) == 0;
    fclose(f);
    if (!found) fail_msg("CMakeLists.txt has no line starting '%s': a stale build?", want);
}

static void error_table_names_every_code(void **state)
{
    (void)state;
    assert_string_equal(kvc_strerror(0), "success");
    assert_string_equal(kvc_errname(0), "OK");
    assert_string_equal(kvc_errname(KVC_ENOSPC), "ENOSPC");
    assert_string_equal(kvc_strerror(KVC_ENOSPC), "not enough free blocks in the pool");
    assert_string_equal(kvc_errname(KVC_EOVERFLOW), "EOVERFLOW");
    /* every code has a distinct negative value and a message */
    for (int e = KVC__ERR_FIRST + 1; e < KVC__ERR_LAST; e++) {
        assert_true(e < 0);
        assert_string_not_equal(kvc_strerror(e), "unknown error");
        assert_string_not_equal(kvc_errname(e), "EUNKNOWN");
    }
    assert_string_equal(kvc_strerror(KVC__ERR_LAST), "unknown error");
    assert_string_equal(kvc_strerror(-1), "unknown error");
    assert_string_equal(kvc_errname(12345), "EUNKNOWN");
}

typedef struct {
    int value;
    kvc_list_t link;
} item_t;

static void list_push_remove_and_order(void **state)
{
    (void)state;
    kvc_list_t head;
    kvc_list_init(&head);
    assert_true(kvc_list_empty(&head));
    item_t items[4];
    for (int i = 0; i < 4; i++) {
        items[i].value = i;
        kvc_list_init(&items[i].link);
        assert_false(kvc_list_linked(&items[i].link));
    }
    kvc_list_push_back(&head, &items[1].link);
    kvc_list_push_back(&head, &items[2].link);
    kvc_list_push_front(&head, &items[0].link);
    kvc_list_push_back(&head, &items[3].link);
    int expect[] = {0, 1, 2, 3}, n = 0;
    for (kvc_list_t *p = head.next; p != &head; p = p->next)
        assert_int_equal(kvc_container_of(p, item_t, link)->value, expect[n++]);
    assert_int_equal(n, 4);
    kvc_list_remove(&items[2].link); /* from the middle, O(1) */
    assert_false(kvc_list_linked(&items[2].link));
    int expect2[] = {0, 1, 3};
    n = 0;
    for (kvc_list_t *p = head.next; p != &head; p = p->next)
        assert_int_equal(kvc_container_of(p, item_t, link)->value, expect2[n++]);
    assert_int_equal(n, 3);
}

static void failing_allocator_fails_the_nth(void **state)
{
    (void)state;
    kvc_failing_alloc_t st = {.fail_at = 3};
    kvc_allocator_t a = kvc_failing_allocator(&st);
    void *p1 = kvc_alloc(&a, 10, 0), *p2 = kvc_alloc(&a, 10, 64);
    assert_non_null(p1);
    assert_non_null(p2);
    assert_int_equal((uintptr_t)p2 % 64, 0);
    assert_null(kvc_alloc(&a, 10, 0));
    void *p4 = kvc_calloc(&a, 4, 4, 0);
    assert_non_null(p4);
    assert_int_equal(st.n_failed, 1);
    assert_int_equal(st.n_live, 3);
    kvc_free(&a, p1);
    kvc_free(&a, p2);
    kvc_free(&a, p4);
    kvc_free(&a, NULL);
    assert_int_equal(st.n_live, 0);
    /* fail_after: everything from the Nth on */
    kvc_failing_alloc_t st2 = {.fail_at = 1, .fail_after = true};
    kvc_allocator_t a2 = kvc_failing_allocator(&st2);
    assert_null(kvc_alloc(&a2, 1, 0));
    assert_null(kvc_alloc(&a2, 1, 0));
    assert_int_equal(st2.n_failed, 2);
    /* overflow in calloc is refused, not wrapped */
    assert_null(kvc_calloc(NULL, SIZE_MAX / 2, 4, 0));
}

static void hash128_is_xxh3_and_seeded(void **state)
{
    (void)state;
    const char data[] = "kvcache";
    kvc_hash128_t a = kvc_hash128(data, 7, 1), b = kvc_hash128(data, 7, 1),
                  c = kvc_hash128(data, 7, 2);
    assert_true(kvc_hash128_eq(a, b));
    assert_false(kvc_hash128_eq(a, c));
    char hex[33];
    kvc_hash128_hex((kvc_hash128_t){.lo = 0x0123456789abcdefULL, .hi = 0xfedcba9876543210ULL}, hex);
    assert_string_equal(hex, "fedcba98765432100123456789abcdef");
    /* XXH3-128 of the empty input with seed 0 (the library's published test vector) */
    kvc_hash128_t e = kvc_hash128("", 0, 0);
    assert_true(e.lo == 0x6001c324468d497fULL && e.hi == 0x99aa06d3014798d8ULL);
    assert_int_not_equal(kvc_random_seed(), 0);
}

static void rng_is_deterministic_and_bounded(void **state)
{
    (void)state;
    kvc_rng_t r1, r2;
    kvc_rng_seed(&r1, 42);
    kvc_rng_seed(&r2, 42);
    for (int i = 0; i < 1000; i++) assert_true(kvc_rng_next(&r1) == kvc_rng_next(&r2));
    uint64_t counts[7] = {0};
    for (int i = 0; i < 70000; i++) {
        uint64_t v = kvc_rng_below(&r1, 7);
        assert_true(v < 7);
        counts[v]++;
    }
    for (int i = 0; i < 7; i++) assert_true(counts[i] > 9000 && counts[i] < 11000);
    /* the empty range answers 0 and draws nothing (it used to abort the process) */
    kvc_rng_seed(&r2, 9);
    kvc_rng_t before = r2;
    assert_true(kvc_rng_below(&r2, 0) == 0);
    assert_memory_equal(&before, &r2, sizeof r2);
    for (int i = 0; i < 1000; i++) {
        double d = kvc_rng_double(&r1);
        assert_true(d >= 0.0 && d < 1.0);
    }
    uint64_t t0 = kvc_now_ns(), t1 = kvc_now_ns();
    assert_true(t1 >= t0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(version_is_the_project_version),
        cmocka_unit_test(error_table_names_every_code),
        cmocka_unit_test(list_push_remove_and_order),
        cmocka_unit_test(failing_allocator_fails_the_nth),
        cmocka_unit_test(hash128_is_xxh3_and_seeded),
        cmocka_unit_test(rng_is_deterministic_and_bounded),
    };
    return cmocka_run_group_tests_name("util", tests, NULL, NULL);
}
