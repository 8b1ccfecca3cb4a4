"""One input (path, bytes, PIL image, uint8 array) to the pixels OpenCLIP's ``preprocess`` would resize.

Each input takes one route, chosen from what Pillow's ``Image.open`` reports (format and mode; no
EXIF transpose, as ``Image.open`` applies none):

``jpeg``
    A JPEG that Pillow opens in mode RGB or L: decoded whole by the native decoder with Pillow's own libjpeg
    and settings, or here by torchvision's CPU ``decode_jpeg`` (libjpeg-turbo, the pixels Pillow's decoder
    gives; it releases the GIL). Any error there falls back to ``pillow-pixels``, so a file Pillow loads is
    never lost and one it cannot is a failure.
``png``
    An 8-bit RGB or L PNG without a transparency chunk: decoded by the native decoder (zlib and the row
    filters, ``csrc/png_decoder.cpp``, for the plain non-interlaced ones whose chunks Pillow reads past), or
    here by torchvision's ``decode_png`` (lossless either way, so the same pixels), with the same fallback.
``pillow-pixels``
    Any other image that Pillow opens in mode RGB or L (WebP, BMP, TIFF, 16-bit-per-sample RGB PNG,
    JPEGs torchvision refused, PIL images passed in): Pillow decodes, we keep its pixels.
``pillow-preprocess``
    Everything Pillow resizes in its own special way (RGBA/LA premultiplied, P and 1 with NEAREST,
    CMYK, I;16, I, F, YCbCr, ...): ``preprocess`` itself runs on the CPU and its output is kept. Exact
    by definition, slower.
``jpeg-dct``
    On a GPU, with the native decoder (:mod:`.native_decode`): a JPEG entropy-decoded by libjpeg-turbo into its
    DCT coefficients; the GPU finishes the decode with libjpeg-turbo's arithmetic (the same pixels).
``gpu-jpeg``
    With ``decode="gpu"``: the JPEG's bytes are kept for nvJPEG (not exact; opt-in).

The first three routes (and ``jpeg-dct``, on the device) end in uint8 ``(H, W, C)`` pixels, C = 3 (RGB) or
1 (L), that the exact resize turns into the model's input. A uint8 array or tensor passed in is taken as
those pixels (the reference being ``preprocess(Image.fromarray(array))``).

The CPU step's result for one input is one of a few frozen types (:data:`DecodedItem`), one per kind of
result, so that each consumer sees only the fields its route has: :class:`DecodedPixels`, :class:`PixelsInLayout`
and :class:`DctCoefficients` (in the batch's packed buffer), :class:`EncodedJpeg`, :class:`PreparedByPreprocess`,
:class:`DecodeFailure`.
"""
from __future__ import annotations

import enum
import io
import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Dict, List, Optional, Tuple, Union

import numpy as np
import torch
from PIL import Image, JpegImagePlugin, UnidentifiedImageError

from .jpeg_header import scan_jpeg_header
from .resample_plan import plan_image
from .transform_spec import ImageTransformSpec

logger = logging.getLogger(__name__)

EXACT_MODES = {"RGB": 3, "L": 1}


class Route(str, enum.Enum):
    """How an input became pixels or rows (see the module's docstring); the values are the names counted in
    ``PreparedImages.routes``."""

    JPEG_DCT = "jpeg-dct"
    JPEG = "jpeg"
    PNG = "png"
    PILLOW_PIXELS = "pillow-pixels"
    PILLOW_PREPROCESS = "pillow-preprocess"
    GPU_JPEG = "gpu-jpeg"
    TENSOR = "tensor"

    def __str__(self) -> str:
        return self.value


@dataclass
class DecodeOptions:
    """How :func:`decode_item` decodes."""

    preprocess: Callable[[Image.Image], torch.Tensor]
    use_torchvision_jpeg: bool = True  # False when torchvision's decoder disagreed with Pillow here
    use_torchvision_png: bool = True
    keep_jpeg_bytes: bool = False  # decode="gpu": JPEGs stay encoded for nvJPEG
    spec: Optional[ImageTransformSpec] = None  # when given, sizes the transform cannot take fail here


class _Decoded:
    """What every decoded item answers: whether it became an image (a :class:`DecodeFailure` did not)."""

    ok: ClassVar[bool] = True


@dataclass(frozen=True)
class DecodedPixels(_Decoded):
    """uint8 ``(H, W, C)`` pixels on the CPU, C in {1, 3} (route ``jpeg``, ``png``, ``pillow-pixels``, ``tensor``);
    without the native decoder, possibly a view of the batch's packed buffer (:class:`.image_batches.PackedPixels`)."""

    index: int
    route: Route
    pixels: torch.Tensor
    notes: Tuple[str, ...] = ()  # why a slower route was taken

    @property
    def image_size(self) -> Tuple[int, int]:
        """(height, width)."""
        return int(self.pixels.shape[0]), int(self.pixels.shape[1])

    @property
    def channels(self) -> int:
        return int(self.pixels.shape[2])


@dataclass(frozen=True)
class PixelsInLayout(_Decoded):
    """Pixels the native decoder wrote (or Pillow's pixels copied) into the batch's packed buffer
    (:class:`.image_batches.PackedPixels`): only their size is kept here."""

    index: int
    route: Route
    image_size: Tuple[int, int]  # (height, width)
    channels: int
    notes: Tuple[str, ...] = ()


@dataclass(frozen=True)
class DctCoefficients(_Decoded):
    """A JPEG entropy-decoded into its DCT coefficients, held by the batch's packed buffer
    (:attr:`.image_batches.PackedPixels.dct`); the GPU finishes its decode."""

    route: ClassVar[Route] = Route.JPEG_DCT
    index: int
    image_size: Tuple[int, int]  # (height, width)
    channels: int
    notes: Tuple[str, ...] = ()


@dataclass(frozen=True)
class EncodedJpeg(_Decoded):
    """A JPEG kept encoded for nvJPEG (``decode="gpu"``), with what its header says."""

    route: ClassVar[Route] = Route.GPU_JPEG
    index: int
    encoded: torch.Tensor  # uint8 1-D JPEG bytes
    image_size: Tuple[int, int]  # (height, width)
    channels: int
    jpeg_sampling: int  # Pillow's get_sampling (0: 4:4:4, 1: 4:2:2, 2: 4:2:0, -1: other)
    jpeg_progressive: bool  # nvJPEG's hardware decoder takes baseline frames only
    notes: Tuple[str, ...] = ()


@dataclass(frozen=True)
class PreparedByPreprocess(_Decoded):
    """An image Pillow resizes its own way: OpenCLIP's ``preprocess`` ran on the CPU; float32 ``(3, S, S)``."""

    route: ClassVar[Route] = Route.PILLOW_PREPROCESS
    index: int
    prepared: torch.Tensor
    notes: Tuple[str, ...] = ()


@dataclass(frozen=True)
class DecodeFailure(_Decoded):
    """An input that could not be read, and why."""

    ok: ClassVar[bool] = False
    route: ClassVar[Optional[Route]] = None
    index: int
    reason: str


DecodedItem = Union[DecodedPixels, PixelsInLayout, DctCoefficients, EncodedJpeg, PreparedByPreprocess, DecodeFailure]
"""One input after the CPU step: one type per kind of result, each with ``index``, ``route`` and ``ok``."""


def describe_error(error: BaseException) -> str:
    """``Type: message`` for a failure reason."""
    message = str(error).strip()
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def input_kind(item: Any) -> str:
    """A short name of the input's type, for failure reasons."""
    if isinstance(item, (str, os.PathLike)):
        return f"path {os.fspath(item)!r}"
    if isinstance(item, (bytes, bytearray, memoryview)):
        return f"{len(item)} bytes"
    return type(item).__name__


def decode_item(index: int, item: Any, options: DecodeOptions) -> DecodedItem:
    """The CPU step for one input. Never raises for a bad input: a :class:`DecodeFailure` says why."""
    notes: List[str] = []
    try:
        if isinstance(item, (str, os.PathLike)):
            with open(item, "rb") as handle:
                data = handle.read()
            result = _decode_encoded(index, data, options, notes)
        elif isinstance(item, (bytes, bytearray, memoryview)):
            result = _decode_encoded(index, bytes(item), options, notes)
        elif isinstance(item, Image.Image):
            result = _decode_pil(index, item, options, notes)
        elif isinstance(item, (torch.Tensor, np.ndarray)):
            result = _take_array(index, item)
        else:
            result = DecodeFailure(index, f"unsupported input type {type(item).__name__}: pass a path, bytes, "
                                          "a PIL image or a uint8 (H, W, C) array")
        if not isinstance(result, (DecodeFailure, PreparedByPreprocess)) and options.spec is not None:
            # An image the transform cannot resize (as OpenCLIP's fails on it) is a failure now, not
            # in the middle of a batch; this also caches its tap tables for the batch plan.
            plan_image(options.spec, *result.image_size)
    except UnidentifiedImageError:
        result = DecodeFailure(index, "UnidentifiedImageError: Pillow cannot identify an image format in it")
    except Exception as error:  # noqa: BLE001 - a bad input is reported, never raised
        result = DecodeFailure(index, describe_error(error))
    if isinstance(result, DecodeFailure):
        logger.debug("input %d (%s) failed: %s", index, input_kind(item), result.reason)
    return result


def _decode_encoded(index: int, data: bytes, options: DecodeOptions, notes: List[str]) -> DecodedItem:
    """Encoded bytes: Pillow reads the header, then the route by format and mode."""
    if options.keep_jpeg_bytes and data.endswith(b"\xff\xd9"):
        scanned = _route_to_nvjpeg(index, data)
        if scanned is not None:
            return scanned
    image = Image.open(io.BytesIO(data))
    mode, form = image.mode, image.format
    channels = EXACT_MODES.get(mode)
    if channels is not None and form == "JPEG":
        if options.keep_jpeg_bytes and data.endswith(b"\xff\xd9"):
            # Only complete-looking files go to nvJPEG; the CPU decode decides about the others, as Pillow would.
            return EncodedJpeg(index, torch.frombuffer(bytearray(data), dtype=torch.uint8),
                               (image.height, image.width), channels, JpegImagePlugin.get_sampling(image),
                               bool(image.info.get("progressive")), tuple(notes))
        if options.use_torchvision_jpeg:
            decoded = _try_torchvision(index, data, image, channels, Route.JPEG, notes)
            if decoded is not None:
                return decoded
    elif channels is not None and form == "PNG" and options.use_torchvision_png and _plain_png(image):
        decoded = _try_torchvision(index, data, image, channels, Route.PNG, notes)
        if decoded is not None:
            return decoded
    return _decode_pil(index, image, options, notes)


def _route_to_nvjpeg(index: int, data: bytes) -> Optional[EncodedJpeg]:
    """The fast path's CPU step without Pillow's header parse (see :mod:`.jpeg_header`): None for any JPEG
    the scan declines or Pillow's decompression-bomb limit would warn about; Pillow's route then decides."""
    header = scan_jpeg_header(data)
    limit = Image.MAX_IMAGE_PIXELS
    if header is None or (limit is not None and header.height * header.width > limit):
        return None
    return EncodedJpeg(index, torch.frombuffer(bytearray(data), dtype=torch.uint8), (header.height, header.width),
                       header.channels, header.sampling, header.progressive)


def _plain_png(image: Image.Image) -> bool:
    """An 8-bit-per-sample PNG whose stored samples are its mode's (no expansion, no transparency)."""
    tiles = getattr(image, "tile", None) or []
    if len(tiles) != 1 or "transparency" in image.info:
        return False
    rawmode = tiles[0].args[0] if isinstance(tiles[0].args, tuple) else tiles[0].args
    return rawmode == image.mode


def _try_torchvision(index: int, data: bytes, image: Image.Image, channels: int, route: Route,
                     notes: List[str]) -> Optional[DecodedPixels]:
    """torchvision's CPU decoder; None (and a note) when it refuses or disagrees on the shape."""
    from torchvision.io import decode_jpeg, decode_png

    decoder = decode_jpeg if route == Route.JPEG else decode_png
    try:
        decoded = decoder(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    except Exception as error:  # noqa: BLE001 - Pillow decides what this file is
        notes.append(f"torchvision {route} decoder refused ({describe_error(error)}); Pillow decodes")
        return None
    if decoded.dtype != torch.uint8 or tuple(decoded.shape) != (channels, image.height, image.width):
        notes.append(f"torchvision {route} decoder gave {tuple(decoded.shape)} {decoded.dtype}; Pillow decodes")
        return None
    # decode_* return a (C, H, W) view of (H, W, C) memory: the permute back is free.
    return DecodedPixels(index, route, decoded.permute(1, 2, 0), tuple(notes))


def _decode_pil(index: int, image: Image.Image, options: DecodeOptions, notes: List[str]) -> DecodedItem:
    """A PIL image (opened lazily or not): its pixels when its mode is RGB/L, else preprocess itself."""
    if image.mode in EXACT_MODES:
        image.load()
        array = np.array(image, dtype=np.uint8)  # a writable copy
        if array.ndim == 2:
            array = array[:, :, None]
        return DecodedPixels(index, Route.PILLOW_PIXELS, torch.from_numpy(array), tuple(notes))
    # Pillow treats this mode specially (premultiplied alpha, NEAREST for P/1, conversions): run the
    # user's own transform, which is exact by definition.
    prepared = options.preprocess(image)
    notes.append(f"mode {image.mode} ({image.format or 'in-memory'}): preprocess ran on the CPU")
    logger.debug("input %d: mode %s runs OpenCLIP's preprocess on the CPU", index, image.mode)
    return PreparedByPreprocess(index, prepared, tuple(notes))


def _take_array(index: int, array: Any) -> DecodedPixels:
    """A uint8 (H, W), (H, W, 1) or (H, W, 3) array or tensor: the pixels of an L or RGB image."""
    if isinstance(array, np.ndarray):
        array = np.ascontiguousarray(array)
        tensor = torch.from_numpy(array if array.flags.writeable else array.copy())
    else:
        tensor = array
    if tensor.dtype != torch.uint8:
        raise ValueError(f"pixel arrays must be uint8, got {tensor.dtype}")
    if tensor.dim() == 2:
        tensor = tensor.unsqueeze(-1)
    if tensor.dim() != 3 or tensor.shape[-1] not in (1, 3) or tensor.shape[0] == 0 or tensor.shape[1] == 0:
        raise ValueError(f"pixel arrays must be (H, W), (H, W, 1) or (H, W, 3); got shape {tuple(tensor.shape)}")
    return DecodedPixels(index, Route.TENSOR, tensor.contiguous())


def route_counts(items: List[DecodedItem]) -> Dict[str, int]:
    """How many inputs took each route (failures under ``failed``)."""
    counts: Dict[str, int] = {}
    for item in items:
        key = str(item.route) if item.ok else "failed"
        counts[key] = counts.get(key, 0) + 1
    return counts
