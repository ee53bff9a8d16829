/* strata_sgemm.h: the lab's fp32 GEMM (AVX2/FMA + OpenMP), out[M,N] = a[M,K] @ b[K,N],
 * row-major and contiguous: `strata_sgemm`. matmul.avx2.c is this header's entry point; the
 * im2col convolutions call it on their patch matrix. Everything is `static`: each kernel's
 * library keeps its own copy.
 *
 * Two paths:
 *
 *  - GEMM (M > SKINNY_M): the Goto/BLIS scheme. The work items are column slabs of b
 *    (256..1024 columns, about 4 per thread) handed out dynamically; each thread computes
 *    its slab start to finish with private buffers, so there is no barrier inside the
 *    call (a core stolen by another process only delays the slab it holds). For each
 *    KC-deep slice, the slab of b is packed into NR-wide micro-panels (L2/L3) and each
 *    MC x KC block of a into MR-tall micro-panels (144 KiB, L2); a 6x16 register-blocked
 *    micro-kernel (12 ymm accumulators) then runs with one 16 KiB b micro-panel in L1.
 *    Ragged edges are handled by zero-padding the packed panels and writing back only
 *    the valid part of a tile.
 *
 *  - Skinny (M <= SKINNY_M, the decode shapes): packing a is pointless and packing b
 *    would cost a full extra pass over it, while the op is bound by streaming b from
 *    memory. Each thread owns a contiguous range of columns and, eight rows of b at a
 *    time, adds their weighted sum into its slice of out, which stays in L1/L2. b is read
 *    exactly once, sequentially.
 *
 * Scratch buffers are allocated and freed inside the call; there is no global state. */
#ifndef STRATA_SGEMM_H
#define STRATA_SGEMM_H

#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "strata_simd.h"

#define MR 6            /* micro-kernel rows: 6 x 2 accumulators + 2 b + 1 a = 15 ymm */
#define NR 16           /* micro-kernel columns: two ymm vectors */
#define MC 144          /* rows of a per L2 block: 144 x 256 x 4 B = 144 KiB of 512 KiB L2 */
#define KC 256          /* depth per pass: a 256 x 16 b micro-panel is 16 KiB of 32 KiB L1 */
#define MAX_SLAB 1024   /* widest column slab per work item: 256 x 1024 x 4 B = 1 MiB of b */
#define SKINNY_M 8      /* up to this many rows, stream b instead of packing */

static inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* ---------------------------------------------------------------- packing */

/* dst[p*MR + i] = a[i, p] for p < kc, i < MR; rows past `rows` are zero so the
 * micro-kernel never needs an edge case on the M side. */
static void pack_a_panel(float *restrict dst, const float *restrict a, int64_t lda,
                         int64_t rows, int64_t kc) {
    if (rows == MR) {
        for (int64_t p = 0; p < kc; p++)
            for (int i = 0; i < MR; i++) dst[p * MR + i] = a[i * lda + p];
        return;
    }
    for (int64_t p = 0; p < kc; p++)
        for (int i = 0; i < MR; i++) dst[p * MR + i] = i < rows ? a[i * lda + p] : 0.0f;
}

/* dst[p*NR + j] = b[p, j] for p < kc, j < NR; columns past `cols` are zero. */
static void pack_b_panel(float *restrict dst, const float *restrict b, int64_t ldb,
                         int64_t cols, int64_t kc) {
    if (cols == NR) {
        for (int64_t p = 0; p < kc; p++) {
            _mm256_store_ps(dst + p * NR, _mm256_loadu_ps(b + p * ldb));
            _mm256_store_ps(dst + p * NR + 8, _mm256_loadu_ps(b + p * ldb + 8));
        }
        return;
    }
    for (int64_t p = 0; p < kc; p++)
        for (int j = 0; j < NR; j++) dst[p * NR + j] = j < cols ? b[p * ldb + j] : 0.0f;
}

/* ---------------------------------------------------------------- micro-kernel */

/* c[0:mr, 0:nr] (+)= ap (MR x kc, packed) @ bp (kc x NR, packed). The product is always
 * computed for the full 6x16 tile (padding is zero); only the valid part is written.
 * `accumulate` is 0 for the first KC slice, since out arrives filled with NaN. */
static void kernel_6x16(int64_t kc, const float *restrict ap, const float *restrict bp,
                        float *restrict c, int64_t ldc, int64_t mr, int64_t nr,
                        int accumulate) {
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps();
    __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
    __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps();
    __m256 c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
    __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps();
    __m256 c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();

    for (int64_t p = 0; p < kc; p++) {
        const __m256 b0 = _mm256_load_ps(bp), b1 = _mm256_load_ps(bp + 8);
        __m256 a;
        a = _mm256_broadcast_ss(ap + 0);
        c00 = _mm256_fmadd_ps(a, b0, c00); c01 = _mm256_fmadd_ps(a, b1, c01);
        a = _mm256_broadcast_ss(ap + 1);
        c10 = _mm256_fmadd_ps(a, b0, c10); c11 = _mm256_fmadd_ps(a, b1, c11);
        a = _mm256_broadcast_ss(ap + 2);
        c20 = _mm256_fmadd_ps(a, b0, c20); c21 = _mm256_fmadd_ps(a, b1, c21);
        a = _mm256_broadcast_ss(ap + 3);
        c30 = _mm256_fmadd_ps(a, b0, c30); c31 = _mm256_fmadd_ps(a, b1, c31);
        a = _mm256_broadcast_ss(ap + 4);
        c40 = _mm256_fmadd_ps(a, b0, c40); c41 = _mm256_fmadd_ps(a, b1, c41);
        a = _mm256_broadcast_ss(ap + 5);
        c50 = _mm256_fmadd_ps(a, b0, c50); c51 = _mm256_fmadd_ps(a, b1, c51);
        ap += MR;
        bp += NR;
    }

    const __m256 acc[MR][2] = {{c00, c01}, {c10, c11}, {c20, c21},
                               {c30, c31}, {c40, c41}, {c50, c51}};
    if (mr == MR && nr == NR) {  /* full tile: straight to out */
        for (int i = 0; i < MR; i++) {
            float *ci = c + i * ldc;
            __m256 v0 = acc[i][0], v1 = acc[i][1];
            if (accumulate) {
                v0 = _mm256_add_ps(v0, _mm256_loadu_ps(ci));
                v1 = _mm256_add_ps(v1, _mm256_loadu_ps(ci + 8));
            }
            _mm256_storeu_ps(ci, v0);
            _mm256_storeu_ps(ci + 8, v1);
        }
        return;
    }
    float tmp[MR * NR];  /* edge tile: spill, then copy the valid mr x nr corner */
    for (int i = 0; i < MR; i++) {
        _mm256_storeu_ps(tmp + i * NR, acc[i][0]);
        _mm256_storeu_ps(tmp + i * NR + 8, acc[i][1]);
    }
    for (int64_t i = 0; i < mr; i++)
        for (int64_t j = 0; j < nr; j++)
            c[i * ldc + j] = accumulate ? c[i * ldc + j] + tmp[i * NR + j] : tmp[i * NR + j];
}

/* ---------------------------------------------------------------- GEMM path */

/* out[:, j0:j0+w] = a @ b[:, j0:j0+w], one thread, with private packing buffers
 * Ap (MC x KC) and Bp (KC x w rounded up to NR). Loop order (BLIS): the KC x w slab of
 * packed b is reused by every MC-row block, the MC x KC block of packed a stays in L2
 * while the micro-kernel sweeps it once per b micro-panel, which stays in L1. */
static void column_slab(float *out, const float *a, const float *b, int64_t M, int64_t N,
                        int64_t K, int64_t j0, int64_t w, float *Ap, float *Bp) {
    const int64_t b_panels = ceil_div(w, NR);
    for (int64_t pc = 0; pc < K; pc += KC) {
        const int64_t kc = min64(KC, K - pc);
        for (int64_t jp = 0; jp < b_panels; jp++)
            pack_b_panel(Bp + jp * kc * NR, b + pc * N + j0 + jp * NR, N,
                         min64(NR, w - jp * NR), kc);
        for (int64_t ic = 0; ic < M; ic += MC) {
            const int64_t mc = min64(MC, M - ic);
            for (int64_t i = 0; i < mc; i += MR)
                pack_a_panel(Ap + (i / MR) * kc * MR, a + (ic + i) * K + pc, K,
                             min64(MR, mc - i), kc);
            for (int64_t jp = 0; jp < b_panels; jp++)
                for (int64_t i = 0; i < mc; i += MR)
                    kernel_6x16(kc, Ap + (i / MR) * kc * MR, Bp + jp * kc * NR,
                                out + (ic + i) * N + j0 + jp * NR, N, min64(MR, mc - i),
                                min64(NR, w - jp * NR), pc > 0);
        }
    }
}

/* Work items are column slabs, each computed start to finish by one thread with its own
 * buffers: no barrier inside the call, so a core stolen by another process delays only
 * the slab it holds while the other thread keeps taking slabs. The price is that each
 * slab packs all of a again, one packed float per 2*w flops (a few percent at w >= 256). */
static int gemm_packed(float *out, const float *a, const float *b, int64_t M, int64_t N,
                       int64_t K) {
    const int64_t threads = omp_get_max_threads();
    /* about 4 slabs per thread for balance, but no narrower than 256 columns */
    int64_t w = ceil_div(ceil_div(N, 4 * threads), NR) * NR;
    w = w < 256 ? 256 : w > MAX_SLAB ? MAX_SLAB : w;
    const int64_t slabs = ceil_div(N, w);
    const size_t a_floats = (size_t)MC * KC, b_floats = (size_t)KC * (size_t)ceil_div(w, NR) * NR;
    const size_t per_thread = a_floats + b_floats;  /* both multiples of 16 floats = 64 B */
    float *scratch = aligned_alloc(64, (size_t)threads * per_thread * sizeof(float));
    if (!scratch) return 0;
#pragma omp parallel num_threads((int)threads)
    {
        float *Ap = scratch + (size_t)omp_get_thread_num() * per_thread, *Bp = Ap + a_floats;
#pragma omp for schedule(dynamic, 1)
        for (int64_t s = 0; s < slabs; s++)
            column_slab(out, a, b, M, N, K, s * w, min64(w, N - s * w), Ap, Bp);
    }
    free(scratch);
    return 1;
}

/* ---------------------------------------------------------------- skinny path */

/* o[0:w] += sum_{u<8} ar[u] * b[u*ldb + 0:w]: eight rows of b per pass over o, so o is
 * loaded and stored once per 8 FMAs instead of once per FMA. */
static void update8(float *restrict o, const float *restrict ar, const float *restrict b,
                    int64_t ldb, int64_t w) {
    const __m256 a0 = _mm256_broadcast_ss(ar + 0), a1 = _mm256_broadcast_ss(ar + 1);
    const __m256 a2 = _mm256_broadcast_ss(ar + 2), a3 = _mm256_broadcast_ss(ar + 3);
    const __m256 a4 = _mm256_broadcast_ss(ar + 4), a5 = _mm256_broadcast_ss(ar + 5);
    const __m256 a6 = _mm256_broadcast_ss(ar + 6), a7 = _mm256_broadcast_ss(ar + 7);
    const float *b0 = b, *b1 = b + ldb, *b2 = b + 2 * ldb, *b3 = b + 3 * ldb;
    const float *b4 = b + 4 * ldb, *b5 = b + 5 * ldb, *b6 = b + 6 * ldb, *b7 = b + 7 * ldb;
    int64_t j = 0;
    for (; j + 8 <= w; j += 8) {
        /* two partial sums halve the FMA dependency chain */
        __m256 s0 = _mm256_fmadd_ps(a0, _mm256_loadu_ps(b0 + j), _mm256_loadu_ps(o + j));
        __m256 s1 = _mm256_mul_ps(a4, _mm256_loadu_ps(b4 + j));
        s0 = _mm256_fmadd_ps(a1, _mm256_loadu_ps(b1 + j), s0);
        s1 = _mm256_fmadd_ps(a5, _mm256_loadu_ps(b5 + j), s1);
        s0 = _mm256_fmadd_ps(a2, _mm256_loadu_ps(b2 + j), s0);
        s1 = _mm256_fmadd_ps(a6, _mm256_loadu_ps(b6 + j), s1);
        s0 = _mm256_fmadd_ps(a3, _mm256_loadu_ps(b3 + j), s0);
        s1 = _mm256_fmadd_ps(a7, _mm256_loadu_ps(b7 + j), s1);
        _mm256_storeu_ps(o + j, _mm256_add_ps(s0, s1));
    }
    for (; j < w; j++)
        o[j] += ar[0] * b0[j] + ar[1] * b1[j] + ar[2] * b2[j] + ar[3] * b3[j] +
                ar[4] * b4[j] + ar[5] * b5[j] + ar[6] * b6[j] + ar[7] * b7[j];
}

/* o[0:w] += ar[0] * b[0:w]: the K % 8 leftover rows. */
static void update1(float *restrict o, const float *restrict ar, const float *restrict b,
                    int64_t w) {
    const __m256 a0 = _mm256_broadcast_ss(ar);
    int64_t j = 0;
    for (; j + 8 <= w; j += 8)
        _mm256_storeu_ps(o + j, _mm256_fmadd_ps(a0, _mm256_loadu_ps(b + j),
                                                _mm256_loadu_ps(o + j)));
    for (; j < w; j++) o[j] += ar[0] * b[j];
}

/* out[:, c0:c1] = a @ b[:, c0:c1] for M <= SKINNY_M rows. */
static void skinny_columns(float *out, const float *a, const float *b, int64_t M, int64_t N,
                           int64_t K, int64_t c0, int64_t c1) {
    const int64_t w = c1 - c0;
    for (int64_t m = 0; m < M; m++) memset(out + m * N + c0, 0, (size_t)w * sizeof(float));
    int64_t k = 0;
    for (; k + 8 <= K; k += 8)
        for (int64_t m = 0; m < M; m++)
            update8(out + m * N + c0, a + m * K + k, b + k * N + c0, N, w);
    for (; k < K; k++)
        for (int64_t m = 0; m < M; m++)
            update1(out + m * N + c0, a + m * K + k, b + k * N + c0, w);
}

static void gemm_skinny(float *out, const float *a, const float *b, int64_t M, int64_t N,
                        int64_t K) {
    /* Column chunks: at least one per thread, and narrow enough that the M x w slice of
     * out (the accumulator) stays within ~128 KiB of L2. Chunk edges are multiples of 16
     * floats so every thread streams whole cache lines of b. */
    const int64_t threads = omp_get_max_threads();
    const int64_t max_w = (32768 / M) & ~(int64_t)15;
    int64_t chunks = threads;
    while (ceil_div(N, chunks) > max_w) chunks += threads;
    const int64_t w = (ceil_div(N, chunks) + 15) & ~(int64_t)15;
    chunks = ceil_div(N, w);
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (int64_t c = 0; c < chunks; c++)
        skinny_columns(out, a, b, M, N, K, c * w, min64(N, (c + 1) * w));
}

/* out[M,N] = a[M,K] @ b[K,N] (row-major, contiguous; out need not be initialised). */
static void strata_sgemm(float *out, const float *a, const float *b, int64_t M, int64_t N,
                         int64_t K) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        memset(out, 0, (size_t)(M * N) * sizeof(float));
        return;
    }
    if (M <= SKINNY_M) {
        gemm_skinny(out, a, b, M, N, K);
        return;
    }
    if (!gemm_packed(out, a, b, M, N, K)) {
        /* out of memory for scratch: slower, allocation-free fallback */
        for (int64_t m0 = 0; m0 < M; m0 += SKINNY_M)
            gemm_skinny(out + m0 * N, a + m0 * K, b, min64(SKINNY_M, M - m0), N, K);
    }
}

#endif
