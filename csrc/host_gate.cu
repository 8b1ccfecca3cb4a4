// The device half of clip_flash/ops/host_gate.py: one thread polls a counter the host writes (page-locked memory,
// read over the bus: volatile, never cached) until it reaches the ticket. Kernels and copies queued behind it on
// the same stream (or on streams waiting for it) start when it returns.
#include <cstdint>

#include "host_gate.h"

namespace clip_flash {
namespace {

__device__ __forceinline__ uint64_t global_nanoseconds() {
  uint64_t now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  return now;
}

__global__ void host_gate_wait_kernel(volatile int64_t* counter, int64_t ticket, uint64_t timeout_ns) {
  const uint64_t started = global_nanoseconds();
  while (counter[0] < ticket) {
    if (global_nanoseconds() - started > timeout_ns) {
      if (counter[1] < ticket) counter[1] = ticket;  // the host reads it once the work behind has run
      __threadfence_system();
      return;
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    __nanosleep(1000);  // a poll a microsecond or so: the bus, not the SM, sets the reaction time
#endif
  }
  // What the host wrote before the counter (the data the copies behind this kernel read) is visible from here on.
  __threadfence_system();
}

}  // namespace

void launch_host_gate_wait(int64_t* counter, int64_t ticket, uint64_t timeout_ns, cudaStream_t stream) {
  host_gate_wait_kernel<<<1, 1, 0, stream>>>(counter, ticket, timeout_ns);
}

}  // namespace clip_flash
