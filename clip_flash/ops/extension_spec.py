"""What ``clip_flash._C`` is built from: sources and compiler flags, shared by setup.py's build and the
build on first use (``jit_build``). Imports nothing, so setup.py can read it without importing the package."""

# Relative to the repository root (where setup.py is).
EXTENSION_SOURCES = (
    "csrc/bindings.cpp",
    "csrc/layer_norm_kernels.cu",
    "csrc/elementwise_kernels.cu",
    "csrc/packed_attention_binding.cpp",
    "csrc/packed_attention.cu",
    "csrc/image_resample_binding.cpp",
    "csrc/image_resample.cu",
    "csrc/jpeg_chroma_binding.cpp",
    "csrc/jpeg_chroma.cu",
    "csrc/nvjpeg_decode.cpp",
    "csrc/jpeg_dct_binding.cpp",
    "csrc/jpeg_dct.cu",
    "csrc/packed_rows_binding.cpp",
    "csrc/graph_replay_binding.cpp",
    "csrc/tensor_pointers_binding.cpp",
    "csrc/host_gate_binding.cpp",
    "csrc/host_gate.cu",
    "csrc/image_batch_decoder.cpp",
    "csrc/jpeg_entropy_split.cpp",
    "csrc/png_decoder.cpp",
    "csrc/image_batch_decoder_binding.cpp",
)
# Every file of these kinds under csrc/ (headers included) keys the build on first use.
SOURCE_SUFFIXES = (".cpp", ".cu", ".cuh", ".h")
CXX_FLAGS = ("-O3", "-std=c++17")
# No --use_fast_math: the activations need accurate erff/tanhf/expf.
NVCC_FLAGS = ("-O3", "-std=c++17", "--expt-relaxed-constexpr", "-lineinfo")
