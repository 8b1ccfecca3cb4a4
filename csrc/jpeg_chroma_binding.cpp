// Torch-facing checks and launch of the fast path's chroma step (csrc/jpeg_chroma.cu).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <string>

#include "check_message.h"
#include "jpeg_chroma.h"

namespace clip_flash {

// nvJPEG's (n, H, W, 3) uint8 RGB of 4:2:2 (horizontal 2, vertical 1) or 4:2:0 (2, 2) JPEGs, with the
// chroma re-upsampled and converted the way libjpeg-turbo does; returns a new tensor of the same shape.
at::Tensor jpeg_chroma(const at::Tensor& rgb, int64_t horizontal, int64_t vertical) {
  TORCH_CHECK(rgb.is_cuda() && rgb.scalar_type() == at::kByte && rgb.is_contiguous() && rgb.dim() == 4 &&
                  rgb.size(3) == 3,
              check_message("rgb must be a contiguous CUDA uint8 tensor (n, H, W, 3), got ", rgb.sizes(), " ",
                            rgb.scalar_type()));
  TORCH_CHECK(horizontal == 2 && (vertical == 1 || vertical == 2),
              check_message("chroma factors must be (2, 1) or (2, 2), got (", horizontal, ", ", vertical, ")"));
  TORCH_CHECK(rgb.size(1) > 0 && rgb.size(2) > 0 && rgb.size(1) <= INT32_MAX / 4 && rgb.size(2) <= INT32_MAX / 4,
              check_message("image size out of range: ", rgb.sizes()));
  const c10::cuda::CUDAGuard device_guard(rgb.device());
  at::Tensor out = at::empty_like(rgb);
  if (rgb.size(0) == 0) {
    return out;
  }
  JpegChromaArgs args{};
  args.images = rgb.size(0);
  args.height = static_cast<int>(rgb.size(1));
  args.width = static_cast<int>(rgb.size(2));
  args.horizontal = static_cast<int>(horizontal);
  args.vertical = static_cast<int>(vertical);
  args.rows = (args.height + args.vertical - 1) / args.vertical;
  args.cols = (args.width + args.horizontal - 1) / args.horizontal;
  args.max_blocks = static_cast<int64_t>(args.rows) * args.cols;
  args.max_pixels = static_cast<int64_t>(args.height) * args.width;
  at::Tensor chroma = at::empty({args.images, args.rows, args.cols, 2}, rgb.options());
  args.rgb = rgb.data_ptr<uint8_t>();
  args.chroma = chroma.data_ptr<uint8_t>();
  args.out = out.data_ptr<uint8_t>();
  launch_jpeg_chroma(args, c10::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

// The same step in place on a packed batch: `pixels` a 1-D CUDA uint8 buffer, `images` a CPU int64 (n, 5) of
// (byte offset of the image's (H, W, 3) RGB in `pixels`, H, W, horizontal, vertical) per image to refine.
// One launch pair for the whole batch, whatever the sizes; the per-image table goes up with one copy.
// Runs without the GIL, and reports a bad argument by returning why (empty: done). Its messages are joined as
// std::string: on the H100 machine, a message with numbers put together by c10::str (as TORCH_CHECK does) in
// this extension crashed the process (segmentation fault), where messages of text alone did not.
std::string jpeg_chroma_packed(const at::Tensor& pixels, const at::Tensor& images) {
  if (!(pixels.is_cuda() && pixels.scalar_type() == at::kByte && pixels.is_contiguous() && pixels.dim() == 1)) {
    return "pixels must be a contiguous 1-D CUDA uint8 tensor";
  }
  if (!(!images.is_cuda() && images.scalar_type() == at::kLong && images.is_contiguous() && images.dim() == 2 &&
        images.size(1) == 5)) {
    return "images must be a contiguous CPU int64 tensor (n, 5): offset, height, width, horizontal, vertical";
  }
  const int64_t n = images.size(0);
  if (n == 0) {
    return "";
  }
  // Everything is checked before anything is allocated.
  const int64_t* given = images.data_ptr<int64_t>();
  for (int64_t image = 0; image < n; ++image) {
    const int64_t* in = given + image * 5;
    const int64_t offset = in[0], height = in[1], width = in[2], horizontal = in[3], vertical = in[4];
    if (!(horizontal == 2 && (vertical == 1 || vertical == 2))) {
      return "image " + std::to_string(image) + ": chroma factors must be (2, 1) or (2, 2), got (" +
             std::to_string(horizontal) + ", " + std::to_string(vertical) + ")";
    }
    if (!(height > 0 && width > 0 && height <= INT32_MAX / 4 && width <= INT32_MAX / 4 && offset >= 0 &&
          offset + height * width * 3 <= pixels.numel())) {
      return "image " + std::to_string(image) + ": " + std::to_string(height) + "x" + std::to_string(width) +
             " at byte " + std::to_string(offset) + " lies outside the buffer";
    }
  }
  const c10::cuda::CUDAGuard device_guard(pixels.device());
  at::Tensor table = at::empty({n, kChromaTableFields}, images.options().pinned_memory(true));
  int64_t* rows = table.data_ptr<int64_t>();
  int64_t chroma_bytes = 0, max_blocks = 0, max_pixels = 0;
  for (int64_t image = 0; image < n; ++image) {
    const int64_t* in = given + image * 5;
    const int64_t offset = in[0], height = in[1], width = in[2], horizontal = in[3], vertical = in[4];
    int64_t* row = rows + image * kChromaTableFields;
    const int64_t blocks = ((height + vertical - 1) / vertical) * ((width + horizontal - 1) / horizontal);
    row[kPixelOffset] = offset;
    row[kChromaOffset] = chroma_bytes;
    row[kHeight] = height;
    row[kWidth] = width;
    row[kHorizontal] = horizontal;
    row[kVertical] = vertical;
    chroma_bytes += blocks * 2;
    max_blocks = std::max(max_blocks, blocks);
    max_pixels = std::max(max_pixels, height * width);
  }
  at::Tensor on_device = table.to(pixels.device(), /*non_blocking=*/true);
  at::Tensor chroma = at::empty({chroma_bytes}, pixels.options());
  JpegChromaArgs args{};
  args.rgb = pixels.data_ptr<uint8_t>();
  args.out = pixels.data_ptr<uint8_t>();
  args.chroma = chroma.data_ptr<uint8_t>();
  args.table = on_device.data_ptr<int64_t>();
  args.images = n;
  args.max_blocks = max_blocks;
  args.max_pixels = max_pixels;
  launch_jpeg_chroma(args, c10::cuda::getCurrentCUDAStream());
  const cudaError_t launched = cudaGetLastError();
  return launched == cudaSuccess ? "" : std::string("CUDA kernel launch failed: ") + cudaGetErrorString(launched);
}

}  // namespace clip_flash
