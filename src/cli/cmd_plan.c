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
    O_PROMPT = KVC_CLI_PLAN_FIRST,
    O_OUTPUT,
    O_CONTEXT,
    O_N,
    O_BEAMS,
    O_ARRIVAL,
    O_LINK,
    O_PREFILL_RATE,
    O_HOST_BW,
    O_NVME_BW,
    O_NET_BW,
    O_SSD_TBW,
    O_SSD_RATE,
    O_TENANT,
    O_DRAFT_PARAMS,
    O_ROPE,
    O_CP,
    O_NODE,
    O_GRID,
    O_LORA_RANK,
    O_LORA_ADAPTERS,
    O_LORA_RESIDENT,
    O_SSM_DTYPE,
    O_CHECKPOINT,
    O_CACHED_PREFIXES,
    O_IMAGES,
    O_ENCODER_CACHE,
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
        "decoding, and tenancy; then, where they apply, long context (13), the dtype grid (14),\n"
        "a recurrent model's state (15) and a multimodal model's encoder (16).\n"
        "\n"
        "model and hardware:\n"
        "  --model NAME|PATH          a preset (see --list) or a Hugging Face config.json\n"
        "  --gpu NAME                 a preset: a100-80gb-sxm, a100-40gb, h100-sxm, h100-pcie, "
        "h200,\n"
        "                             b200,\n"
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
        "  --cp N                     context parallel ranks (ring attention): each holds 1/N of\n"
        "                             a request's KV (default 1)\n"
        "  --gpus-per-node N          a TP x CP group past it rings over --link-bandwidth (8)\n"
        "  --rope-scaling TYPE:F      linear, yarn or llama3 by factor F: --max-model-len up to\n"
        "                             F x max_position_embeddings\n"
        "  --weight-dtype T           bf16 (default), fp16, fp8, int8, int4, nvfp4\n"
        "  --kv-dtype T               bf16 (default), fp16, fp8, int8, nvfp4 (9 B per 16)\n"
        "  --block-size N             tokens per KV block, a power of two (default 16)\n"
        "  --gpu-memory-utilization F share of memory the engine budgets (default 0.9)\n"
        "  --max-model-len N          default: the model's max_position_embeddings\n"
        "  --max-num-seqs N           default: vLLM's for the GPU (1024 on 70 GiB or more unless\n"
        "                             an A100, else 256; EngineArgs.get_batch_defaults)\n"
        "  --max-num-batched-tokens N the step's token budget (default: vLLM's, 8192 or 2048)\n"
        "  --prompt N, --output N     the typical request (default 1000 and 200 tokens; --output "
        "0\n"
        "                             is a prefill-only request)\n"
        "                             token counts take vLLM's suffixes: 32k = 32,000, 32K =\n"
        "                             32,768, 1M = 1,048,576\n"
        "  --context N                context for sections 5 and 6 (default prompt + output)\n"
        "  --no-window-freeing        size sliding-window layers like full ones\n"
        "engine measurements (replace an estimate; SIZE like 14.96GiB):\n"
        "  --weight-memory SIZE, --activation-memory SIZE, --cuda-graph-memory SIZE,\n"
        "  --non-torch-memory SIZE, --cuda-context-memory SIZE\n"
        "  --kv-cache-memory SIZE     an explicit KV budget (utilization then unused)\n"
        "  --enforce-eager            no CUDA graphs\n"
        "  --graphs-outside-budget    graphs captured after the pool (older engines)\n");
    fprintf(
        f, "sections 7-12:\n"
           "  --n N, --beams N           parallel samples and beam width (default 4 and 4)\n"
           "  --link-bandwidth RATE      prefill-to-decode link per GPU (default 50GB/s)\n"
           "  --prefill-tokens-per-s F   measured prefill rate per replica (default: estimated)\n"
           "  --host-bandwidth RATE      host memory tier (default: the GPU's PCIe link)\n"
           "  --nvme-bandwidth RATE      local NVMe tier per GPU (default 7GB/s)\n"
           "  --network-bandwidth RATE   remote KV store per GPU (default 12.5GB/s)\n"
           "  --ssd-tbw SIZE             SSD rated write volume (default 7008TB; bare number: TB)\n"
           "  --ssd-write-rate RATE      KV written to the SSD (default: a prefill GPU's output)\n"
           "  --arrival-rate F           requests per second, whole deployment (default: half the\n"
           "                             sustainable rate)\n"
           "  --mfu F, --mbu F           achieved share of peak FLOP/s and bandwidth (0.5, 0.8)\n"
           "  --spec-tokens N            draft tokens per sequence and step (default 0)\n"
           "  --spec-acceptance F        per-token acceptance rate, 0..1 (default 0.7)\n"
           "  --spec-draft-params N      the draft model's parameters (default 0: prompt lookup)\n"
           "  --tenant-tokens N          one more request length to price in section 12\n"
           "  --lora-rank R, --lora-adapters N, --lora-resident M\n"
           "                             S-LoRA adapters: M of N resident, taken from the KV pool\n"
           "  --grid dtypes              every weight dtype x KV dtype pair: starts, pool, "
           "concurrency\n"
           "recurrent and hybrid models (Jamba, Mamba-2, Nemotron-H, Qwen3-Next; section 15):\n"
           "  --mamba-ssm-cache-dtype T  the SSM or DeltaNet state's dtype: auto (16 bits) or "
           "float32\n"
           "  --state-checkpoint-interval N  tokens between the states prefix caching keeps "
           "(512)\n"
           "  --cached-prefixes N        cached prompts to price (default 100)\n"
           "multimodal models (section 16):\n"
           "  --images-per-request N     images in the typical request (default 1)\n"
           "  --encoder-cache-tokens N   the encoder's budget in embedding tokens (default\n"
           "                             max(max_num_batched_tokens, image tokens), as vLLM)\n"
           "output:\n"
           "  --json                     one JSON object (keys in docs/plan.md)\n"
           "  --list                     the model and GPU presets\n"
           "  -h, --help                 this help\n"
           "\n"
           "exit status: 0 when the deployment starts, 3 when it does not, 1 for bad input.\n");
}

/* What the command line asked for beyond the deployment. */
typedef struct {
    kvc_cli_deploy_t dep;
    bool json, list;
} plan_args_t;

static const struct option own_options[] = {
    {"prompt", required_argument, NULL, O_PROMPT},
    {"output", required_argument, NULL, O_OUTPUT},
    {"context", required_argument, NULL, O_CONTEXT},
    {"n", required_argument, NULL, O_N},
    {"beams", required_argument, NULL, O_BEAMS},
    {"arrival-rate", required_argument, NULL, O_ARRIVAL},
    {"link-bandwidth", required_argument, NULL, O_LINK},
    {"prefill-tokens-per-s", required_argument, NULL, O_PREFILL_RATE},
    {"host-bandwidth", required_argument, NULL, O_HOST_BW},
    {"nvme-bandwidth", required_argument, NULL, O_NVME_BW},
    {"network-bandwidth", required_argument, NULL, O_NET_BW},
    {"ssd-tbw", required_argument, NULL, O_SSD_TBW},
    {"ssd-write-rate", required_argument, NULL, O_SSD_RATE},
    {"tenant-tokens", required_argument, NULL, O_TENANT},
    {"spec-draft-params", required_argument, NULL, O_DRAFT_PARAMS},
    {"rope-scaling", required_argument, NULL, O_ROPE},
    {"cp", required_argument, NULL, O_CP},
    {"gpus-per-node", required_argument, NULL, O_NODE},
    {"grid", required_argument, NULL, O_GRID},
    {"lora-rank", required_argument, NULL, O_LORA_RANK},
    {"lora-adapters", required_argument, NULL, O_LORA_ADAPTERS},
    {"lora-resident", required_argument, NULL, O_LORA_RESIDENT},
    {"mamba-ssm-cache-dtype", required_argument, NULL, O_SSM_DTYPE},
    {"state-checkpoint-interval", required_argument, NULL, O_CHECKPOINT},
    {"cached-prefixes", required_argument, NULL, O_CACHED_PREFIXES},
    {"images-per-request", required_argument, NULL, O_IMAGES},
    {"encoder-cache-tokens", required_argument, NULL, O_ENCODER_CACHE},
    {"json", no_argument, NULL, O_JSON},
    {"list", no_argument, NULL, O_LIST},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0}};

/* One of plan's own options (not a shared deployment one): 0 handled, -1 after
 * --help (printed: exit 0), else the exit status with the one-line error printed. */
static int own_option(plan_args_t *a, int ch, const char *opt_name, const char *arg)
{
    kvc_plan_params_t *pp = &a->dep.p;
    uint64_t u;
    double d;
#define U64(lo, hi, field)                                              \
    do {                                                                \
        if (!kvc_cli_opt_u64(CMD, opt_name, arg, lo, hi, &u)) return 1; \
        field = u;                                                      \
    } while (0)
#define TOK(lo, hi, field)                                                 \
    do {                                                                   \
        if (!kvc_cli_opt_tokens(CMD, opt_name, arg, lo, hi, &u)) return 1; \
        field = u;                                                         \
    } while (0)
#define DBL(lo, hi, field)                                                 \
    do {                                                                   \
        if (!kvc_cli_opt_double(CMD, opt_name, arg, lo, hi, &d)) return 1; \
        field = d;                                                         \
    } while (0)
#define SIZE(field)                                                                         \
    do {                                                                                    \
        if (kvc_plan_parse_bytes(arg, &u))                                                  \
            return kvc_cli_error(CMD, "%s: '%s' is not a size (e.g. 80GiB, 512MiB, 1.5e9)", \
                                 opt_name, arg);                                            \
        field = u;                                                                          \
    } while (0)
#define RATE(field)                                                                              \
    do {                                                                                         \
        if (kvc_plan_parse_rate(arg, &d) || !(d > 0))                                            \
            return kvc_cli_error(CMD, "%s: '%s' is not a positive rate (e.g. 3.35TB/s, 64GB/s)", \
                                 opt_name, arg);                                                 \
        field = d;                                                                               \
    } while (0)
    switch (ch) {
    case O_PROMPT:
        TOK(1, KVC_PLAN_MAX_TOKENS, pp->prompt_tokens);
        break;
    case O_OUTPUT: /* 0: prefill only, as a disaggregated prefill node runs */
        TOK(0, KVC_PLAN_MAX_TOKENS, pp->output_tokens);
        break;
    case O_CONTEXT:
        TOK(1, KVC_PLAN_MAX_TOKENS, pp->context_tokens);
        break;
    case O_N:
        U64(1, KVC_PLAN_MAX_FORKS, pp->n_samples);
        break;
    case O_BEAMS:
        U64(1, KVC_PLAN_MAX_FORKS, pp->beams);
        break;
    case O_ARRIVAL:
        DBL(0, 1e9, pp->arrival_rate);
        break;
    case O_LINK:
        RATE(pp->link_bytes_per_s);
        break;
    case O_PREFILL_RATE:
        DBL(1e-9, 1e12, pp->prefill_tokens_per_s);
        break;
    case O_HOST_BW:
        RATE(pp->host_bytes_per_s);
        break;
    case O_NVME_BW:
        RATE(pp->nvme_bytes_per_s);
        break;
    case O_NET_BW:
        RATE(pp->network_bytes_per_s);
        break;
    case O_SSD_TBW:
        /* A bare number is terabytes written, as drives are rated. */
        if (kvc_cli_parse_double(arg, 1e-6, 1e9, &d)) {
            pp->ssd_endurance_bytes = d * 1e12;
        } else {
            SIZE(u);
            if (!u) return kvc_cli_error(CMD, "--ssd-tbw: must be positive");
            pp->ssd_endurance_bytes = (double)u;
        }
        break;
    case O_SSD_RATE:
        RATE(pp->ssd_write_bytes_per_s);
        break;
    case O_TENANT:
        TOK(1, KVC_PLAN_MAX_TOKENS, pp->tenant_tokens);
        break;
    case O_ROPE:
        if (kvc_plan_rope_parse(arg, &pp->rope_scaling, &pp->rope_factor))
            return kvc_cli_error(CMD,
                                 "%s: '%s' is not TYPE:FACTOR (linear, yarn or llama3, a factor "
                                 "above 1 and at most 1024; e.g. yarn:8)",
                                 opt_name, arg);
        break;
    case O_CP:
        U64(1, 1024, pp->cp);
        break;
    case O_NODE:
        U64(1, 1024, pp->gpus_per_node);
        break;
    case O_LORA_RANK:
        U64(1, KVC_PLAN_MAX_RANK, pp->lora_rank);
        break;
    case O_LORA_ADAPTERS:
        U64(1, 1u << 20, pp->lora_adapters);
        break;
    case O_LORA_RESIDENT:
        U64(0, 1u << 20, pp->lora_resident);
        break;
    case O_SSM_DTYPE:
        if (!strcmp(arg, "float32") || !strcmp(arg, "fp32"))
            pp->ssm_state_fp32 = true;
        else if (!strcmp(arg, "auto") || !strcmp(arg, "bfloat16") || !strcmp(arg, "bf16"))
            pp->ssm_state_fp32 = false;
        else
            return kvc_cli_error(CMD, "%s: '%s' is not auto, bfloat16 or float32", opt_name, arg);
        break;
    case O_CHECKPOINT:
        TOK(1, KVC_PLAN_MAX_TOKENS, pp->state_checkpoint_interval);
        break;
    case O_CACHED_PREFIXES:
        U64(1, KVC_PLAN_MAX_TOKENS, pp->cached_prefixes);
        break;
    case O_IMAGES:
        U64(1, 4096, pp->images_per_request);
        break;
    case O_ENCODER_CACHE:
        TOK(1, KVC_PLAN_MAX_TOKENS, pp->encoder_cache_tokens);
        break;
    case O_GRID:
        if (strcmp(arg, "dtypes"))
            return kvc_cli_error(CMD, "%s: '%s' is not a grid (the one there is: dtypes)", opt_name,
                                 arg);
        pp->grid_dtypes = true;
        break;
    case O_DRAFT_PARAMS:
        if (kvc_cli_parse_double(arg, 0, (double)KVC_PLAN_MAX_PARAMS, &d)) {
            pp->spec_draft_params = (uint64_t)d;
        } else {
            return kvc_cli_error(CMD, "%s: '%s' is not a parameter count (e.g. 1e9, 68000000)",
                                 opt_name, arg);
        }
        break;
    case O_JSON:
        a->json = true;
        break;
    case O_LIST:
        a->list = true;
        break;
    case 'h':
        help(stdout);
        return -1;
    default:
        return kvc_cli_bad_option(CMD, ch, opt_name);
    }
#undef U64
#undef TOK
#undef DBL
#undef SIZE
#undef RATE
    return 0;
}

/* Every option, before anything is printed: 0 to go on, -1 to exit 0 (--help), else
 * the exit status. */
static int parse_args(plan_args_t *a, int argc, char **argv)
{
    struct option opts[KVC_CLI_MAX_OPTIONS];
    kvc_cli_join_options(opts, KVC_CLI_MAX_OPTIONS, kvc_cli_deploy_options, own_options);
    kvc_cli_deploy_init(&a->dep);
    a->json = a->list = false;
    int ch;
    optind = 1;
    opterr = 0;
    int li = -1;
    optopt = 0;
    while ((ch = getopt_long(argc, argv, ":h", opts, &li)) != -1) {
        /* The option's name for messages: from the table when getopt matched one, else the
         * argument as typed (an unknown option, or one missing its value), cut at '='. */
        char opt_name[64];
        kvc_cli_opt_name(opt_name, sizeof opt_name, opts, li, ch, argc, argv);
        li = -1;
        int handled = kvc_cli_deploy_option(&a->dep, CMD, ch, opt_name, optarg);
        if (handled < 0) return 1;
        if (handled) continue;
        int rc = own_option(a, ch, opt_name, optarg);
        if (rc) return rc;
    }
    if (optind < argc)
        return kvc_cli_error(CMD, "unexpected argument '%s' (try --help)", argv[optind]);
    return 0;
}

/* Plan and print the result; exit 0 when it starts, 3 when it does not. */
static int plan_and_print(const kvc_plan_model_t *model, const kvc_plan_gpu_t *gpu,
                          const kvc_plan_params_t *params, bool json)
{
    kvc_plan_result_t *r = malloc(sizeof *r);
    if (!r) return kvc_cli_error(CMD, "out of memory");
    char msg[512];
    int rc = kvc_plan_compute(model, gpu, params, r, msg, sizeof msg);
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

int kvc_cmd_plan(int argc, char **argv)
{
    plan_args_t a;
    int rc = parse_args(&a, argc, argv);
    if (rc) return rc < 0 ? 0 : rc;
    if (a.list) {
        kvc_cli_list_presets();
        return 0;
    }
    kvc_plan_model_t model;
    kvc_plan_gpu_t gpu;
    if (kvc_cli_deploy_resolve(&a.dep, CMD, &model, &gpu)) return 1;
    return plan_and_print(&model, &gpu, &a.dep.p, a.json);
}
