"""Files, bytes, PIL images or uint8 arrays in; OpenCLIP's model-ready batch out, on the device.

    prep = clip_flash.ImagePreprocessor(preprocess, device="cuda", dtype=torch.float16)
    out = prep(["a.jpg", jpeg_bytes, pil_image, uint8_hwc_tensor])
    model.encode_image(out.pixels)        # rows come from inputs out.indices
    out.failures                          # [(index, reason)]: unreadable inputs, never raised

The exact path (default) gives, bit for bit, ``torch.stack([preprocess(Image.open(p)) for p in
paths])`` cast to ``dtype`` (fp32: identical; fp16/bf16: the reference cast). It decodes on the CPU
and resamples on the device; see :mod:`clip_flash.inputs.image_decoding` for the routes, and what runs
``preprocess`` itself on the CPU (images Pillow resizes specially: RGBA, LA, P, 1, CMYK, I;16, ...).
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from PIL import Image

from .decode_pool import EXECUTORS, DecodePool, default_workers
from .image_batches import DecodedImages, PackedPixels, PreparedImages
from .decoder_check import decoder_agreement
from .gpu_jpeg import CHROMA, decode_jpegs_on_gpu
from .nvjpeg_packed import PackedJpegs, decode_into_layout
from .jpeg_dct import plan_dct_batch, route_reader
from .background_load import DeferredTransform
from .image_decoding import DecodedItem, DecodeOptions, decode_item, describe_error
from ..ops._extension import load_extension
from ..ops.image_resample import plan_batch
from .image_resize import ExactResize
from .pixel_arena import ArenaPool, arenas_supported

logger = logging.getLogger(__name__)

ARENAS_AHEAD = 4  # arenas start() makes for the first batches: those decoding and those queued behind them
# decode="gpu": the CPU step only reads files and scans headers, which a few workers keep up with. Where they
# are threads (until the processes are up, or where there are none), more of them only compete for the GIL with
# the thread that launches the model (measured on 16 cores: 4 threads 5,123 img/s for ViT-B-32, 16 threads 4,066).
GPU_DECODE_READERS = 4
ImageInput = Union[str, "os.PathLike[str]", bytes, bytearray, memoryview, Image.Image, torch.Tensor, np.ndarray]
DECODERS = ("cpu", "gpu")


class ImagePreprocessor:
    """OpenCLIP's eval ``preprocess``, exactly, for a batch of images, onto ``device`` in ``dtype``.

    Args:
        preprocess: the transform ``open_clip.create_model_and_transforms`` returned (Resize /
            CenterCrop or OpenCLIP's ResizeKeepRatio / CenterCropOrPad, ToTensor, Normalize). One it
            does not understand is refused (``UnsupportedTransformError``), never approximated.
        device: where the batch goes (``"cuda"`` or ``"cpu"``; the same exact arithmetic on both).
        dtype: of the batch; fp32 is the reference bit for bit, fp16/bf16 the reference cast.
        decode: ``"cpu"`` (exact: libjpeg-turbo, Pillow's own pixels) or ``"gpu"``: nvJPEG decodes
            the JPEGs, which is faster and NOT exact (nvJPEG repeats chroma samples where libjpeg-turbo
            interpolates: up to tens of levels apart; see ``gpu_chroma``;
            ``benchmarks/image_fast_path_deviation.py`` measures it). Other formats take the exact path.
        workers: CPU workers decoding (default: the cores this process may use; with ``decode="gpu"``, which
            only reads files and headers on the CPU, at most ``GPU_DECODE_READERS``).
        executor: ``"auto"`` (default: ``"process"`` where decoded pixels, or with ``decode="gpu"`` the
            JPEG bytes, go to the GPU through shared arenas, i.e. a CUDA device on Linux; ``"thread"``
            otherwise), ``"thread"`` (the
            decoders release the GIL, but Pillow's header parsing and the bookkeeping do not: a cap on
            many cores) or ``"process"`` (no GIL cap; workers are forked from a fork server that imported
            the decoding modules once, or spawned where there is none; a script using them needs the usual
            ``if __name__ == "__main__":`` guard).
        start: start the workers now, in the background (see :meth:`start`); False: on first use.
        resize: ``"auto"`` (the CUDA kernel on a GPU, Pillow on the CPU), ``"kernel"``, ``"torch"``
            (clip_flash's fixed-point arithmetic in PyTorch on the CPU) or ``"pillow"``: the same bits.
        gpu_chroma: with ``decode="gpu"``: ``"libjpeg"`` recovers the chroma from nvJPEG's output and
            upsamples and converts it the libjpeg-turbo way (closer to Pillow, still not exact);
            ``"nvjpeg"`` keeps nvJPEG's own (repeated) chroma.

    Exactness: inputs whose Pillow mode is RGB or L (nearly all photos) are decoded to uint8 pixels
    and resampled by clip_flash's Pillow-exact resize on the device. Inputs Pillow treats specially
    (RGBA and LA are resized premultiplied, P and 1 resize NEAREST, CMYK, I;16, I, F, animated GIFs'
    first frame in P) run ``preprocess`` itself on the CPU, logged at debug level; the rows are the
    same either way. ``Image.open`` applies no EXIF orientation, so neither does this.

    Bad inputs (missing, empty, truncated or corrupt files, non-images, decompression bombs past
    Pillow's limit) never raise: they are listed in ``failures`` with the reason, as Pillow gave it.
    Memory: a call holds its inputs' decoded pixels once (3 bytes per pixel), so pass batches.

    ``prep(items)`` equals ``prep.prepare(prep.decode(items))``; :meth:`decode` is CPU work and
    thread-safe, so a pipeline can decode the next batch while the device works on this one.
    """

    def __init__(self, preprocess: Callable[[Image.Image], torch.Tensor], device: Union[str, torch.device] = "cuda",
                 dtype: torch.dtype = torch.float16, decode: str = "cpu", workers: Optional[int] = None,
                 executor: str = "auto", resize: str = "auto", gpu_chroma: str = "libjpeg",
                 start: bool = True) -> None:
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
        self.gpu_chroma = gpu_chroma
        if executor not in EXECUTORS + ("auto",):
            raise ValueError(f"executor must be 'auto' or one of {EXECUTORS}, got {executor!r}")
        if not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating-point dtype, got {dtype}")
        self.preprocess = preprocess
        self.dtype = dtype
        self.decoder = decode
        self.resize = ExactResize(preprocess, self.device, dtype, resize)  # refuses unsupported transforms
        agreement = decoder_agreement()
        self.decoder_agreement = agreement
        # The exact path's GPU JPEG route needs the arenas (coefficients travel in them) and the kernel's layout.
        dct_route = decode == "cpu" and self.resize.packs and arenas_supported()
        # Deferred: worker processes unpickle OpenCLIP's transform (importing OpenCLIP) only if they need it, in
        # the background, handing the images that need it back to this process meanwhile.
        self.options = DecodeOptions(DeferredTransform(preprocess), use_torchvision_jpeg=agreement.jpeg,
                                     use_torchvision_png=agreement.png, keep_jpeg_bytes=decode == "gpu",
                                     spec=self.resize.spec,
                                     dct_reader=route_reader(load_extension()) if dct_route else None)
        self._cpu_options = DecodeOptions(preprocess, agreement.jpeg, agreement.png, keep_jpeg_bytes=False,
                                          spec=self.resize.spec)
        self.workers = workers or (min(GPU_DECODE_READERS, default_workers()) if decode == "gpu" else default_workers())
        if executor == "auto":
            # Processes decode straight into the kernel's arenas (or put the JPEG bytes there): no GIL held in
            # this process, where the model's launches need it, and no copy here.
            executor = "process" if self.resize.packs and arenas_supported() else "thread"
        self.executor = executor
        self.pool = DecodePool(self.options, self.workers, executor)
        self._arenas: Optional[ArenaPool] = None
        self._arena_lock = threading.Lock()
        self._reserver: Optional[threading.Thread] = None
        if start:
            self.start()

    def start(self, batch_size: Optional[int] = None, arenas: int = ARENAS_AHEAD, wait: bool = False) -> None:
        """Start what the first batches need, in the background, so that it overlaps other work (a model
        loading): the decoding workers (processes forked or spawned, each warmed up by one decode) and, given
        ``batch_size`` on the arena route (a GPU), ``arenas`` page-locked pixel arenas for batches that size.
        Idempotent; calls made meanwhile wait only for what they use. ``wait``: return when all is ready."""
        self.pool.start(wait=wait)
        if batch_size and arenas > 0 and self.resize.packs and arenas_supported():
            reserver = threading.Thread(target=self._reserve_arenas, args=(batch_size, arenas), daemon=True,
                                        name="clip_flash-arenas")
            with self._arena_lock:
                self._reserver = reserver
            reserver.start()
            if wait:
                reserver.join()

    def _arena_pool(self) -> ArenaPool:
        with self._arena_lock:
            if self._arenas is None:
                self._arenas = ArenaPool(pin=self.device.type == "cuda")
            return self._arenas

    def _reserve_arenas(self, batch_size: int, count: int) -> None:
        # Page-locked for this device's context.
        on_device = torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext()
        try:
            with on_device:
                self._arena_pool().reserve(batch_size, count)
        except Exception as error:  # noqa: BLE001 - the first batch makes its arena itself, and reports
            logger.debug("pixel arenas not made ahead: %s", describe_error(error))

    @property
    def output_size(self) -> Tuple[int, int]:
        """(height, width) of each row."""
        return self.resize.output_size

    # ----- the two steps ------------------------------------------------------------------
    def decode(self, items: Sequence[ImageInput]) -> DecodedImages:
        """The CPU step: read and decode every input (in the worker pool). Never raises for a bad input.

        With ``decode="gpu"`` it reads the JPEGs and their headers and, where nvJPEG's hardware decoder runs
        (see :mod:`.nvjpeg_packed`), decodes the baseline colour ones straight into the resize kernel's
        layout on the device, ahead of the batch, since that call releases the GIL; :meth:`prepare` runs
        torchvision's nvJPEG decode on whatever is left."""
        if isinstance(items, (str, bytes, bytearray, memoryview, Image.Image, torch.Tensor, np.ndarray)):
            raise TypeError("pass a sequence of images (a list), not a single image")
        decoded = self._cpu_step(list(items))
        if self.decoder == "gpu" and self.resize.packs:
            decoded.on_gpu = decode_into_layout(decoded.items, self.device, self.resize.spec, self.gpu_chroma)
        return decoded

    def _cpu_step(self, items: List[ImageInput]) -> DecodedImages:
        if self.resize.packs and items and arenas_supported():
            return self._decode_into_arena(items)
        decoded = self.pool.decode(items)
        failures = [(item.index, item.reason) for item in decoded if not item.ok]
        good = [item for item in decoded if item.ok]
        self._log_notes(good)
        packed = None
        # Pixels on the CPU go into the kernel's buffer; a tensor passed in on the GPU is packed there later.
        pixel_items = [item for item in good if item.pixels is not None and item.pixels.device.type == "cpu"]
        if self.resize.packs and pixel_items:
            # One page-locked buffer for the whole batch, filled by the pool's threads: the device step
            # is then one upload and one kernel launch.
            plan, buffer, slots = self.resize.pack_on_host([item.pixels for item in pixel_items],
                                                           self.pool.copy_many)
            for item, slot in zip(pixel_items, slots):
                item.pixels = slot
            packed = PackedPixels(plan, buffer, [item.index for item in pixel_items])
        return DecodedImages(len(items), good, failures, packed)

    def _decode_into_arena(self, items: List[ImageInput]) -> DecodedImages:
        """The kernel's route: workers write pixels straight into a reused page-locked arena, each task
        into its own region; the plan (meta rows, tap tables) is made here from the sizes alone. On the fast
        path they write the JPEG bytes there instead (nvJPEG reads them from it)."""
        arenas = self._arena_pool()
        lease, bytes_per_image = arenas.lease(len(items))
        regions = self.pool.decode_into(items, lease, bytes_per_image)
        packed_items: List[DecodedItem] = []
        shapes: List[Tuple[int, int, int]] = []
        runs: List[Tuple[int, int, int]] = []  # (host_start, nbytes, first image of the run)
        dct_items: List[DecodedItem] = []
        dct_runs: List[Tuple[torch.Tensor, List[int]]] = []  # host coefficients, each image's offset in them
        for region in regions:
            if region.items:
                arenas.observe(region.needed / len(region.items))
            if self.decoder == "gpu":
                for item, offset, size in zip(region.items, region.offsets, region.sizes):
                    if offset >= 0:
                        item.encoded = lease.tensor[region.start + offset:region.start + offset + size]
                continue
            first = len(shapes)
            in_arena: List[Tuple[DecodedItem, int, int]] = []
            for item, offset, size in zip(region.items, region.offsets, region.sizes):
                if item.dct_layout and item.ok:
                    if offset >= 0:
                        in_arena.append((item, region.start + offset, size))
                    elif item.coefficients is not None:  # did not fit: it came back on its own
                        dct_items.append(item)
                        dct_runs.append((item.coefficients, [0]))
                        item.coefficients = None
                    continue
                if offset < 0:
                    continue
                shape = (int(item.image_size[0]), int(item.image_size[1]), int(item.channels))
                start = region.start + offset
                item.pixels = lease.tensor[start:start + shape[0] * shape[1] * shape[2]].view(shape)
                shapes.append(shape)
                packed_items.append(item)
            if region.used:
                runs.append((region.start + region.pixels_from, region.used, first))
            if in_arena:  # the region's coefficients, back to back: one copy
                begin, end = in_arena[0][1], in_arena[-1][1] + in_arena[-1][2]
                dct_items.extend(item for item, _, _ in in_arena)
                dct_runs.append((lease.tensor[begin:end], [at - begin for _, at, _ in in_arena]))
        decoded = sorted((item for region in regions for item in region.items), key=lambda item: item.index)
        failures = [(item.index, item.reason) for item in decoded if not item.ok]
        good = [item for item in decoded if item.ok]
        self._log_notes(good)
        packed = None
        if packed_items or dct_items:
            pixel_count = len(shapes)
            shapes += [(int(item.image_size[0]), int(item.image_size[1]), int(item.channels)) for item in dct_items]
            plan = plan_batch(shapes, self.resize.spec)
            segments = [(host_start, size, plan.pixels_at + int(plan.meta[first, 0]))
                        for host_start, size, first in runs]
            dct = None
            if dct_items:
                dct = plan_dct_batch([item.dct_layout for item in dct_items], dct_runs)
                dct.place(plan.meta[pixel_count:, 0])
            packed = PackedPixels(plan, lease.tensor, [item.index for item in packed_items + dct_items], segments,
                                  lease, dct)
        return DecodedImages(len(items), good, failures, packed, lease=lease)

    @staticmethod
    def _log_notes(items: List[DecodedItem]) -> None:
        for item in items:
            for note in item.notes:
                logger.debug("input %d: %s", item.index, note)

    def prepare(self, decoded: DecodedImages) -> PreparedImages:
        """The device step: resample the decoded pixels exactly and assemble the batch in input order.

        With ``decode="gpu"`` it resizes what :meth:`decode` put in the kernel's layout on the hardware route
        with one launch, and queues torchvision's nvJPEG decode of the rest, the chroma step and the packing
        on side streams. torchvision's decode runs here, on the thread that also
        launches the model, not ahead on a decoding thread: its batched call takes the GIL again for each
        image, so beside a thread running Python (launches) both crawl (measured: a 256-photo decode took
        1.0-1.5 s beside a busy Python thread, 13.5 ms alone; ViT-B-32 end to end 4,492 img/s with it ahead,
        5,123 here)."""
        failures = list(decoded.failures)
        route_of = {item.index: item.route for item in decoded.items}
        pixel_items = [item for item in decoded.items if item.pixels is not None]
        jpeg_items = [item for item in decoded.items if item.encoded is not None]
        prepared_items = [item for item in decoded.items if item.prepared is not None]
        groups: List[Tuple[List[int], torch.Tensor]] = []
        if decoded.packed is not None:
            packed = decoded.packed
            fill = packed.dct.decode if packed.dct is not None else None
            groups.append((packed.indices, self.resize.run_packed(packed.plan, packed.buffer, packed.segments, fill)))
            if packed.lease is not None:
                packed.lease.record_upload()  # the arena is reused once these copies are done
            in_buffer = set(packed.indices)
            pixel_items = [item for item in pixel_items if item.index not in in_buffer]
        device_pixels = [item.pixels for item in pixel_items]
        if decoded.on_gpu is not None:
            groups.append(self._hardware_decoded_rows(decoded.on_gpu))
            done = set(groups[-1][0])
            jpeg_items = [item for item in jpeg_items if item.index not in done]
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
                route_of[item.index] = fallback.route
                if not fallback.ok:
                    failures.append((item.index, fallback.reason))
                elif fallback.prepared is not None:
                    prepared_items.append(fallback)
                else:
                    pixel_items.append(fallback)
                    device_pixels.append(fallback.pixels.to(self.device))  # beside nvJPEG's, on the GPU
        if pixel_items:
            groups.append(self._resize_group(pixel_items, device_pixels, failures))
        if prepared_items:
            stacked = torch.stack([item.prepared for item in prepared_items])
            groups.append(([item.index for item in prepared_items], stacked.to(self.device, self.dtype)))
        if self.decoder == "gpu" and decoded.lease is not None:
            decoded.lease.record_upload()  # the JPEG bytes there are read by what is queued up to here
        failures.sort()
        pixels, indices = self._assemble([group for group in groups if group[0]])
        routes: Dict[str, int] = {}
        for index in indices:
            routes[route_of[index]] = routes.get(route_of[index], 0) + 1
        if failures:
            routes["failed"] = len(failures)
        return PreparedImages(pixels, indices, failures, routes)

    def __call__(self, items: Sequence[ImageInput]) -> PreparedImages:
        """``prepare(decode(items))``."""
        return self.prepare(self.decode(items))

    # ----- helpers ------------------------------------------------------------------------
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
        """Stop the decoding workers and free the arenas (a later call, or :meth:`start`, starts them again)."""
        self.pool.close()
        with self._arena_lock:
            reserver, self._reserver = self._reserver, None
        if reserver is not None:
            reserver.join()
        with self._arena_lock:
            arenas, self._arenas = self._arenas, None
        if arenas is not None:
            arenas.close()

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
