"""The device step in one extension call (``clip_flash._C.packed_rows``, what ``resample_packed`` runs for a host
layout with or without JPEG coefficients) gives the rows of the same copies and launches made from Python, bit for
bit: on the upload stream and on the current one, the JPEG kernels' table in the coefficients' copy or on its own,
the layout's pixels whole or in runs; and the rows are OpenCLIP's."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import clip_flash
import clip_flash.ops.image_resample as image_resample_module
from clip_flash.ops._extension import load_extension
from clip_flash.ops.image_resample import resample_packed
from photo_corpus import assert_same_as_reference

pytestmark = pytest.mark.gpu


class _FromPython:
    """A ``DctBatch`` seen without ``native_arguments``: ``resample_packed`` then queues its copies from Python."""

    def __init__(self, batch) -> None:
        self.batch = batch

    def upload(self, device):
        return self.batch.upload(device)


@pytest.fixture(scope="module")
def prep(vit_b32_preprocess):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    with clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cuda", dtype=torch.float16) as preparer:
        if preparer.resize.implementation != "kernel" or not hasattr(load_extension(), "packed_rows"):
            pytest.skip("needs the built extension")
        yield preparer


def _both(packed, fill, segments=None, on_current_stream=False):
    """(one call's rows, Python's rows) of the same layout."""
    args = (packed.buffer, packed.plan, "cuda", torch.float16, segments)
    one_call = resample_packed(*args, fill, on_current_stream)
    if fill is not None:
        python = resample_packed(*args, _FromPython(fill), on_current_stream)
    else:  # no JPEGs: Python's copies are those made where the extension has no packed_rows
        real = load_extension()

        class WithoutPackedRows:
            image_resample = real.image_resample

        original = image_resample_module.load_extension
        image_resample_module.load_extension = lambda: WithoutPackedRows
        try:
            python = resample_packed(*args, None, on_current_stream)
        finally:
            image_resample_module.load_extension = original
    torch.cuda.synchronize()
    return one_call, python


def test_one_call_gives_the_python_steps_rows(prep, photo_files, vit_b32_preprocess):
    jpegs = [path for path in photo_files if path.suffix == ".jpg"]
    pngs = [path for path in photo_files if path.suffix == ".png"]
    items = jpegs[:12] + pngs[:3] + jpegs[12:20]
    decoded = prep.decode(items)
    packed = decoded.packed
    assert packed is not None and packed.dct is not None and packed.plan is not None
    kept = packed.keep if packed.keep is not None else list(range(len(packed.indices)))
    checked = 0
    for on_current_stream in (False, True):
        for table_room in (packed.dct.table_room, None):
            dct = dataclasses.replace(packed.dct, table_room=table_room)
            one_call, python = _both(packed, dct, on_current_stream=on_current_stream)
            assert one_call.shape == python.shape and torch.equal(one_call[kept], python[kept])
            checked += 1
    assert checked == 4
    prepared = prep.prepare(decoded)
    assert prepared.routes.get("jpeg-dct", 0) >= 10, prepared.routes
    assert_same_as_reference(prepared, vit_b32_preprocess, items, dtype=torch.float16)


def test_one_call_gives_the_python_steps_rows_for_pixels_whole_and_in_runs(prep, photo_files):
    """Without JPEG coefficients: the layout's pixels in the host buffer (PNGs the native decoder wrote), copied
    with the head in one piece or as runs after a head made from the plan."""
    pngs = [path for path in photo_files if path.suffix == ".png"][:4]
    packed = prep.decode(pngs).packed
    assert packed is not None and packed.dct is None and packed.buffer.numel() > packed.plan.pixels_at
    plan = packed.plan
    one_call, python = _both(packed, None)
    assert torch.equal(one_call, python)
    pixel_bytes = packed.buffer.numel() - plan.pixels_at
    half = pixel_bytes // 2
    runs = [(plan.pixels_at, half, plan.pixels_at), (plan.pixels_at + half, pixel_bytes - half, plan.pixels_at + half)]
    for on_current_stream in (False, True):
        in_runs, python_runs = _both(packed, None, segments=runs, on_current_stream=on_current_stream)
        assert torch.equal(in_runs, python_runs) and torch.equal(in_runs, one_call)
