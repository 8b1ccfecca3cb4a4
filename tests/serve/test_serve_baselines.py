"""The benchmark's baseline configuration, in process (no HTTP server process): ``--no-patch --inputs stock``
(the stock model, OpenCLIP's own preprocess and tokenizer) answers the same embeddings through the same routes."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

pytest.importorskip("starlette", reason="the serve extra is not installed: pip install 'clip_flash[serve]'")

import httpx  # noqa: E402

from clip_flash.serve import ServeConfig  # noqa: E402
from clip_flash.serve.app import build_app  # noqa: E402
from clip_flash.serve.engine import EnginePool  # noqa: E402
from tests.serve.contract import CAPTIONS, NOT_AN_IMAGE, StockReference, vectors  # noqa: E402
from tests.serve.server_process import data_uri, jpeg_bytes, png_bytes  # noqa: E402


def test_stock_model_and_stock_inputs_through_the_same_routes():
    config = ServeConfig(device="cpu", patch=False, inputs="stock", max_wait_ms=5, max_batch=8)
    pool = EnginePool(config)
    pool.load()
    assert pool.state == "ready", pool.error
    assert "stock model" in pool.description and "OpenCLIP inputs" in pool.description
    app = build_app(config, pool, load=False)
    photos = [jpeg_bytes(0), png_bytes()]
    inputs = CAPTIONS + [data_uri(photos[0]), data_uri(NOT_AN_IMAGE), data_uri(photos[1], "png")]

    async def call():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://serve") as http:
            return await http.post("/v1/embeddings", json={"input": inputs})

    try:
        response = asyncio.run(call())
    finally:
        pool.close()
    assert response.status_code == 200, response.text
    body = response.json()
    assert [e["index"] for e in body["errors"]] == [len(CAPTIONS) + 1]
    assert "cannot identify image file" in body["errors"][0]["message"]  # Pillow's own words, from Image.open
    reference = StockReference("ViT-B-32", "cpu", "fp32")
    got = vectors(body)
    np.testing.assert_allclose(got[:len(CAPTIONS)], reference.texts(CAPTIONS), atol=2e-5, rtol=0)
    np.testing.assert_allclose(got[len(CAPTIONS):], reference.images(photos), atol=2e-5, rtol=0)
