/* kvcache/matmul.h - the engine's matrix kernels and its thread pool.
 *
 * A weight matrix is a GGUF tensor used in place: n_out rows of n_in
 * elements, each row encoded in ggml's block layout for its type (F32, F16,
 * BF16, Q8_0, Q4_0, Q4_K, Q6_K), rows row_bytes apart, plus, for Q8_0, Q4_0
 * and Q4_K, an optional packed copy that the SIMD kernels read instead (see
 * kvc_mat_pack below).  The kernels compute
 *
 *     y[r][o] = sum_i W[o][i] * x[r][i]     for r < n_rows, o < n_out
 *
 * with x and y fp32, row-major, x rows n_in apart, y rows n_out apart.
 *
 * Batch invariance (DESIGN.md invariant 10).  y[r][o] depends only on x[r],
 * W[o], the ISA the call resolves to and whether w is packed: never on n_rows, on which other
 * rows are in the call, on how the work is split across threads, or on how
 * many threads there are.  Every kernel reduces each output element in one
 * fixed order (the same for a tile of several rows as for one row), and the
 * activations a type's fast path quantises (Q8 blocks for the integer dot
 * products) are quantised per row, the same way whatever else is in the
 * batch.  Different ISAs may round differently; tests compare them with a
 * tolerance and each ISA with itself bit for bit.
 *
 * Activations.  F32, F16 and BF16 weights multiply x as it is.  The integer
 * types quantise each row of x to int8 first (blocks of 32 with an f32 scale
 * for Q8_0 and Q4_0, of 256 with an f32 scale and sums per 16 for Q4_K and
 * Q6_K; every ISA quantises the same way), so their results carry that
 * rounding, as llama.cpp's do.  A NaN or infinity in x makes its row's
 * outputs NaN (for the integer types, every output of the row; for the float
 * types, as IEEE arithmetic has it); other rows are not affected.
 *
 * Work is split over output rows into tasks (kvc_matmul_n_tasks) that a
 * thread pool runs; kvc_matmul does it all, kvc_matmul_tasks runs a range so
 * that a caller can fuse several matrices into one parallel region.
 *
 * Errors: 0 or a negative KVC_E* code, each named at the declaration.
 * Thread-safety: the kernels are reentrant; a pool runs one job at a time
 * and is driven from one thread.
 */
#ifndef KVCACHE_MATMUL_H
#define KVCACHE_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "kvcache/gguf.h"
#include "kvcache/quant.h"
#include "kvcache/util.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the thread pool ------------------------------------------------------ */
typedef struct kvc_threadpool kvc_threadpool_t;

/* A pool of n_threads workers in all, the calling thread included (1: no
 * thread is started and jobs run inline).  The workers persist until
 * kvc_threadpool_destroy and wait without spinning between jobs once a job
 * has been idle for a short while (they spin some 100 us first, yielding now
 * and then, so that a decode step's next job wakes them cheaply).  The pool
 * is freed with kvc_threadpool_destroy, which joins the workers (call it
 * while no job runs).  KVC_EINVAL (out NULL, n_threads 0 or over 1024),
 * KVC_ENOMEM, KVC_EIO (a thread could not be started); *out is NULL on
 * failure. */
KVC_API KVC_NODISCARD int kvc_threadpool_create(uint32_t n_threads, const kvc_allocator_t *a,
                                                kvc_threadpool_t **out);
KVC_API void kvc_threadpool_destroy(kvc_threadpool_t *tp);        /* NULL is a no-op */
KVC_API uint32_t kvc_threadpool_size(const kvc_threadpool_t *tp); /* 1 for NULL */

/* Run fn(ctx, task, thread) for every task in [0, n_tasks), spread over the
 * pool's threads (thread in [0, kvc_threadpool_size)), the caller working
 * too; returns when all are done.  Each task runs exactly once; which thread
 * runs which is not fixed.  n_tasks 0 (or fn NULL) returns at once; tp NULL,
 * a pool of 1 or a single task runs inline on the calling thread as thread 0.
 * Not reentrant: fn must not run a job on the same pool. */
typedef void (*kvc_task_fn)(void *ctx, uint32_t task, uint32_t thread);
KVC_API void kvc_threadpool_run(kvc_threadpool_t *tp, kvc_task_fn fn, void *ctx, uint32_t n_tasks);

/* ---- matrices --------------------------------------------------------------- */
typedef struct {
    uint32_t type;      /* kvc_ggml_type_t (gguf.h) */
    const void *data;   /* n_out rows */
    uint32_t n_in;      /* elements per row: a multiple of the type's block */
    uint32_t n_out;     /* rows */
    size_t row_bytes;   /* stride between rows (>= the encoded row) */
    const void *packed; /* NULL, or kvc_mat_pack's interleaved copy of the rows */
} kvc_mat_t;

/* A matrix over a GGUF tensor of 2 dimensions (ne[0] = n_in, ne[1] = n_out),
 * rows packed (row_bytes = the encoded row); it borrows t->data.  KVC_EINVAL
 * (NULL arguments or data, not 2-D, a dimension 0 or over 32 bits, ne[0] not
 * a multiple of the type's block, t->bytes short of the rows), KVC_ENOTSUP
 * (a type the kernels do not take; the caller names it with
 * kvc_ggml_type_name).  *out is written only on success. */
KVC_API int kvc_mat_from_tensor(const kvc_gguf_tensor_t *t, kvc_mat_t *out);

/* Packing.  Q8_0, Q4_0 and Q4_K matrices can be repacked once (at load) into
 * a layout that interleaves 8 rows' blocks, which the AVX2 and AVX-512
 * kernels read instead of `data`: about 2-3x fewer instructions per weight
 * than reading the rows as they are, and one sequential stream per 8 rows.
 * With w->packed set those kernels give the scalar kernel's results bit for
 * bit (each block's integer dot product, then acc += (d_w d_x) dot, block by
 * block, as matmul_scalar.c has it); the scalar kernel always reads `data`,
 * which must stay valid.  kvc_mat_pack_bytes: the bytes the packed form
 * takes (a multiple of 64), 0 for a type with none (the float types, Q6_K)
 * or an invalid matrix.  kvc_mat_pack writes it into dst (64-byte aligned,
 * `bytes` at least that) and sets w->packed = dst.  KVC_EINVAL (w or dst
 * NULL, an invalid matrix, dst misaligned or short), KVC_ENOTSUP (no packed
 * form); w is unchanged on failure. */
KVC_API size_t kvc_mat_pack_bytes(const kvc_mat_t *w);
KVC_API KVC_NODISCARD int kvc_mat_pack(kvc_mat_t *w, void *dst, size_t bytes);

/* Whether the kernels take `type`. */
KVC_API bool kvc_matmul_type_supported(uint32_t type);

/* Scratch a call needs (the activations quantised for the type's fast path),
 * for n_rows rows of this matrix: a multiple of 64 bytes, 0 when it needs
 * none (the float types) and for an invalid matrix, SIZE_MAX when the size
 * overflows.  The same scratch may serve several matrices with the same n_in
 * and type. */
KVC_API size_t kvc_matmul_workspace_bytes(const kvc_mat_t *w, uint32_t n_rows);

/* y = x W^T for n_rows rows (see the top of the file), on the ISA `isa`
 * resolves to, spread over tp (NULL: this thread).  ws holds
 * kvc_matmul_workspace_bytes, aligned to 4 bytes at least (64 is best; NULL
 * when that is 0).  KVC_EINVAL (NULL w, x or y; n_rows 0; a bad matrix: data
 * NULL, n_in or n_out 0, n_in not a multiple of the type's block, row_bytes
 * short of a row; ws NULL, smaller than needed or misaligned; an invalid isa
 * value), KVC_ENOTSUP (a
 * type the kernels do not take; a forced ISA this CPU lacks).  On an error
 * nothing is written. */
KVC_API int kvc_matmul(const kvc_mat_t *w, const float *x, uint32_t n_rows, float *y, kvc_isa_t isa,
                       kvc_threadpool_t *tp, void *ws, size_t ws_bytes);

/* The same in pieces, for callers that run several matrices in one parallel
 * region: kvc_matmul_prepare quantises x into ws (call once, on one thread);
 * kvc_matmul_n_tasks says how many tasks the output rows split into; and
 * kvc_matmul_task computes task `task` (independent tasks, any order, any
 * thread; a task writes only its own outputs, rows o in [task * c, (task +
 * 1) * c) for a chunk c fixed by the matrix and n_rows).  Results are bit-identical to
 * kvc_matmul's.  prepare's errors as kvc_matmul's (y aside); n_tasks returns
 * 0 for a bad matrix or n_rows 0; task assumes a successful prepare with the
 * same w, x, n_rows and ws (the quantised activations do not depend on the
 * ISA), and does nothing for task >= n_tasks or arguments prepare refuses. */
KVC_API int kvc_matmul_prepare(const kvc_mat_t *w, const float *x, uint32_t n_rows, kvc_isa_t isa,
                               void *ws, size_t ws_bytes);
KVC_API uint32_t kvc_matmul_n_tasks(const kvc_mat_t *w, uint32_t n_rows);
KVC_API void kvc_matmul_task(const kvc_mat_t *w, const float *x, uint32_t n_rows, float *y,
                             kvc_isa_t isa, const void *ws, uint32_t task);

/* Several matrices over one x (q, k and v; gate and up): y[i] = x w[i]^T for
 * i < n_mats (at most KVC_MATMUL_MULTI_MAX, every w[i] with the same n_in).
 * x is quantised once per activation layout the types need (Q4_K and Q6_K
 * share one), and the tasks of all the matrices run in one parallel region:
 * one dispatch and one wait on tp instead of n_mats.  Each y[i] is
 * bit-identical to kvc_matmul(w[i], ...)'s.  ws holds
 * kvc_matmul_multi_workspace_bytes (0 when none is needed; SIZE_MAX on
 * overflow, 0 too for invalid arguments).  KVC_EINVAL (NULL arrays or
 * entries, n_mats 0 or over the maximum, n_in differing, and kvc_matmul's
 * cases), KVC_ENOTSUP (as kvc_matmul).  On an error nothing is written. */
#define KVC_MATMUL_MULTI_MAX 4
KVC_API size_t kvc_matmul_multi_workspace_bytes(const kvc_mat_t *const *w, uint32_t n_mats,
                                                uint32_t n_rows);
KVC_API int kvc_matmul_multi(const kvc_mat_t *const *w, float *const *y, uint32_t n_mats,
                             const float *x, uint32_t n_rows, kvc_isa_t isa, kvc_threadpool_t *tp,
                             void *ws, size_t ws_bytes);

/* The kernel variant kvc_matmul runs for this type on the ISA `isa` resolves
 * to: "scalar", "avx2", "avx512" (for reports); "?" for an invalid isa value
 * or a forced ISA this CPU lacks. */
KVC_API const char *kvc_matmul_kernel_name(uint32_t type, kvc_isa_t isa);

#ifdef __cplusplus
}
#endif

#endif /* KVCACHE_MATMUL_H */
