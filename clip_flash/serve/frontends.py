"""``--workers N``: N HTTP frontend processes in front of one engine process, never one model copy per frontend.

One Python process's HTTP work caps the small requests it answers, model or not (design notes, section 9), so
past that rate the HTTP work is spread over processes while the model stays in one: this process loads the
engines (one per GPU) and serves them on a Unix socket; each frontend (spawned, accepting on one listening
socket this process opened and handed to them, so the kernel spreads connections) runs the same routes over a
``RemotePool`` that forwards each request's inputs through that socket and gets their embeddings back.

Frames are length-prefixed pickles of message lists, one frame per event-loop pass and direction (both ends
are this package, on this host, over a socket only this user can open). Frontend to engine: ``("embed", id,
seconds_left, [(index, kind, payload)])``, ``("abandon", id)``, ``("state", id, observations)`` (what the
frontend's routes observed since: the engine process holds the one metrics registry), ``("metrics", id,
observations)``. Engine to frontend: ``("done", id, *pack_results(...))``, ``("refused", id,
"busy"|"not_ready", message)``, ``("state", id, state, error, description, depths)``, ``("metrics", id, text)``.

SIGTERM (or Ctrl-C) here: the frontends stop accepting and answer what they accepted, then the engines stop.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import os
import pickle
import signal
import socket
import struct
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .config import ServeConfig
from .jobs import IMAGE, TEXT, TOWERS, Embedded, EmbeddingJob, Item, ItemError, NotReady, ServerBusy

logger = logging.getLogger(__name__)

HEADER = struct.Struct("!I")
STATE_POLL_SECONDS = 0.25
REPLY_TIMEOUT_SECONDS = 10.0  # a state or metrics question the engine process leaves unanswered this long


def _new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop  # the serve extra's uvicorn[standard] brings it

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


async def read_messages(reader: asyncio.StreamReader) -> List[Any]:
    """The next frame's messages (a frame carries every message one side queued in one event-loop pass)."""
    header = await reader.readexactly(HEADER.size)
    return pickle.loads(await reader.readexactly(HEADER.unpack(header)[0]))


def frame(messages: List[Any]) -> bytes:
    data = pickle.dumps(messages, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(data)) + data


class Outbox:
    """Messages to one socket, sent together once per event-loop pass: one pickle and one write for every
    request that arrived (or finished) in that pass, not one each."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self._messages: List[Any] = []

    def send(self, message: Any) -> None:
        if not self._messages:
            asyncio.get_running_loop().call_soon(self._flush)
        self._messages.append(message)

    def _flush(self) -> None:
        messages, self._messages = self._messages, []
        if messages and not self.writer.is_closing():
            self.writer.write(frame(messages))

    def is_closing(self) -> bool:
        return self.writer.is_closing()


def pack_results(inputs: Sequence[Tuple[int, str, Any]], results: Sequence[Any]) -> Tuple[Any, ...]:
    """A request's results as a few arrays (one pickle each, not one per embedding): (indices, raw, normalized,
    token counts, [(index, error message)])."""
    import numpy as np

    good = [(inputs[position][0], result) for position, result in enumerate(results) if type(result) is Embedded]
    errors = [(inputs[position][0], getattr(result, "message", "no embedding was produced"))
              for position, result in enumerate(results) if type(result) is not Embedded]
    if not good:
        return [], None, None, [], errors
    raw = np.stack([result.raw for _, result in good])
    normalized = np.stack([result.normalized for _, result in good])
    return [index for index, _ in good], raw, normalized, [result.tokens for _, result in good], errors


def unpack_results(indices, raw, normalized, tokens, errors) -> List[Tuple[int, Any]]:
    pairs: List[Tuple[int, Any]] = [(index, Embedded(raw[row], normalized[row], tokens[row]))
                                    for row, index in enumerate(indices)]
    return pairs + [(index, ItemError(message)) for index, message in errors]


# -- the engine process -----------------------------------------------------------------------------------------
class EngineServer:
    """The engines, served on a Unix socket from a thread running its own event loop."""

    def __init__(self, pool: Any, path: str) -> None:
        self.pool = pool
        self.path = path
        self.loop = _new_event_loop()
        self.thread = threading.Thread(target=self._run, daemon=True, name="clip_flash-engine-socket")
        self.started = threading.Event()

    def start(self) -> None:
        self.thread.start()
        self.started.wait()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_unix_server(self._connection, self.path))
        os.chmod(self.path, 0o600)
        self.started.set()
        self.loop.run_forever()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        waiting: Dict[int, Tuple[Any, List[Item]]] = {}
        outbox = Outbox(writer)
        try:
            while True:
                for message in await read_messages(reader):
                    self._handle(message, outbox, waiting)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the frontend went away: its queued inputs are dropped
        finally:
            for engine, items in waiting.values():
                engine.abandon(items)
            writer.close()

    def _handle(self, message: Any, outbox: Outbox, waiting: Dict[int, Tuple[Any, List[Item]]]) -> None:
        kind, request_id = message[0], message[1]
        if kind == "embed":
            self._embed(outbox, waiting, request_id, message[2], message[3])
        elif kind == "abandon":
            engine, items = waiting.pop(request_id, (None, []))
            if engine is not None:
                for item in items:
                    item.job.abandoned = True
                engine.abandon(items)
        elif kind == "state":
            pool = self.pool
            pool.metrics.apply(message[2])
            outbox.send(("state", request_id, pool.state, pool.error, pool.description,
                         {tower: pool.queue_depth(tower) for tower in TOWERS}))
        elif kind == "metrics":
            self.pool.metrics.apply(message[2])
            outbox.send(("metrics", request_id, self.pool.metrics.render()))

    def _embed(self, outbox: Outbox, waiting, request_id: int, seconds_left: float, inputs) -> None:
        job = EmbeddingJob(self.loop, len(inputs), time.monotonic() + seconds_left)
        images = [Item(job, position, payload) for position, (_, kind, payload) in enumerate(inputs) if kind == IMAGE]
        texts = [Item(job, position, payload) for position, (_, kind, payload) in enumerate(inputs) if kind == TEXT]
        try:
            engine = self.pool.submit(job, images, texts)
        except ServerBusy as error:
            outbox.send(("refused", request_id, "busy", str(error)))
            return
        except NotReady as error:
            outbox.send(("refused", request_id, "not_ready", str(error)))
            return
        waiting[request_id] = (engine, images + texts)

        def answer(_: Any) -> None:
            if waiting.pop(request_id, None) is None:
                return  # abandoned
            outbox.send(("done", request_id) + pack_results(inputs, job.results))

        job.future.add_done_callback(answer)


# -- a frontend -------------------------------------------------------------------------------------------------
class RemoteHandle:
    def __init__(self, pool: "RemotePool", request_id: int) -> None:
        self.pool = pool
        self.request_id = request_id

    def abandon(self, items: Sequence[Item]) -> int:
        self.pool._forget(self.request_id)
        self.pool._send(("abandon", self.request_id))
        return len(items)


class RemotePool:
    """What ``build_app`` needs of an ``EnginePool``, forwarding to the engine process."""

    def __init__(self, path: str) -> None:
        from .metrics import RelayedMetrics

        self.path = path
        self.metrics = RelayedMetrics()
        self.state, self.error, self.description = "loading", None, ""
        self.depths = {tower: 0 for tower in TOWERS}
        self._ids = itertools.count()
        self._jobs: Dict[int, EmbeddingJob] = {}
        self._replies: Dict[int, asyncio.Future] = {}
        self._writer: Optional[asyncio.StreamWriter] = None
        self._outbox: Optional[Outbox] = None
        self._tasks: List[asyncio.Task] = []

    async def connect(self) -> None:
        reader, self._writer = await asyncio.open_unix_connection(self.path)
        self._outbox = Outbox(self._writer)
        self._tasks = [asyncio.ensure_future(self._read(reader)), asyncio.ensure_future(self._poll_state())]

    async def disconnect(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._writer is not None:
            self._writer.close()

    def queue_depth(self, tower: str) -> int:
        return self.depths.get(tower, 0)

    def submit(self, job: EmbeddingJob, images: Sequence[Item], texts: Sequence[Item]) -> RemoteHandle:
        # Forwarded unless the engine process is gone: the state polled here lags the engine's by up to
        # STATE_POLL_SECONDS (another frontend may have answered /ready already), and the engine refuses
        # (503) what it cannot take yet.
        if self.state == "failed":
            raise NotReady(self.error or "the engine process is not reachable")
        request_id = next(self._ids)
        inputs = [(item.index, IMAGE, item.payload) for item in images]
        inputs += [(item.index, TEXT, item.payload) for item in texts]
        self._jobs[request_id] = job
        self._send(("embed", request_id, max(0.0, job.deadline - time.monotonic()), inputs))
        return RemoteHandle(self, request_id)

    async def engine_metrics(self) -> bytes:
        try:
            return await asyncio.wait_for(self._ask("metrics"), REPLY_TIMEOUT_SECONDS)
        except asyncio.TimeoutError:
            raise NotReady("the engine process did not answer") from None

    def _send(self, message: Any) -> None:
        if self._outbox is None or self._outbox.is_closing():
            raise NotReady("the engine process is not reachable")
        self._outbox.send(message)

    def _forget(self, request_id: int) -> None:
        self._jobs.pop(request_id, None)

    async def _ask(self, kind: str) -> Any:
        request_id = next(self._ids)
        reply = self._replies[request_id] = asyncio.get_running_loop().create_future()
        self._send((kind, request_id, self.metrics.take()))
        return await reply

    async def _poll_state(self) -> None:
        while True:
            try:
                self.state, self.error, self.description, self.depths = await asyncio.wait_for(
                    self._ask("state"), REPLY_TIMEOUT_SECONDS)
            except (NotReady, asyncio.TimeoutError):
                self.state, self.error = "failed", "the engine process is not reachable"
            await asyncio.sleep(STATE_POLL_SECONDS)

    def _receive(self, message: Any) -> None:
        kind, request_id = message[0], message[1]
        if kind == "done":
            job = self._jobs.pop(request_id, None)
            if job is not None:
                for index, result in unpack_results(*message[2:]):
                    job.settle(index, result)
        elif kind == "refused":
            job = self._jobs.pop(request_id, None)
            if job is not None:
                job.refuse(ServerBusy(message[3]) if message[2] == "busy" else NotReady(message[3]))
        else:
            reply = self._replies.pop(request_id, None)
            if reply is not None and not reply.done():
                reply.set_result(message[2] if kind == "metrics" else message[2:])

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                for message in await read_messages(reader):
                    self._receive(message)
        except (asyncio.IncompleteReadError, ConnectionError):
            self.state, self.error = "failed", "the engine process went away"
            for job in self._jobs.values():
                job.refuse(NotReady(self.error))
            self._jobs.clear()


def _frontend_main(config: ServeConfig, path: str, listener: socket.socket) -> None:
    """One frontend process: uvicorn on the shared listening socket, the routes over a RemotePool."""
    import uvicorn

    from .app import build_app
    from .cli import uvicorn_config

    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = build_app(config, RemotePool(path))
    server = uvicorn.Server(uvicorn_config(app, config))
    server.run(sockets=[listener])


def serve_with_frontends(config: ServeConfig) -> int:
    """This process: the engines and their socket; ``config.workers`` frontend processes; SIGTERM stops all."""
    from .engine import EnginePool
    from .metrics import ServeMetrics

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    holder: Dict[str, Any] = {}
    metrics = ServeMetrics(lambda tower: holder["pool"].queue_depth(tower))
    pool = holder["pool"] = EnginePool(config, metrics)
    pool.metrics = metrics
    directory = tempfile.mkdtemp(prefix="clip_flash_serve_")
    path = os.path.join(directory, "engine.sock")
    engine_server = EngineServer(pool, path)
    engine_server.start()
    listener = socket.socket(socket.AF_INET6 if ":" in config.host else socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((config.host, config.port))
    listener.listen(2048)
    listener.set_inheritable(True)
    context = multiprocessing.get_context("spawn")
    frontends = [context.Process(target=_frontend_main, args=(config, path, listener), name=f"clip_flash-http-{n}")
                 for n in range(config.workers)]
    for process in frontends:
        process.start()
    logger.info("%d HTTP frontends on http://%s:%d; loading the model", config.workers, config.host, config.port)
    loader = threading.Thread(target=pool.load, daemon=True, name="clip_flash-load")
    loader.start()
    while not stop.wait(0.5):
        if pool.state == "failed" or not any(process.is_alive() for process in frontends):
            break
    for process in frontends:  # they stop accepting and answer what they accepted
        if process.is_alive():
            os.kill(process.pid, signal.SIGTERM)
    for process in frontends:
        process.join()
    listener.close()
    engine_server.stop()
    loader.join()  # a model still loading is not torn down under the loading thread
    pool.close()
    try:
        os.unlink(path)
        os.rmdir(directory)
    except OSError:
        pass
    if pool.state == "failed":
        logger.error("the model could not be loaded: %s", pool.error)
        return 1
    if not stop.is_set():
        logger.error("the HTTP frontends exited (exit codes %s)", [process.exitcode for process in frontends])
        return 1
    return 0
