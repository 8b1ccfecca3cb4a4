"""What ``patch()`` did: every attention site found, the kernel that runs there, or why it stayed stock."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from itertools import groupby
from typing import Dict, List, Optional

STOCK = "stock"


@dataclass
class SiteReport:
    """One attention site (a residual block, a pooler) or one tower-level decision."""

    tower: str
    block: str
    kind: str
    backend: str
    reason: str = ""

    @property
    def patched(self) -> bool:
        return self.backend != STOCK


@dataclass
class PatchReport:
    """Returned by ``clip_flash.patch``; printable, and also plain data (``to_dict``)."""

    model: str
    requested_backend: str
    dtype: str  # the parameters' dtypes by their share of the weights (``describe_weights_dtype``)
    device: str
    sites: List[SiteReport] = field(default_factory=list)
    towers: Dict[str, str] = field(default_factory=dict)
    # How ``auto`` chose on a GPU: the measured attention table in use, or "sdpa (no measured table for <GPU>)".
    # None for forced backends and off-GPU; filled in at construction when left None.
    attention_table: Optional[str] = None

    def __post_init__(self) -> None:
        if self.attention_table is None and self.requested_backend == "auto" and self.device.startswith("cuda"):
            from ..backends.measured import describe_auto_choice  # lazy: reports are plain data otherwise
            self.attention_table = describe_auto_choice()

    def add(self, tower: str, block: str, kind: str, backend: str, reason: str = "") -> None:
        self.sites.append(SiteReport(tower, block, kind, backend, reason))

    @property
    def patched_sites(self) -> List[SiteReport]:
        return [site for site in self.sites if site.patched]

    def backends_used(self) -> Dict[str, List[str]]:
        """Per tower, the sorted backends that run there (``stock`` included where a site stayed stock)."""
        used: Dict[str, set] = {}
        for site in self.sites:
            used.setdefault(site.tower, set()).add(site.backend)
        return {tower: sorted(names) for tower, names in used.items()}

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "requested_backend": self.requested_backend,
            "dtype": self.dtype,
            "device": self.device,
            "towers": dict(self.towers),
            "attention_table": self.attention_table,
            "sites": [asdict(site) for site in self.sites],
        }

    def __str__(self) -> str:
        lines = [
            f"clip_flash patch report: {self.model} ({self.dtype}, {self.device}), backend={self.requested_backend!r}",
            f"  {len(self.patched_sites)} of {len(self.sites)} attention sites patched",
        ]
        if self.attention_table:
            lines.append(f"  auto attention: {self.attention_table}")
        for tower, path in self.towers.items():
            lines.append(f"  {tower} tower: {path}")
        # Consecutive blocks that got the same treatment print as one row: "resblocks.0-11".
        key = lambda s: (s.tower, s.kind, s.backend, s.reason, s.block.rsplit(".", 1)[0])
        for (tower, kind, backend, reason, _), group in groupby(self.sites, key=key):
            blocks = [site.block for site in group]
            where = blocks[0] if len(blocks) == 1 else f"{blocks[0]}-{blocks[-1].rsplit('.', 1)[-1]}"
            line = f"  - {tower:<8} {where:<40} {kind:<24} {backend}"
            lines.append(line + (f"  ({reason})" if reason else ""))
        return "\n".join(lines)

    def _repr_pretty_(self, printer, cycle):  # readable in IPython too
        printer.text(str(self))


def describe_dtype(dtype: Optional[object]) -> str:
    return str(dtype).replace("torch.", "") if dtype is not None else "unknown"


def describe_weights_dtype(model) -> str:
    """The dtypes of ``model``'s parameters, by their share of its weights: OpenCLIP's "fp16" keeps the norms
    and embeddings in float32 (``float16 83% + float32 17%`` for ViT-B-32), which the first parameter alone
    (its positional embedding) would call a float32 model."""
    sizes: Dict[str, int] = {}
    for parameter in model.parameters():
        name = describe_dtype(parameter.dtype)
        sizes[name] = sizes.get(name, 0) + parameter.numel()
    total = sum(sizes.values())
    if len(sizes) <= 1 or not total:
        return next(iter(sizes), "unknown")
    ranked = sorted(sizes.items(), key=lambda item: -item[1])
    return " + ".join(f"{name} {100 * size / total:.0f}%" for name, size in ranked)
