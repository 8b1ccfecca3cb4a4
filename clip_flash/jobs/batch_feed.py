"""The input side of a pipeline run: shards cut into batches, each batch's inputs prepared on the CPU ahead of the
device.

A reader thread walks the shards and hands each batch to a pool of decoding threads (the CPU half of image
preparation, ``ImagePreprocessor.decode``, and tokenization); the batches, with the shards' start and end marks, go
into a bounded queue that the launching thread takes them from in order. The queue's bound keeps memory bounded:
at most that many decoded batches wait for the device.

A feed needs the preparer and the tokenizer, not the model, so a job can start it before its model has loaded
(:mod:`.feed_ahead`) and hand it to the run, whose first batches are then decoded already.
"""
from __future__ import annotations

import queue
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable, List, Optional, Tuple

import torch

from .batches import ItemBatch, shard_batches
from .sources import Shard

DONE = object()
FLUSH = object()  # the shard stream has nothing for now: finish what is in flight (see ``EmbeddingPipeline.run``)


@dataclass
class Batch:
    shard: Shard
    items: ItemBatch                  # the inputs that go to the preparers (no known errors)
    decoded: "Future"                 # -> (decoded images or None, tokens or None)


@dataclass
class ShardStart:
    shard: Shard


@dataclass
class ShardEnd:
    shard: Shard
    failures: List[Tuple[str, str]]   # items known bad before decoding (missing caption, bad tar...)


def decode_batch(image_preparer: Any, tokenizer: Optional[Callable], pin_tokens: bool,
                 items: ItemBatch) -> Tuple[Any, Optional[torch.Tensor]]:
    """One batch's CPU half: its images decoded by ``image_preparer`` and its captions tokenized (in page-locked
    memory where ``pin_tokens``), either None where the job has none."""
    decoded = image_preparer.decode(items.images) if image_preparer is not None else None
    tokens = None
    if tokenizer is not None:
        tokens = tokenizer(items.captions)
        if pin_tokens:
            tokens = tokens.pin_memory()
    return decoded, tokens


class BatchFeed:
    """``shards`` in batches of ``batch_size``, each decoded by ``decode(items)`` on one of ``decode_threads``
    threads, at most ``prefetch_batches`` waiting in the queue. ``shards`` may be a stream fed while the run goes
    on (a None in it becomes :data:`FLUSH`). :meth:`get` returns, in order, :class:`ShardStart`, :class:`Batch`
    (its ``decoded`` future), :class:`ShardEnd`, :data:`FLUSH`, then :data:`DONE`, or the exception the reader
    met. :meth:`close` stops it (a batch being decoded finishes; the rest are dropped)."""

    def __init__(self, shards: Iterable[Optional[Shard]], batch_size: int, decode: Callable[[ItemBatch], Any],
                 decode_threads: int, prefetch_batches: int) -> None:
        self.shards = shards
        self.batch_size = batch_size
        self._decode = decode
        self._queue: "queue.Queue" = queue.Queue(maxsize=prefetch_batches)
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max(1, decode_threads), thread_name_prefix="clip_flash-decode")
        self._reader = threading.Thread(target=self._read, daemon=True, name="clip_flash-reader")
        self._started = False

    def start(self) -> "BatchFeed":
        if not self._started:
            self._started = True
            self._reader.start()
        return self

    def get(self) -> Any:
        """The next entry (waits for the reader; not for the batch's decoding: see :class:`Batch`)."""
        return self._queue.get()

    def close(self) -> None:
        self._stop.set()
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self._started:
            self._reader.join(timeout=5)

    def _put(self, entry: Any) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(entry, timeout=0.2)
                return
            except queue.Full:
                continue

    def _read(self) -> None:
        try:
            for shard in self.shards:
                if shard is None:
                    self._put(FLUSH)
                    continue
                self._put(ShardStart(shard))
                known_failures: List[Tuple[str, str]] = []
                for batch, failures in shard_batches(shard, self.batch_size):
                    if self._stop.is_set():
                        return
                    known_failures.extend(failures)
                    if batch is not None:
                        self._put(Batch(shard, batch, self._pool.submit(self._decode, batch)))
                self._put(ShardEnd(shard, known_failures))
            self._put(DONE)
        except BaseException as error:  # noqa: BLE001 - handed to the launching thread, which re-raises it
            self._put(error)
