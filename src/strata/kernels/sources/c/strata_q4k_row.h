/* strata_q4k_row.h: the q4_K super-block dot on the file's layout for strata_kquant_run.h
 * (kquant_superblock_45 with no fifth bit), shared by linear_q4_K.avx2.c and the x8 kernels'
 * N % 8 last rows (linear_q4_Kx8 .avx2.c, .avx512vnni.c). Include after strata_kquant.h with
 * BLOCK_BYTES 144. Hashed with each user. */
#ifndef STRATA_Q4K_ROW_H
#define STRATA_Q4K_ROW_H

#include "strata_kquant.h"

static inline void q4k_superblock_avx2(
        __m256 acc[RMAX][RB], const uint8_t *w, int64_t row_bytes, const xsb *x, int64_t nsb,
        int64_t s, const int nr, const int nb) __attribute__((always_inline));

static inline void q4k_superblock_avx2(
        __m256 acc[RMAX][RB], const uint8_t *w, int64_t row_bytes, const xsb *x, int64_t nsb,
        int64_t s, const int nr, const int nb) {
    kquant_superblock_45(acc, w, row_bytes, x, nsb, s, nr, nb, 0);
}

#endif /* STRATA_Q4K_ROW_H */
