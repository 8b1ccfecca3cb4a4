"""Compile ``clip_flash._C`` on first use when the install did not (pip's isolated builds cannot: no torch).

On a machine with a CUDA GPU, a CUDA build of torch, a CUDA toolkit (nvcc) and ninja, the kernels in
``csrc/`` are compiled once with ``torch.utils.cpp_extension.load`` into a per-user cache, one directory per
(torch, CUDA, GPU architectures, Python, sources, flags): later processes import the compiled module from
there in milliseconds, and any change of those builds a fresh one. A CPU machine never compiles anything
(nothing is even probed). ``CLIP_FLASH_JIT=0`` turns this off; ``CLIP_FLASH_CACHE`` moves the cache.

A failed build is remembered in its directory (with the compiler's output in ``build.log``) so later
processes do not spend the same minutes failing again; delete the directory to retry.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Mapping, Optional, Tuple

from .. import envs
from .extension_spec import CXX_FLAGS, EXTENSION_SOURCES, NVCC_FLAGS, SOURCE_SUFFIXES

JIT_SWITCH = envs.JIT.name
CACHE_ENV = envs.CACHE.name
FAILED_MARKER = "FAILED"
BUILD_LOG = "build.log"
STALE_LOCK_S = 3600.0  # a build takes minutes; a lock this old was left by a process that died building
# Where an editable install or a source checkout keeps csrc/: beside the package directory.
DEFAULT_SOURCE_ROOT = Path(__file__).resolve().parents[2]


class JitBuildError(RuntimeError):
    """Compiling the extension failed (or failed before, and is not retried); the message says where the log is."""


@dataclass(frozen=True)
class Toolchain:
    """What decides whether a build can happen here (probed, or given by tests)."""

    cuda_available: bool
    torch_version: str
    torch_cuda: Optional[str]
    cuda_home: Optional[str] = None
    nvcc: Optional[str] = None
    ninja: bool = False
    capabilities: Tuple[Tuple[int, int], ...] = ()


@dataclass(frozen=True)
class BuildPlan:
    """Whether to compile, why (or why not), and where the compiled module lives."""

    build: bool
    reason: str
    directory: Optional[Path] = None
    module_name: str = ""
    sources: Tuple[Path, ...] = field(default_factory=tuple)
    toolchain: Optional[Toolchain] = None


def probe_toolchain() -> Toolchain:
    """This machine's toolchain. Without a CUDA device nothing else is probed (torch's extension helpers
    warn about a missing CUDA runtime when merely imported there)."""
    import torch

    if not torch.cuda.is_available():
        return Toolchain(False, torch.__version__, torch.version.cuda)
    from torch.utils.cpp_extension import CUDA_HOME, is_ninja_available

    nvcc = None
    if CUDA_HOME:
        candidate = Path(CUDA_HOME) / "bin" / ("nvcc.exe" if os.name == "nt" else "nvcc")
        nvcc = str(candidate) if candidate.is_file() else None
    capabilities = tuple(sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}))
    return Toolchain(True, torch.__version__, torch.version.cuda, CUDA_HOME, nvcc, is_ninja_available(),
                     capabilities)


def cache_root(environ: Mapping[str, str] = os.environ) -> Path:
    """The per-user directory compiled extensions are kept in."""
    if environ.get(CACHE_ENV):
        return Path(environ[CACHE_ENV]).expanduser()
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "clip_flash"


def _source_files(source_root: Path) -> Tuple[Path, ...]:
    return tuple(sorted(path for path in (source_root / "csrc").rglob("*") if path.suffix in SOURCE_SUFFIXES))


def cache_key(toolchain: Toolchain, source_root: Path, environ: Mapping[str, str] = os.environ) -> str:
    """A short hash of everything the compiled module depends on."""
    digest = hashlib.sha256()
    visible = ";".join(f"{major}.{minor}" for major, minor in toolchain.capabilities)
    arch = environ.get("TORCH_CUDA_ARCH_LIST") or visible
    for part in (toolchain.torch_version, toolchain.torch_cuda or "", toolchain.cuda_home or "", arch,
                 sys.implementation.cache_tag, " ".join(CXX_FLAGS), " ".join(NVCC_FLAGS)):
        digest.update(part.encode() + b"\0")
    for path in _source_files(source_root):
        digest.update(str(path.relative_to(source_root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def plan_build(toolchain: Optional[Toolchain] = None, source_root: Path = DEFAULT_SOURCE_ROOT,
               environ: Mapping[str, str] = os.environ) -> BuildPlan:
    """Whether ``clip_flash._C`` can be compiled here now, and why not when it cannot."""
    switch = environ.get(JIT_SWITCH, "").strip()
    if switch == "0":
        return BuildPlan(False, f"{JIT_SWITCH}=0 turns off compiling on first use")
    toolchain = toolchain or probe_toolchain()
    if not toolchain.cuda_available:
        return BuildPlan(False, "no CUDA device, so nothing to compile for", toolchain=toolchain)
    if not toolchain.torch_cuda:
        return BuildPlan(False, f"torch {toolchain.torch_version} is not a CUDA build", toolchain=toolchain)
    sources = tuple(source_root / name for name in EXTENSION_SOURCES)
    missing = [str(path) for path in sources if not path.is_file()]
    if missing:
        return BuildPlan(False, f"the CUDA sources are not beside this install ({missing[0]} is missing): "
                                "install from a source checkout (pip install -e .)", toolchain=toolchain)
    if toolchain.nvcc is None:
        where = f" (CUDA_HOME={toolchain.cuda_home} has no bin/nvcc)" if toolchain.cuda_home else ""
        return BuildPlan(False, f"no CUDA toolkit found{where}: install one matching torch's CUDA "
                                f"{toolchain.torch_cuda} and set CUDA_HOME", toolchain=toolchain)
    if not toolchain.ninja:
        return BuildPlan(False, "ninja is not installed (python -m pip install ninja)", toolchain=toolchain)
    key = cache_key(toolchain, source_root, environ)
    directory = cache_root(environ) / "extensions" / key
    return BuildPlan(True, f"CUDA toolkit {toolchain.nvcc} and ninja found", directory, f"clip_flash_C_{key}",
                     sources, toolchain)


def _compiled_file(plan: BuildPlan) -> Optional[Path]:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = plan.directory / f"{plan.module_name}{suffix}"
        if candidate.is_file():
            return candidate
    return None


def import_compiled(plan: BuildPlan) -> Optional[ModuleType]:
    """The module compiled earlier into ``plan.directory``, or None when there is none."""
    path = _compiled_file(plan)
    if path is None:
        return None
    import torch  # noqa: F401  (the module links against torch's libraries: load them first)

    spec = importlib.util.spec_from_file_location(plan.module_name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _drop_abandoned_lock(directory: Path, older_than_s: float = STALE_LOCK_S) -> None:
    """torch's builder waits for as long as its ``lock`` file exists; one left by a killed build would make
    every later process wait forever. A lock older than any build takes is removed."""
    lock = directory / "lock"
    try:
        if time.time() - lock.stat().st_mtime > older_than_s:
            lock.unlink()
    except FileNotFoundError:
        pass


def compile_extension(plan: BuildPlan) -> Tuple[ModuleType, float]:
    """Compile and import the extension per ``plan``; (module, seconds). Raises :class:`JitBuildError`."""
    failed = plan.directory / FAILED_MARKER
    if failed.is_file():
        raise JitBuildError(f"an earlier build in {plan.directory} failed ({failed.read_text().strip()}); "
                            f"see {plan.directory / BUILD_LOG}, and delete that directory to try again")
    from torch.utils.cpp_extension import load

    plan.directory.mkdir(parents=True, exist_ok=True)
    _drop_abandoned_lock(plan.directory)
    started = time.perf_counter()
    try:
        module = load(name=plan.module_name, sources=[str(path) for path in plan.sources],
                      extra_cflags=list(CXX_FLAGS), extra_cuda_cflags=list(NVCC_FLAGS),
                      build_directory=str(plan.directory), verbose=False)
    except Exception as error:  # the compiler's output is in the exception's text
        (plan.directory / BUILD_LOG).write_text(f"{type(error).__name__}: {error}\n", encoding="utf-8")
        failed.write_text(f"{type(error).__name__}, {time.strftime('%Y-%m-%d %H:%M:%S')}", encoding="utf-8")
        raise JitBuildError(f"compiling failed ({type(error).__name__}); compiler output in "
                            f"{plan.directory / BUILD_LOG}") from error
    return module, time.perf_counter() - started


def describe_toolchain(toolchain: Optional[Toolchain]) -> str:
    """``torch 2.11.0+cu130, CUDA 13.0, sm_90`` for log lines."""
    if toolchain is None:
        return ""
    arches = ", ".join(f"sm_{major}{minor}" for major, minor in toolchain.capabilities)
    return f"torch {toolchain.torch_version}, CUDA {toolchain.torch_cuda}" + (f", {arches}" if arches else "")
