"""Bring nvJPEG's colour closer to libjpeg-turbo's: redo the chroma upsampling the libjpeg way.

torchvision's nvJPEG path upsamples 4:2:0 / 4:2:2 chroma by repeating each sample (nearest), where
libjpeg-turbo (Pillow's decoder) interpolates ("fancy" upsampling: 3/4 of the nearer sample, 1/4 of
the farther one, in fixed point) and converts YCbCr to RGB with its own integer tables. torchvision
returns only RGB, so the planes are recovered from it: within each block that shared one chroma
sample, every pixel's RGB carries the same Cb/Cr, so their average (over unclipped pixels) gives the
sample back to within rounding, and each pixel's Y follows. Then libjpeg-turbo's upsampling and colour
conversion run on those planes. NOT exact (nvJPEG's IDCT and rounding differ from libjpeg-turbo's by a
level here and there); ``benchmarks/image_fast_path_deviation.py`` measures how close it gets.
"""
from __future__ import annotations

import functools
from typing import Tuple

import torch

from clip_flash.ops._extension import load_extension

SCALE_BITS = 16
ONE_HALF = 1 << (SCALE_BITS - 1)
# JPEG sampling as Pillow's get_sampling names it -> (horizontal, vertical) chroma subsampling factors.
SUBSAMPLING = {1: (2, 1), 2: (2, 2)}


def _fix(value: float) -> int:
    return int(value * (1 << SCALE_BITS) + 0.5)


@functools.lru_cache(maxsize=8)
def _colour_tables(device: torch.device) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """libjpeg's ycc_rgb tables: Cr->R, Cb->B offsets and the two G terms (int64, indexed by sample)."""
    x = torch.arange(256, dtype=torch.int64) - 128
    cr_r = (_fix(1.40200) * x + ONE_HALF) >> SCALE_BITS
    cb_b = (_fix(1.77200) * x + ONE_HALF) >> SCALE_BITS
    cr_g = -_fix(0.71414) * x
    cb_g = -_fix(0.34414) * x + ONE_HALF
    return tuple(table.to(device) for table in (cr_r, cb_b, cr_g, cb_g))


def ycc_to_rgb(y: torch.Tensor, cb: torch.Tensor, cr: torch.Tensor) -> torch.Tensor:
    """libjpeg-turbo's integer YCbCr -> RGB of int64 planes (..., H, W) in 0..255; uint8 (..., H, W, 3)."""
    cr_r, cb_b, cr_g, cb_g = _colour_tables(y.device)
    red = y + cr_r[cr]
    green = y + ((cb_g[cb] + cr_g[cr]) >> SCALE_BITS)
    blue = y + cb_b[cb]
    return torch.stack([red, green, blue], dim=-1).clamp_(0, 255).to(torch.uint8)


def _shifted(plane: torch.Tensor, dim: int, step: int) -> torch.Tensor:
    """``plane`` moved one sample along ``dim`` (step -1: the previous sample), edges repeated."""
    size = plane.shape[dim]
    index = (torch.arange(size, device=plane.device) + step).clamp_(0, size - 1)
    return plane.index_select(dim, index)


def _interleave(first: torch.Tensor, second: torch.Tensor, dim: int) -> torch.Tensor:
    """Alternate ``first`` and ``second`` along ``dim`` (a negative dim), doubling it."""
    stacked = torch.stack([first, second], dim=dim)  # the new axis sits right after ``dim``
    return stacked.flatten(dim - 1, dim)


def fancy_upsample(plane: torch.Tensor, horizontal: int, vertical: int) -> torch.Tensor:
    """libjpeg-turbo's fancy upsampling of int64 chroma planes (..., H, W), h2v1 (4:2:2) or h2v2 (4:2:0)."""
    if (horizontal, vertical) == (2, 1):
        near = 3 * plane
        even = (near + _shifted(plane, -1, -1) + 1) >> 2
        odd = (near + _shifted(plane, -1, 1) + 2) >> 2
        return _interleave(even, odd, -1)
    if (horizontal, vertical) != (2, 2):
        raise ValueError(f"no fancy upsampling for factors {(horizontal, vertical)}")
    rows = []
    for far in (_shifted(plane, -2, -1), _shifted(plane, -2, 1)):  # output rows above, below each sample row
        column_sum = 3 * plane + far
        even = (3 * column_sum + _shifted(column_sum, -1, -1) + 8) >> 4
        odd = (3 * column_sum + _shifted(column_sum, -1, 1) + 7) >> 4
        rows.append(_interleave(even, odd, -1))
    return _interleave(rows[0], rows[1], -2)


def _block_mean(values: torch.Tensor, weights: torch.Tensor, horizontal: int, vertical: int) -> torch.Tensor:
    """Weighted mean over each vertical x horizontal block of (..., H, W) planes (edges padded by repetition)."""
    height, width = values.shape[-2:]
    rows, cols = -(-height // vertical), -(-width // horizontal)
    row_index = torch.arange(rows * vertical, device=values.device).clamp_(max=height - 1)
    col_index = torch.arange(cols * horizontal, device=values.device).clamp_(max=width - 1)

    def blocks(plane: torch.Tensor) -> torch.Tensor:
        padded = plane.index_select(-2, row_index).index_select(-1, col_index)
        return padded.unflatten(-1, (cols, horizontal)).unflatten(-3, (rows, vertical)).sum(dim=(-3, -1))

    return blocks(values * weights) / blocks(weights).clamp_min(1e-6)


def refine_nearest_chroma(rgb: torch.Tensor, sampling: int) -> torch.Tensor:
    """nvJPEG's uint8 (..., H, W, 3) RGB of 4:2:2 or 4:2:0 JPEGs (a batch of one size, or one image),
    re-upsampled and converted as libjpeg-turbo would (approximately: see the module docstring).
    Other samplings are returned as they are. On a GPU with the extension built, one kernel pair
    (``csrc/jpeg_chroma.cu``) does what :func:`refine_with_tensor_ops` does in some sixty tensor ops."""
    if sampling not in SUBSAMPLING:
        return rgb
    extension = load_extension() if rgb.is_cuda and rgb.dim() in (3, 4) else None
    if extension is not None and hasattr(extension, "jpeg_chroma"):
        horizontal, vertical = SUBSAMPLING[sampling]
        batch = rgb.unsqueeze(0) if rgb.dim() == 3 else rgb
        refined = extension.jpeg_chroma(batch.contiguous(), horizontal, vertical)
        return refined[0] if rgb.dim() == 3 else refined
    return refine_with_tensor_ops(rgb, sampling)


def refine_with_tensor_ops(rgb: torch.Tensor, sampling: int) -> torch.Tensor:
    """:func:`refine_nearest_chroma` in tensor ops: anywhere (the CPU too), and the kernel's reference."""
    if sampling not in SUBSAMPLING:
        return rgb
    horizontal, vertical = SUBSAMPLING[sampling]
    height, width = rgb.shape[-3:-1]
    red, green, blue = rgb.to(torch.float32).unbind(-1)
    luma = 0.299 * red + 0.587 * green + 0.114 * blue
    # Pixels with a clipped channel say less about their chroma; blocks of only clipped pixels use them all.
    inside = ((rgb > 0) & (rgb < 255)).to(torch.float32)
    weights = inside.amin(dim=-1) + 1e-3
    cb = _block_mean((blue - luma) / 1.772 + 128, weights, horizontal, vertical).round_().clamp_(0, 255)
    cr = _block_mean((red - luma) / 1.402 + 128, weights, horizontal, vertical).round_().clamp_(0, 255)
    rows = torch.arange(height, device=rgb.device) // vertical
    cols = torch.arange(width, device=rgb.device) // horizontal
    cb_here = cb.index_select(-2, rows).index_select(-1, cols) - 128
    cr_here = cr.index_select(-2, rows).index_select(-1, cols) - 128
    # Each channel's own estimate of Y, from the pixel's values and its block's chroma; clipped ones left out.
    estimates = torch.stack([red - 1.402 * cr_here, green + 0.344136 * cb_here + 0.714136 * cr_here,
                             blue - 1.772 * cb_here], dim=-1)
    counted = inside.sum(dim=-1)
    y = torch.where(counted > 0, (estimates * inside).sum(dim=-1) / counted.clamp_min(1), luma)
    y = y.round_().clamp_(0, 255).to(torch.int64)
    cb_full = fancy_upsample(cb.to(torch.int64), horizontal, vertical)[..., :height, :width]
    cr_full = fancy_upsample(cr.to(torch.int64), horizontal, vertical)[..., :height, :width]
    return ycc_to_rgb(y, cb_full, cr_full)
