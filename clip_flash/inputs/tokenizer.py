"""``get_tokenizer(model_name)``: OpenCLIP's tokenizer, with OpenCLIP's exact ids, computed faster.

For OpenCLIP's ``SimpleTokenizer`` in its default setting (OpenAI BPE, ``clean='lower'``, truncation, no
extra special tokens: the ViT-* CLIP models) the result is a ``FastCLIPTokenizer``. Each text takes the
cheapest route that still gives OpenCLIP's ids:

- ``plain``: printable ASCII without ``&`` (most captions). OpenCLIP's cleaning reduces to whitespace
  collapsing and lower-casing there (proof in ``text_cleaning``); splitting and BPE run in Rust.
- ``cleaned``: any other text. OpenCLIP's own cleaning and own compiled split pattern run in Python
  (the same functions, so exact by construction); only the byte mapping and BPE of the words run in Rust.
- ``openclip``: a text whose cleaned form spells ``<start_of_text>``/``<end_of_text>``, or that is not a
  ``str``: OpenCLIP's own tokenizer, which turns such spellings into special ids (or raises for you).

Any other tokenizer (``reduction_mask`` variants, ``clean='whitespace'``/``'canonicalize'``, SigLIP's and
other Hugging Face tokenizers, extra special tokens) is returned unchanged: OpenCLIP's own object.
``describe_tokenizer`` says which one you got and why; ``get_tokenizer`` logs it.
"""
from __future__ import annotations

import logging
from typing import Any, List, Optional, Sequence, Tuple, Union

import torch

from .fast_bpe import (build_bpe_tokenizers, causal_merge_violations, encode_batch_ids, ordered_merges,
                       pack_token_ids, rust_parallelism)
from .text_cleaning import (SPECIAL_TOKEN_TEXTS, all_plain_ascii, clean_plain_ascii, plain_ascii_mask,
                            spells_special_token)

logger = logging.getLogger(__name__)

# Rust batches are cut to this many texts, bounding the memory of the intermediate Encoding objects.
_RUST_CHUNK = 65536


def fast_path_refusal(tokenizer: Any) -> Optional[str]:
    """Why ``tokenizer`` cannot get the fast path, or None when it can."""
    from open_clip.tokenizer import SimpleTokenizer, _clean_lower
    if type(tokenizer) is not SimpleTokenizer:
        return f"{type(tokenizer).__name__} is not OpenCLIP's SimpleTokenizer"
    if tokenizer.clean_fn is not _clean_lower:
        return f"text cleaning {getattr(tokenizer.clean_fn, '__name__', tokenizer.clean_fn)} is not 'lower'"
    if tokenizer.reduction_fn is not None:
        return "a reduction_mask (random, shuffle, simple or syntax) is set"
    specials = [tokenizer.decoder[token_id] for token_id in tokenizer.all_special_ids]
    if tuple(specials) != SPECIAL_TOKEN_TEXTS:
        return f"special tokens {specials} are not OpenCLIP's two defaults"
    return None


class FastCLIPTokenizer:
    """Drop-in for an OpenCLIP ``SimpleTokenizer`` (clean='lower'): same call, same LongTensor.

    Every other attribute (``encode``, ``decode``, ``encoder``, ``sot_token_id`` ...) is the wrapped
    tokenizer's own. ``parallel=False`` keeps the Rust part on the calling thread.
    """

    def __init__(self, openclip_tokenizer: Any, parallel: bool = True) -> None:
        refusal = fast_path_refusal(openclip_tokenizer)
        if refusal is not None:
            raise ValueError(f"no fast path for this tokenizer: {refusal}")
        base_symbols = [symbol for symbol in openclip_tokenizer.encoder if len(symbol) == 1]
        base_symbols += [symbol + "</w>" for symbol in base_symbols]
        violations = causal_merge_violations(ordered_merges(openclip_tokenizer.bpe_ranks), base_symbols)
        if violations:
            raise ValueError(f"{violations} BPE merges use symbols no earlier merge makes; the Rust BPE "
                             "could merge in a different order than OpenCLIP's")
        self.openclip_tokenizer = openclip_tokenizer
        self.parallel = parallel
        self._text_bpe, self._words_bpe = build_bpe_tokenizers(openclip_tokenizer.encoder,
                                                               openclip_tokenizer.bpe_ranks)
        # Counts of texts per route since construction, for reports and tests.
        self.route_counts = {"plain": 0, "cleaned": 0, "openclip": 0}

    def __getattr__(self, name: str) -> Any:
        # Only reached for names this class lacks: everything else is OpenCLIP's tokenizer's.
        if name == "openclip_tokenizer":
            raise AttributeError(name)
        return getattr(self.openclip_tokenizer, name)

    def describe(self) -> str:
        """One line: what runs, and how many texts took each route so far."""
        counts = ", ".join(f"{route} {count}" for route, count in self.route_counts.items())
        return ("clip_flash FastCLIPTokenizer over OpenCLIP's SimpleTokenizer (Rust BPE with OpenCLIP's "
                f"vocabulary; OpenCLIP's own cleaning for non-plain text); texts so far: {counts}")

    def __repr__(self) -> str:
        return f"<{self.describe()}>"

    def __call__(self, texts: Union[str, Sequence[str]],
                 context_length: Optional[int] = None) -> torch.LongTensor:
        """Token ids of ``texts``, shape [len(texts), context_length]: exactly OpenCLIP's."""
        if isinstance(texts, str):
            texts = [texts]
        context_length = context_length or self.openclip_tokenizer.context_length
        assert context_length, "Please set a valid context length"
        if context_length < 2:
            self.route_counts["openclip"] += len(texts)
            return self.openclip_tokenizer(list(texts), context_length=context_length)
        id_lists, openclip_rows = self.token_ids(texts)
        result = pack_token_ids(id_lists, context_length, self.openclip_tokenizer.sot_token_id,
                                self.openclip_tokenizer.eot_token_id)
        if openclip_rows:
            result[openclip_rows] = self.openclip_tokenizer([texts[row] for row in openclip_rows],
                                                            context_length=context_length)
        return result

    def token_ids(self, texts: Sequence[str]) -> Tuple[List[List[int]], List[int]]:
        """Ids without SOT/EOT per text, and the rows only OpenCLIP's tokenizer may fill (ids left empty)."""
        if all_plain_ascii(texts):
            plain_rows: List[int] = list(range(len(texts)))
            other_rows: List[int] = []
        else:
            mask = plain_ascii_mask(texts)
            plain_rows = [row for row, plain in enumerate(mask) if plain]
            other_rows = [row for row, plain in enumerate(mask) if not plain]
        cleaned = clean_plain_ascii(texts[row] for row in plain_rows)
        openclip_rows: List[int] = []
        if spells_special_token("\n".join(cleaned)):
            special = [spells_special_token(text) for text in cleaned]
            openclip_rows = [row for row, is_special in zip(plain_rows, special) if is_special]
            plain_rows = [row for row, is_special in zip(plain_rows, special) if not is_special]
            cleaned = [text for text, is_special in zip(cleaned, special) if not is_special]
        plain_ids = self._rust_ids(self._text_bpe, cleaned, pretokenized=False)
        self.route_counts["plain"] += len(plain_rows)
        if not other_rows and not openclip_rows:
            return plain_ids, []

        id_lists: List[List[int]] = [[] for _ in texts]
        for row, ids in zip(plain_rows, plain_ids):
            id_lists[row] = ids
        word_rows, word_lists = [], []
        tokenizer = self.openclip_tokenizer
        for row in other_rows:
            text = texts[row]
            if not isinstance(text, str):
                openclip_rows.append(row)
                continue
            # OpenCLIP's own cleaning and split pattern: exact by construction.
            words = tokenizer.pat.findall(tokenizer.clean_fn(text))
            if any(word in SPECIAL_TOKEN_TEXTS for word in words):
                openclip_rows.append(row)
                continue
            word_rows.append(row)
            word_lists.append(words)
        for row, ids in zip(word_rows, self._rust_ids(self._words_bpe, word_lists, pretokenized=True)):
            id_lists[row] = ids
        self.route_counts["cleaned"] += len(word_rows)
        self.route_counts["openclip"] += len(openclip_rows)
        return id_lists, sorted(openclip_rows)

    def _rust_ids(self, bpe, inputs: Sequence, pretokenized: bool) -> List[List[int]]:
        ids: List[List[int]] = []
        with rust_parallelism(self.parallel):
            for start in range(0, len(inputs), _RUST_CHUNK):
                ids += encode_batch_ids(bpe, inputs[start:start + _RUST_CHUNK], pretokenized)
        return ids


def describe_tokenizer(tokenizer: Any) -> str:
    """Which tokenizer this is: clip_flash's fast one, or OpenCLIP's own and why it was kept."""
    if isinstance(tokenizer, FastCLIPTokenizer):
        return tokenizer.describe()
    refusal = fast_path_refusal(tokenizer)
    reason = refusal or "the fast path was not requested"
    return f"OpenCLIP's own {type(tokenizer).__name__}, unchanged ({reason})"


def get_tokenizer(model_name: str = "", context_length: Optional[int] = None, *,
                  fast: bool = True, **kwargs: Any) -> Any:
    """``open_clip.get_tokenizer(model_name, context_length, **kwargs)``, sped up where exact.

    Returns a ``FastCLIPTokenizer`` for OpenCLIP's default SimpleTokenizer, otherwise OpenCLIP's own
    tokenizer object unchanged (``fast=False`` forces that). Either way the call and the ids are OpenCLIP's.
    """
    import open_clip
    openclip_tokenizer = open_clip.get_tokenizer(model_name, context_length=context_length, **kwargs)
    refusal = fast_path_refusal(openclip_tokenizer) if fast else "fast=False"
    if refusal is None:
        tokenizer = FastCLIPTokenizer(openclip_tokenizer)
        logger.info("tokenizer for %r: %s", model_name, tokenizer.describe())
        return tokenizer
    logger.info("tokenizer for %r: OpenCLIP's own %s (%s)", model_name,
                type(openclip_tokenizer).__name__, refusal)
    return openclip_tokenizer
