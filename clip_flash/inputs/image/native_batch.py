"""One batch's CPU step through the native decoder (:mod:`.native_decode`), and Python threads for the rest.

The batch is read and scanned in one native call; from the sizes alone the resize kernel's layout is planned
(:func:`~clip_flash.ops.image_resample.plan_batch`, pixel images first, then the JPEGs the GPU finishes from
their coefficients), one page-locked buffer allocated for it and one for the coefficients; a second native
call decodes every image straight into its place there. Host memory comes from torch's page-locked allocator,
which hands a block out again only after the copies queued from it are done: the buffers may be dropped with
the batch at any time.

Inputs in memory (PIL images, arrays) and whatever the native decoder leaves to Pillow go through
:func:`~.image_decoding.decode_item` in Python threads, as they would without the extension.
"""
from __future__ import annotations

from concurrent.futures import Executor, Future
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np
import torch

from ...environment import usable_cores
from ...ops.image_resample import plan_batch
from .image_batches import DecodedImages, PackedPixels
from .image_decoding import (DctCoefficients, DecodedItem, DecodedPixels, DecodeFailure, DecodeOptions, EncodedJpeg,
                             PixelsInLayout, Route, decode_item, describe_error)
from .exact_share import exact_positions
from .image_resize import ExactResize
from .jpeg_dct import ALIGN, DctBatch, plan_dct_batch, table_bytes
from .native_decode import (CHANNELS, FORMAT, HEIGHT, KIND, PROGRESSIVE, SAMPLING, WIDTH,
                            COEFFICIENT_BYTES, DecodeKind, FileFormat, NativeBatchDecoder, ScanMode, takes_natively)
from .resample_plan import plan_image

MAX_CHUNK = 16  # inputs per Python task


def default_workers() -> int:
    """Decoding threads when none are asked for: one per core this process may run on."""
    return usable_cores()


def python_decode(pairs: List[Tuple[int, Any]], options: DecodeOptions, threads: Executor) -> List[DecodedItem]:
    """:func:`decode_item` over ``(index, input)`` pairs in ``threads``, in input order."""
    if len(pairs) <= 1:
        return [decode_item(index, item, options) for index, item in pairs]
    size = max(1, min(MAX_CHUNK, -(-len(pairs) // 8)))
    chunks = [pairs[start:start + size] for start in range(0, len(pairs), size)]
    futures = [threads.submit(lambda chunk: [decode_item(index, item, options) for index, item in chunk], chunk)
               for chunk in chunks]
    return sorted((item for future in futures for item in future.result()), key=lambda item: item.index)


class NativeBatch:
    """One call of the CPU step with the native decoder.

    With ``mode`` :attr:`ScanMode.ENCODED` (``decode="gpu"``): ``exact_share`` of the natively read inputs are
    scanned for the exact route instead (:mod:`.exact_share`), and ``start_encoded``, when given, is called with
    the JPEGs kept encoded before the CPU decodes the rest, so that their decode (nvJPEG's hardware, in another
    thread) runs beside it; its future is :attr:`encoded_started`. What the native decoder leaves to Pillow at the
    share's positions is decoded with ``exact_options`` (not kept encoded for nvJPEG). ``split_jpegs``: see
    :meth:`.NativeBatchDecoder.decode`.

    ``on_layout``, when given, is called with the batch's :class:`PackedPixels` once its page-locked buffers are
    allocated and before the native decoder writes them, where the whole batch goes through the kernel's layout
    (every input read natively, none left to Pillow). A caller may queue the layout's device work behind a host
    gate (``clip_flash.ops.host_gate``) and return its ``opener``: the native decoder opens it the moment the
    buffers are written, before taking the GIL back (a thread launching behind the gate may hold it).
    :attr:`DecodedImages.early_layout_is_batch` then says whether that layout is the batch as decoded (False when
    a file was handed to Pillow after all: its rows differ)."""

    def __init__(self, native: NativeBatchDecoder, mode: ScanMode, resize: ExactResize, options: DecodeOptions,
                 threads: Executor, exact_share: float = 0.0,
                 start_encoded: Optional[Callable[[List[DecodedItem]], Future]] = None,
                 exact_options: Optional[DecodeOptions] = None, split_jpegs: bool = True,
                 on_layout: Optional[Callable[[PackedPixels], Optional[Tuple[torch.Tensor, int]]]] = None) -> None:
        self.native = native
        self.mode = mode
        self.resize = resize
        self.options = options
        self.threads = threads
        self.exact_share = exact_share if mode == ScanMode.ENCODED else 0.0
        self.start_encoded = start_encoded
        self.exact_options = exact_options or options
        self.split_jpegs = split_jpegs
        self.on_layout = on_layout
        self.exact_indices: Set[int] = set()  # inputs at the exact share's positions
        self.encoded_started: Optional[Future] = None
        self._fits: Dict[Tuple[int, int], Optional[str]] = {}

    def _too_small(self, height: int, width: int) -> Optional[str]:
        """Why the transform cannot resize this size (as OpenCLIP's fails on it), once per size."""
        key = (height, width)
        if key not in self._fits:
            try:
                plan_image(self.resize.spec, height, width)
                self._fits[key] = None
            except Exception as error:  # noqa: BLE001 - the image's failure, reported
                self._fits[key] = describe_error(error)
        return self._fits[key]

    def decode(self, items: Sequence[Any]) -> DecodedImages:
        native_pairs = [(index, item) for index, item in enumerate(items) if takes_natively(item)]
        python_pairs = [(index, item) for index, item in enumerate(items) if not takes_natively(item)]
        decoded: List[DecodedItem] = []
        failures: List[Tuple[int, str]] = []
        packed = None
        early = None
        scanned = None
        pixels: List[int] = []
        coefficients: List[int] = []
        encoded: List[int] = []
        if native_pairs:
            exact = exact_positions(len(native_pairs), self.exact_share) if self.exact_share else []
            self.exact_indices = {native_pairs[position][0] for position in exact}
            scanned = self.native.scan([item for _, item in native_pairs], self.mode, exact)
            info = scanned.info
            for position, (index, item) in enumerate(native_pairs):
                kind = DecodeKind(int(info[position, KIND]))
                if kind == DecodeKind.PYTHON:
                    python_pairs.append((index, item))
                    continue
                why = self._too_small(int(info[position, HEIGHT]), int(info[position, WIDTH]))
                if why is not None:
                    failures.append((index, why))
                    continue
                {DecodeKind.PIXELS: pixels, DecodeKind.COEFFICIENTS: coefficients,
                 DecodeKind.ENCODED: encoded}[kind].append(position)
        # Pillow's share first (usually none): its pixels join the batch's layout beside the native ones.
        python_pairs.sort(key=lambda pair: pair[0])
        python_items = self._python(python_pairs, failures)
        if scanned is not None:
            if encoded:
                kept = self._keep_encoded(scanned, native_pairs, encoded)
                decoded += kept
                if self.start_encoded is not None and (pixels or coefficients):
                    self.encoded_started = self.start_encoded(kept)
            retry: List[Tuple[int, Any]] = []
            if pixels or coefficients or (self.resize.packs and _has_pixels(python_items)):
                more, python_items, packed, retry, early = self._decode_packed(scanned, native_pairs, pixels,
                                                                               coefficients, python_items)
                decoded += more
            python_items += self._python(sorted(retry, key=lambda pair: pair[0]), failures)
        elif self.resize.packs and _has_pixels(python_items):
            _, python_items, packed, _, _ = self._decode_packed(None, [], [], [], python_items)
        decoded += python_items
        decoded.sort(key=lambda item: item.index)
        failures.sort()
        result = DecodedImages(len(items), decoded, failures, packed)
        result.early_layout_is_batch = early is not None and packed is early and not encoded
        return result

    def _python(self, pairs: List[Tuple[int, Any]], failures: List[Tuple[int, str]]) -> List[DecodedItem]:
        """Pillow's way, in the Python threads (the exact share's inputs with ``exact_options``); failures noted,
        the rest returned."""
        good = []
        exact = [pair for pair in pairs if pair[0] in self.exact_indices]
        rest = [pair for pair in pairs if pair[0] not in self.exact_indices]
        decoded = python_decode(rest, self.options, self.threads)
        if exact:
            decoded = sorted(decoded + python_decode(exact, self.exact_options, self.threads),
                             key=lambda item: item.index)
        for item in decoded:
            if isinstance(item, DecodeFailure):
                failures.append((item.index, item.reason))
            else:
                good.append(item)
        return good

    def _keep_encoded(self, scanned, pairs, positions: List[int]) -> List[DecodedItem]:
        """decode="gpu": the JPEGs' bytes as they are, viewed where the scan found them (a request's bytes, a
        file it read), not copied: nvJPEG and torchvision's decode only read them."""
        rows = scanned.info[positions][:, [HEIGHT, WIDTH, CHANNELS, SAMPLING, PROGRESSIVE]].tolist()
        return [EncodedJpeg(pairs[position][0], encoded, (height, width), channels, sampling, bool(progressive),
                            _scan_notes(scanned, position))
                for position, encoded, (height, width, channels, sampling, progressive)
                in zip(positions, self.native.views(scanned, positions), rows)]

    def _decode_packed(self, scanned, pairs, pixels: List[int], coefficients: List[int],
                       python_items: List[DecodedItem]
                       ) -> Tuple[List[DecodedItem], List[DecodedItem], Optional[PackedPixels], List[Tuple[int, Any]],
                                  Optional[PackedPixels]]:
        """Pixels (and coefficients) decoded into their places; the native items, ``python_items`` again, the
        packed batch (None: the pixels are plain tensors for a resize on the CPU), the inputs to hand to
        Pillow after all, and the layout handed to ``on_layout`` (None: not called). With the kernel's layout,
        the pixels Pillow gave (``python_items`` with CPU pixels) are copied in after the native images', and
        their items come back as :class:`PixelsInLayout`."""
        info = scanned.info if scanned is not None else np.zeros((0, FORMAT + 1), dtype=np.int64)
        shapes = [tuple(int(value) for value in info[position, HEIGHT:CHANNELS + 1]) for position in pixels]
        count = len(pairs)
        pixel_offsets = np.full(count, -1, dtype=np.int64)
        coefficient_offsets = np.full(count, -1, dtype=np.int64)
        sizes = np.array([height * width * channels for height, width, channels in shapes], dtype=np.int64)
        plan = None
        joining: List[DecodedItem] = []
        if self.resize.packs:
            joining = [item for item in python_items if _cpu_pixels(item)]
            joining_shapes = [tuple(int(size) for size in item.pixels.shape) for item in joining]
            dct_shapes = [tuple(int(value) for value in info[position, HEIGHT:CHANNELS + 1])
                          for position in coefficients]
            plan = plan_batch(shapes + joining_shapes + dct_shapes, self.resize.spec)
            pixel_offsets[pixels] = plan.pixels_at + plan.meta[:len(pixels), 0]
            joining_bytes = sum(item.pixels.numel() for item in joining)
            host = plan.allocate_host(pin=True, pixel_bytes=int(sizes.sum()) + joining_bytes)
        else:
            pixel_offsets[pixels] = np.cumsum(sizes) - sizes
            host = torch.empty(max(int(sizes.sum()), 1), dtype=torch.uint8)
        coefficient_bytes = -(-info[coefficients, COEFFICIENT_BYTES] // ALIGN) * ALIGN
        coefficient_offsets[coefficients] = np.cumsum(coefficient_bytes) - coefficient_bytes
        table_room = int(coefficient_bytes.sum())  # the JPEG kernels' table follows, to go up in the same copy
        coefficient_host = torch.empty(max(table_room + table_bytes(len(coefficients)), ALIGN), dtype=torch.uint8,
                                       pin_memory=self.resize.packs and torch.cuda.is_available())
        early, opens = None, None
        if self.on_layout is not None and plan is not None and not python_items and (pixels or coefficients):
            # Everything the device step needs but the pixels and coefficients is known from the scan.
            early = PackedPixels(plan, host, [pairs[position][0] for position in pixels + coefficients],
                                 dct=self._dct_batch(scanned, plan, coefficients, coefficient_host,
                                                     coefficient_offsets, table_room, len(pixels)))
            opens = self.on_layout(early)
        declined = [""] * count
        if pixels or coefficients:
            declined = self.native.decode(scanned, host, pixel_offsets, coefficient_host, coefficient_offsets,
                                          split_jpegs=self.split_jpegs, opens=opens)
        in_layout: Dict[int, PixelsInLayout] = {}
        for number, item in enumerate(joining):
            slot = plan.pixel_slot(host, len(pixels) + number)
            np.copyto(slot.numpy(), item.pixels.numpy())
            in_layout[item.index] = PixelsInLayout(item.index, item.route, item.image_size, item.channels, item.notes)
        python_items = [in_layout.get(item.index, item) for item in python_items]
        items, retry, keep = [], [], []
        for number, position in enumerate(pixels):
            index = pairs[position][0]
            if declined[position]:  # e.g. libjpeg warned: Pillow decides what this file gives
                retry.append((index, pairs[position][1]))
                continue
            keep.append(number)
            image_size = (int(info[position, HEIGHT]), int(info[position, WIDTH]))
            channels = int(info[position, CHANNELS])
            route = Route.PNG if info[position, FORMAT] == FileFormat.PNG else Route.JPEG
            if plan is None:
                start = int(pixel_offsets[position])
                items.append(DecodedPixels(index, route,
                                           host[start:start + int(sizes[number])].view(*image_size, channels),
                                           _scan_notes(scanned, position)))
            else:
                items.append(PixelsInLayout(index, route, image_size, channels, _scan_notes(scanned, position)))
        if plan is None:
            return items, python_items, None, retry, None
        keep += range(len(pixels), len(pixels) + len(joining))
        first_dct = len(pixels) + len(joining)
        for number, position in enumerate(coefficients):
            index = pairs[position][0]
            if declined[position]:
                retry.append((index, pairs[position][1]))
                continue
            keep.append(first_dct + number)
            items.append(DctCoefficients(index, (int(info[position, HEIGHT]), int(info[position, WIDTH])),
                                         int(info[position, CHANNELS]), _scan_notes(scanned, position)))
        if early is not None and not retry:
            # Nothing declined (and nothing joined: no Pillow items at the hook): the layout handed out early, whose
            # table came from the same scan, is the batch.
            return items, python_items, early, retry, early
        dct = self._dct_batch(scanned, plan, coefficients, coefficient_host, coefficient_offsets, table_room,
                              first_dct)
        indices = ([pairs[position][0] for position in pixels] + [item.index for item in joining]
                   + [pairs[position][0] for position in coefficients])
        kept = None if len(keep) == len(indices) else keep
        return items, python_items, PackedPixels(plan, host, indices, dct=dct, keep=kept), retry, early

    @staticmethod
    def _dct_batch(scanned, plan, coefficients: List[int], coefficient_host: torch.Tensor,
                   coefficient_offsets: np.ndarray, table_room: int, first_dct: int) -> Optional[DctBatch]:
        """The GPU JPEG kernels' batch for the ``coefficients`` positions, whose layout rows start at ``first_dct``."""
        if not coefficients:
            return None
        dct = plan_dct_batch([scanned.layout(position) for position in coefficients],
                             [(coefficient_host, coefficient_offsets[coefficients].tolist())], table_room)
        dct.place(plan.meta[first_dct:, 0])
        return dct


def _has_pixels(items: List[DecodedItem]) -> bool:
    return any(isinstance(item, DecodedPixels) for item in items)


def _cpu_pixels(item: DecodedItem) -> bool:
    return isinstance(item, DecodedPixels) and item.pixels.device.type == "cpu"


def _scan_notes(scanned, position: int) -> Tuple[str, ...]:
    """What the native decoder noted about the input at ``position`` of its scan."""
    note = scanned.notes[position]
    return (note,) if note else ()
