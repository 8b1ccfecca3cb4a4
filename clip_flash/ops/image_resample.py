"""OpenCLIP's eval image transform for a batch of decoded images, on the GPU with one kernel launch.

``resample_batch(images, spec, device, dtype)`` gives the (n, 3, H, W) model input, equal to stacking
OpenCLIP's ``preprocess(pil_image)`` for every image and casting to ``dtype`` (bit-identical in float32).
On CUDA with the compiled extension it packs the batch into one pinned host buffer (per-image meta rows,
Pillow's fixed-point tap tables, the pixels), uploads it with one non-blocking copy and runs
``clip_flash._C.image_resample``; otherwise it runs the same arithmetic in plain PyTorch on the CPU.

Decoders that want to skip a copy can build the layout from the image sizes first (``plan_batch``),
write each image straight into its slot of the pinned buffer (``BatchPlan.pixel_slot``) and then call
``resample_packed``.
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Protocol, Sequence, Tuple, Union

import numpy as np
import torch

from clip_flash.ops._extension import load_extension
from clip_flash.inputs.image.pillow_resample import (
    check_image, needs_premultiply, preprocess_batch_cpu, require_pillow_agreement, to_model_input,
)
from clip_flash.inputs.image.resample_plan import AxisTable, plan_image
from clip_flash.inputs.image.transform_spec import ImageTransformSpec

logger = logging.getLogger(__name__)

# Must match ImageMetaField in csrc/image_resample.h.
META_FIELDS = (
    "pixel_offset", "height", "width", "channels", "cols_table", "rows_table", "col_taps", "row_taps",
    "vertical_first", "fill", "col_first", "col_last", "premultiply",
)
MAX_OUTPUT_WIDTH = 1024  # kImageResampleMaxWidth
MAX_IMAGES_PER_LAUNCH = 65535
OUTPUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_ALIGN = 16
Device = Union[str, torch.device]


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


@dataclass(frozen=True)
class BatchPlan:
    """Byte layout of one packed batch: [meta int64 | tap tables int32 | pixels uint8]."""

    spec: ImageTransformSpec
    shapes: Tuple[Tuple[int, int, int], ...]  # (H, W, C) per image
    meta: np.ndarray                          # (n, len(META_FIELDS)) int64
    tables: np.ndarray                        # int32
    tables_at: int                            # byte offsets in the buffer
    pixels_at: int
    total_bytes: int

    def allocate_host(self, pin: bool = True, pixel_bytes: Optional[int] = None) -> torch.Tensor:
        """A uint8 host buffer of the batch with meta and tables filled in; pixels left to the caller. With
        ``pixel_bytes``, only that much of the pixel area (the first images'; the rest are written on the
        device, see ``resample_packed``'s ``fill``)."""
        size = self.total_bytes if pixel_bytes is None else self.pixels_at + pixel_bytes
        return self._fill_head(torch.empty(size, dtype=torch.uint8, pin_memory=pin and torch.cuda.is_available()))

    def allocate_head(self, pin: bool = True) -> torch.Tensor:
        """Only the meta rows and tables (the buffer up to ``pixels_at``), for pixels packed elsewhere."""
        return self._fill_head(torch.empty(self.pixels_at, dtype=torch.uint8,
                                           pin_memory=pin and torch.cuda.is_available()))

    @functools.cached_property
    def head(self) -> np.ndarray:
        """The layout up to ``pixels_at`` (meta rows, tap tables, zero padding) as read-only bytes, made once
        per plan: filling a buffer's head is then one copy."""
        head = np.zeros(self.pixels_at, dtype=np.uint8)
        head[: self.meta.nbytes] = self.meta.reshape(-1).view(np.uint8)
        head[self.tables_at: self.tables_at + self.tables.nbytes] = self.tables.view(np.uint8)
        head.flags.writeable = False
        return head

    def _fill_head(self, buffer: torch.Tensor) -> torch.Tensor:
        buffer.numpy()[: self.pixels_at] = self.head
        return buffer

    def pixel_slot(self, buffer: torch.Tensor, index: int) -> torch.Tensor:
        """The (H, W, C) uint8 view of ``buffer`` where image ``index`` goes."""
        height, width, channels = self.shapes[index]
        start = self.pixels_at + int(self.meta[index, 0])
        return buffer[start: start + height * width * channels].view(height, width, channels)


def plan_batch(shapes: Sequence[Tuple[int, int, int]], spec: ImageTransformSpec) -> BatchPlan:
    """Meta rows and tap tables for images of these (H, W, C) shapes. Images of the same size share
    their tables. Raises ``ImageTooSmallError`` (naming the image) where OpenCLIP's transform fails,
    and ``PillowMismatchError`` if the installed Pillow does not compute what the kernel reproduces.

    Plans of batches up to ``PLAN_CACHE_IMAGES`` images are kept (least recently used first out): a server's
    requests repeat the same few sizes, and planning one image costs more host time than its resize
    launch. A plan is immutable (its arrays are read-only), so one may serve any number of batches at once."""
    require_pillow_agreement()
    key = tuple(map(tuple, shapes))
    if len(key) <= PLAN_CACHE_IMAGES:
        return _cached_plan(key, spec)
    return _plan(key, spec)


PLAN_CACHE_IMAGES = 64
PLAN_CACHE_SIZE = 32


@functools.lru_cache(maxsize=PLAN_CACHE_SIZE)
def _cached_plan(shapes: Tuple[Tuple[int, int, int], ...], spec: ImageTransformSpec) -> BatchPlan:
    return _plan(shapes, spec)


@dataclass(frozen=True)
class _ShapePlan:
    """What a batch's plan needs of one image size: its meta row (the table offsets left 0, set per batch) and
    its two axis tables."""

    meta_row: Tuple[int, ...]
    cols: AxisTable
    rows: AxisTable


_COLS_TABLE, _ROWS_TABLE = META_FIELDS.index("cols_table"), META_FIELDS.index("rows_table")


@functools.lru_cache(maxsize=4096)  # sizes repeat across batches: planning each again held the GIL for nothing
def _shape_plan(height: int, width: int, channels: int, spec: ImageTransformSpec) -> _ShapePlan:
    if channels not in (1, 3, 4):
        raise ValueError(f"{channels} channels; decoded images have 1 (L), 3 (RGB) or 4 (RGBA)")
    plan = plan_image(spec, height, width)
    col_first, col_last = plan.cols.source_span
    meta_row = (0, height, width, channels, 0, 0, plan.cols.taps, plan.rows.taps, int(plan.vertical_first),
                plan.fill, col_first, col_last, int(needs_premultiply(channels, plan)))
    return _ShapePlan(meta_row, plan.cols, plan.rows)


def _plan(shapes: Tuple[Tuple[int, int, int], ...], spec: ImageTransformSpec) -> BatchPlan:
    # Web photos come in few sizes: one meta row per distinct shape (each planned once per process), then numpy
    # does the rest. A batch is planned on the decoding threads, beside the thread that launches the model:
    # every per-table numpy call here (a concatenate, a cast) would drop and retake the GIL.
    distinct: Dict[Tuple[int, int, int], int] = {}
    which = [distinct.setdefault(tuple(shape), len(distinct)) for shape in shapes]
    templates = np.zeros((len(distinct), len(META_FIELDS)), dtype=np.int64)
    pieces: List[np.ndarray] = []
    offsets: Dict[int, int] = {}
    keep_alive: List[AxisTable] = []  # ids stay unique while the plan is made, whatever the caches drop
    table_size = 0

    def place(table: AxisTable) -> int:
        nonlocal table_size
        if id(table) not in offsets:
            keep_alive.append(table)
            offsets[id(table)] = table_size
            pieces.append(table.packed)
            table_size += table.packed.size
        return offsets[id(table)]

    for (height, width, channels), row in distinct.items():
        try:
            shape_plan = _shape_plan(height, width, channels, spec)
        except ValueError as error:
            raise type(error)(f"image {which.index(row)}: {error}") from error  # the first image of this shape
        templates[row] = shape_plan.meta_row
        templates[row, _COLS_TABLE] = place(shape_plan.cols)
        templates[row, _ROWS_TABLE] = place(shape_plan.rows)
    meta = templates[np.asarray(which, dtype=np.int64)] if shapes else templates
    sizes = meta[:, 1] * meta[:, 2] * meta[:, 3]
    meta[:, 0] = np.cumsum(sizes) - sizes
    pixel_bytes = int(sizes.sum())
    tables = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int32)
    tables_at = _aligned(meta.nbytes)
    pixels_at = _aligned(tables_at + tables.nbytes)
    meta.flags.writeable = False
    tables.flags.writeable = False
    return BatchPlan(spec, shapes, meta, tables, tables_at, pixels_at, pixels_at + pixel_bytes)


@functools.lru_cache(maxsize=64)
def _value_table_host(mean: Tuple[float, ...], std: Tuple[float, ...], dtype: torch.dtype) -> torch.Tensor:
    """(3, 256): torchvision's ToTensor + Normalize of every uint8 value per channel, cast to dtype, by the
    same torch operations as the CPU path (so the kernel needs no floating point)."""
    spec = ImageTransformSpec((1, 1), "squash", "bilinear", mean, std)
    values = torch.arange(256, dtype=torch.uint8).view(1, 1, 256).expand(3, 1, 256)
    return to_model_input(values, spec, dtype).reshape(3, 256).contiguous()


_device_tables: Dict[Tuple[str, torch.dtype, Tuple[float, ...], Tuple[float, ...]], torch.Tensor] = {}


def _value_table(spec: ImageTransformSpec, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    key = (str(device), dtype, spec.mean, spec.std)
    if key not in _device_tables:
        _device_tables[key] = _value_table_host(spec.mean, spec.std, dtype).to(device)
    return _device_tables[key]


def kernel_usable(spec: ImageTransformSpec, device: Device) -> bool:
    """Whether ``resample_batch`` runs the CUDA kernel for this spec and device."""
    device = torch.device(device)
    return device.type == "cuda" and spec.size[1] <= MAX_OUTPUT_WIDTH and load_extension() is not None


def resample_packed(
    buffer: torch.Tensor, plan: BatchPlan, device: Device, dtype: torch.dtype = torch.float32,
    segments: Optional[Sequence[Tuple[int, int, int]]] = None,
    fill: Optional["DeviceFill"] = None, upload_on_current_stream: bool = False,
) -> torch.Tensor:
    """Run the kernel on a host buffer laid out by ``plan`` (pixels written); one upload, one launch.

    ``fill``, when given, writes the pixels of images that were not uploaded (the exact path's GPU JPEG route
    decodes them there): its ``upload(device)`` queues its own copies beside the layout's, and the launch it
    returns is called with the uploaded layout's pixel area (on the device) on the current stream, just
    before the resize.

    With ``segments``, ``buffer`` holds only pixels, in runs ``(host_start, nbytes, device_start)`` that
    are copied to ``device_start`` of the uploaded layout (the meta rows and tables come from the plan):
    one copy per run, the device layout being exactly ``plan``'s.

    The upload from host memory is asynchronous, on a side stream that the current stream then waits for:
    write into ``buffer`` again only after the current stream has passed this call (an event or a
    synchronize), e.g. when cycling through two pinned buffers. ``upload_on_current_stream``: on the current
    stream instead, behind what it holds (a caller's gate: the copies then wait for it).

    From a host buffer to a CUDA device, with ``fill`` None or a ``DctBatch``, the copies and launches are one
    call into the extension (``packed_rows``): the same work without some forty Python-level calls of host time.
    """
    if dtype not in OUTPUT_DTYPES:
        raise ValueError(f"dtype must be one of {OUTPUT_DTYPES}, got {dtype}")
    device = torch.device(device)
    extension = load_extension()
    if extension is None:
        raise RuntimeError("clip_flash._C is not available; use resample_batch, which falls back to the CPU")
    n = len(plan.shapes)
    target_h, target_w = plan.spec.size
    if n == 0:
        return torch.empty((n, 3, target_h, target_w), dtype=dtype, device=device)
    if n > MAX_IMAGES_PER_LAUNCH:
        raise ValueError(f"at most {MAX_IMAGES_PER_LAUNCH} images per launch, got {n}")
    from_host = buffer.device.type == "cpu" and device.type == "cuda"
    if from_host and hasattr(extension, "packed_rows") and (fill is None or hasattr(fill, "native_arguments")):
        return _packed_rows(extension, buffer, plan, device, dtype, segments, fill, upload_on_current_stream)
    out = torch.empty((n, 3, target_h, target_w), dtype=dtype, device=device)
    if from_host and not upload_on_current_stream:
        # The upload runs on its own stream, so that it overlaps the encoder still running on the caller's
        # stream (the batch before); the buffer is allocated there and handed over with record_stream.
        caller, upload = torch.cuda.current_stream(device), upload_stream(device)
        with torch.cuda.stream(upload):
            on_device = _upload(buffer, plan, device, segments)
            finish = fill.upload(device) if fill is not None else None
        caller.wait_stream(upload)
        on_device.record_stream(caller)
    else:
        on_device = _upload(buffer, plan, device, segments)
        finish = fill.upload(device) if fill is not None else None
    meta = on_device[: plan.meta.nbytes].view(torch.int64).view(n, len(META_FIELDS))
    tables = on_device[plan.tables_at: plan.tables_at + plan.tables.nbytes].view(torch.int32)
    pixels = on_device[plan.pixels_at:]
    if finish is not None:
        finish(pixels)
    extension.image_resample(pixels, meta, tables, _value_table(plan.spec, dtype, device), out)
    return out


_NO_BYTES = torch.empty(0, dtype=torch.uint8)
_NO_TABLE = torch.empty((0, 0), dtype=torch.int64)


def _packed_rows(extension, buffer: torch.Tensor, plan: BatchPlan, device: torch.device, dtype: torch.dtype,
                 segments: Optional[Sequence[Tuple[int, int, int]]], fill: Optional["DeviceFill"],
                 on_current_stream: bool) -> torch.Tensor:
    """``resample_packed``'s copies and launches as one extension call (same streams, same kernels)."""
    if segments is None:  # the buffer is the layout's start: its head and the first images' pixels
        host, pixels, runs = buffer, _NO_BYTES, []
    else:
        host, pixels, runs = plan.allocate_head(pin=True), buffer, [value for run in segments for value in run]
    sources, coefficient_bytes, table_at, table, plane_bytes, max_blocks, max_pixels = (
        fill.native_arguments() if fill is not None else ([], 0, -1, _NO_TABLE, 0, 0, 0))
    height, width = plan.spec.size
    return extension.packed_rows(
        host, len(plan.shapes), plan.total_bytes, plan.pixels_at, plan.tables_at, plan.tables.nbytes, pixels, runs,
        sources, coefficient_bytes, table_at, table, plane_bytes, max_blocks, max_pixels,
        _value_table(plan.spec, dtype, device), height, width,
        0 if on_current_stream else upload_stream(device).cuda_stream)


class DeviceFill(Protocol):
    """Pixels written on the device into a packed layout (``resample_packed``'s ``fill``)."""

    def upload(self, device: torch.device) -> Callable[[torch.Tensor], None]:
        """Queue the host-to-device copies on the current stream; return the launch (given the pixel area)."""
        ...


@functools.lru_cache(maxsize=None)
def upload_stream(device: torch.device) -> "torch.cuda.Stream":
    """The stream the host-to-device copies of packed batches run on, one per device."""
    return torch.cuda.Stream(device)


def _upload(buffer: torch.Tensor, plan: BatchPlan, device: torch.device,
            segments: Optional[Sequence[Tuple[int, int, int]]]) -> torch.Tensor:
    """``plan``'s device layout from ``buffer`` (all of it, or the head plus ``segments``), on the current stream."""
    if segments is None and buffer.numel() == plan.total_bytes:
        return buffer.to(device, non_blocking=True)
    if segments is None:  # the head and the first images' pixels; ``fill`` writes the rest on the device
        on_device = torch.empty(plan.total_bytes, dtype=torch.uint8, device=device)
        on_device[: buffer.numel()].copy_(buffer, non_blocking=True)
        return on_device
    on_device = torch.empty(plan.total_bytes, dtype=torch.uint8, device=device)
    on_device[: plan.pixels_at].copy_(plan.allocate_head(pin=device.type == "cuda"), non_blocking=True)
    for host_start, size, device_start in segments:
        on_device[device_start: device_start + size].copy_(buffer[host_start: host_start + size], non_blocking=True)
    return on_device


def resample_batch(
    images: Sequence[torch.Tensor], spec: ImageTransformSpec, device: Device = "cuda",
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """(n, 3, H, W) model input on ``device`` for decoded uint8 (H, W, C) images (C = 1 for "L", 3 for
    "RGB", 4 for "RGBA", which Pillow resizes premultiplied; an "LA" image is the same computation as
    RGBA (L, L, L, A)): bit-identical to ``torch.stack([preprocess(pil) for pil in ...]).to(dtype)``.

    Uses the CUDA kernel when ``device`` is a GPU and the extension is built, the CPU implementation
    otherwise (same results by contract). Raises ``ImageTooSmallError`` for an image OpenCLIP's transform
    cannot resize (``longest`` mode, extreme aspect ratios); callers filter those out first.
    """
    if dtype not in OUTPUT_DTYPES:
        raise ValueError(f"dtype must be one of {OUTPUT_DTYPES}, got {dtype}")
    device = torch.device(device)
    for image in images:
        check_image(image)
    if not kernel_usable(spec, device):
        return preprocess_batch_cpu([image.cpu() for image in images], spec, dtype).to(device)
    results = []
    for first in range(0, max(len(images), 1), MAX_IMAGES_PER_LAUNCH):
        chunk = images[first: first + MAX_IMAGES_PER_LAUNCH]
        plan = plan_batch([tuple(int(d) for d in image.shape) for image in chunk], spec)
        buffer = plan.allocate_host()
        for index, image in enumerate(chunk):
            plan.pixel_slot(buffer, index).copy_(image)
        results.append(resample_packed(buffer, plan, device, dtype))
    return results[0] if len(results) == 1 else torch.cat(results)
