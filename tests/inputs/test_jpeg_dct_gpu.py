"""The exact path's GPU JPEG route (:mod:`clip_flash.inputs.image.jpeg_dct`): from the coefficients libjpeg-turbo
entropy-decodes, the GPU gives Pillow's pixels bit for bit; the preprocessor's rows are the same with the route
on or off, and what it declines or cannot read goes where it went before."""
from __future__ import annotations

import io
import random

import numpy as np
import pytest
import torch
from PIL import Image

import clip_flash
from clip_flash.inputs.image import jpeg_dct
from clip_flash.ops._extension import load_extension
from photo_corpus import assert_same_as_reference, skimage_photo



def _pillow_pixels(data: bytes) -> np.ndarray:
    array = np.asarray(Image.open(io.BytesIO(data)))
    return array[:, :, None] if array.ndim == 2 else array


def _encoded(image: Image.Image, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, "JPEG", **options)
    return out.getvalue()


def _decode(datas):
    return jpeg_dct.decode_to_pixels(datas, torch.device("cuda", torch.cuda.current_device()))


def _crops(count: int, seed: int):
    """Real photo crops of random sizes (odd, tiny, wide) saved every way Pillow writes JPEGs."""
    rng = random.Random(seed)
    photo = skimage_photo("astronaut.png").convert("RGB")
    cases = []
    for number in range(count):
        width = rng.choice([1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, rng.randint(18, photo.width)])
        height = rng.choice([1, 2, 3, 7, 8, 9, 16, 17, rng.randint(18, photo.height)])
        left, top = rng.randint(0, photo.width - width), rng.randint(0, photo.height - height)
        crop = photo.crop((left, top, left + width, top + height))
        if number % 7 == 0:
            crop = crop.convert("L")
        options = {"quality": rng.choice([30, 75, 90, 95, 100]), "subsampling": rng.choice([0, 1, 2]),
                   "progressive": number % 3 == 0, "optimize": number % 5 == 0}
        cases.append((f"{width}x{height} {crop.mode} {options}", _encoded(crop, **options)))
    return cases


@pytest.mark.gpu
def test_photos_decode_to_pillows_pixels(photo_files):
    """Every JPEG of the photo corpus the route takes (4:2:0, 4:2:2, 4:4:4, progressive, grayscale, qualities
    50-100, sizes 61-1024) decodes to Pillow's pixels; it declines only the RGB-coded and CMYK ones."""
    paths = [path for path in photo_files if str(path).endswith(".jpg")]
    datas = [path.read_bytes() for path in paths]
    decoded = _decode(datas)
    declined = [path.name for path, pixels in zip(paths, decoded) if pixels is None]
    assert all(name.endswith(("_6.jpg", "cmyk.jpg")) for name in declined), declined
    assert sum(pixels is not None for pixels in decoded) >= len(paths) - len(declined) >= 20
    for path, data, pixels in zip(paths, datas, decoded):
        if pixels is not None:
            expected = _pillow_pixels(data)
            assert np.array_equal(pixels.cpu().numpy(), expected), path.name


@pytest.mark.gpu
@pytest.mark.parametrize("seed", [0, 1])
def test_random_crops_decode_to_pillows_pixels(seed):
    """Crops of any size, down to 1x1, every subsampling and quality: Pillow's pixels wherever the route takes
    them; it declines only halved chroma at most 2 samples wide (libjpeg-turbo replicates there)."""
    cases = _crops(120, seed)
    decoded = _decode([data for _, data in cases])
    taken = 0
    for (name, data), pixels in zip(cases, decoded):
        image = Image.open(io.BytesIO(data))
        if pixels is None:
            assert image.mode == "RGB" and image.width <= 4 and "'subsampling': 0" not in name, name
            continue
        taken += 1
        assert np.array_equal(pixels.cpu().numpy(), _pillow_pixels(data)), name
    assert taken >= 90


@pytest.mark.gpu
def test_benchmark_photos_decode_to_pillows_pixels():
    """The benchmark's web photos (when the folder is there): all taken, all Pillow's pixels."""
    from photo_corpus import _photo_folder

    folder = _photo_folder()
    if folder is None:
        pytest.skip("no benchmark photo folder")
    paths = sorted(folder.glob("*.jpg"))[:256]
    datas = [path.read_bytes() for path in paths]
    for path, data, pixels in zip(paths, datas, _decode(datas)):
        assert pixels is not None, path.name
        assert np.array_equal(pixels.cpu().numpy(), _pillow_pixels(data)), path.name


def _prepare(preprocess, items, executor, dct_route=True):
    with clip_flash.ImagePreprocessor(preprocess, device="cuda", dtype=torch.float32, executor=executor,
                                      workers=3, dct_route=dct_route) as prep:
        return prep(items)


@pytest.mark.gpu
@pytest.mark.parametrize("executor", ["native"])
def test_preprocessor_rows_are_the_reference_with_the_route(vit_b32_preprocess, photo_files, executor):
    """With the route on (the default), the exact path's rows are ``preprocess(Image.open(p))``, and the route
    took the JPEGs; PNGs, PIL images and the JPEGs it declines take their usual routes in the same batch."""
    items = list(photo_files) + [skimage_photo("chelsea.png").convert("RGB")]
    prepared = _prepare(vit_b32_preprocess, items, executor)
    assert prepared.routes.get("jpeg-dct", 0) >= 20, prepared.routes
    assert prepared.routes.get("png", 0) > 0 and prepared.routes.get("jpeg", 0) > 0, prepared.routes
    assert_same_as_reference(prepared, vit_b32_preprocess, items)


@pytest.mark.gpu
def test_rows_same_with_route_on_and_off(vit_b32_preprocess, photo_files, tmp_path):
    """The switch changes the route, not a bit of the output, bad files included (each reported as before)."""
    good = [path for path in photo_files if str(path).endswith(".jpg")][:12]
    whole = good[0].read_bytes()
    bad = {"truncated.jpg": whole[: len(whole) // 2], "empty.jpg": b"", "text.jpg": b"not an image at all",
           "corrupt.jpg": whole[:600] + bytes(range(256)) * 8 + whole[600 + 2048:]}
    for name, data in bad.items():
        (tmp_path / name).write_bytes(data)
    items = good[:6] + [tmp_path / name for name in bad] + good[6:]
    on = _prepare(vit_b32_preprocess, items, "native")
    off = _prepare(vit_b32_preprocess, items, "native", dct_route=False)
    # The route takes the JPEGs but the RGB-coded one, which decodes whole as before.
    assert on.routes.get("jpeg-dct", 0) >= 10 and "jpeg-dct" not in off.routes, (on.routes, off.routes)
    assert on.routes["jpeg-dct"] + on.routes.get("jpeg", 0) == off.routes["jpeg"], (on.routes, off.routes)
    assert on.indices == off.indices and on.failures == off.failures
    assert torch.equal(on.pixels, off.pixels)
    assert_same_as_reference(on, vit_b32_preprocess, items)


@pytest.mark.gpu
def test_route_off_where_the_library_cannot_open(monkeypatch):
    """A libjpeg that does not open leaves no native decoder (None): Python threads decode, nothing fails."""
    from clip_flash.inputs.image import native_decode

    monkeypatch.setattr(native_decode, "jpeg_library", lambda: "/nonexistent/libjpeg.so.62")
    assert native_decode.NativeBatchDecoder.create(threads=2) is None


@pytest.mark.gpu
def test_reader_reports_rather_than_raises():
    """Bad bytes are left to Pillow with a note (no exception, no crash), and the kernel call refuses bad
    arguments with a reason."""
    from clip_flash.inputs.image.native_decode import KIND, DecodeKind, NativeBatchDecoder, ScanMode

    native = NativeBatchDecoder.create(threads=2)
    scanned = native.scan([b"", b"\xff\xd8\xff", b"plain text, not a JPEG"], ScanMode.COEFFICIENTS)
    assert (scanned.info[:, KIND] == DecodeKind.PYTHON).all() and all(scanned.notes), scanned.notes
    device = torch.device("cuda", torch.cuda.current_device())
    empty = torch.empty(16, dtype=torch.uint8, device=device)
    failure = load_extension().jpeg_dct_to_pixels(empty, torch.zeros((1, 3), dtype=torch.int64, device=device),
                                                  empty, empty, 0, 0)
    assert "table" in failure
