"""The engine process's side of ``--workers N``: the engines served on a Unix socket (protocol in ``wire.py``).

Per request this side does only what queueing needs: a ``RemoteRequest`` (deadline, abandoned flag, arrival)
and one ``QueuedInputs`` run per tower, made for every request of a frame in one pass. Captions arrive
tokenized, results leave per batch (one ``results`` message per connection and batch, packed on the batcher's
answer thread), and the frontends' metrics arrive aggregated, so the socket thread's event loop spends its time
per frame, request and batch, not per input.
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .jobs import TOWERS, BatchRows, QueuedInputs, ServerBusy
from .wire import FrameProtocol, Outbox, pack_rows

logger = logging.getLogger(__name__)


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop  # the serve extra's uvicorn[standard] brings it

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


class RemoteRequest:
    """A frontend's request as the batchers see it (what ``EmbeddingJob`` offers them, and no future: its
    results go back through ``sink``, its connection)."""

    __slots__ = ("sink", "request_id", "deadline", "arrival", "abandoned", "pending", "engine", "images", "texts",
                 "normalize")

    def __init__(self, sink: "FrontendConnection", request_id: int, deadline: float, arrival: float,
                 normalize: bool = True) -> None:
        self.sink = sink
        self.normalize = normalize  # the vector its rows carry back: L2-normalised, else raw
        self.request_id = request_id
        self.deadline = deadline
        self.arrival = arrival
        self.abandoned = False
        self.pending = 0  # items without a result yet (changed under the connection's lock)
        self.engine: Any = None
        self.images: List[QueuedInputs] = []
        self.texts: List[QueuedInputs] = []

    def expired(self, now: float) -> bool:
        return self.abandoned or now > self.deadline


class FrontendConnection:
    """One frontend's connection: its requests still in the engines, and the way their results go back."""

    def __init__(self, loop: asyncio.AbstractEventLoop, outbox: Outbox) -> None:
        self.loop = loop
        self.outbox = outbox
        self.waiting: Dict[int, RemoteRequest] = {}
        self.lock = threading.Lock()  # both towers' answer threads settle the same requests

    def deliver_rows(self, runs: Sequence[Tuple[QueuedInputs, int]], rows: BatchRows) -> None:
        """A batch's results for this connection (on an answer thread), as ``(run, its first position in
        rows)``: one message, one slice of the batch's matrix, rows of abandoned requests left out."""
        ids: List[int] = []
        indices: List[int] = []
        kept: List[int] = []
        normalized: List[bool] = []
        errors: List[Tuple[int, int, str]] = []
        failed = rows.errors
        with self.lock:
            for run, start in runs:
                request = run.job
                count = len(run.indices)
                request.pending -= count
                if request.pending == 0:
                    self.waiting.pop(request.request_id, None)
                if request.abandoned:
                    continue
                request_id = request.request_id
                if not failed:
                    ids += [request_id] * count
                    indices += run.indices
                    kept += range(start, start + count)
                    normalized += [request.normalize] * count
                    continue
                for position, index in enumerate(run.indices, start):
                    error = failed.get(position)
                    if error is None:
                        ids.append(request_id)
                        indices.append(index)
                        kept.append(position)
                        normalized.append(request.normalize)
                    else:
                        errors.append((request_id, index, error.message))
        if not ids and not errors:
            return
        message = pack_rows(ids, indices, kept, normalized, rows, errors)
        try:
            self.loop.call_soon_threadsafe(self.outbox.send, message)
        except RuntimeError:  # the socket's loop is closed: the server is stopping
            pass

    def abandon(self, request_id: int) -> None:
        with self.lock:
            request = self.waiting.pop(request_id, None)
        if request is not None:
            request.abandoned = True
            if request.engine is not None:
                request.engine.abandon(request.images, request.texts)

    def abandon_all(self) -> None:
        with self.lock:
            requests, self.waiting = list(self.waiting.values()), {}
        for request in requests:
            request.abandoned = True
            if request.engine is not None:
                request.engine.abandon(request.images, request.texts)


class EngineServer:
    """The engines, served on a Unix socket from a thread running its own event loop."""

    def __init__(self, pool: Any, path: str) -> None:
        self.pool = pool
        self.path = path
        self.loop = new_event_loop()
        self.thread = threading.Thread(target=self._run, daemon=True, name="clip_flash-engine-socket")
        self.started = threading.Event()

    def start(self) -> None:
        self.thread.start()
        self.started.wait()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(
            self.loop.create_unix_server(lambda: _FrontendProtocol(self), self.path))
        os.chmod(self.path, 0o600)
        self.started.set()
        self.loop.run_forever()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    def _handle(self, message: Any, connection: FrontendConnection) -> None:
        kind = message[0]
        if kind == "embed":
            self._embed(connection, message[1])
        elif kind == "abandon":
            connection.abandon(message[1])
        elif kind == "state":
            pool = self.pool
            pool.metrics.apply(message[2])
            connection.outbox.send(("state", message[1], pool.state, pool.error, pool.description,
                                    {tower: pool.queue_depth(tower) for tower in TOWERS}, pool.text_tokenizer,
                                    pool.embedding_width))
        elif kind == "metrics":
            self.pool.metrics.apply(message[2])
            connection.outbox.send(("metrics", message[1], self.pool.metrics.render()))

    def _embed(self, connection: FrontendConnection,
               requests: Sequence[Tuple[int, float, Tuple[list, list], Tuple[list, list], bool]]) -> None:
        """Queue every request of one frame together (refusals answered one by one)."""
        now = time.monotonic()
        waiting = connection.waiting
        made: List[Tuple[RemoteRequest, List[QueuedInputs], List[QueuedInputs]]] = []
        for request_id, seconds_left, images, texts, normalize in requests:
            request = RemoteRequest(connection, request_id, now + seconds_left, now, normalize)
            request.images = [QueuedInputs(request, *images)] if images[0] else []
            request.texts = [QueuedInputs(request, *texts)] if texts[0] else []
            request.pending = len(images[0]) + len(texts[0])
            # in ``waiting`` before the batchers can answer it, so its last result finds it there
            waiting[request.request_id] = request
            made.append((request, request.images, request.texts))
        engines, refused = self.pool.submit_many(made)
        for request, engine in zip(made, engines):
            request[0].engine = engine
        for position, error in refused:
            request_id = made[position][0].request_id
            waiting.pop(request_id, None)
            connection.outbox.send(("refused", request_id, "busy" if isinstance(error, ServerBusy) else "not_ready",
                                    str(error)))


class _FrontendProtocol(FrameProtocol):
    """One frontend's connection on the engine's event loop: its messages handled in order; when it ends (the
    frontend went away, or sent what is not a frame), its queued inputs are dropped."""

    def __init__(self, server: EngineServer) -> None:
        super().__init__()
        self.server = server
        self.connection: Optional[FrontendConnection] = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.connection = FrontendConnection(self.server.loop, Outbox(transport))

    def messages_received(self, messages: List[Any]) -> None:
        for message in messages:
            self.server._handle(message, self.connection)

    def connection_lost(self, exc: Optional[Exception]) -> None:
        if self.connection is not None:
            self.connection.abandon_all()
