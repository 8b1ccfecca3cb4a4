#!/usr/bin/env python3
"""Compare two benchmark runs: per shape, the new run's time over the old; per pipeline or case, its rate over the old.

    python benchmarks/compare_results.py benchmarks/results/h100/ViT-L-14-image.json NEW/ViT-L-14-image.json \
        [--threshold 0.05]

Tower shapes (``scripts/bench_clip.py --json``): a shape is (model, tower, batch, dtype). For each shape in both
files it prints the stock and patched medians of both runs and their ratios (new / old). Stock's ratio says how
much the machine or the session moved; a patched ratio above ``1 + threshold`` is a regression and is flagged.
Exit status: 0 when no shape regressed, 1 when one did, 2 when a file cannot be read. Shapes in only one file are
listed, never flagged.

Rates (``benchmarks/harness/compare.py``): ``bench_clip.py --pipeline`` runs per (model, dtype, pipeline),
``bench_embed.py`` job benches per (model, inputs, case), ``image_decode_throughput.py`` runs per (executor,
workers, JPEG route) and ``serve/bench_serve.py`` curves per (server, workload, offered rate), their p50 / p99
beside: old and new rates and their ratio (new / old: above 1 is faster); ``image_latency.py`` runs per side
(p50 and p99 ms) and step (p50 alone), the ratio old / new (above 1 is faster); ``bench_text_batches.py`` runs
per (captions a batch, graph sizes per doubling, grouping) in captions/s, and ``bench_packed_attention.py`` runs
per (captions, max_seqlen) in microseconds a call. A row slower by more than
the threshold is marked, not judged: these rates move with the host's CPUs, and the exit status stays 0. Two
files of different kinds, or with no row in common, have nothing to compare: it says so and exits 0.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness.compare import (  # noqa: E402
    KINDS, SCHEMA, SHAPES, ResultsFile, ResultsFileError, compare_rows, open_results)

ShapeKey = Tuple[str, str, int, str]  # model, tower, batch, dtype


def read_rows(path: Path) -> Tuple[Dict[ShapeKey, Dict[str, float]], Dict[str, object]]:
    """Per shape its stock and patched median milliseconds, and the run's environment record."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ResultsFileError(f"{path}: cannot read a JSON results file ({error})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ResultsFileError(f"{path}: not a bench_clip result (schema {SCHEMA!r} expected)")
    rows: Dict[ShapeKey, Dict[str, float]] = {}
    for model in data.get("models") or []:
        dtype = str(model.get("precision"))
        for row in model.get("rows") or []:
            try:
                key = (str(row["model"]), str(row["tower"]), int(row["batch"]), dtype)
                rows[key] = {"stock": float(row["stock_median_ms"]), "patched": float(row["patched_median_ms"])}
            except (KeyError, TypeError, ValueError) as error:
                raise ResultsFileError(f"{path}: a row lacks {error} ({row!r:.120})") from None
    environment = data.get("environment") if isinstance(data.get("environment"), dict) else {}
    return rows, environment


def compare(old: Dict[ShapeKey, Dict[str, float]], new: Dict[ShapeKey, Dict[str, float]],
            threshold: float) -> Tuple[List[str], List[ShapeKey]]:
    """(table lines, shapes whose patched time regressed past ``threshold``)."""
    lines = ["| model | tower | batch | dtype | stock old -> new ms | ratio | patched old -> new ms | ratio | |",
             "|---|---|---|---|---|---|---|---|---|"]
    regressed: List[ShapeKey] = []
    for key in sorted(set(old) & set(new)):
        before, after = old[key], new[key]
        stock_ratio = after["stock"] / before["stock"]
        patched_ratio = after["patched"] / before["patched"]
        flag = ""
        if patched_ratio > 1 + threshold:
            regressed.append(key)
            flag = f"REGRESSION (> {1 + threshold:.2f})"
        model, tower, batch, dtype = key
        lines.append(f"| {model} | {tower} | {batch} | {dtype} | {before['stock']:.3f} -> {after['stock']:.3f} | "
                     f"{stock_ratio:.3f} | {before['patched']:.3f} -> {after['patched']:.3f} | {patched_ratio:.3f} | "
                     f"{flag} |")
    for name, only in (("old", set(old) - set(new)), ("new", set(new) - set(old))):
        for model, tower, batch, dtype in sorted(only):
            lines.append(f"only in the {name} run: {model} {tower} batch {batch} {dtype}")
    return lines, regressed


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Print what both runs are and their comparison; the exit status as the module's docstring says."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", type=Path,
                        help="the earlier run's JSON (e.g. the committed benchmarks/results/h100/ file)")
    parser.add_argument("new", type=Path, help="the later run's JSON")
    parser.add_argument("--threshold", type=float, default=0.05,
                        help="flag a shape whose patched median grew by more than this fraction, mark a rate "
                             "that fell by as much (default 0.05)")
    args = parser.parse_args(argv)
    if args.threshold < 0:
        parser.error("--threshold must be >= 0")
    try:
        old_file, new_file = open_results(args.old), open_results(args.new)
    except ResultsFileError as error:
        print(f"compare_results: {error}", file=sys.stderr)
        return 2
    print(f"old: {old_file.describe()}")
    print(f"new: {new_file.describe()}")
    common = [kind for kind in old_file.kinds if kind in new_file.kinds]
    if not common:
        print(f"different kinds of result: the old run is {old_file.title}, the new one {new_file.title}: "
              "nothing to compare", file=sys.stderr)
        return 0
    status = 0
    for kind in common:
        if kind == SHAPES:
            status = _compare_shapes(args.old, args.new, args.threshold)
            if status == 2:
                return status
        else:
            _compare_rates(old_file, new_file, kind, args.threshold)
    return status


def _compare_shapes(old_path: Path, new_path: Path, threshold: float) -> int:
    try:
        old, _ = read_rows(old_path)
        new, _ = read_rows(new_path)
    except ResultsFileError as error:
        print(f"compare_results: {error}", file=sys.stderr)
        return 2
    lines, regressed = compare(old, new, threshold)
    print("\n".join(lines))
    if not set(old) & set(new):
        print("no shape is in both runs: nothing to compare", file=sys.stderr)
    if regressed:
        print(f"{len(regressed)} shape(s) regressed past {threshold:.0%}: "
              + ", ".join(f"{m} {t} b{b} {d}" for m, t, b, d in regressed))
        return 1
    print(f"no regression past {threshold:.0%} of the patched time")
    return 0


def _compare_rates(old_file: ResultsFile, new_file: ResultsFile, kind: str, threshold: float) -> None:
    what = f"times ({KINDS[kind].unit}) old -> new, ratio old / new" if KINDS[kind].times \
        else "rates old -> new, ratio new / old"
    print(f"\n{KINDS[kind].title}: {what} (above 1 is faster)")
    lines, in_both = compare_rows(old_file.rows(kind), new_file.rows(kind), threshold)
    print("\n".join(lines))
    if not in_both:
        print(f"no {KINDS[kind].title} row is in both runs: nothing to compare", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
