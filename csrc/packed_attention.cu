// Attention over packed short sequences, held in registers: a warp takes 16 queries of one sequence and head and
// walks that sequence's keys 16 at a time with flash attention's running softmax, the scores and the outputs on
// tensor cores (mma.sync m16n8k16, fp32 accumulate). A block is two warps on one sequence and head; they take
// its query tiles in turn, and a causal tile reads only the key tiles at or before it.
//
// q, k and v are read straight from global memory in 16-byte loads, with no shared memory and no block barrier:
// a lane's fragments are made contiguous by permuting the head dims. The scores sum over the dims, so q and k
// only need the same permutation (lane t of a quad holds dims 16t..16t+15 of its rows); in the product with v
// the output dim a lane owns is chosen so that it reads 8 consecutive dims of a v row (8g..8g+7 for lane group
// g) and writes 16 consecutive dims of its output rows. Small blocks and no staging let many warps wait on
// memory at once: on an H200, one call over 1,024 web captions takes 57 us against 108 for a kernel staging each
// sequence in shared memory (benchmarks/results/h200/register_attention_49579a6); moving q, k, v and out once
// would take about 33 us at the memory's rate.
#include "packed_attention.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernel_common.cuh"

namespace clip_flash {
namespace {

constexpr int kTile = 16;  // queries a warp takes, and keys a step of its walk
constexpr int kWarps = 2;
constexpr int kThreads = kWarps * 32;
constexpr int kMinBlocksPerSm = 8;  // at most 128 registers a thread: 16 warps an SM to hide memory latency
constexpr int kHeadDim = kPackedAttentionHeadDim;
constexpr int kDimsPerLane = 16;  // q and k dims a lane of a quad holds, for each of its rows
constexpr float kLog2E = 1.4426950408889634f;

static_assert(kHeadDim == 4 * kDimsPerLane, "a quad's four lanes cover a head's dims");

// 16 dims of one row, as eight pairs (the 32-bit registers an mma operand takes).
struct RowSlice {
  uint32_t pairs[8];
};

// Row `row` of a sequence at `base` (already offset to the lane's first dim), or zeros past the sequence's end,
// which no score keeps (their probability is 0, and 0 x 0 stays 0 where 0 x inf would not).
__device__ __forceinline__ RowSlice load_row_slice(const void* base, int64_t token_stride, int row, int length) {
  RowSlice slice;
  uint4 low = make_uint4(0, 0, 0, 0);
  uint4 high = low;
  if (row < length) {
    const uint4* from = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(base) + row * token_stride);
    low = __ldg(from);
    high = __ldg(from + 1);
  }
  slice.pairs[0] = low.x, slice.pairs[1] = low.y, slice.pairs[2] = low.z, slice.pairs[3] = low.w;
  slice.pairs[4] = high.x, slice.pairs[5] = high.y, slice.pairs[6] = high.z, slice.pairs[7] = high.w;
  return slice;
}

__device__ __forceinline__ uint4 load_eight(const void* base, int64_t token_stride, int row, int length) {
  if (row >= length) return make_uint4(0, 0, 0, 0);
  return __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(base) + row * token_stride));
}

__device__ __forceinline__ uint32_t word(const uint4& v, int index) {
  return index == 0 ? v.x : index == 1 ? v.y : index == 2 ? v.z : v.w;
}

// d += a b for a 16 x 16 tile a (row-major) and a 16 x 8 tile b (column-major), fp32 accumulate.
template <typename T>
__device__ __forceinline__ void mma_16x8x16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma_16x8x16<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                     uint32_t b1) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

template <>
__device__ __forceinline__ void mma_16x8x16<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                            uint32_t b1) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Two floats rounded to the element type, the first in the low half (an mma operand's lower index).
template <typename T>
__device__ __forceinline__ uint32_t round_pair(float low, float high);

template <>
__device__ __forceinline__ uint32_t round_pair<__half>(float low, float high) {
  const __half2 pair = __floats2half2_rn(low, high);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

template <>
__device__ __forceinline__ uint32_t round_pair<__nv_bfloat16>(float low, float high) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

__device__ __forceinline__ float quad_max(float value) {
  value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 1));
  return fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 2));
}

__device__ __forceinline__ float quad_sum(float value) {
  value += __shfl_xor_sync(0xffffffffu, value, 1);
  return value + __shfl_xor_sync(0xffffffffu, value, 2);
}

template <typename T>
__device__ __forceinline__ void store_output_row(T* to, const float (&out)[8][4], int first, float inverse_sum) {
  // Accumulator entries `first` (dims 16t..16t+7) and `first` + 1 (dims 16t+8..16t+15) of each n8 tile j.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    Pack<T, kPackElements> pack;
#pragma unroll
    for (int j = 0; j < 8; ++j) pack.values[j] = round_from_float<T>(out[j][first + half] * inverse_sum);
    store_pack(to + half * kPackElements, pack);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm) packed_attention_kernel(PackedAttentionArgs args) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // never launched there: the binding requires compute capability 8.0 (bf16 tensor-core tiles)
#else
  // A sequence's heads in consecutive blocks: together they read whole rows of q, k and v.
  const int64_t sequence = blockIdx.x / args.heads;
  const int head = static_cast<int>(blockIdx.x % args.heads);
  const int start = args.cu_seqlens[sequence];
  const int length = args.cu_seqlens[sequence + 1] - start;
  if (length <= 0) return;
  T* out = static_cast<T*>(args.out);
  const int64_t out_token_stride = static_cast<int64_t>(args.heads) * kHeadDim;
  if (length > args.max_seqlen) {
    // max_seqlen understated the batch (the caller's promise broken): mark this sequence's rows NaN.
    for (int index = threadIdx.x; index < length * kHeadDim; index += kThreads) {
      out[(start + index / kHeadDim) * out_token_stride + head * kHeadDim + index % kHeadDim] =
          round_from_float<T>(__int_as_float(0x7fc00000));
    }
    return;
  }
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int group = lane / 4;  // the mma fragments' row (and k's column) within an 8-row half
  const int quad_lane = lane % 4;
  const int tiles = (length + kTile - 1) / kTile;
  const float scale_log2 = args.scale * kLog2E;

  const T* q_base = static_cast<const T*>(args.q.data) + start * args.q.token_stride + head * args.q.head_stride +
                    quad_lane * kDimsPerLane;
  const T* k_base = static_cast<const T*>(args.k.data) + start * args.k.token_stride + head * args.k.head_stride +
                    quad_lane * kDimsPerLane;
  const T* v_base = static_cast<const T*>(args.v.data) + start * args.v.token_stride + head * args.v.head_stride +
                    group * kPackElements;
  T* out_base = out + start * out_token_stride + head * kHeadDim + quad_lane * kDimsPerLane;

  for (int tile = warp; tile < tiles; tile += kWarps) {
    const int row_low = tile * kTile + group;  // this lane's two query rows
    const int row_high = row_low + 8;
    const RowSlice q_low = load_row_slice(q_base, args.q.token_stride, row_low, length);
    const RowSlice q_high = load_row_slice(q_base, args.q.token_stride, row_high, length);

    float out_tile[8][4];  // n8 tile j: dims 16t + j and 16t + 8 + j of rows low (0, 1) and high (2, 3)
#pragma unroll
    for (int j = 0; j < 8; ++j) out_tile[j][0] = out_tile[j][1] = out_tile[j][2] = out_tile[j][3] = 0.0f;
    float max_low = -INFINITY, max_high = -INFINITY;  // running maxima of the scaled scores (log2 units)
    float sum_low = 0.0f, sum_high = 0.0f;            // this lane's share of the running sums

    const int key_tiles = args.causal ? tile + 1 : tiles;
    for (int key_tile = 0; key_tile < key_tiles; ++key_tile) {
      const int key0 = key_tile * kTile;
      const RowSlice k_low = load_row_slice(k_base, args.k.token_stride, key0 + group, length);
      const RowSlice k_high = load_row_slice(k_base, args.k.token_stride, key0 + 8 + group, length);
      // v rows 2t, 2t+1, 2t+8, 2t+9 of the tile (the keys of this lane's probabilities), dims 8g..8g+7.
      const uint4 v_rows[4] = {load_eight(v_base, args.v.token_stride, key0 + 2 * quad_lane, length),
                               load_eight(v_base, args.v.token_stride, key0 + 2 * quad_lane + 1, length),
                               load_eight(v_base, args.v.token_stride, key0 + 2 * quad_lane + 8, length),
                               load_eight(v_base, args.v.token_stride, key0 + 2 * quad_lane + 9, length)};

      float scores[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};  // keys 8n + 2t (+1)
#pragma unroll
      for (int step = 0; step < 4; ++step) {
        const uint32_t a[4] = {q_low.pairs[2 * step], q_high.pairs[2 * step], q_low.pairs[2 * step + 1],
                               q_high.pairs[2 * step + 1]};
        mma_16x8x16<T>(scores[0], a, k_low.pairs[2 * step], k_low.pairs[2 * step + 1]);
        mma_16x8x16<T>(scores[1], a, k_high.pairs[2 * step], k_high.pairs[2 * step + 1]);
      }

      float tile_max_low = -INFINITY, tile_max_high = -INFINITY;
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = key0 + 8 * n + 2 * quad_lane + (e & 1);
          const int row = e < 2 ? row_low : row_high;
          const bool visible = key < length && (!args.causal || key <= row);
          scores[n][e] = visible ? scores[n][e] * scale_log2 : -INFINITY;
        }
        tile_max_low = fmaxf(tile_max_low, fmaxf(scores[n][0], scores[n][1]));
        tile_max_high = fmaxf(tile_max_high, fmaxf(scores[n][2], scores[n][3]));
      }
      // Key 0 is visible to every row, so the maxima are finite from the first tile on.
      const float new_max_low = fmaxf(max_low, quad_max(tile_max_low));
      const float new_max_high = fmaxf(max_high, quad_max(tile_max_high));
      const float rescale_low = exp2f(max_low - new_max_low);  // 0 on the first tile
      const float rescale_high = exp2f(max_high - new_max_high);
      max_low = new_max_low;
      max_high = new_max_high;

      float p[2][4];
#pragma unroll
      for (int n = 0; n < 2; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) p[n][e] = exp2f(scores[n][e] - (e < 2 ? max_low : max_high));
      }
      sum_low = sum_low * rescale_low + p[0][0] + p[0][1] + p[1][0] + p[1][1];
      sum_high = sum_high * rescale_high + p[0][2] + p[0][3] + p[1][2] + p[1][3];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        out_tile[j][0] *= rescale_low, out_tile[j][1] *= rescale_low;
        out_tile[j][2] *= rescale_high, out_tile[j][3] *= rescale_high;
      }

      // The scores' accumulator layout is the probabilities' operand layout: rounded to the element type here.
      const uint32_t probabilities[4] = {round_pair<T>(p[0][0], p[0][1]), round_pair<T>(p[0][2], p[0][3]),
                                         round_pair<T>(p[1][0], p[1][1]), round_pair<T>(p[1][2], p[1][3])};
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        // Dim 8g + j of rows (2t, 2t+1) and (2t+8, 2t+9): the low or high halves of word j / 2.
        const unsigned selector = (j & 1) ? 0x7632u : 0x5410u;
        const uint32_t b0 = __byte_perm(word(v_rows[0], j / 2), word(v_rows[1], j / 2), selector);
        const uint32_t b1 = __byte_perm(word(v_rows[2], j / 2), word(v_rows[3], j / 2), selector);
        mma_16x8x16<T>(out_tile[j], probabilities, b0, b1);
      }
    }

    const float inverse_sum_low = 1.0f / quad_sum(sum_low);  // every lane of a quad shuffles, stored or not
    const float inverse_sum_high = 1.0f / quad_sum(sum_high);
    if (row_low < length) store_output_row<T>(out_base + row_low * out_token_stride, out_tile, 0, inverse_sum_low);
    if (row_high < length) {
      store_output_row<T>(out_base + row_high * out_token_stride, out_tile, 2, inverse_sum_high);
    }
  }
#endif
}

template <typename T>
void launch_typed(const PackedAttentionArgs& args, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>(args.sequences * args.heads);  // the binding keeps it < 2^31
  packed_attention_kernel<T><<<blocks, kThreads, 0, stream>>>(args);
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
