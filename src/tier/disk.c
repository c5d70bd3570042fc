/* disk.c - the disk tier: one preallocated file of fixed-size slots, each holding one
 * record (tier_int.h's format, checksum and identity included), and an in-memory slot index
 * rebuilt on open by reading every slot's header.  A restart reuses what is on disk; a slot
 * whose header is torn or corrupt is skipped (counted in n_corrupt), and one whose payload
 * is is caught by the record checksum on get.
 *
 *     offset 0:      file header (4 KiB): magic, version, block_bytes, block_tokens,
 *                    slot_bytes, n_slots, its own checksum
 *     4096 + i * slot_bytes: slot i (record_bytes, then padding to a multiple of 64)
 *
 * No fsync: a crash can lose or tear the last records written, and the checksums turn
 * that into misses.  A write that fails (ENOSPC, EFBIG from RLIMIT_FSIZE, EIO, a short
 * write) is a counted fault: the slot it was going to fill goes back to the free list
 * unindexed, so the index never names bytes that were not written whole. */
#include "tier/tier_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define FILE_MAGIC  0x4454564bu /* "KVTD" */
#define HEADER_SIZE 4096u

typedef struct {
    uint32_t magic, version;
    uint64_t block_bytes;
    uint32_t block_tokens, reserved;
    uint64_t slot_bytes;
    uint64_t n_slots;
    uint64_t checksum;
} file_hdr_t;

typedef struct {
    kvc__tier_base_t base;
    kvc__tier_index_t ix;
    int fd;
    size_t slot_bytes;
    uint64_t seq;       /* the next record's write number */
    unsigned char *buf; /* (slot_bytes) scratch for one record */
} disk_t;

static uint64_t file_hdr_sum(const file_hdr_t *h)
{
    file_hdr_t t = *h;
    t.checksum = 0;
    return XXH3_64bits(&t, sizeof t);
}

static off_t slot_off(const disk_t *d, uint32_t slot)
{
    return (off_t)HEADER_SIZE + (off_t)slot * (off_t)d->slot_bytes;
}

/* Whole-buffer pwrite / pread: 0, or the errno (EIO for a short transfer). */
static int pwrite_all(int fd, const void *buf, size_t n, off_t off)
{
    const char *p = buf;
    while (n) {
        ssize_t w = pwrite(fd, p, n, off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return w < 0 ? errno : EIO;
        p += w;
        n -= (size_t)w;
        off += w;
    }
    return 0;
}

static int pread_all(int fd, void *buf, size_t n, off_t off)
{
    char *p = buf;
    while (n) {
        ssize_t r = pread(fd, p, n, off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return r < 0 ? errno : EIO;
        p += r;
        n -= (size_t)r;
        off += r;
    }
    return 0;
}

static int disk_put(kvc_tier_store_t *s, const kvc_tier_key_t *key, const void *data,
                    kvc_tier_put_status_t *status)
{
    disk_t *d = (disk_t *)s;
    const kvc_namespace_t *ns = kvc__tier_key_ns(key);
    uint32_t slot = kvc__tier_index_find(&d->ix, key->hash, ns);
    if (slot != KVC_NONE) {
        /* Same hash and namespace: the same block (a collision is caught on get).  Not
         * rewritten: the write budget is the SSD's life. */
        kvc__tier_index_touch(&d->ix, slot);
        d->base.st.n_put_present++;
        *status = KVC_TIER_PUT_PRESENT;
        return 0;
    }
    if (!kvc__tier_admit(&d->base, key)) {
        *status = KVC_TIER_PUT_NOT_ADMITTED;
        return 0;
    }
    if (!kvc__tier_budget_take(&d->base, d->base.record_bytes)) {
        *status = KVC_TIER_PUT_OVER_BUDGET;
        return 0;
    }
    slot = kvc__tier_index_take_free(&d->ix);
    if (slot == KVC_NONE) {
        slot = kvc__tier_index_lru(&d->ix);
        kvc__tier_index_unlink(&d->ix, slot); /* its bytes are about to be overwritten */
        d->base.st.n_evictions++;
    }
    kvc__tier_record_encode(d->buf, key, data, s->block_bytes, d->seq);
    if (pwrite_all(d->fd, d->buf, d->base.record_bytes, slot_off(d, slot))) {
        kvc__tier_index_release(&d->ix, slot);
        d->base.st.n_faults++;
        *status = KVC_TIER_PUT_FAULT;
        return 0;
    }
    d->seq++;
    kvc__tier_index_insert(&d->ix, slot, key->hash, ns);
    d->base.st.n_puts++;
    d->base.st.bytes_written += d->base.record_bytes;
    *status = KVC_TIER_PUT_STORED;
    return 0;
}

/* Drop a slot's record: unindexed, and its header zeroed on disk so that a restart does not
 * index it again (if that write fails, a restart may; the record is still checked then). */
static void drop_slot(disk_t *d, uint32_t slot)
{
    static const unsigned char zero[sizeof(kvc__tier_hdr_t)];
    kvc__tier_index_remove(&d->ix, slot);
    if (pwrite_all(d->fd, zero, sizeof zero, slot_off(d, slot))) d->base.st.n_faults++;
}

static int disk_get(kvc_tier_store_t *s, const kvc_tier_key_t *key, void *out)
{
    disk_t *d = (disk_t *)s;
    uint32_t slot = kvc__tier_index_find(&d->ix, key->hash, kvc__tier_key_ns(key));
    if (slot == KVC_NONE) return KVC_ENOENT;
    if (pread_all(d->fd, d->buf, d->base.record_bytes, slot_off(d, slot))) {
        d->base.st.n_faults++;
        kvc__tier_index_remove(&d->ix, slot);
        return KVC_ENOENT;
    }
    int rc =
        kvc__tier_record_verify(d->buf, d->base.record_bytes, key, s->block_bytes, s->block_tokens);
    if (rc) {
        if (rc == KVC_ECHECKSUM)
            d->base.st.n_corrupt++;
        else
            d->base.st.n_mismatch++;
        drop_slot(d, slot);
        return KVC_ENOENT;
    }
    memcpy(out, d->buf + kvc__tier_payload_offset(s->block_tokens), s->block_bytes);
    kvc__tier_index_touch(&d->ix, slot);
    d->base.st.bytes_read += d->base.record_bytes;
    return 0;
}

static int disk_contains(kvc_tier_store_t *s, const kvc_tier_key_t *key)
{
    disk_t *d = (disk_t *)s;
    return kvc__tier_index_find(&d->ix, key->hash, kvc__tier_key_ns(key)) != KVC_NONE;
}

static int disk_del(kvc_tier_store_t *s, const kvc_tier_key_t *key)
{
    disk_t *d = (disk_t *)s;
    uint32_t slot = kvc__tier_index_find(&d->ix, key->hash, kvc__tier_key_ns(key));
    if (slot == KVC_NONE) return KVC_ENOENT;
    drop_slot(d, slot);
    return 0;
}

static void disk_stats(const kvc_tier_store_t *s, kvc_tier_stats_t *out)
{
    const disk_t *d = (const disk_t *)s;
    out->n_records = d->ix.n_used;
    out->capacity_records = d->ix.n_slots;
}

static int disk_check(const kvc__tier_base_t *b, char *msg, size_t cap)
{
    return kvc__tier_index_check(&((const disk_t *)b)->ix, msg, cap);
}

static void disk_free(disk_t *d)
{
    kvc_allocator_t a = d->base.p.allocator;
    if (d->fd >= 0) close(d->fd);
    kvc__tier_index_deinit(&d->ix);
    kvc__tier_base_deinit(&d->base);
    kvc_free(&a, d->buf);
    kvc_free(&a, d);
}

static void disk_destroy(kvc_tier_store_t *s)
{
    disk_free((disk_t *)s);
}

static const kvc_tier_ops_t disk_ops = {
    .name = "disk",
    .put = disk_put,
    .get = disk_get,
    .contains = disk_contains,
    .del = disk_del,
    .stats = disk_stats,
    .destroy = disk_destroy,
};

typedef struct {
    uint64_t seq;
    uint32_t slot;
} found_t;

static int by_seq_desc(const void *a, const void *b)
{
    const found_t *x = a, *y = b;
    return x->seq < y->seq ? 1 : x->seq > y->seq ? -1 : 0;
}

/* Index the records the file holds, most recently written first in the LRU. */
static int rebuild(disk_t *d, uint64_t file_bytes)
{
    found_t *found = kvc_calloc(&d->base.p.allocator, d->ix.n_slots, sizeof *found, 8);
    if (!found) return KVC_ENOMEM;
    uint32_t n = 0;
    uint64_t max_seq = 0;
    for (uint32_t i = 0; i < d->ix.n_slots; i++) {
        off_t off = slot_off(d, i);
        kvc__tier_hdr_t h;
        if ((uint64_t)off + sizeof h > file_bytes) { /* a truncated file: the rest is empty */
            if ((uint64_t)off < file_bytes) d->base.st.n_corrupt++; /* a header cut short */
            break;
        }
        if (pread_all(d->fd, &h, sizeof h, off)) {
            kvc_free(&d->base.p.allocator, found);
            return KVC_EIO;
        }
        if (h.magic == 0 && h.hdr_checksum == 0) continue; /* never written, or dropped */
        if (!kvc__tier_hdr_valid(&h, d->base.pub.block_bytes, d->base.pub.block_tokens)) {
            d->base.st.n_corrupt++;
            continue;
        }
        kvc_namespace_t ns;
        memset(&ns, 0, sizeof ns);
        ns.weight_epoch = h.weight_epoch;
        ns.lora_id = h.lora_id;
        memcpy(ns.salt, h.salt, KVC_SALT_BYTES);
        ns.group = h.group;
        uint32_t dup = kvc__tier_index_find(&d->ix, h.hash, &ns);
        if (dup != KVC_NONE) { /* two copies (a crash between writes): keep the newer */
            uint32_t k = 0;
            while (found[k].slot != dup) k++;
            if (found[k].seq >= h.seq) continue;
            kvc__tier_index_remove(&d->ix, dup);
            found[k] = found[--n];
        }
        kvc_list_remove(&d->ix.slots[i].lru); /* slot i itself, off the free list */
        kvc__tier_index_insert(&d->ix, i, h.hash, &ns);
        found[n++] = (found_t){h.seq, i};
        if (h.seq > max_seq) max_seq = h.seq;
    }
    /* Order the LRU by write number: re-link oldest to the back. */
    qsort(found, n, sizeof *found, by_seq_desc);
    for (uint32_t k = 0; k < n; k++) {
        kvc_list_t *node = &d->ix.slots[found[k].slot].lru;
        kvc_list_remove(node);
        kvc_list_push_back(&d->ix.lru, node);
    }
    d->seq = n ? max_seq + 1 : 0;
    kvc_free(&d->base.p.allocator, found);
    return 0;
}

static int prealloc(int fd, uint64_t bytes)
{
    int e = posix_fallocate(fd, 0, (off_t)bytes);
    if (e == EOPNOTSUPP || e == EINVAL) /* a filesystem without it: a sparse file */
        e = ftruncate(fd, (off_t)bytes) ? errno : 0;
    return e ? KVC_EIO : 0;
}

int kvc_tier_disk_create(const char *path, const kvc_tier_params_t *params, kvc_tier_store_t **out)
{
    if (!path || !*path || !params || !out) return KVC_EINVAL;
    size_t rec = kvc__tier_record_size(params->block_bytes, params->block_tokens);
    if (rec == 0 || rec > SIZE_MAX - 64) return KVC_EINVAL;
    size_t slot_bytes = (rec + 63) & ~(size_t)63;
    if (params->capacity_bytes < slot_bytes) return KVC_EINVAL;
    uint64_t n = params->capacity_bytes / slot_bytes;
    if (n > (1u << 30)) return KVC_EINVAL;
    uint64_t file_bytes = HEADER_SIZE + n * slot_bytes;

    disk_t *d = kvc_calloc(&params->allocator, 1, sizeof *d, 64);
    if (!d) return KVC_ENOMEM;
    d->fd = -1;
    int rc = kvc__tier_base_init(&d->base, &disk_ops, params);
    if (rc == 0) rc = kvc__tier_index_init(&d->ix, (uint32_t)n, &params->allocator);
    if (rc == 0) {
        d->slot_bytes = slot_bytes;
        d->buf = kvc_calloc(&params->allocator, 1, slot_bytes, 64);
        if (!d->buf) rc = KVC_ENOMEM;
    }
    if (rc) {
        disk_free(d);
        return rc;
    }
    d->base.check = disk_check;

    file_hdr_t want;
    memset(&want, 0, sizeof want);
    want.magic = FILE_MAGIC;
    want.version = 1;
    want.block_bytes = params->block_bytes;
    want.block_tokens = params->block_tokens;
    want.slot_bytes = slot_bytes;
    want.n_slots = n;
    want.checksum = file_hdr_sum(&want);

    d->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    struct stat sb;
    if (d->fd < 0 || fstat(d->fd, &sb)) {
        disk_free(d);
        return KVC_EIO;
    }
    if (sb.st_size == 0) { /* new: write the header, reserve the space */
        unsigned char page[HEADER_SIZE];
        memset(page, 0, sizeof page);
        memcpy(page, &want, sizeof want);
        rc = prealloc(d->fd, file_bytes);
        if (rc == 0 && pwrite_all(d->fd, page, sizeof page, 0)) rc = KVC_EIO;
    } else {
        file_hdr_t got;
        if ((uint64_t)sb.st_size < sizeof got || pread_all(d->fd, &got, sizeof got, 0))
            rc = KVC_EEXIST; /* not ours: never overwritten */
        else if (got.magic != FILE_MAGIC || got.checksum != file_hdr_sum(&got) ||
                 memcmp(&got, &want, sizeof got) != 0)
            rc = KVC_EEXIST;
        else
            rc = rebuild(d, (uint64_t)sb.st_size);
        if (rc == 0 && (uint64_t)sb.st_size < file_bytes) rc = prealloc(d->fd, file_bytes);
    }
    if (rc) {
        disk_free(d);
        return rc;
    }
    *out = &d->base.pub;
    return 0;
}

long long kvc__tier_disk_offset(kvc_tier_store_t *s, const kvc_tier_key_t *key)
{
    if (!s || s->ops != &disk_ops) return -1;
    disk_t *d = (disk_t *)s;
    uint32_t slot = kvc__tier_index_find(&d->ix, key->hash, kvc__tier_key_ns(key));
    return slot == KVC_NONE ? -1 : (long long)slot_off(d, slot);
}
