// strata-kernel: op=conv1d_causal_step dialect=c entry=strata_conv1d_causal_step requires=avx2,fma
// y: 8 channels at a time, each tap a gather of the 8 states (stride K-1) and of the 8
// channels' weights (stride K) and an FMA, float32, taps in order. The new state is the old
// one moved down by one float as a whole (one memmove of B·C·(K-1) floats), then x written
// into every channel's newest slot. A decode step is a few microseconds: no thread team.
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

static float one(const float *s, const float *wc, float x, float bias, int64_t S) {
    float acc = bias;
    for (int64_t k = 0; k < S; k++) acc = __builtin_fmaf(wc[k], s[k], acc);
    return __builtin_fmaf(wc[S], x, acc);
}

void strata_conv1d_causal_step(float *out, const float *state, const float *x, const float *w,
                               const float *b, int64_t B, int64_t C, int64_t K) {
    const int64_t S = K - 1, n = B * C;
    float *ns = out;
    float *y = out + n * S;
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i sstep = _mm256_mullo_epi32(lane, _mm256_set1_epi32((int)S));
    const __m256i wstep = _mm256_mullo_epi32(lane, _mm256_set1_epi32((int)K));
    for (int64_t bi = 0; bi < B; bi++) {
        const float *sb = state + bi * C * S;
        const float *xb = x + bi * C;
        int64_t c = 0;
        for (; c + 8 <= C && S * 8 < (1 << 30); c += 8) {
            __m256 acc = _mm256_loadu_ps(b + c);
            for (int64_t k = 0; k < S; k++) {
                __m256 sv = _mm256_i32gather_ps(sb + c * S + k, sstep, 4);
                __m256 wv = _mm256_i32gather_ps(w + c * K + k, wstep, 4);
                acc = _mm256_fmadd_ps(wv, sv, acc);
            }
            __m256 wl = _mm256_i32gather_ps(w + c * K + S, wstep, 4);
            acc = _mm256_fmadd_ps(wl, _mm256_loadu_ps(xb + c), acc);
            _mm256_storeu_ps(y + bi * C + c, acc);
        }
        for (; c < C; c++) y[bi * C + c] = one(sb + c * S, w + c * K, xb[c], b[c], S);
    }
    if (n * S > 1) memmove(ns, state + 1, (size_t)(n * S - 1) * sizeof(float));
    for (int64_t r = 0; r < n; r++) ns[r * S + S - 1] = x[r];
}
