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
 * Steps 1, 3 and 4 live in strata_q8_0x.h / strata_q8_0x_run.h (shared with linear_q5_0);
 * this file holds the q4_0 weight layout (weight_pair).
 */
#include "strata_q8_0x.h"

#define BLOCK_BYTES 18
#define OFFSET 8  /* q4_0: nibble - 8 */

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

#include "strata_q8_0x_run.h"

void strata_linear_q4_0(float *out, const float *x, const uint8_t *w,
                        int64_t B, int64_t N, int64_t K) {
    q8_0x_run(out, x, w, B, N, K);
}
