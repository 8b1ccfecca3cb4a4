// Python bindings of clip_flash._C: argument checks, output allocation, and kernel launches on the
// current CUDA stream. The public, torch.compile-friendly ops live in clip_flash/ops/fused_ops.py, which
// calls these functions for CUDA float16/bfloat16 tensors.
// Narrow includes instead of <torch/extension.h> cut this file's compile time about 3x; the stream comes
// from c10's CUDAStream.h rather than ATen's CUDAContext.h, which also needs the cuBLAS/cuSPARSE headers
// that a minimal CUDA toolkit lacks.
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "check_message.h"
#include "kernel_args.h"

namespace clip_flash {
namespace {

using OptionalTensor = std::optional<at::Tensor>;

ElementType matrix_element_type(const at::Tensor& matrix) {
  switch (matrix.scalar_type()) {
    case at::kHalf:
      return ElementType::kFloat16;
    case at::kBFloat16:
      return ElementType::kBFloat16;
    default:
      TORCH_CHECK(false,
                  check_message("clip_flash kernels take float16 or bfloat16 tensors, got ", matrix.scalar_type()));
  }
}

void check_matrix(const at::Tensor& matrix, const char* name) {
  TORCH_CHECK(matrix.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(matrix.dim() == 2, check_message(name, " must be 2-D (rows, cols), got shape ", matrix.sizes()));
  TORCH_CHECK(matrix.size(1) <= 1 || matrix.stride(1) == 1, name, " must have a contiguous last dimension");
  matrix_element_type(matrix);
}

// An input of any rank >= 1 as (rows, cols) over its last dim with a contiguous last dimension: a view
// whenever one exists, else a copy. Done here rather than in Python, where the reshape and the view back
// cost a few microseconds per call, which adds up in launch-bound (small-batch) forwards.
at::Tensor as_rows(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() >= 1, name, " must have at least one dimension");
  at::Tensor rows = t.dim() == 2 ? t : t.reshape({-1, t.size(-1)});
  if (rows.size(1) > 1 && rows.stride(1) != 1) rows = rows.contiguous();
  check_matrix(rows, name);
  return rows;
}

void check_like(const at::Tensor& matrix, const at::Tensor& like, const char* name) {
  check_matrix(matrix, name);
  TORCH_CHECK(matrix.sizes() == like.sizes(),
              check_message(name, " must have shape ", like.sizes(), ", got ", matrix.sizes()));
  TORCH_CHECK(matrix.scalar_type() == like.scalar_type(), check_message(name, " must be ", like.scalar_type()));
  TORCH_CHECK(matrix.device() == like.device(), check_message(name, " must be on ", like.device()));
}

ConstMatrix const_matrix(const at::Tensor& matrix) { return {matrix.const_data_ptr(), matrix.stride(0)}; }

MutableMatrix mutable_matrix(at::Tensor& matrix) { return {matrix.mutable_data_ptr(), matrix.stride(0)}; }

// A per-column vector of the matrix: 1-D, contiguous, cols long, float32 or the matrix's dtype.
ColumnVector column_vector(const OptionalTensor& vector, const at::Tensor& matrix, const char* name) {
  if (!vector.has_value()) return {};
  const at::Tensor& values = *vector;
  TORCH_CHECK(values.device() == matrix.device(), check_message(name, " must be on ", matrix.device()));
  TORCH_CHECK(values.dim() == 1 && values.size(0) == matrix.size(1),
              check_message(name, " must have shape (", matrix.size(1), ",), got ", values.sizes()));
  TORCH_CHECK(values.is_contiguous(), name, " must be contiguous");
  const bool is_float32 = values.scalar_type() == at::kFloat;
  TORCH_CHECK(is_float32 || values.scalar_type() == matrix.scalar_type(),
              check_message(name, " must be float32 or ", matrix.scalar_type(), ", got ", values.scalar_type()));
  return {values.const_data_ptr(), is_float32 ? ElementType::kFloat32 : matrix_element_type(matrix)};
}

Activation parse_activation(const std::string& name) {
  if (name == "gelu") return Activation::kGelu;
  if (name == "gelu_tanh") return Activation::kGeluTanh;
  if (name == "quick_gelu") return Activation::kQuickGelu;
  if (name == "identity") return Activation::kIdentity;
  TORCH_CHECK(false, "unknown activation '", name, "'; expected gelu, gelu_tanh, quick_gelu or identity");
}

// A new contiguous tensor with the input's shape (any rank), and its (rows, cols) view for the kernel.
std::pair<at::Tensor, at::Tensor> empty_like_rows(const at::Tensor& input, const at::Tensor& rows) {
  at::Tensor out = at::empty(input.sizes(), rows.options());
  return {out, out.view({rows.size(0), rows.size(1)})};
}

}  // namespace

at::Tensor layer_norm(const at::Tensor& input, const OptionalTensor& weight, const OptionalTensor& bias,
                      double eps) {
  const at::Tensor x = as_rows(input, "x");
  const c10::cuda::CUDAGuard device_guard(x.device());
  auto [normed, normed_rows] = empty_like_rows(input, x);
  LayerNormArgs args;
  args.type = matrix_element_type(x);
  args.rows = x.size(0);
  args.cols = x.size(1);
  args.residual = const_matrix(x);
  args.weight = column_vector(weight, x, "weight");
  args.bias = column_vector(bias, x, "bias");
  args.eps = static_cast<float>(eps);
  args.normed_out = mutable_matrix(normed_rows);
  launch_layer_norm(args, c10::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return normed;
}

std::tuple<at::Tensor, at::Tensor> add_layer_norm(const at::Tensor& residual_input, const at::Tensor& delta_input,
                                                  const OptionalTensor& scale, const OptionalTensor& weight,
                                                  const OptionalTensor& bias, double eps) {
  TORCH_CHECK(delta_input.sizes() == residual_input.sizes(),
              check_message("delta must have shape ", residual_input.sizes(), ", got ", delta_input.sizes()));
  const at::Tensor residual = as_rows(residual_input, "residual");
  const at::Tensor delta = as_rows(delta_input, "delta");
  check_like(delta, residual, "delta");
  const c10::cuda::CUDAGuard device_guard(residual.device());
  auto [updated, updated_rows] = empty_like_rows(residual_input, residual);
  auto [normed, normed_rows] = empty_like_rows(residual_input, residual);
  LayerNormArgs args;
  args.type = matrix_element_type(residual);
  args.rows = residual.size(0);
  args.cols = residual.size(1);
  args.residual = const_matrix(residual);
  args.delta = const_matrix(delta);
  args.scale = column_vector(scale, residual, "scale");
  args.weight = column_vector(weight, residual, "weight");
  args.bias = column_vector(bias, residual, "bias");
  args.eps = static_cast<float>(eps);
  args.updated_out = mutable_matrix(updated_rows);
  args.normed_out = mutable_matrix(normed_rows);
  launch_layer_norm(args, c10::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {updated, normed};
}

at::Tensor bias_act(at::Tensor& input, const std::string& activation, bool in_place) {
  TORCH_CHECK(!in_place || input.is_contiguous(), "bias_act in place needs a contiguous x");
  const at::Tensor x = as_rows(input, "x");
  const c10::cuda::CUDAGuard device_guard(x.device());
  at::Tensor out;
  at::Tensor out_rows;
  if (in_place) {
    out = input;
    out_rows = x;  // a view of input's memory (contiguous input)
  } else {
    std::tie(out, out_rows) = empty_like_rows(input, x);
  }
  BiasActArgs args;
  args.type = matrix_element_type(x);
  args.rows = x.size(0);
  args.cols = x.size(1);
  args.x = const_matrix(x);
  args.activation = parse_activation(activation);
  args.out = mutable_matrix(out_rows);
  launch_bias_act(args, c10::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

at::Tensor residual_add(const at::Tensor& residual_input, const at::Tensor& delta_input,
                        const OptionalTensor& scale) {
  TORCH_CHECK(delta_input.sizes() == residual_input.sizes(),
              check_message("delta must have shape ", residual_input.sizes(), ", got ", delta_input.sizes()));
  const at::Tensor residual = as_rows(residual_input, "residual");
  const at::Tensor delta = as_rows(delta_input, "delta");
  check_like(delta, residual, "delta");
  const c10::cuda::CUDAGuard device_guard(residual.device());
  auto [out, out_rows] = empty_like_rows(residual_input, residual);
  ResidualAddArgs args;
  args.type = matrix_element_type(residual);
  args.rows = residual.size(0);
  args.cols = residual.size(1);
  args.residual = const_matrix(residual);
  args.delta = const_matrix(delta);
  args.scale = column_vector(scale, residual, "scale");
  args.out = mutable_matrix(out_rows);
  launch_residual_add(args, c10::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

// Defined in image_resample_binding.cpp.
void image_resample(const at::Tensor& pixels, const at::Tensor& meta, const at::Tensor& tables,
                    const at::Tensor& lut, at::Tensor& out);

// Defined in jpeg_chroma_binding.cpp.
at::Tensor jpeg_chroma(const at::Tensor& rgb, int64_t horizontal, int64_t vertical);
std::string jpeg_chroma_packed(const at::Tensor& pixels, const at::Tensor& images);

// Defined in nvjpeg_decode.cpp.
std::tuple<std::vector<int64_t>, std::string> nvjpeg_hw_decode(const std::vector<at::Tensor>& encoded,
                                                               const at::Tensor& out,
                                                               const std::vector<int64_t>& slots,
                                                               const std::string& library_path, int64_t decoders);

// Defined in jpeg_dct_binding.cpp.
std::string jpeg_dct_to_pixels(const at::Tensor& coefficients, const at::Tensor& table, const at::Tensor& planes,
                               const at::Tensor& pixels, int64_t max_blocks, int64_t max_pixels);

// Defined in packed_rows_binding.cpp.
at::Tensor packed_rows(const at::Tensor& host, int64_t images, int64_t total_bytes, int64_t pixels_at,
                       int64_t tables_at, int64_t tables_bytes, const at::Tensor& pixels, const std::vector<int64_t>& segments,
                       const std::vector<at::Tensor>& sources, int64_t coefficient_bytes, int64_t table_at,
                       const at::Tensor& table, int64_t plane_bytes, int64_t max_blocks, int64_t max_pixels,
                       const at::Tensor& lut, int64_t out_h, int64_t out_w, int64_t upload_stream);

// Defined in graph_replay_binding.cpp.
at::Tensor replay_graph(int64_t graph_exec, int64_t replay_stream, const at::Tensor& static_input,
                        const at::Tensor& x, int64_t n, const at::Tensor& static_output, int64_t rows,
                        bool normalize);

// Defined in host_gate_binding.cpp.
int64_t host_gate_device_address(const at::Tensor& counter, int64_t device_index);
std::string host_gate_wait(int64_t device_address, int64_t ticket, int64_t timeout_ns, int64_t device_index);
void host_gate_open(const at::Tensor& counter, int64_t ticket);

// Defined in packed_attention_binding.cpp.
at::Tensor packed_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& cu_seqlens, int64_t max_seqlen, bool causal, double scale);

// Defined in image_batch_decoder_binding.cpp.
void register_image_batch_decoder(pybind11::module& module);

// Defined in tensor_pointers_binding.cpp.
void register_tensor_pointers(pybind11::module& module);

}  // namespace clip_flash

// The image kernels run in the decoding threads, once per batch, beside a main thread that launches the
// encoder: a launch there that blocks on a full launch queue must not stall the main thread, so those calls
// release the GIL (NO_GIL). The per-layer ops run in the main thread, tens of times per batch: releasing the
// GIL there would hand it to any busy Python thread (tokenizing, reading) at every op, and getting it back
// takes up to the interpreter's switch interval (5 ms) each time. They hold it, as torch's own operators do.
#define NO_GIL py::call_guard<py::gil_scoped_release>()

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.doc() = "CUDA kernels of clip_flash (float16/bfloat16; inputs of any rank, taken as rows over the last dim; outputs "
      "contiguous, in the input's shape).";
  module.def("layer_norm", &clip_flash::layer_norm, "LayerNorm with fp32 statistics; returns a new tensor.",
             py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("eps"));
  module.def("add_layer_norm", &clip_flash::add_layer_norm,
             "(residual + scale * delta, LayerNorm of it); returns two new tensors.",
             py::arg("residual"), py::arg("delta"), py::arg("scale"), py::arg("weight"), py::arg("bias"),
             py::arg("eps"));
  module.def("bias_act", &clip_flash::bias_act,
             "activation(x); writes into x and returns it when in_place, else returns a new tensor.",
             py::arg("x"), py::arg("activation"), py::arg("in_place"));
  module.def("residual_add", &clip_flash::residual_add,
             "residual + scale * delta; returns a new tensor.", py::arg("residual"), py::arg("delta"),
             py::arg("scale"));
  module.def("packed_attention", &clip_flash::packed_attention, "softmax(scale q k^T) v within each packed "
             "sequence of at most 128 tokens (q, k, v: (tokens, heads, 64); cu_seqlens int32); returns a new tensor.",
             py::arg("q"), py::arg("k"), py::arg("v"), py::arg("cu_seqlens"), py::arg("max_seqlen"), py::arg("causal"),
             py::arg("scale"));
  module.def("image_resample", &clip_flash::image_resample, "OpenCLIP's eval image transform of a packed uint8 batch, "
             "bit-exact with Pillow; writes into out.", py::arg("pixels"), py::arg("meta"), py::arg("tables"),
             py::arg("lut"), py::arg("out"), NO_GIL);
  module.def("jpeg_chroma", &clip_flash::jpeg_chroma, "nvJPEG's RGB of 4:2:2/4:2:0 JPEGs with the chroma "
             "re-upsampled the libjpeg-turbo way (not exact); returns a new tensor.", py::arg("rgb"),
             py::arg("horizontal"), py::arg("vertical"), NO_GIL);
  module.def("jpeg_chroma_packed", &clip_flash::jpeg_chroma_packed, "jpeg_chroma in place on a packed uint8 buffer; "
             "images: CPU int64 (n, 5) of (byte offset, H, W, horizontal, vertical). Returns why it could not (empty: done).", py::arg("pixels"),
             py::arg("images"), NO_GIL);
  module.def("nvjpeg_hw_decode", &clip_flash::nvjpeg_hw_decode, "Baseline 3-component JPEGs decoded by nvJPEG's "
             "hardware decoder straight into out (1-D CUDA uint8), input i's (H, W, 3) RGB at byte slots[3i] when "
             "its frame is slots[3i+1] x slots[3i+2]; returns (1 per input written, 0 per input left; why the batch "
             "failed, empty if it did not). Waits for them, without the GIL, on the current stream; calls from several threads "
             "use up to `decoders` decoder states at once.", py::arg("encoded"), py::arg("out"), py::arg("slots"),
             py::arg("library_path"), py::arg("decoders") = 1, NO_GIL);
  module.def("jpeg_dct_to_pixels", &clip_flash::jpeg_dct_to_pixels, "The rest of libjpeg-turbo's decode on the GPU, "
             "bit for bit, for the images a table describes; returns why it could not (empty: queued).",
             py::arg("coefficients"), py::arg("table"), py::arg("planes"), py::arg("pixels"), py::arg("max_blocks"),
             py::arg("max_pixels"), NO_GIL);
  module.def("packed_rows", &clip_flash::packed_rows, "A packed batch's device step in one call: the layout's start "
             "and pixel runs and the JPEGs' coefficients up from page-locked memory (on upload_stream, 0: the "
             "current stream), the JPEG kernels, the resize; returns the rows, queued on the current stream.",
             py::arg("host"), py::arg("images"), py::arg("total_bytes"), py::arg("pixels_at"), py::arg("tables_at"), py::arg("tables_bytes"),
             py::arg("pixels"), py::arg("segments"), py::arg("sources"), py::arg("coefficient_bytes"),
             py::arg("table_at"), py::arg("table"), py::arg("plane_bytes"), py::arg("max_blocks"),
             py::arg("max_pixels"), py::arg("lut"), py::arg("out_h"), py::arg("out_w"), py::arg("upload_stream"),
             NO_GIL);
  module.def("replay_graph", &clip_flash::replay_graph, "One CUDA-graph replay in one call: x into the static input's "
             "first n rows, the graph launched from its cudaGraphExec_t (no generator prologue: graphs that draw no "
             "random numbers only), the first `rows` output rows copied (or L2-normalised) into a new tensor, on "
             "replay_stream (a torch.cuda.Stream's stream_id) between the current stream's work before and after.",
             py::arg("graph_exec"), py::arg("replay_stream"), py::arg("static_input"), py::arg("x"),
             py::arg("n"), py::arg("static_output"), py::arg("rows"), py::arg("normalize"), NO_GIL);
  module.def("host_gate_device_address", &clip_flash::host_gate_device_address, "The address through which the "
             "device reads counter (int64, page-locked host memory; raises if it cannot).", py::arg("counter"),
             py::arg("device_index"));
  module.def("host_gate_wait", &clip_flash::host_gate_wait, "Queue on the device's current stream a wait until "
             "the counter at device_address (host_gate_device_address) reaches ticket, or timeout_ns passed; returns "
             "why it could not (empty: queued).", py::arg("device_address"), py::arg("ticket"), py::arg("timeout_ns"),
             py::arg("device_index"));
  module.def("host_gate_open", &clip_flash::host_gate_open, "counter[0] = max(counter[0], ticket), ordered after "
             "this thread's writes.", py::arg("counter"), py::arg("ticket"));
  clip_flash::register_image_batch_decoder(module);
  clip_flash::register_tensor_pointers(module);
}
