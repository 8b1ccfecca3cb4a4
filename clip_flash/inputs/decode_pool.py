"""Run the CPU step (:func:`decode_item`) over many inputs: a thread pool, or a process pool.

Threads suit torchvision's decoders, which release the GIL; what is left under the GIL (Pillow's
header parsing, Python bookkeeping) caps a thread pool below what the cores could do. A process
pool has no such cap; each task there decodes a chunk of inputs and returns their pixels in one
shared-memory block (torch's multiprocessing reductions). Inputs already in memory (PIL images,
arrays) always stay in the calling process.
"""
from __future__ import annotations

import math
import multiprocessing
import os
import threading
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import torch
from PIL import Image

from .image_decoding import DecodedItem, DecodeOptions, decode_item, decode_items
from .pixel_arena import ArenaRef, Lease, attach, write_pixels

EXECUTORS = ("thread", "process")
# Inputs per task: enough to amortize a task's overhead, few enough to balance the workers.
MAX_CHUNK = 16
COPY_THREADS = 4  # memory copies into the kernel's page-locked buffer

_worker_options: Optional[DecodeOptions] = None


def default_workers() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _init_process_worker(options: DecodeOptions) -> None:
    global _worker_options
    _worker_options = options
    torch.set_num_threads(1)


def _decode_chunk_in_process(pairs: List[Tuple[int, Any]]) -> Tuple[Optional[torch.Tensor], List[DecodedItem],
                                                                     List[Tuple[int, int]]]:
    """Decode in a worker process; pixels travel as one packed buffer plus (offset, numel) per item."""
    buffer, items = decode_items(pairs, _worker_options, pack=True)
    spans = []
    for item in items:
        if item.pixels is not None and buffer is not None:
            offset = item.pixels.storage_offset()
            spans.append((offset, item.pixels.numel()))
            item.pixels = None
        else:
            spans.append((-1, 0))
    return buffer, items, spans


@dataclass
class RegionResult:
    """One task's inputs decoded into its region of an arena (see :mod:`.pixel_arena`)."""

    start: int              # the region's byte offset in the arena
    items: List[DecodedItem]
    offsets: List[int]      # per item: where its pixels start in the region; -1 where they are not there
    used: int               # bytes written, back to back from ``start``
    needed: int             # bytes all the items' pixels needed (more than ``used`` when some did not fit)


def decode_into_region(pairs: List[Tuple[int, Any]], options: DecodeOptions, region: np.ndarray
                       ) -> Tuple[List[DecodedItem], List[int], int, int]:
    """Decode, then copy the pixels into ``region`` back to back; pixels that did not fit stay on their item."""
    items = [decode_item(index, item, options) for index, item in pairs]
    offsets, used, needed = write_pixels(region, [item.pixels for item in items])
    for item, offset in zip(items, offsets):
        if offset >= 0:
            item.pixels = None
    return items, offsets, used, needed


def _decode_into_arena_in_process(pairs: List[Tuple[int, Any]], ref: ArenaRef, start: int, capacity: int
                                  ) -> Tuple[List[DecodedItem], List[int], int, int]:
    """In a worker process: only the bookkeeping travels back; pixels that did not fit go as shared tensors."""
    return decode_into_region(pairs, _worker_options, attach(ref)[start:start + capacity])


def _unpack(buffer: Optional[torch.Tensor], items: List[DecodedItem], spans: List[Tuple[int, int]]
            ) -> Tuple[Optional[torch.Tensor], List[DecodedItem]]:
    """The parent's side of :func:`_decode_chunk_in_process`: views of the shared buffer."""
    if buffer is not None:
        for item, (offset, size) in zip(items, spans):
            if offset >= 0:
                item.pixels = buffer[offset:offset + size].view(*item.image_size, item.channels)
    return buffer, items


def _unpack_when_done(future) -> Tuple[Optional[torch.Tensor], List[DecodedItem]]:
    return _unpack(*future.result())


def _in_memory(item: Any) -> bool:
    """Inputs already decoded (PIL images, arrays) stay in the calling process."""
    return isinstance(item, (Image.Image, torch.Tensor)) or type(item).__module__ == "numpy"


def copy_pixels(target: torch.Tensor, source: torch.Tensor) -> None:
    """``target[...] = source`` for CPU tensors through numpy: one thread per copy, GIL released. (A torch
    copy of a large tensor would start its own OpenMP team from every pool thread at once.)"""
    np.copyto(target.numpy(), source.numpy())


def _copy_pairs(pairs: List[Tuple[torch.Tensor, torch.Tensor]]) -> None:
    for target, source in pairs:
        copy_pixels(target, source)


def chunked(pairs: List[Tuple[int, Any]], workers: int) -> List[List[Tuple[int, Any]]]:
    """Split into about two tasks per worker, at most MAX_CHUNK inputs each."""
    size = max(1, min(MAX_CHUNK, math.ceil(len(pairs) / (2 * workers))))
    return [pairs[start:start + size] for start in range(0, len(pairs), size)]


class DecodePool:
    """A lazily started pool of ``workers`` threads or processes running the CPU step."""

    def __init__(self, options: DecodeOptions, workers: int, executor: str = "thread") -> None:
        if executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {EXECUTORS}, got {executor!r}")
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.options = options
        self.workers = workers
        self.executor = executor
        self._threads: Optional[Executor] = None
        self._processes: Optional[Executor] = None
        self._copies: Optional[Executor] = None
        self._lock = threading.Lock()  # decode() may be called from several threads at once

    def _thread_pool(self) -> Executor:
        with self._lock:
            if self._threads is None:
                self._threads = ThreadPoolExecutor(self.workers, thread_name_prefix="clip_flash-decode")
            return self._threads

    def _copy_pool(self) -> Executor:
        # Its own few threads: copies of a decoded batch must not queue behind the next batch's decoding.
        with self._lock:
            if self._copies is None:
                self._copies = ThreadPoolExecutor(max(1, min(COPY_THREADS, self.workers)),
                                                  thread_name_prefix="clip_flash-copy")
            return self._copies

    def _process_pool(self) -> Executor:
        with self._lock:
            return self._start_processes()

    def _start_processes(self) -> Executor:
        if self._processes is None:
            # spawn: forking a process that has a CUDA context is unsafe.
            context = multiprocessing.get_context("spawn")
            self._processes = ProcessPoolExecutor(self.workers, mp_context=context,
                                                  initializer=_init_process_worker, initargs=(self.options,))
        return self._processes

    def decode(self, items: Sequence[Any]) -> List[DecodedItem]:
        """All inputs' :class:`DecodedItem`, in input order."""
        pairs = list(enumerate(items))
        if len(pairs) <= 1:  # a single request: no hop through the pool
            return decode_items(pairs, self.options)[1]
        in_memory = [pair for pair in pairs if _in_memory(pair[1])]
        encoded = [pair for pair in pairs if not _in_memory(pair[1])]
        futures = []
        threads = self._thread_pool()
        if self.executor == "process" and encoded:
            pool = self._process_pool()
            encoded = [(index, bytes(item) if isinstance(item, memoryview) else item) for index, item in encoded]
            in_processes = [pool.submit(_decode_chunk_in_process, chunk) for chunk in chunked(encoded, self.workers)]
            futures += [threads.submit(_unpack_when_done, future) for future in in_processes]
            thread_pairs = in_memory
        else:
            thread_pairs = pairs
        futures += [threads.submit(decode_items, chunk, self.options)
                    for chunk in chunked(thread_pairs, self.workers)]
        decoded: List[DecodedItem] = []
        for future in futures:
            decoded.extend(future.result()[1])
        decoded.sort(key=lambda item: item.index)
        return decoded

    def decode_into(self, items: Sequence[Any], lease: Lease, bytes_per_image: int) -> List[RegionResult]:
        """Decode every input, each task writing its inputs' pixels into its own region of ``lease``'s
        arena (``bytes_per_image`` times its inputs): the only copy of the pixels after decoding."""
        pairs = list(enumerate(items))
        in_memory = [pair for pair in pairs if _in_memory(pair[1])]
        encoded = [pair for pair in pairs if not _in_memory(pair[1])]
        if self.executor == "process" and encoded and len(pairs) > 1:
            process_chunks = chunked([(index, bytes(item) if isinstance(item, memoryview) else item)
                                      for index, item in encoded], self.workers)
            thread_chunks = chunked(in_memory, self.workers) if in_memory else []
        else:
            process_chunks, thread_chunks = [], chunked(pairs, self.workers) if pairs else []
        arena = lease.arena
        starts, start = [], 0
        for chunk in process_chunks + thread_chunks:
            starts.append(start)
            start += len(chunk) * bytes_per_image
        if len(pairs) == 1:  # a single request: no hop through the pool
            return [RegionResult(0, *decode_into_region(pairs, self.options, arena.array[:bytes_per_image]))]
        futures = []
        if process_chunks:
            pool = self._process_pool()
            futures += [pool.submit(_decode_into_arena_in_process, chunk, arena.ref, at, len(chunk) * bytes_per_image)
                        for chunk, at in zip(process_chunks, starts)]
        threads = self._thread_pool()
        futures += [threads.submit(decode_into_region, chunk, self.options,
                                   arena.array[at:at + len(chunk) * bytes_per_image])
                    for chunk, at in zip(thread_chunks, starts[len(process_chunks):])]
        return [RegionResult(at, *future.result()) for future, at in zip(futures, starts)]

    def copy_many(self, targets: List[torch.Tensor], sources: List[torch.Tensor]) -> None:
        """``target[...] = source`` for each pair of CPU tensors, spread over the thread pool."""
        if len(targets) <= 1:
            _copy_pairs(list(zip(targets, sources)))
            return
        pairs = list(zip(targets, sources))
        size = max(1, -(-len(pairs) // (4 * COPY_THREADS)))
        chunks = [pairs[start:start + size] for start in range(0, len(pairs), size)]
        for future in [self._copy_pool().submit(_copy_pairs, chunk) for chunk in chunks]:
            future.result()

    def close(self) -> None:
        """Stop the workers (they start again on the next call)."""
        with self._lock:
            pools = (self._threads, self._processes, self._copies)
            self._threads = self._processes = self._copies = None
        for pool in pools:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
