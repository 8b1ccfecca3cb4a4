"""The exact resize step: decoded uint8 pixels to the model's input rows, as ``preprocess`` computes them.

Runs clip_flash's Pillow-exact resampling (``clip_flash.ops.image_resample``: a CUDA kernel on the
GPU, the same integer arithmetic in PyTorch on the CPU) with the transform read from ``preprocess``
by ``spec_from_preprocess``.
"""
from __future__ import annotations

import logging
from typing import Callable, List, Sequence, Tuple

import numpy as np
import torch
from PIL import Image

logger = logging.getLogger(__name__)

try:  # the arithmetic lives in its own modules (another branch until merged)
    from ..ops.image_resample import resample_batch
    from .transform_spec import spec_from_preprocess
except ImportError:  # pragma: no cover - only before the resample modules exist
    resample_batch = spec_from_preprocess = None


def pil_image_of(pixels: torch.Tensor) -> Image.Image:
    """The L or RGB PIL image whose pixels are ``pixels`` (uint8 ``(H, W, C)``, C in {1, 3})."""
    array = np.ascontiguousarray(pixels.cpu().numpy())
    return Image.fromarray(array[:, :, 0], "L") if array.shape[-1] == 1 else Image.fromarray(array, "RGB")


class ExactResize:
    """``preprocess``'s resize, crop, ToTensor and Normalize for uint8 L/RGB pixels, on ``device``."""

    def __init__(self, preprocess: Callable[[Image.Image], torch.Tensor], device: torch.device,
                 dtype: torch.dtype) -> None:
        self.preprocess = preprocess
        self.device = device
        self.dtype = dtype
        if spec_from_preprocess is not None:
            self.spec = spec_from_preprocess(preprocess)  # UnsupportedTransformError: refused, not guessed
            size = self.spec.size
            self.output_size: Tuple[int, int] = (size, size) if isinstance(size, int) else tuple(size)
        else:
            self.spec = None
            self.output_size = tuple(preprocess(Image.new("RGB", (7, 5))).shape[-2:])
            logger.warning("clip_flash.ops.image_resample is missing: Pillow resizes on the CPU (exact, slow)")

    def __call__(self, pixels: Sequence[torch.Tensor]) -> torch.Tensor:
        """``(n, 3, H, W)`` in ``dtype`` on ``device`` for ``n`` uint8 ``(h, w, c)`` images."""
        if resample_batch is not None:
            return resample_batch(list(pixels), self.spec, self.device, self.dtype)
        rows: List[torch.Tensor] = [self.preprocess(pil_image_of(image)) for image in pixels]
        return torch.stack(rows).to(self.device, self.dtype)
