/* gguf.c - the validating GGUF reader (see kvcache/gguf.h).
 *
 * One pass over the header reads every key/value and tensor record through a
 * bounded cursor: every read says how many bytes it needs and fails with the
 * offset when fewer remain, so nothing past the file is ever touched.  The
 * records are kept as offsets into the mapping (values are decoded on
 * lookup), plus one offset table per string array so that vocabularies of
 * 150K strings are indexable.  Then the checks that need the whole picture:
 * duplicate keys and names (by sorting), the alignment, and every tensor's
 * bytes inside the data section without overlapping another's.
 */
#include "kvcache/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/msg.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF reader assumes a little-endian host"
#endif

typedef struct {
    kvc_gguf_str_t key;
    kvc_gguf_type_t type;
    kvc_gguf_type_t elem; /* arrays */
    uint64_t n;           /* arrays: element count */
    const uint8_t *value; /* the value's first byte (an array's first element) */
    uint64_t *str_off;    /* string arrays: each element's offset from `value` */
} kv_t;

struct kvc_gguf {
    kvc_allocator_t a;
    const uint8_t *base;
    uint64_t size;
    bool mapped;
    bool owned; /* base came from kvc_gguf_open_memory_owned: freed through a at close */
    uint32_t version, alignment;
    uint64_t data_offset;
    uint64_t n_kv, n_tensors;
    kv_t *kv;
    kvc_gguf_tensor_t *tensors;
    uint64_t *kv_sorted;     /* indices of kv by key, for lookup */
    uint64_t *tensor_sorted; /* indices of tensors by name */
};

/* ---- types ---------------------------------------------------------------- */
static const struct {
    const char *name;
    uint32_t block, bytes;
} ggml_types[KVC_GGML_TYPE__END] = {
    [KVC_GGML_F32] = {"f32", 1, 4},       [KVC_GGML_F16] = {"f16", 1, 2},
    [KVC_GGML_Q4_0] = {"q4_0", 32, 18},   [KVC_GGML_Q4_1] = {"q4_1", 32, 20},
    [KVC_GGML_Q5_0] = {"q5_0", 32, 22},   [KVC_GGML_Q5_1] = {"q5_1", 32, 24},
    [KVC_GGML_Q8_0] = {"q8_0", 32, 34},   [KVC_GGML_Q8_1] = {"q8_1", 32, 36},
    [KVC_GGML_Q2_K] = {"q2_K", 256, 84},  [KVC_GGML_Q3_K] = {"q3_K", 256, 110},
    [KVC_GGML_Q4_K] = {"q4_K", 256, 144}, [KVC_GGML_Q5_K] = {"q5_K", 256, 176},
    [KVC_GGML_Q6_K] = {"q6_K", 256, 210}, [KVC_GGML_Q8_K] = {"q8_K", 256, 292},
    [KVC_GGML_I8] = {"i8", 1, 1},         [KVC_GGML_I16] = {"i16", 1, 2},
    [KVC_GGML_I32] = {"i32", 1, 4},       [KVC_GGML_I64] = {"i64", 1, 8},
    [KVC_GGML_F64] = {"f64", 1, 8},       [KVC_GGML_BF16] = {"bf16", 1, 2},
};

const char *kvc_ggml_type_name(uint32_t type)
{
    return type < KVC_GGML_TYPE__END ? ggml_types[type].name : NULL;
}

int kvc_ggml_type_size(uint32_t type, uint32_t *block_elems, uint32_t *block_bytes)
{
    if (type >= KVC_GGML_TYPE__END || !ggml_types[type].name) return KVC_ENOTSUP;
    if (block_elems) *block_elems = ggml_types[type].block;
    if (block_bytes) *block_bytes = ggml_types[type].bytes;
    return 0;
}

static const char *const value_type_names[KVC_GGUF_TYPE__COUNT] = {
    "uint8", "int8",   "uint16", "int16",  "uint32", "int32",  "float32",
    "bool",  "string", "array",  "uint64", "int64",  "float64"};

const char *kvc_gguf_type_name(kvc_gguf_type_t t)
{
    return (unsigned)t < KVC_GGUF_TYPE__COUNT ? value_type_names[t] : "?";
}

uint32_t kvc_gguf_type_size(kvc_gguf_type_t t)
{
    static const uint8_t sizes[KVC_GGUF_TYPE__COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return (unsigned)t < KVC_GGUF_TYPE__COUNT ? sizes[t] : 0;
}

/* ---- the bounded cursor ---------------------------------------------------- */
typedef struct {
    const uint8_t *base;
    uint64_t size, pos;
    char *err;
    size_t cap;
} cur_t;

#define bad(c, ...) kvc__msgf(KVC_EPARSE, (c)->err, (c)->cap, __VA_ARGS__)

static int need(cur_t *c, uint64_t n, const char *what)
{
    if (n > c->size - c->pos)
        return bad(c, "truncated at byte %llu: %s needs %llu bytes, %llu remain",
                   (unsigned long long)c->pos, what, (unsigned long long)n,
                   (unsigned long long)(c->size - c->pos));
    return 0;
}

static int rd(cur_t *c, void *out, uint64_t n, const char *what)
{
    int rc = need(c, n, what);
    if (rc) return rc;
    memcpy(out, c->base + c->pos, n);
    c->pos += n;
    return 0;
}

static int rd_u32(cur_t *c, uint32_t *v, const char *what)
{
    return rd(c, v, 4, what);
}
static int rd_u64(cur_t *c, uint64_t *v, const char *what)
{
    return rd(c, v, 8, what);
}

/* A string: u64 length, then the bytes (bounded by `max`). */
static int rd_str(cur_t *c, kvc_gguf_str_t *s, uint64_t max, const char *what)
{
    uint64_t at = c->pos, len;
    int rc = rd_u64(c, &len, what);
    if (rc) return rc;
    if (len > max)
        return bad(c, "%s at byte %llu: length %llu, at most %llu", what, (unsigned long long)at,
                   (unsigned long long)len, (unsigned long long)max);
    if ((rc = need(c, len, what))) return rc;
    s->s = (const char *)c->base + c->pos;
    s->len = len;
    c->pos += len;
    return 0;
}

/* Printable for messages: the first bytes of s, control bytes replaced. */
static const char *show(kvc_gguf_str_t s, char *buf, size_t cap)
{
    size_t n = 0;
    for (uint64_t i = 0; i < s.len && n + 4 < cap; i++) {
        unsigned char ch = (unsigned char)s.s[i];
        buf[n++] = ch < 0x20 || ch == 0x7f ? '?' : (char)ch;
    }
    if (s.len > n && n + 4 <= cap) memcpy(buf + n, "...", 3), n += 3;
    buf[n] = 0;
    return buf;
}

static bool has_nul(kvc_gguf_str_t s)
{
    return s.len && memchr(s.s, 0, s.len) != NULL;
}

/* ---- parsing ----------------------------------------------------------------- */
static int parse_value(kvc_gguf_t *g, cur_t *c, kv_t *kv, char *kbuf)
{
    int rc;
    uint32_t t;
    if ((rc = rd_u32(c, &t, "a value type"))) return rc;
    if (t >= KVC_GGUF_TYPE__COUNT)
        return bad(c, "key '%s': value type %u is not a GGUF type (0..12)", kbuf, t);
    kv->type = (kvc_gguf_type_t)t;
    if (kv->type == KVC_GGUF_ARRAY) {
        uint32_t et;
        if ((rc = rd_u32(c, &et, "an array's element type"))) return rc;
        if (et >= KVC_GGUF_TYPE__COUNT)
            return bad(c, "key '%s': array element type %u is not a GGUF type", kbuf, et);
        if (et == KVC_GGUF_ARRAY) return bad(c, "key '%s': nested arrays are not supported", kbuf);
        kv->elem = (kvc_gguf_type_t)et;
        if ((rc = rd_u64(c, &kv->n, "an array's length"))) return rc;
        kv->value = c->base + c->pos;
        if (kv->elem != KVC_GGUF_STRING) {
            uint64_t es = kvc_gguf_type_size(kv->elem);
            if (kv->n > (c->size - c->pos) / es)
                return bad(c, "key '%s': %llu elements of %s cannot fit in the %llu bytes left",
                           kbuf, (unsigned long long)kv->n, kvc_gguf_type_name(kv->elem),
                           (unsigned long long)(c->size - c->pos));
            if (kv->elem == KVC_GGUF_BOOL)
                for (uint64_t i = 0; i < kv->n; i++)
                    if (kv->value[i] > 1)
                        return bad(c, "key '%s': element %llu is a bool of value %u", kbuf,
                                   (unsigned long long)i, kv->value[i]);
            c->pos += kv->n * es;
            return 0;
        }
        /* every string needs at least its 8-byte length */
        if (kv->n > (c->size - c->pos) / 8)
            return bad(c, "key '%s': %llu strings cannot fit in the %llu bytes left", kbuf,
                       (unsigned long long)kv->n, (unsigned long long)(c->size - c->pos));
        kv->str_off = kvc_alloc(&g->a, (size_t)(kv->n ? kv->n : 1) * sizeof(uint64_t), 8);
        if (!kv->str_off) return kvc__msgf(KVC_ENOMEM, c->err, c->cap, "out of memory");
        for (uint64_t i = 0; i < kv->n; i++) {
            kv->str_off[i] = (uint64_t)(c->base + c->pos - kv->value);
            kvc_gguf_str_t s;
            if ((rc = rd_str(c, &s, UINT64_MAX, "an array string"))) return rc;
        }
        return 0;
    }
    kv->value = c->base + c->pos;
    if (kv->type == KVC_GGUF_STRING) {
        kvc_gguf_str_t s;
        return rd_str(c, &s, UINT64_MAX, "a string value");
    }
    if ((rc = need(c, kvc_gguf_type_size(kv->type), "a value"))) return rc;
    if (kv->type == KVC_GGUF_BOOL && *kv->value > 1)
        return bad(c, "key '%s': a bool of value %u", kbuf, *kv->value);
    c->pos += kvc_gguf_type_size(kv->type);
    return 0;
}

static int parse_kvs(kvc_gguf_t *g, cur_t *c)
{
    for (uint64_t i = 0; i < g->n_kv; i++) {
        kv_t *kv = &g->kv[i];
        char kbuf[80];
        int rc = rd_str(c, &kv->key, KVC_GGUF_MAX_KEY, "a key");
        if (rc) return rc;
        show(kv->key, kbuf, sizeof kbuf);
        if (!kv->key.len || has_nul(kv->key))
            return bad(c, "key %llu ('%s') is empty or holds a NUL", (unsigned long long)i, kbuf);
        if ((rc = parse_value(g, c, kv, kbuf))) return rc;
    }
    return 0;
}

static int parse_tensor_infos(kvc_gguf_t *g, cur_t *c)
{
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        kvc_gguf_tensor_t *t = &g->tensors[i];
        char nbuf[80];
        int rc = rd_str(c, &t->name, KVC_GGUF_MAX_NAME, "a tensor name");
        if (rc) return rc;
        show(t->name, nbuf, sizeof nbuf);
        if (!t->name.len || has_nul(t->name))
            return bad(c, "tensor %llu ('%s'): name empty or holding a NUL", (unsigned long long)i,
                       nbuf);
        if ((rc = rd_u32(c, &t->n_dims, "a tensor's dimension count"))) return rc;
        if (t->n_dims < 1 || t->n_dims > KVC_GGUF_MAX_DIMS)
            return bad(c, "tensor '%s': %u dimensions (1..%d)", nbuf, t->n_dims, KVC_GGUF_MAX_DIMS);
        t->n_elems = 1;
        for (uint32_t d = 0; d < KVC_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            if ((rc = rd_u64(c, &t->ne[d], "a tensor dimension"))) return rc;
            if (t->ne[d] < 1 || t->ne[d] > KVC_GGUF_MAX_DIM)
                return bad(c, "tensor '%s': dimension %u is %llu (1..2^40)", nbuf, d,
                           (unsigned long long)t->ne[d]);
            if (t->n_elems > (UINT64_C(1) << 62) / t->ne[d])
                return bad(c, "tensor '%s': more than 2^62 elements", nbuf);
            t->n_elems *= t->ne[d];
        }
        if ((rc = rd_u32(c, &t->type, "a tensor type"))) return rc;
        uint32_t blk, bb;
        if (kvc_ggml_type_size(t->type, &blk, &bb))
            return bad(c, "tensor '%s': type %u is not a tensor type this reader knows", nbuf,
                       t->type);
        if (t->ne[0] % blk)
            return bad(c, "tensor '%s': first dimension %llu is not a multiple of %s's block of %u",
                       nbuf, (unsigned long long)t->ne[0], kvc_ggml_type_name(t->type), blk);
        t->bytes = t->n_elems / blk * bb; /* <= 2^62 / 1 * 292 / 256 < 2^63 */
        if ((rc = rd_u64(c, &t->offset, "a tensor offset"))) return rc;
    }
    return 0;
}

/* ---- whole-file checks --------------------------------------------------------- */
static int str_cmp(kvc_gguf_str_t a, kvc_gguf_str_t b)
{
    uint64_t n = a.len < b.len ? a.len : b.len;
    int r = n ? memcmp(a.s, b.s, n) : 0;
    return r ? r : (a.len > b.len) - (a.len < b.len);
}

/* qsort has no context argument: sort (key, index) pairs instead. */
typedef struct {
    kvc_gguf_str_t s;
    uint64_t i;
} named_t;

static int named_cmp(const void *x, const void *y)
{
    const named_t *a = x, *b = y;
    return str_cmp(a->s, b->s);
}

/* Sort names into `order`; refuse duplicates.  `what` names the kind. */
static int sort_names(kvc_gguf_t *g, cur_t *c, uint64_t n,
                      const kvc_gguf_str_t *(*name)(kvc_gguf_t *, uint64_t), uint64_t *order,
                      const char *what)
{
    if (!n) return 0;
    named_t *tmp = kvc_alloc(&g->a, (size_t)n * sizeof *tmp, 8);
    if (!tmp) return kvc__msgf(KVC_ENOMEM, c->err, c->cap, "out of memory");
    for (uint64_t i = 0; i < n; i++) tmp[i] = (named_t){*name(g, i), i};
    qsort(tmp, (size_t)n, sizeof *tmp, named_cmp);
    int rc = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (i && !str_cmp(tmp[i - 1].s, tmp[i].s)) {
            char buf[80];
            rc = bad(c, "%s '%s' appears twice", what, show(tmp[i].s, buf, sizeof buf));
            break;
        }
        order[i] = tmp[i].i;
    }
    kvc_free(&g->a, tmp);
    return rc;
}

static const kvc_gguf_str_t *kv_name(kvc_gguf_t *g, uint64_t i)
{
    return &g->kv[i].key;
}
static const kvc_gguf_str_t *tensor_name(kvc_gguf_t *g, uint64_t i)
{
    return &g->tensors[i].name;
}

static int read_alignment(kvc_gguf_t *g, cur_t *c)
{
    g->alignment = KVC_GGUF_DEFAULT_ALIGN;
    if (kvc_gguf_find(g, "general.alignment") < 0) return 0;
    uint32_t a;
    int rc = kvc_gguf_get_u32(g, "general.alignment", &a);
    if (rc || a == 0 || (a & (a - 1)) || a > KVC_GGUF_MAX_ALIGN)
        return bad(c, "general.alignment must be a power of two in 1..2^20 (a uint32)");
    g->alignment = a;
    return 0;
}

typedef struct {
    uint64_t offset, i;
} placed_t;

static int placed_cmp(const void *x, const void *y)
{
    const placed_t *a = x, *b = y;
    return (a->offset > b->offset) - (a->offset < b->offset);
}

static int place_tensors(kvc_gguf_t *g, cur_t *c)
{
    uint64_t end = c->pos, a = g->alignment;
    g->data_offset = (end + a - 1) / a * a;
    if (g->data_offset > g->size) {
        if (g->n_tensors)
            return bad(c, "the data section would start at byte %llu, past the end (%llu bytes)",
                       (unsigned long long)g->data_offset, (unsigned long long)g->size);
        g->data_offset = g->size; /* a vocab-only file may end without padding */
    }
    const uint64_t data_bytes = g->size - g->data_offset;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        kvc_gguf_tensor_t *t = &g->tensors[i];
        char nbuf[80];
        show(t->name, nbuf, sizeof nbuf);
        if (t->offset % a)
            return bad(c, "tensor '%s': offset %llu is not a multiple of the alignment %llu", nbuf,
                       (unsigned long long)t->offset, (unsigned long long)a);
        if (t->offset > data_bytes || t->bytes > data_bytes - t->offset)
            return bad(c,
                       "tensor '%s': %llu bytes at offset %llu run past the end of the file "
                       "(%llu bytes of data)",
                       nbuf, (unsigned long long)t->bytes, (unsigned long long)t->offset,
                       (unsigned long long)data_bytes);
        t->data = g->base + g->data_offset + t->offset;
    }
    /* no two tensors share a byte: sort by offset */
    if (g->n_tensors < 2) return 0;
    placed_t *by = kvc_alloc(&g->a, (size_t)g->n_tensors * sizeof *by, 8);
    if (!by) return kvc__msgf(KVC_ENOMEM, c->err, c->cap, "out of memory");
    for (uint64_t i = 0; i < g->n_tensors; i++) by[i] = (placed_t){g->tensors[i].offset, i};
    qsort(by, (size_t)g->n_tensors, sizeof *by, placed_cmp);
    int rc = 0;
    for (uint64_t k = 1; k < g->n_tensors && !rc; k++) {
        const kvc_gguf_tensor_t *p = &g->tensors[by[k - 1].i], *t = &g->tensors[by[k].i];
        if (p->offset + p->bytes > t->offset) {
            char b1[80], b2[80];
            rc = bad(c, "tensors '%s' and '%s' overlap", show(p->name, b1, sizeof b1),
                     show(t->name, b2, sizeof b2));
        }
    }
    kvc_free(&g->a, by);
    return rc;
}

static int parse(kvc_gguf_t *g, char *err, size_t cap)
{
    cur_t c = {.base = g->base, .size = g->size, .err = err, .cap = cap};
    char magic[4];
    int rc = rd(&c, magic, 4, "the magic");
    if (rc) return rc;
    if (memcmp(magic, "GGUF", 4)) return bad(&c, "not a GGUF file (no 'GGUF' magic)");
    if ((rc = rd_u32(&c, &g->version, "the version"))) return rc;
    if (g->version == 1) return bad(&c, "GGUF version 1 is not supported (versions 2 and 3 are)");
    if (g->version != 2 && g->version != 3) {
        if ((g->version & 0xFFFF) == 0) return bad(&c, "a big-endian GGUF file: not supported");
        return bad(&c, "GGUF version %u is not supported (versions 2 and 3 are)", g->version);
    }
    if ((rc = rd_u64(&c, &g->n_tensors, "the tensor count"))) return rc;
    if ((rc = rd_u64(&c, &g->n_kv, "the key/value count"))) return rc;
    /* a key/value takes at least 8 + 1 + 4 + 1 bytes, a tensor record 8 + 1 + 4 + 8 + 4 + 8 */
    const uint64_t left = g->size - c.pos;
    if (g->n_kv > left / 14 || g->n_tensors > left / 33 || g->n_kv * 14 + g->n_tensors * 33 > left)
        return bad(&c, "%llu keys and %llu tensors cannot fit in a file of %llu bytes",
                   (unsigned long long)g->n_kv, (unsigned long long)g->n_tensors,
                   (unsigned long long)g->size);
    g->kv = kvc_calloc(&g->a, (size_t)(g->n_kv ? g->n_kv : 1), sizeof *g->kv, 8);
    g->tensors =
        kvc_calloc(&g->a, (size_t)(g->n_tensors ? g->n_tensors : 1), sizeof *g->tensors, 8);
    g->kv_sorted = kvc_alloc(&g->a, (size_t)(g->n_kv ? g->n_kv : 1) * sizeof(uint64_t), 8);
    g->tensor_sorted =
        kvc_alloc(&g->a, (size_t)(g->n_tensors ? g->n_tensors : 1) * sizeof(uint64_t), 8);
    if (!g->kv || !g->tensors || !g->kv_sorted || !g->tensor_sorted)
        return kvc__msgf(KVC_ENOMEM, err, cap, "out of memory");
    if ((rc = parse_kvs(g, &c))) return rc;
    if ((rc = sort_names(g, &c, g->n_kv, kv_name, g->kv_sorted, "key"))) return rc;
    if ((rc = read_alignment(g, &c))) return rc;
    if ((rc = parse_tensor_infos(g, &c))) return rc;
    if ((rc = sort_names(g, &c, g->n_tensors, tensor_name, g->tensor_sorted, "tensor name")))
        return rc;
    return place_tensors(g, &c);
}

/* ---- open / close ----------------------------------------------------------------- */
static int open_common(const kvc_allocator_t *a, const uint8_t *base, uint64_t size, bool mapped,
                       kvc_gguf_t **out, char *err, size_t cap)
{
    kvc_gguf_t *g = kvc_calloc(a, 1, sizeof *g, 8);
    if (!g) return kvc__msgf(KVC_ENOMEM, err, cap, "out of memory");
    if (a) g->a = *a;
    g->base = base;
    g->size = size;
    g->mapped = mapped;
    int rc = parse(g, err, cap);
    if (rc) {
        g->mapped = false; /* the caller unmaps on failure */
        kvc_gguf_close(g);
        return rc;
    }
    *out = g;
    return 0;
}

int kvc_gguf_open_memory(const void *data, size_t bytes, const kvc_allocator_t *a, kvc_gguf_t **out,
                         char *err, size_t cap)
{
    if (err && cap) err[0] = 0;
    if (!out || (!data && bytes)) return kvc__msgf(KVC_EINVAL, err, cap, "invalid argument");
    *out = NULL;
    return open_common(a, data, bytes, false, out, err, cap);
}

int kvc_gguf_open_memory_owned(void *data, size_t bytes, const kvc_allocator_t *a, kvc_gguf_t **out,
                               char *err, size_t cap)
{
    int rc = kvc_gguf_open_memory(data, bytes, a, out, err, cap);
    if (rc == 0) (*out)->owned = true;
    return rc;
}

int kvc_gguf_open(const char *path, const kvc_allocator_t *a, kvc_gguf_t **out, char *err,
                  size_t cap)
{
    if (err && cap) err[0] = 0;
    if (!path || !out) return kvc__msgf(KVC_EINVAL, err, cap, "invalid argument");
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kvc__msgf(KVC_EIO, err, cap, "cannot open: %s", strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return kvc__msgf(KVC_EIO, err, cap, "cannot stat: %s", strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return kvc__msgf(KVC_EIO, err, cap, "not a regular file");
    }
    if (st.st_size == 0) {
        close(fd);
        return kvc__msgf(KVC_EPARSE, err, cap, "empty file: not a GGUF file");
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd); /* the mapping keeps the file */
    if (m == MAP_FAILED) return kvc__msgf(KVC_EIO, err, cap, "cannot map: %s", strerror(e));
    int rc = open_common(a, m, (uint64_t)st.st_size, true, out, err, cap);
    if (rc) munmap(m, (size_t)st.st_size);
    return rc;
}

void kvc_gguf_release(const kvc_gguf_t *g, const void *p, size_t n)
{
    if (!g || !g->mapped || !p) return;
    const uintptr_t lo = (uintptr_t)g->base, hi = lo + (uintptr_t)g->size, a = (uintptr_t)p;
    if (a < lo || a > hi || n > hi - a) return;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t b = (a + page - 1) & ~(page - 1), e = (a + n) & ~(page - 1);
    if (e > b) (void)madvise((void *)b, e - b, MADV_DONTNEED);
}

void kvc_gguf_close(kvc_gguf_t *g)
{
    if (!g) return;
    if (g->kv)
        for (uint64_t i = 0; i < g->n_kv; i++) kvc_free(&g->a, g->kv[i].str_off);
    kvc_free(&g->a, g->kv);
    kvc_free(&g->a, g->tensors);
    kvc_free(&g->a, g->kv_sorted);
    kvc_free(&g->a, g->tensor_sorted);
    if (g->mapped) munmap((void *)g->base, (size_t)g->size);
    if (g->owned) kvc_free(&g->a, (void *)g->base);
    kvc_allocator_t a = g->a;
    kvc_free(&a, g);
}

uint32_t kvc_gguf_version(const kvc_gguf_t *g)
{
    return g->version;
}
uint64_t kvc_gguf_file_bytes(const kvc_gguf_t *g)
{
    return g->size;
}
uint32_t kvc_gguf_alignment(const kvc_gguf_t *g)
{
    return g->alignment;
}
uint64_t kvc_gguf_data_offset(const kvc_gguf_t *g)
{
    return g->data_offset;
}
uint64_t kvc_gguf_n_kv(const kvc_gguf_t *g)
{
    return g->n_kv;
}
uint64_t kvc_gguf_n_tensors(const kvc_gguf_t *g)
{
    return g->n_tensors;
}

bool kvc_gguf_str_eq(kvc_gguf_str_t str, const char *c)
{
    size_t n = strlen(c);
    return str.len == n && (n == 0 || memcmp(str.s, c, n) == 0);
}

/* Binary search over `order` (names sorted); -1 if absent. */
static int64_t find_sorted(const kvc_gguf_t *g, const uint64_t *order, uint64_t n,
                           const kvc_gguf_str_t *(*name)(kvc_gguf_t *, uint64_t), const char *s)
{
    if (!s) return -1;
    kvc_gguf_str_t want = {s, strlen(s)};
    uint64_t lo = 0, hi = n;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        int r = str_cmp(*name((kvc_gguf_t *)g, order[mid]), want);
        if (r == 0) return (int64_t)order[mid];
        if (r < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

int64_t kvc_gguf_find(const kvc_gguf_t *g, const char *key)
{
    return find_sorted(g, g->kv_sorted, g->n_kv, kv_name, key);
}

kvc_gguf_str_t kvc_gguf_key(const kvc_gguf_t *g, uint64_t i)
{
    return i < g->n_kv ? g->kv[i].key : (kvc_gguf_str_t){"", 0};
}

kvc_gguf_type_t kvc_gguf_kv_type(const kvc_gguf_t *g, uint64_t i)
{
    return i < g->n_kv ? g->kv[i].type : KVC_GGUF_TYPE__COUNT;
}

/* ---- typed getters --------------------------------------------------------------- */
/* An integer value of any width as (negative?, magnitude-or-value). */
static bool int_value(kvc_gguf_type_t t, const uint8_t *p, int64_t *sv, uint64_t *uv, bool *neg)
{
    union {
        uint8_t u8;
        int8_t i8;
        uint16_t u16;
        int16_t i16;
        uint32_t u32;
        int32_t i32;
        uint64_t u64;
        int64_t i64;
    } v;
    memcpy(&v, p, kvc_gguf_type_size(t));
    int64_t s = 0;
    switch (t) {
    case KVC_GGUF_UINT8:
        *uv = v.u8;
        *neg = false;
        return true;
    case KVC_GGUF_UINT16:
        *uv = v.u16;
        *neg = false;
        return true;
    case KVC_GGUF_UINT32:
        *uv = v.u32;
        *neg = false;
        return true;
    case KVC_GGUF_UINT64:
        *uv = v.u64;
        *neg = false;
        return true;
    case KVC_GGUF_INT8:
        s = v.i8;
        break;
    case KVC_GGUF_INT16:
        s = v.i16;
        break;
    case KVC_GGUF_INT32:
        s = v.i32;
        break;
    case KVC_GGUF_INT64:
        s = v.i64;
        break;
    default:
        return false;
    }
    *sv = s;
    *neg = s < 0;
    *uv = s < 0 ? 0 : (uint64_t)s;
    return true;
}

static const kv_t *lookup(const kvc_gguf_t *g, const char *key)
{
    int64_t i = g && key ? kvc_gguf_find(g, key) : -1;
    return i < 0 ? NULL : &g->kv[i];
}

int kvc_gguf_get_u64(const kvc_gguf_t *g, const char *key, uint64_t *out)
{
    const kv_t *kv = lookup(g, key);
    if (!kv) return KVC_ENOENT;
    int64_t sv;
    uint64_t uv;
    bool neg;
    if (!int_value(kv->type, kv->value, &sv, &uv, &neg)) return KVC_EPARSE;
    if (neg) return KVC_ERANGE;
    *out = uv;
    return 0;
}

int kvc_gguf_get_u32(const kvc_gguf_t *g, const char *key, uint32_t *out)
{
    uint64_t v;
    int rc = kvc_gguf_get_u64(g, key, &v);
    if (rc) return rc;
    if (v > UINT32_MAX) return KVC_ERANGE;
    *out = (uint32_t)v;
    return 0;
}

int kvc_gguf_get_i64(const kvc_gguf_t *g, const char *key, int64_t *out)
{
    const kv_t *kv = lookup(g, key);
    if (!kv) return KVC_ENOENT;
    int64_t sv;
    uint64_t uv;
    bool neg;
    if (!int_value(kv->type, kv->value, &sv, &uv, &neg)) return KVC_EPARSE;
    if (neg) {
        *out = sv;
        return 0;
    }
    if (uv > INT64_MAX) return KVC_ERANGE;
    *out = (int64_t)uv;
    return 0;
}

static bool float_value(kvc_gguf_type_t t, const uint8_t *p, double *out)
{
    if (t == KVC_GGUF_FLOAT32) {
        float f;
        memcpy(&f, p, 4);
        *out = f;
        return true;
    }
    if (t == KVC_GGUF_FLOAT64) {
        memcpy(out, p, 8);
        return true;
    }
    return false;
}

int kvc_gguf_get_f64(const kvc_gguf_t *g, const char *key, double *out)
{
    const kv_t *kv = lookup(g, key);
    if (!kv) return KVC_ENOENT;
    if (float_value(kv->type, kv->value, out)) return 0;
    int64_t sv;
    uint64_t uv;
    bool neg;
    if (!int_value(kv->type, kv->value, &sv, &uv, &neg)) return KVC_EPARSE;
    *out = neg ? (double)sv : (double)uv;
    return 0;
}

int kvc_gguf_get_bool(const kvc_gguf_t *g, const char *key, bool *out)
{
    const kv_t *kv = lookup(g, key);
    if (!kv) return KVC_ENOENT;
    if (kv->type != KVC_GGUF_BOOL) return KVC_EPARSE;
    *out = *kv->value != 0;
    return 0;
}

int kvc_gguf_get_str(const kvc_gguf_t *g, const char *key, kvc_gguf_str_t *out)
{
    const kv_t *kv = lookup(g, key);
    if (!kv) return KVC_ENOENT;
    if (kv->type != KVC_GGUF_STRING) return KVC_EPARSE;
    uint64_t len;
    memcpy(&len, kv->value, 8);
    *out = (kvc_gguf_str_t){(const char *)kv->value + 8, len};
    return 0;
}

int kvc_gguf_get_arr(const kvc_gguf_t *g, const char *key, kvc_gguf_arr_t *out)
{
    const kv_t *kv = lookup(g, key);
    if (!kv) return KVC_ENOENT;
    if (kv->type != KVC_GGUF_ARRAY) return KVC_EPARSE;
    *out = (kvc_gguf_arr_t){kv->elem, kv->n, kv->value, (uint32_t)(kv - g->kv)};
    return 0;
}

int kvc_gguf_arr_str(const kvc_gguf_t *g, const kvc_gguf_arr_t *a, uint64_t i, kvc_gguf_str_t *out)
{
    if (!g || !a || a->index >= g->n_kv) return KVC_EINVAL;
    const kv_t *kv = &g->kv[a->index];
    if (kv->type != KVC_GGUF_ARRAY || kv->value != a->data) return KVC_EINVAL;
    if (kv->elem != KVC_GGUF_STRING) return KVC_EPARSE;
    if (i >= kv->n) return KVC_ERANGE;
    const uint8_t *p = kv->value + kv->str_off[i];
    uint64_t len;
    memcpy(&len, p, 8);
    *out = (kvc_gguf_str_t){(const char *)p + 8, len};
    return 0;
}

int kvc_gguf_arr_i64(const kvc_gguf_arr_t *a, uint64_t i, int64_t *out)
{
    if (!a) return KVC_EINVAL;
    if (i >= a->n) return KVC_ERANGE;
    const uint8_t *p = (const uint8_t *)a->data + i * kvc_gguf_type_size(a->type);
    if (a->type == KVC_GGUF_BOOL) {
        *out = *p;
        return 0;
    }
    int64_t sv;
    uint64_t uv;
    bool neg;
    if (!int_value(a->type, p, &sv, &uv, &neg)) return KVC_EPARSE;
    if (!neg && uv > INT64_MAX) return KVC_ERANGE;
    *out = neg ? sv : (int64_t)uv;
    return 0;
}

int kvc_gguf_arr_f64(const kvc_gguf_arr_t *a, uint64_t i, double *out)
{
    if (!a) return KVC_EINVAL;
    if (i >= a->n) return KVC_ERANGE;
    if (a->type != KVC_GGUF_FLOAT32 && a->type != KVC_GGUF_FLOAT64) return KVC_EPARSE;
    return float_value(a->type, (const uint8_t *)a->data + i * kvc_gguf_type_size(a->type), out)
               ? 0
               : KVC_EPARSE;
}

/* ---- tensors ------------------------------------------------------------------------ */
const kvc_gguf_tensor_t *kvc_gguf_tensor(const kvc_gguf_t *g, uint64_t i)
{
    return g && i < g->n_tensors ? &g->tensors[i] : NULL;
}

const kvc_gguf_tensor_t *kvc_gguf_find_tensor(const kvc_gguf_t *g, const char *name)
{
    if (!g) return NULL;
    int64_t i = find_sorted(g, g->tensor_sorted, g->n_tensors, tensor_name, name);
    return i < 0 ? NULL : &g->tensors[i];
}
