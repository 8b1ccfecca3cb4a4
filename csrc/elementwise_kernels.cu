// Elementwise ops: the activation after c_fc, and the residual update with its per-column LayerScale.
//
// Each thread owns one column group (a 16-byte pack of 8 values, or 1 value on the scalar path), loads
// that group's column vectors once, then walks its rows a few at a time so several independent loads
// are in flight. Warps span consecutive columns of one row, so accesses coalesce.
//
// The activation reads no column vector, so where both matrices are contiguous it walks them as one flat array
// of packs instead: every thread of every block has work whatever the width (a 3,072-wide row is 384 packs, which
// left a quarter of the column-group kernel's threads idle), and each thread has four 16-byte loads in flight. On an
// H200, erf GELU over a text tower's c_fc output (25,600 x 3,072 fp16) took 0.100 / 0.107 ms against 0.111 / 0.115,
// and over ViT-L-14's vision MLP at 256 images 0.311 / 0.314 against 0.345 / 0.343; a plain copy takes 0.082 and
// 0.264 (benchmarks/results/h200/flat_activation_7e75d48).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernel_common.cuh"

namespace clip_flash {
namespace {

constexpr int kBlockThreads = 256;
// Rows per step: 64 bytes of loads in flight per thread, at about 70 registers.
constexpr int kBiasActRows = 4;
constexpr int kResidualAddRows = 2;
constexpr int64_t kMaxGridY = 65535;

struct LaunchShape {
  dim3 grid;
  dim3 block;
};

LaunchShape column_group_launch_shape(int64_t rows, int64_t groups_per_row, int rows_per_thread) {
  const int threads_x = static_cast<int>(std::min<int64_t>(kBlockThreads, (groups_per_row + 31) / 32 * 32));
  const int threads_y = kBlockThreads / threads_x;
  const int64_t blocks_x = (groups_per_row + threads_x - 1) / threads_x;
  const int64_t rows_per_block = static_cast<int64_t>(threads_y) * rows_per_thread;
  const int64_t blocks_y = std::min(kMaxGridY, (rows + rows_per_block - 1) / rows_per_block);
  return {dim3(static_cast<unsigned>(blocks_x), static_cast<unsigned>(blocks_y)), dim3(threads_x, threads_y)};
}

// First row of this thread and the stride to its next group of kRows rows.
template <int kRows>
__device__ __forceinline__ int64_t first_row() {
  return (static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y) * kRows;
}
template <int kRows>
__device__ __forceinline__ int64_t row_step() {
  return static_cast<int64_t>(gridDim.y) * blockDim.y * kRows;
}

template <typename T, int kWidth, Activation kActivation>
__global__ void __launch_bounds__(kBlockThreads) bias_act_kernel(const BiasActArgs args) {
  constexpr int kRows = kBiasActRows;
  const int64_t col = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kWidth;
  if (col >= args.cols) return;
  const T* x = static_cast<const T*>(args.x.data) + col;
  T* out = static_cast<T*>(args.out.data) + col;

  for (int64_t row = first_row<kRows>(); row < args.rows; row += row_step<kRows>()) {
    float values[kRows][kWidth];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (row + r < args.rows) load_floats(x + (row + r) * args.x.row_stride, values[r]);
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (row + r >= args.rows) continue;
      Pack<T, kWidth> result;
#pragma unroll
      for (int j = 0; j < kWidth; ++j) result.values[j] = round_from_float<T>(activate<kActivation>(values[r][j]));
      store_pack(out + (row + r) * args.out.row_stride, result);
    }
  }
}

// Packs a thread of the flat activation kernel loads before it computes any.
constexpr int kFlatPacksPerThread = 4;

template <typename T, Activation kActivation>
__global__ void __launch_bounds__(kBlockThreads) flat_bias_act_kernel(const T* x, T* out, int64_t packs) {
  using Packed = Pack<T, kPackElements>;
  // Pack k of a thread is k blocks' widths past its first: a warp's loads cover 512 consecutive bytes.
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kBlockThreads * kFlatPacksPerThread + threadIdx.x;
  Packed in[kFlatPacksPerThread];
#pragma unroll
  for (int k = 0; k < kFlatPacksPerThread; ++k) {
    const int64_t pack = first + static_cast<int64_t>(k) * kBlockThreads;
    if (pack < packs) in[k] = reinterpret_cast<const Packed*>(x)[pack];
  }
#pragma unroll
  for (int k = 0; k < kFlatPacksPerThread; ++k) {
    const int64_t pack = first + static_cast<int64_t>(k) * kBlockThreads;
    if (pack >= packs) continue;
    Packed result;
#pragma unroll
    for (int j = 0; j < kPackElements; ++j) {
      result.values[j] = round_from_float<T>(activate<kActivation>(to_float(in[k].values[j])));
    }
    store_pack(out + pack * kPackElements, result);
  }
}

template <typename T, int kWidth>
__global__ void __launch_bounds__(kBlockThreads) residual_add_kernel(const ResidualAddArgs args) {
  constexpr int kRows = kResidualAddRows;
  const int64_t col = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kWidth;
  if (col >= args.cols) return;
  float scale[kWidth];
  load_column_vector(args.scale, col, 1.0f, scale);
  const T* residual = static_cast<const T*>(args.residual.data) + col;
  const T* delta = static_cast<const T*>(args.delta.data) + col;
  T* out = static_cast<T*>(args.out.data) + col;

  for (int64_t row = first_row<kRows>(); row < args.rows; row += row_step<kRows>()) {
    float residual_values[kRows][kWidth], delta_values[kRows][kWidth];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (row + r >= args.rows) continue;
      load_floats(residual + (row + r) * args.residual.row_stride, residual_values[r]);
      load_floats(delta + (row + r) * args.delta.row_stride, delta_values[r]);
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (row + r >= args.rows) continue;
      Pack<T, kWidth> result;
#pragma unroll
      for (int j = 0; j < kWidth; ++j) {
        result.values[j] =
            round_from_float<T>(residual_update(residual_values[r][j], delta_values[r][j], scale[j]));
      }
      store_pack(out + (row + r) * args.out.row_stride, result);
    }
  }
}

bool can_use_packs(const BiasActArgs& args) {
  return args.cols % kPackElements == 0 && packs_fit(args.x.data, args.x.row_stride) &&
         packs_fit(args.out.data, args.out.row_stride);
}

bool can_use_packs(const ResidualAddArgs& args) {
  return args.cols % kPackElements == 0 && packs_fit(args.residual.data, args.residual.row_stride) &&
         packs_fit(args.delta.data, args.delta.row_stride) && packs_fit(args.out.data, args.out.row_stride) &&
         is_16_byte_aligned(args.scale.data);
}

// Both matrices one contiguous run of 16-byte packs: the flat kernel's case.
bool is_flat(const BiasActArgs& args) {
  return can_use_packs(args) && args.x.row_stride == args.cols && args.out.row_stride == args.cols;
}

// Calls `launch` with the activation as a compile-time constant (std::integral_constant), so each kernel is
// instantiated once per activation and the switch is written once.
template <typename Launch>
void with_activation(Activation activation, Launch&& launch) {
  switch (activation) {
    case Activation::kGelu:
      launch(std::integral_constant<Activation, Activation::kGelu>{});
      break;
    case Activation::kGeluTanh:
      launch(std::integral_constant<Activation, Activation::kGeluTanh>{});
      break;
    case Activation::kQuickGelu:
      launch(std::integral_constant<Activation, Activation::kQuickGelu>{});
      break;
    case Activation::kIdentity:
      launch(std::integral_constant<Activation, Activation::kIdentity>{});
      break;
  }
}

template <typename T>
void launch_flat_bias_act_kernel(const BiasActArgs& args, cudaStream_t stream) {
  const int64_t packs = args.rows * args.cols / kPackElements;
  constexpr int64_t kPacksPerBlock = static_cast<int64_t>(kBlockThreads) * kFlatPacksPerThread;
  const dim3 grid(static_cast<unsigned>((packs + kPacksPerBlock - 1) / kPacksPerBlock));
  const T* x = static_cast<const T*>(args.x.data);
  T* out = static_cast<T*>(args.out.data);
  with_activation(args.activation, [&](auto activation) {
    flat_bias_act_kernel<T, decltype(activation)::value><<<grid, kBlockThreads, 0, stream>>>(x, out, packs);
  });
}

template <typename T, int kWidth>
void launch_bias_act_kernel(const BiasActArgs& args, cudaStream_t stream) {
  const LaunchShape shape = column_group_launch_shape(args.rows, args.cols / kWidth, kBiasActRows);
  with_activation(args.activation, [&](auto activation) {
    bias_act_kernel<T, kWidth, decltype(activation)::value><<<shape.grid, shape.block, 0, stream>>>(args);
  });
}

template <typename T>
void launch_bias_act_for_type(const BiasActArgs& args, cudaStream_t stream) {
  if (is_flat(args)) {
    launch_flat_bias_act_kernel<T>(args, stream);
  } else if (can_use_packs(args)) {
    launch_bias_act_kernel<T, kPackElements>(args, stream);
  } else {
    launch_bias_act_kernel<T, 1>(args, stream);
  }
}

template <typename T>
void launch_residual_add_for_type(const ResidualAddArgs& args, cudaStream_t stream) {
  if (can_use_packs(args)) {
    const LaunchShape shape = column_group_launch_shape(args.rows, args.cols / kPackElements, kResidualAddRows);
    residual_add_kernel<T, kPackElements><<<shape.grid, shape.block, 0, stream>>>(args);
  } else {
    const LaunchShape shape = column_group_launch_shape(args.rows, args.cols, kResidualAddRows);
    residual_add_kernel<T, 1><<<shape.grid, shape.block, 0, stream>>>(args);
  }
}

}  // namespace

void launch_bias_act(const BiasActArgs& args, cudaStream_t stream) {
  if (args.rows == 0 || args.cols == 0) return;
  if (args.type == ElementType::kBFloat16) {
    launch_bias_act_for_type<__nv_bfloat16>(args, stream);
  } else {
    launch_bias_act_for_type<__half>(args, stream);
  }
}

void launch_residual_add(const ResidualAddArgs& args, cudaStream_t stream) {
  if (args.rows == 0 || args.cols == 0) return;
  if (args.type == ElementType::kBFloat16) {
    launch_residual_add_for_type<__nv_bfloat16>(args, stream);
  } else {
    launch_residual_add_for_type<__half>(args, stream);
  }
}

}  // namespace clip_flash
