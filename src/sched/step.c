/* step.c - planning one step: running requests first (decodes and the next
 * chunks of started prompts), then swapped-out requests, then admissions,
 * within the token budget and the running cap; making room by preemption
 * when a request cannot grow, with the victim chosen by the policy hook.
 * Every state change goes through kvc__sched_set_state (sched.c).
 * See include/kvcache/sched.h. */
#include "sched_int.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define SERIAL(r) ((unsigned long long)(r)->serial)

/* Blocks the running requests have been promised but do not hold yet. */
static uint64_t outstanding(const kvc_sched_t *s)
{
    uint64_t sum = 0;
    for (uint32_t i = 0; i < s->running.n; i++) {
        const req_t *r = &s->reqs[s->running.v[i]];
        uint32_t t = s->admit->target(s, r);
        if (t > r->blocks) sum += t - r->blocks;
    }
    return sum;
}

/* ---- preemption --------------------------------------------------------------------------- */
static void preempt(kvc_sched_t *s, uint32_t slot, const char *why, bool force_recompute)
{
    req_t *r = &s->reqs[slot];
    kvc_seq_info_t info;
    (void)kvc_seq_info(s->seqs, r->seq, &info);
    uint32_t computed = (uint32_t)info.n_computed;
    bool swap = s->pre->swaps && !force_recompute;
    uint64_t bytes = (uint64_t)r->blocks * s->p.block_bytes;
    if (swap && s->p.swap_space_bytes) {
        uint64_t in_use = 0;
        for (uint32_t i = 0; i < s->swapped.n; i++)
            in_use += kvc__sched_blocks_for(s, s->reqs[s->swapped.v[i]].swapped_tokens) *
                      s->p.block_bytes;
        if (in_use + bytes > s->p.swap_space_bytes) swap = false; /* no host room: recompute */
    }
    if (swap && s->p.swap_out &&
        !s->p.swap_out(s->p.swap_ctx, kvc__sched_id(s, slot), r->tag, r->seq, computed))
        swap = false; /* the engine could not take the copy: recompute */
    r->n_preempt++;
    s->st.preemptions++;
    s->plan.n_preempted++;
    if (!kvc__sched_reset(s, slot)) return; /* it ended instead */
    if (swap) {
        r->swapped_tokens = computed;
        kvc__sched_set_state(s, slot, R_SWAPPED, false);
        s->plan.swap_out_bytes += bytes;
        s->st.swapped_out_bytes += bytes;
        TRACE(s, "  preempt r%llu (%s): swap out %u computed tokens, %llu bytes", SERIAL(r), why,
              computed, (unsigned long long)bytes);
    } else {
        kvc__sched_set_state(s, slot, R_WAITING, true); /* it keeps its place */
        TRACE(s, "  preempt r%llu (%s): recompute, %u computed tokens dropped", SERIAL(r), why,
              computed);
    }
}

typedef enum { F_ALL, F_CLASS, F_TENANT, F_LONG, F_LOWER_CLASS } filter_t;

/* The cap that `extra` more blocks of request r would break (NULL: none), and the requests that
 * could give room under it. */
static const char *cap_hit(const kvc_sched_t *s, const req_t *r, uint64_t extra, filter_t *f)
{
    if (s->st.class_blocks[r->priority] + extra >
        kvc__sched_cap_blocks(s, s->p.class_kv_cap[r->priority]))
        return *f = F_CLASS, "class KV cap";
    if (s->tenants[r->tenant].blocks + extra > kvc__sched_cap_blocks(s, s->p.tenant_kv_share))
        return *f = F_TENANT, "tenant KV quota";
    if (r->is_long && s->long_blocks + extra > kvc__sched_cap_blocks(s, s->p.long_kv_cap))
        return *f = F_LONG, "long-request cap";
    return *f = F_ALL, NULL;
}

/* May running request v give room to r under filter f? */
static bool in_filter(const req_t *v, const req_t *r, filter_t f)
{
    switch (f) {
    case F_CLASS:
        return v->priority == r->priority;
    case F_TENANT:
        return v->tenant == r->tenant;
    case F_LONG:
        return v->is_long;
    case F_LOWER_CLASS:
        return v->priority > r->priority;
    default:
        return true;
    }
}

static kvc_sched_cand_t cand_of(const kvc_sched_t *s, uint32_t slot)
{
    const req_t *r = &s->reqs[slot];
    return (kvc_sched_cand_t){.id = kvc__sched_id(s, slot),
                              .tag = r->tag,
                              .priority = r->priority,
                              .tenant = r->tenant,
                              .arrival_s = r->arrival,
                              .n_prompt = r->n_prompt,
                              .n_output = r->n_output,
                              .n_blocks = r->blocks,
                              .is_long = r->is_long};
}

/* Ask the victim policy.  The candidates are the running requests not planned this step that
 * match the filter, in running order.  `needy` is KVC_NONE for a deadlock.  Returns the slot
 * chosen, or KVC_NONE when the policy chose none (or there was no candidate). */
static uint32_t choose_victim(kvc_sched_t *s, uint32_t needy, uint32_t need, filter_t f)
{
    uint32_t n = 0, first = 0;
    if (f == F_LOWER_CLASS) /* sorted by class: the less urgent ones are a suffix */
        for (first = s->running.n;
             first > 0 && s->reqs[s->running.v[first - 1]].priority > s->reqs[needy].priority;)
            first--;
    for (uint32_t i = first; i < s->running.n; i++) {
        uint32_t v = s->running.v[i];
        const req_t *q = &s->reqs[v];
        if (!q->planned && (needy == KVC_NONE || in_filter(q, &s->reqs[needy], f)))
            s->cands[n++] = cand_of(s, v); /* room reserved: at most max_num_seqs run */
    }
    if (!n) return KVC_NONE;
    kvc_sched_cand_t me;
    if (needy != KVC_NONE) me = cand_of(s, needy);
    uint32_t k = s->p.victim(s->p.victim_ctx, needy != KVC_NONE ? &me : NULL, need, s->cands, n);
    return k < n ? (uint32_t)s->cands[k].id : KVC_NONE;
}

/* Make room for running request `slot` to take `need` more blocks: caps first, then the pool.
 * Returns false if it had to go itself (or, under backpressure, must wait). */
static bool make_room(kvc_sched_t *s, uint32_t slot, uint32_t need, bool *waited)
{
    for (;;) {
        req_t *r = &s->reqs[slot];
        filter_t f;
        const char *why = cap_hit(s, r, need, &f);
        if (!why && need > kvc_pool_n_free(s->pool)) why = "pool full";
        if (!why) return true;
        if (!s->pre->preempts) {
            TRACE(s, "  r%llu waits: needs %u blocks (%s)", SERIAL(r), need, why);
            *waited = true;
            return false;
        }
        uint32_t v = choose_victim(s, slot, need, f);
        if (v == KVC_NONE) v = slot; /* it is among the candidates: none means itself */
        char reason[96];
        snprintf(reason, sizeof reason, "%s, r%llu needs %u blocks", why, SERIAL(r), need);
        preempt(s, v, reason, false);
        if (v == slot) return false;
    }
}

/* ---- planning ------------------------------------------------------------------------------- */
static void add_entry(kvc_sched_t *s, uint32_t slot, uint32_t first, uint32_t n, uint32_t drafts,
                      bool prefill, bool samples)
{
    KVC_ASSERT(s->plan.n_entries < s->entries_cap); /* reserved: one per running request */
    req_t *r = &s->reqs[slot];
    s->entries[s->plan.n_entries++] = (kvc_sched_entry_t){.id = kvc__sched_id(s, slot),
                                                          .tag = r->tag,
                                                          .seq = r->seq,
                                                          .first_pos = first,
                                                          .n_tokens = n,
                                                          .n_drafts = drafts,
                                                          .n_context = first + n,
                                                          .prefill = prefill,
                                                          .samples = samples};
    r->planned = true;
    if (prefill)
        s->plan.n_prefill_tokens += n;
    else
        s->plan.n_decode_tokens += n;
}

/* Schedule up to `budget` tokens of running request `slot`.  Returns tokens taken. */
static uint32_t schedule_running(kvc_sched_t *s, uint32_t slot, uint32_t budget,
                                 uint32_t prefill_allow, bool *waited)
{
    req_t *r = &s->reqs[slot];
    struct {
        size_t n_tokens, n_computed;
    } info;
    if (kvc_seq_progress(s->seqs, r->seq, &info.n_tokens, &info.n_computed, NULL)) return 0;
    uint32_t remaining = (uint32_t)(info.n_tokens - info.n_computed);
    bool prefill = remaining > 1; /* catching up on known tokens: a prompt, or a recompute */
    uint32_t n, drafts = 0;
    if (prefill) {
        n = KVC_MIN(remaining, KVC_MIN(budget, prefill_allow));
        if (s->p.max_prefill_chunk) n = KVC_MIN(n, s->p.max_prefill_chunk);
    } else {
        n = KVC_MIN(remaining, budget); /* 1: the sampled token */
        if (n && s->p.spec_tokens && r->n_output + 1 < r->max_output) {
            drafts = KVC_MIN(s->p.spec_tokens, r->max_output - r->n_output - 1);
            drafts = KVC_MIN(drafts, budget - n);
        }
    }
    if (n == 0) return 0;
    if (drafts) {
        if (s->p.draft)
            s->p.draft(s->p.draft_ctx, kvc__sched_id(s, slot), r->tag, drafts, s->drafts);
        else
            memset(s->drafts, 0, drafts * sizeof(kvc_token_t));
        int rc = kvc_seq_draft(s->seqs, r->seq, s->drafts, drafts);
        if (rc) {
            TRACE(s, "  r%llu cannot draft: %s", SERIAL(r), kvc_strerror(rc));
            return 0;
        }
    }
    uint32_t need;
    (void)kvc_seq_blocks_needed(s->seqs, r->seq, n + drafts, &need);
    if (!make_room(s, slot, need, waited)) {
        if (drafts && r->state == R_RUNNING) (void)kvc_seq_rollback(s->seqs, r->seq, drafts);
        return 0;
    }
    int rc = kvc_seq_reserve(s->seqs, r->seq, n + drafts, NULL);
    if (rc) {
        if (drafts) (void)kvc_seq_rollback(s->seqs, r->seq, drafts);
        TRACE(s, "  r%llu cannot reserve: %s", SERIAL(r), kvc_strerror(rc));
        *waited = true;
        return 0;
    }
    if (need) kvc__sched_account(s, r); /* no new block, no change (a copy replaces one it held) */
    bool samples = info.n_computed + n == info.n_tokens; /* every known token computed */
    add_entry(s, slot, (uint32_t)info.n_computed, n + drafts, drafts, prefill, samples);
    TRACE(s, "  run r%llu: %s %u tokens at %u%s", SERIAL(r), prefill ? "prefill" : "decode", n,
          (uint32_t)info.n_computed, drafts ? " + drafts" : "");
    return n + drafts;
}

/* Bring swapped requests back while memory allows (priority order). */
static void swap_in(kvc_sched_t *s, int cls)
{
    while (s->swapped.n && s->running.n < s->p.max_num_seqs) {
        uint32_t slot = s->swapped.v[0];
        req_t *r = &s->reqs[slot];
        if (r->priority != cls) return; /* sorted by class: the most urgent come first */
        uint64_t need = kvc__sched_blocks_for(s, (uint64_t)r->swapped_tokens + 1);
        if (need + outstanding(s) > kvc_pool_n_free(s->pool)) return;
        /* Its class (tenant, long requests) may have filled its cap while it was out. */
        filter_t f;
        const char *why = cap_hit(s, r, need, &f);
        if (why) {
            TRACE(s, "  r%llu stays swapped out: %s", SERIAL(r), why);
            return;
        }
        size_t hit = 0;
        if (kvc_seq_lookup(s->seqs, r->seq, &hit)) {
            /* a failed lookup may have pinned part of the hit: give it back */
            if (kvc__sched_seq_blocks(s, r)) (void)kvc__sched_reset(s, slot);
            return;
        }
        uint32_t rest = r->swapped_tokens > hit ? r->swapped_tokens - (uint32_t)hit : 0;
        if (rest && kvc_seq_reserve(s->seqs, r->seq, rest, NULL)) {
            (void)kvc__sched_reset(s, slot);
            return;
        }
        /* the bytes come back before the positions count as computed (and become hittable) */
        if (rest && s->p.swap_in)
            s->p.swap_in(s->p.swap_ctx, kvc__sched_id(s, slot), r->tag, r->seq, (uint32_t)hit,
                         rest);
        if (rest && kvc_seq_complete(s->seqs, r->seq, rest)) {
            (void)kvc__sched_reset(s, slot);
            return;
        }
        uint64_t bytes = kvc__sched_blocks_for(s, rest) * s->p.block_bytes;
        s->plan.swap_in_bytes += bytes;
        s->st.swapped_in_bytes += bytes;
        s->plan.n_swapped_in++;
        kvc__sched_set_state(s, slot, R_RUNNING, false);
        kvc__sched_account(s, r);
        TRACE(s, "  swap in r%llu: %zu tokens hit the prefix cache, %u restored (%llu bytes)",
              SERIAL(r), hit, rest, (unsigned long long)bytes);
    }
}

/* Tenant t's step scratch, reset the first time this step touches it. */
static tenant_t *step_tenant(kvc_sched_t *s, uint32_t t)
{
    tenant_t *tn = &s->tenants[t];
    if (tn->stamp != s->st.steps + 1) {
        tn->stamp = s->st.steps + 1;
        tn->used = 0;
        tn->blocked = 0;
        tn->has_work = false;
    }
    return tn;
}

/* Dominant share of a tenant's consumption: max(KV token-seconds share, computed share). */
static double tenant_usage(const kvc_sched_t *s, uint32_t t)
{
    double kv_total =
        s->kv_all + (double)s->blocks_all * s->bs / s->n_groups * (s->charge_clock - s->kv_all_at);
    double comp_total = (double)s->computed_all;
    const tenant_t *tn = &s->tenants[t];
    double a = kv_total > 0 ? kvc__sched_tenant_kv(s, tn) / kv_total : 0;
    double b = comp_total > 0 ? (double)tn->computed / comp_total : 0;
    return KVC_MAX(a, b);
}

/* The next waiting request to consider, skipping queues blocked this step.  Within the most
 * urgent class with work: the least-consuming tenant if fair, else the earliest arrival (ties:
 * the lower tenant, short before long).  Visits only the tenants with waiting requests of
 * class c, so its cost does not grow with the number of tenants. */
static uint32_t next_waiting(kvc_sched_t *s, int c)
{
    uint32_t best = KVC_NONE, best_t = 0;
    int best_l = 0;
    double best_key = 0;
    for (uint32_t t = s->active[c]; t != KVC_NONE; t = s->tenants[t].next[c]) {
        const tenant_t *tn = step_tenant(s, t);
        double usage = s->p.tenant_fair ? tenant_usage(s, t) : 0;
        for (int l = 0; l < 2; l++) {
            const queue_t *q = &tn->waiting[c][l];
            if (!q->n || (tn->blocked >> (c * 2 + l) & 1)) continue;
            uint32_t slot = q->head;
            double key = s->p.tenant_fair ? usage : s->reqs[slot].arrival;
            double arr = s->reqs[slot].arrival;
            if (best == KVC_NONE || key < best_key ||
                (key == best_key &&
                 (arr < s->reqs[best].arrival ||
                  (arr == s->reqs[best].arrival && (t < best_t || (t == best_t && l < best_l)))))) {
                best = slot;
                best_key = key;
                best_t = t;
                best_l = l;
            }
        }
    }
    return best;
}

/* Try to admit waiting request `slot` with up to `budget` tokens; returns tokens taken, or
 * UINT32_MAX when admission must stop (memory), 0 when only this queue is blocked. */
static uint32_t admit(kvc_sched_t *s, uint32_t slot, uint32_t budget, bool *queue_blocked)
{
    req_t *r = &s->reqs[slot];
    *queue_blocked = false;
    if (s->p.tenant_max_running && s->tenants[r->tenant].running >= s->p.tenant_max_running) {
        *queue_blocked = true;
        return 0;
    }
    if (!r->has_seq) {
        /* the class reaches the prefix cache: under the "priority" eviction policy a more
         * urgent class's cached prefixes outlive a less urgent one's (sched.h) */
        kvc_seq_desc_t d = {.prompt = r->prompt,
                            .n_prompt = r->n_prompt,
                            .ns = &r->ns,
                            .priority = KVC_CLASS_PREFIX_PRIORITY(r->priority)};
        int rc = kvc_seq_create(s->seqs, &d, &r->seq);
        if (rc) return UINT32_MAX; /* no sequence slot (or no memory for one): wait */
        r->has_seq = true;
    }
    kvc_seq_info_t info;
    (void)kvc_seq_info(s->seqs, r->seq, &info);
    size_t hit = info.n_computed;
    bool looked = false;
    if (info.n_reserved == 0 && info.n_computed == 0) {
        if (kvc_seq_lookup(s->seqs, r->seq, &hit)) {
            /* a failed lookup may have pinned part of the hit: give it back */
            if (kvc__sched_seq_blocks(s, r)) (void)kvc__sched_reset(s, slot);
            return UINT32_MAX;
        }
        looked = true;
        kvc__sched_account(s, r);
    }
    uint32_t computed = (uint32_t)hit, known = (uint32_t)info.n_tokens;
    uint32_t n = KVC_MIN(known - computed, budget); /* the prompt, or all of a preempted request */
    if (s->p.max_prefill_chunk) n = KVC_MIN(n, s->p.max_prefill_chunk);
    uint32_t need = 0;
    if (n) (void)kvc_seq_blocks_needed(s->seqs, r->seq, n, &need);
    /* Caps, measured on what the request must be able to hold: its known tokens and the next. */
    uint64_t full = kvc__sched_blocks_for(s, (uint64_t)known + 1);
    uint64_t extra = full > r->blocks ? full - r->blocks : 0;
    filter_t f;
    const char *why = cap_hit(s, r, extra, &f);
    bool stop_all = false;
    if (!why) {
        for (;;) {
            uint64_t free_blocks = kvc_pool_n_free(s->pool);
            uint32_t tgt = s->admit->target(s, r);
            uint64_t want = tgt ? (tgt > r->blocks ? tgt - r->blocks : 0) + outstanding(s) : need;
            /* Without preemption nobody can take memory back: keep one block of headroom per
             * running request so that they can all grow a block before new ones get in. */
            if (!s->pre->preempts) want += (uint64_t)s->running.n * s->n_groups;
            if (want <= free_blocks) break;
            /* A more urgent request may take the memory of less urgent running ones. */
            uint32_t v =
                s->pre->preempts
                    ? choose_victim(s, slot,
                                    (uint32_t)KVC_MIN(want - free_blocks, (uint64_t)UINT32_MAX),
                                    F_LOWER_CLASS)
                    : KVC_NONE;
            if (v == KVC_NONE) {
                why = s->admit->wait_why;
                stop_all = true;
                break;
            }
            char reason[64];
            snprintf(reason, sizeof reason, "class %u r%llu needs room", r->priority, SERIAL(r));
            preempt(s, v, reason, false);
            (void)kvc_seq_blocks_needed(s->seqs, r->seq, n, &need);
        }
    }
    if (why || n == 0) {
        /* give the pinned hit back; it is looked up again next time */
        if (looked && !kvc__sched_reset(s, slot)) return UINT32_MAX; /* it ended instead */
        if (why) TRACE(s, "  r%llu waits: %s", SERIAL(r), why);
        *queue_blocked = !stop_all;
        return stop_all ? UINT32_MAX : 0;
    }
    if (kvc_seq_reserve(s->seqs, r->seq, n, NULL)) {
        if (looked) (void)kvc__sched_reset(s, slot);
        return UINT32_MAX;
    }
    kvc__sched_set_state(s, slot, R_RUNNING, false);
    kvc__sched_account(s, r);
    if (looked) {
        if (!r->admitted_once) {
            r->n_hit = (uint32_t)hit;
            s->st.hit_tokens += hit;
            s->st.prompt_tokens_admitted += r->n_prompt;
        } else {
            r->n_resume_hit += (uint32_t)hit;
            s->st.resume_hit_tokens += hit;
        }
    }
    r->admitted_once = true;
    s->plan.n_admitted++;
    add_entry(s, slot, computed, n, 0, known - computed > 1, computed + n == known);
    TRACE(s, "  admit r%llu (class %u, tenant %u): %zu tokens hit, computing %u", SERIAL(r),
          r->priority, r->tenant, hit, n);
    return n;
}

int kvc_sched_step(kvc_sched_t *s, double now, const kvc_sched_plan_t **plan)
{
    if (!s || !plan || !isfinite(now)) return KVC_EINVAL;
    if (s->plan_open) return KVC_EBUSY; /* the last plan has not completed */
    /* Tenants pay for the KV they held since the last step: the charge clock moves on, and
     * each tenant's charge follows lazily (kvc__sched_tenant_kv). */
    s->charge_clock += now > s->last_now ? now - s->last_now : 0;
    s->last_now = now;
    if (now > s->latest) s->latest = now;
    s->plan = (kvc_sched_plan_t){0};
    s->trace_len = 0;
    if (s->trace) s->trace[0] = 0;
    TRACE(s, "step %llu at %.6f s: %u running, %u waiting, %u swapped, %u free blocks",
          (unsigned long long)s->st.steps, now, s->running.n, s->n_state[R_WAITING], s->swapped.n,
          kvc_pool_n_free(s->pool));
    uint32_t budget = s->p.max_num_batched_tokens;
    bool waited = false;
    uint64_t preempted_before = s->st.preemptions;

    /* Tenants with prompt work share the prompt budget fairly (decodes are never held back). */
    uint32_t prefill_allow = UINT32_MAX;
    if (s->p.tenant_fair) {
        uint32_t n_with = 0;
        for (uint32_t i = 0; i < s->running.n; i++) {
            const req_t *r = &s->reqs[s->running.v[i]];
            kvc_seq_info_t info;
            if (!kvc_seq_info(s->seqs, r->seq, &info) && info.n_computed < r->n_prompt) {
                tenant_t *tn = step_tenant(s, r->tenant);
                n_with += !tn->has_work;
                tn->has_work = true;
            }
        }
        for (int c = 0; c < KVC_MAX_CLASSES; c++)
            for (uint32_t t = s->active[c]; t != KVC_NONE; t = s->tenants[t].next[c]) {
                tenant_t *tn = step_tenant(s, t);
                n_with += !tn->has_work;
                tn->has_work = true;
            }
        if (n_with > 1) prefill_allow = KVC_MAX(1u, budget / n_with);
    }

    /* Class by class, most urgent first: (1) its running requests (decodes and the next chunks of
     * started prompts), (2) its swapped requests, (3) its waiting requests.  A class is admitted
     * only if no request of it or a more urgent class was preempted or had to wait this step. */
    bool stop_admitting = false;
    for (int c = 0; c < KVC_MAX_CLASSES; c++) {
        if (!s->class_running[c] && !s->class_waiting[c] && !s->swapped.n) continue;
        for (uint32_t i = 0; i < s->running.n && budget && s->class_running[c]; i++) {
            uint32_t slot = s->running.v[i];
            if (s->reqs[slot].planned || s->reqs[slot].priority != c) continue;
            uint32_t before_n = s->running.n;
            uint32_t took = schedule_running(s, slot, budget, prefill_allow, &waited);
            budget -= took;
            if (took && prefill_allow != UINT32_MAX && s->entries[s->plan.n_entries - 1].prefill)
                step_tenant(s, s->reqs[slot].tenant)->used += took;
            if (s->running.n < before_n) i = UINT32_MAX; /* preemption reshaped the list: rescan */
        }
        if (s->st.preemptions != preempted_before || waited) stop_admitting = true;
        if (!stop_admitting) {
            /* swapped requests of this class come back before new ones */
            swap_in(s, c);
            for (uint32_t i = 0; i < s->swapped.n; i++)
                stop_admitting |= s->reqs[s->swapped.v[i]].priority == c;
        }
        while (!stop_admitting && budget && s->running.n < s->p.max_num_seqs &&
               s->class_waiting[c]) {
            uint32_t slot = next_waiting(s, c);
            if (slot == KVC_NONE) break;
            req_t *r = &s->reqs[slot];
            tenant_t *tn = step_tenant(s, r->tenant);
            uint32_t allow = budget;
            if (prefill_allow != UINT32_MAX)
                allow = tn->used < prefill_allow ? KVC_MIN(budget, prefill_allow - tn->used) : 0;
            bool qb;
            uint32_t took = allow ? admit(s, slot, allow, &qb) : 0;
            if (took == UINT32_MAX) {
                stop_admitting = true;
                break;
            }
            if (took == 0) {
                tn->blocked |= (uint8_t)(1u << (r->priority * 2 + r->is_long));
                continue;
            }
            budget -= took;
            tn->used += took;
        }
    }
    /* Backpressure can deadlock: everyone running waits for blocks nobody will free.  Break it
     * with one recompute preemption, of the latest, least urgent request by default. */
    if (s->plan.n_entries == 0 && s->running.n && waited) {
        uint32_t v = choose_victim(s, KVC_NONE, 0, F_ALL);
        if (v == KVC_NONE) v = s->running.v[s->running.n - 1];
        preempt(s, v, "deadlock under backpressure", true);
        s->st.forced_preemptions++;
    }
    s->st.steps++;
    s->plan.entries = s->entries;
    s->plan_open = s->plan.n_entries > 0;
    TRACE(s, "  plan: %u rows, %u prefill + %u decode tokens, %u admitted, %u preempted",
          s->plan.n_entries, s->plan.n_prefill_tokens, s->plan.n_decode_tokens, s->plan.n_admitted,
          s->plan.n_preempted);
    *plan = &s->plan;
    return 0;
}
