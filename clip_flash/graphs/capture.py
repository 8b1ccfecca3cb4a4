"""CUDA-graph capture machinery: the graph key, the stream and memory pool graphs are captured into, replay,
and recovery from a failed capture.

Memory. All graphs share one memory pool (``torch.cuda.graph_pool_handle()``). Every graph keeps its static
input and output alive for its lifetime and only its intermediates are freed back to the pool, and replays
are serialized on one stream, so the graphs may replay in any order. ``capture_all()`` captures the largest
graphs first (images, then text, largest batch and length first), so the pool is sized by the largest
graph's intermediates and smaller captures reuse it. ``max_graphs`` bounds how many graphs an encoder holds
(new input shapes or dtypes past it run eager). ``stats()`` reports capture time per graph, the pool's
segments (exact, from the allocator's snapshot of that pool) plus the static inputs, and the
``memory_allocated``/``memory_reserved`` deltas measured around each capture.

A capture that fails (a tower or backend that syncs the host, for instance) is cleaned up in PyTorch's device
allocator (``_cuda_endAllocateToPool``/``_cuda_releasePool``); the pinned-host allocator's bookkeeping cannot be
from Python, so later captures go to a new pool while earlier graphs keep replaying from theirs.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Tuple, Union

import torch
import torch.nn.functional as F

from ..backends.measured import choosing_for_replay
from ..ops._extension import load_extension

# CUDA allows one capture at a time per process in practice (torch.cuda.graph shares one default capture
# stream, and capture_begin/end drive shared allocator state); encoders of different models share this lock.
_CAPTURE_LOCK = threading.Lock()

Pool = Tuple[int, int]


@dataclass(frozen=True)
class GraphKey:
    """What one graph was captured for: a tower, a batch bucket, the per-row input shape and dtype, and for text
    the sequence length the graph computes (a length bucket, or the token width when padding is not skipped)."""

    tower: str  # "image" or "text"
    batch: int
    row_shape: Tuple[int, ...]  # image: (3, H, W); text: (token width,)
    dtype: torch.dtype
    length: Optional[int] = None  # text only

    @property
    def input_shape(self) -> Tuple[int, ...]:
        """The static input buffer's shape."""
        return (self.batch, *self.row_shape)

    def describe(self) -> str:
        dtype = str(self.dtype).replace("torch.", "")
        if self.tower == "image":
            return f"image b{self.batch} {'x'.join(map(str, self.row_shape))} {dtype}"
        return f"text b{self.batch} L{self.length}/{self.row_shape[0]} {dtype}"


@dataclass
class CapturedGraph:
    graph: "torch.cuda.CUDAGraph"
    static_input: torch.Tensor
    static_output: torch.Tensor
    seconds: float  # warm-up and capture
    allocated_delta: int  # torch.cuda.memory_allocated delta around the capture
    reserved_delta: int  # torch.cuda.memory_reserved delta around the capture
    # How it replays: None until its first replay, then True where the extension replays it in one call (its
    # replay through torch left the CUDA generator's offset as it was: the graph draws no random numbers), False
    # where torch's replay does (it draws some, or the extension cannot).
    one_call: Optional[bool] = None
    graph_exec: int = 0  # its cudaGraphExec_t, for the one-call replay


@dataclass
class CaptureSpace:
    """The stream graphs are captured and replayed on, and the memory pool(s) they live in."""

    device: torch.device
    stream: "torch.cuda.Stream"
    pool: Pool = field(default_factory=torch.cuda.graph_pool_handle)  # where the next capture goes
    retired_pools: List[Pool] = field(default_factory=list)  # pools a failed capture left unusable
    reserved_delta: int = 0  # torch.cuda.memory_reserved delta summed over the captures

    def pools(self) -> List[Pool]:
        """Every pool the graphs live in: the current one and any retired by a failed capture."""
        return self.retired_pools + [self.pool]

    def capture(self, key: GraphKey, function: Callable[[torch.Tensor], torch.Tensor], warmup_iters: int,
                first_input: Optional[torch.Tensor] = None) -> Union[CapturedGraph, str]:
        """Warm up, then capture ``function`` of a static input (zeros, or ``first_input``'s values where the
        warm-up needs a valid one) into the pool (call in inference mode). Both
        choose attention kernels as a replay is paid (``choosing_for_replay``), so the capture records kernels the
        warm-up has already run.

        Errors from the warm-up are the model's own (eager would raise them too) and propagate; an error in the
        capture itself is returned as the reason the key must run eager.
        """
        device, stream = self.device, self.stream
        with _CAPTURE_LOCK, torch.cuda.device(device), torch.autocast("cuda", enabled=False), choosing_for_replay():
            started = time.perf_counter()
            static_input = torch.zeros(key.input_shape, dtype=key.dtype, device=device)
            if first_input is not None:
                static_input.copy_(first_input)
            caller = torch.cuda.current_stream(device)
            stream.wait_stream(caller)
            with torch.cuda.stream(stream):
                for _ in range(warmup_iters):
                    function(static_input)
            allocated, reserved = torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
            graph = torch.cuda.CUDAGraph()
            try:
                # The outer stream context restores the caller's stream even when capture_end raises, which
                # torch.cuda.graph's own __exit__ then skips.
                with torch.cuda.stream(stream):
                    with torch.cuda.graph(graph, pool=self.pool, stream=stream, capture_error_mode="thread_local"):
                        static_output = function(static_input)
                if not isinstance(static_output, torch.Tensor):
                    raise TypeError(f"the captured function returned {type(static_output).__name__}, not a tensor")
            except Exception as error:  # noqa: BLE001 - any capture failure means: run this key eager
                if not _recover_failed_capture(graph, device, self.pool):
                    # Graphs already captured keep replaying from the old pool; later captures use a new one.
                    self.retired_pools.append(self.pool)
                    self.pool = torch.cuda.graph_pool_handle()
                message = str(error).strip().splitlines()[0] if str(error).strip() else ""
                return f"CUDA-graph capture of {key.describe()} failed ({type(error).__name__}: {message[:200]})"
            caller.wait_stream(stream)
            grown = torch.cuda.memory_reserved(device) - reserved
            self.reserved_delta += grown
            return CapturedGraph(graph, static_input, static_output, time.perf_counter() - started,
                                 torch.cuda.memory_allocated(device) - allocated, grown)

    def replay(self, captured: CapturedGraph, x: torch.Tensor, n: int, normalize: bool,
               out_rows: Optional[int] = None) -> torch.Tensor:
        """Copy ``n`` input rows in, replay, copy ``out_rows`` (default ``n``) output rows out, on this stream (caller
        holds the encoder's lock, in inference mode).

        After a graph's first replay the extension's ``replay_graph`` makes these steps in one call (a lone request's
        replay is on its critical path), for graphs that draw no random numbers; the steps below are its reference."""
        rows = n if out_rows is None else out_rows
        if x.device.type == "cpu":
            x = _staged(x)
        if captured.one_call:
            return one_call_extension().replay_graph(captured.graph_exec, self.stream.stream_id,
                                                     captured.static_input, x, n, captured.static_output, rows,
                                                     normalize)
        deciding = captured.one_call is None
        offset = _generator_offset(self.device) if deciding else None
        out = self._replay_steps(captured, x, n, rows, normalize)
        if deciding:
            one_call, captured.graph_exec = _one_call_for(captured, offset, _generator_offset(self.device))
            captured.one_call = one_call  # last: a reader that sees it sees the executable set
        return out

    def _replay_steps(self, captured: CapturedGraph, x: torch.Tensor, n: int, rows: int,
                      normalize: bool) -> torch.Tensor:
        stream = self.stream
        caller = torch.cuda.current_stream(self.device)
        static_output = captured.static_output
        # Allocated on the caller's stream, which waits for the copy-out below before any later use or reuse.
        out = torch.empty((rows, *static_output.shape[1:]), dtype=static_output.dtype, device=static_output.device)
        stream.wait_stream(caller)
        with torch.cuda.stream(stream):
            captured.static_input[:n].copy_(x, non_blocking=True)
            captured.graph.replay()
            if normalize:
                F.normalize(static_output[:rows], dim=-1, out=out)
            else:
                out.copy_(static_output[:rows])
        caller.wait_stream(stream)
        return out

    def pool_bytes(self, fallback: int) -> int:
        """Bytes of the pools' segments, from the allocator's snapshot of each pool alone."""
        return sum(_pool_bytes(pool, fallback) for pool in self.pools())


def _pool_bytes(pool: Optional[Pool], fallback: int) -> int:
    """Bytes of the private pool's segments, from the allocator's snapshot of that pool alone."""
    if pool is None:
        return 0
    try:
        segments = torch.cuda.memory_snapshot(mempool_id=pool, include_traces=False)
    except (RuntimeError, TypeError):  # an older PyTorch without per-pool snapshots
        return max(fallback, 0)
    return sum(segment["total_size"] for segment in segments)


def one_call_extension() -> Optional[Any]:
    """The extension where it has ``replay_graph``, else None."""
    extension = load_extension()
    return extension if extension is not None and hasattr(extension, "replay_graph") else None


def _generator_offset(device: torch.device) -> Optional[int]:
    """The device's default CUDA generator's offset (a host value: no sync), or None where it cannot be read."""
    try:
        index = device.index if device.index is not None else torch.cuda.current_device()
        return int(torch.cuda.default_generators[index].get_offset())
    except (AttributeError, IndexError, RuntimeError):
        return None


def _one_call_for(captured: CapturedGraph, offset_before: Optional[int],
                  offset_after: Optional[int]) -> Tuple[bool, int]:
    """(whether the extension may replay ``captured`` from now on, its cudaGraphExec_t), after a replay through
    torch that moved the generator's offset from ``offset_before`` to ``offset_after``. torch's replay advances the
    offset by what the graph draws (its prologue hands the graph fresh random numbers; the one call has none), so
    a graph it moved keeps torch's replay, as does one when another thread drew numbers in between."""
    if offset_before is None or offset_after != offset_before or one_call_extension() is None:
        return False, 0
    try:
        return True, int(captured.graph.raw_cuda_graph_exec())
    except (AttributeError, RuntimeError):  # an older PyTorch, or a graph kept without its executable
        return False, 0


def _staged(x: torch.Tensor) -> torch.Tensor:
    """A page-locked copy of host input ``x``, for a copy to the device that the host does not wait for.

    From pageable memory the driver stages the bytes itself and may wait for the stream to reach the copy
    (past its staging buffer), holding the host until the replays queued before it have run; from the caller's
    own page-locked memory the copy would read after this call returns, racing the caller's next write. This
    block comes from PyTorch's caching host allocator, which records the copy and hands the block out again
    only after it has run."""
    staged = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
    staged.copy_(x)
    return staged


def _recover_failed_capture(graph: "torch.cuda.CUDAGraph", device: torch.device, pool: Pool) -> bool:
    """Undo what a failed capture left in PyTorch's allocators; True when ``pool`` can take further captures.

    capture_begin routes the capture stream's device and pinned-host allocations to ``pool`` and takes a use of
    it; when the capture is invalidated (a host sync, say), capture_end raises before ending either routing and
    the graph never gives its use back. Left alone, the device allocator believes a capture is still underway
    (it then defers freeing memory used across streams) and the pool can never be freed. The device side can be
    undone from Python; the pinned-host allocator's routing cannot, and it refuses any later capture into the
    same pool ("beginAllocateToPool: already recording to mempool_id"), so such a pool is retired.
    """
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        torch._C._cuda_endAllocateToPool(index, pool)
    except RuntimeError:  # capture_end ended the routing itself
        try:
            graph.pool()
            return True  # the capture ended cleanly: dropping the graph object gives its use of the pool back
        except RuntimeError:  # ended the routing, then failed: the graph will not give its use back
            torch._C._cuda_releasePool(index, pool)
            return True
    torch._C._cuda_releasePool(index, pool)
    return False
