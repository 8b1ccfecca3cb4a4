"""Files, bytes, PIL images or uint8 arrays in; OpenCLIP's model-ready batch out, on the device.

    prep = clip_flash.ImagePreprocessor(preprocess, device="cuda", dtype=torch.float16)
    out = prep(["a.jpg", jpeg_bytes, pil_image, uint8_hwc_tensor])
    model.encode_image(out.pixels)        # rows come from inputs out.indices
    out.failures                          # [(index, reason)]: unreadable inputs, never raised

The exact path (default) gives, bit for bit, ``torch.stack([preprocess(Image.open(p)) for p in
paths])`` cast to ``dtype`` (fp32: identical; fp16/bf16: the reference cast). It decodes on the CPU
and resamples on the device; see :mod:`clip_flash.inputs.image.image_decoding` for the routes, and what runs
``preprocess`` itself on the CPU (images Pillow resizes specially: RGBA, LA, P, 1, CMYK, I;16, ...).
"""
from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from PIL import Image

from .image_batches import DecodedImages, PackedPixels, PreparedImages, RowsOnDevice
from .decoder_check import decoder_agreement
from .gpu_jpeg import CHROMA, decode_jpegs_on_gpu
from .nvjpeg_packed import PackedJpegs, decode_into_layout
from .image_decoding import (DecodedItem, DecodedPixels, DecodeFailure, DecodeOptions, EncodedJpeg,
                             PreparedByPreprocess, decode_item, describe_error)
from .image_resize import ExactResize
from .native_batch import NativeBatch, python_decode, default_workers
from .native_decode import NativeBatchDecoder, ScanMode
from .thread_streams import thread_stream

logger = logging.getLogger(__name__)

# Python threads decoding what Pillow prepares its own way (or everything, without the native decoder): beside
# the thread that launches the model, more than a few only compete for the GIL and slow the whole job.
PYTHON_DECODE_THREADS = 4
EXECUTORS = ("auto", "native", "thread")
ImageInput = Union[str, "os.PathLike[str]", bytes, bytearray, memoryview, Image.Image, torch.Tensor, np.ndarray]
DECODERS = ("cpu", "gpu")
MAX_NVJPEG_DECODERS = 8  # kMaxDecoders in csrc/nvjpeg_decode.cpp


class ImagePreprocessor:
    """OpenCLIP's eval ``preprocess``, exactly, for a batch of images, onto ``device`` in ``dtype``.

    Args:
        preprocess: the transform ``open_clip.create_model_and_transforms`` returned (Resize /
            CenterCrop or OpenCLIP's ResizeKeepRatio / CenterCropOrPad, ToTensor, Normalize). One it
            does not understand is refused (``UnsupportedTransformError``), never approximated.
        device: where the batch goes (``"cuda"`` or ``"cpu"``; the same exact arithmetic on both). None (default):
            CUDA where there is one, else the CPU.
        dtype: of the batch; fp32 is the reference bit for bit, fp16/bf16 the reference cast. None (default):
            fp16 on CUDA, fp32 on the CPU (the precisions ``clip-flash embed`` and ``serve`` load models in there).
        decode: ``"cpu"`` (exact: libjpeg-turbo, Pillow's own pixels) or ``"gpu"``: nvJPEG decodes
            the JPEGs, which is faster and NOT exact (nvJPEG repeats chroma samples where libjpeg-turbo
            interpolates: up to tens of levels apart; see ``gpu_chroma``;
            ``benchmarks/image_fast_path_deviation.py`` measures it). Other formats take the exact path.
        workers: native decoding threads (default: the cores this process may use).
        executor: ``"auto"`` (default: the native batch decoder where the extension is built, else Python
            threads), ``"native"`` (required: ``ValueError`` where it cannot run, saying why) or ``"thread"``
            (Python threads with Pillow and torchvision's CPU decoders: the same rows, capped by the GIL).
        start: make the decoder now (see :meth:`start`); False: on first use.
        resize: ``"auto"`` (the CUDA kernel on a GPU, Pillow on the CPU), ``"kernel"``, ``"torch"``
            (clip_flash's fixed-point arithmetic in PyTorch on the CPU) or ``"pillow"``: the same bits.
        gpu_chroma: with ``decode="gpu"``: ``"libjpeg"`` recovers the chroma from nvJPEG's output and
            upsamples and converts it the libjpeg-turbo way (closer to Pillow, still not exact);
            ``"nvjpeg"`` keeps nvJPEG's own (repeated) chroma.
        dct_route: on a GPU with the kernel's resize, JPEGs are only entropy-decoded on the CPU and the GPU
            finishes their decode (the same pixels; see :mod:`.jpeg_dct`). False: decoded whole on the CPU.
        nvjpeg_hardware: with ``decode="gpu"``, nvJPEG's hardware decoder writes baseline colour JPEGs straight
            into the resize kernel's layout (see :mod:`.nvjpeg_packed`). False: torchvision's decode only.
        nvjpeg_decoders: hardware decodes running at once, from different threads (1 to 8).
        exact_share: with ``decode="gpu"``, the hardware decoder and the native decoder: the share of each
            batch's inputs decoded exactly on the CPU at the same time as the hardware decodes the others (those
            rows are exact; see :mod:`.exact_share`, which says why it is off by default). 0: nvJPEG decodes every
            JPEG it can.
        split_jpegs: a call with a single JPEG (from 4 native threads on; with 16 or more, up to one per 8
            threads) splits each JPEG's entropy decode across the threads (``csrc/jpeg_entropy_split.h``: the same
            coefficients, a lower latency). False: one thread a JPEG, as in larger batches.

    Exactness: inputs whose Pillow mode is RGB or L (nearly all photos) are decoded to uint8 pixels
    and resampled by clip_flash's Pillow-exact resize on the device. Inputs Pillow treats specially
    (RGBA and LA are resized premultiplied, P and 1 resize NEAREST, CMYK, I;16, I, F, animated GIFs'
    first frame in P) run ``preprocess`` itself on the CPU, logged at debug level; the rows are the
    same either way. ``Image.open`` applies no EXIF orientation, so neither does this.

    Bad inputs (missing, empty, truncated or corrupt files, non-images, decompression bombs past
    Pillow's limit) never raise: they are listed in ``failures`` with the reason, as Pillow gave it.
    Memory: a call holds its inputs' decoded pixels once (3 bytes per pixel), so pass batches.

    Lifetimes: the rows returned are the caller's; host buffers a batch used come from torch's page-locked
    allocator, which reuses one only after the copies that read it are done, so dropping the preparer (or
    its decoded batches) at any point is safe.

    ``prep(items)`` equals ``prep.prepare(prep.decode(items))``; :meth:`decode` is CPU work and
    thread-safe, so a pipeline can decode the next batch while the device works on this one.
    """

    def __init__(self, preprocess: Callable[[Image.Image], torch.Tensor],
                 device: Optional[Union[str, torch.device]] = None, dtype: Optional[torch.dtype] = None,
                 decode: str = "cpu", workers: Optional[int] = None,
                 executor: str = "auto", resize: str = "auto", gpu_chroma: str = "libjpeg",
                 start: bool = True, dct_route: bool = True, nvjpeg_hardware: bool = True,
                 nvjpeg_decoders: int = 2, exact_share: float = 0.0, split_jpegs: bool = True) -> None:
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if dtype is None:
            dtype = torch.float16 if torch.device(device).type == "cuda" else torch.float32
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {self.device} asked for, but CUDA is not available here; use device='cpu'")
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if decode not in DECODERS:
            raise ValueError(f"decode must be one of {DECODERS}, got {decode!r}")
        if decode == "gpu" and self.device.type != "cuda":
            raise ValueError("decode='gpu' (nvJPEG) needs a CUDA device")
        if gpu_chroma not in CHROMA:
            raise ValueError(f"gpu_chroma must be one of {CHROMA}, got {gpu_chroma!r}")
        if executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {EXECUTORS}, got {executor!r}")
        if not 1 <= nvjpeg_decoders <= MAX_NVJPEG_DECODERS:
            raise ValueError(f"nvjpeg_decoders must be from 1 to {MAX_NVJPEG_DECODERS}, got {nvjpeg_decoders}")
        if not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating-point dtype, got {dtype}")
        self.gpu_chroma = gpu_chroma
        self.nvjpeg_hardware = nvjpeg_hardware
        self.nvjpeg_decoders = nvjpeg_decoders
        self.preprocess = preprocess
        self.dtype = dtype
        self.decoder = decode
        self.resize = ExactResize(preprocess, self.device, dtype, resize)  # refuses unsupported transforms
        agreement = decoder_agreement()
        self.decoder_agreement = agreement
        self.options = DecodeOptions(preprocess, use_torchvision_jpeg=agreement.jpeg,
                                     use_torchvision_png=agreement.png, keep_jpeg_bytes=decode == "gpu",
                                     spec=self.resize.spec)
        self._cpu_options = DecodeOptions(preprocess, agreement.jpeg, agreement.png, keep_jpeg_bytes=False,
                                          spec=self.resize.spec)
        self.workers = workers or default_workers()
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, got {self.workers}")
        if not 0.0 <= exact_share <= 1.0:
            raise ValueError(f"exact_share must be from 0 to 1, got {exact_share}")
        self.exact_share = float(exact_share)
        self.split_jpegs = split_jpegs
        if decode == "gpu":
            self.scan_mode = ScanMode.ENCODED
        elif dct_route and self.resize.packs:
            self.scan_mode = ScanMode.COEFFICIENTS
        else:
            self.scan_mode = ScanMode.PIXELS
        self._native: Optional[NativeBatchDecoder] = None
        self._native_decided = executor == "thread"
        self.executor = executor
        self._lock = threading.Lock()
        self._threads: Optional[ThreadPoolExecutor] = None
        self._hardware_threads: Optional[ThreadPoolExecutor] = None
        if executor == "native":
            with self._lock:
                self._native, reason = NativeBatchDecoder.create_or_reason(self.workers)
                self._native_decided = True
            if self._native is None:
                raise ValueError(f"executor='native' asked for, but the native batch decoder cannot run here: {reason}")
        if start:
            self.start()

    def start(self, batch_size: Optional[int] = None, wait: bool = False) -> None:
        """Make the decoder now (its native threads, Pillow's libjpeg opened) rather than on the first call; in
        a background thread unless ``wait``. Idempotent. ``batch_size`` is accepted for callers that size
        things ahead; nothing here depends on it."""
        del batch_size
        if wait:
            self._native_decoder()
            return
        threading.Thread(target=self._native_decoder, daemon=True, name="clip_flash-decoder-start").start()

    def _native_decoder(self) -> Optional[NativeBatchDecoder]:
        with self._lock:
            if not self._native_decided:
                self._native = NativeBatchDecoder.create(self.workers)
                self._native_decided = True
            return self._native

    def _python_threads(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._threads is None:
                self._threads = ThreadPoolExecutor(max(1, min(PYTHON_DECODE_THREADS, self.workers)),
                                                   thread_name_prefix="clip_flash-decode")
            return self._threads

    def _decode_on_hardware(self, items: List[DecodedItem]) -> Optional[PackedJpegs]:
        """:func:`decode_into_layout` of ``items`` on this preparer's device, from whichever thread calls it."""
        with torch.cuda.device(self.device):
            return decode_into_layout(items, self.device, self.resize.spec, self.gpu_chroma, self.nvjpeg_decoders)

    def _start_hardware_decode(self, items: List[DecodedItem]) -> "Future[Optional[PackedJpegs]]":
        """:meth:`_decode_on_hardware` in a thread of its own, so that the native decoder works on the rest of the
        batch meanwhile (both release the GIL)."""
        with self._lock:
            if self._hardware_threads is None:
                self._hardware_threads = ThreadPoolExecutor(self.nvjpeg_decoders,
                                                            thread_name_prefix="clip_flash-nvjpeg")
            threads = self._hardware_threads
        return threads.submit(self._decode_on_hardware, items)

    @property
    def native(self) -> bool:
        """Whether batches decode in the native decoder (else in Python threads)."""
        return self._native_decoder() is not None

    @property
    def launches_early(self) -> bool:
        """Whether :meth:`decode` can hand out a batch's layout before decoding it (``on_layout``): the exact path
        on a CUDA device with the native decoder and the kernel's resize."""
        return (self.decoder == "cpu" and self.device.type == "cuda" and self.resize.packs
                and self._native_decoder() is not None)

    @property
    def output_size(self) -> Tuple[int, int]:
        """(height, width) of each row."""
        return self.resize.output_size

    # ----- the two steps ------------------------------------------------------------------
    def decode(self, items: Sequence[ImageInput],
               on_layout: Optional[Callable[[PackedPixels], Optional[Tuple[torch.Tensor, int]]]] = None
               ) -> DecodedImages:
        """The CPU step: read and decode every input (one native call for the batch's files and bytes; Python
        threads for what Pillow prepares its own way). Never raises for a bad input.

        ``on_layout`` (the exact path on a GPU, with the native decoder): called from this call, once the
        batch's layout is planned and before the native decoder writes its page-locked buffers, with that
        layout, where every input goes through it; :meth:`prepare_layout` of it, queued (by another thread)
        behind a host gate whose ``opener`` ``on_layout`` returns, computes the batch's rows while the CPU still
        decodes: the native decoder opens the gate the moment the buffers are written. ``early_layout_is_batch``
        of the result says whether those rows are the batch's (else use :meth:`prepare`).

        With ``decode="gpu"`` it reads the JPEGs and their headers and, where nvJPEG's hardware decoder runs
        (see :mod:`.nvjpeg_packed`), decodes the baseline colour ones straight into the resize kernel's
        layout on the device, ahead of the batch, since that call releases the GIL; it then queues the resize
        of what lies in the kernel's layouts (those, and the exact share's) on this thread's stream
        (:meth:`_resize_ahead`). :meth:`prepare` runs torchvision's nvJPEG decode on whatever is left."""
        if isinstance(items, (str, bytes, bytearray, memoryview, Image.Image, torch.Tensor, np.ndarray)):
            raise TypeError("pass a sequence of images (a list), not a single image")
        items = list(items)
        native = self._native_decoder()
        hardware = self.decoder == "gpu" and self.resize.packs and self.nvjpeg_hardware
        started = None
        if native is not None:
            batch = NativeBatch(native, self.scan_mode, self.resize, self.options, self._python_threads(),
                                exact_share=self.exact_share if hardware else 0.0,
                                start_encoded=self._start_hardware_decode if hardware else None,
                                exact_options=self._cpu_options, split_jpegs=self.split_jpegs,
                                on_layout=on_layout if self.launches_early else None)
            decoded = batch.decode(items)
            started = batch.encoded_started
        else:
            decoded = self._decode_in_threads(items)
        for item in decoded.items:
            for note in item.notes:
                logger.debug("input %d: %s", item.index, note)
        if started is not None:
            decoded.on_gpu = started.result()
        elif hardware:
            decoded.on_gpu = self._decode_on_hardware(decoded.items)
        if self.decoder == "gpu" and self.device.type == "cuda":
            self._resize_ahead(decoded)
        return decoded

    def _resize_ahead(self, decoded: DecodedImages) -> None:
        """Resize and assemble what lies in the kernel's layouts (the hardware decoder's, and the native
        decoder's: the exact share, and what Pillow decoded) on this thread's stream, into ``decoded.ahead``.

        Why here: the thread calling :meth:`prepare` (in the job and the server) also launches the model, and
        each launch it makes waits for the GIL beside the decoding threads; these uploads and launches (with an
        exact share, a dozen or so a batch) are queued instead by the decoding thread, which otherwise only
        waits for the native decoder. If they fail here (e.g. out of memory), :meth:`prepare` runs them again
        and reports what it gets."""
        if decoded.packed is None and decoded.on_gpu is None:
            return
        try:
            with torch.cuda.device(self.device), torch.cuda.stream(thread_stream(self.device)):
                rows, indices = self._assemble(self._layout_rows(decoded))
                ready = torch.cuda.Event()
                ready.record()
        except RuntimeError as error:
            logger.debug("resizing ahead failed (%s); prepare() resizes", describe_error(error))
            return
        decoded.packed = decoded.on_gpu = None
        decoded.ahead = RowsOnDevice(indices, rows, ready)

    def _decode_in_threads(self, items: List[ImageInput]) -> DecodedImages:
        """Without the native decoder: Python threads with Pillow (and torchvision's CPU decoders, which
        release the GIL); the pixels then go into one page-locked buffer laid out for the kernel."""
        decoded = python_decode(list(enumerate(items)), self.options, self._python_threads())
        failures = [(item.index, item.reason) for item in decoded if isinstance(item, DecodeFailure)]
        good = [item for item in decoded if not isinstance(item, DecodeFailure)]
        packed = None
        pixel_items = [item for item in good if isinstance(item, DecodedPixels) and item.pixels.device.type == "cpu"]
        if self.resize.packs and pixel_items:
            plan, buffer, slots = self.resize.pack_on_host([item.pixels for item in pixel_items])
            in_buffer = {item.index: replace(item, pixels=slot) for item, slot in zip(pixel_items, slots)}
            good = [in_buffer.get(item.index, item) for item in good]
            packed = PackedPixels(plan, buffer, [item.index for item in pixel_items])
        return DecodedImages(len(items), good, failures, packed)

    def prepare(self, decoded: DecodedImages) -> PreparedImages:
        """The device step: resample the decoded pixels exactly and assemble the batch in input order.

        With ``decode="gpu"`` the current stream waits for the rows :meth:`decode` already queued (the hardware
        route's and the exact share's), and this queues torchvision's nvJPEG decode of the rest, the chroma
        step and the packing on side streams. torchvision's decode runs here, on the thread that also launches
        the model, not ahead on a decoding thread: its batched call takes the GIL again for each image, so beside
        a thread running Python (launches) both crawl."""
        failures = list(decoded.failures)
        route_of = {item.index: str(item.route) for item in decoded.items}
        groups: List[Tuple[List[int], torch.Tensor]] = []
        if decoded.ahead is not None:
            groups.append(decoded.ahead.hand_over())
        groups += self._layout_rows(decoded)
        done = {index for indices, _ in groups for index in indices}
        pixel_items = [item for item in decoded.items if isinstance(item, DecodedPixels) and item.index not in done]
        jpeg_items = [item for item in decoded.items if isinstance(item, EncodedJpeg) and item.index not in done]
        prepared_items = [item for item in decoded.items if isinstance(item, PreparedByPreprocess)]
        device_pixels = [item.pixels for item in pixel_items]
        if jpeg_items:
            # Laid out for the resize kernel on the side stream too, unless other pixels join them.
            pack = self.resize.pack_on_device if self.resize.implementation == "kernel" and not pixel_items else None
            queued = decode_jpegs_on_gpu(jpeg_items, self.device, self.gpu_chroma, pack)
            use_packed = queued.packed is not None
            on_gpu, refused = queued.hand_over(use_packed)
            if use_packed:
                # Packed by the decode thread: one kernel launch here, no per-image work on this thread.
                groups.append(([item.index for item, _ in on_gpu], self.resize.run_packed(*queued.packed)))
                on_gpu = []
            for item, pixels in on_gpu:
                pixel_items.append(item)
                device_pixels.append(pixels)
            for item, reason in refused:
                # nvJPEG could not: the exact CPU decode decides (and may still fail, like Pillow).
                logger.debug("input %d: nvJPEG refused (%s); decoding on the CPU", item.index, reason)
                fallback = decode_item(item.index, bytes(item.encoded.numpy()), self._cpu_options)
                route_of[item.index] = str(fallback.route)
                if isinstance(fallback, DecodeFailure):
                    failures.append((item.index, fallback.reason))
                elif isinstance(fallback, PreparedByPreprocess):
                    prepared_items.append(fallback)
                else:
                    pixel_items.append(fallback)
                    device_pixels.append(fallback.pixels.to(self.device))  # beside nvJPEG's, on the GPU
        if pixel_items:
            groups.append(self._resize_group(pixel_items, device_pixels, failures))
        if prepared_items:
            stacked = torch.stack([item.prepared for item in prepared_items])
            groups.append(([item.index for item in prepared_items], stacked.to(self.device, self.dtype)))
        failures.sort()
        pixels, indices = self._assemble([group for group in groups if group[0]])
        routes: Dict[str, int] = {}
        for index in indices:
            routes[route_of[index]] = routes.get(route_of[index], 0) + 1
        if failures:
            routes["failed"] = len(failures)
        return PreparedImages(pixels, indices, failures, routes)

    def prepare_layout(self, layout: PackedPixels) -> PreparedImages:
        """The device step of a layout :meth:`decode` handed to ``on_layout``, queued before its buffers are
        written: its uploads first wait for the work queued on the current stream so far (the caller's gate), then
        the rows are computed as :meth:`prepare` computes them. Its failures are the decoded batch's."""
        pixels, indices = self._assemble(self._layout_rows(DecodedImages(0, [], [], layout),
                                                           upload_on_current_stream=True))
        return PreparedImages(pixels, indices, [])

    def __call__(self, items: Sequence[ImageInput]) -> PreparedImages:
        """``prepare(decode(items))``."""
        return self.prepare(self.decode(items))

    # ----- helpers ------------------------------------------------------------------------
    def _layout_rows(self, decoded: DecodedImages, upload_on_current_stream: bool = False
                     ) -> List[Tuple[List[int], torch.Tensor]]:
        """The rows of what lies in the kernel's layouts (``packed``: the native decoder's; ``on_gpu``: the
        hardware decoder's), one resize launch each, on the current stream (the packed layout's copies too with
        ``upload_on_current_stream``, behind what the stream holds)."""
        groups: List[Tuple[List[int], torch.Tensor]] = []
        if decoded.packed is not None:
            packed = decoded.packed
            rows = self.resize.run_packed(packed.plan, packed.buffer, packed.segments, packed.dct,
                                          upload_on_current_stream)
            indices = packed.indices
            if packed.keep is not None:  # images the native decoder handed to Pillow after all: not these rows
                rows = rows.index_select(0, _index_tensor(packed.keep, rows.device))
                indices = [indices[position] for position in packed.keep]
            groups.append((indices, rows))
        if decoded.on_gpu is not None:
            groups.append(self._hardware_decoded_rows(decoded.on_gpu))
        return groups

    def _hardware_decoded_rows(self, hardware: PackedJpegs) -> Tuple[List[int], torch.Tensor]:
        """The rows of what the hardware decoder wrote into the kernel's layout: one resize launch."""
        hardware.hand_over()
        rows = self.resize.run_packed(hardware.plan, hardware.buffer)
        decoded = hardware.decoded
        if len(decoded) < len(hardware.items):  # the rest are decoded elsewhere: their slots are empty
            rows = rows.index_select(0, _index_tensor(decoded, rows.device))
        return [hardware.items[position].index for position in decoded], rows

    def _resize_group(self, items: List[DecodedItem], pixels: List[torch.Tensor],
                      failures: List[Tuple[int, str]]) -> Tuple[List[int], torch.Tensor]:
        """The batch through the exact resize; if it refuses, image by image, so that only the images
        the transform cannot handle (as OpenCLIP's own fails on them) become failures."""
        try:
            return [item.index for item in items], self.resize(pixels)
        except Exception as error:  # noqa: BLE001 - find the image(s) at fault, keep the others
            logger.debug("batch resize refused (%s); resizing image by image", describe_error(error))
        indices, rows = [], []
        for item, image in zip(items, pixels):
            try:
                rows.append(self.resize([image]))
                indices.append(item.index)
            except Exception as error:  # noqa: BLE001
                failures.append((item.index, describe_error(error)))
        height, width = self.output_size
        if not rows:
            return [], torch.empty((0, 3, height, width), device=self.device, dtype=self.dtype)
        return indices, torch.cat(rows)

    def _assemble(self, groups: List[Tuple[List[int], torch.Tensor]]) -> Tuple[torch.Tensor, List[int]]:
        """Rows of all groups in input order."""
        height, width = self.output_size
        if not groups:
            return torch.empty((0, 3, height, width), device=self.device, dtype=self.dtype), []
        if len(groups) == 1 and groups[0][0] == sorted(groups[0][0]):
            return groups[0][1], groups[0][0]
        indices = sorted(index for group_indices, _ in groups for index in group_indices)
        row_of = {index: row for row, index in enumerate(indices)}
        out = torch.empty((len(indices), 3, height, width), device=self.device, dtype=self.dtype)
        for group_indices, rows in groups:
            positions = _index_tensor([row_of[index] for index in group_indices], self.device)
            out.index_copy_(0, positions, rows)
        return out, indices

    def close(self) -> None:
        """Let the decoder's threads go (a later call makes them again)."""
        with self._lock:
            pools = (self._threads, self._hardware_threads)
            self._threads = self._hardware_threads = None
            self._native, self._native_decided = None, self.executor == "thread"
        for threads in pools:
            if threads is not None:
                threads.shutdown(wait=True)

    def __enter__(self) -> "ImagePreprocessor":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def _index_tensor(values: Sequence[int], device: torch.device) -> torch.Tensor:
    """``values`` as an int64 tensor on ``device``, without waiting for the device: a copy from pageable memory
    (``torch.tensor(values, device=...)``) synchronizes the current stream, i.e. waits for every batch queued
    there; from page-locked memory it is queued like the rest."""
    host = torch.tensor(values, dtype=torch.int64)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
