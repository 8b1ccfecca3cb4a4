"""Bytes, PIL images and uint8 arrays in; bookkeeping of indices and failures; decode/prepare split."""
from __future__ import annotations

import io
import threading

import numpy as np
import pytest
import torch
from PIL import Image

import clip_flash
from photo_corpus import assert_same_as_reference, skimage_photo


@pytest.fixture(scope="module")
def cpu_prep(vit_b32_preprocess):
    prep = clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cpu", dtype=torch.float32, workers=2)
    yield prep
    prep.close()


@pytest.fixture(scope="module")
def photo():
    return skimage_photo("coffee.png").convert("RGB").resize((300, 200), Image.BICUBIC)


def encoded(image: Image.Image, form: str = "JPEG") -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, form)
    return buffer.getvalue()


def test_bytes_inputs(cpu_prep, vit_b32_preprocess, photo):
    data = encoded(photo)
    items = [data, bytearray(data), memoryview(data), encoded(photo.convert("L"), "PNG")]
    prepared = cpu_prep(items)
    assert_same_as_reference(prepared, vit_b32_preprocess, [data, data, data, items[3]])


def test_pil_inputs_of_every_common_mode(cpu_prep, vit_b32_preprocess, photo):
    rgba = photo.copy()
    rgba.putalpha(Image.linear_gradient("L").resize(photo.size))
    lazy = Image.open(io.BytesIO(encoded(photo)))  # opened, not loaded
    items = [photo, photo.convert("L"), rgba, photo.convert("P", palette=Image.ADAPTIVE), photo.convert("CMYK"),
             lazy, photo.convert("1")]
    prepared = cpu_prep(items)
    references = [photo, photo.convert("L"), rgba, items[3], items[4], Image.open(io.BytesIO(encoded(photo))),
                  items[6]]
    assert_same_as_reference(prepared, vit_b32_preprocess, references)


def test_array_inputs_are_pixels(cpu_prep, vit_b32_preprocess, photo):
    """A uint8 (H, W, 3) / (H, W, 1) / (H, W) array or tensor is an RGB / L image's pixels."""
    rgb = np.asarray(photo)
    gray = np.asarray(photo.convert("L"))
    items = [torch.from_numpy(rgb.copy()), rgb, torch.from_numpy(gray.copy()),
             torch.from_numpy(gray[:, :, None].copy()),
             torch.from_numpy(rgb.copy())[10:150, 20:280]]  # a non-contiguous view
    prepared = cpu_prep(items)
    references = [photo, photo, photo.convert("L"), photo.convert("L"), photo.crop((20, 10, 280, 150))]
    assert_same_as_reference(prepared, vit_b32_preprocess, references)


def test_unusable_inputs_are_failures_with_reasons(cpu_prep, photo):
    good = encoded(photo)
    items = [good, torch.zeros(10, 10, 3, dtype=torch.float32), good, torch.zeros(3, 10, 10, dtype=torch.uint8),
             good, 42, good, torch.zeros(0, 5, 3, dtype=torch.uint8), good]
    prepared = cpu_prep(items)
    assert prepared.indices == [0, 2, 4, 6, 8]
    reasons = dict(prepared.failures)
    assert sorted(reasons) == [1, 3, 5, 7]
    assert "uint8" in reasons[1] and "(H, W" in reasons[3] and "unsupported input type int" in reasons[5]
    assert prepared.routes == {"jpeg": 5, "failed": 4}
    assert torch.equal(prepared.pixels[0], prepared.pixels[4])


def test_empty_and_single_and_not_a_list(cpu_prep, photo):
    empty = cpu_prep([])
    assert empty.pixels.shape == (0, 3, 224, 224) and empty.indices == [] and empty.failures == []
    assert cpu_prep([encoded(photo)]).pixels.shape == (1, 3, 224, 224)
    with pytest.raises(TypeError, match="sequence"):
        cpu_prep(encoded(photo))
    with pytest.raises(TypeError, match="sequence"):
        cpu_prep("photo.jpg")


def test_all_bad_gives_an_empty_batch(cpu_prep):
    prepared = cpu_prep([b"", b"not an image", "/no/such/file.png"])
    assert prepared.pixels.shape == (0, 3, 224, 224)
    assert [index for index, _ in prepared.failures] == [0, 1, 2]


def test_prepare_of_decode_is_call(cpu_prep, photo):
    items = [encoded(photo), b"junk", photo.convert("RGBA"), np.asarray(photo)]
    decoded = cpu_prep.decode(items)
    assert decoded.count == 4 and decoded.indices == [0, 2, 3] and decoded.failures[0][0] == 1
    assert decoded.routes == {"jpeg": 1, "pillow-preprocess": 1, "tensor": 1, "failed": 1}
    split = cpu_prep.prepare(decoded)
    whole = cpu_prep(items)
    assert torch.equal(split.pixels, whole.pixels) and split.indices == whole.indices
    assert split.failures == whole.failures


def test_decode_is_thread_safe(cpu_prep, photo):
    """Several threads decoding at once (a pipeline's producer and others) get their own, right results."""
    batches = [[encoded(photo.rotate(angle))] * 3 + [b"bad"] for angle in (0, 90, 180, 270)]
    expected = [cpu_prep(batch).pixels for batch in batches]
    results = [None] * len(batches)

    def work(number):
        results[number] = cpu_prep.prepare(cpu_prep.decode(batches[number])).pixels

    threads = [threading.Thread(target=work, args=(number,)) for number in range(len(batches))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for got, want in zip(results, expected):
        assert torch.equal(got, want)


def test_packed_batch_for_the_kernel(vit_b32_preprocess, photo, monkeypatch):
    """The GPU path's bookkeeping on the CPU: decode packs every pixel input into one buffer laid out for
    the kernel (threads fill the slots), prepare runs it (here the resample branch's numpy emulation of
    the kernel) and slots the other routes' rows in between; equal to the reference row for row."""
    import clip_flash.ops.image_resample as image_resample_module
    from test_image_resample_packing import EmulatedExtension

    monkeypatch.setattr(image_resample_module, "load_extension", lambda: EmulatedExtension(4096))
    small = photo.resize((90, 60))
    rgba = small.copy()
    rgba.putalpha(128)
    items = [encoded(small), b"junk", rgba, encoded(small.convert("L"), "PNG"), np.asarray(small.rotate(90)),
             small.resize((61, 45))]
    with clip_flash.ImagePreprocessor(vit_b32_preprocess, device="cpu", dtype=torch.float16, workers=2) as prep:
        prep.resize.implementation = "kernel"  # as on a GPU with the extension built
        decoded = prep.decode(items)
        # Tasks take inputs by size (balanced), so the packed order is the tasks' order; rows come back in input order.
        assert decoded.packed is not None and sorted(decoded.packed.indices) == [0, 3, 4, 5]
        shape_of = dict(zip(decoded.packed.indices, decoded.packed.plan.shapes))
        assert [shape_of[index] for index in (0, 3, 4, 5)] == [(60, 90, 3), (60, 90, 1), (60, 90, 3), (45, 61, 3)]
        prepared = prep.prepare(decoded)
        # Pixels already on the device (nvJPEG's) are packed there: the same rows.
        on_device = prep.resize([torch.from_numpy(np.array(small)), torch.from_numpy(np.array(small.rotate(90)))])
        assert torch.equal(on_device[1], prepared.pixels[3])
    assert_same_as_reference(prepared, vit_b32_preprocess, [items[0], b"junk", rgba, items[3],
                                                            small.rotate(90), small.resize((61, 45))],
                             dtype=torch.float16)
    assert prepared.routes == {"jpeg": 1, "png": 1, "pillow-preprocess": 1, "tensor": 1, "pillow-pixels": 1,
                               "failed": 1}


def test_device_and_dtype_default_to_what_this_machine_runs(vit_b32_preprocess, photo):
    with clip_flash.ImagePreprocessor(vit_b32_preprocess, workers=2) as prep:
        cuda = torch.cuda.is_available()
        assert prep.device.type == ("cuda" if cuda else "cpu")
        assert prep.dtype == (torch.float16 if cuda else torch.float32)
        out = prep([photo])
        assert out.pixels.device.type == prep.device.type and out.pixels.dtype == prep.dtype
