// Helpers shared by the kernels: 16-byte packed loads and stores, fp32 conversions, optional
// per-column vectors, warp reductions, the fused formulas themselves, and the alignment test that
// decides between packed and scalar kernels.
// All math is fp32; every value written to memory is rounded once (round-to-nearest-even).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernel_args.h"

namespace clip_flash {

// Eight 16-bit elements: one 16-byte memory transaction per thread.
constexpr int kPackElements = 8;
constexpr int kMaxTransactionBytes = 16;

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T values[N];
};

__device__ __forceinline__ float to_float(float value) { return value; }
__device__ __forceinline__ float to_float(__half value) { return __half2float(value); }
__device__ __forceinline__ float to_float(__nv_bfloat16 value) { return __bfloat162float(value); }

template <typename T>
__device__ __forceinline__ T round_from_float(float value);
template <>
__device__ __forceinline__ __half round_from_float<__half>(float value) {
  return __float2half_rn(value);
}
template <>
__device__ __forceinline__ __nv_bfloat16 round_from_float<__nv_bfloat16>(float value) {
  return __float2bfloat16_rn(value);
}

// Loads N consecutive elements as floats, in transactions of at most 16 bytes; `ptr` must be aligned
// to the transaction size (16 bytes for packed kernels, the element size for scalar ones).
template <int N, typename T>
__device__ __forceinline__ void load_floats(const T* ptr, float (&out)[N]) {
  constexpr int kPerLoad =
      N * sizeof(T) > kMaxTransactionBytes ? kMaxTransactionBytes / static_cast<int>(sizeof(T)) : N;
  static_assert(N % kPerLoad == 0, "N must be a whole number of transactions");
#pragma unroll
  for (int i = 0; i < N; i += kPerLoad) {
    const Pack<T, kPerLoad> pack = *reinterpret_cast<const Pack<T, kPerLoad>*>(ptr + i);
#pragma unroll
    for (int j = 0; j < kPerLoad; ++j) out[i + j] = to_float(pack.values[j]);
  }
}

template <typename T, int N>
__device__ __forceinline__ void store_pack(T* ptr, const Pack<T, N>& pack) {
  static_assert(sizeof(Pack<T, N>) <= kMaxTransactionBytes, "one store per pack");
  *reinterpret_cast<Pack<T, N>*>(ptr) = pack;
}

// Loads N entries of an optional column vector starting at column `col`, or `neutral` when absent.
// The branches are uniform across the grid, so they cost no divergence.
template <int N>
__device__ __forceinline__ void load_column_vector(const ColumnVector& vector, int64_t col, float neutral,
                                                   float (&out)[N]) {
  if (vector.data == nullptr) {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = neutral;
  } else if (vector.type == ElementType::kFloat32) {
    load_floats<N>(static_cast<const float*>(vector.data) + col, out);
  } else if (vector.type == ElementType::kFloat16) {
    load_floats<N>(static_cast<const __half*>(vector.data) + col, out);
  } else {
    load_floats<N>(static_cast<const __nv_bfloat16*>(vector.data) + col, out);
  }
}

__device__ __forceinline__ float warp_sum(float value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// residual + scale * delta; the fused multiply-add saves one rounding.
__device__ __forceinline__ float residual_update(float residual, float delta, float scale) {
  return fmaf(scale, delta, residual);
}

// The activations exactly as torch defines them, with accurate (not --use_fast_math) erff/tanhf/expf.
template <Activation kActivation>
__device__ __forceinline__ float activate(float x) {
  if constexpr (kActivation == Activation::kGelu) {
    constexpr float kSqrtHalf = 0.70710678118654752440f;
    return 0.5f * x * (1.0f + erff(x * kSqrtHalf));
  } else if constexpr (kActivation == Activation::kGeluTanh) {
    constexpr float kSqrtTwoOverPi = 0.79788456080286535588f;
    constexpr float kCubicCoefficient = 0.044715f;
    const float inner = kSqrtTwoOverPi * (x + kCubicCoefficient * x * x * x);
    return 0.5f * x * (1.0f + tanhf(inner));
  } else if constexpr (kActivation == Activation::kQuickGelu) {
    // x * sigmoid(1.702 x); for very negative x, expf overflows to inf and the result is -0.
    return x / (1.0f + expf(-1.702f * x));
  } else {
    return x;
  }
}

// Host side: whether a matrix (or a column vector, row_stride 0) can be read in 16-byte packs.
inline bool is_16_byte_aligned(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }
inline bool packs_fit(const void* data, int64_t row_stride) {
  return is_16_byte_aligned(data) && row_stride % kPackElements == 0;
}

}  // namespace clip_flash
