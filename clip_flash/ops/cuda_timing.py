"""One CUDA-event timing, for the library's one-time calibrations (which kernel variant a shape runs)."""
from __future__ import annotations

from typing import Callable

import torch


def median_cuda_ms(function: Callable[[], object], repeats: int = 10) -> float:
    """Median CUDA-event milliseconds of ``function()`` over ``repeats`` calls, after one untimed call."""
    function()  # compile / autotune / warm caches outside the timing
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        function()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]
