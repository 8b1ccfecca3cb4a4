"""Admission and shedding on a real server process (CPU): /ready before and after loading, the API key (401),
the body limit (413), the deadline (503, the inputs dropped before compute), a full queue (429 with Retry-After),
a client that goes away (its inputs dropped before compute)."""
from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("starlette", reason="the serve extra is not installed: pip install 'clip_flash[serve]'")

import httpx  # noqa: E402

from tests.serve.server_process import ServerProcess  # noqa: E402

KEY = "test-key"
TIMEOUT = 1.0  # --request-timeout
WAIT_MS = 3000  # --max-wait-ms with --wait-when-idle: a batch of fewer than --max-batch inputs closes this late,
# past the deadline


@pytest.fixture(scope="module")
def server():
    process = ServerProcess(["--device", "cpu", "--max-request-bytes", "20000", "--request-timeout", str(TIMEOUT),
                             "--max-wait-ms", str(WAIT_MS), "--wait-when-idle", "--max-batch", "64",
                             "--max-queue", "3"], api_key=KEY)
    try:
        yield process.wait_ready()
    finally:
        process.stop()


def dropped_items(server) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(server.url + "/metrics", headers=server.headers).text
    return sum(sample.value for family in text_string_to_metric_families(text)
               if family.name == "clip_flash_items_dropped" for sample in family.samples
               if sample.name.endswith("_total"))


def test_ready_is_503_until_the_model_is_loaded(server):
    assert server.ready_statuses[0] == 503 and server.ready_statuses[-1] == 200


def test_api_key(server):
    assert httpx.get(server.url + "/health").status_code == 200  # no key needed
    for path in ("/v1/models", "/metrics", "/ready"):
        assert httpx.get(server.url + path).status_code == 401
        assert httpx.get(server.url + path, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(server.url + path, headers=server.headers).status_code == 200
    response = httpx.post(server.url + "/v1/embeddings", json={"input": "a cat"})
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"


def test_body_limit_413(server):
    response = httpx.post(server.url + "/v1/embeddings", json={"input": ["x" * 30000]}, headers=server.headers)
    assert response.status_code == 413
    assert "max-request-bytes" in response.json()["error"]["message"]
    # chunked, no Content-Length: counted as it streams
    response = httpx.post(server.url + "/v1/embeddings/image", headers={**server.headers, "Content-Type": "image/jpeg"},
                          content=iter([b"\xff" * 8000] * 4))
    assert response.status_code == 413


def test_deadline_503_and_inputs_dropped(server):
    before = dropped_items(server)
    started = time.monotonic()
    response = httpx.post(server.url + "/v1/embeddings", json={"input": ["a cat", "a dog"]}, headers=server.headers,
                          timeout=30)
    elapsed = time.monotonic() - started
    assert response.status_code == 503 and response.headers["Retry-After"] == "1"
    assert response.json()["error"]["code"] == "timeout"
    assert TIMEOUT <= elapsed < TIMEOUT + 1.5
    assert dropped_items(server) - before == 2


def test_full_queue_429_with_retry_after(server):
    async def burst():
        async with httpx.AsyncClient(base_url=server.url, headers=server.headers, timeout=30) as http:
            return await asyncio.gather(*(http.post("/v1/embeddings", json={"input": [f"caption {n}"]})
                                          for n in range(10)))

    responses = asyncio.run(burst())
    statuses = sorted(response.status_code for response in responses)
    assert set(statuses) <= {429, 503}, statuses  # the three admitted wait past the deadline
    assert statuses.count(503) == 3, statuses
    busy = [response for response in responses if response.status_code == 429]
    assert all(response.headers["Retry-After"] == "1" for response in busy)
    assert busy[0].json()["error"]["type"] == "rate_limit_error"


def test_too_many_inputs_for_the_queue_413(server):
    response = httpx.post(server.url + "/v1/embeddings", json={"input": ["a", "b", "c", "d"]}, headers=server.headers)
    assert response.status_code == 413


def test_client_gone_inputs_dropped(server):
    before = dropped_items(server)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/embeddings", json={"input": ["a cat"]}, headers=server.headers, timeout=0.3)
    # Counted when the batch closes, WAIT_MS after the input arrived, and later on a machine busy with other tests'
    # server processes: wait up to 15 s (the loop ends at the drop).
    deadline = time.monotonic() + 15
    while dropped_items(server) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert dropped_items(server) - before == 1


def test_unknown_model_exits_with_the_reason():
    import subprocess
    import sys

    from tests.serve.server_process import ROOT, free_port

    done = subprocess.run([sys.executable, "-m", "clip_flash.serve", "--model", "ViT-B-33", "--device", "cpu",
                           "--port", str(free_port())], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "unknown OpenCLIP model 'ViT-B-33'" in done.stderr and "ViT-B-32" in done.stderr  # a close match


def test_cuda_options_without_cuda_exit_2_before_starting():
    """``--device cuda``, ``--devices 0,1``, ``--decode gpu`` on a machine without CUDA: status 2 and one line on
    stderr saying so, before uvicorn or any engine starts (not status 1 and a traceback after)."""
    import subprocess
    import sys

    import torch

    from tests.serve.server_process import ROOT, free_port
    from tests.utils import child_env

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    options = (["--device", "cuda"], ["--devices", "0,1"], ["--decode", "gpu"],
               ["--device", "cuda:1", "--workers", "2"])
    runs = [subprocess.Popen([sys.executable, "-m", "clip_flash.serve", *args, "--port", str(free_port())], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
            for args in options]
    for args, run in zip(options, runs):
        out, err = run.communicate(timeout=120)
        assert run.returncode == 2, (args, out, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1, (args, err)
        assert lines[0].startswith(f"error: {' '.join(args[:2])} asked for, but CUDA is not available here"), lines
        assert "torch.cuda.is_available() is False" in lines[0] and not out


def test_device_checks_name_the_option(monkeypatch):
    """What ``check_devices`` refuses, CUDA or not: a device index this machine lacks, ``--decode gpu`` on the
    CPU, a device torch cannot parse; what it takes passes."""
    import torch

    from clip_flash.serve.cli import check_devices
    from clip_flash.serve.config import ServeConfig

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    for config in (ServeConfig(device="cpu"), ServeConfig(), ServeConfig(device="cuda:1"),
                   ServeConfig(devices=(0, 1)), ServeConfig(device="cuda", decode="gpu")):
        check_devices(config)
    for config, words in ((ServeConfig(devices=(0, 2)), "--devices 0,2: no CUDA device 2 here; this machine has 2"),
                          (ServeConfig(device="cuda:5"), "--device cuda:5: no CUDA device 5 here"),
                          (ServeConfig(device="cpu", decode="gpu"), "--decode gpu decodes on a CUDA device"),
                          (ServeConfig(device="gpu0"), "--device 'gpu0' is not a device")):
        with pytest.raises(ValueError, match=words):
            check_devices(config)
