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
