/* strata_half.h: ggml's scalar numerics for the portable reference (`naive`) kernels:
 * IEEE binary16 <-> binary32. Portable C, no SIMD. Hashed with each user like strata_simd.h.
 * (The q8_0 quantisation of x stays in each linear_q*.naive.c: tests/test_kernels_linear_q.py
 * plants wrong roundings by editing it there.) */
#ifndef STRATA_HALF_H
#define STRATA_HALF_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* IEEE binary16 -> binary32, exact for every input (subnormals renormalised). */
static inline float half_to_float(uint16_t h) {
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
static inline uint16_t float_to_half(float f) {
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

#endif /* STRATA_HALF_H */
