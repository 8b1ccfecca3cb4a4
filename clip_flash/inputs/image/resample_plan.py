"""Where every output pixel of OpenCLIP's eval transform comes from, and with which integer weights.

Two pieces of arithmetic decide exactness:

- the geometry: the resized size (torchvision ``Resize``'s ``int(S * long / short)``, OpenCLIP's
  ``ResizeKeepRatio``'s ``round(side / ratio)``, or the exact ``(h, w)`` of squash) and the center crop
  (``int(round((size - crop) / 2.0))``, padding first when the image is smaller than the crop);
- Pillow's 8-bit resampling: two passes, each rounded to uint8, in the installed Pillow's order (see
  ``pillow_vertical_first``); per axis, filter support x max(scale, 1) taps around each output pixel's
  center, weights computed in float64, normalized by their sum, then turned into fixed point with 22
  fractional bits (round half away from zero). A pass whose size does not change is skipped by Pillow;
  here it becomes one tap of weight 1.0, which gives the same value (``(v << 22 + 2**21) >> 22 == v``).

An ``AxisTable`` holds, for each output coordinate that survives the crop: the first source index, the
tap count (0 for a padded coordinate, which takes the fill value) and the int32 weights. Each output
pixel depends only on its own taps, so computing only the cropped coordinates gives Pillow's values.
Everything here is float64 host arithmetic written in the same operation order as Pillow's C code.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Tuple

import numpy as np
import PIL

from .transform_spec import ImageTransformSpec

PRECISION_BITS = 22  # Pillow's fixed point for 8-bit images: 32 bits - 8 for the value - 2 for overflow
ROUNDING = 1 << (PRECISION_BITS - 1)
FILTER_SUPPORT = {"bicubic": 2.0, "bilinear": 1.0}
_BICUBIC_A = -0.5


def _bicubic(x: np.ndarray) -> np.ndarray:
    """Keys' cubic with a = -0.5, term by term as Pillow evaluates it (no fused multiply-add)."""
    a = _BICUBIC_A
    x = np.abs(x)
    inner = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    outer = (((x - 5.0) * x + 8.0) * x - 4.0) * a
    return np.where(x < 1.0, inner, np.where(x < 2.0, outer, 0.0))


def _bilinear(x: np.ndarray) -> np.ndarray:
    x = np.abs(x)
    return np.where(x < 1.0, 1.0 - x, 0.0)


_FILTERS = {"bicubic": _bicubic, "bilinear": _bilinear}
# Pillow's pass order changed twice; we follow the installed Pillow, which is what OpenCLIP's transform
# runs (see ``pillow_vertical_first``).
PILLOW_VERSION = tuple(int(part) for part in re.findall(r"\d+", PIL.__version__)[:2])
PILLOW_MAJOR = PILLOW_VERSION[0]


class ImageTooSmallError(ValueError):
    """The transform would resize the image to zero pixels on a side (Pillow refuses that too)."""


@dataclass(frozen=True)
class AxisTable:
    """Source taps of each output coordinate along one axis (int32 numpy arrays, read-only).

    ``start[o]``: first source index; ``count[o]``: taps used (0 where the crop pads: fill value);
    ``weights[o, :count[o]]``: fixed-point weights, zero beyond ``count[o]``. ``taps`` = weights.shape[1].
    """

    start: np.ndarray
    count: np.ndarray
    weights: np.ndarray

    @property
    def taps(self) -> int:
        return int(self.weights.shape[1])

    @functools.cached_property
    def packed(self) -> np.ndarray:
        """``start``, ``count`` and ``weights`` as one read-only int32 array, as the kernel reads a table: made
        once per table, since tables are cached (:func:`axis_table`) and every batch of their size packs them."""
        flat = np.concatenate([self.start, self.count, self.weights.reshape(-1)]).astype(np.int32)
        flat.flags.writeable = False
        return flat

    @property
    def source_span(self) -> Tuple[int, int]:
        """[first, last) source indices any output coordinate reads; (0, 0) when all are padding."""
        used = self.count > 0
        if not used.any():
            return 0, 0
        return int(self.start[used].min()), int((self.start + self.count)[used].max())


@dataclass(frozen=True)
class ImagePlan:
    """Row and column tables of one image of a given source size under a transform."""

    source_size: Tuple[int, int]   # (height, width) of the decoded image
    resized_size: Tuple[int, int]  # (height, width) after the resize step
    rows: AxisTable
    cols: AxisTable
    fill: int
    vertical_first: bool  # Pillow's pass order (see ``pillow_vertical_first``)


def resized_size(spec: ImageTransformSpec, height: int, width: int) -> Tuple[int, int]:
    """(height, width) after the transform's resize step, with torchvision's / OpenCLIP's own rounding."""
    target_h, target_w = spec.size
    if spec.resize_rule == "exact":
        return target_h, target_w
    if spec.resize_rule == "torchvision_short_side":
        # torchvision.transforms.functional._compute_resized_output_size with size=[S], max_size=None.
        size = target_h
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = size, int(size * long / short)
        new_w, new_h = (new_short, new_long) if width <= height else (new_long, new_short)
        return new_h, new_w
    # OpenCLIP's ResizeKeepRatio.get_params without the random factors (ratio_factor = 1.0).
    longest = spec.keep_ratio_longest
    ratio_h = height / target_h
    ratio_w = width / target_w
    ratio = max(ratio_h, ratio_w) * longest + min(ratio_h, ratio_w) * (1.0 - longest)
    return round(height * 1.0 / ratio), round(width * 1.0 / ratio)


def crop_pad_before(resized: int, target: int) -> int:
    """Output coordinate o reads resized coordinate o - pad_before (torchvision/OpenCLIP center crop).

    When the image is smaller than the crop on this axis it is padded by (target - resized) // 2 before
    and the rest after, then cropped at 0; otherwise it is cropped at int(round((resized - target) / 2.0))
    (Python's round: halves go to even).
    """
    if target > resized:
        return (target - resized) // 2
    return -int(round((resized - target) / 2.0))


def pillow_coefficients(in_size: int, out_size: int, interpolation: str, coords: np.ndarray) -> AxisTable:
    """Pillow's ``precompute_coeffs`` + ``normalize_coeffs_8bpc`` for output coordinates ``coords``.

    ``box`` is the whole image, as torchvision passes none: in0 = 0 and in1 = in_size (a float32 in
    Pillow, exact for any size below 2**24).
    """
    support_of_filter = FILTER_SUPPORT[interpolation]
    filter_fn = _FILTERS[interpolation]
    scale = float(np.float32(in_size)) / out_size
    filterscale = max(scale, 1.0)
    support = support_of_filter * filterscale
    ksize = int(np.ceil(support)) * 2 + 1
    inverse = 1.0 / filterscale

    center = (coords.astype(np.float64) + 0.5) * scale
    # C's (int) cast truncates toward zero; the clamp to 0 makes that the same as Pillow's.
    xmin = np.maximum(np.trunc(center - support + 0.5), 0.0).astype(np.int64)
    xmax = np.minimum(np.trunc(center + support + 0.5).astype(np.int64), in_size) - xmin
    if (xmax > ksize).any() or (xmax < 1).any():
        raise AssertionError("tap count outside [1, ksize]: the coefficient arithmetic is off")

    taps = np.arange(ksize, dtype=np.int64)
    inside = taps[None, :] < xmax[:, None]
    argument = (((taps[None, :] + xmin[:, None]).astype(np.float64) - center[:, None]) + 0.5) * inverse
    weights = np.where(inside, filter_fn(argument), 0.0)
    total = np.zeros(len(coords), dtype=np.float64)
    for tap in range(ksize):  # Pillow sums left to right; numpy's sum would pair terms differently
        total = total + weights[:, tap]
    safe_total = np.where(total != 0.0, total, 1.0)
    weights = np.where(total[:, None] != 0.0, weights / safe_total[:, None], weights)

    scaled = weights * float(1 << PRECISION_BITS)
    fixed = np.where(weights < 0, np.trunc(-0.5 + scaled), np.trunc(0.5 + scaled))
    return AxisTable(start=xmin.astype(np.int32), count=xmax.astype(np.int32), weights=fixed.astype(np.int32))


@functools.lru_cache(maxsize=1024)  # a few MB for web photos; sizes repeat a lot
def axis_table(in_size: int, resized: int, target: int, interpolation: str) -> AxisTable:
    """The table of one axis: ``target`` output coordinates of a center crop (or pad) of a resize
    from ``in_size`` to ``resized``. Cached: web photos come in few sizes."""
    pad_before = crop_pad_before(resized, target)
    coords = np.arange(target, dtype=np.int64) - pad_before
    valid = (coords >= 0) & (coords < resized)
    if resized == in_size:  # Pillow skips this pass; one tap of weight 1.0 is the identity exactly
        table = AxisTable(
            start=coords.astype(np.int32),
            count=np.ones(target, dtype=np.int32),
            weights=np.full((target, 1), 1 << PRECISION_BITS, dtype=np.int32),
        )
    else:
        table = pillow_coefficients(in_size, resized, interpolation, np.clip(coords, 0, resized - 1))
    start = np.where(valid, table.start, 0).astype(np.int32)
    count = np.where(valid, table.count, 0).astype(np.int32)
    weights = np.where(valid[:, None], table.weights, 0).astype(np.int32)
    for array in (start, count, weights):
        array.setflags(write=False)
    return AxisTable(start=start, count=count, weights=weights)


def pillow_vertical_first(
    source: Tuple[int, int], resized: Tuple[int, int], pillow_version: Tuple[int, int] = PILLOW_VERSION
) -> bool:
    """Whether Pillow ``pillow_version`` (the installed one by default) runs the vertical pass first.

    The order matters: the intermediate image is rounded to uint8, so the two orders can differ by a
    level. Before 12.2: always horizontal first. 12.2 and 12.3 (in ``Image.resize``, in Python): vertical
    first for images more than 100 times taller than wide whose height shrinks. From 13 (in C): when
    both passes are needed and the height shrinks by more than twice as many pixels as the width does.
    Where only one pass is needed both orders give the same pixels.
    """
    (in_h, in_w), (out_h, out_w) = source, resized
    if pillow_version < (12, 2):
        return False
    if pillow_version < (13, 0):
        return in_h > in_w * 100 and out_h < in_h
    shrink_h = in_h - out_h
    return out_w != in_w and out_h != in_h and shrink_h > 0 and shrink_h > 2 * (in_w - out_w)


def plan_image(spec: ImageTransformSpec, height: int, width: int) -> ImagePlan:
    """Row and column tables for a decoded ``height`` x ``width`` image under ``spec``.

    Raises ``ImageTooSmallError`` when the resize step would give a zero-sized image (``longest`` mode
    on an image more than ~2x the target's aspect ratio away from it; OpenCLIP's own transform fails on
    it too, in Pillow).
    """
    if height < 1 or width < 1:
        raise ImageTooSmallError(f"image has no pixels: {height}x{width}")
    new_h, new_w = resized_size(spec, height, width)
    if new_h < 1 or new_w < 1:
        raise ImageTooSmallError(
            f"a {height}x{width} image resizes to {new_h}x{new_w} under {spec.resize_mode!r} for size {spec.size}"
        )
    target_h, target_w = spec.size
    return ImagePlan(
        source_size=(height, width),
        resized_size=(new_h, new_w),
        rows=axis_table(height, new_h, target_h, spec.interpolation),
        cols=axis_table(width, new_w, target_w, spec.interpolation),
        fill=spec.fill,
        vertical_first=pillow_vertical_first((height, width), (new_h, new_w)),
    )
