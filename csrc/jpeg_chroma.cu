// The fast path's chroma step, one thread per chroma block and then one per pixel, in place of
// clip_flash/inputs/jpeg_chroma.py's chain of tensor ops (same arithmetic, same order of float operations
// where it matters, but not bit for bit: a block mean whose rounding lands on the other side of .5 moves
// that block's chroma by one level and its pixels by up to two or three; nvJPEG's pixels were not exact).
//
// nvJPEG repeats each 4:2:x chroma sample over its block; libjpeg-turbo (Pillow's decoder) interpolates
// ("fancy" upsampling) and converts with integer tables. Pass 1 recovers each block's Cb/Cr from the RGB
// it shares (a weighted mean over the block, pixels with a clipped channel weighing 1e-3). Pass 2 recovers
// each pixel's Y from its RGB and its block's chroma, upsamples the chroma libjpeg's way and converts.
// Float steps use explicit round-to-nearest intrinsics so that no multiply-add is fused. A batch is either of
// one size and sampling (n, H, W, 3), or packed: images of any size anywhere in one buffer, described by a
// table (the fast path's nvJPEG decode writes straight into the resize kernel's layout; see
// clip_flash/inputs/gpu_jpeg.py).
#include <cstdint>

#include "jpeg_chroma.h"

namespace clip_flash {
namespace {

constexpr int kThreads = 256;
constexpr int kScaleBits = 16;
constexpr int64_t kOneHalf = int64_t{1} << (kScaleBits - 1);

__host__ __device__ constexpr int64_t fix(double value) {
  return static_cast<int64_t>(value * (int64_t{1} << kScaleBits) + 0.5);
}

__device__ __forceinline__ float luma_of(float r, float g, float b) {
  return __fadd_rn(__fadd_rn(__fmul_rn(0.299f, r), __fmul_rn(0.587f, g)), __fmul_rn(0.114f, b));
}

__device__ __forceinline__ bool inside(uint8_t value) { return value > 0 && value < 255; }

__device__ __forceinline__ float clamp255(float value) { return fminf(fmaxf(value, 0.0f), 255.0f); }

__device__ __forceinline__ uint8_t to_byte(int64_t value) {
  return static_cast<uint8_t>(value < 0 ? 0 : (value > 255 ? 255 : value));
}

// One image of the batch: where its pixels and chroma blocks are, and its geometry.
struct ImageGeometry {
  const uint8_t* rgb;
  uint8_t* chroma;
  uint8_t* out;
  int height, width, horizontal, vertical, rows, cols;
};

__device__ __forceinline__ ImageGeometry geometry_of(const JpegChromaArgs& args, int64_t image) {
  ImageGeometry g;
  if (args.table != nullptr) {
    const int64_t* row = args.table + image * kChromaTableFields;
    g.height = static_cast<int>(row[kHeight]);
    g.width = static_cast<int>(row[kWidth]);
    g.horizontal = static_cast<int>(row[kHorizontal]);
    g.vertical = static_cast<int>(row[kVertical]);
    g.rows = (g.height + g.vertical - 1) / g.vertical;
    g.cols = (g.width + g.horizontal - 1) / g.horizontal;
    g.rgb = args.rgb + row[kPixelOffset];
    g.out = args.out + row[kPixelOffset];
    g.chroma = args.chroma + row[kChromaOffset];
    return g;
  }
  g.height = args.height;
  g.width = args.width;
  g.horizontal = args.horizontal;
  g.vertical = args.vertical;
  g.rows = args.rows;
  g.cols = args.cols;
  const int64_t pixel_bytes = static_cast<int64_t>(args.height) * args.width * 3;
  g.rgb = args.rgb + image * pixel_bytes;
  g.out = args.out + image * pixel_bytes;
  g.chroma = args.chroma + image * static_cast<int64_t>(args.rows) * args.cols * 2;
  return g;
}

// Pass 1: each block's Cb and Cr, rounded half to even and clamped, as in the tensor version.
// Grid: y strides over images, x over each image's blocks.
__global__ void __launch_bounds__(kThreads) chroma_blocks_kernel(JpegChromaArgs args) {
  const float inv_cb = 1.0f / 1.772f;  // dividing by a scalar is a multiply by its float reciprocal there
  const float inv_cr = 1.0f / 1.402f;
  for (int64_t image = blockIdx.y; image < args.images; image += gridDim.y) {
    const ImageGeometry g = geometry_of(args, image);
    const int64_t blocks = static_cast<int64_t>(g.rows) * g.cols;
    for (int64_t index = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; index < blocks;
         index += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const int col = static_cast<int>(index % g.cols);
      const int row = static_cast<int>(index / g.cols);
      // Each block row is summed first, then the rows: the pairwise order of the tensor version's reduction.
      float weight_sum = 0.0f, cb_sum = 0.0f, cr_sum = 0.0f;
      for (int dy = 0; dy < g.vertical; ++dy) {
        float weight_row = 0.0f, cb_row = 0.0f, cr_row = 0.0f;
        // Blocks past the edge repeat the last row/column, as the tensor version pads them.
        const int y = min(row * g.vertical + dy, g.height - 1);
        for (int dx = 0; dx < g.horizontal; ++dx) {
          const int x = min(col * g.horizontal + dx, g.width - 1);
          const uint8_t* p = g.rgb + (static_cast<int64_t>(y) * g.width + x) * 3;
          const float r = p[0], gr = p[1], b = p[2];
          const float luma = luma_of(r, gr, b);
          const float weight = (inside(p[0]) && inside(p[1]) && inside(p[2]) ? 1.0f : 0.0f) + 1e-3f;
          const float cb = __fadd_rn(__fmul_rn(__fsub_rn(b, luma), inv_cb), 128.0f);
          const float cr = __fadd_rn(__fmul_rn(__fsub_rn(r, luma), inv_cr), 128.0f);
          weight_row = __fadd_rn(weight_row, weight);
          cb_row = __fadd_rn(cb_row, __fmul_rn(cb, weight));
          cr_row = __fadd_rn(cr_row, __fmul_rn(cr, weight));
        }
        weight_sum = __fadd_rn(weight_sum, weight_row);
        cb_sum = __fadd_rn(cb_sum, cb_row);
        cr_sum = __fadd_rn(cr_sum, cr_row);
      }
      const float denominator = fmaxf(weight_sum, 1e-6f);
      uint8_t* out = g.chroma + index * 2;
      out[0] = static_cast<uint8_t>(clamp255(rintf(__fdiv_rn(cb_sum, denominator))));
      out[1] = static_cast<uint8_t>(clamp255(rintf(__fdiv_rn(cr_sum, denominator))));
    }
  }
}

// libjpeg-turbo's fancy upsampling of one chroma plane at output pixel (y, x): h2v1 or h2v2.
__device__ __forceinline__ int64_t fancy_sample(const uint8_t* plane, int rows, int cols, int horizontal,
                                                int vertical, int y, int x, int channel) {
  auto at = [&](int r, int c) -> int64_t {
    r = min(max(r, 0), rows - 1);
    c = min(max(c, 0), cols - 1);
    return plane[(static_cast<int64_t>(r) * cols + c) * 2 + channel];
  };
  const int col = x / horizontal;
  const bool odd_col = x % horizontal;
  if (vertical == 1) {
    const int64_t near = 3 * at(y, col);
    return odd_col ? (near + at(y, col + 1) + 2) >> 2 : (near + at(y, col - 1) + 1) >> 2;
  }
  const int row = y / 2;
  const int far_row = (y % 2) ? row + 1 : row - 1;  // even output rows lean on the row above, odd on below
  auto column_sum = [&](int c) -> int64_t { return 3 * at(row, c) + at(far_row, c); };
  const int64_t here = 3 * column_sum(col);
  return odd_col ? (here + column_sum(min(col + 1, cols - 1)) + 7) >> 4
                 : (here + column_sum(max(col - 1, 0)) + 8) >> 4;
}

// Pass 2: each pixel's Y, the upsampled chroma, and libjpeg's integer YCbCr -> RGB. A pixel reads only its
// own RGB and pass 1's blocks, so `out` may be `rgb`. Grid as in pass 1, x over each image's pixels.
__global__ void __launch_bounds__(kThreads) chroma_pixels_kernel(JpegChromaArgs args) {
  for (int64_t image = blockIdx.y; image < args.images; image += gridDim.y) {
    const ImageGeometry g = geometry_of(args, image);
    const int64_t pixels = static_cast<int64_t>(g.height) * g.width;
    for (int64_t index = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; index < pixels;
         index += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const int y = static_cast<int>(index / g.width);
      const int x = static_cast<int>(index % g.width);
      const uint8_t* p = g.rgb + index * 3;
      const uint8_t* block = g.chroma + (static_cast<int64_t>(y / g.vertical) * g.cols + x / g.horizontal) * 2;
      const float cb_here = static_cast<float>(block[0]) - 128.0f;
      const float cr_here = static_cast<float>(block[1]) - 128.0f;
      const float r = p[0], gr = p[1], b = p[2];
      // Each channel's own estimate of Y; clipped channels are left out.
      const float estimate_r = __fsub_rn(r, __fmul_rn(1.402f, cr_here));
      const float estimate_g =
          __fadd_rn(__fadd_rn(gr, __fmul_rn(0.344136f, cb_here)), __fmul_rn(0.714136f, cr_here));
      const float estimate_b = __fsub_rn(b, __fmul_rn(1.772f, cb_here));
      const float in_r = inside(p[0]) ? 1.0f : 0.0f, in_g = inside(p[1]) ? 1.0f : 0.0f;
      const float in_b = inside(p[2]) ? 1.0f : 0.0f;
      const float counted = __fadd_rn(__fadd_rn(in_r, in_g), in_b);
      float luma;
      if (counted > 0.0f) {
        const float sum = __fadd_rn(__fadd_rn(__fmul_rn(estimate_r, in_r), __fmul_rn(estimate_g, in_g)),
                                    __fmul_rn(estimate_b, in_b));
        luma = __fdiv_rn(sum, counted);
      } else {
        luma = luma_of(r, gr, b);
      }
      const int64_t y_value = static_cast<int64_t>(clamp255(rintf(luma)));
      const int64_t cb = fancy_sample(g.chroma, g.rows, g.cols, g.horizontal, g.vertical, y, x, 0) - 128;
      const int64_t cr = fancy_sample(g.chroma, g.rows, g.cols, g.horizontal, g.vertical, y, x, 1) - 128;
      const int64_t red = y_value + ((fix(1.40200) * cr + kOneHalf) >> kScaleBits);
      const int64_t green = y_value + ((-fix(0.34414) * cb + kOneHalf - fix(0.71414) * cr) >> kScaleBits);
      const int64_t blue = y_value + ((fix(1.77200) * cb + kOneHalf) >> kScaleBits);
      uint8_t* out = g.out + index * 3;
      out[0] = to_byte(red);
      out[1] = to_byte(green);
      out[2] = to_byte(blue);
    }
  }
}

dim3 grid_for(int64_t images, int64_t work_per_image) {
  // x covers the largest image (capped: threads stride), y the images (capped likewise).
  const int64_t blocks = (work_per_image + kThreads - 1) / kThreads;
  const unsigned int x = static_cast<unsigned int>(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
  const unsigned int y = static_cast<unsigned int>(images < 65535 ? (images > 0 ? images : 1) : 65535);
  return dim3(x, y);
}

}  // namespace

void launch_jpeg_chroma(const JpegChromaArgs& args, cudaStream_t stream) {
  chroma_blocks_kernel<<<grid_for(args.images, args.max_blocks), kThreads, 0, stream>>>(args);
  chroma_pixels_kernel<<<grid_for(args.images, args.max_pixels), kThreads, 0, stream>>>(args);
}

}  // namespace clip_flash
