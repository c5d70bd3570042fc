/* gguf_writer.h - a small GGUF writer for the tests: a growing buffer and one function
 * per record kind, little-endian as the format is.  Only what the tests need; the files
 * it writes are checked by the reader, never trusted. */
#ifndef KVC_TEST_GGUF_WRITER_H
#define KVC_TEST_GGUF_WRITER_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvcache/gguf.h"

typedef struct {
    uint8_t *p;
    size_t n, cap;
} buf_t;

static inline void put(buf_t *b, const void *d, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static inline void put_u8(buf_t *b, uint8_t v)
{
    put(b, &v, 1);
}
static inline void put_u32(buf_t *b, uint32_t v)
{
    put(b, &v, 4);
}
static inline void put_u64(buf_t *b, uint64_t v)
{
    put(b, &v, 8);
}
static inline void put_str(buf_t *b, const char *s)
{
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static inline void header(buf_t *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    put(b, "GGUF", 4);
    put_u32(b, version);
    put_u64(b, n_tensors);
    put_u64(b, n_kv);
}
static inline void kv_u32(buf_t *b, const char *k, uint32_t v)
{
    put_str(b, k);
    put_u32(b, KVC_GGUF_UINT32);
    put_u32(b, v);
}
static inline void kv_str(buf_t *b, const char *k, const char *v)
{
    put_str(b, k);
    put_u32(b, KVC_GGUF_STRING);
    put_str(b, v);
}
static inline void tensor_info(buf_t *b, const char *name, uint32_t n_dims, const uint64_t *ne,
                               uint32_t type, uint64_t offset)
{
    put_str(b, name);
    put_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) put_u64(b, ne[d]);
    put_u32(b, type);
    put_u64(b, offset);
}
static inline void pad_to(buf_t *b, size_t align)
{
    while (b->n % align) put_u8(b, 0);
}

static inline void kv_f32(buf_t *b, const char *k, float v)
{
    put_str(b, k);
    put_u32(b, KVC_GGUF_FLOAT32);
    put(b, &v, 4);
}

#endif /* KVC_TEST_GGUF_WRITER_H */
