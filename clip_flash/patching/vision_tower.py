"""OpenCLIP's ``VisionTransformer`` pooled at its class token: the last block computed for that token alone.

With ``pool_type="tok"`` the tower's output is the class token's row after ``ln_post`` (a per-token LayerNorm,
so normalizing the one row equals normalizing all and then pooling) and the projection; no other token's output
of the last block is read. So that block computes every token's keys and values (the class token attends to all
of them) and only the class token's query, attention, out-projection, ln_2 and MLP
(``residual_block.run_blocks(pooled=...)``). On an H200, fp16, alternated with the whole last block: ViT-L-14 at
256 images a call 2,748-2,758 -> 2,846-2,851 img/s, ViT-B-32 44,217-44,608 -> 47,120-47,388
(``benchmarks/results/h200/pooled_last_block_f90f4ac``). The same skip ``poolers.FlashAttentionPool2d`` makes for
ModifiedResNet.
"""
from __future__ import annotations

import torch
from open_clip.transformer import Transformer, VisionTransformer

from .context import PlanContext, Site
from .residual_block import run_blocks


class FlashVisionTransformer(VisionTransformer):
    """``VisionTransformer`` whose last block runs for the class token only (patch() swaps the class to this)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Stock ``forward``, the last block computed at the class token alone (the stock one where the tower was
        set since patch() to read more than that token)."""
        if self.pool_type != "tok" or self.attn_pool is not None or self.output_tokens or \
                (self.transformer.grad_checkpointing and torch.is_grad_enabled()):
            return super().forward(x)
        x = self._embeds(x)
        first = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
        pooled = self.ln_post(run_blocks(self.transformer.resblocks, x, causal=False, pooled=first))
        return pooled @ self.proj if self.proj is not None else pooled


def pooling_blockers(vit: VisionTransformer, context: PlanContext) -> list:
    """Why the tower's last block must compute every token (empty list: the class token alone is enough)."""
    blockers = []
    if type(vit) is not VisionTransformer:
        blockers.append(f"{type(vit).__name__} is not plain VisionTransformer")
    if vit.pool_type != "tok":
        blockers.append(f"pooling {vit.pool_type!r} reads more than the class token")
    if vit.attn_pool is not None:
        blockers.append("attentional pooler reads every token")
    if vit.output_tokens:
        blockers.append("output_tokens=True needs every token")
    transformer = vit.transformer
    if type(transformer) is not Transformer or not transformer.batch_first:
        blockers.append("not OpenCLIP's batch-first Transformer")
    plans = [context.patched_blocks.get(id(block)) for block in transformer.resblocks]
    if not plans or not all(plan is not None and plan.fused and plan.causal_mask_owner is None for plan in plans):
        blockers.append("not every block runs fused")
    return blockers


def plan_vision_tower(vit: VisionTransformer, site: Site, context: PlanContext) -> None:
    """Run the last block at the class token alone where nothing else is read (after the blocks were planned)."""
    blockers = pooling_blockers(vit, context)
    if blockers:
        context.note("vision", f"last block on every token ({'; '.join(blockers)})")
        return
    context.swap(vit, FlashVisionTransformer)
    context.note("vision", "last block at the class token alone")
