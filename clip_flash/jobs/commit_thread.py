"""The job's commit thread: finished shards are committed (written to the output folder) in a thread of their own,
in the order handed over, while the main thread embeds the next ones. A commit's error surfaces in the main thread
at its next hand-over (the shards handed after it are drained, not committed)."""
from __future__ import annotations

import queue
import threading
from typing import Any, Callable, List, Optional

from .batch_feed import DONE


class CommitThread:
    """``commit(result)`` for each result handed over, in order, in one daemon thread; at most ``depth`` wait."""

    def __init__(self, commit: Callable[[Any], None], depth: int = 2):
        self._commit = commit
        self._finished: "queue.Queue" = queue.Queue(maxsize=depth)
        self._errors: List[BaseException] = []
        self._ended = threading.Event()
        threading.Thread(target=self._loop, daemon=True, name="clip_flash-writer").start()

    def check(self) -> None:
        """Raise the first commit's error, if one failed."""
        if self._errors:
            raise self._errors[0]

    def hand(self, result: Any) -> None:
        """Queue ``result`` for its commit (waits while ``depth`` results already wait)."""
        self._finished.put(result)

    def stop(self) -> None:
        """Commit what was handed over, then end the thread (see :func:`stop_writer`)."""
        stop_writer(self._finished, self._ended)

    def _loop(self) -> None:
        try:
            while True:
                result = self._finished.get()
                if result is DONE:
                    return
                if self._errors:
                    continue  # drain: the main thread stops at its next hand-over
                try:
                    self._commit(result)
                except BaseException as error:  # noqa: BLE001 - re-raised in the main thread
                    self._errors.append(error)
        finally:
            self._ended.set()


def stop_writer(finished: "queue.Queue", ended: threading.Event) -> None:
    """Hand the writer thread its end and wait until it has committed what it was given (``ended``: set as it
    returns). A Ctrl-C or SIGTERM arriving meanwhile (as the last shards are written) waits for that too, then goes
    on: what the stop message then counts is what the folder keeps, and nothing is written after it. A second one
    stops waiting (a commit cut short leaves no done marker: that shard is embedded again on resume). An event, not
    ``Thread.join``: on Python 3.11 a join cut short by an interrupt marks a running thread stopped."""
    interrupted: Optional[BaseException] = None
    handed = False
    while True:
        try:
            if not handed:
                finished.put(DONE)
                handed = True
            ended.wait()
            break
        except KeyboardInterrupt as error:
            if interrupted is not None:
                raise
            interrupted = error
    if interrupted is not None:
        raise interrupted
