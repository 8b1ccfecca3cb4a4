// Torch-facing checks and launch of the exact path's GPU half of JPEG decoding (csrc/jpeg_dct.cu). Like the
// nvJPEG call, it reports a bad argument as text rather than raising (see csrc/nvjpeg_decode.cpp).
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <string>

#include "jpeg_dct.h"

namespace clip_flash {
namespace {

bool on_device_contiguous(const at::Tensor& t, const at::Tensor& like, at::ScalarType type) {
  return t.is_cuda() && t.device() == like.device() && t.scalar_type() == type && t.is_contiguous();
}

}  // namespace

// Decodes every image the table describes from `coefficients` into `pixels` (both flat uint8 on one GPU),
// through the `planes` scratch; returns why it could not (empty: queued on the current stream).
std::string jpeg_dct_to_pixels(const at::Tensor& coefficients, const at::Tensor& table, const at::Tensor& planes,
                               const at::Tensor& pixels, int64_t max_blocks, int64_t max_pixels) {
  if (!on_device_contiguous(coefficients, pixels, at::kByte) || !on_device_contiguous(planes, pixels, at::kByte) ||
      !pixels.is_cuda() || pixels.scalar_type() != at::kByte || !pixels.is_contiguous()) {
    return "coefficients, planes and pixels must be contiguous uint8 tensors on one CUDA device";
  }
  if (!on_device_contiguous(table, pixels, at::kLong) || table.dim() != 2 || table.size(1) != kDctImageFields) {
    return "table must be a contiguous int64 CUDA tensor of " + std::to_string(kDctImageFields) + " columns";
  }
  if (table.size(0) > 65535 / kDctMaxComponents || max_blocks < 0 || max_pixels < 0 ||
      max_blocks > (int64_t{1} << 40) || max_pixels > (int64_t{1} << 40)) {
    return "too many images (at most " + std::to_string(65535 / kDctMaxComponents) + ") or sizes out of range";
  }
  if (reinterpret_cast<uintptr_t>(coefficients.data_ptr()) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(planes.data_ptr()) % 8 != 0) {
    return "coefficients must be 16-byte aligned and planes 8-byte aligned";
  }
  const c10::cuda::CUDAGuard device_guard(pixels.device());
  JpegDctArgs args{};
  args.coefficients = coefficients.data_ptr<uint8_t>();
  args.table = table.data_ptr<int64_t>();
  args.planes = planes.data_ptr<uint8_t>();
  args.pixels = pixels.data_ptr<uint8_t>();
  args.images = table.size(0);
  args.max_blocks = max_blocks;
  args.max_pixels = max_pixels;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(pixels.device().index()).stream();
  launch_jpeg_dct(args, stream);
  const cudaError_t status = cudaGetLastError();
  return status == cudaSuccess ? "" : std::string("jpeg_dct launch failed: ") + cudaGetErrorString(status);
}

}  // namespace clip_flash
