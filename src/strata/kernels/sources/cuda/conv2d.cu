// strata-kernel: op=conv2d dialect=cuda entry=strata_conv2d requires=cuda,sm_80+
//
// conv2d.cu -- torch's NCHW conv2d with stride, zero padding and groups, + bias, float32.
//
// One thread per output element, grid-stride over N*O*Ho*Wo in memory order: consecutive
// threads take consecutive columns j of one output row, so their input reads (stride S
// apart) and output writes are coalesced, and they share every weight (a broadcast). S and
// P are read from geom on the device. Accumulation in float32, taps in (c, kh, kw) order. A
// correctness-first baseline: no shared-memory tiling yet; its speed is measured on a GPU.
// Launch: 256 threads, grid = min(ceil(outputs/256), 16 * number of SMs) blocks.

#include <cuda_runtime.h>
#include <stdint.h>

namespace {

__global__ void conv2d_kernel(float *__restrict__ out, const float *__restrict__ x,
                              const float *__restrict__ w, const float *__restrict__ b,
                              const int64_t *__restrict__ geom, int64_t N, int64_t H,
                              int64_t W, int64_t C, int64_t O, int64_t K, int64_t G,
                              int64_t Ho, int64_t Wo) {
  const int64_t S = geom[0], P = geom[1], cg = C / G, og = O / G;
  const int64_t total = N * O * Ho * Wo;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int64_t j = e % Wo, i = (e / Wo) % Ho, o = (e / (Wo * Ho)) % O;
    const int64_t n = e / (Wo * Ho * O);
    const int64_t c0 = (o / og) * cg;
    float acc = b[o];
    for (int64_t c = 0; c < cg; c++) {
      const float *plane = x + (n * C + c0 + c) * H * W;
      const float *wc = w + (o * cg + c) * K * K;
      for (int64_t kh = 0; kh < K; kh++) {
        const int64_t r = i * S - P + kh;
        if (r < 0 || r >= H) continue;
        for (int64_t kw = 0; kw < K; kw++) {
          const int64_t q = j * S - P + kw;
          if (q >= 0 && q < W) acc = fmaf(wc[kh * K + kw], plane[r * W + q], acc);
        }
      }
    }
    out[e] = acc;
  }
}

}  // namespace

extern "C" int strata_conv2d(float *out, const float *x, const float *w, const float *b,
                             const int64_t *geom, int64_t N, int64_t H, int64_t W, int64_t C,
                             int64_t O, int64_t K, int64_t G, int64_t Ho, int64_t Wo,
                             cudaStream_t stream) {
  const int64_t total = N * O * Ho * Wo;
  if (total <= 0) return 0;
  int dev = 0, sms = 132;
  if (cudaGetDevice(&dev) == cudaSuccess)
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  const int threads = 256;
  int64_t blocks = (total + threads - 1) / threads;
  if (blocks > (int64_t)sms * 16) blocks = (int64_t)sms * 16;
  conv2d_kernel<<<(unsigned)blocks, threads, 0, stream>>>(out, x, w, b, geom, N, H, W, C, O, K,
                                                          G, Ho, Wo);
  return (int)cudaGetLastError();
}
