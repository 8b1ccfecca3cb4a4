"""Kernels kept off by default because they measured no faster than what they would replace."""
