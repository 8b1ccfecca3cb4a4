// Torch-facing side of csrc/host_gate.cu: the counter is a page-locked host tensor (torch's pinned allocator), which
// CUDA maps into the device's address space; the kernel reads it through the device pointer CUDA gives for it.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <string>

#include "host_counter.h"
#include "host_gate.h"

namespace clip_flash {
namespace {

std::string check_counter(const at::Tensor& counter) {
  if (counter.is_cuda() || counter.scalar_type() != at::kLong || counter.numel() < 2 || !counter.is_contiguous() ||
      !counter.is_pinned()) {
    return "the counter must be a contiguous int64 tensor of 2 in page-locked host memory";
  }
  return "";
}

}  // namespace

// The address through which the device reads the counter (CUDA maps page-locked memory into its address space);
// resolved once per gate: per wait, it and the checks cost tens of microseconds on a core that idled.
int64_t host_gate_device_address(const at::Tensor& counter, int64_t device_index) {
  const std::string why = check_counter(counter);
  TORCH_CHECK(why.empty(), why);
  TORCH_CHECK(device_index >= 0, "a CUDA device index is needed");
  const c10::cuda::CUDAGuard device_guard(static_cast<c10::DeviceIndex>(device_index));
  void* on_device = nullptr;
  const cudaError_t status = cudaHostGetDevicePointer(&on_device, counter.data_ptr(), 0);
  if (status != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it
    TORCH_CHECK(false, "the counter is not mapped into the device's memory: ", cudaGetErrorString(status));
  }
  return reinterpret_cast<int64_t>(on_device);
}

// Queues, on the device's current stream, a wait until the counter at device_address (host_gate_device_address)
// reaches ticket (at most timeout_ns, then its second entry is raised to ticket); returns why it could not (empty:
// queued). The caller keeps the counter alive.
std::string host_gate_wait(int64_t device_address, int64_t ticket, int64_t timeout_ns, int64_t device_index) {
  if (device_address == 0 || device_index < 0 || timeout_ns <= 0) {
    return "a counter's device address, a CUDA device index and a positive timeout are needed";
  }
  const c10::cuda::CUDAGuard device_guard(static_cast<c10::DeviceIndex>(device_index));
  launch_host_gate_wait(reinterpret_cast<int64_t*>(device_address), ticket, static_cast<uint64_t>(timeout_ns),
                        c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_index)).stream());
  const cudaError_t status = cudaGetLastError();
  return status == cudaSuccess ? "" : std::string("host gate launch failed: ") + cudaGetErrorString(status);
}

// counter[0] = max(counter[0], ticket), after every write this thread has seen (see host_counter.h).
void host_gate_open(const at::Tensor& counter, int64_t ticket) {
  TORCH_CHECK(check_counter(counter).empty(), check_counter(counter));
  open_host_counter(counter.data_ptr<int64_t>(), ticket);
}

}  // namespace clip_flash
