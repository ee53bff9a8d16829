// strata-kernel: op=silu_mul dialect=cuda entry=strata_silu_mul requires=cuda,sm_80+
//
// silu_mul.cu -- out[i] = silu(a[i]) * b[i] = a[i] / (1 + exp(-a[i])) * b[i], float32,
// over n = rows * cols contiguous elements (the ABI passes the flat element count).
//
// Grid-stride loop.  Vector path when a, b, out are all 16-byte aligned: float4 loads and
// stores over n/4 groups, then the last n % 4 elements scalar.  Misaligned pointers: scalar
// grid-stride loop over everything.  expf (full precision) -- the kernel is memory bound.
// Launch: 256 threads, grid = min(ceil(work/256), 8 * number of SMs) blocks.
// Known limits: none beyond n < 2^63.

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

__device__ __forceinline__ float silu_mul1(float a, float b) {
  return a / (1.0f + expf(-a)) * b;
}

__global__ void silu_mul_vec(float *__restrict__ out, const float *__restrict__ a,
                             const float *__restrict__ b, int64_t n) {
  const int64_t n4 = n >> 2;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  const int64_t t0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const float4 *a4 = reinterpret_cast<const float4 *>(a);
  const float4 *b4 = reinterpret_cast<const float4 *>(b);
  float4 *o4 = reinterpret_cast<float4 *>(out);
  for (int64_t i = t0; i < n4; i += stride) {
    float4 x = a4[i], y = b4[i];
    o4[i] = make_float4(silu_mul1(x.x, y.x), silu_mul1(x.y, y.y), silu_mul1(x.z, y.z),
                        silu_mul1(x.w, y.w));
  }
  // scalar tail: at most 3 elements
  for (int64_t i = (n4 << 2) + t0; i < n; i += stride) out[i] = silu_mul1(a[i], b[i]);
}

__global__ void silu_mul_scalar(float *__restrict__ out, const float *__restrict__ a,
                                const float *__restrict__ b, int64_t n) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = silu_mul1(a[i], b[i]);
}

}  // namespace

extern "C" int strata_silu_mul(float *out, const float *a, const float *b, int64_t n,
                               cudaStream_t stream) {
  if (n <= 0) return 0;
  const bool vec = ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) |
                     reinterpret_cast<uintptr_t>(out)) & 15) == 0;
  int dev = 0, sms = 132;
  if (cudaGetDevice(&dev) == cudaSuccess)
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  const int threads = 256;
  const int64_t work = vec ? (n / 4 > 0 ? n / 4 : 1) : n;
  int64_t blocks = (work + threads - 1) / threads;
  const int64_t cap = (int64_t)sms * 8;
  if (blocks > cap) blocks = cap;
  if (vec)
    silu_mul_vec<<<(unsigned)blocks, threads, 0, stream>>>(out, a, b, n);
  else
    silu_mul_scalar<<<(unsigned)blocks, threads, 0, stream>>>(out, a, b, n);
  return (int)cudaGetLastError();
}
