// strata-kernel: op=matmul dialect=cuda entry=strata_matmul requires=cuda,sm_80+
//
// matmul.cu -- out[M,N] = a[M,K] @ b[K,N], all row-major float32 (fp32 FMA on CUDA cores,
// no TF32 tensor cores, so results match an fp32 reference to accumulation-order error).
//
// Blocking: block tile 64 x 64, k-step 16, 256 threads (16 x 16); each thread computes a
//   4 x 4 register block at rows ty + 16*i, cols tx + 16*j (strided, so global stores of a
//   warp are coalesced and shared-memory reads are broadcast/conflict-free).
//   Shared memory: As stored transposed [16][64+4], Bs [16][64]; 8.4 KB static.
//   Tiles are loaded with bounds checks and zero padding, so any M, N, K works (K == 0
//   writes zeros).  Single-buffered: load tile, sync, 16 rank-1 updates, sync.
// Launch: grid (ceil(N/64), ceil(M/64)), block 256, on the given stream.
// Known limits: simple SIMT kernel, expect ~30-50% of fp32 peak; ceil(M/64) <= 65535.

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int TM = 64;
constexpr int TN = 64;
constexpr int TK = 16;
constexpr int THREADS = 256;

__global__ void __launch_bounds__(THREADS)
matmul_f32_tiled(float *__restrict__ out, const float *__restrict__ a,
                 const float *__restrict__ b, int64_t M, int64_t N, int64_t K) {
  __shared__ float As[TK][TM + 4];  // transposed: As[k][m]
  __shared__ float Bs[TK][TN];

  const int tid = threadIdx.x;
  const int tx = tid % 16;
  const int ty = tid / 16;
  const int64_t m0 = (int64_t)blockIdx.y * TM;
  const int64_t n0 = (int64_t)blockIdx.x * TN;

  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

  for (int64_t k0 = 0; k0 < K; k0 += TK) {
    // A tile 64 x 16: 1024 elements, 4 per thread; consecutive threads read consecutive k.
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      int e = tid + l * THREADS;
      int r = e / TK, c = e % TK;
      int64_t gm = m0 + r, gk = k0 + c;
      As[c][r] = (gm < M && gk < K) ? a[gm * K + gk] : 0.0f;
    }
    // B tile 16 x 64: 1024 elements, 4 per thread; consecutive threads read consecutive n.
#pragma unroll
    for (int l = 0; l < 4; ++l) {
      int e = tid + l * THREADS;
      int r = e / TN, c = e % TN;
      int64_t gk = k0 + r, gn = n0 + c;
      Bs[r][c] = (gk < K && gn < N) ? b[gk * N + gn] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < TK; ++k) {
      float av[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) av[i] = As[k][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) bv[j] = Bs[k][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < 4; ++i) {
    int64_t gm = m0 + ty + 16 * i;
    if (gm >= M) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      int64_t gn = n0 + tx + 16 * j;
      if (gn < N) out[gm * N + gn] = acc[i][j];
    }
  }
}

}  // namespace

extern "C" int strata_matmul(float *out, const float *a, const float *b, int64_t M, int64_t N,
                             int64_t K, cudaStream_t stream) {
  if (M <= 0 || N <= 0) return 0;
  if ((M + TM - 1) / TM > 65535) return (int)cudaErrorInvalidValue;
  dim3 grid((unsigned)((N + TN - 1) / TN), (unsigned)((M + TM - 1) / TM));
  matmul_f32_tiled<<<grid, THREADS, 0, stream>>>(out, a, b, M, N, K);
  return (int)cudaGetLastError();
}
