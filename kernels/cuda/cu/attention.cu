// Decode and chunked-prefill attention over the KV cache, paged or contiguous.
//
// One thread block per (KV head, query row, partition): all G query heads of the KV group are
// computed together, so each K/V byte of the partition is read once. A query row attends
// positions [0, row_len[row]) of sequence row_seq[row]: a decode is one row per sequence; a
// prefill chunk is one row per query token (its length ends at its own position, which is the
// causal mask). Paged and contiguous differ only in slot_of(); everything else is one code path.
//
// Long rows are split into partitions of part_tokens tokens (grid z). With one partition the
// block writes the normalized output; with several it writes an unnormalized partial, its max
// and its exp-sum, and attn_merge combines them by log-sum-exp.

#define ATTN_THREADS 128
#define ATTN_MAX_PART 512
// At least 4 blocks per SM (<= 128 registers): ptxas then keeps every variant spill-free.

template <bool PAGED>
__device__ __forceinline__ i64 slot_of(int pos, int seq, const int* __restrict__ block_tables,
                                        int max_blocks, int log2_bs,
                                        const i64* __restrict__ seq_base) {
  if (PAGED) {
    int b = block_tables[(i64)seq * max_blocks + (pos >> log2_bs)];
    return ((i64)b << log2_bs) + (pos & ((1 << log2_bs) - 1));
  } else {
    return seq_base[seq] + pos;
  }
}

template <typename T, int D, int G, bool PAGED>
__device__ __forceinline__ void attn_impl(
    float* __restrict__ out, float* __restrict__ part_out, float* __restrict__ part_max,
    float* __restrict__ part_sum, const float* __restrict__ q, const T* __restrict__ k_cache,
    const T* __restrict__ v_cache, const int* __restrict__ row_seq,
    const int* __restrict__ row_len, const int* __restrict__ block_tables, int max_blocks,
    int log2_bs, const i64* __restrict__ seq_base, int kv_heads, int part_tokens, float scale) {
  constexpr int N = Vec16<T>::N;        // elements per 16-byte load
  constexpr int L = D / N;              // lanes per token row
  constexpr int TG = ATTN_THREADS / L;  // token groups per block
  constexpr int U = G >= 8 ? 2 : 4;      // token rows each group loads per iteration
  static_assert(L <= 32 && (32 % L) == 0, "a token row must sit inside one warp");

  __shared__ float scores[G * ATTN_MAX_PART];
  __shared__ float acc_s[G * D];
  __shared__ float head_max[G];
  __shared__ float head_sum[G];

  const int kvh = blockIdx.x;
  const int row = blockIdx.y;
  const int part = blockIdx.z;
  const int nparts = gridDim.z;
  const int q_heads = kv_heads * G;
  const int tid = threadIdx.x;
  const int lane = tid % L;
  const int group = tid / L;
  const int len = row_len[row];
  const int seq = row_seq[row];
  const int start = part * part_tokens;
  const int n = min(len, start + part_tokens) - start;
  if (n <= 0 && part > 0) return;  // nothing here; attn_merge skips partitions past the row

  float qr[G][N];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const float* qp = q + ((i64)row * q_heads + kvh * G + g) * D + lane * N;
#pragma unroll
    for (int i = 0; i < N; ++i) qr[g][i] = qp[i] * scale;
  }
  for (int i = tid; i < G * D; i += ATTN_THREADS) acc_s[i] = 0.f;

  // Pass 1: scores[g][t] = q_g . k_t (scaled). U token rows per group are loaded before any
  // is reduced, so each thread keeps U 16-byte loads in flight. Every thread runs the same trip
  // count, so the shuffles always see their whole warp.
  for (int t0 = 0; t0 < n; t0 += TG * U) {
    float kf[U][N];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int t = t0 + u * TG + group;
      if (t < n) {
        const i64 slot =
            slot_of<PAGED>(start + t, seq, block_tables, max_blocks, log2_bs, seq_base);
        Vec16<T>::load(k_cache + (slot * kv_heads + kvh) * D + lane * N, kf[u]);
      } else {
#pragma unroll
        for (int i = 0; i < N; ++i) kf[u][i] = 0.f;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int t = t0 + u * TG + group;
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < N; ++i) s = fmaf(qr[g][i], kf[u][i], s);
#pragma unroll
        for (int off = L / 2; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
        if (lane == 0 && t < n) scores[g * ATTN_MAX_PART + t] = s;
      }
    }
  }
  __syncthreads();

  // Softmax numerators per head, one warp per head.
  const int warp = tid / 32, wl = tid % 32;
  for (int g = warp; g < G; g += ATTN_THREADS / 32) {
    float m = NEG_INF;
    for (int t = wl; t < n; t += 32) m = fmaxf(m, scores[g * ATTN_MAX_PART + t]);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    float s = 0.f;
    for (int t = wl; t < n; t += 32) {
      float e = expf(scores[g * ATTN_MAX_PART + t] - m);
      scores[g * ATTN_MAX_PART + t] = e;
      s += e;
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (wl == 0) {
      head_max[g] = m;
      head_sum[g] = s;
    }
  }
  __syncthreads();

  // Pass 2: acc[g] = sum_t p_g[t] v_t.
  float acc[G][N];
#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int i = 0; i < N; ++i) acc[g][i] = 0.f;
  for (int t0 = 0; t0 < n; t0 += TG * U) {
    float vf[U][N];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int t = t0 + u * TG + group;
      if (t < n) {
        const i64 slot =
            slot_of<PAGED>(start + t, seq, block_tables, max_blocks, log2_bs, seq_base);
        Vec16<T>::load(v_cache + (slot * kv_heads + kvh) * D + lane * N, vf[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int t = t0 + u * TG + group;
      if (t < n) {
#pragma unroll
        for (int g = 0; g < G; ++g) {
          const float p = scores[g * ATTN_MAX_PART + t];
#pragma unroll
          for (int i = 0; i < N; ++i) acc[g][i] = fmaf(p, vf[u][i], acc[g][i]);
        }
      }
    }
  }
  // Token groups add their partial sums in a fixed order (not with atomics, whose order
  // varies): the output is bit-identical run to run, so the paged and contiguous runs of a
  // scenario, which batch differently, emit identical greedy tokens.
  for (int tg = 0; tg < TG; ++tg) {
    if (group == tg) {
#pragma unroll
      for (int g = 0; g < G; ++g)
#pragma unroll
        for (int i = 0; i < N; ++i) acc_s[g * D + lane * N + i] += acc[g][i];
    }
    __syncthreads();
  }

  for (int i = tid; i < G * D; i += ATTN_THREADS) {
    const int g = i / D, d = i % D;
    const i64 qh = (i64)row * q_heads + kvh * G + g;
    if (nparts == 1) {
      const float s = head_sum[g];
      out[qh * D + d] = s > 0.f ? acc_s[i] / s : 0.f;
    } else {
      part_out[(qh * nparts + part) * D + d] = acc_s[i];
      if (d == 0) {
        part_max[qh * nparts + part] = head_max[g];
        part_sum[qh * nparts + part] = head_sum[g];
      }
    }
  }
}

#define ATTN_ARGS(T)                                                                       \
  float *__restrict__ out, float *__restrict__ part_out, float *__restrict__ part_max,     \
      float *__restrict__ part_sum, const float *__restrict__ q,                           \
      const T *__restrict__ k_cache, const T *__restrict__ v_cache,                        \
      const int *__restrict__ row_seq, const int *__restrict__ row_len,                    \
      const int *__restrict__ block_tables, int max_blocks, int log2_bs,                   \
      const i64 *__restrict__ seq_base, int kv_heads, int part_tokens, float scale
#define ATTN_PASS                                                                          \
  out, part_out, part_max, part_sum, q, k_cache, v_cache, row_seq, row_len, block_tables, \
      max_blocks, log2_bs, seq_base, kv_heads, part_tokens, scale

// Kernel names: attn_{paged,contig}_{f32,bf16}_d{D}_g{G} (G = query heads per KV head).
#define ATTN_VARIANT(T, TN, D, G)                                                          \
  extern "C" __global__ void __launch_bounds__(ATTN_THREADS, 4)                               \
      attn_paged_##TN##_d##D##_g##G(ATTN_ARGS(T)) {                                        \
    attn_impl<T, D, G, true>(ATTN_PASS);                                                   \
  }                                                                                        \
  extern "C" __global__ void __launch_bounds__(ATTN_THREADS, 4)                               \
      attn_contig_##TN##_d##D##_g##G(ATTN_ARGS(T)) {                                       \
    attn_impl<T, D, G, false>(ATTN_PASS);                                                  \
  }

#define ATTN_VARIANTS_D(T, TN, D) \
  ATTN_VARIANT(T, TN, D, 1)       \
  ATTN_VARIANT(T, TN, D, 2)       \
  ATTN_VARIANT(T, TN, D, 4)       \
  ATTN_VARIANT(T, TN, D, 8)

#define ATTN_VARIANTS(T, TN)  \
  ATTN_VARIANTS_D(T, TN, 32)  \
  ATTN_VARIANTS_D(T, TN, 64)  \
  ATTN_VARIANTS_D(T, TN, 128)
