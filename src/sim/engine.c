/* engine.c - the simulator: the real pool (metadata only), prefix cache,
 * sequences and scheduler, driven in virtual time by a cost model of the GPU
 * in place of the forward pass.  Nothing here re-implements allocation or
 * scheduling; it only decides how long each planned step takes and what the
 * "model" samples (the workload's own output tokens). */
#include "kvcache/sim.h"

#include "util/msg.h"

#include <math.h>
#include <string.h>

/* ---- the cost model ---------------------------------------------------------------- */
int kvc_sim_cost_model(const kvc_plan_model_t *m, const kvc_plan_gpu_t *gpu,
                       const kvc_plan_params_t *p, const kvc_plan_result_t *r,
                       double step_overhead_s, double allreduce_latency_s,
                       kvc_sim_cost_model_t *out)
{
    if (!m || !gpu || !p || !r || !out || step_overhead_s < 0 || allreduce_latency_s < 0)
        return KVC_EINVAL;
    const double tp = p->tp, pp = p->pp, parts = tp * pp;
    const double mfu = p->mfu > 0 ? p->mfu : 1.0, mbu = p->mbu > 0 ? p->mbu : 1.0;
    const kvc_plan_param_count_t *c = &r->counts;
    /* Linear layers: every active parameter but the embedding lookup is one multiply-add. */
    double linear_params = (double)(c->active - c->embedding);
    /* Attention per (query, key) pair and layer: QK^T over the key width, PV over the value width,
     * 2 FLOPs a multiply-add, for every query head.  MLA (absorbed): keys are the latent plus the
     * rope part, values the latent. */
    double d_qk = m->mla ? (double)m->kv_lora_rank + m->qk_rope_head_dim : m->head_dim;
    double d_v = m->mla ? (double)m->kv_lora_rank : (m->v_head_dim ? m->v_head_dim : m->head_dim);
    double heads_per_gpu = ceil((double)m->n_heads / tp);
    double wbytes = kvc_plan_dtype_bits(p->weight_dtype) / 8.0;
    double expert_bytes = m->n_experts ? (double)c->experts_routed * wbytes / parts : 0;
    *out = (kvc_sim_cost_model_t){
        .flops_per_s = r->peak_flops * mfu,
        .attn_flops_per_s = gpu->bf16_flops * mfu,
        .bytes_per_s = gpu->hbm_bytes_per_s * mbu,
        .linear_flops_per_token = 2.0 * linear_params / parts,
        .attn_flops_per_pair = 2.0 * (d_qk + d_v) * heads_per_gpu * r->layers_per_gpu,
        .dense_weight_bytes = KVC_MAX(0.0, (double)r->weight_bytes_per_gpu - expert_bytes),
        .expert_weight_bytes = expert_bytes,
        .experts_per_token_share = m->n_experts ? (double)m->n_experts_active / m->n_experts : 0,
        .kv_bytes_per_token = (double)r->kv_bytes_per_token_per_gpu,
        .comm_bytes_per_token = 2.0 * m->hidden_size, /* bf16 activations */
        .n_allreduce = p->tp > 1 ? 2 * r->layers_per_gpu : 0,
        .link_bytes_per_s = gpu->interconnect_bytes_per_s > 0 ? gpu->interconnect_bytes_per_s
                                                              : gpu->pcie_bytes_per_s,
        .allreduce_latency_s = allreduce_latency_s,
        .tp = p->tp,
        .pp = p->pp,
        .step_overhead_s = step_overhead_s,
        .host_link_bytes_per_s = gpu->pcie_bytes_per_s > 0 ? gpu->pcie_bytes_per_s : 32e9,
    };
    return out->flops_per_s > 0 && out->bytes_per_s > 0 ? 0 : KVC_EINVAL;
}

double kvc_sim_step_time(const kvc_sim_cost_model_t *cm, const kvc_sched_plan_t *plan,
                         kvc_sim_step_cost_t *detail)
{
    double tokens = 0, pairs = 0, context = 0;
    for (uint32_t i = 0; i < plan->n_entries; i++) {
        const kvc_sched_entry_t *e = &plan->entries[i];
        double n = e->n_tokens, first = e->first_pos;
        tokens += n;
        pairs += n * first + n * (n + 1) / 2; /* query i sees first + i + 1 keys (causal) */
        context += first + n;
    }
    kvc_sim_step_cost_t d = {0};
    if (tokens > 0) {
        d.linear_flops = cm->linear_flops_per_token * tokens;
        d.attn_flops = cm->attn_flops_per_pair * pairs;
        double experts_read =
            cm->expert_weight_bytes > 0
                ? cm->expert_weight_bytes * (1.0 - pow(1.0 - cm->experts_per_token_share, tokens))
                : 0;
        d.bytes_read =
            cm->dense_weight_bytes + experts_read + cm->kv_bytes_per_token * (context + tokens);
        d.compute_s = d.linear_flops / cm->flops_per_s + d.attn_flops / cm->attn_flops_per_s;
        d.memory_s = d.bytes_read / cm->bytes_per_s;
        if (cm->n_allreduce && cm->link_bytes_per_s > 0)
            d.comm_s = cm->n_allreduce * (cm->allreduce_latency_s +
                                          2.0 * (cm->tp - 1) / cm->tp * cm->comm_bytes_per_token *
                                              tokens / cm->link_bytes_per_s);
    }
    d.swap_s = (double)(plan->swap_out_bytes + plan->swap_in_bytes) / cm->host_link_bytes_per_s;
    d.total_s =
        cm->pp * (KVC_MAX(d.compute_s, d.memory_s) + d.comm_s) + cm->step_overhead_s + d.swap_s;
    if (detail) *detail = d;
    return d.total_s;
}

/* ---- the run ----------------------------------------------------------------------------- */
kvc_sim_config_t kvc_sim_config_default(void)
{
    kvc_sim_config_t c = {0};
    c.plan = kvc_plan_params_default();
    c.sched = kvc_sched_params_default();
    c.prefix_caching = true;
    c.seed = 1;
    c.step_overhead_s = 0.002;
    c.allreduce_latency_s = 8e-6;
    c.spec_acceptance = 0.7;
    return c;
}

typedef struct {
    double t;
    uint32_t idx; /* workload index */
} arrival_t;

/* A binary min-heap of arrivals by (time, index): deterministic order for ties. */
typedef struct {
    arrival_t *v;
    size_t n, cap;
} heap_t;

static bool arr_less(arrival_t a, arrival_t b)
{
    return a.t < b.t || (a.t == b.t && a.idx < b.idx);
}

static int heap_push(heap_t *h, arrival_t a)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? 2 * h->cap : 1024;
        arrival_t *v = kvc_alloc(NULL, cap * sizeof *v, 0);
        if (!v) return KVC_ENOMEM;
        if (h->n) memcpy(v, h->v, h->n * sizeof *v);
        kvc_free(NULL, h->v);
        h->v = v;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0 && arr_less(a, h->v[(i - 1) / 2])) {
        h->v[i] = h->v[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->v[i] = a;
    return 0;
}

static arrival_t heap_pop(heap_t *h)
{
    arrival_t top = h->v[0], last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        arrival_t mv = last;
        if (l < h->n && arr_less(h->v[l], mv)) m = l, mv = h->v[l];
        if (r < h->n && arr_less(h->v[r], mv)) m = r;
        if (m == i) break;
        h->v[i] = h->v[m];
        i = m;
    }
    if (h->n) h->v[i] = last;
    return top;
}

typedef struct {
    const kvc_sim_config_t *cfg;
    const kvc_workload_t *w;
    kvc_report_t *report;
    kvc_sim_result_t *res;
    kvc_sim_cost_model_t cost;
    uint32_t replica, n_replicas;
    uint32_t *produced;  /* per workload index: output tokens sampled */
    uint32_t *next_turn; /* per workload index: the next turn of its conversation, or KVC_NONE */
    kvc_token_t **owned; /* per workload index: assembled prompts (on-demand traces) */
    kvc_rng_t rng;
    uint64_t done_total, total;
} run_t;

static void draft_tokens(void *ctx, kvc_req_id_t id, uint64_t tag, uint32_t n, kvc_token_t *out)
{
    /* A drafter that proposes the tokens the model will sample; acceptance is drawn later. */
    (void)id;
    run_t *r = ctx;
    uint32_t wi = (uint32_t)tag;
    const kvc_sim_request_t *q = kvc_workload_request(r->w, wi);
    uint32_t k = r->produced[wi];
    for (uint32_t j = 0; j < n; j++)
        out[j] = k + j < q->n_output && q->output_tokens ? q->output_tokens[k + j] : 0;
}

/* Conversations: link each turn to the next one (by conversation id, in workload order). */
static int link_turns(run_t *r)
{
    size_t n = kvc_workload_size(r->w), cap = 16;
    while (cap < 2 * n) cap <<= 1;
    uint64_t *keys = kvc_calloc(NULL, cap, sizeof(uint64_t), 0);
    uint32_t *last = kvc_alloc(NULL, cap * sizeof(uint32_t), 0);
    if (!keys || !last) {
        kvc_free(NULL, keys);
        kvc_free(NULL, last);
        return KVC_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) r->next_turn[i] = KVC_NONE;
    for (size_t i = 0; i < n; i++) {
        const kvc_sim_request_t *q = kvc_workload_request(r->w, i);
        if (!q->conversation || i % r->n_replicas != r->replica) continue;
        size_t k = (size_t)(q->conversation * 0x9e3779b97f4a7c15ULL) & (cap - 1);
        while (keys[k] && keys[k] != q->conversation) k = (k + 1) & (cap - 1);
        if (keys[k]) r->next_turn[last[k]] = (uint32_t)i;
        keys[k] = q->conversation;
        last[k] = (uint32_t)i;
    }
    kvc_free(NULL, keys);
    kvc_free(NULL, last);
    return 0;
}

static bool has_predecessor(const run_t *r, size_t i)
{
    const kvc_sim_request_t *q = kvc_workload_request(r->w, i);
    return r->cfg->closed_loop && q->conversation && q->turn > 0;
}

static int run_replica(run_t *r, uint32_t num_blocks, uint32_t n_groups, const uint32_t *window,
                       char *err, size_t cap)
{
    const kvc_sim_config_t *cfg = r->cfg;
    const uint32_t bs = cfg->plan.block_size;
    kvc_pool_t *pool = NULL;
    kvc_prefix_t *pc = NULL;
    kvc_seqs_t *seqs = NULL;
    kvc_sched_t *s = NULL;
    heap_t heap = {0};
    int rc;
    kvc_pool_params_t pp = kvc_pool_params_default();
    pp.n_blocks = num_blocks;
    pp.block_size = bs;
    if ((rc = kvc_pool_create(&pp, &pool))) goto out;
    if (cfg->prefix_caching) {
        kvc_prefix_params_t cp = kvc_prefix_params_default();
        cp.hash_seed = cfg->seed ? cfg->seed : 1;
        cp.max_extra_keys = 0; /* workloads carry no multimodal inputs: save the metadata */
        memcpy(cp.group_window, window, sizeof cp.group_window);
        if ((rc = kvc_prefix_create(pool, &cp, &pc))) goto out;
    }
    kvc_seqs_params_t sp = kvc_seqs_params_default();
    sp.max_seqs = cfg->plan.max_num_seqs * 4 + 256;
    sp.n_groups = n_groups;
    memcpy(sp.window, window, sizeof sp.window);
    if ((rc = kvc_seqs_create(pool, pc, &sp, &seqs))) goto out;
    kvc_sched_params_t schp = cfg->sched;
    schp.max_num_seqs = cfg->plan.max_num_seqs;
    schp.max_num_batched_tokens = cfg->plan.max_num_batched_tokens;
    schp.block_bytes = (size_t)(r->cost.kv_bytes_per_token * bs);
    schp.draft = draft_tokens;
    schp.draft_ctx = r;
    schp.trace = cfg->trace != NULL;
    if ((rc = kvc_sched_create(seqs, &schp, &s))) {
        kvc__msgf(rc, err, cap, "scheduler parameters: %s", kvc_strerror(rc));
        goto out;
    }

    const size_t n = kvc_workload_size(r->w);
    for (size_t i = r->replica; i < n; i += r->n_replicas) {
        if (has_predecessor(r, i)) continue; /* released when its previous turn finishes */
        if ((rc = heap_push(&heap,
                            (arrival_t){kvc_workload_request(r->w, i)->arrival_s, (uint32_t)i})))
            goto out;
    }
    kvc_sched_result_t *results = NULL;
    size_t results_cap = 0;
    double now = 0;
    uint64_t stuck = 0, last_progress = 0;
    const bool sample = r->replica == 0;
    for (;;) {
        while (heap.n && heap.v[0].t <= now) {
            arrival_t a = heap_pop(&heap);
            const kvc_sim_request_t *q = kvc_workload_request(r->w, a.idx);
            const kvc_token_t *prompt = q->tokens;
            if (!prompt) { /* a trace kept with tokens on demand: assemble this prompt */
                r->owned[a.idx] = kvc_alloc(NULL, q->n_prompt * sizeof(kvc_token_t), 0);
                if (!r->owned[a.idx]) {
                    rc = KVC_ENOMEM;
                    goto out_results;
                }
                (void)kvc_workload_prompt(r->w, a.idx, r->owned[a.idx], q->n_prompt);
                prompt = r->owned[a.idx];
            }
            /* Like a server: a prompt at or over max_model_len is refused; outputs stop there. */
            uint64_t mml = r->res->planned.max_model_len;
            if (mml && q->n_prompt >= mml) {
                r->res->rejected++;
                continue;
            }
            uint32_t max_out = KVC_MAX(q->max_output, q->n_output);
            if (mml && (uint64_t)q->n_prompt + max_out > mml)
                max_out = (uint32_t)(mml - q->n_prompt);
            kvc_namespace_t ns = {0};
            if (cfg->tenant_salts &&
                (rc = kvc_namespace_set_salt(&ns, kvc_workload_tenant_name(r->w, q->tenant))))
                goto out_results;
            kvc_sched_req_t req = {.prompt = prompt,
                                   .n_prompt = q->n_prompt,
                                   .max_output = max_out,
                                   .priority = q->priority,
                                   .tenant = q->tenant,
                                   .ns = &ns,
                                   .tag = a.idx};
            kvc_req_id_t id;
            rc = kvc_sched_add(s, &req, a.t, &id);
            if (rc == KVC_ERANGE) { /* it can never fit the pool or its caps: refused, counted */
                if (cfg->trace)
                    fprintf(cfg->trace, "request %u (%u prompt tokens) refused: it can never fit\n",
                            a.idx, q->n_prompt);
                r->res->rejected++;
                rc = 0;
                continue;
            }
            if (rc) goto out_results;
        }
        const kvc_sched_plan_t *plan;
        if ((rc = kvc_sched_step(s, now, &plan))) goto out_results;
        if (cfg->trace) fputs(kvc_sched_trace(s), cfg->trace);
        if (plan->n_entries == 0) {
            kvc_sched_stats_t st;
            kvc_sched_stats(s, &st);
            bool busy = st.n_running || st.n_waiting || st.n_swapped;
            if (!busy && !heap.n) break;
            if (heap.n && (!busy || ++stuck > 2)) {
                now = KVC_MAX(now, heap.v[0].t);
                stuck = 0;
                continue;
            }
            if (!heap.n && ++stuck > 1000) {
                rc = kvc__msgf(KVC_EINVAL, err, cap,
                               "the simulation is stuck: %u requests wait and nothing can run",
                               st.n_waiting + st.n_swapped);
                goto out_results;
            }
            continue;
        }
        stuck = 0;
        double dt = kvc_sim_step_time(&r->cost, plan, NULL);
        now += dt;
        if (results_cap < plan->n_entries) {
            kvc_free(NULL, results);
            results_cap = plan->n_entries * 2;
            results = kvc_alloc(NULL, results_cap * sizeof *results, 0);
            if (!results) {
                rc = KVC_ENOMEM;
                goto out;
            }
        }
        uint32_t batch_tokens = 0;
        for (uint32_t i = 0; i < plan->n_entries; i++) {
            const kvc_sched_entry_t *e = &plan->entries[i];
            uint32_t wi = (uint32_t)e->tag;
            const kvc_sim_request_t *q = kvc_workload_request(r->w, wi);
            batch_tokens += e->n_tokens;
            results[i] = (kvc_sched_result_t){.id = e->id};
            if (!e->samples) continue;
            uint32_t k = r->produced[wi], a = 0;
            while (a < e->n_drafts && kvc_rng_double(&r->rng) < cfg->spec_acceptance) a++;
            if (k + 1 + a > q->n_output) a = q->n_output > k + 1 ? q->n_output - k - 1 : 0;
            uint32_t bonus = k + a;
            results[i].n_accepted = a;
            results[i].token =
                q->output_tokens && bonus < q->n_output ? q->output_tokens[bonus] : 0;
            r->produced[wi] = k + 1 + a;
            results[i].finished = r->produced[wi] >= q->n_output;
        }
        if ((rc = kvc_sched_complete(s, results, plan->n_entries, now))) goto out_results;
        if (cfg->check_every_step) {
            char msg[256];
            kvc_sched_stats_t cst;
            kvc_sched_stats(s, &cst);
            if (kvc_sched_check(s, msg, sizeof msg)) {
                rc = kvc__msgf(KVC_ECORRUPT, err, cap, "step %llu: %s",
                               (unsigned long long)r->res->steps, msg);
                goto out_results;
            }
            if (batch_tokens > cfg->plan.max_num_batched_tokens ||
                cst.n_running > cfg->plan.max_num_seqs) {
                rc = kvc__msgf(KVC_ECORRUPT, err, cap,
                               "step %llu: %u tokens, %u running: over the limits",
                               (unsigned long long)r->res->steps, batch_tokens, cst.n_running);
                goto out_results;
            }
        }
        const kvc_sched_done_t *done;
        uint32_t nd;
        (void)kvc_sched_take_finished(s, &done, &nd);
        for (uint32_t i = 0; i < nd; i++) {
            const kvc_sched_done_t *d = &done[i];
            uint32_t wi = (uint32_t)d->tag;
            kvc_sim_record_t rec = {.arrival_s = d->arrival_s,
                                    .first_token_s = d->first_token_s,
                                    .finish_s = d->finish_s,
                                    .n_prompt = d->n_prompt,
                                    .n_output = d->n_output,
                                    .n_hit_tokens = d->n_hit_tokens,
                                    .tenant = d->tenant,
                                    .priority = d->priority,
                                    .n_preemptions = d->n_preemptions,
                                    .recomputed_tokens = d->recomputed_tokens};
            if ((rc = kvc_report_add(r->report, &rec))) goto out_results;
            r->res->completed++;
            kvc_free(NULL, r->owned[wi]);
            r->owned[wi] = NULL;
            uint32_t nx = r->next_turn[wi];
            if (nx != KVC_NONE && cfg->closed_loop) {
                const kvc_sim_request_t *q2 = kvc_workload_request(r->w, nx);
                if ((rc = heap_push(&heap, (arrival_t){d->finish_s + q2->think_s, nx})))
                    goto out_results;
            }
        }
        r->done_total += nd;
        kvc_sched_stats_t st;
        kvc_sched_stats(s, &st);
        r->res->peak_kv_blocks = KVC_MAX(r->res->peak_kv_blocks, st.blocks_used);
        r->res->peak_running = KVC_MAX(r->res->peak_running, st.n_running);
        if (sample) {
            kvc_sim_sample_t smp = {.t_s = now,
                                    .kv_blocks_used = st.blocks_used,
                                    .kv_blocks_total = num_blocks,
                                    .running = st.n_running,
                                    .waiting = st.n_waiting,
                                    .swapped = st.n_swapped,
                                    .batch_tokens = batch_tokens};
            if ((rc = kvc_report_sample(r->report, &smp))) goto out_results;
        }
        r->res->steps++;
        if (cfg->progress && r->done_total - last_progress >= KVC_MAX(r->total / 100, 1)) {
            last_progress = r->done_total;
            cfg->progress(cfg->progress_ctx, r->done_total, r->total);
        }
    }
    {
        kvc_sched_stats_t st;
        kvc_sched_stats(s, &st);
        r->res->preemptions += st.preemptions;
        r->res->recomputed_tokens += st.recomputed_tokens;
        r->res->swapped_out_bytes += st.swapped_out_bytes;
        r->res->swapped_in_bytes += st.swapped_in_bytes;
        r->res->prompt_tokens += st.prompt_tokens_admitted;
        r->res->hit_tokens += st.hit_tokens;
        r->res->resume_hit_tokens += st.resume_hit_tokens;
        r->res->simulated_s = KVC_MAX(r->res->simulated_s, now);
        char msg[256];
        if (kvc_sched_check(s, msg, sizeof msg))
            rc = kvc__msgf(KVC_ECORRUPT, err, cap, "internal: %s", msg);
    }
out_results:
    kvc_free(NULL, results);
out:
    if (rc && err && cap && !err[0])
        kvc__msgf(rc, err, cap, "simulation failed: %s", kvc_strerror(rc));
    kvc_free(NULL, heap.v);
    kvc_sched_destroy(s);
    kvc_seqs_destroy(seqs);
    kvc_prefix_destroy(pc);
    kvc_pool_destroy(pool);
    return rc;
}

int kvc_sim_run(const kvc_sim_config_t *cfg, const kvc_workload_t *w, kvc_report_t *report,
                kvc_sim_result_t *out, char *err, size_t cap)
{
    if (err && cap) err[0] = 0;
    if (!cfg || !w || !report || !out) return kvc__msgf(KVC_EINVAL, err, cap, "missing arguments");
    *out = (kvc_sim_result_t){0};
    uint64_t t0 = kvc_now_ns();
    if (cfg->spec_acceptance < 0 || cfg->spec_acceptance > 1 || cfg->step_overhead_s < 0)
        return kvc__msgf(KVC_EINVAL, err, cap,
                         "spec acceptance must be in 0..1 and the step overhead >= 0");
    if (kvc_workload_n_tenants(w) > KVC_MAX_TENANTS || kvc_workload_n_classes(w) > KVC_MAX_CLASSES)
        return kvc__msgf(
            KVC_EINVAL, err, cap, "the workload has %u tenants and %u classes; at most %d and %d",
            kvc_workload_n_tenants(w), kvc_workload_n_classes(w), KVC_MAX_TENANTS, KVC_MAX_CLASSES);
    char msg[256];
    int rc = kvc_plan_compute(&cfg->model, &cfg->gpu, &cfg->plan, &out->planned, msg, sizeof msg);
    if (rc) return kvc__msgf(rc, err, cap, "%s", msg);
    uint64_t blocks = cfg->num_blocks ? cfg->num_blocks : out->planned.num_blocks;
    if (!cfg->num_blocks && !out->planned.fits)
        return kvc__msgf(
            KVC_EINVAL, err, cap,
            "the deployment does not start (it fails at %s; see kvcache plan); give --num-blocks "
            "to simulate a pool anyway",
            kvc_plan_phase_name((kvc_plan_phase_id_t)out->planned.failed_phase));
    if (blocks == 0 || blocks > (1u << 30))
        return kvc__msgf(KVC_EINVAL, err, cap, "the KV pool would hold %llu blocks",
                         (unsigned long long)blocks);
    if (cfg->plan.block_size > 256)
        return kvc__msgf(KVC_EINVAL, err, cap, "block size %u: the simulator's pool takes 1..256",
                         cfg->plan.block_size);
    /* KV groups: sliding-window layers get a group of their own when their blocks are freed. */
    uint32_t window[KVC_MAX_GROUPS] = {0}, n_groups = 1;
    const kvc_plan_model_t *m = &cfg->model;
    if (m->sliding_window && m->n_sliding_layers && cfg->plan.window_freeing) {
        if (m->n_sliding_layers >= m->n_layers) {
            window[0] = m->sliding_window;
        } else {
            n_groups = 2;
            window[1] = m->sliding_window;
        }
    }
    out->num_blocks = (uint32_t)blocks;
    out->n_groups = n_groups;
    out->n_replicas = cfg->plan.dp ? cfg->plan.dp : 1;
    if ((rc = kvc_sim_cost_model(m, &cfg->gpu, &cfg->plan, &out->planned, cfg->step_overhead_s,
                                 cfg->allreduce_latency_s, &out->cost)))
        return kvc__msgf(rc, err, cap, "the cost model needs positive FLOP/s and bandwidth");

    const size_t n = kvc_workload_size(w);
    run_t r = {.cfg = cfg,
               .w = w,
               .report = report,
               .res = out,
               .cost = out->cost,
               .n_replicas = out->n_replicas,
               .total = n};
    r.produced = kvc_calloc(NULL, n ? n : 1, sizeof(uint32_t), 0);
    r.next_turn = kvc_alloc(NULL, (n ? n : 1) * sizeof(uint32_t), 0);
    r.owned = kvc_calloc(NULL, n ? n : 1, sizeof(kvc_token_t *), 0);
    if (!r.produced || !r.next_turn || !r.owned) rc = KVC_ENOMEM;
    kvc_rng_seed(&r.rng, cfg->seed);
    out->requests = n;
    for (uint32_t rep = 0; !rc && rep < out->n_replicas; rep++) {
        r.replica = rep;
        if (!(rc = link_turns(&r)))
            rc = run_replica(&r, (uint32_t)blocks, n_groups, window, err, cap);
    }
    for (size_t i = 0; r.owned && i < n; i++) kvc_free(NULL, r.owned[i]);
    kvc_free(NULL, r.owned);
    kvc_free(NULL, r.produced);
    kvc_free(NULL, r.next_turn);
    if (rc) {
        if (err && cap && !err[0])
            kvc__msgf(rc, err, cap, "simulation failed: %s", kvc_strerror(rc));
        return rc;
    }
    /* Every constant the numbers rest on goes into the report. */
    const kvc_sim_cost_model_t *cm = &out->cost;
    struct {
        const char *key;
        double v;
    } nums[] = {
        {"kv_blocks_per_replica", out->num_blocks},
        {"block_size", cfg->plan.block_size},
        {"kv_groups", out->n_groups},
        {"replicas", out->n_replicas},
        {"tp", cm->tp},
        {"pp", cm->pp},
        {"max_num_seqs", cfg->plan.max_num_seqs},
        {"max_num_batched_tokens", cfg->plan.max_num_batched_tokens},
        {"cost.flops_per_s", cm->flops_per_s},
        {"cost.attn_flops_per_s", cm->attn_flops_per_s},
        {"cost.bytes_per_s", cm->bytes_per_s},
        {"cost.linear_flops_per_token", cm->linear_flops_per_token},
        {"cost.attn_flops_per_pair", cm->attn_flops_per_pair},
        {"cost.dense_weight_bytes", cm->dense_weight_bytes},
        {"cost.expert_weight_bytes", cm->expert_weight_bytes},
        {"cost.kv_bytes_per_token", cm->kv_bytes_per_token},
        {"cost.comm_bytes_per_token", cm->comm_bytes_per_token},
        {"cost.allreduce_per_step", cm->n_allreduce},
        {"cost.link_bytes_per_s", cm->link_bytes_per_s},
        {"cost.allreduce_latency_s", cm->allreduce_latency_s},
        {"cost.step_overhead_s", cm->step_overhead_s},
        {"cost.host_link_bytes_per_s", cm->host_link_bytes_per_s},
        {"spec_tokens", cfg->sched.spec_tokens},
        {"spec_acceptance", cfg->spec_acceptance},
        {"seed", (double)cfg->seed},
        {"resume_hit_tokens", (double)out->resume_hit_tokens},
        {"rejected_requests", (double)out->rejected},
        {"max_model_len", (double)out->planned.max_model_len},
    };
    for (size_t i = 0; i < KVC_ARRAY_LEN(nums) && !rc; i++)
        rc = kvc_report_add_config_num(report, nums[i].key, nums[i].v);
    const char *strs[][2] = {
        {"model", cfg->model.name},
        {"gpu", cfg->gpu.name},
        {"admission", kvc_admission_name(cfg->sched.admission)},
        {"preemption", kvc_preemption_name(cfg->sched.preemption)},
        {"prefix_caching", cfg->prefix_caching ? "on" : "off"},
        {"arrivals", cfg->closed_loop ? "closed loop" : "open loop (trace times)"},
        {"step_time", "pp x (max(compute, memory) + tp comm) + overhead + swap bytes / host link"},
    };
    for (size_t i = 0; i < KVC_ARRAY_LEN(strs) && !rc; i++)
        rc = kvc_report_add_config(report, strs[i][0], strs[i][1]);
    if (rc) return rc;
    kvc_report_totals_t t = {.preemptions = out->preemptions,
                             .recomputed_tokens = out->recomputed_tokens,
                             .swapped_bytes = out->swapped_out_bytes + out->swapped_in_bytes,
                             .prompt_tokens = out->prompt_tokens,
                             .hit_tokens = out->hit_tokens,
                             .peak_kv_blocks = out->peak_kv_blocks,
                             .simulated_s = out->simulated_s,
                             .steps = out->steps};
    rc = kvc_report_finish(report, &t);
    out->wall_s = (double)(kvc_now_ns() - t0) * 1e-9;
    return rc;
}
