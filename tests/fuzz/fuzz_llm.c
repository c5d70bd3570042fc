/* fuzz_llm.c - libFuzzer target over the model loader and a tiny forward pass: arbitrary bytes
 * must either be refused (by the GGUF reader, or by kvc_llm_load_gguf with one of the codes
 * engine.h names and a one-line message), or load as a model the engine can run: an engine with
 * small limits runs a few greedy tokens of a short prompt (tokenized by the model's own
 * tokenizer) and of the same prompt again (a prefix-cache hit), so a tensor binding that passes
 * validation but reads out of bounds is caught by ASan.  A run may fail (a step's error, a
 * request finished with an error: weights of NaN are bad input too), never crash.
 * The corpus (tests/fuzz/corpus/llm, written by tests/fuzz/make_llm_corpus.sh) holds small
 * synthetic llama models of every weight type over a 32-token vocabulary, and variants a step
 * from valid. */
#include "kvcache/kvcache.h"
#include "kvcache/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond, ...)                               \
    do {                                               \
        if (!(cond)) {                                 \
            fprintf(stderr, "fuzz_llm: " __VA_ARGS__); \
            fputc('\n', stderr);                       \
            abort();                                   \
        }                                              \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void one_line(int rc, const char *msg, const char *what)
{
    CHECK(msg[0], "%s: %s without a message", what, kvc_errname(rc));
    CHECK(!strchr(msg, '\n'), "%s: a message of more than one line: %s", what, msg);
}

typedef struct {
    uint32_t vocab, events;
} ev_ctx_t;

static void on_event(void *ctx, const kvc_gen_event_t *ev)
{
    ev_ctx_t *c = ctx;
    c->events++;
    for (uint32_t i = 0; i < ev->n_tokens; i++)
        CHECK(ev->tokens[i] >= 0 && (uint32_t)ev->tokens[i] < c->vocab, "token %d of %u",
              ev->tokens[i], c->vocab);
    CHECK(ev->text && strlen(ev->text) == ev->text_len, "event text");
}

static void run(const kvc_llm_t *m, bool scalar)
{
    const kvc_model_hparams_t *h = kvc_llm_hparams(m);
    const kvc_tokenizer_t *tok = kvc_llm_tokenizer(m);
    kvc_engine_params_t ep = kvc_engine_params_default();
    ep.n_threads = 1;
    ep.max_ctx = 48;
    ep.block_size = 4;
    ep.max_num_seqs = 2;
    ep.max_num_batched_tokens = 16;
    ep.isa = scalar ? KVC_ISA_SCALAR : KVC_ISA_AUTO;
    char msg[256] = "";
    kvc_engine_t *e = NULL;
    int rc = kvc_engine_create(m, &ep, &e, msg, sizeof msg);
    if (rc) {
        CHECK(rc == KVC_EINVAL || rc == KVC_ENOMEM || rc == KVC_ENOTSUP, "engine_create: %s (%s)",
              kvc_errname(rc), msg);
        one_line(rc, msg, "engine_create");
        return;
    }
    kvc_token_t prompt[24];
    size_t n = 0;
    if (kvc_tokenizer_encode(tok, "Once upon a time, Lily", 22, KVC_TOK_ADD_BOS, prompt, 24, &n) ||
        n == 0) {
        n = 3;
        for (uint32_t i = 0; i < n; i++) prompt[i] = (kvc_token_t)(i % h->vocab);
    }
    for (size_t i = 0; i < n; i++)
        CHECK(prompt[i] >= 0 && (uint32_t)prompt[i] < h->vocab, "the tokenizer gave %d of %u",
              prompt[i], h->vocab);
    kvc_gen_params_t gp = kvc_gen_params_default();
    gp.max_tokens = 4;
    gp.ignore_eos = true;
    gp.logprobs = true;
    gp.n_logprobs = 2;
    kvc_gen_id_t id[2];
    uint32_t live = 0;
    for (int r = 0; r < 2; r++) {
        msg[0] = 0;
        rc = kvc_engine_submit(e, prompt, (uint32_t)n, &gp, &id[r], msg, sizeof msg);
        if (rc) {
            CHECK(rc == KVC_EINVAL || rc == KVC_ERANGE || rc == KVC_ENOMEM, "submit: %s (%s)",
                  kvc_errname(rc), msg);
            one_line(rc, msg, "submit");
        } else
            live++;
    }
    ev_ctx_t ec = {.vocab = h->vocab};
    for (int step = 0; live && step < 64; step++) {
        bool idle = false;
        rc = kvc_engine_step(e, step * 1e-3, on_event, &ec, &idle);
        if (rc) break; /* a step's error (NaN logits from garbage weights): refused, no crash */
        const kvc_gen_done_t *done;
        uint32_t n_done;
        kvc_engine_finished(e, &done, &n_done);
        for (uint32_t i = 0; i < n_done; i++) {
            const kvc_gen_done_t *d = &done[i];
            CHECK(d->finish != KVC_FINISH_NONE, "finished without a reason");
            CHECK(d->completion_tokens <= gp.max_tokens, "%u tokens", d->completion_tokens);
            for (uint32_t j = 0; j < d->completion_tokens; j++)
                CHECK(d->output[j] >= 0 && (uint32_t)d->output[j] < h->vocab, "output %d",
                      d->output[j]);
            CHECK(d->text != NULL, "no text");
            live--;
        }
        if (idle && !n_done) break;
    }
    kvc_engine_destroy(e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char msg[256] = "";
    kvc_gguf_t *g = NULL;
    int rc = kvc_gguf_open_memory(data, size, NULL, &g, msg, sizeof msg);
    if (rc) {
        CHECK(g == NULL, "refused with a handle");
        one_line(rc, msg, "open");
        return 0;
    }
    kvc_llm_t *m = NULL;
    msg[0] = 0;
    rc = kvc_llm_load_gguf(g, &m, msg, sizeof msg); /* owns g from here, also on failure */
    if (rc) {
        CHECK(rc == KVC_EPARSE || rc == KVC_ENOTSUP || rc == KVC_ENOMEM, "load: %s (%s)",
              kvc_errname(rc), msg);
        CHECK(m == NULL, "refused with a model");
        one_line(rc, msg, "load");
        return 0;
    }
    const kvc_model_hparams_t *h = kvc_llm_hparams(m);
    CHECK(h->vocab >= kvc_tokenizer_n_vocab(kvc_llm_tokenizer(m)), "vocab");
    /* the scalar kernels carry UBSan's checks, the ISA ones only ASan's: both, by input */
    run(m, size & 1);
    kvc_llm_free(m);
    return 0;
}
