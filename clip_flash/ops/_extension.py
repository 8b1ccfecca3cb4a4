"""Lazy loader of the optional compiled extension ``clip_flash._C`` (the CUDA kernels in ``csrc/``).

The extension is imported on first use, never at package import, so a pure-Python install (CPU machines,
pip's isolated builds) works unchanged. Where it was not installed compiled but can be compiled here (a CUDA
GPU, nvcc, ninja: see ``ops/jit_build.py``), it is compiled once into a per-user cache, saying so and how long
it took. Otherwise the reason is logged once: as a warning when a GPU is visible (the fused ops then run
slower, in plain PyTorch), at info level otherwise.
"""
from __future__ import annotations

import functools
import importlib
import logging
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Optional

import torch

from . import jit_build

logger = logging.getLogger(__name__)

EXTENSION_MODULE = "clip_flash._C"
_DECIDING = threading.Lock()
INSTALL_HINT = "Or build it at install: `CLIP_FLASH_BUILD_EXT=1 pip install --no-build-isolation -e .`."


@dataclass(frozen=True)
class ExtensionState:
    """The loaded module (or None), how it came to be loaded, or why it could not be."""

    module: Optional[ModuleType]
    origin: Optional[str] = None  # e.g. "installed (built by setup.py)"; None when not loaded
    reason: Optional[str] = None  # why it is not loaded; None when it is


def _installed() -> ExtensionState:
    try:
        module = importlib.import_module(EXTENSION_MODULE)
    except (ImportError, OSError) as error:  # OSError: a shared library it links against is missing
        return ExtensionState(None, reason=f"{EXTENSION_MODULE} was not installed compiled "
                                           f"({type(error).__name__}: {error})")
    return ExtensionState(module, origin=f"installed with the package ({module.__file__})")


def _compiled_here(plan: jit_build.BuildPlan) -> ExtensionState:
    """The module from the per-user cache, compiling it first when it is not there yet."""
    try:
        module = jit_build.import_compiled(plan)
    except (ImportError, OSError) as error:  # a stale or foreign file: compiling again replaces it
        logger.info("compiled %s in %s does not import (%s); compiling again", EXTENSION_MODULE, plan.directory,
                    error)
        module = None
    if module is not None:
        return ExtensionState(module, origin=f"compiled on first use earlier, loaded from {plan.directory}")
    toolchain = jit_build.describe_toolchain(plan.toolchain)
    logger.warning("clip_flash: compiling the CUDA extension %s on first use (%s), once; about 1-2 minutes",
                   EXTENSION_MODULE, toolchain)
    try:
        module, seconds = jit_build.compile_extension(plan)
    except jit_build.JitBuildError as error:
        return ExtensionState(None, reason=f"{EXTENSION_MODULE} could not be compiled on first use: {error}")
    logger.warning("clip_flash: compiled %s on first use in %.1f s (%s) into %s; later runs load it from there",
                   EXTENSION_MODULE, seconds, toolchain, plan.directory)
    return ExtensionState(module, origin=f"compiled on first use in {seconds:.1f} s into {plan.directory}")


@functools.lru_cache(maxsize=None)
def _state() -> ExtensionState:
    """Import, or compile and import, the extension once per process (one thread at a time: a second
    thread arriving during a build waits for it, then imports what it compiled)."""
    with _DECIDING:
        return _decide()


def _decide() -> ExtensionState:
    installed = _installed()
    if installed.module is not None:
        return installed
    if not torch.cuda.is_available():  # a CPU machine never compiles, nor warns
        state = ExtensionState(None, reason=f"no CUDA device: the fused ops run in plain PyTorch "
                                            f"({EXTENSION_MODULE} holds CUDA kernels only)")
        logger.info(state.reason)
        return state
    plan = jit_build.plan_build()
    if plan.build:
        state = _compiled_here(plan)
        if state.module is None:
            state = ExtensionState(None, reason=f"{state.reason}; the fused ops run in plain PyTorch (slower)")
    else:
        state = ExtensionState(None, reason=(
            f"{installed.reason}, and it cannot be compiled on first use here: {plan.reason}; the fused ops "
            f"run in plain PyTorch (slower). {INSTALL_HINT}"))
    if state.module is None:
        logger.warning(state.reason)
    return state


def load_extension() -> Optional[ModuleType]:
    """The ``clip_flash._C`` module, or None when it cannot be imported or compiled here."""
    return _state().module


def extension_available() -> bool:
    """Whether the compiled CUDA kernels can be used."""
    return _state().module is not None


def extension_unavailable_reason() -> Optional[str]:
    """Why the compiled extension cannot be used, or None when it can."""
    return _state().reason


def extension_origin() -> Optional[str]:
    """Where the loaded extension came from (installed, or compiled on first use and where), or None."""
    return _state().origin
