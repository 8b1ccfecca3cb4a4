// Launch of the exact path's GPU half of JPEG decoding (csrc/jpeg_dct.cu); checks live in
// csrc/jpeg_dct_binding.cpp, the table is built by clip_flash/inputs/jpeg_dct.py.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace clip_flash {

constexpr int kDctMaxComponents = 3;

// One int64 row per image: where its coefficients (csrc/libjpeg_runtime.h's dct_layout) and pixels are, its size,
// and per component (up to three; unused ones zero) its geometry. Byte offsets are into the launch's buffers.
enum DctImageField {
  kDctCoefficients = 0,  // byte offset of the image's coefficient tensor in `coefficients` (16-byte aligned)
  kDctPixels,            // byte offset of its (height, width, components) uint8 pixels in `pixels`
  kDctHeight,
  kDctWidth,
  kDctComponents,        // 1 (grayscale) or 3 (YCbCr, written as RGB)
  kDctComponentFields,   // first of kDctMaxComponents groups of the fields below
};
enum DctComponentField {
  kDctAcross = 0,        // 1: full width; 2: halved (libjpeg-turbo's fancy upsampling doubles it)
  kDctDown,              // 1 or 2, likewise for the height
  kDctBlocksWide,
  kDctBlocksHigh,
  kDctSamplesWide,       // libjpeg's downsampled_width / downsampled_height
  kDctSamplesHigh,
  kDctTableAt,           // int16 index of its quantization table in the image's tensor (blocks follow)
  kDctPlane,             // byte offset of its decoded plane (blocks_wide * 8 wide) in `planes`
  kDctFieldsPerComponent,
};
constexpr int kDctImageFields = kDctComponentFields + kDctMaxComponents * kDctFieldsPerComponent;

struct JpegDctArgs {
  const uint8_t* coefficients;
  const int64_t* table;  // (images, kDctImageFields) on the device
  uint8_t* planes;       // scratch: every component's samples after the IDCT
  uint8_t* pixels;
  int64_t images;
  int64_t max_blocks;    // the most blocks of any one component, and pixels of any one image (grid sizes)
  int64_t max_pixels;
};

void launch_jpeg_dct(const JpegDctArgs& args, cudaStream_t stream);

}  // namespace clip_flash
