/* engine_opts.c - what `kvcache run` and `kvcache serve` share: the engine's options (one
 * table, one handler, the same messages) and loading a model (GGUF or llama2.c). */
#include "cli.h"
#include "kvcache/kvcache.h"
#include "kvcache/llama2c.h"

#include <string.h>
#include <strings.h>

const struct option kvc_cli_engine_options[] = {
    {"threads", required_argument, 0, KVC_CLI_ENGINE_THREADS},
    {"kv-dtype", required_argument, 0, KVC_CLI_ENGINE_KV_DTYPE},
    {"kv-memory", required_argument, 0, KVC_CLI_ENGINE_KV_MEMORY},
    {"ctx", required_argument, 0, KVC_CLI_ENGINE_CTX},
    {"block-size", required_argument, 0, KVC_CLI_ENGINE_BLOCK},
    {"max-seqs", required_argument, 0, KVC_CLI_ENGINE_MAX_SEQS},
    {"max-num-seqs", required_argument, 0, KVC_CLI_ENGINE_MAX_SEQS},
    {"batch-tokens", required_argument, 0, KVC_CLI_ENGINE_BATCH},
    {"max-num-batched-tokens", required_argument, 0, KVC_CLI_ENGINE_BATCH},
    {"chunk", required_argument, 0, KVC_CLI_ENGINE_CHUNK},
    {"no-kv-cache", no_argument, 0, KVC_CLI_ENGINE_NO_KV},
    {"no-prefix-cache", no_argument, 0, KVC_CLI_ENGINE_NO_PREFIX},
    {"no-batch-invariance", no_argument, 0, KVC_CLI_ENGINE_NO_BI},
    {"preemption", required_argument, 0, KVC_CLI_ENGINE_PREEMPT},
    {"isa", required_argument, 0, KVC_CLI_ENGINE_ISA},
    {"tier", required_argument, 0, KVC_CLI_ENGINE_TIER},
    {"tier-disk-write-budget", required_argument, 0, KVC_CLI_ENGINE_TIER_BUDGET},
    {"tier-admission", required_argument, 0, KVC_CLI_ENGINE_TIER_ADMISSION},
    {"tier-fetch", required_argument, 0, KVC_CLI_ENGINE_TIER_FETCH},
    {0, 0, 0, 0},
};

/* --tier's specs, in order: ep->tiers points here (the engine copies them at create). */
static kvc_tier_spec_t cli_tiers[KVC_ENGINE_MAX_TIERS];

int kvc_cli_engine_option(kvc_engine_params_t *ep, const char *cmd, int ch, const char *value)
{
    uint64_t u;
#define U64(name, lo, hi, dst)                                                                  \
    do {                                                                                        \
        if (!kvc_cli_parse_u64(value, lo, hi, &u))                                              \
            return kvc_cli_error(cmd, "--%s: '%s' is not a whole number in [%llu, %llu]", name, \
                                 value, (unsigned long long)(lo), (unsigned long long)(hi)),    \
                   -1;                                                                          \
        dst = u;                                                                                \
    } while (0)
    switch (ch) {
    case KVC_CLI_ENGINE_THREADS:
        U64("threads", 1, 256, ep->n_threads);
        return 1;
    case KVC_CLI_ENGINE_KV_DTYPE:
        if (kvc_dtype_parse(value, &ep->kv_dtype))
            return kvc_cli_error(
                       cmd, "--kv-dtype: '%s' is not f32, f16, bf16, fp8-e4m3 or fp8-e5m2", value),
                   -1;
        return 1;
    case KVC_CLI_ENGINE_KV_MEMORY:
        if (kvc_plan_parse_bytes(value, &u) || !u)
            return kvc_cli_error(cmd, "--kv-memory: '%s' is not a size (e.g. 512MiB)", value), -1;
        ep->kv_memory = u;
        return 1;
    case KVC_CLI_ENGINE_CTX:
        U64("ctx", 2, 1 << 24, ep->max_ctx);
        return 1;
    case KVC_CLI_ENGINE_BLOCK:
        U64("block-size", 1, 256, ep->block_size); /* a power of two: checked after parsing */
        return 1;
    case KVC_CLI_ENGINE_MAX_SEQS:
        U64("max-seqs", 1, 4096, ep->max_num_seqs);
        return 1;
    case KVC_CLI_ENGINE_BATCH:
        U64("batch-tokens", 1, 65536, ep->max_num_batched_tokens);
        return 1;
    case KVC_CLI_ENGINE_CHUNK:
        U64("chunk", 1, 65536, ep->max_prefill_chunk);
        return 1;
    case KVC_CLI_ENGINE_NO_KV:
        ep->no_kv_cache = true;
        return 1;
    case KVC_CLI_ENGINE_NO_PREFIX:
        ep->no_prefix_cache = true;
        return 1;
    case KVC_CLI_ENGINE_NO_BI:
        ep->no_batch_invariance = true;
        return 1;
    case KVC_CLI_ENGINE_PREEMPT:
        if (kvc_preemption_parse(value, &ep->preemption))
            return kvc_cli_error(cmd, "--preemption: '%s' is not recompute, swap or backpressure",
                                 value),
                   -1;
        return 1;
    case KVC_CLI_ENGINE_ISA:
        if (kvc_isa_parse(value, &ep->isa))
            return kvc_cli_error(cmd, "--isa: '%s' is not auto, scalar, avx2 or avx512", value), -1;
        return 1;
    case KVC_CLI_ENGINE_TIER: {
        char msg[256];
        if (ep->n_tiers >= KVC_ENGINE_MAX_TIERS)
            return kvc_cli_error(cmd, "--tier: at most %d tiers", KVC_ENGINE_MAX_TIERS), -1;
        if (kvc_tier_spec_parse(value, &cli_tiers[ep->n_tiers], msg, sizeof msg))
            return kvc_cli_error(cmd, "--tier: '%s': %s", value, msg), -1;
        ep->tiers = cli_tiers;
        ep->n_tiers++;
        return 1;
    }
    case KVC_CLI_ENGINE_TIER_BUDGET:
        if (kvc_tier_budget_parse(value, &ep->tier_disk_write_budget))
            return kvc_cli_error(cmd,
                                 "--tier-disk-write-budget: '%s' is not SIZE/day (e.g. 50GiB/day)",
                                 value),
                   -1;
        return 1;
    case KVC_CLI_ENGINE_TIER_ADMISSION:
        if (kvc_tier_admission_parse(value, &ep->tier_admission))
            return kvc_cli_error(cmd, "--tier-admission: '%s' is not always, second-hit or depth:N",
                                 value),
                   -1;
        return 1;
    case KVC_CLI_ENGINE_TIER_FETCH:
        if (!strcmp(value, "decide"))
            ep->tier_fetch = KVC_TIER_FETCH_DECIDE;
        else if (!strcmp(value, "always"))
            ep->tier_fetch = KVC_TIER_FETCH_ALWAYS;
        else if (!strcmp(value, "never"))
            ep->tier_fetch = KVC_TIER_FETCH_NEVER;
        else
            return kvc_cli_error(cmd, "--tier-fetch: '%s' is not decide, always or never", value),
                   -1;
        return 1;
    default:
        return 0;
    }
#undef U64
}

int kvc_cli_load_model(const char *cmd, const char *model_path, const char *tokenizer_path,
                       kvc_llm_t **out)
{
    char msg[512];
    int rc;
    *out = NULL;
    /* A GGUF by its magic; anything else is read as a llama2.c checkpoint. */
    /* (a file named .gguf, or one that cannot be read, goes to the GGUF reader, whose
     * message says what is wrong with it) */
    char magic[4] = {0};
    size_t got = 0, pl = strlen(model_path);
    FILE *mf = fopen(model_path, "rb");
    if (mf) got = fread(magic, 1, 4, mf), fclose(mf);
    if (!mf || (got == 4 && !memcmp(magic, "GGUF", 4)) ||
        (pl >= 5 && !strcasecmp(model_path + pl - 5, ".gguf"))) {
        if (tokenizer_path)
            return kvc_cli_error(cmd, "--tokenizer is for llama2.c checkpoints; %s is a GGUF",
                                 model_path);
        rc = kvc_llm_load(model_path, out, msg, sizeof msg);
    } else {
        char def[4096];
        if (!tokenizer_path) {
            const char *slash = strrchr(model_path, '/');
            int dl = slash ? (int)(slash - model_path + 1) : 0;
            snprintf(def, sizeof def, "%.*stokenizer.bin", dl, model_path);
            tokenizer_path = def;
        }
        kvc_gguf_t *g = NULL;
        rc = kvc_llama2c_open(model_path, tokenizer_path, NULL, &g, msg, sizeof msg);
        if (!rc) rc = kvc_llm_load_gguf(g, out, msg, sizeof msg);
    }
    if (rc) return kvc_cli_error(cmd, "%s: %s", model_path, msg);
    return 0;
}
