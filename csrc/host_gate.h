// A stream that waits on the host: a one-thread kernel that spins until a counter in page-locked host memory
// reaches a ticket (csrc/host_gate.cu); checks live in csrc/host_gate_binding.cpp, the Python side is
// clip_flash/ops/host_gate.py.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace clip_flash {

// Queues the wait on `stream`: work queued behind it starts once counter[0] >= ticket, or after timeout_ns of
// waiting (a host that never opens the gate must not hold the stream for ever); then counter[1] is raised to ticket.
void launch_host_gate_wait(int64_t* counter, int64_t ticket, uint64_t timeout_ns, cudaStream_t stream);

}  // namespace clip_flash
