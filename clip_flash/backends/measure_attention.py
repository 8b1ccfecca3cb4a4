"""Time every available attention backend on the attention shapes of OpenCLIP models; write a table for ``auto``.

    clip-flash measure-attention                       # default models, batches, dtypes; this GPU
    clip-flash measure-attention --models ViT-L-14 --repeats 100 --out /tmp/h100.json

Shapes come from ``open_clip.get_model_config`` (no weights are loaded): the vision tower's
(batch, (image/patch)^2 + 1 tokens, width/head_width heads, head_width) and the text tower's causal
(batch, context_length, heads, width/heads), padded and packed (variable length: caption lengths drawn
uniformly from ``--varlen-lengths`` with a fixed seed). q/k/v are strided views of one (B, L, 3, H, D)
tensor, the layout a patched model passes (views of its QKV projection).

Each shape: every backend warmed up, then ``--repeats`` rounds, each timing one call per backend with CUDA
events, the backends' order alternating between rounds; the median is recorded (``ms``: eager, the launch
included). Then as many rounds with the device held busy ahead of them (a sleep kernel longer than the round's
launches), so that the events time the kernels alone, back to back, as a CUDA graph replays them (``device_ms``;
``auto`` chooses by these while a graph is captured). A backend that cannot serve or raises on a shape is
skipped, with the reason recorded. Packed shapes time ``sdpa`` (torch's
``varlen_attn``: pinning an SDPA kernel does not apply to it) and ``flash_attn``.

Writes the JSON table (default ``clip_flash/backends/attention_tables/<gpu slug>.json``, which ships with the package
and is used by ``clip_flash.patch(model, backend="auto")`` on this GPU) and a markdown summary next to it
(``attention_table_summary.py``).
"""
from __future__ import annotations

import argparse
import datetime
import json
import re
import shlex
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from clip_flash.backends import AttentionNeeds, available_backends, get_backend
from clip_flash.info import environment as clip_flash_environment
from clip_flash.backends.attention_table import SHIPPED_TABLE_DIR, parse_table
from clip_flash.backends.attention_table_summary import format_ms, render_markdown

DEFAULT_MODELS = ("ViT-B-32", "ViT-B-16", "ViT-L-14", "ViT-H-14", "ViT-g-14")
DEFAULT_VISION_BATCHES = (1, 4, 16, 64, 256)
DEFAULT_TEXT_BATCHES = (1, 16, 256, 1024)
# Padded caption lengths timed: short captions replay the graphs' small length buckets, whose fastest kernel can differ
# from the full context's (an H200: memory-efficient at 8-32 tokens, cuDNN at 77); None is the model's context.
DEFAULT_TEXT_SEQS: Tuple[Optional[int], ...] = (8, 16, 32, None)
DEFAULT_DTYPES = ("float16", "bfloat16")
# The padded kernels a user can pin. Plain "sdpa" (torch's own pick) is one of these, "sdpa:math" and
# "reference" are never worth choosing on a GPU.
PADDED_BACKENDS = ("sdpa:cudnn", "sdpa:flash", "sdpa:efficient", "flash_attn")
# Packed batches: torch's varlen_attn (what every sdpa name runs for them) and flash-attn's varlen kernel.
VARLEN_BACKENDS = ("sdpa", "flash_attn")
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Shape:
    """One attention shape to time. Packed shapes: ``batch`` sequences of ``lengths``, ``seq`` the longest."""

    dtype: str
    causal: bool
    varlen: bool
    batch: int
    seq: int
    heads: int
    head_dim: int
    lengths: Tuple[int, ...] = ()

    @property
    def tokens(self) -> int:
        return sum(self.lengths) if self.varlen else self.batch * self.seq


@dataclass
class Measurement:
    """Per backend the median ms (None when it was skipped; ``errors`` says why)."""

    shape: Shape
    models: List[str]
    ms: Dict[str, Optional[float]] = field(default_factory=dict)
    errors: Dict[str, str] = field(default_factory=dict)
    device_ms: Dict[str, Optional[float]] = field(default_factory=dict)

    @property
    def best(self) -> Optional[str]:
        return _fastest(self.ms)

    @property
    def best_replayed(self) -> Optional[str]:
        return _fastest(self.device_ms)

    def to_entry(self) -> Dict[str, Any]:
        shape = self.shape
        entry: Dict[str, Any] = {
            "dtype": shape.dtype, "causal": shape.causal, "varlen": shape.varlen, "batch": shape.batch,
            "seq": shape.seq, "heads": shape.heads, "head_dim": shape.head_dim,
        }
        if shape.varlen:
            entry["tokens"] = shape.tokens
            entry["max_seqlen"] = shape.seq
        entry.update({"ms": dict(self.ms), "best": self.best, "models": list(self.models)})
        if self.device_ms:
            entry.update({"device_ms": dict(self.device_ms), "best_replayed": self.best_replayed})
        if self.errors:
            entry["errors"] = dict(self.errors)
        return entry


def _fastest(timings: Dict[str, Optional[float]]) -> Optional[str]:
    timed = [(ms, name) for name, ms in timings.items() if ms is not None]
    return min(timed)[1] if timed else None


# -- shapes ---------------------------------------------------------------------------------------------------

def _pair(value) -> Tuple[int, int]:
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))


def tower_geometry(name: str) -> Dict[str, Optional[Tuple[int, int, int, bool]]]:
    """Per tower ("vision", "text"): (seq, heads, head_dim, causal) of its attention, or None when it is not
    OpenCLIP's own transformer (timm / Hugging Face towers, ResNets). ValueError for unknown model names."""
    import open_clip

    config = open_clip.get_model_config(name)
    if config is None:
        raise ValueError(f"unknown OpenCLIP model {name!r}")
    geometry: Dict[str, Optional[Tuple[int, int, int, bool]]] = {"vision": None, "text": None}
    vision = config.get("vision_cfg", {})
    if not vision.get("timm_model_name") and isinstance(vision.get("layers", 12), int):
        width, head_width = vision.get("width", 768), vision.get("head_width", 64)
        grid_h, grid_w = (i // p for i, p in zip(_pair(vision.get("image_size", 224)),
                                                 _pair(vision.get("patch_size", 16))))
        geometry["vision"] = (grid_h * grid_w + 1, width // head_width, head_width, False)  # + the class token
    text = config.get("text_cfg", {})
    if not text.get("hf_model_name"):
        width, heads = text.get("width", 512), text.get("heads", 8)
        causal = not text.get("no_causal_mask", False)  # SigLIP-style towers are bidirectional
        geometry["text"] = (text.get("context_length", 77), heads, width // heads, causal)
    return geometry


def varlen_lengths(batch: int, low: int, high: int, seed: int) -> Tuple[int, ...]:
    """``batch`` caption lengths drawn uniformly in [low, high], the same for every run with this seed."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + batch)
    return tuple(torch.randint(low, high + 1, (batch,), generator=generator).tolist())


def plan_shapes(models: Sequence[str], dtypes: Sequence[str], vision_batches: Sequence[int],
                text_batches: Sequence[int], text_seqs: Sequence[Optional[int]], varlen_range: Tuple[int, int],
                seed: int) -> Tuple[Dict[Shape, List[str]], List[str]]:
    """Every distinct shape to time, with the models that have it, and notes on towers skipped."""
    shapes: Dict[Shape, List[str]] = {}
    notes: List[str] = []

    def add(shape: Shape, model: str) -> None:
        owners = shapes.setdefault(shape, [])
        if model not in owners:
            owners.append(model)

    for model in models:
        geometry = tower_geometry(model)
        for tower, geo in geometry.items():
            if geo is None:
                notes.append(f"{model}: {tower} tower is not OpenCLIP's transformer, not measured")
        for dtype in dtypes:
            if geometry["vision"] is not None:
                seq, heads, head_dim, _ = geometry["vision"]
                for batch in vision_batches:
                    add(Shape(dtype, False, False, batch, seq, heads, head_dim), model)
            if geometry["text"] is not None:
                context, heads, head_dim, causal = geometry["text"]
                for batch in text_batches:
                    for seq in sorted({min(seq or context, context) for seq in text_seqs}):
                        add(Shape(dtype, causal, False, batch, seq, heads, head_dim), model)
                    if causal:  # only causal towers skip padding by packing (clip_flash/patching/text_fast_path.py)
                        lengths = varlen_lengths(batch, *varlen_range, seed)
                        add(Shape(dtype, True, True, batch, max(lengths), heads, head_dim, lengths), model)
    return shapes, notes


# -- timing ---------------------------------------------------------------------------------------------------

def _inputs(shape: Shape, device: torch.device):
    """q, k, v as views of one packed projection, plus (cu_seqlens, max_seqlen) for packed shapes."""
    dtype = DTYPES[shape.dtype]
    if shape.varlen:
        qkv = torch.randn(shape.tokens, 3, shape.heads, shape.head_dim, device=device, dtype=dtype)
        lengths = torch.tensor((0,) + shape.lengths, device=device, dtype=torch.int32)
        return qkv.unbind(1), (lengths.cumsum(0, dtype=torch.int32), shape.seq)
    qkv = torch.randn(shape.batch, shape.seq, 3, shape.heads, shape.head_dim, device=device, dtype=dtype)
    return qkv.unbind(2), None


def _call(name: str, shape: Shape, qkv, packing):
    backend = get_backend(name)
    q, k, v = qkv
    if packing is not None:
        return lambda: backend.attend_varlen(q, k, v, packing[0], packing[1], shape.causal)
    return lambda: backend.attend(q, k, v, shape.causal)


def measure_shape(shape: Shape, models: List[str], names: Sequence[str], repeats: int, warmup: int,
                  device: torch.device) -> Measurement:
    """Median CUDA-event ms per backend on ``shape``; backends that cannot serve it or raise are recorded."""
    result = Measurement(shape, models)
    qkv, packing = _inputs(shape, device)
    needs = AttentionNeeds("cuda", DTYPES[shape.dtype], shape.head_dim, shape.causal, False, shape.varlen,
                           tuple(torch.cuda.get_device_capability(device)))
    calls = {}
    for name in names:
        reasons = get_backend(name).unsupported_reasons(needs)
        if reasons:
            result.ms[name], result.errors[name] = None, "skipped: " + "; ".join(reasons)
            continue
        call = _call(name, shape, qkv, packing)
        try:
            for _ in range(max(warmup, 1)):
                call()
            torch.cuda.synchronize(device)
        except Exception as error:  # record it and go on: one kernel's limits must not end the run
            result.ms[name], result.errors[name] = None, f"{type(error).__name__}: {str(error).splitlines()[0]}"
            torch.cuda.synchronize(device)
            continue
        calls[name] = call
    result.ms.update(_timed_rounds(calls, repeats, device, busy_ahead_cycles=0))
    if hasattr(torch.cuda, "_sleep"):  # torch's sleep kernel, which keeps the device busy ahead of a round
        result.device_ms.update(_timed_rounds(calls, repeats, device, _sleep_cycles(device, BUSY_AHEAD_MS)))
    return result


# Milliseconds of device work queued ahead of each device-time round: longer than launching a round of every
# backend's call (each at most a few hundred microseconds of host time), so the round's kernels run back to back.
BUSY_AHEAD_MS = 5.0


def _sleep_cycles(device: torch.device, ms: float) -> int:
    """Clock cycles that ``torch.cuda._sleep`` spins for about ``ms`` on ``device`` (its clock rate, else 2 GHz)."""
    khz = getattr(torch.cuda.get_device_properties(device), "clock_rate", 0) or 2_000_000
    return int(khz * ms)


def _timed_rounds(calls: Dict[str, Any], repeats: int, device: torch.device,
                  busy_ahead_cycles: int) -> Dict[str, Optional[float]]:
    """Median CUDA-event ms per call over ``repeats`` rounds of one call each, the order alternating between
    rounds so that drift and caching favour no backend. With ``busy_ahead_cycles``, each round is queued behind a
    sleep kernel: the events then time the kernels alone, not the host launching them."""
    order = list(calls)
    events: Dict[str, List[Tuple[torch.cuda.Event, torch.cuda.Event]]] = {name: [] for name in order}
    for round_index in range(repeats):
        if busy_ahead_cycles:
            torch.cuda._sleep(busy_ahead_cycles)
        for name in (order if round_index % 2 == 0 else reversed(order)):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            calls[name]()
            end.record()
            events[name].append((start, end))
        if busy_ahead_cycles:
            torch.cuda.synchronize(device)  # the next round's sleep must start after this round's host work
    torch.cuda.synchronize(device)
    return {name: round(statistics.median(s.elapsed_time(e) for s, e in events[name]), 5) for name in order}


# -- output ---------------------------------------------------------------------------------------------------

def gpu_slug(name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``nvidia-h100-80gb-hbm3`` (the default table file name)."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def environment(command: str) -> Dict[str, Any]:
    """The table's header: GPU, versions (as ``python -m clip_flash.info`` reports them), the command and when."""
    info = clip_flash_environment()
    header: Dict[str, Any] = {key: info[key] for key in ("gpu", "torch", "cuda", "cudnn", "flash_attn", "open_clip",
                                                         "clip_flash")}
    header["capability"] = list(torch.cuda.get_device_capability())  # tables match on it
    header["command"] = command
    header["created"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return header


# -- command line ---------------------------------------------------------------------------------------------

def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("``", "'"),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), help="OpenCLIP model names")
    parser.add_argument("--vision-batch-sizes", nargs="+", type=int, default=list(DEFAULT_VISION_BATCHES),
                        help="image batch sizes to time (default " + " ".join(map(str, DEFAULT_VISION_BATCHES)) + ")")
    parser.add_argument("--text-batch-sizes", nargs="+", type=int, default=list(DEFAULT_TEXT_BATCHES),
                        help="caption batch sizes to time (default " + " ".join(map(str, DEFAULT_TEXT_BATCHES)) + ")")
    parser.add_argument("--text-seqs", nargs="+", type=int, default=None,
                        help="padded text lengths to time, each at most the model's context length (default 8 16 32 "
                             "and the context length, 77)")
    parser.add_argument("--varlen-lengths", nargs=2, type=int, default=(8, 40), metavar=("MIN", "MAX"),
                        help="packed text: caption lengths drawn uniformly in [MIN, MAX] (default 8 40)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the packed lengths (default 0)")
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=list(DEFAULT_DTYPES),
                        help="precisions to time (default " + " ".join(DEFAULT_DTYPES) + ")")
    parser.add_argument("--backends", nargs="+", default=None,
                        help=f"backends to time (default: the available ones of {', '.join(PADDED_BACKENDS)}; "
                             f"packed shapes: {', '.join(VARLEN_BACKENDS)})")
    parser.add_argument("--repeats", type=int, default=50, help="timed calls per backend and shape (median)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed calls per backend and shape first")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON table (default clip_flash/backends/attention_tables/<gpu slug>.json)")
    parser.add_argument("--markdown", type=Path, default=None, help="markdown summary (default: --out as .md)")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.warmup < 0:
        parser.error("--repeats must be >= 1 and --warmup >= 0")
    low, high = args.varlen_lengths
    if not 1 <= low <= high:
        parser.error("--varlen-lengths needs 1 <= MIN <= MAX")
    return args


def backends_to_time(requested: Optional[Sequence[str]], varlen: bool) -> List[str]:
    """The available backends to time for padded or packed shapes (``requested`` narrows them)."""
    statuses = available_backends()
    names: List[str] = []
    for name in requested or (VARLEN_BACKENDS if varlen else PADDED_BACKENDS):
        if varlen and name.startswith("sdpa"):
            name = "sdpa"  # every sdpa name runs torch's varlen_attn for packed batches
        if varlen and not get_backend(name).supports_varlen:
            continue
        if statuses[name].available and name not in names:
            names.append(name)
    return names


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("error: measure-attention times CUDA kernels and needs a CUDA GPU; torch.cuda.is_available() is "
              f"False (torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'})", file=sys.stderr)
        return 2
    statuses = available_backends()
    for name in args.backends or ():
        if name not in statuses:
            print(f"error: unknown backend {name!r}; choose from {', '.join(statuses)}", file=sys.stderr)
            return 2
    try:
        shapes, notes = plan_shapes(args.models, args.dtypes, args.vision_batch_sizes, args.text_batch_sizes,
                                    args.text_seqs or DEFAULT_TEXT_SEQS, tuple(args.varlen_lengths), args.seed)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for name, status in statuses.items():
        if name in PADDED_BACKENDS + VARLEN_BACKENDS and not status.available:
            notes.append(f"{name} not timed: {status.reason}")

    parts = sys.argv if argv is None else ["clip-flash", "measure-attention", *argv]
    command = " ".join(shlex.quote(part) for part in [sys.executable, *parts])
    header = environment(command)
    out = args.out or (SHIPPED_TABLE_DIR / f"{gpu_slug(header['gpu'])}.json")
    markdown_path = args.markdown or out.with_suffix(".md")
    device = torch.device("cuda")
    padded_names, varlen_names = backends_to_time(args.backends, False), backends_to_time(args.backends, True)
    print(f"{header['gpu']}: {len(shapes)} shapes; padded {', '.join(padded_names) or 'none'}; "
          f"packed {', '.join(varlen_names) or 'none'}", file=sys.stderr)

    measurements = []
    for index, (shape, models) in enumerate(shapes.items(), 1):
        names = varlen_names if shape.varlen else padded_names
        measurement = measure_shape(shape, models, names, args.repeats, args.warmup, device)
        measurements.append(measurement)
        timings = ", ".join(f"{n} {format_ms(ms)}/{format_ms(measurement.device_ms.get(n))}"
                            for n, ms in measurement.ms.items())
        print(f"[{index}/{len(shapes)}] {shape.dtype} {'varlen ' if shape.varlen else ''}"
              f"{'causal ' if shape.causal else ''}b{shape.batch} s{shape.seq} h{shape.heads} d{shape.head_dim}: "
              f"eager/device ms {timings} -> {measurement.best} eager, {measurement.best_replayed} replayed",
              file=sys.stderr)
        torch.cuda.empty_cache()

    table = dict(header)
    table.update({
        "repeats": args.repeats, "warmup": args.warmup, "models": list(args.models),
        "varlen_lengths": list(args.varlen_lengths), "seed": args.seed, "notes": notes,
        "entries": [m.to_entry() for m in measurements],
    })
    parse_table(table, str(out))  # what auto will read must parse
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
    markdown_path.parent.mkdir(parents=True, exist_ok=True)
    markdown_path.write_text(render_markdown(table), encoding="utf-8")
    print(f"wrote {out} and {markdown_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
