"""A CUDA stream that waits for the host: work queued now, started when the CPU says its input is written.

    gate = HostGate.create(device)        # None where it cannot run (no CUDA device, no compiled extension)
    ticket = gate.next_ticket()
    gate.wait(ticket)                      # on the current stream: what is queued behind it waits
    ...                                    # queue copies from page-locked buffers the CPU is still writing
    gate.open(ticket)                      # once they are written (always, in a ``finally``)

Why: a lone request's image preparation and encoder cost the host about a millisecond of launches after the
CPU has decoded the image (``benchmarks/results/h100/handoffs_c49810a``); queued behind a gate while the CPU
still decodes, they leave the request's critical path, and the device starts the moment the gate opens.

The wait is a one-thread kernel (``csrc/host_gate.cu``) polling a counter in page-locked host memory. Tickets
only grow and the counter only rises, so a gate opened before its wait is queued lets it through at once, and
opening a ticket opens every earlier one. A gate never opened lets its stream go after ``timeout`` seconds, so a
host error cannot hold the device for good; whoever queued that work must then not use its results.
"""
from __future__ import annotations

import threading
from typing import Optional

import torch

from ._extension import load_extension

DEFAULT_TIMEOUT = 10.0  # seconds


class HostGate:
    """One counter in page-locked memory and the tickets handed out against it, for one CUDA device."""

    def __init__(self, device: torch.device, timeout: float = DEFAULT_TIMEOUT) -> None:
        extension = load_extension()
        if extension is None or not hasattr(extension, "host_gate_wait"):
            raise RuntimeError("the host gate needs the compiled extension clip_flash._C")
        if device.type != "cuda":
            raise ValueError(f"the host gate needs a CUDA device, got {device}")
        self.device = torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())
        self.timeout = timeout
        self._extension = extension
        self._counter = torch.zeros(1, dtype=torch.int64, pin_memory=True)
        self._lock = threading.Lock()
        self._issued = 0
        self._opened = 0

    @classmethod
    def create(cls, device: Optional[torch.device], timeout: float = DEFAULT_TIMEOUT) -> Optional["HostGate"]:
        """A gate on ``device``, or None where it cannot run (not a CUDA device, no compiled extension)."""
        if device is None or device.type != "cuda" or not torch.cuda.is_available():
            return None
        try:
            return cls(device, timeout)
        except RuntimeError:
            return None

    def next_ticket(self) -> int:
        """A new ticket, above every one handed out before."""
        with self._lock:
            self._issued += 1
            return self._issued

    def wait(self, ticket: int) -> None:
        """Queue on the current stream a wait until ``ticket`` is opened (at most ``timeout`` seconds)."""
        why = self._extension.host_gate_wait(self._counter, ticket, int(self.timeout * 1e9), self.device.index)
        if why:
            raise RuntimeError(f"host gate: {why}")

    def open(self, ticket: int) -> None:
        """Let through the waits for ``ticket`` and every earlier one; ordered after this thread's writes."""
        with self._lock:
            if ticket <= self._opened:
                return
            self._opened = ticket
            self._extension.host_gate_open(self._counter, ticket)
