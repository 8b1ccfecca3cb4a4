"""A model-less server with the embedding routes, for measuring the load generator itself and for tests.

    python -m benchmarks.serve.stub_server --port 8000 [--workers 4] [--delay-ms 0] [--serial] [--fail-every 0]

It answers ``/v1/embeddings`` (OpenAI's shape, float or base64) and ``/v1/embeddings/image`` with a fixed
vector per input item, after ``--delay-ms`` (asynchronously, so requests overlap; ``--serial`` makes them
queue one at a time, as a server without batching does). ``--fail-every N`` answers every Nth request with
``--fail-status``. Starlette on uvicorn with uvloop and httptools, orjson bodies; ``--workers`` processes
share one listening socket, so the server side can be made faster than the generator.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import os
import socket
import struct
import sys
from typing import List

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

MODEL_ID = "stub"


def build_app(dim: int = 768, delay_ms: float = 0.0, serial: bool = False, fail_every: int = 0,
              fail_status: int = 500) -> Starlette:
    vector = [1.0 / dim ** 0.5] * dim
    vector_b64 = base64.b64encode(struct.pack(f"<{dim}f", *vector)).decode()
    counter = itertools.count(1)
    lock = asyncio.Lock()

    def answer(count: int, encoding: str) -> Response:
        embedding = vector_b64 if encoding == "base64" else vector
        data = [{"object": "embedding", "index": i, "embedding": embedding} for i in range(count)]
        body = {"object": "list", "model": MODEL_ID, "data": data,
                "usage": {"prompt_tokens": 0, "total_tokens": 0}}
        return Response(orjson.dumps(body), media_type="application/json")

    async def work() -> None:
        if delay_ms <= 0:
            return
        if serial:
            async with lock:
                await asyncio.sleep(delay_ms / 1000.0)
        else:
            await asyncio.sleep(delay_ms / 1000.0)

    def failing() -> bool:
        return fail_every > 0 and next(counter) % fail_every == 0

    async def embeddings(request: Request) -> Response:
        body = orjson.loads(await request.body())
        inputs = body.get("input")
        count = 1 if isinstance(inputs, str) else len(inputs or [])
        await work()
        if failing():
            return Response(b'{"error": {"message": "stub failure"}}', status_code=fail_status)
        return answer(count, body.get("encoding_format", "float"))

    async def image(request: Request) -> Response:
        await request.body()
        await work()
        if failing():
            return Response(b'{"error": {"message": "stub failure"}}', status_code=fail_status)
        return answer(1, "float")

    async def ready(request: Request) -> Response:
        return Response(b"ok")

    async def models(request: Request) -> Response:
        return Response(orjson.dumps({"object": "list", "data": [{"id": MODEL_ID, "object": "model"}]}),
                        media_type="application/json")

    return Starlette(routes=[
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/v1/embeddings/image", image, methods=["POST"]),
        Route("/ready", ready), Route("/health", ready), Route("/v1/models", models),
    ])


def _serve(app: Starlette, sock: socket.socket) -> None:
    import uvicorn

    config = uvicorn.Config(app, loop="uvloop", http="httptools", log_level="warning", access_log=False,
                            backlog=4096)
    uvicorn.Server(config).run(sockets=[sock])


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=1, help="processes sharing the listening socket")
    parser.add_argument("--dim", type=int, default=768, help="embedding length")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="time each request takes")
    parser.add_argument("--serial", action="store_true", help="requests take their delay one at a time")
    parser.add_argument("--fail-every", type=int, default=0, help="answer every Nth request with --fail-status")
    parser.add_argument("--fail-status", type=int, default=500)
    args = parser.parse_args(argv)
    app = build_app(args.dim, args.delay_ms, args.serial, args.fail_every, args.fail_status)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    sock.set_inheritable(True)
    children = []
    for _ in range(args.workers - 1):
        pid = os.fork()
        if pid == 0:
            _serve(app, sock)
            os._exit(0)
        children.append(pid)
    try:
        _serve(app, sock)
    finally:
        for pid in children:
            try:
                os.kill(pid, 15)
                os.waitpid(pid, 0)
            except OSError:
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
