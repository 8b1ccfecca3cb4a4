"""Tables, files and the environment record of a benchmark run.

The first table of every model has exactly the shape of the published openclip-flashattn tables
(header line, ``Times = **N**, using causal mask``, five columns), so results can be set side by
side; everything else (throughput, memory, error against fp32, backend, zero-shot, latency) comes in
separate tables after it.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence

import torch

from .image_pipelines import format_image_pipelines
from clip_flash.environment import device_name, environment_record, source_revision as git_revision  # noqa: F401

from .records import ModelResult, ShapeResult

PUBLISHED_BATCH_SIZES = (1, 2, 4, 8, 16)
PUBLISHED_COLUMNS = ("shape", "baseline(s)", "flash_attn(s)", "speed up (x)", "mean diff")
EXTENDED_COLUMNS = (
    "shape", "stock items/s", "patched items/s", "stock ms (median)", "patched ms (median)",
    "stock peak MiB", "patched peak MiB", "stock cos vs fp32", "patched cos vs fp32", "backend",
)
ZERO_SHOT_COLUMNS = (
    "prompts", "batch", "stock (s)", "patched (s)", "speed up (x)", "stock prompts/s",
    "patched prompts/s", "stock cos vs fp32", "patched cos vs fp32", "max abs diff", "backend",
)
LATENCY_COLUMNS = (
    "tower", "shape", "requests", "stock p50 (ms)", "stock p99 (ms)", "patched p50 (ms)",
    "patched p99 (ms)", "p50 speed up (x)", "backend",
)


# The environment record is the package's own (clip_flash.environment): benchmarks and the job record alike.


def parse_kernel_benchmark_args(parser: argparse.ArgumentParser, repeats: int = 30) -> argparse.Namespace:
    """Add the options every kernel microbenchmark shares (``--repeats``, ``--json``, ``--markdown``) and parse;
    exits with the usage line where no CUDA GPU is visible."""
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    return args


def write_microbenchmark(json_path: Optional[Path], markdown_path: Optional[Path], title: str,
                         table_lines: Sequence[str], rows: Sequence[Dict[str, Any]]) -> None:
    """Write a kernel microbenchmark's rows (JSON) and table (markdown), each with how it was taken.

    ``title`` is a sentence naming what was timed and how; the command line, git revision, GPU and versions
    come from ``environment_record``. Missing parent folders are made.
    """
    import shlex
    import sys

    command = "python " + " ".join(shlex.quote(arg) for arg in sys.argv)
    record = environment_record(torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"), command)
    for path in (json_path, markdown_path):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
    if json_path:
        json_path.write_text(json.dumps({**record, "title": title, "rows": list(rows)}, indent=2) + "\n")
    if markdown_path:
        env = record["clip_flash_environment"]
        markdown_path.write_text(
            f"<!-- command: {command} -->\n<!-- git: {record['git_revision']} -->\n{title} On `{record['device_name']}` "  # noqa: E501
            f"(torch {env.get('torch')}, CUDA {env.get('cuda')}, cuDNN {env.get('cudnn')}).\n\n"
            + "\n".join(table_lines) + "\n")


# ----- number formats ------------------------------------------------------------------------
def _seconds(value: float) -> str:
    return f"{value:.5f}"


def _ratio(value: float) -> str:
    return f"{value:.4f}"


def _small(value: float) -> str:
    """Six decimals as published; scientific when that would hide a small nonzero value."""
    if value == 0 or abs(value) >= 1e-4:
        return f"{value:.6f}"
    return f"{value:.2e}"


def _cos(value: float) -> str:
    return f"{value:.7f}"


def _maybe(value: Optional[float], fmt: str = "{:.1f}") -> str:
    return "n/a" if value is None or not math.isfinite(value) else fmt.format(value)


# ----- markdown tables -----------------------------------------------------------------------
def markdown_row(cells: Sequence[str], widths: Sequence[int]) -> str:
    """``| a | b |`` with each cell left-aligned and padded to its column width."""
    return "| " + " | ".join(cell.ljust(width) for cell, width in zip(cells, widths)) + " |"


def markdown_rule(widths: Sequence[int]) -> str:
    """The ``|----|----|`` line under a header."""
    return "|" + "|".join("-" * (width + 2) for width in widths) + "|"


def markdown_table(columns: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A whole markdown table, columns as wide as their widest cell."""
    rows = [list(row) for row in rows]
    widths = [max([len(column)] + [len(row[index]) for row in rows]) for index, column in enumerate(columns)]
    lines = [markdown_row(columns, widths), markdown_rule(widths)]
    lines += [markdown_row(row, widths) for row in rows]
    return "\n".join(lines)


def published_batch_sizes(batch_sizes: Iterable[int]) -> List[int]:
    """Which of the run's batch sizes go in the published table: those the published tables have.

    Other sizes (256, 1024...) appear only in the extended table; if none of the published sizes was
    run, every size goes in the published table so it is never empty.
    """
    batch_sizes = list(batch_sizes)
    return [size for size in batch_sizes if size in PUBLISHED_BATCH_SIZES] or batch_sizes


def published_rows(result: ModelResult) -> List[ShapeResult]:
    """Rows of the published table (see :func:`published_batch_sizes`), in run order."""
    sizes = published_batch_sizes(dict.fromkeys(row.batch for row in result.rows))
    return [row for row in result.rows if row.batch in sizes]


def published_header(result: ModelResult, device_label: str, times: int) -> str:
    """The three lines above the published table (title, blank, ``Times = ...``) and a blank line."""
    note = f" {result.weights_note}" if result.weights_note else ""
    return (
        f"Test model (on `{device_label}`): `{result.spec}`{note}\n\n"
        f"Times = **{times}**, using causal mask\n"
    )


class PublishedTable:
    """The published table, printable one row at a time as rows finish."""

    def __init__(self, shape_width: int) -> None:
        self.widths = [max(len(PUBLISHED_COLUMNS[0]), shape_width)] + [len(c) for c in PUBLISHED_COLUMNS[1:]]

    def header(self) -> str:
        """Column names and rule."""
        return markdown_row(PUBLISHED_COLUMNS, self.widths) + "\n" + markdown_rule(self.widths)

    def row(self, row: ShapeResult) -> str:
        """One data row."""
        cells = (
            row.shape_text,
            _seconds(row.stock_total_s),
            _seconds(row.patched_total_s),
            _ratio(row.speedup),
            _small(row.mean_abs_diff),
        )
        return markdown_row(cells, self.widths)


def shape_width(shapes: Iterable[Sequence[int]]) -> int:
    """Width of the widest shape as written ``(1, 3, 224, 224)``."""
    return max((len("(" + ", ".join(map(str, shape)) + ")") for shape in shapes), default=5)


def format_published(result: ModelResult, device_label: str, times: int) -> str:
    """The whole published block for one model."""
    rows = published_rows(result)
    table = PublishedTable(shape_width(row.shape for row in rows))
    lines = [published_header(result, device_label, times), table.header()]
    lines += [table.row(row) for row in rows]
    return "\n".join(lines)


def format_settings(result: ModelResult, settings_note: str) -> str:
    """One line under the published table: what it does not show (dtype, backends, inputs...)."""
    backends = ", ".join(f"{tower} {'+'.join(names) or 'none'}" for tower, names in result.backends_used.items())
    return f"{settings_note}; clip_flash backends: {backends or 'none reported'}."


def format_extended(result: ModelResult) -> str:
    """Per shape: items/s, median ms, peak memory and cosine vs fp32 both ways, and the backend."""
    rows = [
        (
            row.shape_text,
            f"{row.stock_items_per_s:.1f}",
            f"{row.patched_items_per_s:.1f}",
            f"{row.stock_median_ms:.3f}",
            f"{row.patched_median_ms:.3f}",
            _maybe(row.stock_peak_mib),
            _maybe(row.patched_peak_mib),
            _cos(row.stock_cos_fp32),
            _cos(row.patched_cos_fp32),
            row.backend,
        )
        for row in result.rows
    ]
    return markdown_table(EXTENDED_COLUMNS, rows)


def format_zero_shot(zero_shot: Dict[str, Any]) -> str:
    """The zero-shot classifier build, stock vs patched."""
    title = (
        f"Zero-shot classifier: {zero_shot['classes']} classes x {zero_shot['templates']} templates, "
        f"batches of {zero_shot['batch']}, median of {zero_shot['repeats']} builds each way"
    )
    row = (
        str(zero_shot["prompts"]),
        str(zero_shot["batch"]),
        _seconds(zero_shot["stock_median_s"]),
        _seconds(zero_shot["patched_median_s"]),
        _ratio(zero_shot["speedup"]),
        f"{zero_shot['stock_prompts_per_s']:.1f}",
        f"{zero_shot['patched_prompts_per_s']:.1f}",
        _cos(zero_shot["stock_cos_fp32"]),
        _cos(zero_shot["patched_cos_fp32"]),
        _small(zero_shot["max_abs_diff"]),
        zero_shot["backend"],
    )
    text = title + "\n\n" + markdown_table(ZERO_SHOT_COLUMNS, [row])
    if "stock_tokenize_median_s" in zero_shot:
        text += (f"\n\nTimed from strings: tokenizing is included (median "
                 f"{zero_shot['stock_tokenize_median_s']:.3f} s stock, {zero_shot['patched_tokenize_median_s']:.3f} s "
                 f"patched). Stock side: {zero_shot['stock_tokenizer']}; patched side: "
                 f"{zero_shot['patched_tokenizer']}.")
    return text


def format_latency(latency: Dict[str, Any]) -> str:
    """Closed-loop single-request latency per tower, stock vs patched."""
    rows = [
        (
            tower,
            "(" + ", ".join(map(str, data["shape"])) + ")",
            str(data["requests"]),
            f"{data['stock_p50_ms']:.3f}",
            f"{data['stock_p99_ms']:.3f}",
            f"{data['patched_p50_ms']:.3f}",
            f"{data['patched_p99_ms']:.3f}",
            _ratio(data["speedup_p50"]),
            data["backend"],
        )
        for tower, data in latency.items() if tower != "cuda_graphs"
    ]
    text = "Latency: closed loop of single requests, each waited for\n\n" + markdown_table(LATENCY_COLUMNS, rows)
    graphs = latency.get("cuda_graphs")
    if graphs:
        text += (f"\n\nPatched side through CUDA graphs: {graphs['graphs']} graphs captured in "
                 f"{graphs['capture_seconds']:.2f} s, holding {graphs['graph_memory_mib']:.1f} MiB of GPU memory "
                 f"(reserved grew {graphs['reserved_delta_mib']:.1f} MiB during capture)")
    return text


def plain_header(result: ModelResult, device_label: str) -> str:
    """The title line for a model measured without the per-shape tables (``--no-tables``)."""
    return f"Model (on `{device_label}`): `{result.spec}` {result.weights_note}".rstrip()


def format_after_published(result: ModelResult, settings_note: str) -> str:
    """Everything that follows the published table (or the plain title) for one model."""
    parts = [format_settings(result, settings_note)]
    if result.rows:
        parts.append(format_extended(result))
    if result.zero_shot:
        parts.append(format_zero_shot(result.zero_shot))
    if result.latency:
        parts.append(format_latency(result.latency))
    if result.image_pipelines:
        parts.append(format_image_pipelines(result.image_pipelines))
    if result.skipped_images:
        parts.append(f"Skipped {len(result.skipped_images)} unreadable file(s) of --images:\n"
                     + "\n".join(f"- {reason}" for reason in result.skipped_images[:20]))
    return "\n\n".join(parts)


def format_model(result: ModelResult, device_label: str, times: int, settings_note: str) -> str:
    """Everything printed for one model, as markdown."""
    first = format_published(result, device_label, times) if result.rows else plain_header(result, device_label)
    return first + "\n\n" + format_after_published(result, settings_note)


def format_environment(record: Dict[str, Any]) -> str:
    """The environment record as a fenced JSON block for the markdown file."""
    return "Environment\n\n```json\n" + json.dumps(record, indent=2, default=str) + "\n```"


# ----- files ---------------------------------------------------------------------------------
def _finite_or_none(value: Any) -> Any:
    """JSON has no NaN/inf: write them as null rather than invalid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite_or_none(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_none(item) for item in value]
    return value


def write_json(path: Path, record: Dict[str, Any]) -> None:
    """The whole run: environment, settings and every model's results."""
    Path(path).write_text(json.dumps(_finite_or_none(record), indent=2, default=str) + "\n")


def csv_rows(record: Dict[str, Any]) -> List[Dict[str, Any]]:
    """One flat row per (model, shape), with the model-level context repeated on each row."""
    environment = record["environment"]
    rows = []
    for model in record["models"]:
        context = {
            "model": model["spec"],
            "weights": model["weights"],
            "precision": model["precision"],
            "text_input": model["text_input"],
            "device": environment["device"],
            "device_name": environment["device_name"],
            "git_revision": environment["git_revision"],
        }
        for row in model["rows"]:
            rows.append({**context, **{key: value for key, value in row.items() if key != "model"}})
    return rows


def write_csv(path: Path, record: Dict[str, Any]) -> None:
    """Per-shape rows of every model as CSV (zero-shot and latency live in the JSON)."""
    rows = csv_rows(record)
    with open(path, "w", newline="") as handle:
        if not rows:
            return
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def write_markdown(path: Path, text: str) -> None:
    """What the run printed, plus the environment block."""
    Path(path).write_text(text.rstrip() + "\n")
