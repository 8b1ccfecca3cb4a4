// Torch-facing checks and launch of the packed short-sequence attention kernel (csrc/packed_attention.cu).
// clip_flash/ops/packed_attention.py decides when a call goes here; these checks keep a wrong call from
// reading out of bounds.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "check_message.h"
#include "packed_attention.h"

namespace clip_flash {
namespace {

TokenHeadMatrix token_head_matrix(const at::Tensor& t, const at::Tensor& like, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.device() == like.device(), check_message(name, " must be a CUDA tensor on ",
                                                                        like.device()));
  TORCH_CHECK(t.dim() == 3 && t.sizes() == like.sizes(),
              check_message(name, " must have shape ", like.sizes(), " (tokens, heads, head_dim), got ", t.sizes()));
  TORCH_CHECK(t.scalar_type() == like.scalar_type(), check_message(name, " must be ", like.scalar_type()));
  TORCH_CHECK(t.stride(2) == 1 && t.stride(0) % 8 == 0 && t.stride(1) % 8 == 0 &&
                  reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 == 0,
              check_message(name, " must have a contiguous head_dim and 16-byte aligned rows, got strides ",
                            t.strides()));
  return {t.const_data_ptr(), t.stride(0), t.stride(1)};
}

}  // namespace

// A new contiguous (tokens, heads, head_dim) tensor: softmax(scale q k^T) v within each packed sequence.
at::Tensor packed_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& cu_seqlens, int64_t max_seqlen, bool causal, double scale) {
  const at::ScalarType type = q.scalar_type();
  TORCH_CHECK(type == at::kHalf || type == at::kBFloat16,
              check_message("packed_attention takes float16 or bfloat16, got ", type));
  TORCH_CHECK(q.dim() == 3 && q.size(2) == kPackedAttentionHeadDim,
              check_message("q must be (tokens, heads, ", kPackedAttentionHeadDim, "), got ", q.sizes()));
  TORCH_CHECK(max_seqlen >= 1 && max_seqlen <= kPackedAttentionMaxSeqLen,
              check_message("max_seqlen must be 1 to ", kPackedAttentionMaxSeqLen, ", got ", max_seqlen));
  TORCH_CHECK(cu_seqlens.is_cuda() && cu_seqlens.device() == q.device() && cu_seqlens.scalar_type() == at::kInt &&
                  cu_seqlens.dim() == 1 && cu_seqlens.size(0) >= 1 && cu_seqlens.is_contiguous(),
              "cu_seqlens must be a contiguous 1-D int32 CUDA tensor on q's device");
  TORCH_CHECK((cu_seqlens.size(0) - 1) * q.size(1) <= INT32_MAX,
              check_message("too many sequences times heads: ", cu_seqlens.size(0) - 1, " x ", q.size(1)));
  const c10::cuda::CUDAGuard device_guard(q.device());
  int major = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, q.device().index()));
  TORCH_CHECK(major >= 8, check_message("packed_attention needs compute capability 8.0 or newer, got major ", major));
  PackedAttentionArgs args;
  args.type = type == at::kHalf ? ElementType::kFloat16 : ElementType::kBFloat16;
  args.q = token_head_matrix(q, q, "q");
  args.k = token_head_matrix(k, q, "k");
  args.v = token_head_matrix(v, q, "v");
  at::Tensor out = at::empty(q.sizes(), q.options());
  args.sequences = cu_seqlens.size(0) - 1;
  args.heads = static_cast<int>(q.size(1));
  args.max_seqlen = static_cast<int>(max_seqlen);
  args.causal = causal;
  args.scale = static_cast<float>(scale);
  args.cu_seqlens = cu_seqlens.const_data_ptr<int32_t>();
  args.out = out.mutable_data_ptr();
  if (args.sequences == 0 || q.size(0) == 0 || args.heads == 0) return out;
  launch_packed_attention(args, c10::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace clip_flash
