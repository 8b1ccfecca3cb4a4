"""What an attention backend is: a small unit that declares its limits as data and runs attention.

Tensors use the layout OpenCLIP's projections produce without copies: ``(batch, seq, heads, head_dim)``
for padded batches and ``(tokens, heads, head_dim)`` for packed (variable-length) batches.

A backend's limits are fields (``limits`` for every call, ``varlen_limits`` in addition for packed calls,
None when it has no packed attention); one generic ``unsupported_reasons`` reads them, so a new backend
states what it serves instead of writing the checks again.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import FrozenSet, List, Optional, Tuple

import torch

_DTYPE_SHORT = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
HALF_DTYPES: FrozenSet[torch.dtype] = frozenset({torch.float16, torch.bfloat16})


def dtype_names(dtypes: FrozenSet[torch.dtype]) -> str:
    """``{torch.float16, torch.bfloat16}`` -> ``"fp16/bf16"``."""
    short = [name for dtype, name in _DTYPE_SHORT.items() if dtype in dtypes]
    return "/".join(short + sorted(str(dtype) for dtype in dtypes if dtype not in _DTYPE_SHORT))


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
class Limits:
    """What a kernel serves; a field left None (or at its default) does not restrict."""

    what: str  # names the kernel in reasons: "flash-attn", "SDPA cudnn kernel", "variable-length attention"
    device_types: Optional[FrozenSet[str]] = None
    dtypes: Optional[FrozenSet[torch.dtype]] = None
    max_head_dim: Optional[int] = None
    head_dim_multiple: int = 1
    min_capability: Optional[Tuple[int, int]] = None  # checked when the site's capability is known
    explicit_mask: bool = True

    def reasons(self, needs: AttentionNeeds) -> List[str]:
        """Readable reasons these limits exclude ``needs``; empty when they do not."""
        reasons: List[str] = []
        if self.device_types is not None and needs.device_type not in self.device_types:
            reasons.append(f"{self.what} needs {'/'.join(sorted(d.upper() for d in self.device_types))}")
        if self.dtypes is not None and needs.dtype not in self.dtypes:
            reasons.append(f"{self.what} needs {dtype_names(self.dtypes)}, got {needs.dtype}")
        if needs.head_dim % self.head_dim_multiple or (self.max_head_dim is not None
                                                        and needs.head_dim > self.max_head_dim):
            rule = [f"a multiple of {self.head_dim_multiple}"] if self.head_dim_multiple > 1 else []
            rule += [f"<= {self.max_head_dim}"] if self.max_head_dim is not None else []
            reasons.append(f"{self.what} needs head dim {' and '.join(rule)}, got {needs.head_dim}")
        if needs.explicit_mask and not self.explicit_mask:
            reasons.append(f"{self.what} takes no explicit mask")
        if self.min_capability is not None and needs.capability is not None and needs.capability < self.min_capability:
            reasons.append(f"{self.what} needs compute capability >= {self.min_capability[0]}.{self.min_capability[1]}")
        return reasons

    def takes(self, q: torch.Tensor) -> bool:
        """The cheap per-call part: ``q``'s device and dtype are within these limits."""
        return (self.device_types is None or q.device.type in self.device_types) and \
            (self.dtypes is None or q.dtype in self.dtypes)


@dataclass(frozen=True)
class BackendStatus:
    """Whether a backend can run on this machine at all, and if not, why."""

    name: str
    available: bool
    reason: Optional[str] = None
    version: Optional[str] = None


class AttentionBackend:
    """Base class. Subclasses set ``name`` and their limits, and implement the ``attend*`` methods they support."""

    name: str = "base"
    limits: Limits = Limits("this backend")
    varlen_limits: Optional[Limits] = None  # None: no variable-length (packed) attention
    automatic: bool = True  # may ``auto`` (and a measured table) choose it; the fp32 oracle may not

    @property
    def supports_varlen(self) -> bool:
        """Whether it has variable-length (packed) attention at all (``varlen_limits`` say where)."""
        return self.varlen_limits is not None

    def status(self) -> BackendStatus:
        """Whether this backend can run on this machine (import, hardware); cached by subclasses."""
        return BackendStatus(self.name, True)

    def unsupported_reasons(self, needs: AttentionNeeds) -> List[str]:
        """Readable reasons this backend cannot serve ``needs``; empty when it can."""
        status = self.status()
        reasons = [] if status.available else [status.reason or "not available"]
        reasons += self.limits.reasons(needs)
        if needs.varlen:
            if not self.supports_varlen:
                reasons.append(f"{self.name} has no variable-length attention")
            elif self.varlen_limits is not None:
                reasons += self.varlen_limits.reasons(needs)
        return reasons

    def accepts(self, q: torch.Tensor) -> bool:
        """Cheap per-call guard (device/dtype only) for inputs whose dtype changed after patching."""
        return self.limits.takes(q)

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
