/* strata_q8_0x_run.h: the tiled, threaded driver of the AVX2 q4_0/q5_0/q4_1/q5_1/mxfp4 linear
 * kernels; see strata_q8_0x.h (the including kernel defines BLOCK_BYTES, OFFSET and
 * weight_pair() first).
 * pair_step and tile are always inlined: nr, nb and two are constants at each call, the loops
 * unroll and acc[][] stays in registers. */
#ifndef STRATA_Q8_0X_RUN_H
#define STRATA_Q8_0X_RUN_H

#include <omp.h>
#include "strata_q8_0x.h"

#ifndef MIN_TERM
#define MIN_TERM 0  /* blocks without a min (q4_0, q5_0) */
#endif
#ifndef LANE_OFFSET
#define LANE_OFFSET 0  /* the offset's correction in one lane per block (q4_0, q5_0) */
#endif
#define XSTACK_PAIRS 256       /* B = 1: K <= 16384 quantised on each thread's stack */
#define DECODE_CHUNK_BYTES (1 << 20)  /* B = 1: weight bytes per scheduling chunk */
#define PF_BYTES 6144          /* B = 1: the least prefetch distance along the stream */

/* One pair of blocks (`two`) or the odd last block of weight rows r < nr against rows
 * b < nb of x, into acc[r][b] (nr, nb, two: compile-time constants after inlining).
 * Each row's step also prefetches the same column of row r + nr, the next tile's: short
 * rows (a Gemma FFN's 1152 values are 36 blocks, 12 cache lines of q5_0) end their streams
 * before the hardware prefetcher catches up, so every tile started cold — measured at
 * N = 6912, K = 1152 on the 2-core EPYC, q5_0 decode went from 8.3 to 15.6 GB/s (the same
 * bytes as 1152 x 6912: 15 -> 19 GB/s). A prefetch past the last row never faults. */
static inline void q8_0x_pair_step(__m256 acc[RN][RB], const uint8_t *w, int64_t row_bytes,
                             int64_t ahead, const xpair *x, int64_t npairs, const int nr,
                             const int nb, const int two) __attribute__((always_inline));

static inline void q8_0x_pair_step(__m256 acc[RN][RB], const uint8_t *w, int64_t row_bytes,
                             int64_t ahead, const xpair *x, int64_t npairs, const int nr,
                             const int nb, const int two) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int r = 0; r < nr; r++) {
        __m256i lo, hi;
        __m256 wd;
        _mm_prefetch((const char *)(w + r * row_bytes + ahead), _MM_HINT_T0);
        weight_pair(w + r * row_bytes, two, &lo, &hi, &wd);
#if MIN_TERM
        const __m256 wm = q8_0x_half_pair(w + r * row_bytes, two, 2, BLOCK_BYTES);
#endif
        for (int b = 0; b < nb; b++) {
            const xpair *xp = x + b * npairs;
            const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xp->lo),
                                                 _mm256_maddubs_epi16(hi, xp->hi));
            const __m256i isum = _mm256_add_epi32(_mm256_madd_epi16(s16, ones), xp->c);
            acc[r][b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(wd, xp->d),
                                        acc[r][b]);
#if MIN_TERM  /* + f32(m_w) * s_x, once per block (s_x is 0 but in lanes 0 and 4) */
            acc[r][b] = _mm256_fmadd_ps(wm, xp->s, acc[r][b]);
#endif
        }
    }
}

/* out[b*ldo + r] = dot(weight row r, x row b) for r < nr, b < nb (compile-time constants
 * after inlining: the loops unroll and acc[][] lives in registers). x holds npairs pairs
 * per row; nblocks may be odd (the last pair then has one block). */
static inline void q8_0x_tile(float *out, int64_t ldo, const uint8_t *w, int64_t row_bytes,
                        int64_t ahead, const xpair *x, int64_t nblocks, const int nr,
                        const int nb) __attribute__((always_inline));

static inline void q8_0x_tile(float *out, int64_t ldo, const uint8_t *w, int64_t row_bytes,
                        int64_t ahead, const xpair *x, int64_t nblocks, const int nr,
                        const int nb) {
    const int64_t npairs = (nblocks + 1) / 2, full = nblocks / 2;
    __m256 acc[RN][RB];
    for (int r = 0; r < nr; r++)
        for (int b = 0; b < nb; b++) acc[r][b] = _mm256_setzero_ps();
    for (int64_t pr = 0; pr < full; pr++)
        q8_0x_pair_step(acc, w + 2 * pr * BLOCK_BYTES, row_bytes, ahead, x + pr, npairs, nr,
                        nb, 1);
    if (full < npairs)
        q8_0x_pair_step(acc, w + 2 * full * BLOCK_BYTES, row_bytes, ahead, x + full, npairs,
                        nr, nb, 0);
    for (int r = 0; r < nr; r++)
        for (int b = 0; b < nb; b++) out[b * ldo + r] = hsum256_ps(acc[r][b]);
}

/* One 32-block pair index i of the x row at x (K values) into xq[i] (the odd last block
 * paired with an empty half: q = 0, d = 0, c = 0). */
static inline void q8_0x_quantize_pair(const float *x, xpair *xq, int64_t i, int64_t nblocks) {
    const int64_t blk = 2 * i;
    q8_0x_quantize(x + blk * QK, xq + i, 0, OFFSET, LANE_OFFSET);
    if (blk + 1 < nblocks) {
        q8_0x_quantize(x + (blk + 1) * QK, xq + i, 1, OFFSET, LANE_OFFSET);
    } else {
        memset((int8_t *)&xq[i].lo + 16, 0, 16);
        memset((int8_t *)&xq[i].hi + 16, 0, 16);
        memset((float *)&xq[i].d + 4, 0, 4 * sizeof(float));
        memset((int32_t *)&xq[i].c + 4, 0, 4 * sizeof(int32_t));
        memset((float *)&xq[i].s + 4, 0, 4 * sizeof(float));
    }
}

/* B = 1 (decode), K <= XSTACK_PAIRS * 64: the call is short (a gpt-oss expert, 2880 x 2880
 * MXFP4, is 4.4 MB: ~0.15 ms), so no malloc and no barrier — each thread quantises x onto
 * its own stack (bit-identical on every thread) — and the rows go one at a time, in
 * chunks of ~DECODE_CHUNK_BYTES of consecutive rows handed out dynamically: one long
 * sequential stream per thread (strata_q8_0.h's q8_0_decode, measured there 20-25% faster
 * than 3-4 row tiles). Each row's steps prefetch the next row's same column (pair_step),
 * one row ahead. The same sums as the tiles', bit for bit (each row's accumulator is its
 * own, in block order). Measured (benchmarks/lab_linear_q.py, 2 threads, cold, median,
 * against the 4-row tiles): q4_0 2880 x 2880 12 -> 26-28 GB/s, 6912 x 1152 22 -> 25,
 * 1536 x 576 11 -> 13; mxfp4 2880 x 2880 16 -> 28-29; q5_0 6912 x 1152 unchanged (24).
 * Later, with the rows prefetched at least 6 KiB ahead (was 1.5) in chunks of up to 1 MiB
 * (was 64 KiB; strata_q8_0.h's q8_0_decode measures why), q4_0 16384 x 8192 went from 0.79
 * to 0.93 of a plain cold read of the same bytes measured beside it. */
static void q8_0x_decode(float *out, const float *x, const uint8_t *w, int64_t N, int64_t K) {
    const int64_t nblocks = K / QK, row_bytes = nblocks * BLOCK_BYTES;
    const int64_t npairs = (nblocks + 1) / 2;
    /* at least PF_BYTES ahead: one short row (K = 576: 324 bytes of q4_0) is too close */
    const int64_t ahead = row_bytes > PF_BYTES ? row_bytes : PF_BYTES;
    int64_t chunk = DECODE_CHUNK_BYTES / row_bytes;
    const int64_t balanced = N / (4 * (int64_t)omp_get_max_threads());
    if (chunk > balanced) chunk = balanced;  /* at least ~4 chunks per thread */
    if (chunk < 1) chunk = 1;
#pragma omp parallel
    {
        xpair xq[XSTACK_PAIRS];
        for (int64_t i = 0; i < npairs; i++) q8_0x_quantize_pair(x, xq, i, nblocks);
#pragma omp for schedule(dynamic, chunk) nowait
        for (int64_t n = 0; n < N; n++)
            q8_0x_tile(out + n, N, w + n * row_bytes, row_bytes, ahead, xq, nblocks, 1, 1);
    }
}

static inline void q8_0x_run(float *out, const float *x, const uint8_t *w,
                             int64_t B, int64_t N, int64_t K) {
    const int64_t nblocks = K / QK, row_bytes = nblocks * BLOCK_BYTES;
    const int64_t groups = (N + RN - 1) / RN, npairs = (nblocks + 1) / 2;
    if (B == 1 && npairs <= XSTACK_PAIRS) {
        q8_0x_decode(out, x, w, N, K);
        return;
    }
    xpair *xq = aligned_alloc(32, (size_t)(B * npairs + 1) * sizeof(xpair));
    if (!xq) return;  /* out stays NaN: fails loudly */
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int64_t i = 0; i < B * npairs; i++) {
            const int64_t b = i / npairs;
            q8_0x_quantize_pair(x + b * K, xq + b * npairs, i % npairs, nblocks);
        }
#pragma omp for schedule(dynamic, CHUNK_GROUPS)
        for (int64_t g = 0; g < groups; g++) {
            const int64_t n = g * RN;
            const uint8_t *wg = w + n * row_bytes;
            const int fullg = n + RN <= N;
            int64_t b = 0;
            for (; B > 1 && b + RB <= B; b += RB) {
                const xpair *xb = xq + b * npairs;
                if (fullg) {
                    for (int h = 0; h < RN; h += RNB)
                        q8_0x_tile(out + b * N + n + h, N, wg + h * row_bytes, row_bytes,
                                   RNB * row_bytes, xb, nblocks, RNB, RB);
                } else {
                    for (int64_t r = 0; r < N - n; r++)
                        q8_0x_tile(out + b * N + n + r, N, wg + r * row_bytes, row_bytes,
                                   row_bytes, xb, nblocks, 1, RB);
                }
            }
            for (; b < B; b++) {
                const xpair *xb = xq + b * npairs;
                if (fullg) {
                    q8_0x_tile(out + b * N + n, N, wg, row_bytes, RN * row_bytes, xb, nblocks,
                               RN, 1);
                } else {
                    for (int64_t r = 0; r < N - n; r++)
                        q8_0x_tile(out + b * N + n + r, N, wg + r * row_bytes, row_bytes,
                                   row_bytes, xb, nblocks, 1, 1);
                }
            }
        }
    }
    free(xq);
}

#endif /* STRATA_Q8_0X_RUN_H */
