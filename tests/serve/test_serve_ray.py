"""clip_flash.serve.ray on a local CPU Ray: one replica with the same routes and the same embeddings."""
from __future__ import annotations

import numpy as np
import pytest

try:
    from ray import serve
except Exception as error:  # noqa: BLE001 - ray, or its serve extra (grpcio, ...), is not installed
    pytest.skip(f"Ray Serve does not import here ({type(error).__name__}: {error}); pip install 'ray[serve]'",
                allow_module_level=True)
pytest.importorskip("starlette", reason="the serve extra is not installed: pip install 'clip_flash[serve]'")

import httpx  # noqa: E402

from tests.serve.contract import CAPTIONS, StockReference, vectors  # noqa: E402
from tests.serve.server_process import data_uri, free_port, jpeg_bytes  # noqa: E402


@pytest.fixture(scope="module")
def ray_url():
    import ray

    from clip_flash.serve import ServeConfig
    from clip_flash.serve.ray import deployment

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    port = free_port()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(deployment(ServeConfig(device="cpu", max_wait_ms=5, max_batch=16)), route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def test_ray_replica_serves_the_same_routes(ray_url):
    assert httpx.get(ray_url + "/ready", timeout=30).status_code == 200
    reference = StockReference("ViT-B-32", "cpu", "fp32")
    photo = jpeg_bytes(0)
    inputs = CAPTIONS + [data_uri(photo), data_uri(b"not an image")]
    response = httpx.post(ray_url + "/v1/embeddings", json={"model": "ViT-B-32", "input": inputs}, timeout=120)
    assert response.status_code == 200, response.text
    body = response.json()
    assert [error["index"] for error in body["errors"]] == [len(inputs) - 1]
    got = vectors(body)
    np.testing.assert_allclose(got[:len(CAPTIONS)], reference.texts(CAPTIONS), atol=2e-5, rtol=0)
    np.testing.assert_allclose(got[len(CAPTIONS)], reference.images([photo])[0], atol=2e-5, rtol=0)
    models = httpx.get(ray_url + "/v1/models").json()
    assert models["data"][0]["random_init"] is True
