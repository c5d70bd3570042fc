/* kvcache/gguf.h - a validating reader of GGUF files (the model layer's input).
 *
 * GGUF (versions 2 and 3, little-endian) is llama.cpp's container: a header,
 * typed key/value metadata, a tensor table, and the tensors' bytes at aligned
 * offsets.  kvc_gguf_open memory-maps the file and checks every count, length,
 * type, shape, offset and size against the file's length before anything is
 * handed out, so a truncated, hostile or corrupt file gives one error with a
 * message and never a read out of bounds.  Tensor data is used in place: a
 * tensor's `data` points into the mapping.
 *
 * What is refused: a bad magic; versions other than 2 and 3 (version 1 had
 * 32-bit counts; a byte-swapped version is a big-endian file); counts that
 * cannot fit in the file; strings longer than what remains; value types
 * outside GGUF's 13; nested arrays; a bool other than 0 or 1; duplicate keys
 * or tensor names; keys or names that are empty or hold a NUL; tensors with
 * 0 or more than 4 dimensions, a zero or oversized dimension, an element
 * count that overflows, a first dimension that is not a multiple of the
 * type's block, a type whose size this reader does not know, an offset not a
 * multiple of the alignment, bytes past the end of the file, or bytes that
 * overlap another tensor's; `general.alignment` not a power of two.
 *
 * Errors: functions that return int return 0 or a negative KVC_E* code; the
 * open functions also write a one-line message to `err` (NUL-terminated,
 * truncated to `cap`; `err` may be NULL).  Lookups return KVC_ENOENT for a
 * missing key, KVC_EPARSE for a value of another type, KVC_ERANGE for an
 * integer that does not fit the asked type.
 *
 * kvc_gguf_writer_t (below) writes files this reader accepts.
 *
 * Ownership and threads: a kvc_gguf_t owns its mapping (or borrows the
 * caller's buffer, kvc_gguf_open_memory) and a few arrays of its own; every
 * pointer it hands out (strings, arrays, tensor data) stays valid until
 * kvc_gguf_close.  Strings are NOT NUL-terminated: use their length.  A
 * kvc_gguf_t is read-only after open, so any number of threads may read it
 * at once.
 */
#ifndef KVCACHE_GGUF_H
#define KVCACHE_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvcache/util.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVC_GGUF_MAX_DIMS      4
#define KVC_GGUF_MAX_NAME      255   /* bytes in a tensor name */
#define KVC_GGUF_MAX_KEY       65535 /* bytes in a metadata key */
#define KVC_GGUF_DEFAULT_ALIGN 32    /* when general.alignment is absent */
#define KVC_GGUF_MAX_ALIGN     (UINT32_C(1) << 20)
#define KVC_GGUF_MAX_DIM       (UINT64_C(1) << 40) /* elements along one dimension */

/* Metadata value types, numbered as in the file. */
typedef enum {
    KVC_GGUF_UINT8 = 0,
    KVC_GGUF_INT8 = 1,
    KVC_GGUF_UINT16 = 2,
    KVC_GGUF_INT16 = 3,
    KVC_GGUF_UINT32 = 4,
    KVC_GGUF_INT32 = 5,
    KVC_GGUF_FLOAT32 = 6,
    KVC_GGUF_BOOL = 7,
    KVC_GGUF_STRING = 8,
    KVC_GGUF_ARRAY = 9,
    KVC_GGUF_UINT64 = 10,
    KVC_GGUF_INT64 = 11,
    KVC_GGUF_FLOAT64 = 12,
    KVC_GGUF_TYPE__COUNT
} kvc_gguf_type_t;

/* "uint32", "string", ...; "?" outside the enum. */
KVC_API const char *kvc_gguf_type_name(kvc_gguf_type_t t);
/* Bytes of one value of a fixed-size type; 0 for strings, arrays and outside the enum. */
KVC_API uint32_t kvc_gguf_type_size(kvc_gguf_type_t t);

/* Tensor types, numbered as ggml numbers them (the ones this reader can size). */
typedef enum {
    KVC_GGML_F32 = 0,
    KVC_GGML_F16 = 1,
    KVC_GGML_Q4_0 = 2,
    KVC_GGML_Q4_1 = 3,
    KVC_GGML_Q5_0 = 6,
    KVC_GGML_Q5_1 = 7,
    KVC_GGML_Q8_0 = 8,
    KVC_GGML_Q8_1 = 9,
    KVC_GGML_Q2_K = 10,
    KVC_GGML_Q3_K = 11,
    KVC_GGML_Q4_K = 12,
    KVC_GGML_Q5_K = 13,
    KVC_GGML_Q6_K = 14,
    KVC_GGML_Q8_K = 15,
    KVC_GGML_I8 = 24,
    KVC_GGML_I16 = 25,
    KVC_GGML_I32 = 26,
    KVC_GGML_I64 = 27,
    KVC_GGML_F64 = 28,
    KVC_GGML_BF16 = 30,
    KVC_GGML_TYPE__END = 31 /* one past the largest number known here */
} kvc_ggml_type_t;

/* The type's name as llama.cpp prints it ("f32", "q4_K", ...), or NULL for a
 * number this reader does not know. */
KVC_API const char *kvc_ggml_type_name(uint32_t type);
/* Elements per block and bytes per block of a tensor type: 0, or KVC_ENOTSUP
 * for a type this reader cannot size (out params untouched). */
KVC_API int kvc_ggml_type_size(uint32_t type, uint32_t *block_elems, uint32_t *block_bytes);

/* A string inside the file: `len` bytes at `s`, not NUL-terminated. */
typedef struct {
    const char *s;
    uint64_t len;
} kvc_gguf_str_t;

/* An array value: `n` elements of `type`.  For fixed-size types `data` is the
 * raw little-endian elements (possibly unaligned: read with memcpy, or with
 * kvc_gguf_arr_* below); for strings use kvc_gguf_arr_str. */
typedef struct {
    kvc_gguf_type_t type;
    uint64_t n;
    const void *data;
    uint32_t index; /* the key's index, for kvc_gguf_arr_str */
} kvc_gguf_arr_t;

typedef struct {
    kvc_gguf_str_t name;
    uint32_t type; /* kvc_ggml_type_t */
    uint32_t n_dims;
    uint64_t ne[KVC_GGUF_MAX_DIMS]; /* elements per dimension, ne[0] fastest; 1 past n_dims */
    uint64_t n_elems;
    uint64_t offset; /* from the start of the data section */
    uint64_t bytes;
    const void *data; /* in the mapping; aligned to the file's alignment */
} kvc_gguf_tensor_t;

typedef struct kvc_gguf kvc_gguf_t;

/* Map and validate the file at `path`; the reader's own arrays come from `a`
 * (NULL: the C library), which must outlive the kvc_gguf_t.  KVC_EIO (cannot
 * open, read or map; the message names the OS error), KVC_EPARSE (what is
 * malformed and where), KVC_ENOMEM, KVC_EINVAL (path or out NULL). */
KVC_API KVC_NODISCARD int kvc_gguf_open(const char *path, const kvc_allocator_t *a,
                                        kvc_gguf_t **out, char *err, size_t cap);
/* The same over a buffer the caller keeps alive and unchanged until close. */
KVC_API KVC_NODISCARD int kvc_gguf_open_memory(const void *data, size_t bytes,
                                               const kvc_allocator_t *a, kvc_gguf_t **out,
                                               char *err, size_t cap);
/* The same over a buffer the kvc_gguf_t takes: `data` was allocated with kvc_alloc(a, ...)
 * (as kvc_gguf_writer_write_memory's buffer is) and is freed through `a` by
 * kvc_gguf_close.  On failure the caller still owns it.  Errors as kvc_gguf_open_memory. */
KVC_API KVC_NODISCARD int kvc_gguf_open_memory_owned(void *data, size_t bytes,
                                                     const kvc_allocator_t *a, kvc_gguf_t **out,
                                                     char *err, size_t cap);
/* Unmap and free; NULL is a no-op. */
KVC_API void kvc_gguf_close(kvc_gguf_t *g);
/* Tell the OS that the whole pages within [p, p + n) of a mapped file will not be read soon
 * (madvise MADV_DONTNEED): they leave this process's memory and, read again, come back from
 * the file.  For weights the caller has copied (packed) elsewhere.  A no-op for a GGUF in
 * memory (kvc_gguf_open_memory), for NULL and for a range outside the file. */
KVC_API void kvc_gguf_release(const kvc_gguf_t *g, const void *p, size_t n);

KVC_API uint32_t kvc_gguf_version(const kvc_gguf_t *g);
KVC_API uint64_t kvc_gguf_file_bytes(const kvc_gguf_t *g);
KVC_API uint32_t kvc_gguf_alignment(const kvc_gguf_t *g);
KVC_API uint64_t kvc_gguf_data_offset(const kvc_gguf_t *g); /* where tensor data starts */

/* ---- metadata ---- */
KVC_API uint64_t kvc_gguf_n_kv(const kvc_gguf_t *g);
/* The index of `key` (a NUL-terminated string), or -1. */
KVC_API int64_t kvc_gguf_find(const kvc_gguf_t *g, const char *key);
/* Key i's name and type (i < n_kv; otherwise an empty string and KVC_GGUF_TYPE__COUNT). */
KVC_API kvc_gguf_str_t kvc_gguf_key(const kvc_gguf_t *g, uint64_t i);
KVC_API kvc_gguf_type_t kvc_gguf_kv_type(const kvc_gguf_t *g, uint64_t i);

/* Typed getters by key.  Integers: any integer type whose value fits (a
 * negative value for get_u64 is KVC_ERANGE).  get_u32 is get_u64 bounded to
 * 32 bits.  get_f64 takes float32, float64 and integers.  get_bool takes
 * bool only. */
KVC_API int kvc_gguf_get_u64(const kvc_gguf_t *g, const char *key, uint64_t *out);
KVC_API int kvc_gguf_get_u32(const kvc_gguf_t *g, const char *key, uint32_t *out);
KVC_API int kvc_gguf_get_i64(const kvc_gguf_t *g, const char *key, int64_t *out);
KVC_API int kvc_gguf_get_f64(const kvc_gguf_t *g, const char *key, double *out);
KVC_API int kvc_gguf_get_bool(const kvc_gguf_t *g, const char *key, bool *out);
KVC_API int kvc_gguf_get_str(const kvc_gguf_t *g, const char *key, kvc_gguf_str_t *out);
KVC_API int kvc_gguf_get_arr(const kvc_gguf_t *g, const char *key, kvc_gguf_arr_t *out);

/* Element i of an array (i < a->n): KVC_ERANGE past the end, KVC_EPARSE for
 * another element type.  arr_i64 takes every integer type and bool (a
 * uint64 above INT64_MAX is KVC_ERANGE); arr_f64 float32 and float64. */
KVC_API int kvc_gguf_arr_str(const kvc_gguf_t *g, const kvc_gguf_arr_t *a, uint64_t i,
                             kvc_gguf_str_t *out);
KVC_API int kvc_gguf_arr_i64(const kvc_gguf_arr_t *a, uint64_t i, int64_t *out);
KVC_API int kvc_gguf_arr_f64(const kvc_gguf_arr_t *a, uint64_t i, double *out);

/* Does str equal the NUL-terminated c? */
KVC_API bool kvc_gguf_str_eq(kvc_gguf_str_t str, const char *c);

/* ---- tensors ---- */
KVC_API uint64_t kvc_gguf_n_tensors(const kvc_gguf_t *g);
/* Tensor i (NULL past the end), in file order. */
KVC_API const kvc_gguf_tensor_t *kvc_gguf_tensor(const kvc_gguf_t *g, uint64_t i);
/* The tensor named `name` (NUL-terminated), or NULL. */
KVC_API const kvc_gguf_tensor_t *kvc_gguf_find_tensor(const kvc_gguf_t *g, const char *name);

/* ---- writing ----
 * A writer collects metadata and tensor declarations, then writes a GGUF v3
 * file in one pass: header, metadata in the order set, tensor records, and
 * each tensor's bytes at the next multiple of the alignment (general.alignment
 * if set, else 32).  Tensor bytes are not held by the writer: `fill` is called
 * once per tensor, in declaration order, with a buffer of exactly its bytes,
 * so a file of any size is written with one tensor in memory at a time.  Keys
 * and tensor names are copied.  The writer refuses what the reader would
 * refuse: duplicate keys or names, empty ones, bad shapes, unknown types.
 *
 * Errors: KVC_EINVAL (a bad argument: the message says which), KVC_EEXIST (a
 * duplicate key or tensor name), KVC_ENOMEM, KVC_EIO (the file could not be
 * written; a partial file is removed), or what `fill` returns (non-zero
 * stops the write; the partial file is removed).  Not thread-safe. */
typedef struct kvc_gguf_writer kvc_gguf_writer_t;

KVC_API KVC_NODISCARD int kvc_gguf_writer_create(const kvc_allocator_t *a, kvc_gguf_writer_t **out);
KVC_API void kvc_gguf_writer_destroy(kvc_gguf_writer_t *w);

KVC_API KVC_NODISCARD int kvc_gguf_writer_set_u32(kvc_gguf_writer_t *w, const char *key,
                                                  uint32_t v);
KVC_API KVC_NODISCARD int kvc_gguf_writer_set_i32(kvc_gguf_writer_t *w, const char *key, int32_t v);
KVC_API KVC_NODISCARD int kvc_gguf_writer_set_u64(kvc_gguf_writer_t *w, const char *key,
                                                  uint64_t v);
KVC_API KVC_NODISCARD int kvc_gguf_writer_set_f32(kvc_gguf_writer_t *w, const char *key, float v);
KVC_API KVC_NODISCARD int kvc_gguf_writer_set_bool(kvc_gguf_writer_t *w, const char *key, bool v);
KVC_API KVC_NODISCARD int kvc_gguf_writer_set_str(kvc_gguf_writer_t *w, const char *key,
                                                  const char *s, size_t len);
/* An array of n fixed-size elements (data: n little-endian values of `type`,
 * copied) or, for KVC_GGUF_STRING, n strings (data: a const kvc_gguf_str_t[n]). */
KVC_API KVC_NODISCARD int kvc_gguf_writer_set_arr(kvc_gguf_writer_t *w, const char *key,
                                                  kvc_gguf_type_t type, const void *data,
                                                  uint64_t n);
/* Key i of an open file, value and all (the way to carry a vocabulary over). */
KVC_API KVC_NODISCARD int kvc_gguf_writer_copy_kv(kvc_gguf_writer_t *w, const kvc_gguf_t *src,
                                                  uint64_t i);
/* Declare a tensor: ne[0..n_dims) elements per dimension, ne[0] fastest. */
KVC_API KVC_NODISCARD int kvc_gguf_writer_add_tensor(kvc_gguf_writer_t *w, const char *name,
                                                     uint32_t type, uint32_t n_dims,
                                                     const uint64_t *ne);

/* Fill tensor i's `bytes` bytes at dst; 0, or an error code that stops the write. */
typedef int (*kvc_gguf_fill_fn)(void *ctx, uint64_t i, void *dst, uint64_t bytes);

/* Write the file at `path` (replaced if it exists); err gets one line. */
KVC_API KVC_NODISCARD int kvc_gguf_writer_write(kvc_gguf_writer_t *w, const char *path,
                                                kvc_gguf_fill_fn fill, void *ctx, char *err,
                                                size_t cap);
/* The same file into memory: *out gets a buffer of *bytes bytes allocated with the
 * writer's allocator (free it with kvc_free through that allocator, or hand it to
 * kvc_gguf_open_memory_owned).  The whole file is allocated at once and the tensors are
 * filled in place.  Errors as kvc_gguf_writer_write (KVC_EIO cannot occur); on failure
 * *out and *bytes are untouched. */
KVC_API KVC_NODISCARD int kvc_gguf_writer_write_memory(kvc_gguf_writer_t *w, kvc_gguf_fill_fn fill,
                                                       void *ctx, void **out, size_t *bytes,
                                                       char *err, size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* KVCACHE_GGUF_H */
