// strata-kernel: op=linear_q4_0 dialect=c entry=strata_linear_q4_0
/* Reference GGUF q4_0 linear layer with ggml's numerics, portable C:
 * out[b,n] = sum over 32-blocks of f32(d_w) * f32(d_x) * sum_j q_w[j] * q_x[j],
 * with q_w = nibble - 8 (ggml's vec_dot_q4_0_q8_0).
 *
 * Each 32-block of a row of x is first quantised to q8_0 the way ggml's AVX2 path does
 * (docs/kernels-abi.md, linear_q4_0): amax = max |x|, d_x = fp16(amax / 127) (round to
 * nearest even), id = amax ? 127 / amax : 0 (float32), q_x = round_half_even(x * id). The
 * block dot is exact integer arithmetic; the scaled block sums accumulate in float32.
 * A q4_0 weight block is 18 bytes: a little-endian fp16 scale d_w, then 16 bytes; byte j
 * holds weight j in its low nibble and weight j+16 in its high nibble.
 * x is quantised once per call into a malloc'd buffer; rows are split over OpenMP threads.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define QK 32
#define BLOCK_BYTES 18

/* IEEE binary16 -> binary32, exact for every input (subnormals renormalised). */
static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t mant = h & 0x3FFu;
    uint32_t bits;
    if (exp == 0x1Fu) {
        bits = sign | 0x7F800000u | (mant << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else {
        uint32_t e = 113u;
        while (!(mant & 0x400u)) { mant <<= 1; e--; }
        bits = sign | (e << 23) | ((mant & 0x3FFu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* binary32 -> binary16, round to nearest even (what F16C's vcvtps2ph does with imm 0). */
static uint16_t float_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7FFFFFFFu;
    if (ax > 0x7F800000u) return (uint16_t)(sign | 0x7E00u);             /* NaN */
    if (ax >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);             /* >= 65520: inf */
    if (ax < 0x38800000u) {                                               /* < 2^-14 */
        if (ax < 0x33000000u) return (uint16_t)sign;                      /* <= 2^-25: 0 */
        const uint32_t e = ax >> 23, m = (ax & 0x7FFFFFu) | 0x800000u;
        const uint32_t shift = 126u - e;                                  /* 14..24 */
        uint32_t q = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t h = (((ax >> 23) - 112u) << 10) | ((ax & 0x7FFFFFu) >> 13);
    const uint32_t rem = ax & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;               /* carry is right */
    return (uint16_t)(sign | h);
}

/* One 32-block of x -> q8_0: int8 values and the float32 value of the fp16 scale. */
static void quantize_block(const float *x, int8_t *q, float *d) {
    float amax = 0.0f;
    for (int j = 0; j < QK; j++) {
        const float a = fabsf(x[j]);
        if (a > amax) amax = a;
    }
    *d = half_to_float(float_to_half(amax / 127.0f));
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    /* nearbyintf rounds half to even in the default rounding mode */
    for (int j = 0; j < QK; j++) q[j] = (int8_t)nearbyintf(x[j] * id);
}

void strata_linear_q4_0(float *out, const float *x, const uint8_t *w,
                        int64_t B, int64_t N, int64_t K) {
    const int64_t nblocks = K / QK;
    int8_t *qx = malloc((size_t)(B * K) + 1);
    float *dx = malloc((size_t)(B * nblocks + 1) * sizeof(float));
    if (!qx || !dx) { free(qx); free(dx); return; }  /* out stays NaN: fails loudly */
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < B * nblocks; i++) quantize_block(x + i * QK, qx + i * QK, dx + i);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const uint8_t *row = w + n * nblocks * BLOCK_BYTES;
        for (int64_t b = 0; b < B; b++) {
            float sum = 0.0f;
            for (int64_t blk = 0; blk < nblocks; blk++) {
                const uint8_t *p = row + blk * BLOCK_BYTES;
                const int8_t *qb = qx + (b * nblocks + blk) * QK;
                int32_t isum = 0;
                for (int j = 0; j < QK / 2; j++)
                    isum += ((int32_t)(p[2 + j] & 0x0F) - 8) * (int32_t)qb[j] +
                            ((int32_t)(p[2 + j] >> 4) - 8) * (int32_t)qb[j + QK / 2];
                const float d = half_to_float((uint16_t)(p[0] | (p[1] << 8))) *
                                dx[b * nblocks + blk];
                sum += d * (float)isum;
            }
            out[b * N + n] = sum;
        }
    }
    free(qx);
    free(dx);
}
