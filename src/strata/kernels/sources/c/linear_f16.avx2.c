// strata-kernel: op=linear_f16 dialect=c entry=strata_linear_f16 requires=avx2,fma,f16c
/* AVX2/FMA/F16C linear with a GGUF F16 weight, ggml's F16 numerics:
 * out[b,n] = sum_k f16(x[b,k]) * w[n,k], x [B,K] float32, w [N,K] binary16 row-major.
 *
 * - x is rounded to binary16 once per call (vcvtps2ph, round to nearest even) and kept as
 *   float32 values in a scratch copy whose rows are padded with zeros to a multiple of 8;
 *   weights are widened on load (vcvtph2ps). A product of two binary16 values is exact in
 *   float32, so only the order of the float32 sums differs from ggml's.
 * - Threads (OpenMP) own contiguous chunks of N, so each streams its own part of w once
 *   per x tile; nothing is shared between threads and no reduction crosses them.
 * - Register tiles: 8 weight rows x 1 x row (decode, B = 1) or 4 weight rows x 2 x rows
 *   (B > 1): each loaded x vector serves several weight rows and each weight vector
 *   several x rows; one ymm accumulator per (row, x row) pair, 8 independent FMA chains.
 * - B > 1: x is taken XT rows at a time and K in KC-deep slices so that the x slice stays
 *   in L2 (XT x KC floats <= 256 KiB) while a 4-row weight slice (8 KiB) sits in L1 and is
 *   reused for every x row of the tile: the weights are swept ceil(B / XT) times.
 * - Every output is computed the same way whatever the tile it lands in or the thread
 *   count (one accumulator over the same K slices, the same horizontal sum, slices added in
 *   order), so results do not depend on the number of threads.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "strata_simd.h"

#ifndef PAR_MIN_WORK  /* multiply-adds below which a fork-join costs more than it saves */
#define PAR_MIN_WORK ((int64_t)1 << 18)
#endif
#define XT 64                      /* x rows per tile */
#define X_TILE_FLOATS (64 * 1024)  /* x tile budget: 256 KiB of L2 */

static inline __m256 load_w8(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

static inline __m256 load_w_tail(const uint16_t *p, int64_t rem) {
    uint16_t buf[8] = {0};
    memcpy(buf, p, (size_t)rem * sizeof(uint16_t));
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)buf));
}

/* out[j*N + i] (+)= sum_{k in [k0, k0+kc)} x[j*KP + k] * w[i*K + k] for i < R, j < X.
 * R and X are constants at every call: the loops unroll and acc stays in registers. */
static inline __attribute__((always_inline)) void tile(
        const int R, const int X, float *out, int64_t N, const float *x, const uint16_t *w,
        int64_t K, int64_t KP, int64_t k0, int64_t kc, int accumulate) {
    __m256 acc[2][8];
    for (int j = 0; j < X; j++)
        for (int i = 0; i < R; i++) acc[j][i] = _mm256_setzero_ps();
    const int64_t kend = k0 + kc, k8 = k0 + (kc & ~(int64_t)7);
    int64_t k = k0;
    for (; k < k8; k += 8) {
        __m256 xv[2];
        for (int j = 0; j < X; j++) xv[j] = _mm256_loadu_ps(x + j * KP + k);
        for (int i = 0; i < R; i++) {
            const __m256 wv = load_w8(w + i * K + k);
            for (int j = 0; j < X; j++) acc[j][i] = _mm256_fmadd_ps(wv, xv[j], acc[j][i]);
        }
    }
    if (k < kend) {
        /* x's padding is zero; the weight tail is copied into a zeroed 8-lane buffer */
        __m256 xv[2];
        for (int j = 0; j < X; j++) xv[j] = _mm256_loadu_ps(x + j * KP + k);
        for (int i = 0; i < R; i++) {
            const __m256 wv = load_w_tail(w + i * K + k, kend - k);
            for (int j = 0; j < X; j++) acc[j][i] = _mm256_fmadd_ps(wv, xv[j], acc[j][i]);
        }
    }
    for (int j = 0; j < X; j++)
        for (int i = 0; i < R; i++) {
            const float r = hsum256_ps(acc[j][i]);
            float *o = out + j * N + i;
            *o = accumulate ? *o + r : r;
        }
}

/* out[:, n0:n1] = xh @ w[n0:n1]^T; xh is f16(x) with rows of KP floats. */
static void rows(float *out, const float *x, const uint16_t *w, int64_t B, int64_t N,
                 int64_t K, int64_t KP, int64_t n0, int64_t n1) {
    const int64_t xt = min64(B, XT);
    int64_t kc_max = (X_TILE_FLOATS / xt) & ~(int64_t)7;
    if (kc_max >= K) kc_max = K;
    for (int64_t b0 = 0; b0 < B; b0 += xt) {
        const int64_t xb = min64(xt, B - b0);
        for (int64_t k0 = 0; k0 < K; k0 += kc_max) {
            const int64_t kc = min64(kc_max, K - k0);
            const int acc = k0 > 0;
            if (xb == 1) {
                const float *xr = x + b0 * KP;
                float *o = out + b0 * N;
                int64_t n = n0;
                for (; n + 8 <= n1; n += 8) tile(8, 1, o + n, N, xr, w + n * K, K, KP, k0, kc, acc);
                for (; n < n1; n++) tile(1, 1, o + n, N, xr, w + n * K, K, KP, k0, kc, acc);
                continue;
            }
            int64_t n = n0;
            for (; n + 4 <= n1; n += 4) {
                int64_t b = b0;
                for (; b + 2 <= b0 + xb; b += 2)
                    tile(4, 2, out + b * N + n, N, x + b * KP, w + n * K, K, KP, k0, kc, acc);
                if (b < b0 + xb)
                    tile(4, 1, out + b * N + n, N, x + b * KP, w + n * K, K, KP, k0, kc, acc);
            }
            for (; n < n1; n++) {
                int64_t b = b0;
                for (; b + 2 <= b0 + xb; b += 2)
                    tile(1, 2, out + b * N + n, N, x + b * KP, w + n * K, K, KP, k0, kc, acc);
                if (b < b0 + xb)
                    tile(1, 1, out + b * N + n, N, x + b * KP, w + n * K, K, KP, k0, kc, acc);
            }
        }
    }
}

/* xh[b, :] = f16(x[b, :]) as float32, rows padded with zeros to KP = K rounded up to 8. */
static void round_x(float *xh, const float *x, int64_t B, int64_t K, int64_t KP) {
    for (int64_t b = 0; b < B; b++) {
        const float *xr = x + b * K;
        float *hr = xh + b * KP;
        int64_t k = 0;
        for (; k + 8 <= K; k += 8) {
            const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(xr + k), _MM_FROUND_TO_NEAREST_INT);
            _mm256_storeu_ps(hr + k, _mm256_cvtph_ps(h));
        }
        if (k < K) {
            float buf[8] = {0};
            memcpy(buf, xr + k, (size_t)(K - k) * sizeof(float));
            const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(buf), _MM_FROUND_TO_NEAREST_INT);
            _mm256_storeu_ps(hr + k, _mm256_cvtph_ps(h));  /* zeros past K: the padding */
        }
    }
}

void strata_linear_f16(float *out, const float *x, const uint16_t *w, int64_t B, int64_t N,
                       int64_t K) {
    if (B <= 0 || N <= 0) return;
    if (K <= 0) {
        memset(out, 0, (size_t)(B * N) * sizeof(float));
        return;
    }
    const int64_t KP = (K + 7) & ~(int64_t)7;
    float *xh = (float *)malloc((size_t)(B * KP) * sizeof(float));
    if (!xh) return;
    round_x(xh, x, B, K, KP);
    if (B * N * K < PAR_MIN_WORK || N < 16) {
        rows(out, xh, w, B, N, K, KP, 0, N);
        free(xh);
        return;
    }
#pragma omp parallel
    {
        /* contiguous chunks of N, multiples of 8 rows, one per thread */
        const int64_t threads = omp_get_num_threads(), id = omp_get_thread_num();
        const int64_t chunk = ((N + threads - 1) / threads + 7) & ~(int64_t)7;
        const int64_t n0 = min64(N, id * chunk), n1 = min64(N, n0 + chunk);
        if (n0 < n1) rows(out, xh, w, B, N, K, KP, n0, n1);
    }
    free(xh);
}
