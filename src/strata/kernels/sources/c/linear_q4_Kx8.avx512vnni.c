// strata-kernel: op=linear_q4_Kx8 dialect=c entry=strata_linear_q4_Kx8 requires=avx2,fma,f16c,avx512bw,avx512_vnni
/* linear_q4_Kx8 with AVX-512 VNNI on 256-bit registers (AVX512-VL: every CPU with
 * AVX512-VNNI has it, and -march=native turns it on): linear_q4_Kx8.avx2.c's program (it
 * explains the layout and the steps), but each qs slice's nibbles go into int32 lane sums
 * with one vpdpbusd each (unsigned nibble x signed q_x, four products per lane, no int16
 * stage and no vpmaddwd), and a sub-block's sum is scaled by one vpmulld with the row's
 * 6-bit scale zero-extended in its lane. The same integers and float32 steps: outputs equal
 * the AVX2 kernel's bit for bit. */
#include "strata_kquant.h"

#define BLOCK_BYTES 144

static inline __attribute__((always_inline)) void superblock(__m256 acc[RMAX][RB],
                                                             const uint8_t *w, int64_t row_bytes,
                                                             const xsb *x, int64_t nsb,
                                                             int64_t s, const int nr,
                                                             const int nb) {
    kquant_superblock_45(acc, w, row_bytes, x, nsb, s, nr, nb, 0);
}

/* per 32-bit lane: bytes i0 and i1 of the lane, each zero-extended to int16 */
static inline __m256i lane_bytes(int i0, int i1) {
    const char z = (char)0x80;
    return _mm256_setr_epi8(i0, z, i1, z, 4 + i0, z, 4 + i1, z, 8 + i0, z, 8 + i1, z,
                            12 + i0, z, 12 + i1, z, i0, z, i1, z, 4 + i0, z, 4 + i1, z,
                            8 + i0, z, 8 + i1, z, 12 + i0, z, 12 + i1, z);
}

static inline __m256i bcast4(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

static inline __attribute__((always_inline)) void group_sb(__m256 acc[2], const uint8_t *p,
                                                           const xsb *x, int64_t nsb,
                                                           int64_t s, const int nb) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i m3f = _mm256_set1_epi32(0x3F3F3F3F), m0f = _mm256_set1_epi32(0x0F0F0F0F);
    const __m256i m03 = _mm256_set1_epi32(0x03030303), byte0 = _mm256_set1_epi32(0xFF);
    const __m256i u0 = _mm256_loadu_si256((const __m256i *)(p + 32));
    const __m256i u1 = _mm256_loadu_si256((const __m256i *)(p + 64));
    const __m256i u2 = _mm256_loadu_si256((const __m256i *)(p + 96));
    const __m256i sc_lo = _mm256_and_si256(u0, m3f), mn_lo = _mm256_and_si256(u1, m3f);
    const __m256i sc_hi = _mm256_or_si256(
        _mm256_and_si256(u2, m0f), _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u0, 6), m03), 4));
    const __m256i mn_hi = _mm256_or_si256(
        _mm256_and_si256(_mm256_srli_epi32(u2, 4), m0f),
        _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u1, 6), m03), 4));
    const uint8_t *qs = p + 128;
    __m256i sumi[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    _Pragma("GCC unroll 16")
    for (int c = 0; c < 4; c++) {
        const __m256i src = c < 2 ? sc_lo : sc_hi;
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
                alo[b] = _mm256_dpbusd_epi32(alo[b], lo, bcast4(q));
                ahi[b] = _mm256_dpbusd_epi32(ahi[b], hi, bcast4(q + 32));
            }
        }
        _Pragma("GCC unroll 16")
        for (int b = 0; b < nb; b++)
            sumi[b] = _mm256_add_epi32(sumi[b], _mm256_add_epi32(_mm256_mullo_epi32(alo[b], s_lo),
                                                                 _mm256_mullo_epi32(ahi[b], s_hi)));
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16)));
    const __m256i m01 = _mm256_shuffle_epi8(mn_lo, lane_bytes(0, 1));
    const __m256i m23 = _mm256_shuffle_epi8(mn_lo, lane_bytes(2, 3));
    const __m256i m45 = _mm256_shuffle_epi8(mn_hi, lane_bytes(0, 1));
    const __m256i m67 = _mm256_shuffle_epi8(mn_hi, lane_bytes(2, 3));
    _Pragma("GCC unroll 16")
    for (int b = 0; b < nb; b++) {
        const xsb *xb = x + b * nsb + s;
        __m256i msum = _mm256_madd_epi16(m01, bcast4(xb->bsum32));
        msum = _mm256_add_epi32(msum, _mm256_madd_epi16(m23, bcast4(xb->bsum32 + 2)));
        msum = _mm256_add_epi32(msum, _mm256_madd_epi16(m45, bcast4(xb->bsum32 + 4)));
        msum = _mm256_add_epi32(msum, _mm256_madd_epi16(m67, bcast4(xb->bsum32 + 6)));
        const __m256 dx = _mm256_set1_ps(xb->d);
        /* f32(d_x*d) and f32(d_x*dmin): ggml's rounded products, then the FMAs */
        acc[b] = _mm256_fmadd_ps(_mm256_mul_ps(dx, d), _mm256_cvtepi32_ps(sumi[b]), acc[b]);
        acc[b] = _mm256_fnmadd_ps(_mm256_mul_ps(dx, dmin), _mm256_cvtepi32_ps(msum), acc[b]);
    }
}

#include "strata_x8run.h"

void strata_linear_q4_Kx8(float *out, const float *x, const uint8_t *w,
                          int64_t B, int64_t N, int64_t K) {
    x8_run(out, x, w, B, N, K);
}
