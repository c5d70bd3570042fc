/* test_integration.c - the layers together, on real bytes.
 *
 * Sequences share prompts through the prefix cache, prefill in chunks, fork
 * (copy-on-write of the partially filled block) and decode; at every step the
 * K/V of the new positions is written into the pool's storage with
 * kvc_attn_write_kv at the slots kvc_seq_reserve gave, and the kernels read
 * the batch through kvc_seqs_csr.  The output must equal, bit for bit,
 * attention over each sequence's own history laid out contiguously: a wrong
 * share, a missed copy, a stale table or a wrong slot shows up as a
 * difference.  The K/V of a token is a function of the token and its
 * position only, so a prefix hit holds exactly the values a recomputation
 * would write.  f32 and bf16 storage, full attention and a sliding window. */
#include "test_helpers.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define BS     4
#define HEADS  2
#define QHEADS 4
#define DIM    64
#define MAXTOK 96

static void kv_of(kvc_token_t t, size_t pos, float *k, float *v)
{
    for (int h = 0; h < HEADS; h++)
        for (int d = 0; d < DIM; d++) {
            k[h * DIM + d] =
                sinf(0.31f * (float)t + 0.017f * (float)pos + 0.5f * (float)h + 0.11f * (float)d);
            v[h * DIM + d] =
                cosf(0.23f * (float)t - 0.013f * (float)pos + 0.7f * (float)h + 0.05f * (float)d);
        }
}

typedef struct {
    kvc_pool_t *pool;
    kvc_prefix_t *pc;
    kvc_seqs_t *seqs;
    kvc_kv_view_t view;
    kvc_dtype_t dt;
} engine_t;

static void engine_init(engine_t *e, kvc_dtype_t dt)
{
    memset(e, 0, sizeof *e);
    e->dt = dt;
    kvc_pool_params_t pp = kvc_pool_params_default();
    pp.n_blocks = 128;
    pp.block_size = BS;
    pp.storage =
        (kvc_storage_desc_t){.n_layers = 1, .n_kv_heads = HEADS, .head_dim = DIM, .dtype = dt};
    assert_ok(kvc_pool_create(&pp, &e->pool));
    kvc_prefix_params_t cp = kvc_prefix_params_default();
    cp.hash_seed = 5;
    assert_ok(kvc_prefix_create(e->pool, &cp, &e->pc));
    kvc_seqs_params_t sp = kvc_seqs_params_default(); /* copies: kvc_pool_copy_block */
    assert_ok(kvc_seqs_create(e->pool, e->pc, &sp, &e->seqs));
    assert_ok(kvc_kv_view_from_pool(e->pool, 0, KVC_SCALE_NONE, &e->view));
}

static void engine_free(engine_t *e)
{
    kvc_seqs_destroy(e->seqs);
    kvc_prefix_destroy(e->pc);
    kvc_pool_destroy(e->pool);
}

/* The forward pass's write: reserve n slots, write K/V there, complete. */
static void step(engine_t *e, kvc_seq_t s, uint32_t n)
{
    kvc_seq_info_t info;
    assert_ok(kvc_seq_info(e->seqs, s, &info));
    const kvc_token_t *tok;
    size_t nt;
    assert_ok(kvc_seq_tokens(e->seqs, s, &tok, &nt));
    int64_t slots[MAXTOK];
    float k[MAXTOK * HEADS * DIM], v[MAXTOK * HEADS * DIM];
    assert_ok(kvc_seq_reserve(e->seqs, s, n, slots));
    for (uint32_t i = 0; i < n; i++)
        kv_of(tok[info.n_reserved + i], info.n_reserved + i, k + i * HEADS * DIM,
              v + i * HEADS * DIM);
    assert_ok(kvc_attn_write_kv(&e->view, slots, n, k, v, NULL, KVC_ISA_AUTO));
    assert_ok(kvc_seq_complete(e->seqs, s, n));
}

static kvc_seq_t start(engine_t *e, const kvc_token_t *t, size_t n, size_t *hit)
{
    kvc_seq_desc_t d = {.prompt = t, .n_prompt = n};
    kvc_seq_t s;
    assert_ok(kvc_seq_create(e->seqs, &d, &s));
    assert_ok(kvc_seq_lookup(e->seqs, s, hit));
    size_t done = *hit;
    while (done < n) { /* chunked prefill, 5 tokens at a time */
        uint32_t c = (uint32_t)KVC_MIN((size_t)5, n - done);
        step(e, s, c);
        done += c;
    }
    return s;
}

/* Attention of one query per sequence over its cache, paged through the seq tables, against
 * the same over a contiguous copy of its own history. */
static void check_batch(engine_t *e, const kvc_seq_t *rows, uint32_t n_rows, uint32_t window)
{
    uint32_t indptr[16], indices[512], last[16];
    assert_ok(kvc_seqs_csr(e->seqs, rows, n_rows, 0, indptr, indices, 512, last));
    kvc_attn_batch_t b = {
        .n_seqs = n_rows, .kv_indptr = indptr, .kv_indices = indices, .kv_last_len = last};
    kvc_attn_params_t p = kvc_attn_params_default();
    p.n_q_heads = QHEADS;
    p.window = window;
    float q[16 * QHEADS * DIM], out[16 * QHEADS * DIM], ref[QHEADS * DIM];
    for (uint32_t i = 0; i < n_rows * QHEADS * DIM; i++) q[i] = sinf(0.7f * (float)i);
    size_t ws_bytes = kvc_attn_workspace_bytes(&e->view, NULL);
    void *ws = aligned_alloc(64, (ws_bytes + 63) / 64 * 64);
    assert_ok(kvc_attn_forward(&p, &e->view, &b, q, out, ws, ws_bytes, 0, UINT32_MAX));
    for (uint32_t r = 0; r < n_rows; r++) {
        /* the contiguous twin: blocks 0..n-1 of a fresh buffer, filled from the history */
        const kvc_token_t *tok;
        size_t nt;
        assert_ok(kvc_seq_tokens(e->seqs, rows[r], &tok, &nt));
        kvc_seq_info_t info;
        assert_ok(kvc_seq_info(e->seqs, rows[r], &info));
        size_t n_keys = info.n_computed;
        uint32_t nb = (uint32_t)((n_keys + BS - 1) / BS);
        kvc_scale_shape_t shape = {.n_layers = 1,
                                   .n_kv = 2,
                                   .n_kv_heads = HEADS,
                                   .head_dim = DIM,
                                   .block_size = BS,
                                   .dtype = e->dt,
                                   .layout = KVC_SCALE_NONE};
        size_t bytes = kvc_kv_block_bytes(&shape) * nb;
        void *buf = aligned_alloc(64, (bytes + 63) / 64 * 64);
        memset(buf, 0, bytes);
        kvc_kv_view_t cv;
        assert_ok(kvc_kv_view_contiguous(buf, bytes, nb, &shape, 0, &cv));
        int64_t slots[MAXTOK];
        float k[MAXTOK * HEADS * DIM], v[MAXTOK * HEADS * DIM];
        for (size_t i = 0; i < n_keys; i++) {
            slots[i] = (int64_t)i;
            kv_of(tok[i], i, k + i * HEADS * DIM, v + i * HEADS * DIM);
        }
        assert_ok(kvc_attn_write_kv(&cv, slots, (uint32_t)n_keys, k, v, NULL, KVC_ISA_AUTO));
        uint32_t cind[64], cptr[2] = {0, nb}, clast = (uint32_t)(n_keys - (nb - 1) * BS);
        for (uint32_t i = 0; i < nb; i++) cind[i] = i;
        kvc_attn_batch_t cb = {
            .n_seqs = 1, .kv_indptr = cptr, .kv_indices = cind, .kv_last_len = &clast};
        assert_ok(
            kvc_attn_forward(&p, &cv, &cb, q + r * QHEADS * DIM, ref, ws, ws_bytes, 0, UINT32_MAX));
        assert_memory_equal(out + r * QHEADS * DIM, ref, sizeof ref); /* bit for bit */
        free(buf);
    }
    free(ws);
}

static void run(kvc_dtype_t dt, uint32_t window)
{
    engine_t e;
    engine_init(&e, dt);
    kvc_token_t a[13], b[14], c[13];
    for (int i = 0; i < 13; i++) a[i] = c[i] = 10 + i;
    for (int i = 0; i < 14; i++) b[i] = i < 8 ? a[i] : 50 + i;
    size_t hit;
    kvc_seq_t sa = start(&e, a, 13, &hit);
    assert_int_equal(hit, 0);
    kvc_seq_t sb = start(&e, b, 14, &hit);
    assert_int_equal(hit, 8); /* two blocks of a's written K/V are reused */
    kvc_seq_t sc = start(&e, c, 13, &hit);
    assert_int_equal(hit, 12);
    /* a samples its first token; d forks from a and samples another: the partially filled block
     * (13 tokens: block 3 holds one) is copied for whoever writes it first */
    kvc_seq_t rows[4] = {sa, sb, sc};
    kvc_token_t t1 = 777, t2 = 888;
    assert_ok(kvc_seq_append(e.seqs, sa, &t1, 1));
    kvc_seq_t sd;
    assert_ok(kvc_seq_append(e.seqs, sc, &t2, 1));
    step(&e, sc, 1);
    step(&e, sa, 1);
    assert_ok(kvc_seq_fork(e.seqs, sa, &sd));
    rows[3] = sd;
    for (int i = 0; i < 6;
         i++) { /* a and d diverge: the first write into the shared block copies */
        kvc_token_t ta = (kvc_token_t)(100 + i), td = (kvc_token_t)(200 + i),
                    tb = (kvc_token_t)(300 + i);
        assert_ok(kvc_seq_append(e.seqs, sa, &ta, 1));
        assert_ok(kvc_seq_append(e.seqs, sd, &td, 1));
        assert_ok(kvc_seq_append(e.seqs, sb, &tb, 1));
        step(&e, sd, 1);
        step(&e, sa, 1);
        step(&e, sb, 1);
        check_batch(&e, rows, 4, window);
    }
    kvc_seqs_stats_t st;
    kvc_seqs_stats(e.seqs, &st);
    assert_true(st.n_cow_copies >= 1);
    char msg[256];
    if (kvc_seqs_check(e.seqs, msg, sizeof msg)) fail_msg("%s", msg);
    engine_free(&e);
}

static void paged_sequences_read_exactly_their_own_history_f32(void **state)
{
    (void)state;
    run(KVC_DTYPE_F32, 0);
}

static void paged_sequences_read_exactly_their_own_history_bf16(void **state)
{
    (void)state;
    run(KVC_DTYPE_BF16, 0);
}

static void a_sliding_window_reads_the_same_keys_paged_and_contiguous(void **state)
{
    (void)state;
    run(KVC_DTYPE_F32, 7);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(paged_sequences_read_exactly_their_own_history_f32),
        cmocka_unit_test(paged_sequences_read_exactly_their_own_history_bf16),
        cmocka_unit_test(a_sliding_window_reads_the_same_keys_paged_and_contiguous),
    };
    return cmocka_run_group_tests_name("integration", tests, NULL, NULL);
}
