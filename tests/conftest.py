"""Shared fixtures: random-init OpenCLIP models, built once per session. Shared helpers live in tests/utils.py."""
from __future__ import annotations

import functools
import logging

import open_clip
import pytest
import torch

from tests.utils import EOT, SOT, edge_case_tokens, image_size, relative_error  # noqa: F401  (older `from conftest import`)

logging.getLogger("root").setLevel(logging.ERROR)  # open_clip warns "no pretrained weights" on every build


@functools.lru_cache(maxsize=None)
def _build(name: str, precision: str = "fp32", device: str = "cpu") -> torch.nn.Module:
    torch.manual_seed(0)
    model = open_clip.create_model(name, pretrained=None, precision=precision, device=device)
    return model.eval()


@pytest.fixture
def build_model():
    """Build (cached) a random-init model; tests must leave it unpatched (use clip_flash.patched)."""
    return _build


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", default=False,
                     help="also run tests marked slow (long differential runs: `pytest -m slow --run-slow tests`, "
                          "about 11 minutes on 2 CPU cores; on a GPU host `benchmarks/gpu_checks.sh OUT slow`)")


def pytest_collection_modifyitems(config, items):
    """One ``gpu`` marker (``pytest -m gpu`` selects every GPU test): set here on every test of a ``*_gpu.py`` file,
    by hand elsewhere; GPU tests skip without CUDA. ``slow`` tests run only with ``--run-slow`` (or ``-m slow``)."""
    for item in items:
        if item.path.name.endswith("_gpu.py"):
            item.add_marker(pytest.mark.gpu)
    markexpr = config.getoption("-m") or ""
    run_slow = config.getoption("--run-slow") or "slow" in markexpr
    skip_gpu = None if torch.cuda.is_available() else pytest.mark.skip(reason="needs a CUDA GPU")
    skip_slow = None if run_slow else pytest.mark.skip(reason="slow: run with --run-slow")
    for item in items:
        if skip_gpu is not None and "gpu" in item.keywords:
            item.add_marker(skip_gpu)
        if skip_slow is not None and "slow" in item.keywords:
            item.add_marker(skip_slow)
