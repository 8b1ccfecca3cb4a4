"""The exact path's JPEG route on a GPU: the CPU only entropy-decodes, the GPU does the rest, bit for bit.

A web photo's libjpeg-turbo decode is about two thirds entropy decoding (Huffman) and one third arithmetic:
the integer IDCT, "fancy" chroma upsampling and the integer YCbCr -> RGB conversion. On the route, the
native batch decoder (:mod:`.native_decode`) calls libjpeg-turbo's ``jpeg_read_coefficients`` (lossless, so
any correct libjpeg gives the same coefficients) and writes the coefficients into a page-locked buffer; the GPU
repeats the arithmetic exactly (``csrc/jpeg_dct.cu``), writing the pixels straight into the resize kernel's
packed layout, before the resize launch. The pixels are Pillow's: the kernels do what libjpeg-turbo does with
the defaults Pillow keeps (GPU tests compare them with ``Image.open`` on photos re-encoded many ways).

It takes 8-bit grayscale and YCbCr JPEGs (baseline or progressive) whose components are full size or halved
across (4:2:2) or both ways (4:2:0). The rest (4:4:0, 4:1:1, RGB- or CMYK-coded, 12-bit, images whose halved
chroma is at most 2 samples wide, files libjpeg warns about) take the whole-decode route as before.

On by default where it runs: a CUDA device, the extension built, the kernel's resize.
``ImagePreprocessor(dct_route=False)`` turns it off.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch

logger = logging.getLogger(__name__)

# The kernel's table (csrc/jpeg_dct.h): per image 5 fields, then 8 per component, for up to 3 components.
IMAGE_FIELDS, COMPONENT_FIELDS, MAX_COMPONENTS = 5, 8, 3
TABLE_FIELDS = IMAGE_FIELDS + MAX_COMPONENTS * COMPONENT_FIELDS
LAYOUT_HEAD, LAYOUT_PER_COMPONENT = 3, 7  # the layout: (height, width, components), 7 per component
ALIGN = 128  # coefficient tensors are multiples of 128 bytes: each starts aligned where its run does


@dataclass
class DctBatch:
    """A batch's JPEGs as coefficients in host memory (``sources``: uint8 tensors, each a run of images back
    to back from 128-aligned starts), and the kernel's table for them, their pixel offsets left to fill.

    ``table_room``: a byte offset in the last source with room for the table (``table_bytes``), so that the
    table goes up in the coefficients' copy; None: the table is staged and copied on its own."""

    sources: List[torch.Tensor]
    table: np.ndarray  # (n, TABLE_FIELDS) int64; column 1 (pixel offset) set by ``place``
    coefficient_bytes: int
    plane_bytes: int
    max_blocks: int
    max_pixels: int
    table_room: Optional[int] = None

    def place(self, pixel_offsets: Sequence[int]) -> None:
        """Where each image's pixels go in the packed layout's pixel area."""
        self.table[:, 1] = np.asarray(pixel_offsets, dtype=np.int64)

    def upload(self, device: torch.device) -> Callable[[torch.Tensor], None]:
        """Queue the copies of the coefficients and the table to ``device`` on the current stream; returns the
        launch: called on the stream that is to run the kernels (after it waited for this one), with the packed
        layout's pixel area on the device, it queues them there. Split so that a caller that uploads more
        (``resample_packed``) switches streams once for all its copies."""
        table_at = self._table_into_room()
        coefficients = torch.empty(self.coefficient_bytes, dtype=torch.uint8, device=device)
        at = 0
        for source in self.sources:
            # From the page-locked arena: asynchronous (an item's own tensor, rare, is copied in step).
            coefficients[at:at + source.numel()].copy_(source, non_blocking=source.is_pinned())
            at += _aligned(source.numel())
        if table_at >= 0:
            table = coefficients[table_at:table_at + self.table.nbytes].view(torch.int64).view(self.table.shape)
        else:
            staged = torch.from_numpy(self.table)
            table = (staged.pin_memory() if device.type == "cuda" else staged).to(device, non_blocking=True)

        def launch(pixels: torch.Tensor) -> None:
            from ...ops._extension import load_extension

            current = torch.cuda.current_stream(device)
            coefficients.record_stream(current)
            table.record_stream(current)
            planes = torch.empty(max(self.plane_bytes, 8), dtype=torch.uint8, device=device)
            failure = load_extension().jpeg_dct_to_pixels(coefficients, table, planes, pixels, self.max_blocks,
                                                          self.max_pixels)
            if failure:  # the arguments are built here: this is a bug, not a bad file
                raise RuntimeError(f"clip_flash's JPEG kernels refused the batch: {failure}")

        return launch

    def native_arguments(self) -> Tuple[List[torch.Tensor], int, int, torch.Tensor, int, int, int]:
        """What the extension's ``packed_rows`` takes for these JPEGs (``upload`` and its launch in one call):
        (sources, coefficient bytes, the table's byte offset in the uploaded coefficients or -1, the table as a
        host tensor, plane bytes, max blocks, max pixels). Writes the table into its room first, as ``upload``."""
        return (self.sources, self.coefficient_bytes, self._table_into_room(), torch.from_numpy(self.table),
                self.plane_bytes, self.max_blocks, self.max_pixels)

    def _table_into_room(self) -> int:
        """Write the table into the last source's room (page-locked, before its copy is queued: the copy may start
        reading at once); its byte offset in the uploaded coefficients, or -1 where it goes up on its own."""
        if self.table_room is None:
            return -1
        last = self.sources[-1]
        last.numpy()[self.table_room:self.table_room + self.table.nbytes] = self.table.reshape(-1).view(np.uint8)
        return self.coefficient_bytes - _aligned(last.numel()) + self.table_room

    def decode(self, pixels: torch.Tensor) -> None:
        """Queue the kernels on the current stream; the pixels land at their offsets in ``pixels`` (the packed
        layout's pixel area, on the device). The coefficients go up on the packed batches' upload stream, as
        the pixels do, so that on a GPU still running the previous batch's encoder the copy overlaps it."""
        from ...ops.image_resample import upload_stream

        device = pixels.device
        caller, upload = torch.cuda.current_stream(device), upload_stream(device)
        with torch.cuda.stream(upload):
            launch = self.upload(device)
        caller.wait_stream(upload)
        launch(pixels)


def table_bytes(images: int) -> int:
    """Bytes to leave for the kernel's table of this many images (see ``DctBatch.table_room``)."""
    return _aligned(images * TABLE_FIELDS * np.dtype(np.int64).itemsize)


def _aligned(size: int) -> int:
    return (size + ALIGN - 1) // ALIGN * ALIGN


def plan_dct_batch(layouts: Sequence[Sequence[int]], runs: Sequence[Tuple[torch.Tensor, Sequence[int]]],
                   table_room: Optional[int] = None) -> DctBatch:
    """The table for images with these reader layouts, whose coefficient tensors lie in ``runs``: each a
    host tensor and the byte offsets in it of its images' tensors (in the order of ``layouts``).
    ``table_room``: where in the last run's tensor ``table_bytes(len(layouts))`` bytes are free for the table
    (page-locked memory: the table then goes up with the coefficients)."""
    table = np.zeros((len(layouts), TABLE_FIELDS), dtype=np.int64)
    plane_bytes = max_blocks = max_pixels = 0
    row, base = 0, 0
    for source, offsets in runs:
        for offset in offsets:
            layout = layouts[row]
            height, width, components = layout[:LAYOUT_HEAD]
            table[row, 0] = base + offset
            table[row, 2:5] = (height, width, components)
            max_pixels = max(max_pixels, height * width)
            for component in range(components):
                fields = layout[LAYOUT_HEAD + component * LAYOUT_PER_COMPONENT:
                                LAYOUT_HEAD + (component + 1) * LAYOUT_PER_COMPONENT]
                wide, high = fields[2], fields[3]
                start = IMAGE_FIELDS + component * COMPONENT_FIELDS
                table[row, start:start + 7] = fields
                table[row, start + 7] = plane_bytes
                plane_bytes += wide * high * 64
                max_blocks = max(max_blocks, wide * high)
            row += 1
        base += _aligned(source.numel())
    if row != len(layouts):
        raise ValueError(f"{len(layouts)} layouts for {row} placed images")
    if table_room is not None and (table_room % ALIGN or table_room + table.nbytes > runs[-1][0].numel()):
        raise ValueError(f"no room for the table ({table.nbytes} bytes) at byte {table_room} of the last run")
    return DctBatch([source for source, _ in runs], table, base, plane_bytes, max_blocks, max_pixels, table_room)


def decode_to_pixels(datas: Sequence[bytes], device: torch.device) -> List[Optional[torch.Tensor]]:
    """Each JPEG's uint8 ``(H, W, C)`` pixels on ``device`` through the route (None where it declines): what
    ``np.asarray(Image.open(...))`` gives. For tests and measurements; the preprocessor packs them itself."""
    from .native_decode import COEFFICIENT_BYTES, KIND, DecodeKind, NativeBatchDecoder, ScanMode

    native = NativeBatchDecoder.create(threads=4)
    if native is None:
        raise RuntimeError("the exact path's GPU JPEG route cannot run here (see the log)")
    scanned = native.scan(list(datas), ScanMode.COEFFICIENTS)
    taken = [position for position in range(len(datas)) if scanned.info[position, KIND] == DecodeKind.COEFFICIENTS]
    results: List[Optional[torch.Tensor]] = [None] * len(datas)
    if not taken:
        return results
    sizes = [_aligned(int(scanned.info[position, COEFFICIENT_BYTES])) for position in taken]
    offsets = np.full(len(datas), -1, dtype=np.int64)
    offsets[taken] = np.cumsum(sizes) - np.asarray(sizes)
    host = torch.empty(sum(sizes), dtype=torch.uint8, pin_memory=True)
    declined = native.decode(scanned, torch.empty(1, dtype=torch.uint8), np.full(len(datas), -1, dtype=np.int64),
                             host, offsets)
    taken = [position for position in taken if not declined[position]]
    if not taken:
        return results
    layouts = [scanned.layout(position) for position in taken]
    batch = plan_dct_batch(layouts, [(host, offsets[taken].tolist())])
    shapes = [tuple(layout[:LAYOUT_HEAD]) for layout in layouts]
    pixel_sizes = [height * width * channels for height, width, channels in shapes]
    pixel_offsets = np.cumsum([0] + pixel_sizes[:-1])
    batch.place(pixel_offsets)
    pixels = torch.empty(max(sum(pixel_sizes), 1), dtype=torch.uint8, device=device)
    batch.decode(pixels)
    for position, shape, offset, size in zip(taken, shapes, pixel_offsets, pixel_sizes):
        results[position] = pixels[int(offset):int(offset) + size].view(shape)
    return results
