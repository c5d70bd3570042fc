/* workload_int.h - internals shared by the workload files of the sim layer:
 * the workload object, its token arena, name tables, error formatting and
 * the stable arrival sort.  workload.c owns the object; trace.c and synth.c
 * fill it.  Not installed. */
#ifndef KVC_SIM_WORKLOAD_INT_H
#define KVC_SIM_WORKLOAD_INT_H

#include "kvcache/sim.h"

#include <cjson/cJSON.h>

/* KVC_SIM_MAX_TIME_S in words, for messages. */
#define KVC__SIM_HORIZON_TEXT "1e9 s (about 31.7 years)"

/* A chunk of token storage.  Chunks never move, so pointers into them stay
 * valid for the workload's life. */
typedef struct kvc__tok_chunk {
    struct kvc__tok_chunk *next;
    size_t cap, used;
    kvc_token_t data[];
} kvc__tok_chunk_t;

/* Names in declaration order, with a hash index for interning. */
typedef struct {
    char **names; /* (n) */
    uint32_t n, cap;
    uint32_t *index; /* (index_cap) open addressing, KVC_NONE = empty */
    uint32_t index_cap;
    bool closed; /* declared up front: unknown names are an error */
} kvc__names_t;

/* On-demand Mooncake prompts: request i's blocks are
 * blocks[first .. first + n) (indices into the block store). */
typedef struct {
    uint64_t first;
    uint32_t n;
} kvc__blocklist_t;

struct kvc_workload {
    kvc_workload_params_t params;
    kvc_workload_format_t format;
    kvc_sim_request_t *req; /* (cap) */
    size_t n, cap;
    kvc__blocklist_t *lists; /* (cap) on-demand Mooncake only, else NULL */
    uint32_t *blocks;        /* on-demand: the lists' store indices */
    kvc_token_t *store;      /* on-demand: unique_blocks * block_tokens tokens */
    kvc__tok_chunk_t *chunks;
    kvc__names_t tenants, classes;
    size_t bytes; /* bytes held, through kvc__wl_alloc */
    uint64_t stored_tokens, unique_blocks;
    size_t n_reordered;
};

/* Allocation through the workload's allocator with the size remembered, so
 * kvc_workload_stats can say what the workload holds.  16-byte aligned. */
void *kvc__wl_alloc(kvc_workload_t *w, size_t bytes);
void kvc__wl_free(kvc_workload_t *w, void *p);

/* An empty workload (params already validated).  NULL on ENOMEM. */
kvc_workload_t *kvc__wl_new(const kvc_workload_params_t *params, kvc_workload_format_t format);
/* Validate params (NULL: defaults) into *out; KVC_EINVAL with a message. */
int kvc__wl_params(const kvc_workload_params_t *in, kvc_workload_params_t *out, char *err,
                   size_t err_cap);

/* n tokens of arena storage (uninitialised).  NULL on ENOMEM. */
kvc_token_t *kvc__wl_tokens(kvc_workload_t *w, size_t n);
/* Room for at least `need` requests (and lists, when on demand). */
int kvc__wl_reserve(kvc_workload_t *w, size_t need);

/* Intern `name` (len bytes) in a name table: its index, declaring it if the
 * table is open.  KVC_ENOENT: the table is closed and the name unknown;
 * KVC_ERANGE: more than 65536 names; KVC_ENOMEM. */
int kvc__names_intern(kvc_workload_t *w, kvc__names_t *t, const char *name, size_t len,
                      uint32_t *index);
/* Make sure both tables have at least one name ("default"). */
int kvc__wl_default_names(kvc_workload_t *w);

/* The stable arrival order of req[0..n): *perm (n indices, free with
 * kvc__wl_free) or NULL when already in order; *n_moved (if not NULL) counts
 * the requests earlier than an earlier record's arrival.  KVC_ENOMEM. */
int kvc__arrival_perm(kvc_workload_t *w, const kvc_sim_request_t *req, size_t n, uint32_t **perm,
                      size_t *n_moved);
/* Sort requests stably by arrival (a no-op when already sorted), counting in
 * w->n_reordered the requests that arrived before an earlier record's
 * arrival.  KVC_ENOMEM. */
int kvc__wl_sort(kvc_workload_t *w);

/* Fill out[0..n) with deterministic tokens in [0, vocab) from a stream
 * seeded by `seed`. */
void kvc__fill_tokens(kvc_token_t *out, size_t n, uint64_t seed, uint32_t vocab);
/* A 64-bit mix of two words (seed derivation: independent streams). */
uint64_t kvc__mix64(uint64_t a, uint64_t b);

/* A JSON string literal (quoted, escaped) for s. */
void kvc__json_string(FILE *f, const char *s);

/* Copy s[0..len) into out (cap bytes, NUL-terminated) with control bytes escaped: \n, \t,
 * \r, else \xNN (DEL too).  Stops before an escape that would not fit; returns the length
 * written. */
size_t kvc__sim_escape(char *out, size_t cap, const char *s, size_t len);

/* printf into err (if not NULL), one line: control bytes in what it quotes are escaped
 * (kvc__sim_escape). */
void kvc__errf(char *err, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Loaders (trace.c, synth.c).  `name` labels errors.  They fill w, which the
 * caller destroys on failure. */
int kvc__load_mooncake(kvc_workload_t *w, const char *data, size_t len, const char *name, char *err,
                       size_t err_cap);
int kvc__load_jsonl(kvc_workload_t *w, const char *data, size_t len, const char *name, char *err,
                    size_t err_cap);
/* A spec already parsed into JSON (`what` labels errors: the file name or
 * the inline string). */
int kvc__load_spec(kvc_workload_t *w, const cJSON *spec, const char *what, char *err,
                   size_t err_cap);
/* Parse an inline spec ("poisson:rate=5,n=100,...") into a spec object (scratch memory
 * through `a`; the JSON tree is cJSON's own).
 * Returns NULL (with err set, *rc = KVC_EPARSE or KVC_ENOMEM) on failure;
 * the caller deletes the object. */
cJSON *kvc__inline_spec(const char *s, const kvc_allocator_t *a, int *rc, char *err,
                        size_t err_cap);
/* True if s looks like an inline spec: a known arrival process and ':'. */
bool kvc__is_inline_spec(const char *s);

/* JSON helpers shared by the loaders: read an integer in [lo, hi] or a
 * finite number in [lo, hi].  KVC_ENOENT when absent, KVC_EPARSE when the
 * value is of the wrong type or out of range. */
int kvc__json_int(const cJSON *obj, const char *key, double lo, double hi, uint64_t *out);
int kvc__json_num(const cJSON *obj, const char *key, double lo, double hi, double *out);

#endif
