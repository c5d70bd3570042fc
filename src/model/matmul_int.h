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
 *   Q4_K, Q6_K weights: blocks of 256 (Q8_K-like), d = amax / 127 (f32), the same q, and the
 *                       sum of the q of every 16 (int16), for the weights' offsets and minima
 *
 * Row r of the workspace, ws_row bytes (a multiple of 64) after row r - 1:
 *   int8 q[n_in] | float d[n_in / qblock] | int16 bsums[n_in / 16] (Q8_K-like only)
 *                                         | int32 offsets[n_in / 4] (Q4_0 only)
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

#endif
