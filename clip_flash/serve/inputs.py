"""Turning a batch of request payloads into model inputs, per tower, in two steps the batcher runs on two
threads: ``host`` (CPU work: decoding, tokenizing) and ``device`` (uploading, resampling on the device), so the
next batch's CPU work overlaps this batch's device work.

``fast``: clip_flash's exact ``ImagePreprocessor`` (or nvJPEG with ``decode="gpu"``) and ``get_tokenizer``.
``stock``: OpenCLIP's own ``preprocess(Image.open(...))`` and tokenizer, one image at a time (a baseline).
Each ``device`` step returns groups of (positions in the batch, tensor) and the per-position failures.
"""
from __future__ import annotations

import io
import logging
import re
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .text_graphs import ReplayCosts, cheapest_groups
from .wire import padded_tokens

logger = logging.getLogger(__name__)

Group = Tuple[List[int], torch.Tensor]
Failures = List[Tuple[int, str]]

# Captions are sorted by token count and cut where the text tower's length buckets change, so short captions
# do not pay for a long one's length; a group smaller than this joins the next longer one (fewer launches).
MIN_TEXT_GROUP = 16
TEXT_LENGTH_BUCKETS = (8, 16, 24, 32, 48, 64)


# What the fast path (``clip_flash.inputs.image.image_decoding``) says of bytes Pillow cannot read as an image;
# --inputs stock says the same.
UNIDENTIFIED_IMAGE = "UnidentifiedImageError: Pillow cannot identify an image format in it"
# An object's default repr, as Pillow puts the file it was given in its messages: "<_io.BytesIO object at 0x7f...>"
OBJECT_REPR = re.compile(r"\s*<[\w.]+ object at 0x[0-9a-fA-F]+>")


def describe_error(error: BaseException) -> str:
    """``Type: message`` on one line, for a client: without the object reprs (addresses) a message may hold."""
    text = " ".join(OBJECT_REPR.sub("", str(error)).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def describe_image_error(error: BaseException) -> str:
    """``describe_error``, with the fast path's words for an image Pillow cannot identify."""
    from PIL import UnidentifiedImageError

    return UNIDENTIFIED_IMAGE if isinstance(error, UnidentifiedImageError) else describe_error(error)


class FastImageInputs:
    """clip_flash's ``ImagePreprocessor``: bit for bit OpenCLIP's ``preprocess`` (``decode="cpu"``)."""

    def __init__(self, preprocess: Any, device: torch.device, dtype: torch.dtype, decode: str,
                 workers: Optional[int], batch_size: int, split_jpegs: bool = True) -> None:
        from clip_flash.inputs.image.preprocessor import ImagePreprocessor

        self.preparer = ImagePreprocessor(preprocess, device=device, dtype=dtype, decode=decode, workers=workers,
                                          start=False, split_jpegs=split_jpegs)
        self.preparer.start(batch_size=batch_size)
        self.output_size = self.preparer.output_size

    @property
    def launches_early(self) -> bool:
        """Whether ``host`` can hand out the batch's layout before decoding it (see ``device_early``)."""
        return self.preparer.launches_early

    def host(self, payloads: Sequence[bytes], on_layout: Optional[Callable[[Any], None]] = None) -> Any:
        return self.preparer.decode(payloads, on_layout=on_layout)

    def device(self, host: Any) -> Tuple[List[Group], Failures]:
        prepared = self.preparer.prepare(host)
        groups = [(list(prepared.indices), prepared.pixels)] if prepared.indices else []
        return groups, list(prepared.failures)

    def device_early(self, layout: Any) -> List[Group]:
        """The device step of the layout ``host`` handed to ``on_layout``, queued behind what the current stream
        holds (the batcher's gate, opened when ``host`` returns)."""
        prepared = self.preparer.prepare_layout(layout)
        return [(list(prepared.indices), prepared.pixels)] if prepared.indices else []

    @staticmethod
    def early_failures(host: Any) -> Optional[Failures]:
        """The batch's failures when the layout handed out early was the whole batch as decoded (its rows from
        ``device_early`` are then the batch's); None when it was not (the batch must go through ``device``)."""
        return list(host.failures) if host.early_layout_is_batch else None

    def close(self) -> None:
        self.preparer.close()


class StockImageInputs:
    """OpenCLIP's ``preprocess(Image.open(file))``, image by image on the CPU, as a user's server does it."""

    def __init__(self, preprocess: Any, device: torch.device, dtype: torch.dtype, output_size: Tuple[int, int]):
        self.preprocess = preprocess
        self.target = device
        self.dtype = dtype
        self.output_size = output_size

    def host(self, payloads: Sequence[bytes]) -> Tuple[List[int], List[torch.Tensor], Failures]:
        from PIL import Image

        positions, rows, failures = [], [], []
        for position, payload in enumerate(payloads):
            try:
                rows.append(self.preprocess(Image.open(io.BytesIO(payload))))
                positions.append(position)
            except Exception as error:  # noqa: BLE001 - one bad image never fails its neighbours
                failures.append((position, describe_image_error(error)))
        return positions, rows, failures

    def device(self, host: Tuple[List[int], List[torch.Tensor], Failures]) -> Tuple[List[Group], Failures]:
        positions, rows, failures = host
        if not rows:
            return [], failures
        batch = torch.stack(rows).to(self.target, self.dtype, non_blocking=True)
        return [(positions, batch)], failures

    def close(self) -> None:
        pass


class TextInputs:
    """Captions to token ids (clip_flash's tokenizer, or OpenCLIP's own), grouped by length when the text
    tower skips padding. A payload is a caption (tokenized here) or its ids already (``wire.token_bytes``,
    from a frontend process that ran the same tokenizer): those are only padded into the batch's tensor.

    ``name``: the ``get_tokenizer`` name giving this tokenizer's ids in any process (None: the ids are only
    computed here); ``remote_spec`` is then (name, context length).
    """

    def __init__(self, tokenizer: Any, context_length: int, group_by_length: bool,
                 name: Optional[str] = None) -> None:
        self.tokenizer = tokenizer
        self.context_length = context_length
        self.group_by_length = group_by_length
        self.remote_spec = (name, context_length) if name is not None else None
        # Set once the text graphs are captured and timed: groups are then cut where their replays cost least.
        self.replay_costs: Optional[ReplayCosts] = None

    def host(self, payloads: Sequence[Any]) -> Tuple[torch.Tensor, List[int]]:
        captions = [position for position, payload in enumerate(payloads) if type(payload) is not bytes]
        if not captions:  # ids from the frontends (the usual case): counted in numpy, no torch op on the host
            ids = padded_tokens(payloads, self.context_length)
            return torch.from_numpy(ids), np.count_nonzero(ids, axis=1).tolist()
        if len(captions) == len(payloads):
            tokens = self.tokenizer(list(payloads), context_length=self.context_length)
        else:  # both kinds (a frontend's first requests, before it had loaded the tokenizer)
            ids = [position for position, payload in enumerate(payloads) if type(payload) is bytes]
            tokens = torch.zeros((len(payloads), self.context_length), dtype=torch.long)
            tokens[captions] = self.tokenizer([payloads[p] for p in captions], context_length=self.context_length)
            tokens[ids] = torch.from_numpy(padded_tokens([payloads[p] for p in ids], self.context_length))
        counts = (tokens != 0).sum(dim=1).tolist()  # id 0 pads; SOT and EOT count, as OpenAI's usage does
        return tokens, counts

    def device(self, host: Tuple[torch.Tensor, List[int]]) -> Tuple[List[Group], Failures]:
        tokens, counts = host
        # Tokens stay on the CPU: the encoder picks its length bucket from them without a device sync.
        if not self.group_by_length or len(counts) <= 1 or (self.replay_costs is None
                                                            and len(counts) <= MIN_TEXT_GROUP):
            return [(list(range(len(counts))), tokens)], []
        if self.replay_costs is not None:
            groups, replays_ms = cheapest_groups(counts, self.replay_costs)
            if self.replay_costs.packed(sum(counts)) < replays_ms:
                # The whole batch as one group: its packed replay (``CheapestTextEncode``) costs less than the
                # groups' replays, so less than one replay of it too, and the encoder takes the packed route.
                return [(list(range(len(counts))), tokens)], []
        else:
            groups = length_groups(counts)
        if len(groups) == 1:
            return [(list(range(len(counts))), tokens)], []
        # One gather into length order, then views: an index per group costs more than its tensor. In numpy, on
        # this thread: a torch op on the CPU may use torch's intra-op threads, which spin beside the engine's.
        order = np.fromiter((position for positions in groups for position in positions), dtype=np.int64,
                            count=len(counts))
        ordered = torch.from_numpy(tokens.numpy()[order])
        out, start = [], 0
        for positions in groups:
            out.append((positions, ordered[start:start + len(positions)]))
            start += len(positions)
        return out, []

    def close(self) -> None:
        pass


def length_groups(counts: Sequence[int], buckets: Sequence[int] = TEXT_LENGTH_BUCKETS,
                  min_group: int = MIN_TEXT_GROUP) -> List[List[int]]:
    """Positions sorted by token count, cut where the length bucket changes; groups under ``min_group``
    join the next longer one (the last joins the previous). Computed per bucket, not per caption."""
    counts = np.asarray(counts)
    order = np.argsort(counts, kind="stable")
    # a count's bucket: the first limit it fits in (past the last: one bucket of its own)
    sorted_buckets = np.searchsorted(np.asarray(buckets), counts[order], side="left")
    changes = (np.flatnonzero(np.diff(sorted_buckets)) + 1).tolist()
    groups: List[List[int]] = []
    start = 0
    for cut in changes:
        if cut - start >= min_group:
            groups.append(order[start:cut].tolist())
            start = cut
    if start < len(order):
        rest = order[start:].tolist()
        if groups and len(rest) < min_group:
            groups[-1].extend(rest)
        else:
            groups.append(rest)
    return groups
