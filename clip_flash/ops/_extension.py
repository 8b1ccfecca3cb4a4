"""Lazy loader of the optional compiled extension ``clip_flash._C`` (the CUDA kernels in ``csrc/``).

The extension is imported on first use, never at package import, so a pure-Python install (CPU machines,
pip's isolated builds) works unchanged. When it is missing, the reason is logged once: as a warning when a
GPU is visible (the fused ops then run slower, in plain PyTorch), at info level otherwise.
"""
from __future__ import annotations

import functools
import importlib
import logging
from types import ModuleType
from typing import Optional, Tuple

import torch

logger = logging.getLogger(__name__)

EXTENSION_MODULE = "clip_flash._C"


@functools.lru_cache(maxsize=None)
def _load() -> Tuple[Optional[ModuleType], Optional[str]]:
    """Import the extension once; returns (module, None) or (None, reason)."""
    try:
        return importlib.import_module(EXTENSION_MODULE), None
    except (ImportError, OSError) as error:  # OSError: a shared library it links against is missing
        reason = (
            f"{EXTENSION_MODULE} is unavailable ({type(error).__name__}: {error}); the fused ops run in plain "
            "PyTorch. Build it with `CLIP_FLASH_BUILD_EXT=1 pip install --no-build-isolation -e .`."
        )
    level = logging.WARNING if torch.cuda.is_available() else logging.INFO
    logger.log(level, reason)
    return None, reason


def load_extension() -> Optional[ModuleType]:
    """The ``clip_flash._C`` module, or None when it cannot be imported."""
    return _load()[0]


def extension_available() -> bool:
    """Whether the compiled CUDA kernels can be used."""
    return _load()[0] is not None


def extension_unavailable_reason() -> Optional[str]:
    """Why the compiled extension cannot be used, or None when it can."""
    return _load()[1]
