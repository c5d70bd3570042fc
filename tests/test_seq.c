/* test_seq.c - the seq layer, operation by operation, each with the production
 * bug it is there to rule out: handles and stale calls, prefix reuse, slots
 * and all-or-nothing reservation, copy-on-write forks (one copy per child on
 * an unaligned prompt, none on an aligned one), beam search against a flat
 * reference, the 600 MiB / 156 MiB beam accounting, speculative drafts
 * (rejection, full acceptance, EOS and the output cap inside the drafts,
 * exact rollback, no eviction for slack), sliding windows that really give
 * memory back, hybrid prefix hits, and the step launch/completion contract. */
#include "seq_harness.h"

#include <stdio.h>
#include <stdlib.h>

static void fill(kvc_token_t *t, size_t n, int base)
{
    for (size_t i = 0; i < n; i++) t[i] = base + (int)i;
}

/* ---- lifecycle ----------------------------------------------------------------------- */
static void stale_handles_are_refused_and_change_nothing(void **state)
{
    (void)state;
    harness_t h;
    harness_init(&h, (harness_cfg_t){.n_blocks = 16, .bs = 4, .max_seqs = 2});
    kvc_token_t t[6];
    fill(t, 6, 1);
    kvc_seq_t a = harness_create(&h, t, 6);
    assert_ok(harness_step(&h, a, 6));
    uint32_t free_before = kvc_pool_n_free(h.pool);
    assert_ok(kvc_seq_destroy(h.seqs, a));
    assert_false(kvc_seq_valid(h.seqs, a));
    assert_true(kvc_pool_n_free(h.pool) > free_before);
    free_before = kvc_pool_n_free(h.pool);
    int64_t slots[4];
    kvc_seq_info_t info;
    kvc_seq_t child;
    const uint32_t *table;
    uint32_t nb;
    const kvc_token_t *tok;
    size_t nt;
    /* every operation on a stale handle: KVC_ESTALE, nothing changes */
    assert_int_equal(kvc_seq_destroy(h.seqs, a), KVC_ESTALE); /* no double free */
    assert_int_equal(kvc_seq_lookup(h.seqs, a, NULL), KVC_ESTALE);
    assert_int_equal(kvc_seq_reserve(h.seqs, a, 1, slots), KVC_ESTALE);
    assert_int_equal(kvc_seq_complete(h.seqs, a, 1), KVC_ESTALE);
    assert_int_equal(kvc_seq_append(h.seqs, a, t, 1), KVC_ESTALE);
    assert_int_equal(kvc_seq_draft(h.seqs, a, t, 1), KVC_ESTALE);
    assert_int_equal(kvc_seq_accept(h.seqs, a, 0), KVC_ESTALE);
    assert_int_equal(kvc_seq_rollback(h.seqs, a, 0), KVC_ESTALE);
    assert_int_equal(kvc_seq_emit(h.seqs, a, 0), KVC_ESTALE);
    assert_int_equal(kvc_seq_fork(h.seqs, a, &child), KVC_ESTALE);
    assert_int_equal(kvc_seq_info(h.seqs, a, &info), KVC_ESTALE);
    assert_int_equal(kvc_seq_table(h.seqs, a, 0, &table, &nb), KVC_ESTALE);
    assert_int_equal(kvc_seq_tokens(h.seqs, a, &tok, &nt), KVC_ESTALE);
    assert_int_equal(kvc_seq_slots(h.seqs, a, 0, 0, 1, slots), KVC_ESTALE);
    assert_int_equal(kvc_seq_blocks_needed(h.seqs, a, 1, &nb), KVC_ESTALE);
    kvc_seq_t bogus = {.slot = 99, .gen = 1};
    assert_int_equal(kvc_seq_destroy(h.seqs, bogus), KVC_ESTALE);
    assert_int_equal(kvc_seq_destroy(h.seqs, (kvc_seq_t){0, 0}), KVC_ESTALE);
    assert_int_equal(kvc_pool_n_free(h.pool), free_before);
    kvc_seqs_stats_t st;
    kvc_seqs_stats(h.seqs, &st);
    assert_true(st.n_stale >= 12); /* the mutating calls count; the read-only ones just refuse */
    /* the slot is reused under a new generation: the old handle still names nothing */
    kvc_seq_t b = harness_create(&h, t, 6);
    assert_int_equal(b.slot, a.slot);
    assert_int_not_equal(b.gen, a.gen);
    assert_false(kvc_seq_valid(h.seqs, a));
    assert_true(kvc_seq_valid(h.seqs, b));
    /* and no call through it reaches b, the slot's new owner */
    kvc_seq_info_t b_before, b_after;
    assert_ok(kvc_seq_info(h.seqs, b, &b_before));
    assert_int_equal(kvc_seq_append(h.seqs, a, t, 1), KVC_ESTALE);
    assert_int_equal(kvc_seq_reserve(h.seqs, a, 1, slots), KVC_ESTALE);
    assert_int_equal(kvc_seq_info(h.seqs, a, &info), KVC_ESTALE);
    assert_int_equal(kvc_seq_destroy(h.seqs, a), KVC_ESTALE);
    assert_true(kvc_seq_valid(h.seqs, b));
    assert_ok(kvc_seq_info(h.seqs, b, &b_after));
    assert_memory_equal(&b_before, &b_after, sizeof b_before);
    /* all slots taken */
    kvc_seq_t c = harness_create(&h, t, 6), d;
    kvc_seq_desc_t desc = {.prompt = t, .n_prompt = 6};
    assert_int_equal(kvc_seq_create(h.seqs, &desc, &d), KVC_ENOSPC);
    desc.n_prompt = 0;
    assert_int_equal(kvc_seq_create(h.seqs, &desc, &d), KVC_EINVAL);
    assert_ok(kvc_seq_destroy(h.seqs, c));
    assert_ok(kvc_seq_destroy(h.seqs, b));
    harness_check(&h);
    harness_free(&h);
}

static void create_rejects_bad_parameters_and_survives_faults(void **state)
{
    (void)state;
    kvc_pool_params_t pp = kvc_pool_params_default();
    pp.n_blocks = 8;
    kvc_pool_t *pool;
    assert_ok(kvc_pool_create(&pp, &pool));
    kvc_seqs_t *s = (kvc_seqs_t *)0x1;
    kvc_seqs_params_t sp = kvc_seqs_params_default();
    assert_int_equal(kvc_seqs_create(NULL, NULL, &sp, &s), KVC_EINVAL);
    sp.max_seqs = 0;
    assert_int_equal(kvc_seqs_create(pool, NULL, &sp, &s), KVC_EINVAL);
    sp = kvc_seqs_params_default();
    sp.n_groups = KVC_MAX_GROUPS + 1;
    assert_int_equal(kvc_seqs_create(pool, NULL, &sp, &s), KVC_EINVAL);
    sp = kvc_seqs_params_default();
    sp.window[2] = 8; /* a window for a group that does not exist */
    assert_int_equal(kvc_seqs_create(pool, NULL, &sp, &s), KVC_EINVAL);
    assert_null(s);
    for (uint64_t n = 1; n <= 12; n++) {
        kvc_failing_alloc_t fa = {.fail_at = n};
        sp = kvc_seqs_params_default();
        sp.max_seqs = 4;
        sp.allocator = kvc_failing_allocator(&fa);
        int rc = kvc_seqs_create(pool, NULL, &sp, &s);
        if (fa.n_failed) {
            assert_int_equal(rc, KVC_ENOMEM);
        } else {
            assert_ok(rc);
            /* and a sequence's arrays failing to grow changes nothing */
            kvc_token_t t[5] = {1, 2, 3, 4, 5};
            kvc_seq_desc_t d = {.prompt = t, .n_prompt = 5};
            kvc_seq_t q;
            fa.fail_at = fa.n_allocs + 1;
            fa.fail_after = true;
            assert_int_equal(kvc_seq_create(s, &d, &q), KVC_ENOMEM);
            fa.fail_at = 0;
            assert_ok(kvc_seq_create(s, &d, &q));
            fa.fail_at = fa.n_allocs + 1;
            assert_int_equal(kvc_seq_reserve(s, q, 5, NULL), KVC_ENOMEM);
            assert_int_equal(kvc_pool_n_free(pool), 8);
            fa.fail_at = 0;
            assert_ok(kvc_seq_reserve(s, q, 5, NULL));
            kvc_seqs_destroy(s);
        }
        assert_int_equal(fa.n_live, 0);
        assert_pool_ok(pool);
        assert_int_equal(kvc_pool_n_free(pool), 8);
    }
    kvc_seqs_destroy(NULL);
    kvc_pool_destroy(pool);
}

/* ---- prefix reuse -------------------------------------------------------------------- */
static void lookup_reuses_computed_prompts_and_keeps_the_last_token(void **state)
{
    (void)state;
    harness_t h;
    harness_init(&h, (harness_cfg_t){.n_blocks = 32, .bs = 4});
    kvc_token_t t[12];
    fill(t, 12, 100);
    kvc_seq_t a = harness_create(&h, t, 12);
    size_t hit = 99;
    assert_ok(kvc_seq_lookup(h.seqs, a, &hit));
    assert_int_equal(hit, 0);
    assert_int_equal(kvc_seq_lookup(h.seqs, a, &hit), KVC_EBUSY); /* once */
    assert_ok(harness_step(&h, a, 7));                            /* chunked prefill: 7 then 5 */
    assert_ok(harness_step(&h, a, 5));
    harness_check(&h);
    /* b has the same 12-token prompt: 2 blocks hit, the block holding the last token is
     * computed again (its copy is then found identical and shared) */
    kvc_seq_t b = harness_create(&h, t, 12);
    assert_ok(kvc_seq_lookup(h.seqs, b, &hit));
    assert_int_equal(hit, 8);
    kvc_seq_info_t info;
    assert_ok(kvc_seq_info(h.seqs, b, &info));
    assert_int_equal(info.n_computed, 8);
    assert_int_equal(info.n_reserved, 8);
    assert_int_equal(info.n_hit_tokens, 8);
    assert_ok(harness_step(&h, b, 4));
    harness_readback(&h, b, NULL);
    const uint32_t *ta, *tb;
    uint32_t na, nb;
    assert_ok(kvc_seq_table(h.seqs, a, 0, &ta, &na));
    assert_ok(kvc_seq_table(h.seqs, b, 0, &tb, &nb));
    assert_int_equal(na, 3);
    assert_int_equal(nb, 3);
    for (int i = 0; i < 3; i++) assert_int_equal(ta[i], tb[i]); /* all three shared */
    kvc_seqs_stats_t st;
    kvc_seqs_stats(h.seqs, &st);
    assert_int_equal(st.n_duplicates_shared, 1);
    assert_int_equal(st.n_hit_tokens, 8);
    harness_check(&h);
    harness_free(&h);
}

static void blocks_become_hittable_only_once_written_and_committed(void **state)
{
    (void)state;
    harness_t h;
    harness_init(&h, (harness_cfg_t){.n_blocks = 32, .bs = 4});
    kvc_token_t t[9];
    fill(t, 9, 1);
    kvc_seq_t a = harness_create(&h, t, 9);
    assert_ok(kvc_seq_reserve(h.seqs, a, 9, NULL)); /* the step is planned, not run */
    kvc_seq_t b = harness_create(&h, t, 9);
    size_t hit;
    assert_ok(kvc_seq_lookup(h.seqs, b, &hit));
    assert_int_equal(hit, 0); /* a's blocks hold no valid KV yet: not hittable */
    assert_ok(kvc_seq_complete(h.seqs, a, 9));
    kvc_seq_t c = harness_create(&h, t, 9);
    assert_ok(kvc_seq_lookup(h.seqs, c, &hit));
    assert_int_equal(hit, 8);
    /* drafts are never inserted, even when computed */
    kvc_token_t d[4] = {50, 51, 52, 53};
    kvc_token_t out = 40;
    assert_ok(kvc_seq_append(h.seqs, a, &out, 1));
    assert_ok(kvc_seq_draft(h.seqs, a, d, 4));
    assert_ok(harness_step(&h, a, 5)); /* verification computes out + 4 drafts: 14 tokens */
    kvc_prefix_stats_t ps;
    kvc_prefix_stats(h.pc, &ps);
    assert_int_equal(ps.n_cached_blocks, 2); /* blocks 0, 1 only; block 2 holds drafts */
    assert_ok(kvc_seq_accept(h.seqs, a, 3)); /* 12 committed tokens now: block 2 is full */
    kvc_prefix_stats(h.pc, &ps);
    assert_int_equal(ps.n_cached_blocks, 3);
    harness_check(&h);
    harness_free(&h);
}

/* ---- reservation ----------------------------------------------------------------------- */
static void reserve_maps_slots_and_is_all_or_nothing(void **state)
{
    (void)state;
    harness_t h;
    harness_init(&h, (harness_cfg_t){.n_blocks = 4, .bs = 4, .no_prefix = true});
    kvc_token_t t[20];
    fill(t, 20, 1);
    kvc_seq_t a = harness_create(&h, t, 10);
    uint32_t need;
    assert_ok(kvc_seq_blocks_needed(h.seqs, a, 10, &need));
    assert_int_equal(need, 3);
    int64_t slots[10];
    assert_ok(kvc_seq_reserve(h.seqs, a, 6, slots));
    const uint32_t *table;
    uint32_t nb;
    assert_ok(kvc_seq_table(h.seqs, a, 0, &table, &nb));
    assert_int_equal(nb, 2);
    for (int i = 0; i < 6; i++) assert_int_equal(slots[i], (int64_t)table[i / 4] * 4 + i % 4);
    int64_t again[6];
    assert_ok(kvc_seq_slots(h.seqs, a, 0, 0, 6, again));
    assert_memory_equal(again, slots, sizeof again);
    assert_int_equal(kvc_seq_slots(h.seqs, a, 0, 4, 3, again), KVC_ERANGE); /* 7 > reserved */
    assert_int_equal(kvc_seq_slots(h.seqs, a, 1, 0, 1, again), KVC_EINVAL); /* no group 1 */
    assert_ok(kvc_seq_blocks_needed(h.seqs, a, 4, &need));
    assert_int_equal(need, 1);
    assert_int_equal(kvc_seq_reserve(h.seqs, a, 5, slots), KVC_ERANGE); /* only 10 tokens known */
    assert_int_equal(kvc_seq_blocks_needed(h.seqs, a, 5, &need), KVC_ERANGE);
    /* another sequence takes the last two blocks: a cannot grow, and nothing changes */
    kvc_seq_t b = harness_create(&h, t, 8);
    assert_ok(kvc_seq_reserve(h.seqs, b, 8, NULL));
    kvc_seq_info_t before, after;
    assert_ok(kvc_seq_info(h.seqs, a, &before));
    assert_int_equal(kvc_seq_reserve(h.seqs, a, 4, slots), KVC_ENOSPC);
    assert_ok(kvc_seq_info(h.seqs, a, &after));
    assert_memory_equal(&before, &after, sizeof before);
    assert_ok(kvc_seq_reserve(h.seqs, a, 2, slots)); /* within its last block: no allocation */
    assert_ok(kvc_seq_reserve(h.seqs, a, 0, NULL));
    assert_int_equal(kvc_seq_complete(h.seqs, a, 9), KVC_ERANGE); /* only 8 reserved */
    assert_ok(kvc_seq_complete(h.seqs, a, 8));
    assert_int_equal(kvc_seq_append(h.seqs, a, NULL, 1), KVC_EINVAL);
    harness_check(&h);
    harness_free(&h);
}

static void csr_export_is_what_kernels_take(void **state)
{
    (void)state;
    harness_t h;
    harness_init(&h, (harness_cfg_t){.n_blocks = 16, .bs = 4, .no_prefix = true});
    kvc_token_t t[9];
    fill(t, 9, 1);
    kvc_seq_t a = harness_create(&h, t, 9), b = harness_create(&h, t, 4);
    assert_ok(harness_step(&h, a, 9));
    assert_ok(harness_step(&h, b, 4));
    kvc_seq_t rows[2] = {a, b};
    uint32_t indptr[3], indices[8], last[2];
    assert_ok(kvc_seqs_csr(h.seqs, rows, 2, 0, indptr, indices, 8, last));
    assert_int_equal(indptr[0], 0);
    assert_int_equal(indptr[1], 3);
    assert_int_equal(indptr[2], 4);
    assert_int_equal(last[0], 1); /* 9 tokens: 4 + 4 + 1 */
    assert_int_equal(last[1], 4);
    const uint32_t *ta;
    uint32_t na;
    assert_ok(kvc_seq_table(h.seqs, a, 0, &ta, &na));
    assert_memory_equal(indices, ta, 3 * sizeof(uint32_t));
    assert_int_equal(kvc_seqs_csr(h.seqs, rows, 2, 0, indptr, indices, 3, last), KVC_ERANGE);
    assert_ok(kvc_seq_destroy(h.seqs, b));
    assert_int_equal(kvc_seqs_csr(h.seqs, rows, 2, 0, indptr, indices, 8, last), KVC_ESTALE);
    harness_free(&h);
}

/* ---- forks and copy-on-write --------------------------------------------------------------- */
/* Parallel sampling: n samples after a prompt of `len` tokens; returns the copies made. */
static uint64_t parallel_sampling(uint32_t len, int n)
{
    harness_t h;
    harness_init(&h, (harness_cfg_t){.n_blocks = 64, .bs = 16});
    kvc_token_t t[64];
    fill(t, len, 1);
    kvc_seq_t s[8];
    s[0] = harness_create(&h, t, len);
    assert_ok(harness_step(&h, s[0], len));
    for (int i = 1; i < n; i++) assert_ok(kvc_seq_fork(h.seqs, s[0], &s[i]));
    harness_check(&h);
    for (int step = 0; step < 20; step++) {
        for (int i = 0; i < n; i++) {
            kvc_token_t out = 1000 * (i + 1) + step; /* each sample its own tokens */
            assert_ok(kvc_seq_append(h.seqs, s[i], &out, 1));
            assert_ok(harness_step(&h, s[i], 1));
            harness_check(&h);
        }
    }
    for (int i = 0; i < n; i++) harness_readback(&h, s[i], NULL);
    uint64_t copies = h.copies;
    kvc_seqs_stats_t st;
    kvc_seqs_stats(h.seqs, &st);
    assert_int_equal(st.n_cow_copies, copies);
    assert_int_equal(st.n_forks, (uint64_t)n - 1);
    harness_free(&h);
    return copies;
}

static void forks_copy_one_block_per_child_only_when_unaligned(void **state)
{
    (void)state;
    assert_int_equal(parallel_sampling(40, 4), 3); /* 40 % 16 != 0: one copy per child */
    assert_int_equal(parallel_sampling(48, 4), 0); /* aligned: none */
    assert_int_equal(parallel_sampling(17, 2), 1);
}

static void fork_refuses_pending_work(void **state)
{
    (void)state;
    harness_t h;
    harness_init(&h, (harness_cfg_t){.n_blocks = 16, .bs = 4});
    kvc_token_t t[6];
    fill(t, 6, 1);
    kvc_seq_t a = harness_create(&h, t, 6), c;
    assert_ok(kvc_seq_reserve(h.seqs, a, 3, NULL)); /* a step is planned */
    assert_int_equal(kvc_seq_fork(h.seqs, a, &c), KVC_EBUSY);
    assert_ok(kvc_seq_complete(h.seqs, a, 3));
    assert_int_equal(kvc_seq_fork(h.seqs, a, NULL), KVC_EINVAL);
    assert_ok(kvc_seq_fork(h.seqs, a, &c));
    kvc_token_t d = 9;
    assert_ok(kvc_seq_draft(h.seqs, a, &d, 1));
    kvc_seq_t c2;
    assert_int_equal(kvc_seq_fork(h.seqs, a, &c2), KVC_EBUSY);
    harness_check(&h);
    harness_free(&h);
}

/* ---- beam search ------------------------------------------------------------------------------
 */
typedef struct {
    kvc_token_t hist[512];
    size_t n;
} flat_beam_t; /* the reference: each beam's full history in its own flat array, no paging */

static void beam_search_matches_a_flat_reference(void **state)
{
    (void)state;
    kvc_rng_t r;
    kvc_rng_seed(&r, 99);
    const int runs = 40 / KVC_TEST_SANITIZER_DIVISOR + 2;
    for (int run = 0; run < runs; run++) {
        uint32_t bs = 1u << kvc_rng_below(&r, 4), width = 1 + (uint32_t)kvc_rng_below(&r, 6);
        harness_t h;
        harness_init(&h, (harness_cfg_t){.n_blocks = 512, .bs = bs, .max_seqs = 32});
        size_t plen = 1 + kvc_rng_below(&r, 30);
        kvc_token_t prompt[32];
        for (size_t i = 0; i < plen; i++) prompt[i] = (kvc_token_t)kvc_rng_below(&r, 50);
        kvc_seq_t beams[8], next[8];
        flat_beam_t ref[8], ref_next[8];
        beams[0] = harness_create(&h, prompt, plen);
        assert_ok(harness_step(&h, beams[0], (uint32_t)plen));
        memcpy(ref[0].hist, prompt, plen * sizeof(kvc_token_t));
        ref[0].n = plen;
        uint32_t n_beams = 1;
        for (int step = 0; step < 60; step++) {
            /* random survivors: parents with repetition, some beams dying */
            kvc_beam_choice_t ch[8];
            uint32_t n_choices = 1 + (uint32_t)kvc_rng_below(&r, width);
            for (uint32_t j = 0; j < n_choices; j++)
                ch[j] = (kvc_beam_choice_t){.parent = (uint32_t)kvc_rng_below(&r, n_beams),
                                            .token = (kvc_token_t)(100 + kvc_rng_below(&r, 1000))};
            int64_t slots[8];
            assert_ok(kvc_seq_beam_step(h.seqs, beams, n_beams, ch, n_choices, next, slots));
            for (uint32_t j = 0; j < n_choices; j++) {
                ref_next[j] = ref[ch[j].parent];
                ref_next[j].hist[ref_next[j].n++] = ch[j].token;
                h.kv[slots[j]] = ch[j].token; /* the forward pass writes each beam's KV */
                assert_ok(kvc_seq_complete(h.seqs, next[j], 1));
            }
            memcpy(beams, next, n_choices * sizeof(kvc_seq_t));
            memcpy(ref, ref_next, n_choices * sizeof(flat_beam_t));
            n_beams = n_choices;
            harness_check(&h);
            for (uint32_t j = 0; j < n_beams; j++) {
                const kvc_token_t *tok;
                size_t nt;
                assert_ok(kvc_seq_tokens(h.seqs, beams[j], &tok, &nt));
                assert_int_equal(nt, ref[j].n);
                assert_memory_equal(tok, ref[j].hist, nt * sizeof(kvc_token_t));
                harness_readback(&h, beams[j], NULL); /* reads back exactly its own history */
            }
            kvc_seqs_stats_t st;
            kvc_seqs_stats(h.seqs, &st);
            assert_int_equal(st.n_live, n_beams); /* dead beams are gone */
        }
        for (uint32_t j = 0; j < n_beams; j++) assert_ok(kvc_seq_destroy(h.seqs, beams[j]));
        harness_check(&h);
        harness_free(&h);
    }
}

static void dead_beams_are_freed_first_so_survivors_write_in_place(void **state)
{
    (void)state;
    harness_t h;
    harness_init(&h, (harness_cfg_t){.n_blocks = 32, .bs = 4});
    kvc_token_t t[6];
    fill(t, 6, 1);
    kvc_seq_t b0 = harness_create(&h, t, 6), beams[2], next[2];
    assert_ok(harness_step(&h, b0, 6));
    beams[0] = b0;
    assert_ok(kvc_seq_fork(h.seqs, b0, &beams[1])); /* two beams share a partial block */
    uint64_t before = h.copies;
    /* beam 1 dies, beam 0 continues alone: it is then the only holder, no copy */
    kvc_beam_choice_t ch[1] = {{.parent = 0, .token = 42}};
    assert_ok(kvc_seq_beam_step(h.seqs, beams, 2, ch, 1, next, NULL));
    assert_int_equal(h.copies, before);
    assert_false(kvc_seq_valid(h.seqs, beams[1]));
    assert_true(kvc_seq_eq(next[0], beams[0]));
    /* errors: a beam with pending work, a bad parent, a beam listed twice */
    assert_int_equal(kvc_seq_beam_step(h.seqs, next, 1, ch, 1, beams, NULL),
                     KVC_EBUSY); /* reserved */
    assert_ok(kvc_seq_complete(h.seqs, next[0], 1));
    kvc_beam_choice_t bad[1] = {{.parent = 3, .token = 1}};
    assert_int_equal(kvc_seq_beam_step(h.seqs, next, 1, bad, 1, beams, NULL), KVC_EINVAL);
    kvc_seq_t twice[2] = {next[0], next[0]};
    assert_int_equal(kvc_seq_beam_step(h.seqs, twice, 2, ch, 1, beams, NULL), KVC_EINVAL);
    harness_check(&h);
    harness_free(&h);
}

static void beam_memory_matches_the_worked_example(void **state)
{
    (void)state;
    /* 4 beams over a 1,000-token prompt, 200 generated tokens each, 128 KiB of KV per token
     * (e.g. 32 layers x 8 KV heads x 128 dims x 2 (K, V) x 2 bytes), block size 16: each beam
     * holds 1,200 tokens = 75 blocks of 2 MiB.  Unshared: 4 x 75 = 300 blocks = 600 MiB.  Shared
     * every block but the last: 74 + 4 = 78 blocks = 156 MiB. */
    kvc_storage_desc_t llama = {
        .n_layers = 32, .n_kv_heads = 8, .head_dim = 128, .dtype = KVC_DTYPE_BF16};
    size_t block_bytes;
    assert_ok(kvc_storage_block_bytes(&llama, 16, &block_bytes));
    assert_int_equal(block_bytes, 2u << 20);
    const size_t MiB = 1u << 20;

    harness_t h;
    harness_init(&h, (harness_cfg_t){.n_blocks = 400, .bs = 16, .no_prefix = true});
    kvc_token_t prompt[1000];
    fill(prompt, 1000, 1);
    /* unshared: four independent sequences with the same content */
    uint32_t free0 = kvc_pool_n_free(h.pool);
    kvc_seq_t solo[4];
    for (int b = 0; b < 4; b++) {
        solo[b] = harness_create(&h, prompt, 1000);
        assert_ok(harness_step(&h, solo[b], 1000));
        for (int i = 0; i < 200; i++) {
            kvc_token_t out = 5000 + i + (i >= 184 ? 1000 * b : 0);
            assert_ok(kvc_seq_append(h.seqs, solo[b], &out, 1));
            assert_ok(kvc_seq_reserve(h.seqs, solo[b], 1, NULL));
            if (i < 199) assert_ok(kvc_seq_complete(h.seqs, solo[b], 1));
        }
    }
    assert_int_equal((size_t)(free0 - kvc_pool_n_free(h.pool)) * block_bytes, 600 * MiB);
    for (int b = 0; b < 4; b++) assert_ok(kvc_seq_destroy(h.seqs, solo[b]));

    /* beam search: one beam until position 1,184, then four that diverge in the last block */
    kvc_seq_t beams[4], next[4];
    beams[0] = harness_create(&h, prompt, 1000);
    assert_ok(harness_step(&h, beams[0], 1000));
    uint32_t n_beams = 1;
    for (int i = 0; i < 200; i++) {
        kvc_beam_choice_t ch[4];
        uint32_t n_ch = i < 184 ? 1 : 4;
        for (uint32_t j = 0; j < n_ch; j++)
            ch[j] = (kvc_beam_choice_t){.parent = i == 184 ? 0 : j,
                                        .token = 5000 + i + (i >= 184 ? 1000 * (kvc_token_t)j : 0)};
        assert_ok(kvc_seq_beam_step(h.seqs, beams, n_beams, ch, n_ch, next, NULL));
        n_beams = n_ch;
        memcpy(beams, next, n_beams * sizeof(kvc_seq_t));
        if (i < 199)
            for (uint32_t j = 0; j < n_beams; j++) assert_ok(kvc_seq_complete(h.seqs, beams[j], 1));
    }
    harness_check(&h);
    assert_int_equal((size_t)(free0 - kvc_pool_n_free(h.pool)) * block_bytes, 156 * MiB);
    for (uint32_t j = 0; j < 4; j++) {
        kvc_seq_info_t info;
        assert_ok(kvc_seq_info(h.seqs, beams[j], &info));
        assert_int_equal(info.n_tokens, 1200);
        assert_int_equal(info.n_blocks[0], 75);
    }
    harness_free(&h);
}

/* ---- speculative decoding -----------------------------------------------------------------------
 */
typedef struct {
    harness_t h;
    kvc_seq_t s;
} spec_t;

/* A sequence after prefill of 10 tokens and one sampled token (position 10, not computed). */
static void spec_setup(spec_t *x, uint32_t bs)
{
    harness_init(&x->h, (harness_cfg_t){.n_blocks = 32, .bs = bs});
    kvc_token_t t[10];
    fill(t, 10, 1);
    x->s = harness_create(&x->h, t, 10);
    assert_ok(harness_step(&x->h, x->s, 10));
    kvc_token_t first = 500;
    assert_ok(kvc_seq_append(x->h.seqs, x->s, &first, 1));
    assert_ok(kvc_seq_emit(x->h.seqs, x->s, 1));
}

/* One verification: k drafts, the first `accept` accepted; then the bonus (if any) appended.
 * Returns the state after, compared against the same sequence built with no drafts at all. */
static void spec_round(spec_t *x, uint32_t k, uint32_t accept, bool bonus)
{
    kvc_token_t drafts[8], twin_tokens[64];
    for (uint32_t i = 0; i < k; i++) drafts[i] = 600 + (kvc_token_t)i;
    assert_ok(kvc_seq_draft(x->h.seqs, x->s, drafts, k));
    kvc_seq_info_t info;
    assert_ok(kvc_seq_info(x->h.seqs, x->s, &info));
    assert_int_equal(info.n_draft, k);
    assert_int_equal(kvc_seq_append(x->h.seqs, x->s, drafts, 1), KVC_EBUSY); /* drafts pending */
    /* the verification step computes the last sampled token and the k drafts */
    assert_ok(harness_step(&x->h, x->s, k + 1));
    assert_ok(kvc_seq_info(x->h.seqs, x->s, &info));
    if (k) assert_true(info.n_draft_blocks <= info.n_blocks[0]);
    assert_ok(kvc_seq_accept(x->h.seqs, x->s, accept));
    if (bonus) {
        kvc_token_t b = 700;
        assert_ok(kvc_seq_append(x->h.seqs, x->s, &b, 1));
    }
    harness_check(&x->h);
    /* exactly as if the rejected drafts had never been appended: a twin that only ever saw
     * the accepted tokens */
    const kvc_token_t *tok;
    size_t nt;
    assert_ok(kvc_seq_tokens(x->h.seqs, x->s, &tok, &nt));
    memcpy(twin_tokens, tok, nt * sizeof(kvc_token_t));
    kvc_seq_info_t mine;
    assert_ok(kvc_seq_info(x->h.seqs, x->s, &mine));
    harness_t t;
    harness_init(&t, (harness_cfg_t){.n_blocks = 32, .bs = x->h.bs});
    kvc_seq_t tw = harness_create(&t, twin_tokens, mine.n_prompt);
    assert_ok(harness_step(&t, tw, (uint32_t)mine.n_prompt));
    assert_ok(
        kvc_seq_append(t.seqs, tw, twin_tokens + mine.n_prompt, (uint32_t)(nt - mine.n_prompt)));
    assert_ok(harness_step(&t, tw, (uint32_t)(mine.n_computed - mine.n_prompt)));
    kvc_seq_info_t twin;
    assert_ok(kvc_seq_info(t.seqs, tw, &twin));
    assert_int_equal(mine.n_tokens, twin.n_tokens);
    assert_int_equal(mine.n_reserved, twin.n_reserved);
    assert_int_equal(mine.n_computed, twin.n_computed);
    assert_int_equal(mine.n_blocks[0], twin.n_blocks[0]);
    assert_int_equal(mine.n_draft, 0);
    assert_int_equal(mine.n_draft_blocks, 0);
    assert_int_equal(kvc_pool_n_free(x->h.pool), kvc_pool_n_free(t.pool));
    kvc_prefix_stats_t a, b;
    kvc_prefix_stats(x->h.pc, &a);
    kvc_prefix_stats(t.pc, &b);
    assert_int_equal(a.n_cached_blocks, b.n_cached_blocks);
    harness_free(&t);
    /* and the next forward pass reads only accepted state: reserve the next position, read */
    harness_readback(&x->h, x->s, NULL);
}

static void rejecting_every_draft_leaves_no_trace(void **state)
{
    (void)state;
    for (uint32_t bs = 1; bs <= 8; bs *= 2) {
        spec_t x;
        spec_setup(&x, bs);
        spec_round(&x, 5, 0, true);
        kvc_seq_info_t info;
        assert_ok(kvc_seq_info(x.h.seqs, x.s, &info));
        assert_int_equal(info.n_accepted, 0);
        assert_int_equal(info.n_tokens, 12); /* 10 prompt + first sample + bonus */
        kvc_seqs_stats_t st;
        kvc_seqs_stats(x.h.seqs, &st);
        assert_int_equal(st.n_rolled_back, 5);
        harness_free(&x.h);
    }
}

static void full_acceptance_keeps_every_draft_and_the_bonus(void **state)
{
    (void)state;
    spec_t x;
    spec_setup(&x, 4);
    spec_round(&x, 4, 4, true);
    kvc_seq_info_t info;
    assert_ok(kvc_seq_info(x.h.seqs, x.s, &info));
    assert_int_equal(info.n_accepted, 4);
    assert_int_equal(info.n_tokens, 16);
    assert_int_equal(info.n_computed, 15);
    assert_ok(kvc_seq_emit(x.h.seqs, x.s, 5));
    assert_int_equal(kvc_seq_emit(x.h.seqs, x.s, 1), KVC_ERANGE); /* 6 outputs, all emitted */
    harness_free(&x.h);
}

static void eos_inside_the_accepted_drafts_ends_there(void **state)
{
    (void)state;
    /* drafts 600..605 verified; 600, 601, 602 match, and 601 is EOS: the request ends after
     * 601.  The engine accepts 2, appends no bonus, emits 2, and finishes. */
    spec_t x;
    spec_setup(&x, 4);
    spec_round(&x, 6, 2, false);
    assert_ok(kvc_seq_emit(x.h.seqs, x.s, 2));
    kvc_seq_info_t info;
    assert_ok(kvc_seq_info(x.h.seqs, x.s, &info));
    assert_int_equal(info.n_tokens, 13);
    assert_int_equal(info.n_computed, 13); /* everything it has was computed: nothing dangling */
    assert_int_equal(info.n_emitted, 3);
    assert_int_equal(kvc_seq_emit(x.h.seqs, x.s, 1), KVC_ERANGE);
    assert_ok(kvc_seq_destroy(x.h.seqs, x.s));
    harness_check(&x.h);
    assert_int_equal(kvc_pool_n_free(x.h.pool), 32);
    harness_free(&x.h);
}

static void output_cap_inside_the_drafts_stops_there(void **state)
{
    (void)state;
    /* max_tokens = 4: one output already, so at most 3 more; 5 drafts all match, the engine
     * accepts only 3 and takes no bonus. */
    spec_t x;
    spec_setup(&x, 2);
    spec_round(&x, 5, 3, false);
    assert_ok(kvc_seq_emit(x.h.seqs, x.s, 3));
    kvc_seq_info_t info;
    assert_ok(kvc_seq_info(x.h.seqs, x.s, &info));
    assert_int_equal(info.n_emitted, 4);
    assert_int_equal(info.n_tokens - info.n_prompt, 4);
    harness_free(&x.h);
}

static void drafts_and_rollback_check_their_arguments(void **state)
{
    (void)state;
    spec_t x;
    spec_setup(&x, 4);
    kvc_token_t d[3] = {1, 2, 3};
    assert_int_equal(kvc_seq_rollback(x.h.seqs, x.s, 1), KVC_ERANGE); /* no drafts */
    assert_int_equal(kvc_seq_accept(x.h.seqs, x.s, 1), KVC_ERANGE);
    assert_ok(kvc_seq_draft(x.h.seqs, x.s, d, 3));
    assert_int_equal(kvc_seq_rollback(x.h.seqs, x.s, 4), KVC_ERANGE);
    assert_int_equal(kvc_seq_emit(x.h.seqs, x.s, 1), KVC_ERANGE); /* drafts cannot be emitted */
    assert_ok(kvc_seq_reserve(x.h.seqs, x.s, 4, NULL));
    assert_ok(kvc_seq_rollback(x.h.seqs, x.s, 2)); /* partial rollback, reservations follow */
    kvc_seq_info_t info;
    assert_ok(kvc_seq_info(x.h.seqs, x.s, &info));
    assert_int_equal(info.n_draft, 1);
    assert_int_equal(info.n_reserved, 12);
    assert_int_equal(info.n_blocks[0], 3);
    assert_ok(kvc_seq_draft(x.h.seqs, x.s, d, 0));
    harness_check(&x.h);
    harness_free(&x.h);
}

static void drafts_never_evict_cached_prefixes_for_slack(void **state)
{
    (void)state;
    /* 12 blocks of 8: a cached 8-block prefix and 4 uncached free blocks.  A short request runs
     * hundreds of draft rounds with random acceptance (restarted before its first block fills,
     * so its own blocks are never cached).  Drafts take exactly the blocks their positions
     * need, rolled-back blocks return to the head of the free queue and are reused first: the
     * cached prefix is never evicted. */
    harness_t h;
    harness_init(&h, (harness_cfg_t){.n_blocks = 12, .bs = 8});
    kvc_token_t sys[65];
    fill(sys, 65, 1000);
    kvc_seq_t warm = harness_create(&h, sys, 65);
    assert_ok(harness_step(&h, warm, 65));
    assert_ok(kvc_seq_destroy(h.seqs, warm));
    kvc_token_t t[2] = {1, 2}, out = 9;
    kvc_seq_t s = harness_create(&h, t, 2);
    assert_ok(harness_step(&h, s, 2));
    assert_ok(kvc_seq_append(h.seqs, s, &out, 1));
    kvc_rng_t r;
    kvc_rng_seed(&r, 5);
    uint64_t draft_block_rounds = 0;
    for (int round = 0; round < 400; round++) {
        kvc_token_t d[6] = {1, 2, 3, 4, 5, 6};
        uint32_t k = 1 + (uint32_t)kvc_rng_below(&r, 6), a = (uint32_t)kvc_rng_below(&r, k + 1);
        kvc_seq_info_t info;
        assert_ok(kvc_seq_info(h.seqs, s, &info));
        size_t committed_len = info.n_tokens;
        if (committed_len + a + 1 >= 8) a = (uint32_t)(6 - committed_len); /* stay in block 0 */
        assert_ok(kvc_seq_draft(h.seqs, s, d, k));
        uint32_t need;
        assert_ok(kvc_seq_blocks_needed(h.seqs, s, k + 1, &need));
        assert_int_equal(need,
                         (uint32_t)((info.n_tokens + k + 7) / 8 - info.n_blocks[0])); /* exact */
        assert_ok(harness_step(&h, s, k + 1));
        assert_ok(kvc_seq_info(h.seqs, s, &info));
        draft_block_rounds += info.n_draft_blocks > 0;
        assert_ok(kvc_seq_accept(h.seqs, s, a));
        kvc_token_t b = 7;
        assert_ok(kvc_seq_append(h.seqs, s, &b, 1));
        assert_ok(kvc_seq_info(h.seqs, s, &info));
        assert_int_equal(info.n_blocks[0], 1); /* the draft-only block went back */
        assert_int_equal(info.n_draft_blocks, 0);
        harness_check(&h);
        if (info.n_tokens >= 7) {
            assert_ok(kvc_seq_destroy(h.seqs, s));
            s = harness_create(&h, t, 2);
            assert_ok(harness_step(&h, s, 2));
            assert_ok(kvc_seq_append(h.seqs, s, &out, 1));
        }
    }
    assert_true(draft_block_rounds > 50); /* drafts did need blocks of their own, often */
    kvc_prefix_stats_t ps;
    kvc_prefix_stats(h.pc, &ps);
    assert_int_equal(ps.n_evictions, 0);
    kvc_seq_t again = harness_create(&h, sys, 65);
    size_t hit;
    assert_ok(kvc_seq_lookup(h.seqs, again, &hit));
    assert_int_equal(hit, 64); /* the whole cached prefix survived */
    harness_free(&h);
}

/* ---- sliding windows and hybrid models
 * ------------------------------------------------------------ */
static void sliding_window_gives_memory_back_as_it_slides(void **state)
{
    (void)state;
    uint32_t window[KVC_MAX_GROUPS] = {0, 16};
    harness_t h; /* group 0: full attention; group 1: sliding window of 16 tokens */
    harness_init(&h, (harness_cfg_t){.n_blocks = 128, .bs = 4, .n_groups = 2, .window = {0, 16}});
    kvc_token_t t[8];
    fill(t, 8, 1);
    kvc_seq_t s = harness_create(&h, t, 8);
    assert_ok(harness_step(&h, s, 8));
    uint32_t prev_free = kvc_pool_n_free(h.pool), rises = 0;
    for (int i = 0; i < 120; i++) {
        kvc_token_t out = 100 + i;
        assert_ok(kvc_seq_append(h.seqs, s, &out, 1));
        assert_ok(harness_step(&h, s, 1));
        harness_check(&h);
        harness_readback(&h, s, window);
        uint32_t free_now = kvc_pool_n_free(h.pool);
        rises += free_now > prev_free;
        prev_free = free_now;
    }
    kvc_seq_info_t info;
    assert_ok(kvc_seq_info(h.seqs, s, &info));
    assert_int_equal(info.n_computed, 128);
    assert_int_equal(info.n_blocks[0], 32); /* full attention keeps everything */
    assert_true(info.n_blocks[1] <= 5);     /* the window: 16 tokens, 4-5 blocks */
    assert_true(rises >= 20);               /* the free count actually rose, block after block */
    kvc_seqs_stats_t st;
    kvc_seqs_stats(h.seqs, &st);
    assert_true(st.n_window_released >= 27);
    /* the released blocks are free memory: 128 - 32 full - the window's - */
    assert_true(kvc_pool_n_free(h.pool) >= 128 - 32 - 5);
    /* CSR of the sliding group marks released blocks */
    uint32_t indptr[2], idx[64], last;
    assert_ok(kvc_seqs_csr(h.seqs, &s, 1, 1, indptr, idx, 64, &last));
    assert_int_equal(idx[0], KVC_NONE);
    harness_free(&h);
}

static void hybrid_hits_need_the_whole_prefix_and_the_last_window(void **state)
{
    (void)state;
    uint32_t window[KVC_MAX_GROUPS] = {0, 8};
    harness_t h;
    harness_init(&h, (harness_cfg_t){.n_blocks = 128, .bs = 4, .n_groups = 2, .window = {0, 8}});
    kvc_token_t t[41];
    fill(t, 41, 1);
    kvc_seq_t a = harness_create(&h, t, 40);
    assert_ok(harness_step(&h, a, 40)); /* 10 full blocks per group; sliding released 0..7 */
    kvc_seq_info_t info;
    assert_ok(kvc_seq_info(h.seqs, a, &info));
    assert_true(info.n_blocks[1] < 10);
    /* same prompt + 1 token: the full group has all 10 blocks, the sliding group only those of
     * the last window: a hit of 10 blocks (40 tokens) needs tokens 33..39 = blocks 8, 9 */
    kvc_seq_t b = harness_create(&h, t, 41);
    size_t hit;
    assert_ok(kvc_seq_lookup(h.seqs, b, &hit));
    assert_int_equal(hit, 40);
    assert_ok(harness_step(&h, b, 1));
    harness_readback(&h, b, window);
    const uint32_t *t1;
    uint32_t n1;
    assert_ok(kvc_seq_table(h.seqs, b, 1, &t1, &n1));
    assert_int_equal(t1[0], KVC_NONE);
    assert_int_not_equal(t1[8], KVC_NONE);
    /* the same 40 tokens, all cached: the hit still leaves the last token to compute */
    kvc_seq_t aligned = harness_create(&h, t, 40);
    assert_ok(kvc_seq_lookup(h.seqs, aligned, &hit));
    assert_int_equal(hit, 36);
    assert_ok(kvc_seq_destroy(h.seqs, aligned));
    /* Released sliding blocks stay cached (hittable) until their memory is needed: a prompt cut
     * to 26 tokens can still hit 6 blocks, whose window (tokens 17..23) a released. */
    kvc_seq_t c = harness_create(&h, t, 26);
    assert_ok(kvc_seq_lookup(h.seqs, c, &hit));
    assert_int_equal(hit, 24);
    assert_ok(kvc_seq_destroy(h.seqs, c));
    /* Once they are evicted, the full group could still hit 6 blocks, but the window of every
     * shorter hit is gone too (a hit of h blocks needs the sliding blocks before position 4h):
     * nothing hits but the empty prefix. */
    uint32_t n_evicted;
    assert_ok(kvc_prefix_evict(h.pc, 1000, &n_evicted));
    assert_true(n_evicted >= 8);
    c = harness_create(&h, t, 26);
    assert_ok(kvc_seq_lookup(h.seqs, c, &hit));
    assert_int_equal(hit, 0);
    harness_check(&h);
    harness_free(&h);
}

/* ---- the step contract
 * --------------------------------------------------------------------------- */
static void permuted_late_and_duplicate_completions_are_rejected(void **state)
{
    (void)state;
    harness_t h;
    harness_init(&h, (harness_cfg_t){.n_blocks = 32, .bs = 4, .max_seqs = 4});
    kvc_token_t t[5];
    fill(t, 5, 1);
    kvc_seq_t a = harness_create(&h, t, 5), b = harness_create(&h, t, 5);
    kvc_seq_t rows[2] = {a, b}, permuted[2] = {b, a};
    kvc_step_id_t id;
    assert_ok(kvc_step_launch(h.seqs, rows, 2, &id));
    bool live[2];
    assert_int_equal(kvc_step_complete(h.seqs, id, permuted, 2, live), KVC_ESTALE); /* permuted */
    assert_int_equal(kvc_step_complete(h.seqs, id, rows, 1, live), KVC_ESTALE); /* a row short */
    assert_int_equal(kvc_step_complete(h.seqs, id + 7, rows, 2, live), KVC_ESTALE); /* unknown */
    assert_int_equal(kvc_step_complete(h.seqs, 0, rows, 2, live), KVC_ESTALE);
    kvc_seq_info_t info;
    assert_ok(kvc_seq_info(h.seqs, a, &info));
    assert_int_equal(info.n_inflight, 1); /* the rejected completions changed nothing */
    assert_ok(kvc_step_complete(h.seqs, id, rows, 2, live));
    assert_true(live[0] && live[1]);
    assert_int_equal(kvc_step_complete(h.seqs, id, rows, 2, live), KVC_ESTALE); /* duplicate */
    kvc_seqs_stats_t st;
    kvc_seqs_stats(h.seqs, &st);
    assert_int_equal(st.n_rejected_completions, 5);
    /* launch checks: stale rows, the same row twice, too many steps in flight */
    kvc_seq_t twice[2] = {a, a};
    assert_int_equal(kvc_step_launch(h.seqs, twice, 2, &id), KVC_EINVAL);
    kvc_seq_t stale = {.slot = a.slot, .gen = a.gen + 5};
    assert_int_equal(kvc_step_launch(h.seqs, &stale, 1, &id), KVC_ESTALE);
    kvc_step_id_t ids[4];
    for (int i = 0; i < 4; i++) assert_ok(kvc_step_launch(h.seqs, &a, 1, &ids[i]));
    assert_int_equal(kvc_step_launch(h.seqs, &a, 1, &id), KVC_EBUSY);
    for (int i = 3; i >= 0; i--)
        assert_ok(kvc_step_complete(h.seqs, ids[i], &a, 1, NULL)); /* any order */
    harness_check(&h);
    harness_free(&h);
}

static void abort_during_a_step_defers_the_free_and_the_slot_reuse(void **state)
{
    (void)state;
    harness_t h;
    harness_init(&h, (harness_cfg_t){.n_blocks = 32, .bs = 4, .max_seqs = 2});
    kvc_token_t t[9];
    fill(t, 9, 1);
    kvc_seq_t a = harness_create(&h, t, 9);
    assert_ok(kvc_seq_reserve(h.seqs, a, 9, NULL));
    kvc_step_id_t id;
    assert_ok(kvc_step_launch(h.seqs, &a, 1, &id));
    uint32_t free_before = kvc_pool_n_free(h.pool);
    assert_ok(kvc_seq_destroy(h.seqs, a)); /* the client disconnected mid-step */
    assert_false(kvc_seq_valid(h.seqs, a));
    assert_int_equal(kvc_pool_n_free(h.pool), free_before); /* the kernel still writes them */
    kvc_seqs_stats_t st;
    kvc_seqs_stats(h.seqs, &st);
    assert_int_equal(st.n_zombies, 1);
    assert_int_equal(st.n_deferred, 1);
    /* a new request cannot take a's slot while the step is in flight */
    kvc_seq_t b = harness_create(&h, t, 9);
    assert_int_not_equal(b.slot, a.slot);
    kvc_seq_t c;
    kvc_seq_desc_t d = {.prompt = t, .n_prompt = 9};
    assert_int_equal(kvc_seq_create(h.seqs, &d, &c), KVC_ENOSPC);
    harness_check(&h);
    /* the completion arrives: a's row is reported dead, its blocks are freed now */
    bool live;
    assert_ok(kvc_step_complete(h.seqs, id, &a, 1, &live));
    assert_false(live);
    assert_int_equal(kvc_pool_n_free(h.pool), free_before + 3);
    kvc_seqs_stats(h.seqs, &st);
    assert_int_equal(st.n_zombies, 0);
    /* the slot is reused under a new generation; a's late duplicate completion cannot reach it */
    assert_ok(kvc_seq_create(h.seqs, &d, &c));
    assert_int_equal(c.slot, a.slot);
    assert_int_not_equal(c.gen, a.gen);
    assert_int_equal(kvc_step_complete(h.seqs, id, &a, 1, &live), KVC_ESTALE);
    assert_true(kvc_seq_valid(h.seqs, c));
    kvc_seq_info_t info;
    assert_ok(kvc_seq_info(h.seqs, c, &info));
    assert_int_equal(info.n_computed, 0);
    harness_check(&h);
    harness_free(&h);
}

/* ---- faults and caller mistakes: every operation is all or nothing ----------------------- */
/* The fault sweep: a scripted scenario runs once for every N with the seq table's Nth
 * allocation failing.  The operation that meets the failure must return KVC_ENOMEM and change
 * nothing (every handle the scenario ever held: validity, counts, tokens, tables; the pool's
 * free count; the checkers), and the same operation retried must then succeed; the scenario
 * then runs to its end and must read back exactly its own tokens, with nothing leaked. */
#define SW_MAXH   24
#define SW_MAXTOK 128

typedef struct {
    bool valid;
    kvc_seq_info_t info;
    size_t n_tok;
    kvc_token_t tok[SW_MAXTOK];
    uint32_t n_tab[KVC_MAX_GROUPS];
    uint32_t tab[KVC_MAX_GROUPS][SW_MAXTOK];
} snap_t;

typedef struct {
    kvc_token_t tok[SW_MAXTOK];
    size_t n;
} ref_tokens_t;

typedef struct sweep sweep_t;
struct sweep {
    harness_t h;
    kvc_failing_alloc_t fa;
    kvc_seq_t hs[SW_MAXH]; /* every handle the scenario has held, stale ones included */
    ref_tokens_t ref[SW_MAXH];
    int n_hs;
    int n_ops;
    /* the beam scenario */
    int beam[8], n_beams; /* indices into hs */
    int pending[8], n_pending;
    /* the lifecycle scenario */
    const char (*script)[3];
};

typedef struct {
    const char *name;
    harness_cfg_t cfg;
    void (*init)(sweep_t *w);
    int (*op)(sweep_t *w, int k);
} scenario_t;

static void snap_take(const sweep_t *w, snap_t *out)
{
    memset(out, 0, sizeof *out * SW_MAXH);
    for (int i = 0; i < w->n_hs; i++) {
        snap_t *o = &out[i];
        o->valid = kvc_seq_valid(w->h.seqs, w->hs[i]);
        if (!o->valid) continue;
        assert_ok(kvc_seq_info(w->h.seqs, w->hs[i], &o->info));
        const kvc_token_t *t;
        assert_ok(kvc_seq_tokens(w->h.seqs, w->hs[i], &t, &o->n_tok));
        assert_true(o->n_tok <= SW_MAXTOK);
        memcpy(o->tok, t, o->n_tok * sizeof *t);
        for (uint32_t g = 0; g < w->h.n_groups; g++) {
            const uint32_t *tab;
            assert_ok(kvc_seq_table(w->h.seqs, w->hs[i], g, &tab, &o->n_tab[g]));
            assert_true(o->n_tab[g] <= SW_MAXTOK);
            if (o->n_tab[g]) memcpy(o->tab[g], tab, o->n_tab[g] * sizeof *tab);
        }
    }
}

static int sw_add(sweep_t *w, kvc_seq_t s, const ref_tokens_t *ref)
{
    assert_true(w->n_hs < SW_MAXH);
    w->hs[w->n_hs] = s;
    w->ref[w->n_hs] = *ref;
    return w->n_hs++;
}

/* Reserve n slots of handle i and write its tokens there (the forward pass). */
static int sw_reserve(sweep_t *w, int i, uint32_t n)
{
    kvc_seq_info_t info;
    assert_ok(kvc_seq_info(w->h.seqs, w->hs[i], &info));
    int64_t slots[KVC_MAX_GROUPS * 16];
    assert_true(n <= 16);
    int rc = kvc_seq_reserve(w->h.seqs, w->hs[i], n, slots);
    if (rc) return rc;
    const kvc_token_t *tok;
    size_t nt;
    assert_ok(kvc_seq_tokens(w->h.seqs, w->hs[i], &tok, &nt));
    for (uint32_t g = 0; g < w->h.n_groups; g++)
        for (uint32_t j = 0; j < n; j++)
            w->h.kv[slots[(size_t)g * n + j]] = tok[info.n_reserved + j];
    return 0;
}

/* Beam search: a 7-token prompt, then beam steps of 1 to 4 random survivors (forks, deaths,
 * block boundaries, arrays growing), each new beam completed on its own. */
static void beams_init(sweep_t *w)
{
    w->n_ops = 3 + 40 * 5;
}

static int beams_op(sweep_t *w, int k)
{
    static const kvc_token_t prompt[7] = {5, 6, 7, 8, 9, 10, 11};
    if (k == 0) {
        kvc_seq_desc_t d = {.prompt = prompt, .n_prompt = 7};
        kvc_seq_t s;
        int rc = kvc_seq_create(w->h.seqs, &d, &s);
        if (rc) return rc;
        ref_tokens_t r = {.n = 7};
        memcpy(r.tok, prompt, sizeof prompt);
        w->beam[0] = sw_add(w, s, &r);
        w->n_beams = 1;
        return 0;
    }
    if (k == 1) return sw_reserve(w, w->beam[0], 7);
    if (k == 2) return kvc_seq_complete(w->h.seqs, w->hs[w->beam[0]], 7);
    if (w->n_pending) {
        int rc = kvc_seq_complete(w->h.seqs, w->hs[w->pending[w->n_pending - 1]], 1);
        if (!rc) w->n_pending--;
        return rc;
    }
    if (w->ref[w->beam[0]].n >= SW_MAXTOK - 1) return 0;
    kvc_rng_t r;
    kvc_rng_seed(&r, 1000 + (uint64_t)k); /* the same choices when the step is retried */
    kvc_beam_choice_t ch[4];
    uint32_t n_ch = 1 + (uint32_t)kvc_rng_below(&r, 4);
    kvc_seq_t beams[8], next[4];
    for (int j = 0; j < w->n_beams; j++) beams[j] = w->hs[w->beam[j]];
    for (uint32_t j = 0; j < n_ch; j++)
        ch[j] = (kvc_beam_choice_t){.parent = (uint32_t)kvc_rng_below(&r, (uint64_t)w->n_beams),
                                    .token = (kvc_token_t)(100 + kvc_rng_below(&r, 900))};
    int64_t slots[KVC_MAX_GROUPS * 4];
    int rc = kvc_seq_beam_step(w->h.seqs, beams, (uint32_t)w->n_beams, ch, n_ch, next, slots);
    if (rc) return rc;
    /* the dead beams are gone now: the scenario keeps the new beams only */
    ref_tokens_t nr[4];
    for (uint32_t j = 0; j < n_ch; j++) {
        nr[j] = w->ref[w->beam[ch[j].parent]];
        nr[j].tok[nr[j].n++] = ch[j].token;
        for (uint32_t g = 0; g < w->h.n_groups; g++)
            w->h.kv[slots[(size_t)g * n_ch + j]] = ch[j].token;
    }
    w->n_hs = 0;
    for (uint32_t j = 0; j < n_ch; j++) w->beam[j] = w->pending[j] = sw_add(w, next[j], &nr[j]);
    w->n_beams = (int)n_ch;
    w->n_pending = (int)n_ch;
    return 0;
}

/* A request's life: prefill in chunks, decode, a second request hitting the first's prefix, a
 * fork and its copy-on-write, drafts accepted and rolled back, a reset and recompute, destroys.
 * Ops are three characters: verb, handle, count. */
static const char lifecycle_script[][3] = {
    "c09", "l00", "r05", "m05", "r04", "m04",                      /* prefill 9 in two chunks */
    "p00", "r01", "m01", "p00", "r01", "m01", "p00", "r01", "m01", /* decode */
    "p00", "r01", "m01", "p00", "r01", "m01", "p00", "r01", "m01", "p00", "r01", "m01",
    "p00", "r01", "m01", "p00", "r01", "m01", "c19", "l10", "r11", "m11", /* hits a's prefix */
    "f02", "p20", "r21", "m21", "p20", "r21", "m21",                      /* fork, CoW */
    "p00", "d05", "r06", "m06", "A03", "p00",                             /* drafts, 3 accepted */
    "d04", "r05", "R04", "m01", "p00", "r01", "m01",                      /* all rejected */
    "p00", "r01", "m01", "p00", "r01", "m01", "p00", "r01", "m01", "p00", "r01", "m01",
    "p00", "r01", "m01", "p00", "r01", "m01", "p00", "r01", "m01", "p00", "r01", "m01",
    "p00", "r01", "m01", "p00", "r01", "m01", "p00", "r01", "m01", "p00", "r01", "m01",
    "p00", "d03", "r04", "m04", "A03", "p00", "r01", "m01",        /* all accepted, bonus */
    "x10", "l10", "r11", "m11", "p10", "r11", "m11", "p10", "d12", /* reset, recompute */
    "r13", "m13", "A11", "D20", "D00", "p10", "r11", "m11", "D10",
};

static void lifecycle_init(sweep_t *w)
{
    w->script = lifecycle_script;
    w->n_ops = (int)KVC_ARRAY_LEN(lifecycle_script);
}

static int lifecycle_op(sweep_t *w, int k)
{
    const char *o = w->script[k];
    int i = o[1] - '0', n = o[2] - '0';
    kvc_seqs_t *s = w->h.seqs;
    kvc_seq_t h = i < w->n_hs ? w->hs[i] : (kvc_seq_t){0, 0};
    ref_tokens_t *r = i < w->n_hs ? &w->ref[i] : NULL;
    kvc_token_t t[9];
    for (int j = 0; j < 9; j++) t[j] = (kvc_token_t)(500 + 10 * k + j);
    int rc = 0;
    switch (o[0]) {
    case 'c': { /* create handle i with the shared prompt 1..n */
        ref_tokens_t nr = {.n = (size_t)n};
        for (int j = 0; j < n; j++) nr.tok[j] = 1 + j;
        kvc_seq_desc_t d = {.prompt = nr.tok, .n_prompt = nr.n};
        kvc_seq_t q;
        if ((rc = kvc_seq_create(s, &d, &q))) return rc;
        assert_int_equal(sw_add(w, q, &nr), i);
        return 0;
    }
    case 'l':
        return kvc_seq_lookup(s, h, NULL);
    case 'r':
        return sw_reserve(w, i, (uint32_t)n);
    case 'm':
        return kvc_seq_complete(s, h, (uint32_t)n);
    case 'p':
        if ((rc = kvc_seq_append(s, h, t, 1))) return rc;
        r->tok[r->n++] = t[0];
        return 0;
    case 'd':
        if ((rc = kvc_seq_draft(s, h, t, (uint32_t)n))) return rc;
        memcpy(r->tok + r->n, t, (size_t)n * sizeof *t);
        r->n += (size_t)n; /* rolled back below, by A or R */
        return 0;
    case 'A': {
        kvc_seq_info_t info;
        assert_ok(kvc_seq_info(s, h, &info));
        if ((rc = kvc_seq_accept(s, h, (uint32_t)n))) return rc;
        r->n -= info.n_draft - (size_t)n;
        return 0;
    }
    case 'R':
        if ((rc = kvc_seq_rollback(s, h, (uint32_t)n))) return rc;
        r->n -= (size_t)n;
        return 0;
    case 'f': { /* fork handle i into handle n */
        kvc_seq_t c;
        if ((rc = kvc_seq_fork(s, h, &c))) return rc;
        assert_int_equal(sw_add(w, c, r), n);
        return 0;
    }
    case 'x':
        return kvc_seq_reset(s, h);
    case 'D':
        return kvc_seq_destroy(s, h);
    }
    fail_msg("bad op %s", o);
    return 0;
}

static uint64_t sweep_run(const scenario_t *sc)
{
    uint64_t recovered = 0;
    static sweep_t w;
    static snap_t before[SW_MAXH], after[SW_MAXH];
    for (uint64_t nth = 1;; nth++) {
        memset(&w, 0, sizeof w);
        harness_cfg_t cfg = sc->cfg;
        cfg.allocator = kvc_failing_allocator(&w.fa);
        harness_init(&w.h, cfg);
        sc->init(&w);
        w.fa.fail_at = w.fa.n_allocs + nth;
        for (int k = 0; k < w.n_ops; k++) {
            snap_take(&w, before);
            uint32_t free_before = kvc_pool_n_free(w.h.pool);
            uint64_t failed_before = w.fa.n_failed;
            int rc = sc->op(&w, k);
            if (w.fa.n_failed != failed_before && !rc)
                fail_msg("%s: op %d swallowed the failure of allocation %llu", sc->name, k,
                         (unsigned long long)nth);
            if (rc) {
                if (rc != KVC_ENOMEM || w.fa.n_failed == failed_before)
                    fail_msg("%s: op %d: %s with allocation %llu failing", sc->name, k,
                             kvc_strerror(rc), (unsigned long long)nth);
                snap_take(&w, after);
                for (int i = 0; i < w.n_hs; i++)
                    if (memcmp(&before[i], &after[i], sizeof before[i]))
                        fail_msg("%s: op %d failed (allocation %llu) but changed handle %d",
                                 sc->name, k, (unsigned long long)nth, i);
                assert_int_equal(kvc_pool_n_free(w.h.pool), free_before);
                harness_check(&w.h);
                recovered++;
                rc = sc->op(&w, k); /* the retry succeeds */
                if (rc)
                    fail_msg("%s: op %d retried after allocation %llu failed: %s", sc->name, k,
                             (unsigned long long)nth, kvc_strerror(rc));
            }
            harness_check(&w.h);
        }
        for (int i = 0; i < w.n_hs; i++) {
            if (!kvc_seq_valid(w.h.seqs, w.hs[i])) continue;
            const kvc_token_t *tok;
            size_t nt;
            assert_ok(kvc_seq_tokens(w.h.seqs, w.hs[i], &tok, &nt));
            assert_int_equal(nt, w.ref[i].n);
            assert_memory_equal(tok, w.ref[i].tok, nt * sizeof *tok);
            harness_readback(&w.h, w.hs[i], cfg.window);
        }
        bool hit = w.fa.n_failed > 0;
        harness_free(&w.h);
        assert_int_equal(w.fa.n_live, 0); /* nothing leaked */
        if (!hit) break;                  /* N is past the scenario's last allocation */
    }
    return recovered;
}

static void every_allocation_failure_is_all_or_nothing_and_recoverable(void **state)
{
    (void)state;
    const scenario_t scs[] = {
        {"lifecycle", {.n_blocks = 128, .bs = 2, .max_seqs = 8}, lifecycle_init, lifecycle_op},
        {"lifecycle-hybrid",
         {.n_blocks = 128, .bs = 2, .max_seqs = 8, .n_groups = 2, .window = {0, 3}},
         lifecycle_init,
         lifecycle_op},
        {"beams", {.n_blocks = 256, .bs = 2, .max_seqs = 16}, beams_init, beams_op},
        {"beams-hybrid",
         {.n_blocks = 256, .bs = 2, .max_seqs = 16, .n_groups = 2, .window = {0, 3}},
         beams_init,
         beams_op},
        {"beams-no-prefix",
         {.n_blocks = 256, .bs = 4, .max_seqs = 16, .no_prefix = true},
         beams_init,
         beams_op},
    };
    for (size_t i = 0; i < KVC_ARRAY_LEN(scs); i++) {
        uint64_t n = sweep_run(&scs[i]);
        print_message("fault sweep %s: %llu failed allocations, each refused cleanly and "
                      "retried\n",
                      scs[i].name, (unsigned long long)n);
        assert_true(n >= 10); /* the scenario does allocate, in many places */
    }
}

/* Everything a test can see of the whole table, to show that a failed call changed nothing. */
typedef struct {
    snap_t s[SW_MAXH];
    uint32_t n_free;
    kvc_seqs_stats_t st;
} world_snap_t;

static void world_take(const harness_t *h, const kvc_seq_t *hs, int n, world_snap_t *out)
{
    static sweep_t w;
    w.h = *h;
    w.n_hs = n;
    memcpy(w.hs, hs, (size_t)n * sizeof *hs);
    snap_take(&w, out->s);
    out->n_free = kvc_pool_n_free(h->pool);
    kvc_seqs_stats(h->seqs, &out->st);
    out->st.n_stale = 0; /* refused calls are counted; that is all they change */
}

static void world_same(const harness_t *h, const kvc_seq_t *hs, int n, const world_snap_t *before,
                       bool check)
{
    static world_snap_t now;
    world_take(h, hs, n, &now);
    for (int i = 0; i < n; i++)
        if (memcmp(&now.s[i], &before->s[i], sizeof now.s[i]))
            fail_msg("handle %d changed by a failed call", i);
    assert_int_equal(now.n_free, before->n_free);
    assert_memory_equal(&now.st, &before->st, sizeof now.st);
    if (check) harness_check(h);
}

static void beam_step_out_of_blocks_changes_nothing(void **state)
{
    (void)state;
    /* Two beams at a block boundary, each continued twice: 4 new blocks needed.  The dead third
     * beam's block would make 3 free, not enough.  Before: the dead beam was destroyed anyway. */
    harness_t h;
    harness_init(&h, (harness_cfg_t){.n_blocks = 8, .bs = 4});
    kvc_token_t t[8];
    fill(t, 8, 1);
    kvc_seq_t b[3], next[4];
    b[0] = harness_create(&h, t, 8);
    assert_ok(harness_step(&h, b[0], 8));
    kvc_token_t u[4] = {50, 51, 52, 53};
    b[1] = harness_create(&h, u, 4);
    assert_ok(harness_step(&h, b[1], 4));
    b[2] = harness_create(&h, t, 3); /* its own (uncached) partial block */
    assert_ok(harness_step(&h, b[2], 3));
    kvc_token_t f[8];
    fill(f, 8, 300);
    kvc_seq_t filler = harness_create(&h, f, 8); /* keeps the pool at 2 free blocks */
    assert_ok(harness_step(&h, filler, 8));
    assert_int_equal(kvc_pool_n_free(h.pool), 2);
    kvc_beam_choice_t ch[4] = {{0, 60}, {0, 61}, {1, 62}, {1, 63}};
    static world_snap_t snap;
    kvc_seq_t all[4] = {b[0], b[1], b[2], filler};
    world_take(&h, all, 4, &snap);
    assert_int_equal(kvc_seq_beam_step(h.seqs, b, 3, ch, 4, next, NULL), KVC_ENOSPC);
    assert_true(kvc_seq_valid(h.seqs, b[2])); /* the dead beam is still there */
    world_same(&h, all, 4, &snap, true);
    /* with the filler gone the step fits, and the dead beam goes */
    assert_ok(kvc_seq_destroy(h.seqs, filler));
    assert_ok(kvc_seq_beam_step(h.seqs, b, 3, ch, 4, next, NULL));
    assert_false(kvc_seq_valid(h.seqs, b[2]));
    harness_check(&h);
    harness_free(&h);
}

static void beam_step_refused_by_the_evictor_changes_nothing(void **state)
{
    (void)state;
    /* The only free blocks: x2 (uncached) and x0, cached, whose cached child x1 the caller
     * still pins, so the evictor refuses x0.  Two beams at a block boundary need two blocks:
     * KVC_EBUSY.  Before: the first beam had already appended and reserved. */
    harness_t h;
    harness_init(&h, (harness_cfg_t){.n_blocks = 8, .bs = 4});
    kvc_token_t x[9], t[8], f[12];

    fill(x, 9, 1);
    fill(t, 8, 100);
    fill(f, 12, 200);
    kvc_seq_t xs = harness_create(&h, x, 9);
    assert_ok(harness_step(&h, xs, 9));
    const uint32_t *xt;
    uint32_t xn;
    assert_ok(kvc_seq_table(h.seqs, xs, 0, &xt, &xn));
    uint32_t x1 = xt[1];
    assert_ok(kvc_pool_ref(h.pool, x1)); /* the caller pins x1 (a tier copying it out, say) */
    kvc_seq_t b[2], next[2];
    b[0] = harness_create(&h, t, 8);
    assert_ok(harness_step(&h, b[0], 8));
    assert_ok(kvc_seq_fork(h.seqs, b[0], &b[1]));
    kvc_seq_t filler = harness_create(&h, f, 12);
    assert_ok(harness_step(&h, filler, 12));
    assert_ok(kvc_seq_destroy(h.seqs, xs));
    assert_int_equal(kvc_pool_n_free(h.pool), 2);
    kvc_beam_choice_t ch[2] = {{0, 7}, {1, 8}};
    static world_snap_t snap;
    kvc_seq_t all[3] = {b[0], b[1], filler};
    world_take(&h, all, 3, &snap);
    assert_int_equal(kvc_seq_beam_step(h.seqs, b, 2, ch, 2, next, NULL), KVC_EBUSY);
    world_same(&h, all, 3, &snap, false); /* kvc_seqs_check would count the pin as a leak */
    assert_prefix_ok(h.pc);
    assert_ok(kvc_pool_unref(h.pool, x1)); /* released: x1, then x0, can be evicted */
    assert_ok(kvc_seq_beam_step(h.seqs, b, 2, ch, 2, next, NULL));
    for (int j = 0; j < 2; j++) assert_ok(kvc_seq_complete(h.seqs, next[j], 1));
    harness_check(&h);
    harness_free(&h);
}

static void beam_step_counts_only_the_slots_dead_beams_really_free(void **state)
{
    (void)state;
    /* Two slots; beam 1 dies while a step over it is in flight, so its slot stays taken until
     * that step completes, and beam 0's second child has nowhere to go.  Before: the slot count
     * included it, fork_into failed and KVC_ASSERT aborted the process. */
    harness_t h;
    harness_init(&h, (harness_cfg_t){.n_blocks = 16, .bs = 4, .max_seqs = 2});
    kvc_token_t t[6];
    fill(t, 6, 1);
    kvc_seq_t b[2], next[2];
    b[0] = harness_create(&h, t, 6);
    assert_ok(harness_step(&h, b[0], 6));
    assert_ok(kvc_seq_fork(h.seqs, b[0], &b[1]));
    kvc_step_id_t id;
    assert_ok(kvc_step_launch(h.seqs, &b[1], 1, &id));
    kvc_beam_choice_t ch[2] = {{0, 40}, {0, 41}};
    static world_snap_t snap;
    world_take(&h, b, 2, &snap);
    assert_int_equal(kvc_seq_beam_step(h.seqs, b, 2, ch, 2, next, NULL), KVC_ENOSPC);
    world_same(&h, b, 2, &snap, true);
    /* one child only: beam 1 dies in flight, a zombie until its step completes */
    assert_ok(kvc_seq_beam_step(h.seqs, b, 2, ch, 1, next, NULL));
    kvc_seqs_stats_t st;
    kvc_seqs_stats(h.seqs, &st);
    assert_int_equal(st.n_zombies, 1);
    harness_check(&h);
    bool live;
    assert_ok(kvc_step_complete(h.seqs, id, &b[1], 1, &live));
    assert_false(live);
    assert_ok(kvc_seq_complete(h.seqs, next[0], 1));
    kvc_beam_choice_t ch2[2] = {{0, 42}, {0, 43}}; /* now the slot is free */
    kvc_seq_t next2[2];
    assert_ok(kvc_seq_beam_step(h.seqs, next, 1, ch2, 2, next2, NULL));
    harness_check(&h);
    harness_free(&h);
}

static void windows_must_agree_with_the_prefix_cache(void **state)
{
    (void)state;
    kvc_pool_params_t pp = kvc_pool_params_default();
    pp.n_blocks = 32;
    pp.block_size = 4;
    kvc_pool_t *pool, *other;
    assert_ok(kvc_pool_create(&pp, &pool));
    assert_ok(kvc_pool_create(&pp, &other));
    kvc_prefix_params_t cp = kvc_prefix_params_default();
    cp.group_window[1] = 8;
    kvc_prefix_t *pc;
    assert_ok(kvc_prefix_create(pool, &cp, &pc));
    kvc_seqs_t *s = NULL;
    kvc_seqs_params_t sp = kvc_seqs_params_default();
    sp.n_groups = 2;
    assert_int_equal(kvc_seqs_create(pool, pc, &sp, &s), KVC_EINVAL); /* 0 here, 8 there */
    sp.window[1] = 4;
    assert_int_equal(kvc_seqs_create(pool, pc, &sp, &s), KVC_EINVAL); /* 4 here, 8 there */
    sp.window[0] = 8;
    sp.window[1] = 8;
    assert_int_equal(kvc_seqs_create(pool, pc, &sp, &s), KVC_EINVAL); /* 8 here, 0 there */
    assert_null(s);
    sp.window[0] = 0;
    assert_int_equal(kvc_seqs_create(other, pc, &sp, &s), KVC_EINVAL); /* another pool's cache */
    assert_ok(kvc_seqs_create(pool, pc, &sp, &s));
    /* the table works: a sequence's full-attention table has no holes */
    kvc_token_t t[40];
    fill(t, 40, 1);
    kvc_seq_desc_t d = {.prompt = t, .n_prompt = 40};
    kvc_seq_t q;
    assert_ok(kvc_seq_create(s, &d, &q));
    assert_ok(kvc_seq_reserve(s, q, 40, NULL));
    assert_ok(kvc_seq_complete(s, q, 40));
    char msg[256];
    if (kvc_seqs_check(s, msg, sizeof msg)) fail_msg("%s", msg);
    kvc_seqs_destroy(s);
    /* without a prefix cache any windows go */
    sp.window[0] = 16;
    assert_ok(kvc_seqs_create(other, NULL, &sp, &s));
    kvc_seqs_destroy(s);
    kvc_prefix_destroy(pc);
    kvc_pool_destroy(pool);
    kvc_pool_destroy(other);
}

static void empty_arguments_are_no_ops(void **state)
{
    (void)state;
    /* n = 0 with a NULL array, a fork of a sequence with no blocks yet, a sequence with no
     * blocks in a CSR batch, a step over no rows: before, each passed NULL to memcpy (UBSan). */
    harness_t h;
    harness_init(&h, (harness_cfg_t){.n_blocks = 16, .bs = 4});
    kvc_token_t t[3] = {1, 2, 3};
    kvc_seq_t a = harness_create(&h, t, 3), c;
    assert_ok(kvc_seq_append(h.seqs, a, NULL, 0));
    assert_ok(kvc_seq_draft(h.seqs, a, NULL, 0));
    assert_int_equal(kvc_seq_draft(h.seqs, a, NULL, 1), KVC_EINVAL);
    assert_ok(kvc_seq_fork(h.seqs, a, &c)); /* nothing reserved: nothing shared */
    uint32_t indptr[3], last[2];
    kvc_seq_t rows[2] = {a, c};
    assert_ok(kvc_seqs_csr(h.seqs, rows, 2, 0, indptr, NULL, 0, last));
    assert_int_equal(indptr[2], 0);
    kvc_step_id_t id;
    assert_ok(kvc_step_launch(h.seqs, NULL, 0, &id));
    assert_ok(kvc_step_complete(h.seqs, id, NULL, 0, NULL));
    kvc_seq_t none[1];
    assert_ok(kvc_seq_beam_step(h.seqs, NULL, 0, NULL, 0, none, NULL));
    assert_ok(harness_step(&h, c, 3));
    harness_readback(&h, c, NULL);
    harness_check(&h);
    harness_free(&h);
}

static void a_block_the_caller_unrefd_is_an_error_not_an_abort(void **state)
{
    (void)state;
    /* The caller drops a reference one of a's tables owns (kvc_pool_unref on its block).
     * Releasing a would free that block twice: destroy, reset and rollback refuse with
     * KVC_EUNDERFLOW and change nothing.  Before: KVC_ASSERT aborted the process. */
    uint32_t window[KVC_MAX_GROUPS] = {0, 64};
    harness_t h;
    harness_init(&h, (harness_cfg_t){.n_blocks = 32, .bs = 4, .n_groups = 2, .window = {0, 64}});
    kvc_token_t t[10];
    fill(t, 10, 1);
    kvc_seq_t a = harness_create(&h, t, 10);
    assert_ok(harness_step(&h, a, 10));
    kvc_token_t d[4] = {70, 71, 72, 73}, out = 60;
    assert_ok(kvc_seq_append(h.seqs, a, &out, 1));
    assert_ok(kvc_seq_draft(h.seqs, a, d, 4)); /* positions 10..14: a new block, 3 */
    assert_ok(kvc_seq_reserve(h.seqs, a, 5, NULL));
    const uint32_t *t1;
    uint32_t n1;
    assert_ok(kvc_seq_table(h.seqs, a, 1, &t1, &n1)); /* the second group: the first is fine */
    assert_int_equal(n1, 4);
    uint32_t victim = t1[3];
    static world_snap_t snap;
    world_take(&h, &a, 1, &snap);
    assert_ok(kvc_pool_unref(h.pool, victim)); /* the caller's mistake */
    uint32_t free_before = kvc_pool_n_free(h.pool);
    assert_int_equal(kvc_seq_rollback(h.seqs, a, 4), KVC_EUNDERFLOW);
    assert_int_equal(kvc_seq_accept(h.seqs, a, 0), KVC_EUNDERFLOW);
    assert_int_equal(kvc_seq_reset(h.seqs, a), KVC_EUNDERFLOW);
    assert_int_equal(kvc_seq_destroy(h.seqs, a), KVC_EUNDERFLOW);
    assert_true(kvc_seq_valid(h.seqs, a));
    assert_int_equal(kvc_pool_n_free(h.pool), free_before);
    assert_pool_ok(h.pool);
    assert_ok(kvc_pool_ref(h.pool, victim)); /* the caller puts it back: all works again */
    world_same(&h, &a, 1, &snap, true);
    assert_ok(kvc_seq_rollback(h.seqs, a, 4));
    for (uint32_t g = 0; g < 2; g++) { /* the step writes the sampled token's KV */
        int64_t slot;
        assert_ok(kvc_seq_slots(h.seqs, a, g, 10, 1, &slot));
        h.kv[slot] = out;
    }
    assert_ok(kvc_seq_complete(h.seqs, a, 1));
    harness_readback(&h, a, window);
    /* a destroy deferred by a step in flight refuses too; so does one after it */
    assert_ok(kvc_seq_table(h.seqs, a, 0, &t1, &n1));
    victim = t1[0];
    kvc_step_id_t id;
    assert_ok(kvc_step_launch(h.seqs, &a, 1, &id));
    assert_ok(kvc_pool_unref(h.pool, victim));
    assert_int_equal(kvc_seq_destroy(h.seqs, a), KVC_EUNDERFLOW);
    assert_true(kvc_seq_valid(h.seqs, a));
    assert_ok(kvc_pool_ref(h.pool, victim));
    assert_ok(kvc_seq_destroy(h.seqs, a));
    /* the caller unrefs again while the step is in flight: the deferred free skips that block
     * (it is free already) and frees the rest, never one block twice */
    assert_ok(kvc_pool_unref(h.pool, victim));
    assert_ok(kvc_step_complete(h.seqs, id, &a, 1, NULL));
    assert_int_equal(kvc_pool_n_free(h.pool), 32);
    assert_pool_ok(h.pool);
    harness_check(&h);
    /* and the whole table, destroyed with a broken sequence in it, frees each block once */
    kvc_seq_t b = harness_create(&h, t, 10);
    assert_ok(harness_step(&h, b, 10));
    assert_ok(kvc_seq_table(h.seqs, b, 0, &t1, &n1));
    assert_ok(kvc_pool_unref(h.pool, t1[2]));
    kvc_seqs_destroy(h.seqs);
    h.seqs = NULL;
    assert_int_equal(kvc_pool_n_free(h.pool), 32);
    assert_pool_ok(h.pool);
    harness_free(&h);
}

/* One request through seq's path: look up, compute the rest, complete, finish. */
static void run_with_priority(kvc_seqs_t *seqs, const kvc_token_t *t, size_t n, uint32_t prio)
{
    kvc_seq_desc_t d = {.prompt = t, .n_prompt = n, .priority = prio};
    kvc_seq_t a;
    size_t hit;
    assert_ok(kvc_seq_create(seqs, &d, &a));
    assert_ok(kvc_seq_lookup(seqs, a, &hit));
    assert_ok(kvc_seq_reserve(seqs, a, (uint32_t)(n - hit), NULL));
    assert_ok(kvc_seq_complete(seqs, a, (uint32_t)(n - hit)));
    assert_ok(kvc_seq_destroy(seqs, a));
}

static void a_requests_priority_reaches_the_prefix_cache(void **state)
{
    (void)state;
    /* Under the priority eviction policy a request's blocks are kept by its priority.  Before,
     * kvc_seq_desc_t had no priority and every query seq made said 0: the policy was LRU. */
    for (int routed = 0; routed < 2; routed++) {
        kvc_pool_params_t pp = kvc_pool_params_default();
        pp.n_blocks = 8;
        pp.block_size = 4;
        kvc_prefix_params_t cp = kvc_prefix_params_default();
        cp.eviction = KVC_EVICT_PRIORITY;
        kvc_seqs_params_t sp = kvc_seqs_params_default();
        kvc_pool_t *pool;
        kvc_prefix_t *pc;
        kvc_seqs_t *seqs;
        assert_ok(kvc_pool_create(&pp, &pool));
        assert_ok(kvc_prefix_create(pool, &cp, &pc));
        assert_ok(kvc_seqs_create(pool, pc, &sp, &seqs));
        kvc_token_t sys[14], a[14], b[14];
        fill(sys, 14, 1);
        fill(a, 14, 300);
        fill(b, 14, 500);
        run_with_priority(seqs, sys, 14, routed ? 9 : 0); /* 3 blocks cached, first */
        run_with_priority(seqs, a, 14, 0);                /* 3 more: 2 free blocks left */
        run_with_priority(seqs, b, 14, 0);                /* evicts 2 cached blocks */
        kvc_prefix_query_t q = {.tokens = sys, .n_tokens = 14};
        kvc_prefix_hit_t hit;
        assert_ok(kvc_prefix_match(pc, &q, NULL, 0, NULL, &hit));
        /* at priority 9 the system prompt outlives the priority-0 blocks; at 0 its tail is
         * the least recently used and goes */
        assert_int_equal(hit.n_hit_blocks, routed ? 3 : 1);
        /* a priority the cache cannot rank is refused, even before a block is full to hash */
        kvc_seq_desc_t d = {.prompt = sys, .n_prompt = 3, .priority = KVC_PREFIX_MAX_PRIORITY + 1};
        kvc_seq_t h;
        assert_int_equal(kvc_seq_create(seqs, &d, &h), KVC_EINVAL);
        d.priority = KVC_PREFIX_MAX_PRIORITY;
        assert_ok(kvc_seq_create(seqs, &d, &h));
        assert_ok(kvc_seq_destroy(seqs, h));
        char msg[256];
        assert_int_equal(kvc_seqs_check(seqs, msg, sizeof msg), 0);
        kvc_seqs_destroy(seqs);
        kvc_prefix_destroy(pc);
        kvc_pool_destroy(pool);
    }
}

static void multimodal_inputs_are_checked_whole_at_create(void **state)
{
    (void)state;
    /* 5 images in the prompt's last, partial block: one more than a block's extra keys hold.
     * Before: create accepted it, and the append that filled the block failed with KVC_ERANGE
     * after appending (and every later append failed too). */
    harness_t h;
    harness_init(&h, (harness_cfg_t){.n_blocks = 16, .bs = 8});
    kvc_token_t t[14];
    fill(t, 14, 1);
    kvc_mm_input_t mm[5];
    for (int i = 0; i < 5; i++)
        mm[i] = (kvc_mm_input_t){
            .hash = {.lo = 1 + (uint64_t)i}, .start = 9 + (uint64_t)i, .length = 1};
    kvc_seq_desc_t d = {.prompt = t, .n_prompt = 14, .mm = mm, .n_mm = 5};
    kvc_seq_t a;
    assert_int_equal(kvc_seq_create(h.seqs, &d, &a), KVC_ERANGE);
    d.n_mm = 4; /* four fit */
    assert_ok(kvc_seq_create(h.seqs, &d, &a));
    assert_ok(harness_step(&h, a, 14));
    kvc_token_t out[3] = {90, 91, 92};
    assert_ok(kvc_seq_append(h.seqs, a, out, 2)); /* fills block 1: hashed, cached */
    assert_ok(harness_step(&h, a, 2));
    kvc_prefix_stats_t ps;
    kvc_prefix_stats(h.pc, &ps);
    assert_int_equal(ps.n_cached_blocks, 2);
    /* an input reaching past the prompt is not in the prompt */
    mm[0] = (kvc_mm_input_t){.hash = {.lo = 9}, .start = 12, .length = 3};
    d.n_mm = 1;
    kvc_seq_t b;
    assert_int_equal(kvc_seq_create(h.seqs, &d, &b), KVC_EINVAL);
    mm[0].start = UINT64_MAX - 1; /* start + length wraps */
    assert_int_equal(kvc_seq_create(h.seqs, &d, &b), KVC_EINVAL);
    harness_check(&h);
    harness_free(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(stale_handles_are_refused_and_change_nothing),
        cmocka_unit_test(create_rejects_bad_parameters_and_survives_faults),
        cmocka_unit_test(lookup_reuses_computed_prompts_and_keeps_the_last_token),
        cmocka_unit_test(blocks_become_hittable_only_once_written_and_committed),
        cmocka_unit_test(reserve_maps_slots_and_is_all_or_nothing),
        cmocka_unit_test(csr_export_is_what_kernels_take),
        cmocka_unit_test(forks_copy_one_block_per_child_only_when_unaligned),
        cmocka_unit_test(fork_refuses_pending_work),
        cmocka_unit_test(beam_search_matches_a_flat_reference),
        cmocka_unit_test(dead_beams_are_freed_first_so_survivors_write_in_place),
        cmocka_unit_test(beam_memory_matches_the_worked_example),
        cmocka_unit_test(rejecting_every_draft_leaves_no_trace),
        cmocka_unit_test(full_acceptance_keeps_every_draft_and_the_bonus),
        cmocka_unit_test(eos_inside_the_accepted_drafts_ends_there),
        cmocka_unit_test(output_cap_inside_the_drafts_stops_there),
        cmocka_unit_test(drafts_and_rollback_check_their_arguments),
        cmocka_unit_test(drafts_never_evict_cached_prefixes_for_slack),
        cmocka_unit_test(sliding_window_gives_memory_back_as_it_slides),
        cmocka_unit_test(hybrid_hits_need_the_whole_prefix_and_the_last_window),
        cmocka_unit_test(permuted_late_and_duplicate_completions_are_rejected),
        cmocka_unit_test(abort_during_a_step_defers_the_free_and_the_slot_reuse),
        cmocka_unit_test(every_allocation_failure_is_all_or_nothing_and_recoverable),
        cmocka_unit_test(beam_step_out_of_blocks_changes_nothing),
        cmocka_unit_test(beam_step_refused_by_the_evictor_changes_nothing),
        cmocka_unit_test(beam_step_counts_only_the_slots_dead_beams_really_free),
        cmocka_unit_test(windows_must_agree_with_the_prefix_cache),
        cmocka_unit_test(empty_arguments_are_no_ops),
        cmocka_unit_test(a_block_the_caller_unrefd_is_an_error_not_an_abort),
        cmocka_unit_test(multimodal_inputs_are_checked_whole_at_create),
        cmocka_unit_test(a_requests_priority_reaches_the_prefix_cache),
    };
    /* SEQ_TEST_FILTER=pattern runs the matching tests only (the mutation script uses it) */
    const char *filter = getenv("SEQ_TEST_FILTER");
    if (filter) cmocka_set_test_filter(filter);
    return cmocka_run_group_tests_name("seq", tests, NULL, NULL);
}
