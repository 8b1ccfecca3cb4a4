"""The CPU step for a whole batch in one native call: ``csrc/image_batch_decoder.cpp``.

On a pool of native threads (made once per :class:`NativeBatchDecoder`, reused; the GIL released throughout),
each input file is read, its JPEG header scanned, and with Pillow's own libjpeg either entropy-decoded into DCT
coefficients (the exact path on a GPU: the kernels in ``csrc/jpeg_dct.cu`` finish the decode, Pillow's pixels
bit for bit) or decoded whole with Pillow's settings (``out_color_space`` RGB or GRAYSCALE, libjpeg's defaults
otherwise: islow IDCT, fancy upsampling), straight into the host buffers the GPU reads; 8-bit grayscale and RGB
PNGs without transparency, not interlaced, are inflated and unfiltered there too (``csrc/png_decoder.cpp``:
lossless, so Pillow's pixels). With ``decode="gpu"`` the JPEGs' bytes are only read and their headers scanned,
for nvJPEG.

What the native decoder is not sure Pillow reads the same way (other formats, modes other than L and RGB, MPF
or Adobe-marked files, anything libjpeg warns about, PNGs with chunks Pillow parses its own way, sizes past
Pillow's decompression-bomb limit, unreadable files) comes back as :attr:`DecodeKind.PYTHON`: the Python side
hands it to Pillow, which gives its own pixels, rows or reason.
"""
from __future__ import annotations

import enum
import functools
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ...ops._extension import extension_unavailable_reason, load_extension

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1)
def jpeg_library() -> str:
    """The libjpeg-turbo Pillow decodes with: its bundled copy (wheels), else the one it has loaded (a system
    Pillow), else the loader's ``libjpeg.so.62``. Any correct libjpeg of the jpeg62 interface gives the same
    coefficients; another interface is refused by the library itself, and the route is then off."""
    import PIL
    from PIL import Image  # noqa: F401 - loads Pillow's core, and with it its libjpeg

    bundled = sorted((Path(PIL.__file__).resolve().parent.parent / "pillow.libs").glob("libjpeg*.so*"))
    if bundled:
        return str(bundled[0])
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            mapped = sorted({line.split()[-1] for line in maps if "libjpeg" in line and ".so.62" in line})
        if mapped:
            return mapped[0]
    except OSError:
        pass
    return "libjpeg.so.62"


class DecodeKind(enum.IntEnum):
    """What the scan made of an input (``DecodeKind`` in ``csrc/image_batch_decoder.h``)."""

    PYTHON = 0        # left to Pillow
    COEFFICIENTS = 1  # DCT coefficients for the GPU kernels
    PIXELS = 2        # decoded whole into uint8 (H, W, C)
    ENCODED = 3       # a JPEG kept encoded for nvJPEG


class ScanMode(enum.IntEnum):
    """What a batch is scanned for (``ScanMode`` in ``csrc/image_batch_decoder.h``)."""

    PIXELS = 0        # decode JPEGs whole
    COEFFICIENTS = 1  # coefficients where the GPU kernels reproduce Pillow's decode, whole elsewhere
    ENCODED = 2       # keep complete-looking JPEGs encoded for nvJPEG, decode the others whole


class FileFormat(enum.IntEnum):
    """What an input's file is (``FileFormat`` in ``csrc/image_batch_decoder.h``)."""

    OTHER = 0
    JPEG = 1
    PNG = 2


# Columns of ScannedImageBatch.info().
KIND, HEIGHT, WIDTH, CHANNELS, SAMPLING, PROGRESSIVE, COEFFICIENT_BYTES, ENCODED_BYTES, FORMAT = range(9)
LAYOUT_HEAD, LAYOUT_PER_COMPONENT = 3, 7


def split_at_most(threads: int) -> int:
    """How many JPEGs a batch may hold for each one's entropy decode to be split across ``threads`` (one after
    another): one from 4 threads on, one per 8 threads (``split_at_most`` in ``csrc/image_batch_decoder.h``, which
    says why)."""
    return 0 if threads < 4 else max(1, threads // 8)


def takes_natively(item: Any) -> bool:
    """Inputs the native decoder reads: paths and encoded bytes (images and arrays in memory stay in Python)."""
    return isinstance(item, (str, os.PathLike, bytes, bytearray, memoryview))


@dataclass
class ScannedBatch:
    """A scan's result: the native handle and its per-item table, as numpy."""

    handle: Any
    info: np.ndarray      # (n, 9) int64
    layouts: np.ndarray   # (n, 24) int64
    notes: List[str]

    def layout(self, position: int) -> List[int]:
        """Item ``position``'s coefficient layout, unpadded."""
        row = self.layouts[position]
        return row[:LAYOUT_HEAD + LAYOUT_PER_COMPONENT * int(row[2])].tolist()


class NativeBatchDecoder:
    """The extension's ``ImageBatchDecoder``: ``threads`` native threads, made on first use and reused. In a
    forked child (a DataLoader worker), a new one is made there: the parent's threads do not exist in it."""

    def __init__(self, extension: Any, threads: int) -> None:
        self._extension = extension
        self.threads = threads
        self._lock = threading.Lock()
        self._decoder: Any = None
        self._pid = -1

    @staticmethod
    def create(threads: int) -> Optional["NativeBatchDecoder"]:
        """A decoder where the extension is built with it and Pillow's libjpeg opens, else None (logged)."""
        return NativeBatchDecoder.create_or_reason(threads)[0]

    @staticmethod
    def create_or_reason(threads: int) -> Tuple[Optional["NativeBatchDecoder"], Optional[str]]:
        """(``create(threads)``, why it is None: None when it is not)."""
        extension = load_extension()
        if extension is None:
            return None, f"the compiled extension is not loaded ({extension_unavailable_reason()})"
        if not hasattr(extension, "ImageBatchDecoder"):
            return None, "the compiled extension was built without the native batch decoder"
        decoder = NativeBatchDecoder(extension, threads)
        failure = decoder._native().failure
        if failure:
            logger.info("images decode in Python threads: the native decoder cannot run here (%s)", failure)
            return None, failure
        return decoder, None

    def _native(self) -> Any:
        with self._lock:
            if self._decoder is None or self._pid != os.getpid():
                if self._decoder is not None:  # a fork's copy: its threads are the parent's, never join them
                    _FORKED_COPIES.append(self._decoder)
                self._decoder = self._extension.ImageBatchDecoder(self.threads, jpeg_library())
                self._pid = os.getpid()
            return self._decoder

    def scan(self, items: Sequence[Any], mode: ScanMode, exact: Sequence[int] = ()) -> ScannedBatch:
        """Read every input (paths and bytes) and scan its header, in the pool; the items at the positions in
        ``exact`` as :attr:`ScanMode.COEFFICIENTS` whatever ``mode`` says."""
        from PIL import Image

        sources = [_native_source(item) for item in items]
        limit = Image.MAX_IMAGE_PIXELS
        handle = self._native().scan(sources, int(mode), int(limit) if limit else 0, [int(i) for i in exact])
        return ScannedBatch(handle, handle.info().numpy(), handle.layouts().numpy(), handle.notes())

    def decode(self, batch: ScannedBatch, pixels: torch.Tensor, pixel_offsets: np.ndarray,
               coefficients: torch.Tensor, coefficient_offsets: np.ndarray, split_jpegs: bool = True,
               opens: Optional[Tuple[torch.Tensor, int]] = None) -> List[str]:
        """Decode the batch's pixel and coefficient items at their offsets (-1: skip); per item why not.

        ``split_jpegs``: where the batch holds at most ``split_at_most(threads)`` coefficient JPEGs (a single
        request), each one's entropy decode is split across the threads in turn
        (``csrc/jpeg_entropy_split.h``): the same coefficients, sooner; JPEGs it does not handle (restart markers,
        progressive, damaged) are decoded by libjpeg as in a larger batch.

        ``opens``: a host gate's ``(counter, ticket)`` (``HostGate.opener``), opened once the buffers are written
        (or the decode failed), before this call takes the GIL back."""
        counter, ticket = opens if opens is not None else (None, 0)
        return self._native().decode(batch.handle, pixels, torch.from_numpy(np.ascontiguousarray(pixel_offsets)),
                                     coefficients, torch.from_numpy(np.ascontiguousarray(coefficient_offsets)),
                                     split_jpegs, counter, ticket)

    def split_totals(self) -> Dict[str, Any]:
        """Since this process's decoder was made: ``split`` (JPEGs whose entropy decode was split), ``declined``
        (splits declined, decoded by libjpeg instead), ``pieces`` (of the split JPEGs), ``decoded_again`` (pieces
        whose guessed start missed, decoded again from the true one) and ``last_declined`` (why the last split was
        declined)."""
        return dict(self._native().split_totals())

    @staticmethod
    def views(batch: ScannedBatch, positions: Sequence[int]) -> List[torch.Tensor]:
        """uint8 tensors viewing the encoded bytes of the items at ``positions`` (a request's bytes object, or a
        file the scan read), not copies; each keeps the batch, and the bytes, alive. Read them only."""
        return batch.handle.views([int(position) for position in positions])


_FORKED_COPIES: List[Any] = []


def _native_source(item: Any) -> Any:
    """A path as UTF-8 text, or encoded bytes. A path that is not text, or not valid UTF-8 (undecodable bytes in
    a file name), goes as empty bytes: the native scan leaves it to Pillow, which opens the original."""
    if isinstance(item, (str, os.PathLike)):
        path = os.fspath(item)
        if isinstance(path, str):
            try:
                path.encode("utf-8")
                return path
            except UnicodeEncodeError:
                pass
        return b""
    return item if isinstance(item, bytes) else bytes(item)
