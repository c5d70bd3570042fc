/* plan_int.h - internals shared by the plan layer's files: a growable string
 * buffer for the renderers, number formatting, and the one-line message
 * helper.  Never installed. */
#ifndef KVC_PLAN_INT_H
#define KVC_PLAN_INT_H

#include "util/msg.h"
#include "kvcache/plan.h"

#include <stdarg.h>
#include <stdio.h>

#define KVC__KIB (UINT64_C(1) << 10)
#define KVC__MIB (UINT64_C(1) << 20)
#define KVC__GIB (UINT64_C(1) << 30)

/* A growable NUL-terminated string.  Once an append fails, `failed` stays set
 * and later appends do nothing, so callers check once at the end. */
typedef struct {
    char *s;
    size_t len, cap;
    bool failed;
} kvc__sbuf_t;

void kvc__sb_printf(kvc__sbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void kvc__sb_vprintf(kvc__sbuf_t *b, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));

/* Formatting into caller buffers (each at least 32 bytes).  Return the buffer. */
char *kvc__fmt_int(char *buf, size_t len, uint64_t v);          /* 1,234,567 */
char *kvc__fmt_bytes(char *buf, size_t len, uint64_t v);        /* 1.50 GiB / 320 KiB / 12 B */
char *kvc__fmt_gib(char *buf, size_t len, double v);            /* 71.30 GiB, always GiB */
char *kvc__fmt_rate(char *buf, size_t len, double bytes_per_s); /* 3.35 TB/s / 450 GB/s */
char *kvc__fmt_flops(char *buf, size_t len, double flops);      /* 1.21e15 FLOP */
char *kvc__fmt_num(char *buf, size_t len, double v);            /* 3 significant digits */

/* Copy s into out[0..cap), NUL-terminated, with every control byte (below 0x20,
 * and DEL) written as \xNN, so that a name or path from the input never puts raw
 * control bytes on a terminal.  Truncates to fit.  Returns out. */
char *kvc__escape(char *out, size_t cap, const char *s);

/* Layer kinds of a hybrid model (model.c): whether layer i keeps a recurrent state, attends
 * (holds KV), has an MoE or a dense MLP.  Without a layer pattern every layer has a mixer
 * (recurrent or attention) and an MLP (MoE or dense); with one, each layer is one of them. */
bool kvc__layer_recurrent(const kvc_plan_model_t *m, uint32_t i);
bool kvc__layer_attention(const kvc_plan_model_t *m, uint32_t i);
bool kvc__layer_moe(const kvc_plan_model_t *m, uint32_t i);
bool kvc__layer_mlp(const kvc_plan_model_t *m, uint32_t i);
typedef struct {
    uint32_t attention, recurrent, mlp, moe; /* layers with each sublayer */
} kvc__layer_counts_t;
void kvc__layer_counts(const kvc_plan_model_t *m, kvc__layer_counts_t *c);
uint32_t kvc__attn_layers(const kvc_plan_model_t *m); /* the layers that hold KV */
/* One recurrent mixer's parameters on one GPU of a TP group: the quantizable projections and
 * the 16-bit rest (convolution, A, D, biases, norms), by kind. */
void kvc__mamba_params(const kvc_plan_model_t *m, uint32_t tp, uint64_t *linear, uint64_t *wide);
/* Channels the causal convolution keeps d_conv - 1 inputs of, per GPU: d_inner / tp (Mamba-1),
 * + 2 x groups x d_state (Mamba-2's B and C; Gated DeltaNet's q and k). */
uint64_t kvc__conv_channels(const kvc_plan_model_t *m, uint32_t tp);
/* Mamba-2 groups (Gated DeltaNet key heads) on one GPU, as vLLM shards them. */
uint64_t kvc__ssm_groups(const kvc_plan_model_t *m, uint32_t tp);

/* Integer helpers (saturating where a product could overflow). */
static inline uint64_t kvc__ceil_div(uint64_t a, uint64_t b)
{
    return b ? a / b + (a % b != 0) : 0;
}
static inline uint64_t kvc__mul_sat(uint64_t a, uint64_t b)
{
    kvc__u128 p = (kvc__u128)a * b;
    return p > UINT64_MAX ? UINT64_MAX : (uint64_t)p;
}

/* ---- estimates ------------------------------------------------------------------
 * Rules of thumb, not measurements.  The output labels every number derived
 * from them "estimated" and says how to pass the engine's measured figure.
 */
/* The sampler's peak during the profile run: about ten fp32 copies of the
 * logits (logits, softmax, log-softmax, sorted values and int64 indices for
 * top-p/top-k) for max_num_seqs rows.  Calibrated on vLLM's published profile
 * of Llama-3-8B on an H100 (github.com/vllm-project/vllm/pull/10511): 1.26 GiB
 * of activation peak at TP 1 and at TP 2, i.e. not sharded by TP; this gives
 * 256 x 128,256 x 40 B = 1.22 GiB. */
#define KVC__SAMPLER_BYTES_PER_LOGIT    40
/* Graph pools: each captured batch size keeps per-layer buffers alive.  One
 * public observation (github.com/vllm-project/vllm/issues/7553: 2,464 MiB for 35
 * graphs of a 60-layer model at TP 4, about 1.2 MiB per graph and layer with
 * the all-reduce buffers) says real pools can be larger than this. */
#define KVC__GRAPH_BYTES_PER_LAYER      (512 * KVC__KIB)
#define KVC__GRAPH_MAX_BATCH            512 /* vLLM captures batch sizes 1, 2, 4, 8, 16, ... 512 */
/* Memory outside the framework allocator used by the profile run: cuBLAS and
 * attention workspaces (vLLM logs 0.16-0.20 GiB, pull/12126 and pull/14447),
 * plus NCCL channels and custom all-reduce buffers when GPUs talk. */
#define KVC__NON_TORCH_BYTES            (256 * KVC__MIB)
#define KVC__NON_TORCH_COMM_BYTES       (512 * KVC__MIB)
/* The CUDA context, created before the engine measures anything. */
#define KVC__CUDA_CONTEXT_BYTES         (512 * KVC__MIB)
/* Per-transfer latencies of the tiers (launch and setup, not bandwidth). */
#define KVC__LATENCY_HBM_S              5e-6
#define KVC__LATENCY_HOST_S             10e-6
#define KVC__LATENCY_NVME_S             100e-6
#define KVC__LATENCY_NETWORK_S          30e-6
/* One small collective (the decode-time CP exchange of partial attention results): NCCL's
 * latency floor for a few KiB, within a node over NVLink and between nodes. */
#define KVC__COLLECTIVE_LATENCY_S       10e-6
#define KVC__COLLECTIVE_LATENCY_INTER_S 30e-6
/* Pipeline stages planned at most (each a struct on the stack). */
#define KVC__MAX_STAGES                 64

#endif
