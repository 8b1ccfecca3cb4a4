// The exact path's GPU half of JPEG decoding: from each component's quantized DCT coefficients (read on the CPU
// by the batch decoder, csrc/image_batch_decoder.cpp) to the pixels Pillow's decoder gives, written straight into the resize kernel's
// packed layout. It repeats libjpeg-turbo's integer arithmetic with its default settings, bit for bit:
//   1. jpeg_idct_islow: dequantize, the 8x8 integer IDCT (columns, then rows), +128 and clamp to 0..255;
//   2. "fancy" upsampling of halved components (a triangle filter: 3/4 nearer sample, 1/4 the other, with
//      libjpeg's rounding biases, edges replicated);
//   3. the integer YCbCr -> RGB tables of jdcolor.c.
// Kernel 1 runs one thread per 8x8 block into per-component planes; kernel 2 one thread per pixel.
#include <cstdint>

#include "jpeg_dct.h"

namespace clip_flash {
namespace {

constexpr int kThreads = 256;
constexpr int kConstBits = 13;
constexpr int kPass1Bits = 2;

// FIX(x) = x * 2^13 rounded, as jidctint.c lists them.
constexpr int kFix0298631336 = 2446;
constexpr int kFix0390180644 = 3196;
constexpr int kFix0541196100 = 4433;
constexpr int kFix0765366865 = 6270;
constexpr int kFix0899976223 = 7373;
constexpr int kFix1175875602 = 9633;
constexpr int kFix1501321110 = 12299;
constexpr int kFix1847759065 = 15137;
constexpr int kFix1961570560 = 16069;
constexpr int kFix2053119869 = 16819;
constexpr int kFix2562915447 = 20995;
constexpr int kFix3072711026 = 25172;

__device__ __forceinline__ int descale(int value, int bits) { return (value + (1 << (bits - 1))) >> bits; }

// One 1-D pass of jpeg_idct_islow over in[0..7] (stride apart); out[k] before descaling by `bits`.
__device__ __forceinline__ void idct_1d(const int* in, int stride, int bits, int* out, int out_stride) {
  int z2 = in[2 * stride], z3 = in[6 * stride];
  int z1 = (z2 + z3) * kFix0541196100;
  int tmp2 = z1 + z3 * -kFix1847759065;
  int tmp3 = z1 + z2 * kFix0765366865;
  int tmp0 = (in[0] + in[4 * stride]) * (1 << kConstBits);
  int tmp1 = (in[0] - in[4 * stride]) * (1 << kConstBits);
  const int tmp10 = tmp0 + tmp3, tmp13 = tmp0 - tmp3, tmp11 = tmp1 + tmp2, tmp12 = tmp1 - tmp2;
  tmp3 = in[1 * stride];
  tmp2 = in[3 * stride];
  tmp1 = in[5 * stride];
  tmp0 = in[7 * stride];
  int z4 = tmp1 + tmp3;
  z3 = tmp0 + tmp2;
  z2 = tmp1 + tmp2;
  z1 = tmp0 + tmp3;
  const int z5 = (z3 + z4) * kFix1175875602;
  tmp3 *= kFix1501321110;
  tmp2 *= kFix3072711026;
  tmp1 *= kFix2053119869;
  tmp0 *= kFix0298631336;
  z4 = z4 * -kFix0390180644 + z5;
  z3 = z3 * -kFix1961570560 + z5;
  z1 *= -kFix0899976223;
  z2 *= -kFix2562915447;
  tmp3 += z1 + z4;
  tmp2 += z2 + z3;
  tmp1 += z2 + z4;
  tmp0 += z1 + z3;
  out[0 * out_stride] = descale(tmp10 + tmp3, bits);
  out[7 * out_stride] = descale(tmp10 - tmp3, bits);
  out[1 * out_stride] = descale(tmp11 + tmp2, bits);
  out[6 * out_stride] = descale(tmp11 - tmp2, bits);
  out[2 * out_stride] = descale(tmp12 + tmp1, bits);
  out[5 * out_stride] = descale(tmp12 - tmp1, bits);
  out[3 * out_stride] = descale(tmp13 + tmp0, bits);
  out[4 * out_stride] = descale(tmp13 - tmp0, bits);
}

// Grid: x over blocks, y over (image, component). libjpeg's shortcut for all-zero AC terms gives the same
// values as the full pass (checked on the formulas: the rounding terms never carry), so there is none here.
__global__ void dct_blocks_kernel(JpegDctArgs args) {
  const int64_t image = blockIdx.y / kDctMaxComponents;
  const int component = blockIdx.y % kDctMaxComponents;
  const int64_t* row = args.table + image * kDctImageFields;
  if (component >= row[kDctComponents]) return;
  const int64_t* geometry = row + kDctComponentFields + component * kDctFieldsPerComponent;
  const int64_t wide = geometry[kDctBlocksWide];
  const int64_t block = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (block >= wide * geometry[kDctBlocksHigh]) return;
  const int16_t* base = reinterpret_cast<const int16_t*>(args.coefficients + row[kDctCoefficients]) +
                        geometry[kDctTableAt];
  const int4* quant = reinterpret_cast<const int4*>(base);
  const int4* coefficients = reinterpret_cast<const int4*>(base + 64 * (1 + block));
  int values[64];
#pragma unroll
  for (int part = 0; part < 8; ++part) {  // 8 coefficients (one row of the block) per 16-byte load
    const int4 c = coefficients[part], q = quant[part];
    const int16_t* cs = reinterpret_cast<const int16_t*>(&c);
    const int16_t* qs = reinterpret_cast<const int16_t*>(&q);
#pragma unroll
    for (int k = 0; k < 8; ++k) values[part * 8 + k] = static_cast<int>(cs[k]) * static_cast<int>(qs[k]);
  }
  int work[64];
#pragma unroll
  for (int column = 0; column < 8; ++column) {
    idct_1d(values + column, 8, kConstBits - kPass1Bits, work + column, 8);
  }
  const int64_t plane_wide = wide * 8;
  uint8_t* out = args.planes + geometry[kDctPlane] + (block / wide) * 8 * plane_wide + (block % wide) * 8;
#pragma unroll
  for (int r = 0; r < 8; ++r) {
    int samples[8];
    idct_1d(work + r * 8, 1, kConstBits + kPass1Bits + 3, samples, 1);
    uint32_t packed[2] = {0, 0};
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int value = min(max(samples[k] + 128, 0), 255);  // libjpeg-turbo's SIMD IDCT saturates
      packed[k / 4] |= static_cast<uint32_t>(value) << (8 * (k % 4));
    }
    *reinterpret_cast<uint2*>(out + r * plane_wide) = make_uint2(packed[0], packed[1]);
  }
}

// A component's sample at output pixel (y, x), upsampled the way libjpeg-turbo's jdsample.c does.
__device__ __forceinline__ int upsampled(const uint8_t* plane, const int64_t* geometry, int y, int x) {
  const int64_t stride = geometry[kDctBlocksWide] * 8;
  const int across = static_cast<int>(geometry[kDctAcross]);
  const int down = static_cast<int>(geometry[kDctDown]);
  if (across == 1) return plane[y * stride + x];  // full size (down is then 1 too)
  const int wide = static_cast<int>(geometry[kDctSamplesWide]);
  const int column = x >> 1;
  const int neighbour = (x & 1) ? min(column + 1, wide - 1) : max(column - 1, 0);
  if (down == 1) {  // h2v1: 3/4 this sample + 1/4 the one beside, biased 1 (left) or 2 (right)
    const uint8_t* line = plane + y * stride;
    return (3 * line[column] + line[neighbour] + ((x & 1) ? 2 : 1)) >> 2;
  }
  // h2v2: the same across, on column sums of 3/4 this row + 1/4 the nearer other row; biases 8 and 7.
  const int high = static_cast<int>(geometry[kDctSamplesHigh]);
  const int line_at = y >> 1;
  const int other = (y & 1) ? min(line_at + 1, high - 1) : max(line_at - 1, 0);
  const uint8_t* near_line = plane + line_at * stride;
  const uint8_t* far_line = plane + other * stride;
  const int here = 3 * near_line[column] + far_line[column];
  const int beside = 3 * near_line[neighbour] + far_line[neighbour];
  return (3 * here + beside + ((x & 1) ? 7 : 8)) >> 4;
}

__device__ __forceinline__ uint8_t clamp_byte(int value) { return static_cast<uint8_t>(min(max(value, 0), 255)); }

constexpr int kScaleBits = 16;
constexpr int kOneHalf = 1 << (kScaleBits - 1);
__host__ __device__ constexpr int fix16(double value) { return static_cast<int>(value * (1 << kScaleBits) + 0.5); }

// Grid: x over pixels, y over images.
__global__ void dct_pixels_kernel(JpegDctArgs args) {
  const int64_t image = blockIdx.y;
  const int64_t* row = args.table + image * kDctImageFields;
  const int64_t width = row[kDctWidth];
  const int64_t pixel = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (pixel >= width * row[kDctHeight]) return;
  const int y = static_cast<int>(pixel / width), x = static_cast<int>(pixel % width);
  const int64_t* luma = row + kDctComponentFields;
  const int components = static_cast<int>(row[kDctComponents]);
  uint8_t* out = args.pixels + row[kDctPixels] + pixel * components;
  const int gray = upsampled(args.planes + luma[kDctPlane], luma, y, x);
  if (components == 1) {
    out[0] = static_cast<uint8_t>(gray);
    return;
  }
  const int64_t* blue = luma + kDctFieldsPerComponent;
  const int64_t* red = blue + kDctFieldsPerComponent;
  const int cb = upsampled(args.planes + blue[kDctPlane], blue, y, x) - 128;
  const int cr = upsampled(args.planes + red[kDctPlane], red, y, x) - 128;
  // jdcolor.c's tables, computed in place: Cr_r, Cb_b rounded; Cb_g + Cr_g shifted together.
  out[0] = clamp_byte(gray + ((fix16(1.40200) * cr + kOneHalf) >> kScaleBits));
  out[1] = clamp_byte(gray + ((-fix16(0.34414) * cb + kOneHalf - fix16(0.71414) * cr) >> kScaleBits));
  out[2] = clamp_byte(gray + ((fix16(1.77200) * cb + kOneHalf) >> kScaleBits));
}

}  // namespace

void launch_jpeg_dct(const JpegDctArgs& args, cudaStream_t stream) {
  if (args.images == 0) return;
  const dim3 blocks_grid(static_cast<unsigned>((args.max_blocks + kThreads - 1) / kThreads),
                         static_cast<unsigned>(args.images * kDctMaxComponents));
  dct_blocks_kernel<<<blocks_grid, kThreads, 0, stream>>>(args);
  const dim3 pixels_grid(static_cast<unsigned>((args.max_pixels + kThreads - 1) / kThreads),
                         static_cast<unsigned>(args.images));
  dct_pixels_kernel<<<pixels_grid, kThreads, 0, stream>>>(args);
}

}  // namespace clip_flash
