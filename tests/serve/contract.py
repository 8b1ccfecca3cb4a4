"""The server's contract, as a client sees it: tests shared by the CPU suite (test_serve.py) and the GPU suite
(test_serve_gpu.py), which each provide the ``server`` (a ready ``ServerProcess``) and ``reference`` (a
``StockReference`` with the same weights) fixtures and ``TOLERANCE``."""
from __future__ import annotations

import asyncio
import base64
import io
import time

import httpx
import numpy as np
import pytest
import torch

from tests.serve.server_process import data_uri, jpeg_bytes, png_bytes

CAPTIONS = ["a photo of a cat", "A DOG  running on the beach!", "café au lait, s'il vous plaît",
            "", "x " * 100]
BROKEN_JPEG = jpeg_bytes(1)[:200]
NOT_AN_IMAGE = b"this is not an image"


class StockReference:
    """Stock OpenCLIP with the server's random-init weights (``load_model`` seeds 0 before building)."""

    def __init__(self, name: str = "ViT-B-32", device: str = "cpu", precision: str = "fp32") -> None:
        import open_clip

        if device.startswith("cuda"):
            torch.backends.cudnn.allow_tf32 = False  # stock conv1 on cuDNN would round in TF32; the server's doesn't
        torch.manual_seed(0)
        self.model, _, self.preprocess = open_clip.create_model_and_transforms(
            name, pretrained=None, precision=precision, device=device)
        self.model.eval()
        self.tokenizer = open_clip.get_tokenizer(name)
        self.device = device
        # precision="fp16" leaves some parameters in fp32 (positional_embedding, the first): the image tower's
        # input takes its patch embedding's dtype
        self.dtype = self.model.visual.conv1.weight.dtype

    @torch.inference_mode()
    def texts(self, captions, normalize: bool = True) -> np.ndarray:
        out = self.model.encode_text(self.tokenizer(captions).to(self.device), normalize=normalize)
        return out.float().cpu().numpy()

    @torch.inference_mode()
    def images(self, payloads, normalize: bool = True) -> np.ndarray:
        from PIL import Image

        pixels = torch.stack([self.preprocess(Image.open(io.BytesIO(p))) for p in payloads])
        out = self.model.encode_image(pixels.to(self.device, self.dtype), normalize=normalize)
        return out.float().cpu().numpy()

    def token_count(self, captions) -> int:
        return int((self.tokenizer(captions) != 0).sum())


def vectors(body) -> np.ndarray:
    return np.array([entry["embedding"] for entry in body["data"]], dtype=np.float32)


def post(server, json, path="/v1/embeddings", **kwargs):
    return httpx.post(server.url + path, json=json, headers=server.headers, timeout=60, **kwargs)


def test_captions_equal_stock_in_order(server, reference, tolerance):
    response = post(server, {"model": "ViT-B-32", "input": CAPTIONS})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "list" and body["model"] == "ViT-B-32"
    assert [entry["index"] for entry in body["data"]] == list(range(len(CAPTIONS)))
    assert "errors" not in body
    got = vectors(body)
    np.testing.assert_allclose(got, reference.texts(CAPTIONS), atol=tolerance, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    tokens = reference.token_count(CAPTIONS)
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}


def test_many_captions_of_many_lengths_equal_stock(server, reference, tolerance):
    """Enough captions in one batch to be cut into length groups, answered in input order."""
    words = "the quick brown fox jumps over a lazy dog near the river bank at dawn".split()
    captions = [" ".join(words[: 1 + n % 4]) if n % 2 else " ".join(words * 2)[: 80 + n] for n in range(36)]
    response = post(server, {"input": captions})
    assert response.status_code == 200, response.text
    np.testing.assert_allclose(vectors(response.json()), reference.texts(captions), atol=tolerance, rtol=0)


def test_images_and_captions_mixed_equal_stock(server, reference, tolerance):
    photos = [jpeg_bytes(0), jpeg_bytes(1, (640, 480)), png_bytes()]
    inputs = [data_uri(photos[0]), "a photo of a cat", data_uri(photos[1]), data_uri(photos[2], "png")]
    response = post(server, {"model": "ViT-B-32", "input": inputs})
    assert response.status_code == 200, response.text
    got = vectors(response.json())
    np.testing.assert_allclose(got[[0, 2, 3]], reference.images(photos), atol=tolerance, rtol=0)
    np.testing.assert_allclose(got[1], reference.texts(["a photo of a cat"])[0], atol=tolerance, rtol=0)


def test_base64_equals_float_and_normalize_false(server, reference, tolerance):
    inputs = ["a red bicycle", data_uri(jpeg_bytes(2))]
    floats = vectors(post(server, {"input": inputs}).json())
    body = post(server, {"input": inputs, "encoding_format": "base64"}).json()
    decoded = np.stack([np.frombuffer(base64.b64decode(e["embedding"]), dtype="<f4") for e in body["data"]])
    np.testing.assert_array_equal(decoded, floats)
    raw = vectors(post(server, {"input": inputs, "normalize": False}).json())
    np.testing.assert_allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), floats, atol=1e-6)
    scale = np.abs(raw).max()
    np.testing.assert_allclose(raw[0], reference.texts(inputs[:1], normalize=False)[0], atol=tolerance * scale)


def test_openai_client_unchanged(server, tolerance):
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key=server.api_key or "unused", max_retries=0)
    inputs = ["a photo of a cat", data_uri(jpeg_bytes(3))]
    result = client.embeddings.create(model="ViT-B-32", input=inputs)  # the client asks for base64 by default
    assert [entry.index for entry in result.data] == [0, 1]
    got = np.array([entry.embedding for entry in result.data], dtype=np.float32)
    np.testing.assert_array_equal(got, vectors(post(server, {"input": inputs}).json()))
    single = client.embeddings.create(model="ViT-B-32", input="a photo of a cat", encoding_format="float")
    np.testing.assert_allclose(np.float32(single.data[0].embedding), got[0], atol=tolerance, rtol=0)  # other batch
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="text-embedding-3-small", input="a cat")


def test_per_item_errors_keep_good_items(server, reference, tolerance):
    inputs = ["a photo of a cat", data_uri(NOT_AN_IMAGE), "data:image/jpeg;base64,%%%not-base64", 42,
              data_uri(BROKEN_JPEG), data_uri(jpeg_bytes(0)), "data:image/png,plain"]
    response = post(server, {"model": "ViT-B-32", "input": inputs})
    assert response.status_code == 200, response.text
    body = response.json()
    assert [entry["index"] for entry in body["data"]] == [0, 5]
    errors = {error["index"]: error["message"] for error in body["errors"]}
    assert sorted(errors) == [1, 2, 3, 4, 6]
    assert "UnidentifiedImageError" in errors[1] and "Truncated" in errors[4], errors  # Pillow's own reason
    assert "base64" in errors[2] and "strings" in errors[3] and "base64" in errors[6]
    got = vectors(body)
    np.testing.assert_allclose(got[1], reference.images([jpeg_bytes(0)])[0], atol=tolerance, rtol=0)


def test_every_item_failed_is_400(server):
    response = post(server, {"input": [data_uri(NOT_AN_IMAGE), data_uri(BROKEN_JPEG)]})
    assert response.status_code == 400
    body = response.json()
    assert body["error"]["type"] == "invalid_request_error"
    assert [error["index"] for error in body["errors"]] == [0, 1]


def test_unknown_model_404_and_bad_bodies_400(server):
    response = post(server, {"model": "no-such-model", "input": "a cat"})
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "model_not_found" and error["param"] == "model" and "no-such-model" in error["message"]
    for body in ({"model": "ViT-B-32"}, {"input": []}, {"input": "a", "encoding_format": "int8"},
                 {"input": "a", "normalize": "yes"}):
        response = post(server, body)
        assert response.status_code == 400 and "message" in response.json()["error"], body
    response = httpx.post(server.url + "/v1/embeddings", content=b"{not json", headers=server.headers)
    assert response.status_code == 400


def test_image_route_raw_and_multipart(server, tolerance):
    photo = jpeg_bytes(0)
    expected = vectors(post(server, {"input": [data_uri(photo)]}).json())[0]
    raw = httpx.post(server.url + "/v1/embeddings/image", content=photo,
                     headers={**server.headers, "Content-Type": "image/jpeg"}, timeout=60)
    assert raw.status_code == 200, raw.text
    # Rows from batches of other sizes may differ in their last bits on a GPU (other GEMM kernels): tolerance.
    np.testing.assert_allclose(vectors(raw.json())[0], expected, atol=tolerance, rtol=0)
    files = [("files", ("a.jpg", photo, "image/jpeg")), ("files", ("b.bin", NOT_AN_IMAGE, "image/jpeg")),
             ("files", ("c.png", png_bytes(), "image/png"))]
    multi = httpx.post(server.url + "/v1/embeddings/image", files=files, headers=server.headers, timeout=60)
    assert multi.status_code == 200, multi.text
    body = multi.json()
    assert [entry["index"] for entry in body["data"]] == [0, 2]
    assert [error["index"] for error in body["errors"]] == [1]
    np.testing.assert_allclose(vectors(body)[0], expected, atol=tolerance, rtol=0)
    wrong = httpx.post(server.url + "/v1/embeddings/image", content=b"x",
                       headers={**server.headers, "Content-Type": "text/plain"})
    assert wrong.status_code == 415


def test_models_and_metrics(server):
    models = httpx.get(server.url + "/v1/models", headers=server.headers).json()
    assert models["data"][0]["id"] == "ViT-B-32"
    assert models["data"][0]["random_init"] is True and "random init" in models["data"][0]["weights"]
    post(server, {"input": ["a cat", data_uri(jpeg_bytes(0))]})
    from prometheus_client.parser import text_string_to_metric_families

    deadline = time.monotonic() + 15  # with --workers N, frontends report to the engine process every 0.25 s
    while True:
        text = httpx.get(server.url + "/metrics", headers=server.headers).text
        families = {family.name: family for family in text_string_to_metric_families(text)}
        requests = [s for s in families["clip_flash_requests"].samples if s.name == "clip_flash_requests_total"]
        if any(s.labels == {"route": "/v1/embeddings", "status": "200"} and s.value >= 1 for s in requests):
            break
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for name in ("clip_flash_requests", "clip_flash_queue_depth", "clip_flash_batch_size",
                 "clip_flash_queue_seconds", "clip_flash_prepare_seconds", "clip_flash_encode_seconds",
                 "clip_flash_answer_seconds"):
        assert name in families, name
    requests = [s for s in families["clip_flash_requests"].samples if s.name == "clip_flash_requests_total"]
    assert any(s.labels == {"route": "/v1/embeddings", "status": "200"} and s.value >= 1 for s in requests)
    towers = {s.labels["tower"] for s in families["clip_flash_batch_size"].samples}
    assert towers == {"image", "text"}
    depth = {s.labels["tower"]: s.value for s in families["clip_flash_queue_depth"].samples}
    assert set(depth) == {"image", "text"}


def test_64_concurrent_clients_mixing_good_and_bad(server):
    good, bad = data_uri(jpeg_bytes(1)), data_uri(NOT_AN_IMAGE)

    async def client(number: int, http: httpx.AsyncClient):
        statuses = []
        for step in range(2):
            kind = (number + step) % 4
            inputs = [["a cat", bad], [f"caption {number}"], [bad], ["a dog", bad, "x"]][kind]
            if number % 16 == 0:
                inputs = inputs + [good]  # a few images: on a CPU each costs tens of milliseconds
            response = await http.post("/v1/embeddings", json={"input": inputs})
            statuses.append(response.status_code)
            body = response.json()
            if response.status_code == 200:
                returned = [entry["index"] for entry in body["data"]] + [e["index"] for e in body.get("errors", [])]
                assert sorted(returned) == list(range(len(inputs)))
        return statuses

    async def main():
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(base_url=server.url, headers=server.headers, timeout=120,
                                     limits=limits) as http:
            return await asyncio.gather(*(client(n, http) for n in range(64)))

    statuses = [status for per_client in asyncio.run(main()) for status in per_client]
    assert len(statuses) == 64 * 2
    assert set(statuses) <= {200, 400}, sorted(set(statuses))
    all_bad = sum(1 for n in range(64) for step in range(2) if (n + step) % 4 == 2 and n % 16 != 0)
    assert statuses.count(400) == all_bad  # exactly the requests whose every input was bad


def test_dimensions_only_the_model_width(server):
    """OpenAI's ``dimensions`` shortens embeddings trained to be cut; CLIP's are not: the model's own width is
    taken (and answered at that width), any other is a 400 in OpenAI's shape, as is a value that is no width."""
    width = len(post(server, {"input": ["a cat"]}).json()["data"][0]["embedding"])
    response = post(server, {"model": "ViT-B-32", "input": ["a cat"], "dimensions": width})
    assert response.status_code == 200, response.text
    assert len(response.json()["data"][0]["embedding"]) == width
    assert post(server, {"input": ["a cat"], "dimensions": None}).status_code == 200  # null: not given
    response = post(server, {"model": "ViT-B-32", "input": ["a cat"], "dimensions": width // 2})
    assert response.status_code == 400, response.text[:200]
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "dimensions"
    assert f"{width} dimensions" in error["message"] and "cannot be shortened" in error["message"]
    for bad in (0, -3, 1.5, float(width), "256", True, [width]):
        response = post(server, {"input": ["a cat"], "dimensions": bad})
        assert response.status_code == 400, (bad, response.text[:200])
        assert response.json()["error"]["param"] == "dimensions", bad


def test_image_route_query_parameters_are_strict(server):
    """``?normalize=`` takes true/false or 1/0 (any case) and ``?encoding_format=`` float or base64, as the JSON
    route's fields; anything else (or a parameter given twice) is a 400 in OpenAI's shape, not a guess."""
    photo = jpeg_bytes(0)

    def upload(query: str) -> httpx.Response:
        return httpx.post(server.url + "/v1/embeddings/image" + query, content=photo,
                          headers={**server.headers, "Content-Type": "image/jpeg"}, timeout=60)

    normalized = vectors(upload("").json())[0]
    raw = vectors(upload("?normalize=FALSE").json())[0]
    assert abs(np.linalg.norm(normalized) - 1) < 1e-5 and abs(np.linalg.norm(raw) - 1) > 1e-3
    np.testing.assert_array_equal(vectors(upload("?normalize=0").json())[0], raw)
    np.testing.assert_array_equal(vectors(upload("?normalize=True").json())[0], normalized)
    np.testing.assert_array_equal(vectors(upload("?normalize=1").json())[0], normalized)
    encoded = upload("?encoding_format=base64").json()["data"][0]["embedding"]
    np.testing.assert_array_equal(np.frombuffer(base64.b64decode(encoded), dtype="<f4"), normalized)
    for query, param in (("?normalize=maybe", "normalize"), ("?normalize=", "normalize"),
                         ("?normalize=no", "normalize"), ("?normalize=true&normalize=false", "normalize"),
                         ("?encoding_format=int8", "encoding_format"), ("?encoding_format=", "encoding_format")):
        response = upload(query)
        assert response.status_code == 400, (query, response.text[:200])
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == param, (query, error)


def test_wrong_method_405_and_unknown_path_404_in_openai_shape(server):
    for method, path, allowed in (("GET", "/v1/embeddings", "POST"), ("PUT", "/v1/embeddings/image", "POST"),
                                  ("POST", "/v1/models", "GET")):
        response = httpx.request(method, server.url + path, headers=server.headers)
        assert response.status_code == 405, (method, path, response.text)
        assert response.headers["content-type"] == "application/json"
        assert allowed in response.headers["allow"]
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and method in error["message"], error
    for method, path in (("GET", "/v1/no-such-route"), ("POST", "/v2/embeddings")):
        response = httpx.request(method, server.url + path, headers=server.headers)
        assert response.status_code == 404
        assert response.headers["content-type"] == "application/json"
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and path in error["message"], error
