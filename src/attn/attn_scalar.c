/* attn_scalar.c - the scalar fp32 kernel: the fallback for CPUs without
 * AVX2, and the plainest statement of the tiled algorithm the SIMD kernels
 * share.  Per tile of keys: decode K and V once into fp32 (dequantised with
 * their scales), then for every query row of the item: logits, mask,
 * online-softmax update (rescale when the running max grows), P.V. */
#include "attn/attn_int.h"

#include <math.h>

/* Decode n elements of a stored row into fp32, times a scale (per element
 * when `sc` is non-NULL). */
static void decode_row(float *dst, const uint8_t *src, kvc_dtype_t dt, uint32_t n, float s,
                       const float *sc)
{
    size_t el = kvc_dtype_bytes(dt);
    for (uint32_t c = 0; c < n; c++) {
        uint32_t code = 0;
        if (el == 4)
            memcpy(&code, src + 4 * (size_t)c, 4);
        else if (el == 2) {
            uint16_t h;
            memcpy(&h, src + 2 * (size_t)c, 2);
            code = h;
        } else {
            code = src[c];
        }
        dst[c] = kvc__decode(code, dt) * (sc ? sc[c] : s);
    }
}

size_t kvc__attn_ws_scalar(uint32_t dk, uint32_t dv)
{
    size_t tt = kvc__tile_tokens(dk), r = KVC__ROWS_MAX;
    return 64 * 8 + 4 * (r * dk + r * dv + 2 * r + tt * dk + tt * dv + tt);
}

static void item_one_head(const kvc__attn_cfg_t *cfg, const kvc__attn_item_t *it, void *ws)
{
    const kvc_kv_view_t *kv = cfg->kv;
    const uint32_t dk = cfg->dk, dv = cfg->dv, nr = it->n_rows, tt = kvc__tile_tokens(dk);
    const uint32_t bs = kv->shape.block_size;
    const bool latent = kv->shape.n_kv == 1;
    uint8_t *cur = ws;
    float *qs = kvc__ws_take(&cur, sizeof(float) * nr * dk);
    float *o = kvc__ws_take(&cur, sizeof(float) * nr * dv);
    float *m = kvc__ws_take(&cur, sizeof(float) * nr);
    float *l = kvc__ws_take(&cur, sizeof(float) * nr);
    float *kb = kvc__ws_take(&cur, sizeof(float) * tt * dk);
    float *vb = kvc__ws_take(&cur, sizeof(float) * tt * dv);
    float *s = kvc__ws_take(&cur, sizeof(float) * tt);

    for (uint32_t r = 0; r < nr; r++) {
        for (uint32_t c = 0; c < dk; c++) qs[(size_t)r * dk + c] = it->q[r][c] * cfg->sm_scale;
        for (uint32_t c = 0; c < dv; c++) o[(size_t)r * dv + c] = 0.0f;
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    /* key tiles end at multiples of tt (absolute positions), so that which keys share a
     * tile, and so a row's online-softmax steps, never depend on the other rows */
    for (int64_t t0 = it->lo_min; t0 <= it->hi_max; t0 = (t0 / tt + 1) * tt) {
        uint32_t n = (uint32_t)KVC_MIN((t0 / tt + 1) * tt - t0, it->hi_max - t0 + 1);
        for (uint32_t j = 0; j < n; j++) {
            int64_t pos = t0 + j;
            uint32_t blk = it->blocks[pos / bs], off = (uint32_t)(pos % bs);
            kvc__tok_scales_t ts = kvc__tok_scales(kv, kvc__scales(kv, blk), it->kv_head, off);
            float *kr = kb + (size_t)j * dk;
            decode_row(kr, kvc__row(kv, blk, it->kv_head, off, 0), kv->shape.dtype, dk, ts.k,
                       ts.kc);
            if (latent)
                memcpy(vb + (size_t)j * dv, kr, sizeof(float) * dv);
            else
                decode_row(vb + (size_t)j * dv, kvc__row(kv, blk, it->kv_head, off, 1),
                           kv->shape.dtype, dv, ts.v, NULL);
        }
        for (uint32_t r = 0; r < nr; r++) {
            const float *qr = qs + (size_t)r * dk;
            float *orow = o + (size_t)r * dv;
            float mx = -INFINITY;
            for (uint32_t j = 0; j < n; j++) {
                int64_t pos = t0 + j;
                if (pos < it->lo[r] || pos > it->hi[r]) {
                    s[j] = -INFINITY;
                    continue;
                }
                const float *kr = kb + (size_t)j * dk;
                float z = 0.0f;
                for (uint32_t c = 0; c < dk; c++) z += qr[c] * kr[c];
                if (cfg->softcap > 0) z = cfg->softcap * tanhf(z / cfg->softcap);
                s[j] = z;
                if (z > mx) mx = z;
            }
            if (mx == -INFINITY) continue; /* this row sees none of the tile */
            if (mx > m[r]) {
                float alpha = expf(m[r] - mx); /* 0 on the row's first keys */
                l[r] *= alpha;
                for (uint32_t c = 0; c < dv; c++) orow[c] *= alpha;
                m[r] = mx;
            }
            for (uint32_t j = 0; j < n; j++) {
                if (s[j] == -INFINITY) continue;
                float pj = expf(s[j] - m[r]);
                l[r] += pj;
                const float *vr = vb + (size_t)j * dv;
                for (uint32_t c = 0; c < dv; c++) orow[c] += pj * vr[c];
            }
        }
    }
    for (uint32_t r = 0; r < nr; r++) {
        float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;
        for (uint32_t c = 0; c < dv; c++) it->out[r][c] = o[(size_t)r * dv + c] * inv;
    }
}

void kvc__attn_item_scalar(const kvc__attn_cfg_t *cfg, const kvc__attn_item_t *it, void *ws)
{
    if (it->n_heads == 1) {
        item_one_head(cfg, it, ws);
        return;
    }
    kvc__attn_item_t sub;
    for (uint32_t j = 0; j < it->n_heads; j++) {
        kvc__item_head(it, j, &sub);
        item_one_head(cfg, &sub, ws);
    }
}
