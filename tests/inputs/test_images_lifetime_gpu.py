"""Rows a preparer returned stay valid after the preparer is gone, and nothing it did leaves a CUDA error for
the next, unrelated CUDA call: as a user's script does it (OpenCLIP and clip_flash imported at the top, the
preparer made and dropped in one line), in fresh processes."""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import clip_flash
from photo_corpus import reference_batch


# Each decode's largest allowed mean |difference| to preprocess(Image.open(p)), in normalized units: the exact
# path is bit for bit; nvJPEG's (not exact) is about 2e-4 on web photos and 0.09-0.11 on this corpus's first files
# (4:2:2, 4:4:4, low qualities, restart markers). Wrong rows, as a freed buffer gives, are near 1. The lifetime
# itself is judged by equality with the rows of a preparer kept alive and synchronized.
TOLERANCE = {"cpu": 0.0, "gpu": 0.2}

USER_SCRIPT = textwrap.dedent("""
    import gc
    import sys

    import open_clip
    import torch
    from PIL import Image

    import clip_flash

    decode, files = sys.argv[1], sys.argv[2:]
    pre = open_clip.image_transform(224, is_train=False)  # ViT-L-14's eval transform
    rows = clip_flash.ImagePreprocessor(pre, device="cuda", dtype=torch.float32, decode=decode)(files)
    gc.collect()
    # Other work reusing page-locked memory before the rows are read.
    for size in (1 << 16, 1 << 20, 1 << 24, 1 << 26):
        torch.empty(size, dtype=torch.uint8, pin_memory=True).fill_(255)
    reference = torch.stack([pre(Image.open(path)) for path in files])
    kept = reference[rows.indices].cuda()
    print("rows", len(rows.indices), "failures", len(rows.failures))
    print("mean_diff", (rows.pixels.float() - kept).abs().mean().item())
    keeper = clip_flash.ImagePreprocessor(pre, device="cuda", dtype=torch.float32, decode=decode)
    again = keeper(files)
    torch.cuda.synchronize()
    print("same_as_kept", again.indices == rows.indices and torch.equal(again.pixels, rows.pixels))
    # What the issue saw fail next: a DataLoader's pin-memory thread, then a module moved to the device.
    dataset = torch.utils.data.TensorDataset(torch.arange(64, dtype=torch.float32).view(16, 4))
    for (batch,) in torch.utils.data.DataLoader(dataset, batch_size=4, pin_memory=True):
        batch.cuda(non_blocking=True)
    module = torch.nn.Linear(4, 4).to("cuda")
    print("module_sum", module(torch.ones(2, 4, device="cuda")).sum().item())
    torch.cuda.synchronize()
    print("ok")
""")


def _jpegs(photo_files, count=24):
    return [str(path) for path in photo_files if str(path).endswith(".jpg")][:count]


@pytest.mark.parametrize("decode", ["cpu", "gpu"])
def test_one_liner_with_the_preparer_dropped(tmp_path, photo_files, decode):
    """``ImagePreprocessor(pre, ..., decode=...)(files)``, the preparer dropped at once: the rows are the
    reference's, and the DataLoader and ``module.to("cuda")`` after it run; in a fresh process each time."""
    script = tmp_path / "user_script.py"
    script.write_text(USER_SCRIPT)
    files = _jpegs(photo_files)
    root = str(Path(clip_flash.__file__).resolve().parents[1])  # this checkout's clip_flash, as pytest's
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    for _ in range(2):
        done = subprocess.run([sys.executable, str(script), decode, *files], capture_output=True, text=True,
                              timeout=600, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        lines = dict(line.split(" ", 1) for line in done.stdout.strip().splitlines() if " " in line)
        assert lines["rows"].startswith(f"{len(files)} failures 0"), done.stdout
        assert float(lines["mean_diff"]) <= TOLERANCE[decode], done.stdout
        assert lines["same_as_kept"] == "True", done.stdout
        assert done.stdout.strip().endswith("ok")


@pytest.mark.parametrize("decode", ["cpu", "gpu"])
def test_rows_in_use_while_the_preparer_is_dropped(vit_b32_preprocess, photo_files, decode):
    """A batch decoded, prepared, and the preparer and its decoded batch dropped and collected while the GPU
    still works on it; page-locked memory reused meanwhile: the rows are still the reference's."""
    files = _jpegs(photo_files, 40)
    reference = torch.stack(reference_batch(vit_b32_preprocess, files)[0]).cuda()
    keeper = clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cuda", dtype=torch.float32, decode=decode)
    kept = keeper(files)
    torch.cuda.synchronize()
    for _ in range(3):
        prep = clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cuda", dtype=torch.float32, decode=decode)
        decoded = prep.decode(files)
        rows = prep.prepare(decoded)
        del prep, decoded
        gc.collect()
        for size in (1 << 16, 1 << 22, 1 << 26):
            torch.empty(size, dtype=torch.uint8, pin_memory=True).fill_(7)
        assert rows.indices == list(range(len(files))) and not rows.failures
        difference = (rows.pixels - reference).abs().mean().item()
        assert difference <= TOLERANCE[decode], difference
        assert torch.equal(rows.pixels, kept.pixels)
    (torch.ones(8, device="cuda") * 2).sum().item()  # a pending CUDA error would surface here


def test_native_decoder_threads_end_with_the_preparer(vit_b32_preprocess, photo_files):
    """Preparers made and dropped many times leave no native threads behind (each joins its own)."""
    import threading

    files = _jpegs(photo_files, 8)
    before = len(_native_threads())
    for _ in range(20):
        clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cuda", dtype=torch.float32, workers=4)(files)
        gc.collect()
    assert len(_native_threads()) <= before + 4, (before, len(_native_threads()))
    assert threading.active_count() < 50


def _native_threads():
    return os.listdir(f"/proc/{os.getpid()}/task")
