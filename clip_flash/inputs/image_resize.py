"""The exact resize step: decoded uint8 pixels to the model's input rows, as ``preprocess`` computes them.

Three implementations give the same bits (each is tested against ``preprocess``):

- ``kernel``: clip_flash's CUDA kernel (``clip_flash.ops.image_resample``), one launch per batch;
- ``torch``: the same fixed-point arithmetic in plain PyTorch on the CPU (the kernel's reference);
- ``pillow``: Pillow itself, through ``preprocess`` on the pixels (faster than ``torch`` on a CPU).

``auto`` takes the kernel on a GPU and Pillow on the CPU (or on a GPU whose kernel is not built).
"""
from __future__ import annotations

import logging
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch
from PIL import Image

from .pillow_resample import preprocess_batch_cpu
from .transform_spec import spec_from_preprocess

logger = logging.getLogger(__name__)

RESIZERS = ("auto", "kernel", "torch", "pillow")


def _kernel_resample() -> Tuple[Optional[Callable], str]:
    """``resample_batch`` of the CUDA kernel, or None and why it cannot run."""
    try:
        from ..ops.image_resample import resample_batch
    except ImportError as error:
        return None, f"clip_flash.ops.image_resample is not importable ({error})"
    return resample_batch, ""


def pil_image_of(pixels: torch.Tensor) -> Image.Image:
    """The L or RGB PIL image whose pixels are ``pixels`` (uint8 ``(H, W, C)``, C in {1, 3})."""
    array = np.ascontiguousarray(pixels.cpu().numpy())
    return Image.fromarray(array[:, :, 0], "L") if array.shape[-1] == 1 else Image.fromarray(array, "RGB")


class ExactResize:
    """``preprocess``'s resize, crop, ToTensor and Normalize for uint8 L/RGB pixels, onto ``device``.

    Raises ``UnsupportedTransformError`` for a transform that is not one of OpenCLIP's eval shapes:
    such a transform is refused, never approximated.
    """

    def __init__(self, preprocess: Callable[[Image.Image], torch.Tensor], device: torch.device,
                 dtype: torch.dtype, resize: str = "auto") -> None:
        if resize not in RESIZERS:
            raise ValueError(f"resize must be one of {RESIZERS}, got {resize!r}")
        self.preprocess = preprocess
        self.device = device
        self.dtype = dtype
        self.spec = spec_from_preprocess(preprocess)
        self.output_size: Tuple[int, int] = tuple(self.spec.size)
        self._kernel: Optional[Callable] = None
        if resize in ("auto", "kernel") and device.type == "cuda":
            self._kernel, why_not = _kernel_resample()
            if self._kernel is None:
                if resize == "kernel":
                    raise RuntimeError(f"resize='kernel' asked for, but {why_not}")
                logger.warning("%s: Pillow resizes on the CPU (exact, slower)", why_not)
        elif resize == "kernel":
            raise ValueError("resize='kernel' needs a CUDA device")
        self.implementation = "kernel" if self._kernel is not None else ("torch" if resize == "torch" else "pillow")

    def __call__(self, pixels: Sequence[torch.Tensor]) -> torch.Tensor:
        """``(n, 3, H, W)`` in ``dtype`` on ``device`` for ``n`` uint8 ``(h, w, c)`` images."""
        if self._kernel is not None:
            return self._kernel(list(pixels), self.spec, self.device, self.dtype)
        if self.implementation == "torch":
            rows = preprocess_batch_cpu([image.cpu() for image in pixels], self.spec, self.dtype)
            return rows.to(self.device)
        stacked: List[torch.Tensor] = [self.preprocess(pil_image_of(image)) for image in pixels]
        height, width = self.output_size
        if not stacked:
            return torch.empty((0, 3, height, width), dtype=self.dtype, device=self.device)
        return torch.stack(stacked).to(self.device, self.dtype)
