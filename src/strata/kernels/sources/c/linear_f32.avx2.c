// strata-kernel: op=linear_f32 dialect=c entry=strata_linear_f32 requires=avx2,fma
/* AVX2/FMA linear with a GGUF F32 weight: out[b,n] = sum_k x[b,k] * w[n,k], x [B,K],
 * w [N,K] row-major (each output's weights contiguous: a dot product per output).
 *
 * - Threads (OpenMP) own contiguous chunks of N, so each streams its own part of w once
 *   per x tile; nothing is shared between threads and no reduction crosses them.
 * - Register tiles: 8 weight rows x 1 x row (decode, B = 1) or 4 weight rows x 2 x rows
 *   (B > 1): each loaded x vector serves several weight rows and each weight vector
 *   several x rows; one ymm accumulator per (row, x row) pair, 8 independent FMA chains.
 * - B > 1: x is taken XT rows at a time and K in KC-deep slices so that the x slice stays
 *   in L2 (XT x KC floats <= 256 KiB) while a 4-row weight slice (16 KiB) sits in L1 and is
 *   reused for every x row of the tile: the weights are swept ceil(B / XT) times.
 * - Every output is computed the same way whatever the tile it lands in or the thread
 *   count (one accumulator over the same K slices, the same horizontal sum, slices added in
 *   order), so results do not depend on the number of threads.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>
#include "strata_simd.h"

#ifndef PAR_MIN_WORK  /* multiply-adds below which a fork-join costs more than it saves */
#define PAR_MIN_WORK ((int64_t)1 << 18)
#endif
#define XT 64                      /* x rows per tile */
#define X_TILE_FLOATS (64 * 1024)  /* x tile budget: 256 KiB of L2 */

/* out[j*N + i] (+)= sum_{k in [k0, k0+kc)} x[j*K + k] * w[i*K + k] for i < R, j < X.
 * R and X are constants at every call: the loops unroll and acc stays in registers. */
static inline __attribute__((always_inline)) void tile(
        const int R, const int X, float *out, int64_t N, const float *x, const float *w,
        int64_t K, int64_t k0, int64_t kc, int accumulate) {
    __m256 acc[2][8];
    for (int j = 0; j < X; j++)
        for (int i = 0; i < R; i++) acc[j][i] = _mm256_setzero_ps();
    const int64_t kend = k0 + kc, k8 = k0 + (kc & ~(int64_t)7);
    int64_t k = k0;
    for (; k < k8; k += 8) {
        __m256 xv[2];
        for (int j = 0; j < X; j++) xv[j] = _mm256_loadu_ps(x + j * K + k);
        for (int i = 0; i < R; i++) {
            const __m256 wv = _mm256_loadu_ps(w + i * K + k);
            for (int j = 0; j < X; j++) acc[j][i] = _mm256_fmadd_ps(wv, xv[j], acc[j][i]);
        }
    }
    if (k < kend) {
        const __m256i m = tailmask(kend - k);
        __m256 xv[2];
        for (int j = 0; j < X; j++) xv[j] = _mm256_maskload_ps(x + j * K + k, m);
        for (int i = 0; i < R; i++) {
            const __m256 wv = _mm256_maskload_ps(w + i * K + k, m);
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

/* out[:, n0:n1] = x @ w[n0:n1]^T. */
static void rows(float *out, const float *x, const float *w, int64_t B, int64_t N,
                 int64_t K, int64_t n0, int64_t n1) {
    const int64_t xt = min64(B, XT);
    int64_t kc_max = (X_TILE_FLOATS / xt) & ~(int64_t)7;
    if (kc_max >= K) kc_max = K;
    for (int64_t b0 = 0; b0 < B; b0 += xt) {
        const int64_t xb = min64(xt, B - b0);
        for (int64_t k0 = 0; k0 < K; k0 += kc_max) {
            const int64_t kc = min64(kc_max, K - k0);
            const int acc = k0 > 0;
            if (xb == 1) {
                const float *xr = x + b0 * K;
                float *o = out + b0 * N;
                int64_t n = n0;
                for (; n + 8 <= n1; n += 8) tile(8, 1, o + n, N, xr, w + n * K, K, k0, kc, acc);
                for (; n < n1; n++) tile(1, 1, o + n, N, xr, w + n * K, K, k0, kc, acc);
                continue;
            }
            int64_t n = n0;
            for (; n + 4 <= n1; n += 4) {
                int64_t b = b0;
                for (; b + 2 <= b0 + xb; b += 2)
                    tile(4, 2, out + b * N + n, N, x + b * K, w + n * K, K, k0, kc, acc);
                if (b < b0 + xb)
                    tile(4, 1, out + b * N + n, N, x + b * K, w + n * K, K, k0, kc, acc);
            }
            for (; n < n1; n++) {
                int64_t b = b0;
                for (; b + 2 <= b0 + xb; b += 2)
                    tile(1, 2, out + b * N + n, N, x + b * K, w + n * K, K, k0, kc, acc);
                if (b < b0 + xb)
                    tile(1, 1, out + b * N + n, N, x + b * K, w + n * K, K, k0, kc, acc);
            }
        }
    }
}

void strata_linear_f32(float *out, const float *x, const float *w, int64_t B, int64_t N,
                       int64_t K) {
    if (B <= 0 || N <= 0) return;
    if (K <= 0) {
        memset(out, 0, (size_t)(B * N) * sizeof(float));
        return;
    }
    if (B * N * K < PAR_MIN_WORK || N < 16) {
        rows(out, x, w, B, N, K, 0, N);
        return;
    }
#pragma omp parallel
    {
        /* contiguous chunks of N, multiples of 8 rows, one per thread */
        const int64_t threads = omp_get_num_threads(), id = omp_get_thread_num();
        const int64_t chunk = ((N + threads - 1) / threads + 7) & ~(int64_t)7;
        const int64_t n0 = min64(N, id * chunk), n1 = min64(N, n0 + chunk);
        if (n0 < n1) rows(out, x, w, B, N, K, n0, n1);
    }
}
