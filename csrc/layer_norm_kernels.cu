// LayerNorm with fp32 statistics over 16-bit rows, optionally fused with the residual update before it.
//
// Packed path (cols % 8 == 0, 16-byte aligned, cols <= 8192): each row is held in registers by one to
// eight warps (up to 4 packs of 8 values per thread), so the row is read once and the two-pass
// mean/variance over registers is exact and costs no extra memory traffic. Few rows (one image through
// ViT-L-14: 257) would leave most of the GPU idle at one warp per row, the kernel then waiting on memory
// latency alone; the launcher spreads a row over more threads (fewer packs each) while the grid stays
// under 512 threads per multiprocessor (denser grids, e.g. 2056 rows of 1024, are as fast or faster at one
// warp per row: benchmarks/bench_layer_norm.py), and with one or two packs per thread the affine vectors
// are loaded before the reductions.
// Scalar path (any cols, any alignment): one block per row, three passes through L1/L2.
#include <algorithm>
#include <cstdint>

#include "kernel_common.cuh"

namespace clip_flash {
namespace {

constexpr int kMaxPacksPerThread = 4;
constexpr int kMaxThreadsPerRow = 256;  // 256 threads x 4 packs x 8 = 8192 columns in registers
constexpr int kFillThreadsPerSm = 512;  // see the top of the file
constexpr int kMinThreadsPerBlock = 128;  // narrow rows share a block, several rows per block
constexpr int kMaxWarpsPerBlock = 32;
constexpr int kScalarThreads = 256;

// Sum of `value` over the threads of this block row (threadIdx.y). Every thread of the block calls it;
// every thread of the row gets the same bits (same summation order).
__device__ __forceinline__ float row_sum(float value, float* partials) {
  value = warp_sum(value);
  const int warps_per_row = blockDim.x / 32;
  if (warps_per_row == 1) return value;
  float* row_partials = partials + threadIdx.y * warps_per_row;
  if (threadIdx.x % 32 == 0) row_partials[threadIdx.x / 32] = value;
  __syncthreads();
  float total = 0.0f;
  for (int warp = 0; warp < warps_per_row; ++warp) total += row_partials[warp];
  return total;
}

template <typename T, bool kUpdateResidual, int kPacksPerThread>
__global__ void __launch_bounds__(kMaxThreadsPerRow) layer_norm_packed_kernel(const LayerNormArgs args) {
  // With few packs per thread, registers are plenty: the affine vectors are loaded first, so that their
  // latency overlaps the row's and the reductions'.
  constexpr bool kAffineFirst = kPacksPerThread <= 2;
  __shared__ float sum_partials[kMaxWarpsPerBlock];
  __shared__ float square_partials[kMaxWarpsPerBlock];

  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  // Rows past the end still take part in the block reductions (their __syncthreads), without memory access.
  const bool row_in_range = row < args.rows;
  const int packs_per_row = static_cast<int>(args.cols / kPackElements);
  const T* residual = static_cast<const T*>(args.residual.data) + row * args.residual.row_stride;
  const T* delta = static_cast<const T*>(args.delta.data) + row * args.delta.row_stride;
  T* updated_out = static_cast<T*>(args.updated_out.data) + row * args.updated_out.row_stride;
  T* normed_out = static_cast<T*>(args.normed_out.data) + row * args.normed_out.row_stride;

  float values[kPacksPerThread][kPackElements];
  float weight[kPacksPerThread][kPackElements], bias[kPacksPerThread][kPackElements];
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < kPacksPerThread; ++k) {
    const int pack = threadIdx.x + k * blockDim.x;
    if (!row_in_range || pack >= packs_per_row) continue;
    const int64_t col = static_cast<int64_t>(pack) * kPackElements;
    if constexpr (kAffineFirst) {
      load_column_vector(args.weight, col, 1.0f, weight[k]);
      load_column_vector(args.bias, col, 0.0f, bias[k]);
    }
    load_floats(residual + col, values[k]);
    if constexpr (kUpdateResidual) {
      float delta_values[kPackElements], scale[kPackElements];
      load_floats(delta + col, delta_values);
      load_column_vector(args.scale, col, 1.0f, scale);
      Pack<T, kPackElements> updated;
#pragma unroll
      for (int j = 0; j < kPackElements; ++j) {
        updated.values[j] =
            round_from_float<T>(residual_update(values[k][j], delta_values[j], scale[j]));
        values[k][j] = to_float(updated.values[j]);  // normalize what is stored, as the next block sees it
      }
      store_pack(updated_out + col, updated);
    }
#pragma unroll
    for (int j = 0; j < kPackElements; ++j) sum += values[k][j];
  }
  const float mean = row_sum(sum, sum_partials) / static_cast<float>(args.cols);

  float squares = 0.0f;
#pragma unroll
  for (int k = 0; k < kPacksPerThread; ++k) {
    const int pack = threadIdx.x + k * blockDim.x;
    if (!row_in_range || pack >= packs_per_row) continue;
#pragma unroll
    for (int j = 0; j < kPackElements; ++j) {
      const float centered = values[k][j] - mean;
      squares = fmaf(centered, centered, squares);
    }
  }
  const float variance = row_sum(squares, square_partials) / static_cast<float>(args.cols);
  const float inv_std = rsqrtf(variance + args.eps);

#pragma unroll
  for (int k = 0; k < kPacksPerThread; ++k) {
    const int pack = threadIdx.x + k * blockDim.x;
    if (!row_in_range || pack >= packs_per_row) continue;
    const int64_t col = static_cast<int64_t>(pack) * kPackElements;
    if constexpr (!kAffineFirst) {
      load_column_vector(args.weight, col, 1.0f, weight[k]);
      load_column_vector(args.bias, col, 0.0f, bias[k]);
    }
    Pack<T, kPackElements> normed;
#pragma unroll
    for (int j = 0; j < kPackElements; ++j) {
      normed.values[j] = round_from_float<T>(fmaf((values[k][j] - mean) * inv_std, weight[k][j], bias[k][j]));
    }
    store_pack(normed_out + col, normed);
  }
}

template <typename T, bool kUpdateResidual>
__global__ void __launch_bounds__(kScalarThreads) layer_norm_scalar_kernel(const LayerNormArgs args) {
  __shared__ float sum_partials[kMaxWarpsPerBlock];
  __shared__ float square_partials[kMaxWarpsPerBlock];

  const int64_t row = blockIdx.x;
  const T* residual = static_cast<const T*>(args.residual.data) + row * args.residual.row_stride;
  const T* delta = static_cast<const T*>(args.delta.data) + row * args.delta.row_stride;
  T* updated_out = static_cast<T*>(args.updated_out.data) + row * args.updated_out.row_stride;
  T* normed_out = static_cast<T*>(args.normed_out.data) + row * args.normed_out.row_stride;
  // Passes 2 and 3 re-read the row; with a residual update, from what pass 1 stored (each thread
  // re-reads only the elements it wrote itself, so no synchronization is needed).
  const T* source = kUpdateResidual ? updated_out : residual;

  float sum = 0.0f;
  for (int64_t col = threadIdx.x; col < args.cols; col += blockDim.x) {
    float value = to_float(residual[col]);
    if constexpr (kUpdateResidual) {
      float scale[1];
      load_column_vector(args.scale, col, 1.0f, scale);
      const T updated = round_from_float<T>(residual_update(value, to_float(delta[col]), scale[0]));
      updated_out[col] = updated;
      value = to_float(updated);
    }
    sum += value;
  }
  const float mean = row_sum(sum, sum_partials) / static_cast<float>(args.cols);

  float squares = 0.0f;
  for (int64_t col = threadIdx.x; col < args.cols; col += blockDim.x) {
    const float centered = to_float(source[col]) - mean;
    squares = fmaf(centered, centered, squares);
  }
  const float variance = row_sum(squares, square_partials) / static_cast<float>(args.cols);
  const float inv_std = rsqrtf(variance + args.eps);

  for (int64_t col = threadIdx.x; col < args.cols; col += blockDim.x) {
    float weight[1], bias[1];
    load_column_vector(args.weight, col, 1.0f, weight);
    load_column_vector(args.bias, col, 0.0f, bias);
    normed_out[col] = round_from_float<T>(fmaf((to_float(source[col]) - mean) * inv_std, weight[0], bias[0]));
  }
}

bool can_use_packed_kernel(const LayerNormArgs& args) {
  const bool update = args.delta.data != nullptr;
  return args.cols % kPackElements == 0 &&
         args.cols <= static_cast<int64_t>(kMaxThreadsPerRow) * kMaxPacksPerThread * kPackElements &&
         packs_fit(args.residual.data, args.residual.row_stride) &&
         packs_fit(args.normed_out.data, args.normed_out.row_stride) &&
         (!update || (packs_fit(args.delta.data, args.delta.row_stride) &&
                      packs_fit(args.updated_out.data, args.updated_out.row_stride) &&
                      is_16_byte_aligned(args.scale.data))) &&
         is_16_byte_aligned(args.weight.data) && is_16_byte_aligned(args.bias.data);
}

int round_up_to_warp(int64_t threads) { return static_cast<int>((threads + 31) / 32 * 32); }

int multiprocessor_count() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 1;
  int count = 1;
  cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device);
  return std::max(count, 1);
}

// Packs per thread for rows of `packs_per_row` packs: the fewest (the most threads per row) whose grid
// still fits kFillThreadsPerSm threads per multiprocessor, else the most threads that hold a row in 4.
int packs_per_thread(int64_t rows, int64_t packs_per_row) {
  // Read once, from the first call's device: the GPUs of one host running one model are alike.
  static const int64_t fill_threads = static_cast<int64_t>(multiprocessor_count()) * kFillThreadsPerSm;
  for (int packs = 1; packs < kMaxPacksPerThread; ++packs) {
    const int threads = round_up_to_warp((packs_per_row + packs - 1) / packs);
    if (threads <= kMaxThreadsPerRow && rows * threads <= fill_threads) return packs;
  }
  return kMaxPacksPerThread;
}

template <typename T, bool kUpdateResidual, int kPacksPerThread>
void launch_packed(const LayerNormArgs& args, cudaStream_t stream) {
  const int64_t packs_per_row = args.cols / kPackElements;
  const int threads_per_row = round_up_to_warp((packs_per_row + kPacksPerThread - 1) / kPacksPerThread);
  const int rows_per_block = std::max(1, kMinThreadsPerBlock / threads_per_row);
  const dim3 block(threads_per_row, rows_per_block);
  const dim3 grid(static_cast<unsigned>((args.rows + rows_per_block - 1) / rows_per_block));
  layer_norm_packed_kernel<T, kUpdateResidual, kPacksPerThread><<<grid, block, 0, stream>>>(args);
}

template <typename T, bool kUpdateResidual>
void launch_kernel(const LayerNormArgs& args, cudaStream_t stream) {
  if (can_use_packed_kernel(args)) {
    switch (packs_per_thread(args.rows, args.cols / kPackElements)) {
      case 1: launch_packed<T, kUpdateResidual, 1>(args, stream); break;
      case 2: launch_packed<T, kUpdateResidual, 2>(args, stream); break;
      case 3: launch_packed<T, kUpdateResidual, 3>(args, stream); break;
      default: launch_packed<T, kUpdateResidual, 4>(args, stream); break;
    }
  } else {
    const dim3 block(std::min<int>(kScalarThreads, round_up_to_warp(args.cols)));
    layer_norm_scalar_kernel<T, kUpdateResidual><<<static_cast<unsigned>(args.rows), block, 0, stream>>>(args);
  }
}

template <typename T>
void launch_for_type(const LayerNormArgs& args, cudaStream_t stream) {
  if (args.delta.data != nullptr) {
    launch_kernel<T, true>(args, stream);
  } else {
    launch_kernel<T, false>(args, stream);
  }
}

}  // namespace

void launch_layer_norm(const LayerNormArgs& args, cudaStream_t stream) {
  if (args.rows == 0 || args.cols == 0) return;
  if (args.type == ElementType::kBFloat16) {
    launch_for_type<__nv_bfloat16>(args, stream);
  } else {
    launch_for_type<__half>(args, stream);
  }
}

}  // namespace clip_flash
