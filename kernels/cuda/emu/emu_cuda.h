// The CUDA built-ins for the host build of kvbench's kernels (the emulated device).
//
// The `.cu` programs are compiled by g++ after this header, unchanged: every CUDA thread of a
// block runs the kernel function as a fiber on the launching OS thread (or, with
// EMU_OS_THREADS, as its own OS thread, for ThreadSanitizer). The built-in variables read the
// current CUDA thread's record; `__syncthreads` is a block barrier, and every warp operation is a
// warp barrier (warp-synchronous: all live lanes of the warp meet there), so a kernel that
// relies on an ordering the device does not give fails here too.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

// ---- Qualifiers -------------------------------------------------------------------------------
#define __device__
#define __host__
#ifndef EMU_SCAN_KERNELS
#define __global__
#endif
#define __forceinline__ inline __attribute__((always_inline))
// (`__noinline__` is left alone: the C++ library spells its attribute with that word.)
#define __launch_bounds__(...)
#define __constant__ static
// Block-shared storage: one `thread_local` object per declaration. Each block in flight runs
// on an OS thread of its own (a lane, emu_runtime.cpp), whose fibers are the block's CUDA
// threads, so each in-flight block has its own shared memory and launches on different host
// threads stay apart. With OS threads per CUDA thread, one launch at a time, blocks in turn
// (the sanitizer driver) and plain `static`.
#ifdef EMU_OS_THREADS
#define __shared__ static
#else
#define __shared__ static thread_local
#endif

// ---- Vector types -----------------------------------------------------------------------------
struct uint3 { unsigned int x, y, z; };
struct dim3 { unsigned int x, y, z; };
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
struct __attribute__((aligned(16))) uint4 { unsigned int x, y, z, w; };
struct __attribute__((aligned(16))) int4 { int x, y, z, w; };
struct __attribute__((aligned(8))) float2 { float x, y; };
struct __attribute__((aligned(8))) uint2 { unsigned int x, y; };
struct __attribute__((aligned(8))) int2 { int x, y; };

namespace emu {

struct Warp;
struct Block;

/// One CUDA thread's view of where it runs.
struct Thread {
  uint3 tid;
  unsigned int flat;   // linear index in the block
  unsigned int lane;   // flat % 32
  Block* block;
  Warp* warp;
  unsigned int shfl_phase;  // which of the warp's two exchange buffers the next shuffle uses
};

/// What every thread of a block reads: its block's index and the launch's dimensions.
struct BlockDims {
  uint3 idx;
  dim3 dim;
  dim3 grid;
};

extern thread_local Thread* t_cur;
/// K/V bytes the running launch's kernel read (`KV_READ_COUNT` in common.cuh), on the
/// launching thread; added to the process-wide counter when the launch ends.
extern thread_local unsigned long long t_kv_read_bytes;
const BlockDims& block_dims(const Thread* t);

/// Block barrier (`__syncthreads`).
void syncthreads();
/// Warp barrier over the live lanes of the caller's warp.
void syncwarp();
/// Publishes `bits` for the caller's lane, meets the warp, and returns lane `src`'s value
/// (the caller's own when `src` is out of range).
std::uint64_t warp_exchange(std::uint64_t bits, int src);
/// Publishes `bits` and meets the warp; `out[l]` is lane l's value, `live` the lanes present.
void warp_gather(std::uint64_t bits, std::uint64_t out[32], unsigned int* live);

template <typename T>
inline std::uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8, "warp exchange of at most 8 bytes");
  std::uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <typename T>
inline T from_bits(std::uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}

}  // namespace emu

#define threadIdx (::emu::t_cur->tid)
#define blockIdx (::emu::block_dims(::emu::t_cur).idx)
#define blockDim (::emu::block_dims(::emu::t_cur).dim)
#define gridDim (::emu::block_dims(::emu::t_cur).grid)
#define warpSize 32
#define KV_READ_COUNT(bytes) (::emu::t_kv_read_bytes += (bytes))

// A planted race for the sanitizer test: the `__syncthreads` on this source line is dropped.
#ifdef EMU_DROP_SYNC_LINE
#define __syncthreads() \
  do { if (__LINE__ != EMU_DROP_SYNC_LINE) ::emu::syncthreads(); } while (0)
#else
#define __syncthreads() ::emu::syncthreads()
#endif
inline void __syncwarp(unsigned int = 0xffffffffu) { ::emu::syncwarp(); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// ---- Warp shuffles and votes ------------------------------------------------------------------
// The mask is taken as "every live lane" (all kernels here pass 0xffffffff).
template <typename T>
inline T __shfl_sync(unsigned int, T v, int src_lane, int width = 32) {
  const int lane = (int)::emu::t_cur->lane;
  const int src = (lane & ~(width - 1)) + (src_lane & (width - 1));
  return ::emu::from_bits<T>(::emu::warp_exchange(::emu::to_bits(v), src));
}
template <typename T>
inline T __shfl_xor_sync(unsigned int, T v, int lane_mask, int width = 32) {
  const int lane = (int)::emu::t_cur->lane;
  int src = lane ^ lane_mask;
  if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = lane;
  return ::emu::from_bits<T>(::emu::warp_exchange(::emu::to_bits(v), src));
}
template <typename T>
inline T __shfl_down_sync(unsigned int, T v, unsigned int delta, int width = 32) {
  const int lane = (int)::emu::t_cur->lane;
  int src = lane + (int)delta;
  if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = lane;
  return ::emu::from_bits<T>(::emu::warp_exchange(::emu::to_bits(v), src));
}
template <typename T>
inline T __shfl_up_sync(unsigned int, T v, unsigned int delta, int width = 32) {
  const int lane = (int)::emu::t_cur->lane;
  int src = lane - (int)delta;
  if (src < 0 || (src & ~(width - 1)) != (lane & ~(width - 1))) src = lane;
  return ::emu::from_bits<T>(::emu::warp_exchange(::emu::to_bits(v), src));
}
inline unsigned int __ballot_sync(unsigned int, int pred) {
  std::uint64_t all[32];
  unsigned int live = 0;
  ::emu::warp_gather(pred ? 1u : 0u, all, &live);
  unsigned int r = 0;
  for (int l = 0; l < 32; ++l)
    if (((live >> l) & 1u) && all[l]) r |= 1u << l;
  return r;
}
inline int __any_sync(unsigned int m, int pred) { return __ballot_sync(m, pred) != 0; }
inline int __all_sync(unsigned int m, int pred) {
  std::uint64_t all[32];
  unsigned int live = 0;
  ::emu::warp_gather(pred ? 1u : 0u, all, &live);
  for (int l = 0; l < 32; ++l)
    if (((live >> l) & 1u) && !all[l]) return 0;
  return 1;
}

// ---- Atomics (real ones: CUDA threads may be OS threads) --------------------------------------
template <typename T>
inline T atomicAdd(T* p, T v) {
  if constexpr (std::is_floating_point<T>::value) {
    T old, next;
    __atomic_load(p, &old, __ATOMIC_RELAXED);
    do {
      next = old + v;
    } while (!__atomic_compare_exchange(p, &old, &next, false, __ATOMIC_SEQ_CST,
                                        __ATOMIC_SEQ_CST));
    return old;
  } else {
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
  }
}
template <typename T>
inline T atomicSub(T* p, T v) { return __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST); }
template <typename T>
inline T atomicXor(T* p, T v) { return __atomic_fetch_xor(p, v, __ATOMIC_SEQ_CST); }
template <typename T>
inline T atomicOr(T* p, T v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }
template <typename T>
inline T atomicAnd(T* p, T v) { return __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST); }
template <typename T>
inline T atomicExch(T* p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
template <typename T>
inline T atomicCAS(T* p, T cmp, T v) {
  __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return cmp;
}
template <typename T>
inline T atomicMax(T* p, T v) {
  T old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST,
                                                 __ATOMIC_SEQ_CST)) {
  }
  return old;
}
template <typename T>
inline T atomicMin(T* p, T v) {
  T old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (old > v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST,
                                                 __ATOMIC_SEQ_CST)) {
  }
  return old;
}

// ---- Bit casts and math -----------------------------------------------------------------------
inline float __int_as_float(int x) { return ::emu::from_bits<float>((std::uint32_t)x); }
inline float __uint_as_float(unsigned int x) { return ::emu::from_bits<float>(x); }
inline int __float_as_int(float f) { return (int)(std::uint32_t)::emu::to_bits(f); }
inline unsigned int __float_as_uint(float f) { return (std::uint32_t)::emu::to_bits(f); }
inline long long __double_as_longlong(double d) { return (long long)::emu::to_bits(d); }
inline double __longlong_as_double(long long x) { return ::emu::from_bits<double>((std::uint64_t)x); }
template <typename T>
inline T __ldg(const T* p) { return *p; }

inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : x); }
inline int __popc(unsigned int x) { return __builtin_popcount(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned int)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }

// CUDA's min/max overloads (integer and float), without std's templates.
#define EMU_MINMAX(T)                                   \
  inline T min(T a, T b) { return b < a ? b : a; }      \
  inline T max(T a, T b) { return a < b ? b : a; }
EMU_MINMAX(int)
EMU_MINMAX(unsigned int)
EMU_MINMAX(long long)
EMU_MINMAX(unsigned long long)
EMU_MINMAX(long)
EMU_MINMAX(unsigned long)
#undef EMU_MINMAX
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }

// ---- Launching (the trampolines the build generates) ------------------------------------------
namespace emu {

/// One kernel of the host build: its name, parameter count, and a call that unpacks CUDA's
/// `kernelParams` (pointers to each argument's value) into the real parameters.
struct KernelEntry {
  const char* name;
  unsigned int arity;
  void (*call)(void** params);
};

template <typename F, F f>
struct Tramp;
template <typename... A, void (*f)(A...)>
struct Tramp<void (*)(A...), f> {
  static constexpr unsigned int arity = sizeof...(A);
  template <std::size_t... I>
  static void call_impl(void** p, std::index_sequence<I...>) {
    f(*static_cast<typename std::remove_cv<A>::type*>(p[I])...);
  }
  static void call(void** p) { call_impl(p, std::index_sequence_for<A...>{}); }
};

#define EMU_KERNEL_ENTRY(ns, name) \
  ::emu::KernelEntry { #name, ::emu::Tramp<decltype(&ns::name), &ns::name>::arity, \
                       &::emu::Tramp<decltype(&ns::name), &ns::name>::call }

/// The outcome of one launch (filled by `launch_entry`).
struct LaunchResult {
  std::uintptr_t fault_addr;
  int fault_write;
  char reason[256];
};

enum LaunchStatus { LAUNCH_OK = 0, LAUNCH_UNKNOWN = 1, LAUNCH_BAD = 2, LAUNCH_FAULT = 3 };

/// Validates the launch as the device would, then runs its blocks (seeded order, two in flight).
int launch_entry(const KernelEntry* k, const unsigned int grid[3], const unsigned int block[3],
                 unsigned int dynamic_shared_bytes, void** params, std::size_t nparams,
                 LaunchResult* res);

}  // namespace emu
