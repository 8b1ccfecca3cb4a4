"""Bad inputs never raise: each is prepared exactly as Pillow would, or listed in failures; neighbours unaffected."""
from __future__ import annotations

import io

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


def jpeg_bytes(image: Image.Image, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", **options)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    """(name, path) of every kind of bad or odd input, with a good photo between each two."""
    directory = tmp_path_factory.mktemp("bad")
    photo = skimage_photo("chelsea.png").convert("RGB")
    good = jpeg_bytes(photo, quality=90)
    progressive = jpeg_bytes(photo, quality=90, progressive=True)
    corrupt = bytearray(good)
    corrupt[len(corrupt) // 2: len(corrupt) // 2 + 64] = bytes(range(64))  # garbage inside the scan
    frames = [photo.resize((64, 48)).convert("P", palette=Image.ADAPTIVE),
              photo.resize((64, 48)).rotate(90).convert("P", palette=Image.ADAPTIVE)]
    gif = io.BytesIO()
    frames[0].save(gif, "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    files = {
        "truncated_half.jpg": good[: len(good) // 2],
        "truncated_no_eoi.jpg": good[:-2],
        "truncated_progressive.jpg": progressive[: len(progressive) * 2 // 3],
        "truncated_header.jpg": good[:40],
        "corrupt_scan.jpg": bytes(corrupt),
        "early_eoi.jpg": good[: len(good) * 3 // 4] + b"\xff\xd9",
        "trailing_bytes.jpg": good + b"this is not image data" * 10,
        "zero_bytes.jpg": b"",
        "text.jpg": b"Hello, this is a text file named like a photo.\n" * 20,
        "one_pixel.jpg": jpeg_bytes(Image.new("RGB", (1, 1), (200, 30, 90))),
        "one_pixel.png": _png(Image.new("L", (1, 1), 77)),
        "one_row.png": _png(photo.resize((640, 1))),
        "animated.gif": gif.getvalue(),
        "cmyk.jpg": jpeg_bytes(photo.convert("CMYK"), quality=90),
        "sixteen_bit_gray.png": _png(Image.fromarray(np.asarray(photo.convert("L"), np.uint16) * 257)),
        "good.jpg": good,
    }
    paths = {}
    for name, data in files.items():
        path = directory / name
        path.write_bytes(data)
        paths[name] = path
    paths["missing.jpg"] = directory / "missing.jpg"
    paths["a_directory.jpg"] = directory / "a_directory.jpg"
    paths["a_directory.jpg"].mkdir()
    return paths


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def interleave_with_good(bad_files):
    items = []
    for name, path in bad_files.items():
        if name != "good.jpg":
            items += [bad_files["good.jpg"], path]
    return items + [bad_files["good.jpg"]]


def test_bad_inputs_match_pillow_or_fail_alone(cpu_prep, vit_b32_preprocess, bad_files):
    items = interleave_with_good(bad_files)
    prepared = cpu_prep(items)
    assert_same_as_reference(prepared, vit_b32_preprocess, items)
    failed = {items[index].name for index, _ in prepared.failures}
    # Pillow cannot load these; everything else (corrupt scan, early EOI, trailing bytes...) it can.
    expected_failures = {"truncated_half.jpg", "truncated_no_eoi.jpg", "truncated_progressive.jpg",
                         "truncated_header.jpg", "zero_bytes.jpg", "text.jpg", "missing.jpg", "a_directory.jpg"}
    assert failed == expected_failures
    for index, reason in prepared.failures:
        assert reason.split(":")[0].endswith("Error") and "0x" not in reason, reason
    # Every good neighbour made it.
    good_rows = [row for row, index in enumerate(prepared.indices) if items[index].name == "good.jpg"]
    assert len(good_rows) == len(bad_files)


def test_failure_reasons_say_why(cpu_prep, bad_files):
    prepared = cpu_prep([bad_files[name] for name in ("zero_bytes.jpg", "text.jpg", "missing.jpg",
                                                      "truncated_half.jpg")])
    reasons = dict(prepared.failures)
    assert "UnidentifiedImageError" in reasons[0] and "UnidentifiedImageError" in reasons[1]
    assert "FileNotFoundError" in reasons[2]
    assert "truncated" in reasons[3]


def test_animated_gif_is_its_first_frame(cpu_prep, vit_b32_preprocess, bad_files):
    prepared = cpu_prep([bad_files["animated.gif"]])
    with Image.open(bad_files["animated.gif"]) as image:
        assert image.n_frames == 2
        assert torch.equal(prepared.pixels[0], vit_b32_preprocess(image))


def test_huge_image_resizes_exactly(cpu_prep, vit_b32_preprocess, tmp_path):
    """10000 x 8000 (80 MP, under Pillow's decompression-bomb limit) is prepared, not refused."""
    y, x = np.mgrid[0:8000:16, 0:10000:16]
    small = np.stack([x % 256, y % 256, (x + y) % 256], axis=-1).astype(np.uint8)
    image = Image.fromarray(small, "RGB").resize((10000, 8000), Image.NEAREST)
    path = tmp_path / "huge.jpg"
    image.save(path, "JPEG", quality=80)
    del image
    prepared = cpu_prep([path])
    assert_same_as_reference(prepared, vit_b32_preprocess, [path])


def test_decompression_bomb_is_a_failure(cpu_prep, tmp_path, monkeypatch):
    path = tmp_path / "bomb.png"
    Image.new("L", (300, 300)).save(path, "PNG")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 300 * 300 // 3)  # past twice the limit: Pillow refuses
    prepared = cpu_prep([path])
    assert prepared.indices == [] and "DecompressionBombError" in prepared.failures[0][1]
    assert prepared.pixels.shape == (0, 3, 224, 224)


@pytest.mark.parametrize("resize", ["pillow", "torch"])
def test_image_the_transform_cannot_take_fails_alone(resize):
    """'longest' on a 1 x 1000 strip resizes to zero rows: OpenCLIP's transform fails on it, so it is a
    failure here too, and the rest of its batch is prepared."""
    import open_clip

    preprocess = open_clip.image_transform(224, is_train=False, resize_mode="longest")
    photo = skimage_photo("coffee.png").convert("RGB").resize((320, 240))
    strip = Image.new("RGB", (1000, 1), (10, 200, 30))
    items = [photo, strip, photo.convert("L")]
    with clip_flash.ImagePreprocessor(preprocess, device="cpu", dtype=torch.float32, workers=2,
                                      resize=resize) as prep:
        prepared = prep(items)
    assert_same_as_reference(prepared, preprocess, items)
    assert [index for index, _ in prepared.failures] == [1]
    assert prepared.routes == {"pillow-pixels": 2, "failed": 1}
