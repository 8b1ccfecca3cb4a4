"""OpenCLIP's byte-level BPE on Hugging Face ``tokenizers`` (Rust, batches spread over all cores).

Built from the tables of the very ``SimpleTokenizer`` object being replaced (its ``encoder`` and
``bpe_ranks``), so vocabulary and merge order cannot drift from OpenCLIP's file. OpenCLIP's BPE merges,
repeatedly, every occurrence of the lowest-ranked adjacent pair, left to right; ``tokenizers`` pops pairs
from a queue ordered by (rank, position). The two agree whenever no merge can create a pair ranked below
the merge that created it, which holds for merges learnt in order; ``causal_merge_violations`` checks it
for the table at hand, and the tokenizer refuses the fast path if it fails.

Two Rust tokenizers, neither adding special tokens (ids are packed in numpy, see ``pack_token_ids``):
- ``text``: splits cleaned plain-ASCII text with OpenCLIP's pattern, maps bytes, runs BPE;
- ``words``: takes words OpenCLIP's own regex already split, maps bytes, runs BPE.
"""
from __future__ import annotations

import itertools
import os
from contextlib import contextmanager
from typing import Dict, Iterator, List, Sequence, Tuple

import numpy as np
import torch

# OpenCLIP's pre-split pattern without the special-token alternatives (texts spelling one never reach
# Rust) and without IGNORECASE (texts are lower-cased first).
OPENCLIP_WORD_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""
END_OF_WORD = "</w>"
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


def build_bpe_tokenizers(encoder: Dict[str, int], bpe_ranks: Dict[Tuple[str, str], int]):
    """(text tokenizer, words tokenizer) sharing OpenCLIP's vocabulary and merges; see the module docstring."""
    from tokenizers import Regex, Tokenizer, pre_tokenizers
    from tokenizers.models import BPE

    merges = ordered_merges(bpe_ranks)

    def bpe_model() -> "BPE":
        return BPE(vocab=dict(encoder), merges=merges, end_of_word_suffix=END_OF_WORD,
                   continuing_subword_prefix="", fuse_unk=False, dropout=None)

    # OpenCLIP maps UTF-8 bytes to printable characters with the same table as GPT-2, which is what
    # ByteLevel does; use_regex=False keeps GPT-2's own splitting out of it.
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    text = Tokenizer(bpe_model())
    text.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(OPENCLIP_WORD_PATTERN), behavior="removed", invert=True),
        byte_level,
    ])
    words = Tokenizer(bpe_model())
    words.pre_tokenizer = byte_level
    return text, words


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


def encode_batch_ids(tokenizer, inputs: Sequence, pretokenized: bool) -> List[List[int]]:
    """Token ids per input, without special tokens; ``encode_batch_fast`` when this tokenizers has it."""
    if not inputs:
        return []
    encode = getattr(tokenizer, "encode_batch_fast", None) or tokenizer.encode_batch
    encodings = encode(list(inputs), is_pretokenized=pretokenized, add_special_tokens=False)
    return [encoding.ids for encoding in encodings]


def pack_token_ids(id_lists: Sequence[Sequence[int]], context_length: int, sot_token_id: int,
                   eot_token_id: int) -> torch.Tensor:
    """OpenCLIP's layout: SOT, the first ``context_length - 2`` ids, EOT, zeros; one LongTensor row each.

    OpenCLIP builds ``[sot] + ids + [eot]``, cuts it to ``context_length`` and then overwrites the last
    kept entry with EOT, which is the same as keeping ``context_length - 2`` ids (for context_length >= 2).
    Vectorised so a batch costs no Python loop per token.
    """
    if context_length < 2:
        raise ValueError(f"context_length must be at least 2 here, got {context_length}")
    rows = len(id_lists)
    result = np.zeros((rows, context_length), dtype=np.int64)
    lengths = np.fromiter(map(len, id_lists), dtype=np.int64, count=rows)
    total = int(lengths.sum())
    flat = np.fromiter(itertools.chain.from_iterable(id_lists), dtype=np.int64, count=total)
    row_of = np.repeat(np.arange(rows), lengths)
    starts = np.cumsum(lengths) - lengths
    position = np.arange(total) - np.repeat(starts, lengths)
    keep = position < context_length - 2
    result[row_of[keep], position[keep] + 1] = flat[keep]
    result[:, 0] = sot_token_id
    result[np.arange(rows), np.minimum(lengths, context_length - 2) + 1] = eot_token_id
    return torch.from_numpy(result)
