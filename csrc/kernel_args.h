// Plain descriptions of what each kernel computes, shared by the torch-facing bindings (bindings.cpp)
// and the CUDA kernels (*.cu). No torch headers here, so the .cu files compile quickly.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace clip_flash {

enum class ElementType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

enum class Activation : int { kIdentity = 0, kGelu = 1, kGeluTanh = 2, kQuickGelu = 3 };

// An optional per-column vector of length `cols` (a bias, a LayerNorm weight, a LayerScale gamma).
// `data == nullptr` means absent: kernels use the neutral value (0 for shifts, 1 for scales).
// Its type is float32 or the matrix's type; it is contiguous.
struct ColumnVector {
  const void* data = nullptr;
  ElementType type = ElementType::kFloat32;
};

// A (rows, cols) matrix with unit column stride and `row_stride` elements between rows.
struct ConstMatrix {
  const void* data = nullptr;
  int64_t row_stride = 0;
};
struct MutableMatrix {
  void* data = nullptr;
  int64_t row_stride = 0;
};

// normed = LayerNorm(updated) with fp32 statistics, where
//   updated = residual + scale * delta   when delta.data != nullptr (stored in updated_out)
//   updated = residual                   otherwise (plain LayerNorm; updated_out unused)
// The statistics are taken over `updated` as stored (rounded to the matrix type), so `normed` is exactly
// the LayerNorm of the residual stream the next block sees.
struct LayerNormArgs {
  ElementType type = ElementType::kFloat16;  // of all matrices: kFloat16 or kBFloat16
  int64_t rows = 0;
  int64_t cols = 0;
  ConstMatrix residual;
  ConstMatrix delta;
  ColumnVector scale;
  ColumnVector weight;
  ColumnVector bias;
  float eps = 1e-5f;
  MutableMatrix updated_out;
  MutableMatrix normed_out;
};

// out = activation(x) (x: c_fc's output, its bias added by cuBLAS); `out` may be `x` itself (each element is read
// before it is written).
struct BiasActArgs {
  ElementType type = ElementType::kFloat16;
  int64_t rows = 0;
  int64_t cols = 0;
  ConstMatrix x;
  Activation activation = Activation::kIdentity;
  MutableMatrix out;
};

// out = residual + scale * delta.
struct ResidualAddArgs {
  ElementType type = ElementType::kFloat16;
  int64_t rows = 0;
  int64_t cols = 0;
  ConstMatrix residual;
  ConstMatrix delta;
  ColumnVector scale;
  MutableMatrix out;
};

// Each launcher picks the 16-byte vectorized kernel when columns and pointers allow it, else a scalar one.
// Launch errors are left for the caller to check (cudaGetLastError).
void launch_layer_norm(const LayerNormArgs& args, cudaStream_t stream);
void launch_bias_act(const BiasActArgs& args, cudaStream_t stream);
void launch_residual_add(const ResidualAddArgs& args, cudaStream_t stream);

}  // namespace clip_flash
