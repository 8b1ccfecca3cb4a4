"""Check, once per process, that torchvision's CPU decoders give Pillow's pixels on this machine.

Both wrap libjpeg-turbo (and PNG is lossless), but the two wheels bundle their own copies, so the
exact path trusts torchvision only after it decoded a few small JPEGs (4:4:4, 4:2:2, 4:2:0,
progressive, grayscale, RGB-stored, odd sizes) and PNGs to the same bytes as Pillow. If they disagree,
Pillow decodes those formats instead: slower, still exact, and a warning says so.
"""
from __future__ import annotations

import functools
import io
import logging
from dataclasses import dataclass
from typing import List, Tuple

import numpy as np
import torch
from PIL import Image

logger = logging.getLogger(__name__)

JPEG_VARIANTS = (
    ("RGB", {"quality": 90, "subsampling": 0}),
    ("RGB", {"quality": 85, "subsampling": 1}),
    ("RGB", {"quality": 95, "subsampling": 2}),
    ("RGB", {"quality": 75, "progressive": True}),
    ("RGB", {"quality": 90, "keep_rgb": True}),
    ("L", {"quality": 90}),
)
PNG_MODES = ("RGB", "L")


@dataclass(frozen=True)
class DecoderAgreement:
    """Whether torchvision's CPU decoders matched Pillow's pixels here; ``details`` says where not."""

    jpeg: bool
    png: bool
    details: Tuple[str, ...] = ()


def _sample_image(mode: str, width: int = 67, height: int = 45, seed: int = 0) -> Image.Image:
    """A small image with smooth gradients and noise (chroma upsampling shows on both)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / width, y * 255 / height, (x + y) * 127 / (width + height)], axis=-1)
    pixels = np.clip(base + rng.normal(0, 25, base.shape), 0, 255).astype(np.uint8)
    image = Image.fromarray(pixels, "RGB")
    return image.convert(mode) if mode != "RGB" else image


def _same(data: bytes, decoder) -> bool:
    expected = np.asarray(Image.open(io.BytesIO(data)))
    if expected.ndim == 2:
        expected = expected[:, :, None]
    actual = decoder(torch.frombuffer(bytearray(data), dtype=torch.uint8)).permute(1, 2, 0).numpy()
    return actual.shape == expected.shape and bool((actual == expected).all())


@functools.lru_cache(maxsize=1)
def decoder_agreement() -> DecoderAgreement:
    """Decode the samples both ways (a few milliseconds); cached for the process."""
    try:
        from torchvision.io import decode_jpeg, decode_png
    except ImportError as error:  # torchvision missing or built for another torch
        reason = f"torchvision.io unavailable ({error}); Pillow decodes everything"
        logger.warning(reason)
        return DecoderAgreement(False, False, (reason,))
    details: List[str] = []
    jpeg_ok = png_ok = True
    for number, (mode, options) in enumerate(JPEG_VARIANTS):
        buffer = io.BytesIO()
        try:
            _sample_image(mode, seed=number).save(buffer, "JPEG", **options)
            agree = _same(buffer.getvalue(), decode_jpeg)
        except Exception as error:  # noqa: BLE001 - any trouble means: do not trust it
            agree, options = False, {**options, "error": str(error)}
        if not agree:
            jpeg_ok = False
            details.append(f"JPEG {mode} {options}: torchvision's pixels differ from Pillow's")
    for mode in PNG_MODES:
        buffer = io.BytesIO()
        _sample_image(mode, seed=7).save(buffer, "PNG")
        try:
            agree = _same(buffer.getvalue(), decode_png)
        except Exception:  # noqa: BLE001
            agree = False
        if not agree:
            png_ok = False
            details.append(f"PNG {mode}: torchvision's pixels differ from Pillow's")
    for line in details:
        logger.warning("%s; Pillow decodes these files instead (exact, slower)", line)
    return DecoderAgreement(jpeg_ok, png_ok, tuple(details))
