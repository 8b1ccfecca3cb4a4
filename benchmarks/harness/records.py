"""What a bench run is asked to do (``BenchSettings``) and what it records (``ShapeResult``, ``ModelResult``).

Plain data, shared by the runner that fills it and the writers that format it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

TOWERS = ("text", "image")

class BenchError(Exception):
    """A user-facing failure (e.g. clip_flash refused the requested backend); ``str()`` says why."""


@dataclass
class BenchSettings:
    """Everything that shapes a run, as chosen on the command line."""

    device: torch.device
    precision: str
    times: int
    warmup: int
    batch_sizes: Sequence[int]
    towers: Sequence[str] = TOWERS
    text_input: str = "random"
    images_dir: Optional[Path] = None
    backend: str = "auto"
    patch_options: Dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    tables: bool = True
    zero_shot_classes: Optional[int] = None  # None: no zero-shot classifier timing
    zero_shot_templates: int = 80  # the first N of OpenAI's 80 ImageNet prompt templates
    zero_shot_batch: int = 1000
    zero_shot_repeats: int = 3
    latency_requests: Optional[int] = None  # None: no latency mode
    cuda_graphs: bool = False  # the patched side runs through clip_flash.GraphedEncoder
    graph_batch_sizes: Optional[Tuple[int, ...]] = None  # GraphedEncoder's buckets (None: its defaults)
    baseline: str = "stock"  # or "compile:<mode>": the stock side runs under torch.compile in that mode
    pipelines: Sequence[str] = ()  # end-to-end image pipelines over images_dir (image_pipelines.PIPELINES)
    pipeline_batch: int = 256
    pipeline_batches: int = 24  # timed batches per pipeline, after its warm-up
    pipeline_warmup: Optional[int] = None  # untimed batches first (None: each pipeline's default)
    pipeline_workers: Optional[int] = None  # CPU workers feeding each pipeline (None: every core)
    pipeline_executor: str = "auto"  # ImagePreprocessor's executor: "auto", "native" or "thread"
    # Captions and the zero-shot classifier are timed from strings: the stock side tokenizes with OpenCLIP's
    # tokenizer, the patched side with this one: "clip_flash" (same ids, faster) or "openclip".
    text_tokenizer: str = "clip_flash"


@dataclass
class ShapeResult:
    """One row: one tower at one batch size, stock vs patched."""

    model: str
    tower: str
    batch: int
    shape: Tuple[int, ...]
    times: int
    stock_total_s: float
    patched_total_s: float
    speedup: float
    mean_abs_diff: float
    stock_median_ms: float
    patched_median_ms: float
    stock_items_per_s: float
    patched_items_per_s: float
    stock_peak_mib: Optional[float]
    patched_peak_mib: Optional[float]
    stock_cos_fp32: float
    patched_cos_fp32: float
    stock_min_cos_fp32: float
    patched_min_cos_fp32: float
    backend: str

    @property
    def shape_text(self) -> str:
        """The shape as the published table writes it: ``(1, 77)``, ``(1, 3, 224, 224)``."""
        return "(" + ", ".join(str(size) for size in self.shape) + ")"

    def to_dict(self) -> Dict[str, Any]:
        """Plain data for JSON/CSV, with the shape also as text."""
        data = asdict(self)
        data["shape"] = self.shape_text
        return data


@dataclass
class ModelResult:
    """Everything measured for one model spec."""

    spec: str
    name: str
    weights: str  # "random", "tag" or "checkpoint"
    weights_note: str
    precision: str
    image_size: Tuple[int, int]
    context_length: int
    text_input: str
    patch_report: Dict[str, Any]
    patch_report_text: str
    backends_used: Dict[str, List[str]]
    rows: List[ShapeResult] = field(default_factory=list)
    zero_shot: Optional[Dict[str, Any]] = None
    latency: Optional[Dict[str, Any]] = None
    image_pipelines: Optional[Dict[str, Any]] = None
    skipped_images: List[str] = field(default_factory=list)  # unreadable files of --images, skipped

    def to_dict(self) -> Dict[str, Any]:
        """Plain data for JSON."""
        data = asdict(self)
        data["rows"] = [row.to_dict() for row in self.rows]
        return data
