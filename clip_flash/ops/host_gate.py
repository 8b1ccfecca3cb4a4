"""A CUDA stream that waits for the host: work queued now, started when the CPU says its input is written.

    gate = HostGate.create(device)        # None where it cannot run (no CUDA device, no compiled extension)
    ticket = gate.next_ticket()
    gate.wait(ticket)                      # on the current stream: what is queued behind it waits
    ...                                    # queue copies from page-locked buffers the CPU is still writing
    gate.open(ticket)                      # once they are written (always, in a ``finally``)

``gate.opener(ticket)`` is what native code opens it with (the batch decoder does, the moment its buffers are
written, before taking the GIL back).

Why: a lone request's image preparation and encoder cost the host about a millisecond of launches after the
CPU has decoded the image (``benchmarks/results/h100/handoffs_c49810a``); queued behind a gate while the CPU still
decodes, they overlap the decode instead of following it (the server's median at 50 one-JPEG requests/s on an H200:
4.50 -> 4.36 ms, ``benchmarks/results/h200/early_launch_2aeb8b5``; the launches there outlast the decode).

The wait is a one-thread kernel (``csrc/host_gate.cu``) polling a counter in page-locked host memory. Tickets
only grow and the counter only rises, so a gate opened before its wait is queued lets it through at once, and
opening a ticket opens every earlier one. A gate never opened lets its stream go after ``timeout`` seconds, so a
host error cannot hold the device for good; ``timed_out(ticket)``, read once the work behind the wait has run,
then says so, and whoever queued that work must not use its results.

Open a gate from another thread than the one queuing work behind it, and without needing the GIL that thread may
hold: while the gate is closed, a CUDA call that must wait for the device (loading a kernel on its first launch,
under CUDA's lazy loading; freeing device memory) waits for the gate too, holding its thread (and the GIL).
"""
from __future__ import annotations

import threading
from typing import Optional, Tuple

import torch

from ._extension import load_extension

DEFAULT_TIMEOUT = 10.0  # seconds


class HostGate:
    """One counter in page-locked memory and the tickets handed out against it, for one CUDA device."""

    def __init__(self, device: torch.device, timeout: float = DEFAULT_TIMEOUT) -> None:
        extension = load_extension()
        if extension is None or not hasattr(extension, "host_gate_device_address"):
            raise RuntimeError("the host gate needs the compiled extension clip_flash._C")
        if device.type != "cuda":
            raise ValueError(f"the host gate needs a CUDA device, got {device}")
        self.device = torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())
        self.timeout = timeout
        self._extension = extension
        # [0]: the highest ticket opened; [1]: the highest whose wait timed out (written by the device).
        self._counter = torch.zeros(2, dtype=torch.int64, pin_memory=True)
        # Where the device reads it, resolved once (raises RuntimeError if it cannot): checked and looked up on each
        # wait, it cost the launch thread tens of microseconds more on a core that idled
        # (benchmarks/results/h200/launch_chain_2eae52c).
        self._device_address = extension.host_gate_device_address(self._counter, self.device.index)
        self._lock = threading.Lock()
        self._issued = 0

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
        why = self._extension.host_gate_wait(self._device_address, ticket, int(self.timeout * 1e9), self.device.index)
        if why:
            raise RuntimeError(f"host gate: {why}")

    def open(self, ticket: int) -> None:
        """Let through the waits for ``ticket`` and every earlier one; ordered after this thread's writes."""
        self._extension.host_gate_open(self._counter, ticket)

    def timed_out(self, ticket: int) -> bool:
        """Whether the wait for ``ticket`` gave up before the gate opened (read after the work behind it has run,
        e.g. after synchronizing with an event recorded behind it): its results are then not to be used."""
        return int(self._counter[1]) >= ticket

    def opener(self, ticket: int) -> Tuple[torch.Tensor, int]:
        """``(counter, ticket)``: what native code opens ``ticket`` with (``NativeBatchDecoder.decode(opens=...)``)."""
        return self._counter, ticket
