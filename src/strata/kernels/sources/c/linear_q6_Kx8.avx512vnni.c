// strata-kernel: op=linear_q6_Kx8 dialect=c entry=strata_linear_q6_Kx8 requires=avx2,fma,f16c,avx512bw,avx512_vnni
/* linear_q6_Kx8 with AVX-512 VNNI on 256-bit registers (AVX512-VL: every CPU with
 * AVX512-VNNI has it, and -march=native turns it on): linear_q6_Kx8.avx2.c's program (it
 * explains the layout and the steps), but the weights (0..63) of a sub-block's four slices go
 * into int32 lane sums with one vpdpbusd each against the broadcast q_x (no int16 stage, so
 * no pairing of slices against overflow), and the sum is scaled once by vpmulld with the
 * row's int8 scale sign-extended in its lane. The same integers and float32 steps as the
 * AVX2 kernel. */
#include "strata_kquant.h"

#define BLOCK_BYTES 210

static inline __m256i bcast4(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

static inline __attribute__((always_inline)) void group_sb(__m256 acc[2], const uint8_t *p,
                                                           const xsb *x, int64_t nsb,
                                                           int64_t s, const int nb) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), hmask = _mm256_set1_epi8(0x30);
    const uint8_t *sc = p + 16, *q = p + 144;
    __m256i sumi[2], off[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    _Pragma("GCC unroll 16")
    for (int j = 0; j < 16; j += 2) {  /* sum_j sc_j * bsum_j, pairs of sub-blocks */
        const __m128i v = _mm_loadu_si128((const __m128i *)(sc + 8 * j));
        const __m256i sp = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(v, _mm_srli_si128(v, 8)));
        _Pragma("GCC unroll 16")
        for (int b = 0; b < nb; b++)
            off[b] = _mm256_add_epi32(off[b], _mm256_madd_epi16(sp, bcast4(x[b * nsb + s].bsums + j)));
    }
    _Pragma("GCC unroll 16")
    for (int b = 0; b < nb; b++) sumi[b] = _mm256_sub_epi32(_mm256_setzero_si256(),
                                                             _mm256_slli_epi32(off[b], 5));
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
                const uint8_t *st = q + 96 * (8 * h + k);  /* ql, ql + 32, qh */
                const __m256i l0 = _mm256_loadu_si256((const __m256i *)st);
                const __m256i l1 = _mm256_loadu_si256((const __m256i *)(st + 32));
                const __m256i hb = _mm256_loadu_si256((const __m256i *)(st + 64));
                __m256i w[4];
                w[0] = _mm256_or_si256(_mm256_and_si256(l0, low4),
                                       _mm256_and_si256(_mm256_slli_epi16(hb, 4), hmask));
                w[1] = _mm256_or_si256(_mm256_and_si256(l1, low4),
                                       _mm256_and_si256(_mm256_slli_epi16(hb, 2), hmask));
                w[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4),
                                       _mm256_and_si256(hb, hmask));
                w[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                                       _mm256_and_si256(_mm256_srli_epi16(hb, 2), hmask));
                _Pragma("GCC unroll 16")
                for (int b = 0; b < nb; b++) {
                    const int8_t *xq = x[b * nsb + s].q + 128 * h + 4 * k;
                    _Pragma("GCC unroll 16")
                    for (int i = 0; i < 4; i++)
                        a[b][i] = _mm256_dpbusd_epi32(a[b][i], w[i], bcast4(xq + 32 * i));
                }
            }
            _Pragma("GCC unroll 16")
            for (int b = 0; b < nb; b++)
                _Pragma("GCC unroll 16")
                for (int i = 0; i < 4; i++)
                    sumi[b] = _mm256_add_epi32(sumi[b], _mm256_mullo_epi32(a[b][i], scl[i]));
        }
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    _Pragma("GCC unroll 16")
    for (int b = 0; b < nb; b++) {
        /* f32(d_x*d): ggml's rounded product, then the FMA */
        const __m256 dx = _mm256_set1_ps(x[b * nsb + s].d);
        acc[b] = _mm256_fmadd_ps(_mm256_mul_ps(dx, d), _mm256_cvtepi32_ps(sumi[b]), acc[b]);
    }
}

/* the file-layout row dot of linear_q6_K.avx2.c, for the N % 8 last rows */
#include "strata_q6k_avx2.h"

#include "strata_x8run.h"

void strata_linear_q6_Kx8(float *out, const float *x, const uint8_t *w,
                          int64_t B, int64_t N, int64_t K) {
    x8_run(out, x, w, B, N, K);
}
