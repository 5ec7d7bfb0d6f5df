// Shared by every kvbench CUDA program (prepended by the Rust side; NVRTC gets no include path).
// KV layout, as on the CPU backend: per layer K and V are each [num_slots, kv_heads, head_dim]
// (NHD), row-major; a slot is one token position (paged: slot = block * block_size + offset).
// bf16 is stored as its 16 bits (no cuda_bf16.h: NVRTC wheels ship no headers).

typedef long long i64;

// Counts bytes a kernel reads from the K/V cache: the emulated device defines it (emu_cuda.h)
// to add to its per-launch counter; on a GPU it is nothing.
#ifndef KV_READ_COUNT
#define KV_READ_COUNT(bytes)
#endif
#define NEG_INF (-__int_as_float(0x7f800000))

__device__ __forceinline__ float bf16_to_f32(unsigned short x) {
  return __uint_as_float(((unsigned int)x) << 16);
}

// Round to nearest even; NaN stays a quiet NaN (as the `half` crate does on the CPU side).
__device__ __forceinline__ unsigned short f32_to_bf16(float f) {
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
  unsigned int rounding = 0x7fffu + ((u >> 16) & 1u);
  return (unsigned short)((u + rounding) >> 16);
}

// One 16-byte load of K or V, widened to f32: 4 f32 or 8 bf16 elements.
template <typename T> struct Vec16;

template <> struct Vec16<float> {
  static constexpr int N = 4;
  __device__ __forceinline__ static void load(const float* __restrict__ p, float* out) {
    float4 v = *reinterpret_cast<const float4*>(p);
    out[0] = v.x; out[1] = v.y; out[2] = v.z; out[3] = v.w;
  }
  __device__ __forceinline__ static float store(float x) { return x; }
};

template <> struct Vec16<unsigned short> {
  static constexpr int N = 8;
  __device__ __forceinline__ static void load(const unsigned short* __restrict__ p, float* out) {
    uint4 v = *reinterpret_cast<const uint4*>(p);
    out[0] = __uint_as_float(v.x << 16);
    out[1] = __uint_as_float(v.x & 0xffff0000u);
    out[2] = __uint_as_float(v.y << 16);
    out[3] = __uint_as_float(v.y & 0xffff0000u);
    out[4] = __uint_as_float(v.z << 16);
    out[5] = __uint_as_float(v.z & 0xffff0000u);
    out[6] = __uint_as_float(v.w << 16);
    out[7] = __uint_as_float(v.w & 0xffff0000u);
  }
  __device__ __forceinline__ static unsigned short store(float x) { return f32_to_bf16(x); }
};
