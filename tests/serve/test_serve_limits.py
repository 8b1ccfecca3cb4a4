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
