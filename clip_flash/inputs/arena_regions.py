"""One decoding task's inputs decoded into its own region of a page-locked arena (see :mod:`.pixel_arena`):
the task, run by a pool thread or a worker process, and what it reports back."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Tuple

import numpy as np
import torch

from .image_decoding import DecodedItem, DecodeOptions, decode_item
from .jpeg_dct import ALIGN
from .pixel_arena import write_pixels


@dataclass
class RegionResult:
    """One task's inputs decoded into its region of an arena (see :mod:`.pixel_arena`)."""

    start: int              # the region's byte offset in the arena
    items: List[DecodedItem]
    offsets: List[int]      # per item: where its pixels (or JPEG bytes) start in the region; -1: not there
    sizes: List[int]        # per item: how many bytes are there
    used: int               # pixel bytes written, back to back from ``start + pixels_from``
    needed: int             # bytes all the items' payloads needed (more than written when some did not fit)
    pixels_from: int = 0    # where the pixels start in the region (JPEG coefficients come first)


def decode_into_region(pairs: List[Tuple[int, Any]], options: DecodeOptions, region: np.ndarray
                       ) -> Tuple[List[DecodedItem], List[int], List[int], int, int, int]:
    """Decode into ``region``: JPEG coefficients (the GPU route, see :mod:`.jpeg_dct`) are written there as they
    are read, each from a 128-byte boundary; then the pixels, back to back from ``pixels_from``. Whatever did
    not fit stays on its item. On the fast path (``keep_jpeg_bytes``) the JPEG bytes go there instead of pixels,
    for nvJPEG to read from page-locked memory; the pixels of other images then stay on their items.
    Returns (items, offsets: -1 where not written, sizes, pixel bytes, bytes all needed, pixels_from)."""
    room = torch.from_numpy(region) if options.dct_reader is not None and region.size else None
    cursor = -region.ctypes.data % ALIGN if room is not None else 0
    items, offsets, sizes = [], [], []
    for index, item in pairs:
        scratch = room[cursor:] if room is not None and cursor < region.size else None
        decoded = decode_item(index, item, options, scratch)
        written = (scratch is not None and decoded.coefficients is not None
                   and decoded.coefficients.data_ptr() == scratch.data_ptr())
        offsets.append(cursor if written else -1)
        sizes.append(decoded.coefficients.numel() if written else 0)
        if written:
            cursor += -(-sizes[-1] // ALIGN) * ALIGN
            decoded.coefficients = None
        items.append(decoded)
    needed = sum(sizes) + sum(item.coefficients.numel() for item in items if item.coefficients is not None)
    pixels_from = min(cursor, region.size)
    field = "encoded" if options.keep_jpeg_bytes else "pixels"
    payloads = [getattr(item, field) for item in items]
    placed, used, pixel_bytes = write_pixels(region[pixels_from:], payloads)
    for position, (item, offset, payload) in enumerate(zip(items, placed, payloads)):
        if offset >= 0:
            offsets[position], sizes[position] = pixels_from + offset, payload.numel()
            setattr(item, field, None)
    return items, offsets, sizes, used, needed + pixel_bytes, pixels_from
