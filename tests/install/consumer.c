/* consumer.c - a program built against the installed package, as a user
 * would build it (pkg-config + cc, or find_package in CMake): the umbrella
 * header compiles on its own, the version macros agree with the library
 * that was linked, and a few calls across the layers work.  Prints the
 * library's version on success. */
#include <kvcache/kvcache.h>

#include <stdio.h>
#include <string.h>

#if !defined(KVC_VERSION_NUMBER) || KVC_VERSION_NUMBER < 100
#error "kvcache/version.h is missing or older than 0.1.0"
#endif

static int fail(const char *what)
{
    fprintf(stderr, "consumer: %s\n", what);
    return 1;
}

int main(void)
{
    /* the headers and the library are one version */
    char macros[32];
    snprintf(macros, sizeof macros, "%d.%d.%d", KVC_VERSION_MAJOR, KVC_VERSION_MINOR,
             KVC_VERSION_PATCH);
    if (strcmp(macros, KVC_VERSION) != 0) return fail("KVC_VERSION disagrees with its parts");
    if (strcmp(kvc_version(), KVC_VERSION) != 0) return fail("kvc_version() != KVC_VERSION");
    if (KVC_VERSION_NUMBER !=
        KVC_VERSION_MAJOR * 10000 + KVC_VERSION_MINOR * 100 + KVC_VERSION_PATCH)
        return fail("KVC_VERSION_NUMBER");

    /* a pool, a prefix cache and a sequence: one request's path */
    kvc_pool_params_t pp = kvc_pool_params_default();
    pp.n_blocks = 8;
    pp.block_size = 4;
    kvc_pool_t *pool = NULL;
    kvc_prefix_t *pc = NULL;
    kvc_seqs_t *seqs = NULL;
    kvc_prefix_params_t cp = kvc_prefix_params_default();
    kvc_seqs_params_t sp = kvc_seqs_params_default();
    if (kvc_pool_create(&pp, &pool) || kvc_prefix_create(pool, &cp, &pc) ||
        kvc_seqs_create(pool, pc, &sp, &seqs))
        return fail("create");
    const kvc_token_t prompt[6] = {1, 2, 3, 4, 5, 6};
    kvc_seq_desc_t d = {.prompt = prompt, .n_prompt = 6};
    kvc_seq_t s;
    size_t hit = 0;
    if (kvc_seq_create(seqs, &d, &s) || kvc_seq_lookup(seqs, s, &hit) ||
        kvc_seq_reserve(seqs, s, 6, NULL) || kvc_seq_complete(seqs, s, 6))
        return fail("a sequence's path");
    char msg[128];
    if (kvc_seqs_check(seqs, msg, sizeof msg)) return fail(msg);
    if (kvc_seq_destroy(seqs, s)) return fail("destroy");
    kvc_seqs_destroy(seqs);
    kvc_prefix_destroy(pc);
    kvc_pool_destroy(pool);

    /* a model config through the JSON parser: the static link needs libcjson for this */
    static const char cfg[] = "{\"hidden_size\": 4096, \"intermediate_size\": 14336, "
                              "\"num_hidden_layers\": 32, \"num_attention_heads\": 32, "
                              "\"num_key_value_heads\": 8, \"vocab_size\": 32000, "
                              "\"max_position_embeddings\": 32768}";
    kvc_plan_model_t model;
    if (kvc_plan_model_from_json(cfg, sizeof cfg - 1, "m", &model, msg, sizeof msg))
        return fail(msg);

    /* errors by name, and the one internal symbol the public KVC_ASSERT macro calls */
    if (strcmp(kvc_errname(KVC_ENOSPC), "ENOSPC") != 0) return fail("kvc_errname");
    KVC_ASSERT(kvc_isa_supported(KVC_ISA_SCALAR));
    printf("%s\n", kvc_version());
    return 0;
}
