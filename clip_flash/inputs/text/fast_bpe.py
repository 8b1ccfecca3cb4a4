"""Word ids for OpenCLIP's byte-level BPE: a dictionary in front of Hugging Face ``tokenizers`` (Rust).

The BPE is built from the tables of the very ``SimpleTokenizer`` object being replaced (its ``encoder``
and ``bpe_ranks``), so vocabulary and merge order cannot drift from OpenCLIP's file. OpenCLIP's BPE merges,
repeatedly, every occurrence of the lowest-ranked adjacent pair, left to right; ``tokenizers`` pops pairs
from a queue ordered by (rank, position). The two agree whenever no merge can create a pair ranked below
the merge that created it, which holds for merges learnt in order; ``causal_merge_violations`` checks it
for the table at hand (the tokenizer refuses the fast path if it fails) and the differential tests check
the ids.

Captions reuse words, so each distinct word is BPE-encoded once (all new words of a batch in one
``encode_batch`` call, spread over the cores) and then looked up: a Python dictionary lookup costs far
less than one call into ``tokenizers`` per word.
"""
from __future__ import annotations

import itertools
import os
import threading
from contextlib import contextmanager
from typing import Dict, Iterator, List, Sequence, Tuple

import numpy as np
import torch

END_OF_WORD = "</w>"
# Stands between the words of consecutive texts in a flat word list; maps to BOUNDARY_ID.
BOUNDARY_WORD = "\x00"
BOUNDARY_ID = -1
_PARALLELISM_VARIABLE = "TOKENIZERS_PARALLELISM"


def ordered_merges(bpe_ranks: Dict[Tuple[str, str], int]) -> List[Tuple[str, str]]:
    """The merge list in rank order, as ``tokenizers`` wants it."""
    merges = sorted(bpe_ranks.items(), key=lambda item: item[1])
    if [rank for _, rank in merges] != list(range(len(merges))):
        raise ValueError("BPE ranks are not 0..n-1")
    return [pair for pair, _ in merges]


def causal_merge_violations(merges: Sequence[Tuple[str, str]], base_symbols: Sequence[str]) -> int:
    """How many merges use a symbol that no earlier merge (nor the base alphabet) produces."""
    produced_at: Dict[str, int] = {symbol: -1 for symbol in base_symbols}
    violations = 0
    for rank, (left, right) in enumerate(merges):
        violations += sum(1 for part in (left, right) if produced_at.get(part, rank) >= rank)
        produced_at.setdefault(left + right, rank)
    return violations


def build_word_bpe(encoder: Dict[str, int], bpe_ranks: Dict[Tuple[str, str], int]):
    """A ``tokenizers.Tokenizer`` that maps each given word's UTF-8 bytes and runs OpenCLIP's BPE on it."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import BPE

    tokenizer = Tokenizer(BPE(vocab=dict(encoder), merges=ordered_merges(bpe_ranks),
                              end_of_word_suffix=END_OF_WORD, continuing_subword_prefix="", fuse_unk=False,
                              dropout=None))
    # OpenCLIP maps UTF-8 bytes to printable characters with GPT-2's table, which is what ByteLevel does;
    # use_regex=False keeps GPT-2's own splitting out of it (words arrive already split).
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    return tokenizer


@contextmanager
def rust_parallelism(enabled: bool) -> Iterator[None]:
    """Let ``tokenizers`` use its thread pool for one call (OpenCLIP's import switches it off globally).

    ``tokenizers`` reads TOKENIZERS_PARALLELISM on every batch call; the previous value is restored.
    The pool's size is rayon's (all cores, or RAYON_NUM_THREADS).
    """
    previous = os.environ.get(_PARALLELISM_VARIABLE)
    os.environ[_PARALLELISM_VARIABLE] = "true" if enabled else "false"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(_PARALLELISM_VARIABLE, None)
        else:
            os.environ[_PARALLELISM_VARIABLE] = previous


class WordIds:
    """BPE ids of words, remembered: OpenCLIP's ``encoder[bpe(word)]`` for every word it has seen.

    ``max_words`` bounds the memory: past it the dictionary starts again empty. Thread-safe: a lock keeps
    one thread's reset from emptying the dictionary under another's lookups.
    """

    def __init__(self, encoder: Dict[str, int], bpe_ranks: Dict[Tuple[str, str], int], parallel: bool = True,
                 max_words: int = 1 << 20) -> None:
        self.bpe = build_word_bpe(encoder, bpe_ranks)
        self.parallel = parallel
        self.max_words = max_words
        self.ids: Dict[str, Tuple[int, ...]] = {}
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self.ids.clear()
        self.ids[BOUNDARY_WORD] = (BOUNDARY_ID,)

    def learn(self, words: Sequence[str]) -> None:
        """BPE-encode, in one Rust batch, the words of ``words`` not seen yet."""
        new = set(words).difference(self.ids)
        if not new:
            return
        if len(self.ids) + len(new) > self.max_words:
            self._reset()  # then this batch's words are all new again
            new = set(words).difference(self.ids)
        new = list(new)
        encode = getattr(self.bpe, "encode_batch_fast", None) or self.bpe.encode_batch
        with rust_parallelism(self.parallel):
            for start in range(0, len(new), 65536):  # bounds the intermediate Encoding objects
                chunk = new[start:start + 65536]
                encodings = encode([[word] for word in chunk], is_pretokenized=True, add_special_tokens=False)
                self.ids.update(zip(chunk, (tuple(encoding.ids) for encoding in encodings)))

    def ids_of(self, words: Sequence[str]) -> Dict[str, Tuple[int, ...]]:
        """The ids of each of ``words`` (distinct words), BPE-encoding the new ones in one Rust batch."""
        with self._lock:
            self.learn(words)
            return {word: self.ids[word] for word in words}

    def flat_ids(self, words: Sequence[str]) -> np.ndarray:
        """The ids of ``words`` one after another (BOUNDARY_ID for each BOUNDARY_WORD), int64."""
        with self._lock:
            self.learn(words)
            ids = itertools.chain.from_iterable(map(self.ids.__getitem__, words))
            return np.fromiter(ids, dtype=np.int64)


def fill_rows(result: np.ndarray, rows: Sequence[int], flat_ids: np.ndarray, sot_token_id: int,
              eot_token_id: int) -> None:
    """Write texts into ``result`` rows in OpenCLIP's layout: SOT, ids, EOT, zeros, truncated.

    ``flat_ids`` holds the texts' ids one after another, each text followed by BOUNDARY_ID. OpenCLIP builds
    ``[sot] + ids + [eot]``, cuts it to the context length and overwrites the last kept entry with EOT:
    the same as keeping ``context_length - 2`` ids (for context_length >= 2). Vectorised: no Python loop
    per token or per text.
    """
    context_length = result.shape[1]
    if context_length < 2:
        raise ValueError(f"context_length must be at least 2 here, got {context_length}")
    rows = np.asarray(rows, dtype=np.int64)
    boundaries = np.flatnonzero(flat_ids == BOUNDARY_ID)
    if len(boundaries) != len(rows):
        raise ValueError(f"{len(boundaries)} texts in flat_ids for {len(rows)} rows")
    lengths = np.diff(boundaries, prepend=-1) - 1
    ids = flat_ids[flat_ids != BOUNDARY_ID]
    starts = np.cumsum(lengths) - lengths
    position = np.arange(len(ids)) - np.repeat(starts, lengths)
    keep = position < context_length - 2
    result[np.repeat(rows, lengths)[keep], position[keep] + 1] = ids[keep]
    result[rows, 0] = sot_token_id
    result[rows, np.minimum(lengths, context_length - 2) + 1] = eot_token_id


def new_result(texts: int, context_length: int) -> np.ndarray:
    """The zero-filled int64 array that becomes the returned LongTensor (``torch.from_numpy``)."""
    return np.zeros((texts, context_length), dtype=np.int64)


def as_long_tensor(result: np.ndarray) -> torch.Tensor:
    """``result`` as a LongTensor sharing its memory."""
    return torch.from_numpy(result)
