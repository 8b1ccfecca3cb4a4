// Launch of the fast path's chroma step (csrc/jpeg_chroma.cu); checks live in csrc/jpeg_chroma_binding.cpp.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace clip_flash {

// Per-image geometry of a packed batch (images of any sizes and samplings, anywhere in one buffer), in
// int64 rows of kChromaTableFields on the device; byte offsets are into `rgb`/`out` and `chroma`.
enum ChromaTableField { kPixelOffset = 0, kChromaOffset, kHeight, kWidth, kHorizontal, kVertical, kChromaTableFields };

struct JpegChromaArgs {
  const uint8_t* rgb;   // (images, height, width, 3): nvJPEG's RGB, chroma upsampled by repetition
  uint8_t* chroma;      // (images, rows, cols, 2) scratch: each block's recovered Cb, Cr
  uint8_t* out;         // (images, height, width, 3); may be `rgb` itself (each pixel is read, then written)
  const int64_t* table; // packed batch: (images, kChromaTableFields); the uniform fields below then unused
  int64_t images;
  int64_t max_blocks;   // the most chroma blocks and pixels of any one image (the grid's size)
  int64_t max_pixels;
  int height;
  int width;
  int horizontal;       // chroma block width: 2 (4:2:2 and 4:2:0)
  int vertical;         // chroma block height: 1 (4:2:2) or 2 (4:2:0)
  int rows;             // ceil(height / vertical)
  int cols;             // ceil(width / horizontal)
};

void launch_jpeg_chroma(const JpegChromaArgs& args, cudaStream_t stream);

}  // namespace clip_flash
