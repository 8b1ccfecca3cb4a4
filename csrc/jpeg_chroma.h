// Launch of the fast path's chroma step (csrc/jpeg_chroma.cu); checks live in csrc/jpeg_chroma_binding.cpp.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace clip_flash {

struct JpegChromaArgs {
  const uint8_t* rgb;   // (images, height, width, 3): nvJPEG's RGB, chroma upsampled by repetition
  uint8_t* chroma;      // (images, rows, cols, 2) scratch: each block's recovered Cb, Cr
  uint8_t* out;         // (images, height, width, 3)
  int64_t images;
  int height;
  int width;
  int horizontal;       // chroma block width: 2 (4:2:2 and 4:2:0)
  int vertical;         // chroma block height: 1 (4:2:2) or 2 (4:2:0)
  int rows;             // ceil(height / vertical)
  int cols;             // ceil(width / horizontal)
};

void launch_jpeg_chroma(const JpegChromaArgs& args, cudaStream_t stream);

}  // namespace clip_flash
