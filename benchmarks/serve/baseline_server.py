"""The embedding server an operator writes today: FastAPI, OpenCLIP's ``preprocess``, the stock model.

    python benchmarks/serve/baseline_server.py --model ViT-L-14 --precision fp16 --port 8001

The serve bench's first baseline. Each request is handled on its own, one at a time (a lock around the
work: the GPU is one resource and there is no batching across requests): images are opened with Pillow and
put through the model's ``preprocess``, captions through ``open_clip.get_tokenizer``, then one
``encode_image``/``encode_text`` call on that request's items, L2-normalised. The routes and shapes match
the clip_flash server's so the same load runs against both: ``POST /v1/embeddings`` (OpenAI's shape;
``data:image/...;base64,`` strings are images), ``POST /v1/embeddings/image`` (the raw file as the body),
``GET /ready``, ``GET /v1/models``. Any bad input fails the whole request with 400. ``NAME`` builds
random-init weights seeded as clip_flash seeds them, so both servers hold the same weights.
"""
from __future__ import annotations

import argparse
import base64
import io
import struct
import sys
import threading
from contextlib import asynccontextmanager
from typing import List, Optional, Union

import open_clip
import torch
import uvicorn
from fastapi import FastAPI, HTTPException, Request
from PIL import Image
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class EmbeddingRequest(BaseModel):
    input: Union[str, List[str]]
    model: Optional[str] = None
    encoding_format: str = "float"


class State:
    model = None
    preprocess = None
    tokenizer = None
    name = ""
    device = torch.device("cpu")
    dtype = torch.float32
    lock = threading.Lock()


def load(spec: str, device: str, precision: str) -> None:
    name, _, weights = spec.partition("::")
    torch.manual_seed(0)  # the seed clip_flash.models.load_model uses for random-init weights
    model, _, preprocess = open_clip.create_model_and_transforms(
        name, pretrained=weights or None, precision=precision, device=device)
    State.model, State.preprocess = model.eval(), preprocess
    State.tokenizer = open_clip.get_tokenizer(name)
    State.name, State.device, State.dtype = spec, torch.device(device), DTYPES[precision]


def encode_images(files: List[bytes]) -> torch.Tensor:
    try:
        pixels = torch.stack([State.preprocess(Image.open(io.BytesIO(data))) for data in files])
    except Exception as error:
        raise HTTPException(400, f"cannot read image: {error}") from None
    with torch.inference_mode():
        features = State.model.encode_image(pixels.to(State.device, State.dtype))
        return torch.nn.functional.normalize(features.float(), dim=-1).cpu()


def encode_texts(texts: List[str]) -> torch.Tensor:
    with torch.inference_mode():
        features = State.model.encode_text(State.tokenizer(texts).to(State.device))
        return torch.nn.functional.normalize(features.float(), dim=-1).cpu()


def response(features: torch.Tensor, encoding_format: str) -> dict:
    rows = features.tolist()
    if encoding_format == "base64":
        rows = [base64.b64encode(struct.pack(f"<{len(row)}f", *row)).decode() for row in rows]
    data = [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)]
    return {"object": "list", "model": State.name, "data": data, "usage": {"prompt_tokens": 0, "total_tokens": 0}}


def build_app(spec: str, device: str, precision: str) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        load(spec, device, precision)
        yield

    app = FastAPI(lifespan=lifespan)

    @app.get("/ready")
    def ready():
        if State.model is None:
            raise HTTPException(503, "loading")
        return {"status": "ready"}

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": State.name, "object": "model"}]}

    @app.post("/v1/embeddings")
    def embeddings(body: EmbeddingRequest):
        items = [body.input] if isinstance(body.input, str) else body.input
        if not items:
            raise HTTPException(400, "input is empty")
        images = [item for item in items if item.startswith("data:image/")]
        with State.lock:
            if images and len(images) != len(items):
                raise HTTPException(400, "mixing images and captions in one request is not supported")
            if images:
                try:
                    files = [base64.b64decode(item.split(",", 1)[1]) for item in images]
                except Exception as error:
                    raise HTTPException(400, f"bad data URI: {error}") from None
                features = encode_images(files)
            else:
                features = encode_texts(items)
        return response(features, body.encoding_format)

    @app.post("/v1/embeddings/image")
    async def image(request: Request):
        data = await request.body()

        def work() -> torch.Tensor:
            with State.lock:
                return encode_images([data])

        return response(await run_in_threadpool(work), "float")

    return app


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="ViT-B-32", help="NAME, NAME::TAG or NAME::/path/to/checkpoint")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precision", default="fp32", choices=sorted(DTYPES))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    args = parser.parse_args(argv)
    uvicorn.run(build_app(args.model, args.device, args.precision), host=args.host, port=args.port,
                log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
