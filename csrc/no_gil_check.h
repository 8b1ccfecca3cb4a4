// Checks for code that runs with the GIL released (the bindings marked NO_GIL).
//
// A TORCH_CHECK that failed there crashed the process on the H100 machine (segmentation fault, torch 2.11):
// building a c10::Error records where it came from, and in a Python process that reaches into the
// interpreter, which needs the GIL. These throw a plain std::runtime_error, which touches nothing of Python;
// pybind11 turns it into a RuntimeError once the GIL is back.
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
