/* model/sample.c - the sampling chain of sample.h (penalties, greedy, top_k, top_p, min_p,
 * temperature, one draw), log-softmax top-k for beams, and stop strings.
 *
 * Speed: a row of logits is read a few times in O(n) and never sorted whole.  top_k is a
 * bounded heap (O(n log k)); top_p without top_k finds its boundary with a histogram of the
 * logits' distance below the maximum (1/64 nat a bin), so only the one bin the boundary
 * falls in is sorted; min_p is a threshold; the draw walks the survivors in a fixed order.
 * Ties everywhere are broken by the lower token id, so every kept set is a function of the
 * logits alone.
 */
#include "kvcache/sample.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "model/sample_int.h"
#include "util/msg.h"

#define N_BINS       4096
#define BINS_PER_NAT 64.0
#define REBASE_NATS  600.0 /* exp(-708) is the last normal double: rebase well before */
#define MAX_N_VOCAB  ((uint32_t)INT32_MAX)
#define WALK_BLOCK   256 /* the draw walks past whole blocks by their sums */
#define GATHER_MAX   16  /* fewer than n / 16 candidates: their weights one by one */

struct kvc_sampler {
    kvc_allocator_t alloc;
    uint32_t n;
    bool avx2;        /* the AVX2 row kernels (the same bits as the scalar ones) */
    float *w;         /* (n) sanitized, then penalized logits */
    double *e;        /* (n) exp(w - ref), then the draw's weights */
    uint32_t *cand;   /* (n) the candidates truncation keeps */
    uint32_t *tmp;    /* (n) the boundary bin of top_p */
    uint32_t *counts; /* (n) occurrences in the penalty window; all zero between calls */
    double bin_mass[N_BINS];
};

/* ---- parameters ------------------------------------------------------------------------ */

kvc_sampling_params_t kvc_sampling_params_default(void)
{
    return (kvc_sampling_params_t){
        .temperature = 1.0f,
        .top_k = 0,
        .top_p = 1.0f,
        .min_p = 0.0f,
        .repetition_penalty = 1.0f,
        .presence_penalty = 0.0f,
        .frequency_penalty = 0.0f,
        .penalty_last_n = 0,
        .seed = 0,
        .n_logprobs = 0,
    };
}

int kvc_sampling_params_check(const kvc_sampling_params_t *p, char *msg, size_t cap)
{
    if (!p) return kvc__msgf(KVC_EINVAL, msg, cap, "sampling parameters: NULL");
    if (!isfinite(p->temperature) || p->temperature < 0.0f)
        return kvc__msgf(KVC_EINVAL, msg, cap, "temperature %g: must be finite and >= 0",
                         (double)p->temperature);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return kvc__msgf(KVC_EINVAL, msg, cap, "top_p %g: must be in (0, 1]", (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return kvc__msgf(KVC_EINVAL, msg, cap, "min_p %g: must be in [0, 1]", (double)p->min_p);
    if (!isfinite(p->repetition_penalty) || !(p->repetition_penalty > 0.0f))
        return kvc__msgf(KVC_EINVAL, msg, cap, "repetition_penalty %g: must be finite and > 0",
                         (double)p->repetition_penalty);
    if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
        return kvc__msgf(KVC_EINVAL, msg, cap, "presence_penalty %g: must be in [-2, 2]",
                         (double)p->presence_penalty);
    if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
        return kvc__msgf(KVC_EINVAL, msg, cap, "frequency_penalty %g: must be in [-2, 2]",
                         (double)p->frequency_penalty);
    if (p->n_logprobs > KVC_SAMPLE_MAX_LOGPROBS)
        return kvc__msgf(KVC_EINVAL, msg, cap, "n_logprobs %u: must be in [0, %d]",
                         (unsigned)p->n_logprobs, KVC_SAMPLE_MAX_LOGPROBS);
    if (msg && cap) msg[0] = '\0';
    return 0;
}

/* ---- create / destroy ------------------------------------------------------------------ */

int kvc_sampler_create(uint32_t n_vocab, const kvc_allocator_t *a, kvc_sampler_t **out)
{
    if (!out || n_vocab == 0 || n_vocab > MAX_N_VOCAB) return KVC_EINVAL;
    kvc_sampler_t *s = kvc_calloc(a, 1, sizeof *s, 64);
    if (!s) return KVC_ENOMEM;
    if (a) s->alloc = *a;
    s->n = n_vocab;
    s->avx2 = kvc_isa_best() != KVC_ISA_SCALAR;
    s->w = kvc_alloc(a, (size_t)n_vocab * sizeof *s->w, 64);
    s->e = kvc_alloc(a, (size_t)n_vocab * sizeof *s->e, 64);
    s->cand = kvc_alloc(a, (size_t)n_vocab * sizeof *s->cand, 64);
    s->tmp = kvc_alloc(a, (size_t)n_vocab * sizeof *s->tmp, 64);
    s->counts = kvc_calloc(a, n_vocab, sizeof *s->counts, 64);
    if (!s->w || !s->e || !s->cand || !s->tmp || !s->counts) {
        kvc_sampler_destroy(s);
        return KVC_ENOMEM;
    }
    *out = s;
    return 0;
}

void kvc_sampler_destroy(kvc_sampler_t *s)
{
    if (!s) return;
    kvc_allocator_t a = s->alloc;
    kvc_free(&a, s->w);
    kvc_free(&a, s->e);
    kvc_free(&a, s->cand);
    kvc_free(&a, s->tmp);
    kvc_free(&a, s->counts);
    kvc_free(&a, s);
}

uint32_t kvc_sampler_n_vocab(const kvc_sampler_t *s)
{
    return s ? s->n : 0;
}

int kvc_sampler_set_isa(kvc_sampler_t *s, kvc_isa_t isa)
{
    if (!s || (unsigned)isa >= KVC_ISA__COUNT) return KVC_EINVAL;
    if (!kvc_isa_supported(isa)) return KVC_ENOTSUP;
    if (isa == KVC_ISA_AUTO) isa = kvc_isa_best();
    s->avx2 = isa != KVC_ISA_SCALAR;
    return 0;
}

/* ---- the row kernels' scalar versions (sample_int.h) ---------------------------------- */

float kvc__sample_sanitize_max_scalar(const float *in, float *w, uint32_t n)
{
    float best = -INFINITY;
    for (uint32_t i = 0; i < n; i++) {
        float x = in[i];
        x = x != x ? -INFINITY : (x > FLT_MAX ? FLT_MAX : x);
        w[i] = x;
        best = x > best ? x : best;
    }
    return best;
}

double kvc__sample_exp_sum_scalar(const float *w, uint32_t n, double ref, double scale, double *e)
{
    double l[4] = {0, 0, 0, 0};
    for (uint32_t i = 0; i < n; i++) {
        double d = (double)w[i] - ref;
        double y = kvc__sample_exp(d * scale);
        if (e) e[i] = y;
        l[i & 3] = l[i & 3] + y;
    }
    return (l[0] + l[1]) + (l[2] + l[3]);
}

double kvc__sample_expf_sum_scalar(const float *w, uint32_t n, float m, float scale, double *e)
{
    double l[4] = {0, 0, 0, 0};
    for (uint32_t i = 0; i < n; i++) {
        float d = w[i] - m;
        double y = (double)kvc__sample_expf(d * scale);
        e[i] = y;
        l[i & 3] = l[i & 3] + y;
    }
    return (l[0] + l[1]) + (l[2] + l[3]);
}

static double expf_sum(const kvc_sampler_t *s, const float *w, uint32_t n, float m, float scale,
                       double *e)
{
    return s->avx2 ? kvc__sample_expf_sum_avx2(w, n, m, scale, e)
                   : kvc__sample_expf_sum_scalar(w, n, m, scale, e);
}

static float sanitize_max(const kvc_sampler_t *s, const float *in, float *w, uint32_t n)
{
    return s->avx2 ? kvc__sample_sanitize_max_avx2(in, w, n)
                   : kvc__sample_sanitize_max_scalar(in, w, n);
}

void kvc__sample_hist_scalar(const float *w, const double *e, uint32_t n, float m, float scale,
                             double *mass, uint32_t n_bins)
{
    for (uint32_t i = 0; i < n; i++) {
        float d = (m - w[i]) * scale; /* >= 0; +inf for -inf logits (e = 0) */
        uint32_t b = d < (float)(n_bins - 1) ? (uint32_t)d : n_bins - 1;
        mass[b] += e[i];
    }
}

void kvc__sample_split_scalar(const float *w, uint32_t n, float m, float scale, float lo, float hi,
                              uint32_t *cand, uint32_t *nc, uint32_t *tmp, uint32_t *nt)
{
    uint32_t c = 0, t = 0;
    for (uint32_t i = 0; i < n; i++) {
        /* branch-free: which side of the boundary is as unpredictable as the logits */
        float d = (m - w[i]) * scale;
        cand[c] = i;
        c += d < lo;
        tmp[t] = i;
        t += (d >= lo) & (d < hi); /* d = +inf (no mass) is left out, and never needed */
    }
    *nc = c;
    *nt = t;
}

uint32_t kvc__sample_find_scalar(const float *w, uint32_t n, float v)
{
    for (uint32_t i = 0; i < n; i++)
        if (w[i] == v) return i;
    return n;
}

/* The first i with w[i] == v (v is w's maximum, so there is one). */
static uint32_t find_first(const kvc_sampler_t *s, const float *w, uint32_t n, float v)
{
    uint32_t i = s->avx2 ? kvc__sample_find_avx2(w, n, v) : kvc__sample_find_scalar(w, n, v);
    KVC_ASSERT(i < n);
    return i;
}

static double exp_sum(const kvc_sampler_t *s, const float *w, uint32_t n, double ref, double scale,
                      double *e)
{
    return s->avx2 ? kvc__sample_exp_sum_avx2(w, n, ref, scale, e)
                   : kvc__sample_exp_sum_scalar(w, n, ref, scale, e);
}

/* The sum of e over ids[0..n) (ids NULL: 0..n), in 4 lanes for speed. */
static double sum_over(const double *e, const uint32_t *ids, uint32_t n)
{
    double l[4] = {0, 0, 0, 0};
    if (ids)
        for (uint32_t j = 0; j < n; j++) l[j & 3] += e[ids[j]];
    else
        for (uint32_t j = 0; j < n; j++) l[j & 3] += e[j];
    return (l[0] + l[1]) + (l[2] + l[3]);
}

/* The draw: the first token (in the order of ids, or of ids 0..n when ids is NULL) whose
 * running sum of weights passes target, skipping whole blocks of WALK_BLOCK by their sums;
 * a token of weight 0 is never chosen; if rounding leaves target at or past the end, the last
 * token with weight. */
static uint32_t walk(const double *e, const uint32_t *ids, uint32_t n, double target)
{
    double cum = 0;
    uint32_t j = 0;
    while (j + WALK_BLOCK <= n) {
        double b = ids ? sum_over(e, ids + j, WALK_BLOCK) : sum_over(e + j, NULL, WALK_BLOCK);
        if (cum + b > target) break;
        cum += b;
        j += WALK_BLOCK;
    }
    uint32_t last = UINT32_MAX;
    for (; j < n; j++) {
        uint32_t i = ids ? ids[j] : j;
        if (e[i] == 0) continue;
        last = i;
        cum += e[i];
        if (cum > target) return i;
    }
    if (last != UINT32_MAX) return last;
    /* every weight from here on is 0: the last token with weight before */
    for (uint32_t k = n; k-- > 0;) {
        uint32_t i = ids ? ids[k] : k;
        if (e[i] != 0) return i;
    }
    return ids ? ids[0] : 0;
}

/* ---- ordering: higher logit first, ties by lower id ------------------------------------ */

/* NaN -> -inf, +inf -> FLT_MAX (sample.h). */
static inline float sanitize(float x)
{
    if (x != x) return -INFINITY;
    return x > FLT_MAX ? FLT_MAX : x;
}

static inline bool better(const float *v, uint32_t a, uint32_t b)
{
    float x = sanitize(v[a]), y = sanitize(v[b]);
    return x > y || (x == y && a < b);
}

/* h[0..n) is a heap whose root is the worst element; restore it below i. */
static void sift_down(const float *v, uint32_t *h, uint32_t n, uint32_t i)
{
    for (;;) {
        uint32_t l = 2 * i + 1, r = l + 1, worst = i;
        if (l < n && better(v, h[worst], h[l])) worst = l;
        if (r < n && better(v, h[worst], h[r])) worst = r;
        if (worst == i) return;
        uint32_t t = h[i];
        h[i] = h[worst];
        h[worst] = t;
        i = worst;
    }
}

/* Sort ids[0..m) best first (heap sort: no allocation, O(m log m)). */
static void sort_best_first(const float *v, uint32_t *ids, uint32_t m)
{
    if (m < 2) return;
    for (uint32_t i = m / 2; i-- > 0;) sift_down(v, ids, m, i);
    for (uint32_t k = m; k > 1; k--) {
        uint32_t t = ids[0];
        ids[0] = ids[k - 1];
        ids[k - 1] = t;
        sift_down(v, ids, k - 1, 0);
    }
}

uint32_t kvc__sample_above_scalar(const float *w, uint32_t from, uint32_t n, float v)
{
    for (uint32_t i = from; i < n; i++)
        if (w[i] > v) return i;
    return n;
}

/* The k best of v[0..n) into h[0..k), best first.  1 <= k <= n.  The scan for a token that
 * beats the heap's root runs on the vector kernel when avx2 (the result is the same). */
static void select_top(const float *v, uint32_t n, uint32_t k, uint32_t *h, bool avx2)
{
    for (uint32_t i = 0; i < k; i++) h[i] = i;
    for (uint32_t i = k / 2; i-- > 0;) sift_down(v, h, k, i);
    float root = sanitize(v[h[0]]);
    for (uint32_t i = k; i < n; i++) {
        i = avx2 ? kvc__sample_above_avx2(v, i, n, root) : kvc__sample_above_scalar(v, i, n, root);
        if (i >= n) break;
        /* ids only grow, so a tie with the root never beats it: one comparison per token
         * (a raw +inf is above a root of FLT_MAX, but sanitized it ties: check again) */
        if (sanitize(v[i]) > root) {
            h[0] = i;
            sift_down(v, h, k, 0);
            root = sanitize(v[h[0]]);
        }
    }
    sort_best_first(v, h, k);
}

/* ---- sampling -------------------------------------------------------------------------- */

/* The penalized logit of sample.h, in double, rounded once (and kept off +inf). */
static float penalize(float l, uint32_t count, const kvc_sampling_params_t *p)
{
    double x = l;
    double rp = p->repetition_penalty;
    x = x > 0 ? x / rp : x * rp;
    x -= (double)p->frequency_penalty * count + (double)p->presence_penalty;
    float f = (float)x;
    return f > FLT_MAX ? FLT_MAX : f;
}

/* top_p over all n tokens without a sort: a histogram of d = (m - w) * BINS_PER_NAT (float;
 * bin floor(d), the last bin for anything farther or without mass) finds the bin the
 * boundary falls in; bins before it are kept whole, that bin alone is sorted.  Writes the
 * kept ids to cand and returns how many. */
static uint32_t top_p_all(kvc_sampler_t *s, float m, double top_p)
{
    const float *w = s->w;
    const double *e = s->e;
    uint32_t n = s->n;
    const float scale = (float)BINS_PER_NAT;
    memset(s->bin_mass, 0, sizeof s->bin_mass);
    if (s->avx2)
        kvc__sample_hist_avx2(w, e, n, m, scale, s->bin_mass, N_BINS);
    else
        kvc__sample_hist_scalar(w, e, n, m, scale, s->bin_mass, N_BINS);
    /* the total by bins: no chain of n dependent additions */
    double z = 0;
    for (uint32_t b = 0; b < N_BINS; b++) z += s->bin_mass[b];
    double target = top_p * z, cum = 0;
    uint32_t bstar = N_BINS - 1;
    for (uint32_t b = 0; b < N_BINS; b++) {
        if (s->bin_mass[b] == 0) continue;
        bstar = b;
        if (cum + s->bin_mass[b] >= target) break;
        cum += s->bin_mass[b];
    }
    /* bin < bstar  <=>  d < bstar, and bin == bstar  <=>  bstar <= d < bstar + 1 (or any
     * d beyond for the last bin), since bin = floor(d) for d >= 0 */
    const float lo = (float)bstar, hi = bstar == N_BINS - 1 ? INFINITY : (float)(bstar + 1);
    uint32_t nc, nt;
    if (s->avx2)
        kvc__sample_split_avx2(w, n, m, scale, lo, hi, s->cand, &nc, s->tmp, &nt);
    else
        kvc__sample_split_scalar(w, n, m, scale, lo, hi, s->cand, &nc, s->tmp, &nt);
    sort_best_first(w, s->tmp, nt);
    for (uint32_t j = 0; j < nt; j++) {
        if (e[s->tmp[j]] == 0) break; /* the rest have no mass either */
        s->cand[nc++] = s->tmp[j];
        cum += e[s->tmp[j]];
        if (cum >= target) break;
    }
    if (nc == 0) s->cand[nc++] = s->tmp[0]; /* cannot happen: the top token has mass */
    return nc;
}

/* What steps 1-3 of kvc_sample leave for the truncation and the draw. */
typedef struct {
    float m;         /* the highest penalized logit */
    uint32_t argmax; /* its lowest id */
    double ref;      /* e[i] = exp(w[i] - ref) */
    float mraw;      /* the highest raw logit */
    double log_z;    /* log of the raw row's sum of exp(l - mraw) */
} prep_t;

/* Steps 1-3: sanitize into w, the raw normalizer, the raw top n_top (if top), penalties.
 * Touches nothing but the scratch; on error nothing else changed. */
static int prepare(kvc_sampler_t *s, const kvc_sampling_params_t *p, const float *logits,
                   const kvc_token_t *history, size_t n_history, uint32_t n_top, uint32_t *top,
                   prep_t *o)
{
    /* e (exp at temperature 1, in double) is read only by top_p, min_p and the draw at
     * temperature 1; otherwise the pass only sums */
    bool need_e =
        p->temperature != 0.0f && (p->top_p < 1.0f || p->min_p > 0.0f || p->temperature == 1.0f);
    const uint32_t n = s->n;
    float *w = s->w;
    double *e = s->e;

    /* 1. the raw row: sanitized copy, maximum (first one: the lowest id) */
    float mraw = sanitize_max(s, logits, w, n);
    uint32_t argmax = find_first(s, w, n, mraw);
    if (mraw == -INFINITY) return KVC_EINVAL;

    bool pen = p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f ||
               p->frequency_penalty != 0.0f;
    size_t h0 = n_history;
    if (pen) {
        h0 = 0;
        if (p->penalty_last_n && n_history > p->penalty_last_n) h0 = n_history - p->penalty_last_n;
        for (size_t j = h0; j < n_history; j++)
            if (history[j] < 0 || (uint32_t)history[j] >= n) return KVC_EINVAL;
    }

    /* 2. the raw log-softmax's normalizer, and e = exp(w - ref) for the truncations */
    double ref = mraw;
    double z = exp_sum(s, w, n, ref, 1.0, need_e ? e : NULL);
    o->mraw = mraw;
    o->log_z = log(z);
    if (n_top) select_top(w, n, n_top, top, s->avx2);

    /* 3. penalties: count the window, then penalize each distinct token once */
    float m = mraw;
    if (h0 < n_history) {
        for (size_t j = h0; j < n_history; j++) s->counts[history[j]]++;
        for (size_t j = h0; j < n_history; j++) {
            uint32_t t = (uint32_t)history[j], c = s->counts[t];
            if (!c) continue;
            s->counts[t] = 0;
            w[t] = penalize(w[t], c, p);
            e[t] = kvc__sample_exp((double)w[t] - ref);
        }
        m = sanitize_max(s, w, w, n); /* in place: w is already sanitized */
        argmax = find_first(s, w, n, m);
        if (m == -INFINITY) return KVC_EINVAL;
        if (need_e && fabs((double)m - ref) > REBASE_NATS) {
            ref = m;
            (void)exp_sum(s, w, n, ref, 1.0, e); /* only e is wanted here */
        }
    }
    o->m = m;
    o->argmax = argmax;
    o->ref = ref;
    return 0;
}

/* Step 4: top_k, top_p, min_p.  Returns the number of candidates in s->cand, or n with
 * *all set when nothing truncates (then cand is not filled). */
static uint32_t truncate_candidates(kvc_sampler_t *s, const kvc_sampling_params_t *p,
                                    const prep_t *o, bool *all_out)
{
    const uint32_t n = s->n;
    const float *w = s->w;
    const double *e = s->e;
    bool all = true;
    uint32_t nc = n;
    uint32_t *cand = s->cand;
    if (p->top_k && p->top_k < n) {
        select_top(w, n, p->top_k, cand, s->avx2);
        nc = p->top_k;
        all = false;
        if (p->top_p < 1.0f) {
            double zk = 0, cum = 0;
            for (uint32_t j = 0; j < nc; j++) zk += e[cand[j]];
            double target = (double)p->top_p * zk;
            for (uint32_t j = 0; j < nc; j++) {
                cum += e[cand[j]];
                if (cum >= target) {
                    nc = j + 1;
                    break;
                }
            }
        }
    } else if (p->top_p < 1.0f) {
        nc = top_p_all(s, o->m, p->top_p);
        all = false;
    }
    if (p->min_p > 0.0f) {
        double thr = (double)p->min_p * kvc__sample_exp((double)o->m - o->ref);
        uint32_t k = 0;
        if (all) {
            for (uint32_t i = 0; i < n; i++)
                if (e[i] >= thr) cand[k++] = i;
        } else {
            for (uint32_t j = 0; j < nc; j++)
                if (e[cand[j]] >= thr) cand[k++] = cand[j];
        }
        nc = k;
        all = false;
    }
    *all_out = all;
    return nc;
}

static int check_call(kvc_sampler_t *s, const kvc_sampling_params_t *p, const float *logits,
                      const kvc_token_t *history, size_t n_history)
{
    if (!s || !p || !logits || (!history && n_history > 0)) return KVC_EINVAL;
    if (kvc_sampling_params_check(p, NULL, 0)) return KVC_EINVAL;
    return 0;
}

int kvc_sample(kvc_sampler_t *s, const kvc_sampling_params_t *p, kvc_rng_t *rng,
               const float *logits, const kvc_token_t *history, size_t n_history,
               kvc_sample_result_t *out)
{
    int rc = check_call(s, p, logits, history, n_history);
    if (rc) return rc;
    bool greedy = p->temperature == 0.0f;
    if (!out || (!greedy && !rng)) return KVC_EINVAL;
    const uint32_t n = s->n;
    const float *w = s->w;
    double *e = s->e;

    kvc_sample_result_t r = {0}; /* the unused top entries too: the result is all defined */
    uint32_t top[KVC_SAMPLE_MAX_LOGPROBS];
    r.n_top = KVC_MIN(p->n_logprobs, n);
    prep_t o;
    rc = prepare(s, p, logits, history, n_history, r.n_top, top, &o);
    if (rc) return rc;
    for (uint32_t j = 0; j < r.n_top; j++) {
        r.top_ids[j] = (kvc_token_t)top[j];
        r.top_logprobs[j] = (float)(((double)sanitize(logits[top[j]]) - o.mraw) - o.log_z);
    }

    uint32_t token = o.argmax;
    if (!greedy) {
        bool all;
        uint32_t nc = truncate_candidates(s, p, &o, &all);
        const uint32_t *cand = s->cand;

        /* 5. temperature and the one draw: weights expf((l - max) / T) in float (the
         * kept set is already decided in double), summed in double; they overwrite e */
        float inv_t = 1.0f / p->temperature;
        double sum;
        if (all && p->temperature == 1.0f) {
            sum = sum_over(e, NULL, n); /* e (double) is already exp(l - ref) */
        } else if (all || nc >= n / GATHER_MAX) {
            /* the whole row through the vector kernel beats a gather of many candidates */
            sum = expf_sum(s, w, n, o.m, inv_t, e);
            if (!all) sum = sum_over(e, cand, nc);
        } else {
            for (uint32_t j = 0; j < nc; j++) {
                uint32_t i = cand[j];
                float d = w[i] - o.m;
                e[i] = (double)kvc__sample_expf(d * inv_t);
            }
            sum = sum_over(e, cand, nc);
        }
        double u = kvc_rng_double(rng);
        token = walk(e, all ? NULL : cand, nc, u * sum);
    }

    r.token = (kvc_token_t)token;
    r.logprob = (float)(((double)sanitize(logits[token]) - o.mraw) - o.log_z);
    *out = r;
    return 0;
}

int kvc_sample_kept(kvc_sampler_t *s, const kvc_sampling_params_t *p, const float *logits,
                    const kvc_token_t *history, size_t n_history, kvc_token_t *ids, uint32_t *n_ids)
{
    int rc = check_call(s, p, logits, history, n_history);
    if (rc) return rc;
    if (!ids || !n_ids) return KVC_EINVAL;
    prep_t o;
    rc = prepare(s, p, logits, history, n_history, 0, NULL, &o);
    if (rc) return rc;
    uint32_t nc;
    if (p->temperature == 0.0f) {
        ids[0] = (kvc_token_t)o.argmax;
        nc = 1;
    } else {
        bool all;
        nc = truncate_candidates(s, p, &o, &all);
        uint32_t k = 0;
        for (uint32_t j = 0; j < nc; j++) {
            uint32_t i = all ? j : s->cand[j];
            if (s->w[i] != -INFINITY) ids[k++] = (kvc_token_t)i; /* no probability */
        }
        nc = k;
    }
    *n_ids = nc;
    return 0;
}

int kvc_log_softmax_topk(const float *logits, uint32_t n, uint32_t k, kvc_token_t *ids,
                         double *logprobs)
{
    if (!logits || !ids || !logprobs || n == 0 || n > MAX_N_VOCAB || k == 0 || k > n)
        return KVC_EINVAL;
    float m = -INFINITY;
    for (uint32_t i = 0; i < n; i++) m = fmaxf(m, sanitize(logits[i]));
    if (m == -INFINITY) return KVC_EINVAL;
    double z = 0;
    for (uint32_t i = 0; i < n; i++) z += exp((double)sanitize(logits[i]) - m);
    double log_z = log(z);
    /* kvc_token_t is int32_t and every id < 2^31: the heap runs on the caller's array */
    uint32_t *h = (uint32_t *)ids;
    select_top(logits, n, k, h, kvc_isa_best() != KVC_ISA_SCALAR);
    for (uint32_t j = 0; j < k; j++)
        logprobs[j] = ((double)sanitize(logits[h[j]]) - m) - log_z; /* no m + log_z: it can lose
                                                                      log_z next to FLT_MAX */
    return 0;
}

/* ---- stop strings ---------------------------------------------------------------------- */

struct kvc_stop {
    kvc_allocator_t alloc;
    uint32_t n;
    uint32_t n_held;
    bool matched;
    uint16_t len[KVC_STOP_MAX_STRINGS];
    char held[KVC_STOP_MAX_BYTES];
    char str[KVC_STOP_MAX_STRINGS][KVC_STOP_MAX_BYTES];
};

int kvc_stop_create(const char *const *stops, size_t n_stops, const kvc_allocator_t *a,
                    kvc_stop_t **out)
{
    if (!out || (!stops && n_stops > 0)) return KVC_EINVAL;
    if (n_stops > KVC_STOP_MAX_STRINGS) return KVC_ERANGE;
    for (size_t i = 0; i < n_stops; i++) {
        if (!stops[i] || !stops[i][0]) return KVC_EINVAL;
        if (strnlen(stops[i], KVC_STOP_MAX_BYTES + 1) > KVC_STOP_MAX_BYTES) return KVC_ERANGE;
    }
    kvc_stop_t *st = kvc_calloc(a, 1, sizeof *st, 16);
    if (!st) return KVC_ENOMEM;
    if (a) st->alloc = *a;
    st->n = (uint32_t)n_stops;
    for (size_t i = 0; i < n_stops; i++) {
        size_t l = strlen(stops[i]);
        memcpy(st->str[i], stops[i], l);
        st->len[i] = (uint16_t)l;
    }
    *out = st;
    return 0;
}

void kvc_stop_destroy(kvc_stop_t *st)
{
    if (!st) return;
    kvc_allocator_t a = st->alloc;
    kvc_free(&a, st);
}

void kvc_stop_reset(kvc_stop_t *st)
{
    if (!st) return;
    st->n_held = 0;
    st->matched = false;
}

int kvc_stop_feed(kvc_stop_t *st, const char *text, size_t len, char *out, size_t cap,
                  size_t *n_out, bool *matched)
{
    if (!st || (!text && len > 0) || !out || !n_out || !matched) return KVC_EINVAL;
    if (len > SIZE_MAX - KVC_STOP_MAX_BYTES || cap < len + KVC_STOP_MAX_BYTES) return KVC_ERANGE;
    *n_out = 0;
    *matched = st->matched;
    if (st->matched) return 0;
    size_t total = st->n_held + len;
    memcpy(out, st->held, st->n_held);
    if (len) memcpy(out + st->n_held, text, len);

    /* the match that ends first; at the same end, the longest */
    size_t best_end = SIZE_MAX, best_start = 0;
    for (uint32_t i = 0; i < st->n; i++) {
        const char *hit = memmem(out, total, st->str[i], st->len[i]);
        if (!hit) continue;
        size_t start = (size_t)(hit - out), end = start + st->len[i];
        if (end < best_end || (end == best_end && start < best_start)) {
            best_end = end;
            best_start = start;
        }
    }
    if (best_end != SIZE_MAX) {
        st->matched = true;
        st->n_held = 0;
        *n_out = best_start;
        *matched = true;
        return 0;
    }

    /* hold back the longest suffix that is a proper prefix of some stop string */
    size_t hold = 0;
    for (uint32_t i = 0; i < st->n; i++) {
        size_t top = KVC_MIN((size_t)st->len[i] - 1, total);
        for (size_t l = top; l > hold; l--) {
            if (memcmp(out + total - l, st->str[i], l) == 0) {
                hold = l;
                break;
            }
        }
    }
    memcpy(st->held, out + total - hold, hold);
    st->n_held = (uint32_t)hold;
    *n_out = total - hold;
    return 0;
}

int kvc_stop_flush(kvc_stop_t *st, char *out, size_t cap, size_t *n_out)
{
    if (!st || !out || !n_out) return KVC_EINVAL;
    if (cap < st->n_held) return KVC_ERANGE;
    memcpy(out, st->held, st->n_held);
    *n_out = st->n_held;
    st->n_held = 0;
    return 0;
}
