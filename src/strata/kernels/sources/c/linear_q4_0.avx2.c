// strata-kernel: op=linear_q4_0 dialect=c entry=strata_linear_q4_0 requires=avx2,fma,f16c
/* GGUF q4_0 linear layer with ggml's numerics, AVX2/FMA/F16C and OpenMP:
 * out[b,n] = sum over 32-blocks of f32(d_w) * f32(d_x) * sum_j (nib_j - 8) * q_x[j].
 *
 * 1. x is quantised once per call, every 32-block as ggml's AVX2 quantize_row_q8_0 does:
 *    amax = max |x|, d_x = fp16(amax / 127) (F16C, round to nearest even), id = amax ?
 *    127 / amax : 0, q_x = round_half_even(x * id) (vroundps), packed to int8, with
 *    c = -8 * sum_j q_x[j]. Blocks are stored in pairs laid out for the weights (xpair).
 * 2. The block dots are exact integer arithmetic, two blocks per 256-bit register: an
 *    18-byte q4_0 block holds weight j in the low nibble of byte j and weight j+16 in the
 *    high nibble, so the 16 bytes of block 2p go to the low half and those of block 2p+1
 *    to the high half; masking gives the low nibbles of both (against q_x[0..15] of each
 *    block), shifting by 4 and masking the high ones (against q_x[16..31]). Nibbles are
 *    unsigned, so vpmaddubsw takes them as they are against the signed q_x (pair sums
 *    <= 2*15*127; the two products added as int16 stay <= 7620), vpmaddwd against ones
 *    gives 4 int32 lanes per block, and the -8 offset is one integer add of c:
 *    sum (nib-8)*q = sum nib*q - 8*sum q, exactly ggml's isum. Converted and FMA'd with
 *    d_w*d_x per half (an exact float32 product of two fp16 values) into a float32
 *    accumulator: one conversion, multiply and FMA per two blocks.
 * 3. Tiling: at decode (B = 1) groups of RN weight rows share each x pair and the op
 *    streams the weights once; for B > 1 tiles of RNB weight rows x RB rows of x, the
 *    group's RN rows staying in L1 while every tile of x rows passes over them.
 * 4. Weight rows are split over threads in contiguous chunks of groups (sequential streams
 *    for the prefetcher), handed out dynamically; every output is one thread's fixed-order
 *    sum, so results do not depend on the thread count.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "strata_simd.h"

#define QK 32
#define BLOCK_BYTES 18
#define RN 4              /* weight rows per group (the tile at B = 1) */
#define RNB 2             /* weight rows per tile for B > 1 */
#define RB 4              /* rows of x per tile (B > 1) */
#define CHUNK_GROUPS 16   /* weight-row groups per scheduling chunk */

/* Two consecutive 32-blocks of x (a pair), laid out for the weight pair they meet: the
 * first 16 values of block 2p | of block 2p+1 (lo), the last 16 of each (hi), the blocks'
 * scales d_x four times each and the correction c = -8 * sum(q_x) in lanes 0 and 4. */
typedef struct {
    __m256i lo, hi;
    __m256 d;
    __m256i c;
} xpair;

/* One 32-block of x quantised into half `h` (0: block 2p, 1: block 2p+1) of pair `out`. */
static inline void quantize_block(const float *x, xpair *out, int h) {
    __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
    __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1));
    m = _mm256_max_ps(m, _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
    __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const __m128i h16 = _mm_cvtps_ph(_mm_set_ss(amax / 127.0f), _MM_FROUND_TO_NEAREST_INT);
    const float d = _mm_cvtss_f32(_mm_cvtph_ps(h16));
    const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
    const int mode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;  /* half to even */
    const __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v0, id), mode));
    const __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v1, id), mode));
    const __m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v2, id), mode));
    const __m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v3, id), mode));
    /* sum of the 32 values (each in [-127, 127]) from the int32 lanes */
    __m256i s = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    s4 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1)));
    /* the packs work per 128-bit lane: dwords end up in order 0,4,1,5,2,6,3,7 */
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    const __m256i q = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    int8_t *lo = (int8_t *)&out->lo, *hi = (int8_t *)&out->hi;
    float *dd = (float *)&out->d;
    int32_t *cc = (int32_t *)&out->c;
    _mm_store_si128((__m128i *)(lo + 16 * h), _mm256_castsi256_si128(q));
    _mm_store_si128((__m128i *)(hi + 16 * h), _mm256_extracti128_si256(q, 1));
    for (int j = 0; j < 4; j++) {
        dd[4 * h + j] = d;
        cc[4 * h + j] = 0;
    }
    cc[4 * h] = -8 * _mm_cvtsi128_si32(s4);
}

/* The q4_0 blocks at p and p + 18 (p + 18 only when `two`): their nibbles in weight order
 * against an xpair (low nibbles | low nibbles, high | high) and their scales (4 lanes
 * each). The second half is zero when there is no second block. */
static inline __attribute__((always_inline)) void weight_pair(const uint8_t *p, const int two,
                                                              __m256i *lo, __m256i *hi,
                                                              __m256 *wd) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m128i a = _mm_loadu_si128((const __m128i *)(p + 2));
    const __m256i bytes = two ? _mm256_inserti128_si256(_mm256_castsi128_si256(a),
                                                        _mm_loadu_si128((const __m128i *)(p + 20)),
                                                        1)
                              : _mm256_zextsi128_si256(a);
    *lo = _mm256_and_si256(bytes, low4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low4);
    int16_t ha, hb = 0;
    memcpy(&ha, p, sizeof ha);
    if (two) memcpy(&hb, p + BLOCK_BYTES, sizeof hb);
    *wd = _mm256_cvtph_ps(_mm_blend_epi16(_mm_set1_epi16(ha), _mm_set1_epi16(hb), 0xF0));
}

/* One pair of blocks (`two`) or the odd last block of weight rows r < nr against rows
 * b < nb of x, into acc[r][b] (nr, nb, two: compile-time constants after inlining). */
static inline __attribute__((always_inline)) void pair_step(__m256 acc[RN][RB],
                                                            const uint8_t *w, int64_t row_bytes,
                                                            const xpair *x, int64_t npairs,
                                                            const int nr, const int nb,
                                                            const int two) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int r = 0; r < nr; r++) {
        __m256i lo, hi;
        __m256 wd;
        weight_pair(w + r * row_bytes, two, &lo, &hi, &wd);
        for (int b = 0; b < nb; b++) {
            const xpair *xp = x + b * npairs;
            const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xp->lo),
                                                 _mm256_maddubs_epi16(hi, xp->hi));
            const __m256i isum = _mm256_add_epi32(_mm256_madd_epi16(s16, ones), xp->c);
            acc[r][b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(wd, xp->d),
                                        acc[r][b]);
        }
    }
}

/* out[b*ldo + r] = dot(weight row r, x row b) for r < nr, b < nb (compile-time constants
 * after inlining: the loops unroll and acc[][] lives in registers). x holds npairs pairs
 * per row; nblocks may be odd (the last pair then has one block). */
static inline __attribute__((always_inline)) void tile(float *out, int64_t ldo,
                                                       const uint8_t *w, int64_t row_bytes,
                                                       const xpair *x, int64_t nblocks,
                                                       const int nr, const int nb) {
    const int64_t npairs = (nblocks + 1) / 2, full = nblocks / 2;
    __m256 acc[RN][RB];
    for (int r = 0; r < nr; r++)
        for (int b = 0; b < nb; b++) acc[r][b] = _mm256_setzero_ps();
    for (int64_t pr = 0; pr < full; pr++)
        pair_step(acc, w + 2 * pr * BLOCK_BYTES, row_bytes, x + pr, npairs, nr, nb, 1);
    if (full < npairs)
        pair_step(acc, w + 2 * full * BLOCK_BYTES, row_bytes, x + full, npairs, nr, nb, 0);
    for (int r = 0; r < nr; r++)
        for (int b = 0; b < nb; b++) out[b * ldo + r] = hsum256_ps(acc[r][b]);
}

void strata_linear_q4_0(float *out, const float *x, const uint8_t *w,
                        int64_t B, int64_t N, int64_t K) {
    const int64_t nblocks = K / QK, row_bytes = nblocks * BLOCK_BYTES;
    const int64_t groups = (N + RN - 1) / RN, npairs = (nblocks + 1) / 2;
    xpair *xq = aligned_alloc(32, (size_t)(B * npairs + 1) * sizeof(xpair));
    if (!xq) return;  /* out stays NaN: fails loudly */
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int64_t i = 0; i < B * npairs; i++) {
            const int64_t b = i / npairs, pr = i % npairs, blk = 2 * pr;
            quantize_block(x + b * K + blk * QK, xq + i, 0);
            if (blk + 1 < nblocks) {
                quantize_block(x + b * K + (blk + 1) * QK, xq + i, 1);
            } else {  /* odd block count: an empty second half (q = 0, d = 0, c = 0) */
                memset((int8_t *)&xq[i].lo + 16, 0, 16);
                memset((int8_t *)&xq[i].hi + 16, 0, 16);
                memset((float *)&xq[i].d + 4, 0, 4 * sizeof(float));
                memset((int32_t *)&xq[i].c + 4, 0, 4 * sizeof(int32_t));
            }
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
                        tile(out + b * N + n + h, N, wg + h * row_bytes, row_bytes, xb, nblocks,
                             RNB, RB);
                } else {
                    for (int64_t r = 0; r < N - n; r++)
                        tile(out + b * N + n + r, N, wg + r * row_bytes, row_bytes, xb,
                             nblocks, 1, RB);
                }
            }
            for (; b < B; b++) {
                const xpair *xb = xq + b * npairs;
                if (fullg) {
                    tile(out + b * N + n, N, wg, row_bytes, xb, nblocks, RN, 1);
                } else {
                    for (int64_t r = 0; r < N - n; r++)
                        tile(out + b * N + n + r, N, wg + r * row_bytes, row_bytes, xb,
                             nblocks, 1, 1);
                }
            }
        }
    }
    free(xq);
}
