"""OpenCLIP's eval transform on decoded uint8 images, in plain PyTorch on the CPU, with Pillow's arithmetic.

Per image: Pillow's two passes in Pillow's order (each: sums of uint8 pixels times fixed-point weights,
plus the rounding constant, shifted and clipped to uint8), over only the source rows and columns the kept
output pixels read, then the crop's padding, then the replication of a one-channel ("L") image
into RGB (what ``convert("RGB")`` does). ``to_model_input`` then applies torchvision's ``ToTensor``
(``float() / 255`` in float32) and ``Normalize`` (``(x - mean) / std`` with float32 mean and std) with
the very same tensor operations, and casts to the requested dtype.

This is the reference the CUDA kernel is tested against, and the path used without the kernel. Each
pass is a gather of whole rows and a batched matmul over the taps; Python loops only over chunks.
"""
from __future__ import annotations

import functools
from typing import Optional, Sequence

import torch
from PIL import __version__ as PIL_VERSION

from .resample_plan import PRECISION_BITS, ROUNDING, AxisTable, ImagePlan, plan_image
from .transform_spec import ImageTransformSpec


def check_image(image: torch.Tensor) -> None:
    """A decoded image must be a uint8 (H, W, C) tensor with C = 1 (mode "L"), 3 ("RGB") or 4 ("RGBA")."""
    if not isinstance(image, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(image).__name__}")
    if image.dtype != torch.uint8 or image.dim() != 3 or image.shape[2] not in (1, 3, 4):
        raise ValueError(
            f"expected a uint8 (H, W, C) tensor with C in (1, 3, 4), got {image.dtype} of shape {tuple(image.shape)}"
        )


# Products are below 2**30 and a row has far fewer than 2**20 taps, so every partial sum is an integer
# below 2**53: float64 holds them exactly whatever the summation order, and a batched matmul gives the
# very int32 sums Pillow computes (which never overflow: the weights' absolute sum stays below 1.2).
_CHUNK_ELEMENTS = 1 << 22  # float64 elements gathered at a time (32 MiB)


def _resample_first_axis(pixels: torch.Tensor, table: AxisTable, source_first: int) -> torch.Tensor:
    """One Pillow pass along the first axis of ``pixels`` (L, N) (uint8 values; index 0 is source index
    ``source_first``); returns uint8 (len(table.start), N)."""
    outputs, taps = table.weights.shape
    start = torch.from_numpy(table.start.astype("int64")) - source_first
    # Taps past a coordinate's count have weight 0; clamping their index keeps the gather in bounds.
    index = (start[:, None] + torch.arange(taps)).clamp_(0, pixels.shape[0] - 1).reshape(-1)
    weights = torch.from_numpy(table.weights.astype("float64")).view(outputs, 1, taps)
    columns_per_chunk = max(1, _CHUNK_ELEMENTS // max(1, outputs * taps))
    result = torch.empty((outputs, pixels.shape[1]), dtype=torch.uint8)
    for first in range(0, pixels.shape[1], columns_per_chunk):
        gathered = pixels[:, first:first + columns_per_chunk].index_select(0, index)
        chunk = gathered.to(torch.float64).view(outputs, taps, -1)
        sums = torch.bmm(weights, chunk).squeeze(1)
        # Pillow's clip8: (sum + 2**21) >> 22 clamped to [0, 255]; exact in float64 (power-of-two divide).
        result[:, first:first + columns_per_chunk] = (
            torch.floor_divide(sums + ROUNDING, float(1 << PRECISION_BITS)).clamp_(0, 255).to(torch.uint8)
        )
    return result


def premultiply_alpha(rgba: torch.Tensor) -> torch.Tensor:
    """Pillow's RGBA -> RGBa: each colour times alpha / 255, rounded as (t + (t >> 8)) >> 8, t = c * a + 128."""
    alpha = rgba[..., 3:].to(torch.int32)
    t = rgba[..., :3].to(torch.int32) * alpha + 128
    return torch.cat([((t + (t >> 8)) >> 8).to(torch.uint8), rgba[..., 3:]], dim=-1)


def unpremultiply_alpha(rgba: torch.Tensor) -> torch.Tensor:
    """Pillow's RGBa -> RGBA: colour * 255 / alpha (integer division, clipped), unchanged where alpha is 0 or 255."""
    alpha = rgba[..., 3:].to(torch.int32)
    colour = rgba[..., :3].to(torch.int32)
    divided = torch.div(colour * 255, alpha.clamp(min=1), rounding_mode="floor").clamp_(0, 255)
    keep = (alpha == 0) | (alpha == 255)
    return torch.cat([torch.where(keep, colour, divided).to(torch.uint8), rgba[..., 3:]], dim=-1)


def needs_premultiply(channels: int, plan: ImagePlan) -> bool:
    """Pillow resizes RGBA premultiplied (and converts back), but only when the size changes."""
    return channels == 4 and plan.resized_size != plan.source_size


def resample_image(image: torch.Tensor, plan: ImagePlan) -> torch.Tensor:
    """The resized and cropped image as uint8 (3, H_out, W_out): exactly Pillow's pixels after
    ``Resize``/``ResizeKeepRatio``, ``CenterCrop``/``CenterCropOrPad`` and ``convert("RGB")``
    (an RGBA image is resized premultiplied, as Pillow does, and its alpha dropped by the conversion)."""
    check_image(image)
    if tuple(image.shape[:2]) != plan.source_size:
        raise ValueError(f"plan is for a {plan.source_size} image, got {tuple(image.shape[:2])}")
    row_first, row_last = plan.rows.source_span
    col_first, col_last = plan.cols.source_span
    target_h, target_w = len(plan.rows.start), len(plan.cols.start)
    channels = image.shape[2]
    if row_last <= row_first or col_last <= col_first:  # every pixel is padding
        out = torch.full((target_h, target_w, channels), plan.fill, dtype=torch.uint8)
    else:
        pixels = image[row_first:row_last, col_first:col_last]
        premultiplied = needs_premultiply(channels, plan)
        if premultiplied:
            pixels = premultiply_alpha(pixels)
        rows, cols = pixels.shape[0], pixels.shape[1]
        if plan.vertical_first:
            vertical = _resample_first_axis(pixels.reshape(rows, cols * channels), plan.rows, row_first)
            by_column = vertical.view(target_h, cols, channels).permute(1, 0, 2).reshape(cols, target_h * channels)
            horizontal = _resample_first_axis(by_column, plan.cols, col_first)  # (target_w, target_h * C)
            out = horizontal.view(target_w, target_h, channels).permute(1, 0, 2).contiguous()
        else:
            by_column = pixels.permute(1, 0, 2).reshape(cols, rows * channels)
            horizontal = _resample_first_axis(by_column, plan.cols, col_first)  # (target_w, rows * C)
            by_row = horizontal.view(target_w, rows, channels).permute(1, 0, 2).reshape(rows, target_w * channels)
            out = _resample_first_axis(by_row, plan.rows, row_first).view(target_h, target_w, channels)
        if premultiplied:
            out = unpremultiply_alpha(out)
        out[torch.from_numpy(plan.rows.count == 0)] = plan.fill
        out[:, torch.from_numpy(plan.cols.count == 0)] = plan.fill
    out = out.permute(2, 0, 1)
    return out.expand(3, -1, -1).contiguous() if channels == 1 else out[:3].contiguous()


def to_model_input(pixels: torch.Tensor, spec: ImageTransformSpec, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """torchvision's ToTensor then Normalize on uint8 (..., 3, H, W) pixels, in float32, then ``dtype``."""
    values = pixels.to(dtype=torch.float32).div(255)
    mean = torch.as_tensor(spec.mean, dtype=torch.float32).view(-1, 1, 1)
    std = torch.as_tensor(spec.std, dtype=torch.float32).view(-1, 1, 1)
    values = values.sub_(mean).div_(std)
    return values if dtype == torch.float32 else values.to(dtype)


def preprocess_batch_cpu(
    images: Sequence[torch.Tensor], spec: ImageTransformSpec, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """(n, 3, H, W) model input for decoded uint8 (H, W, C) images: equal to stacking OpenCLIP's
    ``preprocess(pil_image)`` for each image, cast to ``dtype``."""
    require_pillow_agreement()
    target_h, target_w = spec.size
    pixels = torch.empty((len(images), 3, target_h, target_w), dtype=torch.uint8)
    for i, image in enumerate(images):
        check_image(image)
        pixels[i] = resample_image(image, plan_image(spec, int(image.shape[0]), int(image.shape[1])))
    return to_model_input(pixels, spec, dtype)


# (source h, w, resized h, w): both pass orders, a one-axis resize, an upscale, odd sizes, and shapes
# whose order differs between Pillow's rules (61x20 -> 19x17: vertical first only from 13; 250x2 -> 60x1:
# vertical first from 12.2; 403x4 -> 400x1: vertical first in 12.2 and 12.3 only).
SELF_CHECK_RESIZES = (
    (37, 23, 16, 16), (61, 20, 19, 17), (20, 61, 17, 19), (30, 30, 30, 11), (9, 7, 40, 33), (250, 2, 60, 1),
    (403, 4, 400, 1),
)


def pillow_disagreement() -> Optional[str]:
    """Why the installed Pillow's resize differs from the arithmetic modelled here, or None when it agrees.

    Resizes a few random images with Pillow and with ``resample_image`` (both filters, both pass orders,
    L, RGB and premultiplied RGBA). A Pillow build with other arithmetic (a SIMD fork, a future change) is
    caught here, so a caller can fall back to Pillow itself instead of being silently off by a level.
    """
    import numpy as np
    from PIL import Image

    from .resample_plan import ImagePlan, axis_table, pillow_vertical_first

    rng = np.random.default_rng(0)
    filters = {"bicubic": Image.Resampling.BICUBIC, "bilinear": Image.Resampling.BILINEAR}
    for in_h, in_w, out_h, out_w in SELF_CHECK_RESIZES:
        for interpolation, pil_filter in filters.items():
            for channels, mode in ((1, "L"), (3, "RGB"), (4, "RGBA")):
                array = rng.integers(0, 256, (in_h, in_w, channels), dtype=np.uint8)
                image = Image.fromarray(array[:, :, 0] if channels == 1 else array, mode)
                expected = np.asarray(image.resize((out_w, out_h), pil_filter))
                expected = expected[..., :3] if channels == 4 else expected  # RGBA: compare the colours
                plan = ImagePlan(
                    source_size=(in_h, in_w), resized_size=(out_h, out_w),
                    rows=axis_table(in_h, out_h, out_h, interpolation),
                    cols=axis_table(in_w, out_w, out_w, interpolation),
                    fill=0, vertical_first=pillow_vertical_first((in_h, in_w), (out_h, out_w)),
                )
                got = resample_image(torch.from_numpy(array), plan)[0 if channels == 1 else slice(None)]
                got = got.numpy() if channels == 1 else got.permute(1, 2, 0).numpy()
                if not np.array_equal(got, expected):
                    return (f"Pillow {PIL_VERSION} resizes a {in_h}x{in_w} {mode} image to "
                            f"{out_h}x{out_w} ({interpolation}) differently from Pillow's documented arithmetic")
    return None


class PillowMismatchError(RuntimeError):
    """The installed Pillow does not compute what this module models; use Pillow itself instead."""


@functools.lru_cache(maxsize=None)
def require_pillow_agreement() -> None:
    """Raise ``PillowMismatchError`` (once per process, cached) if ``pillow_disagreement()`` finds one."""
    reason = pillow_disagreement()
    if reason is not None:
        raise PillowMismatchError(reason)
