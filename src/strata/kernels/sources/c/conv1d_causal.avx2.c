// strata-kernel: op=conv1d_causal dialect=c entry=strata_conv1d_causal requires=avx2,fma
// One row (b, c) per OpenMP iteration: the first K-1 positions (which read the causal zero
// padding) scalar, then 8 positions at a time, each tap an unaligned load of x shifted by
// one and an FMA, then the scalar tail. float32 accumulation, taps in order k = 0..K-1.
#include <immintrin.h>
#include <stdint.h>

static void row(float *o, const float *x, const float *wc, float bias, int64_t T, int64_t K) {
    const int64_t head = K - 1 < T ? K - 1 : T;
    for (int64_t t = 0; t < head; t++) {
        float acc = bias;
        for (int64_t k = K - 1 - t; k < K; k++) acc = __builtin_fmaf(wc[k], x[t - (K - 1) + k],
                                                                    acc);
        o[t] = acc;
    }
    int64_t t = head;
    for (; t + 8 <= T; t += 8) {
        __m256 acc = _mm256_set1_ps(bias);
        for (int64_t k = 0; k < K; k++)
            acc = _mm256_fmadd_ps(_mm256_set1_ps(wc[k]),
                                  _mm256_loadu_ps(x + t - (K - 1) + k), acc);
        _mm256_storeu_ps(o + t, acc);
    }
    for (; t < T; t++) {
        float acc = bias;
        for (int64_t k = 0; k < K; k++) acc = __builtin_fmaf(wc[k], x[t - (K - 1) + k], acc);
        o[t] = acc;
    }
}

void strata_conv1d_causal(float *out, const float *x, const float *w, const float *b,
                          int64_t B, int64_t C, int64_t T, int64_t K) {
#pragma omp parallel for schedule(static) if (B * C * T > 32768)
    for (int64_t r = 0; r < B * C; r++) {
        const int64_t c = r % C;
        row(out + r * T, x + r * T, w + c * K, b[c], T, K);
    }
}
