"""Honest timing of a stock and a patched callable on the same inputs.

Rules this module follows (and why):
- both callables are warmed up before anything is timed (first calls pay for allocator growth,
  cuBLAS/cuDNN heuristics, lazy initialisation and, for clip_flash, possibly graph capture);
- stock and patched run in alternating blocks, in ABBA order, so clock boosts, thermal drift and
  other processes hit both sides alike;
- on CUDA each call is bracketed by CUDA events on the current stream and the device is
  synchronized at the end of every block, so queued-but-unfinished work is never missed; on CPU
  calls are synchronous and ``time.perf_counter`` is used.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple, TypeVar

import torch

from clip_flash.ops.cuda_timing import median_cuda_ms

EncodeFn = Callable[[], torch.Tensor]
Result = TypeVar("Result")

# At most this many consecutive calls of one side before switching to the other: short enough that
# drift is shared, long enough that CPU launch work can overlap GPU work as it does in real use.
MAX_BLOCK_CALLS = 10


def synchronize(device: torch.device) -> None:
    """Wait for all queued work on ``device`` (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def back_to_back_ms(function: Callable[[], object], calls: int, rounds: int = 5) -> float:
    """Milliseconds a call of ``function`` when ``calls`` of them are queued back to back (the median over
    ``rounds``): the device's time a call where the host keeps ahead, else the host's."""
    def queued() -> None:
        for _ in range(calls):
            function()

    return median_cuda_ms(queued, rounds) / calls


@dataclass
class PairTiming:
    """Per-call wall times, in seconds, of the stock and patched callables."""

    stock_seconds: List[float] = field(default_factory=list)
    patched_seconds: List[float] = field(default_factory=list)

    @property
    def stock_total(self) -> float:
        """Total seconds of all stock calls (the published table's ``baseline(s)``)."""
        return math.fsum(self.stock_seconds)

    @property
    def patched_total(self) -> float:
        """Total seconds of all patched calls (the published table's ``flash_attn(s)``)."""
        return math.fsum(self.patched_seconds)

    @property
    def stock_median(self) -> float:
        """Median seconds per stock call."""
        return statistics.median(self.stock_seconds)

    @property
    def patched_median(self) -> float:
        """Median seconds per patched call."""
        return statistics.median(self.patched_seconds)


def block_size_for(times: int) -> int:
    """Calls per block so that ``times`` calls are split into about ten alternating blocks."""
    return max(1, min(MAX_BLOCK_CALLS, times // 10))


def _time_block(fn: EncodeFn, calls: int, device: torch.device) -> List[float]:
    """Seconds for each of ``calls`` back-to-back calls of ``fn``, synchronized at the end."""
    if device.type == "cuda":
        stream = torch.cuda.current_stream(device)
        events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(calls)
        ]
        for start, end in events:
            start.record(stream)
            fn()
            end.record(stream)
        synchronize(device)
        return [start.elapsed_time(end) / 1000.0 for start, end in events]
    seconds = []
    for _ in range(calls):
        began = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - began)
    return seconds


def time_alternating(
    stock: EncodeFn, patched: EncodeFn, times: int, device: torch.device
) -> PairTiming:
    """Time ``times`` calls of each callable, alternating blocks of calls in ABBA order.

    Call :func:`warm_up` first; this function only measures.
    """
    if times < 1:
        raise ValueError(f"times must be at least 1, got {times}")
    result = PairTiming()
    block = block_size_for(times)
    done = 0
    round_index = 0
    synchronize(device)
    while done < times:
        calls = min(block, times - done)
        # ABBA: even rounds start with stock, odd rounds with patched.
        order = ("stock", "patched") if round_index % 2 == 0 else ("patched", "stock")
        for side in order:
            if side == "stock":
                result.stock_seconds += _time_block(stock, calls, device)
            else:
                result.patched_seconds += _time_block(patched, calls, device)
        done += calls
        round_index += 1
    return result


def warm_up(stock: EncodeFn, patched: EncodeFn, calls: int, device: torch.device) -> None:
    """Run both callables ``calls`` times each, alternating, and wait for the device."""
    for _ in range(calls):
        stock()
        patched()
    synchronize(device)


def call_with_peak_memory(fn: EncodeFn, device: torch.device) -> Tuple[torch.Tensor, Optional[int]]:
    """Run ``fn`` once; return its output and the peak bytes it allocated above what was resident.

    Resident memory (both models' weights, the inputs) is subtracted so stock and patched are compared
    on what one call needs. Returns ``None`` for the peak on devices without allocator statistics.
    """
    if device.type != "cuda":
        return fn(), None
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    resident = torch.cuda.memory_allocated(device)
    output = fn()
    synchronize(device)
    return output, torch.cuda.max_memory_allocated(device) - resident


def latency_closed_loop(
    stock: EncodeFn, patched: EncodeFn, requests: int, device: torch.device
) -> PairTiming:
    """Closed loop: each request waits for its result before the next one starts.

    Requests alternate stock/patched (ABBA) so both see the same conditions. Each request is timed
    with ``perf_counter`` around the call and a device synchronize: the latency a caller observes,
    including Python and kernel-launch time.
    """
    result = PairTiming()
    synchronize(device)
    sides = ((stock, result.stock_seconds), (patched, result.patched_seconds))
    for index in range(requests):
        for fn, seconds in sides if index % 2 == 0 else reversed(sides):
            began = time.perf_counter()
            fn()
            synchronize(device)
            seconds.append(time.perf_counter() - began)
    return result


def timed_call(fn: Callable[[], Result], device: torch.device) -> Tuple[Result, float]:
    """Run ``fn`` once, synchronized before and after; return its result and the wall seconds."""
    synchronize(device)
    began = time.perf_counter()
    result = fn()
    synchronize(device)
    return result, time.perf_counter() - began


def percentile(values: List[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation between closest ranks."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


# -- microbenchmarks of single kernels (scripts/bench_*.py) -------------------------------------------------------

def alternating_median_ms(paths: Dict[str, Callable[[], object]], repeats: int, blocks: int = 3) -> Dict[str, float]:
    """Per path, the median over ``blocks`` of ``median_cuda_ms(path, repeats)``, the paths alternating block by
    block so clock and cache drift treat every path alike (the microbenchmark scripts' timing rule; the
    library's own one-time calibrations use ``median_cuda_ms``)."""
    timed: Dict[str, list] = {path: [] for path in paths}
    for _ in range(blocks):
        for path, function in paths.items():
            timed[path].append(median_cuda_ms(function, repeats))
    return {path: sorted(values)[len(values) // 2] for path, values in timed.items()}


def graph_ms_per_call(function: Callable[[], object], calls: int, repeats: int) -> float:
    """Median device milliseconds of one call, from a CUDA graph of ``calls`` back-to-back calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            function()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            function()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    del graph
    return statistics.median(times)
