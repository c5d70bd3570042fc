/* deploy.c - the deployment options `kvcache plan` and `kvcache sim` share:
 * the model, the GPU, parallelism, dtypes, engine limits and measurements.
 * One table, one parser, one resolver, so the two commands cannot drift. */
#include "cli.h"
#include "kvcache/model.h"

#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum {
    KVC_CLI_MODEL = KVC_CLI_DEPLOY_FIRST,
    KVC_CLI_GPU,
    KVC_CLI_GPU_MEMORY,
    KVC_CLI_GPU_BANDWIDTH,
    KVC_CLI_GPU_FLOPS,
    KVC_CLI_GPU_FP8_FLOPS,
    KVC_CLI_GPU_L2,
    KVC_CLI_GPU_INTERCONNECT,
    KVC_CLI_GPU_PCIE,
    KVC_CLI_TP,
    KVC_CLI_PP,
    KVC_CLI_DP,
    KVC_CLI_WEIGHT_DTYPE,
    KVC_CLI_KV_DTYPE,
    KVC_CLI_BLOCK_SIZE,
    KVC_CLI_UTIL,
    KVC_CLI_MAX_MODEL_LEN,
    KVC_CLI_MAX_NUM_SEQS,
    KVC_CLI_MAX_BATCHED,
    KVC_CLI_WEIGHT_MEM,
    KVC_CLI_ACT_MEM,
    KVC_CLI_GRAPH_MEM,
    KVC_CLI_NON_TORCH_MEM,
    KVC_CLI_CTX_MEM,
    KVC_CLI_KV_MEM,
    KVC_CLI_EAGER,
    KVC_CLI_GRAPHS_OUTSIDE,
    KVC_CLI_NO_WINDOW_FREEING,
    KVC_CLI_MFU,
    KVC_CLI_MBU,
    KVC_CLI_SPEC_TOKENS,
    KVC_CLI_SPEC_ACCEPT,
};

bool kvc_cli_opt_u64(const char *cmd, const char *opt, const char *value, uint64_t lo, uint64_t hi,
                     uint64_t *out)
{
    if (kvc_cli_parse_u64(value, lo, hi, out)) return true;
    kvc_cli_error(cmd, "%s: '%s' is not a whole number in %llu..%llu", opt, value,
                  (unsigned long long)lo, (unsigned long long)hi);
    return false;
}

bool kvc_cli_opt_tokens(const char *cmd, const char *opt, const char *value, uint64_t lo,
                        uint64_t hi, uint64_t *out)
{
    if (kvc_cli_parse_tokens(value, lo, hi, out)) return true;
    kvc_cli_error(cmd,
                  "%s: '%s' is not a token count in %llu..%llu (e.g. 4096, 32k = 32,000, "
                  "32K = 32,768, 1M = 1,048,576)",
                  opt, value, (unsigned long long)lo, (unsigned long long)hi);
    return false;
}

bool kvc_cli_opt_double(const char *cmd, const char *opt, const char *value, double lo, double hi,
                        double *out)
{
    if (kvc_cli_parse_double(value, lo, hi, out)) return true;
    kvc_cli_error(cmd, "%s: '%s' is not a number in %g..%g", opt, value, lo, hi);
    return false;
}

int kvc_cli_bad_option(const char *cmd, int ch, const char *opt_name)
{
    if (ch == ':') return kvc_cli_error(cmd, "%s needs a value", opt_name);
    /* getopt_long reports "--json=x" with optopt set to the option it matched. */
    if (optopt >= KVC_CLI_DEPLOY_FIRST) return kvc_cli_error(cmd, "%s takes no value", opt_name);
    return kvc_cli_error(cmd, "unknown option '%s' (try --help)", opt_name);
}

int kvc_cli_getopt_error(const char *cmd, char **argv, int first_long)
{
    if (optopt >= first_long) /* a long option without its value */
        return kvc_cli_error(cmd, "%s needs a value (see --help)", argv[optind - 1]);
    if (optopt)
        return kvc_cli_error(cmd, "option -%c needs a value or is unknown (see --help)", optopt);
    return kvc_cli_error(cmd, "unknown option '%s' (see --help)", argv[optind - 1]);
}

void kvc_cli_opt_name(char *out, size_t cap, const struct option *opts, int li, int ch, int argc,
                      char **argv)
{
    if (li >= 0 && ch != ':' && ch != '?')
        snprintf(out, cap, "--%s", opts[li].name);
    else
        snprintf(out, cap, "%s", optind > 0 && optind <= argc ? argv[optind - 1] : "option");
    char *eq = strchr(out, '=');
    if (eq) *eq = '\0';
}

int kvc_cli_join_options(struct option *out, size_t cap, const struct option *a,
                         const struct option *b)
{
    size_t n = 0;
    for (const struct option *lists[2] = {a, b}, **l = lists; l < lists + 2; l++)
        for (const struct option *o = *l; o->name; o++) {
            if (n + 1 >= cap) return -1;
            out[n++] = *o;
        }
    out[n] = (struct option){NULL, 0, NULL, 0};
    return 0;
}

const struct option kvc_cli_deploy_options[] = {
    {"model", required_argument, NULL, KVC_CLI_MODEL},
    {"gpu", required_argument, NULL, KVC_CLI_GPU},
    {"gpu-memory", required_argument, NULL, KVC_CLI_GPU_MEMORY},
    {"gpu-bandwidth", required_argument, NULL, KVC_CLI_GPU_BANDWIDTH},
    {"gpu-flops", required_argument, NULL, KVC_CLI_GPU_FLOPS},
    {"gpu-fp8-flops", required_argument, NULL, KVC_CLI_GPU_FP8_FLOPS},
    {"gpu-l2", required_argument, NULL, KVC_CLI_GPU_L2},
    {"gpu-interconnect", required_argument, NULL, KVC_CLI_GPU_INTERCONNECT},
    {"gpu-pcie", required_argument, NULL, KVC_CLI_GPU_PCIE},
    {"tp", required_argument, NULL, KVC_CLI_TP},
    {"pp", required_argument, NULL, KVC_CLI_PP},
    {"dp", required_argument, NULL, KVC_CLI_DP},
    {"weight-dtype", required_argument, NULL, KVC_CLI_WEIGHT_DTYPE},
    {"kv-dtype", required_argument, NULL, KVC_CLI_KV_DTYPE},
    {"block-size", required_argument, NULL, KVC_CLI_BLOCK_SIZE},
    {"gpu-memory-utilization", required_argument, NULL, KVC_CLI_UTIL},
    {"max-model-len", required_argument, NULL, KVC_CLI_MAX_MODEL_LEN},
    {"max-num-seqs", required_argument, NULL, KVC_CLI_MAX_NUM_SEQS},
    {"max-num-batched-tokens", required_argument, NULL, KVC_CLI_MAX_BATCHED},
    {"weight-memory", required_argument, NULL, KVC_CLI_WEIGHT_MEM},
    {"activation-memory", required_argument, NULL, KVC_CLI_ACT_MEM},
    {"cuda-graph-memory", required_argument, NULL, KVC_CLI_GRAPH_MEM},
    {"non-torch-memory", required_argument, NULL, KVC_CLI_NON_TORCH_MEM},
    {"cuda-context-memory", required_argument, NULL, KVC_CLI_CTX_MEM},
    {"kv-cache-memory", required_argument, NULL, KVC_CLI_KV_MEM},
    {"enforce-eager", no_argument, NULL, KVC_CLI_EAGER},
    {"graphs-outside-budget", no_argument, NULL, KVC_CLI_GRAPHS_OUTSIDE},
    {"no-window-freeing", no_argument, NULL, KVC_CLI_NO_WINDOW_FREEING},
    {"mfu", required_argument, NULL, KVC_CLI_MFU},
    {"mbu", required_argument, NULL, KVC_CLI_MBU},
    {"spec-tokens", required_argument, NULL, KVC_CLI_SPEC_TOKENS},
    {"spec-acceptance", required_argument, NULL, KVC_CLI_SPEC_ACCEPT},
    {NULL, 0, NULL, 0}};

void kvc_cli_deploy_init(kvc_cli_deploy_t *d)
{
    *d = (kvc_cli_deploy_t){.p = kvc_plan_params_default(),
                            .g_l2 = UINT64_MAX,
                            .g_bw = NAN,
                            .g_flops = NAN,
                            .g_fp8 = NAN,
                            .g_link = NAN,
                            .g_pcie = NAN};
}

int kvc_cli_presets_line(char *buf, size_t len, bool models)
{
    size_t o = 0, n = models ? kvc_plan_model_preset_count() : kvc_plan_gpu_preset_count();
    buf[0] = '\0';
    for (size_t i = 0; i < n && o < len; i++) {
        int w = snprintf(buf + o, len - o, "%s%s", i ? ", " : "",
                         models ? kvc_plan_model_preset_name(i) : kvc_plan_gpu_preset_name(i));
        if (w < 0) break;
        o += (size_t)w;
    }
    return 0;
}

void kvc_cli_list_presets(void)
{
    printf("models:\n");
    for (size_t i = 0; i < kvc_plan_model_preset_count(); i++) {
        kvc_plan_model_t m;
        kvc_plan_model_preset(kvc_plan_model_preset_name(i), &m);
        kvc_plan_param_count_t pc;
        kvc_plan_model_params(&m, &pc);
        printf("  %-16s %3u layers, %3u heads, %s%s, %.1f billion parameters\n", m.name, m.n_layers,
               m.n_heads, m.mla ? "MLA" : "GQA", m.n_experts ? " MoE" : "", (double)pc.total / 1e9);
    }
    printf("gpus:\n");
    for (size_t i = 0; i < kvc_plan_gpu_preset_count(); i++) {
        kvc_plan_gpu_t g;
        kvc_plan_gpu_preset(kvc_plan_gpu_preset_name(i), &g);
        printf("  %-16s %-14s %7.2f GiB, %5.2f TB/s, %6.1f TFLOP/s bf16\n",
               kvc_plan_gpu_preset_name(i), g.name, (double)g.memory_bytes / 1073741824.0,
               g.hbm_bytes_per_s / 1e12, g.bf16_flops / 1e12);
    }
}

int kvc_cli_deploy_option(kvc_cli_deploy_t *d, const char *CMD, int ch, const char *opt_name,
                          const char *value)
{
    kvc_plan_params_t *pp = &d->p;
    uint64_t u;
    double dv;
#define U64(lo, hi, field)                                                 \
    do {                                                                   \
        if (!kvc_cli_opt_u64(CMD, opt_name, value, lo, hi, &u)) return -1; \
        field = u;                                                         \
    } while (0)
#define DBL(lo, hi, field)                                                     \
    do {                                                                       \
        if (!kvc_cli_opt_double(CMD, opt_name, value, lo, hi, &dv)) return -1; \
        field = dv;                                                            \
    } while (0)
#define SIZE(field)                                                                          \
    do {                                                                                     \
        if (kvc_plan_parse_bytes(value, &u))                                                 \
            return -kvc_cli_error(CMD, "%s: '%s' is not a size (e.g. 80GiB, 512MiB, 1.5e9)", \
                                  opt_name, value);                                          \
        field = u;                                                                           \
    } while (0)
#define RATE(field)                                                                               \
    do {                                                                                          \
        if (kvc_plan_parse_rate(value, &dv) || !(dv > 0))                                         \
            return -kvc_cli_error(CMD, "%s: '%s' is not a positive rate (e.g. 3.35TB/s, 64GB/s)", \
                                  opt_name, value);                                               \
        field = dv;                                                                               \
    } while (0)
    switch (ch) {
    case KVC_CLI_MODEL:
        d->model_arg = value;
        break;
    case KVC_CLI_GPU:
        d->gpu_arg = value;
        break;
    case KVC_CLI_GPU_MEMORY:
        SIZE(d->g_mem);
        if (!d->g_mem) return -kvc_cli_error(CMD, "--gpu-memory: must be positive");
        break;
    case KVC_CLI_GPU_BANDWIDTH:
        RATE(d->g_bw);
        break;
    case KVC_CLI_GPU_FLOPS:
        DBL(1e-3, 1e7, d->g_flops);
        break;
    case KVC_CLI_GPU_FP8_FLOPS:
        DBL(0, 1e7, d->g_fp8);
        break;
    case KVC_CLI_GPU_L2:
        SIZE(d->g_l2);
        break;
    case KVC_CLI_GPU_INTERCONNECT:
        RATE(d->g_link);
        break;
    case KVC_CLI_GPU_PCIE:
        RATE(d->g_pcie);
        break;
    case KVC_CLI_TP:
        U64(1, 1024, pp->tp);
        break;
    case KVC_CLI_PP:
        U64(1, 64, pp->pp);
        break;
    case KVC_CLI_DP:
        U64(1, 65536, pp->dp);
        break;
    case KVC_CLI_WEIGHT_DTYPE:
        if (kvc_plan_dtype_parse(value, &pp->weight_dtype))
            return -kvc_cli_error(
                CMD, "--weight-dtype: '%s' is not bf16, fp16, fp8, int8, int4 or nvfp4", value);
        d->weight_dtype_given = true;
        break;
    case KVC_CLI_KV_DTYPE:
        if (kvc_plan_dtype_parse(value, &pp->kv_dtype) || pp->kv_dtype == KVC_PLAN_INT4)
            return -kvc_cli_error(CMD, "--kv-dtype: '%s' is not bf16, fp16, fp8, int8 or nvfp4",
                                  value);
        break;
    case KVC_CLI_BLOCK_SIZE:
        U64(1, 1024, pp->block_size);
        if (pp->block_size & (pp->block_size - 1))
            return -kvc_cli_error(CMD, "--block-size: '%s' is not a power of two", value);
        break;
    case KVC_CLI_UTIL:
        DBL(1e-6, 1, pp->gpu_memory_utilization);
        break;
    case KVC_CLI_MAX_MODEL_LEN:
        if (!kvc_cli_opt_tokens(CMD, opt_name, value, 1, KVC_PLAN_MAX_TOKENS, &u)) return -1;
        pp->max_model_len = u;
        break;
    case KVC_CLI_MAX_NUM_SEQS:
        U64(1, KVC_PLAN_MAX_SEQS, pp->max_num_seqs);
        break;
    case KVC_CLI_MAX_BATCHED:
        if (!kvc_cli_opt_tokens(CMD, opt_name, value, 1, KVC_PLAN_MAX_BATCHED, &u)) return -1;
        pp->max_num_batched_tokens = (uint32_t)u;
        break;
    case KVC_CLI_WEIGHT_MEM:
        SIZE(pp->weight_bytes);
        break;
    case KVC_CLI_ACT_MEM:
        SIZE(pp->activation_bytes);
        break;
    case KVC_CLI_GRAPH_MEM:
        SIZE(pp->cuda_graph_bytes);
        break;
    case KVC_CLI_NON_TORCH_MEM:
        SIZE(pp->non_torch_bytes);
        break;
    case KVC_CLI_CTX_MEM:
        SIZE(pp->cuda_context_bytes);
        break;
    case KVC_CLI_KV_MEM:
        SIZE(pp->kv_cache_bytes);
        break;
    case KVC_CLI_EAGER:
        pp->enforce_eager = true;
        break;
    case KVC_CLI_GRAPHS_OUTSIDE:
        pp->graphs_outside_budget = true;
        break;
    case KVC_CLI_NO_WINDOW_FREEING:
        pp->window_freeing = false;
        break;
    case KVC_CLI_MFU:
        DBL(1e-6, 1, pp->mfu);
        break;
    case KVC_CLI_MBU:
        DBL(1e-6, 1, pp->mbu);
        break;
    case KVC_CLI_SPEC_TOKENS:
        U64(0, 64, pp->spec_tokens);
        break;
    case KVC_CLI_SPEC_ACCEPT:
        DBL(0, 1, pp->spec_acceptance);
        break;
    default:
        return 0;
    }
    return 1;
}

/* A GGUF model file rather than a config.json: by its magic, or by its name when it cannot
 * be read (so that the GGUF reader says why). */
static bool is_gguf(const char *path)
{
    const size_t n = strlen(path);
    FILE *f = fopen(path, "rb");
    if (!f) return n > 5 && !strcmp(path + n - 5, ".gguf");
    char magic[4];
    const bool yes = fread(magic, 1, 4, f) == 4 && !memcmp(magic, "GGUF", 4);
    fclose(f);
    return yes || (n > 5 && !strcmp(path + n - 5, ".gguf"));
}

static int load_model(const char *CMD, const char *arg, kvc_plan_model_t *m)
{
    if (!kvc_plan_model_preset(arg, m)) return 0;
    const size_t n = strlen(arg);
    const bool looks_like_path = strchr(arg, '/') || (n > 5 && !strcmp(arg + n - 5, ".json")) ||
                                 (n > 5 && !strcmp(arg + n - 5, ".gguf"));
    if (!looks_like_path && access(arg, F_OK) != 0) {
        char names[512];
        kvc_cli_presets_line(names, sizeof names, true);
        return kvc_cli_error(CMD, "--model '%s': not a preset (%s) and no such file", arg, names);
    }
    char msg[512];
    if (is_gguf(arg)) {
        if (kvc_model_plan_from_gguf_file(arg, m, msg, sizeof msg))
            return kvc_cli_error(CMD, "--model: %s: %s", arg, msg);
        return 0;
    }
    if (kvc_plan_model_load(arg, m, msg, sizeof msg)) return kvc_cli_error(CMD, "--model: %s", msg);
    return 0;
}

int kvc_cli_deploy_resolve(kvc_cli_deploy_t *d, const char *CMD, kvc_plan_model_t *model,
                           kvc_plan_gpu_t *gpu)
{
    if (!d->model_arg) {
        char names[512];
        kvc_cli_presets_line(names, sizeof names, true);
        return kvc_cli_error(CMD, "no --model: give a preset (%s) or a config.json path", names);
    }
    *gpu = (kvc_plan_gpu_t){0};
    if (d->gpu_arg) {
        if (kvc_plan_gpu_preset(d->gpu_arg, gpu)) {
            char names[512];
            kvc_cli_presets_line(names, sizeof names, false);
            return kvc_cli_error(CMD, "--gpu '%s': unknown preset (presets: %s)", d->gpu_arg,
                                 names);
        }
    } else {
        if (!d->g_mem || isnan(d->g_bw) || isnan(d->g_flops)) {
            char names[512];
            kvc_cli_presets_line(names, sizeof names, false);
            return kvc_cli_error(CMD,
                                 "no --gpu: give a preset (%s) or --gpu-memory, --gpu-bandwidth "
                                 "and --gpu-flops",
                                 names);
        }
        snprintf(gpu->name, sizeof gpu->name, "custom GPU");
        gpu->pcie_bytes_per_s = 32e9; /* PCIe Gen4 x16, one direction, unless given */
    }
    if (d->g_mem) gpu->memory_bytes = d->g_mem;
    if (!isnan(d->g_bw)) gpu->hbm_bytes_per_s = d->g_bw;
    if (!isnan(d->g_flops)) gpu->bf16_flops = d->g_flops * 1e12;
    if (!isnan(d->g_fp8)) gpu->fp8_flops = d->g_fp8 * 1e12;
    if (d->g_l2 != UINT64_MAX) gpu->l2_bytes = d->g_l2;
    if (!isnan(d->g_link)) gpu->interconnect_bytes_per_s = d->g_link;
    if (!isnan(d->g_pcie)) gpu->pcie_bytes_per_s = d->g_pcie;
    if (load_model(CMD, d->model_arg, model)) return 1;
    /* a quantised checkpoint is sized as what it stores, unless --weight-dtype says otherwise;
     * one the planner cannot size is refused, never sized as bf16 */
    if (model->checkpoint_quant[0] && !d->weight_dtype_given) {
        if (!model->checkpoint_dtype_known)
            return kvc_cli_error(CMD,
                                 "--model: quantization_config.quant_method '%s' is not modelled: "
                                 "give --weight-dtype (bf16, fp16, fp8, int8, int4, nvfp4)",
                                 model->checkpoint_quant);
        d->p.weight_dtype = model->checkpoint_dtype;
    }
    return 0;
}
