/* strata_x8.h: strata's x8 layout of q4_K and q6_K weights (eight rows interleaved per
 * super-block; src/strata/kernels/ops/_kquant_x8.py defines it), for the portable kernels:
 * x8_block rebuilds one row's super-block in the file's layout, x8_linear runs a file-layout
 * super-block dot over it. Hashed with each user.
 *
 * N rows = N / 8 groups, each group super-block after super-block, then the N % 8 last rows
 * in the file's layout. A group super-block holds each field of the 8 rows' blocks in turn,
 * the rows interleaved `unit` bytes at a time (X8_Q4K, X8_Q6K: start, size, unit). */
#ifndef STRATA_X8_H
#define STRATA_X8_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "strata_q8k.h"

#define X8_ROWS 8

typedef struct {
    int start, size, unit;  /* bytes [start, start + size) of a file block, moved unit-wise */
} x8_field;

#define X8_Q4K_FIELDS 4
static const x8_field X8_Q4K[X8_Q4K_FIELDS] = {{0, 2, 2}, {2, 2, 2}, {4, 12, 4}, {16, 128, 4}};
/* q6_K: d, scales, then per half h and step k the 4 bytes of ql at 64h+4k and 64h+32+4k
 * and of qh at 128+32h+4k, in the order the AVX2 dot reads them */
#define X8_Q6_STEP(h, k) {64 * (h) + 4 * (k), 4, 4}, {64 * (h) + 32 + 4 * (k), 4, 4}, \
    {128 + 32 * (h) + 4 * (k), 4, 4}
#define X8_Q6_HALF(h) X8_Q6_STEP(h, 0), X8_Q6_STEP(h, 1), X8_Q6_STEP(h, 2), X8_Q6_STEP(h, 3), \
    X8_Q6_STEP(h, 4), X8_Q6_STEP(h, 5), X8_Q6_STEP(h, 6), X8_Q6_STEP(h, 7)
#define X8_Q6K_FIELDS 50
static const x8_field X8_Q6K[X8_Q6K_FIELDS] = {{208, 2, 2}, {192, 16, 1}, X8_Q6_HALF(0),
                                               X8_Q6_HALF(1)};

/* Row n's super-block s, in the file's layout, into out[block]. */
static inline void x8_block(const uint8_t *w, int64_t N, int64_t nsb, int block,
                            const x8_field *fields, int nf, int64_t n, int64_t s,
                            uint8_t *out) {
    const int64_t grouped = N / X8_ROWS * X8_ROWS;
    if (n >= grouped) {
        memcpy(out, w + (grouped * nsb + (n - grouped) * nsb + s) * block, (size_t)block);
        return;
    }
    const uint8_t *g = w + ((n / X8_ROWS) * nsb + s) * X8_ROWS * block;
    const int r = (int)(n % X8_ROWS);
    int at = 0;
    for (int i = 0; i < nf; i++) {
        const x8_field f = fields[i];
        for (int p = 0; p < f.size / f.unit; p++)
            memcpy(out + f.start + p * f.unit, g + at + (p * X8_ROWS + r) * f.unit,
                   (size_t)f.unit);
        at += X8_ROWS * f.size;
    }
}

/* out[b, n] = sum over super-blocks of superblock(row n's block, x row b's q8_K block), in
 * float32, as q8k_linear on the file's layout. */
static inline void x8_linear(float *out, const float *x, const uint8_t *w, int64_t B,
                             int64_t N, int64_t K, int block, const x8_field *fields,
                             int nf, q8k_superblock_fn superblock) {
    const int64_t nsb = K / QK_K;
    q8k_block *qx = malloc((size_t)(B * nsb + 1) * sizeof(q8k_block));
    if (!qx) return;  /* out stays NaN: fails loudly */
    q8k_quantize_rows(x, qx, B, K);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        uint8_t blk[256];
        for (int64_t b = 0; b < B; b++) {
            float sum = 0.0f;
            for (int64_t s = 0; s < nsb; s++) {
                x8_block(w, N, nsb, block, fields, nf, n, s, blk);
                sum += superblock(blk, qx + b * nsb + s);
            }
            out[b * N + n] = sum;
        }
    }
    free(qx);
}

#endif
