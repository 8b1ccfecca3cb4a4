"""One pipeline run kept open for shards handed in while it runs (a Ray actor's shards).

A Ray actor is handed one shard per call. Running each shard as a pipeline run of its own drains the device at
every shard's end and starts the next shard's decoding only after the last one is committed; with two calls
running at once on the actor, :class:`ShardStream` feeds both shards to one long run instead, so the next
shard's first batches decode while this one's last batches are on the device, as in the one-device job's run
over all its shards. Each call still returns when its own shard is committed.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

from .launch_thread import LaunchThread
from .sources import Shard
from .writer import ShardResult

logger = logging.getLogger(__name__)

_CLOSE = object()


@dataclass
class ShardReport:
    """What one committed shard gave: rows written, inputs that failed, seconds from handed in to committed."""

    index: int
    rows: int
    failures: int
    seconds: float


class _Run:
    """One pipeline run: its feed of shards, the shards waiting for their commit, and when it finished."""

    def __init__(self) -> None:
        self.feed: "queue.Queue[Any]" = queue.Queue()
        self.lock = threading.Lock()  # guards ``waiting`` and ``failed``
        self.waiting: Dict[int, Tuple[Future, float]] = {}
        self.failed = False
        self.finished: Optional[Future] = None  # done when the launch thread is done with the run

    def shards(self) -> Iterator[Optional[Shard]]:
        """The shards as they are handed in; None whenever none is waiting (the run then finishes what it holds)."""
        while True:
            try:
                shard = self.feed.get_nowait()
            except queue.Empty:
                yield None
                shard = self.feed.get()
            if shard is _CLOSE:
                return
            yield shard

    def fail(self, error: BaseException) -> None:
        """No more shards for this run; every shard it holds raises ``error``."""
        with self.lock:
            self.failed = True
            for future, _ in self.waiting.values():
                if not future.done():
                    future.set_exception(error)
            self.waiting.clear()
            while True:  # shards handed in and not read yet are not read at all
                try:
                    self.feed.get_nowait()
                except queue.Empty:
                    break
        self.feed.put(_CLOSE)


class ShardStream:
    """Embeds shards handed in from several threads in one pipeline run; :meth:`embed` returns when a shard is
    committed. ``runner`` is an :class:`~.pipeline.EmbeddingPipeline`, ``commit`` writes a finished shard.

    A failure inside the run (a writer or device error) fails every shard it holds; the next :meth:`embed` starts
    a new run, as the next call of a one-shard-per-run actor would. The runs are made one after another on
    ``launch_thread`` (a :class:`~.launch_thread.LaunchThread`: the one that made the device's first uses; by
    default one of the stream's own).
    """

    def __init__(self, runner: Any, commit: Callable[[ShardResult], None],
                 launch_thread: Optional[LaunchThread] = None) -> None:
        self.runner = runner
        self.commit = commit
        self.launch_thread = launch_thread or LaunchThread("clip_flash-shard-stream")
        self._lock = threading.Lock()  # one run at a time
        self._run: Optional[_Run] = None

    def embed(self, shard: Shard) -> ShardReport:
        """Hand ``shard`` to the run and wait until it is committed (raises what failed it)."""
        future: Future = Future()
        while True:
            with self._lock:
                run = self._running()
            with run.lock:
                if not run.failed:
                    run.waiting[shard.index] = (future, time.perf_counter())
                    run.feed.put(shard)
                    break
        return future.result()

    def close(self) -> None:
        """End the run once the shards handed in are committed."""
        with self._lock:
            run, self._run = self._run, None
        if run is not None and run.finished is not None:
            run.feed.put(_CLOSE)
            run.finished.result()

    def _running(self) -> _Run:
        """The open run, or a new one once the last has failed (the failed one's thread has finished first, so two
        runs never share the pipeline)."""
        run = self._run
        if run is not None and not run.failed:
            return run
        if run is not None and run.finished is not None:
            run.finished.result()
        run = self._run = _Run()
        run.finished = self.launch_thread.submit(self._serve, run)
        return run

    def _serve(self, run: _Run) -> None:
        def commit(result: ShardResult) -> None:
            with run.lock:
                future, handed = run.waiting.pop(result.index, (None, 0.0))
            if future is None:  # its caller was already told the run failed; committed all the same, once
                self.commit(result)
                return
            try:
                self.commit(result)
            except BaseException as error:
                run.fail(error)  # first, so a caller woken by this error finds the run failed; the pipeline raises
                future.set_exception(error)  # it too, at its next hand-over
                raise
            future.set_result(ShardReport(result.index, result.rows, len(result.failures),
                                          time.perf_counter() - handed))

        try:
            self.runner.run(run.shards(), commit, None, more_runs_follow=True)
        except BaseException as error:  # noqa: BLE001 - handed to every shard this run held
            logger.error("the pipeline run stopped: %s", error)
            run.fail(error)
