"""Fixtures of the embedding-job tests: small image folders, a random-init checkpoint file, job helpers.

The model is ViT-S-32 (OpenCLIP's smallest ViT config, 63M parameters) so a job over a dozen images
takes a second or two on a 2-core CI machine.
"""
from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Dict

import pytest
import torch

from .job_helpers import MODEL


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory) -> Path:
    """A random-init ViT-S-32 checkpoint file (what ``NAME::/path`` loads)."""
    import open_clip

    torch.manual_seed(1234)
    model = open_clip.create_model(MODEL, pretrained=None)
    path = tmp_path_factory.mktemp("checkpoint") / "vit_s_32_random.pt"
    torch.save(model.state_dict(), path)
    return path


@functools.lru_cache(maxsize=None)
def _stock_model(checkpoint: str):
    import open_clip

    model, _, preprocess = open_clip.create_model_and_transforms(MODEL, pretrained=checkpoint, precision="fp32")
    return model.eval(), preprocess


@pytest.fixture
def stock_model(checkpoint):
    """The stock OpenCLIP model and preprocess of ``checkpoint`` (fp32, CPU): the reference."""
    return _stock_model(str(checkpoint))


_LOADER_CACHE: Dict[tuple, object] = {}


@pytest.fixture(autouse=True)
def _share_loaded_models(monkeypatch):
    """Build each (model spec, device, precision) once per session and hand every job a deep copy: the jobs
    still go through ``load_model`` and get the same weights, without rebuilding the model each time."""
    from clip_flash.models import model_spec

    real = model_spec.load_model

    def cached(spec, device, precision, seed=0):
        key = (spec.text, str(device), precision, seed)
        if key not in _LOADER_CACHE:
            _LOADER_CACHE[key] = real(spec, device, precision, seed)
        return copy.deepcopy(_LOADER_CACHE[key])

    monkeypatch.setattr(model_spec, "load_model", cached)
