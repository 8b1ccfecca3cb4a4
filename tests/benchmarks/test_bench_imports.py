"""Every benchmark script imports: a name moved in the package breaks the script it feeds, not a test, unless the
script is imported somewhere (the GPU runs are the first to load most of them)."""
from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# Third-party packages some benchmarks need that the test install does not carry (optional extras).
OPTIONAL = {"ray", "flash_attn", "triton", "matplotlib", "aiohttp", "hdrh"}
MODULES = sorted(f"benchmarks.{path.stem}" for path in BENCHMARKS.glob("*.py") if path.stem != "__init__") + sorted(
    f"benchmarks.{folder.name}.{path.stem}" for folder in BENCHMARKS.iterdir() if (folder / "__init__.py").exists()
    for path in folder.glob("*.py") if path.stem != "__init__")


@pytest.mark.parametrize("module", MODULES)
def test_benchmark_module_imports(module: str) -> None:
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] in OPTIONAL:
            pytest.skip(f"{module} needs {error.name}, not installed here")
        raise
