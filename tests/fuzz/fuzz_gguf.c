/* fuzz_gguf.c - libFuzzer target over the GGUF reader: arbitrary bytes must either be
 * refused with KVC_EPARSE and a one-line message, or open as a file whose every key,
 * value, array element and tensor byte lies inside the input (ASan checks each read).
 * The corpus (tests/fuzz/corpus/gguf) holds small valid files: one with every value
 * type and three tensors, a vocab-only file, and the first 4 KiB of stories260K.gguf
 * (its real metadata, refused as truncated: a start for mutations). */
#include "kvcache/kvcache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond, ...)                                \
    do {                                                \
        if (!(cond)) {                                  \
            fprintf(stderr, "fuzz_gguf: " __VA_ARGS__); \
            fputc('\n', stderr);                        \
            abort();                                    \
        }                                               \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[256] = "";
    kvc_gguf_t *g = NULL;
    int rc = kvc_gguf_open_memory(data, size, NULL, &g, err, sizeof err);
    if (rc) {
        CHECK(rc == KVC_EPARSE || rc == KVC_EINVAL, "open: %s", kvc_errname(rc));
        CHECK(g == NULL && err[0], "refused without a message or with a handle");
        CHECK(!strchr(err, '\n'), "message of more than one line: %s", err);
        return 0;
    }
    const uint8_t *end = data + size;
    for (uint64_t i = 0; i < kvc_gguf_n_kv(g); i++) {
        kvc_gguf_str_t k = kvc_gguf_key(g, i), s;
        CHECK((const uint8_t *)k.s >= data && (const uint8_t *)k.s + k.len <= end, "key out");
        char key[512];
        if (k.len >= sizeof key) continue;
        memcpy(key, k.s, k.len);
        key[k.len] = 0;
        CHECK(kvc_gguf_find(g, key) == (int64_t)i, "find(%s) is not %llu", key,
              (unsigned long long)i);
        kvc_gguf_arr_t a;
        uint64_t u;
        int64_t v;
        double f;
        bool b;
        if (kvc_gguf_get_arr(g, key, &a) == 0) {
            for (uint64_t j = 0; j < a.n && j < 64; j++) {
                if (kvc_gguf_arr_str(g, &a, j, &s) == 0)
                    CHECK((const uint8_t *)s.s >= data && (const uint8_t *)s.s + s.len <= end,
                          "array string out");
                (void)kvc_gguf_arr_i64(&a, j, &v);
                (void)kvc_gguf_arr_f64(&a, j, &f);
            }
        }
        if (kvc_gguf_get_str(g, key, &s) == 0)
            CHECK((const uint8_t *)s.s >= data && (const uint8_t *)s.s + s.len <= end, "str out");
        (void)kvc_gguf_get_u64(g, key, &u);
        (void)kvc_gguf_get_i64(g, key, &v);
        (void)kvc_gguf_get_f64(g, key, &f);
        (void)kvc_gguf_get_bool(g, key, &b);
    }
    for (uint64_t i = 0; i < kvc_gguf_n_tensors(g); i++) {
        const kvc_gguf_tensor_t *t = kvc_gguf_tensor(g, i);
        const uint8_t *p = t->data;
        CHECK(p >= data && p + t->bytes <= end, "tensor %llu out", (unsigned long long)i);
        CHECK(t->n_dims >= 1 && t->n_dims <= KVC_GGUF_MAX_DIMS && t->bytes > 0, "bad shape");
        volatile uint8_t sink = p[0] ^ p[t->bytes - 1];
        (void)sink;
    }
    kvc_gguf_close(g);
    return 0;
}
