"""The project's kernels as torch ops (``fused_ops``), the lazy loader of their CUDA extension, the host gate (a
stream that waits for the host: ``host_gate``), and ``experimental`` kernels that are off by default."""
