// strata-kernel: op=matvec_q8_0 dialect=c entry=strata_matvec_q8_0 requires=avx2,fma,f16c
/* GGUF q8_0 matrix-vector product with AVX2/FMA/F16C and OpenMP:
 * out[b,n] = sum_k deq(w)[n,k] * x[b,k], x in fp32 (never quantised), fp32 accumulation.
 *
 * A q8_0 block is 34 bytes: fp16 scale d, then 32 int8 q. At decode shapes (B = 1) the op
 * is bound by streaming the weights from memory, so the goal is to keep the per-block
 * instruction count low enough to run at memory speed:
 *  - dequantise and dot in one pass: each group of 8 int8 is sign-extended straight from
 *    memory (vpmovsxbd) and converted to fp32, then FMA'd with x;
 *  - the scale is hoisted out of the inner FMAs: the 32 products of a block accumulate
 *    unscaled in one vector, which is scaled by d with a single FMA into the row total;
 *  - ROWS rows are processed together so each x vector loaded feeds ROWS FMAs and the
 *    rows' dependency chains overlap;
 *  - rows are split over threads in contiguous chunks (sequential streams for the
 *    hardware prefetcher), handed out dynamically so a busy core does not stall the call.
 * The fp16 scale is decoded with F16C, exact for subnormals too.
 */
#include <immintrin.h>
#include <stdint.h>
#include "strata_simd.h"

#define QK 32
#define BLOCK_BYTES 34
#define ROWS 4            /* rows per group: 4 accumulators, x loads shared by 4 rows */
#define CHUNK_GROUPS 8    /* row groups per scheduling chunk: ~140 KiB of weights at K=4096 */

/* 8 int8 from memory -> 8 fp32 */
static inline __m256 int8x8_to_ps(const uint8_t *q) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q)));
}

/* out[r] = dot(row r, x) for r < nrows (nrows <= ROWS, a compile-time constant after
 * inlining, so the r loops unroll and acc[] lives in registers). */
static inline __attribute__((always_inline)) void dot_rows(float *out, const uint8_t *w,
                                                           int64_t row_bytes, const float *x,
                                                           int64_t nblocks, const int nrows) {
    __m256 acc[ROWS];
    for (int r = 0; r < nrows; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t blk = 0; blk < nblocks; blk++) {
        const float *xb = x + blk * QK;
        const __m256 x0 = _mm256_loadu_ps(xb), x1 = _mm256_loadu_ps(xb + 8);
        const __m256 x2 = _mm256_loadu_ps(xb + 16), x3 = _mm256_loadu_ps(xb + 24);
        for (int r = 0; r < nrows; r++) {
            const uint8_t *p = w + r * row_bytes + blk * BLOCK_BYTES;
            __m256 s = _mm256_mul_ps(int8x8_to_ps(p + 2), x0);
            s = _mm256_fmadd_ps(int8x8_to_ps(p + 10), x1, s);
            s = _mm256_fmadd_ps(int8x8_to_ps(p + 18), x2, s);
            s = _mm256_fmadd_ps(int8x8_to_ps(p + 26), x3, s);
            acc[r] = _mm256_fmadd_ps(half_at(p), s, acc[r]);
        }
    }
    for (int r = 0; r < nrows; r++) out[r] = hsum256_ps(acc[r]);
}

void strata_matvec_q8_0(float *out, const uint8_t *w, const float *x,
                        int64_t B, int64_t N, int64_t K) {
    const int64_t nblocks = K / QK, row_bytes = nblocks * BLOCK_BYTES;
    const int64_t groups = (N + ROWS - 1) / ROWS;
#pragma omp parallel for schedule(dynamic, CHUNK_GROUPS)
    for (int64_t g = 0; g < groups; g++) {
        const int64_t n = g * ROWS;
        const uint8_t *wg = w + n * row_bytes;
        /* for B > 1 the group's rows (17 KiB at K=4096) stay in L1 across batch rows */
        for (int64_t b = 0; b < B; b++) {
            float *o = out + b * N + n;
            const float *xb = x + b * K;
            if (n + ROWS <= N) {
                dot_rows(o, wg, row_bytes, xb, nblocks, ROWS);
            } else {
                for (int64_t r = 0; r < N - n; r++)
                    dot_rows(o + r, wg + r * row_bytes, row_bytes, xb, nblocks, 1);
            }
        }
    }
}
