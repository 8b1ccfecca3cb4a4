"""The bench times text from strings: OpenCLIP's tokenizer on the stock side, clip_flash's on the patched
side unless ``--pipeline stock`` alone is given."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_clip.py"
MODULE = SCRIPT.parents[1] / "benchmarks" / "bench_clip.py"  # the script runs this module


def _bench_clip():
    spec = importlib.util.spec_from_file_location("bench_clip_for_text_tests", MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("argv, tokenizer", [
    ([], "clip_flash"),
    (["--pipeline", "stock"], "openclip"),
    (["--pipeline", "exact"], "clip_flash"),
    (["--pipeline", "stock", "exact"], "clip_flash"),
])
def test_pipeline_flag_picks_the_patched_sides_tokenizer(argv, tokenizer):
    bench_clip = _bench_clip()
    args = bench_clip.build_parser().parse_args(["--model", "ViT-B-32", "--zero-shot-classifier", *argv])
    settings = bench_clip.make_settings(args, torch.device("cpu"))
    assert settings.text_tokenizer == tokenizer
    assert settings.pipelines == ()  # no --images: no image pipelines to run


def test_pipeline_without_images_or_text_strings_is_refused(capsys):
    bench_clip = _bench_clip()
    assert bench_clip.main(["--model", "ViT-B-32", "--device", "cpu", "--pipeline", "stock"]) != 0
    assert "--pipeline" in capsys.readouterr().err


@pytest.mark.slow
def test_zero_shot_from_strings_records_both_tokenizers(tmp_path):
    bench_clip = _bench_clip()
    out = tmp_path / "zs.json"
    code = bench_clip.main(["--model", "ViT-B-32", "--device", "cpu", "--no-tables", "--zero-shot-classifier",
                            "--zero-shot-classes", "3", "--zero-shot-templates", "2", "--zero-shot-batch", "4",
                            "--json", str(out)])
    assert code == 0
    zero_shot = json.loads(out.read_text())["models"][0]["zero_shot"]
    assert "FastCLIPTokenizer" in zero_shot["patched_tokenizer"]
    assert zero_shot["stock_tokenizer"].startswith("OpenCLIP's own SimpleTokenizer")
    assert zero_shot["stock_tokenize_median_s"] > 0 and zero_shot["patched_tokenize_median_s"] > 0
    assert zero_shot["patched_cos_fp32"] == pytest.approx(1, abs=1e-5)


@pytest.mark.slow  # the benchmark's wiring; CI runs the job and server paths that take captions
@pytest.mark.parametrize("text_input", ["captions", "caption-ids"])
def test_caption_rows_run_from_strings_or_ids(tmp_path, text_input):
    bench_clip = _bench_clip()
    out = tmp_path / "captions.json"
    code = bench_clip.main(["--model", "ViT-B-32", "--device", "cpu", "--towers", "text", "--text-input", text_input,
                            "--batch-sizes", "3", "--times", "1", "--warmup", "1", "--json", str(out)])
    assert code == 0
    (row,) = json.loads(out.read_text())["models"][0]["rows"]
    assert row["shape"] == "(3, 77)" and row["patched_cos_fp32"] == pytest.approx(1, abs=1e-5)
