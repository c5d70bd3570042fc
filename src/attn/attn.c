/* attn.c - the attn layer's public entry points: views of block storage,
 * argument and block-table checks, the split of a batch into work items,
 * the choice of kernel (ISA and compute path), writes of new K/V with
 * their scales, and MLA's absorption around the shared kernel.  The
 * kernels themselves live in attn_scalar.c, attn_avx2.c and attn_avx512.c;
 * the double-precision reference in attn_ref.c. */
#include "attn/attn_int.h"

#include <math.h>

/* ---- parameters and views ---------------------------------------------------- */
kvc_attn_params_t kvc_attn_params_default(void)
{
    return (kvc_attn_params_t){.n_q_heads = 1};
}

static size_t data_bytes(const kvc_scale_shape_t *s)
{
    return (size_t)s->n_layers * s->n_kv * s->n_kv_heads * s->block_size * s->head_dim *
           kvc_dtype_bytes(s->dtype);
}

size_t kvc_kv_block_bytes(const kvc_scale_shape_t *shape)
{
    if (kvc_scale_shape_check(shape)) return 0;
    return (data_bytes(shape) + kvc_scale_bytes(shape) + 63) & ~(size_t)63;
}

/* Offsets of one layer's slabs and of the side data, as pool.c lays them out. */
static void layer_offsets(const kvc_scale_shape_t *s, uint32_t layer, kvc_kv_view_t *v)
{
    size_t slab = (size_t)s->n_kv_heads * s->block_size * s->head_dim * kvc_dtype_bytes(s->dtype);
    v->k_offset = (size_t)layer * s->n_kv * slab;
    v->v_offset = s->n_kv == 2 ? v->k_offset + slab : v->k_offset;
    v->scale_offset = data_bytes(s);
}

int kvc_kv_view_contiguous(void *buf, size_t bytes, uint32_t n_blocks,
                           const kvc_scale_shape_t *shape, uint32_t layer, kvc_kv_view_t *out)
{
    if (!out || kvc_scale_shape_check(shape) || layer >= shape->n_layers || !n_blocks)
        return KVC_EINVAL;
    size_t bb = kvc_kv_block_bytes(shape);
    if (!buf || (kvc__u128)bb * n_blocks > bytes) return KVC_ERANGE;
    if (data_bytes(shape) % sizeof(float)) return KVC_EINVAL; /* scales must be aligned floats */
    *out = (kvc_kv_view_t){
        .base = buf, .block_bytes = bb, .n_blocks = n_blocks, .layer = layer, .shape = *shape};
    layer_offsets(shape, layer, out);
    return 0;
}

int kvc_kv_view_from_pool(kvc_pool_t *pool, uint32_t layer, kvc_scale_layout_t layout,
                          kvc_kv_view_t *out)
{
    if (!pool || !out) return KVC_EINVAL;
    const kvc_storage_desc_t *d = kvc_pool_storage(pool);
    void *base = kvc_pool_block_data(pool, 0);
    if (!base || layer >= d->n_layers) return KVC_EINVAL;
    kvc_scale_shape_t s = {.n_layers = d->n_layers,
                           .n_kv = d->n_kv ? d->n_kv : 2,
                           .n_kv_heads = d->n_kv_heads,
                           .head_dim = d->head_dim,
                           .block_size = kvc_pool_block_size(pool),
                           .dtype = d->dtype,
                           .layout = layout};
    if (kvc_scale_shape_check(&s) || d->scale_bytes < kvc_scale_bytes(&s)) return KVC_EINVAL;
    if (data_bytes(&s) % sizeof(float)) return KVC_EINVAL;
    *out = (kvc_kv_view_t){.base = base,
                           .block_bytes = kvc_pool_block_bytes(pool),
                           .n_blocks = kvc_pool_n_blocks(pool),
                           .layer = layer,
                           .shape = s};
    layer_offsets(&s, layer, out);
    /* the pool is the authority on where things are: agree with it */
    KVC_ASSERT((uint8_t *)kvc_pool_kv_data(pool, 0, layer, 0) == (uint8_t *)base + out->k_offset);
    return 0;
}

static bool view_ok(const kvc_kv_view_t *kv)
{
    return kv && kv->base && !kvc_scale_shape_check(&kv->shape) && kv->layer < kv->shape.n_layers &&
           kv->n_blocks && kv->block_bytes >= kvc_kv_block_bytes(&kv->shape);
}

/* ---- workspace -------------------------------------------------------------------- */
size_t kvc__attn_ws_bytes(uint32_t dk, uint32_t dv)
{
    size_t a = kvc__attn_ws_scalar(dk, dv), b = kvc__attn_ws_avx2(dk, dv),
           c = kvc__attn_ws_avx512(dk, dv);
    return KVC_MAX(a, KVC_MAX(b, c));
}

/* MLA's own part: absorbed queries and latent outputs for one item. */
static size_t mla_extra_bytes(uint32_t dk, uint32_t dv)
{
    return ((sizeof(float) * KVC__ROWS_MAX * dk + 63) & ~(size_t)63) +
           ((sizeof(float) * KVC__ROWS_MAX * dv + 63) & ~(size_t)63);
}

size_t kvc_attn_workspace_bytes(const kvc_kv_view_t *kv, const kvc_mla_dims_t *mla)
{
    if (!kv || kvc_scale_shape_check(&kv->shape)) return 0;
    uint32_t d = kv->shape.head_dim;
    if (!mla) return kvc__attn_ws_bytes(d, d) + 64;
    return kvc__attn_ws_bytes(d, mla->kv_lora_rank) + mla_extra_bytes(d, mla->kv_lora_rank) + 64;
}

/* ---- batches and work items ---------------------------------------------------------- */
typedef struct {
    uint32_t g;      /* query heads per KV head */
    uint32_t n_hq;   /* query heads */
    uint32_t n_kvh;  /* KV heads */
    uint32_t n_iter; /* heads an item list runs over: KV heads (packed) or query heads */
    bool per_head;
    uint32_t rows_per;  /* query rows per item, when one head's rows need several items */
    uint32_t max_heads; /* cap on KV heads per item (0: none) */
} plan_t;

static plan_t make_plan(uint32_t n_hq, uint32_t n_kvh, bool per_head, uint32_t max_heads)
{
    plan_t pl = {.g = n_hq / n_kvh,
                 .n_hq = n_hq,
                 .n_kvh = n_kvh,
                 .per_head = per_head,
                 .max_heads = max_heads};
    pl.n_iter = per_head ? n_hq : n_kvh;
    if (per_head)
        pl.rows_per = KVC__ROWS_MAX;
    else
        pl.rows_per = pl.g <= KVC__ROWS_MAX ? (KVC__ROWS_MAX / pl.g) * pl.g : KVC__ROWS_MAX;
    return pl;
}

/* KV heads per item for a sequence with T queries: as many as fit in
 * KVC__ROWS_MAX padded rows when one head's rows fit at all (packed only). */
static uint32_t heads_per_item(const plan_t *pl, uint32_t T)
{
    uint64_t rows = (uint64_t)T * pl->g;
    if (pl->per_head || rows > KVC__ROWS_MAX) return 1;
    uint32_t hp = KVC__ROWS_MAX / kvc__padded_rows((uint32_t)rows);
    if (hp > pl->n_kvh) hp = pl->n_kvh;
    if (pl->max_heads && hp > pl->max_heads) hp = pl->max_heads;
    return hp ? hp : 1;
}

static uint32_t seq_T(const kvc_attn_batch_t *b, uint32_t s)
{
    return b->qo_indptr ? b->qo_indptr[s + 1] - b->qo_indptr[s] : 1;
}

static uint32_t seq_q0(const kvc_attn_batch_t *b, uint32_t s)
{
    return b->qo_indptr ? b->qo_indptr[s] : s;
}

static uint64_t seq_rows(const plan_t *pl, uint32_t T)
{
    return pl->per_head ? T : (uint64_t)T * pl->g;
}

static uint64_t seq_items(const plan_t *pl, uint32_t T)
{
    uint32_t hp = heads_per_item(pl, T);
    if (hp > 1 || (!pl->per_head && seq_rows(pl, T) <= KVC__ROWS_MAX))
        return (pl->n_iter + hp - 1) / hp;
    return (uint64_t)pl->n_iter * ((seq_rows(pl, T) + pl->rows_per - 1) / pl->rows_per);
}

/* Check a batch against a view: CSR shape, lengths, T <= S, and every block a
 * query can see in range.  Sets *n_rows to the number of query rows. */
static int check_batch(const kvc_kv_view_t *kv, const kvc_attn_batch_t *b, uint32_t window,
                       uint32_t *n_rows)
{
    if (!b || !b->kv_indptr || !b->kv_last_len || (b->n_seqs && !b->kv_indices)) return KVC_EINVAL;
    if (b->kv_indptr[0] != 0 || (b->qo_indptr && b->qo_indptr[0] != 0)) return KVC_EINVAL;
    const uint32_t bs = kv->shape.block_size;
    for (uint32_t s = 0; s < b->n_seqs; s++) {
        if (b->kv_indptr[s + 1] <= b->kv_indptr[s]) return KVC_EINVAL; /* >= 1 block each */
        if (b->qo_indptr && b->qo_indptr[s + 1] < b->qo_indptr[s]) return KVC_EINVAL;
        uint32_t nb = b->kv_indptr[s + 1] - b->kv_indptr[s], last = b->kv_last_len[s];
        if (last == 0 || last > bs) return KVC_EINVAL;
        int64_t S = (int64_t)(nb - 1) * bs + last, T = seq_T(b, s);
        if (S > INT32_MAX || T > S) return KVC_EINVAL;
        if (T == 0) continue;
        int64_t lo = window ? KVC_MAX(0, S - T - (int64_t)window + 1) : 0;
        const uint32_t *blocks = b->kv_indices + b->kv_indptr[s];
        for (int64_t i = lo / bs; i < nb; i++)
            if (blocks[i] >= kv->n_blocks) return KVC_EINVAL;
    }
    *n_rows = b->qo_indptr ? b->qo_indptr[b->n_seqs] : b->n_seqs;
    return 0;
}

/* Fill the rows of item k of sequence s.  q / out address row (token, head)
 * at base + (token * n_hq + head) * dim; MLA passes its own buffers through
 * q_at / out_at = NULL and fixes the pointers itself. */
static void build_item(const plan_t *pl, const kvc_kv_view_t *kv, const kvc_attn_batch_t *b,
                       uint32_t window, uint32_t s, uint32_t k, const float *q, uint32_t dq,
                       float *out, uint32_t dout, kvc__attn_item_t *it, uint32_t *heads)
{
    const uint32_t bs = kv->shape.block_size, T = seq_T(b, s), q0 = seq_q0(b, s);
    const uint32_t nb = b->kv_indptr[s + 1] - b->kv_indptr[s];
    const int64_t S = (int64_t)(nb - 1) * bs + b->kv_last_len[s];
    const uint64_t rows = seq_rows(pl, T);
    const uint32_t hp = heads_per_item(pl, T);
    uint32_t head, n_heads = 1;
    uint64_t r0, r1;
    if (hp > 1 || (!pl->per_head && rows <= KVC__ROWS_MAX)) {
        /* all rows of heads [head, head + n_heads) */
        head = k * hp;
        n_heads = KVC_MIN(hp, pl->n_iter - head);
        r0 = 0, r1 = rows;
    } else {
        const uint64_t n_groups = (rows + pl->rows_per - 1) / pl->rows_per;
        head = (uint32_t)(k / n_groups);
        r0 = (uint64_t)(k % n_groups) * pl->rows_per;
        r1 = KVC_MIN(rows, r0 + pl->rows_per);
    }
    it->blocks = b->kv_indices + b->kv_indptr[s];
    it->kv_head = pl->per_head ? head / pl->g : head;
    it->n_heads = n_heads;
    it->rows_per_head = (uint32_t)(r1 - r0);
    it->n_rows = n_heads * it->rows_per_head;
    it->lo_min = INT64_MAX;
    it->hi_max = -1;
    for (uint32_t hh = 0; hh < n_heads; hh++) {
        for (uint64_t gr = r0; gr < r1; gr++) {
            uint32_t r = hh * it->rows_per_head + (uint32_t)(gr - r0);
            uint32_t i = pl->per_head ? (uint32_t)gr : (uint32_t)(gr / pl->g);
            uint32_t h = pl->per_head ? head : (head + hh) * pl->g + (uint32_t)(gr % pl->g);
            int64_t pos = S - T + i;
            it->hi[r] = pos;
            it->lo[r] = window ? KVC_MAX(0, pos - (int64_t)window + 1) : 0;
            it->lo_min = KVC_MIN(it->lo_min, it->lo[r]);
            it->hi_max = KVC_MAX(it->hi_max, it->hi[r]);
            size_t row = (size_t)(q0 + i) * pl->n_hq + h;
            it->q[r] = q ? q + row * dq : NULL;
            it->out[r] = out ? out + row * dout : NULL;
            if (heads) heads[r] = h, heads[KVC__ROWS_MAX + r] = q0 + i;
        }
    }
}

static uint64_t count_items(const plan_t *pl, const kvc_attn_batch_t *b)
{
    uint64_t n = 0;
    for (uint32_t s = 0; s < b->n_seqs; s++) n += seq_items(pl, seq_T(b, s));
    return n;
}

uint32_t kvc_attn_n_items(const kvc_attn_params_t *p, const kvc_kv_view_t *kv,
                          const kvc_attn_batch_t *batch)
{
    uint32_t n_rows;
    if (!p || !view_ok(kv) || !p->n_q_heads || p->n_q_heads % kv->shape.n_kv_heads) return 0;
    if (check_batch(kv, batch, p->window, &n_rows)) return 0;
    plan_t pl = make_plan(p->n_q_heads, kv->shape.n_kv_heads, p->per_head, p->kv_heads_per_item);
    uint64_t n = count_items(&pl, batch);
    return n > UINT32_MAX ? 0 : (uint32_t)n;
}

/* ---- kernel choice ------------------------------------------------------------------- */
typedef void (*item_fn)(const kvc__attn_cfg_t *, const kvc__attn_item_t *, void *);

static int choose_kernel(const kvc_attn_params_t *p, const kvc_kv_view_t *kv, uint32_t dk,
                         uint32_t dv, kvc__attn_cfg_t *cfg, item_fn *fn)
{
    kvc_isa_t isa;
    int rc = kvc__isa_resolve(p->isa, &isa);
    if (rc) return rc;
    if ((unsigned)p->compute > KVC_ATTN_COMPUTE_F32) return KVC_EINVAL;
    /* the SIMD kernels work in 32-channel chunks */
    if (dk % 32 || dv % 32) isa = KVC_ISA_SCALAR;
    kvc_dtype_t dt = kv->shape.dtype;
    cfg->bf16 = isa == KVC_ISA_AVX512 && p->compute == KVC_ATTN_COMPUTE_AUTO &&
                kvc__has_bf16_path() &&
                (dt == KVC_DTYPE_BF16 || dt == KVC_DTYPE_FP8_E4M3 || dt == KVC_DTYPE_FP8_E5M2);
    *fn = isa == KVC_ISA_AVX512 ? kvc__attn_item_avx512
          : isa == KVC_ISA_AVX2 ? kvc__attn_item_avx2
                                : kvc__attn_item_scalar;
    return 0;
}

static bool mla_ok(const kvc_mla_dims_t *m, const kvc_kv_view_t *kv);

static kvc_attn_kernel_t kernel_of(const kvc__attn_cfg_t *cfg, item_fn fn)
{
    if (fn == kvc__attn_item_avx512)
        return cfg->bf16 ? KVC_ATTN_KERNEL_AVX512_BF16 : KVC_ATTN_KERNEL_AVX512;
    return fn == kvc__attn_item_avx2 ? KVC_ATTN_KERNEL_AVX2 : KVC_ATTN_KERNEL_SCALAR;
}

/* The same choice kvc_attn_forward and kvc_attn_mla make, through the same function. */
int kvc_attn_kernel(const kvc_attn_params_t *p, const kvc_kv_view_t *kv, const kvc_mla_dims_t *mla,
                    kvc_attn_kernel_t *out)
{
    if (!p || !view_ok(kv) || !out || (mla && !mla_ok(mla, kv))) return KVC_EINVAL;
    const uint32_t dk = kv->shape.head_dim, dv = mla ? mla->kv_lora_rank : dk;
    kvc__attn_cfg_t cfg = {.kv = kv, .dk = dk, .dv = dv};
    item_fn fn;
    int rc = choose_kernel(p, kv, dk, dv, &cfg, &fn);
    if (rc) return rc;
    *out = kernel_of(&cfg, fn);
    return 0;
}

static const char *const kernel_names[KVC_ATTN_KERNEL__COUNT] = {"scalar", "avx2", "avx512",
                                                                 "avx512-bf16"};

const char *kvc_attn_kernel_name(kvc_attn_kernel_t k)
{
    return (unsigned)k < KVC_ATTN_KERNEL__COUNT ? kernel_names[k] : "?";
}

static void *ws_align(void *ws, size_t *bytes)
{
    uintptr_t a = ((uintptr_t)ws + 63) & ~(uintptr_t)63;
    size_t skip = a - (uintptr_t)ws;
    *bytes = *bytes >= skip ? *bytes - skip : 0;
    return (void *)a;
}

/* Walk items [begin, end) in order, calling fn(ctx, s, k) for item k of sequence s. */
typedef void (*visit_fn)(void *ctx, uint32_t s, uint32_t k);

static void walk_items(const plan_t *pl, const kvc_attn_batch_t *b, uint32_t begin, uint32_t end,
                       visit_fn fn, void *ctx)
{
    uint64_t base = 0;
    for (uint32_t s = 0; s < b->n_seqs && base < end; s++) {
        uint64_t n = seq_items(pl, seq_T(b, s));
        uint64_t lo = KVC_MAX(base, (uint64_t)begin), hi = KVC_MIN(base + n, (uint64_t)end);
        for (uint64_t i = lo; i < hi; i++) fn(ctx, s, (uint32_t)(i - base));
        base += n;
    }
}

typedef struct {
    const plan_t *pl;
    const kvc_attn_params_t *p;
    const kvc_kv_view_t *kv;
    const kvc_attn_batch_t *b;
    const kvc__attn_cfg_t *cfg;
    item_fn fn;
    const float *q;
    float *out;
    void *ws;
} fwd_ctx_t;

static void fwd_visit(void *ctx, uint32_t s, uint32_t k)
{
    fwd_ctx_t *c = ctx;
    kvc__attn_item_t it;
    build_item(c->pl, c->kv, c->b, c->p->window, s, k, c->q, c->cfg->dk, c->out, c->cfg->dv, &it,
               NULL);
    c->fn(c->cfg, &it, c->ws);
}

int kvc_attn_forward(const kvc_attn_params_t *p, const kvc_kv_view_t *kv,
                     const kvc_attn_batch_t *batch, const float *q, float *out, void *ws,
                     size_t ws_bytes, uint32_t item_begin, uint32_t item_end)
{
    uint32_t n_rows;
    if (!p || !view_ok(kv) || !q || !out || !ws) return KVC_EINVAL;
    const uint32_t d = kv->shape.head_dim;
    if (!p->n_q_heads || p->n_q_heads % kv->shape.n_kv_heads) return KVC_EINVAL;
    if (d > KVC_ATTN_MAX_DV) return KVC_ENOTSUP;
    int rc = check_batch(kv, batch, p->window, &n_rows);
    if (rc) return rc;
    void *w = ws_align(ws, &ws_bytes);
    if (ws_bytes < kvc__attn_ws_bytes(d, d)) return KVC_EINVAL;
    kvc__attn_cfg_t cfg = {.kv = kv, .dk = d, .dv = d, .softcap = p->softcap > 0 ? p->softcap : 0};
    cfg.sm_scale = p->sm_scale > 0 ? p->sm_scale : 1.0f / sqrtf((float)d);
    cfg.invariant = p->batch_invariant;
    item_fn fn;
    if ((rc = choose_kernel(p, kv, d, d, &cfg, &fn))) return rc;
    plan_t pl = make_plan(p->n_q_heads, kv->shape.n_kv_heads, p->per_head, p->kv_heads_per_item);
    fwd_ctx_t c = {&pl, p, kv, batch, &cfg, fn, q, out, w};
    walk_items(&pl, batch, item_begin, item_end, fwd_visit, &c);
    return 0;
}

/* ---- writing new K/V -------------------------------------------------------------------- */
static float amax_of(const float *x, size_t n)
{
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (a > m && isfinite(a)) m = a;
    }
    return m;
}

static bool scales_ok(const float *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!(s[i] > 0.0f) || !isfinite(s[i])) return false;
    return true;
}

/* The scale a new block gets for state index i of the K (v = false) or V state. */
static float new_scale(const kvc_kv_view_t *kv, const kvc_kv_quant_t *qs, bool v, size_t i)
{
    const float *given = v ? qs->v_scale : qs->k_scale;
    if (given) return given[i];
    return kvc_scale_from_amax(kv->shape.dtype, (v ? qs->v_amax : qs->k_amax)[i], qs->headroom);
}

/* Raise the running maxima with every value of this write. */
static void update_amax(const kvc_kv_view_t *kv, kvc_kv_quant_t *qs, uint32_t n, const float *k,
                        const float *v)
{
    const kvc_scale_shape_t *sh = &kv->shape;
    const uint32_t H = sh->n_kv_heads, d = sh->head_dim, l = kv->layer;
    for (int which = 0; which < (sh->n_kv == 2 ? 2 : 1); which++) {
        const float *x = which ? v : k;
        float *amax = which ? qs->v_amax : qs->k_amax;
        if ((which ? qs->v_scale : qs->k_scale) || !amax) continue;
        if (which && sh->layout == KVC_SCALE_CHANNEL_TOKEN) continue;
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t h = 0; h < H; h++) {
                const float *row = x + ((size_t)i * H + h) * d;
                if (sh->layout == KVC_SCALE_CHANNEL_TOKEN) {
                    float *a = amax + ((size_t)l * H + h) * d;
                    for (uint32_t c = 0; c < d; c++) {
                        float y = fabsf(row[c]);
                        if (y > a[c] && isfinite(y)) a[c] = y;
                    }
                } else {
                    size_t idx = sh->layout == KVC_SCALE_HEAD ? (size_t)l * H + h : l;
                    float y = amax_of(row, d);
                    if (y > amax[idx]) amax[idx] = y;
                }
            }
    }
}

/* Set a block's scales for this layer from the state (see quant.h). */
static void init_block_scales(const kvc_kv_view_t *kv, const kvc_kv_quant_t *qs, float *sc)
{
    const kvc_scale_shape_t *sh = &kv->shape;
    const uint32_t H = sh->n_kv_heads, d = sh->head_dim, l = kv->layer;
    const bool two = sh->n_kv == 2;
    switch (sh->layout) {
    case KVC_SCALE_TENSOR:
        sc[0] = new_scale(kv, qs, false, l);
        if (two) sc[1] = new_scale(kv, qs, true, l);
        break;
    case KVC_SCALE_HEAD:
        for (uint32_t h = 0; h < H; h++) {
            sc[h] = new_scale(kv, qs, false, (size_t)l * H + h);
            if (two) sc[H + h] = new_scale(kv, qs, true, (size_t)l * H + h);
        }
        break;
    case KVC_SCALE_CHANNEL_TOKEN:
        for (size_t i = 0; i < (size_t)H * d; i++)
            sc[i] = new_scale(kv, qs, false, (size_t)l * H * d + i);
        break;
    default:
        break;
    }
}

int kvc_attn_write_kv(const kvc_kv_view_t *kv, const int64_t *slots, uint32_t n_tokens,
                      const float *k, const float *v, kvc_kv_quant_t *quant, kvc_isa_t isa)
{
    if (!view_ok(kv)) return KVC_EINVAL;
    if (n_tokens == 0) return 0;
    const kvc_scale_shape_t *sh = &kv->shape;
    if (!slots || !k || ((sh->n_kv == 2) != (v != NULL))) return KVC_EINVAL;
    kvc_isa_t use;
    int rc = kvc__isa_resolve(isa, &use);
    if (rc) return rc;
    const uint32_t bs = sh->block_size, H = sh->n_kv_heads, d = sh->head_dim;
    for (uint32_t i = 0; i < n_tokens; i++)
        if (slots[i] < 0 || (uint64_t)slots[i] / bs >= kv->n_blocks) return KVC_EINVAL;
    const bool scaled = sh->layout != KVC_SCALE_NONE;
    if (scaled) {
        if (!quant) return KVC_EINVAL;
        for (uint32_t which = 0; which < sh->n_kv; which++) {
            size_t len = kvc_kv_quant_len(sh, which == 1);
            const float *given = which ? quant->v_scale : quant->k_scale;
            float *amax = which ? quant->v_amax : quant->k_amax;
            if (len && !given && !amax) return KVC_EINVAL;
            if (len && given && !scales_ok(given, len)) return KVC_EINVAL;
        }
        update_amax(kv, quant, n_tokens, k, v);
    }
    kvc_quant_stats_t kst = {0}, vst = {0};
    const kvc_dtype_t dt = sh->dtype;
    for (uint32_t i = 0; i < n_tokens; i++) {
        uint32_t blk = (uint32_t)((uint64_t)slots[i] / bs),
                 off = (uint32_t)((uint64_t)slots[i] % bs);
        float *sc = kvc__scales(kv, blk);
        if (sc && (off == 0 || sc[0] == 0.0f)) init_block_scales(kv, quant, sc);
        for (uint32_t h = 0; h < H; h++) {
            kvc__tok_scales_t ts = kvc__tok_scales(kv, sc, h, off);
            const float *krow = k + ((size_t)i * H + h) * d;
            rc = kvc_quantize(dt, kvc__row(kv, blk, h, off, 0), krow, d, ts.k, ts.kc, use, &kst);
            KVC_ASSERT(rc == 0);
            if (sh->n_kv == 1) continue;
            const float *vrow = v + ((size_t)i * H + h) * d;
            float vs = ts.v;
            if (sh->layout == KVC_SCALE_CHANNEL_TOKEN) {
                vs = kvc_scale_from_amax(dt, amax_of(vrow, d), 1.0f);
                sc[(size_t)H * d + (size_t)h * bs + off] = vs;
            }
            rc = kvc_quantize(dt, kvc__row(kv, blk, h, off, 1), vrow, d, vs, NULL, use, &vst);
            KVC_ASSERT(rc == 0);
        }
    }
    if (quant) {
        quant->k_stats.n_values += kst.n_values, quant->v_stats.n_values += vst.n_values;
        quant->k_stats.n_clipped += kst.n_clipped, quant->v_stats.n_clipped += vst.n_clipped;
        quant->k_stats.n_nonfinite += kst.n_nonfinite;
        quant->v_stats.n_nonfinite += vst.n_nonfinite;
    }
    return 0;
}

/* ---- MLA --------------------------------------------------------------------------------- */
static bool mla_ok(const kvc_mla_dims_t *m, const kvc_kv_view_t *kv)
{
    const kvc_scale_shape_t *s = &kv->shape;
    return m && m->n_heads && m->kv_lora_rank && m->nope_dim && m->v_head_dim && s->n_kv == 1 &&
           s->head_dim == m->kv_lora_rank + m->rope_dim;
}

uint32_t kvc_attn_mla_n_items(const kvc_attn_params_t *p, const kvc_mla_dims_t *dims,
                              const kvc_kv_view_t *kv, const kvc_attn_batch_t *batch)
{
    uint32_t n_rows;
    if (!p || !view_ok(kv) || !mla_ok(dims, kv) || check_batch(kv, batch, p->window, &n_rows))
        return 0;
    plan_t pl = make_plan(dims->n_heads, 1, p->per_head, 0);
    uint64_t n = count_items(&pl, batch);
    return n > UINT32_MAX ? 0 : (uint32_t)n;
}

typedef struct {
    fwd_ctx_t f;
    const kvc_mla_dims_t *m;
    const float *q_nope, *q_rope, *w_uk, *w_uv;
    float *qa, *lat; /* (ROWS_MAX, dk) absorbed queries, (ROWS_MAX, dv) latent outputs */
} mla_ctx_t;

static void mla_visit(void *ctx, uint32_t s, uint32_t k)
{
    mla_ctx_t *c = ctx;
    const kvc_mla_dims_t *m = c->m;
    const uint32_t H = m->n_heads, r = m->kv_lora_rank, dk = c->f.cfg->dk;
    kvc__attn_item_t it;
    uint32_t heads[2 * KVC__ROWS_MAX];
    build_item(c->f.pl, c->f.kv, c->f.b, c->f.p->window, s, k, NULL, 0, NULL, 0, &it, heads);
    for (uint32_t i = 0; i < it.n_rows; i++) {
        uint32_t h = heads[i], tok = heads[KVC__ROWS_MAX + i];
        float *qa = c->qa + (size_t)i * dk;
        const float *qn = c->q_nope + ((size_t)tok * H + h) * m->nope_dim;
        const float *wk = c->w_uk + (size_t)h * m->nope_dim * r;
        /* q~ = W_UK_h^T q_nope, then the RoPE part as it is */
        for (uint32_t j = 0; j < r; j++) qa[j] = 0.0f;
        for (uint32_t a = 0; a < m->nope_dim; a++) {
            const float x = qn[a], *w = wk + (size_t)a * r;
            for (uint32_t j = 0; j < r; j++) qa[j] += x * w[j];
        }
        if (m->rope_dim)
            memcpy(qa + r, c->q_rope + ((size_t)tok * H + h) * m->rope_dim,
                   sizeof(float) * m->rope_dim);
        it.q[i] = qa;
        it.out[i] = c->lat + (size_t)i * r;
    }
    c->f.fn(c->f.cfg, &it, c->f.ws);
    for (uint32_t i = 0; i < it.n_rows; i++) {
        uint32_t h = heads[i], tok = heads[KVC__ROWS_MAX + i];
        const float *lat = it.out[i], *wv = c->w_uv + (size_t)h * m->v_head_dim * r;
        float *o = c->f.out + ((size_t)tok * H + h) * m->v_head_dim;
        for (uint32_t e = 0; e < m->v_head_dim; e++) {
            const float *w = wv + (size_t)e * r;
            float acc = 0.0f;
            for (uint32_t j = 0; j < r; j++) acc += w[j] * lat[j];
            o[e] = acc;
        }
    }
}

int kvc_attn_mla(const kvc_attn_params_t *p, const kvc_mla_dims_t *dims, const kvc_kv_view_t *kv,
                 const kvc_attn_batch_t *batch, const float *q_nope, const float *q_rope,
                 const float *w_uk, const float *w_uv, float *out, void *ws, size_t ws_bytes,
                 uint32_t item_begin, uint32_t item_end)
{
    uint32_t n_rows;
    if (!p || !view_ok(kv) || !mla_ok(dims, kv) || !q_nope || (dims->rope_dim && !q_rope) ||
        !w_uk || !w_uv || !out || !ws)
        return KVC_EINVAL;
    const uint32_t dk = kv->shape.head_dim, dv = dims->kv_lora_rank;
    if (dk > KVC_ATTN_MAX_DK || dv > KVC_ATTN_MAX_DV) return KVC_ENOTSUP;
    int rc = check_batch(kv, batch, p->window, &n_rows);
    if (rc) return rc;
    void *w = ws_align(ws, &ws_bytes);
    if (ws_bytes < kvc__attn_ws_bytes(dk, dv) + mla_extra_bytes(dk, dv)) return KVC_EINVAL;
    kvc__attn_cfg_t cfg = {
        .kv = kv, .dk = dk, .dv = dv, .softcap = p->softcap > 0 ? p->softcap : 0};
    cfg.sm_scale =
        p->sm_scale > 0 ? p->sm_scale : 1.0f / sqrtf((float)(dims->nope_dim + dims->rope_dim));
    cfg.invariant = p->batch_invariant;
    item_fn fn;
    if ((rc = choose_kernel(p, kv, dk, dv, &cfg, &fn))) return rc;
    plan_t pl = make_plan(dims->n_heads, 1, p->per_head, 0);
    uint8_t *cur = w;
    mla_ctx_t c = {.f = {&pl, p, kv, batch, &cfg, fn, NULL, out, NULL},
                   .m = dims,
                   .q_nope = q_nope,
                   .q_rope = q_rope,
                   .w_uk = w_uk,
                   .w_uv = w_uv};
    c.qa = kvc__ws_take(&cur, sizeof(float) * KVC__ROWS_MAX * dk);
    c.lat = kvc__ws_take(&cur, sizeof(float) * KVC__ROWS_MAX * dv);
    c.f.ws = cur;
    walk_items(&pl, batch, item_begin, item_end, mla_visit, &c);
    return 0;
}
