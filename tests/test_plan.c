/* test_plan.c - the capacity planner's formulas, one by one, on small models
 * whose numbers are derived by hand in the comments; its validation; the
 * config reader; the renderers; and randomized sweeps that check the
 * invariants every plan must keep. */
#include "test_helpers.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define GIB (UINT64_C(1) << 30)
#define MIB (UINT64_C(1) << 20)

/* A small dense model: H 64, 4 layers, 8 heads of 8, 2 KV heads, vocab 100,
 * MLP 128, untied.  Parameters (derived once, used below):
 *   attention per layer: q 64x64 = 4,096; k, v 2 x 64x16 = 2,048; o 4,096 -> 10,240
 *   MLP per layer: 3 x 64 x 128 = 24,576;  norms 2 x 64 = 128  -> 34,944 per layer
 *   4 layers 139,776 + embedding 6,400 + LM head 6,400 + final norm 64 = 152,640 */
static kvc_plan_model_t tiny(void)
{
    return (kvc_plan_model_t){.name = "tiny",
                              .hidden_size = 64,
                              .n_layers = 4,
                              .n_heads = 8,
                              .n_kv_heads = 2,
                              .head_dim = 8,
                              .v_head_dim = 8,
                              .vocab_size = 100,
                              .intermediate_size = 128,
                              .max_position_embeddings = 4096};
}

/* 10 GiB, 1 TB/s, 100 TFLOP/s bf16, 200 fp8. */
static kvc_plan_gpu_t tiny_gpu(void)
{
    return (kvc_plan_gpu_t){.name = "tiny GPU",
                            .memory_bytes = 10 * GIB,
                            .hbm_bytes_per_s = 1e12,
                            .bf16_flops = 100e12,
                            .fp8_flops = 200e12,
                            .l2_bytes = 32 * MIB,
                            .interconnect_bytes_per_s = 100e9,
                            .pcie_bytes_per_s = 32e9};
}

static kvc_plan_gpu_t preset_gpu(const char *name)
{
    kvc_plan_gpu_t g;
    assert_ok(kvc_plan_gpu_preset(name, &g));
    return g;
}

static kvc_plan_model_t preset_model(const char *name)
{
    kvc_plan_model_t m;
    assert_ok(kvc_plan_model_preset(name, &m));
    return m;
}

/* The defaults with the engine limits these hand derivations were written for, 256
 * sequences and 8,192 batched tokens (kvc_plan_params_default leaves them 0: vLLM's default for
 * the GPU, tested in vllm_batch_defaults_follow_the_gpu). */
static kvc_plan_params_t defaults(void)
{
    kvc_plan_params_t p = kvc_plan_params_default();
    p.max_num_seqs = 256;
    p.max_num_batched_tokens = 8192;
    return p;
}

/* The result is a few kilobytes: keep it off the stack of every test. */
static kvc_plan_result_t *plan(const kvc_plan_model_t *m, const kvc_plan_gpu_t *g,
                               const kvc_plan_params_t *p)
{
    kvc_plan_result_t *r = malloc(sizeof *r);
    assert_non_null(r);
    char msg[256] = "";
    int rc = kvc_plan_compute(m, g, p, r, msg, sizeof msg);
    if (rc) fail_msg("kvc_plan_compute: %s (%s)", kvc_strerror(rc), msg);
    return r;
}

/* Expect kvc_plan_compute to refuse the input with `err` and a message containing `needle`. */
static void expect_refused(const kvc_plan_model_t *m, const kvc_plan_gpu_t *g,
                           const kvc_plan_params_t *p, int err, const char *needle)
{
    kvc_plan_result_t *r = malloc(sizeof *r);
    assert_non_null(r);
    char msg[256] = "";
    int rc = kvc_plan_compute(m, g, p, r, msg, sizeof msg);
    free(r);
    assert_int_equal(rc, err);
    if (!strstr(msg, needle)) fail_msg("message '%s' lacks '%s'", msg, needle);
    assert_null(strchr(msg, '\n')); /* one line */
}

static const kvc_plan_ledger_entry_t *entry(const kvc_plan_result_t *r, const char *name)
{
    for (uint32_t i = 0; i < r->n_ledger; i++)
        if (!strcmp(r->ledger[i].name, name)) return &r->ledger[i];
    fail_msg("no ledger entry %s", name);
    return NULL;
}

/* ---- units and names ----------------------------------------------------- */
static void dtypes_have_names_bits_and_aliases(void **state)
{
    (void)state;
    kvc_plan_dtype_t dt;
    assert_string_equal(kvc_plan_dtype_name(KVC_PLAN_BF16), "bf16");
    assert_string_equal(kvc_plan_dtype_name(KVC_PLAN_INT4), "int4");
    assert_string_equal(kvc_plan_dtype_name((kvc_plan_dtype_t)99), "?");
    assert_int_equal(kvc_plan_dtype_bits(KVC_PLAN_FP16), 16);
    assert_int_equal(kvc_plan_dtype_bits(KVC_PLAN_FP8), 8);
    assert_int_equal(kvc_plan_dtype_bits(KVC_PLAN_INT4), 4);
    assert_int_equal(kvc_plan_dtype_bits((kvc_plan_dtype_t)99), 0);
    assert_ok(kvc_plan_dtype_parse("bfloat16", &dt));
    assert_int_equal(dt, KVC_PLAN_BF16);
    assert_ok(kvc_plan_dtype_parse("FP8_E4M3", &dt));
    assert_int_equal(dt, KVC_PLAN_FP8);
    assert_ok(kvc_plan_dtype_parse("half", &dt));
    assert_int_equal(dt, KVC_PLAN_FP16);
    assert_ok(kvc_plan_dtype_parse("fp4", &dt));
    assert_int_equal(dt, KVC_PLAN_NVFP4);
    assert_ok(kvc_plan_dtype_parse("INT8", &dt));
    assert_int_equal(dt, KVC_PLAN_INT8);
    assert_string_equal(kvc_plan_dtype_name(KVC_PLAN_NVFP4), "nvfp4");
    assert_int_equal(kvc_plan_dtype_parse("fp3", &dt), KVC_EINVAL);
    /* bytes with block scales: nvfp4 9 B per 16 (rounded up), int4 0.5 B + 4 B per 128 */
    assert_int_equal(kvc_plan_dtype_bytes(KVC_PLAN_NVFP4, 4096), 4096 / 16 * 9);
    assert_int_equal(kvc_plan_dtype_bytes(KVC_PLAN_NVFP4, 17), 18);
    assert_int_equal(kvc_plan_dtype_bytes(KVC_PLAN_INT8, 4096), 4096);
    assert_int_equal(kvc_plan_dtype_bytes(KVC_PLAN_INT4, 256), 128 + 8);
    assert_int_equal(kvc_plan_dtype_bytes(KVC_PLAN_BF16, 3), 6);
    assert_int_equal(kvc_plan_dtype_bytes((kvc_plan_dtype_t)99, 3), 0);
    assert_int_equal(kvc_plan_dtype_parse(NULL, &dt), KVC_EINVAL);
}

static void sizes_distinguish_gb_from_gib(void **state)
{
    (void)state;
    uint64_t v;
    assert_ok(kvc_plan_parse_bytes("80GiB", &v));
    assert_int_equal(v, 80 * GIB);
    assert_ok(kvc_plan_parse_bytes("80GB", &v));
    assert_int_equal(v, UINT64_C(80000000000));
    assert_ok(kvc_plan_parse_bytes("1.5 MiB", &v));
    assert_int_equal(v, 1572864);
    assert_ok(kvc_plan_parse_bytes("1234", &v));
    assert_int_equal(v, 1234);
    assert_ok(kvc_plan_parse_bytes("1.5e9", &v));
    assert_int_equal(v, 1500000000);
    assert_ok(kvc_plan_parse_bytes("2kb", &v)); /* case-insensitive, bytes not bits */
    assert_int_equal(v, 2000);
    const char *bad[] = {"", "-1GiB", "+5", "12XB", "GiB", "1e30", "nan", "inf", "5 5", NULL};
    for (int i = 0; bad[i]; i++)
        if (kvc_plan_parse_bytes(bad[i], &v) != KVC_EINVAL) fail_msg("accepted '%s'", bad[i]);
    double d;
    assert_ok(kvc_plan_parse_rate("3.35TB/s", &d));
    assert_true(d == 3.35e12);
    assert_ok(kvc_plan_parse_rate("64", &d)); /* a bare number is GB/s */
    assert_true(d == 64e9);
    assert_ok(kvc_plan_parse_rate("1 GiB/s", &d));
    assert_true(d == 1073741824.0);
    assert_int_equal(kvc_plan_parse_rate("3.35TB", &d), KVC_EINVAL);
    assert_int_equal(kvc_plan_parse_rate("-1GB/s", &d), KVC_EINVAL);
}

static void presets_are_found_case_insensitively(void **state)
{
    (void)state;
    kvc_plan_gpu_t g;
    kvc_plan_model_t m;
    assert_int_equal(kvc_plan_gpu_preset_count(), 8);
    const char *want[] = {"a100-80gb-sxm", "a100-40gb", "h100-sxm", "h100-pcie",
                          "h200",          "b200",      "l40s",     "mi300x"};
    for (size_t i = 0; i < KVC_ARRAY_LEN(want); i++) {
        assert_string_equal(kvc_plan_gpu_preset_name(i), want[i]);
        assert_ok(kvc_plan_gpu_preset(want[i], &g));
        assert_ok(kvc_plan_gpu_check(&g, NULL, 0));
        /* Runtime totals sit below the nominal capacity and above 90% of it. */
        assert_true(g.memory_bytes > 39 * GIB && g.memory_bytes < 200 * GIB);
        assert_true(g.hbm_bytes_per_s > 0.5e12 && g.bf16_flops > 300e12);
    }
    assert_null(kvc_plan_gpu_preset_name(8));
    /* A100 40GB: 39.59 GiB as PyTorch reports it, 1,555 GB/s, no fp8 */
    assert_ok(kvc_plan_gpu_preset("A100-SXM4-40GB", &g));
    assert_int_equal(g.memory_bytes, (uint64_t)3959 * GIB / 100);
    assert_true(g.hbm_bytes_per_s == 1555e9 && g.fp8_flops == 0);
    assert_ok(kvc_plan_gpu_preset("H100", &g));
    assert_string_equal(g.name, "H100 SXM");
    assert_ok(kvc_plan_gpu_preset("A100", &g));
    assert_true(g.fp8_flops == 0); /* Ampere has no fp8 tensor cores */
    assert_ok(kvc_plan_gpu_preset("MI300X", &g));
    assert_int_equal(g.memory_bytes, UINT64_C(201310208) * 1024); /* rocminfo's pool */
    assert_int_equal(kvc_plan_gpu_preset("h300", &g), KVC_ENOENT);
    assert_int_equal(kvc_plan_gpu_preset(NULL, &g), KVC_ENOENT);
    assert_ok(kvc_plan_model_preset("Llama-3.1-70B", &m));
    assert_int_equal(m.n_layers, 80);
    assert_int_equal(kvc_plan_model_preset("llama-9", &m), KVC_ENOENT);
    for (size_t i = 0; i < kvc_plan_model_preset_count(); i++) {
        assert_ok(kvc_plan_model_preset(kvc_plan_model_preset_name(i), &m));
        assert_ok(kvc_plan_model_check(&m, NULL, 0));
    }
    assert_null(kvc_plan_model_preset_name(kvc_plan_model_preset_count()));
}

/* ---- 1. KV bytes per token ---------------------------------------------------- */
static void kv_bytes_per_token_is_2_layers_heads_dim_bytes(void **state)
{
    (void)state;
    kvc_plan_model_t m = tiny();
    kvc_plan_gpu_t g = tiny_gpu();
    kvc_plan_params_t p = defaults();
    p.prompt_tokens = 100;
    p.output_tokens = 20;
    kvc_plan_result_t *r = plan(&m, &g, &p);
    /* 2 x 4 layers x 2 KV heads x 8 x 2 B = 256 */
    assert_int_equal(r->kv_bytes_per_token, 256);
    assert_int_equal(r->kv_bytes_per_token_per_gpu, 256);
    assert_int_equal(r->kv_head_replication, 1);
    free(r);
    p.kv_dtype = KVC_PLAN_FP8; /* one byte per element: half */
    r = plan(&m, &g, &p);
    assert_int_equal(r->kv_bytes_per_token, 128);
    free(r);
}

static void mla_caches_one_latent_without_the_factor_2(void **state)
{
    (void)state;
    kvc_plan_model_t m = tiny();
    m.mla = true;
    m.kv_lora_rank = 16;
    m.qk_rope_head_dim = 4;
    m.qk_nope_head_dim = 8;
    m.head_dim = 12;
    m.v_head_dim = 8;
    m.n_kv_heads = 8;
    kvc_plan_gpu_t g = tiny_gpu();
    kvc_plan_params_t p = defaults();
    p.prompt_tokens = 100;
    p.output_tokens = 20;
    p.tp = 4;
    kvc_plan_result_t *r = plan(&m, &g, &p);
    /* (16 + 4) x 4 layers x 2 B = 160: no K/V pair */
    assert_int_equal(r->kv_bytes_per_token, 160);
    /* every GPU of TP 4 holds the full latent: 4 copies, 3 x 160 = 480 B per token are copies */
    assert_int_equal(r->kv_bytes_per_token_per_gpu, 160);
    assert_int_equal(r->kv_head_replication, 4);
    assert_int_equal(r->kv_replicated_bytes_per_token, 480);
    assert_int_equal(r->max_tp_without_replication, 1);
    free(r);
    /* Pipeline parallelism splits the layers instead: 2 per stage, no copies. */
    p.tp = 1;
    p.pp = 2;
    r = plan(&m, &g, &p);
    assert_int_equal(r->kv_bytes_per_token_per_gpu, 80);
    assert_int_equal(r->kv_replicated_bytes_per_token, 0);
    free(r);
}

static void tp_splits_kv_heads_then_replicates_them(void **state)
{
    (void)state;
    kvc_plan_model_t m = tiny(); /* 8 query heads, 2 KV heads */
    kvc_plan_gpu_t g = tiny_gpu();
    kvc_plan_params_t p = defaults();
    p.prompt_tokens = 100;
    p.output_tokens = 20;
    const struct {
        uint32_t tp, heads, rep;
        uint64_t kv_gpu, copies;
    } cases[] = {
        {1, 2, 1, 256, 0},
        {2, 1, 1, 128, 0},   /* 2 / 2 = 1 head per GPU: 2 x 4 x 1 x 8 x 2 */
        {4, 1, 2, 128, 256}, /* past the head count: still 128, each head on 2 GPUs */
        {8, 1, 4, 128, 768}, /* 8 x 128 - 256 = 768 B of copies per token */
    };
    uint64_t weights_prev = UINT64_MAX;
    for (size_t i = 0; i < KVC_ARRAY_LEN(cases); i++) {
        p.tp = cases[i].tp;
        kvc_plan_result_t *r = plan(&m, &g, &p);
        assert_int_equal(r->kv_heads_per_gpu, cases[i].heads);
        assert_int_equal(r->kv_head_replication, cases[i].rep);
        assert_int_equal(r->kv_bytes_per_token_per_gpu, cases[i].kv_gpu);
        assert_int_equal(r->kv_replicated_bytes_per_token, cases[i].copies);
        assert_true(r->weight_bytes_per_gpu < weights_prev); /* the weights keep shrinking */
        weights_prev = r->weight_bytes_per_gpu;
        free(r);
    }
    /* The sweep in the result says the same, one row per valid TP. */
    p.tp = 1;
    kvc_plan_result_t *r = plan(&m, &g, &p);
    assert_int_equal(r->n_tp_rows, 4); /* 1, 2, 4, 8; 16 does not divide 8 heads */
    assert_int_equal(r->tp_rows[3].tp, 8);
    assert_int_equal(r->tp_rows[3].replication, 4);
    assert_int_equal(r->tp_rows[3].kv_bytes_per_token_per_gpu, 128);
    free(r);
}

static void impossible_parallelism_is_one_clear_error(void **state)
{
    (void)state;
    kvc_plan_model_t m = tiny();
    kvc_plan_gpu_t g = tiny_gpu();
    kvc_plan_params_t p = defaults();
    p.prompt_tokens = 100;
    p.output_tokens = 20;
    p.tp = 3;
    expect_refused(&m, &g, &p, KVC_EINVAL, "--tp 3 does not divide the 8 attention heads");
    p.tp = 16;
    expect_refused(&m, &g, &p, KVC_EINVAL, "--tp 16 does not divide the 8 attention heads");
    /* 48 query heads, 12 KV heads: TP 8 divides 48 but neither divides 12 nor is a multiple */
    kvc_plan_model_t odd = tiny();
    odd.n_heads = 48;
    odd.n_kv_heads = 12;
    odd.hidden_size = 384;
    p.tp = 8;
    expect_refused(&odd, &g, &p, KVC_EINVAL, "neither divides the 12 KV heads");
    p.tp = 1;
    p.pp = 5;
    expect_refused(&m, &g, &p, KVC_EINVAL, "--pp 5 exceeds the 4 layers");
    p.pp = 1;
    p.kv_dtype = KVC_PLAN_INT4;
    expect_refused(&m, &g, &p, KVC_EINVAL, "int4 is a weight format");
    p.kv_dtype = KVC_PLAN_BF16;
    p.block_size = 24;
    expect_refused(&m, &g, &p, KVC_EINVAL, "--block-size 24");
    p.block_size = 16;
    p.gpu_memory_utilization = 1.5;
    expect_refused(&m, &g, &p, KVC_EINVAL, "--gpu-memory-utilization 1.5");
    p.gpu_memory_utilization = 0.9;
    p.max_num_seqs = 9000;
    expect_refused(&m, &g, &p, KVC_EINVAL, "is less than --max-num-seqs 9000");
    p.max_num_seqs = 256;
    p.prompt_tokens = 4000;
    p.output_tokens = 200;
    expect_refused(&m, &g, &p, KVC_EINVAL, "longer than max_model_len 4096");
    p.prompt_tokens = 100;
    p.max_model_len = 8192;
    expect_refused(&m, &g, &p, KVC_EINVAL, "exceeds the model's max_position_embeddings 4096");
    p.max_model_len = 0;
    m.max_position_embeddings = 0;
    expect_refused(&m, &g, &p, KVC_EINVAL, "set --max-model-len");
    m = tiny();
    p.mfu = 0;
    expect_refused(&m, &g, &p, KVC_EINVAL, "--mfu");
    p.mfu = 0.5;
    p.spec_acceptance = 1.5; /* 1 is allowed: every draft accepted */
    expect_refused(&m, &g, &p, KVC_EINVAL, "--spec-acceptance");
    p.spec_acceptance = 0.7;
    g.bf16_flops = 0;
    expect_refused(&m, &g, &p, KVC_EINVAL, "bf16 FLOP/s");
    g = tiny_gpu();
    m.n_kv_heads = 3; /* does not divide 8 */
    expect_refused(&m, &g, &p, KVC_EINVAL, "num_key_value_heads 3 does not divide");
}

/* ---- parameters and weights ------------------------------------------------------ */
static void params_are_counted_by_part(void **state)
{
    (void)state;
    kvc_plan_model_t m = tiny();
    kvc_plan_param_count_t c;
    kvc_plan_model_params(&m, &c);
    assert_int_equal(c.attention, 4 * 10240);
    assert_int_equal(c.mlp_dense, 4 * 24576);
    assert_int_equal(c.norms, 4 * 128 + 64);
    assert_int_equal(c.embedding, 6400);
    assert_int_equal(c.lm_head, 6400);
    assert_int_equal(c.total, 152640);
    assert_int_equal(c.active, 152640);
    m.tie_embeddings = true; /* the LM head reuses the table */
    kvc_plan_model_params(&m, &c);
    assert_int_equal(c.total, 152640 - 6400);
    /* MoE: 4 experts of width 32, 1 per token, 1 shared, first layer dense.
     * expert 3 x 64 x 32 = 6,144; MoE layers 3: routed 3 x 4 x 6,144 = 73,728,
     * shared 3 x 6,144 = 18,432, router 3 x 64 x 4 = 768; dense MLP 1 x 24,576.
     * active skips 3 of 4 experts in 3 layers: 73,728 - 3 x 3 x 6,144 = 18,432 kept. */
    m = tiny();
    m.n_experts = 4;
    m.n_experts_active = 1;
    m.moe_intermediate_size = 32;
    m.n_shared_experts = 1;
    m.n_dense_layers = 1;
    kvc_plan_model_params(&m, &c);
    assert_int_equal(c.experts_routed, 73728);
    assert_int_equal(c.experts_shared, 18432);
    assert_int_equal(c.router, 768);
    assert_int_equal(c.mlp_dense, 24576);
    assert_int_equal(c.total, 40960 + 24576 + 73728 + 18432 + 768 + 576 + 12800);
    assert_int_equal(c.active, c.total - 3 * 3 * 6144);
}

static void weight_bytes_follow_the_dtype_and_the_tp_shard(void **state)
{
    (void)state;
    kvc_plan_model_t m = tiny();
    kvc_plan_gpu_t g = tiny_gpu();
    kvc_plan_params_t p = defaults();
    p.prompt_tokens = 100;
    p.output_tokens = 20;
    /* bf16: 152,640 x 2 = 305,280; projections 139,264, 16-bit 13,376 */
    kvc_plan_result_t *r = plan(&m, &g, &p);
    assert_int_equal(r->weight_bytes_per_gpu, 305280);
    assert_int_equal(r->weight_linear_params_per_gpu, 139264);
    assert_int_equal(r->weight_wide_params_per_gpu, 13376);
    assert_int_equal(r->weight_bytes_total, 305280);
    free(r);
    /* fp8: projections 1 B, embeddings and norms stay 16-bit: 139,264 + 2 x 13,376 */
    p.weight_dtype = KVC_PLAN_FP8;
    r = plan(&m, &g, &p);
    assert_int_equal(r->weight_bytes_per_gpu, 139264 + 26752);
    free(r);
    /* int4: 139,264 / 2 + ceil(139,264 / 128) x 4 B of scale and zero + 26,752 */
    p.weight_dtype = KVC_PLAN_INT4;
    r = plan(&m, &g, &p);
    assert_int_equal(r->weight_bytes_per_gpu, 69632 + 1088 * 4 + 26752);
    free(r);
    /* TP 2: per layer q 2,048 + k,v 2 x 64 x 8 + o 2,048 + MLP 3 x 64 x 64 = 17,408 (x4);
     * vocab-parallel embedding and head 2 x 3,200, norms replicated 4 x 128 + 64:
     * 2 x (69,632 + 6,976) = 153,216 */
    p.weight_dtype = KVC_PLAN_BF16;
    p.tp = 2;
    r = plan(&m, &g, &p);
    assert_int_equal(r->weight_bytes_per_gpu, 153216);
    free(r);
}

/* ---- 2. ledger ------------------------------------------------------------------ */
static void ledger_runs_in_engine_order_and_leaves_the_pool(void **state)
{
    (void)state;
    kvc_plan_model_t m = tiny();
    kvc_plan_gpu_t g = tiny_gpu();
    kvc_plan_params_t p = defaults();
    p.prompt_tokens = 100;
    p.output_tokens = 20;
    kvc_plan_result_t *r = plan(&m, &g, &p);
    const char *order[] = {"memory_visible", "budget",    "weights",      "activation_peak",
                           "cuda_graphs",    "non_torch", "cuda_context", "kv_pool"};
    assert_int_equal(r->n_ledger, KVC_ARRAY_LEN(order));
    for (size_t i = 0; i < KVC_ARRAY_LEN(order); i++)
        assert_string_equal(r->ledger[i].name, order[i]);
    /* budget = floor(10 GiB x 0.9) = 9,663,676,416 */
    assert_int_equal(entry(r, "budget")->bytes, UINT64_C(9663676416));
    /* activation: forward 8,192 tokens x (4 x 64 + q 64 + k,v 32 + attention out 64 + MLP 3 x 128
     * = 800 values) x 2 B = 13,107,200 > sampler 256 x 100 x 40 = 1,024,000 */
    assert_int_equal(r->activation_elems_per_token, 800);
    assert_int_equal(entry(r, "activation_peak")->bytes, 13107200);
    assert_int_equal(r->activation_sampler_bytes, 1024000);
    /* graphs: 35 sizes (1, 2, 4, 8..256) x 4 layers x 512 KiB + 256 x 800 x 2 B */
    assert_int_equal(r->n_cuda_graphs, 35);
    assert_int_equal(entry(r, "cuda_graphs")->bytes, 35 * 4 * 524288 + 256 * 800 * 2);
    assert_int_equal(entry(r, "non_torch")->bytes, 256 * MIB);
    assert_int_equal(entry(r, "cuda_context")->bytes, 512 * MIB);
    assert_int_equal(entry(r, "cuda_context")->op, KVC_PLAN_OP_OUTSIDE);
    /* pool = 9,663,676,416 - 305,280 - 13,107,200 - 73,809,920 - 268,435,456 = 9,308,018,560 */
    assert_int_equal(r->kv_pool_bytes_per_gpu, UINT64_C(9308018560));
    assert_int_equal(entry(r, "kv_pool")->bytes, UINT64_C(9308018560));
    /* blocks = floor(9,308,018,560 / (16 x 256)) = 2,272,465 */
    assert_int_equal(r->num_blocks, 2272465);
    assert_int_equal(r->pool_tokens, 2272465 * 16);
    for (uint32_t i = 2; i < 6; i++) assert_int_equal(r->ledger[i].kind, KVC_PLAN_ESTIMATED);
    assert_int_equal(entry(r, "kv_pool")->kind, KVC_PLAN_ESTIMATED);
    assert_int_equal(entry(r, "memory_visible")->kind, KVC_PLAN_CONFIGURED);
    free(r);

    /* Passing every engine measurement turns the estimates into measured numbers, and the
     * pool inherits "measured" from them. */
    p.weight_bytes = 1 * GIB;
    p.activation_bytes = 2 * GIB;
    p.cuda_graph_bytes = 512 * MIB;
    p.non_torch_bytes = 256 * MIB;
    p.cuda_context_bytes = 400 * MIB;
    r = plan(&m, &g, &p);
    for (uint32_t i = 2; i < 7; i++) assert_int_equal(r->ledger[i].kind, KVC_PLAN_MEASURED);
    assert_int_equal(entry(r, "kv_pool")->kind, KVC_PLAN_MEASURED);
    assert_int_equal(r->kv_pool_bytes_per_gpu, UINT64_C(9663676416) - 3 * GIB - 768 * MIB);
    free(r);

    /* An explicit KV budget is configured, and utilization no longer matters. */
    p = defaults();
    p.prompt_tokens = 100;
    p.output_tokens = 20;
    p.kv_cache_bytes = 1 * GIB;
    p.gpu_memory_utilization = 0.1;
    r = plan(&m, &g, &p);
    assert_int_equal(entry(r, "kv_pool")->kind, KVC_PLAN_CONFIGURED);
    assert_int_equal(r->kv_pool_bytes_per_gpu, GIB);
    assert_int_equal(r->num_blocks, GIB / 4096);
    assert_true(r->fits);
    free(r);
}

static void graphs_outside_the_budget_do_not_shrink_the_pool(void **state)
{
    (void)state;
    kvc_plan_model_t m = tiny();
    kvc_plan_gpu_t g = tiny_gpu();
    kvc_plan_params_t p = defaults();
    p.prompt_tokens = 100;
    p.output_tokens = 20;
    p.cuda_graph_bytes = 1 * GIB;
    kvc_plan_result_t *in = plan(&m, &g, &p);
    p.graphs_outside_budget = true;
    kvc_plan_result_t *out = plan(&m, &g, &p);
    assert_int_equal(out->kv_pool_bytes_per_gpu, in->kv_pool_bytes_per_gpu + GIB);
    assert_int_equal(entry(out, "cuda_graphs")->op, KVC_PLAN_OP_OUTSIDE);
    assert_int_equal(entry(in, "cuda_graphs")->op, KVC_PLAN_OP_SUBTRACT);
    free(in);
    free(out);
    p = defaults();
    p.prompt_tokens = 100;
    p.output_tokens = 20;
    p.enforce_eager = true;
    kvc_plan_result_t *r = plan(&m, &g, &p);
    assert_int_equal(r->cuda_graph_bytes, 0);
    assert_int_equal(r->n_cuda_graphs, 0);
    assert_int_equal(entry(r, "cuda_graphs")->kind, KVC_PLAN_CONFIGURED);
    assert_int_equal(r->phases[KVC_PLAN_PHASE_CAPTURE_GRAPHS].status, KVC_PLAN_PHASE_SKIPPED);
    assert_true(r->fits);
    free(r);
}

/* ---- 3. startup phases ------------------------------------------------------------ */
static void check_failed_at(const kvc_plan_result_t *r, kvc_plan_phase_id_t ph)
{
    assert_false(r->fits);
    assert_int_equal(r->failed_phase, ph);
    assert_int_equal(r->phases[ph].status, KVC_PLAN_PHASE_FAILED);
    assert_true(r->phases[ph].need_bytes > r->phases[ph].have_bytes);
    for (int i = 0; i < (int)ph; i++) assert_int_equal(r->phases[i].status, KVC_PLAN_PHASE_OK);
    for (int i = ph + 1; i < KVC_PLAN_PHASE__COUNT; i++)
        assert_int_equal(r->phases[i].status, KVC_PLAN_PHASE_NOT_REACHED);
}

static void each_startup_phase_can_be_the_one_that_fails(void **state)
{
    (void)state;
    kvc_plan_gpu_t h100 = preset_gpu("h100-sxm");
    kvc_plan_model_t m8 = preset_model("llama-3.1-8b"), m70 = preset_model("llama-3.1-70b");
    kvc_plan_params_t p = defaults();
    kvc_plan_result_t *r;

    /* init: a budget of 100% leaves no room for the CUDA context that exists already */
    p.gpu_memory_utilization = 1.0;
    r = plan(&m8, &h100, &p);
    check_failed_at(r, KVC_PLAN_PHASE_INIT);
    free(r);

    /* load_weights: 405B in bf16 is 756 GiB; one H100 has 79.22 */
    p = defaults();
    kvc_plan_model_t m405 = preset_model("llama-3.1-405b");
    r = plan(&m405, &h100, &p);
    check_failed_at(r, KVC_PLAN_PHASE_LOAD_WEIGHTS);
    /* TP 2, 4, 8 still load more than 79.22 GiB per GPU (756 / 8 = 94.6 GiB); TP 16 loads
     * 47.3 GiB and leaves ~21 GiB of pool for a 131,072-token request of 126 layers x 1 KV
     * head x 128 x 2 x 2 B = 63 KiB per token, 7.9 GiB: it starts */
    assert_int_equal(r->suggest_tp, 16);
    free(r);

    /* profile: a measured 70 GiB activation peak next to 14.96 GiB of weights */
    p = defaults();
    p.activation_bytes = 70 * GIB;
    r = plan(&m8, &h100, &p);
    check_failed_at(r, KVC_PLAN_PHASE_PROFILE);
    free(r);

    /* allocate_kv_pool: 70B at TP 2 with utilization 0.5: budget 39.61 GiB < 65.71 GiB of
     * weights, though the weights themselves fit in the device */
    p = defaults();
    p.tp = 2;
    p.gpu_memory_utilization = 0.5;
    r = plan(&m70, &h100, &p);
    check_failed_at(r, KVC_PLAN_PHASE_ALLOCATE_KV);
    assert_int_equal(r->kv_pool_bytes_per_gpu, 0);
    assert_true(r->kv_pool_signed_bytes < 0);
    assert_int_equal(r->num_blocks, 0);
    assert_int_equal(r->max_concurrency, 0);
    free(r);

    /* check_max_model_len: 70B at TP 2 (the golden test derives the numbers) */
    p = defaults();
    p.tp = 2;
    r = plan(&m70, &h100, &p);
    check_failed_at(r, KVC_PLAN_PHASE_CHECK_MAX_LEN);
    free(r);

    /* capture_cuda_graphs: graphs captured after the pool, in the slack: 79.22 - 0.5 - 71.30
     * = 7.42 GiB free, and the graphs take 10 GiB */
    p = defaults();
    p.graphs_outside_budget = true;
    p.cuda_graph_bytes = 10 * GIB;
    r = plan(&m8, &h100, &p);
    check_failed_at(r, KVC_PLAN_PHASE_CAPTURE_GRAPHS);
    free(r);
    /* ... and inside the budget the same 10 GiB is reserved up front: it starts */
    p.graphs_outside_budget = false;
    r = plan(&m8, &h100, &p);
    assert_true(r->fits);
    assert_int_equal(r->failed_phase, -1);
    free(r);
}

static void a_refusal_says_what_would_start(void **state)
{
    (void)state;
    kvc_plan_gpu_t h100 = preset_gpu("h100-sxm");
    kvc_plan_model_t m70 = preset_model("llama-3.1-70b");
    kvc_plan_params_t p = defaults();
    p.tp = 2;
    kvc_plan_result_t *r = plan(&m70, &h100, &p);
    /* TP 4 halves the weights (32.86 GiB) and the KV per token (80 KiB): a 131,072-token
     * request needs 10 GiB of a ~33 GiB pool */
    assert_int_equal(r->suggest_tp, 4);
    /* fp8 KV halves the 20 GiB to 10 GiB, still above the 2.13 GiB pool */
    assert_false(r->suggest_fp8_kv_fits);
    /* needing 69.17 + 20 = 89.17 GiB of a 79.22 GiB GPU: no utilization helps */
    assert_true(r->suggest_utilization == 0);
    /* the largest max_model_len the pool holds: its request fits, one more token does not */
    assert_true(kvc_plan_request_bytes(r, r->max_model_len_that_fits) <= r->kv_pool_bytes_per_gpu);
    assert_true(kvc_plan_request_bytes(r, r->max_model_len_that_fits + 1) >
                r->kv_pool_bytes_per_gpu);
    free(r);
    /* With max_model_len 16,384 it needs 2.5 GiB against the 2.13 GiB pool: a utilization of
     * (69.17 + 2.5) / 79.22 = 0.905 would do. */
    p.max_model_len = 16384;
    r = plan(&m70, &h100, &p);
    assert_int_equal(r->failed_phase, KVC_PLAN_PHASE_CHECK_MAX_LEN);
    assert_true(r->suggest_utilization > 0.9 && r->suggest_utilization < 0.91);
    assert_true(r->suggest_fp8_kv_fits); /* 1.25 GiB < 2.13 GiB */
    free(r);
    p.gpu_memory_utilization = 0.91;
    r = plan(&m70, &h100, &p);
    assert_true(r->fits);
    free(r);
    /* An overdrawn budget (utilization 0.5: 39.61 GiB against 65.71 GiB of weights) needs the
     * weights, activation, graphs and non-torch memory plus one block: 69.17 GiB of 79.22,
     * a utilization of 0.874 */
    p.gpu_memory_utilization = 0.5;
    r = plan(&m70, &h100, &p);
    assert_int_equal(r->failed_phase, KVC_PLAN_PHASE_ALLOCATE_KV);
    assert_true(r->suggest_utilization > 0.87 && r->suggest_utilization < 0.88);
    free(r);
    p.gpu_memory_utilization = 0.875;
    r = plan(&m70, &h100, &p);
    assert_int_equal(r->failed_phase, KVC_PLAN_PHASE_CHECK_MAX_LEN); /* past allocation now */
    free(r);
}

/* ---- 4. concurrency and ceilings -------------------------------------------------- */
static void concurrency_is_the_pool_over_a_block_rounded_request(void **state)
{
    (void)state;
    kvc_plan_model_t m = preset_model("llama-3.1-8b");
    kvc_plan_gpu_t g = preset_gpu("h100-sxm");
    kvc_plan_params_t p = defaults();
    p.prompt_tokens = 1000;
    p.output_tokens = 210; /* 1,210 tokens: 76 blocks, 6 tokens wasted in the last */
    kvc_plan_result_t *r = plan(&m, &g, &p);
    assert_int_equal(r->blocks_per_request, 76);
    assert_int_equal(r->partial_block_waste_tokens, 6);
    assert_int_equal(r->kv_bytes_per_request, 76 * 16 * 131072);
    assert_int_equal(r->max_concurrency, r->kv_pool_bytes_per_gpu / (76 * 16 * 131072));
    assert_int_equal(r->ceilings[KVC_PLAN_CEIL_KV_MEMORY], r->max_concurrency);
    /* admission on the prompt (1,001 tokens: 63 blocks) lets more in than can finish */
    assert_int_equal(r->admitted_at_prompt, r->kv_pool_bytes_per_gpu / (63 * 16 * 131072));
    assert_true(r->admitted_at_prompt > r->max_concurrency);
    /* the binding ceiling is the lowest */
    for (int c = 0; c < KVC_PLAN_CEIL__COUNT; c++)
        assert_true(r->ceilings[r->binding_ceiling] <= r->ceilings[c]);
    free(r);
    /* max_num_seqs binds when set low; draft tokens shrink the token-budget ceiling */
    p.max_num_seqs = 8;
    p.spec_tokens = 3;
    r = plan(&m, &g, &p);
    assert_int_equal(r->binding_ceiling, KVC_PLAN_CEIL_MAX_NUM_SEQS);
    assert_int_equal(r->ceilings[KVC_PLAN_CEIL_MAX_NUM_BATCHED_TOKENS], 8192 / 4);
    free(r);
    p.max_num_seqs = 256;
    p.max_num_batched_tokens = 256;
    p.spec_tokens = 3;
    r = plan(&m, &g, &p);
    assert_int_equal(r->binding_ceiling, KVC_PLAN_CEIL_MAX_NUM_BATCHED_TOKENS);
    assert_int_equal(r->ceilings[KVC_PLAN_CEIL_MAX_NUM_BATCHED_TOKENS], 64);
    free(r);
}

static void compute_ridge_counts_weights_and_kv_reads(void **state)
{
    (void)state;
    kvc_plan_model_t m = preset_model("llama-3.1-70b");
    kvc_plan_gpu_t g = preset_gpu("h100-sxm");
    kvc_plan_params_t p = defaults();
    p.tp = 2;
    kvc_plan_result_t *r = plan(&m, &g, &p);
    /* ridge = 989.5e12 / 3.35e12 = 295.37 FLOP/B */
    assert_true(fabs(r->ridge_flops_per_byte - 989.5 / 3.35) < 1e-9);
    /* weights only: 70,555,025,408 B per GPU, of which the input embedding shard, 64,128 x
     * 8,192 x 2 B = 1,050,673,152 B, is not read (one row per token): W = 69,504,352,256 B
     * read per step; a token multiplies 2 x (34,225,520,640 projections + 525,336,576 LM-head
     * shard) = 69,501,714,432 FLOP; compute-bound from B x 69,501,714,432 / 989.5e12 >=
     * 69,504,352,256 / 3.35e12, B >= 295.38 (the ridge point, 295.37, within the norms): 296 */
    assert_int_equal(r->embedding_bytes_not_read, 1050673152);
    assert_true(fabs(r->weight_read_bytes - 69504352256.0) < 1);
    assert_int_equal(r->compute_weights_only, 296);
    assert_true(fabs(r->compute_weights_only_exact - 295.384) < 1e-3);
    /* with KV: attention at the mean decode context 1,100: 2 x 32 heads x (128 + 128) x 1,100 x
     * 80 layers = 1,441,792,000 FLOP, and 1,100 x 163,840 = 180,224,000 B of KV read per
     * sequence: B >= W / (70,943,506,432 / 295.37 - 180,224,000) = 1,159.2: 1,160 */
    assert_true(fabs(r->decode_flops_per_seq - 70943506432.0) < 1);
    assert_true(fabs(r->decode_bytes_per_seq - 180224000.0) < 1);
    assert_int_equal(r->ceilings[KVC_PLAN_CEIL_COMPUTE], 1160);
    free(r);
    /* At a 4,000-token context each sequence reads more KV than its FLOPs can cover: decode
     * never turns compute-bound (4,100 x 163,840 B = 672 MB > 70.9e9 / 295 = 240 MB). */
    p.prompt_tokens = 4000;
    r = plan(&m, &g, &p);
    assert_int_equal(r->ceilings[KVC_PLAN_CEIL_COMPUTE], KVC_PLAN_UNBOUNDED);
    assert_int_equal(r->compute_weights_only, 296); /* the textbook number does not move */
    free(r);
}

/* ---- issue 15: what the planner got wrong ---------------------------------------------- */
static void embedding_is_not_read_per_decode_step(void **state)
{
    (void)state;
    kvc_plan_gpu_t tg = tiny_gpu();
    kvc_plan_model_t m = preset_model("llama-3.1-8b");
    kvc_plan_gpu_t g = preset_gpu("h100-sxm");
    kvc_plan_params_t p = defaults();
    kvc_plan_result_t *r = plan(&m, &g, &p);
    /* 8,030,261,248 params x 2 B = 16,060,522,496 B of weights (16.06 GB); the input table,
     * 128,256 x 4,096 x 2 B = 1,050,673,152 B, is looked up one row per token: a step reads
     * 15,009,849,344 B (15.01 GB) */
    assert_int_equal(r->weight_bytes_per_gpu, 16060522496u);
    assert_int_equal(r->embedding_bytes_not_read, 1050673152u);
    assert_true(fabs(r->weight_read_bytes - 15009849344.0) < 1);
    /* The textbook ridge batch: B x 2 x 7,504,924,672 FLOP (projections + LM head) / 989.5e12
     * = 15,009,849,344 / 3.35e12 gives B* = 295.37 x (1 + 266,240 norm params / 7.50e9) =
     * 295.38: the ridge point 989.5 / 3.35 = 295.37, 296 as a whole batch (317 before) */
    assert_int_equal(r->compute_weights_only, 296);
    assert_true(fabs(r->compute_weights_only_exact - r->ridge_flops_per_byte) < 0.02);
    free(r);
    /* A tied table is the LM head: read whole every step, nothing left out (one stage)... */
    m = tiny();
    m.tie_embeddings = true;
    r = plan(&m, &tg, &p);
    assert_int_equal(r->embedding_bytes_not_read, 0);
    free(r);
    /* ...but with PP 2 the first stage's table only serves lookups: 100 x 64 x 2 B = 12,800 */
    p.pp = 2;
    r = plan(&m, &tg, &p);
    assert_int_equal(r->embedding_bytes_not_read, r->binding_stage == 0 ? 12800 : 0);
    free(r);
}

static void speculation_loses_only_when_its_tokens_cost_more_than_they_save(void **state)
{
    (void)state;
    kvc_plan_model_t m = preset_model("llama-3.1-8b");
    kvc_plan_gpu_t g = preset_gpu("h100-sxm");
    kvc_plan_params_t p = defaults();
    p.prompt_tokens = 128;
    p.output_tokens = 128;
    p.spec_tokens = 4;
    kvc_plan_result_t *r = plan(&m, &g, &p);
    /* Mean context 128 + 64 = 192: KV read 192 x 131,072 = 25,165,824 B per sequence, FLOP per
     * token 15,109,980,160; W = 15,009,849,344 B.  Tokens per step at a = 0.7, k = 4: 1 + 0.7 +
     * 0.49 + 0.343 + 0.2401 = 2.7731.  Verification turns compute-bound early (B >= 66), but
     * speculation loses only when 5 x B x FLOP / peak > 2.7731 x (W + B x KV) / bandwidth:
     * B x (7.635e-5 - 2.083e-5) > 2.7731 x 4.4805e-3, B > 223.8: from 224 (not 66 or 70) */
    assert_int_equal(r->spec[0].spec_tokens, 4);
    assert_true(fabs(r->spec[0].tokens_per_step - 2.7731) < 1e-9);
    assert_int_equal(r->spec[0].compute_bound_batch, 66);
    assert_int_equal(r->spec[0].loses_from_batch, 224);
    /* at batch 1 the step is memory-bound either way: the speedup is the tokens per step */
    assert_true(fabs(r->spec[0].speedup_at_batch_1 - 2.7731) < 1e-9);
    /* best k: 8 at small batches (3.1988 = 1 + ... + 0.7^8), 4 at 64, 1 at 256, none at 1,024 */
    assert_int_equal(r->spec_best[0].batch, 1);
    assert_int_equal(r->spec_best[0].best_k, 8);
    assert_true(fabs(r->spec_best[0].speedup - (1 - pow(0.7, 9)) / 0.3) < 1e-9);
    assert_int_equal(r->spec_best[3].batch, 64);
    assert_int_equal(r->spec_best[3].best_k, 4);
    assert_int_equal(r->spec_best[4].best_k, 1);
    assert_int_equal(r->spec_best[5].batch, 1024);
    assert_int_equal(r->spec_best[5].best_k, 0);
    free(r);
    /* At 1,000 + 200 (context 1,100) the KV reads grow faster than the verification's FLOPs
     * (144,179,200 B x 2.7731 / 3.35e12 = 1.19e-4 s per sequence > 5 x 1.56e10 / 989.5e12 =
     * 7.9e-5): k = 4 never loses, though it turns compute-bound from 126 */
    p.prompt_tokens = 1000;
    p.output_tokens = 200;
    r = plan(&m, &g, &p);
    assert_int_equal(r->spec[0].compute_bound_batch, 126);
    assert_int_equal(r->spec[0].loses_from_batch, KVC_PLAN_UNBOUNDED);
    free(r);
    /* Acceptance 1: every draft lands, k + 1 tokens a step, 5 at batch 1 */
    p.spec_acceptance = 1;
    r = plan(&m, &g, &p);
    assert_true(r->spec[0].tokens_per_step == 5);
    assert_true(fabs(r->spec[0].speedup_at_batch_1 - 5) < 1e-9);
    free(r);
    /* A 1e9-parameter draft in bf16 costs 4 steps x 2e9 B / 3.35e12 at batch 1: the plain step
     * takes (15,009,849,344 + 144,179,200) / 3.35e12 = 4.5236 ms, the speculative one 4.5236 +
     * 4 x 0.5970 = 6.9116 ms: 5 x 4.5236 / 6.9116 = 3.2725 */
    p.spec_draft_params = 1000000000;
    r = plan(&m, &g, &p);
    assert_int_equal(r->spec_draft_bytes_per_gpu, 2000000000u);
    const double t0 = (15009849344.0 + 144179200.0) / 3.35e12, td = 4 * 2e9 / 3.35e12;
    assert_true(fabs(r->spec[0].speedup_at_batch_1 - 5 * t0 / (t0 + td)) < 1e-6);
    free(r);
}

static void recompute_pays_the_prefix_attention(void **state)
{
    (void)state;
    kvc_plan_model_t m = preset_model("llama-3.1-8b");
    kvc_plan_gpu_t g = preset_gpu("h100-sxm");
    kvc_plan_params_t p = defaults();
    kvc_plan_result_t *r = plan(&m, &g, &p);
    /* linear: 2 x 6,979,588,096 = 13,959,176,192 FLOP per token; attention over a prefix of n
     * averages 2 x 32 heads x 256 x 32 layers x (n + 1) / 2 per token: at n = 32,768,
     * 8,590,196,736 FLOP, 61.5% extra at the same bf16 rate */
    assert_int_equal(r->n_recompute, 4); /* 1K, 4K, 32K, 128K: up to max_model_len 131,072 */
    assert_int_equal(r->recompute[2].prefix_tokens, 32768);
    assert_true(fabs(r->recompute[2].attention_extra - 8590196736.0 / 13959176192.0) < 1e-9);
    assert_true(fabs(r->recompute[2].recompute_s_per_token -
                     r->recompute_s_per_token * (1 + 8590196736.0 / 13959176192.0)) < 1e-15);
    assert_true(fabs(r->recompute[2].break_even_bytes_per_s -
                     131072.0 / r->recompute[2].recompute_s_per_token) < 1e-3);
    for (uint32_t i = 1; i < r->n_recompute; i++)
        assert_true(r->recompute[i].attention_extra > r->recompute[i - 1].attention_extra);
    free(r);
}

static void vllm_batch_defaults_follow_the_gpu(void **state)
{
    (void)state;
    kvc_plan_gpu_t tg = tiny_gpu();
    kvc_plan_model_t m = preset_model("llama-3.1-8b");
    kvc_plan_params_t p = kvc_plan_params_default();
    assert_int_equal(p.max_num_seqs, 0);
    assert_int_equal(p.max_num_batched_tokens, 0);
    /* vllm/engine/arg_utils.py get_batch_defaults: >= 70 GiB and not an A100: 1,024 and 8,192 */
    static const struct {
        const char *gpu;
        uint32_t seqs, tokens;
    } cases[] = {{"h100-sxm", 1024, 8192},
                 {"h200", 1024, 8192},
                 {"mi300x", 1024, 8192},
                 {"a100-80gb-sxm", 256, 2048},
                 {"l40s", 256, 2048}};
    for (size_t i = 0; i < KVC_ARRAY_LEN(cases); i++) {
        kvc_plan_gpu_t g = preset_gpu(cases[i].gpu);
        kvc_plan_result_t *r = plan(&m, &g, &p);
        assert_int_equal(r->params.max_num_seqs, cases[i].seqs);
        assert_int_equal(r->params.max_num_batched_tokens, cases[i].tokens);
        assert_true(r->max_num_seqs_auto && r->max_num_batched_tokens_auto);
        /* the sampler's profile runs max_num_seqs rows: 1,024 x 128,256 x 40 B on an H100 */
        if (cases[i].seqs == 1024)
            assert_int_equal(r->activation_sampler_bytes, UINT64_C(1024) * 128256 * 40);
        free(r);
    }
    /* the token budget is at most max_num_seqs x max_model_len, and max_num_seqs at most the
     * budget: tiny (10 GiB: 256 and 2,048) at max_model_len 4 gets 1,024 tokens, 256 seqs; an
     * explicit max_num_seqs 2 makes the budget 2 x 4 = 8 */
    kvc_plan_model_t t = tiny();
    p.max_model_len = 4;
    p.prompt_tokens = 2;
    p.output_tokens = 2;
    kvc_plan_result_t *r = plan(&t, &tg, &p);
    assert_int_equal(r->params.max_num_batched_tokens, 1024);
    assert_int_equal(r->params.max_num_seqs, 256);
    free(r);
    p.max_num_seqs = 2;
    r = plan(&t, &tg, &p);
    assert_int_equal(r->params.max_num_batched_tokens, 8);
    assert_int_equal(r->params.max_num_seqs, 2);
    assert_false(r->max_num_seqs_auto);
    free(r);
}

static void prefill_only_requests_and_long_tenants_are_priced(void **state)
{
    (void)state;
    kvc_plan_gpu_t tg = tiny_gpu();
    kvc_plan_model_t m = tiny();
    kvc_plan_params_t p = defaults();
    p.prompt_tokens = 100;
    p.output_tokens = 0; /* a disaggregated prefill node's request */
    kvc_plan_result_t *r = plan(&m, &tg, &p);
    /* ceil(100 / 16) = 7 blocks x 16 x 256 B = 28,672 B */
    assert_int_equal(r->request_tokens, 100);
    assert_int_equal(r->kv_bytes_per_request, 7 * 16 * 256);
    assert_true(r->little_stable);
    assert_false(r->tenant_over_max_model_len);
    free(r);
    p.tenant_tokens = 5000; /* over max_model_len 4,096: priced, and flagged */
    r = plan(&m, &tg, &p);
    assert_true(r->tenant_over_max_model_len);
    assert_int_equal(r->tenants[2].tokens, 5000);
    char *text = NULL;
    assert_ok(kvc_plan_render_text(r, &text));
    assert_non_null(strstr(text, "warning: --tenant-tokens 5,000 is over max_model_len 4,096"));
    kvc_plan_string_free(text);
    free(r);
}

static void quantized_kv_and_weights_price_their_scales(void **state)
{
    (void)state;
    kvc_plan_model_t m = preset_model("llama-3.1-8b");
    kvc_plan_gpu_t g = preset_gpu("b200");
    kvc_plan_params_t p = defaults();
    /* int8 KV: 1 B per element, 2 x 32 x 8 x 128 = 65,536 B per token */
    p.kv_dtype = KVC_PLAN_INT8;
    kvc_plan_result_t *r = plan(&m, &g, &p);
    assert_int_equal(r->kv_bytes_per_token, 65536);
    free(r);
    /* nvfp4 KV: per layer 2 x 8 x 128 = 2,048 elements in 2,048 / 16 x 9 = 1,152 B; x 32 layers
     * = 36,864 B per token (0.5625 B per element) */
    p.kv_dtype = KVC_PLAN_NVFP4;
    r = plan(&m, &g, &p);
    assert_int_equal(r->kv_bytes_per_token, 36864);
    assert_int_equal(r->kv_bytes_per_token_per_gpu, 36864);
    assert_int_equal(kvc_plan_kv_bytes_per_token(&m, KVC_PLAN_NVFP4), 36864);
    free(r);
    /* nvfp4 weights: the 6,979,321,856 projection params (and LM head) in 9 B per 16, the
     * 1,050,939,392 embedding and norm params in 16 bits: 3,925,868,544 + 2,101,878,784 =
     * 6,027,747,328 B; they multiply at the fp8 rate */
    p.weight_dtype = KVC_PLAN_NVFP4;
    r = plan(&m, &g, &p);
    assert_int_equal(r->weight_linear_params_per_gpu, 6979321856u);
    assert_int_equal(r->weight_bytes_per_gpu, 6979321856u / 16 * 9 + 2 * 1050939392u);
    assert_true(r->fp8_compute && r->peak_flops == g.fp8_flops);
    free(r);
    /* int4 KV stays refused: it is a weight format */
    p.kv_dtype = KVC_PLAN_INT4;
    expect_refused(&m, &g, &p, KVC_EINVAL, "int4 is a weight format");
}

static void hybrid_configs_are_read_or_refused_and_vision_towers_counted(void **state)
{
    (void)state;
    kvc_plan_model_t m;
    char msg[256];
    /* Jamba-v0.1 (ai21labs/Jamba-v0.1 config.json, trimmed): one attention layer in 8, MoE on
     * every other layer.  Sized as all-attention with MoE everywhere it came out 92 billion
     * parameters; modelled, it is 51.57 billion (tests/test_plan_golden.c derives it), and the
     * fields Jamba leaves out take JambaConfig's defaults: mamba_d_conv 4, mamba_expand 2,
     * mamba_dt_rank "auto" = 4096 / 16 = 256, expert_layer_offset 1 */
    const char *jamba =
        "{\"model_type\": \"jamba\", \"hidden_size\": 4096, \"num_hidden_layers\": 32,"
        " \"num_attention_heads\": 32, \"num_key_value_heads\": 8, \"vocab_size\":"
        " 65536, \"intermediate_size\": 14336, \"num_experts\": 16,"
        " \"num_experts_per_tok\": 2, \"attn_layer_period\": 8,"
        " \"attn_layer_offset\": 4, \"expert_layer_period\": 2,"
        " \"mamba_d_state\": 16, \"max_position_embeddings\": 262144,"
        " \"tie_word_embeddings\": false}";
    assert_ok(kvc_plan_model_from_json(jamba, strlen(jamba), "jamba", &m, msg, sizeof msg));
    assert_int_equal(m.n_recurrent_layers, 28);
    assert_int_equal(m.ssm_d_conv, 4);
    assert_int_equal(m.ssm_d_inner, 8192);
    assert_int_equal(m.ssm_dt_rank, 256);
    assert_int_equal(m.moe_layer_offset, 1);
    kvc_plan_param_count_t pc;
    kvc_plan_model_params(&m, &pc);
    assert_int_equal(pc.total, UINT64_C(51570323328));
    /* an attention offset past its period attends nowhere: refused, naming it */
    const char *bad = "{\"model_type\": \"jamba\", \"hidden_size\": 64, \"num_hidden_layers\": 2,"
                      " \"num_attention_heads\": 8, \"vocab_size\": 100, \"intermediate_size\":"
                      " 128, \"attn_layer_period\": 2, \"attn_layer_offset\": 2}";
    assert_int_equal(kvc_plan_model_from_json(bad, strlen(bad), "b", &m, msg, sizeof msg),
                     KVC_EINVAL);
    assert_non_null(strstr(msg, "attn_layer_offset 2 must be below attn_layer_period 2"));
    /* two layers below the attention offset 4: no layer attends, a pure state-space model
     * (Mamba-1 mixers and MLPs): no KV at all, its state the whole per-request memory */
    const char *pure = "{\"model_type\": \"jamba\", \"hidden_size\": 64, \"num_hidden_layers\": 2,"
                       " \"num_attention_heads\": 8, \"vocab_size\": 100, \"intermediate_size\":"
                       " 128, \"num_experts\": 1, \"num_experts_per_tok\": 1}";
    assert_ok(kvc_plan_model_from_json(pure, strlen(pure), "p", &m, msg, sizeof msg));
    assert_int_equal(m.n_recurrent_layers, 2);
    assert_int_equal(kvc_plan_kv_bytes_per_token(&m, KVC_PLAN_BF16), 0);
    /* one expert is a dense MLP (JambaConfig): 8 layers, layer 4 attends, no MoE */
    const char *one = "{\"model_type\": \"jamba\", \"hidden_size\": 64, \"num_hidden_layers\": 8,"
                      " \"num_attention_heads\": 8, \"vocab_size\": 100, \"intermediate_size\":"
                      " 128, \"num_experts\": 1, \"num_experts_per_tok\": 1}";
    assert_ok(kvc_plan_model_from_json(one, strlen(one), "o", &m, msg, sizeof msg));
    assert_int_equal(m.n_experts, 0);
    assert_int_equal(m.n_recurrent_layers, 7);
    /* an expert offset past its period: refused, naming it */
    const char *eoff = "{\"model_type\": \"jamba\", \"hidden_size\": 64, \"num_hidden_layers\": 8,"
                       " \"num_attention_heads\": 8, \"vocab_size\": 100, \"intermediate_size\":"
                       " 128, \"expert_layer_period\": 2, \"expert_layer_offset\": 3}";
    assert_int_equal(kvc_plan_model_from_json(eoff, strlen(eoff), "e", &m, msg, sizeof msg),
                     KVC_EINVAL);
    assert_non_null(strstr(msg, "expert_layer_offset 3 must be below expert_layer_period 2"));
    /* a Nemotron-H pattern string without the Mamba-2 fields that size its state: refused,
     * naming the first missing one (transformers' defaults are one checkpoint's sizes) */
    const char *nemo = "{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 8,"
                       " \"vocab_size\": 100, \"intermediate_size\": 128,"
                       " \"hybrid_override_pattern\": \"M*\"}";
    assert_int_equal(kvc_plan_model_from_json(nemo, strlen(nemo), "n", &m, msg, sizeof msg),
                     KVC_EINVAL);
    assert_non_null(strstr(msg, "mamba_num_heads is missing"));
    /* a Qwen3-Next style layer list with linear attention */
    const char *next = "{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 8,"
                       " \"vocab_size\": 100, \"intermediate_size\": 128, \"layer_types\":"
                       " [\"linear_attention\", \"full_attention\"]}";
    assert_int_equal(kvc_plan_model_from_json(next, strlen(next), "next", &m, msg, sizeof msg),
                     KVC_EINVAL);
    assert_non_null(strstr(msg, "layer_types: 'linear_attention' layers hold a recurrent state"));
    const char *mamba =
        "{\"model_type\": \"mamba2\", \"hidden_size\": 64, \"num_hidden_layers\": 2,"
        " \"num_attention_heads\": 8, \"vocab_size\": 100, \"intermediate_size\": 1}";
    assert_int_equal(kvc_plan_model_from_json(mamba, strlen(mamba), "m", &m, msg, sizeof msg),
                     KVC_EINVAL);
    assert_non_null(strstr(msg, "num_heads is missing"));
    /* LLaVA-1.5-7B (llava-hf/llava-1.5-7b-hf, trimmed): CLIP ViT-L/14 at 336 px.  Per layer
     * 4 x 1024^2 + 4 x 1024 (q, k, v, o and biases) + 2 x 1024 x 4096 + 4096 + 1024 (MLP) +
     * 4 x 1024 (two LayerNorms) = 12,596,224, x 24 = 302,309,376; patches 3 x 14 x 14 x 1024 +
     * 1024, positions (24 x 24 + 1) x 1024, class 1024: 1,195,008; projector 1024 x 4096 + 4096 +
     * 4096 x 4096 + 4096 = 20,979,712; final LayerNorm 2,048: 324,486,144 parameters */
    const char *llava =
        "{\"model_type\": \"llava\", \"text_config\": {\"model_type\": \"llama\","
        " \"hidden_size\": 4096, \"num_hidden_layers\": 32, \"num_attention_heads\":"
        " 32, \"num_key_value_heads\": 32, \"vocab_size\": 32064,"
        " \"intermediate_size\": 11008, \"max_position_embeddings\": 4096,"
        " \"tie_word_embeddings\": false}, \"vision_config\": {\"hidden_size\":"
        " 1024, \"intermediate_size\": 4096, \"num_hidden_layers\": 24,"
        " \"patch_size\": 14, \"image_size\": 336}}";
    assert_ok(kvc_plan_model_from_json(llava, strlen(llava), "llava", &m, msg, sizeof msg));
    assert_int_equal(m.vision_params, 324486144u);
    assert_int_equal(m.image_tokens, 576);
    kvc_plan_gpu_t g = preset_gpu("h100-sxm");
    kvc_plan_params_t p = defaults();
    kvc_plan_result_t *r = plan(&m, &g, &p);
    /* in the weights (16 bits), not in a decode step's reads */
    kvc_plan_model_t text = m;
    text.vision_params = 0;
    kvc_plan_result_t *t = plan(&text, &g, &p);
    assert_int_equal(r->weight_bytes_per_gpu, t->weight_bytes_per_gpu + 2 * 324486144u);
    assert_int_equal(r->vision_bytes_per_gpu, 2 * 324486144u);
    assert_true(r->weight_read_bytes == t->weight_read_bytes);
    assert_int_equal(r->counts.vision, 324486144u);
    free(r);
    free(t);
    /* a vision_config with widths but not all of them: refused, naming the field */
    const char *half = "{\"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 8,"
                       " \"vocab_size\": 100, \"intermediate_size\": 128, \"vision_config\":"
                       " {\"hidden_size\": 32, \"patch_size\": 4, \"image_size\": 16}}";
    assert_int_equal(kvc_plan_model_from_json(half, strlen(half), "h", &m, msg, sizeof msg),
                     KVC_EINVAL);
    assert_non_null(strstr(msg, "vision_config.intermediate_size is missing"));
}

static void cp_decode_exchanges_partial_softmax_results(void **state)
{
    (void)state;
    kvc_plan_model_t m = preset_model("llama-3.1-8b");
    kvc_plan_gpu_t g = preset_gpu("h100-sxm");
    kvc_plan_params_t p = defaults();
    p.prompt_tokens = 100000;
    p.output_tokens = 1000;
    p.cp = 4;
    kvc_plan_result_t *r = plan(&m, &g, &p);
    /* each of the 4 ranks attends over a quarter of the context and receives the other 3
     * partials per token and layer: per query head (32 at TP 1) the 128-wide output, its max
     * and its sum in fp32: 3 x 32 x (128 + 2) x 4 B = 49,920 B, over 32 layers */
    assert_int_equal(r->cp_decode_bytes_per_token_layer, 49920);
    assert_int_equal(r->cp_decode_layers, 32);
    /* 4 GPUs fit a node: the H100's 450 GB/s link and 10 us a collective; at batch 1:
     * 32 x (49,920 / 450e9 + 10e-6) = 32 x (0.1109 + 10) us = 323.5 us */
    assert_false(r->ring_inter_node);
    assert_true(fabs(r->cp_decode_comm_s[0] - 32 * (49920 / 450e9 + 10e-6)) < 1e-12);
    /* against the step at the achieved rates: max((weights + KV read) / (3.35 TB/s x 0.8),
     * FLOPs / (989.5 TFLOP/s x 0.5)), the KV read a quarter of the context's */
    const double step1 = fmax((r->weight_read_bytes + r->decode_bytes_per_seq) / (3.35e12 * 0.8),
                              r->decode_flops_per_seq / (989.5e12 * 0.5));
    assert_true(fabs(r->cp_decode_step_s[0] - step1) < 1e-12);
    /* the second row at the binding ceiling's batch, bytes times the batch */
    const double b = (double)r->cp_decode_batch;
    assert_int_equal(r->cp_decode_batch, r->ceilings[r->binding_ceiling]);
    assert_true(fabs(r->cp_decode_comm_s[1] - 32 * (b * 49920 / 450e9 + 10e-6)) < 1e-12);
    free(r);
    /* past the node (TP 4 x CP 4 = 16 GPUs): the inter-node link (50 GB/s) and 30 us; TP 4
     * leaves 8 query heads per GPU: 3 x 8 x 130 x 4 = 12,480 B */
    p.tp = 4;
    r = plan(&m, &g, &p);
    assert_true(r->ring_inter_node);
    assert_int_equal(r->cp_decode_bytes_per_token_layer, 12480);
    assert_true(fabs(r->cp_decode_comm_s[0] - 32 * (12480 / 50e9 + 30e-6)) < 1e-12);
    free(r);
    /* MLA decodes in the absorbed form: the partial output is the 512-wide latent per head;
     * DeepSeek-V3 at TP 8 (16 heads per GPU) x CP 2: 1 x 16 x (512 + 2) x 4 B = 32,896 B over
     * its 61 layers */
    m = preset_model("deepseek-v3");
    p = defaults();
    p.tp = 8;
    p.cp = 2;
    p.weight_dtype = KVC_PLAN_FP8;
    g = preset_gpu("h200");
    r = plan(&m, &g, &p);
    assert_int_equal(r->cp_decode_bytes_per_token_layer, 32896);
    assert_int_equal(r->cp_decode_layers, 61);
    free(r);
    /* CP 1: no exchange */
    p.cp = 1;
    r = plan(&m, &g, &p);
    assert_int_equal(r->cp_decode_bytes_per_token_layer, 0);
    free(r);
}

static void multimodal_phases_peak_and_the_encoder_cache(void **state)
{
    (void)state;
    /* LLaVA-1.5-7B (as in hybrid_configs_are_read_or_refused_and_vision_towers_counted): a Llama LM
     * of hidden 4096, 32 heads and 32 KV heads, vocab 32,064; CLIP ViT-L/14 at 336 px:
     * hidden 1024, intermediate 4096, 24 layers, (336 / 14)^2 = 576 patches + 1 class token */
    const char *llava =
        "{\"model_type\": \"llava\", \"text_config\": {\"model_type\": \"llama\","
        " \"hidden_size\": 4096, \"num_hidden_layers\": 32, \"num_attention_heads\":"
        " 32, \"num_key_value_heads\": 32, \"vocab_size\": 32064,"
        " \"intermediate_size\": 11008, \"max_position_embeddings\": 4096,"
        " \"tie_word_embeddings\": false}, \"vision_config\": {\"hidden_size\":"
        " 1024, \"intermediate_size\": 4096, \"num_hidden_layers\": 24,"
        " \"patch_size\": 14, \"image_size\": 336}}";
    kvc_plan_model_t m;
    char msg[256];
    assert_ok(kvc_plan_model_from_json(llava, strlen(llava), "llava", &m, msg, sizeof msg));
    assert_int_equal(m.vision_tokens, 577);
    kvc_plan_gpu_t g = preset_gpu("h100-sxm");
    kvc_plan_params_t p = defaults(); /* 256 sequences, 8,192 batched tokens */
    kvc_plan_result_t *r = plan(&m, &g, &p);
    /* the encoder budget max(8,192, 576) = 8,192 tokens encodes min(256 x 1, 8,192 / 576 = 14)
     * = 14 images; a ViT layer keeps 5 x 1024 + (3 x 1024 + 4096) = 12,288 live values per
     * token: 14 x 577 x 12,288 x 2 B = 198,524,928 B of activations */
    assert_int_equal(r->encoder_budget_tokens, 8192);
    assert_int_equal(r->encoder_images, 14);
    assert_int_equal(r->encoder_live_elems_per_token, 12288);
    assert_int_equal(r->encoder_activation_bytes, 198524928);
    /* an image's embeddings 576 x 4096 x 2 B = 4,718,592 B; 14 of them 66,060,288 */
    assert_int_equal(r->encoder_cache_bytes_per_image, 4718592);
    assert_int_equal(r->encoder_cache_bytes, 66060288);
    /* phases: encoder 198,524,928 + 66,060,288 = 264,585,216; prefill with images: the forward
     * 8,192 x 65,792 live values (q, k, v, o 16,384 + MLP 3 x 11,008 + 4 x 4096) x 2 B =
     * 1,077,936,128 + the embeddings = 1,143,996,416; decode: the sampler 256 x 32,064 x 40 B =
     * 328,335,360.  The prefill peaks, 66,060,288 B above the text-only peak: 126 KV tokens of
     * 524,288 B (2 x 32 x 32 x 128 x 2) the pool gives up and decode never uses */
    assert_int_equal(r->phase_bytes[0], 264585216);
    assert_int_equal(r->phase_bytes[1], UINT64_C(1143996416));
    assert_int_equal(r->phase_bytes[2], 328335360);
    assert_int_equal(r->peak_phase, 1);
    assert_int_equal(r->activation_bytes, UINT64_C(1143996416));
    assert_int_equal(r->text_only_activation_bytes, UINT64_C(1077936128));
    assert_int_equal(r->encoder_pool_tokens_lost, 126);
    /* the typical request with its image: 1,200 + 576 = 1,776 tokens, 111 blocks x 16 x
     * 524,288 B = 931,135,488 */
    assert_int_equal(r->image_request_bytes_per_gpu, 931135488);
    free(r);
    /* a small token budget and a large encoder cache: the encoder peaks.  2,048 batched
     * tokens, 4 images per request, a 32,768-token encoder budget: min(256 x 4, 32,768 / 576 =
     * 56) = 56 images, 56 x 577 x 12,288 x 2 B = 794,099,712 + 56 x 4,718,592 = 264,241,152:
     * 1,058,340,864 against the prefill's 2,048 x 65,792 x 2 B = 269,484,032 + 264,241,152 and
     * the sampler's 328,335,360 (the text-only peak): 730,005,504 B over it = 1,392 KV tokens */
    p.max_num_batched_tokens = 2048;
    p.images_per_request = 4;
    p.encoder_cache_tokens = 32768;
    r = plan(&m, &g, &p);
    assert_int_equal(r->encoder_images, 56);
    assert_int_equal(r->phase_bytes[0], UINT64_C(1058340864));
    assert_int_equal(r->phase_bytes[1], 533725184);
    assert_int_equal(r->peak_phase, 0);
    assert_int_equal(r->activation_bytes, UINT64_C(1058340864));
    assert_int_equal(r->encoder_pool_tokens_lost, 1392);
    free(r);
    /* TP 2 splits the ViT's q, k, v and MLP: 5 x 1024 + 7,168 / 2 = 8,704 live values */
    p = defaults();
    p.tp = 2;
    r = plan(&m, &g, &p);
    assert_int_equal(r->encoder_live_elems_per_token, 8704);
    free(r);
    /* a text model has none of it */
    m = preset_model("llama-3.1-8b");
    r = plan(&m, &g, &p);
    assert_int_equal(r->encoder_images, 0);
    assert_int_equal(r->phase_bytes[1], 0);
    free(r);
}

static void a_million_tokens_on_eight_h100s(void **state)
{
    (void)state;
    kvc_plan_model_t m = preset_model("llama-3.1-70b");
    kvc_plan_gpu_t g = preset_gpu("h100-sxm");
    kvc_plan_params_t p = defaults();
    p.prompt_tokens = 1048576; /* 1M: one prefill-only request of the whole context */
    p.output_tokens = 0;
    p.max_model_len = 1048576;
    p.tp = 8;
    /* past max_position_embeddings without a scaling: refused, saying how to extend it */
    expect_refused(&m, &g, &p, KVC_EINVAL, "--rope-scaling yarn:FACTOR");
    p.rope_scaling = KVC_PLAN_ROPE_YARN;
    p.rope_factor = 4; /* 4 x 131,072 = 524,288 < 1M */
    expect_refused(&m, &g, &p, KVC_EINVAL,
                   "exceeds yarn:4 x max_position_embeddings 131072 = 524288");
    p.rope_factor = 8;
    kvc_plan_result_t *r = plan(&m, &g, &p);
    assert_int_equal(r->max_position_embeddings_scaled, 1048576);
    /* 2 x 80 x 8 x 128 x 2 B = 327,680 B per token x 1,048,576 = 343,597,383,680 B = 320 GiB */
    assert_int_equal(r->kv_bytes_per_request_context, UINT64_C(320) * GIB);
    /* TP 8: one KV head per GPU, 40 GiB of it each; it starts */
    assert_int_equal(r->kv_bytes_per_request_per_gpu, UINT64_C(40) * GIB);
    assert_true(r->fits);
    /* attention 2 x 64 heads x 256 x 80 layers x n(n+1)/2 = 1.441e18 FLOP against linear
     * 2 x n x 68.45e9 = 1.436e17: 90.9% in attention */
    const double n = 1048576.0, attn = 2.0 * 64 * 256 * 80 * n * (n + 1) / 2;
    assert_true(fabs(r->prefill_attention_flops - attn) < 1e3);
    assert_true(r->prefill_attention_flops_fraction > 0.90);
    /* over 8 GPUs at MFU 0.5: (linear + attention) / 989.5e12 / 0.5 / 8 = 400.4 s */
    assert_true(fabs(r->prefill_seconds - (r->prefill_linear_flops + attn) / 989.5e12 / 0.5 / 8) <
                1e-6);
    assert_true(r->prefill_seconds > 400 && r->prefill_seconds < 401);
    /* the layouts of 8 GPUs: TP 1, 2, 4 (x CP 8, 4, 2) hold 40 GiB of KV per GPU too but their
     * weights (131, 66, 33 GiB) leave no room; TP 8 starts */
    assert_int_equal(r->n_layouts_same_gpus, 4);
    assert_int_equal(r->n_layouts, 4);
    for (uint32_t i = 0; i < 4; i++) {
        assert_int_equal(r->layouts[i].tp * r->layouts[i].cp, 8);
        assert_int_equal(r->layouts[i].kv_bytes_per_request_per_gpu, UINT64_C(40) * GIB);
        assert_int_equal(r->layouts[i].fits, r->layouts[i].tp == 8);
    }
    free(r);
    /* TP 4 x CP 2: each GPU 524,288 tokens x 2 heads x 128 x 2 x 2 B x 80 = 40 GiB; the ring
     * sends 524,288 x 1,024 B = 512 MiB per layer and step over NVLink (450 GB/s): 1.19 ms,
     * behind an attention step of n^2 / (2 x 2^2) pairs x 2 x 256 x 16 heads / (989.5e12 x 0.5)
     * = 2.276 s: hidden */
    p.tp = 4;
    p.cp = 2;
    r = plan(&m, &g, &p);
    assert_int_equal(r->n_gpus, 8);
    assert_int_equal(r->kv_bytes_per_request_per_gpu, UINT64_C(40) * GIB);
    assert_int_equal(r->ring_chunk_tokens, 524288);
    assert_int_equal(r->ring_bytes_per_step, UINT64_C(536870912));
    assert_false(r->ring_inter_node);
    assert_true(r->ring_link_bytes_per_s == 450e9);
    assert_true(fabs(r->ring_step_s - 536870912.0 / 450e9) < 1e-12);
    assert_true(fabs(r->ring_attention_step_s - n * n / 8 * 2 * 256 * 16 / (989.5e12 * 0.5)) <
                1e-9);
    assert_true(r->ring_hidden);
    assert_false(r->fits); /* the weights of TP 4 leave 40 GiB no room */
    free(r);
    /* Full multi-head attention (64 KV heads, 8x the KV: 2,560 GiB per request): no layout of
     * 8 GPUs starts (320 GiB per GPU at TP 8); more CP ranks across nodes do: TP 8 x CP 8 = 64
     * GPUs, 40 GiB each, the ring at the inter-node 50 GB/s (131,072 tokens x 8 heads x 128 x
     * 2 x 2 B = 512 MiB per step) */
    m.n_kv_heads = 64;
    p.tp = 8;
    p.cp = 1;
    r = plan(&m, &g, &p);
    assert_int_equal(r->kv_bytes_per_request_context, UINT64_C(2560) * GIB);
    assert_int_equal(r->kv_bytes_per_request_per_gpu, UINT64_C(320) * GIB);
    assert_false(r->fits);
    assert_int_equal(r->n_layouts_same_gpus, 4);
    bool found = false;
    for (uint32_t i = r->n_layouts_same_gpus; i < r->n_layouts; i++) {
        const kvc_plan_layout_t *x = &r->layouts[i];
        if (x->fits && x->kv_dtype == KVC_PLAN_BF16) {
            assert_int_equal(x->tp, 8);
            assert_int_equal(x->cp, 8);
            assert_true(x->inter_node);
            assert_int_equal(x->kv_bytes_per_request_per_gpu, UINT64_C(40) * GIB);
            assert_int_equal(x->ring_bytes_per_step, UINT64_C(536870912));
            found = true;
        }
    }
    assert_true(found);
    /* and the last row prices fp8 KV on the 8 GPUs: 160 GiB per GPU, still too much */
    assert_int_equal(r->layouts[r->n_layouts - 1].kv_dtype, KVC_PLAN_FP8);
    assert_int_equal(r->layouts[r->n_layouts - 1].kv_bytes_per_request_per_gpu,
                     UINT64_C(160) * GIB);
    char *text = NULL;
    assert_ok(kvc_plan_render_text(r, &text));
    assert_non_null(strstr(text, "none starts on 8 GPUs; what replaces it"));
    kvc_plan_string_free(text);
    assert_ok(kvc_plan_render_json(r, &text));
    assert_non_null(strstr(text, "\"context_parallel\""));
    assert_non_null(strstr(text, "\"kv_bytes_per_request_per_gpu\""));
    assert_non_null(strstr(text, "\"prefill_seconds\""));
    assert_non_null(strstr(text, "\"ring_bytes_per_step\""));
    kvc_plan_string_free(text);
    free(r);
    /* TYPE:FACTOR */
    kvc_plan_rope_t rt;
    double f;
    assert_ok(kvc_plan_rope_parse("llama3:8", &rt, &f));
    assert_true(rt == KVC_PLAN_ROPE_LLAMA3 && f == 8);
    assert_ok(kvc_plan_rope_parse("LINEAR:2.5", &rt, &f));
    assert_true(rt == KVC_PLAN_ROPE_LINEAR && f == 2.5);
    assert_int_equal(kvc_plan_rope_parse("yarn", &rt, &f), KVC_EINVAL);
    assert_int_equal(kvc_plan_rope_parse("yarn:1", &rt, &f), KVC_EINVAL);
    assert_int_equal(kvc_plan_rope_parse("yarn:8x", &rt, &f), KVC_EINVAL);
    assert_int_equal(kvc_plan_rope_parse("ntk:8", &rt, &f), KVC_EINVAL);
    assert_int_equal(kvc_plan_rope_parse("yarn:inf", &rt, &f), KVC_EINVAL);
    assert_string_equal(kvc_plan_rope_name(KVC_PLAN_ROPE_YARN), "yarn");
}

static void the_dtype_grid_replans_every_pair(void **state)
{
    (void)state;
    kvc_plan_model_t m = preset_model("llama-3.1-70b");
    kvc_plan_gpu_t g = preset_gpu("h100-sxm");
    kvc_plan_params_t p = kvc_plan_params_default(); /* vLLM's H100 defaults: 1,024 sequences */
    p.tp = 2;
    p.grid_dtypes = true;
    kvc_plan_result_t *r = plan(&m, &g, &p);
    assert_int_equal(r->n_dtype_grid, 20); /* 5 weight dtypes x 4 KV dtypes */
    /* bf16 weights (65.71 GiB per GPU) leave no block; every other weight dtype starts */
    for (uint32_t i = 0; i < r->n_dtype_grid; i++) {
        const kvc_plan_grid_row_t *x = &r->dtype_grid[i];
        if (x->weight_dtype == KVC_PLAN_BF16) {
            assert_false(x->fits);
            assert_int_equal(x->failed_phase, KVC_PLAN_PHASE_ALLOCATE_KV);
        } else {
            assert_true(x->fits);
        }
        /* one 1,200-token request is 75 blocks x 16 tokens x its bytes per token per GPU (TP 2:
         * 4 KV heads x 128 x 2 x 80 layers): 163,840 B in bf16, 81,920 in fp8 or int8, 46,080
         * in nvfp4 (1,024 elements per layer in 576 B) */
        const uint64_t per_token = x->kv_dtype == KVC_PLAN_BF16    ? 163840
                                   : x->kv_dtype == KVC_PLAN_NVFP4 ? 46080
                                                                   : 81920;
        if (x->fits)
            assert_int_equal(x->max_concurrency, x->kv_pool_bytes_per_gpu / (75 * 16 * per_token));
    }
    /* the KV dtype does not move the pool; the weights do: fp8 weights x bf16 KV is row 4 */
    assert_int_equal(r->dtype_grid[4].weight_dtype, KVC_PLAN_FP8);
    assert_int_equal(r->dtype_grid[4].kv_dtype, KVC_PLAN_BF16);
    assert_int_equal(r->dtype_grid[5].kv_pool_bytes_per_gpu,
                     r->dtype_grid[4].kv_pool_bytes_per_gpu);
    char *text = NULL;
    assert_ok(kvc_plan_render_json(r, &text));
    assert_non_null(strstr(text, "\"dtype_grid\""));
    kvc_plan_string_free(text);
    free(r);
    p.grid_dtypes = false;
    r = plan(&m, &g, &p);
    assert_int_equal(r->n_dtype_grid, 0);
    free(r);
}

static void lora_adapters_take_from_the_kv_pool(void **state)
{
    (void)state;
    kvc_plan_model_t m = preset_model("llama-3.1-8b");
    kvc_plan_gpu_t g = preset_gpu("h100-sxm");
    kvc_plan_params_t p = defaults();
    kvc_plan_result_t *base = plan(&m, &g, &p);
    p.lora_rank = 16;
    p.lora_adapters = 100;
    p.lora_resident = 20;
    kvc_plan_result_t *r = plan(&m, &g, &p);
    /* per layer and rank: q (4,096 + 4,096) + k, v 2 x (4,096 + 1,024) + o (4,096 + 4,096) +
     * gate, up, down 3 x (4,096 + 14,336) = 81,920 values, x 2 B x 16 = 2,621,440 B; x 32
     * layers = 83,886,080 B (80 MiB) per adapter */
    assert_int_equal(r->lora_adapter_bytes, 83886080u);
    assert_int_equal(r->lora_adapter_bytes_per_gpu, 83886080u);
    /* 20 resident: 1,677,721,600 B out of the pool, 12,800 KV tokens of 131,072 B */
    assert_int_equal(r->lora_resident_bytes_per_gpu, 1677721600u);
    assert_int_equal(r->kv_pool_bytes_per_gpu, base->kv_pool_bytes_per_gpu - 1677721600u);
    assert_int_equal(r->lora_pool_tokens_lost, 12800);
    assert_int_equal(entry(r, "lora_adapters")->bytes, 1677721600u);
    /* a 1,000-token prompt shared by requests of the 20 adapters: 63 blocks cached 20 times */
    assert_int_equal(r->lora_prefix_blocks, 63 * 20);
    free(r);
    /* TP 2 halves each adapter's shard */
    p.tp = 2;
    r = plan(&m, &g, &p);
    assert_int_equal(r->lora_adapter_bytes_per_gpu, 83886080u / 2);
    free(r);
    p.tp = 1;
    p.lora_resident = 101;
    expect_refused(&m, &g, &p, KVC_EINVAL, "--lora-resident 101 is more than the 100");
    p.lora_rank = 0;
    p.lora_resident = 0;
    expect_refused(&m, &g, &p, KVC_EINVAL, "--lora-adapters needs --lora-rank");
    free(base);
}

static void small_copies_lose_and_short_recomputes_ride_free(void **state)
{
    (void)state;
    kvc_plan_model_t m = preset_model("llama-3.1-70b");
    kvc_plan_gpu_t g = preset_gpu("h100-sxm");
    kvc_plan_params_t p = defaults();
    p.tp = 8;
    kvc_plan_result_t *r = plan(&m, &g, &p);
    /* TP 8: one KV head, 2 x 128 x 2 B = 512 B per token and layer; one layer of one block is
     * 16 x 512 = 8,192 B: over PCIe at 64e9 B/s with 10 us of setup, 8,192 / (1.28e-7 + 1e-5) =
     * 808.8 MB/s, below the break-even; a block of all 80 layers (655,360 B) moves at 32.4 GB/s */
    assert_int_equal(r->copy_bytes[0], 8192);
    assert_int_equal(r->copy_bytes[1], 655360);
    assert_true(fabs(r->copy_bytes_per_s[0] - 8192 / (8192 / 64e9 + 1e-5)) < 1);
    assert_true(r->copy_bytes_per_s[0] < r->break_even_bytes_per_s);
    assert_true(r->copy_bytes_per_s[1] > r->break_even_bytes_per_s);
    /* batch 1: the step reads W / bandwidth of weights while its token computes for
     * lin / peak + attn / bf16; the idle compute holds floor((W / bw - that) / (lin / peak))
     * short-prefix tokens, about the ridge point (295) */
    const double lin = r->decode_flops_per_seq - r->decode_attention_flops_per_seq;
    const double mem = (r->weight_read_bytes + r->decode_bytes_per_seq) / 3.35e12;
    const double used = lin / 989.5e12 + r->decode_attention_flops_per_seq / 989.5e12;
    assert_int_equal(r->recompute_free_tokens_batch_1,
                     (uint64_t)floor((mem - used) / (lin / 989.5e12)));
    assert_true(r->recompute_free_tokens_batch_1 > 250 && r->recompute_free_tokens_batch_1 < 320);
    free(r);
}

static void mla_intensity_and_dp_attention_against_tp(void **state)
{
    (void)state;
    kvc_plan_model_t m = preset_model("deepseek-v3");
    kvc_plan_gpu_t g = preset_gpu("h200");
    kvc_plan_params_t p = defaults();
    p.tp = 8;
    p.weight_dtype = KVC_PLAN_FP8;
    kvc_plan_result_t *r = plan(&m, &g, &p);
    /* absorbed MLA: 128 / 8 = 16 heads per GPU x 2 x (576 + 512) FLOP per key over the 576 x
     * 2 B latent every GPU reads: 34,816 / 1,152 = 30.22 FLOP per byte; DP attention keeps all
     * 128 heads on one GPU's requests: 241.8, and the pool holds 8 x the tokens */
    assert_true(fabs(r->attention_flops_per_kv_byte - 2.0 * 16 * 1088 / 1152) < 1e-9);
    assert_true(fabs(r->dp_attention_flops_per_kv_byte - 2.0 * 128 * 1088 / 1152) < 1e-9);
    assert_int_equal(r->dp_attention_pool_tokens, 8 * r->pool_tokens);
    /* TP: 2 all-reduces of 7,168 x 2 B, ring 2 (8 - 1) / 8: 50,176 B per token and layer; the
     * all-to-all of DP attention, dispatch and combine: 25,088 */
    assert_true(r->tp_comm_bytes_per_token_layer == 50176);
    assert_true(r->dp_attention_comm_bytes_per_token_layer == 25088);
    free(r);
    /* GQA: 2 x the query group (32 / 8 = 4) / 2 B = 4 FLOP per byte, whatever the TP */
    m = preset_model("llama-3.1-8b");
    g = preset_gpu("h100-sxm");
    p = defaults();
    r = plan(&m, &g, &p);
    assert_true(fabs(r->attention_flops_per_kv_byte - 4) < 1e-12);
    assert_int_equal(r->dp_attention_pool_tokens, 0);
    free(r);
}

static void texts_say_what_is_true(void **state)
{
    (void)state;
    kvc_plan_gpu_t tg = tiny_gpu();
    kvc_plan_model_t m = tiny();
    kvc_plan_params_t p = defaults();
    p.prompt_tokens = 96; /* 6 whole blocks of 16: no partial block to copy on a fork */
    kvc_plan_result_t *r = plan(&m, &tg, &p);
    char *text = NULL;
    assert_ok(kvc_plan_render_text(r, &text));
    assert_non_null(strstr(text, "block-aligned: nothing to copy"));
    assert_null(strstr(text, "the partial prompt block copied"));
    kvc_plan_string_free(text);
    free(r);
    /* fp8 weights that do not load are not told to try fp8 */
    kvc_plan_model_t big = preset_model("llama-3.1-405b");
    kvc_plan_gpu_t g = preset_gpu("h100-sxm");
    p = defaults();
    p.weight_dtype = KVC_PLAN_FP8;
    r = plan(&big, &g, &p);
    assert_int_equal(r->failed_phase, KVC_PLAN_PHASE_LOAD_WEIGHTS);
    assert_ok(kvc_plan_render_text(r, &text));
    assert_null(strstr(text, "(fp8, int4"));
    assert_non_null(strstr(text, "a 4-bit weight dtype"));
    kvc_plan_string_free(text);
    free(r);
}

/* ---- 5. sliding windows ----------------------------------------------------------- */
static void window_freeing_saves_by_the_share_of_windowed_layers(void **state)
{
    (void)state;
    kvc_plan_model_t m = tiny();
    m.sliding_window = 24;
    m.n_sliding_layers = 2; /* 2 of 4 layers */
    kvc_plan_gpu_t g = tiny_gpu();
    kvc_plan_params_t p = defaults();
    p.prompt_tokens = 80;
    p.output_tokens = 20;
    /* context 100, block 16: full layers keep ceil(100/16) = 7 blocks; a windowed layer keeps
     * the blocks holding tokens 76..99: 76/16 = 4 .. 99/16 = 6, 3 blocks.  Per layer and token
     * 2 x 2 x 8 x 2 = 64 B: with freeing 64 x 16 x (2 x 7 + 2 x 3) = 20,480; without
     * 64 x 16 x 28 = 28,672; saving 1 - 20/28 = 2/7 */
    kvc_plan_result_t *r = plan(&m, &g, &p);
    assert_int_equal(r->swa_bytes_with_freeing, 20480);
    assert_int_equal(r->swa_bytes_without_freeing, 28672);
    assert_true(fabs(r->sliding_window_saving - 2.0 / 7) < 1e-12);
    assert_true(fabs(r->sliding_window_saving_limit - 0.5) < 1e-12);
    assert_int_equal(r->kv_bytes_per_request, 20480);
    free(r);
    /* within the window nothing is saved */
    p.prompt_tokens = 20;
    p.output_tokens = 4;
    r = plan(&m, &g, &p);
    assert_true(r->sliding_window_saving == 0);
    free(r);
    /* a long context approaches the layer share, whatever the window */
    p.prompt_tokens = 4000;
    p.output_tokens = 96;
    r = plan(&m, &g, &p);
    /* 256 blocks vs 2 (tokens 4,072..4,095: blocks 254, 255): 1 - (512 + 4) / 1,024 */
    assert_true(fabs(r->sliding_window_saving - (1 - 516.0 / 1024)) < 1e-12);
    free(r);
    /* with freeing off, the pool is sized as if every layer kept everything */
    p.window_freeing = false;
    r = plan(&m, &g, &p);
    assert_int_equal(r->kv_bytes_per_request, 256 * 16 * 256);
    free(r);
}

/* ---- 6. prefill FLOPs --------------------------------------------------------------- */
static void prefill_counts_causal_pairs_once(void **state)
{
    (void)state;
    kvc_plan_model_t m = tiny();
    kvc_plan_gpu_t g = tiny_gpu();
    kvc_plan_params_t p = defaults();
    p.prompt_tokens = 80;
    p.output_tokens = 20;
    kvc_plan_result_t *r = plan(&m, &g, &p);
    /* linear: 2 x 100 tokens x 139,840 params (all but the two 6,400 tables) + the LM head
     * for the last token 2 x 100 x 64 = 27,980,800 */
    assert_true(r->prefill_linear_flops == 27980800.0);
    /* attention: 8 heads x 2 x (8 + 8) x 100 x 101 / 2 pairs x 4 layers = 5,171,200 */
    assert_true(r->prefill_attention_flops == 5171200.0);
    assert_true(fabs(r->prefill_attention_flops_fraction - 5171200.0 / 33152000.0) < 1e-12);
    free(r);
    /* a window caps the pairs: window 24 on all 4 layers, 100 tokens:
     * 24 x 25 / 2 + 76 x 24 = 2,124 pairs per layer instead of 5,050 */
    m.sliding_window = 24;
    m.n_sliding_layers = 4;
    r = plan(&m, &g, &p);
    assert_true(r->prefill_attention_flops == 256.0 * 4 * 2124);
    free(r);
    /* the attention share grows with the context */
    m = tiny();
    p.prompt_tokens = 3000;
    p.output_tokens = 1000;
    r = plan(&m, &g, &p);
    assert_true(r->prefill_attention_flops_fraction > 0.8);
    free(r);
}

/* ---- 7. forks ---------------------------------------------------------------------- */
static void forks_share_prompt_blocks_and_beam_history(void **state)
{
    (void)state;
    /* The issue's example: 4 beams, 1,000-token prompt, 200 output tokens each, 128 KiB per
     * token (Llama-3.1-8B in bf16), block 16: unshared 4 x ceil(1,200/16) = 300 blocks =
     * 300 x 16 x 128 KiB = 600 MiB; shared, the beams keep one history (75 blocks) plus one
     * copy-on-write block each for the other 3: 78 blocks = 156 MiB. */
    kvc_plan_model_t m = preset_model("llama-3.1-8b");
    kvc_plan_gpu_t g = preset_gpu("h100-sxm");
    kvc_plan_params_t p = defaults();
    p.beams = 4;
    p.prompt_tokens = 1000;
    p.output_tokens = 200;
    p.block_size = 16;
    kvc_plan_result_t *r = plan(&m, &g, &p);
    assert_int_equal(r->kv_bytes_per_token_per_gpu, 128 * 1024);
    assert_int_equal(r->fork_unshared_bytes_beams, 600 * MIB);
    assert_int_equal(r->fork_shared_bytes_beams, 156 * MIB);
    /* beams that diverge at once, like parallel samples: the prompt's 62 full blocks once,
     * then 75 - 62 = 13 blocks each: 62 + 52 = 114 blocks = 228 MiB */
    assert_int_equal(r->fork_shared_bytes_beams_diverged, 228 * MIB);
    assert_int_equal(r->fork_shared_bytes_samples, 228 * MIB);
    assert_int_equal(r->fork_unshared_bytes_samples, 600 * MIB);
    free(r);
    /* a bigger block makes the copies cost more: block 64, 19 blocks per request of 8 MiB;
     * beams 19 + 3 = 22 blocks = 176 MiB */
    p.block_size = 64;
    r = plan(&m, &g, &p);
    assert_int_equal(r->fork_shared_bytes_beams, 176 * MIB);
    free(r);
}

/* ---- 8. disaggregated prefill ------------------------------------------------------- */
static void prefill_kv_rate_cancels_the_prompt_length(void **state)
{
    (void)state;
    kvc_plan_model_t m = preset_model("llama-3.1-70b");
    kvc_plan_gpu_t g = preset_gpu("h100-sxm");
    kvc_plan_params_t p = defaults();
    p.tp = 4;
    p.prompt_tokens = 1000;
    kvc_plan_result_t *a = plan(&m, &g, &p);
    p.prompt_tokens = 16000;
    kvc_plan_result_t *b = plan(&m, &g, &p);
    /* linear only: 327,680 B x 0.5 x 989.5e12 / (2 x 68,452,360,192) = 1.184 GB/s per GPU */
    assert_true(a->prefill_kv_bytes_per_s_linear_only == b->prefill_kv_bytes_per_s_linear_only);
    assert_true(fabs(a->prefill_kv_bytes_per_s_linear_only -
                     327680.0 * 0.5 * 989.5e12 / (2 * 68452360192.0)) < 1);
    /* attention makes a longer prompt slower per token, so it emits less */
    assert_true(b->prefill_tokens_per_s < a->prefill_tokens_per_s);
    assert_true(fabs(a->link_utilization - a->prefill_kv_bytes_per_s_per_gpu / 50e9) < 1e-15);
    assert_int_equal(a->prefill_rate_kind, KVC_PLAN_ESTIMATED);
    free(a);
    free(b);
    /* a measured rate is used as given */
    p.prefill_tokens_per_s = 20000;
    p.link_bytes_per_s = 1e9;
    kvc_plan_result_t *c = plan(&m, &g, &p);
    assert_int_equal(c->prefill_rate_kind, KVC_PLAN_MEASURED);
    /* 327,680 B x 20,000 / 4 GPUs = 1.64 GB/s per GPU on a 1 GB/s link: 164% */
    assert_true(fabs(c->prefill_kv_bytes_per_s_per_gpu - 1.6384e9) < 1);
    assert_true(c->link_utilization > 1.6 && c->link_utilization < 1.7);
    assert_true(fabs(c->link_limited_tokens_per_s - 1e9 * 4 / 327680) < 1e-6);
    free(c);
}

/* ---- 9. recompute vs fetch ------------------------------------------------------------ */
static void fetch_beats_recompute_above_the_break_even_bandwidth(void **state)
{
    (void)state;
    kvc_plan_model_t m = preset_model("llama-3.1-70b");
    kvc_plan_gpu_t g = preset_gpu("h100-sxm");
    kvc_plan_params_t p = defaults();
    p.tp = 2;
    p.nvme_bytes_per_s = 7e9;
    p.network_bytes_per_s = 0.5e9; /* slower than the break-even */
    p.ssd_write_bytes_per_s = 1e9;
    kvc_plan_result_t *r = plan(&m, &g, &p);
    /* recompute: 2 x 68,452,360,192 / (2 GPUs x 989.5e12 x 0.5) = 138.36 us per token;
     * break-even 163,840 B / 138.36 us = 1.184 GB/s */
    const double t_r = 2 * 68452360192.0 / (2 * 989.5e12 * 0.5);
    assert_true(fabs(r->recompute_s_per_token - t_r) < 1e-15);
    assert_true(fabs(r->break_even_bytes_per_s - 163840 / t_r) < 1);
    const kvc_plan_tier_t *nvme = &r->tiers[2], *net = &r->tiers[3];
    assert_string_equal(r->tiers[0].name, "hbm");
    assert_string_equal(r->tiers[1].name, "host");
    assert_true(r->tiers[1].bytes_per_s == 64e9); /* the GPU's PCIe link by default */
    assert_string_equal(nvme->name, "nvme");
    /* NVMe 7 GB/s: fetch 23.4 us vs 138.4 us: wins 5.91x; a copy beats the 100 us setup from
     * ceil(100 / (138.36 - 23.41)) = 1 token; others may take 1 - 1.184/7 = 83% of it */
    assert_true(fabs(nvme->speedup - 7e9 / (163840 / t_r)) < 1e-9);
    assert_int_equal(nvme->min_tokens_to_win, 1);
    assert_true(fabs(nvme->max_shared_fraction - (1 - (163840 / t_r) / 7e9)) < 1e-12);
    /* 0.5 GB/s is below the break-even: fetching loses at any size */
    assert_true(net->speedup < 1);
    assert_int_equal(net->min_tokens_to_win, KVC_PLAN_UNBOUNDED);
    assert_true(net->max_shared_fraction == 0);
    /* SSD: 7,008 TB at 1 GB/s = 7,008,000 s / 86,400 = 81.1 days */
    assert_true(fabs(r->ssd_endurance_days - 7008e12 / 1e9 / 86400) < 1e-9);
    free(r);
    /* A small model recomputes faster per KV byte: a higher break-even. */
    kvc_plan_model_t m8 = preset_model("llama-3.1-8b");
    p.tp = 1;
    r = plan(&m8, &g, &p);
    kvc_plan_result_t *big = NULL;
    p.tp = 1;
    kvc_plan_model_t m70 = preset_model("llama-3.1-70b");
    p.max_model_len = 4096; /* let 70B start on one GPU's worth of math; only rates matter */
    big = plan(&m70, &g, &p);
    /* per token per GPU: 8B 128 KiB for 2 x 6.98e9 FLOP, 70B 320 KiB for 2 x 68.45e9 */
    assert_true(r->break_even_bytes_per_s > big->break_even_bytes_per_s);
    free(r);
    free(big);
}

/* ---- 10. Little's law ---------------------------------------------------------------- */
/* At 0.999 of `lam`, the resident count is within 10% of the hard ceiling (true) or the
 * system is throughput-bound (false: just past lam, it has no fixed point at all). */
static bool r_limit_is_ceiling(const kvc_plan_model_t *m, const kvc_plan_gpu_t *g,
                               kvc_plan_params_t p, double lam)
{
    p.arrival_rate = lam * 0.999;
    kvc_plan_result_t *r = plan(m, g, &p);
    const uint64_t cap = KVC_MIN(r->ceilings[KVC_PLAN_CEIL_KV_MEMORY],
                                 KVC_MIN(r->ceilings[KVC_PLAN_CEIL_MAX_NUM_SEQS],
                                         r->ceilings[KVC_PLAN_CEIL_MAX_NUM_BATCHED_TOKENS]));
    assert_true(r->little_stable);
    assert_true(r->little_resident <= (double)cap);
    const bool at_ceiling = r->little_resident > 0.9 * (double)cap;
    free(r);
    p.arrival_rate = lam * 1.01;
    r = plan(m, g, &p);
    if (at_ceiling)
        assert_true(!r->little_stable || r->little_resident > (double)cap);
    else
        assert_false(r->little_stable);
    free(r);
    return at_ceiling;
}

static void littles_law_solves_the_fixed_point(void **state)
{
    (void)state;
    kvc_plan_model_t m = preset_model("llama-3.1-8b");
    kvc_plan_gpu_t g = preset_gpu("h100-sxm");
    kvc_plan_params_t p = defaults();
    kvc_plan_result_t *r = plan(&m, &g, &p); /* default: half the sustainable rate */
    assert_true(r->arrival_rate_auto);
    assert_true(fabs(r->arrival_rate - 0.5 * r->little_max_arrival_rate) < 1e-9);
    assert_true(r->little_stable);
    /* N = lambda x T(N) holds at the answer */
    assert_true(fabs(r->little_resident - r->arrival_rate_per_replica * r->little_time_in_system) <
                1e-6 * r->little_resident);
    /* the step runs at batch N, slower than at batch 1: taking the batch-1 duration as given
     * undercounts the resident sequences */
    assert_true(r->little_naive_resident < r->little_resident);
    assert_true(r->little_step_s > 0 && r->little_prefill_s > 0);
    const double lam_max = r->little_max_arrival_rate;
    free(r);

    /* With the defaults (256 sequences) the GPU saturates first: at 1,000-token prompts each
     * prefill takes 2 x 1,000 x 6.98e9 / (989.5e12 x 0.5) = 28 ms of the GPU, so past ~35
     * requests/s prefill alone fills it; the resident count stays under 256. */
    assert_false(r_limit_is_ceiling(&m, &g, p, lam_max));

    /* With 32 sequences the ceiling binds: at the largest sustainable rate, N meets it. */
    p.max_num_seqs = 32;
    r = plan(&m, &g, &p);
    const double lam_cap = r->little_max_arrival_rate;
    assert_true(r->little_max_by_ceiling);
    free(r);
    assert_true(r_limit_is_ceiling(&m, &g, p, lam_cap));
    p.max_num_seqs = 256;

    /* Far past what the GPU can serve, there is no fixed point. */
    p.arrival_rate = 1e6;
    r = plan(&m, &g, &p);
    assert_false(r->little_stable);
    assert_true(isinf(r->little_resident));
    free(r);

    /* DP splits the arrivals over the replicas. */
    p.arrival_rate = 10;
    p.dp = 4;
    r = plan(&m, &g, &p);
    assert_true(r->arrival_rate_per_replica == 2.5);
    assert_int_equal(r->n_gpus, 4);
    free(r);
}

/* ---- 11. speculative decoding ------------------------------------------------------- */
static void drafts_take_budget_and_turn_the_step_compute_bound(void **state)
{
    (void)state;
    kvc_plan_model_t m = preset_model("llama-3.1-70b");
    kvc_plan_gpu_t g = preset_gpu("h100-sxm");
    kvc_plan_params_t p = defaults();
    p.tp = 2;
    p.spec_tokens = 3;
    p.spec_acceptance = 0.7;
    kvc_plan_result_t *r = plan(&m, &g, &p);
    assert_int_equal(r->n_spec, 5); /* the configured 3, then 1, 2, 4, 8 */
    assert_int_equal(r->spec[0].spec_tokens, 3);
    assert_int_equal(r->spec[0].max_batch_by_tokens, 8192 / 4);
    assert_int_equal(r->spec[0].kv_slots_per_seq, 3);
    /* (1 - 0.7^4) / 0.3 = 2.533 */
    assert_true(fabs(r->spec[0].tokens_per_step - (1 - pow(0.7, 4)) / 0.3) < 1e-12);
    /* with 1 draft each sequence brings 2 queries: B >= W / (2 x 70.94e9 / 295.37 - 180.2e6)
     * = 69.504e9 / 300.15e6 = 231.6: 232; more drafts, a smaller batch turns compute-bound */
    assert_int_equal(r->spec[1].spec_tokens, 1);
    assert_int_equal(r->spec[1].compute_bound_batch, 232);
    uint64_t prev = UINT64_MAX;
    for (uint32_t i = 1; i < r->n_spec; i++) {
        assert_true(r->spec[i].compute_bound_batch < prev);
        prev = r->spec[i].compute_bound_batch;
    }
    assert_true(r->spec[1].compute_bound_batch < r->ceilings[KVC_PLAN_CEIL_COMPUTE]);
    free(r);
}

/* ---- 12. tenancy ----------------------------------------------------------------------- */
static void tenancy_prices_requests_in_pool_share(void **state)
{
    (void)state;
    kvc_plan_model_t m = preset_model("llama-3.1-8b");
    kvc_plan_gpu_t g = preset_gpu("h100-sxm");
    kvc_plan_params_t p = defaults();
    p.tenant_tokens = 32768;
    kvc_plan_result_t *r = plan(&m, &g, &p);
    assert_int_equal(r->n_tenants, 3);
    assert_int_equal(r->tenants[0].tokens, 1200);
    assert_int_equal(r->tenants[1].tokens, 131072);
    assert_int_equal(r->tenants[2].tokens, 32768);
    for (uint32_t i = 0; i < r->n_tenants; i++) {
        const kvc_plan_tenant_row_t *t = &r->tenants[i];
        assert_int_equal(t->bytes_per_gpu, kvc_plan_request_bytes(r, t->tokens));
        assert_true(fabs(t->pool_share -
                         (double)t->bytes_per_gpu / (double)r->kv_pool_bytes_per_gpu) < 1e-15);
        assert_int_equal(t->per_pool, r->kv_pool_bytes_per_gpu / t->bytes_per_gpu);
    }
    /* 131,072 tokens x 128 KiB = 16 GiB of a 54.29 GiB pool: 3 at once */
    assert_int_equal(r->tenants[1].bytes_per_gpu, 16 * GIB);
    assert_int_equal(r->tenants[1].per_pool, 3);
    assert_int_equal(r->tokens_per_percent, r->pool_tokens / 100);
    assert_int_equal(r->image_bytes_per_gpu, 0); /* text only */
    free(r);
    /* a LLaVA-style 576-token image at 128 KiB per token: 72 MiB of KV */
    m.image_tokens = 576;
    r = plan(&m, &g, &p);
    assert_int_equal(r->image_bytes_per_gpu, 72 * MIB);
    free(r);
}

/* ---- config.json ------------------------------------------------------------------------ */
static int parse(const char *json, kvc_plan_model_t *m, char *msg)
{
    msg[0] = '\0';
    return kvc_plan_model_from_json(json, strlen(json), "test", m, msg, 256);
}

#define BASE                                                                          \
    "\"hidden_size\": 4096, \"num_hidden_layers\": 32, \"num_attention_heads\": 32, " \
    "\"vocab_size\": 32000, \"intermediate_size\": 11008, \"max_position_embeddings\": 4096"

static void config_reads_what_the_math_needs(void **state)
{
    (void)state;
    kvc_plan_model_t m;
    char msg[256];
    /* head_dim derived (4096 / 32), KV heads default to the query heads, tied by default,
     * unknown fields ignored */
    assert_ok(parse("{" BASE ", \"rope_scaling\": {\"x\": 1}, \"foo\": [1, 2]}", &m, msg));
    assert_int_equal(m.head_dim, 128);
    assert_int_equal(m.n_kv_heads, 32);
    assert_true(m.tie_embeddings);
    assert_int_equal(m.max_position_embeddings, 4096);
    assert_string_equal(m.name, "test");
    /* explicit head_dim wins over hidden / heads */
    assert_ok(parse("{" BASE ", \"head_dim\": 96, \"num_key_value_heads\": 8,"
                    " \"tie_word_embeddings\": false}",
                    &m, msg));
    assert_int_equal(m.head_dim, 96);
    assert_int_equal(m.n_kv_heads, 8);
    assert_false(m.tie_embeddings);
    /* nulls read as absent */
    assert_ok(parse("{" BASE ", \"head_dim\": null, \"sliding_window\": null}", &m, msg));
    assert_int_equal(m.head_dim, 128);
    assert_int_equal(m.sliding_window, 0);
    /* Qwen2 carries q/k/v biases even without saying so */
    assert_ok(parse("{" BASE ", \"model_type\": \"qwen2\"}", &m, msg));
    assert_true(m.qkv_bias);
}

static void config_errors_name_the_field(void **state)
{
    (void)state;
    kvc_plan_model_t m;
    char msg[256];
    const struct {
        const char *json;
        int err;
        const char *needle;
    } cases[] = {
        {"{\"num_hidden_layers\": 2, \"num_attention_heads\": 2, \"vocab_size\": 9}", KVC_EINVAL,
         "hidden_size is missing"},
        {"{\"hidden_size\": 8, \"num_attention_heads\": 2, \"vocab_size\": 9}", KVC_EINVAL,
         "num_hidden_layers is missing"},
        {"{\"hidden_size\": 8, \"num_hidden_layers\": 2, \"vocab_size\": 9}", KVC_EINVAL,
         "num_attention_heads is missing"},
        {"{\"hidden_size\": 8, \"num_hidden_layers\": 2, \"num_attention_heads\": 2}", KVC_EINVAL,
         "vocab_size is missing"},
        {"{\"hidden_size\": 8, \"num_hidden_layers\": 2, \"num_attention_heads\": 2, "
         "\"vocab_size\": 9}",
         KVC_EINVAL, "intermediate_size is missing"},
        {"{\"hidden_size\": 10, \"num_hidden_layers\": 2, \"num_attention_heads\": 3, "
         "\"vocab_size\": 9, \"intermediate_size\": 4}",
         KVC_EINVAL, "head_dim is missing and hidden_size 10 is not a multiple"},
        {"{\"hidden_size\": \"4096\", \"num_hidden_layers\": 2}", KVC_EPARSE,
         "hidden_size: expected a positive integer, got \"4096\""},
        {"{\"hidden_size\": 4096.5, \"num_hidden_layers\": 2}", KVC_EPARSE, "hidden_size"},
        {"{\"hidden_size\": -8}", KVC_EPARSE, "hidden_size"},
        {"{" BASE ", \"tie_word_embeddings\": 1}", KVC_EPARSE, "tie_word_embeddings"},
        {"{" BASE ", \"num_key_value_heads\": 5}", KVC_EINVAL, "num_key_value_heads 5"},
        {"{" BASE ", \"kv_lora_rank\": 512, \"qk_nope_head_dim\": 128, \"v_head_dim\": 128}",
         KVC_EINVAL, "qk_rope_head_dim is missing"},
        {"{" BASE ", \"num_local_experts\": 8}", KVC_EINVAL, "num_experts_per_tok is missing"},
        {"{" BASE ", \"sliding_window\": 4096, \"layer_types\": [\"full_attention\"]}", KVC_EINVAL,
         "layer_types has 1 entries but num_hidden_layers is 32"},
        {"{" BASE ", \"layer_types\": 3}", KVC_EPARSE, "layer_types: expected an array"},
        {"{" BASE ", \"hidden_size\": 4096", KVC_EPARSE, "malformed JSON"},
        {"[1, 2]", KVC_EPARSE, "expected a JSON object"},
        {"", KVC_EPARSE, "malformed JSON at byte 0"},
    };
    for (size_t i = 0; i < KVC_ARRAY_LEN(cases); i++) {
        int rc = parse(cases[i].json, &m, msg);
        if (rc != cases[i].err || !strstr(msg, cases[i].needle) || strchr(msg, '\n'))
            fail_msg("case %zu: rc %d msg '%s', want %d '%s'", i, rc, msg, cases[i].err,
                     cases[i].needle);
    }
}

static void config_reads_moe_mla_windows_and_images(void **state)
{
    (void)state;
    kvc_plan_model_t m;
    char msg[256];
    /* MoE aliases and the dense-layer rules */
    assert_ok(parse("{" BASE ", \"num_experts\": 64, \"num_experts_per_tok\": 8,"
                    " \"moe_intermediate_size\": 1408, \"shared_expert_intermediate_size\": 5632,"
                    " \"decoder_sparse_step\": 2}",
                    &m, msg));
    assert_int_equal(m.n_experts, 64);
    assert_int_equal(m.n_experts_active, 8);
    assert_int_equal(m.moe_intermediate_size, 1408);
    assert_int_equal(m.shared_expert_intermediate_size, 5632);
    assert_int_equal(m.n_dense_layers, 16); /* every other layer is MoE */
    assert_ok(parse("{" BASE ", \"num_local_experts\": 8, \"num_experts_per_tok\": 2,"
                    " \"mlp_only_layers\": [0, 5]}",
                    &m, msg));
    assert_int_equal(m.moe_intermediate_size, 11008); /* Mixtral: intermediate_size per expert */
    assert_int_equal(m.n_dense_layers, 2);
    /* MLA: the head widths follow nope + rope */
    assert_ok(parse("{" BASE ", \"kv_lora_rank\": 512, \"qk_rope_head_dim\": 64,"
                    " \"qk_nope_head_dim\": 128, \"v_head_dim\": 128, \"q_lora_rank\": null}",
                    &m, msg));
    assert_true(m.mla);
    assert_int_equal(m.head_dim, 192);
    assert_int_equal(m.v_head_dim, 128);
    assert_int_equal(m.q_lora_rank, 0);
    /* windows: every layer (Mistral), a per-layer list, a pattern (Gemma 3: every 6th layer
     * global), Gemma 2 alternation, Qwen2's switch and its max_window_layers */
    assert_ok(parse("{" BASE ", \"sliding_window\": 4096}", &m, msg));
    assert_int_equal(m.n_sliding_layers, 32);
    char json[4096];
    int o = snprintf(json, sizeof json, "{" BASE ", \"sliding_window\": 512, \"layer_types\": [");
    for (int i = 0; i < 32; i++)
        o += snprintf(json + o, sizeof json - (size_t)o, "%s\"%s\"", i ? ", " : "",
                      i % 4 == 3 ? "full_attention" : "sliding_attention");
    snprintf(json + o, sizeof json - (size_t)o, "]}");
    assert_ok(parse(json, &m, msg));
    assert_int_equal(m.n_sliding_layers, 24);
    assert_int_equal(m.sliding_window, 512);
    assert_ok(
        parse("{" BASE ", \"sliding_window\": 1024, \"sliding_window_pattern\": 6}", &m, msg));
    assert_int_equal(m.n_sliding_layers, 32 - 5);
    assert_ok(parse("{" BASE ", \"model_type\": \"gemma2\", \"sliding_window\": 4096}", &m, msg));
    assert_int_equal(m.n_sliding_layers, 16);
    assert_ok(parse("{" BASE ", \"sliding_window\": 32768, \"use_sliding_window\": false,"
                    " \"max_window_layers\": 28}",
                    &m, msg));
    assert_int_equal(m.sliding_window, 0);
    assert_int_equal(m.n_sliding_layers, 0);
    assert_ok(parse("{" BASE ", \"sliding_window\": 32768, \"use_sliding_window\": true,"
                    " \"max_window_layers\": 28}",
                    &m, msg));
    assert_int_equal(m.n_sliding_layers, 4);
    /* a multimodal config: the language model under text_config wins over the top level;
     * image tokens from mm_tokens_per_image or from the vision tower's patches */
    assert_ok(
        parse("{\"model_type\": \"gemma3\", \"mm_tokens_per_image\": 256, \"text_config\": {" BASE
              ", \"model_type\": \"gemma3_text\", \"head_dim\": 256}, \"hidden_size\": 7}",
              &m, msg));
    assert_int_equal(m.hidden_size, 4096);
    assert_int_equal(m.head_dim, 256);
    assert_int_equal(m.image_tokens, 256);
    assert_string_equal(m.model_type, "gemma3_text");
    /* a vision tower with no widths would be left out of the weights: refused */
    assert_int_equal(parse("{\"text_config\": {" BASE "}, \"vision_config\": {\"image_size\": 336,"
                           " \"patch_size\": 14}}",
                           &m, msg),
                     KVC_EINVAL);
    assert_non_null(strstr(msg, "vision_config.hidden_size is missing"));
    assert_ok(parse("{\"text_config\": {" BASE "}, \"vision_config\": {\"image_size\": 336,"
                    " \"patch_size\": 14, \"hidden_size\": 1024, \"intermediate_size\": 4096,"
                    " \"num_hidden_layers\": 24}}",
                    &m, msg));
    assert_int_equal(m.image_tokens, 576); /* (336 / 14)^2, LLaVA-1.5 */
    /* Llama 4: chunked local attention on RoPE layers, every 4th layer global by default, or
     * as no_rope_layers lists it; MoE on every interleave_moe_layer_step-th layer */
    assert_ok(parse("{\"text_config\": {" BASE ", \"attention_chunk_size\": 8192,"
                    " \"num_local_experts\": 16, \"num_experts_per_tok\": 1,"
                    " \"interleave_moe_layer_step\": 2}}",
                    &m, msg));
    assert_int_equal(m.sliding_window, 8192);
    assert_true(m.chunked_attention);
    assert_int_equal(m.n_sliding_layers, 24);
    assert_int_equal(m.n_dense_layers, 16);
    int o2 = snprintf(json, sizeof json,
                      "{" BASE ", \"attention_chunk_size\": 4096, "
                      "\"no_rope_layers\": [");
    for (int i = 0; i < 32; i++)
        o2 += snprintf(json + o2, sizeof json - (size_t)o2, "%s%d", i ? ", " : "", i % 2);
    snprintf(json + o2, sizeof json - (size_t)o2, "]}");
    assert_ok(parse(json, &m, msg));
    assert_int_equal(m.n_sliding_layers, 16);
    assert_int_equal(m.sliding_window, 4096);
    assert_int_equal(parse("{" BASE ", \"layer_types\": [" /* 32 entries, 1 chunked */
                           "\"chunked_attention\""
                           ",\"full_attention\""
                           ",\"full_attention\""
                           ",\"full_attention\""
                           ",\"full_attention\""
                           ",\"full_attention\""
                           ",\"full_attention\""
                           ",\"full_attention\""
                           ",\"full_attention\""
                           ",\"full_attention\""
                           ",\"full_attention\""
                           ",\"full_attention\""
                           ",\"full_attention\""
                           ",\"full_attention\""
                           ",\"full_attention\""
                           ",\"full_attention\""
                           ",\"full_attention\""
                           ",\"full_attention\""
                           ",\"full_attention\""
                           ",\"full_attention\""
                           ",\"full_attention\""
                           ",\"full_attention\""
                           ",\"full_attention\""
                           ",\"full_attention\""
                           ",\"full_attention\""
                           ",\"full_attention\""
                           ",\"full_attention\""
                           ",\"full_attention\""
                           ",\"full_attention\""
                           ",\"full_attention\""
                           ",\"full_attention\""
                           ",\"full_attention\"]}",
                           &m, msg),
                     KVC_EINVAL);
    assert_non_null(strstr(msg, "attention_chunk_size is missing"));
}

static void config_files_are_read_or_refused_cleanly(void **state)
{
    (void)state;
    kvc_plan_model_t m;
    char msg[256] = "";
    assert_int_equal(kvc_plan_model_load("/nonexistent/config.json", &m, msg, sizeof msg), KVC_EIO);
    assert_non_null(strstr(msg, "cannot open /nonexistent/config.json"));
    assert_int_equal(kvc_plan_model_load("/", &m, msg, sizeof msg), KVC_EIO);
    /* a hub snapshot's config.json is named after its folder */
    char dir[] = "/tmp/kvc_plan_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256], sub[200];
    snprintf(sub, sizeof sub, "%s/Tiny-Model", dir);
    assert_int_equal(mkdir(sub, 0700), 0);
    snprintf(path, sizeof path, "%s/config.json", sub);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{" BASE "}", f);
    fclose(f);
    assert_ok(kvc_plan_model_load(path, &m, msg, sizeof msg));
    assert_string_equal(m.name, "Tiny-Model");
    /* a file over 16 MiB is refused before parsing */
    f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < 17 * 1024; i++) fputs(memset((char[1025]){0}, ' ', 1024), f);
    fclose(f);
    assert_int_equal(kvc_plan_model_load(path, &m, msg, sizeof msg), KVC_EOVERFLOW);
    remove(path);
    rmdir(sub);
    rmdir(dir);
}

/* ---- renderers ----------------------------------------------------------------------- */
static bool raw_integer(const cJSON *v)
{
    return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble) && v->valuedouble >= 0;
}

static void json_has_every_required_key(void **state)
{
    (void)state;
    kvc_plan_model_t m = preset_model("llama-3.1-70b");
    kvc_plan_gpu_t g = preset_gpu("h100-sxm");
    kvc_plan_params_t p = defaults();
    for (int refused = 0; refused < 2; refused++) {
        p.tp = refused ? 2 : 4;
        kvc_plan_result_t *r = plan(&m, &g, &p);
        char *s = NULL;
        assert_ok(kvc_plan_render_json(r, &s));
        cJSON *o = cJSON_Parse(s);
        assert_non_null(o);
        const char *bytes_keys[] = {"kv_bytes_per_token",   "kv_bytes_per_token_per_gpu",
                                    "weight_bytes_per_gpu", "kv_pool_bytes_per_gpu",
                                    "num_blocks",           "max_concurrency",
                                    "kv_bytes_per_request", "kv_head_replication"};
        for (size_t i = 0; i < KVC_ARRAY_LEN(bytes_keys); i++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, bytes_keys[i]);
            if (!raw_integer(v)) fail_msg("%s is not an integer", bytes_keys[i]);
        }
        assert_true(cJSON_GetObjectItem(o, "kv_bytes_per_token")->valuedouble == 327680);
        assert_true(cJSON_GetObjectItem(o, "kv_pool_bytes_per_gpu")->valuedouble ==
                    (double)r->kv_pool_bytes_per_gpu);
        /* bytes are printed as plain digits, never in exponent form */
        char needle[64];
        snprintf(needle, sizeof needle, "\"weight_bytes_per_gpu\":\t%llu",
                 (unsigned long long)r->weight_bytes_per_gpu);
        assert_non_null(strstr(s, needle));
        const cJSON *ledger = cJSON_GetObjectItem(o, "ledger");
        assert_true(cJSON_IsArray(ledger));
        assert_int_equal(cJSON_GetArraySize(ledger), 8);
        const cJSON *e;
        int i = 0;
        cJSON_ArrayForEach(e, ledger)
        {
            assert_string_equal(cJSON_GetObjectItem(e, "name")->valuestring, r->ledger[i].name);
            assert_true(raw_integer(cJSON_GetObjectItem(e, "bytes")));
            const char *kind = cJSON_GetObjectItem(e, "kind")->valuestring;
            assert_true(!strcmp(kind, "measured") || !strcmp(kind, "estimated") ||
                        !strcmp(kind, "configured"));
            i++;
        }
        const cJSON *fits = cJSON_GetObjectItem(o, "fits");
        const cJSON *failed = cJSON_GetObjectItem(o, "failed_phase");
        assert_true(cJSON_IsBool(fits));
        if (refused) {
            assert_true(cJSON_IsFalse(fits));
            assert_string_equal(failed->valuestring, "check_max_model_len");
        } else {
            assert_true(cJSON_IsTrue(fits));
            assert_true(cJSON_IsNull(failed));
        }
        const cJSON *ceil = cJSON_GetObjectItem(o, "ceilings");
        const char *ck[] = {"kv_memory", "compute", "max_num_seqs", "binding"};
        for (size_t k = 0; k < KVC_ARRAY_LEN(ck); k++)
            assert_non_null(cJSON_GetObjectItem(ceil, ck[k]));
        assert_true(cJSON_IsString(cJSON_GetObjectItem(ceil, "binding")));
        const char *num_keys[] = {"ridge_flops_per_byte", "sliding_window_saving",
                                  "prefill_attention_flops_fraction"};
        for (size_t k = 0; k < KVC_ARRAY_LEN(num_keys); k++)
            assert_true(cJSON_IsNumber(cJSON_GetObjectItem(o, num_keys[k])));
        cJSON_Delete(o);
        kvc_plan_string_free(s);
        free(r);
    }
}

/* cJSON allocates through global hooks: a test may swap them (single-threaded) to fail the
 * n-th allocation, and the renderer must then fail whole, never hand out half a document. */
static int oom_countdown;
static void *failing_malloc(size_t n)
{
    if (oom_countdown-- == 0) return NULL;
    return malloc(n);
}

static void json_rendering_fails_whole_under_oom(void **state)
{
    (void)state;
    kvc_plan_model_t m = preset_model("deepseek-v3");
    kvc_plan_gpu_t g = preset_gpu("h200");
    kvc_plan_params_t p = defaults();
    p.tp = 8;
    p.weight_dtype = KVC_PLAN_FP8;
    kvc_plan_result_t *r = plan(&m, &g, &p);
    char *whole = NULL;
    assert_ok(kvc_plan_render_json(r, &whole));
    int failed = 0, n;
    for (n = 0; n < 5000; n++) {
        cJSON_Hooks hooks = {.malloc_fn = failing_malloc, .free_fn = free};
        cJSON_InitHooks(&hooks);
        oom_countdown = n;
        char *s = NULL;
        int rc = kvc_plan_render_json(r, &s);
        const bool injected = oom_countdown < 0;
        cJSON_InitHooks(NULL);
        if (!injected) { /* ran to the end without reaching the n-th allocation */
            assert_ok(rc);
            assert_string_equal(s, whole);
            kvc_plan_string_free(s);
            break;
        }
        assert_int_equal(rc, KVC_ENOMEM);
        failed++;
    }
    assert_true(failed > 100); /* every one of the document's allocations was failed once */
    assert_true(n < 5000);
    kvc_plan_string_free(whole);
    free(r);
}

static void text_has_twelve_sections_and_names_the_refusal(void **state)
{
    (void)state;
    kvc_plan_model_t m = preset_model("llama-3.1-70b");
    kvc_plan_gpu_t g = preset_gpu("h100-sxm");
    kvc_plan_params_t p = defaults();
    p.tp = 2;
    kvc_plan_result_t *r = plan(&m, &g, &p);
    char *s = NULL;
    assert_ok(kvc_plan_render_text(r, &s));
    const char *heads[] = {"1. KV bytes per token",
                           "2. Startup memory ledger",
                           "3. Does it start?",
                           "4. Concurrency",
                           "5. Sliding windows",
                           "6. Prefill FLOPs",
                           "7. Forks",
                           "8. Disaggregated prefill",
                           "9. Recompute or fetch",
                           "10. Resident sequences by Little's law",
                           "11. Speculative decoding",
                           "12. Tenancy"};
    const char *at = s;
    for (size_t i = 0; i < KVC_ARRAY_LEN(heads); i++) {
        const char *h = strstr(at, heads[i]);
        if (!h) fail_msg("section '%s' missing or out of order", heads[i]);
        at = h;
    }
    assert_non_null(strstr(s, "NO: it fails at check_max_model_len"));
    assert_non_null(strstr(s, "2 x 80 x 8 x 128 x 2 B = 327,680 B (320 KiB) per token"));
    assert_non_null(strstr(s, "1,048,576 tokens: 320.00 GiB"));
    assert_non_null(strstr(s, "estimated maximum model length is 13984"));
    assert_non_null(strstr(s, "--tp 4 starts"));
    assert_non_null(strstr(s, "sections 4-12 describe the same pool with a\n   max_model_len it "
                              "accepts, 13,984 tokens or less"));
    assert_non_null(strstr(s, "the 50 MiB L2 holds 0.1% of a step's weight reads"));
    assert_non_null(strstr(s, "KiB, MiB, GiB = 2^10, 2^20, 2^30 bytes")); /* units, once */
    /* rendering is deterministic */
    char *s2 = NULL;
    assert_ok(kvc_plan_render_text(r, &s2));
    assert_string_equal(s, s2);
    kvc_plan_string_free(s);
    kvc_plan_string_free(s2);
    free(r);
}

/* ---- randomized sweeps --------------------------------------------------------------- */
static void check_invariants(const kvc_plan_result_t *r)
{
    const kvc_plan_params_t *p = &r->params;
    /* the ledger: visible x utilization, then the remainder is what the subtractions leave */
    if (p->kv_cache_bytes == KVC_PLAN_AUTO) {
        int64_t left = (int64_t)r->budget_bytes;
        for (uint32_t i = 0; i < r->n_ledger; i++)
            if (r->ledger[i].op == KVC_PLAN_OP_SUBTRACT) left -= (int64_t)r->ledger[i].bytes;
        if (p->pp == 1) assert_int_equal(left, r->kv_pool_signed_bytes);
        assert_true(r->budget_bytes <= r->gpu.memory_bytes);
    }
    assert_true(r->num_blocks * p->block_size * r->kv_bytes_per_token_per_gpu <=
                r->kv_pool_bytes_per_gpu);
    assert_true((r->num_blocks + 1) * p->block_size * r->kv_bytes_per_token_per_gpu >
                r->kv_pool_bytes_per_gpu);
    assert_true(r->max_concurrency * r->kv_bytes_per_request <= r->kv_pool_bytes_per_gpu);
    /* a GPU holds at least its share of every layer it serves */
    assert_true(r->kv_bytes_per_token_per_gpu * p->tp * r->model.n_layers >=
                r->kv_bytes_per_token * r->layers_per_gpu);
    /* phases: fits iff none failed; after a failure nothing ran */
    assert_int_equal(r->fits, r->failed_phase < 0);
    for (int i = 0; i < KVC_PLAN_PHASE__COUNT; i++) {
        if (r->failed_phase >= 0 && i > r->failed_phase)
            assert_int_equal(r->phases[i].status, KVC_PLAN_PHASE_NOT_REACHED);
        if (i < r->failed_phase || r->failed_phase < 0)
            assert_true(r->phases[i].status == KVC_PLAN_PHASE_OK ||
                        r->phases[i].status == KVC_PLAN_PHASE_SKIPPED);
    }
    for (int c = 0; c < KVC_PLAN_CEIL__COUNT; c++)
        assert_true(r->ceilings[r->binding_ceiling] <= r->ceilings[c]);
    assert_true(r->sliding_window_saving >= 0 && r->sliding_window_saving < 1);
    assert_true(r->sliding_window_saving <= r->sliding_window_saving_limit + 1e-12);
    assert_true(r->prefill_attention_flops_fraction > 0 && r->prefill_attention_flops_fraction < 1);
    assert_true(r->fork_shared_bytes_beams <= r->fork_shared_bytes_beams_diverged);
    assert_true(r->fork_shared_bytes_samples <= r->fork_unshared_bytes_samples);
    if (r->little_stable)
        assert_true(
            fabs(r->little_resident - r->arrival_rate_per_replica * r->little_time_in_system) <=
            1e-6 * fmax(1, r->little_resident));
    char *s = NULL;
    assert_ok(kvc_plan_render_text(r, &s));
    kvc_plan_string_free(s);
    assert_ok(kvc_plan_render_json(r, &s));
    cJSON *o = cJSON_Parse(s);
    assert_non_null(o);
    cJSON_Delete(o);
    kvc_plan_string_free(s);
}

static void random_deployments_keep_the_invariants(void **state)
{
    (void)state;
    kvc_rng_t rng;
    kvc_rng_seed(&rng, 20240605);
    const int n = 600 / KVC_TEST_SANITIZER_DIVISOR;
    int planned = 0, refused = 0;
    for (int it = 0; it < n; it++) {
        kvc_plan_model_t m;
        kvc_plan_gpu_t g;
        size_t mi = kvc_rng_below(&rng, kvc_plan_model_preset_count());
        size_t gi = kvc_rng_below(&rng, kvc_plan_gpu_preset_count());
        assert_ok(kvc_plan_model_preset(kvc_plan_model_preset_name(mi), &m));
        assert_ok(kvc_plan_gpu_preset(kvc_plan_gpu_preset_name(gi), &g));
        kvc_plan_params_t p = defaults();
        p.tp = 1u << kvc_rng_below(&rng, 6);
        p.pp = 1 + (uint32_t)kvc_rng_below(&rng, 4);
        p.dp = 1 + (uint32_t)kvc_rng_below(&rng, 3);
        p.weight_dtype = (kvc_plan_dtype_t)kvc_rng_below(&rng, 4);
        p.kv_dtype = (kvc_plan_dtype_t)kvc_rng_below(&rng, 3);
        p.block_size = 1u << (3 + kvc_rng_below(&rng, 5));
        p.gpu_memory_utilization = 0.5 + 0.5 * kvc_rng_double(&rng);
        p.prompt_tokens = 1 + kvc_rng_below(&rng, 8000);
        p.output_tokens = 1 + kvc_rng_below(&rng, 2000);
        p.max_num_seqs = 1 + (uint32_t)kvc_rng_below(&rng, 1024);
        p.max_num_batched_tokens = p.max_num_seqs + (uint32_t)kvc_rng_below(&rng, 16384);
        p.spec_tokens = (uint32_t)kvc_rng_below(&rng, 8);
        p.enforce_eager = kvc_rng_below(&rng, 4) == 0;
        p.graphs_outside_budget = kvc_rng_below(&rng, 4) == 0;
        p.window_freeing = kvc_rng_below(&rng, 3) != 0;
        if (kvc_rng_below(&rng, 4) == 0) p.arrival_rate = 100 * kvc_rng_double(&rng);
        if (kvc_rng_below(&rng, 5) == 0) p.kv_cache_bytes = kvc_rng_below(&rng, 64 * GIB);
        if (kvc_rng_below(&rng, 2))
            p.max_model_len = p.prompt_tokens + p.output_tokens + kvc_rng_below(&rng, 30000);
        kvc_plan_result_t *r = malloc(sizeof *r);
        assert_non_null(r);
        char msg[256] = "";
        int rc = kvc_plan_compute(&m, &g, &p, r, msg, sizeof msg);
        if (rc) {
            assert_int_equal(rc, KVC_EINVAL);
            assert_true(msg[0] != '\0');
            refused++;
        } else {
            check_invariants(r);
            planned++;
        }
        free(r);
    }
    assert_true(planned > n / 4); /* the sweep really exercised plans, not just refusals */
    assert_true(refused > 0);
}

/* A value in 1..bound, log-uniform, with the two ends drawn often. */
static uint64_t pick(kvc_rng_t *rng, uint64_t bound)
{
    if (bound <= 1) return 1;
    switch (kvc_rng_below(rng, 4)) {
    case 0:
        return bound;
    case 1:
        return 1;
    default: {
        const int bits = 64 - __builtin_clzll(bound);
        uint64_t v = kvc_rng_next(rng) >> (64 - 1 - kvc_rng_below(rng, (uint64_t)bits));
        return v % bound + 1;
    }
    }
}

__extension__ typedef unsigned __int128 u128;
__extension__ typedef __int128 i128;

/* The integers a plan derives, recounted in 128 bits: nothing wrapped. */
static void check_exact(const kvc_plan_result_t *r)
{
    const kvc_plan_model_t *m = &r->model;
    const kvc_plan_params_t *p = &r->params;
    const u128 bits = kvc_plan_dtype_bits(p->kv_dtype);
    const u128 kv = m->mla ? ((u128)m->kv_lora_rank + m->qk_rope_head_dim) * m->n_layers * bits / 8
                           : (u128)2 * m->n_layers * m->n_kv_heads * m->head_dim * bits / 8;
    assert_true(kv == r->kv_bytes_per_token);
    assert_true(r->kv_bytes_per_token_per_gpu > 0);
    assert_true(r->n_gpus == (u128)p->tp * p->pp * p->dp);
    const kvc_plan_param_count_t *c = &r->counts;
    assert_true((u128)c->embedding + c->lm_head + c->attention + c->mlp_dense + c->experts_routed +
                    c->experts_shared + c->router + c->norms ==
                c->total);
    assert_true(c->total <= KVC_PLAN_MAX_PARAMS && c->active <= c->total);
    assert_true(c->embedding == (u128)m->vocab_size * m->hidden_size);
    /* the pool is what the budget leaves, with no wrap */
    if (p->kv_cache_bytes == KVC_PLAN_AUTO) {
        i128 left = r->budget_bytes;
        for (uint32_t i = 0; i < r->n_ledger; i++)
            if (r->ledger[i].op == KVC_PLAN_OP_SUBTRACT) left -= r->ledger[i].bytes;
        if (p->pp == 1) assert_true(left == r->kv_pool_signed_bytes);
    }
    assert_true((u128)r->num_blocks * p->block_size * r->kv_bytes_per_token_per_gpu <=
                r->kv_pool_bytes_per_gpu);
    assert_true((u128)(r->num_blocks + 1) * p->block_size * r->kv_bytes_per_token_per_gpu >
                r->kv_pool_bytes_per_gpu);
    assert_true(r->image_bytes_per_gpu == (u128)m->image_tokens * r->kv_bytes_per_token_per_gpu);
    assert_true(r->fits == (r->failed_phase < 0));
    char *s = NULL;
    assert_ok(kvc_plan_render_text(r, &s));
    kvc_plan_string_free(s);
    assert_ok(kvc_plan_render_json(r, &s));
    cJSON *o = cJSON_Parse(s);
    assert_non_null(o);
    cJSON_Delete(o);
    kvc_plan_string_free(s);
}
/* ---- hostile inputs: bounds, overflow, parsers ------------------------------------------ */
/* The config from the issue whose KV bytes per token wrapped to 0 (a NULL binding stage). */
#define WRAPPING_CONFIG                                                            \
    "{\"hidden_size\":1,\"intermediate_size\":1,\"num_hidden_layers\":1,"          \
    "\"num_attention_heads\":2147483648,\"head_dim\":2147483648,\"vocab_size\":1," \
    "\"max_position_embeddings\":4096}"

/* Expect the model refused with KVC_EINVAL and one line naming `field` and `bound`, both by
 * kvc_plan_model_check and by kvc_plan_compute (which sim and every caller go through). */
static void expect_model_refused(const kvc_plan_model_t *m, const char *field, const char *bound)
{
    char msg[256] = "";
    assert_int_equal(kvc_plan_model_check(m, msg, sizeof msg), KVC_EINVAL);
    if (!strstr(msg, field) || !strstr(msg, bound) || strchr(msg, '\n'))
        fail_msg("model_check: '%s' lacks '%s' or '%s'", msg, field, bound);
    kvc_plan_gpu_t g = tiny_gpu();
    kvc_plan_params_t p = defaults();
    expect_refused(m, &g, &p, KVC_EINVAL, field);
}

static void model_fields_are_bounded_by_real_models(void **state)
{
    (void)state;
    /* the issue's crash: KV bytes per token 2 x 1 x 2^31 x 2^31 x 2 B wrapped to 0 */
    kvc_plan_model_t m = tiny();
    m.hidden_size = 1;
    m.n_layers = 1;
    m.n_heads = m.n_kv_heads = 1u << 31;
    m.head_dim = m.v_head_dim = 1u << 31;
    expect_model_refused(&m, "num_attention_heads 2147483648", "8192");
    /* the issue's hang: the per-layer weight loop over 2^32 - 1 layers */
    m = tiny();
    m.n_layers = UINT32_MAX;
    expect_model_refused(&m, "num_hidden_layers 4294967295", "4096");
    /* each field at its bound passes on its own, one past it is refused by name */
    const struct {
        size_t off;
        const char *name;
        uint32_t bound;
    } fields[] = {
        {offsetof(kvc_plan_model_t, hidden_size), "hidden_size", KVC_PLAN_MAX_HIDDEN},
        {offsetof(kvc_plan_model_t, n_layers), "num_hidden_layers", KVC_PLAN_MAX_LAYERS},
        {offsetof(kvc_plan_model_t, head_dim), "head_dim", KVC_PLAN_MAX_HEAD_DIM},
        {offsetof(kvc_plan_model_t, v_head_dim), "v_head_dim", KVC_PLAN_MAX_HEAD_DIM},
        {offsetof(kvc_plan_model_t, vocab_size), "vocab_size", KVC_PLAN_MAX_VOCAB},
        {offsetof(kvc_plan_model_t, intermediate_size), "intermediate_size",
         KVC_PLAN_MAX_INTERMEDIATE},
        {offsetof(kvc_plan_model_t, image_tokens), "image tokens", KVC_PLAN_MAX_IMAGE_TOKENS},
        {offsetof(kvc_plan_model_t, sliding_window), "sliding_window", KVC_PLAN_MAX_WINDOW},
    };
    for (size_t i = 0; i < KVC_ARRAY_LEN(fields); i++) {
        m = tiny();
        uint32_t *f = (uint32_t *)((char *)&m + fields[i].off);
        if (fields[i].off == offsetof(kvc_plan_model_t, sliding_window)) m.n_sliding_layers = 2;
        *f = fields[i].bound;
        char msg[256] = "";
        if (kvc_plan_model_check(&m, msg, sizeof msg))
            fail_msg("%s at its bound %u refused: %s", fields[i].name, fields[i].bound, msg);
        *f = fields[i].bound + 1;
        char bound[32];
        snprintf(bound, sizeof bound, "%u", fields[i].bound);
        expect_model_refused(&m, fields[i].name, bound);
    }
    m = tiny();
    m.max_position_embeddings = KVC_PLAN_MAX_TOKENS + 1;
    expect_model_refused(&m, "max_position_embeddings", "4294967296");
    /* MoE and MLA fields */
    m = tiny();
    m.n_experts = KVC_PLAN_MAX_EXPERTS + 1;
    m.n_experts_active = 1;
    m.moe_intermediate_size = 8;
    expect_model_refused(&m, "num_experts", "16384");
    m.n_experts = 8;
    m.n_shared_experts = KVC_PLAN_MAX_EXPERTS + 1;
    expect_model_refused(&m, "n_shared_experts", "16384");
    m.n_shared_experts = 0;
    m.moe_intermediate_size = KVC_PLAN_MAX_INTERMEDIATE + 1;
    expect_model_refused(&m, "moe_intermediate_size", "1048576");
    m = preset_model("deepseek-v3");
    m.kv_lora_rank = KVC_PLAN_MAX_RANK + 1;
    expect_model_refused(&m, "kv_lora_rank", "131072");
    m = preset_model("deepseek-v3");
    m.qk_rope_head_dim = UINT32_MAX; /* nope + rope wraps in 32 bits: head_dim "matches" */
    m.head_dim = (uint32_t)((uint64_t)m.qk_nope_head_dim + m.qk_rope_head_dim);
    expect_model_refused(&m, "qk_rope_head_dim", "16384");
}

static void derived_counts_are_bounded_too(void **state)
{
    (void)state;
    /* every field within its bound, but 4,096 layers of 8,192 KV heads of 16,384: KV bytes
     * per token 2 x 4096 x 8192 x 16384 x 2 B = 2^41, over the bound 2^30 */
    kvc_plan_model_t m = tiny();
    m.hidden_size = 1;
    m.n_layers = KVC_PLAN_MAX_LAYERS;
    m.n_heads = m.n_kv_heads = KVC_PLAN_MAX_HEADS;
    m.head_dim = m.v_head_dim = KVC_PLAN_MAX_HEAD_DIM;
    expect_model_refused(&m, "KV bytes per token", "1073741824");
    /* 16,384 experts of width 2^20 over 4,096 layers of width 2^17: 3 x 2^63 parameters,
     * which wrapped 64 bits; the bound is 2^50 */
    m = tiny();
    m.hidden_size = KVC_PLAN_MAX_HIDDEN;
    m.n_layers = KVC_PLAN_MAX_LAYERS;
    m.n_experts = KVC_PLAN_MAX_EXPERTS;
    m.n_experts_active = 1;
    m.moe_intermediate_size = KVC_PLAN_MAX_INTERMEDIATE;
    expect_model_refused(&m, "parameters", "1125899906842624");
    /* the smallest model there is still counts */
    m = tiny();
    m.hidden_size = 1;
    m.vocab_size = 1;
    m.n_layers = 1;
    m.n_heads = m.n_kv_heads = 1;
    m.head_dim = m.v_head_dim = 1;
    m.intermediate_size = 1;
    assert_ok(kvc_plan_model_check(&m, NULL, 0));
    kvc_plan_param_count_t c;
    kvc_plan_model_params(&m, &c);
    /* attention q, k, v, o 4 + MLP 3 + norms 2 + final norm 1 + embedding 1 + head 1 */
    assert_int_equal(c.total, 12);
}

/* BASE without its layer count (a repeated key would read as the first). */
#define NO_LAYERS                                                                 \
    "\"hidden_size\": 4096, \"num_attention_heads\": 32, \"vocab_size\": 32000, " \
    "\"intermediate_size\": 11008"

static void config_bounds_name_the_key_as_written(void **state)
{
    (void)state;
    kvc_plan_model_t m;
    char msg[256];
    const struct {
        const char *json;
        const char *needle;
    } cases[] = {
        {WRAPPING_CONFIG, "num_attention_heads 2147483648 is out of range: at most 8192"},
        {"{" NO_LAYERS ", \"num_hidden_layers\": 4294967295}",
         "num_hidden_layers 4294967295 is out of range: at most 4096"},
        {"{" NO_LAYERS ", \"n_layer\": 5000, \"num_hidden_layers\": null}",
         "n_layer 5000 is out of range: at most 4096"},
        /* 65,536 / 1 = 65,536 patches a side: 2^32 image tokens, which wrapped to 0 */
        {"{\"text_config\": {" BASE "}, \"vision_config\": {\"image_size\": 65536,"
         " \"patch_size\": 1}}",
         "image tokens"},
        {"{" BASE ", \"mm_tokens_per_image\": 1048577}", "mm_tokens_per_image 1048577"},
        {"{" NO_LAYERS ", \"num_hidden_layers\": 2, \"max_position_embeddings\": 4294967297}",
         "max_position_embeddings"},
        {"{" BASE ", \"kv_lora_rank\": 512, \"qk_rope_head_dim\": 4294967295,"
         " \"qk_nope_head_dim\": 1, \"v_head_dim\": 128}",
         "qk_rope_head_dim 4294967295 is out of range"},
        /* first_k_dense_replace plus mlp_only_layers wrapped 32 bits to 0 dense layers */
        {"{" BASE ", \"num_local_experts\": 8, \"num_experts_per_tok\": 2,"
         " \"first_k_dense_replace\": 4294967295, \"mlp_only_layers\": [1]}",
         "first_k_dense_replace"},
        {"{" BASE ", \"num_local_experts\": 8, \"num_experts_per_tok\": 2,"
         " \"moe_intermediate_size\": 1048576, \"n_routed_experts\": 16384}",
         "parameters"},
    };
    for (size_t i = 0; i < KVC_ARRAY_LEN(cases); i++) {
        int rc = parse(cases[i].json, &m, msg);
        if (rc != KVC_EINVAL || !strstr(msg, cases[i].needle) || strchr(msg, '\n'))
            fail_msg("case %zu: rc %d msg '%s', want KVC_EINVAL '%s'", i, rc, msg, cases[i].needle);
    }
}

/* A sim run loads its model through the planner (kvc_sim_run -> kvc_plan_compute); the
 * wrapping model crashed it the way it crashed `kvcache plan`. */
static void sim_refuses_what_the_planner_refuses(void **state)
{
    (void)state;
    kvc_sim_config_t c = kvc_sim_config_default();
    char msg[256] = "";
    assert_int_equal(kvc_plan_model_from_json(WRAPPING_CONFIG, strlen(WRAPPING_CONFIG), "w",
                                              &c.model, msg, sizeof msg),
                     KVC_EINVAL);
    /* a caller that fills the struct itself gets the same refusal from the run */
    c.model = tiny();
    c.model.hidden_size = 1;
    c.model.n_layers = 1;
    c.model.n_heads = c.model.n_kv_heads = 1u << 31;
    c.model.head_dim = c.model.v_head_dim = 1u << 31;
    c.gpu = tiny_gpu();
    c.num_blocks = 64;
    kvc_workload_params_t wp = kvc_workload_params_default();
    kvc_workload_t *w = NULL;
    char err[256] = "";
    assert_ok(kvc_workload_load("poisson:rate=5,n=4,prompt=16,output=4", &wp, &w, err, sizeof err));
    kvc_report_params_t rp = kvc_report_params_default();
    kvc_report_t *rep = NULL;
    assert_ok(kvc_report_create(&rp, &rep));
    kvc_sim_result_t *res = malloc(sizeof *res);
    assert_non_null(res);
    err[0] = '\0';
    assert_int_equal(kvc_sim_run(&c, w, rep, res, err, sizeof err), KVC_EINVAL);
    if (!strstr(err, "num_attention_heads")) fail_msg("sim: '%s'", err);
    free(res);
    kvc_report_destroy(rep);
    kvc_workload_destroy(w);
}

static void byte_overrides_and_deployment_sizes_are_bounded(void **state)
{
    (void)state;
    kvc_plan_model_t m = tiny();
    kvc_plan_gpu_t g = tiny_gpu();
    kvc_plan_params_t p = defaults();
    /* the issue's signed overflow: budget - 9.2e18 - 9.2e18 */
    p.weight_bytes = p.activation_bytes = UINT64_C(9200000000000000000);
    expect_refused(&m, &g, &p, KVC_EINVAL, "--weight-memory 9200000000000000000");
    p = defaults();
    p.activation_bytes = KVC_PLAN_MAX_BYTES + 1;
    expect_refused(&m, &g, &p, KVC_EINVAL, "--activation-memory");
    p = defaults();
    p.kv_cache_bytes = KVC_PLAN_MAX_BYTES + 1;
    expect_refused(&m, &g, &p, KVC_EINVAL, "--kv-cache-memory");
    /* at the bound every override plans: nothing fits, and the ledger still adds up */
    p = defaults();
    p.weight_bytes = p.activation_bytes = p.cuda_graph_bytes = p.non_torch_bytes =
        KVC_PLAN_MAX_BYTES;
    kvc_plan_result_t *r = plan(&m, &g, &p);
    assert_false(r->fits);
    assert_int_equal(r->failed_phase, KVC_PLAN_PHASE_LOAD_WEIGHTS);
    assert_true(r->kv_pool_signed_bytes ==
                (int64_t)r->budget_bytes - 4 * (int64_t)KVC_PLAN_MAX_BYTES);
    check_invariants(r);
    free(r);
    /* the GPU's memory and rates */
    g.memory_bytes = KVC_PLAN_MAX_BYTES + 1;
    char msg[256] = "";
    assert_int_equal(kvc_plan_gpu_check(&g, msg, sizeof msg), KVC_EINVAL);
    assert_non_null(strstr(msg, "memory"));
    g = tiny_gpu();
    g.pcie_bytes_per_s = INFINITY;
    assert_int_equal(kvc_plan_gpu_check(&g, msg, sizeof msg), KVC_EINVAL);
    g = tiny_gpu();
    g.fp8_flops = NAN;
    assert_int_equal(kvc_plan_gpu_check(&g, msg, sizeof msg), KVC_EINVAL);
    g = tiny_gpu();
    /* an infinite host link was accepted and printed "inf TB/s" */
    p = defaults();
    p.host_bytes_per_s = INFINITY;
    expect_refused(&m, &g, &p, KVC_EINVAL, "--host-bandwidth");
    p = defaults();
    p.ssd_write_bytes_per_s = INFINITY;
    expect_refused(&m, &g, &p, KVC_EINVAL, "--ssd-write-rate");
    p = defaults();
    p.prefill_tokens_per_s = 1e300;
    expect_refused(&m, &g, &p, KVC_EINVAL, "--prefill-tokens-per-s");
    /* token counts and engine limits (1024 x 64 x 65536 GPUs wrapped the 32-bit count to 0) */
    p = defaults();
    p.max_model_len = KVC_PLAN_MAX_TOKENS + 1;
    m.max_position_embeddings = 0;
    expect_refused(&m, &g, &p, KVC_EINVAL, "--max-model-len");
    m = tiny();
    p = defaults();
    p.tenant_tokens = KVC_PLAN_MAX_TOKENS + 1;
    expect_refused(&m, &g, &p, KVC_EINVAL, "--tenant-tokens");
    p = defaults();
    p.max_num_batched_tokens = UINT32_MAX;
    expect_refused(&m, &g, &p, KVC_EINVAL, "--max-num-batched-tokens");
    p = defaults();
    p.max_num_seqs = p.max_num_batched_tokens = (1u << 24) + 1;
    expect_refused(&m, &g, &p, KVC_EINVAL, "--max-num-seqs");
    p = defaults();
    p.n_samples = 1025;
    expect_refused(&m, &g, &p, KVC_EINVAL, "--n");
    m.n_heads = m.n_kv_heads = 1024;
    m.hidden_size = 1024;
    m.head_dim = m.v_head_dim = 1;
    m.n_layers = 64;
    p = defaults();
    p.tp = 1024;
    p.pp = 64;
    p.dp = 65536;
    expect_refused(&m, &g, &p, KVC_EINVAL, "GPUs");
}

static void units_refuse_what_overflows(void **state)
{
    (void)state;
    double d;
    uint64_t v;
    /* 1e300 x 1e12 is inf: it was accepted as a rate */
    const char *bad_rates[] = {"1e300TB/s", "1e308", "1e300 TiB/s", "inf",
                               "nan",       "1e400", "5 GB/s x",    NULL};
    for (int i = 0; bad_rates[i]; i++)
        if (kvc_plan_parse_rate(bad_rates[i], &d) != KVC_EINVAL)
            fail_msg("rate '%s' accepted as %g", bad_rates[i], d);
    const char *bad_sizes[] = {"1e300TB", "1e300", "9.3e18", "8EiB", "1e19 B", NULL};
    for (int i = 0; bad_sizes[i]; i++)
        if (kvc_plan_parse_bytes(bad_sizes[i], &v) != KVC_EINVAL)
            fail_msg("size '%s' accepted as %llu", bad_sizes[i], (unsigned long long)v);
    /* the largest of each still parses */
    assert_ok(kvc_plan_parse_rate("1e290TB/s", &d));
    assert_true(isfinite(d) && d == 1e290 * 1e12);
    assert_ok(kvc_plan_parse_bytes("8e18", &v));
    assert_int_equal(v, UINT64_C(8000000000000000000));
}

static void config_text_is_one_json_object_and_nothing_else(void **state)
{
    (void)state;
    kvc_plan_model_t m;
    char msg[256];
    /* whitespace after the object is fine */
    static const char spaced[] = "{" BASE "}\n\t \r\n";
    assert_ok(kvc_plan_model_from_json(spaced, sizeof spaced - 1, "t", &m, msg, sizeof msg));
    const struct {
        const char *text;
        size_t len;
        const char *needle;
    } cases[] = {
#define LIT(text) text, sizeof text - 1
        {LIT("{" BASE "} trailing garbage"), "trailing text at byte"},
        {LIT("{" BASE "}{\"hidden_size\": 8}"), "trailing text"},
        /* an embedded NUL and a second object after it */
        {LIT("{" BASE "}\0{\"x\": 1}"), "NUL byte at byte"},
        /* a NUL inside a string cut the string short */
        {LIT("{" BASE ", \"model_type\": \"lla\0ma\"}"), "NUL byte"},
        /* a raw control byte inside a string, or between tokens, is not JSON */
        {LIT("{" BASE ", \"model_type\": \"lla\033ma\"}"), "control byte 0x1b"},
        {LIT("{" BASE ", \"model_type\": \"a\tb\"}"), "control byte 0x09"},
        {LIT("{" BASE ",\001\"head_dim\": 128}"), "control byte 0x01"},
#undef LIT
    };
    for (size_t i = 0; i < KVC_ARRAY_LEN(cases); i++) {
        msg[0] = '\0';
        int rc = kvc_plan_model_from_json(cases[i].text, cases[i].len, "t", &m, msg, sizeof msg);
        if (rc != KVC_EPARSE || !strstr(msg, cases[i].needle) || strchr(msg, '\n'))
            fail_msg("case %zu: rc %d msg '%s', want KVC_EPARSE '%s'", i, rc, msg, cases[i].needle);
    }
    /* escaped control characters in strings are JSON and stay accepted */
    static const char escaped[] = "{" BASE ", \"model_type\": \"a\\tb\\u001b\"}";
    assert_ok(kvc_plan_model_from_json(escaped, sizeof escaped - 1, "t", &m, msg, sizeof msg));
}

/* True when s holds no byte below 0x20 but '\n', and no DEL. */
static bool printable(const char *s)
{
    for (; *s; s++)
        if (((unsigned char)*s < 0x20 && *s != '\n') || *s == 0x7f) return false;
    return true;
}

static void reports_and_messages_escape_control_bytes(void **state)
{
    (void)state;
    kvc_plan_model_t m = tiny();
    snprintf(m.name, sizeof m.name, "evil\033[31mred\x7f\x01");
    kvc_plan_gpu_t g = tiny_gpu();
    kvc_plan_params_t p = defaults();
    kvc_plan_result_t *r = plan(&m, &g, &p);
    char *s = NULL;
    assert_ok(kvc_plan_render_text(r, &s));
    assert_true(printable(s));
    assert_non_null(strstr(s, "kvcache plan: evil\\x1b[31mred\\x7f\\x01 on 1 x tiny GPU"));
    kvc_plan_string_free(s);
    /* JSON keeps the name as it is, escaped the JSON way */
    assert_ok(kvc_plan_render_json(r, &s));
    cJSON *o = cJSON_Parse(s);
    assert_non_null(o);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "model"), "name")->valuestring,
                        m.name);
    cJSON_Delete(o);
    kvc_plan_string_free(s);
    free(r);
    /* a path with a control byte in it, echoed in the error */
    char msg[256] = "";
    assert_int_equal(kvc_plan_model_load("/nonexistent/a\033b\nc/config.json", &m, msg, sizeof msg),
                     KVC_EIO);
    assert_true(printable(msg) && !strchr(msg, '\n'));
    assert_non_null(strstr(msg, "/nonexistent/a\\x1bb\\x0ac/config.json"));
}

/* Every field and option drawn anywhere in its accepted range, most of them near the ends:
 * a plan is refused with one line or computed without a wrap (the sanitizer build checks
 * the arithmetic), and the derived integers agree with a 128-bit recount. */
static void extreme_inputs_plan_exactly_or_are_refused(void **state)
{
    (void)state;
    kvc_rng_t rng;
    kvc_rng_seed(&rng, 11);
    const int n = 300 / KVC_TEST_SANITIZER_DIVISOR;
    int planned = 0, refused = 0;
#define PICK(bound) pick(&rng, (bound))
    for (int it = 0; it < n; it++) {
        kvc_plan_model_t m = {.name = "extreme"};
        kvc_plan_params_t p = defaults();
        p.tp = 1u << kvc_rng_below(&rng, 11); /* a TP that divides the heads */
        m.hidden_size = (uint32_t)PICK(KVC_PLAN_MAX_HIDDEN);
        m.n_layers = (uint32_t)PICK(KVC_PLAN_MAX_LAYERS);
        m.n_heads = p.tp * (uint32_t)PICK(KVC_PLAN_MAX_HEADS / p.tp);
        m.n_kv_heads = kvc_rng_below(&rng, 2) ? m.n_heads : 1;
        m.head_dim = m.v_head_dim = (uint32_t)PICK(KVC_PLAN_MAX_HEAD_DIM);
        m.vocab_size = (uint32_t)PICK(KVC_PLAN_MAX_VOCAB);
        m.intermediate_size = (uint32_t)PICK(KVC_PLAN_MAX_INTERMEDIATE);
        m.tie_embeddings = kvc_rng_below(&rng, 2);
        m.qkv_bias = kvc_rng_below(&rng, 2);
        if (kvc_rng_below(&rng, 3) == 0) {
            m.n_experts = (uint32_t)PICK(KVC_PLAN_MAX_EXPERTS);
            m.n_experts_active = (uint32_t)PICK(m.n_experts);
            m.moe_intermediate_size = (uint32_t)PICK(KVC_PLAN_MAX_INTERMEDIATE);
            m.n_shared_experts = (uint32_t)kvc_rng_below(&rng, 3);
            m.n_dense_layers = (uint32_t)kvc_rng_below(&rng, m.n_layers + 1);
        }
        if (kvc_rng_below(&rng, 4) == 0) {
            m.mla = true;
            m.kv_lora_rank = (uint32_t)PICK(KVC_PLAN_MAX_RANK);
            m.q_lora_rank = (uint32_t)kvc_rng_below(&rng, KVC_PLAN_MAX_RANK);
            m.qk_rope_head_dim = (uint32_t)PICK(KVC_PLAN_MAX_HEAD_DIM / 2);
            m.qk_nope_head_dim = (uint32_t)PICK(KVC_PLAN_MAX_HEAD_DIM / 2);
            m.head_dim = m.qk_rope_head_dim + m.qk_nope_head_dim;
        }
        if (kvc_rng_below(&rng, 3) == 0) {
            m.sliding_window = (uint32_t)PICK(KVC_PLAN_MAX_WINDOW);
            m.n_sliding_layers = (uint32_t)PICK(m.n_layers);
        }
        m.image_tokens = (uint32_t)kvc_rng_below(&rng, KVC_PLAN_MAX_IMAGE_TOKENS + 1);
        m.max_position_embeddings = 1 + PICK(KVC_PLAN_MAX_TOKENS - 1);
        kvc_plan_gpu_t g = tiny_gpu();
        g.memory_bytes = PICK(KVC_PLAN_MAX_BYTES);
        g.hbm_bytes_per_s = (double)PICK((uint64_t)KVC_PLAN_MAX_RATE);
        g.bf16_flops = (double)PICK(UINT64_C(1) << 62) * 100;
        g.fp8_flops = kvc_rng_below(&rng, 2) ? 0 : (double)PICK(UINT64_C(1) << 62) * 100;
        g.l2_bytes = PICK(KVC_PLAN_MAX_BYTES);
        p.pp = (uint32_t)PICK(KVC_MIN(64, m.n_layers));
        p.dp = (uint32_t)PICK(KVC_MIN(65536, KVC_PLAN_MAX_GPUS / ((uint64_t)p.tp * p.pp)));
        p.block_size = 1u << kvc_rng_below(&rng, 11);
        p.weight_dtype = (kvc_plan_dtype_t)kvc_rng_below(&rng, 4);
        p.kv_dtype = (kvc_plan_dtype_t)kvc_rng_below(&rng, 3);
        p.max_num_seqs = (uint32_t)PICK(KVC_PLAN_MAX_SEQS);
        p.max_num_batched_tokens =
            p.max_num_seqs + (uint32_t)kvc_rng_below(&rng, KVC_PLAN_MAX_BATCHED - p.max_num_seqs);
        p.max_model_len = kvc_rng_below(&rng, 2) ? 0 : 1 + PICK(m.max_position_embeddings - 1);
        const uint64_t max_len = p.max_model_len ? p.max_model_len : m.max_position_embeddings;
        p.prompt_tokens = PICK(KVC_MAX(max_len / 2, 1));
        p.output_tokens = PICK(KVC_MAX(max_len / 2, 1));
        p.context_tokens = kvc_rng_below(&rng, 2) ? 0 : PICK(max_len);
        p.tenant_tokens = kvc_rng_below(&rng, 2) ? 0 : PICK(KVC_PLAN_MAX_TOKENS);
        p.n_samples = (uint32_t)PICK(KVC_PLAN_MAX_FORKS);
        p.beams = (uint32_t)PICK(KVC_PLAN_MAX_FORKS);
        uint64_t *const overrides[] = {&p.weight_bytes,       &p.activation_bytes,
                                       &p.cuda_graph_bytes,   &p.non_torch_bytes,
                                       &p.cuda_context_bytes, &p.kv_cache_bytes};
        for (size_t i = 0; i < KVC_ARRAY_LEN(overrides); i++)
            if (kvc_rng_below(&rng, 4) == 0) *overrides[i] = PICK(KVC_PLAN_MAX_BYTES);
        p.link_bytes_per_s = (double)PICK((uint64_t)KVC_PLAN_MAX_RATE);
        p.host_bytes_per_s = (double)PICK((uint64_t)KVC_PLAN_MAX_RATE);
        p.prefill_tokens_per_s = kvc_rng_below(&rng, 2) ? 0 : (double)PICK(1u << 30);
        p.spec_tokens = (uint32_t)kvc_rng_below(&rng, 65);
        p.mfu = p.mbu = kvc_rng_below(&rng, 2) ? 1 : 1e-6;
        kvc_plan_result_t *r = malloc(sizeof *r);
        assert_non_null(r);
        char msg[256] = "";
        int rc = kvc_plan_compute(&m, &g, &p, r, msg, sizeof msg);
        if (rc) {
            if (rc != KVC_EINVAL || !msg[0] || strchr(msg, '\n'))
                fail_msg("iteration %d: rc %d msg '%s'", it, rc, msg);
            refused++;
        } else {
            planned++;
            check_exact(r);
        }
        free(r);
    }
#undef PICK
    assert_true(planned > n / 20);
    assert_true(refused > n / 20);
}

/* Every NULL argument a header names is its error code, never a crash. */
static void null_arguments_are_errors(void **state)
{
    (void)state;
    kvc_plan_model_t m;
    kvc_plan_gpu_t g;
    kvc_plan_dtype_t dt;
    uint64_t v;
    double d;
    char msg[128] = "";
    assert_int_equal(kvc_plan_dtype_parse("bf16", NULL), KVC_EINVAL);
    assert_int_equal(kvc_plan_model_preset("llama-3.1-8b", NULL), KVC_EINVAL);
    assert_int_equal(kvc_plan_gpu_preset("h100", NULL), KVC_EINVAL);
    assert_int_equal(kvc_plan_parse_bytes("1GiB", NULL), KVC_EINVAL);
    assert_int_equal(kvc_plan_parse_rate("1GB/s", NULL), KVC_EINVAL);
    assert_int_equal(kvc_plan_parse_bytes(NULL, &v), KVC_EINVAL);
    assert_int_equal(kvc_plan_parse_rate(NULL, &d), KVC_EINVAL);
    assert_int_equal(kvc_plan_dtype_parse(NULL, &dt), KVC_EINVAL);
    assert_int_equal(kvc_plan_model_check(NULL, msg, sizeof msg), KVC_EINVAL);
    assert_int_equal(kvc_plan_gpu_check(NULL, msg, sizeof msg), KVC_EINVAL);
    assert_int_equal(kvc_plan_model_from_json(NULL, 0, "x", &m, msg, sizeof msg), KVC_EINVAL);
    assert_int_equal(kvc_plan_model_from_json("{}", 2, "x", NULL, msg, sizeof msg), KVC_EINVAL);
    assert_int_equal(kvc_plan_model_load(NULL, &m, msg, sizeof msg), KVC_EINVAL);
    assert_int_equal(kvc_plan_model_load("/nonexistent", NULL, msg, sizeof msg), KVC_EINVAL);
    g = tiny_gpu();
    m = tiny();
    kvc_plan_params_t p = defaults();
    assert_int_equal(kvc_plan_compute(&m, &g, &p, NULL, msg, sizeof msg), KVC_EINVAL);
    assert_int_equal(kvc_plan_compute(NULL, &g, &p, NULL, NULL, 0), KVC_EINVAL);
    char *s = NULL;
    assert_int_equal(kvc_plan_render_text(NULL, &s), KVC_EINVAL);
    assert_int_equal(kvc_plan_render_json(NULL, &s), KVC_EINVAL);
    kvc_plan_result_t *r = plan(&m, &g, &p);
    assert_int_equal(kvc_plan_render_text(r, NULL), KVC_EINVAL);
    assert_int_equal(kvc_plan_render_json(r, NULL), KVC_EINVAL);
    free(r);
    kvc_plan_string_free(NULL);
}

/* A deployment-wide count past 64 bits is printed as a number, not wrapped: 2^60 B of
 * memory, 512 B per request, 65,536 replicas. */
static void deployment_totals_do_not_wrap_in_the_text(void **state)
{
    (void)state;
    kvc_plan_model_t m = tiny();
    kvc_plan_gpu_t g = tiny_gpu();
    g.memory_bytes = KVC_PLAN_MAX_BYTES;
    kvc_plan_params_t p = defaults();
    p.dp = 65536;
    p.prompt_tokens = p.output_tokens = 1;
    p.block_size = 1;
    kvc_plan_result_t *r = plan(&m, &g, &p);
    assert_true((double)r->max_concurrency * p.dp > 0x1p64);
    char want[64];
    snprintf(want, sizeof want, "x 65536 replicas = %.3g for the deployment",
             (double)r->max_concurrency * p.dp);
    char *s = NULL;
    assert_ok(kvc_plan_render_text(r, &s));
    if (!strstr(s, want)) fail_msg("the text lacks '%s'", want);
    kvc_plan_string_free(s);
    free(r);
}

static void mangled_configs_never_crash_the_reader(void **state)
{
    (void)state;
    static const char base[] =
        "{\"architectures\": [\"X\"], \"model_type\": \"gemma2\", \"hidden_size\": 4608, "
        "\"intermediate_size\": 36864, \"num_hidden_layers\": 46, \"num_attention_heads\": 32, "
        "\"num_key_value_heads\": 16, \"head_dim\": 128, \"vocab_size\": 256000, "
        "\"max_position_embeddings\": 8192, \"sliding_window\": 4096, "
        "\"kv_lora_rank\": null, \"text_config\": {\"num_local_experts\": 0}, "
        "\"tie_word_embeddings\": true}";
    kvc_rng_t rng;
    kvc_rng_seed(&rng, 7);
    char buf[sizeof base];
    const int n = 20000 / KVC_TEST_SANITIZER_DIVISOR;
    int ok = 0;
    for (int it = 0; it < n; it++) {
        memcpy(buf, base, sizeof base);
        size_t len = sizeof base - 1;
        int edits = 1 + (int)kvc_rng_below(&rng, 4);
        for (int e = 0; e < edits && len > 0; e++) {
            size_t at = kvc_rng_below(&rng, len);
            switch (kvc_rng_below(&rng, 3)) {
            case 0:
                buf[at] = (char)kvc_rng_below(&rng, 256);
                break;
            case 1:
                buf[at] = "0123456789{}[]\":,-.e nul"[kvc_rng_below(&rng, 24)];
                break;
            default:
                len = at;
                break; /* truncate */
            }
        }
        kvc_plan_model_t m;
        char msg[256] = "";
        int rc = kvc_plan_model_from_json(buf, len, "fuzz", &m, msg, sizeof msg);
        if (rc == 0) {
            assert_ok(kvc_plan_model_check(&m, NULL, 0));
            ok++;
        } else {
            assert_true(rc == KVC_EPARSE || rc == KVC_EINVAL);
            assert_true(msg[0] != '\0');
            assert_null(strchr(msg, '\n'));
        }
    }
    assert_true(ok > 0 && ok < n);
}

/* Expects kvc_plan_model_from_json to refuse text with rc and one line holding needle. */
static void expect_config_refused(const char *text, int rc, const char *needle)
{
    kvc_plan_model_t m;
    char msg[256] = "";
    const int got = kvc_plan_model_from_json(text, strlen(text), "c", &m, msg, sizeof msg);
    if (got != rc) fail_msg("rc %d (want %d) for %s: %s", got, rc, text, msg);
    if (!strstr(msg, needle)) fail_msg("'%s' lacks '%s'", msg, needle);
    assert_null(strchr(msg, '\n'));
}

/* Mamba-2, Nemotron-H and Qwen3-Next configs: each field that sizes the state is required
 * (named when missing), a malformed layer pattern is refused naming what is wrong, and the
 * model check says the same of a hand-built model. */
static void recurrent_configs_name_what_is_wrong(void **state)
{
    (void)state;
#define NEMO_HEAD                                                                                \
    "{\"model_type\": \"nemotron_h\", \"hidden_size\": 64, \"num_attention_heads\": 4,"          \
    " \"num_key_value_heads\": 2, \"head_dim\": 16, \"vocab_size\": 100, \"intermediate_size\":" \
    " 128, "
#define NEMO_MIXER                                                                              \
    ", \"mamba_num_heads\": 4, \"mamba_head_dim\": 16, \"ssm_state_size\": 8, \"n_groups\": 2," \
    " \"conv_kernel\": 4"
    /* a well-formed one: M * - M; state per M: conv 3 x (64 + 2 x 2 x 8) x 2 = 576, SSM
     * 4 x 16 x 8 x 2 = 1,024; KV 2 x 1 x 2 x 16 x 2 = 128 B per token */
    const char *ok =
        NEMO_HEAD "\"num_hidden_layers\": 4, \"hybrid_override_pattern\": \"M*-M\"" NEMO_MIXER "}";
    kvc_plan_model_t m;
    char msg[256] = "";
    assert_ok(kvc_plan_model_from_json(ok, strlen(ok), "ok", &m, msg, sizeof msg));
    assert_int_equal(m.n_recurrent_layers, 2);
    assert_int_equal(kvc_plan_kv_bytes_per_token(&m, KVC_PLAN_BF16), 128);
    /* the pattern's length is not the layer count */
    expect_config_refused(
        NEMO_HEAD "\"num_hidden_layers\": 5, \"hybrid_override_pattern\": \"M*-M\"" NEMO_MIXER "}",
        KVC_EINVAL, "hybrid_override_pattern has 4 layers but num_hidden_layers is 5");
    /* a letter that is none of M * - E */
    expect_config_refused(
        NEMO_HEAD "\"num_hidden_layers\": 4, \"hybrid_override_pattern\": \"M*XM\"" NEMO_MIXER "}",
        KVC_EINVAL, "hybrid_override_pattern: layer 2 is 'X'");
    /* not a string */
    expect_config_refused(NEMO_HEAD
                          "\"num_hidden_layers\": 4, \"hybrid_override_pattern\": 7" NEMO_MIXER "}",
                          KVC_EPARSE, "hybrid_override_pattern: expected a string");
    /* MoE layers without experts */
    expect_config_refused(
        NEMO_HEAD "\"num_hidden_layers\": 4, \"hybrid_override_pattern\": \"M*EM\"" NEMO_MIXER "}",
        KVC_EINVAL, "n_routed_experts is missing");
    /* each Mamba-2 field that sizes the state, missing */
    expect_config_refused(
        NEMO_HEAD
        "\"num_hidden_layers\": 4, \"hybrid_override_pattern\": \"M*-M\","
        " \"mamba_num_heads\": 4, \"mamba_head_dim\": 16, \"n_groups\": 2, \"conv_kernel\": 4}",
        KVC_EINVAL, "ssm_state_size is missing");
    expect_config_refused(NEMO_HEAD
                          "\"num_hidden_layers\": 4, \"hybrid_override_pattern\": \"M*-M\","
                          " \"mamba_num_heads\": 4, \"mamba_head_dim\": 16, \"ssm_state_size\": 8, "
                          "\"conv_kernel\": 4}",
                          KVC_EINVAL, "n_groups is missing");
    /* Nemotron-H's mixer is heads x head_dim wide whatever expand says (the Nemotron 3 Nano:
     * 64 x 64 with expand 2 and hidden 2,688); Mamba2Config refuses the mismatch, and so do we */
    const char *nano = NEMO_HEAD
        "\"num_hidden_layers\": 4, \"hybrid_override_pattern\": \"M*-M\", \"expand\": 2" NEMO_MIXER
        "}";
    assert_ok(kvc_plan_model_from_json(nano, strlen(nano), "nano", &m, msg, sizeof msg));
    assert_int_equal(m.ssm_d_inner, 64);
    expect_config_refused(
        "{\"model_type\": \"mamba2\", \"hidden_size\": 64, \"num_hidden_layers\": 2,"
        " \"vocab_size\": 100, \"num_heads\": 4, \"head_dim\": 16, \"state_size\": 8,"
        " \"n_groups\": 1, \"conv_kernel\": 4, \"expand\": 2}",
        KVC_EINVAL, "expand 2 x hidden_size 64 is not num_heads 4 x head_dim 16");
    /* the layers_block_type spelling, with an unknown kind */
    expect_config_refused(
        NEMO_HEAD
        "\"num_hidden_layers\": 2, \"layers_block_type\": [\"mamba\", \"conv\"]" NEMO_MIXER "}",
        KVC_EINVAL, "layers_block_type: 'conv' is not mamba, attention, mlp or moe");
    /* Mamba-2 without num_heads; Qwen3-Next without a linear-attention width, and with a layer
     * list the interval does not give */
    expect_config_refused(
        "{\"model_type\": \"mamba2\", \"hidden_size\": 64, \"num_hidden_layers\": 2,"
        " \"vocab_size\": 100, \"head_dim\": 16, \"state_size\": 8, \"n_groups\": 1,"
        " \"conv_kernel\": 4}",
        KVC_EINVAL, "num_heads is missing");
#define NEXT_HEAD                                                                                \
    "{\"model_type\": \"qwen3_next\", \"hidden_size\": 64, \"num_hidden_layers\": 4,"            \
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16, \"vocab_size\":" \
    " 100, \"intermediate_size\": 128, \"linear_num_key_heads\": 2, \"linear_num_value_heads\":" \
    " 4, \"linear_value_head_dim\": 16, \"linear_conv_kernel_dim\": 4"
    expect_config_refused(NEXT_HEAD ", \"full_attention_interval\": 4}", KVC_EINVAL,
                          "linear_key_head_dim is missing");
    expect_config_refused(NEXT_HEAD ", \"linear_key_head_dim\": 8}", KVC_EINVAL,
                          "full_attention_interval is missing");
    expect_config_refused(NEXT_HEAD ", \"linear_key_head_dim\": 8, \"full_attention_interval\": 2,"
                                    " \"layer_types\": [\"linear_attention\", \"full_attention\","
                                    " \"full_attention\", \"full_attention\"]}",
                          KVC_EINVAL, "layer_types: layer 2 is not linear_attention");
    /* the periodic list is read: layers 1 and 3 attend */
    const char *next =
        NEXT_HEAD ", \"linear_key_head_dim\": 8, \"layer_types\": [\"linear_attention\","
                  " \"full_attention\", \"linear_attention\", \"full_attention\"]}";
    assert_ok(kvc_plan_model_from_json(next, strlen(next), "n", &m, msg, sizeof msg));
    assert_int_equal(m.attn_layer_period, 2);
    assert_int_equal(m.n_recurrent_layers, 2);

    /* the model check on a hand-built pattern says the same */
    assert_ok(kvc_plan_model_from_json(ok, strlen(ok), "ok", &m, msg, sizeof msg));
    kvc_plan_model_t bad = m;
    bad.layer_pattern[1] = '?';
    assert_int_equal(kvc_plan_model_check(&bad, msg, sizeof msg), KVC_EINVAL);
    assert_non_null(strstr(msg, "layer 1 is '?'"));
    bad = m;
    bad.layer_pattern[3] = 0;
    assert_int_equal(kvc_plan_model_check(&bad, msg, sizeof msg), KVC_EINVAL);
    assert_non_null(strstr(msg, "has 3 layers but num_hidden_layers is 4"));
    bad = m;
    bad.ssm_n_groups = 3;
    assert_int_equal(kvc_plan_model_check(&bad, msg, sizeof msg), KVC_EINVAL);
    assert_non_null(strstr(msg, "n_groups 3 does not divide the 4 SSM heads"));
    bad = m;
    bad.ssm_d_inner = 100;
    assert_int_equal(kvc_plan_model_check(&bad, msg, sizeof msg), KVC_EINVAL);
    assert_non_null(strstr(msg, "d_inner 100 is not 4 heads x head_dim 16"));
    bad = m;
    bad.recurrent = KVC_PLAN_RECURRENT__COUNT;
    assert_int_equal(kvc_plan_model_check(&bad, msg, sizeof msg), KVC_EINVAL);
    bad = m;
    bad.attn_layer_period = 2;
    assert_int_equal(kvc_plan_model_check(&bad, msg, sizeof msg), KVC_EINVAL);
    assert_non_null(strstr(msg, "a layer pattern with attn_layer_period"));
#undef NEMO_HEAD
#undef NEMO_MIXER
#undef NEXT_HEAD
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(dtypes_have_names_bits_and_aliases),
        cmocka_unit_test(sizes_distinguish_gb_from_gib),
        cmocka_unit_test(presets_are_found_case_insensitively),
        cmocka_unit_test(kv_bytes_per_token_is_2_layers_heads_dim_bytes),
        cmocka_unit_test(mla_caches_one_latent_without_the_factor_2),
        cmocka_unit_test(tp_splits_kv_heads_then_replicates_them),
        cmocka_unit_test(impossible_parallelism_is_one_clear_error),
        cmocka_unit_test(params_are_counted_by_part),
        cmocka_unit_test(weight_bytes_follow_the_dtype_and_the_tp_shard),
        cmocka_unit_test(ledger_runs_in_engine_order_and_leaves_the_pool),
        cmocka_unit_test(graphs_outside_the_budget_do_not_shrink_the_pool),
        cmocka_unit_test(each_startup_phase_can_be_the_one_that_fails),
        cmocka_unit_test(a_refusal_says_what_would_start),
        cmocka_unit_test(concurrency_is_the_pool_over_a_block_rounded_request),
        cmocka_unit_test(compute_ridge_counts_weights_and_kv_reads),
        cmocka_unit_test(window_freeing_saves_by_the_share_of_windowed_layers),
        cmocka_unit_test(prefill_counts_causal_pairs_once),
        cmocka_unit_test(forks_share_prompt_blocks_and_beam_history),
        cmocka_unit_test(prefill_kv_rate_cancels_the_prompt_length),
        cmocka_unit_test(fetch_beats_recompute_above_the_break_even_bandwidth),
        cmocka_unit_test(littles_law_solves_the_fixed_point),
        cmocka_unit_test(drafts_take_budget_and_turn_the_step_compute_bound),
        cmocka_unit_test(tenancy_prices_requests_in_pool_share),
        cmocka_unit_test(embedding_is_not_read_per_decode_step),
        cmocka_unit_test(speculation_loses_only_when_its_tokens_cost_more_than_they_save),
        cmocka_unit_test(recompute_pays_the_prefix_attention),
        cmocka_unit_test(vllm_batch_defaults_follow_the_gpu),
        cmocka_unit_test(prefill_only_requests_and_long_tenants_are_priced),
        cmocka_unit_test(texts_say_what_is_true),
        cmocka_unit_test(mla_intensity_and_dp_attention_against_tp),
        cmocka_unit_test(small_copies_lose_and_short_recomputes_ride_free),
        cmocka_unit_test(lora_adapters_take_from_the_kv_pool),
        cmocka_unit_test(the_dtype_grid_replans_every_pair),
        cmocka_unit_test(a_million_tokens_on_eight_h100s),
        cmocka_unit_test(multimodal_phases_peak_and_the_encoder_cache),
        cmocka_unit_test(cp_decode_exchanges_partial_softmax_results),
        cmocka_unit_test(hybrid_configs_are_read_or_refused_and_vision_towers_counted),
        cmocka_unit_test(recurrent_configs_name_what_is_wrong),
        cmocka_unit_test(quantized_kv_and_weights_price_their_scales),
        cmocka_unit_test(config_reads_what_the_math_needs),
        cmocka_unit_test(config_errors_name_the_field),
        cmocka_unit_test(config_reads_moe_mla_windows_and_images),
        cmocka_unit_test(config_files_are_read_or_refused_cleanly),
        cmocka_unit_test(json_has_every_required_key),
        cmocka_unit_test(json_rendering_fails_whole_under_oom),
        cmocka_unit_test(text_has_twelve_sections_and_names_the_refusal),
        cmocka_unit_test(random_deployments_keep_the_invariants),
        cmocka_unit_test(mangled_configs_never_crash_the_reader),
        cmocka_unit_test(model_fields_are_bounded_by_real_models),
        cmocka_unit_test(derived_counts_are_bounded_too),
        cmocka_unit_test(config_bounds_name_the_key_as_written),
        cmocka_unit_test(sim_refuses_what_the_planner_refuses),
        cmocka_unit_test(byte_overrides_and_deployment_sizes_are_bounded),
        cmocka_unit_test(units_refuse_what_overflows),
        cmocka_unit_test(config_text_is_one_json_object_and_nothing_else),
        cmocka_unit_test(reports_and_messages_escape_control_bytes),
        cmocka_unit_test(extreme_inputs_plan_exactly_or_are_refused),
        cmocka_unit_test(null_arguments_are_errors),
        cmocka_unit_test(deployment_totals_do_not_wrap_in_the_text),
    };
    return cmocka_run_group_tests_name("plan", tests, NULL, NULL);
}
