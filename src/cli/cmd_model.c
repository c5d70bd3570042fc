/* cmd_model.c - `kvcache model info FILE`: what a GGUF model file holds (its container,
 * the model's hyperparameters as the engine and the planner read them, its tokenizer, its
 * tensors by type) and the KV bytes per token the planner computes for it; a llama2.c
 * checkpoint is described as the GGUF it becomes.  `kvcache model convert` writes a GGUF
 * as a llama2.c checkpoint, `kvcache model synth` a random-weight model. */
#include "cli.h"
#include "kvcache/kvcache.h"
#include "util/fmt.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define CMD "model"

static void usage(FILE *f)
{
    fprintf(f, "usage: kvcache model info FILE.gguf [--tensors]\n"
               "       kvcache model info FILE.bin [--tokenizer TOKENIZER.bin] [--tensors]\n"
               "       kvcache model convert IN.gguf -o OUT.bin [--tokenizer-out TOKENIZER.bin]\n"
               "       kvcache model synth --vocab VOCAB.gguf -o OUT.gguf [options]\n\n"
               "What a GGUF model file holds: its format, the model's hyperparameters (read from\n"
               "the metadata alone), its tokenizer, its tensors by type and size, and the KV\n"
               "bytes per token `kvcache plan` computes for it.  Every count, length, offset\n"
               "and shape in the file is checked against the file before use.\n\n"
               "  --tensors    also list every tensor: name, type, shape, bytes\n"
               "  --tokenizer TOKENIZER.bin\n"
               "               a llama2.c checkpoint's tokenizer (FILE.bin is read as a llama2.c\n"
               "               checkpoint, the legacy layout, and shown as the GGUF it becomes)\n\n"
               "convert writes a llama GGUF (any weight type, dequantized to f32) as a llama2.c\n"
               "checkpoint in the legacy layout (a negative vocab size when output.weight is\n"
               "not the embedding), and its vocabulary as a llama2.c tokenizer.bin.\n\n"
               "usage: kvcache model synth --vocab VOCAB.gguf -o OUT.gguf [options]\n\n"
               "synth writes a random-weight model (weights uniform in +-1/sqrt(fan-in) from\n"
               "--seed) with llama.cpp's metadata and tensor names, its tokenizer copied from\n"
               "VOCAB.gguf.  The same options write the same file.\n"
               "  --arch A            llama, qwen2 (QKV bias), qwen3 (Q/K RMSNorm per head),\n"
               "                      gemma2 (extra norms, soft-caps, even layers slide); llama\n"
               "  --dim, --layers, --heads, --kv-heads, --ff N   512, 8, 8, 4, 1536\n"
               "  --head-dim N        dim / heads\n"
               "  --ctx N             context length; 2048\n"
               "  --dtype T           f32, f16, bf16, q8_0, q4_0, q4_K, q6_K; q8_0\n"
               "  --seed N, --name S  1, kvcache-synth\n"
               "  --tied              no output.weight: the LM head is the embedding\n"
               "  --norm-jitter X     norms 1 + U(-X, X); 0 for llama, 0.1 for the others\n"
               "  --sliding-window N  llama: every layer (Mistral); gemma2: even layers (4096)\n"
               "  --attn-softcap X, --final-softcap X   gemma2's; 50 and 30 (0: off)\n"
               "  --rope-scaling S    none, linear, yarn, llama3 (the rope_freqs tensor); none\n"
               "  --rope-factor X     4 (linear, yarn), 8 (llama3)\n"
               "  --rope-orig-ctx N   yarn: none (the context length); llama3: 8192\n"
               "  --rope-theta X      10000\n\n"
               "  -h, --help   this help\n");
}

/* s as printable text, at most `max` bytes (control bytes and invalid UTF-8 escaped). */
static void put_str(kvc_gguf_str_t s, size_t max)
{
    size_t n = s.len < max ? (size_t)s.len : max;
    char *e = malloc(KVC_CLI_ESCAPED_MAX(n));
    if (!e) return;
    kvc_cli_escape(e, s.s, n);
    fputs(e, stdout);
    if (s.len > max) fputs("...", stdout);
    free(e);
}

static void print_tokenizer(const kvc_gguf_t *g)
{
    kvc_gguf_str_t s;
    printf("tokenizer    ");
    if (kvc_gguf_get_str(g, "tokenizer.ggml.model", &s)) {
        printf("none in the file\n");
        return;
    }
    put_str(s, 32);
    if (kvc_gguf_str_eq(s, "llama")) printf(" (SentencePiece)");
    if (kvc_gguf_str_eq(s, "gpt2")) printf(" (byte-level BPE)");
    kvc_gguf_arr_t a;
    uint64_t n_tokens = 0;
    if (kvc_gguf_get_arr(g, "tokenizer.ggml.tokens", &a) == 0)
        printf(", %" PRIu64 " tokens", n_tokens = a.n);
    if (kvc_gguf_get_arr(g, "tokenizer.ggml.merges", &a) == 0) printf(", %" PRIu64 " merges", a.n);
    if (kvc_gguf_get_str(g, "tokenizer.ggml.pre", &s) == 0) {
        printf(", pre-tokenizer ");
        put_str(s, 32);
    }
    static const struct {
        const char *key, *label;
    } ids[] = {{"tokenizer.ggml.bos_token_id", "bos"},
               {"tokenizer.ggml.eos_token_id", "eos"},
               {"tokenizer.ggml.unknown_token_id", "unk"},
               {"tokenizer.ggml.padding_token_id", "pad"}};
    for (size_t i = 0; i < KVC_ARRAY_LEN(ids); i++) {
        uint64_t v;
        if (kvc_gguf_get_u64(g, ids[i].key, &v) == 0) {
            if (v < n_tokens)
                printf(", %s %" PRIu64, ids[i].label, v);
            else /* llama.cpp's converters write -1 (as 2^32 - 1) for "none" */
                printf(", %s none", ids[i].label);
        }
    }
    bool b;
    if (kvc_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b) == 0)
        printf(", add_bos %s", b ? "yes" : "no");
    if (kvc_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &b) == 0)
        printf(", add_eos %s", b ? "yes" : "no");
    printf("%s\n", kvc_gguf_find(g, "tokenizer.chat_template") >= 0 ? ", a chat template" : "");
}

static void print_tensors(const kvc_gguf_t *g, bool each)
{
    uint64_t count[KVC_GGML_TYPE__END] = {0}, bytes[KVC_GGML_TYPE__END] = {0}, total = 0;
    for (uint64_t i = 0; i < kvc_gguf_n_tensors(g); i++) {
        const kvc_gguf_tensor_t *t = kvc_gguf_tensor(g, i);
        count[t->type]++; /* the reader knows every type it accepted: < KVC_GGML_TYPE__END */
        bytes[t->type] += t->bytes;
        total += t->bytes;
    }
    char hb[32];
    kvc__fmt_iec(hb, sizeof hb, (double)total);
    printf("tensors      %" PRIu64 " (%s):", kvc_gguf_n_tensors(g), hb);
    for (uint32_t ty = 0; ty < KVC_GGML_TYPE__END; ty++) {
        if (!count[ty]) continue;
        kvc__fmt_iec(hb, sizeof hb, (double)bytes[ty]);
        printf(" %s %" PRIu64 " (%s)", kvc_ggml_type_name(ty), count[ty], hb);
    }
    printf("\n");
    if (!each) return;
    for (uint64_t i = 0; i < kvc_gguf_n_tensors(g); i++) {
        const kvc_gguf_tensor_t *t = kvc_gguf_tensor(g, i);
        printf("  ");
        put_str(t->name, KVC_GGUF_MAX_NAME);
        printf("  %s [", kvc_ggml_type_name(t->type));
        for (uint32_t d = 0; d < t->n_dims; d++) printf("%s%" PRIu64, d ? ", " : "", t->ne[d]);
        printf("]  %" PRIu64 " bytes\n", t->bytes);
    }
}

static void print_hparams(const kvc_model_hparams_t *h)
{
    printf("model        %s", kvc_arch_name(h->arch));
    if (h->name[0]) printf(" \"%s\"", h->name);
    printf("\n  layers %u, hidden %u, heads %u, KV heads %u, head dim %u", h->n_layers, h->dim,
           h->n_heads, h->n_kv_heads, h->head_dim);
    if (h->v_head_dim != h->head_dim) printf(" (values %u)", h->v_head_dim);
    printf(", FFN %u, vocab %u, context %" PRIu64 "\n", h->ff, h->vocab, h->ctx);
    printf("  RMSNorm eps %g, RoPE theta %g on %u dims, scaling %s", h->rms_eps, h->rope_theta,
           h->rope_dim, kvc_rope_scaling_name(h->rope_scaling));
    if (h->rope_scaling == KVC_ROPE_SCALING_LINEAR || h->rope_scaling == KVC_ROPE_SCALING_YARN)
        printf(" x%g", h->rope_factor);
    printf("\n  embeddings %s", h->tied ? "tied to the output" : "separate from the output");
    if (h->qkv_bias) printf(", QKV bias");
    if (h->qk_norm) printf(", Q/K RMSNorm per head");
    if (h->sliding_window)
        printf(", sliding window %u on %u of %u layers%s", h->sliding_window, h->n_sliding_layers,
               h->n_layers, h->sliding_even_layers ? " (even layers)" : "");
    if (h->attn_softcap > 0) printf(", attention soft-cap %g", h->attn_softcap);
    if (h->final_softcap > 0) printf(", logit soft-cap %g", h->final_softcap);
    printf("\n");
}

static void print_kv(const kvc_model_hparams_t *h)
{
    kvc_plan_model_t pm;
    kvc_model_hparams_to_plan(h, "model", &pm);
    const uint64_t bf16 = kvc_plan_kv_bytes_per_token(&pm, KVC_PLAN_BF16);
    const uint64_t fp8 = kvc_plan_kv_bytes_per_token(&pm, KVC_PLAN_FP8);
    char full[32];
    kvc__fmt_iec(full, sizeof full, (double)(bf16 * h->ctx));
    printf("KV cache     %" PRIu64 " bytes per token in 16 bits (%" PRIu64
           " in fp8): 2 x %u layers x %u KV heads x %u dims; a full %" PRIu64
           "-token context holds %s\n",
           bf16, fp8, h->n_layers, h->n_kv_heads, h->head_dim, h->ctx, full);
}

/* A llama2.c checkpoint: named .bin and not a GGUF (the format has no magic of its own). */
static bool is_llama2c(const char *path)
{
    size_t n = strlen(path);
    if (n < 4 || strcmp(path + n - 4, ".bin")) return false;
    char magic[4] = {0};
    FILE *f = fopen(path, "rb");
    if (f) {
        if (fread(magic, 1, 4, f) != 4) magic[0] = 0;
        fclose(f);
    }
    return memcmp(magic, "GGUF", 4) != 0;
}

static int info(const char *path, const char *tokenizer, bool each)
{
    char err[512];
    kvc_gguf_t *g;
    const bool bin = is_llama2c(path);
    if (tokenizer && !bin)
        return kvc_cli_error(CMD, "--tokenizer: only for a llama2.c checkpoint (FILE.bin)");
    int rc = bin ? kvc_llama2c_open(path, tokenizer, NULL, &g, err, sizeof err)
                 : kvc_gguf_open(path, NULL, &g, err, sizeof err);
    if (rc) return kvc_cli_error(CMD, "%s: %s", path, err);
    kvc_model_hparams_t h;
    rc = kvc_model_hparams_from_gguf(g, &h, err, sizeof err);
    if (rc) {
        kvc_gguf_close(g);
        return kvc_cli_error(CMD, "%s: %s", path, err);
    }
    char hb[32];
    kvc__fmt_iec(hb, sizeof hb, (double)kvc_gguf_file_bytes(g));
    if (bin)
        printf("file         llama2.c checkpoint, read as GGUF v%u, %s, %" PRIu64 " keys, %" PRIu64
               " tensors\n",
               kvc_gguf_version(g), hb, kvc_gguf_n_kv(g), kvc_gguf_n_tensors(g));
    else
        printf("file         GGUF v%u, %s, %" PRIu64 " keys, %" PRIu64 " tensors, alignment %u\n",
               kvc_gguf_version(g), hb, kvc_gguf_n_kv(g), kvc_gguf_n_tensors(g),
               kvc_gguf_alignment(g));
    print_hparams(&h);
    print_tokenizer(g);
    print_tensors(g, each);
    print_kv(&h);
    kvc_gguf_close(g);
    return 0;
}

static bool count_arg(const char *opt, const char *v, uint32_t *out)
{
    uint64_t x;
    if (!kvc_cli_parse_u64(v, 1, UINT32_MAX, &x)) {
        kvc_cli_error(CMD, "%s: '%s' is not a whole number in 1..4294967295", opt, v);
        return false;
    }
    *out = (uint32_t)x;
    return true;
}

static int synth(int argc, char **argv)
{
    enum {
        O_ARCH = 256,
        O_DIM,
        O_LAYERS,
        O_HEADS,
        O_KV,
        O_FF,
        O_CTX,
        O_VOCAB,
        O_DTYPE,
        O_SEED,
        O_NAME,
        O_HEAD_DIM,
        O_TIED,
        O_JITTER,
        O_WINDOW,
        O_ATTN_CAP,
        O_FINAL_CAP,
        O_ROPE_SCALING,
        O_ROPE_FACTOR,
        O_ROPE_ORIG,
        O_ROPE_THETA
    };
    static const struct option opts[] = {{"arch", required_argument, NULL, O_ARCH},
                                         {"dim", required_argument, NULL, O_DIM},
                                         {"layers", required_argument, NULL, O_LAYERS},
                                         {"heads", required_argument, NULL, O_HEADS},
                                         {"kv-heads", required_argument, NULL, O_KV},
                                         {"ff", required_argument, NULL, O_FF},
                                         {"ctx", required_argument, NULL, O_CTX},
                                         {"vocab", required_argument, NULL, O_VOCAB},
                                         {"dtype", required_argument, NULL, O_DTYPE},
                                         {"seed", required_argument, NULL, O_SEED},
                                         {"name", required_argument, NULL, O_NAME},
                                         {"head-dim", required_argument, NULL, O_HEAD_DIM},
                                         {"tied", no_argument, NULL, O_TIED},
                                         {"norm-jitter", required_argument, NULL, O_JITTER},
                                         {"sliding-window", required_argument, NULL, O_WINDOW},
                                         {"attn-softcap", required_argument, NULL, O_ATTN_CAP},
                                         {"final-softcap", required_argument, NULL, O_FINAL_CAP},
                                         {"rope-scaling", required_argument, NULL, O_ROPE_SCALING},
                                         {"rope-factor", required_argument, NULL, O_ROPE_FACTOR},
                                         {"rope-orig-ctx", required_argument, NULL, O_ROPE_ORIG},
                                         {"rope-theta", required_argument, NULL, O_ROPE_THETA},
                                         {"help", no_argument, NULL, 'h'},
                                         {0}};
    kvc_model_synth_t p = kvc_model_synth_default();
    const char *vocab = NULL, *out = NULL;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "ho:", opts, NULL)) != -1) {
        const char *opt = argv[optind - 1];
        bool ok = true;
        switch (c) {
        case O_ARCH: {
            int a = KVC_ARCH__COUNT;
            for (int k = 0; k < KVC_ARCH__COUNT; k++)
                if (!strcmp(optarg, kvc_arch_name((kvc_arch_t)k))) a = k;
            if (a == KVC_ARCH__COUNT)
                return kvc_cli_error(CMD, "--arch '%s': synth writes llama, qwen2, qwen3, gemma2",
                                     optarg);
            p.arch = (kvc_arch_t)a;
            break;
        }
        case O_HEAD_DIM:
            ok = count_arg("--head-dim", optarg, &p.head_dim);
            break;
        case O_WINDOW:
            ok = count_arg("--sliding-window", optarg, &p.sliding_window);
            break;
        case O_ROPE_ORIG:
            ok = count_arg("--rope-orig-ctx", optarg, &p.rope_orig_ctx);
            break;
        case O_TIED:
            p.tied = true;
            break;
        case O_JITTER:
        case O_ATTN_CAP:
        case O_FINAL_CAP:
        case O_ROPE_FACTOR:
        case O_ROPE_THETA: {
            /* the ranges kvc_model_synth takes, so that a refusal names the option */
            const double lo = c == O_ROPE_FACTOR ? 1 : c == O_ROPE_THETA ? 2 : 0;
            const double hi = c == O_JITTER ? 0.99 : c == O_ROPE_THETA ? 1e12 : 1e6;
            const char *name = c == O_JITTER        ? "--norm-jitter"
                               : c == O_ATTN_CAP    ? "--attn-softcap"
                               : c == O_FINAL_CAP   ? "--final-softcap"
                               : c == O_ROPE_FACTOR ? "--rope-factor"
                                                    : "--rope-theta";
            double x;
            if (!kvc_cli_parse_double(optarg, lo, hi, &x))
                return kvc_cli_error(CMD, "%s: '%s' is not a number in %g..%g", name, optarg, lo,
                                     hi);
            if (c == O_JITTER) p.norm_jitter = (float)x;
            if (c == O_ATTN_CAP) p.attn_softcap = (float)x;
            if (c == O_FINAL_CAP) p.final_softcap = (float)x;
            if (c == O_ROPE_FACTOR) p.rope_factor = (float)x;
            if (c == O_ROPE_THETA) p.rope_theta = x;
            break;
        }
        case O_ROPE_SCALING: {
            int sc = KVC_ROPE_SCALING__COUNT;
            for (int k = 0; k < KVC_ROPE_SCALING__COUNT; k++)
                if (!strcmp(optarg, kvc_rope_scaling_name((kvc_rope_scaling_t)k))) sc = k;
            if (sc == KVC_ROPE_SCALING__COUNT)
                return kvc_cli_error(CMD, "--rope-scaling '%s': none, linear, yarn or llama3",
                                     optarg);
            p.rope_scaling = (kvc_rope_scaling_t)sc;
            break;
        }
        case O_DIM:
            ok = count_arg("--dim", optarg, &p.dim);
            break;
        case O_LAYERS:
            ok = count_arg("--layers", optarg, &p.n_layers);
            break;
        case O_HEADS:
            ok = count_arg("--heads", optarg, &p.n_heads);
            break;
        case O_KV:
            ok = count_arg("--kv-heads", optarg, &p.n_kv_heads);
            break;
        case O_FF:
            ok = count_arg("--ff", optarg, &p.ff);
            break;
        case O_CTX:
            ok = count_arg("--ctx", optarg, &p.ctx);
            break;
        case O_VOCAB:
            vocab = optarg;
            break;
        case O_NAME:
            p.name = optarg;
            break;
        case 'o':
            out = optarg;
            break;
        case O_SEED:
            if (!kvc_cli_parse_u64(optarg, 0, UINT64_MAX, &p.seed))
                return kvc_cli_error(CMD, "--seed: '%s' is not a whole number", optarg);
            break;
        case O_DTYPE: {
            uint32_t t = KVC_GGML_TYPE__END;
            for (uint32_t k = 0; k < KVC_GGML_TYPE__END; k++)
                if (kvc_ggml_type_name(k) && !strcasecmp(kvc_ggml_type_name(k), optarg)) t = k;
            if (t == KVC_GGML_TYPE__END)
                return kvc_cli_error(CMD,
                                     "--dtype '%s': not a tensor type (f32, f16, bf16, "
                                     "q8_0, q4_0, q4_K, q6_K)",
                                     optarg);
            p.type = t;
            break;
        }
        case 'h':
            usage(stdout);
            return 0;
        default:
            return kvc_cli_error(CMD,
                                 "unknown or incomplete option '%s' (try 'kvcache model "
                                 "--help')",
                                 opt);
        }
        if (!ok) return 1;
    }
    if (optind != argc) return kvc_cli_error(CMD, "synth: unexpected argument '%s'", argv[optind]);
    if (!vocab) return kvc_cli_error(CMD, "synth: --vocab VOCAB.gguf is required");
    if (!out) return kvc_cli_error(CMD, "synth: -o OUT.gguf is required");
    char err[512];
    kvc_gguf_t *g;
    int rc = kvc_gguf_open(vocab, NULL, &g, err, sizeof err);
    if (rc) return kvc_cli_error(CMD, "--vocab %s: %s", vocab, err);
    rc = kvc_model_synth(&p, g, out, err, sizeof err);
    kvc_gguf_close(g);
    if (rc) return kvc_cli_error(CMD, "synth %s: %s", out, err);
    return 0;
}

static int convert(int argc, char **argv)
{
    enum { O_TOK_OUT = 256 };
    static const struct option opts[] = {{"tokenizer-out", required_argument, NULL, O_TOK_OUT},
                                         {"help", no_argument, NULL, 'h'},
                                         {0}};
    const char *out = NULL, *tok = NULL;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "ho:", opts, NULL)) != -1) {
        if (c == 'o') {
            out = optarg;
        } else if (c == O_TOK_OUT) {
            tok = optarg;
        } else if (c == 'h') {
            usage(stdout);
            return 0;
        } else {
            return kvc_cli_error(CMD,
                                 "unknown or incomplete option '%s' (try 'kvcache model --help')",
                                 argv[optind - 1]);
        }
    }
    if (optind + 1 != argc)
        return kvc_cli_error(CMD, "convert: give exactly one IN.gguf (try 'kvcache model --help')");
    if (!out) return kvc_cli_error(CMD, "convert: -o OUT.bin is required");
    const char *in = argv[optind];
    char err[512];
    kvc_gguf_t *g;
    int rc = kvc_gguf_open(in, NULL, &g, err, sizeof err);
    if (rc) return kvc_cli_error(CMD, "%s: %s", in, err);
    rc = kvc_llama2c_write(g, out, tok, err, sizeof err);
    kvc_gguf_close(g);
    if (rc) return kvc_cli_error(CMD, "convert %s: %s", in, err);
    return 0;
}

int kvc_cmd_model(int argc, char **argv)
{
    if (argc < 2) {
        kvc_cli_error(CMD,
                      "give a subcommand: info, convert or synth (try 'kvcache model --help')");
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "synth")) return synth(argc - 1, argv + 1);
    if (!strcmp(argv[1], "convert")) return convert(argc - 1, argv + 1);
    if (strcmp(argv[1], "info"))
        return kvc_cli_error(CMD, "unknown subcommand '%s' (try 'kvcache model --help')", argv[1]);
    static const struct option opts[] = {{"tensors", no_argument, NULL, 't'},
                                         {"tokenizer", required_argument, NULL, 'k'},
                                         {"help", no_argument, NULL, 'h'},
                                         {0}};
    bool each = false;
    const char *tokenizer = NULL;
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc - 1, argv + 1, "h", opts, NULL)) != -1) {
        if (c == 't') {
            each = true;
        } else if (c == 'k') {
            tokenizer = optarg;
        } else if (c == 'h') {
            usage(stdout);
            return 0;
        } else {
            return kvc_cli_error(CMD, "unknown option '%s' (try 'kvcache model --help')",
                                 argv[optind]); /* argv + 1's optind - 1 */
        }
    }
    if (optind + 1 != argc - 1)
        return kvc_cli_error(CMD, "give exactly one FILE.gguf (try 'kvcache model --help')");
    return info(argv[optind + 1], tokenizer, each);
}
