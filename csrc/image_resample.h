// OpenCLIP's eval image transform (Pillow resize + center crop/pad + ToTensor + Normalize) for a batch
// of decoded uint8 images, bit-exact with Pillow. No torch headers here: the kernel file compiles alone.
//
// The host (clip_flash/ops/image_resample.py) packs, per image, a row of `kImageMetaFields` int64 values
// and the int32 tap tables of both axes (Pillow's fixed-point coefficients, restricted to the output
// coordinates the crop keeps); the kernel does only integer arithmetic and a table lookup.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace clip_flash {

// Fields of one image's meta row.
enum ImageMetaField : int {
  kPixelOffset = 0,    // byte offset of the image's (H, W, C) uint8 pixels in `pixels`
  kHeight = 1,
  kWidth = 2,
  kChannels = 3,       // 1 (Pillow "L": replicated to RGB after resizing), 3 ("RGB") or 4 ("RGBA")
  kColsTable = 4,      // int32 offset in `tables` of the columns' table
  kRowsTable = 5,      // int32 offset in `tables` of the rows' table
  kColTaps = 6,        // weights per output column
  kRowTaps = 7,        // weights per output row
  kVerticalFirst = 8,  // 1: Pillow runs the vertical pass first for this image
  kFill = 9,           // pad value of output pixels outside the resized image
  kColFirst = 10,      // [first, last) source columns any kept output column reads
  kColLast = 11,
  kPremultiply = 12,   // 1: an RGBA image Pillow resizes premultiplied (RGBa), then divides back
  kImageMetaFields = 13,
};

// An axis table at `offset` for `n` output coordinates with `taps` weights each:
//   start[n], count[n], weights[n * taps]   (count 0: a padded coordinate, which takes the fill value)
// A pass Pillow skips (unchanged size) is one tap of weight 1 << 22: the identity, exactly.
//
// out[i, c, y, x] = lut[c * 256 + v], v the uint8 pixel Pillow gives; `lut` holds the output dtype's bit
// patterns of torchvision's (v / 255 - mean[c]) / std[c] (computed by torch on the host).
struct ImageResampleArgs {
  const uint8_t* pixels = nullptr;
  const int64_t* meta = nullptr;   // (images, kImageMetaFields)
  const int32_t* tables = nullptr;
  const void* lut = nullptr;       // (3, 256) words of `word_bytes` bytes
  void* out = nullptr;             // (images, 3, out_h, out_w) contiguous words
  int64_t images = 0;
  int out_h = 0;
  int out_w = 0;
  int word_bytes = 4;              // 4: float32; 2: float16 / bfloat16
};

constexpr int kImageResampleMaxWidth = 1024;  // one thread per output column

void launch_image_resample(const ImageResampleArgs& args, cudaStream_t stream);

}  // namespace clip_flash
