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
from clip_flash.serve.inputs import UNIDENTIFIED_IMAGE, StockImageInputs, describe_error  # noqa: E402
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
    assert body["errors"][0]["message"] == UNIDENTIFIED_IMAGE  # as the fast path says it, no object repr
    reference = StockReference("ViT-B-32", "cpu", "fp32")
    got = vectors(body)
    np.testing.assert_allclose(got[:len(CAPTIONS)], reference.texts(CAPTIONS), atol=2e-5, rtol=0)
    np.testing.assert_allclose(got[len(CAPTIONS):], reference.images(photos), atol=2e-5, rtol=0)


def test_stock_inputs_bad_image_messages_match_the_fast_path_without_object_reprs():
    """Pillow's "cannot identify image file <_io.BytesIO object at 0x7f...>" reaches no client: ``--inputs stock``
    says of bytes that are no image what the fast path says, and no per-item message holds an object's repr."""
    import torch

    from clip_flash.inputs.image.image_decoding import DecodeOptions, decode_item

    stock = StockImageInputs(lambda image: torch.zeros(3, 2, 2), torch.device("cpu"), torch.float32, (2, 2))
    positions, _, failures = stock.host([NOT_AN_IMAGE, jpeg_bytes(0), b"\x89PNG\r\n\x1a\n" + b"x" * 40])
    assert positions == [1] and [position for position, _ in failures] == [0, 2]
    fast = decode_item(0, NOT_AN_IMAGE, DecodeOptions(preprocess=lambda image: torch.zeros(3, 2, 2)))
    assert failures[0][1] == fast.reason == UNIDENTIFIED_IMAGE
    for _, message in failures:
        assert "object at 0x" not in message and "BytesIO" not in message, message
    assert describe_error(OSError("cannot read <_io.BytesIO object at 0x7f0123abcd>: truncated")) == (
        "OSError: cannot read: truncated")
