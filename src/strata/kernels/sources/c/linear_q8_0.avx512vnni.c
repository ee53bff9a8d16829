// strata-kernel: op=linear_q8_0 dialect=c entry=strata_linear_q8_0 requires=avx2,fma,f16c,avx512f,avx512bw,avx512_vnni
/* linear_q8_0 with AVX-512 VNNI for B > 1 (prefill): strata_q8_0.h's program (decode at
 * B = 1 is its memory-bound stream, unchanged), but each tile holds two weight rows in one
 * 512-bit register (lanes 0-7 row r, 8-15 row r + 1) and a block's integer dot is one
 * vpdpbusd: x is stored as q_x + 128 (unsigned), and the accumulator starts at -128 * (the
 * sum of each lane's four weights), itself one vpdpbusd of 128s against w per weight block,
 * shared by every row of x. Each lane then holds exactly the int32 that the AVX2 kernel's
 * vpmaddubsw + vpmaddwd make (the same four products, exact), and the float32 steps per lane
 * are the same (convert, d_w * d_x, one FMA into that row's accumulator, block after
 * block), so outputs equal the AVX2 kernel's bit for bit (for finite x: a NaN, which
 * ggml's amax drops and quantises to -128, is multiplied exactly here, as -128 * |w| by the
 * AVX2 sign trick and ggml's; no clause specifies it). Half the instructions per output:
 * measured 2.0x the AVX2 kernel's GOP/s at 2048 x 2048 and 8192 x 2048, B = 64, on the
 * 2-core Zen 5 (vpdpbusd and the 512-bit FMAs run at full width there). */
#include "strata_q8_0.h"

#define VRP 2  /* row pairs per tile (4 weight rows) */
#define VRB 4  /* rows of x per tile */

/* out[b*ldo + 2r (+1)] for pairs r < np and x rows b < nb (compile-time constants after
 * inlining). pair1 is the distance from a pair's first row to its second; 0 when the last
 * pair is one row (the row twice, its second output not stored: `single`). */
static inline void vtile(float *out, int64_t ldo, const uint8_t *w, int64_t row_bytes,
                         int64_t pair1, const uint8_t *qxu, const float *dx, int64_t nblocks,
                         const int np, const int nb, const int single)
    __attribute__((always_inline));

static inline void vtile(float *out, int64_t ldo, const uint8_t *w, int64_t row_bytes,
                         int64_t pair1, const uint8_t *qxu, const float *dx, int64_t nblocks,
                         const int np, const int nb, const int single) {
    const __m512i c128 = _mm512_set1_epi8((char)0x80), zero = _mm512_setzero_si512();
    __m512 acc[VRP][VRB];
    for (int r = 0; r < np; r++)
        for (int b = 0; b < nb; b++) acc[r][b] = _mm512_setzero_ps();
    for (int64_t blk = 0; blk < nblocks; blk++) {
        __m512i xq[VRB];
        __m512 xd[VRB];
        for (int b = 0; b < nb; b++) {
            xq[b] = _mm512_broadcast_i64x4(
                _mm256_load_si256((const __m256i *)(qxu + (b * nblocks + blk) * QK)));
            xd[b] = _mm512_set1_ps(dx[b * nblocks + blk]);
        }
        for (int r = 0; r < np; r++) {
            const uint8_t *p0 = w + 2 * r * row_bytes + blk * BLOCK_BYTES, *p1 = p0 + pair1;
            const __m512i wq = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(p0 + 2))),
                _mm256_loadu_si256((const __m256i *)(p1 + 2)), 1);
            /* -128 x the sum of each lane's 4 weights: (q_x + 128) . w plus this is q_x . w */
            const __m512i bias = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, c128, wq));
            const __m512 wd = _mm512_castpd_ps(_mm512_insertf64x4(
                _mm512_castpd256_pd512(_mm256_castps_pd(half_at(p0))),
                _mm256_castps_pd(half_at(p1)), 1));
            for (int b = 0; b < nb; b++) {
                const __m512 s = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(bias, xq[b], wq));
                acc[r][b] = _mm512_fmadd_ps(s, _mm512_mul_ps(wd, xd[b]), acc[r][b]);
            }
        }
    }
    for (int r = 0; r < np; r++)
        for (int b = 0; b < nb; b++) {  /* each half summed as the AVX2 kernel sums a row */
            out[b * ldo + 2 * r] = hsum256_ps(_mm512_castps512_ps256(acc[r][b]));
            if (!(single && r == np - 1))
                out[b * ldo + 2 * r + 1] = hsum256_ps(_mm256_castpd_ps(
                    _mm512_extractf64x4_pd(_mm512_castps_pd(acc[r][b]), 1)));
        }
}

/* nb rows of x (q, d) against `rows` weight rows at wg: a whole group is VRP pairs; the
 * last group's 1-3 rows are a pair and/or a single row. */
static inline void vrows(float *out, int64_t N, const uint8_t *wg, int64_t rows,
                         int64_t row_bytes, const uint8_t *q, const float *d, int64_t nblocks,
                         const int nb) __attribute__((always_inline));

static inline void vrows(float *out, int64_t N, const uint8_t *wg, int64_t rows,
                         int64_t row_bytes, const uint8_t *q, const float *d, int64_t nblocks,
                         const int nb) {
    if (rows == 2 * VRP) {
        vtile(out, N, wg, row_bytes, row_bytes, q, d, nblocks, VRP, nb, 0);
        return;
    }
    int64_t r = 0;
    for (; r + 2 <= rows; r += 2)
        vtile(out + r, N, wg + r * row_bytes, row_bytes, row_bytes, q, d, nblocks, 1, nb, 0);
    if (r < rows)
        vtile(out + r, N, wg + r * row_bytes, row_bytes, 0, q, d, nblocks, 1, nb, 1);
}

static inline void group_vnni(float *out, int64_t N, const uint8_t *wg, int64_t rows,
                              int64_t row_bytes, const int8_t *qx, const float *dx, int64_t B,
                              int64_t K) {
    const int64_t nblocks = K / QK;
    const uint8_t *q = (const uint8_t *)qx;
    int64_t b = 0;
    for (; b + VRB <= B; b += VRB)
        vrows(out + b * N, N, wg, rows, row_bytes, q + b * K, dx + b * nblocks, nblocks, VRB);
    for (; b < B; b++)
        vrows(out + b * N, N, wg, rows, row_bytes, q + b * K, dx + b * nblocks, nblocks, 1);
}

void strata_linear_q8_0(float *out, const float *x, const uint8_t *w,
                        int64_t B, int64_t N, int64_t K) {
    q8_0_run(out, x, w, B, N, K, 2 * VRP, 1, group_vnni);
}
