// strata-kernel: op=linear_q4_Kx8 dialect=c entry=strata_linear_q4_Kx8 requires=avx2,fma,f16c,avx512bw,avx512_vnni
/* linear_q4_Kx8 with AVX-512 VNNI on 256-bit registers (AVX512-VL: every CPU with
 * AVX512-VNNI has it, and -march=native turns it on): linear_q4_Kx8.avx2.c's program (it
 * explains the layout and the steps), but each qs slice's nibbles go into int32 lane sums
 * with one vpdpbusd each (unsigned nibble x signed q_x, four products per lane, no int16
 * stage and no vpmaddwd), and a sub-block's sum is scaled by one vpmulld with the row's
 * 6-bit scale zero-extended in its lane. The same integers and float32 steps: outputs equal
 * the AVX2 kernel's bit for bit. */
#include "strata_kquant.h"
#include "strata_q4k_row.h"
#include "strata_x8k.h"

#define BLOCK_BYTES 144
#define SUPERBLOCK q4k_superblock_avx2  /* the file-layout dot (strata_kquant_run.h) */

static inline __attribute__((always_inline)) void group_sb(__m256 acc[2], const uint8_t *p,
                                                           const xsb *x, int64_t nsb,
                                                           int64_t s, const int nb) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), byte0 = _mm256_set1_epi32(0xFF);
    const x8_q4k_scales u = x8_q4k_unpack(p);
    const uint8_t *qs = p + 128;
    __m256i sumi[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    _Pragma("GCC unroll 16")
    for (int c = 0; c < 4; c++) {
        const __m256i src = c < 2 ? u.sc_lo : u.sc_hi;
        const int i = (2 * c) % 4;  /* byte of sub-block 2c (2c+1: i+1) in its lane */
        const __m256i s_lo = _mm256_and_si256(_mm256_srli_epi32(src, 8 * i), byte0);
        const __m256i s_hi = _mm256_and_si256(_mm256_srli_epi32(src, 8 * (i + 1)), byte0);
        __m256i alo[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        __m256i ahi[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        _Pragma("GCC unroll 16")
        for (int k = 0; k < 8; k++) {
            const __m256i wv = _mm256_loadu_si256((const __m256i *)(qs + 32 * (8 * c + k)));
            const __m256i lo = _mm256_and_si256(wv, low4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(wv, 4), low4);
            _Pragma("GCC unroll 16")
            for (int b = 0; b < nb; b++) {
                const int8_t *q = x[b * nsb + s].q + 64 * c + 4 * k;
                alo[b] = _mm256_dpbusd_epi32(alo[b], lo, x8_bcast4(q));
                ahi[b] = _mm256_dpbusd_epi32(ahi[b], hi, x8_bcast4(q + 32));
            }
        }
        _Pragma("GCC unroll 16")
        for (int b = 0; b < nb; b++)
            sumi[b] = _mm256_add_epi32(sumi[b], _mm256_add_epi32(_mm256_mullo_epi32(alo[b], s_lo),
                                                                 _mm256_mullo_epi32(ahi[b], s_hi)));
    }
    x8_q4k_finish(acc, p, x, nsb, s, sumi, &u, nb);
}

#include "strata_x8run.h"

void strata_linear_q4_Kx8(float *out, const float *x, const uint8_t *w,
                          int64_t B, int64_t N, int64_t K) {
    x8_run(out, x, w, B, N, K);
}
