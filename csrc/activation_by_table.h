// The activation after c_fc by table lookup, for 16-bit elements: see activation_by_table.cu.
#pragma once

#include <cuda_runtime.h>

#include "kernel_args.h"

namespace clip_flash {

// Runs args' activation through the table kernel and returns true where it takes the call (fp16/bf16, a
// non-identity activation, rows of whole 16-byte packs, at least kActivationTableMinElements elements);
// false, with nothing launched, elsewhere. The results are bit for bit those of the per-element kernel.
bool launch_activation_by_table(const BiasActArgs& args, cudaStream_t stream);

// Below this many elements computing the table costs more than the lookups save.
constexpr int64_t kActivationTableMinElements = int64_t{1} << 24;

}  // namespace clip_flash
