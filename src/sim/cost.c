/* cost.c - the simulator's cost model: how long one planned step takes on
 * the deployment's GPUs, from the planner's descriptors (see sim.h for the
 * formula).  engine.c calls kvc_sim_step_time once per simulated step; the
 * numbers it rests on are printed in every report. */
#include "kvcache/sim.h"

#include <math.h>

/* ---- the cost model ---------------------------------------------------------------- */
/* Rates and sizes a step time can be computed from: rates positive, sizes finite and not
 * negative, KV bytes per token positive and small enough that a block's bytes are a size_t
 * (a real model holds at most a few MB per token). */
static bool cost_model_usable(const kvc_sim_cost_model_t *c)
{
    const double sizes[] = {c->linear_flops_per_token, c->attn_flops_per_pair,
                            c->dense_weight_bytes,     c->expert_weight_bytes,
                            c->comm_bytes_per_token,   c->allreduce_latency_s,
                            c->step_overhead_s,        c->link_bytes_per_s};
    for (size_t i = 0; i < KVC_ARRAY_LEN(sizes); i++)
        if (!(sizes[i] >= 0) || !isfinite(sizes[i])) return false;
    return c->flops_per_s > 0 && isfinite(c->flops_per_s) && c->attn_flops_per_s > 0 &&
           isfinite(c->attn_flops_per_s) && c->bytes_per_s > 0 && isfinite(c->bytes_per_s) &&
           c->host_link_bytes_per_s > 0 && isfinite(c->host_link_bytes_per_s) &&
           c->kv_bytes_per_token > 0 && c->kv_bytes_per_token <= 1e12 &&
           c->kv_block_efficiency > 0 && c->kv_block_efficiency <= 1 &&
           c->experts_per_token_share >= 0 && c->experts_per_token_share <= 1 && c->tp >= 1 &&
           c->pp >= 1;
}

int kvc_sim_cost_model(const kvc_plan_model_t *m, const kvc_plan_gpu_t *gpu,
                       const kvc_plan_params_t *p, const kvc_plan_result_t *r,
                       double step_overhead_s, double allreduce_latency_s,
                       kvc_sim_cost_model_t *out)
{
    if (!m || !gpu || !p || !r || !out || !(step_overhead_s >= 0) || !(allreduce_latency_s >= 0) ||
        p->tp == 0 || p->pp == 0 || r->layers_per_gpu > UINT32_MAX / 2)
        return KVC_EINVAL;
    const double tp = p->tp, pp = p->pp, parts = tp * pp;
    const double mfu = p->mfu > 0 ? p->mfu : 1.0, mbu = p->mbu > 0 ? p->mbu : 1.0;
    const kvc_plan_param_count_t *c = &r->counts;
    /* Linear layers: every active parameter but the embedding lookup is one multiply-add; a
     * tied table is multiplied once more, as the LM head. */
    double linear_params =
        (double)(c->active - c->embedding) + (m->tie_embeddings ? (double)c->embedding : 0);
    /* Attention per (query, key) pair and layer: QK^T over the key width, PV over the value width,
     * 2 FLOPs a multiply-add, for every query head.  MLA (absorbed): keys are the latent plus the
     * rope part, values the latent. */
    double d_qk = m->mla ? (double)m->kv_lora_rank + m->qk_rope_head_dim : m->head_dim;
    double d_v = m->mla ? (double)m->kv_lora_rank : (m->v_head_dim ? m->v_head_dim : m->head_dim);
    double heads_per_gpu = ceil((double)m->n_heads / tp);
    double wbytes = (double)kvc_plan_dtype_bytes(p->weight_dtype, 1u << 20) / (1u << 20);
    double expert_bytes = m->n_experts ? (double)c->experts_routed * wbytes / parts : 0;
    *out = (kvc_sim_cost_model_t){
        .flops_per_s = r->peak_flops * mfu,
        .attn_flops_per_s = gpu->bf16_flops * mfu,
        .bytes_per_s = gpu->hbm_bytes_per_s * mbu,
        .linear_flops_per_token = 2.0 * linear_params / parts,
        .attn_flops_per_pair = 2.0 * (d_qk + d_v) * heads_per_gpu * r->layers_per_gpu,
        /* a step reads one row of the input embedding per token, not the table (the planner's
         * embedding_bytes_not_read; a tied table is read whole as the LM head) */
        .dense_weight_bytes =
            KVC_MAX(0.0, (double)r->weight_bytes_per_gpu - expert_bytes -
                             (double)r->embedding_bytes_not_read - (double)r->vision_bytes_per_gpu),
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
        .kv_block_efficiency =
            (double)p->block_size / ((double)p->block_size + KVC_SIM_BLOCK_OVERHEAD_TOKENS),
    };
    return cost_model_usable(out) ? 0 : KVC_EINVAL;
}

double kvc_sim_step_time(const kvc_sim_cost_model_t *cm, const kvc_sched_plan_t *plan,
                         kvc_sim_step_cost_t *detail)
{
    double tokens = 0, pairs = 0, context = 0;
    for (uint32_t i = 0; i < plan->n_entries; i++) {
        const kvc_sched_entry_t *e = &plan->entries[i];
        double n = e->n_tokens, first = e->first_pos;
        if (cm->no_kv_cache) { /* nothing is cached: the whole context again, from position 0 */
            n += first;
            first = 0;
        }
        tokens += n;
        pairs += n * first + n * (n + 1) / 2; /* query i sees first + i + 1 keys (causal) */
        context += first + n;
    }
    kvc_sim_step_cost_t d = {0};
    if (cm->profile) { /* this machine's measured steps, interpolated */
        d.compute_s = tokens > 0 ? kvc_sim_profile_step_s(cm->profile, tokens, pairs / tokens) : 0;
        d.swap_s = (double)(plan->swap_out_bytes + plan->swap_in_bytes) / cm->host_link_bytes_per_s;
        d.total_s = d.compute_s + kvc_sim_profile_fixed(cm->profile).step_s + cm->step_overhead_s +
                    d.swap_s;
        if (detail) *detail = d;
        return d.total_s;
    }
    if (tokens > 0) {
        d.linear_flops = cm->linear_flops_per_token * tokens;
        d.attn_flops = cm->attn_flops_per_pair * pairs;
        double experts_read =
            cm->expert_weight_bytes > 0
                ? cm->expert_weight_bytes * (1.0 - pow(1.0 - cm->experts_per_token_share, tokens))
                : 0;
        /* KV read by attention (context) at the paged blocks' efficiency, and written (tokens) */
        const double eff = cm->kv_block_efficiency > 0 ? cm->kv_block_efficiency : 1;
        d.bytes_read = cm->dense_weight_bytes + experts_read +
                       cm->kv_bytes_per_token * (context / eff + tokens);
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
