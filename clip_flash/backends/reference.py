"""A plain attention written out in fp32: slow, obvious, and the tests' oracle."""
from __future__ import annotations

import math

import torch

from .base import AttentionBackend, BackendStatus, Limits


def _attention_fp32(q, k, v, causal, attn_mask, dropout_p):
    """softmax(q k^T / sqrt(d) + mask) v over (B, H, L, D) tensors, computed in fp32."""
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        lq, lk = scores.shape[-2:]
        blocked = torch.ones(lq, lk, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(blocked, float("-inf"))
    if attn_mask is not None:
        scores = scores + attn_mask.float()
    probs = torch.softmax(scores, dim=-1)
    if dropout_p > 0.0:
        probs = torch.nn.functional.dropout(probs, dropout_p)
    return torch.matmul(probs, v.float()).to(q.dtype)


class ReferenceBackend(AttentionBackend):
    """Serves everything (masks, causal, packed sequences) on any device; never chosen by ``auto``."""

    name = "reference"
    limits = Limits("the reference backend")
    varlen_limits = Limits("the reference backend")  # packs on any device and dtype
    automatic = False  # an oracle: never chosen by auto or a measured table

    def status(self) -> BackendStatus:
        return BackendStatus(self.name, True)

    def attend(self, q, k, v, causal, attn_mask=None, dropout_p=0.0):
        out = _attention_fp32(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal, attn_mask, dropout_p)
        return out.transpose(1, 2)

    def attend_varlen(self, q, k, v, cu_seqlens, max_seqlen, causal):
        # Block-diagonal mask over the packed tokens: each token sees only its own sequence.
        total = q.shape[0]
        sequence_of = torch.searchsorted(cu_seqlens[1:].long(), torch.arange(total, device=q.device), right=True)
        blocked = sequence_of[:, None] != sequence_of[None, :]
        if causal:
            blocked |= torch.ones(total, total, dtype=torch.bool, device=q.device).triu(1)
        mask = torch.zeros(total, total, device=q.device).masked_fill(blocked, float("-inf"))
        out = _attention_fp32(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                              False, mask, 0.0)
        return out[0].transpose(0, 1)
