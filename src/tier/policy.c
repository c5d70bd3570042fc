/* policy.c - fetch or recompute: the pure decision for a run of blocks found in a tier,
 * its break-even run length, and the online estimate of a tier's latency and bandwidth
 * that feeds it (see include/kvcache/tier.h for the arithmetic). */
#include "tier/tier_int.h"

#include <math.h>

static bool pos_finite(double x)
{
    return isfinite(x) && x > 0;
}

int kvc_tier_decide(const kvc_tier_run_t *run, kvc_tier_decision_t *out)
{
    if (!run || !out || run->block_tokens == 0 || !pos_finite(run->bandwidth_Bps) ||
        !pos_finite(run->prefill_tokens_per_s) || !isfinite(run->latency_s) || run->latency_s < 0)
        return KVC_EINVAL;
    double per_block_fetch = (double)run->block_bytes / run->bandwidth_Bps;
    double per_block_compute = (double)run->block_tokens / run->prefill_tokens_per_s;
    kvc_tier_decision_t d;
    d.recompute_s = run->n_blocks * per_block_compute;
    d.fetch_s = run->n_blocks ? run->latency_s + run->n_blocks * per_block_fetch : 0;
    d.fetch = run->n_blocks > 0 && d.fetch_s < d.recompute_s;
    /* n * compute > latency + n * fetch  <=>  n > latency / (compute - fetch). */
    double gain = per_block_compute - per_block_fetch;
    if (gain <= 0)
        d.break_even = UINT32_MAX;
    else {
        double n = floor(run->latency_s / gain) + 1;
        d.break_even = n >= (double)UINT32_MAX ? UINT32_MAX : (uint32_t)n;
    }
    *out = d;
    return 0;
}

int kvc_tier_estimator_init(kvc_tier_estimator_t *e, double latency_s, double bandwidth_Bps,
                            double alpha)
{
    if (alpha == 0) alpha = 0.1;
    if (!e || !isfinite(latency_s) || latency_s < 0 || !pos_finite(bandwidth_Bps) ||
        !(alpha > 0 && alpha <= 1))
        return KVC_EINVAL;
    *e = (kvc_tier_estimator_t){
        .latency_s = latency_s, .bandwidth_Bps = bandwidth_Bps, .alpha = alpha};
    return 0;
}

int kvc_tier_estimator_observe(kvc_tier_estimator_t *e, uint64_t bytes, double seconds)
{
    if (!e || bytes == 0 || !pos_finite(seconds)) return KVC_EINVAL;
    double x = (double)bytes, y = seconds;
    /* The first sample sets the moments; later ones blend in with weight alpha (so the
     * estimate follows a link whose speed changes, forgetting the old one geometrically). */
    double a = e->n_samples ? e->alpha : 1.0;
    e->mx += a * (x - e->mx);
    e->my += a * (y - e->my);
    e->mxx += a * (x * x - e->mxx);
    e->mxy += a * (x * y - e->mxy);
    e->n_samples++;
    double var = e->mxx - e->mx * e->mx;
    double cov = e->mxy - e->mx * e->my;
    /* Sizes that vary by a few percent fit a line; otherwise keep the latency and let the
     * bandwidth explain the mean. */
    if (var > 1e-3 * e->mx * e->mx && cov > 0) {
        double slope = cov / var;
        double icpt = e->my - slope * e->mx;
        if (icpt >= 0) {
            e->bandwidth_Bps = 1.0 / slope;
            e->latency_s = icpt;
            return 0;
        }
    }
    double t = e->my - e->latency_s;
    if (t <= 0) {
        /* Fetches faster than the assumed latency: it was overestimated.  Split the mean
         * time evenly until sizes that vary say better. */
        e->latency_s = e->my * 0.5;
        t = e->my * 0.5;
    }
    e->bandwidth_Bps = e->mx / t;
    return 0;
}
