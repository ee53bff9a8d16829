// strata-kernel: op=linear_mxfp4 dialect=c entry=strata_linear_mxfp4 requires=avx2,fma,f16c
/* GGUF MXFP4 linear layer (gpt-oss's experts) with ggml's numerics, AVX2/FMA/F16C and OpenMP:
 * out[b,n] = sum over 32-blocks of f32(2^(e-128) * d_x) * sum_j kv[c_j] * q_x[j]
 * (ggml's vec_dot_mxfp4_q8_0; kv = e2m1 doubled: 0, 1, 2, 3, 4, 6, 8, 12, then -0, -1 .. -12).
 *
 * linear_q4_0.avx2.c's program: x quantised to q8_0 in pairs of blocks (strata_q8_0x.h), the
 * tiles, prefetches and threads of strata_q8_0x_run.h. Here: a 17-byte block is an exponent
 * byte e and q4_0's 16 nibble bytes. The nibbles of two blocks (one per 128-bit half) go
 * through one vpshufb lookup each for the low and the high codes, of a table holding kv + 12
 * (0..24: unsigned, as vpmaddubsw wants its first operand; pair sums <= 2*24*127, two of
 * them added as int16 <= 12192). OFFSET 12 takes the 12 back in the integer sum in every
 * int32 lane (LANE_OFFSET: lane j subtracts 12 times the sum of the 8 q_x it multiplied), so
 * each lane holds a true partial sum of kv*q_x, as ggml's lanes do: a block of +-0 codes
 * adds exact zeros whatever its scale (up to 2^127). The scale 2^(e-128) comes from a table
 * of the 256 values (two broadcast loads per block pair); the driver multiplies it by d_x in
 * float32 as ggml does.
 */
#include "strata_q8_0x.h"

#define BLOCK_BYTES 17
#define OFFSET 12  /* the table holds kv + 12 */
#define LANE_OFFSET 1

/* 2^(e-128) for e = 0..255 as constant expressions (exact powers of two; e = 0, 1 are the
 * float32 subnormals 2^-128, 2^-127): ggml's GGML_E8M0_TO_FP32_HALF. */
#define E8M0(e) ((e) < 64 ? 0x1p-128f * (float)(1ull << (e))                     \
                 : (e) < 128 ? 0x1p-64f * (float)(1ull << ((e) - 64))            \
                 : (e) < 192 ? (float)(1ull << ((e) - 128))                      \
                             : 0x1p64f * (float)(1ull << ((e) - 192)))
#define E8M0_4(e) E8M0(e), E8M0((e) + 1), E8M0((e) + 2), E8M0((e) + 3)
#define E8M0_16(e) E8M0_4(e), E8M0_4((e) + 4), E8M0_4((e) + 8), E8M0_4((e) + 12)
#define E8M0_64(e) E8M0_16(e), E8M0_16((e) + 16), E8M0_16((e) + 32), E8M0_16((e) + 48)
static const float E8M0_HALF[256] = {E8M0_64(0), E8M0_64(64), E8M0_64(128), E8M0_64(192)};

/* The MXFP4 blocks at p and p + 17 (p + 17 only when `two`): their codes' values + 12 in
 * weight order against an xpair (weights 0..15 of both | weights 16..31 of both) and their
 * scales (4 lanes each). Without a second block the high half reads code 0 against an empty
 * x half (q_x = 0, d_x = 0, c = 0). */
static inline __attribute__((always_inline)) void weight_pair(const uint8_t *p, const int two,
                                                              __m256i *lo, __m256i *hi,
                                                              __m256 *wd) {
    const __m256i table = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24,
                                           12, 11, 10, 9, 8, 6, 4, 0,
                                           12, 13, 14, 15, 16, 18, 20, 24,
                                           12, 11, 10, 9, 8, 6, 4, 0);
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m128i a = _mm_loadu_si128((const __m128i *)(p + 1));
    const __m256i bytes = two ? _mm256_inserti128_si256(
                                    _mm256_castsi128_si256(a),
                                    _mm_loadu_si128((const __m128i *)(p + BLOCK_BYTES + 1)), 1)
                              : _mm256_zextsi128_si256(a);
    *lo = _mm256_shuffle_epi8(table, _mm256_and_si256(bytes, low4));
    *hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low4));
    *wd = _mm256_blend_ps(_mm256_broadcast_ss(&E8M0_HALF[p[0]]),
                          _mm256_broadcast_ss(&E8M0_HALF[two ? p[BLOCK_BYTES] : 0]), 0xF0);
}

#include "strata_q8_0x_run.h"

void strata_linear_mxfp4(float *out, const float *x, const uint8_t *w,
                         int64_t B, int64_t N, int64_t K) {
    q8_0x_run(out, x, w, B, N, K);
}
