/* gguf_write.c - the GGUF writer (see kvcache/gguf.h): metadata serialised as it is set,
 * tensors declared, then one pass to the file with each tensor's bytes filled by the
 * caller at its aligned place.  What it writes, the reader accepts (tests/test_gguf.c reads
 * every file written here back). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "kvcache/gguf.h"
#include "util/msg.h"

typedef struct {
    char *name;
    uint32_t type, n_dims;
    uint64_t ne[KVC_GGUF_MAX_DIMS];
    uint64_t bytes, offset;
} wtensor_t;

struct kvc_gguf_writer {
    kvc_allocator_t a;
    uint8_t *meta; /* the serialised key/value records */
    size_t meta_n, meta_cap;
    char **keys;
    uint64_t n_kv, keys_cap;
    wtensor_t *tensors;
    uint64_t n_tensors, tensors_cap;
    uint32_t alignment;
};

static int grow(kvc_gguf_writer_t *w, void **p, uint64_t *cap, uint64_t need, size_t elem)
{
    if (need <= *cap) return 0;
    uint64_t n = *cap ? *cap * 2 : 16;
    while (n < need) n *= 2;
    void *q = kvc_alloc(&w->a, (size_t)(n * elem), 8);
    if (!q) return KVC_ENOMEM;
    if (*p) memcpy(q, *p, (size_t)(*cap * elem));
    kvc_free(&w->a, *p);
    *p = q;
    *cap = n;
    return 0;
}

static int put(kvc_gguf_writer_t *w, const void *d, size_t n)
{
    uint64_t cap = w->meta_cap;
    int rc = grow(w, (void **)&w->meta, &cap, w->meta_n + n, 1);
    if (rc) return rc;
    w->meta_cap = (size_t)cap;
    if (n) memcpy(w->meta + w->meta_n, d, n); /* d may be NULL for an empty string */
    w->meta_n += n;
    return 0;
}

static int put_u32(kvc_gguf_writer_t *w, uint32_t v)
{
    return put(w, &v, 4);
}
static int put_u64(kvc_gguf_writer_t *w, uint64_t v)
{
    return put(w, &v, 8);
}
static int put_str(kvc_gguf_writer_t *w, const char *s, uint64_t n)
{
    int rc = put_u64(w, n);
    return rc ? rc : put(w, s, (size_t)n);
}

int kvc_gguf_writer_create(const kvc_allocator_t *a, kvc_gguf_writer_t **out)
{
    if (!out) return KVC_EINVAL;
    kvc_gguf_writer_t *w = kvc_calloc(a, 1, sizeof *w, 8);
    if (!w) return KVC_ENOMEM;
    if (a) w->a = *a;
    w->alignment = KVC_GGUF_DEFAULT_ALIGN;
    *out = w;
    return 0;
}

void kvc_gguf_writer_destroy(kvc_gguf_writer_t *w)
{
    if (!w) return;
    for (uint64_t i = 0; i < w->n_kv; i++) kvc_free(&w->a, w->keys[i]);
    for (uint64_t i = 0; i < w->n_tensors; i++) kvc_free(&w->a, w->tensors[i].name);
    kvc_free(&w->a, w->keys);
    kvc_free(&w->a, w->tensors);
    kvc_free(&w->a, w->meta);
    kvc_allocator_t a = w->a;
    kvc_free(&a, w);
}

static char *dup_str(kvc_gguf_writer_t *w, const char *s, size_t n)
{
    char *d = kvc_alloc(&w->a, n + 1, 1);
    if (d) memcpy(d, s, n), d[n] = 0;
    return d;
}

/* Start a record: the key (checked and remembered) and the value type.  On failure nothing
 * of the record stays in the buffer. */
static int begin(kvc_gguf_writer_t *w, const char *key, kvc_gguf_type_t type, size_t *mark)
{
    if (!w || !key || !key[0] || strlen(key) > KVC_GGUF_MAX_KEY) return KVC_EINVAL;
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->keys[i], key)) return KVC_EEXIST;
    int rc = grow(w, (void **)&w->keys, &w->keys_cap, w->n_kv + 1, sizeof(char *));
    if (rc) return rc;
    *mark = w->meta_n;
    if ((rc = put_str(w, key, strlen(key))) || (rc = put_u32(w, type))) {
        w->meta_n = *mark;
        return rc;
    }
    return 0;
}

/* Finish a record begun at `mark`: keep it (rc 0) or drop its bytes. */
static int end(kvc_gguf_writer_t *w, const char *key, size_t mark, int rc)
{
    char *k = rc ? NULL : dup_str(w, key, strlen(key));
    if (!rc && !k) rc = KVC_ENOMEM;
    if (rc) {
        w->meta_n = mark;
        return rc;
    }
    w->keys[w->n_kv++] = k;
    return 0;
}

static int set_fixed(kvc_gguf_writer_t *w, const char *key, kvc_gguf_type_t t, const void *v,
                     size_t n)
{
    size_t mark;
    int rc = begin(w, key, t, &mark);
    if (rc) return rc;
    return end(w, key, mark, put(w, v, n));
}

int kvc_gguf_writer_set_u32(kvc_gguf_writer_t *w, const char *key, uint32_t v)
{
    if (w && key && !strcmp(key, "general.alignment")) {
        if (v == 0 || (v & (v - 1)) || v > KVC_GGUF_MAX_ALIGN) return KVC_EINVAL;
        int rc = set_fixed(w, key, KVC_GGUF_UINT32, &v, 4);
        if (rc == 0) w->alignment = v;
        return rc;
    }
    return set_fixed(w, key, KVC_GGUF_UINT32, &v, 4);
}
int kvc_gguf_writer_set_i32(kvc_gguf_writer_t *w, const char *key, int32_t v)
{
    return set_fixed(w, key, KVC_GGUF_INT32, &v, 4);
}
int kvc_gguf_writer_set_u64(kvc_gguf_writer_t *w, const char *key, uint64_t v)
{
    return set_fixed(w, key, KVC_GGUF_UINT64, &v, 8);
}
int kvc_gguf_writer_set_f32(kvc_gguf_writer_t *w, const char *key, float v)
{
    return set_fixed(w, key, KVC_GGUF_FLOAT32, &v, 4);
}
int kvc_gguf_writer_set_bool(kvc_gguf_writer_t *w, const char *key, bool v)
{
    uint8_t b = v;
    return set_fixed(w, key, KVC_GGUF_BOOL, &b, 1);
}
int kvc_gguf_writer_set_str(kvc_gguf_writer_t *w, const char *key, const char *s, size_t len)
{
    if (!s && len) return KVC_EINVAL;
    size_t mark;
    int rc = begin(w, key, KVC_GGUF_STRING, &mark);
    if (rc) return rc;
    return end(w, key, mark, put_str(w, s, len));
}

int kvc_gguf_writer_set_arr(kvc_gguf_writer_t *w, const char *key, kvc_gguf_type_t type,
                            const void *data, uint64_t n)
{
    if ((unsigned)type >= KVC_GGUF_TYPE__COUNT || type == KVC_GGUF_ARRAY || (n && !data))
        return KVC_EINVAL;
    if (type == KVC_GGUF_BOOL)
        for (uint64_t i = 0; i < n; i++)
            if (((const uint8_t *)data)[i] > 1) return KVC_EINVAL;
    size_t mark;
    int rc = begin(w, key, KVC_GGUF_ARRAY, &mark);
    if (rc) return rc;
    if (!(rc = put_u32(w, type)) && !(rc = put_u64(w, n))) {
        if (type == KVC_GGUF_STRING) {
            const kvc_gguf_str_t *s = data;
            for (uint64_t i = 0; i < n && !rc; i++)
                rc = (!s[i].s && s[i].len) ? KVC_EINVAL : put_str(w, s[i].s, s[i].len);
        } else if (n > SIZE_MAX / kvc_gguf_type_size(type)) {
            rc = KVC_EINVAL;
        } else {
            rc = put(w, data, (size_t)(n * kvc_gguf_type_size(type)));
        }
    }
    return end(w, key, mark, rc);
}

int kvc_gguf_writer_copy_kv(kvc_gguf_writer_t *w, const kvc_gguf_t *src, uint64_t i)
{
    if (!w || !src || i >= kvc_gguf_n_kv(src)) return KVC_EINVAL;
    kvc_gguf_str_t k = kvc_gguf_key(src, i);
    char key[256];
    if (k.len >= sizeof key) return KVC_EINVAL;
    memcpy(key, k.s, k.len);
    key[k.len] = 0;
    const kvc_gguf_type_t t = kvc_gguf_kv_type(src, i);
    if (t == KVC_GGUF_STRING) {
        kvc_gguf_str_t s;
        int rc = kvc_gguf_get_str(src, key, &s);
        return rc ? rc : kvc_gguf_writer_set_str(w, key, s.s, (size_t)s.len);
    }
    if (t == KVC_GGUF_ARRAY) {
        kvc_gguf_arr_t a;
        int rc = kvc_gguf_get_arr(src, key, &a);
        if (rc) return rc;
        if (a.type != KVC_GGUF_STRING) return kvc_gguf_writer_set_arr(w, key, a.type, a.data, a.n);
        kvc_gguf_str_t *v = kvc_alloc(&w->a, (size_t)(a.n ? a.n : 1) * sizeof *v, 8);
        if (!v) return KVC_ENOMEM;
        for (uint64_t j = 0; j < a.n && !rc; j++) rc = kvc_gguf_arr_str(src, &a, j, &v[j]);
        if (!rc) rc = kvc_gguf_writer_set_arr(w, key, KVC_GGUF_STRING, v, a.n);
        kvc_free(&w->a, v);
        return rc;
    }
    /* a fixed-size scalar: its bytes as the reader keeps them */
    uint64_t u;
    int64_t s;
    double f;
    bool b;
    switch (t) {
    case KVC_GGUF_BOOL:
        if (kvc_gguf_get_bool(src, key, &b)) return KVC_EPARSE;
        return kvc_gguf_writer_set_bool(w, key, b);
    case KVC_GGUF_FLOAT32:
        if (kvc_gguf_get_f64(src, key, &f)) return KVC_EPARSE;
        return kvc_gguf_writer_set_f32(w, key, (float)f);
    case KVC_GGUF_FLOAT64:
        if (kvc_gguf_get_f64(src, key, &f)) return KVC_EPARSE;
        return set_fixed(w, key, t, &f, 8);
    case KVC_GGUF_UINT8:
    case KVC_GGUF_UINT16:
    case KVC_GGUF_UINT32:
    case KVC_GGUF_UINT64: {
        if (kvc_gguf_get_u64(src, key, &u)) return KVC_EPARSE;
        return set_fixed(w, key, t, &u, kvc_gguf_type_size(t)); /* little-endian: the low bytes */
    }
    default:
        if (kvc_gguf_get_i64(src, key, &s)) return KVC_EPARSE;
        return set_fixed(w, key, t, &s, kvc_gguf_type_size(t));
    }
}

int kvc_gguf_writer_add_tensor(kvc_gguf_writer_t *w, const char *name, uint32_t type,
                               uint32_t n_dims, const uint64_t *ne)
{
    if (!w || !name || !name[0] || strlen(name) > KVC_GGUF_MAX_NAME || n_dims < 1 ||
        n_dims > KVC_GGUF_MAX_DIMS || !ne)
        return KVC_EINVAL;
    uint32_t blk, bb;
    if (kvc_ggml_type_size(type, &blk, &bb)) return KVC_EINVAL;
    uint64_t n = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] < 1 || ne[d] > KVC_GGUF_MAX_DIM || n > (UINT64_C(1) << 62) / ne[d])
            return KVC_EINVAL;
        n *= ne[d];
    }
    if (ne[0] % blk) return KVC_EINVAL;
    for (uint64_t i = 0; i < w->n_tensors; i++)
        if (!strcmp(w->tensors[i].name, name)) return KVC_EEXIST;
    int rc = grow(w, (void **)&w->tensors, &w->tensors_cap, w->n_tensors + 1, sizeof(wtensor_t));
    if (rc) return rc;
    wtensor_t *t = &w->tensors[w->n_tensors];
    *t = (wtensor_t){.type = type, .n_dims = n_dims, .bytes = n / blk * bb};
    for (uint32_t d = 0; d < n_dims; d++) t->ne[d] = ne[d];
    if (!(t->name = dup_str(w, name, strlen(name)))) return KVC_ENOMEM;
    w->n_tensors++;
    return 0;
}

/* Where the bytes go: a file, or (f NULL) a buffer allocated once the size is known. */
typedef struct {
    FILE *f;
    uint8_t *mem;
    uint64_t size, at;
} sink_t;

static int emit(sink_t *o, const void *d, uint64_t n)
{
    if (o->f) return fwrite(d, 1, (size_t)n, o->f) == n ? 0 : KVC_EIO;
    KVC_ASSERT(o->at + n <= o->size); /* the size was computed from the same layout */
    if (n) memcpy(o->mem + o->at, d, (size_t)n);
    o->at += n;
    return 0;
}

static int pad(sink_t *o, uint64_t *pos, uint64_t align)
{
    static const uint8_t zeros[64];
    while (*pos % align) {
        uint64_t n = align - *pos % align;
        if (n > sizeof zeros) n = sizeof zeros;
        if (emit(o, zeros, n)) return KVC_EIO;
        *pos += n;
    }
    return 0;
}

static int write_all(kvc_gguf_writer_t *w, sink_t *o, kvc_gguf_fill_fn fill, void *ctx, char *err,
                     size_t cap)
{
    /* the header, the metadata, the tensor records; offsets from the data section's start */
    uint64_t off = 0, biggest = 0;
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        w->tensors[i].offset = off;
        off = (off + w->tensors[i].bytes + w->alignment - 1) / w->alignment * w->alignment;
        if (w->tensors[i].bytes > biggest) biggest = w->tensors[i].bytes;
    }
    size_t mark = w->meta_n;
    int rc = 0;
    for (uint64_t i = 0; i < w->n_tensors && !rc; i++) {
        const wtensor_t *t = &w->tensors[i];
        rc = put_str(w, t->name, strlen(t->name));
        if (!rc) rc = put_u32(w, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims && !rc; d++) rc = put_u64(w, t->ne[d]);
        if (!rc) rc = put_u32(w, t->type);
        if (!rc) rc = put_u64(w, t->offset);
    }
    if (!rc && !o->f) { /* memory: the whole file's size, then one allocation */
        uint64_t head = 24 + w->meta_n;
        head = (head + w->alignment - 1) / w->alignment * w->alignment;
        const wtensor_t *last = w->n_tensors ? &w->tensors[w->n_tensors - 1] : NULL;
        o->size = head + (last ? last->offset + last->bytes : 0);
        o->mem = o->size <= SIZE_MAX ? kvc_alloc(&w->a, (size_t)o->size, 64) : NULL;
        if (!o->mem) rc = KVC_ENOMEM;
    }
    uint8_t head[24];
    memcpy(head, "GGUF", 4);
    const uint32_t version = 3;
    memcpy(head + 4, &version, 4);
    memcpy(head + 8, &w->n_tensors, 8);
    memcpy(head + 16, &w->n_kv, 8);
    if (!rc && (emit(o, head, 24) || emit(o, w->meta, w->meta_n))) rc = KVC_EIO;
    uint64_t pos = 24 + w->meta_n; /* header + metadata + tensor records */
    w->meta_n = mark;              /* the records are rebuilt on the next write */
    if (rc) return kvc__msgf(rc, err, cap, "%s", rc == KVC_EIO ? strerror(errno) : "out of memory");
    if ((rc = pad(o, &pos, w->alignment))) return kvc__msgf(rc, err, cap, "%s", strerror(errno));
    /* the tensors' bytes, one tensor in memory at a time (in memory: filled in place) */
    uint8_t *buf = biggest && o->f ? kvc_alloc(&w->a, (size_t)biggest, 64) : NULL;
    if (biggest && o->f && !buf) return kvc__msgf(KVC_ENOMEM, err, cap, "out of memory");
    for (uint64_t i = 0; i < w->n_tensors && !rc; i++) {
        const wtensor_t *t = &w->tensors[i];
        uint8_t *dst = o->f ? buf : o->mem + o->at;
        rc = fill ? fill(ctx, i, dst, t->bytes) : (memset(dst, 0, (size_t)t->bytes), 0);
        if (rc) {
            kvc__msgf(rc, err, cap, "tensor '%s': the fill callback failed: %s", t->name,
                      kvc_strerror(rc));
            break;
        }
        if (o->f ? emit(o, buf, t->bytes) : (o->at += t->bytes, 0)) {
            rc = kvc__msgf(KVC_EIO, err, cap, "%s", strerror(errno));
            break;
        }
        pos += t->bytes;
        if (i + 1 < w->n_tensors && (rc = pad(o, &pos, w->alignment)))
            kvc__msgf(rc, err, cap, "%s", strerror(errno));
    }
    kvc_free(&w->a, buf);
    return rc;
}

int kvc_gguf_writer_write(kvc_gguf_writer_t *w, const char *path, kvc_gguf_fill_fn fill, void *ctx,
                          char *err, size_t cap)
{
    if (err && cap) err[0] = 0;
    if (!w || !path) return kvc__msgf(KVC_EINVAL, err, cap, "invalid argument");
    FILE *f = fopen(path, "wb");
    if (!f) return kvc__msgf(KVC_EIO, err, cap, "cannot create: %s", strerror(errno));
    sink_t o = {.f = f};
    int rc = write_all(w, &o, fill, ctx, err, cap);
    if (fclose(f) != 0 && !rc) rc = kvc__msgf(KVC_EIO, err, cap, "%s", strerror(errno));
    if (rc) unlink(path);
    return rc;
}

int kvc_gguf_writer_write_memory(kvc_gguf_writer_t *w, kvc_gguf_fill_fn fill, void *ctx, void **out,
                                 size_t *bytes, char *err, size_t cap)
{
    if (err && cap) err[0] = 0;
    if (!w || !out || !bytes) return kvc__msgf(KVC_EINVAL, err, cap, "invalid argument");
    sink_t o = {0};
    int rc = write_all(w, &o, fill, ctx, err, cap);
    if (rc) {
        kvc_free(&w->a, o.mem);
        return rc;
    }
    KVC_ASSERT(o.at == o.size);
    *out = o.mem;
    *bytes = (size_t)o.size;
    return 0;
}
