"""A frontend's side of ``--workers N``: ``RemotePool``, what ``build_app`` needs of an ``EnginePool``, forwarding
to the engine process over its Unix socket (protocol in ``wire.py``); ``RemotePools``, the same over one engine
process per GPU (``--devices 0,1``).

Work that is per request moves here, off the engine process's one GIL: captions are tokenized here (with the
tokenizer and context length the engine names in its state reply, so the ids are the engine's own), every
request of an event-loop pass travels in one ``embed`` message, results come back as one message per batch
and are scattered into the jobs here, and metrics are aggregated here before they travel.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .engine import READY, EnginesTogether
from .jobs import TOWERS, EmbeddingJob, NotReady, QueuedInputs, ServerBusy
from .wire import FrameProtocol, Outbox, token_bytes, unpack_batch

logger = logging.getLogger(__name__)

STATE_POLL_SECONDS = 0.25
READY_ASK_SECONDS = 1.0  # how long /ready waits for the engine's fresh state before answering from the polled one
REPLY_TIMEOUT_SECONDS = 10.0  # a state or metrics question the engine process leaves unanswered this long


def _wire_run(runs: Sequence[QueuedInputs]) -> Tuple[List[int], List[Any]]:
    """A request's runs for one tower as the ``embed`` message carries them: (indices, payloads)."""
    if len(runs) == 1:
        return list(runs[0].indices), list(runs[0].payloads)
    return ([index for run in runs for index in run.indices], [payload for run in runs for payload in run.payloads])


class RemoteHandle:
    def __init__(self, pool: "RemotePool", request_id: int) -> None:
        self.pool = pool
        self.request_id = request_id

    def abandon(self, images: Sequence[QueuedInputs], texts: Sequence[QueuedInputs] = ()) -> int:
        self.pool._forget(self.request_id)
        self.pool._send(("abandon", self.request_id))
        return sum(len(run.indices) for run in (*images, *texts))


class RemotePool:
    """What ``build_app`` needs of an ``EnginePool``, forwarding to the engine process."""

    def __init__(self, path: str, preloaded: Optional[Tuple[str, Any]] = None) -> None:
        """``preloaded``: (name, tokenizer) loaded before this process froze its startup objects; used when the
        engine names that tokenizer (with the context length the engine gives)."""
        from .metrics import RelayedMetrics

        self.path = path
        self._preloaded = preloaded
        self.metrics = RelayedMetrics()
        self.state, self.error, self.description = "loading", None, ""
        self.embedding_width: Optional[int] = None  # floats per embedding, as the engine last said
        self.depths = {tower: 0 for tower in TOWERS}
        self.tokenizer: Optional[Tuple[Any, int]] = None  # (the engine's tokenizer, its context length)
        self._tokenizer_spec: Optional[Tuple[str, int]] = None  # the tokenizer loaded here
        self._named_tokenizer: Optional[Tuple[str, int]] = None  # the one the engine last named
        self._ids = itertools.count()
        self._jobs: Dict[int, EmbeddingJob] = {}
        self._replies: Dict[int, asyncio.Future] = {}
        self._transport: Optional[asyncio.WriteTransport] = None
        self._closing = False  # disconnect() asked: the connection's end is not the engine going away
        self._outbox: Optional[Outbox] = None
        self._tasks: List[asyncio.Task] = []
        self._pending: List[Tuple[int, float, list, list]] = []  # requests of this event-loop pass

    async def connect(self) -> None:
        """Connects to the engine's socket. An engine process already gone (its model failed to load before this
        frontend started) leaves this pool failed, not the frontend's start: the server stops with the engine's
        reason, and until then /ready says why."""
        try:
            self._transport, _ = await asyncio.get_running_loop().create_unix_connection(
                lambda: _EngineProtocol(self), self.path)
        except OSError as error:
            self.state, self.error = "failed", f"the engine process is not reachable ({error.strerror or error})"
            return
        self._outbox = Outbox(self._transport, self._pack_pending)
        self._tasks = [asyncio.ensure_future(self._poll_state())]

    async def disconnect(self) -> None:
        for task in self._tasks:
            task.cancel()
        self._closing = True
        if self._transport is not None:
            self._transport.close()

    def queue_depth(self, tower: str) -> int:
        return self.depths.get(tower, 0)

    @property
    def outstanding(self) -> int:
        """This frontend's requests sent to the engine and not yet answered."""
        return len(self._jobs)

    def submit(self, job: EmbeddingJob, images: Sequence[QueuedInputs], texts: Sequence[QueuedInputs]
               ) -> RemoteHandle:
        # Forwarded unless the engine process is gone: the state polled here lags the engine's by up to
        # STATE_POLL_SECONDS (another frontend may have answered /ready already), and the engine refuses
        # (503) what it cannot take yet.
        if self.state == "failed":
            raise NotReady(self.error or "the engine process is not reachable")
        if self._outbox is None or self._outbox.is_closing():
            raise NotReady("the engine process is not reachable")
        request_id = next(self._ids)
        self._jobs[request_id] = job
        self._pending.append((request_id, max(0.0, job.deadline - time.monotonic()), _wire_run(images),
                              _wire_run(texts), job.normalize))
        self._outbox.schedule()
        return RemoteHandle(self, request_id)

    def _pack_pending(self) -> None:
        """This pass's requests as one ``embed`` message, captions tokenized (all in one tokenizer call)."""
        if not self._pending:
            return
        requests, self._pending = self._pending, []
        if self.tokenizer is not None:
            tokenizer, context_length = self.tokenizer
            captions = [caption for request in requests for caption in request[3][1]]
            if captions:
                try:
                    ids = token_bytes(tokenizer(captions, context_length=context_length))
                except Exception:  # noqa: BLE001 - the engine tokenizes them then, and reports what fails
                    logger.exception("tokenizing %d captions failed; the engine process tokenizes them", len(captions))
                else:
                    tokenized, start = [], 0
                    for request_id, seconds_left, images, (indices, _), normalize in requests:
                        tokenized.append((request_id, seconds_left, images,
                                          (indices, ids[start:start + len(indices)]), normalize))
                        start += len(indices)
                    requests = tokenized
        # first in the frame: an ``abandon`` queued in this pass is for one of these requests
        self._outbox.put_first(("embed", requests))

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
        self._send((kind, request_id, self.metrics.take()))  # first: an engine not reachable leaves no reply waiting
        reply = self._replies[request_id] = asyncio.get_running_loop().create_future()
        return await reply

    async def refresh_state(self) -> None:
        """The engine's state, asked now rather than at the next poll. ``/ready`` asks when the polled state is
        still loading: another frontend may already have answered 200, and a client must not see ``/ready`` go
        back to 503. Without an answer within ``READY_ASK_SECONDS`` (a loading engine's GIL is busy) the polled
        state stands; the poll alone decides that the engine is unreachable."""
        try:
            self._apply_state(await asyncio.wait_for(self._ask("state"), READY_ASK_SECONDS))
        except (NotReady, asyncio.TimeoutError):
            pass

    def _apply_state(self, reply: Tuple[Any, ...]) -> None:
        (self.state, self.error, self.description, self.depths, self._named_tokenizer,
         self.embedding_width) = reply

    async def _poll_state(self) -> None:
        while True:
            try:
                self._apply_state(await asyncio.wait_for(self._ask("state"), REPLY_TIMEOUT_SECONDS))
                if self._named_tokenizer != self._tokenizer_spec:
                    await self._load_tokenizer(self._named_tokenizer)
            except (NotReady, asyncio.TimeoutError):
                self.state, self.error = "failed", "the engine process is not reachable"
            await asyncio.sleep(STATE_POLL_SECONDS)

    async def _load_tokenizer(self, spec: Optional[Tuple[str, int]]) -> None:
        """The tokenizer the engine names (until it is loaded, captions travel as text and the engine
        tokenizes them: the same ids either way)."""
        self._tokenizer_spec = spec
        if spec is None:
            self.tokenizer = None
            return
        from clip_flash.inputs.text.tokenizer import get_tokenizer

        name, context_length = spec
        if self._preloaded is not None and self._preloaded[0] == name:
            self.tokenizer = (self._preloaded[1], context_length)
            return
        try:  # not the one preloaded: load it now (OpenCLIP's import holds this process's GIL for seconds)
            tokenizer = await asyncio.get_running_loop().run_in_executor(None, get_tokenizer, name)
        except Exception:  # noqa: BLE001 - the engine keeps tokenizing then
            logger.exception("could not load the %s tokenizer; the engine process tokenizes captions", name)
            return
        from .engine import freeze_loaded_objects

        freeze_loaded_objects()  # what the import made stays out of every full collection, as at start
        self.tokenizer = (tokenizer, context_length)

    def _receive(self, message: Any) -> None:
        kind = message[0]
        if kind == "results":
            jobs = self._jobs
            for request_id, index, result in unpack_batch(message):
                job = jobs.get(request_id)
                if job is not None:  # None: abandoned here already, its late rows are dropped
                    job.settle(index, result)
                    if job.pending == 0:
                        del jobs[request_id]
            return
        request_id = message[1]
        if kind == "refused":
            job = self._jobs.pop(request_id, None)
            if job is not None:
                job.refuse(ServerBusy(message[3]) if message[2] == "busy" else NotReady(message[3]))
        else:
            reply = self._replies.pop(request_id, None)
            if reply is not None and not reply.done():
                reply.set_result(message[2] if kind == "metrics" else message[2:])

    def _lost(self) -> None:
        """The connection ended: unless this side closed it, the engine process went away."""
        if self._closing:
            return
        self.state, self.error = "failed", "the engine process went away"
        for job in self._jobs.values():
            job.refuse(NotReady(self.error))
        self._jobs.clear()


class _EngineProtocol(FrameProtocol):
    """The frontend's connection to one engine process: replies and results to the pool, in order."""

    def __init__(self, pool: RemotePool) -> None:
        super().__init__()
        self.pool = pool

    def messages_received(self, messages: List[Any]) -> None:
        for message in messages:
            self.pool._receive(message)

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.pool._lost()


class RemotePools(EnginesTogether):
    """What ``build_app`` needs of an ``EnginePool``, over several engine processes (one per GPU): a request goes
    whole to the ready engine with the fewest of this frontend's requests outstanding; the state, queue depths and
    /metrics are the engines' together (as one process's ``EnginePool`` gives them). The frontend's own counts
    travel with the first engine's questions only, so they are counted once."""

    def __init__(self, pools: Sequence[RemotePool]) -> None:
        self.pools = self.members = list(pools)
        self.metrics = self.pools[0].metrics
        self._turn = itertools.count()  # engines equally free take requests in turn

    async def connect(self) -> None:
        for pool in self.pools:
            await pool.connect()

    async def refresh_state(self) -> None:
        """Every engine's state asked now (``RemotePool.refresh_state``)."""
        await asyncio.gather(*(pool.refresh_state() for pool in self.pools))

    async def disconnect(self) -> None:
        for pool in self.pools:
            await pool.disconnect()

    def submit(self, job: EmbeddingJob, images: Sequence[QueuedInputs], texts: Sequence[QueuedInputs]
               ) -> RemoteHandle:
        ready = [pool for pool in self.pools if pool.state == READY]
        if not ready:
            return self.pools[0].submit(job, images, texts)  # forwarded: the engine refuses with its reason
        start = next(self._turn) % len(ready)
        pool = min(ready[start:] + ready[:start], key=lambda pool: pool.outstanding)
        return pool.submit(job, images, texts)

    async def engine_metrics(self) -> bytes:
        from .metrics import merge_expositions

        return merge_expositions(await asyncio.gather(*(pool.engine_metrics() for pool in self.pools)))
