"""What a job checks in its output folder, and what it says: weights identified by their bytes, edited inputs
refused by name, a failed start that locks nothing, refusals that print only what differs, a progress bar that
moves per batch, a word about what it ignored or what its weights are, and settings this machine cannot run
refused in one line."""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import clip_flash
from clip_flash.jobs import OutputError, SettingsMismatchError, weights_identity
from clip_flash.inputs.image.native_decode import NativeBatchDecoder
from clip_flash.jobs.writer import InputChangedError
from clip_flash.models import ModelLoadError
from tests.utils import child_env

from .job_helpers import MODEL, read_output, write_photos
from .test_job_resume import finished_files

REPO = Path(__file__).resolve().parents[2]


def test_a_checkpoint_replaced_at_the_same_path_and_size_is_refused(tmp_path, checkpoint, monkeypatch):
    write_photos(tmp_path / "photos", count=2)
    weights = tmp_path / "weights.pt"
    shutil.copy(checkpoint, weights)
    model = f"{MODEL}::{weights}"
    clip_flash.embed(tmp_path / "photos", tmp_path / "out", model, device="cpu", shard_size=1, progress=False)
    hashed = []
    real_hash = weights_identity.file_sha256
    monkeypatch.setattr(weights_identity, "file_sha256", lambda path: hashed.append(path) or real_hash(path))
    os.utime(weights)  # touched, same bytes: hashed again, same weights, resumed
    assert clip_flash.embed(tmp_path / "photos", tmp_path / "out", model, device="cpu", shard_size=1,
                            progress=False).shards_skipped == 2
    assert len(hashed) == 1
    assert clip_flash.embed(tmp_path / "photos", tmp_path / "out", model, device="cpu", shard_size=1,
                            progress=False).shards_skipped == 2
    assert len(hashed) == 1  # cached by path, size and modification time

    replaced = bytearray(weights.read_bytes())
    replaced[len(replaced) // 2] ^= 0xFF  # a weight in the middle of the file: other weights, same size
    weights.write_bytes(bytes(replaced))
    before = finished_files(tmp_path / "out")
    with pytest.raises(SettingsMismatchError) as raised:
        clip_flash.embed(tmp_path / "photos", tmp_path / "out", model, device="cpu", shard_size=1, progress=False)
    message = str(raised.value)
    assert "weights.sha256: folder has '" in message and message.count("folder has") == 1
    assert "To start over" in message and "{" not in message  # the differing setting only, no whole dicts
    assert finished_files(tmp_path / "out") == before


def test_an_image_or_caption_edited_in_place_is_refused_by_name(tmp_path, checkpoint):
    paths = write_photos(tmp_path / "photos", count=4)
    model = f"{MODEL}::{checkpoint}"
    clip_flash.embed(tmp_path / "photos", tmp_path / "out", model, device="cpu", shard_size=2, progress=False)
    for edited in (paths[3].with_suffix(".txt"), paths[3]):
        stamp = edited.stat()
        edited.write_bytes(edited.read_bytes()[::-1])  # same size, other content
        with pytest.raises(InputChangedError, match="the input changed") as raised:
            clip_flash.embed(tmp_path / "photos", tmp_path / "out", model, device="cpu", shard_size=2,
                             progress=False)
        assert f"changed (size or modification time): {edited}" in str(raised.value)
        edited.write_bytes(edited.read_bytes()[::-1])
        os.utime(edited, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert clip_flash.embed(tmp_path / "photos", tmp_path / "out", model, device="cpu", shard_size=2,
                            progress=False).shards_skipped == 2


@pytest.mark.parametrize("bad_model", ["ViT-S-3", f"{MODEL}::/no/such/checkpoint.pt"])
def test_a_failed_start_leaves_nothing_that_refuses_the_corrected_command(tmp_path, checkpoint, bad_model):
    write_photos(tmp_path / "photos", count=2)
    with pytest.raises(ModelLoadError):
        clip_flash.embed(tmp_path / "photos", tmp_path / "out", bad_model, device="cpu", progress=False)
    assert not (tmp_path / "out" / "_clip_flash" / "settings.json").exists()
    summary = clip_flash.embed(tmp_path / "photos", tmp_path / "out", f"{MODEL}::{checkpoint}", device="cpu",
                               progress=False)
    assert summary.rows == 2


def test_a_folder_without_a_finished_shard_never_refuses_a_job(tmp_path, checkpoint):
    """Settings and partial files of a start killed before its first shard are replaced, not refused."""
    write_photos(tmp_path / "photos", count=3)
    out = tmp_path / "out"
    clip_flash.embed(tmp_path / "photos", out, f"{MODEL}::{checkpoint}", device="cpu", shard_size=2,
                     progress=False)
    for marker in (out / "_clip_flash" / "done").glob("*.json"):
        marker.unlink()  # what a kill before the first commit leaves: settings and unfinished files
    summary = clip_flash.embed(tmp_path / "photos", out, f"{MODEL}::{checkpoint}", device="cpu", shard_size=5,
                               captions=False, progress=False)
    assert (summary.shards_planned, summary.rows) == (1, 3)
    assert json.loads((out / "_clip_flash" / "settings.json").read_text())["source"]["shard_size"] == 5
    output = read_output(out)
    assert output["img_emb_files"] == ["img_emb_0.npy"] and output["text_emb"] is None
    assert not (out / "text_emb").exists()


def test_out_naming_a_file_is_a_clear_error(tmp_path):
    write_photos(tmp_path / "photos", count=1)
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(OutputError, match=r"--out .*a_file is a file: the output is a folder"):
        clip_flash.embed(tmp_path / "photos", tmp_path / "a_file", MODEL, device="cpu", progress=False)


def test_progress_moves_at_every_batch_on_a_cpu(tmp_path, checkpoint, monkeypatch):
    from clip_flash.jobs import job as job_module

    path = tmp_path / "c.txt"
    path.write_text("".join(f"caption number {row}\n" for row in range(6)))
    encoded, seen = [], []

    class Bar:
        def __init__(self, *args, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def update(self, count):
            seen.append((count, len(encoded)))

    real_load = job_module.load_job_model

    def counting_model(job, device):
        loaded = real_load(job, device)
        encode_text = loaded.model.encode_text
        loaded.model.encode_text = lambda *args, **kwargs: encoded.append(1) or encode_text(*args, **kwargs)
        return loaded

    monkeypatch.setattr(job_module, "_progress", lambda total, enabled: Bar())
    monkeypatch.setattr(job_module, "load_job_model", counting_model)
    clip_flash.embed(path, tmp_path / "out", f"{MODEL}::{checkpoint}", device="cpu", batch_size=2)
    # each batch's 2 captions counted as soon as that batch is embedded, not batches later
    assert [entry for entry in seen if entry[0]] == [(2, 1), (2, 2), (2, 3)]
    path.write_text("".join(f"caption number {row}\n" for row in range(300)))
    seen.clear()
    clip_flash.embed(path, tmp_path / "default_batches", f"{MODEL}::{checkpoint}", device="cpu")
    assert [count for count, _ in seen if count] == [256, 44]  # the CPU's default batch: a bar that moves


def test_random_weights_and_ignored_inputs_are_said_once(tmp_path, caplog):
    write_photos(tmp_path / "photos", count=2)
    (tmp_path / "photos" / "gone.jpg").symlink_to(tmp_path / "nowhere.jpg")
    with caplog.at_level(logging.WARNING, logger="clip_flash"):
        clip_flash.embed(tmp_path / "photos", tmp_path / "out", MODEL, device="cpu", caption_column="text",
                         progress=False)
    warnings = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    assert sum("RANDOM-INIT weights" in text and "meaningless for search" in text for text in warnings) == 1
    assert any("caption column 'text' ignored" in text for text in warnings)
    assert any("skipped 1 dangling symlink" in text and "gone.jpg" in text for text in warnings)

    from .test_job_sources import _write_tar

    _write_tar(tmp_path / "a.tar", [("k.jpg", next((tmp_path / "photos").glob("*.jp*g")).read_bytes())])
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="clip_flash"):
        summary = clip_flash.embed(str(tmp_path / "{a,a}.tar"), tmp_path / "tar_out", MODEL, device="cpu",
                                   progress=False)
    assert summary.shards_planned == 1 and summary.rows == 1  # named twice, read once
    assert any("given more than once" in record.getMessage() for record in caplog.records)


def _embed_command(tmp_path, *options):
    """``scripts/embed.py`` in a process of its own, as a user runs it: (exit status, stderr)."""
    command = [sys.executable, str(REPO / "scripts" / "embed.py"), "--model", MODEL, "--input",
               str(tmp_path / "photos"), "--no-progress", *options]
    done = subprocess.run(command, env=child_env(), capture_output=True, text=True, timeout=300)
    return done.returncode, done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a machine without CUDA")
def test_a_cuda_device_on_a_machine_without_one_is_refused_before_anything_starts(tmp_path):
    write_photos(tmp_path / "photos", count=1)
    with pytest.raises(ValueError, match=r"device 'cuda' asked for, but CUDA is not available here"):
        clip_flash.embed(tmp_path / "photos", tmp_path / "out", MODEL, device="cuda", progress=False)
    status, err = _embed_command(tmp_path, "--out", str(tmp_path / "out2"), "--device", "cuda:1")
    assert status == 2, err
    assert err.count("\n") == 1 and err.startswith("error: device 'cuda:1' asked for"), err
    assert not (tmp_path / "out").exists() and not (tmp_path / "out2").exists()


@pytest.mark.skipif(NativeBatchDecoder.create(1) is not None, reason="the native decoder runs here")
def test_a_native_executor_that_cannot_run_says_why_in_one_line(tmp_path):
    write_photos(tmp_path / "photos", count=1)
    status, err = _embed_command(tmp_path, "--out", str(tmp_path / "out"), "--device", "cpu", "--executor", "native")
    assert status == 2, err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "executor='native' asked for, but the native batch decoder cannot run here: " in \
        lines[0], err
    assert "Traceback" not in err
