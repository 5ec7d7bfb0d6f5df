// Program kv_ops: KV writes by slot mapping, slot copies (copy-on-write), the log-sum-exp merge
// of attention partitions, a poison fill and the read-bandwidth ceiling.

// Writes n new tokens' K/V ([n, row] f32 each) into the slots named by slots[i]; a negative slot
// is padding. One block per token. The host checks every slot against the cache size first.
template <typename T>
__device__ __forceinline__ void kv_write_impl(T* __restrict__ k_cache, T* __restrict__ v_cache,
                                              const float* __restrict__ k_new,
                                              const float* __restrict__ v_new,
                                              const i64* __restrict__ slots, int row) {
  const int i = blockIdx.x;
  const i64 slot = slots[i];
  if (slot < 0) return;
  for (int e = threadIdx.x; e < row; e += blockDim.x) {
    k_cache[slot * row + e] = Vec16<T>::store(k_new[(i64)i * row + e]);
    v_cache[slot * row + e] = Vec16<T>::store(v_new[(i64)i * row + e]);
  }
}

extern "C" __global__ void kv_write_f32(float* k_cache, float* v_cache, const float* k_new,
                                        const float* v_new, const i64* slots, int row) {
  kv_write_impl<float>(k_cache, v_cache, k_new, v_new, slots, row);
}

extern "C" __global__ void kv_write_bf16(unsigned short* k_cache, unsigned short* v_cache,
                                         const float* k_new, const float* v_new,
                                         const i64* slots, int row) {
  kv_write_impl<unsigned short>(k_cache, v_cache, k_new, v_new, slots, row);
}

// Copies K and V rows: pairs[2i] -> pairs[2i+1], row_words 32-bit words per slot (any element
// type). One block per pair; the host rejects pair lists where a destination is also read or
// written by another pair (copy-on-write always targets a fresh block).
extern "C" __global__ void copy_slots(unsigned int* __restrict__ k_cache,
                                      unsigned int* __restrict__ v_cache,
                                      const i64* __restrict__ pairs, int row_words) {
  const i64 src = pairs[2 * (i64)blockIdx.x], dst = pairs[2 * (i64)blockIdx.x + 1];
  for (int e = threadIdx.x; e < row_words; e += blockDim.x) {
    k_cache[dst * row_words + e] = k_cache[src * row_words + e];
    v_cache[dst * row_words + e] = v_cache[src * row_words + e];
  }
}

// out[row, h, :] = sum_p part_out[row, h, p, :] e^(max_p - M) / sum_p part_sum_p e^(max_p - M)
// over the partitions the row actually has: from the one holding its first key (its window
// start; window 0: position 0) to the one holding its last. The attention kernel writes no
// partition outside a tile's range, so none other is read. Grid (q_heads, rows); blockDim.x >= D
// threads.
extern "C" __global__ void attn_merge(float* __restrict__ out, const float* __restrict__ part_out,
                                      const float* __restrict__ part_max,
                                      const float* __restrict__ part_sum,
                                      const int* __restrict__ row_len, int nparts,
                                      int part_tokens, int D, int window) {
  const int h = blockIdx.x, row = blockIdx.y, q_heads = gridDim.x;
  const i64 qh = (i64)row * q_heads + h;
  const int len = row_len[row];
  const int used = min(nparts, (len + part_tokens - 1) / part_tokens);
  const int first = window > 0 ? max(0, len - window) / part_tokens : 0;
  float m = NEG_INF;
  for (int p = first; p < used; ++p) m = fmaxf(m, part_max[qh * nparts + p]);
  float total = 0.f;
  for (int p = first; p < used; ++p)
    total += part_sum[qh * nparts + p] * expf(part_max[qh * nparts + p] - m);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.f;
    for (int p = first; p < used; ++p)
      acc += part_out[(qh * nparts + p) * D + d] * expf(part_max[qh * nparts + p] - m);
    out[qh * D + d] = total > 0.f ? acc / total : 0.f;
  }
}

// Fills n 32-bit words with `word` (outputs are poisoned with NaN before every checked launch).
extern "C" __global__ void fill_words(unsigned int* __restrict__ p, i64 n, unsigned int word) {
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
    p[i] = word;
}

// The read-bandwidth ceiling: every 16-byte vector of buf read once, XOR-folded per block so the
// loads cannot be dropped. n_vec vectors; out has gridDim.x words.
extern "C" __global__ void read_ceiling(const uint4* __restrict__ buf, i64 n_vec,
                                        unsigned int* __restrict__ out) {
  unsigned int acc = 0;
  for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n_vec;
       i += (i64)gridDim.x * blockDim.x) {
    uint4 v = buf[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  for (int off = 16; off > 0; off /= 2) acc ^= __shfl_xor_sync(0xffffffffu, acc, off);
  if (threadIdx.x % 32 == 0) atomicXor(&out[blockIdx.x], acc);
}
