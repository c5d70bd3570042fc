/* fuzz_llama2c.c - libFuzzer target over the llama2.c checkpoint reader: arbitrary bytes
 * as a legacy .bin must either be refused with KVC_EPARSE and a one-line message, or open
 * as a GGUF whose tensors are the checkpoint's floats (ASan checks each read; the shapes
 * are checked against the hyperparameters the model layer reads).  The corpus
 * (tests/fuzz/corpus/llama2c) holds small valid checkpoints, shared and unshared, and
 * stories260K's header with the first of its weights (refused as truncated: a start for
 * mutations of a real header), and tokenizer.bin files for a 6-token vocabulary: every
 * input is also read as the tokenizer of a fixed 6-token checkpoint. */
#include "kvcache/kvcache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond, ...)                                   \
    do {                                                   \
        if (!(cond)) {                                     \
            fprintf(stderr, "fuzz_llama2c: " __VA_ARGS__); \
            fputc('\n', stderr);                           \
            abort();                                       \
        }                                                  \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A valid checkpoint of 6 tokens (dim 8, hidden 16, 1 layer, 2 heads, 1 KV head, seq_len 2,
 * shared classifier, zero weights): 28 bytes of header and 656 floats. */
enum { CK_FLOATS = 6 * 8 + 8 + 64 + 2 * 4 * 8 + 64 + 8 + 3 * 16 * 8 + 8 + 2 * 4 };
static uint8_t checkpoint[28 + 4 * CK_FLOATS];

/* data as the tokenizer of that checkpoint: refused with a message, or a tokenizer of 6 */
static void as_tokenizer(const uint8_t *data, size_t size)
{
    if (!checkpoint[0]) {
        const int32_t h[7] = {8, 16, 1, 2, 1, 6, 2};
        memcpy(checkpoint, h, sizeof h);
    }
    char err[512] = "";
    kvc_gguf_t *g = NULL;
    int rc = kvc_llama2c_open_memory(checkpoint, sizeof checkpoint, size ? data : checkpoint, size,
                                     NULL, &g, err, sizeof err);
    if (rc) {
        CHECK(rc == KVC_EPARSE || rc == KVC_ENOMEM, "tokenizer: %s (%s)", kvc_errname(rc), err);
        CHECK(g == NULL && err[0] && !strchr(err, '\n'), "tokenizer refused badly: %s", err);
        return;
    }
    kvc_tokenizer_t *t;
    CHECK(kvc_tokenizer_create_gguf(g, NULL, &t, err, sizeof err) == 0, "tokenizer: %s", err);
    CHECK(kvc_tokenizer_n_vocab(t) == 6, "%u tokens", kvc_tokenizer_n_vocab(t));
    kvc_token_t ids[64];
    size_t n;
    if (kvc_tokenizer_encode(t, "hello world", 11, KVC_TOK_ADD_SPECIAL, ids, 64, &n) == 0) {
        char text[1024];
        size_t len;
        CHECK(kvc_tokenizer_decode(t, ids, n, 0, text, sizeof text, &len) == 0, "decode");
    }
    kvc_tokenizer_destroy(t);
    kvc_gguf_close(g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    as_tokenizer(data, size);
    char err[512] = "";
    kvc_gguf_t *g = NULL;
    int rc = kvc_llama2c_open_memory(data, size, NULL, 0, NULL, &g, err, sizeof err);
    if (rc) {
        CHECK(rc == KVC_EPARSE || rc == KVC_ENOMEM, "open: %s (%s)", kvc_errname(rc), err);
        CHECK(g == NULL && err[0], "refused without a message or with a handle");
        CHECK(!strchr(err, '\n'), "message of more than one line: %s", err);
        return 0;
    }
    kvc_model_hparams_t h;
    CHECK(kvc_model_hparams_from_gguf(g, &h, err, sizeof err) == 0, "hparams: %s", err);
    uint64_t floats = 0;
    for (uint64_t i = 0; i < kvc_gguf_n_tensors(g); i++) {
        const kvc_gguf_tensor_t *t = kvc_gguf_tensor(g, i);
        CHECK(t->type == KVC_GGML_F32 && t->bytes == 4 * t->n_elems, "tensor %llu",
              (unsigned long long)i);
        volatile uint8_t sink =
            ((const uint8_t *)t->data)[0] ^ ((const uint8_t *)t->data)[t->bytes - 1];
        (void)sink;
        if (!kvc_gguf_str_eq(t->name, "output.weight")) floats += t->n_elems;
    }
    /* the file held every tensor's floats (plus the header and the RoPE tables; a shared
     * classifier is the embedding's copy) */
    CHECK(28 + 4 * floats <= size, "%llu floats from %zu bytes", (unsigned long long)floats, size);
    kvc_gguf_close(g);
    return 0;
}
