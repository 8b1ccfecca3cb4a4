"""``python -m clip_flash.info`` tells what can actually run on this machine, kernels included."""
from __future__ import annotations

import json
import sys

import pytest
import torch

import clip_flash
from clip_flash import info
from clip_flash.backends import BackendStatus

CUDA_ONLY_SDPA = ("sdpa:cudnn", "sdpa:flash", "sdpa:efficient")


def _run(monkeypatch, capsys, *args):
    monkeypatch.setattr(sys, "argv", ["clip_flash.info", *args])
    assert info.main() == 0
    return capsys.readouterr().out


def test_available_backends_keeps_its_shape():
    statuses = clip_flash.available_backends()
    assert set(statuses) == set(clip_flash.BACKEND_NAMES)
    assert all(isinstance(status, BackendStatus) and status.name == name for name, status in statuses.items())
    assert all(status.available == (status.reason is None) for status in statuses.values())


@pytest.mark.skipif(torch.cuda.is_available(), reason="what a CPU-only machine is told")
def test_cpu_machine_lists_only_what_runs_here(monkeypatch, capsys):
    out = _run(monkeypatch, capsys)
    for name in CUDA_ONLY_SDPA:
        assert f"  no  {name}" in out
    runnable = next(line for line in out.splitlines() if line.startswith("can run here: "))
    assert set(runnable.split(": ", 1)[1].split(", ")) == {"sdpa", "reference", "sdpa:math"}
    assert "fused_ops   plain PyTorch (no CUDA device)" in out
    assert "text_attn   the kernel needs a CUDA GPU (no CUDA device here)" in out
    assert any(line.split() == ["extension", "-"] for line in out.splitlines())

    record = json.loads(_run(monkeypatch, capsys, "--json"))
    assert record["extension"] is None
    for name in CUDA_ONLY_SDPA:
        status = record["backends"][name]
        assert status["available"] is False and "needs a CUDA GPU" in status["reason"]


@pytest.mark.gpu
def test_gpu_machine_says_where_the_kernels_came_from(monkeypatch, capsys):
    record = json.loads(_run(monkeypatch, capsys, "--json"))
    if record["fused_ops"].startswith("CUDA kernels"):
        if torch.cuda.get_device_capability() >= (8, 0):
            assert record["text_attn"].startswith("CUDA kernel (clip_flash._C) for packed captions")
        origin = record["extension"]
        assert origin and ("installed" in origin or "compiled on first use" in origin)
    else:
        assert record["extension"] is None and "clip_flash._C" in record["fused_ops"]
