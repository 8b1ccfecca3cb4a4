"""CPU tests of scripts/bench_clip.py: argument parsing, model specs, an end-to-end run, error paths."""
from __future__ import annotations

import csv
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "scripts" / "bench_clip.py"
MODULE = SCRIPT.parents[1] / "benchmarks" / "bench_clip.py"  # the script runs this module
PUBLISHED_HEADER = "| shape | baseline(s) | flash_attn(s) | speed up (x) | mean diff |"


def _load_script():
    spec = importlib.util.spec_from_file_location("bench_clip", MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench_clip = _load_script()
from benchmarks.harness import results, timing  # noqa: E402  (the script put the repo on sys.path)
from clip_flash.models.model_spec import RANDOM_INIT_NOTE, parse_model_spec  # noqa: E402


def _squash(line: str) -> str:
    """A markdown row with the padding removed: ``| a | b |``."""
    return "| " + " | ".join(cell.strip() for cell in line.strip().strip("|").split("|")) + " |"


def _cells(line: str) -> list:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


# ----- parsing -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, name, weights, kind",
    [
        ("ViT-B-32", "ViT-B-32", None, "random"),
        ("ViT-L-14::laion2b-s32b-b82k", "ViT-L-14", "laion2b_s32b_b82k", "tag"),
        ("ViT-L-14::laion2b_s32b_b82k", "ViT-L-14", "laion2b_s32b_b82k", "tag"),
        ("ViT-L-14::LAION2B-S32B-B82K", "ViT-L-14", "laion2b_s32b_b82k", "tag"),
        ("ViT-B-16::laion400m_e31", "ViT-B-16", "laion400m_e31", "tag"),
        ("ViT-B-32::/ckpt/open_clip_model.safetensors", "ViT-B-32", "/ckpt/open_clip_model.safetensors", "checkpoint"),
        ("ViT-B-32::model.bin", "ViT-B-32", "model.bin", "checkpoint"),
        (" ViT-H-14 :: laion2b-s32b-b79k ", "ViT-H-14", "laion2b_s32b_b79k", "tag"),
    ],
)
def test_parse_model_spec(text, name, weights, kind):
    spec = parse_model_spec(text)
    assert (spec.name, spec.weights, spec.kind) == (name, weights, kind)
    assert (spec.weights_note == RANDOM_INIT_NOTE) == (kind == "random")


@pytest.mark.parametrize("text", ["", "::laion2b-s32b-b82k", "ViT-B-32::"])
def test_parse_model_spec_rejects_malformed(text):
    with pytest.raises(ValueError):
        parse_model_spec(text)


def test_parser_defaults_and_flags():
    parser = bench_clip.build_parser()
    args = parser.parse_args(["--model", "ViT-L-14::laion2b-s32b-b82k", "--times", "100"])
    assert args.model.name == "ViT-L-14" and args.model.weights == "laion2b_s32b_b82k"
    assert args.times == 100 and args.batch_sizes == [1, 2, 4, 8, 16]
    assert args.text_input == "random" and args.backend == "auto" and args.dtype is None

    args = parser.parse_args([
        "--models", "--batch-sizes", "1", "256", "--dtype", "bf16", "--text-input", "captions",
        "--patch-option", "cuda_graphs=true", "--patch-option", "note=x", "--latency", "50",
        "--zero-shot-classifier", "--backend", "sdpa", "--device", "cpu",
    ])
    assert args.models == [] and args.batch_sizes == [1, 256] and args.dtype == "bf16"
    assert dict(args.patch_option) == {"cuda_graphs": True, "note": "x"}
    assert args.latency == 50 and args.zero_shot_classifier and args.backend == "sdpa"
    args = parser.parse_args(["--models", "ViT-B-32", "ViT-B-16::laion400m_e31"])
    assert [spec.text for spec in args.models] == ["ViT-B-32", "ViT-B-16::laion400m_e31"]


@pytest.mark.parametrize(
    "argv",
    [
        [],  # a model is required
        ["--model", "ViT-B-32", "--models"],  # one or the other
        ["--model", "ViT-B-32", "--times", "0"],
        ["--model", "ViT-B-32", "--batch-sizes", "-1"],
        ["--model", "ViT-B-32", "--dtype", "fp8"],
        ["--model", "ViT-B-32", "--patch-option", "novalue"],
        ["--model", "ViT-B-32", "--patch-option", "backend=sdpa"],
        ["--model", "ViT-B-32::"],
        ["--model", "ViT-B-32", "--zero-shot-templates", "81"],
        ["--model", "ViT-B-32", "--baseline", "compile:fastest"],
    ],
)
def test_parser_rejects(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench_clip.build_parser().parse_args(argv)
    assert exit_info.value.code == 2


def test_compiled_baseline_is_said_in_the_settings_line():
    parser = bench_clip.build_parser()
    stock = parser.parse_args(["--model", "ViT-B-32"])
    compiled = parser.parse_args(["--model", "ViT-B-32", "--baseline", "compile:max-autotune"])
    for args in (stock, compiled):
        settings = bench_clip.make_settings(args, torch.device("cpu"))
        assert settings.baseline == args.baseline
    note = bench_clip.settings_note(compiled, bench_clip.make_settings(compiled, torch.device("cpu")))
    assert "torch.compile(stock, mode='max-autotune')" in note
    assert "torch.compile" not in bench_clip.settings_note(stock, bench_clip.make_settings(stock, torch.device("cpu")))


def test_device_defaults():
    cpu = bench_clip.make_settings(bench_clip.build_parser().parse_args(["--model", "ViT-B-32"]), torch.device("cpu"))
    assert (cpu.times, cpu.warmup, cpu.precision) == (3, 1, "fp32")
    gpu = bench_clip.make_settings(bench_clip.build_parser().parse_args(["--model", "ViT-B-32"]), torch.device("cuda"))
    assert (gpu.times, gpu.warmup, gpu.precision) == (100, 5, "fp16")


# ----- timing and formatting helpers ---------------------------------------------------------
def test_time_alternating_counts_and_order():
    calls = []
    measured = timing.time_alternating(lambda: calls.append("s"), lambda: calls.append("p"), 25, torch.device("cpu"))
    assert len(measured.stock_seconds) == len(measured.patched_seconds) == 25
    assert calls.count("s") == calls.count("p") == 25
    # Blocks of 2, ABBA: stock first, then patched first in the next round.
    assert "".join(calls[:8]) == "ssppppss"
    assert measured.stock_total == pytest.approx(sum(measured.stock_seconds))


def test_percentile():
    values = [float(v) for v in range(1, 101)]
    assert timing.percentile(values, 50) == pytest.approx(50.5)
    assert timing.percentile(values, 99) == pytest.approx(99.01)
    assert timing.percentile([3.0], 99) == 3.0


# ----- end to end ----------------------------------------------------------------------------
@pytest.mark.slow
def test_end_to_end_cpu_random_init(tmp_path):
    """The script on ViT-B-32 random init: published table shape, extra tables and all three files."""
    out_json, out_csv, out_md = tmp_path / "r.json", tmp_path / "r.csv", tmp_path / "r.md"
    command = [
        sys.executable, str(SCRIPT), "--model", "ViT-B-32", "--device", "cpu", "--times", "2",
        "--batch-sizes", "1", "2", "--latency", "2", "--zero-shot-classifier", "--zero-shot-classes", "2",
        "--zero-shot-templates", "2", "--zero-shot-batch", "3", "--json", str(out_json), "--csv", str(out_csv), "--markdown", str(out_md),  # noqa: E501
    ]
    out_png = tmp_path / "r.png"
    draws = importlib.util.find_spec("matplotlib") is not None  # --plot is optional; drawn when it can be
    command += ["--plot", str(out_png)] if draws else []
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()

    # The published block, line for line.
    assert lines[0].startswith("Test model (on `CPU: ") and lines[0].endswith(f"`ViT-B-32` {RANDOM_INIT_NOTE}")
    assert lines[1] == "" and lines[2] == "Times = **2**, using causal mask" and lines[3] == ""
    assert _squash(lines[4]) == PUBLISHED_HEADER
    assert set(lines[5].replace("|", "")) == {"-"}
    expected_shapes = ["(1, 77)", "(2, 77)", "(1, 3, 224, 224)", "(2, 3, 224, 224)"]
    rows = [_cells(line) for line in lines[6:10]]
    assert [row[0] for row in rows] == expected_shapes
    for _, baseline, patched, speedup, diff in rows:
        baseline, patched, speedup, diff = map(float, (baseline, patched, speedup, diff))
        assert baseline > 0 and patched > 0 and math.isfinite(diff) and diff >= 0
        assert speedup == pytest.approx(baseline / patched, rel=2e-3, abs=2e-4)
    assert "device `cpu`" in done.stdout and "stock cos vs fp32" in done.stdout
    assert "Zero-shot classifier: 2 classes x 2 templates" in done.stdout
    assert "Latency: closed loop" in done.stdout
    assert "Traceback" not in done.stderr
    if draws:
        assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote {out_png}" in done.stderr

    record = json.loads(out_json.read_text())
    environment = record["environment"]
    assert record["complete"] is True
    assert environment["command"].split()[-1] == str(out_png if draws else out_md)
    assert "--model ViT-B-32" in environment["command"]
    assert environment["git_revision"] and environment["device"] == "cpu"
    for key in ("torch", "cuda", "cudnn", "flash_attn", "clip_flash"):
        assert key in environment["clip_flash_environment"]
    (model,) = record["models"]
    assert model["spec"] == "ViT-B-32" and model["weights"] == "random" and model["precision"] == "fp32"
    assert [row["shape"] for row in model["rows"]] == expected_shapes
    for row in model["rows"]:
        for key in ("stock_total_s", "patched_total_s", "speedup", "mean_abs_diff", "stock_items_per_s",
                    "patched_items_per_s", "stock_cos_fp32", "patched_cos_fp32"):
            assert math.isfinite(row[key]), key
        # fp32 on CPU: the reference is the stock model itself; patched must agree to rounding.
        assert row["stock_cos_fp32"] == pytest.approx(1.0, abs=1e-6)
        assert row["patched_cos_fp32"] == pytest.approx(1.0, abs=1e-5)
        assert row["backend"]
    assert model["zero_shot"]["prompts"] == 4 and model["zero_shot"]["patched_cos_fp32"] == pytest.approx(1, abs=1e-5)
    assert set(model["latency"]) == {"text", "image"}
    assert all(model["latency"][tower]["patched_p99_ms"] > 0 for tower in ("text", "image"))

    with open(out_csv, newline="") as handle:
        table = list(csv.DictReader(handle))
    assert [row["shape"] for row in table] == expected_shapes
    assert {"model", "device_name", "git_revision", "stock_total_s", "backend"} <= set(table[0])
    assert all(math.isfinite(float(row["speedup"])) for row in table)

    markdown = out_md.read_text()
    assert "\n".join(lines[:10]) in markdown
    assert "Environment" in markdown and '"git_revision"' in markdown


# ----- unreachable weights -------------------------------------------------------------------
def test_unreachable_tag_is_one_clear_message(monkeypatch, capsys):
    """The hub answers the probe but the download fails: OpenCLIP's error becomes one message."""
    import open_clip.factory

    from clip_flash.models import weights_fetch

    def no_network(*args, **kwargs):
        raise OSError("[Errno -2] Name or service not known")

    monkeypatch.setattr(open_clip.factory, "download_pretrained", no_network)
    monkeypatch.setattr(weights_fetch, "probe_host", lambda host, *args, **kwargs: None)
    monkeypatch.setattr(weights_fetch, "hub_offline", lambda: False)
    monkeypatch.setattr(weights_fetch, "_cached_hub_file", lambda repo_id, filename: None)
    code = bench_clip.main(["--model", "ViT-B-32::laion2b-s34b-b79k", "--device", "cpu", "--times", "1"])
    err = capsys.readouterr().err
    assert code != 0
    assert err.count("error:") == 1 and "Traceback" not in err
    assert "'laion2b_s34b_b79k'" in err and "Name or service not known" in err
    assert "--model ViT-B-32\n" in err and "--model ViT-B-32::/path/to/" in err


@pytest.mark.slow
def test_unreachable_tag_real_process_offline(tmp_path):
    """No mocks: the hub in offline mode fails as it does without network; no traceback escapes."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", "ViT-B-32::laion2b-s34b-b79k", "--device", "cpu"],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr and done.stderr.count("error:") == 1
    assert "laion2b_s34b_b79k" in done.stderr and "random-init" in done.stderr
    assert "HF_HUB_OFFLINE is set" in done.stderr


def test_unknown_tag_and_model(capsys):
    assert bench_clip.main(["--model", "ViT-B-32::no-such-tag", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "no pretrained tag 'no_such_tag'" in err and "laion2b_s34b_b79k" in err
    assert bench_clip.main(["--model", "ViT-B-33", "--device", "cpu"]) == 2
    assert "unknown OpenCLIP model 'ViT-B-33'" in capsys.readouterr().err


def test_fp16_on_cpu_warns_before_running(capsys):
    """fp16 on the CPU is slow and not what the patch is for: said at once, before any model loads."""
    assert bench_clip.main(["--model", "ViT-B-33", "--device", "cpu", "--dtype", "fp16"]) == 2
    err = capsys.readouterr().err
    assert "warning: --dtype fp16 on the CPU is slow" in err and "CUDA GPUs" in err
    assert err.index("warning:") < err.index("unknown OpenCLIP model")
    for quiet in (["--dtype", "fp32"], ["--dtype", "bf16"], []):
        assert bench_clip.main(["--model", "ViT-B-33", "--device", "cpu", *quiet]) == 2
        assert "warning:" not in capsys.readouterr().err


def test_missing_checkpoint(tmp_path, capsys):
    missing = tmp_path / "nope.safetensors"
    assert bench_clip.main(["--model", f"ViT-B-32::{missing}", "--device", "cpu"]) == 2
    assert f"checkpoint file not found: {missing}" in capsys.readouterr().err


def test_published_table_formatting():
    table = results.PublishedTable(results.shape_width([(16, 3, 224, 224)]))
    assert _squash(table.header().splitlines()[0]) == PUBLISHED_HEADER
    assert re.fullmatch(r"\|-+\|-+\|-+\|-+\|-+\|", table.header().splitlines()[1])


# ----- inputs --------------------------------------------------------------------------------
def test_caption_and_random_inputs_are_real_token_ids():
    import open_clip

    from benchmarks.harness import workloads

    tokenizer = open_clip.get_tokenizer("ViT-B-32")
    captions = workloads.caption_token_ids(tokenizer, 5, seed=0)
    assert captions.shape == (5, 77)
    sot, eot = tokenizer.sot_token_id, tokenizer.eot_token_id
    assert (captions[:, 0] == sot).all() and ((captions == eot).sum(dim=1) == 1).all()
    assert len(set(workloads.caption_prompts(5, seed=0))) == 5
    random_ids = workloads.random_token_ids(4, 77, 49408, seed=0)
    assert random_ids.min() >= 1 and random_ids.max() < 49408
    assert torch.equal(random_ids, workloads.random_token_ids(4, 77, 49408, seed=0))


def test_images_folder_through_model_preprocess(tmp_path, capsys):
    from PIL import Image

    folder = tmp_path / "pictures"
    folder.mkdir()
    for index, size in enumerate([(320, 240), (200, 300)]):
        Image.new("RGB", size, color=(40 * index, 120, 200)).save(folder / f"{index}.png")
    (folder / "readme.txt").write_text("not an image")
    out_json = tmp_path / "images.json"
    code = bench_clip.main(["--model", "ViT-B-32", "--device", "cpu", "--towers", "image", "--batch-sizes", "3",
                            "--times", "1", "--images", str(folder), "--json", str(out_json)])
    assert code == 0
    assert f"pictures from {folder}" in capsys.readouterr().out
    (row,) = json.loads(out_json.read_text())["models"][0]["rows"]
    assert row["shape"] == "(3, 3, 224, 224)" and math.isfinite(row["mean_abs_diff"])


def test_images_folder_missing_fails_before_loading(tmp_path, capsys):
    assert bench_clip.main(["--model", "ViT-B-32", "--device", "cpu", "--images", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert "not a directory" in err and "loading" not in err


def test_the_patch_option_example_is_a_keyword_of_patch():
    import inspect

    import clip_flash

    action = next(a for a in bench_clip.build_parser()._actions if "--patch-option" in a.option_strings)
    key, value = bench_clip.patch_option_arg(re.search(r"e\.g\. (\S+)", action.help).group(1))
    assert key in inspect.signature(clip_flash.patch).parameters, action.help
    assert "(default: None)" not in bench_clip.build_parser().format_help()
