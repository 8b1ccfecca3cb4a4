"""bench_clip's --plot / --plot-from: figures drawn from results files, and a clear message without matplotlib."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from benchmarks.harness import plots

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "scripts" / "bench_clip.py"
MODULE = SCRIPT.parents[1] / "benchmarks" / "bench_clip.py"  # the script runs this module
TEXT_RESULTS = REPO_ROOT / "benchmarks" / "results" / "h100" / "ViT-L-14-text.json"
IMAGE_RESULTS = REPO_ROOT / "benchmarks" / "results" / "h100" / "ViT-L-14-image.json"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def _bench_clip():
    spec = importlib.util.spec_from_file_location("bench_clip_for_plots", MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_series_are_the_committed_medians():
    records = plots.load_records([TEXT_RESULTS, IMAGE_RESULTS])
    text, image = plots.series_from_records(records)
    rows = {row["batch"]: row for row in json.loads(TEXT_RESULTS.read_text())["models"][0]["rows"]}
    assert text.tower == "text" and text.batches == sorted(rows)
    assert text.stock_ms == [rows[b]["stock_median_ms"] for b in text.batches]
    assert text.patched_ms == [rows[b]["patched_median_ms"] for b in text.batches]
    assert text.speedups[-1] == pytest.approx(rows[1024]["stock_median_ms"] / rows[1024]["patched_median_ms"])
    revision = json.loads(TEXT_RESULTS.read_text())["environment"]["git_revision"][:7]
    assert "captions" in text.label and revision in text.label
    image_rows = json.loads(IMAGE_RESULTS.read_text())["models"][0]["rows"]
    assert image.tower == "image" and image.batches == sorted(row["batch"] for row in image_rows)


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib not installed (optional)")
def test_plot_from_committed_results(tmp_path, capsys):
    out = tmp_path / "figure.png"
    code = _bench_clip().main(["--plot-from", str(TEXT_RESULTS), str(IMAGE_RESULTS), "--plot", str(out)])
    assert code == 0 and f"wrote {out}" in capsys.readouterr().err
    data = out.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 10_000


def test_without_matplotlib_one_clear_message(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    with pytest.raises(plots.PlotUnavailableError, match="pip install matplotlib"):
        plots.require_matplotlib()
    bench_clip = _bench_clip()
    out = tmp_path / "figure.png"
    assert bench_clip.main(["--plot-from", str(TEXT_RESULTS), "--plot", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "pip install matplotlib" in err and not out.exists()
    # Asked for along with a measurement: refused before any model is built, not after minutes of timing.
    assert bench_clip.main(["--model", "ViT-B-33", "--device", "cpu", "--plot", str(out)]) == 2
    err = capsys.readouterr().err
    assert "pip install matplotlib" in err and "unknown OpenCLIP model" not in err


def test_plot_from_needs_a_target_and_real_results(tmp_path, capsys):
    bench_clip = _bench_clip()
    assert bench_clip.main(["--plot-from", str(TEXT_RESULTS)]) == 2
    assert "--plot-from needs --plot" in capsys.readouterr().err
    not_results = tmp_path / "x.json"
    not_results.write_text("[1, 2]")
    assert bench_clip.main(["--plot-from", str(not_results), "--plot", str(tmp_path / "x.png")]) == 2
    assert "not a bench_clip results file" in capsys.readouterr().err
