"""``image_latency.py``: the host-step clocks are put back after the run; the embedding check fails wrong rows."""
from __future__ import annotations

import torch

from benchmarks import image_latency
from clip_flash.inputs.image import native_batch
from clip_flash.ops import image_resample


def test_host_steps_clock_each_call_then_restore_it():
    before = {(id(owner), name): vars(owner).get(name) for _, owner, name in image_latency.host_step_targets()}
    spec_shapes = [(480, 640, 3)]

    def request():
        from open_clip.transform import image_transform

        from clip_flash.inputs.image.transform_spec import spec_from_preprocess

        native_batch.plan_batch(spec_shapes, spec_from_preprocess(image_transform(224, is_train=False)))

    times = image_latency.host_step_times(request, requests=3)
    assert set(times) == {"    plan_batch (resize layout)"} and times["    plan_batch (resize layout)"] >= 0
    after = {(id(owner), name): vars(owner).get(name) for _, owner, name in image_latency.host_step_targets()}
    assert after == before
    assert native_batch.plan_batch is image_resample.plan_batch


def test_the_embedding_check_fails_a_wrong_or_unstable_row():
    torch.manual_seed(0)
    stock = torch.randn(1, 768)
    close = stock + 1e-4 * torch.randn(1, 768)
    ok, figures = image_latency.embedding_check(stock, close, stock, close)
    assert ok and figures["clip_flash_first_vs_after_max_abs"] == 0.0
    other = torch.randn(1, 768)  # the embedding of other pixels
    assert not image_latency.embedding_check(stock, other, stock, close)[0]  # wrong first, right after
    assert not image_latency.embedding_check(stock, close, stock, other)[0]  # right first, wrong after
    nearly = close.clone()
    nearly[0, 0] += 0.5  # stock-like by cosine, but not the vector the first request gave
    assert not image_latency.embedding_check(stock, close, stock, nearly)[0]


def test_the_idle_time_comes_before_each_request_asleep_or_spinning(monkeypatch):
    calls = []
    monkeypatch.setattr(image_latency, "idle", lambda seconds, spin: calls.append(("idle", seconds, spin)))
    image_latency.host_step_times(lambda: calls.append("request"), requests=2, idle_s=0.02, spin=True)
    assert calls == [("idle", 0.02, True), "request", ("idle", 0.02, True), "request"]
    calls.clear()
    image_latency.timed(lambda: calls.append("request"), 0.02, False)
    assert calls == [("idle", 0.02, False), "request"]


def test_idle_waits_its_time_either_way():
    import time

    for spin in (False, True):
        start = time.perf_counter()
        image_latency.idle(0.01, spin)
        assert time.perf_counter() - start >= 0.01
    start = time.perf_counter()
    image_latency.idle(0.0, True)
    assert time.perf_counter() - start < 0.01
