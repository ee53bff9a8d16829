// strata-kernel: op=matvec_q8_0 dialect=c entry=strata_matvec_q8_0
/* Reference GGUF q8_0 matrix-vector product: out[b,n] = sum_k deq(w)[n,k] * x[b,k].
 *
 * A q8_0 block is 34 bytes: a little-endian fp16 scale d, then 32 int8 values q; each
 * weight is d*q. Dequantisation and the dot product happen in one pass, accumulating in
 * fp32 (per block first, then scaled by d, as the optimised variants do). Portable C only
 * (OpenMP over rows when available).
 */
#include <stdint.h>
#include <string.h>

#define QK 32
#define BLOCK_BYTES 34

/* IEEE binary16 -> binary32 by bit manipulation, exact for every input including
 * subnormals (renormalised), infinities and NaNs. */
static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t mant = h & 0x3FFu;
    uint32_t bits;
    if (exp == 0x1Fu) {
        bits = sign | 0x7F800000u | (mant << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (mant << 13);  /* rebias 15 -> 127 */
    } else if (mant == 0) {
        bits = sign;
    } else {
        /* subnormal: value = mant * 2^-24; shift the leading 1 up to the implicit bit */
        uint32_t e = 113u;  /* biased exponent of 2^-14, the scale of a normalised mant */
        while (!(mant & 0x400u)) { mant <<= 1; e--; }
        bits = sign | (e << 23) | ((mant & 0x3FFu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static float row_dot(const uint8_t *row, const float *x, int64_t nblocks) {
    float sum = 0.0f;
    for (int64_t blk = 0; blk < nblocks; blk++) {
        const uint8_t *p = row + blk * BLOCK_BYTES;
        const float d = half_to_float((uint16_t)(p[0] | (p[1] << 8)));
        const int8_t *q = (const int8_t *)(p + 2);
        const float *xb = x + blk * QK;
        float bsum = 0.0f;
        for (int j = 0; j < QK; j++) bsum += (float)q[j] * xb[j];
        sum += d * bsum;
    }
    return sum;
}

void strata_matvec_q8_0(float *out, const uint8_t *w, const float *x,
                        int64_t B, int64_t N, int64_t K) {
    const int64_t nblocks = K / QK;
    /* rows are independent; the pragma is ignored by a compiler without OpenMP */
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++)
        for (int64_t b = 0; b < B; b++)
            out[b * N + n] = row_dot(w + n * nblocks * BLOCK_BYTES, x + b * K, nblocks);
}
