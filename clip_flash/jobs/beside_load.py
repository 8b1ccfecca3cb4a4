"""Work a job does in a thread of its own while its model loads: none of it needs the model, so it overlaps the
load instead of following it (the page-locked blocks of the first batches, nvJPEG's first calls, the inputs'
checks and tokenizer, the device's first uses on stand-ins)."""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Callable, Optional, Tuple, TypeVar

_Work = TypeVar("_Work", bound="BesideModelLoad")
_Loaded = TypeVar("_Loaded")


class BesideModelLoad:
    """``start()`` before the model load, ``join()`` before what needs the work. A subclass does the work in
    ``_work``; an exception there goes to ``_failed`` (logged there, never raised: the job does the same work
    later without it); ``_finished`` runs after it either way, with ``seconds`` set to how long it took.

    The work must draw nothing from torch's random number generator: the load beside it seeds it and draws a
    random-init model's weights from it, so a draw here would change those weights."""

    thread_name = "clip_flash-beside-load"

    def __init__(self) -> None:
        self.seconds = 0.0
        self._thread = threading.Thread(target=self._run, daemon=True, name=self.thread_name)

    def start(self: _Work) -> _Work:
        self._thread.start()
        return self

    def join(self) -> None:
        self._thread.join()

    def _run(self) -> None:
        started = time.perf_counter()
        try:
            self._work()
        except Exception as error:  # noqa: BLE001 - an optimisation: the job does this work later without it
            self._failed(error)
        finally:
            self.seconds = time.perf_counter() - started
            self._finished()

    def _work(self) -> None:
        raise NotImplementedError

    def _failed(self, error: Exception) -> None:
        raise NotImplementedError

    def _finished(self) -> None:
        """After the work, done or failed (a log line, say)."""


def load_beside(load: Callable[[], _Loaded], work_here: Optional[Callable[[], None]]) -> Tuple[_Loaded, float]:
    """``load()`` on a thread of its own while ``work_here()`` runs on the calling thread: work whose effect stays
    with the thread that made it (the device's first uses, which the thread launching the run's batches must make
    itself; see :mod:`.device_ahead`). Returns what ``load`` returned (raises what it raised) and when it finished
    (``time.perf_counter()``): the run may start later, once ``work_here`` is done too. Without ``work_here``,
    ``load()`` on this thread."""
    if work_here is None:
        loaded = load()
        return loaded, time.perf_counter()
    result: "Future[Tuple[_Loaded, float]]" = Future()

    def run() -> None:
        try:
            loaded = load()
            result.set_result((loaded, time.perf_counter()))
        except BaseException as error:  # noqa: BLE001 - raised by load_beside in the caller's thread
            result.set_exception(error)

    threading.Thread(target=run, daemon=True, name="clip_flash-model-load").start()
    work_here()
    return result.result()
