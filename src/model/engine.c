/* engine.c - the step loop: sched plans, the forward pass, sampling, results back.
 *
 * The engine embeds the library exactly as a GPU engine would: the pool holds every K/V
 * byte, sched decides each step, seq gives the slots and the block tables, and the engine
 * owns only weights, activations and per-request sampling state.  A request's identity to
 * the caller is the scheduler's id (generation << 32 | slot: a stale id is refused); its
 * state here lives at index `tag` of reqs[]. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "forward_int.h"
#include "engine_int.h"
#include "engine_tier_int.h"
#include "util/msg.h"

typedef struct {
    bool used;
    kvc_gen_id_t id;   /* the caller's: (gen << 32) | slot */
    uint32_t gen;      /* the slot's generation, kept across reuse */
    kvc_req_id_t sid;  /* the scheduler's, once added */
    bool in_sched;     /* added to the scheduler (else pending here) */
    uint32_t computed; /* prompt positions computed (from the plans: a hint, not a count) */
    /* parallel sampling: the parent lists its children; each child waits (fork_wait) until
     * the parent's prompt is done, then samples its own first token and is forked */
    uint32_t *children, n_children, sample_index;
    uint8_t *swap; /* swap preemption: the K/V of its computed positions, in host memory */
    size_t swap_cap;
    bool fork_wait;
    kvc_gen_params_t gp;
    char *stop[KVC_MAX_STOP];
    size_t stop_len[KVC_MAX_STOP];
    kvc_rng_t rng;
    uint32_t n_prompt, max_out;
    kvc_token_t *out;
    float *lp, *top_lp;
    kvc_token_t *top_ids;
    uint32_t n_out;
    char *text;
    size_t text_len, text_cap, text_sent;
    kvc_tokenizer_stream_t *ts;
    double submit_s, first_s;
    kvc_finish_t finish;
    uint32_t drafts, accepted;
    /* no-kv-cache mode: the whole sequence, recomputed per token */
    kvc_token_t *all;
    uint32_t n_all;
    /* draft model: the request's sequence in the draft pool (created at its first draft) */
    kvc_seq_t dseq;
    bool has_dseq;
    /* tiers: what its prefix fetch holds until admission, and where the blocks came from */
    kvc__tier_fetch_t tf;
} req_t;

struct kvc_engine {
    const kvc_llm_t *m;
    kvc_engine_params_t p;
    kvc_threadpool_t *tp;
    kvc_pool_t *pool;
    kvc_prefix_t *pc;
    kvc_seqs_t *seqs;
    kvc_sched_t *sched;
    kvc__fwd_t fwd;
    kvc_sampler_t *sampler;
    uint32_t max_sel;
    float *logits; /* (max_sel, vocab) */
    uint32_t *sel;
    kvc__seg_t *segs;
    kvc_sched_result_t *results;
    bool *live;
    kvc_seq_t *rows;   /* the step's rows, as launched and completed */
    uint32_t *n_emit;  /* per entry: tokens emitted this step */
    kvc_token_t *emit; /* per entry: tokens emitted this step */
    float *emit_lp;
    req_t *reqs;
    uint32_t n_reqs;
    uint32_t *free_reqs, n_free;
    kvc_gen_done_t *done;
    uint32_t *done_slot;
    uint32_t n_done;
    kvc_engine_stats_t st;
    /* requests not yet given to the scheduler, in arrival order: held back while another
     * request is computing a prefix they share, so that they hit it instead */
    uint32_t *pend, n_pend, pend_cap;
    /* the children forked in this step (one parent's at a time: its prompt finishes once) */
    kvc_token_t fork_tok[KVC_MAX_SAMPLES];
    uint64_t fork_tag[KVC_MAX_SAMPLES];
    kvc_req_id_t fork_id[KVC_MAX_SAMPLES];
    uint32_t fork_n;
    /* no-kv-cache mode: a queue of request indices, a scratch pool of one context */
    uint32_t *queue, q_head, q_len;
    kvc_pool_t *npool;
    kvc_seqs_t *nseqs;
    kvc__fwd_t nfwd;
    /* draft model (speculation): its own pool, seq table (no prefix cache) and buffers */
    kvc_pool_t *dpool;
    kvc_seqs_t *dseqs;
    kvc__fwd_t dfwd;
    float *dlogits; /* (vocab) */
    /* KV tiers (engine_tier.c); NULL without */
    kvc__etiers_t *tiers;
    uint32_t *tier_fetched, n_tier_fetched; /* requests whose fetch holds blocks this step */
};

static double wall_s(void)
{
    return (double)kvc_now_ns() * 1e-9;
}

kvc_engine_params_t kvc_engine_params_default(void)
{
    return (kvc_engine_params_t){.kv_dtype = KVC_DTYPE_F16,
                                 .block_size = 16,
                                 .max_num_seqs = 64,
                                 .max_num_batched_tokens = 512,
                                 .preemption = KVC_PREEMPT_RECOMPUTE,
                                 .spec_ngram = 3};
}

kvc_gen_params_t kvc_gen_params_default(void)
{
    return (kvc_gen_params_t){.top_p = 1, .repetition_penalty = 1, .max_tokens = 16};
}

const char *kvc_finish_name(kvc_finish_t f)
{
    switch (f) {
    case KVC_FINISH_STOP:
        return "stop";
    case KVC_FINISH_LENGTH:
        return "length";
    case KVC_FINISH_ABORT:
        return "abort";
    case KVC_FINISH_ERROR:
        return "error";
    default:
        return "";
    }
}

kvc_seqs_t *kvc_engine_seqs(const kvc_engine_t *e)
{
    return e->seqs;
}
kvc_sched_t *kvc_engine_sched(const kvc_engine_t *e)
{
    return e->sched;
}
kvc_prefix_t *kvc_engine_prefix(const kvc_engine_t *e)
{
    return e->pc;
}

static void req_clear(req_t *r)
{
    for (uint32_t i = 0; i < KVC_MAX_STOP; i++) free(r->stop[i]);
    free(r->out), free(r->lp), free(r->top_lp), free(r->top_ids), free(r->text), free(r->all);
    free(r->children);
    free(r->swap);
    kvc_tokenizer_stream_destroy(r->ts);
    const uint32_t gen = r->gen;
    memset(r, 0, sizeof *r);
    r->gen = gen + 1 ? gen + 1 : 1;
}

void kvc_engine_destroy(kvc_engine_t *e)
{
    if (!e) return;
    if (e->reqs)
        for (uint32_t i = 0; i < e->n_reqs; i++) kvc__etiers_release(e->tiers, &e->reqs[i].tf);
    kvc_sched_destroy(e->sched);
    kvc_seqs_destroy(e->seqs);
    kvc_prefix_destroy(e->pc);
    kvc__etiers_destroy(e->tiers); /* after the cache: no more events */
    kvc__fwd_free(&e->fwd);
    kvc_pool_destroy(e->pool);
    kvc__fwd_free(&e->nfwd);
    kvc_seqs_destroy(e->nseqs);
    kvc_pool_destroy(e->npool);
    kvc__fwd_free(&e->dfwd);
    kvc_seqs_destroy(e->dseqs);
    kvc_pool_destroy(e->dpool);
    free(e->dlogits);
    kvc_threadpool_destroy(e->tp);
    kvc_sampler_destroy(e->sampler);
    if (e->reqs)
        for (uint32_t i = 0; i < e->n_reqs; i++) req_clear(&e->reqs[i]);
    free(e->reqs), free(e->free_reqs), free(e->done), free(e->done_slot), free(e->queue),
        free(e->pend);
    free(e->logits), free(e->sel), free(e->segs), free(e->results), free(e->live);
    free(e->rows), free(e->n_emit);
    free(e->emit), free(e->emit_lp);
    free(e->tier_fetched);
    free(e);
}

/* Drafts by prompt lookup: the tokens that followed the latest earlier occurrence of the
 * sequence's last n-gram (shorter n-grams if none), or the last token repeated when nothing
 * matches (the verification rejects it; a draft costs one row). */
static void ngram_draft(void *ctx, kvc_req_id_t id, uint64_t tag, uint32_t n, kvc_token_t *out)
{
    kvc_engine_t *e = ctx;
    (void)id;
    const kvc_token_t *t;
    size_t len;
    const req_t *r = &e->reqs[tag];
    /* the request's committed tokens: prompt + outputs, kept here as well */
    t = r->all;
    len = r->n_all;
    for (uint32_t i = 0; i < n; i++) out[i] = len ? t[len - 1] : 0;
    for (uint32_t g = KVC_MIN(e->p.spec_ngram, (uint32_t)len); g >= 1; g--) {
        for (size_t s = len - g; s-- > 0;) {
            if (memcmp(t + s, t + len - g, g * sizeof *t)) continue;
            size_t from = s + g;
            for (uint32_t i = 0; i < n; i++) out[i] = from + i < len ? t[from + i] : out[i];
            return;
        }
    }
}

/* ---- draft model: speculation by a small model with its own pool --------------------------
 * Each decoding request has a sequence in the draft pool, created at its first draft call.
 * A call brings it up to date with the request's committed tokens (r->all): the drafts the
 * target accepted stay (kvc_seq_accept commits them, the rest are rolled back), the tokens
 * committed since are appended and every position not computed yet runs in one pass (chunked
 * by the buffers); then n tokens are decoded greedily, each appended as a draft.  Drafts are
 * only proposals (the target verifies them with the request's own sampler), so whatever the
 * draft model says, outputs are unchanged; a failure here (the draft pool full, ...) just
 * proposes the last token again (rejected at no cost but a row) and drops the sequence. */
static void draft_drop(kvc_engine_t *e, req_t *r)
{
    if (!r->has_dseq) return;
    (void)kvc_seq_destroy(e->dseqs, r->dseq); /* nothing in flight: cannot fail */
    r->has_dseq = false;
}

static int draft_init(kvc_engine_t *e, uint32_t ctx_blocks)
{
    const kvc_llm_t *dm = e->p.draft_model;
    const kvc_model_hparams_t *dh = &dm->h;
    kvc_storage_desc_t sd = {.n_layers = dm->storage_layers,
                             .n_kv_heads = dh->n_kv_heads,
                             .head_dim = dh->head_dim,
                             .dtype = e->p.kv_dtype};
    size_t block_bytes = 0;
    int rc = kvc_storage_block_bytes(&sd, e->p.block_size, &block_bytes);
    if (rc) return rc;
    /* drafts run up to spec_tokens past the context */
    const uint32_t dblocks =
        ctx_blocks + (e->p.spec_tokens + e->p.block_size - 1) / e->p.block_size;
    /* as the target's default: a context per running request, at most 256 MiB, at least one */
    uint64_t n_blocks = (uint64_t)dblocks * dm->n_groups * e->p.max_num_seqs;
    n_blocks = KVC_MIN(n_blocks, ((uint64_t)256 << 20) / block_bytes);
    n_blocks = KVC_MAX(n_blocks, (uint64_t)dblocks * dm->n_groups);
    if (n_blocks > (1u << 30)) return KVC_EINVAL;
    kvc_pool_params_t pp = kvc_pool_params_default();
    pp.n_blocks = (uint32_t)n_blocks;
    pp.block_size = e->p.block_size;
    pp.storage = sd;
    if ((rc = kvc_pool_create(&pp, &e->dpool))) return rc;
    kvc_seqs_params_t sp = kvc_seqs_params_default();
    sp.max_seqs = 2 * e->p.max_num_seqs + 8;
    sp.max_batch = 1;
    sp.n_groups = dm->n_groups;
    for (uint32_t g = 0; g < dm->n_groups; g++) sp.window[g] = dm->group_window[g];
    if ((rc = kvc_seqs_create(e->dpool, NULL, &sp, &e->dseqs))) return rc;
    if ((rc = kvc__fwd_init(&e->dfwd, dm, e->dpool, e->p.max_num_batched_tokens, 1, dblocks, 1,
                            e->tp, e->p.isa)))
        return rc;
    e->dlogits = malloc((size_t)dh->vocab * sizeof *e->dlogits);
    return e->dlogits ? 0 : KVC_ENOMEM;
}

/* Reserve n slots of r's draft sequence; when the draft pool is full, the other requests'
 * draft sequences make room (they are recomputed at their next draft). */
static int draft_reserve(kvc_engine_t *e, req_t *r, uint32_t n)
{
    int rc = kvc_seq_reserve(e->dseqs, r->dseq, n, NULL);
    if (rc != KVC_ENOSPC && rc != KVC_EBUSY) return rc;
    for (uint32_t i = 0; i < e->n_reqs; i++)
        if (&e->reqs[i] != r) draft_drop(e, &e->reqs[i]);
    return kvc_seq_reserve(e->dseqs, r->dseq, n, NULL);
}

/* Compute positions [from, to) of r's draft sequence (their tokens known), the logits of
 * position to - 1 into e->dlogits. */
static int draft_compute(kvc_engine_t *e, req_t *r, uint32_t from, uint32_t to)
{
    int rc = 0;
    for (uint32_t pos = from; pos < to && !rc;) {
        const uint32_t cnt = KVC_MIN(e->dfwd.max_rows, to - pos);
        const uint32_t last = cnt - 1;
        const bool final = pos + cnt == to;
        kvc__seg_t sg = {.seq = r->dseq, .first_pos = pos, .n_tokens = cnt};
        if (!(rc = draft_reserve(e, r, cnt)) &&
            !(rc = kvc__fwd_run(&e->dfwd, e->dseqs, &sg, 1, &last, final ? 1 : 0, e->dlogits)))
            rc = kvc_seq_complete(e->dseqs, r->dseq, cnt);
        e->st.draft_computed_tokens += cnt;
        pos += cnt;
    }
    return rc;
}

/* Bring r's draft sequence to exactly r->all (committed, no drafts), every position computed,
 * the last one's logits in e->dlogits. */
static int draft_sync(kvc_engine_t *e, req_t *r)
{
    kvc_seq_info_t in;
    int rc;
    if (r->has_dseq) {
        const kvc_token_t *t;
        size_t nt;
        if ((rc = kvc_seq_info(e->dseqs, r->dseq, &in)) ||
            (rc = kvc_seq_tokens(e->dseqs, r->dseq, &t, &nt)))
            return rc;
        const size_t c = in.n_tokens - in.n_draft;
        if (c <= r->n_all && !memcmp(t, r->all, c * sizeof *t)) {
            /* the drafts the target took are committed, the rest rolled back */
            uint32_t a = 0;
            while (a < in.n_draft && c + a < r->n_all && t[c + a] == r->all[c + a]) a++;
            if (in.n_draft && (rc = kvc_seq_accept(e->dseqs, r->dseq, a))) return rc;
            if ((rc = kvc_seq_append(e->dseqs, r->dseq, r->all + c + a,
                                     (uint32_t)(r->n_all - c - a))))
                return rc;
            if ((rc = kvc_seq_info(e->dseqs, r->dseq, &in))) return rc;
            if (in.n_computed < r->n_all && in.n_reserved == in.n_computed)
                return draft_compute(e, r, (uint32_t)in.n_computed, r->n_all);
        }
        draft_drop(e, r); /* out of step (cannot happen): start it again */
    }
    kvc_seq_desc_t d = {.prompt = r->all, .n_prompt = r->n_all};
    rc = kvc_seq_create(e->dseqs, &d, &r->dseq);
    if (rc == KVC_ENOSPC) { /* the table is full: make room */
        for (uint32_t i = 0; i < e->n_reqs; i++) draft_drop(e, &e->reqs[i]);
        rc = kvc_seq_create(e->dseqs, &d, &r->dseq);
    }
    if (rc) return rc;
    r->has_dseq = true;
    return draft_compute(e, r, 0, r->n_all);
}

static kvc_token_t argmax(const float *x, uint32_t n)
{
    uint32_t b = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return (kvc_token_t)b;
}

static void model_draft(void *ctx, kvc_req_id_t id, uint64_t tag, uint32_t n, kvc_token_t *out)
{
    kvc_engine_t *e = ctx;
    (void)id;
    req_t *r = &e->reqs[tag];
    const uint32_t vocab = e->p.draft_model->h.vocab;
    for (uint32_t i = 0; i < n; i++) out[i] = r->n_all ? r->all[r->n_all - 1] : 0;
    int rc = draft_sync(e, r);
    for (uint32_t i = 0; !rc && i < n; i++) {
        const kvc_token_t d = argmax(e->dlogits, vocab);
        out[i] = d;
        if ((rc = kvc_seq_draft(e->dseqs, r->dseq, &d, 1))) break;
        if (i + 1 < n) rc = draft_compute(e, r, r->n_all + i, r->n_all + i + 1);
    }
    if (rc) draft_drop(e, r);
}

/* ---- swap preemption: a victim's K/V to host memory and back ---------------------------- */
/* Bytes of one token's K/V in all layers. */
static size_t token_kv_bytes(const kvc_engine_t *e)
{
    const kvc_model_hparams_t *h = &e->m->h;
    return (size_t)h->n_layers * 2 * h->n_kv_heads * h->head_dim * kvc_dtype_bytes(e->p.kv_dtype);
}

/* Copy position p's K/V of every layer between the pool and buf (to_pool: into the pool).  A
 * position a sliding layer no longer holds (out of its window) reads as zeros: no query will
 * look at it again. */
static void copy_token(kvc_engine_t *e, kvc_seq_t seq, uint32_t p, uint8_t *buf, bool to_pool)
{
    const kvc_llm_t *m = e->m;
    const kvc_model_hparams_t *h = &m->h;
    const size_t row = (size_t)h->head_dim * kvc_dtype_bytes(e->p.kv_dtype);
    const uint32_t bs = e->p.block_size;
    int64_t slot[KVC_MAX_GROUPS];
    bool have[KVC_MAX_GROUPS];
    for (uint32_t g = 0; g < m->n_groups; g++)
        have[g] = kvc_seq_slots(e->seqs, seq, g, p, 1, &slot[g]) == 0;
    for (uint32_t l = 0; l < h->n_layers; l++) {
        const kvc__llm_layer_t *L = &m->layer[l];
        for (uint32_t kv = 0; kv < 2; kv++)
            for (uint32_t hh = 0; hh < h->n_kv_heads; hh++, buf += row) {
                if (!have[L->group]) {
                    if (!to_pool) memset(buf, 0, row);
                    continue;
                }
                uint8_t *base =
                    kvc_pool_kv_data(e->pool, (uint32_t)(slot[L->group] / bs), L->slab, kv);
                uint8_t *at = base + ((size_t)hh * bs + (size_t)(slot[L->group] % bs)) * row;
                if (to_pool)
                    memcpy(at, buf, row);
                else
                    memcpy(buf, at, row);
            }
    }
}

static bool swap_out(void *ctx, kvc_req_id_t id, uint64_t tag, kvc_seq_t seq, uint32_t n)
{
    kvc_engine_t *e = ctx;
    (void)id;
    req_t *r = &e->reqs[tag];
    const size_t tb = token_kv_bytes(e), need = (size_t)n * tb;
    if (need > r->swap_cap) {
        uint8_t *b = realloc(r->swap, need);
        if (!b) return false; /* the scheduler recomputes it instead */
        r->swap = b, r->swap_cap = need;
    }
    for (uint32_t p = 0; p < n; p++) copy_token(e, seq, p, r->swap + (size_t)p * tb, false);
    /* The K/V moved: the blocks only this request held, and that no lookup can hit, are
     * scrubbed before they go back to the pool, so a swap-in that failed to copy them back
     * shows up as wrong output instead of hiding behind a block that happened to survive. */
    for (uint32_t g = 0; g < e->m->n_groups; g++) {
        const uint32_t *table;
        uint32_t nb;
        if (kvc_seq_table(e->seqs, seq, g, &table, &nb)) continue;
        for (uint32_t i = 0; i < nb; i++)
            if (table[i] != KVC_NONE && kvc_pool_refcount(e->pool, table[i]) == 1 &&
                !kvc_pool_is_cached(e->pool, table[i]))
                memset(kvc_pool_block_data(e->pool, table[i]), 0, kvc_pool_block_bytes(e->pool));
    }
    return true;
}

static void swap_in(void *ctx, kvc_req_id_t id, uint64_t tag, kvc_seq_t seq, uint32_t first,
                    uint32_t n)
{
    kvc_engine_t *e = ctx;
    (void)id;
    req_t *r = &e->reqs[tag];
    const size_t tb = token_kv_bytes(e);
    for (uint32_t p = first; p < first + n; p++)
        copy_token(e, seq, p, r->swap + (size_t)p * tb, true);
}

int kvc_engine_create(const kvc_llm_t *m, const kvc_engine_params_t *pp, kvc_engine_t **out,
                      char *msg, size_t cap)
{
    if (!m || !pp || !out) return kvc__msgf(KVC_EINVAL, msg, cap, "no model or parameters");
    *out = NULL;
    kvc_engine_params_t p = *pp;
    const kvc_model_hparams_t *h = &m->h;
    if (!p.n_threads) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        p.n_threads = n > 0 ? (uint32_t)KVC_MIN(n, 256) : 1;
    }
    if (p.n_threads > 256) return kvc__msgf(KVC_EINVAL, msg, cap, "--threads: at most 256");
    if (!p.block_size || p.block_size > 256 || (p.block_size & (p.block_size - 1)))
        return kvc__msgf(KVC_EINVAL, msg, cap, "--block-size: a power of two, 1 to 256");
    if (kvc_dtype_bytes(p.kv_dtype) == 0) return kvc__msgf(KVC_EINVAL, msg, cap, "bad KV dtype");
    if (!p.max_ctx) p.max_ctx = (uint32_t)KVC_MIN(h->ctx ? h->ctx : 2048, 32768);
    if (p.max_ctx > (1u << 24)) return kvc__msgf(KVC_EINVAL, msg, cap, "--ctx: at most 16M");
    if (!p.max_num_seqs || p.max_num_seqs > 4096)
        return kvc__msgf(KVC_EINVAL, msg, cap, "max running requests: 1 to 4096");
    if (p.max_num_batched_tokens < 1 || p.max_num_batched_tokens > 65536)
        return kvc__msgf(KVC_EINVAL, msg, cap, "tokens per step: 1 to 65536");
    if (p.spec_tokens > 16) return kvc__msgf(KVC_EINVAL, msg, cap, "--spec: at most 16 drafts");
    if (!p.n_tenants) p.n_tenants = KVC_SCHED_DEFAULT_TENANTS;
    if (p.n_tenants > KVC_SCHED_MAX_TENANTS)
        return kvc__msgf(KVC_EINVAL, msg, cap, "tenants: 1 to %d", KVC_SCHED_MAX_TENANTS);
    if (!p.spec_ngram) p.spec_ngram = 3;
    if (p.draft_model && p.draft_model->h.vocab != h->vocab)
        return kvc__msgf(KVC_EINVAL, msg, cap,
                         "--spec-model: the draft model's vocabulary has %u tokens, the "
                         "model's %u: they must be the same",
                         p.draft_model->h.vocab, h->vocab);

    kvc_engine_t *e = calloc(1, sizeof *e);
    if (!e) return kvc__msgf(KVC_ENOMEM, msg, cap, "out of memory");
    e->m = m;
    e->p = p;
    int rc = kvc_threadpool_create(p.n_threads, NULL, &e->tp);
    if (rc) goto fail;

    /* The pool: every layer's K/V of a group in each block. */
    kvc_storage_desc_t sd = {.n_layers = m->storage_layers,
                             .n_kv_heads = h->n_kv_heads,
                             .head_dim = h->head_dim,
                             .dtype = p.kv_dtype};
    size_t block_bytes = 0;
    if ((rc = kvc_storage_block_bytes(&sd, p.block_size, &block_bytes))) goto fail;
    const uint32_t ctx_blocks = (p.max_ctx + p.block_size - 1) / p.block_size + 1;
    uint64_t n_blocks;
    if (p.kv_memory)
        n_blocks = p.kv_memory / block_bytes;
    else {
        n_blocks = (uint64_t)ctx_blocks * m->n_groups * p.max_num_seqs;
        n_blocks = KVC_MIN(n_blocks, ((uint64_t)256 << 20) / block_bytes);
        n_blocks = KVC_MAX(n_blocks, (uint64_t)ctx_blocks * m->n_groups);
    }
    if (n_blocks < 2 || n_blocks > (1u << 30)) {
        rc =
            kvc__msgf(KVC_EINVAL, msg, cap, "--kv-memory: %llu blocks of %zu bytes; need 2 to 2^30",
                      (unsigned long long)n_blocks, block_bytes);
        goto fail_quiet;
    }
    e->st.kv_bytes_per_token = (uint64_t)block_bytes * m->n_groups / p.block_size;
    e->st.block_size = p.block_size;
    e->st.n_blocks = (uint32_t)n_blocks;
    e->max_sel = KVC_MIN(p.max_num_batched_tokens, p.max_num_seqs * (1 + p.spec_tokens));
    const uint32_t vocab = h->vocab;
    e->logits = malloc((size_t)e->max_sel * vocab * sizeof(float));
    e->sel = malloc(e->max_sel * sizeof *e->sel);
    e->segs = malloc(p.max_num_seqs * sizeof *e->segs);
    e->results = malloc(p.max_num_seqs * sizeof *e->results);
    e->live = malloc(p.max_num_seqs * sizeof *e->live);
    e->rows = malloc(p.max_num_seqs * sizeof *e->rows);
    e->n_emit = malloc(p.max_num_seqs * sizeof *e->n_emit);
    e->emit = malloc((size_t)p.max_num_seqs * (p.spec_tokens + 1) * sizeof *e->emit);
    e->emit_lp = malloc((size_t)p.max_num_seqs * (p.spec_tokens + 1) * sizeof *e->emit_lp);
    if (!e->logits || !e->sel || !e->segs || !e->results || !e->live || !e->rows || !e->n_emit ||
        !e->emit || !e->emit_lp) {
        rc = KVC_ENOMEM;
        goto fail;
    }
    if ((rc = kvc_sampler_create(vocab, NULL, &e->sampler))) goto fail;

    if (p.no_kv_cache) {
        /* A scratch pool of one context: each token recomputes its whole sequence in it. */
        kvc_pool_params_t np = kvc_pool_params_default();
        np.n_blocks = ctx_blocks * m->n_groups + 1;
        np.block_size = p.block_size;
        np.storage = sd;
        kvc_seqs_params_t ns = kvc_seqs_params_default();
        ns.max_seqs = 1;
        ns.max_batch = 1;
        ns.n_groups = m->n_groups;
        /* no sliding release: the recompute must see what the cached pass would */
        if ((rc = kvc_pool_create(&np, &e->npool)) ||
            (rc = kvc_seqs_create(e->npool, NULL, &ns, &e->nseqs)) ||
            (rc = kvc__fwd_init(&e->nfwd, m, e->npool, p.max_num_batched_tokens, 1, ctx_blocks, 1,
                                e->tp, p.isa)))
            goto fail;
        e->queue = malloc(4096 * sizeof *e->queue);
        if (!e->queue) {
            rc = KVC_ENOMEM;
            goto fail;
        }
    }

    kvc_pool_params_t pp2 = kvc_pool_params_default();
    pp2.n_blocks = (uint32_t)n_blocks;
    pp2.block_size = p.block_size;
    pp2.storage = sd;
    if ((rc = kvc_pool_create(&pp2, &e->pool))) goto fail;
    kvc_prefix_params_t cp = kvc_prefix_params_default();
    for (uint32_t g = 0; g < m->n_groups; g++) cp.group_window[g] = m->group_window[g];
    cp.hash_seed = p.prefix_hash_seed;
    if (p.n_tiers) {
        if ((rc = kvc__etiers_create(m, &p, block_bytes, (uint32_t)n_blocks, ctx_blocks,
                                     &cp.hash_seed, &e->tiers, msg, cap)))
            goto fail_quiet;
        cp.on_event = kvc__etiers_event;
        cp.event_ctx = e->tiers;
        if (!(e->tier_fetched = malloc(p.max_num_seqs * sizeof *e->tier_fetched))) {
            rc = KVC_ENOMEM;
            goto fail;
        }
    }
    /* copied (the specs and the id live in the tiers now) */
    e->p.tiers = NULL;
    e->p.tier_model_id = NULL;
    if (!p.no_prefix_cache && (rc = kvc_prefix_create(e->pool, &cp, &e->pc))) goto fail;
    if (e->tiers) kvc__etiers_attach(e->tiers, e->pool, e->pc);
    kvc_seqs_params_t sp = kvc_seqs_params_default();
    sp.max_seqs = 2 * p.max_num_seqs + 8;
    sp.max_batch = p.max_num_seqs;
    sp.n_groups = m->n_groups;
    for (uint32_t g = 0; g < m->n_groups; g++) sp.window[g] = m->group_window[g];
    if ((rc = kvc_seqs_create(e->pool, e->pc, &sp, &e->seqs))) goto fail;
    kvc_sched_params_t sc = kvc_sched_params_default();
    sc.max_num_seqs = p.max_num_seqs;
    sc.max_num_batched_tokens = p.max_num_batched_tokens;
    sc.max_prefill_chunk = p.max_prefill_chunk;
    sc.preemption = p.preemption;
    sc.block_bytes = block_bytes;
    sc.spec_tokens = p.spec_tokens;
    sc.n_tenants = p.n_tenants;
    sc.swap_out = swap_out;
    sc.swap_in = swap_in;
    sc.swap_ctx = e;
    sc.draft = ngram_draft;
    sc.draft_ctx = e;
    if (p.draft_model && p.spec_tokens) {
        if ((rc = draft_init(e, ctx_blocks))) goto fail;
        sc.draft = model_draft;
    }
    if ((rc = kvc_sched_create(e->seqs, &sc, &e->sched))) goto fail;
    if ((rc = kvc__fwd_init(&e->fwd, m, e->pool, p.max_num_batched_tokens, p.max_num_seqs,
                            ctx_blocks, e->max_sel, e->tp, p.isa)))
        goto fail;
    e->fwd.fast_attn = e->nfwd.fast_attn = p.no_batch_invariance;
    *out = e;
    return 0;
fail:
    kvc__msgf(rc, msg, cap, "engine: %s", kvc_strerror(rc));
fail_quiet:
    kvc_engine_destroy(e);
    return rc;
}

/* ---- requests --------------------------------------------------------------------------- */
static int req_slot(kvc_engine_t *e, uint32_t *out)
{
    if (e->n_free) {
        *out = e->free_reqs[--e->n_free];
        return 0;
    }
    uint32_t n = e->n_reqs ? 2 * e->n_reqs : 16;
    req_t *r = realloc(e->reqs, n * sizeof *r);
    if (!r) return KVC_ENOMEM;
    e->reqs = r;
    uint32_t *f = realloc(e->free_reqs, n * sizeof *f);
    if (!f) return KVC_ENOMEM;
    e->free_reqs = f;
    memset(r + e->n_reqs, 0, (n - e->n_reqs) * sizeof *r);
    for (uint32_t i = n; i-- > e->n_reqs + 1;) e->free_reqs[e->n_free++] = i;
    *out = e->n_reqs;
    e->n_reqs = n;
    return 0;
}

static void req_release(kvc_engine_t *e, uint32_t i)
{
    kvc__etiers_release(e->tiers, &e->reqs[i].tf);
    draft_drop(e, &e->reqs[i]);
    req_clear(&e->reqs[i]);
    e->free_reqs[e->n_free++] = i;
}

static int submit_one(kvc_engine_t *e, const kvc_token_t *prompt, uint32_t n_prompt,
                      const kvc_gen_params_t *gp, bool child, uint32_t *out_slot, char *msg,
                      size_t cap);

int kvc_engine_submit(kvc_engine_t *e, const kvc_token_t *prompt, uint32_t n_prompt,
                      const kvc_gen_params_t *gp, kvc_gen_id_t *id, char *msg, size_t cap)
{
    if (!e || !prompt || !gp || !id) return kvc__msgf(KVC_EINVAL, msg, cap, "no request");
    const uint32_t n = gp->n ? gp->n : 1;
    if (n > KVC_MAX_SAMPLES)
        return kvc__msgf(KVC_EINVAL, msg, cap, "n: 1 to %d parallel samples", KVC_MAX_SAMPLES);
    if (n > 1 && e->p.no_kv_cache)
        return kvc__msgf(KVC_EINVAL, msg, cap, "parallel samples need the KV cache");
    if (n > e->p.max_num_seqs)
        return kvc__msgf(KVC_EINVAL, msg, cap,
                         "n: %u parallel samples, but at most %u requests run at once", n,
                         e->p.max_num_seqs);
    uint32_t parent;
    int rc = submit_one(e, prompt, n_prompt, gp, false, &parent, msg, cap);
    if (rc) return rc;
    uint32_t *kids = n > 1 ? calloc(n - 1, sizeof *kids) : NULL;
    if (n > 1 && !kids) rc = KVC_ENOMEM;
    uint32_t made = 0;
    for (uint32_t k = 1; !rc && k < n; k++) {
        kvc_gen_params_t g = *gp;
        g.seed = gp->seed + k; /* sample k's own stream */
        uint32_t c;
        if ((rc = submit_one(e, prompt, n_prompt, &g, true, &c, msg, cap))) break;
        e->reqs[c].sample_index = k;
        e->reqs[c].fork_wait = true;
        kids[made++] = c;
    }
    if (rc) { /* all or nothing: the parent is still pending, nothing ran */
        for (uint32_t k = 0; k < made; k++) req_release(e, kids[k]);
        free(kids);
        e->n_pend--; /* the parent was the last one queued */
        req_release(e, parent);
        return rc == KVC_ENOMEM ? kvc__msgf(rc, msg, cap, "out of memory") : rc;
    }
    e->reqs[parent].children = kids;
    e->reqs[parent].n_children = made;
    *id = e->reqs[parent].id;
    return 0;
}

static int submit_one(kvc_engine_t *e, const kvc_token_t *prompt, uint32_t n_prompt,
                      const kvc_gen_params_t *gp, bool child, uint32_t *out_slot, char *msg,
                      size_t cap)
{
    const kvc_model_hparams_t *h = &e->m->h;
    if (!n_prompt) return kvc__msgf(KVC_EINVAL, msg, cap, "empty prompt");
    for (uint32_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || (uint32_t)prompt[i] >= h->vocab)
            return kvc__msgf(KVC_EINVAL, msg, cap, "prompt token %d is not in the vocabulary (%u)",
                             prompt[i], h->vocab);
    if (n_prompt >= e->p.max_ctx)
        return kvc__msgf(KVC_ERANGE, msg, cap,
                         "the prompt has %u tokens; the context holds %u (prompt + output)",
                         n_prompt, e->p.max_ctx);
    if (!gp->max_tokens) return kvc__msgf(KVC_EINVAL, msg, cap, "max tokens must be at least 1");
    if (gp->tenant >= e->p.n_tenants)
        return kvc__msgf(KVC_EINVAL, msg, cap, "tenant %u: the engine has %u", gp->tenant,
                         e->p.n_tenants);
    kvc_sampling_params_t sp;
    kvc__sampling_from_gen(gp, &sp);
    int rc = kvc_sampling_params_check(&sp, msg, cap);
    if (rc) return rc;
    if (gp->n_stop > KVC_MAX_STOP || gp->n_stop_ids > KVC_MAX_STOP)
        return kvc__msgf(KVC_EINVAL, msg, cap, "at most %d stop strings and stop ids",
                         KVC_MAX_STOP);
    for (uint32_t i = 0; i < gp->n_stop_ids; i++)
        if (gp->stop_ids[i] < 0 || (uint32_t)gp->stop_ids[i] >= h->vocab)
            return kvc__msgf(KVC_EINVAL, msg, cap, "stop id %d is not in the vocabulary",
                             gp->stop_ids[i]);
    for (uint32_t i = 0; i < gp->n_stop; i++)
        if (!gp->stop[i] || !gp->stop[i][0] || strlen(gp->stop[i]) > 256)
            return kvc__msgf(KVC_EINVAL, msg, cap, "stop strings: 1 to 256 bytes");
    uint32_t slot;
    if ((rc = req_slot(e, &slot))) return kvc__msgf(rc, msg, cap, "out of memory");
    req_t *r = &e->reqs[slot];
    r->gp = *gp;
    r->n_prompt = n_prompt;
    r->max_out = KVC_MIN(gp->max_tokens, e->p.max_ctx - n_prompt);
    kvc_rng_seed(&r->rng, gp->seed);
    r->out = malloc(r->max_out * sizeof *r->out);
    r->lp = malloc(r->max_out * sizeof *r->lp);
    const uint32_t k = KVC_MIN(gp->n_logprobs, KVC_MAX_LOGPROBS);
    r->gp.n_logprobs = k;
    if (k) {
        r->top_ids = malloc((size_t)r->max_out * k * sizeof *r->top_ids);
        r->top_lp = malloc((size_t)r->max_out * k * sizeof *r->top_lp);
    }
    r->all = malloc((n_prompt + r->max_out + e->p.spec_tokens + 1) * sizeof *r->all);
    rc = (!r->out || !r->lp || !r->all || (k && (!r->top_ids || !r->top_lp))) ? KVC_ENOMEM : 0;
    if (!rc) rc = kvc_tokenizer_stream_create(e->m->tok, KVC_TOK_REMOVE_SPECIAL, &r->ts);
    for (uint32_t i = 0; !rc && i < gp->n_stop; i++) {
        r->stop_len[i] = strlen(gp->stop[i]);
        if (!(r->stop[i] = strdup(gp->stop[i]))) rc = KVC_ENOMEM;
        r->gp.stop[i] = r->stop[i];
    }
    if (rc) {
        req_release(e, slot);
        return kvc__msgf(rc, msg, cap, "out of memory");
    }
    memcpy(r->all, prompt, n_prompt * sizeof *prompt);
    r->n_all = n_prompt;
    r->submit_s = wall_s();
    r->first_s = -1;
    if (!r->gen) r->gen = 1;
    r->id = ((uint64_t)r->gen << 32) | slot;
    if (e->p.no_kv_cache) {
        if (e->q_len >= 4096) {
            req_release(e, slot);
            return kvc__msgf(KVC_ENOSPC, msg, cap, "too many requests queued");
        }
        e->queue[(e->q_head + e->q_len++) % 4096] = slot;
    } else {
        /* it must fit the pool (its prompt and a first token), whenever it is admitted */
        const uint64_t need =
            ((uint64_t)n_prompt + 1 + e->p.block_size - 1) / e->p.block_size * e->m->n_groups;
        if (need > e->st.n_blocks) {
            req_release(e, slot);
            return kvc__msgf(KVC_ERANGE, msg, cap,
                             "the prompt needs %llu KV blocks; the pool has %u (--kv-memory)",
                             (unsigned long long)need, e->st.n_blocks);
        }
        if (e->n_pend == e->pend_cap) {
            uint32_t c = e->pend_cap ? 2 * e->pend_cap : 16;
            uint32_t *v = realloc(e->pend, c * sizeof *v);
            if (!v) {
                req_release(e, slot);
                return kvc__msgf(KVC_ENOMEM, msg, cap, "out of memory");
            }
            e->pend = v, e->pend_cap = c;
        }
        if (!child) e->pend[e->n_pend++] = slot;
    }
    r->used = true;
    *out_slot = slot;
    return 0;
}

int kvc_engine_abort(kvc_engine_t *e, kvc_gen_id_t id)
{
    if (!e) return KVC_EINVAL;
    const uint32_t slot = (uint32_t)id;
    if (slot >= e->n_reqs) return KVC_ESTALE;
    req_t *r = &e->reqs[slot];
    if (!r->used || r->id != id || r->finish) return KVC_ESTALE;
    if (r->in_sched) return kvc_sched_abort(e->sched, r->sid);
    r->finish = KVC_FINISH_ABORT; /* pending or no-kv-cache: finished at the next step */
    return 0;
}

/* ---- outputs --------------------------------------------------------------------------- */
static int text_append(req_t *r, const char *s, size_t n)
{
    if (r->text_len + n + 1 > r->text_cap) {
        size_t c = KVC_MAX(r->text_cap * 2, r->text_len + n + 64);
        char *t = realloc(r->text, c);
        if (!t) return KVC_ENOMEM;
        r->text = t, r->text_cap = c;
    }
    memcpy(r->text + r->text_len, s, n);
    r->text_len += n;
    r->text[r->text_len] = 0;
    return 0;
}

/* Record one emitted token: its text, and whether it ends the request.  Returns the finish. */
static kvc_finish_t emit_token(kvc_engine_t *e, req_t *r, kvc_token_t t, float lp,
                               const kvc_sample_result_t *sr)
{
    const kvc_tokenizer_t *tok = e->m->tok;
    if (r->first_s < 0) r->first_s = wall_s();
    r->out[r->n_out] = t;
    r->lp[r->n_out] = lp;
    if (r->gp.n_logprobs && sr)
        for (uint32_t i = 0; i < r->gp.n_logprobs; i++) {
            r->top_ids[(size_t)r->n_out * r->gp.n_logprobs + i] =
                i < sr->n_top ? sr->top_ids[i] : -1;
            r->top_lp[(size_t)r->n_out * r->gp.n_logprobs + i] =
                i < sr->n_top ? sr->top_logprobs[i] : -INFINITY;
        }
    r->n_out++;
    r->all[r->n_all++] = t;
    bool stop = !r->gp.ignore_eos && t == kvc_tokenizer_eos(tok);
    for (uint32_t i = 0; i < r->gp.n_stop_ids; i++) stop |= t == r->gp.stop_ids[i];
    char buf[1024];
    size_t nb = 0;
    if (!stop && kvc_tokenizer_stream_push(r->ts, t, buf, sizeof buf, &nb) == 0 && nb) {
        size_t before = r->text_len;
        if (text_append(r, buf, nb)) return KVC_FINISH_ERROR;
        /* a stop string ends the text where it starts (the search starts early enough to
         * catch one that straddles the previous text) */
        for (uint32_t i = 0; i < r->gp.n_stop; i++) {
            size_t from = before >= r->stop_len[i] ? before - r->stop_len[i] + 1 : 0;
            char *hit = r->text_len >= r->stop_len[i]
                            ? memmem(r->text + from, r->text_len - from, r->stop[i], r->stop_len[i])
                            : NULL;
            if (hit) {
                r->text_len = (size_t)(hit - r->text);
                r->text[r->text_len] = 0;
                stop = true;
            }
        }
    }
    if (stop) return KVC_FINISH_STOP;
    if (r->n_out >= r->max_out) return KVC_FINISH_LENGTH;
    return KVC_FINISH_NONE;
}

/* The text of r that is safe to show: all of it once finished, else all but the longest tail
 * that could still start a stop string. */
static size_t text_ready(const req_t *r)
{
    if (r->finish) return r->text_len;
    size_t hold = 0;
    for (uint32_t i = 0; i < r->gp.n_stop; i++)
        for (size_t k = KVC_MIN(r->stop_len[i] - 1, r->text_len); k > hold; k--)
            if (!memcmp(r->text + r->text_len - k, r->stop[i], k)) {
                hold = k;
                break;
            }
    return r->text_len - hold;
}

static void send_event(req_t *r, const kvc_token_t *toks, const float *lps, uint32_t n,
                       kvc_gen_event_fn fn, void *ctx)
{
    if (r->finish) {
        char tail[1024];
        size_t nb = 0;
        if (r->finish != KVC_FINISH_STOP || !r->gp.n_stop) {
            if (kvc_tokenizer_stream_finish(r->ts, tail, sizeof tail, &nb) == 0 && nb)
                (void)text_append(r, tail, nb);
        }
    }
    size_t ready = text_ready(r);
    if (!fn) {
        r->text_sent = KVC_MAX(r->text_sent, ready);
        return;
    }
    kvc_gen_event_t ev = {.id = r->id,
                          .tag = r->gp.tag,
                          .tokens = toks,
                          .n_tokens = n,
                          .logprobs = lps,
                          .text = r->text ? r->text + r->text_sent : "",
                          .text_len = ready > r->text_sent ? ready - r->text_sent : 0,
                          .finish = r->finish};
    char saved = 0;
    if (r->text && ready < r->text_len) saved = r->text[ready], r->text[ready] = 0;
    fn(ctx, &ev);
    if (saved) r->text[ready] = saved;
    r->text_sent = KVC_MAX(r->text_sent, ready);
}

static int done_push(kvc_engine_t *e, uint32_t slot, uint32_t cached, uint32_t preempt,
                     double finish)
{
    req_t *r = &e->reqs[slot];
    kvc_gen_done_t *d = realloc(e->done, (e->n_done + 1) * sizeof *d);
    if (!d) return KVC_ENOMEM;
    e->done = d;
    uint32_t *ds = realloc(e->done_slot, (e->n_done + 1) * sizeof *ds);
    if (!ds) return KVC_ENOMEM;
    e->done_slot = ds;
    e->done_slot[e->n_done] = slot;
    kvc_gen_done_t *dn = &e->done[e->n_done];
    *dn = (kvc_gen_done_t){.id = r->id,
                           .tag = r->gp.tag,
                           .prompt_tokens = r->n_prompt,
                           .cached_tokens = cached,
                           .completion_tokens = r->n_out,
                           .output = r->out,
                           .logprobs = r->gp.logprobs || r->gp.n_logprobs ? r->lp : NULL,
                           .top_ids = r->top_ids,
                           .top_logprobs = r->top_lp,
                           .n_logprobs = r->gp.n_logprobs,
                           .text = r->text ? r->text : "",
                           .finish = r->finish,
                           .submit_s = r->submit_s,
                           .first_token_s = r->first_s,
                           .finish_s = finish,
                           .preemptions = preempt,
                           .draft_tokens = r->drafts,
                           .accepted_tokens = r->accepted,
                           .sample_index = r->sample_index};
    e->n_done++;
    /* of the blocks the scheduler's lookup hit, those this request's fetch brought in */
    const uint32_t hit_blocks = cached / e->p.block_size;
    for (uint32_t k = 0; k < r->tf.n_runs; k++) {
        const uint32_t a = r->tf.run_start[k], b = KVC_MIN(r->tf.run_end[k], hit_blocks);
        if (b > a) dn->tier_cached_tokens[r->tf.run_tier[k]] += (b - a) * e->p.block_size;
    }
    return 0;
}

/* Release the requests finished last step (their accounts were borrowed until now). */
static void done_clear(kvc_engine_t *e)
{
    for (uint32_t i = 0; i < e->n_done; i++) req_release(e, e->done_slot[i]);
    e->n_done = 0;
}

void kvc_engine_finished(const kvc_engine_t *e, const kvc_gen_done_t **done, uint32_t *n)
{
    *done = e->done;
    *n = e->n_done;
}

void kvc_engine_stats(const kvc_engine_t *e, kvc_engine_stats_t *out)
{
    *out = e->st;
    if (e->sched) {
        kvc_sched_stats_t s;
        kvc_sched_stats(e->sched, &s);
        out->n_running = s.n_running;
        out->n_waiting = s.n_waiting + s.n_swapped;
        out->preemptions = s.preemptions;
        out->hit_tokens = s.hit_tokens;
        out->swapped_out_bytes = s.swapped_out_bytes;
        out->swapped_in_bytes = s.swapped_in_bytes;
    }
}

uint32_t kvc_engine_n_tiers(const kvc_engine_t *e)
{
    return e ? kvc__etiers_n(e->tiers) : 0;
}

int kvc_engine_tier_stats(const kvc_engine_t *e, uint32_t i, kvc_engine_tier_stats_t *out)
{
    return e ? kvc__etiers_stats(e->tiers, i, out) : KVC_EINVAL;
}

const char *kvc_engine_tier_model_id(const kvc_engine_t *e)
{
    return e ? kvc__etiers_model_id(e->tiers) : "";
}

/* Sample one position of request r from its logits row. */
static int sample_row(kvc_engine_t *e, req_t *r, const float *logits, kvc_sample_result_t *res)
{
    kvc_sampling_params_t sp;
    kvc__sampling_from_gen(&r->gp, &sp);
    /* the penalties look at the output so far */
    return kvc_sample(e->sampler, &sp, &r->rng, logits, r->out, r->n_out, res);
}

/* ---- parallel sampling ------------------------------------------------------------------ */
/* The children of parent r sample their first token from the parent's last prompt row; the
 * ones that go on are listed in the parent's result for kvc_sched_complete to fork. */
static int fork_samples(kvc_engine_t *e, req_t *r, const float *row, kvc_sched_result_t *res,
                        kvc_gen_event_fn fn, void *ctx)
{
    uint32_t n = 0;
    for (uint32_t k = 0; k < r->n_children; k++) {
        const uint32_t cs = r->children[k];
        req_t *c = &e->reqs[cs];
        if (!c->fork_wait) continue;
        c->fork_wait = false;
        kvc_sample_result_t sr;
        int rc = sample_row(e, c, row, &sr);
        if (rc) return rc;
        c->finish = emit_token(e, c, sr.token, sr.logprob, &sr);
        c->computed = r->computed;
        if (c->finish) { /* done at its first token: no fork needed */
            send_event(c, &c->out[0], &c->lp[0], 1, fn, ctx);
            if ((rc = done_push(e, cs, 0, 0, wall_s()))) return rc;
            continue;
        }
        e->fork_tok[n] = sr.token;
        e->fork_tag[n] = cs;
        n++;
    }
    res->n_forks = n;
    res->fork_tokens = e->fork_tok;
    res->fork_tags = e->fork_tag;
    res->fork_ids = e->fork_id;
    e->fork_n = n;
    return 0;
}

/* After kvc_sched_complete: the forked children run on their own from here. */
static int forks_done(kvc_engine_t *e, kvc_gen_event_fn fn, void *ctx)
{
    for (uint32_t k = 0; k < e->fork_n; k++) {
        const uint32_t cs = (uint32_t)e->fork_tag[k];
        req_t *c = &e->reqs[cs];
        if (e->fork_id[k]) {
            c->sid = e->fork_id[k];
            c->in_sched = true;
        } else {
            c->finish = KVC_FINISH_ERROR; /* could not fork: no room to run it */
        }
        send_event(c, &c->out[0], &c->lp[0], 1, fn, ctx);
        if (!e->fork_id[k]) {
            int rc = done_push(e, cs, 0, 0, wall_s());
            if (rc) return rc;
        }
    }
    e->fork_n = 0;
    return 0;
}

/* ---- the step with a cache ------------------------------------------------------------ */
/* Whether pending request p should wait: another request is computing a prompt prefix of at
 * least one block that p shares, and has not computed it yet.  Once it has, p's lookup hits
 * those blocks instead of computing them again (8 requests with one 1024-token prompt compute
 * it once, not 8 times, with no flag). */
static bool hold_back(const kvc_engine_t *e, const req_t *p)
{
    if (!e->pc) return false;
    const uint32_t bs = e->p.block_size;
    for (uint32_t i = 0; i < e->n_reqs; i++) {
        const req_t *a = &e->reqs[i];
        if (!a->used || !a->in_sched || a->finish || a->computed >= a->n_prompt) continue;
        if (memcmp(a->gp.ns.salt, p->gp.ns.salt, KVC_SALT_BYTES) ||
            a->gp.ns.lora_id != p->gp.ns.lora_id || a->gp.ns.weight_epoch != p->gp.ns.weight_epoch)
            continue; /* another namespace: its blocks are never p's hits */
        const uint32_t n = KVC_MIN(p->n_prompt, a->n_prompt) - 1;
        uint32_t l = 0;
        while (l < n && p->all[l] == a->all[l]) l++;
        const uint32_t full = l / bs * bs;
        if (full >= bs && a->computed < full) return true;
    }
    return false;
}

/* The engine's prefill rate for the fetch-or-recompute decision: measured once it has
 * prefilled enough, seeded before from the weights a token streams (a CPU's prefill moves
 * roughly 200 GB/s of weight reuse through its caches; the measurement replaces it soon). */
static double prefill_rate(const kvc_engine_t *e)
{
    if (e->st.prefill_tokens >= 256 && e->st.prefill_s > 0)
        return (double)e->st.prefill_tokens / e->st.prefill_s;
    const uint64_t wb = kvc_llm_weight_bytes_per_token(e->m);
    return 2e11 / (double)(wb ? wb : 1);
}

/* Continue r's prefix lookup in the tiers as it is given to the scheduler, which (see
 * admit_pending) admits it in this very step unless memory or the step's budget is short.  The
 * references the fetch holds (at most half the pool, all fetches together) are dropped once
 * the step is planned: an admitted request's sequence holds the blocks from then on (and
 * invariant 1 holds between steps); one that still waits may lose what was fetched to
 * eviction, which costs a recompute, never a wrong block. */
static void tier_fetch(kvc_engine_t *e, uint32_t slot)
{
    req_t *r = &e->reqs[slot];
    if (r->tf.held || r->tf.n_runs) return;
    const uint32_t cap = e->st.n_blocks / 2, held = kvc__etiers_held(e->tiers);
    if (held >= cap) return;
    (void)kvc__etiers_fetch(e->tiers, &r->gp.ns, r->all, r->n_prompt, prefill_rate(e), cap - held,
                            &r->tf); /* ENOMEM: no fetch, recomputed */
    if (r->tf.held) e->tier_fetched[e->n_tier_fetched++] = slot;
}

/* Give the scheduler the pending requests that need not wait; finish the aborted ones. */
static int admit_pending(kvc_engine_t *e, double now, kvc_gen_event_fn fn, void *ctx)
{
    uint32_t kept = 0;
    int rc = 0;
    /* With tiers, a request is given to the scheduler (and fetched) only when it can be
     * admitted now: nothing waits there and a running slot is free.  The others wait here, in
     * arrival order, so that their fetch happens at their admission, not long before it. */
    uint32_t room = UINT32_MAX;
    if (e->tiers && e->n_pend) {
        kvc_sched_stats_t ss;
        kvc_sched_stats(e->sched, &ss);
        room = ss.n_waiting || ss.n_running >= e->p.max_num_seqs ? 0
                                                                 : e->p.max_num_seqs - ss.n_running;
    }
    for (uint32_t i = 0; i < e->n_pend; i++) {
        const uint32_t slot = e->pend[i];
        req_t *r = &e->reqs[slot];
        if (!rc && !r->finish && (!room || hold_back(e, r))) {
            e->pend[kept++] = slot;
            continue;
        }
        if (!rc && !r->finish) {
            if (e->tiers) room--, tier_fetch(e, slot);
            kvc_sched_req_t q = {.prompt = r->all,
                                 .n_prompt = r->n_prompt,
                                 .max_output = r->max_out,
                                 .priority = r->gp.priority,
                                 .tenant = r->gp.tenant,
                                 .ns = &r->gp.ns,
                                 .tag = slot};
            int arc = kvc_sched_add(e->sched, &q, now, &r->sid);
            if (!arc) {
                r->in_sched = true;
                continue;
            }
            if (arc == KVC_ENOMEM) {
                rc = arc;
                e->pend[kept++] = slot;
                continue;
            }
            r->finish = KVC_FINISH_ERROR;
        }
        if (rc) {
            e->pend[kept++] = slot;
            continue;
        }
        send_event(r, NULL, NULL, 0, fn, ctx);
        if ((rc = done_push(e, slot, 0, 0, wall_s()))) e->pend[kept++] = slot;
    }
    e->n_pend = kept;
    return rc;
}

static int step_cached(kvc_engine_t *e, double now, kvc_gen_event_fn fn, void *ctx, bool *idle)
{
    int rc = admit_pending(e, now, fn, ctx);
    if (rc) return rc;
    const kvc_sched_plan_t *plan;
    rc = kvc_sched_step(e->sched, now, &plan);
    if (rc) return rc;
    const uint32_t n = plan->n_entries;
    /* admitted: their sequences hold what their fetches held (see tier_fetch) */
    for (uint32_t i = 0; i < e->n_tier_fetched; i++)
        kvc__etiers_release(e->tiers, &e->reqs[e->tier_fetched[i]].tf);
    e->n_tier_fetched = 0;
    /* a step that only swapped a request back in (it runs from the next step) is progress */
    *idle =
        n == 0 && e->n_pend == 0 && !plan->n_swapped_in && !plan->n_admitted && !plan->n_preempted;
    const double t0 = wall_s();
    uint32_t n_sel = 0;
    for (uint32_t i = 0; i < n; i++) {
        const kvc_sched_entry_t *en = &plan->entries[i];
        e->segs[i] =
            (kvc__seg_t){.seq = en->seq, .first_pos = en->first_pos, .n_tokens = en->n_tokens};
        e->rows[i] = en->seq;
        e->n_emit[i] = 0;
        e->reqs[en->tag].computed = en->first_pos + en->n_tokens;
        e->results[i] = (kvc_sched_result_t){.id = en->id};
    }
    kvc_step_id_t step = 0;
    if (n) {
        /* rows in flight from here: an abort meanwhile keeps the blocks until completion */
        rc = kvc_step_launch(e->seqs, e->rows, n, &step);
        if (!rc) {
            uint32_t row = 0;
            for (uint32_t i = 0; i < n; i++) {
                const kvc_sched_entry_t *en = &plan->entries[i];
                row += en->n_tokens;
                if (!en->samples) continue;
                for (uint32_t j = en->n_drafts + 1; j-- > 0;) e->sel[n_sel++] = row - 1 - j;
            }
            rc = kvc__fwd_run(&e->fwd, e->seqs, e->segs, n, e->sel, n_sel, e->logits);
            int rc2 = kvc_step_complete(e->seqs, step, e->rows, n, e->live);
            if (!rc) rc = rc2;
        }
        if (rc) return rc;
    }

    /* Sample, verify drafts, decide finishes. */
    uint32_t sel_i = 0;
    const uint32_t vocab = e->m->h.vocab;
    uint32_t *n_emit = e->n_emit;
    for (uint32_t i = 0; i < n; i++) {
        const kvc_sched_entry_t *en = &plan->entries[i];
        req_t *r = &e->reqs[en->tag];
        if (!en->samples || r->finish) {
            if (en->samples) sel_i += en->n_drafts + 1;
            continue;
        }
        const kvc_token_t *seq_tok;
        size_t n_tok;
        if ((rc = kvc_seq_tokens(e->seqs, en->seq, &seq_tok, &n_tok))) break;
        /* drafts are the entry's last n_drafts tokens */
        const kvc_token_t *drafts = seq_tok + en->first_pos + en->n_tokens - en->n_drafts;
        kvc_token_t *em = e->emit + (size_t)i * (e->p.spec_tokens + 1);
        float *eml = e->emit_lp + (size_t)i * (e->p.spec_tokens + 1);
        uint32_t accepted = 0;
        kvc_token_t tok = 0;
        for (uint32_t j = 0; j <= en->n_drafts; j++) {
            kvc_sample_result_t sr;
            if ((rc = sample_row(e, r, e->logits + (size_t)(sel_i + j) * vocab, &sr))) break;
            tok = sr.token;
            em[n_emit[i]] = tok;
            eml[n_emit[i]++] = sr.logprob;
            r->finish = emit_token(e, r, tok, sr.logprob, &sr);
            if (r->finish) break;
            if (j < en->n_drafts && tok == drafts[j])
                accepted++;
            else
                break;
        }
        if (rc) break;
        /* the parent's prompt is done: each waiting child samples the same position with its
         * own stream and, unless that first token ends it, is forked from the parent */
        if (r->n_children && !en->n_drafts) {
            if ((rc = fork_samples(e, r, e->logits + (size_t)sel_i * vocab, &e->results[i], fn,
                                   ctx)))
                break;
        }
        sel_i += en->n_drafts + 1;
        /* the tokens emitted are the accepted drafts and then `tok` (the bonus or the
         * correction), unless a finish came first: then the last emitted is `tok` too */
        e->results[i].n_accepted = n_emit[i] - 1;
        e->results[i].token = tok;
        e->results[i].finished = r->finish != KVC_FINISH_NONE;
        r->drafts += en->n_drafts;
        r->accepted += n_emit[i] - 1;
        e->st.draft_tokens += en->n_drafts;
        e->st.accepted_tokens += n_emit[i] - 1;
    }
    if (rc) return rc;
    const double t1 = wall_s();
    if (n) {
        e->st.steps++;
        e->st.prefill_tokens += plan->n_prefill_tokens;
        if (plan->n_prefill_tokens)
            e->st.prefill_s += t1 - t0;
        else {
            e->st.decode_s += t1 - t0;
            for (uint32_t i = 0; i < n; i++) e->st.decode_tokens += n_emit[i];
        }
    }
    if ((rc = kvc_sched_complete(e->sched, e->results, n, now))) return rc;
    kvc__etiers_flush(e->tiers); /* the blocks this step cached, to the write-through tiers */
    kvc_pool_stats_t ps;
    kvc_pool_stats(e->pool, &ps);
    e->st.peak_blocks = KVC_MAX(e->st.peak_blocks, ps.n_used);
    if ((rc = forks_done(e, fn, ctx))) return rc;

    for (uint32_t i = 0; i < n; i++) {
        const kvc_sched_entry_t *en = &plan->entries[i];
        if (!n_emit[i]) continue;
        req_t *r = &e->reqs[en->tag];
        send_event(r, e->emit + (size_t)i * (e->p.spec_tokens + 1),
                   e->emit_lp + (size_t)i * (e->p.spec_tokens + 1), n_emit[i], fn, ctx);
    }

    const kvc_sched_done_t *done;
    uint32_t n_done;
    if ((rc = kvc_sched_take_finished(e->sched, &done, &n_done))) return rc;
    for (uint32_t i = 0; i < n_done; i++) {
        uint32_t slot = (uint32_t)done[i].tag;
        req_t *r = &e->reqs[slot];
        if (!r->finish) {
            r->finish = done[i].aborted ? KVC_FINISH_ABORT
                        : done[i].error ? KVC_FINISH_ERROR
                                        : KVC_FINISH_LENGTH;
            send_event(r, NULL, NULL, 0, fn, ctx);
        }
        if ((rc = done_push(e, slot, done[i].n_hit_tokens, done[i].n_preemptions, wall_s())))
            return rc;
        /* children never forked (the parent ended before its prompt did) end with it */
        for (uint32_t k = 0; k < r->n_children; k++) {
            req_t *c = &e->reqs[r->children[k]];
            if (!c->used || !c->fork_wait) continue;
            c->fork_wait = false;
            c->finish = r->finish == KVC_FINISH_ABORT ? KVC_FINISH_ABORT : KVC_FINISH_ERROR;
            send_event(c, NULL, NULL, 0, fn, ctx);
            if ((rc = done_push(e, r->children[k], 0, 0, wall_s()))) return rc;
        }
    }
    return 0;
}

/* ---- the step without a cache: one token of the oldest request, its whole sequence
 * recomputed in a scratch pool ----------------------------------------------------------- */
static int step_nocache(kvc_engine_t *e, kvc_gen_event_fn fn, void *ctx, bool *idle)
{
    *idle = e->q_len == 0;
    if (!e->q_len) return 0;
    const uint32_t slot = e->queue[e->q_head];
    req_t *r = &e->reqs[slot];
    int rc = 0;
    const double t0 = wall_s();
    if (!r->finish) {
        kvc_seq_desc_t d = {.prompt = r->all, .n_prompt = r->n_all};
        kvc_seq_t s;
        if ((rc = kvc_seq_create(e->nseqs, &d, &s))) return rc;
        const uint32_t B = e->p.max_num_batched_tokens;
        for (uint32_t pos = 0; pos < r->n_all && !rc; pos += B) {
            uint32_t cnt = KVC_MIN(B, r->n_all - pos);
            kvc__seg_t sg = {.seq = s, .first_pos = pos, .n_tokens = cnt};
            uint32_t last = cnt - 1;
            bool final = pos + cnt == r->n_all;
            if (!(rc = kvc_seq_reserve(e->nseqs, s, cnt, NULL)))
                rc = kvc__fwd_run(&e->nfwd, e->nseqs, &sg, 1, &last, final ? 1 : 0, e->logits);
            if (!rc) rc = kvc_seq_complete(e->nseqs, s, cnt);
        }
        int rc2 = kvc_seq_destroy(e->nseqs, s);
        if (!rc) rc = rc2;
        if (rc) return rc;
        kvc_sample_result_t sr;
        if ((rc = sample_row(e, r, e->logits, &sr))) return rc;
        if (r->n_out == 0)
            e->st.prefill_tokens += r->n_prompt;
        else
            e->st.decode_tokens++;
        r->finish = emit_token(e, r, sr.token, sr.logprob, &sr);
        const double t1 = wall_s();
        if (r->n_out == 1)
            e->st.prefill_s += t1 - t0;
        else
            e->st.decode_s += t1 - t0;
        e->st.steps++;
        send_event(r, &r->out[r->n_out - 1], &r->lp[r->n_out - 1], 1, fn, ctx);
    } else
        send_event(r, NULL, NULL, 0, fn, ctx);
    if (r->finish) {
        e->q_head = (e->q_head + 1) % 4096;
        e->q_len--;
        if ((rc = done_push(e, slot, 0, 0, wall_s()))) return rc;
    }
    return 0;
}

int kvc_engine_step(kvc_engine_t *e, double now, kvc_gen_event_fn fn, void *ctx, bool *idle)
{
    bool dummy;
    if (!idle) idle = &dummy;
    if (!e || !isfinite(now)) return KVC_EINVAL;
    done_clear(e);
    return e->p.no_kv_cache ? step_nocache(e, fn, ctx, idle) : step_cached(e, now, fn, ctx, idle);
}
