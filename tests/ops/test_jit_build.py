"""Compiling clip_flash._C on first use: when it happens, where it goes, what is said. Nothing is compiled
here: the toolchain and the compiler are stand-ins (the real build is checked on the GPU machine with
benchmarks/check_jit_build.py)."""
from __future__ import annotations

import dataclasses
import logging
import types
from pathlib import Path

import pytest
import torch

from clip_flash.ops import _extension, jit_build
from clip_flash.ops.extension_spec import EXTENSION_SOURCES

READY = jit_build.Toolchain(True, "2.11.0+cu130", "13.0", "/usr/local/cuda", "/usr/local/cuda/bin/nvcc", True,
                            ((9, 0),))


def _source_tree(root: Path) -> Path:
    for name in EXTENSION_SOURCES + ("csrc/kernel_common.cuh",):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(f"// {name}\n")
    return root


@pytest.fixture
def no_compiler(monkeypatch):
    """Fail the test if anything tries to compile."""
    import torch.utils.cpp_extension as cpp_extension

    monkeypatch.setattr(cpp_extension, "load", lambda *a, **k: pytest.fail("the extension was compiled"))


@pytest.fixture
def fresh_state():
    _extension._state.cache_clear()
    yield
    _extension._state.cache_clear()


# ----- the decision ---------------------------------------------------------------------------
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only path")
def test_cpu_machine_never_compiles_nor_warns(no_compiler, fresh_state, caplog):
    plan = jit_build.plan_build()
    assert not plan.build and "no CUDA device" in plan.reason
    with caplog.at_level(logging.DEBUG, logger=_extension.__name__):
        assert not _extension.extension_available()
    reason = _extension.extension_unavailable_reason()
    assert "no CUDA device" in reason and _extension.extension_origin() is None
    assert all(record.levelno < logging.WARNING for record in caplog.records)


@pytest.mark.parametrize("toolchain, environ, expected", [
    (READY, {"CLIP_FLASH_JIT": "0"}, "CLIP_FLASH_JIT=0"),
    (jit_build.Toolchain(False, "2.11.0+cu130", "13.0"), {}, "no CUDA device"),
    (jit_build.Toolchain(True, "2.11.0+cpu", None), {}, "is not a CUDA build"),
    (jit_build.Toolchain(True, "2.11.0+cu130", "13.0", None, None, True, ((9, 0),)), {}, "no CUDA toolkit found"),
    (jit_build.Toolchain(True, "2.11.0+cu130", "13.0", "/opt/cuda", None, True, ((9, 0),)), {},
     "/opt/cuda has no bin/nvcc"),
    (jit_build.Toolchain(True, "2.11.0+cu130", "13.0", "/usr/local/cuda", "/usr/local/cuda/bin/nvcc", False,
                         ((9, 0),)), {}, "ninja is not installed"),
])
def test_each_missing_piece_is_named(tmp_path, toolchain, environ, expected):
    plan = jit_build.plan_build(toolchain, _source_tree(tmp_path), environ)
    assert not plan.build and expected in plan.reason


def test_sources_not_beside_the_install(tmp_path):
    plan = jit_build.plan_build(READY, tmp_path, {})
    assert not plan.build and "csrc/bindings.cpp" in plan.reason and "pip install -e ." in plan.reason


def test_ready_toolchain_builds_into_the_per_user_cache(tmp_path):
    root = _source_tree(tmp_path / "src")
    plan = jit_build.plan_build(READY, root, {"CLIP_FLASH_CACHE": str(tmp_path / "cache")})
    assert plan.build and plan.directory.parent == tmp_path / "cache" / "extensions"
    assert plan.module_name == f"clip_flash_C_{plan.directory.name}"
    assert [p.relative_to(root).as_posix() for p in plan.sources] == list(EXTENSION_SOURCES)
    home = jit_build.plan_build(READY, root, {"XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert home.directory.parent == tmp_path / "xdg" / "clip_flash" / "extensions"


def test_cache_key_follows_everything_the_module_depends_on(tmp_path):
    root = _source_tree(tmp_path)
    key = jit_build.cache_key(READY, root, {})
    assert key == jit_build.cache_key(READY, root, {})
    changed = [
        jit_build.cache_key(dataclasses.replace(READY, torch_version="2.12.0+cu130"), root, {}),
        jit_build.cache_key(dataclasses.replace(READY, torch_cuda="12.8"), root, {}),
        jit_build.cache_key(dataclasses.replace(READY, capabilities=((8, 0),)), root, {}),
        jit_build.cache_key(dataclasses.replace(READY, cuda_home="/opt/cuda-13.1"), root, {}),
        jit_build.cache_key(READY, root, {"TORCH_CUDA_ARCH_LIST": "8.0;9.0"}),
    ]
    (root / "csrc" / "kernel_common.cuh").write_text("// a header changed\n")
    changed.append(jit_build.cache_key(READY, root, {}))
    assert len({key, *changed}) == 1 + len(changed)


# ----- compiling ------------------------------------------------------------------------------
def _plan(tmp_path) -> jit_build.BuildPlan:
    return jit_build.plan_build(READY, _source_tree(tmp_path / "src"), {"CLIP_FLASH_CACHE": str(tmp_path / "c")})


def test_failed_build_is_logged_and_not_retried(tmp_path, monkeypatch):
    import torch.utils.cpp_extension as cpp_extension

    calls = []

    def failing_load(**kwargs):
        calls.append(kwargs)
        raise RuntimeError("Error building extension: nvcc fatal : Unsupported gpu architecture")

    monkeypatch.setattr(cpp_extension, "load", failing_load)
    plan = _plan(tmp_path)
    with pytest.raises(jit_build.JitBuildError, match="build.log"):
        jit_build.compile_extension(plan)
    assert calls[0]["build_directory"] == str(plan.directory) and calls[0]["name"] == plan.module_name
    assert "-O3" in calls[0]["extra_cuda_cflags"] and calls[0]["sources"] == [str(p) for p in plan.sources]
    assert "Unsupported gpu architecture" in (plan.directory / "build.log").read_text()
    with pytest.raises(jit_build.JitBuildError, match="earlier build .* failed"):
        jit_build.compile_extension(plan)
    assert len(calls) == 1


def test_nothing_compiled_yet_imports_nothing(tmp_path):
    assert jit_build.import_compiled(_plan(tmp_path)) is None


# ----- what the loader does with it -----------------------------------------------------------
@pytest.fixture
def gpu_without_extension(monkeypatch, tmp_path, fresh_state):
    """A CUDA machine (as far as the loader can tell) where clip_flash._C was not installed compiled."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(_extension, "_installed", lambda: _extension.ExtensionState(None, reason="not installed"))
    plan = _plan(tmp_path)
    monkeypatch.setattr(jit_build, "plan_build", lambda *a, **k: plan)
    return plan


def test_first_use_compiles_once_and_says_how_long(gpu_without_extension, monkeypatch, caplog):
    fake = types.ModuleType("clip_flash_C_fake")
    compiled = []
    monkeypatch.setattr(jit_build, "compile_extension", lambda plan: compiled.append(plan) or (fake, 73.25))
    with caplog.at_level(logging.INFO, logger=_extension.__name__):
        assert _extension.load_extension() is fake
        assert _extension.extension_available() and _extension.extension_unavailable_reason() is None
    assert len(compiled) == 1
    lines = [record.getMessage() for record in caplog.records]
    done = [line for line in lines if "compiled clip_flash._C on first use in 73.2 s" in line]
    assert len(done) == 1 and str(gpu_without_extension.directory) in done[0] and "sm_90" in done[0]
    assert "compiled on first use in 73.2 s" in _extension.extension_origin()


def test_compiled_earlier_is_imported_without_compiling(gpu_without_extension, monkeypatch, caplog):
    fake = types.ModuleType("clip_flash_C_fake")
    monkeypatch.setattr(jit_build, "import_compiled", lambda plan: fake)
    monkeypatch.setattr(jit_build, "compile_extension", lambda plan: pytest.fail("compiled again"))
    with caplog.at_level(logging.WARNING, logger=_extension.__name__):
        assert _extension.load_extension() is fake
    assert not caplog.records and "loaded from" in _extension.extension_origin()


def test_failed_compile_warns_once(gpu_without_extension, monkeypatch, caplog):
    def failing(plan):
        raise jit_build.JitBuildError(f"compiling failed (RuntimeError); compiler output in {plan.directory}/build.log")

    monkeypatch.setattr(jit_build, "compile_extension", failing)
    with caplog.at_level(logging.WARNING, logger=_extension.__name__):
        assert not _extension.extension_available()
        assert not _extension.extension_available()
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and "could not" in r.getMessage()]
    assert len(warnings) == 1 and "build.log" in warnings[0] and "plain PyTorch" in warnings[0]


def test_gpu_without_toolchain_warns_once_with_the_way_out(monkeypatch, fresh_state, caplog):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(_extension, "_installed", lambda: _extension.ExtensionState(None, reason="not installed"))
    monkeypatch.setattr(jit_build, "plan_build", lambda *a, **k: jit_build.BuildPlan(
        False, "ninja is not installed (python -m pip install ninja)"))
    with caplog.at_level(logging.WARNING, logger=_extension.__name__):
        assert not _extension.extension_available() and not _extension.extension_available()
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "pip install ninja" in warning and "CLIP_FLASH_BUILD_EXT=1" in warning


def test_a_lock_left_by_a_killed_build_is_removed(tmp_path):
    import os
    import time

    directory = tmp_path / "build"
    directory.mkdir()
    lock = directory / "lock"
    lock.write_text("")
    jit_build._drop_abandoned_lock(directory)
    assert lock.exists()  # a build may be running right now: wait for it
    old = time.time() - 2 * jit_build.STALE_LOCK_S
    os.utime(lock, (old, old))
    jit_build._drop_abandoned_lock(directory)
    assert not lock.exists()
