// The activation after c_fc by table lookup. A 16-bit element takes one of 65,536 values, so each block first
// computes the activation of every value of magnitude below 8 into shared memory, with the per-element kernel's
// own formula and rounding (activate<> and round_from_float<>, so the table holds the same bits), and then each
// element is a shared-memory read; the rare element of magnitude 8 or more (and inf, NaN) takes the formula.
// Why: on a GPU whose memory outpaces its ALUs (an H200 against an H100), the erf GELU's ~30 instructions an
// element make the per-element kernel compute-bound; the lookups leave it bound by memory.
//
// One block of 1024 threads per SM builds its table once and then walks the matrix in 16-byte packs, the
// packs of the whole grid side by side so warps read consecutive memory. Its first packs are loaded before
// the table is built, so the table's arithmetic overlaps their memory latency.
#include "activation_by_table.h"

#include <algorithm>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernel_common.cuh"

namespace clip_flash {
namespace {

constexpr int kTableThreads = 1024;
constexpr int kPacksInFlight = 4;  // packs a thread loads before it looks any up

// Magnitude bits of 8.0: values below it are in the table (positive at [0, limit), negative at [limit, 2 limit)).
template <typename T>
struct TableLimit;
template <>
struct TableLimit<__half> {
  static constexpr unsigned kBits = 0x4800;
};
template <>
struct TableLimit<__nv_bfloat16> {
  static constexpr unsigned kBits = 0x4100;
};

template <typename T>
constexpr size_t table_bytes() {
  return 2 * TableLimit<T>::kBits * sizeof(uint16_t);
}

__device__ __forceinline__ float value_of_bits(uint16_t bits, __half) { return __half2float(__ushort_as_half(bits)); }
__device__ __forceinline__ float value_of_bits(uint16_t bits, __nv_bfloat16) {
  return __bfloat162float(__ushort_as_bfloat16(bits));
}
__device__ __forceinline__ uint16_t bits_of(__half value) { return __half_as_ushort(value); }
__device__ __forceinline__ uint16_t bits_of(__nv_bfloat16 value) { return __bfloat16_as_ushort(value); }

// The per-element kernel's result for the value with these bits.
template <typename T, Activation kActivation>
__device__ __forceinline__ uint16_t activate_bits(uint16_t bits) {
  return bits_of(round_from_float<T>(activate<kActivation>(value_of_bits(bits, T()))));
}

// Where pack `index` of the matrix starts, as an element offset for a row stride.
struct PackPosition {
  uint32_t row;
  uint32_t column;  // in elements
};

__device__ __forceinline__ PackPosition position_of(uint32_t index, uint32_t packs_per_row) {
  const uint32_t row = index / packs_per_row;
  return {row, (index - row * packs_per_row) * kPackElements};
}

template <typename T, Activation kActivation>
__global__ void __launch_bounds__(kTableThreads) activation_by_table_kernel(const BiasActArgs args) {
  constexpr unsigned kLimit = TableLimit<T>::kBits;
  extern __shared__ uint16_t table[];
  const T* x = static_cast<const T*>(args.x.data);
  T* out = static_cast<T*>(args.out.data);
  const uint32_t packs_per_row = static_cast<uint32_t>(args.cols / kPackElements);
  const uint32_t packs = static_cast<uint32_t>(args.rows) * packs_per_row;
  const uint32_t stride = gridDim.x * blockDim.x;

  uint4 loaded[kPacksInFlight];
  const auto load = [&](uint32_t first) {
#pragma unroll
    for (int i = 0; i < kPacksInFlight; ++i) {
      const uint32_t index = first + i * stride;
      if (index < packs) {
        const PackPosition at = position_of(index, packs_per_row);
        loaded[i] = *reinterpret_cast<const uint4*>(x + at.row * args.x.row_stride + at.column);
      }
    }
  };
  uint32_t first = blockIdx.x * blockDim.x + threadIdx.x;
  load(first);

  for (unsigned i = threadIdx.x; i < 2 * kLimit; i += blockDim.x) {
    table[i] = activate_bits<T, kActivation>(static_cast<uint16_t>(i < kLimit ? i : (i - kLimit) | 0x8000u));
  }
  __syncthreads();

  while (first < packs) {
#pragma unroll
    for (int i = 0; i < kPacksInFlight; ++i) {
      const uint32_t index = first + i * stride;
      if (index >= packs) break;
      uint16_t* values = reinterpret_cast<uint16_t*>(&loaded[i]);
#pragma unroll
      for (int j = 0; j < kPackElements; ++j) {
        const unsigned bits = values[j];
        const unsigned magnitude = bits & 0x7fffu;
        values[j] = magnitude < kLimit ? table[(bits & 0x8000u) ? magnitude + kLimit : magnitude]
                                       : activate_bits<T, kActivation>(static_cast<uint16_t>(bits));
      }
      const PackPosition at = position_of(index, packs_per_row);
      *reinterpret_cast<uint4*>(out + at.row * args.out.row_stride + at.column) = loaded[i];
    }
    first += kPacksInFlight * stride;
    load(first);
  }
}

int multiprocessors(int device) {
  static int counts[64] = {0};  // per device; a race writes the same value
  if (device < 0 || device >= 64) return 132;
  if (counts[device] == 0) {
    int count = 0;
    if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || count <= 0) {
      return 132;
    }
    counts[device] = count;
  }
  return counts[device];
}

template <typename T, Activation kActivation>
void launch_typed(const BiasActArgs& args, cudaStream_t stream) {
  const auto kernel = activation_by_table_kernel<T, kActivation>;
  // Above 48 KiB a block's shared memory must be allowed explicitly (a per-function attribute, no stream work).
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(table_bytes<T>()));
  int device = 0;
  cudaGetDevice(&device);
  const int64_t packs = args.rows * (args.cols / kPackElements);
  const int64_t blocks = std::min<int64_t>(multiprocessors(device), (packs + kTableThreads - 1) / kTableThreads);
  kernel<<<static_cast<unsigned>(blocks), kTableThreads, table_bytes<T>(), stream>>>(args);
}

template <typename T>
void launch_for_type(const BiasActArgs& args, cudaStream_t stream) {
  switch (args.activation) {
    case Activation::kGelu:
      launch_typed<T, Activation::kGelu>(args, stream);
      break;
    case Activation::kGeluTanh:
      launch_typed<T, Activation::kGeluTanh>(args, stream);
      break;
    case Activation::kQuickGelu:
      launch_typed<T, Activation::kQuickGelu>(args, stream);
      break;
    case Activation::kIdentity:
      break;  // never: launch_activation_by_table declines it
  }
}

}  // namespace

bool launch_activation_by_table(const BiasActArgs& args, cudaStream_t stream) {
  const bool sixteen_bit = args.type == ElementType::kFloat16 || args.type == ElementType::kBFloat16;
  const int64_t elements = args.rows * args.cols;
  // 32-bit pack indices: the grid's last step may pass `packs` by up to 4 strides of 135,168 threads.
  const bool indexable = elements / kPackElements < (int64_t{1} << 31);
  if (!sixteen_bit || args.activation == Activation::kIdentity || elements < kActivationTableMinElements ||
      !indexable || args.cols % kPackElements != 0 || !packs_fit(args.x.data, args.x.row_stride) ||
      !packs_fit(args.out.data, args.out.row_stride)) {
    return false;
  }
  if (args.type == ElementType::kBFloat16) {
    launch_for_type<__nv_bfloat16>(args, stream);
  } else {
    launch_for_type<__half>(args, stream);
  }
  return true;
}

}  // namespace clip_flash
