"""scripts/compare_results.py: per-shape ratios of two bench_clip JSON runs, regressions flagged (CPU only)."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "scripts" / "compare_results.py"
_spec = importlib.util.spec_from_file_location("compare_results", SCRIPT)
compare_results = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compare_results)


def write_run(path: Path, rows, *, precision="fp16", revision="abc1234") -> Path:
    """A bench_clip JSON file with the fields compare_results reads (as scripts/bench_clip.py writes them)."""
    data = {
        "schema": "clip_flash.bench_clip/1",
        "environment": {"git_revision": revision, "device_name": "Fake GPU", "command": "bench_clip.py ..."},
        "models": [{"name": "ViT-L-14", "precision": precision, "rows": [
            {"model": "ViT-L-14", "tower": tower, "batch": batch, "stock_median_ms": stock,
             "patched_median_ms": patched}
            for tower, batch, stock, patched in rows]}],
        "complete": True,
    }
    path.write_text(json.dumps(data))
    return path


def test_flags_a_patched_regression_past_the_threshold(tmp_path, capsys):
    old = write_run(tmp_path / "old.json", [("image", 1, 6.0, 4.0), ("image", 256, 120.0, 96.0)])
    new = write_run(tmp_path / "new.json", [("image", 1, 6.0, 4.4), ("image", 256, 118.0, 96.5)])
    assert compare_results.main([str(old), str(new)]) == 1
    out = capsys.readouterr().out
    line_b1 = next(line for line in out.splitlines() if "| image | 1 |" in line)
    assert "4.000 -> 4.400 | 1.100" in line_b1 and "REGRESSION" in line_b1
    line_b256 = next(line for line in out.splitlines() if "| image | 256 |" in line)
    assert "120.000 -> 118.000 | 0.983" in line_b256 and "REGRESSION" not in line_b256
    assert "1 shape(s) regressed past 5%: ViT-L-14 image b1 fp16" in out
    # A looser threshold lets the same runs pass.
    assert compare_results.main([str(old), str(new), "--threshold", "0.15"]) == 0


def test_no_regression_exits_zero_and_lists_unmatched_shapes(tmp_path, capsys):
    old = write_run(tmp_path / "old.json", [("image", 1, 6.0, 4.0), ("image", 64, 30.0, 24.0)])
    new = write_run(tmp_path / "new.json", [("image", 1, 6.2, 3.9), ("image", 16, 7.7, 6.5)])
    assert compare_results.main([str(old), str(new)]) == 0
    out = capsys.readouterr().out
    assert "only in the old run: ViT-L-14 image batch 64 fp16" in out
    assert "only in the new run: ViT-L-14 image batch 16 fp16" in out


def test_shapes_differ_by_dtype(tmp_path):
    old = write_run(tmp_path / "old.json", [("image", 1, 6.0, 4.0)], precision="fp16")
    new = write_run(tmp_path / "new.json", [("image", 1, 6.0, 9.0)], precision="bf16")
    assert compare_results.compare(compare_results.read_rows(old)[0], compare_results.read_rows(new)[0],
                                   0.05)[1] == []  # different dtypes: not the same shape


def test_bad_files_exit_two(tmp_path, capsys):
    good = write_run(tmp_path / "good.json", [("image", 1, 6.0, 4.0)])
    (tmp_path / "other.json").write_text(json.dumps({"schema": "something else"}))
    (tmp_path / "broken.json").write_text("{")
    assert compare_results.main([str(good), str(tmp_path / "other.json")]) == 2
    assert compare_results.main([str(tmp_path / "broken.json"), str(good)]) == 2
    assert compare_results.main([str(good), str(tmp_path / "missing.json")]) == 2
    assert "not a bench_clip result" in capsys.readouterr().err


def test_runs_as_a_script_on_the_committed_run():
    """The committed ViT-L-14 image run against itself: every ratio 1, exit 0."""
    committed = REPO_ROOT / "results" / "h100" / "ViT-L-14-image.json"
    if not committed.is_file():
        pytest.skip("no committed ViT-L-14 image run")
    done = subprocess.run([sys.executable, str(SCRIPT), str(committed), str(committed)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "| ViT-L-14 | image | 256 | fp16 |" in done.stdout and "REGRESSION" not in done.stdout
