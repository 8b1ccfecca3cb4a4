// Attention over packed short sequences: one thread block (four warps) per sequence and head. The block stages
// the sequence's k and v rows of its head in shared memory (zeros past its end, up to a whole 16-row tile);
// each warp then takes 16-query tiles: scores on tensor cores (fp32 accumulate), a row softmax in fp32, the
// probabilities rounded to the element type and multiplied with v on tensor cores, the row sums applied last.
// A causal tile reads only the key tiles at or before it. A warp's query tile, its scores, its probabilities and
// its outputs take turns in one region of shared memory: small blocks, so that five fit on an SM at 77 tokens.
#include "packed_attention.h"

#include <mma.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernel_common.cuh"

namespace clip_flash {
namespace {

constexpr int kTile = 16;  // the WMMA tile edge
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kHeadDim = kPackedAttentionHeadDim;
constexpr int kRowPitch = kHeadDim + 8;  // elements between staged rows: skewed so tile loads avoid bank conflicts
constexpr int kChunksPerRow = kHeadDim * 2 / 16;  // 16-byte chunks in a row of 16-bit elements
constexpr float kLog2E = 1.4426950408889634f;

// Floats between rows of a warp's region: the tile's scores, then its probabilities (16-bit, each row over its
// own scores), then its 16 x head_dim outputs; before them, the query tile (16-bit rows of kRowPitch).
__host__ __device__ constexpr int region_pitch(int padded_len) {
  return (padded_len > kHeadDim ? padded_len : kHeadDim) + 4;
}

__host__ __device__ constexpr size_t shared_bytes(int padded_len) {
  return 2 * static_cast<size_t>(padded_len) * kRowPitch * 2              // k, v rows
         + static_cast<size_t>(kWarps) * kTile * region_pitch(padded_len) * 4  // a region per warp
         + static_cast<size_t>(kWarps) * kTile * 4;                       // a tile's inverse row sums per warp
}

// 16 bytes from global to shared memory without passing through registers (cp.async, compute capability 8.0);
// zeros instead where !valid (nothing is read then, but `from` must still be a valid address).
__device__ __forceinline__ void copy_16_bytes_async(void* to, const void* from, bool valid) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  const unsigned shared_address = static_cast<unsigned>(__cvta_generic_to_shared(to));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address), "l"(from),
               "r"(valid ? 16 : 0));
#endif
}

__device__ __forceinline__ void wait_for_async_copies() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::);
#endif
}

template <typename T>
__global__ void __launch_bounds__(kThreads) packed_attention_kernel(PackedAttentionArgs args, int padded_len) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // never launched there: the binding requires compute capability 8.0 (bf16 tensor-core tiles)
#else
  using namespace nvcuda;
  const int64_t sequence = blockIdx.x;
  const int head = blockIdx.y;
  const int start = args.cu_seqlens[sequence];
  const int length = args.cu_seqlens[sequence + 1] - start;
  if (length <= 0) return;
  T* out = static_cast<T*>(args.out);
  if (length > padded_len) {
    // max_seqlen understated the batch: mark this sequence's rows NaN rather than overrun shared memory.
    for (int index = threadIdx.x; index < length * kHeadDim; index += kThreads) {
      out[((start + index / kHeadDim) * static_cast<int64_t>(args.heads) + head) * kHeadDim + index % kHeadDim] =
          round_from_float<T>(__int_as_float(0x7fc00000));
    }
    return;
  }
  const int tiles = (length + kTile - 1) / kTile;
  const int rows = tiles * kTile;
  const int pitch = region_pitch(padded_len);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;

  extern __shared__ __align__(128) unsigned char shared[];
  T* k_rows = reinterpret_cast<T*>(shared);
  T* v_rows = k_rows + padded_len * kRowPitch;
  float* all_regions = reinterpret_cast<float*>(v_rows + padded_len * kRowPitch);
  float* all_inverse_sums = all_regions + kWarps * kTile * pitch;
  float* region = all_regions + warp * kTile * pitch;
  float* inverse_sums = all_inverse_sums + warp * kTile;

  // Every copy is issued before any is waited for: the block pays one memory latency, not one per copy. The
  // query tiles the warps take first come with them, each into its warp's region.
  const int chunks = rows * kChunksPerRow;
  for (int index = threadIdx.x; index < 3 * chunks; index += kThreads) {
    const int which = index / chunks;  // 0: q, 1: k, 2: v
    const int row = (index - which * chunks) / kChunksPerRow;
    const int chunk = index % kChunksPerRow;
    T* to;
    if (which == 0) {
      if (row >= kWarps * kTile) continue;  // a later tile's queries: its warp copies them when it gets there
      to = reinterpret_cast<T*>(all_regions + (row / kTile) * kTile * pitch) + (row % kTile) * kRowPitch;
    } else {
      to = (which == 1 ? k_rows : v_rows) + row * kRowPitch;
    }
    // Selected field by field: an indexed array of the three would live in local memory.
    const void* data = which == 0 ? args.q.data : which == 1 ? args.k.data : args.v.data;
    const int64_t token_stride = which == 0 ? args.q.token_stride : which == 1 ? args.k.token_stride
                                                                              : args.v.token_stride;
    const int64_t head_stride = which == 0 ? args.q.head_stride : which == 1 ? args.k.head_stride
                                                                            : args.v.head_stride;
    const T* from = static_cast<const T*>(data) + (start + min(row, length - 1)) * token_stride + head * head_stride;
    copy_16_bytes_async(to + chunk * kPackElements, from + chunk * kPackElements, row < length);
  }
  wait_for_async_copies();
  __syncthreads();

  T* region_rows = reinterpret_cast<T*>(region);  // the query tile, kRowPitch apart
  T* probabilities = reinterpret_cast<T*>(region);  // row r at the start of score row r
  const int probability_pitch = 2 * pitch;
  const float scale_log2 = args.scale * kLog2E;

  using QueryTile = wmma::fragment<wmma::matrix_a, kTile, kTile, kTile, T, wmma::row_major>;
  using KeyTile = wmma::fragment<wmma::matrix_b, kTile, kTile, kTile, T, wmma::col_major>;  // k transposed
  using ValueTile = wmma::fragment<wmma::matrix_b, kTile, kTile, kTile, T, wmma::row_major>;
  using Accumulator = wmma::fragment<wmma::accumulator, kTile, kTile, kTile, float>;

  for (int tile = warp; tile < tiles; tile += kWarps) {
    const int key_tiles = args.causal ? tile + 1 : tiles;
    const int columns = key_tiles * kTile;

    if (tile >= kWarps) {  // this warp's second tile or later: copy its queries into the region now
      for (int index = lane; index < kTile * kChunksPerRow; index += 32) {
        const int row = tile * kTile + index / kChunksPerRow;
        const int chunk = index % kChunksPerRow;
        const T* from = static_cast<const T*>(args.q.data) + (start + min(row, length - 1)) * args.q.token_stride +
                        head * args.q.head_stride;
        copy_16_bytes_async(region_rows + (index / kChunksPerRow) * kRowPitch + chunk * kPackElements,
                            from + chunk * kPackElements, row < length);
      }
      wait_for_async_copies();
      __syncwarp();
    }
    QueryTile query[kHeadDim / kTile];
#pragma unroll
    for (int d = 0; d < kHeadDim / kTile; ++d) {
      wmma::load_matrix_sync(query[d], region_rows + d * kTile, kRowPitch);
    }
    __syncwarp();  // the queries are in registers before the scores overwrite them
    for (int key_tile = 0; key_tile < key_tiles; ++key_tile) {
      Accumulator accumulator;
      wmma::fill_fragment(accumulator, 0.0f);
#pragma unroll
      for (int d = 0; d < kHeadDim / kTile; ++d) {
        KeyTile key;
        wmma::load_matrix_sync(key, k_rows + key_tile * kTile * kRowPitch + d * kTile, kRowPitch);
        wmma::mma_sync(accumulator, query[d], key, accumulator);
      }
      wmma::store_matrix_sync(region + key_tile * kTile, accumulator, pitch, wmma::mem_row_major);
    }
    __syncwarp();

    {
      // Softmax in fp32, two lanes a row, each over every other column.
      const int r = lane / 2;
      const int parity = lane % 2;
      const int position = tile * kTile + r;
      const int visible = args.causal ? min(position + 1, length) : length;  // at least 1
      const float* row_scores = region + r * pitch;
      float row_max = -INFINITY;
      for (int column = parity; column < visible; column += 2) row_max = fmaxf(row_max, row_scores[column]);
      row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 1));
      T* row_probabilities = probabilities + r * probability_pitch;
      float row_sum = 0.0f;
      // Probability `column` lands on the bytes of score column / 2, which both lanes of the row read by step
      // column / 2 of this loop: a warp barrier between each step's reads and writes keeps every read first.
      // Every lane takes the same number of steps (columns is even), as the barrier needs.
      for (int column = parity; column < columns; column += 2) {
        const float p = column < visible ? exp2f((row_scores[column] - row_max) * scale_log2) : 0.0f;
        __syncwarp();
        row_probabilities[column] = round_from_float<T>(p);
        row_sum += p;
      }
      row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 1);
      if (parity == 0) inverse_sums[r] = 1.0f / row_sum;
    }
    __syncwarp();

    Accumulator output[kHeadDim / kTile];
#pragma unroll
    for (int n = 0; n < kHeadDim / kTile; ++n) wmma::fill_fragment(output[n], 0.0f);
    for (int key_tile = 0; key_tile < key_tiles; ++key_tile) {
      QueryTile probability;  // the same fragment shape as a query tile: 16 rows, row-major
      wmma::load_matrix_sync(probability, probabilities + key_tile * kTile, probability_pitch);
#pragma unroll
      for (int n = 0; n < kHeadDim / kTile; ++n) {
        ValueTile value;
        wmma::load_matrix_sync(value, v_rows + key_tile * kTile * kRowPitch + n * kTile, kRowPitch);
        wmma::mma_sync(output[n], probability, value, output[n]);
      }
    }
#pragma unroll
    for (int n = 0; n < kHeadDim / kTile; ++n) {
      wmma::store_matrix_sync(region + n * kTile, output[n], pitch, wmma::mem_row_major);
    }
    __syncwarp();

    for (int index = lane; index < kTile * kChunksPerRow; index += 32) {
      const int r = index / kChunksPerRow;
      const int chunk = index % kChunksPerRow;
      const int position = tile * kTile + r;
      if (position >= length) continue;
      const float inverse = inverse_sums[r];
      Pack<T, kPackElements> pack;
#pragma unroll
      for (int j = 0; j < kPackElements; ++j) {
        pack.values[j] = round_from_float<T>(region[r * pitch + chunk * kPackElements + j] * inverse);
      }
      store_pack(out + ((start + position) * static_cast<int64_t>(args.heads) + head) * kHeadDim +
                     chunk * kPackElements, pack);
    }
    __syncwarp();  // the outputs are stored before the next tile's queries overwrite them
  }
#endif
}

template <typename T>
void launch_typed(const PackedAttentionArgs& args, cudaStream_t stream) {
  const int padded_len = (args.max_seqlen + kTile - 1) / kTile * kTile;
  const size_t bytes = shared_bytes(padded_len);
  // Above 48 KiB a block's shared memory must be allowed explicitly (a per-function attribute, no stream work).
  cudaFuncSetAttribute(packed_attention_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       static_cast<int>(shared_bytes(kPackedAttentionMaxSeqLen)));
  const dim3 grid(static_cast<unsigned>(args.sequences), static_cast<unsigned>(args.heads));
  packed_attention_kernel<T><<<grid, kThreads, bytes, stream>>>(args, padded_len);
}

}  // namespace

void launch_packed_attention(const PackedAttentionArgs& args, cudaStream_t stream) {
  if (args.type == ElementType::kBFloat16) {
    launch_typed<__nv_bfloat16>(args, stream);
  } else {
    launch_typed<__half>(args, stream);
  }
}

}  // namespace clip_flash
