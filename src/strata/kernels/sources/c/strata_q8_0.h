/* strata_q8_0.h: the GGUF q8_0 linear layer with ggml's numerics (linear_q8_0 .avx2.c and
 * .avx512vnni.c), AVX2/FMA/F16C and OpenMP:
 * out[b,n] = sum over 32-blocks of f32(d_w) * f32(d_x) * sum_j q_w[j] * q_x[j].
 *
 * 1. x is quantised once per call, every 32-block as ggml's AVX2 quantize_row_q8_0 does:
 *    amax = max |x|, d_x = fp16(amax / 127) (F16C, round to nearest even), id = amax ?
 *    127 / amax : 0, q_x = round_half_even(x * id) (vroundps), packed to int8. The blocks
 *    go to an aligned scratch buffer (int8 values, and the scales as float32).
 * 2. The block dots are exact integer arithmetic, as ggml_vec_dot_q8_0_q8_0: vpmaddubsw
 *    multiplies unsigned by signed bytes, so the weight's sign is moved onto x first
 *    (|w| from vpsignb(w, w), x*sign(w) from vpsignb(x, w); |-128| = 128 read as unsigned is
 *    still right, and no pair sum exceeds 2*128*127 < 2^15), vpmaddwd against ones sums
 *    pairs into 8 int32 lanes, which are converted and FMA'd with d_w*d_x (an exact float32
 *    product of two fp16 values) into a float32 accumulator.
 * 3. Tiling (B > 1, or K > 16384): RN weight rows x RB rows of x per tile, so each weight
 *    block loaded feeds RB dots and each x block feeds RN. For B > 1 a group of RN weight
 *    rows (26 KiB at K = 8192) stays in L1 while every tile of x rows passes over it, so
 *    the weights are still read from memory once. (q8_0_run takes the group's tiles from
 *    its caller: linear_q8_0.avx512vnni.c puts two weight rows in one 512-bit register and
 *    sums with vpdpbusd, the same integers.)
 * 4. Weight rows are split over threads in contiguous chunks of groups (sequential streams
 *    for the prefetcher), handed out dynamically; every output is one thread's fixed-order
 *    sum, so results do not depend on the thread count.
 * 5. Decode (B = 1, K <= 16384; see q8_0_decode() and q8_0_row_dot()): the op streams the
 *    weights once, in short calls (20 us for 576 x 576) where fixed costs and the access
 *    pattern dominate, so no malloc or barrier (each thread quantises x onto its stack),
 *    one row at a time (one sequential stream), and scheduling chunks sized in bytes. Same
 *    sums as the B = 1 tiles of 3., bit for bit.
 */
#ifndef STRATA_Q8_0_H
#define STRATA_Q8_0_H

#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "strata_simd.h"

#define QK 32
#define BLOCK_BYTES 34
#define RN 3              /* weight rows per tile */
#define RB 4              /* rows of x per tile (B > 1) */
#define CHUNK_GROUPS 8    /* weight-row groups per scheduling chunk */
#define PREFETCH_BLOCKS 16 /* software prefetch distance along a weight row (544 bytes) */
#define PF1 192           /* B = 1: prefetch distance in blocks (6528 bytes); q8_0_decode() */
#define XSTACK_BLOCKS 512 /* B = 1 with K <= 16384: x quantised on each thread's stack */
#define CHUNK_BYTES (1 << 20) /* B = 1: weight bytes per scheduling chunk (long runs) */

/* One 32-block of x -> 32 int8 at q (32-byte aligned) and the fp16-rounded scale. */
static inline void q8_0_quantize_block(const float *x, int8_t *q, float *d) {
    __m256i i[4];
    q8_round_block(x, i, d);
    /* the packs work per 128-bit lane: dwords end up in order 0,4,1,5,2,6,3,7 */
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]),
                                         _mm256_packs_epi32(i[2], i[3]));
    _mm256_store_si256((__m256i *)q,
                       _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

/* out[b*ldo + r] = dot(weight row r, x row b) for r < nr, b < nb (compile-time constants
 * after inlining: the loops unroll and acc[][] lives in registers). */
static inline void q8_0_tile(float *out, int64_t ldo, const uint8_t *w, int64_t row_bytes,
                        const int8_t *qx, const float *dx, int64_t nblocks, const int nr,
                        const int nb) __attribute__((always_inline));

static inline void q8_0_tile(float *out, int64_t ldo, const uint8_t *w, int64_t row_bytes,
                        const int8_t *qx, const float *dx, int64_t nblocks, const int nr,
                        const int nb) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[RN][RB];
    for (int r = 0; r < nr; r++)
        for (int b = 0; b < nb; b++) acc[r][b] = _mm256_setzero_ps();
    for (int64_t blk = 0; blk < nblocks; blk++) {
        __m256i xq[RB];
        __m256 xd[RB];
        for (int b = 0; b < nb; b++) {
            xq[b] = _mm256_load_si256((const __m256i *)(qx + (b * nblocks + blk) * QK));
            xd[b] = _mm256_broadcast_ss(dx + b * nblocks + blk);
        }
        for (int r = 0; r < nr; r++) {
            const uint8_t *p = w + r * row_bytes + blk * BLOCK_BYTES;
            if (nb == 1)  /* streaming from memory (decode): ask for the rows' next lines */
                _mm_prefetch((const char *)(p + PREFETCH_BLOCKS * BLOCK_BYTES), _MM_HINT_T0);
            const __m256i wq = _mm256_loadu_si256((const __m256i *)(p + 2));
            const __m256i aw = _mm256_sign_epi8(wq, wq);
            const __m256 wd = half_at(p);
            for (int b = 0; b < nb; b++) {
                const __m256i prod = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xq[b], wq));
                const __m256 s = _mm256_cvtepi32_ps(_mm256_madd_epi16(prod, ones));
                acc[r][b] = _mm256_fmadd_ps(s, _mm256_mul_ps(wd, xd[b]), acc[r][b]);
            }
        }
    }
    for (int r = 0; r < nr; r++)
        for (int b = 0; b < nb; b++) out[b * ldo + r] = hsum256_ps(acc[r][b]);
}

/* B = 1: one weight row against x. Unlike q8_0_tile() this takes one row at a time: at decode
 * the op streams the weights from memory, and short rows (K = 576: 612 bytes, ten cache
 * lines) read side by side look to the hardware prefetcher like many streams too short to
 * train on, while row after row is one sequential stream (measured 20-25% faster at
 * K = 576 than 3 or 4 rows per tile; reducing several rows' sums together gained nothing
 * measurable). Out-of-order execution overlaps one row's tail with the next row's start,
 * so the single accumulator chain costs little. The sum is the same as
 * q8_0_tile(.., 1, 1)'s. */
static inline float q8_0_row_dot(const uint8_t *p, const int8_t *qx, const float *dx,
                            int64_t nblocks) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t blk = 0; blk < nblocks; blk++, p += BLOCK_BYTES) {
        /* rows are contiguous: PF1 blocks ahead may be in the next rows, equally needed */
        _mm_prefetch((const char *)(p + PF1 * BLOCK_BYTES), _MM_HINT_T0);
        const __m256i xq = _mm256_load_si256((const __m256i *)(qx + blk * QK));
        const __m256i wq = _mm256_loadu_si256((const __m256i *)(p + 2));
        const __m256i prod = _mm256_maddubs_epi16(_mm256_sign_epi8(wq, wq),
                                                  _mm256_sign_epi8(xq, wq));
        const __m256 s = _mm256_cvtepi32_ps(_mm256_madd_epi16(prod, ones));
        acc = _mm256_fmadd_ps(s, _mm256_mul_ps(half_at(p), _mm256_broadcast_ss(dx + blk)), acc);
    }
    return hsum256_ps(acc);
}

/* B = 1 with K <= XSTACK_BLOCKS * 32 (decode): the call is short (20 us for 576 x 576), so
 * its fixed costs matter. Each thread quantises x itself onto its own stack (K/32 blocks,
 * well under a microsecond: cheaper than a malloc and the barrier a shared copy needs,
 * and bit-identical on every thread), then takes chunks of ~CHUNK_BYTES of consecutive
 * weight rows, so each thread streams long sequential runs rather than the few-KiB pieces
 * that short rows would give with a fixed group count; chunks are still handed out
 * dynamically, so a thread that is preempted (a busy host) does not hold up the rest.
 * How far ahead and how long: one thread's stream needs many lines in flight to keep up with
 * DRAM, so the rows are prefetched PF1 blocks (6.4 KB) ahead, in chunks of up to 1 MiB.
 * Measured on the 2-core EPYC (Zen 5) over a whole decode step's matrices, every call cold
 * (llama-3.2-1b's 113 matrices, 1.31 GB; qwen3-0.6b's; gemma-3-1b's), side by side with a
 * plain C read of the same bytes at 68 GB/s: 48 blocks ahead in 64 KiB chunks streamed
 * 42-43 GB/s, 96 in 512 KiB 58-61, 192 in 1 MiB 64-67 (smollm2-135m's short rows: 35 -> 44,
 * the read 47); 288 or 384 blocks ahead no faster. */
static void q8_0_decode(float *out, const float *x, const uint8_t *w, int64_t N, int64_t K) {
    const int64_t nblocks = K / QK, row_bytes = nblocks * BLOCK_BYTES;
    int64_t chunk = CHUNK_BYTES / row_bytes;
    const int64_t balanced = N / (4 * (int64_t)omp_get_max_threads());
    if (chunk > balanced) chunk = balanced;  /* at least ~4 chunks per thread */
    if (chunk < 1) chunk = 1;
    /* Always both threads: even 192 x 576 (117 KB) measured 30% slower on one. */
#pragma omp parallel
    {
        int8_t qx[XSTACK_BLOCKS * QK] __attribute__((aligned(32)));
        float dx[XSTACK_BLOCKS];
        for (int64_t i = 0; i < nblocks; i++)
            q8_0_quantize_block(x + i * QK, qx + i * QK, dx + i);
#pragma omp for schedule(dynamic, chunk) nowait
        for (int64_t n = 0; n < N; n++)
            out[n] = q8_0_row_dot(w + n * row_bytes, qx, dx, nblocks);
    }
}

/* One group of `rows` (<= RN) weight rows at wg against the B rows of x (qx, dx: K/32
 * blocks a row) with the AVX2 tiles: RB rows of x at a time, then one by one. */
static inline void q8_0_group_avx2(float *out, int64_t N, const uint8_t *wg, int64_t rows,
                                   int64_t row_bytes, const int8_t *qx, const float *dx,
                                   int64_t B, int64_t K) {
    const int64_t nblocks = K / QK;
    int64_t b = 0;
    for (; B > 1 && b + RB <= B; b += RB) {
        const int8_t *q = qx + b * K;
        const float *d = dx + b * nblocks;
        if (rows == RN) {
            q8_0_tile(out + b * N, N, wg, row_bytes, q, d, nblocks, RN, RB);
        } else {
            for (int64_t r = 0; r < rows; r++)
                q8_0_tile(out + b * N + r, N, wg + r * row_bytes, row_bytes, q, d, nblocks,
                          1, RB);
        }
    }
    for (; b < B; b++) {
        const int8_t *q = qx + b * K;
        const float *d = dx + b * nblocks;
        if (rows == RN) {
            q8_0_tile(out + b * N, N, wg, row_bytes, q, d, nblocks, RN, 1);
        } else {
            for (int64_t r = 0; r < rows; r++)
                q8_0_tile(out + b * N + r, N, wg + r * row_bytes, row_bytes, q, d, nblocks,
                          1, 1);
        }
    }
}

typedef void (*q8_0_group_fn)(float *out, int64_t N, const uint8_t *wg, int64_t rows,
                              int64_t row_bytes, const int8_t *qx, const float *dx, int64_t B,
                              int64_t K);

/* The whole layer: q8_0_decode() at B = 1 with short rows; otherwise x quantised once into a
 * shared scratch (x_bias: every q_x byte xor 0x80, i.e. q_x + 128 as unsigned, what
 * vpdpbusd multiplies), then groups of group_rows weight rows handed out dynamically to
 * `group` (inlined: the caller passes a constant). */
static inline void q8_0_run(float *out, const float *x, const uint8_t *w, int64_t B,
                            int64_t N, int64_t K, const int group_rows, const int x_bias,
                            q8_0_group_fn group) __attribute__((always_inline));

static inline void q8_0_run(float *out, const float *x, const uint8_t *w, int64_t B,
                            int64_t N, int64_t K, const int group_rows, const int x_bias,
                            q8_0_group_fn group) {
    const int64_t nblocks = K / QK, row_bytes = nblocks * BLOCK_BYTES;
    if (B == 1 && nblocks <= XSTACK_BLOCKS) {
        q8_0_decode(out, x, w, N, K);
        return;
    }
    const int64_t groups = (N + group_rows - 1) / group_rows, total = B * nblocks;
    int8_t *qx = aligned_alloc(32, (size_t)(total + 1) * QK);
    float *dx = malloc((size_t)(total + 1) * sizeof(float));
    if (!qx || !dx) { free(qx); free(dx); return; }  /* out stays NaN: fails loudly */
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int64_t i = 0; i < total; i++) {
            q8_0_quantize_block(x + i * QK, qx + i * QK, dx + i);
            if (x_bias) {
                const __m256i v = _mm256_load_si256((const __m256i *)(qx + i * QK));
                _mm256_store_si256((__m256i *)(qx + i * QK),
                                   _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80)));
            }
        }
#pragma omp for schedule(dynamic, CHUNK_GROUPS)
        for (int64_t g = 0; g < groups; g++) {
            const int64_t n = g * group_rows;
            const int64_t rows = n + group_rows <= N ? group_rows : N - n;
            group(out + n, N, w + n * row_bytes, rows, row_bytes, qx, dx, B, K);
        }
    }
    free(qx);
    free(dx);
}

#endif /* STRATA_Q8_0_H */
