/* cmd_serve.c - `kvcache serve`: the OpenAI-compatible HTTP server over the CPU engine.
 * The CLI parses options, loads the model and the tenants file, and hands everything to the
 * server layer (kvcache/server.h); SIGINT / SIGTERM drain it. */
#include "cli.h"
#include "kvcache/kvcache.h"
#include "kvcache/server.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CMD "serve"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvcache serve --model FILE [options]\n\n"
            "Serve the model over an OpenAI-compatible HTTP API: POST /v1/completions and\n"
            "/v1/chat/completions (streaming or not), GET /v1/models, /health, /metrics.\n"
            "The engine is `kvcache run`'s: the same requests give the same outputs.\n\n"
            "server\n"
            "  --model FILE          a GGUF model, or a llama2.c checkpoint (.bin)\n"
            "  --tokenizer FILE      a llama2.c checkpoint's tokenizer\n"
            "  --served-model-name N the model id requests name (default: the file's name\n"
            "                        without its extension)\n"
            "  --host ADDR           address to bind (default 127.0.0.1)\n"
            "  --port N              port (default 8080; 0: any free port, printed)\n"
            "  --api-keys FILE       tenants: JSON object of API key -> {\"tenant\", \"cache\",\n"
            "                        \"cache_salt\", \"kv_token_quota\", \"priority\",\n"
            "                        \"max_prompt_tokens\", \"max_concurrent\"} (docs/server.md);\n"
            "                        without it no key is needed\n"
            "  --chat-template NAME  llama2, llama3, chatml, mistral, gemma, phi3 or zephyr\n"
            "                        (default: the model's, recognised by name)\n"
            "  --max-body SIZE       request body limit (default 1MiB): 413 beyond\n"
            "  --max-queued N        requests in flight before 503 (default 256)\n"
            "  --max-tokens-limit N  max_tokens above it: 400 (default: the context)\n"
            "  --drain-timeout S     seconds in-flight requests get after SIGINT/SIGTERM\n"
            "                        (default 30)\n"
            "  --log-format F        text (default) or json, one line per request on stderr\n"
            "engine (as kvcache run)\n"
            "  --threads N, --kv-dtype T, --kv-memory SIZE, --ctx N, --block-size N,\n"
            "  --max-num-seqs N (--max-seqs), --max-num-batched-tokens N (--batch-tokens),\n"
            "  --chunk N, --no-prefix-cache, --no-batch-invariance, --no-kv-cache,\n"
            "  --preemption P, --admission P (fcfs only), --isa ISA\n"
            "KV tiers (docs/tiers.md; as kvcache run)\n"
            "  --tier SPEC           host:SIZE, disk:PATH:SIZE or redis://HOST:PORT[/PREFIX]\n"
            "                        (repeatable, in lookup order, at most 4), each with an\n"
            "                        optional ,mode=evict|write-through ,bw=RATE ,rtt=TIME;\n"
            "                        replicas of one model on one Redis share its blocks\n"
            "  --tier-disk-write-budget SIZE/day, --tier-admission always|second-hit|depth:N,\n"
            "  --tier-fetch decide|always|never\n"
            "  -h, --help            this help\n");
}

enum {
    O_MODEL = 600,
    O_TOKENIZER,
    O_NAME,
    O_HOST,
    O_PORT,
    O_KEYS,
    O_TEMPLATE,
    O_MAX_BODY,
    O_MAX_QUEUED,
    O_MAX_TOKENS,
    O_DRAIN,
    O_LOG,
    O_ADMISSION,
};

static const struct option serve_options[] = {
    {"model", required_argument, 0, O_MODEL},
    {"tokenizer", required_argument, 0, O_TOKENIZER},
    {"served-model-name", required_argument, 0, O_NAME},
    {"host", required_argument, 0, O_HOST},
    {"port", required_argument, 0, O_PORT},
    {"api-keys", required_argument, 0, O_KEYS},
    {"chat-template", required_argument, 0, O_TEMPLATE},
    {"max-body", required_argument, 0, O_MAX_BODY},
    {"max-queued", required_argument, 0, O_MAX_QUEUED},
    {"max-tokens-limit", required_argument, 0, O_MAX_TOKENS},
    {"drain-timeout", required_argument, 0, O_DRAIN},
    {"log-format", required_argument, 0, O_LOG},
    {"admission", required_argument, 0, O_ADMISSION},
    {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0},
};

static kvc_server_t *g_server; /* for the signal handler only */

static void on_signal(int sig)
{
    (void)sig;
    kvc_server_stop(g_server); /* async-signal-safe: one write to a pipe */
}

static void log_line(void *ctx, const char *line)
{
    (void)ctx;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char when[32];
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    if (line[0] == '{') /* JSON lines stay JSON: the time goes in as a field */
        fprintf(stderr, "{\"time\": \"%s.%03ldZ\", %s\n", when, ts.tv_nsec / 1000000, line + 1);
    else
        fprintf(stderr, "%s.%03ldZ kvcache serve: %s\n", when, ts.tv_nsec / 1000000, line);
}

static char *read_file(const char *path, size_t max)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *b = malloc(max + 1);
    size_t n = b ? fread(b, 1, max + 1, f) : 0;
    fclose(f);
    if (!b || n > max) {
        free(b);
        errno = EFBIG;
        return NULL;
    }
    b[n] = 0;
    return b;
}

int kvc_cmd_serve(int argc, char **argv)
{
    const char *model_path = NULL, *tokenizer_path = NULL, *keys_path = NULL, *name = NULL;
    const char *template_name = NULL;
    kvc_engine_params_t ep = kvc_engine_params_default();
    kvc_server_params_t sp = kvc_server_params_default();
    uint64_t u;
    double d;
    optind = 1;
    opterr = 0;
    struct option options[KVC_CLI_MAX_OPTIONS];
    if (kvc_cli_join_options(options, KVC_CLI_MAX_OPTIONS, serve_options, kvc_cli_engine_options))
        return kvc_cli_error(CMD, "internal: too many options");
    int c;
    while ((c = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        const int eo = kvc_cli_engine_option(&ep, CMD, c, optarg);
        if (eo < 0) return 1;
        if (eo) continue;
        switch (c) {
        case O_MODEL:
            model_path = optarg;
            break;
        case O_TOKENIZER:
            tokenizer_path = optarg;
            break;
        case O_NAME:
            if (!optarg[0] || strlen(optarg) > 200)
                return kvc_cli_error(CMD, "--served-model-name: 1 to 200 bytes");
            name = optarg;
            break;
        case O_HOST:
            sp.host = optarg;
            break;
        case O_PORT:
            if (!kvc_cli_parse_u64(optarg, 0, 65535, &u))
                return kvc_cli_error(CMD, "--port: '%s' is not a port in [0, 65535]", optarg);
            sp.port = (uint16_t)u;
            break;
        case O_KEYS:
            keys_path = optarg;
            break;
        case O_TEMPLATE:
            template_name = optarg;
            if (kvc_chat_template_parse(optarg, &sp.chat_template))
                return kvc_cli_error(CMD,
                                     "--chat-template: '%s' is not llama2, llama3, chatml, "
                                     "mistral, gemma, phi3 or zephyr",
                                     optarg);
            sp.has_chat_template = true;
            break;
        case O_MAX_BODY:
            if (kvc_plan_parse_bytes(optarg, &u) || !u || u > (1ull << 30))
                return kvc_cli_error(CMD, "--max-body: '%s' is not a size up to 1GiB", optarg);
            sp.max_body_bytes = u;
            break;
        case O_MAX_QUEUED:
            if (!kvc_cli_parse_u64(optarg, 1, 1 << 20, &u))
                return kvc_cli_error(CMD, "--max-queued: '%s' is not a whole number in [1, %u]",
                                     optarg, 1u << 20);
            sp.max_queued = (uint32_t)u;
            break;
        case O_MAX_TOKENS:
            if (!kvc_cli_parse_u64(optarg, 1, 1 << 24, &u))
                return kvc_cli_error(CMD,
                                     "--max-tokens-limit: '%s' is not a whole number in [1, %u]",
                                     optarg, 1u << 24);
            sp.max_tokens_limit = (uint32_t)u;
            break;
        case O_DRAIN:
            if (!kvc_cli_parse_double(optarg, 0, 86400, &d))
                return kvc_cli_error(CMD, "--drain-timeout: '%s' is not seconds in [0, 86400]",
                                     optarg);
            sp.drain_timeout_s = d;
            break;
        case O_LOG:
            if (strcmp(optarg, "text") && strcmp(optarg, "json"))
                return kvc_cli_error(CMD, "--log-format: '%s' is not text or json", optarg);
            sp.log_json = !strcmp(optarg, "json");
            break;
        case O_ADMISSION:
            /* the engine admits first come, first served (within priority classes) */
            if (strcmp(optarg, "fcfs"))
                return kvc_cli_error(CMD, "--admission: '%s' is not fcfs (the engine's only one)",
                                     optarg);
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            return kvc_cli_getopt_error(CMD, argv, O_MODEL);
        }
    }
    if (optind < argc) return kvc_cli_error(CMD, "unexpected argument '%s'", argv[optind]);
    if (!model_path) return kvc_cli_error(CMD, "--model FILE is required (see --help)");
    if (ep.block_size & (ep.block_size - 1))
        return kvc_cli_error(CMD, "--block-size: a power of two");
    char *keys = NULL;
    if (keys_path && !(keys = read_file(keys_path, 16 << 20)))
        return kvc_cli_error(CMD, "--api-keys %s: %s", keys_path, strerror(errno));
    sp.api_keys_json = keys;

    kvc_llm_t *m = NULL;
    if (kvc_cli_load_model(CMD, model_path, tokenizer_path, &m)) {
        free(keys);
        return 1;
    }
    if (!template_name)
        sp.has_chat_template = !kvc_chat_template_from_gguf(kvc_llm_gguf(m), &sp.chat_template);
    char base[256];
    if (!name) { /* the file's name without its folder and extension */
        const char *b = strrchr(model_path, '/');
        b = b ? b + 1 : model_path;
        snprintf(base, sizeof base, "%s", b);
        char *dot = strrchr(base, '.');
        if (dot && dot != base) *dot = 0;
        name = base;
    }
    sp.model_name = name;
    sp.log = log_line;
    char msg[512];
    kvc_server_t *s = NULL;
    int rc = kvc_server_create(m, &ep, &sp, &s, msg, sizeof msg);
    free(keys);
    if (rc) {
        kvc_llm_free(m);
        return kvc_cli_error(CMD, "%s", msg);
    }
    g_server = s;
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN); /* a client gone mid-write is an error code, not a death */
    fprintf(stderr, "kvcache serve: %s on http://%s:%u (model '%s'%s%s)\n", model_path, sp.host,
            kvc_server_port(s), name,
            sp.has_chat_template ? ", chat template " : ", no chat template",
            sp.has_chat_template ? kvc_chat_template_name(sp.chat_template) : "");
    fflush(stderr);
    rc = kvc_server_run(s);
    if (rc)
        kvc_cli_error(CMD, "%s", kvc_strerror(rc));
    else
        fprintf(stderr, "kvcache serve: drained, exiting\n");
    g_server = NULL;
    kvc_server_destroy(s);
    kvc_llm_free(m);
    return rc ? 1 : 0;
}
