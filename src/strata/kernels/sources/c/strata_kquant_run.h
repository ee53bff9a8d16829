/* strata_kquant_run.h: the tiled, threaded driver of the AVX2 K-quant linear kernels; see
 * strata_kquant.h (the including kernel defines BLOCK_BYTES and its super-block dot first:
 * superblock(), or the function SUPERBLOCK names — a shared one, e.g. strata_q4k_row.h's). */
#ifndef STRATA_KQUANT_RUN_H
#define STRATA_KQUANT_RUN_H

#include "strata_kquant.h"

#ifndef SUPERBLOCK
#define SUPERBLOCK superblock
#endif

/* always inlined: nr, nb are constants at each call, the loops unroll, acc[][] stays in
 * registers */
static inline void kquant_tile(float *out, int64_t ldo, const uint8_t *w, int64_t row_bytes,
                        const xsb *x, int64_t nsb, const int nr, const int nb)
    __attribute__((always_inline));

static inline void kquant_tile(float *out, int64_t ldo, const uint8_t *w, int64_t row_bytes,
                        const xsb *x, int64_t nsb, const int nr, const int nb) {
    __m256 acc[RMAX][RB];
    for (int r = 0; r < nr; r++)
        for (int b = 0; b < nb; b++) acc[r][b] = _mm256_setzero_ps();
    for (int64_t s = 0; s < nsb; s++) SUPERBLOCK(acc, w, row_bytes, x, nsb, s, nr, nb);
    for (int r = 0; r < nr; r++)
        for (int b = 0; b < nb; b++) out[b * ldo + r] = hsum256_ps(acc[r][b]);
}

static inline void kquant_run(float *out, const float *x, const uint8_t *w,
                               int64_t B, int64_t N, int64_t K) {
    const int64_t nsb = K / QK_K, row_bytes = nsb * BLOCK_BYTES;
    q8k_block *q8 = malloc((size_t)(B * nsb + 1) * sizeof(q8k_block));
    xsb *xq = aligned_alloc(32, (size_t)(B * nsb + 1) * sizeof(xsb));
    if (!q8 || !xq) { free(q8); free(xq); return; }  /* out stays NaN: fails loudly */
#pragma omp parallel
    {
        /* x to q8_K inside the one parallel region (a second region per call cost a
           fork and a join per decode matmul) */
#pragma omp for schedule(static)
        for (int64_t i = 0; i < B * nsb; i++) {
            q8k_quantize(x + i * QK_K, q8 + i);
            kquant_prepare_x(q8 + i, xq + i);
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t n0 = 0; n0 < N; n0 += CHUNK_ROWS) {
            const int64_t n1 = min64(N, n0 + CHUNK_ROWS);
            int64_t n = n0;
            if (B == 1) {
                for (; n + RN <= n1; n += RN)
                    kquant_tile(out + n, N, w + n * row_bytes, row_bytes, xq, nsb, RN, 1);
                for (; n < n1; n++) kquant_tile(out + n, N, w + n * row_bytes, row_bytes, xq, nsb, 1, 1);
                continue;
            }
            for (; n + RNB <= n1; n += RNB) {
                int64_t b = 0;
                for (; b + RB <= B; b += RB)
                    kquant_tile(out + b * N + n, N, w + n * row_bytes, row_bytes, xq + b * nsb, nsb,
                         RNB, RB);
                for (; b < B; b++)
                    kquant_tile(out + b * N + n, N, w + n * row_bytes, row_bytes, xq + b * nsb, nsb,
                         RNB, 1);
            }
            for (; n < n1; n++)
                for (int64_t b = 0; b < B; b++)
                    kquant_tile(out + b * N + n, N, w + n * row_bytes, row_bytes, xq + b * nsb, nsb,
                         1, 1);
        }
    }
    free(q8);
    free(xq);
}

#endif /* STRATA_KQUANT_RUN_H */
