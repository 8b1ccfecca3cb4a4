"""What travels between the HTTP side and the engine: one ``EmbeddingJob`` per request, one ``QueuedInputs`` per
request and tower (its inputs for that tower, queued together).

The engine's threads never touch a job's fields directly: results go back to the job's event loop with one
``call_soon_threadsafe`` per batch (``deliver_rows``), so a job is only ever changed on its loop's thread.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

IMAGE, TEXT = "image", "text"
TOWERS = (IMAGE, TEXT)

QUEUED, TAKEN, DROPPED = 0, 1, 2


class ServerBusy(Exception):
    """The engine's queue has no room for this request's items (HTTP 429)."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class NotReady(Exception):
    """The model is still loading, or the engine is stopping (HTTP 503)."""


class ItemError:
    """Why one input produced no embedding (reported per item, the request's other items still answered)."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message

    def __repr__(self) -> str:
        return f"ItemError({self.message!r})"


class Embedded:
    """One input's embedding: the raw features, the L2-normalised ones, and the caption's token count. From an
    engine in another process only the one its request asked for travels; the other is None."""

    __slots__ = ("raw", "normalized", "tokens")

    def __init__(self, raw: Any, normalized: Any, tokens: int) -> None:
        self.raw = raw
        self.normalized = normalized
        self.tokens = tokens


Result = Union[Embedded, ItemError]


class BatchRows:
    """One batch's results as one array: ``both[0, p]`` is position ``p``'s raw features and ``both[1, p]`` its
    L2-normalised ones (float32, on the CPU; each half a contiguous matrix, so a destination's rows are one
    slice or one row gather of it); a position in ``errors`` has no row. Rows are handed on by position, so
    results for hundreds of inputs cost one copy per destination, not an object each."""

    __slots__ = ("both", "tokens", "errors")

    def __init__(self, both: Any, tokens: Optional[Sequence[int]], errors: Dict[int, ItemError]) -> None:
        self.both = both
        self.tokens = tokens  # captions' token counts by position (None: images, no tokens)
        self.errors = errors

    def result(self, position: int) -> Result:
        error = self.errors.get(position)
        if error is not None:
            return error
        return Embedded(self.both[0, position], self.both[1, position],
                        self.tokens[position] if self.tokens is not None else 0)


class EmbeddingJob:
    """One request waiting on the engine. ``future`` completes (on ``loop``) once every item has a result."""

    __slots__ = ("loop", "future", "results", "pending", "deadline", "abandoned", "arrival", "refusal", "normalize")

    def __init__(self, loop: asyncio.AbstractEventLoop, count: int, deadline: float, normalize: bool = True) -> None:
        self.loop = loop
        self.normalize = normalize  # which vector the answer carries: L2-normalised, else the raw features
        self.future: asyncio.Future = loop.create_future()
        self.results: List[Optional[Result]] = [None] * count
        self.pending = count
        self.deadline = deadline  # time.monotonic() past which its items are not computed
        self.abandoned = False  # the client went away or the deadline passed: drop what is still queued
        self.arrival = time.monotonic()
        self.refusal: Optional[Exception] = None  # ServerBusy/NotReady from an engine in another process

    def refuse(self, error: Exception) -> None:
        """The engine would not take the items (on the loop's thread)."""
        self.refusal = error
        if not self.future.done():
            self.future.set_result(None)

    def expired(self, now: float) -> bool:
        return self.abandoned or now > self.deadline

    @property
    def sink(self) -> asyncio.AbstractEventLoop:
        """Where ``deliver_rows`` sends this job's results: its event loop."""
        return self.loop

    def settle(self, index: int, result: Result) -> None:
        """Record one result (on the loop's thread)."""
        if self.results[index] is None:
            self.results[index] = result
            self.pending -= 1
            if self.pending == 0 and not self.future.done():
                self.future.set_result(None)


class QueuedInputs:
    """A run of one request's inputs for one tower, queued as one entry: a request of 64 captions is one queue
    entry, one state change and one hand-back per batch, not 64. ``payloads[k]`` is the request's input number
    ``indices[k]``: bytes (an encoded image), or a caption (a str, or its token ids: ``wire.token_bytes``).
    ``state`` moves QUEUED -> TAKEN (into a batch) or -> DROPPED, under the engine's queue lock, so the queue
    depth counts each input exactly once. A batch with room for only part of a run takes it with ``split``."""

    __slots__ = ("job", "indices", "payloads", "state", "enqueued")

    def __init__(self, job: Any, indices: Sequence[int], payloads: Sequence[Any]) -> None:
        self.job = job
        self.indices = indices
        self.payloads = payloads
        self.state = QUEUED
        self.enqueued = 0.0

    def __len__(self) -> int:
        return len(self.indices)

    def split(self, count: int) -> "QueuedInputs":
        """The first ``count`` inputs as a new run (enqueued at the same time); this one keeps the rest."""
        head = QueuedInputs(self.job, self.indices[:count], self.payloads[:count])
        head.enqueued = self.enqueued
        self.indices, self.payloads = self.indices[count:], self.payloads[count:]
        return head


def _settle_rows(runs: Sequence[Tuple[QueuedInputs, int]], rows: BatchRows) -> None:
    for run, start in runs:
        settle = run.job.settle
        for offset, index in enumerate(run.indices):
            settle(index, rows.result(start + offset))


def deliver_rows(batch: Sequence[QueuedInputs], rows: BatchRows) -> None:
    """Hand a batch's results to their jobs' sinks, from any thread, one hand-off per sink and batch: the runs
    of ``batch`` cover the positions of ``rows`` in order. A sink with ``deliver_rows(runs, rows)`` (the engine
    process's connection to a frontend) takes its ``(run, first position)`` pairs at once; an event loop settles
    them on its thread."""
    by_sink: Dict[Any, List[Tuple[QueuedInputs, int]]] = {}
    start = 0
    for run in batch:
        sink = run.job.sink
        runs = by_sink.get(sink)
        if runs is None:
            runs = by_sink[sink] = []
        runs.append((run, start))
        start += len(run.indices)
    for sink, runs in by_sink.items():
        deliver = getattr(sink, "deliver_rows", None)
        if deliver is not None:
            deliver(runs, rows)
            continue
        try:
            sink.call_soon_threadsafe(_settle_rows, runs, rows)
        except RuntimeError:  # the loop is closed: nobody is waiting for these any more
            pass


def failed_rows(size: int, reason: str) -> BatchRows:
    """A batch of ``size`` positions that all failed for one reason."""
    error = ItemError(reason)
    return BatchRows(None, None, dict.fromkeys(range(size), error))
