"""nvJPEG decoding of a batch's JPEGs (``decode="gpu"``): fast, and NOT Pillow's pixels.

nvJPEG upsamples chroma and converts YCbCr to RGB its own way, so its pixels differ from
libjpeg-turbo's (and so Pillow's) by up to tens of levels on real photos; ``scripts/
image_fast_path_deviation.py`` measures the pixel difference and the embedding cosine against the
exact path. Whatever nvJPEG refuses goes back to the exact CPU decode.
"""
from __future__ import annotations

import logging
from typing import List, Tuple

import torch

from .image_decoding import DecodedItem, describe_error

logger = logging.getLogger(__name__)


def decode_jpegs_on_gpu(items: List[DecodedItem], device: torch.device
                        ) -> Tuple[List[Tuple[DecodedItem, torch.Tensor]], List[Tuple[DecodedItem, str]]]:
    """``(item, (H, W, C) uint8 on device)`` for each JPEG nvJPEG decoded; the others with the reason."""
    from torchvision.io import decode_jpeg

    if not items:
        return [], []
    try:
        outputs = decode_jpeg([item.encoded for item in items], device=device)
        pairs = list(zip(items, outputs))
    except Exception as error:  # noqa: BLE001 - one bad file fails the batched call: retry one by one
        logger.debug("batched nvJPEG decode failed (%s); decoding one by one", describe_error(error))
        pairs, refused = [], []
        for item in items:
            try:
                pairs.append((item, decode_jpeg(item.encoded, device=device)))
            except Exception as single_error:  # noqa: BLE001
                refused.append((item, describe_error(single_error)))
        return _check_shapes(pairs, refused)
    return _check_shapes(pairs, [])


def _check_shapes(pairs, refused):
    decoded = []
    for item, chw in pairs:
        if tuple(chw.shape) != (item.channels, *item.image_size):
            refused.append((item, f"nvJPEG gave shape {tuple(chw.shape)}, Pillow's header says "
                                  f"{(item.channels, *item.image_size)}"))
        else:
            decoded.append((item, chw.permute(1, 2, 0).contiguous()))  # nvJPEG writes planes; the resize reads HWC
    return decoded, refused
