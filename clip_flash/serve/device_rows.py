"""A batch's embeddings from the device to the host, in the batcher's ``launch`` stage: the encoder called with out of
memory retried in halves, the groups' rows put in batch order on the device, and one asynchronous copy to
page-locked memory."""
from __future__ import annotations

import logging
from typing import Callable, List, Optional, Tuple

import torch

logger = logging.getLogger(__name__)


def encode_in_pieces(encode: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``encode(x)``; out of device memory, the two halves separately (recursively, down to one row, which
    then raises). The embeddings are the same either way: rows are independent."""
    try:
        return encode(x)
    except torch.cuda.OutOfMemoryError:
        if x.shape[0] <= 1:
            raise
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        half = (x.shape[0] + 1) // 2
        logger.warning("out of device memory encoding %d rows: retrying as %d + %d", x.shape[0], half,
                       x.shape[0] - half)
        return torch.cat([encode_in_pieces(encode, x[:half]), encode_in_pieces(encode, x[half:])])


def in_batch_order(encoded: List[Tuple[List[int], torch.Tensor]], size: int) -> torch.Tensor:
    """The groups' ``(2, rows, width)`` outputs (raw, normalised) as one ``(2, size, width)`` tensor on their
    device, row ``p`` being position ``p``'s (rows of positions no group covers are left unset): one copy to
    the host and no reordering there."""
    if len(encoded) == 1 and encoded[0][1].shape[1] == size and encoded[0][0] == list(range(size)):
        return encoded[0][1]
    rows = torch.cat([tensor for _, tensor in encoded], dim=1) if len(encoded) > 1 else encoded[0][1]
    positions = torch.tensor([position for positions, _ in encoded for position in positions], dtype=torch.long)
    out = rows.new_empty((2, size, rows.shape[2]))
    return out.index_copy_(1, positions.to(rows.device, non_blocking=True), rows)


def to_host(features: torch.Tensor, copy_stream: Optional["torch.cuda.Stream"]
             ) -> Tuple[torch.Tensor, Optional["torch.cuda.Event"]]:
    """(page-locked host tensor, event recorded after the copy into it): the copy is queued on ``copy_stream``
    behind the work that computes ``features``, without waiting (the ``answer`` stage waits on the event); on the
    CPU, ``features`` as they are and no event."""
    if features.device.type != "cuda":
        return features.contiguous(), None
    host = torch.empty(features.shape, dtype=features.dtype, pin_memory=True)
    copy_stream.wait_stream(torch.cuda.current_stream(features.device))
    with torch.cuda.stream(copy_stream):
        host.copy_(features, non_blocking=True)
        done = torch.cuda.Event()
        done.record(copy_stream)
    features.record_stream(copy_stream)  # its memory is not handed out again before the copy has read it
    return host, done
