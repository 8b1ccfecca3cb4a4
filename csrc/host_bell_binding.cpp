// A bell between threads of one process: a counter one thread rings and another polls, without the GIL, for a
// bounded time before it goes to sleep on an ordinary lock (clip_flash/serve/spin_queue.py). A thread woken
// from sleep on a core that idled runs its next steps 1.2-1.8x slower than one that kept its core busy
// (benchmarks/results/h200/idle_cores_a64cfa3); the serving threads on a lone request's path poll instead.
// Plain C++, no CUDA.
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <cstdint>

namespace clip_flash {
namespace {

int64_t* bell_counter(const at::Tensor& counter) {
  TORCH_CHECK(counter.device().is_cpu() && counter.scalar_type() == at::kLong && counter.numel() >= 1 &&
                  counter.is_contiguous(),
              "the bell's counter must be a contiguous int64 CPU tensor");
  return counter.data_ptr<int64_t>();
}

inline void relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace

// Adds one to counter[0], ordered after every write this thread made before; returns the new count.
int64_t host_bell_ring(const at::Tensor& counter) {
  return __atomic_add_fetch(bell_counter(counter), 1, __ATOMIC_SEQ_CST);
}

// counter[0] now.
int64_t host_bell_count(const at::Tensor& counter) {
  return __atomic_load_n(bell_counter(counter), __ATOMIC_SEQ_CST);
}

// Polls until counter[0] differs from seen (true) or spin_ns passed (false). Called without the GIL.
bool host_bell_wait(const at::Tensor& counter, int64_t seen, int64_t spin_ns) {
  const int64_t* count = bell_counter(counter);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(spin_ns);
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (__atomic_load_n(count, __ATOMIC_ACQUIRE) != seen) return true;
      relax();
    }
    if (std::chrono::steady_clock::now() >= deadline) return __atomic_load_n(count, __ATOMIC_ACQUIRE) != seen;
  }
}

}  // namespace clip_flash
