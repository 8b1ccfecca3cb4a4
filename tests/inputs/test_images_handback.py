"""What a decoding worker has not loaded yet never stalls a batch: a worker that has not unpickled ``preprocess``
(it imports OpenCLIP and torchvision, seconds to tens of seconds) hands the images that need it back to the
caller and loads it in the background; one that has not imported torchvision's decoders lets Pillow decode
meanwhile. The rows are the reference's either way."""
from __future__ import annotations

import dataclasses
import io
import logging
import threading
import time

import numpy as np
import pytest
import torch
from PIL import Image

import clip_flash
import clip_flash.inputs.background_load as background_load
import clip_flash.inputs.image_decoding as image_decoding
from photo_corpus import assert_same_as_reference, skimage_photo

HANDED_BACK = "the caller prepares this image"
WORKER_LOADED = "__import__('clip_flash.inputs.worker_processes', fromlist=['_'])._worker_options.preprocess.loaded"


@pytest.fixture(scope="module")
def whole_image_inputs(tmp_path_factory):
    """Images Pillow resizes its own way (RGBA, palette, CMYK) among plain JPEG and PNG ones."""
    folder = tmp_path_factory.mktemp("whole")
    photo = skimage_photo("chelsea.png").convert("RGB")
    photo.convert("RGBA").resize((150, 90)).save(folder / "rgba.png")
    photo.convert("P").resize((120, 80)).save(folder / "palette.png")
    photo.convert("CMYK").resize((100, 70)).save(folder / "cmyk.jpg", quality=90)
    photo.resize((130, 96)).save(folder / "plain.png")
    photo.save(folder / "plain.jpg", quality=90)
    return [str(folder / name) for name in ("rgba.png", "plain.jpg", "palette.png", "cmyk.jpg", "plain.png")]


def _handed_back(records) -> set:
    return {record.getMessage().split(":")[0] for record in records if HANDED_BACK in record.getMessage()}


def test_a_worker_without_the_transform_hands_images_back_then_loads_it(vit_b32_preprocess, whole_image_inputs,
                                                                       caplog):
    caplog.set_level(logging.DEBUG, logger="clip_flash.inputs.images")
    with clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cpu", dtype=torch.float32, workers=1,
                                      executor="process") as prep:
        prep.start(wait=True)
        pool = prep.pool._process_pool()
        assert pool.submit(eval, WORKER_LOADED).result() is False  # fresh: nothing needed it yet
        first = prep(whole_image_inputs * 2)  # two tasks' worth: the processes decode, not the threads
        assert first.failures == []
        assert_same_as_reference(first, vit_b32_preprocess, whole_image_inputs * 2)
        back = _handed_back(caplog.records)
        assert back and back <= {f"input {index}" for index in (0, 2, 3, 5, 7, 8)}  # the whole-image ones only
        deadline = time.monotonic() + 120  # the worker unpickles it in the background: seconds
        while not pool.submit(eval, WORKER_LOADED).result():
            assert time.monotonic() < deadline, "the worker never loaded the transform"
            time.sleep(0.2)
        caplog.clear()
        again = prep(whole_image_inputs * 2)
        assert not _handed_back(caplog.records)  # the worker prepares them itself now
        assert torch.equal(again.pixels, first.pixels)


def test_a_worker_lets_pillow_decode_until_torchvision_is_imported(vit_b32_preprocess, whole_image_inputs,
                                                                  monkeypatch):
    monkeypatch.setattr(background_load, "_imports_done", {})  # as in a worker that has not imported them
    importing = threading.Event()  # held until the first decode is done: the import "takes a while"
    import_then_set = background_load._import_then_set
    monkeypatch.setattr(background_load, "_import_then_set",
                        lambda module, done: (importing.wait(60), import_then_set(module, done)))
    prep = clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cpu", dtype=torch.float32, workers=1,
                                        executor="thread", start=False)
    if not prep.options.use_torchvision_png:
        pytest.skip("torchvision's PNG decoder disagrees with Pillow here: never used")
    options = dataclasses.replace(prep.options, in_worker=True)
    plain_png = whole_image_inputs[4]
    early = image_decoding.decode_item(0, plain_png, options)
    assert early.route == "pillow-pixels" and "loading in this worker" in early.notes[0]
    importing.set()
    assert background_load._imports_done[image_decoding.TORCHVISION_DECODERS].wait(60)
    later = image_decoding.decode_item(0, plain_png, options)
    assert later.route == "png" and not later.notes
    assert torch.equal(early.pixels, later.pixels)
    reference = np.array(Image.open(io.BytesIO(open(plain_png, "rb").read())).convert("RGB"))
    assert np.array_equal(later.pixels.numpy(), reference)
    prep.close()


BOTH_AT_ONCE = """
import pickle, sys, time
from clip_flash.inputs.background_load import imported_in_background

assert "torchvision" not in sys.modules  # a fresh worker, as the fork server makes them where there is a GPU
transform = pickle.loads(sys.stdin.buffer.read())
assert not transform.loaded and not imported_in_background("torchvision.io")
transform.load_in_background()  # unpickling it imports torchvision too
deadline = time.monotonic() + 240
while not (transform.loaded and imported_in_background("torchvision.io")):
    assert time.monotonic() < deadline, "not loaded"
    time.sleep(0.05)
print(sorted(transform(__import__("PIL.Image").Image.new("RGBA", (40, 30))).shape))
"""


def test_the_transform_and_torchvision_load_together_in_a_fresh_worker(vit_b32_preprocess):
    """Both at once, as a worker meets a PNG and an RGBA image: they load one after the other (two threads
    importing torchvision at once failed halfway through its circular imports on the GPU host)."""
    import pickle
    import subprocess
    import sys

    from clip_flash.inputs.background_load import DeferredTransform

    travelling = pickle.dumps(DeferredTransform(vit_b32_preprocess))
    done = subprocess.run([sys.executable, "-c", BOTH_AT_ONCE], input=travelling, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert done.stdout.decode().strip() == "[3, 224, 224]"
