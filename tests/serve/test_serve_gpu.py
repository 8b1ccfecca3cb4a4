"""``clip-flash serve`` on a CUDA GPU with CUDA graphs: the whole contract (contract.py) against an fp32 server,
and an fp16 server with ``--decode gpu`` close to the fp32 reference. Marked gpu (file name): skipped without CUDA.

    python -m pytest -q tests/serve/test_serve_gpu.py
"""
from __future__ import annotations

import time

import httpx
import numpy as np
import pytest
import torch

pytest.importorskip("starlette", reason="the serve extra is not installed: pip install 'clip_flash[serve]'")

from tests.serve.contract import *  # noqa: E402,F401,F403 - the shared contract tests run against this server
from tests.serve.contract import CAPTIONS, StockReference, post, vectors  # noqa: E402
from tests.serve.server_process import ServerProcess, data_uri, jpeg_bytes  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def server():
    process = ServerProcess(["--device", "cuda", "--precision", "fp32", "--max-batch", "32",
                             "--max-text-batch", "64", "--max-wait-ms", "2"])
    try:
        yield process.wait_ready(timeout=300)
    finally:
        process.stop()


@pytest.fixture(scope="module")
def reference():
    return StockReference("ViT-B-32", "cuda", "fp32")


@pytest.fixture
def tolerance():
    return 1e-4  # fp32 on the GPU: patched kernels and graphs vs stock, rounding only


def test_graphs_are_used(server):
    engine = httpx.get(server.url + "/ready").json()["engine"]
    assert "CUDA graphs" in engine and "cuda" in engine, engine


def test_fp16_decode_gpu_close_to_fp32(reference):
    process = ServerProcess(["--device", "cuda", "--precision", "fp16", "--decode", "gpu", "--max-batch", "16",
                             "--max-text-batch", "32"])
    try:
        process.wait_ready(timeout=300)
        assert "decode=gpu" in httpx.get(process.url + "/ready").json()["engine"]
        photos = [jpeg_bytes(n, (640, 480)) for n in range(4)]
        body = post(process, {"input": [data_uri(p) for p in photos] + CAPTIONS}).json()
        got = vectors(body)
        expected = np.concatenate([reference.images(photos), reference.texts(CAPTIONS)])
        cosine = (got * expected).sum(axis=1)
        assert cosine[:4].min() > 0.95, cosine  # fp16, and nvJPEG's decoding (not exact)
        assert cosine[4:].min() > 0.99, cosine  # fp16 alone
    finally:
        process.stop()


def test_two_frontends_one_engine_on_the_gpu(reference):
    process = ServerProcess(["--device", "cuda", "--precision", "fp32", "--workers", "2", "--devices", "0",
                             "--max-batch", "8", "--max-text-batch", "16"])
    try:
        process.wait_ready(timeout=300)
        photo = jpeg_bytes(2)
        body = post(process, {"input": CAPTIONS + [data_uri(photo)]}).json()
        got = vectors(body)
        np.testing.assert_allclose(got[:-1], reference.texts(CAPTIONS), atol=1e-4, rtol=0)
        np.testing.assert_allclose(got[-1], reference.images([photo])[0], atol=1e-4, rtol=0)
        # Once each frontend has polled the engine's state (every 0.25 s) it tokenizes captions itself: 40
        # captions, split across text batches of 16, answered as stock computes them, with the same usage.
        time.sleep(2.0)
        captions = [f"{caption} {n}" for n in range(8) for caption in CAPTIONS]
        for _ in range(4):  # connections land on either frontend
            body = post(process, {"input": captions}).json()
            np.testing.assert_allclose(vectors(body), reference.texts(captions), atol=1e-4, rtol=0)
            assert body["usage"]["prompt_tokens"] == reference.token_count(captions)
    finally:
        assert process.stop() == 0


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_one_engine_process_per_gpu(reference):
    """``--devices 0,1``: an engine process per GPU behind two frontends; requests land on both and every answer
    is stock's; /metrics counts them once, with both engines' batches."""
    process = ServerProcess(["--device", "cuda", "--precision", "fp32", "--workers", "2", "--devices", "0,1",
                             "--max-batch", "8", "--max-text-batch", "16"])
    try:
        process.wait_ready(timeout=300)
        photos = [jpeg_bytes(n) for n in range(3)]
        for _ in range(8):
            body = post(process, {"input": CAPTIONS + [data_uri(photo) for photo in photos]}).json()
            got = vectors(body)
            np.testing.assert_allclose(got[:len(CAPTIONS)], reference.texts(CAPTIONS), atol=1e-4, rtol=0)
            np.testing.assert_allclose(got[len(CAPTIONS):], reference.images(photos), atol=1e-4, rtol=0)
        # A frontend's counts travel to the engines with its next message (its state poll, every 0.25 s).
        answered = 0.0
        for _ in range(50):
            metrics = httpx.get(process.url + "/metrics", timeout=30).text
            answered = sum(float(line.split()[-1]) for line in metrics.splitlines()
                           if line.startswith("clip_flash_requests_total{") and 'status="200"' in line
                           and 'route="/v1/embeddings"' in line)
            if answered >= 8:
                break
            time.sleep(0.1)
        assert answered == 8
        ready = httpx.get(process.url + "/ready", timeout=30)  # each frontend polls the engines' state every 0.25 s
        for _ in range(100):
            if ready.status_code == 200:
                break
            time.sleep(0.1)
            ready = httpx.get(process.url + "/ready", timeout=30)
        engines = ready.json()["engine"]
        assert "cuda:0" in engines and "cuda:1" in engines, engines
    finally:
        assert process.stop() == 0


def test_no_cudnn_attention_server_answers_as_stock():
    """fp16 (where SDPA would take cuDNN's kernel) with it turned off: captions and images within twice stock
    fp16's error against stock fp32."""
    from tests.utils import assert_within_twice_stock

    process = ServerProcess(["--device", "cuda", "--precision", "fp16", "--max-text-batch", "64", "--max-batch", "8",
                             "--no-cudnn-attention"])
    try:
        process.wait_ready(timeout=300)
        assert "cuDNN attention is off" in process.output()
        photos = [jpeg_bytes(n, (640, 480)) for n in range(4)]
        captions = [" ".join(["word"] * (1 + (n * 7) % 50)) + f" {n}" for n in range(64)] + CAPTIONS
        body = post(process, {"input": captions + [data_uri(p) for p in photos], "normalize": False}).json()
        got = torch.from_numpy(vectors(body))
        reference, stock = StockReference("ViT-B-32", "cuda", "fp32"), StockReference("ViT-B-32", "cuda", "fp16")
        for rows, expected, stock_rows, what in (
                (got[:len(captions)], reference.texts(captions, normalize=False),
                 stock.texts(captions, normalize=False), "captions"),
                (got[len(captions):], reference.images(photos, normalize=False),
                 stock.images(photos, normalize=False), "images")):
            assert_within_twice_stock(rows, torch.from_numpy(stock_rows), torch.from_numpy(expected),
                                      f"--no-cudnn-attention server fp16, {what}")
    finally:
        assert process.stop() == 0


def test_cost_packed_server_answers_as_stock():
    """fp16 (the packed kernels' dtypes): every caption within twice stock fp16's error against stock fp32; an
    fp32 server with cost-packed says why it replays padded graphs only."""
    from tests.utils import assert_within_twice_stock

    process = ServerProcess(["--device", "cuda", "--precision", "fp16", "--max-text-batch", "64", "--max-batch", "8",
                             "--text-grouping", "cost-packed"])
    try:
        process.wait_ready(timeout=300)
        assert "captured and timed" in process.output() and "packed text graphs" in process.output()
        captions = [" ".join(["word"] * (1 + (n * 7) % 50)) + f" {n}" for n in range(64)] + CAPTIONS
        body = post(process, {"input": captions, "normalize": False}).json()
        reference = StockReference("ViT-B-32", "cuda", "fp32").texts(captions, normalize=False)
        stock = StockReference("ViT-B-32", "cuda", "fp16").texts(captions, normalize=False)
        assert_within_twice_stock(torch.from_numpy(vectors(body)), torch.from_numpy(stock),
                                  torch.from_numpy(reference), "cost-packed server fp16")
    finally:
        assert process.stop() == 0
    process = ServerProcess(["--device", "cuda", "--precision", "fp32", "--max-text-batch", "16", "--max-batch", "8",
                             "--text-grouping", "cost-packed"])
    try:
        process.wait_ready(timeout=300)
        assert "no packed (variable-length) kernel" in process.output()
    finally:
        assert process.stop() == 0
