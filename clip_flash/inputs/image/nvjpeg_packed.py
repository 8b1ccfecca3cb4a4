"""The fast path's hardware route: nvJPEG's hardware decoder writes a batch's JPEGs straight into the resize
kernel's packed layout, and the libjpeg-style chroma step runs in place there.

A batch then costs a few calls, none of them per image: the layout from the header sizes the CPU step read
(:func:`~clip_flash.ops.image_resample.plan_batch`), one device buffer, one copy of its head, one decode
(``csrc/nvjpeg_decode.cpp``), one chroma launch pair (``csrc/jpeg_chroma.cu``) and one resize launch (queued by
the decoding thread too, :meth:`ImagePreprocessor.decode`). Every per-image tensor operation costs the thread
that runs it a GIL hand-off, and beside busy Python threads each hand-off waits up to the interpreter's switch
interval: a per-image route (decode, then per-image chroma and packing) pays that several times per image.

The decode call releases the GIL for the whole batch (torchvision's batched call takes it back per image, so
beside a busy Python thread it crawls), so :meth:`decode` runs it on a decoding thread, ahead of the batch on
the device. Each decoding thread queues its batch on a stream of its own, and the extension gives concurrent
calls separate decoder states (up to ``HARDWARE_DECODERS``). Two threads decode faster than one, as the
second's host work overlaps the first's decode (``benchmarks/probe_nvjpeg_concurrency.py`` measures it).

It takes baseline 3-component JPEGs; the rest (progressive, grayscale) and anything it leaves go to
torchvision's decoder in ``prepare`` (:mod:`.gpu_jpeg`). The pixels are torchvision's hardware-decoded
pixels exactly (GPU test), so the fast path's rows are the same with the route or without it.

On by default where it runs: a GPU with a hardware JPEG decoder (A100, H100 and later) and the extension
built with ``<nvjpeg.h>``. Elsewhere the first batch finds out (logged once) and torchvision decodes.
``ImagePreprocessor(nvjpeg_hardware=False)`` turns it off; ``nvjpeg_decoders`` sets how many batches decode at
once.
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from ...ops._extension import load_extension
from ...ops.image_resample import BatchPlan, plan_batch
from .image_decoding import DecodedItem, EncodedJpeg, describe_error
from .jpeg_chroma import SUBSAMPLING
from .resample_plan import plan_image
from .thread_streams import thread_stream
from .transform_spec import ImageTransformSpec

logger = logging.getLogger(__name__)

HARDWARE_DECODERS = 2  # batches decoding at once, from different threads (the job's 2; the extension's cap: 8)
_HARDWARE: Dict[str, Optional[str]] = {"unavailable": None}  # why the hardware decode cannot run here


@dataclass
class PackedJpegs:
    """A batch's JPEGs decoded into the resize kernel's layout on the device (queued on the fast path's work
    stream): ``plan`` describes ``buffer``; ``items`` are its images in order, ``written`` says which of
    them the hardware decoder wrote (the others' slots hold nothing: their rows are dropped)."""

    plan: BatchPlan
    buffer: torch.Tensor
    items: List[EncodedJpeg]
    written: List[bool]
    ready: "torch.cuda.Event"

    @property
    def decoded(self) -> List[int]:
        """Positions in ``items`` of the images decoded."""
        return [position for position, done in enumerate(self.written) if done]

    def hand_over(self) -> None:
        """Make the current stream wait for the decode, and keep the buffer until what it queues has read it."""
        stream = torch.cuda.current_stream(self.buffer.device)
        stream.wait_event(self.ready)
        self.buffer.record_stream(stream)


def hardware_decoder_usable() -> bool:
    """Whether the hardware route is built and has not found that it cannot run here."""
    if _HARDWARE["unavailable"] is not None:
        return False
    extension = load_extension()
    return extension is not None and hasattr(extension, "nvjpeg_hw_decode")


def takes(item: DecodedItem) -> bool:
    """Whether an item goes to the hardware decoder: a baseline colour JPEG, as the CPU step's header says."""
    return isinstance(item, EncodedJpeg) and item.channels == 3 and not item.jpeg_progressive


def decode_into_layout(items: List[DecodedItem], device: torch.device, spec: ImageTransformSpec,
                       chroma: str, decoders: int = HARDWARE_DECODERS) -> Optional[PackedJpegs]:
    """Decode the items :func:`takes` into a new packed buffer on ``device`` and, with ``chroma="libjpeg"``,
    refine their chroma in place. None when there are none, or the hardware route cannot run (the reason
    is logged; torchvision's decoder then takes them all)."""
    candidates = [item for item in items if takes(item)]
    if not candidates or not hardware_decoder_usable():
        return None
    extension = load_extension()
    with torch.cuda.stream(thread_stream(device)):
        try:
            plan, candidates = _plan(candidates, spec)
        except ValueError as error:
            logger.debug("no layout for the batch's JPEGs (%s); torchvision decodes them", describe_error(error))
            return None
        try:
            buffer = torch.empty(plan.total_bytes, dtype=torch.uint8, device=device)
            buffer[: plan.pixels_at].copy_(plan.allocate_head(pin=True), non_blocking=True)
        except RuntimeError as error:  # e.g. out of memory: torchvision's route decides
            logger.debug("no device buffer for the batch's JPEGs (%s)", describe_error(error))
            return None
        offsets = plan.pixels_at + plan.meta[:, 0]
        slots = np.stack([offsets, plan.meta[:, 1], plan.meta[:, 2]], axis=1).reshape(-1).tolist()
        # The calls say why they could not, rather than raise from where the GIL is released.
        written, failure = extension.nvjpeg_hw_decode([item.encoded for item in candidates], buffer, slots,
                                                      _nvjpeg_library(), decoders)
        if not failure and chroma == "libjpeg":
            failure = _refine_chroma_in_place(extension, buffer, candidates, written, offsets, plan)
        if failure:
            if failure.startswith("nvJPEG unavailable"):
                _HARDWARE["unavailable"] = failure
                logger.info("nvJPEG's hardware decode cannot run here (%s); torchvision's decodes", failure)
            else:  # e.g. one bad file failed the batch: torchvision's decoder retries them one by one
                logger.debug("nvJPEG hardware batch failed (%s); torchvision decodes it", failure)
            return None
        ready = torch.cuda.Event()
        ready.record()
    return PackedJpegs(plan, buffer, candidates, [bool(done) for done in written], ready)


def _plan(candidates: List[EncodedJpeg], spec: ImageTransformSpec) -> Tuple[BatchPlan, List[EncodedJpeg]]:
    """The layout of the candidates the transform can resize (the others are left out, for the paths that
    report why)."""
    def shapes(group: List[EncodedJpeg]) -> List[Tuple[int, int, int]]:
        return [(int(item.image_size[0]), int(item.image_size[1]), 3) for item in group]

    try:
        return plan_batch(shapes(candidates), spec), candidates
    except ValueError:  # e.g. an image too small for the transform: keep the others here
        kept = []
        for item in candidates:
            try:
                plan_image(spec, *item.image_size)
                kept.append(item)
            except ValueError:
                pass
        if not kept:
            raise ValueError("no image of the batch can be resized") from None
        return plan_batch(shapes(kept), spec), kept


def _refine_chroma_in_place(extension, buffer: torch.Tensor, items: List[EncodedJpeg], written: List[int],
                            offsets: np.ndarray, plan: BatchPlan) -> str:
    """One launch pair for the written subsampled images; returns why it could not (empty: done)."""
    rows = [(int(offsets[position]), int(plan.meta[position, 1]), int(plan.meta[position, 2]),
             *SUBSAMPLING[item.jpeg_sampling])
            for position, (item, done) in enumerate(zip(items, written))
            if done and item.jpeg_sampling in SUBSAMPLING]
    return extension.jpeg_chroma_packed(buffer, torch.tensor(rows, dtype=torch.int64)) if rows else ""


@functools.lru_cache(maxsize=1)
def _nvjpeg_library() -> str:
    """The libnvjpeg to open: torchvision's own copy (what its decoder runs, matched to torch's CUDA), else
    the one the dynamic loader finds."""
    try:
        import torchvision

        libraries = Path(torchvision.__file__).resolve().parent.parent / "torchvision.libs"
        bundled = sorted(libraries.glob("libnvjpeg*.so*"))
    except Exception:  # noqa: BLE001 - no torchvision copy: the loader's search path decides
        bundled = []
    return str(bundled[0]) if bundled else "libnvjpeg.so.13"
