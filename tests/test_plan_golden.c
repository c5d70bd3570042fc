/* test_plan_golden.c - the planner on the real configs in tests/data/configs,
 * against numbers derived by hand in the comments (and, where an engine
 * published its own, against that).  Each built-in preset must also equal
 * what its config says, and each GPU preset its sources. */
#include "test_helpers.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GIB (UINT64_C(1) << 30)
#define MIB (UINT64_C(1) << 20)

static void load(const char *file, kvc_plan_model_t *m)
{
    char path[512], msg[256] = "";
    snprintf(path, sizeof path, "%s/configs/%s", KVC_DATA_DIR, file);
    int rc = kvc_plan_model_load(path, m, msg, sizeof msg);
    if (rc) fail_msg("%s: %s", path, msg);
}

static kvc_plan_gpu_t gpu(const char *name)
{
    kvc_plan_gpu_t g;
    assert_ok(kvc_plan_gpu_preset(name, &g));
    return g;
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

static kvc_plan_result_t *plan(const kvc_plan_model_t *m, const kvc_plan_gpu_t *g,
                               const kvc_plan_params_t *p)
{
    kvc_plan_result_t *r = malloc(sizeof *r);
    assert_non_null(r);
    char msg[256] = "";
    int rc = kvc_plan_compute(m, g, p, r, msg, sizeof msg);
    if (rc) fail_msg("kvc_plan_compute: %s", msg);
    return r;
}

/* The preset of the same name must say what the config says, field by field. */
static void preset_matches_config(const char *preset, const kvc_plan_model_t *cfg)
{
    kvc_plan_model_t m;
    assert_ok(kvc_plan_model_preset(preset, &m));
    assert_string_equal(m.model_type, cfg->model_type);
#define SAME(f)                                                                             \
    if (m.f != cfg->f)                                                                      \
    fail_msg("%s: preset %s = %llu, config says %llu", preset, #f, (unsigned long long)m.f, \
             (unsigned long long)cfg->f)
    SAME(hidden_size);
    SAME(n_layers);
    SAME(n_heads);
    SAME(n_kv_heads);
    SAME(head_dim);
    SAME(v_head_dim);
    SAME(vocab_size);
    SAME(intermediate_size);
    SAME(tie_embeddings);
    SAME(qkv_bias);
    SAME(n_experts);
    SAME(n_experts_active);
    SAME(moe_intermediate_size);
    SAME(n_shared_experts);
    SAME(shared_expert_intermediate_size);
    SAME(n_dense_layers);
    SAME(mla);
    SAME(q_lora_rank);
    SAME(kv_lora_rank);
    SAME(qk_rope_head_dim);
    SAME(qk_nope_head_dim);
    SAME(sliding_window);
    SAME(n_sliding_layers);
    SAME(chunked_attention);
    SAME(image_tokens);
    SAME(max_position_embeddings);
#undef SAME
}

static void llama_3_1_8b(void **state)
{
    (void)state;
    kvc_plan_model_t m;
    load("llama-3.1-8b.json", &m);
    preset_matches_config("llama-3.1-8b", &m);
    assert_string_equal(m.name, "llama-3.1-8b.json");
    assert_int_equal(m.head_dim, 128); /* explicit in this config */
    kvc_plan_param_count_t c;
    kvc_plan_model_params(&m, &c);
    /* per layer: q 4096^2 = 16,777,216; k, v 2 x 4096 x 1024 = 8,388,608; o 16,777,216;
     * MLP 3 x 4096 x 14336 = 176,160,768; norms 8,192: 218,112,000 x 32 = 6,979,584,000;
     * embedding and LM head 2 x 128,256 x 4096 = 1,050,673,152; final norm 4,096 */
    assert_int_equal(c.total, UINT64_C(8030261248));
    assert_int_equal(c.active, c.total);

    kvc_plan_gpu_t h100 = gpu("h100-sxm");
    kvc_plan_params_t p = defaults();
    kvc_plan_result_t *r = plan(&m, &h100, &p);
    /* 2 x 32 x 8 x 128 x 2 B = 131,072 B = 128 KiB */
    assert_int_equal(r->kv_bytes_per_token, 131072);
    /* weights 8,030,261,248 x 2 B = 16,060,522,496 B = 14.96 GiB: vLLM logs "model weights take
     * 14.96GiB" for Meta-Llama-3-8B on an H100 (vllm-project/vllm pull 10511) */
    assert_int_equal(r->weight_bytes_per_gpu, UINT64_C(16060522496));
    /* budget floor(85,061,827,297 x 0.9) = 76,555,644,567
     * activation: sampler 256 x 128,256 x 40 = 1,313,341,440 > forward 8,192 x 69,632 x 2
     * graphs: 35 x 32 x 512 KiB + 256 x 69,632 x 2 = 587,202,560 + 35,651,584 = 622,854,144
     * non-torch 256 MiB = 268,435,456
     * pool = 76,555,644,567 - 16,060,522,496 - 1,313,341,440 - 622,854,144 - 268,435,456
     *      = 58,290,491,031 B (54.29 GiB); blocks floor(/ (16 x 131,072)) = 27,795 */
    assert_int_equal(r->budget_bytes, UINT64_C(76555644567));
    assert_int_equal(r->activation_bytes, UINT64_C(1313341440));
    assert_int_equal(r->cuda_graph_bytes, UINT64_C(622854144));
    assert_int_equal(r->kv_pool_bytes_per_gpu, UINT64_C(58290491031));
    assert_int_equal(r->num_blocks, 27795);
    /* 1,200 tokens: 75 blocks x 16 x 128 KiB = 150 MiB; floor(58,290,491,031 / 157,286,400) */
    assert_int_equal(r->kv_bytes_per_request, 150 * MIB);
    assert_int_equal(r->max_concurrency, 370);
    assert_true(r->fits);
    free(r);
    /* TP 2: 6,979,321,856 / 2 projections + vocab shards 2 x 262,668,288 + norms 266,240,
     * x 2 B = 8,030,527,488 B = 7.48 GiB (vLLM logs "7.48GiB" at -tp 2) */
    p.tp = 2;
    r = plan(&m, &h100, &p);
    assert_int_equal(r->weight_bytes_per_gpu, UINT64_C(8030527488));
    assert_int_equal(r->kv_bytes_per_token_per_gpu, 65536);
    free(r);
}

static void llama_3_1_70b(void **state)
{
    (void)state;
    kvc_plan_model_t m;
    load("llama-3.1-70b.json", &m);
    preset_matches_config("llama-3.1-70b", &m);
    assert_int_equal(m.head_dim, 128); /* derived: 8192 / 64 */
    kvc_plan_param_count_t c;
    kvc_plan_model_params(&m, &c);
    /* per layer: q 67,108,864 + k,v 16,777,216 + o 67,108,864 + MLP 3 x 8192 x 28672
     * 704,643,072 + norms 16,384 = 855,654,400; x 80 = 68,452,352,000; + 2 x 128,256 x 8192
     * 2,101,346,304 + 8,192 = 70,553,706,496 */
    assert_int_equal(c.total, UINT64_C(70553706496));

    kvc_plan_gpu_t h100 = gpu("h100-sxm");
    kvc_plan_params_t p = defaults();
    p.tp = 8;
    kvc_plan_result_t *r8 = plan(&m, &h100, &p);
    p.tp = 16;
    kvc_plan_result_t *r16 = plan(&m, &h100, &p);
    /* 2 x 80 layers x 8 KV heads x 128 x 2 B = 327,680 B; 1,048,576 tokens: 320 GiB */
    assert_int_equal(r8->kv_bytes_per_token, 327680);
    assert_int_equal(r8->kv_bytes_per_token * 1048576, 320 * GIB);
    /* TP 8: one KV head per GPU, 40,960 B; TP 16: still one head per GPU (each on 2 GPUs):
     * the same 40,960 B, while the weights per GPU nearly halve */
    assert_int_equal(r8->kv_bytes_per_token_per_gpu, 40960);
    assert_int_equal(r16->kv_bytes_per_token_per_gpu, 40960);
    assert_int_equal(r8->kv_head_replication, 1);
    assert_int_equal(r16->kv_head_replication, 2);
    assert_int_equal(r16->kv_replicated_bytes_per_token, 16 * 40960 - 327680);
    assert_true(r16->weight_bytes_per_gpu * 1.9 < r8->weight_bytes_per_gpu);
    free(r8);
    free(r16);

    /* The refusal: bf16 on two H100s with TP 2.
     * weights per GPU: 80 x 427,819,008 projection params + 1,051,992,064 16-bit params
     *   (vocab shards and norms), x 2 B = 70,555,025,408 B = 65.71 GiB
     * activation: forward 8,192 x 84,992 values x 2 B = 1,392,508,928
     *   (84,992 = 4 x 8192 + q 4096 + k,v 1024 + out 4096 + MLP 3 x 14,336)
     * graphs: 35 x 80 x 512 KiB + 256 x 84,992 x 2 = 1,511,522,304
     * non-torch: 256 MiB + 512 MiB for TP = 805,306,368
     * pool = 76,555,644,567 - 70,555,025,408 - 1,392,508,928 - 1,511,522,304 - 805,306,368
     *      = 2,291,281,559 B (2.13 GiB) = 874 blocks of 16 x 163,840 B = 13,984 tokens
     * one max_model_len request: 131,072 x 163,840 B = 21,474,836,480 B = 20 GiB > 2.13 GiB:
     * the engine refuses at check_max_model_len */
    p.tp = 2;
    kvc_plan_result_t *r = plan(&m, &h100, &p);
    assert_int_equal(r->weight_bytes_per_gpu, UINT64_C(70555025408));
    assert_int_equal(r->activation_bytes, UINT64_C(1392508928));
    assert_int_equal(r->cuda_graph_bytes, UINT64_C(1511522304));
    assert_int_equal(r->non_torch_bytes, UINT64_C(805306368));
    assert_int_equal(r->kv_pool_bytes_per_gpu, UINT64_C(2291281559));
    assert_int_equal(r->num_blocks, 874);
    assert_false(r->fits);
    assert_int_equal(r->failed_phase, KVC_PLAN_PHASE_CHECK_MAX_LEN);
    assert_string_equal(kvc_plan_phase_name((kvc_plan_phase_id_t)r->failed_phase),
                        "check_max_model_len");
    assert_int_equal(r->phases[KVC_PLAN_PHASE_CHECK_MAX_LEN].need_bytes, 20 * GIB);
    assert_int_equal(r->phases[KVC_PLAN_PHASE_CHECK_MAX_LEN].have_bytes, UINT64_C(2291281559));
    assert_int_equal(r->max_model_len_that_fits, 13984);
    assert_int_equal(r->phases[KVC_PLAN_PHASE_LOAD_WEIGHTS].status, KVC_PLAN_PHASE_OK);
    free(r);
    /* ...and fp8 weights start: 32.9 GiB + 0.5 GiB of 16-bit tables leave ~35 GiB of pool */
    p.weight_dtype = KVC_PLAN_FP8;
    r = plan(&m, &h100, &p);
    assert_true(r->fits);
    free(r);
}

static void mistral_7b_slides_every_layer(void **state)
{
    (void)state;
    kvc_plan_model_t m;
    load("mistral-7b-v0.1.json", &m);
    preset_matches_config("mistral-7b-v0.1", &m);
    assert_int_equal(m.sliding_window, 4096);
    assert_int_equal(m.n_sliding_layers, 32);
    kvc_plan_param_count_t c;
    kvc_plan_model_params(&m, &c);
    /* 32 x 218,112,000 + 2 x 32,000 x 4096 + 4096 = 7,241,732,096 */
    assert_int_equal(c.total, UINT64_C(7241732096));
    kvc_plan_gpu_t l40s = gpu("l40s");
    kvc_plan_params_t p = defaults();
    p.context_tokens = 32768;
    kvc_plan_result_t *r = plan(&m, &l40s, &p);
    assert_int_equal(r->kv_bytes_per_token, 131072);
    /* at 32,768 tokens: without freeing 32 layers x 2,048 blocks x 16 x 4,096 B = 4 GiB; with
     * freeing each layer keeps blocks 1,792..2,047 (the last 4,096 tokens): 256 blocks, 512 MiB;
     * saving 7/8, and toward 100% as the context grows: every layer slides */
    assert_int_equal(r->swa_bytes_without_freeing, 4 * GIB);
    assert_int_equal(r->swa_bytes_with_freeing, 512 * MIB);
    assert_true(fabs(r->sliding_window_saving - 0.875) < 1e-12);
    assert_true(r->sliding_window_saving_limit == 1.0);
    free(r);
}

static void mixtral_8x7b_counts_active_experts(void **state)
{
    (void)state;
    kvc_plan_model_t m;
    load("mixtral-8x7b.json", &m);
    preset_matches_config("mixtral-8x7b", &m);
    assert_int_equal(m.sliding_window, 0); /* "sliding_window": null */
    kvc_plan_param_count_t c;
    kvc_plan_model_params(&m, &c);
    /* per layer: attention 41,943,040 + 8 experts x 176,160,768 + router 32,768 + norms 8,192
     * = 1,451,270,144; x 32 + 262,144,000 + 4,096 = 46,702,792,704 (46.7B);
     * active: 41,943,040 + 2 experts 352,321,536 + 32,768 + 8,192 = 394,305,536 per layer,
     * x 32 + 262,148,096 = 12,879,925,248 (12.9B) */
    assert_int_equal(c.total, UINT64_C(46702792704));
    assert_int_equal(c.active, UINT64_C(12879925248));
    kvc_plan_gpu_t a100 = gpu("a100-80gb-sxm");
    kvc_plan_params_t p = defaults();
    p.tp = 2;
    kvc_plan_result_t *r = plan(&m, &a100, &p);
    assert_int_equal(r->kv_bytes_per_token, 131072);
    assert_int_equal(r->kv_bytes_per_token_per_gpu, 65536);
    /* 93.4 GB of weights over 2 GPUs: 43.5 GiB each, and it starts */
    assert_true(r->fits);
    assert_false(r->fp8_compute); /* A100: bf16 tensor cores only */
    free(r);
}

static void qwen2_5_72b_has_qkv_biases(void **state)
{
    (void)state;
    kvc_plan_model_t m;
    load("qwen2.5-72b.json", &m);
    preset_matches_config("qwen2.5-72b", &m);
    assert_true(m.qkv_bias);
    kvc_plan_param_count_t c;
    kvc_plan_model_params(&m, &c);
    /* per layer: q, k, v, o 150,994,944 + biases 8,192 + 2 x 1,024 + MLP 3 x 8192 x 29,568
     * 726,663,168 + norms 16,384 = 877,684,736; x 80 = 70,214,778,880;
     * + 2 x 152,064 x 8,192 = 2,491,416,576 + 8,192 = 72,706,203,648 (72.7B) */
    assert_int_equal(c.total, UINT64_C(72706203648));
    kvc_plan_gpu_t h200 = gpu("h200");
    kvc_plan_params_t p = defaults();
    p.tp = 2;
    kvc_plan_result_t *r = plan(&m, &h200, &p);
    assert_int_equal(r->kv_bytes_per_token, 327680);
    assert_true(r->fits);
    free(r);
}

static void gemma_2_27b_alternates_windows(void **state)
{
    (void)state;
    kvc_plan_model_t m;
    load("gemma-2-27b.json", &m);
    preset_matches_config("gemma-2-27b", &m);
    /* head_dim 128 from the config, not 4608 / 32 = 144 */
    assert_int_equal(m.head_dim, 128);
    assert_true(m.tie_embeddings);
    /* Gemma 2 alternates: 23 of 46 layers slide over 4,096 tokens */
    assert_int_equal(m.n_sliding_layers, 23);
    kvc_plan_param_count_t c;
    kvc_plan_model_params(&m, &c);
    /* per layer: q 4608 x 4096 = 18,874,368; k, v 2 x 4608 x 2048 = 18,874,368; o 18,874,368;
     * MLP 3 x 4608 x 36,864 = 509,607,936; norms 9,216: 566,240,256 x 46 = 26,047,051,776;
     * one tied table 256,000 x 4,608 = 1,179,648,000; + 4,608 = 27,226,704,384 (27.2B) */
    assert_int_equal(c.total, UINT64_C(27226704384));
    kvc_plan_gpu_t h100 = gpu("h100-sxm");
    kvc_plan_params_t p = defaults();
    p.context_tokens = 8192;
    kvc_plan_result_t *r = plan(&m, &h100, &p);
    /* 2 x 46 x 16 x 128 x 2 B = 376,832 B */
    assert_int_equal(r->kv_bytes_per_token, 376832);
    /* at 8,192 tokens, windowed layers keep 256 of 512 blocks: 1 - (23 x 512 + 23 x 256) /
     * (46 x 512) = 25%; the limit is 23/46 = 50%, whatever the window */
    assert_true(fabs(r->sliding_window_saving - 0.25) < 1e-12);
    assert_true(fabs(r->sliding_window_saving_limit - 0.5) < 1e-12);
    /* TP sweep: 16 KV heads split up to TP 16, then copies (32 query heads stop it at 32) */
    assert_int_equal(r->tp_rows[r->n_tp_rows - 1].tp, 32);
    assert_int_equal(r->tp_rows[r->n_tp_rows - 1].replication, 2);
    free(r);
}

static void deepseek_v3_mla_under_tp8(void **state)
{
    (void)state;
    kvc_plan_model_t m;
    load("deepseek-v3.json", &m);
    preset_matches_config("deepseek-v3", &m);
    assert_true(m.mla);
    kvc_plan_param_count_t c;
    kvc_plan_model_params(&m, &c);
    /* attention per layer: q_a 7168 x 1536 + norm 1536 + q_b 1536 x 128 x 192 + kv_a 7168 x 576
     *   + norm 512 + kv_b 512 x 128 x 256 + o 128 x 128 x 7168 = 187,107,328; x 61
     * dense MLP 3 layers x 3 x 7168 x 18,432; MoE 58 layers x (256 x 3 x 7168 x 2048 routed
     *   + 3 x 7168 x 2048 shared + 7168 x 256 router) = 58 x 11,320,164,352
     * + tables 2 x 129,280 x 7168 + norms 61 x 14,336 + 7168:  671,026,404,352 (671B);
     * active keeps 8 of 256 routed experts: minus 58 x 248 x 44,040,192 = 37,552,282,624 */
    assert_int_equal(c.total, UINT64_C(671026404352));
    assert_int_equal(c.active, UINT64_C(37552282624));

    kvc_plan_gpu_t h200 = gpu("h200");
    kvc_plan_params_t p = defaults();
    p.tp = 8;
    p.weight_dtype = KVC_PLAN_FP8;
    kvc_plan_result_t *r = plan(&m, &h200, &p);
    /* (512 + 64) x 61 x 2 B = 70,272 B per token, one latent, no factor 2; every GPU of TP 8
     * holds all of it: 8 copies, 7 x 70,272 = 491,904 B per token are copies */
    assert_int_equal(r->kv_bytes_per_token, 70272);
    assert_int_equal(r->kv_bytes_per_token_per_gpu, 70272);
    assert_int_equal(r->kv_head_replication, 8);
    assert_int_equal(r->kv_replicated_bytes_per_token, 491904);
    /* fp8 weights per GPU: projections 61 x 36,634,624 (q_a, kv_a replicated) + 3 x 49,545,216
     * + 58 x 1,414,791,168 = 84,441,235,456 x 1 B; 16-bit: norms 61 x 16,384, routers
     * 58 x 1,835,008, vocab shards 2 x 16,160 x 7168, final 7,168 = 339,106,816 x 2 B:
     * 85,119,449,088 B = 79.27 GiB */
    assert_int_equal(r->weight_linear_params_per_gpu, UINT64_C(84441235456));
    assert_int_equal(r->weight_wide_params_per_gpu, UINT64_C(339106816));
    assert_int_equal(r->weight_bytes_per_gpu, UINT64_C(85119449088));
    assert_true(r->fits);
    assert_true(r->fp8_compute);
    /* A sequence at the mean decode context (1,100) reads 1,100 x 70,272 B = 77.3 MB of latent
     * per step for 1.33e10 FLOP: below the 412 FLOP/B ridge, decode never turns compute-bound
     * on TP 8 (the replicated latent is read on every GPU) */
    assert_int_equal(r->ceilings[KVC_PLAN_CEIL_COMPUTE], KVC_PLAN_UNBOUNDED);
    free(r);
    /* fp8 KV halves the latent: 35,136 B */
    p.kv_dtype = KVC_PLAN_FP8;
    r = plan(&m, &h200, &p);
    assert_int_equal(r->kv_bytes_per_token, 35136);
    free(r);
    /* bf16 weights (1.22 TiB) do not load on 8 H200s: 156.7 GiB per GPU */
    p.kv_dtype = KVC_PLAN_BF16;
    p.weight_dtype = KVC_PLAN_BF16;
    r = plan(&m, &h200, &p);
    assert_int_equal(r->failed_phase, KVC_PLAN_PHASE_LOAD_WEIGHTS);
    free(r);
}

static void gpu_presets_match_their_sources(void **state)
{
    (void)state;
    const struct {
        const char *name;
        uint64_t mem;
        double bw, bf16, fp8;
        uint64_t l2;
        double link, pcie;
    } want[] = {
        /* runtime totals in hundredths of a GiB; datasheet rates, dense; links per direction */
        {"a100-80gb-sxm", 7915 * GIB / 100, 2039e9, 312e12, 0, 40 * MIB, 300e9, 32e9},
        {"h100-sxm", 7922 * GIB / 100, 3.35e12, 989.5e12, 1979e12, 50 * MIB, 450e9, 64e9},
        {"h100-pcie", 7922 * GIB / 100, 2.0e12, 756e12, 1513e12, 50 * MIB, 300e9, 64e9},
        {"h200", 13980 * GIB / 100, 4.8e12, 989.5e12, 1979e12, 50 * MIB, 450e9, 64e9},
        {"b200", 17835 * GIB / 100, 7.7e12, 2250e12, 4500e12, 126 * MIB, 900e9, 64e9},
        {"l40s", 4440 * GIB / 100, 864e9, 362.05e12, 733e12, 96 * MIB, 0, 32e9},
        {"mi300x", UINT64_C(201310208) * 1024, 5.3e12, 1307.4e12, 2614.9e12, 32 * MIB, 448e9, 64e9},
    };
    for (size_t i = 0; i < KVC_ARRAY_LEN(want); i++) {
        kvc_plan_gpu_t g = gpu(want[i].name);
        assert_int_equal(g.memory_bytes, want[i].mem);
        assert_true(g.hbm_bytes_per_s == want[i].bw);
        assert_true(g.bf16_flops == want[i].bf16);
        assert_true(g.fp8_flops == want[i].fp8);
        assert_int_equal(g.l2_bytes, want[i].l2);
        assert_true(g.interconnect_bytes_per_s == want[i].link);
        assert_true(g.pcie_bytes_per_s == want[i].pcie);
    }
}

/* ai21labs/AI21-Jamba-1.5-Mini's config.json (tests/data/PROVENANCE.md): hidden_size 4096, 32
 * layers, attn_layer_period 8 / attn_layer_offset 4 (layers 4, 12, 20, 28 attend: 4 attention
 * layers, 28 Mamba), expert_layer_period 2 / offset 1 (16 MoE layers of num_experts 16,
 * num_experts_per_tok 2, intermediate_size 14336; 16 dense MLPs), mamba_expand 2 (d_inner
 * 8,192), mamba_d_state 16, mamba_d_conv 4, mamba_dt_rank 256, mamba_conv_bias true,
 * mamba_proj_bias false, num_key_value_heads 8, vocab_size 65536, untied. */
static void jamba_is_modelled_as_a_hybrid(void **state)
{
    (void)state;
    kvc_plan_model_t m;
    load("jamba-1.5-mini.json", &m);
    assert_int_equal(m.recurrent, KVC_PLAN_RECURRENT_MAMBA1);
    assert_int_equal(m.n_recurrent_layers, 28);
    assert_int_equal(m.n_dense_layers, 16);
    assert_int_equal(m.ssm_d_inner, 8192);
    kvc_plan_param_count_t c;
    kvc_plan_model_params(&m, &c);
    /* attention: q 4096^2 + k, v 2 x 4096 x 1024 + o 4096^2 = 41,943,040, x 4 = 167,772,160 */
    assert_int_equal(c.attention, UINT64_C(167772160));
    /* a Mamba mixer: in_proj 4096 x 2 x 8192 = 67,108,864; x_proj 8192 x (256 + 2 x 16) =
     * 2,359,296; dt_proj 256 x 8192 = 2,097,152; out_proj 8192 x 4096 = 33,554,432 (105,119,744
     * in projections); conv 8192 x 4 + bias 8192, dt bias 8192, A_log 8192 x 16 = 131,072, D
     * 8192, dt/B/C norms 256 + 32 (188,704): 105,308,448, x 28 = 2,948,636,544 */
    assert_int_equal(c.recurrent, UINT64_C(2948636544));
    /* 16 x 16 experts x 3 x 4096 x 14336 = 45,097,156,608; 16 dense MLPs 2,818,572,288; router
     * 16 x 4096 x 16 = 1,048,576; norms 32 x 2 x 4096 + 4096 = 266,240; embedding and LM head
     * 2 x 65,536 x 4096 = 536,870,912: 51,570,323,328 (about 52 billion, not the 92 it was
     * sized as all-attention with MoE everywhere); active: 14 of 16 experts skipped on 16
     * layers, 16 x 14 x 176,160,768 = 39,460,012,032 less: 12,110,311,296 (about 12 billion) */
    assert_int_equal(c.experts_routed, UINT64_C(45097156608));
    assert_int_equal(c.mlp_dense, UINT64_C(2818572288));
    assert_int_equal(c.total, UINT64_C(51570323328));
    assert_int_equal(c.active, UINT64_C(12110311296));

    kvc_plan_gpu_t h100 = gpu("h100-sxm");
    kvc_plan_params_t p = defaults();
    p.weight_dtype = KVC_PLAN_FP8;
    p.kv_cache_bytes = 16 * GIB; /* an explicit pool, so the arithmetic below is exact */
    kvc_plan_result_t *r = plan(&m, &h100, &p);
    /* KV: 2 x 4 attention layers x 8 x 128 x 2 B = 16,384 B per token; all 32 attending would
     * be 131,072 */
    assert_int_equal(r->kv_bytes_per_token, 16384);
    assert_int_equal(r->all_attention_kv_bytes_per_token, 131072);
    assert_int_equal(r->kv_layers_per_gpu, 4);
    /* state per layer: conv (4 - 1) x 8192 x 2 B = 49,152; SSM 8192 x 16 x 2 B = 262,144;
     * x 28 = 8,716,288 B (8.31 MiB) per sequence whatever its length = 532 tokens of KV */
    assert_int_equal(r->conv_state_bytes_per_layer, 49152);
    assert_int_equal(r->ssm_state_bytes_per_layer, 262144);
    assert_int_equal(r->state_bytes_per_seq, 8716288);
    assert_int_equal(r->state_bytes_per_seq_per_gpu, 8716288);
    assert_int_equal(r->state_kv_tokens, 532);
    /* a 1,200-token request: 75 blocks x 16 x 16,384 = 19,660,800 of KV + the state =
     * 28,377,088; 16 GiB / that = 605 sequences (1,971 if KV took nothing) */
    assert_int_equal(r->request_kv_bytes, 19660800);
    assert_int_equal(r->kv_bytes_per_request, 28377088);
    assert_int_equal(r->max_concurrency, 605);
    assert_int_equal(r->state_only_sequences, 1971);
    /* a decode step at context 1,100 reads 4,096 B x 4 layers x 1,100 of KV and reads and
     * writes the state: 18,022,400 + 2 x 8,716,288 = 35,454,976 B per sequence */
    assert_true(r->decode_bytes_per_seq == 35454976.0);
    /* attention's FLOP per KV byte leaves the state out: 2 x 4 query heads per KV head / 2 B */
    assert_true(r->attention_flops_per_kv_byte == 4.0);
    /* a cached 1,000-token prompt: 62 full blocks (992 tokens) x 16,384 = 16,252,928 of KV and
     * floor(1,000 / 512) = 1 checkpoint: 24,969,216; 100 of them 2,496,921,600; the pool holds
     * 16 GiB / 24,969,216 = 688 */
    assert_int_equal(r->checkpoint_interval, 512);
    assert_int_equal(r->checkpoints_per_prefix, 1);
    assert_int_equal(r->prefix_bytes_per_gpu, 24969216);
    assert_int_equal(r->cached_prefixes_bytes_per_gpu, UINT64_C(2496921600));
    assert_int_equal(r->prefixes_in_pool, 688);
    /* every layer resumes at lcm(16, 512) = 512: 256 tokens recomputed on average; the whole
     * prompt cached resumes at floor(999 / 512) x 512 = 512 and recomputes 488 */
    assert_int_equal(r->restart_boundary_tokens, 512);
    assert_true(r->mean_recomputed_tokens == 256.0);
    assert_int_equal(r->prompt_resume_tokens, 512);
    assert_int_equal(r->prompt_recomputed_tokens, 488);
    free(r);

    /* a checkpoint every 100 tokens: lcm(16, 100) = 400 (gcd 4), 200 on average; the prompt
     * resumes at 800 and recomputes 200; 10 checkpoints: 16,252,928 + 10 x 8,716,288 =
     * 103,415,808 (24,969,216 keeping only the last) */
    p.state_checkpoint_interval = 100;
    r = plan(&m, &h100, &p);
    assert_int_equal(r->restart_boundary_tokens, 400);
    assert_int_equal(r->prompt_resume_tokens, 800);
    assert_int_equal(r->prompt_recomputed_tokens, 200);
    assert_int_equal(r->checkpoints_per_prefix, 10);
    assert_int_equal(r->prefix_bytes_per_gpu, 103415808);
    assert_int_equal(r->prefix_bytes_last_checkpoint_per_gpu, 24969216);
    free(r);

    /* TP 2 splits the inner channels: 4,358,144 B of state and 8,192 B of KV per token per GPU;
     * an fp32 SSM state (8192 / 2 x 16 x 4 B = 262,144 per layer, conv 24,576): 28 x 286,720 =
     * 8,028,160 */
    p.state_checkpoint_interval = 0;
    p.tp = 2;
    r = plan(&m, &h100, &p);
    assert_int_equal(r->state_bytes_per_seq_per_gpu, 4358144);
    assert_int_equal(r->kv_bytes_per_token_per_gpu, 8192);
    free(r);
    p.ssm_state_fp32 = true;
    r = plan(&m, &h100, &p);
    assert_int_equal(r->state_bytes_per_seq_per_gpu, 8028160);
    assert_int_equal(r->ssm_state_bytes_per_layer, 524288);
    free(r);
    /* ring attention does not split a recurrent state: refused, naming it */
    p.cp = 2;
    r = malloc(sizeof *r);
    char msg[256] = "";
    assert_int_equal(kvc_plan_compute(&m, &h100, &p, r, msg, sizeof msg), KVC_EINVAL);
    assert_non_null(strstr(msg, "recurrent"));
    /* verifying drafts needs a state per draft position: refused, naming it */
    p.cp = 1;
    p.spec_tokens = 4;
    assert_int_equal(kvc_plan_compute(&m, &h100, &p, r, msg, sizeof msg), KVC_EINVAL);
    assert_non_null(strstr(msg, "--spec-tokens 4: speculative decoding on recurrent layers"));
    free(r);
}

/* Renders r as JSON and returns the "recurrent" object's value for key (a number), or -1 for
 * null; fails the test when the key is missing. */
static double recurrent_json(const kvc_plan_result_t *r, const char *key)
{
    char *js = NULL;
    assert_ok(kvc_plan_render_json(r, &js));
    const char *sec = strstr(js, "\"recurrent\":");
    assert_non_null(sec);
    char needle[96];
    snprintf(needle, sizeof needle, "\"%s\":", key);
    const char *at = strstr(sec, needle);
    if (!at) fail_msg("recurrent.%s missing from the JSON", key);
    at += strlen(needle);
    while (*at == ' ' || *at == '\t') at++;
    const double v = !strncmp(at, "null", 4) ? -1 : strtod(at, NULL);
    kvc_plan_string_free(js);
    return v;
}

/* mistralai/Mamba-Codestral-7B-v0.1 (tests/data/PROVENANCE.md), Mamba2ForCausalLM: 64 layers of
 * a Mamba-2 mixer and nothing else; hidden 4096, num_heads 128 x head_dim 64 = d_inner 8192
 * (expand 2), state_size 128, n_groups 8, conv_kernel 4, use_conv_bias, vocab 32768, untied, no
 * max_position_embeddings.  No layer attends: no KV at all. */
static void mamba2_codestral_has_no_kv(void **state)
{
    (void)state;
    kvc_plan_model_t m;
    load("mamba-codestral-7b.json", &m);
    assert_int_equal(m.recurrent, KVC_PLAN_RECURRENT_MAMBA2);
    assert_int_equal(m.n_recurrent_layers, 64);
    assert_int_equal(m.ssm_d_inner, 8192);
    assert_int_equal(kvc_plan_kv_bytes_per_token(&m, KVC_PLAN_BF16), 0);
    kvc_plan_param_count_t c;
    kvc_plan_model_params(&m, &c);
    /* a mixer: in_proj 4096 x (2 x 8192 + 2 x 8 x 128 + 128 = 18,560) = 76,021,760, out_proj
     * 8192 x 4096 = 33,554,432; conv over 8192 + 2 x 8 x 128 = 10,240 channels x 4 = 40,960 +
     * bias 10,240, dt_bias, A_log, D 3 x 128 = 384, the gated norm 8,192: 109,635,968, x 64 =
     * 7,016,701,952; one norm per layer 64 x 4096 + the final 4096 = 266,240; embedding and LM
     * head 2 x 32,768 x 4096 = 268,435,456: 7,285,403,648 (published: 7.3 billion) */
    assert_int_equal(c.recurrent, UINT64_C(7016701952));
    assert_int_equal(c.attention, 0);
    assert_int_equal(c.mlp_dense, 0);
    assert_int_equal(c.norms, 266240);
    assert_int_equal(c.total, UINT64_C(7285403648));

    kvc_plan_gpu_t h100 = gpu("h100-sxm");
    kvc_plan_params_t p = defaults();
    p.max_model_len = 8192; /* the config gives no max_position_embeddings */
    p.kv_cache_bytes = 16 * GIB;
    kvc_plan_result_t *r = plan(&m, &h100, &p);
    /* conv (4 - 1) x 10,240 x 2 B = 61,440; SSM 128 x 64 x 128 x 2 B = 2,097,152; x 64 layers =
     * 138,149,888 B (131.75 MiB) per sequence: all a request holds, whatever its length */
    assert_int_equal(r->kv_bytes_per_token, 0);
    assert_int_equal(r->kv_bytes_per_token_per_gpu, 0);
    assert_int_equal(r->conv_state_bytes_per_layer, 61440);
    assert_int_equal(r->ssm_state_bytes_per_layer, 2097152);
    assert_int_equal(r->state_bytes_per_seq, 138149888);
    assert_int_equal(r->kv_bytes_per_request, 138149888);
    assert_int_equal(kvc_plan_request_bytes(r, 1), 138149888);
    assert_int_equal(kvc_plan_request_bytes(r, 8192), 138149888);
    assert_int_equal(r->state_kv_tokens, 0);
    /* the pool is state slots: floor(17,179,869,184 / 138,149,888) = 124 sequences per GPU, and
     * holds no tokens */
    assert_int_equal(r->num_blocks, 124);
    assert_int_equal(r->pool_tokens, 0);
    assert_int_equal(r->max_concurrency, 124);
    assert_true(r->fits);
    assert_true(isfinite(r->sliding_window_saving) && r->sliding_window_saving == 0);
    assert_true(isfinite(r->link_limited_tokens_per_s));
    /* without attention layers only the checkpoints count: the boundary is the interval */
    assert_int_equal(r->restart_boundary_tokens, 512);
    assert_int_equal(r->prompt_resume_tokens, 512);
    assert_true(recurrent_json(r, "attention_layers") == 0);
    assert_true(recurrent_json(r, "attention_restart_tokens") == -1);
    assert_true(recurrent_json(r, "recurrent_restart_tokens") == 512);
    assert_true(recurrent_json(r, "conv_channels") == 10240);
    free(r);
    /* --state-checkpoint-interval 100: the boundary is 100 (not lcm(16, 100) = 400); an fp32 SSM
     * state: 64 x (61,440 + 4,194,304) = 272,367,616, floor(16 GiB / that) = 63 */
    p.state_checkpoint_interval = 100;
    p.ssm_state_fp32 = true;
    r = plan(&m, &h100, &p);
    assert_int_equal(r->restart_boundary_tokens, 100);
    assert_int_equal(r->prompt_resume_tokens, 900);
    assert_int_equal(r->state_bytes_per_seq, 272367616);
    assert_int_equal(r->max_concurrency, 63);
    free(r);
    /* TP 2: 64 heads and 4 groups per GPU, conv (3 x (4096 + 1024) x 2) = 30,720, SSM
     * 64 x 64 x 128 x 2 = 1,048,576: 64 x 1,079,296 = 69,074,944 */
    p.state_checkpoint_interval = 0;
    p.ssm_state_fp32 = false;
    p.tp = 2;
    r = plan(&m, &h100, &p);
    assert_int_equal(r->state_bytes_per_seq_per_gpu, 69074944);
    free(r);
    /* the text never prints a division by zero */
    p.tp = 1;
    p.kv_cache_bytes = KVC_PLAN_AUTO;
    r = plan(&m, &h100, &p);
    char *txt = NULL;
    assert_ok(kvc_plan_render_text(r, &txt));
    assert_null(strstr(txt, " inf"));
    assert_null(strstr(txt, " nan")); /* "Tenancy" holds "nan" */
    assert_null(strstr(txt, "-nan"));
    assert_non_null(strstr(txt, "none: no layer attends"));
    kvc_plan_string_free(txt);
    free(r);
}

/* nvidia/Nemotron-H-8B-Base-8K (tests/data/PROVENANCE.md): 52 single-block layers by
 * hybrid_override_pattern, 24 Mamba-2 (M), 4 attention (*), 24 squared-ReLU MLP (-); hidden
 * 4096; attention 32 heads, 8 KV heads x 128; Mamba-2 128 heads x 64, ssm_state_size 128,
 * n_groups 8, conv_kernel 4; intermediate_size 21504 (up and down only), vocab 131072, untied. */
static void nemotron_h_8b_follows_its_pattern(void **state)
{
    (void)state;
    kvc_plan_model_t m;
    load("nemotron-h-8b.json", &m);
    assert_int_equal(m.recurrent, KVC_PLAN_RECURRENT_MAMBA2);
    assert_int_equal(m.n_recurrent_layers, 24);
    assert_true(m.mlp_ungated);
    kvc_plan_param_count_t c;
    kvc_plan_model_params(&m, &c);
    /* attention 4 x (2 x 4096^2 + 2 x 4096 x 1024) = 167,772,160; the mixer as Codestral's,
     * 109,635,968 x 24 = 2,631,263,232; MLPs 24 x 2 x 4096 x 21504 = 4,227,858,432 (gated, 3
     * matrices, it would be 10.1 billion); norms 52 x 4096 + 4096 = 217,088; embedding and LM
     * head 2 x 131,072 x 4096 = 1,073,741,824: 8,100,852,736 (published: 8 billion) */
    assert_int_equal(c.attention, UINT64_C(167772160));
    assert_int_equal(c.recurrent, UINT64_C(2631263232));
    assert_int_equal(c.mlp_dense, UINT64_C(4227858432));
    assert_int_equal(c.total, UINT64_C(8100852736));

    kvc_plan_gpu_t h100 = gpu("h100-sxm");
    kvc_plan_params_t p = defaults();
    p.kv_cache_bytes = 16 * GIB;
    kvc_plan_result_t *r = plan(&m, &h100, &p);
    /* KV of the 4 attention layers only: 2 x 4 x 8 x 128 x 2 B = 16,384 B per token (212,992 if
     * all 52 attended); state 24 x (61,440 + 2,097,152) = 51,806,208 B = 3,162 tokens of KV */
    assert_int_equal(r->kv_bytes_per_token, 16384);
    assert_int_equal(r->all_attention_kv_bytes_per_token, 212992);
    assert_int_equal(r->kv_layers_per_gpu, 4);
    assert_int_equal(r->recurrent_layers_per_gpu, 24);
    assert_int_equal(r->state_bytes_per_seq, 51806208);
    assert_int_equal(r->state_kv_tokens, 3162);
    /* a 1,200-token request: 75 x 16 x 16,384 = 19,660,800 + 51,806,208 = 71,467,008; 16 GiB
     * holds 240 (331 if KV took nothing) */
    assert_int_equal(r->kv_bytes_per_request, 71467008);
    assert_int_equal(r->max_concurrency, 240);
    assert_int_equal(r->state_only_sequences, 331);
    /* attention layers resume at any block, Mamba layers at checkpoints: lcm(16, 512) = 512 */
    assert_int_equal(r->restart_boundary_tokens, 512);
    assert_true(recurrent_json(r, "attention_layers") == 4);
    assert_true(recurrent_json(r, "attention_restart_tokens") == 16);
    free(r);
    p.state_checkpoint_interval = 100;
    r = plan(&m, &h100, &p);
    assert_int_equal(r->restart_boundary_tokens, 400);
    free(r);
    /* TP 2: 4 KV heads per GPU (8,192 B per token), 64 SSM heads and 4 groups per GPU
     * (30,720 + 1,048,576) x 24 = 25,903,104 */
    p.state_checkpoint_interval = 0;
    p.tp = 2;
    r = plan(&m, &h100, &p);
    assert_int_equal(r->kv_bytes_per_token_per_gpu, 8192);
    assert_int_equal(r->state_bytes_per_seq_per_gpu, 25903104);
    free(r);
    /* PP 13: stages of 4 layers, the first (M-M-) holds state and no attention layer: a pool of
     * state slots beside pools of KV blocks is not modelled, so refused, naming the stage */
    p.tp = 1;
    p.pp = 13;
    r = malloc(sizeof *r);
    char msg[256] = "";
    assert_int_equal(kvc_plan_compute(&m, &h100, &p, r, msg, sizeof msg), KVC_EINVAL);
    assert_non_null(
        strstr(msg, "--pp 13: stage 0 (layers 0-3) holds recurrent state but no attention"));
    free(r);
}

/* Qwen/Qwen3-Next-80B-A3B (tests/data/PROVENANCE.md): 48 layers, every full_attention_interval =
 * 4th (3, 7, ..., 47) gated full attention (16 heads, 2 KV heads x 256; q_proj 2 x 16 x 256
 * with the gate), the other 36 Gated DeltaNet (16 key heads x 128, 32 value heads x 128, conv
 * kernel 4); MoE on every layer: 512 experts of 512, 10 per token, one shared expert of 512;
 * hidden 2048, vocab 151936, untied. */
static void qwen3_next_80b_gated_deltanet(void **state)
{
    (void)state;
    kvc_plan_model_t m;
    load("qwen3-next-80b-a3b.json", &m);
    assert_int_equal(m.recurrent, KVC_PLAN_RECURRENT_GDN);
    assert_int_equal(m.n_recurrent_layers, 36);
    assert_true(m.attn_output_gate);
    kvc_plan_param_count_t c;
    kvc_plan_model_params(&m, &c);
    /* DeltaNet: in_proj_qkvz 2048 x (2 x 2048 + 2 x 4096) = 25,165,824, in_proj_ba 2048 x 64 =
     * 131,072, out_proj 4096 x 2048 = 8,388,608; conv 8,192 x 4 = 32,768 (no bias), dt_bias and
     * A_log 64, norm 128: 33,718,464 x 36 = 1,213,864,704.  Attention: q 2048 x 8192 =
     * 16,777,216, k, v 2 x 2048 x 512, o 4096 x 2048: 27,262,976 x 12 = 327,155,712.  Experts 48 x
     * 512 x 3 x 2048 x 512 = 77,309,411,328; shared 48 x 3,145,728 = 150,994,944; router 48 x
     * 2048 x 512 = 50,331,648; norms 48 x 2 x 2048 + 2048 = 198,656; embedding and LM head
     * 622,329,856: 79,674,286,848 (published: 80 billion; the safetensors' 79,674,391,296 adds
     * the q/k norms and the shared-expert gates, 104,448, not counted).  Active: 502 of 512
     * experts skipped on 48 layers, 48 x 502 x 3,145,728 = 75,799,461,888 less: 3,874,824,960
     * (published: 3 billion active) */
    assert_int_equal(c.recurrent, UINT64_C(1213864704));
    assert_int_equal(c.attention, UINT64_C(327155712));
    assert_int_equal(c.total, UINT64_C(79674286848));
    assert_int_equal(c.active, UINT64_C(3874824960));

    kvc_plan_gpu_t h100 = gpu("h100-sxm");
    kvc_plan_params_t p = defaults();
    p.kv_cache_bytes = 16 * GIB;
    kvc_plan_result_t *r = plan(&m, &h100, &p);
    /* KV of the 12 attention layers: 2 x 12 x 2 x 256 x 2 B = 24,576 B per token; state per
     * DeltaNet layer: conv (4 - 1) x (2 x 16 x 128 + 32 x 128 = 8,192) x 2 B = 49,152, recurrent
     * 32 x 128 x 128 x 2 B = 1,048,576; x 36 = 39,518,208 B = 1,608 tokens of KV */
    assert_int_equal(r->kv_bytes_per_token, 24576);
    assert_int_equal(r->conv_state_bytes_per_layer, 49152);
    assert_int_equal(r->ssm_state_bytes_per_layer, 1048576);
    assert_int_equal(r->state_bytes_per_seq, 39518208);
    assert_int_equal(r->state_kv_tokens, 1608);
    /* a 1,200-token request: 75 x 16 x 24,576 = 29,491,200 + 39,518,208 = 69,009,408; 16 GiB
     * holds 248 */
    assert_int_equal(r->kv_bytes_per_request, 69009408);
    assert_int_equal(r->max_concurrency, 248);
    assert_int_equal(r->restart_boundary_tokens, 512);
    assert_true(recurrent_json(r, "ssm_heads") == 32);
    assert_true(recurrent_json(r, "ssm_groups") == 16);
    free(r);
    /* --mamba-ssm-cache-dtype float32: the recurrent state doubles, 36 x (49,152 + 2,097,152) =
     * 77,266,944 */
    p.ssm_state_fp32 = true;
    r = plan(&m, &h100, &p);
    assert_int_equal(r->state_bytes_per_seq, 77266944);
    free(r);
    /* TP 4: 4 key and 8 value heads per GPU, conv 3 x (2 x 4 x 128 + 8 x 128) x 2 = 12,288 and
     * 8 x 128 x 128 x 2 = 262,144: 36 x 274,432 = 9,879,552; the 2 KV heads replicate to one per
     * GPU: 12 x 2 x 256 x 2 = 12,288 B per token */
    p.ssm_state_fp32 = false;
    p.tp = 4;
    r = plan(&m, &h100, &p);
    assert_int_equal(r->state_bytes_per_seq_per_gpu, 9879552);
    assert_int_equal(r->kv_bytes_per_token_per_gpu, 12288);
    free(r);
    /* TP 32 splits the 16 key heads no further: refused, naming them */
    p.tp = 32;
    r = malloc(sizeof *r);
    char msg[256] = "";
    assert_int_equal(kvc_plan_compute(&m, &h100, &p, r, msg, sizeof msg), KVC_EINVAL);
    assert_non_null(strstr(msg, "--tp 32"));
    free(r);
}

/* nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B (tests/data/PROVENANCE.md): the pattern's 23 M, 6 * and
 * 23 E blocks; hidden 2688, 64 Mamba heads x 64 (d_inner 4,096 though expand x hidden is 5,376:
 * NemotronHMamba2Mixer is heads x head_dim wide), state 128, 8 groups, conv 4; 32 heads, 2 KV
 * heads x 128; 128 routed squared-ReLU experts of 1856, 6 per token, one shared of 3712. */
static void nemotron_3_nano_has_moe_blocks(void **state)
{
    (void)state;
    kvc_plan_model_t m;
    load("nemotron-3-nano-30b-a3b.json", &m);
    assert_int_equal(m.n_recurrent_layers, 23);
    assert_int_equal(m.ssm_d_inner, 4096);
    assert_int_equal(m.n_experts, 128);
    assert_int_equal(m.shared_expert_intermediate_size, 3712);
    kvc_plan_param_count_t c;
    kvc_plan_model_params(&m, &c);
    /* mixer: in_proj 2688 x (2 x 4096 + 2 x 8 x 128 + 64 = 10,304) = 27,697,152, out_proj
     * 4096 x 2688 = 11,010,048, conv (4096 + 2,048 = 6,144) x 4 + 6,144, 3 x 64, norm 4,096:
     * 38,742,208 x 23 = 891,070,784; attention 2 x 2688 x 4096 + 2 x 2688 x 256 = 23,396,352 x 6 =
     * 140,378,112; an MoE block: 128 x 2 x 2688 x 1856 = 1,277,165,568 routed, 2 x 2688 x 3712 =
     * 19,955,712 shared, 2688 x 128 router; x 23: 29,374,808,064 + 458,981,376 + 7,913,472;
     * norms 53 x 2688 = 142,464; embedding and LM head 704,643,072: 31,577,937,344 (published:
     * 31.6 billion); active: 122 of 128 experts skipped, 23 x 122 x 9,977,856 = 27,997,863,936
     * less: 3,580,073,408 (published: 3.6 billion with embeddings) */
    assert_int_equal(c.recurrent, UINT64_C(891070784));
    assert_int_equal(c.attention, UINT64_C(140378112));
    assert_int_equal(c.experts_routed, UINT64_C(29374808064));
    assert_int_equal(c.total, UINT64_C(31577937344));
    assert_int_equal(c.active, UINT64_C(3580073408));
    kvc_plan_gpu_t h100 = gpu("h100-sxm");
    kvc_plan_params_t p = defaults();
    p.kv_cache_bytes = 16 * GIB;
    kvc_plan_result_t *r = plan(&m, &h100, &p);
    /* state 23 x (3 x 6,144 x 2 + 64 x 64 x 128 x 2 = 36,864 + 1,048,576) = 24,965,120; KV
     * 2 x 6 x 2 x 128 x 2 = 6,144 B per token; a 1,200-token request 75 x 16 x 6,144 +
     * 24,965,120 = 32,337,920: 16 GiB holds 531 */
    assert_int_equal(r->state_bytes_per_seq, 24965120);
    assert_int_equal(r->kv_bytes_per_token, 6144);
    assert_int_equal(r->kv_bytes_per_request, 32337920);
    assert_int_equal(r->max_concurrency, 531);
    free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(llama_3_1_8b),
        cmocka_unit_test(llama_3_1_70b),
        cmocka_unit_test(mistral_7b_slides_every_layer),
        cmocka_unit_test(mixtral_8x7b_counts_active_experts),
        cmocka_unit_test(qwen2_5_72b_has_qkv_biases),
        cmocka_unit_test(gemma_2_27b_alternates_windows),
        cmocka_unit_test(deepseek_v3_mla_under_tp8),
        cmocka_unit_test(jamba_is_modelled_as_a_hybrid),
        cmocka_unit_test(mamba2_codestral_has_no_kv),
        cmocka_unit_test(nemotron_h_8b_follows_its_pattern),
        cmocka_unit_test(qwen3_next_80b_gated_deltanet),
        cmocka_unit_test(nemotron_3_nano_has_moe_blocks),
        cmocka_unit_test(gpu_presets_match_their_sources),
    };
    return cmocka_run_group_tests_name("plan_golden", tests, NULL, NULL);
}
