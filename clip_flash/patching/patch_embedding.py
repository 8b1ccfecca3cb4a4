"""A ViT's patch embedding (a Conv2d whose stride equals its kernel) computed as one GEMM over the patches.

OpenCLIP's ``conv1`` cuts the image into non-overlapping patches and projects each one: exactly a matrix
product of the (images x patches, channels x patch x patch) patch matrix with the flattened kernel. cuDNN
runs this 3-input-channel convolution far below the GEMM rate (see ``benchmarks/bench_patch_embedding.py``),
so the patched ``conv1`` gathers the patches with one copy and calls cuBLAS. The result is returned as an
(B, E, grid_h, grid_w) view of (B, grid_h, grid_w, E) memory: OpenCLIP's following reshape and permute to
(B, grid_h * grid_w, E) are then free views instead of a transposing copy.

For 16-bit CUDA inputs whose patch length is not a multiple of 8 (14x14 patches: 588), the patch matrix
and the kernel are padded with zero columns to the next multiple of 8, which lets cuBLAS use its 16-byte
aligned kernels; zeros add nothing to the products, so the result is the same. Padding costs three more
launches, which small batches do not earn back, so it is done only from ``PAD_MIN_PATCHES`` patches on (the
crossover for ViT-L/H/g-14: benchmarks/results/h100/patch_embedding.md).
"""
from __future__ import annotations

from typing import List, Optional

import torch
import torch.nn.functional as F
from open_clip.transformer import VisionTransformer
from torch import Tensor, nn

from .context import PlanContext, Site

__all__ = ["patch_embedding_blockers", "patch_embedding", "PatchEmbeddingConv2d"]

_ALIGN_ELEMENTS = 8  # 16 bytes of fp16/bf16
PAD_MIN_PATCHES = 8192  # inside the crossover's range in benchmarks/results/h100/patch_embedding.md


def patch_embedding_blockers(conv: nn.Module) -> List[str]:
    """Why ``conv`` is not a plain patch embedding we can run as a GEMM (empty list: it is)."""
    if type(conv) is not nn.Conv2d:
        return [f"{type(conv).__name__} is not nn.Conv2d"]
    blockers = []
    if tuple(conv.stride) != tuple(conv.kernel_size):
        blockers.append(f"stride {tuple(conv.stride)} differs from kernel {tuple(conv.kernel_size)}")
    padded = conv.padding != "valid" if isinstance(conv.padding, str) else any(conv.padding)
    if padded:
        blockers.append(f"padding {conv.padding}")
    if tuple(conv.dilation) != (1, 1) or conv.groups != 1 or conv.padding_mode != "zeros":
        blockers.append("dilation, groups or padding mode")
    return blockers


def _padded_length(length: int, patches: int, x: Tensor) -> int:
    if (x.is_cuda and x.dtype in (torch.float16, torch.bfloat16) and length % _ALIGN_ELEMENTS
            and patches >= PAD_MIN_PATCHES):
        return length + _ALIGN_ELEMENTS - length % _ALIGN_ELEMENTS
    return length


def patch_embedding(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, *, pad: Optional[bool] = None) -> Tensor:
    """``F.conv2d(x, weight, bias, stride=kernel)`` for an unpadded, undilated, ungrouped conv, as a GEMM.

    Args:
        x: images, (B, C, H, W). Rows and columns beyond the last whole patch are ignored, as the conv does.
        weight: the conv kernel, (E, C, ph, pw).
        bias: optional (E,) bias.
        pad: pad the patch length to a multiple of 8 for 16-bit CUDA inputs; None (default) pads from
            ``PAD_MIN_PATCHES`` patches on (see the module docstring).

    Returns:
        (B, E, H // ph, W // pw), laid out as (B, H // ph, W // pw, E) in memory.
    """
    if x.dim() != 4:
        raise ValueError(f"patch_embedding expects (B, C, H, W) images, got shape {tuple(x.shape)}")
    batch, channels, height, width = x.shape
    embed, _, ph, pw = weight.shape
    gh, gw = height // ph, width // pw
    x = x[:, :, : gh * ph, : gw * pw]
    # (B, C, gh, ph, gw, pw) -> (B, gh, gw, C, ph, pw): one row per patch, in the kernel's (C, ph, pw) order.
    patches_view = x.reshape(batch, channels, gh, ph, gw, pw).permute(0, 2, 4, 1, 3, 5)
    length = channels * ph * pw
    patch_count = batch * gh * gw
    if pad is None:
        padded = _padded_length(length, patch_count, x)
    else:
        padded = _padded_length(length, PAD_MIN_PATCHES, x) if pad else length
    kernel = weight.reshape(embed, length)
    if padded == length:
        patches = patches_view.reshape(patch_count, length)
    else:
        patches = x.new_empty(patch_count, padded)
        patches[:, length:].zero_()
        patches[:, :length].view(batch, gh, gw, channels, ph, pw).copy_(patches_view)
        kernel = F.pad(kernel, (0, padded - length))
    out = F.linear(patches, kernel, bias)
    return out.view(batch, gh, gw, embed).permute(0, 3, 1, 2)


class PatchEmbeddingConv2d(nn.Conv2d):
    """A patched ``conv1`` (never constructed: patch() swaps an existing conv's class; unpatch swaps back)."""

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            return super().forward(x)  # let the stock conv raise its own error
        return patch_embedding(x, self.weight, self.bias)


def plan_patch_embedding(vit: nn.Module, site: Site, context: PlanContext) -> None:
    """A stock ViT's conv1 as one GEMM over the patches (with ``patch_embedding_gemm``)."""
    if type(vit) is not VisionTransformer or not context.options.patch_embedding_gemm:
        return
    blockers = patch_embedding_blockers(vit.conv1)
    if blockers:
        context.note("vision", f"patch embedding stock ({blockers[0]})")
    else:
        context.swap(vit.conv1, PatchEmbeddingConv2d)
        context.note("vision", "patch embedding as one GEMM")
