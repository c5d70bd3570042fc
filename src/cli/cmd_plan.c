/* cmd_plan.c - `kvcache plan`: the capacity planner on the command line.
 *
 * Parses every option first (one-line errors, nothing printed before the
 * input is known good), resolves the model (a preset or a config.json path)
 * and the GPU (a preset or explicit numbers), asks the plan layer for the
 * result and prints its text or JSON rendering.  The arithmetic and the
 * derivation text both live in the library (include/kvcache/plan.h).
 *
 * Exit status: 0 when the deployment starts, 3 when the plan says it does
 * not (the output names the failing phase), 1 for bad input.
 */
#include "cli.h"
#include "kvcache/kvcache.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CMD "plan"

enum {
    O_MODEL = 256,
    O_GPU,
    O_GPU_MEMORY,
    O_GPU_BANDWIDTH,
    O_GPU_FLOPS,
    O_GPU_FP8_FLOPS,
    O_GPU_L2,
    O_GPU_INTERCONNECT,
    O_GPU_PCIE,
    O_TP,
    O_PP,
    O_DP,
    O_WEIGHT_DTYPE,
    O_KV_DTYPE,
    O_BLOCK_SIZE,
    O_UTIL,
    O_MAX_MODEL_LEN,
    O_MAX_NUM_SEQS,
    O_MAX_BATCHED,
    O_PROMPT,
    O_OUTPUT,
    O_CONTEXT,
    O_WEIGHT_MEM,
    O_ACT_MEM,
    O_GRAPH_MEM,
    O_NON_TORCH_MEM,
    O_CTX_MEM,
    O_KV_MEM,
    O_EAGER,
    O_GRAPHS_OUTSIDE,
    O_NO_WINDOW_FREEING,
    O_N,
    O_BEAMS,
    O_ARRIVAL,
    O_MFU,
    O_MBU,
    O_LINK,
    O_PREFILL_RATE,
    O_HOST_BW,
    O_NVME_BW,
    O_NET_BW,
    O_SSD_TBW,
    O_SSD_RATE,
    O_SPEC_TOKENS,
    O_SPEC_ACCEPT,
    O_TENANT,
    O_JSON,
    O_LIST,
};

static void help(FILE *f)
{
    fprintf(
        f,
        "usage: kvcache plan --model NAME|config.json --gpu NAME [options]\n"
        "\n"
        "Sizes a deployment's KV cache and its whole startup memory budget, and prints the\n"
        "derivation: each formula, the numbers put in, the result, and whether a number is\n"
        "measured, estimated, configured or a ceiling.  Twelve sections: KV bytes per token and\n"
        "tensor parallelism, the startup ledger, whether the engine starts (and which phase\n"
        "fails), concurrency and the ceilings on the batch, sliding windows, prefill FLOPs,\n"
        "forks, disaggregated prefill, recompute vs fetch per tier, Little's law, speculative\n"
        "decoding, and tenancy.\n"
        "\n"
        "model and hardware:\n"
        "  --model NAME|PATH          a preset (see --list) or a Hugging Face config.json\n"
        "  --gpu NAME                 a preset: a100-80gb-sxm, h100-sxm, h100-pcie, h200, b200,\n"
        "                             l40s, mi300x; or give the numbers below without --gpu\n"
        "  --gpu-memory SIZE          memory the runtime reports (e.g. 79.22GiB); overrides a "
        "preset\n"
        "  --gpu-bandwidth RATE       HBM bandwidth (e.g. 3.35TB/s; a bare number is GB/s)\n"
        "  --gpu-flops TFLOPS         dense bf16 TFLOP/s\n"
        "  --gpu-fp8-flops TFLOPS     dense fp8 TFLOP/s (0: none)\n"
        "  --gpu-l2 SIZE              L2 cache\n"
        "  --gpu-interconnect RATE    GPU-to-GPU link, per direction\n"
        "  --gpu-pcie RATE            host link, per direction\n"
        "deployment:\n"
        "  --tp N, --pp N, --dp N     tensor, pipeline and data parallel sizes (default 1)\n"
        "  --weight-dtype T           bf16 (default), fp16, fp8, int4\n"
        "  --kv-dtype T               bf16 (default), fp16, fp8\n"
        "  --block-size N             tokens per KV block, a power of two (default 16)\n"
        "  --gpu-memory-utilization F share of memory the engine budgets (default 0.9)\n"
        "  --max-model-len N          default: the model's max_position_embeddings\n"
        "  --max-num-seqs N           default 256\n"
        "  --max-num-batched-tokens N the step's token budget (default 8192)\n"
        "  --prompt N, --output N     the typical request (default 1000 and 200 tokens)\n"
        "  --context N                context for sections 5 and 6 (default prompt + output)\n"
        "  --no-window-freeing        size sliding-window layers like full ones\n"
        "engine measurements (replace an estimate; SIZE like 14.96GiB):\n"
        "  --weight-memory SIZE, --activation-memory SIZE, --cuda-graph-memory SIZE,\n"
        "  --non-torch-memory SIZE, --cuda-context-memory SIZE\n"
        "  --kv-cache-memory SIZE     an explicit KV budget (utilization then unused)\n"
        "  --enforce-eager            no CUDA graphs\n"
        "  --graphs-outside-budget    graphs captured after the pool (older engines)\n"
        "sections 7-12:\n"
        "  --n N, --beams N           parallel samples and beam width (default 4 and 4)\n"
        "  --link-bandwidth RATE      prefill-to-decode link per GPU (default 50GB/s)\n"
        "  --prefill-tokens-per-s F   measured prefill rate per replica (default: estimated)\n"
        "  --host-bandwidth RATE      host memory tier (default: the GPU's PCIe link)\n"
        "  --nvme-bandwidth RATE      local NVMe tier per GPU (default 7GB/s)\n"
        "  --network-bandwidth RATE   remote KV store per GPU (default 12.5GB/s)\n"
        "  --ssd-tbw SIZE             SSD rated write volume (default 7008TB; bare number: TB)\n"
        "  --ssd-write-rate RATE      KV written to the SSD (default: a prefill GPU's output)\n"
        "  --arrival-rate F           requests per second, whole deployment (default 1)\n"
        "  --mfu F, --mbu F           achieved share of peak FLOP/s and bandwidth (0.5, 0.8)\n"
        "  --spec-tokens N            draft tokens per sequence and step (default 0)\n"
        "  --spec-acceptance F        per-token acceptance rate (default 0.7)\n"
        "  --tenant-tokens N          one more request length to price in section 12\n"
        "output:\n"
        "  --json                     one JSON object (keys in docs/plan.md)\n"
        "  --list                     the model and GPU presets\n"
        "  -h, --help                 this help\n"
        "\n"
        "exit status: 0 when the deployment starts, 3 when it does not, 1 for bad input.\n");
}

static bool parse_double(const char *s, double min, double max, double *out)
{
    if (!s || !*s) return false;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v) || v < min || v > max) return false;
    *out = v;
    return true;
}

static void list_presets(void)
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

static int presets_line(char *buf, size_t len, bool models)
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

static int load_model(const char *arg, kvc_plan_model_t *m)
{
    if (!kvc_plan_model_preset(arg, m)) return 0;
    const size_t n = strlen(arg);
    const bool looks_like_path = strchr(arg, '/') || (n > 5 && !strcmp(arg + n - 5, ".json"));
    if (!looks_like_path && access(arg, F_OK) != 0) {
        char names[512];
        presets_line(names, sizeof names, true);
        return kvc_cli_error(CMD, "--model '%s': not a preset (%s) and no such file", arg, names);
    }
    char msg[512];
    if (kvc_plan_model_load(arg, m, msg, sizeof msg)) return kvc_cli_error(CMD, "--model: %s", msg);
    return 0;
}

int kvc_cmd_plan(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, NULL, O_MODEL},
        {"gpu", required_argument, NULL, O_GPU},
        {"gpu-memory", required_argument, NULL, O_GPU_MEMORY},
        {"gpu-bandwidth", required_argument, NULL, O_GPU_BANDWIDTH},
        {"gpu-flops", required_argument, NULL, O_GPU_FLOPS},
        {"gpu-fp8-flops", required_argument, NULL, O_GPU_FP8_FLOPS},
        {"gpu-l2", required_argument, NULL, O_GPU_L2},
        {"gpu-interconnect", required_argument, NULL, O_GPU_INTERCONNECT},
        {"gpu-pcie", required_argument, NULL, O_GPU_PCIE},
        {"tp", required_argument, NULL, O_TP},
        {"pp", required_argument, NULL, O_PP},
        {"dp", required_argument, NULL, O_DP},
        {"weight-dtype", required_argument, NULL, O_WEIGHT_DTYPE},
        {"kv-dtype", required_argument, NULL, O_KV_DTYPE},
        {"block-size", required_argument, NULL, O_BLOCK_SIZE},
        {"gpu-memory-utilization", required_argument, NULL, O_UTIL},
        {"max-model-len", required_argument, NULL, O_MAX_MODEL_LEN},
        {"max-num-seqs", required_argument, NULL, O_MAX_NUM_SEQS},
        {"max-num-batched-tokens", required_argument, NULL, O_MAX_BATCHED},
        {"prompt", required_argument, NULL, O_PROMPT},
        {"output", required_argument, NULL, O_OUTPUT},
        {"context", required_argument, NULL, O_CONTEXT},
        {"weight-memory", required_argument, NULL, O_WEIGHT_MEM},
        {"activation-memory", required_argument, NULL, O_ACT_MEM},
        {"cuda-graph-memory", required_argument, NULL, O_GRAPH_MEM},
        {"non-torch-memory", required_argument, NULL, O_NON_TORCH_MEM},
        {"cuda-context-memory", required_argument, NULL, O_CTX_MEM},
        {"kv-cache-memory", required_argument, NULL, O_KV_MEM},
        {"enforce-eager", no_argument, NULL, O_EAGER},
        {"graphs-outside-budget", no_argument, NULL, O_GRAPHS_OUTSIDE},
        {"no-window-freeing", no_argument, NULL, O_NO_WINDOW_FREEING},
        {"n", required_argument, NULL, O_N},
        {"beams", required_argument, NULL, O_BEAMS},
        {"arrival-rate", required_argument, NULL, O_ARRIVAL},
        {"mfu", required_argument, NULL, O_MFU},
        {"mbu", required_argument, NULL, O_MBU},
        {"link-bandwidth", required_argument, NULL, O_LINK},
        {"prefill-tokens-per-s", required_argument, NULL, O_PREFILL_RATE},
        {"host-bandwidth", required_argument, NULL, O_HOST_BW},
        {"nvme-bandwidth", required_argument, NULL, O_NVME_BW},
        {"network-bandwidth", required_argument, NULL, O_NET_BW},
        {"ssd-tbw", required_argument, NULL, O_SSD_TBW},
        {"ssd-write-rate", required_argument, NULL, O_SSD_RATE},
        {"spec-tokens", required_argument, NULL, O_SPEC_TOKENS},
        {"spec-acceptance", required_argument, NULL, O_SPEC_ACCEPT},
        {"tenant-tokens", required_argument, NULL, O_TENANT},
        {"json", no_argument, NULL, O_JSON},
        {"list", no_argument, NULL, O_LIST},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};

    kvc_plan_params_t p = kvc_plan_params_default();
    const char *model_arg = NULL, *gpu_arg = NULL;
    /* Explicit GPU numbers; NAN / 0 / UINT64_MAX: not given. */
    uint64_t g_mem = 0, g_l2 = UINT64_MAX;
    double g_bw = NAN, g_flops = NAN, g_fp8 = NAN, g_link = NAN, g_pcie = NAN;
    bool json = false, list = false;
    uint64_t u;
    double d;
    int ch;
    optind = 1;
    opterr = 0;
    int li = -1;
    optopt = 0;
    while ((ch = getopt_long(argc, argv, ":h", opts, &li)) != -1) {
        /* The option's name for messages: from the table when getopt matched one, else the
         * argument as typed (an unknown option, or one missing its value), cut at '='. */
        char opt_name[64];
        if (li >= 0 && ch != ':' && ch != '?')
            snprintf(opt_name, sizeof opt_name, "--%s", opts[li].name);
        else
            snprintf(opt_name, sizeof opt_name, "%s",
                     optind > 0 && optind <= argc ? argv[optind - 1] : "option");
        char *eq = strchr(opt_name, '=');
        if (eq) *eq = '\0';
        li = -1;
#define U64(lo, hi, field)                                                                      \
    do {                                                                                        \
        if (!kvc_cli_parse_u64(optarg, lo, hi, &u))                                             \
            return kvc_cli_error(CMD, "%s: '%s' is not a whole number in %llu..%llu", opt_name, \
                                 optarg, (unsigned long long)(lo), (unsigned long long)(hi));   \
        field = u;                                                                              \
    } while (0)
#define DBL(lo, hi, field)                                                                    \
    do {                                                                                      \
        if (!parse_double(optarg, lo, hi, &d))                                                \
            return kvc_cli_error(CMD, "%s: '%s' is not a number in %g..%g", opt_name, optarg, \
                                 (double)(lo), (double)(hi));                                 \
        field = d;                                                                            \
    } while (0)
#define SIZE(field)                                                                         \
    do {                                                                                    \
        if (kvc_plan_parse_bytes(optarg, &u))                                               \
            return kvc_cli_error(CMD, "%s: '%s' is not a size (e.g. 80GiB, 512MiB, 1.5e9)", \
                                 opt_name, optarg);                                         \
        field = u;                                                                          \
    } while (0)
#define RATE(field)                                                                              \
    do {                                                                                         \
        if (kvc_plan_parse_rate(optarg, &d) || !(d > 0))                                         \
            return kvc_cli_error(CMD, "%s: '%s' is not a positive rate (e.g. 3.35TB/s, 64GB/s)", \
                                 opt_name, optarg);                                              \
        field = d;                                                                               \
    } while (0)
        switch (ch) {
        case O_MODEL:
            model_arg = optarg;
            break;
        case O_GPU:
            gpu_arg = optarg;
            break;
        case O_GPU_MEMORY:
            SIZE(g_mem);
            if (!g_mem) return kvc_cli_error(CMD, "--gpu-memory: must be positive");
            break;
        case O_GPU_BANDWIDTH:
            RATE(g_bw);
            break;
        case O_GPU_FLOPS:
            DBL(1e-3, 1e7, g_flops);
            break;
        case O_GPU_FP8_FLOPS:
            DBL(0, 1e7, g_fp8);
            break;
        case O_GPU_L2:
            SIZE(g_l2);
            break;
        case O_GPU_INTERCONNECT:
            RATE(g_link);
            break;
        case O_GPU_PCIE:
            RATE(g_pcie);
            break;
        case O_TP:
            U64(1, 1024, p.tp);
            break;
        case O_PP:
            U64(1, 64, p.pp);
            break;
        case O_DP:
            U64(1, 65536, p.dp);
            break;
        case O_WEIGHT_DTYPE:
            if (kvc_plan_dtype_parse(optarg, &p.weight_dtype))
                return kvc_cli_error(CMD, "--weight-dtype: '%s' is not bf16, fp16, fp8 or int4",
                                     optarg);
            break;
        case O_KV_DTYPE:
            if (kvc_plan_dtype_parse(optarg, &p.kv_dtype) || p.kv_dtype == KVC_PLAN_INT4)
                return kvc_cli_error(CMD, "--kv-dtype: '%s' is not bf16, fp16 or fp8", optarg);
            break;
        case O_BLOCK_SIZE:
            U64(1, 1024, p.block_size);
            if (p.block_size & (p.block_size - 1))
                return kvc_cli_error(CMD, "--block-size: '%s' is not a power of two", optarg);
            break;
        case O_UTIL:
            DBL(1e-6, 1, p.gpu_memory_utilization);
            break;
        case O_MAX_MODEL_LEN:
            U64(1, UINT64_C(1) << 40, p.max_model_len);
            break;
        case O_MAX_NUM_SEQS:
            U64(1, 1u << 24, p.max_num_seqs);
            break;
        case O_MAX_BATCHED:
            U64(1, 1u << 30, p.max_num_batched_tokens);
            break;
        case O_PROMPT:
            U64(1, UINT64_C(1) << 40, p.prompt_tokens);
            break;
        case O_OUTPUT:
            U64(1, UINT64_C(1) << 40, p.output_tokens);
            break;
        case O_CONTEXT:
            U64(1, UINT64_C(1) << 40, p.context_tokens);
            break;
        case O_WEIGHT_MEM:
            SIZE(p.weight_bytes);
            break;
        case O_ACT_MEM:
            SIZE(p.activation_bytes);
            break;
        case O_GRAPH_MEM:
            SIZE(p.cuda_graph_bytes);
            break;
        case O_NON_TORCH_MEM:
            SIZE(p.non_torch_bytes);
            break;
        case O_CTX_MEM:
            SIZE(p.cuda_context_bytes);
            break;
        case O_KV_MEM:
            SIZE(p.kv_cache_bytes);
            break;
        case O_EAGER:
            p.enforce_eager = true;
            break;
        case O_GRAPHS_OUTSIDE:
            p.graphs_outside_budget = true;
            break;
        case O_NO_WINDOW_FREEING:
            p.window_freeing = false;
            break;
        case O_N:
            U64(1, 1024, p.n_samples);
            break;
        case O_BEAMS:
            U64(1, 1024, p.beams);
            break;
        case O_ARRIVAL:
            DBL(0, 1e9, p.arrival_rate);
            break;
        case O_MFU:
            DBL(1e-6, 1, p.mfu);
            break;
        case O_MBU:
            DBL(1e-6, 1, p.mbu);
            break;
        case O_LINK:
            RATE(p.link_bytes_per_s);
            break;
        case O_PREFILL_RATE:
            DBL(1e-9, 1e12, p.prefill_tokens_per_s);
            break;
        case O_HOST_BW:
            RATE(p.host_bytes_per_s);
            break;
        case O_NVME_BW:
            RATE(p.nvme_bytes_per_s);
            break;
        case O_NET_BW:
            RATE(p.network_bytes_per_s);
            break;
        case O_SSD_TBW:
            /* A bare number is terabytes written, as drives are rated. */
            if (parse_double(optarg, 1e-6, 1e9, &d)) {
                p.ssd_endurance_bytes = d * 1e12;
            } else {
                SIZE(u);
                if (!u) return kvc_cli_error(CMD, "--ssd-tbw: must be positive");
                p.ssd_endurance_bytes = (double)u;
            }
            break;
        case O_SSD_RATE:
            RATE(p.ssd_write_bytes_per_s);
            break;
        case O_SPEC_TOKENS:
            U64(0, 64, p.spec_tokens);
            break;
        case O_SPEC_ACCEPT:
            DBL(0, 0.999999, p.spec_acceptance);
            break;
        case O_TENANT:
            U64(1, UINT64_C(1) << 40, p.tenant_tokens);
            break;
        case O_JSON:
            json = true;
            break;
        case O_LIST:
            list = true;
            break;
        case 'h':
            help(stdout);
            return 0;
        case ':':
            return kvc_cli_error(CMD, "%s needs a value", opt_name);
        default:
            /* getopt_long reports "--json=x" with optopt set to the option it matched. */
            if (optopt >= O_MODEL) return kvc_cli_error(CMD, "%s takes no value", opt_name);
            return kvc_cli_error(CMD, "unknown option '%s' (try --help)", opt_name);
        }
#undef U64
#undef DBL
#undef SIZE
#undef RATE
    }
    if (optind < argc)
        return kvc_cli_error(CMD, "unexpected argument '%s' (try --help)", argv[optind]);
    if (list) {
        list_presets();
        return 0;
    }
    if (!model_arg) {
        char names[512];
        presets_line(names, sizeof names, true);
        return kvc_cli_error(CMD, "no --model: give a preset (%s) or a config.json path", names);
    }

    kvc_plan_gpu_t gpu = {0};
    if (gpu_arg) {
        if (kvc_plan_gpu_preset(gpu_arg, &gpu)) {
            char names[512];
            presets_line(names, sizeof names, false);
            return kvc_cli_error(CMD, "--gpu '%s': unknown preset (presets: %s)", gpu_arg, names);
        }
    } else {
        if (!g_mem || isnan(g_bw) || isnan(g_flops)) {
            char names[512];
            presets_line(names, sizeof names, false);
            return kvc_cli_error(CMD,
                                 "no --gpu: give a preset (%s) or --gpu-memory, --gpu-bandwidth "
                                 "and --gpu-flops",
                                 names);
        }
        snprintf(gpu.name, sizeof gpu.name, "custom GPU");
        gpu.pcie_bytes_per_s = 32e9; /* PCIe Gen4 x16, one direction, unless given */
    }
    if (g_mem) gpu.memory_bytes = g_mem;
    if (!isnan(g_bw)) gpu.hbm_bytes_per_s = g_bw;
    if (!isnan(g_flops)) gpu.bf16_flops = g_flops * 1e12;
    if (!isnan(g_fp8)) gpu.fp8_flops = g_fp8 * 1e12;
    if (g_l2 != UINT64_MAX) gpu.l2_bytes = g_l2;
    if (!isnan(g_link)) gpu.interconnect_bytes_per_s = g_link;
    if (!isnan(g_pcie)) gpu.pcie_bytes_per_s = g_pcie;

    kvc_plan_model_t model;
    if (load_model(model_arg, &model)) return 1;

    kvc_plan_result_t *r = malloc(sizeof *r);
    if (!r) return kvc_cli_error(CMD, "out of memory");
    char msg[512];
    int rc = kvc_plan_compute(&model, &gpu, &p, r, msg, sizeof msg);
    if (rc) {
        free(r);
        return kvc_cli_error(CMD, "%s", msg);
    }
    char *text = NULL;
    rc = json ? kvc_plan_render_json(r, &text) : kvc_plan_render_text(r, &text);
    const bool fits = r->fits;
    free(r);
    if (rc) return kvc_cli_error(CMD, "cannot render the plan: %s", kvc_strerror(rc));
    fputs(text, stdout);
    if (json) fputc('\n', stdout);
    kvc_plan_string_free(text);
    if (fflush(stdout) != 0)
        return kvc_cli_error(CMD, "cannot write the output: %s", strerror(errno));
    return fits ? 0 : 3;
}
