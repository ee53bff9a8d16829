// strata-kernel: op=linear_q6_Kx8 dialect=c entry=strata_linear_q6_Kx8 requires=avx2,fma,f16c
/* linear_q6_K's arithmetic (ggml's vec_dot_q6_K_q8_K, x quantised to q8_K) on strata's x8
 * layout (strata_x8.h): one 32-bit lane per weight row, eight rows per register.
 *
 * Per group super-block: the 8 rows' d are one F16C conversion; scales sit as [j][row]
 * int8, so one 8-byte load, a byte interleave with itself and a widening give each row's
 * sub-block scale as an int16 pair in its lane. An ql slice (32 B) holds 4 bytes of each
 * row, a qh slice the 4 matching high-bit bytes: four groups of weights (0..63) come out of
 * one ql pair and one qh slice by mask-and-shift (ggml's bit assignment, strata_q6k.h); the
 * layout puts each step's three slices next to each other, in the order they are read.
 * vpmaddubsw against the 4 matching q_x bytes broadcast to every lane, two slices summed in
 * int16 (|sum| <= 2*2*63*127 < 2^15), then vpmaddwd against the scale pair gives int32.
 * The -32 offset: sum (q-32)*q_x*sc = sum q*q_x*sc - 32*sum_j sc_j*bsum_j, the second sum
 * eight vpmaddwd of (sc_j, sc_j+1) against (bsum_j, bsum_j+1). d_x*d is rounded to float32
 * as ggml rounds it; one FMA per super-block and lane, no horizontal sums. */
#include "strata_kquant.h"
#include "strata_x8k.h"

#define BLOCK_BYTES 210
#define SUPERBLOCK q6k_superblock_avx2  /* the file-layout dot (strata_kquant_run.h) */

static inline __attribute__((always_inline)) void group_sb(__m256 acc[2], const uint8_t *p,
                                                           const xsb *x, int64_t nsb,
                                                           int64_t s, const int nb) {
    const uint8_t *sc = p + 16, *q = p + 144;
    __m256i sumi[2];
    x8_q6k_offsets(sumi, p, x, nsb, s, nb);
    _Pragma("GCC unroll 16")
    for (int h = 0; h < 2; h++) {
        _Pragma("GCC unroll 16")
        for (int t = 0; t < 2; t++) {  /* weights 16t..16t+15 of each group: sub-block 2g+t */
            __m256i scl[4];
            _Pragma("GCC unroll 16")
            for (int i = 0; i < 4; i++) {  /* sub-block 2(4h+i)+t's scale, an int16 pair */
                const __m128i v = _mm_loadl_epi64(
                    (const __m128i *)(sc + 8 * (2 * (4 * h + i) + t)));
                scl[i] = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(v, v));
            }
            _Pragma("GCC unroll 16")
            for (int kk = 0; kk < 2; kk++) {  /* two slices summed as int16, then scaled */
                __m256i a[2][4];
                _Pragma("GCC unroll 16")
                for (int b = 0; b < nb; b++)
                    _Pragma("GCC unroll 16")
                    for (int i = 0; i < 4; i++) a[b][i] = _mm256_setzero_si256();
                _Pragma("GCC unroll 16")
                for (int k = 4 * t + 2 * kk; k < 4 * t + 2 * kk + 2; k++) {
                    __m256i w[4];
                    x8_q6k_step(q + 96 * (8 * h + k), w);
                    _Pragma("GCC unroll 16")
                    for (int b = 0; b < nb; b++) {
                        const int8_t *xq = x[b * nsb + s].q + 128 * h + 4 * k;
                        _Pragma("GCC unroll 16")
                        for (int i = 0; i < 4; i++)
                            a[b][i] = _mm256_add_epi16(
                                a[b][i], _mm256_maddubs_epi16(w[i], x8_bcast4(xq + 32 * i)));
                    }
                }
                _Pragma("GCC unroll 16")
                for (int b = 0; b < nb; b++)
                    _Pragma("GCC unroll 16")
                    for (int i = 0; i < 4; i++)
                        sumi[b] = _mm256_add_epi32(sumi[b], _mm256_madd_epi16(a[b][i], scl[i]));
            }
        }
    }
    x8_q6k_finish(acc, p, x, nsb, s, sumi, nb);
}

/* the file-layout row dot of linear_q6_K.avx2.c, for the N % 8 last rows */
#include "strata_q6k_avx2.h"

#include "strata_x8run.h"

void strata_linear_q6_Kx8(float *out, const float *x, const uint8_t *w,
                          int64_t B, int64_t N, int64_t K) {
    x8_run(out, x, w, B, N, K);
}
