"""nvJPEG decoding of a batch's JPEGs (``decode="gpu"``): fast, and NOT Pillow's pixels.

nvJPEG upsamples 4:2:0 / 4:2:2 chroma by repetition where libjpeg-turbo (Pillow's decoder) interpolates,
so its pixels differ from Pillow's by up to tens of levels on real photos. With ``chroma="libjpeg"``
the chroma is recovered and re-upsampled the libjpeg-turbo way (:mod:`.jpeg_chroma`), which brings it
close (not exact). ``scripts/image_fast_path_deviation.py`` measures both against the exact path.
Whatever nvJPEG refuses goes back to the exact CPU decode.
"""
from __future__ import annotations

import logging
from typing import Dict, List, Tuple

import torch

from .image_decoding import DecodedItem, describe_error
from .jpeg_chroma import SUBSAMPLING, refine_nearest_chroma

logger = logging.getLogger(__name__)


CHROMA = ("nvjpeg", "libjpeg")


def decode_jpegs_on_gpu(items: List[DecodedItem], device: torch.device, chroma: str = "nvjpeg"
                        ) -> Tuple[List[Tuple[DecodedItem, torch.Tensor]], List[Tuple[DecodedItem, str]]]:
    """``(item, (H, W, C) uint8 on device)`` for each JPEG nvJPEG decoded; the others with the reason."""
    decoded, refused = _decode(items, device)
    if chroma == "libjpeg":
        decoded = _refine_chroma(decoded)
    return decoded, refused


def _refine_chroma(decoded: List[Tuple[DecodedItem, torch.Tensor]]) -> List[Tuple[DecodedItem, torch.Tensor]]:
    """libjpeg-style chroma for the subsampled colour JPEGs, batched over images of one size and sampling."""
    groups: Dict[Tuple, List[int]] = {}
    for position, (item, pixels) in enumerate(decoded):
        if item.channels == 3 and item.jpeg_sampling in SUBSAMPLING:
            groups.setdefault((tuple(pixels.shape), item.jpeg_sampling), []).append(position)
    result = list(decoded)
    for (_, sampling), positions in groups.items():
        refined = refine_nearest_chroma(torch.stack([decoded[position][1] for position in positions]), sampling)
        for row, position in enumerate(positions):
            result[position] = (decoded[position][0], refined[row])
    return result


def _decode(items: List[DecodedItem], device: torch.device
            ) -> Tuple[List[Tuple[DecodedItem, torch.Tensor]], List[Tuple[DecodedItem, str]]]:
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
