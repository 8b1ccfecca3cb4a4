"""``--workers 2``: two HTTP frontend processes feeding one engine process over a Unix socket. The same answers
as one process (a subset of the contract), the engine's metrics through either frontend, and SIGTERM."""
from __future__ import annotations

import asyncio
import signal

import pytest

pytest.importorskip("starlette", reason="the serve extra is not installed: pip install 'clip_flash[serve]'")

import httpx  # noqa: E402

from tests.serve.contract import (  # noqa: E402,F401 - shared contract tests run against this server
    StockReference, test_dimensions_only_the_model_width, test_models_and_metrics,
    test_per_item_errors_keep_good_items,
)
from tests.serve.server_process import ServerProcess, data_uri, jpeg_bytes  # noqa: E402


@pytest.fixture(scope="module")
def server():
    process = ServerProcess(["--device", "cpu", "--workers", "2", "--max-wait-ms", "5", "--max-batch", "16",
                             "--max-text-batch", "16"])
    try:
        yield process.wait_ready()
    finally:
        process.stop()


@pytest.fixture(scope="module")
def reference():
    return StockReference("ViT-B-32", "cpu", "fp32")


@pytest.fixture
def tolerance():
    return 2e-5


def test_one_engine_behind_both_frontends(server):
    """Many connections land on both frontends; every batch is counted by the one engine."""
    async def burst():
        fresh_connections = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=fresh_connections) as http:
            return await asyncio.gather(*(http.post("/v1/embeddings", json={"input": [f"caption {n}"]})
                                          for n in range(40)))

    assert {response.status_code for response in asyncio.run(burst())} == {200}
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(server.url + "/metrics").text
    families = {family.name: family for family in text_string_to_metric_families(text)}
    batched = sum(s.value for s in families["clip_flash_batch_size"].samples
                  if s.name == "clip_flash_batch_size_sum" and s.labels["tower"] == "text")
    assert batched >= 40  # every caption went through the engine whichever frontend took it


def test_frontend_tokenized_captions_split_across_batches_equal_stock(server, reference, tolerance):
    """Once each frontend has polled the engine's state (every 0.25 s) it tokenizes captions itself; 40
    captions go through text batches of 16 and come back in order, as stock computes them, same usage."""
    import time

    import numpy as np

    from tests.serve.contract import CAPTIONS, post, vectors

    time.sleep(1.0)
    captions = [f"{caption} {n}" for n in range(8) for caption in CAPTIONS]
    expected = reference.texts(captions)
    for _ in range(4):  # connections land on either frontend
        body = post(server, {"input": captions}).json()
        np.testing.assert_allclose(vectors(body), expected, atol=tolerance, rtol=0)
        assert body["usage"]["prompt_tokens"] == reference.token_count(captions)


def test_sigterm_answers_every_accepted_request_then_exits(server):
    """Last in this file: it stops the module's server."""
    photo = data_uri(jpeg_bytes(0))

    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
            requests = [asyncio.ensure_future(http.post("/v1/embeddings", json={"input": [photo, f"cat {n}"]}))
                        for n in range(8)]
            await asyncio.sleep(0.5)
            server.process.send_signal(signal.SIGTERM)
            return await asyncio.gather(*requests, return_exceptions=True)

    results = asyncio.run(main())
    statuses = [r.status_code if isinstance(r, httpx.Response) else type(r).__name__ for r in results]
    assert statuses == [200] * 8, statuses
    assert server.process.wait(60) == 0
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "/health")


def test_ready_asks_the_engine_when_the_polled_state_lags(tmp_path, monkeypatch):
    """A frontend whose last poll saw the engine still loading asks the engine itself on /ready: once the engine is
    ready, every frontend answers 200 (another one may have answered 200 already; /ready must not go back to 503).
    Here the frontend polls once, at connect, while the engine loads; its next poll would come an hour later."""
    import time

    from starlette.testclient import TestClient

    from clip_flash.serve import remote_pool
    from clip_flash.serve.app import build_app
    from clip_flash.serve.config import ServeConfig
    from clip_flash.serve.engine_hosts import EngineProcesses

    monkeypatch.setattr(remote_pool, "STATE_POLL_SECONDS", 3600.0)
    config = ServeConfig(device="cpu", max_batch=8, max_text_batch=16)
    engines = EngineProcesses([config], str(tmp_path))
    try:
        pool = remote_pool.RemotePool(engines.paths[0])
        with TestClient(build_app(config, pool)) as client:
            deadline = time.monotonic() + 120
            response = client.get("/ready")
            while response.status_code != 200 and time.monotonic() < deadline:
                assert response.json()["status"] == "loading", (response.json(), engines.failed)
                time.sleep(0.2)
                response = client.get("/ready")
            assert response.status_code == 200 and "on cpu" in response.json()["engine"]
            assert pool.state == "ready"
            assert client.post("/v1/embeddings", json={"input": ["a photo of a cat"]}).status_code == 200
    finally:
        engines.stop()
