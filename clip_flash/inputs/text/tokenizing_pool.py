"""Large batches tokenized in slices by worker processes, for many-core hosts.

The fast tokenizer's per-text work (finding the plain texts, replaying ftfy on the others, cutting and
looking up chunks) is Python holding the GIL, so threads cannot share it out; processes can. Each worker
builds its own ``FastCLIPTokenizer`` from the very OpenCLIP tokenizer being replaced (sent once, by pickle)
and returns the id rows of its slice; the caller does one slice itself meanwhile. Used only where it pays:
workers asked for, a batch of at least ``MIN_TEXTS_FOR_POOL`` strings, and a process allowed to have
children (not a DataLoader worker). If the pool cannot start or breaks, the tokenizer says so once in the log and
tokenizes in its own process: the same ids, more slowly.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import weakref
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

logger = logging.getLogger(__name__)

# A batch needs at least this many texts before slicing it over processes beats the round trips.
MIN_TEXTS_FOR_POOL = 512
# Texts per slice, at least (smaller slices cost more in round trips than they save).
MIN_SLICE = 128

_worker_tokenizer: Any = None


def _start_worker(make_tokenizer: Callable[[], Any]) -> None:
    global _worker_tokenizer
    _worker_tokenizer = make_tokenizer()


def _worker_tokenize(texts: Sequence[str], context_length: int) -> Tuple[np.ndarray, Dict[str, int]]:
    before = dict(_worker_tokenizer.route_counts)
    ids = _worker_tokenizer(list(texts), context_length=context_length).numpy()
    # Ids travel back in the narrowest type that holds them (uint16 for OpenCLIP's 49,408-token vocabulary):
    # a quarter of the bytes to pickle.
    if len(_worker_tokenizer.encoder) <= 1 << 16:
        ids = ids.astype(np.uint16)
    return ids, {route: count - before[route] for route, count in _worker_tokenizer.route_counts.items()}


def usable_cores() -> int:
    """Cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def default_workers() -> int:
    """Workers when not told: every usable core but one (the caller's), none below three cores."""
    cores = usable_cores()
    return cores - 1 if cores >= 3 else 0


class TokenizingPool:
    """A lazily started process pool tokenizing slices of a batch (see the module docstring)."""

    def __init__(self, make_tokenizer: Callable[[], Any], workers: int) -> None:
        """``make_tokenizer``: picklable; makes a worker's tokenizer (one with ``route_counts`` and ``encoder``)."""
        self.make_tokenizer = make_tokenizer
        self.workers = workers
        self._executor: Optional[ProcessPoolExecutor] = None
        self._owner_pid = os.getpid()
        self.broken_reason: Optional[str] = None

    def usable_for(self, count: int) -> bool:
        """Whether a batch of ``count`` texts goes to the pool."""
        return (self.workers >= 1 and count >= MIN_TEXTS_FOR_POOL and self.broken_reason is None
                and not multiprocessing.current_process().daemon)

    def _executor_here(self) -> ProcessPoolExecutor:
        if self._executor is None or self._owner_pid != os.getpid():  # a forked copy never uses its parent's
            # Never plain fork: this process may hold a CUDA context and threads. Each worker imports OpenCLIP
            # when it unpickles the tokenizer factory below.
            method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
            context = multiprocessing.get_context(method)
            self._executor = ProcessPoolExecutor(self.workers, mp_context=context, initializer=_start_worker,
                                                 initargs=(self.make_tokenizer,))
            self._owner_pid = os.getpid()
            weakref.finalize(self, self._executor.shutdown, wait=False, cancel_futures=True)
        return self._executor

    def tokenize(self, texts: Sequence[str], context_length: int,
                 tokenize_here: Callable[[Sequence[str]], np.ndarray]) -> Tuple[np.ndarray, Dict[str, int]]:
        """The id rows of ``texts`` (workers' slices and the caller's, in order) and the workers' route
        counts. ``tokenize_here`` does a slice in this process (it counts its own routes)."""
        # One slice per worker and one for the caller: each round trip costs the caller's process a few
        # hundred microseconds of queue work, so fewer, larger slices beat finer balancing.
        size = max(MIN_SLICE, -(-len(texts) // (self.workers + 1)))
        slices = [(start, min(start + size, len(texts))) for start in range(0, len(texts), size)]
        futures: List[Future] = []
        try:
            executor = self._executor_here()
            futures = [executor.submit(_worker_tokenize, list(texts[start:end]), context_length)
                       for start, end in slices[:-1]]
        except Exception as error:  # cannot start: everything here
            self._give_up(error)
        routes: Dict[str, int] = {}
        parts: List[Optional[np.ndarray]] = [None] * len(slices)
        parts[-1] = tokenize_here(texts[slices[-1][0]:slices[-1][1]])
        try:
            for index, future in enumerate(futures):
                parts[index], worker_routes = future.result()
                for route, count in worker_routes.items():
                    routes[route] = routes.get(route, 0) + count
        except Exception as error:
            self._give_up(error)
        for index, part in enumerate(parts):
            if part is None:
                parts[index] = tokenize_here(texts[slices[index][0]:slices[index][1]])
        if not parts:
            return np.zeros((0, context_length), np.int64), routes
        return np.concatenate([part.astype(np.int64, copy=False) for part in parts]), routes

    def _give_up(self, error: BaseException) -> None:
        if self.broken_reason is None:
            self.broken_reason = f"{type(error).__name__}: {error}"
            logger.warning("clip_flash tokenizer: tokenizing pool unavailable (%s); tokenizing in this process "
                           "(same ids, slower)", self.broken_reason)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
