/* beam.c - one request's beam search on the paged cache (kvc_llm_beam_search).
 *
 * The search owns a pool, an optional prefix cache and a seq table of its own, and drives
 * the forward pass directly, as the engine's no-kv-cache mode does: the prompt is computed
 * once (in chunks), then each step runs every live beam's last token as one batched pass
 * (one segment per beam) and moves the table with kvc_seq_beam_step, which frees the dead
 * beams' blocks and forks the survivors copy-on-write.  So the prompt's blocks are stored
 * once and each beam holds only its own tail.  The ranking rules are HF's BeamSearchScorer
 * (engine.h states them); everything is decided in double, deterministically. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "forward_int.h"
#include "kvcache/sample.h"
#include "util/msg.h"

#define BEAM_MAX      64
#define PREFILL_CHUNK 512

kvc_beam_params_t kvc_beam_params_default(void)
{
    return (kvc_beam_params_t){.n_beams = 4,
                               .max_tokens = 16,
                               .length_penalty = 1.0f,
                               .kv_dtype = KVC_DTYPE_F16,
                               .block_size = 16};
}

void kvc_beam_result_free(kvc_beam_result_t *r)
{
    if (!r) return;
    if (r->hyps)
        for (uint32_t i = 0; i < r->n_hyps; i++) free(r->hyps[i].ids);
    free(r->hyps);
    memset(r, 0, sizeof *r);
}

typedef struct {
    uint32_t beam; /* index into the live beams */
    kvc_token_t tok;
    double score; /* cumulative log-probability */
} cand_t;

/* Best first: higher score, then lower beam index, then lower token id. */
static int cand_cmp(const void *pa, const void *pb)
{
    const cand_t *a = pa, *b = pb;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    if (a->beam != b->beam) return a->beam < b->beam ? -1 : 1;
    return (a->tok > b->tok) - (a->tok < b->tok);
}

/* The search's state; everything is released by search_free. */
typedef struct {
    const kvc_llm_t *m;
    kvc_beam_params_t p;
    kvc_threadpool_t *tp;
    kvc_pool_t *pool;
    kvc_prefix_t *pc;
    kvc_seqs_t *seqs;
    kvc__fwd_t fwd;
    float *logits;           /* (n_beams, vocab) */
    cand_t *cands;           /* (n_beams * 2 * n_beams) */
    kvc_token_t *top_ids;    /* (2 * n_beams) */
    double *top_lp;          /* (2 * n_beams) */
    kvc_token_t *ids, *nids; /* (n_beams, max_tokens): each live beam's tokens so far */
    double *cum, *ncum;      /* (n_beams) */
    kvc_seq_t beams[BEAM_MAX], nbeams[BEAM_MAX];
    uint32_t n_live;
    kvc_beam_hyp_t *fin; /* (n_beams + 1) finished, best first */
    uint32_t n_fin;
} search_t;

static void search_free(search_t *s)
{
    if (s->fin)
        for (uint32_t i = 0; i < s->n_fin; i++) free(s->fin[i].ids);
    free(s->fin);
    kvc_seqs_destroy(s->seqs);
    kvc_prefix_destroy(s->pc);
    kvc__fwd_free(&s->fwd);
    kvc_pool_destroy(s->pool);
    kvc_threadpool_destroy(s->tp);
    free(s->logits), free(s->cands), free(s->top_ids), free(s->top_lp);
    free(s->ids), free(s->nids), free(s->cum), free(s->ncum);
}

static double len_score(double sum, uint32_t len, float alpha)
{
    return sum / pow((double)len, (double)alpha);
}

/* Offer a finished hypothesis: ids[0..n) then `last` (if >= 0).  Kept while fewer than
 * n_beams are, or if it beats the worst (which then goes).  Among equal scores the earlier
 * stays ahead. */
static int offer(search_t *s, const kvc_token_t *ids, uint32_t n, kvc_token_t last, double sum,
                 kvc_finish_t finish)
{
    const uint32_t N = s->p.n_beams, n_ids = n + (last >= 0);
    const double sc = len_score(sum, n_ids, s->p.length_penalty);
    if (s->n_fin == N && !(sc > s->fin[N - 1].score)) return 0;
    kvc_beam_hyp_t h = {.n_ids = n_ids, .sum_logprob = sum, .score = sc, .finish = finish};
    h.ids = malloc(n_ids * sizeof *h.ids);
    if (!h.ids) return KVC_ENOMEM;
    if (n) memcpy(h.ids, ids, n * sizeof *ids);
    if (last >= 0) h.ids[n] = last;
    uint32_t at = s->n_fin;
    while (at > 0 && s->fin[at - 1].score < sc) at--;
    memmove(&s->fin[at + 1], &s->fin[at], (s->n_fin - at) * sizeof *s->fin);
    s->fin[at] = h;
    if (++s->n_fin > N) free(s->fin[--s->n_fin].ids);
    return 0;
}

/* Whether token t ends a hypothesis. */
static bool ends(const kvc_beam_params_t *p, kvc_token_t eos, kvc_token_t t)
{
    if (!p->ignore_eos && t == eos) return true;
    for (uint32_t i = 0; i < p->n_stop_ids; i++)
        if (t == p->stop_ids[i]) return true;
    return false;
}

static uint32_t blocks_used(const search_t *s)
{
    kvc_pool_stats_t ps;
    kvc_pool_stats(s->pool, &ps);
    return ps.n_used;
}

static int search_setup(search_t *s, uint32_t n_prompt, kvc_beam_result_t *out, char *msg,
                        size_t cap)
{
    const kvc_llm_t *m = s->m;
    const kvc_model_hparams_t *h = &m->h;
    const kvc_beam_params_t *p = &s->p;
    const uint32_t N = p->n_beams, bs = p->block_size;
    int rc = kvc_threadpool_create(p->n_threads, NULL, &s->tp);
    if (rc) return kvc__msgf(rc, msg, cap, "beam search: threads: %s", kvc_strerror(rc));
    kvc_storage_desc_t sd = {.n_layers = m->storage_layers,
                             .n_kv_heads = h->n_kv_heads,
                             .head_dim = h->head_dim,
                             .dtype = p->kv_dtype};
    size_t block_bytes = 0;
    if ((rc = kvc_storage_block_bytes(&sd, bs, &block_bytes)))
        return kvc__msgf(rc, msg, cap, "beam search: KV block size: %s", kvc_strerror(rc));
    /* Per group: the prompt's blocks once, and per beam its own tail (the prompt's partly
     * filled last block copied, then its output), plus one block a beam for the step's
     * transient copy. */
    const uint32_t total = n_prompt + p->max_tokens;
    const uint32_t seq_blocks = (total + bs - 1) / bs;
    const uint32_t tail = seq_blocks - n_prompt / bs;
    out->prompt_blocks = (n_prompt + bs - 1) / bs * m->n_groups;
    uint64_t n_blocks;
    if (p->kv_memory)
        n_blocks = p->kv_memory / block_bytes;
    else
        n_blocks = (uint64_t)m->n_groups * (n_prompt / bs + (uint64_t)N * (tail + 1));
    if (n_blocks < 1 || n_blocks > (1u << 30))
        return kvc__msgf(KVC_EINVAL, msg, cap,
                         "beam search: --kv-memory: %llu blocks of %zu bytes; need 1 to 2^30",
                         (unsigned long long)n_blocks, block_bytes);
    kvc_pool_params_t pp = kvc_pool_params_default();
    pp.n_blocks = (uint32_t)n_blocks;
    pp.block_size = bs;
    pp.storage = sd;
    if ((rc = kvc_pool_create(&pp, &s->pool)))
        return kvc__msgf(rc, msg, cap, "beam search: pool: %s", kvc_strerror(rc));
    out->n_blocks = (uint32_t)n_blocks;
    if (p->prefix_cache) {
        kvc_prefix_params_t cp = kvc_prefix_params_default();
        for (uint32_t g = 0; g < m->n_groups; g++) cp.group_window[g] = m->group_window[g];
        if ((rc = kvc_prefix_create(s->pool, &cp, &s->pc)))
            return kvc__msgf(rc, msg, cap, "beam search: prefix cache: %s", kvc_strerror(rc));
    }
    kvc_seqs_params_t sp = kvc_seqs_params_default();
    sp.max_seqs = 2 * N + 2;
    sp.max_batch = N;
    sp.n_groups = m->n_groups;
    for (uint32_t g = 0; g < m->n_groups; g++) sp.window[g] = m->group_window[g];
    if ((rc = kvc_seqs_create(s->pool, s->pc, &sp, &s->seqs)))
        return kvc__msgf(rc, msg, cap, "beam search: seq table: %s", kvc_strerror(rc));
    const uint32_t chunk = KVC_MIN(n_prompt, PREFILL_CHUNK);
    rc = kvc__fwd_init(&s->fwd, m, s->pool, KVC_MAX(chunk, N), N, seq_blocks + 1, N, s->tp, p->isa);
    if (rc) return kvc__msgf(rc, msg, cap, "beam search: buffers: %s", kvc_strerror(rc));
    const size_t vocab = h->vocab, T = p->max_tokens;
    s->logits = malloc(N * vocab * sizeof *s->logits);
    s->cands = malloc((size_t)N * 2 * N * sizeof *s->cands);
    s->top_ids = malloc(2 * N * sizeof *s->top_ids);
    s->top_lp = malloc(2 * N * sizeof *s->top_lp);
    s->ids = malloc(N * T * sizeof *s->ids);
    s->nids = malloc(N * T * sizeof *s->nids);
    s->cum = calloc(N, sizeof *s->cum);
    s->ncum = calloc(N, sizeof *s->ncum);
    s->fin = calloc(N + 1, sizeof *s->fin);
    if (!s->logits || !s->cands || !s->top_ids || !s->top_lp || !s->ids || !s->nids || !s->cum ||
        !s->ncum || !s->fin)
        return kvc__msgf(KVC_ENOMEM, msg, cap, "beam search: out of memory");
    return 0;
}

/* The prompt, computed once (after the prefix cache's hit, if any); its last row's logits
 * go to s->logits row 0. */
static int prefill(search_t *s, const kvc_token_t *prompt, uint32_t n_prompt, char *msg, size_t cap)
{
    kvc_seq_desc_t d = {.prompt = prompt, .n_prompt = n_prompt};
    kvc_seq_t q;
    int rc = kvc_seq_create(s->seqs, &d, &q);
    if (rc) return kvc__msgf(rc, msg, cap, "beam search: prompt: %s", kvc_strerror(rc));
    s->beams[0] = q;
    s->n_live = 1;
    size_t hit = 0;
    if (s->pc && (rc = kvc_seq_lookup(s->seqs, q, &hit)))
        return kvc__msgf(rc, msg, cap, "beam search: prefix lookup: %s", kvc_strerror(rc));
    for (uint32_t pos = (uint32_t)hit; pos < n_prompt;) {
        const uint32_t cnt = KVC_MIN(s->fwd.max_rows, n_prompt - pos);
        const uint32_t last = cnt - 1;
        const bool final = pos + cnt == n_prompt;
        kvc__seg_t sg = {.seq = q, .first_pos = pos, .n_tokens = cnt};
        if ((rc = kvc_seq_reserve(s->seqs, q, cnt, NULL)))
            return kvc__msgf(rc, msg, cap,
                             "beam search: the pool (%u blocks) is too small for the prompt "
                             "(%u tokens): %s",
                             kvc_pool_n_blocks(s->pool), n_prompt, kvc_strerror(rc));
        if ((rc = kvc__fwd_run(&s->fwd, s->seqs, &sg, 1, &last, final ? 1 : 0, s->logits)) ||
            (rc = kvc_seq_complete(s->seqs, q, cnt)))
            return kvc__msgf(rc, msg, cap, "beam search: prompt pass: %s", kvc_strerror(rc));
        pos += cnt;
    }
    return 0;
}

int kvc_llm_beam_search(const kvc_llm_t *m, const kvc_beam_params_t *pp, const kvc_token_t *prompt,
                        uint32_t n_prompt, kvc_beam_result_t *out, char *msg, size_t cap)
{
    if (out) memset(out, 0, sizeof *out);
    if (!m || !pp || !prompt || !out)
        return kvc__msgf(KVC_EINVAL, msg, cap, "beam search: NULL arguments");
    const kvc_model_hparams_t *h = &m->h;
    kvc_beam_params_t p = *pp;
    if (!n_prompt) return kvc__msgf(KVC_EINVAL, msg, cap, "beam search: an empty prompt");
    for (uint32_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || (uint32_t)prompt[i] >= h->vocab)
            return kvc__msgf(KVC_EINVAL, msg, cap,
                             "beam search: prompt token %u (%d) is not below the vocabulary (%u)",
                             i, prompt[i], h->vocab);
    if (p.n_beams < 1 || p.n_beams > BEAM_MAX)
        return kvc__msgf(KVC_EINVAL, msg, cap, "--beams: 1 to %d", BEAM_MAX);
    if (2 * (uint64_t)p.n_beams > h->vocab)
        return kvc__msgf(KVC_EINVAL, msg, cap,
                         "--beams: 2 x %u candidates per step need a vocabulary of at least "
                         "that size (%u)",
                         p.n_beams, h->vocab);
    if (p.n_stop_ids > KVC_MAX_STOP)
        return kvc__msgf(KVC_EINVAL, msg, cap, "beam search: at most %d stop ids", KVC_MAX_STOP);
    for (uint32_t i = 0; i < p.n_stop_ids; i++)
        if (p.stop_ids[i] < 0 || (uint32_t)p.stop_ids[i] >= h->vocab)
            return kvc__msgf(KVC_EINVAL, msg, cap,
                             "beam search: stop id %d is not below the vocabulary (%u)",
                             p.stop_ids[i], h->vocab);
    if (p.max_tokens < 1 || p.max_tokens > (1u << 20))
        return kvc__msgf(KVC_EINVAL, msg, cap, "beam search: max tokens: 1 to 2^20");
    if (!isfinite(p.length_penalty))
        return kvc__msgf(KVC_EINVAL, msg, cap, "beam search: the length penalty must be finite");
    if (!p.block_size) p.block_size = 16;
    if (p.block_size > 256 || (p.block_size & (p.block_size - 1)))
        return kvc__msgf(KVC_EINVAL, msg, cap, "--block-size: a power of two, 1 to 256");
    if (kvc_dtype_bytes(p.kv_dtype) == 0)
        return kvc__msgf(KVC_EINVAL, msg, cap, "beam search: bad KV dtype");
    if (!p.n_threads) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        p.n_threads = n > 0 ? (uint32_t)KVC_MIN(n, 256) : 1;
    }
    if (p.n_threads > 256) return kvc__msgf(KVC_EINVAL, msg, cap, "--threads: at most 256");
    const uint64_t ctx = h->ctx ? h->ctx : 2048;
    if ((uint64_t)n_prompt + p.max_tokens > ctx)
        return kvc__msgf(KVC_ERANGE, msg, cap,
                         "beam search: prompt (%u) + max tokens (%u) exceed the context (%llu)",
                         n_prompt, p.max_tokens, (unsigned long long)ctx);

    search_t s = {.m = m, .p = p};
    const uint32_t N = p.n_beams, T = p.max_tokens, vocab = h->vocab;
    const kvc_token_t eos = kvc_tokenizer_eos(m->tok);
    int rc = search_setup(&s, n_prompt, out, msg, cap);
    if (!rc) rc = prefill(&s, prompt, n_prompt, msg, cap);
    uint32_t peak = rc ? 0 : blocks_used(&s);
    kvc_beam_choice_t choice[BEAM_MAX];
    kvc__seg_t segs[BEAM_MAX];
    uint32_t sel[BEAM_MAX];
    /* t: tokens generated by every live beam; the logits of each live beam's next token are
     * in s.logits rows 0 .. n_live - 1. */
    for (uint32_t t = 0; !rc; t++) {
        uint32_t nc = 0;
        for (uint32_t b = 0; b < s.n_live && !rc; b++) {
            rc = kvc_log_softmax_topk(s.logits + (size_t)b * vocab, vocab, 2 * N, s.top_ids,
                                      s.top_lp);
            for (uint32_t j = 0; j < 2 * N && !rc; j++)
                s.cands[nc++] = (cand_t){b, s.top_ids[j], s.cum[b] + s.top_lp[j]};
        }
        if (rc) {
            kvc__msgf(rc, msg, cap, "beam search: step %u: log-softmax: %s", t, kvc_strerror(rc));
            break;
        }
        qsort(s.cands, nc, sizeof *s.cands, cand_cmp);
        /* Walk the 2N best: an EOS or stop id among the first N finishes a hypothesis (one
         * beyond them is dropped); the others continue until N beams are chosen. */
        uint32_t n_next = 0;
        for (uint32_t r = 0; r < 2 * N && r < nc && n_next < N && !rc; r++) {
            const cand_t *c = &s.cands[r];
            if (ends(&p, eos, c->tok)) {
                if (r < N)
                    rc = offer(&s, s.ids + (size_t)c->beam * T, t, c->tok, c->score,
                               KVC_FINISH_STOP);
                continue;
            }
            choice[n_next] = (kvc_beam_choice_t){.parent = c->beam, .token = c->tok};
            memcpy(s.nids + (size_t)n_next * T, s.ids + (size_t)c->beam * T, t * sizeof *s.ids);
            s.nids[(size_t)n_next * T + t] = c->tok;
            s.ncum[n_next] = c->score;
            n_next++;
        }
        if (rc) {
            kvc__msgf(rc, msg, cap, "beam search: out of memory");
            break;
        }
        KVC_ASSERT(n_next == N);
        /* Done: N hypotheses and nothing live can beat them (HF's heuristic), or the length. */
        if (s.n_fin == N && (p.early_stopping ||
                             s.fin[N - 1].score >= len_score(s.ncum[0], t + 1, p.length_penalty)))
            break;
        if (t + 1 == T) {
            for (uint32_t j = 0; j < n_next && !rc; j++)
                rc = offer(&s, s.nids + (size_t)j * T, T, -1, s.ncum[j], KVC_FINISH_LENGTH);
            if (rc) kvc__msgf(rc, msg, cap, "beam search: out of memory");
            break;
        }
        /* Move the table: dead beams freed, survivors forked; each new beam's token appended
         * and its slot reserved.  All or nothing, so an error leaves the beams as they were. */
        if ((rc = kvc_seq_beam_step(s.seqs, s.beams, s.n_live, choice, n_next, s.nbeams, NULL))) {
            if (rc == KVC_ENOSPC || rc == KVC_EBUSY)
                kvc__msgf(
                    rc, msg, cap,
                    "beam search: step %u: the pool (%u blocks) is too small for %u beams: %s",
                    t + 1, kvc_pool_n_blocks(s.pool), N, kvc_strerror(rc));
            else
                kvc__msgf(rc, msg, cap, "beam search: step %u: %s", t + 1, kvc_strerror(rc));
            break;
        }
        memcpy(s.beams, s.nbeams, n_next * sizeof *s.beams);
        s.n_live = n_next;
        kvc_token_t *ti = s.ids;
        s.ids = s.nids, s.nids = ti;
        double *tc = s.cum;
        s.cum = s.ncum, s.ncum = tc;
        peak = KVC_MAX(peak, blocks_used(&s));
        for (uint32_t j = 0; j < n_next; j++) {
            segs[j] = (kvc__seg_t){.seq = s.beams[j], .first_pos = n_prompt + t, .n_tokens = 1};
            sel[j] = j;
        }
        if ((rc = kvc__fwd_run(&s.fwd, s.seqs, segs, n_next, sel, n_next, s.logits))) {
            kvc__msgf(rc, msg, cap, "beam search: step %u: forward pass: %s", t + 1,
                      kvc_strerror(rc));
            break;
        }
        for (uint32_t j = 0; j < n_next && !rc; j++) rc = kvc_seq_complete(s.seqs, s.beams[j], 1);
        if (rc) {
            kvc__msgf(rc, msg, cap, "beam search: step %u: %s", t + 1, kvc_strerror(rc));
            break;
        }
        out->steps++;
    }
    if (!rc) {
        kvc_seqs_stats_t st;
        kvc_seqs_stats(s.seqs, &st);
        out->forks = st.n_forks;
        out->cow_copies = st.n_cow_copies;
        out->peak_blocks = peak;
        out->hyps = s.fin;
        out->n_hyps = s.n_fin;
        s.fin = NULL, s.n_fin = 0;
    } else
        memset(out, 0, sizeof *out);
    search_free(&s);
    return rc;
}
