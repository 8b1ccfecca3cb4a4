"""Run the CPU step (:func:`decode_item`) over many inputs: a thread pool, or a process pool.

Threads suit torchvision's decoders, which release the GIL; what is left under the GIL (Pillow's
header parsing, Python bookkeeping) caps a thread pool below what the cores could do. A process
pool has no such cap; each task there decodes a chunk of inputs and returns their pixels in one
shared-memory block (torch's multiprocessing reductions), or writes them into its region of an arena
(:mod:`.arena_regions`). Inputs already in memory (PIL images, arrays) always stay in the calling process.

The processes come from a fork server that imported the decoding modules once (:mod:`.worker_processes`);
:meth:`DecodePool.start` starts them in the background, and until they are up the pool's threads decode
(:meth:`DecodePool._processes_ready`).
"""
from __future__ import annotations

import heapq
import logging
import math
import os
import threading
import time
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import torch
from PIL import Image

from . import worker_processes
from .arena_regions import RegionResult, decode_into_region
from .image_decoding import CALLER_ROUTE, DecodedItem, DecodeOptions, decode_item, decode_items, describe_error
from .pixel_arena import Lease
from .worker_processes import (decode_chunk_in_process, decode_into_arena_in_process, init_process_worker,
                               warm_up_process, warm_up_jpeg)

logger = logging.getLogger(__name__)

EXECUTORS = ("thread", "process")
# Inputs per task: enough to amortize a task's overhead, few enough to balance the workers.
MAX_CHUNK = 16
COPY_THREADS = 4  # memory copies into the kernel's page-locked buffer


def default_workers() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _unpack(buffer: Optional[torch.Tensor], items: List[DecodedItem], spans: List[Tuple[int, int]]
            ) -> Tuple[Optional[torch.Tensor], List[DecodedItem]]:
    """The parent's side of :func:`decode_chunk_in_process`: views of the shared buffer."""
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
    """Split into about two tasks per worker, at most MAX_CHUNK inputs each, of about equal work: inputs go,
    largest first, to the task with the least so far (file sizes stand for decode times). A call returns when
    its last task does, so a task of large photos would leave the other workers idle meanwhile."""
    size = max(1, min(MAX_CHUNK, math.ceil(len(pairs) / (2 * workers))))
    count = math.ceil(len(pairs) / size) if pairs else 0
    if count <= 1:
        return [list(pairs)] if pairs else []
    tasks: List[List[Tuple[int, Any]]] = [[] for _ in range(count)]
    loads = [(0, number) for number in range(count)]  # a heap of (work so far, task)
    works = [_work(pair[1]) for pair in pairs]  # once each: a file's costs a stat
    for position in sorted(range(len(pairs)), key=lambda position: -works[position]):
        load, number = heapq.heappop(loads)
        tasks[number].append(pairs[position])
        heapq.heappush(loads, (load + works[position], number))
    return [sorted(task, key=lambda pair: pair[0]) for task in tasks if task]


def _work(item: Any) -> int:
    """An input's decode work, roughly: its encoded size (files, bytes), its pixel count (images in memory)."""
    if isinstance(item, (str, os.PathLike)):
        try:
            return os.path.getsize(item)
        except OSError:
            return 0
    if isinstance(item, (bytes, bytearray, memoryview)):
        return len(item)
    if isinstance(item, Image.Image):
        return item.width * item.height
    return int(getattr(item, "size", 0) if not callable(getattr(item, "size", None)) else item.numel())


class DecodePool:
    """A pool of ``workers`` threads or processes running the CPU step: started by :meth:`start` (in the
    background), or else on the first call."""

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
        self._starter: Optional[threading.Thread] = None
        self.start_method = worker_processes.process_start_method() if executor == "process" else None
        self.start_seconds: Optional[float] = None  # start() to every warm-up task done

    def start(self, wait: bool = False) -> None:
        """Start the workers now rather than on the first call: processes are forked from the fork server
        (or spawned) and each runs one warm-up decode. In a background thread unless ``wait``; calls made
        meanwhile queue behind the warm-up, and a start that fails only leaves it to the first call to report."""
        with self._lock:
            starter = self._starter
            if starter is None:
                threads = self._start_threads()
                processes = self._start_processes() if self.executor == "process" else None
                starter = threading.Thread(target=self._warm_up, args=(threads, processes), daemon=True,
                                           name="clip_flash-decode-start")
                self._starter, self.start_seconds = starter, None
                starter.start()
        if wait:
            starter.join()

    def _warm_up(self, threads: Executor, processes: Optional[Executor]) -> None:
        started = time.perf_counter()
        sample = warm_up_jpeg()
        try:
            if processes is not None:
                # Submitted back to back, before any worker is idle: one process is started for each.
                futures = [processes.submit(warm_up_process, sample) for _ in range(self.workers)]
            else:
                futures = [threads.submit(decode_item, -1, sample, self.options) for _ in range(self.workers)]
            for future in futures:
                future.result()
        except BaseException as error:  # noqa: BLE001 - closed meanwhile, or a broken pool the next call reports
            logger.debug("decoding workers' warm-up stopped: %s", describe_error(error))
            return
        self.start_seconds = time.perf_counter() - started
        logger.debug("%d %s decoding workers (%s) ready in %.2f s", self.workers, self.executor,
                     self.start_method or "threads", self.start_seconds)

    def _processes_ready(self) -> bool:
        """Whether calls go to the worker processes: once their start is over. Until then the threads decode
        (the same computation), so the first batches do not wait for the processes. Their fork server's
        interpreter imports torch and the decoding modules first (4.4 s on the 16-core H100 host; 19.6 s when it
        imported all of clip_flash's API with OpenCLIP), while threads decode about 2,000 photos a second there.
        A start that failed also counts as over: the process pool then reports why on the first call."""
        if self.executor != "process":
            return False
        with self._lock:
            starter = self._starter
        if starter is None:
            self.start()
            return False
        return not starter.is_alive()

    def _thread_pool(self) -> Executor:
        with self._lock:
            return self._start_threads()

    def _start_threads(self) -> Executor:
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
            context = worker_processes.process_context()
            self._processes = ProcessPoolExecutor(self.workers, mp_context=context,
                                                  initializer=init_process_worker, initargs=(self.options,))
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
        if encoded and self._processes_ready():
            pool = self._process_pool()
            encoded = [(index, bytes(item) if isinstance(item, memoryview) else item) for index, item in encoded]
            in_processes = [pool.submit(decode_chunk_in_process, chunk) for chunk in chunked(encoded, self.workers)]
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
        if thread_pairs is not pairs:  # only workers hand inputs back
            self._decode_handed_back([decoded], items)
        return decoded

    def decode_into(self, items: Sequence[Any], lease: Lease, bytes_per_image: int) -> List[RegionResult]:
        """Decode every input, each task writing its inputs' pixels into its own region of ``lease``'s
        arena (``bytes_per_image`` times its inputs): the only copy of the pixels after decoding."""
        pairs = list(enumerate(items))
        in_memory = [pair for pair in pairs if _in_memory(pair[1])]
        encoded = [pair for pair in pairs if not _in_memory(pair[1])]
        if encoded and len(pairs) > 1 and self._processes_ready():
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
            futures += [pool.submit(decode_into_arena_in_process, chunk, arena.ref, at, len(chunk) * bytes_per_image)
                        for chunk, at in zip(process_chunks, starts)]
        threads = self._thread_pool()
        futures += [threads.submit(decode_into_region, chunk, self.options,
                                   arena.array[at:at + len(chunk) * bytes_per_image])
                    for chunk, at in zip(thread_chunks, starts[len(process_chunks):])]
        results = [RegionResult(at, *future.result()) for future, at in zip(futures, starts)]
        self._decode_handed_back([result.items for result in results[:len(process_chunks)]], items)
        return results

    def _decode_handed_back(self, lists: List[List[DecodedItem]], items: Sequence[Any]) -> None:
        """Decode here, in place, the inputs workers handed back (route ``in-caller``: a worker that has not loaded
        ``preprocess`` yet). Here it is loaded; these take no room in an arena (their output is preprocess's)."""
        back = [(position, number) for position, decoded in enumerate(lists)
                for number, item in enumerate(decoded) if item.route == CALLER_ROUTE]
        if not back:
            return
        pairs = [(lists[position][number].index, items[lists[position][number].index]) for position, number in back]
        futures = [self._thread_pool().submit(decode_items, chunk, self.options)
                   for chunk in chunked(pairs, self.workers)]
        redone = {item.index: item for future in futures for item in future.result()[1]}
        for position, number in back:
            handed = lists[position][number]
            lists[position][number] = item = redone[handed.index]
            item.notes[:0] = handed.notes

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
        """Stop the workers (they start again on the next call, or :meth:`start`)."""
        with self._lock:
            pools = (self._threads, self._processes, self._copies)
            self._threads = self._processes = self._copies = None
            starter, self._starter = self._starter, None
        for pool in pools:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        if starter is not None:
            starter.join()
