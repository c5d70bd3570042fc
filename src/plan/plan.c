/* plan.c - the capacity planner's arithmetic: KV bytes per token and what
 * parallelism does to them, the startup ledger and phases, the ceilings on the
 * running batch, and the derived sections (windows, prefill FLOPs, forks,
 * disaggregation, tiers, Little's law, speculation, tenancy).
 *
 * Everything is computed per GPU for each pipeline stage, and the stage with
 * the fewest KV blocks binds, as engines take the minimum over their workers.
 * Bytes are exact integers; times and rates are doubles.  The estimates (the
 * activation peak, CUDA graphs, non-framework memory, the CUDA context, the
 * achieved FLOP/s and bandwidth) are named constants below, each with where
 * it comes from, and each can be replaced by a measured number through
 * kvc_plan_params_t.
 */
#include "plan_int.h"

#include <math.h>
#include <string.h>
#include <strings.h>

/* The estimates (rules of thumb, with their sources) live in plan_int.h so that
 * the renderers can quote them. */

kvc_plan_params_t kvc_plan_params_default(void)
{
    return (kvc_plan_params_t){
        .tp = 1,
        .pp = 1,
        .dp = 1,
        .cp = 1,
        .gpus_per_node = 8,
        .rope_scaling = KVC_PLAN_ROPE_NONE,
        .rope_factor = 0,
        .weight_dtype = KVC_PLAN_BF16,
        .kv_dtype = KVC_PLAN_BF16,
        .block_size = 16,
        .gpu_memory_utilization = 0.9,
        .max_model_len = 0,
        .max_num_seqs = 0,           /* vLLM's default for the GPU */
        .max_num_batched_tokens = 0, /* likewise */
        .prompt_tokens = 1000,
        .output_tokens = 200,
        .context_tokens = 0,
        .window_freeing = true,
        .weight_bytes = KVC_PLAN_AUTO,
        .activation_bytes = KVC_PLAN_AUTO,
        .cuda_graph_bytes = KVC_PLAN_AUTO,
        .non_torch_bytes = KVC_PLAN_AUTO,
        .cuda_context_bytes = KVC_PLAN_AUTO,
        .kv_cache_bytes = KVC_PLAN_AUTO,
        .enforce_eager = false,
        .graphs_outside_budget = false,
        .n_samples = 4,
        .beams = 4,
        .arrival_rate = 0, /* auto: half the rate the ceilings sustain */
        .mfu = 0.5,
        .mbu = 0.8,
        .link_bytes_per_s = 50e9, /* one 400 Gb/s NIC per GPU */
        .prefill_tokens_per_s = 0,
        .host_bytes_per_s = 0,
        .nvme_bytes_per_s = 7e9,        /* one PCIe Gen4 x4 NVMe drive per GPU */
        .network_bytes_per_s = 12.5e9,  /* 100 Gb/s to a remote KV store */
        .ssd_endurance_bytes = 7008e12, /* 3.84 TB x 1 drive write per day x 5 years */
        .ssd_write_bytes_per_s = 0,
        .spec_tokens = 0,
        .spec_acceptance = 0.7,
        .spec_draft_params = 0,
        .tenant_tokens = 0,
    };
}

static const char *const kind_names[] = {"measured", "estimated", "configured"};
const char *kvc_plan_kind_name(kvc_plan_kind_t k)
{
    return (unsigned)k < KVC_ARRAY_LEN(kind_names) ? kind_names[k] : "?";
}
static const char *const op_names[] = {"total", "budget", "subtract", "outside", "remainder"};
const char *kvc_plan_op_name(kvc_plan_op_t op)
{
    return (unsigned)op < KVC_ARRAY_LEN(op_names) ? op_names[op] : "?";
}
static const char *const phase_names[KVC_PLAN_PHASE__COUNT] = {"init",
                                                               "load_weights",
                                                               "profile",
                                                               "allocate_kv_pool",
                                                               "check_max_model_len",
                                                               "capture_cuda_graphs"};
const char *kvc_plan_phase_name(kvc_plan_phase_id_t id)
{
    return (unsigned)id < KVC_PLAN_PHASE__COUNT ? phase_names[id] : "?";
}
static const char *const status_names[] = {"ok", "failed", "skipped", "not reached"};
const char *kvc_plan_phase_status_name(kvc_plan_phase_status_t s)
{
    return (unsigned)s < KVC_ARRAY_LEN(status_names) ? status_names[s] : "?";
}
static const char *const ceiling_names[KVC_PLAN_CEIL__COUNT] = {
    "kv_memory", "compute", "max_num_seqs", "max_num_batched_tokens"};
const char *kvc_plan_ceiling_name(kvc_plan_ceiling_id_t id)
{
    return (unsigned)id < KVC_PLAN_CEIL__COUNT ? ceiling_names[id] : "?";
}

/* ---- shards: what one GPU holds of one layer --------------------------------- */
typedef struct {
    uint64_t linear;        /* quantizable projection weights */
    uint64_t wide;          /* kept in 16 bits: norms, biases, router, embeddings */
    uint64_t expert_linear; /* routed-expert weights (part of linear) */
    double flop_params;     /* weights one token multiplies (experts weighted by k/E) */
    uint64_t act_elems;     /* activations one token keeps live in this layer */
} shard_t;

static uint32_t kv_heads_per_gpu(const kvc_plan_model_t *m, uint32_t tp)
{
    if (m->mla) return 1;
    return m->n_kv_heads >= tp ? m->n_kv_heads / tp : 1;
}

static uint32_t kv_replication(const kvc_plan_model_t *m, uint32_t tp)
{
    if (m->mla) return tp;        /* every GPU of the group holds the whole latent */
    if (!m->n_kv_heads) return 1; /* no attention layer (pure Mamba-2) */
    return tp > m->n_kv_heads ? tp / m->n_kv_heads : 1;
}

/* What a layer holds: a mixer (none, attention or recurrent) and an MLP (none, dense or MoE);
 * a layer of a pattern has one of them (and one norm), any other layer both (and two). */
enum { MIX_NONE = 0, MIX_ATTN, MIX_REC };
enum { FFN_NONE = 0, FFN_DENSE, FFN_MOE };

static void layer_shard(const kvc_plan_model_t *m, uint32_t tp, int ffn, int mixer, shard_t *s)
{
    const uint64_t H = m->hidden_size, nh = m->n_heads / tp;
    memset(s, 0, sizeof *s);
    if (mixer == MIX_REC) {
        /* a Mamba mixer in place of attention: TP splits the inner channels (and heads) */
        uint64_t lin, wide;
        kvc__mamba_params(m, tp, &lin, &wide);
        s->linear += lin;
        s->wide += wide;
        const uint64_t d = kvc__ceil_div(m->ssm_d_inner, tp);
        if (m->recurrent == KVC_PLAN_RECURRENT_MAMBA1)
            s->act_elems += 4 * d + m->ssm_dt_rank + 2 * (uint64_t)m->ssm_d_state;
        else /* the input projection's outputs, the convolved channels, the gated output */
            s->act_elems += lin / H + kvc__conv_channels(m, tp) + d;
    } else if (mixer == MIX_ATTN && m->mla) {
        const uint64_t qk = (uint64_t)m->qk_nope_head_dim + m->qk_rope_head_dim;
        if (m->q_lora_rank) {
            s->linear += H * m->q_lora_rank + m->q_lora_rank * nh * qk; /* q_a replicated */
            s->wide += m->q_lora_rank;
        } else {
            s->linear += H * nh * qk;
        }
        s->linear += H * ((uint64_t)m->kv_lora_rank + m->qk_rope_head_dim); /* kv_a replicated */
        s->wide += m->kv_lora_rank;
        s->linear +=
            (uint64_t)m->kv_lora_rank * nh * ((uint64_t)m->qk_nope_head_dim + m->v_head_dim);
        s->linear += nh * m->v_head_dim * H;
        s->act_elems += nh * qk + m->kv_lora_rank + m->qk_rope_head_dim +
                        nh * ((uint64_t)m->qk_nope_head_dim + m->v_head_dim) + nh * m->v_head_dim;
    } else if (mixer == MIX_ATTN) {
        const uint64_t kvh = kv_heads_per_gpu(m, tp), hd = m->head_dim,
                       gate = m->attn_output_gate ? 2 : 1;
        s->linear += H * nh * hd * gate + 2 * H * kvh * hd + nh * m->v_head_dim * H;
        if (m->qkv_bias) s->wide += nh * hd + 2 * kvh * hd;
        s->act_elems += nh * hd * gate + 2 * kvh * hd + nh * m->v_head_dim;
    }
    s->flop_params = (double)s->linear;
    const uint64_t mats = m->mlp_ungated ? 2 : 3; /* up, down (and gate) */
    if (ffn == FFN_MOE) {
        const uint64_t im = kvc__ceil_div(m->moe_intermediate_size, tp);
        const uint64_t shared =
            kvc__ceil_div((uint64_t)m->n_shared_experts * m->moe_intermediate_size +
                              m->shared_expert_intermediate_size,
                          tp);
        s->expert_linear = (uint64_t)m->n_experts * mats * H * im;
        s->linear += s->expert_linear + mats * H * shared;
        s->wide += H * m->n_experts; /* router */
        s->flop_params += (double)s->expert_linear * m->n_experts_active / m->n_experts +
                          (double)(mats * H * shared + H * m->n_experts);
        s->act_elems += (uint64_t)m->n_experts_active * (mats * im + H) + mats * shared;
    } else if (ffn == FFN_DENSE) {
        const uint64_t mlp = mats * H * kvc__ceil_div(m->intermediate_size, tp);
        s->linear += mlp;
        s->flop_params += (double)mlp;
        s->act_elems += mats * kvc__ceil_div(m->intermediate_size, tp);
    }
    s->wide += (m->layer_pattern[0] ? 1 : 2) * H; /* RMSNorm weights */
    s->act_elems += 4 * H; /* residual, normed input, attention and MLP outputs */
}

/* Bytes of `linear` quantizable weights in dtype dt. */
static uint64_t linear_bytes(uint64_t n, kvc_plan_dtype_t dt)
{
    return kvc_plan_dtype_bytes(dt, n); /* int4: fp16 scale + zero per 128; nvfp4: 9 B per 16 */
}

/* One pipeline stage on one GPU. */
typedef struct {
    uint32_t first_layer, n_layers, n_sliding;
    uint32_t n_recurrent, n_attn; /* layers with a state; the rest attend (and hold KV) */
    uint64_t state_bytes;         /* one sequence's recurrent state on this GPU */
    uint64_t linear, wide, expert_linear;
    double flop_params;    /* decode, per token, LM head included on the last stage */
    uint64_t weight_bytes; /* estimated */
    uint64_t expert_bytes; /* routed-expert part of weight_bytes */
    uint64_t embed_bytes;  /* the input table, when a decode step does not read it whole */
    uint64_t vision_bytes; /* the vision tower's shard: runs on images, not on decode steps */
    uint64_t lora_bytes;   /* one LoRA adapter's shard on this stage's layers */
    uint64_t act_elems;    /* per token, the widest layer */
    uint64_t act_fwd, act_sampler, act, graphs, non_torch, ctx; /* bytes */
    uint64_t act_text;                                          /* the peak without images */
    uint64_t enc_act, enc_cache; /* first stage of a multimodal model: the vision encoder's
                                    activations and the image embeddings it hands over */
    uint64_t kv_per_layer;       /* KV bytes per token per layer on this GPU */
    uint64_t kv_per_token;       /* all of the stage's layers */
    uint64_t slot_bytes;         /* one pool block: block_size tokens of KV, or without
                                    attention layers one sequence's state */
    int64_t pool;                /* signed: the budget can be overdrawn */
    double blocks;               /* pool / block bytes, may be negative */
} stage_t;

static uint64_t kv_per_layer(const kvc_plan_model_t *m, uint32_t tp, kvc_plan_dtype_t dt)
{
    if (m->mla) return kvc_plan_dtype_bytes(dt, (uint64_t)m->kv_lora_rank + m->qk_rope_head_dim);
    return kvc_plan_dtype_bytes(dt, 2 * (uint64_t)kv_heads_per_gpu(m, tp) * m->head_dim);
}

/* Weight bytes of a stage of layers [first, first + n) on one GPU of a TP group. */
static void stage_weights(const kvc_plan_model_t *m, uint32_t tp, kvc_plan_dtype_t wdt,
                          bool first_stage, bool last_stage, bool pp, stage_t *s)
{
    shard_t shards[3][3]; /* [mixer][ffn] */
    for (int mix = 0; mix < 3; mix++)
        for (int f = 0; f < 3; f++)
            if ((mix != MIX_REC || m->recurrent) && (f != FFN_MOE || m->n_experts))
                layer_shard(m, tp, f, mix, &shards[mix][f]);
    s->linear = s->wide = s->expert_linear = 0;
    s->flop_params = 0;
    s->act_elems = 0;
    for (uint32_t i = s->first_layer; i < s->first_layer + s->n_layers; i++) {
        const int mix = kvc__layer_recurrent(m, i)   ? MIX_REC
                        : kvc__layer_attention(m, i) ? MIX_ATTN
                                                     : MIX_NONE;
        const int f = kvc__layer_moe(m, i) ? FFN_MOE : kvc__layer_mlp(m, i) ? FFN_DENSE : FFN_NONE;
        const shard_t *sh = &shards[mix][f];
        s->linear += sh->linear;
        s->wide += sh->wide;
        s->expert_linear += sh->expert_linear;
        s->flop_params += sh->flop_params;
        s->act_elems = KVC_MAX(s->act_elems, sh->act_elems);
    }
    const uint64_t vocab_shard = kvc__ceil_div(m->vocab_size, tp) * m->hidden_size;
    if (first_stage) s->wide += vocab_shard; /* the input embedding (vocab-parallel) */
    /* A decode step looks up one row per token of the input table; only a table that is
     * also this stage's LM head (tied, one stage) is read whole every step. */
    s->embed_bytes = first_stage && !(m->tie_embeddings && last_stage && !pp) ? 2 * vocab_shard : 0;
    s->vision_bytes = first_stage ? 2 * kvc__ceil_div(m->vision_params, tp) : 0;
    s->wide += s->vision_bytes / 2;
    if (last_stage) {
        /* The LM head: its own matrix, or the tied table copied to the last stage. */
        if (!m->tie_embeddings || pp) s->wide += vocab_shard;
        s->wide += m->hidden_size; /* final norm */
        s->flop_params += (double)vocab_shard;
    }
    s->expert_bytes = linear_bytes(s->expert_linear, wdt);
    s->weight_bytes = linear_bytes(s->linear, wdt) + 2 * s->wide;
}

/* Bytes one request of n tokens holds on a stage's GPU, block-rounded. */
static uint64_t request_bytes(uint64_t per_layer, uint32_t n_layers, uint32_t n_sliding,
                              uint32_t window, uint32_t bs, bool freeing, uint64_t n)
{
    if (n == 0) return 0;
    const uint64_t full_blocks = kvc__ceil_div(n, bs);
    uint64_t swa_blocks = full_blocks;
    if (n_sliding && freeing && n > window) {
        /* Only the blocks that overlap the last `window` tokens stay. */
        const uint64_t last = (n - 1) / bs, first = (n - window) / bs;
        swa_blocks = last - first + 1;
    }
    const uint64_t blocks = (uint64_t)(n_layers - n_sliding) * full_blocks + n_sliding * swa_blocks;
    return kvc__mul_sat(kvc__mul_sat(blocks, bs), per_layer);
}

/* Context parallelism: each of the cp GPUs holds ceil(n / cp) of the tokens (and as much of a
 * window). */
static uint64_t cp_share(uint64_t n, uint32_t cp)
{
    return cp > 1 ? kvc__ceil_div(n, cp) : n;
}

/* A recurrent layer's state for one sequence on one GPU of a TP group: the convolution's last
 * d_conv - 1 inputs of its channels (d_inner / tp; Mamba-2 and Gated DeltaNet add B and C, or
 * q and k) and the SSM state: d_inner / tp x d_state (Mamba-1; Mamba-2's heads x head_dim x
 * d_state and Gated DeltaNet's value heads x value dim x key dim are the same product). */
static void state_per_layer(const kvc_plan_model_t *m, uint32_t tp, bool ssm_fp32, uint64_t *conv,
                            uint64_t *ssm)
{
    const uint64_t d = kvc__ceil_div(m->ssm_d_inner, tp);
    *conv = m->recurrent ? 2 * ((uint64_t)m->ssm_d_conv - 1) * kvc__conv_channels(m, tp) : 0;
    *ssm = m->recurrent ? (ssm_fp32 ? 4 : 2) * d * m->ssm_d_state : 0;
}

static uint32_t attn_layers(const kvc_plan_model_t *m)
{
    return kvc__attn_layers(m);
}

uint64_t kvc_plan_request_bytes(const kvc_plan_result_t *r, uint64_t n)
{
    const uint32_t cp = r->params.cp;
    const uint64_t kv =
        request_bytes(r->kv_bytes_per_token_per_layer_per_gpu, r->kv_layers_per_gpu,
                      r->sliding_layers_per_gpu, (uint32_t)cp_share(r->model.sliding_window, cp),
                      r->params.block_size, r->params.window_freeing, cp_share(n, cp));
    /* a recurrent state per sequence, whatever its length */
    const uint64_t st = r->state_bytes_per_seq_per_gpu;
    return n == 0 ? 0 : kv > UINT64_MAX - st ? UINT64_MAX : kv + st;
}

/* Attention FLOPs one token spends on keys at context c, summed over layers. */
static double attn_flops_token(const kvc_plan_model_t *m, uint32_t n_layers, uint32_t n_sliding,
                               double heads, double d_qk, double d_v, double c)
{
    const double c_swa = m->sliding_window ? fmin(c, (double)m->sliding_window) : c;
    return 2.0 * heads * (d_qk + d_v) * ((n_layers - n_sliding) * c + n_sliding * c_swa);
}

/* Causal attention pairs of a prompt of n tokens (query i sees i + 1 keys),
 * limited to the window w when w > 0: every pair counted once. */
static double causal_pairs(double n, double w)
{
    if (w <= 0 || n <= w) return n * (n + 1) / 2;
    return w * (w + 1) / 2 + (n - w) * w;
}

/* ---- decode roofline (per GPU of the binding stage) --------------------------- */
typedef struct {
    double lin_tok;  /* linear FLOPs per token: 2 x the parameters it multiplies */
    double attn_tok; /* attention FLOPs per token at the decode context */
    double f_lin;    /* peak FLOP/s of the linear layers (fp8 with fp8 weights) */
    double f_attn;   /* peak FLOP/s of attention: bf16, whatever the weights */
    double kv_read;  /* KV bytes read per sequence per step */
    double w_dense;  /* weight bytes read every step */
    double w_expert; /* routed-expert bytes, read as far as the batch touches them */
    double k_over_e; /* routed experts per token / experts */
    double bw;       /* peak memory bandwidth */
} roof_t;

/* Seconds of peak compute one token's forward takes on this GPU. */
static double token_time(const roof_t *f)
{
    return f->lin_tok / f->f_lin + f->attn_tok / f->f_attn;
}

static double weight_read(const roof_t *f, double tokens)
{
    if (f->w_expert <= 0) return f->w_dense;
    /* Expected share of experts a batch touches under uniform routing. */
    return f->w_dense + f->w_expert * (1 - pow(1 - f->k_over_e, tokens));
}

/* Is a step of b sequences, each with q query tokens, compute-bound? */
static bool compute_bound(const roof_t *f, double b, double q, bool with_kv)
{
    const double bytes = weight_read(f, b * q) + (with_kv ? b * f->kv_read : 0);
    return b * q * token_time(f) >= bytes / f->bw;
}

/* The smallest batch (sequences) at which the step turns compute-bound, or
 * UNBOUNDED.  flops/F - bytes/BW is convex in b and negative at 0, so it crosses
 * zero at most once: double until it does, then bisect. */
static uint64_t ridge_batch(const roof_t *f, double q, bool with_kv)
{
    const uint64_t cap = UINT64_C(1) << 30;
    uint64_t hi = 1;
    while (hi < cap && !compute_bound(f, (double)hi, q, with_kv)) hi *= 2;
    if (!compute_bound(f, (double)hi, q, with_kv)) return KVC_PLAN_UNBOUNDED;
    uint64_t lo = hi / 2; /* not compute-bound (or 0) */
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (compute_bound(f, (double)mid, q, with_kv))
            hi = mid;
        else
            lo = mid;
    }
    return hi;
}

/* ---- Little's law ---------------------------------------------------------------- */
typedef struct {
    const roof_t *f;
    double mfu, mbu;
    double out_tokens;
    double prefill_work_s; /* one request's prefill in GPU-seconds at the achieved rate */
    double replica_gpus;   /* tp x pp */
    uint32_t tp;
    uint32_t pp;
} little_t;

/* Decode step time at n resident sequences with arrivals lam per second, or
 * INFINITY when prefill alone saturates the compute. */
static double step_time(const little_t *l, double n, double lam)
{
    const double mem = (weight_read(l->f, n) + n * l->f->kv_read) / (l->f->bw * l->mbu);
    /* Chunked prefill of new arrivals shares every GPU's compute with the decode:
     * it keeps each GPU busy a fraction lam x prefill work / GPUs of the time. */
    const double prefill_load = lam * l->prefill_work_s / l->replica_gpus;
    if (prefill_load >= 1) return INFINITY;
    const double comp = n * token_time(l->f) / l->mfu / (1 - prefill_load);
    return l->pp * fmax(mem, comp);
}

/* Prefill (spread over the TP group, through every stage) plus the decode steps. */
static double time_in_system(const little_t *l, double n, double lam)
{
    return l->prefill_work_s / l->tp + l->out_tokens * step_time(l, n, lam);
}

/* Smallest fixed point of N = lam x T(N) by monotone iteration from 0 (T grows
 * with N, so the iterates rise to the least fixed point or diverge). */
static bool little_solve(const little_t *l, double lam, double *n_out, int *iters)
{
    double n = 0;
    for (int i = 1; i <= 100000; i++) {
        double t = time_in_system(l, n, lam);
        if (!isfinite(t)) break;
        double next = lam * t;
        if (next > 1e9) break;
        if (fabs(next - n) <= 1e-9 * fmax(1, next)) {
            *n_out = next;
            if (iters) *iters = i;
            return true;
        }
        n = next;
    }
    if (iters) *iters = 100000;
    return false;
}

/* ---- the plan ------------------------------------------------------------------- */
#define BAD(...) return kvc__msgf(KVC_EINVAL, msg, len, __VA_ARGS__)
/* The parallelism against the model, the dtypes, the block size, the utilization. */
static int validate_deployment(const kvc_plan_model_t *m, const kvc_plan_params_t *p, char *msg,
                               size_t len)
{
    if (p->tp < 1 || p->tp > 1024) BAD("--tp %u: expected 1..1024", p->tp);
    if (p->pp < 1 || p->pp > KVC__MAX_STAGES)
        BAD("--pp %u: expected 1..%d", p->pp, KVC__MAX_STAGES);
    if (p->dp < 1 || p->dp > 65536) BAD("--dp %u: expected 1..65536", p->dp);
    if (p->cp < 1 || p->cp > 1024) BAD("--cp %u: expected 1..1024", p->cp);
    if (p->gpus_per_node < 1 || p->gpus_per_node > 1024)
        BAD("--gpus-per-node %u: expected 1..1024", p->gpus_per_node);
    if ((uint64_t)p->tp * p->pp * p->dp * p->cp > KVC_PLAN_MAX_GPUS)
        BAD("--tp %u x --pp %u x --dp %u x --cp %u = %llu GPUs is out of range: at most %llu",
            p->tp, p->pp, p->dp, p->cp, (unsigned long long)p->tp * p->pp * p->dp * p->cp,
            (unsigned long long)KVC_PLAN_MAX_GPUS);
    if ((unsigned)p->rope_scaling >= KVC_PLAN_ROPE__COUNT) BAD("invalid rope scaling");
    if (p->rope_scaling != KVC_PLAN_ROPE_NONE && !(p->rope_factor > 1 && p->rope_factor <= 1024))
        BAD("--rope-scaling factor %g: expected more than 1 and at most 1024", p->rope_factor);
    if (m->n_heads % p->tp)
        BAD("--tp %u does not divide the %u attention heads", p->tp, m->n_heads);
    if (!m->mla && m->n_kv_heads && m->n_kv_heads % p->tp && p->tp % m->n_kv_heads)
        BAD("--tp %u neither divides the %u KV heads nor is a multiple of them", p->tp,
            m->n_kv_heads);
    if (p->pp > m->n_layers) BAD("--pp %u exceeds the %u layers", p->pp, m->n_layers);
    if (m->recurrent) {
        /* A recurrent state is one per sequence and scans the tokens in order: ring attention
         * does not split it, and adapters on the mixers are not sized. */
        if (p->cp > 1)
            BAD("--cp %u: context parallelism of recurrent (Mamba) layers is not modelled", p->cp);
        if (p->lora_rank) BAD("--lora-rank: LoRA on a recurrent model's mixers is not modelled");
        /* verifying k drafts needs the state at each of them to roll back to */
        if (p->spec_tokens)
            BAD("--spec-tokens %u: speculative decoding on recurrent layers (a state per draft "
                "position) is not modelled",
                p->spec_tokens);
        if (m->ssm_d_inner % p->tp)
            BAD("--tp %u does not divide the mixer's %u inner channels", p->tp, m->ssm_d_inner);
        if (m->ssm_n_heads % p->tp)
            BAD("--tp %u does not divide the mixer's %u heads", p->tp, m->ssm_n_heads);
        if (m->recurrent == KVC_PLAN_RECURRENT_GDN && m->ssm_n_groups % p->tp)
            BAD("--tp %u does not divide the %u linear-attention key heads", p->tp,
                m->ssm_n_groups);
    }
    if (p->state_checkpoint_interval > KVC_PLAN_MAX_TOKENS)
        BAD("--state-checkpoint-interval %llu is out of range: at most %llu",
            (unsigned long long)p->state_checkpoint_interval,
            (unsigned long long)KVC_PLAN_MAX_TOKENS);
    if (p->images_per_request > 4096)
        BAD("--images-per-request %u is out of range: at most 4096", p->images_per_request);
    if (p->encoder_cache_tokens > KVC_PLAN_MAX_TOKENS)
        BAD("--encoder-cache-tokens %llu is out of range: at most %llu",
            (unsigned long long)p->encoder_cache_tokens, (unsigned long long)KVC_PLAN_MAX_TOKENS);
    if (p->cached_prefixes > KVC_PLAN_MAX_TOKENS)
        BAD("--cached-prefixes %llu is out of range: at most %llu",
            (unsigned long long)p->cached_prefixes, (unsigned long long)KVC_PLAN_MAX_TOKENS);
    if ((unsigned)p->weight_dtype >= KVC_PLAN_DTYPE__COUNT) BAD("invalid weight dtype");
    if ((unsigned)p->kv_dtype >= KVC_PLAN_DTYPE__COUNT) BAD("invalid KV dtype");
    if (p->kv_dtype == KVC_PLAN_INT4)
        BAD("--kv-dtype int4: int4 is a weight format; the KV cache takes bf16, fp16, fp8, int8 "
            "or nvfp4");
    if (p->block_size < 1 || p->block_size > 1024 || (p->block_size & (p->block_size - 1)))
        BAD("--block-size %u: expected a power of two in 1..1024", p->block_size);
    if (!(p->gpu_memory_utilization > 0 && p->gpu_memory_utilization <= 1))
        BAD("--gpu-memory-utilization %g: expected a fraction in (0, 1]",
            p->gpu_memory_utilization);
    return 0;
}

/* The engine's limits, the typical request, forks and the throughput model. */
static int validate_engine(const kvc_plan_params_t *p, char *msg, size_t len)
{
    if (p->max_num_seqs < 1) BAD("--max-num-seqs must be at least 1");
    if (p->max_num_seqs > KVC_PLAN_MAX_SEQS)
        BAD("--max-num-seqs %u is out of range: at most %u", p->max_num_seqs, KVC_PLAN_MAX_SEQS);
    if (p->max_num_batched_tokens > KVC_PLAN_MAX_BATCHED)
        BAD("--max-num-batched-tokens %u is out of range: at most %u", p->max_num_batched_tokens,
            KVC_PLAN_MAX_BATCHED);
    if (p->max_num_batched_tokens < p->max_num_seqs)
        BAD("--max-num-batched-tokens %u is less than --max-num-seqs %u: a decode step could not "
            "give every sequence its token",
            p->max_num_batched_tokens, p->max_num_seqs);
    /* --output 0 is a prefill-only request, as a disaggregated prefill node runs */
    if (p->prompt_tokens < 1) BAD("--prompt must be at least 1 token");
    if (p->n_samples < 1 || p->beams < 1) BAD("--n and --beams must be at least 1");
    if (p->n_samples > KVC_PLAN_MAX_FORKS || p->beams > KVC_PLAN_MAX_FORKS)
        BAD("--n %u, --beams %u: each at most %u", p->n_samples, p->beams, KVC_PLAN_MAX_FORKS);
    if (!(p->arrival_rate >= 0) || !isfinite(p->arrival_rate))
        BAD("--arrival-rate must be a non-negative number (0: half the sustainable rate)");
    if (!(p->mfu > 0 && p->mfu <= 1)) BAD("--mfu %g: expected a fraction in (0, 1]", p->mfu);
    if (!(p->mbu > 0 && p->mbu <= 1)) BAD("--mbu %g: expected a fraction in (0, 1]", p->mbu);
    if (!(p->spec_acceptance >= 0 && p->spec_acceptance <= 1))
        BAD("--spec-acceptance %g: expected a fraction in [0, 1]", p->spec_acceptance);
    if (p->lora_rank > KVC_PLAN_MAX_RANK)
        BAD("--lora-rank %u is out of range: at most %u", p->lora_rank, KVC_PLAN_MAX_RANK);
    if (p->lora_resident > p->lora_adapters)
        BAD("--lora-resident %u is more than the %u --lora-adapters", p->lora_resident,
            p->lora_adapters);
    if (p->lora_adapters > (1u << 20))
        BAD("--lora-adapters %u is out of range: at most %u", p->lora_adapters, 1u << 20);
    if ((p->lora_adapters || p->lora_resident) && !p->lora_rank)
        BAD("--lora-adapters needs --lora-rank");
    if (p->spec_draft_params > KVC_PLAN_MAX_PARAMS)
        BAD("--spec-draft-params %llu is out of range: at most %llu",
            (unsigned long long)p->spec_draft_params, (unsigned long long)KVC_PLAN_MAX_PARAMS);
    if (p->spec_tokens > 64) BAD("--spec-tokens %u: expected 0..64", p->spec_tokens);
    if ((uint64_t)p->spec_tokens + 1 > p->max_num_batched_tokens)
        BAD("--spec-tokens %u leaves no room in --max-num-batched-tokens %u", p->spec_tokens,
            p->max_num_batched_tokens);
    return 0;
}

/* Token counts, measured bytes and rates within their bounds (plan.h). */
static int validate_bounds(const kvc_plan_params_t *p, char *msg, size_t len)
{
    /* Token counts; measured bytes (KVC_PLAN_AUTO: estimated), which stay within what a
     * ledger of five such terms holds in 63 bits. */
#define TOKENS(name, v)                             \
    {                                               \
        name, v, KVC_PLAN_MAX_TOKENS, "", " tokens" \
    }
#define BYTES(name, v)                                                   \
    {                                                                    \
        name, v == KVC_PLAN_AUTO ? 0 : v, KVC_PLAN_MAX_BYTES, " B", " B" \
    }
    const struct {
        const char *name;
        uint64_t v, max;
        const char *unit, *max_unit;
    } counts[] = {
        TOKENS("--prompt", p->prompt_tokens),
        TOKENS("--output", p->output_tokens),
        TOKENS("--context", p->context_tokens),
        TOKENS("--max-model-len", p->max_model_len),
        TOKENS("--tenant-tokens", p->tenant_tokens),
        BYTES("--weight-memory", p->weight_bytes),
        BYTES("--activation-memory", p->activation_bytes),
        BYTES("--cuda-graph-memory", p->cuda_graph_bytes),
        BYTES("--non-torch-memory", p->non_torch_bytes),
        BYTES("--cuda-context-memory", p->cuda_context_bytes),
        BYTES("--kv-cache-memory", p->kv_cache_bytes),
    };
#undef TOKENS
#undef BYTES
    for (size_t i = 0; i < KVC_ARRAY_LEN(counts); i++)
        if (counts[i].v > counts[i].max)
            BAD("%s %llu%s is out of range: at most %llu%s", counts[i].name,
                (unsigned long long)counts[i].v, counts[i].unit, (unsigned long long)counts[i].max,
                counts[i].max_unit);
    /* Rates: positive where required, never negative, NaN or past the bound (inf). */
    const struct {
        const char *name;
        double v;
        bool positive;
        double max;
    } rates[] = {
        {"--link-bandwidth", p->link_bytes_per_s, true, KVC_PLAN_MAX_RATE},
        {"--nvme-bandwidth", p->nvme_bytes_per_s, true, KVC_PLAN_MAX_RATE},
        {"--network-bandwidth", p->network_bytes_per_s, true, KVC_PLAN_MAX_RATE},
        {"--ssd-tbw", p->ssd_endurance_bytes, true, (double)KVC_PLAN_MAX_BYTES},
        {"--host-bandwidth", p->host_bytes_per_s, false, KVC_PLAN_MAX_RATE},
        {"--ssd-write-rate", p->ssd_write_bytes_per_s, false, KVC_PLAN_MAX_RATE},
        {"--prefill-tokens-per-s", p->prefill_tokens_per_s, false, KVC_PLAN_MAX_RATE},
    };
    for (size_t i = 0; i < KVC_ARRAY_LEN(rates); i++) {
        if (rates[i].positive && !(rates[i].v > 0)) BAD("%s must be positive", rates[i].name);
        if (!(rates[i].v >= 0)) BAD("%s cannot be negative", rates[i].name);
        if (!(rates[i].v <= rates[i].max))
            BAD("%s %g is out of range: at most %g", rates[i].name, rates[i].v, rates[i].max);
    }
    return 0;
}
#undef BAD

static int validate(const kvc_plan_model_t *m, const kvc_plan_gpu_t *g, const kvc_plan_params_t *p,
                    char *msg, size_t len)
{
    int rc = kvc_plan_model_check(m, msg, len);
    if (!rc) rc = kvc_plan_gpu_check(g, msg, len);
    if (!rc) rc = validate_deployment(m, p, msg, len);
    if (!rc) rc = validate_engine(p, msg, len);
    if (!rc) rc = validate_bounds(p, msg, len);
    return rc;
}

static void fill_ledger(kvc_plan_result_t *r, const kvc_plan_params_t *p, const stage_t *s)
{
    const bool kv_explicit = p->kv_cache_bytes != KVC_PLAN_AUTO;
    kvc_plan_ledger_entry_t *e = r->ledger;
    uint32_t n = 0;
    bool any_estimated = false;
#define ADD(nm, b, k, eng, o) e[n++] = (kvc_plan_ledger_entry_t){nm, b, k, eng, o}
    ADD("memory_visible", r->gpu.memory_bytes, KVC_PLAN_CONFIGURED, KVC_PLAN_MEASURED,
        KVC_PLAN_OP_TOTAL);
    ADD("budget", r->budget_bytes, KVC_PLAN_CONFIGURED, KVC_PLAN_CONFIGURED, KVC_PLAN_OP_BUDGET);
    kvc_plan_kind_t k;
    k = p->weight_bytes != KVC_PLAN_AUTO ? KVC_PLAN_MEASURED : KVC_PLAN_ESTIMATED;
    any_estimated |= k == KVC_PLAN_ESTIMATED;
    ADD("weights", s->weight_bytes, k, KVC_PLAN_MEASURED, KVC_PLAN_OP_SUBTRACT);
    k = p->activation_bytes != KVC_PLAN_AUTO ? KVC_PLAN_MEASURED : KVC_PLAN_ESTIMATED;
    any_estimated |= k == KVC_PLAN_ESTIMATED;
    ADD("activation_peak", s->act, k, KVC_PLAN_MEASURED, KVC_PLAN_OP_SUBTRACT);
    k = p->enforce_eager                       ? KVC_PLAN_CONFIGURED
        : p->cuda_graph_bytes != KVC_PLAN_AUTO ? KVC_PLAN_MEASURED
                                               : KVC_PLAN_ESTIMATED;
    const bool graphs_in = !p->graphs_outside_budget || p->enforce_eager;
    any_estimated |= k == KVC_PLAN_ESTIMATED && graphs_in;
    /* Engines that count graphs in the budget estimate them before capture (vLLM
     * pull/30515); the others capture after the pool and never subtract them. */
    ADD("cuda_graphs", s->graphs, k, graphs_in ? KVC_PLAN_ESTIMATED : KVC_PLAN_MEASURED,
        graphs_in ? KVC_PLAN_OP_SUBTRACT : KVC_PLAN_OP_OUTSIDE);
    k = p->non_torch_bytes != KVC_PLAN_AUTO ? KVC_PLAN_MEASURED : KVC_PLAN_ESTIMATED;
    any_estimated |= k == KVC_PLAN_ESTIMATED;
    ADD("non_torch", s->non_torch, k, KVC_PLAN_MEASURED, KVC_PLAN_OP_SUBTRACT);
    if (p->lora_resident)
        ADD("lora_adapters", kvc__mul_sat(s->lora_bytes, p->lora_resident), KVC_PLAN_CONFIGURED,
            KVC_PLAN_CONFIGURED, KVC_PLAN_OP_SUBTRACT);
    k = p->cuda_context_bytes != KVC_PLAN_AUTO ? KVC_PLAN_MEASURED : KVC_PLAN_ESTIMATED;
    ADD("cuda_context", s->ctx, k, KVC_PLAN_MEASURED, KVC_PLAN_OP_OUTSIDE);
    k = kv_explicit ? KVC_PLAN_CONFIGURED : any_estimated ? KVC_PLAN_ESTIMATED : KVC_PLAN_MEASURED;
    ADD("kv_pool", r->kv_pool_bytes_per_gpu, k,
        kv_explicit ? KVC_PLAN_CONFIGURED : KVC_PLAN_MEASURED, KVC_PLAN_OP_REMAINDER);
#undef ADD
    r->n_ledger = n;
}

/* ---- the sections -------------------------------------------------------------------
 * One compute function per output section, in the order render.c's sec_* print
 * them; each fills its part of the result from the inputs and the sections
 * before it.  What several sections share (the stages, the binding one, the
 * decode roofline, the prefill work) lives in calc_t.
 */
typedef struct {
    const kvc_plan_model_t *m;
    const kvc_plan_gpu_t *g;
    const kvc_plan_params_t *p;
    kvc_plan_result_t *r;
    bool kv_explicit; /* the KV budget is given (kv_cache_bytes) */
    stage_t stages[KVC__MAX_STAGES];
    const stage_t *st;     /* the binding stage (section 2) */
    roof_t roof;           /* the decode roofline (section 4), used again in 10 and 11 */
    double linear_params;  /* active parameters without the vocabulary tables (section 6) */
    double prefill_work_s; /* one prompt in GPU-seconds at the achieved rates (section 8) */
} calc_t;

/* The inputs, checked and resolved into the result. */
static int compute_inputs(calc_t *c, char *msg, size_t len)
{
    const kvc_plan_model_t *m = c->m;
    const kvc_plan_gpu_t *g = c->g;
    const kvc_plan_params_t *p = c->p;
    kvc_plan_result_t *r = c->r;
    int rc = validate(m, g, p, msg, len);
    if (rc) return rc;
    uint64_t max_len = p->max_model_len ? p->max_model_len : m->max_position_embeddings;
    if (!max_len)
        return kvc__msgf(KVC_EINVAL, msg, len,
                         "the model gives no max_position_embeddings: set --max-model-len");
    /* RoPE scaling (linear, YaRN, Llama 3) stretches the trained positions by its factor. */
    const bool scaled = p->rope_scaling != KVC_PLAN_ROPE_NONE;
    const double allowed_d = (double)m->max_position_embeddings * (scaled ? p->rope_factor : 1);
    const uint64_t allowed =
        allowed_d >= (double)KVC_PLAN_MAX_TOKENS ? KVC_PLAN_MAX_TOKENS : (uint64_t)allowed_d;
    if (m->max_position_embeddings && max_len > allowed) {
        if (scaled)
            return kvc__msgf(KVC_EINVAL, msg, len,
                             "--max-model-len %llu exceeds %s:%g x max_position_embeddings %llu = "
                             "%llu",
                             (unsigned long long)max_len, kvc_plan_rope_name(p->rope_scaling),
                             p->rope_factor, (unsigned long long)m->max_position_embeddings,
                             (unsigned long long)allowed);
        return kvc__msgf(KVC_EINVAL, msg, len,
                         "--max-model-len %llu exceeds the model's max_position_embeddings %llu "
                         "(a deployment extends it with --rope-scaling yarn:FACTOR)",
                         (unsigned long long)max_len,
                         (unsigned long long)m->max_position_embeddings);
    }
    const uint64_t req = p->prompt_tokens + p->output_tokens;
    if (req > max_len)
        return kvc__msgf(KVC_EINVAL, msg, len,
                         "the request (--prompt %llu + --output %llu) is longer than "
                         "max_model_len %llu",
                         (unsigned long long)p->prompt_tokens, (unsigned long long)p->output_tokens,
                         (unsigned long long)max_len);
    const uint64_t ctx_tokens = p->context_tokens ? p->context_tokens : req;
    if (ctx_tokens > max_len)
        return kvc__msgf(KVC_EINVAL, msg, len, "--context %llu exceeds max_model_len %llu",
                         (unsigned long long)ctx_tokens, (unsigned long long)max_len);

    memset(r, 0, sizeof *r);
    r->model = *m;
    r->gpu = *g;
    r->params = *p;
    r->max_model_len = max_len;
    r->context_tokens = ctx_tokens;
    r->max_position_embeddings_scaled = scaled && m->max_position_embeddings ? allowed : 0;
    r->request_tokens = req;
    r->n_gpus = p->tp * p->pp * p->dp * p->cp;
    kvc_plan_model_params(m, &r->counts);
    /* fp8, int8 (W8A8) and nvfp4 weights multiply on the 8-bit tensor cores where there are
     * some (nvfp4 on Blackwell's fp4 cores is faster still: not modelled, a conservative rate) */
    r->fp8_compute = (p->weight_dtype == KVC_PLAN_FP8 || p->weight_dtype == KVC_PLAN_INT8 ||
                      p->weight_dtype == KVC_PLAN_NVFP4) &&
                     g->fp8_flops > 0;
    r->peak_flops = r->fp8_compute ? g->fp8_flops : g->bf16_flops;
    c->kv_explicit = p->kv_cache_bytes != KVC_PLAN_AUTO;
    return 0;
}

uint64_t kvc_plan_kv_bytes_per_token(const kvc_plan_model_t *m, kvc_plan_dtype_t kv_dtype)
{
    return kv_per_layer(m, 1, kv_dtype) * attn_layers(m);
}

/* 1. KV bytes per token, and what TP does to them. */
static void compute_kv(calc_t *c)
{
    const kvc_plan_model_t *m = c->m;
    const kvc_plan_params_t *p = c->p;
    kvc_plan_result_t *r = c->r;
    const uint32_t tp = p->tp;
    r->kv_bytes_per_token = kvc_plan_kv_bytes_per_token(m, p->kv_dtype);
    r->kv_heads_per_gpu = kv_heads_per_gpu(m, tp);
    r->kv_head_replication = kv_replication(m, tp);
    r->max_tp_without_replication = m->mla ? 1 : m->n_kv_heads;
    r->kv_bytes_per_token_per_layer_per_gpu = kv_per_layer(m, tp, p->kv_dtype);

    /* TP sweep (one pipeline stage): KV per GPU stops falling at the KV head count. */
    for (uint32_t t = 1; t <= 1024 && r->n_tp_rows < KVC_PLAN_SWEEP_MAX; t *= 2) {
        if (m->n_heads % t || (!m->mla && m->n_kv_heads && m->n_kv_heads % t && t % m->n_kv_heads))
            continue;
        stage_t s = {.first_layer = 0, .n_layers = m->n_layers};
        stage_weights(m, t, p->weight_dtype, true, true, false, &s);
        r->tp_rows[r->n_tp_rows++] = (kvc_plan_tp_row_t){
            .tp = t,
            .kv_heads_per_gpu = kv_heads_per_gpu(m, t),
            .replication = kv_replication(m, t),
            .kv_bytes_per_token_per_gpu = kv_per_layer(m, t, p->kv_dtype) * attn_layers(m),
            .weight_bytes_per_gpu = s.weight_bytes,
        };
    }
    stage_t whole = {.first_layer = 0, .n_layers = m->n_layers};
    stage_weights(m, 1, p->weight_dtype, true, true, false, &whole);
    r->weight_bytes_total = whole.weight_bytes;
    /* the recurrent state's inventory, whole model (section 15) */
    state_per_layer(m, 1, p->ssm_state_fp32, &r->conv_state_bytes_per_layer,
                    &r->ssm_state_bytes_per_layer);
    r->state_bytes_per_seq =
        m->n_recurrent_layers * (r->conv_state_bytes_per_layer + r->ssm_state_bytes_per_layer);
    r->all_attention_kv_bytes_per_token = kv_per_layer(m, 1, p->kv_dtype) * m->n_layers;
}

/* One LoRA adapter's bytes per layer on one GPU of a TP group: A (in x r) and B (r x out) in 16
 * bits on q, k, v, o, gate, up and down (S-LoRA shards them as the base weights). */
static uint64_t lora_layer_bytes(const kvc_plan_model_t *m, uint32_t tp, uint32_t rank)
{
    const uint64_t H = m->hidden_size, q = (uint64_t)m->n_heads * m->head_dim,
                   kv = (uint64_t)m->n_kv_heads * m->head_dim,
                   o = (uint64_t)m->n_heads * m->v_head_dim,
                   I = m->intermediate_size ? m->intermediate_size : m->moe_intermediate_size;
    const uint64_t per_rank = (H + q) + 2 * (H + kv) + (o + H) + 3 * (H + I);
    return kvc__ceil_div(2 * per_rank * rank, tp);
}

/* One pipeline stage of section 2: layers [first, first + n), its weights,
 * activations, graphs and the pool its budget leaves. */
static int plan_stage(calc_t *c, uint32_t i, uint32_t first, char *msg, size_t len)
{
    const kvc_plan_model_t *m = c->m;
    const kvc_plan_params_t *p = c->p;
    kvc_plan_result_t *r = c->r;
    const uint32_t tp = p->tp, pp = p->pp;
    stage_t *s = &c->stages[i];
    memset(s, 0, sizeof *s);
    s->first_layer = first;
    s->n_layers = m->n_layers / pp + (i < m->n_layers % pp);
    for (uint32_t l = first; l < first + s->n_layers; l++) {
        s->n_recurrent += kvc__layer_recurrent(m, l);
        s->n_attn += kvc__layer_attention(m, l);
    }
    s->n_sliding = attn_layers(m)
                       ? (uint32_t)llround((double)m->n_sliding_layers * s->n_attn / attn_layers(m))
                       : 0;
    {
        uint64_t conv, ssm;
        state_per_layer(m, tp, p->ssm_state_fp32, &conv, &ssm);
        s->state_bytes = s->n_recurrent * (conv + ssm);
    }
    stage_weights(m, tp, p->weight_dtype, i == 0, i == pp - 1, pp > 1, s);
    if (p->weight_bytes != KVC_PLAN_AUTO) s->weight_bytes = p->weight_bytes;
    s->act_fwd = kvc__mul_sat(kvc__mul_sat(p->max_num_batched_tokens, s->act_elems), 2);
    s->act_sampler =
        i == pp - 1 ? (uint64_t)p->max_num_seqs * m->vocab_size * KVC__SAMPLER_BYTES_PER_LOGIT : 0;
    s->act_text = KVC_MAX(s->act_fwd, s->act_sampler);
    uint64_t act_auto = s->act_text;
    if (i == 0 && m->image_tokens) {
        /* The profile run encodes as many images as the encoder budget holds, keeps their
         * embeddings for the prefill, then runs the forward at the token budget. */
        const uint64_t H = m->vision_hidden;
        r->encoder_live_elems_per_token =
            H ? 5 * H + kvc__ceil_div(3 * H + (uint64_t)m->vision_intermediate, tp) : 0;
        s->enc_act = kvc__mul_sat(kvc__mul_sat(r->encoder_images, m->vision_tokens),
                                  2 * r->encoder_live_elems_per_token);
        s->enc_cache = kvc__mul_sat(r->encoder_images, r->encoder_cache_bytes_per_image);
        act_auto = KVC_MAX(KVC_MAX(s->enc_act, s->act_fwd) + s->enc_cache, s->act_sampler);
    }
    s->act = p->activation_bytes != KVC_PLAN_AUTO ? p->activation_bytes : act_auto;
    s->graphs = p->enforce_eager ? 0
                : p->cuda_graph_bytes != KVC_PLAN_AUTO
                    ? p->cuda_graph_bytes
                    : (uint64_t)r->n_cuda_graphs * s->n_layers * KVC__GRAPH_BYTES_PER_LAYER +
                          kvc__mul_sat(kvc__mul_sat(r->max_graph_batch, s->act_elems), 2);
    /* The estimates grow with the model's widths: past the byte bound they would
     * overflow the ledger, so such a plan asks for the measured number instead. */
    if (s->act > KVC_PLAN_MAX_BYTES)
        return kvc__msgf(KVC_EINVAL, msg, len,
                         "the activation estimate (%u tokens x %llu live values x 2 B) is over "
                         "%llu B: pass the measured --activation-memory",
                         p->max_num_batched_tokens, (unsigned long long)s->act_elems,
                         (unsigned long long)KVC_PLAN_MAX_BYTES);
    if (s->graphs > KVC_PLAN_MAX_BYTES)
        return kvc__msgf(KVC_EINVAL, msg, len,
                         "the CUDA graph estimate is over %llu B: pass the measured "
                         "--cuda-graph-memory or --enforce-eager",
                         (unsigned long long)KVC_PLAN_MAX_BYTES);
    s->non_torch = p->non_torch_bytes != KVC_PLAN_AUTO
                       ? p->non_torch_bytes
                       : KVC__NON_TORCH_BYTES + (tp * pp > 1 ? KVC__NON_TORCH_COMM_BYTES : 0);
    s->ctx =
        p->cuda_context_bytes != KVC_PLAN_AUTO ? p->cuda_context_bytes : KVC__CUDA_CONTEXT_BYTES;
    s->kv_per_layer = r->kv_bytes_per_token_per_layer_per_gpu;
    s->kv_per_token = s->kv_per_layer * s->n_attn;
    s->lora_bytes = p->lora_rank ? lora_layer_bytes(m, tp, p->lora_rank) * s->n_layers : 0;
    /* Every term is at most KVC_PLAN_MAX_BYTES (validate, and the checks above), so the
     * signed sum cannot overflow. */
    if (c->kv_explicit) {
        s->pool = (int64_t)KVC_MIN(p->kv_cache_bytes, (uint64_t)INT64_MAX);
    } else {
        s->pool =
            (int64_t)r->budget_bytes - (int64_t)s->weight_bytes - (int64_t)s->act -
            (int64_t)(!p->graphs_outside_budget ? s->graphs : 0) - (int64_t)s->non_torch -
            (int64_t)KVC_MIN(kvc__mul_sat(s->lora_bytes, p->lora_resident), KVC_PLAN_MAX_BYTES);
    }
    /* A stage without attention layers keeps no KV: its pool holds states, one slot per
     * sequence (a pure Mamba-2 model; vLLM sizes such a model's blocks as one state each). */
    s->slot_bytes = s->kv_per_token ? s->kv_per_token * p->block_size : s->state_bytes;
    if (!s->slot_bytes) s->slot_bytes = 1; /* MLP-only stage: holds nothing per sequence */
    if (s->n_attn == 0 && attn_layers(m) > 0 && s->n_recurrent > 0)
        return kvc__msgf(KVC_EINVAL, msg, len,
                         "--pp %u: stage %u (layers %u-%u) holds recurrent state but no attention "
                         "layer; pools of state slots beside pools of KV blocks are not modelled",
                         pp, i, first, first + s->n_layers - 1);
    s->blocks = (double)s->pool / (double)s->slot_bytes;
    return 0;
}

/* 2. The startup ledger, per stage; the stage with the fewest blocks binds. */
static int compute_ledger(calc_t *c, char *msg, size_t len)
{
    const kvc_plan_params_t *p = c->p;
    kvc_plan_result_t *r = c->r;
    const uint32_t tp = p->tp, pp = p->pp, bs = p->block_size;
    const uint64_t visible = c->g->memory_bytes;
    r->budget_bytes = (uint64_t)floor((double)visible * p->gpu_memory_utilization);
    if (!p->enforce_eager) {
        r->max_graph_batch = KVC_MIN(p->max_num_seqs, (uint32_t)KVC__GRAPH_MAX_BATCH);
        for (uint32_t b = 1; b <= r->max_graph_batch; b = b < 8 ? b * 2 : b + 8) r->n_cuda_graphs++;
    }
    /* multimodal: the encoder's budget and the images the profile run encodes at once */
    const kvc_plan_model_t *m = c->m;
    if (m->image_tokens) {
        r->images_per_request = p->images_per_request ? p->images_per_request : 1;
        r->encoder_budget_tokens =
            p->encoder_cache_tokens
                ? p->encoder_cache_tokens
                : KVC_MAX((uint64_t)p->max_num_batched_tokens, (uint64_t)m->image_tokens);
        const uint64_t by_budget = r->encoder_budget_tokens / m->image_tokens;
        r->encoder_images =
            KVC_MAX(1, KVC_MIN(by_budget, (uint64_t)p->max_num_seqs * r->images_per_request));
        r->encoder_cache_bytes_per_image = (uint64_t)m->image_tokens * m->hidden_size * 2;
    }
    const stage_t *st = NULL;
    uint32_t next = 0;
    for (uint32_t i = 0; i < pp; i++) {
        int rc = plan_stage(c, i, next, msg, len);
        if (rc) return rc;
        const stage_t *s = &c->stages[i];
        next += s->n_layers;
        /* the first stage binds unless another has fewer blocks (NaN never binds) */
        if (!st || s->blocks < st->blocks) {
            st = s;
            r->binding_stage = i;
        }
    }
    c->st = st;
    r->layers_per_gpu = st->n_layers;
    r->kv_layers_per_gpu = st->n_attn;
    r->recurrent_layers_per_gpu = st->n_recurrent;
    r->state_bytes_per_seq_per_gpu = st->state_bytes;
    r->sliding_layers_per_gpu = st->n_sliding;
    r->kv_bytes_per_token_per_gpu = st->kv_per_token;
    uint64_t all_stage_kv = 0;
    for (uint32_t i = 0; i < pp; i++) all_stage_kv += c->stages[i].kv_per_token;
    r->kv_replicated_bytes_per_token = all_stage_kv * tp - r->kv_bytes_per_token;

    r->weight_bytes_per_gpu = st->weight_bytes;
    r->weight_linear_params_per_gpu = st->linear;
    r->weight_wide_params_per_gpu = st->wide;
    r->activation_elems_per_token = st->act_elems;
    r->activation_bytes = st->act;
    r->activation_forward_bytes = st->act_fwd;
    r->activation_sampler_bytes = st->act_sampler;
    r->cuda_graph_bytes = st->graphs;
    r->non_torch_bytes = st->non_torch;
    r->cuda_context_bytes = st->ctx;
    r->kv_pool_signed_bytes = st->pool;
    r->kv_pool_bytes_per_gpu = st->pool > 0 ? (uint64_t)st->pool : 0;
    r->num_blocks = r->kv_pool_bytes_per_gpu / st->slot_bytes;
    /* per replica: cp GPUs share each request; a pool of states holds no tokens */
    r->pool_tokens = st->kv_per_token ? r->num_blocks * bs * p->cp : 0;
    if (c->kv_explicit) r->budget_bytes = visible > st->ctx ? visible - st->ctx : 0;
    fill_ledger(r, p, st);
    return 0;
}

/* What startup phase ph needs of stage s and what it has; false when the phase
 * is skipped. */
static bool phase_need(const calc_t *c, kvc_plan_phase_id_t ph, const stage_t *s, uint64_t *need,
                       uint64_t *have)
{
    const kvc_plan_params_t *p = c->p;
    const kvc_plan_result_t *r = c->r;
    const uint64_t visible = c->g->memory_bytes;
    const bool graphs_in = !p->graphs_outside_budget, kv_explicit = c->kv_explicit;
    *need = *have = 0;
    switch (ph) {
    case KVC_PLAN_PHASE_INIT:
        *need = kv_explicit ? s->ctx : r->budget_bytes + s->ctx;
        *have = visible;
        break;
    case KVC_PLAN_PHASE_LOAD_WEIGHTS:
        *need = s->ctx + s->weight_bytes;
        *have = visible;
        break;
    case KVC_PLAN_PHASE_PROFILE:
        *need = s->ctx + s->weight_bytes + s->act + s->non_torch;
        *have = visible;
        break;
    case KVC_PLAN_PHASE_ALLOCATE_KV:
        *need = s->weight_bytes + s->act + (graphs_in ? s->graphs : 0) + s->non_torch +
                (kv_explicit ? (uint64_t)s->pool : s->slot_bytes);
        *have = kv_explicit ? (visible > s->ctx ? visible - s->ctx : 0) : r->budget_bytes;
        break;
    case KVC_PLAN_PHASE_CHECK_MAX_LEN:
        *need = request_bytes(s->kv_per_layer, s->n_attn, s->n_sliding,
                              (uint32_t)cp_share(c->m->sliding_window, p->cp), p->block_size,
                              p->window_freeing, cp_share(r->max_model_len, p->cp)) +
                s->state_bytes;
        *have = s->pool > 0 ? (uint64_t)s->pool : 0;
        break;
    case KVC_PLAN_PHASE_CAPTURE_GRAPHS:
        if (p->enforce_eager) return false;
        *need = s->graphs;
        if (graphs_in) {
            *have = s->graphs; /* reserved in the budget before the pool */
        } else {
            /* Captured after the pool: only what the budget left over is free. */
            uint64_t used =
                s->ctx + (kv_explicit ? s->weight_bytes + s->act + s->non_torch + (uint64_t)s->pool
                                      : r->budget_bytes);
            *have = visible > used ? visible - used : 0;
        }
        break;
    default:
        break;
    }
    return true;
}

/* 3. The startup phases: the first stage that fails a phase names it. */
static void compute_phases(calc_t *c)
{
    kvc_plan_result_t *r = c->r;
    r->failed_phase = -1;
    for (int ph = 0; ph < KVC_PLAN_PHASE__COUNT; ph++) {
        kvc_plan_phase_t *out = &r->phases[ph];
        if (r->failed_phase >= 0) {
            out->status = KVC_PLAN_PHASE_NOT_REACHED;
            continue;
        }
        out->status = KVC_PLAN_PHASE_OK;
        for (uint32_t i = 0; i < c->p->pp; i++) {
            uint64_t need, have;
            if (!phase_need(c, (kvc_plan_phase_id_t)ph, &c->stages[i], &need, &have)) {
                out->status = KVC_PLAN_PHASE_SKIPPED;
                break;
            }
            if (i == r->binding_stage || need > have) {
                out->need_bytes = need;
                out->have_bytes = have;
                out->stage = i;
            }
            if (need > have) {
                out->status = KVC_PLAN_PHASE_FAILED;
                r->failed_phase = ph;
                break;
            }
        }
    }
    r->fits = r->failed_phase < 0;
    /* The largest max_model_len one request of which fits the binding pool. */
    uint64_t lo = 0, hi = UINT64_C(1) << 40;
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (kvc_plan_request_bytes(r, mid) <= r->kv_pool_bytes_per_gpu)
            lo = mid;
        else
            hi = mid;
    }
    r->max_model_len_that_fits = r->kv_pool_bytes_per_gpu ? lo : 0;
}

/* 4. Concurrency and the ceilings on the running batch. */
static void compute_concurrency(calc_t *c)
{
    const kvc_plan_model_t *m = c->m;
    const kvc_plan_gpu_t *g = c->g;
    const kvc_plan_params_t *p = c->p;
    kvc_plan_result_t *r = c->r;
    const stage_t *st = c->st;
    const uint32_t bs = p->block_size;
    const uint64_t req = r->request_tokens;
    r->blocks_per_request = kvc__ceil_div(req, bs);
    r->partial_block_waste_tokens = r->blocks_per_request * bs - req;
    r->kv_bytes_per_request = kvc_plan_request_bytes(r, req);
    r->max_concurrency =
        r->kv_bytes_per_request ? r->kv_pool_bytes_per_gpu / r->kv_bytes_per_request : 0;
    const uint64_t admit = kvc_plan_request_bytes(r, p->prompt_tokens + 1);
    r->admitted_at_prompt = admit ? r->kv_pool_bytes_per_gpu / admit : 0;
    r->ridge_flops_per_byte = r->peak_flops / g->hbm_bytes_per_s;
    r->decode_context = p->prompt_tokens + p->output_tokens / 2;
    const double c_dec = (double)r->decode_context;
    const double heads_gpu = (double)m->n_heads / p->tp;
    /* MLA decodes in the absorbed form: scores against the 576-wide latent, values
     * from the 512-wide latent; prefill expands it into per-head K and V. */
    const double dqk_dec = m->mla ? (double)m->kv_lora_rank + m->qk_rope_head_dim : m->head_dim;
    const double dv_dec = m->mla ? (double)m->kv_lora_rank : m->v_head_dim;
    c->roof = (roof_t){
        .lin_tok = 2 * st->flop_params,
        /* with CP each GPU attends over, and reads, its 1/cp of the context */
        .attn_tok =
            attn_flops_token(m, st->n_attn, st->n_sliding, heads_gpu, dqk_dec, dv_dec, c_dec) /
            p->cp,
        .f_lin = r->peak_flops,
        .f_attn = g->bf16_flops,
        /* a recurrent state is read and written back every step */
        .kv_read =
            (double)st->kv_per_layer *
                ((st->n_attn - st->n_sliding) * c_dec +
                 st->n_sliding * (m->sliding_window ? fmin(c_dec, m->sliding_window) : c_dec)) /
                p->cp +
            2.0 * (double)st->state_bytes,
        .w_dense = fmax(0, (double)st->weight_bytes -
                               (double)(p->weight_bytes != KVC_PLAN_AUTO ? 0 : st->expert_bytes) -
                               (double)st->embed_bytes - (double)st->vision_bytes),
        .w_expert = p->weight_bytes != KVC_PLAN_AUTO ? 0 : (double)st->expert_bytes,
        .k_over_e = m->n_experts ? (double)m->n_experts_active / m->n_experts : 0,
        .bw = g->hbm_bytes_per_s,
    };
    const roof_t *roof = &c->roof;
    r->decode_flops_per_seq = roof->lin_tok + roof->attn_tok;
    r->decode_attention_flops_per_seq = roof->attn_tok;
    r->decode_bytes_per_seq = roof->kv_read;
    r->weight_read_bytes = weight_read(roof, 1);
    /* per byte of KV: a recurrent state's read and write-back are not attention's */
    const double kv_only = roof->kv_read - 2.0 * (double)st->state_bytes;
    r->attention_flops_per_kv_byte = kv_only > 0 ? roof->attn_tok / kv_only : 0;
    {
        const double tpd = p->tp, H = m->hidden_size;
        r->tp_comm_bytes_per_token_layer = p->tp > 1 ? 2 * 2 * H * 2 * (tpd - 1) / tpd : 0;
        if (m->mla) {
            r->dp_attention_pool_tokens = r->pool_tokens * p->tp;
            r->dp_attention_flops_per_kv_byte = r->attention_flops_per_kv_byte * p->tp;
            r->dp_attention_comm_bytes_per_token_layer =
                p->tp > 1 ? 2 * H * 2 * (tpd - 1) / tpd : 0;
        }
    }
    r->embedding_bytes_not_read = st->embed_bytes;
    r->vision_bytes_per_gpu = st->vision_bytes;
    r->ceilings[KVC_PLAN_CEIL_KV_MEMORY] = r->max_concurrency;
    r->ceilings[KVC_PLAN_CEIL_COMPUTE] = ridge_batch(roof, 1, true);
    r->ceilings[KVC_PLAN_CEIL_MAX_NUM_SEQS] = p->max_num_seqs;
    r->ceilings[KVC_PLAN_CEIL_MAX_NUM_BATCHED_TOKENS] =
        p->max_num_batched_tokens / (1 + p->spec_tokens);
    roof_t w_only = *roof;
    w_only.attn_tok = 0;
    r->compute_weights_only = ridge_batch(&w_only, 1, false);
    /* Dense: B x 2 x params / peak = weight bytes / bandwidth, so B* = ridge x weight bytes /
     * (2 x params): the ridge point itself for 16-bit weights (2 FLOP per 2-byte weight). */
    r->compute_weights_only_exact =
        w_only.w_expert > 0 ? 0 : (w_only.w_dense / w_only.bw) / token_time(&w_only);
    r->binding_ceiling = KVC_PLAN_CEIL_KV_MEMORY;
    for (int i = 1; i < KVC_PLAN_CEIL__COUNT; i++)
        if (r->ceilings[i] < r->ceilings[r->binding_ceiling])
            r->binding_ceiling = (kvc_plan_ceiling_id_t)i;
}

/* 5. Sliding windows, whole model at the context. */
static void compute_sliding(calc_t *c)
{
    const kvc_plan_model_t *m = c->m;
    const kvc_plan_params_t *p = c->p;
    kvc_plan_result_t *r = c->r;
    const uint64_t per_layer_model = kv_per_layer(m, 1, p->kv_dtype);
    r->swa_bytes_with_freeing =
        request_bytes(per_layer_model, attn_layers(m), m->n_sliding_layers, m->sliding_window,
                      p->block_size, true, r->context_tokens);
    r->swa_bytes_without_freeing = request_bytes(per_layer_model, attn_layers(m), 0, 0,
                                                 p->block_size, false, r->context_tokens);
    r->kv_bytes_per_request_model =
        p->window_freeing ? r->swa_bytes_with_freeing : r->swa_bytes_without_freeing;
    /* no attention layer, no KV: nothing to save */
    r->sliding_window_saving =
        r->swa_bytes_without_freeing
            ? 1.0 - (double)r->swa_bytes_with_freeing / (double)r->swa_bytes_without_freeing
            : 0;
    r->sliding_window_saving_limit =
        attn_layers(m) ? (double)m->n_sliding_layers / attn_layers(m) : 0;
}

/* Attention FLOPs of a whole-model prefill of n tokens (causal pairs counted once). */
static double prefill_attention(const kvc_plan_model_t *m, double n)
{
    const double dqk_pre = m->head_dim, dv_pre = m->v_head_dim;
    return 2.0 * m->n_heads * (dqk_pre + dv_pre) *
           ((attn_layers(m) - m->n_sliding_layers) * causal_pairs(n, 0) +
            m->n_sliding_layers * causal_pairs(n, m->sliding_window));
}

/* 6. Prefill FLOPs at the context: linear layers for every token, the LM head for
 * the last one, attention over causal pairs counted once. */
static void compute_prefill(calc_t *c)
{
    const kvc_plan_model_t *m = c->m;
    kvc_plan_result_t *r = c->r;
    const double vocab_params = (double)r->counts.embedding + (double)r->counts.lm_head;
    c->linear_params = (double)r->counts.active - vocab_params;
    const double n = (double)r->context_tokens;
    r->prefill_linear_flops = 2 * n * c->linear_params + 2.0 * m->vocab_size * m->hidden_size;
    r->prefill_attention_flops = prefill_attention(m, n);
    r->prefill_attention_flops_fraction =
        r->prefill_attention_flops / (r->prefill_attention_flops + r->prefill_linear_flops);
}

/* 7. Forks (full attention view, per GPU). */
static void compute_forks(calc_t *c)
{
    const kvc_plan_params_t *p = c->p;
    kvc_plan_result_t *r = c->r;
    const uint32_t bs = p->block_size;
    const uint64_t blk = (uint64_t)bs * c->st->kv_per_token;
    const uint64_t all = kvc__ceil_div(r->request_tokens, bs), prompt_full = p->prompt_tokens / bs;
    /* a recurrent state cannot be shared: every sample and beam holds its own copy */
    const uint64_t st = c->st->state_bytes, ns = p->n_samples, nb = p->beams;
    r->fork_unshared_bytes_samples = kvc__mul_sat(ns * all, blk) + ns * st;
    r->fork_shared_bytes_samples =
        kvc__mul_sat(prompt_full + ns * (all - prompt_full), blk) + ns * st;
    r->fork_unshared_bytes_beams = kvc__mul_sat(nb * all, blk) + nb * st;
    r->fork_shared_bytes_beams = kvc__mul_sat(all + nb - 1, blk) + nb * st;
    r->fork_shared_bytes_beams_diverged =
        kvc__mul_sat(prompt_full + nb * (all - prompt_full), blk) + nb * st;
}

/* 8. Disaggregated prefill: a replica's prefill rate (compute-bound), its KV.
 * Linear layers run at the weights' rate (fp8 on fp8 tensor cores), attention at
 * bf16's. */
static void compute_disagg(calc_t *c)
{
    const kvc_plan_params_t *p = c->p;
    kvc_plan_result_t *r = c->r;
    const double f_eff = r->peak_flops * p->mfu;
    const double gpus_replica = (double)p->tp * p->pp * p->cp;
    const double n_p = (double)p->prompt_tokens;
    const double prompt_lin = 2 * n_p * c->linear_params;
    const double prompt_attn = prefill_attention(c->m, n_p);
    c->prefill_work_s = (prompt_lin / r->peak_flops + prompt_attn / c->g->bf16_flops) / p->mfu;
    r->prompt_linear_flops = prompt_lin;
    r->prompt_attention_flops = prompt_attn;
    r->prefill_work_s = c->prefill_work_s;
    if (p->prefill_tokens_per_s > 0) {
        r->prefill_tokens_per_s = p->prefill_tokens_per_s;
        r->prefill_rate_kind = KVC_PLAN_MEASURED;
    } else {
        r->prefill_tokens_per_s = gpus_replica * n_p / c->prefill_work_s;
        r->prefill_rate_kind = KVC_PLAN_ESTIMATED;
    }
    /* a recurrent model hands over one state per prompt with its attention layers' KV */
    r->prefill_kv_bytes_per_s =
        (double)r->kv_bytes_per_token * r->prefill_tokens_per_s +
        (n_p > 0 ? (double)r->state_bytes_per_seq * r->prefill_tokens_per_s / n_p : 0);
    r->prefill_kv_bytes_per_s_per_gpu = r->prefill_kv_bytes_per_s / gpus_replica;
    r->prefill_kv_bytes_per_s_linear_only =
        (double)r->kv_bytes_per_token * f_eff / (2 * c->linear_params);
    r->link_utilization = r->prefill_kv_bytes_per_s_per_gpu / p->link_bytes_per_s;
    /* what one prompt token hands over: its KV and its share of the prompt's state */
    const double handed_per_token =
        (double)r->kv_bytes_per_token + (n_p > 0 ? (double)r->state_bytes_per_seq / n_p : 0);
    r->link_limited_tokens_per_s =
        handed_per_token > 0 ? p->link_bytes_per_s * gpus_replica / handed_per_token : INFINITY;
}

/* 9. Recompute vs fetch, per GPU, for each tier. */
static void compute_tiers(calc_t *c)
{
    const kvc_plan_gpu_t *g = c->g;
    const kvc_plan_params_t *p = c->p;
    kvc_plan_result_t *r = c->r;
    const double f_eff = r->peak_flops * p->mfu;
    const double gpus_replica = (double)p->tp * p->pp * p->cp;
    r->recompute_s_per_token = 2 * c->linear_params / (gpus_replica * f_eff);
    const double kv_gpu = (double)c->st->kv_per_token;
    r->break_even_bytes_per_s = kv_gpu / r->recompute_s_per_token;
    /* Recomputing a prefix of n tokens also pays its causal attention, on average
     * attention(n) / n FLOPs per token at the bf16 rate: it grows with n. */
    static const uint64_t prefixes[] = {1024, 4096, 32768, 131072, 1048576};
    r->n_recompute = 0;
    for (size_t i = 0; i < KVC_ARRAY_LEN(prefixes) && r->n_recompute < KVC_PLAN_RECOMPUTE_ROWS;
         i++) {
        if (prefixes[i] > r->max_model_len) break;
        const double n = (double)prefixes[i];
        const double attn_s =
            prefill_attention(c->m, n) / n / (gpus_replica * g->bf16_flops * p->mfu);
        kvc_plan_recompute_row_t *x = &r->recompute[r->n_recompute++];
        x->prefix_tokens = prefixes[i];
        x->recompute_s_per_token = r->recompute_s_per_token + attn_s;
        x->attention_extra = attn_s / r->recompute_s_per_token;
        x->break_even_bytes_per_s = kv_gpu / x->recompute_s_per_token;
    }
    const struct {
        const char *name;
        double bw, lat;
    } tiers[KVC_PLAN_TIERS] = {
        {"hbm", g->hbm_bytes_per_s, KVC__LATENCY_HBM_S},
        {"host", p->host_bytes_per_s > 0 ? p->host_bytes_per_s : g->pcie_bytes_per_s,
         KVC__LATENCY_HOST_S},
        {"nvme", p->nvme_bytes_per_s, KVC__LATENCY_NVME_S},
        {"network", p->network_bytes_per_s, KVC__LATENCY_NETWORK_S},
    };
    for (int i = 0; i < KVC_PLAN_TIERS; i++) {
        kvc_plan_tier_t *t = &r->tiers[i];
        t->name = tiers[i].name;
        t->bytes_per_s = tiers[i].bw;
        t->latency_s = tiers[i].lat;
        if (!(t->bytes_per_s > 0)) {
            t->fetch_s_per_token = INFINITY;
            t->speedup = 0;
            t->min_tokens_to_win = KVC_PLAN_UNBOUNDED;
            t->max_shared_fraction = 0;
            continue;
        }
        t->fetch_s_per_token = kv_gpu / t->bytes_per_s;
        t->speedup = r->recompute_s_per_token / t->fetch_s_per_token;
        const double gain = r->recompute_s_per_token - t->fetch_s_per_token;
        /* A gain so small that the count does not fit 64 bits never wins either. */
        const double n_win = gain > 0 ? ceil(t->latency_s / gain) : INFINITY;
        t->min_tokens_to_win = n_win < 0x1p64 ? (uint64_t)n_win : KVC_PLAN_UNBOUNDED;
        t->max_shared_fraction = fmax(0, 1 - r->break_even_bytes_per_s / t->bytes_per_s);
    }
    const uint64_t sizes[3] = {
        (uint64_t)p->block_size * c->st->kv_per_layer,
        (uint64_t)p->block_size * c->st->kv_per_token,
        kvc__mul_sat(kvc__ceil_div(p->prompt_tokens, p->block_size) * p->block_size,
                     c->st->kv_per_token),
    };
    for (int i = 0; i < 3; i++) {
        const kvc_plan_tier_t *host = &r->tiers[1];
        r->copy_bytes[i] = sizes[i];
        r->copy_bytes_per_s[i] =
            host->bytes_per_s > 0
                ? (double)sizes[i] / ((double)sizes[i] / host->bytes_per_s + host->latency_s)
                : 0;
    }
    r->ssd_write_bytes_per_s =
        p->ssd_write_bytes_per_s > 0 ? p->ssd_write_bytes_per_s : r->prefill_kv_bytes_per_s_per_gpu;
    r->ssd_endurance_days = p->ssd_endurance_bytes / r->ssd_write_bytes_per_s / 86400;
}

/* 10. Little's law, per replica. */
static void compute_little(calc_t *c)
{
    const kvc_plan_params_t *p = c->p;
    kvc_plan_result_t *r = c->r;
    const little_t l = {
        .f = &c->roof,
        .mfu = p->mfu,
        .mbu = p->mbu,
        .out_tokens = (double)p->output_tokens,
        .prefill_work_s = c->prefill_work_s,
        .replica_gpus = (double)p->tp * p->pp * p->cp,
        .tp = p->tp * p->cp,
        .pp = p->pp,
    };
    /* The largest arrival rate whose resident count stays under the hard ceilings:
     * N*(lam) grows with lam, so bisect. */
    const uint64_t cap = KVC_MIN(r->ceilings[KVC_PLAN_CEIL_KV_MEMORY],
                                 KVC_MIN(r->ceilings[KVC_PLAN_CEIL_MAX_NUM_SEQS],
                                         r->ceilings[KVC_PLAN_CEIL_MAX_NUM_BATCHED_TOKENS]));
    double lo = 0, hi = (double)cap / time_in_system(&l, 0, 0);
    for (int i = 0; i < 80 && cap; i++) {
        double mid = (lo + hi) / 2, nm;
        if (little_solve(&l, mid, &nm, NULL) && nm <= (double)cap)
            lo = mid;
        else
            hi = mid;
    }
    r->little_max_arrival_rate = lo;
    /* Which limit stopped it: just past lo, either N crosses the ceiling, or there is no
     * fixed point at all (the GPUs cannot keep up). */
    double nm;
    r->little_max_by_ceiling = cap && little_solve(&l, lo * 1.001 + 1e-12, &nm, NULL);
    /* Default: half what the ceilings sustain, so the fixed point shows a loaded system. */
    r->arrival_rate_auto = p->arrival_rate == 0;
    r->arrival_rate = r->arrival_rate_auto ? 0.5 * lo * p->dp : p->arrival_rate;
    const double lam = r->arrival_rate / p->dp;
    r->arrival_rate_per_replica = lam;
    r->little_prefill_s = c->prefill_work_s / p->tp;
    r->little_naive_resident = lam * time_in_system(&l, 1, 0);
    double n = 0;
    r->little_stable = little_solve(&l, lam, &n, &r->little_iterations);
    /* Recompute riding on a memory-bound decode step: the compute it leaves idle, in tokens. */
    {
        const roof_t *f = &c->roof;
        const double tok = f->lin_tok / f->f_lin; /* a short prefix: linear FLOPs only */
        for (int i = 0; i < 2; i++) {
            const double b = i == 0 ? 1 : (r->little_stable ? fmax(1, round(n)) : 1);
            const double mem = (weight_read(f, b) + b * f->kv_read) / f->bw;
            const double spare = mem - b * token_time(f);
            const double free_tok = spare > 0 ? floor(spare / tok) : 0;
            const uint64_t v = free_tok < 0x1p63 ? (uint64_t)free_tok : UINT64_MAX;
            if (i == 0)
                r->recompute_free_tokens_batch_1 = v;
            else
                r->recompute_free_tokens_at_n = v;
        }
    }
    if (r->little_stable) {
        r->little_resident = n;
        r->little_step_s = step_time(&l, n, lam);
        r->little_time_in_system = time_in_system(&l, n, lam);
    } else {
        r->little_resident = INFINITY;
        r->little_step_s = INFINITY;
        r->little_time_in_system = INFINITY;
    }
}

/* 11. Speculative decoding: k drafts per sequence ride in the step's token budget. */
typedef struct {
    const roof_t *f;
    double draft_bytes; /* the draft model's weights per GPU, read once per draft step */
    double draft_flops; /* its FLOPs per token per GPU */
    double a;           /* per-token acceptance */
} spec_t;

/* Expected tokens per sequence and step: the target's own token plus each draft i, accepted
 * with the i drafts before it, a^i: 1 + a + ... + a^k. */
static double spec_tokens_per_step(double a, uint32_t k)
{
    double t = 0, ai = 1;
    for (uint32_t i = 0; i <= k; i++, ai *= a) t += ai;
    return t;
}

/* Seconds of one step of b sequences verifying k drafts each, at peak (the roofline of
 * section 4): the verification reads the weights and the KV once and multiplies (1 + k)
 * tokens per sequence; the draft runs k steps of its own. */
static double spec_step_s(const spec_t *s, double b, uint32_t k)
{
    const roof_t *f = s->f;
    const double verify =
        fmax((weight_read(f, b * (1 + k)) + b * f->kv_read) / f->bw, b * (1 + k) * token_time(f));
    const double draft = k * fmax(s->draft_bytes / f->bw, b * s->draft_flops / f->f_lin);
    return verify + draft;
}

/* Tokens/s with k drafts over tokens/s without, at batch b. */
static double spec_speedup(const spec_t *s, double b, uint32_t k)
{
    return spec_tokens_per_step(s->a, k) * spec_step_s(s, b, 0) / spec_step_s(s, b, k);
}

static void compute_spec(calc_t *c)
{
    const kvc_plan_params_t *p = c->p;
    kvc_plan_result_t *r = c->r;
    uint32_t ks[KVC_PLAN_SPEC_ROWS], n = 0;
    if (p->spec_tokens) ks[n++] = p->spec_tokens;
    static const uint32_t defaults[] = {1, 2, 4, 8};
    for (size_t i = 0; i < KVC_ARRAY_LEN(defaults) && n < KVC_PLAN_SPEC_ROWS; i++)
        if (defaults[i] != p->spec_tokens && defaults[i] + 1 <= p->max_num_batched_tokens)
            ks[n++] = defaults[i];
    const spec_t sp = {
        .f = &c->roof,
        .draft_bytes = (double)linear_bytes(p->spec_draft_params, p->weight_dtype) / p->tp,
        .draft_flops = 2.0 * (double)p->spec_draft_params / p->tp,
        .a = p->spec_acceptance,
    };
    r->spec_context = r->decode_context;
    r->spec_draft_bytes_per_gpu = (uint64_t)sp.draft_bytes;
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t k = ks[i];
        /* The first batch from which speculation loses and keeps losing up to the bound:
         * scanned down from the top (the sign can change more than once when the draft has a
         * cost of its own), 16 batches at a time, then batch by batch within the last stride. */
        uint64_t loses = KVC_PLAN_UNBOUNDED;
        uint64_t b = KVC_PLAN_SPEC_MAX_BATCH;
        while (b > 16 && spec_speedup(&sp, (double)(b - 16), k) < 1) b -= 16;
        if (spec_speedup(&sp, (double)b, k) < 1) {
            loses = b;
            while (loses > 1 && spec_speedup(&sp, (double)(loses - 1), k) < 1) loses--;
        }
        r->spec[i] = (kvc_plan_spec_row_t){
            .spec_tokens = k,
            .max_batch_by_tokens = p->max_num_batched_tokens / (1 + k),
            .compute_bound_batch = ridge_batch(&c->roof, 1.0 + k, true),
            .tokens_per_step = spec_tokens_per_step(sp.a, k),
            .kv_slots_per_seq = k,
            .speedup_at_batch_1 = spec_speedup(&sp, 1, k),
            .loses_from_batch = loses,
        };
    }
    r->n_spec = n;
    static const uint32_t batches[KVC_PLAN_SPEC_BEST_ROWS] = {1, 4, 16, 64, 256, 1024, 4096};
    r->n_spec_best = 0;
    for (int i = 0; i < KVC_PLAN_SPEC_BEST_ROWS; i++) {
        kvc_plan_spec_best_t *b = &r->spec_best[r->n_spec_best++];
        *b = (kvc_plan_spec_best_t){.batch = batches[i], .best_k = 0, .speedup = 1};
        for (uint32_t k = 1; k <= 8; k++) {
            if ((uint64_t)batches[i] * (1 + k) > p->max_num_batched_tokens) break;
            const double x = spec_speedup(&sp, batches[i], k);
            if (x > b->speedup) {
                b->speedup = x;
                b->best_k = k;
            }
        }
    }
}

/* 12. Tenancy: what one request costs in the pool, in KV tokens. */
static void compute_tenancy(calc_t *c)
{
    kvc_plan_result_t *r = c->r;
    const uint64_t lens[KVC_PLAN_TENANT_MAX] = {r->request_tokens, r->max_model_len,
                                                c->p->tenant_tokens};
    for (int i = 0; i < KVC_PLAN_TENANT_MAX; i++) {
        if (!lens[i]) continue;
        kvc_plan_tenant_row_t *t = &r->tenants[r->n_tenants++];
        t->tokens = lens[i];
        t->bytes_per_gpu = kvc_plan_request_bytes(r, lens[i]);
        t->pool_share = r->kv_pool_bytes_per_gpu
                            ? (double)t->bytes_per_gpu / (double)r->kv_pool_bytes_per_gpu
                            : INFINITY;
        t->per_pool = t->bytes_per_gpu ? r->kv_pool_bytes_per_gpu / t->bytes_per_gpu : 0;
    }
    r->tokens_per_percent = r->pool_tokens / 100;
    r->tenant_over_max_model_len = c->p->tenant_tokens > r->max_model_len;
    /* LoRA: adapters resident in the pool; prefixes shared only within one adapter */
    const kvc_plan_params_t *p = c->p;
    if (p->lora_rank) {
        r->lora_adapter_bytes = lora_layer_bytes(c->m, 1, p->lora_rank) * c->m->n_layers;
        r->lora_adapter_bytes_per_gpu = c->st->lora_bytes;
        r->lora_resident_bytes_per_gpu = kvc__mul_sat(c->st->lora_bytes, p->lora_resident);
        r->lora_pool_tokens_lost = r->lora_resident_bytes_per_gpu / c->st->kv_per_token * p->cp;
        r->lora_prefix_blocks = kvc__mul_sat(kvc__ceil_div(p->prompt_tokens, p->block_size),
                                             KVC_MAX(p->lora_resident, 1));
    }
    r->image_bytes_per_gpu = (uint64_t)c->m->image_tokens * c->st->kv_per_token;
    if (c->m->image_tokens) {
        /* the profile's phases on the first stage, where the vision tower runs */
        const stage_t *s0 = &c->stages[0];
        r->encoder_activation_bytes = s0->enc_act;
        r->encoder_cache_bytes = s0->enc_cache;
        r->phase_bytes[0] = s0->enc_act + s0->enc_cache;
        r->phase_bytes[1] = s0->act_fwd + s0->enc_cache;
        r->phase_bytes[2] = c->stages[c->p->pp - 1].act_sampler;
        r->peak_phase = 0;
        for (int i = 1; i < 3; i++)
            if (r->phase_bytes[i] > r->phase_bytes[r->peak_phase]) r->peak_phase = i;
        r->text_only_activation_bytes = s0->act_text;
        const uint64_t extra = s0->act > s0->act_text ? s0->act - s0->act_text : 0;
        r->encoder_pool_tokens_lost = s0->kv_per_token ? extra / s0->kv_per_token * c->p->cp : 0;
        r->image_request_bytes_per_gpu = kvc_plan_request_bytes(
            r, r->request_tokens + (uint64_t)r->images_per_request * c->m->image_tokens);
    }
}

/* 13. Long context: one request at the context, its KV per GPU under context parallelism, its
 * prefill time, and the ring's K/V traffic against the attention it hides behind.  Ring
 * attention (load-balanced, zigzag): each of the cp GPUs holds ceil(n / cp) tokens; in each of
 * cp steps per layer it sends its chunk's K/V to the next GPU while attending over the chunk it
 * has, n^2 / (2 cp^2) causal pairs per GPU and step. */
static void compute_longctx(calc_t *c)
{
    const kvc_plan_model_t *m = c->m;
    const kvc_plan_gpu_t *g = c->g;
    const kvc_plan_params_t *p = c->p;
    kvc_plan_result_t *r = c->r;
    const double n = (double)r->context_tokens, cp = p->cp;
    r->kv_bytes_per_request_context = r->kv_bytes_per_request_model;
    r->kv_bytes_per_request_per_gpu = kvc_plan_request_bytes(r, r->context_tokens);
    r->prefill_seconds =
        (r->prefill_linear_flops / r->peak_flops + r->prefill_attention_flops / g->bf16_flops) /
        p->mfu / ((double)p->tp * p->cp);
    r->ring_inter_node = (uint64_t)p->tp * p->cp > p->gpus_per_node;
    r->ring_link_bytes_per_s = r->ring_inter_node                ? p->link_bytes_per_s
                               : g->interconnect_bytes_per_s > 0 ? g->interconnect_bytes_per_s
                                                                 : g->pcie_bytes_per_s;
    if (p->cp <= 1) return;
    r->ring_chunk_tokens = cp_share(r->context_tokens, p->cp);
    r->ring_bytes_per_step =
        kvc__mul_sat(r->ring_chunk_tokens, r->kv_bytes_per_token_per_layer_per_gpu);
    r->ring_step_s = (double)r->ring_bytes_per_step / r->ring_link_bytes_per_s;
    const double pair_flops =
        2.0 * ((double)m->head_dim + m->v_head_dim) * ((double)m->n_heads / p->tp);
    r->ring_attention_step_s = n * n / (2 * cp * cp) * pair_flops / (g->bf16_flops * p->mfu);
    r->ring_hidden = r->ring_step_s <= r->ring_attention_step_s;

    /* decode: the partial softmax results of each attention layer, all-gathered */
    const double dv_dec = m->mla ? (double)m->kv_lora_rank : m->v_head_dim;
    const uint64_t heads_gpu = m->n_heads / p->tp;
    r->cp_decode_bytes_per_token_layer =
        (uint64_t)(p->cp - 1) * heads_gpu * ((uint64_t)dv_dec + 2) * 4;
    r->cp_decode_layers = c->st->n_attn;
    r->cp_decode_latency_s =
        r->ring_inter_node ? KVC__COLLECTIVE_LATENCY_INTER_S : KVC__COLLECTIVE_LATENCY_S;
    uint64_t b = r->ceilings[r->binding_ceiling];
    if (b == KVC_PLAN_UNBOUNDED || b < 1) b = 1;
    r->cp_decode_batch = b;
    const roof_t *f = &c->roof;
    for (int i = 0; i < 2; i++) {
        const double bb = i ? (double)b : 1;
        r->cp_decode_comm_s[i] =
            r->cp_decode_layers *
            (bb * (double)r->cp_decode_bytes_per_token_layer / r->ring_link_bytes_per_s +
             r->cp_decode_latency_s);
        const double mem = (weight_read(f, bb) + bb * f->kv_read) / (f->bw * p->mbu);
        const double comp = bb * token_time(f) / p->mfu;
        r->cp_decode_step_s[i] = p->pp * fmax(mem, comp);
    }
}

static uint64_t gcd_u64(uint64_t a, uint64_t b)
{
    while (b) {
        const uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* 15. Recurrent state: what a sequence holds whatever its length, how many fit, and what
 * prefix caching costs and loses when a recurrent layer can only resume from a saved state
 * (a checkpoint every `interval` tokens), while attention layers resume at any block. */
static void compute_recurrent(calc_t *c)
{
    const kvc_plan_params_t *p = c->p;
    kvc_plan_result_t *r = c->r;
    const stage_t *st = c->st;
    if (!c->m->recurrent) return;
    const uint64_t bs = p->block_size, P = p->prompt_tokens, state = st->state_bytes;
    r->checkpoint_interval = p->state_checkpoint_interval ? p->state_checkpoint_interval : 512;
    r->cached_prefixes = p->cached_prefixes ? p->cached_prefixes : 100;
    r->state_kv_tokens = st->kv_per_token ? state / st->kv_per_token : 0;
    r->request_kv_bytes = r->kv_bytes_per_request - state;
    r->state_only_sequences = state ? r->kv_pool_bytes_per_gpu / state : 0;
    /* a cached prompt: its full blocks of KV, and a state at every interval it covers */
    r->checkpoints_per_prefix = P / r->checkpoint_interval;
    r->prefix_kv_bytes_per_gpu = kvc__mul_sat(P / bs * bs, st->kv_per_token);
    r->prefix_bytes_per_gpu =
        r->prefix_kv_bytes_per_gpu + kvc__mul_sat(r->checkpoints_per_prefix, state);
    r->prefix_bytes_last_checkpoint_per_gpu =
        r->prefix_kv_bytes_per_gpu + (r->checkpoints_per_prefix ? state : 0);
    r->cached_prefixes_bytes_per_gpu = kvc__mul_sat(r->cached_prefixes, r->prefix_bytes_per_gpu);
    r->prefixes_in_pool =
        r->prefix_bytes_per_gpu ? r->kv_pool_bytes_per_gpu / r->prefix_bytes_per_gpu : 0;
    /* every layer resumes at a multiple of both the block and the interval; without attention
     * layers (pure Mamba-2) only the checkpoints count */
    const uint64_t g = gcd_u64(bs, r->checkpoint_interval);
    r->restart_boundary_tokens =
        st->kv_per_token ? kvc__mul_sat(bs / g, r->checkpoint_interval) : r->checkpoint_interval;
    r->mean_recomputed_tokens = (double)r->restart_boundary_tokens / 2;
    r->mean_recompute_s = r->mean_recomputed_tokens * r->recompute_s_per_token;
    /* a hit never covers the last prompt token */
    r->prompt_resume_tokens = (P - 1) / r->restart_boundary_tokens * r->restart_boundary_tokens;
    r->prompt_recomputed_tokens = P - r->prompt_resume_tokens;
}

/* Whether the GPU's name (at most its 32 bytes) holds `needle`, case-insensitively. */
static bool name_has(const char name[32], const char *needle)
{
    const size_t n = strlen(needle), len = strnlen(name, 32);
    for (size_t i = 0; i + n <= len; i++)
        if (!strncasecmp(name + i, needle, n)) return true;
    return false;
}

/* vLLM's batch defaults (vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults and
 * _set_default_max_num_seqs_and_batched_tokens_args, for the OpenAI server): a GPU with
 * 70 GiB or more that is not an A100 gets 1,024 sequences and 8,192 batched tokens, any
 * other 256 and 2,048; a defaulted token budget is at most max_num_seqs x max_model_len, and
 * a defaulted max_num_seqs at most the token budget. */
static void resolve_batch_defaults(kvc_plan_params_t *q, const kvc_plan_model_t *m,
                                   const kvc_plan_gpu_t *g)
{
    const bool large = g->memory_bytes >= 70 * KVC__GIB && !name_has(g->name, "a100");
    const bool seqs_auto = q->max_num_seqs == 0, tokens_auto = q->max_num_batched_tokens == 0;
    if (seqs_auto) q->max_num_seqs = large ? 1024 : 256;
    if (tokens_auto) {
        uint64_t t = large ? 8192 : 2048;
        const uint64_t max_len = q->max_model_len ? q->max_model_len : m->max_position_embeddings;
        if (max_len) t = KVC_MIN(t, kvc__mul_sat(q->max_num_seqs, max_len));
        q->max_num_batched_tokens = (uint32_t)t;
    }
    if (seqs_auto) q->max_num_seqs = KVC_MIN(q->max_num_seqs, q->max_num_batched_tokens);
}

/* The whole plan, or (startup_only) just sections 1-3: whether it starts, which
 * is all that the re-plans behind the suggestions read. */
static int compute_core(const kvc_plan_model_t *m, const kvc_plan_gpu_t *g,
                        const kvc_plan_params_t *p_in, kvc_plan_result_t *r, bool startup_only,
                        char *msg, size_t len)
{
    kvc_plan_params_t q = *p_in;
    if (!q.cp) q.cp = 1;
    if (!q.gpus_per_node) q.gpus_per_node = 8;
    resolve_batch_defaults(&q, m, g);
    const kvc_plan_params_t *p = &q;
    calc_t c = {.m = m, .g = g, .p = p, .r = r};
    int rc = compute_inputs(&c, msg, len);
    if (rc) return rc;
    r->max_num_seqs_auto = p_in->max_num_seqs == 0;
    r->max_num_batched_tokens_auto = p_in->max_num_batched_tokens == 0;
    compute_kv(&c);
    if ((rc = compute_ledger(&c, msg, len))) return rc;
    compute_phases(&c);
    if (startup_only) return 0;
    compute_concurrency(&c);
    compute_sliding(&c);
    compute_prefill(&c);
    compute_forks(&c);
    compute_disagg(&c);
    compute_tiers(&c);
    compute_little(&c);
    compute_spec(&c);
    compute_tenancy(&c);
    compute_longctx(&c);
    compute_recurrent(&c);
    return 0;
}

/* What would make a refused deployment start: the smallest larger TP, fp8 KV,
 * and the utilization at which the pool would hold one max_model_len request.
 * Each is a re-plan of the startup with one input changed. */
static void suggest(const kvc_plan_model_t *m, const kvc_plan_gpu_t *g, const kvc_plan_params_t *p,
                    kvc_plan_result_t *r)
{
    kvc_plan_result_t alt;
    for (uint32_t t = p->tp * 2; t <= 64 && !r->suggest_tp; t *= 2) {
        kvc_plan_params_t q = *p;
        q.tp = t;
        if (!compute_core(m, g, &q, &alt, true, NULL, 0) && alt.fits) r->suggest_tp = t;
    }
    if (p->kv_dtype != KVC_PLAN_FP8) {
        kvc_plan_params_t q = *p;
        q.kv_dtype = KVC_PLAN_FP8;
        r->suggest_fp8_kv_fits = !compute_core(m, g, &q, &alt, true, NULL, 0) && alt.fits;
    }
    if ((r->failed_phase == KVC_PLAN_PHASE_CHECK_MAX_LEN ||
         r->failed_phase == KVC_PLAN_PHASE_ALLOCATE_KV) &&
        p->kv_cache_bytes == KVC_PLAN_AUTO) {
        /* The budget must cover everything before the pool plus what the failed check
         * asks of the pool (one max_model_len request, or one block). */
        const kvc_plan_phase_t *ph = &r->phases[r->failed_phase];
        const double others = (double)r->budget_bytes - (double)r->kv_pool_signed_bytes;
        const double u = r->failed_phase == KVC_PLAN_PHASE_ALLOCATE_KV
                             ? (double)ph->need_bytes / (double)g->memory_bytes
                             : (others + (double)ph->need_bytes) / (double)g->memory_bytes;
        /* the init phase passed, so the context fits in the memory */
        const double u_max = (double)(g->memory_bytes - r->cuda_context_bytes) / g->memory_bytes;
        r->suggest_utilization = u <= u_max ? ceil(u * 1000) / 1000 : 0;
    }
}

/* One layout row: the plan re-made with tp, cp and the KV dtype changed. */
static bool layout_row(const kvc_plan_model_t *m, const kvc_plan_gpu_t *g,
                       const kvc_plan_params_t *base, uint32_t tp, uint32_t cp, kvc_plan_dtype_t kv,
                       kvc_plan_layout_t *out)
{
    if (m->n_heads % tp || (!m->mla && m->n_kv_heads % tp && tp % m->n_kv_heads)) return false;
    kvc_plan_params_t q = *base;
    q.tp = tp;
    q.cp = cp;
    q.kv_dtype = kv;
    kvc_plan_result_t res, *alt = &res; /* a few KB, as suggest() keeps one */
    const bool ok = !compute_core(m, g, &q, alt, false, NULL, 0);
    if (ok)
        *out = (kvc_plan_layout_t){
            .tp = tp,
            .cp = cp,
            .gpus = tp * cp,
            .kv_dtype = kv,
            .fits = alt->fits,
            .inter_node = alt->ring_inter_node,
            .kv_bytes_per_request_per_gpu = alt->kv_bytes_per_request_per_gpu,
            .weight_bytes_per_gpu = alt->weight_bytes_per_gpu,
            .prefill_seconds = alt->prefill_seconds,
            .ring_bytes_per_step = alt->ring_bytes_per_step,
            .ring_hidden = cp <= 1 || alt->ring_hidden,
        };
    return ok;
}

/* Long contexts: every TP x CP split of the replica's GPUs (TP within a node), and when none
 * starts, what replaces it: more CP ranks, across nodes at the inter-node link, or fp8 KV. */
static void layouts(const kvc_plan_model_t *m, const kvc_plan_gpu_t *g, kvc_plan_result_t *r)
{
    const kvc_plan_params_t *p = &r->params;
    r->n_layouts = r->n_layouts_same_gpus = 0;
    if (p->pp != 1 || (r->context_tokens < 65536 && p->cp <= 1)) return;
    const uint32_t n = p->tp * p->cp;
    bool any = false;
    uint32_t best_tp = 1;
    for (uint32_t t = 1; t <= n && t <= p->gpus_per_node && r->n_layouts < KVC_PLAN_LAYOUT_ROWS;
         t *= 2) {
        if (n % t) continue;
        kvc_plan_layout_t *x = &r->layouts[r->n_layouts];
        if (!layout_row(m, g, p, t, n / t, p->kv_dtype, x)) continue;
        r->n_layouts++;
        any |= x->fits;
        best_tp = t;
    }
    r->n_layouts_same_gpus = r->n_layouts;
    if (any) return;
    /* more CP ranks at the largest TP that fits a node, until one starts (64 times the GPUs) */
    for (uint32_t cp = n / best_tp * 2; (uint64_t)best_tp * cp <= (uint64_t)n * 64 && cp <= 1024 &&
                                        r->n_layouts < KVC_PLAN_LAYOUT_ROWS - 1;
         cp *= 2) {
        kvc_plan_layout_t *x = &r->layouts[r->n_layouts];
        if (!layout_row(m, g, p, best_tp, cp, p->kv_dtype, x)) break;
        r->n_layouts++;
        if (x->fits) break;
    }
    if (kvc_plan_dtype_bits(p->kv_dtype) > 8 && r->n_layouts < KVC_PLAN_LAYOUT_ROWS &&
        layout_row(m, g, p, best_tp, n / best_tp, KVC_PLAN_FP8, &r->layouts[r->n_layouts]))
        r->n_layouts++;
}

/* The weight dtype x KV dtype grid: the same deployment re-planned per pair. */
static void dtype_grid(const kvc_plan_model_t *m, const kvc_plan_gpu_t *g, kvc_plan_result_t *r)
{
    static const kvc_plan_dtype_t w[] = {KVC_PLAN_BF16, KVC_PLAN_FP8, KVC_PLAN_INT8, KVC_PLAN_INT4,
                                         KVC_PLAN_NVFP4};
    static const kvc_plan_dtype_t kv[] = {KVC_PLAN_BF16, KVC_PLAN_FP8, KVC_PLAN_INT8,
                                          KVC_PLAN_NVFP4};
    r->n_dtype_grid = 0;
    for (size_t i = 0; i < KVC_ARRAY_LEN(w); i++)
        for (size_t k = 0; k < KVC_ARRAY_LEN(kv) && r->n_dtype_grid < KVC_PLAN_GRID_ROWS; k++) {
            kvc_plan_params_t q = r->params;
            q.weight_dtype = w[i];
            q.kv_dtype = kv[k];
            q.weight_bytes = KVC_PLAN_AUTO; /* a measured size holds for one dtype only */
            kvc_plan_result_t alt;
            if (compute_core(m, g, &q, &alt, false, NULL, 0)) continue;
            r->dtype_grid[r->n_dtype_grid++] = (kvc_plan_grid_row_t){
                .weight_dtype = w[i],
                .kv_dtype = kv[k],
                .fits = alt.fits,
                .failed_phase = alt.failed_phase,
                .weight_bytes_per_gpu = alt.weight_bytes_per_gpu,
                .kv_pool_bytes_per_gpu = alt.kv_pool_bytes_per_gpu,
                .max_concurrency = alt.max_concurrency,
                .max_model_len_that_fits = alt.max_model_len_that_fits,
            };
        }
}

int kvc_plan_compute(const kvc_plan_model_t *m, const kvc_plan_gpu_t *g, const kvc_plan_params_t *p,
                     kvc_plan_result_t *r, char *msg, size_t len)
{
    if (!m || !g || !p || !r) return kvc__msgf(KVC_EINVAL, msg, len, "missing argument");
    int rc = compute_core(m, g, p, r, false, msg, len);
    if (!rc && !r->fits) suggest(m, g, p, r);
    if (!rc) layouts(m, g, r);
    if (!rc && p->grid_dtypes) dtype_grid(m, g, r);
    return rc;
}
