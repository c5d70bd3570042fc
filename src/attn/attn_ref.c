/* attn_ref.c - the double-precision reference for attention over a paged
 * cache: the definition every kernel is tested against.  Written for
 * obviousness, not speed: each (query, head) walks its visible keys twice
 * (maximum, then weights and sum), decoding every element exactly and
 * multiplying by its block's scale in double. */
#include "attn/attn_int.h"

#include <math.h>

/* Element `c` of a stored row, decoded exactly. */
static double element(const kvc_kv_view_t *kv, const uint8_t *row, uint32_t c)
{
    uint32_t code = 0;
    switch (kvc__el_bytes(kv)) {
    case 4:
        memcpy(&code, row + 4 * (size_t)c, 4);
        break;
    case 2: {
        uint16_t h;
        memcpy(&h, row + 2 * (size_t)c, 2);
        code = h;
        break;
    }
    default:
        code = row[c];
        break;
    }
    return (double)kvc__decode(code, kv->shape.dtype);
}

typedef struct {
    const uint8_t *k, *v;
    kvc__tok_scales_t s;
} key_t_;

static key_t_ key_at(const kvc_kv_view_t *kv, const uint32_t *blocks, uint32_t head, int64_t pos)
{
    uint32_t bs = kv->shape.block_size;
    uint32_t blk = blocks[pos / bs], off = (uint32_t)(pos % bs);
    key_t_ k;
    k.k = kvc__row(kv, blk, head, off, 0);
    k.v = kvc__row(kv, blk, head, off, 1);
    k.s = kvc__tok_scales(kv, kvc__scales(kv, blk), head, off);
    return k;
}

static double logit(const kvc_kv_view_t *kv, const key_t_ *k, const float *q, uint32_t dk,
                    double sm_scale, double softcap)
{
    double z = 0;
    for (uint32_t c = 0; c < dk; c++) {
        double s = k->s.kc ? (double)k->s.kc[c] : (double)k->s.k;
        z += (double)q[c] * element(kv, k->k, c) * s;
    }
    z *= sm_scale;
    if (softcap > 0) z = softcap * tanh(z / softcap);
    return z;
}

/* V element c of a key (a latent's V is its K row, scaled as K is). */
static double value(const kvc_kv_view_t *kv, const key_t_ *k, uint32_t c)
{
    if (kv->shape.n_kv == 1)
        return element(kv, k->k, c) * (k->s.kc ? (double)k->s.kc[c] : (double)k->s.k);
    return element(kv, k->v, c) * (double)k->s.v;
}

int kvc_attn_reference(const kvc_attn_params_t *p, const kvc_kv_view_t *kv,
                       const kvc_attn_batch_t *batch, const float *q, double *out)
{
    if (!p || !kv || !batch || !q || !out) return KVC_EINVAL;
    if (!batch->kv_indptr || !batch->kv_last_len || (batch->n_seqs && !batch->kv_indices))
        return KVC_EINVAL;
    const kvc_scale_shape_t *sh = &kv->shape;
    if (kvc_scale_shape_check(sh) || !p->n_q_heads || p->n_q_heads % sh->n_kv_heads)
        return KVC_EINVAL;
    /* the view the kernels would accept (attn.c's view_ok) */
    if (!kv->base || kv->layer >= sh->n_layers || !kv->n_blocks ||
        kv->block_bytes < kvc_kv_block_bytes(sh))
        return KVC_EINVAL;
    const uint32_t d = sh->head_dim, bs = sh->block_size, hq = p->n_q_heads;
    const uint32_t g = hq / sh->n_kv_heads;
    const double sm = p->sm_scale > 0 ? p->sm_scale : 1.0 / sqrt((double)d);
    /* check the tables before reading anything */
    for (uint32_t s = 0; s < batch->n_seqs; s++) {
        uint32_t nb = batch->kv_indptr[s + 1] - batch->kv_indptr[s];
        if (batch->kv_indptr[s + 1] < batch->kv_indptr[s] || nb == 0) return KVC_EINVAL;
        uint32_t last = batch->kv_last_len[s];
        if (last == 0 || last > bs) return KVC_EINVAL;
        int64_t S = (int64_t)(nb - 1) * bs + last;
        int64_t T = batch->qo_indptr ? batch->qo_indptr[s + 1] - batch->qo_indptr[s] : 1;
        if (T > S) return KVC_EINVAL;
        int64_t lo = p->window ? KVC_MAX(0, S - T - (int64_t)p->window + 1) : 0;
        for (int64_t b = lo / bs; b < nb; b++)
            if (batch->kv_indices[batch->kv_indptr[s] + b] >= kv->n_blocks) return KVC_EINVAL;
    }
    for (uint32_t s = 0; s < batch->n_seqs; s++) {
        const uint32_t *blocks = batch->kv_indices + batch->kv_indptr[s];
        uint32_t nb = batch->kv_indptr[s + 1] - batch->kv_indptr[s];
        int64_t S = (int64_t)(nb - 1) * bs + batch->kv_last_len[s];
        uint32_t q0 = batch->qo_indptr ? batch->qo_indptr[s] : s;
        uint32_t T = batch->qo_indptr ? batch->qo_indptr[s + 1] - q0 : 1;
        for (uint32_t i = 0; i < T; i++) {
            int64_t pos = S - T + i;
            int64_t lo = p->window ? KVC_MAX(0, pos - (int64_t)p->window + 1) : 0;
            for (uint32_t h = 0; h < hq; h++) {
                uint32_t kvh = h / g;
                const float *qr = q + ((size_t)(q0 + i) * hq + h) * d;
                double *o = out + ((size_t)(q0 + i) * hq + h) * d;
                double mx = -INFINITY;
                for (int64_t t = lo; t <= pos; t++) {
                    key_t_ k = key_at(kv, blocks, kvh, t);
                    double z = logit(kv, &k, qr, d, sm, p->softcap);
                    if (z > mx) mx = z;
                }
                double sum = 0;
                for (uint32_t c = 0; c < d; c++) o[c] = 0;
                for (int64_t t = lo; t <= pos; t++) {
                    key_t_ k = key_at(kv, blocks, kvh, t);
                    double w = exp(logit(kv, &k, qr, d, sm, p->softcap) - mx);
                    sum += w;
                    for (uint32_t c = 0; c < d; c++) o[c] += w * value(kv, &k, c);
                }
                for (uint32_t c = 0; c < d; c++) o[c] /= sum;
            }
        }
    }
    return 0;
}
