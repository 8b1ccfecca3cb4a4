"""What travels between the HTTP side and the engine: one ``EmbeddingJob`` per request, one ``Item`` per input.

The engine's threads never touch a job's fields directly: results go back to the job's event loop with one
``call_soon_threadsafe`` per batch (``deliver_batch``), so a job is only ever changed on its loop's thread.
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
    """One batch's results as one matrix: row ``p`` of ``both`` (float32, on the CPU) holds position ``p``'s raw
    features then its L2-normalised ones, ``width`` columns each; a position in ``errors`` has no row. Rows are
    handed on by position, so results for hundreds of inputs cost one copy per destination, not an object each.
    """

    __slots__ = ("both", "width", "tokens", "errors")

    def __init__(self, both: Any, width: int, tokens: Optional[Sequence[int]], errors: Dict[int, ItemError]) -> None:
        self.both = both
        self.width = width
        self.tokens = tokens  # captions' token counts by position (None: images, no tokens)
        self.errors = errors

    def result(self, position: int) -> Result:
        error = self.errors.get(position)
        if error is not None:
            return error
        row = self.both[position]
        return Embedded(row[:self.width], row[self.width:], self.tokens[position] if self.tokens is not None else 0)


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
        """Where ``deliver_batch`` sends this job's results: its event loop."""
        return self.loop

    def settle(self, index: int, result: Result) -> None:
        """Record one result (on the loop's thread)."""
        if self.results[index] is None:
            self.results[index] = result
            self.pending -= 1
            if self.pending == 0 and not self.future.done():
                self.future.set_result(None)


class Item:
    """One input of a job, queued for one tower. ``state`` moves QUEUED -> TAKEN (into a batch) or -> DROPPED,
    under the engine's queue lock, so the queue depth counts each item exactly once."""

    __slots__ = ("job", "index", "payload", "state", "enqueued")

    def __init__(self, job: EmbeddingJob, index: int, payload: Any) -> None:
        self.job = job
        self.index = index
        self.payload = payload  # bytes (an encoded image); str (a caption) or its token ids (``wire.token_bytes``)
        self.state = QUEUED
        self.enqueued = 0.0


def _settle_many(pairs: Sequence[Tuple[Item, Result]]) -> None:
    for item, result in pairs:
        item.job.settle(item.index, result)


def _settle_rows(items: Sequence["Item"], positions: Sequence[int], rows: BatchRows) -> None:
    for position in positions:
        item = items[position]
        item.job.settle(item.index, rows.result(position))


def deliver_rows(items: Sequence["Item"], rows: BatchRows) -> None:
    """Hand a batch's results (``items[p]``'s is position ``p`` of ``rows``) to their jobs' sinks, from any
    thread: one hand-off per sink and batch. A sink with ``deliver_rows(items, positions, rows)`` (the engine
    process's connection to a frontend) takes its positions at once; an event loop settles them on its thread."""
    by_sink: Dict[Any, List[int]] = {}
    for position, item in enumerate(items):
        sink = item.job.sink
        positions = by_sink.get(sink)
        if positions is None:
            positions = by_sink[sink] = []
        positions.append(position)
    for sink, positions in by_sink.items():
        deliver = getattr(sink, "deliver_rows", None)
        if deliver is not None:
            deliver(items, positions, rows)
            continue
        try:
            sink.call_soon_threadsafe(_settle_rows, items, positions, rows)
        except RuntimeError:  # the loop is closed: nobody is waiting for these any more
            pass


def deliver_batch(pairs: Sequence[Tuple[Item, Result]]) -> None:
    """Hand results to their jobs' sinks (from any thread): one hand-off per sink and batch, not per item. A
    sink is an event loop (``EmbeddingJob``), or an object with ``deliver_results(pairs)`` (the engine
    process's connection to a frontend, which sends the batch's rows there in one message)."""
    by_sink: Dict[Any, List[Tuple[Item, Result]]] = {}
    for pair in pairs:
        by_sink.setdefault(pair[0].job.sink, []).append(pair)
    for sink, group in by_sink.items():
        deliver = getattr(sink, "deliver_results", None)
        if deliver is not None:
            deliver(group)
            continue
        try:
            sink.call_soon_threadsafe(_settle_many, group)
        except RuntimeError:  # the loop is closed: nobody is waiting for these any more
            pass
