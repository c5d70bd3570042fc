/* forward.c - the batched forward pass over the paged cache.
 *
 * One call computes the rows of several sequences at once (prefill chunks and decodes
 * mixed): every matrix is one batched matmul over all rows; K/V go to the slots seq
 * reserved; attention reads the block tables in CSR form.  Nothing here mixes rows: each
 * row's result depends only on its own tokens, its position and the K/V its sequence holds,
 * which is what makes a request's logits independent of the batch (DESIGN.md invariant 10). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "forward_int.h"
#include "util/msg.h"

#define ALIGN64(n) (((n) + 63) & ~(size_t)63)

static void *amalloc(size_t bytes)
{
    return aligned_alloc(64, ALIGN64(bytes ? bytes : 64));
}

void kvc__fwd_free(kvc__fwd_t *f)
{
    if (!f) return;
    free(f->x), free(f->xn), free(f->q), free(f->k), free(f->v), free(f->ao), free(f->o);
    free(f->g), free(f->u), free(f->rc), free(f->rs), free(f->pos), free(f->tok);
    free(f->slots), free(f->rows), free(f->qo_indptr), free(f->sel_x), free(f->mm_ws);
    for (uint32_t i = 0; i < KVC_MAX_GROUPS; i++)
        free(f->kv_indptr[i]), free(f->kv_indices[i]), free(f->kv_last[i]);
    if (f->attn_ws)
        for (uint32_t t = 0; t < f->n_threads; t++) free(f->attn_ws[t]);
    free(f->attn_ws);
    free(f->views);
    memset(f, 0, sizeof *f);
}

int kvc__fwd_init(kvc__fwd_t *f, const kvc_llm_t *m, kvc_pool_t *pool, uint32_t max_rows,
                  uint32_t max_seqs, uint32_t max_seq_blocks, uint32_t max_sel,
                  kvc_threadpool_t *tp, kvc_isa_t isa)
{
    memset(f, 0, sizeof *f);
    const kvc_model_hparams_t *h = &m->h;
    f->m = m;
    f->pool = pool;
    f->tp = tp;
    f->isa = isa;
    f->n_threads = kvc_threadpool_size(tp);
    f->max_rows = max_rows;
    f->max_seqs = max_seqs;
    f->max_sel = max_sel;
    const size_t B = max_rows, q_dim = (size_t)h->n_heads * h->head_dim,
                 kv_dim = (size_t)h->n_kv_heads * h->head_dim;
    f->x = amalloc(B * h->dim * 4);
    f->xn = amalloc(B * KVC_MAX(h->dim, q_dim) * 4);
    f->q = amalloc(B * q_dim * 4);
    f->k = amalloc(B * kv_dim * 4);
    f->v = amalloc(B * kv_dim * 4);
    f->ao = amalloc(B * q_dim * 4);
    f->o = amalloc(B * h->dim * 4);
    f->g = amalloc(B * h->ff * 4);
    f->u = amalloc(B * h->ff * 4);
    f->rc = amalloc(B * (h->rope_dim / 2 + 1) * 4);
    f->rs = amalloc(B * (h->rope_dim / 2 + 1) * 4);
    f->pos = amalloc(B * 4);
    f->tok = amalloc(B * sizeof(kvc_token_t));
    f->slots = amalloc(B * m->n_groups * sizeof(int64_t));
    f->rows = amalloc(max_seqs * sizeof(kvc_seq_t));
    f->qo_indptr = amalloc((max_seqs + 1) * 4);
    f->sel_x = amalloc((size_t)max_sel * h->dim * 4);
    /* every row's table, shared blocks listed once per row that holds them */
    f->kv_cap = (size_t)max_seqs * max_seq_blocks;
    for (uint32_t gr = 0; gr < m->n_groups; gr++) {
        f->kv_indptr[gr] = amalloc((max_seqs + 1) * 4);
        f->kv_last[gr] = amalloc(max_seqs * 4);
        f->kv_indices[gr] = amalloc(f->kv_cap * 4);
    }
    f->views = calloc(h->n_layers, sizeof *f->views);
    f->attn_ws = calloc(f->n_threads, sizeof *f->attn_ws);
    if (!f->x || !f->xn || !f->q || !f->k || !f->v || !f->ao || !f->o || !f->g || !f->u || !f->rc ||
        !f->rs || !f->pos || !f->tok || !f->slots || !f->rows || !f->qo_indptr || !f->sel_x ||
        !f->views || !f->attn_ws)
        return KVC_ENOMEM;
    for (uint32_t gr = 0; gr < m->n_groups; gr++)
        if (!f->kv_indptr[gr] || !f->kv_last[gr] || !f->kv_indices[gr]) return KVC_ENOMEM;
    for (uint32_t l = 0; l < h->n_layers; l++) {
        int rc = kvc_kv_view_from_pool(pool, m->layer[l].slab, KVC_SCALE_NONE, &f->views[l]);
        if (rc) return rc;
    }
    f->attn_ws_bytes = kvc_attn_workspace_bytes(&f->views[0], NULL);
    for (uint32_t t = 0; t < f->n_threads; t++)
        if (!(f->attn_ws[t] = amalloc(f->attn_ws_bytes))) return KVC_ENOMEM;
    /* One matmul workspace for the largest need of any matrix at the batch size. */
    size_t ws = 0;
    const kvc_mat_t *mats[8];
    for (uint32_t l = 0; l < h->n_layers; l++) {
        const kvc__llm_layer_t *L = &m->layer[l];
        mats[0] = &L->wq, mats[1] = &L->wk, mats[2] = &L->wv, mats[3] = &L->wo;
        mats[4] = &L->w_gate, mats[5] = &L->w_up, mats[6] = &L->w_down;
        for (int i = 0; i < 7; i++) ws = KVC_MAX(ws, kvc_matmul_workspace_bytes(mats[i], max_rows));
        ws = KVC_MAX(ws, kvc_matmul_multi_workspace_bytes(mats, 3, max_rows));     /* q, k, v */
        ws = KVC_MAX(ws, kvc_matmul_multi_workspace_bytes(mats + 4, 2, max_rows)); /* gate, up */
    }
    ws = KVC_MAX(ws, kvc_matmul_workspace_bytes(&m->out, max_sel));
    f->mm_ws_bytes = ws;
    if (!(f->mm_ws = amalloc(ws))) return KVC_ENOMEM;
    return 0;
}

/* ---- the elementwise pieces (fixed order per row) --------------------------------------- */
static void rmsnorm(float *y, const float *x, const float *w, uint32_t n, double eps)
{
    double ss = 0;
    for (uint32_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    const float r = (float)(1.0 / sqrt(ss / n + eps));
    for (uint32_t i = 0; i < n; i++) y[i] = x[i] * r * w[i];
}

/* cos/sin of each rotated pair at `pos`, with the model's RoPE scaling. */
static void rope_table(const kvc_llm_t *m, uint32_t pos, float *c, float *s)
{
    const kvc_model_hparams_t *h = &m->h;
    const uint32_t half = h->rope_dim / 2;
    const double factor = h->rope_factor > 0 ? h->rope_factor : 1;
    double mscale = 1;
    double low = 0, high = 0;
    if (h->rope_scaling == KVC_ROPE_SCALING_YARN) {
        /* YaRN: interpolate the low frequencies, keep the high ones, ramp in between
         * (beta_fast 32, beta_slow 1), and scale the attention by 1 + 0.1 ln(factor).  With
         * no original context in the file, llama.cpp and HF take the context length. */
        const double orig = h->rope_orig_ctx ? (double)h->rope_orig_ctx : (double)h->ctx;
        const double two_ln_base = 2 * log(h->rope_theta);
        low = floor(h->rope_dim * log(orig / (32 * 2 * M_PI)) / two_ln_base);
        high = ceil(h->rope_dim * log(orig / (1 * 2 * M_PI)) / two_ln_base);
        low = fmax(0, low), high = fmin(h->rope_dim - 1, high);
        mscale = 1 + 0.1 * log(factor);
    }
    for (uint32_t i = 0; i < half; i++) {
        const double freq = pow(h->rope_theta, -2.0 * i / h->rope_dim);
        double theta = pos * freq;
        switch (h->rope_scaling) {
        case KVC_ROPE_SCALING_LINEAR:
            theta /= factor;
            break;
        case KVC_ROPE_SCALING_LLAMA3:
            theta /= m->rope_freqs[i];
            break;
        case KVC_ROPE_SCALING_YARN: {
            double y = (i - low) / fmax(0.001, high - low);
            double ramp = 1 - fmin(1, fmax(0, y));
            theta = (theta / factor) * (1 - ramp) + theta * ramp;
            break;
        }
        default:
            break;
        }
        c[i] = (float)(cos(theta) * mscale);
        s[i] = (float)(sin(theta) * mscale);
    }
}

static void rope_apply(float *v, uint32_t n_heads, uint32_t head_dim, uint32_t rope_dim, bool neox,
                       const float *c, const float *s)
{
    const uint32_t half = rope_dim / 2;
    for (uint32_t hh = 0; hh < n_heads; hh++) {
        float *x = v + (size_t)hh * head_dim;
        for (uint32_t i = 0; i < half; i++) {
            const uint32_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
            const float x0 = x[a], x1 = x[b];
            x[a] = x0 * c[i] - x1 * s[i];
            x[b] = x0 * s[i] + x1 * c[i];
        }
    }
}

static float gelu_tanh(float x)
{
    return 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)));
}

/* ---- parallel attention ------------------------------------------------------------------- */
typedef struct {
    kvc__fwd_t *f;
    const kvc_attn_params_t *ap;
    const kvc_kv_view_t *kv;
    const kvc_attn_batch_t *batch;
    uint32_t n_items, per_task;
    int rc;
} attn_job_t;

static void attn_task(void *ctx, uint32_t task, uint32_t thread)
{
    attn_job_t *j = ctx;
    uint32_t b = task * j->per_task, e = KVC_MIN(b + j->per_task, j->n_items);
    int rc = kvc_attn_forward(j->ap, j->kv, j->batch, j->f->q, j->f->ao, j->f->attn_ws[thread],
                              j->f->attn_ws_bytes, b, e);
    if (rc) j->rc = rc; /* the tables were validated by the first item: a bug if it happens */
}

static int matmul(kvc__fwd_t *f, const kvc_mat_t *w, const float *x, uint32_t n, float *y)
{
    return kvc_matmul(w, x, n, y, f->isa, f->tp, f->mm_ws, f->mm_ws_bytes);
}

/* Several matrices over one x in one parallel region (x quantised once). */
static int matmul_n(kvc__fwd_t *f, const kvc_mat_t *const *w, float *const *y, uint32_t n_mats,
                    const float *x, uint32_t n)
{
    return kvc_matmul_multi(w, y, n_mats, x, n, f->isa, f->tp, f->mm_ws, f->mm_ws_bytes);
}

int kvc__fwd_run(kvc__fwd_t *f, kvc_seqs_t *seqs, const kvc__seg_t *segs, uint32_t n_segs,
                 const uint32_t *sel, uint32_t n_sel, float *logits)
{
    const kvc_llm_t *m = f->m;
    const kvc_model_hparams_t *h = &m->h;
    const uint32_t dim = h->dim, hd = h->head_dim, q_dim = h->n_heads * hd,
                   kv_dim = h->n_kv_heads * hd, ff = h->ff, half = h->rope_dim / 2;
    if (n_segs > f->max_seqs || n_sel > f->max_sel) return KVC_EINVAL;

    /* Rows: segment i's tokens first_pos .. first_pos + n_tokens - 1. */
    uint32_t R = 0;
    f->qo_indptr[0] = 0;
    for (uint32_t i = 0; i < n_segs; i++) {
        const kvc__seg_t *sg = &segs[i];
        if (R + sg->n_tokens > f->max_rows) return KVC_EINVAL;
        const kvc_token_t *toks;
        size_t n_tok;
        int rc = kvc_seq_tokens(seqs, sg->seq, &toks, &n_tok);
        if (rc) return rc;
        if (sg->first_pos + sg->n_tokens > n_tok) return KVC_ERANGE;
        for (uint32_t j = 0; j < sg->n_tokens; j++) {
            f->tok[R + j] = toks[sg->first_pos + j];
            f->pos[R + j] = sg->first_pos + j;
        }
        for (uint32_t gr = 0; gr < m->n_groups; gr++)
            if ((rc = kvc_seq_slots(seqs, sg->seq, gr, sg->first_pos, sg->n_tokens,
                                    f->slots + (size_t)gr * f->max_rows + R)))
                return rc;
        f->rows[i] = sg->seq;
        R += sg->n_tokens;
        f->qo_indptr[i + 1] = R;
    }
    kvc_attn_batch_t batch[KVC_MAX_GROUPS];
    for (uint32_t gr = 0; gr < m->n_groups; gr++) {
        int rc = kvc_seqs_csr(seqs, f->rows, n_segs, gr, f->kv_indptr[gr], f->kv_indices[gr],
                              f->kv_cap, f->kv_last[gr]);
        if (rc) return rc;
        batch[gr] = (kvc_attn_batch_t){.n_seqs = n_segs,
                                       .kv_indptr = f->kv_indptr[gr],
                                       .kv_indices = f->kv_indices[gr],
                                       .kv_last_len = f->kv_last[gr],
                                       .qo_indptr = f->qo_indptr};
    }

    /* Embeddings, and each row's rotation table (shared by every layer). */
    const uint32_t emb_type = m->embd->type;
    for (uint32_t r = 0; r < R; r++) {
        float *x = f->x + (size_t)r * dim;
        const kvc_token_t t = f->tok[r];
        if (t < 0 || (uint32_t)t >= h->vocab) return KVC_EINVAL;
        int rc = kvc_ggml_dequantize_row(
            emb_type, (const uint8_t *)m->embd->data + (size_t)t * m->embd_row_bytes, x, dim);
        if (rc) return rc;
        if (h->embed_scale != 1) {
            const float sc = (float)h->embed_scale;
            for (uint32_t i = 0; i < dim; i++) x[i] *= sc;
        }
        rope_table(m, f->pos[r], f->rc + (size_t)r * half, f->rs + (size_t)r * half);
    }

    for (uint32_t l = 0; l < h->n_layers; l++) {
        const kvc__llm_layer_t *L = &m->layer[l];
        int rc;
        for (uint32_t r = 0; r < R; r++)
            rmsnorm(f->xn + (size_t)r * dim, f->x + (size_t)r * dim, L->attn_norm, dim, h->rms_eps);
        const kvc_mat_t *qkv[] = {&L->wq, &L->wk, &L->wv};
        float *const qkv_out[] = {f->q, f->k, f->v};
        if ((rc = matmul_n(f, qkv, qkv_out, 3, f->xn, R))) return rc;
        for (uint32_t r = 0; r < R; r++) {
            float *q = f->q + (size_t)r * q_dim, *k = f->k + (size_t)r * kv_dim,
                  *v = f->v + (size_t)r * kv_dim;
            if (L->bq) {
                for (uint32_t i = 0; i < q_dim; i++) q[i] += L->bq[i];
                for (uint32_t i = 0; i < kv_dim; i++) k[i] += L->bk[i], v[i] += L->bv[i];
            }
            if (L->q_norm) {
                for (uint32_t hh = 0; hh < h->n_heads; hh++)
                    rmsnorm(q + hh * hd, q + hh * hd, L->q_norm, hd, h->rms_eps);
                for (uint32_t hh = 0; hh < h->n_kv_heads; hh++)
                    rmsnorm(k + hh * hd, k + hh * hd, L->k_norm, hd, h->rms_eps);
            }
            const float *c = f->rc + (size_t)r * half, *s = f->rs + (size_t)r * half;
            rope_apply(q, h->n_heads, hd, h->rope_dim, m->neox, c, s);
            rope_apply(k, h->n_kv_heads, hd, h->rope_dim, m->neox, c, s);
        }
        /* K/V first, then attention: each query sees the keys of this step before it. */
        const kvc_kv_view_t *kv = &f->views[l];
        if ((rc = kvc_attn_write_kv(kv, f->slots + (size_t)L->group * f->max_rows, R, f->k, f->v,
                                    NULL, f->isa)))
            return rc;
        kvc_attn_params_t ap = kvc_attn_params_default();
        ap.n_q_heads = h->n_heads;
        ap.window = L->window;
        ap.softcap = (float)h->attn_softcap;
        /* gemma2's logit scale is 1 / sqrt(query_pre_attn_scalar), which GGUF does not store:
         * the head dim, except Gemma 2 27B's dim / heads, which llama.cpp tells by 46 layers */
        if (h->arch == KVC_ARCH_GEMMA2 && h->n_layers == 46)
            ap.sm_scale = 1.0f / sqrtf((float)(dim / h->n_heads));
        ap.isa = f->isa;
        ap.batch_invariant = !f->fast_attn;
        attn_job_t job = {.f = f, .ap = &ap, .kv = kv, .batch = &batch[L->group]};
        job.n_items = kvc_attn_n_items(&ap, kv, &batch[L->group]);
        if (!job.n_items) return KVC_EINVAL;
        uint32_t n_tasks = KVC_MIN(job.n_items, 4 * f->n_threads);
        job.per_task = (job.n_items + n_tasks - 1) / n_tasks;
        n_tasks = (job.n_items + job.per_task - 1) / job.per_task;
        kvc_threadpool_run(f->tp, attn_task, &job, n_tasks);
        if (job.rc) return job.rc;

        if ((rc = matmul(f, &L->wo, f->ao, R, f->o))) return rc;
        for (uint32_t r = 0; r < R; r++) {
            float *x = f->x + (size_t)r * dim, *o = f->o + (size_t)r * dim;
            if (L->post_attn_norm) rmsnorm(o, o, L->post_attn_norm, dim, h->rms_eps);
            for (uint32_t i = 0; i < dim; i++) x[i] += o[i];
            rmsnorm(f->xn + (size_t)r * dim, x, L->ffn_norm, dim, h->rms_eps);
        }
        const kvc_mat_t *gu[] = {&L->w_gate, &L->w_up};
        float *const gu_out[] = {f->g, f->u};
        if ((rc = matmul_n(f, gu, gu_out, 2, f->xn, R))) return rc;
        const bool gelu = h->arch == KVC_ARCH_GEMMA2;
        for (size_t i = 0, n = (size_t)R * ff; i < n; i++) {
            const float gv = f->g[i];
            f->g[i] = (gelu ? gelu_tanh(gv) : gv / (1.0f + expf(-gv))) * f->u[i];
        }
        if ((rc = matmul(f, &L->w_down, f->g, R, f->o))) return rc;
        for (uint32_t r = 0; r < R; r++) {
            float *x = f->x + (size_t)r * dim, *o = f->o + (size_t)r * dim;
            if (L->post_ffn_norm) rmsnorm(o, o, L->post_ffn_norm, dim, h->rms_eps);
            for (uint32_t i = 0; i < dim; i++) x[i] += o[i];
        }
    }

    /* The LM head, only for the rows that sample. */
    if (!n_sel) return 0;
    for (uint32_t i = 0; i < n_sel; i++) {
        if (sel[i] >= R) return KVC_EINVAL;
        rmsnorm(f->sel_x + (size_t)i * dim, f->x + (size_t)sel[i] * dim, m->out_norm, dim,
                h->rms_eps);
    }
    int rc = matmul(f, &m->out, f->sel_x, n_sel, logits);
    if (rc) return rc;
    if (h->final_softcap > 0) {
        const float cap = (float)h->final_softcap;
        for (size_t i = 0, n = (size_t)n_sel * h->vocab; i < n; i++)
            logits[i] = cap * tanhf(logits[i] / cap);
    }
    return 0;
}
