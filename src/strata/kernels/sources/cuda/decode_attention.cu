// strata-kernel: op=decode_attention dialect=cuda entry=strata_decode_attention requires=cuda,sm_80+
//
// decode_attention.cu -- one query per head over a KV cache, float32, no mask:
//   out[h,:] = softmax_s(scale * q[h,:] . k[g,s,:]) @ v[g,:,:],  g = h / (H / Hkv)  (GQA).
//
// Flash-decoding (split-K over S), two kernels on the given stream:
//   1. decode_attn_partial, grid (splits, H), 128 threads = 4 warps.  Block (sp, h) covers the
//      positions [sp*chunk, min(S, (sp+1)*chunk)).  Each warp takes U = 4 positions at a time
//      (loads first, then dots): lane owns dims d = lane + 32*i (i < NI = ceil(D/32) <= 8),
//      q is pre-multiplied by `scale` in registers, q.k is reduced with warp shuffles, and an
//      online softmax (running max m, sum l, acc[D]) is kept per warp.  The 4 warps are merged
//      in shared memory and the block writes its partial (m, l, acc[D]) to scratch.
//   2. decode_attn_combine, grid H, 256 threads: M = max_sp m, L = sum l*e^(m-M),
//      out[d] = sum acc[d]*e^(m-M) / L.
// Split choice: splits ~= 4*SMs / H, but every chunk holds >= 64 positions; chunk =
//   ceil(S/splits), splits recomputed so no chunk is empty.
// Scratch: H*splits*(D+2) floats, cudaMallocAsync / cudaFreeAsync on the stream (stream
//   ordered, so the free is safe right after the enqueue of the combine kernel).
// Known limits: D <= 256 (returns cudaErrorInvalidValue otherwise), H % Hkv == 0; S == 0
//   writes zeros.  Each head re-reads its KV head (heads of one GQA group are scheduled next
//   to each other, so the repeats mostly hit L2).  Loads are 4-byte scalar but coalesced.

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

namespace {

constexpr int NWARPS = 4;
constexpr int THREADS = NWARPS * 32;
constexpr int U = 4;          // positions per warp per iteration
constexpr int MIN_CHUNK = 64;
constexpr int MAX_D = 256;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <int NI>
__global__ void __launch_bounds__(THREADS)
decode_attn_partial(float *__restrict__ pm, float *__restrict__ pl, float *__restrict__ pacc,
                    const float *__restrict__ q, const float *__restrict__ k,
                    const float *__restrict__ v, int64_t H, int64_t Hkv, int64_t S, int D,
                    float scale, int64_t chunk) {
  __shared__ float s_m[NWARPS], s_l[NWARPS];
  __shared__ float s_acc[NWARPS][MAX_D];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t h = blockIdx.y;
  const int64_t sp = blockIdx.x;
  const int64_t splits = gridDim.x;
  const int64_t g = h / (H / Hkv);
  const int64_t s_begin = sp * chunk;
  const int64_t s_end = (s_begin + chunk < S) ? s_begin + chunk : S;

  float qv[NI], acc[NI];
#pragma unroll
  for (int i = 0; i < NI; ++i) {
    const int d = lane + 32 * i;
    qv[i] = (d < D) ? q[h * D + d] * scale : 0.0f;
    acc[i] = 0.0f;
  }
  const float *kb = k + g * S * D;
  const float *vb = v + g * S * D;
  float m = -INFINITY, l = 0.0f;

  for (int64_t base = s_begin + (int64_t)warp * U; base < s_end; base += (int64_t)NWARPS * U) {
    float kr[U][NI], vr[U][NI];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t s = base + u;
      const bool ok = s < s_end;
#pragma unroll
      for (int i = 0; i < NI; ++i) {
        const int d = lane + 32 * i;
        const bool in = ok && d < D;
        kr[u][i] = in ? kb[s * D + d] : 0.0f;
        vr[u][i] = in ? vb[s * D + d] : 0.0f;
      }
    }
    float dot[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float t = 0.0f;
#pragma unroll
      for (int i = 0; i < NI; ++i) t = fmaf(qv[i], kr[u][i], t);
      dot[u] = t;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) dot[u] = warp_sum(dot[u]);
    float mx = m;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (base + u >= s_end) dot[u] = -INFINITY;  // position u is past the chunk
      mx = fmaxf(mx, dot[u]);
    }
    // base < s_end, so dot[0] is a real (finite) score and mx is finite.
    const float corr = expf(m - mx);  // m == -inf on the first step: 0
    float p[U], psum = 0.0f;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      p[u] = expf(dot[u] - mx);  // -inf -> 0
      psum += p[u];
    }
    l = l * corr + psum;
#pragma unroll
    for (int i = 0; i < NI; ++i) {
      float t = acc[i] * corr;
#pragma unroll
      for (int u = 0; u < U; ++u) t = fmaf(p[u], vr[u][i], t);
      acc[i] = t;
    }
    m = mx;
  }

  // Merge the warps of this block.  A warp that saw no position has m = -inf, l = 0, acc = 0;
  // warp 0 always sees position s_begin, so the block max is finite.
  if (lane == 0) {
    s_m[warp] = m;
    s_l[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < NI; ++i) {
    const int d = lane + 32 * i;
    if (d < D) s_acc[warp][d] = acc[i];
  }
  __syncthreads();
  float M = s_m[0];
#pragma unroll
  for (int w = 1; w < NWARPS; ++w) M = fmaxf(M, s_m[w]);
  float f[NWARPS];
  float L = 0.0f;
#pragma unroll
  for (int w = 0; w < NWARPS; ++w) {
    f[w] = expf(s_m[w] - M);
    L = fmaf(s_l[w], f[w], L);
  }
  const int64_t slot = h * splits + sp;
  if (threadIdx.x == 0) {
    pm[slot] = M;
    pl[slot] = L;
  }
  for (int d = threadIdx.x; d < D; d += THREADS) {
    float a = 0.0f;
#pragma unroll
    for (int w = 0; w < NWARPS; ++w) a = fmaf(s_acc[w][d], f[w], a);
    pacc[slot * D + d] = a;
  }
}

__global__ void decode_attn_combine(float *__restrict__ out, const float *__restrict__ pm,
                                    const float *__restrict__ pl,
                                    const float *__restrict__ pacc, int64_t splits, int D) {
  const int64_t h = blockIdx.x;
  const float *m = pm + h * splits;
  const float *l = pl + h * splits;
  float M = -INFINITY;
  for (int64_t s = 0; s < splits; ++s) M = fmaxf(M, m[s]);
  float L = 0.0f;
  for (int64_t s = 0; s < splits; ++s) L = fmaf(l[s], expf(m[s] - M), L);
  const float invL = 1.0f / L;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float a = 0.0f;
    for (int64_t s = 0; s < splits; ++s) a = fmaf(pacc[(h * splits + s) * D + d], expf(m[s] - M), a);
    out[h * D + d] = a * invL;
  }
}

template <int NI>
void launch_partial(dim3 grid, cudaStream_t stream, float *pm, float *pl, float *pacc,
                    const float *q, const float *k, const float *v, int64_t H, int64_t Hkv,
                    int64_t S, int D, float scale, int64_t chunk) {
  decode_attn_partial<NI><<<grid, THREADS, 0, stream>>>(pm, pl, pacc, q, k, v, H, Hkv, S, D,
                                                        scale, chunk);
}

}  // namespace

extern "C" int strata_decode_attention(float *out, const float *q, const float *k,
                                       const float *v, int64_t H, int64_t Hkv, int64_t S,
                                       int64_t D, float scale, cudaStream_t stream) {
  if (H <= 0 || D <= 0) return 0;
  if (D > MAX_D || Hkv <= 0 || H % Hkv != 0 || H > 65535) return (int)cudaErrorInvalidValue;
  if (S <= 0) {
    cudaError_t e = cudaMemsetAsync(out, 0, (size_t)(H * D) * sizeof(float), stream);
    return (int)e;
  }
  int dev = 0, sms = 132;
  if (cudaGetDevice(&dev) == cudaSuccess)
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);

  int64_t splits = (4 * (int64_t)sms + H - 1) / H;
  const int64_t max_splits = (S + MIN_CHUNK - 1) / MIN_CHUNK;
  if (splits > max_splits) splits = max_splits;
  if (splits < 1) splits = 1;
  const int64_t chunk = (S + splits - 1) / splits;
  splits = (S + chunk - 1) / chunk;  // no empty chunk

  float *scratch = nullptr;
  const size_t n_floats = (size_t)(H * splits) * (size_t)(D + 2);
  cudaError_t err = cudaMallocAsync(reinterpret_cast<void **>(&scratch),
                                    n_floats * sizeof(float), stream);
  if (err != cudaSuccess) return (int)err;
  float *pm = scratch;
  float *pl = pm + H * splits;
  float *pacc = pl + H * splits;

  const int d = (int)D;
  dim3 grid((unsigned)splits, (unsigned)H);
  switch ((d + 31) / 32) {
    case 1: launch_partial<1>(grid, stream, pm, pl, pacc, q, k, v, H, Hkv, S, d, scale, chunk); break;
    case 2: launch_partial<2>(grid, stream, pm, pl, pacc, q, k, v, H, Hkv, S, d, scale, chunk); break;
    case 3: launch_partial<3>(grid, stream, pm, pl, pacc, q, k, v, H, Hkv, S, d, scale, chunk); break;
    case 4: launch_partial<4>(grid, stream, pm, pl, pacc, q, k, v, H, Hkv, S, d, scale, chunk); break;
    case 5: launch_partial<5>(grid, stream, pm, pl, pacc, q, k, v, H, Hkv, S, d, scale, chunk); break;
    case 6: launch_partial<6>(grid, stream, pm, pl, pacc, q, k, v, H, Hkv, S, d, scale, chunk); break;
    case 7: launch_partial<7>(grid, stream, pm, pl, pacc, q, k, v, H, Hkv, S, d, scale, chunk); break;
    default: launch_partial<8>(grid, stream, pm, pl, pacc, q, k, v, H, Hkv, S, d, scale, chunk); break;
  }
  err = cudaGetLastError();
  if (err == cudaSuccess) {
    decode_attn_combine<<<(unsigned)H, 256, 0, stream>>>(out, pm, pl, pacc, splits, d);
    err = cudaGetLastError();
  }
  cudaError_t ferr = cudaFreeAsync(scratch, stream);
  if (err == cudaSuccess) err = ferr;
  return (int)err;
}
