"""What an attention backend is: a small unit that states its limits and runs attention.

Tensors use the layout OpenCLIP's projections produce without copies: ``(batch, seq, heads, head_dim)``
for padded batches and ``(tokens, heads, head_dim)`` for packed (variable-length) batches.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch


@dataclass(frozen=True)
class AttentionNeeds:
    """What one attention site asks of a kernel; backends answer with reasons they cannot serve it."""

    device_type: str
    dtype: torch.dtype
    head_dim: int
    causal: bool = False
    explicit_mask: bool = False
    varlen: bool = False
    capability: Optional[Tuple[int, int]] = None


@dataclass(frozen=True)
class BackendStatus:
    """Whether a backend can run on this machine at all, and if not, why."""

    name: str
    available: bool
    reason: Optional[str] = None
    version: Optional[str] = None


class AttentionBackend:
    """Base class. Subclasses set ``name`` and implement the ``attend*`` methods they support."""

    name: str = "base"
    supports_varlen: bool = False

    def status(self) -> BackendStatus:
        """Whether this backend can run on this machine (import, hardware); cached by subclasses."""
        return BackendStatus(self.name, True)

    def unsupported_reasons(self, needs: AttentionNeeds) -> List[str]:
        """Readable reasons this backend cannot serve ``needs``; empty when it can."""
        status = self.status()
        return [] if status.available else [status.reason or "not available"]

    def accepts(self, q: torch.Tensor) -> bool:
        """Cheap per-call guard (device/dtype only) for inputs whose dtype changed after patching."""
        return True

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        causal: bool,
        attn_mask: Optional[torch.Tensor] = None,
        dropout_p: float = 0.0,
    ) -> torch.Tensor:
        """Attention over ``(B, L, H, D)`` tensors; ``attn_mask`` is additive, broadcastable to (B, H, Lq, Lk)."""
        raise NotImplementedError

    def attend_varlen(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_seqlens: torch.Tensor,
        max_seqlen: int,
        causal: bool,
    ) -> torch.Tensor:
        """Attention over packed ``(T, H, D)`` tensors, sequences delimited by int32 ``cu_seqlens``."""
        raise NotImplementedError(f"{self.name} has no variable-length attention")

    def __deepcopy__(self, memo):  # backends are stateless singletons: copies of a model share them
        return self

    def __repr__(self) -> str:
        return f"<attention backend {self.name}>"
