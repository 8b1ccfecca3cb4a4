// Torch-facing checks and launch of the image-resample kernel (csrc/image_resample.cu). The packing of
// the batch (pixels, meta rows, tap tables, value table) is done by clip_flash/ops/image_resample.py.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "check_message.h"
#include "image_resample.h"

namespace clip_flash {
namespace {

void check_cuda_contiguous(const at::Tensor& t, const at::Tensor& like, at::ScalarType type, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.device() == like.device(),
              check_message(name, " must be a CUDA tensor on ", like.device()));
  TORCH_CHECK(t.scalar_type() == type, check_message(name, " must be ", type, ", got ", t.scalar_type()));
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

}  // namespace

// Writes OpenCLIP's eval transform of every packed image into `out` (n, 3, H, W): float32, float16 or
// bfloat16, with `lut` (3, 256) of the same dtype.
void image_resample(const at::Tensor& pixels, const at::Tensor& meta, const at::Tensor& tables,
                    const at::Tensor& lut, at::Tensor& out) {
  TORCH_CHECK(out.is_cuda() && out.dim() == 4 && out.size(1) == 3 && out.is_contiguous(),
              check_message("out must be a contiguous CUDA tensor (n, 3, H, W), got ", out.sizes()));
  const at::ScalarType type = out.scalar_type();
  TORCH_CHECK(type == at::kFloat || type == at::kHalf || type == at::kBFloat16,
              check_message("out must be float32, float16 or bfloat16, got ", type));
  check_cuda_contiguous(pixels, out, at::kByte, "pixels");
  check_cuda_contiguous(meta, out, at::kLong, "meta");
  check_cuda_contiguous(tables, out, at::kInt, "tables");
  check_cuda_contiguous(lut, out, type, "lut");
  TORCH_CHECK(lut.numel() == 3 * 256, check_message("lut must have 3 x 256 entries, got ", lut.numel()));
  TORCH_CHECK(meta.dim() == 2 && meta.size(0) == out.size(0) && meta.size(1) == kImageMetaFields,
              check_message("meta must be (", out.size(0), ", ", static_cast<int>(kImageMetaFields), "), got ",
                            meta.sizes()));
  TORCH_CHECK(out.size(0) <= 65535, check_message("at most 65535 images per launch, got ", out.size(0)));
  TORCH_CHECK(out.size(2) <= INT32_MAX && out.size(3) <= kImageResampleMaxWidth,
              check_message("output width must be at most ", kImageResampleMaxWidth, ", got ", out.size(3)));
  const c10::cuda::CUDAGuard device_guard(out.device());
  ImageResampleArgs args;
  args.pixels = pixels.data_ptr<uint8_t>();
  args.meta = meta.data_ptr<int64_t>();
  args.tables = tables.data_ptr<int32_t>();
  args.lut = lut.data_ptr();
  args.out = out.data_ptr();
  args.images = out.size(0);
  args.out_h = static_cast<int>(out.size(2));
  args.out_w = static_cast<int>(out.size(3));
  args.word_bytes = type == at::kFloat ? 4 : 2;
  launch_image_resample(args, c10::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace clip_flash
