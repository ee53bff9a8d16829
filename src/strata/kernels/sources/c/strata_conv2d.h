/* strata_conv2d.h: the lab's direct conv2d engine in NHWC with AVX-512 ("implicit GEMM":
 * the im2col matrix is never formed): `conv2d_nhwc_run`, and `conv2d_nhwc_act` with a fused
 * ReLU. conv2d_nhwc.avx512.c is its entry point; conv2d.avx512.c (NCHW) transposes into it
 * and back; conv2d_nhwc_relu.avx512.c fuses the activation.
 *
 * Per group, out[pixels, og] = patches[pixels, K*K*cg] @ w[og, K*K*cg]^T, w in OHWI. The
 * weights of each block of 64 output channels are packed once per call as [K*K*cg][64]
 * (zeros past og), so one depth step is four zmm loads. A 6 x 64 register tile (24
 * accumulators) takes 6 consecutive output pixels (they may span rows and images); for every
 * tap (kh, kw) each pixel's row pointer is x[n, i*S-P+kh, j*S-P+kw, group] or, outside the
 * image, a row of zeros - so padding, stride and ragged tails cost no branch in the depth
 * loop, which is 4 loads + 6 broadcasts + 24 FMAs per input channel.
 *
 * Work items are (64-channel block, run of tiles) pairs over OpenMP; a block's packed
 * weights stay in L2 while its tiles sweep the pixels. Depthwise (cg = og = 1) takes its own
 * path: 16 channels per vector, the K*K taps transposed once to [K*K][C], eight interior
 * pixels of a row per weight load.
 *
 * Scratch is allocated and freed inside the call; there is no global state. Everything is
 * `static`: each kernel's library keeps its own copy. */
#ifndef STRATA_CONV2D_H
#define STRATA_CONV2D_H

#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MR 6    /* pixels per register tile */
#define NB 64   /* output channels per block: four zmm */
#define RUN 16  /* tiles per work item */
#define L2_CHUNK (512 * 1024)  /* packed weight bytes one pass over the tiles uses */

typedef struct {
    const float *x, *zero;
    int64_t H, W, C, S, P, Ho, Wo, K, cg;
    int64_t ldk;  /* 0: w is [O][depth] (OHWI); else w is depth-major, w[d*ldk + o] */
    int relu;     /* 1: out = max(0, conv + b), applied as the last kernel row is stored */
} geom_t;

/* acc[t] += x rows of the 6 pixels (depth floats each, from xr[t]) @ the packed weights. */
static inline void depth_loop(__m512 acc[MR][4], const float *const xr[MR], const float *wk,
                              int64_t depth) {
    for (int64_t d = 0; d < depth; d++, wk += NB) {
        const __m512 w0 = _mm512_load_ps(wk), w1 = _mm512_load_ps(wk + 16);
        const __m512 w2 = _mm512_load_ps(wk + 32), w3 = _mm512_load_ps(wk + 48);
        for (int t = 0; t < MR; t++) {
            const __m512 a = _mm512_set1_ps(xr[t][d]);
            acc[t][0] = _mm512_fmadd_ps(a, w0, acc[t][0]);
            acc[t][1] = _mm512_fmadd_ps(a, w1, acc[t][1]);
            acc[t][2] = _mm512_fmadd_ps(a, w2, acc[t][2]);
            acc[t][3] = _mm512_fmadd_ps(a, w3, acc[t][3]);
        }
    }
}

/* One 6 x 64 tile: pixels p0.. (valid: np of them), output channels o0..o0+width of the
 * group whose input channels start at c0. With G = 1 the K taps of one kernel row are
 * K*C consecutive floats of x (NHWC) and of the packed weights: when every pixel's window
 * lies inside the image's width, a kernel row is one depth loop of K*C (the stem and patch
 * embeddings, C = 3, would otherwise loop 3 deep per tap). */
static void tile(const geom_t *g, const float *wp, const float *bias, float *out, int64_t O,
                 int64_t p0, int64_t np, int64_t c0, int64_t o0, int64_t width,
                 int64_t kh0, int64_t kh1) {
    __m512 acc[MR][4];
    for (int v = 0; v < 4; v++) {
        const __mmask16 m = width - 16 * v >= 16 ? 0xFFFF
            : width > 16 * v ? (__mmask16)((1u << (width - 16 * v)) - 1) : 0;
        const __m512 bv = _mm512_maskz_loadu_ps(m, bias + o0 + 16 * v);
        for (int t = 0; t < MR; t++)  /* later kernel rows add to what earlier ones wrote */
            acc[t][v] = kh0 == 0 || t >= np ? bv
                : _mm512_maskz_loadu_ps(m, out + (p0 + t) * O + o0 + 16 * v);
    }
    const int64_t K = g->K, cg = g->cg, hw = g->Ho * g->Wo;
    int64_t base[MR], r0[MR], q0[MR];
    int inside_w = 1;
    for (int t = 0; t < MR; t++) {
        const int64_t p = p0 + (t < np ? t : 0), n = p / hw, i = (p % hw) / g->Wo;
        const int64_t j = p % g->Wo;
        r0[t] = i * g->S - g->P;
        q0[t] = j * g->S - g->P;
        base[t] = n * g->H;
        inside_w &= q0[t] >= 0 && q0[t] + K <= g->W;
    }
    const int span = inside_w && cg == g->C;
    for (int64_t kh = kh0; kh < kh1; kh++) {
        const float *xr[MR];
        if (span) {
            for (int t = 0; t < MR; t++) {
                const int64_t r = r0[t] + kh;
                xr[t] = t < np && r >= 0 && r < g->H
                    ? g->x + ((base[t] + r) * g->W + q0[t]) * g->C : g->zero;
            }
            depth_loop(acc, xr, wp + kh * K * cg * NB, K * cg);
            continue;
        }
        for (int64_t kw = 0; kw < K; kw++) {
            for (int t = 0; t < MR; t++) {
                const int64_t r = r0[t] + kh, q = q0[t] + kw;
                xr[t] = t < np && r >= 0 && r < g->H && q >= 0 && q < g->W
                    ? g->x + ((base[t] + r) * g->W + q) * g->C + c0 : g->zero;
            }
            depth_loop(acc, xr, wp + (kh * K + kw) * cg * NB, cg);
        }
    }
    const int act = g->relu && kh1 == K;  /* earlier kernel-row chunks store partial sums */
    for (int64_t t = 0; t < np; t++) {
        float *o = out + (p0 + t) * O + o0;
        for (int v = 0; v < 4; v++) {
            const int64_t left = width - 16 * v;
            if (act) acc[t][v] = _mm512_max_ps(acc[t][v], _mm512_setzero_ps());
            if (left >= 16) _mm512_storeu_ps(o + 16 * v, acc[t][v]);
            else if (left > 0)
                _mm512_mask_storeu_ps(o + 16 * v, (__mmask16)((1u << left) - 1), acc[t][v]);
        }
    }
}

/* dst[(kh*K + kw)*cg + c][64] = w[o0 + blk*64 + v, kh, kw, c] for block blk of a group's
 * og output channels, zero past og. */
static void pack_block(float *dst, const float *w, int64_t o0, int64_t og, int64_t depth,
                       int64_t blk, int64_t ldk) {
    if (ldk) {  /* depth-major: each depth's 64 channels are already one contiguous run */
        const int64_t live = og - blk * NB < NB ? og - blk * NB : NB;
        for (int64_t d = 0; d < depth; d++, dst += NB) {
            memcpy(dst, w + d * ldk + o0 + blk * NB, (size_t)live * sizeof(float));
            memset(dst + live, 0, (size_t)(NB - live) * sizeof(float));
        }
        return;
    }
    /* depth outer, channels inner: the 64 source rows advance together, each cache line of
     * them read once while it sits in L1, and the destination is written in order */
    const int64_t live = og - blk * NB < NB ? og - blk * NB : NB;
    const float *src0 = w + (o0 + blk * NB) * depth;
    /* 16 depths at a time: one cache line of each source row, written into a 4 KiB run of
     * the destination (a block is up to MiBs; row-by-row copies miss the TLB) */
    int64_t d0 = 0;
    for (; d0 + 16 <= depth && live == NB; d0 += 16, dst += 16 * NB)
        for (int64_t v = 0; v < NB; v++) {
            float line[16];
            _mm512_storeu_ps(line, _mm512_loadu_ps(src0 + v * depth + d0));
            for (int k = 0; k < 16; k++) dst[k * NB + v] = line[k];
        }
    for (int64_t d = d0; d < depth; d++, dst += NB) {
        int64_t v = 0;
        for (; v < live; v++) dst[v] = src0[v * depth + d];
        for (; v < NB; v++) dst[v] = 0.0f;
    }
}

/* Work items are (64-channel block, run of tiles), handed out in order, so a thread's items
 * share a block: each thread packs the block it works on into its own buffer (a 3x3 512-
 * channel layer's 9 MiB of weights are never packed at once; scratch is threads x one
 * block). */
static int grouped(float *out, const float *x, const float *w, const float *b,
                   geom_t *g, int64_t N, int64_t O, int64_t G) {
    const int64_t og = O / G, depth = g->K * g->K * g->cg, blocks = (og + NB - 1) / NB;
    const int64_t pixels = N * g->Ho * g->Wo, tiles = (pixels + MR - 1) / MR;
    const int64_t runs = (tiles + RUN - 1) / RUN, threads = omp_get_max_threads();
    const int64_t row_bytes = g->K * g->cg * NB * (int64_t)sizeof(float);
    const int64_t rows = row_bytes * g->K <= L2_CHUNK ? g->K
        : L2_CHUNK / row_bytes > 1 ? L2_CHUNK / row_bytes : 1;
    float *wp = aligned_alloc(64, (size_t)(threads * depth * NB) * sizeof(float));
    const size_t zn = (size_t)((g->K * g->C + 15) / 16 * 16);
    float *zero = aligned_alloc(64, zn * sizeof(float));
    if (!wp || !zero) { free(wp); free(zero); return 0; }
    memset(zero, 0, zn * sizeof(float));
    g->zero = zero;
    for (int64_t gi = 0; gi < G; gi++) {
        const int64_t items = blocks * runs;
#pragma omp parallel num_threads((int)threads) if (items > 1 && pixels * og * depth > 65536)
        {
            float *mine = wp + (int64_t)omp_get_thread_num() * depth * NB;
            int64_t held = -1;
#pragma omp for schedule(static)
            for (int64_t it = 0; it < items; it++) {
                const int64_t blk = it / runs, run = it % runs;
                const int64_t width = og - blk * NB < NB ? og - blk * NB : NB;
                const int64_t t1 = (run + 1) * RUN < tiles ? (run + 1) * RUN : tiles;
                if (blk != held) {
                    pack_block(mine, w, gi * og, og, depth, blk, g->ldk);
                    held = blk;
                }
                /* kernel rows in chunks whose packed weights fit in L2 (1.2 MiB per block
                 * at 3x3x512 would stream from L3 once per tile) */
                for (int64_t kh0 = 0; kh0 < g->K; kh0 += rows)
                    for (int64_t t = run * RUN; t < t1; t++) {
                        const int64_t p0 = t * MR, np = pixels - p0 < MR ? pixels - p0 : MR;
                        const int64_t kh1 = kh0 + rows < g->K ? kh0 + rows : g->K;
                        tile(g, mine, b + gi * og, out + gi * og, O, p0, np, gi * g->cg,
                             blk * NB, width, kh0, kh1);
                    }
            }
        }
    }
    (void)x;
    free(wp);
    free(zero);
    return 1;
}

/* One depthwise output pixel, 16 channels from c: taps outside the image skipped. */
static inline void dw_pixel(float *o, const float *x, const float *wt, const float *b,
                            const geom_t *g, int64_t n, int64_t i, int64_t j, int64_t c,
                            __mmask16 m) {
    const int64_t C = g->C, K = g->K;
    __m512 acc = _mm512_maskz_loadu_ps(m, b + c);
    for (int64_t kh = 0; kh < K; kh++) {
        const int64_t r = i * g->S - g->P + kh;
        if (r < 0 || r >= g->H) continue;
        for (int64_t kw = 0; kw < K; kw++) {
            const int64_t q = j * g->S - g->P + kw;
            if (q < 0 || q >= g->W) continue;
            acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, wt + (kh * K + kw) * C + c),
                                  _mm512_maskz_loadu_ps(m, x + ((n * g->H + r) * g->W + q) * C
                                                        + c), acc);
        }
    }
    if (g->relu) acc = _mm512_max_ps(acc, _mm512_setzero_ps());
    _mm512_mask_storeu_ps(o + c, m, acc);
}

/* DW_J pixels of one output row whose windows lie inside the image's width: each tap's
 * weights are loaded once for all of them (one load per FMA instead of two). */
#define DW_J 8
static inline void dw_run(float *o, const float *x, const float *wt, const float *b,
                          const geom_t *g, int64_t n, int64_t i, int64_t j0, int64_t c,
                          __mmask16 m) {
    const int64_t C = g->C, K = g->K, S = g->S;
    __m512 acc[DW_J];
    const __m512 bias = _mm512_maskz_loadu_ps(m, b + c);
    for (int t = 0; t < DW_J; t++) acc[t] = bias;
    for (int64_t kh = 0; kh < K; kh++) {
        const int64_t r = i * S - g->P + kh;
        if (r < 0 || r >= g->H) continue;
        const float *xr = x + ((n * g->H + r) * g->W + j0 * S - g->P) * C + c;
        for (int64_t kw = 0; kw < K; kw++) {
            const __m512 wv = _mm512_maskz_loadu_ps(m, wt + (kh * K + kw) * C + c);
            const float *xk = xr + kw * C;
            for (int t = 0; t < DW_J; t++)
                acc[t] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, xk + t * S * C), acc[t]);
        }
    }
    for (int t = 0; t < DW_J; t++)
        _mm512_mask_storeu_ps(o + t * C + c, m, g->relu ? _mm512_max_ps(acc[t],
                                                                       _mm512_setzero_ps())
                                                        : acc[t]);
}

/* Depthwise, one filter per channel: 16 channels per vector; taps as wt[kh*K + kw][C]. */
static int depthwise(float *out, const float *x, const float *w, const float *b,
                     const geom_t *g, int64_t N) {
    const int64_t C = g->C, K = g->K, KK = K * K, S = g->S, P = g->P;
    float *wt = malloc((size_t)(KK * C) * sizeof(float));
    if (!wt) return 0;
    for (int64_t c = 0; c < C; c++)
        for (int64_t k = 0; k < KK; k++) wt[k * C + c] = w[c * KK + k];
    /* output columns [j_lo, j_hi) read no padding on the left or right */
    int64_t j_lo = (P + S - 1) / S, j_hi = (g->W - K + P) / S + 1;
    if (j_hi > g->Wo) j_hi = g->Wo;
    if (j_lo > j_hi) j_lo = j_hi;
    const int64_t rows = N * g->Ho;
#pragma omp parallel for schedule(static) if (rows * g->Wo * C * KK > 65536)
    for (int64_t row = 0; row < rows; row++) {
        const int64_t n = row / g->Ho, i = row % g->Ho;
        float *orow = out + row * g->Wo * C;
        for (int64_t c = 0; c < C; c += 16) {
            const __mmask16 m = C - c >= 16 ? 0xFFFF : (__mmask16)((1u << (C - c)) - 1);
            int64_t j = 0;
            for (; j < j_lo; j++) dw_pixel(orow + j * C, x, wt, b, g, n, i, j, c, m);
            for (; j + DW_J <= j_hi; j += DW_J) dw_run(orow + j * C, x, wt, b, g, n, i, j, c, m);
            for (; j < g->Wo; j++) dw_pixel(orow + j * C, x, wt, b, g, n, i, j, c, m);
        }
    }
    free(wt);
    return 1;
}

/* out[N,Ho,Wo,O] = conv2d of x[N,H,W,C] with w[O,K,K,C/G] (OHWI), b[O], stride S, padding
 * P, groups G; with relu, max(0, .) fused into the store. */
static void conv2d_nhwc_act(float *out, const float *x, const float *w, const float *b,
                            int64_t S, int64_t P, int64_t N, int64_t H, int64_t W, int64_t C,
                            int64_t O, int64_t K, int64_t G, int64_t Ho, int64_t Wo, int relu) {
    if (N <= 0 || Ho <= 0 || Wo <= 0 || O <= 0) return;
    geom_t g = {x, NULL, H, W, C, S, P, Ho, Wo, K, C / G, 0, relu};
    if (g.cg == 1 && O == C && depthwise(out, x, w, b, &g, N)) return;
    if (grouped(out, x, w, b, &g, N, O, G)) return;
    /* out of memory for scratch: the plain loop */
    const int64_t og = O / G;
    for (int64_t p = 0; p < N * Ho * Wo; p++)
        for (int64_t o = 0; o < O; o++) {
            const int64_t c0 = (o / og) * g.cg;
            float acc = b[o];
            for (int64_t kh = 0; kh < K; kh++)
                for (int64_t kw = 0; kw < K; kw++) {
                    const int64_t n = p / (Ho * Wo), i = (p / Wo) % Ho, j = p % Wo;
                    const int64_t r = i * g.S - g.P + kh, q = j * g.S - g.P + kw;
                    if (r < 0 || r >= H || q < 0 || q >= W) continue;
                    for (int64_t c = 0; c < g.cg; c++)
                        acc += w[((o * K + kh) * K + kw) * g.cg + c] *
                               x[((n * H + r) * W + q) * C + c0 + c];
                }
            out[p * O + o] = relu && acc < 0.0f ? 0.0f : acc;
        }
}

static void conv2d_nhwc_run(float *out, const float *x, const float *w, const float *b,
                            int64_t S, int64_t P, int64_t N, int64_t H, int64_t W, int64_t C,
                            int64_t O, int64_t K, int64_t G, int64_t Ho, int64_t Wo) {
    conv2d_nhwc_act(out, x, w, b, S, P, N, H, W, C, O, K, G, Ho, Wo, 0);
}

/* out[M,N] = a[M,K] @ b[K,N], all row-major: the engine as a GEMM (a's rows are the
 * "pixels", b's K rows the packed depth, read as they lie). No bias. */
static int gemm_nn_run(float *out, const float *a, const float *b, int64_t M, int64_t N,
                       int64_t K) {
    float *zero = calloc((size_t)N, sizeof(float));
    if (!zero) return 0;
    geom_t g = {a, NULL, 1, M, K, 1, 0, 1, M, 1, K, N, 0};
    const int ok = grouped(out, a, b, zero, &g, 1, N, 1);
    free(zero);
    return ok;
}

#endif
