// The attention kernels under ThreadSanitizer: built by the test `emu_tsan` with
// `-fsanitize=thread -DEMU_OS_THREADS` (every CUDA thread an OS thread, barriers a mutex and a
// condition variable), so a shared-memory access that no barrier orders is reported as a race.
// The cache is filled by kv_write, then every variant runs paged and contiguous, whole and split
// into partitions (merged by attn_merge); the two results must agree and be finite.
// Exit 0 when they do, 1 when not (TSan's own exit code, set by the test, when it reports).
#include "emu_cuda.h"
#include "emu_runtime.cpp"

#include <cstdio>
#include <vector>

namespace k {
#include "common.cuh"
#include "attention.cu"
ATTN_VARIANT(float, f32, 32, 2)
ATTN_VARIANT(unsigned short, bf16, 64, 1)
#include "kv_ops.cu"
}  // namespace k

namespace {

std::uint64_t g_state = 0x2545f4914f6cdd1dull;
float unit() {
  g_state = g_state * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((g_state >> 40) & 0xffffff) / (float)(1 << 24) * 2.f - 1.f;
}

template <typename... A>
int run(const emu::KernelEntry& e, unsigned gx, unsigned gy, unsigned gz, unsigned threads,
        A... args) {
  void* params[] = {static_cast<void*>(&args)...};
  const unsigned grid[3] = {gx, gy, gz};
  const unsigned block[3] = {threads, 1, 1};
  emu::LaunchResult res;
  const int rc = emu::launch_entry(&e, grid, block, 0, params, sizeof...(A), &res);
  if (rc != emu::LAUNCH_OK) std::fprintf(stderr, "%s: status %d %s\n", e.name, rc, res.reason);
  return rc;
}

template <typename T>
bool check_variant(const emu::KernelEntry& paged, const emu::KernelEntry& contig,
                   const emu::KernelEntry& kv_write, int head_dim, int group) {
  const int kv_heads = 2, q_heads = kv_heads * group, row = kv_heads * head_dim;
  const int lens[3] = {37, 1, 70};
  const int nseq = 3, block_size = 8, log2_bs = 3, max_len = 70;
  const int max_blocks = (max_len + block_size - 1) / block_size;
  const int num_blocks = nseq * max_blocks + 2, num_slots = num_blocks * block_size;
  std::vector<int> table(nseq * max_blocks);
  for (int i = 0; i < (int)table.size(); ++i) table[i] = (i * 7 + 3) % num_blocks;
  std::vector<long long> base = {0, max_len + 2, 2 * max_len + 4};
  bool ok = true;
  for (int layout = 0; layout < 2; ++layout) {
    const bool is_paged = layout == 0;
    std::vector<T> kc(num_slots * row), vc(num_slots * row);
    // Fill the cache through kv_write: every token of every sequence, one block per token.
    std::vector<long long> slots;
    for (int s = 0; s < nseq; ++s)
      for (int t = 0; t < lens[s]; ++t)
        slots.push_back(is_paged ? (long long)table[s * max_blocks + t / block_size] * block_size +
                                       t % block_size
                                 : base[s] + t);
    std::vector<float> kn(slots.size() * row), vn(slots.size() * row);
    for (auto& x : kn) x = unit();
    for (auto& x : vn) x = unit();
    if (run(kv_write, (unsigned)slots.size(), 1, 1, 64, kc.data(), vc.data(),
            (const float*)kn.data(), (const float*)vn.data(), (const long long*)slots.data(),
            row) != emu::LAUNCH_OK)
      return false;
    const int rows = 4;
    // Rows 2 and 3 (positions 68 and 69 of sequence 2) are one prefill tile.
    std::vector<int> row_seq = {0, 1, 2, 2}, row_len = {37, 1, 69, 70};
    std::vector<int> tile_row0 = {0, 1, 2, 4};
    const int tiles = 3;
    std::vector<float> q(rows * q_heads * head_dim);
    for (auto& x : q) x = unit();
    const float scale = 1.f / std::sqrt((float)head_dim);
    std::vector<float> whole(q.size(), NAN), split(q.size(), NAN);
    for (int pass = 0; pass < 2; ++pass) {
      const int part_tokens = pass == 0 ? 512 : 16;
      const int nparts = (max_len + part_tokens - 1) / part_tokens;
      std::vector<float> po(q.size() * nparts, NAN), pm(rows * q_heads * nparts, NAN),
          ps(rows * q_heads * nparts, NAN);
      float* out = pass == 0 ? whole.data() : split.data();
      if (run(is_paged ? paged : contig, kv_heads, tiles, nparts, 128, out, po.data(), pm.data(),
              ps.data(), (const float*)q.data(), (const T*)kc.data(), (const T*)vc.data(),
              (const int*)row_seq.data(), (const int*)row_len.data(),
              (const int*)table.data(), max_blocks, log2_bs, (const long long*)base.data(),
              kv_heads, part_tokens, scale, (const int*)tile_row0.data(), 1, 0) != emu::LAUNCH_OK)
        return false;
      if (nparts > 1) {
        const emu::KernelEntry merge = EMU_KERNEL_ENTRY(k, attn_merge);
        if (run(merge, q_heads, rows, 1, head_dim, out, (const float*)po.data(),
                (const float*)pm.data(), (const float*)ps.data(), (const int*)row_len.data(),
                nparts, part_tokens, head_dim, 0) != emu::LAUNCH_OK)
          return false;
      }
    }
    for (std::size_t i = 0; i < whole.size(); ++i)
      if (!std::isfinite(whole[i]) || std::fabs(whole[i] - split[i]) > 1e-4f) {
        std::fprintf(stderr, "%s: element %zu: whole %g, split %g\n",
                     is_paged ? paged.name : contig.name, i, whole[i], split[i]);
        ok = false;
        break;
      }
  }
  return ok;
}

}  // namespace

int main() {
  bool ok = check_variant<float>(EMU_KERNEL_ENTRY(k, attn_paged_f32_d32_g2),
                                 EMU_KERNEL_ENTRY(k, attn_contig_f32_d32_g2),
                                 EMU_KERNEL_ENTRY(k, kv_write_f32), 32, 2);
  ok = check_variant<unsigned short>(EMU_KERNEL_ENTRY(k, attn_paged_bf16_d64_g1),
                                     EMU_KERNEL_ENTRY(k, attn_contig_bf16_d64_g1),
                                     EMU_KERNEL_ENTRY(k, kv_write_bf16), 64, 1) &&
       ok;
  std::printf(ok ? "attention under ThreadSanitizer: outputs agree\n"
                 : "attention under ThreadSanitizer: outputs differ\n");
  return ok ? 0 : 1;
}
