// Checks for code that runs with the GIL released (the bindings wrapped in without_gil, csrc/bindings.cpp).
//
// These throw a plain std::runtime_error, which needs nothing from Python to build (a TORCH_CHECK's
// c10::Error also records a backtrace); without_gil rethrows it once the GIL is back, and pybind11 turns it
// into a RuntimeError.
#pragma once

#include <stdexcept>

#include <c10/util/StringUtil.h>
#include <cuda_runtime_api.h>

#define CLIP_FLASH_CHECK(condition, ...)                            \
  do {                                                              \
    if (!(condition)) {                                             \
      throw std::runtime_error(::c10::str(__VA_ARGS__));            \
    }                                                               \
  } while (0)

// C10_CUDA_KERNEL_LAUNCH_CHECK's counterpart.
#define CLIP_FLASH_LAUNCH_CHECK()                                                               \
  do {                                                                                          \
    const cudaError_t launch_error = cudaGetLastError();                                        \
    CLIP_FLASH_CHECK(launch_error == cudaSuccess, "CUDA kernel launch failed: ",                \
                     cudaGetErrorString(launch_error));                                         \
  } while (0)
