// The host's half of a host gate (clip_flash/ops/host_gate.py, csrc/host_gate.cu): raising the page-locked counter
// a gate's wait kernel polls. Plain C++ (no CUDA), so that the batch decoder can open a gate the moment its pixels
// are written, without taking the GIL back first.
#pragma once

#include <atomic>
#include <cstdint>

namespace clip_flash {

// counter = max(counter, ticket): the counter only rises, so openings from several threads never close a gate
// again. Ordered after every write this thread has seen (the data the gated copies read).
inline void open_host_counter(int64_t* counter, int64_t ticket) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  int64_t seen = __atomic_load_n(counter, __ATOMIC_SEQ_CST);
  while (seen < ticket &&
         !__atomic_compare_exchange_n(counter, &seen, ticket, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
  }
}

}  // namespace clip_flash
