// OpenCLIP's eval transform on a batch of decoded uint8 images, bit-exact with Pillow + torchvision.
//
// One launch per batch; block (tile, image) makes kRowsPerBlock output rows of one image, one thread per
// output column (a few columns per thread for wide outputs). Pillow's arithmetic, per pass: sum of
// uint8 pixel x int32 weight over the taps, plus 1 << 21, arithmetic shift by 22, clamp to [0, 255];
// the two passes in Pillow's order with the uint8 rounding in between. Integer sums are exact in any
// order (they stay far below 2^31), so the kernel may regroup them. The final value goes through a
// 256-entry table per channel built on the host by torch itself (ToTensor + Normalize + dtype cast), so
// no floating-point operation happens here at all.
//
// Horizontal first (most images): each thread computes its column's horizontal value for every source
// row the tile's output rows read and adds it into kRowsPerBlock per-row accumulators (registers), so
// memory stays bounded whatever the image size. Vertical first (Pillow 13, when the height shrinks much
// more than the width): per output row, the block computes the vertical pass over the needed source
// columns into shared memory in chunks, then each thread applies its column's horizontal taps.
#include <algorithm>
#include <climits>
#include <cstdint>

#include "image_resample.h"

namespace clip_flash {
namespace {

constexpr int kPrecisionBits = 22;
constexpr int32_t kRounding = 1 << (kPrecisionBits - 1);
constexpr int kRowsPerBlock = 16;
constexpr int kBlockThreads = 256;
constexpr int kColumnsPerThread = kImageResampleMaxWidth / kBlockThreads;
constexpr int kChunkColumns = 4096;  // source columns per shared-memory chunk (vertical first)

// Pillow's clip8: the shift floors (arithmetic on signed ints), then clamp.
__device__ __forceinline__ int32_t clip8(int32_t sum) {
  const int32_t value = sum >> kPrecisionBits;
  return value < 0 ? 0 : (value > 255 ? 255 : value);
}

// Pillow's RGBA -> RGBa: colour * alpha / 255 rounded as (t + (t >> 8)) >> 8 with t = colour * alpha + 128.
__device__ __forceinline__ int32_t premultiply(int32_t colour, int32_t alpha) {
  const int32_t t = colour * alpha + 128;
  return (t + (t >> 8)) >> 8;
}

// Loads one source pixel's C channels (premultiplied by its alpha when asked: RGBA only).
template <int C>
__device__ __forceinline__ void load_pixel(const uint8_t* p, bool premultiplied, int32_t (&v)[C]) {
#pragma unroll
  for (int c = 0; c < C; ++c) v[c] = __ldg(p + c);
  if constexpr (C == 4) {
    if (premultiplied) {
#pragma unroll
      for (int c = 0; c < 3; ++c) v[c] = premultiply(v[c], v[3]);
    }
  }
}

// The output's uint8 channels from the pass sums; for premultiplied RGBA, Pillow's RGBa -> RGBA:
// colour * 255 / alpha (integer division, clipped), unchanged where alpha is 0 or 255.
template <int C>
__device__ __forceinline__ void finish_pixel(const int32_t (&acc)[C], bool padded, int fill, bool premultiplied,
                                             int32_t (&value)[C]) {
#pragma unroll
  for (int c = 0; c < C; ++c) value[c] = padded ? fill : clip8(acc[c] + kRounding);
  if constexpr (C == 4) {
    const int32_t alpha = value[3];
    if (premultiplied && !padded && alpha != 0 && alpha != 255) {
#pragma unroll
      for (int c = 0; c < 3; ++c) value[c] = min(255, value[c] * 255 / alpha);
    }
  }
}

struct AxisView {
  const int32_t* start;
  const int32_t* count;
  const int32_t* weights;
  int taps;

  __device__ AxisView(const int32_t* tables, int64_t offset, int outputs, int taps_)
      : start(tables + offset), count(tables + offset + outputs), weights(tables + offset + 2 * outputs),
        taps(taps_) {}
};

struct ImageView {
  const uint8_t* pixels;
  int width;
  int fill;
  bool premultiplied;
  AxisView rows;
  AxisView cols;
};

// Writes the three channels of output pixel (y, x): one uint8 value per channel (one for "L" images,
// replicated as convert("RGB") does; RGBA's alpha dropped), mapped through the channel's table.
template <typename Word, int C>
__device__ __forceinline__ void store_pixel(Word* out, const Word* lut, int64_t plane, int y, int x, int out_w,
                                            const int32_t (&value)[C]) {
  const int64_t at = static_cast<int64_t>(y) * out_w + x;
#pragma unroll
  for (int c = 0; c < 3; ++c) out[c * plane + at] = lut[c * 256 + value[C >= 3 ? c : 0]];
}

// Output rows [row0, row_end) with at most kRows of them (per-row accumulators live in registers).
template <typename Word, int C, int kRows>
__device__ void horizontal_first(const ImageView& im, Word* out, const Word* lut, int out_h, int out_w, int row0,
                                 int row_end) {
  const int64_t plane = static_cast<int64_t>(out_h) * out_w;
  const int rows_here = min(kRows, row_end - row0);
  int row_start[kRows];
  int row_count[kRows];
  int first = INT_MAX;
  int last = 0;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    row_start[r] = r < rows_here ? __ldg(im.rows.start + row0 + r) : 0;
    row_count[r] = r < rows_here ? __ldg(im.rows.count + row0 + r) : 0;
    if (row_count[r] > 0) {
      first = min(first, row_start[r]);
      last = max(last, row_start[r] + row_count[r]);
    }
  }
  for (int x = threadIdx.x; x < out_w; x += blockDim.x) {
    const int col_start = __ldg(im.cols.start + x);
    const int col_count = __ldg(im.cols.count + x);
    const int32_t* col_weights = im.cols.weights + static_cast<int64_t>(x) * im.cols.taps;
    int32_t acc[kRows][C];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int c = 0; c < C; ++c) acc[r][c] = 0;
    }
    if (col_count > 0) {
      for (int j = first; j < last; ++j) {
        const uint8_t* src = im.pixels + (static_cast<int64_t>(j) * im.width + col_start) * C;
        int32_t h[C];
#pragma unroll
        for (int c = 0; c < C; ++c) h[c] = kRounding;
        for (int t = 0; t < col_count; ++t) {
          const int32_t w = __ldg(col_weights + t);
          int32_t v[C];
          load_pixel<C>(src + t * C, im.premultiplied, v);
#pragma unroll
          for (int c = 0; c < C; ++c) h[c] += v[c] * w;
        }
#pragma unroll
        for (int c = 0; c < C; ++c) h[c] = clip8(h[c]);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const int tap = j - row_start[r];
          if (tap >= 0 && tap < row_count[r]) {
            const int32_t w = __ldg(im.rows.weights + static_cast<int64_t>(row0 + r) * im.rows.taps + tap);
#pragma unroll
            for (int c = 0; c < C; ++c) acc[r][c] += h[c] * w;
          }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (r < rows_here) {
        int32_t value[C];
        finish_pixel<C>(acc[r], col_count == 0 || row_count[r] == 0, im.fill, im.premultiplied, value);
        store_pixel<Word, C>(out, lut, plane, row0 + r, x, out_w, value);
      }
    }
  }
}

template <typename Word, int C>
__device__ void vertical_first(const ImageView& im, Word* out, const Word* lut, int out_h, int out_w, int row0,
                               int col_first, int col_last, uint8_t* chunk) {
  const int64_t plane = static_cast<int64_t>(out_h) * out_w;
  const int rows_here = min(kRowsPerBlock, out_h - row0);
  int col_start[kColumnsPerThread];
  int col_count[kColumnsPerThread];
#pragma unroll
  for (int k = 0; k < kColumnsPerThread; ++k) {
    const int x = threadIdx.x + k * blockDim.x;
    col_start[k] = x < out_w ? __ldg(im.cols.start + x) : 0;
    col_count[k] = x < out_w ? __ldg(im.cols.count + x) : 0;
  }
  for (int r = 0; r < rows_here; ++r) {
    const int y = row0 + r;
    const int row_start = __ldg(im.rows.start + y);
    const int row_count = __ldg(im.rows.count + y);  // the same for the whole block
    const int32_t* row_weights = im.rows.weights + static_cast<int64_t>(y) * im.rows.taps;
    int32_t acc[kColumnsPerThread][C];
#pragma unroll
    for (int k = 0; k < kColumnsPerThread; ++k) {
#pragma unroll
      for (int c = 0; c < C; ++c) acc[k][c] = 0;
    }
    if (row_count > 0) {
      for (int chunk_first = col_first; chunk_first < col_last; chunk_first += kChunkColumns) {
        const int chunk_values = min(kChunkColumns, col_last - chunk_first) * C;
        __syncthreads();  // the previous chunk has been read by every thread
        const uint8_t* src = im.pixels + (static_cast<int64_t>(row_start) * im.width + chunk_first) * C;
        const int64_t row_stride = static_cast<int64_t>(im.width) * C;
        for (int q = threadIdx.x; q < chunk_values; q += blockDim.x) {
          // RGBA colours are premultiplied by their own pixel's alpha, 3 - q % 4 bytes further on.
          const int alpha_at = C == 4 && im.premultiplied && q % C != 3 ? 3 - q % C : 0;
          int32_t sum = kRounding;
          for (int t = 0; t < row_count; ++t) {
            const uint8_t* p = src + t * row_stride + q;
            int32_t v = __ldg(p);
            if (alpha_at != 0) v = premultiply(v, __ldg(p + alpha_at));
            sum += v * __ldg(row_weights + t);
          }
          chunk[q] = static_cast<uint8_t>(clip8(sum));
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < kColumnsPerThread; ++k) {
          const int32_t* col_weights =
              im.cols.weights + static_cast<int64_t>(threadIdx.x + k * blockDim.x) * im.cols.taps;
          const int first_tap = max(0, chunk_first - col_start[k]);
          const int end_tap = min(col_count[k], chunk_first + kChunkColumns - col_start[k]);
          for (int t = first_tap; t < end_tap; ++t) {
            const int32_t w = __ldg(col_weights + t);
            const uint8_t* p = chunk + (col_start[k] + t - chunk_first) * C;
#pragma unroll
            for (int c = 0; c < C; ++c) acc[k][c] += static_cast<int32_t>(p[c]) * w;
          }
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kColumnsPerThread; ++k) {
      const int x = threadIdx.x + k * blockDim.x;
      if (x < out_w) {
        int32_t value[C];
        finish_pixel<C>(acc[k], col_count[k] == 0 || row_count == 0, im.fill, im.premultiplied, value);
        store_pixel<Word, C>(out, lut, plane, y, x, out_w, value);
      }
    }
  }
}

template <typename Word>
__global__ void __launch_bounds__(kBlockThreads) image_resample_kernel(ImageResampleArgs args) {
  __shared__ uint8_t chunk[kChunkColumns * 4];
  const int64_t image = blockIdx.y;
  const int64_t* meta = args.meta + image * kImageMetaFields;
  const ImageView im{
      args.pixels + meta[kPixelOffset],
      static_cast<int>(meta[kWidth]),
      static_cast<int>(meta[kFill]),
      meta[kPremultiply] != 0,
      AxisView(args.tables, meta[kRowsTable], args.out_h, static_cast<int>(meta[kRowTaps])),
      AxisView(args.tables, meta[kColsTable], args.out_w, static_cast<int>(meta[kColTaps])),
  };
  Word* out = static_cast<Word*>(args.out) + image * 3 * static_cast<int64_t>(args.out_h) * args.out_w;
  const Word* lut = static_cast<const Word*>(args.lut);
  const int row0 = blockIdx.x * kRowsPerBlock;
  const int64_t channels = meta[kChannels];
  if (meta[kVerticalFirst] != 0) {
    const int col_first = static_cast<int>(meta[kColFirst]);
    const int col_last = static_cast<int>(meta[kColLast]);
    if (channels == 3) {
      vertical_first<Word, 3>(im, out, lut, args.out_h, args.out_w, row0, col_first, col_last, chunk);
    } else if (channels == 1) {
      vertical_first<Word, 1>(im, out, lut, args.out_h, args.out_w, row0, col_first, col_last, chunk);
    } else {
      vertical_first<Word, 4>(im, out, lut, args.out_h, args.out_w, row0, col_first, col_last, chunk);
    }
  } else {
    const int row_end = min(row0 + kRowsPerBlock, args.out_h);
    if (channels == 3) {
      horizontal_first<Word, 3, kRowsPerBlock>(im, out, lut, args.out_h, args.out_w, row0, row_end);
    } else if (channels == 1) {
      horizontal_first<Word, 1, kRowsPerBlock>(im, out, lut, args.out_h, args.out_w, row0, row_end);
    } else {
      // Four channels: half the rows at a time, so the accumulators fit the same register budget.
      for (int first = row0; first < row_end; first += kRowsPerBlock / 2) {
        horizontal_first<Word, 4, kRowsPerBlock / 2>(im, out, lut, args.out_h, args.out_w, first, row_end);
      }
    }
  }
}

}  // namespace

void launch_image_resample(const ImageResampleArgs& args, cudaStream_t stream) {
  if (args.images == 0 || args.out_h == 0 || args.out_w == 0) return;
  const int threads = std::min(kBlockThreads, (args.out_w + 31) / 32 * 32);
  const dim3 grid(static_cast<unsigned>((args.out_h + kRowsPerBlock - 1) / kRowsPerBlock),
                  static_cast<unsigned>(args.images));
  if (args.word_bytes == 4) {
    image_resample_kernel<uint32_t><<<grid, threads, 0, stream>>>(args);
  } else {
    image_resample_kernel<uint16_t><<<grid, threads, 0, stream>>>(args);
  }
}

}  // namespace clip_flash
