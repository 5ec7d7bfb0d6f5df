// Decode and prefill attention over the KV cache, paged or contiguous, FlashAttention-2 style.
//
// One thread block per (KV head, query tile, partition). A query tile is up to ATTN_QROWS / G
// consecutive query rows of one sequence (a prefill chunk's tokens; a decode is a tile of one
// row), taken for all G query heads of the KV group: ATTN_QROWS query-head rows per block. The
// block walks the tile's causal prefix in tiles of ATTN_KT tokens: each K/V token row is read
// from global memory once per block into shared memory, scored against every query-head row,
// and folded into running max / sum / f32 accumulators (online softmax). A query row attends
// positions [lo, row_len[row]) of sequence row_seq[row], lo = 0, or with a sliding window
// (window > 0) lo = max(0, row_len - window): the query at position p sees (p - window, p].
// Keys outside a row's range are never touched by that row; key tiles past the tile's longest
// row are never loaded (causal tiles skipped), and positions before the tile's earliest window
// start are never loaded nor even looked up in the block table (a sliding layer reads its
// window only, and blocks released before it may hold anything). Key tiles stay aligned to
// multiples of ATTN_KT from position 0 whatever the window start, so a row's key tiles do not
// depend on its tile-mates. Paged and contiguous differ only in slot_of().
//
// Each row's arithmetic depends only on its own query, its length and the partition bounds,
// never on which other rows share its tile or its launch: a row masked out of a key tile skips
// it entirely (no rescale), and every sum runs in a fixed order. So a token's output is
// bit-identical whether it was computed in a prefill tile or as a decode row, and the paged and
// contiguous runs of a scenario, which batch differently, emit identical greedy tokens.
//
// Long rows are split into partitions of part_tokens tokens (grid z, FlashDecoding). With one
// partition the block writes the normalized output; with several it writes an unnormalized
// partial, its max and its exp-sum, and attn_merge combines them by log-sum-exp. A partition
// wholly before the tile's window or past its longest row writes nothing: attn_merge reads a
// row's partitions from the one holding its window start to the one holding its last key.
//
// Tiles: with `tiled` set, tile t is rows [tile_row0[t], tile_row0[t + 1]), at most
// ATTN_QROWS / G rows of one sequence (the host checks); otherwise tile t is row t.

#define ATTN_THREADS 128
#define ATTN_MAX_PART 512  // the longest partition the host plans (launch.rs)
#define ATTN_QROWS 32      // query-head rows per block: a tile is ATTN_QROWS / G query rows
#define ATTN_KT 16         // key tokens per shared K/V tile
// At least 4 blocks per SM (<= 128 registers, 4 x 36 KiB of shared memory at head dim 128).

// The first position a row of length len attends (window 0: no window).
__device__ __forceinline__ int attn_row_lo(int len, int window) {
  return window > 0 ? max(0, len - window) : 0;
}

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

// The block's shared memory, one instance per head dim (shared by every group size and
// storage type). Rows are padded by one float so that lanes reading one column of different
// rows hit different banks.
template <int D>
struct AttnSmem {
  float q[ATTN_QROWS][D + 1];
  float k[ATTN_KT][D + 1];
  float v[ATTN_KT][D];
  float p[ATTN_QROWS][ATTN_KT];
  float m[ATTN_QROWS];
  float l[ATTN_QROWS];
  float alpha[ATTN_QROWS];
  int len[ATTN_QROWS];
  i64 slot[ATTN_KT];
};

template <int D>
__device__ __forceinline__ AttnSmem<D>& attn_smem() {
  __shared__ AttnSmem<D> s;
  return s;
}

template <typename T, int D, int G, bool PAGED>
__device__ __forceinline__ void attn_impl(
    float* __restrict__ out, float* __restrict__ part_out, float* __restrict__ part_max,
    float* __restrict__ part_sum, const float* __restrict__ q, const T* __restrict__ k_cache,
    const T* __restrict__ v_cache, const int* __restrict__ row_seq,
    const int* __restrict__ row_len, const int* __restrict__ block_tables, int max_blocks,
    int log2_bs, const i64* __restrict__ seq_base, int kv_heads, int part_tokens, float scale,
    const int* __restrict__ tile_row0, int tiled, int window) {
  constexpr int N = Vec16<T>::N;  // elements per 16-byte load
  constexpr int L = D / N;        // 16-byte loads per token row
  constexpr int TQ = ATTN_QROWS / G;
  constexpr int RSTEP = ATTN_THREADS / D;       // query-head rows between a thread's columns
  constexpr int ACC = ATTN_QROWS * D / ATTN_THREADS;  // accumulators per thread
  static_assert(D <= ATTN_THREADS && ATTN_THREADS % D == 0, "a thread owns one column");
  static_assert(TQ >= 1 && TQ * G == ATTN_QROWS, "group size divides the tile");

  AttnSmem<D>& sm = attn_smem<D>();
  const int kvh = blockIdx.x;
  const int tile = blockIdx.y;
  const int part = blockIdx.z;
  const int nparts = gridDim.z;
  const int q_heads = kv_heads * G;
  const int tid = threadIdx.x;
  const int r0 = tiled ? tile_row0[tile] : tile;
  const int nr = tiled ? min(tile_row0[tile + 1] - r0, TQ) : 1;
  const int nq = nr * G;
  const int seq = row_seq[r0];
  int max_len = 0, lo_min = 0x7fffffff;
  for (int r = 0; r < nr; ++r) {
    max_len = max(max_len, row_len[r0 + r]);
    lo_min = min(lo_min, attn_row_lo(row_len[r0 + r], window));
  }
  const int start = part * part_tokens;
  const int end = min(max_len, start + part_tokens);
  const int begin = max(start, lo_min);  // the first position any row of the tile reads here
  // Nothing here: attn_merge skips partitions before a row's window and past its length. The
  // only partition of a launch still writes its (zero) output.
  if (end <= begin && nparts > 1) return;

  for (int i = tid; i < nq * D; i += ATTN_THREADS) {
    const int qi = i / D, d = i % D;
    const int r = qi / G, g = qi % G;
    sm.q[qi][d] = q[((i64)(r0 + r) * q_heads + kvh * G + g) * D + d] * scale;
  }
  for (int qi = tid; qi < nq; qi += ATTN_THREADS) {
    sm.m[qi] = NEG_INF;
    sm.l[qi] = 0.f;
    sm.len[qi] = row_len[r0 + qi / G];
  }
  const int col = tid % D;
  const int qi0 = tid / D;
  float acc[ACC];
#pragma unroll
  for (int a = 0; a < ACC; ++a) acc[a] = 0.f;

  for (int k0 = start + (begin - start) / ATTN_KT * ATTN_KT; k0 < end; k0 += ATTN_KT) {
    const int nk = min(ATTN_KT, end - k0);
    // Keys [0, jk) of this tile lie before every row's window (the first tile only): never
    // loaded, never looked up, never read below.
    const int jk = max(0, begin - k0);
    if (tid >= jk && tid < nk)
      sm.slot[tid] = slot_of<PAGED>(k0 + tid, seq, block_tables, max_blocks, log2_bs, seq_base);
    __syncthreads();
    // The key tile: every K and V token row read once, 16 bytes per load.
    for (int i = jk * L + tid; i < nk * L; i += ATTN_THREADS) {
      const int j = i / L, c = i % L;
      const i64 at = (sm.slot[j] * kv_heads + kvh) * D + c * N;
      float kf[N], vf[N];
      Vec16<T>::load(k_cache + at, kf);
      Vec16<T>::load(v_cache + at, vf);
      KV_READ_COUNT(32);
#pragma unroll
      for (int e = 0; e < N; ++e) {
        sm.k[j][c * N + e] = kf[e];
        sm.v[j][c * N + e] = vf[e];
      }
    }
    __syncthreads();
    // Scores of the keys each row may see; the others are never read.
    for (int i = tid; i < nq * ATTN_KT; i += ATTN_THREADS) {
      const int qi = i / ATTN_KT, j = i % ATTN_KT;
      if (j >= attn_row_lo(sm.len[qi], window) - k0 && j < sm.len[qi] - k0 && j < nk) {
        float s = 0.f;
#pragma unroll 8
        for (int d = 0; d < D; ++d) s = fmaf(sm.q[qi][d], sm.k[j][d], s);
        sm.p[qi][j] = s;
      }
    }
    __syncthreads();
    // Online softmax, one thread per query-head row. A row's probabilities outside its keys
    // [jlo, cnt) (and every probability of a row the tile lacks) are 0 and its rescale 1, so
    // the P V sweep below leaves its accumulators exactly as they were for those keys.
    for (int qi = tid; qi < ATTN_QROWS; qi += ATTN_THREADS) {
      const int cnt = qi < nq ? min(nk, sm.len[qi] - k0) : 0;
      const int jlo = qi < nq ? max(0, attn_row_lo(sm.len[qi], window) - k0) : 0;
      if (cnt <= jlo) {
        sm.alpha[qi] = 1.f;
        for (int j = 0; j < ATTN_KT; ++j) sm.p[qi][j] = 0.f;
        continue;
      }
      float mx = sm.m[qi];
      for (int j = jlo; j < cnt; ++j) mx = fmaxf(mx, sm.p[qi][j]);
      float sum = 0.f;
#pragma unroll 1
      for (int j = 0; j < ATTN_KT; ++j) {
        const float e = j >= jlo && j < cnt ? expf(sm.p[qi][j] - mx) : 0.f;
        sm.p[qi][j] = e;
        sum += e;
      }
      const float alpha = expf(sm.m[qi] - mx);  // 0 on the row's first keys (max was -inf)
      sm.alpha[qi] = alpha;
      sm.l[qi] = sm.l[qi] * alpha + sum;
      sm.m[qi] = mx;
    }
    __syncthreads();
    // acc = acc * alpha + P V, each thread one column of ACC rows; keys never loaded are
    // skipped (every row's probability there is 0: adding 0 x V would change nothing).
#pragma unroll
    for (int a = 0; a < ACC; ++a) acc[a] *= sm.alpha[qi0 + a * RSTEP];
#pragma unroll 1
    for (int j = jk; j < nk; ++j) {
      const float vj = sm.v[j][col];
#pragma unroll
      for (int a = 0; a < ACC; ++a) acc[a] = fmaf(sm.p[qi0 + a * RSTEP][j], vj, acc[a]);
    }
    __syncthreads();
  }

  // The accumulators go through shared memory (sm.q, no longer read; each thread rewrites the
  // very elements it filled) so that the store loop below is one rolled loop rather than ACC
  // unrolled copies of a division and its address arithmetic (NVRTC time).
#pragma unroll
  for (int a = 0; a < ACC; ++a) sm.q[qi0 + a * RSTEP][col] = acc[a];
  __syncthreads();
#pragma unroll 1
  for (int a = 0; a < ACC; ++a) {
    const int qi = qi0 + a * RSTEP;
    if (qi >= nq) continue;
    const float acc_a = sm.q[qi][col];
    const int r = qi / G, g = qi % G;
    const i64 qh = (i64)(r0 + r) * q_heads + kvh * G + g;
    if (nparts == 1) {
      const float s = sm.l[qi];
      out[qh * D + col] = s > 0.f ? acc_a / s : 0.f;
    } else {
      part_out[(qh * nparts + part) * D + col] = acc_a;
      if (col == 0) {
        part_max[qh * nparts + part] = sm.m[qi];
        part_sum[qh * nparts + part] = sm.l[qi];
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
      const i64 *__restrict__ seq_base, int kv_heads, int part_tokens, float scale,        \
      const int *__restrict__ tile_row0, int tiled, int window
#define ATTN_PASS                                                                          \
  out, part_out, part_max, part_sum, q, k_cache, v_cache, row_seq, row_len, block_tables, \
      max_blocks, log2_bs, seq_base, kv_heads, part_tokens, scale, tile_row0, tiled, window

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
