/* fuzz_tokenizer.c - libFuzzer target over the tokenizers: arbitrary bytes (valid UTF-8 or
 * not) through encode, decode and the streaming decoder, with the llama-spm or phi-3
 * (SentencePiece) or the gpt-2 or deepseek-llm (byte-level BPE: GPT-2's regex, and the longest
 * regex list) vocabulary of tests/data/models/vocab.  Every encode succeeds with ids in range,
 * is deterministic, and fits the documented bound (3 x len + 5 ids); every stream chunk is
 * valid UTF-8; and the stream's text equals the one-shot decode wherever that is valid.
 *
 * Encoding: byte 0 picks the vocabulary (bit 7: BPE, bit 0: which of the two) and the encode
 * flags (bits 1-4: add BOS, add EOS, add special, parse special) and the decode flags (bits
 * 5-6); the rest is text. */
#include "kvcache/kvcache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond, ...)                                     \
    do {                                                     \
        if (!(cond)) {                                       \
            fprintf(stderr, "fuzz_tokenizer: " __VA_ARGS__); \
            fputc('\n', stderr);                             \
            abort();                                         \
        }                                                    \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static kvc_tokenizer_t *load(const char *name)
{
    char path[1024], err[256];
    snprintf(path, sizeof path, "%s/models/vocab/%s", KVC_DATA_DIR, name);
    kvc_gguf_t *g;
    CHECK(kvc_gguf_open(path, NULL, &g, err, sizeof err) == 0, "%s: %s", path, err);
    kvc_tokenizer_t *t;
    CHECK(kvc_tokenizer_create_gguf(g, NULL, &t, err, sizeof err) == 0, "%s: %s", path, err);
    kvc_gguf_close(g); /* the tokenizer keeps what it needs */
    return t;
}

/* Well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF). */
static bool utf8_ok(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!k || i + k > n || (k == 2 && c < 0xC2)) return false;
        unsigned cp = k == 1 ? c : c & (0x7F >> k);
        for (size_t j = 1; j < k; j++) {
            if ((s[i + j] & 0xC0) != 0x80) return false;
            cp = cp << 6 | (s[i + j] & 0x3F);
        }
        if ((k == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
            (k == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
            return false;
        i += k;
    }
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static kvc_tokenizer_t *vocab[4];
    if (!vocab[0]) {
        vocab[0] = load("ggml-vocab-llama-spm.gguf");
        vocab[1] = load("ggml-vocab-phi-3.gguf");
        vocab[2] = load("ggml-vocab-gpt-2.gguf");
        vocab[3] = load("ggml-vocab-deepseek-llm.gguf");
    }
    if (size < 1 || size > 4096) return 0;
    const kvc_tokenizer_t *t = vocab[(data[0] & 1) | (data[0] >> 6 & 2)];
    const unsigned enc = (data[0] >> 1) & 0xF;
    const unsigned dec = (data[0] & 0x20 ? KVC_TOK_REMOVE_SPECIAL : 0) |
                         (data[0] & 0x40 ? KVC_TOK_UNPARSE_SPECIAL : 0);
    const char *text = (const char *)data + 1;
    const size_t len = size - 1;
    const size_t cap = 3 * len + 5;
    kvc_token_t *ids = malloc(cap * sizeof *ids), *ids2 = malloc(cap * sizeof *ids2);
    size_t n = 0, n2 = 0;
    int rc = kvc_tokenizer_encode(t, text, len, enc, ids, cap, &n);
    CHECK(rc == 0, "encode: %s (%zu bytes)", kvc_errname(rc), len);
    CHECK(n <= cap, "%zu ids for %zu bytes", n, len);
    for (size_t i = 0; i < n; i++)
        CHECK(ids[i] >= 0 && (uint32_t)ids[i] < kvc_tokenizer_n_vocab(t), "id %d", ids[i]);
    CHECK(kvc_tokenizer_encode(t, text, len, enc, ids2, cap, &n2) == 0 && n2 == n &&
              !memcmp(ids, ids2, n * sizeof *ids),
          "encode is not deterministic");
    /* one-shot decode, then the stream */
    size_t bytes = 0;
    rc = kvc_tokenizer_decode(t, ids, n, dec, NULL, 0, &bytes);
    CHECK(rc == KVC_ERANGE || (rc == 0 && bytes == 0), "decode size: %s", kvc_errname(rc));
    char *one = malloc(bytes + 1);
    CHECK(kvc_tokenizer_decode(t, ids, n, dec, one, bytes + 1, &bytes) == 0, "decode");
    kvc_tokenizer_stream_t *s;
    CHECK(kvc_tokenizer_stream_create(t, dec, &s) == 0, "stream create");
    const size_t piece = kvc_tokenizer_max_piece_bytes(t) + 8;
    char *chunk = malloc(piece), *all = malloc(4 * bytes + 4 * n + 16);
    size_t at = 0, got;
    for (size_t i = 0; i <= n; i++) {
        rc = i < n ? kvc_tokenizer_stream_push(s, ids[i], chunk, piece, &got)
                   : kvc_tokenizer_stream_finish(s, chunk, piece, &got);
        CHECK(rc == 0, "stream at %zu: %s", i, kvc_errname(rc));
        CHECK(utf8_ok((const unsigned char *)chunk, got), "a chunk of invalid UTF-8 at id %zu", i);
        memcpy(all + at, chunk, got);
        at += got;
    }
    if (utf8_ok((const unsigned char *)one, bytes))
        CHECK(at == bytes && !memcmp(all, one, bytes), "stream and one-shot decode differ");
    kvc_tokenizer_stream_destroy(s);
    free(chunk), free(all), free(one), free(ids), free(ids2);
    return 0;
}
