// Attention over packed short sequences (CLIP captions: at most 77 tokens): a warp per 16 queries of one sequence
// and head, on tensor cores, everything in registers. Generic variable-length kernels tile 128 x 128: for a
// 25-token caption they compute ~26x the scores needed and their time goes to blocks that are mostly padding.
// No torch headers here, so the .cu file compiles quickly.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "kernel_args.h"

namespace clip_flash {

// The kernel's limits, which the Python side declares again as data (clip_flash/ops/packed_attention.py).
constexpr int kPackedAttentionHeadDim = 64;
constexpr int kPackedAttentionMaxSeqLen = 128;  // the longest sequence tested; the kernel itself has no bound

// A (tokens, heads, head_dim) tensor with unit stride along head_dim.
struct TokenHeadMatrix {
  const void* data = nullptr;
  int64_t token_stride = 0;
  int64_t head_stride = 0;
};

// out[t, h] = softmax(scale * q[t, h] . k[s, h] over the s of t's sequence (s <= t when causal)) . v[s, h],
// sequences delimited by cu_seqlens (int32, sequences + 1 entries, on the device). Scores, softmax and sums in
// fp32; the probabilities are rounded to the element type before they meet v, as flash attention does.
struct PackedAttentionArgs {
  ElementType type = ElementType::kFloat16;  // kFloat16 or kBFloat16
  int64_t sequences = 0;
  int heads = 0;
  int max_seqlen = 0;  // at least the longest sequence, at most kPackedAttentionMaxSeqLen
  bool causal = true;
  float scale = 0.125f;
  const int32_t* cu_seqlens = nullptr;
  TokenHeadMatrix q;
  TokenHeadMatrix k;
  TokenHeadMatrix v;
  void* out = nullptr;  // contiguous (tokens, heads, head_dim)
};

// Pointers and strides must allow 16-byte loads (checked by the binding). Launch errors are left for the caller.
void launch_packed_attention(const PackedAttentionArgs& args, cudaStream_t stream);

}  // namespace clip_flash
