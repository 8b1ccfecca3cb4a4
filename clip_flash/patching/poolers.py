"""Fused forwards for OpenCLIP's attention poolers: CoCa's ``AttentionalPooler`` and ResNet's ``AttentionPool2d``.

Both are exact rewrites of the stock forward that also skip work whose result is thrown away or repeated:
``AttentionalPooler`` projects its learned queries once instead of once per image, and ``AttentionPool2d``
computes attention only for the mean token, the one output the stock forward keeps (``x[0]``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from open_clip.modified_resnet import AttentionPool2d
from open_clip.transformer import AttentionalPooler
from torch import nn

from ..backends import AttentionBackend, runnable_on
from .context import PlanContext, Site
from .report import STOCK


@dataclass
class PoolerPlan:
    backend: AttentionBackend


def _query_key_value_weights(mha: torch.nn.MultiheadAttention):
    if mha._qkv_same_embed_dim:
        weights = mha.in_proj_weight.chunk(3)
    else:
        weights = (mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight)
    biases = mha.in_proj_bias.chunk(3) if mha.in_proj_bias is not None else (None, None, None)
    return weights, biases


def _attend(plan: PoolerPlan, q, k, v):
    return runnable_on(plan.backend, q).attend(q, k, v, causal=False).flatten(-2)


class FlashAttentionalPooler(AttentionalPooler):
    """CoCa's learned-query pooler (``nn.MultiheadAttention`` with kdim != dim), fused."""

    _clip_flash_plan: PoolerPlan

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mha = self.attn
        heads = mha.num_heads
        head_dim = mha.embed_dim // heads
        (w_q, w_k, w_v), (b_q, b_k, b_v) = _query_key_value_weights(mha)
        x = self.ln_k(x)
        # The queries are the same for every image: project them once, then broadcast over the batch.
        q = F.linear(self.ln_q(self.query), w_q, b_q).unflatten(-1, (heads, head_dim))
        q = q.unsqueeze(0).expand(x.shape[0], -1, -1, -1).contiguous()
        k = F.linear(x, w_k, b_k).unflatten(-1, (heads, head_dim))
        v = F.linear(x, w_v, b_v).unflatten(-1, (heads, head_dim))
        return mha.out_proj(_attend(self._clip_flash_plan, q, k, v))


class FlashAttentionPool2d(AttentionPool2d):
    """ModifiedResNet's attention pool: only the mean token's attention row is kept, so only it is computed."""

    _clip_flash_plan: PoolerPlan

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(2).transpose(1, 2)  # NCHW -> N(HW)C
        x = torch.cat([x.mean(dim=1, keepdim=True), x], dim=1)  # N(HW+1)C
        x = x + self.positional_embedding.to(x.dtype)
        heads = self.num_heads
        head_dim = x.shape[-1] // heads
        q = self.q_proj(x[:, :1]).unflatten(-1, (heads, head_dim))
        k = self.k_proj(x).unflatten(-1, (heads, head_dim))
        v = self.v_proj(x).unflatten(-1, (heads, head_dim))
        return self.c_proj(_attend(self._clip_flash_plan, q, k, v))[:, 0]


def plan_pooler(module: nn.Module, site: Site, context: PlanContext) -> None:
    """A stock attention pooler runs fused on the site's backend; subclasses and unusual options stay stock."""
    if type(module) not in (AttentionalPooler, AttentionPool2d):
        context.report.add(site.tower, site.path, "pooler", STOCK, f"unknown subclass {type(module).__name__}")
        return
    if isinstance(module, AttentionalPooler):
        mha = module.attn
        if not mha.batch_first or mha.bias_k is not None or mha.add_zero_attn:
            context.report.add(site.tower, site.path, "pooler", STOCK, "unusual nn.MultiheadAttention options")
            return
        weight, head_dim, new_class = mha.out_proj.weight, mha.embed_dim // mha.num_heads, FlashAttentionalPooler
        note = "learned queries projected once per call, not once per image"
    else:
        weight, head_dim = module.q_proj.weight, module.q_proj.out_features // module.num_heads
        new_class = FlashAttentionPool2d
        note = "attention computed for the mean token only, the one output kept"
    backend, rejected = context.choose(context.needs(weight, head_dim=head_dim), site.path)
    if backend is None:
        context.report.add(site.tower, site.path, "pooler", STOCK, rejected)
        return
    context.swap(module, new_class, {"_clip_flash_plan": PoolerPlan(backend)})
    context.report.add(site.tower, site.path, "pooler", backend.name, note)
