"""Stock vs patched as a picture: per model and tower, time per call and speed-up at each batch size.

Drawn from bench_clip's results records (what ``--json`` writes), so a figure can be made again from
committed measurements without measuring anything. matplotlib is optional: without it
:class:`PlotUnavailableError` says how to install it.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence

STOCK_COLOUR = "#8c8c8c"
PATCHED_COLOUR = "#d1495b"


class PlotUnavailableError(RuntimeError):
    """matplotlib is not installed, or the records hold nothing to draw; the message says what to do."""


@dataclass
class Series:
    """One model's tower from one results record: per batch, median ms stock and patched."""

    model: str
    tower: str
    label: str
    batches: List[int] = field(default_factory=list)
    stock_ms: List[float] = field(default_factory=list)
    patched_ms: List[float] = field(default_factory=list)

    @property
    def speedups(self) -> List[float]:
        """Median stock time over median patched time, per batch."""
        return [stock / patched for stock, patched in zip(self.stock_ms, self.patched_ms)]


def load_records(paths: Iterable[os.PathLike]) -> List[Dict[str, Any]]:
    """bench_clip results records from ``--json`` files, each remembering the file it came from."""
    records = []
    for path in paths:
        try:
            record = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise PlotUnavailableError(f"cannot read results file {path}: {error}") from None
        if not isinstance(record, dict) or "models" not in record:
            raise PlotUnavailableError(f"{path} is not a bench_clip results file (no 'models')")
        record.setdefault("source_file", str(path))
        records.append(record)
    return records


def _describe(record: Dict[str, Any], model: Dict[str, Any], tower: str) -> str:
    settings = record.get("settings", {})
    extras = [model.get("precision") or settings.get("resolved", {}).get("dtype", "")]
    if tower == "text":
        extras.append("captions" if model.get("text_input") == "captions" else "random ids")
    if settings.get("cuda_graphs"):
        extras.append("CUDA graphs")
    revision = record.get("environment", {}).get("git_revision")
    if revision:
        extras.append(f"git {str(revision)[:7]}")
    return f"{model.get('spec', model.get('name', '?'))} {tower} ({', '.join(e for e in extras if e)})"


def series_from_records(records: Sequence[Dict[str, Any]]) -> List[Series]:
    """Every (record, model, tower) with timed rows, in file order; rows sorted by batch."""
    found: List[Series] = []
    for record in records:
        for model in record.get("models", []):
            for tower in ("text", "image"):
                rows = sorted((row for row in model.get("rows", []) if row.get("tower") == tower),
                              key=lambda row: row["batch"])
                if not rows:
                    continue
                series = Series(model.get("name", "?"), tower, _describe(record, model, tower))
                for row in rows:
                    series.batches.append(int(row["batch"]))
                    series.stock_ms.append(float(row["stock_median_ms"]))
                    series.patched_ms.append(float(row["patched_median_ms"]))
                found.append(series)
    return found


def require_matplotlib() -> None:
    """Raise :class:`PlotUnavailableError` (saying how to install it) when matplotlib is missing."""
    _pyplot()


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailableError(
            "--plot needs matplotlib, which is not installed: python -m pip install matplotlib "
            "(or pip install -e '.[plot]'); the results files were written without it"
        ) from None
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as pyplot

    return pyplot


def _device_title(records: Sequence[Dict[str, Any]]) -> str:
    names = sorted({str(r.get("environment", {}).get("device_name") or "?") for r in records})
    return ", ".join(names)


def plot_series(series: Sequence[Series], path: os.PathLike, title: Optional[str] = None,
                footnote: Optional[str] = None) -> Path:
    """Draw one column per series (time per call above, speed-up below) into ``path`` (PNG, SVG, PDF...)."""
    if not series:
        raise PlotUnavailableError("nothing to plot: the results hold no timed rows")
    pyplot = _pyplot()
    from matplotlib import ticker

    columns = len(series)
    figure, axes = pyplot.subplots(2, columns, figsize=(4.2 * columns, 6.4), squeeze=False,
                                   gridspec_kw={"height_ratios": [3, 2]})
    for column, one in enumerate(series):
        time_axis, gain_axis = axes[0][column], axes[1][column]
        positions = list(range(len(one.batches)))
        time_axis.plot(positions, one.stock_ms, "o-", color=STOCK_COLOUR, label="stock OpenCLIP")
        time_axis.plot(positions, one.patched_ms, "o-", color=PATCHED_COLOUR, label="clip_flash.patch")
        time_axis.set_yscale("log")
        time_axis.yaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
        time_axis.yaxis.set_minor_formatter(ticker.FuncFormatter(
            lambda value, _: f"{value:g}" if str(f"{value:g}")[0] in "235" else ""))
        time_axis.set_title(one.label, fontsize=9)
        time_axis.set_xticks(positions, [str(batch) for batch in one.batches])
        time_axis.grid(True, which="both", alpha=0.3)
        if column == 0:
            time_axis.set_ylabel("ms per call (median)")
            time_axis.legend(fontsize=8, loc="upper left")
        bars = gain_axis.bar(positions, one.speedups, color=PATCHED_COLOUR, width=0.6)
        gain_axis.axhline(1.0, color=STOCK_COLOUR, linewidth=1)
        for bar, gain in zip(bars, one.speedups):
            gain_axis.annotate(f"{gain:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                               ha="center", va="bottom", fontsize=7)
        gain_axis.set_xticks(positions, [str(batch) for batch in one.batches])
        gain_axis.set_xlabel("batch size")
        gain_axis.set_ylim(0, max(max(one.speedups) * 1.18, 1.2))
        if column == 0:
            gain_axis.set_ylabel("speed-up (x)")
    if title:
        figure.suptitle(title, fontsize=11)
    if footnote:
        figure.text(0.01, 0.005, footnote, fontsize=7, color="#555555", va="bottom")
    figure.tight_layout(rect=(0, 0.04 if footnote else 0, 1, 0.95 if title else 1))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    pyplot.close(figure)
    return path


def plot_records(records: Sequence[Dict[str, Any]], path: os.PathLike) -> Path:
    """The stock-vs-patched figure of bench_clip results records, titled with the device they ran on."""
    sources = [str(r["source_file"]) for r in records if r.get("source_file")]
    footnote = ("from " + ", ".join(sources)) if sources else None
    title = f"Stock OpenCLIP vs clip_flash.patch on {_device_title(records)}"
    return plot_series(series_from_records(records), path, title=title, footnote=footnote)
