"""``get_tokenizer(model_name)``: OpenCLIP's tokenizer, with OpenCLIP's exact ids, computed faster.

For OpenCLIP's ``SimpleTokenizer`` in its default setting (OpenAI BPE, ``clean='lower'``, truncation, no
extra special tokens: the ViT-* CLIP models) the result is a ``FastCLIPTokenizer``. Each text takes the
cheapest route that still gives OpenCLIP's ids:

- ``plain``: printable ASCII without ``&`` (most captions). OpenCLIP's cleaning reduces to whitespace
  collapsing and lower-casing there (proof in ``text_cleaning``); one regex scan of the batch finds them.
- ``replayed``: any other text. OpenCLIP's ``basic_clean`` (ftfy, html unescaping) is replayed with ftfy's
  own functions, skipping the steps proven to be the identity (``ftfy_replay``: several times faster than
  ``ftfy.fix_text``, the same text), then whitespace collapsing and lower-casing as OpenCLIP does them.
- ``cleaned``: where the replay is refused (another ftfy version, a text over ftfy's segment length):
  OpenCLIP's own cleaning and own compiled split pattern run in Python (exact by construction).
- ``openclip``: a text that is not a ``str``, a cleaned text holding the batch boundary character, or a
  ``context_length`` below 2: OpenCLIP's own tokenizer (which raises for you where it raises).

On the first two routes the batch is cut into whitespace-free chunks in one pass (``fast_chunks``) and
each chunk's ids come from ``chunk_ids.ChunkIds``: OpenCLIP's own split pattern and OpenCLIP's vocabulary
and merges in Hugging Face ``tokenizers`` (Rust), once per distinct chunk, then one dictionary lookup per
chunk and a numpy gather. On the ``cleaned`` route the words' ids come from ``fast_bpe.WordIds``. SOT/EOT,
truncation and padding are numpy array operations. Everything runs in the calling process: worker processes
tokenizing slices of a batch ran at 0.66x and 0.95x of this on two cores (``benchmarks/results/cpu-2core/
tokenizer_pool.md``), and one process's 137,000 web-style captions/s on the 16-core GPU host is above what the
patched text towers encode there.

Any other tokenizer (``reduction_mask`` variants, ``clean='whitespace'``/``'canonicalize'``, SigLIP's and
other Hugging Face tokenizers, extra special tokens) is returned unchanged: OpenCLIP's own object.
``describe_tokenizer`` says which one you got and why; ``get_tokenizer`` logs it.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch

from .chunk_ids import ChunkIds
from .ftfy_replay import replay_basic_clean, replay_refusal
from .fast_bpe import (BOUNDARY_WORD, WordIds, as_long_tensor, causal_merge_violations, fill_rows, new_result,
                       ordered_merges)
from .text_cleaning import SPECIAL_TOKEN_TEXTS, fast_chunks, suspect_rows

logger = logging.getLogger(__name__)


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
    tokenizer's own. ``parallel=False`` keeps the Rust BPE of new words on the calling thread.
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
        self.word_ids = WordIds(openclip_tokenizer.encoder, openclip_tokenizer.bpe_ranks, parallel=parallel)
        special_ids = {text: openclip_tokenizer.encoder[text] for text in SPECIAL_TOKEN_TEXTS}
        self.chunk_ids = ChunkIds(self.word_ids, openclip_tokenizer.pat.findall, special_ids)
        # Counts of texts per route since construction, for reports and tests.
        self.route_counts = {"plain": 0, "replayed": 0, "cleaned": 0, "openclip": 0}
        # Seconds spent per stage in this process since construction (the bench prints them).
        self.stage_seconds: Dict[str, float] = {}
        # Why OpenCLIP's ftfy cleaning cannot be replayed here (then suspects take OpenCLIP's own), or None.
        self.replay_refusal = replay_refusal()
        self.replay = self.replay_refusal is None
        if not self.replay:
            logger.info("clip_flash tokenizer: %s; non-plain texts take OpenCLIP's own cleaning (same ids, slower)",
                        self.replay_refusal)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names this class lacks: everything else is OpenCLIP's tokenizer's.
        if name == "openclip_tokenizer":
            raise AttributeError(name)
        return getattr(self.openclip_tokenizer, name)

    def describe(self) -> str:
        """One line: what runs, and how many texts took each route so far."""
        counts = ", ".join(f"{route} {count}" for route, count in self.route_counts.items())
        cleaning = ("OpenCLIP's ftfy cleaning replayed for non-plain text" if self.replay else
                    f"OpenCLIP's own cleaning for non-plain text: {self.replay_refusal}")
        return ("clip_flash FastCLIPTokenizer over OpenCLIP's SimpleTokenizer (Rust BPE with OpenCLIP's "
                f"vocabulary; {cleaning}); texts so far: {counts}")

    def __repr__(self) -> str:
        return f"<{self.describe()}>"

    def __call__(self, texts: Union[str, Sequence[str]],
                 context_length: Optional[int] = None) -> torch.LongTensor:
        """Token ids of ``texts``, shape [len(texts), context_length]: exactly OpenCLIP's."""
        if isinstance(texts, str):
            texts = [texts]
        texts = list(texts)
        context_length = context_length or self.openclip_tokenizer.context_length
        assert context_length, "Please set a valid context length"
        if context_length < 2:
            self.route_counts["openclip"] += len(texts)
            return self.openclip_tokenizer(texts, context_length=context_length)
        return self._tokenize(texts, context_length)

    def _tokenize(self, texts: Sequence[Any], context_length: int) -> torch.Tensor:
        """``__call__`` in this process, for ``context_length`` >= 2."""
        clock = self._stage_clock()
        result = new_result(len(texts), context_length)
        sot, eot = self.openclip_tokenizer.sot_token_id, self.openclip_tokenizer.eot_token_id
        openclip_rows = [row for row, text in enumerate(texts) if not isinstance(text, str)]
        if openclip_rows:
            string_rows = [row for row, text in enumerate(texts) if isinstance(text, str)]
            suspects = [string_rows[index] for index in suspect_rows([texts[row] for row in string_rows])]
        else:
            suspects = suspect_rows(texts)
        clock("find plain texts")
        # Suspects: OpenCLIP's basic_clean replayed (ftfy's own steps, the identities skipped), if allowed.
        replayed_rows: List[int] = []
        replayed_texts: List[str] = []
        other_rows = []
        for row in suspects:
            cleaned = replay_basic_clean(texts[row]) if self.replay else None
            if cleaned is None or BOUNDARY_WORD in cleaned:
                other_rows.append(row)
            else:
                replayed_rows.append(row)
                replayed_texts.append(cleaned)
        clock("replay ftfy cleaning")

        plain_rows: List[int] = []
        if len(suspects) < len(texts) - len(openclip_rows):
            excluded = set(suspects).union(openclip_rows)
            plain_rows = [row for row in range(len(texts)) if row not in excluded]
        self.route_counts["plain"] += len(plain_rows)
        self.route_counts["replayed"] += len(replayed_rows)
        fast_rows = plain_rows + replayed_rows
        if fast_rows:
            # Two joins: the plain texts' stays ASCII, which str.lower and str.split run fastest on.
            chunks = fast_chunks([texts[row] for row in plain_rows], BOUNDARY_WORD)
            chunks += fast_chunks(replayed_texts, BOUNDARY_WORD)
            clock("cut chunks")
            flat_ids = self.chunk_ids.flat_ids(chunks)
            clock("chunk ids")
            fill_rows(result, fast_rows, flat_ids, sot, eot)
            clock("fill rows")

        if other_rows:
            words_per_text = self._clean_and_split([texts[row] for row in other_rows])
            cleaned_rows, words = self._flatten_words(other_rows, words_per_text, openclip_rows)
            if cleaned_rows:
                fill_rows(result, cleaned_rows, self.word_ids.flat_ids(words), sot, eot)
            self.route_counts["cleaned"] += len(cleaned_rows)
            clock("OpenCLIP cleaning (replay refused)")
        self.route_counts["openclip"] += len(openclip_rows)
        output = as_long_tensor(result)
        if openclip_rows:
            openclip_rows.sort()
            output[openclip_rows] = self.openclip_tokenizer([texts[row] for row in openclip_rows],
                                                            context_length=context_length)
        return output

    def _stage_clock(self):
        """A function that adds the seconds since its last call (or since now) to ``stage_seconds[name]``."""
        last = [time.perf_counter()]

        def clock(name: str) -> None:
            now = time.perf_counter()
            self.stage_seconds[name] = self.stage_seconds.get(name, 0.0) + now - last[0]
            last[0] = now
        return clock

    def _clean_and_split(self, texts: Sequence[str]) -> List[Optional[List[str]]]:
        """Per text, OpenCLIP's words (its ``pat.findall(clean_fn(text))``), or None when the cleaned text
        holds the boundary character (then OpenCLIP's own tokenizer does the text)."""
        clean_fn, pattern = self.openclip_tokenizer.clean_fn, self.openclip_tokenizer.pat
        out: List[Optional[List[str]]] = []
        for text in texts:
            cleaned = clean_fn(text)
            out.append(None if BOUNDARY_WORD in cleaned else pattern.findall(cleaned))
        return out

    @staticmethod
    def _flatten_words(rows: Sequence[int], words_per_text: Sequence[Optional[List[str]]],
                       openclip_rows: List[int]) -> Tuple[List[int], List[str]]:
        """The words of OpenCLIP's cleaning and split (see ``cleaning_pool.clean_and_split``) as one flat
        list with boundaries; rows only OpenCLIP's tokenizer may do are appended to ``openclip_rows``."""
        kept_rows: List[int] = []
        words: List[str] = []
        for row, text_words in zip(rows, words_per_text):
            # None: the cleaned text held the boundary character (OpenCLIP's cleaning removes it, but
            # that is ftfy's business, not ours). A special token's spelling becomes its id in OpenCLIP.
            if text_words is None or any(word in SPECIAL_TOKEN_TEXTS for word in text_words):
                openclip_rows.append(row)
                continue
            kept_rows.append(row)
            words += text_words
            words.append(BOUNDARY_WORD)
        return kept_rows, words


def _tokenizers_installed() -> bool:
    try:
        import tokenizers
    except ImportError:
        return False
    return hasattr(tokenizers, "Tokenizer")


def describe_tokenizer(tokenizer: Any) -> str:
    """Which tokenizer this is: clip_flash's fast one, or OpenCLIP's own and why it was kept."""
    if isinstance(tokenizer, FastCLIPTokenizer):
        return tokenizer.describe()
    refusal = fast_path_refusal(tokenizer)
    if refusal is None:
        return f"OpenCLIP's own {type(tokenizer).__name__} (clip_flash.get_tokenizer would speed it up)"
    return f"OpenCLIP's own {type(tokenizer).__name__}, unchanged ({refusal})"


def get_tokenizer(model_name: str = "", context_length: Optional[int] = None, *,
                  fast: bool = True, **kwargs: Any) -> Any:
    """``open_clip.get_tokenizer(model_name, context_length, **kwargs)``, sped up where exact.

    Returns a ``FastCLIPTokenizer`` for OpenCLIP's default SimpleTokenizer, otherwise OpenCLIP's own
    tokenizer object unchanged (``fast=False`` forces that). Either way the call and the ids are OpenCLIP's.
    """
    import open_clip
    openclip_tokenizer = open_clip.get_tokenizer(model_name, context_length=context_length, **kwargs)
    refusal = fast_path_refusal(openclip_tokenizer) if fast else "fast=False"
    if refusal is None and not _tokenizers_installed():
        refusal = "Hugging Face tokenizers is not installed (pip install tokenizers)"
    if refusal is None:
        tokenizer = FastCLIPTokenizer(openclip_tokenizer)
        logger.info("tokenizer for %r: %s", model_name, tokenizer.describe())
        return tokenizer
    log = logger.warning if "not installed" in refusal else logger.info
    log("tokenizer for %r: OpenCLIP's own %s (%s)", model_name, type(openclip_tokenizer).__name__, refusal)
    return openclip_tokenizer
