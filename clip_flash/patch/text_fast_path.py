"""Text towers that compute only real tokens.

In a causal text tower pooled at one token per row (OpenCLIP's ``argmax`` / ``eos`` / ``first`` pooling), no
position after a row's pooled token can change that row's output: causal attention never looks forward and
every other op is per token. So the tower may stop each row at its pooled token. Two ways, chosen per call:
- packed: only each row's real tokens, concatenated, with variable-length causal attention over cumulative
  offsets; every other op runs on the packed (tokens, width) matrix;
- cut: the padded batch truncated after the batch's longest pooled position, with a causal flag.
Both need the pooled positions' maximum (and sum) on the host: one small device-to-host copy per call.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from open_clip.model import CLIP
from open_clip.transformer import TextTransformer
from torch import nn

from .residual_block import run_blocks

SKIPPABLE_POOLING = ("argmax", "eos", "first")
# Pack only when padding would be a real share of the cut batch; near-uniform lengths run faster cut.
PACK_WHEN_REAL_FRACTION_BELOW = 0.9
_HALF = (torch.float16, torch.bfloat16)


@dataclass
class TextPlan:
    """Per text tower: how to pool, and whether packed (variable-length) attention can serve it."""

    pool_type: str
    eos_id: Optional[int]
    varlen_anywhere: bool  # the backend packs on any device and dtype (the reference backend)
    varlen_on_cuda_half: bool  # the backend packs fp16/bf16 on CUDA


def pooled_positions(text: torch.Tensor, pool_type: str, eos_id: Optional[int]) -> torch.Tensor:
    """The position OpenCLIP's ``text_global_pool`` reads for each row, computed the same way."""
    if pool_type == "argmax":
        return text.argmax(dim=-1)
    if pool_type == "eos":
        return (text == eos_id).int().argmax(dim=-1)
    if pool_type == "first":
        return torch.zeros(text.shape[0], dtype=torch.long, device=text.device)
    raise ValueError(f"pooling {pool_type!r} reads more than one position")


def _can_skip(tower: nn.Module, text: torch.Tensor) -> bool:
    if torch.jit.is_scripting() or torch.compiler.is_compiling():
        return False  # data-dependent shapes; the full-length causal path compiles cleanly instead
    if text.dim() != 2 or text.shape[1] != tower.positional_embedding.shape[0]:
        return False  # let the stock path handle (or reject) unusual shapes exactly as it would
    return not (tower.transformer.grad_checkpointing and torch.is_grad_enabled())


def encode_pooled_text(tower: nn.Module, text: torch.Tensor, plan: TextPlan,
                       cut_length: Optional[int] = None) -> torch.Tensor:
    """Pooled, projected text features of ``text`` computed on real tokens only.

    ``tower`` is a CLIP model or a TextTransformer (they name their parts alike). ``cut_length``, when given,
    must be at least the longest pooled position + 1; it skips the host sync and forces the cut path (used by
    CUDA-graph capture, which cannot read device values).
    """
    transformer = tower.transformer
    cast_dtype = transformer.get_cast_dtype()
    batch = text.shape[0]
    pool_at = pooled_positions(text, plan.pool_type, plan.eos_id)
    lengths = pool_at + 1

    packed = False
    if cut_length is None:
        longest, total = torch.stack([lengths.max(), lengths.sum()]).tolist()  # the one host sync
        cut_length = longest
        can_pack = plan.varlen_anywhere or (
            plan.varlen_on_cuda_half and text.is_cuda and cast_dtype in _HALF
            and not torch.is_autocast_enabled(text.device.type))
        packed = can_pack and total < PACK_WHEN_REAL_FRACTION_BELOW * batch * longest

    if packed:
        cu_seqlens = F.pad(lengths.cumsum(0), (1, 0))
        row = torch.repeat_interleave(torch.arange(batch, device=text.device), lengths, output_size=total)
        position = torch.arange(total, device=text.device) - cu_seqlens[row]
        x = tower.token_embedding(text[row, position]).to(cast_dtype)
        x = x + tower.positional_embedding[position].to(cast_dtype)
        packing = (cu_seqlens.to(torch.int32), cut_length)
        x = run_blocks(transformer.resblocks, x, causal=True, packing=packing)
        pooled = x[cu_seqlens[1:] - 1]
    else:
        x = tower.token_embedding(text[:, :cut_length]).to(cast_dtype)
        x = x + tower.positional_embedding[:cut_length].to(cast_dtype)
        x = run_blocks(transformer.resblocks, x, causal=True)
        pooled = x[torch.arange(batch, device=x.device), pool_at]

    # ln_final is per token, so normalizing only the pooled rows equals stock's normalize-then-pool.
    pooled = tower.ln_final(pooled)
    projection = tower.text_projection
    if projection is not None:
        pooled = projection(pooled) if isinstance(projection, nn.Linear) else pooled @ projection
    return pooled


class FlashTextCLIP(CLIP):
    """``CLIP`` whose ``encode_text`` skips padding (patch() swaps an existing model's class to this)."""

    _clip_flash_text: TextPlan

    def encode_text(self, text: torch.Tensor, normalize: bool = False) -> torch.Tensor:
        if not _can_skip(self, text):
            return super().encode_text(text, normalize)
        pooled = encode_pooled_text(self, text, self._clip_flash_text)
        return F.normalize(pooled, dim=-1) if normalize else pooled


class FlashTextTransformer(TextTransformer):
    """``TextTransformer`` (CustomTextCLIP's text tower) whose forward skips padding."""

    _clip_flash_text: TextPlan

    def forward(self, text: torch.Tensor) -> torch.Tensor:
        if not _can_skip(self, text):
            return super().forward(text)
        return encode_pooled_text(self, text, self._clip_flash_text)
