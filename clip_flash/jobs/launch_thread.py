"""One thread that makes all of a Ray actor's device calls, in the order handed to it.

Some of what the device's first calls make is kept per thread: PyTorch caches cuDNN's attention plans per thread
(see :mod:`.device_ahead`), so the stand-in's first uses help the run only if the thread that made them launches
the run's batches. An actor's calls come in on threads of Ray's; the stand-in's first uses, the warm-up and every
pipeline run are handed to this one thread instead.
"""
from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable


class LaunchThread:
    """A daemon thread running the calls :meth:`submit` hands it, one at a time, in order (a daemon, unlike a
    ``ThreadPoolExecutor``'s worker: a process leaving without :meth:`close` does not wait for it)."""

    def __init__(self, name: str = "clip_flash-launch") -> None:
        self._calls: "queue.Queue[Any]" = queue.Queue()
        self._thread = threading.Thread(target=self._serve, daemon=True, name=name)
        self._thread.start()

    def submit(self, call: Callable[..., Any], *args: Any) -> Future:
        """``call(*args)`` on the thread, after the calls handed in before it; its future."""
        future: Future = Future()
        self._calls.put((future, call, args))
        return future

    def close(self) -> None:
        """Stop once the calls handed in are done."""
        self._calls.put(None)
        self._thread.join()

    def _serve(self) -> None:
        while True:
            item = self._calls.get()
            if item is None:
                return
            future, call, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(call(*args))
            except BaseException as error:  # noqa: BLE001 - raised by the future's result() in the caller's thread
                future.set_exception(error)
