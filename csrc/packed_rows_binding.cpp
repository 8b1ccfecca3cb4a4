// A packed batch's whole device step in one call: the layout's head (meta rows, tap tables) and pixel runs, and its
// JPEGs' coefficients with the JPEG kernels' table, go up from page-locked memory; the JPEG kernels write their
// pixels into the layout; the resize kernel writes the rows. The same copies and launches as
// clip_flash/ops/image_resample.py's resample_packed with a DctBatch fill, which made them in about forty Python-level
// calls: in a server at 50 one-JPEG requests/s the step's host time went from 0.62-0.77 to 0.37-0.41 ms
// (benchmarks/results/h200/packed_rows_828731e).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <string>
#include <vector>

#include "check_message.h"
#include "image_resample.h"
#include "jpeg_dct.h"

namespace clip_flash {

// Defined in image_resample_binding.cpp and jpeg_dct_binding.cpp.
void image_resample(const at::Tensor& pixels, const at::Tensor& meta, const at::Tensor& tables,
                    const at::Tensor& lut, at::Tensor& out);
std::string jpeg_dct_to_pixels(const at::Tensor& coefficients, const at::Tensor& table, const at::Tensor& planes,
                               const at::Tensor& pixels, int64_t max_blocks, int64_t max_pixels);

namespace {

constexpr int64_t kCoefficientAlign = 128;  // jpeg_dct.py's ALIGN: each source starts at a multiple of it

int64_t aligned(int64_t size) { return (size + kCoefficientAlign - 1) / kCoefficientAlign * kCoefficientAlign; }

void check_host_bytes(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kByte && t.dim() == 1 && t.is_contiguous(),
              check_message(name, " must be a contiguous 1-D uint8 host tensor"));
}

void used_on(const at::Tensor& t, const c10::cuda::CUDAStream& stream) {
  if (t.defined()) c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream);
}

}  // namespace

// Returns the (images, 3, out_h, out_w) rows in `lut`'s dtype on its device, queued on the current stream.
//   host: page-locked, the layout's first bytes (its head, `images` meta rows then the tap tables, and any pixels
//     after it), copied to the start of the layout on the device; total_bytes: the whole layout's size; pixels_at:
//     where its pixel area starts; tables_at, tables_bytes: where the tap tables lie.
//   pixels, segments: runs (host start, bytes, device start) of `pixels` copied into the layout (empty: none).
//   sources, coefficient_bytes: the JPEGs' coefficient runs (each at a 128-aligned offset of one device buffer;
//     none: no JPEGs); table_at: the kernels' table's byte offset in that buffer, or -1 for `table` (host int64
//     (n, fields)) copied on its own; plane_bytes, max_blocks, max_pixels: as jpeg_dct_to_pixels takes them.
//   upload_stream: the stream the copies run on (a cudaStream_t as an integer; 0: the current stream). Another
//     stream overlaps them with the current stream's work; the current stream then waits for them.
at::Tensor packed_rows(const at::Tensor& host, int64_t images, int64_t total_bytes, int64_t pixels_at,
                       int64_t tables_at, int64_t tables_bytes,
                       const at::Tensor& pixels, const std::vector<int64_t>& segments,
                       const std::vector<at::Tensor>& sources, int64_t coefficient_bytes, int64_t table_at,
                       const at::Tensor& table, int64_t plane_bytes, int64_t max_blocks, int64_t max_pixels,
                       const at::Tensor& lut, int64_t out_h, int64_t out_w, int64_t upload_stream) {
  check_host_bytes(host, "host");
  check_host_bytes(pixels, "pixels");
  TORCH_CHECK(lut.is_cuda(), "lut must be a CUDA tensor (the rows go to its device and dtype)");
  TORCH_CHECK(segments.size() % 3 == 0, "segments come in (host start, bytes, device start) triples");
  const int64_t meta_bytes = images * kImageMetaFields * static_cast<int64_t>(sizeof(int64_t));
  TORCH_CHECK(images > 0 && meta_bytes <= tables_at && tables_at % 4 == 0 && tables_at + tables_bytes <= pixels_at &&
                  pixels_at <= host.numel() && host.numel() <= total_bytes,
              check_message("the layout's start (", host.numel(), " bytes, pixels from ", pixels_at, ", tables of ",
                            tables_bytes, " at ", tables_at, ") does not fit a layout of ", total_bytes, " bytes"));
  for (size_t i = 0; i < segments.size(); i += 3) {
    const int64_t host_start = segments[i], size = segments[i + 1], device_start = segments[i + 2];
    TORCH_CHECK(host_start >= 0 && size >= 0 && host_start + size <= pixels.numel() && device_start >= pixels_at &&
                    device_start + size <= total_bytes,
                check_message("pixel run ", i / 3, " (", host_start, ", ", size, ", ", device_start,
                              ") lies outside its buffers"));
  }
  const bool jpegs = !sources.empty();
  const c10::Device device = lut.device();
  const c10::cuda::CUDAGuard device_guard(device);
  const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(device.index());
  const c10::cuda::CUDAStream upload =
      upload_stream == 0 ? caller
                         : c10::cuda::getStreamFromExternal(reinterpret_cast<cudaStream_t>(upload_stream), device.index());
  const auto bytes = at::TensorOptions().dtype(at::kByte).device(device);
  at::Tensor on_device, coefficients, table_on_device;
  {
    // Allocated on the upload stream, as the copies into them are queued there; handed to the caller's below.
    const c10::cuda::CUDAStreamGuard on_upload(upload);
    on_device = at::empty({total_bytes}, bytes);
    on_device.narrow(0, 0, host.numel()).copy_(host, /*non_blocking=*/true);
    for (size_t i = 0; i < segments.size(); i += 3) {
      on_device.narrow(0, segments[i + 2], segments[i + 1])
          .copy_(pixels.narrow(0, segments[i], segments[i + 1]), /*non_blocking=*/true);
    }
    if (jpegs) {
      coefficients = at::empty({coefficient_bytes}, bytes);
      int64_t at = 0;
      for (const at::Tensor& source : sources) {
        check_host_bytes(source, "a coefficient source");
        TORCH_CHECK(at + source.numel() <= coefficient_bytes, "the coefficient sources outgrow coefficient_bytes");
        // From the page-locked arena: asynchronous (an item's own tensor, rare, is copied in step).
        coefficients.narrow(0, at, source.numel()).copy_(source, /*non_blocking=*/source.is_pinned());
        at += aligned(source.numel());
      }
      if (table_at >= 0) {
        const int64_t rows = table.size(0), table_bytes = rows * kDctImageFields * 8;
        TORCH_CHECK(table_at % 8 == 0 && table_at + table_bytes <= coefficient_bytes,
                    "the kernels' table does not lie within the coefficients");
        table_on_device = coefficients.narrow(0, table_at, table_bytes).view(at::kLong).view({rows, kDctImageFields});
      } else {
        TORCH_CHECK(table.device().is_cpu() && table.scalar_type() == at::kLong,
                    "the kernels' table must be an int64 host tensor");
        table_on_device = table.contiguous().pin_memory().to(device, /*non_blocking=*/true);
      }
    }
  }
  if (upload != caller) {
    cudaEvent_t uploaded;
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&uploaded, cudaEventDisableTiming));
    C10_CUDA_CHECK(cudaEventRecord(uploaded, upload.stream()));
    C10_CUDA_CHECK(cudaStreamWaitEvent(caller.stream(), uploaded, 0));
    C10_CUDA_CHECK(cudaEventDestroy(uploaded));  // released once the wait queued on it has passed
    used_on(on_device, caller);
    used_on(coefficients, caller);
    used_on(table_on_device, caller);
  }
  const at::Tensor layout_pixels = on_device.narrow(0, pixels_at, total_bytes - pixels_at);
  if (jpegs) {
    const at::Tensor planes = at::empty({std::max<int64_t>(plane_bytes, 8)}, bytes);
    const std::string failure =
        jpeg_dct_to_pixels(coefficients, table_on_device, planes, layout_pixels, max_blocks, max_pixels);
    // The arguments are built by clip_flash itself: a refusal is a bug, not a bad file.
    TORCH_CHECK(failure.empty(), "clip_flash's JPEG kernels refused the batch: ", failure);
  }
  const at::Tensor meta = on_device.narrow(0, 0, meta_bytes).view(at::kLong).view({images, kImageMetaFields});
  const at::Tensor tables = on_device.narrow(0, tables_at, tables_bytes).view(at::kInt);
  at::Tensor out = at::empty({images, 3, out_h, out_w}, lut.options());
  image_resample(layout_pixels, meta, tables, lut, out);
  return out;
}

}  // namespace clip_flash
