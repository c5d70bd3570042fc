/* policy.c - the scheduler's named policies: admission (what a new request
 * reserves), preemption (whether and how running requests give memory back)
 * and victim selection (which request gives it).  Adding a policy is one
 * enumerator in sched.h and one row (or one function) here.
 * See include/kvcache/sched.h. */
#include "sched_int.h"

#include <math.h>
#include <string.h>

/* ---- admission ----------------------------------------------------------------------------- */
static uint32_t target_none(const kvc_sched_t *s, const req_t *r)
{
    (void)s, (void)r;
    return 0;
}

static uint32_t target_max(const kvc_sched_t *s, const req_t *r)
{
    return (uint32_t)kvc__sched_blocks_for(s, (uint64_t)r->n_prompt + r->max_output);
}

static uint32_t target_expected(const kvc_sched_t *s, const req_t *r)
{
    double out = ceil(s->p.expected_output * (1.0 + s->p.expected_margin));
    uint32_t o = (uint32_t)KVC_MIN((double)r->max_output, out);
    return (uint32_t)kvc__sched_blocks_for(s, (uint64_t)r->n_prompt + o);
}

/* Unsized, so that a row missing at the end conflicts with the declaration's size. */
const kvc__admit_policy_t kvc__admit_policies[] = {
    [KVC_ADMIT_GREEDY] = {"greedy", target_none, false, "pool full"},
    [KVC_ADMIT_RESERVE_MAX] = {"reserve-max", target_max, true, "reservation does not fit"},
    [KVC_ADMIT_RESERVE_EXPECTED] = {"reserve-expected", target_expected, false,
                                    "reservation does not fit"},
};

/* ---- preemption ---------------------------------------------------------------------------- */
const kvc__preempt_policy_t kvc__preempt_policies[] = {
    [KVC_PREEMPT_RECOMPUTE] = {"recompute", true, false},
    [KVC_PREEMPT_SWAP] = {"swap", true, true},
    [KVC_PREEMPT_BACKPRESSURE] = {"backpressure", false, false},
};

/* ---- victim selection ------------------------------------------------------------------------
 * The candidates come sorted by (class, arrival), so the lowest class is a suffix. */
static uint32_t victim_latest(void *ctx, const kvc_sched_cand_t *needy, uint32_t need,
                              const kvc_sched_cand_t *c, uint32_t n)
{
    (void)ctx, (void)needy, (void)need, (void)c;
    return n ? n - 1 : 0;
}

static uint32_t victim_largest(void *ctx, const kvc_sched_cand_t *needy, uint32_t need,
                               const kvc_sched_cand_t *c, uint32_t n)
{
    (void)ctx, (void)needy, (void)need;
    if (!n) return 0;
    uint32_t best = n - 1;
    for (uint32_t i = n - 1; i-- > 0 && c[i].priority == c[n - 1].priority;)
        if (c[i].n_blocks > c[best].n_blocks) best = i; /* ties: the later one stays */
    return best;
}

static const struct {
    const char *name;
    kvc_victim_fn fn;
} victim_policies[] = {
    [KVC_VICTIM_LATEST] = {"latest", victim_latest},
    [KVC_VICTIM_LARGEST] = {"largest", victim_largest},
};

_Static_assert(KVC_ARRAY_LEN(victim_policies) == KVC_VICTIM__COUNT,
               "a victim policy lacks its row");

kvc_victim_fn kvc_victim_policy(kvc_victim_t v)
{
    return (unsigned)v < KVC_VICTIM__COUNT ? victim_policies[v].fn : NULL;
}

/* ---- names ----------------------------------------------------------------------------------- */
const char *kvc_admission_name(kvc_admission_t a)
{
    return (unsigned)a < KVC_ADMIT__COUNT ? kvc__admit_policies[a].name : "?";
}

const char *kvc_preemption_name(kvc_preemption_t p)
{
    return (unsigned)p < KVC_PREEMPT__COUNT ? kvc__preempt_policies[p].name : "?";
}

const char *kvc_victim_name(kvc_victim_t v)
{
    return (unsigned)v < KVC_VICTIM__COUNT ? victim_policies[v].name : "?";
}

int kvc_admission_parse(const char *s, kvc_admission_t *out)
{
    for (unsigned i = 0; s && out && i < KVC_ADMIT__COUNT; i++)
        if (!strcmp(s, kvc__admit_policies[i].name)) return *out = (kvc_admission_t)i, 0;
    return KVC_EINVAL;
}

int kvc_preemption_parse(const char *s, kvc_preemption_t *out)
{
    for (unsigned i = 0; s && out && i < KVC_PREEMPT__COUNT; i++)
        if (!strcmp(s, kvc__preempt_policies[i].name)) return *out = (kvc_preemption_t)i, 0;
    return KVC_EINVAL;
}

int kvc_victim_parse(const char *s, kvc_victim_t *out)
{
    for (unsigned i = 0; s && out && i < KVC_VICTIM__COUNT; i++)
        if (!strcmp(s, victim_policies[i].name)) return *out = (kvc_victim_t)i, 0;
    return KVC_EINVAL;
}
