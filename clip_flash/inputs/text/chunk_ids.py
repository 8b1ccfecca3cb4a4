"""Token ids of whitespace-free chunks of cleaned text, remembered, gathered for a whole batch with numpy.

OpenCLIP splits a cleaned text (whitespace runs already one space) with its pattern, whose matches never
hold whitespace: so the words of a text are the words of its chunks (``text.split()``), chunk after chunk,
and a chunk's ids never depend on its neighbours. Captions reuse chunks ("a", "photo", "dog," ...), so
each distinct chunk is split (OpenCLIP's own compiled pattern) and BPE-encoded (``fast_bpe.WordIds``)
once; a batch is then one dictionary lookup per chunk and a numpy gather, with no per-word Python work.
A word spelling a special token (``<start_of_text>``) gets that token's id, as in OpenCLIP's ``bpe``.
"""
from __future__ import annotations

import itertools
import threading
from typing import Callable, Dict, List, Sequence

import numpy as np

from .fast_bpe import BOUNDARY_ID, BOUNDARY_WORD, WordIds


class ChunkIds:
    """Ids of chunks: OpenCLIP's words of the chunk, each word's BPE ids, concatenated.

    ``split_words`` is OpenCLIP's ``pat.findall``; ``special_ids`` maps special-token spellings to ids.
    ``max_chunks`` bounds the memory: past it the table starts again empty. Thread-safe (one lock).
    """

    def __init__(self, word_ids: WordIds, split_words: Callable[[str], List[str]], special_ids: Dict[str, int],
                 max_chunks: int = 1 << 20) -> None:
        self.word_ids = word_ids
        self.split_words = split_words
        self.special_ids = dict(special_ids)
        self.max_chunks = max_chunks
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self.index: Dict[str, int] = {BOUNDARY_WORD: 0}
        self._starts = np.zeros(1024, dtype=np.int64)
        self._lengths = np.zeros(1024, dtype=np.int64)
        self._lengths[0] = 1
        self._flat = np.full(4096, BOUNDARY_ID, dtype=np.int64)
        self._used_flat = 1

    def __len__(self) -> int:
        return len(self.index)

    def _learn(self, chunks: Sequence[str]) -> None:
        """Split and BPE-encode new chunks (their new words in one Rust batch) and append their ids."""
        words_per_chunk = [self.split_words(chunk) for chunk in chunks]
        words = {word for words in words_per_chunk for word in words if word not in self.special_ids}
        word_ids = self.word_ids.ids_of(sorted(words))
        ids_per_chunk = [[token for word in words
                          for token in ((self.special_ids[word],) if word in self.special_ids else word_ids[word])]
                         for words in words_per_chunk]
        first = len(self.index)
        needed_rows, needed_flat = first + len(chunks), self._used_flat + sum(map(len, ids_per_chunk))
        if needed_rows > len(self._starts):
            size = max(needed_rows, 2 * len(self._starts))
            self._starts = np.resize(self._starts, size)
            self._lengths = np.resize(self._lengths, size)
        if needed_flat > len(self._flat):
            self._flat = np.resize(self._flat, max(needed_flat, 2 * len(self._flat)))
        lengths = np.fromiter(map(len, ids_per_chunk), dtype=np.int64, count=len(chunks))
        self._lengths[first:needed_rows] = lengths
        self._starts[first:needed_rows] = self._used_flat + np.cumsum(lengths) - lengths
        self._flat[self._used_flat:needed_flat] = np.fromiter(itertools.chain.from_iterable(ids_per_chunk),
                                                              dtype=np.int64, count=needed_flat - self._used_flat)
        self._used_flat = needed_flat
        self.index.update(zip(chunks, range(first, needed_rows)))

    def _rows(self, chunks: Sequence[str]) -> np.ndarray:
        return np.fromiter(map(self.index.get, chunks, itertools.repeat(-1)), dtype=np.int64, count=len(chunks))

    def flat_ids(self, chunks: Sequence[str]) -> np.ndarray:
        """The ids of ``chunks`` one after another (BOUNDARY_ID for each BOUNDARY_WORD), int64."""
        with self._lock:
            rows = self._rows(chunks)
            missing = np.flatnonzero(rows < 0)
            if len(missing):
                new = list(dict.fromkeys(chunks[position] for position in missing.tolist()))
                if len(self.index) + len(new) > self.max_chunks:
                    self._reset()  # then this batch's chunks are all new again
                    new = list(dict.fromkeys(chunk for chunk in chunks if chunk not in self.index))
                    self._learn(new)
                    rows = self._rows(chunks)
                else:
                    self._learn(new)
                    rows[missing] = self._rows([chunks[position] for position in missing.tolist()])
            lengths = self._lengths[rows]
            ends = np.cumsum(lengths)
            positions = np.arange(int(ends[-1]) if len(ends) else 0, dtype=np.int64)
            positions += np.repeat(self._starts[rows] - (ends - lengths), lengths)
            return self._flat[positions]
