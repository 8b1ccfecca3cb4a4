#!/usr/bin/env python3
"""Compare two benchmark runs written by ``scripts/bench_clip.py --json``: per shape, the new run's time over the old.

    python scripts/compare_results.py results/h100/ViT-L-14-image.json $OUT/ViT-L-14-image.json [--threshold 0.05]

A shape is (model, tower, batch, dtype). For each shape in both files it prints the stock and patched medians of
both runs and their ratios (new / old). Stock's ratio says how much the machine or the session moved; a patched
ratio above ``1 + threshold`` is a regression and is flagged. Exit status: 0 when no shape regressed, 1 when one
did, 2 when a file cannot be read. Shapes in only one file are listed, never flagged.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

SCHEMA = "clip_flash.bench_clip/1"

ShapeKey = Tuple[str, str, int, str]  # model, tower, batch, dtype


class ResultsFileError(ValueError):
    """A file that is not a bench_clip JSON result (the message says which and why)."""


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


def _describe(path: Path, environment: Dict[str, object]) -> str:
    return (f"{path}: git {environment.get('git_revision', '?')}, {environment.get('device_name', '?')}, "
            f"{environment.get('command', '?')}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", type=Path, help="the earlier run's JSON (e.g. the committed results/h100/ file)")
    parser.add_argument("new", type=Path, help="the later run's JSON")
    parser.add_argument("--threshold", type=float, default=0.05,
                        help="flag a shape whose patched median grew by more than this fraction (default 0.05)")
    args = parser.parse_args(argv)
    if args.threshold < 0:
        parser.error("--threshold must be >= 0")
    try:
        old, old_env = read_rows(args.old)
        new, new_env = read_rows(args.new)
    except ResultsFileError as error:
        print(f"compare_results: {error}", file=sys.stderr)
        return 2
    print(f"old: {_describe(args.old, old_env)}")
    print(f"new: {_describe(args.new, new_env)}")
    lines, regressed = compare(old, new, args.threshold)
    print("\n".join(lines))
    if not set(old) & set(new):
        print("no shape is in both runs: nothing to compare", file=sys.stderr)
    if regressed:
        print(f"{len(regressed)} shape(s) regressed past {args.threshold:.0%}: "
              + ", ".join(f"{m} {t} b{b} {d}" for m, t, b, d in regressed))
        return 1
    print(f"no regression past {args.threshold:.0%} of the patched time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
