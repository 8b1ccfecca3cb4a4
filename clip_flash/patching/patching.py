"""patch / unpatch: walk an OpenCLIP model, plan every attention site, then apply all changes at once.

Planning reads the model and decides everything (and raises, if it must) before anything is changed, so a
failed patch leaves the model untouched. Applying only swaps instances' classes to our subclasses and sets
plan attributes; unpatch swaps the classes back and deletes the attributes, restoring the stock model.
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import torch
from open_clip.model import CLIP
from open_clip.modified_resnet import AttentionPool2d, ModifiedResNet
from open_clip.transformer import (
    AttentionalPooler, CustomResidualAttentionBlock, MultimodalTransformer, ResidualAttentionBlock,
    TextTransformer, Transformer, VisionTransformer,
)
from torch import nn

from ..backends import BackendUnavailableError, get_backend, require_available
from ..ops import fused_ops
from . import layer_norms, patch_embedding, poolers, residual_block, text_fast_path, vision_tower
from .context import PatchOptions, PlanContext, Site, Swap
from .report import STOCK, PatchReport

logger = logging.getLogger(__name__)

_STATE = "_clip_flash_state"
_PLAN_ATTRS = ("_clip_flash_plan", "_clip_flash_text")
_FOREIGN_TOWERS = {  # class name -> what to say; imported lazily by name so timm/transformers stay optional
    "TimmModel": "timm vision tower: not ours to patch (timm's own attention runs)",
    "HFTextEncoder": "Hugging Face text tower: not ours to patch (transformers' own attention runs)",
}


@dataclass
class _PatchState:
    """Stored on the patched model: enough to undo every change, and the report."""

    originals: List[Tuple[nn.Module, type]] = field(default_factory=list)
    report: Optional[PatchReport] = None
    options: Dict[str, object] = field(default_factory=dict)


def _tower_of(path: str, ancestors: List[nn.Module]) -> str:
    for module in reversed(ancestors):
        if isinstance(module, (VisionTransformer, ModifiedResNet)) or type(module).__name__ == "TimmModel":
            return "vision"
        if type(module).__name__ == "HFTextEncoder":
            return "text"
        if isinstance(module, MultimodalTransformer):
            return "decoder"
        if isinstance(module, (TextTransformer, CLIP)):
            return "text"
    return path.split(".", 1)[0] or "model"


def _walk(model: nn.Module) -> Iterator[Tuple[str, nn.Module, List[nn.Module]]]:
    """Every submodule with its path and ancestors, not descending into towers that are not ours."""
    def visit(prefix: str, module: nn.Module, ancestors: List[nn.Module]):
        yield prefix, module, ancestors
        if type(module).__name__ in _FOREIGN_TOWERS:
            return
        for name, child in module.named_children():
            yield from visit(f"{prefix}.{name}" if prefix else name, child, ancestors + [module])
    yield from visit("", model, [])


Planner = Callable[[nn.Module, Site, PlanContext], None]


def _stays_stock(kind: str, why: str) -> Planner:
    def plan(module: nn.Module, site: Site, context: PlanContext) -> None:
        context.report.add(site.tower, site.path, kind, STOCK, why)
    return plan


# Per stock type (looked up along the module's MRO, most derived first): (phase, planner) pairs. Phase 0 runs in
# walk order; later phases run after it, in order (a text tower and a block chain depend on their blocks' plans).
_PLANNERS: Dict[type, Tuple[Tuple[int, Planner], ...]] = {
    ResidualAttentionBlock: ((0, residual_block.plan_block),),
    CustomResidualAttentionBlock: (
        (0, _stays_stock("self-attention", "CustomResidualAttentionBlock runs OpenCLIP's own SDPA Attention")),),
    AttentionalPooler: ((0, poolers.plan_pooler),),
    AttentionPool2d: ((0, poolers.plan_pooler),),
    VisionTransformer: ((0, patch_embedding.plan_patch_embedding), (0, layer_norms.plan_vision_norms),
                        (1, vision_tower.plan_vision_tower)),
    CLIP: ((0, layer_norms.plan_text_norms), (1, text_fast_path.plan_text_tower)),
    TextTransformer: ((0, layer_norms.plan_text_norms), (1, text_fast_path.plan_text_tower)),
    Transformer: ((2, residual_block.plan_block_chain),),
}


def _planners_for(cls: type) -> Tuple[Tuple[int, Planner], ...]:
    return next((_PLANNERS[klass] for klass in cls.__mro__ if klass in _PLANNERS), ())


def _plan(model: nn.Module, context: PlanContext) -> None:
    """Run every planner that applies to a module of ``model``; record swaps and the report in ``context``."""
    pending = []
    for path, module, ancestors in _walk(model):
        site = Site(path, _tower_of(path, ancestors + [module]), ancestors)
        name = type(module).__name__
        if name in _FOREIGN_TOWERS:
            context.report.add(site.tower, path, "tower", STOCK, _FOREIGN_TOWERS[name])
            continue
        pending += [(phase, len(pending) + i, planner, module, site)
                    for i, (phase, planner) in enumerate(_planners_for(type(module)))]
    for _, _, planner, module, site in sorted(pending, key=lambda item: item[:2]):
        planner(module, site, context)
    report = context.report
    if any(isinstance(m, VisionTransformer) for m in model.modules()):
        fused = [p for p in context.patched_blocks.values() if p.causal_mask_owner is None and p.fused]
        if fused:
            report.towers["vision"] = f"fused residual blocks ({fused_ops.describe_backend()})"
    for tower, notes in context.tower_notes.items():
        current = report.towers.get(tower)
        report.towers[tower] = "; ".join(([current] if current else []) + notes)


def _apply(model: nn.Module, swaps: List[Swap], state: _PatchState) -> None:
    for swap in swaps:
        state.originals.append((swap.module, type(swap.module)))
        for attr, value in swap.attrs.items():
            swap.module.__dict__[attr] = value
        swap.module.__class__ = swap.new_class
    model.__dict__[_STATE] = state


def patch(model: nn.Module, backend: str = "auto", *, skip_padding: bool = True,
          fuse_blocks: bool = True, gemm_epilogue: bool = False, patch_embedding_gemm: bool = True) -> PatchReport:
    """Patch an OpenCLIP model in place to run its attention (and the passes around it) on fused kernels.

    Args:
        model: an OpenCLIP model (``CLIP``, ``CustomTextCLIP``, ``CoCa``) or any module holding OpenCLIP
            residual attention blocks or attention poolers (``model.visual`` alone works too).
        backend: ``"auto"`` (the fastest backend that serves each site) or a name from
            ``clip_flash.available_backends()``: ``"sdpa"``, ``"sdpa:cudnn"``, ``"sdpa:flash"``,
            ``"sdpa:efficient"``, ``"sdpa:math"``, ``"flash_attn"``, ``"reference"``.
        skip_padding: let causal text towers pooled at one token compute only real tokens (exact).
        fuse_blocks: fuse LayerNorm, biases, activation, LayerScale and residual adds around the GEMMs, and
            run the norms outside the blocks (ln_pre, ln_post, ln_final) in one pass each.
        gemm_epilogue: with ``fuse_blocks``, let c_fc's bias and activation run in a Triton GEMM epilogue where
            that measures faster than cuBLAS + a separate pass (CUDA fp16/bf16 inference; timed once per
            shape, see ``clip_flash.ops.experimental.gemm_epilogue``). Off by default: the Triton kernels do not
            beat cuBLAS + the bias_act pass at ViT MLP shapes (benchmarks/results/h100/gemm_epilogue_fp16.txt),
            so turning it on buys little beyond the one-time calibration.
        patch_embedding_gemm: run a ViT's patch embedding (conv1: stride = kernel, no padding) as one GEMM
            over the patches instead of cuDNN's convolution (``clip_flash.patching.patch_embedding``; the same
            products, and faster: benchmarks/results/h100/patch_embedding.md).

    Returns:
        A ``PatchReport``: each attention site, the backend that runs there or why it stayed stock.

    Raises:
        TypeError: ``model`` is TorchScript or not an ``nn.Module``.
        ValueError: unknown backend name, or no OpenCLIP attention in ``model``.
        BackendUnavailableError: a backend forced by name cannot run here or serves no site of this model.
    The model is left untouched when anything is raised. Patching a patched model re-patches it from stock.
    """
    if isinstance(model, torch.jit.ScriptModule):
        raise TypeError("clip_flash cannot patch a TorchScript model; patch the eager model before scripting")
    if not isinstance(model, nn.Module):
        raise TypeError(f"clip_flash.patch expects an nn.Module, got {type(model).__name__}")
    if backend != "auto":
        get_backend(backend)  # ValueError for unknown names
    require_available(backend)

    was_patched = is_patched(model)
    if was_patched:  # plan against the stock model, so patching twice equals patching once
        previous = _unpatch_state(model)
    try:
        options = PatchOptions(backend=backend, skip_padding=skip_padding, fuse_blocks=fuse_blocks,
                               gemm_epilogue=gemm_epilogue, patch_embedding_gemm=patch_embedding_gemm)
        planner = PlanContext(model, options)
        _plan(model, planner)
        if not planner.report.sites:
            raise ValueError(f"no OpenCLIP attention found in {type(model).__name__}: nothing to patch")
        if backend != "auto" and planner.forced_backend_served == 0:
            raise BackendUnavailableError(
                f"attention backend {backend!r} serves no attention site of this model: "
                + " | ".join(planner.forced_backend_rejections[:3]))
    except Exception:
        if was_patched:
            _apply(model, previous[0], previous[1])
        raise
    for line in planner.forced_backend_rejections:
        logger.warning("backend %r left a site stock: %s", backend, line)
    state = _PatchState(report=planner.report,
                        options={"backend": backend, "skip_padding": skip_padding, "fuse_blocks": fuse_blocks,
                                 "gemm_epilogue": gemm_epilogue, "patch_embedding_gemm": patch_embedding_gemm})
    _apply(model, planner.swaps, state)
    logger.info("%s", planner.report)
    return planner.report


def _unpatch_state(model: nn.Module):
    """Undo a patch; returns what is needed to redo it exactly (swaps, state)."""
    state: _PatchState = model.__dict__.pop(_STATE)
    redo = []
    for module, original_class in reversed(state.originals):
        attrs = {name: module.__dict__.pop(name) for name in _PLAN_ATTRS if name in module.__dict__}
        redo.append(Swap(module, type(module), attrs))
        module.__class__ = original_class
    redo.reverse()
    return redo, _PatchState(report=state.report, options=state.options)


def unpatch(model: nn.Module) -> bool:
    """Restore the stock model exactly (bit-identical outputs). Returns False if it was not patched."""
    if not is_patched(model):
        return False
    _unpatch_state(model)
    return True


def is_patched(model: nn.Module) -> bool:
    """Whether ``model`` is currently patched by clip_flash."""
    return _STATE in model.__dict__


def patch_report(model: nn.Module) -> Optional[PatchReport]:
    """The report of the patch currently applied to ``model`` (None if not patched)."""
    state = model.__dict__.get(_STATE)
    return state.report if state is not None else None


@contextlib.contextmanager
def patched(model: nn.Module, backend: str = "auto", **options) -> Iterator[PatchReport]:
    """``with clip_flash.patched(model) as report:`` patches for the block and restores stock after it."""
    report = patch(model, backend, **options)
    try:
        yield report
    finally:
        unpatch(model)
