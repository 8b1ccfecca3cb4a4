"""The patched ``ResidualAttentionBlock``: OpenCLIP's block with fused attention and fused passes around it.

A block is patched by swapping its ``__class__`` to ``FlashResidualAttentionBlock`` (a subclass, so
``isinstance`` checks keep working) and giving it a ``BlockPlan``; unpatching swaps the class back and
drops the plan. Parameters and buffers are never touched, so the state_dict is the stock one.

The forward keeps OpenCLIP's math and order of operations:
    x = x + ls_1(out_proj(attention(ln_1(x))));  x = x + ls_2(c_proj(act(c_fc(ln_2(x)))))
with the attention computed by the site's backend (a causal flag instead of a materialized mask), and,
where the block's parts are the known OpenCLIP ones, the passes around the GEMMs fused: LayerNorm in one
pass with fp32 statistics (what ``LayerNormFp32`` computes in three), LayerScale and the residual add fused
with the LayerNorm that follows (across block boundaries too, see ``run_blocks``), and the activation in one
pass over c_fc's output.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from open_clip.model import CLIP
from open_clip.transformer import (
    LayerNorm, LayerNormFp32, LayerScale, QuickGELU, ResidualAttentionBlock, TextTransformer, Transformer,
)
from torch import nn

from ..backends import AttentionBackend, fallback_backend, runnable_on
from ..backends.sdpa import single_query_attention
from ..ops import fused_ops
from ..ops.experimental import gemm_epilogue
from ..ops.packed_attention import kernel_takes as packed_kernel_takes
from ..ops.packed_attention import packed_attention_kernel
from .context import PlanContext, Site
from .report import STOCK

# (cu_seqlens, max_seqlen) of a packed batch of variable-length sequences.
Packing = Tuple[torch.Tensor, int]


def activation_name(module: nn.Module) -> Optional[str]:
    """The fused-op name of a block's activation, or None when it is not one we reproduce exactly."""
    if type(module) is QuickGELU:
        return "quick_gelu"
    if type(module) is nn.GELU:
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(module.approximate)
    return None


def _fusable_norm(module: nn.Module) -> bool:
    # OpenCLIP's LayerNorm computes in the input dtype, LayerNormFp32 in fp32; the fused kernel always keeps
    # fp32 statistics, which equals both for fp32 inputs and equals LayerNormFp32 for fp16/bf16 inputs.
    return type(module) in (LayerNorm, LayerNormFp32, nn.LayerNorm) and module.elementwise_affine \
        and len(module.normalized_shape) == 1


def _fusable_scale(module: nn.Module) -> bool:
    return type(module) is nn.Identity or (type(module) is LayerScale and not module.inplace)


def fusion_blockers(block: ResidualAttentionBlock) -> list:
    """Why the passes around this block's GEMMs cannot be fused (empty list: they can)."""
    blockers = []
    if not all(_fusable_norm(n) for n in (block.ln_1, block.ln_2)):
        blockers.append(f"norm layer {type(block.ln_1).__name__} is not a plain LayerNorm")
    if not (_fusable_scale(block.ls_1) and _fusable_scale(block.ls_2)):
        blockers.append("in-place or custom LayerScale")
    mlp = block.mlp
    if not (isinstance(mlp, nn.Sequential) and list(mlp._modules) == ["c_fc", "gelu", "c_proj"]
            and type(mlp.c_fc) is nn.Linear and type(mlp.c_proj) is nn.Linear):
        blockers.append("MLP is not OpenCLIP's c_fc/gelu/c_proj")
    elif activation_name(mlp.gelu) is None:
        blockers.append(f"activation {mlp.gelu!r} has no exact fused kernel")
    return blockers


@dataclass
class BlockPlan:
    """What patch() decided for one block; read on every forward, so it holds only cheap fields."""

    backend: AttentionBackend
    masked_backend: AttentionBackend  # serves calls that pass a mask other than the standard causal one
    num_heads: int
    head_dim: int
    # Module whose ``attn_mask`` buffer is the tower's standard causal mask (checked at patch time). A call that
    # passes exactly that tensor runs with a causal flag; any other mask runs as an explicit mask.
    causal_mask_owner: Optional[nn.Module]
    fused: bool
    activation: Optional[str]
    gemm_epilogue: bool = False  # c_fc's bias + activation may run in a GEMM epilogue (gemm_epilogue.py)
    # Packed (variable-length) calls of short sequences run clip_flash's kernel (ops/packed_attention.py) where
    # it takes them: under backend="auto" only, since a backend named by the caller runs its own kernel.
    packed_kernel: bool = False

    def __deepcopy__(self, memo):
        import copy
        owner = copy.deepcopy(self.causal_mask_owner, memo) if self.causal_mask_owner is not None else None
        return BlockPlan(self.backend, self.masked_backend, self.num_heads, self.head_dim, owner,
                         self.fused, self.activation, self.gemm_epilogue, self.packed_kernel)


def _scale_of(module: nn.Module) -> Optional[torch.Tensor]:
    return module.gamma if type(module) is LayerScale else None


class FlashResidualAttentionBlock(ResidualAttentionBlock):
    """Drop-in forward for a patched block (never constructed: patch() swaps an existing block's class)."""

    _clip_flash_plan: BlockPlan

    def forward(
        self,
        q_x: torch.Tensor,
        k_x: Optional[torch.Tensor] = None,
        v_x: Optional[torch.Tensor] = None,
        attn_mask: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        causal, attn_mask = self.resolve_mask(attn_mask)
        kv = None
        if k_x is not None:
            kv = self._normalize_kv(k_x, v_x)
        return self.run(q_x, causal=causal, attn_mask=attn_mask, kv=kv)

    def _normalize_kv(self, k_x: torch.Tensor, v_x: Optional[torch.Tensor]):
        ln_kv = getattr(self, "ln_1_kv", None)
        if ln_kv is not None:
            k = ln_kv(k_x)
            v = k if (v_x is None or v_x is k_x) else ln_kv(v_x)  # stock normalizes the same tensor twice
        else:
            k, v = k_x, (k_x if v_x is None else v_x)
        return k, v

    def resolve_mask(self, attn_mask: Optional[torch.Tensor]) -> Tuple[bool, Optional[torch.Tensor]]:
        """(causal flag, explicit mask): the tower's own standard causal mask becomes a flag, by identity."""
        if attn_mask is not None:
            owner = self._clip_flash_plan.causal_mask_owner
            if owner is not None and attn_mask is owner.attn_mask:
                return True, None
        return False, attn_mask

    def run(
        self,
        x: torch.Tensor,
        *,
        causal: bool,
        attn_mask: Optional[torch.Tensor] = None,
        kv: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
        packing: Optional[Packing] = None,
    ) -> torch.Tensor:
        """The block on ``x`` of shape (B, L, E), or (T, E) with ``packing`` for packed sequences."""
        if self.fuses(x):
            h = fused_ops.layer_norm(x, self.ln_1.weight, self.ln_1.bias, self.ln_1.eps)
            return self.fused_step(x, h, None, causal=causal, attn_mask=attn_mask, kv=kv, packing=packing)[0]
        attended = self._attend(self.ln_1(x), causal, attn_mask, kv, packing)
        x = x + self.ls_1(self.attn.out_proj(attended))
        return x + self.ls_2(self.mlp(self.ln_2(x)))

    def fuses(self, x: torch.Tensor) -> bool:
        """Whether the fused passes apply to this call (autocast keeps the stock sequence of casts)."""
        return self._clip_flash_plan.fused and not torch.is_autocast_enabled(x.device.type)

    def fused_step(
        self,
        x: torch.Tensor,
        h: torch.Tensor,
        next_norm: Optional[nn.LayerNorm],
        *,
        causal: bool,
        attn_mask: Optional[torch.Tensor] = None,
        kv: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
        packing: Optional[Packing] = None,
    ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """One fused block given the residual stream ``x`` and ``h = ln_1(x)``.

        Returns the new residual stream and, when ``next_norm`` is given (the next block's ln_1), its
        normalization computed in the same pass as the final residual add.
        """
        attended = self._attend(h, causal, attn_mask, kv, packing)
        return self._after_attention(x, attended, next_norm)

    def fused_pooled_step(self, x: torch.Tensor, h: torch.Tensor, pooled: torch.Tensor, *, causal: bool,
                          packing: Optional[Packing] = None) -> torch.Tensor:
        """The block's output at the pooled token of each row only, given ``x`` and ``h = ln_1(x)``: (B, E).

        For a tower's last block, when only one token per row is read after it: the out-projection, ln_2 and the
        MLP (three quarters of the block's GEMM work) run for the pooled rows alone. The attention does too where
        it is bidirectional over padded rows (every token's keys and values, one query a row: a ViT's class
        token); causal or packed attention runs whole, as in the other blocks, and its pooled rows are taken (one
        query a row there needed a mask or a gather, which cost more on the GPU than the queries it saved).
        ``pooled``: (B,) the position in each row of ``x`` (B, L, E), or with ``packing`` the index in ``x``
        (T, E) of a sequence's last token (the packing may also hold sequences that no row pools).
        """
        if causal or packing is not None:
            attended = _rows_at(self._attend(h, causal, None, None, packing), pooled, packing)
            return self._after_attention(_rows_at(x, pooled, packing), attended, None)[0]
        mha, plan = self.attn, self._clip_flash_plan
        heads, head_dim = plan.num_heads, plan.head_dim
        embed = heads * head_dim
        (w_q, b_q), (w_kv, b_kv) = _query_and_key_value_projections(mha, embed)
        rows = pooled.shape[0]
        h_rows = _rows_at(h, pooled, None)
        q = F.linear(h_rows, w_q, b_q).view(rows, heads, 1, head_dim)
        kv = F.linear(h, w_kv, b_kv)  # (B, L, 2E)
        k, v = kv.unflatten(-1, (2, heads, head_dim)).transpose(1, 3).unbind(2)  # (B, H, L, D) each
        # one query a row: a kernel whose bits repeat (torch's own pick, cuDNN on an H200, does not)
        attended = single_query_attention(q, k, v).view(rows, embed)
        return self._after_attention(_rows_at(x, pooled, None), attended, None)[0]

    def _after_attention(self, x: torch.Tensor, attended: torch.Tensor,
                         next_norm: Optional[nn.LayerNorm]) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """The fused rest of the block from the attention's output: out-projection, residual add and ln_2 in one
        pass, the MLP, the last residual add (with ``next_norm`` in its pass when given)."""
        ln_2, mlp, out_proj = self.ln_2, self.mlp, self.attn.out_proj
        # Biases stay in the GEMMs, as in stock: cuBLAS adds them in its epilogue, and the rounding matches stock.
        # Without them ViT-L-14's text GEMMs save 3% (7.73 -> 7.51 ms a 25,600-token tower on an H200), less than
        # adding each bias in the next pass costs (benchmarks/results/h200/flat_activation_7e75d48).
        x, h = fused_ops.add_layer_norm(
            x, out_proj(attended), _scale_of(self.ls_1), ln_2.weight, ln_2.bias, ln_2.eps,
        )
        plan = self._clip_flash_plan
        c_fc = mlp.c_fc
        if plan.gemm_epilogue and h.is_cuda and fused_ops.call_directly(h, c_fc.weight, c_fc.bias):
            hidden = gemm_epilogue.linear_act(h, c_fc.weight, c_fc.bias, plan.activation)
        else:
            hidden = fused_ops.bias_act(c_fc(h), plan.activation)
        delta = mlp.c_proj(hidden)
        if next_norm is None:
            return fused_ops.residual_add(x, delta, _scale_of(self.ls_2)), None
        return fused_ops.add_layer_norm(x, delta, _scale_of(self.ls_2),
                                        next_norm.weight, next_norm.bias, next_norm.eps)

    def _attend(self, h, causal, attn_mask, kv, packing) -> torch.Tensor:
        """Multi-head attention of ``nn.MultiheadAttention`` minus its out-projection; returns (..., E)."""
        plan = self._clip_flash_plan
        mha = self.attn
        heads, head_dim = plan.num_heads, plan.head_dim
        if kv is None:
            qkv = F.linear(h, mha.in_proj_weight, mha.in_proj_bias).unflatten(-1, (3, heads, head_dim))
            q, k, v = qkv.unbind(-3)
        else:
            (w_q, b_q), (w_kv, b_kv) = _query_and_key_value_projections(mha, heads * head_dim)
            q = F.linear(h, w_q, b_q).unflatten(-1, (heads, head_dim))
            k_src, v_src = kv
            if k_src is v_src:
                k, v = F.linear(k_src, w_kv, b_kv).unflatten(-1, (2, heads, head_dim)).unbind(-3)
            else:
                w_k, w_v = w_kv.chunk(2)
                b_k, b_v = b_kv.chunk(2) if b_kv is not None else (None, None)
                k = F.linear(k_src, w_k, b_k).unflatten(-1, (heads, head_dim))
                v = F.linear(v_src, w_v, b_v).unflatten(-1, (heads, head_dim))

        backend = plan.backend
        if attn_mask is not None:
            backend = plan.masked_backend
            # As OpenCLIP's attention(): the mask is cast to the activations' dtype and added to the scores.
            attn_mask = attn_mask.to(q.dtype)
            if attn_mask.dim() == 3:  # nn.MultiheadAttention's (batch * heads, Lq, Lk) layout
                attn_mask = attn_mask.view(q.shape[0], heads, *attn_mask.shape[-2:])
        else:  # e.g. flash-attn picked for an fp16 model that now runs in fp32
            backend = runnable_on(backend, q)

        if packing is not None:
            cu_seqlens, max_seqlen = packing
            if plan.packed_kernel and attn_mask is None and packed_kernel_takes(q, k, v, max_seqlen):
                out = packed_attention_kernel(q, k, v, cu_seqlens, max_seqlen, causal)
            else:
                out = backend.attend_varlen(q, k, v, cu_seqlens, max_seqlen, causal)
        else:
            dropout = mha.dropout if self.training else 0.0
            out = backend.attend(q, k, v, causal, attn_mask, dropout)
        return out.flatten(-2)


def run_blocks(
    blocks,
    x: torch.Tensor,
    *,
    causal: bool,
    attn_mask: Optional[torch.Tensor] = None,
    packing: Optional[Packing] = None,
    pooled: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Run patched blocks in order; when all fuse, each block's last residual add also computes the next
    block's ln_1 in the same pass (one pass over the residual stream per block boundary saved).

    ``pooled`` (B,): only these tokens' outputs are wanted (a row's position in ``x`` (B, L, E), or with
    ``packing`` a token's index in ``x`` (T, E)); the result is then their rows, (B, E), and the last block
    computes them alone (``fused_pooled_step``) where the blocks fuse and no mask is passed.
    """
    fused = all(block.fuses(x) for block in blocks)
    if not fused or (pooled is not None and attn_mask is not None):
        for block in blocks:
            x = block.run(x, causal=causal, attn_mask=attn_mask, packing=packing)
        return x if pooled is None else _rows_at(x, pooled, packing)
    first = blocks[0].ln_1
    h = fused_ops.layer_norm(x, first.weight, first.bias, first.eps)
    last = len(blocks) - 1
    for i, block in enumerate(blocks):
        if i == last and pooled is not None:
            return block.fused_pooled_step(x, h, pooled, causal=causal, packing=packing)
        next_norm = blocks[i + 1].ln_1 if i < last else None
        x, h = block.fused_step(x, h, next_norm, causal=causal, attn_mask=attn_mask, packing=packing)
    return x


def _query_and_key_value_projections(mha: nn.MultiheadAttention, embed: int):
    """((query weight, bias), (key-and-value weight, bias)): views of the packed in-projection (biases may be None)."""
    w_q, w_kv = mha.in_proj_weight.split([embed, 2 * embed])
    b_q, b_kv = mha.in_proj_bias.split([embed, 2 * embed]) if mha.in_proj_bias is not None else (None, None)
    return (w_q, b_q), (w_kv, b_kv)


def _rows_at(x: torch.Tensor, pooled: torch.Tensor, packing: Optional[Packing]) -> torch.Tensor:
    if packing is not None:
        return x[pooled]
    return x[torch.arange(x.shape[0], device=x.device), pooled]


class FlashTransformer(Transformer):
    """OpenCLIP's ``Transformer`` whose blocks are all patched: runs them with fusion across block boundaries.

    Gradient checkpointing and sequence-first layouts keep the stock per-block loop (blocks stay patched).
    """

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        if not self.batch_first or (self.grad_checkpointing and torch.is_grad_enabled()):
            return super().forward(x, attn_mask=attn_mask)
        blocks = self.resblocks
        causal, attn_mask = blocks[0].resolve_mask(attn_mask)
        return run_blocks(blocks, x, causal=causal, attn_mask=attn_mask)


# -- planning -----------------------------------------------------------------------------------------------------

def is_standard_causal_mask(mask: Optional[torch.Tensor]) -> bool:
    """True for OpenCLIP's causal mask: square, -inf strictly above the diagonal, zero elsewhere."""
    if mask is None or mask.dim() != 2 or mask.shape[0] != mask.shape[1] or not mask.is_floating_point():
        return False
    expected = torch.full(mask.shape, float("-inf"), device=mask.device, dtype=mask.dtype).triu(1)
    return bool(torch.equal(mask, expected))


@dataclass(frozen=True)
class MaskClass:
    """How a block's attention is masked, decided from the model alone."""

    kind: str  # for the report: "self-attention", "causal self-attention", ...
    explicit: bool  # calls pass a mask the kernel must take as a tensor
    note: str
    causal_mask_owner: Optional[nn.Module] = None  # owner of the standard causal mask: runs as a causal flag


def classify_mask(block: ResidualAttentionBlock, tower: str, ancestors: List[nn.Module]) -> MaskClass:
    """How ``block`` (in ``tower``, under ``ancestors``) is masked; reads the model, changes nothing."""
    if hasattr(block, "ln_1_kv"):
        return MaskClass("cross-attention", False, "")
    if tower == "decoder":
        return MaskClass("causal self-attention", True, "mask sliced per call: runs as an explicit mask")
    if tower != "text":
        return MaskClass("self-attention", False, "")
    owner = next((m for m in reversed(ancestors) if isinstance(m, (TextTransformer, CLIP))), None)
    if isinstance(owner, TextTransformer) and (owner.cls_emb is not None or owner.use_pad_mask):
        return MaskClass("causal self-attention", True, "causal+pad mask built per call: runs as an explicit mask")
    mask = getattr(owner, "attn_mask", None)
    if mask is None:
        return MaskClass("self-attention", False, "bidirectional text tower")
    if is_standard_causal_mask(mask):
        return MaskClass("causal self-attention", False, "", causal_mask_owner=owner)
    return MaskClass("masked self-attention", True, "non-standard mask: runs as an explicit mask")


def plan_block(block: nn.Module, site: Site, context: PlanContext) -> None:
    """An attention site: the backend that runs it and whether the passes around its GEMMs fuse."""
    name = type(block).__name__
    if type(block) is not ResidualAttentionBlock:
        context.report.add(site.tower, site.path, "self-attention", STOCK, f"unknown subclass {name}")
        return
    mha = block.attn
    unsupported = []
    if not mha.batch_first:
        unsupported.append("sequence-first nn.MultiheadAttention")
    if not mha._qkv_same_embed_dim or mha.bias_k is not None or mha.add_zero_attn:
        unsupported.append("nn.MultiheadAttention with kdim/vdim, bias_k or add_zero_attn")
    mask = classify_mask(block, site.tower, site.ancestors)
    if unsupported:
        context.report.add(site.tower, site.path, mask.kind, STOCK, "; ".join(unsupported))
        return

    head_dim = mha.embed_dim // mha.num_heads
    owner = mask.causal_mask_owner
    needs = context.needs(mha.in_proj_weight, head_dim=head_dim, causal=owner is not None,
                          explicit_mask=mask.explicit)
    backend, rejected = context.choose(needs, site.path)
    if backend is None:
        context.report.add(site.tower, site.path, mask.kind, STOCK, rejected)
        return
    # Masks passed by a caller need a backend that takes them; SDPA takes any mask.
    masked_backend = fallback_backend() if backend.unsupported_reasons(replace(needs, explicit_mask=True)) \
        else backend
    blockers = fusion_blockers(block) if context.options.fuse_blocks else ["fusion turned off"]
    plan = BlockPlan(
        backend=backend, masked_backend=masked_backend, num_heads=mha.num_heads, head_dim=head_dim,
        causal_mask_owner=owner, fused=not blockers,
        activation=activation_name(block.mlp.gelu) if not blockers else None,
        gemm_epilogue=context.options.gemm_epilogue and not blockers,
        packed_kernel=context.options.backend == "auto" and owner is not None,
    )
    context.swap(block, FlashResidualAttentionBlock, {"_clip_flash_plan": plan})
    context.patched_blocks[id(block)] = plan
    details = [mask.note] if mask.note else []
    if owner is not None:
        details.append("causal flag, no materialized mask")
    details.append("fused LN/bias/activation/residual" if not blockers else f"unfused: {blockers[0]}")
    context.report.add(site.tower, site.path, mask.kind, backend.name, "; ".join(details))


def plan_block_chain(module: nn.Module, site: Site, context: PlanContext) -> None:
    """A stock Transformer whose blocks all got patched runs them as one fused chain (after the blocks' plans)."""
    if type(module) is not Transformer or not len(module.resblocks):
        return
    if all(id(block) in context.patched_blocks for block in module.resblocks):
        context.swap(module, FlashTransformer)
