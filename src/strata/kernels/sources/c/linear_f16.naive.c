// strata-kernel: op=linear_f16 dialect=c entry=strata_linear_f16
/* Portable reference of ggml's F16 linear: out[b,n] = sum_k f16(x[b,k]) * w[n,k], x [B,K]
 * float32, w [N,K] IEEE binary16 (a GGUF F16 weight as stored). Each activation is first
 * rounded to binary16 (round to nearest, ties to even), as ggml converts the activation row
 * before its F16 dot product; the products (exact in float32) are summed in double here.
 * Conversions are done by bit manipulation (no F16C needed). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* binary16 -> binary32, exact for every input (subnormals renormalised, inf, NaN). */
static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
    uint32_t bits;
    if (exp == 0x1Fu) {
        bits = sign | 0x7F800000u | (mant << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (mant << 13);  /* rebias 15 -> 127 */
    } else if (mant == 0) {
        bits = sign;
    } else {  /* subnormal: mant * 2^-24; move the leading 1 to the implicit bit */
        uint32_t e = 113u;
        while (!(mant & 0x400u)) { mant <<= 1; e--; }
        bits = sign | (e << 23) | ((mant & 0x3FFu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* binary32 -> binary16, round to nearest, ties to even (what F16C's vcvtps2ph does with
 * _MM_FROUND_TO_NEAREST_INT): overflow to inf, gradual underflow to subnormals, NaN kept. */
static uint16_t float_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7FFFFFFFu;
    if (ax >= 0x7F800000u) return (uint16_t)(sign | 0x7C00u | (ax > 0x7F800000u ? 0x200u : 0));
    if (ax >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u);  /* >= 65520: rounds to inf */
    if (ax < 0x38800000u) {                                   /* below 2^-14: subnormal */
        if (ax < 0x33000000u) return (uint16_t)sign;           /* <= 2^-25: to zero */
        uint32_t e = ax >> 23, m = (ax & 0x7FFFFFu) | 0x800000u, shift = 126u - e;
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = (ax >> 13) - (112u << 10), rem = ax & 0x1FFFu;  /* rebias 127 -> 15 */
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;      /* a carry bumps the exp */
    return (uint16_t)(sign | r);
}

void strata_linear_f16(float *out, const float *x, const uint16_t *w, int64_t B, int64_t N,
                       int64_t K) {
    if (B <= 0 || N <= 0) return;
    float *xh = (float *)malloc((size_t)(K > 0 ? K : 1) * sizeof(float));
    if (!xh) return;
    for (int64_t b = 0; b < B; b++) {
        for (int64_t k = 0; k < K; k++) xh[k] = half_to_float(float_to_half(x[b * K + k]));
        for (int64_t n = 0; n < N; n++) {
            const uint16_t *wr = w + n * K;
            double acc = 0.0;
            for (int64_t k = 0; k < K; k++) acc += (double)xh[k] * half_to_float(wr[k]);
            out[b * N + n] = (float)acc;
        }
    }
    free(xh);
}
