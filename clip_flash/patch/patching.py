"""patch / unpatch: walk an OpenCLIP model, plan every attention site, then apply all changes at once.

Planning reads the model and decides everything (and raises, if it must) before anything is changed, so a
failed patch leaves the model untouched. Applying only swaps instances' classes to our subclasses and sets
plan attributes; unpatch swaps the classes back and deletes the attributes, restoring the stock model.
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Tuple

import torch
from open_clip.model import CLIP
from open_clip.modified_resnet import AttentionPool2d, ModifiedResNet
from open_clip.transformer import (
    AttentionalPooler, CustomResidualAttentionBlock, MultimodalTransformer, ResidualAttentionBlock,
    TextTransformer, Transformer, VisionTransformer,
)
from torch import nn

from ..ops import fused_ops
from ..backends import AttentionNeeds, BackendUnavailableError, choose_backend, get_backend, require_available
from .layer_norms import fused_norm_class
from .patch_embedding import PatchEmbeddingConv2d, patch_embedding_blockers
from .poolers import FlashAttentionalPooler, FlashAttentionPool2d, PoolerPlan
from .report import STOCK, PatchReport, describe_dtype
from .residual_block import (
    BlockPlan, FlashResidualAttentionBlock, FlashTransformer, activation_name, fusion_blockers,
)
from .text_fast_path import SKIPPABLE_POOLING, FlashTextCLIP, FlashTextTransformer, TextPlan

logger = logging.getLogger(__name__)

_STATE = "_clip_flash_state"
_PLAN_ATTRS = ("_clip_flash_plan", "_clip_flash_text")
_FOREIGN_TOWERS = {  # class name -> what to say; imported lazily by name so timm/transformers stay optional
    "TimmModel": "timm vision tower: not ours to patch (timm's own attention runs)",
    "HFTextEncoder": "Hugging Face text tower: not ours to patch (transformers' own attention runs)",
}


@dataclass
class _Swap:
    """One module to patch: its new class and the plan attributes it gets."""

    module: nn.Module
    new_class: type
    attrs: Dict[str, object]


@dataclass
class _PatchState:
    """Stored on the patched model: enough to undo every change, and the report."""

    originals: List[Tuple[nn.Module, type]] = field(default_factory=list)
    report: Optional[PatchReport] = None
    options: Dict[str, object] = field(default_factory=dict)


def is_standard_causal_mask(mask: Optional[torch.Tensor]) -> bool:
    """True for OpenCLIP's causal mask: square, -inf strictly above the diagonal, zero elsewhere."""
    if mask is None or mask.dim() != 2 or mask.shape[0] != mask.shape[1] or not mask.is_floating_point():
        return False
    expected = torch.full(mask.shape, float("-inf"), device=mask.device, dtype=mask.dtype).triu(1)
    return bool(torch.equal(mask, expected))


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


class _Planner:
    """Collects the swaps and the report for one patch() call; never mutates the model."""

    def __init__(self, model: nn.Module, backend: str, skip_padding: bool, fuse: bool, gemm_epilogue: bool,
                 patch_embedding_gemm: bool = True):
        self.model = model
        self.requested = backend
        self.skip_padding = skip_padding
        self.fuse = fuse
        self.gemm_epilogue = gemm_epilogue
        self.patch_embedding_gemm = patch_embedding_gemm
        self.tower_notes: Dict[str, List[str]] = {}  # per tower: what changed outside the attention sites
        self.swaps: List[_Swap] = []
        param = next(model.parameters(), None)
        self.report = PatchReport(
            model=type(model).__name__, requested_backend=backend,
            dtype=describe_dtype(param.dtype if param is not None else None),
            device=str(param.device) if param is not None else "unknown",
        )
        self.forced_backend_served = 0
        self.forced_backend_rejections: List[str] = []
        self.patched_blocks: Dict[int, BlockPlan] = {}

    # -- helpers -------------------------------------------------------------------------------------
    def _needs(self, weight: torch.Tensor, head_dim: int, causal: bool, explicit_mask: bool) -> AttentionNeeds:
        capability = torch.cuda.get_device_capability(weight.device) if weight.is_cuda else None
        return AttentionNeeds(weight.device.type, weight.dtype, head_dim, causal, explicit_mask, False, capability)

    def _choose(self, needs: AttentionNeeds, where: str):
        backend, rejected = choose_backend(self.requested, needs)
        if self.requested != "auto":
            if backend is not None:
                self.forced_backend_served += 1
            else:
                self.forced_backend_rejections.append(f"{where}: {'; '.join(rejected[self.requested])}")
        reason = "; ".join(f"{name}: {', '.join(why)}" for name, why in rejected.items())
        return backend, reason

    # -- attention sites -----------------------------------------------------------------------------
    def plan_block(self, path: str, block: ResidualAttentionBlock, tower: str, ancestors: List[nn.Module]):
        mha = block.attn
        unsupported = []
        if not mha.batch_first:
            unsupported.append("sequence-first nn.MultiheadAttention")
        if not mha._qkv_same_embed_dim or mha.bias_k is not None or mha.add_zero_attn:
            unsupported.append("nn.MultiheadAttention with kdim/vdim, bias_k or add_zero_attn")
        cross = hasattr(block, "ln_1_kv")
        mask_owner, kind, explicit, note = None, "self-attention", False, ""
        if cross:
            kind = "cross-attention"
        elif tower == "decoder":
            kind, explicit, note = "causal self-attention", True, "mask sliced per call: runs as an explicit mask"
        elif tower == "text":
            owner = next((m for m in reversed(ancestors) if isinstance(m, (TextTransformer, CLIP))), None)
            mask = getattr(owner, "attn_mask", None)
            per_call_mask = isinstance(owner, TextTransformer) and (owner.cls_emb is not None or owner.use_pad_mask)
            if per_call_mask:
                kind, explicit = "causal self-attention", True
                note = "causal+pad mask built per call: runs as an explicit mask"
            elif mask is None:
                note = "bidirectional text tower"
            elif is_standard_causal_mask(mask):
                kind, mask_owner = "causal self-attention", owner
            else:
                kind, explicit, note = "masked self-attention", True, "non-standard mask: runs as an explicit mask"
        if unsupported:
            self.report.add(tower, path, kind, STOCK, "; ".join(unsupported))
            return

        head_dim = mha.embed_dim // mha.num_heads
        needs = self._needs(mha.in_proj_weight, head_dim, mask_owner is not None, explicit)
        backend, rejected = self._choose(needs, path)
        if backend is None:
            self.report.add(tower, path, kind, STOCK, rejected)
            return
        if backend.unsupported_reasons(AttentionNeeds(**{**needs.__dict__, "explicit_mask": True})):
            masked_backend = get_backend("sdpa")  # for masks passed by a caller; SDPA takes any mask
        else:
            masked_backend = backend
        blockers = fusion_blockers(block) if self.fuse else ["fusion turned off"]
        plan = BlockPlan(
            backend=backend, masked_backend=masked_backend, num_heads=mha.num_heads, head_dim=head_dim,
            causal_mask_owner=mask_owner, fused=not blockers,
            activation=activation_name(block.mlp.gelu) if not blockers else None,
            gemm_epilogue=self.gemm_epilogue and not blockers,
        )
        self.swaps.append(_Swap(block, FlashResidualAttentionBlock, {"_clip_flash_plan": plan}))
        self.patched_blocks[id(block)] = plan
        details = [note] if note else []
        if mask_owner is not None:
            details.append("causal flag, no materialized mask")
        details.append("fused LN/bias/activation/residual" if not blockers else f"unfused: {blockers[0]}")
        self.report.add(tower, path, kind, backend.name, "; ".join(details))

    def plan_pooler(self, path: str, module: nn.Module, tower: str):
        if isinstance(module, AttentionalPooler):
            mha = module.attn
            if not mha.batch_first or mha.bias_k is not None or mha.add_zero_attn:
                self.report.add(tower, path, "pooler", STOCK, "unusual nn.MultiheadAttention options")
                return
            weight, head_dim, new_class = mha.out_proj.weight, mha.embed_dim // mha.num_heads, FlashAttentionalPooler
            note = "learned queries projected once per call, not once per image"
        else:
            weight, head_dim, new_class = module.q_proj.weight, module.q_proj.out_features // module.num_heads, \
                FlashAttentionPool2d
            note = "attention computed for the mean token only, the one output kept"
        backend, rejected = self._choose(self._needs(weight, head_dim, False, False), path)
        if backend is None:
            self.report.add(tower, path, "pooler", STOCK, rejected)
            return
        self.swaps.append(_Swap(module, new_class, {"_clip_flash_plan": PoolerPlan(backend)}))
        self.report.add(tower, path, "pooler", backend.name, note)

    # -- outside the blocks ---------------------------------------------------------------------------
    def plan_standalone_norms(self, tower_module: nn.Module, tower: str, names: Tuple[str, ...]) -> None:
        """The tower's norms outside its blocks (ln_pre, ln_post, ln_final) in one pass each."""
        if not self.fuse:
            return
        swapped = []
        for name in names:
            norm = getattr(tower_module, name, None)
            new_class = fused_norm_class(norm) if isinstance(norm, nn.Module) else None
            if new_class is not None:
                self.swaps.append(_Swap(norm, new_class, {}))
                swapped.append(name)
        if swapped:
            self.tower_notes.setdefault(tower, []).append(f"{'/'.join(swapped)} in one pass")

    def plan_vision_front(self, vit: VisionTransformer) -> None:
        """conv1 as one GEMM over the patches, and the norms around the transformer in one pass each."""
        if self.patch_embedding_gemm:
            blockers = patch_embedding_blockers(vit.conv1)
            if blockers:
                self.tower_notes.setdefault("vision", []).append(f"patch embedding stock ({blockers[0]})")
            else:
                self.swaps.append(_Swap(vit.conv1, PatchEmbeddingConv2d, {}))
                self.tower_notes.setdefault("vision", []).append("patch embedding as one GEMM")
        self.plan_standalone_norms(vit, "vision", ("ln_pre", "ln_post"))

    # -- text towers ---------------------------------------------------------------------------------
    def plan_text_tower(self, tower: nn.Module):
        """Skip padding where it is exact; say why not elsewhere."""
        if isinstance(tower, CLIP):
            pool_type, eos_id, new_class = tower.text_pool_type, getattr(tower, "text_eos_id", None), FlashTextCLIP
            blockers = [] if type(tower) is CLIP else [f"{type(tower).__name__} is not plain CLIP"]
        else:
            pool_type, eos_id, new_class = tower.pool_type, tower.eos_id, FlashTextTransformer
            blockers = [] if type(tower) is TextTransformer else [f"{type(tower).__name__} is not TextTransformer"]
            if tower.cls_emb is not None:
                blockers.append("class token appended after all positions (CoCa)")
            if tower.output_tokens:
                blockers.append("output_tokens=True needs every position")
        if not self.skip_padding:
            blockers.insert(0, "padding skipping turned off")
        if pool_type not in SKIPPABLE_POOLING:
            blockers.append(f"pooling {pool_type!r} reads more than one position")
        if tower.attn_mask is None:
            blockers.append("bidirectional (no causal mask)")
        elif not is_standard_causal_mask(tower.attn_mask):
            blockers.append("non-standard attention mask")
        plans = [self.patched_blocks.get(id(block)) for block in tower.transformer.resblocks]
        if not all(plan is not None and plan.causal_mask_owner is tower for plan in plans):
            blockers.append("not every text block runs a patched causal kernel")
        if blockers:
            self.report.towers["text"] = "full length (" + "; ".join(blockers) + ")"
            return
        backend = plans[0].backend
        weight = tower.transformer.resblocks[0].attn.in_proj_weight
        varlen_needs = AttentionNeeds("cuda", torch.float16, plans[0].head_dim, True, False, True,
                                      torch.cuda.get_device_capability(weight.device) if weight.is_cuda else None)
        on_cuda = not backend.unsupported_reasons(varlen_needs)
        anywhere = backend.name == "reference"
        text_plan = TextPlan(pool_type, eos_id, varlen_anywhere=anywhere, varlen_on_cuda_half=on_cuda)
        self.swaps.append(_Swap(tower, new_class, {"_clip_flash_text": text_plan}))
        how = f"packed variable-length attention ({backend.name}) on CUDA fp16/bf16, else " if on_cuda or anywhere \
            else ""
        self.report.towers["text"] = (f"skips padding: {how}cut at the batch's longest pooled token "
                                      f"(exact: causal tower pooled at one token, {pool_type!r})")

    def plan_block_chain(self, module: nn.Module) -> None:
        """A stock Transformer whose blocks all got patched runs them as one fused chain."""
        if type(module) is not Transformer or not len(module.resblocks):
            return
        if all(id(block) in self.patched_blocks for block in module.resblocks):
            self.swaps.append(_Swap(module, FlashTransformer, {}))

    # -- the walk ------------------------------------------------------------------------------------
    def plan(self) -> None:
        text_towers, transformers = [], []
        for path, module, ancestors in _walk(self.model):
            tower = _tower_of(path, ancestors + [module])
            name = type(module).__name__
            if name in _FOREIGN_TOWERS:
                self.report.add(tower, path, "tower", STOCK, _FOREIGN_TOWERS[name])
            elif type(module) is ResidualAttentionBlock:
                self.plan_block(path, module, tower, ancestors)
            elif isinstance(module, CustomResidualAttentionBlock):
                self.report.add(tower, path, "self-attention", STOCK,
                                "CustomResidualAttentionBlock runs OpenCLIP's own SDPA Attention")
            elif isinstance(module, ResidualAttentionBlock):
                self.report.add(tower, path, "self-attention", STOCK, f"unknown subclass {name}")
            elif type(module) in (AttentionalPooler, AttentionPool2d):
                self.plan_pooler(path, module, tower)
            elif isinstance(module, (AttentionalPooler, AttentionPool2d)):
                self.report.add(tower, path, "pooler", STOCK, f"unknown subclass {name}")
            if isinstance(module, (CLIP, TextTransformer)) and hasattr(module, "transformer"):
                text_towers.append(module)
                self.plan_standalone_norms(module, "text", ("ln_final",))
            if type(module) is VisionTransformer:
                self.plan_vision_front(module)
            if type(module) is Transformer:
                transformers.append(module)
        for tower in text_towers:
            self.plan_text_tower(tower)
        for transformer in transformers:  # after the walk: its blocks must all be planned first
            self.plan_block_chain(transformer)
        if any(isinstance(m, VisionTransformer) for m in self.model.modules()):
            fused = [p for p in self.patched_blocks.values() if p.causal_mask_owner is None and p.fused]
            if fused:
                self.report.towers["vision"] = f"fused residual blocks ({fused_ops.describe_backend()})"
        for tower, notes in self.tower_notes.items():
            current = self.report.towers.get(tower)
            self.report.towers[tower] = "; ".join(([current] if current else []) + notes)


def _apply(model: nn.Module, swaps: List[_Swap], state: _PatchState) -> None:
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
            shape, see ``clip_flash.ops.experimental.gemm_epilogue``). Off by default: on the H100 the Triton kernels lost to
            cuBLAS + the bias_act pass at every ViT MLP shape but the two largest, where they broke even
            (<= 1.03x; results/h100/gemm_epilogue_fp16.txt), so turning it on there buys little beyond the
            one-time calibration.
        patch_embedding_gemm: run a ViT's patch embedding (conv1: stride = kernel, no padding) as one GEMM
            over the patches instead of cuDNN's convolution (``clip_flash.patch.patch_embedding``; the same products,
            on the H100 up to 9x faster at batch 256, results/h100/patch_embedding.md).

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
        planner = _Planner(model, backend, skip_padding, fuse_blocks, gemm_epilogue, patch_embedding_gemm)
        planner.plan()
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
        redo.append(_Swap(module, type(module), attrs))
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
