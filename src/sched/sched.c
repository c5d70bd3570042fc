/* sched.c - the scheduler's request table and a request's life: ids with
 * generations over recycled slots, the one state-change function that keeps
 * every list and counter in step, adding, aborting, finishing, completing a
 * step, handing accounts back, and the checker.  The planning of a step is in
 * step.c, the named policies in policy.c.  See include/kvcache/sched.h.
 *
 * Memory is bounded by the live requests: a slot is reused once its account
 * is taken, and every array a request may need (its slot, a place in the
 * running and swapped lists, a plan entry, a victim candidate, two places for
 * its account) is reserved when it is added, so that nothing after
 * kvc_sched_add allocates (the trace excepted, which is best effort). */
#include "sched_int.h"
#include "util/msg.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- small helpers --------------------------------------------------------------------- */
/* Grow *p (elements of `size`) to hold at least `need`; doubling, all or nothing. */
static int grow(const kvc_sched_t *s, void **p, size_t size, size_t *cap, size_t need)
{
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *np = kvc_alloc(&s->p.allocator, c * size, 0);
    if (!np) return KVC_ENOMEM;
    if (*cap) memcpy(np, *p, *cap * size);
    kvc_free(&s->p.allocator, *p);
    *p = np;
    *cap = c;
    return 0;
}

void kvc__sched_trace(kvc_sched_t *s, const char *fmt, ...)
{
    if (!s->p.trace) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || grow(s, (void **)&s->trace, 1, &s->trace_cap, s->trace_len + (size_t)n + 2))
        return; /* best effort: the step does not fail for its account in words */
    va_start(ap, fmt);
    vsnprintf(s->trace + s->trace_len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    s->trace_len += (size_t)n;
    s->trace[s->trace_len++] = '\n';
    s->trace[s->trace_len] = 0;
}

static inline uint32_t n_used(const kvc_sched_t *s)
{
    return s->n_slots - s->n_state[R_FREE];
}

static void note_time(kvc_sched_t *s, double now)
{
    if (now > s->latest) s->latest = now;
}

/* The live request (any state but free) that id names, or NULL. */
static req_t *lookup(const kvc_sched_t *s, kvc_req_id_t id, uint32_t *slot)
{
    uint32_t sl = (uint32_t)id, gen = (uint32_t)(id >> 32);
    if (sl >= s->n_slots) return NULL;
    req_t *r = &s->reqs[sl];
    if (r->state == R_FREE || r->gen != gen) return NULL;
    if (slot) *slot = sl;
    return r;
}

/* ---- block accounting --------------------------------------------------------------------- */
uint32_t kvc__sched_seq_blocks(const kvc_sched_t *s, const req_t *r)
{
    uint32_t n = 0;
    if (r->has_seq) (void)kvc_seq_progress(s->seqs, r->seq, NULL, NULL, &n);
    return n;
}

void kvc__sched_account(kvc_sched_t *s, req_t *r)
{
    uint32_t now = kvc__sched_seq_blocks(s, r);
    if (now == r->blocks) return;
    int64_t d = (int64_t)now - (int64_t)r->blocks;
    tenant_t *t = &s->tenants[r->tenant];
    /* charge the blocks held so far before their number changes */
    t->kv_token_s = kvc__sched_tenant_kv(s, t);
    t->kv_at = s->charge_clock;
    s->kv_all += (double)s->blocks_all * s->bs / s->n_groups * (s->charge_clock - s->kv_all_at);
    s->kv_all_at = s->charge_clock;
    s->st.class_blocks[r->priority] = (uint32_t)((int64_t)s->st.class_blocks[r->priority] + d);
    t->blocks = (uint32_t)((int64_t)t->blocks + d);
    s->blocks_all = (uint32_t)((int64_t)s->blocks_all + d);
    if (r->is_long) s->long_blocks = (uint32_t)((int64_t)s->long_blocks + d);
    r->blocks = now;
}

uint32_t kvc__sched_cap_blocks(const kvc_sched_t *s, double share)
{
    return share > 0 ? (uint32_t)floor(share * s->pool_blocks) : UINT32_MAX;
}

/* ---- lists and the one state change ------------------------------------------------------------
 */
static queue_t *queue_of(kvc_sched_t *s, const req_t *r)
{
    return &s->tenants[r->tenant].waiting[r->priority][r->is_long];
}

/* The tenant's waiting requests of class c, both queues. */
static uint32_t tenant_waiting(const tenant_t *t, int c)
{
    return t->waiting[c][0].n + t->waiting[c][1].n;
}

/* Tenant ti joins (or leaves) class c's list of tenants with waiting requests. */
static void active_join(kvc_sched_t *s, uint32_t ti, int c)
{
    tenant_t *t = &s->tenants[ti];
    t->prev[c] = KVC_NONE;
    t->next[c] = s->active[c];
    if (s->active[c] != KVC_NONE) s->tenants[s->active[c]].prev[c] = ti;
    s->active[c] = ti;
}

static void active_leave(kvc_sched_t *s, uint32_t ti, int c)
{
    tenant_t *t = &s->tenants[ti];
    if (t->prev[c] != KVC_NONE)
        s->tenants[t->prev[c]].next[c] = t->next[c];
    else
        s->active[c] = t->next[c];
    if (t->next[c] != KVC_NONE) s->tenants[t->next[c]].prev[c] = t->prev[c];
    t->prev[c] = t->next[c] = KVC_NONE;
}

static void queue_link(kvc_sched_t *s, uint32_t slot, bool front)
{
    req_t *r = &s->reqs[slot];
    queue_t *q = queue_of(s, r);
    if (!tenant_waiting(&s->tenants[r->tenant], r->priority))
        active_join(s, r->tenant, r->priority);
    if (front) {
        r->prev = KVC_NONE;
        r->next = q->head;
        if (q->head != KVC_NONE) s->reqs[q->head].prev = slot;
        q->head = slot;
        if (q->tail == KVC_NONE) q->tail = slot;
    } else {
        r->next = KVC_NONE;
        r->prev = q->tail;
        if (q->tail != KVC_NONE) s->reqs[q->tail].next = slot;
        q->tail = slot;
        if (q->head == KVC_NONE) q->head = slot;
    }
    q->n++;
}

static void queue_unlink(kvc_sched_t *s, uint32_t slot)
{
    req_t *r = &s->reqs[slot];
    queue_t *q = queue_of(s, r);
    if (r->prev != KVC_NONE)
        s->reqs[r->prev].next = r->next;
    else
        q->head = r->next;
    if (r->next != KVC_NONE)
        s->reqs[r->next].prev = r->prev;
    else
        q->tail = r->prev;
    r->prev = r->next = KVC_NONE;
    q->n--;
    if (!tenant_waiting(&s->tenants[r->tenant], r->priority))
        active_leave(s, r->tenant, r->priority);
}

/* Insert into a list sorted by (priority, arrival); stable for equal keys.  The room was
 * reserved when the request was added. */
static void sorted_insert(kvc_sched_t *s, idlist_t *l, uint32_t slot)
{
    KVC_ASSERT(l->n < l->cap);
    uint32_t at = l->n;
    while (at > 0 && kvc__sched_before(&s->reqs[slot], &s->reqs[l->v[at - 1]])) at--;
    memmove(l->v + at + 1, l->v + at, (l->n - at) * sizeof(uint32_t));
    l->v[at] = slot;
    l->n++;
}

static void list_remove(idlist_t *l, uint32_t slot)
{
    for (uint32_t i = 0; i < l->n; i++)
        if (l->v[i] == slot) {
            memmove(l->v + i, l->v + i + 1, (l->n - i - 1) * sizeof(uint32_t));
            l->n--;
            return;
        }
    KVC_ASSERT(!"a request is missing from the list its state says");
}

void kvc__sched_set_state(kvc_sched_t *s, uint32_t slot, int to, bool front)
{
    req_t *r = &s->reqs[slot];
    switch (r->state) { /* leave */
    case R_WAITING:
        queue_unlink(s, slot);
        s->class_waiting[r->priority]--;
        break;
    case R_RUNNING:
        list_remove(&s->running, slot);
        s->class_running[r->priority]--;
        s->tenants[r->tenant].running--;
        break;
    case R_SWAPPED:
        list_remove(&s->swapped, slot);
        break;
    default: /* R_FREE: the caller took it off the free list; R_DONE: its account was taken */
        break;
    }
    s->n_state[r->state]--;
    r->state = (uint8_t)to;
    s->n_state[to]++;
    switch (to) { /* enter */
    case R_WAITING:
        queue_link(s, slot, front);
        s->class_waiting[r->priority]++;
        break;
    case R_RUNNING:
        sorted_insert(s, &s->running, slot);
        s->class_running[r->priority]++;
        s->tenants[r->tenant].running++;
        break;
    case R_SWAPPED:
        sorted_insert(s, &s->swapped, slot);
        break;
    case R_FREE: /* a new generation; the slot goes on the free list */
        if (++r->gen == 0) r->gen = 1;
        r->next = s->free_head;
        s->free_head = slot;
        break;
    default:
        break;
    }
}

/* ---- creation ---------------------------------------------------------------------------- */
kvc_sched_params_t kvc_sched_params_default(void)
{
    return (kvc_sched_params_t){.max_num_seqs = 256,
                                .max_num_batched_tokens = 8192,
                                .expected_margin = 0.2,
                                .n_tenants = KVC_SCHED_DEFAULT_TENANTS};
}

static bool share_ok(double x)
{
    return x >= 0 && x <= 1; /* false for NaN */
}

int kvc_sched_create(kvc_seqs_t *seqs, const kvc_sched_params_t *params, kvc_sched_t **out)
{
    if (!out) return KVC_EINVAL;
    *out = NULL;
    if (!seqs || !params) return KVC_EINVAL;
    const kvc_sched_params_t *p = params;
    if (p->max_num_seqs == 0 || p->max_num_batched_tokens == 0 ||
        (unsigned)p->admission >= KVC_ADMIT__COUNT ||
        (unsigned)p->preemption >= KVC_PREEMPT__COUNT || !share_ok(p->tenant_kv_share) ||
        !share_ok(p->long_kv_cap) || !(p->expected_margin >= 0) || !isfinite(p->expected_margin) ||
        p->spec_tokens > 64 || p->n_tenants == 0 || p->n_tenants > KVC_SCHED_MAX_TENANTS)
        return KVC_EINVAL;
    for (int c = 0; c < KVC_MAX_CLASSES; c++)
        if (!share_ok(p->class_kv_cap[c])) return KVC_EINVAL;
    kvc_sched_t *s = kvc_calloc(&p->allocator, 1, sizeof *s, 0);
    if (!s) return KVC_ENOMEM;
    s->p = *p;
    s->tenants = kvc_alloc(&p->allocator, (size_t)p->n_tenants * sizeof(tenant_t), 0);
    s->chk = kvc_alloc(&p->allocator, (size_t)p->n_tenants * 2 * sizeof(uint32_t), 0);
    if (p->spec_tokens)
        s->drafts = kvc_alloc(&p->allocator, p->spec_tokens * sizeof(kvc_token_t), 0);
    if (!s->tenants || !s->chk || (p->spec_tokens && !s->drafts)) {
        kvc_free(&p->allocator, s->tenants);
        kvc_free(&p->allocator, s->chk);
        kvc_free(&p->allocator, s->drafts);
        kvc_free(&p->allocator, s);
        return KVC_ENOMEM;
    }
    if (!s->p.victim) s->p.victim = kvc_victim_policy(KVC_VICTIM_LATEST);
    s->admit = &kvc__admit_policies[p->admission];
    s->pre = &kvc__preempt_policies[p->preemption];
    s->seqs = seqs;
    s->pool = kvc_seqs_pool(seqs);
    s->bs = kvc_pool_block_size(s->pool);
    s->pool_blocks = kvc_pool_n_blocks(s->pool);
    s->n_groups = kvc_seqs_n_groups(seqs);
    s->sliding = kvc_seqs_has_sliding(seqs);
    s->free_head = KVC_NONE;
    for (uint32_t t = 0; t < p->n_tenants; t++) {
        tenant_t *tn = &s->tenants[t];
        *tn = (tenant_t){0};
        for (int c = 0; c < KVC_MAX_CLASSES; c++) {
            tn->prev[c] = tn->next[c] = KVC_NONE;
            for (int l = 0; l < 2; l++)
                tn->waiting[c][l] = (queue_t){.head = KVC_NONE, .tail = KVC_NONE};
        }
    }
    for (int c = 0; c < KVC_MAX_CLASSES; c++) s->active[c] = KVC_NONE;
    *out = s;
    return 0;
}

void kvc_sched_destroy(kvc_sched_t *s)
{
    if (!s) return;
    const kvc_allocator_t a = s->p.allocator;
    for (uint32_t i = 0; i < s->n_slots; i++)
        if (s->reqs[i].has_seq) (void)kvc_seq_destroy(s->seqs, s->reqs[i].seq);
    kvc_free(&a, s->reqs);
    kvc_free(&a, s->running.v);
    kvc_free(&a, s->swapped.v);
    kvc_free(&a, s->entries);
    kvc_free(&a, s->cands);
    kvc_free(&a, s->done[0]);
    kvc_free(&a, s->done[1]);
    kvc_free(&a, s->done_retired);
    kvc_free(&a, s->drafts);
    kvc_free(&a, s->tenants);
    kvc_free(&a, s->chk);
    kvc_free(&a, s->trace);
    kvc_free(&a, s);
}

/* ---- adding ------------------------------------------------------------------------------- */
/* Room for `n` live requests in everything a request may later need.  A partial success only
 * grows capacities, which nobody sees. */
static int reserve(kvc_sched_t *s, uint32_t n)
{
    size_t per_step = KVC_MIN(n, s->p.max_num_seqs); /* running, and so planned, at once */
    int rc = 0;
    if (s->free_head == KVC_NONE)
        rc = grow(s, (void **)&s->reqs, sizeof(req_t), &s->reqs_cap, (size_t)s->n_slots + 1);
    if (!rc)
        rc = grow(s, (void **)&s->done[s->cur], sizeof(kvc_sched_done_t), &s->done_cap[s->cur], n);
    if (!rc && n > s->done_cap[s->cur ^ 1]) {
        /* The other buffer holds the accounts the last kvc_sched_take_finished handed out,
         * borrowed until the next take: its replacement is new, and it is freed then. */
        size_t c = s->done_cap[s->cur ^ 1] ? s->done_cap[s->cur ^ 1] : 16;
        while (c < n) c *= 2;
        kvc_sched_done_t *nb = kvc_alloc(&s->p.allocator, c * sizeof *nb, 0);
        if (!nb) return KVC_ENOMEM;
        if (!s->done_retired)
            s->done_retired = s->done[s->cur ^ 1];
        else /* grown twice since the last take: this one was never handed out */
            kvc_free(&s->p.allocator, s->done[s->cur ^ 1]);
        s->done[s->cur ^ 1] = nb;
        s->done_cap[s->cur ^ 1] = c;
    }
    if (!rc) rc = grow(s, (void **)&s->running.v, sizeof(uint32_t), &s->running.cap, per_step);
    if (!rc) rc = grow(s, (void **)&s->swapped.v, sizeof(uint32_t), &s->swapped.cap, n);
    if (!rc)
        rc = grow(s, (void **)&s->entries, sizeof(kvc_sched_entry_t), &s->entries_cap, per_step);
    if (!rc) rc = grow(s, (void **)&s->cands, sizeof(kvc_sched_cand_t), &s->cands_cap, per_step);
    return rc;
}

static uint32_t take_slot(kvc_sched_t *s)
{
    uint32_t slot = s->free_head;
    if (slot != KVC_NONE) {
        s->free_head = s->reqs[slot].next;
        return slot;
    }
    slot = s->n_slots++;
    s->reqs[slot] = (req_t){.gen = 1, .state = R_FREE};
    s->n_state[R_FREE]++;
    return slot;
}

int kvc_sched_add(kvc_sched_t *s, const kvc_sched_req_t *q, double now, kvc_req_id_t *id)
{
    if (!s || !q || !id || !q->prompt || q->n_prompt == 0 || q->max_output == 0 ||
        q->priority >= KVC_MAX_CLASSES || q->tenant >= s->p.n_tenants || !isfinite(now))
        return KVC_EINVAL;
    /* Could it ever run?  Its prompt and first output must fit the pool and every cap. */
    uint64_t need = kvc__sched_blocks_for(s, (uint64_t)q->n_prompt + 1);
    bool is_long =
        s->p.long_threshold && (uint64_t)q->n_prompt + q->max_output >= s->p.long_threshold;
    uint32_t class_cap = kvc__sched_cap_blocks(s, s->p.class_kv_cap[q->priority]);
    uint32_t tenant_cap = kvc__sched_cap_blocks(s, s->p.tenant_kv_share);
    uint32_t long_cap = kvc__sched_cap_blocks(s, s->p.long_kv_cap);
    if (need > s->pool_blocks || need > class_cap || need > tenant_cap ||
        (is_long && need > long_cap))
        return KVC_ERANGE;
    if (s->admit->reserves_max &&
        kvc__sched_blocks_for(s, (uint64_t)q->n_prompt + q->max_output) > s->pool_blocks)
        return KVC_ERANGE;
    /* Like an engine's max_model_len: a request never grows past what the pool (and its caps)
     * can hold, or it would preempt itself forever.  Its output is capped there ("length"). */
    uint32_t room = KVC_MIN(s->pool_blocks, KVC_MIN(class_cap, tenant_cap));
    if (is_long) room = KVC_MIN(room, long_cap);
    uint64_t max_tokens = (uint64_t)(room / s->n_groups) * s->bs; /* > n_prompt: need fits */
    uint32_t max_output = (uint32_t)KVC_MIN((uint64_t)q->max_output, max_tokens - q->n_prompt);
    if (n_used(s) >= UINT32_MAX - 1) return KVC_EOVERFLOW; /* slots are 32-bit, KVC_NONE apart */
    int rc = reserve(s, n_used(s) + 1);
    if (rc) return rc;
    uint32_t slot = take_slot(s);
    req_t *r = &s->reqs[slot];
    *r = (req_t){.gen = r->gen,
                 .state = R_FREE,
                 .prompt = q->prompt,
                 .ns = q->ns ? *q->ns : (kvc_namespace_t){0},
                 .tag = q->tag,
                 .serial = s->n_serial++,
                 .arrival = now,
                 .first_token = -1,
                 .n_prompt = q->n_prompt,
                 .max_output = max_output,
                 .priority = (uint8_t)q->priority,
                 .tenant = q->tenant,
                 .is_long = is_long};
    kvc__sched_set_state(s, slot, R_WAITING, false);
    note_time(s, now);
    s->st.n_added++;
    *id = kvc__sched_id(s, slot);
    return 0;
}

/* ---- finishing ------------------------------------------------------------------------------ */
void kvc__sched_finish(kvc_sched_t *s, uint32_t slot, double now, bool aborted, int error)
{
    req_t *r = &s->reqs[slot];
    KVC_ASSERT(s->n_done < s->done_cap[s->cur]); /* reserved at kvc_sched_add */
    r->done_at = s->n_done;
    s->done[s->cur][s->n_done++] = (kvc_sched_done_t){.id = kvc__sched_id(s, slot),
                                                      .tag = r->tag,
                                                      .priority = r->priority,
                                                      .tenant = r->tenant,
                                                      .arrival_s = r->arrival,
                                                      .first_token_s = r->first_token,
                                                      .finish_s = now,
                                                      .n_prompt = r->n_prompt,
                                                      .n_output = r->n_output,
                                                      .n_hit_tokens = r->n_hit,
                                                      .n_resume_hit_tokens = r->n_resume_hit,
                                                      .n_preemptions = r->n_preempt,
                                                      .recomputed_tokens = r->recomputed,
                                                      .n_accepted = r->n_accepted,
                                                      .aborted = aborted,
                                                      .error = error};
    if (r->has_seq) {
        (void)kvc_seq_destroy(s->seqs, r->seq); /* our handle is live: cannot fail */
        r->has_seq = false;
    }
    kvc__sched_account(s, r);
    r->planned = false;
    kvc__sched_set_state(s, slot, R_DONE, false);
    if (error) s->st.n_errors++;
}

bool kvc__sched_reset(kvc_sched_t *s, uint32_t slot)
{
    req_t *r = &s->reqs[slot];
    int rc = kvc_seq_reset(s->seqs, r->seq);
    if (!rc) {
        kvc__sched_account(s, r);
        return true;
    }
    /* The scheduler launches no seq steps, so this is the seq table's allocator: the request
     * cannot go on without its tokens' hashes; end it rather than leave it half reset. */
    TRACE(s, "  r%llu ends: its sequence cannot be reset (%s)", (unsigned long long)r->serial,
          kvc_strerror(rc));
    kvc__sched_finish(s, slot, s->latest, false, rc);
    return false;
}

int kvc_sched_abort(kvc_sched_t *s, kvc_req_id_t id)
{
    if (!s) return KVC_EINVAL;
    uint32_t slot;
    req_t *r = lookup(s, id, &slot);
    if (!r || r->state == R_DONE) return KVC_ESTALE;
    if (r->planned) { /* in the open plan: finish at completion */
        r->aborted = true;
        return 0;
    }
    kvc__sched_finish(s, slot, s->latest, true, 0);
    return 0;
}

/* ---- completion ------------------------------------------------------------------------------ */
/* A child of running request `parent` (see kvc_sched_result_t.n_forks): a new running
 * request whose sequence forks the parent's and continues with `token`.  *id stays 0 when it
 * cannot be made; nothing of the parent changes either way. */
static void fork_child(kvc_sched_t *s, uint32_t parent, kvc_token_t token, uint64_t tag, double now,
                       kvc_req_id_t *id)
{
    if (s->running.n >= s->p.max_num_seqs || n_used(s) >= UINT32_MAX - 1) return;
    if (reserve(s, n_used(s) + 1)) return;
    kvc_seq_t seq;
    if (kvc_seq_fork(s->seqs, s->reqs[parent].seq, &seq)) return;
    if (kvc_seq_append(s->seqs, seq, &token, 1)) {
        (void)kvc_seq_destroy(s->seqs, seq);
        return;
    }
    const uint32_t slot = take_slot(s);
    req_t *r = &s->reqs[slot];
    const req_t *p = &s->reqs[parent];
    *r = (req_t){.gen = r->gen,
                 .state = R_FREE,
                 .seq = seq,
                 .ns = p->ns,
                 .tag = tag,
                 .serial = s->n_serial++,
                 .arrival = p->arrival,
                 .first_token = p->first_token,
                 .n_prompt = p->n_prompt,
                 .max_output = p->max_output,
                 .n_output = p->n_output,
                 .high_water = p->high_water,
                 .priority = p->priority,
                 .tenant = p->tenant,
                 .is_long = p->is_long,
                 .has_seq = true,
                 .admitted_once = true};
    kvc__sched_set_state(s, slot, R_RUNNING, false);
    kvc__sched_account(s, r);
    s->st.n_added++;
    *id = kvc__sched_id(s, slot);
    TRACE(s, "  r%llu forks r%llu", (unsigned long long)p->serial, (unsigned long long)r->serial);
    if (r->n_output >= r->max_output) kvc__sched_finish(s, slot, now, false, 0);
}

int kvc_sched_complete(kvc_sched_t *s, const kvc_sched_result_t *res, uint32_t n, double now)
{
    if (!s || (n && !res) || !isfinite(now)) return KVC_EINVAL;
    if (!s->plan_open) return n ? KVC_EINVAL : 0;
    if (n != s->plan.n_entries) return KVC_EINVAL;
    for (uint32_t i = 0; i < n; i++) {
        if (res[i].id != s->entries[i].id) {
            const req_t *r = lookup(s, res[i].id, NULL);
            return r && r->state != R_DONE ? KVC_EINVAL : KVC_ESTALE;
        }
        if (res[i].n_accepted > s->entries[i].n_drafts) return KVC_EINVAL;
        if (res[i].n_forks && (!s->entries[i].samples || s->entries[i].n_drafts ||
                               !res[i].fork_tokens || !res[i].fork_tags || !res[i].fork_ids))
            return KVC_EINVAL;
    }
    note_time(s, now);
    for (uint32_t i = 0; i < n; i++) {
        const kvc_sched_entry_t *e = &s->entries[i];
        uint32_t slot = (uint32_t)e->id;
        req_t *r = &s->reqs[slot];
        r->planned = false;
        int rc = kvc_seq_complete(s->seqs, r->seq, e->n_tokens);
        if (!rc && e->n_drafts) rc = kvc_seq_accept(s->seqs, r->seq, res[i].n_accepted);
        if (rc) { /* the seq table's allocator failed: this request cannot go on */
            kvc__sched_finish(s, slot, now, r->aborted, rc);
            continue;
        }
        uint32_t real = e->n_tokens - e->n_drafts + res[i].n_accepted;
        /* computing below the high-water mark is redoing lost work */
        uint32_t end = e->first_pos + real;
        if (e->first_pos < r->high_water) {
            uint32_t redo = KVC_MIN(end, r->high_water) - e->first_pos;
            r->recomputed += redo;
            s->st.recomputed_tokens += redo;
        }
        r->high_water = KVC_MAX(r->high_water, end);
        s->tenants[r->tenant].computed += e->n_tokens;
        s->computed_all += e->n_tokens;
        r->n_accepted += res[i].n_accepted;
        if (e->samples) {
            if (r->first_token < 0) r->first_token = now;
            r->n_output += 1 + res[i].n_accepted;
        }
        /* forks first: the sequence is fully computed and its token not yet appended */
        for (uint32_t k = 0; k < res[i].n_forks; k++) {
            res[i].fork_ids[k] = 0;
            if (r->aborted) continue;
            fork_child(s, slot, res[i].fork_tokens[k], res[i].fork_tags[k], now,
                       &res[i].fork_ids[k]);
            r = &s->reqs[slot]; /* fork_child may have grown the request table */
        }
        if (res[i].n_forks) { /* ... and the entries: the plan the caller holds follows them */
            e = &s->entries[i];
            s->plan.entries = s->entries;
        }
        bool done = r->aborted || (e->samples && (res[i].finished || r->n_output >= r->max_output));
        if (done) {
            kvc__sched_finish(s, slot, now, r->aborted, 0);
            continue;
        }
        if (e->samples && (rc = kvc_seq_append(s->seqs, r->seq, &res[i].token, 1))) {
            kvc__sched_finish(s, slot, now, false, rc);
            continue;
        }
        /* blocks change here only by rollback or by sliding-window release */
        if (e->n_drafts || s->sliding) kvc__sched_account(s, r);
    }
    s->plan_open = false; /* the plan stays readable until the next step */
    return 0;
}

int kvc_sched_take_finished(kvc_sched_t *s, const kvc_sched_done_t **done, uint32_t *n)
{
    if (!s || !done || !n) return KVC_EINVAL;
    const kvc_sched_done_t *d = s->done[s->cur];
    *done = d;
    *n = s->n_done;
    for (uint32_t i = 0; i < s->n_done; i++)
        kvc__sched_set_state(s, (uint32_t)d[i].id, R_FREE, false);
    s->cur ^= 1; /* the next accounts go to the other buffer: this one stays readable */
    s->n_done = 0;
    kvc_free(&s->p.allocator, s->done_retired); /* what the last call handed out */
    s->done_retired = NULL;
    return 0;
}

void kvc_sched_stats(const kvc_sched_t *s, kvc_sched_stats_t *out)
{
    if (!out) return;
    if (!s) {
        *out = (kvc_sched_stats_t){0};
        return;
    }
    *out = s->st;
    out->n_waiting = s->n_state[R_WAITING];
    out->n_running = s->n_state[R_RUNNING];
    out->n_swapped = s->n_state[R_SWAPPED];
    out->n_finished = s->n_state[R_DONE];
    out->blocks_used = s->pool_blocks - kvc_pool_n_free(s->pool);
}

uint32_t kvc_sched_n_tenants(const kvc_sched_t *s)
{
    return s ? s->p.n_tenants : 0;
}

int kvc_sched_tenant_stats(const kvc_sched_t *s, uint32_t tenant, kvc_sched_tenant_stats_t *out)
{
    if (!s || !out || tenant >= s->p.n_tenants) return KVC_EINVAL;
    const tenant_t *t = &s->tenants[tenant];
    uint32_t waiting = 0;
    for (int c = 0; c < KVC_MAX_CLASSES; c++) waiting += tenant_waiting(t, c);
    *out = (kvc_sched_tenant_stats_t){.n_waiting = waiting,
                                      .n_running = t->running,
                                      .blocks = t->blocks,
                                      .kv_token_s = kvc__sched_tenant_kv(s, t),
                                      .computed = t->computed};
    return 0;
}

const char *kvc_sched_trace(const kvc_sched_t *s)
{
    return s && s->trace ? s->trace : "";
}

/* ---- the checker ------------------------------------------------------------------------------
 */
#define fail(...) kvc__msgf(KVC_ECORRUPT, msg, cap, __VA_ARGS__)

/* A list sorted by (priority, arrival) holding exactly the requests in `state`, each once (a
 * duplicate has the key of its twin, so it can only sit in the same run of equal keys). */
static int check_list(const kvc_sched_t *s, const idlist_t *l, int state, const char *name,
                      char *msg, size_t cap)
{
    if (l->n != s->n_state[state])
        return fail("%s list: %u entries, %u requests in that state", name, l->n,
                    s->n_state[state]);
    for (uint32_t i = 0; i < l->n; i++) {
        uint32_t v = l->v[i];
        if (v >= s->n_slots || s->reqs[v].state != state)
            return fail("%s list: entry %u (slot %u) is not in that state", name, i, v);
        if (i && kvc__sched_before(&s->reqs[v], &s->reqs[l->v[i - 1]]))
            return fail("%s list out of order at %u", name, i);
        for (uint32_t j = i; j-- > 0 && !kvc__sched_before(&s->reqs[l->v[j]], &s->reqs[v]);)
            if (l->v[j] == v) return fail("%s list: slot %u twice", name, v);
    }
    return 0;
}

static int check_queues(const kvc_sched_t *s, char *msg, size_t cap)
{
    uint32_t total = 0;
    for (int c = 0; c < KVC_MAX_CLASSES; c++) {
        /* the active list holds exactly the tenants with waiting requests of this class */
        uint32_t n_active = 0, want = 0, prev = KVC_NONE;
        for (uint32_t t = s->active[c]; t != KVC_NONE; prev = t, t = s->tenants[t].next[c]) {
            if (t >= s->p.n_tenants || n_active++ > s->p.n_tenants)
                return fail("class %d: active tenant list broken", c);
            if (s->tenants[t].prev[c] != prev || !tenant_waiting(&s->tenants[t], c))
                return fail("class %d: tenant %u is listed active without waiting requests", c, t);
        }
        for (uint32_t t = 0; t < s->p.n_tenants; t++) want += tenant_waiting(&s->tenants[t], c) > 0;
        if (n_active != want)
            return fail("class %d: %u tenants listed active, %u have waiting requests", c, n_active,
                        want);
    }
    for (int c = 0; c < KVC_MAX_CLASSES; c++)
        for (uint32_t t = 0; t < s->p.n_tenants; t++)
            for (int l = 0; l < 2; l++) {
                const queue_t *q = &s->tenants[t].waiting[c][l];
                uint32_t n = 0, prev = KVC_NONE;
                for (uint32_t v = q->head; v != KVC_NONE; prev = v, v = s->reqs[v].next) {
                    if (v >= s->n_slots || n++ > s->n_slots)
                        return fail("queue %d/%u/%d: broken links", c, t, l);
                    const req_t *r = &s->reqs[v];
                    if (r->state != R_WAITING || r->priority != c || r->tenant != t ||
                        r->is_long != l || r->prev != prev)
                        return fail("queue %d/%u/%d: slot %u does not belong there", c, t, l, v);
                }
                if (n != q->n || q->tail != prev)
                    return fail("queue %d/%u/%d: %u linked, %u counted", c, t, l, n, q->n);
                total += n;
            }
    if (total != s->n_state[R_WAITING])
        return fail("%u requests queued, %u waiting", total, s->n_state[R_WAITING]);
    return 0;
}

int kvc_sched_check(const kvc_sched_t *s, char *msg, size_t cap)
{
    if (!s) return KVC_EINVAL;
    int rc = kvc_seqs_check(s->seqs, msg, cap);
    if (rc) return rc;
    /* per-tenant recounts in the scratch reserved at creation (the checker allocates nothing) */
    const uint32_t n_ten = s->p.n_tenants;
    uint32_t *ten = s->chk, *ten_run = s->chk + n_ten;
    memset(ten, 0, (size_t)n_ten * 2 * sizeof(uint32_t));
    uint32_t cls[KVC_MAX_CLASSES] = {0}, lng = 0;
    uint32_t n_state[R__COUNT] = {0}, cls_run[KVC_MAX_CLASSES] = {0},
             cls_wait[KVC_MAX_CLASSES] = {0}, n_planned = 0;
    for (uint32_t i = 0; i < s->n_slots; i++) {
        const req_t *r = &s->reqs[i];
        if (r->state >= R__COUNT || r->gen == 0) return fail("r%u: bad state or generation", i);
        n_state[r->state]++;
        if (r->state == R_FREE) {
            if (r->has_seq) return fail("slot %u: free but has a sequence", i);
            continue;
        }
        if (r->priority >= KVC_MAX_CLASSES || r->tenant >= n_ten)
            return fail("slot %u: class %u, tenant %u", i, r->priority, r->tenant);
        uint32_t b = kvc__sched_seq_blocks(s, r);
        if (b != r->blocks) return fail("slot %u: holds %u blocks, books say %u", i, b, r->blocks);
        cls[r->priority] += b;
        ten[r->tenant] += b;
        if (r->is_long) lng += b;
        if (r->planned) {
            n_planned++;
            if (!s->plan_open || r->state != R_RUNNING)
                return fail("slot %u: planned outside an open plan", i);
        }
        switch (r->state) {
        case R_RUNNING:
            cls_run[r->priority]++;
            ten_run[r->tenant]++;
            if (!r->has_seq || !kvc_seq_valid(s->seqs, r->seq))
                return fail("slot %u: running without a sequence", i);
            break;
        case R_WAITING:
            cls_wait[r->priority]++;
            if (b) return fail("slot %u: waiting but holds %u blocks", i, b);
            break;
        case R_SWAPPED:
            if (b) return fail("slot %u: swapped but holds %u blocks", i, b);
            break;
        default:
            if (r->has_seq) return fail("slot %u: done but has a sequence", i);
        }
    }
    for (int k = 0; k < R__COUNT; k++)
        if (n_state[k] != s->n_state[k])
            return fail("state %d: %u requests, books say %u", k, n_state[k], s->n_state[k]);
    for (int c = 0; c < KVC_MAX_CLASSES; c++)
        if (cls_run[c] != s->class_running[c] || cls_wait[c] != s->class_waiting[c])
            return fail("class %d: %u running, %u waiting; books say %u, %u", c, cls_run[c],
                        cls_wait[c], s->class_running[c], s->class_waiting[c]);
    for (uint32_t t = 0; t < n_ten; t++)
        if (ten_run[t] != s->tenants[t].running)
            return fail("tenant %u: %u running, books say %u", t, ten_run[t],
                        s->tenants[t].running);
    /* the free list holds exactly the free slots */
    uint32_t n_free = 0;
    for (uint32_t v = s->free_head; v != KVC_NONE; v = s->reqs[v].next)
        if (v >= s->n_slots || s->reqs[v].state != R_FREE || ++n_free > s->n_slots)
            return fail("free list: slot %u is not free", v);
    if (n_free != n_state[R_FREE])
        return fail("free list: %u slots, %u free", n_free, n_state[R_FREE]);
    if ((rc = check_queues(s, msg, cap)) ||
        (rc = check_list(s, &s->running, R_RUNNING, "running", msg, cap)) ||
        (rc = check_list(s, &s->swapped, R_SWAPPED, "swapped", msg, cap)))
        return rc;
    /* every finished request has its account in the buffer, once */
    if (s->n_done != n_state[R_DONE])
        return fail("%u accounts, %u finished requests", s->n_done, n_state[R_DONE]);
    for (uint32_t i = 0; i < s->n_slots; i++) {
        const req_t *r = &s->reqs[i];
        if (r->state == R_DONE &&
            (r->done_at >= s->n_done || s->done[s->cur][r->done_at].id != kvc__sched_id(s, i)))
            return fail("slot %u: finished, its account is not where it says", i);
    }
    /* the plan */
    if (s->plan_open) {
        if (n_planned != s->plan.n_entries)
            return fail("%u planned requests, %u plan entries", n_planned, s->plan.n_entries);
        for (uint32_t i = 0; i < s->plan.n_entries; i++) {
            const req_t *r = lookup(s, s->entries[i].id, NULL);
            if (!r || !r->planned) return fail("plan entry %u names no planned request", i);
        }
    } else if (n_planned) {
        return fail("%u requests planned without an open plan", n_planned);
    }
    /* the room reserved at kvc_sched_add covers every live request */
    uint32_t live = s->n_slots - n_state[R_FREE];
    size_t per_step = KVC_MIN(live, s->p.max_num_seqs);
    if (s->reqs_cap < s->n_slots || s->done_cap[0] < live || s->done_cap[1] < live ||
        s->running.cap < per_step || s->swapped.cap < live || s->entries_cap < per_step ||
        s->cands_cap < per_step)
        return fail("%u live requests and less room reserved", live);
    /* blocks */
    for (int c = 0; c < KVC_MAX_CLASSES; c++)
        if (cls[c] != s->st.class_blocks[c])
            return fail("class %d: %u blocks, books say %u", c, cls[c], s->st.class_blocks[c]);
    uint64_t all = 0, computed = 0;
    for (uint32_t t = 0; t < n_ten; t++) {
        if (ten[t] != s->tenants[t].blocks)
            return fail("tenant %u: %u blocks, books say %u", t, ten[t], s->tenants[t].blocks);
        all += ten[t];
        computed += s->tenants[t].computed;
    }
    if (all != s->blocks_all || computed != s->computed_all)
        return fail("tenants: %llu blocks and %llu computed, books say %u and %llu",
                    (unsigned long long)all, (unsigned long long)computed, s->blocks_all,
                    (unsigned long long)s->computed_all);
    if (lng != s->long_blocks)
        return fail("long requests: %u blocks, books say %u", lng, s->long_blocks);
    for (int c = 0; c < KVC_MAX_CLASSES; c++)
        if (cls[c] > kvc__sched_cap_blocks(s, s->p.class_kv_cap[c]))
            return fail("class %d holds %u blocks over its cap", c, cls[c]);
    for (uint32_t t = 0; t < n_ten; t++)
        if (ten[t] > kvc__sched_cap_blocks(s, s->p.tenant_kv_share))
            return fail("tenant %u holds %u blocks over its quota", t, ten[t]);
    if (lng > kvc__sched_cap_blocks(s, s->p.long_kv_cap))
        return fail("long requests hold %u blocks over their cap", lng);
    if (s->running.n > s->p.max_num_seqs) return fail("%u running > max_num_seqs", s->running.n);
    return 0;
}
