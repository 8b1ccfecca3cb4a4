"""OpenCLIP's own cleaning and split of non-plain texts, spread over worker processes on many-core hosts.

``ftfy.fix_text`` and the ``regex`` split are pure Python (tens of microseconds per caption, the GIL held
throughout), so threads cannot share them out; processes can. Each worker runs the very functions of the
tokenizer being replaced (its ``clean_fn`` and its compiled ``pat``, sent by pickle), so the words are
OpenCLIP's by construction. Used only where it pays: several usable cores, a batch with enough such texts,
and a process allowed to have children (not a DataLoader worker). If the pool cannot start or breaks, the
tokenizer says so once in the log and cleans in its own process: the same words, more slowly.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import weakref
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any, Callable, List, Optional, Sequence, Tuple

logger = logging.getLogger(__name__)

# A batch needs at least this many non-plain texts before a pool is worth the round trip.
MIN_TEXTS_FOR_POOL = 64

_clean: Optional[Callable[[str], str]] = None
_pattern: Any = None
_boundary: str = ""


def _start_worker(clean_fn: Callable[[str], str], pattern: Any, boundary: str) -> None:
    global _clean, _pattern, _boundary
    _clean, _pattern, _boundary = clean_fn, pattern, boundary


def clean_and_split(texts: Sequence[str], clean_fn: Callable[[str], str], pattern: Any,
                    boundary: str) -> List[Optional[List[str]]]:
    """Per text, OpenCLIP's words (``pattern.findall(clean_fn(text))``), or None when the cleaned text
    holds ``boundary`` (the tokenizer then leaves it to OpenCLIP's own tokenizer)."""
    out: List[Optional[List[str]]] = []
    for text in texts:
        cleaned = clean_fn(text)
        out.append(None if boundary in cleaned else pattern.findall(cleaned))
    return out


def _worker_clean_and_split(texts: Sequence[str]) -> List[Optional[List[str]]]:
    return clean_and_split(texts, _clean, _pattern, _boundary)


def usable_cores() -> int:
    """Cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def default_workers() -> int:
    """Workers when not told: every usable core but one (the caller's), none below three cores."""
    cores = usable_cores()
    return cores - 1 if cores >= 3 else 0


class CleaningPool:
    """A lazily started process pool running ``clean_and_split`` on chunks of texts."""

    def __init__(self, clean_fn: Callable[[str], str], pattern: Any, boundary: str, workers: int) -> None:
        self.clean_fn, self.pattern, self.boundary = clean_fn, pattern, boundary
        self.workers = workers
        self._executor: Optional[ProcessPoolExecutor] = None
        self._owner_pid = os.getpid()
        self.broken_reason: Optional[str] = None

    def usable_for(self, count: int) -> bool:
        """Whether a batch of ``count`` non-plain texts goes to the pool."""
        return (self.workers >= 1 and count >= MIN_TEXTS_FOR_POOL and self.broken_reason is None
                and not multiprocessing.current_process().daemon)

    def _executor_here(self) -> ProcessPoolExecutor:
        if self._executor is None or self._owner_pid != os.getpid():  # a forked copy never uses its parent's
            # forkserver: workers forked from a clean server, not from this (threaded) process.
            context = multiprocessing.get_context("forkserver")
            self._executor = ProcessPoolExecutor(self.workers, mp_context=context, initializer=_start_worker,
                                                 initargs=(self.clean_fn, self.pattern, self.boundary))
            self._owner_pid = os.getpid()
            weakref.finalize(self, self._executor.shutdown, wait=False, cancel_futures=True)
        return self._executor

    def submit(self, texts: Sequence[str]) -> List[Tuple[int, int, Future]]:
        """Start cleaning ``texts`` in chunks: (start, end, future) each; ``collect`` gathers the words."""
        # Several chunks per worker, so that the caller can take back the ones no worker has started.
        chunk = max(16, -(-len(texts) // (4 * self.workers + 4)))
        try:
            executor = self._executor_here()
            return [(start, start + chunk, executor.submit(_worker_clean_and_split, list(texts[start:start + chunk])))
                    for start in range(0, len(texts), chunk)]
        except Exception as error:  # cannot start: fall back in collect
            self._give_up(error)
            return []

    def collect(self, chunks: List[Tuple[int, int, Future]], texts: Sequence[str]) -> List[Optional[List[str]]]:
        """The words of ``texts`` from ``submit``'s futures, or computed here if the pool failed.

        Chunks no worker has started yet are cancelled and cleaned by the caller, last first, so the
        calling thread works alongside the workers instead of waiting.
        """
        if chunks:
            parts: List[Optional[List[Optional[List[str]]]]] = [None] * len(chunks)
            try:
                for index in reversed(range(len(chunks))):
                    start, end, future = chunks[index]
                    if future.cancel():
                        parts[index] = clean_and_split(texts[start:end], self.clean_fn, self.pattern, self.boundary)
                for index, (_, _, future) in enumerate(chunks):
                    if parts[index] is None:
                        parts[index] = future.result()
                return [words for part in parts for words in part]
            except Exception as error:
                self._give_up(error)
        return clean_and_split(texts, self.clean_fn, self.pattern, self.boundary)

    def _give_up(self, error: BaseException) -> None:
        if self.broken_reason is None:
            self.broken_reason = f"{type(error).__name__}: {error}"
            logger.warning("clip_flash tokenizer: cleaning pool unavailable (%s); cleaning in this process "
                           "(same ids, slower)", self.broken_reason)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
