// Program model_ops: the element-wise pieces of the transformer's forward pass on the GPU
// (embedding gather, RMSNorm, RoPE, SiLU gate, residual add, f32 -> bf16 for the GEMM inputs).
// Activations are f32 rows, row-major. Every kernel is one simple loop: correctness over speed
// (the GEMMs and attention dominate). The host checks every index before a launch.

// x[i, :] = embed[tokens[i], :]. Grid: n rows; any block size.
extern "C" __global__ void embed_rows(float* __restrict__ x, const float* __restrict__ embed,
                                      const int* __restrict__ tokens, int d) {
  const i64 row = blockIdx.x;
  const i64 t = tokens[row];
  for (int e = threadIdx.x; e < d; e += blockDim.x) x[row * d + e] = embed[t * d + e];
}

// Block-wide sum of one float per thread; blockDim.x is a multiple of 32, at most 1024.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float warp_sums[32];
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  float total = 0.f;
  for (int w = 0; w < warps; ++w) total += warp_sums[w];
  __syncthreads();
  return total;
}

// out[i, :] = x[src_row, :] / rms(x[src_row, :]) * gain, src_row = rows ? rows[i] : i.
// Grid: output rows; blockDim.x a multiple of 32.
__device__ __forceinline__ void rms_norm_impl(float* __restrict__ out, const float* __restrict__ x,
                                              const float* __restrict__ gain, i64 src, int d,
                                              float eps) {
  const i64 dst = blockIdx.x;
  float ss = 0.f;
  for (int e = threadIdx.x; e < d; e += blockDim.x) {
    const float v = x[src * d + e];
    ss = fmaf(v, v, ss);
  }
  const float total = block_sum(ss);
  const float r = rsqrtf(total / (float)d + eps);
  for (int e = threadIdx.x; e < d; e += blockDim.x) out[dst * d + e] = x[src * d + e] * r * gain[e];
}

extern "C" __global__ void rms_norm(float* __restrict__ out, const float* __restrict__ x,
                                    const float* __restrict__ gain, int d, float eps) {
  rms_norm_impl(out, x, gain, blockIdx.x, d, eps);
}

// The final norm of only the rows whose logits are wanted: out row i is x row rows[i].
extern "C" __global__ void rms_norm_gather(float* __restrict__ out, const float* __restrict__ x,
                                           const float* __restrict__ gain,
                                           const int* __restrict__ rows, int d, float eps) {
  rms_norm_impl(out, x, gain, rows[blockIdx.x], d, eps);
}

// RoPE in place, NeoX pairing (element i with i + head_dim/2), as the CPU model. cos/sin are
// [n, head_dim/2], formed in f64 on the host. x is [n, heads * head_dim]. Grid: n rows.
extern "C" __global__ void rope(float* __restrict__ x, const float* __restrict__ cos_t,
                                const float* __restrict__ sin_t, int heads, int head_dim) {
  const i64 row = blockIdx.x;
  const int half = head_dim / 2;
  for (int j = threadIdx.x; j < heads * half; j += blockDim.x) {
    const int h = j / half, i = j % half;
    float* p = x + row * heads * head_dim + (i64)h * head_dim;
    const float c = cos_t[row * half + i], s = sin_t[row * half + i];
    const float x0 = p[i], x1 = p[i + half];
    p[i] = x0 * c - x1 * s;
    p[i + half] = x0 * s + x1 * c;
  }
}

// gate = silu(gate) * up over n elements.
extern "C" __global__ void silu_mul(float* __restrict__ gate, const float* __restrict__ up, i64 n) {
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    const float g = gate[i];
    gate[i] = g / (1.f + expf(-g)) * up[i];
  }
}

// x += y over n elements (the residual connections).
extern "C" __global__ void add_in_place(float* __restrict__ x, const float* __restrict__ y, i64 n) {
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
    x[i] += y[i];
}

// out = bf16(x) over n elements (GEMM inputs when the weights are bf16).
extern "C" __global__ void to_bf16(unsigned short* __restrict__ out, const float* __restrict__ x,
                                   i64 n) {
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
    out[i] = f32_to_bf16(x[i]);
}

// out[r] = the greedy token of logits row r: the largest logit, ties to the lower id, NaN ranked
// as -inf (the CPU model's rank_token(.., 0)). Grid: rows; blockDim.x = ARGMAX_THREADS.
#define ARGMAX_THREADS 256
extern "C" __global__ void argmax_rows(int* __restrict__ out, const float* __restrict__ logits,
                                       int vocab) {
  __shared__ float best_v[ARGMAX_THREADS];
  __shared__ int best_i[ARGMAX_THREADS];
  const i64 row = blockIdx.x;
  float bv = NEG_INF;
  int bi = 0x7fffffff;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    float v = logits[row * vocab + i];
    if (v != v) v = NEG_INF;
    if (v > bv || (v == bv && i < bi)) {
      bv = v;
      bi = i;
    }
  }
  best_v[threadIdx.x] = bv;
  best_i[threadIdx.x] = bi;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if ((int)threadIdx.x < s) {
      const float ov = best_v[threadIdx.x + s];
      const int oi = best_i[threadIdx.x + s];
      if (ov > best_v[threadIdx.x] || (ov == best_v[threadIdx.x] && oi < best_i[threadIdx.x])) {
        best_v[threadIdx.x] = ov;
        best_i[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[row] = best_i[0];
}
