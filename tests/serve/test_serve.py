"""``clip-flash serve`` on the CPU: a real server process (ViT-B-32, random-init weights, fp32) driven by httpx
and the official openai client. The contract tests live in contract.py (the GPU suite runs them too)."""
from __future__ import annotations

import pytest

pytest.importorskip("starlette", reason="the serve extra is not installed: pip install 'clip_flash[serve]'")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")

from tests.serve.contract import *  # noqa: E402,F401,F403 - the shared contract tests run against this server
from tests.serve.contract import StockReference  # noqa: E402
from tests.serve.server_process import ServerProcess  # noqa: E402


@pytest.fixture(scope="module")
def server():
    process = ServerProcess(["--device", "cpu", "--max-wait-ms", "5", "--max-batch", "16"])
    try:
        yield process.wait_ready()
    finally:
        process.stop()


@pytest.fixture(scope="module")
def reference():
    return StockReference("ViT-B-32", "cpu", "fp32")


@pytest.fixture
def tolerance():
    return 2e-5  # patched fp32 on the CPU vs stock: rounding only


def test_the_log_holds_the_servers_lines_not_openclips_info(server):
    """At the default level OpenCLIP's info lines (each model and tokenizer load, on the root logger) stay out of
    the log; the server's own lines, which say what they said, are there."""
    output = server.output()
    assert "engine ready in" in output and "random-init weights" in output
    assert " INFO root: " not in output, output


def test_sigterm_answers_every_accepted_request_then_exits(server):
    """Last in this file: it stops the module's server. Requests in flight at SIGTERM are all answered."""
    import asyncio
    import signal

    import httpx

    from tests.serve.server_process import data_uri, jpeg_bytes

    photo = data_uri(jpeg_bytes(0))

    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
            requests = [asyncio.ensure_future(http.post("/v1/embeddings", json={"input": [photo, f"cat {n}", photo]}))
                        for n in range(12)]
            await asyncio.sleep(0.5)  # all sent and read by the server; the CPU needs seconds to embed them
            server.process.send_signal(signal.SIGTERM)
            return await asyncio.gather(*requests, return_exceptions=True)

    results = asyncio.run(main())
    statuses = [r.status_code if isinstance(r, httpx.Response) else type(r).__name__ for r in results]
    assert statuses == [200] * 12, statuses
    assert server.process.wait(60) in (0, -signal.SIGTERM)
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "/health")
