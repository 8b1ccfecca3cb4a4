"""The project's kernels as torch ops (``fused_ops``), the lazy loader of their CUDA extension, and
``experimental`` kernels that are off by default."""
