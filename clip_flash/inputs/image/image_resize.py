"""The exact resize step: decoded uint8 pixels to the model's input rows, as ``preprocess`` computes them.

Three implementations give the same bits (each is tested against ``preprocess``):

- ``kernel``: clip_flash's CUDA kernel (``clip_flash.ops.image_resample``): the whole batch packed in one
  buffer (per-image layout, Pillow's fixed-point tap tables, the pixels), one upload, one launch;
- ``torch``: the same fixed-point arithmetic in plain PyTorch on the CPU (the kernel's reference);
- ``pillow``: Pillow itself, through ``preprocess`` on the pixels (faster than ``torch`` on a CPU).

``auto`` takes the kernel on a GPU and Pillow on the CPU (or on a GPU without the compiled kernel, or
where the installed Pillow computes differently from the arithmetic the kernel models).
"""
from __future__ import annotations

import functools
import logging
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch
from PIL import Image

from ...ops.image_resample import BatchPlan, DeviceFill, kernel_usable, plan_batch, resample_packed
from .pillow_resample import PillowMismatchError, pillow_disagreement, preprocess_batch_cpu
from .transform_spec import spec_from_preprocess

logger = logging.getLogger(__name__)

RESIZERS = ("auto", "kernel", "torch", "pillow")
CopyMany = Callable[[List[torch.Tensor], List[torch.Tensor]], None]


def pil_image_of(pixels: torch.Tensor) -> Image.Image:
    """The L or RGB PIL image whose pixels are ``pixels`` (uint8 ``(H, W, C)``, C in {1, 3})."""
    array = np.ascontiguousarray(pixels.cpu().numpy())
    return Image.fromarray(array[:, :, 0], "L") if array.shape[-1] == 1 else Image.fromarray(array, "RGB")


@functools.lru_cache(maxsize=1)
def pillow_mismatch() -> Optional[str]:
    """Why this Pillow's resize differs from the arithmetic the kernel reproduces (None: it agrees); once."""
    return pillow_disagreement()


def _copy_each(targets: List[torch.Tensor], sources: List[torch.Tensor]) -> None:
    for target, source in zip(targets, sources):
        target.copy_(source)


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
        if resize == "kernel" and device.type != "cuda":
            raise ValueError("resize='kernel' needs a CUDA device")
        mismatch = pillow_mismatch() if resize != "pillow" else None
        if mismatch is not None:
            # The kernel and the PyTorch path model Pillow's arithmetic; this Pillow computes otherwise.
            if resize != "auto":
                raise PillowMismatchError(mismatch)
            logger.warning("%s: Pillow itself resizes, on the CPU (exact, slower)", mismatch)
            self.implementation = "pillow"
        elif resize in ("auto", "kernel") and device.type == "cuda":
            usable = kernel_usable(self.spec, device)
            if not usable:
                why = (f"output width {self.spec.size[1]} is over the kernel's limit" if self.spec.size[1] > 1024
                       else "the compiled extension clip_flash._C is not available")
                if resize == "kernel":
                    raise RuntimeError(f"resize='kernel' asked for, but {why}")
                logger.warning("image resize kernel unusable (%s): Pillow resizes on the CPU (exact, slower)", why)
            self.implementation = "kernel" if usable else "pillow"
        else:
            self.implementation = "torch" if resize == "torch" else "pillow"

    @property
    def packs(self) -> bool:
        """Whether decoded pixels should be packed for the kernel (:meth:`pack_on_host`)."""
        return self.implementation == "kernel"

    def pack_on_host(self, images: Sequence[torch.Tensor], copy_many: Optional[CopyMany] = None
                     ) -> Tuple[BatchPlan, torch.Tensor, List[torch.Tensor]]:
        """One page-locked buffer laid out for the kernel, the images copied into their slots (by
        ``copy_many``, e.g. in a thread pool); returns the plan, the buffer and each image's slot."""
        plan = plan_batch([tuple(int(size) for size in image.shape) for image in images], self.spec)
        buffer = plan.allocate_host(pin=True)
        slots = [plan.pixel_slot(buffer, index) for index in range(len(images))]
        (copy_many or _copy_each)(slots, list(images))
        return plan, buffer, slots

    def run_packed(self, plan: BatchPlan, buffer: torch.Tensor,
                   segments: Optional[Sequence[Tuple[int, int, int]]] = None,
                   fill: Optional[DeviceFill] = None, upload_on_current_stream: bool = False) -> torch.Tensor:
        """The kernel on a packed buffer: one upload (asynchronous from page-locked memory; with
        ``segments``, one copy per run of pixels, see ``resample_packed``), ``fill``, one launch."""
        return resample_packed(buffer, plan, self.device, self.dtype, segments, fill, upload_on_current_stream)

    def pack_on_device(self, images: Sequence[torch.Tensor]) -> Tuple[BatchPlan, torch.Tensor]:
        """The packed layout built on the GPU, for pixels already there (nvJPEG's): no round trip."""
        plan = plan_batch([tuple(int(size) for size in image.shape) for image in images], self.spec)
        on_gpu = self.device.type == "cuda"
        head = plan.allocate_head(pin=on_gpu)
        buffer = torch.empty(plan.total_bytes, dtype=torch.uint8, device=self.device)
        buffer[: plan.pixels_at].copy_(head, non_blocking=on_gpu)
        for index, image in enumerate(images):
            plan.pixel_slot(buffer, index).copy_(image)
        return plan, buffer

    def __call__(self, pixels: Sequence[torch.Tensor]) -> torch.Tensor:
        """``(n, 3, H, W)`` in ``dtype`` on ``device`` for ``n`` uint8 ``(h, w, c)`` images (anywhere)."""
        height, width = self.output_size
        if not pixels:
            return torch.empty((0, 3, height, width), dtype=self.dtype, device=self.device)
        if self.implementation == "kernel":
            if all(image.device == self.device for image in pixels):
                return self.run_packed(*self.pack_on_device(pixels))
            plan, buffer, _ = self.pack_on_host([image.cpu() for image in pixels])
            return self.run_packed(plan, buffer)
        if self.implementation == "torch":
            rows = preprocess_batch_cpu([image.cpu() for image in pixels], self.spec, self.dtype)
            return rows.to(self.device)
        stacked: List[torch.Tensor] = [self.preprocess(pil_image_of(image)) for image in pixels]
        return torch.stack(stacked).to(self.device, self.dtype)
