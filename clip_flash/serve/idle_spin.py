"""Waiting for the next batch by polling for a while before sleeping, for the serving threads on a lone request's
path (a tower's collect and launch threads).

Why: a thread that slept wakes on a core that idled, and runs its next steps 1.2-1.8x slower than one that kept
its core busy (the image preparation's launches 0.36-0.39 ms asleep against 0.22 spinning, the encoder's call
0.52-0.55 against 0.34: ``benchmarks/results/h200/idle_cores_a64cfa3``); at low load every request meets threads
that slept. A ``Bell`` is a counter the producer rings after handing work over and the consumer polls without the
GIL (``clip_flash._C.host_bell_wait``) for at most ``spin`` seconds after its last piece of work; past that it
sleeps on the usual lock, so an idle server polls nothing. The cost: while work comes at least every ``spin``
seconds, each polling thread keeps a core busy.
"""
from __future__ import annotations

import queue
from typing import Any, Optional

import torch

from ..ops._extension import load_extension


class Bell:
    """A counter in host memory: ``ring`` adds one, ``wait(seen)`` polls until it differs from ``seen``."""

    def __init__(self, spin: float, extension: Any) -> None:
        self.spin = spin
        self._spin_ns = int(spin * 1e9)
        self._counter = torch.zeros(1, dtype=torch.int64)
        self._ring = extension.host_bell_ring
        self._count = extension.host_bell_count
        self._wait = extension.host_bell_wait

    @classmethod
    def create(cls, spin: float) -> Optional["Bell"]:
        """A bell polled for ``spin`` seconds, or None where there is none to poll (``spin`` 0, or no compiled
        extension): waiters then sleep at once, as without one."""
        if spin <= 0:
            return None
        extension = load_extension()
        if extension is None or not hasattr(extension, "host_bell_wait"):
            return None
        return cls(spin, extension)

    def count(self) -> int:
        """How many times it was rung: read before looking for work, passed to ``wait``."""
        return self._count(self._counter)

    def ring(self) -> None:
        """After handing work over (ordered after this thread's writes)."""
        self._ring(self._counter)

    def wait(self, seen: int) -> bool:
        """Poll, without the GIL, until rung past ``seen`` (True) or ``spin`` seconds passed (False)."""
        return self._wait(self._counter, seen, self._spin_ns)


class SpinningQueue(queue.Queue):
    """A ``queue.Queue`` whose blocking ``get`` polls ``bell`` before it sleeps; ``put`` rings it. Without a bell,
    a plain queue."""

    def __init__(self, maxsize: int = 0, bell: Optional[Bell] = None) -> None:
        super().__init__(maxsize)
        self.bell = bell

    def put(self, item: Any, block: bool = True, timeout: Optional[float] = None) -> None:
        super().put(item, block, timeout)
        if self.bell is not None:
            self.bell.ring()

    def get(self, block: bool = True, timeout: Optional[float] = None) -> Any:
        bell = self.bell
        if bell is not None and block and timeout is None:
            seen = bell.count()  # before looking: a put after this look rings past it
            try:
                return super().get(False)
            except queue.Empty:
                pass
            if bell.wait(seen):
                try:
                    return super().get(False)
                except queue.Empty:  # another getter took it
                    pass
        return super().get(block, timeout)
