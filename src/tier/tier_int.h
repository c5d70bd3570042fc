/* tier/tier_int.h - internal: what the tier backends share.  The record format every
 * backend stores, the slot index (hash chains + LRU over fixed-size slots) of the host and
 * disk stores and second-hit's ghost set, the admission and write-budget gate, and the
 * counters, kept in one place so that every backend counts the same way. */
#ifndef KVC_TIER_INT_H
#define KVC_TIER_INT_H

#include "kvcache/tier.h"

#define KVC__TIER_MAX_TOKENS 4096

/* ---- the record ---------------------------------------------------------------
 * A record is a header, the block's tokens (int32, n_tokens of them) and the payload.
 * Integers are stored in the machine's byte order (a tier is local to one architecture;
 * a record from another byte order fails its magic and is a miss).  The checksum is
 * XXH3-64 over the whole record with the checksum field zeroed; hdr_checksum covers the
 * header alone, so the disk store can index a slot from its header without reading the
 * payload.  A record is valid only if both match. */
#define KVC__TIER_MAGIC   0x3154564bu /* "KVT1" */
#define KVC__TIER_VERSION 1u

typedef struct {
    uint32_t magic;
    uint32_t version;
    uint64_t payload_bytes;
    uint32_t n_tokens;
    uint32_t depth;
    kvc_hash128_t hash;
    kvc_hash128_t parent_hash;
    kvc_hash128_t fingerprint;
    uint64_t weight_epoch;
    uint64_t lora_id;
    uint8_t salt[KVC_SALT_BYTES];
    uint32_t group;
    uint32_t reserved;
    uint64_t seq; /* disk: write order, for the LRU rebuilt on open */
    uint64_t hdr_checksum;
    uint64_t checksum;
} kvc__tier_hdr_t;

_Static_assert(sizeof(kvc__tier_hdr_t) == 152, "record header has no padding");

/* Bytes of a record (header + tokens + payload); 0 for invalid sizes. */
size_t kvc__tier_record_size(size_t block_bytes, uint32_t block_tokens);
/* Write the record for key and payload into rec (kvc__tier_record_size bytes). */
void kvc__tier_record_encode(void *rec, const kvc_tier_key_t *key, const void *payload,
                             size_t block_bytes, uint64_t seq);
/* Whether the header alone is well formed for these sizes (magic, version, sizes,
 * hdr_checksum).  `hdr` may be unaligned. */
bool kvc__tier_hdr_valid(const void *hdr, size_t block_bytes, uint32_t block_tokens);

/* Verify a record of len bytes against the expected key: 0 (valid, payload at
 * rec + header + tokens), KVC_ECHECKSUM (length, format or checksum wrong) or KVC_ENOENT
 * (valid record of another identity). */
int kvc__tier_record_verify(const void *rec, size_t len, const kvc_tier_key_t *key,
                            size_t block_bytes, uint32_t block_tokens);
/* Where the payload starts in a record. */
static inline size_t kvc__tier_payload_offset(uint32_t block_tokens)
{
    return sizeof(kvc__tier_hdr_t) + (size_t)block_tokens * sizeof(kvc_token_t);
}

/* The namespace as compared: every field exactly (never through a hash). */
bool kvc__tier_ns_eq(const kvc_namespace_t *a, const kvc_namespace_t *b);
/* A 128-bit digest of every namespace field (for keys: redis, the index's bucket choice). */
kvc_hash128_t kvc__tier_ns_digest(const kvc_namespace_t *ns);
/* The key's namespace, or the all-zero default. */
const kvc_namespace_t *kvc__tier_key_ns(const kvc_tier_key_t *key);

/* ---- the slot index --------------------------------------------------------------
 * n_slots fixed slots, each free or holding one identity (hash + namespace).  Hash chains
 * over a power-of-two bucket array find a slot by identity; an intrusive LRU (front =
 * most recent) orders the used ones; unused slots sit on a free list.  All O(1). */
typedef struct {
    kvc_hash128_t hash;
    kvc_namespace_t ns;
    kvc_list_t lru; /* in the index's lru (used) or free list */
    uint32_t next;  /* next slot in the bucket's chain; KVC_NONE ends it */
    bool used;
} kvc__tier_slot_t;

typedef struct {
    kvc__tier_slot_t *slots; /* (n_slots) */
    uint32_t *buckets;       /* (mask + 1) first slot of each chain, KVC_NONE empty */
    uint32_t n_slots, mask, n_used;
    kvc_list_t lru;  /* used slots, most recent first */
    kvc_list_t free; /* unused slots */
    kvc_allocator_t alloc;
} kvc__tier_index_t;

int kvc__tier_index_init(kvc__tier_index_t *ix, uint32_t n_slots, const kvc_allocator_t *a);
void kvc__tier_index_deinit(kvc__tier_index_t *ix);
/* The slot holding this identity, or KVC_NONE. */
uint32_t kvc__tier_index_find(const kvc__tier_index_t *ix, kvc_hash128_t hash,
                              const kvc_namespace_t *ns);
/* A free slot (taken off the free list, not yet indexed), or KVC_NONE if all are used. */
uint32_t kvc__tier_index_take_free(kvc__tier_index_t *ix);
/* Index a taken slot under the identity, most recent. */
void kvc__tier_index_insert(kvc__tier_index_t *ix, uint32_t slot, kvc_hash128_t hash,
                            const kvc_namespace_t *ns);
/* Index a taken slot as the least recent (the disk store's rebuild, oldest last). */
void kvc__tier_index_insert_oldest(kvc__tier_index_t *ix, uint32_t slot, kvc_hash128_t hash,
                                   const kvc_namespace_t *ns);
/* Unindex a used slot and put it on the free list. */
void kvc__tier_index_remove(kvc__tier_index_t *ix, uint32_t slot);
/* Unindex a used slot and keep it taken (for reuse by the caller). */
void kvc__tier_index_unlink(kvc__tier_index_t *ix, uint32_t slot);
/* Give a taken slot back to the free list. */
void kvc__tier_index_release(kvc__tier_index_t *ix, uint32_t slot);
/* Make a used slot the most recent. */
void kvc__tier_index_touch(kvc__tier_index_t *ix, uint32_t slot);
/* The least recently used slot, or KVC_NONE if none is used. */
uint32_t kvc__tier_index_lru(const kvc__tier_index_t *ix);
/* Structural check (see kvc_tier_check). */
int kvc__tier_index_check(const kvc__tier_index_t *ix, char *msg, size_t cap);

/* ---- what every backend shares ------------------------------------------------------ */
typedef struct kvc__tier_base {
    kvc_tier_store_t pub; /* first: a kvc_tier_store_t * is a kvc__tier_base_t * */
    kvc_tier_params_t p;
    kvc_tier_stats_t st;
    size_t record_bytes;
    /* write budget: a token bucket of `tokens` bytes, refilled at per_day / 86400 s */
    double budget_tokens, budget_burst;
    uint64_t budget_last_ns;
    bool budget_started;
    /* second-hit: identities put or missed once, bounded (oldest forgotten first) */
    kvc__tier_index_t ghost;
    int (*check)(const struct kvc__tier_base *b, char *msg, size_t cap); /* NULL: none */
} kvc__tier_base_t;

/* Validate params and fill the base (pub.ops left to the backend).  KVC_EINVAL, KVC_ENOMEM. */
int kvc__tier_base_init(kvc__tier_base_t *b, const kvc_tier_ops_t *ops,
                        const kvc_tier_params_t *params);
void kvc__tier_base_deinit(kvc__tier_base_t *b);
uint64_t kvc__tier_now(const kvc__tier_base_t *b);

/* The admission gate: true if the policy admits this put (counts a refusal and, for
 * second-hit, remembers the identity otherwise). */
bool kvc__tier_admit(kvc__tier_base_t *b, const kvc_tier_key_t *key);
/* A miss of this identity (second-hit counts it as a sighting). */
void kvc__tier_note_miss(kvc__tier_base_t *b, const kvc_tier_key_t *key);
/* The budget gate: true and the bytes charged if the budget allows writing `bytes` now;
 * false (and a refusal counted) otherwise. */
bool kvc__tier_budget_take(kvc__tier_base_t *b, uint64_t bytes);
/* Record a get's duration in the histogram. */
void kvc__tier_observe_latency(kvc__tier_base_t *b, uint64_t ns);

/* A store as its base (every backend embeds the base first). */
static inline kvc__tier_base_t *kvc__tier_base(kvc_tier_store_t *s)
{
    return (kvc__tier_base_t *)s;
}
static inline const kvc__tier_base_t *kvc__tier_cbase(const kvc_tier_store_t *s)
{
    return (const kvc__tier_base_t *)s;
}

/* Tests only: the bytes of the host store's record under key (NULL if absent), so that a
 * test can flip them as a stray write would. */
unsigned char *kvc__tier_host_record(kvc_tier_store_t *s, const kvc_tier_key_t *key);
/* Tests only: the disk store's file offset of the record under key (-1 if absent). */
long long kvc__tier_disk_offset(kvc_tier_store_t *s, const kvc_tier_key_t *key);
#endif
