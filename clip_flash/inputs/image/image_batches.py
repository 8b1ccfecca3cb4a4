"""What :class:`~clip_flash.inputs.image.preprocessor.ImagePreprocessor`'s two steps hand on: the CPU step's
decoded batch (:class:`DecodedImages`, with its pixels laid out for the resize kernel: :class:`PackedPixels`) and
the model-ready batch (:class:`PreparedImages`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch

from .image_decoding import DecodedItem, route_counts
from .jpeg_dct import DctBatch
from .nvjpeg_packed import PackedJpegs


@dataclass
class PackedPixels:
    """Decoded pixels of ``indices``, in one page-locked buffer laid out by ``plan`` for the kernel."""

    plan: Any
    buffer: torch.Tensor
    indices: List[int]
    # Set when the pixels lie in runs of ``buffer`` rather than at the plan's offsets:
    # (host_start, nbytes, device_start) per run.
    segments: Optional[List[Tuple[int, int, int]]] = None
    dct: Optional[DctBatch] = None  # JPEGs as coefficients, after the pixels in ``indices``: decoded on the GPU
    keep: Optional[List[int]] = None  # positions in ``indices`` whose rows count (None: all)


@dataclass
class RowsOnDevice:
    """Model-ready rows the decoding thread already queued on its own stream (``decode="gpu"``): ``rows[k]`` is
    input ``indices[k]``, valid on a stream once it waited for ``ready``."""

    indices: List[int]
    rows: torch.Tensor
    ready: "torch.cuda.Event"

    def hand_over(self) -> Tuple[List[int], torch.Tensor]:
        """Make the current stream wait for the rows, keep their memory until what it queues has read them, and
        return ``(indices, rows)``."""
        stream = torch.cuda.current_stream(self.rows.device)
        stream.wait_event(self.ready)
        self.rows.record_stream(stream)
        return self.indices, self.rows


@dataclass
class DecodedImages:
    """The CPU step's result for one call of :meth:`ImagePreprocessor.decode`.

    ``items`` holds one item per readable input (see :data:`.image_decoding.DecodedItem`): its pixels
    (:class:`.image_decoding.DecodedPixels`), or where they or its DCT coefficients lie in the page-locked buffer
    ``packed`` laid out for the GPU kernel, the output of ``preprocess`` for inputs that ran it on the CPU, or
    JPEG bytes for nvJPEG; ``failures`` the unreadable ones.
    """

    count: int
    items: List[DecodedItem]
    failures: List[Tuple[int, str]]
    packed: Optional[PackedPixels] = None  # the pixel items, laid out for the GPU kernel
    on_gpu: Optional[PackedJpegs] = None  # decode="gpu": JPEGs the hardware decoder did here (see decode())
    # decode="gpu": ``packed`` and ``on_gpu`` already resized, in one group, by the decoding thread (see decode())
    ahead: Optional[RowsOnDevice] = None
    # The layout ``decode(on_layout=...)`` handed out before decoding is this batch, with nothing else in it:
    # ``prepare`` computes what ``prepare_layout`` of that layout computes (see ``NativeBatch``).
    early_layout_is_batch: bool = False

    @property
    def indices(self) -> List[int]:
        """The inputs that will become rows, in order."""
        return [item.index for item in self.items]

    @property
    def routes(self) -> Dict[str, int]:
        """How many inputs took each route (``jpeg``, ``png``, ``pillow-pixels``, ...)."""
        counts = route_counts(self.items)
        if self.failures:
            counts["failed"] = len(self.failures)
        return counts


@dataclass
class PreparedImages:
    """The model-ready batch: ``pixels[k]`` is input ``indices[k]``; ``failures`` lists the others."""

    pixels: torch.Tensor
    indices: List[int]
    failures: List[Tuple[int, str]]
    routes: Dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.indices)
