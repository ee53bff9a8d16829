// strata-kernel: op=matvec_q8_0 dialect=cuda entry=strata_matvec_q8_0 requires=cuda,sm_80+
//
// matvec_q8_0.cu -- out[b,n] = sum_k deq(w)[n,k] * x[b,k], float32 activations/output, GGUF
// q8_0 weights: w is [N, K/32 * 34] bytes; each 34-byte block = fp16 scale d (little endian)
// then 32 int8 q; value = d * q.  K % 32 == 0.  Blocks are only 2-byte aligned, so nothing is
// read through int4/float4 pointers into w.
//
// Fast kernel (w 4-byte aligned, K % 64 == 0 so every row is 4-byte aligned, x 16-byte
// aligned): one warp per R = 2 rows (x values in registers are reused for both rows).
//   Lane l handles the 8 weights k = 8*l + 256*it (quarter l%4 of block 8*it + l/4), so x is
//   read as two fully coalesced float4 per batch row.  The 2-byte scale and 8 quant bytes
//   are fetched with aligned 32-bit loads (the word holding the scale plus 2-3 words holding
//   the quants) and realigned with __funnelshift_r; blocks alternate between 4-byte and
//   2-byte alignment and the aligned loads never leave the row (proof in the kernel).
//   int8 -> float uses the exact magic-number trick (byte_perm into 0x4B0000xx, subtract
//   2^23 + 128) instead of the quarter-rate I2F.  Per-block dot in fp32, scaled by d, summed
//   per lane, then a warp-shuffle reduction.
// Generic kernel (any alignment): one warp per row, lane per 34-byte block, byte loads.
// Batch: B is processed in chunks of up to 8 columns (compile-time unrolled per chunk size).
// Launch: fast: 128 threads (4 warps, 8 rows) per block, grid ceil(N/8); generic: 128
//   threads (4 rows) per block, grid ceil(N/4); one launch per chunk of 8 batch rows.
// Known limits: K % 32 == 0 is required (cudaErrorInvalidValue otherwise); grid <= 2^31-1.

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace {

constexpr int THREADS = 128;
constexpr int WARPS = THREADS / 32;
constexpr int R = 2;  // rows per warp in the fast kernel

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// 4 int8 values packed little-endian in `wq` -> 4 exact floats.
__device__ __forceinline__ void dequant4(uint32_t wq, float *f) {
  const uint32_t u = wq ^ 0x80808080u;  // int8 q -> uint8 q + 128
  f[0] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7440)) - 8388736.0f;
  f[1] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7441)) - 8388736.0f;
  f[2] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7442)) - 8388736.0f;
  f[3] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7443)) - 8388736.0f;
}

template <int B>
__global__ void __launch_bounds__(THREADS)
q8_0_fast(float *__restrict__ out, const uint8_t *__restrict__ w, const float *__restrict__ x,
          int64_t N, int64_t K, int64_t out_ld) {
  const int lane = threadIdx.x & 31;
  const int64_t n0 = ((int64_t)blockIdx.x * WARPS + threadIdx.x / 32) * R;
  if (n0 >= N) return;  // warp-uniform
  const int64_t rowbytes = (K / 32) * 34;

  const uint8_t *rowp[R];
#pragma unroll
  for (int r = 0; r < R; ++r) rowp[r] = w + ((n0 + r < N) ? n0 + r : n0) * rowbytes;

  float acc[R][B];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int b = 0; b < B; ++b) acc[r][b] = 0.0f;

#pragma unroll 2
  for (int64_t k0 = (int64_t)lane * 8; k0 < K; k0 += 256) {
    const int64_t j = k0 >> 5;          // block index in the row
    const int qq = (int)(k0 >> 3) & 3;  // which 8-byte quarter of the 32 quants

    float xv[B][8];
#pragma unroll
    for (int b = 0; b < B; ++b) {
      const float4 *xp = reinterpret_cast<const float4 *>(x + b * K + k0);
      const float4 a0 = __ldg(xp), a1 = __ldg(xp + 1);
      xv[b][0] = a0.x; xv[b][1] = a0.y; xv[b][2] = a0.z; xv[b][3] = a0.w;
      xv[b][4] = a1.x; xv[b][5] = a1.y; xv[b][6] = a1.z; xv[b][7] = a1.w;
    }

#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint8_t *blk = rowp[r] + j * 34;
      // Row starts are 4-byte aligned (w 4-aligned, rowbytes = 34*(K/32) with K/32 even), so
      // blk is 4-aligned for even j and 2 mod 4 for odd j.
      //  s2 == 0 (even j): scale = low half of word 0; quants at byte 2+8q -> words 2q..2q+2
      //    shifted by 16.  Word 2q+2 reaches 2 bytes past the block (q = 3), into block j+1,
      //    which exists because the last block (j = K/32-1) is odd.
      //  s2 == 2 (odd j):  wp = blk - 2 lies in block j-1; scale = high half of word 0;
      //    quants at byte 4+8q -> words 2q+1, 2q+2, aligned; last byte read is blk+33.
      const uint32_t s2 = (uint32_t)(reinterpret_cast<uintptr_t>(blk) & 2u);
      const uint32_t *wp = reinterpret_cast<const uint32_t *>(blk - s2);
      const uint32_t wsc = __ldg(wp);
      uint32_t lo, hi;
      if (s2) {
        lo = __ldg(wp + 2 * qq + 1);
        hi = __ldg(wp + 2 * qq + 2);
      } else {
        const uint32_t w0 = __ldg(wp + 2 * qq), w1 = __ldg(wp + 2 * qq + 1),
                       w2 = __ldg(wp + 2 * qq + 2);
        lo = __funnelshift_r(w0, w1, 16);
        hi = __funnelshift_r(w1, w2, 16);
      }
      const unsigned short dbits = (unsigned short)(s2 ? (wsc >> 16) : (wsc & 0xffffu));
      const float d = __half2float(__ushort_as_half(dbits));
      float qf[8];
      dequant4(lo, qf);
      dequant4(hi, qf + 4);
#pragma unroll
      for (int b = 0; b < B; ++b) {
        float t = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) t = fmaf(qf[e], xv[b][e], t);
        acc[r][b] = fmaf(d, t, acc[r][b]);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int b = 0; b < B; ++b) {
      const float s = warp_sum(acc[r][b]);
      if (lane == 0 && n0 + r < N) out[b * out_ld + n0 + r] = s;
    }
}

template <int B>
__global__ void __launch_bounds__(THREADS)
q8_0_generic(float *__restrict__ out, const uint8_t *__restrict__ w,
             const float *__restrict__ x, int64_t N, int64_t K, int64_t out_ld) {
  const int lane = threadIdx.x & 31;
  const int64_t n = (int64_t)blockIdx.x * WARPS + threadIdx.x / 32;
  if (n >= N) return;
  const int64_t nb = K / 32;
  const uint8_t *row = w + n * nb * 34;
  float acc[B];
#pragma unroll
  for (int b = 0; b < B; ++b) acc[b] = 0.0f;
  for (int64_t j = lane; j < nb; j += 32) {
    const uint8_t *blk = row + j * 34;
    const unsigned short dbits = (unsigned short)(blk[0] | (blk[1] << 8));
    const float d = __half2float(__ushort_as_half(dbits));
    float t[B];
#pragma unroll
    for (int b = 0; b < B; ++b) t[b] = 0.0f;
#pragma unroll 8
    for (int e = 0; e < 32; ++e) {
      const float qf = (float)(int8_t)blk[2 + e];
#pragma unroll
      for (int b = 0; b < B; ++b) t[b] = fmaf(qf, x[b * K + j * 32 + e], t[b]);
    }
#pragma unroll
    for (int b = 0; b < B; ++b) acc[b] = fmaf(d, t[b], acc[b]);
  }
#pragma unroll
  for (int b = 0; b < B; ++b) {
    const float s = warp_sum(acc[b]);
    if (lane == 0) out[b * out_ld + n] = s;
  }
}

template <int B>
void launch(bool fast, cudaStream_t stream, float *out, const uint8_t *w, const float *x,
            int64_t N, int64_t K) {
  if (fast) {
    const int64_t rows_per_block = (int64_t)WARPS * R;
    q8_0_fast<B><<<(unsigned)((N + rows_per_block - 1) / rows_per_block), THREADS, 0, stream>>>(
        out, w, x, N, K, N);
  } else {
    q8_0_generic<B><<<(unsigned)((N + WARPS - 1) / WARPS), THREADS, 0, stream>>>(out, w, x, N,
                                                                                 K, N);
  }
}

}  // namespace

extern "C" int strata_matvec_q8_0(float *out, const uint8_t *w, const float *x, int64_t B,
                                  int64_t N, int64_t K, cudaStream_t stream) {
  if (B <= 0 || N <= 0) return 0;
  if (K <= 0 || K % 32 != 0) return (int)cudaErrorInvalidValue;
  if ((N + WARPS - 1) / WARPS > 2147483647) return (int)cudaErrorInvalidValue;
  const bool fast = (K % 64 == 0) && ((reinterpret_cast<uintptr_t>(w) & 3) == 0) &&
                    ((reinterpret_cast<uintptr_t>(x) & 15) == 0);
  for (int64_t b0 = 0; b0 < B; b0 += 8) {
    const int64_t nb = (B - b0 < 8) ? B - b0 : 8;
    float *o = out + b0 * N;
    const float *xb = x + b0 * K;  // stays 16-byte aligned: K % 64 == 0 on the fast path
    switch (nb) {
      case 1: launch<1>(fast, stream, o, w, xb, N, K); break;
      case 2: launch<2>(fast, stream, o, w, xb, N, K); break;
      case 3: launch<3>(fast, stream, o, w, xb, N, K); break;
      case 4: launch<4>(fast, stream, o, w, xb, N, K); break;
      case 5: launch<5>(fast, stream, o, w, xb, N, K); break;
      case 6: launch<6>(fast, stream, o, w, xb, N, K); break;
      case 7: launch<7>(fast, stream, o, w, xb, N, K); break;
      default: launch<8>(fast, stream, o, w, xb, N, K); break;
    }
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return (int)err;
  }
  return 0;
}
