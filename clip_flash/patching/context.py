"""What the planners of one ``patch()`` call share: the options, the report, and the swaps decided so far.

Each module that owns a replacement class exports planners (functions of a stock module, its ``Site`` and
this context) that read the model and record what to change here; ``patching.py`` looks them up by stock
type and applies every recorded swap at once, after all of them ran (a planner never changes the model).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
from torch import nn

from ..backends import AttentionBackend, AttentionNeeds, choose_backend
from .report import PatchReport, describe_weights_dtype


@dataclass
class Swap:
    """One module to patch: its new class and the plan attributes it gets."""

    module: nn.Module
    new_class: type
    attrs: Dict[str, object]


@dataclass
class Site:
    """Where a module sits in the model: its path, its tower, and its ancestors (outermost first)."""

    path: str
    tower: str
    ancestors: List[nn.Module]


@dataclass
class PatchOptions:
    backend: str = "auto"
    skip_padding: bool = True
    fuse_blocks: bool = True
    gemm_epilogue: bool = False
    patch_embedding_gemm: bool = True


class PlanContext:
    """Collects the swaps and the report for one patch() call; never mutates the model."""

    def __init__(self, model: nn.Module, options: PatchOptions):
        self.model = model
        self.options = options
        self.swaps: List[Swap] = []
        self.tower_notes: Dict[str, List[str]] = {}  # per tower: what changed outside the attention sites
        self.patched_blocks: Dict[int, object] = {}  # id(block) -> its BlockPlan
        self.forced_backend_served = 0
        self.forced_backend_rejections: List[str] = []
        param = next(model.parameters(), None)
        self.report = PatchReport(
            model=type(model).__name__, requested_backend=options.backend,
            dtype=describe_weights_dtype(model),
            device=str(param.device) if param is not None else "unknown",
        )

    def swap(self, module: nn.Module, new_class: type, attrs: Optional[Dict[str, object]] = None) -> None:
        self.swaps.append(Swap(module, new_class, dict(attrs or {})))

    def note(self, tower: str, text: str) -> None:
        """A change outside the attention sites, listed in the report's line for ``tower``."""
        self.tower_notes.setdefault(tower, []).append(text)

    @staticmethod
    def needs(weight: torch.Tensor, *, head_dim: int, causal: bool = False, explicit_mask: bool = False,
              varlen: bool = False) -> AttentionNeeds:
        """What a site whose projections are ``weight``'s device and dtype asks of a kernel."""
        capability = torch.cuda.get_device_capability(weight.device) if weight.is_cuda else None
        return AttentionNeeds(device_type=weight.device.type, dtype=weight.dtype, head_dim=head_dim, causal=causal,
                              explicit_mask=explicit_mask, varlen=varlen, capability=capability)

    def choose(self, needs: AttentionNeeds, where: str) -> Tuple[Optional[AttentionBackend], str]:
        """The backend for a site (None: it stays stock) and, when none or another was tried, why."""
        requested = self.options.backend
        backend, rejected = choose_backend(requested, needs)
        if requested != "auto":
            if backend is not None:
                self.forced_backend_served += 1
            else:
                self.forced_backend_rejections.append(f"{where}: {'; '.join(rejected[requested])}")
        reason = "; ".join(f"{name}: {', '.join(why)}" for name, why in rejected.items())
        return backend, reason
