// Kernels for the emulator's own tests, built into the host library only (NVRTC never sees
// them, kvbench never launches them). Each is wrong on a GPU in a way the emulator must show.

// Assumes block b-1 ran before block b: out[b] = b + 1 only in index order.
__global__ void emu_test_block_chain(int* out) {
  const int b = blockIdx.x;
  if (threadIdx.x == 0) out[b] = b == 0 ? 1 : out[b - 1] + 1;
}

// Counts, per block, the other blocks it saw in flight (started, not finished): 0 everywhere
// only if blocks run one after the other.
__global__ void emu_test_block_overlap(int* state, int* seen) {
  const int b = blockIdx.x;
  if (threadIdx.x == 0) state[b] = 1;
  __syncthreads();
  if (threadIdx.x == 0) {
    int c = 0;
    for (int o = 0; o < (int)gridDim.x; ++o)
      if (o != b && state[o] == 1) ++c;
    seen[b] = c;
  }
  __syncthreads();
  if (threadIdx.x == 0) state[b] = 2;
}

// A shuffle across 16 lanes in a block whose last warp is partial: lanes whose partner the
// warp lacks read an undefined value.
__global__ void emu_test_shfl_partial(float* out) {
  const float v = (float)threadIdx.x;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, v, 16);
}
