"""The build of clip_flash's optional CUDA extension ``clip_flash._C`` (metadata: pyproject.toml).

The extension is built only when it can be: torch importable here, a CUDA build of torch, a CUDA
toolkit (``CUDA_HOME``), and a target architecture (a visible GPU, or ``TORCH_CUDA_ARCH_LIST``).
Without it the package is pure Python and runs the same ops in plain PyTorch.

Environment:
  CLIP_FLASH_BUILD_EXT=0   never build the extension
  CLIP_FLASH_BUILD_EXT=1   always build it; fail if that is impossible
  (unset)                  build it when possible, otherwise say why and install pure Python
  TORCH_CUDA_ARCH_LIST     target architectures, e.g. "9.0" (default: the local GPU's)
  MAX_JOBS                 parallel compile jobs (ninja)

Typical GPU install: ``pip install --no-build-isolation -e .`` (pip's isolated build environment has no
torch, so an isolated build is always pure Python).
"""
import os
import runpy
import sys
from pathlib import Path
from typing import List, Optional, Tuple

from setuptools import setup

BUILD_SWITCH = "CLIP_FLASH_BUILD_EXT"  # documented with the others in clip_flash/envs.py
EXTENSION_NAME = "clip_flash._C"
# Sources and flags are shared with the build on first use (clip_flash/ops/jit_build.py); read as a file so
# the build never imports the package.
SPEC = runpy.run_path(str(Path(__file__).resolve().parent / "clip_flash" / "ops" / "extension_spec.py"))
EXTENSION_SOURCES = list(SPEC["EXTENSION_SOURCES"])


def reason_extension_cannot_build() -> Optional[str]:
    """Why the CUDA extension cannot be built in this environment, or None when it can."""
    try:
        import torch
        from torch.utils.cpp_extension import CUDA_HOME
    except ImportError as error:
        return f"torch is not importable in the build environment ({error}); use --no-build-isolation"
    if not torch.version.cuda:
        return f"torch {torch.__version__} is not a CUDA build"
    if CUDA_HOME is None:
        return "no CUDA toolkit found (set CUDA_HOME)"
    # torch guesses CUDA_HOME from the nvcc on PATH, which a wrapper script can make wrong.
    if not (Path(CUDA_HOME) / "include" / "cuda_runtime_api.h").is_file():
        return f"CUDA_HOME={CUDA_HOME} has no include/cuda_runtime_api.h (set CUDA_HOME to the toolkit)"
    if not os.environ.get("TORCH_CUDA_ARCH_LIST") and not torch.cuda.is_available():
        return "no GPU visible and TORCH_CUDA_ARCH_LIST unset, so no target architecture"
    return None


def should_build_extension() -> Tuple[bool, str]:
    """Whether to build ``clip_flash._C``, and why (from CLIP_FLASH_BUILD_EXT and the environment)."""
    switch = os.environ.get(BUILD_SWITCH, "").strip()
    if switch not in ("", "0", "1"):
        raise RuntimeError(f"{BUILD_SWITCH} must be 0, 1 or unset, got {switch!r}")
    if switch == "0":
        return False, f"{BUILD_SWITCH}=0"
    reason = reason_extension_cannot_build()
    if reason is None:
        return True, f"{BUILD_SWITCH}={switch}" if switch else "CUDA build environment found"
    if switch == "1":
        raise RuntimeError(f"{BUILD_SWITCH}=1 but the CUDA extension cannot be built: {reason}")
    return False, reason


def cuda_extensions() -> Tuple[List, dict]:
    """``ext_modules`` and ``cmdclass`` for setup(): the extension, or nothing with a one-line note why."""
    build, reason = should_build_extension()
    if not build:
        print(f"clip_flash: not building the CUDA extension {EXTENSION_NAME}: {reason}", file=sys.stderr)
        return [], {}
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    print(f"clip_flash: building the CUDA extension {EXTENSION_NAME} ({reason})", file=sys.stderr)
    extension = CUDAExtension(
        name=EXTENSION_NAME,
        sources=EXTENSION_SOURCES,
        extra_compile_args={"cxx": list(SPEC["CXX_FLAGS"]), "nvcc": list(SPEC["NVCC_FLAGS"])},
    )
    # BuildExtension uses ninja when it is installed and falls back to setuptools otherwise.
    return [extension], {"build_ext": BuildExtension}


ext_modules, cmdclass = cuda_extensions()

setup(ext_modules=ext_modules, cmdclass=cmdclass)
