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


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` (registered in pyproject.toml; select them with ``-m gpu``) skip without CUDA."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
