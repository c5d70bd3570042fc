/* engine_loop.c - the step loop of an inference engine built on kvcache, end to end.
 *
 * What an engine author copies: the library decides which requests run and where their K/V
 * live; the engine owns the weights and the forward pass, allocates no KV of its own, and per
 * step
 *
 *     kvc_sched_step       the plan: which requests run, how many tokens each; their slots
 *                          are reserved (and, under memory pressure, a victim was preempted)
 *     kvc_step_launch      the rows of the plan are in flight from here on
 *     kvc_seq_slots        where each new token's K/V goes (block * block_size + offset)
 *     kvc_seqs_csr         the rows' block tables, in the CSR form the kernels read
 *     per layer:           project Q/K/V, kvc_attn_write_kv at the slots, kvc_attn_forward
 *                          over the block tables, the output projection
 *     sample               one token per row that finishes its prompt or decodes
 *     kvc_step_complete    the step's rows are done; it says which rows' sequences are
 *                          still live (one destroyed meanwhile was reclaimed just now)
 *     kvc_sched_complete   the sampled tokens go back: outputs grow, requests finish, the
 *                          blocks just written become hittable prefixes
 *
 * The model is tiny and random but real: token embeddings plus a position signal, two layers
 * of grouped-query attention (4 query heads over 2 KV heads, head_dim 32) with residual
 * connections, greedy sampling from tied embeddings.  Layer 1's K/V depend on layer 0's
 * attention output, so attention that reads a wrong block, a stale table or a slot written at
 * another position changes every later token.  Each step is checked against the same model run
 * directly, in double precision, over each request's whole history laid out contiguously (no
 * cache, no scheduler): the hidden state of every computed row must agree.
 *
 * The run is arranged so that everything an engine meets happens: chunked prefill, a second
 * request that shares the first one's system prompt (a prefix hit: its first blocks are the
 * first request's, never computed again), and more requests than the 28-block pool holds,
 * so the scheduler preempts one (recompute) and brings it back later.  The program exits 1 if
 * any of that did not happen or any check failed.
 *
 *   engine_loop [-v]       -v: print every step's plan
 */
#include <kvcache/kvcache.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the model's shape and the cache's ------------------------------------------------- */
#define VOCAB      64
#define D_MODEL    32
#define N_LAYERS   2
#define N_Q_HEADS  4
#define N_KV_HEADS 2
#define HEAD_DIM   32 /* the SIMD kernels take multiples of 32; others run the scalar one */
#define QD         (N_Q_HEADS * HEAD_DIM)
#define KVD        (N_KV_HEADS * HEAD_DIM)

#define BLOCK_SIZE 4    /* tokens per KV block */
#define N_BLOCKS   28   /* the whole KV memory: 112 tokens */
#define MAX_SEQS   4    /* requests running at once */
#define MAX_ROWS   32   /* tokens computed per step (the scheduler's token budget) */
#define CHUNK      8    /* prompt tokens per request per step (chunked prefill) */
#define STEP_S     0.01 /* virtual seconds per step: the scheduler never reads a clock */

#define CHECK(call)                                                                    \
    do {                                                                               \
        int rc_ = (call);                                                              \
        if (rc_ != 0) {                                                                \
            fprintf(stderr, "engine_loop: %s:%d: %s: %s\n", __FILE__, __LINE__, #call, \
                    kvc_strerror(rc_));                                                \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

/* ---- the model -------------------------------------------------------------------------- */
typedef struct {
    float emb[VOCAB][D_MODEL]; /* token embeddings, also the output head (tied) */
    float wq[N_LAYERS][QD][D_MODEL];
    float wk[N_LAYERS][KVD][D_MODEL];
    float wv[N_LAYERS][KVD][D_MODEL];
    float wo[N_LAYERS][D_MODEL][QD];
} model_t;

static float randn(kvc_rng_t *r)
{
    double u1 = kvc_rng_double(r), u2 = kvc_rng_double(r);
    return (float)(sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2));
}

static void model_init(model_t *m, uint64_t seed)
{
    kvc_rng_t r;
    kvc_rng_seed(&r, seed);
    const float s = 1.0f / sqrtf((float)D_MODEL);
    for (int t = 0; t < VOCAB; t++)
        for (int j = 0; j < D_MODEL; j++) m->emb[t][j] = randn(&r);
    for (int l = 0; l < N_LAYERS; l++) {
        for (int i = 0; i < QD; i++)
            for (int j = 0; j < D_MODEL; j++) m->wq[l][i][j] = 2.0f * s * randn(&r);
        for (int i = 0; i < KVD; i++)
            for (int j = 0; j < D_MODEL; j++) {
                m->wk[l][i][j] = 2.0f * s * randn(&r);
                m->wv[l][i][j] = s * randn(&r);
            }
        for (int i = 0; i < D_MODEL; i++)
            for (int j = 0; j < QD; j++) m->wo[l][i][j] = 0.5f * s * randn(&r);
    }
}

/* The input of token `t` at position `pos`: its embedding plus a position signal, so that K/V
 * depend on where a token is, not only on what it is. */
static double input_at(const model_t *m, kvc_token_t t, size_t pos, int j)
{
    double freq = pow(100.0, -(double)(j / 2) / (D_MODEL / 2));
    double pe = j % 2 ? cos((double)pos * freq) : sin((double)pos * freq);
    return (double)m->emb[t][j] + pe;
}

/* y[n_out] = w[n_out][n_in] x[n_in], in fp32 (the engine's matmuls). */
static void matvec(const float *w, const float *x, float *y, int n_out, int n_in)
{
    for (int i = 0; i < n_out; i++) {
        float acc = 0.0f;
        for (int j = 0; j < n_in; j++) acc += w[(size_t)i * n_in + j] * x[j];
        y[i] = acc;
    }
}

/* Greedy sampling from the tied output head. */
static kvc_token_t sample(const model_t *m, const float *x)
{
    kvc_token_t best = 0;
    float best_logit = -INFINITY;
    for (kvc_token_t t = 0; t < VOCAB; t++) {
        float z = 0.0f;
        for (int j = 0; j < D_MODEL; j++) z += m->emb[t][j] * x[j];
        if (z > best_logit) best_logit = z, best = t;
    }
    return best;
}

/* ---- requests, and how the scheduler names them ------------------------------------------
 * kvc_sched_add hands out an id ((generation << 32) | slot, recycled once the request's account
 * is taken); results must carry it back.  The request's `tag`, the engine's own handle (here an
 * index into reqs[]), comes back in every plan entry and finished record, so the engine never
 * keeps a table indexed by the scheduler's ids. */

typedef struct {
    const char *name;
    double arrival_s;
    uint32_t max_output;
    kvc_token_t prompt[48];
    uint32_t n_prompt;
    kvc_req_id_t id; /* valid once submitted, until its account is taken */
    bool submitted, finished;
} request_t;

static void submit(kvc_sched_t *s, request_t *reqs, int index, double now)
{
    request_t *r = &reqs[index];
    kvc_sched_req_t q = {.prompt = r->prompt,
                         .n_prompt = r->n_prompt,
                         .max_output = r->max_output,
                         .tag = (uint64_t)index};
    CHECK(kvc_sched_add(s, &q, now, &r->id)); /* the prompt is copied when it is admitted */
    r->submitted = true;
}

/* The request a plan entry or a finished record names, by its tag; NULL if none. */
static request_t *request_of(request_t *reqs, int n, uint64_t tag, kvc_req_id_t id)
{
    if (tag >= (uint64_t)n || !reqs[tag].submitted || reqs[tag].id != id) return NULL;
    return &reqs[tag];
}

/* ---- the engine ---------------------------------------------------------------------------- */
typedef struct {
    const model_t *m;
    kvc_pool_t *pool;     /* the KV memory: N_BLOCKS blocks of every layer's K and V */
    kvc_prefix_t *prefix; /* which blocks hold which prefixes */
    kvc_seqs_t *seqs;     /* each request's block table */
    kvc_sched_t *sched;
    kvc_kv_view_t kv[N_LAYERS]; /* each layer's slice of the pool's storage */
    void *ws;                   /* attention workspace (one per thread that runs items) */
    size_t ws_bytes;

    /* one step's buffers, sized by the scheduler's limits: no allocation per step */
    float x[MAX_ROWS][D_MODEL]; /* hidden state of each row */
    float q[MAX_ROWS][QD], k[MAX_ROWS][KVD], v[MAX_ROWS][KVD], o[MAX_ROWS][QD];
    int64_t slots[MAX_ROWS];
    kvc_seq_t rows[MAX_SEQS]; /* the plan's sequences, in plan order */
    uint32_t qo_indptr[MAX_SEQS + 1];
    uint32_t kv_indptr[MAX_SEQS + 1], kv_last_len[MAX_SEQS];
    uint32_t kv_indices[MAX_SEQS * N_BLOCKS];
    bool live[MAX_SEQS];
    kvc_sched_result_t results[MAX_SEQS];

    /* what the run did, for the checks at the end */
    uint64_t rows_checked;
    double worst_err;
} engine_t;

static void engine_create(engine_t *e, const model_t *m)
{
    memset(e, 0, sizeof *e);
    e->m = m;
    /* The pool owns the bytes of every block: per block, every layer's K then V, each
     * (n_kv_heads, block_size, head_dim) elements.  f32 storage keeps the example exact; bf16
     * (or FP8 with a scale layout and a kvc_kv_quant_t state) is a change of dtype here. */
    kvc_pool_params_t pp = kvc_pool_params_default();
    pp.n_blocks = N_BLOCKS;
    pp.block_size = BLOCK_SIZE;
    pp.storage = (kvc_storage_desc_t){.n_layers = N_LAYERS,
                                      .n_kv_heads = N_KV_HEADS,
                                      .head_dim = HEAD_DIM,
                                      .dtype = KVC_DTYPE_F32};
    CHECK(kvc_pool_create(&pp, &e->pool));
    kvc_prefix_params_t cp = kvc_prefix_params_default(); /* random hash seed per process */
    CHECK(kvc_prefix_create(e->pool, &cp, &e->prefix));
    kvc_seqs_params_t sp = kvc_seqs_params_default(); /* copy-on-write: kvc_pool_copy_block */
    sp.max_seqs = 2 * MAX_SEQS;
    sp.max_batch = MAX_SEQS;
    CHECK(kvc_seqs_create(e->pool, e->prefix, &sp, &e->seqs));
    kvc_sched_params_t schp = kvc_sched_params_default();
    schp.max_num_seqs = MAX_SEQS;
    schp.max_num_batched_tokens = MAX_ROWS;
    schp.max_prefill_chunk = CHUNK;
    schp.preemption = KVC_PREEMPT_RECOMPUTE;
    CHECK(kvc_sched_create(e->seqs, &schp, &e->sched));
    for (uint32_t l = 0; l < N_LAYERS; l++)
        CHECK(kvc_kv_view_from_pool(e->pool, l, KVC_SCALE_NONE, &e->kv[l]));
    e->ws_bytes = kvc_attn_workspace_bytes(&e->kv[0], NULL);
    e->ws = aligned_alloc(64, (e->ws_bytes + 63) & ~(size_t)63);
    if (!e->ws) CHECK(KVC_ENOMEM);
}

static void engine_destroy(engine_t *e)
{
    free(e->ws);
    kvc_sched_destroy(e->sched); /* frees every request's sequence */
    kvc_seqs_destroy(e->seqs);
    kvc_prefix_destroy(e->prefix);
    kvc_pool_destroy(e->pool);
}

/* ---- the reference: the same model, run directly -------------------------------------------
 * The final hidden state of positions 0..S-1 of a sequence, computed in double precision with
 * every K/V recomputed from the tokens and laid out contiguously: no cache, no scheduler, no
 * blocks.  h is (S, D_MODEL). */
static void reference_forward(const model_t *m, const kvc_token_t *tok, uint32_t S, double *h)
{
    double *q = malloc(sizeof(double) * S * QD), *k = malloc(sizeof(double) * S * KVD);
    double *v = malloc(sizeof(double) * S * KVD), *o = malloc(sizeof(double) * S * QD);
    double *w = malloc(sizeof(double) * S);
    if (!q || !k || !v || !o || !w) CHECK(KVC_ENOMEM);
    for (uint32_t p = 0; p < S; p++)
        for (int j = 0; j < D_MODEL; j++) h[(size_t)p * D_MODEL + j] = input_at(m, tok[p], p, j);
    const double scale = 1.0 / sqrt((double)HEAD_DIM);
    for (int l = 0; l < N_LAYERS; l++) {
        for (uint32_t p = 0; p < S; p++) {
            const double *x = h + (size_t)p * D_MODEL;
            for (int i = 0; i < QD; i++) {
                double a = 0;
                for (int j = 0; j < D_MODEL; j++) a += (double)m->wq[l][i][j] * x[j];
                q[(size_t)p * QD + i] = a;
            }
            for (int i = 0; i < KVD; i++) {
                double a = 0, b = 0;
                for (int j = 0; j < D_MODEL; j++)
                    a += (double)m->wk[l][i][j] * x[j], b += (double)m->wv[l][i][j] * x[j];
                k[(size_t)p * KVD + i] = a, v[(size_t)p * KVD + i] = b;
            }
        }
        /* causal attention: position p sees keys 0..p */
        for (uint32_t p = 0; p < S; p++)
            for (int hq = 0; hq < N_Q_HEADS; hq++) {
                const int hk = hq / (N_Q_HEADS / N_KV_HEADS);
                const double *qp = q + (size_t)p * QD + hq * HEAD_DIM;
                double mx = -INFINITY, sum = 0;
                for (uint32_t t = 0; t <= p; t++) {
                    double z = 0;
                    for (int c = 0; c < HEAD_DIM; c++)
                        z += qp[c] * k[(size_t)t * KVD + hk * HEAD_DIM + c];
                    w[t] = z * scale;
                    if (w[t] > mx) mx = w[t];
                }
                for (uint32_t t = 0; t <= p; t++) sum += (w[t] = exp(w[t] - mx));
                double *op = o + (size_t)p * QD + hq * HEAD_DIM;
                for (int c = 0; c < HEAD_DIM; c++) {
                    double a = 0;
                    for (uint32_t t = 0; t <= p; t++)
                        a += w[t] * v[(size_t)t * KVD + hk * HEAD_DIM + c];
                    op[c] = a / sum;
                }
            }
        for (uint32_t p = 0; p < S; p++)
            for (int i = 0; i < D_MODEL; i++) {
                double a = 0;
                for (int j = 0; j < QD; j++) a += (double)m->wo[l][i][j] * o[(size_t)p * QD + j];
                h[(size_t)p * D_MODEL + i] += a;
            }
    }
    free(q), free(k), free(v), free(o), free(w);
}

/* ---- one step ----------------------------------------------------------------------------- */
static void run_step(engine_t *e, const kvc_sched_plan_t *plan)
{
    const uint32_t n = plan->n_entries;
    const model_t *m = e->m;

    /* The rows are in flight from here on: a request aborted meanwhile keeps its blocks
     * until kvc_step_complete, so nothing this step reads or writes is reused under it. */
    for (uint32_t i = 0; i < n; i++) e->rows[i] = plan->entries[i].seq;
    kvc_step_id_t step;
    CHECK(kvc_step_launch(e->seqs, e->rows, n, &step));

    /* Entry i computes positions first_pos .. first_pos + n_tokens - 1 of its sequence (a
     * prompt chunk, or one decode token); its rows are qo_indptr[i] .. qo_indptr[i + 1]. */
    uint32_t n_rows = 0;
    e->qo_indptr[0] = 0;
    for (uint32_t i = 0; i < n; i++) {
        const kvc_sched_entry_t *en = &plan->entries[i];
        const kvc_token_t *tok;
        size_t n_tok;
        CHECK(kvc_seq_tokens(e->seqs, en->seq, &tok, &n_tok));
        for (uint32_t j = 0; j < en->n_tokens; j++) {
            size_t pos = en->first_pos + j;
            for (int c = 0; c < D_MODEL; c++)
                e->x[n_rows + j][c] = (float)input_at(m, tok[pos], pos, c);
        }
        /* where each new token's K/V goes: the slots the scheduler reserved */
        CHECK(kvc_seq_slots(e->seqs, en->seq, 0, en->first_pos, en->n_tokens, e->slots + n_rows));
        n_rows += en->n_tokens;
        e->qo_indptr[i + 1] = n_rows;
    }

    /* The block tables of the batch: sequence i owns blocks kv_indices[kv_indptr[i] ..
     * kv_indptr[i + 1]) in logical order, kv_last_len[i] tokens of its last one in use (the
     * positions this step writes included).  Shared prefix blocks appear in several rows. */
    CHECK(kvc_seqs_csr(e->seqs, e->rows, n, 0, e->kv_indptr, e->kv_indices,
                       KVC_ARRAY_LEN(e->kv_indices), e->kv_last_len));
    const kvc_attn_batch_t batch = {.n_seqs = n,
                                    .kv_indptr = e->kv_indptr,
                                    .kv_indices = e->kv_indices,
                                    .kv_last_len = e->kv_last_len,
                                    .qo_indptr = e->qo_indptr};
    kvc_attn_params_t ap = kvc_attn_params_default(); /* scale 1/sqrt(head_dim), best ISA */
    ap.n_q_heads = N_Q_HEADS;

    for (uint32_t l = 0; l < N_LAYERS; l++) {
        for (uint32_t r = 0; r < n_rows; r++) {
            matvec(&m->wq[l][0][0], e->x[r], e->q[r], QD, D_MODEL);
            matvec(&m->wk[l][0][0], e->x[r], e->k[r], KVD, D_MODEL);
            matvec(&m->wv[l][0][0], e->x[r], e->v[r], KVD, D_MODEL);
        }
        /* K/V first, then attention: each query sees the keys written this step before it
         * (the mask is by absolute position: row j of entry i sits at first_pos + j). */
        CHECK(kvc_attn_write_kv(&e->kv[l], e->slots, n_rows, &e->k[0][0], &e->v[0][0], NULL,
                                KVC_ISA_AUTO));
        /* The work splits into independent items; an engine with threads gives each thread a
         * range of them (and its own workspace).  One thread here: all of them. */
        uint32_t n_items = kvc_attn_n_items(&ap, &e->kv[l], &batch);
        if (n_items == 0) CHECK(KVC_EINVAL);
        CHECK(kvc_attn_forward(&ap, &e->kv[l], &batch, &e->q[0][0], &e->o[0][0], e->ws, e->ws_bytes,
                               0, n_items));
        for (uint32_t r = 0; r < n_rows; r++) {
            float y[D_MODEL];
            matvec(&m->wo[l][0][0], e->o[r], y, D_MODEL, QD);
            for (int c = 0; c < D_MODEL; c++) e->x[r][c] += y[c];
        }
    }

    /* Check every row against the model run directly over the request's whole history. */
    for (uint32_t i = 0; i < n; i++) {
        const kvc_sched_entry_t *en = &plan->entries[i];
        const kvc_token_t *tok;
        size_t n_tok;
        CHECK(kvc_seq_tokens(e->seqs, en->seq, &tok, &n_tok));
        double *h = malloc(sizeof(double) * en->n_context * D_MODEL);
        if (!h) CHECK(KVC_ENOMEM);
        reference_forward(m, tok, en->n_context, h);
        for (uint32_t j = 0; j < en->n_tokens; j++) {
            const double *want = h + (size_t)(en->first_pos + j) * D_MODEL;
            const float *got = e->x[e->qo_indptr[i] + j];
            double err = 0, norm = 1;
            for (int c = 0; c < D_MODEL; c++) {
                double d = fabs((double)got[c] - want[c]);
                if (!(d <= err)) err = d; /* NaN wins */
                norm = fmax(norm, fabs(want[c]));
            }
            err /= norm;
            if (!(err <= e->worst_err)) e->worst_err = err;
            e->rows_checked++;
        }
        free(h);
    }

    /* One token per entry that samples (its prompt is done, or it decodes): from its last row. */
    for (uint32_t i = 0; i < n; i++) {
        const kvc_sched_entry_t *en = &plan->entries[i];
        e->results[i] = (kvc_sched_result_t){.id = en->id};
        if (en->samples) e->results[i].token = sample(m, e->x[e->qo_indptr[i + 1] - 1]);
        /* .finished = true at an end-of-sequence token; here the output cap ends requests */
    }

    /* The step is done.  live[i] is false for a row whose sequence was destroyed while the
     * step ran; an engine that destroys sequences itself drops such a row's result.  Under
     * the scheduler that cannot happen: kvc_sched_abort on a request in the open plan takes
     * effect in kvc_sched_complete, which applies every row. */
    CHECK(kvc_step_complete(e->seqs, step, e->rows, n, e->live));
    for (uint32_t i = 0; i < n; i++)
        if (!e->live[i]) CHECK(KVC_ESTALE);
}

/* ---- the loop --------------------------------------------------------------------------- */
/* A prompt: `shared` tokens of a system prompt, then `own` tokens of the request's own. */
static void make_prompt(request_t *r, const kvc_token_t *sys, uint32_t shared, uint32_t own,
                        uint64_t seed)
{
    kvc_rng_t g;
    kvc_rng_seed(&g, seed);
    r->n_prompt = shared + own;
    for (uint32_t i = 0; i < shared; i++) r->prompt[i] = sys[i];
    for (uint32_t i = shared; i < r->n_prompt; i++)
        r->prompt[i] = (kvc_token_t)kvc_rng_below(&g, VOCAB);
}

int main(int argc, char **argv)
{
    const bool verbose = argc > 1 && strcmp(argv[1], "-v") == 0;
    static model_t model;
    model_init(&model, 42);
    static engine_t eng;
    engine_t *e = &eng;
    engine_create(e, &model);

    /* A system prompt of 16 tokens (4 blocks) that "chat-a" and "chat-b" share; two longer
     * requests arrive while they run, more than the pool can hold at once. */
    kvc_token_t sys[16];
    for (int i = 0; i < 16; i++) sys[i] = (kvc_token_t)((7 * i + 3) % VOCAB);
    request_t reqs[] = {
        {.name = "chat-a", .arrival_s = 0.00, .max_output = 14},
        {.name = "chat-b", .arrival_s = 0.03, .max_output = 14},
        {.name = "long-c", .arrival_s = 0.04, .max_output = 20},
        {.name = "long-d", .arrival_s = 0.05, .max_output = 20},
    };
    const int n_req = (int)KVC_ARRAY_LEN(reqs);
    make_prompt(&reqs[0], sys, 16, 5, 1);
    make_prompt(&reqs[1], sys, 16, 6, 2);
    make_prompt(&reqs[2], sys, 0, 30, 3);
    make_prompt(&reqs[3], sys, 0, 26, 4);

    printf("kvcache %s: %d requests, %d blocks of %d tokens, %s attention kernels\n", kvc_version(),
           n_req, N_BLOCKS, BLOCK_SIZE, kvc_isa_name(kvc_isa_best()));
    int n_finished = 0, failures = 0;
    uint32_t hit_tokens = 0;
    for (uint64_t step = 0; n_finished < n_req; step++) {
        if (step > 10000) {
            fprintf(stderr, "engine_loop: no progress after %llu steps\n",
                    (unsigned long long)step);
            return 1;
        }
        const double now = (double)step * STEP_S;
        for (int i = 0; i < n_req; i++)
            if (!reqs[i].submitted && reqs[i].arrival_s <= now) submit(e->sched, reqs, i, now);

        const kvc_sched_plan_t *plan;
        CHECK(kvc_sched_step(e->sched, now, &plan));
        if (plan->n_entries == 0) continue; /* nothing can run now: wait for arrivals */
        if (verbose) {
            printf("step %3llu:", (unsigned long long)step);
            for (uint32_t i = 0; i < plan->n_entries; i++) {
                const kvc_sched_entry_t *en = &plan->entries[i];
                printf("  %s %s %u@%u", request_of(reqs, n_req, en->tag, en->id)->name,
                       en->prefill ? "prefill" : "decode", en->n_tokens, en->first_pos);
            }
            printf(plan->n_preempted ? "  (preempted %u)\n" : "\n", plan->n_preempted);
        }
        run_step(e, plan);
        CHECK(kvc_sched_complete(e->sched, e->results, plan->n_entries, now + STEP_S));

        const kvc_sched_done_t *done;
        uint32_t n_done;
        CHECK(kvc_sched_take_finished(e->sched, &done, &n_done));
        for (uint32_t i = 0; i < n_done; i++) {
            request_t *r = request_of(reqs, n_req, done[i].tag, done[i].id);
            if (!r || r->finished) return fprintf(stderr, "engine_loop: unknown request\n"), 1;
            r->finished = true;
            n_finished++;
            hit_tokens += done[i].n_hit_tokens;
            printf("%-7s %2u prompt tokens (%2u from the prefix cache), %2u generated, "
                   "preempted %u time(s), %3llu tokens recomputed\n",
                   r->name, done[i].n_prompt, done[i].n_hit_tokens, done[i].n_output,
                   done[i].n_preemptions, (unsigned long long)done[i].recomputed_tokens);
            if (done[i].n_output != r->max_output) {
                fprintf(stderr, "engine_loop: %s generated %u tokens, asked for %u\n", r->name,
                        done[i].n_output, r->max_output);
                failures++;
            }
        }
        char msg[256];
        if (kvc_sched_check(e->sched, msg, sizeof msg)) {
            fprintf(stderr, "engine_loop: step %llu: %s\n", (unsigned long long)step, msg);
            return 1;
        }
    }

    kvc_sched_stats_t st;
    kvc_sched_stats(e->sched, &st);
    printf("%llu steps, %llu rows checked against the direct forward pass: worst relative "
           "error %.2e\n",
           (unsigned long long)st.steps, (unsigned long long)e->rows_checked, e->worst_err);
    /* fp32 kernels against a double-precision reference over at most ~60 keys */
    if (!(e->worst_err <= 1e-4)) {
        fprintf(stderr, "engine_loop: the cache does not hold what the tokens say\n");
        failures++;
    }
    if (hit_tokens == 0) fprintf(stderr, "engine_loop: no prefix hit\n"), failures++;
    if (st.preemptions == 0) fprintf(stderr, "engine_loop: no preemption\n"), failures++;
    engine_destroy(e);
    return failures ? 1 : 0;
}
