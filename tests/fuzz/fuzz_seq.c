/* fuzz_seq.c - libFuzzer target over encoded sequences of seq-layer
 * operations: create + lookup, chunked compute, sample, drafts with
 * acceptance, fork, beam step, destroy (also with a step in flight), bad
 * completions.  A fake KV (each slot holds the token written there) is kept;
 * after every operation kvc_seqs_check must pass and every live sequence
 * must read back exactly its own tokens; anything else aborts.
 *
 * Encoding: byte 0: block size (bits 0-1), hybrid with a sliding group
 * (bit 2) and its window (bits 3-7); byte 1: pool size (8..71 blocks); then
 * one opcode byte per operation followed by its argument bytes. */
#include "kvcache/kvcache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXS   8
#define MAXTOK 200

#define CHECK(cond, ...)                               \
    do {                                               \
        if (!(cond)) {                                 \
            fprintf(stderr, "fuzz_seq: " __VA_ARGS__); \
            fputc('\n', stderr);                       \
            abort();                                   \
        }                                              \
    } while (0)

typedef struct {
    const uint8_t *p;
    size_t n, at;
} input_t;

static uint8_t next(input_t *in)
{
    return in->at < in->n ? in->p[in->at++] : 0;
}

typedef struct {
    kvc_seq_t h;
    kvc_token_t tok[MAXTOK + 16];
    size_t n, n_computed;
} ref_t;

typedef struct {
    kvc_pool_t *pool;
    kvc_prefix_t *pc;
    kvc_seqs_t *seqs;
    uint32_t bs, n_blocks, n_groups, window[KVC_MAX_GROUPS];
    int32_t *kv;
    ref_t r[MAXS];
    int n;
} world_t;

static void on_copy(void *ctx, uint32_t dst, uint32_t src)
{
    world_t *w = ctx;
    memcpy(w->kv + (size_t)dst * w->bs, w->kv + (size_t)src * w->bs, w->bs * sizeof(int32_t));
}

static void verify(world_t *w)
{
    char msg[256];
    CHECK(kvc_seqs_check(w->seqs, msg, sizeof msg) == 0, "%s", msg);
    for (int i = 0; i < w->n; i++) {
        ref_t *r = &w->r[i];
        kvc_seq_info_t info;
        CHECK(kvc_seq_info(w->seqs, r->h, &info) == 0, "info");
        CHECK(info.n_computed == r->n_computed && info.n_tokens == r->n, "counts");
        for (uint32_t g = 0; g < w->n_groups; g++) {
            const uint32_t *t;
            uint32_t nb;
            CHECK(kvc_seq_table(w->seqs, r->h, g, &t, &nb) == 0, "table");
            size_t from = w->window[g] && r->n_computed + 1 > w->window[g]
                              ? r->n_computed + 1 - w->window[g]
                              : 0;
            for (size_t pos = from; pos < r->n_computed; pos++) {
                uint32_t b = t[pos / w->bs];
                CHECK(b != KVC_NONE, "released inside the window");
                CHECK(w->kv[(size_t)b * w->bs + pos % w->bs] == r->tok[pos],
                      "group %u pos %zu reads a foreign token", g, pos);
            }
        }
    }
}

static int step(world_t *w, ref_t *r, uint32_t n)
{
    int64_t slots[KVC_MAX_GROUPS * 64];
    if (n > 64) n = 64;
    int rc = kvc_seq_reserve(w->seqs, r->h, n, slots);
    if (rc) return rc;
    for (uint32_t g = 0; g < w->n_groups; g++)
        for (uint32_t i = 0; i < n; i++)
            w->kv[slots[(size_t)g * n + i]] = r->tok[r->n_computed + i];
    CHECK(kvc_seq_complete(w->seqs, r->h, n) == 0, "complete");
    r->n_computed += n;
    return 0;
}

static void kill(world_t *w, int i)
{
    CHECK(kvc_seq_destroy(w->seqs, w->r[i].h) == 0, "destroy");
    CHECK(!kvc_seq_valid(w->seqs, w->r[i].h), "valid after destroy");
    w->r[i] = w->r[--w->n];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    input_t in = {data, size, 0};
    static world_t w;
    memset(&w, 0, sizeof w);
    uint8_t cfg = next(&in);
    w.bs = 1u << (cfg & 3);
    w.n_blocks = 8 + next(&in) % 64;
    w.n_groups = (cfg & 4) ? 2 : 1;
    if (cfg & 4) w.window[1] = 1 + (cfg >> 3);
    kvc_pool_params_t pp = kvc_pool_params_default();
    pp.n_blocks = w.n_blocks;
    pp.block_size = w.bs;
    if (kvc_pool_create(&pp, &w.pool)) abort();
    kvc_prefix_params_t cp = kvc_prefix_params_default();
    cp.hash_seed = 3;
    memcpy(cp.group_window, w.window, sizeof cp.group_window);
    if (kvc_prefix_create(w.pool, &cp, &w.pc)) abort();
    kvc_seqs_params_t sp = kvc_seqs_params_default();
    sp.max_seqs = MAXS;
    sp.n_groups = w.n_groups;
    memcpy(sp.window, w.window, sizeof sp.window);
    sp.on_copy = on_copy;
    sp.copy_ctx = &w;
    if (kvc_seqs_create(w.pool, w.pc, &sp, &w.seqs)) abort();
    w.kv = malloc((size_t)w.n_blocks * w.bs * sizeof(int32_t));
    memset(w.kv, 0xff, (size_t)w.n_blocks * w.bs * sizeof(int32_t));

    while (in.at < in.n) {
        uint8_t op = next(&in);
        int i = w.n ? next(&in) % w.n : -1;
        switch (op % 8) {
        case 0: /* create + lookup */
            if (w.n < MAXS) {
                ref_t *r = &w.r[w.n];
                size_t n = 1 + next(&in) % 40;
                for (size_t k = 0; k < n; k++) r->tok[k] = next(&in) % 3;
                kvc_seq_desc_t d = {.prompt = r->tok, .n_prompt = n};
                if (kvc_seq_create(w.seqs, &d, &r->h)) break;
                size_t hit;
                CHECK(kvc_seq_lookup(w.seqs, r->h, &hit) == 0 && hit < n, "lookup");
                r->n = n;
                r->n_computed = hit;
                w.n++;
            }
            break;
        case 1: /* compute a chunk */
            if (i >= 0 && w.r[i].n_computed < w.r[i].n) {
                uint32_t c = 1 + next(&in) % (uint32_t)(w.r[i].n - w.r[i].n_computed);
                if (step(&w, &w.r[i], c)) kill(&w, i);
            }
            break;
        case 2: /* sample */
            if (i >= 0 && w.r[i].n_computed == w.r[i].n && w.r[i].n < MAXTOK) {
                kvc_token_t t = 100 + next(&in);
                CHECK(kvc_seq_append(w.seqs, w.r[i].h, &t, 1) == 0, "append");
                w.r[i].tok[w.r[i].n++] = t;
            }
            break;
        case 3: /* drafts */
            if (i >= 0 && w.r[i].n == w.r[i].n_computed + 1 && w.r[i].n + 8 < MAXTOK) {
                ref_t *r = &w.r[i];
                kvc_token_t d[8];
                uint32_t k = 1 + next(&in) % 7, a = next(&in) % (k + 1);
                for (uint32_t j = 0; j < k; j++) d[j] = 200 + next(&in) % 4;
                CHECK(kvc_seq_draft(w.seqs, r->h, d, k) == 0, "draft");
                memcpy(r->tok + r->n, d, k * sizeof *d);
                size_t n_before = r->n;
                r->n += k;
                if (step(&w, r, k + 1)) {
                    CHECK(kvc_seq_rollback(w.seqs, r->h, k) == 0, "rollback");
                    r->n = n_before;
                    kill(&w, i);
                    break;
                }
                CHECK(kvc_seq_accept(w.seqs, r->h, a) == 0, "accept");
                r->n = r->n_computed = n_before + a;
            }
            break;
        case 4: /* fork */
            if (i >= 0 && w.n < MAXS && w.r[i].n_computed == w.r[i].n) {
                kvc_seq_t c;
                if (kvc_seq_fork(w.seqs, w.r[i].h, &c) == 0) {
                    w.r[w.n] = w.r[i];
                    w.r[w.n++].h = c;
                }
            }
            break;
        case 5: { /* beam step over up to 3 fully computed requests */
            int idx[3], nb = 0;
            for (int k = 0; k < w.n && nb < 3; k++)
                if (w.r[k].n_computed == w.r[k].n && w.r[k].n < MAXTOK) idx[nb++] = k;
            if (!nb) break;
            kvc_seq_t beams[3], nx[4];
            kvc_beam_choice_t ch[4];
            uint32_t n_ch = 1 + next(&in) % 4;
            int children[3] = {0}, dead = 0, forks = 0;
            for (uint32_t j = 0; j < n_ch; j++) {
                ch[j] = (kvc_beam_choice_t){.parent = next(&in) % (uint32_t)nb,
                                            .token = 300 + next(&in)};
                children[ch[j].parent]++;
            }
            for (int j = 0; j < nb; j++) {
                beams[j] = w.r[idx[j]].h;
                dead += !children[j];
                forks += children[j] > 1 ? children[j] - 1 : 0;
            }
            if (forks > MAXS - w.n + dead) break;
            int64_t slots[KVC_MAX_GROUPS * 4];
            int rc = kvc_seq_beam_step(w.seqs, beams, (uint32_t)nb, ch, n_ch, nx, slots);
            if (rc) { /* all or nothing: every beam, dead ones included, is unchanged */
                CHECK(rc == KVC_ENOSPC || rc == KVC_EBUSY, "beam step: %s", kvc_strerror(rc));
                break;
            }
            ref_t old[3];
            for (int j = 0; j < nb; j++) old[j] = w.r[idx[j]];
            for (int j = nb; j-- > 0;) w.r[idx[j]] = w.r[--w.n];
            for (uint32_t j = 0; j < n_ch; j++) {
                ref_t *r = &w.r[w.n++];
                *r = old[ch[j].parent];
                r->h = nx[j];
                r->tok[r->n++] = ch[j].token;
                for (uint32_t g = 0; g < w.n_groups; g++)
                    w.kv[slots[(size_t)g * n_ch + j]] = ch[j].token;
                CHECK(kvc_seq_complete(w.seqs, nx[j], 1) == 0, "beam complete");
                r->n_computed = r->n;
            }
            break;
        }
        case 6: /* destroy */
            if (i >= 0) kill(&w, i);
            break;
        case 7: /* a step in flight; destroy some rows; bad then good completion */
            if (w.n) {
                kvc_seq_t rows[MAXS];
                uint32_t nr = 1 + next(&in) % (uint32_t)w.n;
                for (uint32_t j = 0; j < nr; j++) rows[j] = w.r[j].h;
                kvc_step_id_t id;
                CHECK(kvc_step_launch(w.seqs, rows, nr, &id) == 0, "launch");
                uint8_t kill_mask = next(&in);
                for (int j = (int)nr; j-- > 0;)
                    if (kill_mask & (1u << j)) kill(&w, j);
                verify(&w);
                if (nr > 1) {
                    kvc_seq_t t = rows[0];
                    rows[0] = rows[1];
                    rows[1] = t;
                    CHECK(kvc_step_complete(w.seqs, id, rows, nr, NULL) == KVC_ESTALE,
                          "permuted accepted");
                    rows[1] = rows[0];
                    rows[0] = t;
                }
                CHECK(kvc_step_complete(w.seqs, id, rows, nr, NULL) == 0, "complete step");
                CHECK(kvc_step_complete(w.seqs, id, rows, nr, NULL) == KVC_ESTALE,
                      "duplicate accepted");
            }
            break;
        }
        verify(&w);
    }
    while (w.n) kill(&w, 0);
    verify(&w);
    CHECK(kvc_pool_n_free(w.pool) == w.n_blocks, "blocks leaked");
    kvc_seqs_destroy(w.seqs);
    kvc_prefix_destroy(w.pc);
    kvc_pool_destroy(w.pool);
    free(w.kv);
    return 0;
}
