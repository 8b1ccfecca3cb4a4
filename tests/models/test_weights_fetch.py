"""Fetching a pretrained tag's weights: announced, cache first, HF_HUB_OFFLINE honoured, no network fails fast.

No test here reaches the network: the hub host is replaced by a probe result, and only sockets on the
loopback address are opened.
"""
from __future__ import annotations

import logging
import socket
import time

import pytest
import torch

from clip_flash.models import model_spec, weights_fetch
from clip_flash.models.model_spec import ModelLoadError, load_model, parse_model_spec

TAGGED = "ViT-B-32::laion2b-s34b-b79k"


@pytest.fixture
def no_download(monkeypatch):
    """Any attempt by OpenCLIP to download weights fails the test."""
    import open_clip.factory

    def forbidden(*args, **kwargs):
        raise AssertionError("OpenCLIP was asked to download weights")

    monkeypatch.setattr(open_clip.factory, "download_pretrained", forbidden)
    monkeypatch.setattr(weights_fetch, "_cached_hub_file", lambda repo_id, filename: None)


def test_source_follows_open_clip_choice():
    source = weights_fetch.weights_source("ViT-B-32", "laion2b_s34b_b79k")
    assert source.kind == "hub" and source.location == "laion/CLIP-ViT-B-32-laion2B-s34B-b79K"
    assert source.host and "Hugging Face hub" in source.description
    assert weights_fetch.weights_source("ViT-B-32", "no_such_tag") is None
    assert weights_fetch._hub_file_candidates(None) == ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")


def test_offline_without_cache_fails_at_once(monkeypatch, no_download):
    monkeypatch.setattr(weights_fetch, "hub_offline", lambda: True)
    monkeypatch.setattr(weights_fetch, "probe_host", lambda *a, **k: pytest.fail("offline mode must not probe"))
    started = time.perf_counter()
    with pytest.raises(ModelLoadError) as raised:
        load_model(parse_model_spec(TAGGED), torch.device("cpu"), "fp32")
    assert time.perf_counter() - started < 5.0
    message = str(raised.value)
    assert "HF_HUB_OFFLINE is set" in message and "laion/CLIP-ViT-B-32-laion2B-s34B-b79K" in message
    assert "--model ViT-B-32\n" in message  # the way out: random-init weights


def test_unreachable_hub_fails_fast_and_says_it_was_fetching(monkeypatch, caplog, no_download):
    monkeypatch.setattr(weights_fetch, "hub_offline", lambda: False)
    no_dns = "gaierror: [Errno -2] Name or service not known"
    monkeypatch.setattr(weights_fetch, "probe_host", lambda host, *a, **k: no_dns)
    started = time.perf_counter()
    with caplog.at_level(logging.INFO, logger="clip_flash.models"), pytest.raises(ModelLoadError) as raised:
        load_model(parse_model_spec(TAGGED), torch.device("cpu"), "fp32")
    assert time.perf_counter() - started < 5.0
    assert "cannot reach huggingface.co" in str(raised.value) and "no network?" in str(raised.value)
    announced = [r.getMessage() for r in caplog.records if "fetching pretrained weights" in r.getMessage()]
    assert announced and "laion2b_s34b_b79k" in announced[0]


def test_real_probe_of_this_machine_is_bounded():
    """Whatever this machine's network, one probe of the hub host answers within its bound."""
    started = time.perf_counter()
    weights_fetch.probe_host("huggingface.co", timeout=2.0)
    assert time.perf_counter() - started < 4.0


def test_probe_host_on_loopback():
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(1)
        port = listening.getsockname()[1]
        assert weights_fetch.probe_host("127.0.0.1", port=port, timeout=2.0) is None
    reason = weights_fetch.probe_host("127.0.0.1", port=port, timeout=2.0)  # closed now: refused
    assert reason and "Error" in reason


def test_probe_goes_through_the_https_proxy(monkeypatch):
    monkeypatch.setenv("https_proxy", "http://proxy.internal:3128")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    assert weights_fetch._proxy_for("huggingface.co") == ("proxy.internal", 3128)
    monkeypatch.setenv("no_proxy", "huggingface.co")
    monkeypatch.setenv("NO_PROXY", "huggingface.co")
    assert weights_fetch._proxy_for("huggingface.co") is None


def test_cached_weights_load_offline_when_hub_unreachable(monkeypatch, tmp_path, caplog):
    """Cached weights and no network: the load runs in the hub's offline mode (no retries), then restores it."""
    from huggingface_hub import constants

    cached = tmp_path / "open_clip_model.safetensors"
    cached.write_bytes(b"")
    monkeypatch.setattr(weights_fetch, "_cached_hub_file", lambda repo_id, filename: str(cached))
    monkeypatch.setattr(weights_fetch, "hub_offline", lambda: False)
    monkeypatch.setattr(weights_fetch, "probe_host", lambda host, *a, **k: "gaierror: no network")
    seen = []

    def fake_create(name, pretrained, precision, device):
        seen.append(constants.is_offline_mode())
        return torch.nn.Linear(1, 1), None, None

    monkeypatch.setattr("open_clip.create_model_and_transforms", fake_create)
    before = constants.HF_HUB_OFFLINE
    with caplog.at_level(logging.INFO, logger="clip_flash.models"):
        load_model(parse_model_spec(TAGGED), torch.device("cpu"), "fp32")
    assert seen == [True] and constants.HF_HUB_OFFLINE == before
    assert any("from the local cache" in r.getMessage() for r in caplog.records)

    monkeypatch.setattr(weights_fetch, "probe_host", lambda host, *a, **k: None)  # reachable: left alone
    load_model(parse_model_spec(TAGGED), torch.device("cpu"), "fp32")
    assert seen[-1] == before


def test_random_init_and_checkpoints_never_touch_the_hub(monkeypatch):
    monkeypatch.setattr(weights_fetch, "probe_host", lambda *a, **k: pytest.fail("no probe for random init"))
    monkeypatch.setattr(model_spec, "prepared_fetch", lambda *a, **k: pytest.fail("no fetch for random init"))
    loaded = load_model(parse_model_spec("RN50"), torch.device("cpu"), "fp32")
    assert loaded.spec.kind == "random"


def test_hf_hub_model_names_fail_fast_too(monkeypatch, no_download):
    """``hf-hub:ORG/REPO`` brings config and weights from the hub: the same fast failure without a network."""
    monkeypatch.setattr(weights_fetch, "hub_offline", lambda: False)
    monkeypatch.setattr(weights_fetch, "probe_host", lambda host, *a, **k: "gaierror: no network")
    started = time.perf_counter()
    with pytest.raises(ModelLoadError, match="cannot reach huggingface.co"):
        load_model(parse_model_spec("hf-hub:timm/ViT-B-16-SigLIP"), torch.device("cpu"), "fp32")
    assert time.perf_counter() - started < 5.0
