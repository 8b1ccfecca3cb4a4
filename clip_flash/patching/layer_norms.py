"""Standalone LayerNorms of a tower (a ViT's ln_pre and ln_post, a text tower's ln_final) in one pass.

Inside residual blocks the norms are fused with the residual adds (``residual_block.py``). The norms
outside them run alone; for a 16-bit model OpenCLIP's ``LayerNormFp32`` there costs a cast to fp32, the
normalization and a cast back (three kernels, two extra round trips through memory; the kernel profiles in
results/h100/ show what that costs). ``fused_ops.layer_norm``
computes the same thing in one pass. A patched norm is the stock one with its class swapped to the
matching subclass below; unpatch swaps it back.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
from open_clip.transformer import LayerNorm, LayerNormFp32, VisionTransformer
from torch import Tensor, nn

from ..ops import fused_ops
from .context import PlanContext, Site

__all__ = ["fused_norm_class", "plan_vision_norms", "plan_text_norms"]


class _OnePassNorm:
    """Mixin: one-pass forward where it computes what the stock forward does, else the stock forward."""

    def forward(self, x: Tensor) -> Tensor:
        if self._one_pass_applies(x):
            return fused_ops.layer_norm(x, self.weight, self.bias, self.eps)
        return super().forward(x)

    def _one_pass_applies(self, x: Tensor) -> bool:
        # Autocast decides the stock norm's dtype on its own; keep its exact sequence there. Weights in
        # another dtype than the input's or fp32 make the stock norm raise; keep that error too.
        weights_ok = all(p is None or p.dtype in (x.dtype, torch.float32) for p in (self.weight, self.bias))
        return weights_ok and x.dim() >= 1 and x.shape[-1] == self.normalized_shape[0] \
            and not torch.is_autocast_enabled(x.device.type)


class OnePassLayerNorm(_OnePassNorm, LayerNorm):
    """OpenCLIP's ``LayerNorm`` (normalizes in the input dtype: fp32 statistics for 16-bit inputs on CUDA)."""


class OnePassLayerNormFp32(_OnePassNorm, LayerNormFp32):
    """OpenCLIP's ``LayerNormFp32`` (cast to fp32, normalize, cast back)."""

    def _one_pass_applies(self, x: Tensor) -> bool:
        # Stock rejects 16-bit weights with an fp32 input (model.half()); keep that error rather than serve it.
        weights_fp32 = all(p is None or p.dtype == torch.float32 for p in (self.weight, self.bias))
        return weights_fp32 and super()._one_pass_applies(x)


class OnePassTorchLayerNorm(_OnePassNorm, nn.LayerNorm):
    """``nn.LayerNorm`` (as OpenCLIP's ``LayerNorm`` for the inputs the fused op serves)."""


_FUSED_NORMS: Dict[type, type] = {
    LayerNorm: OnePassLayerNorm,
    LayerNormFp32: OnePassLayerNormFp32,
    nn.LayerNorm: OnePassTorchLayerNorm,
}


def fused_norm_class(module: nn.Module) -> Optional[type]:
    """The one-pass class to swap ``module`` to, or None when it is not a plain affine last-dim LayerNorm."""
    new_class = _FUSED_NORMS.get(type(module))
    if new_class is None or not module.elementwise_affine or len(module.normalized_shape) != 1:
        return None
    return new_class


def _plan_norms(tower_module: nn.Module, tower: str, names: Tuple[str, ...], context: PlanContext) -> None:
    """The tower's norms outside its blocks in one pass each (with ``fuse_blocks``)."""
    if not context.options.fuse_blocks:
        return
    swapped = []
    for name in names:
        norm = getattr(tower_module, name, None)
        new_class = fused_norm_class(norm) if isinstance(norm, nn.Module) else None
        if new_class is not None:
            context.swap(norm, new_class)
            swapped.append(name)
    if swapped:
        context.note(tower, f"{'/'.join(swapped)} in one pass")


def plan_vision_norms(vit: nn.Module, site: Site, context: PlanContext) -> None:
    """A stock ViT's ln_pre and ln_post."""
    if type(vit) is VisionTransformer:
        _plan_norms(vit, "vision", ("ln_pre", "ln_post"), context)


def plan_text_norms(tower: nn.Module, site: Site, context: PlanContext) -> None:
    """A text tower's ln_final (a CLIP model or a TextTransformer, subclasses included)."""
    if hasattr(tower, "transformer"):
        _plan_norms(tower, "text", ("ln_final",), context)
