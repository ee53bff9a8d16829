// strata-kernel: op=linear_q6_Kx8 dialect=c entry=strata_linear_q6_Kx8 requires=avx2,fma,f16c,avx512bw,avx512_vnni
/* linear_q6_Kx8 with AVX-512 VNNI on 256-bit registers (AVX512-VL: every CPU with
 * AVX512-VNNI has it, and -march=native turns it on): linear_q6_Kx8.avx2.c's program (it
 * explains the layout and the steps), but the weights (0..63) of a sub-block's four slices go
 * into int32 lane sums with one vpdpbusd each against the broadcast q_x (no int16 stage, so
 * no pairing of slices against overflow), and the sum is scaled once by vpmulld with the
 * row's int8 scale sign-extended in its lane. The same integers and float32 steps as the
 * AVX2 kernel. */
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
            __m256i scl[4], a[2][4];
            _Pragma("GCC unroll 16")
            for (int i = 0; i < 4; i++)  /* sub-block 2(4h+i)+t's scale of rows 0..7 */
                scl[i] = _mm256_cvtepi8_epi32(
                    _mm_loadl_epi64((const __m128i *)(sc + 8 * (2 * (4 * h + i) + t))));
            _Pragma("GCC unroll 16")
            for (int b = 0; b < nb; b++)
                _Pragma("GCC unroll 16")
                for (int i = 0; i < 4; i++) a[b][i] = _mm256_setzero_si256();
            _Pragma("GCC unroll 16")
            for (int k = 4 * t; k < 4 * t + 4; k++) {
                __m256i w[4];
                x8_q6k_step(q + 96 * (8 * h + k), w);
                _Pragma("GCC unroll 16")
                for (int b = 0; b < nb; b++) {
                    const int8_t *xq = x[b * nsb + s].q + 128 * h + 4 * k;
                    _Pragma("GCC unroll 16")
                    for (int i = 0; i < 4; i++)
                        a[b][i] = _mm256_dpbusd_epi32(a[b][i], w[i], x8_bcast4(xq + 32 * i));
                }
            }
            _Pragma("GCC unroll 16")
            for (int b = 0; b < nb; b++)
                _Pragma("GCC unroll 16")
                for (int i = 0; i < 4; i++)
                    sumi[b] = _mm256_add_epi32(sumi[b], _mm256_mullo_epi32(a[b][i], scl[i]));
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
