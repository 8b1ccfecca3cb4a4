"""One CUDA-event timing, for the library's one-time calibrations (which kernel variant a shape runs)."""
from __future__ import annotations

from typing import Callable, Optional

import torch


def median_cuda_ms(function: Callable[[], object], repeats: int = 10, each_alone: bool = False,
                   device: Optional[torch.device] = None) -> float:
    """Median CUDA-event milliseconds of ``function()`` over ``repeats`` calls, after one untimed call.

    ``each_alone``: the device idles before every timed call (what one call costs on its own, as a server's
    replay often runs), instead of the calls queuing back to back. ``device``: the one synchronized (default
    the current one)."""
    function()  # compile / autotune / warm caches outside the timing
    torch.cuda.synchronize(device)
    times = []
    for _ in range(repeats):
        if each_alone:
            torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        function()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]
