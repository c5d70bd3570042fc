/* render.c - a plan result as text (the derivation: formula, the numbers
 * substituted, the result and what kind of number it is) or as one JSON
 * object.  Both read only the result, so the CLI and a C caller print the
 * same thing, and every number shown is one the result carries. */
#include "plan_int.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- text ---------------------------------------------------------------- */
typedef struct {
    kvc__sbuf_t b;
    char ring[24][64];
    int next;
} rc_t;

static char *slot(rc_t *c)
{
    char *s = c->ring[c->next];
    c->next = (c->next + 1) % (int)KVC_ARRAY_LEN(c->ring);
    return s;
}
/* Each returns a string valid for the next 23 calls. */
/* A model without attention layers (pure Mamba-2): no KV at all, a state per sequence. */
static bool no_kv(const kvc_plan_result_t *r)
{
    return r->model.recurrent && r->kv_bytes_per_token == 0;
}

static const char *I(rc_t *c, uint64_t v)
{
    return v == KVC_PLAN_UNBOUNDED ? "none" : kvc__fmt_int(slot(c), 64, v);
}
/* A count carried as a double, truncated as a cast would; one too large (or not a
 * number) for 64 bits is shown in %.3g instead of being cast. */
static const char *ID(rc_t *c, double v)
{
    if (v >= 0 && v < 0x1p64) return I(c, (uint64_t)v);
    char *s = slot(c);
    snprintf(s, 64, "%.3g", v);
    return s;
}
/* a x b, exact where it fits 64 bits, else in %.3g. */
static const char *IMUL(rc_t *c, uint64_t a, uint64_t b)
{
    const kvc__u128 v = (kvc__u128)a * b;
    if (v < KVC_PLAN_UNBOUNDED) return I(c, (uint64_t)v);
    return ID(c, (double)a * (double)b);
}
static const char *BY(rc_t *c, uint64_t v)
{
    return kvc__fmt_bytes(slot(c), 64, v);
}
static const char *G(rc_t *c, double v)
{
    return kvc__fmt_gib(slot(c), 64, v);
}
static const char *RT(rc_t *c, double v)
{
    return kvc__fmt_rate(slot(c), 64, v);
}
static const char *N(rc_t *c, double v)
{
    return kvc__fmt_num(slot(c), 64, v);
}
static const char *FL(rc_t *c, double v)
{
    return kvc__fmt_flops(slot(c), 64, v);
}
static const char *TF(rc_t *c, double flops)
{
    char *s = slot(c);
    snprintf(s, 64, "%.5g", flops / 1e12);
    return s;
}
static const char *BIL(rc_t *c, double params)
{
    char *s = slot(c);
    snprintf(s, 64, "%.2f billion", params / 1e9);
    return s;
}
static const char *TIME(rc_t *c, double sec)
{
    char *s = slot(c);
    if (!isfinite(sec))
        snprintf(s, 64, "unbounded");
    else if (sec >= 1)
        snprintf(s, 64, "%.2f s", sec);
    else if (sec >= 1e-3)
        snprintf(s, 64, "%.2f ms", sec * 1e3);
    else if (sec >= 1e-6)
        snprintf(s, 64, "%.2f us", sec * 1e6);
    else
        snprintf(s, 64, "%.1f ns", sec * 1e9);
    return s;
}
static const char *PCT(rc_t *c, double f)
{
    char *s = slot(c);
    if (!isfinite(f))
        snprintf(s, 64, "inf");
    else
        snprintf(s, 64, "%.1f%%", 100 * f);
    return s;
}

#define P(...) kvc__sb_printf(&c->b, __VA_ARGS__)

static const char *cmp(uint64_t need, uint64_t have)
{
    return need <= have ? "<=" : ">";
}

static void header(rc_t *c, const kvc_plan_result_t *r)
{
    const kvc_plan_model_t *m = &r->model;
    const kvc_plan_params_t *p = &r->params;
    const kvc_plan_gpu_t *g = &r->gpu;
    /* Names come from the input (a config's folder, a caller's struct): escaped. */
    char model_name[4 * sizeof m->name], gpu_name[4 * sizeof g->name];
    kvc__escape(model_name, sizeof model_name, m->name);
    kvc__escape(gpu_name, sizeof gpu_name, g->name);
    P("kvcache plan: %s on %u x %s (TP %u x PP %u x DP %u), weights %s, KV %s, block %u\n",
      model_name, r->n_gpus, gpu_name, p->tp, p->pp, p->dp, kvc_plan_dtype_name(p->weight_dtype),
      kvc_plan_dtype_name(p->kv_dtype), p->block_size);
    if (!m->n_heads)
        P("  model    %u layers, no attention", m->n_layers);
    else
        P("  model    %u layers, %u query heads, ", m->n_layers, m->n_heads);
    if (!m->n_heads) {
        /* a pure state-space model */
    } else if (m->mla)
        P("MLA (kv_lora_rank %u + qk_rope_head_dim %u; q/k head %u, v head %u)", m->kv_lora_rank,
          m->qk_rope_head_dim, m->head_dim, m->v_head_dim);
    else
        P("%u KV heads x head_dim %u", m->n_kv_heads, m->head_dim);
    P(", hidden %u, vocab %u%s\n", m->hidden_size, m->vocab_size,
      m->tie_embeddings ? " (tied embeddings)" : "");
    if (m->n_experts)
        P("           MoE: %u routed experts of width %u, %u per token, %u shared, %u dense "
          "layers\n",
          m->n_experts, m->moe_intermediate_size, m->n_experts_active,
          m->n_shared_experts + (m->shared_expert_intermediate_size ? 1 : 0), m->n_dense_layers);
    if (m->sliding_window && m->chunked_attention)
        P("           chunked attention (%s-token chunks) on %u of %u layers, planned as a window "
          "of the chunk\n",
          I(c, m->sliding_window), m->n_sliding_layers, m->n_layers);
    else if (m->sliding_window)
        P("           sliding window %s tokens on %u of %u layers\n", I(c, m->sliding_window),
          m->n_sliding_layers, m->n_layers);
    if (m->recurrent && m->layer_pattern[0]) {
        kvc__layer_counts_t lc;
        kvc__layer_counts(m, &lc);
        P("           %s: %u %s layers hold a fixed state, %u attend, %u MLP and %u MoE layers "
          "(one block each)\n",
          lc.attention ? "hybrid" : "attention-free", lc.recurrent,
          kvc_plan_recurrent_name(m->recurrent), lc.attention, lc.mlp, lc.moe);
    } else if (m->recurrent) {
        P("           hybrid: %u %s layers hold a fixed state, %u attend (layer i when i "
          "%% %u = %u)",
          m->n_recurrent_layers, kvc_plan_recurrent_name(m->recurrent),
          m->n_layers - m->n_recurrent_layers, m->attn_layer_period, m->attn_layer_offset);
        if (m->moe_layer_period)
            P("; MoE when i %% %u = %u", m->moe_layer_period, m->moe_layer_offset);
        P("\n");
    }
    if (m->image_tokens) P("           an image takes %s KV tokens\n", I(c, m->image_tokens));
    P("           %s parameters, %s active per token\n", BIL(c, (double)r->counts.total),
      BIL(c, (double)r->counts.active));
    if (r->counts.vision)
        P("           vision tower and projector: %s parameters (a ViT of vision_config's widths, "
          "in 16 bits)\n",
          BIL(c, (double)r->counts.vision));
    P("  gpu      %s: %s visible (%s B), %s HBM, %s TFLOP/s bf16", gpu_name,
      G(c, (double)g->memory_bytes), I(c, g->memory_bytes), RT(c, g->hbm_bytes_per_s),
      TF(c, g->bf16_flops));
    if (g->fp8_flops > 0)
        P(" and %s fp8", TF(c, g->fp8_flops));
    else
        P(" (no fp8 tensor cores)");
    P(" dense, L2 %s, GPU link %s and PCIe %s per direction\n", BY(c, g->l2_bytes),
      g->interconnect_bytes_per_s > 0 ? RT(c, g->interconnect_bytes_per_s) : "none",
      RT(c, g->pcie_bytes_per_s));
    P("  request  %s prompt + %s output tokens; max_model_len %s; max_num_seqs %u; "
      "max_num_batched_tokens %s\n",
      I(c, p->prompt_tokens), I(c, p->output_tokens), I(c, r->max_model_len), p->max_num_seqs,
      I(c, p->max_num_batched_tokens));
    if (r->max_num_seqs_auto || r->max_num_batched_tokens_auto)
        P("           (%s vLLM's default for this GPU: EngineArgs.get_batch_defaults gives 1,024 "
          "and 8,192\n"
          "           on 70 GiB or more unless an A100, else 256 and 2,048)\n",
          r->max_num_seqs_auto && r->max_num_batched_tokens_auto ? "both are"
          : r->max_num_seqs_auto                                 ? "max_num_seqs is"
                                                                 : "max_num_batched_tokens is");
    P("  kinds    [configured] you or a preset gave it; [estimated] our formula, an engine "
      "measures it;\n"
      "           [measured] an engine's number you passed in; [ceiling] an upper bound, not a "
      "prediction;\n"
      "           unlabelled numbers are exact arithmetic on the configured inputs\n");
    P("  units    KiB, MiB, GiB = 2^10, 2^20, 2^30 bytes; GB/s, TB/s = 10^9, 10^12 bytes/s; "
      "FLOP rates dense\n\n");
}

static void sec_kv(rc_t *c, const kvc_plan_result_t *r)
{
    if (no_kv(r)) {
        P("1. KV bytes per token\n"
          "   none: no layer attends (all %u layers are %s mixers), so 0 B per token at any "
          "context;\n"
          "   each sequence holds a fixed state instead, %s (%s per GPU): section 15\n\n",
          r->model.n_layers, kvc_plan_recurrent_name(r->model.recurrent),
          BY(c, r->state_bytes_per_seq), BY(c, r->state_bytes_per_seq_per_gpu));
        return;
    }
    const kvc_plan_model_t *m = &r->model;
    const kvc_plan_params_t *p = &r->params;
    /* bytes per element: nvfp4 keeps 16 e2m1 values and an fp8 scale in 9 bytes */
    const char *eb = p->kv_dtype == KVC_PLAN_NVFP4           ? "0.5625"
                     : kvc_plan_dtype_bits(p->kv_dtype) == 8 ? "1"
                                                             : "2";
    P("1. KV bytes per token\n");
    if (m->mla) {
        P("   formula  (kv_lora_rank + qk_rope_head_dim) x layers x bytes: one latent per token "
          "and layer, no factor 2\n");
        P("   model    (%u + %u) x %u x %s B = %s B (%s) per token\n", m->kv_lora_rank,
          m->qk_rope_head_dim, m->n_layers, eb, I(c, r->kv_bytes_per_token),
          BY(c, r->kv_bytes_per_token));
    } else {
        P("   formula  2 (K and V) x layers x KV heads x head_dim x bytes per element\n");
        if (m->recurrent)
            P("            only the %u attention layers of %u hold KV; the %u recurrent ones a "
              "fixed state (section 15)\n",
              kvc__attn_layers(m), m->n_layers, m->n_recurrent_layers);
        P("   model    2 x %u x %u x %u x %s B = %s B (%s) per token\n", kvc__attn_layers(m),
          m->n_kv_heads, m->head_dim, eb, I(c, r->kv_bytes_per_token),
          BY(c, r->kv_bytes_per_token));
    }
    P("            1,048,576 tokens: %s; max_model_len %s: %s\n",
      G(c, (double)r->kv_bytes_per_token * 1048576.0), I(c, r->max_model_len),
      G(c, (double)r->kv_bytes_per_token * (double)r->max_model_len));
    if (m->mla) {
        P("   per GPU  MLA keeps the whole latent on every GPU of the TP group");
        if (p->pp > 1)
            P("; PP %u: %u of %u layers on the binding stage", p->pp, r->layers_per_gpu,
              m->n_layers);
        P("\n            (%u + %u) x %u x %s B = %s B (%s) per token per GPU\n", m->kv_lora_rank,
          m->qk_rope_head_dim, r->layers_per_gpu, eb, I(c, r->kv_bytes_per_token_per_gpu),
          BY(c, r->kv_bytes_per_token_per_gpu));
    } else {
        if (p->tp == 1)
            P("   per GPU  TP 1: all %u KV heads on the GPU", m->n_kv_heads);
        else if (p->tp <= m->n_kv_heads)
            P("   per GPU  TP %u splits the %u KV heads: %u per GPU", p->tp, m->n_kv_heads,
              r->kv_heads_per_gpu);
        else
            P("   per GPU  TP %u > %u KV heads: each GPU keeps 1 head, and each head sits on %u "
              "GPUs",
              p->tp, m->n_kv_heads, r->kv_head_replication);
        if (p->pp > 1)
            P("; PP %u: %u of %u layers on the binding stage", p->pp, r->layers_per_gpu,
              m->n_layers);
        P("\n            2 x %u x %u x %u x %s B = %s B (%s) per token per GPU\n",
          r->kv_layers_per_gpu, r->kv_heads_per_gpu, m->head_dim, eb,
          I(c, r->kv_bytes_per_token_per_gpu), BY(c, r->kv_bytes_per_token_per_gpu));
    }
    if (r->kv_head_replication <= 1) {
        P("   copies   none: each KV %s lives on one GPU\n", m->mla ? "latent" : "head");
    } else {
        const double all = (double)r->kv_replicated_bytes_per_token + (double)r->kv_bytes_per_token;
        P("   copies   %u of each %s: per token the replica stores %s B, of which %s B (%s) are "
          "copies\n",
          r->kv_head_replication, m->mla ? "latent" : "KV head", ID(c, all),
          I(c, r->kv_replicated_bytes_per_token),
          PCT(c, (double)r->kv_replicated_bytes_per_token / all));
        if (m->mla)
            P("            what does not pay it: pipeline parallelism (splits the layers) or "
              "data-parallel attention\n"
              "            (each GPU attends for its own requests, e.g. SGLang's "
              "--enable-dp-attention): the pool\n"
              "            then holds %s tokens per replica, not %s, and attention does %s FLOP "
              "per KV byte,\n"
              "            not %s; it trades TP's two all-reduces (%s per token and layer) for an "
              "all-to-all\n"
              "            of the hidden state to the experts and back (%s per token and layer)\n",
              I(c, r->dp_attention_pool_tokens), I(c, r->pool_tokens),
              N(c, r->dp_attention_flops_per_kv_byte), N(c, r->attention_flops_per_kv_byte),
              BY(c, (uint64_t)r->tp_comm_bytes_per_token_layer),
              BY(c, (uint64_t)r->dp_attention_comm_bytes_per_token_layer));
        else
            P("            what does not pay it: TP up to %u (the KV head count), then PP (splits "
              "the layers) or DP\n",
              m->n_kv_heads);
    }
    P("   TP    KV heads/GPU  copies   KV/token/GPU   weights/GPU%s\n",
      p->pp > 1 ? "   (at PP 1)" : "");
    for (uint32_t i = 0; i < r->n_tp_rows; i++) {
        const kvc_plan_tp_row_t *t = &r->tp_rows[i];
        char heads[16];
        snprintf(heads, sizeof heads, m->mla ? "1 latent" : "%u", t->kv_heads_per_gpu);
        P("   %-5u %-13s %-8u %-14s %s%s\n", t->tp, heads, t->replication,
          BY(c, t->kv_bytes_per_token_per_gpu), G(c, (double)t->weight_bytes_per_gpu),
          t->tp == p->tp && p->pp == 1 ? "   <- this plan" : "");
    }
    if (m->mla)
        P("   with MLA the KV per GPU never falls with TP; only the weights do\n\n");
    else if (r->n_tp_rows && r->tp_rows[r->n_tp_rows - 1].tp > m->n_kv_heads)
        P("   past TP %u the KV per GPU stops falling while the weights keep halving\n\n",
          m->n_kv_heads);
    else
        P("\n");
}

static const char *ledger_label(const kvc_plan_ledger_entry_t *e, const kvc_plan_result_t *r,
                                char *buf, size_t len)
{
    const bool explicit_kv = r->params.kv_cache_bytes != KVC_PLAN_AUTO;
    if (!strcmp(e->name, "memory_visible"))
        snprintf(buf, len, "memory visible");
    else if (!strcmp(e->name, "budget"))
        snprintf(buf, len, explicit_kv ? "visible - CUDA context" : "x %.2f utilization = budget",
                 r->params.gpu_memory_utilization);
    else if (!strcmp(e->name, "weights"))
        snprintf(buf, len, "- weights");
    else if (!strcmp(e->name, "activation_peak"))
        snprintf(buf, len, "- activation peak");
    else if (!strcmp(e->name, "cuda_graphs"))
        snprintf(buf, len,
                 e->op == KVC_PLAN_OP_OUTSIDE ? "  CUDA graphs (outside)" : "- CUDA graphs");
    else if (!strcmp(e->name, "non_torch"))
        snprintf(buf, len, "- non-torch memory");
    else if (!strcmp(e->name, "cuda_context"))
        snprintf(buf, len, "  CUDA context (outside)");
    else if (!strcmp(e->name, "lora_adapters"))
        snprintf(buf, len, "- resident LoRA adapters");
    else if (!strcmp(e->name, "kv_pool"))
        snprintf(buf, len, explicit_kv ? "= KV pool (configured)" : "= KV pool");
    else
        snprintf(buf, len, "%s", e->name);
    return buf;
}

static const char *ledger_engine(const kvc_plan_ledger_entry_t *e)
{
    if (!strcmp(e->name, "memory_visible")) return "measured (cudaMemGetInfo)";
    if (!strcmp(e->name, "budget")) return "configured";
    if (!strcmp(e->name, "weights")) return "measured after loading";
    if (!strcmp(e->name, "activation_peak")) return "measured in the profile run";
    if (!strcmp(e->name, "cuda_graphs"))
        return e->op == KVC_PLAN_OP_OUTSIDE ? "measured after capture" : "estimated before capture";
    if (!strcmp(e->name, "non_torch")) return "measured in the profile run";
    if (!strcmp(e->name, "cuda_context")) return "present before it measures";
    if (!strcmp(e->name, "lora_adapters")) return "configured (S-LoRA: in the KV pool)";
    if (!strcmp(e->name, "kv_pool"))
        return e->engine == KVC_PLAN_CONFIGURED ? "configured" : "the remainder";
    return kvc_plan_kind_name(e->engine);
}

static void sec_ledger(rc_t *c, const kvc_plan_result_t *r)
{
    const kvc_plan_params_t *p = &r->params;
    const kvc_plan_model_t *m = &r->model;
    P("2. Startup memory ledger, per GPU, in the order an engine runs it");
    if (p->pp > 1)
        P(" (pipeline stage %u binds: the engine takes the fewest blocks)", r->binding_stage);
    P("\n   %-29s %19s %12s  %-11s %s\n", "step", "bytes", "GiB", "ours", "how an engine gets it");
    for (uint32_t i = 0; i < r->n_ledger; i++) {
        const kvc_plan_ledger_entry_t *e = &r->ledger[i];
        char label[64];
        P("   %-29s %19s %12.2f  %-11s %s\n", ledger_label(e, r, label, sizeof label),
          I(c, e->bytes), (double)e->bytes / (double)KVC__GIB, kvc_plan_kind_name(e->kind),
          ledger_engine(e));
    }
    /* How each estimate was made. */
    const uint32_t wb = kvc_plan_dtype_bits(p->weight_dtype);
    if (p->weight_bytes != KVC_PLAN_AUTO)
        P("   weights          measured: %s\n", G(c, (double)r->weight_bytes_per_gpu));
    else
        P("   weights          %s projection params x %s + %s params kept in 16 bits x 2 B "
          "(embeddings, norms%s) = %s\n",
          I(c, r->weight_linear_params_per_gpu),
          p->weight_dtype == KVC_PLAN_NVFP4 ? "(0.5 B + a 1 B fp8 scale per 16)"
          : wb == 4                         ? "(0.5 B + a 4 B scale/zero per 128)"
          : wb == 8                         ? "1 B"
                                            : "2 B",
          I(c, r->weight_wide_params_per_gpu),
          m->n_experts && r->vision_bytes_per_gpu ? ", router, vision tower"
          : m->n_experts                          ? ", router"
          : r->vision_bytes_per_gpu               ? ", vision tower"
                                                  : "",
          G(c, (double)r->weight_bytes_per_gpu));
    static const char *const phase_names[3] = {"encoder", "prefill with images", "decode"};
    if (p->activation_bytes != KVC_PLAN_AUTO) {
        P("   activation peak  measured: %s\n", G(c, (double)r->activation_bytes));
    } else if (m->image_tokens && r->binding_stage == 0) {
        P("   activation peak  the profile run's largest phase (section 16):\n");
        if (r->encoder_live_elems_per_token)
            P("                        encoder: %s images x %u tokens x %s live values x 2 B = %s "
              "+ their\n"
              "                        embeddings %s = %s\n",
              I(c, r->encoder_images), m->vision_tokens, I(c, r->encoder_live_elems_per_token),
              G(c, (double)r->encoder_activation_bytes), G(c, (double)r->encoder_cache_bytes),
              G(c, (double)r->phase_bytes[0]));
        else
            P("                        encoder: not estimated (the config gives no vision "
              "widths): pass\n"
              "                        --activation-memory; its embeddings %s\n",
              G(c, (double)r->encoder_cache_bytes));
        P("                        prefill with images: %s tokens x %s live values x 2 B = %s + "
          "the\n"
          "                        embeddings = %s\n",
          I(c, p->max_num_batched_tokens), I(c, r->activation_elems_per_token),
          G(c, (double)r->activation_forward_bytes), G(c, (double)r->phase_bytes[1]));
        P("                        decode: sampler, %u sequences x %s vocab x %d B = %s\n"
          "                        peak: %s, %s (text only: %s)\n",
          p->max_num_seqs, I(c, m->vocab_size), KVC__SAMPLER_BYTES_PER_LOGIT,
          G(c, (double)r->phase_bytes[2]), phase_names[r->peak_phase],
          G(c, (double)r->activation_bytes), G(c, (double)r->text_only_activation_bytes));
    } else {
        P("   activation peak  max(forward: %s tokens x %s live values x 2 B = %s,\n",
          I(c, p->max_num_batched_tokens), I(c, r->activation_elems_per_token),
          G(c, (double)r->activation_forward_bytes));
        if (r->activation_sampler_bytes)
            P("                        sampler: %u sequences x %s vocab x %d B of fp32 copies = "
              "%s) = %s\n",
              p->max_num_seqs, I(c, m->vocab_size), KVC__SAMPLER_BYTES_PER_LOGIT,
              G(c, (double)r->activation_sampler_bytes), G(c, (double)r->activation_bytes));
        else
            P("                        no sampler on this stage) = %s\n",
              G(c, (double)r->activation_bytes));
    }
    if (p->enforce_eager)
        P("   CUDA graphs      none: --enforce-eager\n");
    else if (p->cuda_graph_bytes != KVC_PLAN_AUTO)
        P("   CUDA graphs      measured: %s%s\n", G(c, (double)r->cuda_graph_bytes),
          p->graphs_outside_budget ? ", captured after the pool, in the slack" : "");
    else
        P("   CUDA graphs      %u graphs (batch 1..%u) x %u layers x %s + %u x %s values x 2 B "
          "= %s%s\n",
          r->n_cuda_graphs, r->max_graph_batch, r->layers_per_gpu,
          BY(c, KVC__GRAPH_BYTES_PER_LAYER), r->max_graph_batch,
          I(c, r->activation_elems_per_token), G(c, (double)r->cuda_graph_bytes),
          p->graphs_outside_budget ? " (outside the budget: captured after the pool)" : "");
    if (p->non_torch_bytes != KVC_PLAN_AUTO)
        P("   non-torch        measured: %s\n", G(c, (double)r->non_torch_bytes));
    else if (p->tp * p->pp > 1)
        P("   non-torch        %s workspaces + %s NCCL and all-reduce buffers (TP x PP = %u) = "
          "%s\n",
          BY(c, KVC__NON_TORCH_BYTES), BY(c, KVC__NON_TORCH_COMM_BYTES), p->tp * p->pp,
          G(c, (double)r->non_torch_bytes));
    else
        P("   non-torch        %s of workspaces (cuBLAS, attention) = %s\n",
          BY(c, KVC__NON_TORCH_BYTES), G(c, (double)r->non_torch_bytes));
    P("   CUDA context     %s%s, outside the budget: it must fit in visible - budget = %s\n",
      p->cuda_context_bytes != KVC_PLAN_AUTO ? "measured " : "",
      G(c, (double)r->cuda_context_bytes),
      G(c, (double)r->gpu.memory_bytes - (double)r->budget_bytes));
    if (p->kv_cache_bytes != KVC_PLAN_AUTO) {
        P("   KV pool          configured: %s (utilization unused, as with an explicit KV "
          "budget)\n",
          G(c, (double)r->kv_pool_bytes_per_gpu));
    } else {
        const bool gin = !p->graphs_outside_budget;
        char lora[80] = "";
        if (r->lora_resident_bytes_per_gpu)
            snprintf(lora, sizeof lora, " - %s", G(c, (double)r->lora_resident_bytes_per_gpu));
        P("   KV pool          %s - %s - %s - %s - %s%s = %s%s\n", G(c, (double)r->budget_bytes),
          G(c, (double)r->weight_bytes_per_gpu), G(c, (double)r->activation_bytes),
          G(c, gin ? (double)r->cuda_graph_bytes : 0), G(c, (double)r->non_torch_bytes), lora,
          G(c, (double)r->kv_pool_signed_bytes),
          r->kv_pool_signed_bytes < 0 ? "  (overdrawn: no pool)" : "");
    }
    if (no_kv(r))
        P("   state slots      floor(%s B / %s B of one sequence's state) = %s slots, one per "
          "sequence\n"
          "                    (no layer attends: the pool holds states, no KV blocks, no "
          "tokens)\n",
          I(c, r->kv_pool_bytes_per_gpu), I(c, r->state_bytes_per_seq_per_gpu),
          I(c, r->num_blocks));
    else
        P("   blocks           floor(%s B / (%u tokens x %s B)) = %s blocks = %s tokens per "
          "replica\n",
          I(c, r->kv_pool_bytes_per_gpu), p->block_size, I(c, r->kv_bytes_per_token_per_gpu),
          I(c, r->num_blocks), I(c, r->pool_tokens));
    P("   to replace an estimate with your engine's number: --weight-memory, "
      "--activation-memory,\n"
      "   --cuda-graph-memory, --non-torch-memory, --cuda-context-memory (the kind becomes "
      "measured), or\n"
      "   give the pool itself with --kv-cache-memory.\n\n");
}

static void phase_line(rc_t *c, const kvc_plan_result_t *r, int ph)
{
    const kvc_plan_phase_t *x = &r->phases[ph];
    const kvc_plan_params_t *p = &r->params;
    if (x->status == KVC_PLAN_PHASE_NOT_REACHED) {
        P("   %-21s not reached\n", kvc_plan_phase_name((kvc_plan_phase_id_t)ph));
        return;
    }
    P("   %-21s %-12s ", kvc_plan_phase_name((kvc_plan_phase_id_t)ph),
      x->status == KVC_PLAN_PHASE_FAILED ? "FAILED" : kvc_plan_phase_status_name(x->status));
    const char *op = cmp(x->need_bytes, x->have_bytes);
    switch ((kvc_plan_phase_id_t)ph) {
    case KVC_PLAN_PHASE_INIT:
        if (p->kv_cache_bytes != KVC_PLAN_AUTO)
            P("CUDA context %s %s %s visible\n", G(c, (double)x->need_bytes), op,
              G(c, (double)x->have_bytes));
        else
            P("budget %s + CUDA context %s = %s %s %s visible\n", G(c, (double)r->budget_bytes),
              G(c, (double)r->cuda_context_bytes), G(c, (double)x->need_bytes), op,
              G(c, (double)x->have_bytes));
        break;
    case KVC_PLAN_PHASE_LOAD_WEIGHTS:
        P("CUDA context + weights = %s %s %s visible\n", G(c, (double)x->need_bytes), op,
          G(c, (double)x->have_bytes));
        break;
    case KVC_PLAN_PHASE_PROFILE:
        P("context + weights + activation peak + non-torch = %s %s %s visible\n",
          G(c, (double)x->need_bytes), op, G(c, (double)x->have_bytes));
        break;
    case KVC_PLAN_PHASE_ALLOCATE_KV:
        if (p->kv_cache_bytes != KVC_PLAN_AUTO)
            P("weights + activation + graphs + non-torch + KV = %s %s visible - context %s\n",
              G(c, (double)x->need_bytes), op, G(c, (double)x->have_bytes));
        else
            P("weights + activation + graphs + non-torch + one %s (%s) = %s %s budget %s\n",
              no_kv(r) ? "state" : "block",
              BY(c, no_kv(r) ? r->state_bytes_per_seq_per_gpu
                             : r->kv_bytes_per_token_per_gpu * p->block_size),
              G(c, (double)x->need_bytes), op, G(c, (double)x->have_bytes));
        break;
    case KVC_PLAN_PHASE_CHECK_MAX_LEN:
        P("one request of max_model_len %s tokens needs %s %s the KV pool's %s\n",
          I(c, r->max_model_len), G(c, (double)x->need_bytes), op, G(c, (double)x->have_bytes));
        break;
    case KVC_PLAN_PHASE_CAPTURE_GRAPHS:
        if (x->status == KVC_PLAN_PHASE_SKIPPED)
            P("--enforce-eager: no graphs\n");
        else if (!p->graphs_outside_budget)
            P("%s of graphs were reserved in the budget (ledger); if the real pool is larger, the "
              "capture runs out of memory\n",
              G(c, (double)x->need_bytes));
        else
            P("graphs %s %s the %s left outside the budget\n", G(c, (double)x->need_bytes), op,
              G(c, (double)x->have_bytes));
        break;
    default:
        P("\n");
    }
}

static void fixes(rc_t *c, const kvc_plan_result_t *r)
{
    if (r->suggest_tp) P("            --tp %u starts (the weights per GPU halve)\n", r->suggest_tp);
    if (r->suggest_fp8_kv_fits)
        P("            --kv-dtype fp8 starts (half the KV bytes per token)\n");
    if (r->suggest_utilization > 0)
        P("            --gpu-memory-utilization %.3f starts (the pool then holds one "
          "max_model_len request)\n",
          r->suggest_utilization);
}

static void sec_phases(rc_t *c, const kvc_plan_result_t *r)
{
    const kvc_plan_params_t *p = &r->params;
    if (r->fits)
        P("3. Does it start?  yes: every startup phase passes\n");
    else
        P("3. Does it start?  NO: it fails at %s\n",
          kvc_plan_phase_name((kvc_plan_phase_id_t)r->failed_phase));
    for (int ph = 0; ph < KVC_PLAN_PHASE__COUNT; ph++) phase_line(c, r, ph);
    if (r->fits) {
        const uint64_t need = r->phases[KVC_PLAN_PHASE_CHECK_MAX_LEN].need_bytes;
        if (no_kv(r)) {
            P("   a request of any length takes one state, %s of the %s pool: %s of them fit at "
              "once\n\n",
              G(c, (double)need), G(c, (double)r->kv_pool_bytes_per_gpu),
              I(c, need ? r->kv_pool_bytes_per_gpu / need : 0));
            return;
        }
        P("   a max_model_len request takes %s of the %s pool: %s of them fit at once (the pool\n"
          "   holds %s tokens of one request)\n\n",
          G(c, (double)need), G(c, (double)r->kv_pool_bytes_per_gpu),
          I(c, need ? r->kv_pool_bytes_per_gpu / need : 0), I(c, r->max_model_len_that_fits));
        return;
    }
    const kvc_plan_phase_t *x = &r->phases[r->failed_phase];
    const double short_by = (double)x->need_bytes - (double)x->have_bytes;
    switch ((kvc_plan_phase_id_t)r->failed_phase) {
    case KVC_PLAN_PHASE_INIT:
        P("   why      the engine asks for %.2f x %s = %s, but after the CUDA context only %s is "
          "free.\n",
          p->gpu_memory_utilization, G(c, (double)r->gpu.memory_bytes),
          G(c, (double)r->budget_bytes),
          G(c, (double)r->gpu.memory_bytes - (double)r->cuda_context_bytes));
        P("   engine   vLLM: \"Free memory on device ... on startup is less than desired GPU "
          "memory utilization\"\n");
        P("   fix      lower --gpu-memory-utilization to at most %.3f\n\n",
          floor(1000 * ((double)r->gpu.memory_bytes - (double)r->cuda_context_bytes) /
                (double)r->gpu.memory_bytes) /
              1000);
        return;
    case KVC_PLAN_PHASE_LOAD_WEIGHTS:
        P("   why      the weights alone (%s per GPU, stage %u) do not fit in the %s the GPU "
          "has: short by %s.\n",
          G(c, (double)r->weight_bytes_per_gpu), x->stage, G(c, (double)x->have_bytes),
          G(c, short_by));
        P("   engine   a CUDA out-of-memory error while loading the weights\n");
        if (kvc_plan_dtype_bits(p->weight_dtype) > 8)
            P("   fixes    more GPUs per replica, or a smaller weight dtype (fp8, int4, nvfp4)\n");
        else if (kvc_plan_dtype_bits(p->weight_dtype) > 4)
            P("   fixes    more GPUs per replica, or a 4-bit weight dtype (int4, nvfp4)\n");
        else
            P("   fixes    more GPUs per replica (the weights are already 4-bit)\n");
        fixes(c, r);
        P("\n");
        return;
    case KVC_PLAN_PHASE_PROFILE:
        P("   why      the profile run's forward pass at %s tokens does not fit next to the "
          "weights: short by %s.\n",
          I(c, p->max_num_batched_tokens), G(c, short_by));
        P("   engine   a CUDA out-of-memory error during memory profiling\n");
        P("   fixes    a smaller --max-num-batched-tokens or --max-num-seqs, or more GPUs\n");
        fixes(c, r);
        P("\n");
        return;
    case KVC_PLAN_PHASE_ALLOCATE_KV:
        P("   why      after the weights, the activation peak, the graphs and the non-torch "
          "memory, the budget\n"
          "            has no room for even one KV block: short by %s.\n",
          G(c, short_by));
        P("   engine   vLLM: \"No available memory for the cache blocks. Try increasing "
          "`gpu_memory_utilization`\n"
          "            when initializing the engine.\"\n");
        P("   fixes    a higher --gpu-memory-utilization, more GPUs, or smaller weights\n");
        fixes(c, r);
        P("\n");
        return;
    case KVC_PLAN_PHASE_CHECK_MAX_LEN:
        P("   why      the engine refuses to start: one request of max_model_len %s tokens needs "
          "%s of KV\n"
          "            per GPU, but after the weights (%s) and the rest only %s is left for "
          "the pool.\n",
          I(c, r->max_model_len), G(c, (double)x->need_bytes),
          G(c, (double)r->weight_bytes_per_gpu), G(c, (double)x->have_bytes));
        P("   engine   vLLM: \"To serve at least one request with the models's max seq len "
          "(%llu), (%.2f GiB KV\n"
          "            cache is needed, which is larger than the available KV cache memory "
          "(%.2f GiB). Based on\n"
          "            the available memory, the estimated maximum model length is %llu.\"\n",
          (unsigned long long)r->max_model_len, (double)x->need_bytes / (double)KVC__GIB,
          (double)x->have_bytes / (double)KVC__GIB, (unsigned long long)r->max_model_len_that_fits);
        P("   fixes    --max-model-len %s or less\n", I(c, r->max_model_len_that_fits));
        fixes(c, r);
        P("\n");
        return;
    case KVC_PLAN_PHASE_CAPTURE_GRAPHS:
        P("   why      the graphs are captured after the KV pool took the budget, in the %s "
          "left over: short by %s.\n",
          G(c, (double)x->have_bytes), G(c, short_by));
        P("   engine   a CUDA out-of-memory error during graph capture, after the pool was "
          "allocated\n");
        P("   fixes    --enforce-eager, a lower --gpu-memory-utilization, or a smaller "
          "--max-num-seqs (fewer graphs)\n\n");
        return;
    default:
        P("\n");
    }
}

static void sec_concurrency(rc_t *c, const kvc_plan_result_t *r)
{
    const kvc_plan_params_t *p = &r->params;
    const kvc_plan_model_t *m = &r->model;
    P("4. Concurrency at %s + %s tokens  [ceiling]\n", I(c, p->prompt_tokens),
      I(c, p->output_tokens));
    if (!r->fits && r->kv_pool_bytes_per_gpu)
        P("   (as configured the engine does not start; sections 4-12 describe the same pool "
          "with a\n   max_model_len it accepts, %s tokens or less)\n",
          I(c, r->max_model_len_that_fits));
    else if (!r->fits)
        P("   (as configured the engine does not start and has no KV pool: the ceilings below are "
          "zero)\n");
    if (no_kv(r))
        P("   per request  no KV; one state of %s per GPU, whatever its length\n",
          BY(c, r->kv_bytes_per_request));
    else
        P("   per request  ceil(%s / %u) = %s blocks", I(c, r->request_tokens), p->block_size,
          I(c, r->blocks_per_request));
    if (no_kv(r)) {
        /* said above */
    } else if (r->state_bytes_per_seq_per_gpu)
        P(" x %u x %s B + the state %s = %s per GPU\n", p->block_size,
          I(c, r->kv_bytes_per_token_per_gpu), BY(c, r->state_bytes_per_seq_per_gpu),
          BY(c, r->kv_bytes_per_request));
    else if (r->sliding_layers_per_gpu && p->window_freeing)
        P(", windowed layers keep only the window: %s per GPU\n", BY(c, r->kv_bytes_per_request));
    else
        P(" x %u x %s B = %s per GPU\n", p->block_size, I(c, r->kv_bytes_per_token_per_gpu),
          BY(c, r->kv_bytes_per_request));
    P("   at most      floor(%s / %s) = %s sequences resident%s\n", I(c, r->kv_pool_bytes_per_gpu),
      I(c, r->kv_bytes_per_request), I(c, r->max_concurrency), p->dp > 1 ? " per replica" : "");
    if (p->dp > 1)
        P("                x %u replicas = %s for the deployment\n", p->dp,
          IMUL(c, r->max_concurrency, p->dp));
    if (no_kv(r))
        P("   why a ceiling: every resident sequence holds its state for its whole life, and the "
          "scheduler\n   admits on the prompt; real engines also keep checkpoint states for "
          "prefix caching\n");
    else
        P("   why a ceiling: each sequence wastes up to %u tokens in its last, partial block (%s "
          "here); "
          "the\n"
          "   scheduler admits on the prompt (%s fit at %s tokens each) and outputs grow after, so "
          "a "
          "full pool\n"
          "   preempts; and real lengths vary around the typical request.\n",
          p->block_size - 1, I(c, r->partial_block_waste_tokens), I(c, r->admitted_at_prompt),
          I(c, p->prompt_tokens + 1));
    P("   ceilings on the running batch (sequences per decode step)\n");
    P("     kv_memory               %-12s the pool, above\n",
      I(c, r->ceilings[KVC_PLAN_CEIL_KV_MEMORY]));
    P("     compute                 %-12s the batch at which a decode step turns compute-bound "
      "[estimated]\n",
      r->ceilings[KVC_PLAN_CEIL_COMPUTE] == KVC_PLAN_UNBOUNDED
          ? "never"
          : I(c, r->ceilings[KVC_PLAN_CEIL_COMPUTE]));
    P("     max_num_seqs            %-12s %s\n", I(c, r->ceilings[KVC_PLAN_CEIL_MAX_NUM_SEQS]),
      r->max_num_seqs_auto ? "vLLM's default for the GPU" : "configured");
    P("     max_num_batched_tokens  %-12s configured: floor(%s / (1 + %u draft tokens))\n",
      I(c, r->ceilings[KVC_PLAN_CEIL_MAX_NUM_BATCHED_TOKENS]), I(c, p->max_num_batched_tokens),
      p->spec_tokens);
    P("     binding: %s (the lowest)\n", kvc_plan_ceiling_name(r->binding_ceiling));
    P("   ridge    %s TFLOP/s / %s = %s FLOP per byte (%s)\n", TF(c, r->peak_flops),
      RT(c, r->gpu.hbm_bytes_per_s), N(c, r->ridge_flops_per_byte),
      r->fp8_compute ? "fp8 weights on fp8 tensor cores" : "bf16 tensor cores");
    P("            per sequence and step at the mean decode context %s: %s FLOP (2 x params + "
      "attention%s)\n"
      "            and %s B of %s read; per step %s of weights read",
      I(c, r->decode_context), FL(c, r->decode_flops_per_seq), m->mla ? ", absorbed MLA" : "",
      ID(c, r->decode_bytes_per_seq),
      no_kv(r)                 ? "state (read and written back)"
      : r->state_bytes_per_seq ? "KV and state"
                               : "KV",
      G(c, r->weight_read_bytes));
    P(m->n_experts ? " at batch 1 (more experts as the batch grows)\n" : "\n");
    if (!no_kv(r))
        P("            attention does %s FLOP per KV byte it reads (%s)\n",
          N(c, r->attention_flops_per_kv_byte),
          m->mla ? "MLA: every query head reads the one latent, so TP divides it"
                 : "GQA: 2 x the query group / bytes per element");
    if (r->fp8_compute)
        P("            (attention, %s FLOP of it, runs at the bf16 rate, %s TFLOP/s)\n",
          FL(c, r->decode_attention_flops_per_seq), TF(c, r->gpu.bf16_flops));
    P("            compute-bound when B x FLOP / peak >= (weights + B x KV read) / bandwidth: ");
    if (r->ceilings[KVC_PLAN_CEIL_COMPUTE] == KVC_PLAN_UNBOUNDED)
        P("never here:\n            each sequence brings %s FLOP per byte of %s it reads, below "
          "the ridge, so decode stays\n            bandwidth-bound at any batch\n",
          N(c, r->decode_flops_per_seq / r->decode_bytes_per_seq), no_kv(r) ? "state" : "KV");
    else
        P("B >= %s\n", I(c, r->ceilings[KVC_PLAN_CEIL_COMPUTE]));
    P("            ignoring the KV reads (the textbook ridge batch): B >= %s\n",
      I(c, r->compute_weights_only));
    if (r->compute_weights_only_exact > 0 && kvc_plan_dtype_bits(p->weight_dtype) == 16)
        P("            B* = %.1f exactly: with 2 FLOP per 2-byte weight a sequence does 1 FLOP per "
          "weight byte,\n"
          "            so the batch at which decode turns compute-bound is the ridge point itself "
          "(%s FLOP/byte)\n",
          r->compute_weights_only_exact, N(c, r->ridge_flops_per_byte));
    else if (r->compute_weights_only_exact > 0)
        P("            B* = %.1f exactly: 2 FLOP per weight of %s B, so B* = the ridge point %s x "
          "%s "
          "B / 2 FLOP\n",
          r->compute_weights_only_exact,
          kvc_plan_dtype_bits(p->weight_dtype) == 8 ? "1" : "about 0.5",
          N(c, r->ridge_flops_per_byte), kvc_plan_dtype_bits(p->weight_dtype) == 8 ? "1" : "0.5");
    if (r->embedding_bytes_not_read)
        P("            (the input embedding table, %s, is not read per step: one row per token)\n",
          G(c, (double)r->embedding_bytes_not_read));
    if (r->weight_read_bytes > 4.0 * (double)r->gpu.l2_bytes)
        P("            the %s L2 holds %s of a step's weight reads: weights and KV stream from "
          "HBM every step\n\n",
          BY(c, r->gpu.l2_bytes), PCT(c, (double)r->gpu.l2_bytes / r->weight_read_bytes));
    else
        P("            the %s L2 holds a large share of a step's %s of weight reads: decode is "
          "faster than\n            this HBM roofline says\n\n",
          BY(c, r->gpu.l2_bytes), BY(c, (uint64_t)r->weight_read_bytes));
}

static void sec_sliding(rc_t *c, const kvc_plan_result_t *r)
{
    const kvc_plan_model_t *m = &r->model;
    P("5. Sliding windows at a %s-token context (whole model)\n", I(c, r->context_tokens));
    if (no_kv(r)) {
        P("   no attention layer: nothing to window\n\n");
        return;
    }
    if (!m->sliding_window) {
        P("   no windowed layers: every layer keeps every token, %s per request; saving 0\n\n",
          BY(c, r->swa_bytes_without_freeing));
        return;
    }
    P("   windowed layers   %u of %u, window %s tokens\n", m->n_sliding_layers, m->n_layers,
      I(c, m->sliding_window));
    P("   without freeing   all %u layers keep all ceil(%s / %u) blocks: %s\n", m->n_layers,
      I(c, r->context_tokens), r->params.block_size, BY(c, r->swa_bytes_without_freeing));
    P("   with freeing      windowed layers keep only the blocks that overlap the last %s tokens: "
      "%s\n",
      I(c, m->sliding_window), BY(c, r->swa_bytes_with_freeing));
    P("   saving            1 - %s / %s = %s\n", I(c, r->swa_bytes_with_freeing),
      I(c, r->swa_bytes_without_freeing), PCT(c, r->sliding_window_saving));
    P("   the saving grows with the context toward %u / %u = %s: the share of windowed layers sets "
      "it,\n"
      "   the window only sets where it starts (contexts under %s tokens save nothing).%s\n\n",
      m->n_sliding_layers, m->n_layers, PCT(c, r->sliding_window_saving_limit),
      I(c, m->sliding_window),
      r->params.window_freeing ? ""
                               : "\n   --no-window-freeing: the pool is sized without the "
                                 "saving (an engine with its hybrid manager off)");
}

static void sec_prefill(rc_t *c, const kvc_plan_result_t *r)
{
    const kvc_plan_model_t *m = &r->model;
    const double lin_params =
        (double)r->counts.active - (double)r->counts.embedding - (double)r->counts.lm_head;
    P("6. Prefill FLOPs of a %s-token prompt (whole model)\n", I(c, r->context_tokens));
    P("   linear     2 x %s tokens x %s params (active, without the vocabulary tables)\n"
      "              + the LM head for the last token 2 x %s x %s = %s FLOP\n",
      I(c, r->context_tokens), BIL(c, lin_params), I(c, m->vocab_size), I(c, m->hidden_size),
      FL(c, r->prefill_linear_flops));
    if (no_kv(r)) {
        P("   attention  none: no layer attends (the recurrent mixers' scans are linear in n, "
          "counted with\n              their projections)\n\n");
        return;
    }
    P("   attention  %u heads x 2 x (%u + %u) FLOP per query-key pair x causal pairs n(n+1)/2 "
      "(each once)\n",
      m->n_heads, m->head_dim, m->v_head_dim);
    if (m->sliding_window)
        P("              on %u full layers, and on %u windowed layers pairs within %s tokens",
          m->n_layers - m->n_sliding_layers, m->n_sliding_layers, I(c, m->sliding_window));
    else
        P("              on %u layers", kvc__attn_layers(m));
    P(" = %s FLOP\n", FL(c, r->prefill_attention_flops));
    P("   share in attention: %s / (%s + %s) = %s\n\n", FL(c, r->prefill_attention_flops),
      FL(c, r->prefill_attention_flops), FL(c, r->prefill_linear_flops),
      PCT(c, r->prefill_attention_flops_fraction));
}

static void sec_forks(rc_t *c, const kvc_plan_result_t *r)
{
    const kvc_plan_params_t *p = &r->params;
    const uint64_t all = r->blocks_per_request, pf = p->prompt_tokens / p->block_size;
    if (no_kv(r)) {
        P("7. Forks over a %s + %s-token request\n"
          "   no KV to share: every sample and beam holds its own state (a recurrent state is "
          "not shared\n"
          "   copy-on-write): --n %u: %s; --beams %u: %s\n\n",
          I(c, p->prompt_tokens), I(c, p->output_tokens), p->n_samples,
          BY(c, r->fork_unshared_bytes_samples), p->beams, BY(c, r->fork_unshared_bytes_beams));
        return;
    }
    P("7. Forks over a %s + %s-token request (block %u, %s per token per GPU)\n",
      I(c, p->prompt_tokens), I(c, p->output_tokens), p->block_size,
      BY(c, r->kv_bytes_per_token_per_gpu));
    P("   parallel sampling, --n %u\n", p->n_samples);
    P("     unshared   %u x %s blocks = %s\n", p->n_samples, I(c, all),
      BY(c, r->fork_unshared_bytes_samples));
    if (p->prompt_tokens % p->block_size)
        P("     shared     the prompt's %s full blocks once + %u x %s blocks each (the partial "
          "prompt block copied\n"
          "                on write, then the outputs) = %s\n",
          I(c, pf), p->n_samples, I(c, all - pf), BY(c, r->fork_shared_bytes_samples));
    else
        P("     shared     the prompt's %s blocks once (block-aligned: nothing to copy) + %u x %s "
          "output blocks\n"
          "                each = %s\n",
          I(c, pf), p->n_samples, I(c, all - pf), BY(c, r->fork_shared_bytes_samples));
    P("   beam search, --beams %u\n", p->beams);
    P("     unshared   %u x %s blocks = %s\n", p->beams, I(c, all),
      BY(c, r->fork_unshared_bytes_beams));
    P("     shared     beams that share their history hold one private (copy-on-write) block "
      "each:\n"
      "                %s + %u = %s blocks = %s; beams that diverge at the first token: %s\n\n",
      I(c, all), p->beams - 1, I(c, all + p->beams - 1), BY(c, r->fork_shared_bytes_beams),
      BY(c, r->fork_shared_bytes_beams_diverged));
}

static void sec_disagg(rc_t *c, const kvc_plan_result_t *r)
{
    const kvc_plan_params_t *p = &r->params;
    P("8. Disaggregated prefill: the KV a prefill replica emits  [estimated: MFU %s]\n",
      N(c, p->mfu));
    if (r->prefill_rate_kind == KVC_PLAN_MEASURED)
        P("   prefill rate   measured: %s tokens/s per replica\n", ID(c, r->prefill_tokens_per_s));
    else {
        P("   one prompt     (%s linear FLOP / %s TFLOP/s + %s attention FLOP / %s TFLOP/s) / MFU "
          "%s\n"
          "                  = %s GPU-seconds for %s tokens\n",
          FL(c, r->prompt_linear_flops), TF(c, r->peak_flops), FL(c, r->prompt_attention_flops),
          TF(c, r->gpu.bf16_flops), N(c, p->mfu), N(c, r->prefill_work_s), I(c, p->prompt_tokens));
        P("   prefill rate   %u GPU%s x %s tokens / %s GPU-s = %s tokens/s per replica  "
          "[estimated]\n",
          p->tp * p->pp, p->tp * p->pp == 1 ? "" : "s", I(c, p->prompt_tokens),
          N(c, r->prefill_work_s), ID(c, r->prefill_tokens_per_s));
    }
    if (r->state_bytes_per_seq)
        P("   KV out         %s B x %s tokens/s + one state of %s per %s-token prompt = %s per "
          "replica,\n                  %s per GPU\n",
          I(c, r->kv_bytes_per_token), ID(c, r->prefill_tokens_per_s),
          BY(c, r->state_bytes_per_seq), I(c, p->prompt_tokens), RT(c, r->prefill_kv_bytes_per_s),
          RT(c, r->prefill_kv_bytes_per_s_per_gpu));
    else
        P("   KV out         %s B x %s tokens/s = %s per replica, %s per GPU\n",
          I(c, r->kv_bytes_per_token), ID(c, r->prefill_tokens_per_s),
          RT(c, r->prefill_kv_bytes_per_s), RT(c, r->prefill_kv_bytes_per_s_per_gpu));
    if (!no_kv(r))
        P("   why P cancels  KV bytes/token x FLOP/s / (2 x params): %s B x %s FLOP/s / (2 x %s) = "
          "%s "
          "per GPU\n"
          "                  at any prompt length (attention, ignored here, only lowers it)\n",
          I(c, r->kv_bytes_per_token), FL(c, r->peak_flops * p->mfu),
          BIL(c,
              (double)r->counts.active - (double)r->counts.embedding - (double)r->counts.lm_head),
          RT(c, r->prefill_kv_bytes_per_s_linear_only));
    P("   link           %s / %s per GPU = %s of the link",
      RT(c, r->prefill_kv_bytes_per_s_per_gpu), RT(c, p->link_bytes_per_s),
      PCT(c, r->link_utilization));
    if (r->link_utilization > 1)
        P(": the link caps prefill at %s tokens/s per replica\n\n",
          ID(c, r->link_limited_tokens_per_s));
    else
        P("; the link would carry up to %s tokens/s per replica\n\n",
          ID(c, (r->link_limited_tokens_per_s)));
}

static void sec_tiers(rc_t *c, const kvc_plan_result_t *r)
{
    const kvc_plan_params_t *p = &r->params;
    P("9. Recompute or fetch a cached token, per GPU  [estimated: MFU %s, setup latencies]\n",
      N(c, p->mfu));
    if (no_kv(r)) {
        P("   no KV per token to fetch: a cached prefix is a checkpointed state (%s per GPU, "
          "section 15),\n"
          "   fetched whole or its tokens recomputed at %s per token\n\n",
          BY(c, r->state_bytes_per_seq_per_gpu), TIME(c, r->recompute_s_per_token));
        return;
    }
    P("   recompute   2 x %s active params / (%u x %s TFLOP/s x MFU %s) = %s per token\n",
      BIL(c, (double)r->counts.active - (double)r->counts.embedding - (double)r->counts.lm_head),
      p->tp * p->pp, TF(c, r->peak_flops), N(c, p->mfu), TIME(c, r->recompute_s_per_token));
    P("   fetch       %s B per token per GPU / the tier's bandwidth\n",
      I(c, r->kv_bytes_per_token_per_gpu));
    P("   break-even  %s B / %s = %s: faster links fetch, slower ones recompute\n",
      I(c, r->kv_bytes_per_token_per_gpu), TIME(c, r->recompute_s_per_token),
      RT(c, r->break_even_bytes_per_s));
    P("   tier      bandwidth     fetch/token   fetch wins by  smallest copy that wins     "
      "others may take\n");
    for (int i = 0; i < KVC_PLAN_TIERS; i++) {
        const kvc_plan_tier_t *t = &r->tiers[i];
        char copy[48];
        if (t->min_tokens_to_win == KVC_PLAN_UNBOUNDED)
            snprintf(copy, sizeof copy, "never");
        else
            snprintf(copy, sizeof copy, "%s token%s (%s setup)", I(c, t->min_tokens_to_win),
                     t->min_tokens_to_win == 1 ? "" : "s", TIME(c, t->latency_s));
        P("   %-9s %-13s %-13s %-14s %-27s %s\n", t->name, RT(c, t->bytes_per_s),
          TIME(c, t->fetch_s_per_token), t->speedup >= 1 ? N(c, t->speedup) : "loses", copy,
          t->speedup >= 1 ? PCT(c, t->max_shared_fraction) : "-");
    }
    P("   fetching still loses for small models (the break-even scales with KV bytes per active "
      "parameter),\n"
      "   for copies under the smallest size above (setup latency dominates), and on links that "
      "others\n"
      "   share beyond the last column.  The rows above are for a short prefix; recompute also "
      "pays the\n"
      "   prefix's attention, attention(n) / n FLOP per token at the bf16 rate, which grows with "
      "it:\n");
    P("   prefix tokens   recompute/token   attention extra   break-even bandwidth\n");
    for (uint32_t i = 0; i < r->n_recompute; i++) {
        const kvc_plan_recompute_row_t *x = &r->recompute[i];
        P("   %-15s %-17s %-17s %s\n", I(c, x->prefix_tokens), TIME(c, x->recompute_s_per_token),
          PCT(c, x->attention_extra), RT(c, x->break_even_bytes_per_s));
    }
    P("   copy size   a copy of S bytes over the host link takes S / %s + %s: one layer of one "
      "block\n"
      "               (%s) moves at %s, one block of every layer (%s) at %s, the %s-token prompt "
      "(%s)\n"
      "               at %s, against the break-even %s: %s\n",
      RT(c, r->tiers[1].bytes_per_s), TIME(c, r->tiers[1].latency_s), BY(c, r->copy_bytes[0]),
      RT(c, r->copy_bytes_per_s[0]), BY(c, r->copy_bytes[1]), RT(c, r->copy_bytes_per_s[1]),
      I(c, r->params.prompt_tokens), BY(c, r->copy_bytes[2]), RT(c, r->copy_bytes_per_s[2]),
      RT(c, r->break_even_bytes_per_s),
      r->copy_bytes_per_s[0] < r->break_even_bytes_per_s
          ? "per-layer copies of one block lose to recompute, whole blocks win"
          : "every one of them beats recomputing here");
    P("   riding      a decode step that is memory-bound streams the weights anyway: up to %s "
      "prefix tokens\n"
      "               recompute in its idle compute at batch 1 (%s at Little's N, section 10), so "
      "a short\n"
      "               prefix costs nearly nothing to recompute; a long one pays its attention "
      "(table above)\n",
      I(c, r->recompute_free_tokens_batch_1), I(c, r->recompute_free_tokens_at_n));
    P("   SSD tier    endurance %s TB rated / %s written = %.1f days (%.2f years)%s\n\n",
      ID(c, round(p->ssd_endurance_bytes / 1e12)), RT(c, r->ssd_write_bytes_per_s),
      r->ssd_endurance_days, r->ssd_endurance_days / 365.25,
      p->ssd_write_bytes_per_s > 0 ? ""
                                   : "\n               (writing all the KV one prefill GPU "
                                     "emits, section 8; set --ssd-write-rate)");
}

static void sec_little(rc_t *c, const kvc_plan_result_t *r)
{
    const kvc_plan_params_t *p = &r->params;
    const uint64_t cap = KVC_MIN(r->ceilings[KVC_PLAN_CEIL_KV_MEMORY],
                                 KVC_MIN(r->ceilings[KVC_PLAN_CEIL_MAX_NUM_SEQS],
                                         r->ceilings[KVC_PLAN_CEIL_MAX_NUM_BATCHED_TOKENS]));
    P("10. Resident sequences by Little's law, per replica  [estimated: MFU %s, MBU %s]\n",
      N(c, p->mfu), N(c, p->mbu));
    P("   arrivals   %s requests/s%s over %u replica%s = %s per replica\n", N(c, r->arrival_rate),
      r->arrival_rate_auto ? " (default: half the sustainable rate below; set --arrival-rate)" : "",
      p->dp, p->dp > 1 ? "s" : "", N(c, r->arrival_rate_per_replica));
    P("   T(N)       prefill %s + %s outputs x step(N), where\n"
      "              step(N) = PP x max((weights read + N x KV read) / (bandwidth x MBU %s),\n"
      "                                 N x FLOP per sequence / (peak x MFU %s) / (1 - prefill "
      "load)),\n"
      "              prefill load = arrivals x %s GPU-s per prompt / %u GPU(s) = %s\n",
      TIME(c, r->little_prefill_s), I(c, p->output_tokens), N(c, p->mbu), N(c, p->mfu),
      N(c, r->prefill_work_s), p->tp * p->pp,
      PCT(c, r->arrival_rate_per_replica * r->prefill_work_s / (p->tp * p->pp)));
    if (r->little_stable) {
        P("   fixed point N = arrivals x T(N), iterated from N = 0 (%d steps): N = %s sequences,\n"
          "              T = %s, decode step %s\n",
          r->little_iterations, N(c, r->little_resident), TIME(c, r->little_time_in_system),
          TIME(c, r->little_step_s));
        P("   taking the batch-1 time as given would say N = %s\n", N(c, r->little_naive_resident));
        if (r->little_resident > (double)cap)
            P("   over the ceiling: %s sequences would be resident but at most %s fit; requests "
              "queue and\n   preempt, and the time in system grows past T\n",
              N(c, r->little_resident), I(c, cap));
    } else {
        P("   no fixed point: at this rate work arrives faster than the replica finishes it, and "
          "the\n   queue grows without bound\n");
    }
    P("   sustainable up to %s requests/s per replica (%s for the deployment): beyond it ",
      N(c, r->little_max_arrival_rate), N(c, r->little_max_arrival_rate * p->dp));
    if (r->little_max_by_ceiling)
        P("more than the\n   %s sequences the ceilings allow would be resident, and requests "
          "queue\n\n",
          I(c, cap));
    else
        P("the GPUs' throughput\n   binds before the %s-sequence ceiling: prefill and decode "
          "fill them and the queue grows\n\n",
          I(c, cap));
}

static void sec_spec(rc_t *c, const kvc_plan_result_t *r)
{
    const kvc_plan_params_t *p = &r->params;
    P("11. Speculative decoding: k draft tokens per sequence and step  [estimated: roofline, "
      "acceptance]\n");
    if (r->model.recurrent) {
        P("   not priced for a recurrent model: verifying k drafts needs its state at each draft "
          "position\n   to roll back to (--spec-tokens is refused)\n\n");
        return;
    }
    P("   drafts count against the step's token budget (batch <= %s / (1 + k)), reserve k KV slots "
      "per\n"
      "   sequence, and are verified in one pass.  Acceptance a = %s per token; context %s.\n",
      I(c, p->max_num_batched_tokens), N(c, p->spec_acceptance), I(c, r->spec_context));
    P("   tokens/s with k drafts over tokens/s without, under the roofline of section 4 (peak "
      "rates):\n"
      "     step(B, k) = max((weights + B x KV read) / bandwidth, (1 + k) x B x FLOP per token / "
      "peak)\n"
      "                + k x max(draft weights / bandwidth, B x draft FLOP per token / peak)\n"
      "     tokens per sequence and step = 1 + a + a^2 + ... + a^k\n");
    if (p->spec_draft_params)
        P("   draft model: %s parameters (%s per GPU per draft step)\n",
          BIL(c, (double)p->spec_draft_params), BY(c, r->spec_draft_bytes_per_gpu));
    else
        P("   drafts by prompt lookup (n-gram): they cost nothing to make; set --spec-draft-params "
          "for a draft model\n");
    P("   k    batch by budget   tokens/step   speedup at batch 1   loses from batch   "
      "compute-bound above\n");
    for (uint32_t i = 0; i < r->n_spec; i++) {
        const kvc_plan_spec_row_t *s = &r->spec[i];
        P("   %-4u %-17s %-13.2f %-20s %-18s %s%s\n", s->spec_tokens, I(c, s->max_batch_by_tokens),
          s->tokens_per_step, N(c, s->speedup_at_batch_1),
          s->loses_from_batch == KVC_PLAN_UNBOUNDED ? "never (to 16,384)"
                                                    : I(c, s->loses_from_batch),
          s->compute_bound_batch == KVC_PLAN_UNBOUNDED ? "never" : I(c, s->compute_bound_batch),
          s->spec_tokens == p->spec_tokens ? "   <- configured" : "");
    }
    P("   a compute-bound verification is not yet a loss: speculation loses only once the extra "
      "(1 + k)\n"
      "   tokens cost more time than the accepted drafts save.  Best k per batch (0: do not "
      "speculate):\n   batch ");
    for (uint32_t i = 0; i < r->n_spec_best; i++) P(" %7s", I(c, r->spec_best[i].batch));
    P("\n   best k");
    for (uint32_t i = 0; i < r->n_spec_best; i++) P(" %7u", r->spec_best[i].best_k);
    P("\n   speedup");
    for (uint32_t i = 0; i < r->n_spec_best; i++) P("%8s", N(c, r->spec_best[i].speedup));
    P("\n\n");
}

static void sec_tenancy(rc_t *c, const kvc_plan_result_t *r)
{
    P("12. Tenancy: what one request costs in the KV pool (per GPU)\n");
    if (no_kv(r)) {
        P("   every request costs one state, %s per GPU, whatever its length: %s of them fit; "
          "price quotas\n   in sequences (state slots), not tokens\n\n",
          BY(c, r->state_bytes_per_seq_per_gpu), I(c, r->max_concurrency));
        return;
    }
    P("   tokens        KV per GPU     share of the pool   at once\n");
    for (uint32_t i = 0; i < r->n_tenants; i++) {
        const kvc_plan_tenant_row_t *t = &r->tenants[i];
        P("   %-13s %-14s %-19s %s\n", I(c, t->tokens), BY(c, t->bytes_per_gpu),
          PCT(c, t->pool_share), I(c, t->per_pool));
    }
    if (r->image_bytes_per_gpu)
        P("   one image adds %s KV tokens: %s per GPU, %s of the pool\n",
          I(c, r->model.image_tokens), BY(c, r->image_bytes_per_gpu),
          PCT(c, r->kv_pool_bytes_per_gpu
                     ? (double)r->image_bytes_per_gpu / (double)r->kv_pool_bytes_per_gpu
                     : INFINITY));
    if (r->params.lora_rank)
        P("   LoRA          rank %u on q, k, v, o, gate, up, down: %s per adapter (%s per GPU); %u "
          "of %u\n"
          "                 adapters resident take %s of the pool (%s KV tokens); a prompt "
          "shared across\n"
          "                 adapters is cached once per adapter (KV depends on it): %s blocks for "
          "this prompt\n",
          r->params.lora_rank, BY(c, r->lora_adapter_bytes), BY(c, r->lora_adapter_bytes_per_gpu),
          r->params.lora_resident, r->params.lora_adapters,
          G(c, (double)r->lora_resident_bytes_per_gpu), I(c, r->lora_pool_tokens_lost),
          I(c, r->lora_prefix_blocks));
    if (r->tenant_over_max_model_len)
        P("   warning: --tenant-tokens %s is over max_model_len %s: the engine refuses such a "
          "request; it is\n   priced here anyway\n",
          I(c, r->params.tenant_tokens), I(c, r->max_model_len));
    P("   1%% of the pool is %s KV tokens: price quotas in KV tokens (or blocks), not requests; "
      "one\n"
      "   max_model_len request costs as much as %s typical ones.\n\n",
      I(c, r->tokens_per_percent),
      r->n_tenants >= 2 && r->tenants[0].bytes_per_gpu
          ? N(c, (double)r->tenants[1].bytes_per_gpu / (double)r->tenants[0].bytes_per_gpu)
          : "?");
}

static void sec_grid(rc_t *c, const kvc_plan_result_t *r)
{
    P("14. Weight dtype x KV dtype (--grid dtypes): the same deployment, re-planned per pair\n");
    P("   weights  KV       starts                weights/GPU  KV pool/GPU  max concurrency  "
      "max_model_len that fits\n");
    for (uint32_t i = 0; i < r->n_dtype_grid; i++) {
        const kvc_plan_grid_row_t *x = &r->dtype_grid[i];
        char starts[40];
        snprintf(starts, sizeof starts, "%s",
                 x->fits ? "yes" : kvc_plan_phase_name((kvc_plan_phase_id_t)x->failed_phase));
        P("   %-8s %-8s %-21s %-12s %-12s %-16s %s%s\n", kvc_plan_dtype_name(x->weight_dtype),
          kvc_plan_dtype_name(x->kv_dtype), x->fits ? "yes" : starts,
          G(c, (double)x->weight_bytes_per_gpu), G(c, (double)x->kv_pool_bytes_per_gpu),
          I(c, x->max_concurrency), I(c, x->max_model_len_that_fits),
          x->weight_dtype == r->params.weight_dtype && x->kv_dtype == r->params.kv_dtype
              ? "   <- this plan"
              : "");
    }
    P("\n");
}

static void sec_longctx(rc_t *c, const kvc_plan_result_t *r)
{
    const kvc_plan_params_t *p = &r->params;
    const kvc_plan_model_t *m = &r->model;
    P("13. Long context: one request of %s tokens, context parallelism %u  [estimated: MFU %s]\n",
      I(c, r->context_tokens), p->cp, N(c, p->mfu));
    if (r->max_position_embeddings_scaled)
        P("   positions  %s:%s x max_position_embeddings %s = %s tokens allowed\n",
          kvc_plan_rope_name(p->rope_scaling), N(c, p->rope_factor),
          I(c, m->max_position_embeddings), I(c, r->max_position_embeddings_scaled));
    P("   KV         %s B per token x %s tokens = %s per request (whole model, one copy)\n",
      I(c, r->kv_bytes_per_token), I(c, r->context_tokens),
      G(c, (double)r->kv_bytes_per_request_context));
    P("   per GPU    TP %u x CP %u: each GPU holds %s of it (%s of the tokens)\n", p->tp, p->cp,
      G(c, (double)r->kv_bytes_per_request_per_gpu), I(c, kvc__ceil_div(r->context_tokens, p->cp)));
    P("   prefill    (%s linear FLOP / %s TFLOP/s + %s attention FLOP / %s TFLOP/s) / MFU %s / %u "
      "GPUs\n              = %s; %s of the FLOPs in attention\n",
      FL(c, r->prefill_linear_flops), TF(c, r->peak_flops), FL(c, r->prefill_attention_flops),
      TF(c, r->gpu.bf16_flops), N(c, p->mfu), p->tp * p->cp, TIME(c, r->prefill_seconds),
      PCT(c, r->prefill_attention_flops_fraction));
    if (p->cp > 1)
        P("   ring       each step a GPU sends its %s-token chunk's K/V per layer: %s over %s "
          "(%s)\n"
          "              = %s, against the step's attention, %s tokens^2 / 2 / %u^2 pairs: %s: "
          "%s\n",
          I(c, r->ring_chunk_tokens), BY(c, r->ring_bytes_per_step),
          RT(c, r->ring_link_bytes_per_s), r->ring_inter_node ? "between nodes" : "within a node",
          TIME(c, r->ring_step_s), I(c, r->context_tokens), p->cp,
          TIME(c, r->ring_attention_step_s),
          r->ring_hidden ? "the transfer hides behind compute" : "the transfer is exposed");
    else
        P("   ring       CP 1: no ring; --cp N splits each request's KV over N GPUs\n");
    if (p->cp > 1) {
        const unsigned dv = m->mla ? m->kv_lora_rank : m->v_head_dim;
        P("   decode     each step all-gathers every attention layer's partial results (per query "
          "head the\n"
          "              output, its max and its sum, fp32): (%u - 1) x %u heads/GPU x (%u + 2) x "
          "4 B "
          "= "
          "%s B per\n"
          "              token and layer, over %u layers, each exchange %s of latency\n",
          p->cp, m->n_heads / p->tp, dv, I(c, r->cp_decode_bytes_per_token_layer),
          r->cp_decode_layers, TIME(c, r->cp_decode_latency_s));
        for (int i = 0; i < (r->cp_decode_batch > 1 ? 2 : 1); i++) {
            const double bb = i ? (double)r->cp_decode_batch : 1;
            P("              batch %-6s %s x %s B / %s + %u x %s = %s against a %s step (%s)\n",
              I(c, (uint64_t)bb), I(c, (uint64_t)bb),
              I(c, (uint64_t)r->cp_decode_layers * r->cp_decode_bytes_per_token_layer),
              RT(c, r->ring_link_bytes_per_s), r->cp_decode_layers, TIME(c, r->cp_decode_latency_s),
              TIME(c, r->cp_decode_comm_s[i]), TIME(c, r->cp_decode_step_s[i]),
              PCT(c, r->cp_decode_comm_s[i] / r->cp_decode_step_s[i]));
        }
    }
    if (!r->n_layouts) {
        P("\n");
        return;
    }
    P("   layouts of %u GPU%s (TP within a node of %u, the rest CP):\n", p->tp * p->cp,
      p->tp * p->cp == 1 ? "" : "s", p->gpus_per_node);
    P("   TP    CP    GPUs  KV       KV/GPU/request  weights/GPU  starts  prefill     ring/step    "
      "ring\n");
    bool any = false;
    for (uint32_t i = 0; i < r->n_layouts; i++) {
        const kvc_plan_layout_t *x = &r->layouts[i];
        if (i == r->n_layouts_same_gpus)
            P("   none starts on %u GPUs; what replaces it (more CP ranks%s, or fp8 KV):\n",
              p->tp * p->cp, x->inter_node ? " across nodes at the inter-node link" : "");
        if (i < r->n_layouts_same_gpus) any |= x->fits;
        P("   %-5u %-5u %-5u %-8s %-15s %-12s %-7s %-11s %-12s %s%s\n", x->tp, x->cp, x->gpus,
          kvc_plan_dtype_name(x->kv_dtype), G(c, (double)x->kv_bytes_per_request_per_gpu),
          G(c, (double)x->weight_bytes_per_gpu), x->fits ? "yes" : "no",
          TIME(c, x->prefill_seconds), x->cp > 1 ? BY(c, x->ring_bytes_per_step) : "-",
          x->cp <= 1       ? "-"
          : x->ring_hidden ? "hidden"
                           : "exposed",
          x->inter_node ? " (between nodes)" : "");
    }
    if (!any)
        P("   a sliding window or sparse attention bounds the KV per layer instead (not modelled "
          "here)\n");
    P("\n");
}

static void sec_multimodal(rc_t *c, const kvc_plan_result_t *r)
{
    static const char *const phase_names[3] = {"encoder", "prefill with images", "decode"};
    const kvc_plan_model_t *m = &r->model;
    const kvc_plan_params_t *p = &r->params;
    P("16. Multimodal: %s KV tokens an image, %u image%s per request (--images-per-request)\n",
      I(c, m->image_tokens), r->images_per_request, r->images_per_request == 1 ? "" : "s");
    if (r->counts.vision)
        P("   tower      %s parameters, %s per GPU in the weights, run on images only (never "
          "by a\n"
          "              decode step)\n",
          I(c, r->counts.vision), G(c, (double)r->vision_bytes_per_gpu));
    P("   budget     the encoder's budget %s tokens (max(max_num_batched_tokens %s, %s), vLLM's\n"
      "              compute_encoder_budget; --encoder-cache-tokens) encodes min(%u x %u, %s / "
      "%s) = %s\n"
      "              images at once in the profile run\n",
      I(c, r->encoder_budget_tokens), I(c, p->max_num_batched_tokens), I(c, m->image_tokens),
      p->max_num_seqs, r->images_per_request, I(c, r->encoder_budget_tokens), I(c, m->image_tokens),
      I(c, r->encoder_images));
    if (r->encoder_live_elems_per_token)
        P("   encoder    per image %u tokens (patches + class) x (5 x %u + (3 x %u + %u) / TP %u)\n"
          "              = %s live values x 2 B; x %s images = %s of activations\n",
          m->vision_tokens, m->vision_hidden, m->vision_hidden, m->vision_intermediate, p->tp,
          I(c, r->encoder_live_elems_per_token), I(c, r->encoder_images),
          BY(c, r->encoder_activation_bytes));
    else
        P("   encoder    not estimated: the config gives no vision widths (pass "
          "--activation-memory)\n");
    P("   cache      an image's embeddings: %s tokens x hidden %u x 2 B = %s; the %s encoded "
      "images\n"
      "              keep %s until their prefill consumes them (the encoder cache)\n",
      I(c, m->image_tokens), m->hidden_size, BY(c, r->encoder_cache_bytes_per_image),
      I(c, r->encoder_images), BY(c, r->encoder_cache_bytes));
    P("   phases     encoder %s, prefill with images %s, decode %s:\n"
      "              %s peaks (%s; text only %s)\n",
      G(c, (double)r->phase_bytes[0]), G(c, (double)r->phase_bytes[1]),
      G(c, (double)r->phase_bytes[2]), phase_names[r->peak_phase],
      G(c, (double)r->activation_bytes), G(c, (double)r->text_only_activation_bytes));
    if (r->encoder_pool_tokens_lost)
        P("   pool       the images' share of the peak, %s, is memory the KV pool never gets "
          "and decode\n"
          "              never uses: %s KV tokens\n",
          G(c, (double)(r->activation_bytes - r->text_only_activation_bytes)),
          I(c, r->encoder_pool_tokens_lost));
    else
        P("   pool       the images do not raise the peak: no KV tokens lost to them\n");
    P("   KV         an image adds %s KV tokens, %s per GPU; the typical request with %u: %s "
      "per GPU\n\n",
      I(c, m->image_tokens), BY(c, r->image_bytes_per_gpu), r->images_per_request,
      BY(c, r->image_request_bytes_per_gpu));
}

static void sec_recurrent(rc_t *c, const kvc_plan_result_t *r)
{
    const kvc_plan_model_t *m = &r->model;
    const kvc_plan_params_t *p = &r->params;
    const uint32_t n_attn = kvc__attn_layers(m);
    const char *ssm_b = p->ssm_state_fp32 ? "4" : "2";
    const bool none = no_kv(r);
    P("15. Recurrent state: %u %s layers and %u attention layers of %u\n", m->n_recurrent_layers,
      m->recurrent == KVC_PLAN_RECURRENT_MAMBA1   ? "Mamba (mamba1)"
      : m->recurrent == KVC_PLAN_RECURRENT_MAMBA2 ? "Mamba-2 (mamba2)"
                                                  : "Gated DeltaNet (gated_deltanet)",
      n_attn, m->n_layers);
    const uint64_t conv_ch =
        m->recurrent == KVC_PLAN_RECURRENT_MAMBA1
            ? m->ssm_d_inner
            : (uint64_t)m->ssm_d_inner + 2ull * m->ssm_n_groups * m->ssm_d_state;
    if (m->recurrent == KVC_PLAN_RECURRENT_MAMBA1)
        P("   per layer  conv (d_conv %u - 1) x d_inner %u x 2 B = %s; SSM d_inner %u x d_state %u "
          "x "
          "%s B = %s\n",
          m->ssm_d_conv, m->ssm_d_inner, BY(c, r->conv_state_bytes_per_layer), m->ssm_d_inner,
          m->ssm_d_state, ssm_b, BY(c, r->ssm_state_bytes_per_layer));
    else if (m->recurrent == KVC_PLAN_RECURRENT_MAMBA2)
        P("   per layer  conv (conv_kernel %u - 1) x (d_inner %u + 2 x n_groups %u x d_state %u = "
          "%s) x 2 B = %s;\n"
          "              SSM heads %u x head_dim %u x d_state %u x %s B = %s\n",
          m->ssm_d_conv, m->ssm_d_inner, m->ssm_n_groups, m->ssm_d_state, I(c, conv_ch),
          BY(c, r->conv_state_bytes_per_layer), m->ssm_n_heads, m->ssm_head_dim, m->ssm_d_state,
          ssm_b, BY(c, r->ssm_state_bytes_per_layer));
    else
        P("   per layer  conv (kernel %u - 1) x (2 x key heads %u x key dim %u + value heads %u x "
          "value dim %u = %s)\n"
          "              x 2 B = %s; recurrent value heads %u x key dim %u x value dim %u x %s B = "
          "%s\n",
          m->ssm_d_conv, m->ssm_n_groups, m->ssm_d_state, m->ssm_n_heads, m->ssm_head_dim,
          I(c, conv_ch), BY(c, r->conv_state_bytes_per_layer), m->ssm_n_heads, m->ssm_d_state,
          m->ssm_head_dim, ssm_b, BY(c, r->ssm_state_bytes_per_layer));
    P("              (%s; --mamba-ssm-cache-dtype float32 doubles the SSM part)\n",
      p->ssm_state_fp32 ? "fp32 SSM state" : "16-bit, the model's dtype");
    P("   state      %u layers x %s = %s per sequence, whatever its length; per GPU (TP %u, %u "
      "of the\n"
      "              layers): %s",
      m->n_recurrent_layers, BY(c, r->conv_state_bytes_per_layer + r->ssm_state_bytes_per_layer),
      BY(c, r->state_bytes_per_seq), p->tp, r->recurrent_layers_per_gpu,
      BY(c, r->state_bytes_per_seq_per_gpu));
    if (none)
        P(": all there is per request\n");
    else
        P(", as much as %s tokens of KV\n", I(c, r->state_kv_tokens));
    if (none)
        P("   KV         none: no layer attends (0 B per token)\n");
    else
        P("   KV         the %u attention layers: %s B per token (all %u layers attending would "
          "hold %s B)\n",
          n_attn, I(c, r->kv_bytes_per_token), m->n_layers,
          I(c, r->all_attention_kv_bytes_per_token));
    P("   sequences  the typical request (%s tokens): state %s + KV %s = %s per GPU;\n"
      "              the pool (%s) holds %s of them (max concurrency); %s if KV took nothing\n",
      I(c, r->request_tokens), BY(c, r->state_bytes_per_seq_per_gpu), BY(c, r->request_kv_bytes),
      BY(c, r->kv_bytes_per_request), G(c, (double)r->kv_pool_bytes_per_gpu),
      I(c, r->max_concurrency), I(c, r->state_only_sequences));
    P("   decode     each step reads and writes every running sequence's state: 2 x %s per "
      "sequence\n",
      BY(c, r->state_bytes_per_seq_per_gpu));
    if (none)
        P("   checkpoints prefix caching keeps a state every %s tokens "
          "(--state-checkpoint-interval),\n"
          "              %s each; a cached %s-token prompt: %s checkpoint%s = %s\n"
          "              (%s keeping only its last); %s cached prompts (--cached-prefixes): %s;\n"
          "              the pool holds %s\n",
          I(c, r->checkpoint_interval), BY(c, r->state_bytes_per_seq_per_gpu),
          I(c, p->prompt_tokens), I(c, r->checkpoints_per_prefix),
          r->checkpoints_per_prefix == 1 ? "" : "s", BY(c, r->prefix_bytes_per_gpu),
          BY(c, r->prefix_bytes_last_checkpoint_per_gpu), I(c, r->cached_prefixes),
          G(c, (double)r->cached_prefixes_bytes_per_gpu), I(c, r->prefixes_in_pool));
    else
        P("   checkpoints prefix caching keeps a state every %s tokens "
          "(--state-checkpoint-interval),\n"
          "              %s each;\n"
          "              a cached %s-token prompt: %s blocks of KV (%s) + %s checkpoint%s = %s\n"
          "              (%s keeping only its last); %s cached prompts (--cached-prefixes): %s;\n"
          "              the pool holds %s\n",
          I(c, r->checkpoint_interval), BY(c, r->state_bytes_per_seq_per_gpu),
          I(c, p->prompt_tokens), I(c, p->prompt_tokens / p->block_size),
          BY(c, r->prefix_kv_bytes_per_gpu), I(c, r->checkpoints_per_prefix),
          r->checkpoints_per_prefix == 1 ? "" : "s", BY(c, r->prefix_bytes_per_gpu),
          BY(c, r->prefix_bytes_last_checkpoint_per_gpu), I(c, r->cached_prefixes),
          G(c, (double)r->cached_prefixes_bytes_per_gpu), I(c, r->prefixes_in_pool));
    if (!r->checkpoints_per_prefix)
        P("              the prompt is shorter than the interval: no state of it is kept, and a "
          "hit on it\n"
          "              recomputes it whole\n");
    if (none)
        P("   restart    no attention layer: a cached prefix resumes only at a checkpoint, "
          "multiples of %s\n"
          "              tokens; a hit of h tokens resumes at the last one at or before h, "
          "recomputing %s tokens\n"
          "              on average (%s at the recompute rate); the typical prompt cached whole "
          "resumes at %s\n"
          "              and recomputes %s\n\n",
          I(c, r->restart_boundary_tokens), N(c, r->mean_recomputed_tokens),
          TIME(c, r->mean_recompute_s), I(c, r->prompt_resume_tokens),
          I(c, r->prompt_recomputed_tokens));
    else
        P("   restart    attention layers resume at any block (%u tokens), recurrent layers only "
          "at a checkpoint:\n"
          "              every layer resumes at multiples of lcm(%u, %s) = %s tokens; a hit of h "
          "tokens resumes\n"
          "              at the last one at or before h, recomputing %s tokens on average (%s at "
          "the recompute\n"
          "              rate); the typical prompt cached whole resumes at %s and recomputes "
          "%s\n\n",
          p->block_size, p->block_size, I(c, r->checkpoint_interval),
          I(c, r->restart_boundary_tokens), N(c, r->mean_recomputed_tokens),
          TIME(c, r->mean_recompute_s), I(c, r->prompt_resume_tokens),
          I(c, r->prompt_recomputed_tokens));
}

int kvc_plan_render_text(const kvc_plan_result_t *r, char **out)
{
    if (!r || !out) return KVC_EINVAL;
    rc_t *c = calloc(1, sizeof *c);
    if (!c) return KVC_ENOMEM;
    header(c, r);
    sec_kv(c, r);
    sec_ledger(c, r);
    sec_phases(c, r);
    sec_concurrency(c, r);
    sec_sliding(c, r);
    sec_prefill(c, r);
    sec_forks(c, r);
    sec_disagg(c, r);
    sec_tiers(c, r);
    sec_little(c, r);
    sec_spec(c, r);
    sec_tenancy(c, r);
    if (r->params.cp > 1 || r->n_layouts || r->max_position_embeddings_scaled) sec_longctx(c, r);
    if (r->n_dtype_grid) sec_grid(c, r);
    if (r->model.recurrent) sec_recurrent(c, r);
    if (r->model.image_tokens) sec_multimodal(c, r);
    if (r->fits)
        P("verdict: starts; the KV pool holds %s sequences of %s tokens per replica, and the "
          "running batch\n         stops at %s (%s)\n",
          I(c, r->max_concurrency), I(c, r->request_tokens), I(c, r->ceilings[r->binding_ceiling]),
          kvc_plan_ceiling_name(r->binding_ceiling));
    else
        P("verdict: does not start (%s)\n",
          kvc_plan_phase_name((kvc_plan_phase_id_t)r->failed_phase));
    int rc = 0;
    if (c->b.failed || !c->b.s) {
        free(c->b.s);
        rc = KVC_ENOMEM;
    } else {
        *out = c->b.s;
    }
    free(c);
    return rc;
}

#undef P

/* ---- JSON -------------------------------------------------------------------- */
/* Every cJSON call can fail for memory; one failure marks the whole document,
 * so the renderer never hands out a silently truncated object. */
typedef struct {
    bool oom;
} jctx_t;

static cJSON *chk(jctx_t *j, cJSON *v)
{
    if (!v) j->oom = true;
    return v;
}
/* Attach item to an array (key NULL) or an object; on failure free it. */
static void attach(jctx_t *j, cJSON *to, const char *key, cJSON *item)
{
    bool ok =
        item && to && (key ? cJSON_AddItemToObject(to, key, item) : cJSON_AddItemToArray(to, item));
    if (!ok) {
        cJSON_Delete(item);
        j->oom = true;
    }
}
/* Integers go out as raw digits so that bytes stay exact past 2^53. */
static void add_u64(jctx_t *j, cJSON *o, const char *k, uint64_t v)
{
    if (v == KVC_PLAN_UNBOUNDED) {
        chk(j, cJSON_AddNullToObject(o, k));
        return;
    }
    char buf[32];
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)v);
    chk(j, cJSON_AddRawToObject(o, k, buf));
}
static void add_i64(jctx_t *j, cJSON *o, const char *k, int64_t v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", (long long)v);
    chk(j, cJSON_AddRawToObject(o, k, buf));
}
static void add_num(jctx_t *j, cJSON *o, const char *k, double v)
{
    if (isfinite(v))
        chk(j, cJSON_AddNumberToObject(o, k, v));
    else
        chk(j, cJSON_AddNullToObject(o, k));
}
static void add_str(jctx_t *j, cJSON *o, const char *k, const char *v)
{
    chk(j, cJSON_AddStringToObject(o, k, v));
}
static void add_bool(jctx_t *j, cJSON *o, const char *k, bool v)
{
    chk(j, cJSON_AddBoolToObject(o, k, v));
}
static void add_null(jctx_t *j, cJSON *o, const char *k)
{
    chk(j, cJSON_AddNullToObject(o, k));
}

static cJSON *json_model(jctx_t *j, const kvc_plan_result_t *r)
{
    const kvc_plan_model_t *m = &r->model;
    cJSON *o = chk(j, cJSON_CreateObject());
    add_str(j, o, "name", m->name);
    add_str(j, o, "model_type", m->model_type);
    add_u64(j, o, "hidden_size", m->hidden_size);
    add_u64(j, o, "layers", m->n_layers);
    add_u64(j, o, "heads", m->n_heads);
    add_u64(j, o, "kv_heads", m->n_kv_heads);
    add_u64(j, o, "head_dim", m->head_dim);
    add_u64(j, o, "v_head_dim", m->v_head_dim);
    add_u64(j, o, "vocab_size", m->vocab_size);
    add_u64(j, o, "intermediate_size", m->intermediate_size);
    add_bool(j, o, "tie_embeddings", m->tie_embeddings);
    if (m->mla) {
        cJSON *x = chk(j, cJSON_AddObjectToObject(o, "mla"));
        add_u64(j, x, "kv_lora_rank", m->kv_lora_rank);
        add_u64(j, x, "qk_rope_head_dim", m->qk_rope_head_dim);
        add_u64(j, x, "qk_nope_head_dim", m->qk_nope_head_dim);
        add_u64(j, x, "q_lora_rank", m->q_lora_rank);
    } else {
        add_null(j, o, "mla");
    }
    if (m->n_experts) {
        cJSON *x = chk(j, cJSON_AddObjectToObject(o, "moe"));
        add_u64(j, x, "experts", m->n_experts);
        add_u64(j, x, "experts_per_token", m->n_experts_active);
        add_u64(j, x, "expert_intermediate_size", m->moe_intermediate_size);
        add_u64(j, x, "shared_experts", m->n_shared_experts);
        add_u64(j, x, "shared_expert_intermediate_size", m->shared_expert_intermediate_size);
        add_u64(j, x, "dense_layers", m->n_dense_layers);
    } else {
        add_null(j, o, "moe");
    }
    add_u64(j, o, "sliding_window", m->sliding_window);
    add_u64(j, o, "sliding_layers", m->n_sliding_layers);
    add_bool(j, o, "chunked_attention", m->chunked_attention);
    add_u64(j, o, "image_tokens", m->image_tokens);
    add_u64(j, o, "max_position_embeddings", m->max_position_embeddings);
    add_u64(j, o, "params_total", r->counts.total);
    add_u64(j, o, "params_active", r->counts.active);
    add_u64(j, o, "params_vision", r->counts.vision);
    add_u64(j, o, "params_recurrent", r->counts.recurrent);
    return o;
}

static cJSON *json_gpu(jctx_t *j, const kvc_plan_gpu_t *g)
{
    cJSON *o = chk(j, cJSON_CreateObject());
    add_str(j, o, "name", g->name);
    add_u64(j, o, "memory_bytes", g->memory_bytes);
    add_num(j, o, "hbm_bytes_per_s", g->hbm_bytes_per_s);
    add_num(j, o, "bf16_flops", g->bf16_flops);
    add_num(j, o, "fp8_flops", g->fp8_flops);
    add_u64(j, o, "l2_bytes", g->l2_bytes);
    add_num(j, o, "interconnect_bytes_per_s", g->interconnect_bytes_per_s);
    add_num(j, o, "pcie_bytes_per_s", g->pcie_bytes_per_s);
    return o;
}

static cJSON *json_config(jctx_t *j, const kvc_plan_result_t *r)
{
    const kvc_plan_params_t *p = &r->params;
    cJSON *o = chk(j, cJSON_CreateObject());
    add_u64(j, o, "tp", p->tp);
    add_u64(j, o, "pp", p->pp);
    add_u64(j, o, "dp", p->dp);
    add_u64(j, o, "gpus", r->n_gpus);
    add_str(j, o, "weight_dtype", kvc_plan_dtype_name(p->weight_dtype));
    add_str(j, o, "kv_dtype", kvc_plan_dtype_name(p->kv_dtype));
    add_u64(j, o, "block_size", p->block_size);
    add_num(j, o, "gpu_memory_utilization", p->gpu_memory_utilization);
    add_u64(j, o, "max_model_len", r->max_model_len);
    add_u64(j, o, "max_num_seqs", p->max_num_seqs);
    add_u64(j, o, "max_num_batched_tokens", p->max_num_batched_tokens);
    add_bool(j, o, "max_num_seqs_default", r->max_num_seqs_auto);
    add_bool(j, o, "max_num_batched_tokens_default", r->max_num_batched_tokens_auto);
    add_u64(j, o, "prompt_tokens", p->prompt_tokens);
    add_u64(j, o, "output_tokens", p->output_tokens);
    add_u64(j, o, "context_tokens", r->context_tokens);
    add_bool(j, o, "window_freeing", p->window_freeing);
    add_bool(j, o, "enforce_eager", p->enforce_eager);
    add_bool(j, o, "graphs_outside_budget", p->graphs_outside_budget);
    add_num(j, o, "mfu", p->mfu);
    add_num(j, o, "mbu", p->mbu);
    return o;
}

/* 1. KV bytes per token and the TP sweep */
static void json_kv(jctx_t *j, cJSON *o, const kvc_plan_result_t *r)
{
    add_u64(j, o, "kv_bytes_per_token", r->kv_bytes_per_token);
    add_u64(j, o, "kv_bytes_per_token_per_gpu", r->kv_bytes_per_token_per_gpu);
    add_u64(j, o, "kv_head_replication", r->kv_head_replication);
    add_u64(j, o, "kv_heads_per_gpu", r->kv_heads_per_gpu);
    add_u64(j, o, "layers_per_gpu", r->layers_per_gpu);
    add_u64(j, o, "kv_replicated_bytes_per_token", r->kv_replicated_bytes_per_token);
    add_u64(j, o, "max_tp_without_replication", r->max_tp_without_replication);
    cJSON *sweep = chk(j, cJSON_AddArrayToObject(o, "tp_sweep"));
    for (uint32_t i = 0; i < r->n_tp_rows; i++) {
        cJSON *x = chk(j, cJSON_CreateObject());
        add_u64(j, x, "tp", r->tp_rows[i].tp);
        add_u64(j, x, "kv_heads_per_gpu", r->tp_rows[i].kv_heads_per_gpu);
        add_u64(j, x, "kv_head_replication", r->tp_rows[i].replication);
        add_u64(j, x, "kv_bytes_per_token_per_gpu", r->tp_rows[i].kv_bytes_per_token_per_gpu);
        add_u64(j, x, "weight_bytes_per_gpu", r->tp_rows[i].weight_bytes_per_gpu);
        attach(j, sweep, NULL, x);
    }
}

/* 2. the startup ledger */
static void json_ledger(jctx_t *j, cJSON *o, const kvc_plan_result_t *r)
{
    add_u64(j, o, "weight_bytes_per_gpu", r->weight_bytes_per_gpu);
    add_u64(j, o, "weight_bytes_total", r->weight_bytes_total);
    cJSON *ledger = chk(j, cJSON_AddArrayToObject(o, "ledger"));
    for (uint32_t i = 0; i < r->n_ledger; i++) {
        const kvc_plan_ledger_entry_t *e = &r->ledger[i];
        cJSON *x = chk(j, cJSON_CreateObject());
        add_str(j, x, "name", e->name);
        add_u64(j, x, "bytes", e->bytes);
        add_str(j, x, "kind", kvc_plan_kind_name(e->kind));
        add_str(j, x, "engine", kvc_plan_kind_name(e->engine));
        add_str(j, x, "op", kvc_plan_op_name(e->op));
        attach(j, ledger, NULL, x);
    }
    add_i64(j, o, "kv_pool_signed_bytes", r->kv_pool_signed_bytes);
    add_u64(j, o, "kv_pool_bytes_per_gpu", r->kv_pool_bytes_per_gpu);
    add_u64(j, o, "num_blocks", r->num_blocks);
    add_u64(j, o, "pool_tokens", r->pool_tokens);
    add_u64(j, o, "binding_stage", r->binding_stage);
}

/* 3. whether it starts, and what would make it */
static void json_startup(jctx_t *j, cJSON *o, const kvc_plan_result_t *r)
{
    add_bool(j, o, "fits", r->fits);
    if (r->fits)
        add_null(j, o, "failed_phase");
    else
        add_str(j, o, "failed_phase", kvc_plan_phase_name((kvc_plan_phase_id_t)r->failed_phase));
    cJSON *phases = chk(j, cJSON_AddArrayToObject(o, "phases"));
    for (int i = 0; i < KVC_PLAN_PHASE__COUNT; i++) {
        const kvc_plan_phase_t *x = &r->phases[i];
        cJSON *e = chk(j, cJSON_CreateObject());
        add_str(j, e, "name", kvc_plan_phase_name((kvc_plan_phase_id_t)i));
        add_str(j, e, "status", kvc_plan_phase_status_name(x->status));
        add_u64(j, e, "need_bytes", x->need_bytes);
        add_u64(j, e, "have_bytes", x->have_bytes);
        add_u64(j, e, "stage", x->stage);
        attach(j, phases, NULL, e);
    }
    add_u64(j, o, "max_model_len_that_fits", r->max_model_len_that_fits);
    cJSON *sug = chk(j, cJSON_AddObjectToObject(o, "suggestions"));
    if (r->suggest_tp)
        add_u64(j, sug, "tp", r->suggest_tp);
    else
        add_null(j, sug, "tp");
    add_bool(j, sug, "fp8_kv_starts", r->suggest_fp8_kv_fits);
    if (r->suggest_utilization > 0)
        add_num(j, sug, "gpu_memory_utilization", r->suggest_utilization);
    else
        add_null(j, sug, "gpu_memory_utilization");
}

/* 4. concurrency, the ceilings and the decode roofline */
static void json_concurrency(jctx_t *j, cJSON *o, const kvc_plan_result_t *r)
{
    add_u64(j, o, "max_concurrency", r->max_concurrency);
    add_u64(j, o, "kv_bytes_per_request", r->kv_bytes_per_request);
    add_u64(j, o, "blocks_per_request", r->blocks_per_request);
    add_u64(j, o, "partial_block_waste_tokens", r->partial_block_waste_tokens);
    add_u64(j, o, "admitted_at_prompt", r->admitted_at_prompt);
    cJSON *ceil_o = chk(j, cJSON_AddObjectToObject(o, "ceilings"));
    for (int i = 0; i < KVC_PLAN_CEIL__COUNT; i++)
        add_u64(j, ceil_o, kvc_plan_ceiling_name((kvc_plan_ceiling_id_t)i), r->ceilings[i]);
    add_str(j, ceil_o, "binding", kvc_plan_ceiling_name(r->binding_ceiling));
    add_u64(j, ceil_o, "compute_weights_only", r->compute_weights_only);
    add_num(j, ceil_o, "compute_weights_only_exact", r->compute_weights_only_exact);
    add_num(j, o, "ridge_flops_per_byte", r->ridge_flops_per_byte);
    add_num(j, o, "attention_flops_per_kv_byte", r->attention_flops_per_kv_byte);
    if (r->model.mla) {
        cJSON *dp = chk(j, cJSON_AddObjectToObject(o, "mla_dp_attention"));
        add_u64(j, dp, "pool_tokens", r->dp_attention_pool_tokens);
        add_u64(j, dp, "tp_pool_tokens", r->pool_tokens);
        add_num(j, dp, "attention_flops_per_kv_byte", r->dp_attention_flops_per_kv_byte);
        add_num(j, dp, "all_to_all_bytes_per_token_layer",
                r->dp_attention_comm_bytes_per_token_layer);
        add_num(j, dp, "tp_all_reduce_bytes_per_token_layer", r->tp_comm_bytes_per_token_layer);
    } else {
        add_null(j, o, "mla_dp_attention");
    }
    cJSON *dec = chk(j, cJSON_AddObjectToObject(o, "decode"));
    add_u64(j, dec, "context_tokens", r->decode_context);
    add_num(j, dec, "flops_per_seq", r->decode_flops_per_seq);
    add_num(j, dec, "kv_bytes_read_per_seq", r->decode_bytes_per_seq);
    add_num(j, dec, "weight_bytes_read", r->weight_read_bytes);
    add_u64(j, dec, "embedding_bytes_not_read", r->embedding_bytes_not_read);
    add_u64(j, dec, "vision_bytes_not_read", r->vision_bytes_per_gpu);
    add_num(j, dec, "peak_flops", r->peak_flops);
}

/* 5. sliding windows */
static void json_sliding(jctx_t *j, cJSON *o, const kvc_plan_result_t *r)
{
    add_num(j, o, "sliding_window_saving", r->sliding_window_saving);
    cJSON *sw = chk(j, cJSON_AddObjectToObject(o, "sliding_window"));
    add_u64(j, sw, "context_tokens", r->context_tokens);
    add_u64(j, sw, "window", r->model.sliding_window);
    add_u64(j, sw, "windowed_layers", r->model.n_sliding_layers);
    add_u64(j, sw, "bytes_with_freeing", r->swa_bytes_with_freeing);
    add_u64(j, sw, "bytes_without_freeing", r->swa_bytes_without_freeing);
    add_num(j, sw, "saving_limit", r->sliding_window_saving_limit);
    add_u64(j, o, "kv_bytes_per_request_model", r->kv_bytes_per_request_model);
}

/* 6. prefill FLOPs */
static void json_prefill(jctx_t *j, cJSON *o, const kvc_plan_result_t *r)
{
    add_num(j, o, "prefill_attention_flops_fraction", r->prefill_attention_flops_fraction);
    cJSON *pf = chk(j, cJSON_AddObjectToObject(o, "prefill"));
    add_u64(j, pf, "context_tokens", r->context_tokens);
    add_num(j, pf, "linear_flops", r->prefill_linear_flops);
    add_num(j, pf, "attention_flops", r->prefill_attention_flops);
}

/* 7. forks */
static void json_forks(jctx_t *j, cJSON *o, const kvc_plan_result_t *r)
{
    const kvc_plan_params_t *p = &r->params;
    cJSON *fk = chk(j, cJSON_AddObjectToObject(o, "forks"));
    add_u64(j, fk, "n", p->n_samples);
    add_u64(j, fk, "beams", p->beams);
    add_u64(j, fk, "samples_unshared_bytes", r->fork_unshared_bytes_samples);
    add_u64(j, fk, "samples_shared_bytes", r->fork_shared_bytes_samples);
    add_u64(j, fk, "beams_unshared_bytes", r->fork_unshared_bytes_beams);
    add_u64(j, fk, "beams_shared_bytes", r->fork_shared_bytes_beams);
    add_u64(j, fk, "beams_diverged_bytes", r->fork_shared_bytes_beams_diverged);
}

/* 8. disaggregated prefill */
static void json_disagg(jctx_t *j, cJSON *o, const kvc_plan_result_t *r)
{
    const kvc_plan_params_t *p = &r->params;
    cJSON *dg = chk(j, cJSON_AddObjectToObject(o, "disaggregation"));
    add_num(j, dg, "prefill_tokens_per_s", r->prefill_tokens_per_s);
    add_str(j, dg, "prefill_rate_kind", kvc_plan_kind_name(r->prefill_rate_kind));
    add_num(j, dg, "kv_bytes_per_s", r->prefill_kv_bytes_per_s);
    add_num(j, dg, "kv_bytes_per_s_per_gpu", r->prefill_kv_bytes_per_s_per_gpu);
    add_num(j, dg, "kv_bytes_per_s_per_gpu_linear_only", r->prefill_kv_bytes_per_s_linear_only);
    add_num(j, dg, "link_bytes_per_s", p->link_bytes_per_s);
    add_num(j, dg, "link_utilization", r->link_utilization);
    add_num(j, dg, "link_limited_tokens_per_s", r->link_limited_tokens_per_s);
}

/* 9. recompute vs fetch */
static void json_tiers(jctx_t *j, cJSON *o, const kvc_plan_result_t *r)
{
    const kvc_plan_params_t *p = &r->params;
    cJSON *rf = chk(j, cJSON_AddObjectToObject(o, "recompute_vs_fetch"));
    add_num(j, rf, "recompute_s_per_token", r->recompute_s_per_token);
    add_num(j, rf, "break_even_bytes_per_s", r->break_even_bytes_per_s);
    cJSON *tiers = chk(j, cJSON_AddArrayToObject(rf, "tiers"));
    for (int i = 0; i < KVC_PLAN_TIERS; i++) {
        const kvc_plan_tier_t *t = &r->tiers[i];
        cJSON *x = chk(j, cJSON_CreateObject());
        add_str(j, x, "name", t->name);
        add_num(j, x, "bytes_per_s", t->bytes_per_s);
        add_num(j, x, "latency_s", t->latency_s);
        add_num(j, x, "fetch_s_per_token", t->fetch_s_per_token);
        add_num(j, x, "speedup", t->speedup);
        add_u64(j, x, "min_tokens_to_win", t->min_tokens_to_win);
        add_num(j, x, "max_shared_fraction", t->max_shared_fraction);
        attach(j, tiers, NULL, x);
    }
    cJSON *cps = chk(j, cJSON_AddArrayToObject(rf, "copy_granularity"));
    static const char *const copy_names[3] = {"layer_block", "block", "prompt"};
    for (int i = 0; i < 3; i++) {
        cJSON *e = chk(j, cJSON_CreateObject());
        add_str(j, e, "copy", copy_names[i]);
        add_u64(j, e, "bytes", r->copy_bytes[i]);
        add_num(j, e, "effective_bytes_per_s", r->copy_bytes_per_s[i]);
        add_bool(j, e, "beats_recompute", r->copy_bytes_per_s[i] > r->break_even_bytes_per_s);
        attach(j, cps, NULL, e);
    }
    add_u64(j, rf, "recompute_free_tokens_batch_1", r->recompute_free_tokens_batch_1);
    add_u64(j, rf, "recompute_free_tokens_at_n", r->recompute_free_tokens_at_n);
    cJSON *byp = chk(j, cJSON_AddArrayToObject(rf, "by_prefix"));
    for (uint32_t i = 0; i < r->n_recompute; i++) {
        const kvc_plan_recompute_row_t *x = &r->recompute[i];
        cJSON *e = chk(j, cJSON_CreateObject());
        add_u64(j, e, "prefix_tokens", x->prefix_tokens);
        add_num(j, e, "recompute_s_per_token", x->recompute_s_per_token);
        add_num(j, e, "attention_extra", x->attention_extra);
        add_num(j, e, "break_even_bytes_per_s", x->break_even_bytes_per_s);
        attach(j, byp, NULL, e);
    }
    cJSON *ssd = chk(j, cJSON_AddObjectToObject(rf, "ssd"));
    add_num(j, ssd, "endurance_bytes", p->ssd_endurance_bytes);
    add_num(j, ssd, "write_bytes_per_s", r->ssd_write_bytes_per_s);
    add_num(j, ssd, "endurance_days", r->ssd_endurance_days);
}

/* 10. Little's law */
static void json_little(jctx_t *j, cJSON *o, const kvc_plan_result_t *r)
{
    cJSON *lt = chk(j, cJSON_AddObjectToObject(o, "littles_law"));
    add_num(j, lt, "arrival_rate", r->arrival_rate);
    add_bool(j, lt, "arrival_rate_auto", r->arrival_rate_auto);
    add_num(j, lt, "arrival_rate_per_replica", r->arrival_rate_per_replica);
    add_bool(j, lt, "stable", r->little_stable);
    add_num(j, lt, "resident_sequences", r->little_resident);
    add_num(j, lt, "time_in_system_s", r->little_time_in_system);
    add_num(j, lt, "step_s", r->little_step_s);
    add_num(j, lt, "prefill_s", r->little_prefill_s);
    add_num(j, lt, "naive_resident_sequences", r->little_naive_resident);
    add_num(j, lt, "max_arrival_rate_per_replica", r->little_max_arrival_rate);
    add_str(j, lt, "max_arrival_rate_limited_by",
            r->little_max_by_ceiling ? "ceilings" : "throughput");
    add_u64(j, lt, "iterations", (uint64_t)r->little_iterations);
}

/* 11. speculative decoding */
static void json_spec(jctx_t *j, cJSON *o, const kvc_plan_result_t *r)
{
    const kvc_plan_params_t *p = &r->params;
    cJSON *sp = chk(j, cJSON_AddObjectToObject(o, "speculative"));
    add_u64(j, sp, "spec_tokens", p->spec_tokens);
    add_num(j, sp, "acceptance", p->spec_acceptance);
    cJSON *rows = chk(j, cJSON_AddArrayToObject(sp, "rows"));
    for (uint32_t i = 0; i < r->n_spec; i++) {
        const kvc_plan_spec_row_t *s = &r->spec[i];
        cJSON *x = chk(j, cJSON_CreateObject());
        add_u64(j, x, "spec_tokens", s->spec_tokens);
        add_u64(j, x, "max_batch_by_tokens", s->max_batch_by_tokens);
        add_u64(j, x, "compute_bound_batch", s->compute_bound_batch);
        add_num(j, x, "tokens_per_step", s->tokens_per_step);
        add_u64(j, x, "kv_slots_per_seq", s->kv_slots_per_seq);
        add_num(j, x, "speedup_at_batch_1", s->speedup_at_batch_1);
        add_u64(j, x, "loses_from_batch", s->loses_from_batch);
        attach(j, rows, NULL, x);
    }
    add_u64(j, sp, "context_tokens", r->spec_context);
    add_u64(j, sp, "draft_params", p->spec_draft_params);
    add_u64(j, sp, "draft_bytes_per_gpu", r->spec_draft_bytes_per_gpu);
    cJSON *best = chk(j, cJSON_AddArrayToObject(sp, "best_k"));
    for (uint32_t i = 0; i < r->n_spec_best; i++) {
        cJSON *x = chk(j, cJSON_CreateObject());
        add_u64(j, x, "batch", r->spec_best[i].batch);
        add_u64(j, x, "k", r->spec_best[i].best_k);
        add_num(j, x, "speedup", r->spec_best[i].speedup);
        attach(j, best, NULL, x);
    }
}

/* 12. tenancy */
static void json_tenancy(jctx_t *j, cJSON *o, const kvc_plan_result_t *r)
{
    cJSON *tn = chk(j, cJSON_AddObjectToObject(o, "tenancy"));
    add_u64(j, tn, "tokens_per_percent", r->tokens_per_percent);
    add_bool(j, tn, "tenant_tokens_over_max_model_len", r->tenant_over_max_model_len);
    if (r->params.lora_rank) {
        cJSON *lo = chk(j, cJSON_AddObjectToObject(o, "lora"));
        add_u64(j, lo, "rank", r->params.lora_rank);
        add_u64(j, lo, "adapters", r->params.lora_adapters);
        add_u64(j, lo, "resident", r->params.lora_resident);
        add_u64(j, lo, "adapter_bytes", r->lora_adapter_bytes);
        add_u64(j, lo, "adapter_bytes_per_gpu", r->lora_adapter_bytes_per_gpu);
        add_u64(j, lo, "resident_bytes_per_gpu", r->lora_resident_bytes_per_gpu);
        add_u64(j, lo, "pool_tokens_lost", r->lora_pool_tokens_lost);
        add_u64(j, lo, "shared_prefix_blocks", r->lora_prefix_blocks);
    } else {
        add_null(j, o, "lora");
    }
    add_u64(j, tn, "image_tokens", r->model.image_tokens);
    add_u64(j, tn, "image_bytes_per_gpu", r->image_bytes_per_gpu);
    cJSON *req = chk(j, cJSON_AddArrayToObject(tn, "requests"));
    for (uint32_t i = 0; i < r->n_tenants; i++) {
        const kvc_plan_tenant_row_t *t = &r->tenants[i];
        cJSON *x = chk(j, cJSON_CreateObject());
        add_u64(j, x, "tokens", t->tokens);
        add_u64(j, x, "bytes_per_gpu", t->bytes_per_gpu);
        add_num(j, x, "pool_share", t->pool_share);
        add_u64(j, x, "per_pool", t->per_pool);
        attach(j, req, NULL, x);
    }
}

/* 13. long context and context parallelism */
static void json_longctx(jctx_t *j, cJSON *o, const kvc_plan_result_t *r)
{
    const kvc_plan_params_t *p = &r->params;
    add_u64(j, o, "kv_bytes_per_request_per_gpu", r->kv_bytes_per_request_per_gpu);
    add_num(j, o, "prefill_seconds", r->prefill_seconds);
    add_u64(j, o, "ring_bytes_per_step", r->ring_bytes_per_step);
    cJSON *cp = chk(j, cJSON_AddObjectToObject(o, "context_parallel"));
    add_u64(j, cp, "cp", p->cp);
    add_u64(j, cp, "tp", p->tp);
    add_u64(j, cp, "gpus_per_node", p->gpus_per_node);
    add_str(j, cp, "rope_scaling", kvc_plan_rope_name(p->rope_scaling));
    add_num(j, cp, "rope_factor", p->rope_factor);
    add_u64(j, cp, "max_position_embeddings_scaled", r->max_position_embeddings_scaled);
    add_u64(j, cp, "context_tokens", r->context_tokens);
    add_u64(j, cp, "kv_bytes_per_request", r->kv_bytes_per_request_context);
    add_u64(j, cp, "kv_bytes_per_request_per_gpu", r->kv_bytes_per_request_per_gpu);
    add_num(j, cp, "prefill_seconds", r->prefill_seconds);
    add_num(j, cp, "prefill_attention_flops_fraction", r->prefill_attention_flops_fraction);
    add_u64(j, cp, "ring_chunk_tokens", r->ring_chunk_tokens);
    add_u64(j, cp, "ring_bytes_per_step", r->ring_bytes_per_step);
    add_num(j, cp, "ring_link_bytes_per_s", r->ring_link_bytes_per_s);
    add_num(j, cp, "ring_step_s", r->ring_step_s);
    add_num(j, cp, "ring_attention_step_s", r->ring_attention_step_s);
    add_bool(j, cp, "ring_hidden", p->cp <= 1 || r->ring_hidden);
    add_bool(j, cp, "ring_inter_node", r->ring_inter_node);
    if (p->cp > 1) {
        cJSON *d = chk(j, cJSON_AddObjectToObject(cp, "decode_exchange"));
        add_u64(j, d, "bytes_per_token_layer", r->cp_decode_bytes_per_token_layer);
        add_u64(j, d, "layers", r->cp_decode_layers);
        add_num(j, d, "latency_s", r->cp_decode_latency_s);
        add_num(j, d, "link_bytes_per_s", r->ring_link_bytes_per_s);
        cJSON *rows = chk(j, cJSON_AddArrayToObject(d, "rows"));
        for (int i = 0; i < 2; i++) {
            cJSON *e = chk(j, cJSON_CreateObject());
            const uint64_t bb = i ? r->cp_decode_batch : 1;
            add_u64(j, e, "batch", bb);
            add_u64(j, e, "bytes_per_step",
                    kvc__mul_sat(bb, (uint64_t)r->cp_decode_layers *
                                         r->cp_decode_bytes_per_token_layer));
            add_num(j, e, "exchange_s", r->cp_decode_comm_s[i]);
            add_num(j, e, "step_s", r->cp_decode_step_s[i]);
            add_num(j, e, "exchange_share", r->cp_decode_comm_s[i] / r->cp_decode_step_s[i]);
            attach(j, rows, NULL, e);
        }
    } else {
        add_null(j, cp, "decode_exchange");
    }
    cJSON *rows = chk(j, cJSON_AddArrayToObject(cp, "layouts"));
    for (uint32_t i = 0; i < r->n_layouts; i++) {
        const kvc_plan_layout_t *x = &r->layouts[i];
        cJSON *e = chk(j, cJSON_CreateObject());
        add_u64(j, e, "tp", x->tp);
        add_u64(j, e, "cp", x->cp);
        add_u64(j, e, "gpus", x->gpus);
        add_str(j, e, "kv_dtype", kvc_plan_dtype_name(x->kv_dtype));
        add_bool(j, e, "fits", x->fits);
        add_bool(j, e, "same_gpus", i < r->n_layouts_same_gpus);
        add_bool(j, e, "inter_node", x->inter_node);
        add_u64(j, e, "kv_bytes_per_request_per_gpu", x->kv_bytes_per_request_per_gpu);
        add_u64(j, e, "weight_bytes_per_gpu", x->weight_bytes_per_gpu);
        add_num(j, e, "prefill_seconds", x->prefill_seconds);
        add_u64(j, e, "ring_bytes_per_step", x->ring_bytes_per_step);
        add_bool(j, e, "ring_hidden", x->ring_hidden);
        attach(j, rows, NULL, e);
    }
}

/* 15. recurrent state */
static void json_recurrent(jctx_t *j, cJSON *o, const kvc_plan_result_t *r)
{
    const kvc_plan_model_t *m = &r->model;
    if (!m->recurrent) {
        add_null(j, o, "recurrent");
        return;
    }
    cJSON *x = chk(j, cJSON_AddObjectToObject(o, "recurrent"));
    add_str(j, x, "kind", kvc_plan_recurrent_name(m->recurrent));
    add_u64(j, x, "recurrent_layers", m->n_recurrent_layers);
    add_u64(j, x, "attention_layers", kvc__attn_layers(m));
    if (m->layer_pattern[0])
        add_str(j, x, "layer_pattern", m->layer_pattern);
    else
        add_null(j, x, "layer_pattern");
    add_u64(j, x, "attn_layer_period", m->attn_layer_period);
    add_u64(j, x, "attn_layer_offset", m->attn_layer_offset);
    add_u64(j, x, "d_inner", m->ssm_d_inner);
    add_u64(j, x, "d_state", m->ssm_d_state);
    add_u64(j, x, "d_conv", m->ssm_d_conv);
    add_u64(j, x, "ssm_heads", m->ssm_n_heads);
    add_u64(j, x, "ssm_head_dim", m->ssm_head_dim);
    add_u64(j, x, "ssm_groups", m->ssm_n_groups);
    add_u64(j, x, "conv_channels", kvc__conv_channels(m, 1));
    add_str(j, x, "ssm_state_dtype", r->params.ssm_state_fp32 ? "float32" : "auto");
    add_u64(j, x, "conv_state_bytes_per_layer", r->conv_state_bytes_per_layer);
    add_u64(j, x, "ssm_state_bytes_per_layer", r->ssm_state_bytes_per_layer);
    add_u64(j, x, "state_bytes_per_seq", r->state_bytes_per_seq);
    add_u64(j, x, "state_bytes_per_seq_per_gpu", r->state_bytes_per_seq_per_gpu);
    add_u64(j, x, "recurrent_layers_per_gpu", r->recurrent_layers_per_gpu);
    add_u64(j, x, "kv_layers_per_gpu", r->kv_layers_per_gpu);
    add_u64(j, x, "kv_bytes_per_token", r->kv_bytes_per_token);
    add_u64(j, x, "all_attention_kv_bytes_per_token", r->all_attention_kv_bytes_per_token);
    add_u64(j, x, "state_kv_tokens", r->state_kv_tokens);
    add_u64(j, x, "request_kv_bytes_per_gpu", r->request_kv_bytes);
    add_u64(j, x, "request_bytes_per_gpu", r->kv_bytes_per_request);
    add_u64(j, x, "max_sequences", r->max_concurrency);
    add_u64(j, x, "state_only_sequences", r->state_only_sequences);
    add_u64(j, x, "checkpoint_interval", r->checkpoint_interval);
    add_u64(j, x, "checkpoint_bytes_per_gpu", r->state_bytes_per_seq_per_gpu);
    add_u64(j, x, "checkpoints_per_prefix", r->checkpoints_per_prefix);
    add_u64(j, x, "prefix_kv_bytes_per_gpu", r->prefix_kv_bytes_per_gpu);
    add_u64(j, x, "prefix_bytes_per_gpu", r->prefix_bytes_per_gpu);
    add_u64(j, x, "prefix_bytes_last_checkpoint_per_gpu", r->prefix_bytes_last_checkpoint_per_gpu);
    add_u64(j, x, "cached_prefixes", r->cached_prefixes);
    add_u64(j, x, "cached_prefixes_bytes_per_gpu", r->cached_prefixes_bytes_per_gpu);
    add_u64(j, x, "prefixes_in_pool", r->prefixes_in_pool);
    add_u64(j, x, "restart_boundary_tokens", r->restart_boundary_tokens);
    /* attention layers resume at any block, recurrent ones at a checkpoint; the common
     * boundary (restart_boundary_tokens) is what prefix caching can hit */
    if (no_kv(r))
        add_null(j, x, "attention_restart_tokens");
    else
        add_u64(j, x, "attention_restart_tokens", r->params.block_size);
    add_u64(j, x, "recurrent_restart_tokens", r->checkpoint_interval);
    add_num(j, x, "mean_recomputed_tokens", r->mean_recomputed_tokens);
    add_num(j, x, "mean_recompute_s", r->mean_recompute_s);
    add_u64(j, x, "prompt_resume_tokens", r->prompt_resume_tokens);
    add_u64(j, x, "prompt_recomputed_tokens", r->prompt_recomputed_tokens);
}

/* 16. multimodal */
static void json_multimodal(jctx_t *j, cJSON *o, const kvc_plan_result_t *r)
{
    static const char *const phase_names[3] = {"encoder", "prefill", "decode"};
    const kvc_plan_model_t *m = &r->model;
    if (!m->image_tokens) {
        add_null(j, o, "multimodal");
        return;
    }
    cJSON *x = chk(j, cJSON_AddObjectToObject(o, "multimodal"));
    add_u64(j, x, "image_tokens", m->image_tokens);
    add_u64(j, x, "images_per_request", r->images_per_request);
    add_u64(j, x, "vision_params", r->counts.vision);
    add_u64(j, x, "vision_bytes_per_gpu", r->vision_bytes_per_gpu);
    add_u64(j, x, "vision_tokens_per_image", m->vision_tokens);
    add_u64(j, x, "encoder_budget_tokens", r->encoder_budget_tokens);
    add_u64(j, x, "encoder_images", r->encoder_images);
    add_u64(j, x, "encoder_live_elems_per_token", r->encoder_live_elems_per_token);
    if (r->encoder_live_elems_per_token)
        add_u64(j, x, "encoder_activation_bytes", r->encoder_activation_bytes);
    else
        add_null(j, x, "encoder_activation_bytes");
    add_u64(j, x, "encoder_cache_bytes_per_image", r->encoder_cache_bytes_per_image);
    add_u64(j, x, "encoder_cache_bytes", r->encoder_cache_bytes);
    cJSON *ph = chk(j, cJSON_AddObjectToObject(x, "phases"));
    for (int i = 0; i < 3; i++) add_u64(j, ph, phase_names[i], r->phase_bytes[i]);
    add_str(j, x, "peak_phase", phase_names[r->peak_phase]);
    add_u64(j, x, "activation_peak_bytes", r->activation_bytes);
    add_u64(j, x, "text_only_activation_bytes", r->text_only_activation_bytes);
    add_u64(j, x, "pool_tokens_lost", r->encoder_pool_tokens_lost);
    add_u64(j, x, "image_kv_bytes_per_gpu", r->image_bytes_per_gpu);
    add_u64(j, x, "request_with_images_bytes_per_gpu", r->image_request_bytes_per_gpu);
}

static cJSON *build_json(jctx_t *j, const kvc_plan_result_t *r)
{
    cJSON *o = chk(j, cJSON_CreateObject());
    if (!o) return NULL;
    attach(j, o, "model", json_model(j, r));
    attach(j, o, "gpu", json_gpu(j, &r->gpu));
    attach(j, o, "config", json_config(j, r));
    /* the sections in the order the text prints them */
    json_kv(j, o, r);
    json_ledger(j, o, r);
    json_startup(j, o, r);
    json_concurrency(j, o, r);
    json_sliding(j, o, r);
    json_prefill(j, o, r);
    json_forks(j, o, r);
    json_disagg(j, o, r);
    json_tiers(j, o, r);
    json_little(j, o, r);
    json_spec(j, o, r);
    json_tenancy(j, o, r);
    json_longctx(j, o, r);
    json_recurrent(j, o, r);
    json_multimodal(j, o, r);
    if (r->params.grid_dtypes) {
        cJSON *grid = chk(j, cJSON_AddArrayToObject(o, "dtype_grid"));
        for (uint32_t i = 0; i < r->n_dtype_grid; i++) {
            const kvc_plan_grid_row_t *x = &r->dtype_grid[i];
            cJSON *e = chk(j, cJSON_CreateObject());
            add_str(j, e, "weight_dtype", kvc_plan_dtype_name(x->weight_dtype));
            add_str(j, e, "kv_dtype", kvc_plan_dtype_name(x->kv_dtype));
            add_bool(j, e, "fits", x->fits);
            if (x->fits)
                add_null(j, e, "failed_phase");
            else
                add_str(j, e, "failed_phase",
                        kvc_plan_phase_name((kvc_plan_phase_id_t)x->failed_phase));
            add_u64(j, e, "weight_bytes_per_gpu", x->weight_bytes_per_gpu);
            add_u64(j, e, "kv_pool_bytes_per_gpu", x->kv_pool_bytes_per_gpu);
            add_u64(j, e, "max_concurrency", x->max_concurrency);
            add_u64(j, e, "max_model_len_that_fits", x->max_model_len_that_fits);
            attach(j, grid, NULL, e);
        }
    }
    return o;
}

int kvc_plan_render_json(const kvc_plan_result_t *r, char **out)
{
    if (!r || !out) return KVC_EINVAL;
    jctx_t j = {false};
    cJSON *o = build_json(&j, r);
    char *s = o && !j.oom ? cJSON_Print(o) : NULL;
    cJSON_Delete(o);
    if (!s) return KVC_ENOMEM;
    /* cJSON allocates with malloc (its default hooks); hand out a copy we own so that
     * kvc_plan_string_free is always plain free(). */
    size_t n = strlen(s);
    char *copy = malloc(n + 1);
    if (copy) memcpy(copy, s, n + 1);
    cJSON_free(s);
    if (!copy) return KVC_ENOMEM;
    *out = copy;
    return 0;
}

void kvc_plan_string_free(char *s)
{
    free(s);
}
