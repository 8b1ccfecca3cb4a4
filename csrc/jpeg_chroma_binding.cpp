// Torch-facing checks and launch of the fast path's chroma step (csrc/jpeg_chroma.cu).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "jpeg_chroma.h"

namespace clip_flash {

// nvJPEG's (n, H, W, 3) uint8 RGB of 4:2:2 (horizontal 2, vertical 1) or 4:2:0 (2, 2) JPEGs, with the
// chroma re-upsampled and converted the way libjpeg-turbo does; returns a new tensor of the same shape.
at::Tensor jpeg_chroma(const at::Tensor& rgb, int64_t horizontal, int64_t vertical) {
  TORCH_CHECK(rgb.is_cuda() && rgb.scalar_type() == at::kByte && rgb.is_contiguous() && rgb.dim() == 4 &&
                  rgb.size(3) == 3,
              "rgb must be a contiguous CUDA uint8 tensor (n, H, W, 3), got ", rgb.sizes(), " ", rgb.scalar_type());
  TORCH_CHECK(horizontal == 2 && (vertical == 1 || vertical == 2),
              "chroma factors must be (2, 1) or (2, 2), got (", horizontal, ", ", vertical, ")");
  TORCH_CHECK(rgb.size(1) > 0 && rgb.size(2) > 0 && rgb.size(1) <= INT32_MAX / 4 && rgb.size(2) <= INT32_MAX / 4,
              "image size out of range: ", rgb.sizes());
  const c10::cuda::CUDAGuard device_guard(rgb.device());
  at::Tensor out = at::empty_like(rgb);
  if (rgb.size(0) == 0) {
    return out;
  }
  JpegChromaArgs args;
  args.images = rgb.size(0);
  args.height = static_cast<int>(rgb.size(1));
  args.width = static_cast<int>(rgb.size(2));
  args.horizontal = static_cast<int>(horizontal);
  args.vertical = static_cast<int>(vertical);
  args.rows = (args.height + args.vertical - 1) / args.vertical;
  args.cols = (args.width + args.horizontal - 1) / args.horizontal;
  at::Tensor chroma = at::empty({args.images, args.rows, args.cols, 2}, rgb.options());
  args.rgb = rgb.data_ptr<uint8_t>();
  args.chroma = chroma.data_ptr<uint8_t>();
  args.out = out.data_ptr<uint8_t>();
  launch_jpeg_chroma(args, c10::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace clip_flash
