"""Read two benchmark result files and compare their rates: the helper behind ``benchmarks/compare_results.py``.

A result file is one or two of these kinds:

- ``shapes``: ``scripts/bench_clip.py --json`` tower timings per (model, tower, batch, dtype); the script compares
  those itself (medians, regressions flagged, exit status);
- ``pipelines``: ``scripts/bench_clip.py --pipeline ...`` (the same schema, each model's ``image_pipelines``):
  images/s per (model, dtype, pipeline), and the encoder alone on a prepared batch;
- ``job``: ``benchmarks/bench_embed.py``'s ``embed_bench.json``: items/s, steady and whole run, per
  (model, inputs, case), and the encoder-only ceilings the runs are measured against;
- ``throughput``: ``benchmarks/image_decode_throughput.py --json``: decode and files -> device batch images/s per
  (executor, workers, JPEG route), the median over its rounds;
- ``serve``: ``benchmarks/serve/bench_serve.py``'s curves: achieved requests/s per offered rate;
- ``latency``: ``benchmarks/image_latency.py --json``: p50 / p99 ms of single requests;
- ``text batches``: ``benchmarks/bench_text_batches.py --json``: captions/s per (captions a batch, graph sizes per
  doubling, grouping), and the eager encoder alone;
- ``packed attention``: ``benchmarks/bench_packed_attention.py --json``: microseconds of one call per (captions,
  max_seqlen), torch's varlen_attn and clip_flash's kernel.

Rates are compared as new / old: above 1 is faster. Plain JSON in, text out: no torch, no GPU.
"""
from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

SCHEMA = "clip_flash.bench_clip/1"
SHAPES, PIPELINES, JOB, THROUGHPUT, SERVE, LATENCY = "shapes", "pipelines", "job", "throughput", "serve", "latency"
TEXT_BATCHES, PACKED_ATTENTION = "text batches", "packed attention"

Key = Tuple[str, ...]
Values = Dict[str, Optional[float]]  # metric -> rate (None: not measured)


class ResultsFileError(ValueError):
    """A file that is not a result this comparison reads (the message says which and why)."""


@dataclass(frozen=True)
class Kind:
    """How one kind of result is keyed and which rates it compares."""

    name: str
    title: str  # what wrote it, for the header lines
    key_columns: Tuple[str, ...]
    metrics: Tuple[Tuple[str, str], ...]  # (short name, column label)
    detail: str  # column saying how each row ran (old -> new where that changed)
    unrecorded_last_matches: bool = False  # a last key part "-" (not recorded) pairs with any value of it
    times: bool = False  # the metrics are times (lower is faster): the ratio is old / new
    unit: str = "ms"  # of the times


KINDS: Dict[str, Kind] = {kind.name: kind for kind in (
    Kind(SHAPES, "bench_clip tower shapes", ("model", "tower", "batch", "dtype"), (), ""),
    Kind(PIPELINES, "bench_clip pipelines", ("model", "dtype", "pipeline"), (("images/s", "images/s"),),
         "workers, batch"),
    Kind(JOB, "bench_embed job bench", ("model", "inputs", "case"),
         (("steady", "items/s (steady)"), ("whole run", "items/s (whole run)")), "items"),
    Kind(THROUGHPUT, "image_decode_throughput", ("executor", "workers", "JPEG route"),
         (("decode", "decode images/s"), ("to device", "files -> device batch images/s")), "rounds",
         unrecorded_last_matches=True),
    Kind(SERVE, "bench_serve curves", ("server", "workload", "offered req/s"), (("achieved", "achieved req/s"),),
         "p50 / p99 ms"),
    Kind(LATENCY, "image_latency requests", ("side or step",), (("p50", "p50 ms"), ("p99", "p99 ms")), "requests",
         times=True),
    Kind(TEXT_BATCHES, "bench_text_batches caption batches", ("captions a batch", "graphs per doubling", "grouping"),
         (("captions/s", "captions/s"),), "token rows a caption", unrecorded_last_matches=True),
    Kind(PACKED_ATTENTION, "bench_packed_attention calls", ("captions", "max_seqlen"),
         (("varlen_attn", "varlen_attn us"), ("packed_attention", "packed_attention us")), "tokens", times=True,
         unit="us"),
)}


@dataclass
class Rows:
    """One run's rates of one kind: per key its metrics, and how that row ran (workers, items, rounds)."""

    kind: Kind
    values: Dict[Key, Values] = field(default_factory=dict)
    details: Dict[Key, str] = field(default_factory=dict)


def _number(value: Any) -> Optional[float]:
    """A rate as bench_embed formats it (``"14,213"``, ``"n/a"``) or as a number; None when there is none."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    try:
        return float(str(value).replace(",", ""))
    except ValueError:
        return None


def _dict_rows(data: Any) -> List[Dict[str, Any]]:
    rows = data.get("rows") if isinstance(data, dict) else None
    return [row for row in rows if isinstance(row, dict)] if isinstance(rows, list) else []


def kinds_of(data: Any) -> Tuple[str, ...]:
    """The kinds of result in a parsed JSON file; empty when it is none this comparison reads."""
    if isinstance(data, dict) and data.get("schema") == SCHEMA:
        models = [model for model in data.get("models") or [] if isinstance(model, dict)]
        has_rows = any(model.get("rows") for model in models)
        has_pipelines = any((model.get("image_pipelines") or {}).get("pipelines") for model in models)
        # A bench_clip run of neither (zero-shot only, say) stays a (shapeless) tower run, as before.
        return ((SHAPES,) if has_rows or not has_pipelines else ()) + ((PIPELINES,) if has_pipelines else ())
    rows = _dict_rows(data)
    if isinstance(data, dict) and ("encoder_only_items_per_s" in data
                                   or any("items/s (steady)" in row for row in rows)):
        return (JOB,)
    if rows and all("executor" in row and "decode_images_per_s" in row for row in rows):
        return (THROUGHPUT,)
    if isinstance(data, dict) and isinstance(data.get("configs"), dict) and isinstance(data.get("runs"), list):
        return (SERVE,)
    if any("side" in row and "p50_ms" in row for row in rows):
        return (LATENCY,)
    if any("captions_per_s" in row and "per_doubling" in row for row in rows):
        return (TEXT_BATCHES,)
    if any(isinstance(row.get("us"), dict) and "max_seqlen" in row for row in rows):
        return (PACKED_ATTENTION,)
    return ()


def header(data: Dict[str, Any]) -> Dict[str, str]:
    """git revision, GPU, torch version and command line of a run, ``"?"`` where the file does not say."""
    record = data.get("environment") if data.get("schema") == SCHEMA else data
    runs = data.get("runs")  # bench_serve: one record per invocation into the folder; the last one
    if isinstance(runs, list) and runs and isinstance(runs[-1], dict):
        record = runs[-1]
    record = record if isinstance(record, dict) else {}
    versions = record.get("clip_flash_environment") or (data.get("environment") or {}).get("clip_flash_environment")
    versions = versions if isinstance(versions, dict) else {}
    return {"git": str(record.get("git_revision", "?")), "gpu": str(record.get("device_name", "?")),
            "torch": str(versions.get("torch", "?")), "command": str(record.get("command", "?"))}


@dataclass
class ResultsFile:
    """A parsed result file and the kinds of result it holds."""

    path: Path
    data: Dict[str, Any]
    kinds: Tuple[str, ...]

    @property
    def title(self) -> str:
        """What the file is, e.g. ``bench_clip pipelines``."""
        return " + ".join(KINDS[kind].title for kind in self.kinds)

    def describe(self) -> str:
        """One line: the path, its kind, git revision, GPU, torch version and command."""
        info = header(self.data)
        return (f"{self.path} ({self.title}): git {info['git']}, {info['gpu']}, torch {info['torch']}, "
                f"command: {info['command']}")

    def rows(self, kind: str) -> Rows:
        """This run's rates of ``kind`` (any kind but ``SHAPES``, which compare_results reads itself)."""
        return _READERS[kind](self.data)


def open_results(path: Path) -> ResultsFile:
    """Parse ``path`` and tell its kind; ``ResultsFileError`` when it cannot be read or is no known result."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ResultsFileError(f"{path}: cannot read a JSON results file ({error})") from None
    kinds = kinds_of(data)
    if not kinds:
        raise ResultsFileError(f"{path}: not a bench_clip result (schema {SCHEMA!r} expected), nor a "
                               "bench_embed, image_decode_throughput, bench_serve, image_latency, "
                               "bench_text_batches or bench_packed_attention JSON")
    return ResultsFile(Path(path), data, kinds)


def read_pipelines(data: Dict[str, Any]) -> Rows:
    """images/s per (model, dtype, pipeline) of a bench_clip ``--pipeline`` run, and the encoder alone."""
    rows = Rows(KINDS[PIPELINES])
    for model in data.get("models") or []:
        name, dtype = str(model.get("name") or model.get("spec")), str(model.get("precision"))
        measured = model.get("image_pipelines") or {}
        for run in measured.get("pipelines") or []:
            key = (name, dtype, str(run.get("pipeline")))
            rows.values[key] = {"images/s": _number(run.get("images_per_s"))}
            rows.details[key] = f"{run.get('executor', '?')} x{run.get('cpu_workers', '?')}, b{run.get('batch', '?')}"
        encoder = measured.get("encoder_only")
        if isinstance(encoder, dict):
            key = (name, dtype, "(encoder alone)")
            rows.values[key] = {"images/s": _number(encoder.get("images_per_s"))}
            rows.details[key] = f"b{encoder.get('batch', '?')}"
    return rows


def _input_kind(inputs: str) -> str:
    """``"384 photos x 60"`` -> ``"photos"``, ``"50000 ImageNet captions"`` -> ``"ImageNet captions"``."""
    return re.sub(r"^\s*[\d,]+\s+|\s+x\s+\d+\s*$", "", inputs) or inputs


def read_job(data: Dict[str, Any]) -> Rows:
    """items/s (steady, whole run) per (model, inputs, case) of a bench_embed run, and the encoder-only ceilings.

    Cases are keyed by the kind of inputs (photos, captions), not their count: runs of different lengths compare,
    and the items column shows both counts. A case run several times (``--cases`` naming it again, alternated
    with another) gives the median of its runs, and the items column says how many.
    """
    rows = Rows(KINDS[JOB])
    runs: Dict[Key, List[Dict[str, Optional[float]]]] = {}
    for row in _dict_rows(data):
        key = (str(row.get("model")), _input_kind(str(row.get("inputs", "?"))), str(row.get("pipeline")))
        runs.setdefault(key, []).append({"steady": _number(row.get("items/s (steady)")),
                                         "whole run": _number(row.get("items/s (whole run)"))})
        items = _number(row.get("items"))
        rows.details[key] = "?" if items is None else f"{items:,.0f}"
    for key, measured in runs.items():
        rows.values[key] = {metric: _median([run[metric] for run in measured]) for metric in ("steady", "whole run")}
        if len(measured) > 1:
            rows.details[key] += f" (median of {len(measured)} runs)"
    ceilings = data.get("encoder_only_items_per_s")
    for model, towers in (ceilings.items() if isinstance(ceilings, dict) else ()):
        for tower, rate in (towers.items() if isinstance(towers, dict) else ()):
            key = (str(model), "on the GPU", f"(encoder only, {tower})")
            rows.values[key] = {"steady": _number(rate), "whole run": None}
            rows.details[key] = "-"
    return rows


def _median(values: List[Optional[float]]) -> Optional[float]:
    known = [value for value in values if value is not None]
    return statistics.median(known) if known else None


def read_throughput(data: Dict[str, Any]) -> Rows:
    """decode and files -> device images/s per (executor, workers, JPEG route), the median over rounds.

    Files written before the JPEG route existed record none: their rows have route ``"-"``.
    """
    rows = Rows(KINDS[THROUGHPUT])
    rounds: Dict[Key, List[Dict[str, Any]]] = {}
    for row in _dict_rows(data):
        key = (str(row.get("executor")), str(row.get("workers")), str(row.get("jpeg_route") or "-"))
        rounds.setdefault(key, []).append(row)
    for key, measured in rounds.items():
        values: Values = {}
        for metric, column in (("decode", "decode_images_per_s"), ("to device", "prepared_images_per_s")):
            rates = [rate for rate in (_number(row.get(column)) for row in measured) if rate is not None]
            values[metric] = statistics.median(rates) if rates else None
        rows.values[key] = values
        rows.details[key] = str(len(measured))
    return rows


def read_serve(data: Dict[str, Any]) -> Rows:
    """Achieved requests/s per (server configuration, workload, offered rate), with p50 / p99 beside them.

    A rate offered twice in one curve (bisection) keeps its last point."""
    rows = Rows(KINDS[SERVE])
    for server, config in data["configs"].items():
        for workload, curve in ((config or {}).get("curves") or {}).items():
            for point in (curve or {}).get("points") or []:
                key = (server, workload, f"{_number(point.get('offered_rps')) or 0:,.1f}")
                latency = point.get("latency_ms") or {}
                rows.values[key] = {"achieved": _number(point.get("achieved_rps"))}
                rows.details[key] = f"{latency.get('p50', '?')} / {latency.get('p99', '?')}"
    return rows


def read_latency(data: Dict[str, Any]) -> Rows:
    """p50 and p99 ms per side of an ``image_latency.py`` run (stock, clip_flash), and each step's p50 alone."""
    rows = Rows(KINDS[LATENCY])
    for row in _dict_rows(data):
        if "side" in row:
            key = (str(row["side"]),)
            rows.values[key] = {"p50": _number(row.get("p50_ms")), "p99": _number(row.get("p99_ms"))}
            rows.details[key] = str(row.get("requests", "?"))
        elif "step" in row:
            key = (f"step: {' '.join(str(row['step']).split())}",)
            rows.values[key] = {"p50": _number(row.get("p50_ms")), "p99": None}
            rows.details[key] = "-"
    return rows


def read_text_batches(data: Dict[str, Any]) -> Rows:
    """Captions/s per (captions a batch, graph sizes per doubling, grouping), the token rows computed a caption
    beside them; the eager encoder alone as its own row. Runs from before groupings record none (``"-"``)."""
    rows = Rows(KINDS[TEXT_BATCHES])
    for row in _dict_rows(data):
        if "captions_per_s" in row and "batch" in row:
            key = (str(row["batch"]), str(row.get("per_doubling", "-")), str(row.get("grouping") or "-"))
            rows.values[key] = {"captions/s": _number(row["captions_per_s"])}
            token_rows = _number(row.get("token_rows_per_caption"))
            rows.details[key] = "?" if token_rows is None else f"{token_rows:.1f}"
        elif "alone_captions_per_s" in row:
            key = (str(row.get("alone_batch", "?")), "-", "encoder alone (eager)")
            rows.values[key] = {"captions/s": _number(row["alone_captions_per_s"])}
            rows.details[key] = "-"
    return rows


def read_packed_attention(data: Dict[str, Any]) -> Rows:
    """Microseconds of one call per (captions, max_seqlen): torch's varlen_attn and clip_flash's kernel (the
    first of its variants where a run timed several)."""
    rows = Rows(KINDS[PACKED_ATTENTION])
    for row in _dict_rows(data):
        timed = row.get("us")
        if not isinstance(timed, dict) or "max_seqlen" not in row:
            continue
        kernel = next((name for name in timed if str(name).startswith("packed_attention")), None)
        key = (str(row.get("captions", "?")), str(row["max_seqlen"]))
        rows.values[key] = {"varlen_attn": _number(timed.get("varlen_attn")),
                            "packed_attention": _number(timed.get(kernel)) if kernel else None}
        rows.details[key] = f"{_number(row.get('tokens')) or 0:,.0f}"
    return rows


_READERS: Dict[str, Callable[[Dict[str, Any]], Rows]] = {
    PIPELINES: read_pipelines, JOB: read_job, THROUGHPUT: read_throughput, SERVE: read_serve, LATENCY: read_latency,
    TEXT_BATCHES: read_text_batches, PACKED_ATTENTION: read_packed_attention}


def pair_keys(old: Sequence[Key], new: Sequence[Key], unrecorded_last_matches: bool = False
              ) -> Tuple[List[Tuple[Key, Key]], List[Key], List[Key]]:
    """(pairs of keys to compare, keys only in old, keys only in new).

    Equal keys pair. With ``unrecorded_last_matches``, a key left over whose last part is ``"-"`` (not
    recorded) then pairs with every left-over key of the other run that agrees on the other parts.
    """
    pairs = [(key, key) for key in sorted(set(old) & set(new))]
    old_left, new_left = sorted(set(old) - set(new)), sorted(set(new) - set(old))
    if unrecorded_last_matches:
        loose = [(a, b) for a in old_left for b in new_left
                 if a[:-1] == b[:-1] and "-" in (a[-1], b[-1])]
        pairs += loose
        old_left = [key for key in old_left if all(key != a for a, _ in loose)]
        new_left = [key for key in new_left if all(key != b for _, b in loose)]
    return pairs, old_left, new_left


def _changed(before: str, after: str) -> str:
    return before if before == after else f"{before} -> {after}"


def _rate(value: Optional[float], times: bool = False) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.3f}" if times else f"{value:,.0f}"


def compare_rows(old: Rows, new: Rows, threshold: float) -> Tuple[List[str], int]:
    """(markdown table lines plus "only in" lines, number of rows in both runs).

    Each rate shows old -> new and the ratio new / old (for times, old / new: above 1 is faster either way); a
    row whose ratio falls below ``1 / (1 + threshold)`` is marked slower, naming the metrics that fell behind.
    """
    kind = old.kind
    columns = list(kind.key_columns) + [kind.detail]
    for _, label in kind.metrics:
        columns += [f"{label} old -> new", "ratio"]
    lines = ["| " + " | ".join(columns) + " | |", "|" + "---|" * (len(columns) + 1)]
    pairs, only_old, only_new = pair_keys(list(old.values), list(new.values), kind.unrecorded_last_matches)
    floor = 1 / (1 + threshold)
    for before_key, after_key in pairs:
        before, after = old.values[before_key], new.values[after_key]
        cells = [_changed(a, b) for a, b in zip(before_key, after_key)]
        cells.append(_changed(old.details.get(before_key, "?"), new.details.get(after_key, "?")))
        slower = []
        for metric, _ in kind.metrics:
            a, b = before.get(metric), after.get(metric)
            if kind.times:
                ratio = a / b if a is not None and b else None
            else:
                ratio = b / a if a and b is not None else None
            if ratio is not None and ratio < floor:
                slower.append(metric)
            cells += ["-" if a is None and b is None else f"{_rate(a, kind.times)} -> {_rate(b, kind.times)}",
                      "-" if ratio is None else f"{ratio:.3f}"]
        flag = f"slower ({', '.join(slower)} < {floor:.3f})" if slower else ""
        lines.append("| " + " | ".join(cells) + f" | {flag} |")
    for name, only in (("old", only_old), ("new", only_new)):
        lines += [f"only in the {name} run: " + " / ".join(key) for key in only]
    return lines, len(pairs)
