"""Run the CPU step (:func:`decode_item`) over many inputs: a thread pool, or a process pool.

Threads suit torchvision's decoders, which release the GIL; what is left under the GIL (Pillow's
header parsing, Python bookkeeping) caps a thread pool below what the cores could do. A process
pool has no such cap; each task there decodes a chunk of inputs and returns their pixels in one
shared-memory block (torch's multiprocessing reductions), which the parent copies into page-locked
memory. Inputs already in memory (PIL images, arrays) always stay in the calling process.
"""
from __future__ import annotations

import math
import multiprocessing
import os
import threading
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any, List, Optional, Sequence, Tuple

import torch
from PIL import Image

from .image_decoding import DecodedItem, DecodeOptions, decode_items

EXECUTORS = ("thread", "process")
# Inputs per task: enough to amortize a task's overhead, few enough to balance the workers.
MAX_CHUNK = 16

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


def _unpack(buffer: Optional[torch.Tensor], items: List[DecodedItem], spans: List[Tuple[int, int]],
            pin: bool) -> Tuple[Optional[torch.Tensor], List[DecodedItem]]:
    """The parent's side of :func:`_decode_chunk_in_process`: views of a (pinned) copy of the buffer."""
    if buffer is None:
        return None, items
    local = torch.empty_like(buffer, pin_memory=pin) if pin else buffer
    if pin:
        local.copy_(buffer)
    for item, (offset, size) in zip(items, spans):
        if offset >= 0:
            item.pixels = local[offset:offset + size].view(*item.image_size, item.channels)
    return local, items


def _unpack_when_done(future, pin: bool) -> Tuple[Optional[torch.Tensor], List[DecodedItem]]:
    return _unpack(*future.result(), pin=pin)


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
        self._lock = threading.Lock()  # decode() may be called from several threads at once

    def _thread_pool(self) -> Executor:
        with self._lock:
            if self._threads is None:
                self._threads = ThreadPoolExecutor(self.workers, thread_name_prefix="clip_flash-decode")
            return self._threads

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

    def decode(self, items: Sequence[Any], pin: bool) -> Tuple[List[torch.Tensor], List[DecodedItem]]:
        """All inputs' :class:`DecodedItem`, in input order, and the buffers their pixels live in."""
        pairs = list(enumerate(items))
        if len(pairs) <= 1:  # a single request: no hop through the pool
            buffer, decoded = decode_items(pairs, self.options, pin=pin)
            return [buffer] if buffer is not None else [], decoded
        in_memory = [pair for pair in pairs if isinstance(pair[1], (Image.Image, torch.Tensor))
                     or type(pair[1]).__module__ == "numpy"]
        encoded = [pair for pair in pairs if not (isinstance(pair[1], (Image.Image, torch.Tensor))
                                                  or type(pair[1]).__module__ == "numpy")]
        futures = []
        threads = self._thread_pool()
        if self.executor == "process" and encoded:
            pool = self._process_pool()
            encoded = [(index, bytes(item) if isinstance(item, memoryview) else item) for index, item in encoded]
            in_processes = [pool.submit(_decode_chunk_in_process, chunk) for chunk in chunked(encoded, self.workers)]
            # Threads copy each returned block into page-locked memory, in parallel.
            futures += [threads.submit(_unpack_when_done, future, pin) for future in in_processes]
            thread_pairs = in_memory
        else:
            thread_pairs = pairs
        futures += [threads.submit(decode_items, chunk, self.options, pin)
                    for chunk in chunked(thread_pairs, self.workers)]
        buffers: List[torch.Tensor] = []
        decoded: List[DecodedItem] = []
        for future in futures:
            buffer, chunk_items = future.result()
            if buffer is not None:
                buffers.append(buffer)
            decoded.extend(chunk_items)
        decoded.sort(key=lambda item: item.index)
        return buffers, decoded

    def close(self) -> None:
        """Stop the workers (they start again on the next call)."""
        with self._lock:
            pools, self._threads, self._processes = (self._threads, self._processes), None, None
        for pool in pools:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
