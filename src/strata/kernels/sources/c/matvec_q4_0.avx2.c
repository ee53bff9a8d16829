// strata-kernel: op=matvec_q4_0 dialect=c entry=strata_matvec_q4_0 requires=avx2,fma,f16c
/* GGUF q4_0 matrix-vector product with AVX2/FMA/F16C and OpenMP:
 * out[b,n] = sum_k deq(w)[n,k] * x[b,k], x in fp32 (never quantised), fp32 accumulation.
 *
 * A q4_0 block is 18 bytes: fp16 scale d, then 16 bytes; byte j holds weight j (low
 * nibble) and weight j+16 (high nibble); each weight is d*(nibble-8). With only 18 bytes
 * per 32 weights the decode is closer to compute bound than q8_0, so unpacking is kept
 * minimal:
 *  - 8 bytes are zero-extended straight from memory into 8 dword lanes (vpmovzxbd); the
 *    low nibbles are then one AND away (weights j..j+7) and the high nibbles one shift
 *    (weights j+16..j+23), with no byte shuffles;
 *  - the -8 offset is not applied per weight: sum d*(q-8)*x = d*(sum q*x - 8*sum x), and
 *    8*sum x of a block is spread over the 8 lanes as the initial value of the block's
 *    accumulator (-sum x per lane), so it costs nothing in the inner loop. The per-block
 *    sums of x are computed once per call into a small scratch array;
 *  - the scale is hoisted: the block accumulates unscaled and is scaled by one FMA;
 *  - ROWS rows share every x load; rows are split over threads in contiguous chunks.
 * The fp16 scale is decoded with F16C, exact for subnormals too.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include "strata_simd.h"

#define QK 32
#define BLOCK_BYTES 18
#define ROWS 4            /* rows per group: 4 accumulators, x loads shared by 4 rows */
#define CHUNK_GROUPS 16   /* row groups per scheduling chunk: ~140 KiB of weights at K=4096 */

/* neg_xsum[blk] = -(sum of the 32 x values of block blk) */
static void block_neg_sums(float *neg_xsum, const float *x, int64_t nblocks) {
    for (int64_t blk = 0; blk < nblocks; blk++) {
        const float *xb = x + blk * QK;
        __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(xb), _mm256_loadu_ps(xb + 8)),
                                 _mm256_add_ps(_mm256_loadu_ps(xb + 16),
                                               _mm256_loadu_ps(xb + 24)));
        neg_xsum[blk] = -hsum256_ps(s);
    }
}

/* out[r] = dot(row r, x) for r < nrows (nrows <= ROWS, a compile-time constant after
 * inlining, so the r loops unroll and acc[] lives in registers). */
static inline __attribute__((always_inline)) void dot_rows(float *out, const uint8_t *w,
                                                           int64_t row_bytes, const float *x,
                                                           const float *neg_xsum,
                                                           int64_t nblocks, const int nrows) {
    const __m256i low4 = _mm256_set1_epi32(0x0F);
    __m256 acc[ROWS];
    for (int r = 0; r < nrows; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t blk = 0; blk < nblocks; blk++) {
        const float *xb = x + blk * QK;
        const __m256 x0 = _mm256_loadu_ps(xb), x1 = _mm256_loadu_ps(xb + 8);
        const __m256 x2 = _mm256_loadu_ps(xb + 16), x3 = _mm256_loadu_ps(xb + 24);
        /* -sum(x) in each of the 8 lanes: a block accumulator's lanes add up to -8*sum(x) */
        const __m256 init = _mm256_broadcast_ss(neg_xsum + blk);
        for (int r = 0; r < nrows; r++) {
            const uint8_t *p = w + r * row_bytes + blk * BLOCK_BYTES + 2;
            const __m256i b0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
            const __m256i b1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8)));
            const __m256 q0 = _mm256_cvtepi32_ps(_mm256_and_si256(b0, low4));   /* w 0..7 */
            const __m256 q1 = _mm256_cvtepi32_ps(_mm256_and_si256(b1, low4));   /* w 8..15 */
            const __m256 q2 = _mm256_cvtepi32_ps(_mm256_srli_epi32(b0, 4));     /* w 16..23 */
            const __m256 q3 = _mm256_cvtepi32_ps(_mm256_srli_epi32(b1, 4));     /* w 24..31 */
            __m256 s = _mm256_fmadd_ps(q0, x0, init);
            s = _mm256_fmadd_ps(q1, x1, s);
            s = _mm256_fmadd_ps(q2, x2, s);
            s = _mm256_fmadd_ps(q3, x3, s);
            acc[r] = _mm256_fmadd_ps(half_at(p - 2), s, acc[r]);
        }
    }
    for (int r = 0; r < nrows; r++) out[r] = hsum256_ps(acc[r]);
}

void strata_matvec_q4_0(float *out, const uint8_t *w, const float *x,
                        int64_t B, int64_t N, int64_t K) {
    const int64_t nblocks = K / QK, row_bytes = nblocks * BLOCK_BYTES;
    const int64_t groups = (N + ROWS - 1) / ROWS;
    float *neg_xsum = malloc((size_t)(B * nblocks + 1) * sizeof(float));
    if (!neg_xsum) return;  /* cannot happen for sane sizes; out stays NaN and fails loudly */
    for (int64_t b = 0; b < B; b++) block_neg_sums(neg_xsum + b * nblocks, x + b * K, nblocks);
#pragma omp parallel for schedule(dynamic, CHUNK_GROUPS)
    for (int64_t g = 0; g < groups; g++) {
        const int64_t n = g * ROWS;
        const uint8_t *wg = w + n * row_bytes;
        /* for B > 1 the group's rows (9 KiB at K=4096) stay in L1 across batch rows */
        for (int64_t b = 0; b < B; b++) {
            float *o = out + b * N + n;
            const float *xb = x + b * K;
            const float *nx = neg_xsum + b * nblocks;
            if (n + ROWS <= N) {
                dot_rows(o, wg, row_bytes, xb, nx, nblocks, ROWS);
            } else {
                for (int64_t r = 0; r < N - n; r++)
                    dot_rows(o + r, wg + r * row_bytes, row_bytes, xb, nx, nblocks, 1);
            }
        }
    }
    free(neg_xsum);
}
