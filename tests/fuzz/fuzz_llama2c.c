/* fuzz_llama2c.c - libFuzzer target over the llama2.c checkpoint reader: arbitrary bytes
 * as a legacy .bin must either be refused with KVC_EPARSE and a one-line message, or open
 * as a GGUF whose tensors are the checkpoint's floats (ASan checks each read; the shapes
 * are checked against the hyperparameters the model layer reads).  The corpus
 * (tests/fuzz/corpus/llama2c) holds small valid checkpoints, shared and unshared, and
 * stories260K's header with the first of its weights (refused as truncated: a start for
 * mutations of a real header). */
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
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
