// One replay of a captured CUDA graph in one call: the caller's rows copied into the graph's static input, the graph
// launched, its output rows copied (or L2-normalised as torch.nn.functional.normalize does) into a new tensor, on the
// graph's replay stream, ordered after the caller's stream and before the caller's later work. The same steps as
// clip_flash/graphs/capture.py's CaptureSpace.replay, which made them in about fifteen Python-level calls.
//
// The graph is launched from its cudaGraphExec_t, without torch.cuda.CUDAGraph.replay's prologue, which advances the
// CUDA generators' offsets for graphs that draw random numbers: the caller passes only graphs whose replay through
// torch left the default generator's offset unchanged (they draw none).
#include <ATen/core/Tensor.h>
#include <ATen/ops/div.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <vector>

#include "check_message.h"

namespace clip_flash {
namespace {

// `waiting` waits for what `recorded` has queued so far.
void stream_waits(const c10::cuda::CUDAStream& waiting, const c10::cuda::CUDAStream& recorded) {
  if (waiting == recorded) return;
  cudaEvent_t event;
  C10_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  C10_CUDA_CHECK(cudaEventRecord(event, recorded.stream()));
  C10_CUDA_CHECK(cudaStreamWaitEvent(waiting.stream(), event, 0));
  C10_CUDA_CHECK(cudaEventDestroy(event));  // released once the wait has passed it
}

}  // namespace

// Returns the (rows, ...) output rows, allocated on the caller's current stream.
//   graph_exec: the graph's cudaGraphExec_t as an integer (torch.cuda.CUDAGraph.raw_cuda_graph_exec()).
//   replay_stream: the stream the graph is replayed on, as torch.cuda.Stream's stream_id (on the graph's device).
//   static_input, static_output: the graph's input and output buffers; x: copied into the first n input rows (as
//   Tensor.copy_ takes it), on the graph's device or in page-locked host memory; rows: the output rows returned.
at::Tensor replay_graph(int64_t graph_exec, int64_t replay_stream, const at::Tensor& static_input,
                        const at::Tensor& x, int64_t n, const at::Tensor& static_output, int64_t rows,
                        bool normalize) {
  TORCH_CHECK(graph_exec != 0, "graph_exec must be a cudaGraphExec_t");
  TORCH_CHECK(static_input.is_cuda() && static_output.is_cuda() && static_input.device() == static_output.device(),
              "the graph's static input and output must be CUDA tensors on one device");
  TORCH_CHECK(static_input.dim() >= 1 && static_output.dim() >= 1, "the graph's buffers must have a batch dimension");
  TORCH_CHECK(n >= 0 && n <= static_input.size(0),
              check_message("n (", n, ") must lie within the graph's ", static_input.size(0), " input rows"));
  TORCH_CHECK(rows >= 0 && rows <= static_output.size(0),
              check_message("rows (", rows, ") must lie within the graph's ", static_output.size(0), " output rows"));
  TORCH_CHECK(x.is_cuda() ? x.device() == static_input.device() : x.is_pinned(),
              "the input must be on the graph's device or in page-locked host memory");
  const c10::Device device = static_input.device();
  const c10::cuda::CUDAGuard device_guard(device);
  const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(device.index());
  const c10::cuda::CUDAStream stream =
      c10::cuda::CUDAStream::unpack3(replay_stream, device.index(), c10::DeviceType::CUDA);
  // Allocated on the caller's stream, which waits for the copy out below before any later use or reuse.
  std::vector<int64_t> shape(static_output.sizes().begin(), static_output.sizes().end());
  shape[0] = rows;
  at::Tensor out = at::empty(shape, static_output.options());
  stream_waits(stream, caller);
  {
    const c10::cuda::CUDAStreamGuard on_stream(stream);
    static_input.narrow(0, 0, n).copy_(x, /*non_blocking=*/true);
    C10_CUDA_CHECK(cudaGraphLaunch(reinterpret_cast<cudaGraphExec_t>(graph_exec), stream.stream()));
    const at::Tensor produced = static_output.narrow(0, 0, rows);
    if (normalize) {  // torch.nn.functional.normalize(produced, dim=-1, out=out), op for op (its Tensor.norm is
                      // torch.linalg.vector_norm for a strided CUDA tensor)
      at::Tensor denominator = at::linalg_vector_norm(produced, 2.0, at::IntArrayRef{-1}, /*keepdim=*/true);
      denominator.clamp_min_(1e-12);
      at::div_out(out, produced, denominator.expand_as(produced));
    } else {
      out.copy_(produced);
    }
  }
  stream_waits(caller, stream);
  return out;
}

}  // namespace clip_flash
