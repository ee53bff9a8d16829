/* strata_x8run.h: the threaded driver of the AVX2 x8-layout K-quant kernels (linear_q4_Kx8,
 * linear_q6_Kx8 .avx2.c); strata_x8.h describes the layout. The including kernel defines
 * BLOCK_BYTES, the file-layout row dot (SUPERBLOCK: for the N % 8 last rows, through
 * strata_kquant_run.h's kquant_tile) and
 *   static inline void group_sb(__m256 acc[2], const uint8_t *p, const xsb *x, int64_t nsb,
 *                               int64_t s, int nb)
 * (acc[b] lane r += super-block s of the group's row r against x row b < nb; p = the group
 * super-block). Each output is one thread's fixed-order sum: results do not depend on the
 * thread count. Hashed with each user. */
#ifndef STRATA_X8RUN_H
#define STRATA_X8RUN_H

#include "strata_kquant_run.h"

#define GROUP_ROWS 8
#define GROUP_BYTES (GROUP_ROWS * BLOCK_BYTES)

/* the 8 outputs of x rows b < nb for one group of weight rows */
static inline void x8_group(float *out, int64_t N, const uint8_t *gw, const xsb *x,
                            int64_t nsb, const int nb) __attribute__((always_inline));

static inline void x8_group(float *out, int64_t N, const uint8_t *gw, const xsb *x,
                            int64_t nsb, const int nb) {
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t s = 0; s < nsb; s++) group_sb(acc, gw + s * GROUP_BYTES, x, nsb, s, nb);
    for (int b = 0; b < nb; b++) _mm256_storeu_ps(out + b * N, acc[b]);
}

static inline void x8_run(float *out, const float *x, const uint8_t *w,
                          int64_t B, int64_t N, int64_t K) {
    const int64_t nsb = K / QK_K, row_bytes = nsb * BLOCK_BYTES;
    const int64_t groups = N / GROUP_ROWS, grouped = groups * GROUP_ROWS;
    q8k_block *q8 = malloc((size_t)(B * nsb + 1) * sizeof(q8k_block));
    xsb *xq = aligned_alloc(32, (size_t)(B * nsb + 1) * sizeof(xsb));
    if (!q8 || !xq) { free(q8); free(xq); return; }  /* out stays NaN: fails loudly */
    const uint8_t *tail = w + grouped * row_bytes;  /* the last N % 8 rows, file layout */
#pragma omp parallel
    {
        /* x to q8_K inside the one parallel region (a second region per call cost a
           fork and a join per decode matmul) */
#pragma omp for schedule(static)
        for (int64_t i = 0; i < B * nsb; i++) {
            q8k_quantize(x + i * QK_K, q8 + i);
            kquant_prepare_x(q8 + i, xq + i);
        }
#pragma omp for schedule(static) nowait
        for (int64_t g = 0; g < groups; g++) {
            const uint8_t *gw = w + g * nsb * GROUP_BYTES;
            int64_t b = 0;
            for (; b + 2 <= B; b += 2)  /* the group's bytes stay in L1/L2 across x rows */
                x8_group(out + b * N + g * GROUP_ROWS, N, gw, xq + b * nsb, nsb, 2);
            for (; b < B; b++)
                x8_group(out + b * N + g * GROUP_ROWS, N, gw, xq + b * nsb, nsb, 1);
        }
#pragma omp for schedule(static)
        for (int64_t n = grouped; n < N; n++)
            for (int64_t b = 0; b < B; b++)
                kquant_tile(out + b * N + n, N, tail + (n - grouped) * row_bytes, row_bytes,
                            xq + b * nsb, nsb, 1, 1);
    }
    free(q8);
    free(xq);
}

#endif /* STRATA_X8RUN_H */
