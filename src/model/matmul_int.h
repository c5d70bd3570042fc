/* matmul_int.h - internals shared by the matrix kernels' files (matmul.c and one file per ISA):
 * the quantised activations' layout in the workspace, the work item each ISA's kernel runs,
 * and the block layouts of the weight types.  Not installed.
 *
 * Activations.  The integer paths take x quantised per row, the same whatever ISA runs the
 * kernel and whatever else is in the batch (matmul.c quantises, in plain C):
 *
 *   Q8_0, Q4_0 weights: blocks of 32, d = amax / 127 (f32), q = round-to-nearest-even(x / d);
 *                       for Q4_0 also 8 (q[4g] + ... + q[4g + 3]) for every 4 (int32), so that
 *                       the unsigned nibbles go into maddubs as they are and an 8-lane
 *                       subtraction makes their products with q - 8 (the lanes of one block)
 *                       and 8 (q[32b] + ... + q[32b + 31]) for every block b (int32), the
 *                       same offset for a whole block, which the packed kernels take
 *   Q4_K, Q6_K weights: blocks of 256 (Q8_K-like), d = amax / 127 (f32), the same q, the sum
 *                       of the q of every 16 (int16), for the weights' offsets and minima, and
 *                       the sum of the q of every 32 (int16), for the packed Q4_K kernel
 *
 * Row r of the workspace, ws_row bytes (a multiple of 64) after row r - 1:
 *   int8 q[n_in] | float d[n_in / qblock] | int16 bsums[n_in / 16] int16 bsums32[n_in / 32]
 *                                           (Q8_K-like only)
 *                                         | int32 offsets[n_in / 4] int32 boff[n_in / 32]
 *                                           (Q4_0 only)
 * A block holding a NaN or an infinity gets d = NaN (and q = 0): its row's outputs are NaN.
 */
#ifndef KVCACHE_MATMUL_INT_H
#define KVCACHE_MATMUL_INT_H

#include <string.h>

#include "kvcache/matmul.h"

/* Output rows per task: a multiple of every kernel's output tile. */
#define KVC__MM_CHUNK_SMALL 24
#define KVC__MM_CHUNK       48

/* Block sizes (elements, bytes) of the quantised weight types. */
#define KVC__QK     32  /* Q8_0, Q4_0 */
#define KVC__QK_K   256 /* Q4_K, Q6_K */
#define KVC__Q8_0_B 34  /* f16 d, int8 q[32] */
#define KVC__Q4_0_B 18  /* f16 d, 16 bytes of nibbles */
#define KVC__Q4_K_B 144 /* f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 of nibbles */
#define KVC__Q6_K_B 210 /* ql[128], qh[64], int8 sc[16], f16 d */

/* What one call runs: outputs [o0, o1) of every row. */
typedef struct {
    const kvc_mat_t *w;
    const float *x; /* (n_rows, n_in) */
    uint32_t n_rows;
    float *y;          /* (n_rows, n_out) */
    const uint8_t *ws; /* quantised activations (integer paths), ws_row bytes per row */
    size_t ws_row;
    uint32_t o0, o1;
} kvc__mm_job_t;

static inline const uint8_t *kvc__mm_wrow(const kvc__mm_job_t *j, uint32_t o)
{
    return (const uint8_t *)j->w->data + (size_t)o * j->w->row_bytes;
}
static inline const int8_t *kvc__mm_xq(const kvc__mm_job_t *j, uint32_t r)
{
    return (const int8_t *)(j->ws + (size_t)r * j->ws_row);
}
static inline const float *kvc__mm_xd(const kvc__mm_job_t *j, uint32_t r)
{
    return (const float *)(j->ws + (size_t)r * j->ws_row + j->w->n_in);
}
static inline const int16_t *kvc__mm_xbsums(const kvc__mm_job_t *j, uint32_t r)
{
    return (const int16_t *)(j->ws + (size_t)r * j->ws_row + j->w->n_in +
                             sizeof(float) * (j->w->n_in / KVC__QK_K));
}

static inline const int32_t *kvc__mm_xoff(const kvc__mm_job_t *j, uint32_t r)
{
    return (const int32_t *)(j->ws + (size_t)r * j->ws_row + j->w->n_in +
                             sizeof(float) * (j->w->n_in / KVC__QK));
}
static inline const int32_t *kvc__mm_xboff(const kvc__mm_job_t *j, uint32_t r)
{
    return kvc__mm_xoff(j, r) + j->w->n_in / 4;
}
static inline const int16_t *kvc__mm_xbsums32(const kvc__mm_job_t *j, uint32_t r)
{
    return kvc__mm_xbsums(j, r) + j->w->n_in / 16;
}

/* ---- packed matrices (kvc_mat_pack) ----------------------------------------------------
 * Output rows go in groups of 8 (the last group padded with zero rows); a group's blocks are
 * stored one after the other as units, group g's unit b at packed + (g * n_blocks + b) * unit.
 * A unit holds block b of the group's 8 rows with their 4-byte words interleaved, so that one
 * 32-byte vector carries 4 consecutive weights of each of the 8 rows: lane k (bytes 4k..4k+3)
 * is row k's, and one maddubs + madd against 4 activations broadcast to every lane gives 8
 * rows' partial dot products at once, with no horizontal sum.
 *
 *   Q8_0  272 bytes: f16 d[8] | 8 vectors, vector c lane k = row k's q[4c .. 4c+3]
 *   Q4_0  144 bytes: f16 d[8] | 4 vectors, vector c lane k = row k's nibble bytes qs[4c .. 4c+3]
 *                    (low nibbles: elements 4c.., high nibbles: elements 16 + 4c..)
 *   Q4_K  1184 bytes: f16 d[8] | f16 dmin[8] | scale pairs[4][8][2] | min pairs[4][8][2] |
 *                    32 vectors, vector 8p + c lane k = row k's qs[32p + 4c .. 32p + 4c + 3]
 *                    (low nibbles: elements 64p + 4c.., high: 64p + 32 + 4c..); pair p of row k
 *                    holds the 6-bit scale (min) of sub-blocks 2p and 2p + 1
 * Q6_K and the float types have no packed form. */
#define KVC__PK_ROWS   8
#define KVC__PK_Q8_0_U 272
#define KVC__PK_Q4_0_U 144
#define KVC__PK_Q4_K_U 1184

static inline const uint8_t *kvc__mm_unit(const kvc__mm_job_t *j, uint32_t group, uint32_t b,
                                          size_t unit, uint32_t n_blocks)
{
    return (const uint8_t *)j->w->packed + ((size_t)group * n_blocks + b) * unit;
}

/* An f16 scale at p (unaligned), in plain C (the SIMD files may use F16C: the same value). */
static inline uint16_t kvc__mm_u16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return h;
}

/* Q4_K's 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes q. */
static inline void kvc__q4k_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* The kernels: every row of x, outputs [j->o0, j->o1).  Arguments checked. */
void kvc__mm_scalar(const kvc__mm_job_t *j);
void kvc__mm_avx2(const kvc__mm_job_t *j);
void kvc__mm_avx512(const kvc__mm_job_t *j);
/* The packed kernels (w->packed set, a packable type): the scalar kernel's results bit for bit.
 * AVX2 code; the AVX-512 dispatch runs them too. */
void kvc__mm_avx2_packed(const kvc__mm_job_t *j);
/* matmul.c's activation quantiser for one block of n (a multiple of 32), the same bytes. */
float kvc__mm_quant_block_avx2(const float *x, int8_t *q, uint32_t n);

#endif
