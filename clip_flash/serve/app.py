"""The HTTP routes (Starlette on uvicorn): OpenAI's ``POST /v1/embeddings``, raw and multipart image uploads on
``POST /v1/embeddings/image``, ``/health``, ``/ready``, ``/v1/models`` and ``/metrics``.

A request is answered whatever happens: 200 (with per-item ``errors`` if some inputs failed), 400 (every input
failed, or a malformed body or query), 401, 404 (a model not served, or no such route), 405 (a method the route
does not take; ``Allow``), 413, 415, 429 (the queue is full; ``Retry-After``), 503 (loading, shutting down, or
past ``--request-timeout``: its queued inputs are then dropped, never computed). Every error is in OpenAI's shape.
A client that goes away has its queued inputs dropped too.
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import threading
import time
from typing import Any, AsyncIterator, Callable, Dict, List, Optional, Tuple, Union

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .config import ServeConfig
from .engine import FAILED, LOADING, READY, EnginePool
from .jobs import IMAGE, TEXT, EmbeddingJob, ItemError, NotReady, QueuedInputs, ServerBusy
from .metrics import CONTENT_TYPE, ServeMetrics
from .protocol import (
    ENCODING_FORMATS, Input, RequestError, check_dimensions, embeddings_response, error_body,
    parse_embeddings_request, query_choice, query_flag,
)

JSON = "application/json"
EMBEDDINGS_ROUTE, IMAGE_ROUTE = "/v1/embeddings", "/v1/embeddings/image"
MAX_MULTIPART_FILES = 4096
CLIENT_GONE = 499  # nginx's code for it, in the metrics only: the client never sees a response


class BodyTooLarge(Exception):
    pass


class ServerState:
    """What the routes share: settings, the engines, the metrics, and the names the model answers to."""

    def __init__(self, config: ServeConfig, pool: EnginePool, metrics: ServeMetrics) -> None:
        from clip_flash.models import parse_model_spec

        self.config = config
        self.pool = pool
        self.metrics = metrics
        spec = parse_model_spec(config.model)
        self.spec = spec
        self.model_id = config.served_name or spec.text
        self.model_names = {self.model_id, spec.text, spec.name}
        self.bearer = f"Bearer {config.api_key}".encode() if config.api_key else None
        self.created = int(time.time())


def json_response(status: int, body: Union[bytes, Dict[str, Any]], headers: Optional[Dict[str, str]] = None):
    return Response(body if isinstance(body, bytes) else orjson.dumps(body), status, headers, JSON)


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refusing (``BodyTooLarge``) past ``limit`` bytes, declared or streamed."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


ANSWERED, TIMED_OUT, CLIENT_LEFT = "answered", "timed out", "client left"
# A request answered sooner needs no task watching its connection (most are, and a task per request costs the
# event loop more than the rest of the wait); one still waiting then has its client watched, so items of a
# client that left are still dropped before compute while they queue.
WATCH_CLIENT_AFTER_S = 0.05


async def _wait_for_job(job: EmbeddingJob, receive: Callable, seconds: float) -> str:
    """Wait for the job's results, at most ``seconds``, or until the client disconnects: ANSWERED, TIMED_OUT or
    CLIENT_LEFT. Timers, not ``asyncio.wait``: this runs once per request."""
    loop, future = job.loop, job.future
    ended = [ANSWERED]
    watcher: List[asyncio.Task] = []

    def end(how: str) -> None:
        if not future.done():
            ended[0] = how
            future.set_result(None)

    def watched(task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is None:
            end(CLIENT_LEFT)

    def watch() -> None:
        if not future.done():
            watcher.append(loop.create_task(_client_gone(receive)))
            watcher[0].add_done_callback(watched)

    seconds = max(0.0, seconds)
    timers = (loop.call_later(seconds, end, TIMED_OUT), loop.call_later(min(WATCH_CLIENT_AFTER_S, seconds), watch))
    try:
        await future
    finally:
        for timer in timers:
            timer.cancel()
        for task in watcher:
            task.cancel()
    return ended[0]


async def _client_gone(receive: Callable) -> None:
    """Returns when the client disconnects (the body is read already, so nothing else arrives)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


def build_app(config: ServeConfig, pool: Optional[EnginePool] = None, *, load: bool = True,
              on_load_failure: Optional[Callable[[str], None]] = None) -> Starlette:
    """The ASGI app. ``pool``: engines to serve (default: made from ``config``). ``load``: load them in the
    background at startup (``/ready`` says when they are ready); False when the caller loaded them already.
    ``on_load_failure(message)``: called when loading fails (the CLI stops the server with an error)."""
    remote = pool is not None and hasattr(pool, "connect")
    pool = pool or EnginePool(config)
    metrics = pool.metrics
    state = ServerState(config, pool, metrics)
    per_engine_queue = -(-config.max_queue // len(config.device_names()))  # a request goes whole to one engine

    def unauthorized(request: Request) -> Optional[Response]:
        if state.bearer is None:
            return None
        given = request.headers.get("authorization", "").encode()
        if hmac.compare_digest(given, state.bearer):
            return None
        return json_response(401, error_body("missing or wrong API key: send 'Authorization: Bearer <key>'",
                                             code="invalid_api_key"), {"WWW-Authenticate": "Bearer"})

    def finish(route: str, started: float, response: Response) -> Response:
        metrics.answered(route, response.status_code, time.perf_counter() - started)
        return response

    def refuse(route: str, started: float, error: RequestError) -> Response:
        return finish(route, started, json_response(error.status, error.body(), error.headers))

    async def health(request: Request) -> Response:
        return json_response(200, {"status": "ok"})

    async def ready(request: Request) -> Response:
        denied = unauthorized(request)
        if denied is not None:
            return denied
        status = pool.state
        if remote and status == LOADING:  # this frontend's view may lag the engine's by a poll: ask it now
            await pool.refresh_state()
            status = pool.state
        body: Dict[str, Any] = {"status": status, "model": state.model_id}
        if status == READY:
            body["engine"] = pool.description
            return json_response(200, body)
        if status == FAILED:
            body["error"] = pool.error
        return json_response(503, body, {"Retry-After": "1"})

    async def models(request: Request) -> Response:
        denied = unauthorized(request)
        if denied is not None:
            return denied
        entry = {"id": state.model_id, "object": "model", "created": state.created, "owned_by": "clip_flash",
                 "weights": state.spec.weights_note or f"pretrained: {state.spec.weights}",
                 "random_init": state.spec.kind == "random", "ready": pool.state == READY}
        return json_response(200, {"object": "list", "data": [entry]})

    async def metrics_route(request: Request) -> Response:
        denied = unauthorized(request)
        if denied is not None:
            return denied
        # With --workers N the engine process holds the one registry every frontend reports to.
        try:
            body = await pool.engine_metrics() if remote else metrics.render()
        except NotReady as error:
            return json_response(503, error_body(str(error), "server_error"), {"Retry-After": "1"})
        return Response(body, 200, media_type=CONTENT_TYPE)

    async def embed(request: Request, route: str, started: float, inputs: List[Union[Input, ItemError]],
                    encoding_format: str, normalize: bool) -> Response:
        """Queue the inputs, wait for them (until the deadline or the client leaves), answer."""
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + config.request_timeout
        job = EmbeddingJob(loop, len(inputs), deadline, normalize)
        found: Dict[str, Tuple[List[int], List[Any]]] = {IMAGE: ([], []), TEXT: ([], [])}
        for index, entry in enumerate(inputs):
            if type(entry) is ItemError:
                job.settle(index, entry)
            else:
                indices, payloads = found[entry[0]]
                indices.append(index)
                payloads.append(entry[1])
        # each tower's inputs of the request queue as one run
        images = [QueuedInputs(job, *found[IMAGE])] if found[IMAGE][0] else []
        texts = [QueuedInputs(job, *found[TEXT])] if found[TEXT][0] else []
        count = len(found[IMAGE][0]) + len(found[TEXT][0])
        if count > per_engine_queue:  # could never be admitted: not a 429 to retry
            return refuse(route, started, RequestError(
                413, f"{count} inputs in one request; this server queues at most "
                     f"{per_engine_queue} for one engine (--max-queue)", param="input"))
        engine = None
        if images or texts:
            try:
                engine = pool.submit(job, images, texts)
            except ServerBusy as busy:
                return refuse(route, started, RequestError(429, str(busy), kind="rate_limit_error",
                                                           headers={"Retry-After": "1"}))
            except NotReady as not_ready:
                return refuse(route, started, RequestError(503, str(not_ready), kind="server_error",
                                                           headers={"Retry-After": "1"}))
        if not job.future.done():
            ended = await _wait_for_job(job, request.receive, deadline - time.monotonic())
            if ended != ANSWERED:
                job.abandoned = True
                engine.abandon(images, texts)
                if ended == CLIENT_LEFT:
                    return finish(route, started, Response(status_code=CLIENT_GONE))
                return refuse(route, started, RequestError(
                    503, f"not answered within {config.request_timeout:g} s (--request-timeout); its queued "
                         f"inputs were dropped", kind="server_error", code="timeout", headers={"Retry-After": "1"}))
        if job.refusal is not None:  # an engine in another process refused the items
            busy = isinstance(job.refusal, ServerBusy)
            return refuse(route, started, RequestError(429 if busy else 503, str(job.refusal),
                                                       kind="rate_limit_error" if busy else "server_error",
                                                       headers={"Retry-After": "1"}))
        answering = time.perf_counter()
        status, body = embeddings_response(state.model_id, job.results, encoding_format, normalize)
        done = time.perf_counter()
        for tower, (indices, _) in found.items():
            if indices:
                bad = sum(1 for index in indices if type(job.results[index]) is ItemError)
                metrics.outcomes(tower, len(indices) - bad, bad)
        metrics.answered(route, status, done - started, done - answering)
        return json_response(status, body)

    def check_ready(route: str, started: float) -> Optional[Response]:
        if pool.state == READY or (remote and pool.state != FAILED):
            return None  # a remote engine answers for itself: this frontend's view of it may be 0.25 s old
        message = pool.error if pool.state == FAILED else "the model is still loading; see GET /ready"
        return refuse(route, started, RequestError(503, message, kind="server_error", headers={"Retry-After": "1"}))

    async def check_width(dimensions: int) -> None:
        """``RequestError`` unless ``dimensions`` is the model's embedding width (400), or while that width is not
        known yet (503: the engine is still loading)."""
        width = pool.embedding_width
        if width is None and remote:  # this frontend's view may lag the engine's by a poll: ask it now
            await pool.refresh_state()
            width = pool.embedding_width
        if width is None:
            if pool.state == READY:
                raise RequestError(400, "this server cannot tell its model's embedding width, so it takes no "
                                        "'dimensions': leave it out", param="dimensions")
            raise RequestError(503, "the model is still loading; see GET /ready", kind="server_error",
                               headers={"Retry-After": "1"})
        check_dimensions(dimensions, width, state.model_id)

    async def embeddings(request: Request) -> Response:
        started = time.perf_counter()
        denied = unauthorized(request)
        if denied is not None:
            return finish(EMBEDDINGS_ROUTE, started, denied)
        try:
            body = await read_body(request, config.max_request_bytes)
        except BodyTooLarge:
            return refuse(EMBEDDINGS_ROUTE, started, _too_large(config))
        try:
            parsed = parse_embeddings_request(body)
        except RequestError as error:
            return refuse(EMBEDDINGS_ROUTE, started, error)
        if parsed.model is not None and parsed.model not in state.model_names:
            return refuse(EMBEDDINGS_ROUTE, started, RequestError(
                404, f"The model '{parsed.model}' does not exist; this server serves '{state.model_id}' "
                     f"(see GET /v1/models)", param="model", code="model_not_found"))
        not_ready = check_ready(EMBEDDINGS_ROUTE, started)
        if not_ready is not None:
            return not_ready
        if parsed.dimensions is not None:
            try:
                await check_width(parsed.dimensions)
            except RequestError as error:
                return refuse(EMBEDDINGS_ROUTE, started, error)
        return await embed(request, EMBEDDINGS_ROUTE, started, parsed.inputs, parsed.encoding_format,
                           parsed.normalize)

    async def image_upload(request: Request) -> Response:
        started = time.perf_counter()
        denied = unauthorized(request)
        if denied is not None:
            return finish(IMAGE_ROUTE, started, denied)
        content_type = request.headers.get("content-type", "")
        query = request.query_params
        try:
            encoding_format = query_choice(query, "encoding_format", ENCODING_FORMATS)
            normalize = query_flag(query, "normalize", True)
        except RequestError as error:
            return refuse(IMAGE_ROUTE, started, error)
        try:
            body = await read_body(request, config.max_request_bytes)
        except BodyTooLarge:
            return refuse(IMAGE_ROUTE, started, _too_large(config))
        if content_type.startswith("image/"):
            inputs: List[Union[Input, ItemError]] = [(IMAGE, body)]
        elif content_type.startswith("multipart/form-data"):
            try:
                inputs = await _multipart_files(request, body, config.max_request_bytes)
            except RequestError as error:
                return refuse(IMAGE_ROUTE, started, error)
        else:
            return refuse(IMAGE_ROUTE, started, RequestError(
                415, f"Content-Type {content_type or '(none)'!r}: send the image itself (Content-Type image/...) "
                     "or multipart/form-data with one file per image"))
        not_ready = check_ready(IMAGE_ROUTE, started)
        if not_ready is not None:
            return not_ready
        return await embed(request, IMAGE_ROUTE, started, inputs, encoding_format, normalize)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if hasattr(pool, "connect"):  # engines in another process (--workers N)
            await pool.connect()
            yield
            await pool.disconnect()
            return
        if load:
            thread = threading.Thread(target=_load_then_report, args=(pool, on_load_failure), daemon=True,
                                      name="clip_flash-load")
            thread.start()
        yield
        # uvicorn has answered every accepted request by now; the batchers finish anything left, then stop.
        await asyncio.to_thread(pool.close)

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/ready", ready, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/metrics", metrics_route, methods=["GET"]),
        Route(EMBEDDINGS_ROUTE, embeddings, methods=["POST"]),
        Route(IMAGE_ROUTE, image_upload, methods=["POST"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error})
    app.state.serve = state
    return app


async def http_error(request: Request, error: HTTPException) -> Response:
    """Starlette's own refusals (404: no such route; 405: a method the route does not take, with ``Allow``) in
    OpenAI's error shape, as every other error of this server."""
    if error.status_code == 404:
        message = (f"no route {request.method} {request.url.path} on this server; its routes: POST {EMBEDDINGS_ROUTE}, "
                   f"POST {IMAGE_ROUTE}, GET /health, /ready, /v1/models, /metrics")
    elif error.status_code == 405:
        allowed = (error.headers or {}).get("Allow")
        message = (f"method {request.method} is not allowed on {request.url.path}"
                   + (f"; it takes {allowed}" if allowed else ""))
    else:
        message = str(error.detail)
    return json_response(error.status_code, error_body(message), error.headers)


def _too_large(config: ServeConfig) -> RequestError:
    return RequestError(413, f"the body is larger than {config.max_request_bytes} bytes (--max-request-bytes)")


async def _multipart_files(request: Request, body: bytes, limit: int) -> List[Union[Input, ItemError]]:
    """Every file part of a multipart body, in order, as an image input."""
    from starlette.datastructures import UploadFile
    from starlette.formparsers import MultiPartException, MultiPartParser

    async def stream() -> AsyncIterator[bytes]:
        yield body

    parser = MultiPartParser(request.headers, stream(), max_files=MAX_MULTIPART_FILES, max_fields=MAX_MULTIPART_FILES,
                             max_part_size=limit)
    try:
        form = await parser.parse()
    except MultiPartException as error:
        raise RequestError(400, f"malformed multipart body: {error.message}") from None
    inputs: List[Union[Input, ItemError]] = []
    try:
        for _, value in form.multi_items():
            if isinstance(value, UploadFile):
                inputs.append((IMAGE, await value.read()))
    finally:
        await form.close()
    if not inputs:
        raise RequestError(400, "the multipart body has no file parts")
    return inputs


def _load_then_report(pool: EnginePool, on_load_failure: Optional[Callable[[str], None]]) -> None:
    pool.load()  # a model that cannot load is logged there, with its reason
    if pool.state == FAILED:
        if on_load_failure is not None:
            on_load_failure(pool.error or "unknown error")
